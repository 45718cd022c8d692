//! The hand-off between submitters and the arm poller ([`crate::arm`]): which streams the
//! poller watches, and its parking. The one property that matters — **an op queued for
//! arming is never stranded while the poller sleeps** — rests on this module alone, so it
//! is written against the `sync` facade of its parent and model-checked with `loom`
//! (`runtime/tests/loom_arm_handoff.rs` includes this very file with loom's primitives:
//! every interleaving of submitters against the poller's prune-and-park).
//!
//! The protocol:
//! - a submitter pushes under the queue's lock, then sets the queue's `watched` flag; if
//!   the flag was clear it lists the stream (under the list's lock) and wakes a parked
//!   poller;
//! - the poller removes a stream from its list only under the list's lock *and* the
//!   queue's lock, after seeing the queue empty, and clears the flag there; it parks only
//!   with an empty list, under the list's lock.
//!
//! So a push either lands before the poller's look (which then keeps the stream) or after
//! it (and then finds the flag clear and lists the stream again, waking the poller).

use std::collections::VecDeque;

use super::sync::{Arc, AtomicBool, AtomicU64, Condvar, Mutex, MutexGuard, Ordering};

/// One stream's items waiting for the poller, and whether the stream is on its list.
pub(crate) struct Pending<T> {
    items: Mutex<VecDeque<T>>,
    watched: AtomicBool,
}

impl<T> Default for Pending<T> {
    fn default() -> Pending<T> {
        Pending { items: Mutex::new(VecDeque::new()), watched: AtomicBool::new(false) }
    }
}

impl<T> Pending<T> {
    /// The queue, locked.
    pub(crate) fn lock(&self) -> MutexGuard<'_, VecDeque<T>> {
        self.items.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `item`; `when_first` runs under the lock when the queue was empty. Returns
    /// whether the stream must be listed ([`Watchlist::enlist`]): it was not on the list.
    pub(crate) fn push(&self, item: T, when_first: impl FnOnce()) -> bool {
        {
            let mut items = self.lock();
            if items.is_empty() {
                when_first();
            }
            items.push_back(item);
        }
        // After the push (see the module's protocol).
        !self.watched.swap(true, Ordering::SeqCst)
    }

    /// For the poller, under the list's lock: whether the stream stays listed (it has
    /// items); if not, its flag is cleared under the queue's lock.
    fn stays_listed(&self) -> bool {
        let items = self.lock();
        let keep = !items.is_empty();
        if !keep {
            self.watched.store(false, Ordering::SeqCst);
        }
        keep
    }
}

/// Something with a [`Pending`] queue (a stream).
pub(crate) trait HasPending<T> {
    /// Its queue.
    fn pending(&self) -> &Pending<T>;
}

/// The streams the poller watches, and its parking place.
pub(crate) struct Watchlist<S> {
    listed: Mutex<Listed<S>>,
    wake: Condvar,
    /// Bumped whenever a stream joins the list.
    generation: AtomicU64,
    /// Set (under the list's lock) to stop the poller.
    stop: AtomicBool,
}

/// The list under its lock.
pub(crate) struct Listed<S> {
    /// The streams with items (or that had items when last looked at).
    pub(crate) streams: Vec<Arc<S>>,
    /// The poller sleeps on the condition variable.
    pub(crate) parked: bool,
}

impl<S> Default for Watchlist<S> {
    fn default() -> Watchlist<S> {
        Watchlist {
            listed: Mutex::new(Listed { streams: Vec::new(), parked: false }),
            wake: Condvar::new(),
            generation: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        }
    }
}

impl<S> Watchlist<S> {
    /// The list, locked.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Listed<S>> {
        self.listed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lists `stream` (its [`Pending::push`] returned `true`) and wakes a parked poller.
    pub(crate) fn enlist(&self, stream: Arc<S>) {
        let mut listed = self.lock();
        listed.streams.push(stream);
        self.generation.fetch_add(1, Ordering::SeqCst);
        if listed.parked {
            self.wake.notify_one();
        }
    }

    /// Bumped whenever a stream joins the list (the poller rereads the list then).
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// For the poller: drops the streams whose queue is empty (clearing their flags).
    pub(crate) fn prune<T>(listed: &mut Listed<S>)
    where
        S: HasPending<T>,
    {
        listed.streams.retain(|stream| stream.pending().stays_listed());
    }

    /// For the poller, holding the list's lock with an empty list: sleeps until a stream
    /// is listed or [`Watchlist::stop`] (or spuriously); returns the lock again. Returns
    /// the guard at once when stopping.
    pub(crate) fn park<'a>(
        &'a self,
        listed: MutexGuard<'a, Listed<S>>,
    ) -> MutexGuard<'a, Listed<S>> {
        if self.stopping() {
            return listed;
        }
        let mut listed = listed;
        listed.parked = true;
        let mut woken = self.wake.wait(listed).unwrap_or_else(|p| p.into_inner());
        woken.parked = false;
        woken
    }

    /// Whether the poller is to stop.
    pub(crate) fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Tells the poller to stop and wakes it (under the list's lock, where it checks
    /// before parking).
    pub(crate) fn stop(&self) {
        let _listed = self.lock();
        self.stop.store(true, Ordering::SeqCst);
        self.wake.notify_all();
    }
}
