//! Running an op once its stream reached it: the arm (bind, re-validate, post), the
//! engine jobs (one, or one per part joined by the engine's `PartJoiner`), and the one
//! publication of the result with the stream's release.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use hipfile_core::{Direction, OpError, OpEvent, OpState, Outcome, ValidIo, revalidate};

use super::{AsyncOp, clock_ns};
use crate::engine::{Completion, Engine, IoJob, JobEnd, PartJoiner};
use crate::file::OpGuard;

impl AsyncOp {
    /// The stream reached the op (on the arm poller, or in the host function of the
    /// blocking fallback; O(1), no device calls). Where reads may share their stream's
    /// slots (`HIPFILE_STREAM_COPY_DEVICE_FULL=share`), the stream's reads waiting to read
    /// ahead then get another try: the stream ran every copy queued before this op, so a
    /// read sharing a slot with one of them may fill it now
    /// (`try_start_deferred_slot_read`).
    pub(super) fn arm(self: Arc<Self>) {
        let retry = self.host.slots().is_some_and(|pool| pool.shares_when_full());
        let stream = Arc::clone(&self.stream);
        self.arm_now();
        if retry {
            stream.start_deferred();
        }
    }

    fn arm_now(self: Arc<Self>) {
        self.note_arm();
        if self.end.end_if_abandoned() {
            // Abandoned because its wait could not be queued: no copy of its slot is
            // queued either (it would come after the wait), so releasing is all.
            self.release_host();
            return;
        }
        if self.stages_slot_at_submission() {
            if let (Some(piece), Ok(engine)) = (&self.piece, self.host.engine()) {
                // The next pieces whose slots this piece's arm freed read ahead.
                piece.read_ahead(engine);
            }
            self.arm_slot();
            return;
        }
        // A deferred prefetch (see `try_start_deferred_prefetch`) either started before
        // and is found here, or cannot start any more (`op_gate`).
        if let Some((gate, parts)) = self.gate.reach() {
            self.arm_prefetched(&gate, parts);
            return;
        }
        if self.piece.as_ref().is_some_and(|piece| piece.past_the_bound_end()) {
            self.moves_nothing();
            return;
        }
        let bound = self.params.read().and_then(|raw| {
            revalidate(&self.submitted, raw, self.flags, self.host.page_size_bytes()).ok()
        });
        let Some(io) = bound else {
            self.set_state(OpEvent::BindFailed);
            if self.reads_slot_at_arm() {
                // Its stream copies the slot: the slot must hold the destination's bytes
                // (once its copy is queued).
                self.slot_read_fails_at_arm(Outcome::Library(OpError::InvalidValue));
            } else {
                self.publish(Outcome::Library(OpError::InvalidValue));
            }
            return;
        };
        {
            let mut machine = self.machine();
            // `revalidate` refuses a grown size, so this only ever lowers the limit.
            let shrunk = machine.bind_size(io.size_bytes());
            debug_assert!(shrunk.is_ok(), "bound size {} grew: {shrunk:?}", io.size_bytes());
        }
        self.set_state(OpEvent::Arm);
        if self.declines_slot(&io) {
            self.decline_slot();
        }
        match self.host.engine() {
            Ok(engine) => {
                self.set_state(OpEvent::Start);
                if let Some(piece) = &self.piece {
                    // The next pieces whose slots this piece's arm freed read ahead.
                    piece.read_ahead(engine);
                }
                if self.reads_slot_at_arm() && !self.slot_declined() {
                    self.start_slot_read_at_arm(engine, io);
                } else {
                    self.post(engine, io, None);
                }
            }
            Err(error) if self.reads_slot_at_arm() && !self.slot_declined() => {
                self.slot_read_fails_at_arm(Outcome::Library(error.code));
            }
            Err(error) => self.publish(Outcome::Library(error.code)),
        }
    }

    /// The arm of a piece that the op's bound size ends before: it moves nothing and ends
    /// with 0 bytes (after a short piece, which makes the op short), releasing its stream
    /// as any piece does. A read's slot is filled from the destination first (its stream
    /// copies the slot back): the range past the bound size stays as it was. A write's
    /// slot is only unused.
    fn moves_nothing(self: &Arc<Self>) {
        {
            let mut machine = self.machine();
            let shrunk = machine.bind_size(0);
            debug_assert!(shrunk.is_ok(), "binding a piece past the end: {shrunk:?}");
        }
        self.set_state(OpEvent::Arm);
        self.set_state(OpEvent::Start);
        if self.reads_slot_at_arm() {
            self.slot_read_fails_at_arm(Outcome::Bytes(0));
        } else {
            self.publish(Outcome::Bytes(0));
        }
    }

    /// The arm of an op whose prefetch runs: open its gate, or, when what it staged may
    /// be stale, close the gate and read again in stream order.
    fn arm_prefetched(self: &Arc<Self>, gate: &flume::Sender<bool>, parts: usize) {
        self.set_state(OpEvent::Arm);
        if self.prefetch_still_fresh() {
            for _ in 0..parts {
                let _ = gate.send(true);
            }
            return;
        }
        // A write to the file was submitted after the prefetch started, or the file
        // changed (or may have) through another descriptor: what it staged may be
        // stale. Its jobs are superseded before their gate closes.
        self.set_state(OpEvent::Restage);
        for _ in 0..parts {
            let _ = gate.send(false);
        }
        self.host.async_stats().prefetches_redone.fetch_add(1, Ordering::Relaxed);
        match self.host.engine() {
            Ok(engine) => self.post(engine, self.submitted, None),
            Err(error) => self.publish(Outcome::Library(error.code)),
        }
    }

    /// Posts the op's job(s): one job on the stream's executor, or, for large ops, one
    /// per part over several executors (host release once all parts finished).
    pub(super) fn post(
        self: &Arc<Self>,
        engine: &Engine,
        io: ValidIo,
        gate: Option<super::prefetch::PrefetchGate>,
    ) {
        // A write in pieces: the earlier pieces' arms posted theirs, this one its last.
        if let Some(pieces) = self.writes_in_pieces() {
            self.post_write_piece(pieces - 1);
            return;
        }
        let (gate, parts) = match gate {
            Some(gate) => (Some(gate.receiver), gate.parts),
            None => (
                None,
                engine.parts(
                    crate::engine::Waiter::Queue,
                    self.direction,
                    &self.file,
                    io.file_offset_bytes(),
                    io.size_bytes(),
                ),
            ),
        };
        let fan_out = parts.len() > 1;
        let executors = engine.executors_for(self.stream.executor, &parts);
        let joiner = Arc::new(PartJoiner::new(self.direction, parts));
        for (index, &(offset, len)) in joiner.parts().iter().enumerate() {
            let Some(guard) = self.share_guard() else {
                self.publish(Outcome::Library(OpError::InternalError));
                return;
            };
            let op = Arc::clone(self);
            let joiner = Arc::clone(&joiner);
            let prefetch_job = gate.is_some();
            let done: crate::engine::JobDone = Box::new(move |end: JobEnd<'_>| {
                if prefetch_job && op.machine().prefetch_superseded() {
                    // Superseded by the job posted at arm.
                } else if !fan_out {
                    op.finish(end);
                } else if let Some((outcome, _device_error)) =
                    joiner.part_done(index, end.outcome, end.device_error)
                {
                    op.publish(outcome);
                }
            });
            let job = IoJob {
                file: Arc::clone(&self.file),
                guard,
                direction: self.direction,
                file_offset_bytes: io.file_offset_bytes() + offset,
                device_addr: io.device_addr() + offset,
                len_bytes: len,
                device_ordinal: self.device_ordinal,
                wait_for_copies: fan_out || !self.releases_device_side(),
                arm_gate: gate.clone(),
                // A write with a slot: the stream copied its bytes there before the
                // doorbell (`enqueue_copy_into_slot`).
                host_memory: self.write_slot_memory(offset),
                may_start: None,
                done: Completion::new(Arc::clone(self.host.device()), done),
            };
            engine.post(executors.executor(index), job);
        }
    }

    /// A guard for one job of the op, taken from the op's own (it exists until publish).
    pub(super) fn share_guard(&self) -> Option<OpGuard> {
        let resources = self.resources.lock().unwrap_or_else(|p| p.into_inner());
        resources.as_ref().map(|(guard, _)| guard.share())
    }

    /// Times the gap since the previous op of the stream was released device-side.
    fn note_arm(&self) {
        let now = clock_ns();
        self.armed_at_ns.store(now, Ordering::Relaxed);
        let released = self.stream.released_at_ns.swap(0, Ordering::Relaxed);
        if released != 0 {
            let stats = self.host.async_stats();
            stats.release_to_arm_ns.fetch_add(now.saturating_sub(released), Ordering::Relaxed);
            stats.timed_arms.fetch_add(1, Ordering::Relaxed);
            stats.arm_look_gap_ns.fetch_add(crate::arm::look_gap_ns(), Ordering::Relaxed);
            stats.arm_behind_look_ns.fetch_add(crate::arm::behind_look_ns(), Ordering::Relaxed);
        }
    }

    /// Times the arm-to-release share of an op released device-side, or from the host
    /// (after the engine's copies or with a copy on its own stream).
    pub(super) fn note_release(&self, stats: &super::AsyncStats) {
        let now = clock_ns();
        let armed = self.armed_at_ns.load(Ordering::Relaxed);
        if armed != 0 {
            stats.arm_to_release_ns.fetch_add(now.saturating_sub(armed), Ordering::Relaxed);
            stats.timed_releases.fetch_add(1, Ordering::Relaxed);
        }
        self.stream.released_at_ns.store(now, Ordering::Relaxed);
    }

    fn releases_device_side(&self) -> bool {
        // A read that declined its slot fills it from the destination once its copies
        // are done, then releases from the host (the stream's copy follows the release).
        self.direction == Direction::Read && !self.blocking_fallback && !self.slot_declined()
    }

    /// The single job of the op ended: publish, releasing device-side after the copies
    /// when the job left them in flight.
    fn finish(&self, end: JobEnd<'_>) {
        if self.declined_read_waits_for_its_copy(end.outcome) {
            return;
        }
        if !self.end.claim_publish() {
            return;
        }
        self.conclude(end.outcome);
        if let (Some(stream), true) = (end.stream, self.releases_device_side()) {
            let word = self.stream.word();
            // SAFETY: the word lives as long as the driver (see enqueue).
            let queued = unsafe {
                end.device.write_value32_internal(stream, word.device_addr, self.sequence)
            };
            if queued.is_ok() {
                let stats = self.host.async_stats();
                stats.device_releases.fetch_add(1, Ordering::Relaxed);
                self.note_release(stats);
                return;
            }
        }
        self.release_host();
    }

    /// Publishes an outcome and releases host-side (unless the op already published or
    /// was abandoned).
    pub(super) fn publish(&self, outcome: Outcome) {
        if !self.declined_read_waits_for_its_copy(outcome) {
            self.publish_now(outcome);
        }
    }

    /// [`AsyncOp::publish`], for a declined read once its slot's copy is enqueued.
    pub(super) fn publish_now(&self, outcome: Outcome) {
        if self.end.claim_publish() {
            self.conclude(outcome);
            self.release_host();
        }
    }

    /// The publication's winner: the machine reaches `Published`, `*bytes_p` is stored
    /// and the op lets go of file, buffer and hazard entry.
    pub(super) fn conclude(&self, outcome: Outcome) {
        // A read that declined its slot: the stream's queued copy out of the slot must
        // write back what the destination holds now.
        let outcome =
            if self.slot_declined() { self.keep_destination_past(outcome) } else { outcome };
        let state = self.machine().state();
        match (state, outcome) {
            // The engine moved `n` bytes (short at end of file).
            (OpState::Running, Outcome::Bytes(n)) => {
                self.set_state(OpEvent::Transferred(n));
                self.set_state(OpEvent::Finish);
            }
            // Already decided at arm (an invalid deferred parameter).
            (OpState::Done(_), _) => {}
            // The engine, or the arm before it, failed.
            (_, failure) => {
                self.set_state(OpEvent::Fail(failure));
            }
        }
        let published = self.set_state(OpEvent::Publish);
        let outcome = match published {
            OpState::Published(outcome) => outcome,
            _ => outcome,
        };
        self.store_and_release(outcome);
    }

    /// Stores `*bytes_p` and frees the op's hold on file, buffer and hazard table.
    pub(super) fn store_and_release(&self, outcome: Outcome) {
        match &self.piece {
            // The long op publishes (and counts) once, when its last piece ends.
            Some(piece) => piece.done(outcome),
            None => {
                crate::stats::global().record(
                    self.device_ordinal,
                    crate::stats::Api::Async,
                    self.direction,
                    self.submitted.size_bytes(),
                    outcome,
                    self.submitted_at.elapsed(),
                );
                self.params.publish(outcome.bytes_p_value() as isize);
            }
        }
        self.host.write_hazards().remove(&self.file, self.hazard);
        self.release_prefetch_window();
        self.resources.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    /// Releases the stream host-side (the release word = the op's sequence).
    pub(super) fn release_host(&self) {
        if self.blocking_fallback {
            self.signal_released();
        } else {
            self.note_release(self.host.async_stats());
        }
        let word = self.stream.word();
        // SAFETY: the word lives as long as the driver (see enqueue).
        unsafe { self.host.device().store_word_host(word.host_ptr, self.sequence) };
        self.host.async_stats().host_releases.fetch_add(1, Ordering::Relaxed);
        // (The blocking fallback arms without the poller: none to start for it.)
        if !self.blocking_fallback
            && let Ok(poller) = self.host.arm_poller()
        {
            poller.note_release();
        }
    }
}
