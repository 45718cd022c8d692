//! The engine's counters: what it did (jobs, chunks by staging path, retries) and where its
//! executors' time went (`hipfile-bench --profile`).

use std::sync::atomic::{AtomicU64, Ordering};

use hipfile_core::Direction;

/// Counters of the whole engine (tests and `hipfile-bench check` read them).
#[derive(Debug, Default)]
pub(crate) struct EngineStats {
    /// Jobs completed.
    pub(crate) jobs: AtomicU64,
    /// Chunks whose staging was the registered arena (zero-copy).
    pub(crate) arena_chunks: AtomicU64,
    /// Chunks copied through a fallback pinned chunk (arena exhausted).
    pub(crate) fallback_chunks: AtomicU64,
    /// Chunks redone with blocking pread/pwrite after io_uring refused them (EOPNOTSUPP).
    pub(crate) sync_retry_chunks: AtomicU64,
    /// Synchronous requests moved on the caller's thread.
    pub(crate) caller_thread_requests: AtomicU64,
    /// Of those, the ones of more than one chunk (`HIPFILE_CALLER_THREAD`).
    pub(crate) caller_thread_large_requests: AtomicU64,
    /// Of those, the ones moved while async ops were alive (their copies take the path no
    /// held application stream can stall).
    pub(crate) caller_thread_requests_beside_ops: AtomicU64,
    /// Queued requests split into fewer parts because at least half as many queued
    /// requests as executors were in flight (`HIPFILE_LOADED_FAN_OUT`).
    pub(crate) requests_split_under_load: AtomicU64,
    /// Jobs moved by a blocking executor (its glommio executor could not start).
    pub(crate) blocking_jobs: AtomicU64,
    /// Times a chunk waited for a fallback chunk: the pool was at its cap, every chunk
    /// taken (its backpressure).
    pub(crate) fallback_waits: AtomicU64,
    /// Jobs of glommio executors read with one `pread` straight into host memory (a slot
    /// of a read copied on its stream), not through the staging arena.
    pub(crate) host_memory_preads: AtomicU64,
    /// Jobs of glommio executors written with one `pwrite` straight from host memory (a
    /// slot of a write copied on its stream), not through the staging arena.
    pub(crate) host_memory_pwrites: AtomicU64,
    /// Where the executors' time goes (`hipfile-bench --profile`), in nanoseconds:
    /// see [`EnginePhases`].
    pub(crate) phases: EnginePhaseCounters,
}

/// The counters behind [`EnginePhases`].
#[derive(Debug, Default)]
pub(crate) struct EnginePhaseCounters {
    busy_ns: AtomicU64,
    job_ns: AtomicU64,
    read_wait_ns: AtomicU64,
    write_wait_ns: AtomicU64,
    copy_wait_ns: AtomicU64,
    staging_wait_ns: AtomicU64,
    gate_to_copy_ns: AtomicU64,
    gate_to_release_ns: AtomicU64,
    gates_opened: AtomicU64,
    chunks_read: AtomicU64,
    chunks_written: AtomicU64,
}

/// Where the glommio executors' time went, summed over executors (busy) or over jobs
/// (the rest), in nanoseconds. Jobs of one executor overlap, so the waits of its jobs
/// can add up to more than its busy time; a wait is time a job spent suspended on it
/// (the executor serves other jobs meanwhile).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EnginePhases {
    /// Time an executor had at least one job.
    pub busy_ns: u64,
    /// Jobs' time from start to completion.
    pub job_ns: u64,
    /// Jobs waiting for a chunk's file read (io_uring, or the blocking fallback).
    pub read_wait_ns: u64,
    /// Jobs waiting for a chunk's file write.
    pub write_wait_ns: u64,
    /// Jobs waiting for a device copy of staged bytes to complete.
    pub copy_wait_ns: u64,
    /// Jobs waiting for a share of the staging arena or a fallback chunk.
    pub staging_wait_ns: u64,
    /// Prefetched reads: from the job resuming at its opened gate (the stream reached
    /// the op) to its device copy enqueued.
    pub gate_to_copy_ns: u64,
    /// Prefetched reads: from the job resuming at its opened gate to its completion
    /// handed over (the op's release enqueued).
    pub gate_to_release_ns: u64,
    /// Prefetched reads timed in the two above.
    pub gates_opened: u64,
    /// Chunks read from files.
    pub chunks_read: u64,
    /// Chunks written to files.
    pub chunks_written: u64,
}

impl EnginePhases {
    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &EnginePhases) -> EnginePhases {
        EnginePhases {
            busy_ns: self.busy_ns.saturating_sub(earlier.busy_ns),
            job_ns: self.job_ns.saturating_sub(earlier.job_ns),
            read_wait_ns: self.read_wait_ns.saturating_sub(earlier.read_wait_ns),
            write_wait_ns: self.write_wait_ns.saturating_sub(earlier.write_wait_ns),
            copy_wait_ns: self.copy_wait_ns.saturating_sub(earlier.copy_wait_ns),
            staging_wait_ns: self.staging_wait_ns.saturating_sub(earlier.staging_wait_ns),
            gate_to_copy_ns: self.gate_to_copy_ns.saturating_sub(earlier.gate_to_copy_ns),
            gate_to_release_ns: self.gate_to_release_ns.saturating_sub(earlier.gate_to_release_ns),
            gates_opened: self.gates_opened.saturating_sub(earlier.gates_opened),
            chunks_read: self.chunks_read.saturating_sub(earlier.chunks_read),
            chunks_written: self.chunks_written.saturating_sub(earlier.chunks_written),
        }
    }
}

/// Which phase a wait is counted in.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Phase {
    Busy,
    Job,
    ReadWait,
    WriteWait,
    CopyWait,
    StagingWait,
    GateToCopy,
    GateToRelease,
}

impl EnginePhaseCounters {
    fn counter(&self, phase: Phase) -> &AtomicU64 {
        match phase {
            Phase::Busy => &self.busy_ns,
            Phase::Job => &self.job_ns,
            Phase::ReadWait => &self.read_wait_ns,
            Phase::WriteWait => &self.write_wait_ns,
            Phase::CopyWait => &self.copy_wait_ns,
            Phase::StagingWait => &self.staging_wait_ns,
            Phase::GateToCopy => &self.gate_to_copy_ns,
            Phase::GateToRelease => &self.gate_to_release_ns,
        }
    }

    /// Adds the time since `since` to `phase`.
    pub(crate) fn add_since(&self, phase: Phase, since: std::time::Instant) {
        let ns = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.counter(phase).fetch_add(ns, Ordering::Relaxed);
    }

    /// Counts a prefetched read whose gate opened.
    pub(crate) fn count_gate_opened(&self) {
        self.gates_opened.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a chunk read from (or written to) a file.
    pub(crate) fn count_chunk(&self, direction: Direction) {
        let counter = match direction {
            Direction::Read => &self.chunks_read,
            Direction::Write => &self.chunks_written,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn snapshot(&self) -> EnginePhases {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        EnginePhases {
            busy_ns: load(&self.busy_ns),
            job_ns: load(&self.job_ns),
            read_wait_ns: load(&self.read_wait_ns),
            write_wait_ns: load(&self.write_wait_ns),
            copy_wait_ns: load(&self.copy_wait_ns),
            staging_wait_ns: load(&self.staging_wait_ns),
            gate_to_copy_ns: load(&self.gate_to_copy_ns),
            gate_to_release_ns: load(&self.gate_to_release_ns),
            gates_opened: load(&self.gates_opened),
            chunks_read: load(&self.chunks_read),
            chunks_written: load(&self.chunks_written),
        }
    }
}

impl EngineStats {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// A snapshot of the engine's counters ([`Engine::stats`](crate::engine::Engine::stats)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineStatsSnapshot {
    /// Jobs completed.
    pub jobs: u64,
    /// Chunks staged in an arena.
    pub arena_chunks: u64,
    /// Chunks staged in fallback pinned chunks.
    pub fallback_chunks: u64,
    /// Chunks redone with blocking I/O.
    pub sync_retry_chunks: u64,
    /// Synchronous requests moved on the caller's thread.
    pub caller_thread_requests: u64,
    /// Of those, the ones of more than one chunk (`HIPFILE_CALLER_THREAD`).
    pub caller_thread_large_requests: u64,
    /// Of those, the ones moved while async ops were alive.
    pub caller_thread_requests_beside_ops: u64,
    /// Requests split into fewer parts under load (`HIPFILE_LOADED_FAN_OUT`).
    pub requests_split_under_load: u64,
    /// Jobs moved by a blocking executor.
    pub blocking_jobs: u64,
    /// Waits for a fallback chunk while the pool had none free.
    pub fallback_waits: u64,
    /// Jobs of glommio executors read with one `pread` straight into a slot.
    pub host_memory_preads: u64,
    /// Jobs of glommio executors written with one `pwrite` straight from a slot.
    pub host_memory_pwrites: u64,
}
