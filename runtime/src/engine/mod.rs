//! The I/O engine: glommio executors pinned to cores, each owning a pinned staging arena,
//! an internal device stream per GPU and the open files it reads and writes.
//!
//! Foreign threads (callers, device callback threads) hand jobs over through a bounded
//! `flume` channel per executor; the executor awaits it (`recv_async`), so an idle
//! executor parks in io_uring and burns no CPU. A full channel blocks foreign senders;
//! executors' own posts go to an overflow list instead (`queue.rs`). Every job is a byte
//! range of one file and one device buffer; the executor plans it in chunks
//! (`hipfile_core::PlanConfig`), reads or writes each chunk through io_uring (O_DIRECT
//! where aligned), and moves it across PCIe on its internal stream, with disk and copies
//! overlapped.

mod blocking;
mod caller_thread;
mod counters;
mod executor;
mod part_results;
mod parts;
mod queue;
mod staging;
mod watch;

/// The primitives [`part_results`] is written against (loom's in its model test).
mod sync {
    pub(crate) use std::sync::Mutex;
}

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use hipfile_core::{Direction, OpError, Outcome};

use crate::config::Config;
use crate::device::{Device, DeviceError, InternalStream};
use crate::executor_thread::on_executor_thread;
use crate::file::{FileHandle, OpGuard};

pub(crate) use counters::{EnginePhaseCounters, EngineStats, Phase};
pub use counters::{EnginePhases, EngineStatsSnapshot};
pub(crate) use parts::PartJoiner;
pub(crate) use parts::Parts;
pub(crate) use parts::Waiter;
use parts::{
    InFlight, chunks_touched, combine, fan_out, fan_out_for_load, fan_out_under_load, part_granule,
    place_parts, split_into_parts,
};
pub use queue::JOB_QUEUE_CAPACITY;
pub(crate) use staging::FallbackPool;

/// How a job ended, as the engine hands it to the job's `done` callback.
pub(crate) struct JobEnd<'a> {
    /// Bytes moved (short at EOF), `-errno`, or a library error.
    pub(crate) outcome: Outcome,
    /// The device error behind `Outcome::Library(HipDriverError)`, if any.
    pub(crate) device_error: Option<DeviceError>,
    /// The device, to enqueue a release after the copies (reads).
    pub(crate) device: &'a dyn Device,
    /// The internal stream the job's copies were enqueued on; `None` when none was
    /// created (the job failed before any copy). Borrowed: the executor owns it.
    pub(crate) stream: Option<&'a InternalStream>,
}

/// Callback run once per job, on the executor.
pub(crate) type JobDone = Box<dyn FnOnce(JobEnd<'_>) + Send>;

/// See [`IoJob::may_start`].
pub(crate) type StartCheck = Box<dyn FnOnce() -> bool + Send>;

/// Runs a job's callback exactly once: with the job's result, or — if the job is dropped
/// unfinished (an executor panicked or stopped) — with `hipFileInternalError`, so that no
/// caller and no stream ever waits forever.
pub(crate) struct Completion {
    done: Option<JobDone>,
    device: Arc<dyn Device>,
    /// Counts the job in its executor's jobs in flight until it reports (set by
    /// [`Engine::post`]).
    posted: Option<watch::PostedJob>,
}

impl Completion {
    /// Wraps `done`.
    pub(crate) fn new(device: Arc<dyn Device>, done: JobDone) -> Completion {
        Completion { done: Some(done), device, posted: None }
    }

    /// Runs the callback, once the job no longer counts as in flight: a caller woken by
    /// it that posts its next request at once finds the executor idle.
    pub(crate) fn finish(
        mut self,
        outcome: Outcome,
        device_error: Option<DeviceError>,
        stream: Option<&InternalStream>,
    ) {
        drop(self.posted.take());
        if let Some(done) = self.done.take() {
            done(JobEnd { outcome, device_error, device: &*self.device, stream });
        }
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        drop(self.posted.take());
        if let Some(done) = self.done.take() {
            let outcome = Outcome::Library(OpError::InternalError);
            done(JobEnd { outcome, device_error: None, device: &*self.device, stream: None });
        }
    }
}

/// Pinned host memory a read lands in, or a write takes its bytes from, instead of device
/// memory ([`IoJob::host_memory`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct HostMemory(*mut u8);

impl HostMemory {
    pub(crate) fn new(host_ptr: *mut u8) -> HostMemory {
        HostMemory(host_ptr)
    }

    /// The byte at `offset_bytes` from the start.
    ///
    /// # Safety
    /// `offset_bytes` lies within the job's length.
    pub(crate) unsafe fn at(self, offset_bytes: usize) -> *mut u8 {
        // SAFETY: the caller's contract.
        unsafe { self.0.add(offset_bytes) }
    }
}

// SAFETY: the memory belongs to the op that posted the job and outlives it; while the job
// runs only the job touches it (a read writes it, a write reads it).
unsafe impl Send for HostMemory {}

/// One byte range to move between a file and device memory.
pub(crate) struct IoJob {
    /// The file; keeps it open.
    pub(crate) file: Arc<FileHandle>,
    /// Counts the job as in flight on the file until it ends.
    pub(crate) guard: OpGuard,
    /// Read or write.
    pub(crate) direction: Direction,
    /// File offset of the first byte.
    pub(crate) file_offset_bytes: u64,
    /// Device address of the first byte.
    pub(crate) device_addr: u64,
    /// Bytes to move.
    pub(crate) len_bytes: u64,
    /// Device that owns `device_addr`.
    pub(crate) device_ordinal: u32,
    /// `true`: `done` runs after every copy has completed (synchronous callers).
    /// `false`: for reads, `done` runs once every copy is *enqueued*, so it can release a
    /// stream device-side after them; staging is recycled when the copies complete.
    pub(crate) wait_for_copies: bool,
    /// For a prefetching read: copies to the device wait until this receives `true` (the
    /// stream reached the op) — disk reads start at once. `false` (the staged data may be
    /// stale) or a disconnected gate (the op was abandoned) ends the job without touching
    /// device memory.
    pub(crate) arm_gate: Option<flume::Receiver<bool>>,
    /// Pinned host memory of at least `len_bytes` (a slot of an op copied on the user's
    /// stream) that a read lands in instead of being copied to `device_addr`, or that a
    /// write takes its bytes from instead of `device_addr`; the job then touches no
    /// device memory.
    pub(crate) host_memory: Option<HostMemory>,
    /// Asked once when the executor takes the job up, before it touches the file or
    /// memory: `false` ends the job at once with `ECANCELED` (a cancelled batch entry).
    pub(crate) may_start: Option<StartCheck>,
    /// Called once with the result.
    pub(crate) done: Completion,
}

struct ExecutorLink {
    sender: queue::JobSender,
    thread: Option<ExecutorThread>,
}

/// An executor's thread: a glommio executor, or a blocking one standing in for it.
enum ExecutorThread {
    Glommio(glommio::ExecutorJoinHandle<()>),
    Blocking(std::thread::JoinHandle<()>),
}

impl ExecutorThread {
    fn join(self) {
        match self {
            ExecutorThread::Glommio(thread) => drop(thread.join()),
            ExecutorThread::Blocking(thread) => drop(thread.join()),
        }
    }
}

/// How long a glommio executor may take to report that it started before a blocking
/// executor takes its place.
const EXECUTOR_START_LIMIT: std::time::Duration = std::time::Duration::from_secs(20);

/// The engine: N executors and what they share.
pub struct Engine {
    device: Arc<dyn Device>,
    executors: Vec<ExecutorLink>,
    /// Executors that run blocking I/O (their glommio executor could not start).
    blocking_executors: usize,
    /// Where each glommio executor's jobs are (by executor index; a blocking executor's
    /// stays at zero).
    watches: Vec<Arc<watch::ExecutorWatch>>,
    fallback: Arc<FallbackPool>,
    stats: Arc<EngineStats>,
    chunk_bytes: usize,
    request_parallelism: usize,
    /// `HIPFILE_BUSY_FAN_OUT` (see [`parts::fan_out_for_load`]).
    busy_fan_out: Option<usize>,
    /// `HIPFILE_LOADED_FAN_OUT` (see [`parts::fan_out_under_load`]).
    loaded_fan_out: Option<usize>,
    /// Queued requests split by [`Engine::parts`] whose parts are not all over.
    queued_requests: Arc<AtomicUsize>,
    /// `HIPFILE_CALLER_THREAD` (see [`Engine::run_on_caller_thread`]).
    caller_thread: crate::config::CallerThread,
    arena_bytes: usize,
    page_bytes: u64,
    /// Async ops alive (see [`Engine::track_async_op`]).
    async_ops_alive: Arc<AtomicUsize>,
}

/// Counts one async op as alive until dropped (see [`Engine::track_async_op`]): in its
/// engine and, where the backend counts them process-wide, there too.
#[derive(Debug)]
pub(crate) struct AsyncOpTicket {
    engine: Arc<AtomicUsize>,
    process: Option<&'static AtomicUsize>,
}

impl Drop for AsyncOpTicket {
    fn drop(&mut self) {
        self.engine.fetch_sub(1, Ordering::SeqCst);
        if let Some(process) = self.process {
            process.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Why the engine could not start.
#[derive(Debug)]
pub(crate) struct EngineError {
    /// What failed.
    pub(crate) what: String,
}

impl std::fmt::Display for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "hipfile engine: {}", self.what)
    }
}

impl std::error::Error for EngineError {}

/// Idle events made ahead per device: enough for every chunk copy the executors can have
/// in flight with whole chunks (each copy records one), at most the backend's pool.
fn events_to_prepare(config: &Config) -> usize {
    let chunks_per_executor = (config.staging_per_executor_bytes / config.staging_chunk_bytes)
        .max(config.chunks_in_flight)
        + config.chunks_in_flight;
    let fallback_chunks = config.fallback_pool_bytes() / config.staging_chunk_bytes;
    config.executor_cpus.len() * chunks_per_executor + fallback_chunks
}

/// Makes ahead, on the starting thread, what the data path of each device would
/// otherwise create on first use ([`crate::device::DeviceCopies::prepare_data_path`]).
/// A failure is logged: the data path then makes it on first use.
fn prepare_data_path(device: &dyn Device, config: &Config) {
    let events = events_to_prepare(config);
    for ordinal in 0..device.device_count() {
        if let Err(error) = device.prepare_data_path(ordinal, events) {
            log::warn!(
                "device {ordinal}: the engine's copy resources were not made ahead: {error}"
            );
        }
    }
}

/// One internal stream per device for an executor, made on the starting thread (see
/// [`prepare_data_path`]); a device whose stream could not be made gets one on first use.
fn internal_streams(device: &dyn Device) -> Vec<(u32, InternalStream)> {
    (0..device.device_count())
        .filter_map(|ordinal| match device.create_internal_stream(ordinal) {
            Ok(stream) => Some((ordinal, stream)),
            Err(error) => {
                log::debug!("device {ordinal}: executor stream not made ahead: {error}");
                None
            }
        })
        .collect()
}

/// Whether a transfer failed because the kernel refuses the way it was asked for (EINVAL,
/// EOPNOTSUPP: io_uring on this file, O_DIRECT on this file system), not because of the
/// file's data: the executors and the caller's thread then move it another way.
fn transfer_refused(errno: i32) -> bool {
    errno == libc::EOPNOTSUPP || errno == libc::EINVAL
}

impl Engine {
    /// Starts one executor per entry of `config.executor_cpus`.
    ///
    /// # Errors
    /// An executor thread could not start (io_uring unavailable, pinning refused, …).
    pub(crate) fn start(config: &Config, device: Arc<dyn Device>) -> Result<Engine, EngineError> {
        raise_memlock_limit(config);
        let fallback = FallbackPool::new(
            Arc::clone(&device),
            config.staging_chunk_bytes,
            config.fallback_pool_bytes(),
        );
        fallback.prefill();
        prepare_data_path(&*device, config);
        let stats = Arc::new(EngineStats::default());
        // Without io_uring (a container's seccomp profile) glommio cannot start: serve
        // every executor's jobs with a blocking one instead of letting glommio fail.
        let io_uring = if config.use_io_uring {
            crate::sys::probe_io_uring()
        } else {
            Err(std::io::Error::other("turned off (HIPFILE_IO_URING=0 or PreferIOUring false)"))
        };
        let mut starting = Vec::with_capacity(config.executor_cpus.len());
        let watches: Vec<Arc<watch::ExecutorWatch>> =
            config.executor_cpus.iter().map(|_| Arc::default()).collect();
        for (index, &cpu) in config.executor_cpus.iter().enumerate() {
            let (sender, receiver) = queue::job_queue();
            if io_uring.is_err() {
                starting.push((index, sender, None));
                continue;
            }
            let (ready, started) = flume::bounded(1);
            let setup = executor::Setup {
                index,
                cpu,
                streams: internal_streams(&*device),
                device: Arc::clone(&device),
                fallback: Arc::clone(&fallback),
                stats: Arc::clone(&stats),
                chunk_bytes: config.staging_chunk_bytes,
                arena_bytes: config.staging_per_executor_bytes,
                chunks_in_flight: config.chunks_in_flight,
                copy_spin: std::time::Duration::from_micros(config.copy_spin_us as u64),
                page_bytes: crate::sys::page_size_bytes(),
                park_spin: std::time::Duration::from_micros(config.park_spin_us() as u64),
                buffered_writes: config.buffered_writes,
                receiver,
                ready,
                watch: Arc::clone(&watches[index]),
            };
            // An injected start failure (crate::fault) stands for a spawn that failed.
            let refused = crate::fault::at(crate::fault::Site::ExecutorStart).is_some();
            let thread = if refused { None } else { executor::spawn(setup).ok() };
            starting.push((index, sender, thread.map(|thread| (thread, started))));
        }
        let mut executors = Vec::with_capacity(starting.len());
        let mut blocking = 0;
        for (index, sender, glommio) in starting {
            // A glommio executor that reports in serves its own channel; one that could
            // not be spawned, died starting (its channel's receiver is gone with it) or
            // did not report in time is replaced by a blocking executor on a new channel
            // (nothing was posted yet).
            if let Some((thread, started)) = glommio {
                match started.recv_timeout(EXECUTOR_START_LIMIT) {
                    Ok(()) => {
                        let thread = Some(ExecutorThread::Glommio(thread));
                        executors.push(ExecutorLink { sender, thread });
                        continue;
                    }
                    // It died starting (the sender went with it): join it.
                    Err(flume::RecvTimeoutError::Disconnected) => drop(thread.join()),
                    // Still starting: left to end by itself once it sees its channel closed.
                    Err(flume::RecvTimeoutError::Timeout) => drop(thread),
                }
                drop(sender);
            }
            let (sender, receiver) = queue::job_queue();
            let setup = blocking::BlockingSetup {
                index,
                streams: internal_streams(&*device),
                device: Arc::clone(&device),
                fallback: Arc::clone(&fallback),
                stats: Arc::clone(&stats),
                chunk_bytes: config.staging_chunk_bytes,
                receiver,
            };
            let thread = blocking::spawn(setup)
                .map_err(|e| EngineError { what: format!("starting executor {index}: {e}") })?;
            executors.push(ExecutorLink { sender, thread: Some(ExecutorThread::Blocking(thread)) });
            blocking += 1;
        }
        if blocking > 0 {
            let why = match &io_uring {
                Err(error) => format!("io_uring is unavailable: {error}"),
                Ok(()) => "their io_uring executors failed to start (is RLIMIT_MEMLOCK too low?)"
                    .to_string(),
            };
            if config.use_io_uring {
                log::warn!(
                    "{blocking} of {} I/O executors run blocking pread/pwrite \
                     instead of io_uring ({why}): same results, no O_DIRECT, less throughput",
                    executors.len()
                );
            }
        }
        Ok(Engine {
            device,
            executors,
            blocking_executors: blocking,
            watches,
            fallback,
            stats,
            chunk_bytes: config.staging_chunk_bytes,
            request_parallelism: config.request_parallelism.max(1),
            busy_fan_out: config.busy_fan_out,
            loaded_fan_out: config.loaded_fan_out,
            queued_requests: Arc::new(AtomicUsize::new(0)),
            caller_thread: config.caller_thread,
            arena_bytes: config.staging_per_executor_bytes,
            page_bytes: crate::sys::page_size_bytes(),
            async_ops_alive: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// Counts an async op as alive from before its wait-value is enqueued on an
    /// application stream until the ticket is dropped (the op is dropped after its
    /// release). While any is alive, a caller-thread copy must not take a path that a
    /// held application stream can stall ([`DeviceCopies::copy_now`](crate::device::DeviceCopies::copy_now)'s `ops_may_hold_streams`);
    /// on CUDA, whatever driver of the process the op belongs to.
    pub(crate) fn track_async_op(&self) -> AsyncOpTicket {
        self.async_ops_alive.fetch_add(1, Ordering::SeqCst);
        let process = self.device.process_async_ops();
        if let Some(process) = process {
            process.fetch_add(1, Ordering::SeqCst);
        }
        AsyncOpTicket { engine: Arc::clone(&self.async_ops_alive), process }
    }

    /// Whether an async op of this engine, or of any driver of the process where the
    /// backend counts them process-wide, may hold an application stream now.
    pub(crate) fn ops_may_hold_streams(&self) -> bool {
        self.async_ops_alive() > 0
            || self.device.process_async_ops().is_some_and(|p| p.load(Ordering::SeqCst) > 0)
    }

    /// Async ops alive now (each counted from its submission to its end).
    ///
    /// Public for the integration tests; embedders do not need it.
    pub fn async_ops_alive(&self) -> usize {
        self.async_ops_alive.load(Ordering::SeqCst)
    }

    /// Number of executors.
    pub fn executor_count(&self) -> usize {
        self.executors.len()
    }

    /// How many executors run blocking `pread`/`pwrite` because their io_uring
    /// executor could not start (0 normally).
    pub fn blocking_executor_count(&self) -> usize {
        self.blocking_executors
    }

    /// One line per glommio executor: jobs received and ended, how many are in each
    /// step now, its blocking calls (the pending report).
    pub fn describe_executors(&self) -> Vec<String> {
        let glommio = |index: &usize| {
            matches!(
                self.executors.get(*index).and_then(|link| link.thread.as_ref()),
                Some(ExecutorThread::Glommio(_))
            )
        };
        (0..self.watches.len())
            .filter(glommio)
            .map(|index| self.watches[index].describe(index))
            .collect()
    }

    /// Jobs posted to the executors that have not reported yet, queued or running, all
    /// executors together.
    pub fn jobs_in_flight(&self) -> u64 {
        self.watches.iter().map(|watch| watch.jobs_in_flight()).sum()
    }

    /// Queued requests (async ops, prefetches, slot reads, batch entries) counted for the
    /// fan-out under load (`HIPFILE_LOADED_FAN_OUT`): those whose parts are not all over.
    /// A request counts until its joiner is dropped, which may be a moment after its last
    /// job reported.
    pub fn queued_requests_in_flight(&self) -> usize {
        self.queued_requests.load(Ordering::Relaxed)
    }

    /// Jobs posted to each executor that have not reported yet, in executor order.
    pub fn jobs_in_flight_by_executor(&self) -> Vec<u64> {
        self.watches.iter().map(|watch| watch.jobs_in_flight()).collect()
    }

    /// Counters.
    pub fn stats(&self) -> EngineStatsSnapshot {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        EngineStatsSnapshot {
            jobs: load(&self.stats.jobs),
            arena_chunks: load(&self.stats.arena_chunks),
            fallback_chunks: load(&self.stats.fallback_chunks),
            sync_retry_chunks: load(&self.stats.sync_retry_chunks),
            caller_thread_requests: load(&self.stats.caller_thread_requests),
            caller_thread_requests_beside_ops: load(&self.stats.caller_thread_requests_beside_ops),
            caller_thread_large_requests: load(&self.stats.caller_thread_large_requests),
            requests_split_under_load: load(&self.stats.requests_split_under_load),
            blocking_jobs: load(&self.stats.blocking_jobs),
            fallback_waits: load(&self.stats.fallback_waits),
            host_memory_preads: load(&self.stats.host_memory_preads),
            host_memory_pwrites: load(&self.stats.host_memory_pwrites),
        }
    }

    /// Where the executors' time went so far (see [`EnginePhases`]).
    pub fn phases(&self) -> EnginePhases {
        self.stats.phases.snapshot()
    }

    /// The most pinned staging memory the engine can hold: every arena plus the capped
    /// fallback pool.
    pub fn pinned_cap_bytes(&self) -> usize {
        self.arena_bytes * self.executors.len() + self.fallback_cap_bytes()
    }

    /// The most pinned memory the fallback pool holds; it is allocated when the engine
    /// starts (unless an allocation failed then).
    ///
    /// Public for the integration tests; embedders do not need it.
    pub fn fallback_cap_bytes(&self) -> usize {
        self.fallback.cap_bytes()
    }

    /// Pinned fallback memory allocated now.
    ///
    /// Public for the integration tests; embedders do not need it.
    pub fn fallback_pinned_bytes(&self) -> usize {
        self.fallback.pinned_bytes()
    }

    /// Posts a job to executor `index % executor_count`. A foreign thread blocks while
    /// that executor's channel holds [`JOB_QUEUE_CAPACITY`] requests; an executor never
    /// blocks (a deferred prefetch started by a finished op goes to the target's
    /// overflow list: see [`queue`]).
    pub(crate) fn post(&self, index: usize, mut job: IoJob) {
        let index = index % self.executors.len();
        job.done.posted = Some(self.watches[index].job_posted());
        self.executors[index].sender.post(job, on_executor_thread());
    }

    /// Asks every executor to close descriptors of files whose handles are gone.
    pub(crate) fn prune_files(&self) {
        for link in &self.executors {
            link.sender.prune();
        }
    }

    /// Moves one range synchronously: splits it over up to `request_parallelism`
    /// executors (chunk-aligned parts), waits for every part, and combines the results
    /// (short at the first short part; the first failure wins).
    pub(crate) fn run_sync(&self, request: SyncRequest) -> (Outcome, Option<DeviceError>) {
        if let Some(result) = self.run_on_caller_thread(&request) {
            return result;
        }
        let parts = self.parts(
            Waiter::Caller,
            request.direction,
            &request.file,
            request.file_offset_bytes,
            request.len_bytes,
        );
        // Every part's guard first: once one job is posted, the request must not return
        // before it finishes (the caller's buffer is in use until then).
        let mut guards = Vec::with_capacity(parts.len());
        for _ in parts.list() {
            match request.file.begin_op() {
                Ok(guard) => guards.push(guard),
                Err(_) => return (Outcome::Library(OpError::HandleNotRegistered), None),
            }
        }
        let (sender, receiver) = flume::bounded(parts.len());
        let executors = self.executors_for(request.executor_hint, &parts);
        for (i, (&(offset, len), guard)) in parts.list().iter().zip(guards).enumerate() {
            let sender = sender.clone();
            let job = IoJob {
                file: Arc::clone(&request.file),
                guard,
                direction: request.direction,
                file_offset_bytes: request.file_offset_bytes + offset,
                device_addr: request.device_addr + offset,
                len_bytes: len,
                device_ordinal: request.device_ordinal,
                wait_for_copies: true,
                arm_gate: None,
                host_memory: None,
                may_start: None,
                done: Completion::new(
                    Arc::clone(&self.device),
                    Box::new(move |end: JobEnd<'_>| {
                        let _ = sender.send((i, end.outcome, end.device_error));
                    }),
                ),
            };
            self.post(executors.executor(i), job);
        }
        drop(sender);
        let mut results: Vec<(usize, Outcome, Option<DeviceError>)> = receiver.iter().collect();
        results.sort_by_key(|r| r.0);
        combine(request.direction, parts.list(), &results)
    }

    /// Splits `[file_offset, file_offset + len)` into the parts a request fans out to: up
    /// to `request_parallelism` parts (offsets relative to the request; one for a small
    /// request) whose inner boundaries fall on multiples of the chunk size (at most 1 MiB,
    /// [`parts::PART_GRANULE_BYTES`]) in the *file*, so each part keeps O_DIRECT alignment.
    ///
    /// With `HIPFILE_BUSY_FAN_OUT` the count follows the load ([`fan_out_for_load`]): every
    /// executor for a request that finds them idle, fewer and longer parts for one that
    /// finds them busy. With `HIPFILE_LOADED_FAN_OUT` a queued request's (`waiter`) follows
    /// the queued requests in flight ([`fan_out_under_load`]): at most that many parts once
    /// half as many as executors are.
    ///
    /// A queued request counts in flight while the returned [`Parts`] (or the joiner they
    /// move into) is held.
    ///
    /// A write to a file without an O_DIRECT descriptor (every byte goes through the page
    /// cache) stays one part: buffered writes to one file take its inode lock one at a
    /// time, so parts on several executors only queue for it, with more calls per byte.
    /// On an H100 one part wrote 16 MiB at 1 / 8 / 16 streams 1.14–1.33× as fast as
    /// parts over 14 executors, async and sync (A/B of the builds, two rounds,
    /// `benches/results/h100-2026-12-06-e/`).
    pub(crate) fn parts(
        &self,
        waiter: Waiter,
        direction: Direction,
        file: &FileHandle,
        file_offset_bytes: u64,
        len_bytes: u64,
    ) -> Parts {
        let most = self.request_parallelism.min(self.executors.len());
        let parallel = match self.busy_fan_out {
            Some(least) => {
                let idle = self.watches.iter().filter(|watch| watch.jobs_in_flight() == 0).count();
                fan_out_for_load(idle, least, most)
            }
            None => most,
        };
        let in_flight = match waiter {
            Waiter::Caller => InFlight::uncounted(),
            Waiter::Queue => InFlight::count(&self.queued_requests),
        };
        let parallel = fan_out(direction, file.direct_fd().is_some(), parallel);
        let under_load = match self.loaded_fan_out {
            Some(cap) if waiter == Waiter::Queue => {
                // Those in flight before this one.
                let before = self.queued_requests.load(Ordering::Relaxed).saturating_sub(1);
                fan_out_under_load(parallel, before, self.executors.len(), cap)
            }
            _ => parallel,
        };
        let granule = part_granule(self.chunk_bytes as u64);
        // Whether the cap split the request into fewer parts than it would be otherwise
        // (not a request of fewer chunks than the cap).
        let chunks = chunks_touched(file_offset_bytes, len_bytes, granule);
        let capped = (under_load as u64) < chunks.min(parallel as u64);
        if capped {
            EngineStats::add(&self.stats.requests_split_under_load, 1);
        }
        let list = split_into_parts(file_offset_bytes, len_bytes, granule, under_load);
        Parts::new(list, capped, in_flight)
    }

    /// The executors (indices for [`Engine::post`]) of a request's `parts`, `hint` being
    /// its stream's executor: one part stays there; several go to consecutive executors
    /// from it, or, with `HIPFILE_BUSY_FAN_OUT` or when the load capped them
    /// (`HIPFILE_LOADED_FAN_OUT`), to the idle executors first and then the least loaded
    /// ([`place_parts`]): a few parts from consecutive executors would leave the
    /// executors past them idle while the requests of a few streams wait on the rest.
    pub(crate) fn executors_for(&self, hint: usize, parts: &Parts) -> PartPlacement {
        let by_load = self.busy_fan_out.is_some() || parts.placed_by_load();
        let parts = parts.len();
        if !by_load || parts <= 1 {
            return PartPlacement::FromHint(hint);
        }
        let loads = self.jobs_in_flight_by_executor();
        PartPlacement::Placed(place_parts(&loads, hint % loads.len().max(1), parts))
    }
}

/// Where a request's parts go ([`Engine::executors_for`]): consecutive executors from a
/// hint (no allocation on the default path), or executors chosen by load.
pub(crate) enum PartPlacement {
    FromHint(usize),
    Placed(Vec<usize>),
}

impl PartPlacement {
    /// The executor of part `index` (for [`Engine::post`], which takes it modulo the count).
    pub(crate) fn executor(&self, index: usize) -> usize {
        match self {
            PartPlacement::FromHint(hint) => hint + index,
            PartPlacement::Placed(executors) => executors[index],
        }
    }
}

/// A synchronous request for [`Engine::run_sync`].
pub(crate) struct SyncRequest {
    pub(crate) file: Arc<FileHandle>,
    pub(crate) direction: Direction,
    pub(crate) file_offset_bytes: u64,
    pub(crate) device_addr: u64,
    pub(crate) len_bytes: u64,
    pub(crate) device_ordinal: u32,
    pub(crate) executor_hint: usize,
}

impl Drop for Engine {
    fn drop(&mut self) {
        let threads: Vec<_> = self
            .executors
            .drain(..)
            .filter_map(|mut link| {
                drop(link.sender);
                link.thread.take()
            })
            .collect();
        for thread in threads {
            thread.join();
        }
    }
}

/// Raises RLIMIT_MEMLOCK's soft limit to the hard limit: each executor registers its
/// arena with io_uring (charged to the limit unless the process has CAP_IPC_LOCK).
/// Prints one clear warning when the limit stays below what the arenas need.
fn raise_memlock_limit(config: &Config) {
    let needed_bytes = 3 * config.staging_per_executor_bytes * config.executor_cpus.len();
    match crate::sys::raise_memlock_to_hard_limit() {
        Ok(limit_bytes) if limit_bytes >= needed_bytes as u64 => {}
        Ok(limit_bytes) if crate::sys::has_ipc_lock_capability() => {
            let _ = limit_bytes;
        }
        Ok(limit_bytes) => log::warn!(
            "RLIMIT_MEMLOCK is {limit_bytes} bytes but the staging arenas need \
             {needed_bytes} (3 x HIPFILE_STAGING_MB x executors); io_uring buffer registration \
             may fail and I/O will use slower unregistered buffers. Raise it (ulimit -l) or \
             lower HIPFILE_STAGING_MB / HIPFILE_THREADS."
        ),
        Err(error) => log::warn!("cannot read RLIMIT_MEMLOCK: {error}"),
    }
}
