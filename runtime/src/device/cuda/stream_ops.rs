//! [`StreamMemoryOps`] on the CUDA device: host functions, wait-value and write-value on
//! the application's streams (in the caller's current context), their synchronize and query.

use std::ffi::c_void;

use hipfile_core::Direction;

use crate::device::{DeviceError, HostFn, StreamHandle, StreamMemoryOps, WriteThenWaitError};

use super::sys::*;
use super::{CudaDevice, result};

impl StreamMemoryOps for CudaDevice {
    unsafe fn launch_host_func(
        &self,
        stream: StreamHandle,
        func: HostFn,
        user_data: *mut c_void,
    ) -> Result<(), DeviceError> {
        self.ensure_any_current()?;
        // SAFETY: caller's contract; HostFn has CUhostFn's ABI.
        unsafe { result::launch_host_func(&self.api, stream.0 as CUstream, func, user_data) }
    }

    unsafe fn stream_wait_value32(
        &self,
        stream: StreamHandle,
        word_device_addr: u64,
        value: u32,
    ) -> Result<(), DeviceError> {
        self.ensure_any_current()?;
        // SAFETY: caller's contract: the word stays allocated.
        unsafe {
            result::stream_wait_value32_geq(
                &self.api,
                stream.0 as CUstream,
                word_device_addr,
                value,
            )
        }
    }

    unsafe fn stream_write_value32(
        &self,
        stream: StreamHandle,
        word_device_addr: u64,
        value: u32,
    ) -> Result<(), DeviceError> {
        self.ensure_any_current()?;
        // SAFETY: caller's contract.
        unsafe {
            result::stream_write_value32(&self.api, stream.0 as CUstream, word_device_addr, value)
        }
    }

    fn copies_on_user_streams(&self) -> bool {
        true
    }

    /// Yes: the engine's path can meet the `cuStreamCreate` cycle (README, Known limits);
    /// copies queued on the user's stream at submission cannot.
    fn engine_copies_can_wait_for_user_streams(&self) -> bool {
        true
    }

    /// Yes: the engine fills them from its few, warm arena chunks, and the stream's
    /// device → device copy runs at over 1 TB/s (fifteenth session, H100).
    fn prefers_device_slots(&self) -> bool {
        true
    }

    unsafe fn copy_on_stream(
        &self,
        stream: StreamHandle,
        direction: Direction,
        device_addr: u64,
        host: *mut u8,
        len_bytes: usize,
    ) -> Result<(), DeviceError> {
        let cu_stream = stream.0 as CUstream;
        self.enqueue_on_user_stream(cu_stream, || {
            // SAFETY: the caller's contract (pinned portable host memory, live until the
            // copy ran; a valid device range).
            unsafe {
                match direction {
                    Direction::Read => result::memcpy_htod_async(
                        &self.api,
                        device_addr,
                        host.cast_const(),
                        len_bytes,
                        cu_stream,
                    ),
                    Direction::Write => result::memcpy_dtoh_async(
                        &self.api,
                        host,
                        device_addr,
                        len_bytes,
                        cu_stream,
                    ),
                }
            }
        })
    }

    unsafe fn copy_device_on_stream(
        &self,
        stream: StreamHandle,
        target: u64,
        source: u64,
        len_bytes: usize,
    ) -> Result<(), DeviceError> {
        let cu_stream = stream.0 as CUstream;
        self.enqueue_on_user_stream(cu_stream, || {
            // SAFETY: the caller's contract (engine device memory live until the copy ran;
            // a valid target range). Unified addressing lets a stream of the application's
            // context copy from memory of the engine context on the same device.
            unsafe { result::memcpy_dtod_async(&self.api, target, source, len_bytes, cu_stream) }
        })
    }

    unsafe fn stream_write_then_wait_value32(
        &self,
        stream: StreamHandle,
        write_addr: u64,
        write_value: u32,
        wait_addr: u64,
        wait_value: u32,
    ) -> Result<(), WriteThenWaitError> {
        self.ensure_any_current().map_err(WriteThenWaitError::NothingQueued)?;
        let mut ops = [
            CUstreamBatchMemOpParams {
                operation: CU_STREAM_MEM_OP_WRITE_VALUE_32,
                address: write_addr,
                value64: u64::from(write_value),
                flags: CU_STREAM_WRITE_VALUE_DEFAULT,
                ..CUstreamBatchMemOpParams::default()
            },
            CUstreamBatchMemOpParams {
                operation: CU_STREAM_MEM_OP_WAIT_VALUE_32,
                address: wait_addr,
                value64: u64::from(wait_value),
                flags: CU_STREAM_WAIT_VALUE_GEQ,
                ..CUstreamBatchMemOpParams::default()
            },
        ];
        // SAFETY: two initialized entries in cuda.h's layout (checked by the
        // const assertions in sys.rs); the caller keeps both words allocated.
        let code = unsafe {
            result::stream_batch_mem_op_status(&self.api, stream.0 as CUstream, &mut ops)
        };
        if code == CUDA_SUCCESS {
            return Ok(());
        }
        // The batch failed: enqueue the two ops one by one, which reports which failed.
        // Should the batch have enqueued part of itself, a repeated write of the same
        // value and a repeated wait for it change nothing.
        // SAFETY: the caller's contract.
        unsafe {
            crate::device::write_then_wait_one_by_one(
                self,
                stream,
                write_addr,
                write_value,
                wait_addr,
                wait_value,
            )
        }
    }

    fn synchronize_stream(&self, stream: StreamHandle) -> Result<(), DeviceError> {
        self.ensure_any_current()?;
        // SAFETY: a user stream handle; invalid ones yield an error code.
        unsafe { result::stream_synchronize(&self.api, stream.0 as CUstream) }
    }

    fn stream_done(&self, stream: StreamHandle) -> Result<bool, DeviceError> {
        self.ensure_any_current()?;
        // SAFETY: a user stream handle; invalid ones yield an error code.
        unsafe { result::stream_query(&self.api, stream.0 as CUstream) }
    }

    /// A stream made without `CU_STREAM_NON_BLOCKING` waits for the legacy NULL stream.
    fn stream_follows_null_stream(&self, stream: StreamHandle) -> Result<bool, DeviceError> {
        if stream == StreamHandle::NULL {
            return Ok(false);
        }
        self.ensure_any_current()?;
        // SAFETY: a user stream handle; invalid ones yield an error code.
        let flags = unsafe { result::stream_get_flags(&self.api, stream.0 as CUstream) }?;
        Ok(flags & CU_STREAM_NON_BLOCKING == 0)
    }

    /// The legacy NULL stream of the stream's own context (the calling thread may have
    /// another one current: it is pushed for the query and popped again).
    fn null_stream_done_for(&self, stream: StreamHandle) -> Result<bool, DeviceError> {
        self.ensure_any_current()?;
        // SAFETY: a user stream handle; an invalid one yields an error code.
        let context = unsafe { result::stream_get_ctx(&self.api, stream.0 as CUstream) }?;
        if context == result::ctx_get_current(&self.api)? {
            // SAFETY: the legacy NULL stream handle of the current context.
            return unsafe { result::stream_query(&self.api, CU_STREAM_LEGACY) };
        }
        // SAFETY: the stream's own context, popped below.
        unsafe { result::ctx_push_current(&self.api, context) }?;
        // SAFETY: the legacy NULL stream handle of the context just pushed.
        let done = unsafe { result::stream_query(&self.api, CU_STREAM_LEGACY) };
        // SAFETY: pops what we pushed.
        let _ = unsafe { result::ctx_pop_current_status(&self.api) };
        super::contexts::forget_current_context();
        done
    }
}

impl CudaDevice {
    /// Runs `enqueue` (an enqueue on the user stream `cu_stream`) with a context current;
    /// if it fails, once more in the stream's own context (it may belong to another
    /// context than the calling thread's current one), leaving the thread's as it was.
    fn enqueue_on_user_stream(
        &self,
        cu_stream: CUstream,
        enqueue: impl Fn() -> Result<(), DeviceError>,
    ) -> Result<(), DeviceError> {
        self.ensure_any_current()?;
        let first = enqueue();
        if first.is_ok() {
            return first;
        }
        // SAFETY: a user stream handle; an invalid one yields an error code.
        let Ok(context) = (unsafe { result::stream_get_ctx(&self.api, cu_stream) }) else {
            return first;
        };
        // SAFETY: the stream's context, pushed and popped around one call.
        unsafe { result::ctx_push_current(&self.api, context) }?;
        let pushed = enqueue();
        // SAFETY: pops what we pushed.
        let _ = unsafe { result::ctx_pop_current_status(&self.api) };
        super::contexts::forget_current_context();
        pushed
    }
}
