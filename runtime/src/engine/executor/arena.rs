//! The executor's staging arena: glommio's io_memory, found and registered with the
//! device so that chunks staged in it are copied without another copy.

use glommio::io::{DmaFile, OpenOptions};

use super::Executor;
use crate::engine::staging::Arena;

impl Executor {
    /// Opens an anonymous file on tmpfs (no O_DIRECT, so glommio runs no poll probe) to
    /// allocate DMA buffers from, and finds and registers the arena with it.
    pub(super) async fn open_utility_file(&self) {
        let opened =
            OpenOptions::new().read(true).write(true).tmpfile(true).dma_open("/dev/shm").await;
        if let Ok(file) = opened {
            self.discover_arena(&file);
            *self.utility.borrow_mut() = Some(file);
        }
    }

    /// On a fresh arena, allocating half of it returns the first byte it hands out
    /// (glommio's buddy allocator); verified by a second allocation landing inside the
    /// range.
    ///
    /// The range registered is only bytes the arena owns: glommio allocates
    /// `arena_bytes` page-aligned and the buddy allocator keeps its bookkeeping in the
    /// first page(s), so the first byte handed out is at least [`ARENA_PAGE_BYTES`] past
    /// the allocation's start and the allocation ends at most `arena_bytes -
    /// ARENA_PAGE_BYTES` past that byte. Registering `arena_bytes` from it would pin the
    /// page after the arena, which belongs to someone else (a copy from it would then be
    /// taken for staging, and on CUDA `cuMemHostRegister` would pin a foreign page).
    pub(super) fn discover_arena(&self, file: &DmaFile) {
        if self.arena.get().is_some() {
            return;
        }
        let Some(len_bytes) = arena_usable_bytes(self.setup.arena_bytes) else {
            return;
        };
        let half = file.alloc_dma_buffer(self.setup.arena_bytes / 2);
        let base_addr = half.as_ptr() as usize;
        drop(half);
        let probe = file.alloc_dma_buffer(4096);
        let arena = Arena::new(base_addr, len_bytes);
        let inside = arena.contains(probe.as_ptr() as usize, 4096);
        drop(probe);
        if !inside {
            return;
        }
        // SAFETY: the arena is glommio's io_memory allocation for this executor, which
        // lives as long as the executor; we unregister it in `teardown` after every copy
        // using it has completed.
        let registered =
            unsafe { self.setup.device.register_host(base_addr as *mut u8, len_bytes) };
        if registered.is_ok() {
            self.arena.set(Some(arena));
        }
    }
}

/// Page size of glommio's arena allocation (its `Layout` alignment).
const ARENA_PAGE_BYTES: usize = 4096;

/// Bytes of an arena of `arena_bytes` that may be registered from the first byte its
/// allocator hands out (see `discover_arena`); `None` when nothing would be left.
fn arena_usable_bytes(arena_bytes: usize) -> Option<usize> {
    arena_bytes.checked_sub(ARENA_PAGE_BYTES).filter(|&usable| usable >= ARENA_PAGE_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registered_arena_ends_where_the_allocation_ends_at_the_latest() {
        assert_eq!(arena_usable_bytes(32 << 20), Some((32 << 20) - 4096));
        assert_eq!(arena_usable_bytes(8192), Some(4096));
        assert_eq!(arena_usable_bytes(4096), None);
        assert_eq!(arena_usable_bytes(0), None);
    }
}
