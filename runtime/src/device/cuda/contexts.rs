//! Which CUDA context a call of the device runs in: the engine context of each device
//! (hipFile's own, made on first use and kept for the process), the retained primary
//! contexts, the context a thread has current (cached per thread) and the pushes and
//! pops that leave a caller's current context as it was.

use std::cell::Cell;
use std::ffi::c_int;
use std::sync::Mutex;

use crate::device::DeviceError;

use super::sys::*;
use super::{CudaDevice, result};

/// The context engine work of one device runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct EngineContext {
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

thread_local! {
    /// The context this thread made current through us (executor threads only).
    static CURRENT_CONTEXT: Cell<usize> = const { Cell::new(0) };
    /// Whether this thread is an engine executor (decided once per thread).
    static ENGINE_THREAD: Cell<Option<bool>> = const { Cell::new(None) };
}

/// Forgets this thread's cached current context (after a push and pop of another one).
pub(super) fn forget_current_context() {
    CURRENT_CONTEXT.set(0);
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
    /// Makes device `ordinal`'s primary context current on this thread (cached).
    pub(super) fn make_current(&self, ordinal: u32) -> Result<(), DeviceError> {
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
    pub(super) fn in_engine_context<R>(
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
    pub(super) unsafe fn with_pushed<R>(
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

    /// Whether device `ordinal`'s engine work runs in a context of its own (for reports).
    pub(super) fn engine_isolated(&self, ordinal: u32) -> bool {
        self.engine_context(ordinal).is_ok_and(|context| context.isolated)
    }

    /// Ensures some context is current (the caller's own, else device 0's primary).
    pub(super) fn ensure_any_current(&self) -> Result<(), DeviceError> {
        let current = result::ctx_get_current(&self.api)?;
        if current.is_null() { self.make_current(0) } else { Ok(()) }
    }

    pub(super) fn ordinal_of_context(&self, context: CUcontext) -> Result<u32, DeviceError> {
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
}
