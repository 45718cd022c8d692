//! Driver state: hipFile's refcounted driver, and the registries of file handles and
//! buffers (streams: [`crate::stream`]).
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
//!
//! `impl Driver` is spread by job: this file holds the driver itself (construction,
//! configuration, the use count, the parts started on first use, the pending report);
//! `files.rs` the file handles, `buffers.rs` buffer registration and resolution,
//! `sync_io.rs` the synchronous read and write, `async_calls.rs` stream registration and
//! async submission; `process.rs` the process-wide driver and the device selection.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use hipfile_core::OpError;

use crate::arm::ArmPoller;
use crate::async_op::{AsyncStats, IdleSlotGiver, OpHost, SlotPool, WriteHazardTable};
use crate::buffer::RegisteredBuffer;
use crate::config::{Config, DeviceSlotsFull, StreamCopies, StreamCopySlots};
use crate::device::Device;
use crate::engine::Engine;
use crate::error::Error;
use crate::file::FileHandle;
use crate::stream::{StreamState, StreamTable};

mod async_calls;
mod buffers;
mod files;
pub mod process;
mod started_on_use;
mod sync_io;

pub use files::HandleId;
use started_on_use::StartedOnUse;

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
    /// Gives back the device memory of idle device slots (dropped, so stopped, before
    /// `slots`).
    _idle_slots: Option<IdleSlotGiver>,
    /// Staging slots of reads copied on the user's stream (`None`: off, or the device
    /// cannot copy on user streams).
    slots: Option<Arc<SlotPool>>,
    /// Pinned slots of reads done inside the submit call (`async_op::inline_read`): the
    /// stream copies' pool where there is one, else one of their own (`None`: off, or the
    /// device cannot copy on user streams).
    inline_slots: Option<Arc<SlotPool>>,
    /// `HIPFILE_INLINE_READ_KB` in bytes (0: off).
    inline_read_bytes: usize,
    /// `HIPFILE_STREAM_WRITE_PIECE_KB` in bytes (0: off; `async_op::write_pieces`).
    stream_write_piece_bytes: u64,
    /// `HIPFILE_STREAM_COPY_WRITES` (off: writes take the engine's path).
    stream_copy_writes: bool,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("device", &self.device.kind())
            .field("use_count", &self.use_count())
            .finish_non_exhaustive()
    }
}

/// The backend's choices in place of [`StreamCopies::Auto`] and [`StreamCopySlots::Auto`]:
/// every op copied on the user's stream (`all`) where the engine's own copies can wait for
/// the application's streams, else `off`; slots of engine device memory where the backend
/// prefers them, else pinned ones. A setting given is kept.
fn resolve_stream_copies(config: &mut Config, device: &dyn Device) {
    if config.stream_copies == StreamCopies::Auto {
        config.stream_copies = if device.engine_copies_can_wait_for_user_streams() {
            StreamCopies::All
        } else {
            StreamCopies::Off
        };
    }
    if config.stream_copy_slots == StreamCopySlots::Auto {
        config.stream_copy_slots = if device.prefers_device_slots() {
            StreamCopySlots::Device
        } else {
            StreamCopySlots::Pinned
        };
    }
}

impl Driver {
    /// A driver over `device`, with the stream-copy settings left to the backend resolved
    /// for it (`resolve_stream_copies`).
    pub fn new(mut config: Config, device: Arc<dyn Device>) -> Arc<Driver> {
        resolve_stream_copies(&mut config, &*device);
        // By default prefetches may hold half the staging arenas; the other half serves
        // the ops the streams have reached (stream.rs, PrefetchBudget).
        let prefetch_cap_bytes = config.prefetch_cap_bytes() as u64;
        let slots = (config.stream_copies != StreamCopies::Off && device.copies_on_user_streams())
            .then(|| {
                let all = config.stream_copies == StreamCopies::All;
                Arc::new(SlotPool::with_memory(
                    Arc::clone(&device),
                    all,
                    config.stream_copy_cap_bytes,
                    config.stream_copy_piece_bytes,
                    (config.stream_copy_slots == StreamCopySlots::Device)
                        .then_some(config.stream_copy_device_cap_bytes),
                    config.stream_copy_device_full == DeviceSlotsFull::Share,
                ))
            });
        let inline_read_bytes = config.inline_read_bytes;
        let inline_slots = slots.clone().or_else(|| {
            (inline_read_bytes > 0 && device.copies_on_user_streams()).then(|| {
                // Pinned slots only, for inline reads (of at most the largest slot).
                Arc::new(SlotPool::with_memory(
                    Arc::clone(&device),
                    false,
                    config.stream_copy_cap_bytes,
                    config.stream_copy_piece_bytes,
                    None,
                    false,
                ))
            })
        });
        let idle = Duration::from_millis(config.stream_copy_device_idle_ms);
        let idle_slots = slots.as_ref().and_then(|pool| IdleSlotGiver::start(pool, idle));
        Arc::new(Driver {
            _idle_slots: idle_slots,
            slots,
            inline_slots,
            inline_read_bytes,
            stream_write_piece_bytes: config.stream_write_piece_bytes as u64,
            stream_copy_writes: config.stream_copy_writes,
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

    /// The process-wide driver, built from the environment on first use. It is the
    /// same driver the C API uses ([`process::runtime`]), so a program that
    /// mixes the Rust and C APIs sees one set of registrations.
    ///
    /// # Errors
    /// The device selected by `HIPFILE_DEVICE` is unavailable.
    pub(crate) fn global() -> Result<&'static Arc<Driver>, Error> {
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

    /// Bytes of the engine's device memory that the read slots hold now, all devices
    /// together (`HIPFILE_STREAM_COPY_SLOTS=device`; given back after
    /// `HIPFILE_STREAM_COPY_DEVICE_IDLE_MS` unused).
    pub fn device_slot_bytes(&self) -> usize {
        self.slots.as_ref().map_or(0, |pool| pool.device_bytes_held())
    }

    /// Reads (over 64 KiB, `HIPFILE_STREAM_COPY_SLOTS=device`) that found no free slot of
    /// device memory, their device's `HIPFILE_STREAM_COPY_DEVICE_MB` reached (or a slab
    /// refused): they took pinned slots, slower for large reads (README, Known limits), or
    /// shared their stream's ([`Driver::reads_sharing_device_slots`]).
    pub fn reads_past_device_slots(&self) -> u64 {
        self.slots.as_ref().map_or(0, |pool| pool.reads_past_device_slots())
    }

    /// Of [`Driver::reads_past_device_slots`], the reads that shared a slot with an
    /// earlier read of their stream instead (`HIPFILE_STREAM_COPY_DEVICE_FULL=share`).
    pub fn reads_sharing_device_slots(&self) -> u64 {
        self.slots.as_ref().map_or(0, |pool| pool.reads_sharing_device_slots())
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
            "  async: {} submitted ({} read inside the submit call), {} prefetched, {} released \
             device-side, {} host-side; {} \
             copied on their stream ({} through spare slots, {} writes in pieces), device slots hold {} MiB ({} \
             reads found none free, {} of them shared their stream's)",
            stats.submitted.load(Ordering::Relaxed),
            stats.read_at_submission.load(Ordering::Relaxed),
            stats.prefetched.load(Ordering::Relaxed),
            stats.device_releases.load(Ordering::Relaxed),
            stats.host_releases.load(Ordering::Relaxed),
            stats.stream_copies.load(Ordering::Relaxed),
            stats.spare_ops.load(Ordering::Relaxed),
            stats.writes_in_pieces.load(Ordering::Relaxed),
            self.device_slot_bytes() >> 20,
            self.reads_past_device_slots(),
            self.reads_sharing_device_slots(),
        );
        if let Some(engine) = self.engine.get() {
            let _ = writeln!(
                report,
                "  engine: {} executor(s) ({} blocking), {:?}",
                engine.executor_count(),
                engine.blocking_executor_count(),
                engine.stats()
            );
            for line in engine.describe_executors() {
                let _ = writeln!(report, "    {line}");
            }
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
    pub(crate) fn ensure_open(&self) {
        let _lock = self.lock_lifecycle();
        if self.refcount.load(Ordering::SeqCst) == 0 {
            self.refcount.store(1, Ordering::SeqCst);
        }
    }

    fn lock_lifecycle(&self) -> std::sync::MutexGuard<'_, ()> {
        self.lifecycle.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
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
                let cores = crate::config::available_cores();
                let spin = crate::config::spare_cores_for_spinning(executors, cores);
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

    fn slots(&self) -> Option<&SlotPool> {
        self.slots.as_deref()
    }

    fn stream_write_piece_bytes(&self) -> u64 {
        self.stream_write_piece_bytes
    }

    fn stream_copy_writes(&self) -> bool {
        self.stream_copy_writes
    }
}
