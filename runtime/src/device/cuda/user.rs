//! [`UserDevice`] on the CUDA device: what an application does (device memory, its own
//! streams, copies and memsets on them), in the primary contexts.

use crate::device::user::UserDevice;
use crate::device::{DeviceError, StreamHandle};

use super::sys::*;
use super::{CudaDevice, result};

impl UserDevice for CudaDevice {
    fn alloc_device(&self, ordinal: u32, len_bytes: usize) -> Result<u64, DeviceError> {
        self.make_current(ordinal)?;
        result::mem_alloc(&self.api, len_bytes)
    }

    unsafe fn free_device(&self, address: u64) -> Result<(), DeviceError> {
        self.ensure_any_current()?;
        // SAFETY: the caller guarantees the memory is idle.
        unsafe { result::mem_free(&self.api, address) }
    }

    fn create_user_stream(&self, ordinal: u32) -> Result<StreamHandle, DeviceError> {
        self.make_current(ordinal)?;
        let stream = result::stream_create(&self.api, CU_STREAM_NON_BLOCKING)?;
        Ok(StreamHandle(stream as usize))
    }

    fn destroy_user_stream(&self, stream: StreamHandle) -> Result<(), DeviceError> {
        self.ensure_any_current()?;
        // SAFETY: the stream came from create_user_stream; invalid ones yield an error code.
        unsafe { result::stream_destroy(&self.api, stream.0 as CUstream) }
    }

    unsafe fn copy_to_device_on(
        &self,
        stream: StreamHandle,
        target: u64,
        source: *const u8,
        len_bytes: usize,
    ) -> Result<(), DeviceError> {
        self.ensure_any_current()?;
        // SAFETY: caller's contract.
        unsafe {
            result::memcpy_htod_async(&self.api, target, source, len_bytes, stream.0 as CUstream)
        }
    }

    unsafe fn copy_from_device_on(
        &self,
        stream: StreamHandle,
        target: *mut u8,
        source: u64,
        len_bytes: usize,
    ) -> Result<(), DeviceError> {
        self.ensure_any_current()?;
        // SAFETY: caller's contract.
        unsafe {
            result::memcpy_dtoh_async(&self.api, target, source, len_bytes, stream.0 as CUstream)
        }
    }

    unsafe fn memset_on(
        &self,
        stream: StreamHandle,
        target: u64,
        value: u8,
        len_bytes: usize,
    ) -> Result<(), DeviceError> {
        self.ensure_any_current()?;
        // SAFETY: the caller guarantees the range.
        unsafe {
            result::memset_d8_async(&self.api, target, value, len_bytes, stream.0 as CUstream)
        }
    }
}
