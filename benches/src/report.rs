//! Results: rows from samples, the gdsio-style table, the summary and the JSON report.

use serde::Serialize;

use crate::bench::{RunError, Sample};
use crate::cli::{Mode, format_size};
use crate::workload::Xfer;

const GIB: f64 = (1u64 << 30) as f64;

/// One case to run: pattern, I/O size, streams, transfer type.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    /// I/O pattern.
    pub mode: Mode,
    /// Bytes per op.
    pub io_size: u64,
    /// Streams (threads) asked for.
    pub streams: usize,
    /// Transfer type.
    pub xfer: Xfer,
}

/// Latency percentiles in µs.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Percentiles {
    /// Mean.
    pub avg: f64,
    /// Median.
    pub p50: f64,
    /// 99th percentile (nearest rank).
    pub p99: f64,
    /// Largest.
    pub max: f64,
}

impl Percentiles {
    /// Of `values` (any order); `None` when empty.
    pub fn of(values: &[f64]) -> Option<Percentiles> {
        if values.is_empty() {
            return None;
        }
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let rank = |p: f64| {
            sorted[((p / 100.0 * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1]
        };
        let avg = sorted.iter().sum::<f64>() / sorted.len() as f64;
        Some(Percentiles { avg, p50: rank(50.0), p99: rank(99.0), max: sorted[sorted.len() - 1] })
    }
}

/// One line of the results (the median repetition by throughput).
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// READ, WRITE, RANDREAD, RANDWRITE.
    pub io_type: &'static str,
    /// ASYNC, SYNC, CPUONLY, CPU_GPU, GPU_COPY, CUFILE_ASYNC, CUFILE_SYNC.
    pub xfer: &'static str,
    /// Streams (or threads) actually used.
    pub streams: usize,
    /// Bytes per op.
    pub io_size: u64,
    /// `ok`, `unverified`, `WRONG` or `FAILED`.
    pub status: &'static str,
    /// Why WRONG or FAILED.
    pub detail: Option<String>,
    /// Throughput, GiB/s.
    pub gib_per_s: Option<f64>,
    /// Ops per second.
    pub iops: Option<f64>,
    /// Per-op latency, µs (submit → completion observed).
    pub latency_us: Option<Percentiles>,
    /// Duration of the submit call, µs (async paths).
    pub submit_us: Option<Percentiles>,
    /// Process CPU seconds per GiB moved.
    pub cpu_s_per_gib: Option<f64>,
    /// Wall seconds of the timed part.
    pub seconds: Option<f64>,
    /// Bytes per repetition.
    pub bytes: u64,
    /// Ops per repetition.
    pub ops: u64,
    /// Repetitions completed.
    pub reps: usize,
    /// Throughput of every repetition, GiB/s.
    pub rep_gib_per_s: Vec<f64>,
    /// `page cache`, `O_DIRECT` or `cold` (reads after a cache drop).
    pub cache: &'static str,
    /// `--profile`: where the case's time went, over all its repetitions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile: Option<crate::profile::Profile>,
}

impl Row {
    /// The row of a case: the median repetition, or the error that stopped it.
    pub fn new(
        case: &Case,
        streams: usize,
        samples: &[Sample],
        error: Option<RunError>,
        verified: bool,
        cache: &'static str,
    ) -> Row {
        let rates: Vec<f64> =
            samples.iter().map(|s| s.bytes as f64 / GIB / s.seconds.max(1e-9)).collect();
        let mut row = Row {
            io_type: case.mode.io_type(),
            xfer: case.xfer.name(),
            streams,
            io_size: case.io_size,
            status: if verified { "ok" } else { "unverified" },
            detail: None,
            gib_per_s: None,
            iops: None,
            latency_us: None,
            submit_us: None,
            cpu_s_per_gib: None,
            seconds: None,
            bytes: samples.first().map_or(0, |s| s.bytes),
            ops: samples.first().map_or(0, |s| s.ops),
            reps: samples.len(),
            rep_gib_per_s: rates.clone(),
            cache,
            profile: None,
        };
        if let Some(error) = error {
            let (status, detail) = match error {
                RunError::Wrong(d) => ("WRONG", d),
                RunError::Failed(d) => ("FAILED", d),
            };
            (row.status, row.detail) = (status, Some(detail));
            return row;
        }
        let mut order: Vec<usize> = (0..samples.len()).collect();
        order.sort_by(|&a, &b| rates[a].total_cmp(&rates[b]));
        if let Some(&median) = order.get(order.len() / 2) {
            row.fill(&samples[median], rates[median]);
        }
        row
    }

    fn fill(&mut self, sample: &Sample, rate: f64) {
        self.gib_per_s = Some(rate);
        self.iops = Some(sample.ops as f64 / sample.seconds.max(1e-9));
        self.latency_us = Percentiles::of(&sample.latencies_us);
        self.submit_us = Percentiles::of(&sample.submit_us);
        self.cpu_s_per_gib = Some(sample.cpu_seconds / (sample.bytes as f64 / GIB).max(1e-12));
        self.seconds = Some(sample.seconds);
    }

    /// Whether the row holds a speed.
    pub fn is_ok(&self) -> bool {
        self.gib_per_s.is_some()
    }
}

fn opt(value: Option<f64>, width: usize, decimals: usize) -> String {
    value.map_or_else(|| format!("{:>width$}", "-"), |v| format!("{v:>width$.decimals$}"))
}

/// The table's two header lines.
pub fn header() -> String {
    let mut out = format!(
        "{:<9} {:<12} {:>4} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8}  {}\n",
        "IoType",
        "XferType",
        "Strm",
        "IOSize",
        "GiB/s",
        "IOPS",
        "Lat avg",
        "Lat p50",
        "Lat p99",
        "CPU-s/GiB",
        "Time s",
        "Data"
    );
    out.push_str(&format!("{:>79}\n", "(us per op; async: submit to done, queueing included)"));
    out
}

/// One table line (WRONG / FAILED in place of the speed).
pub fn line(row: &Row) -> String {
    let speed = match row.gib_per_s {
        Some(rate) => format!("{rate:>9.3}"),
        None => format!("{:>9}", row.status),
    };
    let lat = row.latency_us;
    format!(
        "{:<9} {:<12} {:>4} {:>6} {speed} {} {} {} {} {} {}  {}\n",
        row.io_type,
        row.xfer,
        row.streams,
        format_size(row.io_size),
        opt(row.iops, 9, 0),
        opt(lat.map(|l| l.avg), 9, 1),
        opt(lat.map(|l| l.p50), 9, 1),
        opt(lat.map(|l| l.p99), 9, 1),
        opt(row.cpu_s_per_gib, 9, 3),
        opt(row.seconds, 8, 3),
        if row.is_ok() { row.status } else { "-" },
    )
}

/// Why rows hold no speed (empty when all do).
pub fn notes(rows: &[Row]) -> String {
    let mut out = String::new();
    for row in rows {
        if let Some(detail) = &row.detail {
            out.push_str(&format!(
                "  {} {} S={} {}: {} {detail}\n",
                row.io_type,
                row.xfer,
                row.streams,
                format_size(row.io_size),
                row.status
            ));
        }
    }
    if out.is_empty() { out } else { format!("Not a speed:\n{out}") }
}

/// The whole table (header, lines, notes).
#[cfg(test)]
pub fn table(rows: &[Row]) -> String {
    let mut out = header();
    for row in rows {
        out.push_str(&line(row));
    }
    let notes = notes(rows);
    if !notes.is_empty() {
        out.push('\n');
        out.push_str(&notes);
    }
    out
}

/// One line per (pattern, I/O size, streams) and async row (ASYNC, ASYNC_MT): against the
/// baselines of the group.
pub fn summary(rows: &[Row]) -> String {
    let mut out = String::new();
    for ours in rows.iter().filter(|r| r.xfer.starts_with("ASYNC") && r.is_ok()) {
        let same = |xfer: &str| {
            rows.iter().find(|r| {
                r.xfer == xfer
                    && r.io_type == ours.io_type
                    && r.io_size == ours.io_size
                    && r.streams == ours.streams
            })
        };
        let rate = ours.gib_per_s.unwrap_or(0.0);
        let mut parts = Vec::new();
        for (xfer, label) in [("GPU_COPY", "of the copy ceiling"), ("CPUONLY", "of raw storage")] {
            if let Some(base) = same(xfer).and_then(|r| r.gib_per_s) {
                parts.push(format!("{:.0}% {label}", 100.0 * rate / base));
            }
        }
        for xfer in ["CPU_GPU", "SYNC", "CUFILE_ASYNC", "CUFILE_SYNC"] {
            match same(xfer) {
                Some(base) if base.is_ok() => {
                    parts.push(format!("{:.2}x {xfer}", rate / base.gib_per_s.unwrap_or(1.0)))
                }
                Some(base) => parts.push(format!("{xfer} {}", base.status)),
                None => {}
            }
        }
        out.push_str(&format!(
            "{} {} {} S={}: {rate:.3} GiB/s = {}\n",
            ours.xfer,
            ours.io_type,
            format_size(ours.io_size),
            ours.streams,
            parts.join(", ")
        ));
    }
    out
}

/// Whether hipfile-rs's own rows all hold verified (or unverified) speeds.
pub fn ours_ok(rows: &[Row]) -> bool {
    rows.iter().filter(|r| r.xfer.starts_with("ASYNC") || r.xfer == "SYNC").all(Row::is_ok)
}

/// Writes `value` as pretty JSON to `path`.
pub fn write_json(path: &std::path::Path, value: &impl Serialize) -> crate::error::Result<()> {
    use crate::error::Context;
    let text = serde_json::to_string_pretty(value).ctx("encoding JSON")?;
    std::fs::write(path, text + "\n").ctx(format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_nearest_rank() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        let p = Percentiles::of(&values).unwrap();
        assert_eq!((p.p50, p.p99, p.max), (50.0, 99.0, 100.0));
        assert!((p.avg - 50.5).abs() < 1e-9);
        assert!(Percentiles::of(&[]).is_none());
    }

    #[test]
    fn median_row_and_errors() {
        let case = Case { mode: Mode::Read, io_size: 1 << 20, streams: 2, xfer: Xfer::Async };
        let sample = |seconds| Sample {
            seconds,
            bytes: 1 << 30,
            ops: 1024,
            cpu_seconds: 0.5,
            ..Sample::default()
        };
        let row =
            Row::new(&case, 2, &[sample(1.0), sample(0.5), sample(2.0)], None, true, "page cache");
        assert_eq!(row.gib_per_s, Some(1.0));
        assert_eq!(row.cpu_s_per_gib, Some(0.5));
        let wrong = Row::new(&case, 2, &[], Some(RunError::Wrong("x".into())), true, "page cache");
        assert_eq!((wrong.status, wrong.is_ok()), ("WRONG", false));
        assert!(table(&[row, wrong]).contains("WRONG"));
    }
}
