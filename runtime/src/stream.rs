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

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use hipfile_core::{OpError, StreamFlags};

use crate::arm::ArmQueue;
use crate::device::{Device, PinnedRegion, StreamHandle};
use crate::error::Error;

/// Bytes of fully FIXED reads one stream may have prefetching at once: prefetch reads
/// ahead of the stream into staging, so an unbounded burst would fill every arena with
/// data the stream is not ready for; reads beyond the window start when the stream
/// reaches them.
pub const PREFETCH_WINDOW_BYTES: u64 = 32 << 20;

/// The prefetch bytes all streams of a driver may hold at once: half the engine's
/// staging arenas. Prefetched data sits in arena staging until its stream reaches the op;
/// past this share, the reads of ops that streams did reach would find the arenas full
/// and stage through heap buffers and fallback copies (on the cpu device, 8 streams of
/// 16 MiB reads ran 3.7x slower than the sync path that way).
#[derive(Debug)]
pub(crate) struct PrefetchBudget {
    cap_bytes: u64,
    used_bytes: std::sync::atomic::AtomicU64,
}

impl PrefetchBudget {
    pub(crate) fn new(cap_bytes: u64) -> PrefetchBudget {
        PrefetchBudget { cap_bytes, used_bytes: std::sync::atomic::AtomicU64::new(0) }
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

/// A stream's release word: host pointer and device address of the same 4 bytes.
#[derive(Clone, Copy)]
pub(crate) struct ReleaseWord {
    pub host_ptr: *mut u32,
    pub device_addr: u64,
}

impl ReleaseWord {
    /// The word's value as the host sees it now.
    pub(crate) fn load(&self) -> u32 {
        // SAFETY: the word lies in a pinned slab of the driver's WordPool, which outlives
        // every stream state and op holding the word; it is aligned and only accessed
        // atomically (by the host) or by the device's stream memory operations.
        unsafe { std::sync::atomic::AtomicU32::from_ptr(self.host_ptr) }
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// Stores `value` as the host (the poller's unit tests ring doorbells with it).
    #[cfg(test)]
    pub(crate) fn store(&self, value: u32) {
        // SAFETY: as in `load`; the tests' words outlive every reader.
        unsafe { std::sync::atomic::AtomicU32::from_ptr(self.host_ptr) }
            .store(value, std::sync::atomic::Ordering::Release);
    }
}

// SAFETY: a ReleaseWord is the address of pinned memory owned by the driver's WordPool,
// which lives as long as the driver; it is only accessed atomically.
unsafe impl Send for ReleaseWord {}
// SAFETY: as above.
unsafe impl Sync for ReleaseWord {}

/// Hands out release words from pinned slabs. Slabs live until the pool drops.
pub(crate) struct WordPool {
    device: Arc<dyn Device>,
    state: Mutex<(Vec<PinnedRegion>, usize)>,
}

impl WordPool {
    pub(crate) fn new(device: Arc<dyn Device>) -> WordPool {
        WordPool { device, state: Mutex::new((Vec::new(), WORDS_PER_SLAB)) }
    }

    /// A fresh word, set to 0.
    fn take(&self) -> Result<ReleaseWord, Error> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.1 == WORDS_PER_SLAB {
            let slab = self.device.alloc_pinned(WORDS_PER_SLAB * 4).map_err(Error::device)?;
            state.0.push(slab);
            state.1 = 0;
        }
        let slab = *state.0.last().expect("a slab was just ensured");
        let index = state.1;
        state.1 += 1;
        // SAFETY: index < WORDS_PER_SLAB, so the word lies inside the slab.
        let host_ptr = unsafe { slab.host_ptr.cast::<u32>().add(index) };
        // SAFETY: the word is inside a live pinned slab, aligned, and not yet shared.
        unsafe { host_ptr.write_volatile(0) };
        Ok(ReleaseWord { host_ptr, device_addr: slab.device_addr + 4 * index as u64 })
    }
}

impl Drop for WordPool {
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        for slab in state.0.drain(..) {
            // SAFETY: the slabs came from alloc_pinned on this device; the driver (and so
            // every stream state and op) is gone, so no new wait can use them.
            unsafe { self.device.free_pinned(slab) };
        }
    }
}

/// What the library knows about one stream.
pub struct StreamState {
    /// The user's stream.
    pub handle: StreamHandle,
    /// Registration flags (empty for unregistered streams).
    pub flags: StreamFlags,
    /// The stream's device.
    pub device_ordinal: u32,
    /// The executor the stream's ops run on.
    pub executor: usize,
    /// Whether the user registered it.
    pub registered: bool,
    word: ReleaseWord,
    arms: ArmQueue,
    next_sequence: Mutex<u32>,
    prefetch_bytes: std::sync::atomic::AtomicU64,
    prefetch_budget: Arc<PrefetchBudget>,
    deferred: Mutex<std::collections::VecDeque<DeferredPrefetch>>,
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

    /// A state over `arms` with a dangling release word, for the poller's unit tests.
    #[cfg(test)]
    pub(crate) fn for_arm_tests(arms: ArmQueue) -> StreamState {
        StreamState {
            handle: StreamHandle::NULL,
            flags: StreamFlags::empty(),
            device_ordinal: 0,
            executor: 0,
            registered: false,
            word: ReleaseWord { host_ptr: std::ptr::null_mut(), device_addr: 0 },
            arms,
            next_sequence: Mutex::new(0),
            prefetch_bytes: std::sync::atomic::AtomicU64::new(0),
            prefetch_budget: Arc::new(PrefetchBudget::new(u64::MAX)),
            deferred: Mutex::new(std::collections::VecDeque::new()),
        }
    }

    /// The stream's doorbell and the ops waiting for it (see [`crate::arm`]).
    pub(crate) fn arm_queue(&self) -> &ArmQueue {
        &self.arms
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
        if !PrefetchBudget::take(&budget.used_bytes, budget.cap_bytes, len_bytes) {
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
        let submitted = *self.next_sequence.lock().unwrap_or_else(|p| p.into_inner());
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

    /// Whether every op submitted on the stream was released.
    pub(crate) fn idle(&self) -> bool {
        *self.next_sequence.lock().unwrap_or_else(|p| p.into_inner()) == self.word.load()
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

    /// Gives the sequence number back (the enqueue failed before anything was queued).
    pub(crate) fn undo(&mut self) {
        *self.0 = self.0.wrapping_sub(1);
    }
}

/// Registered streams and the streams seen unregistered.
pub(crate) struct StreamTable {
    words: WordPool,
    registered: RwLock<HashMap<StreamHandle, Arc<StreamState>>>,
    seen: RwLock<HashMap<StreamHandle, Arc<StreamState>>>,
    next_executor: Mutex<usize>,
    prefetch_budget: Arc<PrefetchBudget>,
}

impl StreamTable {
    /// Streams over `device` whose prefetches share `prefetch_cap_bytes`.
    pub(crate) fn new(device: Arc<dyn Device>, prefetch_cap_bytes: u64) -> StreamTable {
        StreamTable {
            prefetch_budget: Arc::new(PrefetchBudget::new(prefetch_cap_bytes)),
            words: WordPool::new(device),
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
        let state = self.new_state(handle, flags, device_ordinal, true)?;
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
        let state =
            Arc::new(self.new_state(handle, StreamFlags::empty(), device_ordinal, false)?);
        write(&self.seen).insert(handle, Arc::clone(&state));
        Ok(state)
    }

    fn new_state(
        &self,
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
        Ok(StreamState {
            handle,
            flags,
            device_ordinal,
            executor,
            registered,
            word: self.words.take()?,
            arms: ArmQueue::new(self.words.take()?),
            next_sequence: Mutex::new(0),
            prefetch_bytes: std::sync::atomic::AtomicU64::new(0),
            prefetch_budget: Arc::clone(&self.prefetch_budget),
            deferred: Mutex::new(std::collections::VecDeque::new()),
        })
    }
}
fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|p| p.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|p| p.into_inner())
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
