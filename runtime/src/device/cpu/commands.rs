//! What one stream command does when a worker runs it: copies and memsets checked against
//! the memory registry, wait-value and write-value on 32-bit words (spin, then sleep with
//! backoff, woken by stores through the device), host functions.

use core::ffi::c_void;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::device::{DeviceError, HostFn};

use super::memory::{CopyPath, CopyRule, MemoryRegistry, Origin, check_range, check_word, is_any};
use super::stats::{StatCounters, bump};
use super::{lock, read};

/// How long a wait-value spins before it starts sleeping.
const WAIT_SPIN: Duration = Duration::from_micros(20);
/// First sleep of a wait-value after spinning.
const WAIT_FIRST_SLEEP: Duration = Duration::from_micros(10);
/// Longest sleep of a wait-value: the worst-case latency of a plain atomic store.
const WAIT_MAX_SLEEP: Duration = Duration::from_micros(200);
/// How long a wait-value may stay unsatisfied once the device is being dropped.
const SHUTDOWN_WAIT_GRACE: Duration = Duration::from_millis(100);

/// Wakes workers sleeping in a wait-value.
#[derive(Default)]
pub(super) struct WordWaker {
    /// Number of workers sleeping on `cv`.
    sleepers: Mutex<usize>,
    cv: Condvar,
}

impl WordWaker {
    pub(super) fn wake_all(&self) {
        let sleepers = lock(&self.sleepers);
        if *sleepers > 0 {
            self.cv.notify_all();
        }
    }
}

/// State shared by the device object, its workers and its gates.
#[derive(Default)]
pub(super) struct Shared {
    pub(super) memory: MemoryRegistry,
    pub(super) waker: WordWaker,
    pub(super) stats: StatCounters,
    pub(super) shutting_down: AtomicBool,
}

/// What became of one executed command.
pub(super) enum CommandOutcome {
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
    pub(super) unsafe fn store_and_wake(&self, word_addr: u64, value: u32) {
        // SAFETY: guaranteed by the caller.
        let word = unsafe { AtomicU32::from_ptr(word_addr as usize as *mut u32) };
        word.store(value, Ordering::Release);
        self.waker.wake_all();
    }

    fn wait_value(&self, word_addr: u64, value: u32) -> CommandOutcome {
        if let Err(error) = check_word(&read(&self.memory.map), word_addr) {
            return CommandOutcome::Failed(error);
        }
        // SAFETY: the word is tracked (checked just above) and 4-byte aligned, and the
        // enqueuer promised (`stream_wait_value32`'s contract, or a gate's keep-alive) that
        // it stays allocated until the wait is satisfied.
        let word = unsafe { AtomicU32::from_ptr(word_addr as usize as *mut u32) };
        if !self.wait_for_word(word, value) {
            return CommandOutcome::Abandoned;
        }
        bump(&self.stats.wait_values_executed, 1);
        CommandOutcome::Done
    }

    fn write_value(&self, word_addr: u64, value: u32) -> CommandOutcome {
        let map = read(&self.memory.map);
        if let Err(error) = check_word(&map, word_addr) {
            return CommandOutcome::Failed(error);
        }
        // Counted before the store: a stream the store releases may finish, and its
        // synchronizer read the counters, before this worker runs another instruction.
        bump(&self.stats.write_values_executed, 1);
        // SAFETY: the word is tracked, aligned, and kept allocated by the read lock held
        // across the store; the enqueuer promised only atomic access to it.
        unsafe { self.store_and_wake(word_addr, value) };
        drop(map);
        CommandOutcome::Done
    }

    pub(super) fn copy(
        &self,
        target: u64,
        source: u64,
        len_bytes: usize,
        rule: CopyRule,
    ) -> CommandOutcome {
        let map = read(&self.memory.map);
        let direction = match rule.check(&map, target, source, len_bytes) {
            Ok(direction) => direction,
            Err(error) => return CommandOutcome::Failed(error),
        };
        // SAFETY: both ranges lie inside live tracked allocations (checked above; the read
        // lock held across the copy keeps them from being freed), and the enqueuer promised
        // the stream exclusive use of the target range until the copy completes.
        unsafe {
            std::ptr::copy(source as usize as *const u8, target as usize as *mut u8, len_bytes);
        }
        drop(map);
        let counter = match direction {
            CopyPath::HostToDevice => &self.stats.bytes_host_to_device,
            CopyPath::DeviceToHost => &self.stats.bytes_device_to_host,
            CopyPath::Other => &self.stats.bytes_copied_other,
        };
        bump(counter, len_bytes as u64);
        CommandOutcome::Done
    }

    pub(super) fn memset(&self, target: u64, value: u8, len_bytes: usize) -> CommandOutcome {
        let map = read(&self.memory.map);
        if let Err(error) = check_range(&map, target, len_bytes, is_any, "memset not tracked") {
            return CommandOutcome::Failed(error);
        }
        // SAFETY: the range lies inside a live tracked allocation kept alive by the read
        // lock, and the enqueuer promised the stream exclusive use of it.
        unsafe { std::ptr::write_bytes(target as usize as *mut u8, value, len_bytes) };
        drop(map);
        bump(&self.stats.bytes_memset, len_bytes as u64);
        CommandOutcome::Done
    }

    fn run_host_call(&self, call: impl FnOnce()) -> CommandOutcome {
        bump(&self.stats.host_fns_run, 1);
        if panic::catch_unwind(AssertUnwindSafe(call)).is_err() {
            bump(&self.stats.host_fn_panics, 1);
        }
        CommandOutcome::Done
    }

    pub(super) fn execute(&self, command: Command) -> CommandOutcome {
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

/// A host function with its argument, as `launch_host_func` received them.
pub(super) struct HostCall {
    pub(super) func: HostFn,
    pub(super) user_data: *mut c_void,
}

// SAFETY: `launch_host_func`'s contract makes the caller promise that `func` is sound to
// call with `user_data` on another thread, which is all the worker does with them.
unsafe impl Send for HostCall {}

/// The pinned word a [`StreamGate`](super::StreamGate) owns (its wait-value command
/// keeps it alive too); freed once the gate and the wait that reads it
/// are both gone.
pub(super) struct GateWord {
    pub(super) shared: Arc<Shared>,
    pub(super) addr: u64,
}

impl GateWord {
    pub(super) fn open(&self) {
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

/// One command of a stream.
pub(super) enum Command {
    HostFn(HostCall),
    Closure(Box<dyn FnOnce() + Send>),
    WaitValue { word_addr: u64, value: u32, keep_alive: Option<Arc<GateWord>> },
    WriteValue { word_addr: u64, value: u32 },
    Copy { target: u64, source: u64, len_bytes: usize, rule: CopyRule },
    Memset { target: u64, value: u8, len_bytes: usize },
}
