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
//! [`InternalStream`](super::InternalStream)s and [`EventHandle`](super::EventHandle)s with `from_raw` and ignores a handle's owner:
//! every raw id is looked up in its registry and an unknown one is an error
//! (`HIP_ERROR_INVALID_HANDLE`), as HIP treats stream and event ids, so a forged handle
//! names at worst another live stream or event, never freed memory.
//!
//! Dropping the device closes every stream; each worker drains its queue. A wait-value
//! still unsatisfied 100 ms after the drop began is abandoned together with everything
//! queued after it on that stream (as destroying a GPU context with pending work would),
//! so a drop never hangs on a forgotten wait. Remaining allocations are freed once the
//! device and every [`StreamGate`] are gone.
//!
//! The module by job: `memory` (the registry of tracked ranges, guard pages, the range
//! checks; `HostMemory`), `commands` (what a command does when a worker runs it),
//! `streams` (queues, workers, fork detection; `DeviceCopies`, `StreamMemoryOps`),
//! `events` (tickets; `DeviceEvents`), `gates` ([`StreamGate`], host stores that wake
//! waiters), `stats` ([`CpuDeviceStats`]); this file holds the device object, its
//! per-thread current device, its drop and `DeviceInfo`.

mod commands;
mod events;
mod gates;
mod memory;
mod stats;
mod streams;

pub use gates::StreamGate;
pub use stats::CpuDeviceStats;

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread::{self, JoinHandle};

use super::{DeviceError, DeviceInfo, DeviceKind, MemoryType, PointerInfo, StreamHandle};

use commands::Shared;
use events::EventEntry;
use memory::find;
use stats::bump;
use streams::StreamEntry;

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
    /// Streams for [`DeviceCopies::copy_now`](crate::device::DeviceCopies::copy_now) on callers' threads, per device, reused.
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
