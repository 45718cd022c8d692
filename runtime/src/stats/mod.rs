//! Statistics of the process's I/O: counters and latency / size histograms per device,
//! API (sync, async, batch) and direction, and bytes per path (O_DIRECT, page cache,
//! caller's thread, engine), cheap enough to leave on (relaxed atomic adds).
//!
//! They live in one page of shared memory per process, `/dev/shm/hipfile-rs-stats.<pid>`
//! (a fixed `#[repr(C)]` layout of `u64`s, [`StatsPage`]), so another process reads
//! them live: `hipfile-bench stats PID` (like hipFile's `ais-stats` and the
//! `nvidia-fs` proc files). `HIPFILE_STATS=0` keeps them in private memory only; when
//! `/dev/shm` cannot be used they stay private too; `HIPFILE_STATS=off` records nothing
//! (to measure what recording costs). The file is removed at exit; files
//! of processes that are gone are removed by the next process that starts statistics.
//!
//! In process: [`snapshot()`] (Rust), `hipfileStatsGet*` (C, `hipfile_ext.h`).
//! Another process: [`StatsSnapshot::of_process`].
//!
//! This file holds the page's layout, the recording (counters, histogram buckets) and the
//! process's page; `snapshot.rs` reading it back, `shared_page.rs` mapping it in
//! `/dev/shm`.

mod shared_page;
mod snapshot;

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hipfile_core::{ChunkMode, Direction, Outcome};

pub use snapshot::{ClassSnapshot, StatsSnapshot, snapshot};

/// `"hipfile1"`: the page's first word.
pub(crate) const STATS_MAGIC: u64 = u64::from_le_bytes(*b"hipfile1");
/// Layout version (bumped with any change of [`StatsPage`]).
pub(crate) const STATS_VERSION: u64 = 1;
/// Devices counted separately (higher ordinals count as the last).
pub const STATS_DEVICES: usize = 8;
/// Latency buckets: bucket 0 is < 1 µs, bucket `i` is [2^(i-1), 2^i) µs, the last is
/// everything from 2^(N-2) µs (about 1 s) up.
pub(crate) const LATENCY_BUCKETS: usize = 22;
/// Size buckets: bucket 0 is < 1 KiB, bucket `i` is [2^(i+9), 2^(i+10)) bytes, the
/// last is everything from 2^(N+8) bytes (1 GiB) up.
pub(crate) const SIZE_BUCKETS: usize = 22;

/// The API a request came through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Api {
    /// `hipFileRead` / `hipFileWrite`.
    Sync = 0,
    /// `hipFileReadAsync` / `hipFileWriteAsync`.
    Async = 1,
    /// `hipFileBatchIOSubmit` entries.
    Batch = 2,
}

impl Api {
    /// Every API, in layout order.
    pub const ALL: [Api; 3] = [Api::Sync, Api::Async, Api::Batch];

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Api::Sync => "sync",
            Api::Async => "async",
            Api::Batch => "batch",
        }
    }
}

/// Counters of one (device, API, direction).
#[repr(C)]
#[derive(Debug, Default)]
pub(crate) struct ClassCounters {
    /// Requests finished (successful or not).
    pub(crate) ops: AtomicU64,
    /// Bytes moved by successful requests.
    pub(crate) bytes: AtomicU64,
    /// Requests that failed.
    pub(crate) errors: AtomicU64,
    /// Sum of latencies, ns (call to completion; async: submission to completion).
    pub(crate) latency_ns_sum: AtomicU64,
    /// Latency histogram (see [`LATENCY_BUCKETS`]).
    pub(crate) latency_buckets: [AtomicU64; LATENCY_BUCKETS],
    /// Request size histogram (see [`SIZE_BUCKETS`]).
    pub(crate) size_buckets: [AtomicU64; SIZE_BUCKETS],
}

/// Bytes and requests by the path they took.
#[repr(C)]
#[derive(Debug, Default)]
pub(crate) struct PathCounters {
    /// Bytes read with O_DIRECT.
    pub(crate) direct_read_bytes: AtomicU64,
    /// Bytes read through the page cache.
    pub(crate) buffered_read_bytes: AtomicU64,
    /// Bytes written with O_DIRECT.
    pub(crate) direct_write_bytes: AtomicU64,
    /// Bytes written through the page cache.
    pub(crate) buffered_write_bytes: AtomicU64,
    /// Sync requests moved on the caller's thread (one chunk: `pread` + one copy).
    pub(crate) caller_thread_requests: AtomicU64,
    /// Jobs run by the engine's executors.
    pub(crate) engine_jobs: AtomicU64,
    /// Chunks staged through the pinned fallback pool (the executor's arena was full).
    pub(crate) fallback_chunks: AtomicU64,
    /// Chunks redone with blocking `pread`/`pwrite` after io_uring refused them.
    pub(crate) sync_retry_chunks: AtomicU64,
}

/// The shared page: header, per-class counters, path counters.
#[repr(C)]
#[derive(Debug)]
pub struct StatsPage {
    /// [`STATS_MAGIC`] once the page is ready.
    pub(crate) magic: AtomicU64,
    /// [`STATS_VERSION`].
    pub(crate) version: AtomicU64,
    /// The process.
    pub(crate) pid: AtomicU64,
    /// When statistics started (Unix time, ns).
    pub(crate) started_unix_ns: AtomicU64,
    /// `[device][api][direction]` (direction 0 read, 1 write).
    pub(crate) classes: [[[ClassCounters; 2]; 3]; STATS_DEVICES],
    /// Paths.
    pub(crate) paths: PathCounters,
}

const _: () = assert!(
    size_of::<StatsPage>()
        == 8 * (4 + STATS_DEVICES * 3 * 2 * (4 + LATENCY_BUCKETS + SIZE_BUCKETS) + 8)
);

impl StatsPage {
    fn class(&self, device_ordinal: u32, api: Api, direction: Direction) -> &ClassCounters {
        let device = (device_ordinal as usize).min(STATS_DEVICES - 1);
        &self.classes[device][api as usize][direction_index(direction)]
    }

    /// Records one finished request.
    pub(crate) fn record(
        &self,
        device_ordinal: u32,
        api: Api,
        direction: Direction,
        size_bytes: u64,
        outcome: Outcome,
        latency: Duration,
    ) {
        if !recording() {
            return;
        }
        let class = self.class(device_ordinal, api, direction);
        add(&class.ops, 1);
        match outcome {
            Outcome::Bytes(n) => add(&class.bytes, n),
            Outcome::OsError(_) | Outcome::Library(_) => add(&class.errors, 1),
        }
        let nanos = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        add(&class.latency_ns_sum, nanos);
        add(&class.latency_buckets[latency_bucket(nanos)], 1);
        add(&class.size_buckets[size_bucket(size_bytes)], 1);
    }

    /// Records bytes moved by `mode` (see [`crate::file::FileHandle::record_bytes`]).
    pub(crate) fn record_path_bytes(&self, direction: Direction, mode: ChunkMode, bytes: u64) {
        if !recording() {
            return;
        }
        let p = &self.paths;
        let counter = match (direction, mode) {
            (Direction::Read, ChunkMode::Direct) => &p.direct_read_bytes,
            (Direction::Read, ChunkMode::Buffered) => &p.buffered_read_bytes,
            (Direction::Write, ChunkMode::Direct) => &p.direct_write_bytes,
            (Direction::Write, ChunkMode::Buffered) => &p.buffered_write_bytes,
        };
        add(counter, bytes);
    }

    /// Sets every counter to 0 (the header stays).
    pub fn reset(&self) {
        for word in &self.words()[4..] {
            word.store(0, Ordering::Relaxed);
        }
    }

    /// A copy of every word.
    pub(crate) fn snapshot(&self) -> StatsSnapshot {
        let words: Vec<u64> = self.words().iter().map(|w| w.load(Ordering::Relaxed)).collect();
        StatsSnapshot::from_words(&words)
    }

    /// Every word of the page (the 4-word header, then the counters), in layout order.
    fn words(&self) -> &[AtomicU64] {
        let count = size_of::<StatsPage>() / 8;
        // SAFETY: StatsPage is repr(C) made only of AtomicU64 (and arrays of it), so it
        // is `count` contiguous AtomicU64s.
        unsafe { std::slice::from_raw_parts(std::ptr::from_ref(self).cast::<AtomicU64>(), count) }
    }
}

fn direction_index(direction: Direction) -> usize {
    match direction {
        Direction::Read => 0,
        Direction::Write => 1,
    }
}

fn add(counter: &AtomicU64, value: u64) {
    counter.fetch_add(value, Ordering::Relaxed);
}

/// Whether requests are recorded: 0 = not decided yet (`HIPFILE_STATS` decides on first
/// use), 1 = yes, 2 = no ([`set_recording`]).
static RECORDING: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Whether requests are recorded (`HIPFILE_STATS` is not `off`, unless [`set_recording`]
/// said otherwise since).
fn recording() -> bool {
    match RECORDING.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => {
            let on = std::env::var("HIPFILE_STATS").map_or(true, |v| v != "off");
            // A concurrent set_recording wins over the environment.
            let _ = RECORDING.compare_exchange(
                0,
                if on { 1 } else { 2 },
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            RECORDING.load(Ordering::Relaxed) == 1
        }
    }
}

/// Turns the recording of requests on or off for the process from now on (what
/// `HIPFILE_STATS=off` does at start-up); returns whether it was on. Counters keep their
/// values. For measuring what recording costs within one run (`hipfile-bench --latency
/// --stats-ab`), or for leaving it off on a path that wants no shared writes.
pub fn set_recording(on: bool) -> bool {
    let was = recording();
    RECORDING.store(if on { 1 } else { 2 }, Ordering::Relaxed);
    was
}

/// Adds 1 to a path counter of the process's page, unless recording is off.
fn add_path(counter: impl FnOnce(&PathCounters) -> &AtomicU64) {
    if recording() {
        add(counter(&global().paths), 1);
    }
}

/// The latency bucket of `nanos`.
pub(crate) fn latency_bucket(nanos: u64) -> usize {
    let micros = nanos / 1000;
    let bucket = if micros == 0 { 0 } else { micros.ilog2() as usize + 1 };
    bucket.min(LATENCY_BUCKETS - 1)
}

/// The size bucket of `bytes`.
///
/// Public for the integration tests; embedders do not need it.
pub fn size_bucket(bytes: u64) -> usize {
    let kib = bytes >> 10;
    let bucket = if kib == 0 { 0 } else { kib.ilog2() as usize + 1 };
    bucket.min(SIZE_BUCKETS - 1)
}

/// Lower bound of latency bucket `i`, µs.
pub(crate) fn latency_bucket_floor_us(i: usize) -> u64 {
    if i == 0 { 0 } else { 1 << (i - 1) }
}

/// Lower bound of size bucket `i`, bytes.
#[cfg(test)]
fn size_bucket_floor_bytes(i: usize) -> u64 {
    if i == 0 { 0 } else { 1 << (i + 9) }
}

/// Counts one job run by an executor.
pub(crate) fn count_engine_job() {
    add_path(|p| &p.engine_jobs);
}

/// Counts one sync request moved on the caller's thread.
pub(crate) fn count_caller_thread_request() {
    add_path(|p| &p.caller_thread_requests);
}

/// Counts one chunk staged through the fallback pool.
pub(crate) fn count_fallback_chunk() {
    add_path(|p| &p.fallback_chunks);
}

/// Counts one chunk redone with blocking `pread`/`pwrite`.
pub(crate) fn count_sync_retry_chunk() {
    add_path(|p| &p.sync_retry_chunks);
}

/// The process's statistics page (made on first use).
pub fn global() -> &'static StatsPage {
    static PAGE: OnceLock<&'static StatsPage> = OnceLock::new();
    PAGE.get_or_init(shared_page::create)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_powers_of_two() {
        assert_eq!(latency_bucket(0), 0);
        assert_eq!(latency_bucket(999), 0);
        assert_eq!(latency_bucket(1_000), 1);
        assert_eq!(latency_bucket(1_999), 1);
        assert_eq!(latency_bucket(2_000), 2);
        assert_eq!(latency_bucket(10_000), 4, "10 us is in [8, 16)");
        assert_eq!(latency_bucket(u64::MAX), LATENCY_BUCKETS - 1);
        assert_eq!(size_bucket(0), 0);
        assert_eq!(size_bucket(1023), 0);
        assert_eq!(size_bucket(4096), 3, "4 KiB is in [4, 8) KiB");
        assert_eq!(size_bucket(16 << 20), 15);
        assert_eq!(size_bucket(u64::MAX), SIZE_BUCKETS - 1);
        for i in 1..LATENCY_BUCKETS {
            assert_eq!(latency_bucket(latency_bucket_floor_us(i) * 1000), i);
        }
        for i in 1..SIZE_BUCKETS {
            assert_eq!(size_bucket(size_bucket_floor_bytes(i)), i);
        }
    }

    #[test]
    fn quantiles_come_from_the_histogram() {
        let mut class = ClassSnapshot::default();
        assert_eq!(class.latency_quantile_us(0.5), None);
        class.latency_buckets[4] = 90; // [8, 16) us
        class.latency_buckets[7] = 10; // [64, 128) us
        assert_eq!(class.latency_quantile_us(0.5), Some(16));
        assert_eq!(class.latency_quantile_us(0.9), Some(16));
        assert_eq!(class.latency_quantile_us(0.99), Some(128));
    }

    #[test]
    fn a_snapshot_reads_back_what_was_recorded_in_layout_order() {
        let page: &'static StatsPage = Box::leak(Box::new(shared_page_for_test()));
        page.record(
            1,
            Api::Batch,
            Direction::Write,
            4096,
            Outcome::Bytes(4096),
            Duration::from_micros(10),
        );
        page.record(
            1,
            Api::Batch,
            Direction::Write,
            4096,
            Outcome::OsError(5),
            Duration::from_micros(3),
        );
        page.record_path_bytes(Direction::Write, ChunkMode::Direct, 4096);
        page.paths.engine_jobs.fetch_add(2, Ordering::Relaxed);
        let snap = page.snapshot();
        let class = snap.class(1, Api::Batch, Direction::Write);
        assert_eq!((class.ops, class.bytes, class.errors), (2, 4096, 1));
        assert_eq!(class.latency_ns_sum, 13_000);
        assert_eq!((class.latency_buckets[4], class.latency_buckets[2]), (1, 1));
        assert_eq!(class.size_buckets[3], 2);
        assert_eq!(snap.class(0, Api::Batch, Direction::Write).ops, 0);
        assert_eq!(snap.class(1, Api::Sync, Direction::Write).ops, 0);
        assert_eq!(snap.paths[2], 4096, "O_DIRECT write bytes");
        assert_eq!(snap.paths[5], 2, "engine jobs");
        page.reset();
        assert!(page.words()[4..].iter().all(|w| w.load(Ordering::Relaxed) == 0));
        let cleared = page.snapshot();
        assert_eq!(cleared.class(1, Api::Batch, Direction::Write), &ClassSnapshot::default());
    }

    fn shared_page_for_test() -> StatsPage {
        // SAFETY: all-zero AtomicU64s.
        unsafe { std::mem::zeroed() }
    }
}
