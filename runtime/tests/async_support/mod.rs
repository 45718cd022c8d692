//! Helpers shared by the async integration tests (`async_*.rs`): a driver over a fresh
//! `cpu` device with a small engine, temporary files, device-memory access, hang guards.
//!
//! Every blocking wait here has a 30 s watchdog: a test fails instead of hanging. Time is
//! never asserted on otherwise.
#![allow(dead_code, reason = "shared by several test crates; each uses a subset")]

use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use hipfile_core::{Direction, OpError};
use hipfile_runtime::config::Config;
use hipfile_runtime::device::cpu::CpuDevice;
use hipfile_runtime::device::{Device, MemoryType, StreamHandle};
use hipfile_runtime::{AsyncArgs, AsyncParams, Driver, Error, HandleId};

/// One KiB.
pub const KIB: usize = 1 << 10;
/// One MiB.
pub const MIB: usize = 1 << 20;
/// How long any wait may take before the test fails as hung.
pub const HANG_GUARD: Duration = Duration::from_secs(30);

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

/// A driver (opened once) over its own `cpu` device.
pub struct Rig {
    /// The device (for allocation, streams, gates, host closures).
    pub device: Arc<CpuDevice>,
    /// The driver under test.
    pub driver: Arc<Driver>,
}

impl Rig {
    /// One device, [`small_config`], driver open (use count 1).
    pub fn new() -> Rig {
        Rig::with(1, small_config())
    }

    /// `devices` cpu devices and `config`; the driver is opened once.
    pub fn with(devices: u32, config: Config) -> Rig {
        let rig = Rig::closed(devices, config);
        rig.driver.open();
        rig
    }

    /// Like [`Rig::with`], but the driver is left closed (use count 0).
    pub fn closed(devices: u32, config: Config) -> Rig {
        let device = CpuDevice::new(devices);
        let driver = Driver::new(config, device.clone());
        Rig { device, driver }
    }

    /// A new stream on device 0, not registered.
    pub fn stream(&self) -> StreamHandle {
        self.device.create_stream(0).expect("create stream")
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

    /// Zeroed device memory on device 0.
    pub fn alloc(&self, len_bytes: usize) -> u64 {
        self.device.malloc_device(0, len_bytes).expect("malloc_device")
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

    /// Copies `len` bytes of device memory at `addr` (see [`read_device`]).
    pub fn dev_bytes(&self, addr: u64, len: usize) -> Vec<u8> {
        read_device(&self.device, addr, len)
    }

    /// Writes `bytes` to device memory at `addr` (see [`write_device`]).
    pub fn set_dev_bytes(&self, addr: u64, bytes: &[u8]) {
        write_device(&self.device, addr, bytes);
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

/// Polls `condition` until it holds; fails the test after [`HANG_GUARD`].
pub fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + HANG_GUARD;
    while !condition() {
        assert!(Instant::now() < deadline, "hang guard: waited 30 s for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Checks that `addr..addr+len` lies inside one `cpu`-device allocation of device memory.
fn check_device_range(device: &CpuDevice, addr: u64, len: usize) {
    let info = device.pointer_info(addr).expect("pointer_info");
    assert_eq!(info.memory_type, MemoryType::Device, "{addr:#x} is not device memory");
    let end = addr.checked_add(len as u64).expect("range overflows");
    assert!(end <= info.allocation_base + info.allocation_len_bytes, "range leaves its allocation");
}

/// The single place the tests read device memory: a copy of `len` bytes at `addr`.
///
/// Callers read only ranges that no stream or executor is writing at the time (the
/// stream was synchronized, or is held before the op that would write them).
pub fn read_device(device: &CpuDevice, addr: u64, len: usize) -> Vec<u8> {
    check_device_range(device, addr, len);
    // SAFETY: `cpu` device memory is host memory, and the range lies inside one live
    // device allocation (checked above) that the test owns and does not free while this
    // runs; the bytes are initialised (allocations are zeroed). Callers only read ranges
    // nothing writes meanwhile (see above), and the slice does not outlive the copy.
    unsafe { std::slice::from_raw_parts(addr as usize as *const u8, len) }.to_vec()
}

/// The single place the tests write device memory directly (to prepare a buffer).
pub fn write_device(device: &CpuDevice, addr: u64, bytes: &[u8]) {
    check_device_range(device, addr, bytes.len());
    // SAFETY: as in `read_device`: a live device allocation of the test's, host memory on
    // the `cpu` device, and no stream or executor accesses the range meanwhile.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), addr as usize as *mut u8, bytes.len()) };
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

/// Raw-form arguments pointing into `p` (the caller keeps `p` alive until the op is done).
pub fn args_of(p: &AsyncParams) -> AsyncArgs {
    AsyncArgs {
        size_p: p.size_bytes.as_ptr(),
        file_offset_p: p.file_offset_bytes.as_ptr(),
        buffer_offset_p: p.buffer_offset_bytes.as_ptr(),
        bytes_p: p.bytes_done.as_ptr(),
    }
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
