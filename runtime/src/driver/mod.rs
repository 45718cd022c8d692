//! Driver state: hipFile's refcounted driver, and the registries of file handles and
//! buffers (streams: see the async module).
//!
//! Refcount rules (hipFile's, behaviour.md §3.4):
//! - [`Driver::open`] increments and always succeeds; [`Driver::close`] decrements, and
//!   at 0 deregisters every file handle and buffer (streams stay registered); closing at
//!   0 is `hipFileDriverNotInitialized`.
//! - Implicit open (0 → 1): a successful or duplicate handle registration, any buffer
//!   registration (even a failing one), and the async calls. Not the sync read/write,
//!   which fail with -1/EINVAL while the driver is closed.
//!
//! The I/O path takes no process-wide exclusive lock: lookups take read locks on the
//! registries; only registration and close write them.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use hipfile_core::{
    BufferSpan, Direction, OpError, Outcome, RawIo, StreamFlags, ValidIo, validate,
};

use crate::arm::ArmPoller;
use crate::async_op::{AsyncStats, OpHost, WriteHazardTable};
pub use crate::buffer::{BufferUse, RegisteredBuffer, ResolvedBuffer};
use crate::config::Config;
use crate::device::{Device, MemoryType};
use crate::engine::{Engine, SyncRequest};
use crate::error::{Error, IoError};
use crate::file::FileHandle;
use crate::stream::{StreamState, StreamTable};

mod async_calls;
pub mod process;
mod started_on_use;

use started_on_use::StartedOnUse;

/// The value a C caller holds as `hipFileHandle_t`: never 0 for a registered handle.
///
/// Values are never handed out twice in a process (not the handle's address, which a
/// later registration could reuse): a handle kept after its deregistration stays
/// unknown (5027) and never reaches a file registered later, even one that reuses the
/// same descriptor number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HandleId(pub usize);

impl HandleId {
    /// The first value handed out: pointer-like (16-byte steps) and far from small
    /// integers and typical garbage.
    const FIRST: usize = 1 << 44;
    const STEP: usize = 16;

    fn next() -> HandleId {
        static NEXT: std::sync::atomic::AtomicUsize =
            std::sync::atomic::AtomicUsize::new(HandleId::FIRST);
        HandleId(NEXT.fetch_add(HandleId::STEP, std::sync::atomic::Ordering::Relaxed))
    }
}

/// The driver: configuration, device, engine and registries.
pub struct Driver {
    /// The configuration in force; replaced whole by [`Driver::configure`] before any
    /// I/O (the engine start holds a read lock while it reads it).
    config: RwLock<Arc<Config>>,
    /// `config.allow_compat_mode`, read on every sync call without the lock (a shared
    /// reader count would be one more contended cache line per call).
    compat_mode_allowed: AtomicBool,
    device: Arc<dyn Device>,
    page_size_bytes: u64,
    refcount: AtomicI64,
    lifecycle: Mutex<()>,
    files: RwLock<HashMap<HandleId, Arc<FileHandle>>>,
    buffers: RwLock<BTreeMap<u64, Arc<RegisteredBuffer>>>,
    engine: StartedOnUse<Engine>,
    arm_poller: StartedOnUse<ArmPoller<StreamState>>,
    next_executor: AtomicUsize,
    streams: StreamTable,
    hazards: WriteHazardTable,
    async_stats: AsyncStats,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("device", &self.device.kind())
            .field("use_count", &self.use_count())
            .finish_non_exhaustive()
    }
}

impl Driver {
    /// A driver over `device`.
    pub fn new(config: Config, device: Arc<dyn Device>) -> Arc<Driver> {
        // By default prefetches may hold half the staging arenas; the other half serves
        // the ops the streams have reached (stream.rs, PrefetchBudget).
        let prefetch_cap_bytes = config.prefetch_cap_bytes() as u64;
        Arc::new(Driver {
            compat_mode_allowed: AtomicBool::new(config.allow_compat_mode),
            config: RwLock::new(Arc::new(config)),
            page_size_bytes: crate::sys::page_size_bytes(),
            refcount: AtomicI64::new(0),
            lifecycle: Mutex::new(()),
            files: RwLock::new(HashMap::new()),
            buffers: RwLock::new(BTreeMap::new()),
            engine: StartedOnUse::default(),
            arm_poller: StartedOnUse::default(),
            next_executor: AtomicUsize::new(0),
            streams: StreamTable::new(Arc::clone(&device), prefetch_cap_bytes),
            hazards: WriteHazardTable::default(),
            async_stats: AsyncStats::default(),
            device,
        })
    }

    /// A driver over the device `config.device` selects (`auto`: the first backend that
    /// finds a device; `cpu` always does).
    ///
    /// # Errors
    /// The selected backend is not available in this build or finds no device.
    pub fn from_config(config: Config) -> Result<Arc<Driver>, Error> {
        let selected = process::select_device(&config)?;
        Ok(Driver::new(config, selected.device as Arc<dyn Device>))
    }

    /// The process-wide driver, built from the environment on first use. It is the
    /// same driver the C API uses ([`process::runtime`]), so a program that
    /// mixes the Rust and C APIs sees one set of registrations.
    ///
    /// # Errors
    /// The device selected by `HIPFILE_DEVICE` is unavailable.
    pub fn global() -> Result<&'static Arc<Driver>, Error> {
        process::runtime().map(|runtime| &runtime.driver)
    }

    /// The device.
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }

    pub(crate) fn streams(&self) -> &StreamTable {
        &self.streams
    }

    pub(crate) fn write_hazards(&self) -> &WriteHazardTable {
        &self.hazards
    }

    /// Counters of the async path.
    pub fn async_stats(&self) -> &AsyncStats {
        &self.async_stats
    }

    /// What the async path holds right now, for a watchdog that found a stream stuck:
    /// every stream with its submitted / reached (doorbell) / released sequence numbers,
    /// the arm poller, the async and engine counters, the device's queue setting. Idle
    /// streams are summed up in one line. Never blocks on device work.
    pub fn pending_report(&self) -> String {
        use std::fmt::Write as _;
        let mut report = String::new();
        let streams = self.streams.all();
        let idle = streams.iter().filter(|state| state.idle()).count();
        let _ = writeln!(
            report,
            "hipfile pending report: device {}, {} stream(s) known, {idle} idle",
            self.device.kind().name(),
            streams.len()
        );
        for state in streams.iter().filter(|state| !state.idle()) {
            let _ = writeln!(report, "  {}", state.describe());
        }
        match (self.arm_poller.get(), self.arm_poller.last_failure()) {
            (Some(poller), _) => {
                let _ = writeln!(report, "  {}", poller.describe());
            }
            (None, Some(error)) => {
                let _ = writeln!(report, "  arm poller failed to start: {error}");
            }
            (None, None) => {
                let _ = writeln!(report, "  arm poller not started");
            }
        }
        let stats = &self.async_stats;
        let _ = writeln!(
            report,
            "  async: {} submitted, {} prefetched, {} released device-side, {} host-side",
            stats.submitted.load(Ordering::Relaxed),
            stats.prefetched.load(Ordering::Relaxed),
            stats.device_releases.load(Ordering::Relaxed),
            stats.host_releases.load(Ordering::Relaxed),
        );
        if let Some(engine) = self.engine.get() {
            let _ = writeln!(
                report,
                "  engine: {} executor(s) ({} blocking), {:?}",
                engine.executor_count(),
                engine.blocking_executor_count(),
                engine.stats()
            );
        }
        if let Some(setting) = self.device.hardware_queue_setting() {
            let _ = writeln!(report, "  device: {setting}");
        }
        report
    }

    /// The configuration in force.
    pub fn config(&self) -> Arc<Config> {
        Arc::clone(&read_lock(&self.config))
    }

    /// Changes the configuration (hipFile's parameter and property calls,
    /// [`crate::parameters`]): `change` edits a copy, which must then validate. Allowed
    /// until the engine starts (the first I/O) or a file handle is registered; the
    /// settings shape the engine and each handle's descriptors.
    ///
    /// # Errors
    /// `DriverAlreadyOpen` once the engine runs or a handle is registered (nothing
    /// changes); `change`'s error, or `InvalidValue` when the result does not validate.
    pub fn configure(
        &self,
        change: impl FnOnce(&mut Config) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let mut config = write_lock(&self.config);
        if self.engine.get().is_some() || !read_lock(&self.files).is_empty() {
            return Err(Error::new(OpError::DriverAlreadyOpen));
        }
        let mut next = Config::clone(&config);
        change(&mut next)?;
        next.validate().map_err(|_| Error::new(OpError::InvalidValue))?;
        self.streams.set_prefetch_cap(next.prefetch_cap_bytes() as u64);
        self.compat_mode_allowed.store(next.allow_compat_mode, Ordering::SeqCst);
        *config = Arc::new(next);
        Ok(())
    }

    /// System page size (the max-I/O clamp rounds to it).
    pub fn page_size_bytes(&self) -> u64 {
        self.page_size_bytes
    }

    /// `hipFileDriverOpen`: increments the use count; always succeeds.
    pub fn open(&self) {
        let _lock = self.lock_lifecycle();
        self.refcount.fetch_add(1, Ordering::SeqCst);
    }

    /// `hipFileDriverClose`: decrements the use count; at 0 deregisters every file
    /// handle and buffer.
    ///
    /// # Errors
    /// `DriverNotInitialized` when the count is already 0.
    pub fn close(&self) -> Result<(), Error> {
        let _lock = self.lock_lifecycle();
        let count = self.refcount.load(Ordering::SeqCst);
        if count <= 0 {
            return Err(Error::new(OpError::DriverNotInitialized));
        }
        self.refcount.store(count - 1, Ordering::SeqCst);
        if count == 1 {
            let files: Vec<_> = write_lock(&self.files).drain().map(|(_, f)| f).collect();
            for file in &files {
                file.mark_deregistered();
            }
            write_lock(&self.buffers).clear();
            drop(files);
            if let Some(engine) = self.engine.get() {
                engine.prune_files();
            }
        }
        Ok(())
    }

    /// `hipFileUseCount`.
    pub fn use_count(&self) -> i64 {
        self.refcount.load(Ordering::SeqCst)
    }

    /// `true` while the use count is above 0.
    pub fn is_open(&self) -> bool {
        self.use_count() > 0
    }

    /// Opens the driver implicitly (0 → 1) for the calls that do so.
    pub fn ensure_open(&self) {
        let _lock = self.lock_lifecycle();
        if self.refcount.load(Ordering::SeqCst) == 0 {
            self.refcount.store(1, Ordering::SeqCst);
        }
    }

    fn lock_lifecycle(&self) -> std::sync::MutexGuard<'_, ()> {
        self.lifecycle.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// `hipFileHandleRegister` for an OpaqueFD.
    ///
    /// # Errors
    /// `HandleAlreadyRegistered` (the driver is opened implicitly first), and every
    /// error of [`FileHandle::open`] (`IONotSupported`, `InternalError`; the use count is
    /// then unchanged).
    pub fn handle_register(&self, fd: RawFd) -> Result<HandleId, Error> {
        self.handle_register_with(fd, self.config().direct)
    }

    /// [`Driver::handle_register`] with this handle's own O_DIRECT policy instead of the
    /// process-wide one (`HIPFILE_ODIRECT`): `Off` keeps every byte of this file in the
    /// page cache, `On` asks for O_DIRECT (a warning where the file cannot have it).
    ///
    /// # Errors
    /// As [`Driver::handle_register`].
    pub fn handle_register_with(
        &self,
        fd: RawFd,
        direct: crate::file::DirectPolicy,
    ) -> Result<HandleId, Error> {
        if read_lock(&self.files).values().any(|f| f.client_fd() == fd) {
            self.ensure_open();
            return Err(Error::new(OpError::HandleAlreadyRegistered));
        }
        let file = Arc::new(FileHandle::open(fd, direct)?);
        log_direct_path(fd, &file);
        let id = HandleId::next();
        let mut files = write_lock(&self.files);
        if files.values().any(|f| f.client_fd() == fd) {
            drop(files);
            self.ensure_open();
            return Err(Error::new(OpError::HandleAlreadyRegistered));
        }
        files.insert(id, file);
        drop(files);
        self.ensure_open();
        Ok(id)
    }

    /// `hipFileHandleDeregister`: unknown handles are ignored. Ops in flight keep the
    /// file open and complete; new ops are refused at once.
    pub fn handle_deregister(&self, id: HandleId) {
        let removed = write_lock(&self.files).remove(&id);
        if let Some(file) = removed {
            file.mark_deregistered();
            drop(file);
            if let Some(engine) = self.engine.get() {
                engine.prune_files();
            }
        }
    }

    /// The file behind a handle.
    ///
    /// # Errors
    /// `HandleNotRegistered` for an unknown (or NULL, or deregistered) handle.
    pub fn file(&self, id: HandleId) -> Result<Arc<FileHandle>, Error> {
        read_lock(&self.files).get(&id).cloned().ok_or(Error::new(OpError::HandleNotRegistered))
    }

    /// `hipFileBufRegister`. Opens the driver implicitly first, even when it then fails.
    ///
    /// # Errors
    /// NULL → `InvalidValue`; not device memory → `HipMemoryTypeInvalid`; range beyond
    /// the allocation (or overflowing) → `HipPointerRangeError`; already registered →
    /// `MemoryAlreadyRegistered`; a device error → `HipDriverError` (or `InvalidValue`
    /// for hipErrorInvalidValue, as hipFile).
    pub fn buf_register(&self, base_addr: u64, len_bytes: u64, _flags: i32) -> Result<(), Error> {
        self.ensure_open();
        if base_addr == 0 {
            return Err(Error::new(OpError::InvalidValue));
        }
        let info = self.pointer_info(base_addr)?;
        if info.memory_type != MemoryType::Device {
            return Err(Error::new(OpError::HipMemoryTypeInvalid));
        }
        let allocation_end = info.allocation_base.checked_add(info.allocation_len_bytes);
        let end = base_addr.checked_add(len_bytes);
        if !matches!((end, allocation_end), (Some(e), Some(a)) if e <= a) {
            return Err(Error::new(OpError::HipPointerRangeError));
        }
        let mut buffers = write_lock(&self.buffers);
        if buffers.contains_key(&base_addr) {
            return Err(Error::new(OpError::MemoryAlreadyRegistered));
        }
        let buffer = RegisteredBuffer {
            base_addr,
            len_bytes,
            device_ordinal: info.device_ordinal,
            in_flight: AtomicUsize::new(0),
        };
        buffers.insert(base_addr, Arc::new(buffer));
        Ok(())
    }

    /// `hipFileBufDeregister`.
    ///
    /// # Errors
    /// Driver closed → `DriverClosing`; not registered → `MemoryNotRegistered`; ops in
    /// flight on it → `InternalError` (as hipFile).
    pub fn buf_deregister(&self, base_addr: u64) -> Result<(), Error> {
        if !self.is_open() {
            return Err(Error::new(OpError::DriverClosing));
        }
        let mut buffers = write_lock(&self.buffers);
        let buffer = buffers.get(&base_addr).ok_or(Error::new(OpError::MemoryNotRegistered))?;
        if buffer.in_flight.load(Ordering::SeqCst) > 0 {
            return Err(Error::new(OpError::InternalError));
        }
        buffers.remove(&base_addr);
        Ok(())
    }

    /// Resolves an I/O buffer: a registered buffer by its exact base pointer, else the
    /// allocation holding it (usable length: the rest of the allocation).
    ///
    /// # Errors
    /// NULL → `InvalidValue`; not device memory → `HipMemoryTypeInvalid`; a device error
    /// → `HipDriverError`.
    pub fn resolve_buffer(&self, base_addr: u64) -> Result<ResolvedBuffer, Error> {
        if base_addr == 0 {
            return Err(Error::new(OpError::InvalidValue));
        }
        if let Some(buffer) = read_lock(&self.buffers).get(&base_addr) {
            return Ok(ResolvedBuffer {
                span: BufferSpan { base_addr, len_bytes: buffer.len_bytes },
                device_ordinal: buffer.device_ordinal,
                registered: Some(Arc::clone(buffer)),
            });
        }
        let info = self.pointer_info(base_addr)?;
        if info.memory_type != MemoryType::Device {
            return Err(Error::new(OpError::HipMemoryTypeInvalid));
        }
        let end = info.allocation_base.saturating_add(info.allocation_len_bytes);
        let span = BufferSpan { base_addr, len_bytes: end.saturating_sub(base_addr) };
        Ok(ResolvedBuffer { span, device_ordinal: info.device_ordinal, registered: None })
    }

    fn pointer_info(&self, addr: u64) -> Result<crate::device::PointerInfo, Error> {
        self.device.pointer_info(addr).map_err(|e| {
            if e.hip_error == crate::device::DeviceError::HIP_ERROR_INVALID_VALUE {
                Error::new(OpError::InvalidValue)
            } else {
                Error::device(e)
            }
        })
    }

    /// The engine, started on first use. A start that failed (no thread or address space
    /// left, say) is tried again by a later call, at most every
    /// `StartedOnUse::RETRY_INTERVAL` (100 ms): a passing shortage does not disable the driver
    /// for the life of the process.
    ///
    /// # Errors
    /// `InternalError` when it could not start (each new reason is printed once).
    pub fn engine(&self) -> Result<&Engine, Error> {
        if let Some(engine) = self.engine.get() {
            return Ok(engine);
        }
        // The read lock is held until the engine is in place: a concurrent `configure`
        // either lands before the start or sees the engine and is refused.
        let config = read_lock(&self.config);
        self.engine
            .get_or_start(|| {
                Engine::start(&config, Arc::clone(&self.device)).map_err(|e| e.to_string())
            })
            .map_err(|_| Error::new(OpError::InternalError))
    }

    /// The thread that arms async ops by doorbell (started on first use; a failed start
    /// is tried again as the engine's is).
    ///
    /// # Errors
    /// `InternalError` when the thread cannot be started.
    pub(crate) fn arm_poller(&self) -> Result<&ArmPoller<StreamState>, Error> {
        self.arm_poller
            .get_or_start(|| {
                let executors = self.config().executor_cpus.len();
                let spin = crate::engine::spare_cores_for_spinning(executors);
                ArmPoller::start(spin).map_err(|e| format!("starting the arm poller thread: {e}"))
            })
            .map_err(|_| Error::new(OpError::InternalError))
    }

    /// Whether the compatibility (staged) path may run (`allow_compat_mode`).
    pub(crate) fn compat_mode_allowed(&self) -> bool {
        self.compat_mode_allowed.load(Ordering::Relaxed)
    }

    /// Picks an executor for work that has no stream affinity.
    pub(crate) fn next_executor(&self) -> usize {
        self.next_executor.fetch_add(1, Ordering::Relaxed)
    }

    /// `hipFileRead` / `hipFileWrite`: moves up to `size_bytes` (clamped to the max I/O
    /// size) between the file and device memory and returns the byte count (short at
    /// end of file for reads).
    ///
    /// # Errors
    /// See [`IoError`]; the order of checks is hipFile's: driver open, handle, buffer,
    /// arguments, then the I/O.
    pub fn io_sync(
        &self,
        direction: Direction,
        handle: HandleId,
        buffer_addr: u64,
        raw: RawIo,
    ) -> Result<usize, IoError> {
        if !self.is_open() {
            return Err(IoError::DriverClosed);
        }
        let file = self.file(handle)?;
        let buffer = self.resolve_buffer(buffer_addr)?;
        if !self.compat_mode_allowed() {
            return Err(IoError::Library(OpError::InternalError));
        }
        let io = validate(raw, buffer.span, StreamFlags::empty(), self.page_size_bytes)?;
        if io.is_empty() {
            return Ok(0);
        }
        let started = std::time::Instant::now();
        let moved = self.move_now(direction, file, &io, &buffer)?;
        crate::stats::global().record(
            buffer.device_ordinal,
            crate::stats::Api::Sync,
            direction,
            io.size_bytes(),
            moved.0,
            started.elapsed(),
        );
        match moved {
            (Outcome::Bytes(n), _) => Ok(n as usize),
            (Outcome::OsError(errno), _) => Err(IoError::Os(errno)),
            (Outcome::Library(OpError::HipDriverError), Some(error)) => Err(IoError::Device(error)),
            (Outcome::Library(code), _) => Err(IoError::Library(code)),
        }
    }
}

impl Driver {
    /// Moves a validated range now, on the engine, and waits for it: the body of the
    /// sync calls and of async calls on the NULL stream.
    ///
    /// # Errors
    /// The engine could not start.
    pub(crate) fn move_now(
        &self,
        direction: Direction,
        file: Arc<FileHandle>,
        io: &ValidIo,
        buffer: &ResolvedBuffer,
    ) -> Result<(Outcome, Option<crate::device::DeviceError>), Error> {
        let engine = self.engine()?;
        let _buffer_use = buffer.begin_use();
        if direction == Direction::Write {
            crate::async_op::prefetch::note_write(&file);
        }
        let request = SyncRequest {
            file,
            direction,
            file_offset_bytes: io.file_offset_bytes(),
            device_addr: io.device_addr(),
            len_bytes: io.size_bytes(),
            device_ordinal: buffer.device_ordinal,
            executor_hint: self.next_executor(),
        };
        Ok(engine.run_sync(request))
    }
}

/// Says once, at registration, when a file's I/O leaves O_DIRECT for good: at `info`
/// (`warn` when O_DIRECT was asked for with `HIPFILE_ODIRECT=on`; `debug` when it was
/// turned off).
fn log_direct_path(fd: RawFd, file: &FileHandle) {
    use crate::file::{DirectPolicy, NoDirectReason};
    let Some(reason) = file.no_direct_reason() else { return };
    let text = format!("fd {fd}: no O_DIRECT ({reason}): every byte goes through the page cache");
    match (reason, file.direct_policy()) {
        (NoDirectReason::PolicyOff, _) => log::debug!("{text}"),
        (_, DirectPolicy::On) => log::warn!("{text}, although HIPFILE_ODIRECT=on"),
        _ => log::info!("{text}"),
    }
}

fn read_lock<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn write_lock<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl OpHost for Driver {
    fn engine(&self) -> Result<&Engine, Error> {
        Driver::engine(self)
    }

    fn arm_poller(&self) -> Result<&ArmPoller<StreamState>, Error> {
        Driver::arm_poller(self)
    }

    fn device(&self) -> &Arc<dyn Device> {
        Driver::device(self)
    }

    fn page_size_bytes(&self) -> u64 {
        Driver::page_size_bytes(self)
    }

    fn async_stats(&self) -> &AsyncStats {
        Driver::async_stats(self)
    }

    fn write_hazards(&self) -> &WriteHazardTable {
        Driver::write_hazards(self)
    }
}
