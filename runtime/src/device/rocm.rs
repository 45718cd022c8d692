//! The `rocm` device: AMD GPUs through the HIP runtime (`libamdhip64`), via the `hip-sys`
//! bindings (cargo feature `rocm`, off by default).
//!
//! `hipStream_t` values and device pointers pass straight through from the C API. Engine
//! threads make the right device current with `hipSetDevice` before each call on an
//! internal stream (cached per thread). Pinned staging is `hipHostMalloc`ed mapped and
//! portable (or `hipHostRegister`ed); copies run on per-executor non-blocking streams;
//! completion is polled with `hipEventQuery` (never a blocking call on an executor); the
//! release word is waited on with `hipStreamWaitValue32` (`hipStreamWaitValueGte`) and
//! written with `hipStreamWriteValue32`, where the device reports
//! `hipDeviceAttributeCanUseStreamWaitValue` (otherwise
//! [`DeviceInfo::supports_stream_memops`] is `false` and the runtime uses its blocking
//! fallback). Host functions are enqueued with `hipStreamAddCallback`, which every HIP
//! 5.x exports (`hipLaunchHostFunc` is missing from Debian 12's HIP 5.2).
//!
//! Note: HIP's `hipStreamWaitValueGte` compares unsigned (`word >= value`), not in the
//! cyclic sense of CUDA's GEQ; a release counter would have to wrap past 2³² for that to
//! matter.
//!
//! **Hardware queues (not measured on an AMD GPU).** HIP maps streams onto
//! `GPU_MAX_HW_QUEUES` hardware queues per device (4 by default), round-robin, and a
//! stream held on a wait-value blocks what shares its queue, as on CUDA. HIP has no
//! separate context to put the engine in (`hipCtxCreate` is deprecated and shares the
//! device's queues), so the engine's copy streams are created with the greatest stream
//! priority: ROCm keeps one queue pool per priority, so they share no queue with an
//! application's default-priority streams. An application that makes high-priority
//! streams of its own and holds them can still share a queue with the engine; that and
//! the whole analysis wait for a run on an AMD GPU.
//!
//! `hipError_t` numbers are reported as [`DeviceError::hip_error`] unchanged.

use std::cell::Cell;
use std::ffi::{CStr, c_int, c_uint, c_void};
use std::sync::Arc;

use hip_sys::hiprt::{
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

use super::gpu::OwnedHandles;
use super::user::UserDevice;
use super::{
    DeviceCopies, DeviceError, DeviceEvents, DeviceInfo, DeviceKind, EventHandle, HostFn,
    HostMemory, InternalStream, MemoryType, PinnedRegion, PointerInfo, StreamHandle,
    StreamMemoryOps,
};

// HIP entry points that `libamdhip64` exports (HIP 4.2+) but the `hip-sys` bindings lack.
// They return plain integers here, so no out-of-range enum value can ever be produced.
unsafe extern "C" {
    /// `hipError_t hipMemGetAddressRange(hipDeviceptr_t*, size_t*, hipDeviceptr_t)`.
    fn hipMemGetAddressRange(base: *mut *mut c_void, size: *mut usize, ptr: *mut c_void) -> c_int;
    /// `int hipGetStreamDeviceId(hipStream_t)`: the stream's device, or -1.
    fn hipGetStreamDeviceId(stream: hipStream_t) -> c_int;
}

/// `hipPointerAttribute_t` with the memory type as a plain integer (so an unexpected
/// value from the library is never read as a Rust enum). Same layout as the binding's.
#[repr(C)]
struct RawPointerAttributes {
    memory_type: c_uint,
    device: c_int,
    device_pointer: *mut c_void,
    host_pointer: *mut c_void,
    is_managed: c_int,
    allocation_flags: c_uint,
}

const _: () = assert!(
    size_of::<RawPointerAttributes>() == size_of::<hipPointerAttribute_t>()
        && align_of::<RawPointerAttributes>() == align_of::<hipPointerAttribute_t>()
);

/// `hipMemoryTypeDevice`, `hipMemoryTypeArray`, `hipMemoryTypeUnified`, `hipMemoryTypeManaged`.
const MEMORY_TYPE_DEVICE: c_uint = 1;
const MEMORY_TYPE_ARRAY: c_uint = 2;
const MEMORY_TYPE_UNIFIED: c_uint = 3;
const MEMORY_TYPE_MANAGED: c_uint = 4;

/// An internal stream and the device it belongs to (boxed; an `InternalStream` of this
/// device holds the box's address; see [`RocmDevice::internal`]).
struct InternalEntry {
    stream: hipStream_t,
    ordinal: u32,
}

/// An event and its device (boxed; an `EventHandle` of this device holds the box's
/// address; see [`RocmDevice::event`]).
struct EventEntry {
    event: hipEvent_t,
    ordinal: u32,
}

/// A host function and its argument, passed through `hipStreamAddCallback`.
struct HostCall {
    func: HostFn,
    user_data: *mut c_void,
}

/// AMD GPUs through the HIP runtime.
pub struct RocmDevice {
    count: u32,
    /// The boxes behind this object's `InternalStream` and `EventHandle` values (owner
    /// checked) and the idle events per device.
    handles: OwnedHandles<InternalEntry, EventEntry>,
    memops: Vec<bool>,
}

impl std::fmt::Debug for RocmDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RocmDevice").field("devices", &self.count).finish()
    }
}

impl Drop for RocmDevice {
    /// Destroys the pooled events (idle; events still behind a handle are the holder's).
    /// HIP has no context to check: a device stays usable until the process exits.
    fn drop(&mut self) {
        for (ordinal, events) in self.handles.drain_event_pools() {
            let _ = self.make_current(ordinal);
            for entry in events {
                // SAFETY: an idle pooled event of ours, no handle names it; destroyed once.
                unsafe { hipEventDestroy(entry.event) };
            }
        }
    }
}

// SAFETY: HIP handles (streams, events) may be used from any thread; the pools are
// behind mutexes and the raw handles inside them are only used through HIP.
unsafe impl Send for RocmDevice {}
// SAFETY: as above.
unsafe impl Sync for RocmDevice {}

thread_local! {
    /// The device this thread last made current with `hipSetDevice` (-1: none yet).
    static CURRENT_DEVICE: Cell<c_int> = const { Cell::new(-1) };
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

fn check(code: hipError_t, what: &str) -> Result<(), String> {
    if code == hipError_t::hipSuccess {
        Ok(())
    } else {
        Err(format!("{what}: hipError {} ({})", code as i32, error_name(code)))
    }
}

fn call(code: hipError_t, what: &'static str) -> Result<(), DeviceError> {
    if code == hipError_t::hipSuccess { Ok(()) } else { Err(DeviceError::new(code as i32, what)) }
}

fn stream_of(stream: StreamHandle) -> hipStream_t {
    stream.0 as hipStream_t
}

fn device_ptr(addr: u64) -> *mut c_void {
    addr as usize as *mut c_void
}

/// Runs a [`HostCall`] enqueued by `launch_host_func`.
///
/// # Safety
/// `user_data` is a `Box<HostCall>` leaked by `launch_host_func`, passed once.
unsafe extern "C" fn run_host_call(
    _stream: hipStream_t,
    _status: hipError_t,
    user_data: *mut c_void,
) {
    // SAFETY: see the function's contract.
    let call = unsafe { Box::from_raw(user_data.cast::<HostCall>()) };
    // SAFETY: launch_host_func's caller guaranteed `func` is sound to call with `user_data`
    // on another thread and that `user_data` is still valid.
    unsafe { (call.func)(call.user_data) };
}

impl RocmDevice {
    /// Initialises HIP and queries every device.
    ///
    /// # Errors
    /// `hipInit` or `hipGetDeviceCount` fails (no AMD GPU or no kernel driver), or there is
    /// no device: a clear message, never a panic.
    pub fn open() -> Result<Arc<RocmDevice>, String> {
        // SAFETY: hipInit takes flags (0) and has no other precondition.
        check(unsafe { hipInit(0) }, "hipInit")?;
        let mut count: c_int = 0;
        // SAFETY: `count` is a valid out-pointer.
        check(unsafe { hipGetDeviceCount(&mut count) }, "hipGetDeviceCount")?;
        if count <= 0 {
            return Err("the HIP runtime found no AMD GPU".into());
        }
        let memops = (0..count)
            .map(|ordinal| {
                let mut value: c_int = 0;
                // SAFETY: valid out-pointer; ordinal < count.
                let code = unsafe {
                    hipDeviceGetAttribute(
                        &mut value,
                        hipDeviceAttribute_t::hipDeviceAttributeCanUseStreamWaitValue,
                        ordinal,
                    )
                };
                code == hipError_t::hipSuccess && value != 0
            })
            .collect();
        Ok(Arc::new(RocmDevice {
            count: count as u32,
            handles: OwnedHandles::new(count as usize),
            memops,
        }))
    }

    /// Makes device `ordinal` current on this thread (cached).
    fn make_current(&self, ordinal: u32) -> Result<(), DeviceError> {
        if ordinal >= self.count {
            return Err(DeviceError::new(DeviceError::HIP_ERROR_INVALID_DEVICE, "no such device"));
        }
        let ordinal = ordinal as c_int;
        if CURRENT_DEVICE.get() == ordinal {
            return Ok(());
        }
        // SAFETY: ordinal < device count.
        call(unsafe { hipSetDevice(ordinal) }, "hipSetDevice")?;
        CURRENT_DEVICE.set(ordinal);
        Ok(())
    }

    /// Keeps an idle event for reuse, or destroys it when the pool is full.
    fn pool_or_destroy_event(&self, entry: Box<EventEntry>) {
        let Some(entry) = self.handles.pool_event(entry.ordinal, entry) else {
            return;
        };
        let _ = self.make_current(entry.ordinal);
        // SAFETY: our event, destroyed once (HIP defers the release if it is pending).
        unsafe { hipEventDestroy(entry.event) };
    }
}

impl DeviceInfo for RocmDevice {
    fn kind(&self) -> DeviceKind {
        DeviceKind::Rocm
    }

    fn device_count(&self) -> u32 {
        self.count
    }

    fn pointer_info(&self, ptr: u64) -> Result<PointerInfo, DeviceError> {
        let mut attributes = RawPointerAttributes {
            memory_type: 0,
            device: 0,
            device_pointer: std::ptr::null_mut(),
            host_pointer: std::ptr::null_mut(),
            is_managed: 0,
            allocation_flags: 0,
        };
        // SAFETY: RawPointerAttributes has hipPointerAttribute_t's layout (asserted above)
        // and is only read through its own plain-integer fields.
        let code = unsafe {
            hipPointerGetAttributes(
                (&raw mut attributes).cast::<hipPointerAttribute_t>(),
                device_ptr(ptr).cast_const(),
            )
        };
        match code {
            hipError_t::hipSuccess => {}
            // Memory HIP does not know (pageable host memory, garbage): host, range unknown.
            hipError_t::hipErrorInvalidValue => {
                return Ok(PointerInfo {
                    memory_type: MemoryType::Host,
                    device_ordinal: 0,
                    allocation_base: 0,
                    allocation_len_bytes: 0,
                });
            }
            code => return Err(DeviceError::new(code as i32, "hipPointerGetAttributes")),
        }
        let memory_type = match (attributes.is_managed != 0, attributes.memory_type) {
            (true, _) => MemoryType::Managed,
            (false, MEMORY_TYPE_DEVICE) => MemoryType::Device,
            (false, MEMORY_TYPE_ARRAY) => MemoryType::Array,
            (false, MEMORY_TYPE_UNIFIED | MEMORY_TYPE_MANAGED) => MemoryType::Managed,
            _ => MemoryType::Host,
        };
        let mut base: *mut c_void = std::ptr::null_mut();
        let mut size: usize = 0;
        // SAFETY: valid out-pointers; an address outside any allocation yields an error.
        let ranged = unsafe { hipMemGetAddressRange(&mut base, &mut size, device_ptr(ptr)) };
        let (allocation_base, allocation_len_bytes) =
            if ranged == 0 { (base as u64, size as u64) } else { (0, 0) };
        Ok(PointerInfo {
            memory_type,
            device_ordinal: attributes.device.max(0) as u32,
            allocation_base,
            allocation_len_bytes,
        })
    }

    fn stream_device(&self, stream: StreamHandle) -> Result<u32, DeviceError> {
        if stream == StreamHandle::NULL {
            let mut device: c_int = 0;
            // SAFETY: valid out-pointer.
            call(unsafe { hipGetDevice(&mut device) }, "hipGetDevice")?;
            return Ok(device.max(0) as u32);
        }
        // SAFETY: a user stream handle; HIP validates it and returns -1 for unknown ones.
        let device = unsafe { hipGetStreamDeviceId(stream_of(stream)) };
        if device < 0 {
            return Err(DeviceError::new(DeviceError::HIP_ERROR_INVALID_HANDLE, "unknown stream"));
        }
        Ok(device as u32)
    }

    fn supports_stream_memops(&self, device_ordinal: u32) -> bool {
        self.memops.get(device_ordinal as usize).copied().unwrap_or(false)
    }
}

impl HostMemory for RocmDevice {
    fn alloc_pinned(&self, len_bytes: usize) -> Result<PinnedRegion, DeviceError> {
        self.make_current(0)?;
        let mut host: *mut c_void = std::ptr::null_mut();
        let flags = hipHostMallocMapped | hipHostMallocPortable;
        // SAFETY: valid out-pointer.
        call(unsafe { hipHostMalloc(&mut host, len_bytes, flags) }, "hipHostMalloc")?;
        let mut device_addr: *mut c_void = std::ptr::null_mut();
        // SAFETY: `host` is mapped pinned memory we just allocated.
        let mapped = unsafe { hipHostGetDevicePointer(&mut device_addr, host, 0) };
        if let Err(error) = call(mapped, "hipHostGetDevicePointer") {
            // SAFETY: frees what we allocated above.
            unsafe { hipHostFree(host) };
            return Err(error);
        }
        Ok(PinnedRegion { host_ptr: host.cast(), device_addr: device_addr as u64, len_bytes })
    }

    unsafe fn free_pinned(&self, region: PinnedRegion) {
        // SAFETY: the caller guarantees the region came from alloc_pinned and is idle.
        unsafe { hipHostFree(region.host_ptr.cast()) };
    }

    unsafe fn register_host(
        &self,
        host_ptr: *mut u8,
        len_bytes: usize,
    ) -> Result<u64, DeviceError> {
        self.make_current(0)?;
        let flags = hipHostRegisterMapped | hipHostRegisterPortable;
        // SAFETY: the caller guarantees the range is valid host memory that outlives the
        // registration.
        call(unsafe { hipHostRegister(host_ptr.cast(), len_bytes, flags) }, "hipHostRegister")?;
        let mut device_addr: *mut c_void = std::ptr::null_mut();
        // SAFETY: registered, mapped host memory.
        let mapped = unsafe { hipHostGetDevicePointer(&mut device_addr, host_ptr.cast(), 0) };
        if let Err(error) = call(mapped, "hipHostGetDevicePointer") {
            // SAFETY: undo the registration above.
            unsafe { hipHostUnregister(host_ptr.cast()) };
            return Err(error);
        }
        Ok(device_addr as u64)
    }

    unsafe fn unregister_host(&self, host_ptr: *mut u8) {
        // SAFETY: the caller guarantees it was registered and is idle.
        unsafe { hipHostUnregister(host_ptr.cast()) };
    }
}

impl DeviceCopies for RocmDevice {
    fn create_internal_stream(&self, device_ordinal: u32) -> Result<InternalStream, DeviceError> {
        // The greatest priority HIP offers: ROCm keeps its hardware queues in one pool per
        // priority, so the engine's copy streams do not share a queue with the
        // application's normal-priority streams, where a stream held on an async op's
        // wait-value would block them (see the module documentation).
        self.make_current(device_ordinal)?;
        let (mut least, mut greatest): (c_int, c_int) = (0, 0);
        // SAFETY: valid out-pointers.
        let ranged = unsafe { hipDeviceGetStreamPriorityRange(&mut least, &mut greatest) };
        let priority = if ranged == hipError_t::hipSuccess { greatest } else { 0 };
        let mut stream: hipStream_t = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the device is current.
        let code =
            unsafe { hipStreamCreateWithPriority(&mut stream, hipStreamNonBlocking, priority) };
        call(code, "hipStreamCreateWithPriority")?;
        Ok(self.handles.stream_handle(InternalEntry { stream, ordinal: device_ordinal }))
    }

    fn destroy_internal_stream(&self, stream: InternalStream) {
        let Some(entry) = self.handles.take_stream(stream) else {
            return;
        };
        let _ = self.make_current(entry.ordinal);
        // SAFETY: our own stream.
        unsafe { hipStreamDestroy(entry.stream) };
    }

    unsafe fn copy_to_device_async(
        &self,
        stream: &InternalStream,
        target: u64,
        source: *const u8,
        len_bytes: usize,
    ) -> Result<(), DeviceError> {
        let entry = self.handles.stream(stream)?;
        self.make_current(entry.ordinal)?;
        // SAFETY: caller's contract (pinned source, valid device range); HIP only reads
        // through `source`.
        call(
            unsafe {
                hipMemcpyHtoDAsync(
                    device_ptr(target),
                    source.cast_mut().cast(),
                    len_bytes,
                    entry.stream,
                )
            },
            "hipMemcpyHtoDAsync",
        )
    }

    unsafe fn copy_from_device_async(
        &self,
        stream: &InternalStream,
        target: *mut u8,
        source: u64,
        len_bytes: usize,
    ) -> Result<(), DeviceError> {
        let entry = self.handles.stream(stream)?;
        self.make_current(entry.ordinal)?;
        // SAFETY: caller's contract.
        call(
            unsafe {
                hipMemcpyDtoHAsync(target.cast(), device_ptr(source), len_bytes, entry.stream)
            },
            "hipMemcpyDtoHAsync",
        )
    }

    fn synchronize_internal(&self, stream: &InternalStream) -> Result<(), DeviceError> {
        let entry = self.handles.stream(stream)?;
        self.make_current(entry.ordinal)?;
        // SAFETY: our stream.
        call(unsafe { hipStreamSynchronize(entry.stream) }, "hipStreamSynchronize")
    }

    unsafe fn write_value32_internal(
        &self,
        stream: &InternalStream,
        word_device_addr: u64,
        value: u32,
    ) -> Result<(), DeviceError> {
        let entry = self.handles.stream(stream)?;
        self.make_current(entry.ordinal)?;
        // SAFETY: caller's contract: a live pinned word.
        call(
            unsafe { hipStreamWriteValue32(entry.stream, device_ptr(word_device_addr), value, 0) },
            "hipStreamWriteValue32",
        )
    }
}

impl DeviceEvents for RocmDevice {
    fn record_event(&self, stream: &InternalStream) -> Result<EventHandle, DeviceError> {
        let entry = self.handles.stream(stream)?;
        self.make_current(entry.ordinal)?;
        let event = match self.handles.pooled_event(entry.ordinal) {
            Some(event) => event,
            None => {
                let mut event: hipEvent_t = std::ptr::null_mut();
                // SAFETY: valid out-pointer.
                let code = unsafe { hipEventCreateWithFlags(&mut event, hipEventDisableTiming) };
                call(code, "hipEventCreateWithFlags")?;
                Box::new(EventEntry { event, ordinal: entry.ordinal })
            }
        };
        // SAFETY: event and stream belong to the same (current) device.
        let code = unsafe { hipEventRecord(event.event, entry.stream) };
        if let Err(error) = call(code, "hipEventRecord") {
            self.pool_or_destroy_event(event);
            return Err(error);
        }
        Ok(self.handles.event_handle(event))
    }

    fn event_done(&self, event: &EventHandle) -> Result<bool, DeviceError> {
        let entry = self.handles.event(event)?;
        self.make_current(entry.ordinal)?;
        // SAFETY: a live event of ours.
        match unsafe { hipEventQuery(entry.event) } {
            hipError_t::hipSuccess => Ok(true),
            hipError_t::hipErrorNotReady => Ok(false),
            code => Err(DeviceError::new(code as i32, "hipEventQuery")),
        }
    }

    fn destroy_event(&self, event: EventHandle) {
        if let Some(entry) = self.handles.take_event(event) {
            self.pool_or_destroy_event(entry);
        }
    }
}

impl StreamMemoryOps for RocmDevice {
    unsafe fn launch_host_func(
        &self,
        stream: StreamHandle,
        func: HostFn,
        user_data: *mut c_void,
    ) -> Result<(), DeviceError> {
        let raw = Box::into_raw(Box::new(HostCall { func, user_data })).cast::<c_void>();
        // SAFETY: `raw` is taken back exactly once by run_host_call (or below on failure);
        // the caller guarantees `func`/`user_data` are sound to run on another thread.
        let code = unsafe { hipStreamAddCallback(stream_of(stream), Some(run_host_call), raw, 0) };
        let launched = call(code, "hipStreamAddCallback");
        if launched.is_err() {
            // SAFETY: the enqueue failed, so run_host_call will never see `raw`.
            drop(unsafe { Box::from_raw(raw.cast::<HostCall>()) });
        }
        launched
    }

    unsafe fn stream_wait_value32(
        &self,
        stream: StreamHandle,
        word_device_addr: u64,
        value: u32,
    ) -> Result<(), DeviceError> {
        // SAFETY: caller's contract: the word stays allocated until the wait is satisfied.
        call(
            unsafe {
                hipStreamWaitValue32(
                    stream_of(stream),
                    device_ptr(word_device_addr),
                    value,
                    hipStreamWaitValueGte,
                    u32::MAX,
                )
            },
            "hipStreamWaitValue32",
        )
    }

    unsafe fn stream_write_value32(
        &self,
        stream: StreamHandle,
        word_device_addr: u64,
        value: u32,
    ) -> Result<(), DeviceError> {
        // SAFETY: caller's contract: the word stays allocated until the write.
        call(
            unsafe {
                hipStreamWriteValue32(stream_of(stream), device_ptr(word_device_addr), value, 0)
            },
            "hipStreamWriteValue32",
        )
    }

    fn synchronize_stream(&self, stream: StreamHandle) -> Result<(), DeviceError> {
        // SAFETY: a user stream handle; invalid ones yield an error code.
        call(unsafe { hipStreamSynchronize(stream_of(stream)) }, "hipStreamSynchronize")
    }

    fn stream_done(&self, stream: StreamHandle) -> Result<bool, DeviceError> {
        // SAFETY: a user stream handle; invalid ones yield an error code.
        match unsafe { hipStreamQuery(stream_of(stream)) } {
            hipError_t::hipErrorNotReady => Ok(false),
            code => call(code, "hipStreamQuery").map(|()| true),
        }
    }
}

impl UserDevice for RocmDevice {
    fn alloc_device(&self, ordinal: u32, len_bytes: usize) -> Result<u64, DeviceError> {
        self.make_current(ordinal)?;
        let mut address: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        call(unsafe { hipMalloc(&mut address, len_bytes) }, "hipMalloc")?;
        Ok(address as u64)
    }

    unsafe fn free_device(&self, address: u64) -> Result<(), DeviceError> {
        // SAFETY: the caller guarantees the memory is idle.
        call(unsafe { hipFree(device_ptr(address)) }, "hipFree")
    }

    fn create_user_stream(&self, ordinal: u32) -> Result<StreamHandle, DeviceError> {
        self.make_current(ordinal)?;
        let mut stream: hipStream_t = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        let code = unsafe { hipStreamCreateWithFlags(&mut stream, hipStreamNonBlocking) };
        call(code, "hipStreamCreateWithFlags")?;
        Ok(StreamHandle(stream as usize))
    }

    fn destroy_user_stream(&self, stream: StreamHandle) -> Result<(), DeviceError> {
        // SAFETY: the stream came from create_stream; invalid ones yield an error code.
        call(unsafe { hipStreamDestroy(stream_of(stream)) }, "hipStreamDestroy")
    }

    unsafe fn copy_to_device_on(
        &self,
        stream: StreamHandle,
        target: u64,
        source: *const u8,
        len_bytes: usize,
    ) -> Result<(), DeviceError> {
        // SAFETY: caller's contract; HIP only reads through `source`.
        call(
            unsafe {
                hipMemcpyHtoDAsync(
                    device_ptr(target),
                    source.cast_mut().cast(),
                    len_bytes,
                    stream_of(stream),
                )
            },
            "hipMemcpyHtoDAsync",
        )
    }

    unsafe fn copy_from_device_on(
        &self,
        stream: StreamHandle,
        target: *mut u8,
        source: u64,
        len_bytes: usize,
    ) -> Result<(), DeviceError> {
        // SAFETY: caller's contract.
        call(
            unsafe {
                hipMemcpyDtoHAsync(target.cast(), device_ptr(source), len_bytes, stream_of(stream))
            },
            "hipMemcpyDtoHAsync",
        )
    }

    unsafe fn memset_on(
        &self,
        stream: StreamHandle,
        target: u64,
        value: u8,
        len_bytes: usize,
    ) -> Result<(), DeviceError> {
        // SAFETY: the caller guarantees the range.
        call(
            unsafe { hipMemsetD8Async(device_ptr(target), value, len_bytes, stream_of(stream)) },
            "hipMemsetD8Async",
        )
    }
}
