//! The `cuda` device: NVIDIA GPUs through the CUDA driver API, loaded at run time.
//!
//! HIP on the NVIDIA platform makes `hipStream_t` a `CUstream` and device pointers
//! `CUdeviceptr`s, so the C API's values pass straight through.
//!
//! **Isolation.** Every copy, event and device-side release of the engine runs in an
//! *engine context*: a CUDA context hipFile creates itself per device (`cuCtxCreate`,
//! not the primary context the application's streams live in). CUDA maps a context's
//! streams round-robin onto its `CUDA_DEVICE_MAX_CONNECTIONS` hardware queues, and a user
//! stream held on an op's wait-value blocks whatever shares its queue; the engine's
//! streams belong to another context, so they never share a queue with an application
//! stream, and a user stream's release never waits behind one. Measured on the H200: a
//! copy from the engine context into memory the application allocated in the primary
//! context is correct and as fast (54.6 GB/s), and it completes while 24 of the
//! application's streams are held. Executor threads keep the engine context current
//! (cached per thread); any other thread (a caller's sync read, driver set-up) pushes it
//! for the call and pops it again, so the application's current context never changes.
//!
//! Pinned staging is device-mapped and portable (usable from both contexts); copies run
//! on per-executor non-blocking streams; completion is polled with `cuEventQuery` (never
//! a blocking call on an executor); the release word is waited on with
//! `cuStreamWaitValue32` (GEQ) and written with `cuStreamWriteValue32`.
//!
//! CUDA's error numbers are reported as the `hipError_t` value directly (HIP's enum
//! mirrors CUDA's numbering for the errors these calls return).
//!
//! Layers: `sys` (the driver's types and entry points, `dlopen`ed), `result` (one function
//! per driver call, `CUresult` mapped to [`DeviceError`]), the device. The contexts are
//! CUDA's alone (HIP has none): which context a call runs in — the engine context, a
//! primary one, or the caller's — is decided in `contexts`.
//!
//! This file holds the device object: its handles' entries, opening the backend (the
//! primary contexts, the hardware-queue setting), drop, and [`GpuBackend`]. The rest by
//! job: `contexts.rs` (the engine context, the primary ones, which is current on which
//! thread), `hardware_queues.rs` (`CUDA_DEVICE_MAX_CONNECTIONS`), `info.rs`
//! ([`DeviceInfo`](super::DeviceInfo)), `memory.rs` ([`HostMemory`](super::HostMemory):
//! pinned staging and registrations), `copies.rs` ([`DeviceCopies`](super::DeviceCopies):
//! internal streams, the caller-thread stream pools, the device scratch and when a copy
//! is bounced through it), `device_memory.rs` (the engine's device memory: mapped, or
//! `cuMemAlloc` in the engine context), `events.rs` ([`DeviceEvents`](super::DeviceEvents), pooled
//! through the shared `gpu::OwnedHandles`), `stream_ops.rs`
//! ([`StreamMemoryOps`](super::StreamMemoryOps) on the application's streams) and
//! `user.rs` ([`UserDevice`](super::user::UserDevice)).

mod contexts;
mod copies;
mod device_memory;
mod events;
mod hardware_queues;
mod info;
mod memory;
mod result;
mod stream_ops;
mod sys;
mod user;

use std::ffi::c_int;
use std::sync::{Arc, Mutex};

use sys::*;

use super::DeviceError;
use super::gpu::{DeviceEntry, GpuBackend, OwnedHandles};

use contexts::EngineContext;
use copies::{CallerCopy, min_copy_bytes_from_environment};
use hardware_queues::{HardwareQueues, MAX_CONNECTIONS_VARIABLE, set_max_connections};

/// An internal stream and the device it belongs to (boxed; an `InternalStream` of this
/// device holds the box's address; see `GpuBackend::on_stream`).
pub(crate) struct InternalEntry {
    stream: CUstream,
    ordinal: u32,
    /// Device scratch of [`CudaDevice::scratch_bytes`] for host → device copies into the
    /// application's memory (made on first use in the engine context).
    scratch: std::sync::OnceLock<CUdeviceptr>,
}

/// An event and its device (boxed behind an `EventHandle` of this device by
/// [`OwnedHandles`]).
pub(crate) struct EventEntry {
    event: CUevent,
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

/// NVIDIA GPUs through the CUDA driver API.
pub(crate) struct CudaDevice {
    api: Api,
    /// The boxes behind this object's `InternalStream` and `EventHandle` values (owner
    /// checked) and the idle events per device (made in the engine context).
    handles: OwnedHandles<InternalEntry, EventEntry>,
    /// Primary contexts (retained): the application's streams and memory live here.
    contexts: Vec<usize>,
    /// Engine contexts, made on first use (`contexts::ENGINE_CONTEXTS`).
    engine_contexts: Vec<std::sync::OnceLock<EngineContext>>,
    memops: Vec<bool>,
    /// Per device: non-blocking streams of the engine context for
    /// [`DeviceCopies::copy_now`](super::DeviceCopies::copy_now) on callers' threads,
    /// reused; like the event pools, kept for the process.
    caller_streams: Vec<Mutex<Vec<InternalEntry>>>,
    /// The same, streams of the primary context ([`CallerCopy::Auto`]).
    caller_primary_streams: Vec<Mutex<Vec<InternalEntry>>>,
    hardware_queues: HardwareQueues,
    /// Host → device copies of the engine context into the application's memory shorter
    /// than this go through a device scratch of the engine context: the bytes into the
    /// scratch, then a device → device copy (`HIPFILE_CUDA_MIN_COPY_BYTES`; default: every
    /// copy, 0 = none). Measured on the H200 (`benches/results/h200-threads-copy-probe.txt`):
    /// host → device copies from the engine context into memory of the primary context
    /// run one at a time across threads (about 100 k copies/s from 1, 8 or 14 threads,
    /// 4 KiB or 64 KiB), while copies into the engine's own memory and device → device
    /// copies into the application's scale as the primary context's do (4 KiB, 8
    /// threads: 300 k/s bounced against 98 k/s direct); copies of 16 KiB and less did
    /// not run at all while every hardware queue of the application was held.
    min_copy_bytes: usize,
    /// Where [`DeviceCopies::copy_now`](super::DeviceCopies::copy_now) runs.
    caller_copy: CallerCopy,
    /// Pinned host memory is allocated and registered in the engine context
    /// (`HIPFILE_CUDA_STAGING_CONTEXT=engine`, diagnostic) instead of the primary one.
    staging_in_engine_context: bool,
    /// How the engine's device memory is allocated (`HIPFILE_CUDA_ENGINE_MEMORY`).
    engine_memory: device_memory::EngineMemory,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice").field("devices", &self.contexts.len()).finish()
    }
}

impl Drop for CudaDevice {
    /// Frees the caller-thread streams and their scratches (idle: a copy holds its entry
    /// only during a call, and no call outlives the device), then destroys the pooled
    /// events in the engine context they were created in (engine contexts live for the
    /// process, so it is alive; events still behind a handle are the holder's).
    fn drop(&mut self) {
        for (ordinal, pool) in self.caller_streams.iter().enumerate() {
            let entries = std::mem::take(&mut *pool.lock().unwrap_or_else(|p| p.into_inner()));
            for entry in entries {
                let _ = self.in_engine_context(ordinal as u32, || self.destroy_entry(&entry));
            }
        }
        for (ordinal, pool) in self.caller_primary_streams.iter().enumerate() {
            let entries = std::mem::take(&mut *pool.lock().unwrap_or_else(|p| p.into_inner()));
            for entry in entries {
                // SAFETY: a primary context we retained and still hold.
                let _ = unsafe {
                    self.with_pushed(self.contexts[ordinal], || self.destroy_entry(&entry))
                };
            }
        }
        for (ordinal, events) in self.handles.drain_event_pools() {
            // The context the events were made in (`record_event_in_context`); never made
            // (no event then either) means nothing to destroy, and none is made now.
            if self.engine_contexts[ordinal as usize].get().is_none() {
                continue;
            }
            let _ = self.in_engine_context(ordinal, || {
                for entry in &events {
                    // SAFETY: an idle pooled event of ours, no handle names it; destroyed once.
                    let _ = unsafe { result::event_destroy(&self.api, entry.event) };
                }
                Ok(())
            });
        }
    }
}

// SAFETY: CUDA driver handles (contexts, streams, events) may be used from any thread;
// the pools are behind mutexes.
unsafe impl Send for CudaDevice {}
// SAFETY: as above.
unsafe impl Sync for CudaDevice {}

impl CudaDevice {
    /// Loads libcuda, initialises it and retains every device's primary context.
    ///
    /// # Errors
    /// libcuda is missing (a clear message, never a panic), `cuInit` fails, or there is
    /// no device.
    pub(crate) fn open() -> Result<Arc<CudaDevice>, String> {
        let api = Api::load()?;
        // CUDA reads CUDA_DEVICE_MAX_CONNECTIONS in cuInit (measured on the H200: set
        // after cuInit, even before any context exists, it has no effect). Before cuInit
        // every call but a few answers CUDA_ERROR_NOT_INITIALIZED, which tells whether the
        // application started CUDA already.
        let started = result::initialized(&api);
        let hardware_queues = match std::env::var(MAX_CONNECTIONS_VARIABLE) {
            Ok(value) => HardwareQueues::FromEnvironment(value),
            Err(_) if !started => set_max_connections(),
            Err(_) => HardwareQueues::CudaStartedFirst,
        };
        result::init(&api).map_err(|e| format!("cuInit: {e}"))?;
        let count = result::device_get_count(&api)?;
        if count <= 0 {
            return Err("the CUDA driver found no device".into());
        }
        let mut contexts = Vec::new();
        let mut memops = Vec::new();
        for ordinal in 0..count {
            let (context, supports) = retain_primary(&api, ordinal)?;
            contexts.push(context as usize);
            memops.push(supports);
        }
        let caller_streams = (0..count).map(|_| Mutex::new(Vec::new())).collect();
        let caller_primary_streams = (0..count).map(|_| Mutex::new(Vec::new())).collect();
        Ok(Arc::new(CudaDevice {
            api,
            handles: OwnedHandles::new(count as usize),
            engine_contexts: (0..count).map(|_| std::sync::OnceLock::new()).collect(),
            contexts,
            memops,
            caller_streams,
            caller_primary_streams,
            hardware_queues,
            min_copy_bytes: min_copy_bytes_from_environment(),
            caller_copy: CallerCopy::from_environment(),
            staging_in_engine_context: std::env::var("HIPFILE_CUDA_STAGING_CONTEXT")
                .is_ok_and(|value| value.trim() == "engine"),
            engine_memory: device_memory::EngineMemory::from_environment(),
        }))
    }
}

/// Retains device `ordinal`'s primary context (ordinal < count); whether the device
/// supports 32-bit stream memory operations.
fn retain_primary(api: &Api, ordinal: c_int) -> Result<(CUcontext, bool), String> {
    let device = result::device_get(api, ordinal)?;
    let context = result::device_primary_ctx_retain(api, device)?;
    let version = result::driver_get_version(api)?;
    // CUDA 12+ supports 32-bit stream memory operations on every device; older drivers
    // report it per device (asked either way).
    let attribute =
        result::device_get_attribute(api, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1, device);
    let supports = version >= 12000 || attribute.is_some_and(|value| value != 0);
    Ok((context, supports))
}

impl GpuBackend for CudaDevice {
    type Stream = InternalEntry;
    type Event = EventEntry;

    fn handles(&self) -> &OwnedHandles<InternalEntry, EventEntry> {
        &self.handles
    }

    /// The device's engine context ([`CudaDevice::in_engine_context`]).
    fn in_device<R>(
        &self,
        ordinal: u32,
        work: impl FnOnce() -> Result<R, DeviceError>,
    ) -> Result<R, DeviceError> {
        self.in_engine_context(ordinal, work)
    }
}
