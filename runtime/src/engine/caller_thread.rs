//! Synchronous requests moved on the caller's thread, without a hand-off to an executor:
//! those of at most one chunk, and larger ones as `HIPFILE_CALLER_THREAD` says.

use std::os::fd::RawFd;

use hipfile_core::{ChunkMode, Direction, OpError, Outcome};

use super::{Engine, EngineStats, SyncRequest, executor};
use crate::config::CallerThread;
use crate::device::DeviceError;

impl Engine {
    /// A request moved on the calling thread, chunk by chunk: `pread`/`pwrite` with a
    /// pinned fallback chunk and one device copy per chunk
    /// ([`DeviceCopies::copy_now`](crate::device::DeviceCopies::copy_now)).
    ///
    /// Requests of at most one chunk always: an executor would do the same work for it,
    /// one chunk with nothing to overlap, and the two hand-offs between threads cost more
    /// than the work for small requests (4 KiB on the H200: ~75 µs through an executor,
    /// against ~10 µs for `pread` + copy). Larger ones as `HIPFILE_CALLER_THREAD` says
    /// ([`Engine::caller_thread_takes`]).
    ///
    /// `None` when the request is not the caller's, the device cannot copy on the
    /// caller's thread, no fallback chunk is free (for a request of many chunks: none
    /// beyond one per executor, which the executors' own fallback needs), a copy fails
    /// (as inside a stream callback, where CUDA forbids synchronizing), or the kernel
    /// refuses an O_DIRECT transfer (EINVAL, EOPNOTSUPP): the executors take the whole
    /// request then, report real device errors, and go through the page cache where
    /// O_DIRECT is refused. Redoing it is safe: a read's earlier chunks are read again
    /// into the same device bytes, a write's earlier chunks written again from the same
    /// device bytes.
    pub(super) fn run_on_caller_thread(
        &self,
        request: &SyncRequest,
    ) -> Option<(Outcome, Option<DeviceError>)> {
        // The load check of `busy` (one atomic per executor) last.
        if request.len_bytes == 0
            || !self.device.copies_on_caller_thread()
            || !self.caller_thread_takes(request.len_bytes)
        {
            return None;
        }
        let Ok(guard) = request.file.begin_op() else {
            return Some((Outcome::Library(OpError::HandleNotRegistered), None));
        };
        let chunk_bytes = self.chunk_bytes as u64;
        // A request of many chunks holds its chunk for all of them: it leaves one per
        // executor (blocking executors take one for every chunk they move), which the pool
        // holds on top of its cap under `busy` and `always` (`Config::fallback_pool_bytes`).
        let reserve_chunks = if request.len_bytes > chunk_bytes { self.executors.len() } else { 0 };
        let chunk = self.fallback.try_take_leaving(reserve_chunks).ok()??;
        let (fd, mode) = self.caller_thread_descriptor(request);
        let host = chunk.as_mut_ptr();
        // Asked for each piece, as the request may last long enough for an async op to
        // be submitted meanwhile. Such an op never waits on this copy (its release depends
        // only on engine copies, which always take the safe path), so a stall of a direct
        // copy behind it would end when it is released.
        let beside_ops = std::cell::Cell::new(false);
        let copy = |direction, request_offset_bytes: u64, len_bytes| {
            crate::device::injected_fault(crate::fault::Site::DeviceCopy)?;
            let ops_may_hold_streams = self.ops_may_hold_streams();
            beside_ops.set(beside_ops.get() || ops_may_hold_streams);
            // SAFETY: `host` is a pinned fallback chunk of chunk_bytes >= len_bytes, ours
            // until dropped below; the device range lies in the validated request.
            unsafe {
                self.device.copy_now(
                    request.device_ordinal,
                    direction,
                    request.device_addr + request_offset_bytes,
                    host,
                    len_bytes,
                    ops_may_hold_streams,
                )
            }
        };
        let mut moved_bytes = 0u64;
        let mut failure = None;
        while moved_bytes < request.len_bytes {
            let file_offset = request.file_offset_bytes + moved_bytes;
            // A request of at most one chunk goes whole; the pieces of a larger one end on
            // chunk boundaries in the file, so an O_DIRECT request (aligned as a whole)
            // stays aligned piece by piece.
            let remaining = request.len_bytes - moved_bytes;
            let piece_bytes = if request.len_bytes <= chunk_bytes {
                remaining
            } else {
                (chunk_bytes - file_offset % chunk_bytes).min(remaining)
            };
            let piece = piece_bytes as usize;
            let result = match request.direction {
                Direction::Read => {
                    // SAFETY: the chunk is ours and holds chunk_bytes >= piece bytes.
                    let target = unsafe { std::slice::from_raw_parts_mut(host, piece) };
                    match crate::file::pread_full(fd, target, file_offset) {
                        Ok(got) if got > 0 && copy(Direction::Read, moved_bytes, got).is_err() => {
                            return None;
                        }
                        result => result,
                    }
                }
                Direction::Write => {
                    copy(Direction::Write, moved_bytes, piece).ok()?;
                    // SAFETY: the copy filled `piece` bytes of the chunk.
                    let source = unsafe { std::slice::from_raw_parts(host, piece) };
                    crate::file::pwrite_full(fd, source, file_offset)
                }
            };
            match result {
                Ok(0) if request.direction == Direction::Write && moved_bytes == 0 => {
                    // No byte written: the disk is full, as the executors report it.
                    failure = Some(std::io::Error::from_raw_os_error(libc::ENOSPC));
                    break;
                }
                Ok(bytes) => {
                    moved_bytes += bytes as u64;
                    if (bytes as u64) < piece_bytes {
                        break; // end of file (or of the disk, for a write)
                    }
                }
                Err(error)
                    if mode == ChunkMode::Direct
                        && error.raw_os_error().is_some_and(super::transfer_refused) =>
                {
                    // The executors go through the page cache where O_DIRECT is refused.
                    return None;
                }
                Err(error) => {
                    failure = Some(error);
                    break;
                }
            }
        }
        drop(chunk);
        drop(guard);
        EngineStats::add(&self.stats.caller_thread_requests, 1);
        crate::stats::count_caller_thread_request();
        if beside_ops.get() {
            EngineStats::add(&self.stats.caller_thread_requests_beside_ops, 1);
        }
        if request.len_bytes > chunk_bytes {
            EngineStats::add(&self.stats.caller_thread_large_requests, 1);
        }
        if moved_bytes > 0 {
            request.file.record_bytes(request.direction, mode, moved_bytes);
        }
        // As for a request in parts (`parts::combine`): a read that failed reports the
        // failure; a write that wrote bytes before failing reports them, as `pwrite` does.
        Some(match failure {
            Some(error) if request.direction == Direction::Read || moved_bytes == 0 => {
                (executor::os_outcome(&error), None)
            }
            _ => (Outcome::Bytes(moved_bytes), None),
        })
    }

    /// Whether a sync request of `len_bytes` is moved on the caller's thread
    /// (`HIPFILE_CALLER_THREAD`): at most one chunk always; larger ones with `always`, or
    /// with `busy` while every executor has a job in flight (its parts would queue behind
    /// that work, and the caller's thread, which would wait for them, is a core of its own).
    fn caller_thread_takes(&self, len_bytes: u64) -> bool {
        if len_bytes <= self.chunk_bytes as u64 {
            return true;
        }
        match self.caller_thread {
            CallerThread::Small => false,
            CallerThread::Always => true,
            CallerThread::Busy => self.watches.iter().all(|watch| watch.jobs_in_flight() > 0),
        }
    }

    /// The descriptor a caller-thread request uses: O_DIRECT when the file has one and
    /// the whole request is aligned as the executors' plan would require (offsets to the
    /// page and the file's DIO alignment, the length to the DIO alignment, the chunk at
    /// least one DIO block, so that every piece, which ends on a chunk boundary, stays
    /// aligned) and, for a read, the page cache does not hold the whole range
    /// ([`FileHandle::read_hits_page_cache`](crate::file::FileHandle::read_hits_page_cache)); else the buffered one.
    fn caller_thread_descriptor(&self, request: &SyncRequest) -> (RawFd, ChunkMode) {
        let file = &request.file;
        if let (Some(fd), Some(dio)) = (file.direct_fd(), file.dio_alignment()) {
            let offset_align = dio.offset_bytes.max(self.page_bytes);
            // Fallback chunks are page-aligned pinned memory.
            let aligned = request.file_offset_bytes.is_multiple_of(offset_align)
                && request.len_bytes.is_multiple_of(dio.offset_bytes)
                && dio.memory_bytes <= self.page_bytes
                && self.chunk_bytes as u64 >= dio.offset_bytes;
            if !aligned {
                file.note_unaligned_request(request.file_offset_bytes, request.len_bytes);
            } else if request.direction == Direction::Write
                || !file.read_hits_page_cache(request.file_offset_bytes, request.len_bytes)
            {
                return (fd, ChunkMode::Direct);
            }
        }
        (file.buffered_fd(), ChunkMode::Buffered)
    }
}
