//! `--mode batch`: small random reads of a hot file, many in flight, through batches
//! (`hipFileBatchIO*`) of 32..128 entries, against our async path (8 streams), our
//! sync path and cuFile's sync path with 8 threads, and cuFile's own batch API in
//! compat mode (when libcufile accepts it), all in one run.
//!
//! Every path reads the same pseudo-random 4 KiB-aligned offsets into the device buffer
//! at the file offset (so the buffer ends up holding the file there, checked after each
//! path). Reported: IOPS, GiB/s and the process CPU time per op (user + system, all
//! threads: the engine's executors included).

use std::sync::Arc;
use std::time::{Duration, Instant};

use hipfile_core::{BatchStatus, Direction, RawIo};
use hipfile_runtime::batch::{Batch, BatchEntry};
use serde::Serialize;

use crate::bench::{Bench, RunError, failed};
use crate::cufile::CuFile;
use crate::mem::{StreamSet, download};
use crate::pattern;

/// Threads (sync paths) and streams (async path).
const PARALLEL: usize = 8;

/// One path at one entry count and op size.
#[derive(Clone, Debug, Serialize)]
pub struct BatchRow {
    /// `BATCH`, `ASYNC`, `ASYNC_T`, `SYNC`, `CUFILE_BATCH`, `CUFILE_SYNC`.
    pub path: &'static str,
    /// Entries per batch (async: ops in flight per round; sync: threads).
    pub in_flight: usize,
    /// Bytes per op.
    pub io_size: usize,
    /// Ops timed.
    pub ops: usize,
    /// Ops per second.
    pub iops: Option<f64>,
    /// Process CPU time per op, µs (all threads).
    pub cpu_us_per_op: Option<f64>,
    /// `ok`, `unverified`, `WRONG` or `FAILED`.
    pub status: &'static str,
    /// Why WRONG or FAILED.
    pub detail: Option<String>,
}

impl BatchRow {
    /// GiB/s.
    pub fn gib_per_s(&self) -> Option<f64> {
        self.iops.map(|iops| iops * self.io_size as f64 / (1u64 << 30) as f64)
    }
}

/// 4 KiB-aligned file offset of op `i` for `io_size` ops (a fixed pseudo-random walk).
fn offset(i: usize, io_size: usize, file_size: u64) -> u64 {
    let slots = (file_size / 4096).saturating_sub(io_size as u64 / 4096).max(1);
    let mut x = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 29;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 32;
    (x % slots) * 4096
}

/// Process CPU time (user + system, every thread), seconds.
fn process_cpu_s() -> f64 {
    // SAFETY: a plain syscall with a valid out-pointer.
    let usage = unsafe {
        let mut usage = std::mem::zeroed::<libc::rusage>();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

struct Shape {
    in_flight: usize,
    io_size: usize,
    ops: usize,
}

/// Runs `body` (which performs `shape.ops` reads) and makes its row.
fn timed(
    b: &mut Bench,
    path: &'static str,
    shape: &Shape,
    body: impl FnOnce(&Bench) -> Result<(), RunError>,
) -> BatchRow {
    let (cpu_before, start) = (process_cpu_s(), Instant::now());
    let result = body(b);
    let (elapsed, cpu) = (start.elapsed(), process_cpu_s() - cpu_before);
    let result = result.and_then(|()| check(b, shape));
    let mut row = BatchRow {
        path,
        in_flight: shape.in_flight,
        io_size: shape.io_size,
        ops: shape.ops,
        iops: None,
        cpu_us_per_op: None,
        status: if b.verify { "ok" } else { "unverified" },
        detail: None,
    };
    match result {
        Ok(()) => {
            row.iops = Some(shape.ops as f64 / elapsed.as_secs_f64());
            row.cpu_us_per_op = Some(cpu * 1e6 / shape.ops as f64);
        }
        Err(RunError::Wrong(detail)) => (row.status, row.detail) = ("WRONG", Some(detail)),
        Err(RunError::Failed(detail)) if detail.starts_with("HANG") => {
            (row.status, row.detail) = ("HANG", Some(detail));
        }
        Err(RunError::Failed(detail)) => (row.status, row.detail) = ("FAILED", Some(detail)),
    }
    row
}

/// Zeroes the device buffer's blocks the ops read (so a path that skipped one is caught).
fn clear(b: &Bench, shape: &Shape) -> Result<(), RunError> {
    if !b.verify {
        return Ok(());
    }
    let stream = StreamSet::create(b.device(), 1).map_err(failed("stream"))?;
    let mut staging =
        crate::mem::Pinned::alloc(b.device(), shape.io_size).map_err(failed("pinned"))?;
    staging.bytes_mut()[..shape.io_size].fill(0);
    for i in 0..shape.ops {
        let off = offset(i, shape.io_size, b.file.size);
        // SAFETY: pinned staging of io_size bytes, alive until the sync below; the target
        // lies in the device buffer (the whole file).
        unsafe {
            b.device().copy_to_device_on(
                stream.handles[0],
                b.dev.addr + off,
                staging.bytes().as_ptr(),
                shape.io_size,
            )
        }
        .map_err(|e| RunError::Failed(format!("clear: {e}")))?;
    }
    stream.sync_all().map_err(failed("sync"))
}

fn check(b: &mut Bench, shape: &Shape) -> Result<(), RunError> {
    if !b.verify {
        return Ok(());
    }
    let size = b.size();
    download(&b.env.device, &mut b.host, b.dev.addr, size).map_err(failed("download"))?;
    for i in 0..shape.ops {
        let off = offset(i, shape.io_size, b.file.size) as usize;
        pattern::verify(&b.host.bytes()[off..off + shape.io_size], off as u64, b.file.seed)
            .map_err(|bad| RunError::Wrong(format!("op {i}: byte at offset {bad} differs")))?;
    }
    Ok(())
}

fn ours_batch(b: &Bench, shape: &Shape) -> Result<(), RunError> {
    let batch = Batch::new(Arc::clone(&b.env.driver), shape.in_flight as u32)
        .map_err(|e| RunError::Failed(format!("batch: {e}")))?;
    let mut entries = Vec::with_capacity(shape.in_flight);
    for round in (0..shape.ops).step_by(shape.in_flight) {
        entries.clear();
        for i in round..(round + shape.in_flight).min(shape.ops) {
            let off = offset(i, shape.io_size, b.file.size) as i64;
            entries.push(BatchEntry {
                direction: Direction::Read,
                handle: b.handle,
                buffer_base_addr: b.dev.addr,
                buffer_offset_bytes: off,
                file_offset_bytes: off,
                size_bytes: shape.io_size as u64,
                cookie: i,
            });
        }
        batch.submit(&entries).map_err(|e| RunError::Failed(format!("submit: {e}")))?;
        let mut seen = 0;
        while seen < entries.len() {
            let events = batch.status(entries.len() - seen, entries.len(), None);
            for event in &events {
                if event.status != BatchStatus::Complete || event.result != shape.io_size as i64 {
                    return Err(RunError::Failed(format!("entry {}: {:?}", event.cookie, event)));
                }
            }
            seen += events.len();
        }
    }
    Ok(())
}

fn ours_async(b: &Bench, shape: &Shape) -> Result<(), RunError> {
    let mut streams = StreamSet::create(b.device(), PARALLEL).map_err(failed("streams"))?;
    streams.register(&b.env.driver, b.flags).map_err(failed("register"))?;
    let mut params = Vec::with_capacity(shape.in_flight);
    for round in (0..shape.ops).step_by(shape.in_flight) {
        params.clear();
        for (k, i) in (round..(round + shape.in_flight).min(shape.ops)).enumerate() {
            params.push(submit_read(b, shape, i, streams.handles[k % PARALLEL])?);
        }
        streams.sync_all().map_err(failed("sync"))?;
        check_reads(&params, shape)?;
    }
    Ok(())
}

/// ASYNC with a submitting thread per stream (`ASYNC_T`): `PARALLEL` threads, each with a
/// stream of its own, deal the ops round-robin; every round each submits its share of the
/// ops in flight on its stream, then synchronizes it. What the async path does when the
/// application submits from several threads, as the sync rows' threads do.
fn ours_async_threads(b: &Bench, shape: &Shape) -> Result<(), RunError> {
    let device = b.device();
    let per_round = shape.in_flight.div_ceil(PARALLEL);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..PARALLEL)
            .map(|t| {
                scope.spawn(move || {
                    let mut stream = StreamSet::create(device, 1).map_err(failed("stream"))?;
                    stream.register(&b.env.driver, b.flags).map_err(failed("register"))?;
                    let mine: Vec<usize> = (t..shape.ops).step_by(PARALLEL).collect();
                    for round in mine.chunks(per_round) {
                        let params = round
                            .iter()
                            .map(|&i| submit_read(b, shape, i, stream.handles[0]))
                            .collect::<Result<Vec<_>, _>>()?;
                        stream.sync_all().map_err(failed("sync"))?;
                        check_reads(&params, shape)?;
                    }
                    Ok(())
                })
            })
            .collect();
        workers.into_iter().try_for_each(|w| w.join().expect("worker panicked"))
    })
}

/// Submits the async read of op `i` on `stream`.
fn submit_read(
    b: &Bench,
    shape: &Shape,
    i: usize,
    stream: hipfile_runtime::device::StreamHandle,
) -> Result<Arc<hipfile_runtime::AsyncParams>, RunError> {
    let off = offset(i, shape.io_size, b.file.size);
    let p = crate::workload::op_params(shape.io_size, off, off);
    b.env
        .driver
        .submit_async(Direction::Read, b.handle, b.dev.addr, &p, stream)
        .map_err(|e| RunError::Failed(format!("submit_async: {e}")))?;
    Ok(p)
}

/// Every read of a synchronized round moved its whole size.
fn check_reads(
    params: &[Arc<hipfile_runtime::AsyncParams>],
    shape: &Shape,
) -> Result<(), RunError> {
    for p in params {
        let done = p.bytes_done.load(std::sync::atomic::Ordering::Acquire);
        if done != shape.io_size as isize {
            return Err(RunError::Failed(format!("bytes_done = {done}")));
        }
    }
    Ok(())
}

/// `read(offset)` on `PARALLEL` threads, ops dealt round-robin.
fn threads(
    b: &Bench,
    shape: &Shape,
    read: impl Fn(u64) -> Result<(), RunError> + Sync,
) -> Result<(), RunError> {
    let device = b.device();
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..PARALLEL)
            .map(|t| {
                let read = &read;
                scope.spawn(move || {
                    // A stream per thread makes the primary context current on it (cuFile
                    // requires it of its callers).
                    let _stream = StreamSet::create(device, 1).map_err(failed("stream"))?;
                    for i in (t..shape.ops).step_by(PARALLEL) {
                        read(offset(i, shape.io_size, b.file.size))?;
                    }
                    Ok(())
                })
            })
            .collect();
        workers.into_iter().try_for_each(|w| w.join().expect("worker panicked"))
    })
}

fn ours_sync(b: &Bench, shape: &Shape) -> Result<(), RunError> {
    threads(b, shape, |off| {
        let raw = RawIo {
            size_bytes: shape.io_size as u64,
            file_offset_bytes: off as i64,
            buffer_offset_bytes: off as i64,
        };
        match b.env.driver.io_sync(Direction::Read, b.handle, b.dev.addr, raw) {
            Ok(n) if n == shape.io_size => Ok(()),
            other => Err(RunError::Failed(format!("io_sync: {other:?}"))),
        }
    })
}

fn cufile_sync(cf: &CuFile, b: &Bench, shape: &Shape) -> Result<(), RunError> {
    threads(b, shape, |off| match cf.io_sync(true, b.dev.addr, shape.io_size, off, off) {
        n if n == shape.io_size as isize => Ok(()),
        n => Err(RunError::Failed(format!("cuFileRead returned {n}"))),
    })
}

fn cufile_batch(cf: &CuFile, b: &Bench, shape: &Shape) -> Result<(), RunError> {
    let batch = cf.batch_setup(shape.in_flight as u32).map_err(RunError::Failed)?;
    let mut offsets = Vec::with_capacity(shape.in_flight);
    let result = (|| {
        for round in (0..shape.ops).step_by(shape.in_flight) {
            offsets.clear();
            offsets.extend(
                (round..(round + shape.in_flight).min(shape.ops))
                    .map(|i| offset(i, shape.io_size, b.file.size)),
            );
            cf.batch_read(batch, b.dev.addr, shape.io_size, &offsets).map_err(RunError::Failed)?;
        }
        Ok(())
    })();
    cf.batch_destroy(batch);
    result
}

/// The batch mode: every path at each (entries, io size).
pub fn run(
    b: &mut Bench,
    cf: Option<&CuFile>,
    entry_counts: &[usize],
    io_sizes: &[usize],
    ops_wanted: usize,
) -> Vec<BatchRow> {
    let mut rows = Vec::new();
    for &io_size in io_sizes {
        for &in_flight in entry_counts {
            let ops = ops_wanted.max(20 * in_flight).div_ceil(in_flight) * in_flight;
            let shape = Shape { in_flight, io_size, ops };
            // Warm the page cache over the offsets (a hot-file measurement), and each of
            // our paths once, untimed: the first engine job of a process makes the engine's
            // GPU context and streams (a cuCtxCreate, ~0.5 s on the H200), which the first
            // timed path would pay otherwise.
            let _ = ours_sync(b, &shape);
            let warm = Shape { ops: in_flight, ..shape };
            let _ = ours_batch(b, &warm);
            let _ = ours_async(b, &warm);
            let _ = ours_async_threads(b, &warm);
            let mut paths: Vec<(&'static str, usize)> = vec![
                ("BATCH", in_flight),
                ("ASYNC", in_flight),
                ("ASYNC_T", in_flight),
                ("SYNC", PARALLEL),
            ];
            if let Some(cf) = cf {
                if !cf.batch_hung() {
                    paths.push(("CUFILE_BATCH", in_flight));
                }
                paths.push(("CUFILE_SYNC", PARALLEL));
            }
            for (path, shown) in paths {
                eprintln!("batch: {path} {shown} x {io_size} B, {ops} ops ...");
                let case_started = Instant::now();
                if let Err(error) = clear(b, &shape) {
                    let detail = format!("{error:?}");
                    rows.push(failed_row(path, shown, &shape, detail));
                    continue;
                }
                let row = timed(b, path, &shape, |b| match (path, cf) {
                    ("BATCH", _) => ours_batch(b, &shape),
                    ("ASYNC", _) => ours_async(b, &shape),
                    ("ASYNC_T", _) => ours_async_threads(b, &shape),
                    ("SYNC", _) => ours_sync(b, &shape),
                    ("CUFILE_BATCH", Some(cf)) => cufile_batch(cf, b, &shape),
                    ("CUFILE_SYNC", Some(cf)) => cufile_sync(cf, b, &shape),
                    _ => Err(RunError::Failed("no such path".into())),
                });
                let row = BatchRow { in_flight: shown, ..row };
                eprintln!(
                    "batch: {} {} x {} B: {} ({:?} IOPS; {:.1} s with clear and check)",
                    row.path,
                    row.in_flight,
                    row.io_size,
                    row.status,
                    row.iops.map(|v| v as u64),
                    case_started.elapsed().as_secs_f64()
                );
                rows.push(row);
            }
        }
    }
    rows
}

fn failed_row(path: &'static str, in_flight: usize, shape: &Shape, detail: String) -> BatchRow {
    BatchRow {
        path,
        in_flight,
        io_size: shape.io_size,
        ops: shape.ops,
        iops: None,
        cpu_us_per_op: None,
        status: "FAILED",
        detail: Some(detail),
    }
}

/// The table: one line per row, with ratios against CUFILE_SYNC and our ASYNC of the
/// same shape (same run).
pub fn table(rows: &[BatchRow]) -> String {
    let mut out = format!(
        "{:<13} {:>8} {:>7} {:>8} {:>10} {:>8} {:>9} {:>10} {:>9}\n",
        "Path", "InFlight", "IoSize", "Ops", "IOPS", "GiB/s", "CPUus/op", "x CUFILE_S", "x ASYNC"
    );
    // Rows come in groups of one shape: BATCH first.
    let groups = rows.chunk_by(|a, b| a.io_size == b.io_size && b.path != "BATCH");
    for group in groups {
        let find = |path| group.iter().find(|r| r.path == path).and_then(|r| r.iops);
        let (cufile, ours_async) = (find("CUFILE_SYNC"), find("ASYNC"));
        for row in group {
            let ratio = |base: Option<f64>| match (row.iops, base) {
                (Some(iops), Some(base)) => format!("{:.2}", iops / base),
                _ => "-".into(),
            };
            let number = |v: Option<f64>, digits: usize| {
                v.map_or_else(|| row.status.to_string(), |v| format!("{v:.digits$}"))
            };
            out.push_str(&format!(
                "{:<13} {:>8} {:>7} {:>8} {:>10} {:>8} {:>9} {:>10} {:>9}\n",
                row.path,
                row.in_flight,
                crate::cli::format_size(row.io_size as u64),
                row.ops,
                number(row.iops, 0),
                number(row.gib_per_s(), 3),
                number(row.cpu_us_per_op, 1),
                ratio(cufile),
                ratio(ours_async),
            ));
            if let Some(detail) = &row.detail {
                out.push_str(&format!("    {}: {detail}\n", row.status));
            }
        }
    }
    out
}

/// Whether every hipfile-rs row ran and verified.
pub fn ours_ok(rows: &[BatchRow]) -> bool {
    rows.iter().filter(|r| !r.path.starts_with("CUFILE")).all(|r| r.iops.is_some())
}

/// How long to wait for one cuFile batch before giving up.
pub const CUFILE_BATCH_TIMEOUT: Duration = Duration::from_secs(30);
