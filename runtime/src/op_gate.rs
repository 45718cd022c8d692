//! The prefetch gate of an async read ([`crate::async_op`]): a prefetch of a fully FIXED
//! read starts before its stream reaches the op (at submission, or later when the
//! stream's prefetch window has room), and its jobs stage the data and then wait on the
//! gate before copying to the device. The stream reaching the op (the arm) opens the gate
//! (or tells the jobs to drop what they staged, when the file changed); an op that was
//! never submitted closes it.
//!
//! The property: **a prefetch never starts after the arm** (its jobs would wait on a
//! gate nobody opens, holding an executor and the op), and a prefetch that started
//! before the arm is always found by it. Both sides take the gate's one lock, so the
//! arm either comes first (and the start is refused) or finds the prefetch's sender.
//! Written against its parent's `sync` facade and model-checked with loom
//! (`runtime/tests/loom_op_gate.rs` includes this file with loom's primitives).

use super::sync::Mutex;

/// Where the op stands, as the gate sees it.
enum GateState<S> {
    /// Submitted, not reached, no prefetch running.
    Waiting,
    /// A prefetch of `parts` jobs waits on `sender`.
    Prefetching { sender: S, parts: usize },
    /// The stream reached the op: no prefetch may start any more.
    Reached,
    /// The op was not submitted: no prefetch may start.
    Abandoned,
}

/// See the module.
pub(crate) struct OpGate<S> {
    state: Mutex<GateState<S>>,
}

impl<S> Default for OpGate<S> {
    fn default() -> OpGate<S> {
        OpGate { state: Mutex::new(GateState::Waiting) }
    }
}

impl<S> OpGate<S> {
    fn lock(&self) -> super::sync::MutexGuard<'_, GateState<S>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A prefetch starts: `start` (run under the gate's lock) prepares it and returns the
    /// sender its jobs wait on and their count, or `None` to start nothing. Returns
    /// whether the prefetch started: `false` (and `start` not run) once the stream reached
    /// the op, the op was abandoned, or another prefetch runs.
    pub(crate) fn start_prefetch(&self, start: impl FnOnce() -> Option<(S, usize)>) -> bool {
        let mut state = self.lock();
        if !matches!(*state, GateState::Waiting) {
            return false;
        }
        match start() {
            Some((sender, parts)) => {
                *state = GateState::Prefetching { sender, parts };
                true
            }
            None => false,
        }
    }

    /// The stream reached the op: the running prefetch's sender and job count, if any
    /// (the caller opens the gate with them, or tells the jobs to drop their data).
    /// Prefetches cannot start after this.
    pub(crate) fn reach(&self) -> Option<(S, usize)> {
        let mut state = self.lock();
        match std::mem::replace(&mut *state, GateState::Reached) {
            GateState::Prefetching { sender, parts } => Some((sender, parts)),
            GateState::Abandoned => {
                *state = GateState::Abandoned;
                None
            }
            GateState::Waiting | GateState::Reached => None,
        }
    }

    /// Whether the stream reached the op.
    pub(crate) fn reached(&self) -> bool {
        matches!(*self.lock(), GateState::Reached)
    }

    /// The op was not submitted: a running prefetch's sender is dropped (its jobs see the
    /// gate disconnect and end without copying), and no prefetch can start.
    pub(crate) fn abandon(&self) {
        let previous = std::mem::replace(&mut *self.lock(), GateState::Abandoned);
        drop(previous);
    }
}
