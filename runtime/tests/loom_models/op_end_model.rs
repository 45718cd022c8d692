//! Model check (loom) of how an async op ends: the very source of
//! `runtime/src/op_end.rs`, compiled here against loom's atomics, driven the way
//! `AsyncOp` drives it — the arm (on the poller) posts the op's job or, for an abandoned
//! op, only releases the word; the job's completion publishes; a second finisher races
//! it (a superseded prefetch job, or a failed post publishing an internal error); the
//! last reference's drop publishes -5030 for an op nobody finished. In every
//! interleaving (within 3 preemptions): the stream's word is released exactly once when
//! its doorbell was queued (never when nothing was), `*bytes_p` is written at most once,
//! and never for an abandoned op. The last case models the order the library had before
//! 2026-12-04 (the arm handed to the poller before the op was abandoned) and must fail.

/// The primitives `op_end.rs` is written against.
mod sync {
    pub(crate) use loom::sync::atomic;
}

#[path = "../../src/op_end.rs"]
mod op_end;

use loom::sync::Arc;
use loom::sync::atomic::{AtomicUsize, Ordering};
use op_end::OpEnd;

/// What the op did to the outside world; outlives the op.
#[derive(Default)]
struct Counts {
    /// Writes of `*bytes_p`.
    bytes_writes: AtomicUsize,
    /// Stores of the op's sequence into the stream's word.
    releases: AtomicUsize,
}

/// The parts of an op the protocol touches.
struct Op {
    end: OpEnd,
    counts: Arc<Counts>,
}

impl Op {
    fn new() -> (Arc<Op>, Arc<Counts>) {
        let counts = Arc::new(Counts::default());
        (Arc::new(Op { end: OpEnd::default(), counts: Arc::clone(&counts) }), counts)
    }

    /// `AsyncOp::publish` / `finish`: the one publication writes and releases.
    fn publish(&self) {
        if self.end.claim_publish() {
            self.counts.bytes_writes.fetch_add(1, Ordering::SeqCst);
            self.counts.releases.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// `AsyncOp::arm`: an abandoned op only releases; else its job runs and publishes.
fn arm(op: &Arc<Op>) -> Option<loom::thread::JoinHandle<()>> {
    if op.end.end_if_abandoned() {
        op.counts.releases.fetch_add(1, Ordering::SeqCst);
        return None;
    }
    let op = Arc::clone(op);
    Some(loom::thread::spawn(move || op.publish()))
}

impl Drop for Op {
    /// `AsyncOp`'s drop: an op nobody finished publishes (-5030), so the stream is
    /// released.
    fn drop(&mut self) {
        if self.end.unfinished() {
            self.publish();
        }
    }
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(f);
}

fn check(counts: &Counts, releases: usize, bytes_writes: usize) {
    assert_eq!(counts.releases.load(Ordering::SeqCst), releases, "releases of the word");
    assert_eq!(counts.bytes_writes.load(Ordering::SeqCst), bytes_writes, "writes of *bytes_p");
}

/// Runs the arm on its own thread (the poller), then joins it and the job it started.
fn arm_on_poller(op: &Arc<Op>) -> loom::thread::JoinHandle<()> {
    let op = Arc::clone(op);
    loom::thread::spawn(move || {
        if let Some(job) = arm(&op) {
            job.join().unwrap();
        }
    })
}

#[test]
fn a_submitted_op_publishes_once_whoever_finishes_first() {
    model(|| {
        let (op, counts) = Op::new();
        // The stream rings the doorbell: the poller arms the op and its job publishes;
        // a second finisher races them (a superseded prefetch job, or a post that failed
        // and publishes an internal error); the last reference may drop anywhere.
        let poller = arm_on_poller(&op);
        let racer = {
            let op = Arc::clone(&op);
            loom::thread::spawn(move || op.publish())
        };
        drop(op);
        poller.join().unwrap();
        racer.join().unwrap();
        check(&counts, 1, 1);
    });
}

#[test]
fn an_op_nobody_finishes_is_published_by_its_drop_once() {
    model(|| {
        // Its job was lost (an executor panicked): the drop publishes, racing a late
        // publication.
        let (op, counts) = Op::new();
        let late = {
            let op = Arc::clone(&op);
            loom::thread::spawn(move || op.publish())
        };
        drop(op);
        late.join().unwrap();
        check(&counts, 1, 1);
    });
}

#[test]
fn an_abandoned_op_is_only_released_by_its_arm() {
    model(|| {
        // The wait could not be queued: abandoned first, then the arm is handed to the
        // poller (the doorbell write was queued, so the stream rings it).
        let (op, counts) = Op::new();
        op.end.abandon();
        let poller = arm_on_poller(&op);
        drop(op);
        poller.join().unwrap();
        check(&counts, 1, 0);
    });
    model(|| {
        // Nothing was queued: abandoned, no arm; nothing releases or publishes.
        let (op, counts) = Op::new();
        op.end.abandon();
        drop(op);
        check(&counts, 0, 0);
    });
}

#[test]
#[should_panic(expected = "writes of *bytes_p")]
fn the_old_order_publishes_a_refused_op() {
    model(|| {
        // Before 2026-12-04: the arm was handed to the poller, then the op abandoned.
        let (op, counts) = Op::new();
        let poller = arm_on_poller(&op);
        op.end.abandon();
        drop(op);
        poller.join().unwrap();
        check(&counts, 1, 0);
    });
}
