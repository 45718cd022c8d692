//! A word of pinned, device-mapped memory that the host and a stream's memory operations
//! share: the release word a stream waits on and the doorbell it rings (their pool:
//! `crate::stream`).

/// A stream's release word: host pointer and device address of the same 4 bytes.
#[derive(Clone, Copy)]
pub(crate) struct ReleaseWord {
    pub(crate) host_ptr: *mut u32,
    pub(crate) device_addr: u64,
}

impl ReleaseWord {
    /// The word's value as the host sees it now.
    pub(crate) fn load(&self) -> u32 {
        // SAFETY: the word lies in a pinned slab of the driver's WordPool, which outlives
        // every stream state and op holding the word; it is aligned and only accessed
        // atomically (by the host) or by the device's stream memory operations.
        unsafe { std::sync::atomic::AtomicU32::from_ptr(self.host_ptr) }
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// Stores `value` as the host (the poller's unit tests ring doorbells with it).
    #[cfg(test)]
    pub(crate) fn store(&self, value: u32) {
        // SAFETY: as in `load`; the tests' words outlive every reader.
        unsafe { std::sync::atomic::AtomicU32::from_ptr(self.host_ptr) }
            .store(value, std::sync::atomic::Ordering::Release);
    }
}

// SAFETY: a ReleaseWord is the address of pinned memory owned by the driver's WordPool,
// which lives as long as the driver; it is only accessed atomically.
unsafe impl Send for ReleaseWord {}
// SAFETY: as above.
unsafe impl Sync for ReleaseWord {}
