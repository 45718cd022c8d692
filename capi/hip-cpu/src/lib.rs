//! hipfile-hip-cpu: `libhipfile_hip_cpu.so`, a HIP runtime for machines without a GPU.
//!
//! It exports the HIP runtime calls a host program that uses hipFile typically makes —
//! device selection, `hipMalloc`/`hipHostMalloc`/`hipMallocManaged`, copies and fills,
//! pointer queries, streams, stream wait/write-value, host functions, events, error
//! strings — with the ABI of `<hip/hip_runtime_api.h>` as Debian's `libamdhip64-dev`
//! (HIP 5.2, AMD platform) declares it. So an unmodified HIP host program builds with
//! `gcc prog.c -D__HIP_PLATFORM_AMD__ -lhipfile -lhipfile_hip_cpu` and runs without a
//! GPU. (Kernels cannot run: a program that launches kernels needs a real GPU.)
//!
//! Everything runs on hipfile-rs's in-process cpu device *inside libhipfile*, reached
//! through libhipfile's `hipfileCpu*` extension API ([`ext`](mod@ext)), so memory from `hipMalloc`
//! is device memory to `hipFileBufRegister` and `hipFileRead`, and streams from
//! `hipStreamCreate` are the streams `hipFileReadAsync` enqueues on.
//!
//! Semantics worth knowing (see also the README's "C API" section):
//! - the NULL stream behaves as a per-thread default stream (it does not synchronize
//!   with other streams); `hipMemcpy`/`hipMemset` are `*Async` on it plus a synchronize;
//! - copies involving pageable host memory (not from `hipHostMalloc`) are done by the
//!   calling thread after the stream's earlier work, as HIP does for pageable memory;
//! - `hipStreamWaitValue32` with `hipStreamWaitValueGte` and a full mask uses the
//!   device's wait-value (compared cyclically, as CUDA's GEQ); other flags, masks and
//!   64-bit waits run as a polling host function on the stream (within about 200 µs of
//!   the store); `hipStreamWriteValue64` is a host function;
//! - `hipFree`/`hipHostFree` synchronize the device first, as HIP documents.
//!
//! Every export catches panics (`hipErrorUnknown`) and records failures for
//! `hipGetLastError`.

#![allow(non_snake_case, reason = "C function names are HIP's")]

pub mod errors;
pub mod ext;
mod wait;

use core::ffi::{c_char, c_int, c_uint, c_void};
use std::cell::Cell;
use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use ext::{Ext, HostFn, PointerInfo, ext, memory};

/// A `hipError_t` (an `int`-sized enum in C).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HipError(pub c_int);

impl HipError {
    /// `hipSuccess`.
    pub const SUCCESS: HipError = HipError(0);
    /// `hipErrorInvalidValue`.
    pub const INVALID_VALUE: HipError = HipError(1);
    /// `hipErrorInvalidMemcpyDirection`.
    pub const INVALID_MEMCPY_DIRECTION: HipError = HipError(21);
    /// `hipErrorNoDevice`.
    pub const NO_DEVICE: HipError = HipError(100);
    /// `hipErrorInvalidDevice`.
    pub const INVALID_DEVICE: HipError = HipError(101);
    /// `hipErrorInvalidHandle`.
    pub const INVALID_HANDLE: HipError = HipError(400);
    /// `hipErrorNotFound`.
    pub const NOT_FOUND: HipError = HipError(500);
    /// `hipErrorNotReady`.
    pub const NOT_READY: HipError = HipError(600);
    /// `hipErrorOutOfMemory`.
    pub const OUT_OF_MEMORY: HipError = HipError(2);
    /// `hipErrorUnknown`.
    pub const UNKNOWN: HipError = HipError(999);
}

/// `hipPointerAttribute_t` of HIP 5.x (32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PointerAttributes {
    /// `enum hipMemoryType memoryType`.
    pub memory_type: c_int,
    /// `int device`.
    pub device: c_int,
    /// `void *devicePointer`.
    pub device_pointer: *mut c_void,
    /// `void *hostPointer`.
    pub host_pointer: *mut c_void,
    /// `int isManaged`.
    pub is_managed: c_int,
    /// `unsigned allocationFlags`.
    pub allocation_flags: c_uint,
}

const _: () = assert!(size_of::<PointerAttributes>() == 32 && align_of::<PointerAttributes>() == 8);
const _: () = assert!(core::mem::offset_of!(PointerAttributes, device_pointer) == 8);
const _: () = assert!(core::mem::offset_of!(PointerAttributes, host_pointer) == 16);
const _: () = assert!(core::mem::offset_of!(PointerAttributes, is_managed) == 24);
const _: () = assert!(core::mem::offset_of!(PointerAttributes, allocation_flags) == 28);

/// `hipMemoryType` values of HIP 5.x.
pub mod memory_type {
    use core::ffi::c_int;
    /// `hipMemoryTypeHost`.
    pub const HOST: c_int = 0;
    /// `hipMemoryTypeDevice`.
    pub const DEVICE: c_int = 1;
    /// `hipMemoryTypeArray`.
    pub const ARRAY: c_int = 2;
    /// `hipMemoryTypeUnified` (reported for managed memory, with `isManaged = 1`).
    pub const UNIFIED: c_int = 3;
}

/// `hipMemoryType` values of HIP 6 and later (ROCm >= 6, CUDA's numbering).
pub mod memory_type_v6 {
    use core::ffi::c_int;
    /// `hipMemoryTypeUnregistered`: memory HIP does not know.
    pub const UNREGISTERED: c_int = 0;
    /// `hipMemoryTypeHost`.
    pub const HOST: c_int = 1;
    /// `hipMemoryTypeDevice`.
    pub const DEVICE: c_int = 2;
    /// `hipMemoryTypeManaged`.
    pub const MANAGED: c_int = 3;
    /// `hipMemoryTypeArray`.
    pub const ARRAY: c_int = 10;
}

/// The HIP API generation this runtime speaks: 5 (ROCm 5.x) or 6 (ROCm >= 6), from
/// `HIPFILE_HIP_CPU_API` when it is `5` or `6`, else the major version of the HIP headers
/// found when the library was built (build.rs; 5 without headers). It decides the
/// `hipMemoryType` numbering and what `hipPointerGetAttributes` says of memory HIP does
/// not know (5: `hipErrorInvalidValue`; 6: success, `hipMemoryTypeUnregistered`).
pub fn hip_api_major() -> u32 {
    static MAJOR: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *MAJOR.get_or_init(|| {
        let built: u32 = env!("HIPFILE_HIP_CPU_DEFAULT_API").parse().unwrap_or(5);
        match std::env::var("HIPFILE_HIP_CPU_API").as_deref() {
            Ok("5") => 5,
            Ok("6") => 6,
            _ => built,
        }
    })
}

/// `hipPointerGetAttributes`' answer for `info` in HIP API generation `major`: memory
/// type, whether the pointer is a host pointer, `isManaged`, `device`.
fn pointer_attributes_of(
    info: &PointerInfo,
    major: u32,
) -> Result<(c_int, bool, c_int, c_int), HipError> {
    let v6 = major >= 6;
    Ok(match info.memory_type {
        memory::DEVICE => {
            (if v6 { memory_type_v6::DEVICE } else { memory_type::DEVICE }, false, 0, info.device)
        }
        memory::HOST => {
            (if v6 { memory_type_v6::HOST } else { memory_type::HOST }, true, 0, info.device)
        }
        memory::MANAGED => {
            (if v6 { memory_type_v6::MANAGED } else { memory_type::UNIFIED }, true, 1, info.device)
        }
        memory::ARRAY => {
            (if v6 { memory_type_v6::ARRAY } else { memory_type::ARRAY }, false, 0, info.device)
        }
        // HIP 6, like CUDA: unknown memory is unregistered host memory, device -2.
        memory::UNREGISTERED if v6 => (memory_type_v6::UNREGISTERED, true, 0, -2),
        _ => return Err(HipError::INVALID_VALUE),
    })
}

/// `hipMemcpyDefault`, the largest `hipMemcpyKind`.
const MEMCPY_KIND_MAX: c_int = 4;

thread_local! {
    static LAST_ERROR: Cell<HipError> = const { Cell::new(HipError::SUCCESS) };
}

/// Runs an export's body: a panic becomes `hipErrorUnknown`; a failure other than
/// `hipErrorNotReady` (a status, not an error, as in CUDA) is recorded for
/// `hipGetLastError`.
fn run(body: impl FnOnce() -> Result<(), HipError>) -> HipError {
    let status = catch_unwind(AssertUnwindSafe(body)).unwrap_or(Err(HipError::UNKNOWN));
    match status {
        Ok(()) => HipError::SUCCESS,
        Err(error) => {
            if error != HipError::NOT_READY {
                LAST_ERROR.set(error);
            }
            error
        }
    }
}

/// Declares exported HIP functions: `#[unsafe(no_mangle)] pub unsafe extern "C" fn ...
/// -> hipError_t`, the body (a `Result<(), HipError>`) run under [`run`].
macro_rules! hip_fn {
    ($(
        $(#[$meta:meta])*
        fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block
    )*) => {$(
        $(#[$meta])*
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> HipError {
            run(move || $body)
        }
    )*};
}

fn check(status: c_int) -> Result<(), HipError> {
    if status == 0 { Ok(()) } else { Err(HipError(status)) }
}

fn api() -> Result<&'static Ext, HipError> {
    ext().ok_or(HipError::NO_DEVICE)
}

/// Writes through a non-NULL output pointer.
///
/// # Safety
/// A non-NULL `ptr` is writable.
unsafe fn write_out<T>(ptr: *mut T, value: T) -> Result<(), HipError> {
    if ptr.is_null() {
        return Err(HipError::INVALID_VALUE);
    }
    // SAFETY: non-NULL and writable per the contract.
    unsafe { ptr.write_unaligned(value) };
    Ok(())
}

fn pointer_info(ptr: *const c_void) -> Result<PointerInfo, HipError> {
    let api = api()?;
    let mut info = PointerInfo { memory_type: 0, device: 0, base: core::ptr::null_mut(), size: 0 };
    // SAFETY: `info` is a valid out-pointer; the pointer is only looked up.
    check(unsafe { (api.pointer_get_info)(ptr, &mut info) })?;
    Ok(info)
}

fn tracked(info: &PointerInfo) -> bool {
    info.memory_type != memory::UNREGISTERED
}

/// Checks that `ptr..ptr+len` lies inside the allocation `info` describes.
fn inside(info: &PointerInfo, ptr: *const c_void, len: usize) -> Result<(), HipError> {
    let (start, base) = (ptr as usize, info.base as usize);
    let end = start.checked_add(len).ok_or(HipError::INVALID_VALUE)?;
    if start < base || end > base + info.size {
        return Err(HipError::INVALID_VALUE);
    }
    Ok(())
}

/// `hipMemcpy*`: on the device when both sides are its memory, else by this thread after
/// the stream's earlier work (pageable host memory).
///
/// # Safety
/// As `hipMemcpyAsync`: the ranges are valid for the copy.
unsafe fn memcpy(
    dst: *mut c_void,
    src: *const c_void,
    size: usize,
    kind: c_int,
    stream: *mut c_void,
    wait: bool,
) -> Result<(), HipError> {
    if !(0..=MEMCPY_KIND_MAX).contains(&kind) {
        return Err(HipError::INVALID_MEMCPY_DIRECTION);
    }
    if size == 0 {
        return Ok(());
    }
    if dst.is_null() || src.is_null() {
        return Err(HipError::INVALID_VALUE);
    }
    let api = api()?;
    let (target, source) = (pointer_info(dst)?, pointer_info(src)?);
    if tracked(&target) && tracked(&source) {
        // SAFETY: forwarded contract; the device checks both ranges.
        check(unsafe { (api.memcpy_async)(dst, src, size, stream) })?;
        if wait {
            // SAFETY: the stream is only looked up.
            check(unsafe { (api.stream_synchronize)(stream) })?;
        }
        return Ok(());
    }
    for (info, ptr) in [(&target, dst.cast_const()), (&source, src)] {
        if tracked(info) {
            inside(info, ptr, size)?;
        }
    }
    // SAFETY: the stream is only looked up.
    check(unsafe { (api.stream_synchronize)(stream) })?;
    // SAFETY: the device-side range lies in a live allocation (checked) and the stream's
    // earlier work is done; the host side is the caller's memory (as for HIP).
    unsafe { core::ptr::copy(src.cast::<u8>(), dst.cast::<u8>(), size) };
    Ok(())
}

/// `hipMemset*`: the range must be memory of the device.
///
/// # Safety
/// The range is valid for the fill.
unsafe fn memset(
    dst: *mut c_void,
    value: c_int,
    size: usize,
    stream: *mut c_void,
    wait: bool,
) -> Result<(), HipError> {
    if size == 0 {
        return Ok(());
    }
    let api = api()?;
    // SAFETY: forwarded contract; the device checks the range.
    check(unsafe { (api.memset_async)(dst, value, size, stream) })?;
    if wait {
        // SAFETY: the stream is only looked up.
        check(unsafe { (api.stream_synchronize)(stream) })?;
    }
    Ok(())
}

/// Allocates through `alloc` into `*ptr`.
///
/// # Safety
/// A non-NULL `ptr` is writable.
unsafe fn allocate(
    ptr: *mut *mut c_void,
    size: usize,
    alloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int,
) -> Result<(), HipError> {
    if ptr.is_null() {
        return Err(HipError::INVALID_VALUE);
    }
    // SAFETY: `ptr` is non-NULL and writable per the contract.
    check(unsafe { alloc(ptr, size) })
}

/// Frees through `free` after synchronizing the device (HIP's documented behaviour).
///
/// # Safety
/// As `hipFree`.
unsafe fn release(
    ptr: *mut c_void,
    free: unsafe extern "C" fn(*mut c_void) -> c_int,
) -> Result<(), HipError> {
    if ptr.is_null() {
        return Ok(());
    }
    let api = api()?;
    // SAFETY: no argument.
    check(unsafe { (api.device_synchronize)() })?;
    // SAFETY: forwarded contract; the device checks that ptr is an allocation's base.
    check(unsafe { free(ptr) })
}

// ---------------------------------------------------------------------------------------
// Events: hipEvent_t is an id (never dereferenced) naming the latest recording.
// ---------------------------------------------------------------------------------------

/// Live events: id → the device event of the latest `hipEventRecord` (None: never
/// recorded, which counts as complete).
fn events() -> MutexGuard<'static, BTreeMap<usize, Option<u64>>> {
    static EVENTS: Mutex<BTreeMap<usize, Option<u64>>> = Mutex::new(BTreeMap::new());
    EVENTS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The device event of `event`'s latest recording.
fn recorded(event: *mut c_void) -> Result<Option<u64>, HipError> {
    events().get(&(event as usize)).copied().ok_or(HipError::INVALID_HANDLE)
}

fn event_create(event: *mut *mut c_void) -> Result<(), HipError> {
    static NEXT_EVENT: AtomicUsize = AtomicUsize::new(1);
    if event.is_null() {
        return Err(HipError::INVALID_VALUE);
    }
    let id = NEXT_EVENT.fetch_add(1, Ordering::Relaxed);
    events().insert(id, None);
    // SAFETY: non-NULL; writable per hipEventCreate's contract.
    unsafe { event.write_unaligned(id as *mut c_void) };
    Ok(())
}

/// `hipDeviceGetAttribute` values of the cpu device (HIP 5.2 numbering).
fn attribute(attr: c_int) -> Option<c_int> {
    Some(match attr {
        2 => 1,           // AsyncEngineCount
        3 => 1,           // CanMapHostMemory
        5 => 0,           // ClockRate (unknown)
        8 => 1,           // ConcurrentKernels
        9 => 1,           // ConcurrentManagedAccess
        15 => 1,          // HostNativeAtomicSupported
        16 => 1,          // Integrated: the device is the host
        19 => 0,          // L2CacheSize
        23 | 61 => 0,     // ComputeCapabilityMajor / Minor: not a GPU
        24 => 1,          // ManagedMemory
        26 => 1024,       // MaxBlockDimX
        29 => c_int::MAX, // MaxGridDimX
        56 => 1024,       // MaxThreadsPerBlock
        63 => 1,          // MultiprocessorCount
        65 => 0,          // PageableMemoryAccess
        67..=69 => 0,     // PciBusId, PciDeviceId, PciDomainID
        74 => 65536,      // MaxSharedMemoryPerBlock
        85 => 1,          // UnifiedAddressing
        87 => 64,         // WarpSize
        10013 => 1,       // CanUseStreamWaitValue
        _ => return None,
    })
}

hip_fn! {
    /// `hipInit`: loads libhipfile's cpu device.
    ///
    /// # Safety
    /// None.
    fn hipInit(flags: c_uint) {
        let _ = flags;
        let api = api()?;
        let mut count = 0;
        // SAFETY: valid out-pointer.
        check(unsafe { (api.get_device_count)(&mut count) })
    }

    /// `hipGetDeviceCount`: `hipErrorNoDevice` (and 0) without the cpu device.
    ///
    /// # Safety
    /// A non-NULL `count` is writable.
    fn hipGetDeviceCount(count: *mut c_int) {
        if count.is_null() {
            return Err(HipError::INVALID_VALUE);
        }
        let mut devices = 0;
        let status = api().and_then(|api| {
            // SAFETY: valid out-pointer.
            check(unsafe { (api.get_device_count)(&mut devices) })
        });
        // SAFETY: non-NULL and writable per the contract.
        unsafe { count.write_unaligned(devices) };
        status
    }

    /// `hipGetDevice`.
    ///
    /// # Safety
    /// A non-NULL `device` is writable.
    fn hipGetDevice(device: *mut c_int) {
        let api = api()?;
        // SAFETY: the extension checks for NULL; a non-NULL pointer is writable.
        check(unsafe { (api.get_device)(device) })
    }

    /// `hipSetDevice`.
    ///
    /// # Safety
    /// None.
    fn hipSetDevice(device: c_int) {
        // SAFETY: no pointer.
        check(unsafe { (api()?.set_device)(device) })
    }

    /// `hipDeviceGetAttribute`: the attributes listed in `attribute`; others give
    /// `hipErrorInvalidValue`.
    ///
    /// # Safety
    /// A non-NULL `value` is writable.
    fn hipDeviceGetAttribute(value: *mut c_int, attr: c_int, device: c_int) {
        let api = api()?;
        let mut count = 0;
        // SAFETY: valid out-pointer.
        check(unsafe { (api.get_device_count)(&mut count) })?;
        if !(0..count).contains(&device) {
            return Err(HipError::INVALID_DEVICE);
        }
        let answer = attribute(attr).ok_or(HipError::INVALID_VALUE)?;
        // SAFETY: forwarded contract.
        unsafe { write_out(value, answer) }
    }

    /// `hipDeviceSynchronize`: the NULL stream and every stream from `hipStreamCreate`.
    ///
    /// # Safety
    /// None.
    fn hipDeviceSynchronize() {
        // SAFETY: no argument.
        check(unsafe { (api()?.device_synchronize)() })
    }

    /// `hipMalloc`: device memory on the current device (size 0: NULL).
    ///
    /// # Safety
    /// A non-NULL `ptr` is writable.
    fn hipMalloc(ptr: *mut *mut c_void, size: usize) {
        // SAFETY: forwarded contract.
        unsafe { allocate(ptr, size, api()?.malloc) }
    }

    /// `hipExtMallocWithFlags`: device memory (every flag, signal memory included, gives
    /// memory the device's wait/write-value accept).
    ///
    /// # Safety
    /// A non-NULL `ptr` is writable.
    fn hipExtMallocWithFlags(ptr: *mut *mut c_void, size: usize, flags: c_uint) {
        let _ = flags;
        // SAFETY: forwarded contract.
        unsafe { allocate(ptr, size, api()?.malloc) }
    }

    /// `hipMallocManaged` (`flags` ignored).
    ///
    /// # Safety
    /// A non-NULL `ptr` is writable.
    fn hipMallocManaged(ptr: *mut *mut c_void, size: usize, flags: c_uint) {
        let _ = flags;
        // SAFETY: forwarded contract.
        unsafe { allocate(ptr, size, api()?.malloc_managed) }
    }

    /// `hipHostMalloc`: pinned host memory (`flags` ignored).
    ///
    /// # Safety
    /// A non-NULL `ptr` is writable.
    fn hipHostMalloc(ptr: *mut *mut c_void, size: usize, flags: c_uint) {
        let _ = flags;
        // SAFETY: forwarded contract.
        unsafe { allocate(ptr, size, api()?.host_malloc) }
    }

    /// `hipFree`: synchronizes the device, then frees device or managed memory.
    ///
    /// # Safety
    /// No reference into the allocation is used afterwards.
    fn hipFree(ptr: *mut c_void) {
        // SAFETY: forwarded contract.
        unsafe { release(ptr, api()?.free) }
    }

    /// `hipHostFree`: synchronizes the device, then frees pinned host memory.
    ///
    /// # Safety
    /// As `hipFree`.
    fn hipHostFree(ptr: *mut c_void) {
        // SAFETY: forwarded contract.
        unsafe { release(ptr, api()?.host_free) }
    }

    /// `hipMemcpy`: on the NULL stream, complete on return.
    ///
    /// # Safety
    /// Both ranges are valid for `size` bytes.
    fn hipMemcpy(dst: *mut c_void, src: *const c_void, size: usize, kind: c_int) {
        // SAFETY: forwarded contract.
        unsafe { memcpy(dst, src, size, kind, core::ptr::null_mut(), true) }
    }

    /// `hipMemcpyAsync`.
    ///
    /// # Safety
    /// Both ranges stay valid, and unused by others, until the copy has run.
    fn hipMemcpyAsync(dst: *mut c_void, src: *const c_void, size: usize, kind: c_int, stream: *mut c_void) {
        // SAFETY: forwarded contract.
        unsafe { memcpy(dst, src, size, kind, stream, false) }
    }

    /// `hipMemset`: on the NULL stream, complete on return.
    ///
    /// # Safety
    /// The range is memory of the device.
    fn hipMemset(dst: *mut c_void, value: c_int, size: usize) {
        // SAFETY: forwarded contract.
        unsafe { memset(dst, value, size, core::ptr::null_mut(), true) }
    }

    /// `hipMemsetAsync`.
    ///
    /// # Safety
    /// The range is memory of the device, unused by others until the fill has run.
    fn hipMemsetAsync(dst: *mut c_void, value: c_int, size: usize, stream: *mut c_void) {
        // SAFETY: forwarded contract.
        unsafe { memset(dst, value, size, stream, false) }
    }

    /// `hipPointerGetAttributes` (the layout of HIP 5.x and 6 alike); the `hipMemoryType`
    /// numbering and the answer for memory the device does not know follow
    /// [`hip_api_major`]: HIP 5.x gives `hipErrorInvalidValue`, HIP 6
    /// `hipMemoryTypeUnregistered`.
    ///
    /// # Safety
    /// A non-NULL `attributes` is writable.
    fn hipPointerGetAttributes(attributes: *mut PointerAttributes, ptr: *const c_void) {
        let info = pointer_info(ptr)?;
        let (memory_type, host, managed, device) = pointer_attributes_of(&info, hip_api_major())?;
        let unregistered = info.memory_type == memory::UNREGISTERED;
        let described = PointerAttributes {
            memory_type,
            device,
            device_pointer: if unregistered { core::ptr::null_mut() } else { ptr.cast_mut() },
            host_pointer: if host { ptr.cast_mut() } else { core::ptr::null_mut() },
            is_managed: managed,
            allocation_flags: 0,
        };
        // SAFETY: forwarded contract.
        unsafe { write_out(attributes, described) }
    }

    /// `hipMemGetAddressRange`: the allocation holding `ptr` (`hipErrorNotFound` for
    /// memory the device does not know); NULL outputs are skipped.
    ///
    /// # Safety
    /// Non-NULL outputs are writable.
    fn hipMemGetAddressRange(base: *mut *mut c_void, size: *mut usize, ptr: *mut c_void) {
        let info = pointer_info(ptr)?;
        if !tracked(&info) {
            return Err(HipError::NOT_FOUND);
        }
        if !base.is_null() {
            // SAFETY: non-NULL and writable per the contract.
            unsafe { base.write_unaligned(info.base) };
        }
        if !size.is_null() {
            // SAFETY: non-NULL and writable per the contract.
            unsafe { size.write_unaligned(info.size) };
        }
        Ok(())
    }

    /// `hipStreamCreate`: a stream on the current device.
    ///
    /// # Safety
    /// A non-NULL `stream` is writable.
    fn hipStreamCreate(stream: *mut *mut c_void) {
        // SAFETY: the extension checks for NULL; a non-NULL pointer is writable.
        check(unsafe { (api()?.stream_create)(stream) })
    }

    /// `hipStreamCreateWithFlags` (the flags change nothing on this device: the NULL
    /// stream never synchronizes with other streams).
    ///
    /// # Safety
    /// A non-NULL `stream` is writable.
    fn hipStreamCreateWithFlags(stream: *mut *mut c_void, flags: c_uint) {
        let _ = flags;
        // SAFETY: as hipStreamCreate.
        check(unsafe { (api()?.stream_create)(stream) })
    }

    /// `hipStreamDestroy`: queued work still runs.
    ///
    /// # Safety
    /// None: the stream is only looked up.
    fn hipStreamDestroy(stream: *mut c_void) {
        // SAFETY: as documented.
        check(unsafe { (api()?.stream_destroy)(stream) })
    }

    /// `hipStreamSynchronize`.
    ///
    /// # Safety
    /// None: the stream is only looked up.
    fn hipStreamSynchronize(stream: *mut c_void) {
        // SAFETY: as documented.
        check(unsafe { (api()?.stream_synchronize)(stream) })
    }

    /// `hipStreamQuery`: `hipErrorNotReady` while work is queued.
    ///
    /// # Safety
    /// None: the stream is only looked up.
    fn hipStreamQuery(stream: *mut c_void) {
        // SAFETY: as documented.
        check(unsafe { (api()?.stream_query)(stream) })
    }

    /// `hipStreamGetDevice`.
    ///
    /// # Safety
    /// A non-NULL `device` is writable.
    fn hipStreamGetDevice(stream: *mut c_void, device: *mut c_int) {
        // SAFETY: the extension checks for NULL; a non-NULL pointer is writable.
        check(unsafe { (api()?.stream_get_device)(stream, device) })
    }

    /// `hipStreamWaitValue32`: see the crate docs for how each flag and mask runs.
    ///
    /// # Safety
    /// `ptr` is a 4-aligned word of memory of the device that stays allocated until the
    /// wait is satisfied.
    fn hipStreamWaitValue32(stream: *mut c_void, ptr: *mut c_void, value: u32, flags: c_uint, mask: u32) {
        // SAFETY: forwarded contract.
        unsafe { wait::wait_value(stream, ptr, u64::from(value), flags, u64::from(mask), wait::Width::Bits32) }
    }

    /// `hipStreamWaitValue64`: a polling host function on the stream.
    ///
    /// # Safety
    /// As `hipStreamWaitValue32`, with an 8-aligned word.
    fn hipStreamWaitValue64(stream: *mut c_void, ptr: *mut c_void, value: u64, flags: c_uint, mask: u64) {
        // SAFETY: forwarded contract.
        unsafe { wait::wait_value(stream, ptr, value, flags, mask, wait::Width::Bits64) }
    }

    /// `hipStreamWriteValue32`: the device's write-value (`flags` ignored).
    ///
    /// # Safety
    /// `ptr` is a 4-aligned word of memory of the device that stays allocated until the
    /// write has run.
    fn hipStreamWriteValue32(stream: *mut c_void, ptr: *mut c_void, value: u32, flags: c_uint) {
        let _ = flags;
        // SAFETY: forwarded contract; the device checks the word.
        check(unsafe { (api()?.stream_write_value32)(stream, ptr, value) })
    }

    /// `hipStreamWriteValue64`: a host function storing the word (`flags` ignored).
    ///
    /// # Safety
    /// As `hipStreamWriteValue32`, with an 8-aligned word.
    fn hipStreamWriteValue64(stream: *mut c_void, ptr: *mut c_void, value: u64, flags: c_uint) {
        let _ = flags;
        // SAFETY: forwarded contract.
        unsafe { wait::write_value64(stream, ptr, value) }
    }

    /// `hipLaunchHostFunc`.
    ///
    /// # Safety
    /// `func(user_data)` is sound on another thread once the stream reaches it.
    fn hipLaunchHostFunc(stream: *mut c_void, func: Option<HostFn>, user_data: *mut c_void) {
        // SAFETY: forwarded contract (the extension rejects a NULL function).
        check(unsafe { (api()?.launch_host_func)(stream, func, user_data) })
    }

    /// `hipEventCreate`.
    ///
    /// # Safety
    /// A non-NULL `event` is writable.
    fn hipEventCreate(event: *mut *mut c_void) {
        event_create(event)
    }

    /// `hipEventCreateWithFlags` (`flags` ignored).
    ///
    /// # Safety
    /// A non-NULL `event` is writable.
    fn hipEventCreateWithFlags(event: *mut *mut c_void, flags: c_uint) {
        let _ = flags;
        event_create(event)
    }

    /// `hipEventRecord`: the event now names the work enqueued on `stream` so far.
    ///
    /// # Safety
    /// None: handles are only looked up.
    fn hipEventRecord(event: *mut c_void, stream: *mut c_void) {
        recorded(event)?;
        let api = api()?;
        let mut ticket = 0;
        // SAFETY: valid out-pointer; the stream is only looked up.
        check(unsafe { (api.event_record)(stream, &mut ticket) })?;
        let previous = match events().get_mut(&(event as usize)) {
            Some(slot) => slot.replace(ticket),
            None => Some(ticket), // destroyed meanwhile: release the new ticket
        };
        if let Some(previous) = previous {
            // SAFETY: no pointer.
            unsafe { (api.event_destroy)(previous) };
        }
        Ok(())
    }

    /// `hipEventQuery`: `hipErrorNotReady` until the recorded work is complete (an event
    /// never recorded is complete).
    ///
    /// # Safety
    /// None.
    fn hipEventQuery(event: *mut c_void) {
        match recorded(event)? {
            // SAFETY: no pointer.
            Some(ticket) => check(unsafe { (api()?.event_query)(ticket) }),
            None => Ok(()),
        }
    }

    /// `hipEventSynchronize`.
    ///
    /// # Safety
    /// None.
    fn hipEventSynchronize(event: *mut c_void) {
        match recorded(event)? {
            // SAFETY: no pointer.
            Some(ticket) => check(unsafe { (api()?.event_synchronize)(ticket) }),
            None => Ok(()),
        }
    }

    /// `hipEventDestroy`.
    ///
    /// # Safety
    /// None.
    fn hipEventDestroy(event: *mut c_void) {
        let slot = events().remove(&(event as usize)).ok_or(HipError::INVALID_HANDLE)?;
        if let (Some(ticket), Some(api)) = (slot, ext()) {
            // SAFETY: no pointer.
            unsafe { (api.event_destroy)(ticket) };
        }
        Ok(())
    }
}

/// `hipGetLastError`: the last error of a call on this thread, reset to `hipSuccess`.
///
/// # Safety
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipGetLastError() -> HipError {
    LAST_ERROR.replace(HipError::SUCCESS)
}

/// `hipPeekAtLastError`: as `hipGetLastError`, without the reset.
///
/// # Safety
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipPeekAtLastError() -> HipError {
    LAST_ERROR.get()
}

/// `hipGetErrorName`: "hipErrorInvalidValue", ...; unknown values: "hipErrorUnknown".
///
/// # Safety
/// None: any value is accepted; the string is static.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipGetErrorName(error: c_int) -> *const c_char {
    errors::name(error).as_ptr()
}

/// `hipGetErrorString`: a description of the error; unknown values: "unknown error".
///
/// # Safety
/// None: any value is accepted; the string is static.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipGetErrorString(error: c_int) -> *const c_char {
    errors::description(error).as_ptr()
}

#[cfg(test)]
mod pointer_attribute_tests {
    use super::*;

    fn info(memory_type: c_int) -> PointerInfo {
        PointerInfo { memory_type, device: 1, base: core::ptr::null_mut(), size: 0 }
    }

    #[test]
    fn hip5_and_hip6_number_memory_types_as_their_headers_do() {
        let cases = [
            (memory::DEVICE, (1, false, 0, 1), (2, false, 0, 1)),
            (memory::HOST, (0, true, 0, 1), (1, true, 0, 1)),
            (memory::MANAGED, (3, true, 1, 1), (3, true, 1, 1)),
            (memory::ARRAY, (2, false, 0, 1), (10, false, 0, 1)),
        ];
        for (kind, hip5, hip6) in cases {
            assert_eq!(pointer_attributes_of(&info(kind), 5), Ok(hip5), "kind {kind}");
            assert_eq!(pointer_attributes_of(&info(kind), 6), Ok(hip6), "kind {kind}");
        }
        assert_eq!(
            pointer_attributes_of(&info(memory::UNREGISTERED), 5),
            Err(HipError::INVALID_VALUE)
        );
        assert_eq!(pointer_attributes_of(&info(memory::UNREGISTERED), 6), Ok((0, true, 0, -2)));
    }
}
