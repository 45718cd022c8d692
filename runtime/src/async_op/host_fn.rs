//! The host-function arm, for devices without stream memory operations: a host function
//! on the user's stream arms the op and holds the stream until the op has released it
//! (the documented blocking fallback).

use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use super::AsyncOp;
use super::submit::EnqueueError;
use crate::error::Error;

impl AsyncOp {
    /// Enqueues [`arm_host_fn`] for this op on its user stream.
    pub(super) fn enqueue_host_function_arm(self: &Arc<Self>) -> Result<(), EnqueueError> {
        let device = self.host.device();
        let raw = Arc::into_raw(Arc::clone(self)).cast_mut().cast::<c_void>();
        // SAFETY: `raw` is an Arc reference that `arm_host_fn` takes back exactly once; the
        // function is sound on any thread (it catches panics and calls no device API).
        let launched = unsafe { device.launch_host_func(self.stream.handle, arm_host_fn, raw) };
        launched.map_err(|error| {
            // SAFETY: the launch failed, so the host function will never take `raw` back.
            drop(unsafe { Arc::from_raw(raw.cast::<AsyncOp>()) });
            EnqueueError { error: Error::device(error), nothing_queued: true }
        })
    }

    /// Signals the blocking host function that the stream was released.
    pub(super) fn signal_released(&self) {
        let (lock, signal) = &self.released_signal;
        *lock.lock().unwrap_or_else(|p| p.into_inner()) = true;
        signal.notify_all();
    }

    fn wait_released(&self) {
        let (lock, signal) = &self.released_signal;
        let mut released = lock.lock().unwrap_or_else(|p| p.into_inner());
        while !*released {
            released = signal.wait(released).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// The arm host function enqueued on the user's stream.
///
/// # Safety
/// `user_data` is a pointer from `Arc::into_raw` of an `AsyncOp`, passed exactly once.
unsafe extern "C" fn arm_host_fn(user_data: *mut c_void) {
    // SAFETY: see the function's contract.
    let op = unsafe { Arc::from_raw(user_data.cast::<AsyncOp>().cast_const()) };
    // The stream reached the op: ring its doorbell host-side, as the stream itself does
    // on the memory-operation path (the doorbell then tells the word pool that no arm
    // of this stream is pending: `crate::stream`).
    let doorbell = op.stream.arm_queue().doorbell();
    // SAFETY: the doorbell lives in the driver's word pool while the op holds its stream.
    unsafe { op.host.device().store_word_host(doorbell.host_ptr, op.sequence) };
    let blocking = op.blocking_fallback;
    let waiter = blocking.then(|| Arc::clone(&op));
    // A panic must not cross the C boundary; the op's Drop then publishes -5030.
    let _ = catch_unwind(AssertUnwindSafe(move || op.arm()));
    // Blocking fallback (no stream memory operations): later stream work waits for this
    // host function, so it returns only once the op has released the stream. The engine
    // never needs this thread, so the wait cannot deadlock.
    if let Some(op) = waiter {
        op.wait_released();
    }
}
