//! `hipfile-bench stats [PID]`: the live statistics of a process that uses hipfile-rs
//! (`hipfile_runtime::stats`, read from `/dev/shm/hipfile-rs-stats.<pid>`).

use std::time::Duration;

use hipfile_core::Direction;
use hipfile_runtime::stats::{Api, ClassSnapshot, STATS_DEVICES, StatsSnapshot};

use crate::cli::StatsArgs;
use crate::error::{Result, fail};

const PATH_NAMES: [&str; 8] = [
    "O_DIRECT read bytes",
    "page-cache read bytes",
    "O_DIRECT write bytes",
    "page-cache write bytes",
    "caller-thread requests",
    "engine jobs",
    "fallback-staged chunks",
    "blocking-retry chunks",
];

/// Runs the subcommand. `Ok(false)` when the process has no statistics.
pub fn run(args: &StatsArgs) -> Result<bool> {
    let Some(pid) = args.pid else {
        return list();
    };
    let read = || {
        StatsSnapshot::of_process(pid).map_err(|e| {
            crate::error::Failure(format!(
                "no statistics of process {pid} ({e}): is it running hipfile-rs, has it done I/O, is HIPFILE_STATS=0 set?"
            ))
        })
    };
    let mut last = read()?;
    print!("{}", view(&last, None));
    if args.interval <= 0.0 {
        return Ok(true);
    }
    let interval = Duration::from_secs_f64(args.interval.max(0.05));
    let mut views = 1;
    while args.count == 0 || views < args.count {
        std::thread::sleep(interval);
        let Ok(now) = read() else {
            println!("process {pid} ended");
            return Ok(true);
        };
        println!();
        print!("{}", view(&now, Some((&last, interval))));
        last = now;
        views += 1;
    }
    Ok(true)
}

/// The processes that publish statistics now.
fn list() -> Result<bool> {
    let mut pids: Vec<u32> = std::fs::read_dir("/dev/shm")
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| {
                    e.file_name().to_str()?.strip_prefix("hipfile-rs-stats.")?.parse().ok()
                })
                .collect()
        })
        .unwrap_or_default();
    pids.sort_unstable();
    if pids.is_empty() {
        return fail(
            "no process publishes hipfile-rs statistics (/dev/shm/hipfile-rs-stats.*)".to_string(),
        );
    }
    println!("processes with hipfile-rs statistics: {pids:?} (hipfile-bench stats PID)");
    Ok(true)
}

/// One view: a line per (device, API, direction) that saw requests, then the paths.
/// With `since`, rates over the interval.
pub fn view(now: &StatsSnapshot, since: Option<(&StatsSnapshot, Duration)>) -> String {
    let mut out = format!("hipfile-rs statistics of process {}\n", now.pid);
    out.push_str(&format!(
        "{:<4} {:<6} {:<6} {:>12} {:>14} {:>8} {:>10} {:>9} {:>9} {:>10} {:>10}\n",
        "dev",
        "api",
        "dir",
        "ops",
        "bytes",
        "errors",
        "avg us",
        "p50 us",
        "p99 us",
        "ops/s",
        "MiB/s"
    ));
    for device in 0..STATS_DEVICES as u32 {
        for api in Api::ALL {
            for direction in [Direction::Read, Direction::Write] {
                let class = now.class(device, api, direction);
                if class.ops == 0 {
                    continue;
                }
                let rate = since.map(|(before, interval)| {
                    let old = before.class(device, api, direction);
                    per_second(class, old, interval)
                });
                out.push_str(&line(device, api, direction, class, rate));
            }
        }
    }
    for (i, name) in PATH_NAMES.iter().enumerate() {
        out.push_str(&format!("  {name:<24} {}\n", now.paths[i]));
    }
    out
}

fn per_second(now: &ClassSnapshot, before: &ClassSnapshot, interval: Duration) -> (f64, f64) {
    let seconds = interval.as_secs_f64();
    let ops = now.ops.saturating_sub(before.ops) as f64 / seconds;
    let mib = now.bytes.saturating_sub(before.bytes) as f64 / seconds / (1 << 20) as f64;
    (ops, mib)
}

fn line(
    device: u32,
    api: Api,
    direction: Direction,
    class: &ClassSnapshot,
    rate: Option<(f64, f64)>,
) -> String {
    let number = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
    let (ops_s, mib_s) =
        rate.map_or(("-".into(), "-".into()), |(o, m)| (format!("{o:.0}"), format!("{m:.1}")));
    format!(
        "{:<4} {:<6} {:<6} {:>12} {:>14} {:>8} {:>10} {:>9} {:>9} {:>10} {:>10}\n",
        device,
        api.name(),
        if direction == Direction::Read { "read" } else { "write" },
        class.ops,
        class.bytes,
        class.errors,
        class.mean_latency_us().map_or("-".into(), |v| format!("{v:.1}")),
        number(class.latency_quantile_us(0.5)),
        number(class.latency_quantile_us(0.99)),
        ops_s,
        mib_s,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_view_shows_classes_with_requests_and_their_rates() {
        let mut before = StatsSnapshot { pid: 42, ..Default::default() };
        before.classes = vec![Default::default(); STATS_DEVICES];
        let mut now = before.clone();
        let class = &mut now.classes[1][Api::Batch as usize][0];
        class.ops = 10;
        class.bytes = 10 << 20;
        class.latency_ns_sum = 10 * 12_000;
        class.latency_buckets[4] = 10;
        now.paths[5] = 7;
        let text = view(&now, Some((&before, Duration::from_secs(2))));
        assert!(text.contains("process 42"), "{text}");
        let row = text.lines().find(|l| l.starts_with("1 ")).expect("device 1 row");
        let fields: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(
            fields,
            ["1", "batch", "read", "10", "10485760", "0", "12.0", "16", "16", "5", "5.0"]
        );
        assert_eq!(text.lines().filter(|l| l.starts_with("0 ")).count(), 0, "idle classes hidden");
        assert!(text.contains("engine jobs") && text.contains(" 7\n"));
    }
}
