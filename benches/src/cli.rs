//! Command-line options (clap, derive API) and the size parser they use.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// `hipfile-bench`: the gdsio-like benchmark of hipfile-rs.
#[derive(Debug, Parser)]
#[command(
    name = "hipfile-bench",
    version,
    about = "gdsio-like benchmark of hipfile-rs: async reads and writes on the auto-selected \
             device, every byte verified, next to baselines measured in the same run",
    after_help = "Sizes take K, M, G suffixes (binary: 4K = 4096). Lists are comma-separated \
                  and swept: --io-size 1M,4M,16M --streams 1,4,8.\n\
                  Run `hipfile-bench check` to see what this machine supports."
)]
pub struct Cli {
    /// A subcommand; without one, the benchmark runs.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Benchmark options.
    #[command(flatten)]
    pub run: RunArgs,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// What this machine supports, like gdscheck: io_uring, O_DIRECT and DIO alignment,
    /// devices and backends, memlock and pinned-memory limits, configuration in effect.
    Check(CheckArgs),
    /// The I/O statistics of a running process that uses hipfile-rs (its
    /// /dev/shm/hipfile-rs-stats.PID), like hipFile's ais-stats: once, or refreshed.
    Stats(StatsArgs),
    /// Issue #16's speed goals checked against `--json` reports, each report on its own
    /// (ratios only within one run): met, missed (by how much) or not measured.
    Targets(crate::targets::TargetsArgs),
}

/// Options of `hipfile-bench stats`.
#[derive(Debug, Args)]
pub struct StatsArgs {
    /// The process (default: list the processes that publish statistics).
    pub pid: Option<u32>,
    /// Refresh every this many seconds, with rates since the last view (0: once).
    #[arg(long, default_value_t = 0.0)]
    pub interval: f64,
    /// Views to print with --interval (0: until the process ends or Ctrl-C).
    #[arg(long, default_value_t = 0)]
    pub count: u64,
}

/// Options of `hipfile-bench check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Device backend to report on (default: HIPFILE_DEVICE, else auto).
    #[arg(long, value_enum)]
    pub device: Option<DeviceArg>,
    /// File or directory whose filesystem is checked for O_DIRECT (default: the temp dir).
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// libcufile to try instead of the default search.
    #[arg(long, value_name = "PATH")]
    pub cufile: Option<PathBuf>,
}

/// Options of the benchmark run.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Device backend (default: HIPFILE_DEVICE, else auto: cuda when a GPU is found, else cpu).
    #[arg(long, value_enum)]
    pub device: Option<DeviceArg>,
    /// Test file; created (overwritten) with a known pattern and kept afterwards
    /// (default: a temporary file, removed at the end).
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// Test file size (default: 256M on the cpu device, 2G on a GPU); with `--mode
    /// sweep`, the most bytes one case covers (the file is no larger than the largest case).
    #[arg(long, value_parser = parse_size)]
    pub file_size: Option<u64>,
    /// I/O size per op; a list is swept. Multiples of 4K (default: 16M; with
    /// `--mode sweep`: 4K,1M,4M,16M).
    #[arg(long, value_parser = parse_size, value_delimiter = ',')]
    pub io_size: Vec<u64>,
    /// Streams (baselines: threads); a list is swept (default: usable CPUs, at most 8;
    /// with `--mode sweep`: 1,2,4,8,16,24,28,32,33,40,48,64,128,256).
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..=256))]
    pub streams: Vec<u32>,
    /// Engine executors (sets the executor CPUs; default: HIPFILE_THREADS / HIPFILE_CPUS).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub threads: Option<u32>,
    /// I/O patterns to run, comma-separated; `sweep` (given alone) is the stream-count
    /// sweep: every case in a child process under a time limit, HANG reported.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "read,write")]
    pub mode: Vec<Mode>,
    /// O_DIRECT: on, off or auto (default: HIPFILE_ODIRECT, else off = page cache).
    #[arg(long, value_enum)]
    pub direct: Option<DirectArg>,
    /// Stream registration flags 0..15 (1 buffer offset, 2 file offset, 4 size fixed,
    /// 8 page-aligned inputs).
    #[arg(long, default_value_t = 7, value_parser = clap::value_parser!(u32).range(0..=15))]
    pub flags: u32,
    /// Drop the page cache before each read run (posix_fadvise DONTNEED on the file, and
    /// /proc/sys/vm/drop_caches where permitted).
    #[arg(long)]
    pub cold: bool,
    /// Repetitions per case; the median (by throughput) is reported.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub reps: u32,
    /// Write the results as JSON to this file (hides the progress bar).
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
    /// Write an SVG chart (throughput vs I/O size, or vs streams) to this file.
    #[arg(long, value_name = "PATH.svg")]
    pub plot: Option<PathBuf>,
    /// Verify every byte (the default).
    #[arg(long, overrides_with = "no_verify")]
    pub verify: bool,
    /// Skip the verification (speeds only; results are then marked unverified).
    #[arg(long, overrides_with = "verify")]
    pub no_verify: bool,
    /// Latency mode: 4 KiB async reads, submit -> stream sync, on a hot file; also the
    /// submit cost and 128 submits behind a paused stream.
    #[arg(long)]
    pub latency: bool,
    /// Latency mode: also time our 4 KiB async and sync reads with the statistics
    /// recording on and off, alternating op by op in one run (what leaving them on costs).
    #[arg(long)]
    pub stats_ab: bool,
    /// Iterations of the latency mode.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u32).range(10..=1_000_000))]
    pub iterations: u32,
    /// Only hipfile-rs rows (no baselines).
    #[arg(long)]
    pub no_baselines: bool,
    /// Under every row, where its CPU time went (per thread group, CPU-s/GiB) and, for
    /// hipfile-rs rows, where the engine's executors spent their time (busy share; jobs
    /// waiting for file reads and writes, device copies, staging).
    #[arg(long)]
    pub profile: bool,
    /// libcufile to load for the cuFile baseline instead of the default search.
    #[arg(long, value_name = "PATH")]
    pub cufile: Option<PathBuf>,
    /// `--mode sweep`: stream registration flag sets (fixed: every stream 0xF; none: 0;
    /// mixed: 0xF and 0 alternating).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "fixed,none,mixed")]
    pub sweep_flags: Vec<SweepFlags>,
    /// `--mode sweep`: async ops per stream (lowered, then the op size, where a case would
    /// exceed the file).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub ops_per_stream: u32,
    /// `--mode sweep`: seconds a case may take before it is reported as HANG (and its
    /// process asked for the driver's pending report, then killed).
    #[arg(long, value_name = "SECS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub case_timeout: u64,
    /// `--mode sweep`: cases one child process runs one after another, with one driver
    /// (1: each case in a process of its own). A process starts CUDA, the engine and its
    /// memory once for them; a case that is not PASS ends it, and the rest run in a new
    /// one.
    #[arg(long, value_name = "N", default_value_t = 8,
          value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub cases_per_process: u32,
    /// `--mode batch`: entries per batch (and async ops in flight), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "32,128",
          value_parser = clap::value_parser!(u32).range(1..=128))]
    pub batch_entries: Vec<u32>,
    /// `--mode sweep`: spread each case's streams over every device (stream `s` on
    /// device `s mod N`, each device with its own buffer); default: all on device 0.
    #[arg(long)]
    pub spread_devices: bool,
    /// `--mode sweep`, internal: run these cases in this process, one after another
    /// (`read:24:mixed:4M:4`, comma-separated).
    #[arg(long, hide = true, value_name = "CASE")]
    pub sweep_case: Option<String>,
    /// `--mode sweep`, for tests: every case pauses its streams for good before it
    /// submits, so that it hangs and the HANG path runs.
    /// With a stream count, only the cases of that many streams hang.
    #[arg(long, hide = true, value_name = "STREAMS", num_args = 0..=1, default_missing_value = "0")]
    pub sweep_selftest_hang: Option<u32>,
}

impl RunArgs {
    /// `--io-size`, else 16M (4K,1M,4M,16M for `--mode sweep`, 4K,64K for `--mode
    /// batch`).
    pub fn io_sizes(&self) -> Vec<u64> {
        if !self.io_size.is_empty() {
            self.io_size.clone()
        } else if self.is_sweep() {
            vec![4 << 10, 1 << 20, 4 << 20, 16 << 20]
        } else if self.is_batch() {
            vec![4 << 10, 64 << 10]
        } else {
            vec![16 << 20]
        }
    }

    /// Whether `--mode` asks for the batch mode.
    pub fn is_batch(&self) -> bool {
        self.mode.contains(&Mode::Batch)
    }

    /// Whether `--mode` asks for the multi-GPU shard load.
    pub fn is_shards(&self) -> bool {
        self.mode.contains(&Mode::Shards)
    }

    /// Whether `--mode` asks for the stream-count sweep.
    pub fn is_sweep(&self) -> bool {
        self.mode.contains(&Mode::Sweep)
    }
}

/// `--sweep-flags`: how the streams of a sweep case are registered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum SweepFlags {
    /// Every stream registered with 0xF (all FIXED, page aligned).
    Fixed,
    /// Every stream registered with 0 (parameters bound when the stream reaches the op).
    None,
    /// Streams 0, 2, 4, ... with 0xF; 1, 3, 5, ... with 0.
    Mixed,
}

impl SweepFlags {
    /// The registration flags of stream `index`.
    pub fn of(self, index: usize) -> u32 {
        match self {
            SweepFlags::Fixed => 0xF,
            SweepFlags::None => 0,
            SweepFlags::Mixed if index.is_multiple_of(2) => 0xF,
            SweepFlags::Mixed => 0,
        }
    }

    /// The `--sweep-flags` name.
    pub fn name(self) -> &'static str {
        match self {
            SweepFlags::Fixed => "fixed",
            SweepFlags::None => "none",
            SweepFlags::Mixed => "mixed",
        }
    }
}

/// `--device`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DeviceArg {
    /// cuda when libcuda finds a GPU, else cpu.
    Auto,
    /// The in-process cpu device.
    Cpu,
    /// NVIDIA GPUs through libcuda.
    Cuda,
}

/// `--direct`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DirectArg {
    /// O_DIRECT where the filesystem supports it.
    Auto,
    /// O_DIRECT (a warning, and the page cache, where the filesystem refuses it).
    On,
    /// The page cache only.
    Off,
}

/// An I/O pattern.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ValueEnum)]
pub enum Mode {
    /// Sequential reads.
    Read,
    /// Sequential writes.
    Write,
    /// Reads in a random order (every chunk once).
    Randread,
    /// Writes in a random order (every chunk once).
    Randwrite,
    /// The stream-count sweep (reads and writes on 1..256 streams, each case in a child
    /// process under `--case-timeout`); given alone.
    Sweep,
    /// Small random reads through batches of `--batch-entries` entries, against the
    /// async and sync paths and cuFile (sync with 8 threads, and its batch API); given
    /// alone. Ops per case: `--iterations`.
    Batch,
    /// Several GPUs: every device loads its own shard file (`--file-size` each, default
    /// 4G; 64M on the cpu device, where `HIPFILE_CPU_DEVICES` sets the device count) at
    /// once, against one device alone and the pinned-copy ceiling; given alone.
    Shards,
}

impl Mode {
    /// gdsio's IoType name.
    pub fn io_type(self) -> &'static str {
        match self {
            Mode::Read => "READ",
            Mode::Write => "WRITE",
            Mode::Randread => "RANDREAD",
            Mode::Randwrite => "RANDWRITE",
            Mode::Sweep => "SWEEP",
            Mode::Batch => "BATCH",
            Mode::Shards => "SHARDS",
        }
    }

    /// Reads (as opposed to writes).
    pub fn is_read(self) -> bool {
        matches!(self, Mode::Read | Mode::Randread)
    }

    /// Random order.
    pub fn is_random(self) -> bool {
        matches!(self, Mode::Randread | Mode::Randwrite)
    }
}

/// `4096`, `4K`, `4k`, `1M`, `1MiB`, `16MB`, `2G`, `1T` (binary units) to bytes.
///
/// # Errors
/// Empty, no digits, an unknown suffix, zero, or overflow.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let digits_end = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, suffix) = text.split_at(digits_end);
    if digits.is_empty() {
        return Err(format!("`{text}` is not a size (examples: 4096, 4K, 16M, 2G)"));
    }
    let shift = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        other => return Err(format!("unknown size suffix `{other}` (use K, M, G or T)")),
    };
    let value: u64 = digits.parse().map_err(|_| format!("`{text}` is too large"))?;
    let bytes = value.checked_mul(1u64 << shift).ok_or(format!("`{text}` is too large"))?;
    if bytes == 0 {
        return Err("a size must be at least 1 byte".into());
    }
    Ok(bytes)
}

/// `1048576` → `1M`, `4096` → `4K`, `1536` → `1536` (exact binary units only).
pub fn format_size(bytes: u64) -> String {
    for (shift, unit) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_suffixes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("16m"), Ok(16 << 20));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert!(parse_size("").is_err());
        assert!(parse_size("K").is_err());
        assert!(parse_size("0").is_err());
        assert!(parse_size("3X").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn sizes_format_in_exact_units() {
        assert_eq!(format_size(4096), "4K");
        assert_eq!(format_size(16 << 20), "16M");
        assert_eq!(format_size(1536), "1536");
        assert_eq!(format_size(3 << 30), "3G");
    }
}
