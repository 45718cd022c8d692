//! What the GPU backends (`cuda`, `rocm`) share, written once over their driver calls:
//! the owned-handle bookkeeping behind [`InternalStream`] and [`EventHandle`], the
//! per-device pools of idle events, and the flow of an event (pooled or created, recorded,
//! released back to the pool or destroyed) with the driver calls passed in.
//!
//! A backend keeps one [`OwnedHandles`] with its own entry types (a driver stream and its
//! device; a driver event and its device). `OwnedHandles` is the only code that stamps
//! its owner id on a handle, always on a box it has just leaked, and the only code that
//! reclaims one, always by consuming the handle: the argument of [`super::handle`] is made
//! here once instead of in each backend.
//!
//! A backend implements [`GpuBackend`]: its handles and how it enters a device for a call
//! (CUDA: the engine's own context, pushed or cached per executor thread; HIP has no
//! contexts and makes the device current); [`GpuBackend::on_stream`] and
//! [`GpuBackend::on_event`] then look a handle up and enter its device, written once.
//! What else differs between CUDA and HIP stays in the backend: how an event is created,
//! recorded and destroyed, and CUDA's caller-thread streams and device scratch.

use std::marker::PhantomData;
use std::sync::{Mutex, PoisonError};

use super::{DeviceError, EventHandle, InternalStream, handle};

/// Most idle events kept per device for reuse.
pub(crate) const EVENT_POOL_CAP: usize = 1024;

/// A backend's stream or event entry: a driver object of one device.
pub(crate) trait DeviceEntry {
    /// The ordinal of the device the object belongs to (an event's pool).
    fn ordinal(&self) -> u32;
}

/// A GPU backend as the shared code sees it: its handles, and how it enters a device for
/// a call on one of its streams or events (CUDA: the device's engine context, kept
/// current on executors and pushed for the call elsewhere; HIP: the device made current).
pub(crate) trait GpuBackend {
    /// The backend's internal-stream entry.
    type Stream: DeviceEntry + 'static;
    /// The backend's event entry.
    type Event: DeviceEntry + 'static;

    /// The device object's handles.
    fn handles(&self) -> &OwnedHandles<Self::Stream, Self::Event>;

    /// Runs `work` with device `ordinal` entered.
    ///
    /// # Errors
    /// Entering the device failed (`work` does not run), or `work`'s error.
    fn in_device<R>(
        &self,
        ordinal: u32,
        work: impl FnOnce() -> Result<R, DeviceError>,
    ) -> Result<R, DeviceError>;

    /// Runs `work` on the entry behind an internal stream this object made, with the
    /// stream's device entered.
    ///
    /// # Errors
    /// [`OwnedHandles::stream`]'s, entering the device failed, or `work`'s error.
    fn on_stream<'a, R>(
        &self,
        stream: &'a InternalStream,
        work: impl FnOnce(&'a Self::Stream) -> Result<R, DeviceError>,
    ) -> Result<R, DeviceError> {
        let entry = self.handles().stream(stream)?;
        self.in_device(entry.ordinal(), || work(entry))
    }

    /// Runs `work` on the entry behind an event this object recorded, with the event's
    /// device entered.
    ///
    /// # Errors
    /// [`OwnedHandles::event`]'s, entering the device failed, or `work`'s error.
    fn on_event<'a, R>(
        &self,
        event: &'a EventHandle,
        work: impl FnOnce(&'a Self::Event) -> Result<R, DeviceError>,
    ) -> Result<R, DeviceError> {
        let entry = self.handles().event(event)?;
        self.in_device(entry.ordinal(), || work(entry))
    }
}

/// The boxes behind one device object's internal-stream and event handles (`S`: the
/// backend's stream entry, `E`: its event entry), and its idle events per device.
pub(crate) struct OwnedHandles<S, E> {
    /// This object's owner id ([`handle::next_owner_id`]), stamped on every handle it
    /// makes; handles with another owner are refused before their raw value is used.
    owner: u64,
    /// Idle events per device ordinal, at most [`EVENT_POOL_CAP`] each.
    #[allow(
        clippy::vec_box,
        reason = "an event's box is reused as the next handle's, whose address must not move"
    )]
    event_pools: Vec<Mutex<Vec<Box<E>>>>,
    /// The stream entry type, owned through leaked boxes only.
    streams: PhantomData<fn(S) -> S>,
}

impl<S, E> OwnedHandles<S, E> {
    /// Bookkeeping for a device object driving `device_count` devices, with a fresh owner id.
    pub(crate) fn new(device_count: usize) -> Self {
        OwnedHandles {
            owner: handle::next_owner_id(),
            event_pools: (0..device_count).map(|_| Mutex::new(Vec::new())).collect(),
            streams: PhantomData,
        }
    }

    /// A handle owning `entry` (a stream just created).
    pub(crate) fn stream_handle(&self, entry: S) -> InternalStream {
        InternalStream::owned(handle::leak(Box::new(entry)), self.owner)
    }

    /// The entry behind an internal stream this object made, for as long as the handle
    /// is borrowed.
    ///
    /// # Errors
    /// `HIP_ERROR_INVALID_HANDLE` for a handle of another device object, or one made
    /// with [`InternalStream::from_raw`].
    pub(crate) fn stream<'a>(&self, stream: &'a InternalStream) -> Result<&'a S, DeviceError> {
        // SAFETY: this object stamps its owner id only in `stream_handle`, on a Box<S> it
        // has just leaked, and reclaims one only in `take_stream`, which consumes the
        // handle; the reference lives for 'a, the borrow of the handle.
        unsafe {
            handle::borrow_owned(
                stream.raw(),
                stream.owner(),
                self.owner,
                "internal stream not made by this device",
            )
        }
    }

    /// The entry behind an internal stream this object made, taken back (the handle is
    /// consumed); `None`, logged, for a handle of another device object or one made with
    /// [`InternalStream::from_raw`].
    pub(crate) fn take_stream(&self, stream: InternalStream) -> Option<Box<S>> {
        if stream.owner() != self.owner {
            log::debug!("ignored: destroy of an internal stream not made by this device");
            return None;
        }
        // SAFETY: the handle's owner is this object, so (see `stream`) its raw value is a
        // Box<S> leaked by `stream_handle` and live while the handle exists; we consume
        // the one handle that names it, so it is reclaimed once.
        Some(unsafe { handle::reclaim::<S>(stream.raw()) })
    }

    /// A handle owning `entry` (an event just recorded).
    fn event_handle(&self, entry: Box<E>) -> EventHandle {
        EventHandle::owned(handle::leak(entry), self.owner)
    }

    /// The entry behind an event this object recorded, for as long as the handle is
    /// borrowed.
    ///
    /// # Errors
    /// `HIP_ERROR_INVALID_HANDLE` for a handle of another device object, or one made
    /// with [`EventHandle::from_raw`].
    pub(crate) fn event<'a>(&self, event: &'a EventHandle) -> Result<&'a E, DeviceError> {
        // SAFETY: this object stamps its owner id only in `event_handle`, on a Box<E> it
        // has just leaked, and reclaims one only in `take_event`, which consumes the
        // handle; the reference lives for 'a, the borrow of the handle.
        unsafe {
            handle::borrow_owned(
                event.raw(),
                event.owner(),
                self.owner,
                "event not recorded by this device",
            )
        }
    }

    /// The entry behind an event this object recorded, taken back (the handle is
    /// consumed); `None`, logged, for a handle of another device object or one made with
    /// [`EventHandle::from_raw`].
    fn take_event(&self, event: EventHandle) -> Option<Box<E>> {
        if event.owner() != self.owner {
            log::debug!("ignored: destroy of an event not recorded by this device");
            return None;
        }
        // SAFETY: the handle's owner is this object, so (see `event`) its raw value is a
        // Box<E> leaked by `event_handle` and live while the handle exists; we consume the
        // one handle that names it, so it is reclaimed once.
        Some(unsafe { handle::reclaim::<E>(event.raw()) })
    }

    /// An idle event of device `ordinal` to record again, if the pool has one.
    fn pooled_event(&self, ordinal: u32) -> Option<Box<E>> {
        self.pool(ordinal).lock().unwrap_or_else(PoisonError::into_inner).pop()
    }

    /// Keeps an idle event of device `ordinal` for reuse; gives it back when the pool is
    /// full, for the caller to destroy.
    fn pool_event(&self, ordinal: u32, entry: Box<E>) -> Option<Box<E>> {
        let mut pool = self.pool(ordinal).lock().unwrap_or_else(PoisonError::into_inner);
        if pool.len() < EVENT_POOL_CAP {
            pool.push(entry);
            return None;
        }
        Some(entry)
    }

    /// Every pooled event, by device ordinal, taken out of the pools (for the device's drop,
    /// which destroys them).
    pub(crate) fn drain_event_pools(&mut self) -> Vec<(u32, Vec<Box<E>>)> {
        self.event_pools
            .iter_mut()
            .enumerate()
            .map(|(ordinal, pool)| {
                let events = std::mem::take(pool.get_mut().unwrap_or_else(PoisonError::into_inner));
                (ordinal as u32, events)
            })
            .filter(|(_, events)| !events.is_empty())
            .collect()
    }

    fn pool(&self, ordinal: u32) -> &Mutex<Vec<Box<E>>> {
        &self.event_pools[ordinal as usize]
    }
}

impl<S, E: DeviceEntry> OwnedHandles<S, E> {
    /// Makes idle events of device `ordinal` with `create` until its pool holds `count`
    /// (at most [`EVENT_POOL_CAP`]), so that recording them later creates nothing.
    ///
    /// # Errors
    /// `create`'s; the events made before it failed stay pooled.
    pub(crate) fn prefill_events(
        &self,
        ordinal: u32,
        count: usize,
        mut create: impl FnMut() -> Result<E, DeviceError>,
    ) -> Result<(), DeviceError> {
        let count = count.min(EVENT_POOL_CAP);
        while self.pool(ordinal).lock().unwrap_or_else(PoisonError::into_inner).len() < count {
            // Made outside the lock; a pool that another thread filled meanwhile ends a
            // few over the cap (pools shrink back as events are released).
            let event = Box::new(create()?);
            self.pool(ordinal).lock().unwrap_or_else(PoisonError::into_inner).push(event);
        }
        Ok(())
    }

    /// Records an event of device `ordinal`: an idle pooled one, else one `create` makes;
    /// `record` enqueues it (the backend's context or device is current). An event whose
    /// record failed goes back to the pool, or to `destroy` when the pool is full.
    ///
    /// # Errors
    /// `create`'s or `record`'s.
    pub(crate) fn record_event(
        &self,
        ordinal: u32,
        create: impl FnOnce() -> Result<E, DeviceError>,
        record: impl FnOnce(&E) -> Result<(), DeviceError>,
        destroy: impl FnOnce(Box<E>),
    ) -> Result<EventHandle, DeviceError> {
        let event = match self.pooled_event(ordinal) {
            Some(event) => event,
            None => Box::new(create()?),
        };
        if let Err(error) = record(&event) {
            self.pool_or_destroy(event, destroy);
            return Err(error);
        }
        Ok(self.event_handle(event))
    }

    /// Releases an event this object recorded (the handle is consumed): back to the pool,
    /// or to `destroy` when the pool is full. A handle of another device object, or one
    /// made with [`EventHandle::from_raw`], is ignored (logged).
    pub(crate) fn release_event(&self, event: EventHandle, destroy: impl FnOnce(Box<E>)) {
        if let Some(entry) = self.take_event(event) {
            self.pool_or_destroy(entry, destroy);
        }
    }

    /// Keeps an idle event for reuse, or gives it to `destroy` when the pool is full.
    pub(crate) fn pool_or_destroy(&self, entry: Box<E>, destroy: impl FnOnce(Box<E>)) {
        if let Some(entry) = self.pool_event(entry.ordinal(), entry) {
            destroy(entry);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{DeviceEntry, EVENT_POOL_CAP, OwnedHandles};
    use crate::device::{DeviceError, EventHandle, InternalStream};

    /// A test event: (device ordinal, serial number).
    #[derive(Debug, PartialEq)]
    struct Event(u32, u32);

    impl DeviceEntry for Event {
        fn ordinal(&self) -> u32 {
            self.0
        }
    }

    #[test]
    fn a_recorded_event_is_reused_and_a_failed_record_goes_back_to_the_pool() {
        let handles = OwnedHandles::<(), Event>::new(1);
        let never = |_: Box<Event>| panic!("nothing is destroyed while the pool has room");
        let event = handles.record_event(0, || Ok(Event(0, 1)), |_| Ok(()), never).unwrap();
        assert_eq!(handles.event(&event), Ok(&Event(0, 1)));
        handles.release_event(event, never);
        let failed = DeviceError::new(DeviceError::HIP_ERROR_UNKNOWN, "record");
        let refused = handles.record_event(
            0,
            || panic!("the pooled event is used first"),
            |event| {
                assert_eq!(event, &Event(0, 1));
                Err(failed)
            },
            never,
        );
        assert_eq!(refused.map(|_| ()), Err(failed));
        assert_eq!(handles.pooled_event(0).map(|event| *event), Some(Event(0, 1)));
    }

    #[test]
    fn a_full_pool_hands_the_event_to_destroy() {
        let handles = OwnedHandles::<(), Event>::new(1);
        for serial in 0..EVENT_POOL_CAP as u32 {
            handles.pool_or_destroy(Box::new(Event(0, serial)), |_| panic!("room left"));
        }
        let mut destroyed = None;
        handles.pool_or_destroy(Box::new(Event(0, u32::MAX)), |event| destroyed = Some(*event));
        assert_eq!(destroyed, Some(Event(0, u32::MAX)));
    }

    #[test]
    fn a_handle_is_borrowed_by_its_maker_only_and_taken_back_once() {
        let handles = OwnedHandles::<u32, u64>::new(1);
        let other = OwnedHandles::<u32, u64>::new(1);
        let stream = handles.stream_handle(7);
        assert_eq!(handles.stream(&stream), Ok(&7));
        let refused = other.stream(&stream).map(|_| ());
        assert_eq!(refused.map_err(|e| e.hip_error), Err(DeviceError::HIP_ERROR_INVALID_HANDLE));
        let forged = InternalStream::from_raw(stream.raw());
        assert!(handles.stream(&forged).is_err());
        assert!(handles.take_stream(forged).is_none());
        assert_eq!(handles.take_stream(stream).map(|entry| *entry), Some(7));

        let event = handles.event_handle(Box::new(9));
        assert_eq!(handles.event(&event), Ok(&9));
        assert!(other.event(&event).is_err());
        assert!(handles.take_event(EventHandle::from_raw(event.raw())).is_none());
        assert_eq!(handles.take_event(event).map(|entry| *entry), Some(9));
    }

    #[test]
    fn the_event_pool_keeps_up_to_its_cap_and_drains() {
        let mut handles = OwnedHandles::<(), usize>::new(2);
        assert!(handles.pooled_event(1).is_none());
        for index in 0..EVENT_POOL_CAP {
            assert!(handles.pool_event(1, Box::new(index)).is_none());
        }
        assert_eq!(handles.pool_event(1, Box::new(0)).map(|entry| *entry), Some(0));
        assert_eq!(handles.pooled_event(1).map(|entry| *entry), Some(EVENT_POOL_CAP - 1));
        let drained = handles.drain_event_pools();
        assert_eq!(drained.len(), 1);
        assert_eq!((drained[0].0, drained[0].1.len()), (1, EVENT_POOL_CAP - 1));
        assert!(handles.pooled_event(1).is_none());
    }
}
