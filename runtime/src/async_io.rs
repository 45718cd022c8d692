//! The asynchronous, stream-ordered API: `hipFileReadAsync`, `hipFileWriteAsync`,
//! `hipFileStreamRegister`, `hipFileStreamDeregister`.
//!
//! # Protocol
//! Submission (the caller's thread; never waits for earlier work of the stream):
//! 1. Checks in hipFile's order: driver open (else 5022, and the driver opens), NULL
//!    pointers (5022), file handle (5027), buffer (5013 / 5011), stream, arguments
//!    (5022, `hipfile_core::validate`), buffer device = stream device (5022).
//! 2. `*bytes_p = 0`. Size 0: done, nothing is enqueued. NULL stream: the I/O runs now
//!    and `*bytes_p` holds the result when the call returns.
//! 3. Under the stream's submit lock: take sequence k; enqueue a **write-value**
//!    "doorbell word = k" and a **wait-value** "release word ≥ k" on the user's stream.
//! 4. A read whose size and offsets are all FIXED is posted to the engine at once
//!    (*prefetch*: disk → staging now; copies to the device wait for arm), unless an
//!    unfinished write overlaps its range in the same file or the stream's window or the
//!    driver's prefetch budget is full (`stream::PrefetchBudget`).
//!
//! Arm (the driver's arm poller, `crate::arm`, once the doorbell reaches k; O(1), no
//! device calls, never waits for I/O): binds
//! the parameters that are not FIXED, re-validates them (`*bytes_p = -5022` and release
//! when invalid or the size grew), and posts the job to the stream's executor.
//!
//! Without stream memory operations on the device (`Device::supports_stream_memops`),
//! no wait-value is enqueued: the arm host function itself holds the stream until the
//! op has published (the blocking fallback; correct, slower).
//!
//! Example: `runtime/examples/async_read.rs` (safe form, any backend).
//!
//! Completion (the executor): `*bytes_p` = byte count, `-errno`, or `-code`; then the
//! release word is set to k — device-side after the copies for reads (write-value on the
//! executor's internal stream), host-side for writes and for ops split over several
//! executors. Every path releases the word: a user stream never hangs on us.

use std::collections::HashMap;
use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicIsize, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use hipfile_core::{
    Direction, FileRange, OpError, OpEvent, OpMachine, Outcome, PrefetchVerdict, RawIo,
    StreamFlags, ValidIo, WriteHazards, revalidate, validate,
};

use crate::device::{DeviceError, StreamHandle, WriteThenWaitError};
use crate::driver::{BufferUse, Driver, HandleId, ResolvedBuffer};
use crate::engine::{Completion, Engine, IoJob, JobEnd, PartJoiner};
use crate::error::Error;
use crate::file::{ChangeStamp, FileHandle, OpGuard};
use crate::stream::{DeferredStart, StreamState};

/// The prefetch gate of an op (model-checked with loom).
#[path = "op_gate.rs"]
mod op_gate;

/// How an op ends: published once, or abandoned (model-checked with loom).
#[path = "op_end.rs"]
mod op_end;

/// The primitives [`op_gate`] and [`op_end`] are written against (loom's in their model
/// tests).
mod sync {
    pub(crate) use std::sync::{Mutex, MutexGuard, atomic};
}

use op_end::OpEnd;
use op_gate::OpGate;

/// Unfinished writes tracked per file for the prefetch hazard check.
pub(crate) const WRITE_HAZARDS_PER_FILE: usize = 64;

/// The parameter pointers of one async call, as the C API passes them.
#[derive(Clone, Copy, Debug)]
pub struct AsyncArgs {
    /// `size_t *size_p`.
    pub size_p: *const usize,
    /// `hoff_t *file_offset_p`.
    pub file_offset_p: *const i64,
    /// `hoff_t *buffer_offset_p`.
    pub buffer_offset_p: *const i64,
    /// `ssize_t *bytes_p`: receives 0 at submission and the result at completion.
    pub bytes_p: *mut isize,
}

impl AsyncArgs {
    fn any_null(&self) -> bool {
        self.size_p.is_null()
            || self.file_offset_p.is_null()
            || self.buffer_offset_p.is_null()
            || self.bytes_p.is_null()
    }

    /// Reads the three parameters.
    ///
    /// # Safety
    /// The pointers are valid for reads (the caller's contract).
    unsafe fn read(&self) -> RawIo {
        // SAFETY: guaranteed by the caller; volatile because another thread (the user)
        // may change them until the op binds them.
        unsafe {
            RawIo {
                size_bytes: self.size_p.read_volatile() as u64,
                file_offset_bytes: self.file_offset_p.read_volatile(),
                buffer_offset_bytes: self.buffer_offset_p.read_volatile(),
            }
        }
    }
}

/// Parameters of an async op owned by the caller through an `Arc`, for the safe API:
/// the op keeps them alive until it has published its result in `bytes_done`.
#[derive(Debug, Default)]
pub struct AsyncParams {
    /// Bytes to move (read when the op binds, unless the stream fixes it).
    pub size_bytes: AtomicUsize,
    /// File offset.
    pub file_offset_bytes: AtomicI64,
    /// Offset inside the buffer.
    pub buffer_offset_bytes: AtomicI64,
    /// 0 at submission; the byte count, `-errno` or `-code` once the stream passes the op.
    pub bytes_done: AtomicIsize,
}

impl AsyncParams {
    /// Parameters for `size_bytes` at `file_offset_bytes`, buffer offset 0.
    pub fn new(size_bytes: usize, file_offset_bytes: i64) -> Arc<AsyncParams> {
        Arc::new(AsyncParams {
            size_bytes: AtomicUsize::new(size_bytes),
            file_offset_bytes: AtomicI64::new(file_offset_bytes),
            buffer_offset_bytes: AtomicI64::new(0),
            bytes_done: AtomicIsize::new(0),
        })
    }

    fn args(&self) -> AsyncArgs {
        AsyncArgs {
            size_p: self.size_bytes.as_ptr(),
            file_offset_p: self.file_offset_bytes.as_ptr(),
            buffer_offset_p: self.buffer_offset_bytes.as_ptr(),
            bytes_p: self.bytes_done.as_ptr(),
        }
    }
}

/// Per-file unfinished writes.
#[derive(Default)]
pub(crate) struct FileHazards {
    writes: WriteHazards<WRITE_HAZARDS_PER_FILE>,
    overflowed: usize,
}

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
}

/// One op in flight.
struct AsyncOp {
    driver: Arc<Driver>,
    /// Set when the op is dropped on an executor thread holding the last driver
    /// reference: the driver is then dropped on a helper thread (an executor must not
    /// join itself).
    _driver_guard: DriverDropGuard,
    direction: Direction,
    /// When the call submitted it (statistics: submission to completion).
    submitted_at: std::time::Instant,
    args: AsyncArgs,
    _keepalive: Option<Arc<AsyncParams>>,
    submitted: ValidIo,
    flags: StreamFlags,
    device_ordinal: u32,
    stream: Arc<StreamState>,
    sequence: u32,
    file: Arc<FileHandle>,
    resources: Mutex<Option<(OpGuard, BufferUse)>>,
    machine: Mutex<OpMachine>,
    /// The prefetch's gate: the arm opens it (one message per job of the prefetch).
    gate: OpGate<flume::Sender<bool>>,
    /// Whether this op holds part of its stream's prefetch window.
    holds_prefetch_window: AtomicBool,
    /// The device lacks stream memory operations: the arm host function blocks until
    /// the op has published instead of the stream waiting on the release word.
    blocking_fallback: bool,
    /// Signalled when the op has published (for the blocking fallback).
    published_signal: (Mutex<bool>, std::sync::Condvar),
    /// A fully FIXED read that the stream's prefetch window did not admit at submission:
    /// it is queued on the stream and starts prefetching when the window has room.
    wants_deferred_prefetch: bool,
    prefetch_generation: AtomicU64,
    /// The file's change stamp when the prefetch started (see [`AsyncOp::arm`]).
    prefetch_stamp: Mutex<Option<ChangeStamp>>,
    prefetch_cancelled: AtomicBool,
    hazard: Hazard,
    end: OpEnd,
    /// Counts the op among the engine's live async ops (caller-thread copies take the
    /// path no held stream can stall while any is alive).
    _alive: crate::engine::AsyncOpTicket,
}

// SAFETY: the raw parameter pointers are the C caller's, who guarantees (hipFile's
// contract) that they stay valid until the op has bound and published; they are only
// read/written with volatile accesses from whichever thread runs the op's steps.
unsafe impl Send for AsyncOp {}
// SAFETY: as above; all other fields are Sync.
unsafe impl Sync for AsyncOp {}

static NEXT_HAZARD_ID: AtomicU64 = AtomicU64::new(1);

/// Buckets of per-file write counts (see [`Driver::note_write`]).
const WRITE_GENERATION_BUCKETS: usize = 256;
static WRITE_GENERATIONS: [AtomicU64; WRITE_GENERATION_BUCKETS] =
    [const { AtomicU64::new(0) }; WRITE_GENERATION_BUCKETS];

fn write_generation_bucket(file: &Arc<FileHandle>) -> &'static AtomicU64 {
    let address = Arc::as_ptr(file) as usize;
    &WRITE_GENERATIONS[(address >> 6) % WRITE_GENERATION_BUCKETS]
}

impl Driver {
    /// `hipFileStreamRegister`: see [`crate::stream`]. Needs no open driver.
    ///
    /// # Errors
    /// Already registered or unknown flag bits → `InvalidValue`; the device cannot tell
    /// the stream's device → `HipDriverError`.
    pub fn stream_register(&self, stream: StreamHandle, flags: u32) -> Result<(), Error> {
        self.streams().register(&**self.device(), stream, flags)
    }

    /// `hipFileStreamDeregister`. Ops in flight on the stream complete normally.
    ///
    /// # Errors
    /// Not registered → `InvalidValue`.
    pub fn stream_deregister(&self, stream: StreamHandle) -> Result<(), Error> {
        self.streams().deregister(stream)
    }

    /// `hipFileReadAsync`.
    ///
    /// # Errors
    /// See the module docs for the checks and their order.
    ///
    /// # Safety
    /// The pointers in `args` are valid; the parameter pointers not covered by a FIXED
    /// flag stay valid until the stream reaches the op, and `bytes_p` until it has passed
    /// it; `buffer_base` stays allocated until then.
    pub unsafe fn read_async(
        self: &Arc<Self>,
        handle: HandleId,
        buffer_base: u64,
        args: AsyncArgs,
        stream: StreamHandle,
    ) -> Result<(), Error> {
        // SAFETY: forwarded contract.
        unsafe { self.submit(Direction::Read, handle, buffer_base, args, None, stream) }
    }

    /// `hipFileWriteAsync`.
    ///
    /// # Errors
    /// As [`Driver::read_async`].
    ///
    /// # Safety
    /// As [`Driver::read_async`].
    pub unsafe fn write_async(
        self: &Arc<Self>,
        handle: HandleId,
        buffer_base: u64,
        args: AsyncArgs,
        stream: StreamHandle,
    ) -> Result<(), Error> {
        // SAFETY: forwarded contract.
        unsafe { self.submit(Direction::Write, handle, buffer_base, args, None, stream) }
    }

    /// Safe form of [`Driver::read_async`] / [`Driver::write_async`]: the op keeps
    /// `params` alive until it has published `params.bytes_done`. The device buffer
    /// must stay allocated until the stream has passed the op, as for any GPU work.
    ///
    /// # Errors
    /// As [`Driver::read_async`].
    pub fn submit_async(
        self: &Arc<Self>,
        direction: Direction,
        handle: HandleId,
        buffer_base: u64,
        params: &Arc<AsyncParams>,
        stream: StreamHandle,
    ) -> Result<(), Error> {
        let args = params.args();
        // SAFETY: the pointers point into `params`, which the op keeps alive.
        unsafe {
            self.submit(direction, handle, buffer_base, args, Some(Arc::clone(params)), stream)
        }
    }

    /// # Safety
    /// As [`Driver::read_async`].
    unsafe fn submit(
        self: &Arc<Self>,
        direction: Direction,
        handle: HandleId,
        buffer_base: u64,
        args: AsyncArgs,
        keepalive: Option<Arc<AsyncParams>>,
        stream: StreamHandle,
    ) -> Result<(), Error> {
        if !self.is_open() {
            self.ensure_open();
            return Err(Error::new(OpError::InvalidValue));
        }
        if buffer_base == 0 || args.any_null() {
            return Err(Error::new(OpError::InvalidValue));
        }
        let file = self.file(handle)?;
        let buffer = self.resolve_buffer(buffer_base)?;
        let state = self.streams().lookup(&**self.device(), stream)?;
        // SAFETY: the caller's contract: the pointers are valid now.
        let raw = unsafe { args.read() };
        let io = validate(raw, buffer.span, state.flags, self.page_size_bytes())?;
        if buffer.device_ordinal != state.device_ordinal {
            return Err(Error::new(OpError::InvalidValue));
        }
        if io.is_empty() || stream == StreamHandle::NULL {
            // SAFETY: valid per the contract.
            unsafe { args.bytes_p.write_volatile(0) };
            if io.is_empty() {
                return Ok(());
            }
            return self.run_on_null_stream(direction, file, &buffer, &io, args);
        }
        // Every check that can refuse the submission comes before `*bytes_p = 0`: a
        // refused submission leaves it untouched (a deregistration racing with us makes
        // `begin_op` refuse).
        let engine = self.engine()?;
        let guard = file.begin_op()?;
        let mut submit_lock = state.lock_submit();
        // SAFETY: valid per the contract.
        let bytes_before = unsafe { args.bytes_p.read_volatile() };
        // Before the enqueue: once enqueued, the op may publish at any time.
        // SAFETY: valid per the contract.
        unsafe { args.bytes_p.write_volatile(0) };
        let sequence = submit_lock.next();
        let parts = OpParts { direction, args, keepalive, io, file, guard, sequence };
        let op = AsyncOp::new(self, parts, &state, &buffer, engine.track_async_op());
        let Err(EnqueueError { error, nothing_queued }) = op.enqueue(engine) else {
            return Ok(());
        };
        if nothing_queued {
            submit_lock.undo();
        }
        // The op was abandoned before its arm could run (`enqueue_doorbell_arm`), so
        // nothing of ours writes `*bytes_p` any more: a refused submission leaves it as
        // it was.
        // SAFETY: valid per the contract.
        unsafe { args.bytes_p.write_volatile(bytes_before) };
        Err(error)
    }

    /// NULL stream: synchronous, after the NULL stream's earlier work.
    fn run_on_null_stream(
        &self,
        direction: Direction,
        file: Arc<FileHandle>,
        buffer: &ResolvedBuffer,
        io: &ValidIo,
        args: AsyncArgs,
    ) -> Result<(), Error> {
        self.device().synchronize_stream(StreamHandle::NULL).map_err(Error::device)?;
        let (outcome, _) = self.move_now(direction, file, io, buffer)?;
        // SAFETY: valid per the contract of the caller.
        unsafe { args.bytes_p.write_volatile(bytes_p_value(outcome) as isize) };
        Ok(())
    }

    /// Records an unfinished write; when the table is full, prefetch on this file is off
    /// until the overflowing writes finish.
    fn add_write_hazard(&self, file: &Arc<FileHandle>, range: FileRange) -> Hazard {
        let id = NEXT_HAZARD_ID.fetch_add(1, Ordering::Relaxed);
        let mut hazards = self.hazards();
        let entry = hazards.entry(Arc::as_ptr(file) as usize).or_default();
        match entry.writes.insert(id, range) {
            Ok(()) => Hazard::Tracked(id),
            Err(_) => {
                entry.overflowed += 1;
                Hazard::Overflowed
            }
        }
    }

    fn remove_write_hazard(&self, file: &Arc<FileHandle>, hazard: Hazard) {
        let key = Arc::as_ptr(file) as usize;
        let mut hazards = self.hazards();
        if let Some(entry) = hazards.get_mut(&key) {
            match hazard {
                Hazard::None => return,
                Hazard::Tracked(id) => {
                    entry.writes.remove(id);
                }
                Hazard::Overflowed => entry.overflowed = entry.overflowed.saturating_sub(1),
            }
            if entry.writes.is_empty() && entry.overflowed == 0 {
                hazards.remove(&key);
            }
        }
    }

    /// Counts a write submitted to `file` (async or sync): prefetched reads compare the
    /// count at arm with the count when they started.
    pub(crate) fn note_write(&self, file: &Arc<FileHandle>) {
        write_generation_bucket(file).fetch_add(1, Ordering::SeqCst);
    }

    /// The write count of `file` (shared by files hashing to the same bucket, which
    /// only makes a prefetch redo more often, never less).
    pub(crate) fn write_generation(&self, file: &Arc<FileHandle>) -> u64 {
        write_generation_bucket(file).load(Ordering::SeqCst)
    }

    fn may_prefetch(&self, file: &Arc<FileHandle>, range: FileRange) -> bool {
        match self.hazards().get(&(Arc::as_ptr(file) as usize)) {
            None => true,
            Some(entry) => {
                entry.overflowed == 0 && entry.writes.may_prefetch(&range) == PrefetchVerdict::Clear
            }
        }
    }

    fn hazards(&self) -> std::sync::MutexGuard<'_, HashMap<usize, FileHazards>> {
        self.hazard_table().lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// `*bytes_p` for an outcome.
fn bytes_p_value(outcome: Outcome) -> i64 {
    outcome.bytes_p_value()
}

fn file_range(io: &ValidIo) -> FileRange {
    FileRange { start_bytes: io.file_offset_bytes(), end_bytes: io.file_end_bytes() }
}

/// A write's entry in its file's hazard table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hazard {
    /// Not a write.
    None,
    /// Recorded under this id.
    Tracked(u64),
    /// The table was full: counted only.
    Overflowed,
}

/// What one submission consists of.
struct OpParts {
    direction: Direction,
    args: AsyncArgs,
    keepalive: Option<Arc<AsyncParams>>,
    io: ValidIo,
    file: Arc<FileHandle>,
    guard: OpGuard,
    sequence: u32,
}

/// A failed enqueue; `nothing_queued` when the stream holds nothing of the op.
struct EnqueueError {
    error: Error,
    nothing_queued: bool,
}

impl AsyncOp {
    fn new(
        driver: &Arc<Driver>,
        parts: OpParts,
        state: &Arc<StreamState>,
        buffer: &ResolvedBuffer,
        alive: crate::engine::AsyncOpTicket,
    ) -> Arc<AsyncOp> {
        let range = file_range(&parts.io);
        let eligible = parts.direction == Direction::Read
            && state.flags.all_fixed()
            && driver.may_prefetch(&parts.file, range);
        let prefetch = eligible && state.admit_prefetch(parts.io.size_bytes());
        let hazard = match parts.direction {
            Direction::Write => {
                driver.note_write(&parts.file);
                driver.add_write_hazard(&parts.file, range)
            }
            Direction::Read => Hazard::None,
        };
        Arc::new(AsyncOp {
            driver: Arc::clone(driver),
            _driver_guard: DriverDropGuard(Some(Arc::clone(driver))),
            direction: parts.direction,
            submitted_at: std::time::Instant::now(),
            args: parts.args,
            _keepalive: parts.keepalive,
            submitted: parts.io,
            flags: state.flags,
            device_ordinal: buffer.device_ordinal,
            stream: Arc::clone(state),
            sequence: parts.sequence,
            file: parts.file,
            resources: Mutex::new(Some((parts.guard, buffer.begin_use()))),
            machine: Mutex::new(OpMachine::new(parts.io.size_bytes(), eligible)),
            gate: OpGate::default(),
            holds_prefetch_window: AtomicBool::new(prefetch),
            blocking_fallback: !driver.device().supports_stream_memops(buffer.device_ordinal),
            published_signal: (Mutex::new(false), std::sync::Condvar::new()),
            wants_deferred_prefetch: eligible && !prefetch,
            prefetch_generation: AtomicU64::new(0),
            prefetch_stamp: Mutex::new(None),
            prefetch_cancelled: AtomicBool::new(false),
            hazard,
            end: OpEnd::default(),
            _alive: alive,
        })
    }

    fn machine(&self) -> std::sync::MutexGuard<'_, OpMachine> {
        self.machine.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Enqueues the arm and the wait-value on the user's stream (the caller holds the
    /// stream's submit lock) and starts a prefetch when allowed.
    fn enqueue(self: &Arc<Self>, engine: &Engine) -> Result<(), EnqueueError> {
        // The prefetch gate goes in place before the arm is enqueued (the arm may run at
        // any moment and must find it); the prefetch job is posted once the enqueue
        // succeeded (a gate opened early is buffered in the channel).
        let admitted = self.holds_prefetch_window.load(Ordering::SeqCst);
        let prefetch_gate = if admitted { self.start_prefetch(engine) } else { None };
        let queued = if self.blocking_fallback {
            self.enqueue_host_function_arm()
        } else {
            self.enqueue_doorbell_arm()
        };
        if let Err(error) = queued {
            if error.nothing_queued {
                self.abandon();
            }
            return Err(error);
        }
        self.driver.async_stats().submitted.fetch_add(1, Ordering::Relaxed);
        if let Some(receiver) = prefetch_gate {
            self.driver.async_stats().prefetched.fetch_add(1, Ordering::Relaxed);
            self.post(engine, self.submitted, Some(receiver));
        }
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
    fn enqueue_doorbell_arm(self: &Arc<Self>) -> Result<(), EnqueueError> {
        let nothing_queued = |error| EnqueueError { error, nothing_queued: true };
        let poller = self.driver.arm_poller().map_err(nothing_queued)?;
        let device = self.driver.device();
        let doorbell = self.stream.arm_queue().doorbell();
        let word = self.stream.word();
        // SAFETY: the doorbell and release words live in the driver's word pool as long
        // as the driver, which outlives every op (ops hold an Arc of it).
        let queued = unsafe {
            device.stream_write_then_wait_value32(
                self.stream.handle,
                doorbell.device_addr,
                self.sequence,
                word.device_addr,
                self.sequence,
            )
        };
        let wait_failed = match queued.and_then(|()| injected_wait_failure()) {
            Ok(()) => None,
            Err(WriteThenWaitError::NothingQueued(error)) => {
                return Err(nothing_queued(Error::device(error)));
            }
            Err(WriteThenWaitError::WaitNotQueued(error)) => Some(error),
        };
        // The doorbell will ring either way: the arm runs and, for an op whose wait could
        // not be queued, finds it abandoned and only releases the word. Abandoned before
        // the arm is watched: an arm that ran first would start the op (and publish it)
        // after the caller was told the submission failed.
        if wait_failed.is_some() {
            self.abandon();
        }
        let op = Arc::clone(self);
        poller.watch(&self.stream, self.sequence, Box::new(move || op.arm()));
        match wait_failed {
            None => Ok(()),
            Some(error) => Err(EnqueueError { error: Error::device(error), nothing_queued: false }),
        }
    }

    /// Host-function arm, for devices without stream memory operations: the host
    /// function arms the op and holds the stream until it has published (the documented
    /// blocking fallback).
    fn enqueue_host_function_arm(self: &Arc<Self>) -> Result<(), EnqueueError> {
        let device = self.driver.device();
        let raw = Arc::into_raw(Arc::clone(self)).cast_mut().cast::<c_void>();
        // SAFETY: `raw` is an Arc reference that `arm_host_fn` takes back exactly once; the
        // function is sound on any thread (it catches panics and calls no device API).
        let launched = unsafe { device.launch_host_func(self.stream.handle, arm_host_fn, raw) };
        launched.map_err(|error| {
            // SAFETY: the launch failed, so the host function will never take `raw` back.
            drop(unsafe { Arc::from_raw(raw.cast::<AsyncOp>()) });
            EnqueueError { error: Error::device(error), nothing_queued: true }
        })
    }

    /// Starts the prefetch of a fully FIXED read that the stream's window did not admit
    /// at submission, if the stream has not reached it yet and the window has room now.
    fn try_start_deferred_prefetch(self: &Arc<Self>) -> DeferredStart {
        let len_bytes = self.submitted.size_bytes();
        if self.end.is_abandoned() || self.gate.reached() {
            return DeferredStart::Gone;
        }
        let Ok(engine) = self.driver.engine() else { return DeferredStart::Gone };
        if !self.driver.may_prefetch(&self.file, file_range(&self.submitted)) {
            return DeferredStart::Gone;
        }
        if !self.stream.admit_prefetch(len_bytes) {
            return DeferredStart::NoRoom;
        }
        // The window's share is the op's once the prefetch started (before its gate
        // exists: the arm may release it as soon as it finds the gate).
        self.holds_prefetch_window.store(true, Ordering::SeqCst);
        let Some(receiver) = self.start_prefetch(engine) else {
            if self.holds_prefetch_window.swap(false, Ordering::SeqCst) {
                self.stream.release_prefetch(len_bytes);
            }
            return DeferredStart::Gone;
        };
        self.driver.async_stats().prefetched.fetch_add(1, Ordering::Relaxed);
        self.post(engine, self.submitted, Some(receiver));
        DeferredStart::Started
    }

    /// Starts the op's prefetch through its gate unless the stream reached the op (or it
    /// was abandoned): the receiver its jobs wait on.
    fn start_prefetch(&self, engine: &Engine) -> Option<flume::Receiver<bool>> {
        let mut receiver = None;
        self.gate.start_prefetch(|| {
            self.machine().apply(OpEvent::Prefetch).ok()?;
            self.note_prefetch_start();
            let parts =
                engine.parts(self.submitted.file_offset_bytes(), self.submitted.size_bytes());
            let (sender, waiting) = flume::bounded(parts.len());
            receiver = Some(waiting);
            Some((sender, parts.len()))
        });
        receiver
    }

    /// Records what a prefetch starting now is read against: our write count of the
    /// file and the file's change stamp (taken before the read starts).
    fn note_prefetch_start(&self) {
        let generation = self.driver.write_generation(&self.file);
        self.prefetch_generation.store(generation, Ordering::SeqCst);
        *self.prefetch_stamp.lock().unwrap_or_else(|p| p.into_inner()) = self.file.change_stamp();
    }

    /// Whether the prefetched data is still what the file holds now that the stream
    /// reached the op: no write of ours was submitted since it started, and the file's
    /// size and change times are those seen then, with its last change settled before
    /// (`ChangeStamp::still_holds`). A write through any descriptor moves them.
    fn prefetch_still_fresh(&self) -> bool {
        if self.driver.write_generation(&self.file)
            != self.prefetch_generation.load(Ordering::SeqCst)
        {
            return false;
        }
        let then = *self.prefetch_stamp.lock().unwrap_or_else(|p| p.into_inner());
        match (then, self.file.change_stamp()) {
            (Some(then), Some(now)) => then.still_holds(&now),
            _ => false,
        }
    }

    /// Marks the op as not submitted: it publishes nothing and only cleans up.
    fn abandon(&self) {
        self.end.abandon();
        // A prefetch job in flight sees its gate disconnect and ends without copying.
        self.gate.abandon();
        self.release_prefetch_window();
        self.driver.remove_write_hazard(&self.file, self.hazard);
        self.resources.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    /// The stream reached the op (on the arm poller, or in the host function of the
    /// blocking fallback; O(1), no device calls).
    fn arm(self: Arc<Self>) {
        if self.end.end_if_abandoned() {
            self.release_host();
            return;
        }
        // A deferred prefetch (see `try_start_deferred_prefetch`) either started before
        // and is found here, or cannot start any more (`op_gate`).
        if let Some((gate, parts)) = self.gate.reach() {
            let _ = self.machine().apply(OpEvent::Arm);
            let fresh = self.prefetch_still_fresh();
            if fresh {
                for _ in 0..parts {
                    let _ = gate.send(true);
                }
                return;
            }
            // A write to the file was submitted after the prefetch started, or the file
            // changed (or may have) through another descriptor: what it staged may be
            // stale. Drop it and read again, now in stream order.
            self.prefetch_cancelled.store(true, Ordering::SeqCst);
            for _ in 0..parts {
                let _ = gate.send(false);
            }
            self.driver.async_stats().prefetches_redone.fetch_add(1, Ordering::Relaxed);
            match self.driver.engine() {
                Ok(engine) => self.post(engine, self.submitted, None),
                Err(error) => self.publish(Outcome::Library(error.code), None),
            }
            return;
        }
        // SAFETY: hipFile's contract: unfixed parameter pointers are valid until the op
        // binds, which is now.
        let raw = unsafe { self.args.read() };
        let page_size_bytes = self.driver.page_size_bytes();
        let bound = revalidate(&self.submitted, raw, self.flags, page_size_bytes);
        let Ok(io) = bound else {
            let _ = self.machine().apply(OpEvent::BindFailed);
            self.publish(Outcome::Library(OpError::InvalidValue), None);
            return;
        };
        {
            let mut machine = self.machine();
            let _ = machine.bind_size(io.size_bytes());
            let _ = machine.apply(OpEvent::Arm);
        }
        match self.driver.engine() {
            Ok(engine) => self.post(engine, io, None),
            Err(error) => self.publish(Outcome::Library(error.code), None),
        }
    }

    /// Posts the op's job(s): one job on the stream's executor, or, for large ops, one
    /// per part over several executors (host release once all parts finished).
    fn post(self: &Arc<Self>, engine: &Engine, io: ValidIo, gate: Option<flume::Receiver<bool>>) {
        let parts = engine.parts(io.file_offset_bytes(), io.size_bytes());
        let fan_out = parts.len() > 1;
        let joiner = Arc::new(PartJoiner::new(self.direction, parts.clone()));
        for (index, &(offset, len)) in parts.iter().enumerate() {
            let Some(guard) = self.share_guard() else {
                self.publish(Outcome::Library(OpError::InternalError), None);
                return;
            };
            let op = Arc::clone(self);
            let joiner = Arc::clone(&joiner);
            let prefetch_job = gate.is_some();
            let done: crate::engine::JobDone = Box::new(move |end: JobEnd<'_>| {
                if prefetch_job && op.prefetch_cancelled.load(Ordering::SeqCst) {
                    // Superseded by the job posted at arm.
                } else if !fan_out {
                    op.finish(end);
                } else if let Some((outcome, error)) =
                    joiner.part_done(index, end.outcome, end.device_error)
                {
                    op.publish(outcome, error);
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
                may_start: None,
                done: Completion::new(Arc::clone(self.driver.device()), done),
            };
            engine.post(self.stream.executor + index, job);
        }
    }

    /// A guard for one job of the op, taken from the op's own (it exists until publish).
    fn share_guard(&self) -> Option<OpGuard> {
        let resources = self.resources.lock().unwrap_or_else(|p| p.into_inner());
        resources.as_ref().map(|(guard, _)| guard.share())
    }

    fn releases_device_side(&self) -> bool {
        self.direction == Direction::Read && !self.blocking_fallback
    }

    /// The single job of the op ended: publish, releasing device-side after the copies
    /// when the job left them in flight.
    fn finish(&self, end: JobEnd<'_>) {
        if !self.store_result(end.outcome, end.device_error) {
            return;
        }
        if let (Some(stream), true) = (end.stream, self.releases_device_side()) {
            let word = self.stream.word();
            // SAFETY: the word lives as long as the driver (see enqueue).
            let queued = unsafe {
                end.device.write_value32_internal(stream, word.device_addr, self.sequence)
            };
            if queued.is_ok() {
                self.driver.async_stats().device_releases.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        self.release_host();
    }

    /// Publishes an outcome and releases host-side.
    fn publish(&self, outcome: Outcome, device_error: Option<DeviceError>) {
        if self.store_result(outcome, device_error) {
            self.release_host();
        }
    }

    /// Stores `*bytes_p` once and frees the op's hold on file, buffer and hazard table.
    /// `false` when the op was already published or abandoned.
    fn store_result(&self, outcome: Outcome, device_error: Option<DeviceError>) -> bool {
        if !self.end.claim_publish() {
            return false;
        }
        let _ = device_error;
        {
            let mut machine = self.machine();
            let _ = machine.apply(OpEvent::Start);
            let _ = machine.apply(match outcome {
                Outcome::Bytes(n) => OpEvent::Transferred(n),
                failure => OpEvent::Fail(failure),
            });
            let _ = machine.apply(OpEvent::Finish);
            let _ = machine.apply(OpEvent::Publish);
        }
        crate::stats::global().record(
            self.device_ordinal,
            crate::stats::Api::Async,
            self.direction,
            self.submitted.size_bytes(),
            outcome,
            self.submitted_at.elapsed(),
        );
        // SAFETY: hipFile's contract: bytes_p stays valid until the op has completed.
        unsafe { self.args.bytes_p.write_volatile(outcome.bytes_p_value() as isize) };
        self.driver.remove_write_hazard(&self.file, self.hazard);
        self.release_prefetch_window();
        self.resources.lock().unwrap_or_else(|p| p.into_inner()).take();
        true
    }

    fn release_prefetch_window(&self) {
        if self.holds_prefetch_window.swap(false, Ordering::SeqCst) {
            self.stream.release_prefetch(self.submitted.size_bytes());
            self.stream.start_deferred();
        }
    }

    fn release_host(&self) {
        if self.blocking_fallback {
            let (lock, signal) = &self.published_signal;
            *lock.lock().unwrap_or_else(|p| p.into_inner()) = true;
            signal.notify_all();
        }
        let word = self.stream.word();
        // SAFETY: the word lives as long as the driver (see enqueue).
        unsafe { self.driver.device().store_word_host(word.host_ptr, self.sequence) };
        self.driver.async_stats().host_releases.fetch_add(1, Ordering::Relaxed);
    }
}

impl Drop for AsyncOp {
    /// An op dropped before publishing (a panic, a lost job) still publishes -5030 and
    /// releases the stream.
    fn drop(&mut self) {
        if self.end.unfinished() {
            self.publish(Outcome::Library(OpError::InternalError), None);
        }
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

/// Holds a driver reference and, when it is the last one and the op is dropped on an
/// executor thread, drops it on a helper thread: dropping the driver stops the engine,
/// which joins the executors, and an executor cannot join itself.
struct DriverDropGuard(Option<Arc<Driver>>);

impl Drop for DriverDropGuard {
    fn drop(&mut self) {
        let Some(driver) = self.0.take() else { return };
        if crate::engine::on_executor_thread() && Arc::strong_count(&driver) == 1 {
            let _ = std::thread::Builder::new()
                .name("hipfile-driver-drop".into())
                .spawn(move || drop(driver));
        }
    }
}

/// The arm host function enqueued on the user's stream.
///
/// # Safety
/// `user_data` is a pointer from `Arc::into_raw` of an `AsyncOp`, passed exactly once.
unsafe extern "C" fn arm_host_fn(user_data: *mut c_void) {
    // SAFETY: see the function's contract.
    let op = unsafe { Arc::from_raw(user_data.cast::<AsyncOp>().cast_const()) };
    // The stream reached the op: ring its doorbell host-side, as the stream itself does
    // on the memory-operation path (the doorbell then tells the word pool that no arm
    // of this stream is pending: `crate::stream`).
    let doorbell = op.stream.arm_queue().doorbell();
    // SAFETY: the doorbell lives in the driver's word pool while the op holds its stream.
    unsafe { op.driver.device().store_word_host(doorbell.host_ptr, op.sequence) };
    let blocking = op.blocking_fallback;
    let waiter = blocking.then(|| Arc::clone(&op));
    // A panic must not cross the C boundary; the op's Drop then publishes -5030.
    let _ = catch_unwind(AssertUnwindSafe(move || op.arm()));
    // Blocking fallback (no stream memory operations): later stream work waits for this
    // host function, so it returns only once the op has published. The engine never
    // needs this thread, so the wait cannot deadlock.
    if let Some(op) = waiter {
        let (lock, signal) = &op.published_signal;
        let mut published = lock.lock().unwrap_or_else(|p| p.into_inner());
        while !*published {
            published = signal.wait(published).unwrap_or_else(|p| p.into_inner());
        }
    }
}
