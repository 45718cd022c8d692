//! The `hipfileCpu*` extension API (`hipfile_cpu.h`): application-side operations on
//! the in-process `cpu` device the C API's driver uses — allocate "device", managed and
//! pinned memory, make and synchronize streams, copy, fill, launch host functions,
//! wait-value / write-value, events.
//!
//! `libhipfile_hip_cpu.so` builds the HIP runtime calls on these, so a HIP program and
//! the driver share one device (one memory table, one set of streams). Each function
//! returns a `hipError_t` value; `hipErrorNoDevice` when the driver's device is not the
//! cpu device.

#![allow(non_snake_case, reason = "C function names follow hipFile's style")]

use core::ffi::{c_int, c_void};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use hipfile_runtime::device::cpu::CpuDevice;
use hipfile_runtime::device::{
    DeviceError, DeviceEvents, DeviceInfo, EventHandle, HostFn, MemoryType, PinnedRegion,
    StreamHandle, StreamMemoryOps,
};
use hipfile_runtime::driver::process;

use crate::boundary::{HipStatus, ffi_fn, out_ptr};
use crate::types::{CpuPointerInfo, cpu_memory};

/// The driver's device, when it is the cpu device.
fn cpu() -> Result<&'static Arc<CpuDevice>, HipStatus> {
    let runtime = process::runtime().map_err(|_| HipStatus::NO_DEVICE)?;
    runtime.cpu.as_ref().ok_or(HipStatus::NO_DEVICE)
}

/// Streams made by `hipfileCpuStreamCreate` and not destroyed (`hipfileCpuDeviceSynchronize`).
fn user_streams() -> MutexGuard<'static, BTreeSet<usize>> {
    static STREAMS: Mutex<BTreeSet<usize>> = Mutex::new(BTreeSet::new());
    STREAMS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Writes `value` through a non-NULL output pointer; `hipErrorInvalidValue` for NULL.
///
/// # Safety
/// A non-NULL `ptr` is writable.
unsafe fn write_out<T>(ptr: *mut T, value: T) -> Result<(), HipStatus> {
    let ptr = out_ptr(ptr).ok_or(HipStatus::INVALID_VALUE)?;
    // SAFETY: non-NULL, writable per the contract.
    unsafe { ptr.write_unaligned(value) };
    Ok(())
}

/// Allocates with `alloc` (size 0: NULL and success) and writes the address to `*ptr`.
///
/// # Safety
/// A non-NULL `ptr` is writable.
unsafe fn allocate(
    ptr: *mut *mut c_void,
    size: usize,
    alloc: impl FnOnce(&CpuDevice) -> Result<u64, DeviceError>,
) -> Result<(), HipStatus> {
    let ptr = out_ptr(ptr).ok_or(HipStatus::INVALID_VALUE)?;
    let addr = if size == 0 { 0 } else { alloc(cpu()?)? };
    // SAFETY: non-NULL, writable per the contract.
    unsafe { ptr.write_unaligned(addr as usize as *mut c_void) };
    Ok(())
}

fn stream(handle: *mut c_void) -> StreamHandle {
    StreamHandle(handle as usize)
}

fn pointer_info(ptr: *const c_void) -> Result<CpuPointerInfo, HipStatus> {
    let info = cpu()?.pointer_info(ptr as u64)?;
    if info.allocation_len_bytes == 0 {
        let unregistered = cpu_memory::UNREGISTERED;
        return Ok(CpuPointerInfo {
            memory_type: unregistered,
            device: 0,
            base: core::ptr::null_mut(),
            size: 0,
        });
    }
    let memory_type = match info.memory_type {
        MemoryType::Host => cpu_memory::HOST,
        MemoryType::Device => cpu_memory::DEVICE,
        MemoryType::Managed => cpu_memory::MANAGED,
        MemoryType::Array => cpu_memory::ARRAY,
    };
    Ok(CpuPointerInfo {
        memory_type,
        device: info.device_ordinal as c_int,
        base: info.allocation_base as usize as *mut c_void,
        size: info.allocation_len_bytes as usize,
    })
}

fn stream_query(handle: *mut c_void) -> Result<(), HipStatus> {
    if cpu()?.stream_done(stream(handle))? { Ok(()) } else { Err(HipStatus::NOT_READY) }
}

fn device_synchronize() -> Result<(), HipStatus> {
    let device = cpu()?;
    device.synchronize_stream(StreamHandle::NULL)?;
    let streams: Vec<usize> = user_streams().iter().copied().collect();
    for handle in streams {
        match device.synchronize_stream(StreamHandle(handle)) {
            Err(e) if e.hip_error == DeviceError::HIP_ERROR_INVALID_HANDLE => {} // destroyed meanwhile
            other => other?,
        }
    }
    Ok(())
}

ffi_fn! {
    /// `hipfileCpuGetDeviceCount`.
    ///
    /// # Safety
    /// A non-NULL `count` is writable.
    fn hipfileCpuGetDeviceCount(count: *mut c_int) -> HipStatus {
        let devices = cpu()?.device_count() as c_int;
        // SAFETY: forwarded contract.
        unsafe { write_out(count, devices) }
    }

    /// `hipfileCpuGetDevice`: the calling thread's current device.
    ///
    /// # Safety
    /// A non-NULL `device` is writable.
    fn hipfileCpuGetDevice(device: *mut c_int) -> HipStatus {
        let current = cpu()?.current_device() as c_int;
        // SAFETY: forwarded contract.
        unsafe { write_out(device, current) }
    }

    /// `hipfileCpuSetDevice`.
    ///
    /// # Safety
    /// None.
    fn hipfileCpuSetDevice(device: c_int) -> HipStatus {
        let ordinal = u32::try_from(device).map_err(|_| HipStatus(DeviceError::HIP_ERROR_INVALID_DEVICE))?;
        cpu()?.set_current_device(ordinal).map_err(HipStatus::from)
    }

    /// `hipfileCpuMalloc`: device memory on the current device.
    ///
    /// # Safety
    /// A non-NULL `ptr` is writable.
    fn hipfileCpuMalloc(ptr: *mut *mut c_void, size: usize) -> HipStatus {
        // SAFETY: forwarded contract.
        unsafe { allocate(ptr, size, |device| device.malloc_device(device.current_device(), size)) }
    }

    /// `hipfileCpuMallocManaged`.
    ///
    /// # Safety
    /// A non-NULL `ptr` is writable.
    fn hipfileCpuMallocManaged(ptr: *mut *mut c_void, size: usize) -> HipStatus {
        // SAFETY: forwarded contract.
        unsafe { allocate(ptr, size, |device| device.malloc_managed(size)) }
    }

    /// `hipfileCpuHostMalloc`: pinned host memory.
    ///
    /// # Safety
    /// A non-NULL `ptr` is writable.
    fn hipfileCpuHostMalloc(ptr: *mut *mut c_void, size: usize) -> HipStatus {
        // SAFETY: forwarded contract.
        unsafe { allocate(ptr, size, |device| device.malloc_host(size).map(|region| region.device_addr)) }
    }

    /// `hipfileCpuFree`: device or managed memory; NULL is a no-op.
    ///
    /// # Safety
    /// No reference into the allocation is used after the call, and no stream is waiting
    /// on a word inside it.
    fn hipfileCpuFree(ptr: *mut c_void) -> HipStatus {
        if ptr.is_null() {
            return Ok(());
        }
        // SAFETY: forwarded contract (the device checks that ptr is an allocation's base).
        unsafe { cpu()?.free_device(ptr as u64) }.map_err(HipStatus::from)
    }

    /// `hipfileCpuHostFree`: pinned host memory; NULL is a no-op.
    ///
    /// # Safety
    /// As `hipfileCpuFree`.
    fn hipfileCpuHostFree(ptr: *mut c_void) -> HipStatus {
        if ptr.is_null() {
            return Ok(());
        }
        let region = PinnedRegion { host_ptr: ptr.cast(), device_addr: ptr as u64, len_bytes: 0 };
        // SAFETY: forwarded contract (the device checks that ptr is an allocation's base
        // of pinned host memory; the length is taken from its table).
        unsafe { cpu()?.free_host(region) }.map_err(HipStatus::from)
    }

    /// `hipfileCpuPointerGetInfo`.
    ///
    /// # Safety
    /// A non-NULL `info` is writable.
    fn hipfileCpuPointerGetInfo(ptr: *const c_void, info: *mut CpuPointerInfo) -> HipStatus {
        let described = pointer_info(ptr)?;
        // SAFETY: forwarded contract.
        unsafe { write_out(info, described) }
    }

    /// `hipfileCpuStreamCreate`: a stream on the current device.
    ///
    /// # Safety
    /// A non-NULL `stream_out` is writable.
    fn hipfileCpuStreamCreate(stream_out: *mut *mut c_void) -> HipStatus {
        let stream_out = out_ptr(stream_out).ok_or(HipStatus::INVALID_VALUE)?;
        let device = cpu()?;
        let handle = device.create_stream(device.current_device())?;
        user_streams().insert(handle.0);
        // SAFETY: non-NULL, writable per the contract.
        unsafe { stream_out.write_unaligned(handle.0 as *mut c_void) };
        Ok(())
    }

    /// `hipfileCpuStreamDestroy`.
    ///
    /// # Safety
    /// None: the handle is only looked up.
    fn hipfileCpuStreamDestroy(handle: *mut c_void) -> HipStatus {
        cpu()?.destroy_stream(stream(handle))?;
        user_streams().remove(&(handle as usize));
        Ok(())
    }

    /// `hipfileCpuStreamSynchronize`.
    ///
    /// # Safety
    /// None: the handle is only looked up.
    fn hipfileCpuStreamSynchronize(handle: *mut c_void) -> HipStatus {
        cpu()?.synchronize_stream(stream(handle)).map_err(HipStatus::from)
    }

    /// `hipfileCpuStreamQuery`: success when idle, `hipErrorNotReady` otherwise.
    ///
    /// # Safety
    /// None: the handle is only looked up.
    fn hipfileCpuStreamQuery(handle: *mut c_void) -> HipStatus {
        stream_query(handle)
    }

    /// `hipfileCpuStreamGetDevice`.
    ///
    /// # Safety
    /// A non-NULL `device` is writable.
    fn hipfileCpuStreamGetDevice(handle: *mut c_void, device: *mut c_int) -> HipStatus {
        let ordinal = cpu()?.stream_device(stream(handle))? as c_int;
        // SAFETY: forwarded contract.
        unsafe { write_out(device, ordinal) }
    }

    /// `hipfileCpuDeviceSynchronize`: the NULL stream and every stream made here.
    ///
    /// # Safety
    /// None.
    fn hipfileCpuDeviceSynchronize() -> HipStatus {
        device_synchronize()
    }

    /// `hipfileCpuMemcpyAsync`: both ranges inside memory of the device (size 0: no-op).
    ///
    /// # Safety
    /// Until the copy has run, nothing else accesses the target range or writes the
    /// source range.
    fn hipfileCpuMemcpyAsync(dst: *mut c_void, src: *const c_void, size: usize, handle: *mut c_void) -> HipStatus {
        if size == 0 {
            return Ok(());
        }
        // SAFETY: forwarded contract; the device checks both ranges against its table
        // when enqueuing and again when copying.
        unsafe { cpu()?.memcpy_async(stream(handle), dst as u64, src as u64, size) }.map_err(HipStatus::from)
    }

    /// `hipfileCpuMemsetAsync`: fills with `value as u8` (size 0: no-op).
    ///
    /// # Safety
    /// Until the fill has run, nothing else accesses the range.
    fn hipfileCpuMemsetAsync(dst: *mut c_void, value: c_int, size: usize, handle: *mut c_void) -> HipStatus {
        if size == 0 {
            return Ok(());
        }
        // SAFETY: forwarded contract; the device checks the range.
        unsafe { cpu()?.memset_async(stream(handle), dst as u64, value as u8, size) }.map_err(HipStatus::from)
    }

    /// `hipfileCpuLaunchHostFunc`.
    ///
    /// # Safety
    /// `func` is sound to call with `user_data` on another thread once the stream reaches
    /// it; `user_data` stays valid until then.
    fn hipfileCpuLaunchHostFunc(handle: *mut c_void, func: Option<HostFn>, user_data: *mut c_void) -> HipStatus {
        let func = func.ok_or(HipStatus::INVALID_VALUE)?;
        // SAFETY: forwarded contract.
        unsafe { cpu()?.launch_host_func(stream(handle), func, user_data) }.map_err(HipStatus::from)
    }

    /// `hipfileCpuStreamWaitValue32`: wait until the word is >= value (cyclically).
    ///
    /// # Safety
    /// The word stays allocated until the wait is satisfied and is only accessed
    /// atomically meanwhile.
    fn hipfileCpuStreamWaitValue32(handle: *mut c_void, word: *mut c_void, value: u32) -> HipStatus {
        // SAFETY: forwarded contract; the device checks the word is aligned, tracked memory.
        unsafe { cpu()?.stream_wait_value32(stream(handle), word as u64, value) }.map_err(HipStatus::from)
    }

    /// `hipfileCpuStreamWriteValue32`.
    ///
    /// # Safety
    /// The word stays allocated until the write has run and is only accessed atomically.
    fn hipfileCpuStreamWriteValue32(handle: *mut c_void, word: *mut c_void, value: u32) -> HipStatus {
        // SAFETY: forwarded contract; the device checks the word.
        unsafe { cpu()?.stream_write_value32(stream(handle), word as u64, value) }.map_err(HipStatus::from)
    }

    /// `hipfileCpuStoreValue32`: a host store that wakes waiting streams at once.
    ///
    /// # Safety
    /// The word is only accessed atomically meanwhile.
    fn hipfileCpuStoreValue32(word: *mut c_void, value: u32) -> HipStatus {
        // SAFETY: forwarded contract; the device checks the word is aligned, tracked memory.
        unsafe { cpu()?.store_word(word as u64, value) }.map_err(HipStatus::from)
    }

    /// `hipfileCpuEventRecord`.
    ///
    /// # Safety
    /// A non-NULL `event` is writable.
    fn hipfileCpuEventRecord(handle: *mut c_void, event: *mut u64) -> HipStatus {
        let event = out_ptr(event).ok_or(HipStatus::INVALID_VALUE)?;
        let recorded = cpu()?.record_event_on(stream(handle))?;
        // SAFETY: non-NULL, writable per the contract.
        unsafe { event.write_unaligned(recorded.raw() as u64) };
        Ok(())
    }

    /// `hipfileCpuEventQuery`.
    ///
    /// # Safety
    /// None.
    fn hipfileCpuEventQuery(event: u64) -> HipStatus {
        let done = cpu()?.event_done(&EventHandle::from_raw(event as usize))?;
        if done { Ok(()) } else { Err(HipStatus::NOT_READY) }
    }

    /// `hipfileCpuEventSynchronize`.
    ///
    /// # Safety
    /// None.
    fn hipfileCpuEventSynchronize(event: u64) -> HipStatus {
        cpu()?.event_synchronize(&EventHandle::from_raw(event as usize)).map_err(HipStatus::from)
    }

    /// `hipfileCpuEventDestroy`.
    ///
    /// # Safety
    /// None.
    fn hipfileCpuEventDestroy(event: u64) -> HipStatus {
        cpu()?.destroy_event(EventHandle::from_raw(event as usize));
        Ok(())
    }
}
