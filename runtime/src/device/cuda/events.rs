//! [`DeviceEvents`] on the CUDA device: events on the engine's internal streams, made and
//! pooled in the engine context through the shared `gpu::OwnedHandles`.

use crate::device::gpu::GpuBackend;
use crate::device::{DeviceError, DeviceEvents, EventHandle, InternalStream};

use super::sys::*;
use super::{CudaDevice, EventEntry, InternalEntry, result};

impl CudaDevice {
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
