//! Model check (loom) of an async read's prefetch gate: the very source of
//! `runtime/src/op_gate.rs`, compiled here against loom's primitives. A deferred
//! prefetch starts on one thread while the stream reaches the op (the arm) on another,
//! or while the op is abandoned. In every interleaving (within 3 preemptions): the data
//! is copied exactly once (by the prefetch's job when the arm opens its gate, else by the
//! job the arm posts), and the prefetch's job never waits on a gate nobody will open or
//! close (loom fails a model in which every thread blocks).

/// The primitives `op_gate.rs` is written against.
mod sync {
    pub(crate) use loom::sync::{Mutex, MutexGuard};
}

#[path = "../../src/op_gate.rs"]
mod op_gate;

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::{Arc, Condvar, Mutex};
use op_gate::OpGate;

/// A one-message channel whose receiver sees the sender's drop (as flume's does; loom's
/// own channel does not model disconnection).
struct Signal {
    state: Mutex<(Option<bool>, bool)>,
    changed: Condvar,
}

struct Sender(Arc<Signal>);

impl Sender {
    fn send(&self, open: bool) {
        self.0.state.lock().unwrap().0 = Some(open);
        self.0.changed.notify_all();
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        self.0.state.lock().unwrap().1 = true;
        self.0.changed.notify_all();
    }
}

/// The message, or `None` once the sender is gone without one.
fn receive(signal: &Signal) -> Option<bool> {
    let mut state = signal.state.lock().unwrap();
    loop {
        if let Some(open) = state.0 {
            return Some(open);
        }
        if state.1 {
            return None;
        }
        state = signal.changed.wait(state).unwrap();
    }
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(f);
}

/// The deferred prefetch's side: start through the gate, then the job: stage, wait on
/// the gate, copy if opened. Returns whether it started.
fn deferred_prefetch(gate: &OpGate<Sender>, copies: &AtomicUsize) -> bool {
    let signal = Arc::new(Signal { state: Mutex::new((None, false)), changed: Condvar::new() });
    let started = gate.start_prefetch(|| Some((Sender(Arc::clone(&signal)), 1)));
    if started && receive(&signal) == Some(true) {
        copies.fetch_add(1, Ordering::SeqCst);
    }
    started
}

/// The arm's side: open the running prefetch's gate (or, when the data is stale, close
/// it and copy afresh), or copy afresh when no prefetch runs.
fn arm(gate: &OpGate<Sender>, copies: &AtomicUsize, prefetch_fresh: bool) {
    match gate.reach() {
        Some((sender, parts)) => {
            assert_eq!(parts, 1);
            sender.send(prefetch_fresh);
            if !prefetch_fresh {
                copies.fetch_add(1, Ordering::SeqCst);
            }
        }
        None => {
            copies.fetch_add(1, Ordering::SeqCst);
        }
    }
}

fn prefetch_against_the_arm(prefetch_fresh: bool) {
    model(move || {
        let gate = Arc::new(OpGate::<Sender>::default());
        let copies = Arc::new(AtomicUsize::new(0));
        let prefetcher = {
            let (gate, copies) = (Arc::clone(&gate), Arc::clone(&copies));
            loom::thread::spawn(move || deferred_prefetch(&gate, &copies))
        };
        arm(&gate, &copies, prefetch_fresh);
        prefetcher.join().unwrap();
        assert_eq!(copies.load(Ordering::SeqCst), 1, "the data is copied exactly once");
        assert!(gate.reached());
    });
}

#[test]
fn a_deferred_prefetch_against_the_arm_copies_once() {
    prefetch_against_the_arm(true);
}

#[test]
fn a_stale_prefetch_against_the_arm_copies_once() {
    prefetch_against_the_arm(false);
}

#[test]
fn an_abandoned_op_never_copies_and_never_strands_a_prefetch() {
    model(|| {
        let gate = Arc::new(OpGate::<Sender>::default());
        let copies = Arc::new(AtomicUsize::new(0));
        let prefetcher = {
            let (gate, copies) = (Arc::clone(&gate), Arc::clone(&copies));
            loom::thread::spawn(move || deferred_prefetch(&gate, &copies))
        };
        gate.abandon();
        prefetcher.join().unwrap();
        assert_eq!(copies.load(Ordering::SeqCst), 0, "nothing of an abandoned op is copied");
        // An arm after the abandonment finds no prefetch and nothing to open.
        assert!(gate.reach().is_none());
        assert!(!gate.start_prefetch(|| panic!("no prefetch after abandonment")));
    });
}
