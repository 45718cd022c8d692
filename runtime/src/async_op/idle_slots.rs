//! Giving the engine's device memory back when its read slots go unused.
//!
//! Device slots (`HIPFILE_STREAM_COPY_SLOTS=device`) are allocated as reads first need
//! them, up to `HIPFILE_STREAM_COPY_DEVICE_MB` per device. A server that loads its weights
//! once and then reads little would otherwise keep that much GPU memory for the life of the
//! process (the C API's driver is never dropped). One thread per driver, `hipfile-slots`,
//! parks until a slab of device memory is allocated, then looks every quarter of the idle
//! time (at most once a second) and gives back the memory of each slot size that no read
//! asked for during `HIPFILE_STREAM_COPY_DEVICE_IDLE_MS`; it parks again once the slots
//! hold no device memory. An idle driver costs no CPU.

use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use super::slots::{GrowSignal, SlotPool};

/// Name of the thread.
pub(crate) const IDLE_SLOTS_THREAD_NAME: &str = "hipfile-slots";

/// The thread that gives idle device slots back; stopped and joined on drop.
pub(crate) struct IdleSlotGiver {
    signal: Arc<GrowSignal>,
    thread: Option<JoinHandle<()>>,
}

impl IdleSlotGiver {
    /// Starts the thread for `pool` when it has device slots and `idle` is not zero;
    /// `None` otherwise, or (with a warning: the memory is then kept until the driver is
    /// dropped) when the thread cannot be started.
    pub(crate) fn start(pool: &Arc<SlotPool>, idle: Duration) -> Option<IdleSlotGiver> {
        if !pool.has_device_slots() || idle.is_zero() {
            return None;
        }
        let signal = Arc::clone(pool.grow_signal());
        let weak = Arc::downgrade(pool);
        let thread_signal = Arc::clone(&signal);
        let thread = std::thread::Builder::new()
            .name(IDLE_SLOTS_THREAD_NAME.to_owned())
            .spawn(move || give_back_while_held(&weak, &thread_signal, idle));
        match thread {
            Ok(thread) => Some(IdleSlotGiver { signal, thread: Some(thread) }),
            Err(error) => {
                log::warn!(
                    "device read slots: no thread to give idle ones back ({error}); their \
                     memory is kept until the driver is dropped"
                );
                None
            }
        }
    }
}

impl Drop for IdleSlotGiver {
    fn drop(&mut self) {
        self.signal.stop();
        if let Some(thread) = self.thread.take() {
            // The thread never owns the pool for longer than one look, and never the
            // driver: it cannot be the thread dropping this.
            let _ = thread.join();
        }
    }
}

/// The thread's loop: park until device memory is allocated, then look every `period`
/// until the slots hold none.
fn give_back_while_held(pool: &Weak<SlotPool>, signal: &GrowSignal, idle: Duration) {
    let period = (idle / 4).clamp(Duration::from_millis(1), Duration::from_secs(1));
    while signal.wait_grown() {
        loop {
            if !signal.sleep(period) {
                return;
            }
            let Some(pool) = pool.upgrade() else { return };
            let bytes = pool.give_back_idle(idle);
            if bytes > 0 {
                log::debug!(
                    "device read slots: {} KiB given back after {idle:?} unused",
                    bytes >> 10
                );
            }
            if pool.device_bytes_held() == 0 {
                break;
            }
        }
    }
}
