//! Enqueuing a submitted op on its user stream: the doorbell arm (write-value, then
//! wait-value) or the host-function arm, and undoing a refused submission.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use hipfile_core::{Direction, OpEvent, ValidIo};

use super::{AsyncOp, ParamSource};
use crate::device::{DeviceError, WriteThenWaitError};
use crate::engine::Engine;
use crate::error::Error;
use crate::file::{FileHandle, OpGuard};
use crate::stream::DeferredStart;

/// What one submission consists of.
pub(crate) struct OpParts {
    /// Read or write.
    pub(crate) direction: Direction,
    /// Where the parameters come from and the result goes.
    pub(crate) params: Arc<dyn ParamSource>,
    /// The parameters as validated at submission.
    pub(crate) io: ValidIo,
    /// The file.
    pub(crate) file: Arc<FileHandle>,
    /// Keeps the file's descriptors open until the op ends.
    pub(crate) guard: OpGuard,
    /// The op's sequence number on its stream.
    pub(crate) sequence: u32,
    /// For a piece of a long op (`pieces`): its place, slot and slot use.
    pub(crate) piece: Option<super::PieceSlot>,
    /// For an op of its own: the slot it takes and what for, chosen before the op is made
    /// ([`AsyncOp::single_slot`]: without one, an op with a FIXED device range may go
    /// through its stream's spare instead).
    pub(crate) single: Option<super::SingleSlot>,
    /// For a write copied into its slot in pieces: how ([`super::write_pieces`]; the
    /// op's sequence is then its last piece's).
    pub(crate) write_pieces: Option<super::write_pieces::WritePieces>,
}

/// A failed enqueue; `nothing_queued` when the stream holds nothing of the op.
pub(crate) struct EnqueueError {
    pub(crate) error: Error,
    pub(crate) nothing_queued: bool,
}

impl AsyncOp {
    /// Submits `whole` on its stream (the caller holds the stream's submit lock): as
    /// pieces sharing a ring of slots when it is a long op that may (`pieces`), else as
    /// one op with a slot of its own when one is free, else — with `all`, its device
    /// range FIXED — through the stream's spare slots, else as one op on the engine's
    /// path. `Err` when the submission is refused (nothing of the op runs, its sequence
    /// numbers given back) or, for pieces past the first, as `pieces` says.
    pub(crate) fn submit(
        submit: super::Submission<'_>,
        submit_lock: &mut crate::stream::SubmitGuard<'_>,
        whole: super::pieces::WholeOp<'_>,
    ) -> Result<(), EnqueueError> {
        let super::Submission { host, engine, state, buffer } = submit;
        let (direction, params, io, file, guard) = whole;
        let long = super::Submission { host: Arc::clone(&host), engine, state, buffer };
        if let Some(submitted) = AsyncOp::submit_long(long, submit_lock, whole) {
            return submitted;
        }
        let next = submit_lock.peek_next();
        let single = AsyncOp::single_slot(&*host, state, buffer, (direction, &io, file, next));
        if single.is_none() {
            // No slot of its own: with `all`, an op whose device range is FIXED goes
            // through its stream's spare slots, so that it too releases with no CUDA call.
            let spare = super::Submission { host: Arc::clone(&host), engine, state, buffer };
            if let Some(submitted) = AsyncOp::submit_through_spare(spare, submit_lock, whole) {
                return submitted;
            }
        }
        // A write in pieces takes a sequence number per piece, the op's own last.
        let slot_use = single.as_ref().map(|single| single.1);
        let write_pieces = super::write_pieces::WritePieces::plan(
            &*host, state, file, &io, slot_use,
        )
        .map(|plan| {
            let first = submit_lock.peek_next();
            for _ in 1..plan.1 {
                submit_lock.next();
            }
            super::write_pieces::WritePieces::new(first, plan)
        });
        let sequences = write_pieces.as_ref().map_or(1, |pieces| pieces.sequences());
        let sequence = submit_lock.next();
        let parts = OpParts {
            direction,
            params: Arc::clone(params),
            io,
            file: Arc::clone(file),
            guard: guard.share(),
            sequence,
            piece: None,
            single,
            write_pieces,
        };
        let op = AsyncOp::new(host, parts, state, buffer, engine.track_async_op());
        let submitted = op.enqueue(engine);
        if let Err(EnqueueError { nothing_queued: true, .. }) = &submitted {
            for _ in 0..sequences {
                submit_lock.undo();
            }
        }
        submitted
    }

    /// Enqueues the arm and the wait-value on the user's stream (the caller holds the
    /// stream's submit lock) and starts a prefetch when allowed.
    pub(crate) fn enqueue(self: &Arc<Self>, engine: &Engine) -> Result<(), EnqueueError> {
        // The prefetch gate goes in place before the arm is enqueued (the arm may run at
        // any moment and must find it); the prefetch job is posted once the enqueue
        // succeeded (a gate opened early is buffered in the channel).
        let admitted = self.holds_prefetch_window.load(Ordering::SeqCst);
        let prefetch_gate =
            if admitted && self.slot.is_none() { self.start_prefetch(engine) } else { None };
        if self.stages_slot_at_submission() && !self.wants_deferred_prefetch {
            // A staged slot read prefetches without a gate (`stream_copy`).
            self.set_state(OpEvent::Prefetch);
            self.note_prefetch_start();
        }
        let queued = if self.blocking_fallback {
            self.enqueue_host_function_arm()
        } else if self.write_pieces.is_some() {
            self.enqueue_write_pieces(engine)
        } else {
            self.enqueue_copy_into_slot()
                .map_err(|error| EnqueueError { error: Error::device(error), nothing_queued: true })
                .and_then(|()| self.enqueue_doorbell_arm(engine))
        };
        if let Err(error) = queued {
            if error.nothing_queued {
                self.abandon();
            }
            return Err(error);
        }
        // A long op counts once, when all its pieces are enqueued (`pieces`).
        if self.piece.is_none() {
            self.host.async_stats().submitted.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(gate) = prefetch_gate {
            self.host.async_stats().prefetched.fetch_add(1, Ordering::Relaxed);
            self.post(engine, self.submitted, Some(gate));
        }
        // (A staged slot read was posted by `enqueue_doorbell_arm`, ahead of its copy.)
        if self.wants_deferred_prefetch {
            let op = Arc::downgrade(self);
            self.stream.defer_prefetch(Box::new(move || match op.upgrade() {
                Some(op) => op.try_start_deferred_prefetch(),
                None => DeferredStart::Gone,
            }));
            self.stream.start_deferred();
        }
        Ok(())
    }

    /// Doorbell arm (see [`crate::arm`]): "write my sequence into the doorbell", then
    /// "wait until the release word reaches it"; the poller runs the arm when the
    /// doorbell rings.
    pub(super) fn enqueue_doorbell_arm(
        self: &Arc<Self>,
        engine: &Engine,
    ) -> Result<(), EnqueueError> {
        let nothing_queued = |error| EnqueueError { error, nothing_queued: true };
        let poller = self.host.arm_poller().map_err(nothing_queued)?;
        let device = self.host.device();
        let doorbell = self.stream.arm_queue().doorbell();
        let word = self.stream.word();
        let handle = self.stream.handle;
        // The doorbell and release words live in the driver's word pool as long as the
        // driver, which outlives every op (ops hold an Arc of it).
        let queued = if self.piece.as_ref().is_some_and(|piece| piece.copies_next.is_some()) {
            // A write piece with one after it: the next piece's copy goes between the two,
            // so that the stream runs it while the engine writes this piece.
            // SAFETY: the words, as said above.
            unsafe { device.stream_write_value32(handle, doorbell.device_addr, self.sequence) }
                .map_err(WriteThenWaitError::NothingQueued)
                .and_then(|()| {
                    self.enqueue_next_piece_copy();
                    // SAFETY: the words, as said above.
                    unsafe { device.stream_wait_value32(handle, word.device_addr, self.sequence) }
                        .map_err(WriteThenWaitError::WaitNotQueued)
                })
        } else {
            // SAFETY: the words, as said above.
            unsafe {
                device.stream_write_then_wait_value32(
                    handle,
                    doorbell.device_addr,
                    self.sequence,
                    word.device_addr,
                    self.sequence,
                )
            }
        };
        let wait_failed = match queued.and_then(|()| injected_wait_failure()) {
            Ok(()) => None,
            Err(WriteThenWaitError::NothingQueued(error)) => {
                return Err(nothing_queued(Error::device(error)));
            }
            Err(WriteThenWaitError::WaitNotQueued(error)) => Some(error),
        };
        // A slot read's copy goes behind the wait, once the arm is watched (below).
        let copy_after_watch =
            wait_failed.is_none() && self.direction == Direction::Read && self.slot.is_some();
        // The doorbell will ring either way: the arm runs and, for an op whose wait could
        // not be queued, finds it abandoned and only releases the word. Abandoned before
        // the arm is watched: an arm that ran first would start the op (and publish it)
        // after the caller was told the submission failed.
        if wait_failed.is_some() {
            self.abandon();
        }
        // A write's pieces ring ahead of the op's own doorbell: their arms go first.
        self.watch_write_pieces(poller);
        self.watch_arm(poller);
        // After the watch, and after a staged read is posted: should this enqueue wait for
        // a lock that a thread making streams holds while it waits for this very stream
        // (held on the wait above), the op's arm and its read still run and release the
        // stream, which lets that thread, and then this enqueue, go on. The op publishes
        // once the enqueue is over; a failed enqueue ends it with hipFileHipDriverError
        // (it was accepted; nothing copies into its destination).
        if copy_after_watch && self.stages_slot_at_submission() && !self.wants_deferred_prefetch {
            self.host.async_stats().prefetched.fetch_add(1, Ordering::Relaxed);
            self.claim_slot_read();
            self.post_slot_read(engine, self.submitted);
        }
        if copy_after_watch && let Some(slot) = &self.slot {
            let failed = self.enqueue_stream_copy(slot).err();
            self.slot_copy_enqueue_over(failed);
        }
        match wait_failed {
            None => Ok(()),
            Some(error) => Err(EnqueueError { error: Error::device(error), nothing_queued: false }),
        }
    }

    /// Hands the op's arm to the poller: it runs once the stream rang the op's doorbell.
    pub(super) fn watch_arm(
        self: &Arc<Self>,
        poller: &crate::arm::ArmPoller<crate::stream::StreamState>,
    ) {
        let op = Arc::clone(self);
        poller.watch(&self.stream, self.sequence, Box::new(move || op.arm()));
    }

    /// Marks the op as not submitted: it publishes nothing and only cleans up.
    pub(crate) fn abandon(&self) {
        self.end.abandon();
        // A prefetch job in flight sees its gate disconnect and ends without copying.
        self.gate.abandon();
        self.release_prefetch_window();
        self.host.write_hazards().remove(&self.file, self.hazard);
        self.resources.lock().unwrap_or_else(|p| p.into_inner()).take();
    }
}

/// A fault plan's refusal of the wait-value half of a doorbell arm (tests only; see
/// [`crate::fault::Site::StreamWait`]).
fn injected_wait_failure() -> Result<(), WriteThenWaitError> {
    use crate::fault::{Fault, Site};
    match crate::fault::at(Site::StreamWait) {
        None => Ok(()),
        Some(fault) => {
            if let Fault::Delay(delay) = fault {
                std::thread::sleep(delay);
            }
            let error = DeviceError::new(DeviceError::HIP_ERROR_INVALID_VALUE, "injected fault");
            Err(WriteThenWaitError::WaitNotQueued(error))
        }
    }
}
