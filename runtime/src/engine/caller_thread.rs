//! Synchronous requests of at most one chunk moved on the caller's thread, without a
//! hand-off to an executor.

use std::os::fd::RawFd;

use hipfile_core::{ChunkMode, Direction, OpError, Outcome};

use super::{Engine, EngineStats, SyncRequest, executor};
use crate::device::DeviceError;

impl Engine {
    /// A request of at most one chunk, moved on the calling thread: `pread`/`pwrite`
    /// with a pinned fallback chunk and one device copy ([`DeviceCopies::copy_now`](crate::device::DeviceCopies::copy_now)). An
    /// executor would do the same work for it, one chunk with nothing to overlap, and
    /// the two hand-offs between threads cost more than the work for small requests
    /// (4 KiB on the H200: ~75 µs through an executor, against ~10 µs for `pread` + copy).
    /// `None` when the request is larger, the device cannot copy on the caller's thread,
    /// no fallback chunk is free, or the copy fails (as inside a stream callback, where
    /// CUDA forbids synchronizing; nothing was written then, and a read may be read
    /// again): the executors take the request then, and report real device errors.
    pub(super) fn run_on_caller_thread(
        &self,
        request: &SyncRequest,
    ) -> Option<(Outcome, Option<DeviceError>)> {
        let len = usize::try_from(request.len_bytes).ok()?;
        if len == 0 || len > self.chunk_bytes || !self.device.copies_on_caller_thread() {
            return None;
        }
        let Ok(guard) = request.file.begin_op() else {
            return Some((Outcome::Library(OpError::HandleNotRegistered), None));
        };
        let chunk = self.fallback.try_take().ok()??;
        let (fd, mode) = self.caller_thread_descriptor(request);
        let host = chunk.as_mut_ptr();
        // Read once: an op submitted meanwhile never waits on this copy (its release
        // depends only on engine copies, which always take the safe path), so a stall of
        // a direct copy behind it would end when it is released.
        let ops_may_hold_streams = self.ops_may_hold_streams();
        let copy = |direction, len_bytes| {
            crate::device::injected_fault(crate::fault::Site::DeviceCopy)?;
            // SAFETY: `host` is a pinned fallback chunk of chunk_bytes >= len_bytes, ours
            // until dropped below; the device range lies in the validated request.
            unsafe {
                self.device.copy_now(
                    request.device_ordinal,
                    direction,
                    request.device_addr,
                    host,
                    len_bytes,
                    ops_may_hold_streams,
                )
            }
        };
        let moved = match request.direction {
            Direction::Read => {
                // SAFETY: the chunk is ours and holds chunk_bytes >= len bytes.
                let target = unsafe { std::slice::from_raw_parts_mut(host, len) };
                match crate::file::pread_full(fd, target, request.file_offset_bytes) {
                    Ok(got) if got > 0 && copy(Direction::Read, got).is_err() => return None,
                    result => result,
                }
            }
            Direction::Write => {
                copy(Direction::Write, len).ok()?;
                // SAFETY: the copy filled `len` bytes of the chunk.
                let source = unsafe { std::slice::from_raw_parts(host, len) };
                crate::file::pwrite_full(fd, source, request.file_offset_bytes)
            }
        };
        drop(chunk);
        drop(guard);
        EngineStats::add(&self.stats.caller_thread_requests, 1);
        crate::stats::count_caller_thread_request();
        if ops_may_hold_streams {
            EngineStats::add(&self.stats.caller_thread_requests_beside_ops, 1);
        }
        Some(match moved {
            Ok(bytes) => {
                request.file.record_bytes(request.direction, mode, bytes as u64);
                (Outcome::Bytes(bytes as u64), None)
            }
            Err(error) => (executor::os_outcome(&error), None),
        })
    }

    /// The descriptor a caller-thread request uses: O_DIRECT when the file has one and
    /// the whole request is aligned as the executors' plan would require (offsets to the
    /// page and the file's DIO alignment, the length to the DIO alignment) and, for a
    /// read, the page cache does not hold the whole range
    /// ([`FileHandle::read_hits_page_cache`](crate::file::FileHandle::read_hits_page_cache)); else the buffered one.
    fn caller_thread_descriptor(&self, request: &SyncRequest) -> (RawFd, ChunkMode) {
        let file = &request.file;
        if let (Some(fd), Some(dio)) = (file.direct_fd(), file.dio_alignment()) {
            let offset_align = dio.offset_bytes.max(self.page_bytes);
            // Fallback chunks are page-aligned pinned memory.
            let aligned = request.file_offset_bytes.is_multiple_of(offset_align)
                && request.len_bytes.is_multiple_of(dio.offset_bytes)
                && dio.memory_bytes <= self.page_bytes;
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
