//! Raw CUDA driver API: the types, constants and entry points we use, resolved from
//! `libcuda.so.1` at run time with `dlopen`/`dlsym` (nothing CUDA is needed to build).
//! Layer 1 of 3 (raw → `Result` calls in `result.rs` → the `CudaDevice`).

#![allow(non_camel_case_types, reason = "names follow cuda.h")]

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

/// `CUresult`.
pub(crate) type CUresult = c_int;
/// `CUdevice`.
pub(crate) type CUdevice = c_int;
/// `CUdeviceptr`.
pub(crate) type CUdeviceptr = u64;
/// `CUcontext`.
pub(crate) type CUcontext = *mut c_void;
/// `CUstream`.
pub(crate) type CUstream = *mut c_void;
/// `CUevent`.
pub(crate) type CUevent = *mut c_void;
/// `CUhostFn`.
pub(crate) type CUhostFn = unsafe extern "C" fn(*mut c_void);

pub(crate) const CUDA_SUCCESS: CUresult = 0;
pub(crate) const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub(crate) const CUDA_ERROR_NOT_READY: CUresult = 600;

pub(crate) const CU_MEMHOSTALLOC_PORTABLE: c_uint = 0x1;
pub(crate) const CU_MEMHOSTALLOC_DEVICEMAP: c_uint = 0x2;
pub(crate) const CU_MEMHOSTREGISTER_PORTABLE: c_uint = 0x1;
pub(crate) const CU_MEMHOSTREGISTER_DEVICEMAP: c_uint = 0x2;
pub(crate) const CU_STREAM_NON_BLOCKING: c_uint = 0x1;
/// `CU_STREAM_LEGACY`: the NULL stream with legacy synchronization, of the current context.
pub(crate) const CU_STREAM_LEGACY: CUstream = 0x1 as CUstream;
pub(crate) const CU_EVENT_DISABLE_TIMING: c_uint = 0x2;
pub(crate) const CU_STREAM_WAIT_VALUE_GEQ: c_uint = 0x0;
pub(crate) const CU_STREAM_WRITE_VALUE_DEFAULT: c_uint = 0x0;
pub(crate) const CU_STREAM_MEM_OP_WAIT_VALUE_32: c_uint = 1;
pub(crate) const CU_STREAM_MEM_OP_WRITE_VALUE_32: c_uint = 2;

/// One entry of `cuStreamBatchMemOp`: cuda.h's `CUstreamBatchMemOpParams` union (48
/// bytes), in the layout its wait-value and write-value members share.
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CUstreamBatchMemOpParams {
    /// `CUstreamBatchMemOpType`.
    pub(crate) operation: c_uint,
    pub(crate) address: CUdeviceptr,
    /// `value` (32-bit ops use the low half of the `value`/`value64` union: CUDA runs on
    /// little-endian hosts only).
    pub(crate) value64: u64,
    pub(crate) flags: c_uint,
    /// For the driver's use.
    pub(crate) alias: CUdeviceptr,
    pub(crate) pad: u64,
}

const _: () = assert!(size_of::<CUstreamBatchMemOpParams>() == 48);
const _: () = assert!(std::mem::offset_of!(CUstreamBatchMemOpParams, address) == 8);
const _: () = assert!(std::mem::offset_of!(CUstreamBatchMemOpParams, value64) == 16);
const _: () = assert!(std::mem::offset_of!(CUstreamBatchMemOpParams, flags) == 24);
const _: () = assert!(std::mem::offset_of!(CUstreamBatchMemOpParams, alias) == 32);

/// `CUmemGenericAllocationHandle`.
pub(crate) type CUmemGenericAllocationHandle = u64;
/// `CU_MEM_ALLOCATION_TYPE_PINNED`.
pub(crate) const CU_MEM_ALLOCATION_TYPE_PINNED: c_uint = 1;
/// `CU_MEM_LOCATION_TYPE_DEVICE`.
pub(crate) const CU_MEM_LOCATION_TYPE_DEVICE: c_uint = 1;
/// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`.
pub(crate) const CU_MEM_ACCESS_FLAGS_PROT_READWRITE: c_uint = 3;
/// `CU_MEM_ALLOC_GRANULARITY_MINIMUM`.
pub(crate) const CU_MEM_ALLOC_GRANULARITY_MINIMUM: c_uint = 0;

/// cuda.h's `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CUmemLocation {
    /// `CUmemLocationType`.
    pub(crate) kind: c_uint,
    pub(crate) id: c_int,
}

/// cuda.h's `CUmemAllocationProp` (32 bytes; the handle types, the Windows metadata and
/// the allocation flags stay zero).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct CUmemAllocationProp {
    /// `CUmemAllocationType`.
    pub(crate) kind: c_uint,
    pub(crate) requested_handle_types: c_uint,
    pub(crate) location: CUmemLocation,
    pub(crate) win32_handle_meta_data: *mut c_void,
    /// `allocFlags`: compression type, GPUDirect RDMA capable, usage, reserved.
    pub(crate) alloc_flags: [u8; 8],
}

const _: () = assert!(size_of::<CUmemAllocationProp>() == 32);
const _: () = assert!(std::mem::offset_of!(CUmemAllocationProp, location) == 8);
const _: () = assert!(std::mem::offset_of!(CUmemAllocationProp, alloc_flags) == 24);

/// cuda.h's `CUmemAccessDesc` (12 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CUmemAccessDesc {
    pub(crate) location: CUmemLocation,
    /// `CUmemAccess_flags`.
    pub(crate) flags: c_uint,
}

const _: () = assert!(size_of::<CUmemAccessDesc>() == 12);

pub(crate) const CU_POINTER_ATTRIBUTE_MEMORY_TYPE: c_int = 2;
pub(crate) const CU_POINTER_ATTRIBUTE_IS_MANAGED: c_int = 8;
pub(crate) const CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: c_int = 9;
pub(crate) const CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: c_int = 11;
pub(crate) const CU_POINTER_ATTRIBUTE_RANGE_SIZE: c_int = 12;

pub(crate) const CU_MEMORYTYPE_DEVICE: c_uint = 2;
pub(crate) const CU_MEMORYTYPE_ARRAY: c_uint = 3;
pub(crate) const CU_MEMORYTYPE_UNIFIED: c_uint = 4;

pub(crate) const CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1: c_int = 92;

macro_rules! driver_api {
    (required { $( $field:ident : fn($($arg:ty),*) = [$($symbol:literal),+]; )* }
     optional { $( $opt_field:ident : fn($($opt_arg:ty),*) = [$($opt_symbol:literal),+]; )* }) => {
        /// The entry points, resolved once (`Option` for those a driver may lack).
        #[allow(non_snake_case, reason = "names follow cuda.h")]
        pub(crate) struct Api {
            $( pub(crate) $field: unsafe extern "C" fn($($arg),*) -> CUresult, )*
            $( pub(crate) $opt_field: Option<unsafe extern "C" fn($($opt_arg),*) -> CUresult>, )*
            _library: Library,
        }

        impl Api {
            /// Loads libcuda and resolves every entry point (the first symbol name that
            /// exists, newest ABI first).
            pub(crate) fn load() -> Result<Api, String> {
                let library = Library::open(&["libcuda.so.1", "libcuda.so"])?;
                Ok(Api {
                    $( $field: {
                        let address = library.symbol(&[$($symbol),+])?;
                        // SAFETY: the symbol was resolved from libcuda under a name whose C
                        // signature is exactly this function type (cuda.h).
                        unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) -> CUresult>(address) }
                    }, )*
                    $( $opt_field: library.symbol(&[$($opt_symbol),+]).ok().map(|address| {
                        // SAFETY: as above.
                        unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($opt_arg),*) -> CUresult>(address) }
                    }), )*
                    _library: library,
                })
            }
        }
    };
}

driver_api! {
    required {
    cuInit: fn(c_uint) = ["cuInit"];
    cuDriverGetVersion: fn(*mut c_int) = ["cuDriverGetVersion"];
    cuDeviceGetCount: fn(*mut c_int) = ["cuDeviceGetCount"];
    cuDeviceGet: fn(*mut CUdevice, c_int) = ["cuDeviceGet"];
    cuDeviceGetAttribute: fn(*mut c_int, c_int, CUdevice) = ["cuDeviceGetAttribute"];
    cuDevicePrimaryCtxRetain: fn(*mut CUcontext, CUdevice) = ["cuDevicePrimaryCtxRetain"];
    cuCtxSetCurrent: fn(CUcontext) = ["cuCtxSetCurrent"];
    cuCtxGetCurrent: fn(*mut CUcontext) = ["cuCtxGetCurrent"];
    cuCtxGetDevice: fn(*mut CUdevice) = ["cuCtxGetDevice"];
    cuCtxPushCurrent: fn(CUcontext) = ["cuCtxPushCurrent_v2", "cuCtxPushCurrent"];
    cuCtxPopCurrent: fn(*mut CUcontext) = ["cuCtxPopCurrent_v2", "cuCtxPopCurrent"];
    cuMemHostAlloc: fn(*mut *mut c_void, usize, c_uint) = ["cuMemHostAlloc"];
    cuMemFreeHost: fn(*mut c_void) = ["cuMemFreeHost"];
    cuMemHostGetDevicePointer: fn(*mut CUdeviceptr, *mut c_void, c_uint) = ["cuMemHostGetDevicePointer_v2", "cuMemHostGetDevicePointer"];
    cuMemHostRegister: fn(*mut c_void, usize, c_uint) = ["cuMemHostRegister_v2", "cuMemHostRegister"];
    cuMemHostUnregister: fn(*mut c_void) = ["cuMemHostUnregister"];
    cuMemAlloc: fn(*mut CUdeviceptr, usize) = ["cuMemAlloc_v2", "cuMemAlloc"];
    cuMemFree: fn(CUdeviceptr) = ["cuMemFree_v2", "cuMemFree"];
    cuMemcpyHtoDAsync: fn(CUdeviceptr, *const c_void, usize, CUstream) = ["cuMemcpyHtoDAsync_v2", "cuMemcpyHtoDAsync"];
    cuMemcpyDtoHAsync: fn(*mut c_void, CUdeviceptr, usize, CUstream) = ["cuMemcpyDtoHAsync_v2", "cuMemcpyDtoHAsync"];
    cuMemsetD8Async: fn(CUdeviceptr, u8, usize, CUstream) = ["cuMemsetD8Async"];
    cuMemcpyDtoDAsync: fn(CUdeviceptr, CUdeviceptr, usize, CUstream) = ["cuMemcpyDtoDAsync_v2", "cuMemcpyDtoDAsync"];
    cuStreamCreate: fn(*mut CUstream, c_uint) = ["cuStreamCreate"];
    cuStreamDestroy: fn(CUstream) = ["cuStreamDestroy_v2", "cuStreamDestroy"];
    cuStreamSynchronize: fn(CUstream) = ["cuStreamSynchronize"];
    cuStreamQuery: fn(CUstream) = ["cuStreamQuery"];
    cuStreamGetCtx: fn(CUstream, *mut CUcontext) = ["cuStreamGetCtx"];
    cuEventCreate: fn(*mut CUevent, c_uint) = ["cuEventCreate"];
    cuEventRecord: fn(CUevent, CUstream) = ["cuEventRecord"];
    cuEventQuery: fn(CUevent) = ["cuEventQuery"];
    cuEventDestroy: fn(CUevent) = ["cuEventDestroy_v2", "cuEventDestroy"];
    cuLaunchHostFunc: fn(CUstream, CUhostFn, *mut c_void) = ["cuLaunchHostFunc"];
    cuStreamWaitValue32: fn(CUstream, CUdeviceptr, u32, c_uint) = ["cuStreamWaitValue32_v2", "cuStreamWaitValue32"];
    cuStreamWriteValue32: fn(CUstream, CUdeviceptr, u32, c_uint) = ["cuStreamWriteValue32_v2", "cuStreamWriteValue32"];
    cuStreamBatchMemOp: fn(CUstream, c_uint, *mut CUstreamBatchMemOpParams, c_uint) = ["cuStreamBatchMemOp_v2", "cuStreamBatchMemOp"];
    cuPointerGetAttributes: fn(c_uint, *mut c_int, *mut *mut c_void, CUdeviceptr) = ["cuPointerGetAttributes"];
    cuGetErrorName: fn(CUresult, *mut *const c_char) = ["cuGetErrorName"];
    }
    optional {
        // The CUDA 11/12 ABI of `cuCtxCreate` (flags, device); CUDA 13 drivers keep it.
        cuCtxCreate_v2: fn(*mut CUcontext, c_uint, CUdevice) = ["cuCtxCreate_v2"];
        // Whether a stream is non-blocking (reads inside the submit call on a blocking
        // stream also need the NULL stream idle; without it every stream counts as one).
        cuStreamGetFlags: fn(CUstream, *mut c_uint) = ["cuStreamGetFlags"];
        // Virtual memory management (CUDA 10.2+): the engine's device memory is mapped
        // through these where the driver has them (`device_memory.rs`).
        cuMemCreate: fn(*mut CUmemGenericAllocationHandle, usize, *const CUmemAllocationProp, u64) = ["cuMemCreate"];
        cuMemRelease: fn(CUmemGenericAllocationHandle) = ["cuMemRelease"];
        cuMemAddressReserve: fn(*mut CUdeviceptr, usize, usize, CUdeviceptr, u64) = ["cuMemAddressReserve"];
        cuMemAddressFree: fn(CUdeviceptr, usize) = ["cuMemAddressFree"];
        cuMemMap: fn(CUdeviceptr, usize, usize, CUmemGenericAllocationHandle, u64) = ["cuMemMap"];
        cuMemUnmap: fn(CUdeviceptr, usize) = ["cuMemUnmap"];
        cuMemSetAccess: fn(CUdeviceptr, usize, *const CUmemAccessDesc, usize) = ["cuMemSetAccess"];
        cuMemGetAllocationGranularity: fn(*mut usize, *const CUmemAllocationProp, c_uint) = ["cuMemGetAllocationGranularity"];
    }
}

/// A `dlopen`ed library, closed on drop.
pub(crate) struct Library(*mut c_void);

// SAFETY: a dlopen handle may be used and closed from any thread.
unsafe impl Send for Library {}
// SAFETY: dlsym is thread-safe.
unsafe impl Sync for Library {}

impl Library {
    fn open(names: &[&str]) -> Result<Library, String> {
        for name in names {
            let c_name = std::ffi::CString::new(*name).map_err(|e| e.to_string())?;
            // SAFETY: c_name is a valid C string; dlopen has no other preconditions.
            let handle =
                unsafe { libc::dlopen(c_name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            if !handle.is_null() {
                return Ok(Library(handle));
            }
        }
        Err(format!("cannot load the CUDA driver ({}): {}", names.join(" or "), dlerror()))
    }

    fn symbol(&self, names: &[&str]) -> Result<*mut c_void, String> {
        for name in names {
            let c_name = std::ffi::CString::new(*name).map_err(|e| e.to_string())?;
            // SAFETY: the handle is open and c_name a valid C string.
            let address = unsafe { libc::dlsym(self.0, c_name.as_ptr()) };
            if !address.is_null() {
                return Ok(address);
            }
        }
        Err(format!("libcuda lacks {}", names.join(" / ")))
    }
}

impl Drop for Library {
    fn drop(&mut self) {
        // SAFETY: the handle came from dlopen and is closed once; no resolved function is
        // called after the Api (which owns the Library) is dropped.
        unsafe { libc::dlclose(self.0) };
    }
}

fn dlerror() -> String {
    // SAFETY: dlerror returns NULL or a valid C string owned by libc.
    let message = unsafe { libc::dlerror() };
    if message.is_null() {
        return "unknown error".into();
    }
    // SAFETY: non-NULL, NUL-terminated, valid until the next dl* call on this thread.
    unsafe { CStr::from_ptr(message) }.to_string_lossy().into_owned()
}
