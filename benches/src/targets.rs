//! `hipfile-bench targets REPORT.json...`: the speed goals of issue #16 checked against the
//! rows of each `--json` report, every ratio taken within one report (one run on one
//! machine: H200 machines differ by 30 %, so figures of two runs are never combined).
//!
//! For each report, what its rows allow:
//! - reads from the page cache (`READ`, `page cache`): ASYNC and SYNC at least 1.15×
//!   CUFILE_SYNC; at 8 streams or more, at least 0.85× the pinned copy (GPU_COPY); a
//!   larger stream count at least 0.95× a smaller one;
//! - writes to the page cache: at least 1.0× raw `pwrite` (CPUONLY) and 1.1× CUFILE_SYNC;
//! - O_DIRECT (and `--cold`) reads: at least 1.0× raw `pread`; O_DIRECT writes at least
//!   0.95× raw `pwrite`;
//! - random reads (`RANDREAD` rows, and `--mode batch` reports): IOPS at least 1.5×
//!   CUFILE_SYNC, with the CPU per op;
//! - every row above: CPU-s/GiB at most CUFILE_SYNC's;
//! - `--latency` (4 KiB): the async round trip's p50 at most 25 µs and p99 at most 60 µs,
//!   the sync p50 at most cuFile's sync p50.
//!
//! A goal whose baseline the report lacks is listed as not measured, never as met.

use std::fmt::Write as _;
use std::path::PathBuf;

use clap::Args;
use serde_json::Value;

use crate::error::{Context, Result};

/// Options of `hipfile-bench targets`.
#[derive(Debug, Args)]
pub struct TargetsArgs {
    /// Reports written by `hipfile-bench --json` (each checked on its own).
    #[arg(required = true)]
    pub reports: Vec<PathBuf>,
}

/// How a goal compares a figure of ours with its baseline.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Need {
    /// ours / baseline ≥ this (throughput, IOPS).
    RatioAtLeast(f64),
    /// ours / baseline ≤ this (CPU per GiB, latency against a peer).
    RatioAtMost(f64),
    /// ours ≤ this many µs (no baseline).
    MicrosAtMost(f64),
}

/// One goal checked on one case of a report.
#[derive(Clone, Debug, PartialEq)]
struct Check {
    /// The goal and the case, in words.
    what: String,
    /// Our figure (GiB/s, IOPS, CPU-s/GiB or µs).
    ours: f64,
    /// The baseline's figure and name; `None`: the report has no such row.
    baseline: Option<(f64, String)>,
    need: Need,
    unit: &'static str,
}

/// Met, missed, or not measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    Met,
    Missed,
    NotMeasured,
}

impl Check {
    /// The figure compared with the need: a ratio, or µs.
    fn figure(&self) -> Option<f64> {
        match self.need {
            Need::MicrosAtMost(_) => Some(self.ours),
            _ => self.baseline.as_ref().map(|(base, _)| self.ours / base),
        }
    }

    fn verdict(&self) -> Verdict {
        let Some(figure) = self.figure().filter(|f| f.is_finite()) else {
            return Verdict::NotMeasured;
        };
        let met = match self.need {
            Need::RatioAtLeast(need) => figure >= need,
            Need::RatioAtMost(need) | Need::MicrosAtMost(need) => figure <= need,
        };
        if met { Verdict::Met } else { Verdict::Missed }
    }

    /// One line: verdict, goal and case, figures, and by how much a missed goal is missed
    /// (relative to what it needs).
    fn line(&self) -> String {
        let verdict = match self.verdict() {
            Verdict::Met => "MET   ",
            Verdict::Missed => "MISSED",
            Verdict::NotMeasured => "--    ",
        };
        let unit = self.unit;
        let mut line = format!("{verdict} {}: ", self.what);
        match (&self.need, &self.baseline, self.figure()) {
            (Need::MicrosAtMost(need), _, _) => {
                let _ = write!(line, "{:.1} {unit} (need ≤ {need} {unit}", self.ours);
            }
            (need, Some((base, name)), Some(ratio)) => {
                let (sign, value) = match need {
                    Need::RatioAtLeast(v) => ("≥", v),
                    Need::RatioAtMost(v) | Need::MicrosAtMost(v) => ("≤", v),
                };
                let _ = write!(
                    line,
                    "{} / {} {unit} ({name}) = {ratio:.2}× (need {sign} {value}×",
                    fmt_figure(self.ours),
                    fmt_figure(*base)
                );
            }
            (_, _, _) => {
                let _ =
                    write!(line, "{} {unit}; not measured: no baseline row", fmt_figure(self.ours));
                return line;
            }
        }
        if self.verdict() == Verdict::Missed {
            let figure = self.figure().unwrap_or(f64::NAN);
            let (need, short) = match self.need {
                Need::RatioAtLeast(need) => (need, (need - figure) / need),
                Need::RatioAtMost(need) | Need::MicrosAtMost(need) => {
                    (need, (figure - need) / need)
                }
            };
            let _ = write!(line, ": missed by {:.0} % of {need}", short * 100.0);
        }
        line.push(')');
        line
    }
}

/// Two significant decimals for small figures, none for large ones (IOPS).
fn fmt_figure(value: f64) -> String {
    if value.abs() >= 1000.0 { format!("{value:.0}") } else { format!("{value:.2}") }
}

/// A row of `results` that ran: its fields by name.
struct ResultRow<'a>(&'a Value);

impl ResultRow<'_> {
    fn text(&self, field: &str) -> &str {
        self.0[field].as_str().unwrap_or("")
    }
    fn number(&self, field: &str) -> Option<f64> {
        self.0[field].as_f64()
    }
    fn count(&self, field: &str) -> u64 {
        self.0[field].as_u64().unwrap_or(0)
    }
    fn ran(&self) -> bool {
        matches!(self.text("status"), "ok" | "unverified")
    }
}

/// The kind of rows a goal is about, and its goals.
#[derive(Clone, Copy)]
struct Kind {
    io_type: &'static str,
    /// Whether a row's cache column belongs to the kind.
    cache: fn(&str) -> bool,
    label: &'static str,
    /// Least ratio against CUFILE_SYNC, if a goal.
    vs_cufile: Option<f64>,
    /// Least ratio against raw storage (CPUONLY), if a goal.
    vs_raw: Option<f64>,
    /// Hot reads: against the pinned copy at 8 streams or more, and more streams against
    /// fewer.
    vs_copy_and_fewer: bool,
}

const HOT_READS: Kind = Kind {
    io_type: "READ",
    cache: |c| c == "page cache",
    label: "hot read",
    vs_cufile: Some(1.15),
    vs_raw: None,
    vs_copy_and_fewer: true,
};
const HOT_WRITES: Kind = Kind {
    io_type: "WRITE",
    label: "hot write",
    vs_cufile: Some(1.1),
    vs_raw: Some(1.0),
    vs_copy_and_fewer: false,
    ..HOT_READS
};
const DIRECT_READS: Kind = Kind {
    cache: |c| c == "O_DIRECT" || c == "cold",
    label: "O_DIRECT read",
    vs_cufile: None,
    vs_raw: Some(1.0),
    vs_copy_and_fewer: false,
    ..HOT_READS
};
const DIRECT_WRITES: Kind = Kind {
    io_type: "WRITE",
    cache: |c| c == "O_DIRECT",
    label: "O_DIRECT write",
    vs_raw: Some(0.95),
    ..DIRECT_READS
};
const RANDOM_READS: Kind = Kind {
    io_type: "RANDREAD",
    label: "random read",
    vs_cufile: Some(1.5),
    vs_copy_and_fewer: false,
    ..HOT_READS
};

/// Every goal the rows of one report allow, in order.
fn checks(report: &Value) -> Vec<Check> {
    let rows: Vec<ResultRow<'_>> = report["results"]
        .as_array()
        .map(|rows| rows.iter().map(ResultRow).filter(ResultRow::ran).collect())
        .unwrap_or_default();
    let mut out = Vec::new();
    for kind in [HOT_READS, HOT_WRITES, DIRECT_READS, DIRECT_WRITES, RANDOM_READS] {
        kind_checks(&rows, kind, &mut out);
    }
    latency_checks(&report["latency"], &mut out);
    batch_checks(report, &mut out);
    out
}

/// The random-read goals of a `--mode batch` report (its `rows` name a `path`): IOPS of
/// our paths at least 1.5× CUFILE_SYNC's 8 threads, CPU per op at most cuFile's, each
/// against the CUFILE_SYNC row of the same op size and op count (one group of the run).
fn batch_checks(report: &Value, out: &mut Vec<Check>) {
    let Some(rows) = report["rows"].as_array() else { return };
    let rows: Vec<ResultRow<'_>> = rows.iter().map(ResultRow).filter(ResultRow::ran).collect();
    for ours in
        rows.iter().filter(|r| matches!(r.text("path"), "ASYNC" | "ASYNC_T" | "SYNC" | "BATCH"))
    {
        let (io_size, ops) = (ours.count("io_size"), ours.count("ops"));
        let peer = rows.iter().find(|r| {
            r.text("path") == "CUFILE_SYNC"
                && r.count("io_size") == io_size
                && r.count("ops") == ops
        });
        let case = format!(
            "batch random read {} {} {}",
            crate::cli::format_size(io_size),
            ours.text("path"),
            ours.count("in_flight")
        );
        let baseline = |field: &str| {
            peer.and_then(|p| p.number(field)).map(|v| (v, "CUFILE_SYNC 8 threads".to_owned()))
        };
        if let Some(iops) = ours.number("iops") {
            out.push(Check {
                what: format!("{case} vs CUFILE_SYNC"),
                ours: iops,
                baseline: baseline("iops"),
                need: Need::RatioAtLeast(1.5),
                unit: "IOPS",
            });
        }
        if let Some(cpu) = ours.number("cpu_us_per_op") {
            out.push(Check {
                what: format!("{case} CPU per op vs CUFILE_SYNC"),
                ours: cpu,
                baseline: baseline("cpu_us_per_op"),
                need: Need::RatioAtMost(1.0),
                unit: "CPU-µs/op",
            });
        }
    }
}

/// The goals of one kind of rows, for each I/O size and stream count it has.
fn kind_checks(rows: &[ResultRow<'_>], kind: Kind, out: &mut Vec<Check>) {
    let of_kind = |row: &&ResultRow<'_>| {
        row.text("io_type") == kind.io_type && (kind.cache)(row.text("cache"))
    };
    let find = |xfer: &str, io_size: u64, streams: u64| {
        rows.iter().filter(of_kind).find(|r| {
            r.text("xfer") == xfer && r.count("io_size") == io_size && r.count("streams") == streams
        })
    };
    // The pinned copy has no file I/O: any cache.
    let gpu_copy = |io_size: u64, streams: u64| {
        rows.iter().find(|r| {
            r.text("xfer") == "GPU_COPY"
                && r.text("io_type") == kind.io_type
                && r.count("io_size") == io_size
                && r.count("streams") == streams
        })
    };
    let mut cases: Vec<(u64, u64)> = rows
        .iter()
        .filter(of_kind)
        .filter(|r| matches!(r.text("xfer"), "ASYNC" | "SYNC"))
        .map(|r| (r.count("io_size"), r.count("streams")))
        .collect();
    cases.sort_unstable();
    cases.dedup();
    let random = kind.io_type == "RANDREAD";
    let (figure, unit) = if random { ("iops", "IOPS") } else { ("gib_per_s", "GiB/s") };
    for &(io_size, streams) in &cases {
        for xfer in ["ASYNC", "SYNC"] {
            let Some(ours) = find(xfer, io_size, streams) else { continue };
            let Some(ours_figure) = ours.number(figure) else { continue };
            let case = format!(
                "{} {} {xfer} {streams} stream(s)",
                kind.label,
                crate::cli::format_size(io_size)
            );
            let mut against = |name: &str, base: Option<&ResultRow<'_>>, need: Need| {
                out.push(Check {
                    what: format!("{case} vs {name}"),
                    ours: ours_figure,
                    baseline: base.and_then(|b| b.number(figure)).map(|v| (v, name.to_owned())),
                    need,
                    unit,
                });
            };
            if let Some(need) = kind.vs_cufile {
                against(
                    "CUFILE_SYNC",
                    find("CUFILE_SYNC", io_size, streams),
                    Need::RatioAtLeast(need),
                );
            }
            if let Some(need) = kind.vs_raw {
                against("CPUONLY", find("CPUONLY", io_size, streams), Need::RatioAtLeast(need));
            }
            if kind.vs_copy_and_fewer && streams >= 8 {
                against("GPU_COPY", gpu_copy(io_size, streams), Need::RatioAtLeast(0.85));
            }
            if kind.vs_copy_and_fewer {
                // More streams never slower than fewer: against the next smaller count.
                let fewer = cases
                    .iter()
                    .filter(|&&(size, s)| size == io_size && s < streams)
                    .map(|&(_, s)| s)
                    .max();
                if let Some(fewer) = fewer {
                    let name = format!("{xfer} {fewer} stream(s)");
                    against(&name, find(xfer, io_size, fewer), Need::RatioAtLeast(0.95));
                }
            }
            // CPU per GiB at most cuFile's sync path's.
            if let Some(cpu) = ours.number("cpu_s_per_gib") {
                let peer = find("CUFILE_SYNC", io_size, streams);
                let mut what = format!("{case} CPU-s/GiB vs CUFILE_SYNC");
                if random {
                    let per_op_us = cpu * io_size as f64 / (1u64 << 30) as f64 * 1e6;
                    let _ = write!(what, " ({per_op_us:.1} CPU-µs per op)");
                }
                out.push(Check {
                    what,
                    ours: cpu,
                    baseline: peer
                        .and_then(|p| p.number("cpu_s_per_gib"))
                        .map(|v| (v, "CUFILE_SYNC".to_owned())),
                    need: Need::RatioAtMost(1.0),
                    unit: "CPU-s/GiB",
                });
            }
        }
    }
}

/// The 4 KiB round-trip goals of a `--latency` report.
fn latency_checks(latency: &Value, out: &mut Vec<Check>) {
    let Some(rows) = latency["rows"].as_array() else { return };
    let ran = |prefix: &str| {
        rows.iter().find(|r| {
            r["path"].as_str().is_some_and(|p| p.starts_with(prefix))
                && matches!(r["status"].as_str(), Some("ok" | "unverified"))
        })
    };
    let size = crate::cli::format_size(latency["io_size"].as_u64().unwrap_or(0));
    if let Some(row) = ran("hipfile-rs ASYNC") {
        for (percentile, need) in [("p50", 25.0), ("p99", 60.0)] {
            if let Some(us) = row["total_us"][percentile].as_f64() {
                out.push(Check {
                    what: format!("{size} async round trip {percentile}"),
                    ours: us,
                    baseline: None,
                    need: Need::MicrosAtMost(need),
                    unit: "µs",
                });
            }
        }
    }
    if let Some(us) = ran("hipfile-rs SYNC").and_then(|row| row["total_us"]["p50"].as_f64()) {
        let peer = ran("CUFILE_SYNC").and_then(|row| row["total_us"]["p50"].as_f64());
        out.push(Check {
            what: format!("{size} sync p50 vs CUFILE_SYNC"),
            ours: us,
            baseline: peer.map(|v| (v, "CUFILE_SYNC".to_owned())),
            need: Need::RatioAtMost(1.0),
            unit: "µs",
        });
    }
}

/// The report of one file: its goals line by line and a count.
fn report_text(report: &Value) -> String {
    let checks = checks(report);
    let mut text = String::new();
    let device = report["device"]["backend"].as_str().unwrap_or("not named");
    let command: Vec<&str> = report["command_line"]
        .as_array()
        .map(|words| words.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let _ = writeln!(text, "device {device}; run: {}", command.join(" "));
    for check in &checks {
        let _ = writeln!(text, "  {}", check.line());
    }
    let count = |v: Verdict| checks.iter().filter(|c| c.verdict() == v).count();
    let _ = writeln!(
        text,
        "  {} met, {} missed, {} not measured (no baseline row in this report)",
        count(Verdict::Met),
        count(Verdict::Missed),
        count(Verdict::NotMeasured)
    );
    if checks.is_empty() {
        let _ = writeln!(text, "  (no row of this report is one a goal is about)");
    }
    text
}

/// Runs `hipfile-bench targets`: always `Ok(true)` once every report was read (a missed
/// goal is a finding, not a failure of the tool).
pub fn run(args: &TargetsArgs) -> Result<bool> {
    for path in &args.reports {
        let text = std::fs::read_to_string(path).ctx(format!("reading {}", path.display()))?;
        let report: Value =
            serde_json::from_str(&text).ctx(format!("{} is not a JSON report", path.display()))?;
        println!("{}", path.display());
        print!("{}", report_text(&report));
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn row(io_type: &str, cache: &str, xfer: &str, streams: u64, gib: f64, cpu: f64) -> Value {
        json!({"io_type": io_type, "cache": cache, "xfer": xfer, "streams": streams,
               "io_size": 16u64 << 20, "status": "ok", "gib_per_s": gib,
               "iops": gib * 64.0, "cpu_s_per_gib": cpu})
    }

    fn find<'a>(checks: &'a [Check], what: &str) -> &'a Check {
        checks
            .iter()
            .find(|c| c.what == what)
            .unwrap_or_else(|| panic!("no check {what}: {checks:#?}"))
    }

    #[test]
    fn hot_reads_are_held_against_cufile_the_copy_and_fewer_streams() {
        let report = json!({"results": [
            row("READ", "page cache", "ASYNC", 8, 46.0, 0.2),
            row("READ", "page cache", "CUFILE_SYNC", 8, 40.0, 0.3),
            row("READ", "none (no file I/O)", "GPU_COPY", 8, 50.0, 0.1),
            row("READ", "page cache", "ASYNC", 16, 40.0, 0.4),
            row("READ", "page cache", "CUFILE_SYNC", 16, 40.0, 0.3),
        ]});
        let checks = checks(&report);
        let eight = find(&checks, "hot read 16M ASYNC 8 stream(s) vs CUFILE_SYNC");
        assert_eq!(eight.verdict(), Verdict::Met, "46 / 40 = 1.15");
        let sixteen = find(&checks, "hot read 16M ASYNC 16 stream(s) vs CUFILE_SYNC");
        assert_eq!(sixteen.verdict(), Verdict::Missed);
        assert!(
            sixteen.line().contains("1.00× (need ≥ 1.15×: missed by 13 % of 1.15)"),
            "{}",
            sixteen.line()
        );
        let copy = find(&checks, "hot read 16M ASYNC 8 stream(s) vs GPU_COPY");
        assert_eq!((copy.verdict(), copy.figure()), (Verdict::Met, Some(0.92)));
        // No GPU_COPY row at 16 streams: not measured, never met.
        let no_copy = find(&checks, "hot read 16M ASYNC 16 stream(s) vs GPU_COPY");
        assert_eq!(no_copy.verdict(), Verdict::NotMeasured);
        let more = find(&checks, "hot read 16M ASYNC 16 stream(s) vs ASYNC 8 stream(s)");
        assert_eq!(more.verdict(), Verdict::Missed, "40 < 0.95 × 46");
        let cpu = find(&checks, "hot read 16M ASYNC 16 stream(s) CPU-s/GiB vs CUFILE_SYNC");
        assert_eq!(cpu.verdict(), Verdict::Missed, "0.4 > 0.3");
        let cpu = find(&checks, "hot read 16M ASYNC 8 stream(s) CPU-s/GiB vs CUFILE_SYNC");
        assert_eq!(cpu.verdict(), Verdict::Met);
    }

    #[test]
    fn writes_direct_rows_and_random_reads_have_their_own_goals() {
        let mut random = row("RANDREAD", "page cache", "ASYNC", 8, 0.5, 2.0);
        random["io_size"] = json!(4096);
        random["iops"] = json!(150_000.0);
        let mut random_peer = row("RANDREAD", "page cache", "CUFILE_SYNC", 8, 0.4, 1.0);
        random_peer["io_size"] = json!(4096);
        random_peer["iops"] = json!(100_000.0);
        let report = json!({"results": [
            row("WRITE", "page cache", "SYNC", 8, 5.0, 1.0),
            row("WRITE", "page cache", "CPUONLY", 8, 4.9, 0.5),
            row("WRITE", "page cache", "CUFILE_SYNC", 8, 4.4, 1.7),
            row("WRITE", "O_DIRECT", "ASYNC", 8, 2.9, 0.3),
            row("WRITE", "O_DIRECT", "CPUONLY", 8, 3.0, 0.1),
            row("READ", "cold", "ASYNC", 1, 1.5, 0.3),
            row("READ", "cold", "CPUONLY", 1, 1.6, 0.04),
            random, random_peer,
            // A failed row is no figure.
            json!({"io_type": "READ", "cache": "cold", "xfer": "SYNC", "streams": 1,
                   "io_size": 16u64 << 20, "status": "FAILED", "gib_per_s": null}),
        ]});
        let checks = checks(&report);
        assert_eq!(
            find(&checks, "hot write 16M SYNC 8 stream(s) vs CPUONLY").verdict(),
            Verdict::Met
        );
        assert_eq!(
            find(&checks, "hot write 16M SYNC 8 stream(s) vs CUFILE_SYNC").verdict(),
            Verdict::Met
        );
        assert_eq!(
            find(&checks, "O_DIRECT write 16M ASYNC 8 stream(s) vs CPUONLY").verdict(),
            Verdict::Met,
            "2.9 / 3.0 ≥ 0.95"
        );
        assert_eq!(
            find(&checks, "O_DIRECT read 16M ASYNC 1 stream(s) vs CPUONLY").verdict(),
            Verdict::Missed
        );
        let iops = find(&checks, "random read 4K ASYNC 8 stream(s) vs CUFILE_SYNC");
        assert_eq!((iops.verdict(), iops.unit), (Verdict::Met, "IOPS"));
        let per_op = format!(
            "random read 4K ASYNC 8 stream(s) CPU-s/GiB vs CUFILE_SYNC ({:.1} CPU-µs per op)",
            2.0 * 4096.0 / (1u64 << 30) as f64 * 1e6
        );
        assert_eq!(find(&checks, &per_op).verdict(), Verdict::Missed);
        assert!(
            !checks.iter().any(|c| c.what.starts_with("O_DIRECT read 16M SYNC")),
            "the failed row: {checks:#?}"
        );
    }

    #[test]
    fn batch_reports_hold_each_path_against_cufiles_threads_of_the_same_group() {
        let entry = |path: &str, in_flight: u64, ops: u64, iops: f64, cpu: f64| {
            json!({"path": path, "in_flight": in_flight, "io_size": 4096, "ops": ops,
                   "iops": iops, "cpu_us_per_op": cpu, "status": "ok"})
        };
        let report = json!({"cufile": "", "rows": [
            entry("BATCH", 32, 8000, 144_240.0, 9.0),
            entry("ASYNC", 32, 8000, 63_036.0, 30.0),
            entry("CUFILE_SYNC", 8, 8000, 321_622.0, 10.0),
            entry("SYNC", 128, 8064, 500_000.0, 8.0),
            entry("CUFILE_SYNC", 8, 8064, 317_766.0, 10.0),
        ]});
        let checks = checks(&report);
        let batch = find(&checks, "batch random read 4K BATCH 32 vs CUFILE_SYNC");
        assert_eq!(batch.verdict(), Verdict::Missed);
        assert_eq!(batch.baseline.as_ref().map(|b| b.0), Some(321_622.0));
        let sync = find(&checks, "batch random read 4K SYNC 128 vs CUFILE_SYNC");
        assert_eq!(sync.baseline.as_ref().map(|b| b.0), Some(317_766.0), "its own group");
        assert_eq!(sync.verdict(), Verdict::Met, "500000 / 317766 = 1.57");
        let cpu = find(&checks, "batch random read 4K ASYNC 32 CPU per op vs CUFILE_SYNC");
        assert_eq!(cpu.verdict(), Verdict::Missed);
    }

    #[test]
    fn latency_goals_are_absolute_and_against_cufiles_sync_path() {
        let report = json!({"results": [], "latency": {"io_size": 4096, "rows": [
            {"path": "hipfile-rs ASYNC: submit_async + stream sync", "status": "ok",
             "total_us": {"p50": 24.0, "p99": 61.0}},
            {"path": "hipfile-rs SYNC: io_sync", "status": "ok", "total_us": {"p50": 9.9}},
            {"path": "CUFILE_SYNC: cuFileRead", "status": "ok", "total_us": {"p50": 11.1}},
        ]}});
        let checks = checks(&report);
        assert_eq!(find(&checks, "4K async round trip p50").verdict(), Verdict::Met);
        let p99 = find(&checks, "4K async round trip p99");
        assert_eq!(p99.verdict(), Verdict::Missed);
        assert!(
            p99.line().contains("61.0 µs (need ≤ 60 µs: missed by 2 % of 60)"),
            "{}",
            p99.line()
        );
        assert_eq!(find(&checks, "4K sync p50 vs CUFILE_SYNC").verdict(), Verdict::Met);
    }

    /// The H200 report of the twenty-third session (`results/h200-lead.json`), whose
    /// ratios the README quotes: 2.49× CUFILE_SYNC at 1 stream, 0.77× at 8, 0.74× at 16.
    #[test]
    fn the_kept_h200_report_gives_the_readmes_ratios() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/results/h200-lead.json");
        let report: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let checks = checks(&report);
        let ratio = |what: &str| {
            let check = find(&checks, what);
            (check.verdict(), (check.figure().unwrap() * 100.0).round() / 100.0)
        };
        assert_eq!(ratio("hot read 16M ASYNC 1 stream(s) vs CUFILE_SYNC"), (Verdict::Met, 2.49));
        assert_eq!(ratio("hot read 16M ASYNC 8 stream(s) vs CUFILE_SYNC"), (Verdict::Missed, 0.77));
        assert_eq!(
            ratio("hot read 16M ASYNC 16 stream(s) vs CUFILE_SYNC"),
            (Verdict::Missed, 0.74)
        );
        assert_eq!(ratio("hot write 16M ASYNC 8 stream(s) vs CUFILE_SYNC").1, 1.04);
        let text = report_text(&report);
        assert!(text.contains(" met, ") && text.contains(" missed, "), "{text}");
    }
}
