//! The `cpu` device: a real, in-process device that behaves like a GPU runtime.
//!
//! Everything lives in host memory, so a device address equals the host address of the
//! same bytes. What makes it a faithful stand-in for CUDA/HIP is the stream model:
//!
//! * **Streams** are FIFO command queues, each executed in order by its own worker thread
//!   (named `hfcpu-s<handle>`). Work on one stream never starts before the stream's earlier
//!   work finished; different streams run in parallel. An idle worker parks on a
//!   `Condvar` and burns no CPU.
//! * **Memory is tracked.** Every allocation (device, managed, pinned host, registered
//!   host) is recorded, and every command checks its address ranges against the records
//!   when it is enqueued *and again* when it executes (under a read lock that keeps the
//!   memory alive during the copy). An async copy whose device side is not inside one
//!   device allocation, or whose host side is not inside one pinned host range, fails with
//!   `hipErrorInvalidValue`: this is how the device catches a library that stages through
//!   unpinned memory, copies past a buffer's end, or frees memory that queued work still
//!   uses (the latter becomes a sticky asynchronous error of the stream).
//! * **Stream memory operations**: a wait-value command blocks its stream until a 32-bit
//!   word is `>=` a value. The word may be released by a write-value command on any
//!   stream, by [`CpuDevice::store_word`], or by a plain atomic store from any thread (as a
//!   host releases a GPU stream). A waiting worker spins for about 20 µs, then sleeps with
//!   exponential backoff (10 µs doubling up to 200 µs) and is woken at once by write-value
//!   commands and `store_word`. **Worst-case extra latency of a plain atomic store is
//!   therefore about 200 µs** (one backoff period) plus scheduling delay.
//! * **Events** are tickets in a stream's sequence: an event is complete once every
//!   command enqueued before it has completed.
//! * **Asynchronous errors** (a command whose ranges are no longer valid when it runs) are
//!   sticky per stream, as in CUDA: the stream keeps running, and every later
//!   synchronize, and every event recorded after the failed command, reports the error.
//!
//! The NULL stream (`StreamHandle(0)`) is created on first use, on device 0; it behaves as
//! an ordinary stream (per-thread default stream semantics: it does not synchronize with
//! other streams). Its [`DeviceInfo::stream_device`] is the calling thread's current device.
//!
//! Stream and event handles come from one process-wide counter: unique, never 0, never
//! reused. User streams and internal streams share that namespace and are the same kind
//! of stream; either handle type may name either. The device makes its
//! [`InternalStream`]s and [`EventHandle`]s with `from_raw` and ignores a handle's owner:
//! every raw id is looked up in its registry and an unknown one is an error
//! (`HIP_ERROR_INVALID_HANDLE`), as HIP treats stream and event ids, so a forged handle
//! names at worst another live stream or event, never freed memory.
//!
//! Dropping the device closes every stream; each worker drains its queue. A wait-value
//! still unsatisfied 100 ms after the drop began is abandoned together with everything
//! queued after it on that stream (as destroying a GPU context with pending work would),
//! so a drop never hangs on a forgotten wait. Remaining allocations are freed once the
//! device and every [`StreamGate`] are gone.

use core::ffi::c_void;
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::panic::{self, AssertUnwindSafe};
use std::sync::RwLockWriteGuard;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::{
    DeviceCopies, DeviceError, DeviceEvents, DeviceInfo, DeviceKind, EventHandle, HostFn,
    HostMemory, InternalStream, MemoryType, PinnedRegion, PointerInfo, StreamHandle,
    StreamMemoryOps,
};

/// Alignment of every allocation the device makes.
const ALIGNMENT_BYTES: usize = 4096;
/// How long a wait-value spins before it starts sleeping.
const WAIT_SPIN: Duration = Duration::from_micros(20);
/// First sleep of a wait-value after spinning.
const WAIT_FIRST_SLEEP: Duration = Duration::from_micros(10);
/// Longest sleep of a wait-value: the worst-case latency of a plain atomic store.
const WAIT_MAX_SLEEP: Duration = Duration::from_micros(200);
/// How long a wait-value may stay unsatisfied once the device is being dropped.
const SHUTDOWN_WAIT_GRACE: Duration = Duration::from_millis(100);

/// Process-wide source of stream and event handles (never 0, never reused).
static NEXT_HANDLE: AtomicUsize = AtomicUsize::new(1);
/// Process-wide source of device instance ids (keys of the per-thread current device).
static NEXT_INSTANCE: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// Per-thread current device, per device instance: `(instance id, ordinal)`.
    static CURRENT_DEVICES: RefCell<Vec<(u64, u32)>> = const { RefCell::new(Vec::new()) };
}

fn next_handle() -> usize {
    NEXT_HANDLE.fetch_add(1, Ordering::Relaxed)
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn read<T>(rw: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    rw.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<T>(rw: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    rw.write().unwrap_or_else(PoisonError::into_inner)
}

const fn invalid_value(what: &'static str) -> DeviceError {
    DeviceError::new(DeviceError::HIP_ERROR_INVALID_VALUE, what)
}

const fn invalid_handle(what: &'static str) -> DeviceError {
    DeviceError::new(DeviceError::HIP_ERROR_INVALID_HANDLE, what)
}

const fn out_of_memory(what: &'static str) -> DeviceError {
    DeviceError::new(DeviceError::HIP_ERROR_OUT_OF_MEMORY, what)
}

// ---------------------------------------------------------------------------------------
// Memory registry
// ---------------------------------------------------------------------------------------

/// Where a tracked range came from (decides who may release it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    /// Allocated by the device for a user (`malloc_*`, `alloc_pinned`).
    Allocated,
    /// Host memory owned by someone else, registered with `register_host`.
    Registered,
    /// A gate word owned by a [`StreamGate`].
    Gate,
}

/// One tracked range.
#[derive(Clone, Copy, Debug)]
struct Allocation {
    len_bytes: usize,
    memory_type: MemoryType,
    device_ordinal: u32,
    origin: Origin,
}

impl Allocation {
    fn owns_memory(&self) -> bool {
        self.origin != Origin::Registered
    }
}

/// The mapping behind one allocation: a `PROT_NONE` guard page, the allocation's pages
/// (read-write, zeroed), another guard page. A read or write just outside the allocation
/// faults instead of touching a neighbour: before its start exactly, after its end
/// exactly when the length is a multiple of the page size (else within the slack of its
/// last page). `(mapping start, mapping length)` for an allocation at `base`.
fn guarded_mapping(base: u64, len_bytes: usize) -> Option<(usize, usize)> {
    let page = crate::sys::page_size_bytes() as usize;
    let body = len_bytes.checked_next_multiple_of(page)?;
    Some(((base as usize).checked_sub(page)?, body.checked_add(2 * page)?))
}

/// Maps `len_bytes` of zeroed memory between two guard pages ([`guarded_mapping`]);
/// returns the allocation's address (page-aligned, so [`ALIGNMENT_BYTES`]-aligned).
fn map_guarded(len_bytes: usize) -> Result<u64, DeviceError> {
    let page = crate::sys::page_size_bytes() as usize;
    debug_assert!(page >= ALIGNMENT_BYTES && page.is_multiple_of(ALIGNMENT_BYTES));
    let too_large = || out_of_memory("allocation too large");
    let body = len_bytes.checked_next_multiple_of(page).ok_or_else(too_large)?;
    let total = body.checked_add(2 * page).ok_or_else(too_large)?;
    // SAFETY: a fresh anonymous private mapping; no existing memory is affected.
    let start = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            total,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if start == libc::MAP_FAILED {
        return Err(out_of_memory("mmap failed"));
    }
    let body_start = start as usize + page;
    // SAFETY: the body lies inside the mapping made above.
    let opened = unsafe {
        libc::mprotect(body_start as *mut c_void, body, libc::PROT_READ | libc::PROT_WRITE)
    };
    if opened != 0 {
        // SAFETY: unmaps exactly the mapping made above, which nothing else uses.
        unsafe { libc::munmap(start, total) };
        return Err(out_of_memory("mprotect failed"));
    }
    Ok(body_start as u64)
}

type AllocationMap = BTreeMap<u64, Allocation>;

/// The allocation holding `addr`, if any, as `(base, allocation)`.
fn find(map: &AllocationMap, addr: u64) -> Option<(u64, Allocation)> {
    let (&base, &allocation) = map.range(..=addr).next_back()?;
    (addr - base < allocation.len_bytes as u64).then_some((base, allocation))
}

/// Checks that `addr..addr+len_bytes` lies inside one tracked allocation whose memory type
/// `accept`s; returns that memory type.
fn check_range(
    map: &AllocationMap,
    addr: u64,
    len_bytes: usize,
    accept: fn(MemoryType) -> bool,
    what: &'static str,
) -> Result<MemoryType, DeviceError> {
    let (base, allocation) = find(map, addr).ok_or(invalid_value(what))?;
    let end = addr.checked_add(len_bytes as u64).ok_or(invalid_value(what))?;
    if !accept(allocation.memory_type) || end > base + allocation.len_bytes as u64 {
        return Err(invalid_value(what));
    }
    Ok(allocation.memory_type)
}

fn is_device(memory_type: MemoryType) -> bool {
    memory_type == MemoryType::Device
}

fn is_pinned_host(memory_type: MemoryType) -> bool {
    memory_type == MemoryType::Host
}

fn is_any(_memory_type: MemoryType) -> bool {
    true
}

/// Checks that a 32-bit word is 4-byte aligned and inside one tracked allocation.
fn check_word(map: &AllocationMap, word_addr: u64) -> Result<(), DeviceError> {
    if !word_addr.is_multiple_of(4) {
        return Err(invalid_value("stream memory word is not 4-byte aligned"));
    }
    check_range(map, word_addr, 4, is_any, "stream memory word is not tracked memory")?;
    Ok(())
}

/// All tracked memory of one device.
#[derive(Default)]
struct MemoryRegistry {
    map: RwLock<AllocationMap>,
}

impl MemoryRegistry {
    /// Allocates zeroed, page-aligned memory between guard pages and tracks it.
    fn allocate(
        &self,
        len_bytes: usize,
        memory_type: MemoryType,
        device_ordinal: u32,
        origin: Origin,
    ) -> Result<u64, DeviceError> {
        if len_bytes == 0 {
            return Err(invalid_value("zero-length allocation"));
        }
        let base = map_guarded(len_bytes)?;
        let allocation = Allocation { len_bytes, memory_type, device_ordinal, origin };
        write(&self.map).insert(base, allocation);
        Ok(base)
    }

    /// Tracks existing host memory as pinned host memory.
    fn register(&self, base: u64, len_bytes: usize) -> Result<(), DeviceError> {
        let end = base.checked_add(len_bytes as u64);
        let end = match end {
            Some(end) if base != 0 && len_bytes != 0 => end,
            _ => return Err(invalid_value("invalid host range to register")),
        };
        let mut map = write(&self.map);
        let overlaps_before = find(&map, base).is_some();
        let overlaps_after = map.range(base..end).next().is_some();
        if overlaps_before || overlaps_after {
            return Err(invalid_value("host range overlaps tracked memory"));
        }
        let allocation = Allocation {
            len_bytes,
            memory_type: MemoryType::Host,
            device_ordinal: 0,
            origin: Origin::Registered,
        };
        map.insert(base, allocation);
        Ok(())
    }

    /// `(base, length in bytes)` of every range registered with `register_host`.
    fn registered_ranges(&self) -> Vec<(u64, usize)> {
        read(&self.map)
            .iter()
            .filter(|(_, allocation)| allocation.origin == Origin::Registered)
            .map(|(&base, allocation)| (base, allocation.len_bytes))
            .collect()
    }

    /// Stops tracking the range starting at `base` if `accept` approves it, and frees the
    /// memory the device owns.
    fn release(&self, base: u64, accept: impl Fn(&Allocation) -> bool) -> Result<(), DeviceError> {
        let mut map = write(&self.map);
        let allocation = match map.get(&base) {
            Some(allocation) if accept(allocation) => *allocation,
            _ => return Err(invalid_value("not the base of a matching allocation")),
        };
        map.remove(&base);
        drop(map);
        if allocation.owns_memory() {
            // SAFETY: the range was allocated by `allocate` with this layout and has just
            // been removed from the registry, so it is freed exactly once.
            unsafe { dealloc(base, allocation.len_bytes) };
        }
        Ok(())
    }
}

/// Frees memory from `MemoryRegistry::allocate`, with its guard pages.
///
/// # Safety
/// `base` came from `map_guarded(len_bytes)` and is freed once.
unsafe fn dealloc(base: u64, len_bytes: usize) {
    if let Some((start, total)) = guarded_mapping(base, len_bytes) {
        // SAFETY: guaranteed by the caller: the whole mapping is ours and unused.
        unsafe { libc::munmap(start as *mut c_void, total) };
    }
}

impl Drop for MemoryRegistry {
    fn drop(&mut self) {
        let map = std::mem::take(self.map.get_mut().unwrap_or_else(PoisonError::into_inner));
        for (base, allocation) in map {
            if allocation.owns_memory() {
                // SAFETY: every owned range in the registry came from `allocate`, and the
                // registry is going away, so nothing can free it again.
                unsafe { dealloc(base, allocation.len_bytes) };
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Statistics
// ---------------------------------------------------------------------------------------

/// A snapshot of a [`CpuDevice`]'s counters (for tests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuDeviceStats {
    /// Bytes copied from host memory to device memory (internal-stream copies and
    /// `memcpy_async` from a host range to a device range).
    pub bytes_host_to_device: u64,
    /// Bytes copied from device memory to host memory.
    pub bytes_device_to_host: u64,
    /// Bytes copied by `memcpy_async` between other kinds of memory.
    pub bytes_copied_other: u64,
    /// Bytes written by `memset_async`.
    pub bytes_memset: u64,
    /// Host functions and host closures invoked (including those that panicked).
    pub host_fns_run: u64,
    /// Host closures that panicked (caught; their stream kept running).
    pub host_fn_panics: u64,
    /// Wait-value commands that completed (their condition became true).
    pub wait_values_executed: u64,
    /// Write-value commands executed.
    pub write_values_executed: u64,
    /// Commands that failed when they executed (sticky asynchronous stream errors).
    pub async_errors: u64,
    /// Releases through trait methods that cannot report errors (`free_pinned`,
    /// `unregister_host`, `destroy_internal_stream`, `destroy_event`) that named nothing
    /// known: a double free or a wrong handle in the caller.
    pub invalid_releases: u64,
    /// [`DeviceCopies::copy_now`] calls, and those told that async ops may hold application
    /// streams (the CUDA backend bounces short copies then).
    pub caller_copies: u64,
    /// See [`CpuDeviceStats::caller_copies`].
    pub caller_copies_while_ops_hold_streams: u64,
}

/// The live counters behind [`CpuDeviceStats`].
#[derive(Default)]
struct StatCounters {
    bytes_host_to_device: AtomicU64,
    bytes_device_to_host: AtomicU64,
    bytes_copied_other: AtomicU64,
    bytes_memset: AtomicU64,
    host_fns_run: AtomicU64,
    host_fn_panics: AtomicU64,
    wait_values_executed: AtomicU64,
    write_values_executed: AtomicU64,
    async_errors: AtomicU64,
    invalid_releases: AtomicU64,
    caller_copies: AtomicU64,
    caller_copies_while_ops_hold_streams: AtomicU64,
}

fn bump(counter: &AtomicU64, amount: u64) {
    counter.fetch_add(amount, Ordering::Relaxed);
}

impl StatCounters {
    fn snapshot(&self) -> CpuDeviceStats {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        CpuDeviceStats {
            bytes_host_to_device: get(&self.bytes_host_to_device),
            bytes_device_to_host: get(&self.bytes_device_to_host),
            bytes_copied_other: get(&self.bytes_copied_other),
            bytes_memset: get(&self.bytes_memset),
            host_fns_run: get(&self.host_fns_run),
            host_fn_panics: get(&self.host_fn_panics),
            wait_values_executed: get(&self.wait_values_executed),
            write_values_executed: get(&self.write_values_executed),
            async_errors: get(&self.async_errors),
            invalid_releases: get(&self.invalid_releases),
            caller_copies: get(&self.caller_copies),
            caller_copies_while_ops_hold_streams: get(&self.caller_copies_while_ops_hold_streams),
        }
    }
}

// ---------------------------------------------------------------------------------------
// State shared with the workers
// ---------------------------------------------------------------------------------------

/// Wakes workers sleeping in a wait-value.
#[derive(Default)]
struct WordWaker {
    /// Number of workers sleeping on `cv`.
    sleepers: Mutex<usize>,
    cv: Condvar,
}

impl WordWaker {
    fn wake_all(&self) {
        let sleepers = lock(&self.sleepers);
        if *sleepers > 0 {
            self.cv.notify_all();
        }
    }
}

/// Which rule an async copy's address ranges must satisfy.
#[derive(Clone, Copy, Debug)]
enum CopyRule {
    /// Target in one device allocation, source in one pinned host range.
    HostToDevice,
    /// Target in one pinned host range, source in one device allocation.
    DeviceToHost,
    /// Both sides in tracked allocations of any type.
    AnyTracked,
}

/// Which counter an executed copy adds to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Direction {
    HostToDevice,
    DeviceToHost,
    Other,
}

impl CopyRule {
    fn check(
        self,
        map: &AllocationMap,
        target: u64,
        source: u64,
        len_bytes: usize,
    ) -> Result<Direction, DeviceError> {
        match self {
            CopyRule::HostToDevice => {
                check_range(map, target, len_bytes, is_device, "copy target not in device memory")?;
                check_range(map, source, len_bytes, is_pinned_host, "copy source not pinned host")?;
                Ok(Direction::HostToDevice)
            }
            CopyRule::DeviceToHost => {
                check_range(map, target, len_bytes, is_pinned_host, "copy target not pinned host")?;
                check_range(map, source, len_bytes, is_device, "copy source not in device memory")?;
                Ok(Direction::DeviceToHost)
            }
            CopyRule::AnyTracked => {
                let to = check_range(map, target, len_bytes, is_any, "copy target not tracked")?;
                let from = check_range(map, source, len_bytes, is_any, "copy source not tracked")?;
                Ok(match (from, to) {
                    (MemoryType::Host, MemoryType::Device) => Direction::HostToDevice,
                    (MemoryType::Device, MemoryType::Host) => Direction::DeviceToHost,
                    _ => Direction::Other,
                })
            }
        }
    }
}

/// State shared by the device object, its workers and its gates.
#[derive(Default)]
struct Shared {
    memory: MemoryRegistry,
    waker: WordWaker,
    stats: StatCounters,
    shutting_down: AtomicBool,
}

/// What became of one executed command.
enum Outcome {
    Done,
    Failed(DeviceError),
    /// A wait-value given up at device drop: the rest of the stream is discarded.
    Abandoned,
}

impl Shared {
    /// Blocks until `word >= value` in CUDA's cyclic sense (`(word - value) as i32 >= 0`,
    /// so release counters may wrap); `false` if abandoned because the device is dropping.
    fn wait_for_word(&self, word: &AtomicU32, value: u32) -> bool {
        let satisfied = || word.load(Ordering::Acquire).wrapping_sub(value) as i32 >= 0;
        let spin_end = Instant::now() + WAIT_SPIN;
        while Instant::now() < spin_end {
            if satisfied() {
                return true;
            }
            std::hint::spin_loop();
        }
        let mut sleep = WAIT_FIRST_SLEEP;
        let mut shutdown_seen: Option<Instant> = None;
        let mut sleepers = lock(&self.waker.sleepers);
        loop {
            // Checked under the waker lock: a waking store either happened before this
            // check (and is seen) or notifies after we are asleep.
            if satisfied() {
                return true;
            }
            if self.shutting_down.load(Ordering::Acquire) {
                let since = *shutdown_seen.get_or_insert_with(Instant::now);
                if since.elapsed() >= SHUTDOWN_WAIT_GRACE {
                    return false;
                }
            }
            *sleepers += 1;
            let woken = self.waker.cv.wait_timeout(sleepers, sleep);
            sleepers = woken.unwrap_or_else(PoisonError::into_inner).0;
            *sleepers -= 1;
            sleep = (sleep * 2).min(WAIT_MAX_SLEEP);
        }
    }

    /// Atomically stores `value` to a word and wakes every waiting worker.
    ///
    /// # Safety
    /// `word_addr` is a live, 4-byte-aligned word only accessed atomically meanwhile.
    unsafe fn store_and_wake(&self, word_addr: u64, value: u32) {
        // SAFETY: guaranteed by the caller.
        let word = unsafe { AtomicU32::from_ptr(word_addr as usize as *mut u32) };
        word.store(value, Ordering::Release);
        self.waker.wake_all();
    }

    fn wait_value(&self, word_addr: u64, value: u32) -> Outcome {
        if let Err(error) = check_word(&read(&self.memory.map), word_addr) {
            return Outcome::Failed(error);
        }
        // SAFETY: the word is tracked (checked just above) and 4-byte aligned, and the
        // enqueuer promised (`stream_wait_value32`'s contract, or a gate's keep-alive) that
        // it stays allocated until the wait is satisfied.
        let word = unsafe { AtomicU32::from_ptr(word_addr as usize as *mut u32) };
        if !self.wait_for_word(word, value) {
            return Outcome::Abandoned;
        }
        bump(&self.stats.wait_values_executed, 1);
        Outcome::Done
    }

    fn write_value(&self, word_addr: u64, value: u32) -> Outcome {
        let map = read(&self.memory.map);
        if let Err(error) = check_word(&map, word_addr) {
            return Outcome::Failed(error);
        }
        // SAFETY: the word is tracked, aligned, and kept allocated by the read lock held
        // across the store; the enqueuer promised only atomic access to it.
        unsafe { self.store_and_wake(word_addr, value) };
        drop(map);
        bump(&self.stats.write_values_executed, 1);
        Outcome::Done
    }

    fn copy(&self, target: u64, source: u64, len_bytes: usize, rule: CopyRule) -> Outcome {
        let map = read(&self.memory.map);
        let direction = match rule.check(&map, target, source, len_bytes) {
            Ok(direction) => direction,
            Err(error) => return Outcome::Failed(error),
        };
        // SAFETY: both ranges lie inside live tracked allocations (checked above; the read
        // lock held across the copy keeps them from being freed), and the enqueuer promised
        // the stream exclusive use of the target range until the copy completes.
        unsafe {
            std::ptr::copy(source as usize as *const u8, target as usize as *mut u8, len_bytes);
        }
        drop(map);
        let counter = match direction {
            Direction::HostToDevice => &self.stats.bytes_host_to_device,
            Direction::DeviceToHost => &self.stats.bytes_device_to_host,
            Direction::Other => &self.stats.bytes_copied_other,
        };
        bump(counter, len_bytes as u64);
        Outcome::Done
    }

    fn memset(&self, target: u64, value: u8, len_bytes: usize) -> Outcome {
        let map = read(&self.memory.map);
        if let Err(error) = check_range(&map, target, len_bytes, is_any, "memset not tracked") {
            return Outcome::Failed(error);
        }
        // SAFETY: the range lies inside a live tracked allocation kept alive by the read
        // lock, and the enqueuer promised the stream exclusive use of it.
        unsafe { std::ptr::write_bytes(target as usize as *mut u8, value, len_bytes) };
        drop(map);
        bump(&self.stats.bytes_memset, len_bytes as u64);
        Outcome::Done
    }

    fn run_host_call(&self, call: impl FnOnce()) -> Outcome {
        bump(&self.stats.host_fns_run, 1);
        if panic::catch_unwind(AssertUnwindSafe(call)).is_err() {
            bump(&self.stats.host_fn_panics, 1);
        }
        Outcome::Done
    }

    fn execute(&self, command: Command) -> Outcome {
        match command {
            Command::HostFn(call) => self.run_host_call(|| {
                // SAFETY: `launch_host_func`'s caller promised that `user_data` is valid
                // until `func` has run and that calling it on this thread is sound.
                unsafe { (call.func)(call.user_data) }
            }),
            Command::Closure(closure) => self.run_host_call(closure),
            Command::WaitValue { word_addr, value, keep_alive } => {
                let outcome = self.wait_value(word_addr, value);
                drop(keep_alive);
                outcome
            }
            Command::WriteValue { word_addr, value } => self.write_value(word_addr, value),
            Command::Copy { target, source, len_bytes, rule } => {
                self.copy(target, source, len_bytes, rule)
            }
            Command::Memset { target, value, len_bytes } => self.memset(target, value, len_bytes),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Streams
// ---------------------------------------------------------------------------------------

/// A host function with its argument, as `launch_host_func` received them.
struct HostCall {
    func: HostFn,
    user_data: *mut c_void,
}

// SAFETY: `launch_host_func`'s contract makes the caller promise that `func` is sound to
// call with `user_data` on another thread, which is all the worker does with them.
unsafe impl Send for HostCall {}

/// One command of a stream.
enum Command {
    HostFn(HostCall),
    Closure(Box<dyn FnOnce() + Send>),
    WaitValue { word_addr: u64, value: u32, keep_alive: Option<Arc<GateWord>> },
    WriteValue { word_addr: u64, value: u32 },
    Copy { target: u64, source: u64, len_bytes: usize, rule: CopyRule },
    Memset { target: u64, value: u8, len_bytes: usize },
}

/// A stream's queue and progress. Command `n` (1-based) has ticket `n`.
#[derive(Default)]
struct QueueState {
    commands: VecDeque<Command>,
    enqueued: u64,
    completed: u64,
    closing: bool,
    worker_idle: bool,
    done_waiters: usize,
    /// First command that failed: its ticket and error (sticky).
    first_error: Option<(u64, DeviceError)>,
}

/// The process the calling code runs in, kept by a `pthread_atfork` child handler (an
/// atomic load on the hot path, not a `getpid` call).
fn current_process() -> u32 {
    static CURRENT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    static HANDLER: std::sync::Once = std::sync::Once::new();
    extern "C" fn in_child() {
        // SAFETY: getpid is async-signal-safe, as a fork child handler requires.
        CURRENT.store(unsafe { libc::getpid() } as u32, Ordering::SeqCst);
    }
    HANDLER.call_once(|| {
        // SAFETY: getpid has no preconditions; pthread_atfork registers a handler that
        // only stores to an atomic.
        unsafe {
            CURRENT.store(libc::getpid() as u32, Ordering::SeqCst);
            libc::pthread_atfork(None, None, Some(in_child));
        }
    });
    CURRENT.load(Ordering::SeqCst)
}

/// The error every stream operation of a process's cpu device gives in a child that
/// process forked: the stream's worker thread does not exist there.
const FORKED: DeviceError = DeviceError::new(
    DeviceError::HIP_ERROR_NOT_INITIALIZED,
    "the cpu device's streams do not survive fork(): use them in the process that made them",
);

/// One stream, shared by the device object, its worker and its events.
struct StreamShared {
    device_ordinal: u32,
    /// The process whose worker thread runs the stream.
    process: u32,
    queue: Mutex<QueueState>,
    /// Signals the worker: new work or closing.
    work_cv: Condvar,
    /// Signals waiters: a command completed.
    done_cv: Condvar,
}

impl StreamShared {
    fn new(device_ordinal: u32) -> Self {
        StreamShared {
            device_ordinal,
            process: current_process(),
            queue: Mutex::default(),
            work_cv: Condvar::new(),
            done_cv: Condvar::new(),
        }
    }

    /// Fails in a forked child, before any lock (one held by another thread at fork time
    /// stays held there forever).
    fn check_process(&self) -> Result<(), DeviceError> {
        if self.process == current_process() { Ok(()) } else { Err(FORKED) }
    }

    fn enqueue(&self, command: Command) -> Result<u64, DeviceError> {
        self.check_process()?;
        let mut queue = lock(&self.queue);
        if queue.closing {
            return Err(invalid_handle("stream destroyed"));
        }
        queue.commands.push_back(command);
        queue.enqueued += 1;
        if queue.worker_idle {
            self.work_cv.notify_one();
        }
        Ok(queue.enqueued)
    }

    /// The ticket an event recorded now would have.
    fn current_ticket(&self) -> u64 {
        lock(&self.queue).enqueued
    }

    /// The error of the commands up to `ticket`, once they have all completed.
    fn error_up_to(queue: &QueueState, ticket: u64) -> Result<(), DeviceError> {
        match queue.first_error {
            Some((failed, error)) if failed <= ticket => Err(error),
            _ => Ok(()),
        }
    }

    /// Non-blocking: whether commands up to `ticket` have completed.
    fn is_done(&self, ticket: u64) -> Result<bool, DeviceError> {
        self.check_process()?;
        let queue = lock(&self.queue);
        if queue.completed < ticket {
            return Ok(false);
        }
        Self::error_up_to(&queue, ticket).map(|()| true)
    }

    /// Blocks until commands up to `ticket` have completed.
    fn wait_for(&self, ticket: u64) -> Result<(), DeviceError> {
        self.check_process()?;
        let mut queue = lock(&self.queue);
        queue.done_waiters += 1;
        while queue.completed < ticket {
            queue = self.done_cv.wait(queue).unwrap_or_else(PoisonError::into_inner);
        }
        queue.done_waiters -= 1;
        Self::error_up_to(&queue, ticket)
    }

    fn close(&self) {
        let mut queue = lock(&self.queue);
        queue.closing = true;
        self.work_cv.notify_one();
    }

    /// The next command and its ticket; `None` once closing and drained.
    fn next_command(&self) -> Option<(u64, Command)> {
        let mut queue = lock(&self.queue);
        loop {
            if let Some(command) = queue.commands.pop_front() {
                return Some((queue.completed + 1, command));
            }
            if queue.closing {
                return None;
            }
            queue.worker_idle = true;
            queue = self.work_cv.wait(queue).unwrap_or_else(PoisonError::into_inner);
            queue.worker_idle = false;
        }
    }

    /// Records the completion of command `ticket`; returns commands discarded after an
    /// abandoned wait (dropped by the caller, outside the lock).
    fn finish(&self, ticket: u64, outcome: Outcome, stats: &StatCounters) -> VecDeque<Command> {
        let mut queue = lock(&self.queue);
        queue.completed = ticket;
        let mut discarded = VecDeque::new();
        match outcome {
            Outcome::Done => {}
            Outcome::Failed(error) => {
                bump(&stats.async_errors, 1);
                queue.first_error.get_or_insert((ticket, error));
            }
            Outcome::Abandoned => {
                let error = DeviceError::new(
                    DeviceError::HIP_ERROR_UNKNOWN,
                    "wait-value abandoned: device dropped",
                );
                queue.first_error.get_or_insert((ticket, error));
                discarded = std::mem::take(&mut queue.commands);
                queue.completed = queue.enqueued;
                queue.closing = true;
            }
        }
        if queue.done_waiters > 0 {
            self.done_cv.notify_all();
        }
        discarded
    }
}

/// A stream worker: executes commands in order until the stream is closed and drained.
fn run_worker(shared: Arc<Shared>, stream: Arc<StreamShared>) {
    while let Some((ticket, command)) = stream.next_command() {
        let outcome = panic::catch_unwind(AssertUnwindSafe(|| shared.execute(command)))
            .unwrap_or_else(|_| {
                Outcome::Failed(DeviceError::new(
                    DeviceError::HIP_ERROR_UNKNOWN,
                    "cpu device: command panicked",
                ))
            });
        // Commands discarded after an abandoned wait are dropped here, outside the lock.
        drop(stream.finish(ticket, outcome, &shared.stats));
    }
}

/// A stream in the device's table: its shared state and its worker thread.
struct StreamEntry {
    shared: Arc<StreamShared>,
    worker: JoinHandle<()>,
}

/// An event: a ticket in one stream's sequence.
struct EventEntry {
    stream: Arc<StreamShared>,
    ticket: u64,
}

// ---------------------------------------------------------------------------------------
// Gates
// ---------------------------------------------------------------------------------------

/// The pinned word a [`StreamGate`] owns; freed once the gate and the wait that reads it
/// are both gone.
struct GateWord {
    shared: Arc<Shared>,
    addr: u64,
}

impl GateWord {
    fn open(&self) {
        // SAFETY: `addr` is a 4096-aligned tracked Gate allocation that this object owns and
        // frees only in its own `Drop`; it is only ever accessed atomically.
        unsafe { self.shared.store_and_wake(self.addr, 1) };
    }
}

impl Drop for GateWord {
    fn drop(&mut self) {
        let released = self.shared.memory.release(self.addr, |a| a.origin == Origin::Gate);
        debug_assert!(released.is_ok(), "gate word freed twice");
    }
}

/// A point at which a stream is held (see [`CpuDevice::pause_stream`]): work enqueued on
/// the stream after the gate does not start until the gate is released. Dropping an
/// unreleased gate releases it, so a stream is never left hanging.
pub struct StreamGate {
    word: Arc<GateWord>,
    released: bool,
}

impl StreamGate {
    /// Opens the gate: the stream proceeds past it (immediately if it is already waiting).
    pub fn release(mut self) {
        self.open();
    }

    /// Device address of the gate word (0 while closed, 1 once released).
    pub fn word_addr(&self) -> u64 {
        self.word.addr
    }

    fn open(&mut self) {
        if !self.released {
            self.released = true;
            self.word.open();
        }
    }
}

impl Drop for StreamGate {
    fn drop(&mut self) {
        self.open();
    }
}

impl core::fmt::Debug for StreamGate {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("StreamGate")
            .field("word_addr", &self.word.addr)
            .field("released", &self.released)
            .finish()
    }
}

// ---------------------------------------------------------------------------------------
// The device
// ---------------------------------------------------------------------------------------

/// The `cpu` device: `device_count` simulated devices whose memory is host memory and
/// whose streams are worker threads (see the module documentation).
///
/// Thread-safe; every method may be called from any thread.
pub struct CpuDevice {
    instance_id: u64,
    device_count: u32,
    /// Whether stream memory operations are reported as supported (tests turn it off to
    /// exercise the library's blocking fallback, as on a GPU without them).
    memops_reported: AtomicBool,
    shared: Arc<Shared>,
    streams: RwLock<HashMap<usize, StreamEntry>>,
    /// Workers of destroyed streams, still draining (joined at drop).
    retired: Mutex<Vec<JoinHandle<()>>>,
    events: Mutex<HashMap<usize, EventEntry>>,
    /// Streams for [`DeviceCopies::copy_now`] on callers' threads, per device, reused.
    caller_streams: Mutex<Vec<(u32, usize)>>,
}

impl core::fmt::Debug for CpuDevice {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CpuDevice")
            .field("device_count", &self.device_count)
            .field("streams", &read(&self.streams).len())
            .field("stats", &self.stats())
            .finish()
    }
}

impl CpuDevice {
    /// Creates a device object driving `device_count` simulated devices (ordinals
    /// `0..device_count`; 0 is allowed and makes every ordinal invalid).
    ///
    /// Returns an `Arc` because the device is meant to be shared (`Arc<dyn Device>`).
    pub fn new(device_count: u32) -> Arc<CpuDevice> {
        Arc::new(CpuDevice {
            instance_id: NEXT_INSTANCE.fetch_add(1, Ordering::Relaxed),
            device_count,
            memops_reported: AtomicBool::new(true),
            shared: Arc::default(),
            streams: RwLock::default(),
            retired: Mutex::default(),
            events: Mutex::default(),
            caller_streams: Mutex::default(),
        })
    }

    /// Makes [`DeviceInfo::supports_stream_memops`] report `supported` (the operations keep
    /// working): lets tests run the library's fallback for GPUs without stream memory
    /// operations.
    pub fn report_stream_memops(&self, supported: bool) {
        self.memops_reported.store(supported, Ordering::SeqCst);
    }

    fn check_ordinal(&self, device_ordinal: u32) -> Result<(), DeviceError> {
        if device_ordinal < self.device_count {
            Ok(())
        } else {
            Err(DeviceError::new(DeviceError::HIP_ERROR_INVALID_DEVICE, "invalid device ordinal"))
        }
    }

    /// Allocates `len_bytes` of zeroed device memory on `device_ordinal`, 4096-aligned.
    ///
    /// # Errors
    /// `HIP_ERROR_INVALID_DEVICE` for an invalid ordinal, `HIP_ERROR_INVALID_VALUE` for
    /// `len_bytes == 0`, `HIP_ERROR_OUT_OF_MEMORY` if the host allocator fails.
    pub fn malloc_device(&self, device_ordinal: u32, len_bytes: usize) -> Result<u64, DeviceError> {
        self.check_ordinal(device_ordinal)?;
        let memory = &self.shared.memory;
        memory.allocate(len_bytes, MemoryType::Device, device_ordinal, Origin::Allocated)
    }

    /// Frees device or managed memory from [`CpuDevice::malloc_device`] /
    /// [`CpuDevice::malloc_managed`].
    ///
    /// # Errors
    /// `HIP_ERROR_INVALID_VALUE` if `addr` is not the base of such an allocation.
    ///
    /// # Safety
    /// No reference into the allocation outlives this call, and no stream is inside a
    /// wait-value on a word of it. (Queued copies, memsets and write-values that still name
    /// it are safe: they fail with a sticky asynchronous error instead of running, unless
    /// a newer allocation has reused the addresses meanwhile.)
    pub unsafe fn free_device(&self, addr: u64) -> Result<(), DeviceError> {
        self.shared
            .memory
            .release(addr, |a| a.origin == Origin::Allocated && a.memory_type != MemoryType::Host)
    }

    /// Allocates `len_bytes` of zeroed managed memory (`MemoryType::Managed`, device 0),
    /// 4096-aligned; free it with [`CpuDevice::free_device`].
    ///
    /// # Errors
    /// `HIP_ERROR_INVALID_VALUE` for `len_bytes == 0`, `HIP_ERROR_OUT_OF_MEMORY`.
    pub fn malloc_managed(&self, len_bytes: usize) -> Result<u64, DeviceError> {
        self.shared.memory.allocate(len_bytes, MemoryType::Managed, 0, Origin::Allocated)
    }

    /// Allocates `len_bytes` of zeroed pinned host memory (`MemoryType::Host`),
    /// 4096-aligned; the device address equals the host address.
    ///
    /// # Errors
    /// `HIP_ERROR_INVALID_VALUE` for `len_bytes == 0`, `HIP_ERROR_OUT_OF_MEMORY`.
    pub fn malloc_host(&self, len_bytes: usize) -> Result<PinnedRegion, DeviceError> {
        let memory = &self.shared.memory;
        let base = memory.allocate(len_bytes, MemoryType::Host, 0, Origin::Allocated)?;
        Ok(PinnedRegion { host_ptr: base as usize as *mut u8, device_addr: base, len_bytes })
    }

    /// Frees pinned host memory from [`CpuDevice::malloc_host`] or
    /// [`HostMemory::alloc_pinned`] (the same as `free_pinned`, but reports errors).
    ///
    /// # Errors
    /// `HIP_ERROR_INVALID_VALUE` if `region` is not the start of such an allocation.
    ///
    /// # Safety
    /// No reference into the region outlives this call.
    pub unsafe fn free_host(&self, region: PinnedRegion) -> Result<(), DeviceError> {
        let base = region.host_ptr as usize as u64;
        self.shared
            .memory
            .release(base, |a| a.origin == Origin::Allocated && a.memory_type == MemoryType::Host)
    }

    fn spawn_stream(&self, handle: usize, device_ordinal: u32) -> Result<StreamEntry, DeviceError> {
        let stream = Arc::new(StreamShared::new(device_ordinal));
        let (shared, worker_stream) = (Arc::clone(&self.shared), Arc::clone(&stream));
        let worker = thread::Builder::new()
            .name(format!("hfcpu-s{handle}"))
            .spawn(move || run_worker(shared, worker_stream))
            .map_err(|_| out_of_memory("cannot spawn a stream worker thread"))?;
        Ok(StreamEntry { shared: stream, worker })
    }

    /// Creates a stream on `device_ordinal`, with its own worker thread (named
    /// `hfcpu-s<handle>`). Handles are unique in the process, never 0, never reused.
    ///
    /// # Errors
    /// `HIP_ERROR_INVALID_DEVICE`, or `HIP_ERROR_OUT_OF_MEMORY` if no thread can be spawned.
    pub fn create_stream(&self, device_ordinal: u32) -> Result<StreamHandle, DeviceError> {
        self.check_ordinal(device_ordinal)?;
        let handle = next_handle();
        let entry = self.spawn_stream(handle, device_ordinal)?;
        write(&self.streams).insert(handle, entry);
        Ok(StreamHandle(handle))
    }

    /// Destroys a stream, like `hipStreamDestroy`: the handle is invalid at once, the
    /// stream's queued work still runs to completion, then its worker thread exits. Does
    /// not block.
    ///
    /// # Errors
    /// `HIP_ERROR_INVALID_HANDLE` for the NULL stream or an unknown/destroyed stream.
    pub fn destroy_stream(&self, stream: StreamHandle) -> Result<(), DeviceError> {
        if stream == StreamHandle::NULL {
            return Err(invalid_handle("the NULL stream cannot be destroyed"));
        }
        let entry = write(&self.streams).remove(&stream.0);
        let entry = entry.ok_or(invalid_handle("unknown stream"))?;
        entry.shared.close();
        let mut retired = lock(&self.retired);
        retired.retain(|worker| !worker.is_finished());
        retired.push(entry.worker);
        Ok(())
    }

    /// The stream named by `handle` (the NULL stream is created on first use).
    fn stream(&self, handle: usize) -> Result<Arc<StreamShared>, DeviceError> {
        if let Some(entry) = read(&self.streams).get(&handle) {
            return Ok(Arc::clone(&entry.shared));
        }
        if handle != StreamHandle::NULL.0 {
            return Err(invalid_handle("unknown or destroyed stream"));
        }
        self.check_ordinal(0)?;
        let mut streams = write(&self.streams);
        if let Some(entry) = streams.get(&handle) {
            return Ok(Arc::clone(&entry.shared));
        }
        let entry = self.spawn_stream(handle, 0)?;
        let stream = Arc::clone(&entry.shared);
        streams.insert(handle, entry);
        Ok(stream)
    }

    /// Validates `check` against the memory registry, then enqueues `command`.
    fn enqueue_checked(
        &self,
        handle: usize,
        check: impl FnOnce(&AllocationMap) -> Result<(), DeviceError>,
        command: Command,
    ) -> Result<u64, DeviceError> {
        let stream = self.stream(handle)?;
        check(&read(&self.shared.memory.map))?;
        stream.enqueue(command)
    }

    fn enqueue_copy(
        &self,
        handle: usize,
        target: u64,
        source: u64,
        len_bytes: usize,
        rule: CopyRule,
    ) -> Result<(), DeviceError> {
        let check = |map: &AllocationMap| rule.check(map, target, source, len_bytes).map(drop);
        let command = Command::Copy { target, source, len_bytes, rule };
        self.enqueue_checked(handle, check, command).map(drop)
    }

    /// Enqueues a copy of `len_bytes` from `source` to `target` on a stream. Both ranges
    /// must each lie inside one tracked allocation of any type (device, managed, pinned or
    /// registered host); checked at enqueue time and again when the copy runs.
    ///
    /// # Errors
    /// `HIP_ERROR_INVALID_HANDLE` for an unknown stream, `HIP_ERROR_INVALID_VALUE` for a
    /// range outside tracked memory.
    ///
    /// # Safety
    /// Until the copy completes, nothing else writes `target..+len_bytes` or `source..
    /// +len_bytes`, and no Rust reference reads `target..+len_bytes`.
    pub unsafe fn memcpy_async(
        &self,
        stream: StreamHandle,
        target: u64,
        source: u64,
        len_bytes: usize,
    ) -> Result<(), DeviceError> {
        self.enqueue_copy(stream.0, target, source, len_bytes, CopyRule::AnyTracked)
    }

    /// Enqueues filling `target..target+len_bytes` with `value` on a stream. The range must
    /// lie inside one tracked allocation of any type.
    ///
    /// # Errors
    /// `HIP_ERROR_INVALID_HANDLE` for an unknown stream, `HIP_ERROR_INVALID_VALUE` for a
    /// range outside tracked memory.
    ///
    /// # Safety
    /// Until the fill completes, nothing else accesses `target..target+len_bytes`.
    pub unsafe fn memset_async(
        &self,
        stream: StreamHandle,
        target: u64,
        value: u8,
        len_bytes: usize,
    ) -> Result<(), DeviceError> {
        let check = |map: &AllocationMap| {
            check_range(map, target, len_bytes, is_any, "memset target not tracked").map(drop)
        };
        let command = Command::Memset { target, value, len_bytes };
        self.enqueue_checked(stream.0, check, command).map(drop)
    }

    /// Enqueues a Rust closure as a host function. A panic in it is caught and counted in
    /// [`CpuDeviceStats::host_fn_panics`]; the stream keeps running.
    ///
    /// (A panic cannot be caught in an `extern "C"` [`HostFn`]: Rust aborts the process
    /// when a panic reaches an `extern "C"` boundary.) The closure may call this device,
    /// but must not synchronize its own stream (it would wait for itself, as on a GPU).
    ///
    /// # Errors
    /// `HIP_ERROR_INVALID_HANDLE` for an unknown stream.
    pub fn launch_host_closure<F>(
        &self,
        stream: StreamHandle,
        closure: F,
    ) -> Result<(), DeviceError>
    where
        F: FnOnce() + Send + 'static,
    {
        let command = Command::Closure(Box::new(closure));
        self.stream(stream.0)?.enqueue(command).map(drop)
    }

    /// Records an event on any stream: complete once all work enqueued before it is.
    ///
    /// # Errors
    /// `HIP_ERROR_INVALID_HANDLE` for an unknown stream.
    pub fn record_event_on(&self, stream: StreamHandle) -> Result<EventHandle, DeviceError> {
        let stream = self.stream(stream.0)?;
        let ticket = stream.current_ticket();
        let handle = next_handle();
        lock(&self.events).insert(handle, EventEntry { stream, ticket });
        Ok(EventHandle::from_raw(handle))
    }

    fn event(&self, event: &EventHandle) -> Result<(Arc<StreamShared>, u64), DeviceError> {
        let events = lock(&self.events);
        let entry = events.get(&event.raw()).ok_or(invalid_handle("unknown event"))?;
        Ok((Arc::clone(&entry.stream), entry.ticket))
    }

    /// Blocks until the event is complete.
    ///
    /// # Errors
    /// `HIP_ERROR_INVALID_HANDLE` for an unknown event; the asynchronous error of the work
    /// before it.
    pub fn event_synchronize(&self, event: &EventHandle) -> Result<(), DeviceError> {
        let (stream, ticket) = self.event(event)?;
        stream.wait_for(ticket)
    }

    /// Holds `stream` at this point: enqueues a wait-value on a pinned gate word owned by
    /// the returned [`StreamGate`]; work enqueued afterwards does not start until the gate
    /// is released (or dropped). The word stays allocated while the stream waits on it.
    ///
    /// # Errors
    /// `HIP_ERROR_INVALID_HANDLE` for an unknown stream, `HIP_ERROR_OUT_OF_MEMORY`.
    pub fn pause_stream(&self, stream: StreamHandle) -> Result<StreamGate, DeviceError> {
        let target = self.stream(stream.0)?;
        let memory = &self.shared.memory;
        let addr = memory.allocate(4, MemoryType::Host, 0, Origin::Gate)?;
        let word = Arc::new(GateWord { shared: Arc::clone(&self.shared), addr });
        let keep_alive = Some(Arc::clone(&word));
        target.enqueue(Command::WaitValue { word_addr: addr, value: 1, keep_alive })?;
        Ok(StreamGate { word, released: false })
    }

    /// Atomically stores `value` (Release) to the 32-bit word at `word_addr` and wakes every
    /// stream waiting on a word at once (a plain atomic store from another thread is also
    /// seen, within about 200 µs).
    ///
    /// # Errors
    /// `HIP_ERROR_INVALID_VALUE` if the word is not 4-byte aligned inside tracked memory.
    ///
    /// # Safety
    /// Nothing accesses the word non-atomically during the store (no live `&mut` or
    /// non-atomic read of it).
    pub unsafe fn store_word(&self, word_addr: u64, value: u32) -> Result<(), DeviceError> {
        let map = read(&self.shared.memory.map);
        check_word(&map, word_addr)?;
        // SAFETY: the word is tracked and aligned (checked), the read lock keeps it
        // allocated during the store, and the caller promised only atomic access.
        unsafe { self.shared.store_and_wake(word_addr, value) };
        Ok(())
    }

    /// Makes `device_ordinal` the calling thread's current device (for this device object).
    ///
    /// # Errors
    /// `HIP_ERROR_INVALID_DEVICE`.
    pub fn set_current_device(&self, device_ordinal: u32) -> Result<(), DeviceError> {
        self.check_ordinal(device_ordinal)?;
        CURRENT_DEVICES.with_borrow_mut(|current| {
            match current.iter_mut().find(|(id, _)| *id == self.instance_id) {
                Some(entry) => entry.1 = device_ordinal,
                None => current.push((self.instance_id, device_ordinal)),
            }
        });
        Ok(())
    }

    /// The calling thread's current device (0 until [`CpuDevice::set_current_device`]).
    pub fn current_device(&self) -> u32 {
        CURRENT_DEVICES.with_borrow(|current| {
            current.iter().find(|(id, _)| *id == self.instance_id).map_or(0, |entry| entry.1)
        })
    }

    /// `(base address, length in bytes)` of every host range registered as pinned
    /// (`register_host`: the engine's staging arenas, users' registered host buffers).
    pub fn registered_host_ranges(&self) -> Vec<(u64, usize)> {
        self.shared.memory.registered_ranges()
    }

    /// A snapshot of the device's counters.
    pub fn stats(&self) -> CpuDeviceStats {
        self.shared.stats.snapshot()
    }

    /// How many recorded events have not been destroyed yet (for tests: a user of the
    /// device that forgets [`DeviceEvents::destroy_event`] leaves them here).
    pub fn live_events(&self) -> usize {
        lock(&self.events).len()
    }

    fn count_invalid_release(&self) {
        bump(&self.shared.stats.invalid_releases, 1);
    }
}

impl Drop for CpuDevice {
    fn drop(&mut self) {
        self.shared.shutting_down.store(true, Ordering::Release);
        self.shared.waker.wake_all();
        let streams =
            std::mem::take(self.streams.get_mut().unwrap_or_else(PoisonError::into_inner));
        let retired = self.retired.get_mut().unwrap_or_else(PoisonError::into_inner);
        let mut workers = std::mem::take(retired);
        for entry in streams.into_values() {
            entry.shared.close();
            workers.push(entry.worker);
        }
        let me = thread::current().id();
        for worker in workers {
            // A device dropped by one of its own host functions cannot join that worker.
            if worker.thread().id() != me {
                let _ = worker.join();
            }
        }
    }
}

impl DeviceInfo for CpuDevice {
    fn kind(&self) -> DeviceKind {
        DeviceKind::Cpu
    }

    fn device_count(&self) -> u32 {
        self.device_count
    }

    fn pointer_info(&self, ptr: u64) -> Result<PointerInfo, DeviceError> {
        let map = read(&self.shared.memory.map);
        Ok(match find(&map, ptr) {
            Some((base, allocation)) => PointerInfo {
                memory_type: allocation.memory_type,
                device_ordinal: allocation.device_ordinal,
                allocation_base: base,
                allocation_len_bytes: allocation.len_bytes as u64,
            },
            None => PointerInfo {
                memory_type: MemoryType::Host,
                device_ordinal: 0,
                allocation_base: 0,
                allocation_len_bytes: 0,
            },
        })
    }

    fn stream_device(&self, stream: StreamHandle) -> Result<u32, DeviceError> {
        if stream == StreamHandle::NULL {
            return Ok(self.current_device());
        }
        let streams = read(&self.streams);
        let entry = streams.get(&stream.0).ok_or(invalid_handle("unknown stream"))?;
        Ok(entry.shared.device_ordinal)
    }

    fn supports_stream_memops(&self, device_ordinal: u32) -> bool {
        device_ordinal < self.device_count && self.memops_reported.load(Ordering::SeqCst)
    }
}

impl HostMemory for CpuDevice {
    unsafe fn store_word_host(&self, word_host_ptr: *mut u32, value: u32) {
        // SAFETY: the caller guarantees a live, aligned pinned word; on this device the
        // host address is the device address. An untracked word falls back to a plain
        // atomic store (waiters then see it within their polling interval).
        if unsafe { self.store_word(word_host_ptr as u64, value) }.is_err() {
            // SAFETY: as above: live and aligned.
            let word = unsafe { AtomicU32::from_ptr(word_host_ptr) };
            word.store(value, Ordering::Release);
        }
    }

    fn alloc_pinned(&self, len_bytes: usize) -> Result<PinnedRegion, DeviceError> {
        self.malloc_host(len_bytes)
    }

    unsafe fn free_pinned(&self, region: PinnedRegion) {
        // SAFETY: forwarded from the caller (`free_pinned`'s contract is stricter).
        if unsafe { self.free_host(region) }.is_err() {
            self.count_invalid_release();
        }
    }

    unsafe fn register_host(
        &self,
        host_ptr: *mut u8,
        len_bytes: usize,
    ) -> Result<u64, DeviceError> {
        let base = host_ptr as usize as u64;
        self.shared.memory.register(base, len_bytes)?;
        Ok(base)
    }

    unsafe fn unregister_host(&self, host_ptr: *mut u8) {
        let base = host_ptr as usize as u64;
        let released = self.shared.memory.release(base, |a| a.origin == Origin::Registered);
        if released.is_err() {
            self.count_invalid_release();
        }
    }
}

impl DeviceCopies for CpuDevice {
    fn create_internal_stream(&self, device_ordinal: u32) -> Result<InternalStream, DeviceError> {
        self.create_stream(device_ordinal).map(|stream| InternalStream::from_raw(stream.0))
    }

    fn destroy_internal_stream(&self, stream: InternalStream) {
        if self.destroy_stream(StreamHandle(stream.raw())).is_err() {
            self.count_invalid_release();
        }
    }

    unsafe fn copy_to_device_async(
        &self,
        stream: &InternalStream,
        target: u64,
        source: *const u8,
        len_bytes: usize,
    ) -> Result<(), DeviceError> {
        let source = source as usize as u64;
        self.enqueue_copy(stream.raw(), target, source, len_bytes, CopyRule::HostToDevice)
    }

    unsafe fn copy_from_device_async(
        &self,
        stream: &InternalStream,
        target: *mut u8,
        source: u64,
        len_bytes: usize,
    ) -> Result<(), DeviceError> {
        let target = target as usize as u64;
        self.enqueue_copy(stream.raw(), target, source, len_bytes, CopyRule::DeviceToHost)
    }

    fn synchronize_internal(&self, stream: &InternalStream) -> Result<(), DeviceError> {
        self.synchronize_stream(StreamHandle(stream.raw()))
    }

    fn copies_on_caller_thread(&self) -> bool {
        true
    }

    unsafe fn copy_now(
        &self,
        device_ordinal: u32,
        direction: hipfile_core::Direction,
        device_addr: u64,
        host: *mut u8,
        len_bytes: usize,
        ops_may_hold_streams: bool,
    ) -> Result<(), DeviceError> {
        use hipfile_core::Direction;
        self.check_ordinal(device_ordinal)?;
        // Streams of this device never share queues: the hint only counts.
        bump(&self.shared.stats.caller_copies, 1);
        if ops_may_hold_streams {
            bump(&self.shared.stats.caller_copies_while_ops_hold_streams, 1);
        }
        let pooled = {
            let mut pool = lock(&self.caller_streams);
            let index = pool.iter().position(|&(ordinal, _)| ordinal == device_ordinal);
            index.map(|index| pool.swap_remove(index).1)
        };
        let stream = match pooled {
            Some(stream) => stream,
            None => self.create_stream(device_ordinal)?.0,
        };
        let host = host as usize as u64;
        let enqueued = match direction {
            Direction::Read => {
                self.enqueue_copy(stream, device_addr, host, len_bytes, CopyRule::HostToDevice)
            }
            Direction::Write => {
                self.enqueue_copy(stream, host, device_addr, len_bytes, CopyRule::DeviceToHost)
            }
        };
        let synced = self.synchronize_stream(StreamHandle(stream));
        lock(&self.caller_streams).push((device_ordinal, stream));
        enqueued.and(synced)
    }

    unsafe fn write_value32_internal(
        &self,
        stream: &InternalStream,
        word_device_addr: u64,
        value: u32,
    ) -> Result<(), DeviceError> {
        // SAFETY: same contract as `stream_write_value32`.
        unsafe { self.stream_write_value32(StreamHandle(stream.raw()), word_device_addr, value) }
    }
}

impl DeviceEvents for CpuDevice {
    fn record_event(&self, stream: &InternalStream) -> Result<EventHandle, DeviceError> {
        self.record_event_on(StreamHandle(stream.raw()))
    }

    fn event_done(&self, event: &EventHandle) -> Result<bool, DeviceError> {
        let (stream, ticket) = self.event(event)?;
        stream.is_done(ticket)
    }

    fn destroy_event(&self, event: EventHandle) {
        if lock(&self.events).remove(&event.raw()).is_none() {
            self.count_invalid_release();
        }
    }
}

impl StreamMemoryOps for CpuDevice {
    unsafe fn launch_host_func(
        &self,
        stream: StreamHandle,
        func: HostFn,
        user_data: *mut c_void,
    ) -> Result<(), DeviceError> {
        let command = Command::HostFn(HostCall { func, user_data });
        self.stream(stream.0)?.enqueue(command).map(drop)
    }

    unsafe fn stream_wait_value32(
        &self,
        stream: StreamHandle,
        word_device_addr: u64,
        value: u32,
    ) -> Result<(), DeviceError> {
        let check = |map: &AllocationMap| check_word(map, word_device_addr);
        let command = Command::WaitValue { word_addr: word_device_addr, value, keep_alive: None };
        self.enqueue_checked(stream.0, check, command).map(drop)
    }

    unsafe fn stream_write_value32(
        &self,
        stream: StreamHandle,
        word_device_addr: u64,
        value: u32,
    ) -> Result<(), DeviceError> {
        let check = |map: &AllocationMap| check_word(map, word_device_addr);
        let command = Command::WriteValue { word_addr: word_device_addr, value };
        self.enqueue_checked(stream.0, check, command).map(drop)
    }

    fn synchronize_stream(&self, stream: StreamHandle) -> Result<(), DeviceError> {
        let stream = self.stream(stream.0)?;
        let ticket = stream.current_ticket();
        stream.wait_for(ticket)
    }

    fn stream_done(&self, stream: StreamHandle) -> Result<bool, DeviceError> {
        let stream = self.stream(stream.0)?;
        let ticket = stream.current_ticket();
        stream.is_done(ticket)
    }
}
