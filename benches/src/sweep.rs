//! `--mode sweep`: the stream-count sweep. Cases = streams × registration flag sets ×
//! op sizes × (read, write); the cases run in child processes (this binary again, with
//! `--sweep-case`), up to `--cases-per-process` one after another in each, each case
//! under `--case-timeout`. A child whose case does not finish in time is asked for the
//! driver's pending report (SIGUSR1), then killed, and the case is a HANG; the cases
//! after it run in a new child, as do those after a case that is not PASS.

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use clap::ValueEnum;
use serde::Serialize;

use crate::bench::{TestFile, open_env, write_pattern};
use crate::cli::{Mode, RunArgs, format_size};
use crate::error::{Context, Result, fail};
use crate::runner::{self, DeviceInfo, FileInfo};
use crate::sweep_case::{self, CaseResult, CaseSpec, FILE_SEED, REPORT_END, RESULT_PREFIX};
use crate::{report, sys};

/// Stream counts swept when `--streams` is not given (24–32 hung on the H200 once).
const DEFAULT_STREAMS: [u32; 14] = [1, 2, 4, 8, 16, 24, 28, 32, 33, 40, 48, 64, 128, 256];
/// Bytes per page: the smallest op, and the unit op sizes are cut down in.
const PAGE: u64 = 4096;
const GIB: f64 = (1u64 << 30) as f64;
/// Scratch for writing the file's pattern.
const SCRATCH_BYTES: u64 = 64 << 20;
/// How often the parent looks at a running child.
const POLL: Duration = Duration::from_millis(20);
/// How long a timed-out child has to print its pending report after SIGUSR1.
const REPORT_GRACE: Duration = Duration::from_secs(5);
/// How long a killed child has to be reaped before the parent moves on without it.
const REAP_LIMIT: Duration = Duration::from_secs(10);
/// stderr lines shown under a FAIL, and under a HANG (the pending report).
const FAIL_TAIL_LINES: usize = 20;
const HANG_TAIL_LINES: usize = 100;

/// A case to run: what was asked, and what runs (fitted to the file).
#[derive(Clone, Copy, Debug)]
struct SweepCase {
    spec: CaseSpec,
    asked_io_size: u64,
    asked_ops_per_stream: usize,
    /// Bytes a case may cover (the file's size).
    cap_bytes: u64,
}

impl SweepCase {
    /// What was cut to fit the file, if anything.
    fn note(&self) -> Option<String> {
        let spec = &self.spec;
        let asked = (self.asked_io_size, self.asked_ops_per_stream);
        (asked != (spec.io_size, spec.ops_per_stream)).then(|| {
            format!(
                "fitted: asked io={} x{}/stream = {}, the file is {}",
                format_size(self.asked_io_size),
                self.asked_ops_per_stream,
                format_size(self.asked_io_size * (self.asked_ops_per_stream * spec.streams) as u64),
                format_size(self.cap_bytes)
            )
        })
    }
}

/// Case outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
enum Status {
    /// Completed, every byte and byte count right.
    Pass,
    /// No result within `--case-timeout`.
    Hang,
    /// The child failed, crashed or exited without a result.
    Fail,
    /// Completed with wrong bytes or byte counts.
    Wrong,
}

impl Status {
    const ALL: [Status; 4] = [Status::Pass, Status::Hang, Status::Fail, Status::Wrong];

    fn name(self) -> &'static str {
        match self {
            Status::Pass => "PASS",
            Status::Hang => "HANG",
            Status::Fail => "FAIL",
            Status::Wrong => "WRONG",
        }
    }
}

/// One case's result (a line of output, an entry of the JSON report).
#[derive(Clone, Debug, Serialize)]
struct SweepRow {
    direction: &'static str,
    streams: usize,
    flags: &'static str,
    io_size: u64,
    ops_per_stream: usize,
    ops: usize,
    bytes: u64,
    /// What was cut to fit the file.
    fitted: Option<String>,
    status: Status,
    /// First submit to last stream synchronized.
    seconds: Option<f64>,
    gib_per_s: Option<f64>,
    /// The case's time in its child process: for the case a child ended in, from its
    /// start (the previous case's result, or the child's start) to the exit or kill; for
    /// the others, their own seconds.
    case_seconds: f64,
    detail: Option<String>,
    /// The end of the child's stderr for a case that is not PASS: the pending report of
    /// a HANG, the messages of a FAIL.
    stderr_tail: Vec<String>,
}

impl SweepRow {
    fn new(case: &SweepCase, status: Status, case_seconds: f64) -> SweepRow {
        let spec = &case.spec;
        SweepRow {
            direction: spec.direction_name(),
            streams: spec.streams,
            flags: spec.flags.name(),
            io_size: spec.io_size,
            ops_per_stream: spec.ops_per_stream,
            ops: spec.ops(),
            bytes: spec.bytes(),
            fitted: case.note(),
            status,
            seconds: None,
            gib_per_s: None,
            case_seconds,
            detail: None,
            stderr_tail: Vec::new(),
        }
    }

    /// `sweep read  streams=24 flags=mixed io=4M ops=96 PASS 0.210 s 1.90 GiB/s`, then
    /// the child's stderr (indented) for a case that is not PASS.
    fn text(&self) -> String {
        let mut out = format!(
            "sweep {:<5} streams={} flags={} io={} ops={} {}",
            self.direction,
            self.streams,
            self.flags,
            format_size(self.io_size),
            self.ops,
            self.status.name()
        );
        if let (Some(seconds), Some(rate)) = (self.seconds, self.gib_per_s) {
            out.push_str(&format!(" {seconds:.3} s {} GiB/s", three_digits(rate)));
        }
        if let Some(detail) = &self.detail {
            out.push_str(&format!(": {detail}"));
        }
        if let Some(note) = &self.fitted {
            out.push_str(&format!(" ({note})"));
        }
        out.push('\n');
        for line in &self.stderr_tail {
            out.push_str(&format!("    | {line}\n"));
        }
        out
    }
}

/// `rate` with three significant digits (at least two decimals): 1.91, 0.0123.
fn three_digits(rate: f64) -> String {
    let magnitude = if rate > 0.0 { rate.log10().floor() as i32 } else { 0 };
    let decimals = (2 - magnitude).clamp(2, 9) as usize;
    format!("{rate:.decimals$}")
}

/// Fits `ops_per_stream` ops of `io_size` on each of `streams` streams into `cap`
/// bytes: fewer ops per stream (at least 1) first, then a smaller op (a power of two of
/// at least 4K). `cap` is at least `streams` × 4K.
fn fit(streams: usize, ops_per_stream: usize, io_size: u64, cap: u64) -> (usize, u64) {
    let per_stream = cap / streams as u64;
    if ops_per_stream as u64 * io_size <= per_stream {
        return (ops_per_stream, io_size);
    }
    if io_size <= per_stream {
        return ((per_stream / io_size) as usize, io_size);
    }
    (1, 1u64 << per_stream.max(PAGE).ilog2())
}

/// Every case in output order: streams, flag sets, sizes, then read and write.
fn plan_cases(args: &RunArgs, streams: &[u32], sizes: &[u64], cap: u64) -> Vec<SweepCase> {
    let mut cases = Vec::new();
    for &n in streams {
        for &flags in &args.sweep_flags {
            for &size in sizes {
                for read in [true, false] {
                    let asked_ops = args.ops_per_stream as usize;
                    let (ops, io_size) = fit(n as usize, asked_ops, size, cap);
                    let spec =
                        CaseSpec { read, streams: n as usize, flags, io_size, ops_per_stream: ops };
                    cases.push(SweepCase {
                        spec,
                        asked_io_size: size,
                        asked_ops_per_stream: asked_ops,
                        cap_bytes: cap,
                    });
                }
            }
        }
    }
    cases
}

/// The file: as large as the largest case, at most `--file-size` (default 256M on the
/// cpu device, 2G on a GPU), at least 4K per stream of the most streams.
fn file_size(args: &RunArgs, env: &crate::bench::Env, streams: &[u32], sizes: &[u64]) -> u64 {
    let per_stream = |size: u64| u64::from(args.ops_per_stream) * size;
    let largest = streams
        .iter()
        .flat_map(|&n| sizes.iter().map(move |&size| u64::from(n) * per_stream(size)))
        .max()
        .unwrap_or(PAGE);
    let floor = u64::from(streams.iter().copied().max().unwrap_or(1)) * PAGE;
    largest.min(runner::file_size(args, env)).max(floor)
}

/// A pipe's bytes, collected by a thread while the child runs.
struct Captured {
    bytes: Arc<Mutex<Vec<u8>>>,
    thread: Option<JoinHandle<()>>,
}

impl Captured {
    fn start(pipe: Option<impl Read + Send + 'static>) -> Captured {
        let bytes = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&bytes);
        let thread = pipe.map(|mut pipe| {
            std::thread::spawn(move || {
                let mut buf = [0u8; 8192];
                loop {
                    match pipe.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => lock(&sink).extend_from_slice(&buf[..n]),
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(_) => break,
                    }
                }
            })
        });
        Captured { bytes, thread }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&lock(&self.bytes)).into_owned()
    }

    fn contains(&self, needle: &str) -> bool {
        self.text().contains(needle)
    }

    /// Waits until the writer has closed the pipe (call once the child is reaped).
    fn finish(&mut self) {
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn lock(bytes: &Mutex<Vec<u8>>) -> std::sync::MutexGuard<'_, Vec<u8>> {
    bytes.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The last `count` lines of `text`.
fn tail(text: &str, count: usize) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(count)..].iter().map(|l| l.to_string()).collect()
}

/// How a child ended.
enum Ending {
    /// It exited (or was killed by something else) within the time limit.
    Exited(ExitStatus),
    /// The time limit passed: SIGUSR1, then SIGKILL.
    TimedOut {
        /// Whether its pending report arrived within [`REPORT_GRACE`].
        reported: bool,
        /// Whether it was reaped within [`REAP_LIMIT`] of SIGKILL.
        reaped: bool,
    },
}

/// Polls `child` until it exits or one of its cases runs past `timeout` (`done` counts
/// the cases it finished: each one restarts the clock); then asks it for its pending
/// report (SIGUSR1), gives it [`REPORT_GRACE`] to print it, and kills it (SIGKILL). Also
/// returns when the case it was running started.
fn supervise(
    child: &mut Child,
    timeout: Duration,
    stderr: &Captured,
    done: impl Fn() -> usize,
) -> (Ending, Instant) {
    let mut case_started = Instant::now();
    let mut finished = 0;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return (Ending::Exited(status), case_started);
        }
        let now = Instant::now();
        let count = done();
        if count > finished {
            (finished, case_started) = (count, now);
        }
        if now >= case_started + timeout {
            break;
        }
        std::thread::sleep(POLL);
    }
    let _ = sys::send_sigusr1(child);
    let grace_end = Instant::now() + REPORT_GRACE;
    while Instant::now() < grace_end
        && !stderr.contains(REPORT_END)
        && matches!(child.try_wait(), Ok(None))
    {
        std::thread::sleep(POLL);
    }
    let reported = stderr.contains(REPORT_END);
    // Our own child, by its handle: a no-op once it has been reaped.
    let _ = child.kill();
    let reap_end = Instant::now() + REAP_LIMIT;
    let reaped = loop {
        if let Ok(Some(_)) = child.try_wait() {
            break true;
        }
        if Instant::now() >= reap_end {
            break false;
        }
        std::thread::sleep(POLL);
    };
    (Ending::TimedOut { reported, reaped }, case_started)
}

/// Starts children: this program with the options a case needs.
struct Launcher {
    program: std::path::PathBuf,
    common: Vec<std::ffi::OsString>,
    timeout: Duration,
}

impl Launcher {
    fn new(args: &RunArgs, file: &TestFile) -> Result<Launcher> {
        let program = std::env::current_exe().ctx("locating this program")?;
        let mut common: Vec<std::ffi::OsString> = vec![
            "--mode".into(),
            "sweep".into(),
            "--file-size".into(),
            file.size.to_string().into(),
            "--file".into(),
            file.path.clone().into(),
        ];
        let mut add = |option: &str, value: Option<String>| {
            if let Some(value) = value {
                common.extend([option.into(), value.into()]);
            }
        };
        let name = |value: Option<clap::builder::PossibleValue>| value.map(|v| v.get_name().into());
        add("--device", name(args.device.and_then(|d| d.to_possible_value())));
        add("--direct", name(args.direct.and_then(|d| d.to_possible_value())));
        add("--threads", args.threads.map(|t| t.to_string()));
        if let Some(streams) = args.sweep_selftest_hang {
            common.push(format!("--sweep-selftest-hang={streams}").into());
        }
        if args.spread_devices {
            common.push("--spread-devices".into());
        }
        Ok(Launcher { program, common, timeout: Duration::from_secs(args.case_timeout) })
    }

    /// Runs `cases` (at least one) one after another in one child process, each under
    /// the time limit. Returns the rows of the cases it reached, in order: each case
    /// with a result, and where the child stopped early, the case it stopped in (HANG
    /// past the limit, FAIL when it ended without that case's result); the caller runs
    /// the rest in a new child. A child stops after a case that is not PASS.
    fn run(&self, cases: &[SweepCase]) -> Vec<SweepRow> {
        let specs: Vec<String> = cases.iter().map(|c| c.spec.to_arg()).collect();
        let spawned = Command::new(&self.program)
            .args(&self.common)
            .args(["--sweep-case", &specs.join(&sweep_case::CASE_SEPARATOR.to_string())])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        let mut child = match spawned {
            Ok(child) => child,
            Err(e) => {
                let mut row = SweepRow::new(&cases[0], Status::Fail, 0.0);
                row.detail = Some(format!("starting {}: {e}", self.program.display()));
                return vec![row];
            }
        };
        let mut stdout = Captured::start(child.stdout.take());
        let mut stderr = Captured::start(child.stderr.take());
        let done = || results_of(&stdout.text()).len();
        let (ending, case_started) = supervise(&mut child, self.timeout, &stderr, done);
        let seconds = case_started.elapsed().as_secs_f64();
        if !matches!(ending, Ending::TimedOut { reaped: false, .. }) {
            stdout.finish();
            stderr.finish();
        }
        let results = results_of(&stdout.text());
        let count = results.len().min(cases.len());
        // The case the child's end belongs to: its last result's when that one failed or
        // every case has one, else the first case without a result.
        let last_failed = count > 0 && results[count - 1].status != "PASS";
        let (at, result) = if last_failed || count == cases.len() {
            (count - 1, Some(&results[count - 1]))
        } else {
            (count, None)
        };
        let mut rows: Vec<SweepRow> =
            cases[..at].iter().zip(&results).map(|(case, r)| result_row(case, r)).collect();
        let case = &cases[at];
        rows.push(match ending {
            Ending::Exited(status) => exited_row(case, status, result, &stderr.text(), seconds),
            Ending::TimedOut { reported, reaped } => {
                let mut row = SweepRow::new(case, Status::Hang, seconds);
                let mut detail = match result {
                    Some(r) => format!(
                        "result {} printed, then no exit within {} s",
                        r.status,
                        self.timeout.as_secs()
                    ),
                    None => format!("no result after {} s", self.timeout.as_secs()),
                };
                if !reported {
                    detail.push_str(&format!(
                        "; no pending report within {} s of SIGUSR1",
                        REPORT_GRACE.as_secs()
                    ));
                }
                if !reaped {
                    detail.push_str(&format!("; pid {} did not exit after SIGKILL", child.id()));
                }
                row.detail = Some(detail);
                row.stderr_tail = tail(&stderr.text(), HANG_TAIL_LINES);
                row
            }
        });
        rows
    }
}

/// The child's result lines, in order.
fn results_of(stdout: &str) -> Vec<CaseResult> {
    stdout
        .lines()
        .filter_map(|line| line.strip_prefix(RESULT_PREFIX))
        .filter_map(|json| serde_json::from_str(json).ok())
        .collect()
}

/// The row of a case whose result the child printed before going on to the next.
fn result_row(case: &SweepCase, result: &CaseResult) -> SweepRow {
    let mut row = SweepRow::new(case, Status::Fail, result.seconds.unwrap_or(0.0));
    match result.status.as_str() {
        "PASS" => {
            row.status = Status::Pass;
            row.seconds = result.seconds;
            row.gib_per_s = result.seconds.map(|s| case.spec.bytes() as f64 / GIB / s.max(1e-9));
        }
        status => {
            row.status = if status == "WRONG" { Status::Wrong } else { Status::Fail };
            row.detail.clone_from(&result.detail);
        }
    }
    row
}

/// The row of the case a child ended in: its result line (`None`: it printed none),
/// else how it ended.
fn exited_row(
    case: &SweepCase,
    status: ExitStatus,
    result: Option<&CaseResult>,
    stderr: &str,
    case_seconds: f64,
) -> SweepRow {
    use std::os::unix::process::ExitStatusExt;
    let ended = match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => format!("{status}"),
    };
    let mut row = match result {
        Some(r) if r.status == "PASS" && status.success() => return result_row(case, r),
        Some(r) if r.status == "PASS" => {
            let mut row = SweepRow::new(case, Status::Fail, case_seconds);
            row.detail = Some(format!("result PASS, then {ended}"));
            row
        }
        Some(r) => result_row(case, r),
        None => {
            let mut row = SweepRow::new(case, Status::Fail, case_seconds);
            row.detail = Some(format!("{ended}, no result"));
            row
        }
    };
    row.case_seconds = case_seconds;
    row.stderr_tail = tail(stderr, FAIL_TAIL_LINES);
    row
}

/// Checks the options that do not fit the sweep, then the common ones.
fn check_args(args: &RunArgs) -> Result<()> {
    if args.mode.iter().any(|&m| m != Mode::Sweep) {
        return fail("--mode sweep runs its own reads and writes: give it alone");
    }
    let unfit = [
        (args.latency, "--latency"),
        (args.cold, "--cold"),
        (args.plot.is_some(), "--plot"),
        (args.no_verify, "--no-verify (a sweep case always checks every byte)"),
    ];
    if let Some((_, name)) = unfit.iter().find(|(given, _)| *given) {
        return fail(format!("{name} does not apply to --mode sweep"));
    }
    runner::check_args(args)
}

/// After a write case that did not pass: the file range it covered gets the pattern
/// back (it may hold the poison or partial writes).
fn restore(file: &TestFile, case: &SweepCase, scratch: &mut [u8]) -> Result<()> {
    write_pattern(&file.plain, 0, case.spec.bytes(), FILE_SEED, scratch)
        .ctx("restoring the test file after a write case")?;
    sys::fdatasync(&file.plain).ctx("fdatasync of the test file")
}

/// The JSON report of a sweep.
#[derive(Serialize)]
struct SweepReport {
    tool: String,
    command_line: Vec<String>,
    device: DeviceInfo,
    file: FileInfo,
    ops_per_stream: u32,
    case_timeout_s: u64,
    cases: usize,
    pass: usize,
    hang: usize,
    fail: usize,
    wrong: usize,
    sweep: Vec<SweepRow>,
}

fn count(rows: &[SweepRow], status: Status) -> usize {
    rows.iter().filter(|r| r.status == status).count()
}

/// `sweep: 336 cases, 336 PASS, 0 HANG, 0 FAIL, 0 WRONG`, and the cases not PASS.
fn summary(rows: &[SweepRow]) -> String {
    let counts: Vec<String> =
        Status::ALL.iter().map(|&s| format!("{} {}", count(rows, s), s.name())).collect();
    let mut out = format!("sweep: {} cases, {}\n", rows.len(), counts.join(", "));
    for row in rows.iter().filter(|r| r.status != Status::Pass) {
        out.push_str(&format!(
            "  not PASS: {} streams={} flags={} io={} {}\n",
            row.direction,
            row.streams,
            row.flags,
            format_size(row.io_size),
            row.status.name()
        ));
    }
    out
}

fn describe(args: &RunArgs, streams: &[u32], sizes: &[u64], cases: usize, cap: u64) {
    let flags: Vec<&str> = args.sweep_flags.iter().map(|f| f.name()).collect();
    let sizes: Vec<String> = sizes.iter().map(|&s| format_size(s)).collect();
    println!(
        "sweep: {cases} cases = streams {streams:?} x flags {} x io {} x read,write; {} op(s) per stream into one device buffer, all submitted before any stream is synchronized; every byte and byte count checked",
        flags.join(","),
        sizes.join(","),
        args.ops_per_stream
    );
    println!(
        "sweep: cases in child processes, up to {} one after another in each (a new one after a case that is not PASS), HANG after {} s per case (SIGUSR1 for the pending report, then SIGKILL); a case over {} (the file) runs fewer ops per stream, then smaller ops",
        args.cases_per_process,
        args.case_timeout,
        format_size(cap)
    );
}

/// `--mode sweep` (or, with `--sweep-case`, one case in this process). `Ok(false)` when
/// a case is not PASS.
///
/// # Errors
/// Bad options, no device or driver, the test file cannot be made.
pub fn main(args: &RunArgs) -> Result<bool> {
    if let Some(text) = &args.sweep_case {
        return sweep_case::run(args, text);
    }
    let started = Instant::now();
    check_args(args)?;
    let (path, keep) = runner::file_path(args);
    let env = open_env(args.device, args.threads, args.direct, &runner::file_dir(&path))?;
    let streams =
        if args.streams.is_empty() { DEFAULT_STREAMS.to_vec() } else { args.streams.clone() };
    let sizes = args.io_sizes();
    let size = file_size(args, &env, &streams, &sizes);
    runner::check_memory(&env, size)?;
    runner::describe_env(&env, &path, size, args);
    let (device, file_info) = (runner::device_info(&env), runner::file_info(&env, &path, size));
    // The children open their own; this process only makes the file and waits.
    drop(env);
    let mut scratch = vec![0u8; SCRATCH_BYTES.min(size) as usize];
    let file = TestFile::create(&path, size, false, keep, &mut scratch, FILE_SEED)?;
    let cases = plan_cases(args, &streams, &sizes, size);
    describe(args, &streams, &sizes, cases.len(), size);
    let launcher = Launcher::new(args, &file)?;
    let per_process = args.cases_per_process as usize;
    let mut rows = Vec::with_capacity(cases.len());
    while rows.len() < cases.len() {
        let next = rows.len();
        let batch = &cases[next..(next + per_process).min(cases.len())];
        for (case, row) in batch.iter().zip(launcher.run(batch)) {
            print!("{}", row.text());
            if !case.spec.read && row.status != Status::Pass {
                restore(&file, case, &mut scratch)?;
            }
            rows.push(row);
        }
    }
    print!("{}", summary(&rows));
    let ok = count(&rows, Status::Pass) == rows.len();
    if let Some(json) = &args.json {
        let report = SweepReport {
            tool: format!("hipfile-bench {}", env!("CARGO_PKG_VERSION")),
            command_line: std::env::args().collect(),
            device,
            file: file_info,
            ops_per_stream: args.ops_per_stream,
            case_timeout_s: args.case_timeout,
            cases: rows.len(),
            pass: count(&rows, Status::Pass),
            hang: count(&rows, Status::Hang),
            fail: count(&rows, Status::Fail),
            wrong: count(&rows, Status::Wrong),
            sweep: rows,
        };
        report::write_json(json, &report)?;
        println!("json: {}", json.display());
    }
    println!("total: {:.1} s", started.elapsed().as_secs_f64());
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case() -> SweepCase {
        let spec = CaseSpec {
            read: true,
            streams: 2,
            flags: crate::cli::SweepFlags::Mixed,
            io_size: 1 << 20,
            ops_per_stream: 4,
        };
        SweepCase { spec, asked_io_size: 16 << 20, asked_ops_per_stream: 4, cap_bytes: 8 << 20 }
    }

    #[test]
    fn exits_are_classified() {
        use std::os::unix::process::ExitStatusExt;
        let (ok, failed, killed) =
            (ExitStatus::from_raw(0), ExitStatus::from_raw(1 << 8), ExitStatus::from_raw(9));
        let line = |status: &str, seconds: &str| {
            format!(
                "noise\n{RESULT_PREFIX}{{\"status\":\"{status}\",\"seconds\":{seconds},\"detail\":\"d\"}}\n"
            )
        };
        let result = |status: &str, seconds: &str| results_of(&line(status, seconds)).pop();
        let pass = exited_row(&case(), ok, result("PASS", "0.5").as_ref(), "", 1.0);
        assert_eq!((pass.status, pass.seconds), (Status::Pass, Some(0.5)));
        assert!((pass.gib_per_s.unwrap() - 8.0 / 1024.0 / 0.5).abs() < 1e-12);
        assert!(
            pass.text().contains("io=1M ops=8 PASS 0.500 s 0.0156 GiB/s (fitted: asked io=16M")
        );
        let wrong = exited_row(&case(), failed, result("WRONG", "null").as_ref(), "err\n", 1.0);
        assert_eq!((wrong.status, wrong.detail.as_deref()), (Status::Wrong, Some("d")));
        assert_eq!(wrong.stderr_tail, ["err"]);
        let crash = exited_row(&case(), killed, None, "a\nb\n", 1.0);
        assert_eq!(crash.status, Status::Fail);
        assert_eq!(crash.detail.as_deref(), Some("killed by signal 9, no result"));
        assert_eq!(crash.stderr_tail, ["a", "b"]);
        let late = exited_row(&case(), failed, result("PASS", "0.5").as_ref(), "", 1.0);
        assert_eq!(late.detail.as_deref(), Some("result PASS, then exit status 1"));
        assert!(summary(&[pass, wrong, crash]).starts_with(
            "sweep: 3 cases, 1 PASS, 0 HANG, 1 FAIL, 1 WRONG\n  not PASS: read streams=2"
        ));
    }

    #[test]
    fn results_are_read_in_order_past_noise() {
        let out = format!(
            "{RESULT_PREFIX}{{\"status\":\"PASS\",\"seconds\":0.25,\"detail\":null}}\nnoise\n\
             {RESULT_PREFIX}not json\n{RESULT_PREFIX}{{\"status\":\"FAIL\",\"seconds\":null,\"detail\":\"x\"}}\n"
        );
        let results = results_of(&out);
        let statuses: Vec<&str> = results.iter().map(|r| r.status.as_str()).collect();
        assert_eq!(statuses, ["PASS", "FAIL"]);
        let rows: Vec<SweepRow> = results.iter().map(|r| result_row(&case(), r)).collect();
        assert_eq!((rows[0].status, rows[0].seconds), (Status::Pass, Some(0.25)));
        assert_eq!((rows[1].status, rows[1].detail.as_deref()), (Status::Fail, Some("x")));
    }

    #[test]
    fn rates_keep_three_digits() {
        assert_eq!(three_digits(1.914), "1.91");
        assert_eq!(three_digits(12.34), "12.34");
        assert_eq!(three_digits(0.012345), "0.0123");
        assert_eq!(three_digits(0.0), "0.00");
    }

    #[test]
    fn cases_fit_the_file_ops_first_then_size() {
        const M: u64 = 1 << 20;
        assert_eq!(fit(4, 4, 16 * M, 256 * M), (4, 16 * M));
        assert_eq!(fit(8, 4, 16 * M, 256 * M), (2, 16 * M));
        assert_eq!(fit(16, 4, 16 * M, 256 * M), (1, 16 * M));
        assert_eq!(fit(33, 4, 16 * M, 256 * M), (1, 4 * M));
        assert_eq!(fit(256, 4, 16 * M, 256 * M), (1, M));
        assert_eq!(fit(256, 4, 16 * M, 2048 * M), (1, 8 * M));
        assert_eq!(fit(256, 4, 4096, 1024 * 4096), (4, 4096));
        assert_eq!(fit(256, 4, 4096, 256 * 4096), (1, 4096));
        for (streams, ops, size, cap) in [(33usize, 4usize, 16 * M, 256 * M), (7, 3, 12288, M)] {
            let (ops_fit, size_fit) = fit(streams, ops, size, cap);
            assert!(streams as u64 * ops_fit as u64 * size_fit <= cap);
            assert!(ops_fit >= 1 && size_fit.is_multiple_of(PAGE));
        }
    }
}
