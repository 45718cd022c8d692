//! Long ops copied on the user's own stream in pieces (`HIPFILE_STREAM_COPIES=all`): an op
//! of more than the pool's piece size (`HIPFILE_STREAM_COPY_PIECE_MB`: 1, 4 or 16 MiB,
//! by default 16 MiB, the largest slot) whose buffer offset and size are FIXED is submitted as
//! consecutive pieces of at most that size, each an op of its own on the stream
//! (doorbell, wait-value, the slot copy, the done word: [`super::stream_copy`]), that
//! share a ring of at most [`RING_SLOTS`] slots: piece `j` uses slot `j mod RING_SLOTS`.
//!
//! A read's ring is of the engine's device memory when the pool has device slots
//! ([`super::slots::SlotPool::try_take_ring_for_read`]; the stream then copies device →
//! device), else pinned, as a write's always is.
//!
//! Stream order makes the ring safe without any wait of ours: piece `j + RING_SLOTS`
//! reaches its doorbell only after the stream ran piece `j`'s copy (out of the slot for a
//! read, after the engine wrote the file from it for a write, which its release waited
//! for). So the first pieces of a read may be staged at submission (each has a slot of its
//! own), the later ones are read into their slot when the stream reaches them; a write
//! piece's copy into its slot is queued ahead of its doorbell, as for any write copied on
//! its stream, and (on a ring of two slots or more) ahead of the previous piece's wait:
//! right after that piece's doorbell, so that the stream copies it while the engine
//! writes the previous one ([`NextPieceCopy`]). No CUDA call stands between the stream
//! reaching a piece and its release, whatever the op's length, with at most
//! [`RING_SLOTS`] pieces' worth of slots held.
//! Pieces smaller than 16 MiB let the stream copy a piece while the engine still reads
//! the next ones, where one 16 MiB slot is read whole before its one copy.
//!
//! The caller sees one op: the file offset (when not FIXED) is read once, when the stream
//! reaches the first piece, and checked for the whole op; `*bytes_p` is written once, when
//! the last piece ends, with the pieces' results combined as the engine combines the parts
//! of a split request (short at the first short piece; the first failure wins); the
//! statistics count one op. Each piece is enqueued and watched like an op of its own: a
//! first piece that cannot be enqueued refuses the op; a later one ends it, after the
//! pieces before it, with the error.

use std::sync::{Arc, Mutex, Weak};

use hipfile_core::{
    Direction, OpError, Outcome, RawIo, StreamFlags, ValidIo, revalidate, validate,
};

use super::slots::{SPARE_BYTES, Slot, SpareSlot, StreamKey};
use super::stream_copy::{CopyEnqueued, SlotUse};
use super::{AsyncOp, EnqueueError, HostDropGuard, OpHost, OpParts, ParamSource};
use crate::buffer::ResolvedBuffer;
use crate::engine::Engine;
use crate::error::Error;
use crate::file::{FileHandle, OpGuard};
use crate::stream::{StreamState, SubmitGuard};

/// Slots a long op holds at most (its ring): 64 MiB of 16 MiB pieces, the least default
/// slot cap of that size (`HIPFILE_STREAM_COPY_MB`).
pub(crate) const RING_SLOTS: usize = 4;

/// What a piece's slot saw last, for the ring's return to the pool.
#[derive(Clone, Copy)]
enum RingUse {
    /// No copy out of or into it was enqueued.
    Unused,
    /// The last use whose copy was enqueued: its generation.
    Queued(u32),
    /// A copy was enqueued but not its done write: never lent again.
    Lost,
    /// Its last piece handed it back to the pool itself (as an op of its own would).
    Returned,
}

/// One long op: the caller's parameters and result, the ring, and the pieces' results.
pub(crate) struct LongOp {
    /// The driver (for the slot pool when the ring goes back; see [`HostDropGuard`] for
    /// why it is held through the guard).
    host: HostDropGuard,
    user: Arc<dyn ParamSource>,
    direction: Direction,
    device_ordinal: u32,
    submitted_at: std::time::Instant,
    whole: ValidIo,
    flags: StreamFlags,
    page_size_bytes: u64,
    /// Bytes of every piece but the last (the pool's piece size).
    piece_bytes: u64,
    pieces: usize,
    ring: Vec<Slot>,
    /// The stream the pieces copy on (the ring's slots are retired as its).
    stream: StreamKey,
    /// The stream's spare slots, when the ring is theirs: their uses are theirs to track,
    /// and they stay with the stream (the pool takes them back).
    spare: Option<Arc<SpareSlot>>,
    state: Mutex<LongState>,
    /// Pieces read into their slot when the stream reaches them, until an earlier piece's
    /// arm posts their read ahead ([`PieceOf::read_ahead`]).
    ahead: Mutex<Vec<Option<Weak<AsyncOp>>>>,
}

struct LongState {
    /// The whole op as bound when the stream reached it (`Some(None)`: invalid); read once.
    bound: Option<Option<ValidIo>>,
    /// Each piece's outcome, once it ended.
    results: Vec<Option<Outcome>>,
    ring_uses: Vec<RingUse>,
}

impl LongOp {
    /// Piece `index` of `whole` (the op as submitted or as bound); `None` for a piece
    /// that starts at or past its end (the bound size shrank).
    fn piece_io(&self, whole: &ValidIo, index: usize) -> Option<ValidIo> {
        let start = index as u64 * self.piece_bytes;
        let raw = RawIo {
            size_bytes: self.piece_bytes.min(whole.size_bytes().checked_sub(start)?),
            file_offset_bytes: i64::try_from(whole.file_offset_bytes() + start).ok()?,
            buffer_offset_bytes: i64::try_from(whole.buffer_offset_bytes() + start).ok()?,
        };
        validate(raw, whole.buffer(), self.flags, self.page_size_bytes).ok()
    }

    /// Whether piece `index` is its ring slot's first use (a slot of the pool's ring,
    /// taken for this op). A spare may still be read by an earlier op's copy: every use
    /// of one is a new one.
    fn first_use(&self, index: usize) -> bool {
        self.spare.is_none() && index < self.ring.len()
    }

    /// The whole op as bound when the stream reached its first piece (read once).
    fn bound(&self) -> Option<ValidIo> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        *state.bound.get_or_insert_with(|| {
            let raw = self.user.read()?;
            revalidate(&self.whole, raw, self.flags, self.page_size_bytes).ok()
        })
    }

    /// Whether the op as bound covers another device range than the one its pieces'
    /// copies were enqueued for (possible only where the stream does not fix buffer offset
    /// and size): then no piece reads ahead, each declines its slot at its own arm.
    fn moved(&self, bound: &ValidIo) -> bool {
        bound.device_addr() != self.whole.device_addr()
            || bound.size_bytes() != self.whole.size_bytes()
    }

    /// Piece `index` ended with `outcome`: once every piece has, the caller's result is
    /// published (and the op counted in the statistics).
    fn piece_done(&self, index: usize, outcome: Outcome) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(result) = state.results.get_mut(index) {
            *result = Some(outcome);
        }
        self.publish_if_complete(state);
    }

    /// Piece `index` could not be enqueued (the pieces before it were): the op ends with
    /// `failure` once those have ended; no later piece exists.
    fn cut_short(&self, index: usize, failure: Outcome) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.results.truncate(index);
        state.results.push(Some(failure));
        self.publish_if_complete(state);
    }

    fn publish_if_complete(&self, state: std::sync::MutexGuard<'_, LongState>) {
        if state.results.iter().any(Option::is_none) {
            return;
        }
        let combined = combine(&state.results, self.whole.size_bytes(), self.piece_bytes);
        drop(state);
        crate::stats::global().record(
            self.device_ordinal,
            crate::stats::Api::Async,
            self.direction,
            self.whole.size_bytes(),
            combined,
            self.submitted_at.elapsed(),
        );
        self.user.publish(combined.bytes_p_value() as isize);
    }

    /// The slot of piece `index`'s ring entry had a copy enqueued for the use
    /// `generation`.
    pub(super) fn note_queued(&self, ring_index: usize, generation: u32) {
        if let Some(spare) = &self.spare {
            spare.note_queued(ring_index, generation);
            return;
        }
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if matches!(state.ring_uses[ring_index], RingUse::Unused | RingUse::Queued(_)) {
            state.ring_uses[ring_index] = RingUse::Queued(generation);
        }
    }

    /// The ring entry's last piece handed its slot back to the pool.
    pub(super) fn note_returned(&self, ring_index: usize) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if !matches!(state.ring_uses[ring_index], RingUse::Lost) {
            state.ring_uses[ring_index] = RingUse::Returned;
        }
    }

    /// A copy of the ring entry's slot was enqueued without its done write.
    pub(super) fn note_lost(&self, ring_index: usize) {
        if let Some(spare) = &self.spare {
            spare.note_lost(ring_index);
            return;
        }
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.ring_uses[ring_index] = RingUse::Lost;
    }
}

impl Drop for LongOp {
    /// What its last pieces did not hand back goes back to the pool (a refused submission's):
    /// each slot once the stream has run the last copy enqueued for it, at once if none
    /// was, never if a done write was refused.
    fn drop(&mut self) {
        if self.spare.is_some() {
            return;
        }
        let Some(pool) = self.host.0.as_ref().and_then(|host| host.slots()) else { return };
        let state = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        for (slot, used) in self.ring.iter().zip(&state.ring_uses) {
            match *used {
                RingUse::Unused => pool.give_back(slot),
                RingUse::Queued(generation) => {
                    pool.retire(&slot.with_generation(generation), self.stream)
                }
                RingUse::Lost => pool.lose(),
                RingUse::Returned => {}
            }
        }
    }
}

/// Combines the pieces' outcomes in order: the first failure wins; otherwise the bytes up
/// to and including the first short piece (pieces of `piece_bytes`, the last one shorter).
fn combine(results: &[Option<Outcome>], size_bytes: u64, piece_bytes: u64) -> Outcome {
    let mut total = 0u64;
    for (index, result) in results.iter().enumerate() {
        let piece_bytes = piece_bytes.min(size_bytes - index as u64 * piece_bytes);
        match result.unwrap_or(Outcome::Library(OpError::InternalError)) {
            Outcome::Bytes(n) if n >= piece_bytes => total += n,
            Outcome::Bytes(n) => {
                total += n;
                // Short: the rest read nothing, or fails (the first failure wins).
                if let Some(failure) =
                    results[index + 1..].iter().flatten().find(|o| !matches!(o, Outcome::Bytes(_)))
                {
                    return *failure;
                }
                return Outcome::Bytes(total);
            }
            failure => return failure,
        }
    }
    Outcome::Bytes(total)
}

/// Where a piece's parameters come from: the long op's, cut to the piece. Its result goes
/// to the long op (`AsyncOp::store_and_release`), never to the caller directly.
struct PieceParams {
    long: Arc<LongOp>,
    index: usize,
}

// SAFETY: the long op's caller parameters are valid while any piece holds them (the
// caller's contract for the whole op, which lasts until its last piece published).
unsafe impl ParamSource for PieceParams {
    fn read(&self) -> Option<RawIo> {
        let bound = self.long.bound()?;
        let piece = self.long.piece_io(&bound, self.index)?;
        Some(RawIo {
            size_bytes: piece.requested_size_bytes(),
            file_offset_bytes: i64::try_from(piece.file_offset_bytes()).ok()?,
            buffer_offset_bytes: i64::try_from(piece.buffer_offset_bytes()).ok()?,
        })
    }

    fn published(&self) -> isize {
        self.long.user.published()
    }

    /// Pieces report to the long op (`AsyncOp::store_and_release`); nothing calls this.
    fn publish(&self, _bytes: isize) {
        debug_assert!(false, "a piece publishes through its long op");
    }
}

/// A piece's place in its long op.
pub(crate) struct PieceOf {
    pub(super) long: Arc<LongOp>,
    pub(super) index: usize,
    /// A write piece with one after it (on a ring of at least two slots): the next
    /// piece's copy into its slot, which this piece's enqueue puts on the stream between
    /// its doorbell and its wait-value ([`AsyncOp::enqueue_next_piece_copy`]).
    pub(super) copies_next: Option<NextPieceCopy>,
    /// A write piece whose copy into its slot the piece before it enqueued (or tried to):
    /// what that enqueue came to, taken by this piece's own enqueue.
    pub(super) copied_ahead: Option<Arc<CopyAhead>>,
}

/// The copy of a write piece's source into its slot, enqueued by the piece before it
/// right after that piece's doorbell: the stream then copies piece `j + 1` while the
/// engine writes piece `j` (before, the copy waited behind piece `j`'s release, so copy
/// and `pwrite` alternated: 0.79-0.84x the engine's path on 64 MiB writes from one
/// stream, H100, thirty-third session). Safe by stream order on a ring of at least two
/// slots: piece `j + 1`'s slot was last used by piece `j + 1 - ring` (at most `j - 1`),
/// whose release, and so its write out of the slot, the stream waited for before
/// piece `j`'s doorbell.
pub(crate) struct NextPieceCopy {
    pub(super) slot: Slot,
    /// The next piece's source (its device range as submitted) and the bytes to copy.
    pub(super) source_addr: u64,
    pub(super) copy_bytes: u64,
    pub(super) ring_index: usize,
    pub(super) outcome: Arc<CopyAhead>,
}

/// What the enqueue of a piece's copy ahead came to: as
/// `AsyncOp::enqueue_slot_copy`'s result (`Err`: the copy was not enqueued;
/// `Ok(Some(_))`: its done write was not), `None` while not tried.
pub(crate) type CopyAhead = Mutex<Option<CopyEnqueued>>;

impl PieceOf {
    /// Whether no later piece uses its slot: it hands the slot back to the pool as an op
    /// of its own would (a read once its copy is enqueued, a write once its job is over),
    /// so that the ring is free as soon as the op is done.
    pub(super) fn last_user_of_its_slot(&self) -> bool {
        // A spare is never handed back by an op: it stays with its stream.
        self.long.spare.is_none() && self.index + self.long.ring.len() >= self.long.pieces
    }

    /// Its entry in the ring.
    pub(super) fn ring_index(&self) -> usize {
        self.index % self.long.ring.len()
    }

    /// At this piece's arm: posts the reads of the next pieces whose slots are free now —
    /// up to `RING_SLOTS - 1` ahead (piece `k`'s slot was last used by piece
    /// `k - RING_SLOTS`, whose copy out of it the stream ran before this piece's
    /// doorbell). Stream order is kept: the whole op was reached with its first piece.
    pub(super) fn read_ahead(&self, engine: &Engine) {
        let long = &self.long;
        let last = (self.index + long.ring.len() - 1).min(long.pieces - 1);
        for next in self.index + 1..=last {
            let taken = long.ahead.lock().unwrap_or_else(|p| p.into_inner())[next].take();
            let Some(op) = taken.and_then(|op| op.upgrade()) else { continue };
            // Read only when a piece waits to read ahead: a fully FIXED op's pieces that
            // were all staged never read the caller's parameters again.
            let Some(bound) = long.bound() else { return };
            if long.moved(&bound) {
                // Each later piece reads (or declines) at its own arm.
                return;
            }
            let Some(io) = long.piece_io(&bound, next) else { return };
            op.post_read_ahead(engine, io);
        }
    }

    /// At this piece's arm: whether the op as bound ends before the piece starts (its
    /// stream does not fix the size, and the caller lowered it after submission): the
    /// piece then moves nothing. `false` when the op's parameters did not bind at all:
    /// the piece's own binding fails it.
    pub(super) fn past_the_bound_end(&self) -> bool {
        let long = &self.long;
        long.bound().is_some_and(|bound| self.index as u64 * long.piece_bytes >= bound.size_bytes())
    }

    /// The piece ended: tell the long op.
    pub(super) fn done(&self, outcome: Outcome) {
        self.long.piece_done(self.index, outcome);
    }

    /// For a write piece whose copy the piece before it enqueued: what that came to
    /// (`None`: this piece enqueues its own copy).
    pub(super) fn copied_ahead(&self) -> Option<CopyEnqueued> {
        let ahead = self.copied_ahead.as_ref()?;
        ahead.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// The next piece's copy was enqueued (`copied`, as `AsyncOp::enqueue_slot_copy`
    /// returns it): its ring entry learns of the use, as at the piece's own enqueue.
    pub(super) fn note_next_copy(&self, next: &NextPieceCopy, copied: CopyEnqueued) {
        match &copied {
            Ok(None) => self.long.note_queued(next.ring_index, next.slot.generation),
            Ok(Some(_)) => self.long.note_lost(next.ring_index),
            Err(_) => {}
        }
        *next.outcome.lock().unwrap_or_else(|p| p.into_inner()) = Some(copied);
    }
}

/// What a piece brings to its op at submission.
pub(crate) struct PieceSlot {
    pub(super) of: PieceOf,
    pub(super) slot: Slot,
    pub(super) slot_use: SlotUse,
    /// The bytes the stream's copy covers ([`super::stream_copy::slot_copy_bytes`]).
    pub(super) copy_bytes: u64,
}

/// What a submission needs besides the op itself: the driver, the engine, the stream and
/// the resolved buffer.
pub(crate) struct Submission<'a> {
    pub(crate) host: Arc<dyn OpHost>,
    pub(crate) engine: &'a Engine,
    pub(crate) state: &'a Arc<StreamState>,
    pub(crate) buffer: &'a ResolvedBuffer,
}

impl Submission<'_> {
    /// Whether ops in `direction` on this stream may go in pieces copied on it
    /// (`HIPFILE_STREAM_COPIES=all`, and for writes `HIPFILE_STREAM_COPY_WRITES` on; stream
    /// memory operations on the device). A stream that does not fix the device range
    /// (buffer offset and size) has its pieces' copies enqueued for the range as
    /// submitted, on the bet that it does not move, as an op of its own takes its slot:
    /// a piece whose bound range differs declines its slot at arm
    /// ([`AsyncOp::declines_slot`]), and one past a shrunk size moves nothing.
    fn may_go_in_pieces(&self, direction: Direction) -> bool {
        let all = self.host.slots().is_some_and(|pool| pool.all_reads())
            && (direction == Direction::Read || self.host.stream_copy_writes());
        let memops = self.host.device().supports_stream_memops(self.buffer.device_ordinal);
        all && memops
    }
}

impl AsyncOp {
    /// Submits `io` as pieces sharing a ring of slots when it is a long op that may
    /// (`HIPFILE_STREAM_COPIES=all`, longer than the pool's piece size, buffer offset and size
    /// FIXED, stream memory operations, a free ring); `None` otherwise (the caller submits
    /// one op). Each piece is enqueued and watched like an op of its own. `Some(Err(_))`
    /// when the first piece could not be enqueued (nothing of the op runs); a later piece
    /// that cannot be enqueued ends the op, after the pieces before it, with the error.
    pub(crate) fn submit_long(
        submit: Submission<'_>,
        submit_lock: &mut SubmitGuard<'_>,
        whole: WholeOp<'_>,
    ) -> Option<Result<(), EnqueueError>> {
        let (direction, _, io, _, _) = whole;
        if !submit.may_go_in_pieces(direction) {
            return None;
        }
        let Submission { host, engine, state, buffer } = submit;
        let pool = host.slots()?;
        let piece_bytes = pool.piece_bytes();
        if io.size_bytes() <= piece_bytes {
            return None;
        }
        let pieces = io.size_bytes().div_ceil(piece_bytes) as usize;
        let (len_bytes, count) = (piece_bytes as usize, pieces.min(RING_SLOTS));
        // Reads' pieces may take slots of device memory; writes' take pinned ones (the
        // engine writes the file from them).
        let ring = match direction {
            Direction::Read => pool.try_take_ring_for_read(len_bytes, count, buffer.device_ordinal),
            Direction::Write => pool.try_take_ring(len_bytes, count),
        }?;
        let submit = Submission { host, engine, state, buffer };
        Some(AsyncOp::submit_pieces(submit, submit_lock, whole, (ring, None), piece_bytes))
    }

    /// For an op that found no slot of its own (`HIPFILE_STREAM_COPIES=all`, buffer offset
    /// and size FIXED, stream memory operations): submits it through its stream's spare
    /// slots ([`super::slots::SpareSlot`], a ring of two) in pieces of [`SPARE_BYTES`],
    /// each read when the stream reaches it or read ahead at the arm of the piece before
    /// it (a write's piece is copied into its slot ahead of its doorbell), so that its
    /// release needs no CUDA call either.
    ///
    /// The ring is the stream's, shared by its ops, each numbering its pieces from 0:
    /// when the stream reaches a piece, every earlier piece of the stream has run its
    /// copy, so the only slot still in use is this piece's, and the piece read ahead (the
    /// op's next) takes the other one. `None` when the op may not or no spare
    /// can be had (the caller submits one op, which takes the engine's path).
    pub(crate) fn submit_through_spare(
        submit: Submission<'_>,
        submit_lock: &mut SubmitGuard<'_>,
        whole: WholeOp<'_>,
    ) -> Option<Result<(), EnqueueError>> {
        if !submit.may_go_in_pieces(whole.0) {
            return None;
        }
        let Submission { host, engine, state, buffer } = submit;
        let pool = host.slots()?;
        let spare = pool.spare_for(state)?;
        let ring = spare.slots.clone();
        let submit = Submission { host: Arc::clone(&host), engine, state, buffer };
        let submitted = AsyncOp::submit_pieces(
            submit,
            submit_lock,
            whole,
            (ring, Some(spare)),
            SPARE_BYTES as u64,
        );
        if submitted.is_ok() {
            host.async_stats().spare_ops.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Some(submitted)
    }

    /// Submits `whole` (direction, parameters, validated range, file, guard) as pieces of
    /// `piece_bytes` sharing `ring` (a ring of the pool, or the stream's spare as a ring of
    /// one).
    fn submit_pieces(
        submit: Submission<'_>,
        submit_lock: &mut SubmitGuard<'_>,
        whole: WholeOp<'_>,
        (ring, spare): (Vec<Slot>, Option<Arc<SpareSlot>>),
        piece_bytes: u64,
    ) -> Result<(), EnqueueError> {
        let Submission { host, engine, state, buffer } = submit;
        let (direction, params, io, file, guard) = whole;
        let pool = host.slots().expect("pieces are submitted with a slot pool");
        let pieces = io.size_bytes().div_ceil(piece_bytes) as usize;
        let long = Arc::new(LongOp {
            host: HostDropGuard(Some(Arc::clone(&host))),
            user: Arc::clone(params),
            direction,
            device_ordinal: buffer.device_ordinal,
            submitted_at: std::time::Instant::now(),
            whole: io,
            flags: state.flags,
            page_size_bytes: host.page_size_bytes(),
            piece_bytes,
            pieces,
            stream: StreamKey::of(state),
            state: Mutex::new(LongState {
                bound: None,
                results: vec![None; pieces],
                ring_uses: vec![RingUse::Unused; ring.len()],
            }),
            ring,
            spare,
            ahead: Mutex::new(vec![None; pieces]),
        });
        let file_len = file.size_bytes().ok();
        // A write piece's copy goes between the doorbell and the wait of the piece before
        // it (`NextPieceCopy`), on a ring of two slots or more.
        let copies_ahead = direction == Direction::Write && long.ring.len() >= 2;
        let mut slots = Vec::with_capacity(long.pieces);
        let mut slot_of = |index: usize| -> Slot {
            while slots.len() <= index {
                let at = slots.len();
                let base = long.ring[at % long.ring.len()];
                slots.push(if long.first_use(at) { base } else { pool.next_use(&base) });
            }
            slots[index]
        };
        let mut copied_ahead = None;
        for index in 0..long.pieces {
            let Some(piece_io) = long.piece_io(&io, index) else {
                // Cannot happen (a piece of a valid op is valid): fail rather than guess.
                let error = Error::new(OpError::InternalError);
                if index == 0 {
                    return Err(EnqueueError { error, nothing_queued: true });
                }
                long.cut_short(index, Outcome::Library(error.code));
                break;
            };
            let first_use = long.first_use(index);
            let slot = slot_of(index);
            let next_io = long.piece_io(&io, index + 1).filter(|_| copies_ahead);
            let copies_next = next_io.map(|next_io| {
                let outcome: Arc<CopyAhead> = Arc::new(Mutex::new(None));
                NextPieceCopy {
                    slot: slot_of(index + 1),
                    source_addr: next_io.device_addr(),
                    copy_bytes: next_io.size_bytes(),
                    ring_index: (index + 1) % long.ring.len(),
                    outcome,
                }
            });
            let next_outcome = copies_next.as_ref().map(|next| Arc::clone(&next.outcome));
            let of = PieceOf {
                long: Arc::clone(&long),
                index,
                copies_next,
                copied_ahead: std::mem::replace(&mut copied_ahead, next_outcome),
            };
            // Only a piece with a slot of its own may be staged before the stream reaches
            // it (later ones reuse a slot an earlier piece's copy reads until then).
            let slot_use = match direction {
                Direction::Write => SlotUse::Write,
                Direction::Read => {
                    let inside = file_len.is_some_and(|len| piece_io.file_end_bytes() <= len);
                    let range = super::prefetch::file_range(&piece_io);
                    let may_prefetch =
                        AsyncOp::prefetchable(host.write_hazards(), state, direction, file, range);
                    if first_use && inside && may_prefetch {
                        SlotUse::StagedRead
                    } else {
                        SlotUse::ReadAtArm
                    }
                }
            };
            let copy_bytes = super::stream_copy::slot_copy_bytes((direction, &piece_io), file_len);
            let piece_params: Arc<dyn ParamSource> =
                Arc::new(PieceParams { long: Arc::clone(&long), index });
            let parts = OpParts {
                direction,
                params: piece_params,
                io: piece_io,
                file: Arc::clone(file),
                guard: guard.share(),
                sequence: submit_lock.next(),
                piece: Some(PieceSlot { of, slot, slot_use, copy_bytes }),
                single: None,
                write_pieces: None,
            };
            let op = AsyncOp::new(Arc::clone(&host), parts, state, buffer, engine.track_async_op());
            if slot_use == SlotUse::ReadAtArm {
                long.ahead.lock().unwrap_or_else(|p| p.into_inner())[index] =
                    Some(Arc::downgrade(&op));
            }
            // Each piece is watched as it is enqueued, like an op of its own (its copy's
            // enqueue comes after: README, Known limits), so earlier pieces may run while
            // later ones are enqueued.
            if let Err(EnqueueError { error, nothing_queued }) = op.enqueue(engine) {
                if nothing_queued {
                    submit_lock.undo();
                }
                if index == 0 {
                    // Nothing of the op runs (the first piece abandoned itself): refused.
                    return Err(EnqueueError { error, nothing_queued });
                }
                // Earlier pieces may be running: the op ends after them, with the error.
                log::error!("a long async op could not enqueue piece {index}: {}", error);
                long.cut_short(index, Outcome::Library(error.code));
                // The earlier piece's arm may have posted this piece's read ahead into a
                // spare slot before the piece was abandoned; that read may still be
                // running when the stream's next op reuses the slot. A pool ring goes
                // back only after its pieces' jobs (the long op's drop); the stream's
                // spares are retired instead (its later ops take the engine's path).
                if let Some(spare) = &long.spare {
                    spare.note_lost(index % long.ring.len());
                }
                break;
            }
        }
        host.async_stats().submitted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}

/// A whole op as submitted: direction, parameters, validated range, file, guard.
pub(crate) type WholeOp<'a> =
    (Direction, &'a Arc<dyn ParamSource>, ValidIo, &'a Arc<FileHandle>, &'a OpGuard);

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = super::super::slots::MAX_SLOT_BYTES as u64;

    #[test]
    fn pieces_combine_like_the_parts_of_a_split_request() {
        let bytes = |n| Some(Outcome::Bytes(n));
        let eio = Some(Outcome::OsError(5));
        assert_eq!(
            combine(&[bytes(P), bytes(P), bytes(100)], 2 * P + 100, P),
            Outcome::Bytes(2 * P + 100)
        );
        assert_eq!(combine(&[bytes(P), bytes(10), bytes(0)], 3 * P, P), Outcome::Bytes(P + 10));
        assert_eq!(combine(&[bytes(P), eio, bytes(P)], 3 * P, P), Outcome::OsError(5));
        assert_eq!(combine(&[bytes(5), bytes(0), eio], 3 * P, P), Outcome::OsError(5));
        assert_eq!(combine(&[eio, bytes(P)], 2 * P, P), Outcome::OsError(5));
        let invalid = Some(Outcome::Library(OpError::InvalidValue));
        assert_eq!(combine(&[invalid, invalid], 2 * P, P), Outcome::Library(OpError::InvalidValue));
    }

    #[test]
    fn smaller_pieces_combine_by_their_own_size() {
        const M: u64 = 1 << 20;
        let bytes = |n| Some(Outcome::Bytes(n));
        // 4 MiB + 4 KiB in pieces of 1 MiB: the last piece is 4 KiB.
        let whole = [bytes(M), bytes(M), bytes(M), bytes(M), bytes(4096)];
        assert_eq!(combine(&whole, 4 * M + 4096, M), Outcome::Bytes(4 * M + 4096));
        // A piece of 1 MiB is full at 1 MiB, not short of 16 MiB.
        let short = [bytes(M), bytes(M / 2), bytes(0)];
        assert_eq!(combine(&short, 3 * M, M), Outcome::Bytes(M + M / 2));
    }
}
