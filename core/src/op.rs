//! The life of one asynchronous op, as one state machine.
//!
//! ```text
//!             Prefetch (all FIXED read)
//!  Submitted ───────────────────────────▶ Prefetching ──Arm──▶ Running
//!      │  Arm                                  │ Fail             │ Transferred(n) ↺
//!      ▼                                       ▼                  │ Finish / Fail
//!    Armed ──Start──▶ Running ──Finish──▶ Done(outcome) ◀─────────┘
//!      │ Fail           │ Fail                 │ Arm (if not yet armed)  ↺
//!      └────────────────┴──────────────▶ Done  │ Publish (once armed)
//!  Submitted ──BindFailed──▶ Done(-5022)       ▼
//!                                          Published (terminal)
//!  Running ──Restage──▶ Running   (a prefetch found stale at arm is read again)
//!  any state but Published ──Abort──▶ Published(-5030)   (the op dropped unfinished)
//! ```
//!
//! The stream reaches the op exactly once (`Arm` or `BindFailed`); the result is
//! published (`*bytes_p` stored, release word written) exactly once, and only after the
//! stream has reached the op, so a prefetch that fails early still publishes in order.

use crate::OpError;

/// Read (file → device) or write (device → file).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// File to device memory.
    Read,
    /// Device memory to file.
    Write,
}

/// How an op ended: what goes into `*bytes_p`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Success: the byte count (short at end of file).
    Bytes(u64),
    /// An OS error: `*bytes_p = -errno`.
    OsError(i32),
    /// A library error: `*bytes_p = -code` (e.g. -5022 for an invalid deferred value).
    Library(OpError),
}

impl Outcome {
    /// The `ssize_t` value published in `*bytes_p`.
    pub const fn bytes_p_value(self) -> i64 {
        match self {
            // Byte counts are at most 2^31 (the max-I/O clamp); saturate defensively.
            Outcome::Bytes(n) => {
                if n > i64::MAX as u64 {
                    i64::MAX
                } else {
                    n as i64
                }
            }
            Outcome::OsError(errno) => -(errno.unsigned_abs() as i64),
            Outcome::Library(code) => code.negated(),
        }
    }

    /// `true` for [`Outcome::Bytes`].
    pub const fn is_success(self) -> bool {
        matches!(self, Outcome::Bytes(_))
    }
}

/// Where an op is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpState {
    /// Accepted and enqueued on the user stream; the stream has not reached it.
    Submitted,
    /// A fully FIXED read started disk → staging before the stream reached it.
    Prefetching,
    /// The stream reached the op and its parameters bound and validated.
    Armed,
    /// The engine is moving data, with the stream's permission.
    Running,
    /// The result is known but not yet published.
    Done(Outcome),
    /// `*bytes_p` stored and the stream released. Terminal.
    Published(Outcome),
}

/// What happened to an op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpEvent {
    /// The engine starts a prefetch (only for reads with every parameter FIXED).
    Prefetch,
    /// The stream reached the op and its parameters are valid.
    Arm,
    /// The stream reached the op and a deferred parameter is invalid.
    BindFailed,
    /// The engine starts the op after it was armed.
    Start,
    /// `n` more bytes reached their destination.
    Transferred(u64),
    /// All chunks are done.
    Finish,
    /// Something failed; the op ends with this outcome (not a byte count).
    Fail(Outcome),
    /// The result was stored in `*bytes_p` and the stream released.
    Publish,
    /// At arm, a prefetched read's staged data may be stale: the prefetch's jobs are
    /// superseded and the op reads again in stream order (once, after `Prefetch`+`Arm`).
    Restage,
    /// The op is dropped unfinished (a panic, a lost job): it publishes -5030 from
    /// whatever state it was in, so that its stream is still released.
    Abort,
}

/// An event that is not legal in the op's current state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IllegalTransition {
    /// The state the op was in (unchanged).
    pub state: OpState,
    /// The rejected event.
    pub event: OpEvent,
}

/// One op's state, progress and limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpMachine {
    state: OpState,
    armed: bool,
    prefetch_allowed: bool,
    prefetched: bool,
    restaged: bool,
    size_bytes: u64,
    transferred_bytes: u64,
}

impl OpMachine {
    /// A new op of at most `size_bytes` bytes (the submitted, clamped size).
    /// `prefetch_allowed`: a read whose size and offsets are all FIXED.
    pub const fn new(size_bytes: u64, prefetch_allowed: bool) -> OpMachine {
        OpMachine {
            state: OpState::Submitted,
            armed: false,
            prefetch_allowed,
            prefetched: false,
            restaged: false,
            size_bytes,
            transferred_bytes: 0,
        }
    }

    /// The current state.
    pub const fn state(&self) -> OpState {
        self.state
    }

    /// The op's size: as submitted (clamped), or as bound at arm ([`OpMachine::bind_size`]).
    pub const fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    /// Bytes transferred so far.
    pub const fn transferred_bytes(&self) -> u64 {
        self.transferred_bytes
    }

    /// Whether the stream has reached the op.
    pub const fn is_armed(&self) -> bool {
        self.armed
    }

    /// Whether a prefetch's staged data was dropped at arm ([`OpEvent::Restage`]): the
    /// prefetch's jobs end without publishing; the job posted at arm publishes.
    pub const fn prefetch_superseded(&self) -> bool {
        self.restaged
    }

    /// Applies an event that the caller knows to be legal: an illegal one is a bug,
    /// caught by `debug_assert!` in tests (in release builds the state stays unchanged
    /// and the error is returned for the caller to report).
    ///
    /// # Errors
    /// As [`OpMachine::apply`] (only in release builds; debug builds panic).
    pub fn step(&mut self, event: OpEvent) -> Result<OpState, IllegalTransition> {
        let result = self.apply(event);
        debug_assert!(result.is_ok(), "illegal op transition: {result:?}");
        result
    }

    /// Lowers the byte limit when the bound size is smaller than the submitted one.
    ///
    /// # Errors
    /// Growing the limit, or doing so after the op started.
    pub fn bind_size(&mut self, bound_size_bytes: u64) -> Result<(), IllegalTransition> {
        let early = matches!(self.state, OpState::Submitted | OpState::Armed);
        if !early || bound_size_bytes > self.size_bytes {
            return Err(IllegalTransition { state: self.state, event: OpEvent::Arm });
        }
        self.size_bytes = bound_size_bytes;
        Ok(())
    }

    /// Applies one event: the single place where states change.
    ///
    /// # Errors
    /// [`IllegalTransition`] when the event is not legal now; the state is unchanged.
    pub fn apply(&mut self, event: OpEvent) -> Result<OpState, IllegalTransition> {
        let illegal = IllegalTransition { state: self.state, event };
        let next = match (self.state, event) {
            // A fully FIXED read may start reading the file before the stream arrives.
            (OpState::Submitted, OpEvent::Prefetch) if self.prefetch_allowed => {
                OpState::Prefetching
            }
            // The stream arrived with valid parameters.
            (OpState::Submitted, OpEvent::Arm) => OpState::Armed,
            // The stream arrived while the prefetch runs: device copies may now start.
            (OpState::Prefetching, OpEvent::Arm) => OpState::Running,
            // The stream arrived after a prefetch already failed: publish can follow.
            (OpState::Done(outcome), OpEvent::Arm) if !self.armed => OpState::Done(outcome),
            // A deferred parameter is invalid: -5022, nothing is moved.
            (OpState::Submitted, OpEvent::BindFailed) => {
                OpState::Done(Outcome::Library(OpError::InvalidValue))
            }
            // The engine picks up an armed op.
            (OpState::Armed, OpEvent::Start) => OpState::Running,
            // Progress, never beyond the op's size.
            (OpState::Running, OpEvent::Transferred(n)) => {
                let total = self.transferred_bytes.checked_add(n).ok_or(illegal)?;
                if total > self.size_bytes {
                    return Err(illegal);
                }
                self.transferred_bytes = total;
                OpState::Running
            }
            // All chunks done: the byte count is the result (short at EOF).
            (OpState::Running, OpEvent::Finish) => {
                OpState::Done(Outcome::Bytes(self.transferred_bytes))
            }
            // Failure anywhere before the result is known; Fail carries an error.
            (
                OpState::Prefetching | OpState::Armed | OpState::Running,
                OpEvent::Fail(outcome @ (Outcome::OsError(_) | Outcome::Library(_))),
            ) => OpState::Done(outcome),
            // The result is stored and the stream released, once it reached the op.
            (OpState::Done(outcome), OpEvent::Publish) if self.armed => OpState::Published(outcome),
            // A prefetch found stale at arm: its data is dropped and read again (once).
            (OpState::Running, OpEvent::Restage) if self.prefetched && !self.restaged => {
                OpState::Running
            }
            // The op is dropped unfinished: -5030, the stream is released anyway.
            (state, OpEvent::Abort) if !matches!(state, OpState::Published(_)) => {
                OpState::Published(Outcome::Library(OpError::InternalError))
            }
            _ => return Err(illegal),
        };
        match event {
            OpEvent::Arm | OpEvent::BindFailed => self.armed = true,
            OpEvent::Prefetch => self.prefetched = true,
            OpEvent::Restage => self.restaged = true,
            _ => {}
        }
        self.state = next;
        Ok(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(machine: &mut OpMachine, events: &[OpEvent]) -> OpState {
        for &event in events {
            machine.apply(event).unwrap_or_else(|e| panic!("{e:?}"));
        }
        machine.state()
    }

    #[test]
    fn bytes_p_values() {
        assert_eq!(Outcome::Bytes(4096).bytes_p_value(), 4096);
        assert_eq!(Outcome::OsError(libc_eio()).bytes_p_value(), -5);
        assert_eq!(Outcome::Library(OpError::InvalidValue).bytes_p_value(), -5022);
        assert_eq!(Outcome::Library(OpError::InternalError).bytes_p_value(), -5030);
        assert_eq!(Outcome::Bytes(u64::MAX).bytes_p_value(), i64::MAX);
    }

    const fn libc_eio() -> i32 {
        5
    }

    #[test]
    fn read_path() {
        let mut op = OpMachine::new(8192, false);
        let events = [
            OpEvent::Arm,
            OpEvent::Start,
            OpEvent::Transferred(4096),
            OpEvent::Transferred(4096),
            OpEvent::Finish,
            OpEvent::Publish,
        ];
        assert_eq!(run(&mut op, &events), OpState::Published(Outcome::Bytes(8192)));
    }

    #[test]
    fn short_read_publishes_the_short_count() {
        let mut op = OpMachine::new(8192, false);
        let events = [
            OpEvent::Arm,
            OpEvent::Start,
            OpEvent::Transferred(100),
            OpEvent::Finish,
            OpEvent::Publish,
        ];
        assert_eq!(run(&mut op, &events), OpState::Published(Outcome::Bytes(100)));
    }

    #[test]
    fn bind_failure_publishes_minus_5022() {
        let mut op = OpMachine::new(8192, false);
        let state = run(&mut op, &[OpEvent::BindFailed, OpEvent::Publish]);
        assert_eq!(state, OpState::Published(Outcome::Library(OpError::InvalidValue)));
        assert_eq!(Outcome::Library(OpError::InvalidValue).bytes_p_value(), -5022);
    }

    #[test]
    fn os_error_publishes_minus_errno_even_after_progress() {
        let mut op = OpMachine::new(8192, false);
        let events = [
            OpEvent::Arm,
            OpEvent::Start,
            OpEvent::Transferred(4096),
            OpEvent::Fail(Outcome::OsError(5)),
            OpEvent::Publish,
        ];
        assert_eq!(run(&mut op, &events), OpState::Published(Outcome::OsError(5)));
    }

    #[test]
    fn prefetch_then_arm() {
        let mut op = OpMachine::new(4096, true);
        let events = [
            OpEvent::Prefetch,
            OpEvent::Arm,
            OpEvent::Transferred(4096),
            OpEvent::Finish,
            OpEvent::Publish,
        ];
        assert_eq!(run(&mut op, &events), OpState::Published(Outcome::Bytes(4096)));
    }

    #[test]
    fn failed_prefetch_publishes_only_after_arm() {
        let mut op = OpMachine::new(4096, true);
        run(&mut op, &[OpEvent::Prefetch, OpEvent::Fail(Outcome::OsError(5))]);
        assert!(op.apply(OpEvent::Publish).is_err(), "must wait for the stream");
        let state = run(&mut op, &[OpEvent::Arm, OpEvent::Publish]);
        assert_eq!(state, OpState::Published(Outcome::OsError(5)));
    }

    #[test]
    fn prefetch_needs_permission() {
        let mut op = OpMachine::new(4096, false);
        assert!(op.apply(OpEvent::Prefetch).is_err());
        assert_eq!(op.state(), OpState::Submitted);
    }

    #[test]
    fn illegal_events_leave_the_state_unchanged() {
        let mut op = OpMachine::new(4096, false);
        for event in [
            OpEvent::Start,
            OpEvent::Finish,
            OpEvent::Publish,
            OpEvent::Transferred(1),
            OpEvent::Fail(Outcome::OsError(5)),
        ] {
            assert_eq!(
                op.apply(event),
                Err(IllegalTransition { state: OpState::Submitted, event })
            );
        }
        run(&mut op, &[OpEvent::Arm]);
        assert!(op.apply(OpEvent::Arm).is_err(), "armed twice");
        assert!(op.apply(OpEvent::BindFailed).is_err());
    }

    #[test]
    fn transfer_never_exceeds_the_size() {
        let mut op = OpMachine::new(4096, false);
        run(&mut op, &[OpEvent::Arm, OpEvent::Start, OpEvent::Transferred(4000)]);
        assert!(op.apply(OpEvent::Transferred(97)).is_err());
        assert_eq!(op.transferred_bytes(), 4000);
    }

    #[test]
    fn fail_must_carry_an_error() {
        let mut op = OpMachine::new(4096, false);
        run(&mut op, &[OpEvent::Arm, OpEvent::Start]);
        assert!(op.apply(OpEvent::Fail(Outcome::Bytes(1))).is_err());
    }

    #[test]
    fn published_is_terminal() {
        let mut op = OpMachine::new(0, false);
        run(&mut op, &[OpEvent::Arm, OpEvent::Start, OpEvent::Finish, OpEvent::Publish]);
        for event in
            [OpEvent::Arm, OpEvent::Publish, OpEvent::Finish, OpEvent::Fail(Outcome::OsError(1))]
        {
            assert!(op.apply(event).is_err());
        }
    }

    #[test]
    fn stale_prefetch_restages_once() {
        let mut op = OpMachine::new(4096, true);
        run(&mut op, &[OpEvent::Prefetch, OpEvent::Arm]);
        assert!(!op.prefetch_superseded());
        run(&mut op, &[OpEvent::Restage]);
        assert!(op.prefetch_superseded());
        assert!(op.apply(OpEvent::Restage).is_err(), "restaged twice");
        let state = run(&mut op, &[OpEvent::Transferred(4096), OpEvent::Finish, OpEvent::Publish]);
        assert_eq!(state, OpState::Published(Outcome::Bytes(4096)));
    }

    #[test]
    fn restage_needs_a_prefetch() {
        let mut op = OpMachine::new(4096, true);
        run(&mut op, &[OpEvent::Arm, OpEvent::Start]);
        assert!(op.apply(OpEvent::Restage).is_err());
    }

    #[test]
    fn abort_publishes_internal_error_from_any_unpublished_state() {
        let internal = OpState::Published(Outcome::Library(OpError::InternalError));
        let prefixes: [&[OpEvent]; 5] = [
            &[],
            &[OpEvent::Prefetch],
            &[OpEvent::Arm],
            &[OpEvent::Arm, OpEvent::Start],
            &[OpEvent::BindFailed],
        ];
        for prefix in prefixes {
            let mut op = OpMachine::new(4096, true);
            run(&mut op, prefix);
            assert_eq!(op.apply(OpEvent::Abort), Ok(internal), "after {prefix:?}");
            assert!(op.apply(OpEvent::Abort).is_err(), "Published is terminal");
        }
    }

    #[test]
    #[should_panic(expected = "illegal op transition")]
    #[cfg(debug_assertions)]
    fn step_asserts_legality() {
        let mut op = OpMachine::new(4096, false);
        let _ = op.step(OpEvent::Publish);
    }

    #[test]
    fn bind_size_only_shrinks_before_start() {
        let mut op = OpMachine::new(8192, false);
        assert!(op.bind_size(16384).is_err());
        assert_eq!(op.size_bytes(), 8192, "a refused bind keeps the size");
        op.bind_size(4096).unwrap();
        assert_eq!(op.size_bytes(), 4096);
        run(&mut op, &[OpEvent::Arm, OpEvent::Start]);
        assert!(op.apply(OpEvent::Transferred(8192)).is_err());
        assert!(op.bind_size(1).is_err());
        assert_eq!(op.size_bytes(), 4096);
    }

    mod model {
        extern crate std;

        use std::vec;

        use proptest::prelude::*;

        use super::*;

        fn event() -> impl Strategy<Value = OpEvent> {
            prop_oneof![
                Just(OpEvent::Prefetch),
                Just(OpEvent::Arm),
                Just(OpEvent::BindFailed),
                Just(OpEvent::Start),
                (0u64..5000).prop_map(OpEvent::Transferred),
                Just(OpEvent::Finish),
                Just(OpEvent::Fail(Outcome::OsError(5))),
                Just(OpEvent::Fail(Outcome::Bytes(1))),
                Just(OpEvent::Publish),
                Just(OpEvent::Restage),
                Just(OpEvent::Abort),
            ]
        }

        proptest! {
            /// Whatever events arrive, a rejected one changes nothing, progress never
            /// passes the size, Published is terminal and reached only once armed (or by
            /// Abort), and a byte count is published only through Finish.
            #[test]
            fn any_event_sequence_keeps_the_invariants(
                size in 0u64..10_000,
                prefetch_allowed in any::<bool>(),
                events in proptest::collection::vec(event(), 0..24),
            ) {
                let mut op = OpMachine::new(size, prefetch_allowed);
                for event in events {
                    let before = op;
                    match op.apply(event) {
                        Err(illegal) => {
                            prop_assert_eq!(op, before);
                            prop_assert_eq!(illegal.state, before.state());
                        }
                        Ok(next) => {
                            prop_assert_eq!(next, op.state());
                            prop_assert!(!matches!(before.state(), OpState::Published(_)));
                            if let OpState::Published(_) = next {
                                prop_assert!(before.is_armed() || event == OpEvent::Abort);
                            }
                            if event == OpEvent::Prefetch {
                                prop_assert!(prefetch_allowed);
                            }
                        }
                    }
                    prop_assert!(op.transferred_bytes() <= size);
                }
            }
        }
    }
}
