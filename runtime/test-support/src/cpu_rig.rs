//! Helpers of the synchronous-I/O tests (`sync`, `engine`, ...): a small engine
//! configuration, one driver per test over its own `cpu` device, temporary files, test
//! data, and device-memory access.

pub use crate::page_cache;

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use hipfile_runtime::Driver;
use hipfile_runtime::config::{BufferedWrites, Config, DeviceSelection};
use hipfile_runtime::device::StreamHandle;
use hipfile_runtime::device::cpu::{CpuDevice, StreamGate};
use hipfile_runtime::file::DirectPolicy;

/// One KiB.
pub const KIB: usize = 1 << 10;
/// One MiB.
pub const MIB: usize = 1 << 20;
/// The staging chunk of [`config`]: requests above it split into chunks.
pub const CHUNK: usize = 256 * KIB;
/// Hang guard for anything that should finish.
pub const HANG_GUARD: Duration = Duration::from_secs(20);

/// A small engine on `cpus` (one executor each): 256 KiB chunks, 8 MiB of staging per
/// executor, a 4 MiB pinned fallback cap, the `auto` O_DIRECT policy.
pub fn config(cpus: &[usize]) -> Config {
    let config = Config {
        device: DeviceSelection::Cpu,
        executor_cpus: cpus.to_vec(),
        request_parallelism: cpus.len(),
        busy_fan_out: None,
        loaded_fan_out: None,
        staging_chunk_bytes: CHUNK,
        staging_per_executor_bytes: 8 * MIB,
        pinned_fallback_cap_bytes: 4 * MIB,
        chunks_in_flight: 4,
        copy_spin_us: 200,
        park_spin_us: None,
        prefetch_budget_bytes: None,
        cpu_device_count: 1,
        direct: DirectPolicy::Auto,
        allow_compat_mode: true,
        use_io_uring: true,
        buffered_writes: BufferedWrites::Thread,
        caller_thread: hipfile_runtime::config::CallerThread::Small,
        stream_copies: hipfile_runtime::config::StreamCopies::Off,
        // The engine's path: the inline reads' own tests turn them on.
        inline_read_bytes: 0,
        stream_copy_cap_bytes: 64 << 20,
        stream_copy_piece_bytes: 16 << 20,
        // On in the tests (off by default: no faster on an H100): writes copied on their
        // stream (under `all`) go in 1 MiB pieces.
        stream_write_piece_bytes: 1 << 20,
        stream_copy_writes: true,
        stream_copy_slots: hipfile_runtime::config::StreamCopySlots::Pinned,
        stream_copy_device_cap_bytes: 64 << 20,
        stream_copy_device_full: hipfile_runtime::config::DeviceSlotsFull::Share,
        stream_copy_device_idle_ms: 5_000,
    };
    config.validate().expect("test config is valid");
    config
}

/// A driver over a `cpu` device of its own (one device), not yet opened.
pub fn driver_with(config: Config) -> (Arc<Driver>, Arc<CpuDevice>) {
    let device = CpuDevice::new(1);
    (Driver::new(config, device.clone()), device)
}

/// [`driver_with`] the [`config`] of CPUs 0 and 1.
pub fn driver() -> (Arc<Driver>, Arc<CpuDevice>) {
    driver_with(config(&[0, 1]))
}

/// A directory on a disk file system (O_DIRECT works there).
pub fn ext4_dir() -> PathBuf {
    std::env::temp_dir()
}

/// A tmpfs directory (no O_DIRECT: the engine takes the buffered path).
pub fn tmpfs_dir() -> PathBuf {
    PathBuf::from("/dev/shm")
}

/// A file with a unique name, removed on drop.
pub struct TempFile {
    /// Where it is.
    pub path: PathBuf,
}

impl TempFile {
    /// Creates the file in `dir` with `contents`.
    pub fn new(dir: &Path, contents: &[u8]) -> TempFile {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let unique = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!("hipfile-sync-io-{}-{unique}", std::process::id()));
        std::fs::write(&path, contents).expect("create test file");
        TempFile { path }
    }

    /// Opens it for reading and writing.
    pub fn open_rw(&self) -> File {
        self.open_with(OpenOptions::new().read(true).write(true))
    }

    /// Opens it with `options`.
    pub fn open_with(&self, options: &mut OpenOptions) -> File {
        options.open(&self.path).expect("open test file")
    }

    /// What the file holds now.
    pub fn contents(&self) -> Vec<u8> {
        std::fs::read(&self.path).expect("read test file")
    }

    /// Drops the file's pages from the page cache (written or read through it, they are
    /// cached, and under the auto policy a read of a range the cache holds entirely takes
    /// the cache instead of O_DIRECT).
    pub fn uncache(&self) {
        page_cache::drop_cached_pages(&self.open_rw());
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Deterministic pseudo-random bytes (xorshift64), different for each seed.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8);
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// A copy of `len` bytes of `cpu` device memory at `addr`.
pub fn device_bytes(addr: u64, len: usize) -> Vec<u8> {
    // SAFETY: `cpu` device memory is host memory. Callers pass a range inside one live
    // `malloc_device` allocation, and no I/O on it is in flight while we copy.
    unsafe { std::slice::from_raw_parts(addr as *const u8, len) }.to_vec()
}

/// Stores `bytes` into `cpu` device memory at `addr`.
pub fn fill_device(addr: u64, bytes: &[u8]) {
    // SAFETY: as for `device_bytes`: a range inside one live allocation, no I/O in
    // flight on it, and `bytes` is ordinary host memory (no overlap).
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), addr as *mut u8, bytes.len()) };
}

/// Polls `condition` until it holds; fails the test after the hang guard.
pub fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + HANG_GUARD;
    while !condition() {
        assert!(Instant::now() < deadline, "hang guard: {what} never became true");
        thread::yield_now();
    }
}

/// A driver with one executor over its own `cpu` device, a `len`-byte pattern file on
/// tmpfs registered, a registered buffer of `len` bytes and a spare 4 KiB one, ready to
/// hold a read of the whole file in flight ([`ReadInFlight::hold`]).
pub struct ReadInFlight {
    /// The driver.
    pub driver: Arc<Driver>,
    /// Its device.
    pub device: Arc<CpuDevice>,
    /// The file's bytes.
    pub data: Vec<u8>,
    /// The file (removed on drop).
    pub file: TempFile,
    /// The descriptor registered as `handle`.
    pub client: File,
    /// The registered file.
    pub handle: hipfile_runtime::HandleId,
    /// Registered, `len` bytes: the held read's destination.
    pub buf: u64,
    /// Not registered, 4 KiB.
    pub other: u64,
    /// The file's and the read's length.
    pub len: usize,
}

impl ReadInFlight {
    /// The setup, with the file's bytes from `pattern(len, seed)`.
    pub fn new(len: usize, seed: u64) -> ReadInFlight {
        use std::os::fd::AsRawFd;
        let data = pattern(len, seed);
        let file = TempFile::new(&tmpfs_dir(), &data);
        let client = file.open_rw();
        let (driver, device) = driver_with(config(&[0]));
        let handle = driver.handle_register(client.as_raw_fd()).expect("handle_register");
        let buf = device.malloc_device(0, len).expect("malloc_device");
        let other = device.malloc_device(0, 4096).expect("malloc_device");
        driver.buf_register(buf, len as u64, 0).expect("buf_register");
        ReadInFlight { driver, device, data, file, client, handle, buf, other, len }
    }

    /// Reads the whole file into `buf` on another thread while the device's streams are
    /// gated, runs `during` while that read is in flight (it cannot finish), then opens
    /// the gates: the read returns every byte.
    pub fn hold(&self, during: impl FnOnce(&hipfile_runtime::file::FileHandle)) {
        use hipfile_core::Direction;
        let read = || {
            self.driver.io_sync(Direction::Read, self.handle, self.buf, crate::raw(self.len, 0, 0))
        };
        // A first read creates the executor's internal stream (larger than a chunk:
        // smaller requests run on the caller's thread and use no executor).
        assert_eq!(read(), Ok(self.len));
        let file_handle = self.driver.file(self.handle).expect("file");
        // The first read's op may still be finishing on the executor after it returned.
        eventually("first read drained", || file_handle.ops_in_flight() == 0);
        let gates = gate_streams(&self.device);
        assert!(!gates.is_empty(), "found no stream of the device to gate");
        thread::scope(|scope| {
            let reader = scope.spawn(read);
            // The buffer is marked in use before the handle's first op starts.
            eventually("read in flight", || file_handle.ops_in_flight() > 0);
            during(&file_handle);
            assert!(!reader.is_finished(), "the gated read cannot have finished");
            drop(gates);
            assert_eq!(reader.join().expect("reader"), Ok(self.len));
        });
        assert!(device_bytes(self.buf, self.len) == self.data, "data of the read in flight");
        eventually("ops drained", || file_handle.ops_in_flight() == 0);
    }
}

/// Gates every stream of `device` that exists now (the executors' internal streams,
/// created by a first I/O), so that device copies enqueued afterwards wait until the
/// gates are dropped: a synchronous I/O then stays in flight as long as the test wants.
/// Streams run on threads named `hfcpu-s<handle>`; another device's handles are refused
/// by `pause_stream`, so only this device's streams are gated.
pub fn gate_streams(device: &CpuDevice) -> Vec<StreamGate> {
    let mut gates = Vec::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return gates };
    for task in tasks.flatten() {
        let Ok(comm) = std::fs::read_to_string(task.path().join("comm")) else { continue };
        let handle = comm.trim().strip_prefix("hfcpu-s").and_then(|h| h.parse::<usize>().ok());
        if let Some(handle) = handle.filter(|&h| h != 0)
            && let Ok(gate) = device.pause_stream(StreamHandle(handle))
        {
            gates.push(gate);
        }
    }
    gates
}
