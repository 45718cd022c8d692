//! The `#[repr(C)]` types and constants of `hipfile.h` / `hipfile_cpu.h`, with
//! compile-time checks of their sizes, alignments, offsets and values against
//! hipFile's x86_64 ABI (`reference/hipfile-api.md` §1). The C side checks the header
//! against the same numbers (`tests/c/abi.c`).

use core::ffi::{c_char, c_int, c_uint, c_void};
use core::mem::{align_of, offset_of, size_of};

use hipfile_core::{OpError, StreamFlags};
use static_assertions::const_assert_eq;

/// `hipFileError_t`: a `hipFileOpError_t` and, for `hipFileHipDriverError` only, the
/// `hipError_t` behind it. Both enums are `int`-sized, so both fields are `c_int` (a C
/// enum is never transmuted into a Rust enum here).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HipFileError {
    /// `hipFileOpError_t err`.
    pub err: c_int,
    /// `hipError_t hip_drv_err`.
    pub hip_drv_err: c_int,
}

/// `hipFileDescr_t::handle`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union DescrHandle {
    /// `int fd` (OpaqueFD, UserspaceFS).
    pub fd: c_int,
    /// `void *hFile` (OpaqueWin32).
    pub h_file: *mut c_void,
}

/// `hipFileDescr_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct HipFileDescr {
    /// `hipFileFileHandleType_t type`.
    pub handle_type: c_int,
    /// The descriptor or handle.
    pub handle: DescrHandle,
    /// `const hipFileFSOps_t *fs_ops` (UserspaceFS only).
    pub fs_ops: *const HipFileFsOps,
}

/// `hipFileRDMAInfo_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HipFileRdmaInfo {
    /// `int version`.
    pub version: c_int,
    /// `int desc_len`.
    pub desc_len: c_int,
    /// `const char *desc_str`.
    pub desc_str: *const c_char,
}

/// `hipFileFSOps_t`: callbacks of a user-space file system (never called: that handle
/// type is not supported).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HipFileFsOps {
    /// `const char *(*fs_type)(void *handle)`.
    pub fs_type: Option<unsafe extern "C" fn(*mut c_void) -> *const c_char>,
    /// `int (*getRDMADeviceList)(void *handle, struct sockaddr **hostaddrs)`.
    pub get_rdma_device_list:
        Option<unsafe extern "C" fn(*mut c_void, *mut *mut libc::sockaddr) -> c_int>,
    /// `int (*getRDMADevicePriority)(void *, char *, size_t, hoff_t, struct sockaddr *)`.
    pub get_rdma_device_priority: Option<
        unsafe extern "C" fn(*mut c_void, *mut c_char, usize, i64, *mut libc::sockaddr) -> c_int,
    >,
    /// `ssize_t (*read)(void *, char *, size_t, hoff_t, hipFileRDMAInfo_t *)`.
    pub read: Option<
        unsafe extern "C" fn(*mut c_void, *mut c_char, usize, i64, *mut HipFileRdmaInfo) -> isize,
    >,
    /// `ssize_t (*write)(void *, const char *, size_t, hoff_t, hipFileRDMAInfo_t *)`.
    pub write: Option<
        unsafe extern "C" fn(*mut c_void, *const c_char, usize, i64, *mut HipFileRdmaInfo) -> isize,
    >,
}

/// `hipFileDriverProps_t::nvfs`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct NvfsProps {
    /// `unsigned major_version`.
    pub major_version: c_uint,
    /// `unsigned minor_version`.
    pub minor_version: c_uint,
    /// `uint64_t poll_thresh_size` (KiB).
    pub poll_thresh_size_kib: u64,
    /// `uint64_t max_direct_io_size` (KiB).
    pub max_direct_io_size_kib: u64,
    /// `unsigned driver_status_flags`.
    pub driver_status_flags: c_uint,
    /// `unsigned driver_control_flags`.
    pub driver_control_flags: c_uint,
}

/// `hipFileDriverProps_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct HipFileDriverProps {
    /// `nvfs`.
    pub nvfs: NvfsProps,
    /// `unsigned feature_flags`.
    pub feature_flags: c_uint,
    /// `uint64_t max_device_cache_size` (KiB).
    pub max_device_cache_size_kib: u64,
    /// `uint64_t per_buffer_cache_size` (KiB).
    pub per_buffer_cache_size_kib: u64,
    /// `uint64_t max_device_pinned_mem_size` (KiB).
    pub max_device_pinned_mem_size_kib: u64,
    /// `unsigned max_batch_io_count`.
    pub max_batch_io_count: c_uint,
    /// `unsigned max_batch_io_timeout_msecs`.
    pub max_batch_io_timeout_msecs: c_uint,
}

/// `hipFileIOParams_t::u.batch`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BatchIo {
    /// `void *devPtr_base`.
    pub dev_ptr_base: *mut c_void,
    /// `int64_t file_offset`.
    pub file_offset: i64,
    /// `int64_t devPtr_offset`.
    pub dev_ptr_offset: i64,
    /// `size_t size`.
    pub size: usize,
}

/// `hipFileIOParams_t::u`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union IoParamsUnion {
    /// `batch`.
    pub batch: BatchIo,
}

/// `hipFileIOParams_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct HipFileIoParams {
    /// `hipFileBatchMode_t mode`.
    pub mode: c_int,
    /// `u`.
    pub u: IoParamsUnion,
    /// `hipFileHandle_t fh`.
    pub fh: *mut c_void,
    /// `hipFileOpcode_t opcode`.
    pub opcode: c_int,
    /// `void *cookie`.
    pub cookie: *mut c_void,
}

/// `hipFileIOEvents_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HipFileIoEvents {
    /// `void *cookie`.
    pub cookie: *mut c_void,
    /// `hipFileStatus_t status`.
    pub status: c_int,
    /// `size_t ret`.
    pub ret: usize,
}

/// `hipfileCpuPointerInfo_t` (`hipfile_cpu.h`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CpuPointerInfo {
    /// `hipfileCpuMemoryType_t memory_type`.
    pub memory_type: c_int,
    /// `int device`.
    pub device: c_int,
    /// `void *base`.
    pub base: *mut c_void,
    /// `size_t size`.
    pub size: usize,
}

/// `hipFileFileHandleType_t` values.
pub mod handle_type {
    use core::ffi::c_int;
    /// `hipFileHandleTypeOpaqueFD`.
    pub const OPAQUE_FD: c_int = 1;
    /// `hipFileHandleTypeOpaqueWin32`.
    pub const OPAQUE_WIN32: c_int = 2;
    /// `hipFileHandleTypeUserspaceFS`.
    pub const USERSPACE_FS: c_int = 3;
}

/// `hipfileCpuMemoryType_t` values.
pub mod cpu_memory {
    use core::ffi::c_int;
    /// `hipfileCpuMemoryUnregistered`.
    pub const UNREGISTERED: c_int = 0;
    /// `hipfileCpuMemoryHost`.
    pub const HOST: c_int = 1;
    /// `hipfileCpuMemoryDevice`.
    pub const DEVICE: c_int = 2;
    /// `hipfileCpuMemoryManaged`.
    pub const MANAGED: c_int = 3;
    /// `hipfileCpuMemoryArray`.
    pub const ARRAY: c_int = 10;
}

/// `HIPFILE_VERSION_{MAJOR,MINOR,PATCH}`.
pub const VERSION: (c_uint, c_uint, c_uint) = hipfile_runtime::parameters::API_VERSION;

// Sizes and alignments (hipfile-api.md §1.4).
const_assert_eq!(size_of::<HipFileError>(), 8);
const_assert_eq!(align_of::<HipFileError>(), 4);
const_assert_eq!(size_of::<HipFileDescr>(), 24);
const_assert_eq!(align_of::<HipFileDescr>(), 8);
const_assert_eq!(size_of::<HipFileFsOps>(), 40);
const_assert_eq!(align_of::<HipFileFsOps>(), 8);
const_assert_eq!(size_of::<HipFileRdmaInfo>(), 16);
const_assert_eq!(align_of::<HipFileRdmaInfo>(), 8);
const_assert_eq!(size_of::<HipFileDriverProps>(), 72);
const_assert_eq!(align_of::<HipFileDriverProps>(), 8);
const_assert_eq!(size_of::<HipFileIoParams>(), 64);
const_assert_eq!(align_of::<HipFileIoParams>(), 8);
const_assert_eq!(size_of::<HipFileIoEvents>(), 24);
const_assert_eq!(align_of::<HipFileIoEvents>(), 8);
const_assert_eq!(size_of::<CpuPointerInfo>(), 24);
const_assert_eq!(align_of::<CpuPointerInfo>(), 8);

// Offsets.
const_assert_eq!(offset_of!(HipFileError, err), 0);
const_assert_eq!(offset_of!(HipFileError, hip_drv_err), 4);
const_assert_eq!(offset_of!(HipFileDescr, handle_type), 0);
const_assert_eq!(offset_of!(HipFileDescr, handle), 8);
const_assert_eq!(offset_of!(HipFileDescr, fs_ops), 16);
const_assert_eq!(offset_of!(HipFileFsOps, fs_type), 0);
const_assert_eq!(offset_of!(HipFileFsOps, get_rdma_device_list), 8);
const_assert_eq!(offset_of!(HipFileFsOps, get_rdma_device_priority), 16);
const_assert_eq!(offset_of!(HipFileFsOps, read), 24);
const_assert_eq!(offset_of!(HipFileFsOps, write), 32);
const_assert_eq!(offset_of!(HipFileRdmaInfo, version), 0);
const_assert_eq!(offset_of!(HipFileRdmaInfo, desc_len), 4);
const_assert_eq!(offset_of!(HipFileRdmaInfo, desc_str), 8);
const_assert_eq!(offset_of!(HipFileDriverProps, nvfs), 0);
const_assert_eq!(offset_of!(NvfsProps, major_version), 0);
const_assert_eq!(offset_of!(NvfsProps, minor_version), 4);
const_assert_eq!(offset_of!(NvfsProps, poll_thresh_size_kib), 8);
const_assert_eq!(offset_of!(NvfsProps, max_direct_io_size_kib), 16);
const_assert_eq!(offset_of!(NvfsProps, driver_status_flags), 24);
const_assert_eq!(offset_of!(NvfsProps, driver_control_flags), 28);
const_assert_eq!(offset_of!(HipFileDriverProps, feature_flags), 32);
const_assert_eq!(offset_of!(HipFileDriverProps, max_device_cache_size_kib), 40);
const_assert_eq!(offset_of!(HipFileDriverProps, per_buffer_cache_size_kib), 48);
const_assert_eq!(offset_of!(HipFileDriverProps, max_device_pinned_mem_size_kib), 56);
const_assert_eq!(offset_of!(HipFileDriverProps, max_batch_io_count), 64);
const_assert_eq!(offset_of!(HipFileDriverProps, max_batch_io_timeout_msecs), 68);
const_assert_eq!(offset_of!(HipFileIoParams, mode), 0);
const_assert_eq!(offset_of!(HipFileIoParams, u), 8);
const_assert_eq!(offset_of!(HipFileIoParams, u) + offset_of!(BatchIo, dev_ptr_base), 8);
const_assert_eq!(offset_of!(HipFileIoParams, u) + offset_of!(BatchIo, file_offset), 16);
const_assert_eq!(offset_of!(HipFileIoParams, u) + offset_of!(BatchIo, dev_ptr_offset), 24);
const_assert_eq!(offset_of!(HipFileIoParams, u) + offset_of!(BatchIo, size), 32);
const_assert_eq!(offset_of!(HipFileIoParams, fh), 40);
const_assert_eq!(offset_of!(HipFileIoParams, opcode), 48);
const_assert_eq!(offset_of!(HipFileIoParams, cookie), 56);
const_assert_eq!(offset_of!(HipFileIoEvents, cookie), 0);
const_assert_eq!(offset_of!(HipFileIoEvents, status), 8);
const_assert_eq!(offset_of!(HipFileIoEvents, ret), 16);
const_assert_eq!(offset_of!(CpuPointerInfo, memory_type), 0);
const_assert_eq!(offset_of!(CpuPointerInfo, device), 4);
const_assert_eq!(offset_of!(CpuPointerInfo, base), 8);
const_assert_eq!(offset_of!(CpuPointerInfo, size), 16);

// Values the exports rely on (hipfile-api.md §1.1, §1.3, §1.5).
const_assert_eq!(hipfile_core::BASE_ERR, 5000);
const_assert_eq!(OpError::Success.code(), 0);
const_assert_eq!(OpError::HipDriverError.code(), 5011);
const_assert_eq!(OpError::InvalidValue.code(), 5022);
const_assert_eq!(OpError::InternalError.code(), 5030);
const_assert_eq!(OpError::IOMaxError.code(), 5039);
const_assert_eq!(StreamFlags::FIXED_BUF_OFFSET.bits(), 1);
const_assert_eq!(StreamFlags::FIXED_FILE_OFFSET.bits(), 2);
const_assert_eq!(StreamFlags::FIXED_FILE_SIZE.bits(), 4);
const_assert_eq!(StreamFlags::PAGE_ALIGNED_INPUTS.bits(), 8);
const_assert_eq!(hipfile_core::STREAM_FLAGS_MASK, 0xf);
const_assert_eq!(VERSION.0, hipfile_core::HIPFILE_VERSION.0);
const_assert_eq!(VERSION.1, hipfile_core::HIPFILE_VERSION.1);
const_assert_eq!(VERSION.2, hipfile_core::HIPFILE_VERSION.2);
