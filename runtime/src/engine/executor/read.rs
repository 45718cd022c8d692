//! The read pipeline: chunks read from the file (io_uring, blocking I/O where io_uring
//! refuses) into staging, then copied to the device, disk and copies overlapped.

use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::Arc;

use glommio::Task;
use glommio::io::ReadResult;
use hipfile_core::{Chunk, ChunkMode, Direction, OpError, Outcome};

use super::copies::{InFlightCopy, Staging};
use super::files::OpenFiles;
use super::{
    Executor, JobRange, glommio_errno, injected_chunk_fault, off_reactor, os_errno, uring_refuses,
};
use crate::device::{DeviceError, InternalStream};
use crate::engine::EngineStats;
use crate::engine::staging::StagingShare;
use crate::fault::Site;
use crate::file::{FileHandle, pread_full};
use crate::sys;

/// A chunk read in flight: the chunk, its share of the arena, the read.
type ChunkRead = (Chunk, StagingShare, Task<Result<Staging, i32>>);

impl Executor {
    pub(super) async fn read_range(
        self: &Rc<Self>,
        file: &Arc<FileHandle>,
        files: &Rc<OpenFiles>,
        stream: &InternalStream,
        range: JobRange,
        mut arm_gate: Option<&flume::Receiver<bool>>,
    ) -> (Outcome, Option<DeviceError>, VecDeque<InFlightCopy>) {
        let mut copies = VecDeque::new();
        let chunks = match self.plan(files, file, range, Direction::Read) {
            Ok(plan) => plan,
            Err(code) => return (Outcome::Library(code), None, copies),
        };
        let depth = self.setup.chunks_in_flight.max(1);
        let mut chunks = chunks.peekable();
        let mut reads: VecDeque<ChunkRead> = VecDeque::new();
        let mut total_bytes = 0u64;
        let mut stop = false;
        let mut failure: Option<(Outcome, Option<DeviceError>)> = None;
        loop {
            while !stop && reads.len() < depth {
                let Some(&chunk) = chunks.peek() else { break };
                let len = chunk.len_bytes as usize;
                let share = if arm_gate.is_some() {
                    self.staging_budget.take_for_prefetch(len)
                } else {
                    let holds_none = reads.is_empty() && copies.is_empty();
                    self.staging_budget.take(len, holds_none).await
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
            let result = task.await;
            if stop {
                continue;
            }
            match result {
                Err(errno) => {
                    failure = Some((Outcome::OsError(errno), None));
                    stop = true;
                }
                Ok(staging) => {
                    let got = staging_len(&staging).min(chunk.len_bytes as usize);
                    file.record_bytes(Direction::Read, chunk.mode, got as u64);
                    if let Some(gate) = arm_gate.take()
                        && gate.recv_async().await != Ok(true)
                    {
                        failure = Some((Outcome::Library(OpError::InternalError), None));
                        stop = true;
                        continue;
                    }
                    if got > 0 {
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
                            Ok(copy) => copies.push_back(copy),
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

    fn spawn_chunk_read(
        self: &Rc<Self>,
        files: &Rc<OpenFiles>,
        file: &Arc<FileHandle>,
        chunk: Chunk,
    ) -> Task<Result<Staging, i32>> {
        let me = Rc::clone(self);
        let files = Rc::clone(files);
        let file = Arc::clone(file);
        glommio::spawn_local(async move { me.read_chunk(&files, &file, chunk).await })
    }

    async fn read_chunk(
        &self,
        files: &OpenFiles,
        file: &Arc<FileHandle>,
        chunk: Chunk,
    ) -> Result<Staging, i32> {
        let len = chunk.len_bytes as usize;
        if !files.uring_refused.get()
            && let Some(buffered) = &files.buffered
        {
            let dma = match (chunk.mode, &files.direct) {
                (ChunkMode::Direct, Some(direct)) => direct,
                _ => buffered,
            };
            injected_chunk_fault(Site::ChunkRead).await?;
            match dma.read_at_aligned(chunk.file_offset_bytes, len).await {
                Ok(result) => return self.complete_short_read(file, chunk, result).await,
                Err(error) => {
                    let errno = glommio_errno(error);
                    if !uring_refuses(errno) {
                        return Err(errno);
                    }
                    files.uring_refused.set(true);
                }
            }
        }
        EngineStats::add(&self.setup.stats.sync_retry_chunks, 1);
        crate::stats::count_sync_retry_chunk();
        let staging = self.take_fallback().await.map_err(|_| libc::ENOMEM)?;
        let (file, offset) = (Arc::clone(file), chunk.file_offset_bytes);
        let (staging, got) = off_reactor(move || {
            // SAFETY: the fallback chunk is `chunk_bytes` long, >= len, and exclusively
            // ours (moved into this call, which hands it back).
            let target = unsafe { std::slice::from_raw_parts_mut(staging.as_mut_ptr(), len) };
            let got = pread_full(file.buffered_fd(), target, offset);
            (staging, got)
        })
        .await;
        let got = got.map_err(|e| os_errno(&e))?;
        Ok(Staging::Fallback(staging.with_valid_len(got)))
    }

    /// io_uring may return fewer bytes than asked before EOF (rare for files); finish the
    /// chunk with a blocking read of the rest into fallback staging in that case, off the
    /// reactor. (The size check is a `statx` of an open file, answered from its inode
    /// without waiting for the disk, as `plan`'s page-cache query is.)
    async fn complete_short_read(
        &self,
        file: &Arc<FileHandle>,
        chunk: Chunk,
        result: ReadResult,
    ) -> Result<Staging, i32> {
        let got = result.len();
        if got == 0 || got >= chunk.len_bytes as usize {
            return Ok(Staging::Read(result));
        }
        let size = file.size_bytes().map_err(|e| os_errno(&e))?;
        if chunk.file_offset_bytes + got as u64 >= size {
            return Ok(Staging::Read(result));
        }
        let staging = self.take_fallback().await.map_err(|_| libc::ENOMEM)?;
        let len = chunk.len_bytes as usize;
        // SAFETY: the fallback chunk holds `chunk_bytes` >= len bytes and is ours alone;
        // `result` holds `got` readable bytes.
        unsafe { sys::copy_bytes(staging.as_mut_ptr(), result.as_ptr(), got) };
        drop(result);
        let (file, offset) = (Arc::clone(file), chunk.file_offset_bytes + got as u64);
        let (staging, rest) = off_reactor(move || {
            // SAFETY: as above; the chunk is moved into this call, which hands it back.
            let target =
                unsafe { std::slice::from_raw_parts_mut(staging.as_mut_ptr().add(got), len - got) };
            let rest = pread_full(file.buffered_fd(), target, offset);
            (staging, rest)
        })
        .await;
        let rest = rest.map_err(|e| os_errno(&e))?;
        Ok(Staging::Fallback(staging.with_valid_len(got + rest)))
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
            .and_then(|()| device.record_event(stream))
        {
            Ok(event) => Ok(InFlightCopy::new(event, staging, share)),
            Err(error) => {
                self.settle_unrecorded_copy(stream, (staging, share));
                Err(error)
            }
        }
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
