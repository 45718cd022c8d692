//! The staging arena registers exactly memory it owns: every host range the engine
//! registers with the device lies inside one allocation the process made for it.
//!
//! A global allocator records the address and size of every large page-aligned
//! allocation (glommio allocates each executor's arena that way); after a read through
//! the engine, each range registered with the `cpu` device must lie inside one of them.
//! Registering even one page past an arena would make the next mapping count as pinned
//! staging (and on CUDA pin a page hipFile does not own).

use std::alloc::{GlobalAlloc, Layout, System};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};

use hipfile_core::{Direction, RawIo};

#[allow(unused_imports, reason = "not every helper is used by every file")]
use hipfile_test_support::cpu_rig::*;

/// How many large allocations the recorder keeps (more are counted, not kept).
const RECORDED_CAPACITY: usize = 256;
/// Allocations at least this large and page-aligned are recorded.
const RECORDED_MIN_BYTES: usize = 1 << 20;

/// The system allocator, recording large page-aligned allocations without allocating.
struct RecordingAllocator;

static RECORDED_STARTS: [AtomicUsize; RECORDED_CAPACITY] =
    [const { AtomicUsize::new(0) }; RECORDED_CAPACITY];
static RECORDED_LENGTHS: [AtomicUsize; RECORDED_CAPACITY] =
    [const { AtomicUsize::new(0) }; RECORDED_CAPACITY];
static RECORDED_COUNT: AtomicUsize = AtomicUsize::new(0);

fn record(ptr: *mut u8, layout: Layout) {
    if ptr.is_null() || layout.align() < 4096 || layout.size() < RECORDED_MIN_BYTES {
        return;
    }
    let slot = RECORDED_COUNT.fetch_add(1, Ordering::AcqRel);
    if slot < RECORDED_CAPACITY {
        RECORDED_LENGTHS[slot].store(layout.size(), Ordering::Release);
        RECORDED_STARTS[slot].store(ptr as usize, Ordering::Release);
    }
}

// SAFETY: forwards every call to `System` unchanged; recording touches only atomics.
unsafe impl GlobalAlloc for RecordingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is System's.
        let ptr = unsafe { System.alloc(layout) };
        record(ptr, layout);
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is System's.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        record(ptr, layout);
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is System's.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: RecordingAllocator = RecordingAllocator;

/// `(start, length)` of the recorded allocations.
fn recorded_allocations() -> Vec<(usize, usize)> {
    let count = RECORDED_COUNT.load(Ordering::Acquire).min(RECORDED_CAPACITY);
    (0..count)
        .map(|slot| {
            (
                RECORDED_STARTS[slot].load(Ordering::Acquire),
                RECORDED_LENGTHS[slot].load(Ordering::Acquire),
            )
        })
        .filter(|&(start, _)| start != 0)
        .collect()
}

#[test]
fn every_registered_staging_range_lies_inside_an_allocation_of_its_own() {
    const ARENA_BYTES: usize = 8 * MIB;
    let data = pattern(4 * MIB, 7);
    let file = TempFile::new(&tmpfs_dir(), &data);
    let client = file.open_rw();
    let config = config(&[0, 1]);
    assert_eq!(config.staging_per_executor_bytes, ARENA_BYTES);
    let (driver, device) = driver_with(config);
    let handle = driver.handle_register(client.as_raw_fd()).unwrap();
    let buf = device.malloc_device(0, 4 * MIB).unwrap();
    let io = RawIo { size_bytes: (4 * MIB) as u64, file_offset_bytes: 0, buffer_offset_bytes: 0 };
    assert_eq!(driver.io_sync(Direction::Read, handle, buf, io), Ok(4 * MIB));
    assert!(device_bytes(buf, 4 * MIB) == data);

    let registered = device.registered_host_ranges();
    let arenas: Vec<_> =
        registered.iter().filter(|&&(_, len)| len > ARENA_BYTES / 2).copied().collect();
    assert_eq!(arenas.len(), 2, "one arena per executor, registered: {registered:x?}");
    let allocations = recorded_allocations();
    for &(base, len) in &arenas {
        let (base, end) = (base as usize, base as usize + len);
        let owner = allocations.iter().find(|&&(start, size)| start <= base && end <= start + size);
        assert!(
            owner.is_some(),
            "registered staging {base:#x}..{end:#x} is not inside any arena allocation \
             {allocations:x?}"
        );
        // Nothing usable is lost either: at most the allocator's bookkeeping page.
        let &(_, size) = owner.unwrap();
        assert!(len >= size - 2 * 4096, "registered {len} of an arena of {size} bytes");
    }
    driver.handle_deregister(handle);
}
