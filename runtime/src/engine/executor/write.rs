//! The write pipeline: chunks copied from the device into staging, then written to the
//! file (io_uring, blocking I/O where io_uring refuses), copies and disk overlapped.

use std::collections::VecDeque;
use std::mem::ManuallyDrop;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use glommio::Task;
use glommio::io::DmaBuffer;
use hipfile_core::{Chunk, ChunkMode, Direction, OpError, Outcome};

use super::copies::InFlightCopy;
use super::event_order::CopyEvent;
use super::files::OpenFiles;
use super::{
    Executor, JobRange, glommio_errno, injected_chunk_fault, off_reactor, os_errno, uring_refuses,
};
use crate::config::BufferedWrites;
use crate::device::{DeviceError, InternalStream};
use crate::engine::staging::{FallbackChunk, StagingShare};
use crate::engine::{EngineStats, Phase};
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
        if let Some(outcome) = self.write_from_host(files, file, range).await {
            return (outcome, None, VecDeque::new());
        }
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
        let mut staged: VecDeque<(Chunk, Option<CopyEvent>, WriteStaging, StagingShare)> =
            VecDeque::new();
        let mut writes: VecDeque<(Chunk, Task<Result<usize, i32>>)> = VecDeque::new();
        let mut written = Written::default();
        let mut failure: Option<(Outcome, Option<DeviceError>)> = None;
        loop {
            while failure.is_none() && staged.len() < depth {
                let Some(&chunk) = chunks.front() else { break };
                let holds_none = staged.is_empty() && writes.is_empty();
                let len = chunk.len_bytes as usize;
                let asked = Instant::now();
                let share = self.staging_budget.take(len, holds_none).await;
                self.phases().add_since(Phase::StagingWait, asked);
                let Some(share) = share else { break };
                let source = match range.host_memory {
                    // SAFETY: the host memory holds the job's length, of which this chunk
                    // is a part.
                    Some(host) => Source::Host(unsafe { host.at(chunk.op_offset_bytes as usize) }),
                    None => Source::Device(range.device_addr + chunk.op_offset_bytes),
                };
                match self.stage_from_device(files, stream, source, chunk, holds_none).await {
                    Ok(Some((event, staging))) => {
                        chunks.pop_front();
                        staged.push_back((chunk, event, staging, share));
                    }
                    // No fallback chunk free: write what the job holds first.
                    Ok(None) => break,
                    Err(error) => {
                        chunks.pop_front();
                        failure = Some((Outcome::Library(OpError::HipDriverError), Some(error)))
                    }
                }
            }
            if let Some((chunk, event, staging, share)) = staged.pop_front() {
                if let Some(event) = event {
                    let waited = self.wait_event(&event).await;
                    self.setup.device.destroy_event(event.handle);
                    if let (Err(error), None) = (waited, &failure) {
                        failure = Some((Outcome::Library(OpError::HipDriverError), Some(error)));
                    }
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
                let awaited = Instant::now();
                let result = task.await;
                self.phases().add_since(Phase::WriteWait, awaited);
                self.phases().count_chunk(Direction::Write);
                record_write(file, chunk, result, &mut written, &mut failure);
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
            let awaited = Instant::now();
            let result = task.await;
            self.phases().add_since(Phase::WriteWait, awaited);
            self.phases().count_chunk(Direction::Write);
            record_write(file, chunk, result, written, failure);
        }
    }

    /// A job that writes from host memory (the slot of a write copied on its stream) a
    /// range its plan writes through the page cache alone, with page-cache chunks written
    /// by `pwrite` ([`BufferedWrites::Thread`]): one `pwrite` straight from that memory on
    /// the executor's blocking thread, instead of a copy into the staging arena first.
    /// `None` (the pipeline writes it) for other jobs.
    async fn write_from_host(
        &self,
        files: &OpenFiles,
        file: &Arc<FileHandle>,
        range: JobRange,
    ) -> Option<Outcome> {
        let host = range.host_memory?;
        if self.setup.buffered_writes != BufferedWrites::Thread
            || files.buffered.is_none()
            || files.uring_refused.get()
        {
            return None;
        }
        let chunks = self.page_cache_chunks(files, file, range, Direction::Write)?;
        let (writer, offset, len) = (Arc::clone(file), range.file_offset_bytes, range.len_bytes);
        let awaited = Instant::now();
        let written = off_reactor(move || {
            // SAFETY: the host memory holds the job's length and nothing writes it while
            // the job runs (`HostMemory`); `host` moved into this call.
            let bytes = unsafe { std::slice::from_raw_parts(host.at(0), len as usize) };
            pwrite_full(writer.buffered_fd(), bytes, offset)
        })
        .await;
        Some(self.host_memory_job_done(file, Direction::Write, awaited, chunks, written))
    }

    /// Allocates staging for one chunk (arena DMA buffer, or fallback when the buffer
    /// glommio hands out lies outside the arena or io_uring refuses the file) and enqueues
    /// the device → host copy; from host memory ([`IoJob::host_memory`](crate::engine::IoJob::host_memory)) the bytes are
    /// copied in at once and there is no event.
    ///
    /// A fallback chunk is waited for only when the job `holds_none` (nothing staged or
    /// being written); otherwise it is taken only if free, and `Ok(None)` says none was:
    /// the job writes what it holds, which gives those chunks back, and stages this one
    /// again. Waiting while holding staged chunks (as it once did) waited for ever once
    /// the jobs waiting held every chunk of the pool: one job of more chunks than the pool
    /// holds was enough (`runtime/tests/engine_fallback.rs`).
    async fn stage_from_device(
        &self,
        files: &OpenFiles,
        stream: &InternalStream,
        source: Source,
        chunk: Chunk,
        holds_none: bool,
    ) -> Result<Option<(Option<CopyEvent>, WriteStaging)>, DeviceError> {
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
            match source {
                Source::Host(from) => {
                    // SAFETY: `from` holds the chunk's `len` bytes (see `write_range`); the
                    // buffer holds `len`.
                    unsafe { std::ptr::copy_nonoverlapping(from.cast_const(), target, len) };
                    return Ok(Some((None, WriteStaging::Arena(buffer))));
                }
                Source::Device(source) => {
                    crate::device::injected_fault(Site::DeviceCopy)?;
                    // SAFETY: `buffer` is an arena (registered, pinned) buffer of `len`
                    // bytes that the returned staging keeps alive until the copy's event
                    // is waited for.
                    unsafe {
                        self.setup.device.copy_from_device_async(stream, target, source, len)?
                    };
                }
            }
            WriteStaging::Arena(buffer)
        } else {
            let chunk_memory = if holds_none {
                self.take_fallback().await?
            } else {
                match self.setup.fallback.try_take()? {
                    Some(chunk_memory) => chunk_memory,
                    None => return Ok(None),
                }
            };
            EngineStats::add(&self.setup.stats.fallback_chunks, 1);
            crate::stats::count_fallback_chunk();
            match source {
                Source::Host(from) => {
                    // SAFETY: `from` holds the chunk's `len` bytes; the fallback chunk is
                    // ours and holds at least `len`.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            from.cast_const(),
                            chunk_memory.as_mut_ptr(),
                            len,
                        )
                    };
                    return Ok(Some((None, WriteStaging::Fallback(buffer, chunk_memory))));
                }
                Source::Device(source) => {
                    crate::device::injected_fault(Site::DeviceCopy)?;
                    // SAFETY: the fallback chunk is pinned, ours, and >= len bytes; kept
                    // alive in the returned staging until the copy's event is waited for.
                    unsafe {
                        self.setup.device.copy_from_device_async(
                            stream,
                            chunk_memory.as_mut_ptr(),
                            source,
                            len,
                        )?
                    };
                }
            }
            WriteStaging::Fallback(buffer, chunk_memory)
        };
        let recorded = crate::device::injected_fault(Site::DeviceEvent)
            .and_then(|()| self.record_copy_event(stream));
        match recorded {
            Ok(event) => Ok(Some((Some(event), staging))),
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
        let on_thread = chunk.mode != ChunkMode::Direct
            && self.setup.buffered_writes == BufferedWrites::Thread
            && files.buffered.is_some()
            && !files.uring_refused.get();
        // An injected errno stands for io_uring's own answer here too (EINVAL: a
        // refusal, and the blocking retry below).
        let injected = match on_thread {
            true => injected_chunk_fault(Site::ChunkWrite).await,
            false => Ok(false),
        };
        match injected {
            Err(errno) if uring_refuses(errno) => files.uring_refused.set(true),
            Err(errno) => return Err(errno),
            Ok(_) => {}
        }
        if on_thread && !files.uring_refused.get() {
            let (file, offset) = (Arc::clone(file), chunk.file_offset_bytes);
            let written = match memory {
                // The device copied into a pinned fallback chunk: the call owns it.
                Some(memory) => {
                    off_reactor(move || {
                        // SAFETY: the chunk holds the `len` bytes the device copied (its
                        // event was waited for) and is moved into this call.
                        let bytes = unsafe { std::slice::from_raw_parts(memory.as_mut_ptr(), len) };
                        pwrite_full(file.buffered_fd(), bytes, offset)
                    })
                    .await
                }
                None => pwrite_lent(buffer, len, file, offset).await,
            };
            return written.map_err(|e| os_errno(&e));
        }
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
            // An injected errno stands for io_uring's own answer (EINVAL: a refusal).
            let write = match injected_chunk_fault(Site::ChunkWrite).await {
                Ok(_) => dma
                    .write_rc_at(Rc::clone(&buffer), chunk.file_offset_bytes)
                    .await
                    .map_err(glommio_errno),
                Err(errno) => Err(errno),
            };
            match write {
                Ok(n) if n >= len => return Ok(len),
                // Short write (a limit or a signal): finish the rest below.
                Ok(n) => written = n,
                Err(errno) if uring_refuses(errno) => files.uring_refused.set(true),
                Err(errno) => return Err(errno),
            }
        }
        EngineStats::add(&self.setup.stats.sync_retry_chunks, 1);
        crate::stats::count_sync_retry_chunk();
        // The rest goes through `pwrite` off the reactor, from memory the call owns (a DMA
        // buffer cannot leave this thread): the fallback chunk the device copied into, or a
        // heap copy of the rest. Never a fallback chunk waited for here: the job may hold
        // others that it gives back only after this write (chunks staged after this one),
        // so that wait could last for ever (see `write_range`).
        let (file, offset) = (Arc::clone(file), chunk.file_offset_bytes + written as u64);
        let rest = match memory {
            Some(memory) => {
                drop(buffer);
                off_reactor(move || {
                    // SAFETY: bytes `written..len` of the chunk are in `memory`, which is
                    // moved into this call and dropped at its end.
                    let rest = unsafe {
                        std::slice::from_raw_parts(memory.as_mut_ptr().add(written), len - written)
                    };
                    pwrite_full(file.buffered_fd(), rest, offset)
                })
                .await
            }
            None => {
                let rest = buffer.as_bytes()[written..len].to_vec();
                drop(buffer);
                off_reactor(move || pwrite_full(file.buffered_fd(), &rest, offset)).await
            }
        };
        Ok(written + rest.map_err(|e| os_errno(&e))?)
    }
}

/// Where a chunk of a write comes from.
#[derive(Clone, Copy)]
enum Source {
    /// The job's device memory (a device → host copy into the staging).
    Device(u64),
    /// Pinned host memory holding the chunk ([`crate::engine::IoJob::host_memory`]).
    Host(*mut u8),
}

/// Writes the first `len` bytes of `buffer` at `offset` with `pwrite` on the executor's
/// blocking thread, from the buffer in place: a DMA buffer cannot leave the executor's
/// thread, so it stays here, lent to the call. Should this future be dropped before the
/// call ends, the buffer is leaked rather than freed under it.
async fn pwrite_lent(
    buffer: DmaBuffer,
    len: usize,
    file: Arc<FileHandle>,
    offset: u64,
) -> std::io::Result<usize> {
    let lent = Lent::new(buffer);
    let (at, returned) = (lent.owner.as_ptr() as usize, Arc::clone(&lent.returned));
    let written = off_reactor(move || {
        // SAFETY: `at` points at the buffer's `len` (<= its size) bytes, the device copy
        // into them completed, and `Lent` keeps them allocated until `returned` is set.
        let bytes = unsafe { std::slice::from_raw_parts(at as *const u8, len) };
        let written = pwrite_full(file.buffered_fd(), bytes, offset);
        returned.store(true, Ordering::Release);
        written
    })
    .await;
    drop(lent);
    written
}

/// Memory lent to a call on another thread: freed on drop once the call said it is done
/// with it (`returned`), leaked otherwise.
struct Lent<T> {
    owner: ManuallyDrop<T>,
    returned: Arc<AtomicBool>,
}

impl<T> Lent<T> {
    fn new(owner: T) -> Lent<T> {
        Lent { owner: ManuallyDrop::new(owner), returned: Arc::new(AtomicBool::new(false)) }
    }
}

impl<T> Drop for Lent<T> {
    fn drop(&mut self) {
        if self.returned.load(Ordering::Acquire) {
            // SAFETY: dropped once, here; the borrowing call has ended (`returned`).
            unsafe { ManuallyDrop::drop(&mut self.owner) };
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts its drops.
    struct Counted(Arc<std::sync::atomic::AtomicUsize>);

    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn lent_memory_is_freed_only_once_the_borrower_returned_it() {
        let drops = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let returned = Lent::new(Counted(Arc::clone(&drops)));
        returned.returned.store(true, Ordering::Release);
        drop(returned);
        assert_eq!(drops.load(Ordering::SeqCst), 1, "returned: freed");
        // Still lent (the call has not ended): leaked, never freed under the call.
        drop(Lent::new(Counted(Arc::clone(&drops))));
        assert_eq!(drops.load(Ordering::SeqCst), 1, "still lent: leaked");
    }
}
