//! Raw HIP runtime symbols: the `hip-sys` bindings we use, the two entry points they lack,
//! and a plain-integer view of `hipPointerAttribute_t`. Layer 1 of 3 (raw → `Result`
//! calls in `result.rs` → the `RocmDevice`).

use std::ffi::{c_int, c_uint, c_void};

pub(super) use hip_sys::hiprt::{
    hipDeviceAttribute_t, hipDeviceGetAttribute, hipDeviceGetStreamPriorityRange, hipError_t,
    hipEvent_t, hipEventCreateWithFlags, hipEventDestroy, hipEventDisableTiming, hipEventQuery,
    hipEventRecord, hipFree, hipGetDevice, hipGetDeviceCount, hipGetErrorName, hipHostFree,
    hipHostGetDevicePointer, hipHostMalloc, hipHostMallocMapped, hipHostMallocPortable,
    hipHostRegister, hipHostRegisterMapped, hipHostRegisterPortable, hipHostUnregister, hipInit,
    hipMalloc, hipMemcpyDtoHAsync, hipMemcpyHtoDAsync, hipMemsetD8Async, hipPointerAttribute_t,
    hipPointerGetAttributes, hipSetDevice, hipStream_t, hipStreamAddCallback,
    hipStreamCreateWithFlags, hipStreamCreateWithPriority, hipStreamDestroy, hipStreamNonBlocking,
    hipStreamQuery, hipStreamSynchronize, hipStreamWaitValue32, hipStreamWaitValueGte,
    hipStreamWriteValue32,
};

// HIP entry points that `libamdhip64` exports (HIP 4.2+) but the `hip-sys` bindings lack.
// They return plain integers here, so no out-of-range enum value can ever be produced.
unsafe extern "C" {
    /// `hipError_t hipMemGetAddressRange(hipDeviceptr_t*, size_t*, hipDeviceptr_t)`.
    pub(super) fn hipMemGetAddressRange(
        base: *mut *mut c_void,
        size: *mut usize,
        ptr: *mut c_void,
    ) -> c_int;
    /// `hipError_t hipStreamGetFlags(hipStream_t, unsigned int*)`.
    pub(super) fn hipStreamGetFlags(stream: hipStream_t, flags: *mut c_uint) -> c_int;
    /// `int hipGetStreamDeviceId(hipStream_t)`: the stream's device, or -1.
    pub(super) fn hipGetStreamDeviceId(stream: hipStream_t) -> c_int;
}

/// `hipPointerAttribute_t` with the memory type as a plain integer (so an unexpected
/// value from the library is never read as a Rust enum). Same layout as the binding's.
#[repr(C)]
pub(super) struct RawPointerAttributes {
    pub(super) memory_type: c_uint,
    pub(super) device: c_int,
    pub(super) device_pointer: *mut c_void,
    pub(super) host_pointer: *mut c_void,
    pub(super) is_managed: c_int,
    pub(super) allocation_flags: c_uint,
}

const _: () = assert!(
    size_of::<RawPointerAttributes>() == size_of::<hipPointerAttribute_t>()
        && align_of::<RawPointerAttributes>() == align_of::<hipPointerAttribute_t>()
);

/// `hipMemoryTypeDevice`, `hipMemoryTypeArray`, `hipMemoryTypeUnified`, `hipMemoryTypeManaged`.
pub(super) const MEMORY_TYPE_DEVICE: c_uint = 1;
pub(super) const MEMORY_TYPE_ARRAY: c_uint = 2;
pub(super) const MEMORY_TYPE_UNIFIED: c_uint = 3;
pub(super) const MEMORY_TYPE_MANAGED: c_uint = 4;
