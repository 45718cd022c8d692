//! The write pipeline: chunks copied from the device into staging, then written to the
//! file (io_uring, blocking I/O where io_uring refuses), copies and disk overlapped.

use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::Arc;

use glommio::Task;
use glommio::io::DmaBuffer;
use hipfile_core::{Chunk, ChunkMode, Direction, OpError, Outcome};

use super::copies::InFlightCopy;
use super::files::OpenFiles;
use super::{
    Executor, JobRange, glommio_errno, injected_chunk_fault, off_reactor, os_errno, uring_refuses,
};
use crate::device::{DeviceError, EventHandle, InternalStream};
use crate::engine::EngineStats;
use crate::engine::staging::{FallbackChunk, StagingShare};
use crate::fault::Site;
use crate::file::{FileHandle, pwrite_full};
use crate::sys;

impl Executor {
    pub(super) async fn write_range(
        self: &Rc<Self>,
        file: &Arc<FileHandle>,
        files: &Rc<OpenFiles>,
        stream: &InternalStream,
        range: JobRange,
    ) -> (Outcome, Option<DeviceError>, VecDeque<InFlightCopy>) {
        // Direct chunks first, buffered head and tail after them and never at the same
        // time (see `plan`): the page cache then never holds dirty pages of a range an
        // O_DIRECT write of this op is about to invalidate.
        let mut chunks = match self.plan(files, file, range, Direction::Write) {
            Ok(plan) => {
                let (direct, buffered): (VecDeque<_>, VecDeque<_>) =
                    plan.partition(|c| c.mode == ChunkMode::Direct);
                direct.into_iter().chain(buffered).collect::<VecDeque<_>>()
            }
            Err(code) => return (Outcome::Library(code), None, VecDeque::new()),
        };
        let depth = self.setup.chunks_in_flight.max(1);
        let mut staged: VecDeque<(Chunk, EventHandle, WriteStaging, StagingShare)> =
            VecDeque::new();
        let mut writes: VecDeque<(Chunk, Task<Result<usize, i32>>)> = VecDeque::new();
        let mut written = Written::default();
        let mut failure: Option<(Outcome, Option<DeviceError>)> = None;
        loop {
            while failure.is_none() && staged.len() < depth {
                let Some(&chunk) = chunks.front() else { break };
                let holds_none = staged.is_empty() && writes.is_empty();
                let len = chunk.len_bytes as usize;
                let Some(share) = self.staging_budget.take(len, holds_none).await else { break };
                chunks.pop_front();
                match self
                    .stage_from_device(
                        files,
                        stream,
                        range.device_addr + chunk.op_offset_bytes,
                        chunk,
                    )
                    .await
                {
                    Ok((event, staging)) => staged.push_back((chunk, event, staging, share)),
                    Err(error) => {
                        failure = Some((Outcome::Library(OpError::HipDriverError), Some(error)))
                    }
                }
            }
            if let Some((chunk, event, staging, share)) = staged.pop_front() {
                let waited = self.wait_event(&event).await;
                self.setup.device.destroy_event(event);
                if let (Err(error), None) = (waited, &failure) {
                    failure = Some((Outcome::Library(OpError::HipDriverError), Some(error)));
                }
                let mode_switch = writes.back().is_some_and(|(c, _)| c.mode != chunk.mode);
                if mode_switch {
                    self.drain_writes(file, &mut writes, &mut written, &mut failure).await;
                }
                if failure.is_none() {
                    let task = self.spawn_chunk_write(files, file, chunk, staging, share);
                    writes.push_back((chunk, task));
                }
            }
            if writes.len() >= depth || (staged.is_empty() && !writes.is_empty()) {
                let (chunk, task) = writes.pop_front().expect("checked non-empty");
                record_write(file, chunk, task.await, &mut written, &mut failure);
            }
            if staged.is_empty() && writes.is_empty() && (chunks.is_empty() || failure.is_some()) {
                break;
            }
        }
        // As pwrite: the bytes in place from the start of the range, short when a chunk
        // failed or wrote short after some were; an OS error only when none were.
        let prefix = written.prefix_bytes();
        match failure {
            Some((Outcome::OsError(_), None)) if prefix > 0 => {
                (Outcome::Bytes(prefix), None, VecDeque::new())
            }
            Some((outcome, device_error)) => (outcome, device_error, VecDeque::new()),
            None => (Outcome::Bytes(prefix), None, VecDeque::new()),
        }
    }

    async fn drain_writes(
        &self,
        file: &FileHandle,
        writes: &mut VecDeque<(Chunk, Task<Result<usize, i32>>)>,
        written: &mut Written,
        failure: &mut Option<(Outcome, Option<DeviceError>)>,
    ) {
        while let Some((chunk, task)) = writes.pop_front() {
            record_write(file, chunk, task.await, written, failure);
        }
    }

    /// Allocates staging for one chunk (arena DMA buffer, or fallback when the buffer
    /// glommio hands out lies outside the arena) and enqueues the device → host copy.
    async fn stage_from_device(
        &self,
        files: &OpenFiles,
        stream: &InternalStream,
        source: u64,
        chunk: Chunk,
    ) -> Result<(EventHandle, WriteStaging), DeviceError> {
        let len = chunk.len_bytes as usize;
        // DMA buffers come from the executor's io_memory whatever file hands them out.
        let mut buffer = match &files.buffered {
            Some(buffered) => buffered.alloc_dma_buffer(len),
            None => match self.utility.borrow().as_ref() {
                Some(utility) => utility.alloc_dma_buffer(len),
                None => {
                    return Err(DeviceError::new(
                        DeviceError::HIP_ERROR_OUT_OF_MEMORY,
                        "no DMA staging: neither the file nor /dev/shm opens with glommio",
                    ));
                }
            },
        };
        let in_arena = self.arena.get().is_some_and(|a| a.contains(buffer.as_ptr() as usize, len));
        let staging = if in_arena && !files.uring_refused.get() {
            EngineStats::add(&self.setup.stats.arena_chunks, 1);
            let target = buffer.as_bytes_mut().as_mut_ptr();
            crate::device::injected_fault(Site::DeviceCopy)?;
            // SAFETY: `buffer` is an arena (registered, pinned) buffer of `len` bytes that
            // the returned staging keeps alive until the copy's event is waited for.
            unsafe { self.setup.device.copy_from_device_async(stream, target, source, len)? };
            WriteStaging::Arena(buffer)
        } else {
            EngineStats::add(&self.setup.stats.fallback_chunks, 1);
            crate::stats::count_fallback_chunk();
            let chunk_memory = self.take_fallback().await?;
            crate::device::injected_fault(Site::DeviceCopy)?;
            // SAFETY: the fallback chunk is pinned, ours, and >= len bytes; kept alive in
            // the returned staging until the copy's event is waited for.
            unsafe {
                self.setup.device.copy_from_device_async(
                    stream,
                    chunk_memory.as_mut_ptr(),
                    source,
                    len,
                )?
            };
            WriteStaging::Fallback(buffer, chunk_memory)
        };
        let recorded = crate::device::injected_fault(Site::DeviceEvent)
            .and_then(|()| self.setup.device.record_event(stream));
        match recorded {
            Ok(event) => Ok((event, staging)),
            Err(error) => {
                self.settle_unrecorded_copy(stream, staging);
                Err(error)
            }
        }
    }
    fn spawn_chunk_write(
        self: &Rc<Self>,
        files: &Rc<OpenFiles>,
        file: &Arc<FileHandle>,
        chunk: Chunk,
        staging: WriteStaging,
        share: StagingShare,
    ) -> Task<Result<usize, i32>> {
        let me = Rc::clone(self);
        let files = Rc::clone(files);
        let file = Arc::clone(file);
        glommio::spawn_local(async move {
            let written = me.write_chunk(&files, &file, chunk, staging).await;
            drop(share);
            written
        })
    }

    async fn write_chunk(
        &self,
        files: &OpenFiles,
        file: &Arc<FileHandle>,
        chunk: Chunk,
        staging: WriteStaging,
    ) -> Result<usize, i32> {
        let len = chunk.len_bytes as usize;
        let (mut buffer, mut memory) = match staging {
            WriteStaging::Arena(buffer) => (buffer, None),
            WriteStaging::Fallback(buffer, memory) => (buffer, Some(memory)),
        };
        let uring = files.buffered.as_ref().filter(|_| !files.uring_refused.get());
        if uring.is_some()
            && let Some(memory) = memory.take()
        {
            // SAFETY: the copy into `memory` completed (its event was waited for); both
            // hold at least `len` bytes and do not overlap.
            unsafe {
                sys::copy_bytes(buffer.as_bytes_mut().as_mut_ptr(), memory.as_mut_ptr(), len)
            };
        }
        let buffer = Rc::new(buffer);
        let mut written = 0;
        if let Some(buffered) = uring {
            let dma = match (chunk.mode, &files.direct) {
                (ChunkMode::Direct, Some(direct)) => direct,
                _ => buffered,
            };
            injected_chunk_fault(Site::ChunkWrite).await?;
            match dma.write_rc_at(Rc::clone(&buffer), chunk.file_offset_bytes).await {
                Ok(n) if n >= len => return Ok(len),
                // Short write (a limit or a signal): finish the rest below.
                Ok(n) => written = n,
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
        // The rest goes through `pwrite` off the reactor, from pinned memory the call owns
        // (a DMA buffer cannot leave this thread): the fallback chunk the device copied
        // into, or one the rest is copied into.
        let memory = match memory {
            Some(memory) => memory,
            None => {
                let rest = self.take_fallback().await.map_err(|_| libc::ENOMEM)?;
                // SAFETY: both hold at least `len` bytes and do not overlap; the fallback
                // chunk is ours.
                unsafe {
                    sys::copy_bytes(
                        rest.as_mut_ptr().add(written),
                        buffer.as_bytes()[written..].as_ptr(),
                        len - written,
                    )
                };
                rest
            }
        };
        drop(buffer);
        let (file, offset) = (Arc::clone(file), chunk.file_offset_bytes + written as u64);
        let rest = off_reactor(move || {
            // SAFETY: bytes `written..len` of the chunk are in `memory`, which is moved
            // into this call and dropped at its end.
            let rest = unsafe {
                std::slice::from_raw_parts(memory.as_mut_ptr().add(written), len - written)
            };
            pwrite_full(file.buffered_fd(), rest, offset)
        })
        .await;
        Ok(written + rest.map_err(|e| os_errno(&e))?)
    }
}

/// The chunks of a write job that reached the file: (offset in the range, bytes).
#[derive(Default)]
struct Written(Vec<(u64, u64)>);

impl Written {
    /// Bytes in place from the start of the range without a gap (chunks complete in any
    /// order: direct ones first, buffered head and tail after).
    fn prefix_bytes(&mut self) -> u64 {
        self.0.sort_unstable();
        let mut end = 0;
        for &(offset, len) in &self.0 {
            if offset > end {
                break;
            }
            end = end.max(offset + len);
        }
        end
    }
}

fn record_write(
    file: &FileHandle,
    chunk: Chunk,
    result: Result<usize, i32>,
    written: &mut Written,
    failure: &mut Option<(Outcome, Option<DeviceError>)>,
) {
    match result {
        Ok(n) => {
            file.record_bytes(Direction::Write, chunk.mode, n as u64);
            written.0.push((chunk.op_offset_bytes, n as u64));
            if (n as u64) < chunk.len_bytes {
                // A short write (the disk is full): nothing after it is in place.
                failure.get_or_insert((Outcome::OsError(libc::ENOSPC), None));
            }
        }
        Err(errno) => {
            failure.get_or_insert((Outcome::OsError(errno), None));
        }
    }
}

pub(super) enum WriteStaging {
    Arena(DmaBuffer),
    Fallback(DmaBuffer, FallbackChunk),
}
