//! Model check (loom) of the hand-off between submitters and the arm poller: the very
//! source of `runtime/src/arm_handoff.rs`, compiled here against loom's primitives, under
//! every interleaving loom explores. Properties: every item pushed is taken by the poller
//! exactly once, in each stream's order, and the poller never parks while an item waits
//! (loom fails a model in which every thread blocks: a stranded op would be exactly
//! that). The poller below has the real loop's shape (`runtime/src/arm.rs`,
//! `poll_doorbells`): copy the list under its lock, take items under each queue's lock
//! only, then prune under the list's lock and park when the list is empty.

/// The primitives `arm_handoff.rs` is written against.
mod sync {
    pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    pub(crate) use loom::sync::{Arc, Condvar, Mutex, MutexGuard};
}

#[path = "../../src/arm_handoff.rs"]
#[allow(dead_code)]
mod handoff;

use handoff::{HasPending, Pending, Watchlist};
use sync::Arc;

struct Stream {
    pending: Pending<u32>,
}

impl HasPending<u32> for Stream {
    fn pending(&self) -> &Pending<u32> {
        &self.pending
    }
}

fn stream() -> Arc<Stream> {
    Arc::new(Stream { pending: Pending::default() })
}

/// A submitter's side of `ArmPoller::watch`.
fn submit(list: &Watchlist<Stream>, stream: &Arc<Stream>, item: u32) {
    if stream.pending.push(item, || {}) {
        list.enlist(Arc::clone(stream));
    }
}

/// The poller's loop until it has taken `expected` items (or is stopped); what it took,
/// in order.
fn poll(list: &Watchlist<Stream>, expected: usize) -> Vec<u32> {
    let mut taken = Vec::new();
    let mut copied: Vec<Arc<Stream>> = Vec::new();
    loop {
        // Every item is due at once here, so no queue keeps items after a look and the
        // real loop's "nothing waiting, or the list changed" always holds: it reads the
        // list again each round.
        for stream in &copied {
            taken.extend(stream.pending.lock().drain(..));
        }
        if taken.len() == expected {
            return taken;
        }
        let mut listed = list.lock();
        Watchlist::prune(&mut listed);
        if listed.streams.is_empty() {
            if list.stopping() {
                return taken;
            }
            copied.clear();
            drop(list.park(listed));
            continue;
        }
        copied = listed.streams.clone();
        let _ = list.generation();
    }
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(f);
}

#[test]
fn one_stream_emptied_and_refilled_while_the_poller_prunes_and_parks() {
    model(|| {
        let list = Arc::new(Watchlist::<Stream>::default());
        let one = stream();
        let submitter = {
            let (list, one) = (Arc::clone(&list), Arc::clone(&one));
            loom::thread::spawn(move || {
                submit(&list, &one, 1);
                submit(&list, &one, 2);
            })
        };
        let taken = poll(&list, 2);
        submitter.join().unwrap();
        assert_eq!(taken, vec![1, 2], "each item once, in order");
    });
}

#[test]
fn two_streams_from_two_threads() {
    model(|| {
        let list = Arc::new(Watchlist::<Stream>::default());
        let submitters: Vec<_> = (0..2u32)
            .map(|index| {
                let (list, own) = (Arc::clone(&list), stream());
                loom::thread::spawn(move || submit(&list, &own, index))
            })
            .collect();
        let mut taken = poll(&list, 2);
        for submitter in submitters {
            submitter.join().unwrap();
        }
        taken.sort_unstable();
        assert_eq!(taken, vec![0, 1], "each item once");
    });
}

#[test]
fn stop_wakes_a_parked_poller() {
    model(|| {
        let list = Arc::new(Watchlist::<Stream>::default());
        let stopper = {
            let list = Arc::clone(&list);
            loom::thread::spawn(move || list.stop())
        };
        assert!(poll(&list, 1).is_empty(), "nothing was pushed");
        stopper.join().unwrap();
    });
}
