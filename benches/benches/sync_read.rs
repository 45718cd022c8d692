//! Synchronous read throughput and latency of hipfile-rs on the `cpu` device, against
//! plain `pread` loops in the same run.
//!
//! ```text
//! cargo bench -p hipfile-bench --bench sync_read
//! HIPFILE_BENCH_BYTES=268435456 cargo bench -p hipfile-bench --bench sync_read
//! ```
//!
//! - **buffered (page cache hot)**: the driver with `HIPFILE_ODIRECT=off` semantics
//!   (every byte through the page cache) vs `pread` of 1 MiB chunks into host memory.
//! - **direct (O_DIRECT)**: the driver with O_DIRECT on (the file is opened `O_RDONLY`;
//!   the driver opens its own O_DIRECT descriptor) vs `pread` of 1 MiB chunks on an
//!   `O_RDONLY | O_DIRECT` descriptor. O_DIRECT bypasses the page cache: both read the
//!   disk.
//! - **4 KiB round trip**: 10 000 reads of 4 KiB from the hot file through the driver
//!   (the hand-off to an executor and back) vs 10 000 `pread`s of 4 KiB.
//!
//! Throughput is the median of 5 runs after one warm-up run. Other `HIPFILE_*` variables
//! configure the engine; the file goes to the temporary directory (`TMPDIR`).

use std::error::Error;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hipfile_core::{Direction, RawIo};
use hipfile_runtime::Driver;
use hipfile_runtime::config::Config;
use hipfile_runtime::device::cpu::CpuDevice;
use hipfile_runtime::file::DirectPolicy;

const MIB: usize = 1 << 20;
const DEFAULT_BYTES: usize = 1 << 30;
const RUNS: usize = 5;
const BASELINE_CHUNK: usize = MIB;
const SMALL_READ: usize = 4096;
const SMALL_READS: usize = 10_000;
/// The small reads cycle over the first bytes of the file (hot in the page cache).
const SMALL_READ_SPAN: usize = 64 * MIB;

fn main() -> Result<(), Box<dyn Error>> {
    let requested = match std::env::var("HIPFILE_BENCH_BYTES") {
        Ok(value) => value.trim().parse::<usize>()?,
        Err(_) => DEFAULT_BYTES,
    };
    // Whole MiB, so that every O_DIRECT baseline read is aligned.
    let bytes = requested.div_ceil(MIB).max(1) * MIB;
    let path = std::env::temp_dir().join(format!("hipfile-bench-sync-read-{}", std::process::id()));
    let file = BenchFile::create(path, bytes)?;
    let result = run(&file, bytes);
    drop(file);
    result
}

fn run(file: &BenchFile, bytes: usize) -> Result<(), Box<dyn Error>> {
    let base = Config::from_env()?;
    println!(
        "sync_read: {} MiB file {}, {} executor(s), chunk {} KiB, staging {} MiB/executor, {} runs (median)",
        bytes / MIB,
        file.path.display(),
        base.executor_count(),
        base.staging_chunk_bytes / 1024,
        base.staging_per_executor_bytes / MIB,
        RUNS
    );
    let device = CpuDevice::new(1);
    let device_buf = device.malloc_device(0, bytes)?;
    let mut host = AlignedBuffer::new(bytes);
    let client = File::open(&file.path)?;
    let direct_client =
        OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(&file.path)?;

    // Buffered, page cache hot.
    let buffered = driver(&base, DirectPolicy::Off, &device);
    let handle = buffered.handle_register(client.as_raw_fd())?;
    pread_loop(client.as_raw_fd(), host.as_mut_slice())?; // warms the page cache
    let ours_buffered = median_gbps(bytes, || read_all(&buffered, handle, device_buf, bytes))?;
    check(device_buf, bytes, "buffered");
    let base_buffered = median_gbps(bytes, || pread_loop(client.as_raw_fd(), host.as_mut_slice()))?;
    let counters = buffered.file(handle)?.counters();
    assert_eq!(counters.direct_read_bytes, 0, "the buffered case used O_DIRECT");

    // 4 KiB round trips on the hot file.
    let small_ours = latencies(|offset| {
        let raw = raw_io(SMALL_READ, offset);
        let n = buffered
            .io_sync(Direction::Read, handle, device_buf, raw)
            .map_err(|e| e.to_string())?;
        Ok(n)
    })?;
    let small_base = latencies(|offset| {
        let target = &mut host.as_mut_slice()[..SMALL_READ];
        pread(client.as_raw_fd(), target, offset).map_err(|e| e.to_string())
    })?;
    buffered.handle_deregister(handle);
    drop(buffered);

    // O_DIRECT.
    let direct = driver(&base, DirectPolicy::On, &device);
    let handle = direct.handle_register(client.as_raw_fd())?;
    let has_direct = direct.file(handle)?.direct_fd().is_some();
    let ours_direct = median_gbps(bytes, || read_all(&direct, handle, device_buf, bytes))?;
    check(device_buf, bytes, "direct");
    let base_direct =
        median_gbps(bytes, || pread_loop(direct_client.as_raw_fd(), host.as_mut_slice()))?;
    let counters = direct.file(handle)?.counters();
    direct.handle_deregister(handle);
    drop(direct);

    println!();
    println!(
        "{:<34} {:>12} {:>14} {:>8}",
        "throughput (GB/s)", "hipfile-rs", "pread 1 MiB", "ratio"
    );
    row_gbps("buffered (page cache hot)", ours_buffered, base_buffered);
    let direct_label =
        if has_direct { "direct (O_DIRECT)" } else { "direct (no O_DIRECT: fs refused)" };
    row_gbps(direct_label, ours_direct, base_direct);
    println!();
    println!(
        "{:<34} {:>12} {:>14} {:>8}",
        "4 KiB read, hot (us)", "hipfile-rs", "pread 4 KiB", "ratio"
    );
    row_latency("p50", small_ours.percentile(50), small_base.percentile(50));
    row_latency("p99", small_ours.percentile(99), small_base.percentile(99));
    println!();
    println!(
        "direct case: {} MiB through O_DIRECT, {} KiB through the page cache (per run: {} MiB)",
        counters.direct_read_bytes >> 20,
        counters.buffered_read_bytes >> 10,
        bytes / MIB
    );
    // SAFETY: no I/O on the buffer is in flight (both drivers are gone) and no reference
    // into it exists.
    unsafe { device.free_device(device_buf) }?;
    Ok(())
}

fn driver(base: &Config, direct: DirectPolicy, device: &Arc<CpuDevice>) -> Arc<Driver> {
    let mut config = base.clone();
    config.direct = direct;
    let driver = Driver::new(config, device.clone());
    driver.open();
    driver
}

fn raw_io(size_bytes: usize, file_offset_bytes: usize) -> RawIo {
    RawIo {
        size_bytes: size_bytes as u64,
        file_offset_bytes: file_offset_bytes as i64,
        buffer_offset_bytes: 0,
    }
}

fn read_all(
    driver: &Driver,
    handle: hipfile_runtime::HandleId,
    device_buf: u64,
    bytes: usize,
) -> Result<(), Box<dyn Error>> {
    let n = driver.io_sync(Direction::Read, handle, device_buf, raw_io(bytes, 0))?;
    if n != bytes {
        return Err(format!("driver read {n} of {bytes} bytes").into());
    }
    Ok(())
}

/// Reads the whole file with `pread` in 1 MiB chunks.
fn pread_loop(fd: i32, target: &mut [u8]) -> Result<(), Box<dyn Error>> {
    for (i, chunk) in target.chunks_mut(BASELINE_CHUNK).enumerate() {
        let n = pread(fd, chunk, i * BASELINE_CHUNK)?;
        if n != chunk.len() {
            return Err(format!("pread returned {n} of {} bytes", chunk.len()).into());
        }
    }
    Ok(())
}

fn pread(fd: i32, target: &mut [u8], offset: usize) -> std::io::Result<usize> {
    // SAFETY: `target` is a live, exclusively borrowed buffer of `target.len()` bytes; the
    // kernel writes at most that many.
    let n = unsafe { libc::pread(fd, target.as_mut_ptr().cast(), target.len(), offset as i64) };
    usize::try_from(n).map_err(|_| std::io::Error::last_os_error())
}

/// One warm-up run, then the median throughput of [`RUNS`] runs, in GB/s.
fn median_gbps(
    bytes: usize,
    mut run: impl FnMut() -> Result<(), Box<dyn Error>>,
) -> Result<f64, Box<dyn Error>> {
    run()?;
    let mut rates = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let start = Instant::now();
        run()?;
        rates.push(bytes as f64 / start.elapsed().as_secs_f64() / 1e9);
    }
    rates.sort_by(f64::total_cmp);
    Ok(rates[RUNS / 2])
}

struct Latencies(Vec<Duration>);

impl Latencies {
    fn percentile(&self, p: usize) -> Duration {
        self.0[((self.0.len() - 1) * p / 100).min(self.0.len() - 1)]
    }
}

/// Times [`SMALL_READS`] reads of [`SMALL_READ`] bytes (after 1 000 untimed ones),
/// cycling over the first [`SMALL_READ_SPAN`] bytes of the file.
fn latencies(
    mut read: impl FnMut(usize) -> Result<usize, String>,
) -> Result<Latencies, Box<dyn Error>> {
    let offset = |i: usize| (i * 7919 * SMALL_READ) % SMALL_READ_SPAN;
    for i in 0..1000 {
        read(offset(i))?;
    }
    let mut times = Vec::with_capacity(SMALL_READS);
    for i in 0..SMALL_READS {
        let start = Instant::now();
        let n = read(offset(i))?;
        times.push(start.elapsed());
        if n != SMALL_READ {
            return Err(format!("small read returned {n} bytes").into());
        }
    }
    times.sort();
    Ok(Latencies(times))
}

fn row_gbps(label: &str, ours: f64, baseline: f64) {
    println!("{label:<34} {ours:>12.2} {baseline:>14.2} {:>8.2}", ours / baseline);
}

fn row_latency(label: &str, ours: Duration, baseline: Duration) {
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!(
        "{label:<34} {:>12.1} {:>14.1} {:>8.2}",
        us(ours),
        us(baseline),
        us(ours) / us(baseline)
    );
}

/// The byte at `offset` of the bench file.
fn expected_byte(offset: usize) -> u8 {
    (offset ^ (offset >> 11) ^ (offset >> 23)) as u8
}

/// Spot-checks the device buffer against the file's pattern (one byte per 4 KiB page
/// plus the last byte).
fn check(device_buf: u64, bytes: usize, what: &str) {
    // SAFETY: `cpu` device memory is host memory; the buffer holds `bytes` bytes and the
    // read that filled it has returned, so nothing writes it while we look.
    let got = unsafe { std::slice::from_raw_parts(device_buf as *const u8, bytes) };
    for offset in (0..bytes).step_by(4093).chain([bytes - 1]) {
        assert_eq!(got[offset], expected_byte(offset), "{what}: byte {offset} differs");
    }
}

/// The benchmark file, removed on drop.
struct BenchFile {
    path: PathBuf,
}

impl BenchFile {
    fn create(path: PathBuf, bytes: usize) -> Result<BenchFile, Box<dyn Error>> {
        let file = BenchFile { path };
        write_pattern(&file.path, bytes)?;
        Ok(file)
    }
}

impl Drop for BenchFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn write_pattern(path: &Path, bytes: usize) -> Result<(), Box<dyn Error>> {
    let mut out = File::create(path)?;
    let mut block = vec![0u8; 8 * MIB];
    let mut offset = 0;
    while offset < bytes {
        let len = block.len().min(bytes - offset);
        for (i, byte) in block[..len].iter_mut().enumerate() {
            *byte = expected_byte(offset + i);
        }
        out.write_all(&block[..len])?;
        offset += len;
    }
    out.sync_all()?;
    Ok(())
}

/// Page-aligned host memory (O_DIRECT needs aligned buffers), touched once.
struct AlignedBuffer {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

impl AlignedBuffer {
    fn new(len: usize) -> AlignedBuffer {
        let layout = std::alloc::Layout::from_size_align(len, 4096).expect("layout");
        // SAFETY: `layout` has a non-zero size (the file is at least 1 MiB).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "cannot allocate {len} bytes of host memory");
        AlignedBuffer { ptr, layout }
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` is a live allocation of `layout.size()` initialised (zeroed) bytes,
        // exclusively borrowed through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.layout.size()) }
    }
}

impl Drop for AlignedBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}
