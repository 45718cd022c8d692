//! Batch I/O bookkeeping: the entry slots of one batch, from submission to the report
//! of their status, with hipFile's limits and codes.
//!
//! A batch has room for `capacity` entries (1..=[`MAX_BATCH_ENTRIES`]). An entry takes a
//! slot when it is submitted and frees it when its status is reported (or when the batch
//! is cancelled). In between it is
//! - *queued*: accepted, no data moved yet;
//! - *running*: the engine started moving it (an entry may run as several parts);
//! - *done*: finished, waiting to be reported, in completion order.
//!
//! [`BatchLedger::cancel`] stops every entry that has not started (its parts refuse to
//! start), lets running ones finish, and forgets every entry of the batch: a cancelled
//! batch is empty and ready for a new submission once the entries that were moving data
//! have ended (`cancelled_in_flight` reaches 0). This is KvikIO's contract for a cuFile
//! batch (submit, then either wait for the status or cancel, then submit again).

use heapless::{Deque, Vec};

use crate::{Direction, OpError, Outcome};

/// Most entries one batch holds (hipFile's `IBatchContext::MAX_SIZE`).
pub const MAX_BATCH_ENTRIES: usize = 128;

/// `hipFileBatchMode_t::hipFileBatch`, the only mode.
pub const BATCH_MODE: i32 = 1;

/// `hipFileStatus_t`: the status of one batch entry (bit values, as hipFile's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum BatchStatus {
    /// Pending acceptance.
    Waiting = 1,
    /// Accepted and queued.
    Pending = 2,
    /// Rejected as invalid.
    Invalid = 4,
    /// Cancelled.
    Canceled = 8,
    /// Completed: the result is the byte count.
    Complete = 16,
    /// Timed out.
    Timeout = 32,
    /// Failed: the result is `-errno` or `-hipFileOpError`.
    Failed = 64,
}

/// The capacity `hipFileBatchIOSetUp` asks for, checked.
///
/// # Errors
/// `InvalidValue` for 0 or more than [`MAX_BATCH_ENTRIES`].
pub fn batch_capacity(max_nr: u32) -> Result<usize, OpError> {
    match usize::try_from(max_nr) {
        Ok(capacity @ 1..=MAX_BATCH_ENTRIES) => Ok(capacity),
        _ => Err(OpError::InvalidValue),
    }
}

/// The direction of an entry from its `mode` and `opcode` fields.
///
/// # Errors
/// `InvalidValue` for a mode other than [`BATCH_MODE`] or an opcode other than
/// `hipFileBatchRead` (0) / `hipFileBatchWrite` (1).
pub fn batch_direction(mode: i32, opcode: i32) -> Result<Direction, OpError> {
    match (mode, opcode) {
        (BATCH_MODE, 0) => Ok(Direction::Read),
        (BATCH_MODE, 1) => Ok(Direction::Write),
        _ => Err(OpError::InvalidValue),
    }
}

/// The reported status of a finished entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchEvent<C> {
    /// The caller's cookie, as submitted.
    pub cookie: C,
    /// `Complete` or `Failed`.
    pub status: BatchStatus,
    /// Bytes moved (`Complete`), or `-errno` / `-hipFileOpError` (`Failed`).
    pub result: i64,
}

impl<C> BatchEvent<C> {
    /// The event of an entry that ended with `outcome`.
    pub fn new(cookie: C, outcome: Outcome) -> BatchEvent<C> {
        let status = match outcome {
            Outcome::Bytes(_) => BatchStatus::Complete,
            Outcome::OsError(_) | Outcome::Library(_) => BatchStatus::Failed,
        };
        BatchEvent { cookie, status, result: outcome.bytes_p_value() }
    }
}

/// Index of an entry's slot in its batch.
pub type SlotIndex = u8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot<C> {
    Free,
    Queued { cookie: C, cancelled: bool },
    Running { cookie: C, cancelled: bool },
    Done(BatchEvent<C>),
}

/// The slots of one batch. `C` is the caller's cookie.
#[derive(Debug)]
pub struct BatchLedger<C> {
    slots: [Slot<C>; MAX_BATCH_ENTRIES],
    capacity: usize,
    free: Vec<SlotIndex, MAX_BATCH_ENTRIES>,
    done: Deque<SlotIndex, MAX_BATCH_ENTRIES>,
    in_flight: usize,
    cancelled_in_flight: usize,
}

impl<C: Copy> BatchLedger<C> {
    /// An empty batch of `capacity` entries (from [`batch_capacity`]; larger values are
    /// cut to [`MAX_BATCH_ENTRIES`]).
    pub fn new(capacity: usize) -> BatchLedger<C> {
        let capacity = capacity.min(MAX_BATCH_ENTRIES);
        let mut free = Vec::new();
        // Handed out from the end: slot 0 first.
        for index in (0..capacity).rev() {
            let _ = free.push(index as SlotIndex);
        }
        BatchLedger {
            slots: [Slot::Free; MAX_BATCH_ENTRIES],
            capacity,
            free,
            done: Deque::new(),
            in_flight: 0,
            cancelled_in_flight: 0,
        }
    }

    /// Entries the batch can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Entries submitted and not yet reported or cancelled.
    pub fn outstanding(&self) -> usize {
        self.capacity - self.free.len()
    }

    /// Entries finished and waiting to be reported.
    pub fn ready(&self) -> usize {
        self.done.len()
    }

    /// Entries queued or running (cancelled ones included).
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Cancelled entries that have not ended yet.
    pub fn cancelled_in_flight(&self) -> usize {
        self.cancelled_in_flight
    }

    /// Takes one slot per cookie, all or none, and returns them in order.
    ///
    /// # Errors
    /// `InvalidValue` when fewer slots are free than cookies given (hipFile: `nr >
    /// capacity - outstanding`); nothing is taken then.
    pub fn reserve(
        &mut self,
        cookies: impl ExactSizeIterator<Item = C>,
    ) -> Result<Vec<SlotIndex, MAX_BATCH_ENTRIES>, OpError> {
        if cookies.len() > self.free.len() {
            return Err(OpError::InvalidValue);
        }
        let mut taken = Vec::new();
        for cookie in cookies {
            let index = self.free.pop().ok_or(OpError::InvalidValue)?;
            self.slots[usize::from(index)] = Slot::Queued { cookie, cancelled: false };
            self.in_flight += 1;
            let _ = taken.push(index);
        }
        Ok(taken)
    }

    /// A part of entry `index` is about to move data: `true` when it may (the entry is
    /// now running), `false` when the entry was cancelled (the part must end without
    /// touching memory or the file) or the slot holds no entry in flight.
    pub fn start(&mut self, index: SlotIndex) -> bool {
        let slot = &mut self.slots[usize::from(index)];
        match *slot {
            Slot::Queued { cookie, cancelled: false } => {
                *slot = Slot::Running { cookie, cancelled: false };
                true
            }
            Slot::Running { cancelled, .. } => !cancelled,
            _ => false,
        }
    }

    /// Entry `index` ended with `outcome` (every part of it). A cancelled entry frees
    /// its slot; any other becomes ready to report. Ignored for a slot holding no entry
    /// in flight.
    pub fn finish(&mut self, index: SlotIndex, outcome: Outcome) {
        let slot = &mut self.slots[usize::from(index)];
        let (cookie, cancelled) = match *slot {
            Slot::Queued { cookie, cancelled } | Slot::Running { cookie, cancelled } => {
                (cookie, cancelled)
            }
            Slot::Free | Slot::Done(_) => return,
        };
        self.in_flight -= 1;
        if cancelled {
            *slot = Slot::Free;
            self.cancelled_in_flight -= 1;
            let _ = self.free.push(index);
        } else {
            *slot = Slot::Done(BatchEvent::new(cookie, outcome));
            let _ = self.done.push_back(index);
        }
    }

    /// Cancels the batch: entries in flight are marked (queued ones will not start,
    /// running ones stop at their next part and free their slots when they end), and
    /// finished, unreported entries are forgotten. Returns the entries still in flight.
    pub fn cancel(&mut self) -> usize {
        for slot in &mut self.slots[..self.capacity] {
            match slot {
                Slot::Queued { cancelled, .. } | Slot::Running { cancelled, .. } if !*cancelled => {
                    *cancelled = true;
                    self.cancelled_in_flight += 1;
                }
                _ => {}
            }
        }
        while let Some(index) = self.done.pop_front() {
            self.slots[usize::from(index)] = Slot::Free;
            let _ = self.free.push(index);
        }
        self.cancelled_in_flight
    }

    /// Reports (and frees) the oldest finished entry, if any.
    pub fn pop(&mut self) -> Option<BatchEvent<C>> {
        let index = self.done.pop_front()?;
        let slot = core::mem::replace(&mut self.slots[usize::from(index)], Slot::Free);
        let _ = self.free.push(index);
        match slot {
            Slot::Done(event) => Some(event),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use std::collections::{BTreeMap, BTreeSet};
    use std::vec::Vec as StdVec;

    use proptest::prelude::*;

    use super::*;

    #[test]
    fn capacity_and_direction_follow_hipfile() {
        assert_eq!(batch_capacity(0), Err(OpError::InvalidValue));
        assert_eq!(batch_capacity(1), Ok(1));
        assert_eq!(batch_capacity(128), Ok(128));
        assert_eq!(batch_capacity(129), Err(OpError::InvalidValue));
        assert_eq!(batch_capacity(u32::MAX), Err(OpError::InvalidValue));
        assert_eq!(batch_direction(1, 0), Ok(Direction::Read));
        assert_eq!(batch_direction(1, 1), Ok(Direction::Write));
        assert_eq!(batch_direction(0, 0), Err(OpError::InvalidValue));
        assert_eq!(batch_direction(1, 2), Err(OpError::InvalidValue));
        assert_eq!(batch_direction(1, -1), Err(OpError::InvalidValue));
    }

    #[test]
    fn events_carry_bytes_or_the_negative_code() {
        let complete = BatchEvent::new(7u32, Outcome::Bytes(4096));
        assert_eq!((complete.status, complete.result), (BatchStatus::Complete, 4096));
        let os = BatchEvent::new(7u32, Outcome::OsError(5));
        assert_eq!((os.status, os.result), (BatchStatus::Failed, -5));
        let library = BatchEvent::new(7u32, Outcome::Library(OpError::HipDriverError));
        assert_eq!((library.status, library.result), (BatchStatus::Failed, -5011));
    }

    #[test]
    fn submission_is_all_or_nothing() {
        let mut ledger = BatchLedger::<u32>::new(4);
        assert_eq!(ledger.reserve([1, 2, 3].into_iter()).map(|s| s.len()), Ok(3));
        assert_eq!(ledger.reserve([4, 5].into_iter()), Err(OpError::InvalidValue));
        assert_eq!(ledger.outstanding(), 3, "a refused submission takes nothing");
        assert_eq!(ledger.reserve([4].into_iter()).map(|s| s.len()), Ok(1));
    }

    #[test]
    fn a_cancelled_entry_never_starts_and_its_slot_returns() {
        let mut ledger = BatchLedger::<u32>::new(2);
        let slots = ledger.reserve([1, 2].into_iter()).unwrap();
        assert!(ledger.start(slots[0]));
        assert_eq!(ledger.cancel(), 2);
        assert!(!ledger.start(slots[1]), "queued: refused");
        assert!(!ledger.start(slots[0]), "running: its next part is refused");
        ledger.finish(slots[1], Outcome::OsError(125));
        ledger.finish(slots[0], Outcome::Bytes(10));
        assert_eq!(
            (ledger.cancelled_in_flight(), ledger.outstanding(), ledger.pop()),
            (0, 0, None)
        );
    }

    #[derive(Clone, Debug)]
    enum Step {
        Submit(usize),
        Start(usize),
        Finish(usize, bool),
        Cancel,
        Pop,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0usize..6).prop_map(Step::Submit),
            (0usize..MAX_BATCH_ENTRIES).prop_map(Step::Start),
            ((0usize..MAX_BATCH_ENTRIES), any::<bool>()).prop_map(|(i, ok)| Step::Finish(i, ok)),
            Just(Step::Cancel),
            Just(Step::Pop),
        ]
    }

    proptest! {
        /// Against a model: every submitted cookie is reported exactly once, with the
        /// outcome it finished with, unless a cancel came first; a cancelled entry never
        /// starts again and is never reported; the slot count always adds up.
        #[test]
        fn every_entry_is_reported_once_or_cancelled(
            capacity in 1usize..10,
            steps in proptest::collection::vec(step(), 1..200),
        ) {
            let mut ledger = BatchLedger::<u32>::new(capacity);
            let mut next_cookie = 0u32;
            // slot -> (cookie, cancelled) for entries in flight.
            let mut in_flight: BTreeMap<SlotIndex, (u32, bool)> = BTreeMap::new();
            let mut finished: StdVec<(u32, i64)> = StdVec::new();
            let mut reported = BTreeSet::new();
            for step in steps {
                match step {
                    Step::Submit(n) => {
                        let cookies: StdVec<u32> = (next_cookie..next_cookie + n as u32).collect();
                        let fits = n <= capacity - ledger.outstanding();
                        match ledger.reserve(cookies.iter().copied()) {
                            Ok(slots) => {
                                prop_assert!(fits);
                                next_cookie += n as u32;
                                for (slot, cookie) in slots.iter().zip(cookies) {
                                    prop_assert!(in_flight.insert(*slot, (cookie, false)).is_none());
                                }
                            }
                            Err(_) => prop_assert!(!fits),
                        }
                    }
                    Step::Start(i) => {
                        let Some((&slot, &(_, cancelled))) = in_flight.iter().nth(i % in_flight.len().max(1)) else { continue };
                        prop_assert_eq!(ledger.start(slot), !cancelled);
                    }
                    Step::Finish(i, ok) => {
                        let Some((&slot, &(cookie, cancelled))) = in_flight.iter().nth(i % in_flight.len().max(1)) else { continue };
                        in_flight.remove(&slot);
                        let outcome = if ok { Outcome::Bytes(u64::from(cookie)) } else { Outcome::OsError(5) };
                        ledger.finish(slot, outcome);
                        if !cancelled {
                            finished.push((cookie, outcome.bytes_p_value()));
                        }
                    }
                    Step::Cancel => {
                        for entry in in_flight.values_mut() {
                            entry.1 = true;
                        }
                        finished.clear();
                        let expected = in_flight.len();
                        prop_assert_eq!(ledger.cancel(), expected);
                    }
                    Step::Pop => match ledger.pop() {
                        Some(event) => {
                            prop_assert!(!finished.is_empty(), "nothing was waiting");
                            let (cookie, result) = finished.remove(0);
                            prop_assert_eq!((event.cookie, event.result), (cookie, result));
                            prop_assert!(reported.insert(cookie), "reported twice");
                        }
                        None => prop_assert!(finished.is_empty()),
                    },
                }
                prop_assert_eq!(ledger.in_flight(), in_flight.len());
                prop_assert_eq!(ledger.ready(), finished.len());
                prop_assert_eq!(ledger.outstanding(), in_flight.len() + finished.len());
                prop_assert!(ledger.outstanding() <= capacity);
            }
        }
    }
}
