//! The asynchronous, stream-ordered op behind `hipFileReadAsync` / `hipFileWriteAsync`
//! (the calls themselves: [`crate::driver`]).
//!
//! # Protocol
//! Submission (the caller's thread; never waits for earlier work of the stream):
//! 1. Checks in hipFile's order: driver open (else 5022, and the driver opens), NULL
//!    pointers (5022), file handle (5027), buffer (5013 / 5011), stream, arguments
//!    (5022, `hipfile_core::validate`), buffer device = stream device (5022).
//! 2. `*bytes_p = 0`. Size 0: done, nothing is enqueued. NULL stream: the I/O runs now
//!    and `*bytes_p` holds the result when the call returns.
//! 3. Under the stream's submit lock: take sequence k; enqueue a **write-value**
//!    "doorbell word = k" and a **wait-value** "release word ≥ k" on the user's stream
//!    ([`submit`]).
//! 4. A read whose size and offsets are all FIXED is posted to the engine at once
//!    (*prefetch*: disk → staging now; copies to the device wait for arm), unless an
//!    unfinished write overlaps its range in the same file or the stream's window or the
//!    driver's prefetch budget is full ([`prefetch`], `stream::PrefetchBudget`).
//!
//! Arm (the driver's arm poller, `crate::arm`, once the doorbell reaches k; O(1), no
//! device calls, never waits for I/O; [`run`]): binds the parameters that are not FIXED
//! through the op's [`ParamSource`], re-validates them (`*bytes_p = -5022` and release
//! when invalid or the size grew), and posts the job to the stream's executor.
//!
//! Without stream memory operations on the device (`Device::supports_stream_memops`),
//! no wait-value is enqueued: the arm host function itself holds the stream until the
//! op has released it (the blocking fallback, [`host_fn`]; correct, slower).
//!
//! Completion (the executor): `*bytes_p` = byte count, `-errno`, or `-code`; then the
//! release word is set to k — device-side after the copies for reads (write-value on the
//! executor's internal stream), host-side for writes and for ops split over several
//! executors. Every path releases the word: a user stream never hangs on us.
//!
//! # State
//! The op's lifecycle is its [`OpMachine`] alone, changed only through
//! [`AsyncOp::set_state`], which asserts legality. Two small hand-offs stay outside it
//! because they must be decided atomically between threads and are model-checked with
//! loom on these very files: [`op_gate`] (who owns the prefetch's channel: the arm or a
//! prefetch starting late) and [`op_end`] (who publishes: exactly one finisher, never for
//! an abandoned submission). The machine never decides either; it records the steps
//! their winners take.

mod host_fn;
mod idle_slots;
mod inline_read;
mod params;
mod pieces;
pub(crate) mod prefetch;
mod run;
mod slots;
mod stream_copy;
mod submit;
mod write_pieces;

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64};
use std::sync::{Arc, Mutex};

use hipfile_core::{Direction, OpEvent, OpMachine, OpState, Outcome, StreamFlags, ValidIo};

use crate::arm::ArmPoller;
use crate::buffer::{BufferUse, ResolvedBuffer};
use crate::device::Device;
use crate::engine::Engine;
use crate::error::Error;
use crate::file::{ChangeStamp, FileHandle, OpGuard};
use crate::stream::StreamState;

pub(crate) use idle_slots::IdleSlotGiver;
pub(crate) use inline_read::InlineReads;
pub use params::{AsyncParams, ParamSource};
pub(crate) use pieces::{PieceSlot, Submission};
pub(crate) use prefetch::{Hazard, WriteHazardTable};
pub(crate) use slots::SlotPool;
pub(crate) use submit::{EnqueueError, OpParts};

/// The prefetch gate of an op (model-checked with loom).
#[path = "../op_gate.rs"]
mod op_gate;

/// How an op ends: published once, or abandoned (model-checked with loom).
#[path = "../op_end.rs"]
mod op_end;

/// The primitives [`op_gate`] and [`op_end`] are written against (loom's in their model
/// tests).
mod sync {
    pub(crate) use std::sync::{Mutex, MutexGuard, atomic};
}

use op_end::OpEnd;
use op_gate::OpGate;

/// What an op needs of the driver that owns it (the driver implements it; the op holds
/// it, which keeps the engine, the arm poller and the word pool alive until it ends).
pub(crate) trait OpHost: Send + Sync + 'static {
    /// The engine (started on first use).
    fn engine(&self) -> Result<&Engine, Error>;
    /// The doorbell arm poller (started on first use).
    fn arm_poller(&self) -> Result<&ArmPoller<StreamState>, Error>;
    /// The device.
    fn device(&self) -> &Arc<dyn Device>;
    /// The host page size.
    fn page_size_bytes(&self) -> u64;
    /// Counters of the async path.
    fn async_stats(&self) -> &AsyncStats;
    /// Unfinished writes per file (the prefetch hazard check).
    fn write_hazards(&self) -> &WriteHazardTable;
    /// Staging slots of reads copied on the user's stream (`None`: not used).
    fn slots(&self) -> Option<&SlotPool>;
    /// `HIPFILE_STREAM_WRITE_PIECE_KB` in bytes (0: off; [`write_pieces`]).
    fn stream_write_piece_bytes(&self) -> u64;
    /// `HIPFILE_STREAM_COPY_WRITES`: whether writes may be copied on their own streams
    /// (off: every write takes the engine's path).
    fn stream_copy_writes(&self) -> bool;
}

/// The slot an op of its own takes at submission, and what for ([`AsyncOp::single_slot`]).
/// The third field is the bytes the stream's copy covers ([`stream_copy::slot_copy_bytes`]).
pub(crate) struct SingleSlot(slots::Slot, stream_copy::SlotUse, u64);

/// Counters of the async path.
#[derive(Debug, Default)]
pub struct AsyncStats {
    /// Ops submitted (size > 0, stream not NULL).
    pub submitted: AtomicU64,
    /// Reads that started before the stream reached them.
    pub prefetched: AtomicU64,
    /// Ops released device-side (write-value after the copies).
    pub device_releases: AtomicU64,
    /// Ops released host-side.
    pub host_releases: AtomicU64,
    /// Prefetched reads read again at arm because a write to their file was submitted
    /// after the prefetch started.
    pub prefetches_redone: AtomicU64,
    /// Of released ops (device-side, or from the host; not the blocking fallback's):
    /// nanoseconds from the arm (the poller saw the stream reach the op) to the release
    /// enqueued or stored, summed (the host's share of a stream's per-op round trip:
    /// reading what was not read ahead, the engine's copies, the release).
    pub arm_to_release_ns: AtomicU64,
    /// Released ops timed in [`AsyncStats::arm_to_release_ns`].
    pub timed_releases: AtomicU64,
    /// Nanoseconds from an op's release enqueued to the arm of the next op of its stream,
    /// summed (the device's share of the round trip: the copy, the release reaching the
    /// stream, the next doorbell, and the poller noticing it; idle time of a stream with
    /// nothing submitted counts too).
    pub release_to_arm_ns: AtomicU64,
    /// Arms timed in [`AsyncStats::release_to_arm_ns`].
    pub timed_arms: AtomicU64,
    /// Of those arms, nanoseconds between the poller's look that found the doorbell and
    /// its look before, summed: the doorbell rang somewhere in that gap (the poller's
    /// sleep or spin, and its scan), so it bounds the poller's share of
    /// [`AsyncStats::release_to_arm_ns`].
    pub arm_look_gap_ns: AtomicU64,
    /// Of those arms, nanoseconds from the look that found the doorbell to the arm
    /// running, summed: the time the arms that look found before it took (the poller runs
    /// them one after another).
    pub arm_behind_look_ns: AtomicU64,
    /// Reads staged ahead into a slot and copied on the user's stream, and writes whose
    /// bytes the user's stream copied into a slot (`slots`).
    pub stream_copies: AtomicU64,
    /// Pieces of long reads copied on their stream (`pieces`) whose read was posted ahead
    /// of their arm, by an earlier piece's arm.
    pub read_ahead: AtomicU64,
    /// Ops that found no slot of their own and went through their stream's spare slot in
    /// pieces (`HIPFILE_STREAM_COPIES=all`; each piece counts in `stream_copies` too).
    pub spare_ops: AtomicU64,
    /// Reads done inside the submit call on an idle stream, only their copy enqueued
    /// (`HIPFILE_INLINE_READ_KB`; each counts in `submitted` too).
    pub read_at_submission: AtomicU64,
    /// Writes copied on their stream in pieces, each piece written to the file once the
    /// stream copied it (`HIPFILE_STREAM_WRITE_PIECE_KB`; each counts in `stream_copies`
    /// too).
    pub writes_in_pieces: AtomicU64,
}

/// Nanoseconds since the first call in this process (the async path's round-trip
/// counters; 0 is never returned, so it can mean "not set").
pub(crate) fn clock_ns() -> u64 {
    static EPOCH: std::sync::LazyLock<std::time::Instant> =
        std::sync::LazyLock::new(std::time::Instant::now);
    u64::try_from(EPOCH.elapsed().as_nanos()).unwrap_or(u64::MAX).max(1)
}

/// One op in flight.
pub(crate) struct AsyncOp {
    host: Arc<dyn OpHost>,
    /// Set when the op is dropped on an executor thread holding the last driver
    /// reference: the driver is then dropped on a helper thread (an executor must not
    /// join itself).
    _host_guard: HostDropGuard,
    direction: Direction,
    /// When the call submitted it (statistics: submission to completion).
    submitted_at: std::time::Instant,
    params: Arc<dyn ParamSource>,
    submitted: ValidIo,
    flags: StreamFlags,
    device_ordinal: u32,
    stream: Arc<StreamState>,
    sequence: u32,
    /// When the poller armed the op ([`clock_ns`]; 0 before).
    armed_at_ns: AtomicU64,
    file: Arc<FileHandle>,
    resources: Mutex<Option<(OpGuard, BufferUse)>>,
    /// The op's state: the only record of where it is.
    machine: Mutex<OpMachine>,
    /// The prefetch's gate: the arm opens it (one message per job of the prefetch).
    gate: OpGate<flume::Sender<bool>>,
    /// Whether this op holds part of its stream's prefetch window (a share of a budget,
    /// given back exactly once by whoever swaps it out: not a state of the op).
    holds_prefetch_window: AtomicBool,
    /// The device lacks stream memory operations: the arm host function blocks until
    /// the op has released its stream instead of the stream waiting on the release word.
    blocking_fallback: bool,
    /// Signalled when the op released its stream host-side (blocking fallback; an
    /// abandoned op releases without publishing, so this is not the machine's state).
    released_signal: (Mutex<bool>, std::sync::Condvar),
    /// A fully FIXED read that the stream's prefetch window did not admit at submission:
    /// it is queued on the stream and starts prefetching (a staged slot read: reading
    /// into its slot) when the window has room, unless the stream reaches it first.
    wants_deferred_prefetch: bool,
    /// Our write count of the file when the prefetch started (see [`prefetch`]).
    prefetch_generation: AtomicU64,
    /// The file's change stamp when the prefetch started.
    prefetch_stamp: Mutex<Option<ChangeStamp>>,
    hazard: Hazard,
    /// The op's staging slot: its bytes are copied on the user's own stream
    /// ([`stream_copy`]).
    slot: Option<slots::Slot>,
    /// What the slot serves (`Some` with a slot).
    slot_use: Option<stream_copy::SlotUse>,
    /// The slot's device range is the one submitted, which the stream's flags do not
    /// fix: the op declines the slot at arm if the bound one differs.
    slot_range_may_change: bool,
    /// The op declined its slot at arm (`stream_copy`): the engine's path moved it.
    slot_declined: AtomicBool,
    /// The stream's copy out of the slot could not be enqueued (after the op was
    /// watched): the op ends with hipFileHipDriverError.
    slot_copy_failed: AtomicBool,
    /// The bytes the stream's copy between the slot and the device range covers (from
    /// the start of the op), decided with the slot, before anything of the op is enqueued
    /// ([`stream_copy::slot_copy_bytes`]).
    slot_copy_bytes: u64,
    /// The long op this op is a piece of ([`pieces`]): its slot belongs to the long op's
    /// ring, its result goes to the long op.
    piece: Option<pieces::PieceOf>,
    /// Whether the slot is still the op's to give back (`stream_copy::SLOT_HELD`) or
    /// handed to the pool.
    slot_phase: AtomicU8,
    /// Which of the slot read's two finishers arrived (`stream_copy`: staged, armed): a
    /// hand-off between the executor and the poller, like `op_end`, not a state.
    slot_flow: AtomicU8,
    /// What the slot read's engine job ended with.
    slot_outcome: Mutex<Option<Outcome>>,
    /// A write copied into its slot in pieces, each written once its copy ran
    /// ([`write_pieces`]).
    write_pieces: Option<write_pieces::WritePieces>,
    end: OpEnd,
    /// Counts the op among the engine's live async ops (caller-thread copies take the
    /// path no held stream can stall while any is alive).
    _alive: crate::engine::AsyncOpTicket,
}

impl AsyncOp {
    pub(crate) fn new(
        host: Arc<dyn OpHost>,
        parts: OpParts,
        state: &Arc<StreamState>,
        buffer: &ResolvedBuffer,
        alive: crate::engine::AsyncOpTicket,
    ) -> Arc<AsyncOp> {
        let range = prefetch::file_range(&parts.io);
        let hazards = host.write_hazards();
        let blocking_fallback = !host.device().supports_stream_memops(buffer.device_ordinal);
        // A read copied on its own stream stages into its slot, not the arenas: the
        // slots, not the prefetch window, bound what such reads hold. With
        // `HIPFILE_STREAM_COPIES=on`, small ones only on a stream whose earlier ops are
        // all released (the op's predecessor released the word): there it shortens the
        // op's round trip; behind ops in flight the engine's path moves more of them per
        // second (README, Measured). With `all`, every op of up to 16 MiB whose device
        // range is FIXED, so that its release needs no CUDA call (`stream_copy`): reads
        // inside the file are staged now, other reads when the stream reaches them, and
        // writes have the stream copy their source into the slot before the op's
        // doorbell.
        let size_bytes = parts.io.size_bytes();
        let (slot, slot_use, piece, slot_copy_bytes) = match (parts.piece, parts.single) {
            // A piece of a long op: its slot and use were decided with the whole op.
            (Some(pieces::PieceSlot { of, slot, slot_use, copy_bytes }), _) => {
                (Some(slot), Some(slot_use), Some(of), copy_bytes)
            }
            (None, Some(SingleSlot(slot, slot_use, copy_bytes))) => {
                (Some(slot), Some(slot_use), None, copy_bytes)
            }
            (None, None) => (None, None, None, size_bytes),
        };
        // Whether the op may read ahead of its stream. With a slot, that was decided when
        // the slot was chosen: only a staged read does (the prefetch check is not run
        // again, so a write of another stream submitted since cannot contradict it).
        let eligible = match slot_use {
            Some(slot_use) => slot_use == stream_copy::SlotUse::StagedRead,
            None => AsyncOp::prefetchable(hazards, state, parts.direction, &parts.file, range),
        };
        // A read staged into a slot of its own reads ahead within the stream's window and
        // the driver's read-ahead budget like the engine's prefetch: past them it waits
        // on the stream (started when the window has room, or read when the stream
        // reaches it), so the engine works on the reads the streams need first instead
        // of on every read in flight at once. A long op's pieces read ahead by their ring.
        let reads_ahead = slot.is_none()
            || (slot_use == Some(stream_copy::SlotUse::StagedRead) && piece.is_none());
        // A slot shared with an earlier read of the stream waits for that read's copy out
        // of it: never read at submission (the deferred start checks the copy ran).
        let shared = slot.is_some_and(|slot| slot.is_shared());
        let prefetch =
            reads_ahead && eligible && !shared && state.admit_prefetch(parts.io.size_bytes());
        let hazard = match parts.direction {
            Direction::Write => {
                prefetch::note_write(&parts.file);
                hazards.add(&parts.file, range)
            }
            Direction::Read => Hazard::None,
        };
        Arc::new(AsyncOp {
            _host_guard: HostDropGuard(Some(Arc::clone(&host))),
            host,
            direction: parts.direction,
            submitted_at: std::time::Instant::now(),
            params: parts.params,
            submitted: parts.io,
            flags: state.flags,
            device_ordinal: buffer.device_ordinal,
            stream: Arc::clone(state),
            sequence: parts.sequence,
            armed_at_ns: AtomicU64::new(0),
            file: parts.file,
            resources: Mutex::new(Some((parts.guard, buffer.begin_use()))),
            machine: Mutex::new(OpMachine::new(parts.io.size_bytes(), eligible)),
            gate: OpGate::default(),
            holds_prefetch_window: AtomicBool::new(prefetch),
            blocking_fallback,
            released_signal: (Mutex::new(false), std::sync::Condvar::new()),
            wants_deferred_prefetch: eligible && !prefetch && reads_ahead,
            prefetch_generation: AtomicU64::new(0),
            prefetch_stamp: Mutex::new(None),
            hazard,
            slot_range_may_change: slot.is_some()
                && !state
                    .flags
                    .contains(StreamFlags::FIXED_BUF_OFFSET | StreamFlags::FIXED_FILE_SIZE),
            slot_declined: AtomicBool::new(false),
            slot_copy_failed: AtomicBool::new(false),
            slot_copy_bytes,
            slot,
            slot_use,
            piece,
            slot_phase: AtomicU8::new(stream_copy::SLOT_HELD),
            slot_flow: AtomicU8::new(0),
            slot_outcome: Mutex::new(None),
            write_pieces: parts.write_pieces,
            end: OpEnd::default(),
            _alive: alive,
        })
    }

    /// The slot an op of its own takes, and what for (see the op's `new`): `None` when it
    /// takes none (the mode does not copy on user streams, it does not qualify, or no
    /// slot of its size is free).
    pub(crate) fn single_slot(
        host: &dyn OpHost,
        state: &StreamState,
        buffer: &ResolvedBuffer,
        whole: (Direction, &ValidIo, &Arc<FileHandle>, u32),
    ) -> Option<SingleSlot> {
        // Nothing to look up when the mode copies on no user stream (the default).
        host.slots()?;
        let (direction, io, file, sequence) = whole;
        let range = prefetch::file_range(io);
        let eligible = AsyncOp::prefetchable(host.write_hazards(), state, direction, file, range);
        let blocking_fallback = !host.device().supports_stream_memops(buffer.device_ordinal);
        let whole = (direction, io, file, sequence);
        AsyncOp::wants_slot(host, blocking_fallback, eligible, state, buffer.device_ordinal, whole)
            .map(|(slot, slot_use, copy_bytes)| SingleSlot(slot, slot_use, copy_bytes))
    }

    /// Whether a read may start before its stream reaches it: its size and offsets are all
    /// FIXED, no unfinished write of ours overlaps its range, and read-ahead is not off
    /// (`HIPFILE_PREFETCH_MB=0`, which also keeps reads copied on their stream from being
    /// staged at submission: they are read when the stream reaches them).
    pub(super) fn prefetchable(
        hazards: &WriteHazardTable,
        state: &StreamState,
        direction: Direction,
        file: &Arc<FileHandle>,
        range: hipfile_core::FileRange,
    ) -> bool {
        direction == Direction::Read
            && state.flags.all_fixed()
            && !state.prefetch_off()
            && hazards.may_prefetch(file, range)
    }

    fn machine(&self) -> std::sync::MutexGuard<'_, OpMachine> {
        self.machine.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The one place where the op's state changes: applies `event`, traces the change,
    /// and treats an illegal transition as the bug it is (a panic in debug builds and
    /// tests; in release builds it is logged and the state stays as it was).
    fn set_state(&self, event: OpEvent) -> OpState {
        let mut machine = self.machine();
        let before = machine.state();
        match machine.step(event) {
            Ok(after) => {
                log::trace!("async op {}: {before:?} --{event:?}--> {after:?}", self.sequence);
                after
            }
            Err(illegal) => {
                log::error!("async op {}: illegal transition {illegal:?}", self.sequence);
                before
            }
        }
    }
}

impl Drop for AsyncOp {
    /// An op dropped before publishing (a panic, a lost job) still publishes -5030 and
    /// releases the stream.
    fn drop(&mut self) {
        if self.end.unfinished() && self.end.claim_publish() {
            self.set_state(OpEvent::Abort);
            let aborted = Outcome::Library(hipfile_core::OpError::InternalError);
            // A slot read's stream copies the slot: it must hold the destination's bytes.
            self.keep_destination_past(aborted);
            self.store_and_release(aborted);
            self.release_host();
        }
        if let Some(slot) = &self.slot {
            match self.slot_phase.load(std::sync::atomic::Ordering::SeqCst) {
                stream_copy::SLOT_HELD => self.slot_unused(slot),
                // A write's slot, read by its job (which held the op): lent again once
                // the stream's copy into it shows done (a piece's by the last piece that
                // uses it; its ring noted the earlier uses).
                stream_copy::SLOT_COPY_QUEUED
                    if self.direction == Direction::Write
                        && self.piece.as_ref().is_none_or(|p| p.last_user_of_its_slot()) =>
                {
                    self.slot_retired(slot)
                }
                _ => {}
            }
        }
    }
}

/// Holds the driver and, when it is the last reference and the op is dropped on an
/// executor thread, drops it on a helper thread: dropping the driver stops the engine,
/// which joins the executors, and an executor cannot join itself.
struct HostDropGuard(Option<Arc<dyn OpHost>>);

impl Drop for HostDropGuard {
    fn drop(&mut self) {
        let Some(host) = self.0.take() else { return };
        if crate::executor_thread::on_executor_thread() && Arc::strong_count(&host) == 1 {
            let _ = std::thread::Builder::new()
                .name("hipfile-driver-drop".into())
                .spawn(move || drop(host));
        }
    }
}
