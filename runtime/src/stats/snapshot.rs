//! Reading the statistics: copies of the counters ([`ClassSnapshot`], [`StatsSnapshot`])
//! taken from this process's page or read from another process's shared page, and the
//! quantiles and means computed from them.

use hipfile_core::Direction;

use super::shared_page;
use super::{
    Api, LATENCY_BUCKETS, SIZE_BUCKETS, STATS_DEVICES, STATS_MAGIC, STATS_VERSION, StatsPage,
    direction_index, global, latency_bucket_floor_us,
};

/// A copy of one class's counters; `#[repr(C)]`, the layout of C's
/// `hipfileStatsClass_t` (`hipfile_ext.h`).
#[repr(C)]
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClassSnapshot {
    /// Requests finished.
    pub ops: u64,
    /// Bytes moved.
    pub bytes: u64,
    /// Failed requests.
    pub errors: u64,
    /// Sum of latencies, ns.
    pub latency_ns_sum: u64,
    /// Latency histogram.
    pub latency_buckets: [u64; LATENCY_BUCKETS],
    /// Size histogram.
    pub size_buckets: [u64; SIZE_BUCKETS],
}

impl ClassSnapshot {
    /// The latency below which `quantile` (0..=1) of the requests finished, as the upper
    /// bound of its histogram bucket, µs (`None` without requests).
    pub fn latency_quantile_us(&self, quantile: f64) -> Option<u64> {
        let total: u64 = self.latency_buckets.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = ((total as f64 * quantile).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (i, &count) in self.latency_buckets.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return Some(latency_bucket_floor_us(i + 1).max(1));
            }
        }
        None
    }

    /// Mean latency, µs.
    pub fn mean_latency_us(&self) -> Option<f64> {
        (self.ops > 0).then(|| self.latency_ns_sum as f64 / self.ops as f64 / 1000.0)
    }
}

/// A copy of the whole page.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// The process.
    pub pid: u64,
    /// When statistics started (Unix time, ns).
    pub started_unix_ns: u64,
    /// `[device][api][direction]`.
    pub classes: Vec<[[ClassSnapshot; 2]; 3]>,
    /// O_DIRECT read, buffered read, O_DIRECT write, buffered write bytes; caller-thread
    /// requests; engine jobs; fallback chunks; sync-retry chunks.
    pub paths: [u64; 8],
}

impl StatsSnapshot {
    /// One class.
    pub fn class(&self, device_ordinal: u32, api: Api, direction: Direction) -> &ClassSnapshot {
        let device = (device_ordinal as usize).min(STATS_DEVICES - 1);
        &self.classes[device][api as usize][direction_index(direction)]
    }

    /// The sum over devices of one (api, direction).
    pub fn total(&self, api: Api, direction: Direction) -> ClassSnapshot {
        let mut sum = ClassSnapshot::default();
        for device in &self.classes {
            let c = &device[api as usize][direction_index(direction)];
            sum.ops += c.ops;
            sum.bytes += c.bytes;
            sum.errors += c.errors;
            sum.latency_ns_sum += c.latency_ns_sum;
            for (total, part) in sum.latency_buckets.iter_mut().zip(c.latency_buckets) {
                *total += part;
            }
            for (total, part) in sum.size_buckets.iter_mut().zip(c.size_buckets) {
                *total += part;
            }
        }
        sum
    }

    /// Reads the live page of process `pid` (`/dev/shm/hipfile-rs-stats.<pid>`).
    ///
    /// # Errors
    /// No such file (the process is gone, did no I/O yet, or runs with
    /// `HIPFILE_STATS=0`), or a page of another layout.
    pub fn of_process(pid: u32) -> std::io::Result<StatsSnapshot> {
        let bytes = std::fs::read(shared_page::path_of(pid))?;
        let words: Vec<u64> = bytes
            .chunks_exact(8)
            .map(|w| u64::from_ne_bytes(w.try_into().expect("8 bytes")))
            .collect();
        let expected = size_of::<StatsPage>() / 8;
        if words.len() < expected || words[0] != STATS_MAGIC || words[1] != STATS_VERSION {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "not a hipfile-rs statistics page of this version",
            ));
        }
        Ok(StatsSnapshot::from_words(&words))
    }

    pub(super) fn from_words(words: &[u64]) -> StatsSnapshot {
        let mut next = words.iter().copied();
        let mut take = || next.next().unwrap_or(0);
        let (_magic, _version) = (take(), take());
        let (pid, started_unix_ns) = (take(), take());
        let mut class = || {
            let mut c =
                ClassSnapshot { ops: take(), bytes: take(), errors: take(), ..Default::default() };
            c.latency_ns_sum = take();
            c.latency_buckets = std::array::from_fn(|_| take());
            c.size_buckets = std::array::from_fn(|_| take());
            c
        };
        let classes = (0..STATS_DEVICES)
            .map(|_| std::array::from_fn(|_| std::array::from_fn(|_| class())))
            .collect();
        let paths = std::array::from_fn(|_| take());
        StatsSnapshot { pid, started_unix_ns, classes, paths }
    }
}

/// A copy of this process's statistics.
pub fn snapshot() -> StatsSnapshot {
    global().snapshot()
}
