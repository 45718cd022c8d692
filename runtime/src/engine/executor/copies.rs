//! Device copies in flight: reaping their staging, waiting for their events without
//! blocking the executor, and copies left to finish after their job.

use std::collections::VecDeque;
use std::rc::Rc;
use std::time::{Duration, Instant};

use glommio::io::ReadResult;

use super::Executor;
use super::event_order::CopyEvent;
use crate::device::{Device, DeviceError, InternalStream};
use crate::engine::Phase;
use crate::engine::staging::{FallbackChunk, StagingShare};

/// What a chunk's bytes sit in while the device copies them.
pub(super) enum Staging {
    /// A glommio read result, inside the registered arena.
    Read(ReadResult),
    /// A pinned fallback chunk.
    Fallback(FallbackChunk),
}

/// A device copy in flight and the staging it reads or writes.
pub(super) struct InFlightCopy {
    event: CopyEvent,
    _staging: Staging,
    /// The staging's share of the arena, given back with it.
    _share: StagingShare,
}

impl InFlightCopy {
    /// A copy whose completion `event` records, reading or writing `staging`.
    pub(super) fn new(event: CopyEvent, staging: Staging, share: StagingShare) -> InFlightCopy {
        InFlightCopy { event, _staging: staging, _share: share }
    }
}

impl Executor {
    /// Records an event after the copies enqueued on `stream` so far.
    pub(super) fn record_copy_event(
        &self,
        stream: &InternalStream,
    ) -> Result<CopyEvent, DeviceError> {
        let handle = self.setup.device.record_event(stream)?;
        Ok(self.event_order.borrow_mut().recorded(stream.raw(), handle))
    }

    /// Whether `event` is complete at `now`: from what the executor knows of its stream's
    /// order where that answers ([`EventOrder`](super::event_order::EventOrder)), else
    /// from the device.
    fn copy_done(&self, event: &CopyEvent, now: Instant) -> Result<bool, DeviceError> {
        if let Some(known) = self.event_order.borrow().known(event, now) {
            return Ok(known);
        }
        let done = self.setup.device.event_done(&event.handle)?;
        self.event_order.borrow_mut().observed(event, done, now);
        Ok(done)
    }

    /// Keeps staging alive until the device is done with it, off the job's path.
    pub(super) fn detach_copies(self: &Rc<Self>, mut copies: VecDeque<InFlightCopy>) {
        if copies.is_empty() {
            return;
        }
        let me = Rc::clone(self);
        me.detached_copies.set(me.detached_copies.get() + 1);
        glommio::spawn_local(async move {
            let _ = me.wait_all(&mut copies).await;
            me.detached_copies.set(me.detached_copies.get() - 1);
        })
        .detach();
    }
    /// A copy was enqueued on `stream` but its event could not be recorded: wait for the
    /// stream so that the copy no longer uses `staging` before it is freed. If even that
    /// fails, `staging` is leaked rather than freed under a copy that may still run.
    ///
    /// The one wait left on the reactor, on purpose: an error path of a failing device
    /// (recording an event failed), and the stream is the executor's own internal one,
    /// which only ever holds this executor's staging copies (never behind an application
    /// stream), so the wait ends when those copies do. Moving it off the reactor would
    /// send the stream, owned by this thread, to another one, for no gain.
    pub(super) fn settle_unrecorded_copy<T>(&self, stream: &InternalStream, staging: T) {
        if self.setup.device.synchronize_internal(stream).is_err() {
            std::mem::forget(staging);
        }
    }
    /// Drops staging of completed copies; waits for the oldest while `depth` are in flight.
    pub(super) async fn reap(
        &self,
        copies: &mut VecDeque<InFlightCopy>,
        depth: usize,
    ) -> Result<(), DeviceError> {
        while let Some(front) = copies.front() {
            let done = self.copy_done(&front.event, Instant::now())?;
            if !done && copies.len() < depth {
                break;
            }
            if !done {
                self.wait_event(&front.event).await?;
            }
            let copy = copies.pop_front().expect("front exists");
            self.setup.device.destroy_event(copy.event.handle);
        }
        Ok(())
    }

    pub(super) async fn wait_all(
        &self,
        copies: &mut VecDeque<InFlightCopy>,
    ) -> Result<(), DeviceError> {
        let mut first_error = Ok(());
        while let Some(copy) = copies.pop_front() {
            if let Err(error) = self.wait_event(&copy.event).await {
                first_error = first_error.and(Err(error));
            }
            self.setup.device.destroy_event(copy.event.handle);
        }
        first_error
    }

    /// Polls an event without blocking the executor: yields for up to
    /// `HIPFILE_COPY_SPIN_US` (default 200 µs: copies of small chunks finish in
    /// microseconds, and a timer sleep costs ~50 µs of wake-up), then timer sleeps with
    /// backoff.
    pub(super) async fn wait_event(&self, event: &CopyEvent) -> Result<(), DeviceError> {
        let started = Instant::now();
        if self.copy_done(event, started)? {
            return Ok(());
        }
        let mut sleep_us = 10;
        loop {
            let now = Instant::now();
            if self.copy_done(event, now)? {
                self.phases().add_since(Phase::CopyWait, started);
                return Ok(());
            }
            let waited = now.saturating_duration_since(started);
            if waited < self.setup.copy_spin {
                glommio::executor().yield_task_queue_now().await;
            } else {
                if waited >= COPY_STALL_WARNING {
                    warn_copy_stalled(&*self.setup.device, waited);
                }
                glommio::timer::sleep(Duration::from_micros(sleep_us)).await;
                sleep_us = (sleep_us * 2).min(200);
            }
        }
    }
}

/// How long a staging copy may stay incomplete before the process is warned (once) that
/// it is probably queued behind a held stream on a shared hardware queue.
const COPY_STALL_WARNING: Duration = Duration::from_secs(5);

/// Warns once per process that a copy on an internal stream has not completed after
/// `waited`. With the engine's copies in a context of their own this is not expected;
/// when the backend could not make one, the known cause is a user stream, held on an
/// async op's wait-value, sharing the copy stream's hardware queue (README, Known limits).
fn warn_copy_stalled(device: &dyn Device, waited: Duration) {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    let setting = device.hardware_queue_setting().unwrap_or_default();
    log::warn!("a staging copy has not completed after {} s ({setting})", waited.as_secs());
}
