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
//! per driver call, `CUresult` mapped to [`DeviceError`]), this file (the device: contexts,
//! the caller-thread stream pools and device scratch, event pooling through the shared
//! `gpu::OwnedHandles`). The contexts are CUDA's alone (HIP has none): which context a call
//! runs in — the engine context, a primary one, or the caller's — is decided here.

mod result;
mod sys;

use std::cell::Cell;
use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex};

use hipfile_core::Direction;

use sys::*;

use super::gpu::{DeviceEntry, GpuBackend, OwnedHandles};
use super::user::UserDevice;
use super::{
    DeviceCopies, DeviceError, DeviceEvents, DeviceInfo, DeviceKind, EventHandle, HostFn,
    HostMemory, InternalStream, MemoryType, PinnedRegion, PointerInfo, StreamHandle,
    StreamMemoryOps, WriteThenWaitError,
};

/// The largest device scratch of an engine stream: a host → device copy through it longer
/// than this moves in scratch-sized pieces (in stream order, so one scratch serves them).
const MAX_SCRATCH_BYTES: usize = 1 << 20;

/// Where [`DeviceCopies::copy_now`] runs a caller-thread copy (`HIPFILE_CUDA_CALLER_COPY`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CallerCopy {
    /// The default. While no async op of the process may hold an application stream, on
    /// a pooled stream of the *primary* context, as the application's own `cudaMemcpy`
    /// would: no op of ours can then wait on it, and there it scales with threads (on the
    /// H200, 4 KiB copies + waits from 8 threads: 530 k/s in the primary context against
    /// 98 k/s from the engine context into the application's memory,
    /// `benches/results/h200-threads-copy-probe.txt`). Otherwise in the engine context
    /// through the stream's scratch, so a sync read never waits behind a stream an op of
    /// ours holds.
    Auto,
    /// Always in the engine context through the scratch: a one-chunk sync read also
    /// completes while the application holds every hardware queue of its context on
    /// waits of its own (about 5 µs more per copy, 300 k/s from 8 threads).
    Engine,
}

impl CallerCopy {
    /// The mode `HIPFILE_CUDA_CALLER_COPY` selects (`auto`, the default, or `engine`).
    /// An unknown value warns and keeps the default.
    fn from_environment() -> CallerCopy {
        match std::env::var("HIPFILE_CUDA_CALLER_COPY").as_deref().map(str::trim) {
            Err(_) | Ok("" | "auto") => CallerCopy::Auto,
            Ok("engine") => CallerCopy::Engine,
            Ok(other) => {
                log::warn!("HIPFILE_CUDA_CALLER_COPY={other:?} is not auto or engine; using auto");
                CallerCopy::Auto
            }
        }
    }
}

/// `HIPFILE_CUDA_MIN_COPY_BYTES`: host → device copies of the engine context into the
/// application's memory shorter than this go through the stream's scratch; `all` (the
/// default) bounces every copy, 0 none. An unknown value warns and keeps the default.
fn min_copy_bytes_from_environment() -> usize {
    match std::env::var("HIPFILE_CUDA_MIN_COPY_BYTES").as_deref().map(str::trim) {
        Err(_) | Ok("" | "all") => usize::MAX,
        Ok(value) => value.parse().unwrap_or_else(|_| {
            log::warn!(
                "HIPFILE_CUDA_MIN_COPY_BYTES={value:?} is not a byte count or all; using all"
            );
            usize::MAX
        }),
    }
}

/// An internal stream and the device it belongs to (boxed; an `InternalStream` of this
/// device holds the box's address; see [`CudaDevice::internal`]).
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

/// The context engine work of one device runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct EngineContext {
    /// The `CUcontext` as `usize`.
    context: usize,
    /// `true`: a context of hipFile's own; `false`: `cuCtxCreate` failed and the engine
    /// shares the primary context (the pre-isolation behaviour, with its hang risk).
    isolated: bool,
}

/// Engine contexts per device ordinal, made on first use and kept for the process (as
/// the retained primary contexts are): every `CudaDevice` of the process shares them, so
/// opening the backend again costs no new context.
static ENGINE_CONTEXTS: Mutex<Vec<Option<EngineContext>>> = Mutex::new(Vec::new());

/// NVIDIA GPUs through the CUDA driver API.
pub(crate) struct CudaDevice {
    api: Api,
    /// The boxes behind this object's `InternalStream` and `EventHandle` values (owner
    /// checked) and the idle events per device (made in the engine context).
    handles: OwnedHandles<InternalEntry, EventEntry>,
    /// Primary contexts (retained): the application's streams and memory live here.
    contexts: Vec<usize>,
    /// Engine contexts, made on first use ([`ENGINE_CONTEXTS`]).
    engine_contexts: Vec<std::sync::OnceLock<EngineContext>>,
    memops: Vec<bool>,
    /// Per device: non-blocking streams of the engine context for [`DeviceCopies::copy_now`] on
    /// callers' threads, reused; like the event pools, kept for the process.
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
    /// Where [`DeviceCopies::copy_now`] runs.
    caller_copy: CallerCopy,
    /// Pinned host memory is allocated and registered in the engine context
    /// (`HIPFILE_CUDA_STAGING_CONTEXT=engine`, diagnostic) instead of the primary one.
    staging_in_engine_context: bool,
}

/// The CUDA variable that sets how many hardware queues a context's streams share.
const MAX_CONNECTIONS_VARIABLE: &str = "CUDA_DEVICE_MAX_CONNECTIONS";
/// CUDA's largest (and our) `CUDA_DEVICE_MAX_CONNECTIONS`; its default is 8.
const MAX_CONNECTIONS: &str = "32";

/// How many hardware queues the streams of a context share, and who decided.
///
/// CUDA maps a context's streams onto `CUDA_DEVICE_MAX_CONNECTIONS` hardware queues,
/// round-robin in creation order, and a stream blocked on a wait-value blocks the work
/// queued after it on its queue. The engine's copies run in a context of their own, so
/// this can no longer stall them; among the application's own streams, a stream held on
/// an async op still delays the streams that share its queue until the op completes (it
/// always completes). 32 queues make that sharing rarer, so hipFile sets the variable
/// when it starts CUDA itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HardwareQueues {
    /// The application set `CUDA_DEVICE_MAX_CONNECTIONS` (its value).
    FromEnvironment(String),
    /// hipFile set it to 32 before CUDA started (`cuInit`).
    SetByHipfile,
    /// CUDA started (`cuInit`) before hipFile, with the variable unset: 8 queues.
    CudaStartedFirst,
}

impl HardwareQueues {
    /// One line for `hipfile-bench check` and reports.
    pub(crate) fn describe(&self) -> String {
        match self {
            HardwareQueues::FromEnvironment(value) => {
                format!("{MAX_CONNECTIONS_VARIABLE}={value} (set by the application)")
            }
            HardwareQueues::SetByHipfile => format!(
                "{MAX_CONNECTIONS_VARIABLE}={MAX_CONNECTIONS} (set by hipFile before CUDA \
                 started; set the variable yourself to choose)"
            ),
            HardwareQueues::CudaStartedFirst => format!(
                "{MAX_CONNECTIONS_VARIABLE} unset when CUDA started: the application's \
                 streams share 8 hardware queues, so a stream held on an async op delays \
                 the others on its queue until the op completes"
            ),
        }
    }
}

/// Sets `CUDA_DEVICE_MAX_CONNECTIONS=32` for the contexts CUDA has yet to create.
fn set_max_connections() -> HardwareQueues {
    // SAFETY: setenv races with a concurrent getenv or setenv on another thread. hipFile
    // calls this once, while opening its driver (an application's start-up), only when
    // the variable is unset and CUDA, which reads it in cuInit, has not started. An
    // application that cannot allow this sets the variable itself.
    unsafe { std::env::set_var(MAX_CONNECTIONS_VARIABLE, MAX_CONNECTIONS) };
    HardwareQueues::SetByHipfile
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

thread_local! {
    /// The context this thread made current through us (executor threads only).
    static CURRENT_CONTEXT: Cell<usize> = const { Cell::new(0) };
    /// Whether this thread is an engine executor (decided once per thread).
    static ENGINE_THREAD: Cell<Option<bool>> = const { Cell::new(None) };
}

/// Whether the calling thread is one of the engine's executors, which may keep the
/// engine context current; every other thread belongs to the application.
fn on_engine_thread() -> bool {
    ENGINE_THREAD.with(|cached| match cached.get() {
        Some(answer) => answer,
        None => {
            let answer = crate::executor_thread::on_executor_thread();
            cached.set(Some(answer));
            answer
        }
    })
}

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
        }))
    }

    /// Makes device `ordinal`'s primary context current on this thread (cached).
    fn make_current(&self, ordinal: u32) -> Result<(), DeviceError> {
        let context = *self
            .contexts
            .get(ordinal as usize)
            .ok_or(DeviceError::new(DeviceError::HIP_ERROR_INVALID_DEVICE, "no such device"))?;
        if CURRENT_CONTEXT.get() == context {
            return Ok(());
        }
        // SAFETY: `context` is a primary context we retained.
        unsafe { result::ctx_set_current(&self.api, context as CUcontext) }?;
        CURRENT_CONTEXT.set(context);
        Ok(())
    }

    /// Device `ordinal`'s engine context, made on first use (process-wide).
    fn engine_context(&self, ordinal: u32) -> Result<EngineContext, DeviceError> {
        let slot = self
            .engine_contexts
            .get(ordinal as usize)
            .ok_or(DeviceError::new(DeviceError::HIP_ERROR_INVALID_DEVICE, "no such device"))?;
        if let Some(context) = slot.get() {
            return Ok(*context);
        }
        let mut made = ENGINE_CONTEXTS.lock().unwrap_or_else(|p| p.into_inner());
        if made.len() <= ordinal as usize {
            made.resize(ordinal as usize + 1, None);
        }
        let context = match made[ordinal as usize] {
            Some(context) => context,
            None => {
                let context = self.create_engine_context(ordinal);
                made[ordinal as usize] = Some(context);
                context
            }
        };
        Ok(*slot.get_or_init(|| context))
    }

    /// Creates device `ordinal`'s engine context and takes it off this thread's context
    /// stack again (`cuCtxCreate` pushes it). Without `cuCtxCreate` (an old or unusual
    /// driver, or a device in a compute mode that refuses a second context) the engine
    /// shares the primary context, and a warning says what that risks.
    fn create_engine_context(&self, ordinal: u32) -> EngineContext {
        let primary = EngineContext { context: self.contexts[ordinal as usize], isolated: false };
        let failed = |why: String| {
            log::warn!(
                "no engine context on CUDA device {ordinal} ({why}); the \
                 engine shares the application's primary context, where a stream held on \
                 an async op can stall the engine's copies"
            );
            primary
        };
        if std::env::var("HIPFILE_CUDA_ENGINE_CONTEXT").is_ok_and(|value| value.trim() == "shared")
        {
            // A diagnostic setting (README, configuration): measures what isolation costs
            // in one binary; it brings the hang risk back, so it says so once.
            return failed("HIPFILE_CUDA_ENGINE_CONTEXT=shared".into());
        }
        if self.api.cuCtxCreate_v2.is_none() {
            return failed("the driver lacks cuCtxCreate_v2".into());
        }
        // ordinal < device count (engine_contexts' length).
        let device = match result::device_get(&self.api, ordinal as c_int) {
            Ok(device) => device,
            Err(error) => return failed(error),
        };
        let context = match result::ctx_create(&self.api, device) {
            Ok(context) => context,
            Err(error) => return failed(error),
        };
        // SAFETY: cuCtxCreate pushed `context` on this thread's stack; pop it so the
        // thread's current context is what it was.
        let _ = unsafe { result::ctx_pop_current_status(&self.api) };
        CURRENT_CONTEXT.set(0);
        EngineContext { context: context as usize, isolated: true }
    }

    /// Runs `work` with device `ordinal`'s engine context current. An executor thread
    /// keeps it current (cached); on any other thread it is pushed for the call and
    /// popped after, so the caller's current context is left as it was.
    fn in_engine_context<R>(
        &self,
        ordinal: u32,
        work: impl FnOnce() -> Result<R, DeviceError>,
    ) -> Result<R, DeviceError> {
        let context = self.engine_context(ordinal)?.context;
        if on_engine_thread() {
            if CURRENT_CONTEXT.get() != context {
                // SAFETY: an engine context we created and never destroy.
                unsafe { result::ctx_set_current(&self.api, context as CUcontext) }?;
                CURRENT_CONTEXT.set(context);
            }
            return work();
        }
        // SAFETY: an engine context we created and never destroy.
        unsafe { self.with_pushed(context, work) }
    }

    /// Runs `work` with `context` pushed on this thread's context stack, popped after.
    ///
    /// # Safety
    /// `context` is a live context of ours (an engine context, or a primary context we
    /// retained) that stays alive for the call.
    unsafe fn with_pushed<R>(
        &self,
        context: usize,
        work: impl FnOnce() -> Result<R, DeviceError>,
    ) -> Result<R, DeviceError> {
        // SAFETY: the caller's contract.
        unsafe { result::ctx_push_current(&self.api, context as CUcontext) }?;
        let worked = work();
        // SAFETY: pops the context pushed above.
        let popped_code = unsafe { result::ctx_pop_current_status(&self.api) };
        worked.and_then(|value| {
            result::status(&self.api, popped_code, "cuCtxPopCurrent").map(|()| value)
        })
    }

    /// Runs `work` with the context that owns pinned host memory current, pushed for the
    /// call and popped after (so no thread's current context changes): device 0's
    /// primary context, or its engine context with `HIPFILE_CUDA_STAGING_CONTEXT=engine`.
    /// The memory is portable either way, but on the H200 a 4 KiB copy in the engine
    /// context took 9.6 µs from pinned memory allocated in the engine context and 7.0 µs
    /// from memory allocated in the primary context
    /// (`benches/results/h200-copy-now-probe.txt`).
    fn in_staging_context<R>(
        &self,
        work: impl FnOnce() -> Result<R, DeviceError>,
    ) -> Result<R, DeviceError> {
        if self.staging_in_engine_context {
            return self.in_engine_context(0, work);
        }
        let context = *self
            .contexts
            .first()
            .ok_or(DeviceError::new(DeviceError::HIP_ERROR_INVALID_DEVICE, "no device"))?;
        // SAFETY: a primary context we retained and never release.
        unsafe { self.with_pushed(context, work) }
    }

    /// Whether device `ordinal`'s engine work runs in a context of its own (for reports).
    pub(crate) fn engine_isolated(&self, ordinal: u32) -> bool {
        self.engine_context(ordinal).is_ok_and(|context| context.isolated)
    }

    /// Ensures some context is current (the caller's own, else device 0's primary).
    fn ensure_any_current(&self) -> Result<(), DeviceError> {
        let current = result::ctx_get_current(&self.api)?;
        if current.is_null() { self.make_current(0) } else { Ok(()) }
    }

    fn ordinal_of_context(&self, context: CUcontext) -> Result<u32, DeviceError> {
        if let Some(index) = self.contexts.iter().position(|&c| c == context as usize) {
            return Ok(index as u32);
        }
        // SAFETY: push/pop a context the user's stream belongs to, to ask its device.
        unsafe { result::ctx_push_current(&self.api, context) }?;
        // A context is current (just pushed).
        let (code, device) = result::ctx_get_device_status(&self.api);
        // SAFETY: pops what we pushed.
        let _ = unsafe { result::ctx_pop_current_status(&self.api) };
        CURRENT_CONTEXT.set(0);
        result::status(&self.api, code, "cuCtxGetDevice")?;
        Ok(device as u32)
    }

    /// [`DeviceCopies::copy_now`] with a context of device `ordinal` current (the engine
    /// context, or the primary one): a stream of `pool` (made in the current context when
    /// the pool is empty), the copy (host → device through the stream's scratch when
    /// `bounce`), a synchronize.
    ///
    /// # Safety
    /// As [`DeviceCopies::copy_now`]; `pool`'s streams belong to the current context.
    #[allow(clippy::too_many_arguments, reason = "the copy's fields, as DeviceCopies::copy_now")]
    unsafe fn copy_now_in_context(
        &self,
        pool: &Mutex<Vec<InternalEntry>>,
        ordinal: u32,
        direction: Direction,
        device_addr: u64,
        host: *mut u8,
        len_bytes: usize,
        bounce: bool,
    ) -> Result<(), DeviceError> {
        let pooled = pool.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let entry = match pooled {
            Some(entry) => entry,
            None => {
                // The context the pool belongs to is current.
                let stream = result::stream_create(&self.api, CU_STREAM_NON_BLOCKING)?;
                InternalEntry { stream, ordinal, scratch: Default::default() }
            }
        };
        let stream = entry.stream;
        let enqueued = match direction {
            // SAFETY: the caller's contract (pinned host memory, valid device range); the
            // stream's context is current; bounced only in the engine context.
            Direction::Read => unsafe {
                self.copy_host_to_device(&entry, device_addr, host.cast_const(), len_bytes, bounce)
            },
            // SAFETY: the caller's contract (pinned host memory, valid device range).
            Direction::Write => unsafe {
                result::memcpy_dtoh_async(&self.api, host, device_addr, len_bytes, stream)
            },
        };
        // SAFETY: our stream. Synchronized even after a failed enqueue, so that nothing
        // of ours still uses the host memory when we return.
        let synced = unsafe { result::stream_synchronize(&self.api, stream) };
        pool.lock().unwrap_or_else(|p| p.into_inner()).push(entry);
        enqueued.and(synced)
    }

    /// Destroys a stream of ours and frees its scratch, once the stream is idle; the
    /// stream's context is current.
    fn destroy_entry(&self, entry: &InternalEntry) -> Result<(), DeviceError> {
        if let Some(&scratch) = entry.scratch.get() {
            // SAFETY: our stream; once it is idle nothing uses its scratch.
            let _ = unsafe { result::stream_synchronize_status(&self.api, entry.stream) };
            // SAFETY: allocated in copy_through_scratch, freed once.
            let _ = unsafe { result::mem_free_status(&self.api, scratch) };
        }
        // SAFETY: our own stream, of the current context.
        unsafe { result::stream_destroy(&self.api, entry.stream) }
    }

    /// The device scratch of an engine stream, bytes: [`CudaDevice::min_copy_bytes`] up
    /// to [`MAX_SCRATCH_BYTES`].
    fn scratch_bytes(&self) -> usize {
        self.min_copy_bytes.min(MAX_SCRATCH_BYTES)
    }

    /// Enqueues a host → device copy on `entry`'s stream. With `bounce`, one shorter than
    /// [`CudaDevice::min_copy_bytes`] (by default every one) goes through the stream's
    /// device scratch when the engine has a context of its own: on the H200 a host →
    /// device copy from the engine context into the *application's* memory runs one at a
    /// time across threads, and one of 16 KiB or less did not run while every hardware
    /// queue of the application's context held a stream on a wait-value, while copies
    /// into the engine's own memory and device → device copies into the application's
    /// did neither (`benches/results/h200-threads-copy-probe.txt`,
    /// `benches/results/h200-small-copy-experiments.txt`,
    /// `benches/results/h200-copy-now-probe.txt`).
    ///
    /// # Safety
    /// `source..source + len_bytes` is pinned host memory that stays valid until the copy
    /// has run; the target range is valid device memory; the stream's context is current,
    /// and it is the engine context when `bounce`.
    unsafe fn copy_host_to_device(
        &self,
        entry: &InternalEntry,
        target: u64,
        source: *const u8,
        len_bytes: usize,
        bounce: bool,
    ) -> Result<(), DeviceError> {
        if bounce && len_bytes < self.min_copy_bytes && self.engine_isolated(entry.ordinal) {
            // SAFETY: the caller's contract.
            return unsafe { self.copy_through_scratch(entry, target, source, len_bytes) };
        }
        // SAFETY: the caller's contract.
        unsafe { result::memcpy_htod_async(&self.api, target, source, len_bytes, entry.stream) }
    }

    /// A host → device copy as copies into the stream's device scratch (memory of the
    /// engine context) and device → device copies from there to `target`, piece by
    /// piece of [`CudaDevice::scratch_bytes`] (stream order keeps a piece from
    /// overwriting the scratch before the previous one has left it).
    ///
    /// # Safety
    /// `source..source + len_bytes` is pinned host memory that stays valid until the copy
    /// has run; the target range is valid device memory; the engine context is current.
    unsafe fn copy_through_scratch(
        &self,
        entry: &InternalEntry,
        target: u64,
        source: *const u8,
        len_bytes: usize,
    ) -> Result<(), DeviceError> {
        let scratch_bytes = self.scratch_bytes();
        let scratch = match entry.scratch.get() {
            Some(&scratch) => scratch,
            None => {
                // The engine context is current.
                let scratch = result::mem_alloc(&self.api, scratch_bytes)?;
                *entry.scratch.get_or_init(|| scratch)
            }
        };
        let mut done = 0;
        while done < len_bytes {
            let piece = (len_bytes - done).min(scratch_bytes);
            // SAFETY: the source is pinned memory (caller) holding len_bytes > done; the
            // scratch holds scratch_bytes >= piece; the stream orders this after earlier
            // uses of the scratch.
            unsafe {
                result::memcpy_htod_async(&self.api, scratch, source.add(done), piece, entry.stream)
            }?;
            // SAFETY: the scratch bytes were just copied in (stream order); the target is
            // the caller's valid device range, which holds len_bytes > done.
            unsafe {
                result::memcpy_dtod_async(
                    &self.api,
                    target + done as u64,
                    scratch,
                    piece,
                    entry.stream,
                )
            }?;
            done += piece;
        }
        Ok(())
    }

    /// Records a pooled (or new) event on `entry`'s stream; the engine context is current.
    fn record_event_in_context(&self, entry: &InternalEntry) -> Result<EventHandle, DeviceError> {
        self.handles.record_event(
            entry.ordinal,
            || {
                let event = result::event_create(&self.api, CU_EVENT_DISABLE_TIMING)?;
                Ok(EventEntry { event, ordinal: entry.ordinal })
            },
            // SAFETY: event and stream belong to the same (current, engine) context.
            |event| unsafe { result::event_record(&self.api, event.event, entry.stream) },
            |event| self.destroy_event_entry(&event),
        )
    }

    /// Destroys an idle event the pool has no room for, in the engine context.
    fn destroy_event_entry(&self, entry: &EventEntry) {
        let _ = self.in_engine_context(entry.ordinal, || {
            // SAFETY: our event, destroyed once (CUDA defers the release if it is pending).
            unsafe { result::event_destroy(&self.api, entry.event) }
        });
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

impl DeviceInfo for CudaDevice {
    fn kind(&self) -> DeviceKind {
        DeviceKind::Cuda
    }

    fn device_count(&self) -> u32 {
        self.contexts.len() as u32
    }

    fn pointer_info(&self, ptr: u64) -> Result<PointerInfo, DeviceError> {
        self.ensure_any_current()?;
        let (memory_type, is_managed, ordinal, start, size) =
            result::pointer_get_attributes(&self.api, ptr)?;
        let known = memory_type != 0 || is_managed != 0;
        let memory_type = match (is_managed != 0, memory_type) {
            (true, _) => MemoryType::Managed,
            (false, CU_MEMORYTYPE_DEVICE) => MemoryType::Device,
            (false, CU_MEMORYTYPE_ARRAY) => MemoryType::Array,
            (false, CU_MEMORYTYPE_UNIFIED) => MemoryType::Managed,
            _ => MemoryType::Host,
        };
        Ok(PointerInfo {
            memory_type,
            device_ordinal: ordinal.max(0) as u32,
            allocation_base: if known { start } else { 0 },
            allocation_len_bytes: if known { size as u64 } else { 0 },
        })
    }

    fn stream_device(&self, stream: StreamHandle) -> Result<u32, DeviceError> {
        self.ensure_any_current()?;
        let context = if stream == StreamHandle::NULL {
            result::ctx_get_current(&self.api)?
        } else {
            // SAFETY: a user stream handle; an invalid stream yields an error code.
            unsafe { result::stream_get_ctx(&self.api, stream.0 as CUstream) }?
        };
        self.ordinal_of_context(context)
    }

    fn hardware_queue_setting(&self) -> Option<String> {
        let isolation: Vec<&str> = (0..self.contexts.len() as u32)
            .map(|ordinal| {
                if self.engine_isolated(ordinal) { "own context" } else { "SHARED primary context" }
            })
            .collect();
        Some(format!(
            "{}; engine copies per device: {}",
            self.hardware_queues.describe(),
            isolation.join(", ")
        ))
    }

    fn supports_stream_memops(&self, device_ordinal: u32) -> bool {
        self.memops.get(device_ordinal as usize).copied().unwrap_or(false)
    }
}

impl HostMemory for CudaDevice {
    fn alloc_pinned(&self, len_bytes: usize) -> Result<PinnedRegion, DeviceError> {
        // Portable and device-mapped: the engine context copies from it and the
        // application's streams wait on words in it.
        self.in_staging_context(|| {
            let flags = CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP;
            let host = result::mem_host_alloc(&self.api, len_bytes, flags)?;
            // SAFETY: `host` is mapped pinned memory we just allocated.
            let (mapped, device_addr) =
                unsafe { result::mem_host_get_device_pointer_status(&self.api, host) };
            if mapped != CUDA_SUCCESS {
                // SAFETY: frees what we allocated above, once.
                let _ = unsafe { result::mem_free_host_status(&self.api, host) };
                return Err(result::error(&self.api, mapped, "cuMemHostGetDevicePointer"));
            }
            Ok(PinnedRegion { host_ptr: host.cast(), device_addr, len_bytes })
        })
    }

    unsafe fn free_pinned(&self, region: PinnedRegion) {
        let _ = self.in_staging_context(|| {
            // SAFETY: the caller guarantees the region came from alloc_pinned and is idle.
            unsafe { result::mem_free_host(&self.api, region.host_ptr.cast()) }
        });
    }

    unsafe fn register_host(
        &self,
        host_ptr: *mut u8,
        len_bytes: usize,
    ) -> Result<u64, DeviceError> {
        self.in_staging_context(|| {
            let flags = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP;
            // SAFETY: the caller guarantees the range is valid host memory that outlives
            // the registration.
            unsafe { result::mem_host_register(&self.api, host_ptr.cast(), len_bytes, flags) }?;
            // SAFETY: registered, mapped host memory.
            let (mapped, device_addr) =
                unsafe { result::mem_host_get_device_pointer_status(&self.api, host_ptr.cast()) };
            if mapped != CUDA_SUCCESS {
                // SAFETY: undo the registration above.
                let _ = unsafe { result::mem_host_unregister_status(&self.api, host_ptr.cast()) };
                return Err(result::error(&self.api, mapped, "cuMemHostGetDevicePointer"));
            }
            Ok(device_addr)
        })
    }

    unsafe fn unregister_host(&self, host_ptr: *mut u8) {
        let _ = self.in_staging_context(|| {
            // SAFETY: the caller guarantees it was registered and is idle.
            unsafe { result::mem_host_unregister(&self.api, host_ptr.cast()) }
        });
    }
}

impl DeviceCopies for CudaDevice {
    fn create_internal_stream(&self, device_ordinal: u32) -> Result<InternalStream, DeviceError> {
        let stream = self.in_engine_context(device_ordinal, || {
            result::stream_create(&self.api, CU_STREAM_NON_BLOCKING)
        })?;
        let entry = InternalEntry { stream, ordinal: device_ordinal, scratch: Default::default() };
        Ok(self.handles.stream_handle(entry))
    }

    fn destroy_internal_stream(&self, stream: InternalStream) {
        let Some(entry) = self.handles.take_stream(stream) else {
            return;
        };
        let _ = self.in_engine_context(entry.ordinal, || self.destroy_entry(&entry));
    }

    unsafe fn copy_to_device_async(
        &self,
        stream: &InternalStream,
        target: u64,
        source: *const u8,
        len_bytes: usize,
    ) -> Result<(), DeviceError> {
        self.on_stream(stream, |entry| {
            // SAFETY: caller's contract (pinned source, valid device range); the engine
            // context is current and owns the stream.
            // The engine's copies release user streams: always bounced.
            unsafe { self.copy_host_to_device(entry, target, source, len_bytes, true) }
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
            // SAFETY: caller's contract; the engine context is current and owns the stream.
            unsafe { result::memcpy_dtoh_async(&self.api, target, source, len_bytes, entry.stream) }
        })
    }

    fn synchronize_internal(&self, stream: &InternalStream) -> Result<(), DeviceError> {
        self.on_stream(stream, |entry| {
            // SAFETY: our stream, of the engine context.
            unsafe { result::stream_synchronize(&self.api, entry.stream) }
        })
    }

    unsafe fn write_value32_internal(
        &self,
        stream: &InternalStream,
        word_device_addr: u64,
        value: u32,
    ) -> Result<(), DeviceError> {
        self.on_stream(stream, |entry| {
            // SAFETY: caller's contract: a live pinned word (portable, so mapped in the
            // engine context too).
            unsafe {
                result::stream_write_value32(&self.api, entry.stream, word_device_addr, value)
            }
        })
    }

    fn copies_on_caller_thread(&self) -> bool {
        true
    }

    unsafe fn copy_now(
        &self,
        device_ordinal: u32,
        direction: Direction,
        device_addr: u64,
        host: *mut u8,
        len_bytes: usize,
        ops_may_hold_streams: bool,
    ) -> Result<(), DeviceError> {
        let primary = *self
            .contexts
            .get(device_ordinal as usize)
            .ok_or(DeviceError::new(DeviceError::HIP_ERROR_INVALID_DEVICE, "no such device"))?;
        if !ops_may_hold_streams && self.caller_copy == CallerCopy::Auto {
            // No op of ours may hold a stream: the primary context, as the application's
            // own copies (CallerCopy::Auto says why).
            // SAFETY: a primary context we retained; the caller's contract for the copy.
            return unsafe {
                self.with_pushed(primary, || {
                    self.copy_now_in_context(
                        &self.caller_primary_streams[device_ordinal as usize],
                        device_ordinal,
                        direction,
                        device_addr,
                        host,
                        len_bytes,
                        false,
                    )
                })
            };
        }
        // In the engine context (pushed on a caller's thread, popped after): the copy runs
        // on a stream of ours that no application stream shares a hardware queue with,
        // through the scratch, so a sync read never waits behind a stream the caller holds.
        self.in_engine_context(device_ordinal, || {
            // SAFETY: the caller's contract; the engine context is current.
            unsafe {
                self.copy_now_in_context(
                    &self.caller_streams[device_ordinal as usize],
                    device_ordinal,
                    direction,
                    device_addr,
                    host,
                    len_bytes,
                    true,
                )
            }
        })
    }
}

impl DeviceEvents for CudaDevice {
    fn record_event(&self, stream: &InternalStream) -> Result<EventHandle, DeviceError> {
        self.on_stream(stream, |entry| self.record_event_in_context(entry))
    }

    fn event_done(&self, event: &EventHandle) -> Result<bool, DeviceError> {
        self.on_event(event, |entry| {
            // SAFETY: a live event of ours.
            unsafe { result::event_query(&self.api, entry.event) }
        })
    }

    fn destroy_event(&self, event: EventHandle) {
        self.handles.release_event(event, |entry| self.destroy_event_entry(&entry));
    }
}

impl StreamMemoryOps for CudaDevice {
    unsafe fn launch_host_func(
        &self,
        stream: StreamHandle,
        func: HostFn,
        user_data: *mut c_void,
    ) -> Result<(), DeviceError> {
        self.ensure_any_current()?;
        // SAFETY: caller's contract; HostFn has CUhostFn's ABI.
        unsafe { result::launch_host_func(&self.api, stream.0 as CUstream, func, user_data) }
    }

    unsafe fn stream_wait_value32(
        &self,
        stream: StreamHandle,
        word_device_addr: u64,
        value: u32,
    ) -> Result<(), DeviceError> {
        self.ensure_any_current()?;
        // SAFETY: caller's contract: the word stays allocated.
        unsafe {
            result::stream_wait_value32_geq(
                &self.api,
                stream.0 as CUstream,
                word_device_addr,
                value,
            )
        }
    }

    unsafe fn stream_write_value32(
        &self,
        stream: StreamHandle,
        word_device_addr: u64,
        value: u32,
    ) -> Result<(), DeviceError> {
        self.ensure_any_current()?;
        // SAFETY: caller's contract.
        unsafe {
            result::stream_write_value32(&self.api, stream.0 as CUstream, word_device_addr, value)
        }
    }

    unsafe fn stream_write_then_wait_value32(
        &self,
        stream: StreamHandle,
        write_addr: u64,
        write_value: u32,
        wait_addr: u64,
        wait_value: u32,
    ) -> Result<(), WriteThenWaitError> {
        self.ensure_any_current().map_err(WriteThenWaitError::NothingQueued)?;
        let mut ops = [
            CUstreamBatchMemOpParams {
                operation: CU_STREAM_MEM_OP_WRITE_VALUE_32,
                address: write_addr,
                value64: u64::from(write_value),
                flags: CU_STREAM_WRITE_VALUE_DEFAULT,
                ..CUstreamBatchMemOpParams::default()
            },
            CUstreamBatchMemOpParams {
                operation: CU_STREAM_MEM_OP_WAIT_VALUE_32,
                address: wait_addr,
                value64: u64::from(wait_value),
                flags: CU_STREAM_WAIT_VALUE_GEQ,
                ..CUstreamBatchMemOpParams::default()
            },
        ];
        // SAFETY: two initialized entries in cuda.h's layout (checked by the
        // const assertions in sys.rs); the caller keeps both words allocated.
        let code = unsafe {
            result::stream_batch_mem_op_status(&self.api, stream.0 as CUstream, &mut ops)
        };
        if code == CUDA_SUCCESS {
            return Ok(());
        }
        // The batch failed: enqueue the two ops one by one, which reports which failed.
        // Should the batch have enqueued part of itself, a repeated write of the same
        // value and a repeated wait for it change nothing.
        // SAFETY: the caller's contract.
        unsafe {
            super::write_then_wait_one_by_one(
                self,
                stream,
                write_addr,
                write_value,
                wait_addr,
                wait_value,
            )
        }
    }

    fn synchronize_stream(&self, stream: StreamHandle) -> Result<(), DeviceError> {
        self.ensure_any_current()?;
        // SAFETY: a user stream handle; invalid ones yield an error code.
        unsafe { result::stream_synchronize(&self.api, stream.0 as CUstream) }
    }

    fn stream_done(&self, stream: StreamHandle) -> Result<bool, DeviceError> {
        self.ensure_any_current()?;
        // SAFETY: a user stream handle; invalid ones yield an error code.
        unsafe { result::stream_query(&self.api, stream.0 as CUstream) }
    }
}

impl UserDevice for CudaDevice {
    fn alloc_device(&self, ordinal: u32, len_bytes: usize) -> Result<u64, DeviceError> {
        self.make_current(ordinal)?;
        result::mem_alloc(&self.api, len_bytes)
    }

    unsafe fn free_device(&self, address: u64) -> Result<(), DeviceError> {
        self.ensure_any_current()?;
        // SAFETY: the caller guarantees the memory is idle.
        unsafe { result::mem_free(&self.api, address) }
    }

    fn create_user_stream(&self, ordinal: u32) -> Result<StreamHandle, DeviceError> {
        self.make_current(ordinal)?;
        let stream = result::stream_create(&self.api, CU_STREAM_NON_BLOCKING)?;
        Ok(StreamHandle(stream as usize))
    }

    fn destroy_user_stream(&self, stream: StreamHandle) -> Result<(), DeviceError> {
        self.ensure_any_current()?;
        // SAFETY: the stream came from create_user_stream; invalid ones yield an error code.
        unsafe { result::stream_destroy(&self.api, stream.0 as CUstream) }
    }

    unsafe fn copy_to_device_on(
        &self,
        stream: StreamHandle,
        target: u64,
        source: *const u8,
        len_bytes: usize,
    ) -> Result<(), DeviceError> {
        self.ensure_any_current()?;
        // SAFETY: caller's contract.
        unsafe {
            result::memcpy_htod_async(&self.api, target, source, len_bytes, stream.0 as CUstream)
        }
    }

    unsafe fn copy_from_device_on(
        &self,
        stream: StreamHandle,
        target: *mut u8,
        source: u64,
        len_bytes: usize,
    ) -> Result<(), DeviceError> {
        self.ensure_any_current()?;
        // SAFETY: caller's contract.
        unsafe {
            result::memcpy_dtoh_async(&self.api, target, source, len_bytes, stream.0 as CUstream)
        }
    }

    unsafe fn memset_on(
        &self,
        stream: StreamHandle,
        target: u64,
        value: u8,
        len_bytes: usize,
    ) -> Result<(), DeviceError> {
        self.ensure_any_current()?;
        // SAFETY: the caller guarantees the range.
        unsafe {
            result::memset_d8_async(&self.api, target, value, len_bytes, stream.0 as CUstream)
        }
    }
}
