//! Writes copied into their slot on their stream in pieces, each written to the file as
//! soon as the stream has copied it (`HIPFILE_STREAM_WRITE_PIECE_KB`; off by default: on
//! an H100, thirty-first session, 1 and 4 MiB pieces moved 16 MiB writes at 1 / 8 / 16
//! streams by no more than the noise, with 10-25 % less CPU per GiB).
//!
//! A write copied on its stream (`HIPFILE_STREAM_COPIES=all`, `stream_copy`) has the
//! stream copy its source into a pinned slot ahead of its doorbell, and the engine
//! writes the file from the slot once the doorbell rang. Done whole, the two run one
//! after the other: a 16 MiB op copies for about 0.3 ms before its write starts, and
//! the write then reads a slot the copy left in memory, not in the caches. Cut in
//! pieces, the stream copies piece `j` and then rings a doorbell of its own for it;
//! the poller arms that piece like an op, and the engine writes it while the stream
//! copies the next ones. The op's own doorbell rings after its last piece's copy, and
//! its wait-value stands behind that, as for any op: the stream is held once, at the
//! end, until every piece is written and `*bytes_p` holds the whole op's result.
//!
//! Why this keeps the protocol's promises:
//! - **Stream order.** Piece `j`'s doorbell follows its copy on the stream, so the
//!   stream has reached the op and copied that piece when it rings; nothing of the op
//!   is written before.
//! - **No release depends on other work.** The op's release needs its pieces' writes
//!   (host work), each posted once its own doorbell rang, and its own doorbell, which
//!   the stream rings after every copy of the op: as for a write copied whole, no GPU
//!   work after the doorbell and no CUDA call stands between the stream reaching the op
//!   and its release.
//! - **Sequence numbers.** Piece `j` rings `first + j`, the op's own doorbell `first +
//!   pieces - 1` (its sequence): numbers taken in a row under the stream's submit lock,
//!   so the poller's queue stays in order and the release word, stored once with the
//!   op's sequence, still only grows. A piece doorbell has no wait-value: nothing waits
//!   for a piece's release, and none is stored.
//! - **Failure.** Once a piece doorbell is queued its number is never given back (a
//!   later op taking it would be armed by this stale doorbell before its stream reached
//!   it): a submission that fails after that abandons the op (its pieces' arms then do
//!   nothing) and keeps the numbers. A piece's write that fails or comes back short makes
//!   the op's result as for the parts of a split request: the bytes up to the first
//!   short piece, or the first failure.
//!
//! Only writes whose size and offsets are all FIXED (the file range is known when the
//! pieces are posted, before the op's own arm binds it) to files written through the
//! page cache (one job per op there; with an O_DIRECT descriptor the engine splits the
//! op over executors itself), on devices with stream memory operations, and while few
//! arms wait on the stream ([`MAX_PIECE_ARMS_WAITING`]: a piece is two more commands on
//! the stream, and the submit call must not block on a full command queue behind a held
//! stream).

use std::sync::{Arc, OnceLock};

use hipfile_core::{Direction, Outcome, StreamFlags, ValidIo};

use super::stream_copy::SlotUse;
use super::{AsyncOp, OpHost};
use crate::engine::{Completion, IoJob, JobEnd, PartJoiner, Parts};
use crate::file::FileHandle;
use crate::stream::StreamState;

/// Arms (ops and pieces) waiting on a stream past which a write goes whole: pieces add
/// two stream commands each, and CUDA blocks an enqueue behind a held stream once a few
/// hundred are queued (on the H200, 510 ops of a write-value and a wait-value each,
/// `benches/probes/doorbell_probe.c`); 64 keeps what pieces queue well below that.
const MAX_PIECE_ARMS_WAITING: usize = 64;

/// How an op's write goes in pieces.
pub(crate) struct WritePieces {
    /// The sequence number piece 0's doorbell rings (piece `j` rings `first + j`; the
    /// last piece rings the op's own sequence).
    first_sequence: u32,
    piece_bytes: u64,
    count: usize,
    /// The pieces' jobs joined: made when the stream reaches the first piece.
    joiner: OnceLock<Arc<PartJoiner>>,
}

impl WritePieces {
    /// How many pieces of how many bytes a write `io` on `state` goes in (at least two),
    /// or `None` when it goes whole (see the module's text for when it may not).
    pub(super) fn plan(
        host: &dyn OpHost,
        state: &StreamState,
        file: &FileHandle,
        io: &ValidIo,
        slot_use: Option<SlotUse>,
    ) -> Option<(u64, usize)> {
        let piece_bytes = host.stream_write_piece_bytes();
        let fixed = StreamFlags::FIXED_BUF_OFFSET
            | StreamFlags::FIXED_FILE_OFFSET
            | StreamFlags::FIXED_FILE_SIZE;
        let eligible = piece_bytes > 0
            && slot_use == Some(SlotUse::Write)
            && io.size_bytes() > piece_bytes
            && state.flags.contains(fixed)
            && file.direct_fd().is_none();
        if !eligible {
            return None;
        }
        let count = io.size_bytes().div_ceil(piece_bytes) as usize;
        // Each piece is two more commands on the stream (its copy, its doorbell): behind a
        // held stream, CUDA blocks an enqueue once a few hundred are queued, and a submit
        // call must not wait. Past this many arms waiting on the stream, ops go whole.
        let room = state.arm_queue().waiting() + count <= MAX_PIECE_ARMS_WAITING;
        room.then_some((piece_bytes, count))
    }

    pub(super) fn new(first_sequence: u32, (piece_bytes, count): (u64, usize)) -> WritePieces {
        WritePieces { first_sequence, piece_bytes, count, joiner: OnceLock::new() }
    }

    /// Sequence numbers the op takes (one per piece; the last is the op's own).
    pub(super) fn sequences(&self) -> usize {
        self.count
    }

    /// Piece `index` of an op of `size_bytes`: its offset in the op and its length.
    fn piece(&self, size_bytes: u64, index: usize) -> (u64, u64) {
        let offset = index as u64 * self.piece_bytes;
        (offset, self.piece_bytes.min(size_bytes - offset))
    }

    fn joiner(&self, size_bytes: u64) -> &Arc<PartJoiner> {
        self.joiner.get_or_init(|| {
            Arc::new(PartJoiner::new(
                Direction::Write,
                Parts::in_pieces(size_bytes, self.piece_bytes),
            ))
        })
    }
}

impl AsyncOp {
    /// For a write in pieces: enqueues on its stream each piece's copy into the slot, a
    /// doorbell behind every piece but the last, the slot's done write, then the op's own
    /// doorbell and wait-value (`enqueue_doorbell_arm`, which also hands the pieces' arms
    /// to the poller, ahead of the op's). See the module's text for the failures.
    pub(super) fn enqueue_write_pieces(
        self: &Arc<Self>,
        engine: &crate::engine::Engine,
    ) -> Result<(), super::EnqueueError> {
        use crate::error::Error;
        let (Some(pieces), Some(slot)) = (&self.write_pieces, &self.slot) else {
            // Cannot happen (only a write in pieces, which always has its slot, comes
            // here): refuse the submission rather than panic on the caller's thread.
            let error = Error::new(hipfile_core::OpError::InternalError);
            return Err(super::EnqueueError { error, nothing_queued: true });
        };
        let device = self.host.device();
        let handle = self.stream.handle;
        let doorbell = self.stream.arm_queue().doorbell();
        let size_bytes = self.submitted.size_bytes();
        let source = self.submitted.device_addr();
        let mut copies_queued = false;
        let mut doorbells_queued = 0;
        let mut queue = || -> Result<(), crate::device::DeviceError> {
            for index in 0..pieces.count {
                let (offset, len) = pieces.piece(size_bytes, index);
                crate::device::injected_fault(crate::fault::Site::DeviceCopy)?;
                // SAFETY: the slot is pinned memory of the pool that holds the whole op
                // and is not lent again until its done word shows this use; the source
                // range was validated at submission and the piece lies inside it.
                unsafe {
                    device.copy_on_stream(
                        handle,
                        Direction::Write,
                        source + offset,
                        slot.host_ptr.add(offset as usize),
                        len as usize,
                    )?
                };
                copies_queued = true;
                if index + 1 < pieces.count {
                    let sequence = pieces.first_sequence.wrapping_add(index as u32);
                    // SAFETY: the doorbell lives in the driver's word pool as long as the
                    // driver, which the op holds.
                    unsafe { device.stream_write_value32(handle, doorbell.device_addr, sequence)? };
                    doorbells_queued += 1;
                }
            }
            // SAFETY: the done word lives in the pool's slab as long as the driver.
            unsafe {
                device.stream_write_value32(handle, slot.done_word.device_addr, slot.generation)
            }
        };
        if let Err(error) = queue() {
            // A copy into the slot may be queued with no done write after it: never lent
            // again. Unqueued, it stays the op's (given back when the op is dropped).
            if copies_queued {
                self.slot_lost();
                self.slot_phase
                    .store(super::stream_copy::SLOT_LOST, std::sync::atomic::Ordering::SeqCst);
            }
            let nothing_queued = doorbells_queued == 0;
            if !nothing_queued {
                // Doorbells of ours are queued: their numbers are kept, the op ends here.
                self.abandon();
            }
            return Err(super::EnqueueError { error: Error::device(error), nothing_queued });
        }
        self.slot_phase
            .store(super::stream_copy::SLOT_COPY_QUEUED, std::sync::atomic::Ordering::SeqCst);
        self.host.async_stats().stream_copies.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.host.async_stats().writes_in_pieces.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match self.enqueue_doorbell_arm(engine) {
            // The pieces' doorbells are queued: their numbers (and the op's) are kept.
            Err(super::EnqueueError { error, nothing_queued: true }) => {
                self.abandon();
                Err(super::EnqueueError { error, nothing_queued: false })
            }
            other => other,
        }
    }

    /// Hands the arms of the op's pieces (all but the last, which is the op's own arm) to
    /// the poller; called under the submit lock right before the op's own is.
    pub(super) fn watch_write_pieces(
        self: &Arc<Self>,
        poller: &crate::arm::ArmPoller<StreamState>,
    ) {
        let Some(pieces) = &self.write_pieces else { return };
        for index in 0..pieces.count - 1 {
            let op = Arc::clone(self);
            let sequence = pieces.first_sequence.wrapping_add(index as u32);
            poller.watch(&self.stream, sequence, Box::new(move || op.arm_write_piece(index)));
        }
    }

    /// The stream copied piece `index` into the slot: the engine writes it (nothing, for
    /// an op abandoned at submission).
    fn arm_write_piece(self: Arc<Self>, index: usize) {
        if !self.end.is_abandoned() {
            self.post_write_piece(index);
        }
    }

    /// Posts the job that writes piece `index` from the slot, on the stream's executor;
    /// the last piece's job ending completes the op (`publish`). The op's own arm posts
    /// its last piece (`post`).
    pub(super) fn post_write_piece(self: &Arc<Self>, index: usize) {
        let Some(pieces) = &self.write_pieces else { return };
        let joiner = Arc::clone(pieces.joiner(self.submitted.size_bytes()));
        let failed = |op: &AsyncOp, outcome: Outcome| {
            if let Some((outcome, _)) = joiner.part_done(index, outcome, None) {
                op.publish(outcome);
            }
        };
        let engine = match self.host.engine() {
            Ok(engine) => engine,
            Err(error) => return failed(self, Outcome::Library(error.code)),
        };
        let Some(guard) = self.share_guard() else {
            return failed(self, Outcome::Library(hipfile_core::OpError::InternalError));
        };
        let (offset, len) = pieces.piece(self.submitted.size_bytes(), index);
        let op = Arc::clone(self);
        let joined = Arc::clone(&joiner);
        let done: crate::engine::JobDone = Box::new(move |end: JobEnd<'_>| {
            if let Some((outcome, _)) = joined.part_done(index, end.outcome, end.device_error) {
                op.publish(outcome);
            }
        });
        let job = IoJob {
            file: Arc::clone(&self.file),
            guard,
            direction: Direction::Write,
            file_offset_bytes: self.submitted.file_offset_bytes() + offset,
            device_addr: self.submitted.device_addr() + offset,
            len_bytes: len,
            device_ordinal: self.device_ordinal,
            wait_for_copies: true,
            arm_gate: None,
            host_memory: self.write_slot_memory(offset),
            may_start: None,
            done: Completion::new(Arc::clone(self.host.device()), done),
        };
        engine.post(self.stream.executor, job);
    }

    /// The op goes in pieces (its own arm posts only the last).
    pub(super) fn writes_in_pieces(&self) -> Option<usize> {
        self.write_pieces.as_ref().map(|pieces| pieces.count)
    }
}
