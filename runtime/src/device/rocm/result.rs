//! One function per HIP call, its `hipError_t` mapped to [`DeviceError`] (the number
//! unchanged, `what` naming the call). Layer 2 of 3 (raw `sys.rs` → these → the
//! `RocmDevice`). Nothing here decides which device is current: the caller has made it so.

use std::ffi::{CStr, c_int, c_uint, c_void};

use super::sys::*;
use crate::device::DeviceError;

/// `Ok` for `hipSuccess`, else the code as a [`DeviceError`] saying `what`.
fn status(code: hipError_t, what: &'static str) -> Result<(), DeviceError> {
    if code == hipError_t::hipSuccess { Ok(()) } else { Err(DeviceError::new(code as i32, what)) }
}

/// A completion query's status: `Ok(false)` for `hipErrorNotReady` (work pending),
/// `Ok(true)` for `hipSuccess`, else the code as a [`DeviceError`] saying `what`.
fn query_status(code: hipError_t, what: &'static str) -> Result<bool, DeviceError> {
    if code == hipError_t::hipErrorNotReady { Ok(false) } else { status(code, what).map(|()| true) }
}

/// The name of a HIP error (e.g. `hipErrorNoDevice`).
fn error_name(code: hipError_t) -> String {
    // SAFETY: hipGetErrorName takes any error value and returns a static string or NULL.
    let name = unsafe { hipGetErrorName(code) };
    if name.is_null() {
        return "unknown".into();
    }
    // SAFETY: non-NULL static NUL-terminated string from the runtime.
    unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned()
}

/// `Ok` for `hipSuccess`, else a message with the error's number and name (for opening
/// the backend, whose errors are messages).
fn described(code: hipError_t, what: &str) -> Result<(), String> {
    if code == hipError_t::hipSuccess {
        Ok(())
    } else {
        Err(format!("{what}: hipError {} ({})", code as i32, error_name(code)))
    }
}

/// A device address as HIP's `hipDeviceptr_t`.
pub(super) fn device_ptr(addr: u64) -> *mut c_void {
    addr as usize as *mut c_void
}

/// `hipInit(0)`.
///
/// # Errors
/// A message naming the error (no driver, no device).
pub(super) fn init() -> Result<(), String> {
    // SAFETY: hipInit takes flags (0) and has no other precondition.
    described(unsafe { hipInit(0) }, "hipInit")
}

/// `hipGetDeviceCount`.
///
/// # Errors
/// A message naming the error.
pub(super) fn get_device_count() -> Result<c_int, String> {
    let mut count: c_int = 0;
    // SAFETY: `count` is a valid out-pointer.
    described(unsafe { hipGetDeviceCount(&mut count) }, "hipGetDeviceCount")?;
    Ok(count)
}

/// `hipDeviceGetAttribute(attribute, ordinal)`.
pub(super) fn device_get_attribute(
    attribute: hipDeviceAttribute_t,
    ordinal: c_int,
) -> Result<c_int, DeviceError> {
    let mut value: c_int = 0;
    // SAFETY: valid out-pointer; an invalid ordinal yields an error code.
    let code = unsafe { hipDeviceGetAttribute(&mut value, attribute, ordinal) };
    status(code, "hipDeviceGetAttribute")?;
    Ok(value)
}

/// `hipSetDevice(ordinal)`.
pub(super) fn set_device(ordinal: c_int) -> Result<(), DeviceError> {
    // SAFETY: an invalid ordinal yields an error code.
    status(unsafe { hipSetDevice(ordinal) }, "hipSetDevice")
}

/// `hipGetDevice`: the calling thread's current device.
pub(super) fn get_device() -> Result<c_int, DeviceError> {
    let mut device: c_int = 0;
    // SAFETY: valid out-pointer.
    status(unsafe { hipGetDevice(&mut device) }, "hipGetDevice")?;
    Ok(device)
}

/// `hipGetStreamDeviceId`: the device of a stream (-1 from HIP: an unknown stream).
///
/// # Safety
/// `stream` is a stream handle an application passed (HIP validates it).
pub(super) unsafe fn get_stream_device_id(stream: hipStream_t) -> Result<u32, DeviceError> {
    // SAFETY: the caller's contract; HIP returns -1 for unknown streams.
    let device = unsafe { hipGetStreamDeviceId(stream) };
    if device < 0 {
        return Err(DeviceError::new(DeviceError::HIP_ERROR_INVALID_HANDLE, "unknown stream"));
    }
    Ok(device as u32)
}

/// `hipPointerGetAttributes`, read through [`RawPointerAttributes`].
///
/// # Errors
/// HIP's error (`hipErrorInvalidValue` for memory it does not know).
pub(super) fn pointer_get_attributes(ptr: u64) -> Result<RawPointerAttributes, DeviceError> {
    let mut attributes = RawPointerAttributes {
        memory_type: 0,
        device: 0,
        device_pointer: std::ptr::null_mut(),
        host_pointer: std::ptr::null_mut(),
        is_managed: 0,
        allocation_flags: 0,
    };
    // SAFETY: RawPointerAttributes has hipPointerAttribute_t's layout (asserted in sys.rs)
    // and is only read through its own plain-integer fields; any address may be asked.
    let code = unsafe {
        hipPointerGetAttributes(
            (&raw mut attributes).cast::<hipPointerAttribute_t>(),
            device_ptr(ptr).cast_const(),
        )
    };
    status(code, "hipPointerGetAttributes")?;
    Ok(attributes)
}

/// `hipMemGetAddressRange`: `(base, length in bytes)` of the allocation holding `ptr`.
///
/// # Errors
/// The address lies in no allocation.
pub(super) fn mem_get_address_range(ptr: u64) -> Result<(u64, u64), DeviceError> {
    let mut base: *mut c_void = std::ptr::null_mut();
    let mut size: usize = 0;
    // SAFETY: valid out-pointers; an address outside any allocation yields an error.
    let code = unsafe { hipMemGetAddressRange(&mut base, &mut size, device_ptr(ptr)) };
    if code != 0 {
        return Err(DeviceError::new(code, "hipMemGetAddressRange"));
    }
    Ok((base as u64, size as u64))
}

/// `hipMalloc` on the current device.
pub(super) fn malloc(len_bytes: usize) -> Result<u64, DeviceError> {
    let mut address: *mut c_void = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    status(unsafe { hipMalloc(&mut address, len_bytes) }, "hipMalloc")?;
    Ok(address as u64)
}

/// `hipFree`.
///
/// # Safety
/// `address` came from `hipMalloc` and no enqueued work uses it any more.
pub(super) unsafe fn free(address: u64) -> Result<(), DeviceError> {
    // SAFETY: the caller's contract.
    status(unsafe { hipFree(device_ptr(address)) }, "hipFree")
}

/// `hipHostMalloc(len_bytes, flags)`: pinned host memory.
pub(super) fn host_malloc(len_bytes: usize, flags: c_uint) -> Result<*mut c_void, DeviceError> {
    let mut host: *mut c_void = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    status(unsafe { hipHostMalloc(&mut host, len_bytes, flags) }, "hipHostMalloc")?;
    Ok(host)
}

/// `hipHostFree`.
///
/// # Safety
/// `host` came from `hipHostMalloc`, is freed once, and no enqueued work uses it.
pub(super) unsafe fn host_free(host: *mut c_void) -> Result<(), DeviceError> {
    // SAFETY: the caller's contract.
    status(unsafe { hipHostFree(host) }, "hipHostFree")
}

/// `hipHostRegister(host, len_bytes, flags)`.
///
/// # Safety
/// `host..host+len_bytes` is host memory that stays allocated until `hipHostUnregister`.
pub(super) unsafe fn host_register(
    host: *mut c_void,
    len_bytes: usize,
    flags: c_uint,
) -> Result<(), DeviceError> {
    // SAFETY: the caller's contract.
    status(unsafe { hipHostRegister(host, len_bytes, flags) }, "hipHostRegister")
}

/// `hipHostUnregister`.
///
/// # Safety
/// `host` was registered and no enqueued work uses it.
pub(super) unsafe fn host_unregister(host: *mut c_void) -> Result<(), DeviceError> {
    // SAFETY: the caller's contract.
    status(unsafe { hipHostUnregister(host) }, "hipHostUnregister")
}

/// `hipHostGetDevicePointer`: the device address of mapped pinned host memory.
///
/// # Safety
/// `host` is pinned, mapped host memory (`hipHostMalloc`ed or registered).
pub(super) unsafe fn host_get_device_pointer(host: *mut c_void) -> Result<u64, DeviceError> {
    let mut device_addr: *mut c_void = std::ptr::null_mut();
    // SAFETY: valid out-pointer; the caller's contract.
    let code = unsafe { hipHostGetDevicePointer(&mut device_addr, host, 0) };
    status(code, "hipHostGetDevicePointer")?;
    Ok(device_addr as u64)
}

/// `hipStreamCreateWithFlags(flags)` on the current device.
pub(super) fn stream_create_with_flags(flags: c_uint) -> Result<hipStream_t, DeviceError> {
    let mut stream: hipStream_t = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    let code = unsafe { hipStreamCreateWithFlags(&mut stream, flags) };
    status(code, "hipStreamCreateWithFlags")?;
    Ok(stream)
}

/// `hipDeviceGetStreamPriorityRange`: `(least, greatest)` priority of the current device.
pub(super) fn device_get_stream_priority_range() -> Result<(c_int, c_int), DeviceError> {
    let (mut least, mut greatest): (c_int, c_int) = (0, 0);
    // SAFETY: valid out-pointers.
    let code = unsafe { hipDeviceGetStreamPriorityRange(&mut least, &mut greatest) };
    status(code, "hipDeviceGetStreamPriorityRange")?;
    Ok((least, greatest))
}

/// `hipStreamCreateWithPriority(flags, priority)` on the current device.
pub(super) fn stream_create_with_priority(
    flags: c_uint,
    priority: c_int,
) -> Result<hipStream_t, DeviceError> {
    let mut stream: hipStream_t = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    let code = unsafe { hipStreamCreateWithPriority(&mut stream, flags, priority) };
    status(code, "hipStreamCreateWithPriority")?;
    Ok(stream)
}

/// `hipStreamDestroy` (pending work still completes).
///
/// # Safety
/// `stream` is a live stream (an invalid one yields an error code) not used afterwards.
pub(super) unsafe fn stream_destroy(stream: hipStream_t) -> Result<(), DeviceError> {
    // SAFETY: the caller's contract.
    status(unsafe { hipStreamDestroy(stream) }, "hipStreamDestroy")
}

/// `hipStreamSynchronize`.
///
/// # Safety
/// `stream` is a stream handle (an invalid one yields an error code).
pub(super) unsafe fn stream_synchronize(stream: hipStream_t) -> Result<(), DeviceError> {
    // SAFETY: the caller's contract.
    status(unsafe { hipStreamSynchronize(stream) }, "hipStreamSynchronize")
}

/// `hipStreamGetFlags`: the flags a stream was made with (`hipStreamNonBlocking` or not).
///
/// # Safety
/// `stream` is a stream handle (an invalid one yields an error code).
pub(super) unsafe fn stream_get_flags(stream: hipStream_t) -> Result<c_uint, DeviceError> {
    let mut flags: c_uint = 0;
    // SAFETY: valid out-pointer; the caller's contract.
    let code = unsafe { hipStreamGetFlags(stream, &mut flags) };
    if code != 0 {
        return Err(DeviceError::new(code, "hipStreamGetFlags"));
    }
    Ok(flags)
}

/// `hipStreamQuery`: `Ok(true)` once the stream's work is complete.
///
/// # Safety
/// `stream` is a stream handle (an invalid one yields an error code).
pub(super) unsafe fn stream_query(stream: hipStream_t) -> Result<bool, DeviceError> {
    // SAFETY: the caller's contract.
    query_status(unsafe { hipStreamQuery(stream) }, "hipStreamQuery")
}

/// `hipMemcpyHtoDAsync`.
///
/// # Safety
/// `source` (pinned) stays readable for `len_bytes` until the copy has run; the target
/// range is device memory; `stream` is a live stream of the current device.
pub(super) unsafe fn memcpy_htod_async(
    target: u64,
    source: *const u8,
    len_bytes: usize,
    stream: hipStream_t,
) -> Result<(), DeviceError> {
    // SAFETY: the caller's contract; HIP only reads through `source`.
    let code = unsafe {
        hipMemcpyHtoDAsync(device_ptr(target), source.cast_mut().cast(), len_bytes, stream)
    };
    status(code, "hipMemcpyHtoDAsync")
}

/// `hipMemcpyDtoHAsync`.
///
/// # Safety
/// `target` (pinned) stays writable for `len_bytes` until the copy has run; the source
/// range is device memory; `stream` is a live stream.
pub(super) unsafe fn memcpy_dtoh_async(
    target: *mut u8,
    source: u64,
    len_bytes: usize,
    stream: hipStream_t,
) -> Result<(), DeviceError> {
    // SAFETY: the caller's contract.
    let code = unsafe { hipMemcpyDtoHAsync(target.cast(), device_ptr(source), len_bytes, stream) };
    status(code, "hipMemcpyDtoHAsync")
}

/// `hipMemsetD8Async`.
///
/// # Safety
/// `target..target+len_bytes` is device memory; `stream` is a stream handle.
pub(super) unsafe fn memset_d8_async(
    target: u64,
    value: u8,
    len_bytes: usize,
    stream: hipStream_t,
) -> Result<(), DeviceError> {
    // SAFETY: the caller's contract.
    let code = unsafe { hipMemsetD8Async(device_ptr(target), value, len_bytes, stream) };
    status(code, "hipMemsetD8Async")
}

/// `hipStreamWriteValue32(stream, word, value, 0)`.
///
/// # Safety
/// `word_device_addr` is a live, aligned pinned word until the write has happened.
pub(super) unsafe fn stream_write_value32(
    stream: hipStream_t,
    word_device_addr: u64,
    value: u32,
) -> Result<(), DeviceError> {
    // SAFETY: the caller's contract.
    let code = unsafe { hipStreamWriteValue32(stream, device_ptr(word_device_addr), value, 0) };
    status(code, "hipStreamWriteValue32")
}

/// `hipStreamWaitValue32(stream, word, value, hipStreamWaitValueGte, u32::MAX)`.
///
/// # Safety
/// The word stays allocated until the wait has been satisfied.
pub(super) unsafe fn stream_wait_value32_gte(
    stream: hipStream_t,
    word_device_addr: u64,
    value: u32,
) -> Result<(), DeviceError> {
    // SAFETY: the caller's contract.
    let code = unsafe {
        hipStreamWaitValue32(
            stream,
            device_ptr(word_device_addr),
            value,
            hipStreamWaitValueGte,
            u32::MAX,
        )
    };
    status(code, "hipStreamWaitValue32")
}

/// `hipStreamAddCallback(stream, callback, user_data, 0)`.
///
/// # Safety
/// `callback` is sound to call with `user_data` on a HIP thread once the stream's earlier
/// work is done, and `user_data` stays valid until then.
pub(super) unsafe fn stream_add_callback(
    stream: hipStream_t,
    callback: unsafe extern "C" fn(hipStream_t, hipError_t, *mut c_void),
    user_data: *mut c_void,
) -> Result<(), DeviceError> {
    // SAFETY: the caller's contract.
    let code = unsafe { hipStreamAddCallback(stream, Some(callback), user_data, 0) };
    status(code, "hipStreamAddCallback")
}

/// `hipEventCreateWithFlags(flags)`.
pub(super) fn event_create_with_flags(flags: c_uint) -> Result<hipEvent_t, DeviceError> {
    let mut event: hipEvent_t = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    status(unsafe { hipEventCreateWithFlags(&mut event, flags) }, "hipEventCreateWithFlags")?;
    Ok(event)
}

/// `hipEventRecord(event, stream)`.
///
/// # Safety
/// `event` and `stream` are live and belong to the current device.
pub(super) unsafe fn event_record(
    event: hipEvent_t,
    stream: hipStream_t,
) -> Result<(), DeviceError> {
    // SAFETY: the caller's contract.
    status(unsafe { hipEventRecord(event, stream) }, "hipEventRecord")
}

/// `hipEventQuery`: `Ok(true)` once the event's work is complete.
///
/// # Safety
/// `event` is a live event.
pub(super) unsafe fn event_query(event: hipEvent_t) -> Result<bool, DeviceError> {
    // SAFETY: the caller's contract.
    query_status(unsafe { hipEventQuery(event) }, "hipEventQuery")
}

/// `hipEventDestroy` (HIP defers the release if the event is pending).
///
/// # Safety
/// `event` is a live event, destroyed once and not used afterwards.
pub(super) unsafe fn event_destroy(event: hipEvent_t) -> Result<(), DeviceError> {
    // SAFETY: the caller's contract.
    status(unsafe { hipEventDestroy(event) }, "hipEventDestroy")
}
