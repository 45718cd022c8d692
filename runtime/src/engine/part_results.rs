//! The results of a request split into parts over several executors
//! ([`super::PartJoiner`]): each part records its result once, from its executor's
//! thread, and **exactly one** of them — the last to finish, whichever it is — gets every
//! result back, in part order, to combine and publish. Written against its parent's
//! `sync` facade and model-checked with loom (`runtime/tests/loom_part_results.rs`
//! includes this file with loom's primitives).

use super::sync::Mutex;

/// See the module.
pub(crate) struct PartResults<R> {
    slots: Mutex<(Vec<Option<R>>, usize)>,
}

impl<R> PartResults<R> {
    /// Room for `parts` results.
    pub(crate) fn new(parts: usize) -> PartResults<R> {
        PartResults { slots: Mutex::new(((0..parts).map(|_| None).collect(), parts)) }
    }

    /// Records part `index`'s result; returns all of them, in part order, to the part
    /// that completed the set (`None` to every other, and to a part recorded twice).
    pub(crate) fn record(&self, index: usize, result: R) -> Option<Vec<R>> {
        let mut guard = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let (slots, missing) = &mut *guard;
        let slot = slots.get_mut(index)?;
        if slot.is_some() {
            return None;
        }
        *slot = Some(result);
        *missing -= 1;
        if *missing > 0 {
            return None;
        }
        std::mem::take(slots).into_iter().collect()
    }
}
