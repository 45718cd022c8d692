//! Pinned staging memory: each executor's glommio `io_memory` arena registered with the
//! device, and a capped pool of extra pinned chunks for when an arena is exhausted.
//!
//! glommio allocates every read buffer (and the write buffers we ask for) from the
//! executor's arena while it has room, and from the ordinary heap once it is full. The
//! arena is registered with the device once, so copies go straight from the buffer
//! glommio filled; every buffer's address is checked against the registered range, and
//! one outside it is copied through a [`FallbackChunk`] instead. Correctness never
//! depends on the arena trick, only speed does.

use std::sync::{Arc, Mutex};

use crate::device::{Device, DeviceError, PinnedRegion};

/// The executor's arena, as registered with the device.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Arena {
    base_addr: usize,
    len_bytes: usize,
}

impl Arena {
    /// Describes an arena found at `base_addr`.
    pub(crate) fn new(base_addr: usize, len_bytes: usize) -> Arena {
        Arena { base_addr, len_bytes }
    }

    /// `true` when `[addr, addr + len)` lies inside the registered arena.
    pub(crate) fn contains(&self, addr: usize, len_bytes: usize) -> bool {
        addr >= self.base_addr
            && addr.checked_add(len_bytes).is_some_and(|end| end <= self.base_addr + self.len_bytes)
    }

    /// First address.
    pub(crate) fn base_addr(&self) -> usize {
        self.base_addr
    }
}

/// A pool of pinned chunks shared by all executors, allocated lazily up to a cap and
/// reused forever (never freed on the I/O path).
pub(crate) struct FallbackPool {
    device: Arc<dyn Device>,
    chunk_bytes: usize,
    cap_chunks: usize,
    state: Mutex<PoolState>,
}

struct PoolState {
    free: Vec<PinnedRegion>,
    allocated_chunks: usize,
}

/// One chunk taken from the pool; goes back to the pool on drop.
pub(crate) struct FallbackChunk {
    pool: Arc<FallbackPool>,
    region: PinnedRegion,
    valid_len_bytes: usize,
}

impl FallbackPool {
    /// A pool of chunks of `chunk_bytes`, holding at most `cap_bytes` (at least one chunk).
    pub(crate) fn new(device: Arc<dyn Device>, chunk_bytes: usize, cap_bytes: usize) -> Arc<Self> {
        let cap_chunks = (cap_bytes / chunk_bytes).max(1);
        let state = Mutex::new(PoolState { free: Vec::new(), allocated_chunks: 0 });
        Arc::new(FallbackPool { device, chunk_bytes, cap_chunks, state })
    }

    /// The most pinned memory the pool will ever hold.
    pub(crate) fn cap_bytes(&self) -> usize {
        self.cap_chunks * self.chunk_bytes
    }

    /// Bytes of pinned memory the pool holds now (allocated chunks, free or taken).
    pub(crate) fn pinned_bytes(&self) -> usize {
        self.lock().allocated_chunks * self.chunk_bytes
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Takes a chunk: a free one, or a new one while under the cap. `Ok(None)` when
    /// the cap is reached and none is free (the caller waits: backpressure).
    ///
    /// # Errors
    /// The device could not allocate pinned memory.
    pub(crate) fn try_take(self: &Arc<Self>) -> Result<Option<FallbackChunk>, DeviceError> {
        let mut state = self.lock();
        if let Some(region) = state.free.pop() {
            return Ok(Some(FallbackChunk { pool: Arc::clone(self), region, valid_len_bytes: 0 }));
        }
        if state.allocated_chunks >= self.cap_chunks {
            return Ok(None);
        }
        state.allocated_chunks += 1;
        drop(state);
        match self.device.alloc_pinned(self.chunk_bytes) {
            Ok(region) => {
                Ok(Some(FallbackChunk { pool: Arc::clone(self), region, valid_len_bytes: 0 }))
            }
            Err(error) => {
                self.lock().allocated_chunks -= 1;
                Err(error)
            }
        }
    }
}

impl Drop for FallbackPool {
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|poisoned| poisoned.into_inner());
        for region in state.free.drain(..) {
            // SAFETY: every free region came from `alloc_pinned` on this device, is in the
            // free list once, and no copy uses it (a chunk in use holds an Arc of the pool,
            // so the pool cannot drop while one is out).
            unsafe { self.device.free_pinned(region) };
        }
    }
}

impl FallbackChunk {
    /// Host address of the chunk.
    pub(crate) fn as_mut_ptr(&self) -> *mut u8 {
        self.region.host_ptr
    }

    /// Records that the first `len_bytes` hold data.
    pub(crate) fn with_valid_len(mut self, len_bytes: usize) -> FallbackChunk {
        self.valid_len_bytes = len_bytes.min(self.region.len_bytes);
        self
    }

    /// Bytes of data recorded with [`FallbackChunk::with_valid_len`].
    pub(crate) fn valid_len(&self) -> usize {
        self.valid_len_bytes
    }
}

impl Drop for FallbackChunk {
    fn drop(&mut self) {
        self.pool.lock().free.push(self.region);
    }
}
