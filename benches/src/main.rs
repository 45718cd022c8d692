//! `hipfile-bench`: the gdsio-like benchmark of hipfile-rs (the project's main job) and
//! `hipfile-bench check`, the platform check.
//!
//! With no arguments it makes a test file, reads and writes it through the async API on
//! the auto-selected device, verifies every byte, and prints a gdsio-style table next to
//! baselines measured in the same run (raw storage, naive pread + copy, device copies,
//! and cuFile compat mode when libcufile loads). See `--help`.

mod baselines;
mod batch_mode;
mod bench;
mod check;
mod cli;
mod cpu_samples;
mod cufile;
mod error;
mod latency;
mod mem;
mod pattern;
mod profile;
mod report;
mod runner;
mod shards;
mod stats_view;
mod svg;
mod sweep;
mod sweep_case;
mod sys;
mod targets;
mod workload;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command, DeviceArg};

fn main() -> ExitCode {
    let cli = Cli::parse();
    hipfile_runtime::logging::install_stderr_logger();
    // A fault names its thread and lists its return addresses (the GPU machine has no gdb).
    if std::env::var_os("HIPFILE_BENCH_FAULT_REPORT").is_some_and(|value| value != "0")
        && let Err(error) = sys::report_fatal_signals()
    {
        eprintln!("hipfile-bench: the fatal-signal report is not installed: {error}");
    }
    // Not for `check`, which reports the caller's own setting.
    if cli.command.is_none() && std::env::var_os("CUDA_DEVICE_MAX_CONNECTIONS").is_none() {
        // Streams blocked on a wait-value must not share a hardware queue with the
        // engine's copy streams (README, Known limits); CUDA reads this at cuInit.
        // SAFETY: the start of main, before the process has other threads (nothing can
        // read the environment concurrently).
        unsafe { std::env::set_var("CUDA_DEVICE_MAX_CONNECTIONS", "32") };
    }
    // cuFile reads its environment when it loads: set it while the process has one thread.
    let cufile_json = match (&cli.command, cli.run.device) {
        (None, Some(DeviceArg::Cpu)) | (Some(_), _) => None,
        (None, _) if cli.run.is_sweep() || cli.run.is_shards() => None,
        (None, _) => cufile::prepare_environment(),
    };
    // HIPFILE_BENCH_CPU_SAMPLES=PATH: where the CPU time went, without perf.
    let cpu_samples = cpu_samples::start_from_env();
    let result = match &cli.command {
        Some(Command::Check(args)) => check::run(args),
        Some(Command::Stats(args)) => stats_view::run(args),
        Some(Command::Targets(args)) => targets::run(args),
        None => runner::main(&cli.run),
    };
    if let Some(samples) = cpu_samples {
        samples.finish();
    }
    if let Some(path) = cufile_json {
        let _ = std::fs::remove_file(path);
    }
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("hipfile-bench: a hipfile-rs result was WRONG, FAILED or HANG (see above)");
            ExitCode::FAILURE
        }
        Err(error) => {
            eprintln!("hipfile-bench: error: {error}");
            ExitCode::FAILURE
        }
    }
}
