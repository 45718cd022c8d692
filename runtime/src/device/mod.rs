//! The `Device` trait: everything the engine and the stream protocol need from a GPU
//! runtime, and the backends that implement it.
//!
//! Addresses follow the GPU drivers' conventions: a *device address* is a `u64`
//! (`CUdeviceptr` / `hipDeviceptr_t`); a *stream* is the opaque `hipStream_t` value as a
//! `usize` ([`StreamHandle`]), `0` being the NULL (default) stream. Pinned host memory
//! has a host pointer and a device address (equal on the `cpu` device).

pub mod cpu;
pub(crate) mod cuda;
mod error;
mod gpu;
mod handle;
#[cfg(feature = "rocm")]
pub(crate) mod rocm;
pub mod user;

use core::ffi::c_void;

use hipfile_core::Direction;

pub use error::DeviceError;
pub(crate) use error::injected_fault;

/// A user stream, as the C API passes it (`hipStream_t` / `CUstream` cast to an integer).
/// `StreamHandle(0)` is the NULL (default) stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamHandle(pub usize);

impl StreamHandle {
    /// The NULL (legacy default) stream.
    pub const NULL: StreamHandle = StreamHandle(0);
}

/// Signature of a host function enqueued on a stream (same ABI as `hipHostFn_t` and
/// `CUhostFn`).
pub type HostFn = unsafe extern "C" fn(user_data: *mut c_void);

/// Which backend a device object is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    /// In-process device on the host: CI, development, GPU-less users.
    Cpu,
    /// NVIDIA GPUs through the CUDA driver API (loaded at run time).
    Cuda,
    /// AMD GPUs through HIP (cargo feature `rocm`).
    Rocm,
}

impl DeviceKind {
    /// Lower-case name used by `HIPFILE_DEVICE`.
    pub fn name(self) -> &'static str {
        match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Cuda => "cuda",
            DeviceKind::Rocm => "rocm",
        }
    }
}

/// What kind of memory a pointer refers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryType {
    /// Device (GPU) memory: the only kind hipFile accepts for I/O.
    Device,
    /// Pinned or pageable host memory (also: pointers the device does not know).
    Host,
    /// Managed / unified memory.
    Managed,
    /// Array memory.
    Array,
}

/// The answer to a pointer query.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PointerInfo {
    /// Memory type of the allocation holding the pointer.
    pub memory_type: MemoryType,
    /// Ordinal of the device owning the allocation (meaningful for `Device` memory).
    pub device_ordinal: u32,
    /// First address of the allocation that holds the pointer.
    pub allocation_base: u64,
    /// Length in bytes of that allocation.
    pub allocation_len_bytes: u64,
}

/// Pinned, device-mapped host memory allocated by a backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PinnedRegion {
    /// Host address.
    pub host_ptr: *mut u8,
    /// The address the device uses for the same bytes.
    pub device_addr: u64,
    /// Length in bytes.
    pub len_bytes: usize,
}

// SAFETY: a PinnedRegion is a plain description of memory (addresses and a length); it
// does not own or dereference the memory, so moving it across threads is sound. Users
// that dereference `host_ptr` carry their own safety argument.
unsafe impl Send for PinnedRegion {}
// SAFETY: as above; shared references only read the three plain fields.
unsafe impl Sync for PinnedRegion {}

/// An internal (library-owned) stream used for staging copies, owned by whoever holds
/// the handle: [`DeviceCopies::destroy_internal_stream`] consumes it, every other method
/// borrows it. Dropping a handle without destroying it leaks the stream.
///
/// Neither `Clone` nor `Copy`: a GPU backend's handle names a boxed object of the
/// backend, live until the one handle is destroyed. A handle made with
/// [`InternalStream::from_raw`] belongs to no device: the GPU backends refuse it
/// (`HIP_ERROR_INVALID_HANDLE`, or nothing done for a destroy), the `cpu` device looks
/// its raw id up like any other.
///
/// Used, then destroyed once (this compiles; the two examples below, which differ from it
/// only in the misuse, do not):
/// ```
/// use hipfile_runtime::device::{Device, InternalStream};
/// fn once(device: &dyn Device, stream: InternalStream) {
///     let _ = device.synchronize_internal(&stream);
///     device.destroy_internal_stream(stream);
/// }
/// ```
/// Destroying a handle twice does not compile:
/// ```compile_fail
/// use hipfile_runtime::device::{Device, InternalStream};
/// fn twice(device: &dyn Device, stream: InternalStream) {
///     device.destroy_internal_stream(stream);
///     device.destroy_internal_stream(stream); // use of a moved value
/// }
/// ```
/// nor does keeping a copy to use after the destroy:
/// ```compile_fail
/// use hipfile_runtime::device::{Device, InternalStream};
/// fn use_after(device: &dyn Device, stream: InternalStream) {
///     let copy = stream.clone(); // InternalStream is not Clone
///     device.destroy_internal_stream(stream);
///     let _ = device.synchronize_internal(&copy);
/// }
/// ```
#[derive(Debug, PartialEq, Eq)]
pub struct InternalStream {
    /// The backend's raw value (a stream id, or the address of the backend's entry).
    raw: usize,
    /// [`handle::next_owner_id`] of the device object that made the handle; 0: none.
    owner: u64,
}

impl InternalStream {
    /// A handle with the raw value `raw` that no device made (owner 0): the `cpu`
    /// device's stream ids, or a forged value that the GPU backends refuse.
    pub fn from_raw(raw: usize) -> Self {
        InternalStream { raw, owner: 0 }
    }

    /// A handle the device object with owner id `owner` made for its entry `raw`.
    pub(crate) fn owned(raw: usize, owner: u64) -> Self {
        InternalStream { raw, owner }
    }

    /// The backend's raw value, for diagnostics (and the `cpu` device's stream id).
    pub fn raw(&self) -> usize {
        self.raw
    }

    /// The owner id of the device object that made the handle (0: none).
    pub(crate) fn owner(&self) -> u64 {
        self.owner
    }
}

/// An event recorded on an internal stream, polled for completion; owned like an
/// [`InternalStream`]: [`DeviceEvents::destroy_event`] consumes it, every other method
/// borrows it, and a handle made with [`EventHandle::from_raw`] belongs to no device.
///
/// Destroying an event once compiles, twice does not:
/// ```
/// use hipfile_runtime::device::{Device, EventHandle};
/// fn once(device: &dyn Device, event: EventHandle) {
///     let _ = device.event_done(&event);
///     device.destroy_event(event);
/// }
/// ```
/// ```compile_fail
/// use hipfile_runtime::device::{Device, EventHandle};
/// fn twice(device: &dyn Device, event: EventHandle) {
///     device.destroy_event(event);
///     device.destroy_event(event); // use of a moved value
/// }
/// ```
#[derive(Debug, PartialEq, Eq)]
pub struct EventHandle {
    /// The backend's raw value (an event id, or the address of the backend's entry).
    raw: usize,
    /// [`handle::next_owner_id`] of the device object that made the handle; 0: none.
    owner: u64,
}

impl EventHandle {
    /// A handle with the raw value `raw` that no device made (owner 0): the `cpu`
    /// device's event ids (as the C extension passes them), or a forged value that the
    /// GPU backends refuse.
    pub fn from_raw(raw: usize) -> Self {
        EventHandle { raw, owner: 0 }
    }

    /// A handle the device object with owner id `owner` made for its entry `raw`.
    pub(crate) fn owned(raw: usize, owner: u64) -> Self {
        EventHandle { raw, owner }
    }

    /// The backend's raw value, for diagnostics (and the `cpu` device's event id).
    pub fn raw(&self) -> usize {
        self.raw
    }

    /// The owner id of the device object that made the handle (0: none).
    pub(crate) fn owner(&self) -> u64 {
        self.owner
    }
}

/// How [`StreamMemoryOps::stream_write_then_wait_value32`] failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteThenWaitError {
    /// Nothing was enqueued.
    NothingQueued(DeviceError),
    /// The write was enqueued, the wait was not.
    WaitNotQueued(DeviceError),
}

/// [`StreamMemoryOps::stream_write_then_wait_value32`] as two enqueues (the default, and a
/// backend's fallback when its one-call form fails).
///
/// # Safety
/// As [`StreamMemoryOps::stream_write_then_wait_value32`].
pub(crate) unsafe fn write_then_wait_one_by_one<D: StreamMemoryOps + ?Sized>(
    device: &D,
    stream: StreamHandle,
    write_addr: u64,
    write_value: u32,
    wait_addr: u64,
    wait_value: u32,
) -> Result<(), WriteThenWaitError> {
    // SAFETY: the caller's contract.
    unsafe { device.stream_write_value32(stream, write_addr, write_value) }
        .map_err(WriteThenWaitError::NothingQueued)?;
    // SAFETY: the caller's contract.
    unsafe { device.stream_wait_value32(stream, wait_addr, wait_value) }
        .map_err(WriteThenWaitError::WaitNotQueued)
}

/// What the engine and the stream protocol need from a GPU runtime.
///
/// Every method may be called from any thread. Methods that enqueue work return once it
/// is enqueued; none waits for earlier stream work except [`DeviceCopies::synchronize_internal`].
///
/// [`InternalStream`] and [`EventHandle`] are owned handles: `destroy_*` consumes one,
/// the other methods borrow it. A method given a handle that this device object did not
/// make fails with [`DeviceError::HIP_ERROR_INVALID_HANDLE`] (the `cpu` device: when the
/// raw id is unknown), never with undefined behaviour.
pub trait Device: DeviceInfo + HostMemory + DeviceCopies + DeviceEvents + StreamMemoryOps {}

/// Every type with the five narrow traits is a [`Device`].
impl<T> Device for T where T: DeviceInfo + HostMemory + DeviceCopies + DeviceEvents + StreamMemoryOps
{}

/// What a backend is and what it knows about pointers and streams.
pub trait DeviceInfo: Send + Sync + 'static {
    /// Which backend this is.
    fn kind(&self) -> DeviceKind;

    /// Number of devices this backend drives.
    fn device_count(&self) -> u32;

    /// Classifies `ptr`. Unknown pointers are host memory (`MemoryType::Host`) with the
    /// allocation range unknown (`allocation_len_bytes == 0`).
    ///
    /// # Errors
    /// A backend error other than "not a device pointer".
    fn pointer_info(&self, ptr: u64) -> Result<PointerInfo, DeviceError>;

    /// The device ordinal a user stream belongs to (the NULL stream: the current device).
    ///
    /// # Errors
    /// Unknown or destroyed stream.
    fn stream_device(&self, stream: StreamHandle) -> Result<u32, DeviceError>;

    /// Whether [`StreamMemoryOps::stream_wait_value32`] / write-value work on `device_ordinal`.
    fn supports_stream_memops(&self, device_ordinal: u32) -> bool;

    /// How streams share the GPU's hardware queues and whether the engine's copies run
    /// apart from the application's streams (`None`: no hardware queues to speak of).
    fn hardware_queue_setting(&self) -> Option<String> {
        None
    }
}

/// Pinned, device-mapped host memory: the engine's staging and the release words.
pub trait HostMemory {
    /// Allocates `len_bytes` of pinned, device-mapped host memory, 4096-aligned.
    ///
    /// # Errors
    /// Out of memory, or the backend refused to pin.
    fn alloc_pinned(&self, len_bytes: usize) -> Result<PinnedRegion, DeviceError>;

    /// Frees memory from [`HostMemory::alloc_pinned`].
    ///
    /// # Safety
    /// `region` came from `alloc_pinned` on this device, is freed once, and no enqueued
    /// copy or wait still uses it.
    unsafe fn free_pinned(&self, region: PinnedRegion);

    /// Pins and device-maps existing host memory (e.g. an executor's `io_memory` arena)
    /// and returns the device address of `host_ptr`.
    ///
    /// # Errors
    /// The backend refused to pin the range.
    ///
    /// # Safety
    /// `host_ptr..host_ptr+len_bytes` is valid host memory that stays allocated until
    /// [`HostMemory::unregister_host`].
    unsafe fn register_host(&self, host_ptr: *mut u8, len_bytes: usize)
    -> Result<u64, DeviceError>;

    /// Undoes [`HostMemory::register_host`].
    ///
    /// # Safety
    /// `host_ptr` was registered with `register_host` and no enqueued copy still uses it.
    unsafe fn unregister_host(&self, host_ptr: *mut u8);

    /// Stores `value` into a pinned 32-bit word from the host (release ordering), and
    /// wakes whatever waits on it. GPUs poll the word themselves, so the default is a
    /// plain atomic store; a backend whose waiters sleep overrides it to wake them.
    ///
    /// # Safety
    /// `word_host_ptr` points to a live, 4-byte-aligned word of pinned memory.
    unsafe fn store_word_host(&self, word_host_ptr: *mut u32, value: u32) {
        // SAFETY: the caller guarantees a live, aligned word; AtomicU32 has u32's layout.
        let word = unsafe { core::sync::atomic::AtomicU32::from_ptr(word_host_ptr) };
        word.store(value, core::sync::atomic::Ordering::Release);
    }
}

/// The engine's library-owned streams and the copies on them (and on the caller's thread).
pub trait DeviceCopies {
    /// Creates a library-owned stream on `device_ordinal` for staging copies.
    ///
    /// # Errors
    /// Invalid device, or the backend failed.
    fn create_internal_stream(&self, device_ordinal: u32) -> Result<InternalStream, DeviceError>;

    /// Makes, on the calling thread, what the data path of device `device_ordinal`
    /// would otherwise create on first use: on the GPU backends the engine context, up to
    /// `events` idle events, and a caller-thread copy stream with its scratch. The engine
    /// calls it when it starts, so that no op's release ever waits for a creation call:
    /// on CUDA, creating or allocating anything can wait for a lock that another thread's
    /// `cuStreamCreate` holds while it waits for streams that our ops hold (measured on
    /// the H200: `tests/gpu/cuda_lock_probe.c`, README "Known limits"). Default: nothing
    /// to make.
    ///
    /// # Errors
    /// The backend failed to make one of them (the data path makes it on first use then).
    fn prepare_data_path(&self, device_ordinal: u32, events: usize) -> Result<(), DeviceError> {
        let _ = (device_ordinal, events);
        Ok(())
    }

    /// Destroys an internal stream once its work has drained. A handle this device did
    /// not make is ignored (GPU backends) or counted as an invalid release (`cpu`).
    fn destroy_internal_stream(&self, stream: InternalStream);

    /// Enqueues a host → device copy on an internal stream.
    ///
    /// # Errors
    /// Invalid stream or addresses.
    ///
    /// # Safety
    /// `source` is pinned host memory readable for `len_bytes` until the copy completes;
    /// `target..target+len_bytes` is device memory the caller may write.
    unsafe fn copy_to_device_async(
        &self,
        stream: &InternalStream,
        target: u64,
        source: *const u8,
        len_bytes: usize,
    ) -> Result<(), DeviceError>;

    /// Enqueues a device → host copy on an internal stream.
    ///
    /// # Errors
    /// Invalid stream or addresses.
    ///
    /// # Safety
    /// `target` is pinned host memory writable for `len_bytes` until the copy completes;
    /// `source..source+len_bytes` is device memory.
    unsafe fn copy_from_device_async(
        &self,
        stream: &InternalStream,
        target: *mut u8,
        source: u64,
        len_bytes: usize,
    ) -> Result<(), DeviceError>;

    /// Enqueues on an internal stream: store `value` to the 32-bit word at `word_device_addr`
    /// once the stream's earlier work has completed.
    ///
    /// # Errors
    /// Not supported (see [`DeviceInfo::supports_stream_memops`]) or the backend failed.
    ///
    /// # Safety
    /// `word_device_addr` is the device address of a live, 4-byte-aligned pinned word.
    unsafe fn write_value32_internal(
        &self,
        stream: &InternalStream,
        word_device_addr: u64,
        value: u32,
    ) -> Result<(), DeviceError>;

    /// Blocks until every op enqueued on the internal stream has completed. For teardown
    /// and synchronous fallbacks only; never called on an executor's hot path.
    ///
    /// # Errors
    /// An asynchronous error of the stream's work.
    fn synchronize_internal(&self, stream: &InternalStream) -> Result<(), DeviceError>;

    /// Whether [`DeviceCopies::copy_now`] works: the engine then moves small synchronous
    /// requests on the caller's thread instead of handing them to an executor.
    fn copies_on_caller_thread(&self) -> bool {
        false
    }

    /// The count of async ops alive in *every* driver of the process on this backend,
    /// where their waits hold streams that a [`DeviceCopies::copy_now`] of another driver
    /// could queue behind (CUDA: the application's primary contexts are the process's).
    /// `None`: only the engine's own ops can hold the streams its copies could meet (the
    /// cpu device: each instance has streams of its own).
    fn process_async_ops(&self) -> Option<&'static core::sync::atomic::AtomicUsize> {
        None
    }

    /// Copies `len_bytes` between pinned host memory and device memory of
    /// `device_ordinal` and returns once the copy is complete: host → device for
    /// [`Direction::Read`], device → host for [`Direction::Write`]. Runs on the calling
    /// thread, an application thread: on a library-owned stream that does not wait for the
    /// application's streams, leaving the thread's current device or context as it was.
    /// `ops_may_hold_streams`: an async op of this process may hold an application stream
    /// on a wait-value right now; the copy must then take a path that no held application
    /// stream can stall (CUDA: short host → device copies through a scratch of ours).
    ///
    /// # Errors
    /// Not supported ([`DeviceCopies::copies_on_caller_thread`] is `false`), invalid
    /// addresses, or the backend failed.
    ///
    /// # Safety
    /// `host` is pinned memory of `len_bytes`, readable (reads) or writable (writes) for
    /// the call; the device range is memory the caller may read or write.
    unsafe fn copy_now(
        &self,
        device_ordinal: u32,
        direction: Direction,
        device_addr: u64,
        host: *mut u8,
        len_bytes: usize,
        ops_may_hold_streams: bool,
    ) -> Result<(), DeviceError> {
        let _ = (device_ordinal, direction, device_addr, host, len_bytes, ops_may_hold_streams);
        Err(DeviceError::new(DeviceError::HIP_ERROR_NOT_SUPPORTED, "copy_now"))
    }

    /// Allocates `len_bytes` of the engine's own device memory on `device_ordinal`
    /// (`HIPFILE_STREAM_COPY_SLOTS=device`): on CUDA in the engine's context, so that
    /// copies into it never wait for the application's streams or for a call of the
    /// application waiting for them. Copies on internal streams write it like any device
    /// memory; [`StreamMemoryOps::copy_device_on_stream`] reads it from a user stream.
    ///
    /// # Errors
    /// Not supported by the backend, out of device memory, or the backend failed.
    fn alloc_engine_device(
        &self,
        device_ordinal: u32,
        len_bytes: usize,
    ) -> Result<u64, DeviceError> {
        let _ = (device_ordinal, len_bytes);
        Err(DeviceError::new(DeviceError::HIP_ERROR_NOT_SUPPORTED, "engine device memory"))
    }

    /// Frees memory from [`DeviceCopies::alloc_engine_device`].
    ///
    /// # Safety
    /// `addr` came from `alloc_engine_device` on `device_ordinal`, is freed once, and no
    /// enqueued copy still uses it.
    unsafe fn free_engine_device(&self, device_ordinal: u32, addr: u64) {
        let _ = (device_ordinal, addr);
    }

    /// Copies `len_bytes` device → device on `device_ordinal` on a stream of the engine's
    /// and returns once the copy is complete (the rare fills of a device slot from the
    /// destination: a read that came back short).
    ///
    /// # Errors
    /// Not supported, invalid addresses, or the backend failed.
    ///
    /// # Safety
    /// Both ranges are device memory of `device_ordinal` the caller may read (source) or
    /// write (target) for the call.
    unsafe fn copy_device_now(
        &self,
        device_ordinal: u32,
        target: u64,
        source: u64,
        len_bytes: usize,
    ) -> Result<(), DeviceError> {
        let _ = (device_ordinal, target, source, len_bytes);
        Err(DeviceError::new(DeviceError::HIP_ERROR_NOT_SUPPORTED, "copy_device_now"))
    }
}

/// Events recorded on internal streams, polled for completion.
pub trait DeviceEvents {
    /// Records an event on an internal stream: complete once all work enqueued before it is.
    ///
    /// # Errors
    /// Invalid stream, or the backend failed.
    fn record_event(&self, stream: &InternalStream) -> Result<EventHandle, DeviceError>;

    /// Non-blocking: `Ok(true)` once the event's work is complete. Events recorded on one
    /// internal stream complete in the order they were recorded (the engine's executors
    /// rely on it to ask about the oldest pending one only).
    ///
    /// # Errors
    /// Invalid event, or an asynchronous error of the work before it.
    fn event_done(&self, event: &EventHandle) -> Result<bool, DeviceError>;

    /// Releases an event (complete or not: it is released once complete). A handle this
    /// device did not make is ignored (GPU backends) or counted as an invalid release
    /// (`cpu`).
    fn destroy_event(&self, event: EventHandle);
}

/// Work the library enqueues on the *application's* streams: host functions and 32-bit
/// stream memory operations (the release protocol), plus synchronizing and querying them.
pub trait StreamMemoryOps {
    /// Enqueues a host function on a user stream: it runs after the stream's earlier work,
    /// and later work waits for it to return. It must not call device APIs.
    ///
    /// # Errors
    /// Unknown stream, or the backend failed.
    ///
    /// # Safety
    /// `user_data` stays valid until `func` has run; `func` is sound to call with it on
    /// another thread.
    unsafe fn launch_host_func(
        &self,
        stream: StreamHandle,
        func: HostFn,
        user_data: *mut c_void,
    ) -> Result<(), DeviceError>;

    /// Enqueues on a user stream: later work waits until the 32-bit word at
    /// `word_device_addr` is `>= value` in the cyclic sense of `CU_STREAM_WAIT_VALUE_GEQ`:
    /// `(word - value) as i32 >= 0`, so monotonically increasing counters may wrap.
    ///
    /// # Errors
    /// Not supported, unknown stream, or the backend failed.
    ///
    /// # Safety
    /// The word stays allocated until the wait has been satisfied.
    unsafe fn stream_wait_value32(
        &self,
        stream: StreamHandle,
        word_device_addr: u64,
        value: u32,
    ) -> Result<(), DeviceError>;

    /// Enqueues on a user stream: store `value` to the word once earlier work is done.
    ///
    /// # Errors
    /// Not supported, unknown stream, or the backend failed.
    ///
    /// # Safety
    /// The word stays allocated until the write has happened.
    unsafe fn stream_write_value32(
        &self,
        stream: StreamHandle,
        word_device_addr: u64,
        value: u32,
    ) -> Result<(), DeviceError>;

    /// Enqueues on a user stream "store `write_value` to the word at `write_addr`" and
    /// then "wait until the word at `wait_addr` is `>= wait_value`" (as
    /// [`StreamMemoryOps::stream_write_value32`] then [`StreamMemoryOps::stream_wait_value32`]). A backend
    /// that can enqueue both in one call overrides it (CUDA: `cuStreamBatchMemOp`, one
    /// driver call instead of two on every async submission).
    ///
    /// # Errors
    /// [`WriteThenWaitError::NothingQueued`] when neither was enqueued;
    /// [`WriteThenWaitError::WaitNotQueued`] when the write was and the wait was not.
    ///
    /// # Safety
    /// As [`StreamMemoryOps::stream_write_value32`] and [`StreamMemoryOps::stream_wait_value32`].
    unsafe fn stream_write_then_wait_value32(
        &self,
        stream: StreamHandle,
        write_addr: u64,
        write_value: u32,
        wait_addr: u64,
        wait_value: u32,
    ) -> Result<(), WriteThenWaitError> {
        // SAFETY: the caller's contract.
        unsafe {
            write_then_wait_one_by_one(self, stream, write_addr, write_value, wait_addr, wait_value)
        }
    }

    /// Whether [`StreamMemoryOps::copy_on_stream`] is supported: async ops may then copy
    /// through pinned slots on the user's own stream (`HIPFILE_STREAM_COPIES`).
    fn copies_on_user_streams(&self) -> bool {
        false
    }

    /// Whether the engine's own copies into the application's memory can be held up by the
    /// application's streams (CUDA: while an application thread's `cuStreamCreate` waits
    /// for streams our ops hold, README "Known limits"). Where they can, async ops copy on
    /// the user's own stream unless `HIPFILE_STREAM_COPIES` says otherwise.
    fn engine_copies_can_wait_for_user_streams(&self) -> bool {
        false
    }

    /// Whether read slots of engine device memory beat pinned ones here (a device →
    /// device copy cheaper than a second pass over host memory): the default of
    /// `HIPFILE_STREAM_COPY_SLOTS`.
    fn prefers_device_slots(&self) -> bool {
        false
    }

    /// Enqueues on a user stream a copy of `len_bytes` between pinned host memory at
    /// `host` and the device address `device_addr`: host → device for
    /// [`Direction::Read`], device → host for `Write`; run
    /// when the stream reaches it, in stream order.
    ///
    /// # Errors
    /// Not supported, unknown stream, invalid addresses, or the backend failed.
    ///
    /// # Safety
    /// `host` is memory from [`HostMemory::alloc_pinned`] of this device that stays
    /// allocated until the copy has run (and, for a read, holds the bytes by then); the
    /// device range is memory the application asked to be written (read) or read (write).
    unsafe fn copy_on_stream(
        &self,
        stream: StreamHandle,
        direction: hipfile_core::Direction,
        device_addr: u64,
        host: *mut u8,
        len_bytes: usize,
    ) -> Result<(), DeviceError> {
        let _ = (stream, direction, device_addr, host, len_bytes);
        Err(DeviceError::new(DeviceError::HIP_ERROR_NOT_SUPPORTED, "copies on user streams"))
    }

    /// Enqueues on a user stream a device → device copy of `len_bytes` from `source` (the
    /// engine's device memory, [`DeviceCopies::alloc_engine_device`]) to `target` (memory
    /// of the application), run when the stream reaches it, in stream order.
    ///
    /// # Errors
    /// Not supported, unknown stream, invalid addresses, or the backend failed.
    ///
    /// # Safety
    /// `source` stays allocated until the copy has run and holds the bytes by then; the
    /// target range is memory the application asked to be written.
    unsafe fn copy_device_on_stream(
        &self,
        stream: StreamHandle,
        target: u64,
        source: u64,
        len_bytes: usize,
    ) -> Result<(), DeviceError> {
        let _ = (stream, target, source, len_bytes);
        Err(DeviceError::new(DeviceError::HIP_ERROR_NOT_SUPPORTED, "device copies on user streams"))
    }

    /// Blocks until every op enqueued on a user stream has completed (tests, tools,
    /// NULL-stream synchronous calls).
    ///
    /// # Errors
    /// Unknown stream, or an asynchronous error.
    fn synchronize_stream(&self, stream: StreamHandle) -> Result<(), DeviceError>;

    /// Non-blocking: `Ok(true)` once every op enqueued on a user stream so far has
    /// completed (`cuStreamQuery` / `hipStreamQuery`).
    ///
    /// # Errors
    /// Unknown stream, or an asynchronous error.
    fn stream_done(&self, stream: StreamHandle) -> Result<bool, DeviceError>;

    /// Whether work enqueued on a user stream also waits for the NULL stream's earlier
    /// work: a *blocking* stream under the legacy default stream's rules (CUDA's and HIP's
    /// streams made without the non-blocking flag). The default: no such rule (the cpu
    /// device's NULL stream is a stream like any other).
    ///
    /// # Errors
    /// Unknown stream (callers then assume it does).
    fn stream_follows_null_stream(&self, _stream: StreamHandle) -> Result<bool, DeviceError> {
        Ok(false)
    }

    /// Non-blocking: `Ok(true)` once the NULL stream that work enqueued on `stream` would
    /// wait for (the legacy NULL stream of `stream`'s own context, on CUDA) has completed
    /// its work. Asked only for streams that follow the NULL stream. Default: the NULL
    /// stream as [`StreamMemoryOps::stream_done`] sees it.
    ///
    /// # Errors
    /// Unknown stream, or an asynchronous error.
    fn null_stream_done_for(&self, _stream: StreamHandle) -> Result<bool, DeviceError> {
        self.stream_done(StreamHandle::NULL)
    }
}
