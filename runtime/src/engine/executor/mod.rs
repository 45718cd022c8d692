//! One executor: a glommio `LocalExecutor` pinned to a core, its staging arena, its
//! internal device streams, its open files, and the chunk pipelines that move data.
//!
//! - this module: start, the run loop, jobs from start to completion, teardown;
//! - [`arena`]: finding and registering the staging arena;
//! - [`files`]: the executor's descriptors per registered file;
//! - [`read`] and [`write`](mod@write): the chunk pipelines;
//! - [`copies`]: device copies in flight and waiting for them without blocking;
//! - [`event_order`]: what the order of a stream's events tells about them.

mod arena;
mod copies;
mod event_order;
mod files;
mod read;
mod write;

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use glommio::io::DmaFile;
use glommio::{LocalExecutorBuilder, Placement, PoolPlacement};
use hipfile_core::{
    BufferSpan, DioAlignment, Direction, OpError, Outcome, PlanConfig, RawIo, StreamFlags, validate,
};

use super::queue::{JobReceiver, Received};
use super::staging::{Arena, FallbackChunk, FallbackPool, StagingBudget};
use super::watch::{ExecutorWatch, JobStep};
use super::{EnginePhaseCounters, EngineStats, IoJob, Phase};
use crate::device::{Device, DeviceError, InternalStream};
use crate::fault::{Fault, Site};
use crate::file::FileHandle;
use copies::InFlightCopy;
use files::{FileEntry, OpenFiles};

/// Everything an executor thread needs, moved into it at start.
pub(super) struct Setup {
    pub(crate) index: usize,
    pub(crate) cpu: usize,
    /// Internal streams made when the engine started, by device ordinal.
    pub(crate) streams: Vec<(u32, InternalStream)>,
    pub(crate) device: Arc<dyn Device>,
    pub(crate) fallback: Arc<FallbackPool>,
    pub(crate) stats: Arc<EngineStats>,
    pub(crate) chunk_bytes: usize,
    pub(crate) arena_bytes: usize,
    pub(crate) chunks_in_flight: usize,
    /// How long a copy's completion is polled by yielding before sleeps (`HIPFILE_COPY_SPIN_US`).
    pub(crate) copy_spin: std::time::Duration,
    pub(crate) page_bytes: u64,
    /// How long to keep polling after the last work before parking; zero: park at once
    /// (`Config::park_spin_us_on`, `HIPFILE_PARK_SPIN_US`).
    pub(crate) park_spin: std::time::Duration,
    /// How page-cache chunks are written.
    pub(crate) buffered_writes: crate::config::BufferedWrites,
    pub(crate) receiver: JobReceiver,
    /// Told once the executor runs (its io_uring and arena are set up).
    pub(crate) ready: flume::Sender<()>,
    /// Where its jobs are (the pending report).
    pub(crate) watch: Arc<ExecutorWatch>,
}

thread_local! {
    /// The watch of the executor running on this thread, set when it starts: counts the
    /// blocking calls of [`off_reactor`], which is called from free functions too.
    static WATCH: std::cell::RefCell<Option<Arc<ExecutorWatch>>> =
        const { std::cell::RefCell::new(None) };
}

/// Spawns the executor thread.
pub(super) fn spawn(setup: Setup) -> glommio::Result<glommio::ExecutorJoinHandle<()>, ()> {
    let builder = LocalExecutorBuilder::new(Placement::Fixed(setup.cpu));
    let builder =
        if setup.park_spin.is_zero() { builder } else { builder.spin_before_park(setup.park_spin) };
    builder
        .name(&format!("{}{}", crate::executor_thread::EXECUTOR_THREAD_PREFIX, setup.index))
        .io_memory(setup.arena_bytes)
        // The thread of `off_reactor`: unbound, so that it never waits for the core of
        // an executor spinning before it parks (glommio's default binds it there).
        .blocking_thread_pool_placement(PoolPlacement::Unbound(1))
        .spawn(move || async move { Executor::new(setup).run().await })
}

struct Executor {
    setup: Setup,
    arena: Cell<Option<Arena>>,
    utility: RefCell<Option<DmaFile>>,
    /// The executor's internal stream per device ordinal, shared with the jobs that copy
    /// on it (an `Rc`: a stream is owned, and destroyed in `teardown`).
    streams: RefCell<HashMap<u32, Rc<InternalStream>>>,
    files: RefCell<HashMap<usize, FileEntry>>,
    probed_devices: RefCell<HashSet<(u32, u32)>>,
    /// Held while a device is probed ([`Executor::open_files`]).
    probe_lock: glommio::sync::Semaphore,
    active_jobs: Cell<usize>,
    /// When `active_jobs` last rose from zero.
    busy_since: Cell<Instant>,
    detached_copies: Cell<usize>,
    /// The order of the copy events on the executor's internal streams.
    event_order: RefCell<event_order::EventOrder>,
    /// Admission to the arena (see [`StagingBudget`]).
    staging_budget: StagingBudget,
}

/// Whether an io_uring read or write failed because io_uring cannot do it on this file,
/// not because of the file's data ([`super::transfer_refused`]: EOPNOTSUPP from
/// glommio's poll-ring misdetection, EINVAL from a file without `read_iter`/`write_iter`,
/// as `/proc/self/mem`, or one that rejects O_DIRECT). The blocking `pread`/`pwrite` on
/// the buffered descriptor then moves the chunk and reports the file's real errors (EIO
/// where `pread` gives EIO).
fn uring_refuses(errno: i32) -> bool {
    super::transfer_refused(errno)
}

impl Executor {
    fn new(mut setup: Setup) -> Rc<Executor> {
        let staging_budget = StagingBudget::new(setup.arena_bytes);
        let streams = std::mem::take(&mut setup.streams)
            .into_iter()
            .map(|(ordinal, stream)| (ordinal, Rc::new(stream)))
            .collect();
        Rc::new(Executor {
            setup,
            arena: Cell::new(None),
            utility: RefCell::new(None),
            streams: RefCell::new(streams),
            files: RefCell::new(HashMap::new()),
            probed_devices: RefCell::new(HashSet::new()),
            probe_lock: glommio::sync::Semaphore::new(1),
            active_jobs: Cell::new(0),
            busy_since: Cell::new(Instant::now()),
            detached_copies: Cell::new(0),
            event_order: RefCell::new(event_order::EventOrder::default()),
            staging_budget,
        })
    }

    async fn run(self: Rc<Self>) {
        WATCH.with(|watch| *watch.borrow_mut() = Some(Arc::clone(&self.setup.watch)));
        self.open_utility_file().await;
        let _ = self.setup.ready.send(());
        while let Some(request) = self.setup.receiver.recv_async().await {
            match request {
                Received::Io(job) => {
                    self.setup.watch.job_received();
                    let me = Rc::clone(&self);
                    if me.active_jobs.get() == 0 {
                        me.busy_since.set(Instant::now());
                    }
                    me.active_jobs.set(me.active_jobs.get() + 1);
                    glommio::spawn_local(async move {
                        me.run_job(job).await;
                        me.setup.watch.job_ended();
                        me.active_jobs.set(me.active_jobs.get() - 1);
                        if me.active_jobs.get() == 0 {
                            me.phases().add_since(Phase::Busy, me.busy_since.get());
                        }
                    })
                    .detach();
                }
                Received::Prune => self.prune_files(),
            }
        }
        while self.active_jobs.get() > 0 || self.detached_copies.get() > 0 {
            glommio::timer::sleep(Duration::from_millis(1)).await;
        }
        self.teardown();
    }

    fn teardown(&self) {
        for (ordinal, stream) in self.streams.borrow_mut().drain() {
            // Blocks, at shutdown only: every job has ended, and the internal stream
            // holds nothing but their last copies.
            let _ = self.setup.device.synchronize_internal(&stream);
            // Every job has finished (checked by `run`), so no job still holds the stream.
            match Rc::try_unwrap(stream) {
                Ok(stream) => self.setup.device.destroy_internal_stream(stream),
                Err(_) => log::warn!(
                    "executor {}: the internal stream of device {ordinal} is still shared at \
                     shutdown; leaked rather than destroyed while in use",
                    self.setup.index
                ),
            }
        }
        if let Some(arena) = self.arena.take() {
            // SAFETY: registered in `discover_arena`; every job and detached copy has
            // finished (checked by `run` before calling us), so no copy uses it.
            unsafe { self.setup.device.unregister_host(arena.base_addr() as *mut u8) };
        }
        self.files.borrow_mut().clear();
    }

    /// The executor's internal stream on `device_ordinal`: made when the engine started,
    /// or now if that failed.
    fn stream_for(&self, device_ordinal: u32) -> Result<Rc<InternalStream>, DeviceError> {
        if let Some(stream) = self.streams.borrow().get(&device_ordinal) {
            return Ok(Rc::clone(stream));
        }
        let stream = Rc::new(self.setup.device.create_internal_stream(device_ordinal)?);
        self.streams.borrow_mut().insert(device_ordinal, Rc::clone(&stream));
        Ok(stream)
    }

    /// The phase counters `hipfile-bench --profile` reads.
    fn phases(&self) -> &EnginePhaseCounters {
        &self.setup.stats.phases
    }

    async fn run_job(self: &Rc<Self>, job: IoJob) {
        let started = Instant::now();
        self.move_job(job).await;
        self.phases().add_since(Phase::Job, started);
    }

    async fn move_job(self: &Rc<Self>, mut job: IoJob) {
        if let Some(may_start) = job.may_start.take()
            && !may_start()
        {
            job.done.finish(Outcome::OsError(libc::ECANCELED), None, None);
            return;
        }
        let IoJob { file, guard, direction, file_offset_bytes, device_addr, len_bytes, .. } = &job;
        let range = JobRange {
            file_offset_bytes: *file_offset_bytes,
            device_addr: *device_addr,
            len_bytes: *len_bytes,
            host_memory: job.host_memory,
        };
        let _ = guard;
        // When a prefetched read's gate opened (`--profile`'s gate-to-copy/release).
        let gate_opened = std::cell::Cell::new(None);
        let result = match self.stream_for(job.device_ordinal) {
            Err(error) => Err((Outcome::Library(OpError::HipDriverError), Some(error))),
            Ok(stream) => match self.open_files(file).await {
                Err(error) => Err((os_outcome(&error), None)),
                Ok(files) => Ok((stream, files)),
            },
        };
        let (outcome, device_error, stream, copies) = match result {
            Err((outcome, device_error)) => (outcome, device_error, None, VecDeque::new()),
            Ok((stream, files)) => {
                let (outcome, device_error, copies) = match direction {
                    Direction::Read => {
                        let _step = self.setup.watch.step(JobStep::Read);
                        let gate = job.arm_gate.as_ref();
                        self.read_range(file, &files, &stream, range, gate, &gate_opened).await
                    }
                    Direction::Write => {
                        let _step = self.setup.watch.step(JobStep::Write);
                        self.write_range(file, &files, &stream, range).await
                    }
                };
                (outcome, device_error, Some(stream), copies)
            }
        };
        self.finish_job(job, outcome, device_error, stream, copies).await;
        if let Some(opened) = gate_opened.get() {
            self.phases().add_since(Phase::GateToRelease, opened);
        }
        self.prune_files();
    }

    async fn finish_job(
        self: &Rc<Self>,
        job: IoJob,
        outcome: Outcome,
        device_error: Option<DeviceError>,
        stream: Option<Rc<InternalStream>>,
        mut copies: VecDeque<InFlightCopy>,
    ) {
        if job.wait_for_copies {
            let waited = {
                let _step = self.setup.watch.step(JobStep::Finish);
                self.wait_all(&mut copies).await
            };
            let (outcome, device_error) = match (outcome, waited) {
                (Outcome::Bytes(_), Err(error)) => {
                    (Outcome::Library(OpError::HipDriverError), Some(error))
                }
                _ => (outcome, device_error),
            };
            job.done.finish(outcome, device_error, stream.as_deref());
        } else {
            job.done.finish(outcome, device_error, stream.as_deref());
            self.detach_copies(copies);
        }
        EngineStats::add(&self.setup.stats.jobs, 1);
        crate::stats::count_engine_job();
    }

    /// The chunks of `range` when its plan goes through the page cache alone (a job on
    /// host memory then moves it with one blocking call); `None` otherwise.
    fn page_cache_chunks(
        &self,
        files: &OpenFiles,
        file: &FileHandle,
        range: JobRange,
        direction: Direction,
    ) -> Option<usize> {
        let mut chunks = 0;
        for chunk in self.plan(files, file, range, direction).ok()? {
            if chunk.mode != hipfile_core::ChunkMode::Buffered {
                return None;
            }
            chunks += 1;
        }
        Some(chunks)
    }

    /// Accounts a job that one blocking `pread`/`pwrite` moved straight into or out of host
    /// memory since `started`, and turns its result into the job's outcome.
    fn host_memory_job_done(
        &self,
        file: &FileHandle,
        direction: Direction,
        started: Instant,
        chunks: usize,
        moved: io::Result<usize>,
    ) -> Outcome {
        let (phase, counter) = match direction {
            Direction::Read => (Phase::ReadWait, &self.setup.stats.host_memory_preads),
            Direction::Write => (Phase::WriteWait, &self.setup.stats.host_memory_pwrites),
        };
        self.phases().add_since(phase, started);
        EngineStats::add(counter, 1);
        for _ in 0..chunks {
            self.phases().count_chunk(direction);
        }
        match moved {
            Ok(bytes) => {
                file.record_bytes(direction, hipfile_core::ChunkMode::Buffered, bytes as u64);
                Outcome::Bytes(bytes as u64)
            }
            Err(error) => Outcome::OsError(os_errno(&error)),
        }
    }

    fn plan(
        &self,
        files: &OpenFiles,
        file: &FileHandle,
        range: JobRange,
        direction: Direction,
    ) -> Result<PlanIter, OpError> {
        let buffer = BufferSpan { base_addr: range.device_addr, len_bytes: range.len_bytes.max(1) };
        let raw = RawIo {
            size_bytes: range.len_bytes,
            file_offset_bytes: i64::try_from(range.file_offset_bytes)
                .map_err(|_| OpError::InvalidValue)?,
            buffer_offset_bytes: 0,
        };
        let io = validate(raw, buffer, StreamFlags::empty(), 4096)?;
        // Direct and buffered chunks never share a page: a page the buffered path dirties
        // next to an O_DIRECT write makes the kernel fail its page-cache invalidation
        // (and the next fsync of the file report EIO).
        let page_bytes = self.setup.page_bytes;
        // A read of a range the page cache holds entirely is a memory copy there, and a
        // trip to the device through O_DIRECT (FileHandle::read_hits_page_cache).
        let cached_read = direction == Direction::Read
            && file.read_hits_page_cache(range.file_offset_bytes, range.len_bytes);
        let dio = if files.direct.is_some() && !files.uring_refused.get() {
            file.dio_alignment().map(|d| DioAlignment {
                offset_bytes: d.offset_bytes.max(page_bytes),
                memory_bytes: d.memory_bytes,
            })
        } else {
            None
        };
        if let Some(dio) = dio {
            let end = range.file_offset_bytes + range.len_bytes;
            let aligned = |at: u64| at.is_multiple_of(dio.offset_bytes);
            if !aligned(range.file_offset_bytes) || !aligned(end) {
                file.note_unaligned_request(range.file_offset_bytes, range.len_bytes);
            }
        }
        let dio = dio.filter(|_| !cached_read);
        let config = PlanConfig::new(self.setup.chunk_bytes as u64, dio, 4096)?;
        Ok(config.plan(&io))
    }

    /// A fallback chunk, waiting (timer sleeps, growing) while the pool has none free.
    /// Callers wait only while their job holds no fallback chunk that it alone would give
    /// back (`read::read_blocking`, `read::pinned_staging`, `write::stage_from_device`).
    async fn take_fallback(&self) -> Result<FallbackChunk, DeviceError> {
        if let Some(chunk) = self.setup.fallback.try_take()? {
            return Ok(chunk);
        }
        let started = Instant::now();
        let mut backoff_us = 5;
        let mut waited = false;
        loop {
            if let Some(chunk) = self.setup.fallback.try_take()? {
                self.phases().add_since(Phase::StagingWait, started);
                return Ok(chunk);
            }
            if !waited {
                waited = true;
                EngineStats::add(&self.setup.stats.fallback_waits, 1);
            }
            glommio::timer::sleep(Duration::from_micros(backoff_us)).await;
            backoff_us = (backoff_us * 2).min(1000);
        }
    }
}

type PlanIter = hipfile_core::ChunkPlan;

#[derive(Clone, Copy)]
struct JobRange {
    file_offset_bytes: u64,
    device_addr: u64,
    len_bytes: u64,
    /// Reads land here, writes come from here, instead of `device_addr`
    /// ([`IoJob::host_memory`]).
    host_memory: Option<crate::engine::HostMemory>,
}

/// The errno behind a glommio error (its conversion to io::Error drops the OS code of
/// the "enhanced" variant).
fn glommio_errno<T>(error: glommio::GlommioError<T>) -> i32 {
    match error {
        glommio::GlommioError::EnhancedIoError { source, .. } => os_errno(&source),
        glommio::GlommioError::IoError(source) => os_errno(&source),
        other => os_errno(&io::Error::from(other)),
    }
}

fn os_errno(error: &io::Error) -> i32 {
    error.raw_os_error().unwrap_or(libc::EIO)
}

pub(super) fn os_outcome(error: &io::Error) -> Outcome {
    Outcome::OsError(os_errno(error))
}

/// Runs a blocking file call (`pread`/`pwrite` where io_uring cannot serve a chunk,
/// creating the poll probe's file) on the executor's blocking thread (glommio's pool:
/// one unbound thread per executor, see [`spawn`]), so that the reactor goes on serving
/// every other job meanwhile. `work` must own the memory it reads or writes (moved in and
/// handed back), never borrow it: if the awaiting task were dropped, the call would
/// still run to its end.
async fn off_reactor<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    let watch = WATCH.with(|watch| watch.borrow().clone());
    let _call = watch.as_deref().map(ExecutorWatch::blocking_call);
    glommio::executor().spawn_blocking(work).await
}

/// An injected fault (crate::fault) at a chunk's io_uring read or write: the errno it
/// fails with (taken as io_uring's own answer: EINVAL or EOPNOTSUPP is a refusal), a delay
/// before it, or `true` for a read that moves short (it keeps its first half: see
/// `read::shortened`); interrupted transfers and short writes are left to the
/// `pread`/`pwrite` sites.
async fn injected_chunk_fault(site: Site) -> Result<bool, i32> {
    match crate::fault::at(site) {
        Some(Fault::Errno(errno)) => Err(errno),
        Some(Fault::Delay(delay)) => {
            glommio::timer::sleep(delay).await;
            Ok(false)
        }
        Some(Fault::Short) => Ok(site == Site::ChunkRead),
        _ => Ok(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A blocking call made through [`off_reactor`] runs on another thread while the
    /// executor's other tasks go on (with the pool placement [`spawn`] uses).
    #[test]
    fn a_blocking_call_off_the_reactor_leaves_the_reactor_running() {
        let spawned = LocalExecutorBuilder::new(Placement::Unbound)
            .blocking_thread_pool_placement(PoolPlacement::Unbound(1))
            .spawn(|| async {
                let ticks = Rc::new(Cell::new(0u32));
                let counter = Rc::clone(&ticks);
                glommio::spawn_local(async move {
                    loop {
                        glommio::timer::sleep(Duration::from_millis(1)).await;
                        counter.set(counter.get() + 1);
                    }
                })
                .detach();
                let reactor = std::thread::current().id();
                let elsewhere = off_reactor(move || {
                    std::thread::sleep(Duration::from_millis(100));
                    std::thread::current().id() != reactor
                })
                .await;
                (ticks.get(), elsewhere)
            });
        // Without io_uring (a seccomp profile) glommio cannot start: nothing to check.
        let Ok(executor) = spawned else { return };
        let (ticks, elsewhere) = executor.join().expect("executor");
        assert!(elsewhere, "the blocking call ran on the reactor's thread");
        assert!(ticks >= 5, "the reactor ran {ticks} timer ticks during a 100 ms blocking call");
    }
}
