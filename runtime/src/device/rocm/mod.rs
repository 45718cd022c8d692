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
//! the whole analysis wait for a run on an AMD GPU. For that case the copies can go on
//! the user's own stream instead (`HIPFILE_STREAM_COPIES=all`, opt-in here:
//! [`StreamMemoryOps::copy_on_stream`] from pinned slots; no engine device memory, whose
//! `hipFree` may synchronize the device).
//!
//! `hipError_t` numbers are reported as [`DeviceError::hip_error`] unchanged.
//!
//! Layers: `sys` (the `hip-sys` symbols and the two it lacks), `result` (one function per
//! HIP call, `hipError_t` mapped to [`DeviceError`]), this file (the device: which device
//! is current, the engine's priority streams, event pooling through the shared
//! `gpu::OwnedHandles`). HIP has no contexts, so unlike `cuda` nothing here pushes or
//! pops one: a call on an internal stream makes the stream's device current (cached per
//! thread).

mod result;
mod sys;

use std::cell::Cell;
use std::ffi::{c_int, c_void};
use std::sync::Arc;

use hipfile_core::Direction;

use sys::{
    MEMORY_TYPE_ARRAY, MEMORY_TYPE_DEVICE, MEMORY_TYPE_MANAGED, MEMORY_TYPE_UNIFIED,
    hipDeviceAttribute_t, hipError_t, hipEvent_t, hipEventDisableTiming, hipHostMallocMapped,
    hipHostMallocPortable, hipHostRegisterMapped, hipHostRegisterPortable, hipStream_t,
    hipStreamNonBlocking,
};

use super::gpu::{DeviceEntry, GpuBackend, OwnedHandles};
use super::user::UserDevice;
use super::{
    DeviceCopies, DeviceError, DeviceEvents, DeviceInfo, DeviceKind, EventHandle, HostFn,
    HostMemory, InternalStream, MemoryType, PinnedRegion, PointerInfo, StreamHandle,
    StreamMemoryOps,
};

/// An internal stream and the device it belongs to (boxed behind an `InternalStream` of
/// this device by [`OwnedHandles`]).
pub(crate) struct InternalEntry {
    stream: hipStream_t,
    ordinal: u32,
}

/// An event and its device (boxed behind an `EventHandle` of this device by
/// [`OwnedHandles`]).
pub(crate) struct EventEntry {
    event: hipEvent_t,
    ordinal: u32,
}

impl DeviceEntry for InternalEntry {
    fn ordinal(&self) -> u32 {
        self.ordinal
    }
}

impl DeviceEntry for EventEntry {
    fn ordinal(&self) -> u32 {
        self.ordinal
    }
}

/// A host function and its argument, passed through `hipStreamAddCallback`.
struct HostCall {
    func: HostFn,
    user_data: *mut c_void,
}

/// AMD GPUs through the HIP runtime.
pub(crate) struct RocmDevice {
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
                let _ = unsafe { result::event_destroy(entry.event) };
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

fn stream_of(stream: StreamHandle) -> hipStream_t {
    stream.0 as hipStream_t
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
    pub(crate) fn open() -> Result<Arc<RocmDevice>, String> {
        result::init()?;
        let count = result::get_device_count()?;
        if count <= 0 {
            return Err("the HIP runtime found no AMD GPU".into());
        }
        let memops = (0..count)
            .map(|ordinal| {
                let attribute = hipDeviceAttribute_t::hipDeviceAttributeCanUseStreamWaitValue;
                result::device_get_attribute(attribute, ordinal).is_ok_and(|value| value != 0)
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
        result::set_device(ordinal)?;
        CURRENT_DEVICE.set(ordinal);
        Ok(())
    }

    /// Destroys an idle event the pool has no room for, with its device current.
    fn destroy_event_entry(&self, entry: &EventEntry) {
        let _ = self.make_current(entry.ordinal);
        // SAFETY: our event, destroyed once (HIP defers the release if it is pending).
        let _ = unsafe { result::event_destroy(entry.event) };
    }
}

impl GpuBackend for RocmDevice {
    type Stream = InternalEntry;
    type Event = EventEntry;

    fn handles(&self) -> &OwnedHandles<InternalEntry, EventEntry> {
        &self.handles
    }

    /// The device made current ([`RocmDevice::make_current`]), then `work`.
    fn in_device<R>(
        &self,
        ordinal: u32,
        work: impl FnOnce() -> Result<R, DeviceError>,
    ) -> Result<R, DeviceError> {
        self.make_current(ordinal)?;
        work()
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
        let attributes = match result::pointer_get_attributes(ptr) {
            Ok(attributes) => attributes,
            // Memory HIP does not know (pageable host memory, garbage): host, range unknown.
            Err(error) if error.hip_error == hipError_t::hipErrorInvalidValue as i32 => {
                return Ok(PointerInfo {
                    memory_type: MemoryType::Host,
                    device_ordinal: 0,
                    allocation_base: 0,
                    allocation_len_bytes: 0,
                });
            }
            Err(error) => return Err(error),
        };
        let memory_type = match (attributes.is_managed != 0, attributes.memory_type) {
            (true, _) => MemoryType::Managed,
            (false, MEMORY_TYPE_DEVICE) => MemoryType::Device,
            (false, MEMORY_TYPE_ARRAY) => MemoryType::Array,
            (false, MEMORY_TYPE_UNIFIED | MEMORY_TYPE_MANAGED) => MemoryType::Managed,
            _ => MemoryType::Host,
        };
        let (allocation_base, allocation_len_bytes) =
            result::mem_get_address_range(ptr).unwrap_or((0, 0));
        Ok(PointerInfo {
            memory_type,
            device_ordinal: attributes.device.max(0) as u32,
            allocation_base,
            allocation_len_bytes,
        })
    }

    fn stream_device(&self, stream: StreamHandle) -> Result<u32, DeviceError> {
        if stream == StreamHandle::NULL {
            return Ok(result::get_device()?.max(0) as u32);
        }
        // SAFETY: a user stream handle; HIP validates it.
        unsafe { result::get_stream_device_id(stream_of(stream)) }
    }

    fn supports_stream_memops(&self, device_ordinal: u32) -> bool {
        self.memops.get(device_ordinal as usize).copied().unwrap_or(false)
    }
}

impl HostMemory for RocmDevice {
    fn alloc_pinned(&self, len_bytes: usize) -> Result<PinnedRegion, DeviceError> {
        self.make_current(0)?;
        let host = result::host_malloc(len_bytes, hipHostMallocMapped | hipHostMallocPortable)?;
        // SAFETY: `host` is mapped pinned memory we just allocated.
        match unsafe { result::host_get_device_pointer(host) } {
            Ok(device_addr) => Ok(PinnedRegion { host_ptr: host.cast(), device_addr, len_bytes }),
            Err(error) => {
                // SAFETY: frees what we allocated above, once.
                let _ = unsafe { result::host_free(host) };
                Err(error)
            }
        }
    }

    unsafe fn free_pinned(&self, region: PinnedRegion) {
        // SAFETY: the caller guarantees the region came from alloc_pinned and is idle.
        let _ = unsafe { result::host_free(region.host_ptr.cast()) };
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
        unsafe { result::host_register(host_ptr.cast(), len_bytes, flags) }?;
        // SAFETY: registered, mapped host memory.
        unsafe { result::host_get_device_pointer(host_ptr.cast()) }.inspect_err(|_| {
            // SAFETY: undo the registration above.
            let _ = unsafe { result::host_unregister(host_ptr.cast()) };
        })
    }

    unsafe fn unregister_host(&self, host_ptr: *mut u8) {
        // SAFETY: the caller guarantees it was registered and is idle.
        let _ = unsafe { result::host_unregister(host_ptr.cast()) };
    }
}

impl DeviceCopies for RocmDevice {
    fn create_internal_stream(&self, device_ordinal: u32) -> Result<InternalStream, DeviceError> {
        // The greatest priority HIP offers: ROCm keeps its hardware queues in one pool per
        // priority, so the engine's copy streams do not share a queue with the
        // application's normal-priority streams, where a stream held on an async op's
        // wait-value would block them (see the module documentation).
        self.make_current(device_ordinal)?;
        let priority =
            result::device_get_stream_priority_range().map_or(0, |(_, greatest)| greatest);
        let stream = result::stream_create_with_priority(hipStreamNonBlocking, priority)?;
        Ok(self.handles.stream_handle(InternalEntry { stream, ordinal: device_ordinal }))
    }

    fn prepare_data_path(&self, device_ordinal: u32, events: usize) -> Result<(), DeviceError> {
        // Idle events made now, so that recording one on the data path creates nothing
        // (DeviceCopies::prepare_data_path says why; measured on CUDA, not yet on ROCm).
        self.make_current(device_ordinal)?;
        self.handles.prefill_events(device_ordinal, events, || {
            let event = result::event_create_with_flags(hipEventDisableTiming)?;
            Ok(EventEntry { event, ordinal: device_ordinal })
        })
    }

    fn destroy_internal_stream(&self, stream: InternalStream) {
        let Some(entry) = self.handles.take_stream(stream) else {
            return;
        };
        let _ = self.make_current(entry.ordinal);
        // SAFETY: our own stream, destroyed once.
        let _ = unsafe { result::stream_destroy(entry.stream) };
    }

    unsafe fn copy_to_device_async(
        &self,
        stream: &InternalStream,
        target: u64,
        source: *const u8,
        len_bytes: usize,
    ) -> Result<(), DeviceError> {
        self.on_stream(stream, |entry| {
            // SAFETY: caller's contract (pinned source, valid device range); our stream.
            unsafe { result::memcpy_htod_async(target, source, len_bytes, entry.stream) }
        })
    }

    unsafe fn copy_from_device_async(
        &self,
        stream: &InternalStream,
        target: *mut u8,
        source: u64,
        len_bytes: usize,
    ) -> Result<(), DeviceError> {
        self.on_stream(stream, |entry| {
            // SAFETY: caller's contract; our stream.
            unsafe { result::memcpy_dtoh_async(target, source, len_bytes, entry.stream) }
        })
    }

    fn synchronize_internal(&self, stream: &InternalStream) -> Result<(), DeviceError> {
        self.on_stream(stream, |entry| {
            // SAFETY: our stream.
            unsafe { result::stream_synchronize(entry.stream) }
        })
    }

    unsafe fn write_value32_internal(
        &self,
        stream: &InternalStream,
        word_device_addr: u64,
        value: u32,
    ) -> Result<(), DeviceError> {
        self.on_stream(stream, |entry| {
            // SAFETY: caller's contract: a live pinned word; our stream.
            unsafe { result::stream_write_value32(entry.stream, word_device_addr, value) }
        })
    }
}

impl DeviceEvents for RocmDevice {
    fn record_event(&self, stream: &InternalStream) -> Result<EventHandle, DeviceError> {
        self.on_stream(stream, |entry| {
            self.handles.record_event(
                entry.ordinal,
                || {
                    let event = result::event_create_with_flags(hipEventDisableTiming)?;
                    Ok(EventEntry { event, ordinal: entry.ordinal })
                },
                // SAFETY: event and stream belong to the same (current) device.
                |event| unsafe { result::event_record(event.event, entry.stream) },
                |event| self.destroy_event_entry(&event),
            )
        })
    }

    fn event_done(&self, event: &EventHandle) -> Result<bool, DeviceError> {
        self.on_event(event, |entry| {
            // SAFETY: a live event of ours.
            unsafe { result::event_query(entry.event) }
        })
    }

    fn destroy_event(&self, event: EventHandle) {
        self.handles.release_event(event, |entry| self.destroy_event_entry(&entry));
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
        let launched =
            unsafe { result::stream_add_callback(stream_of(stream), run_host_call, raw) };
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
        unsafe { result::stream_wait_value32_gte(stream_of(stream), word_device_addr, value) }
    }

    unsafe fn stream_write_value32(
        &self,
        stream: StreamHandle,
        word_device_addr: u64,
        value: u32,
    ) -> Result<(), DeviceError> {
        // SAFETY: caller's contract: the word stays allocated until the write.
        unsafe { result::stream_write_value32(stream_of(stream), word_device_addr, value) }
    }

    /// Yes: `hipMemcpyHtoDAsync` / `hipMemcpyDtoHAsync` from pinned slots on the user's
    /// stream, so `HIPFILE_STREAM_COPIES=on`/`all` work here. Off unless asked for: the
    /// engine's copy streams are served from ROCm's high-priority queues, and neither path
    /// has run on an AMD GPU yet (README, rocm backend).
    fn copies_on_user_streams(&self) -> bool {
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
        // SAFETY: the caller's contract (pinned portable host memory, live until the copy
        // ran; a valid device range); HIP runs it on the stream's own device.
        unsafe {
            match direction {
                Direction::Read => result::memcpy_htod_async(
                    device_addr,
                    host.cast_const(),
                    len_bytes,
                    stream_of(stream),
                ),
                Direction::Write => {
                    result::memcpy_dtoh_async(host, device_addr, len_bytes, stream_of(stream))
                }
            }
        }
    }

    fn synchronize_stream(&self, stream: StreamHandle) -> Result<(), DeviceError> {
        // SAFETY: a user stream handle; invalid ones yield an error code.
        unsafe { result::stream_synchronize(stream_of(stream)) }
    }

    fn stream_done(&self, stream: StreamHandle) -> Result<bool, DeviceError> {
        // SAFETY: a user stream handle; invalid ones yield an error code.
        unsafe { result::stream_query(stream_of(stream)) }
    }

    /// A stream made without `hipStreamNonBlocking` waits for the NULL stream.
    fn stream_follows_null_stream(&self, stream: StreamHandle) -> Result<bool, DeviceError> {
        if stream == StreamHandle::NULL {
            return Ok(false);
        }
        // SAFETY: a user stream handle; invalid ones yield an error code.
        let flags = unsafe { result::stream_get_flags(stream_of(stream)) }?;
        Ok(flags & hipStreamNonBlocking == 0)
    }
}

impl UserDevice for RocmDevice {
    fn alloc_device(&self, ordinal: u32, len_bytes: usize) -> Result<u64, DeviceError> {
        self.make_current(ordinal)?;
        result::malloc(len_bytes)
    }

    unsafe fn free_device(&self, address: u64) -> Result<(), DeviceError> {
        // SAFETY: the caller guarantees the memory is idle.
        unsafe { result::free(address) }
    }

    fn create_user_stream(&self, ordinal: u32) -> Result<StreamHandle, DeviceError> {
        self.make_current(ordinal)?;
        let stream = result::stream_create_with_flags(hipStreamNonBlocking)?;
        Ok(StreamHandle(stream as usize))
    }

    fn destroy_user_stream(&self, stream: StreamHandle) -> Result<(), DeviceError> {
        // SAFETY: the stream came from create_user_stream; invalid ones yield an error code.
        unsafe { result::stream_destroy(stream_of(stream)) }
    }

    unsafe fn copy_to_device_on(
        &self,
        stream: StreamHandle,
        target: u64,
        source: *const u8,
        len_bytes: usize,
    ) -> Result<(), DeviceError> {
        // SAFETY: caller's contract.
        unsafe { result::memcpy_htod_async(target, source, len_bytes, stream_of(stream)) }
    }

    unsafe fn copy_from_device_on(
        &self,
        stream: StreamHandle,
        target: *mut u8,
        source: u64,
        len_bytes: usize,
    ) -> Result<(), DeviceError> {
        // SAFETY: caller's contract.
        unsafe { result::memcpy_dtoh_async(target, source, len_bytes, stream_of(stream)) }
    }

    unsafe fn memset_on(
        &self,
        stream: StreamHandle,
        target: u64,
        value: u8,
        len_bytes: usize,
    ) -> Result<(), DeviceError> {
        // SAFETY: the caller guarantees the range.
        unsafe { result::memset_d8_async(target, value, len_bytes, stream_of(stream)) }
    }
}
