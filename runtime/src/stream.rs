//! Streams as the async path sees them: flags, device, the executor a stream is pinned
//! to, and the stream's release word.
//!
//! Every stream the library has seen (registered or not) has one 32-bit *release word*
//! in pinned, device-mapped memory. The k-th op submitted on the stream enqueues "wait
//! until word ≥ k" (cyclic comparison, as `CU_STREAM_WAIT_VALUE_GEQ`) and is released
//! by storing k. Ops of one stream are armed in stream order, so the word only grows;
//! taking the sequence number and enqueueing the commands happen under the stream's
//! submit lock, so the two orders agree even with several submitting threads. A second
//! word, the *doorbell*, tells the library when the stream reached an op
//! (`arm.rs`).
//!
//! Words are recycled, so that registering and deregistering streams, or using ever new
//! unregistered streams, keeps memory flat: a stream state gives its two words back when
//! it drops, and they are handed out again only once *quiescent* — both hold the last
//! sequence number the state handed out, so no write of ours to them is still queued on
//! any stream (releases land in sequence order, and a stream writes its doorbell before
//! its op can be released). The next state continues from that number instead of 0:
//! the words only ever grow, so a wait of the old stream that the device has yet to
//! execute stays satisfied.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use hipfile_core::{OpError, StreamFlags};

use crate::arm::{ArmQueue, ArmedStream};
use crate::device::{Device, PinnedRegion, StreamHandle};
use crate::error::Error;
pub(crate) use crate::word::ReleaseWord;

/// Bytes of fully FIXED reads one stream may have prefetching at once: prefetch reads
/// ahead of the stream into staging, so an unbounded burst would fill every arena with
/// data the stream is not ready for; reads beyond the window start when the stream
/// reaches them.
///
/// Public for the integration tests; embedders do not need it.
pub const PREFETCH_WINDOW_BYTES: u64 = 32 << 20;

/// The prefetch bytes all streams of a driver may hold at once: half the engine's
/// staging arenas. Prefetched data sits in arena staging until its stream reaches the op;
/// past this share, the reads of ops that streams did reach would find the arenas full
/// and stage through heap buffers and fallback copies (on the cpu device, 8 streams of
/// 16 MiB reads ran 3.7x slower than the sync path that way).
#[derive(Debug)]
pub(crate) struct PrefetchBudget {
    cap_bytes: std::sync::atomic::AtomicU64,
    used_bytes: std::sync::atomic::AtomicU64,
}

impl PrefetchBudget {
    pub(crate) fn new(cap_bytes: u64) -> PrefetchBudget {
        PrefetchBudget {
            cap_bytes: std::sync::atomic::AtomicU64::new(cap_bytes),
            used_bytes: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Changes the cap (a configuration change before any I/O).
    pub(crate) fn set_cap(&self, cap_bytes: u64) {
        self.cap_bytes.store(cap_bytes, std::sync::atomic::Ordering::SeqCst);
    }

    /// Takes `len_bytes` of `used` unless that would pass `cap_bytes`; a lone op larger
    /// than the cap is admitted when nothing else is held. A cap of 0 admits nothing.
    fn take(used: &std::sync::atomic::AtomicU64, cap_bytes: u64, len_bytes: u64) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        if cap_bytes == 0 {
            return false;
        }
        let mut current = used.load(SeqCst);
        loop {
            if current > 0 && current + len_bytes > cap_bytes {
                return false;
            }
            match used.compare_exchange(current, current + len_bytes, SeqCst, SeqCst) {
                Ok(_) => return true,
                Err(now) => current = now,
            }
        }
    }
}

/// Words per pinned slab (one 4 KiB page).
const WORDS_PER_SLAB: usize = 1024;

/// A stream state's release word and doorbell, and the sequence number both hold when
/// the pair is quiescent (the last one its state handed out).
#[derive(Clone, Copy, Debug)]
pub(crate) struct WordPair {
    release: ReleaseWord,
    doorbell: ReleaseWord,
    sequence: u32,
}

impl WordPair {
    /// No write of ours to either word is still queued: both reached `sequence`.
    fn quiescent(&self) -> bool {
        self.release.load() == self.sequence && self.doorbell.load() == self.sequence
    }
}

/// What a [`WordPool`] holds.
struct WordPoolState {
    /// Pinned slabs of [`WORDS_PER_SLAB`] words.
    slabs: Vec<PinnedRegion>,
    /// Words of the last slab handed out so far.
    used_in_last_slab: usize,
    /// Pairs given back and quiescent: handed out before any new word.
    free: Vec<WordPair>,
    /// Pairs given back with a write possibly still queued; looked at again on take.
    retired: Vec<WordPair>,
}

/// Hands out release words from pinned slabs and takes them back (see the module
/// docs). Slabs live until the pool drops.
pub(crate) struct WordPool {
    device: Arc<dyn Device>,
    state: Mutex<WordPoolState>,
}

impl WordPool {
    pub(crate) fn new(device: Arc<dyn Device>) -> WordPool {
        let state = WordPoolState {
            slabs: Vec::new(),
            used_in_last_slab: WORDS_PER_SLAB,
            free: Vec::new(),
            retired: Vec::new(),
        };
        WordPool { device, state: Mutex::new(state) }
    }

    fn lock(&self) -> MutexGuard<'_, WordPoolState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A quiescent pair given back earlier, else two fresh words at 0.
    fn take_pair(&self) -> Result<WordPair, Error> {
        {
            let mut state = self.lock();
            if let Some(pair) = state.pair_without_allocating() {
                return Ok(pair);
            }
        }
        // A new slab, allocated without the pool's lock: on CUDA a pinned allocation can
        // wait for a lock that another thread's cuStreamCreate holds while it waits for
        // streams our ops hold, and an ending op gives its words back under this lock.
        let slab = crate::device::injected_fault(crate::fault::Site::PinnedAlloc)
            .and_then(|()| self.device.alloc_pinned(WORDS_PER_SLAB * 4))
            .map_err(Error::device)?;
        let mut state = self.lock();
        if state.used_in_last_slab + 2 <= WORDS_PER_SLAB {
            // Another thread added a slab meanwhile: ours stays unused until the pool
            // drops (it frees every slab).
            state.slabs.insert(0, slab);
        } else {
            state.slabs.push(slab);
            state.used_in_last_slab = 0;
        }
        Ok(state.pair_without_allocating().expect("the last slab has room for a pair"))
    }

    /// Takes back the pair of a state that handed out sequence numbers up to `sequence`.
    fn give_back(&self, release: ReleaseWord, doorbell: ReleaseWord, sequence: u32) {
        let pair = WordPair { release, doorbell, sequence };
        let mut state = self.lock();
        if pair.quiescent() { state.free.push(pair) } else { state.retired.push(pair) }
    }

    /// Pairs waiting to be handed out again and pairs not yet quiescent (for tests).
    #[cfg(test)]
    fn recycled(&self) -> (usize, usize) {
        let state = self.lock();
        (state.free.len(), state.retired.len())
    }
}

impl WordPoolState {
    /// A quiescent pair given back earlier, else two fresh words of the last slab, if
    /// it has room for them.
    fn pair_without_allocating(&mut self) -> Option<WordPair> {
        if self.free.is_empty() && !self.retired.is_empty() {
            let (free, retired): (Vec<_>, Vec<_>) =
                self.retired.drain(..).partition(WordPair::quiescent);
            self.free = free;
            self.retired = retired;
        }
        if let Some(pair) = self.free.pop() {
            return Some(pair);
        }
        if self.used_in_last_slab + 2 > WORDS_PER_SLAB {
            return None;
        }
        let release = self.next_word();
        let doorbell = self.next_word();
        Some(WordPair { release, doorbell, sequence: 0 })
    }

    /// The next word of the last slab (which has room), set to 0.
    fn next_word(&mut self) -> ReleaseWord {
        let slab = *self.slabs.last().expect("a slab with room");
        let index = self.used_in_last_slab;
        self.used_in_last_slab += 1;
        // SAFETY: index < WORDS_PER_SLAB (the caller checked the room), so the word lies
        // inside the slab.
        let host_ptr = unsafe { slab.host_ptr.cast::<u32>().add(index) };
        // SAFETY: the word is inside a live pinned slab, aligned, and not yet shared.
        unsafe { host_ptr.write_volatile(0) };
        ReleaseWord { host_ptr, device_addr: slab.device_addr + 4 * index as u64 }
    }
}

impl Drop for WordPool {
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        for slab in state.slabs.drain(..) {
            // SAFETY: the slabs came from alloc_pinned on this device; the driver (and so
            // every stream state and op) is gone, so no new wait can use them.
            unsafe { self.device.free_pinned(slab) };
        }
    }
}

/// What the library knows about one stream.
pub(crate) struct StreamState {
    /// The user's stream.
    pub(crate) handle: StreamHandle,
    /// Registration flags (empty for unregistered streams).
    pub(crate) flags: StreamFlags,
    /// The stream's device.
    pub(crate) device_ordinal: u32,
    /// The executor the stream's ops run on.
    pub(crate) executor: usize,
    /// Whether the user registered it.
    pub(crate) registered: bool,
    /// Whether work on the stream also waits for the NULL stream's earlier work (a blocking
    /// stream), as the device said when the state was made
    /// ([`crate::device::StreamMemoryOps::stream_follows_null_stream`]); assumed when the
    /// device cannot tell.
    pub(crate) follows_null_stream: bool,
    word: ReleaseWord,
    arms: ArmQueue,
    /// When the last op released device-side (`async_op::clock_ns`; 0: none since the
    /// last arm), for the round-trip counters.
    pub(crate) released_at_ns: std::sync::atomic::AtomicU64,
    next_sequence: Mutex<u32>,
    prefetch_bytes: std::sync::atomic::AtomicU64,
    prefetch_budget: Arc<PrefetchBudget>,
    deferred: Mutex<std::collections::VecDeque<DeferredPrefetch>>,
    /// Where the words go back when the state drops (`None`: test states).
    words: Option<Arc<WordPool>>,
    /// This state's number, unique in the process ([`StreamState::serial`]).
    serial: u64,
}

/// The next [`StreamState::serial`].
static NEXT_STREAM_SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn next_stream_serial() -> u64 {
    NEXT_STREAM_SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl Drop for StreamState {
    fn drop(&mut self) {
        if let Some(pool) = &self.words {
            let sequence = *self.next_sequence.get_mut().unwrap_or_else(|p| p.into_inner());
            pool.give_back(self.word, self.arms.doorbell(), sequence);
        }
    }
}

/// What a deferred prefetch attempt did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DeferredStart {
    /// The prefetch started.
    Started,
    /// The window is full: try again when it has room.
    NoRoom,
    /// Nothing to do any more (the stream reached the op, or it is gone).
    Gone,
}

/// Starts one queued op's prefetch, if it still can.
pub(crate) type DeferredPrefetch = Box<dyn Fn() -> DeferredStart + Send>;

impl std::fmt::Debug for ReleaseWord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ReleaseWord({:#x})", self.device_addr)
    }
}

impl std::fmt::Debug for StreamState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamState")
            .field("handle", &self.handle)
            .field("flags", &self.flags)
            .field("device_ordinal", &self.device_ordinal)
            .field("executor", &self.executor)
            .field("registered", &self.registered)
            .finish_non_exhaustive()
    }
}

impl StreamState {
    pub(crate) fn word(&self) -> ReleaseWord {
        self.word
    }

    /// A number no other state of this process has had or will have (an address may be
    /// reused once a state is gone; this is not): what the slot pool keys a stream's
    /// retired slots by.
    pub(crate) fn serial(&self) -> u64 {
        self.serial
    }

    /// A state over `arms` with a dangling release word, for the poller's unit tests.
    #[cfg(test)]
    pub(crate) fn for_arm_tests(arms: ArmQueue) -> StreamState {
        StreamState {
            handle: StreamHandle::NULL,
            flags: StreamFlags::empty(),
            device_ordinal: 0,
            executor: 0,
            registered: false,
            follows_null_stream: true,
            word: ReleaseWord { host_ptr: std::ptr::null_mut(), device_addr: 0 },
            arms,
            released_at_ns: std::sync::atomic::AtomicU64::new(0),
            next_sequence: Mutex::new(0),
            prefetch_bytes: std::sync::atomic::AtomicU64::new(0),
            prefetch_budget: Arc::new(PrefetchBudget::new(u64::MAX)),
            deferred: Mutex::new(std::collections::VecDeque::new()),
            serial: next_stream_serial(),
            words: None,
        }
    }

    /// The stream's doorbell and the ops waiting for it (see [`crate::arm`]).
    pub(crate) fn arm_queue(&self) -> &ArmQueue {
        &self.arms
    }

    /// Whether the driver's read-ahead budget is 0 (`HIPFILE_PREFETCH_MB=0`): no read may
    /// start before its stream reaches it, whatever path it takes.
    pub(crate) fn prefetch_off(&self) -> bool {
        self.prefetch_budget.cap_bytes.load(std::sync::atomic::Ordering::SeqCst) == 0
    }

    /// Takes `len_bytes` of the stream's prefetch window and of the driver's
    /// [`PrefetchBudget`]; `false` when either would overflow (the first read of an empty
    /// window, or of an empty budget, is always admitted).
    pub(crate) fn admit_prefetch(&self, len_bytes: u64) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        if !PrefetchBudget::take(&self.prefetch_bytes, PREFETCH_WINDOW_BYTES, len_bytes) {
            return false;
        }
        let budget = &self.prefetch_budget;
        let cap_bytes = budget.cap_bytes.load(std::sync::atomic::Ordering::SeqCst);
        if !PrefetchBudget::take(&budget.used_bytes, cap_bytes, len_bytes) {
            self.prefetch_bytes.fetch_sub(len_bytes, SeqCst);
            return false;
        }
        true
    }

    /// Queues a fully FIXED read the window did not admit (oldest first).
    pub(crate) fn defer_prefetch(&self, start: DeferredPrefetch) {
        self.deferred.lock().unwrap_or_else(|p| p.into_inner()).push_back(start);
    }

    /// Starts queued prefetches, oldest first, while the window has room: the stream
    /// keeps reading ahead as earlier ops finish.
    pub(crate) fn start_deferred(&self) {
        loop {
            let next = self.deferred.lock().unwrap_or_else(|p| p.into_inner()).pop_front();
            let Some(start) = next else { return };
            if start() == DeferredStart::NoRoom {
                self.deferred.lock().unwrap_or_else(|p| p.into_inner()).push_front(start);
                return;
            }
        }
    }

    /// Gives back what [`StreamState::admit_prefetch`] took.
    pub(crate) fn release_prefetch(&self, len_bytes: u64) {
        use std::sync::atomic::Ordering::SeqCst;
        self.prefetch_budget.used_bytes.fetch_sub(len_bytes, SeqCst);
        self.prefetch_bytes.fetch_sub(len_bytes, SeqCst);
    }

    /// One line for [`crate::Driver::pending_report`]: the stream, its sequence numbers
    /// (submitted, reached = doorbell, released = release word) and the ops between.
    pub(crate) fn describe(&self) -> String {
        // A submission holds the lock while it enqueues; a report asked while that enqueue
        // is stuck (a hang it is meant to explain) must not wait for it.
        let submitted = match self.next_sequence.try_lock() {
            Ok(sequence) => sequence.to_string(),
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner().to_string(),
            Err(std::sync::TryLockError::WouldBlock) => {
                "? (a submission is enqueueing its commands now)".to_string()
            }
        };
        let reached = self.arms.doorbell().load();
        let released = self.word.load();
        format!(
            "stream {:#x} ({}, flags {:#x}, device {}, executor {}): submitted {submitted}, \
             reached {reached}, released {released}; {} op(s) not reached, {} reached and \
             not released; prefetching {} B",
            self.handle.0,
            if self.registered { "registered" } else { "unregistered" },
            self.flags.bits(),
            self.device_ordinal,
            self.executor,
            self.arms.waiting(),
            reached.wrapping_sub(released) as i32,
            self.prefetch_bytes.load(std::sync::atomic::Ordering::SeqCst),
        )
    }

    /// Whether every op submitted on the stream was released; a stream with a submission
    /// enqueueing now is not (and is not waited for).
    pub(crate) fn idle(&self) -> bool {
        match self.next_sequence.try_lock() {
            Ok(sequence) => *sequence == self.word.load(),
            Err(std::sync::TryLockError::Poisoned(p)) => *p.into_inner() == self.word.load(),
            Err(std::sync::TryLockError::WouldBlock) => false,
        }
    }

    /// Locks the stream for one submission; the guard yields the op's sequence number.
    pub(crate) fn lock_submit(&self) -> SubmitGuard<'_> {
        SubmitGuard(self.next_sequence.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// Held while one op's commands are enqueued on its stream.
pub(crate) struct SubmitGuard<'a>(MutexGuard<'a, u32>);

impl SubmitGuard<'_> {
    /// The sequence number the op will wait for (and be released with).
    pub(crate) fn next(&mut self) -> u32 {
        *self.0 = self.0.wrapping_add(1);
        *self.0
    }

    /// The sequence number [`SubmitGuard::next`] would take, not taken.
    pub(crate) fn peek_next(&self) -> u32 {
        self.0.wrapping_add(1)
    }

    /// Gives the sequence number back (the enqueue failed before anything was queued).
    pub(crate) fn undo(&mut self) {
        *self.0 = self.0.wrapping_sub(1);
    }
}

/// Unregistered streams whose state is kept for their next op; past this many, idle
/// ones are forgotten.
const SEEN_STREAMS_KEPT: usize = 256;

/// Registered streams and the streams seen unregistered.
pub(crate) struct StreamTable {
    words: Arc<WordPool>,
    registered: RwLock<HashMap<StreamHandle, Arc<StreamState>>>,
    seen: RwLock<HashMap<StreamHandle, Arc<StreamState>>>,
    next_executor: Mutex<usize>,
    prefetch_budget: Arc<PrefetchBudget>,
}

impl StreamTable {
    /// Changes the bytes all streams' prefetches may hold together.
    pub(crate) fn set_prefetch_cap(&self, prefetch_cap_bytes: u64) {
        self.prefetch_budget.set_cap(prefetch_cap_bytes);
    }

    /// Streams over `device` whose prefetches share `prefetch_cap_bytes`.
    pub(crate) fn new(device: Arc<dyn Device>, prefetch_cap_bytes: u64) -> StreamTable {
        StreamTable {
            prefetch_budget: Arc::new(PrefetchBudget::new(prefetch_cap_bytes)),
            words: Arc::new(WordPool::new(device)),
            registered: RwLock::new(HashMap::new()),
            seen: RwLock::new(HashMap::new()),
            next_executor: Mutex::new(0),
        }
    }

    /// Every stream the table knows (registered first), busy ones before idle ones.
    pub(crate) fn all(&self) -> Vec<Arc<StreamState>> {
        let mut all: Vec<Arc<StreamState>> = read(&self.registered).values().cloned().collect();
        all.extend(read(&self.seen).values().cloned());
        all.sort_by_key(|state| state.idle());
        all
    }

    /// `hipFileStreamRegister`: already registered → 5022 (checked first), unknown flag
    /// bits → 5022, device lookup failure → 5011.
    pub(crate) fn register(
        &self,
        device: &dyn Device,
        handle: StreamHandle,
        bits: u32,
    ) -> Result<(), Error> {
        if read(&self.registered).contains_key(&handle) {
            return Err(Error::new(OpError::InvalidValue));
        }
        let flags = StreamFlags::parse(bits)?;
        let device_ordinal = device.stream_device(handle).map_err(Error::device)?;
        let state = self.new_state(device, handle, flags, device_ordinal, true)?;
        let mut registered = write(&self.registered);
        if registered.contains_key(&handle) {
            return Err(Error::new(OpError::InvalidValue));
        }
        registered.insert(handle, Arc::new(state));
        Ok(())
    }

    /// `hipFileStreamDeregister`: not registered → 5022. Ops in flight keep their state.
    pub(crate) fn deregister(&self, handle: StreamHandle) -> Result<(), Error> {
        write(&self.registered).remove(&handle).map(drop).ok_or(Error::new(OpError::InvalidValue))
    }

    /// The state for an op on `handle`: the registered one, else the cached unregistered
    /// one (rebuilt when the stream now reports another device).
    pub(crate) fn lookup(
        &self,
        device: &dyn Device,
        handle: StreamHandle,
    ) -> Result<Arc<StreamState>, Error> {
        if let Some(state) = read(&self.registered).get(&handle) {
            return Ok(Arc::clone(state));
        }
        let device_ordinal = device.stream_device(handle).map_err(Error::device)?;
        if let Some(state) = read(&self.seen).get(&handle)
            && state.device_ordinal == device_ordinal
        {
            return Ok(Arc::clone(state));
        }
        let state = Arc::new(self.new_state(
            device,
            handle,
            StreamFlags::empty(),
            device_ordinal,
            false,
        )?);
        let mut seen = write(&self.seen);
        if seen.len() >= SEEN_STREAMS_KEPT {
            // Forget idle streams nothing else holds (likely destroyed by the
            // application): their words go back to the pool. One seen again gets a
            // new state, which is fine for a stream with no op of ours pending.
            seen.retain(|_, state| Arc::strong_count(state) > 1 || !state.idle());
        }
        seen.insert(handle, Arc::clone(&state));
        Ok(state)
    }

    fn new_state(
        &self,
        device: &dyn Device,
        handle: StreamHandle,
        flags: StreamFlags,
        device_ordinal: u32,
        registered: bool,
    ) -> Result<StreamState, Error> {
        let executor = {
            let mut next = self.next_executor.lock().unwrap_or_else(|p| p.into_inner());
            *next += 1;
            *next
        };
        let pair = self.words.take_pair()?;
        Ok(StreamState {
            handle,
            flags,
            device_ordinal,
            executor,
            registered,
            follows_null_stream: device.stream_follows_null_stream(handle).unwrap_or(true),
            word: pair.release,
            arms: ArmQueue::new(pair.doorbell),
            released_at_ns: std::sync::atomic::AtomicU64::new(0),
            next_sequence: Mutex::new(pair.sequence),
            prefetch_bytes: std::sync::atomic::AtomicU64::new(0),
            prefetch_budget: Arc::clone(&self.prefetch_budget),
            deferred: Mutex::new(std::collections::VecDeque::new()),
            words: Some(Arc::clone(&self.words)),
            serial: next_stream_serial(),
        })
    }
}
fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|p| p.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|p| p.into_inner())
}

impl ArmedStream for StreamState {
    fn arm_queue(&self) -> &ArmQueue {
        &self.arms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream_sharing(budget: &Arc<PrefetchBudget>) -> StreamState {
        let unused_word = ReleaseWord { host_ptr: std::ptr::null_mut(), device_addr: 0 };
        let mut state = StreamState::for_arm_tests(ArmQueue::new(unused_word));
        state.prefetch_budget = Arc::clone(budget);
        state
    }

    #[test]
    fn streams_share_the_drivers_prefetch_budget() {
        const MIB: u64 = 1 << 20;
        let budget = Arc::new(PrefetchBudget::new(48 * MIB));
        let (a, b) = (stream_sharing(&budget), stream_sharing(&budget));
        assert!(a.admit_prefetch(16 * MIB) && a.admit_prefetch(16 * MIB));
        // Stream a's window (32 MiB) is full; b has window but only 16 MiB of budget.
        assert!(!a.admit_prefetch(16 * MIB));
        assert!(b.admit_prefetch(16 * MIB));
        assert!(!b.admit_prefetch(16 * MIB), "budget full: 48 MiB held");
        // A refused admission takes nothing back from either count.
        a.release_prefetch(16 * MIB);
        assert!(b.admit_prefetch(16 * MIB), "a's release made room for b");
        assert!(!a.admit_prefetch(4 * MIB));
        for (state, held) in [(&a, 16), (&b, 32)] {
            state.release_prefetch(held * MIB);
        }
        assert_eq!(budget.used_bytes.load(std::sync::atomic::Ordering::SeqCst), 0);
        // An op larger than the whole budget still prefetches when nothing else is held.
        assert!(a.admit_prefetch(64 * MIB));
        // HIPFILE_PREFETCH_MB=0: nothing prefetches, not even a lone op.
        let off = stream_sharing(&Arc::new(PrefetchBudget::new(0)));
        assert!(!off.admit_prefetch(4096));
    }
}

#[cfg(test)]
mod word_recycling_tests {
    use super::*;
    use crate::device::cpu::CpuDevice;

    fn table() -> (StreamTable, Arc<CpuDevice>) {
        let device = CpuDevice::new(1);
        let as_device: Arc<dyn Device> = device.clone();
        (StreamTable::new(as_device, u64::MAX), device)
    }

    #[test]
    fn a_quiescent_pair_is_handed_out_again_continuing_its_sequence() {
        let (table, _device) = table();
        let pair = table.words.take_pair().unwrap();
        assert_eq!(pair.sequence, 0);
        // Ops 1..=5 ran: the stream rang 5 and the last release stored 5.
        pair.release.store(5);
        pair.doorbell.store(5);
        table.words.give_back(pair.release, pair.doorbell, 5);
        assert_eq!(table.words.recycled(), (1, 0));
        let again = table.words.take_pair().unwrap();
        assert_eq!(again.release.device_addr, pair.release.device_addr);
        assert_eq!(again.doorbell.device_addr, pair.doorbell.device_addr);
        assert_eq!(again.sequence, 5, "numbering continues: the words only grow");
        assert_eq!(again.release.load(), 5);
    }

    #[test]
    fn a_pair_with_a_write_still_queued_waits_until_it_lands() {
        let (table, _device) = table();
        let pair = table.words.take_pair().unwrap();
        // Op 3 was handed out; the stream has rung only 2 (its doorbell write for 3 is
        // still queued), every op was released.
        pair.release.store(3);
        pair.doorbell.store(2);
        table.words.give_back(pair.release, pair.doorbell, 3);
        assert_eq!(table.words.recycled(), (0, 1));
        let other = table.words.take_pair().unwrap();
        assert_ne!(other.release.device_addr, pair.release.device_addr, "not reused yet");
        pair.doorbell.store(3);
        let again = table.words.take_pair().unwrap();
        assert_eq!(again.release.device_addr, pair.release.device_addr, "reused once quiescent");
        assert_eq!(again.sequence, 3);
    }

    #[test]
    fn register_deregister_cycles_reuse_the_same_words() {
        let (table, device) = table();
        let stream = device.create_stream(0).unwrap();
        for _ in 0..10_000 {
            table.register(&*device, stream, 0xF).unwrap();
            table.deregister(stream).unwrap();
        }
        let state = table.words.lock();
        assert_eq!(state.slabs.len(), 1, "one slab of words serves every cycle");
        assert_eq!((state.free.len(), state.retired.len()), (1, 0));
    }

    #[test]
    fn idle_unregistered_streams_are_forgotten_past_the_limit() {
        let (table, device) = table();
        for _ in 0..4 * SEEN_STREAMS_KEPT {
            let stream = device.create_stream(0).unwrap();
            drop(table.lookup(&*device, stream).unwrap());
            device.destroy_stream(stream).unwrap();
        }
        assert!(read(&table.seen).len() <= SEEN_STREAMS_KEPT);
        let state = table.words.lock();
        assert!(state.slabs.len() <= 2, "{} slabs", state.slabs.len());
    }
}
