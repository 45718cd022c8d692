//! The cpu device's streams: FIFO command queues, each run in order by its own worker
//! thread; tickets for events and synchronization; sticky asynchronous errors; the
//! internal streams of the engine and the application's streams are the same kind.

use core::ffi::c_void;
use std::collections::VecDeque;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::{self, JoinHandle};

use crate::device::{
    DeviceCopies, DeviceError, HostFn, InternalStream, StreamHandle, StreamMemoryOps,
};

use super::commands::{Command, CommandOutcome, HostCall, Shared};
use super::memory::{AllocationMap, CopyRule, check_range, check_word, is_any};
use super::stats::{StatCounters, bump};
use super::{CpuDevice, invalid_handle, lock, next_handle, out_of_memory, read, write};

/// A stream's queue and progress. Command `n` (1-based) has ticket `n`.
#[derive(Default)]
struct QueueState {
    pub(super) commands: VecDeque<Command>,
    enqueued: u64,
    completed: u64,
    closing: bool,
    worker_idle: bool,
    done_waiters: usize,
    /// First command that failed: its ticket and error (sticky).
    first_error: Option<(u64, DeviceError)>,
}

/// The process the calling code runs in, kept by a `pthread_atfork` child handler (an
/// atomic load on the hot path, not a `getpid` call).
fn current_process() -> u32 {
    static CURRENT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    static HANDLER: std::sync::Once = std::sync::Once::new();
    extern "C" fn in_child() {
        // SAFETY: getpid is async-signal-safe, as a fork child handler requires.
        CURRENT.store(unsafe { libc::getpid() } as u32, Ordering::SeqCst);
    }
    HANDLER.call_once(|| {
        // SAFETY: getpid has no preconditions; pthread_atfork registers a handler that
        // only stores to an atomic.
        unsafe {
            CURRENT.store(libc::getpid() as u32, Ordering::SeqCst);
            libc::pthread_atfork(None, None, Some(in_child));
        }
    });
    CURRENT.load(Ordering::SeqCst)
}

/// The error every stream operation of a process's cpu device gives in a child that
/// process forked: the stream's worker thread does not exist there.
const FORKED: DeviceError = DeviceError::new(
    DeviceError::HIP_ERROR_NOT_INITIALIZED,
    "the cpu device's streams do not survive fork(): use them in the process that made them",
);

/// One stream, shared by the device object, its worker and its events.
pub(super) struct StreamShared {
    pub(super) device_ordinal: u32,
    /// The process whose worker thread runs the stream.
    process: u32,
    queue: Mutex<QueueState>,
    /// Signals the worker: new work or closing.
    work_cv: Condvar,
    /// Signals waiters: a command completed.
    done_cv: Condvar,
}

impl StreamShared {
    pub(super) fn new(device_ordinal: u32) -> Self {
        StreamShared {
            device_ordinal,
            process: current_process(),
            queue: Mutex::default(),
            work_cv: Condvar::new(),
            done_cv: Condvar::new(),
        }
    }

    /// Fails in a forked child, before any lock (one held by another thread at fork time
    /// stays held there forever).
    fn check_process(&self) -> Result<(), DeviceError> {
        if self.process == current_process() { Ok(()) } else { Err(FORKED) }
    }

    pub(super) fn enqueue(&self, command: Command) -> Result<u64, DeviceError> {
        self.check_process()?;
        let mut queue = lock(&self.queue);
        if queue.closing {
            return Err(invalid_handle("stream destroyed"));
        }
        queue.commands.push_back(command);
        queue.enqueued += 1;
        if queue.worker_idle {
            self.work_cv.notify_one();
        }
        Ok(queue.enqueued)
    }

    /// The ticket an event recorded now would have.
    pub(super) fn current_ticket(&self) -> u64 {
        lock(&self.queue).enqueued
    }

    /// The error of the commands up to `ticket`, once they have all completed.
    fn error_up_to(queue: &QueueState, ticket: u64) -> Result<(), DeviceError> {
        match queue.first_error {
            Some((failed, error)) if failed <= ticket => Err(error),
            _ => Ok(()),
        }
    }

    /// Non-blocking: whether commands up to `ticket` have completed.
    pub(super) fn is_done(&self, ticket: u64) -> Result<bool, DeviceError> {
        self.check_process()?;
        let queue = lock(&self.queue);
        if queue.completed < ticket {
            return Ok(false);
        }
        Self::error_up_to(&queue, ticket).map(|()| true)
    }

    /// Blocks until commands up to `ticket` have completed.
    pub(super) fn wait_for(&self, ticket: u64) -> Result<(), DeviceError> {
        self.check_process()?;
        let mut queue = lock(&self.queue);
        queue.done_waiters += 1;
        while queue.completed < ticket {
            queue = self.done_cv.wait(queue).unwrap_or_else(PoisonError::into_inner);
        }
        queue.done_waiters -= 1;
        Self::error_up_to(&queue, ticket)
    }

    pub(super) fn close(&self) {
        let mut queue = lock(&self.queue);
        queue.closing = true;
        self.work_cv.notify_one();
    }

    /// The next command and its ticket; `None` once closing and drained.
    fn next_command(&self) -> Option<(u64, Command)> {
        let mut queue = lock(&self.queue);
        loop {
            if let Some(command) = queue.commands.pop_front() {
                return Some((queue.completed + 1, command));
            }
            if queue.closing {
                return None;
            }
            queue.worker_idle = true;
            queue = self.work_cv.wait(queue).unwrap_or_else(PoisonError::into_inner);
            queue.worker_idle = false;
        }
    }

    /// Records the completion of command `ticket`; returns commands discarded after an
    /// abandoned wait (dropped by the caller, outside the lock).
    pub(super) fn finish(
        &self,
        ticket: u64,
        outcome: CommandOutcome,
        stats: &StatCounters,
    ) -> VecDeque<Command> {
        let mut queue = lock(&self.queue);
        queue.completed = ticket;
        let mut discarded = VecDeque::new();
        match outcome {
            CommandOutcome::Done => {}
            CommandOutcome::Failed(error) => {
                bump(&stats.async_errors, 1);
                queue.first_error.get_or_insert((ticket, error));
            }
            CommandOutcome::Abandoned => {
                let error = DeviceError::new(
                    DeviceError::HIP_ERROR_UNKNOWN,
                    "wait-value abandoned: device dropped",
                );
                queue.first_error.get_or_insert((ticket, error));
                discarded = std::mem::take(&mut queue.commands);
                queue.completed = queue.enqueued;
                queue.closing = true;
            }
        }
        if queue.done_waiters > 0 {
            self.done_cv.notify_all();
        }
        discarded
    }
}

/// A stream worker: executes commands in order until the stream is closed and drained.
fn run_worker(shared: Arc<Shared>, stream: Arc<StreamShared>) {
    while let Some((ticket, command)) = stream.next_command() {
        let outcome = panic::catch_unwind(AssertUnwindSafe(|| shared.execute(command)))
            .unwrap_or_else(|_| {
                CommandOutcome::Failed(DeviceError::new(
                    DeviceError::HIP_ERROR_UNKNOWN,
                    "cpu device: command panicked",
                ))
            });
        // Commands discarded after an abandoned wait are dropped here, outside the lock.
        drop(stream.finish(ticket, outcome, &shared.stats));
    }
}

/// A stream in the device's table: its shared state and its worker thread.
pub(super) struct StreamEntry {
    pub(super) shared: Arc<StreamShared>,
    pub(super) worker: JoinHandle<()>,
}

impl CpuDevice {
    fn spawn_stream(&self, handle: usize, device_ordinal: u32) -> Result<StreamEntry, DeviceError> {
        let stream = Arc::new(StreamShared::new(device_ordinal));
        let (shared, worker_stream) = (Arc::clone(&self.shared), Arc::clone(&stream));
        let worker = thread::Builder::new()
            .name(format!("hfcpu-s{handle}"))
            .spawn(move || run_worker(shared, worker_stream))
            .map_err(|_| out_of_memory("cannot spawn a stream worker thread"))?;
        Ok(StreamEntry { shared: stream, worker })
    }

    /// Creates a stream on `device_ordinal`, with its own worker thread (named
    /// `hfcpu-s<handle>`). Handles are unique in the process, never 0, never reused.
    ///
    /// # Errors
    /// `HIP_ERROR_INVALID_DEVICE`, or `HIP_ERROR_OUT_OF_MEMORY` if no thread can be spawned.
    pub fn create_stream(&self, device_ordinal: u32) -> Result<StreamHandle, DeviceError> {
        self.check_ordinal(device_ordinal)?;
        let handle = next_handle();
        let entry = self.spawn_stream(handle, device_ordinal)?;
        write(&self.streams).insert(handle, entry);
        Ok(StreamHandle(handle))
    }

    /// Destroys a stream, like `hipStreamDestroy`: the handle is invalid at once, the
    /// stream's queued work still runs to completion, then its worker thread exits. Does
    /// not block.
    ///
    /// # Errors
    /// `HIP_ERROR_INVALID_HANDLE` for the NULL stream or an unknown/destroyed stream.
    pub fn destroy_stream(&self, stream: StreamHandle) -> Result<(), DeviceError> {
        if stream == StreamHandle::NULL {
            return Err(invalid_handle("the NULL stream cannot be destroyed"));
        }
        let entry = write(&self.streams).remove(&stream.0);
        let entry = entry.ok_or(invalid_handle("unknown stream"))?;
        entry.shared.close();
        let mut retired = lock(&self.retired);
        retired.retain(|worker| !worker.is_finished());
        retired.push(entry.worker);
        Ok(())
    }

    /// The stream named by `handle` (the NULL stream is created on first use).
    pub(super) fn stream(&self, handle: usize) -> Result<Arc<StreamShared>, DeviceError> {
        if let Some(entry) = read(&self.streams).get(&handle) {
            return Ok(Arc::clone(&entry.shared));
        }
        if handle != StreamHandle::NULL.0 {
            return Err(invalid_handle("unknown or destroyed stream"));
        }
        self.check_ordinal(0)?;
        let mut streams = write(&self.streams);
        if let Some(entry) = streams.get(&handle) {
            return Ok(Arc::clone(&entry.shared));
        }
        let entry = self.spawn_stream(handle, 0)?;
        let stream = Arc::clone(&entry.shared);
        streams.insert(handle, entry);
        Ok(stream)
    }

    /// Validates `check` against the memory registry, then enqueues `command`.
    fn enqueue_checked(
        &self,
        handle: usize,
        check: impl FnOnce(&AllocationMap) -> Result<(), DeviceError>,
        command: Command,
    ) -> Result<u64, DeviceError> {
        let stream = self.stream(handle)?;
        check(&read(&self.shared.memory.map))?;
        stream.enqueue(command)
    }

    fn enqueue_copy(
        &self,
        handle: usize,
        target: u64,
        source: u64,
        len_bytes: usize,
        rule: CopyRule,
    ) -> Result<(), DeviceError> {
        let check = |map: &AllocationMap| rule.check(map, target, source, len_bytes).map(drop);
        let command = Command::Copy { target, source, len_bytes, rule };
        self.enqueue_checked(handle, check, command).map(drop)
    }

    /// Enqueues a copy of `len_bytes` from `source` to `target` on a stream. Both ranges
    /// must each lie inside one tracked allocation of any type (device, managed, pinned or
    /// registered host); checked at enqueue time and again when the copy runs.
    ///
    /// # Errors
    /// `HIP_ERROR_INVALID_HANDLE` for an unknown stream, `HIP_ERROR_INVALID_VALUE` for a
    /// range outside tracked memory.
    ///
    /// # Safety
    /// Until the copy completes, nothing else writes `target..+len_bytes` or `source..
    /// +len_bytes`, and no Rust reference reads `target..+len_bytes`.
    pub unsafe fn memcpy_async(
        &self,
        stream: StreamHandle,
        target: u64,
        source: u64,
        len_bytes: usize,
    ) -> Result<(), DeviceError> {
        self.enqueue_copy(stream.0, target, source, len_bytes, CopyRule::AnyTracked)
    }

    /// Enqueues filling `target..target+len_bytes` with `value` on a stream. The range must
    /// lie inside one tracked allocation of any type.
    ///
    /// # Errors
    /// `HIP_ERROR_INVALID_HANDLE` for an unknown stream, `HIP_ERROR_INVALID_VALUE` for a
    /// range outside tracked memory.
    ///
    /// # Safety
    /// Until the fill completes, nothing else accesses `target..target+len_bytes`.
    pub unsafe fn memset_async(
        &self,
        stream: StreamHandle,
        target: u64,
        value: u8,
        len_bytes: usize,
    ) -> Result<(), DeviceError> {
        let check = |map: &AllocationMap| {
            check_range(map, target, len_bytes, is_any, "memset target not tracked").map(drop)
        };
        let command = Command::Memset { target, value, len_bytes };
        self.enqueue_checked(stream.0, check, command).map(drop)
    }

    /// Enqueues a Rust closure as a host function. A panic in it is caught and counted in
    /// [`CpuDeviceStats::host_fn_panics`](super::CpuDeviceStats::host_fn_panics); the
    /// stream keeps running.
    ///
    /// (A panic cannot be caught in an `extern "C"` [`HostFn`]: Rust aborts the process
    /// when a panic reaches an `extern "C"` boundary.) The closure may call this device,
    /// but must not synchronize its own stream (it would wait for itself, as on a GPU).
    ///
    /// # Errors
    /// `HIP_ERROR_INVALID_HANDLE` for an unknown stream.
    pub fn launch_host_closure<F>(
        &self,
        stream: StreamHandle,
        closure: F,
    ) -> Result<(), DeviceError>
    where
        F: FnOnce() + Send + 'static,
    {
        let command = Command::Closure(Box::new(closure));
        self.stream(stream.0)?.enqueue(command).map(drop)
    }
}

impl DeviceCopies for CpuDevice {
    fn create_internal_stream(&self, device_ordinal: u32) -> Result<InternalStream, DeviceError> {
        let stream = self.create_stream(device_ordinal)?;
        bump(&self.shared.stats.internal_streams_created, 1);
        Ok(InternalStream::from_raw(stream.0))
    }

    fn destroy_internal_stream(&self, stream: InternalStream) {
        if self.destroy_stream(StreamHandle(stream.raw())).is_err() {
            self.count_invalid_release();
        }
    }

    unsafe fn copy_to_device_async(
        &self,
        stream: &InternalStream,
        target: u64,
        source: *const u8,
        len_bytes: usize,
    ) -> Result<(), DeviceError> {
        let source = source as usize as u64;
        self.enqueue_copy(stream.raw(), target, source, len_bytes, CopyRule::HostToDevice)
    }

    unsafe fn copy_from_device_async(
        &self,
        stream: &InternalStream,
        target: *mut u8,
        source: u64,
        len_bytes: usize,
    ) -> Result<(), DeviceError> {
        let target = target as usize as u64;
        self.enqueue_copy(stream.raw(), target, source, len_bytes, CopyRule::DeviceToHost)
    }

    fn synchronize_internal(&self, stream: &InternalStream) -> Result<(), DeviceError> {
        self.synchronize_stream(StreamHandle(stream.raw()))
    }

    fn copies_on_caller_thread(&self) -> bool {
        true
    }

    unsafe fn copy_now(
        &self,
        device_ordinal: u32,
        direction: hipfile_core::Direction,
        device_addr: u64,
        host: *mut u8,
        len_bytes: usize,
        ops_may_hold_streams: bool,
    ) -> Result<(), DeviceError> {
        use hipfile_core::Direction;
        self.check_ordinal(device_ordinal)?;
        // Streams of this device never share queues: the hint only counts.
        bump(&self.shared.stats.caller_copies, 1);
        if ops_may_hold_streams {
            bump(&self.shared.stats.caller_copies_while_ops_hold_streams, 1);
        }
        let host = host as usize as u64;
        self.on_caller_stream(device_ordinal, |stream| match direction {
            Direction::Read => {
                self.enqueue_copy(stream, device_addr, host, len_bytes, CopyRule::HostToDevice)
            }
            Direction::Write => {
                self.enqueue_copy(stream, host, device_addr, len_bytes, CopyRule::DeviceToHost)
            }
        })
    }

    unsafe fn write_value32_internal(
        &self,
        stream: &InternalStream,
        word_device_addr: u64,
        value: u32,
    ) -> Result<(), DeviceError> {
        // SAFETY: same contract as `stream_write_value32`.
        unsafe { self.stream_write_value32(StreamHandle(stream.raw()), word_device_addr, value) }
    }

    fn alloc_engine_device(
        &self,
        device_ordinal: u32,
        len_bytes: usize,
    ) -> Result<u64, DeviceError> {
        self.malloc_device(device_ordinal, len_bytes)
    }

    unsafe fn free_engine_device(&self, _device_ordinal: u32, addr: u64) {
        // SAFETY: the caller's contract: ours, freed once, no copy still uses it.
        if unsafe { self.free_device(addr) }.is_err() {
            self.count_invalid_release();
        }
    }

    unsafe fn copy_device_now(
        &self,
        device_ordinal: u32,
        target: u64,
        source: u64,
        len_bytes: usize,
    ) -> Result<(), DeviceError> {
        self.check_ordinal(device_ordinal)?;
        self.on_caller_stream(device_ordinal, |stream| {
            self.enqueue_copy(stream, target, source, len_bytes, CopyRule::DeviceToDevice)
        })
    }
}

impl CpuDevice {
    /// Runs `enqueue` on a pooled stream of `device_ordinal` (made when none is free),
    /// waits for the stream, and gives it back: the copies that return once complete.
    fn on_caller_stream(
        &self,
        device_ordinal: u32,
        enqueue: impl FnOnce(usize) -> Result<(), DeviceError>,
    ) -> Result<(), DeviceError> {
        let pooled = {
            let mut pool = lock(&self.caller_streams);
            let index = pool.iter().position(|&(ordinal, _)| ordinal == device_ordinal);
            index.map(|index| pool.swap_remove(index).1)
        };
        let stream = match pooled {
            Some(stream) => stream,
            None => self.create_stream(device_ordinal)?.0,
        };
        let enqueued = enqueue(stream);
        let synced = self.synchronize_stream(StreamHandle(stream));
        lock(&self.caller_streams).push((device_ordinal, stream));
        enqueued.and(synced)
    }
}

impl StreamMemoryOps for CpuDevice {
    unsafe fn launch_host_func(
        &self,
        stream: StreamHandle,
        func: HostFn,
        user_data: *mut c_void,
    ) -> Result<(), DeviceError> {
        let command = Command::HostFn(HostCall { func, user_data });
        self.stream(stream.0)?.enqueue(command).map(drop)
    }

    unsafe fn stream_wait_value32(
        &self,
        stream: StreamHandle,
        word_device_addr: u64,
        value: u32,
    ) -> Result<(), DeviceError> {
        let check = |map: &AllocationMap| check_word(map, word_device_addr);
        let command = Command::WaitValue { word_addr: word_device_addr, value, keep_alive: None };
        self.enqueue_checked(stream.0, check, command).map(drop)
    }

    unsafe fn stream_write_value32(
        &self,
        stream: StreamHandle,
        word_device_addr: u64,
        value: u32,
    ) -> Result<(), DeviceError> {
        let check = |map: &AllocationMap| check_word(map, word_device_addr);
        let command = Command::WriteValue { word_addr: word_device_addr, value };
        self.enqueue_checked(stream.0, check, command).map(drop)
    }

    fn copies_on_user_streams(&self) -> bool {
        true
    }

    unsafe fn copy_on_stream(
        &self,
        stream: StreamHandle,
        direction: hipfile_core::Direction,
        device_addr: u64,
        host: *mut u8,
        len_bytes: usize,
    ) -> Result<(), DeviceError> {
        let host = host as usize as u64;
        match direction {
            hipfile_core::Direction::Read => {
                self.enqueue_copy(stream.0, device_addr, host, len_bytes, CopyRule::HostToDevice)
            }
            hipfile_core::Direction::Write => {
                self.enqueue_copy(stream.0, host, device_addr, len_bytes, CopyRule::DeviceToHost)
            }
        }
    }

    unsafe fn copy_device_on_stream(
        &self,
        stream: StreamHandle,
        target: u64,
        source: u64,
        len_bytes: usize,
    ) -> Result<(), DeviceError> {
        self.enqueue_copy(stream.0, target, source, len_bytes, CopyRule::DeviceToDevice)
    }

    fn synchronize_stream(&self, stream: StreamHandle) -> Result<(), DeviceError> {
        let stream = self.stream(stream.0)?;
        let ticket = stream.current_ticket();
        stream.wait_for(ticket)
    }

    fn stream_done(&self, stream: StreamHandle) -> Result<bool, DeviceError> {
        let stream = self.stream(stream.0)?;
        let ticket = stream.current_ticket();
        stream.is_done(ticket)
    }
}
