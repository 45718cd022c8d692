//! How an async op ends ([`crate::async_op`]): published once (its result in `*bytes_p`
//! and the stream released), or abandoned (its submission was refused: nothing is
//! published, and an arm that still runs only releases the word its doorbell reached).
//!
//! The properties: **the stream's word is released exactly once** for every op whose
//! doorbell the stream rings, **`*bytes_p` is written at most once**, and **never for an
//! abandoned op**, whoever finishes first — the job's completion, a superseded prefetch
//! job, the arm, or the op's drop (which publishes `-5030` for an op nobody finished).
//! An op is abandoned before its arm can run (`enqueue_doorbell_arm` abandons before it
//! hands the arm to the poller), so the arm sees the abandonment or it never happens.
//! Written against its parent's `sync` facade and model-checked with loom
//! (`runtime/tests/loom_op_end.rs` includes this file with loom's atomics).

use super::sync::atomic::{AtomicBool, Ordering};

/// See the module.
#[derive(Debug, Default)]
pub(crate) struct OpEnd {
    abandoned: AtomicBool,
    ended: AtomicBool,
}

impl OpEnd {
    /// The submission was refused: the op publishes nothing. Called before the arm can
    /// run.
    pub(crate) fn abandon(&self) {
        self.abandoned.store(true, Ordering::SeqCst);
    }

    /// Whether the op was abandoned.
    pub(crate) fn is_abandoned(&self) -> bool {
        self.abandoned.load(Ordering::SeqCst)
    }

    /// At the arm: `true` when the op was abandoned — the caller then only releases the
    /// word, and the op counts as ended (nothing publishes or releases it again).
    pub(crate) fn end_if_abandoned(&self) -> bool {
        if self.is_abandoned() {
            self.ended.store(true, Ordering::SeqCst);
            return true;
        }
        false
    }

    /// Claims the op's one publication: `true` once, for the first caller, never for an
    /// abandoned op. The winner writes `*bytes_p` and releases the stream.
    pub(crate) fn claim_publish(&self) -> bool {
        !self.is_abandoned() && !self.ended.swap(true, Ordering::SeqCst)
    }

    /// Whether nobody published the op and it was not abandoned (its drop then publishes
    /// an internal error, so that the stream is released).
    pub(crate) fn unfinished(&self) -> bool {
        !self.ended.load(Ordering::SeqCst) && !self.is_abandoned()
    }
}
