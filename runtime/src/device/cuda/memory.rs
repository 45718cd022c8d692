//! [`HostMemory`] on the CUDA device: pinned staging (portable, device-mapped) and host
//! registrations, made in the context that owns pinned memory.

use crate::device::{DeviceError, HostMemory, PinnedRegion};

use super::sys::*;
use super::{CudaDevice, result};

impl CudaDevice {
    /// Runs `work` with the context that owns pinned host memory current, pushed for the
    /// call and popped after (so no thread's current context changes): device 0's
    /// primary context, or its engine context with `HIPFILE_CUDA_STAGING_CONTEXT=engine`.
    /// The memory is portable either way, but on the H200 a 4 KiB copy in the engine
    /// context took 9.6 µs from pinned memory allocated in the engine context and 7.0 µs
    /// from memory allocated in the primary context
    /// (`benches/results/h200-copy-now-probe.txt`).
    fn in_staging_context<R>(
        &self,
        work: impl FnOnce() -> Result<R, DeviceError>,
    ) -> Result<R, DeviceError> {
        if self.staging_in_engine_context {
            return self.in_engine_context(0, work);
        }
        let context = *self
            .contexts
            .first()
            .ok_or(DeviceError::new(DeviceError::HIP_ERROR_INVALID_DEVICE, "no device"))?;
        // SAFETY: a primary context we retained and never release.
        unsafe { self.with_pushed(context, work) }
    }
}

impl HostMemory for CudaDevice {
    fn alloc_pinned(&self, len_bytes: usize) -> Result<PinnedRegion, DeviceError> {
        // Portable and device-mapped: the engine context copies from it and the
        // application's streams wait on words in it.
        self.in_staging_context(|| {
            let flags = CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP;
            let host = result::mem_host_alloc(&self.api, len_bytes, flags)?;
            // SAFETY: `host` is mapped pinned memory we just allocated.
            let (mapped, device_addr) =
                unsafe { result::mem_host_get_device_pointer_status(&self.api, host) };
            if mapped != CUDA_SUCCESS {
                // SAFETY: frees what we allocated above, once.
                let _ = unsafe { result::mem_free_host_status(&self.api, host) };
                return Err(result::error(&self.api, mapped, "cuMemHostGetDevicePointer"));
            }
            Ok(PinnedRegion { host_ptr: host.cast(), device_addr, len_bytes })
        })
    }

    unsafe fn free_pinned(&self, region: PinnedRegion) {
        let _ = self.in_staging_context(|| {
            // SAFETY: the caller guarantees the region came from alloc_pinned and is idle.
            unsafe { result::mem_free_host(&self.api, region.host_ptr.cast()) }
        });
    }

    unsafe fn register_host(
        &self,
        host_ptr: *mut u8,
        len_bytes: usize,
    ) -> Result<u64, DeviceError> {
        self.in_staging_context(|| {
            let flags = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP;
            // SAFETY: the caller guarantees the range is valid host memory that outlives
            // the registration.
            unsafe { result::mem_host_register(&self.api, host_ptr.cast(), len_bytes, flags) }?;
            // SAFETY: registered, mapped host memory.
            let (mapped, device_addr) =
                unsafe { result::mem_host_get_device_pointer_status(&self.api, host_ptr.cast()) };
            if mapped != CUDA_SUCCESS {
                // SAFETY: undo the registration above.
                let _ = unsafe { result::mem_host_unregister_status(&self.api, host_ptr.cast()) };
                return Err(result::error(&self.api, mapped, "cuMemHostGetDevicePointer"));
            }
            Ok(device_addr)
        })
    }

    unsafe fn unregister_host(&self, host_ptr: *mut u8) {
        let _ = self.in_staging_context(|| {
            // SAFETY: the caller guarantees it was registered and is idle.
            unsafe { result::mem_host_unregister(&self.api, host_ptr.cast()) }
        });
    }
}
