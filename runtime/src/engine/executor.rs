//! One executor: a glommio `LocalExecutor` pinned to a core, its staging arena, its
//! internal device streams, its open files, and the chunk pipelines that move data.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::sync::{Arc, Weak};
use std::time::Duration;

use glommio::io::{DmaBuffer, DmaFile, OpenOptions, ReadResult};
use glommio::{LocalExecutorBuilder, Placement, Task};
use hipfile_core::{
    BufferSpan, Chunk, ChunkMode, DioAlignment, Direction, OpError, Outcome, PlanConfig, RawIo,
    StreamFlags, validate,
};

use super::staging::{Arena, FallbackChunk, FallbackPool, StagingBudget, StagingShare};
use super::{EngineStats, IoJob, Request};
use crate::device::{Device, DeviceError, EventHandle, InternalStream};
use crate::fault::{Fault, Site};
use crate::file::{FileHandle, pread_full, pwrite_full};
use crate::sys;

/// Everything an executor thread needs, moved into it at start.
pub(super) struct Setup {
    pub index: usize,
    pub cpu: usize,
    pub device: Arc<dyn Device>,
    pub fallback: Arc<FallbackPool>,
    pub stats: Arc<EngineStats>,
    pub chunk_bytes: usize,
    pub arena_bytes: usize,
    pub chunks_in_flight: usize,
    pub page_bytes: u64,
    /// Spin before parking ([`spare_cores_for_spinning`]).
    pub spin: bool,
    pub receiver: flume::Receiver<Request>,
    /// Told once the executor runs (its io_uring and arena are set up).
    pub ready: flume::Sender<()>,
}

/// How long an executor keeps polling after its last work before it parks: a job posted
/// within it starts without the park/wake-up round trip (~7 µs of the 21 µs hop,
/// shared/reference/glommio.md); an idle executor parks, costing no CPU.
const SPIN_BEFORE_PARK: std::time::Duration = std::time::Duration::from_micros(50);

/// Whether the machine has cores to spare for spinning threads besides `executors`
/// executors (two more: the arm poller and the application). Without them, a spinning
/// thread takes CPU from the work it waits for.
pub(crate) fn spare_cores_for_spinning(executors: usize) -> bool {
    std::thread::available_parallelism().is_ok_and(|cores| cores.get() >= executors + 2)
}

/// Spawns the executor thread.
pub(super) fn spawn(setup: Setup) -> glommio::Result<glommio::ExecutorJoinHandle<()>, ()> {
    let builder = LocalExecutorBuilder::new(Placement::Fixed(setup.cpu));
    let builder = if setup.spin { builder.spin_before_park(SPIN_BEFORE_PARK) } else { builder };
    builder
        .name(&format!("{}{}", super::EXECUTOR_THREAD_PREFIX, setup.index))
        .io_memory(setup.arena_bytes)
        .spawn(move || async move { Executor::new(setup).run().await })
}

/// What a chunk's bytes sit in while the device copies them.
enum Staging {
    /// A glommio read result, inside the registered arena.
    Read(ReadResult),
    /// A pinned fallback chunk.
    Fallback(FallbackChunk),
}

/// A chunk read in flight: the chunk, its share of the arena, the read.
type ChunkRead = (Chunk, StagingShare, Task<Result<Staging, i32>>);

/// A device copy in flight and the staging it reads or writes.
struct InFlightCopy {
    event: EventHandle,
    _staging: Staging,
    /// The staging's share of the arena, given back with it.
    _share: StagingShare,
}

/// The executor's descriptors for one registered file.
struct OpenFiles {
    /// `None` when glommio cannot open the file (it opens with O_DIRECT, which some
    /// files refuse with EINVAL): every chunk then goes through blocking I/O.
    buffered: Option<DmaFile>,
    direct: Option<DmaFile>,
    /// io_uring refused this file (glommio's poll-ring misdetection): use blocking I/O.
    uring_refused: Cell<bool>,
}

struct FileEntry {
    handle: Weak<FileHandle>,
    files: Rc<OpenFiles>,
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
    active_jobs: Cell<usize>,
    detached_copies: Cell<usize>,
    /// Admission to the arena (see [`StagingBudget`]).
    staging_budget: StagingBudget,
}

const EOPNOTSUPP: i32 = libc::EOPNOTSUPP;

/// Whether an io_uring read or write failed because io_uring cannot do it on this file,
/// not because of the file's data: EOPNOTSUPP (glommio's poll-ring misdetection) or
/// EINVAL (a file without `read_iter`/`write_iter`, as `/proc/self/mem`, or one that
/// rejects O_DIRECT). The blocking `pread`/`pwrite` on the buffered descriptor then
/// moves the chunk and reports the file's real errors (EIO where `pread` gives EIO).
fn uring_refuses(errno: i32) -> bool {
    errno == EOPNOTSUPP || errno == libc::EINVAL
}

impl Executor {
    fn new(setup: Setup) -> Rc<Executor> {
        let staging_budget = StagingBudget::new(setup.arena_bytes);
        Rc::new(Executor {
            setup,
            arena: Cell::new(None),
            utility: RefCell::new(None),
            streams: RefCell::new(HashMap::new()),
            files: RefCell::new(HashMap::new()),
            probed_devices: RefCell::new(HashSet::new()),
            active_jobs: Cell::new(0),
            detached_copies: Cell::new(0),
            staging_budget,
        })
    }

    async fn run(self: Rc<Self>) {
        self.open_utility_file().await;
        let _ = self.setup.ready.send(());
        while let Ok(request) = self.setup.receiver.recv_async().await {
            match request {
                Request::Io(job) => {
                    let me = Rc::clone(&self);
                    me.active_jobs.set(me.active_jobs.get() + 1);
                    glommio::spawn_local(async move {
                        me.run_job(job).await;
                        me.active_jobs.set(me.active_jobs.get() - 1);
                    })
                    .detach();
                }
                Request::Prune => self.prune_files(),
            }
        }
        while self.active_jobs.get() > 0 || self.detached_copies.get() > 0 {
            glommio::timer::sleep(Duration::from_millis(1)).await;
        }
        self.teardown();
    }

    /// Opens an anonymous file on tmpfs (no O_DIRECT, so glommio runs no poll probe) to
    /// allocate DMA buffers from, and finds and registers the arena with it.
    async fn open_utility_file(&self) {
        let opened =
            OpenOptions::new().read(true).write(true).tmpfile(true).dma_open("/dev/shm").await;
        if let Ok(file) = opened {
            self.discover_arena(&file);
            *self.utility.borrow_mut() = Some(file);
        }
    }

    /// On a fresh arena, allocating half of it returns the first byte it hands out
    /// (glommio's buddy allocator); verified by a second allocation landing inside the
    /// range.
    ///
    /// The range registered is only bytes the arena owns: glommio allocates
    /// `arena_bytes` page-aligned and the buddy allocator keeps its bookkeeping in the
    /// first page(s), so the first byte handed out is at least [`ARENA_PAGE_BYTES`] past
    /// the allocation's start and the allocation ends at most `arena_bytes -
    /// ARENA_PAGE_BYTES` past that byte. Registering `arena_bytes` from it would pin the
    /// page after the arena, which belongs to someone else (a copy from it would then be
    /// taken for staging, and on CUDA `cuMemHostRegister` would pin a foreign page).
    fn discover_arena(&self, file: &DmaFile) {
        if self.arena.get().is_some() {
            return;
        }
        let Some(len_bytes) = arena_usable_bytes(self.setup.arena_bytes) else {
            return;
        };
        let half = file.alloc_dma_buffer(self.setup.arena_bytes / 2);
        let base_addr = half.as_ptr() as usize;
        drop(half);
        let probe = file.alloc_dma_buffer(4096);
        let arena = Arena::new(base_addr, len_bytes);
        let inside = arena.contains(probe.as_ptr() as usize, 4096);
        drop(probe);
        if !inside {
            return;
        }
        // SAFETY: the arena is glommio's io_memory allocation for this executor, which
        // lives as long as the executor; we unregister it in `teardown` after every copy
        // using it has completed.
        let registered =
            unsafe { self.setup.device.register_host(base_addr as *mut u8, len_bytes) };
        if registered.is_ok() {
            self.arena.set(Some(arena));
        }
    }

    fn teardown(&self) {
        for (ordinal, stream) in self.streams.borrow_mut().drain() {
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

    fn prune_files(&self) {
        self.files.borrow_mut().retain(|_, entry| entry.handle.strong_count() > 0);
    }

    /// The executor's internal stream on `device_ordinal`, created on first use.
    fn stream_for(&self, device_ordinal: u32) -> Result<Rc<InternalStream>, DeviceError> {
        if let Some(stream) = self.streams.borrow().get(&device_ordinal) {
            return Ok(Rc::clone(stream));
        }
        let stream = Rc::new(self.setup.device.create_internal_stream(device_ordinal)?);
        self.streams.borrow_mut().insert(device_ordinal, Rc::clone(&stream));
        Ok(stream)
    }

    async fn run_job(self: &Rc<Self>, mut job: IoJob) {
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
        };
        let _ = guard;
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
                        self.read_range(file, &files, &stream, range, job.arm_gate.as_ref()).await
                    }
                    Direction::Write => self.write_range(file, &files, &stream, range).await,
                };
                (outcome, device_error, Some(stream), copies)
            }
        };
        self.finish_job(job, outcome, device_error, stream, copies).await;
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
            let waited = self.wait_all(&mut copies).await;
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

    /// Keeps staging alive until the device is done with it, off the job's path.
    fn detach_copies(self: &Rc<Self>, mut copies: VecDeque<InFlightCopy>) {
        if copies.is_empty() {
            return;
        }
        let me = Rc::clone(self);
        me.detached_copies.set(me.detached_copies.get() + 1);
        glommio::spawn_local(async move {
            let _ = me.wait_all(&mut copies).await;
            me.detached_copies.set(me.detached_copies.get() - 1);
        })
        .detach();
    }

    async fn open_files(&self, file: &Arc<FileHandle>) -> io::Result<Rc<OpenFiles>> {
        let key = Arc::as_ptr(file) as usize;
        if let Some(entry) = self.files.borrow().get(&key)
            && entry.handle.upgrade().is_some_and(|live| Arc::ptr_eq(&live, file))
        {
            return Ok(Rc::clone(&entry.files));
        }
        self.probe_device_once(file).await;
        let mut options = OpenOptions::new();
        options.read(file.can_read()).write(file.can_write());
        let buffered = match options.dma_open(proc_fd_path(file.buffered_fd())).await {
            Ok(buffered) => {
                sys::clear_o_direct(buffered.as_raw_fd())?;
                Some(buffered)
            }
            Err(error) => match glommio_errno(error) {
                errno if uring_refuses(errno) => None,
                errno => return Err(io::Error::from_raw_os_error(errno)),
            },
        };
        let direct = match (&buffered, file.direct_fd()) {
            (Some(_), Some(fd)) => options.dma_open(proc_fd_path(fd)).await.ok(),
            _ => None,
        };
        if self.arena.get().is_none()
            && let Some(buffered) = &buffered
        {
            self.discover_arena(buffered);
        }
        let uring_refused = Cell::new(buffered.is_none());
        let files = Rc::new(OpenFiles { buffered, direct, uring_refused });
        let entry = FileEntry { handle: Arc::downgrade(file), files: Rc::clone(&files) };
        self.files.borrow_mut().insert(key, entry);
        Ok(files)
    }

    /// glommio 0.9 decides once per device and thread whether the poll ring works, by
    /// reading the first block of the first O_DIRECT file it opens there; an empty file
    /// (or a hole) makes it answer "yes" wrongly, and every later read then fails with
    /// EOPNOTSUPP. Before the first open on a device we let glommio probe a non-empty
    /// anonymous file in the same directory instead. If that cannot be created, reads
    /// that io_uring refuses are redone with blocking I/O (correct, slower).
    async fn probe_device_once(&self, file: &FileHandle) {
        let device_id = file.device_id();
        if !self.probed_devices.borrow_mut().insert(device_id) {
            return;
        }
        // Always probe a file we know has data: the user's file may be empty, start with
        // a hole, or be growing under a parallel write, and each of those fools the probe.
        if let Some(probe) = NonEmptyTmpFile::beside(file.buffered_fd()) {
            let _ = OpenOptions::new().read(true).dma_open(proc_fd_path(probe.fd())).await;
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

    async fn read_range(
        self: &Rc<Self>,
        file: &Arc<FileHandle>,
        files: &Rc<OpenFiles>,
        stream: &InternalStream,
        range: JobRange,
        mut arm_gate: Option<&flume::Receiver<bool>>,
    ) -> (Outcome, Option<DeviceError>, VecDeque<InFlightCopy>) {
        let mut copies = VecDeque::new();
        let chunks = match self.plan(files, file, range, Direction::Read) {
            Ok(plan) => plan,
            Err(code) => return (Outcome::Library(code), None, copies),
        };
        let depth = self.setup.chunks_in_flight.max(1);
        let mut chunks = chunks.peekable();
        let mut reads: VecDeque<ChunkRead> = VecDeque::new();
        let mut total_bytes = 0u64;
        let mut stop = false;
        let mut failure: Option<(Outcome, Option<DeviceError>)> = None;
        loop {
            while !stop && reads.len() < depth {
                let Some(&chunk) = chunks.peek() else { break };
                let len = chunk.len_bytes as usize;
                let share = if arm_gate.is_some() {
                    self.staging_budget.take_for_prefetch(len)
                } else {
                    let holds_none = reads.is_empty() && copies.is_empty();
                    self.staging_budget.take(len, holds_none).await
                };
                let Some(share) = share else { break };
                chunks.next();
                reads.push_back((chunk, share, self.spawn_chunk_read(files, file, chunk)));
            }
            let Some((chunk, share, task)) = reads.pop_front() else {
                if stop || chunks.peek().is_none() {
                    break;
                }
                // No read in flight and no free share for the next chunk. A prefetch waits
                // until the stream reaches the op, then reads as a reached op; a reached op
                // waits for its oldest copy, which gives its share back.
                if let Some(gate) = arm_gate.take() {
                    if gate.recv_async().await != Ok(true) {
                        failure = Some((Outcome::Library(OpError::InternalError), None));
                        stop = true;
                    }
                } else if let Err(error) = {
                    let in_flight = copies.len();
                    self.reap(&mut copies, in_flight).await
                } {
                    failure = Some((Outcome::Library(OpError::HipDriverError), Some(error)));
                    stop = true;
                }
                continue;
            };
            let result = task.await;
            if stop {
                continue;
            }
            match result {
                Err(errno) => {
                    failure = Some((Outcome::OsError(errno), None));
                    stop = true;
                }
                Ok(staging) => {
                    let got = staging_len(&staging).min(chunk.len_bytes as usize);
                    file.record_bytes(Direction::Read, chunk.mode, got as u64);
                    if let Some(gate) = arm_gate.take()
                        && gate.recv_async().await != Ok(true)
                    {
                        failure = Some((Outcome::Library(OpError::InternalError), None));
                        stop = true;
                        continue;
                    }
                    if got > 0 {
                        let target = range.device_addr + chunk.op_offset_bytes;
                        let staging = match self.pinned_staging(staging, got, &mut copies).await {
                            Ok(staging) => staging,
                            Err(error) => {
                                failure =
                                    Some((Outcome::Library(OpError::HipDriverError), Some(error)));
                                stop = true;
                                continue;
                            }
                        };
                        match self.copy_to_device(stream, target, staging, share, got) {
                            Ok(copy) => copies.push_back(copy),
                            Err(error) => {
                                failure =
                                    Some((Outcome::Library(OpError::HipDriverError), Some(error)));
                                stop = true;
                                continue;
                            }
                        }
                    }
                    total_bytes += got as u64;
                    stop |= (got as u64) < chunk.len_bytes;
                }
            }
            if let Err(error) = self.reap(&mut copies, depth).await {
                failure.get_or_insert((Outcome::Library(OpError::HipDriverError), Some(error)));
                stop = true;
            }
        }
        // A prefetching op publishes only after the stream reached it, whatever happened.
        if let Some(gate) = arm_gate.take() {
            let _ = gate.recv_async().await;
        }
        match failure {
            Some((outcome, device_error)) => (outcome, device_error, copies),
            None => (Outcome::Bytes(total_bytes), None, copies),
        }
    }

    fn spawn_chunk_read(
        self: &Rc<Self>,
        files: &Rc<OpenFiles>,
        file: &Arc<FileHandle>,
        chunk: Chunk,
    ) -> Task<Result<Staging, i32>> {
        let me = Rc::clone(self);
        let files = Rc::clone(files);
        let file = Arc::clone(file);
        glommio::spawn_local(async move { me.read_chunk(&files, &file, chunk).await })
    }

    async fn read_chunk(
        &self,
        files: &OpenFiles,
        file: &FileHandle,
        chunk: Chunk,
    ) -> Result<Staging, i32> {
        let len = chunk.len_bytes as usize;
        if !files.uring_refused.get()
            && let Some(buffered) = &files.buffered
        {
            let dma = match (chunk.mode, &files.direct) {
                (ChunkMode::Direct, Some(direct)) => direct,
                _ => buffered,
            };
            injected_chunk_fault(Site::ChunkRead).await?;
            match dma.read_at_aligned(chunk.file_offset_bytes, len).await {
                Ok(result) => return self.complete_short_read(files, file, chunk, result).await,
                Err(error) => {
                    let errno = glommio_errno(error);
                    if !uring_refuses(errno) {
                        return Err(errno);
                    }
                    files.uring_refused.set(true);
                }
            }
        }
        EngineStats::add(&self.setup.stats.sync_retry_chunks, 1);
        crate::stats::count_sync_retry_chunk();
        let staging = self.take_fallback().await.map_err(|_| libc::ENOMEM)?;
        let fd = file.buffered_fd();
        // SAFETY: the fallback chunk is `chunk_bytes` long, >= len, and exclusively ours.
        let target = unsafe { std::slice::from_raw_parts_mut(staging.as_mut_ptr(), len) };
        let got = pread_full(fd, target, chunk.file_offset_bytes).map_err(|e| os_errno(&e))?;
        Ok(Staging::Fallback(staging.with_valid_len(got)))
    }

    /// io_uring may return fewer bytes than asked before EOF (rare for files); finish the
    /// chunk with a blocking read of the rest into fallback staging in that case.
    async fn complete_short_read(
        &self,
        _files: &OpenFiles,
        file: &FileHandle,
        chunk: Chunk,
        result: ReadResult,
    ) -> Result<Staging, i32> {
        let got = result.len();
        if got == 0 || got >= chunk.len_bytes as usize {
            return Ok(Staging::Read(result));
        }
        let size = file.size_bytes().map_err(|e| os_errno(&e))?;
        if chunk.file_offset_bytes + got as u64 >= size {
            return Ok(Staging::Read(result));
        }
        let staging = self.take_fallback().await.map_err(|_| libc::ENOMEM)?;
        let len = chunk.len_bytes as usize;
        // SAFETY: the fallback chunk holds `chunk_bytes` >= len bytes and is ours alone;
        // `result` holds `got` readable bytes.
        let target = unsafe {
            sys::copy_bytes(staging.as_mut_ptr(), result.as_ptr(), got);
            std::slice::from_raw_parts_mut(staging.as_mut_ptr().add(got), len - got)
        };
        let rest = pread_full(file.buffered_fd(), target, chunk.file_offset_bytes + got as u64)
            .map_err(|e| os_errno(&e))?;
        Ok(Staging::Fallback(staging.with_valid_len(got + rest)))
    }

    async fn take_fallback(&self) -> Result<FallbackChunk, DeviceError> {
        let mut backoff_us = 5;
        loop {
            if let Some(chunk) = self.setup.fallback.try_take()? {
                return Ok(chunk);
            }
            glommio::timer::sleep(Duration::from_micros(backoff_us)).await;
            backoff_us = (backoff_us * 2).min(1000);
        }
    }

    /// Returns staging the device may copy from: arena or fallback memory as is; other
    /// memory (glommio's heap, when the arena is full) copied into a fallback chunk,
    /// waiting for this job's own copies to finish when the pool is exhausted.
    async fn pinned_staging(
        &self,
        staging: Staging,
        len: usize,
        copies: &mut VecDeque<InFlightCopy>,
    ) -> Result<Staging, DeviceError> {
        let source = staging_ptr(&staging);
        let in_arena = self.arena.get().is_some_and(|a| a.contains(source as usize, len));
        if in_arena || matches!(staging, Staging::Fallback(_)) {
            return Ok(staging);
        }
        let chunk = match self.setup.fallback.try_take()? {
            Some(chunk) => chunk,
            None => {
                self.reap(copies, 1).await?;
                self.take_fallback().await?
            }
        };
        // SAFETY: `staging` holds `len` readable bytes; the chunk is ours and larger.
        unsafe { sys::copy_bytes(chunk.as_mut_ptr(), source, len) };
        Ok(Staging::Fallback(chunk.with_valid_len(len)))
    }

    /// Enqueues the copy of `len` pinned staged bytes to the device.
    fn copy_to_device(
        &self,
        stream: &InternalStream,
        target: u64,
        staging: Staging,
        share: StagingShare,
        len: usize,
    ) -> Result<InFlightCopy, DeviceError> {
        let device = &*self.setup.device;
        let counter = match staging {
            Staging::Fallback(_) => {
                crate::stats::count_fallback_chunk();
                &self.setup.stats.fallback_chunks
            }
            Staging::Read(_) => &self.setup.stats.arena_chunks,
        };
        EngineStats::add(counter, 1);
        crate::fault::device_fault(Site::DeviceCopy)?;
        // SAFETY: the staging (arena or pinned fallback chunk) holds `len` bytes and is
        // kept alive in the returned InFlightCopy until the event completes; `target`
        // lies in the job's validated device range.
        unsafe { device.copy_to_device_async(stream, target, staging_ptr(&staging), len)? };
        match crate::fault::device_fault(Site::DeviceEvent)
            .and_then(|()| device.record_event(stream))
        {
            Ok(event) => Ok(InFlightCopy { event, _staging: staging, _share: share }),
            Err(error) => {
                self.settle_unrecorded_copy(stream, (staging, share));
                Err(error)
            }
        }
    }

    async fn write_range(
        self: &Rc<Self>,
        file: &Arc<FileHandle>,
        files: &Rc<OpenFiles>,
        stream: &InternalStream,
        range: JobRange,
    ) -> (Outcome, Option<DeviceError>, VecDeque<InFlightCopy>) {
        // Direct chunks first, buffered head and tail after them and never at the same
        // time (see `plan`): the page cache then never holds dirty pages of a range an
        // O_DIRECT write of this op is about to invalidate.
        let mut chunks = match self.plan(files, file, range, Direction::Write) {
            Ok(plan) => {
                let (direct, buffered): (VecDeque<_>, VecDeque<_>) =
                    plan.partition(|c| c.mode == ChunkMode::Direct);
                direct.into_iter().chain(buffered).collect::<VecDeque<_>>()
            }
            Err(code) => return (Outcome::Library(code), None, VecDeque::new()),
        };
        let depth = self.setup.chunks_in_flight.max(1);
        let mut staged: VecDeque<(Chunk, EventHandle, WriteStaging, StagingShare)> =
            VecDeque::new();
        let mut writes: VecDeque<(Chunk, Task<Result<usize, i32>>)> = VecDeque::new();
        let mut written = Written::default();
        let mut failure: Option<(Outcome, Option<DeviceError>)> = None;
        loop {
            while failure.is_none() && staged.len() < depth {
                let Some(&chunk) = chunks.front() else { break };
                let holds_none = staged.is_empty() && writes.is_empty();
                let len = chunk.len_bytes as usize;
                let Some(share) = self.staging_budget.take(len, holds_none).await else { break };
                chunks.pop_front();
                match self
                    .stage_from_device(
                        files,
                        stream,
                        range.device_addr + chunk.op_offset_bytes,
                        chunk,
                    )
                    .await
                {
                    Ok((event, staging)) => staged.push_back((chunk, event, staging, share)),
                    Err(error) => {
                        failure = Some((Outcome::Library(OpError::HipDriverError), Some(error)))
                    }
                }
            }
            if let Some((chunk, event, staging, share)) = staged.pop_front() {
                let waited = self.wait_event(&event).await;
                self.setup.device.destroy_event(event);
                if let (Err(error), None) = (waited, &failure) {
                    failure = Some((Outcome::Library(OpError::HipDriverError), Some(error)));
                }
                let mode_switch = writes.back().is_some_and(|(c, _)| c.mode != chunk.mode);
                if mode_switch {
                    self.drain_writes(file, &mut writes, &mut written, &mut failure).await;
                }
                if failure.is_none() {
                    let task = self.spawn_chunk_write(files, file, chunk, staging, share);
                    writes.push_back((chunk, task));
                }
            }
            if writes.len() >= depth || (staged.is_empty() && !writes.is_empty()) {
                let (chunk, task) = writes.pop_front().expect("checked non-empty");
                record_write(file, chunk, task.await, &mut written, &mut failure);
            }
            if staged.is_empty() && writes.is_empty() && (chunks.is_empty() || failure.is_some()) {
                break;
            }
        }
        // As pwrite: the bytes in place from the start of the range, short when a chunk
        // failed or wrote short after some were; an OS error only when none were.
        let prefix = written.prefix_bytes();
        match failure {
            Some((Outcome::OsError(_), None)) if prefix > 0 => {
                (Outcome::Bytes(prefix), None, VecDeque::new())
            }
            Some((outcome, device_error)) => (outcome, device_error, VecDeque::new()),
            None => (Outcome::Bytes(prefix), None, VecDeque::new()),
        }
    }

    async fn drain_writes(
        &self,
        file: &FileHandle,
        writes: &mut VecDeque<(Chunk, Task<Result<usize, i32>>)>,
        written: &mut Written,
        failure: &mut Option<(Outcome, Option<DeviceError>)>,
    ) {
        while let Some((chunk, task)) = writes.pop_front() {
            record_write(file, chunk, task.await, written, failure);
        }
    }

    /// Allocates staging for one chunk (arena DMA buffer, or fallback when the buffer
    /// glommio hands out lies outside the arena) and enqueues the device → host copy.
    async fn stage_from_device(
        &self,
        files: &OpenFiles,
        stream: &InternalStream,
        source: u64,
        chunk: Chunk,
    ) -> Result<(EventHandle, WriteStaging), DeviceError> {
        let len = chunk.len_bytes as usize;
        // DMA buffers come from the executor's io_memory whatever file hands them out.
        let mut buffer = match &files.buffered {
            Some(buffered) => buffered.alloc_dma_buffer(len),
            None => match self.utility.borrow().as_ref() {
                Some(utility) => utility.alloc_dma_buffer(len),
                None => {
                    return Err(DeviceError::new(
                        DeviceError::HIP_ERROR_OUT_OF_MEMORY,
                        "no DMA staging: neither the file nor /dev/shm opens with glommio",
                    ));
                }
            },
        };
        let in_arena = self.arena.get().is_some_and(|a| a.contains(buffer.as_ptr() as usize, len));
        let staging = if in_arena && !files.uring_refused.get() {
            EngineStats::add(&self.setup.stats.arena_chunks, 1);
            let target = buffer.as_bytes_mut().as_mut_ptr();
            crate::fault::device_fault(Site::DeviceCopy)?;
            // SAFETY: `buffer` is an arena (registered, pinned) buffer of `len` bytes that
            // the returned staging keeps alive until the copy's event is waited for.
            unsafe { self.setup.device.copy_from_device_async(stream, target, source, len)? };
            WriteStaging::Arena(buffer)
        } else {
            EngineStats::add(&self.setup.stats.fallback_chunks, 1);
            crate::stats::count_fallback_chunk();
            let chunk_memory = self.take_fallback().await?;
            crate::fault::device_fault(Site::DeviceCopy)?;
            // SAFETY: the fallback chunk is pinned, ours, and >= len bytes; kept alive in
            // the returned staging until the copy's event is waited for.
            unsafe {
                self.setup.device.copy_from_device_async(
                    stream,
                    chunk_memory.as_mut_ptr(),
                    source,
                    len,
                )?
            };
            WriteStaging::Fallback(buffer, chunk_memory)
        };
        let recorded = crate::fault::device_fault(Site::DeviceEvent)
            .and_then(|()| self.setup.device.record_event(stream));
        match recorded {
            Ok(event) => Ok((event, staging)),
            Err(error) => {
                self.settle_unrecorded_copy(stream, staging);
                Err(error)
            }
        }
    }

    /// A copy was enqueued on `stream` but its event could not be recorded: wait for the
    /// stream (blocking this executor; an error path) so that the copy no longer uses
    /// `staging` before it is freed. If even that fails, `staging` is leaked rather than
    /// freed under a copy that may still run.
    fn settle_unrecorded_copy<T>(&self, stream: &InternalStream, staging: T) {
        if self.setup.device.synchronize_internal(stream).is_err() {
            std::mem::forget(staging);
        }
    }

    fn spawn_chunk_write(
        self: &Rc<Self>,
        files: &Rc<OpenFiles>,
        file: &Arc<FileHandle>,
        chunk: Chunk,
        staging: WriteStaging,
        share: StagingShare,
    ) -> Task<Result<usize, i32>> {
        let me = Rc::clone(self);
        let files = Rc::clone(files);
        let file = Arc::clone(file);
        glommio::spawn_local(async move {
            let written = me.write_chunk(&files, &file, chunk, staging).await;
            drop(share);
            written
        })
    }

    async fn write_chunk(
        &self,
        files: &OpenFiles,
        file: &FileHandle,
        chunk: Chunk,
        staging: WriteStaging,
    ) -> Result<usize, i32> {
        let len = chunk.len_bytes as usize;
        let buffer = Rc::new(match staging {
            WriteStaging::Arena(buffer) => buffer,
            WriteStaging::Fallback(mut buffer, memory) => {
                // SAFETY: the copy into `memory` completed (its event was waited for);
                // both hold at least `len` bytes and do not overlap.
                unsafe {
                    sys::copy_bytes(buffer.as_bytes_mut().as_mut_ptr(), memory.as_mut_ptr(), len)
                };
                buffer
            }
        });
        let mut written = 0;
        if !files.uring_refused.get()
            && let Some(buffered) = &files.buffered
        {
            let dma = match (chunk.mode, &files.direct) {
                (ChunkMode::Direct, Some(direct)) => direct,
                _ => buffered,
            };
            injected_chunk_fault(Site::ChunkWrite).await?;
            match dma.write_rc_at(Rc::clone(&buffer), chunk.file_offset_bytes).await {
                Ok(n) if n >= len => return Ok(len),
                // Short write (a limit or a signal): finish the rest below.
                Ok(n) => written = n,
                Err(error) => {
                    let errno = glommio_errno(error);
                    if !uring_refuses(errno) {
                        return Err(errno);
                    }
                    files.uring_refused.set(true);
                }
            }
        }
        EngineStats::add(&self.setup.stats.sync_retry_chunks, 1);
        crate::stats::count_sync_retry_chunk();
        let rest = &buffer.as_bytes()[written..len];
        let offset = chunk.file_offset_bytes + written as u64;
        Ok(written + pwrite_full(file.buffered_fd(), rest, offset).map_err(|e| os_errno(&e))?)
    }

    /// Drops staging of completed copies; waits for the oldest while `depth` are in flight.
    async fn reap(
        &self,
        copies: &mut VecDeque<InFlightCopy>,
        depth: usize,
    ) -> Result<(), DeviceError> {
        while let Some(front) = copies.front() {
            let done = self.setup.device.event_done(&front.event)?;
            if !done && copies.len() < depth {
                break;
            }
            if !done {
                self.wait_event(&front.event).await?;
            }
            let copy = copies.pop_front().expect("front exists");
            self.setup.device.destroy_event(copy.event);
        }
        Ok(())
    }

    async fn wait_all(&self, copies: &mut VecDeque<InFlightCopy>) -> Result<(), DeviceError> {
        let mut first_error = Ok(());
        while let Some(copy) = copies.pop_front() {
            if let Err(error) = self.wait_event(&copy.event).await {
                first_error = first_error.and(Err(error));
            }
            self.setup.device.destroy_event(copy.event);
        }
        first_error
    }

    /// Polls an event without blocking the executor: yields for up to
    /// [`EVENT_SPIN`] (copies of small chunks finish in microseconds, and a timer sleep
    /// costs ~50 µs of wake-up), then timer sleeps with backoff.
    async fn wait_event(&self, event: &EventHandle) -> Result<(), DeviceError> {
        let started = std::time::Instant::now();
        let mut sleep_us = 10;
        loop {
            if self.setup.device.event_done(event)? {
                return Ok(());
            }
            let waited = started.elapsed();
            if waited < EVENT_SPIN {
                glommio::executor().yield_task_queue_now().await;
            } else {
                if waited >= COPY_STALL_WARNING {
                    warn_copy_stalled(&*self.setup.device, waited);
                }
                glommio::timer::sleep(Duration::from_micros(sleep_us)).await;
                sleep_us = (sleep_us * 2).min(200);
            }
        }
    }
}

/// How long [`Executor::wait_event`] polls by yielding before it sleeps.
const EVENT_SPIN: Duration = Duration::from_micros(200);

/// How long a staging copy may stay incomplete before the process is warned (once) that
/// it is probably queued behind a held stream on a shared hardware queue.
const COPY_STALL_WARNING: Duration = Duration::from_secs(5);

/// Warns once per process that a copy on an internal stream has not completed after
/// `waited`. With the engine's copies in a context of their own this is not expected;
/// when the backend could not make one, the known cause is a user stream, held on an
/// async op's wait-value, sharing the copy stream's hardware queue (README, Known limits).
fn warn_copy_stalled(device: &dyn Device, waited: Duration) {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    let setting = device.hardware_queue_setting().unwrap_or_default();
    log::warn!("a staging copy has not completed after {} s ({setting})", waited.as_secs());
}

type PlanIter = hipfile_core::ChunkPlan;

/// The chunks of a write job that reached the file: (offset in the range, bytes).
#[derive(Default)]
struct Written(Vec<(u64, u64)>);

impl Written {
    /// Bytes in place from the start of the range without a gap (chunks complete in any
    /// order: direct ones first, buffered head and tail after).
    fn prefix_bytes(&mut self) -> u64 {
        self.0.sort_unstable();
        let mut end = 0;
        for &(offset, len) in &self.0 {
            if offset > end {
                break;
            }
            end = end.max(offset + len);
        }
        end
    }
}

fn record_write(
    file: &FileHandle,
    chunk: Chunk,
    result: Result<usize, i32>,
    written: &mut Written,
    failure: &mut Option<(Outcome, Option<DeviceError>)>,
) {
    match result {
        Ok(n) => {
            file.record_bytes(Direction::Write, chunk.mode, n as u64);
            written.0.push((chunk.op_offset_bytes, n as u64));
            if (n as u64) < chunk.len_bytes {
                // A short write (the disk is full): nothing after it is in place.
                failure.get_or_insert((Outcome::OsError(libc::ENOSPC), None));
            }
        }
        Err(errno) => {
            failure.get_or_insert((Outcome::OsError(errno), None));
        }
    }
}

#[derive(Clone, Copy)]
struct JobRange {
    file_offset_bytes: u64,
    device_addr: u64,
    len_bytes: u64,
}

enum WriteStaging {
    Arena(DmaBuffer),
    Fallback(DmaBuffer, FallbackChunk),
}

fn staging_len(staging: &Staging) -> usize {
    match staging {
        Staging::Read(result) => result.len(),
        Staging::Fallback(chunk) => chunk.valid_len(),
    }
}

fn staging_ptr(staging: &Staging) -> *const u8 {
    match staging {
        Staging::Read(result) => result.as_ptr(),
        Staging::Fallback(chunk) => chunk.as_mut_ptr(),
    }
}

fn proc_fd_path(fd: std::os::fd::RawFd) -> String {
    format!("/proc/self/fd/{fd}")
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

/// An anonymous (O_TMPFILE) file with one block of data, in the directory of another
/// descriptor's file; used to give glommio's poll probe real data.
struct NonEmptyTmpFile(std::os::fd::OwnedFd);

impl NonEmptyTmpFile {
    fn beside(fd: std::os::fd::RawFd) -> Option<NonEmptyTmpFile> {
        let path = std::fs::read_link(proc_fd_path(fd)).ok()?;
        let dir = path.parent()?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags_tmpfile()
            .open(dir)
            .ok()?;
        use std::io::Write;
        (&file).write_all(&[0u8; 4096]).ok()?;
        Some(NonEmptyTmpFile(file.into()))
    }

    fn fd(&self) -> std::os::fd::RawFd {
        self.0.as_raw_fd()
    }
}

trait TmpFileOption {
    fn custom_flags_tmpfile(&mut self) -> &mut Self;
}

impl TmpFileOption for std::fs::OpenOptions {
    fn custom_flags_tmpfile(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.custom_flags(libc::O_TMPFILE)
    }
}

/// An injected fault (crate::fault) before a chunk's io_uring read or write: the errno
/// it fails with, or a delay; short and interrupted transfers are left to the
/// `pread`/`pwrite` sites.
async fn injected_chunk_fault(site: Site) -> Result<(), i32> {
    match crate::fault::at(site) {
        Some(Fault::Errno(errno)) => Err(errno),
        Some(Fault::Delay(delay)) => {
            glommio::timer::sleep(delay).await;
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Page size of glommio's arena allocation (its `Layout` alignment).
const ARENA_PAGE_BYTES: usize = 4096;

/// Bytes of an arena of `arena_bytes` that may be registered from the first byte its
/// allocator hands out (see `discover_arena`); `None` when nothing would be left.
fn arena_usable_bytes(arena_bytes: usize) -> Option<usize> {
    arena_bytes.checked_sub(ARENA_PAGE_BYTES).filter(|&usable| usable >= ARENA_PAGE_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registered_arena_ends_where_the_allocation_ends_at_the_latest() {
        assert_eq!(arena_usable_bytes(32 << 20), Some((32 << 20) - 4096));
        assert_eq!(arena_usable_bytes(8192), Some(4096));
        assert_eq!(arena_usable_bytes(4096), None);
        assert_eq!(arena_usable_bytes(0), None);
    }
}
