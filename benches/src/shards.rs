//! `--mode shards`: several GPUs in one process, the way a tensor-parallel model loads —
//! every device reads its own shard file into its own memory at once, through the async
//! API on streams of that device.
//!
//! Rows, each the median of `--reps`, hot (page cache) and, with `--cold`, cold:
//! - `ONE`: device 0 alone loads its shard (the single-GPU reference);
//! - `ALL`: every device loads its shard at once; aggregate GiB/s = all shards' bytes over
//!   the time from the common start to the last device's end;
//! - `COPY_ONE d` / `COPY_ALL`: pinned host → device copies of the same bytes alone, per
//!   device and on every device at once (the PCIe ceiling). The report gives ALL against
//!   the sum of the per-device copy rates, against COPY_ALL and against ONE × devices.
//!
//! Every shard is verified byte for byte after its first load (`--no-verify` skips it).
//! CPU cores used = process CPU seconds over wall seconds of the run.

use std::cell::Cell;
use std::os::fd::AsRawFd;
use std::sync::Barrier;
use std::time::Instant;

use hipfile_runtime::HandleId;

use crate::bench::{Env, RunError, TestFile, Timer, failed, open_env};
use crate::cli::{RunArgs, format_size};
use crate::error::{Context, Result, fail};
use crate::mem::{DeviceBuf, Pinned, StreamSet, download, memset};
use crate::runner::{file_dir, file_path};
use crate::workload::{check_counts, direction, make_params, plan, run_async_with};
use crate::{pattern, sys};

const MIB: u64 = 1 << 20;
const GIB: f64 = (1u64 << 30) as f64;
const PAGE: u64 = 4096;
/// The pinned source of the copy rows: copied again and again to cover a shard.
const COPY_SOURCE_MAX: usize = 256 << 20;

/// One device's shard: its file, registered, and its device buffer.
struct Shard {
    ordinal: u32,
    file: TestFile,
    handle: HandleId,
    dev: DeviceBuf,
}

/// How one load or copy went: wall seconds from the common start to its end.
struct Timed {
    seconds: f64,
}

/// A row of the report.
struct ShardRow {
    what: String,
    cache: &'static str,
    devices: usize,
    bytes: u64,
    seconds: f64,
    cpu_seconds: f64,
    error: Option<String>,
}

impl ShardRow {
    fn gib_per_s(&self) -> f64 {
        if self.seconds > 0.0 { self.bytes as f64 / GIB / self.seconds } else { 0.0 }
    }
}

/// Runs the mode; `Ok(false)` when a load was wrong or failed.
pub fn main(args: &RunArgs) -> Result<bool> {
    let started = Instant::now();
    let (base, keep) = file_path(args);
    let env = open_env(args.device, args.threads, args.direct, &file_dir(&base))?;
    let devices = env.device.device_count() as usize;
    if devices == 0 {
        return fail("no device");
    }
    let default = if env.backend == "cpu" { 64 * MIB } else { 4096 * MIB };
    let shard_bytes = args.file_size.unwrap_or(default).div_ceil(PAGE) * PAGE;
    let io_size = args.io_sizes()[0];
    let streams = args.streams.first().map_or(4, |&s| s as usize);
    check_memory(&env, devices, shard_bytes)?;
    println!(
        "hipfile-bench {} --mode shards: device {} ({devices} device(s)), {} executor(s) on CPUs {:?}",
        env!("CARGO_PKG_VERSION"),
        env.backend,
        env.config.executor_count(),
        env.config.executor_cpus
    );
    println!(
        "each device loads its own {} shard in {} ops on {streams} stream(s) of its own (flags {}), {}",
        format_size(shard_bytes),
        format_size(io_size),
        args.flags,
        env.direct.label()
    );
    let len = usize::try_from(shard_bytes).ctx("shard size")?;
    let mut scratch = Pinned::alloc(&env.device, len)?;
    let mut shards = Vec::with_capacity(devices);
    for ordinal in 0..devices as u32 {
        let path = base.with_extension(format!("gpu{ordinal}"));
        let seed = u64::from(ordinal) + 1;
        let file = TestFile::create(
            &path,
            shard_bytes,
            env.direct.effective,
            keep,
            scratch.bytes_mut(),
            seed,
        )?;
        let handle = env.driver.handle_register(file.io.as_raw_fd()).ctx("handle_register")?;
        let dev = DeviceBuf::alloc_on(&env.device, ordinal, len)?;
        env.driver.buf_register(dev.addr, shard_bytes, 0).ctx("buf_register")?;
        shards.push(Shard { ordinal, file, handle, dev });
    }
    let copy_sources = (0..devices)
        .map(|_| Pinned::alloc(&env.device, len.min(COPY_SOURCE_MAX)))
        .collect::<Result<Vec<_>>>()?;

    let load = |subset: &[&Shard]| load_at_once(&env, subset, args.flags, io_size, streams);
    // Untimed: the first engine job of a process makes the engine's GPU context and
    // streams; every device once, with the verification.
    let mut ok = true;
    for shard in &shards {
        let checked = load(&[shard]).and_then(|_| verify(&env, shard, &mut scratch, args));
        if let Err(error) = checked {
            println!("device {}: first load FAILED: {error:?}", shard.ordinal);
            ok = false;
        }
    }
    let mut rows = Vec::new();
    let caches: &[&'static str] = if args.cold { &["hot", "cold"] } else { &["hot"] };
    for &cache in caches {
        let one: Vec<&Shard> = shards.iter().take(1).collect();
        let all: Vec<&Shard> = shards.iter().collect();
        for (what, subset) in [("ONE (device 0 alone)", &one), ("ALL (every device at once)", &all)]
        {
            let row = median_row(args.reps, what, cache, subset.len(), shard_bytes, || {
                prepare(&env, subset, cache == "cold")?;
                load(subset)
            });
            ok &= row.error.is_none();
            rows.push(row);
        }
        if cache == "hot" {
            for shard in &shards {
                let what = format!("COPY_ONE (device {} alone)", shard.ordinal);
                let source = &copy_sources[shard.ordinal as usize];
                rows.push(median_row(args.reps, &what, "-", 1, shard_bytes, || {
                    copy_at_once(&env, &[(shard, source)], io_size, streams)
                }));
            }
            let pairs: Vec<_> = shards.iter().zip(&copy_sources).collect();
            rows.push(median_row(
                args.reps,
                "COPY_ALL (every device at once)",
                "-",
                devices,
                shard_bytes,
                || copy_at_once(&env, &pairs, io_size, streams),
            ));
        }
    }
    // The loads moved the right bytes: check the shards once more (the last run's data).
    for shard in &shards {
        if let Err(error) = verify(&env, shard, &mut scratch, args) {
            println!("device {}: data after the runs WRONG: {error:?}", shard.ordinal);
            ok = false;
        }
    }
    print_report(&rows, devices);
    println!("total: {:.1} s", started.elapsed().as_secs_f64());
    Ok(ok)
}

/// The host memory the mode needs: one pinned shard (creation and checks), the copy
/// sources, and on the cpu device every shard's device memory.
fn check_memory(env: &Env, devices: usize, shard_bytes: u64) -> Result<()> {
    let device_memory = if env.backend == "cpu" { shard_bytes * devices as u64 } else { 0 };
    let copy = shard_bytes.min(COPY_SOURCE_MAX as u64) * devices as u64;
    let need = shard_bytes + copy + device_memory + env.config.pinned_cap_bytes() as u64;
    match sys::mem_available_bytes() {
        Some(available) if need > available / 10 * 9 => fail(format!(
            "--file-size {}: {devices} shards need about {} MiB of host memory, {} MiB are available",
            format_size(shard_bytes),
            need / MIB,
            available / MIB
        )),
        _ => Ok(()),
    }
}

/// Before a timed load: poison the targets, and drop the shards' cached pages (cold) or
/// make sure they are cached (hot).
fn prepare(env: &Env, subset: &[&Shard], cold: bool) -> std::result::Result<(), RunError> {
    for shard in subset {
        memset(&env.device, shard.dev.addr, crate::bench::POISON, shard.dev.len)
            .map_err(failed("poison"))?;
        if cold {
            sys::drop_file_cache(&shard.file.io)
                .map_err(|e| RunError::Failed(format!("fadvise: {e}")))?;
        } else if !env.direct.effective {
            warm(&shard.file).map_err(|e| RunError::Failed(format!("warming the cache: {e}")))?;
        }
    }
    Ok(())
}

/// Reads the whole file once through the page cache (a small buffer, its pages stay).
fn warm(file: &TestFile) -> std::io::Result<()> {
    let mut piece = vec![0u8; 4 << 20];
    let mut offset = 0;
    while offset < file.size {
        let want = piece.len().min((file.size - offset) as usize);
        let got =
            hipfile_runtime::file::pread_full(file.plain.as_raw_fd(), &mut piece[..want], offset)?;
        if got == 0 {
            break;
        }
        offset += got as u64;
    }
    Ok(())
}

/// Every shard of `subset` loaded by its own thread at once, through the async API on
/// `streams` streams of its device; the time from the common start to the last end.
fn load_at_once(
    env: &Env,
    subset: &[&Shard],
    flags: u32,
    io_size: u64,
    streams: usize,
) -> std::result::Result<Timed, RunError> {
    at_once(subset.len(), |index, line| {
        let shard = subset[index];
        let plan = plan(shard.file.size, io_size, streams, false);
        let mut set = StreamSet::create_on(&env.device, shard.ordinal, plan.len())
            .map_err(failed("streams"))?;
        set.register(&env.driver, flags).map_err(failed("register"))?;
        let params = make_params(&plan);
        let handles = set.handles.clone();
        line.cross();
        run_async_with(&plan, &params, &set, |s, p| {
            env.driver
                .submit_async(direction(true), shard.handle, shard.dev.addr, p, handles[s])
                .map_err(|e| RunError::Failed(format!("submit_async: {e}")))
        })?;
        let end = Instant::now();
        check_counts(&plan, &params)?;
        Ok(end)
    })
}

/// Pinned host → device copies covering every shard of `pairs` at once, on `streams`
/// streams of each device.
fn copy_at_once(
    env: &Env,
    pairs: &[(&Shard, &Pinned)],
    io_size: u64,
    streams: usize,
) -> std::result::Result<Timed, RunError> {
    at_once(pairs.len(), |index, line| {
        let (shard, source) = pairs[index];
        let plan = plan(shard.file.size, io_size, streams, false);
        let set = StreamSet::create_on(&env.device, shard.ordinal, plan.len())
            .map_err(failed("streams"))?;
        line.cross();
        for (ops, &stream) in plan.iter().zip(&set.handles) {
            for op in ops {
                let from = (op.offset as usize) % source.len();
                let len = op.len.min(source.len() - from);
                // SAFETY: `source` is pinned and outlives the synchronization below; the
                // range lies inside it (`from + len <= source.len()`) and inside the
                // shard's device buffer (the plan covers exactly the shard's bytes).
                unsafe {
                    env.device.copy_to_device_on(
                        stream,
                        shard.dev.addr + op.offset,
                        source.ptr().add(from),
                        len,
                    )
                }
                .map_err(|e| RunError::Failed(format!("copy: {e}")))?;
            }
        }
        set.sync_all().map_err(failed("sync"))?;
        Ok(Instant::now())
    })
}

/// The start line of [`at_once`]: every thread crosses it once it is set up.
struct StartLine<'a> {
    barrier: &'a Barrier,
    crossed: Cell<bool>,
}

impl StartLine<'_> {
    /// Waits until every thread (and the timer) is at the line.
    fn cross(&self) {
        if !self.crossed.replace(true) {
            self.barrier.wait();
        }
    }
}

/// Runs `work(index, start line)` on `count` threads; each crosses the start line when set
/// up and returns the instant it ended. The time is from the common start to the last end.
fn at_once(
    count: usize,
    work: impl Fn(usize, &StartLine<'_>) -> std::result::Result<Instant, RunError> + Sync,
) -> std::result::Result<Timed, RunError> {
    let barrier = Barrier::new(count + 1);
    let (start, ends) = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..count)
            .map(|index| {
                let (barrier, work) = (&barrier, &work);
                scope.spawn(move || {
                    let line = StartLine { barrier, crossed: Cell::new(false) };
                    let result = work(index, &line);
                    // A thread that failed before the line must not strand the others.
                    line.cross();
                    result
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        let ends: Vec<_> = handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(RunError::Failed("a thread panicked".into()))))
            .collect();
        (start, ends)
    });
    let mut last = start;
    for end in ends {
        last = last.max(end?);
    }
    Ok(Timed { seconds: (last - start).as_secs_f64() })
}

/// The median (by time) of `reps` runs of `run`, with the process's CPU seconds.
fn median_row(
    reps: u32,
    what: &str,
    cache: &'static str,
    devices: usize,
    shard_bytes: u64,
    mut run: impl FnMut() -> std::result::Result<Timed, RunError>,
) -> ShardRow {
    let mut samples = Vec::new();
    let mut error = None;
    for _ in 0..reps.max(1) {
        let timer = Timer::start();
        match run() {
            Ok(timed) => samples.push((timed.seconds, timer.stop().1)),
            Err(e) => {
                error = Some(format!("{e:?}"));
                break;
            }
        }
    }
    samples.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (seconds, cpu_seconds) = samples.get(samples.len() / 2).copied().unwrap_or((0.0, 0.0));
    let bytes = shard_bytes * devices as u64;
    ShardRow { what: what.to_owned(), cache, devices, bytes, seconds, cpu_seconds, error }
}

/// Downloads the shard and checks it against its file's pattern.
fn verify(
    env: &Env,
    shard: &Shard,
    scratch: &mut Pinned,
    args: &RunArgs,
) -> std::result::Result<(), RunError> {
    if args.no_verify {
        return Ok(());
    }
    let len = shard.dev.len;
    download(&env.device, scratch, shard.dev.addr, len).map_err(failed("download"))?;
    pattern::verify(&scratch.bytes()[..len], 0, shard.file.seed).map_err(|bad| {
        RunError::Wrong(format!("device {}: byte at offset {bad} differs", shard.ordinal))
    })
}

fn print_report(rows: &[ShardRow], devices: usize) {
    println!();
    println!(
        "{:<32} {:>5} {:>7} {:>10} {:>9} {:>9} {:>10}",
        "run", "cache", "devices", "GiB", "GiB/s", "seconds", "CPU cores"
    );
    for row in rows {
        let cores = if row.seconds > 0.0 { row.cpu_seconds / row.seconds } else { 0.0 };
        match &row.error {
            Some(error) => println!("{:<32} {:>5} FAILED: {error}", row.what, row.cache),
            None => println!(
                "{:<32} {:>5} {:>7} {:>10.2} {:>9.2} {:>9.3} {:>10.2}",
                row.what,
                row.cache,
                row.devices,
                row.bytes as f64 / GIB,
                row.gib_per_s(),
                row.seconds,
                cores
            ),
        }
    }
    let rate = |prefix: &str, cache: &str| {
        rows.iter()
            .find(|r| r.what.starts_with(prefix) && r.cache == cache && r.error.is_none())
            .map(ShardRow::gib_per_s)
    };
    let copy_sum: f64 = rows
        .iter()
        .filter(|r| r.what.starts_with("COPY_ONE") && r.error.is_none())
        .map(ShardRow::gib_per_s)
        .sum();
    println!();
    for cache in ["hot", "cold"] {
        let (Some(all), Some(one)) = (rate("ALL", cache), rate("ONE", cache)) else { continue };
        let mut line = format!(
            "{cache}: ALL {all:.2} GiB/s = {:.2}x one device alone ({one:.2}), {:.2}x of {devices} x one",
            all / one,
            all / (one * devices as f64)
        );
        if copy_sum > 0.0 {
            line += &format!(
                ", {:.2}x the sum of per-device copy rates ({copy_sum:.2})",
                all / copy_sum
            );
        }
        if let Some(copy_all) = rate("COPY_ALL", "-") {
            line += &format!(", {:.2}x COPY_ALL ({copy_all:.2})", all / copy_all);
        }
        println!("{line}");
    }
}
