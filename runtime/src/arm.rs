//! Arming ops by doorbell: how the library learns that a user stream has reached an op.
//!
//! Each op enqueues on the user's stream "write the op's sequence number into the
//! stream's *doorbell* word" (pinned, device-mapped) followed by the wait on its release
//! word. One poller thread per driver watches the doorbells of the streams that have ops
//! waiting to be armed and runs each op's arm, in stream order, once the doorbell shows
//! its number.
//!
//! The alternative, a host function per op, costs the driver's callback-thread wake-up
//! (~16 µs on the H200) on every op, and CUDA blocks the submitting thread once ~55 host
//! functions are queued behind a busy stream; a stream write is a few bytes of push
//! buffer (~510 ops fit before an enqueue blocks; `benches/probes/doorbell_probe.c`).
//!
//! The poller spins while arms are likely due soon (for [`SPIN`] after a submission,
//! [`SPIN_AFTER_RELEASE`] after an op released its stream from the host, [`SPIN_AFTER_ARM`]
//! after arming), backs off to short sleeps (at most
//! [`MAX_SLEEP`], [`MAX_SLEEP_LONG_WAIT`] once nothing was armed for [`LONG_WAIT`]) while
//! streams hold their ops back, and parks when no op waits: an idle driver costs no CPU.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, MutexGuard};
use std::thread::{JoinHandle, ThreadId};
use std::time::{Duration, Instant};

use crate::word::ReleaseWord;

/// Which streams the poller watches, and its parking (model-checked with loom).
#[path = "arm_handoff.rs"]
mod handoff;

/// The primitives [`handoff`] is written against (loom's in its model test).
mod sync {
    pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    pub(crate) use std::sync::{Arc, Condvar, Mutex, MutexGuard};
}

use handoff::{HasPending, Pending, Watchlist};

/// Name of the poller thread.
pub(crate) const ARM_THREAD_NAME: &str = "hipfile-arm";

/// How long the poller keeps spinning after an op was submitted or it was woken (also
/// with no op waiting, so that the next op of a burst finds it awake): an op on an idle
/// stream rings its doorbell a few µs after submission.
const SPIN: Duration = Duration::from_micros(100);
/// How long it spins after arming ops: streams busy with earlier work ring their next
/// doorbells much later, and a core spinning through every gap would compete with the
/// executors.
const SPIN_AFTER_ARM: Duration = Duration::from_micros(20);
/// How long it spins after an op released its stream from the host: the stream's next
/// op rings its doorbell once the stream has run the released op's copy (a few µs for a
/// small op; the H100 measured 69 µs from release to the next arm for 4 KiB reads with the
/// poller asleep, most of it the poller's sleeps).
const SPIN_AFTER_RELEASE: Duration = Duration::from_micros(50);
/// First sleep once spinning found nothing.
const MIN_SLEEP: Duration = Duration::from_micros(5);
/// Longest sleep between two looks at the doorbells while ops wait (the most the poller
/// adds to an op reached while it slept).
const MAX_SLEEP: Duration = Duration::from_micros(50);
/// After this long without an arm, streams are busy with long work: the poller sleeps up
/// to [`MAX_SLEEP_LONG_WAIT`] (adding at most that to ops held longer than this).
const LONG_WAIT: Duration = Duration::from_millis(5);
/// See [`LONG_WAIT`].
const MAX_SLEEP_LONG_WAIT: Duration = Duration::from_micros(200);
/// Timer slack of the poller thread, so that its short sleeps are short.
const TIMER_SLACK_NS: u64 = 2_000;

/// An op's arm, run once the stream reached it.
pub(crate) type ArmFn = Box<dyn FnOnce() + Send>;

/// One stream's ops waiting to be armed, in sequence order, and its doorbell.
pub(crate) struct ArmQueue {
    doorbell: ReleaseWord,
    pending: Pending<(u32, ArmFn)>,
    /// The oldest pending sequence, or [`NONE_DUE`]: lets the poller look without the
    /// lock.
    next_due: AtomicU64,
}

/// A stream the poller can watch: it owns an [`ArmQueue`] (`crate::stream`'s state).
pub(crate) trait ArmedStream: Send + Sync + 'static {
    /// The stream's doorbell and the ops waiting for it.
    fn arm_queue(&self) -> &ArmQueue;
}

impl<S: ArmedStream> HasPending<(u32, ArmFn)> for S {
    fn pending(&self) -> &Pending<(u32, ArmFn)> {
        &self.arm_queue().pending
    }
}

impl ArmQueue {
    pub(crate) fn new(doorbell: ReleaseWord) -> ArmQueue {
        ArmQueue { doorbell, pending: Pending::default(), next_due: AtomicU64::new(NONE_DUE) }
    }

    /// The word the stream writes each op's sequence number into when it reaches it.
    pub(crate) fn doorbell(&self) -> ReleaseWord {
        self.doorbell
    }

    /// Ops submitted on the stream that it has not reached yet (their arm waits).
    pub(crate) fn waiting(&self) -> usize {
        self.pending().len()
    }

    fn pending(&self) -> MutexGuard<'_, VecDeque<(u32, ArmFn)>> {
        self.pending.lock()
    }

    /// Queues `arm` for `sequence`; `true` when the stream must be listed.
    fn push(&self, sequence: u32, arm: ArmFn) -> bool {
        self.pending.push((sequence, arm), || {
            self.next_due.store(u64::from(sequence), Ordering::SeqCst);
        })
    }

    /// Takes the arms the doorbell has reached, oldest first; `false` when none waits.
    fn take_reached(&self, into: &mut Vec<ArmFn>) -> bool {
        let next_due = self.next_due.load(Ordering::SeqCst);
        if next_due == NONE_DUE {
            return false;
        }
        let rung = self.doorbell.load();
        if !reached(rung, next_due as u32) {
            return true;
        }
        let mut pending = self.pending();
        while let Some(&(sequence, _)) = pending.front() {
            if !reached(rung, sequence) {
                break;
            }
            into.push(pending.pop_front().expect("front exists").1);
        }
        let next = pending.front().map_or(NONE_DUE, |&(sequence, _)| u64::from(sequence));
        self.next_due.store(next, Ordering::SeqCst);
        next != NONE_DUE
    }
}

/// [`ArmQueue::next_due`] of an empty queue.
const NONE_DUE: u64 = u64::MAX;

/// Whether a doorbell showing `rung` has reached `sequence` (cyclic, as the stream's
/// GEQ wait).
fn reached(rung: u32, sequence: u32) -> bool {
    (rung.wrapping_sub(sequence) as i32) >= 0
}

/// The poller thread and the streams it watches.
pub(crate) struct ArmPoller<S> {
    shared: Arc<Shared<S>>,
    thread: Option<JoinHandle<()>>,
    thread_id: ThreadId,
}

struct Shared<S> {
    /// The streams with ops waiting to be armed.
    list: Watchlist<S>,
    /// Bumped by every submission (restarts the poller's spin window).
    submissions: AtomicU64,
    /// Bumped by every release from the host (restarts a shorter spin window).
    releases: AtomicU64,
}

impl<S: ArmedStream> ArmPoller<S> {
    /// Starts the poller thread; it spins only with `spin` (spare cores), else it goes
    /// straight to short sleeps.
    ///
    /// # Errors
    /// The thread could not be spawned.
    pub(crate) fn start(spin: bool) -> std::io::Result<ArmPoller<S>> {
        let shared = Arc::new(Shared {
            list: Watchlist::default(),
            submissions: AtomicU64::new(0),
            releases: AtomicU64::new(0),
        });
        let for_thread = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(ARM_THREAD_NAME.into())
            .spawn(move || poll_doorbells(&for_thread, spin))?;
        let thread_id = thread.thread().id();
        Ok(ArmPoller { shared, thread: Some(thread), thread_id })
    }

    /// Queues `arm` to run once `stream`'s doorbell reaches `sequence`. Called under the
    /// stream's submit lock, after the doorbell write was enqueued, so the queue stays in
    /// sequence order.
    pub(crate) fn watch(&self, stream: &Arc<S>, sequence: u32, arm: ArmFn) {
        let must_list = stream.arm_queue().push(sequence, arm);
        self.shared.submissions.fetch_add(1, Ordering::Relaxed);
        // A stream already listed needs no wake-up (the poller parks only with an empty
        // list); a spinning poller rereads the list when the generation changes
        // (`handoff`'s protocol).
        if must_list {
            self.shared.list.enlist(Arc::clone(stream));
        }
    }
}

impl<S> ArmPoller<S> {
    /// An op released its stream from the host: the stream's next doorbell is likely due
    /// within microseconds, so a running poller spins a little longer (a parked one has
    /// no op to arm and stays parked).
    pub(crate) fn note_release(&self) {
        self.shared.releases.fetch_add(1, Ordering::Relaxed);
    }

    /// One line for [`crate::Driver::pending_report`]: streams watched, parked or not.
    pub(crate) fn describe(&self) -> String {
        let listed = self.shared.list.lock();
        format!(
            "arm poller: {} stream(s) watched, {}, {} submission(s) and {} host release(s) seen",
            listed.streams.len(),
            if listed.parked { "parked" } else { "polling" },
            self.shared.submissions.load(Ordering::Relaxed),
            self.shared.releases.load(Ordering::Relaxed)
        )
    }
}

impl<S> Drop for ArmPoller<S> {
    fn drop(&mut self) {
        self.shared.list.stop();
        // The last driver reference may go away on the poller thread itself (an arm that
        // published at once); it cannot join itself and ends on its own.
        if let Some(thread) = self.thread.take()
            && std::thread::current().id() != self.thread_id
        {
            let _ = thread.join();
        }
    }
}

std::thread_local! {
    /// On the poller thread, while it runs the arms a look found: nanoseconds since its
    /// look before (0 elsewhere).
    static LOOK_GAP_NS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

std::thread_local! {
    /// On the poller thread, while it runs the arms a look found: that look's time
    /// (`None` elsewhere).
    static LOOK_AT: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) };
}

/// For an arm running now: how long before the look that found its doorbell the poller
/// had looked last (the doorbell rang in between); 0 off the poller thread.
pub(crate) fn look_gap_ns() -> u64 {
    LOOK_GAP_NS.with(std::cell::Cell::get)
}

/// For an arm running now: how long after the look that found its doorbell it runs (the
/// arms of that look before it ran meanwhile); 0 off the poller thread.
pub(crate) fn behind_look_ns() -> u64 {
    LOOK_AT
        .with(std::cell::Cell::get)
        .map_or(0, |look| u64::try_from(look.elapsed().as_nanos()).unwrap_or(u64::MAX))
}

/// The poller thread's loop.
fn poll_doorbells<S: ArmedStream>(shared: &Shared<S>, spin: bool) {
    let (spin_after_submit, spin_after_release, spin_after_arm) = if spin {
        (SPIN, SPIN_AFTER_RELEASE, SPIN_AFTER_ARM)
    } else {
        (Duration::ZERO, Duration::ZERO, Duration::ZERO)
    };
    crate::sys::set_thread_timer_slack_ns(TIMER_SLACK_NS);
    let mut streams: Vec<Arc<S>> = Vec::new();
    // The list generation `streams` was copied at; none yet.
    let mut copied_generation = u64::MAX;
    let mut due: Vec<ArmFn> = Vec::new();
    // Spin until then; sleep (with `sleep` growing) after it.
    let mut spin_until = Instant::now() + spin_after_submit;
    let mut last_arm = Instant::now();
    let mut seen_submissions = 0;
    let mut seen_releases = 0;
    let mut sleep = MIN_SLEEP;
    // When the doorbells were last looked at (the gap to the look that finds one is
    // reported with its arms).
    let mut previous_look = Instant::now();
    while !shared.list.stopping() {
        let submissions = shared.submissions.load(Ordering::Relaxed);
        if submissions != seen_submissions {
            seen_submissions = submissions;
            spin_until = spin_until.max(Instant::now() + spin_after_submit);
            sleep = MIN_SLEEP;
        }
        let releases = shared.releases.load(Ordering::Relaxed);
        if releases != seen_releases {
            seen_releases = releases;
            spin_until = spin_until.max(Instant::now() + spin_after_release);
            sleep = MIN_SLEEP;
        }
        let look = Instant::now();
        let mut any_waiting = false;
        for stream in &streams {
            any_waiting |= stream.arm_queue().take_reached(&mut due);
        }
        let gap = look.duration_since(previous_look);
        previous_look = look;
        if !due.is_empty() {
            LOOK_GAP_NS.with(|g| g.set(u64::try_from(gap.as_nanos()).unwrap_or(u64::MAX)));
            LOOK_AT.with(|g| g.set(Some(look)));
            for arm in due.drain(..) {
                // An arm's panic is the op's to report (its Drop publishes -5030); it
                // must not stop the poller.
                let _ = catch_unwind(AssertUnwindSafe(arm));
            }
            LOOK_GAP_NS.with(|g| g.set(0));
            LOOK_AT.with(|g| g.set(None));
            last_arm = Instant::now();
            spin_until = spin_until.max(last_arm + spin_after_arm);
            sleep = MIN_SLEEP;
            continue;
        }
        // Nothing was due: the look (a scan of a few words ago) is the time now.
        let now = look;
        if !any_waiting || shared.list.generation() != copied_generation {
            let mut listed = shared.list.lock();
            // Streams with nothing queued leave the list (`handoff`'s protocol: a push
            // after this lists the stream again).
            Watchlist::prune(&mut listed);
            if listed.streams.is_empty() && now >= spin_until {
                if shared.list.stopping() {
                    break;
                }
                streams.clear();
                drop(shared.list.park(listed));
                previous_look = Instant::now();
                copied_generation = u64::MAX;
                spin_until = Instant::now() + spin_after_submit;
                sleep = MIN_SLEEP;
                continue;
            }
            streams.clear();
            streams.extend(listed.streams.iter().cloned());
            copied_generation = shared.list.generation();
        }
        if now < spin_until {
            std::hint::spin_loop();
            continue;
        }
        std::thread::sleep(sleep);
        let cap = if now - last_arm < LONG_WAIT { MAX_SLEEP } else { MAX_SLEEP_LONG_WAIT };
        sleep = (sleep * 2).min(cap);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// A stream that is only its arm queue.
    struct TestStream(ArmQueue);

    impl ArmedStream for TestStream {
        fn arm_queue(&self) -> &ArmQueue {
            &self.0
        }
    }

    fn queue_over(word: &mut u32) -> ArmQueue {
        let host_ptr: *mut u32 = word;
        ArmQueue::new(ReleaseWord { host_ptr, device_addr: host_ptr as u64 })
    }

    /// A test stream whose doorbell is `word`, and that doorbell.
    fn stream_over(word: &mut u32) -> (ReleaseWord, Arc<TestStream>) {
        let host_ptr: *mut u32 = word;
        let doorbell = ReleaseWord { host_ptr, device_addr: host_ptr as u64 };
        (doorbell, Arc::new(TestStream(ArmQueue::new(doorbell))))
    }

    /// Waits up to 10 s for `done`, failing with `what`.
    fn wait_for(what: &str, done: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn counting_arm(runs: &Arc<AtomicUsize>, expect_index: usize) -> ArmFn {
        let runs = Arc::clone(runs);
        Box::new(move || {
            assert_eq!(runs.fetch_add(1, Ordering::SeqCst), expect_index, "arms out of order");
        })
    }

    #[test]
    fn takes_exactly_the_reached_arms_in_order_across_the_wrap() {
        let mut word = u32::MAX - 2;
        let queue = queue_over(&mut word);
        let runs = Arc::new(AtomicUsize::new(0));
        // Sequences MAX-1, MAX, 0, 1, 2: the wrap lies inside the queue.
        for (index, sequence) in [u32::MAX - 1, u32::MAX, 0, 1, 2].into_iter().enumerate() {
            queue.push(sequence, counting_arm(&runs, index));
        }
        let mut due = Vec::new();
        let ring = |queue: &ArmQueue, value: u32| queue.doorbell.store(value);
        queue.take_reached(&mut due);
        assert!(due.is_empty(), "nothing reached yet");
        ring(&queue, u32::MAX);
        queue.take_reached(&mut due);
        assert_eq!(due.len(), 2, "MAX-1 and MAX reached");
        ring(&queue, 1);
        queue.take_reached(&mut due);
        assert_eq!(due.len(), 4, "0 and 1 reached after the wrap");
        assert_eq!(queue.pending().len(), 1, "2 still waits");
        for arm in due.drain(..) {
            arm();
        }
        assert_eq!(runs.load(Ordering::SeqCst), 4);
    }

    #[test]
    fn the_poller_runs_arms_when_their_doorbell_rings_and_stops_on_drop() {
        let mut word = 0u32;
        let (doorbell, stream) = stream_over(&mut word);
        let poller = ArmPoller::start(true).expect("start poller");
        let runs = Arc::new(AtomicUsize::new(0));
        for index in 0..3 {
            poller.watch(&stream, index as u32 + 1, counting_arm(&runs, index));
        }
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(runs.load(Ordering::SeqCst), 0, "no arm before its doorbell");
        doorbell.store(2);
        wait_for("arms 1 and 2 did not run", || runs.load(Ordering::SeqCst) >= 2);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(runs.load(Ordering::SeqCst), 2, "arm 3 waits for its doorbell");
        doorbell.store(3);
        wait_for("arm 3 did not run", || runs.load(Ordering::SeqCst) >= 3);
        drop(poller);
        drop(stream);
    }

    #[test]
    fn an_arm_learns_how_long_before_its_look_the_poller_looked_last() {
        let mut word = 0u32;
        let (doorbell, stream) = stream_over(&mut word);
        // No spinning: after its first looks the poller sleeps in steps of up to 50 µs.
        let poller = ArmPoller::start(false).expect("start poller");
        let gap = Arc::new(AtomicU64::new(u64::MAX));
        let seen = Arc::clone(&gap);
        poller.watch(&stream, 1, Box::new(move || seen.store(look_gap_ns(), Ordering::SeqCst)));
        std::thread::sleep(Duration::from_millis(100));
        doorbell.store(1);
        wait_for("the arm did not run", || gap.load(Ordering::SeqCst) != u64::MAX);
        let gap_ns = gap.load(Ordering::SeqCst);
        // A sleep of at least MIN_SLEEP lay between the two looks; far less than the 100 ms
        // the doorbell waited (the poller kept looking; half of it leaves a loaded machine
        // room for a late wake-up).
        assert!(gap_ns >= MIN_SLEEP.as_nanos() as u64, "gap {gap_ns} ns");
        assert!(gap_ns < 50_000_000, "gap {gap_ns} ns");
        assert_eq!(look_gap_ns(), 0, "off the poller thread");
        drop(poller);
    }

    #[test]
    fn an_arm_learns_how_long_the_arms_of_its_look_before_it_took() {
        let mut word = 0u32;
        let (doorbell, stream) = stream_over(&mut word);
        let poller = ArmPoller::start(false).expect("start poller");
        // Two ops of one stream; one store rings both, so one look finds both, and they
        // run in order: the first takes 50 ms.
        let behind = Arc::new([AtomicU64::new(u64::MAX), AtomicU64::new(u64::MAX)]);
        for sequence in 1..=2u32 {
            let seen = Arc::clone(&behind);
            poller.watch(
                &stream,
                sequence,
                Box::new(move || {
                    let waited = behind_look_ns();
                    seen[sequence as usize - 1].store(waited, Ordering::SeqCst);
                    if sequence == 1 {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }),
            );
        }
        std::thread::sleep(Duration::from_millis(20));
        doorbell.store(2);
        wait_for("the arms did not run", || {
            behind.iter().all(|b| b.load(Ordering::SeqCst) != u64::MAX)
        });
        let first = behind[0].load(Ordering::SeqCst);
        let second = behind[1].load(Ordering::SeqCst);
        // Half the first's time: room for a late wake-up on a loaded machine.
        assert!(first < 25_000_000, "the first arm ran at once after its look: {first} ns");
        assert!(second >= 50_000_000, "the second ran after the first's 50 ms: {second} ns");
        assert_eq!(behind_look_ns(), 0, "off the poller thread");
        drop(poller);
    }

    #[test]
    fn no_arm_is_lost_when_a_queue_empties_and_refills_at_once() {
        // Every op is due when queued, so the poller empties the queue (and may drop the
        // stream from its list) just as the next op arrives: the window where a lost
        // `watched` update would strand an op forever.
        let mut word = 1 << 20;
        let (_, stream) = stream_over(&mut word);
        let poller = ArmPoller::start(true).expect("start poller");
        let runs = Arc::new(AtomicUsize::new(0));
        for index in 0..20_000 {
            poller.watch(&stream, index as u32, counting_arm(&runs, index));
            let deadline = Instant::now() + Duration::from_secs(10);
            while runs.load(Ordering::SeqCst) <= index {
                assert!(Instant::now() < deadline, "arm {index} was never run");
                std::hint::spin_loop();
            }
        }
        drop(poller);
    }
}
