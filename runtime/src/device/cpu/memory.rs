//! The cpu device's memory: every allocation (device, managed, pinned host, gate words)
//! and every registered host range is tracked, each allocation mapped between two
//! `PROT_NONE` guard pages; the range checks every command makes at enqueue and again
//! when it runs.

use core::ffi::c_void;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{PoisonError, RwLock};

use crate::device::{DeviceError, HostMemory, MemoryType, PinnedRegion};

use super::{CpuDevice, invalid_value, out_of_memory, read, write};

/// Alignment of every allocation the device makes.
const ALIGNMENT_BYTES: usize = 4096;

/// Where a tracked range came from (decides who may release it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Origin {
    /// Allocated by the device for a user (`malloc_*`, `alloc_pinned`).
    Allocated,
    /// Host memory owned by someone else, registered with `register_host`.
    Registered,
    /// A gate word owned by a [`StreamGate`](crate::device::user::StreamGate).
    Gate,
}

/// One tracked range.
#[derive(Clone, Copy, Debug)]
pub(super) struct Allocation {
    pub(super) len_bytes: usize,
    pub(super) memory_type: MemoryType,
    pub(super) device_ordinal: u32,
    pub(super) origin: Origin,
}

impl Allocation {
    fn owns_memory(&self) -> bool {
        self.origin != Origin::Registered
    }
}

/// The mapping behind one allocation: a `PROT_NONE` guard page, the allocation's pages
/// (read-write, zeroed), another guard page. A read or write just outside the allocation
/// faults instead of touching a neighbour: before its start exactly, after its end
/// exactly when the length is a multiple of the page size (else within the slack of its
/// last page). `(mapping start, mapping length)` for an allocation at `base`.
fn guarded_mapping(base: u64, len_bytes: usize) -> Option<(usize, usize)> {
    let page = crate::sys::page_size_bytes() as usize;
    let body = len_bytes.checked_next_multiple_of(page)?;
    Some(((base as usize).checked_sub(page)?, body.checked_add(2 * page)?))
}

/// Maps `len_bytes` of zeroed memory between two guard pages ([`guarded_mapping`]);
/// returns the allocation's address (page-aligned, so [`ALIGNMENT_BYTES`]-aligned).
fn map_guarded(len_bytes: usize) -> Result<u64, DeviceError> {
    let page = crate::sys::page_size_bytes() as usize;
    debug_assert!(page >= ALIGNMENT_BYTES && page.is_multiple_of(ALIGNMENT_BYTES));
    let too_large = || out_of_memory("allocation too large");
    let body = len_bytes.checked_next_multiple_of(page).ok_or_else(too_large)?;
    let total = body.checked_add(2 * page).ok_or_else(too_large)?;
    // SAFETY: a fresh anonymous private mapping; no existing memory is affected.
    let start = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            total,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if start == libc::MAP_FAILED {
        return Err(out_of_memory("mmap failed"));
    }
    let body_start = start as usize + page;
    // SAFETY: the body lies inside the mapping made above.
    let opened = unsafe {
        libc::mprotect(body_start as *mut c_void, body, libc::PROT_READ | libc::PROT_WRITE)
    };
    if opened != 0 {
        // SAFETY: unmaps exactly the mapping made above, which nothing else uses.
        unsafe { libc::munmap(start, total) };
        return Err(out_of_memory("mprotect failed"));
    }
    Ok(body_start as u64)
}

pub(super) type AllocationMap = BTreeMap<u64, Allocation>;

/// The allocation holding `addr`, if any, as `(base, allocation)`.
pub(super) fn find(map: &AllocationMap, addr: u64) -> Option<(u64, Allocation)> {
    let (&base, &allocation) = map.range(..=addr).next_back()?;
    (addr - base < allocation.len_bytes as u64).then_some((base, allocation))
}

/// Checks that `addr..addr+len_bytes` lies inside one tracked allocation whose memory type
/// `accept`s; returns that memory type.
pub(super) fn check_range(
    map: &AllocationMap,
    addr: u64,
    len_bytes: usize,
    accept: fn(MemoryType) -> bool,
    what: &'static str,
) -> Result<MemoryType, DeviceError> {
    let (base, allocation) = find(map, addr).ok_or(invalid_value(what))?;
    let end = addr.checked_add(len_bytes as u64).ok_or(invalid_value(what))?;
    if !accept(allocation.memory_type) || end > base + allocation.len_bytes as u64 {
        return Err(invalid_value(what));
    }
    Ok(allocation.memory_type)
}

fn is_device(memory_type: MemoryType) -> bool {
    memory_type == MemoryType::Device
}

fn is_device_or_managed(memory_type: MemoryType) -> bool {
    matches!(memory_type, MemoryType::Device | MemoryType::Managed)
}

fn is_pinned_host(memory_type: MemoryType) -> bool {
    memory_type == MemoryType::Host
}

pub(super) fn is_any(_memory_type: MemoryType) -> bool {
    true
}

/// Checks that a 32-bit word is 4-byte aligned and inside one tracked allocation.
pub(super) fn check_word(map: &AllocationMap, word_addr: u64) -> Result<(), DeviceError> {
    if !word_addr.is_multiple_of(4) {
        return Err(invalid_value("stream memory word is not 4-byte aligned"));
    }
    check_range(map, word_addr, 4, is_any, "stream memory word is not tracked memory")?;
    Ok(())
}

/// All tracked memory of one device.
#[derive(Default)]
pub(super) struct MemoryRegistry {
    pub(super) map: RwLock<AllocationMap>,
}

impl MemoryRegistry {
    /// Allocates zeroed, page-aligned memory between guard pages and tracks it.
    pub(super) fn allocate(
        &self,
        len_bytes: usize,
        memory_type: MemoryType,
        device_ordinal: u32,
        origin: Origin,
    ) -> Result<u64, DeviceError> {
        if len_bytes == 0 {
            return Err(invalid_value("zero-length allocation"));
        }
        let base = map_guarded(len_bytes)?;
        let allocation = Allocation { len_bytes, memory_type, device_ordinal, origin };
        write(&self.map).insert(base, allocation);
        Ok(base)
    }

    /// Tracks existing host memory as pinned host memory.
    fn register(&self, base: u64, len_bytes: usize) -> Result<(), DeviceError> {
        let end = base.checked_add(len_bytes as u64);
        let end = match end {
            Some(end) if base != 0 && len_bytes != 0 => end,
            _ => return Err(invalid_value("invalid host range to register")),
        };
        let mut map = write(&self.map);
        let overlaps_before = find(&map, base).is_some();
        let overlaps_after = map.range(base..end).next().is_some();
        if overlaps_before || overlaps_after {
            return Err(invalid_value("host range overlaps tracked memory"));
        }
        let allocation = Allocation {
            len_bytes,
            memory_type: MemoryType::Host,
            device_ordinal: 0,
            origin: Origin::Registered,
        };
        map.insert(base, allocation);
        Ok(())
    }

    /// `(base, length in bytes)` of every range registered with `register_host`.
    fn registered_ranges(&self) -> Vec<(u64, usize)> {
        read(&self.map)
            .iter()
            .filter(|(_, allocation)| allocation.origin == Origin::Registered)
            .map(|(&base, allocation)| (base, allocation.len_bytes))
            .collect()
    }

    /// Stops tracking the range starting at `base` if `accept` approves it, and frees the
    /// memory the device owns.
    pub(super) fn release(
        &self,
        base: u64,
        accept: impl Fn(&Allocation) -> bool,
    ) -> Result<(), DeviceError> {
        let mut map = write(&self.map);
        let allocation = match map.get(&base) {
            Some(allocation) if accept(allocation) => *allocation,
            _ => return Err(invalid_value("not the base of a matching allocation")),
        };
        map.remove(&base);
        drop(map);
        if allocation.owns_memory() {
            // SAFETY: the range was allocated by `allocate` with this layout and has just
            // been removed from the registry, so it is freed exactly once.
            unsafe { dealloc(base, allocation.len_bytes) };
        }
        Ok(())
    }
}

/// Frees memory from `MemoryRegistry::allocate`, with its guard pages.
///
/// # Safety
/// `base` came from `map_guarded(len_bytes)` and is freed once.
unsafe fn dealloc(base: u64, len_bytes: usize) {
    if let Some((start, total)) = guarded_mapping(base, len_bytes) {
        // SAFETY: guaranteed by the caller: the whole mapping is ours and unused.
        unsafe { libc::munmap(start as *mut c_void, total) };
    }
}

impl Drop for MemoryRegistry {
    fn drop(&mut self) {
        let map = std::mem::take(self.map.get_mut().unwrap_or_else(PoisonError::into_inner));
        for (base, allocation) in map {
            if allocation.owns_memory() {
                // SAFETY: every owned range in the registry came from `allocate`, and the
                // registry is going away, so nothing can free it again.
                unsafe { dealloc(base, allocation.len_bytes) };
            }
        }
    }
}

/// Which rule an async copy's address ranges must satisfy.
#[derive(Clone, Copy, Debug)]
pub(super) enum CopyRule {
    /// Target in one device allocation, source in one pinned host range.
    HostToDevice,
    /// Target in one pinned host range, source in one device allocation.
    DeviceToHost,
    /// Both sides in tracked allocations of any type.
    AnyTracked,
    /// Source in one device allocation, target in one device or managed allocation.
    DeviceToDevice,
}

/// Which counter an executed copy adds to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum CopyPath {
    HostToDevice,
    DeviceToHost,
    Other,
}

impl CopyRule {
    pub(super) fn check(
        self,
        map: &AllocationMap,
        target: u64,
        source: u64,
        len_bytes: usize,
    ) -> Result<CopyPath, DeviceError> {
        match self {
            CopyRule::HostToDevice => {
                check_range(map, target, len_bytes, is_device, "copy target not in device memory")?;
                check_range(map, source, len_bytes, is_pinned_host, "copy source not pinned host")?;
                Ok(CopyPath::HostToDevice)
            }
            CopyRule::DeviceToHost => {
                check_range(map, target, len_bytes, is_pinned_host, "copy target not pinned host")?;
                check_range(map, source, len_bytes, is_device, "copy source not in device memory")?;
                Ok(CopyPath::DeviceToHost)
            }
            CopyRule::AnyTracked => {
                let to = check_range(map, target, len_bytes, is_any, "copy target not tracked")?;
                let from = check_range(map, source, len_bytes, is_any, "copy source not tracked")?;
                Ok(match (from, to) {
                    (MemoryType::Host, MemoryType::Device) => CopyPath::HostToDevice,
                    (MemoryType::Device, MemoryType::Host) => CopyPath::DeviceToHost,
                    _ => CopyPath::Other,
                })
            }
            CopyRule::DeviceToDevice => {
                let what = "copy target not in device memory";
                check_range(map, target, len_bytes, is_device_or_managed, what)?;
                check_range(map, source, len_bytes, is_device, "copy source not in device memory")?;
                Ok(CopyPath::Other)
            }
        }
    }
}

impl CpuDevice {
    /// Allocates `len_bytes` of zeroed device memory on `device_ordinal`, 4096-aligned.
    ///
    /// # Errors
    /// `HIP_ERROR_INVALID_DEVICE` for an invalid ordinal, `HIP_ERROR_INVALID_VALUE` for
    /// `len_bytes == 0`, `HIP_ERROR_OUT_OF_MEMORY` if the host allocator fails.
    pub fn malloc_device(&self, device_ordinal: u32, len_bytes: usize) -> Result<u64, DeviceError> {
        self.check_ordinal(device_ordinal)?;
        let memory = &self.shared.memory;
        memory.allocate(len_bytes, MemoryType::Device, device_ordinal, Origin::Allocated)
    }

    /// Frees device or managed memory from [`CpuDevice::malloc_device`] /
    /// [`CpuDevice::malloc_managed`].
    ///
    /// # Errors
    /// `HIP_ERROR_INVALID_VALUE` if `addr` is not the base of such an allocation.
    ///
    /// # Safety
    /// No reference into the allocation outlives this call, and no stream is inside a
    /// wait-value on a word of it. (Queued copies, memsets and write-values that still name
    /// it are safe: they fail with a sticky asynchronous error instead of running, unless
    /// a newer allocation has reused the addresses meanwhile.)
    pub unsafe fn free_device(&self, addr: u64) -> Result<(), DeviceError> {
        self.shared
            .memory
            .release(addr, |a| a.origin == Origin::Allocated && a.memory_type != MemoryType::Host)
    }

    /// Allocates `len_bytes` of zeroed managed memory (`MemoryType::Managed`, device 0),
    /// 4096-aligned; free it with [`CpuDevice::free_device`].
    ///
    /// # Errors
    /// `HIP_ERROR_INVALID_VALUE` for `len_bytes == 0`, `HIP_ERROR_OUT_OF_MEMORY`.
    pub fn malloc_managed(&self, len_bytes: usize) -> Result<u64, DeviceError> {
        self.shared.memory.allocate(len_bytes, MemoryType::Managed, 0, Origin::Allocated)
    }

    /// Allocates `len_bytes` of zeroed pinned host memory (`MemoryType::Host`),
    /// 4096-aligned; the device address equals the host address.
    ///
    /// # Errors
    /// `HIP_ERROR_INVALID_VALUE` for `len_bytes == 0`, `HIP_ERROR_OUT_OF_MEMORY`.
    pub fn malloc_host(&self, len_bytes: usize) -> Result<PinnedRegion, DeviceError> {
        let memory = &self.shared.memory;
        let base = memory.allocate(len_bytes, MemoryType::Host, 0, Origin::Allocated)?;
        Ok(PinnedRegion { host_ptr: base as usize as *mut u8, device_addr: base, len_bytes })
    }

    /// Frees pinned host memory from [`CpuDevice::malloc_host`] or
    /// [`HostMemory::alloc_pinned`] (the same as `free_pinned`, but reports errors).
    ///
    /// # Errors
    /// `HIP_ERROR_INVALID_VALUE` if `region` is not the start of such an allocation.
    ///
    /// # Safety
    /// No reference into the region outlives this call.
    pub unsafe fn free_host(&self, region: PinnedRegion) -> Result<(), DeviceError> {
        let base = region.host_ptr as usize as u64;
        self.shared
            .memory
            .release(base, |a| a.origin == Origin::Allocated && a.memory_type == MemoryType::Host)
    }

    /// `(base address, length in bytes)` of every host range registered as pinned
    /// (`register_host`: the engine's staging arenas, users' registered host buffers).
    ///
    /// Public for the integration tests; embedders do not need it.
    pub fn registered_host_ranges(&self) -> Vec<(u64, usize)> {
        self.shared.memory.registered_ranges()
    }
}

impl HostMemory for CpuDevice {
    unsafe fn store_word_host(&self, word_host_ptr: *mut u32, value: u32) {
        // SAFETY: the caller guarantees a live, aligned pinned word; on this device the
        // host address is the device address. An untracked word falls back to a plain
        // atomic store (waiters then see it within their polling interval).
        if unsafe { self.store_word(word_host_ptr as u64, value) }.is_err() {
            // SAFETY: as above: live and aligned.
            let word = unsafe { AtomicU32::from_ptr(word_host_ptr) };
            word.store(value, Ordering::Release);
        }
    }

    fn alloc_pinned(&self, len_bytes: usize) -> Result<PinnedRegion, DeviceError> {
        let region = self.malloc_host(len_bytes)?;
        super::stats::bump(&self.shared.stats.pinned_allocations, 1);
        Ok(region)
    }

    unsafe fn free_pinned(&self, region: PinnedRegion) {
        // SAFETY: forwarded from the caller (`free_pinned`'s contract is stricter).
        if unsafe { self.free_host(region) }.is_err() {
            self.count_invalid_release();
        }
    }

    unsafe fn register_host(
        &self,
        host_ptr: *mut u8,
        len_bytes: usize,
    ) -> Result<u64, DeviceError> {
        let base = host_ptr as usize as u64;
        self.shared.memory.register(base, len_bytes)?;
        Ok(base)
    }

    unsafe fn unregister_host(&self, host_ptr: *mut u8) {
        let base = host_ptr as usize as u64;
        let released = self.shared.memory.release(base, |a| a.origin == Origin::Registered);
        if released.is_err() {
            self.count_invalid_release();
        }
    }
}
