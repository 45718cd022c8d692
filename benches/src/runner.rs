//! The benchmark run: resolve options, set up, run every case, report.

use std::io::IsTerminal;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

use crate::batch_mode;
use crate::bench::{Bench, Env, RunError, Sample, default_file_path, open_env};
use crate::cli::{Mode, RunArgs, format_size};
use crate::cufile::CuFile;
use crate::error::{Result, fail};
use crate::latency::{self, LatencyReport};
use crate::profile::{Profile, ProfileStart};
use crate::report::{self, Case, Row};
use crate::workload::{self, Xfer, plan};
use crate::{baselines, cufile, shards, svg, sweep, sys};

const MIB: u64 = 1 << 20;
const PAGE: u64 = 4096;

/// Everything the JSON report holds.
#[derive(Serialize)]
struct JsonReport {
    tool: String,
    command_line: Vec<String>,
    device: DeviceInfo,
    config: ConfigInfo,
    file: FileInfo,
    cufile: String,
    results: Vec<Row>,
    latency: Option<LatencyReport>,
    stats: Option<StatsInfo>,
}

/// The device, for JSON reports.
#[derive(Serialize)]
pub struct DeviceInfo {
    backend: &'static str,
    count: u32,
    stream_memops: bool,
}

#[derive(Serialize)]
struct ConfigInfo {
    executor_cpus: Vec<usize>,
    staging_chunk_bytes: usize,
    staging_per_executor_bytes: usize,
    pinned_fallback_cap_bytes: usize,
    pinned_cap_bytes: usize,
    request_parallelism: usize,
    chunks_in_flight: usize,
    copy_spin_us: usize,
    /// What each executor polls before it parks, as in effect on this machine.
    park_spin_us: usize,
    caller_thread: String,
    prefetch_cap_bytes: usize,
    direct_policy: String,
    direct_effective: bool,
    stream_flags: u32,
    reps: u32,
    verify: bool,
    cold: Option<String>,
}

/// The test file, for JSON reports.
#[derive(Serialize)]
pub struct FileInfo {
    path: String,
    size_bytes: u64,
    filesystem: String,
    cache: &'static str,
}

#[derive(Serialize)]
struct StatsInfo {
    engine_jobs: u64,
    arena_chunks: u64,
    fallback_chunks: u64,
    sync_retry_chunks: u64,
    caller_thread_requests: u64,
    caller_thread_large_requests: u64,
    caller_thread_requests_beside_ops: u64,
    /// Requests split into fewer parts under load (`HIPFILE_LOADED_FAN_OUT`).
    requests_split_under_load: u64,
    blocking_jobs: u64,
    fallback_waits: u64,
    host_memory_preads: u64,
    host_memory_pwrites: u64,
    async_submitted: u64,
    async_prefetched: u64,
    device_releases: u64,
    stream_copies: u64,
    /// Ops that went through their stream's spare slot (`HIPFILE_STREAM_COPIES=all`).
    spare_ops: u64,
    /// Reads done inside the submit call (`HIPFILE_INLINE_READ_KB`).
    read_at_submission: u64,
    /// Writes copied on their stream in pieces (`HIPFILE_STREAM_WRITE_PIECE_KB`).
    writes_in_pieces: u64,
    host_releases: u64,
    direct_read_bytes: u64,
    buffered_read_bytes: u64,
    direct_written_bytes: u64,
    buffered_written_bytes: u64,
    /// Device memory the read slots held when the run ended (`HIPFILE_STREAM_COPY_SLOTS=device`).
    device_slot_bytes: u64,
    /// Reads that found no free device slot (the cap reached).
    reads_past_device_slots: u64,
    /// Of those, reads that shared a slot of their stream (`HIPFILE_STREAM_COPY_DEVICE_FULL=share`).
    reads_sharing_device_slots: u64,
}

/// Default streams: usable CPUs, at most 8.
fn default_streams() -> Vec<u32> {
    vec![hipfile_runtime::config::usable_cpus().len().clamp(1, 8) as u32]
}

/// The file size: given, else 256 MiB on the cpu device and 2 GiB on a GPU; whole pages.
pub fn file_size(args: &RunArgs, env: &Env) -> u64 {
    let default = if env.backend == "cpu" { 256 * MIB } else { 2048 * MIB };
    args.file_size.unwrap_or(default).div_ceil(PAGE) * PAGE
}

/// Checks the options that clap cannot: I/O sizes and the chart's file name.
pub fn check_args(args: &RunArgs) -> Result<()> {
    let sizes = args.io_sizes();
    if let Some(bad) = sizes.iter().find(|&&s| !s.is_multiple_of(PAGE)) {
        return fail(format!(
            "--io-size {bad} is not a multiple of 4K (O_DIRECT and PAGE_ALIGNED need it)"
        ));
    }
    if let Some(bad) = sizes.iter().find(|&&s| s > 1 << 30) {
        return fail(format!("--io-size {} is above 1G", format_size(*bad)));
    }
    if let Some(path) = &args.plot
        && path.extension().is_none_or(|e| e != "svg")
    {
        return fail(format!("--plot {}: the chart is SVG; name the file *.svg", path.display()));
    }
    Ok(())
}

/// Host memory the buffers need: pinned memory of the file's size, plus the device
/// buffer itself on the cpu device (its memory is host memory).
pub fn check_memory(env: &Env, size: u64) -> Result<()> {
    let copies = if env.backend == "cpu" { 2 } else { 1 };
    let need = size * copies + env.config.pinned_cap_bytes() as u64;
    match sys::mem_available_bytes() {
        Some(available) if need > available / 10 * 9 => fail(format!(
            "--file-size {}: the buffers need about {} MiB of host memory, {} MiB are available",
            format_size(size),
            need / MIB,
            available / MIB
        )),
        _ => Ok(()),
    }
}

/// Prints the device, the configuration in effect and the test file.
pub fn describe_env(env: &Env, path: &Path, size: u64, args: &RunArgs) {
    let c = &env.config;
    let memops = env.device.supports_stream_memops(0);
    println!(
        "hipfile-bench {}: device {} ({} device(s), stream memops {}), {} executor(s) on CPUs {:?}",
        env!("CARGO_PKG_VERSION"),
        env.backend,
        env.device.device_count(),
        if memops { "yes" } else { "no" },
        c.executor_count(),
        c.executor_cpus
    );
    println!(
        "config: chunk {} KiB, staging {} MiB/executor, queue depth {}, request parallelism {}{}, prefetch {} MiB, pinned cap {} MiB, O_DIRECT policy {:?}, park spin {} us, reads inside the submit call {}",
        c.staging_chunk_bytes >> 10,
        c.staging_per_executor_bytes >> 20,
        c.chunks_in_flight,
        c.request_parallelism,
        c.busy_fan_out
            .map_or(String::new(), |least| format!(" (idle executors, at least {least})"))
            + &c.loaded_fan_out.map_or(String::new(), |parts| format!(
                ", {parts} once half as many queued requests as executors are in flight"
            )),
        c.prefetch_cap_bytes() >> 20,
        c.pinned_cap_bytes() >> 20,
        c.direct,
        c.park_spin_us(),
        match c.inline_read_bytes {
            0 => "off".to_owned(),
            bytes => format!("up to {} KiB", bytes >> 10),
        }
    );
    if c.stream_copies != hipfile_runtime::config::StreamCopies::Off {
        println!(
            "stream copies: {:?}, slots of reads over 64 KiB {:?}, {} MiB per slot size, {}{}",
            c.stream_copies,
            c.stream_copy_slots,
            c.stream_copy_cap_bytes >> 20,
            match (c.stream_copy_writes, c.stream_write_piece_bytes) {
                (false, _) => "writes on the engine's path".to_owned(),
                (true, 0) => "fully FIXED writes copied whole".to_owned(),
                (true, bytes) => format!("fully FIXED writes in pieces of {} KiB", bytes >> 10),
            },
            if c.stream_copy_slots == hipfile_runtime::config::StreamCopySlots::Device {
                format!(
                    ", {} MiB of device slots per device (reads past it: {:?}), {}",
                    c.stream_copy_device_cap_bytes >> 20,
                    c.stream_copy_device_full,
                    crate::check::idle_text(c.stream_copy_device_idle_ms)
                )
            } else {
                String::new()
            }
        );
    }
    println!(
        "file: {} ({} MiB, {}), {}{}",
        path.display(),
        size / MIB,
        sys::fs_type(path.parent().unwrap_or(Path::new("/"))),
        env.direct.label(),
        if args.cold { ", cold reads (--cold)" } else { ", hot reads" }
    );
    if let Some(note) = &env.direct.note {
        println!("warning: {note}");
    }
}

/// The test file's path, and whether the user named it (then it is kept).
pub fn file_path(args: &RunArgs) -> (PathBuf, bool) {
    match &args.file {
        Some(path) => (path.clone(), true),
        None => (default_file_path(), false),
    }
}

/// The directory of the test file (where O_DIRECT is probed).
pub fn file_dir(path: &Path) -> PathBuf {
    path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")).to_path_buf()
}

/// Opens cuFile on the cuda device; `(driver, status line)`.
fn open_cufile(b: &Bench, args: &RunArgs) -> (Option<CuFile>, String) {
    if args.no_baselines {
        return (None, "cuFile: skipped (--no-baselines)".into());
    }
    if b.env.backend != "cuda" {
        return (None, format!("cuFile: not available (device is {}, not cuda)", b.env.backend));
    }
    let opened = CuFile::open(args.cufile.as_deref()).and_then(|mut cf| {
        cf.register_file(b.file.io.as_raw_fd())?;
        cf.register_buffer(b.dev.addr, b.dev.len)?;
        Ok(cf)
    });
    match opened {
        Ok(cf) => {
            let version = cf.version.map_or(String::new(), |v| format!(" version {v}"));
            let line = format!(
                "cuFile: {}{version}, compat mode (CUFILE_EXPERIMENTAL_FS=1), streams registered with flags {}",
                cf.path.display(),
                cufile::CUFILE_STREAM_FLAGS
            );
            (Some(cf), line)
        }
        Err(reason) => (None, format!("cuFile: not available ({reason})")),
    }
}

fn xfers(mode: Mode, baselines: bool, cufile: bool) -> Vec<Xfer> {
    let mut list = vec![Xfer::Async];
    if mode.is_random() {
        list.push(Xfer::AsyncThreads);
    }
    list.push(Xfer::Sync);
    if baselines {
        list.extend([Xfer::CpuOnly, Xfer::CpuGpu]);
        if !mode.is_random() {
            list.push(Xfer::GpuCopy);
        }
        if cufile {
            list.extend([Xfer::CufileAsync, Xfer::CufileSync]);
        }
    }
    list
}

fn cases(args: &RunArgs, cufile: bool) -> Vec<Case> {
    let streams = if args.streams.is_empty() { default_streams() } else { args.streams.clone() };
    let mut modes = args.mode.clone();
    modes.dedup();
    let mut list = Vec::new();
    for &mode in &modes {
        for io_size in args.io_sizes() {
            for &s in &streams {
                for xfer in xfers(mode, !args.no_baselines, cufile) {
                    list.push(Case { mode, io_size, streams: s as usize, xfer });
                }
            }
        }
    }
    list
}

fn run_once(
    b: &mut Bench,
    cf: Option<&CuFile>,
    case: &Case,
    ops: &[Vec<workload::Op>],
) -> std::result::Result<Sample, RunError> {
    let read = case.mode.is_read();
    let no_cufile = || RunError::Failed("cuFile not open".into());
    match case.xfer {
        Xfer::Async => workload::run_async(b, ops, read),
        Xfer::AsyncThreads => workload::run_async_threads(b, ops, read),
        Xfer::Sync => workload::run_sync(b, ops, read),
        Xfer::CpuOnly => baselines::run_cpu_only(b, ops, read),
        Xfer::CpuGpu => baselines::run_cpu_gpu(b, ops, read),
        Xfer::GpuCopy => baselines::run_gpu_copy(b, ops, read),
        Xfer::CufileAsync => cufile::run_async(cf.ok_or_else(no_cufile)?, b, ops, read),
        Xfer::CufileSync => cufile::run_sync(cf.ok_or_else(no_cufile)?, b, ops, read),
    }
}

fn cache_label(b: &Bench, case: &Case) -> &'static str {
    match (case.xfer, case.mode.is_read()) {
        (Xfer::GpuCopy, _) => "none (no file I/O)",
        (_, true) if b.cold.is_some() && !b.env.direct.effective => "cold",
        _ => b.env.direct.label(),
    }
}

fn run_case(b: &mut Bench, cf: Option<&CuFile>, case: &Case, reps: u32, bar: &ProgressBar) -> Row {
    let row = measure_case(b, cf, case, reps, bar);
    bar.suspend(|| {
        print!("{}", report::line(&row));
        if let Some(profile) = &row.profile {
            print!("{}", profile.lines());
        }
    });
    row
}

fn measure_case(
    b: &mut Bench,
    cf: Option<&CuFile>,
    case: &Case,
    reps: u32,
    bar: &ProgressBar,
) -> Row {
    let ops = plan(b.file.size, case.io_size, case.streams, case.mode.is_random());
    bar.set_message(format!(
        "{} {} S={} {}",
        case.mode.io_type(),
        case.xfer.name(),
        ops.len(),
        format_size(case.io_size)
    ));
    let mut samples: Vec<Sample> = Vec::new();
    let mut error = None;
    let profile_start = b.profile.then(|| ProfileStart::take(b));
    for rep in 0..reps {
        match run_once(b, cf, case, &ops) {
            Ok(sample) => samples.push(sample),
            Err(e) => {
                error = Some(e);
                bar.inc(u64::from(reps - rep));
                break;
            }
        }
        bar.inc(1);
    }
    let mut row = Row::new(case, ops.len(), &samples, error, b.verify, cache_label(b, case));
    // A failed case moved no bytes that count: its profile would divide by nothing.
    if let Some(start) = profile_start.filter(|_| matches!(row.status, "ok" | "unverified")) {
        let bytes = samples.iter().map(|s| s.bytes).sum();
        let timed_s = samples.iter().map(|s| s.seconds).sum();
        row.profile = Some(Profile::since(&start, b, bytes, timed_s));
    }
    row
}

fn progress(total: u64, args: &RunArgs) -> ProgressBar {
    let bar = ProgressBar::new(total);
    if args.json.is_some() || !std::io::stderr().is_terminal() {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    let style = ProgressStyle::with_template("{bar:30} {pos}/{len} runs, {elapsed} {msg}");
    if let Ok(style) = style {
        bar.set_style(style);
    }
    bar
}

fn stats(b: &Bench) -> Option<StatsInfo> {
    let engine = b.env.driver.engine().ok()?.stats();
    let a = b.env.driver.async_stats();
    let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    let file = b.env.driver.file(b.handle).ok()?.counters();
    Some(StatsInfo {
        engine_jobs: engine.jobs,
        arena_chunks: engine.arena_chunks,
        fallback_chunks: engine.fallback_chunks,
        sync_retry_chunks: engine.sync_retry_chunks,
        caller_thread_requests: engine.caller_thread_requests,
        caller_thread_large_requests: engine.caller_thread_large_requests,
        caller_thread_requests_beside_ops: engine.caller_thread_requests_beside_ops,
        requests_split_under_load: engine.requests_split_under_load,
        blocking_jobs: engine.blocking_jobs,
        fallback_waits: engine.fallback_waits,
        host_memory_preads: engine.host_memory_preads,
        host_memory_pwrites: engine.host_memory_pwrites,
        async_submitted: load(&a.submitted),
        async_prefetched: load(&a.prefetched),
        device_releases: load(&a.device_releases),
        stream_copies: load(&a.stream_copies),
        spare_ops: load(&a.spare_ops),
        read_at_submission: load(&a.read_at_submission),
        writes_in_pieces: load(&a.writes_in_pieces),
        host_releases: load(&a.host_releases),
        direct_read_bytes: file.direct_read_bytes,
        buffered_read_bytes: file.buffered_read_bytes,
        direct_written_bytes: file.direct_written_bytes,
        buffered_written_bytes: file.buffered_written_bytes,
        device_slot_bytes: b.env.driver.device_slot_bytes() as u64,
        reads_past_device_slots: b.env.driver.reads_past_device_slots(),
        reads_sharing_device_slots: b.env.driver.reads_sharing_device_slots(),
    })
}

fn print_stats(s: &StatsInfo) {
    println!(
        "hipfile-rs counters: {} engine jobs ({} arena chunks, {} fallback, {} waits for a fallback chunk, {} sync retries; {} on blocking executors; slot jobs moved by one pread / pwrite: {} / {}; {} requests split in fewer parts under load), {} requests on the caller's thread ({} of more than one chunk, {} while async ops were alive); async {} submitted ({} read inside the submit call), {} prefetched, {} copied on the user's stream ({} ops through their stream's spare slot, {} writes in pieces), {} device / {} host releases; file {} MiB O_DIRECT + {} MiB buffered read, {} MiB O_DIRECT + {} MiB buffered written; device slots hold {} MiB ({} reads found none free, {} of them shared their stream's)",
        s.engine_jobs,
        s.arena_chunks,
        s.fallback_chunks,
        s.fallback_waits,
        s.sync_retry_chunks,
        s.blocking_jobs,
        s.host_memory_preads,
        s.host_memory_pwrites,
        s.requests_split_under_load,
        s.caller_thread_requests,
        s.caller_thread_large_requests,
        s.caller_thread_requests_beside_ops,
        s.async_submitted,
        s.read_at_submission,
        s.async_prefetched,
        s.stream_copies,
        s.spare_ops,
        s.writes_in_pieces,
        s.device_releases,
        s.host_releases,
        s.direct_read_bytes >> 20,
        s.buffered_read_bytes >> 20,
        s.direct_written_bytes >> 20,
        s.buffered_written_bytes >> 20,
        s.device_slot_bytes >> 20,
        s.reads_past_device_slots,
        s.reads_sharing_device_slots
    );
}

/// The device part of a JSON report.
pub fn device_info(env: &Env) -> DeviceInfo {
    DeviceInfo {
        backend: env.backend,
        count: env.device.device_count(),
        stream_memops: env.device.supports_stream_memops(0),
    }
}

/// The file part of a JSON report.
pub fn file_info(env: &Env, path: &Path, size: u64) -> FileInfo {
    FileInfo {
        path: path.display().to_string(),
        size_bytes: size,
        filesystem: sys::fs_type(path.parent().unwrap_or(Path::new("/"))),
        cache: env.direct.label(),
    }
}

fn json_report(
    b: &Bench,
    args: &RunArgs,
    cufile: String,
    results: Vec<Row>,
    latency: Option<LatencyReport>,
) -> JsonReport {
    let c = &b.env.config;
    let cold = b.cold.as_ref().map(|cold| match &cold.system_drop {
        Ok(()) => "posix_fadvise(DONTNEED) + drop_caches".to_string(),
        Err(e) => format!("posix_fadvise(DONTNEED) only (drop_caches not permitted: {e})"),
    });
    JsonReport {
        tool: format!("hipfile-bench {}", env!("CARGO_PKG_VERSION")),
        command_line: std::env::args().collect(),
        device: device_info(&b.env),
        config: ConfigInfo {
            executor_cpus: c.executor_cpus.clone(),
            staging_chunk_bytes: c.staging_chunk_bytes,
            staging_per_executor_bytes: c.staging_per_executor_bytes,
            pinned_fallback_cap_bytes: c.pinned_fallback_cap_bytes,
            pinned_cap_bytes: c.pinned_cap_bytes(),
            request_parallelism: c.request_parallelism,
            chunks_in_flight: c.chunks_in_flight,
            copy_spin_us: c.copy_spin_us,
            park_spin_us: c.park_spin_us(),
            caller_thread: format!("{:?}", c.caller_thread),
            prefetch_cap_bytes: c.prefetch_cap_bytes(),
            direct_policy: format!("{:?}", c.direct),
            direct_effective: b.env.direct.effective,
            stream_flags: b.flags,
            reps: args.reps,
            verify: b.verify,
            cold,
        },
        file: file_info(&b.env, &b.file.path, b.file.size),
        cufile,
        results,
        latency,
        stats: stats(b),
    }
}

fn write_outputs(
    b: &Bench,
    args: &RunArgs,
    cufile: String,
    rows: Vec<Row>,
    latency: Option<LatencyReport>,
) -> Result<()> {
    if let Some(path) = &args.plot {
        let title = format!(
            "hipfile-bench on {} ({}, {} MiB file)",
            b.env.backend,
            b.env.direct.label(),
            b.file.size / MIB
        );
        match svg::render(&rows, &title) {
            Some(text) => {
                std::fs::write(path, text).map_err(|e| {
                    crate::error::Failure(format!("writing {}: {e}", path.display()))
                })?;
                println!("chart: {}", path.display());
            }
            None => println!("chart: not written (no result holds a speed)"),
        }
    }
    if let Some(path) = &args.json {
        report::write_json(path, &json_report(b, args, cufile, rows, latency))?;
        println!("json: {}", path.display());
    }
    Ok(())
}

fn describe_runs(args: &RunArgs, b: &Bench) {
    let streams = if args.streams.is_empty() { default_streams() } else { args.streams.clone() };
    let modes: Vec<&str> = args.mode.iter().map(|m| m.io_type()).collect();
    let sizes: Vec<String> = args.io_sizes().iter().map(|&s| format_size(s)).collect();
    println!(
        "runs: {} x io size {} x streams {:?}; stream flags {}; {} rep(s), median by throughput; verify {}",
        modes.join(","),
        sizes.join(","),
        streams,
        b.flags,
        args.reps,
        if b.verify { "every byte" } else { "off (--no-verify)" }
    );
    if let Some(cold) = &b.cold {
        match &cold.system_drop {
            Ok(()) => println!(
                "cold: posix_fadvise(DONTNEED) + /proc/sys/vm/drop_caches (permitted) before each read run"
            ),
            Err(e) => println!(
                "cold: posix_fadvise(DONTNEED) before each read run; drop_caches not permitted ({e})"
            ),
        }
    }
}

/// The benchmark (or, with `--latency`, the latency mode). `Ok(false)` when a
/// hipfile-rs result was wrong or failed.
pub fn main(args: &RunArgs) -> Result<bool> {
    if args.is_sweep() {
        return sweep::main(args);
    }
    if args.is_shards() {
        check_args(args)?;
        return shards::main(args);
    }
    let started = std::time::Instant::now();
    check_args(args)?;
    let (path, keep) = file_path(args);
    let env = open_env(args.device, args.threads, args.direct, &file_dir(&path))?;
    let size = file_size(args, &env);
    check_memory(&env, size)?;
    describe_env(&env, &path, size, args);
    let verify = !args.no_verify;
    let mut bench =
        Bench::new(env, path, keep, size, args.flags, verify, args.cold && !args.latency)?;
    bench.profile = args.profile;
    if args.profile {
        crate::profile::record_timed_windows();
    }
    let (cf, cufile_line) = open_cufile(&bench, args);
    println!("{cufile_line}");
    if args.latency {
        return run_latency(&mut bench, cf, args, cufile_line);
    }
    if args.is_batch() {
        return run_batch(&mut bench, cf, args, cufile_line);
    }
    describe_runs(args, &bench);
    let cases = cases(args, cf.is_some());
    println!();
    print!("{}", report::header());
    let bar = progress(cases.len() as u64 * u64::from(args.reps), args);
    let rows: Vec<Row> =
        cases.iter().map(|case| run_case(&mut bench, cf.as_ref(), case, args.reps, &bar)).collect();
    bar.finish_and_clear();
    drop(cf);
    let notes = report::notes(&rows);
    if !notes.is_empty() {
        print!("\n{notes}");
    }
    println!();
    print!("{}", legend(&rows));
    println!();
    print!("{}", report::summary(&rows));
    if let Some(s) = stats(&bench) {
        print_stats(&s);
    }
    let ok = report::ours_ok(&rows);
    write_outputs(&bench, args, cufile_line, rows, None)?;
    println!("total: {:.1} s", started.elapsed().as_secs_f64());
    Ok(ok)
}

/// What each XferType in the table measures.
fn legend(rows: &[Row]) -> String {
    Xfer::ALL
        .iter()
        .filter(|x| rows.iter().any(|r| r.xfer == x.name()))
        .map(|x| format!("  {:<13} {}\n", x.name(), x.describe()))
        .collect()
}

fn run_batch(
    b: &mut Bench,
    cf: Option<CuFile>,
    args: &RunArgs,
    cufile_line: String,
) -> Result<bool> {
    if args.mode.len() > 1 {
        return fail("--mode batch is given alone".to_string());
    }
    let entries: Vec<usize> = args.batch_entries.iter().map(|&n| n as usize).collect();
    let sizes: Vec<usize> = args.io_sizes().iter().map(|&s| s as usize).collect();
    println!(
        "batch: random reads of a hot file, {} ops per case; entries {entries:?}; ASYNC on 8 streams with the same ops in flight; SYNC and CUFILE_SYNC on 8 threads",
        args.iterations
    );
    let rows = batch_mode::run(b, cf.as_ref(), &entries, &sizes, args.iterations as usize);
    drop(cf);
    println!();
    print!("{}", batch_mode::table(&rows));
    // Per-API latency histograms and paths of the whole run (the library's statistics):
    // where the time of each path went, and which requests ran on the caller's thread.
    println!();
    print!("{}", crate::stats_view::view(&hipfile_runtime::stats::snapshot(), None));
    if let Some(s) = stats(b) {
        print_stats(&s);
    }
    if let Some(path) = &args.json {
        let report = BatchJson { cufile: cufile_line, rows: &rows };
        report::write_json(path, &report)?;
        println!("json: {}", path.display());
    }
    Ok(batch_mode::ours_ok(&rows))
}

/// The batch mode's JSON.
#[derive(serde::Serialize)]
struct BatchJson<'a> {
    cufile: String,
    rows: &'a [batch_mode::BatchRow],
}

fn run_latency(
    b: &mut Bench,
    cf: Option<CuFile>,
    args: &RunArgs,
    cufile_line: String,
) -> Result<bool> {
    let report = latency::run(b, cf.as_ref(), args.iterations as usize, args.stats_ab);
    drop(cf);
    println!();
    print!("{}", latency::table(&report));
    if let Some(s) = stats(b) {
        print_stats(&s);
    }
    let ok = report.rows.iter().take(2).all(|r| r.total_us.is_some())
        && report.busy_stream.as_ref().is_some_and(|busy| busy.detail.is_none());
    write_outputs(b, args, cufile_line, Vec::new(), Some(report))?;
    Ok(ok)
}
