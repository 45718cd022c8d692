//! `hipfile-bench`'s modes through the built binary, on the cpu device:
//! - `--mode sweep`: a small sweep passes (and lands in the JSON report), and a case that
//!   hangs on purpose (`--sweep-selftest-hang`) is reported as HANG, with the driver's
//!   pending report, within its time limit;
//! - `--mode sweep --spread-devices`: the streams of each case spread over four devices
//!   (`HIPFILE_CPU_DEVICES=4`), every byte verified;
//! - `--mode shards`: four devices (`HIPFILE_CPU_DEVICES=4`) each load their own shard at
//!   once, every byte verified, with the report's rows and ratios;
//! - `--profile`: every row says where its CPU and the engine's time went;
//! - `HIPFILE_BENCH_FAULT_REPORT=1`: a fatal signal names its thread and lists its return
//!   addresses, and still ends the process with that signal;
//! - `HIPFILE_BENCH_CPU_SAMPLES=PATH`: the CPU samples of a run, with the executors' among
//!   them, their threads' names and the mappings that resolve them.

use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Longest a whole test run of the binary may take before the test kills it and fails.
const RUN_LIMIT: Duration = Duration::from_secs(300);

/// Runs `hipfile-bench` on the cpu device with `args`; kills it and panics after
/// [`RUN_LIMIT`] (the test itself must never hang). Returns its output and wall time.
fn bench(args: &[&str]) -> (Output, Duration) {
    bench_with(args, &[])
}

/// [`bench`] with extra environment variables.
fn bench_with(args: &[&str], vars: &[(&str, &str)]) -> (Output, Duration) {
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_hipfile-bench"))
        .args(["--device", "cpu"])
        .args(args)
        .env("HIPFILE_DEVICE", "cpu")
        .envs(vars.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting hipfile-bench");
    let mut pipes = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let stderr_reader = std::thread::spawn(move || {
        let mut text = Vec::new();
        let _ = pipes.1.read_to_end(&mut text);
        text
    });
    let stdout_reader = std::thread::spawn(move || {
        let mut text = Vec::new();
        let _ = pipes.0.read_to_end(&mut text);
        text
    });
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for hipfile-bench") {
            break status;
        }
        if started.elapsed() > RUN_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("hipfile-bench {args:?} ran over {RUN_LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stdout = stdout_reader.join().unwrap();
    let stderr = stderr_reader.join().unwrap();
    (Output { status, stdout, stderr }, started.elapsed())
}

/// A JSON report's path in the temp dir, unique to this test process and `tag`.
fn temp_json(tag: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("hipfile-bench-{tag}-{}.json", std::process::id()))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn small_sweep_passes_on_the_cpu_device() {
    let json = temp_json("sweep");
    let json_arg = json.to_str().unwrap();
    let (output, _) = bench(&[
        "--mode",
        "sweep",
        "--streams",
        "1,4,33",
        "--io-size",
        "4K,1M",
        "--ops-per-stream",
        "2",
        "--json",
        json_arg,
    ]);
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert!(output.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("sweep: 36 cases, 36 PASS, 0 HANG, 0 FAIL, 0 WRONG"), "{stdout}");
    for expected in [
        "sweep read  streams=33 flags=mixed io=1M ops=66 PASS",
        "sweep write streams=33 flags=none io=4K ops=66 PASS",
        "sweep write streams=1 flags=fixed io=4K ops=2 PASS",
    ] {
        assert!(stdout.contains(expected), "no `{expected}` in:\n{stdout}");
    }
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    let rows = report["sweep"].as_array().unwrap();
    assert_eq!(rows.len(), 36);
    assert!(rows.iter().all(|row| row["status"] == "PASS"), "{report}");
    assert_eq!(report["pass"], 36);
}

/// A sweep of 4 KiB reads and writes at `streams`, mixed flags, one op per stream, 2 s per
/// case, with `hang` (a `--sweep-selftest-hang` form) making cases hang on purpose.
fn hanging_sweep(streams: &str, hang: &str) -> (Output, Duration) {
    bench(&[
        "--mode",
        "sweep",
        "--streams",
        streams,
        "--io-size",
        "4K",
        "--sweep-flags",
        "mixed",
        "--ops-per-stream",
        "1",
        "--case-timeout",
        "2",
        hang,
    ])
}

#[test]
fn a_hanging_case_is_reported_as_hang_within_its_timeout() {
    let (output, elapsed) = hanging_sweep("2", "--sweep-selftest-hang");
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert!(!output.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("sweep: 2 cases, 0 PASS, 2 HANG, 0 FAIL, 0 WRONG"), "{stdout}");
    assert!(
        stdout.contains("sweep read  streams=2 flags=mixed io=4K ops=2 HANG: no result after 2 s"),
        "{stdout}"
    );
    // The child's pending report, under the HANG line: both streams hold their op.
    assert_eq!(stdout.matches("| hipfile pending report:").count(), 2, "{stdout}");
    assert!(stdout.contains("submitted 1, reached 0"), "{stdout}");
    // Two cases of 2 s each, plus the report's grace and the kill: far below a minute.
    assert!(elapsed < Duration::from_secs(60), "took {elapsed:?}");
}

/// Several cases per child process (the default, 8): the 2-stream cases hang on purpose
/// and are reported HANG, each with its pending report; the cases before them keep the
/// results their process printed, and the cases after each hang run in a new process
/// and pass.
#[test]
fn after_a_hang_the_rest_of_its_process_cases_run_in_a_new_one() {
    let (output, elapsed) = hanging_sweep("1,2,4", "--sweep-selftest-hang=2");
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert!(!output.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("sweep: 6 cases, 4 PASS, 2 HANG, 0 FAIL, 0 WRONG"), "{stdout}");
    let rows: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("sweep read") || l.starts_with("sweep write"))
        .collect();
    let verdicts: Vec<(&str, &str)> = rows
        .iter()
        .map(|row| {
            let streams = row.split_whitespace().find(|w| w.starts_with("streams=")).unwrap();
            let status = row.split_whitespace().nth(6).unwrap().trim_end_matches(':');
            (streams, status)
        })
        .collect();
    assert_eq!(
        verdicts,
        [
            ("streams=1", "PASS"),
            ("streams=1", "PASS"),
            ("streams=2", "HANG"),
            ("streams=2", "HANG"),
            ("streams=4", "PASS"),
            ("streams=4", "PASS"),
        ],
        "{stdout}"
    );
    assert_eq!(stdout.matches("| hipfile pending report:").count(), 2, "{stdout}");
    assert!(elapsed < Duration::from_secs(60), "took {elapsed:?}");
}

#[test]
fn four_devices_load_their_shards_at_once() {
    let (output, _) = bench_with(
        &[
            "--mode",
            "shards",
            "--file-size",
            "8M",
            "--io-size",
            "1M",
            "--streams",
            "2",
            "--reps",
            "1",
            "--cold",
        ],
        &[("HIPFILE_CPU_DEVICES", "4")],
    );
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert!(output.status.success(), "shards failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("(4 device(s))"), "{stdout}");
    for row in ["ONE (device 0 alone)", "ALL (every device at once)", "COPY_ALL"] {
        assert!(stdout.contains(row), "missing row {row}:\n{stdout}");
    }
    for device in 0..4 {
        assert!(stdout.contains(&format!("COPY_ONE (device {device} alone)")), "{stdout}");
    }
    assert!(!stdout.contains("FAILED") && !stdout.contains("WRONG"), "{stdout}");
    for cache in ["hot: ALL", "cold: ALL"] {
        assert!(stdout.contains(cache), "missing summary {cache}:\n{stdout}");
    }
}

#[test]
fn a_sweep_spread_over_four_devices_passes() {
    let (output, _) = bench_with(
        &[
            "--mode",
            "sweep",
            "--spread-devices",
            "--streams",
            "3,8",
            "--io-size",
            "64K",
            "--sweep-flags",
            "mixed",
            "--ops-per-stream",
            "2",
        ],
        &[("HIPFILE_CPU_DEVICES", "4")],
    );
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert!(output.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("sweep: 4 cases, 4 PASS, 0 HANG, 0 FAIL, 0 WRONG"), "{stdout}");
}

/// `--profile`: every row gets its CPU per thread group (over the timed part, as the
/// row's own CPU-s/GiB) and, for our rows, the engine's phases (text and JSON); the
/// JSON's counters include the fallback and blocking ones.
#[test]
fn a_profiled_run_says_where_each_rows_time_went() {
    let json = temp_json("profile");
    let json_arg = json.to_str().unwrap();
    let (output, _) = bench(&[
        "--mode",
        "read,write",
        "--streams",
        "2",
        "--io-size",
        "4M",
        "--file-size",
        "16M",
        "--reps",
        "1",
        "--profile",
        "--json",
        json_arg,
    ]);
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert!(output.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("    cpu-s/GiB by thread: "), "{stdout}");
    assert!(stdout.contains("    engine: executors busy "), "{stdout}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    let rows = report["results"].as_array().unwrap();
    assert!(rows.len() >= 4, "{report}");
    for row in rows {
        let groups = row["profile"]["cpu_s_per_gib"].as_array().unwrap();
        assert!(!groups.is_empty(), "no CPU groups: {row}");
        // The groups cover the timed part only, as the row's column does (the bench's own
        // fills and verification once made up most of them, and the window's own /proc
        // reading up to a millisecond of a 16 MiB row); a thread's CPU time read while it
        // runs lags by up to a scheduler tick, so the two may differ by a little.
        let groups_sum: f64 = groups.iter().map(|g| g[1].as_f64().unwrap()).sum();
        let column = row["cpu_s_per_gib"].as_f64().unwrap();
        assert!(
            groups_sum <= 1.5 * column + 0.1 && groups_sum >= 0.5 * column - 0.1,
            "groups {groups_sum} against the row's {column}: {row}"
        );
        let ours = row["xfer"] == "ASYNC" || row["xfer"] == "SYNC";
        let engine = &row["profile"]["engine"];
        if ours {
            // 4 MiB ops (four chunks: never the caller's thread): the engine moved chunks.
            assert!(engine["chunks"].as_u64().unwrap() > 0, "{row}");
            assert!(engine["busy"].as_f64().unwrap() > 0.0, "{row}");
            let waits = ["read_wait", "write_wait", "copy_wait", "staging_wait"];
            let wait_sum: f64 = waits.iter().map(|w| engine[w].as_f64().unwrap()).sum();
            assert!(wait_sum > 0.0 && wait_sum <= 1.0 + 1e-9, "{row}");
        }
        if ours && row["io_type"] == "READ" {
            assert!(
                groups.iter().any(|g| g[0].as_str().unwrap().starts_with("hipfile-io-")),
                "{row}"
            );
        }
    }
    for counter in ["engine_jobs", "fallback_waits", "blocking_jobs", "arena_chunks"] {
        assert!(report["stats"][counter].is_u64(), "no {counter} in {}", report["stats"]);
    }
}

/// With `HIPFILE_BENCH_FAULT_REPORT=1`, a SIGSEGV (here sent from outside while the bench
/// runs) is reported with its thread and return addresses, and the process still dies of
/// it (not swallowed by the handler).
#[test]
fn a_fatal_signal_is_reported_and_still_ends_the_process() {
    use std::os::unix::process::ExitStatusExt;
    let child = Command::new(env!("CARGO_BIN_EXE_hipfile-bench"))
        .args(["--device", "cpu", "--mode", "read", "--streams", "2", "--no-baselines"])
        .args(["--file-size", "64M", "--reps", "1000"])
        .env("HIPFILE_DEVICE", "cpu")
        .env("HIPFILE_BENCH_FAULT_REPORT", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting hipfile-bench");
    std::thread::sleep(Duration::from_secs(2));
    let pid = libc::pid_t::try_from(child.id()).expect("pid");
    // SAFETY: a plain syscall to our own child, not yet reaped.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSEGV) }, 0, "kill");
    let output = child.wait_with_output().expect("waiting for hipfile-bench");
    let stderr = text(&output.stderr);
    assert_eq!(output.status.signal(), Some(libc::SIGSEGV), "{:?}\n{stderr}", output.status);
    assert!(stderr.contains("fatal signal 11 in thread \""), "{stderr}");
    assert!(stderr.contains("hipfile-bench(+0x"), "its return addresses: {stderr}");
}

/// `HIPFILE_BENCH_CPU_SAMPLES`: a run writes its CPU samples as distinct stacks with
/// counts, the executable mappings (the binary's own among them) and the threads' names;
/// the engine's executors, which read the file, are among the sampled threads.
#[test]
fn cpu_samples_name_the_threads_that_spent_the_time() {
    let path = std::env::temp_dir().join(format!("hf-cpu-samples-{}.txt", std::process::id()));
    let samples = path.to_str().expect("utf-8 temp path");
    let (output, _) = bench_with(
        &["--mode", "read", "--streams", "2", "--no-baselines", "--file-size", "64M"],
        &[("HIPFILE_BENCH_CPU_SAMPLES", samples)],
    );
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains("CPU samples (one per 10 ms"),
        "{}",
        text(&output.stderr)
    );
    let report = std::fs::read_to_string(&path).expect("the samples file");
    let _ = std::fs::remove_file(&path);
    let line_kinds = |kind: &'static str| report.lines().filter(move |line| line.starts_with(kind));
    assert!(line_kinds("map ").any(|line| line.contains("hipfile-bench")), "{report}");
    let executors: Vec<&str> = line_kinds("thread ")
        .filter(|line| line.contains(" hipfile-io-"))
        .map(|line| line.split(' ').nth(1).expect("tid"))
        .collect();
    assert!(!executors.is_empty(), "the executors are named: {report}");
    let mut sampled = 0;
    for line in line_kinds("stack ") {
        let fields: Vec<&str> = line.split(' ').collect();
        let count: usize = fields[1].parse().expect("count");
        assert!(count >= 1 && fields.len() > 4, "count, thread, frames: {line}");
        if executors.contains(&fields[2]) {
            sampled += count;
        }
    }
    assert!(sampled > 0, "the executors spent CPU time reading: {report}");
}

/// `targets`: a report of this run checked against #16's goals. On the cpu device there
/// is no cuFile: every goal against CUFILE_SYNC is "not measured", never met, while the
/// goals against baselines the run has (the pinned copy at 8 streams, fewer streams, raw
/// `pwrite`) get a ratio. A file that is not a report is an error.
#[test]
fn targets_checks_a_report_against_the_goals() {
    let json = temp_json("targets");
    let json_arg = json.to_str().unwrap();
    let (output, _) = bench(&[
        "--mode",
        "read,write",
        "--streams",
        "1,8",
        "--io-size",
        "1M",
        "--file-size",
        "16M",
        "--reps",
        "1",
        "--json",
        json_arg,
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let targets = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_hipfile-bench"))
            .arg("targets")
            .args(args)
            .output()
            .expect("starting hipfile-bench targets")
    };
    let checked = targets(&[json_arg]);
    let _ = std::fs::remove_file(&json);
    let stdout = text(&checked.stdout);
    assert!(checked.status.success(), "{stdout}{}", text(&checked.stderr));
    assert!(stdout.contains("device cpu; run: "), "{stdout}");
    let line = |start: &str| {
        stdout
            .lines()
            .find(|line| line.contains(start))
            .unwrap_or_else(|| panic!("no line with {start}: {stdout}"))
    };
    assert!(
        line("hot read 1M ASYNC 8 stream(s) vs CUFILE_SYNC:").contains("not measured"),
        "{stdout}"
    );
    for measured in [
        "hot read 1M ASYNC 8 stream(s) vs GPU_COPY:",
        "hot read 1M SYNC 8 stream(s) vs SYNC 1 stream(s):",
        "hot write 1M ASYNC 1 stream(s) vs CPUONLY:",
    ] {
        let line = line(measured);
        assert!(line.starts_with("  MET") || line.starts_with("  MISSED"), "{line}");
        assert!(line.contains("× (need ≥ "), "{line}");
    }
    assert!(stdout.contains(" not measured (no baseline row in this report)"), "{stdout}");
    let refused = targets(&["/proc/self/status"]);
    assert!(!refused.status.success());
    assert!(text(&refused.stderr).contains("is not a JSON report"), "{}", text(&refused.stderr));
}
