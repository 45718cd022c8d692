//! The blocking executor: what serves an executor's jobs when its glommio executor could
//! not start (io_uring blocked by a container's seccomp profile, a memlock limit too low
//! to register its ring or arena, ...). A plain thread reads and writes with
//! `pread`/`pwrite` through the buffered descriptor into pinned fallback chunks and copies
//! each chunk to or from the device on an internal stream, synchronously: the same jobs,
//! results and completions as a glommio executor, without overlap of disk and copies.
//!
//! Prefetching reads (`arm_gate`) wait in a list, polled between jobs, until their stream
//! reaches them; the thread never blocks on a gate, so an op that a stream must reach
//! first is never stuck behind one that waits for it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use hipfile_core::{ChunkMode, Direction, OpError};

use super::queue::{JobReceiver, Received};
use super::staging::{FallbackChunk, FallbackPool};
use super::{EngineStats, IoJob, Outcome, executor};
use crate::device::{Device, DeviceError, InternalStream};

/// How often waiting prefetches are looked at while no job arrives.
const GATE_POLL: Duration = Duration::from_micros(200);
/// How long to wait for a fallback chunk another job holds before looking again.
const CHUNK_RETRY: Duration = Duration::from_micros(100);

/// What a blocking executor needs.
pub(super) struct BlockingSetup {
    pub(crate) index: usize,
    /// Internal streams made when the engine started, by device ordinal.
    pub(crate) streams: Vec<(u32, InternalStream)>,
    pub(crate) device: Arc<dyn Device>,
    pub(crate) fallback: Arc<FallbackPool>,
    pub(crate) stats: Arc<EngineStats>,
    pub(crate) chunk_bytes: usize,
    pub(crate) receiver: JobReceiver,
}

/// Starts the thread (named like the executors, so the device layer treats it as one).
pub(super) fn spawn(setup: BlockingSetup) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!("{}{}-blocking", crate::executor_thread::EXECUTOR_THREAD_PREFIX, setup.index))
        .spawn(move || {
            let mut setup = setup;
            let streams = std::mem::take(&mut setup.streams).into_iter().collect();
            BlockingExecutor { setup, streams }.run()
        })
}

struct BlockingExecutor {
    setup: BlockingSetup,
    streams: HashMap<u32, InternalStream>,
}

impl BlockingExecutor {
    fn run(mut self) {
        let mut gated: Vec<IoJob> = Vec::new();
        loop {
            self.start_reached(&mut gated);
            let timeout = if gated.is_empty() { None } else { Some(GATE_POLL) };
            match self.setup.receiver.recv_timeout(timeout) {
                Err(true) => break,
                Err(false) => continue,
                Ok(Received::Io(job)) if job.arm_gate.is_some() => gated.push(job),
                Ok(Received::Io(job)) => self.run_job(job),
                // Nothing cached: every job uses the handle's own descriptor.
                Ok(Received::Prune) => {}
            }
        }
        // Jobs still waiting for their stream end with hipFileInternalError when dropped
        // (their Completion), so nothing waits for them.
        drop(gated);
        for (_, stream) in self.streams.drain() {
            let _ = self.setup.device.synchronize_internal(&stream);
            self.setup.device.destroy_internal_stream(stream);
        }
    }

    /// Runs the waiting prefetches whose stream reached them; ends those abandoned or
    /// found stale (as the glommio executor does, without touching device memory).
    fn start_reached(&mut self, gated: &mut Vec<IoJob>) {
        let mut index = 0;
        while index < gated.len() {
            let gate = gated[index].arm_gate.as_ref().map(flume::Receiver::try_recv);
            match gate {
                Some(Err(flume::TryRecvError::Empty)) => index += 1,
                Some(Ok(true)) | None => {
                    let mut job = gated.swap_remove(index);
                    job.arm_gate = None;
                    self.run_job(job);
                }
                Some(Ok(false) | Err(flume::TryRecvError::Disconnected)) => {
                    let job = gated.swap_remove(index);
                    job.done.finish(Outcome::Library(OpError::InternalError), None, None);
                }
            }
        }
    }

    fn run_job(&mut self, job: IoJob) {
        let (outcome, device_error) = match self.move_range(&job) {
            Ok(bytes) => (Outcome::Bytes(bytes), None),
            Err(failure) => failure,
        };
        EngineStats::add(&self.setup.stats.jobs, 1);
        crate::stats::count_engine_job();
        EngineStats::add(&self.setup.stats.blocking_jobs, 1);
        // Every copy has completed: the completion releases host-side.
        job.done.finish(outcome, device_error, None);
    }

    /// Moves the job's range chunk by chunk; the bytes moved (short at end of file).
    fn move_range(&mut self, job: &IoJob) -> Result<u64, (Outcome, Option<DeviceError>)> {
        if let Some(host) = job.host_memory {
            return Self::move_with_host(job, host);
        }
        let device_failure =
            |error: DeviceError| (Outcome::Library(OpError::HipDriverError), Some(error));
        self.make_stream(job.device_ordinal).map_err(device_failure)?;
        let stream = &self.streams[&job.device_ordinal];
        let chunk = self.take_chunk().map_err(device_failure)?;
        let fd = job.file.buffered_fd();
        let chunk_bytes = self.setup.chunk_bytes as u64;
        let mut moved = 0u64;
        while moved < job.len_bytes {
            let len = (job.len_bytes - moved).min(chunk_bytes) as usize;
            let file_offset = job.file_offset_bytes + moved;
            let device_addr = job.device_addr + moved;
            let host = chunk.as_mut_ptr();
            let done = match job.direction {
                Direction::Read => {
                    // SAFETY: the chunk is ours and holds chunk_bytes >= len bytes.
                    let target = unsafe { std::slice::from_raw_parts_mut(host, len) };
                    let got = crate::file::pread_full(fd, target, file_offset)
                        .map_err(|error| (executor::os_outcome(&error), None))?;
                    if got > 0 {
                        self.copy(stream, Direction::Read, device_addr, host, got)
                            .map_err(device_failure)?;
                    }
                    got
                }
                Direction::Write => {
                    self.copy(stream, Direction::Write, device_addr, host, len)
                        .map_err(device_failure)?;
                    // SAFETY: the copy filled `len` bytes of the chunk.
                    let source = unsafe { std::slice::from_raw_parts(host, len) };
                    crate::file::pwrite_full(fd, source, file_offset)
                        .map_err(|error| (executor::os_outcome(&error), None))?
                }
            };
            job.file.record_bytes(job.direction, ChunkMode::Buffered, done as u64);
            moved += done as u64;
            if done < len {
                break;
            }
        }
        Ok(moved)
    }

    /// A job whose bytes are in pinned host memory (`IoJob::host_memory`): one `pread`
    /// into it or one `pwrite` from it, no staging chunk and no device copy.
    fn move_with_host(
        job: &IoJob,
        host: crate::engine::HostMemory,
    ) -> Result<u64, (Outcome, Option<DeviceError>)> {
        let len = usize::try_from(job.len_bytes).expect("a slot fits in memory");
        let fd = job.file.buffered_fd();
        let moved = match job.direction {
            Direction::Read => {
                // SAFETY: the host memory holds the job's length and is the job's to write.
                let target = unsafe { std::slice::from_raw_parts_mut(host.at(0), len) };
                crate::file::pread_full(fd, target, job.file_offset_bytes)
            }
            Direction::Write => {
                // SAFETY: the host memory holds the job's length, filled before the job.
                let source = unsafe { std::slice::from_raw_parts(host.at(0).cast_const(), len) };
                crate::file::pwrite_full(fd, source, job.file_offset_bytes)
            }
        }
        .map_err(|error| (executor::os_outcome(&error), None))?;
        job.file.record_bytes(job.direction, ChunkMode::Buffered, moved as u64);
        Ok(moved as u64)
    }

    /// One copy between the chunk and device memory, complete when this returns.
    fn copy(
        &self,
        stream: &InternalStream,
        direction: Direction,
        device_addr: u64,
        host: *mut u8,
        len_bytes: usize,
    ) -> Result<(), DeviceError> {
        let device = &self.setup.device;
        // SAFETY: `host` is a pinned fallback chunk holding at least `len_bytes`, ours
        // until the copy has completed (synchronized below); the device range lies inside
        // the job's validated request.
        let enqueued = unsafe {
            match direction {
                Direction::Read => {
                    device.copy_to_device_async(stream, device_addr, host, len_bytes)
                }
                Direction::Write => {
                    device.copy_from_device_async(stream, host, device_addr, len_bytes)
                }
            }
        };
        // Synchronized even after a failed enqueue: nothing of ours may still use the
        // chunk when it goes back to the pool.
        let synced = device.synchronize_internal(stream);
        enqueued.and(synced)
    }

    /// Creates the internal stream on `device_ordinal` unless `streams` holds it.
    fn make_stream(&mut self, device_ordinal: u32) -> Result<(), DeviceError> {
        if !self.streams.contains_key(&device_ordinal) {
            let stream = self.setup.device.create_internal_stream(device_ordinal)?;
            self.streams.insert(device_ordinal, stream);
        }
        Ok(())
    }

    /// A pinned fallback chunk, waiting while other jobs hold every chunk of the pool.
    fn take_chunk(&self) -> Result<FallbackChunk, DeviceError> {
        if self.setup.fallback.cap_bytes() < self.setup.chunk_bytes {
            return Err(DeviceError::new(
                DeviceError::HIP_ERROR_OUT_OF_MEMORY,
                "no pinned fallback staging (HIPFILE_PINNED_FALLBACK_MB is below one chunk)",
            ));
        }
        let mut waited = false;
        loop {
            if let Some(chunk) = self.setup.fallback.try_take()? {
                return Ok(chunk);
            }
            if !waited {
                waited = true;
                EngineStats::add(&self.setup.stats.fallback_waits, 1);
            }
            std::thread::sleep(CHUNK_RETRY);
        }
    }
}
