//! A driver over a fresh
//! device with a small engine, temporary files, device-memory access, hang guards.
//!
//! The backend is the one `HIPFILE_DEVICE` selects: `cpu` (the default) or `cuda` (on an
//! NVIDIA machine; `rocm`, `auto` as in `device_contract.rs`). Every helper goes through
//! the backend-generic [`UserDevice`] API: device memory is read and written through
//! pinned staging and stream copies, never as host memory. Tests that need the `cpu`
//! device itself (several devices, its statistics, managed memory, destroyed-stream
//! semantics) ask [`Rig::cpu_only`], which prints `skipped on <backend>: <reason>`
//! elsewhere.
//!
//! On CUDA an enqueue blocks once about 110 commands (about 55 of our ops) wait behind a
//! blocked stream, so no test holds a gate while it submits more than about 40 ops from
//! the same thread on a non-`cpu` backend.
//!
//! Every blocking wait here has a 30 s watchdog: a test fails instead of hanging. Time is
//! never asserted on otherwise.

pub use crate::page_cache;

use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant};

use hipfile_core::RawIo;
use hipfile_core::{Direction, OpError};
use hipfile_runtime::config::{Config, DeviceSelection};
use hipfile_runtime::device::cpu::CpuDevice;
use hipfile_runtime::device::user::{StreamGate, UserDevice, backend_name};
use hipfile_runtime::device::{Device, DeviceError, MemoryType, PinnedRegion, StreamHandle};
use hipfile_runtime::driver::process::{SelectedDevice, open_selected};
use hipfile_runtime::{AsyncParams, Driver, Error, HandleId, ParamSource};

/// One KiB.
pub const KIB: usize = 1 << 10;
/// One MiB.
pub const MIB: usize = 1 << 20;
/// How long any wait may take before the test fails as hung.
pub const HANG_GUARD: Duration = Duration::from_secs(30);

/// The backend `HIPFILE_DEVICE` selects (`cpu` when unset or unknown).
pub fn selection() -> DeviceSelection {
    match std::env::var("HIPFILE_DEVICE").as_deref() {
        Ok("cuda") => DeviceSelection::Cuda,
        Ok("rocm") => DeviceSelection::Rocm,
        Ok("auto") => DeviceSelection::Auto,
        _ => DeviceSelection::Cpu,
    }
}

/// Opens the selected backend: `cpu` with `devices` devices (also returned as the
/// concrete [`CpuDevice`], for the tests that need it), or the GPU backend.
///
/// # Panics
/// The selected backend is unavailable (a misconfigured run must not pass silently).
pub fn open_backend(devices: u32) -> (Arc<dyn UserDevice>, Option<Arc<CpuDevice>>) {
    // The library's own selection: a `cpu` device (also when `auto` falls back to it)
    // comes typed.
    match open_selected(selection(), devices) {
        Ok(SelectedDevice { device, cpu }) => (device, cpu),
        Err(reason) => panic!("HIPFILE_DEVICE={:?} unavailable: {reason}", selection()),
    }
}

/// Devices of the GPU rigs dropped so far in this process (gone ones pruned).
type WeakDevices = Vec<std::sync::Weak<dyn UserDevice>>;
fn dropped_gpu_devices() -> std::sync::MutexGuard<'static, WeakDevices> {
    static DEVICES: Mutex<WeakDevices> = Mutex::new(Vec::new());
    DEVICES.lock().unwrap_or_else(|p| p.into_inner())
}

/// Waits (at most 10 s) until the drivers of dropped GPU rigs are gone: each rig's device
/// object is shared by its driver, engine and pools, and goes once all of them have been
/// dropped. A driver is dropped after its last op, often on the library's drop thread,
/// and frees its pinned memory then; on CUDA `cuMemFreeHost` waits for every stream held
/// on a wait-value and meanwhile blocks pinned allocation in the whole process, so a test
/// that holds a gate of its own while its engine starts would wait for a free that waits
/// for its gate (README "Known limits"). So one test's driver ends before the next
/// test's starts, as when each test runs in a process of its own.
fn wait_for_earlier_drivers() {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut drivers = dropped_gpu_devices();
        drivers.retain(|device| device.strong_count() > 0);
        if drivers.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            println!("note: {} earlier driver(s) still alive after 10 s; going on", drivers.len());
            drivers.clear();
            return;
        }
        drop(drivers);
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Whether the selected backend is the in-process `cpu` device.
pub fn on_cpu() -> bool {
    static ANSWER: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ANSWER.get_or_init(|| match selection() {
        DeviceSelection::Cpu => true,
        DeviceSelection::Auto => open_backend(1).1.is_some(),
        _ => false,
    })
}

/// The small engine every test uses: 2 executors on CPUs 0 and 1, 8 MiB staging each,
/// 256 KiB chunks (this machine has 2 cores shared with other work).
pub fn small_config() -> Config {
    let config = Config {
        executor_cpus: vec![0, 1],
        staging_per_executor_bytes: 8 << 20,
        staging_chunk_bytes: 256 << 10,
        request_parallelism: 2,
        ..Config::default()
    };
    config.validate().expect("test configuration is valid");
    config
}

/// Configuration for tests whose *writes* have unaligned file boundaries. It is the
/// normal small configuration: such writes once ran an O_DIRECT chunk and a buffered
/// chunk on the same page concurrently (stale page-cache bytes, EIO on fsync); the engine
/// now keeps them apart, and `async_direct.rs` guards it.
pub fn unaligned_write_config() -> Config {
    // O_DIRECT stays on: the engine keeps direct and buffered chunks of a write on
    // separate pages and never in flight together (it once mixed them and corrupted the
    // page cache; async_direct.rs guards that).
    small_config()
}

/// A driver (opened once) over its own device of the selected backend.
pub struct Rig {
    /// The device (for allocation, streams, gates, host closures).
    pub device: Arc<dyn UserDevice>,
    /// The driver under test.
    pub driver: Arc<Driver>,
    /// The same device as a [`CpuDevice`] when the backend is `cpu`.
    pub cpu: Option<Arc<CpuDevice>>,
    /// Staging of [`Rig::dev_bytes`] / [`Rig::set_dev_bytes`], allocated once: freeing
    /// pinned memory synchronizes a CUDA device, which never finishes while a test holds
    /// a stream.
    staging: OnceLock<Pinned>,
    /// Streams [`Rig::stream`] made and the test did not destroy: destroyed with the rig,
    /// so that the tests of one process do not pile up streams in the CUDA context
    /// (past about 35 streams, `cuStreamCreate` waits for streams held on wait-values:
    /// README "Known limits").
    streams: Mutex<Vec<StreamHandle>>,
}

impl Drop for Rig {
    fn drop(&mut self) {
        if self.cpu.is_none() {
            dropped_gpu_devices().push(Arc::downgrade(&self.device));
        }
        let streams = std::mem::take(self.streams.get_mut().unwrap_or_else(|p| p.into_inner()));
        for stream in streams {
            // Work still queued on a stream finishes first: CUDA releases a destroyed
            // stream once it is idle, the cpu device drains it.
            let _ = self.device.destroy_user_stream(stream);
        }
    }
}

impl Default for Rig {
    fn default() -> Rig {
        Rig::new()
    }
}

impl Rig {
    /// One device, [`small_config`], driver open (use count 1).
    pub fn new() -> Rig {
        Rig::with(1, small_config())
    }

    /// `devices` devices (on `cpu`; a GPU backend has the machine's) and `config`; the
    /// driver is opened once.
    pub fn with(devices: u32, config: Config) -> Rig {
        let rig = Rig::closed(devices, config);
        rig.driver.open();
        rig
    }

    /// Like [`Rig::with`], but the driver is left closed (use count 0).
    pub fn closed(devices: u32, config: Config) -> Rig {
        let (device, cpu) = open_backend(devices);
        if cpu.is_none() {
            wait_for_earlier_drivers();
        }
        let base: Arc<dyn Device> = Arc::clone(&device) as Arc<dyn Device>;
        let driver = Driver::new(config, base);
        Rig { device, driver, cpu, staging: OnceLock::new(), streams: Mutex::default() }
    }

    /// The backend's name (`cpu`, `cuda`, ...).
    pub fn backend(&self) -> &'static str {
        backend_name(&*self.device)
    }

    /// The `cpu` device, or `None` after printing `skipped on <backend>: <reason>`.
    pub fn cpu_only(&self, reason: &str) -> Option<Arc<CpuDevice>> {
        if self.cpu.is_none() {
            println!("skipped on {}: {reason}", self.backend());
        }
        self.cpu.clone()
    }

    /// A new stream on device 0, not registered.
    pub fn stream(&self) -> StreamHandle {
        let stream = self.device.create_user_stream(0).expect("create stream");
        self.streams.lock().unwrap_or_else(|p| p.into_inner()).push(stream);
        stream
    }

    /// The device and the driver, and the streams [`Rig::stream`] made, which are now
    /// the caller's to destroy. The rest of the rig is dropped, except its pinned
    /// staging, which is leaked: on CUDA freeing pinned memory waits for every stream
    /// held on a wait-value, and the caller may still hold one.
    pub fn into_parts(mut self) -> (Arc<dyn UserDevice>, Arc<Driver>, Vec<StreamHandle>) {
        // (The device is then waited for by the next rig like any dropped rig's.)
        let streams = std::mem::take(self.streams.get_mut().unwrap_or_else(|p| p.into_inner()));
        if let Some(staging) = self.staging.take() {
            staging.leak();
        }
        (Arc::clone(&self.device), Arc::clone(&self.driver), streams)
    }

    /// Submits `per_stream` ops of `op_bytes` on each of `streams` (op `i` of stream `k` at
    /// file and buffer offset `(k * per_stream + i) * op_bytes`), synchronizes every
    /// stream and checks that each op moved all its bytes (`what` names the batch).
    pub fn run_disjoint(
        &self,
        direction: Direction,
        (handle, buffer): (HandleId, u64),
        streams: &[StreamHandle],
        (per_stream, op_bytes): (usize, usize),
        what: &str,
    ) {
        let mut ops = Vec::new();
        for i in 0..per_stream {
            for (k, &stream) in streams.iter().enumerate() {
                let at = ((k * per_stream + i) * op_bytes) as i64;
                let p = params(op_bytes, at, at);
                self.submit(direction, handle, buffer, &p, stream).expect("submit");
                ops.push(p);
            }
        }
        for &stream in streams {
            self.sync(stream);
        }
        let counts: Vec<isize> = ops.iter().map(|p| bytes(p)).collect();
        assert!(counts.iter().all(|&n| n == op_bytes as isize), "{what}: byte counts {counts:?}");
    }

    /// Destroys a stream [`Rig::stream`] made (the rig no longer destroys it on drop).
    pub fn destroy_stream(&self, stream: StreamHandle) {
        self.streams.lock().unwrap_or_else(|p| p.into_inner()).retain(|&s| s != stream);
        self.device.destroy_user_stream(stream).expect("destroy stream");
    }

    /// A new stream on device 0, registered with `flags`.
    pub fn registered_stream(&self, flags: u32) -> StreamHandle {
        let stream = self.stream();
        self.driver.stream_register(stream, flags).expect("register stream");
        stream
    }

    /// A stream registered with `flags`, or an unregistered one for `None`.
    pub fn stream_with(&self, flags: Option<u32>) -> StreamHandle {
        match flags {
            Some(flags) => self.registered_stream(flags),
            None => self.stream(),
        }
    }

    /// Zeroed device memory on device 0 (never freed: it lives as long as the device).
    pub fn alloc(&self, len_bytes: usize) -> u64 {
        self.alloc_on(0, len_bytes)
    }

    /// Zeroed device memory on `device_ordinal`.
    pub fn alloc_on(&self, device_ordinal: u32, len_bytes: usize) -> u64 {
        let addr = self.device.alloc_device(device_ordinal, len_bytes).expect("alloc_device");
        if self.cpu.is_none() {
            // GPU allocations are not zeroed (cpu-device ones are, lazily).
            let stream = self.device.create_user_stream(device_ordinal).expect("stream");
            // SAFETY: a fresh device allocation of `len_bytes`, used by nothing else yet.
            unsafe { self.device.memset_on(stream, addr, 0, len_bytes) }.expect("memset_on");
            self.sync(stream);
            self.device.destroy_user_stream(stream).expect("destroy stream");
        }
        addr
    }

    /// Pauses `stream` at this point: later work waits until the gate is released.
    pub fn pause(&self, stream: StreamHandle) -> Result<StreamGate, DeviceError> {
        // Allocated before any stream is held, so reading device memory while held
        // allocates nothing.
        self.staging();
        StreamGate::pause(&self.device, stream)
    }

    /// Enqueues `closure` as a host function on `stream`. On a GPU backend it must not
    /// call the device API (CUDA forbids it in host functions): read device memory
    /// through a [`Rig::snapshot`] enqueued before it.
    pub fn launch(
        &self,
        stream: StreamHandle,
        closure: impl FnOnce() + Send + 'static,
    ) -> Result<(), DeviceError> {
        self.device.launch_closure(stream, Box::new(closure))
    }

    /// Pinned host memory of `len_bytes` (at least 1).
    pub fn pinned(&self, len_bytes: usize) -> Pinned {
        Pinned::new(&self.device, len_bytes)
    }

    /// Enqueues on `stream` a copy of device `addr..addr+len` into a new pinned buffer:
    /// once the stream has passed it, [`Pinned::bytes`] is what the range held there.
    ///
    /// # Safety
    /// The returned buffer is not dropped before `stream` has run the copy (the stream
    /// was synchronized, or a later host function on it holds a clone).
    pub unsafe fn snapshot(&self, stream: StreamHandle, addr: u64, len: usize) -> Arc<Pinned> {
        let host = Arc::new(self.pinned(len));
        // SAFETY: `host` is pinned and `len` long; the caller keeps it alive until the
        // copy has run; the source is the test's device memory.
        unsafe { self.copy_from_device_on(stream, &host, addr, len) }.expect("copy d2h");
        host
    }

    /// Enqueues a device → pinned copy of `len` bytes on `stream`.
    ///
    /// # Safety
    /// `target` stays allocated until `stream` has run the copy; `len` fits it.
    pub unsafe fn copy_from_device_on(
        &self,
        stream: StreamHandle,
        target: &Pinned,
        source: u64,
        len: usize,
    ) -> Result<(), DeviceError> {
        assert!(len <= target.region.len_bytes, "copy longer than its pinned target");
        // SAFETY: forwarded contract; the target is pinned memory of at least `len`.
        unsafe { self.device.copy_from_device_on(stream, target.region.host_ptr, source, len) }
    }

    /// Enqueues a pinned → device copy of `len` bytes on `stream`.
    ///
    /// # Safety
    /// `source` stays allocated until `stream` has run the copy; `len` fits it; the
    /// target range is the test's device memory.
    pub unsafe fn copy_to_device_on(
        &self,
        stream: StreamHandle,
        target: u64,
        source: &Pinned,
        len: usize,
    ) -> Result<(), DeviceError> {
        assert!(len <= source.region.len_bytes, "copy longer than its pinned source");
        // SAFETY: forwarded contract; the source is pinned memory of at least `len`.
        unsafe { self.device.copy_to_device_on(stream, target, source.region.host_ptr, len) }
    }

    /// Enqueues a memset of device memory on `stream`.
    ///
    /// # Safety
    /// The range is the test's device memory, not used meanwhile outside stream order.
    pub unsafe fn memset_on(
        &self,
        stream: StreamHandle,
        target: u64,
        value: u8,
        len: usize,
    ) -> Result<(), DeviceError> {
        // SAFETY: forwarded contract.
        unsafe { self.device.memset_on(stream, target, value, len) }
    }

    /// Registers `file`'s descriptor.
    pub fn register(&self, file: &std::fs::File) -> HandleId {
        self.driver.handle_register(file.as_raw_fd()).expect("handle_register")
    }

    /// Waits (at most [`HANG_GUARD`]) until `stream` has completed all its work.
    pub fn sync(&self, stream: StreamHandle) {
        let device = Arc::clone(&self.device);
        run_guarded(&format!("synchronize stream {stream:?}"), move || {
            device.synchronize_stream(stream).expect("synchronize_stream")
        });
    }

    /// Safe-form submission.
    pub fn submit(
        &self,
        direction: Direction,
        handle: HandleId,
        buffer: u64,
        params: &Arc<AsyncParams>,
        stream: StreamHandle,
    ) -> Result<(), Error> {
        self.driver.submit_async(direction, handle, buffer, params, stream)
    }

    /// Safe-form read that must be accepted.
    pub fn read(&self, h: HandleId, buffer: u64, p: &Arc<AsyncParams>, s: StreamHandle) {
        self.submit(Direction::Read, h, buffer, p, s).expect("read_async accepted");
    }

    /// Safe-form write that must be accepted.
    pub fn write(&self, h: HandleId, buffer: u64, p: &Arc<AsyncParams>, s: StreamHandle) {
        self.submit(Direction::Write, h, buffer, p, s).expect("write_async accepted");
    }

    /// Copies `len` bytes of device memory at `addr` (see [`read_device`]); allowed
    /// while a stream of the rig is held.
    pub fn dev_bytes(&self, addr: u64, len: usize) -> Vec<u8> {
        read_device_through(&self.device, self.staging(), addr, len)
    }

    /// Writes `bytes` to device memory at `addr` (see [`write_device`]).
    pub fn set_dev_bytes(&self, addr: u64, bytes: &[u8]) {
        write_device_through(&self.device, self.staging(), addr, bytes);
    }

    fn staging(&self) -> &Pinned {
        self.staging.get_or_init(|| Pinned::new(&self.device, STAGING))
    }
}

/// Pinned host memory of the test, freed on drop (never inside a host function: CUDA
/// forbids device calls there).
pub struct Pinned {
    /// The device that frees the region; `None` once [`Pinned::leak`] gave it up.
    device: Option<Arc<dyn UserDevice>>,
    /// The region.
    pub region: PinnedRegion,
}

// SAFETY: the region is plain pinned host memory owned by this value; every access goes
// through `bytes`/`bytes_mut`, which the tests order with stream synchronization or host
// functions (the device copies into it happen before the code that reads it).
unsafe impl Send for Pinned {}
// SAFETY: as above.
unsafe impl Sync for Pinned {}

impl Pinned {
    /// `len_bytes` (at least 1) of pinned memory on `device`.
    pub fn new(device: &Arc<dyn UserDevice>, len_bytes: usize) -> Pinned {
        let region = device.alloc_pinned(len_bytes.max(1)).expect("alloc_pinned");
        Pinned { device: Some(Arc::clone(device)), region }
    }

    /// Drops the device handle without freeing the region (on CUDA freeing pinned memory
    /// waits for every stream held on a wait-value). Only the region leaks: the device
    /// can still go, so a later rig does not wait for it.
    pub fn leak(mut self) {
        self.device = None;
    }

    /// The first `len` bytes, copied out.
    pub fn bytes(&self, len: usize) -> Vec<u8> {
        assert!(len <= self.region.len_bytes);
        // SAFETY: live pinned memory of at least `len` bytes; no copy into it is in
        // flight when the tests read it (see the type's docs).
        unsafe { std::slice::from_raw_parts(self.region.host_ptr, len) }.to_vec()
    }

    /// Fills the start with `data`.
    pub fn fill(&self, data: &[u8]) {
        assert!(data.len() <= self.region.len_bytes);
        // SAFETY: live pinned memory of at least `data.len()` bytes; no copy from it is
        // in flight while the test fills it.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.region.host_ptr, data.len()) };
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if let Some(device) = self.device.take() {
            // SAFETY: every copy using the region has run (the tests synchronize first).
            unsafe { device.free_pinned(self.region) };
        }
    }
}

/// Runs `work` on a helper thread and fails the test if it does not finish within
/// [`HANG_GUARD`] (the helper is left behind; the test has failed anyway).
pub fn run_guarded<T: Send + 'static>(what: &str, work: impl FnOnce() -> T + Send + 'static) -> T {
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(work());
    });
    match receiver.recv_timeout(HANG_GUARD) {
        Ok(value) => value,
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("hang guard: {what} took over 30 s"),
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{what} panicked"),
    }
}

/// Runs `work` on a helper thread and fails the test if it has not finished within
/// `limit`, with `driver`'s [`Driver::pending_report`] in the message. The helper is left
/// behind, stuck, with what it holds (the driver too: a stuck engine is never joined).
pub fn run_watched<T: Send + 'static>(
    driver: &Arc<Driver>,
    what: &str,
    limit: Duration,
    work: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(work());
    });
    match receiver.recv_timeout(limit) {
        Ok(value) => value,
        Err(mpsc::RecvTimeoutError::Timeout) => panic!(
            "HANG: {what} did not finish within {} s\n{}",
            limit.as_secs(),
            driver.pending_report()
        ),
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{what} panicked"),
    }
}

/// Polls `condition` until it holds; fails the test after [`HANG_GUARD`].
pub fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + HANG_GUARD;
    while !condition() {
        assert!(Instant::now() < deadline, "hang guard: waited 30 s for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Checks that `addr..addr+len` lies inside one allocation of device memory.
fn check_device_range(device: &dyn UserDevice, addr: u64, len: usize) {
    let info = device.pointer_info(addr).expect("pointer_info");
    assert_eq!(info.memory_type, MemoryType::Device, "{addr:#x} is not device memory");
    let end = addr.checked_add(len as u64).expect("range overflows");
    assert!(end <= info.allocation_base + info.allocation_len_bytes, "range leaves its allocation");
}

/// Staging size for [`read_device`] / [`write_device`].
const STAGING: usize = 16 * MIB;

/// The single place the tests read device memory: a copy of `len` bytes at `addr`,
/// through pinned staging on a stream of its own (a held stream does not block it).
///
/// Callers read only ranges that no stream or executor is writing at the time (the
/// stream was synchronized, or is held before the op that would write them). Not for
/// host functions (use [`Rig::snapshot`]).
///
/// It allocates and frees pinned staging, which on CUDA waits for every stream of the
/// device: not while a stream is held (use [`Rig::dev_bytes`] there).
pub fn read_device(device: &Arc<dyn UserDevice>, addr: u64, len: usize) -> Vec<u8> {
    read_device_through(device, &Pinned::new(device, len.min(STAGING)), addr, len)
}

/// [`read_device`] through `staging` (of at least `len.min(STAGING)` bytes).
fn read_device_through(
    device: &Arc<dyn UserDevice>,
    staging: &Pinned,
    addr: u64,
    len: usize,
) -> Vec<u8> {
    check_device_range(&**device, addr, len);
    assert!(staging.region.len_bytes >= len.min(STAGING), "staging too small");
    let ordinal = device.pointer_info(addr).expect("pointer_info").device_ordinal;
    let stream = device.create_user_stream(ordinal).expect("create stream");
    let mut out = Vec::with_capacity(len);
    let mut at = 0;
    while at < len {
        let n = (len - at).min(STAGING);
        // SAFETY: `staging` is pinned, at least `n` long, and outlives the copy (the
        // stream is synchronized below); the source range was checked above.
        unsafe { device.copy_from_device_on(stream, staging.region.host_ptr, addr + at as u64, n) }
            .expect("copy_from_device_on");
        sync_stream(device, stream);
        out.extend_from_slice(&staging.bytes(n));
        at += n;
    }
    device.destroy_user_stream(stream).expect("destroy stream");
    out
}

/// The single place the tests write device memory directly (to prepare a buffer); like
/// [`read_device`], not while a stream is held.
pub fn write_device(device: &Arc<dyn UserDevice>, addr: u64, bytes: &[u8]) {
    write_device_through(device, &Pinned::new(device, bytes.len().min(STAGING)), addr, bytes);
}

/// [`write_device`] through `staging` (of at least `bytes.len().min(STAGING)` bytes).
fn write_device_through(device: &Arc<dyn UserDevice>, staging: &Pinned, addr: u64, bytes: &[u8]) {
    check_device_range(&**device, addr, bytes.len());
    assert!(staging.region.len_bytes >= bytes.len().min(STAGING), "staging too small");
    let ordinal = device.pointer_info(addr).expect("pointer_info").device_ordinal;
    let stream = device.create_user_stream(ordinal).expect("create stream");
    for (i, chunk) in bytes.chunks(STAGING).enumerate() {
        staging.fill(chunk);
        let target = addr + (i * STAGING) as u64;
        // SAFETY: as in `read_device`; no stream or executor uses the range meanwhile.
        unsafe { device.copy_to_device_on(stream, target, staging.region.host_ptr, chunk.len()) }
            .expect("copy_to_device_on");
        sync_stream(device, stream);
    }
    device.destroy_user_stream(stream).expect("destroy stream");
}

/// Synchronizes `stream` under the hang guard.
fn sync_stream(device: &Arc<dyn UserDevice>, stream: StreamHandle) {
    let device = Arc::clone(device);
    run_guarded(&format!("synchronize stream {stream:?}"), move || {
        device.synchronize_stream(stream).expect("synchronize_stream")
    });
}

/// Deterministic, non-periodic test data: byte `i` of stream `seed`.
pub fn pattern_byte(seed: u64, i: u64) -> u8 {
    let mut x = i.wrapping_add(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    x = (x ^ (x >> 31)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 29;
    (x >> 24) as u8
}

/// `len` bytes of [`pattern_byte`] for `seed`.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len as u64).map(|i| pattern_byte(seed, i)).collect()
}

/// A file in `std::env::temp_dir()` with a unique name, removed on drop.
pub struct TempFile {
    /// Its path.
    pub path: PathBuf,
}

impl TempFile {
    /// Creates the file with `contents`.
    pub fn new(tag: &str, contents: &[u8]) -> TempFile {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let unique = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("hipfile-async-{}-{tag}-{unique}", std::process::id());
        let path = std::env::temp_dir().join(name);
        std::fs::write(&path, contents).expect("create test file");
        TempFile { path }
    }

    /// Opened read-write.
    pub fn open_rw(&self) -> std::fs::File {
        std::fs::OpenOptions::new().read(true).write(true).open(&self.path).expect("open rw")
    }

    /// Opened read-only.
    pub fn open_ro(&self) -> std::fs::File {
        std::fs::File::open(&self.path).expect("open ro")
    }

    /// Opened write-only.
    pub fn open_wo(&self) -> std::fs::File {
        std::fs::OpenOptions::new().write(true).open(&self.path).expect("open wo")
    }

    /// The current contents.
    pub fn contents(&self) -> Vec<u8> {
        std::fs::read(&self.path).expect("read test file")
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Parameters for the safe form.
pub fn params(size: usize, file_offset: i64, buffer_offset: i64) -> Arc<AsyncParams> {
    let p = AsyncParams::new(size, file_offset);
    p.buffer_offset_bytes.store(buffer_offset, Ordering::SeqCst);
    p
}

/// `*bytes_p` of an op.
pub fn bytes(p: &AsyncParams) -> isize {
    p.bytes_done.load(Ordering::SeqCst)
}

/// Raw-form arguments: hipFile's parameter pointers, as the C API passes them (its own
/// `ParamSource` lives in `hipfile-capi`; this is the tests' copy of that shape).
#[derive(Clone, Copy, Debug)]
pub struct AsyncArgs {
    /// `size_t *size_p`.
    pub size_p: *const usize,
    /// `hoff_t *file_offset_p`.
    pub file_offset_p: *const i64,
    /// `hoff_t *buffer_offset_p`.
    pub buffer_offset_p: *const i64,
    /// `ssize_t *bytes_p`.
    pub bytes_p: *mut isize,
}

// SAFETY: the tests keep what the pointers point to alive until the op has published
// (`submit_args`'s contract); they are only accessed with volatile reads and writes.
unsafe impl Send for AsyncArgs {}
// SAFETY: as above.
unsafe impl Sync for AsyncArgs {}

// SAFETY: `submit_args`'s contract keeps every non-NULL pointer valid while the op holds
// the args; `read` refuses NULL ones, and the runtime only reads or writes the result
// slot after a successful `read`.
unsafe impl ParamSource for AsyncArgs {
    fn read(&self) -> Option<RawIo> {
        let null = self.size_p.is_null()
            || self.file_offset_p.is_null()
            || self.buffer_offset_p.is_null()
            || self.bytes_p.is_null();
        if null {
            return None;
        }
        // SAFETY: not NULL, and valid per the contract.
        unsafe {
            Some(RawIo {
                size_bytes: self.size_p.read_volatile() as u64,
                file_offset_bytes: self.file_offset_p.read_volatile(),
                buffer_offset_bytes: self.buffer_offset_p.read_volatile(),
            })
        }
    }

    fn published(&self) -> isize {
        // SAFETY: as in `read` (not NULL once `read` succeeded).
        unsafe { self.bytes_p.read_volatile() }
    }

    fn publish(&self, bytes: isize) {
        // SAFETY: as in `published`.
        unsafe { self.bytes_p.write_volatile(bytes) };
    }
}

/// Raw-form arguments pointing into `p` (the caller keeps `p` alive until the op is done).
pub fn args_of(p: &AsyncParams) -> AsyncArgs {
    AsyncArgs {
        size_p: p.size_bytes.as_ptr(),
        file_offset_p: p.file_offset_bytes.as_ptr(),
        buffer_offset_p: p.buffer_offset_bytes.as_ptr(),
        bytes_p: p.bytes_done.as_ptr(),
    }
}

/// Raw-form submission, as `hipFileReadAsync` / `hipFileWriteAsync` make it.
///
/// # Safety
/// The non-NULL pointers in `args` stay valid until the op has published (or the call
/// failed); `buffer` stays allocated until the stream has passed the op.
pub unsafe fn submit_args(
    driver: &Arc<Driver>,
    direction: Direction,
    handle: HandleId,
    buffer: u64,
    args: AsyncArgs,
    stream: StreamHandle,
) -> Result<(), Error> {
    driver.submit_async_from(direction, handle, buffer, Arc::new(args), stream)
}

/// The hipFile code of a submission result (`Success` for `Ok`).
pub fn code(result: Result<(), Error>) -> OpError {
    match result {
        Ok(()) => OpError::Success,
        Err(error) => error.code,
    }
}

/// `-code` as published in `*bytes_p`.
pub fn neg(code: OpError) -> isize {
    -(code.code() as isize)
}

/// Asserts `got == want`, reporting the first differing index instead of both buffers.
#[track_caller]
pub fn assert_bytes(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    if let Some(i) = got.iter().zip(want).position(|(g, w)| g != w) {
        panic!("{what}: first difference at byte {i}: got {:#04x}, want {:#04x}", got[i], want[i]);
    }
}

/// Asserts every byte of `got` is `value`.
#[track_caller]
pub fn assert_all(got: &[u8], value: u8, what: &str) {
    if let Some(i) = got.iter().position(|&g| g != value) {
        panic!("{what}: byte {i} is {:#04x}, want {value:#04x}", got[i]);
    }
}

/// Fails the whole test process, instead of letting it hang, when it is not dropped
/// within `limit`: it prints what the case was, the driver's
/// [`Driver::pending_report`] (every stream's submitted / reached / released sequence
/// numbers, the arm poller, the engine) and exits with status 101 (as a failed test).
pub struct Watchdog {
    done: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    /// Arms the watchdog for the case `what` on `driver`.
    pub fn arm(driver: &Arc<Driver>, what: String, limit: Duration) -> Watchdog {
        let (done, wait) = mpsc::channel::<()>();
        let driver = Arc::clone(driver);
        let thread = std::thread::spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = wait.recv_timeout(limit) {
                // Straight to the process's stderr: the test harness captures `eprintln!`
                // (of this thread too) and prints it only for a test that returns, which
                // `exit` prevents (a CI run's HANG showed no report at all).
                let report = format!(
                    "HANG: {what} did not finish within {} s\n{}\n",
                    limit.as_secs(),
                    driver.pending_report()
                );
                let _ = std::io::Write::write_all(&mut std::io::stderr(), report.as_bytes());
                std::process::exit(101);
            }
        });
        Watchdog { done: Some(done), thread: Some(thread) }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        drop(self.done.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Runs the test `test` of this test binary in a child process with `variable=value` set
/// (for what cannot be undone in-process: a seccomp filter, a lowered limit); prints the
/// child's output and fails when it fails or has not finished within `limit` (killed).
pub fn run_in_child(test: &str, variable: &str, value: &str, limit: Duration) {
    use std::io::Read;
    use std::process::{Command, Stdio};
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(variable, value)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn child");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait child") {
            break Some(status);
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut output = String::new();
    child.stdout.take().map(|mut out| out.read_to_string(&mut output));
    child.stderr.take().map(|mut err| err.read_to_string(&mut output));
    println!("{output}");
    match status {
        None => panic!("{value}: the child hung for {} s\n{output}", limit.as_secs()),
        Some(status) => assert!(status.success(), "{value}: the child failed\n{output}"),
    }
}

/// SplitMix64: sizes and offsets, reproducible per seed.
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Log-uniform in 1..=max.
    pub fn size(&mut self, max: usize) -> usize {
        let bits = self.below(max.ilog2() as usize + 1);
        let low = 1usize << bits;
        (low + self.below(low)).min(max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A leaked staging region keeps no hold on its device: `Rig::into_parts` leaks its
    /// staging, and a device kept alive by it made every later GPU rig of the process wait
    /// 10 s for it (`wait_for_earlier_drivers`).
    #[test]
    fn a_leaked_pinned_region_lets_its_device_go() {
        let device: Arc<dyn UserDevice> = hipfile_runtime::device::cpu::CpuDevice::new(1);
        let weak = Arc::downgrade(&device);
        let pinned = Pinned::new(&device, 4096);
        assert_eq!(weak.strong_count(), 2, "the region holds its device");
        pinned.leak();
        assert_eq!(weak.strong_count(), 1, "leaked: only the test's handle is left");
        drop(device);
        assert!(weak.upgrade().is_none());
    }
}
