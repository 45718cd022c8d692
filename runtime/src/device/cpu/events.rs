//! The cpu device's events: a ticket in one stream's sequence, complete once every
//! command enqueued before it has completed.

use std::sync::Arc;

use crate::device::{DeviceError, DeviceEvents, EventHandle, InternalStream, StreamHandle};

use super::streams::StreamShared;
use super::{CpuDevice, invalid_handle, lock, next_handle};

/// An event: a ticket in one stream's sequence.
pub(super) struct EventEntry {
    pub(super) stream: Arc<StreamShared>,
    pub(super) ticket: u64,
}

impl CpuDevice {
    /// Records an event on any stream: complete once all work enqueued before it is.
    ///
    /// # Errors
    /// `HIP_ERROR_INVALID_HANDLE` for an unknown stream.
    pub fn record_event_on(&self, stream: StreamHandle) -> Result<EventHandle, DeviceError> {
        let stream = self.stream(stream.0)?;
        let ticket = stream.current_ticket();
        let handle = next_handle();
        lock(&self.events).insert(handle, EventEntry { stream, ticket });
        Ok(EventHandle::from_raw(handle))
    }

    pub(super) fn event(
        &self,
        event: &EventHandle,
    ) -> Result<(Arc<StreamShared>, u64), DeviceError> {
        let events = lock(&self.events);
        let entry = events.get(&event.raw()).ok_or(invalid_handle("unknown event"))?;
        Ok((Arc::clone(&entry.stream), entry.ticket))
    }

    /// Blocks until the event is complete.
    ///
    /// # Errors
    /// `HIP_ERROR_INVALID_HANDLE` for an unknown event; the asynchronous error of the work
    /// before it.
    pub fn event_synchronize(&self, event: &EventHandle) -> Result<(), DeviceError> {
        let (stream, ticket) = self.event(event)?;
        stream.wait_for(ticket)
    }

    /// How many recorded events have not been destroyed yet (for tests: a user of the
    /// device that forgets [`DeviceEvents::destroy_event`] leaves them here).
    pub fn live_events(&self) -> usize {
        lock(&self.events).len()
    }
}

impl DeviceEvents for CpuDevice {
    fn record_event(&self, stream: &InternalStream) -> Result<EventHandle, DeviceError> {
        self.record_event_on(StreamHandle(stream.raw()))
    }

    fn event_done(&self, event: &EventHandle) -> Result<bool, DeviceError> {
        let (stream, ticket) = self.event(event)?;
        stream.is_done(ticket)
    }

    fn destroy_event(&self, event: EventHandle) {
        if lock(&self.events).remove(&event.raw()).is_none() {
            self.count_invalid_release();
        }
    }
}
