//! What an executor knows about its copies' events without asking the device: events
//! recorded on one internal stream complete in the order they were recorded
//! ([`DeviceEvents`](crate::device::DeviceEvents)), so one answer speaks for many.
//!
//! - an event found complete means every event recorded before it on its stream is;
//! - an event found pending means every event recorded after it is, for the moment.
//!
//! An executor holds up to a staging arena's worth of copies in flight (32 chunks of its
//! jobs at the default sizes), and every job waiting for one polled its own event in
//! every turn of the reactor: on an H100 at 37 GiB/s of 16 MiB reads, a quarter of the
//! executors' CPU was CUDA's event query, most of it spinning inside the driver while
//! fourteen executors queried at once (`benches/results/h100-2026-12-06-g`). With the
//! order known, a turn asks about the oldest pending event of each stream and answers
//! the rest from it. Measured there: the query's share fell to 15.5 %; throughput did
//! not move (the polls filled time in which all the executor's jobs waited anyway).

use std::time::{Duration, Instant};

use crate::device::EventHandle;

/// How long a pending answer stands for the events recorded after it. The waiter of the
/// event that got it asks again in its next turn (so the answer is usually replaced within
/// one turn); the bound is for when that waiter is not polling (a job's copies in flight
/// while it reads on), after which later waiters ask for themselves.
const PENDING_ANSWER_STANDS: Duration = Duration::from_micros(20);

/// An event an executor recorded after a copy on one of its internal streams, with its
/// place in that stream's order.
pub(super) struct CopyEvent {
    pub(super) handle: EventHandle,
    /// The stream's identity ([`InternalStream::raw`](crate::device::InternalStream::raw)).
    stream: usize,
    /// 1, 2, ... in the order of recording on the stream.
    seq: u64,
}

/// The order of the events recorded on each of an executor's internal streams, and what
/// the device last said about them. An executor has one internal stream per device, so
/// a short list searched in order serves (asked in every poll of a copy, where hashing
/// the key cost more than the search).
#[derive(Default)]
pub(super) struct EventOrder {
    streams: Vec<StreamOrder>,
}

struct StreamOrder {
    /// The stream's identity.
    stream: usize,
    /// The seq the next recorded event gets, less one.
    recorded: u64,
    /// Every event up to this seq is complete.
    complete_through: u64,
    /// The oldest event found pending, and when.
    pending: Option<(u64, Instant)>,
}

impl EventOrder {
    /// `handle` was just recorded on `stream` (after every event recorded on it before).
    pub(super) fn recorded(&mut self, stream: usize, handle: EventHandle) -> CopyEvent {
        let index = match self.streams.iter().position(|order| order.stream == stream) {
            Some(index) => index,
            None => {
                let order = StreamOrder { stream, recorded: 0, complete_through: 0, pending: None };
                self.streams.push(order);
                self.streams.len() - 1
            }
        };
        let order = &mut self.streams[index];
        order.recorded += 1;
        CopyEvent { handle, stream, seq: order.recorded }
    }

    /// What is known of `event` at `now` without asking the device: `Some(true)` complete,
    /// `Some(false)` pending (an older event was pending a moment ago), `None` unknown.
    pub(super) fn known(&self, event: &CopyEvent, now: Instant) -> Option<bool> {
        let order = self.streams.iter().find(|order| order.stream == event.stream)?;
        if event.seq <= order.complete_through {
            return Some(true);
        }
        match order.pending {
            Some((seq, at)) if seq < event.seq && fresh(at, now) => Some(false),
            _ => None,
        }
    }

    /// The device said at `now` whether `event` is complete.
    pub(super) fn observed(&mut self, event: &CopyEvent, complete: bool, now: Instant) {
        let Some(order) = self.streams.iter_mut().find(|order| order.stream == event.stream) else {
            return;
        };
        if complete {
            order.complete_through = order.complete_through.max(event.seq);
            if order.pending.is_some_and(|(seq, _)| seq <= event.seq) {
                order.pending = None;
            }
        } else {
            let older_pending =
                order.pending.is_some_and(|(seq, at)| seq < event.seq && fresh(at, now));
            if !older_pending {
                order.pending = Some((event.seq, now));
            }
        }
    }
}

fn fresh(at: Instant, now: Instant) -> bool {
    now.saturating_duration_since(at) < PENDING_ANSWER_STANDS
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn recorded(order: &mut EventOrder, stream: usize, n: usize) -> Vec<CopyEvent> {
        (0..n).map(|i| order.recorded(stream, EventHandle::from_raw(stream * 100 + i))).collect()
    }

    #[test]
    fn nothing_is_known_before_the_device_answered() {
        let mut order = EventOrder::default();
        let events = recorded(&mut order, 1, 3);
        let now = Instant::now();
        assert!(events.iter().all(|e| order.known(e, now).is_none()));
    }

    #[test]
    fn a_complete_event_completes_the_ones_recorded_before_it_on_its_stream_only() {
        let mut order = EventOrder::default();
        let a = recorded(&mut order, 1, 4);
        let b = recorded(&mut order, 2, 2);
        let now = Instant::now();
        order.observed(&a[2], true, now);
        assert_eq!(order.known(&a[0], now), Some(true));
        assert_eq!(order.known(&a[1], now), Some(true));
        assert_eq!(order.known(&a[2], now), Some(true));
        assert_eq!(order.known(&a[3], now), None);
        assert_eq!(order.known(&b[0], now), None);
        // An older answer arriving later does not move the mark back.
        order.observed(&a[0], true, now);
        assert_eq!(order.known(&a[2], now), Some(true));
    }

    #[test]
    fn a_pending_event_holds_later_ones_pending_for_a_moment_only() {
        let mut order = EventOrder::default();
        let a = recorded(&mut order, 1, 4);
        let now = Instant::now();
        order.observed(&a[1], false, now);
        // Older and equal ones still ask; later ones are pending for the moment.
        assert_eq!(order.known(&a[0], now), None);
        assert_eq!(order.known(&a[1], now), None);
        assert_eq!(order.known(&a[2], now), Some(false));
        assert_eq!(order.known(&a[3], now), Some(false));
        let later = now + PENDING_ANSWER_STANDS;
        assert_eq!(order.known(&a[3], later), None, "a stale answer makes waiters ask again");
    }

    #[test]
    fn the_oldest_pending_answer_is_the_one_kept() {
        let mut order = EventOrder::default();
        let a = recorded(&mut order, 1, 4);
        let now = Instant::now();
        order.observed(&a[2], false, now);
        order.observed(&a[0], false, now);
        assert_eq!(order.known(&a[1], now), Some(false));
        // A later event's pending answer does not replace an older fresh one.
        order.observed(&a[3], false, now);
        assert_eq!(order.known(&a[1], now), Some(false));
    }

    #[test]
    fn completing_the_pending_event_lets_the_later_ones_ask() {
        let mut order = EventOrder::default();
        let a = recorded(&mut order, 1, 3);
        let now = Instant::now();
        order.observed(&a[0], false, now);
        assert_eq!(order.known(&a[2], now), Some(false));
        order.observed(&a[0], true, now);
        assert_eq!(order.known(&a[0], now), Some(true));
        assert_eq!(order.known(&a[2], now), None);
    }

    #[test]
    fn an_answer_about_a_later_event_clears_an_older_pending_one() {
        let mut order = EventOrder::default();
        let a = recorded(&mut order, 1, 3);
        let now = Instant::now();
        order.observed(&a[0], false, now);
        // Found complete after all (the pending answer was stale when it asked).
        order.observed(&a[2], true, now + PENDING_ANSWER_STANDS);
        assert_eq!(order.known(&a[1], now + PENDING_ANSWER_STANDS), Some(true));
        assert_eq!(order.known(&a[0], now + PENDING_ANSWER_STANDS), Some(true));
    }

    proptest! {
        /// Against a model stream that completes its events in order as time passes: an
        /// event known complete is complete, and one known pending was pending at most
        /// `PENDING_ANSWER_STANDS` before, whatever the order of recording and asking.
        #[test]
        fn what_is_known_agrees_with_the_device(
            steps in proptest::collection::vec((0u8..3, 0usize..2, 0usize..16, 0u64..8), 1..200),
        ) {
            let start = Instant::now();
            let mut order = EventOrder::default();
            let mut events: Vec<Vec<CopyEvent>> = vec![Vec::new(), Vec::new()];
            // Per stream: how many of its events the device has completed, and when each did.
            let mut completed = [0usize; 2];
            let mut completed_at: Vec<Vec<u64>> = vec![Vec::new(), Vec::new()];
            let mut clock_us = 0u64;
            for (action, stream, pick, advance_us) in steps {
                clock_us += advance_us;
                let now = start + Duration::from_micros(clock_us);
                match action {
                    0 => {
                        let handle = EventHandle::from_raw(events[stream].len());
                        events[stream].push(order.recorded(stream + 1, handle));
                    }
                    1 if completed[stream] < events[stream].len() => {
                        completed[stream] += 1;
                        completed_at[stream].push(clock_us);
                    }
                    _ if !events[stream].is_empty() => {
                        let index = pick % events[stream].len();
                        let event = &events[stream][index];
                        let truth = index < completed[stream];
                        match order.known(event, now) {
                            Some(true) => prop_assert!(truth, "known complete but pending"),
                            Some(false) if truth => {
                                // Completed since the pending answer: only just.
                                let when = completed_at[stream][index];
                                prop_assert!(clock_us - when < PENDING_ANSWER_STANDS.as_micros() as u64);
                            }
                            Some(false) => {}
                            None => order.observed(event, truth, now),
                        }
                    }
                    _ => {}
                }
            }
        }
    }
}
