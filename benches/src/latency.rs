//! `--latency`: 4 KiB reads of a hot file, one at a time: submit → stream sync for the
//! async paths (and the submit call alone), the call for the sync ones; then 128 submits
//! behind a paused stream.

use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use hipfile_core::{Direction, RawIo};
use hipfile_runtime::AsyncParams;
use hipfile_runtime::device::StreamHandle;
use hipfile_runtime::device::user::StreamGate;
use hipfile_runtime::file::pread_full;
use serde::Serialize;

use crate::bench::{Bench, RunError, failed};
use crate::cufile::{CUFILE_STREAM_FLAGS, CuFile};
use crate::mem::{Pinned, StreamSet, download};
use crate::pattern;
use crate::report::Percentiles;

/// Bytes per op.
const OP_BYTES: usize = 4096;
/// Untimed iterations before each path.
const WARMUP: usize = 100;
/// Ops submitted behind the paused stream.
const BUSY_OPS: usize = 128;
/// When the paused stream is released (from another thread).
const RELEASE_AFTER: Duration = Duration::from_millis(50);

/// One path's latencies.
#[derive(Clone, Debug, Serialize)]
pub struct LatencyRow {
    /// What was timed.
    pub path: String,
    /// Timed iterations.
    pub ops: usize,
    /// Call → data in place (µs); `None` when the path failed.
    pub total_us: Option<Percentiles>,
    /// The submit call alone (async paths), µs.
    pub submit_us: Option<Percentiles>,
    /// `ok`, `unverified`, `WRONG` or `FAILED`.
    pub status: &'static str,
    /// Why WRONG or FAILED.
    pub detail: Option<String>,
}

/// 128 submits behind a paused stream.
#[derive(Clone, Debug, Serialize)]
pub struct BusyStream {
    /// Ops submitted.
    pub submits: usize,
    /// Time of all the submit calls, µs.
    pub total_us: f64,
    /// Whether that exceeded 1 ms.
    pub over_1ms: bool,
    /// When the gate was opened (from another thread), ms after the pause.
    pub release_after_ms: u64,
    /// Whether the submits only finished after the gate opened (enqueue blocked).
    pub blocked_until_release: bool,
    /// `ok`, `unverified`, `WRONG` or `FAILED` (byte counts and data of the 128 ops).
    pub status: &'static str,
    /// Why WRONG or FAILED.
    pub detail: Option<String>,
}

/// The latency mode's results.
#[derive(Clone, Debug, Serialize)]
pub struct LatencyReport {
    /// Bytes per op.
    pub io_size: usize,
    /// Timed iterations per path.
    pub iterations: usize,
    /// One row per path.
    pub rows: Vec<LatencyRow>,
    /// The busy-stream test (hipfile-rs).
    pub busy_stream: Option<BusyStream>,
}

/// 4 KiB-aligned file offset of iteration `i` (a fixed pseudo-random walk).
fn offset(i: usize, file_size: u64) -> u64 {
    let blocks = (file_size / OP_BYTES as u64).max(1);
    let mut x = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 29;
    (x % blocks) * OP_BYTES as u64
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// (total, submit) samples in µs.
type Samples = (Vec<f64>, Vec<f64>);

/// Times `iterations` calls of `op(offset)`, which returns (total, submit) durations.
fn measure(
    b: &Bench,
    iterations: usize,
    op: impl FnMut(u64) -> Result<(Duration, Option<Duration>), RunError>,
) -> Result<Samples, RunError> {
    measure_with(b, iterations, None, op)
}

/// [`measure`]; with `recording_off`, the statistics recording alternates op by op (on
/// for even iterations, whose samples are returned; off for odd ones, whose samples go to
/// `recording_off`), and is left on.
fn measure_with(
    b: &Bench,
    iterations: usize,
    mut recording_off: Option<&mut Samples>,
    mut op: impl FnMut(u64) -> Result<(Duration, Option<Duration>), RunError>,
) -> Result<Samples, RunError> {
    let (mut totals, mut submits) = (Vec::with_capacity(iterations), Vec::new());
    for i in 0..WARMUP + iterations {
        let off_turn = recording_off.is_some() && i % 2 == 1;
        if recording_off.is_some() {
            hipfile_runtime::stats::set_recording(!off_turn);
        }
        let result = op(offset(i, b.file.size));
        if recording_off.is_some() {
            hipfile_runtime::stats::set_recording(true);
        }
        let (total, submit) = result?;
        if i >= WARMUP {
            let (totals, submits) = match (&mut recording_off, off_turn) {
                (Some(off), true) => (&mut off.0, &mut off.1),
                _ => (&mut totals, &mut submits),
            };
            totals.push(us(total));
            submits.extend(submit.map(us));
        }
    }
    Ok((totals, submits))
}

/// Checks the blocks the iterations read, in `bytes` (the device buffer downloaded, or
/// the host buffer).
fn check_blocks(b: &Bench, bytes: &[u8], iterations: usize) -> Result<(), RunError> {
    for i in 0..WARMUP + iterations {
        let off = offset(i, b.file.size) as usize;
        pattern::verify(&bytes[off..off + OP_BYTES], off as u64, b.file.seed)
            .map_err(|bad| RunError::Wrong(format!("byte at offset {bad} differs")))?;
    }
    Ok(())
}

fn check_device_blocks(b: &mut Bench, iterations: usize) -> Result<(), RunError> {
    if !b.verify {
        return Ok(());
    }
    let size = b.size();
    download(&b.env.device, &mut b.host, b.dev.addr, size).map_err(failed("download"))?;
    check_blocks(b, b.host.bytes(), iterations)
}

fn params(offset: u64) -> Arc<AsyncParams> {
    crate::workload::op_params(OP_BYTES, offset, offset)
}

fn check_done(p: &AsyncParams) -> Result<(), RunError> {
    match p.bytes_done.load(Ordering::Acquire) {
        n if n == OP_BYTES as isize => Ok(()),
        n if n < 0 => Err(RunError::Failed(format!("bytes_done = {n}"))),
        n => Err(RunError::Wrong(format!("read {n} of {OP_BYTES} bytes"))),
    }
}

/// hipfile-rs ASYNC: submit_async, then synchronize the stream.
fn ours_async(
    b: &Bench,
    iterations: usize,
    recording_off: Option<&mut Samples>,
) -> Result<Samples, RunError> {
    let mut streams = StreamSet::create(b.device(), 1).map_err(failed("stream"))?;
    streams.register(&b.env.driver, b.flags).map_err(failed("register"))?;
    let stream = streams.handles[0];
    measure_with(b, iterations, recording_off, |off| {
        let p = params(off);
        let start = Instant::now();
        b.env
            .driver
            .submit_async(Direction::Read, b.handle, b.dev.addr, &p, stream)
            .map_err(|e| RunError::Failed(format!("submit_async: {e}")))?;
        let submitted = start.elapsed();
        b.device()
            .synchronize_stream(stream)
            .map_err(|e| RunError::Failed(format!("sync: {e}")))?;
        let total = start.elapsed();
        check_done(&p)?;
        Ok((total, Some(submitted)))
    })
}

/// hipfile-rs SYNC: io_sync.
fn ours_sync(
    b: &Bench,
    iterations: usize,
    recording_off: Option<&mut Samples>,
) -> Result<Samples, RunError> {
    measure_with(b, iterations, recording_off, |off| {
        let raw = RawIo {
            size_bytes: OP_BYTES as u64,
            file_offset_bytes: off as i64,
            buffer_offset_bytes: off as i64,
        };
        let start = Instant::now();
        let n = b
            .env
            .driver
            .io_sync(Direction::Read, b.handle, b.dev.addr, raw)
            .map_err(|e| RunError::Failed(format!("io_sync: {e}")))?;
        let total = start.elapsed();
        if n != OP_BYTES {
            return Err(RunError::Wrong(format!("io_sync read {n} bytes")));
        }
        Ok((total, None))
    })
}

/// CPU_GPU: pread into a pinned chunk, copy to the device, sync.
fn pread_copy(b: &Bench, iterations: usize) -> Result<(Vec<f64>, Vec<f64>), RunError> {
    let streams = StreamSet::create(b.device(), 1).map_err(failed("stream"))?;
    let mut chunk = Pinned::alloc(b.device(), OP_BYTES).map_err(failed("pinned"))?;
    let fd = b.file.io.as_raw_fd();
    measure(b, iterations, |off| {
        let start = Instant::now();
        let n = pread_full(fd, &mut chunk.bytes_mut()[..OP_BYTES], off)
            .map_err(|e| RunError::Failed(format!("pread: {e}")))?;
        // SAFETY: pinned chunk of OP_BYTES, untouched until the sync below; the target is
        // inside the device buffer.
        unsafe {
            b.device().copy_to_device_on(
                streams.handles[0],
                b.dev.addr + off,
                chunk.ptr(),
                OP_BYTES,
            )
        }
        .map_err(|e| RunError::Failed(format!("copy: {e}")))?;
        streams.sync_all().map_err(failed("sync"))?;
        if n != OP_BYTES {
            return Err(RunError::Wrong(format!("pread read {n} bytes")));
        }
        Ok((start.elapsed(), None))
    })
}

/// CPUONLY: pread into host memory.
fn pread_host(b: &mut Bench, iterations: usize) -> Result<(Vec<f64>, Vec<f64>), RunError> {
    let fd = b.file.io.as_raw_fd();
    let size = b.size();
    let stand_in = Pinned::alloc(b.device(), OP_BYTES).map_err(failed("pinned"))?;
    let mut host = std::mem::replace(&mut b.host, stand_in);
    host.bytes_mut()[..size].fill(0);
    let result = measure(b, iterations, |off| {
        let target = &mut host.bytes_mut()[off as usize..off as usize + OP_BYTES];
        let start = Instant::now();
        let n = pread_full(fd, target, off).map_err(|e| RunError::Failed(format!("pread: {e}")))?;
        let total = start.elapsed();
        if n != OP_BYTES {
            return Err(RunError::Wrong(format!("pread read {n} bytes")));
        }
        Ok((total, None))
    });
    let checked = if b.verify { check_blocks(b, host.bytes(), iterations) } else { Ok(()) };
    b.host = host;
    let result = result?;
    checked.map(|()| result)
}

/// cuFile SYNC: cuFileRead.
fn cufile_sync(
    cf: &CuFile,
    b: &Bench,
    iterations: usize,
) -> Result<(Vec<f64>, Vec<f64>), RunError> {
    measure(b, iterations, |off| {
        let start = Instant::now();
        let n = cf.io_sync(true, b.dev.addr, OP_BYTES, off, off);
        let total = start.elapsed();
        if n != OP_BYTES as isize {
            return Err(RunError::Failed(format!("cuFileRead returned {n}")));
        }
        Ok((total, None))
    })
}

/// cuFile ASYNC: cuFileReadAsync, then synchronize the stream.
fn cufile_async(
    cf: &CuFile,
    b: &Bench,
    iterations: usize,
) -> Result<(Vec<f64>, Vec<f64>), RunError> {
    let streams = StreamSet::create(b.device(), 1).map_err(failed("stream"))?;
    let stream = streams.handles[0];
    cf.stream_register(stream, CUFILE_STREAM_FLAGS).map_err(RunError::Failed)?;
    let result = measure(b, iterations, |off| {
        let p = params(off);
        let start = Instant::now();
        cf.submit(true, b.dev.addr, &p, stream).map_err(RunError::Failed)?;
        let submitted = start.elapsed();
        b.device()
            .synchronize_stream(stream)
            .map_err(|e| RunError::Failed(format!("sync: {e}")))?;
        let total = start.elapsed();
        check_done(&p)?;
        Ok((total, Some(submitted)))
    });
    let _ = streams.sync_all();
    cf.stream_deregister(stream);
    result
}

/// Runs one path (device target poisoned first, touched blocks checked after).
fn row(
    b: &mut Bench,
    iterations: usize,
    path: &str,
    run: impl FnOnce(&mut Bench) -> Result<(Vec<f64>, Vec<f64>), RunError>,
    device_target: bool,
) -> LatencyRow {
    let outcome = b.poison_device().and_then(|()| run(b)).and_then(|measured| {
        if device_target {
            check_device_blocks(b, iterations).map(|()| measured)
        } else {
            Ok(measured)
        }
    });
    let mut row = LatencyRow {
        path: path.into(),
        ops: iterations,
        total_us: None,
        submit_us: None,
        status: "ok",
        detail: None,
    };
    match outcome {
        Ok((totals, submits)) => {
            row.total_us = Percentiles::of(&totals);
            row.submit_us = Percentiles::of(&submits);
            if !b.verify {
                row.status = "unverified";
            }
        }
        Err(RunError::Wrong(d)) => (row.status, row.detail) = ("WRONG", Some(d)),
        Err(RunError::Failed(d)) => (row.status, row.detail) = ("FAILED", Some(d)),
    }
    row
}

/// Pauses a stream, releases it from another thread after [`RELEASE_AFTER`], and times
/// [`BUSY_OPS`] submits meanwhile (on CUDA, enqueue blocks once ~110 commands wait
/// behind a blocked stream).
fn busy_stream(b: &mut Bench) -> Result<BusyStream, RunError> {
    b.poison_device()?;
    let mut streams = StreamSet::create(b.device(), 1).map_err(failed("stream"))?;
    streams.register(&b.env.driver, b.flags).map_err(failed("register"))?;
    let stream: StreamHandle = streams.handles[0];
    let ops: Vec<Arc<AsyncParams>> = (0..BUSY_OPS).map(|i| params((i * OP_BYTES) as u64)).collect();
    let gate = StreamGate::pause(b.device(), stream)
        .map_err(|e| RunError::Failed(format!("pause: {e}")))?;
    let paused = Instant::now();
    let opener = std::thread::spawn(move || {
        std::thread::sleep(RELEASE_AFTER);
        let released = Instant::now();
        gate.release();
        released
    });
    let start = Instant::now();
    let submitted: Result<(), RunError> = ops.iter().try_for_each(|p| {
        b.env
            .driver
            .submit_async(Direction::Read, b.handle, b.dev.addr, p, stream)
            .map_err(|e| RunError::Failed(format!("submit_async: {e}")))
    });
    let (end, total) = (Instant::now(), start.elapsed());
    let released = opener.join().unwrap_or(paused + RELEASE_AFTER);
    streams.sync_all().map_err(failed("sync"))?;
    drop(streams);
    submitted?;
    let mut busy = BusyStream {
        submits: BUSY_OPS,
        total_us: us(total),
        over_1ms: total > Duration::from_millis(1),
        release_after_ms: RELEASE_AFTER.as_millis() as u64,
        blocked_until_release: end > released,
        status: if b.verify { "ok" } else { "unverified" },
        detail: None,
    };
    if let Err(error) = ops.iter().try_for_each(|p| check_done(p)).and_then(|()| check_busy_data(b))
    {
        (busy.status, busy.detail) = match error {
            RunError::Wrong(d) => ("WRONG", Some(d)),
            RunError::Failed(d) => ("FAILED", Some(d)),
        };
    }
    Ok(busy)
}

fn check_busy_data(b: &mut Bench) -> Result<(), RunError> {
    if !b.verify {
        return Ok(());
    }
    let len = BUSY_OPS * OP_BYTES;
    download(&b.env.device, &mut b.host, b.dev.addr, len).map_err(failed("download"))?;
    pattern::verify(&b.host.bytes()[..len], 0, b.file.seed)
        .map_err(|bad| RunError::Wrong(format!("byte at offset {bad} differs")))
}

/// Runs every path and the busy-stream test.
/// Our async and sync rows again, the statistics recording alternating op by op: a
/// row with it on and one with it off for each (their difference is what recording costs).
fn stats_ab_rows(b: &mut Bench, iterations: usize) -> Vec<LatencyRow> {
    let mut rows = Vec::new();
    for sync in [false, true] {
        let label = if sync { "SYNC" } else { "ASYNC" };
        let mut off: Samples = (Vec::new(), Vec::new());
        let mut on = row(
            b,
            iterations,
            &format!("hipfile-rs {label}, stats on (A/B)"),
            |b| {
                if sync {
                    ours_sync(b, iterations, Some(&mut off))
                } else {
                    ours_async(b, iterations, Some(&mut off))
                }
            },
            true,
        );
        on.ops = iterations - off.0.len();
        let off_row = LatencyRow {
            path: format!("hipfile-rs {label}, stats off (A/B)"),
            ops: off.0.len(),
            total_us: Percentiles::of(&off.0),
            submit_us: Percentiles::of(&off.1),
            status: on.status,
            detail: on.detail.clone(),
        };
        rows.push(on);
        rows.push(off_row);
    }
    rows
}

pub fn run(b: &mut Bench, cf: Option<&CuFile>, iterations: usize, stats_ab: bool) -> LatencyReport {
    let _ = b.before_read();
    let mut rows = vec![
        row(
            b,
            iterations,
            "hipfile-rs ASYNC: submit_async + stream sync",
            |b| ours_async(b, iterations, None),
            true,
        ),
        row(b, iterations, "hipfile-rs SYNC: io_sync", |b| ours_sync(b, iterations, None), true),
        row(b, iterations, "CPUONLY: pread to host memory", |b| pread_host(b, iterations), false),
        row(b, iterations, "CPU_GPU: pread + H2D copy + sync", |b| pread_copy(b, iterations), true),
    ];
    if stats_ab {
        rows.extend(stats_ab_rows(b, iterations));
    }
    if let Some(cf) = cf {
        rows.push(row(
            b,
            iterations,
            "CUFILE_SYNC: cuFileRead",
            |b| cufile_sync(cf, b, iterations),
            true,
        ));
        rows.push(row(
            b,
            iterations,
            "CUFILE_ASYNC: cuFileReadAsync + stream sync",
            |b| cufile_async(cf, b, iterations),
            true,
        ));
    }
    let busy_stream = match busy_stream(b) {
        Ok(busy) => Some(busy),
        Err(RunError::Wrong(d) | RunError::Failed(d)) => {
            eprintln!("busy-stream test failed: {d}");
            None
        }
    };
    LatencyReport { io_size: OP_BYTES, iterations, rows, busy_stream }
}

/// The latency table.
pub fn table(report: &LatencyReport) -> String {
    let mut out = format!(
        "4 KiB reads, hot file, {} iterations each (+{WARMUP} warm-up); latency = call until the data is in place (async: submit + stream sync)\n",
        report.iterations
    );
    out.push_str(&format!(
        "{:<46} {:>9} {:>9} {:>9} {:>9}  {}\n",
        "Path", "p50 us", "p99 us", "avg us", "max us", "Data"
    ));
    let line = |label: &str, p: Percentiles, status: &str| {
        format!(
            "{label:<46} {:>9.1} {:>9.1} {:>9.1} {:>9.1}  {status}\n",
            p.p50, p.p99, p.avg, p.max
        )
    };
    for row in &report.rows {
        match row.total_us {
            Some(p) => out.push_str(&line(&row.path, p, row.status)),
            None => out.push_str(&format!(
                "{:<46} {:>9}  {}\n",
                row.path,
                row.status,
                row.detail.clone().unwrap_or_default()
            )),
        }
        if let Some(p) = row.submit_us {
            out.push_str(&line("  of which the submit call", p, ""));
        }
    }
    if let Some(busy) = &report.busy_stream {
        out.push_str(&format!(
            "\n{} submits behind a paused stream (released from another thread after {} ms): {:.1} us in all, {:.2} us each{}{}; data {}\n",
            busy.submits,
            busy.release_after_ms,
            busy.total_us,
            busy.total_us / busy.submits as f64,
            if busy.over_1ms { " — OVER 1 ms" } else { " (under 1 ms)" },
            if busy.blocked_until_release { ", blocked until the gate opened" } else { ", never blocked" },
            busy.status,
        ));
        if let Some(detail) = &busy.detail {
            out.push_str(&format!("  {detail}\n"));
        }
    }
    out
}
