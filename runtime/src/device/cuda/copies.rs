//! [`DeviceCopies`] on the CUDA device: the engine's internal streams and their copies,
//! [`DeviceCopies::copy_now`] on callers' threads (the caller-thread stream pools of the
//! engine and primary contexts, `HIPFILE_CUDA_CALLER_COPY`), and the rule that bounces a
//! host → device copy through a stream's device scratch (`HIPFILE_CUDA_MIN_COPY_BYTES`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, RwLock};

use hipfile_core::Direction;

use crate::device::gpu::GpuBackend;
use crate::device::{DeviceCopies, DeviceError, InternalStream};

use super::sys::*;
use super::{CudaDevice, EventEntry, InternalEntry, result};

/// The largest device scratch of an engine stream: a host → device copy through it longer
/// than this moves in scratch-sized pieces (in stream order, so one scratch serves them).
const MAX_SCRATCH_BYTES: usize = 1 << 20;

/// Where [`DeviceCopies::copy_now`] runs a caller-thread copy (`HIPFILE_CUDA_CALLER_COPY`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum CallerCopy {
    /// The default. While no async op of the process may hold an application stream, on
    /// a pooled stream of the *primary* context, as the application's own `cudaMemcpy`
    /// would: no op of ours can then wait on it, and there it scales with threads (on the
    /// H200, 4 KiB copies + waits from 8 threads: 530 k/s in the primary context against
    /// 98 k/s from the engine context into the application's memory,
    /// `benches/results/h200-threads-copy-probe.txt`). Otherwise in the engine context
    /// through the stream's scratch, so a sync read never waits behind a stream an op of
    /// ours holds.
    Auto,
    /// Always in the engine context through the scratch: a one-chunk sync read also
    /// completes while the application holds every hardware queue of its context on
    /// waits of its own (about 5 µs more per copy, 300 k/s from 8 threads).
    Engine,
}

impl CallerCopy {
    /// The mode `HIPFILE_CUDA_CALLER_COPY` selects (`auto`, the default, or `engine`).
    /// An unknown value warns and keeps the default.
    pub(super) fn from_environment() -> CallerCopy {
        match std::env::var("HIPFILE_CUDA_CALLER_COPY").as_deref().map(str::trim) {
            Err(_) | Ok("" | "auto") => CallerCopy::Auto,
            Ok("engine") => CallerCopy::Engine,
            Ok(other) => {
                log::warn!("HIPFILE_CUDA_CALLER_COPY={other:?} is not auto or engine; using auto");
                CallerCopy::Auto
            }
        }
    }
}

/// `HIPFILE_CUDA_MIN_COPY_BYTES`: host → device copies of the engine context into the
/// application's memory shorter than this go through the stream's scratch; `all` (the
/// default) bounces every copy, 0 none. An unknown value warns and keeps the default.
pub(super) fn min_copy_bytes_from_environment() -> usize {
    match std::env::var("HIPFILE_CUDA_MIN_COPY_BYTES").as_deref().map(str::trim) {
        Err(_) | Ok("" | "all") => usize::MAX,
        Ok(value) => value.parse().unwrap_or_else(|_| {
            log::warn!(
                "HIPFILE_CUDA_MIN_COPY_BYTES={value:?} is not a byte count or all; using all"
            );
            usize::MAX
        }),
    }
}

impl CudaDevice {
    /// [`DeviceCopies::copy_now`] with a context of device `ordinal` current (the engine
    /// context, or the primary one): a stream of `pool` (made in the current context when
    /// the pool is empty), the copy (host → device through the stream's scratch when
    /// `bounce`), a synchronize.
    ///
    /// # Safety
    /// As [`DeviceCopies::copy_now`]; `pool`'s streams belong to the current context.
    #[allow(clippy::too_many_arguments, reason = "the copy's fields, as DeviceCopies::copy_now")]
    unsafe fn copy_now_in_context(
        &self,
        pool: &Mutex<Vec<InternalEntry>>,
        ordinal: u32,
        direction: Direction,
        device_addr: u64,
        host: *mut u8,
        len_bytes: usize,
        bounce: bool,
    ) -> Result<(), DeviceError> {
        self.on_pooled_stream(pool, ordinal, bounce, |entry| match direction {
            // SAFETY: the caller's contract (pinned host memory, valid device range); the
            // stream's context is current; bounced only in the engine context.
            Direction::Read => unsafe {
                self.copy_host_to_device(entry, device_addr, host.cast_const(), len_bytes, bounce)
            },
            // SAFETY: the caller's contract (pinned host memory, valid device range).
            Direction::Write => unsafe {
                result::memcpy_dtoh_async(&self.api, host, device_addr, len_bytes, entry.stream)
            },
        })
    }

    /// Runs `enqueue` on a stream of `pool` (made in the current context when the pool is
    /// empty, with its scratch when `bounce`), synchronizes it — even after a failed
    /// enqueue, so that nothing of ours still uses the caller's memory when we return —
    /// and gives the stream back.
    fn on_pooled_stream(
        &self,
        pool: &Mutex<Vec<InternalEntry>>,
        ordinal: u32,
        bounce: bool,
        enqueue: impl FnOnce(&InternalEntry) -> Result<(), DeviceError>,
    ) -> Result<(), DeviceError> {
        let pooled = pool.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let entry = match pooled {
            Some(entry) => entry,
            // The context the pool belongs to is current. (One entry of the engine
            // context's pool is made when the engine starts: prepare_data_path.)
            None => self.prepared_entry(ordinal, bounce)?,
        };
        let enqueued = enqueue(&entry);
        // SAFETY: our stream.
        let synced = unsafe { result::stream_synchronize(&self.api, entry.stream) };
        pool.lock().unwrap_or_else(|p| p.into_inner()).push(entry);
        enqueued.and(synced)
    }

    /// Destroys a stream of ours and frees its scratch, once the stream is idle; the
    /// stream's context is current.
    pub(super) fn destroy_entry(&self, entry: &InternalEntry) -> Result<(), DeviceError> {
        if let Some(&scratch) = entry.scratch.get() {
            // SAFETY: our stream; once it is idle nothing uses its scratch.
            let _ = unsafe { result::stream_synchronize_status(&self.api, entry.stream) };
            // SAFETY: allocated in scratch_of, freed once, idle.
            unsafe { self.free_engine_memory(scratch) };
        }
        // SAFETY: our own stream, of the current context.
        unsafe { result::stream_destroy(&self.api, entry.stream) }
    }

    /// The device scratch of an engine stream, bytes: [`CudaDevice::min_copy_bytes`] up
    /// to [`MAX_SCRATCH_BYTES`].
    fn scratch_bytes(&self) -> usize {
        self.min_copy_bytes.min(MAX_SCRATCH_BYTES)
    }

    /// `entry`'s device scratch, allocated now if it has none yet; the engine context is
    /// current.
    fn scratch_of(&self, entry: &InternalEntry) -> Result<CUdeviceptr, DeviceError> {
        if let Some(&scratch) = entry.scratch.get() {
            return Ok(scratch);
        }
        let scratch = self.alloc_engine_memory(entry.ordinal, self.scratch_bytes())?;
        let kept = *entry.scratch.get_or_init(|| scratch);
        if kept != scratch {
            // SAFETY: ours, never used (another call set the entry's scratch first).
            unsafe { self.free_engine_memory(scratch) };
        }
        Ok(kept)
    }

    /// A new non-blocking stream of the current context, with its device scratch when
    /// `bounce` (the engine context is current) and copies bounce: everything a copy on
    /// it will need, made now (see [`DeviceCopies::prepare_data_path`]).
    fn prepared_entry(&self, ordinal: u32, bounce: bool) -> Result<InternalEntry, DeviceError> {
        let stream = result::stream_create(&self.api, CU_STREAM_NON_BLOCKING)?;
        let entry = InternalEntry { stream, ordinal, scratch: Default::default() };
        if bounce
            && self.min_copy_bytes > 0
            && self.engine_isolated(ordinal)
            && let Err(error) = self.scratch_of(&entry)
        {
            let _ = self.destroy_entry(&entry);
            return Err(error);
        }
        Ok(entry)
    }

    /// Enqueues a host → device copy on `entry`'s stream. With `bounce`, one shorter than
    /// [`CudaDevice::min_copy_bytes`] (by default every one) goes through the stream's
    /// device scratch when the engine has a context of its own: on the H200 a host →
    /// device copy from the engine context into the *application's* memory runs one at a
    /// time across threads, and one of 16 KiB or less did not run while every hardware
    /// queue of the application's context held a stream on a wait-value, while copies
    /// into the engine's own memory and device → device copies into the application's
    /// did neither (`benches/results/h200-threads-copy-probe.txt`,
    /// `benches/results/h200-small-copy-experiments.txt`,
    /// `benches/results/h200-copy-now-probe.txt`).
    ///
    /// # Safety
    /// `source..source + len_bytes` is pinned host memory that stays valid until the copy
    /// has run; the target range is valid device memory; the stream's context is current,
    /// and it is the engine context when `bounce`.
    unsafe fn copy_host_to_device(
        &self,
        entry: &InternalEntry,
        target: u64,
        source: *const u8,
        len_bytes: usize,
        bounce: bool,
    ) -> Result<(), DeviceError> {
        if bounce
            && len_bytes < self.min_copy_bytes
            && self.engine_isolated(entry.ordinal)
            && !is_engine_device_memory(target, len_bytes)
        {
            // SAFETY: the caller's contract.
            return unsafe { self.copy_through_scratch(entry, target, source, len_bytes) };
        }
        // SAFETY: the caller's contract.
        unsafe { result::memcpy_htod_async(&self.api, target, source, len_bytes, entry.stream) }
    }

    /// A host → device copy as copies into the stream's device scratch (memory of the
    /// engine context) and device → device copies from there to `target`, piece by
    /// piece of [`CudaDevice::scratch_bytes`] (stream order keeps a piece from
    /// overwriting the scratch before the previous one has left it).
    ///
    /// # Safety
    /// `source..source + len_bytes` is pinned host memory that stays valid until the copy
    /// has run; the target range is valid device memory; the engine context is current.
    unsafe fn copy_through_scratch(
        &self,
        entry: &InternalEntry,
        target: u64,
        source: *const u8,
        len_bytes: usize,
    ) -> Result<(), DeviceError> {
        let scratch_bytes = self.scratch_bytes();
        // Made with the stream (`prepared_entry`), before any copy.
        let scratch = self.scratch_of(entry)?;
        let mut done = 0;
        while done < len_bytes {
            let piece = (len_bytes - done).min(scratch_bytes);
            // SAFETY: the source is pinned memory (caller) holding len_bytes > done; the
            // scratch holds scratch_bytes >= piece; the stream orders this after earlier
            // uses of the scratch.
            unsafe {
                result::memcpy_htod_async(&self.api, scratch, source.add(done), piece, entry.stream)
            }?;
            // SAFETY: the scratch bytes were just copied in (stream order); the target is
            // the caller's valid device range, which holds len_bytes > done.
            unsafe {
                result::memcpy_dtod_async(
                    &self.api,
                    target + done as u64,
                    scratch,
                    piece,
                    entry.stream,
                )
            }?;
            done += piece;
        }
        Ok(())
    }
}

impl DeviceCopies for CudaDevice {
    fn create_internal_stream(&self, device_ordinal: u32) -> Result<InternalStream, DeviceError> {
        let entry =
            self.in_engine_context(device_ordinal, || self.prepared_entry(device_ordinal, true))?;
        Ok(self.handles.stream_handle(entry))
    }

    fn prepare_data_path(&self, device_ordinal: u32, events: usize) -> Result<(), DeviceError> {
        self.in_engine_context(device_ordinal, || {
            self.handles.prefill_events(device_ordinal, events, || {
                let event = result::event_create(&self.api, CU_EVENT_DISABLE_TIMING)?;
                Ok(EventEntry { event, ordinal: device_ordinal })
            })?;
            let pool = &self.caller_streams[device_ordinal as usize];
            if pool.lock().unwrap_or_else(|p| p.into_inner()).is_empty() {
                let entry = self.prepared_entry(device_ordinal, true)?;
                pool.lock().unwrap_or_else(|p| p.into_inner()).push(entry);
            }
            Ok(())
        })
    }

    fn destroy_internal_stream(&self, stream: InternalStream) {
        let Some(entry) = self.handles.take_stream(stream) else {
            return;
        };
        let _ = self.in_engine_context(entry.ordinal, || self.destroy_entry(&entry));
    }

    unsafe fn copy_to_device_async(
        &self,
        stream: &InternalStream,
        target: u64,
        source: *const u8,
        len_bytes: usize,
    ) -> Result<(), DeviceError> {
        self.on_stream(stream, |entry| {
            // SAFETY: caller's contract (pinned source, valid device range); the engine
            // context is current and owns the stream.
            // The engine's copies release user streams: always bounced.
            unsafe { self.copy_host_to_device(entry, target, source, len_bytes, true) }
        })
    }

    unsafe fn copy_from_device_async(
        &self,
        stream: &InternalStream,
        target: *mut u8,
        source: u64,
        len_bytes: usize,
    ) -> Result<(), DeviceError> {
        self.on_stream(stream, |entry| {
            // SAFETY: caller's contract; the engine context is current and owns the stream.
            unsafe { result::memcpy_dtoh_async(&self.api, target, source, len_bytes, entry.stream) }
        })
    }

    fn synchronize_internal(&self, stream: &InternalStream) -> Result<(), DeviceError> {
        self.on_stream(stream, |entry| {
            // SAFETY: our stream, of the engine context.
            unsafe { result::stream_synchronize(&self.api, entry.stream) }
        })
    }

    unsafe fn write_value32_internal(
        &self,
        stream: &InternalStream,
        word_device_addr: u64,
        value: u32,
    ) -> Result<(), DeviceError> {
        self.on_stream(stream, |entry| {
            // SAFETY: caller's contract: a live pinned word (portable, so mapped in the
            // engine context too).
            unsafe {
                result::stream_write_value32(&self.api, entry.stream, word_device_addr, value)
            }
        })
    }

    fn copies_on_caller_thread(&self) -> bool {
        true
    }

    fn process_async_ops(&self) -> Option<&'static std::sync::atomic::AtomicUsize> {
        // Every CudaDevice of the process shares the primary contexts, so every driver's
        // held op can stall a primary-context copy of any other.
        static ALIVE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        Some(&ALIVE)
    }

    unsafe fn copy_now(
        &self,
        device_ordinal: u32,
        direction: Direction,
        device_addr: u64,
        host: *mut u8,
        len_bytes: usize,
        ops_may_hold_streams: bool,
    ) -> Result<(), DeviceError> {
        let primary = *self
            .contexts
            .get(device_ordinal as usize)
            .ok_or(DeviceError::new(DeviceError::HIP_ERROR_INVALID_DEVICE, "no such device"))?;
        if !ops_may_hold_streams && self.caller_copy == CallerCopy::Auto {
            // No op of ours may hold a stream: the primary context, as the application's
            // own copies (CallerCopy::Auto says why).
            // SAFETY: a primary context we retained; the caller's contract for the copy.
            return unsafe {
                self.with_pushed(primary, || {
                    self.copy_now_in_context(
                        &self.caller_primary_streams[device_ordinal as usize],
                        device_ordinal,
                        direction,
                        device_addr,
                        host,
                        len_bytes,
                        false,
                    )
                })
            };
        }
        // In the engine context (pushed on a caller's thread, popped after): the copy runs
        // on a stream of ours that no application stream shares a hardware queue with,
        // through the scratch, so a sync read never waits behind a stream the caller holds.
        self.in_engine_context(device_ordinal, || {
            // SAFETY: the caller's contract; the engine context is current.
            unsafe {
                self.copy_now_in_context(
                    &self.caller_streams[device_ordinal as usize],
                    device_ordinal,
                    direction,
                    device_addr,
                    host,
                    len_bytes,
                    true,
                )
            }
        })
    }

    fn alloc_engine_device(
        &self,
        device_ordinal: u32,
        len_bytes: usize,
    ) -> Result<u64, DeviceError> {
        let addr = self.in_engine_context(device_ordinal, || {
            self.alloc_engine_memory(device_ordinal, len_bytes)
        })?;
        note_engine_device_memory(addr, Some(len_bytes));
        Ok(addr)
    }

    unsafe fn free_engine_device(&self, device_ordinal: u32, addr: u64) {
        note_engine_device_memory(addr, None);
        let _ = self.in_engine_context(device_ordinal, || {
            // SAFETY: the caller's contract: ours, freed once, no copy still uses it.
            unsafe { self.free_engine_memory(addr) };
            Ok(())
        });
    }

    unsafe fn copy_device_now(
        &self,
        device_ordinal: u32,
        target: u64,
        source: u64,
        len_bytes: usize,
    ) -> Result<(), DeviceError> {
        self.in_engine_context(device_ordinal, || {
            let pool = &self.caller_streams[device_ordinal as usize];
            self.on_pooled_stream(pool, device_ordinal, true, |entry| {
                // SAFETY: the caller's contract (valid device ranges); our stream, of the
                // engine context, which is current.
                unsafe {
                    result::memcpy_dtod_async(&self.api, target, source, len_bytes, entry.stream)
                }
            })
        })
    }
}

/// The engine's own device memory ([`DeviceCopies::alloc_engine_device`]) of every device
/// of the process, by base address: host → device copies into it need no bounce through
/// a scratch (copies into the engine context's memory scale and never wait for the
/// application's streams).
static ENGINE_DEVICE_MEMORY: RwLock<BTreeMap<u64, usize>> = RwLock::new(BTreeMap::new());

/// Allocations in [`ENGINE_DEVICE_MEMORY`]: every engine copy asks
/// [`is_engine_device_memory`], and without device slots (the default) the answer is one
/// relaxed load, no lock.
static ENGINE_DEVICE_ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

fn note_engine_device_memory(addr: u64, len_bytes: Option<usize>) {
    let mut memory = ENGINE_DEVICE_MEMORY.write().unwrap_or_else(|p| p.into_inner());
    match len_bytes {
        Some(len) => {
            memory.insert(addr, len);
        }
        None => {
            memory.remove(&addr);
        }
    }
    ENGINE_DEVICE_ALLOCATIONS.store(memory.len(), Ordering::Relaxed);
}

/// Whether `addr..addr + len_bytes` lies inside one allocation of engine device memory.
fn is_engine_device_memory(addr: u64, len_bytes: usize) -> bool {
    if ENGINE_DEVICE_ALLOCATIONS.load(Ordering::Relaxed) == 0 {
        return false;
    }
    let memory = ENGINE_DEVICE_MEMORY.read().unwrap_or_else(|p| p.into_inner());
    memory.range(..=addr).next_back().is_some_and(|(&base, &len)| {
        addr.checked_add(len_bytes as u64).is_some_and(|end| end <= base + len as u64)
    })
}
