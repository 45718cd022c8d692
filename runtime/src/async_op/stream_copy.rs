//! Ops copied on the user's own stream (see [`super::slots`]): the op's slot, the copy
//! enqueued at submission, and the release from the host.
//!
//! - A fully FIXED read inside the file ([`SlotUse::StagedRead`]) is posted at once when
//!   its stream's read-ahead window and the driver's budget admit it (as the engine's
//!   prefetch: `prefetch`), else when they have room again or, at the latest, when the
//!   stream reaches it; the engine having staged the bytes and the stream having reached
//!   the op are two finishers, and whichever comes second releases the stream. The op
//!   publishes (`*bytes_p`) once its copy's enqueue is over too: before the release when
//!   it is, else when the enqueue ends (the release never waits for a CUDA call).
//! - A read whose destination range is FIXED but whose file range is not known to lie
//!   inside the file, or may not be read ahead ([`SlotUse::ReadAtArm`]: its file offset
//!   binds late, it reaches past the end of the file now, or an unfinished write overlaps
//!   it), is read into its slot when the stream reaches it, in stream order.
//! - A write with a FIXED source range ([`SlotUse::Write`]) has its stream copy the
//!   source into the slot ahead of its doorbell; the engine writes the file from there.
//!
//! A read that comes back short, fails, or is aborted leaves the destination as it was.
//! The stream's copy covers the op's (or piece's) size, but for a read whose FIXED file
//! range reached past the end of the file when its slot was taken (under `all`): then
//! only the bytes inside the file ([`slot_copy_bytes`]), so that a read at the end of an
//! unchanged file needs nothing more. Before the release, the slot's bytes between what
//! was read and what the copy covers are filled from the destination itself (a device →
//! host copy on a library stream; the stream is held on the op, so its earlier work is
//! done) and the stream's copy writes them back unchanged; a read that found the file
//! longer than that has the bytes past the copy copied into the destination then. That
//! call is the one device call these paths make between the stream reaching an op and
//! its release (README, Known limits): CUDA can hold it behind an application thread's
//! blocked `cuStreamCreate`, as it holds any copy into or out of the application's
//! memory.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use hipfile_core::{Direction, OpError, OpEvent, OpState, Outcome, ValidIo};

use super::AsyncOp;
use super::slots::{MAX_SLOT_BYTES, SLOT_BYTES, Slot, StreamKey};
use crate::engine::{Completion, Engine, HostMemory, IoJob, JobEnd, PartJoiner};
use crate::file::FileHandle;
use crate::stream::DeferredStart;

/// The engine staged the bytes (its outcome is in `slot_outcome`).
const STAGED: u8 = 1;
/// The stream reached the op.
const ARMED: u8 = 2;
/// A read at arm's read into its slot is posted (at its arm, or ahead of it by an earlier
/// piece of its long op: `pieces`).
const POSTED: u8 = 4;
/// The enqueue of the stream's copy out of the slot is over (done or failed). An op
/// copied on its own stream is watched before that copy is enqueued, and its release
/// does not wait for that enqueue: on CUDA the enqueue may wait for a lock that a thread
/// making streams holds while it waits for this very stream (README, Known limits). Its
/// publication (`*bytes_p`, which says whether the copy was queued) does.
const QUEUED: u8 = 8;
/// The op's stream was released (the slot holds what the destination must end up with).
const RELEASED: u8 = 16;
/// A staged read that the read-ahead window kept from starting ahead was read at its
/// arm, in stream order: nothing it read can be stale.
const READ_AT_ARM: u8 = 32;
/// What a slot read's release needs: its bytes and its stream.
const RELEASABLE: u8 = STAGED | ARMED;
/// What a slot read's publication needs: its release and its copy's enqueue.
const READY: u8 = STAGED | ARMED | QUEUED | RELEASED;
/// What a read that declined its slot needs before it publishes and releases (its fill
/// needs the copy queued): its engine copies, its stream, its copy's enqueue.
const DECLINED_READY: u8 = STAGED | ARMED | QUEUED;

/// What an op's slot serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SlotUse {
    /// A fully FIXED read inside the file, staged into the slot ahead of its stream
    /// (at submission, or later within the read-ahead window: at the latest at its arm).
    StagedRead,
    /// A read with a FIXED destination range, read into the slot when the stream reaches
    /// it (its file offset bound then).
    ReadAtArm,
    /// A write with a FIXED source range, copied into the slot by its stream.
    Write,
}

/// Where an op's slot is: still the op's to give back (no copy out of it enqueued).
pub(super) const SLOT_HELD: u8 = 0;
/// The stream's copy out of it is enqueued (the slot is the pool's to reclaim after it).
pub(super) const SLOT_COPY_QUEUED: u8 = 1;
/// A write's copy into it is enqueued but its done write is not: never lent again.
pub(super) const SLOT_LOST: u8 = 3;

impl AsyncOp {
    /// A slot for an op on a device that copies on user streams and holds them on
    /// wait-values, and what it serves; `None` otherwise or when none is free.
    /// - With `HIPFILE_STREAM_COPIES=on`: a read that may prefetch (`prefetchable`: fully
    ///   FIXED, no overlapping write) of at most [`SLOT_BYTES`] on an idle stream (its
    ///   predecessor released).
    /// - With `all`, ops of at most [`MAX_SLOT_BYTES`]: a read that may prefetch and lies
    ///   inside the file now is staged ahead of its stream (within its read-ahead window);
    ///   any other read is read when the stream reaches it; a write has its stream copy
    ///   the source into the slot before its doorbell. The slot copy is enqueued for the
    ///   device range as submitted: when the stream's flags do not fix it (buffer offset
    ///   and size), the op takes the slot on the bet that it will not change, and
    ///   declines it at arm if it did ([`AsyncOp::declines_slot`]).
    ///
    /// Also the bytes the stream's copy is to cover ([`slot_copy_bytes`], from the file's
    /// length read here for a read under `all`).
    pub(super) fn wants_slot(
        host: &dyn super::OpHost,
        blocking_fallback: bool,
        prefetchable: bool,
        state: &crate::stream::StreamState,
        device_ordinal: u32,
        (direction, io, file, sequence): (Direction, &ValidIo, &Arc<FileHandle>, u32),
    ) -> Option<(Slot, SlotUse, u64)> {
        if blocking_fallback {
            return None;
        }
        let pool = host.slots()?;
        let size_bytes = io.size_bytes();
        let fits = size_bytes <= MAX_SLOT_BYTES as u64;
        let (wanted, file_bytes) = match (direction, pool.all_reads()) {
            (Direction::Read, true) if fits => {
                let file_bytes = file.size_bytes().ok();
                let inside = file_bytes.is_some_and(|len| io.file_end_bytes() <= len);
                let staged = prefetchable && inside;
                (if staged { SlotUse::StagedRead } else { SlotUse::ReadAtArm }, file_bytes)
            }
            (Direction::Read, false) if prefetchable && size_bytes <= SLOT_BYTES as u64 => {
                if state.word().load() != sequence.wrapping_sub(1) {
                    return None;
                }
                // `on` reads no file length here (its small reads stay cheap to submit):
                // one past the end of the file fills its slot at its release.
                (SlotUse::StagedRead, None)
            }
            (Direction::Write, true) if fits && host.stream_copy_writes() => (SlotUse::Write, None),
            _ => return None,
        };
        let copy_bytes = slot_copy_bytes((direction, io), file_bytes);
        match direction {
            Direction::Read => {
                // A slot shared with an earlier read of the stream is filled only once the
                // stream ran that read's copy out of it (a staged read reads ahead from
                // then on: `try_start_deferred_slot_read`; any read at the latest at arm).
                let (slot, _shared) = pool.try_take_for_read(
                    size_bytes as usize,
                    device_ordinal,
                    StreamKey::of(state),
                )?;
                Some((slot, wanted, copy_bytes))
            }
            Direction::Write => {
                pool.try_take(size_bytes as usize).map(|slot| (slot, wanted, copy_bytes))
            }
        }
    }

    /// At arm, for an op whose device range its stream does not fix: whether the bound
    /// parameters moved it off the range its slot copy was enqueued for (another buffer
    /// offset; for a read, also another size). The op then takes the engine's path for
    /// the bound range, and before its release fills the slot from the destination, so
    /// that the stream's queued copy writes back what is there (a read); a write's slot
    /// is only unused.
    pub(super) fn declines_slot(&self, bound: &ValidIo) -> bool {
        if !self.slot_range_may_change || self.slot.is_none() {
            return false;
        }
        let moved = bound.device_addr() != self.submitted.device_addr();
        let resized = bound.size_bytes() != self.submitted.size_bytes();
        moved || (self.direction == Direction::Read && resized)
    }

    /// Whether the op declined its slot at arm ([`AsyncOp::declines_slot`]).
    pub(super) fn slot_declined(&self) -> bool {
        self.slot_declined.load(Ordering::SeqCst)
    }

    /// Whether the op is a read staged into its slot ahead of its stream (at submission, or
    /// as the read-ahead window lets it; at the latest at its arm).
    pub(super) fn stages_slot_at_submission(&self) -> bool {
        self.slot.is_some() && self.slot_use == Some(SlotUse::StagedRead)
    }

    /// Whether the op is a read into its slot when the stream reaches it.
    pub(super) fn reads_slot_at_arm(&self) -> bool {
        self.slot.is_some() && self.slot_use == Some(SlotUse::ReadAtArm)
    }

    /// For a write with a slot (`HIPFILE_STREAM_COPIES=all`): enqueues on its stream,
    /// ahead of the doorbell and the wait-value, the copy of its source range into the slot
    /// and the slot's done write. When the doorbell rings the slot holds the bytes (stream
    /// order), and the engine writes the file from it: no device copy and no CUDA call
    /// stands between the stream reaching the op and its release. Nothing of this holds
    /// the stream. The slot is lent again after the op's job (at the op's drop), once its
    /// done word shows this use.
    pub(super) fn enqueue_copy_into_slot(&self) -> Result<(), crate::device::DeviceError> {
        let (Direction::Write, Some(slot)) = (self.direction, &self.slot) else {
            return Ok(());
        };
        // A piece whose copy the piece before it enqueued finds what that came to.
        let copied = match self.piece.as_ref().and_then(|piece| piece.copied_ahead()) {
            Some(copied) => copied,
            None => self.enqueue_slot_copy(slot),
        };
        if let Some(error) = copied? {
            self.slot_lost();
            self.slot_phase.store(SLOT_LOST, Ordering::SeqCst);
            return Err(error);
        }
        // A piece's ring learns of the use now; an op of its own retires its slot when
        // the op is dropped (the engine writes the file from it until then).
        if let Some(piece) = &self.piece {
            piece.long.note_queued(piece.ring_index(), slot.generation);
        }
        self.slot_phase.store(SLOT_COPY_QUEUED, Ordering::SeqCst);
        self.host.async_stats().stream_copies.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Where a write with a slot takes the bytes of its part at `offset_bytes` from.
    pub(super) fn write_slot_memory(&self, offset_bytes: u64) -> Option<HostMemory> {
        let (Direction::Write, Some(slot)) = (self.direction, &self.slot) else {
            return None;
        };
        if self.slot_declined() {
            return None;
        }
        // SAFETY: parts lie inside the op, which the slot holds whole.
        Some(HostMemory::new(unsafe { slot.host_ptr.add(offset_bytes as usize) }))
    }

    /// Enqueues, behind the op's wait-value, the copy out of its slot and the slot's done
    /// write. `Err` when the copy could not be enqueued (the slot goes back to the pool
    /// when the op is dropped).
    pub(super) fn enqueue_stream_copy(
        &self,
        slot: &Slot,
    ) -> Result<(), crate::device::DeviceError> {
        match self.enqueue_slot_copy(slot)? {
            None => self.slot_retired(slot),
            Some(_) => self.slot_lost(),
        }
        self.slot_phase.store(SLOT_COPY_QUEUED, Ordering::SeqCst);
        Ok(())
    }

    /// The stream's copy out of or into the op's slot and its done write are enqueued,
    /// and nothing of the op reads the slot after that copy: the pool (or the piece's
    /// ring) may lend it again once the done word shows this use.
    pub(super) fn slot_retired(&self, slot: &Slot) {
        let pool = self.host.slots().expect("an op with a slot has a pool");
        match &self.piece {
            Some(piece) if piece.last_user_of_its_slot() => {
                pool.retire(slot, StreamKey::of(&self.stream));
                piece.long.note_returned(piece.ring_index());
            }
            Some(piece) => piece.long.note_queued(piece.ring_index(), slot.generation),
            None => pool.retire(slot, StreamKey::of(&self.stream)),
        }
    }

    /// A copy of the op's slot was enqueued but not its done write: never lent again.
    pub(super) fn slot_lost(&self) {
        match &self.piece {
            Some(piece) => piece.long.note_lost(piece.ring_index()),
            None => self.host.slots().expect("an op with a slot has a pool").lose(),
        }
    }

    /// The op's slot was not used (no copy enqueued): back to the pool at once, unless it
    /// is a piece's (its ring goes back whole, after the last piece).
    pub(super) fn slot_unused(&self, slot: &Slot) {
        if self.piece.is_none() {
            self.host.slots().expect("an op with a slot has a pool").give_back(slot);
        }
    }

    /// Enqueues on the op's stream the copy between its slot and its device range (slot →
    /// destination for a read, source → slot for a write), then the slot's done write.
    /// `Err` when the copy could not be enqueued (the slot stays the op's until its drop);
    /// `Ok(Some(error))` when the done write could not (the slot must never be lent again).
    fn enqueue_slot_copy(&self, slot: &Slot) -> CopyEnqueued {
        self.enqueue_copy_of((slot, self.submitted.device_addr(), self.slot_copy_bytes))
    }

    /// For a write piece with one after it: enqueues the next piece's copy into its slot
    /// (called between this piece's doorbell and its wait-value:
    /// [`super::pieces::NextPieceCopy`]) and hands the outcome to the next piece.
    pub(super) fn enqueue_next_piece_copy(&self) {
        let Some(piece) = &self.piece else { return };
        let Some(next) = &piece.copies_next else { return };
        let copied = self.enqueue_copy_of((&next.slot, next.source_addr, next.copy_bytes));
        piece.note_next_copy(next, copied);
    }

    /// [`AsyncOp::enqueue_slot_copy`] for `slot`, the device range at `device_addr` and
    /// `copy_bytes` bytes.
    fn enqueue_copy_of(&self, (slot, device_addr, copy_bytes): (&Slot, u64, u64)) -> CopyEnqueued {
        let device = self.host.device();
        let handle = self.stream.handle;
        let len = copy_bytes as usize;
        // SAFETY: the slot is pinned memory of the pool, which lives as long as the driver
        // (the op holds it) and is not lent again until its done word shows this use; the
        // device range was validated at submission (the op's, or the next piece's, a part
        // of the long op's validated range). A copy of nothing is not enqueued.
        let copied =
            crate::device::injected_fault(crate::fault::Site::DeviceCopy).and_then(|()| unsafe {
                if len == 0 {
                    return Ok(());
                }
                match slot.device_memory() {
                    // Only reads take slots of device memory (`SlotPool::try_take_for_read`).
                    Some(slot_addr) => {
                        device.copy_device_on_stream(handle, device_addr, slot_addr, len)
                    }
                    None => device.copy_on_stream(
                        handle,
                        self.direction,
                        device_addr,
                        slot.host_ptr,
                        len,
                    ),
                }
            });
        // Unqueued, the slot stays the op's (`SLOT_HELD`): a staged read may be writing
        // into it; the op gives it back when it is dropped, after its jobs.
        copied?;
        // SAFETY: the done word lives in the pool's slab as long as the driver.
        let noted = unsafe {
            device.stream_write_value32(handle, slot.done_word.device_addr, slot.generation)
        };
        Ok(noted.err())
    }

    /// The bytes the stream's copy between the slot and the device range covers
    /// ([`slot_copy_bytes`]).
    pub(super) fn slot_copy_bytes(&self) -> u64 {
        self.slot_copy_bytes
    }

    /// Posts the read of the whole op into its slot (no gate: the bytes stay in the slot
    /// until the release lets the stream copy them): at submission for a staged read (the
    /// parameters as submitted), at arm for a read at arm (the parameters as bound). A
    /// long read is split over executors like the engine's own (`Engine::parts`), each
    /// part into its place in the slot; the parts' results are combined (short at the
    /// first short part) before the op's finisher sees them.
    pub(super) fn post_slot_read(self: &Arc<Self>, engine: &Engine, io: ValidIo) {
        let Some(slot) = self.slot else { return };
        let at_arm = self.reads_slot_at_arm();
        let parts = engine.parts(
            crate::engine::Waiter::Queue,
            Direction::Read,
            &self.file,
            io.file_offset_bytes(),
            io.size_bytes(),
        );
        let executors = engine.executors_for(self.stream.executor, &parts);
        let joiner = Arc::new(PartJoiner::new(Direction::Read, parts));
        for (index, &(offset, len)) in joiner.parts().iter().enumerate() {
            let Some(guard) = self.share_guard() else {
                let failed = Outcome::Library(OpError::InternalError);
                if let Some((outcome, _)) = joiner.part_done(index, failed, None) {
                    self.slot_read_done(at_arm, outcome);
                }
                continue;
            };
            let op = Arc::clone(self);
            let joiner = Arc::clone(&joiner);
            let done: crate::engine::JobDone = Box::new(move |end: JobEnd<'_>| {
                if let Some((outcome, _)) = joiner.part_done(index, end.outcome, end.device_error) {
                    op.slot_read_done(at_arm, outcome);
                }
            });
            let job = IoJob {
                file: Arc::clone(&self.file),
                guard,
                direction: Direction::Read,
                file_offset_bytes: io.file_offset_bytes() + offset,
                // A slot of device memory is filled as the engine's own path fills a
                // destination: through its staging, then a copy (done once it completed).
                device_addr: slot.device_memory().map_or(io.device_addr(), |addr| addr) + offset,
                len_bytes: len,
                device_ordinal: self.device_ordinal,
                wait_for_copies: slot.device_memory().is_some(),
                arm_gate: None,
                host_memory: match slot.device_memory() {
                    Some(_) => None,
                    // SAFETY: parts lie inside the op, which the slot holds whole.
                    None => Some(HostMemory::new(unsafe { slot.host_ptr.add(offset as usize) })),
                },
                may_start: None,
                done: Completion::new(Arc::clone(self.host.device()), done),
            };
            engine.post(executors.executor(index), job);
        }
    }

    fn slot_read_done(self: &Arc<Self>, at_arm: bool, outcome: Outcome) {
        if !at_arm {
            self.slot_staged(outcome);
            return;
        }
        // A read at arm ends once it is both read and reached (a piece read ahead may be
        // read before the stream reaches it).
        *self.slot_outcome.lock().unwrap_or_else(|p| p.into_inner()) = Some(outcome);
        self.advance_slot_flow(STAGED);
    }

    /// A read at arm whose parameters are bound: posts its read, or, when a piece ahead of
    /// it already did, finishes if that read is in.
    pub(super) fn start_slot_read_at_arm(self: &Arc<Self>, engine: &Engine, io: ValidIo) {
        if self.slot_flow.load(Ordering::SeqCst) & POSTED == 0 {
            self.slot_flow.fetch_or(POSTED | ARMED, Ordering::SeqCst);
            self.post_slot_read(engine, io);
        } else {
            self.advance_slot_flow(ARMED);
        }
    }

    /// A read at arm that fails before its read is posted (its parameters do not bind,
    /// or the engine cannot start): it ends with `failure` as if its read had (the slot
    /// is filled from the destination before the release).
    pub(super) fn slot_read_fails_at_arm(self: &Arc<Self>, failure: Outcome) {
        *self.slot_outcome.lock().unwrap_or_else(|p| p.into_inner()) = Some(failure);
        self.advance_slot_flow(POSTED | ARMED | STAGED);
    }

    /// Posts the read of a piece of a long op ahead of its arm, into a slot an earlier
    /// piece has finished with (`pieces`: called from the arm of an earlier piece, on the
    /// poller, before this piece's arm can run). Nothing when the long op's parameters are
    /// invalid: its own arm then fails it.
    pub(super) fn post_read_ahead(self: &Arc<Self>, engine: &Engine, io: ValidIo) {
        self.slot_flow.fetch_or(POSTED, Ordering::SeqCst);
        self.host.async_stats().read_ahead.fetch_add(1, Ordering::Relaxed);
        self.post_slot_read(engine, io);
    }

    /// Sets `bit` of a declined read's finishers: `true` for the one caller that
    /// completes them ([`DECLINED_READY`]).
    fn slot_flow_completes(&self, bit: u8) -> bool {
        let before = self.slot_flow.fetch_or(bit, Ordering::SeqCst);
        before & DECLINED_READY != DECLINED_READY
            && (before | bit) & DECLINED_READY == DECLINED_READY
    }

    /// Sets `bit` of a slot read's finishers; the caller that completes [`RELEASABLE`]
    /// releases the stream (and publishes if the copy is queued), the enqueue's end
    /// publishes when it completes [`READY`] after the release.
    fn advance_slot_flow(self: &Arc<Self>, bit: u8) {
        let before = self.slot_flow.fetch_or(bit, Ordering::SeqCst);
        let after = before | bit;
        if before & RELEASABLE != RELEASABLE && after & RELEASABLE == RELEASABLE {
            self.release_slot_read();
        } else if before & READY != READY && after & READY == READY {
            self.publish_slot_read();
        }
    }

    /// The enqueue of the stream's copy out of the slot is over; `failed` when the copy
    /// could not be enqueued (the op then ends with hipFileHipDriverError, its
    /// destination untouched: nothing copies into it).
    pub(super) fn slot_copy_enqueue_over(
        self: &Arc<Self>,
        failed: Option<crate::device::DeviceError>,
    ) {
        if let Some(error) = failed {
            log::error!("an async read's copy on its stream could not be enqueued: {error}");
            self.slot_copy_failed.store(true, Ordering::SeqCst);
        }
        if !self.slot_declined() {
            self.advance_slot_flow(QUEUED);
        } else if self.slot_flow_completes(QUEUED) {
            self.publish_now(self.take_slot_outcome());
        }
    }

    /// For a read that declined its slot (the engine moves it): `true` while its outcome
    /// must wait for the enqueue of the slot's copy (kept until then); the fill before
    /// the release needs the copy queued.
    pub(super) fn declined_read_waits_for_its_copy(&self, outcome: Outcome) -> bool {
        if self.direction != Direction::Read || !self.slot_declined() {
            return false;
        }
        *self.slot_outcome.lock().unwrap_or_else(|p| p.into_inner()) = Some(outcome);
        !self.slot_flow_completes(STAGED)
    }

    /// A read that declines its slot at arm: the stream is there.
    pub(super) fn decline_slot(&self) {
        self.slot_declined.store(true, Ordering::SeqCst);
        self.slot_flow.fetch_or(ARMED, Ordering::SeqCst);
    }

    /// The outcome a slot read publishes (the slot filled past what was read at its
    /// release): a driver error when its copy could not be enqueued, else `outcome`.
    fn slot_read_outcome(&self, outcome: Outcome) -> Outcome {
        if self.slot_copy_failed.load(Ordering::SeqCst) {
            return Outcome::Library(OpError::HipDriverError);
        }
        // An op whose parameters did not bind is decided (`Done`) and moved nothing, as a
        // piece past the op's bound size (bound to 0 bytes): its stream copies the
        // destination's own bytes back, uncounted.
        let machine = *self.machine();
        let bound = !matches!(machine.state(), hipfile_core::OpState::Done(_));
        if bound && machine.size_bytes() > 0 {
            self.host.async_stats().stream_copies.fetch_add(1, Ordering::Relaxed);
        }
        outcome
    }

    /// What the slot's read ended with (an internal error if nothing was recorded).
    fn take_slot_outcome(&self) -> Outcome {
        let recorded = self.slot_outcome.lock().unwrap_or_else(|p| p.into_inner()).take();
        recorded.unwrap_or(Outcome::Library(OpError::InternalError))
    }

    /// The engine staged the op's bytes (or failed): its share of the read-ahead window
    /// goes back (the next deferred read of the stream may start), and the stream is
    /// released if it is there.
    fn slot_staged(self: &Arc<Self>, outcome: Outcome) {
        *self.slot_outcome.lock().unwrap_or_else(|p| p.into_inner()) = Some(outcome);
        self.release_prefetch_window();
        self.advance_slot_flow(STAGED);
    }

    /// Claims the posting of a staged read's read into its slot: `true` for the one
    /// caller that posts it (at submission when the window admitted it, else the deferred
    /// start or the arm, whichever comes first).
    pub(super) fn claim_slot_read(&self) -> bool {
        self.slot_flow.fetch_or(POSTED, Ordering::SeqCst) & POSTED == 0
    }

    /// Starts the read into its slot of a staged read that the read-ahead window did not
    /// admit at submission, once the window has room, unless the stream reached it (its
    /// arm reads it then) or a write of ours submitted since overlaps it (the same).
    pub(super) fn try_start_deferred_slot_read(self: &Arc<Self>) -> DeferredStart {
        let len_bytes = self.submitted.size_bytes();
        if self.end.is_abandoned() || self.slot_flow.load(Ordering::SeqCst) & POSTED != 0 {
            return DeferredStart::Gone;
        }
        let Ok(engine) = self.host.engine() else { return DeferredStart::Gone };
        if !self
            .host
            .write_hazards()
            .may_prefetch(&self.file, super::prefetch::file_range(&self.submitted))
        {
            return DeferredStart::Gone;
        }
        // A shared slot's earlier use is copied out of it first (the stream's arms retry).
        if self.slot.is_some_and(|slot| slot.waits_for_earlier_copy())
            || !self.stream.admit_prefetch(len_bytes)
        {
            return DeferredStart::NoRoom;
        }
        self.holds_prefetch_window.store(true, Ordering::SeqCst);
        let started = {
            // Under the machine's lock, which the arm's step takes too: an op the stream
            // reached first is its arm's to read.
            let mut machine = self.machine();
            machine.state() == OpState::Submitted
                && machine.step(OpEvent::Prefetch).is_ok()
                && self.claim_slot_read()
        };
        if !started {
            // Given back without starting others: this runs inside `start_deferred`.
            if self.holds_prefetch_window.swap(false, Ordering::SeqCst) {
                self.stream.release_prefetch(len_bytes);
            }
            return DeferredStart::Gone;
        }
        self.note_prefetch_start();
        self.host.async_stats().prefetched.fetch_add(1, Ordering::Relaxed);
        self.post_slot_read(engine, self.submitted);
        DeferredStart::Started
    }

    /// The stream reached a staged slot op (the poller's arm): release if the bytes are
    /// staged. A read the window kept from starting ahead is read now, in stream order.
    pub(super) fn arm_slot(self: &Arc<Self>) {
        self.set_state(OpEvent::Arm);
        if self.wants_deferred_prefetch && self.claim_slot_read() {
            self.slot_flow.fetch_or(READ_AT_ARM, Ordering::SeqCst);
            self.set_state(OpEvent::Start);
            match self.host.engine() {
                Ok(engine) => self.post_slot_read(engine, self.submitted),
                Err(error) => self.slot_staged(Outcome::Library(error.code)),
            }
        }
        self.advance_slot_flow(ARMED);
    }

    /// Bytes and stream are in: read again if staged bytes may be stale (once), else make
    /// the slot hold exactly what the destination must end up with and release the
    /// stream from the host. No CUDA call unless the read came back short (the fill).
    fn release_slot_read(self: &Arc<Self>) {
        if self.stages_slot_at_submission()
            && self.slot_flow.load(Ordering::SeqCst) & READ_AT_ARM == 0
            && !self.machine().prefetch_superseded()
            && !self.prefetch_still_fresh()
        {
            self.set_state(OpEvent::Restage);
            self.host.async_stats().prefetches_redone.fetch_add(1, Ordering::Relaxed);
            self.slot_flow.fetch_and(!STAGED, Ordering::SeqCst);
            match self.host.engine() {
                Ok(engine) => self.post_slot_read(engine, self.submitted),
                Err(error) => self.slot_staged(Outcome::Library(error.code)),
            }
            return;
        }
        let filled = self.keep_destination_past(self.take_slot_outcome());
        *self.slot_outcome.lock().unwrap_or_else(|p| p.into_inner()) = Some(filled);
        // `*bytes_p` goes before the release when the copy is queued (a stream synchronized
        // after it must find it); with the enqueue still on its way (the submission has
        // not returned, so nothing can have waited for the op yet), the enqueue's end
        // publishes.
        let before = self.slot_flow.fetch_or(RELEASED, Ordering::SeqCst);
        if before & QUEUED != 0 {
            self.publish_slot_read();
        }
        self.release_host();
    }

    /// Released, and the copy's enqueue is over: store `*bytes_p` and let go of the op's
    /// file, buffer and hazard entry.
    fn publish_slot_read(&self) {
        let outcome = self.slot_read_outcome(self.take_slot_outcome());
        if self.end.claim_publish() {
            self.conclude(outcome);
        }
    }

    /// Makes the destination end up with what `outcome` read and its own bytes past that,
    /// given that the stream's copy writes the slot's first [`AsyncOp::slot_copy_bytes`]:
    /// fills the slot between what was read and that from the destination (a read that
    /// came back shorter, failed, or declined its slot), or copies what was read past it
    /// into the destination now (a read that found the file longer than when its copy was
    /// enqueued). Nothing when the read covers the copy exactly. A failed device call
    /// turns the outcome into a driver error (the destination is then undefined there).
    pub(super) fn keep_destination_past(&self, outcome: Outcome) -> Outcome {
        // A write's slot is only read by the stream's copy into it: nothing to keep.
        let (Direction::Read, Some(slot)) = (self.direction, self.slot) else { return outcome };
        // Nothing copies out of a slot whose copy could not be enqueued. One whose enqueue
        // is still on its way is filled all the same (the copy follows the release).
        if self.slot_copy_failed.load(Ordering::SeqCst) {
            return outcome;
        }
        let size = self.submitted.size_bytes();
        let read = match outcome {
            // A declined slot's bytes were never read: the engine moved the op.
            Outcome::Bytes(n) if !self.slot_declined() => n.min(size),
            _ => 0,
        };
        let copied = self.slot_copy_bytes();
        if read == copied {
            return outcome;
        }
        let device = self.host.device();
        // Between what was read and what the stream copies: the destination's own bytes
        // into the slot (device → slot), or the slot's into the destination (slot →
        // device), now.
        let (from, len) = (read.min(copied), read.abs_diff(copied) as usize);
        let (into_slot, destination) = (read < copied, self.submitted.device_addr() + from);
        // SAFETY: the slot is ours until the release; the device range is the op's
        // validated destination, which the held stream no longer writes (and whose part
        // past what the stream copies it never writes).
        let moved = unsafe {
            match (slot.device_memory(), into_slot) {
                (Some(slot_addr), true) => {
                    device.copy_device_now(self.device_ordinal, slot_addr + from, destination, len)
                }
                (Some(slot_addr), false) => {
                    device.copy_device_now(self.device_ordinal, destination, slot_addr + from, len)
                }
                (None, into_slot) => device.copy_now(
                    self.device_ordinal,
                    if into_slot { Direction::Write } else { Direction::Read },
                    destination,
                    slot.host_ptr.add(from as usize),
                    len,
                    true,
                ),
            }
        };
        match moved {
            Ok(()) => outcome,
            Err(error) => {
                log::error!("a failed async read could not keep its destination: {error}");
                Outcome::Library(OpError::HipDriverError)
            }
        }
    }
}

/// What the enqueue of a copy between a slot and a device range came to
/// ([`AsyncOp::enqueue_slot_copy`]): `Err` when the copy was not enqueued, `Ok(Some(_))`
/// when its done write was not.
pub(super) type CopyEnqueued =
    Result<Option<crate::device::DeviceError>, crate::device::DeviceError>;

/// The bytes the stream's copy between an op's slot and its device range is to cover,
/// decided with the slot (before the op's doorbell is queued, so that its release and its
/// copy agree), from `file_bytes`, the file's length read then: the op's size, but for a
/// read (of its own, or a piece of a long op) whose range as submitted reaches past the
/// end of the file — the bytes inside the file. A read at the end of a file (a
/// page-aligned read of a file's last partial page, say) then comes back with as many
/// bytes as its copy covers and needs no device call before its release. One that finds
/// the file shorter or longer by then, or (on a stream that does not fix the file offset)
/// is bound to another offset, makes one ([`AsyncOp::keep_destination_past`]): the file
/// offset as submitted is a bet, as the device range is.
pub(super) fn slot_copy_bytes(
    (direction, io): (Direction, &ValidIo),
    file_bytes: Option<u64>,
) -> u64 {
    let size = io.size_bytes();
    match file_bytes {
        Some(file_bytes) if direction == Direction::Read => {
            file_bytes.saturating_sub(io.file_offset_bytes()).min(size)
        }
        _ => size,
    }
}
