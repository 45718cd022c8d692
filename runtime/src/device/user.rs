//! What an *application* does with a device — allocate device memory, make streams,
//! copy, launch host code, pause a stream — which the library itself never needs.
//! `hipfile-bench`, the tests and the device-contract suite use [`UserDevice`] so that
//! the same code runs on every backend.
//!
//! The GPU backends implement [`UserDevice`] directly with their driver calls (in
//! `cuda/mod.rs`, `rocm.rs`): no inherent copy of the same methods. The `cpu` device keeps
//! its richer inherent API (`malloc_managed`, `memcpy_async` between any tracked memory,
//! gates, statistics), which its tests and the C extension use, and its `UserDevice`
//! impl here forwards to it.

use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use super::cpu::CpuDevice;
use super::{Device, DeviceError, DeviceKind, PinnedRegion, StreamHandle};

/// Application-side operations on a device (see the module docs).
pub trait UserDevice: Device {
    /// Allocates `len_bytes` of device memory on `device_ordinal`.
    ///
    /// # Errors
    /// Out of memory, invalid device.
    fn alloc_device(&self, device_ordinal: u32, len_bytes: usize) -> Result<u64, DeviceError>;

    /// Frees memory from [`UserDevice::alloc_device`].
    ///
    /// # Errors
    /// Unknown address.
    ///
    /// # Safety
    /// No enqueued work still uses the memory.
    unsafe fn free_device(&self, addr: u64) -> Result<(), DeviceError>;

    /// Creates a stream on `device_ordinal`.
    ///
    /// # Errors
    /// Invalid device, backend failure.
    fn create_user_stream(&self, device_ordinal: u32) -> Result<StreamHandle, DeviceError>;

    /// Destroys a stream (enqueued work still completes).
    ///
    /// # Errors
    /// Unknown stream.
    fn destroy_user_stream(&self, stream: StreamHandle) -> Result<(), DeviceError>;

    /// Enqueues a host → device copy on a user stream.
    ///
    /// # Errors
    /// Invalid stream or range.
    ///
    /// # Safety
    /// `source` (pinned) stays readable until the copy has run; the target range is
    /// device memory.
    unsafe fn copy_to_device_on(
        &self,
        stream: StreamHandle,
        target: u64,
        source: *const u8,
        len_bytes: usize,
    ) -> Result<(), DeviceError>;

    /// Enqueues a device → host copy on a user stream.
    ///
    /// # Errors
    /// Invalid stream or range.
    ///
    /// # Safety
    /// `target` (pinned) stays writable until the copy has run.
    unsafe fn copy_from_device_on(
        &self,
        stream: StreamHandle,
        target: *mut u8,
        source: u64,
        len_bytes: usize,
    ) -> Result<(), DeviceError>;

    /// Enqueues a memset of device memory on a user stream.
    ///
    /// # Errors
    /// Invalid stream or range.
    ///
    /// # Safety
    /// The target range is device memory.
    unsafe fn memset_on(
        &self,
        stream: StreamHandle,
        target: u64,
        value: u8,
        len_bytes: usize,
    ) -> Result<(), DeviceError>;

    /// Enqueues a Rust closure as a host function (panics are caught).
    ///
    /// # Errors
    /// Unknown stream.
    fn launch_closure(
        &self,
        stream: StreamHandle,
        closure: Box<dyn FnOnce() + Send>,
    ) -> Result<(), DeviceError> {
        let raw = Box::into_raw(Box::new(closure)).cast::<c_void>();
        // SAFETY: `raw` is taken back exactly once by `run_closure`, which catches panics.
        let launched = unsafe { self.launch_host_func(stream, run_closure, raw) };
        if launched.is_err() {
            // SAFETY: the launch failed, so run_closure will never see `raw`.
            drop(unsafe { Box::from_raw(raw.cast::<Box<dyn FnOnce() + Send>>()) });
        }
        launched
    }
}

/// Runs a boxed closure passed through `launch_host_func`.
///
/// # Safety
/// `user_data` is a `Box<Box<dyn FnOnce() + Send>>` leaked by `launch_closure`, passed once.
unsafe extern "C" fn run_closure(user_data: *mut c_void) {
    // SAFETY: see the function's contract.
    let closure = unsafe { Box::from_raw(user_data.cast::<Box<dyn FnOnce() + Send>>()) };
    let _ = catch_unwind(AssertUnwindSafe(closure));
}

/// A stream paused at a point: later work waits until [`StreamGate::release`] (or drop).
pub struct StreamGate {
    device: Arc<dyn UserDevice>,
    word: PinnedRegion,
    released: bool,
}

impl StreamGate {
    /// Enqueues "wait until the gate opens" on `stream`.
    ///
    /// # Errors
    /// Pinned allocation or the wait enqueue failed.
    pub fn pause(
        device: &Arc<dyn UserDevice>,
        stream: StreamHandle,
    ) -> Result<StreamGate, DeviceError> {
        let word = device.alloc_pinned(4096)?;
        // SAFETY: a fresh pinned allocation of 4096 bytes, aligned, not yet shared.
        unsafe { word.host_ptr.cast::<u32>().write_volatile(0) };
        // SAFETY: the word stays allocated until the gate drops, after the release; the
        // gate's drop also waits for the stream to pass the wait (see Drop).
        if let Err(error) = unsafe { device.stream_wait_value32(stream, word.device_addr, 1) } {
            // SAFETY: nothing waits on it.
            unsafe { device.free_pinned(word) };
            return Err(error);
        }
        Ok(StreamGate { device: Arc::clone(device), word, released: false })
    }

    /// Opens the gate.
    pub fn release(mut self) {
        self.open();
    }

    fn open(&mut self) {
        if !self.released {
            // SAFETY: a live, aligned pinned word.
            unsafe { self.device.store_word_host(self.word.host_ptr.cast(), 1) };
            self.released = true;
        }
    }
}

impl Drop for StreamGate {
    fn drop(&mut self) {
        self.open();
        // The word must outlive the device's wait, which may not have run yet: it is
        // leaked deliberately (4 KiB per gate; gates are for tests and tools).
    }
}

impl UserDevice for CpuDevice {
    fn alloc_device(&self, device_ordinal: u32, len_bytes: usize) -> Result<u64, DeviceError> {
        self.malloc_device(device_ordinal, len_bytes)
    }

    unsafe fn free_device(&self, addr: u64) -> Result<(), DeviceError> {
        // SAFETY: forwarded contract.
        unsafe { CpuDevice::free_device(self, addr) }
    }

    fn create_user_stream(&self, device_ordinal: u32) -> Result<StreamHandle, DeviceError> {
        self.create_stream(device_ordinal)
    }

    fn destroy_user_stream(&self, stream: StreamHandle) -> Result<(), DeviceError> {
        self.destroy_stream(stream)
    }

    unsafe fn copy_to_device_on(
        &self,
        stream: StreamHandle,
        target: u64,
        source: *const u8,
        len_bytes: usize,
    ) -> Result<(), DeviceError> {
        // SAFETY: forwarded contract.
        unsafe { self.memcpy_async(stream, target, source as u64, len_bytes) }
    }

    unsafe fn copy_from_device_on(
        &self,
        stream: StreamHandle,
        target: *mut u8,
        source: u64,
        len_bytes: usize,
    ) -> Result<(), DeviceError> {
        // SAFETY: forwarded contract.
        unsafe { self.memcpy_async(stream, target as u64, source, len_bytes) }
    }

    unsafe fn memset_on(
        &self,
        stream: StreamHandle,
        target: u64,
        value: u8,
        len_bytes: usize,
    ) -> Result<(), DeviceError> {
        // SAFETY: forwarded contract.
        unsafe { self.memset_async(stream, target, value, len_bytes) }
    }
}

/// The backend's name, for reports.
pub fn backend_name(device: &dyn Device) -> &'static str {
    match device.kind() {
        DeviceKind::Cpu => "cpu",
        DeviceKind::Cuda => "cuda",
        DeviceKind::Rocm => "rocm",
    }
}
