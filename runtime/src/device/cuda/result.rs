//! One function per CUDA driver call, its `CUresult` mapped to [`DeviceError`] (CUDA's
//! number is reported as the `hipError_t` value; the error's name is looked up on every
//! failure, as the backend always has). Layer 2 of 3 (raw `sys.rs` → these → the
//! `CudaDevice`). Nothing here decides which context is current: the caller has made it so.
//!
//! Calls made while the backend opens report messages (`String`), as `CudaDevice::open`
//! does. A few calls return the raw status (`*_status`): their callers map it only when
//! they use it (a pop after a failed call, a clean-up after a failure), so the driver sees
//! exactly the calls it saw before this layer existed; where a call is also wanted mapped,
//! its mapped function calls the raw one.

use std::ffi::{CStr, c_int, c_uint, c_void};

use super::sys::*;
use crate::device::DeviceError;

/// The name of a CUDA error (e.g. `CUDA_ERROR_INVALID_VALUE`).
fn error_name(api: &Api, code: CUresult) -> String {
    let mut name: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: valid out-pointer; cuGetErrorName returns a static string or fails.
    if unsafe { (api.cuGetErrorName)(code, &mut name) } != CUDA_SUCCESS || name.is_null() {
        return "unknown".into();
    }
    // SAFETY: non-NULL static NUL-terminated string from the driver.
    unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned()
}

/// A failed call's [`DeviceError`] (its name looked up first, as always).
pub(super) fn error(api: &Api, code: CUresult, what: &'static str) -> DeviceError {
    let _ = error_name(api, code);
    DeviceError::new(code, what)
}

/// `Ok` for `CUDA_SUCCESS`, else [`error`].
pub(super) fn status(api: &Api, code: CUresult, what: &'static str) -> Result<(), DeviceError> {
    if code == CUDA_SUCCESS { Ok(()) } else { Err(error(api, code, what)) }
}

/// A completion query's status: `Ok(false)` for `CUDA_ERROR_NOT_READY` (work pending),
/// `Ok(true)` for `CUDA_SUCCESS`, else [`error`].
fn query_status(api: &Api, code: CUresult, what: &'static str) -> Result<bool, DeviceError> {
    if code == CUDA_ERROR_NOT_READY { Ok(false) } else { status(api, code, what).map(|()| true) }
}

/// `Ok` for `CUDA_SUCCESS`, else a message with the error's number and name.
pub(super) fn check(api: &Api, code: CUresult) -> Result<(), String> {
    if code == CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("CUDA error {code} ({})", error_name(api, code)))
    }
}

/// Whether CUDA has started (`cuInit` ran): before it every call but a few answers
/// `CUDA_ERROR_NOT_INITIALIZED`; `cuDeviceGetCount` is asked.
pub(super) fn initialized(api: &Api) -> bool {
    let mut probe_count: c_int = 0;
    // SAFETY: `probe_count` is a valid out-pointer; the call only reports state.
    unsafe { (api.cuDeviceGetCount)(&mut probe_count) != CUDA_ERROR_NOT_INITIALIZED }
}

/// `cuInit(0)`.
pub(super) fn init(api: &Api) -> Result<(), String> {
    // SAFETY: cuInit takes flags (0) and has no other precondition.
    check(api, unsafe { (api.cuInit)(0) })
}

/// `cuDeviceGetCount`.
pub(super) fn device_get_count(api: &Api) -> Result<c_int, String> {
    let mut count: c_int = 0;
    // SAFETY: `count` is a valid out-pointer.
    check(api, unsafe { (api.cuDeviceGetCount)(&mut count) })?;
    Ok(count)
}

/// `cuDeviceGet(ordinal)`.
pub(super) fn device_get(api: &Api, ordinal: c_int) -> Result<CUdevice, String> {
    let mut device: CUdevice = 0;
    // SAFETY: valid out-pointer; an invalid ordinal yields an error code.
    check(api, unsafe { (api.cuDeviceGet)(&mut device, ordinal) })?;
    Ok(device)
}

/// `cuDevicePrimaryCtxRetain(device)`.
pub(super) fn device_primary_ctx_retain(api: &Api, device: CUdevice) -> Result<CUcontext, String> {
    let mut context: CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer and device.
    check(api, unsafe { (api.cuDevicePrimaryCtxRetain)(&mut context, device) })?;
    Ok(context)
}

/// `cuDriverGetVersion`.
pub(super) fn driver_get_version(api: &Api) -> Result<c_int, String> {
    let mut version: c_int = 0;
    // SAFETY: valid out-pointer.
    check(api, unsafe { (api.cuDriverGetVersion)(&mut version) })?;
    Ok(version)
}

/// `cuDeviceGetAttribute(attribute, device)`; `None` when the call fails.
pub(super) fn device_get_attribute(api: &Api, attribute: c_int, device: CUdevice) -> Option<c_int> {
    let mut value: c_int = 0;
    // SAFETY: valid out-pointer and device.
    let code = unsafe { (api.cuDeviceGetAttribute)(&mut value, attribute, device) };
    (code == CUDA_SUCCESS).then_some(value)
}

/// `cuCtxCreate_v2(flags 0, device)`: a new context, pushed on this thread's stack.
pub(super) fn ctx_create(api: &Api, device: CUdevice) -> Result<CUcontext, String> {
    let Some(create) = api.cuCtxCreate_v2 else {
        return Err("the driver lacks cuCtxCreate_v2".into());
    };
    let mut context: CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer and device; flags 0 = CU_CTX_SCHED_AUTO.
    check(api, unsafe { create(&mut context, 0, device) })
        .map_err(|error| format!("cuCtxCreate: {error}"))?;
    Ok(context)
}

/// `cuCtxSetCurrent(context)`.
///
/// # Safety
/// `context` is a live context of ours.
pub(super) unsafe fn ctx_set_current(api: &Api, context: CUcontext) -> Result<(), DeviceError> {
    // SAFETY: the caller's contract.
    status(api, unsafe { (api.cuCtxSetCurrent)(context) }, "cuCtxSetCurrent")
}

/// `cuCtxGetCurrent`: the calling thread's current context (NULL: none).
pub(super) fn ctx_get_current(api: &Api) -> Result<CUcontext, DeviceError> {
    let mut current: CUcontext = std::ptr::null_mut();
    // SAFETY: `current` is a valid out-pointer.
    status(api, unsafe { (api.cuCtxGetCurrent)(&mut current) }, "cuCtxGetCurrent")?;
    Ok(current)
}

/// `cuCtxPushCurrent(context)`.
///
/// # Safety
/// `context` is a live context (ours, or the one a user stream belongs to), popped again
/// by the caller.
pub(super) unsafe fn ctx_push_current(api: &Api, context: CUcontext) -> Result<(), DeviceError> {
    // SAFETY: the caller's contract.
    status(api, unsafe { (api.cuCtxPushCurrent)(context) }, "cuCtxPushCurrent")
}

/// `cuCtxPopCurrent`, the status raw (see the module documentation).
///
/// # Safety
/// The caller pushed (or `cuCtxCreate` pushed) the context this pops.
pub(super) unsafe fn ctx_pop_current_status(api: &Api) -> CUresult {
    let mut popped: CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer; the caller's contract.
    unsafe { (api.cuCtxPopCurrent)(&mut popped) }
}

/// `cuCtxGetDevice` of the current context: the status raw and the device.
pub(super) fn ctx_get_device_status(api: &Api) -> (CUresult, CUdevice) {
    let mut device: CUdevice = 0;
    // SAFETY: valid out-pointer; without a current context the call yields an error code.
    let code = unsafe { (api.cuCtxGetDevice)(&mut device) };
    (code, device)
}

/// `cuMemHostAlloc(len_bytes, flags)`: pinned host memory.
pub(super) fn mem_host_alloc(
    api: &Api,
    len_bytes: usize,
    flags: c_uint,
) -> Result<*mut c_void, DeviceError> {
    let mut host: *mut c_void = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    status(api, unsafe { (api.cuMemHostAlloc)(&mut host, len_bytes, flags) }, "cuMemHostAlloc")?;
    Ok(host)
}

/// `cuMemHostGetDevicePointer(host, 0)`, the status raw (a failure is cleaned up first).
///
/// # Safety
/// `host` is mapped pinned host memory.
pub(super) unsafe fn mem_host_get_device_pointer_status(
    api: &Api,
    host: *mut c_void,
) -> (CUresult, CUdeviceptr) {
    let mut device_addr: CUdeviceptr = 0;
    // SAFETY: valid out-pointer; the caller's contract.
    let code = unsafe { (api.cuMemHostGetDevicePointer)(&mut device_addr, host, 0) };
    (code, device_addr)
}

/// `cuMemFreeHost`.
///
/// # Safety
/// As [`mem_free_host_status`].
pub(super) unsafe fn mem_free_host(api: &Api, host: *mut c_void) -> Result<(), DeviceError> {
    // SAFETY: the caller's contract.
    status(api, unsafe { mem_free_host_status(api, host) }, "cuMemFreeHost")
}

/// `cuMemFreeHost`, the status raw (ignored when cleaning up after another failure).
///
/// # Safety
/// `host` came from `cuMemHostAlloc`, is freed once, and no enqueued work uses it.
pub(super) unsafe fn mem_free_host_status(api: &Api, host: *mut c_void) -> CUresult {
    // SAFETY: the caller's contract.
    unsafe { (api.cuMemFreeHost)(host) }
}

/// `cuMemHostRegister(host, len_bytes, flags)`.
///
/// # Safety
/// `host..host+len_bytes` is host memory that stays allocated until unregistered.
pub(super) unsafe fn mem_host_register(
    api: &Api,
    host: *mut c_void,
    len_bytes: usize,
    flags: c_uint,
) -> Result<(), DeviceError> {
    // SAFETY: the caller's contract.
    let code = unsafe { (api.cuMemHostRegister)(host, len_bytes, flags) };
    status(api, code, "cuMemHostRegister")
}

/// `cuMemHostUnregister`.
///
/// # Safety
/// As [`mem_host_unregister_status`].
pub(super) unsafe fn mem_host_unregister(api: &Api, host: *mut c_void) -> Result<(), DeviceError> {
    // SAFETY: the caller's contract.
    status(api, unsafe { mem_host_unregister_status(api, host) }, "cuMemHostUnregister")
}

/// `cuMemHostUnregister`, the status raw (ignored when cleaning up after another failure).
///
/// # Safety
/// `host` was registered and no enqueued work uses it.
pub(super) unsafe fn mem_host_unregister_status(api: &Api, host: *mut c_void) -> CUresult {
    // SAFETY: the caller's contract.
    unsafe { (api.cuMemHostUnregister)(host) }
}

/// `cuMemAlloc` in the current context.
pub(super) fn mem_alloc(api: &Api, len_bytes: usize) -> Result<CUdeviceptr, DeviceError> {
    let mut address: CUdeviceptr = 0;
    // SAFETY: valid out-pointer.
    status(api, unsafe { (api.cuMemAlloc)(&mut address, len_bytes) }, "cuMemAlloc")?;
    Ok(address)
}

/// `cuMemFree`.
///
/// # Safety
/// As [`mem_free_status`].
pub(super) unsafe fn mem_free(api: &Api, address: CUdeviceptr) -> Result<(), DeviceError> {
    // SAFETY: the caller's contract.
    status(api, unsafe { mem_free_status(api, address) }, "cuMemFree")
}

/// `cuMemFree`, the status raw (ignored when freeing a scratch while tearing a stream
/// down).
///
/// # Safety
/// `address` came from `cuMemAlloc`, is freed once, and no enqueued work uses it.
pub(super) unsafe fn mem_free_status(api: &Api, address: CUdeviceptr) -> CUresult {
    // SAFETY: the caller's contract.
    unsafe { (api.cuMemFree)(address) }
}

/// `cuMemcpyHtoDAsync`.
///
/// # Safety
/// `source` (pinned) stays readable for `len_bytes` until the copy has run; the target
/// range is device memory; `stream` belongs to the current context.
pub(super) unsafe fn memcpy_htod_async(
    api: &Api,
    target: CUdeviceptr,
    source: *const u8,
    len_bytes: usize,
    stream: CUstream,
) -> Result<(), DeviceError> {
    // SAFETY: the caller's contract.
    let code = unsafe { (api.cuMemcpyHtoDAsync)(target, source.cast(), len_bytes, stream) };
    status(api, code, "cuMemcpyHtoDAsync")
}

/// `cuMemcpyDtoHAsync`.
///
/// # Safety
/// `target` (pinned) stays writable for `len_bytes` until the copy has run; the source
/// range is device memory; `stream` is a live stream.
pub(super) unsafe fn memcpy_dtoh_async(
    api: &Api,
    target: *mut u8,
    source: CUdeviceptr,
    len_bytes: usize,
    stream: CUstream,
) -> Result<(), DeviceError> {
    // SAFETY: the caller's contract.
    let code = unsafe { (api.cuMemcpyDtoHAsync)(target.cast(), source, len_bytes, stream) };
    status(api, code, "cuMemcpyDtoHAsync")
}

/// `cuMemcpyDtoDAsync`.
///
/// # Safety
/// Both ranges are device memory of `len_bytes`; `stream` orders the copy after the
/// writes of its source.
pub(super) unsafe fn memcpy_dtod_async(
    api: &Api,
    target: CUdeviceptr,
    source: CUdeviceptr,
    len_bytes: usize,
    stream: CUstream,
) -> Result<(), DeviceError> {
    // SAFETY: the caller's contract.
    let code = unsafe { (api.cuMemcpyDtoDAsync)(target, source, len_bytes, stream) };
    status(api, code, "cuMemcpyDtoDAsync")
}

/// `cuMemsetD8Async`.
///
/// # Safety
/// `target..target+len_bytes` is device memory; `stream` is a stream handle.
pub(super) unsafe fn memset_d8_async(
    api: &Api,
    target: CUdeviceptr,
    value: u8,
    len_bytes: usize,
    stream: CUstream,
) -> Result<(), DeviceError> {
    // SAFETY: the caller's contract.
    let code = unsafe { (api.cuMemsetD8Async)(target, value, len_bytes, stream) };
    status(api, code, "cuMemsetD8Async")
}

/// `cuStreamCreate(flags)` in the current context.
pub(super) fn stream_create(api: &Api, flags: c_uint) -> Result<CUstream, DeviceError> {
    let mut stream: CUstream = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    status(api, unsafe { (api.cuStreamCreate)(&mut stream, flags) }, "cuStreamCreate")?;
    Ok(stream)
}

/// `cuStreamDestroy` (pending work still completes).
///
/// # Safety
/// `stream` is a stream handle (an invalid one yields an error code), not used afterwards.
pub(super) unsafe fn stream_destroy(api: &Api, stream: CUstream) -> Result<(), DeviceError> {
    // SAFETY: the caller's contract.
    status(api, unsafe { (api.cuStreamDestroy)(stream) }, "cuStreamDestroy")
}

/// `cuStreamSynchronize`.
///
/// # Safety
/// As [`stream_synchronize_status`].
pub(super) unsafe fn stream_synchronize(api: &Api, stream: CUstream) -> Result<(), DeviceError> {
    // SAFETY: the caller's contract.
    status(api, unsafe { stream_synchronize_status(api, stream) }, "cuStreamSynchronize")
}

/// `cuStreamSynchronize`, the status raw (ignored when waiting for a stream before
/// freeing what it used).
///
/// # Safety
/// `stream` is a stream handle (an invalid one yields an error code).
pub(super) unsafe fn stream_synchronize_status(api: &Api, stream: CUstream) -> CUresult {
    // SAFETY: the caller's contract.
    unsafe { (api.cuStreamSynchronize)(stream) }
}

/// `cuStreamQuery`: `Ok(true)` once the stream's work is complete.
///
/// # Safety
/// `stream` is a stream handle (an invalid one yields an error code).
pub(super) unsafe fn stream_query(api: &Api, stream: CUstream) -> Result<bool, DeviceError> {
    // SAFETY: the caller's contract.
    query_status(api, unsafe { (api.cuStreamQuery)(stream) }, "cuStreamQuery")
}

/// `cuStreamGetFlags`: the flags a stream was made with (`CU_STREAM_NON_BLOCKING` or not).
///
/// # Safety
/// `stream` is a stream handle (an invalid one yields an error code).
pub(super) unsafe fn stream_get_flags(api: &Api, stream: CUstream) -> Result<c_uint, DeviceError> {
    let Some(get_flags) = api.cuStreamGetFlags else {
        let what = "the driver lacks cuStreamGetFlags";
        return Err(DeviceError::new(DeviceError::HIP_ERROR_NOT_SUPPORTED, what));
    };
    let mut flags: c_uint = 0;
    // SAFETY: valid out-pointer; the caller's contract.
    status(api, unsafe { get_flags(stream, &mut flags) }, "cuStreamGetFlags")?;
    Ok(flags)
}

/// `cuStreamGetCtx`: the context a stream belongs to.
///
/// # Safety
/// `stream` is a stream handle (an invalid one yields an error code).
pub(super) unsafe fn stream_get_ctx(api: &Api, stream: CUstream) -> Result<CUcontext, DeviceError> {
    let mut context: CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer; the caller's contract.
    status(api, unsafe { (api.cuStreamGetCtx)(stream, &mut context) }, "cuStreamGetCtx")?;
    Ok(context)
}

/// `cuStreamWriteValue32(stream, word, value, CU_STREAM_WRITE_VALUE_DEFAULT)`.
///
/// # Safety
/// `word_device_addr` is a live, aligned pinned word until the write has happened.
pub(super) unsafe fn stream_write_value32(
    api: &Api,
    stream: CUstream,
    word_device_addr: CUdeviceptr,
    value: u32,
) -> Result<(), DeviceError> {
    // SAFETY: the caller's contract.
    let code = unsafe {
        (api.cuStreamWriteValue32)(stream, word_device_addr, value, CU_STREAM_WRITE_VALUE_DEFAULT)
    };
    status(api, code, "cuStreamWriteValue32")
}

/// `cuStreamWaitValue32(stream, word, value, CU_STREAM_WAIT_VALUE_GEQ)`.
///
/// # Safety
/// The word stays allocated until the wait has been satisfied.
pub(super) unsafe fn stream_wait_value32_geq(
    api: &Api,
    stream: CUstream,
    word_device_addr: CUdeviceptr,
    value: u32,
) -> Result<(), DeviceError> {
    // SAFETY: the caller's contract.
    let code = unsafe {
        (api.cuStreamWaitValue32)(stream, word_device_addr, value, CU_STREAM_WAIT_VALUE_GEQ)
    };
    status(api, code, "cuStreamWaitValue32")
}

/// `cuStreamBatchMemOp(stream, ops, 0)`, the status raw (a failure falls back to the ops
/// one by one, unmapped).
///
/// # Safety
/// `ops` are initialized entries in cuda.h's layout whose words stay allocated until the
/// ops have run.
pub(super) unsafe fn stream_batch_mem_op_status(
    api: &Api,
    stream: CUstream,
    ops: &mut [CUstreamBatchMemOpParams],
) -> CUresult {
    // SAFETY: the caller's contract; `ops.len()` entries at `ops`.
    unsafe { (api.cuStreamBatchMemOp)(stream, ops.len() as c_uint, ops.as_mut_ptr(), 0) }
}

/// `cuLaunchHostFunc(stream, func, user_data)`.
///
/// # Safety
/// `func` is sound to call with `user_data` on a driver thread once the stream's earlier
/// work is done, and `user_data` stays valid until then.
pub(super) unsafe fn launch_host_func(
    api: &Api,
    stream: CUstream,
    func: CUhostFn,
    user_data: *mut c_void,
) -> Result<(), DeviceError> {
    // SAFETY: the caller's contract.
    status(api, unsafe { (api.cuLaunchHostFunc)(stream, func, user_data) }, "cuLaunchHostFunc")
}

/// `cuEventCreate(flags)` in the current context.
pub(super) fn event_create(api: &Api, flags: c_uint) -> Result<CUevent, DeviceError> {
    let mut event: CUevent = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    status(api, unsafe { (api.cuEventCreate)(&mut event, flags) }, "cuEventCreate")?;
    Ok(event)
}

/// `cuEventRecord(event, stream)`.
///
/// # Safety
/// `event` and `stream` are live and belong to the current context.
pub(super) unsafe fn event_record(
    api: &Api,
    event: CUevent,
    stream: CUstream,
) -> Result<(), DeviceError> {
    // SAFETY: the caller's contract.
    status(api, unsafe { (api.cuEventRecord)(event, stream) }, "cuEventRecord")
}

/// `cuEventQuery`: `Ok(true)` once the event's work is complete.
///
/// # Safety
/// `event` is a live event.
pub(super) unsafe fn event_query(api: &Api, event: CUevent) -> Result<bool, DeviceError> {
    // SAFETY: the caller's contract.
    query_status(api, unsafe { (api.cuEventQuery)(event) }, "cuEventQuery")
}

/// `cuEventDestroy` (CUDA defers the release if the event is pending).
///
/// # Safety
/// `event` is a live event, destroyed once and not used afterwards.
pub(super) unsafe fn event_destroy(api: &Api, event: CUevent) -> Result<(), DeviceError> {
    // SAFETY: the caller's contract.
    status(api, unsafe { (api.cuEventDestroy)(event) }, "cuEventDestroy")
}

/// `cuPointerGetAttributes` for memory type, managed flag, device ordinal and range:
/// `(memory type, is managed, ordinal, range start, range size)`; defaults (not an
/// error) for pointers CUDA does not know.
pub(super) fn pointer_get_attributes(
    api: &Api,
    ptr: CUdeviceptr,
) -> Result<(u32, u32, c_int, CUdeviceptr, usize), DeviceError> {
    let mut memory_type: u32 = 0;
    let mut is_managed: u32 = 0;
    let mut ordinal: c_int = 0;
    let mut start: CUdeviceptr = 0;
    let mut size: usize = 0;
    let mut attributes = [
        CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        CU_POINTER_ATTRIBUTE_IS_MANAGED,
        CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
        CU_POINTER_ATTRIBUTE_RANGE_SIZE,
    ];
    let mut data: [*mut c_void; 5] = [
        (&raw mut memory_type).cast(),
        (&raw mut is_managed).cast(),
        (&raw mut ordinal).cast(),
        (&raw mut start).cast(),
        (&raw mut size).cast(),
    ];
    // SAFETY: five attributes with five out-pointers of the documented sizes; the
    // plural call returns defaults (not an error) for pointers CUDA does not know.
    let code =
        unsafe { (api.cuPointerGetAttributes)(5, attributes.as_mut_ptr(), data.as_mut_ptr(), ptr) };
    if code != CUDA_SUCCESS {
        return Err(error(api, code, "cuPointerGetAttributes"));
    }
    Ok((memory_type, is_managed, ordinal, start, size))
}

/// An optional entry point, or `HIP_ERROR_NOT_SUPPORTED` naming it.
fn optional<F>(entry: Option<F>, what: &'static str) -> Result<F, DeviceError> {
    entry.ok_or(DeviceError::new(DeviceError::HIP_ERROR_NOT_SUPPORTED, what))
}

/// The properties of a plain device allocation on device `ordinal` (virtual memory
/// management: `cuMemCreate`).
pub(super) fn device_allocation_prop(ordinal: c_int) -> CUmemAllocationProp {
    CUmemAllocationProp {
        kind: CU_MEM_ALLOCATION_TYPE_PINNED,
        requested_handle_types: 0,
        location: CUmemLocation { kind: CU_MEM_LOCATION_TYPE_DEVICE, id: ordinal },
        win32_handle_meta_data: std::ptr::null_mut(),
        alloc_flags: [0; 8],
    }
}

/// `cuMemGetAllocationGranularity(prop, minimum)`.
pub(super) fn mem_get_allocation_granularity(
    api: &Api,
    prop: &CUmemAllocationProp,
) -> Result<usize, DeviceError> {
    let call = optional(api.cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity")?;
    let mut granularity = 0usize;
    // SAFETY: valid out-pointer and properties.
    let code = unsafe { call(&mut granularity, prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) };
    status(api, code, "cuMemGetAllocationGranularity")?;
    Ok(granularity)
}

/// `cuMemCreate(len_bytes, prop)`: physical memory, not yet mapped.
pub(super) fn mem_create(
    api: &Api,
    len_bytes: usize,
    prop: &CUmemAllocationProp,
) -> Result<CUmemGenericAllocationHandle, DeviceError> {
    let call = optional(api.cuMemCreate, "cuMemCreate")?;
    let mut handle: CUmemGenericAllocationHandle = 0;
    // SAFETY: valid out-pointer and properties; flags must be 0.
    status(api, unsafe { call(&mut handle, len_bytes, prop, 0) }, "cuMemCreate")?;
    Ok(handle)
}

/// `cuMemRelease(handle)`: a mapping keeps the memory until it is unmapped.
///
/// # Safety
/// `handle` came from [`mem_create`] and is released once.
pub(super) unsafe fn mem_release(
    api: &Api,
    handle: CUmemGenericAllocationHandle,
) -> Result<(), DeviceError> {
    let call = optional(api.cuMemRelease, "cuMemRelease")?;
    // SAFETY: the caller's contract.
    status(api, unsafe { call(handle) }, "cuMemRelease")
}

/// `cuMemAddressReserve(len_bytes, alignment)`: a range of the process's unified address
/// space.
pub(super) fn mem_address_reserve(
    api: &Api,
    len_bytes: usize,
    alignment: usize,
) -> Result<CUdeviceptr, DeviceError> {
    let call = optional(api.cuMemAddressReserve, "cuMemAddressReserve")?;
    let mut address: CUdeviceptr = 0;
    // SAFETY: valid out-pointer; no fixed address, flags 0.
    let code = unsafe { call(&mut address, len_bytes, alignment, 0, 0) };
    status(api, code, "cuMemAddressReserve")?;
    Ok(address)
}

/// `cuMemAddressFree(address, len_bytes)`.
///
/// # Safety
/// The range came from [`mem_address_reserve`], nothing is mapped in it, freed once.
pub(super) unsafe fn mem_address_free(
    api: &Api,
    address: CUdeviceptr,
    len_bytes: usize,
) -> Result<(), DeviceError> {
    let call = optional(api.cuMemAddressFree, "cuMemAddressFree")?;
    // SAFETY: the caller's contract.
    status(api, unsafe { call(address, len_bytes) }, "cuMemAddressFree")
}

/// `cuMemMap(address, len_bytes, offset 0, handle)`.
///
/// # Safety
/// The range is reserved and unmapped; `handle` holds at least `len_bytes`.
pub(super) unsafe fn mem_map(
    api: &Api,
    address: CUdeviceptr,
    len_bytes: usize,
    handle: CUmemGenericAllocationHandle,
) -> Result<(), DeviceError> {
    let call = optional(api.cuMemMap, "cuMemMap")?;
    // SAFETY: the caller's contract; flags must be 0.
    status(api, unsafe { call(address, len_bytes, 0, handle, 0) }, "cuMemMap")
}

/// `cuMemUnmap(address, len_bytes)`.
///
/// # Safety
/// The range is mapped by [`mem_map`] and no queued work uses it.
pub(super) unsafe fn mem_unmap(
    api: &Api,
    address: CUdeviceptr,
    len_bytes: usize,
) -> Result<(), DeviceError> {
    let call = optional(api.cuMemUnmap, "cuMemUnmap")?;
    // SAFETY: the caller's contract.
    status(api, unsafe { call(address, len_bytes) }, "cuMemUnmap")
}

/// `cuMemSetAccess(address, len_bytes, read-write for device `ordinal`)`.
///
/// # Safety
/// The range is mapped.
pub(super) unsafe fn mem_set_access_read_write(
    api: &Api,
    address: CUdeviceptr,
    len_bytes: usize,
    ordinal: c_int,
) -> Result<(), DeviceError> {
    let call = optional(api.cuMemSetAccess, "cuMemSetAccess")?;
    let access = CUmemAccessDesc {
        location: CUmemLocation { kind: CU_MEM_LOCATION_TYPE_DEVICE, id: ordinal },
        flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: the caller's contract; one valid descriptor.
    status(api, unsafe { call(address, len_bytes, &access, 1) }, "cuMemSetAccess")
}
