//! The read pipeline: chunks read from the file (io_uring, blocking I/O where io_uring
//! refuses) into staging, then copied to the device, disk and copies overlapped.

use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use glommio::Task;
use glommio::io::ReadResult;
use hipfile_core::{Chunk, ChunkMode, Direction, OpError, Outcome};

use super::copies::{InFlightCopy, Staging};
use super::files::OpenFiles;
use super::{
    Executor, JobRange, glommio_errno, injected_chunk_fault, off_reactor, os_errno, uring_refuses,
};
use crate::device::{DeviceError, InternalStream};
use crate::engine::staging::StagingShare;
use crate::engine::{EngineStats, Phase};
use crate::fault::Site;
use crate::file::{FileHandle, pread_full};
use crate::sys;

/// A chunk read in flight: the chunk, its share of the arena, the read (`Ok(None)`: io_uring
/// could not serve the chunk, and the job reads it with blocking I/O, [`Executor::read_blocking`]).
type ChunkRead = (Chunk, StagingShare, Task<Result<Option<Staging>, i32>>);

impl Executor {
    pub(super) async fn read_range(
        self: &Rc<Self>,
        file: &Arc<FileHandle>,
        files: &Rc<OpenFiles>,
        stream: &InternalStream,
        range: JobRange,
        mut arm_gate: Option<&flume::Receiver<bool>>,
        gate_opened: &std::cell::Cell<Option<Instant>>,
    ) -> (Outcome, Option<DeviceError>, VecDeque<InFlightCopy>) {
        let mut copies = VecDeque::new();
        if arm_gate.is_none()
            && let Some(outcome) = self.read_into_host(files, file, range).await
        {
            return (outcome, None, copies);
        }
        let chunks = match self.plan(files, file, range, Direction::Read) {
            Ok(plan) => plan,
            Err(code) => return (Outcome::Library(code), None, copies),
        };
        let depth = self.setup.chunks_in_flight.max(1);
        let mut chunks = chunks.peekable();
        let mut reads: VecDeque<ChunkRead> = VecDeque::new();
        let mut total_bytes = 0u64;
        let mut stop = false;
        let mut gate_copy_timed = false;
        let mut failure: Option<(Outcome, Option<DeviceError>)> = None;
        loop {
            while !stop && reads.len() < depth {
                let Some(&chunk) = chunks.peek() else { break };
                let len = chunk.len_bytes as usize;
                let share = if arm_gate.is_some() {
                    self.staging_budget.take_for_prefetch(len)
                } else {
                    let holds_none = reads.is_empty() && copies.is_empty();
                    let asked = Instant::now();
                    let share = self.staging_budget.take(len, holds_none).await;
                    self.phases().add_since(Phase::StagingWait, asked);
                    share
                };
                let Some(share) = share else { break };
                chunks.next();
                reads.push_back((chunk, share, self.spawn_chunk_read(files, file, chunk)));
            }
            let Some((chunk, share, task)) = reads.pop_front() else {
                if stop || chunks.peek().is_none() {
                    break;
                }
                // No read in flight and no free share for the next chunk. A prefetch waits
                // until the stream reaches the op, then reads as a reached op; a reached op
                // waits for its oldest copy, which gives its share back.
                if let Some(gate) = arm_gate.take() {
                    if gate.recv_async().await != Ok(true) {
                        failure = Some((Outcome::Library(OpError::InternalError), None));
                        stop = true;
                    }
                } else if let Err(error) = {
                    let in_flight = copies.len();
                    self.reap(&mut copies, in_flight).await
                } {
                    failure = Some((Outcome::Library(OpError::HipDriverError), Some(error)));
                    stop = true;
                }
                continue;
            };
            let awaited = Instant::now();
            let result = task.await;
            self.phases().add_since(Phase::ReadWait, awaited);
            self.phases().count_chunk(Direction::Read);
            if stop {
                continue;
            }
            let result = match result {
                Ok(Some(staging)) => Ok(staging),
                Err(errno) => Err((Outcome::OsError(errno), None)),
                // Read here, in the job's order, once the stream reached a prefetching op.
                Ok(None) => {
                    if let Some(gate) = arm_gate.take()
                        && gate.recv_async().await != Ok(true)
                    {
                        failure = Some((Outcome::Library(OpError::InternalError), None));
                        stop = true;
                        continue;
                    }
                    self.read_blocking(file, chunk, &mut copies).await
                }
            };
            match result {
                Err(reason) => {
                    failure = Some(reason);
                    stop = true;
                }
                Ok(staging) => {
                    let got = staging_len(&staging).min(chunk.len_bytes as usize);
                    file.record_bytes(Direction::Read, chunk.mode, got as u64);
                    if let Some(gate) = arm_gate.take() {
                        if gate.recv_async().await != Ok(true) {
                            failure = Some((Outcome::Library(OpError::InternalError), None));
                            stop = true;
                            continue;
                        }
                        gate_opened.set(Some(Instant::now()));
                        self.phases().count_gate_opened();
                    }
                    if got > 0
                        && let Some(host) = range.host_memory
                    {
                        // SAFETY: the target holds the job's length, of which this chunk
                        // is a part; the staging holds `got` bytes.
                        unsafe {
                            let to = host.at(chunk.op_offset_bytes as usize);
                            std::ptr::copy_nonoverlapping(staging_ptr(&staging), to, got);
                        }
                        drop((staging, share));
                    } else if got > 0 {
                        let target = range.device_addr + chunk.op_offset_bytes;
                        let staging = match self.pinned_staging(staging, got, &mut copies).await {
                            Ok(staging) => staging,
                            Err(error) => {
                                failure =
                                    Some((Outcome::Library(OpError::HipDriverError), Some(error)));
                                stop = true;
                                continue;
                            }
                        };
                        match self.copy_to_device(stream, target, staging, share, got) {
                            Ok(copy) => {
                                copies.push_back(copy);
                                // The first copy after the gate opened.
                                if let Some(opened) = gate_opened.get()
                                    && !gate_copy_timed
                                {
                                    self.phases().add_since(Phase::GateToCopy, opened);
                                    gate_copy_timed = true;
                                }
                            }
                            Err(error) => {
                                failure =
                                    Some((Outcome::Library(OpError::HipDriverError), Some(error)));
                                stop = true;
                                continue;
                            }
                        }
                    }
                    total_bytes += got as u64;
                    stop |= (got as u64) < chunk.len_bytes;
                }
            }
            if let Err(error) = self.reap(&mut copies, depth).await {
                failure.get_or_insert((Outcome::Library(OpError::HipDriverError), Some(error)));
                stop = true;
            }
        }
        // A prefetching op publishes only after the stream reached it, whatever happened.
        if let Some(gate) = arm_gate.take() {
            let _ = gate.recv_async().await;
        }
        match failure {
            Some((outcome, device_error)) => (outcome, device_error, copies),
            None => (Outcome::Bytes(total_bytes), None, copies),
        }
    }

    /// A job that reads into host memory (the slot of a read copied on its own stream) a
    /// range its plan reads through the page cache alone: one `pread` straight into that
    /// memory on the executor's blocking thread, instead of io_uring reads into the
    /// staging arena and a copy from there — one memory copy per byte instead of two.
    /// `None` (the pipeline reads it) for other jobs and plans with O_DIRECT chunks.
    async fn read_into_host(
        &self,
        files: &OpenFiles,
        file: &Arc<FileHandle>,
        range: JobRange,
    ) -> Option<Outcome> {
        let host = range.host_memory?;
        let chunks = self.page_cache_chunks(files, file, range, Direction::Read)?;
        let (reader, offset, len) = (Arc::clone(file), range.file_offset_bytes, range.len_bytes);
        let awaited = Instant::now();
        let got = off_reactor(move || {
            // SAFETY: the host memory holds the job's length and only this job writes it
            // while the job runs (`HostMemory`); `host` moved into this call.
            let target = unsafe { std::slice::from_raw_parts_mut(host.at(0), len as usize) };
            pread_full(reader.buffered_fd(), target, offset)
        })
        .await;
        Some(self.host_memory_job_done(file, Direction::Read, awaited, chunks, got))
    }

    fn spawn_chunk_read(
        self: &Rc<Self>,
        files: &Rc<OpenFiles>,
        file: &Arc<FileHandle>,
        chunk: Chunk,
    ) -> Task<Result<Option<Staging>, i32>> {
        let me = Rc::clone(self);
        let files = Rc::clone(files);
        let file = Arc::clone(file);
        glommio::spawn_local(async move { me.read_chunk(&files, &file, chunk).await })
    }

    /// Reads a chunk through io_uring; `Ok(None)` when io_uring refuses the file or moved
    /// the chunk short before EOF: the job then reads it with [`Executor::read_blocking`].
    async fn read_chunk(
        &self,
        files: &OpenFiles,
        file: &Arc<FileHandle>,
        chunk: Chunk,
    ) -> Result<Option<Staging>, i32> {
        let len = chunk.len_bytes as usize;
        if files.uring_refused.get() {
            return Ok(None);
        }
        let Some(buffered) = &files.buffered else { return Ok(None) };
        let dma = match (chunk.mode, &files.direct) {
            (ChunkMode::Direct, Some(direct)) => direct,
            _ => buffered,
        };
        // An injected errno stands for io_uring's own answer (EINVAL: a refusal).
        let read = match injected_chunk_fault(Site::ChunkRead).await {
            Ok(short) => dma
                .read_at_aligned(chunk.file_offset_bytes, len)
                .await
                .map(|result| if short { shortened(result) } else { result })
                .map_err(glommio_errno),
            Err(errno) => Err(errno),
        };
        match read {
            Ok(result) => short_before_eof(file, chunk, result),
            Err(errno) if uring_refuses(errno) => {
                files.uring_refused.set(true);
                Ok(None)
            }
            Err(errno) => Err(errno),
        }
    }

    /// Reads a chunk io_uring could not serve with blocking `pread` on the executor's
    /// blocking thread, into a pinned fallback chunk.
    ///
    /// The job does it itself, in its order, and waits for a fallback chunk only after
    /// its own copies gave theirs back: its reads in flight hold none (they stage in the
    /// arena or glommio's memory), so it then waits holding none, and whoever holds the
    /// chunks it waits for moves on without it. Taken in the read task instead (as it
    /// once was), a chunk was waited for while the job held others that only it gives
    /// back: the copies it reaps after that very read, the reads after it that finished
    /// first. With fewer fallback chunks than reads in flight (one job's, or every
    /// executor's together) the pool emptied into such holders and every waiter waited
    /// for ever (`runtime/tests/engine_fallback.rs`).
    async fn read_blocking(
        &self,
        file: &Arc<FileHandle>,
        chunk: Chunk,
        copies: &mut VecDeque<InFlightCopy>,
    ) -> Result<Staging, (Outcome, Option<DeviceError>)> {
        EngineStats::add(&self.setup.stats.sync_retry_chunks, 1);
        crate::stats::count_sync_retry_chunk();
        let no_memory = || (Outcome::OsError(libc::ENOMEM), None);
        let staging = match self.setup.fallback.try_take() {
            Ok(Some(staging)) => staging,
            Ok(None) => {
                self.reap(copies, 1)
                    .await
                    .map_err(|error| (Outcome::Library(OpError::HipDriverError), Some(error)))?;
                self.take_fallback().await.map_err(|_| no_memory())?
            }
            Err(_) => return Err(no_memory()),
        };
        let len = chunk.len_bytes as usize;
        let (file, offset) = (Arc::clone(file), chunk.file_offset_bytes);
        let (staging, got) = off_reactor(move || {
            // SAFETY: the fallback chunk is `chunk_bytes` long, >= len, and exclusively
            // ours (moved into this call, which hands it back).
            let target = unsafe { std::slice::from_raw_parts_mut(staging.as_mut_ptr(), len) };
            let got = pread_full(file.buffered_fd(), target, offset);
            (staging, got)
        })
        .await;
        let got = got.map_err(|e| (Outcome::OsError(os_errno(&e)), None))?;
        Ok(Staging::Fallback(staging.with_valid_len(got)))
    }

    /// Returns staging the device may copy from: arena or fallback memory as is; other
    /// memory (glommio's heap, when the arena is full) copied into a fallback chunk,
    /// waiting for this job's own copies to finish when the pool is exhausted.
    async fn pinned_staging(
        &self,
        staging: Staging,
        len: usize,
        copies: &mut VecDeque<InFlightCopy>,
    ) -> Result<Staging, DeviceError> {
        let source = staging_ptr(&staging);
        let in_arena = self.arena.get().is_some_and(|a| a.contains(source as usize, len));
        if in_arena || matches!(staging, Staging::Fallback(_)) {
            return Ok(staging);
        }
        let chunk = match self.setup.fallback.try_take()? {
            Some(chunk) => chunk,
            None => {
                self.reap(copies, 1).await?;
                self.take_fallback().await?
            }
        };
        // SAFETY: `staging` holds `len` readable bytes; the chunk is ours and larger.
        unsafe { sys::copy_bytes(chunk.as_mut_ptr(), source, len) };
        Ok(Staging::Fallback(chunk.with_valid_len(len)))
    }

    /// Enqueues the copy of `len` pinned staged bytes to the device.
    fn copy_to_device(
        &self,
        stream: &InternalStream,
        target: u64,
        staging: Staging,
        share: StagingShare,
        len: usize,
    ) -> Result<InFlightCopy, DeviceError> {
        let device = &*self.setup.device;
        let counter = match staging {
            Staging::Fallback(_) => {
                crate::stats::count_fallback_chunk();
                &self.setup.stats.fallback_chunks
            }
            Staging::Read(_) => &self.setup.stats.arena_chunks,
        };
        EngineStats::add(counter, 1);
        crate::device::injected_fault(Site::DeviceCopy)?;
        // SAFETY: the staging (arena or pinned fallback chunk) holds `len` bytes and is
        // kept alive in the returned InFlightCopy until the event completes; `target`
        // lies in the job's validated device range.
        unsafe { device.copy_to_device_async(stream, target, staging_ptr(&staging), len)? };
        match crate::device::injected_fault(Site::DeviceEvent)
            .and_then(|()| self.record_copy_event(stream))
        {
            Ok(event) => Ok(InFlightCopy::new(event, staging, share)),
            Err(error) => {
                self.settle_unrecorded_copy(stream, (staging, share));
                Err(error)
            }
        }
    }
}

/// io_uring may return fewer bytes than asked before EOF (rare for files): `None`
/// then, and the job reads the whole chunk again with blocking I/O. (The size check is
/// a `statx` of an open file, answered from its inode without waiting for the disk, as
/// `plan`'s page-cache query is.)
fn short_before_eof(
    file: &FileHandle,
    chunk: Chunk,
    result: ReadResult,
) -> Result<Option<Staging>, i32> {
    let got = result.len();
    if got == 0 || got >= chunk.len_bytes as usize {
        return Ok(Some(Staging::Read(result)));
    }
    let size = file.size_bytes().map_err(|e| os_errno(&e))?;
    if chunk.file_offset_bytes + got as u64 >= size {
        return Ok(Some(Staging::Read(result)));
    }
    Ok(None)
}

/// `result` cut to its first half (whole pages; all of it under two pages), as an
/// injected [`crate::fault::Fault::Short`] asks.
fn shortened(result: ReadResult) -> ReadResult {
    match (result.len() / 2) & !4095 {
        0 => result,
        half => ReadResult::slice(&result, 0, half).unwrap_or(result),
    }
}

fn staging_len(staging: &Staging) -> usize {
    match staging {
        Staging::Read(result) => result.len(),
        Staging::Fallback(chunk) => chunk.valid_len(),
    }
}

fn staging_ptr(staging: &Staging) -> *const u8 {
    match staging {
        Staging::Read(result) => result.as_ptr(),
        Staging::Fallback(chunk) => chunk.as_mut_ptr(),
    }
}
