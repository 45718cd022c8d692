//! `hipStreamWaitValue32/64` and `hipStreamWriteValue64`.
//!
//! `hipStreamWaitValueGte` with a full 32-bit mask uses the device's wait-value (woken
//! at once by write-value commands and `hipfileCpuStoreValue32`, within about 200 µs of
//! a plain store; compared cyclically as CUDA's `CU_STREAM_WAIT_VALUE_GEQ`). Every other
//! flag, mask and 64-bit wait is a host function on the stream that polls the word
//! (spinning for 20 µs, then sleeping 10 µs doubling up to 200 µs): later work on the
//! stream waits for it, as for a device wait. 64-bit writes are host functions too.

use core::ffi::{c_uint, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::ext::HostFn;
use crate::{HipError, api, check, inside, pointer_info, tracked};

/// `hipStreamWaitValueGte`: `(word & mask) >= value`.
const WAIT_GTE: c_uint = 0;
/// `hipStreamWaitValueEq`: `(word & mask) == value`.
const WAIT_EQ: c_uint = 1;
/// `hipStreamWaitValueAnd`: `((word & mask) & value) != 0`.
const WAIT_AND: c_uint = 2;
/// `hipStreamWaitValueNor`: `~((word & mask) | (value & mask)) != 0`.
const WAIT_NOR: c_uint = 3;

/// How long a polling wait spins before sleeping.
const POLL_SPIN: Duration = Duration::from_micros(20);
/// First sleep of a polling wait.
const POLL_FIRST_SLEEP: Duration = Duration::from_micros(10);
/// Longest sleep of a polling wait: its worst-case extra latency.
const POLL_MAX_SLEEP: Duration = Duration::from_micros(200);

/// Width of the word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Width {
    /// `uint32_t`.
    Bits32,
    /// `uint64_t`.
    Bits64,
}

impl Width {
    fn bytes(self) -> usize {
        match self {
            Width::Bits32 => 4,
            Width::Bits64 => 8,
        }
    }

    fn all_ones(self) -> u64 {
        match self {
            Width::Bits32 => u64::from(u32::MAX),
            Width::Bits64 => u64::MAX,
        }
    }
}

/// One polling wait, owned by its host function.
struct Wait {
    word_addr: usize,
    value: u64,
    mask: u64,
    flags: c_uint,
    width: Width,
}

impl Wait {
    fn load(&self) -> u64 {
        match self.width {
            Width::Bits32 => {
                // SAFETY: the word is an aligned word of device memory that the caller
                // of hipStreamWaitValue32 keeps allocated until the wait is satisfied.
                let word = unsafe { AtomicU32::from_ptr(self.word_addr as *mut u32) };
                u64::from(word.load(Ordering::Acquire))
            }
            Width::Bits64 => {
                // SAFETY: as above, 8-aligned (checked at enqueue).
                let word = unsafe { AtomicU64::from_ptr(self.word_addr as *mut u64) };
                word.load(Ordering::Acquire)
            }
        }
    }

    fn satisfied(&self) -> bool {
        let word = self.load() & self.mask;
        match self.flags {
            WAIT_GTE => word >= self.value,
            WAIT_EQ => word == self.value,
            WAIT_AND => word & self.value != 0,
            _ => !(word | (self.value & self.mask)) & self.width.all_ones() != 0,
        }
    }

    fn block(&self) {
        let spin_end = Instant::now() + POLL_SPIN;
        while Instant::now() < spin_end {
            if self.satisfied() {
                return;
            }
            std::hint::spin_loop();
        }
        let mut sleep = POLL_FIRST_SLEEP;
        while !self.satisfied() {
            std::thread::sleep(sleep);
            sleep = (sleep * 2).min(POLL_MAX_SLEEP);
        }
    }
}

/// The host function of a polling wait.
///
/// # Safety
/// `data` is a `Box<Wait>` leaked by `wait_value`, passed once.
unsafe extern "C" fn poll_wait(data: *mut c_void) {
    // SAFETY: see the contract.
    let wait = unsafe { Box::from_raw(data.cast::<Wait>()) };
    let _ = catch_unwind(AssertUnwindSafe(|| wait.block()));
}

/// A 64-bit store, owned by its host function.
struct Store {
    word_addr: usize,
    value: u64,
}

/// The host function of `hipStreamWriteValue64`.
///
/// # Safety
/// `data` is a `Box<Store>` leaked by `write_value64`, passed once.
unsafe extern "C" fn store64(data: *mut c_void) {
    // SAFETY: see the contract.
    let store = unsafe { Box::from_raw(data.cast::<Store>()) };
    // SAFETY: an 8-aligned word of device memory (checked at enqueue) that the caller
    // keeps allocated until the write has run.
    unsafe { AtomicU64::from_ptr(store.word_addr as *mut u64) }
        .store(store.value, Ordering::Release);
}

/// Checks that `ptr` is an aligned word inside memory of the device.
fn check_word(ptr: *mut c_void, width: Width) -> Result<(), HipError> {
    if ptr.is_null() || !(ptr as usize).is_multiple_of(width.bytes()) {
        return Err(HipError::INVALID_VALUE);
    }
    let info = pointer_info(ptr)?;
    if !tracked(&info) {
        return Err(HipError::INVALID_VALUE);
    }
    inside(&info, ptr, width.bytes())
}

/// Enqueues `func(boxed)` on the stream, taking the box back if the launch fails.
fn launch<T>(stream: *mut c_void, func: HostFn, boxed: Box<T>) -> Result<(), HipError> {
    let api = api()?;
    let raw = Box::into_raw(boxed).cast::<c_void>();
    // SAFETY: `func` takes `raw` back exactly once and is sound on any thread.
    let status = check(unsafe { (api.launch_host_func)(stream, Some(func), raw) });
    if status.is_err() {
        // SAFETY: the launch failed, so `func` will never see `raw`.
        drop(unsafe { Box::from_raw(raw.cast::<T>()) });
    }
    status
}

/// `hipStreamWaitValue32/64`.
///
/// # Safety
/// The word stays allocated until the wait is satisfied.
pub unsafe fn wait_value(
    stream: *mut c_void,
    ptr: *mut c_void,
    value: u64,
    flags: c_uint,
    mask: u64,
    width: Width,
) -> Result<(), HipError> {
    if !matches!(flags, WAIT_GTE | WAIT_EQ | WAIT_AND | WAIT_NOR) {
        return Err(HipError::INVALID_VALUE);
    }
    check_word(ptr, width)?;
    if width == Width::Bits32 && flags == WAIT_GTE && mask & width.all_ones() == width.all_ones() {
        // SAFETY: forwarded contract; the device checks the word.
        return check(unsafe { (api()?.stream_wait_value32)(stream, ptr, value as u32) });
    }
    let mask = mask & width.all_ones();
    launch(stream, poll_wait, Box::new(Wait { word_addr: ptr as usize, value, mask, flags, width }))
}

/// `hipStreamWriteValue64`.
///
/// # Safety
/// The word stays allocated until the write has run.
pub unsafe fn write_value64(
    stream: *mut c_void,
    ptr: *mut c_void,
    value: u64,
) -> Result<(), HipError> {
    check_word(ptr, Width::Bits64)?;
    launch(stream, store64, Box::new(Store { word_addr: ptr as usize, value }))
}
