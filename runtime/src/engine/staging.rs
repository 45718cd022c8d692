//! Pinned staging memory: each executor's glommio `io_memory` arena registered with the
//! device, and a capped pool of extra pinned chunks for when an arena is exhausted.
//!
//! glommio allocates every read buffer (and the write buffers we ask for) from the
//! executor's arena while it has room, and from the ordinary heap once it is full. The
//! arena is registered with the device once, so copies go straight from the buffer
//! glommio filled; every buffer's address is checked against the registered range, and
//! one outside it is copied through a [`FallbackChunk`] instead. Correctness never
//! depends on the arena trick, only speed does.

use std::rc::Rc;
use std::sync::{Arc, Mutex};

use glommio::sync::{Semaphore, StaticPermit};

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

    /// Allocates every chunk up to the cap now (the engine's start), so that no job
    /// allocates pinned memory later: on CUDA an allocation can wait for a lock another
    /// thread's `cuStreamCreate` holds while it waits for streams our ops hold. Stops at
    /// the first failure (chunks are then allocated on demand, as before); returns the
    /// chunks allocated.
    pub(crate) fn prefill(&self) -> usize {
        let mut made = 0;
        loop {
            {
                let mut state = self.lock();
                if state.allocated_chunks >= self.cap_chunks {
                    return made;
                }
                state.allocated_chunks += 1;
            }
            match crate::device::injected_fault(crate::fault::Site::PinnedAlloc)
                .and_then(|()| self.device.alloc_pinned(self.chunk_bytes))
            {
                Ok(region) => {
                    self.lock().free.push(region);
                    made += 1;
                }
                Err(error) => {
                    self.lock().allocated_chunks -= 1;
                    log::debug!("pinned fallback chunk {made} not allocated ahead: {error}");
                    return made;
                }
            }
        }
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
        self.try_take_leaving(0)
    }

    /// [`FallbackPool::try_take`], but only while more than `reserve_chunks` chunks are
    /// free or may still be allocated: `Ok(None)` leaves those to others.
    ///
    /// # Errors
    /// The device could not allocate pinned memory.
    pub(crate) fn try_take_leaving(
        self: &Arc<Self>,
        reserve_chunks: usize,
    ) -> Result<Option<FallbackChunk>, DeviceError> {
        let mut state = self.lock();
        let available_chunks =
            state.free.len() + self.cap_chunks.saturating_sub(state.allocated_chunks);
        if available_chunks <= reserve_chunks {
            return Ok(None);
        }
        if let Some(region) = state.free.pop() {
            return Ok(Some(FallbackChunk { pool: Arc::clone(self), region, valid_len_bytes: 0 }));
        }
        if state.allocated_chunks >= self.cap_chunks {
            return Ok(None);
        }
        state.allocated_chunks += 1;
        drop(state);
        let allocated = crate::device::injected_fault(crate::fault::Site::PinnedAlloc)
            .and_then(|()| self.device.alloc_pinned(self.chunk_bytes));
        match allocated {
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

/// Admission to an executor's arena: a chunk takes its share before its read (or its
/// device → host copy) starts and gives it back when its staging is dropped, so that the
/// jobs of one executor together never ask glommio for more than the arena holds — past
/// it, glommio hands out heap memory that must be copied again into fallback chunks.
///
/// Rules that keep every job moving:
/// - a job that holds no share yet may wait for one; a job that holds some only takes
///   more when they are free (it goes on with what it has otherwise), so no job waits
///   while holding what another waits for;
/// - reads not yet reached by their stream (prefetch) take shares only when free, and
///   at most half of the arena: reached ops always find the other half.
///
/// Shares are counted in glommio's buddy blocks (a power of two, at least 4 KiB).
pub(crate) struct StagingBudget {
    arena: Rc<Semaphore>,
    prefetch: Rc<Semaphore>,
}

/// One chunk's share of the arena, given back on drop.
pub(crate) struct StagingShare {
    _arena: StaticPermit,
    _prefetch: Option<StaticPermit>,
}

/// Size of the unit shares are counted in.
const SHARE_UNIT_BYTES: usize = 4096;

impl StagingBudget {
    /// A budget over an arena of `arena_bytes` (at least two chunks, `Config::validate`).
    pub(crate) fn new(arena_bytes: usize) -> StagingBudget {
        let units = (arena_bytes / SHARE_UNIT_BYTES) as u64;
        StagingBudget {
            arena: Rc::new(Semaphore::new(units)),
            prefetch: Rc::new(Semaphore::new(units / 2)),
        }
    }

    fn units(len_bytes: usize) -> u64 {
        (len_bytes.max(SHARE_UNIT_BYTES).next_power_of_two() / SHARE_UNIT_BYTES) as u64
    }

    /// A share for a chunk of `len_bytes`: waits for it when `holds_none` (the job has
    /// no share in use), else takes it only if free. `None`: not free now.
    pub(crate) async fn take(&self, len_bytes: usize, holds_none: bool) -> Option<StagingShare> {
        let units = Self::units(len_bytes);
        let arena = if holds_none {
            self.arena.acquire_static_permit(units).await.ok()?
        } else {
            self.arena.try_acquire_static_permit(units).ok()?
        };
        Some(StagingShare { _arena: arena, _prefetch: None })
    }

    /// A share for a chunk read ahead of its stream: only if free, within the prefetch
    /// half.
    pub(crate) fn take_for_prefetch(&self, len_bytes: usize) -> Option<StagingShare> {
        let units = Self::units(len_bytes);
        let prefetch = self.prefetch.try_acquire_static_permit(units).ok()?;
        let arena = self.arena.try_acquire_static_permit(units).ok()?;
        Some(StagingShare { _arena: arena, _prefetch: Some(prefetch) })
    }

    /// Units free in the arena (tests).
    #[cfg(test)]
    fn free_units(&self) -> u64 {
        self.arena.available()
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::rc::Rc;

    use super::*;

    const MIB: usize = 1 << 20;

    fn on_glommio<F: Future<Output = ()> + 'static>(test: impl FnOnce() -> F + Send + 'static) {
        glommio::LocalExecutorBuilder::default()
            .spawn(move || async move { test().await })
            .expect("executor")
            .join()
            .expect("test ran");
    }

    #[test]
    fn shares_are_counted_in_buddy_blocks() {
        assert_eq!(StagingBudget::units(1), 1);
        assert_eq!(StagingBudget::units(4096), 1);
        assert_eq!(StagingBudget::units(4097), 2);
        assert_eq!(StagingBudget::units(MIB + 4096), 512, "rounded up to 2 MiB");
    }

    #[test]
    fn a_job_holding_shares_never_waits_and_prefetch_keeps_to_half() {
        on_glommio(|| async {
            let budget = StagingBudget::new(8 * MIB);
            let prefetched: Vec<_> =
                std::iter::from_fn(|| budget.take_for_prefetch(MIB)).take(16).collect();
            assert_eq!(prefetched.len(), 4, "prefetch stops at half the arena");
            let mut held = Vec::new();
            while let Some(share) = budget.take(MIB, false).await {
                held.push(share);
            }
            assert_eq!(held.len(), 4, "reached ops get the other half");
            assert_eq!(budget.free_units(), 0);
            assert!(budget.take_for_prefetch(MIB).is_none());
            drop(prefetched);
            assert_eq!(budget.free_units(), (4 * MIB / SHARE_UNIT_BYTES) as u64);
        });
    }

    #[test]
    fn a_take_leaving_a_reserve_stops_where_the_reserve_begins() {
        let device: Arc<dyn Device> = crate::device::cpu::CpuDevice::new(1);
        let pool = FallbackPool::new(device, 4096, 3 * 4096);
        let first = pool.try_take_leaving(2).unwrap().expect("3 available, 2 reserved");
        assert!(pool.try_take_leaving(2).unwrap().is_none(), "only the reserve is left");
        let others: Vec<_> = std::iter::from_fn(|| pool.try_take().unwrap()).collect();
        assert_eq!(others.len(), 2, "the reserve goes to takers without one");
        drop(first);
        assert!(pool.try_take_leaving(0).unwrap().is_some(), "a free chunk, nothing reserved");
        assert!(pool.try_take_leaving(1).unwrap().is_none(), "a free chunk, one reserved");
    }

    #[test]
    fn a_job_holding_nothing_waits_until_a_share_is_given_back() {
        on_glommio(|| async {
            let budget = Rc::new(StagingBudget::new(2 * MIB));
            let first = budget.take(MIB, true).await.expect("free");
            let second = budget.take(MIB, true).await.expect("free");
            assert!(budget.take(MIB, false).await.is_none(), "full: no share without waiting");
            let got = Rc::new(Cell::new(false));
            let waiter = {
                let (budget, got) = (Rc::clone(&budget), Rc::clone(&got));
                glommio::spawn_local(async move {
                    let share = budget.take(MIB, true).await;
                    got.set(share.is_some());
                })
            };
            glommio::timer::sleep(std::time::Duration::from_millis(5)).await;
            assert!(!got.get(), "waits while the arena is full");
            drop(first);
            waiter.await;
            assert!(got.get(), "woken by the share given back");
            drop(second);
        });
    }
}
