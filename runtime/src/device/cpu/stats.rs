//! The cpu device's counters: what its streams did, for tests.

use std::sync::atomic::{AtomicU64, Ordering};

use super::CpuDevice;

/// A snapshot of a [`CpuDevice`]'s counters (for tests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuDeviceStats {
    /// Bytes copied from host memory to device memory (internal-stream copies and
    /// `memcpy_async` from a host range to a device range).
    pub bytes_host_to_device: u64,
    /// Bytes copied from device memory to host memory.
    pub bytes_device_to_host: u64,
    /// Bytes copied by `memcpy_async` between other kinds of memory.
    pub bytes_copied_other: u64,
    /// Bytes written by `memset_async`.
    pub bytes_memset: u64,
    /// Host functions and host closures invoked (including those that panicked).
    pub host_fns_run: u64,
    /// Host closures that panicked (caught; their stream kept running).
    pub host_fn_panics: u64,
    /// Wait-value commands that completed (their condition became true).
    pub wait_values_executed: u64,
    /// Write-value commands executed.
    pub write_values_executed: u64,
    /// Commands that failed when they executed (sticky asynchronous stream errors).
    pub async_errors: u64,
    /// Releases through trait methods that cannot report errors (`free_pinned`,
    /// `unregister_host`, `destroy_internal_stream`, `destroy_event`) that named nothing
    /// known: a double free or a wrong handle in the caller.
    pub invalid_releases: u64,
    /// [`DeviceCopies::copy_now`](crate::device::DeviceCopies::copy_now) calls, and those told that async ops may hold application
    /// streams (the CUDA backend bounces short copies then).
    pub caller_copies: u64,
    /// See [`CpuDeviceStats::caller_copies`].
    pub caller_copies_while_ops_hold_streams: u64,
    /// [`HostMemory::alloc_pinned`](crate::device::HostMemory::alloc_pinned) calls that
    /// allocated, and internal streams made: what the engine must never do on its data
    /// path (on CUDA such calls can wait for a lock a blocked `cuStreamCreate` holds).
    pub pinned_allocations: u64,
    /// See [`CpuDeviceStats::pinned_allocations`].
    pub internal_streams_created: u64,
}

/// The live counters behind [`CpuDeviceStats`].
#[derive(Default)]
pub(super) struct StatCounters {
    pub(super) bytes_host_to_device: AtomicU64,
    pub(super) bytes_device_to_host: AtomicU64,
    pub(super) bytes_copied_other: AtomicU64,
    pub(super) bytes_memset: AtomicU64,
    pub(super) host_fns_run: AtomicU64,
    pub(super) host_fn_panics: AtomicU64,
    pub(super) wait_values_executed: AtomicU64,
    pub(super) write_values_executed: AtomicU64,
    pub(super) async_errors: AtomicU64,
    pub(super) invalid_releases: AtomicU64,
    pub(super) caller_copies: AtomicU64,
    pub(super) caller_copies_while_ops_hold_streams: AtomicU64,
    pub(super) pinned_allocations: AtomicU64,
    pub(super) internal_streams_created: AtomicU64,
}

pub(super) fn bump(counter: &AtomicU64, amount: u64) {
    counter.fetch_add(amount, Ordering::Relaxed);
}

impl StatCounters {
    fn snapshot(&self) -> CpuDeviceStats {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        CpuDeviceStats {
            bytes_host_to_device: get(&self.bytes_host_to_device),
            bytes_device_to_host: get(&self.bytes_device_to_host),
            bytes_copied_other: get(&self.bytes_copied_other),
            bytes_memset: get(&self.bytes_memset),
            host_fns_run: get(&self.host_fns_run),
            host_fn_panics: get(&self.host_fn_panics),
            wait_values_executed: get(&self.wait_values_executed),
            write_values_executed: get(&self.write_values_executed),
            async_errors: get(&self.async_errors),
            invalid_releases: get(&self.invalid_releases),
            caller_copies: get(&self.caller_copies),
            caller_copies_while_ops_hold_streams: get(&self.caller_copies_while_ops_hold_streams),
            pinned_allocations: get(&self.pinned_allocations),
            internal_streams_created: get(&self.internal_streams_created),
        }
    }
}

impl CpuDevice {
    /// A snapshot of the device's counters.
    pub fn stats(&self) -> CpuDeviceStats {
        self.shared.stats.snapshot()
    }
}
