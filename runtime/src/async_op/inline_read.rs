//! Reads done inside the submit call (`HIPFILE_INLINE_READ_KB`, default 64 KiB).
//!
//! A read of at most that many bytes submitted to a stream with nothing left to run (no
//! op of ours unreleased on it, and the device says its work is complete), whose range no
//! unfinished write of ours overlaps, is read into a pinned
//! slot with `preadv2(RWF_NOWAIT)` — the page cache's bytes or nothing, never a wait for
//! the disk — and only the copy slot → destination and the slot's done write are
//! enqueued on the stream. No doorbell, no wait-value, no arm, no release: the op is over
//! for the host when the call returns (`*bytes_p` is stored then), and the stream copies
//! the bytes in its order, depending on nothing but its own earlier (finished) work.
//!
//! Why that keeps stream order (DESIGN.md: "a read returns the file's bytes as they are
//! when the stream reaches it"): the stream is idle (and, for a blocking stream, which also
//! waits for the NULL stream's earlier work under the legacy default stream's rules, so is
//! that NULL stream), so it reaches the op as soon as it is enqueued; the bytes are read
//! during the call that enqueues it. A change the application orders before the read (a
//! write whose stream it waits for, a sync write that returned) is done before the call;
//! any later one it cannot order before an op that its stream runs at once. A write of
//! ours still unfinished on any stream is checked for (the prefetch hazard table), as for
//! prefetch. The same holds for parameters the stream's flags do not fix: they bind when
//! the stream reaches the op, which an idle stream does at once, so their values in the
//! call are theirs then (an application that changes them after the call without
//! ordering the change before the op races with its own stream).
//!
//! Everything else takes the ordinary path (`submit`): a byte outside the page cache, a
//! read error (reported there), a busy stream, no free slot, a copy that cannot be
//! enqueued.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use hipfile_core::{ChunkMode, Direction, Outcome, ValidIo};

use super::slots::{SlotPool, StreamKey};
use super::{OpHost, ParamSource, prefetch};
use crate::buffer::ResolvedBuffer;
use crate::file::FileHandle;
use crate::stream::{StreamState, SubmitGuard};

/// The read a submission asks for.
pub(crate) type InlineRequest<'a> =
    (Direction, &'a ValidIo, &'a Arc<FileHandle>, &'a dyn ParamSource);

/// Where an inline read happens: the driver, its inline slots and the size cap.
pub(crate) struct InlineReads<'a> {
    pub(crate) host: &'a dyn OpHost,
    /// Pinned slots (the stream copies' pool, or one of the inline reads' own).
    pub(crate) pool: Option<&'a SlotPool>,
    /// `HIPFILE_INLINE_READ_KB` in bytes (0: off).
    pub(crate) cap_bytes: usize,
}

impl InlineReads<'_> {
    /// Reads `request` inside the submit call when it may (see the module's text): `true`
    /// when it did (its result is published, its copy enqueued on the stream), `false`
    /// when the ordinary path must take it (nothing of it was enqueued or published).
    /// The caller holds the stream's submit lock.
    pub(crate) fn try_read(
        &self,
        state: &StreamState,
        submit_lock: &SubmitGuard<'_>,
        buffer: &ResolvedBuffer,
        (direction, io, file, params): InlineRequest<'_>,
    ) -> bool {
        let size_bytes = io.size_bytes();
        if direction != Direction::Read || size_bytes > self.cap_bytes as u64 || !file.can_read() {
            return false;
        }
        let Some(pool) = self.pool else { return false };
        let device = self.host.device();
        // Cheap checks first: our own ops on the stream all released, no write of ours
        // pending on the range; then the device's word that the stream ran everything.
        if !device.supports_stream_memops(buffer.device_ordinal)
            || state.word().load() != submit_lock.peek_next().wrapping_sub(1)
            || !self.host.write_hazards().may_prefetch(file, prefetch::file_range(io))
            || !matches!(device.stream_done(state.handle), Ok(true))
            || (state.follows_null_stream
                && !matches!(device.null_stream_done_for(state.handle), Ok(true)))
        {
            return false;
        }
        // (Timed from here: a submission the call may not take pays no clock read.)
        let started = Instant::now();
        let len = size_bytes as usize;
        let Some(slot) = pool.try_take(len) else { return false };
        // SAFETY: the slot is pinned memory of the pool of at least `len` bytes, ours alone
        // until it is given back or its done word shows this use.
        let target = unsafe { std::slice::from_raw_parts_mut(slot.host_ptr, len) };
        let Some(read_bytes) =
            crate::file::pread_cached(file.buffered_fd(), target, io.file_offset_bytes())
        else {
            pool.give_back(&slot);
            return false;
        };
        if read_bytes == 0 {
            pool.give_back(&slot);
        } else {
            // SAFETY: the slot holds `read_bytes` read bytes and stays unlent until its done
            // word shows this use (enqueued after the copy); the device range lies inside
            // the validated request.
            let copied = crate::device::injected_fault(crate::fault::Site::DeviceCopy).and_then(
                |()| unsafe {
                    device.copy_on_stream(
                        state.handle,
                        Direction::Read,
                        io.device_addr(),
                        slot.host_ptr,
                        read_bytes,
                    )
                },
            );
            if copied.is_err() {
                pool.give_back(&slot);
                return false;
            }
            // SAFETY: the done word lives in the pool's slab as long as the driver.
            let noted = unsafe {
                device.stream_write_value32(
                    state.handle,
                    slot.done_word.device_addr,
                    slot.generation,
                )
            };
            match noted {
                Ok(()) => pool.retire(&slot, StreamKey::of(state)),
                Err(_) => pool.lose(),
            }
        }
        let read_bytes = read_bytes as u64;
        if read_bytes > 0 {
            file.record_bytes(Direction::Read, ChunkMode::Buffered, read_bytes);
        }
        crate::stats::global().record(
            buffer.device_ordinal,
            crate::stats::Api::Async,
            Direction::Read,
            size_bytes,
            Outcome::Bytes(read_bytes),
            started.elapsed(),
        );
        let stats = self.host.async_stats();
        stats.submitted.fetch_add(1, Ordering::Relaxed);
        stats.read_at_submission.fetch_add(1, Ordering::Relaxed);
        params.publish(read_bytes as isize);
        true
    }
}
