//! The op plan, the steps around a run, and hipfile-rs's own runs: ASYNC (stream-ordered
//! `submit_async`) and SYNC (`io_sync` from one thread per stream).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use hipfile_core::{Direction, RawIo};
use hipfile_runtime::AsyncParams;

use crate::bench::{Bench, RunError, Sample, Timer, failed};
use crate::mem::StreamSet;

/// Longest wait for the next op to complete before a run is declared stalled.
const STALL_LIMIT: Duration = Duration::from_secs(300);
/// Shortest and longest sleep between completion polls (the latency resolution).
const MIN_POLL: Duration = Duration::from_micros(20);
const MAX_POLL: Duration = Duration::from_micros(200);

/// What a run transfers, gdsio-style.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Xfer {
    /// hipfile-rs stream-ordered async API, every op submitted from one thread.
    Async,
    /// The same with one submitting thread per stream (random patterns: what a server
    /// whose workers each own a stream sees; one thread's submit rate no longer bounds it).
    AsyncThreads,
    /// hipfile-rs synchronous API, one thread per stream.
    Sync,
    /// `pread`/`pwrite` into host memory: the storage limit.
    CpuOnly,
    /// `pread` into pinned memory, then a device copy and a sync, per op.
    CpuGpu,
    /// Pinned host ⇄ device copies of the same bytes alone: the PCIe limit.
    GpuCopy,
    /// cuFile stream API (compat mode).
    CufileAsync,
    /// cuFile `cuFileRead` / `cuFileWrite`, one thread per stream.
    CufileSync,
}

impl Xfer {
    /// gdsio-like XferType name.
    pub fn name(self) -> &'static str {
        match self {
            Xfer::Async => "ASYNC",
            Xfer::AsyncThreads => "ASYNC_MT",
            Xfer::Sync => "SYNC",
            Xfer::CpuOnly => "CPUONLY",
            Xfer::CpuGpu => "CPU_GPU",
            Xfer::GpuCopy => "GPU_COPY",
            Xfer::CufileAsync => "CUFILE_ASYNC",
            Xfer::CufileSync => "CUFILE_SYNC",
        }
    }

    /// Every transfer type, in table order.
    pub const ALL: [Xfer; 8] = [
        Xfer::Async,
        Xfer::AsyncThreads,
        Xfer::Sync,
        Xfer::CpuOnly,
        Xfer::CpuGpu,
        Xfer::GpuCopy,
        Xfer::CufileAsync,
        Xfer::CufileSync,
    ];

    /// One line saying what it measures.
    pub fn describe(self) -> &'static str {
        match self {
            Xfer::Async => "hipfile-rs submit_async on S streams into one device buffer",
            Xfer::AsyncThreads => "the same, each stream's ops submitted by a thread of its own",
            Xfer::Sync => "hipfile-rs io_sync, S threads",
            Xfer::CpuOnly => "pread/pwrite to host memory, S threads (storage limit)",
            Xfer::CpuGpu => "pread + device copy + sync per op into pinned memory, S threads",
            Xfer::GpuCopy => "pinned host<->device copies alone, S streams (PCIe limit)",
            Xfer::CufileAsync => "cuFile compat mode, cuFileRead/WriteAsync on S streams",
            Xfer::CufileSync => "cuFile compat mode, cuFileRead/Write, S threads",
        }
    }
}

/// One op: `len` bytes at file offset (= device buffer offset) `offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Op {
    /// File offset and buffer offset.
    pub offset: u64,
    /// Bytes.
    pub len: usize,
}

/// Splits the file into `streams` contiguous regions (fewer when there are fewer
/// chunks), each issued in `io_size` ops; `random` shuffles each region's ops.
pub fn plan(file_size: u64, io_size: u64, streams: usize, random: bool) -> Vec<Vec<Op>> {
    let chunks = file_size.div_ceil(io_size).max(1) as usize;
    let streams = streams.clamp(1, chunks);
    (0..streams)
        .map(|s| {
            let (first, last) = (chunks * s / streams, chunks * (s + 1) / streams);
            let mut ops: Vec<Op> = (first..last)
                .map(|c| {
                    let offset = c as u64 * io_size;
                    Op { offset, len: io_size.min(file_size - offset) as usize }
                })
                .collect();
            if random {
                shuffle(&mut ops, s as u64 + 1);
            }
            ops
        })
        .collect()
}

/// Fisher–Yates with xorshift64 (deterministic per seed).
fn shuffle(ops: &mut [Op], seed: u64) {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for i in (1..ops.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        ops.swap(i, (x % (i as u64 + 1)) as usize);
    }
}

/// Where a run's data lands (reads) or comes from (writes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// The device buffer.
    Device,
    /// The pinned host buffer.
    Host,
}

/// Before a run: for reads, cache control and a poisoned target (returns the file's
/// seed); for writes, a fresh pattern in the source (returns its seed).
pub fn prepare(b: &mut Bench, read: bool, target: Target) -> Result<u64, RunError> {
    if read {
        b.before_read()?;
        match target {
            Target::Device => b.poison_device()?,
            Target::Host => b.poison_host(),
        }
        return Ok(b.file.seed);
    }
    let seed = b.new_seed();
    match target {
        Target::Device => b.fill_device(seed)?,
        Target::Host => b.fill_host(seed),
    }
    Ok(seed)
}

/// After a run: verify the target (reads) or the file (writes).
pub fn finish(b: &mut Bench, read: bool, seed: u64, target: Target) -> Result<(), RunError> {
    if !read {
        b.after_write();
        return b.check_file(seed);
    }
    match target {
        Target::Device => b.check_device(seed),
        Target::Host => b.check_host(seed, "host buffer"),
    }
}

/// Total bytes and ops of a plan.
pub fn totals(plan: &[Vec<Op>]) -> (u64, u64) {
    let ops = plan.iter().flatten();
    (ops.clone().map(|op| op.len as u64).sum(), ops.count() as u64)
}

/// Runs one thread per region: `setup` (untimed), then `op` for each op (timed per op).
/// Returns the latencies in µs, wall seconds and CPU seconds of the timed part.
///
/// The clocks start after every thread's setup and before any thread's first op: the
/// threads wait at a second barrier until they have (a `--profile` window takes a few
/// milliseconds to start, and ops run meanwhile were once outside the row's clocks).
pub fn timed_threads<S>(
    plan: &[Vec<Op>],
    setup: impl Fn() -> Result<S, RunError> + Sync,
    op: impl Fn(&mut S, &Op) -> Result<(), RunError> + Sync,
) -> Result<(Vec<f64>, f64, f64), RunError> {
    let set_up = Barrier::new(plan.len() + 1);
    let clocks_started = Barrier::new(plan.len() + 1);
    let (results, seconds, cpu) = std::thread::scope(|scope| {
        let handles: Vec<_> = plan
            .iter()
            .map(|ops| {
                let (set_up, clocks_started, setup, op) = (&set_up, &clocks_started, &setup, &op);
                scope.spawn(move || {
                    let state = setup();
                    set_up.wait();
                    clocks_started.wait();
                    let mut state = state?;
                    let mut latencies = Vec::with_capacity(ops.len());
                    for one in ops {
                        let start = Instant::now();
                        op(&mut state, one)?;
                        latencies.push(start.elapsed().as_secs_f64() * 1e6);
                    }
                    Ok(latencies)
                })
            })
            .collect();
        set_up.wait();
        let timer = Timer::start();
        clocks_started.wait();
        let results: Vec<Result<Vec<f64>, RunError>> = handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(RunError::Failed("a thread panicked".into()))))
            .collect();
        let (seconds, cpu) = timer.stop();
        (results, seconds, cpu)
    });
    let mut latencies = Vec::new();
    for result in results {
        latencies.extend(result?);
    }
    Ok((latencies, seconds, cpu))
}

/// A sample from a threaded run.
pub fn threaded_sample(plan: &[Vec<Op>], measured: (Vec<f64>, f64, f64)) -> Sample {
    let (bytes, ops) = totals(plan);
    let (latencies_us, seconds, cpu_seconds) = measured;
    Sample { seconds, bytes, ops, latencies_us, submit_us: Vec::new(), cpu_seconds }
}

/// Read or write.
pub fn direction(read: bool) -> Direction {
    if read { Direction::Read } else { Direction::Write }
}

/// SYNC: `io_sync` per op, one thread per region.
pub fn run_sync(b: &mut Bench, plan: &[Vec<Op>], read: bool) -> Result<Sample, RunError> {
    let seed = prepare(b, read, Target::Device)?;
    let (driver, handle, addr) = (&b.env.driver, b.handle, b.dev.addr);
    let measured = timed_threads(
        plan,
        || Ok(()),
        |_, op| {
            let raw = RawIo {
                size_bytes: op.len as u64,
                file_offset_bytes: op.offset as i64,
                buffer_offset_bytes: op.offset as i64,
            };
            match driver.io_sync(direction(read), handle, addr, raw) {
                Ok(n) if n == op.len => Ok(()),
                Ok(n) => Err(RunError::Wrong(format!(
                    "io_sync at {} moved {n} of {} bytes",
                    op.offset, op.len
                ))),
                Err(e) => Err(RunError::Failed(format!("io_sync at {}: {e}", op.offset))),
            }
        },
    )?;
    finish(b, read, seed, Target::Device)?;
    Ok(threaded_sample(plan, measured))
}

/// Observes per-op completion (`bytes_done` becoming non-zero) from the submitting
/// thread. Ops of one stream complete in stream order, so one cursor per stream suffices.
struct Tracker<'a> {
    params: &'a [Vec<Arc<AsyncParams>>],
    starts: Vec<Vec<Instant>>,
    cursor: Vec<usize>,
    latencies_us: Vec<f64>,
    submit_us: Vec<f64>,
    last_progress: Instant,
}

impl<'a> Tracker<'a> {
    fn new(params: &'a [Vec<Arc<AsyncParams>>]) -> Tracker<'a> {
        Tracker {
            params,
            starts: params.iter().map(|p| Vec::with_capacity(p.len())).collect(),
            cursor: vec![0; params.len()],
            latencies_us: Vec::new(),
            submit_us: Vec::new(),
            last_progress: Instant::now(),
        }
    }

    fn submitted(&mut self, stream: usize, start: Instant) {
        self.submit_us.push(start.elapsed().as_secs_f64() * 1e6);
        self.starts[stream].push(start);
    }

    /// Records newly completed ops; `true` when all are done.
    fn poll(&mut self) -> bool {
        let mut all_done = true;
        for s in 0..self.params.len() {
            while self.cursor[s] < self.starts[s].len()
                && self.params[s][self.cursor[s]].bytes_done.load(Ordering::Acquire) != 0
            {
                let now = Instant::now();
                self.latencies_us.push((now - self.starts[s][self.cursor[s]]).as_secs_f64() * 1e6);
                self.cursor[s] += 1;
                self.last_progress = now;
            }
            all_done &= self.cursor[s] == self.params[s].len();
        }
        all_done
    }

    /// Polls until every op is done, sleeping between sweeps: 20 µs after progress,
    /// doubling up to [`MAX_POLL`] while nothing completes (the submitting thread must
    /// not steal much CPU from the engine on small machines).
    fn wait_all(&mut self) -> Result<(), RunError> {
        let mut pause = MIN_POLL;
        let mut done_before = self.latencies_us.len();
        while !self.poll() {
            if self.last_progress.elapsed() > STALL_LIMIT {
                return Err(RunError::Failed(format!(
                    "stalled: no op completed for {STALL_LIMIT:?}"
                )));
            }
            std::thread::sleep(pause);
            let done = self.latencies_us.len();
            pause = if done > done_before { MIN_POLL } else { (pause * 2).min(MAX_POLL) };
            done_before = done;
        }
        Ok(())
    }
}

/// Parameters of one op: `len` bytes at `file_offset`, buffer offset `buffer_offset`.
pub fn op_params(len: usize, file_offset: u64, buffer_offset: u64) -> Arc<AsyncParams> {
    let params = AsyncParams::new(len, file_offset as i64);
    params.buffer_offset_bytes.store(buffer_offset as i64, Ordering::Relaxed);
    params
}

/// Parameters of every op (buffer offset = file offset).
pub fn make_params(plan: &[Vec<Op>]) -> Vec<Vec<Arc<AsyncParams>>> {
    let make = |op: &Op| op_params(op.len, op.offset, op.offset);
    plan.iter().map(|ops| ops.iter().map(make).collect()).collect()
}

/// Checks every op's published byte count.
pub fn check_counts(plan: &[Vec<Op>], params: &[Vec<Arc<AsyncParams>>]) -> Result<(), RunError> {
    for (op, p) in plan.iter().flatten().zip(params.iter().flatten()) {
        let done = p.bytes_done.load(Ordering::Acquire);
        if done < 0 {
            return Err(RunError::Failed(format!(
                "op at offset {}: bytes_done = {done}",
                op.offset
            )));
        }
        if done as usize != op.len {
            return Err(RunError::Wrong(format!(
                "op at offset {} moved {done} of {} bytes",
                op.offset, op.len
            )));
        }
    }
    Ok(())
}

/// `(stream index, op index)` of every op of `plan`, round-robin over the streams (so
/// that every stream has work in flight early).
pub fn round_robin(plan: &[Vec<Op>]) -> impl Iterator<Item = (usize, usize)> + '_ {
    let longest = plan.iter().map(Vec::len).max().unwrap_or(0);
    (0..longest)
        .flat_map(move |i| (0..plan.len()).filter(move |&s| i < plan[s].len()).map(move |s| (s, i)))
}

/// Calls `submit(stream index, op index)` in [`round_robin`] order, polling completions
/// in between.
fn submit_round_robin(
    plan: &[Vec<Op>],
    tracker: &mut Tracker<'_>,
    mut submit: impl FnMut(usize, usize) -> Result<(), RunError>,
) -> Result<(), RunError> {
    for (s, i) in round_robin(plan) {
        let start = Instant::now();
        submit(s, i)?;
        tracker.submitted(s, start);
        tracker.poll();
    }
    Ok(())
}

/// ASYNC: every region on its own registered stream, all in flight, then sync all.
/// Latency per op: submit call → `bytes_done` observed non-zero.
pub fn run_async(b: &mut Bench, plan: &[Vec<Op>], read: bool) -> Result<Sample, RunError> {
    run_ours_async(b, plan, read, false)
}

/// ASYNC_MT: as [`run_async`], each stream's ops submitted by a thread of its own while
/// this thread observes completions.
pub fn run_async_threads(b: &mut Bench, plan: &[Vec<Op>], read: bool) -> Result<Sample, RunError> {
    run_ours_async(b, plan, read, true)
}

fn run_ours_async(
    b: &mut Bench,
    plan: &[Vec<Op>],
    read: bool,
    thread_per_stream: bool,
) -> Result<Sample, RunError> {
    let seed = prepare(b, read, Target::Device)?;
    let mut streams = StreamSet::create(b.device(), plan.len()).map_err(failed("streams"))?;
    streams.register(&b.env.driver, b.flags).map_err(failed("register"))?;
    let params = make_params(plan);
    let (driver, handle, addr) = (&b.env.driver, b.handle, b.dev.addr);
    let handles = streams.handles.clone();
    let submit = |s: usize, p: &Arc<AsyncParams>| {
        driver
            .submit_async(direction(read), handle, addr, p, handles[s])
            .map_err(|e| RunError::Failed(format!("submit_async: {e}")))
    };
    let sample = if thread_per_stream {
        run_async_threaded(plan, &params, &streams, submit)
    } else {
        run_async_with(plan, &params, &streams, submit)
    }?;
    drop(streams);
    check_counts(plan, &params)?;
    finish(b, read, seed, Target::Device)?;
    Ok(sample)
}

/// Submission and completion tracking for another async API (cuFile): `submit(stream
/// index, op index, params)`; completion is `bytes_done` becoming non-zero.
pub fn run_async_with(
    plan: &[Vec<Op>],
    params: &[Vec<Arc<AsyncParams>>],
    streams: &StreamSet,
    mut submit: impl FnMut(usize, &Arc<AsyncParams>) -> Result<(), RunError>,
) -> Result<Sample, RunError> {
    let mut tracker = Tracker::new(params);
    let timer = Timer::start();
    submit_round_robin(plan, &mut tracker, |s, i| submit(s, &params[s][i]))?;
    tracker.wait_all()?;
    streams.sync_all().map_err(failed("sync"))?;
    let (seconds, cpu_seconds) = timer.stop();
    let (bytes, ops) = totals(plan);
    let (latencies_us, submit_us) = (tracker.latencies_us, tracker.submit_us);
    Ok(Sample { seconds, bytes, ops, latencies_us, submit_us, cpu_seconds })
}

/// As [`run_async_with`], with stream `s`'s ops submitted in order by a thread of its
/// own; this thread records when each op's `bytes_done` turns non-zero.
fn run_async_threaded(
    plan: &[Vec<Op>],
    params: &[Vec<Arc<AsyncParams>>],
    streams: &StreamSet,
    submit: impl Fn(usize, &Arc<AsyncParams>) -> Result<(), RunError> + Sync,
) -> Result<Sample, RunError> {
    let timer = Timer::start();
    let refused = AtomicBool::new(false);
    let (submitted, finished) = std::thread::scope(|scope| {
        let submitters: Vec<_> = params
            .iter()
            .enumerate()
            .map(|(s, ops)| {
                let (submit, refused) = (&submit, &refused);
                scope.spawn(move || -> Result<Vec<(Instant, f64)>, RunError> {
                    let mut starts = Vec::with_capacity(ops.len());
                    for p in ops {
                        let start = Instant::now();
                        if let Err(e) = submit(s, p) {
                            refused.store(true, Ordering::SeqCst);
                            return Err(e);
                        }
                        starts.push((start, start.elapsed().as_secs_f64() * 1e6));
                    }
                    Ok(starts)
                })
            })
            .collect();
        let given_up =
            || refused.load(Ordering::SeqCst) && submitters.iter().all(|t| t.is_finished());
        let finished = completion_times(params, given_up);
        let submitted: Vec<_> =
            submitters.into_iter().map(|t| t.join().expect("submitting thread")).collect();
        (submitted, finished)
    });
    let mut latencies_us = Vec::new();
    let mut submit_us = Vec::new();
    for (starts, done) in submitted.into_iter().zip(&finished) {
        let starts = starts?;
        let done = done.as_ref().map_err(Clone::clone)?;
        for ((start, submit), end) in starts.iter().zip(done) {
            submit_us.push(*submit);
            latencies_us.push((*end - *start).as_secs_f64() * 1e6);
        }
    }
    streams.sync_all().map_err(failed("sync"))?;
    let (seconds, cpu_seconds) = timer.stop();
    let (bytes, ops) = totals(plan);
    Ok(Sample { seconds, bytes, ops, latencies_us, submit_us, cpu_seconds })
}

/// When each op's `bytes_done` was seen non-zero, per stream (ops of one stream complete
/// in stream order); a stream fails as stalled when nothing completed for
/// [`STALL_LIMIT`], or at once when `given_up()` (a submission was refused: that stream's
/// ops never all complete, and its submitter's error is the one reported).
fn completion_times(
    params: &[Vec<Arc<AsyncParams>>],
    given_up: impl Fn() -> bool,
) -> Vec<Result<Vec<Instant>, RunError>> {
    let mut done: Vec<Vec<Instant>> = params.iter().map(|p| Vec::with_capacity(p.len())).collect();
    let mut last_progress = Instant::now();
    let mut pause = MIN_POLL;
    loop {
        let mut progress = false;
        for (s, ops) in params.iter().enumerate() {
            while let Some(p) = ops.get(done[s].len())
                && p.bytes_done.load(Ordering::Acquire) != 0
            {
                done[s].push(Instant::now());
                progress = true;
            }
        }
        if done.iter().zip(params).all(|(d, p)| d.len() == p.len()) {
            return done.into_iter().map(Ok).collect();
        }
        if progress {
            last_progress = Instant::now();
            pause = MIN_POLL;
        } else if given_up() || last_progress.elapsed() > STALL_LIMIT {
            let stalled =
                || RunError::Failed(format!("stalled: no op completed for {STALL_LIMIT:?}"));
            return done
                .into_iter()
                .zip(params)
                .map(|(d, p)| if d.len() == p.len() { Ok(d) } else { Err(stalled()) })
                .collect();
        } else {
            pause = (pause * 2).min(MAX_POLL);
        }
        std::thread::sleep(pause);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every op of a threaded row runs inside the row's clocks, `--profile` included: its
    /// window reads every thread's CPU time first, and threads released before it once
    /// ran most of a short row meanwhile (a CPUONLY write row of 16 MiB read 1300 GiB/s).
    #[test]
    fn threaded_ops_run_inside_the_rows_clocks() {
        crate::profile::record_timed_windows();
        const OPS_PER_THREAD: usize = 50;
        let op_time = Duration::from_micros(10);
        let plan: Vec<Vec<Op>> = (0..2)
            .map(|_| (0..OPS_PER_THREAD).map(|i| Op { offset: i as u64, len: 1 }).collect())
            .collect();
        // As in the bench, many threads to read (executors, stream workers, the device's).
        let measured = crate::profile::with_idle_threads(64, || {
            timed_threads(
                &plan,
                || Ok(()),
                |_, _| {
                    let start = Instant::now();
                    while start.elapsed() < op_time {
                        std::hint::spin_loop();
                    }
                    Ok(())
                },
            )
        });
        let (latencies_us, seconds, _) = measured.unwrap();
        for thread in latencies_us.chunks(OPS_PER_THREAD) {
            let busy_seconds: f64 = thread.iter().sum::<f64>() * 1e-6;
            assert!(busy_seconds <= seconds, "a thread's ops took {busy_seconds} s of {seconds}");
        }
    }

    #[test]
    fn plan_covers_the_file_once() {
        for (size, io, streams, random) in
            [(100u64, 10u64, 3usize, false), (100, 30, 8, true), (4096, 4096, 4, false)]
        {
            let plan = plan(size, io, streams, random);
            let mut ops: Vec<Op> = plan.iter().flatten().copied().collect();
            ops.sort_by_key(|op| op.offset);
            let mut next = 0;
            for op in &ops {
                assert_eq!(op.offset, next);
                next += op.len as u64;
            }
            assert_eq!(next, size);
            assert!(plan.len() <= streams && plan.iter().all(|ops| !ops.is_empty()));
        }
    }
}
