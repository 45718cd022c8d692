//! Batch I/O (`hipFileBatchIO*`): many independent reads and writes submitted in one
//! call, run at once on the engine's executors, and reported as they finish.
//!
//! A [`Batch`] holds up to its capacity (1..=128) entries. [`Batch::submit`] checks every
//! entry first and accepts all or none; each accepted entry becomes one job per part on
//! the executors (large entries fan out as synchronous requests do), so the entries of a
//! batch move concurrently, through io_uring, with disk and copies overlapped.
//! [`Batch::status`] waits for at least `min` finished entries (or a timeout) and reports
//! each finished entry once, in completion order, with its byte count or error.
//! [`Batch::cancel`] stops the entries that have not started, waits for those moving
//! data, and empties the batch; dropping a batch cancels it, so no entry outlives it.
//!
//! Entries are not stream-ordered: a batch is asynchronous to the host and synchronous
//! to the device (an entry is reported once its data is in device memory or the file).
//!
//! # Example
//! ```
//! use hipfile_core::{BatchStatus, Direction};
//! use hipfile_runtime::Driver;
//! use hipfile_runtime::batch::{Batch, BatchEntry};
//! use hipfile_runtime::config::Config;
//! use hipfile_runtime::device::cpu::CpuDevice;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let device = CpuDevice::new(1);
//! let mut config = Config::default();
//! config.executor_cpus = vec![0];
//! config.request_parallelism = 1;
//! config.staging_per_executor_bytes = 4 << 20;
//! config.validate()?;
//! let driver = Driver::new(config, device.clone());
//! driver.open();
//!
//! let path = std::env::temp_dir().join(format!("hipfile-batch-doc-{}", std::process::id()));
//! std::fs::write(&path, vec![7u8; 64 << 10])?;
//! let file = std::fs::File::open(&path)?;
//! let handle = driver.handle_register(std::os::fd::AsRawFd::as_raw_fd(&file))?;
//! let addr = device.malloc_device(0, 64 << 10)?;
//!
//! let batch = Batch::new(driver.clone(), 16)?;
//! let entries: Vec<BatchEntry> = (0..16)
//!     .map(|i| BatchEntry {
//!         direction: Direction::Read,
//!         handle,
//!         buffer_base_addr: addr,
//!         buffer_offset_bytes: i * 4096,
//!         file_offset_bytes: i * 4096,
//!         size_bytes: 4096,
//!         cookie: i as usize,
//!     })
//!     .collect();
//! batch.submit(&entries)?;
//! let events = batch.status(16, 16, None);
//! assert!(events.iter().all(|e| e.status == BatchStatus::Complete && e.result == 4096));
//! # driver.handle_deregister(handle);
//! # std::fs::remove_file(&path)?;
//! # Ok(())
//! # }
//! ```

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use hipfile_core::{
    BatchEvent, BatchLedger, Direction, OpError, Outcome, RawIo, SlotIndex, StreamFlags, ValidIo,
    batch_capacity, validate,
};

use crate::buffer::{BufferUse, ResolvedBuffer};
use crate::driver::{Driver, HandleId};
use crate::engine::{Completion, IoJob, JobEnd, PartJoiner};
use crate::error::Error;
use crate::file::FileHandle;

/// One entry of a batch submission (`hipFileIOParams_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchEntry {
    /// Read (file to device) or write.
    pub direction: Direction,
    /// A registered file handle.
    pub handle: HandleId,
    /// `devPtr_base`: a registered buffer's base, or any device address (the entry then
    /// may use the rest of its allocation).
    pub buffer_base_addr: u64,
    /// `devPtr_offset`: where in the buffer the entry's bytes start.
    pub buffer_offset_bytes: i64,
    /// Where in the file the entry's bytes start.
    pub file_offset_bytes: i64,
    /// Bytes to move (clamped to the maximum I/O size, as `hipFileRead` does).
    pub size_bytes: u64,
    /// Handed back with the entry's status.
    pub cookie: usize,
}

/// The state a batch shares with its entries' jobs.
struct Shared {
    ledger: Mutex<BatchLedger<usize>>,
    /// Signalled whenever an entry ends.
    changed: Condvar,
}

impl Shared {
    fn ledger(&self) -> MutexGuard<'_, BatchLedger<usize>> {
        self.ledger.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn finish(&self, slot: SlotIndex, outcome: Outcome) {
        self.ledger().finish(slot, outcome);
        self.changed.notify_all();
    }
}

/// A batch context (`hipFileBatchHandle_t`). See the module docs.
pub struct Batch {
    driver: Arc<Driver>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ledger = self.shared.ledger();
        f.debug_struct("Batch")
            .field("capacity", &ledger.capacity())
            .field("outstanding", &ledger.outstanding())
            .field("in_flight", &ledger.in_flight())
            .finish_non_exhaustive()
    }
}

/// An entry checked against the driver, ready to post.
struct Prepared {
    direction: Direction,
    file: Arc<FileHandle>,
    buffer: ResolvedBuffer,
    io: ValidIo,
}

impl Batch {
    /// A batch for up to `capacity` entries (`hipFileBatchIOSetUp`). Needs no open
    /// driver.
    ///
    /// # Errors
    /// `hipFileInvalidValue` for a capacity of 0 or above 128.
    pub fn new(driver: Arc<Driver>, capacity: u32) -> Result<Batch, Error> {
        let capacity = batch_capacity(capacity).map_err(Error::new)?;
        let ledger = Mutex::new(BatchLedger::new(capacity));
        Ok(Batch { driver, shared: Arc::new(Shared { ledger, changed: Condvar::new() }) })
    }

    /// Entries the batch holds at most.
    pub fn capacity(&self) -> usize {
        self.shared.ledger().capacity()
    }

    /// Entries submitted and not yet reported (or cancelled).
    pub fn outstanding(&self) -> usize {
        self.shared.ledger().outstanding()
    }

    /// Submits `entries` (`hipFileBatchIOSubmit`): all are checked before any is
    /// accepted; then each runs at once on the engine. An empty slice succeeds.
    ///
    /// # Errors
    /// Nothing is submitted when one fails:
    /// - `hipFileDriverNotInitialized` while the driver's use count is 0;
    /// - `hipFileHandleNotRegistered` for an unknown handle;
    /// - `hipFileInvalidValue` for negative offsets, a range outside the buffer, or more
    ///   entries than the batch has free slots (capacity − outstanding);
    /// - the buffer's error (`hipFileHipMemoryTypeInvalid` for memory that is not device
    ///   memory, ...);
    /// - `hipFileInternalError` when the compatibility path is disabled or the engine
    ///   cannot start.
    pub fn submit(&self, entries: &[BatchEntry]) -> Result<(), Error> {
        if entries.is_empty() {
            return Ok(());
        }
        let driver = &*self.driver;
        if !driver.is_open() {
            return Err(Error::new(OpError::DriverNotInitialized));
        }
        if entries.len() > self.capacity() {
            return Err(Error::new(OpError::InvalidValue));
        }
        let prepared =
            entries.iter().map(|entry| self.prepare(entry)).collect::<Result<Vec<_>, _>>()?;
        if !driver.compat_mode_allowed() {
            return Err(Error::new(OpError::InternalError));
        }
        let engine = driver.engine()?;
        let slots = self
            .shared
            .ledger()
            .reserve(entries.iter().map(|entry| entry.cookie))
            .map_err(Error::new)?;
        for (entry, slot) in prepared.into_iter().zip(slots) {
            self.post(engine, entry, slot);
        }
        Ok(())
    }

    fn prepare(&self, entry: &BatchEntry) -> Result<Prepared, Error> {
        let driver = &*self.driver;
        if entry.file_offset_bytes < 0 || entry.buffer_offset_bytes < 0 {
            return Err(Error::new(OpError::InvalidValue));
        }
        let file = driver.file(entry.handle)?;
        let buffer = driver.resolve_buffer(entry.buffer_base_addr)?;
        let raw = RawIo {
            size_bytes: entry.size_bytes,
            file_offset_bytes: entry.file_offset_bytes,
            buffer_offset_bytes: entry.buffer_offset_bytes,
        };
        let io = validate(raw, buffer.span, StreamFlags::empty(), driver.page_size_bytes())
            .map_err(Error::new)?;
        Ok(Prepared { direction: entry.direction, file, buffer, io })
    }

    /// Posts one accepted entry: one job per part; the last part to end reports it.
    fn post(&self, engine: &crate::engine::Engine, entry: Prepared, slot: SlotIndex) {
        let Prepared { direction, file, buffer, io } = entry;
        if io.is_empty() {
            self.shared.finish(slot, Outcome::Bytes(0));
            return;
        }
        let parts = engine.parts(
            crate::engine::Waiter::Queue,
            direction,
            &file,
            io.file_offset_bytes(),
            io.size_bytes(),
        );
        let mut guards = Vec::with_capacity(parts.len());
        for _ in parts.list() {
            match file.begin_op() {
                Ok(guard) => guards.push(guard),
                Err(_) => {
                    self.shared.finish(slot, Outcome::Library(OpError::HandleNotRegistered));
                    return;
                }
            }
        }
        if direction == Direction::Write {
            crate::async_op::prefetch::note_write(&file);
        }
        let executors = engine.executors_for(self.driver.next_executor(), &parts);
        let run = Arc::new(EntryRun {
            slot,
            direction,
            size_bytes: io.size_bytes(),
            device_ordinal: buffer.device_ordinal,
            submitted_at: Instant::now(),
            joiner: PartJoiner::new(direction, parts),
            buffer_use: Mutex::new(Some(buffer.begin_use())),
            shared: Arc::clone(&self.shared),
        });
        for (index, (&(offset, len), guard)) in run.joiner.parts().iter().zip(guards).enumerate() {
            let starting = Arc::clone(&run);
            let ending = Arc::clone(&run);
            let job = IoJob {
                file: Arc::clone(&file),
                guard,
                direction,
                file_offset_bytes: io.file_offset_bytes() + offset,
                device_addr: io.device_addr() + offset,
                len_bytes: len,
                device_ordinal: buffer.device_ordinal,
                wait_for_copies: true,
                arm_gate: None,
                host_memory: None,
                may_start: Some(Box::new(move || starting.shared.ledger().start(starting.slot))),
                done: Completion::new(
                    Arc::clone(self.driver.device()),
                    Box::new(move |end: JobEnd<'_>| ending.part_done(index, end)),
                ),
            };
            engine.post(executors.executor(index), job);
        }
    }

    /// Reports finished entries (`hipFileBatchIOGetStatus`): waits until at least
    /// `min_entries` have finished, or `timeout` passed (`None`: no limit; zero: just
    /// look), then returns up to `max_entries` of them, oldest first, each reported
    /// once (its slot is free again).
    ///
    /// `min_entries` is capped at the entries that can still finish (submitted, not yet
    /// reported, not cancelled): waiting never outlasts the work in the batch.
    pub fn status(
        &self,
        min_entries: usize,
        max_entries: usize,
        timeout: Option<Duration>,
    ) -> Vec<BatchEvent<usize>> {
        let deadline = timeout.map(|timeout| Instant::now().checked_add(timeout));
        let mut ledger = self.shared.ledger();
        loop {
            let can_finish = ledger.outstanding() - ledger.cancelled_in_flight();
            if ledger.ready() >= min_entries.min(max_entries).min(can_finish) {
                break;
            }
            ledger = match deadline {
                // No limit (or one too far to represent).
                None | Some(None) => {
                    self.shared.changed.wait(ledger).unwrap_or_else(|p| p.into_inner())
                }
                Some(Some(deadline)) => {
                    let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                        break;
                    };
                    let waited = self.shared.changed.wait_timeout(ledger, left);
                    waited.unwrap_or_else(|p| p.into_inner()).0
                }
            };
        }
        std::iter::from_fn(|| ledger.pop()).take(max_entries).collect()
    }

    /// Cancels the batch (`hipFileBatchIOCancel`): entries that have not started never
    /// will, entries moving data stop at their next part; returns once none of them is
    /// in flight (their buffers and files are free again). Every outstanding entry is
    /// forgotten, reported or not: the batch is empty and can take a new submission.
    pub fn cancel(&self) {
        let mut ledger = self.shared.ledger();
        ledger.cancel();
        while ledger.cancelled_in_flight() > 0 {
            ledger = self.shared.changed.wait(ledger).unwrap_or_else(|p| p.into_inner());
        }
    }
}

impl Drop for Batch {
    /// `hipFileBatchIODestroy`: cancels, and waits for the entries moving data.
    fn drop(&mut self) {
        self.cancel();
    }
}

/// One accepted entry on its way through the engine.
struct EntryRun {
    slot: SlotIndex,
    direction: Direction,
    size_bytes: u64,
    device_ordinal: u32,
    /// When the entry was submitted (statistics: submission to completion).
    submitted_at: Instant,
    joiner: PartJoiner,
    /// Held until the entry ends (deregistering the buffer meanwhile is refused).
    buffer_use: Mutex<Option<BufferUse>>,
    shared: Arc<Shared>,
}

impl EntryRun {
    fn part_done(&self, index: usize, end: JobEnd<'_>) {
        if let Some((outcome, _)) = self.joiner.part_done(index, end.outcome, end.device_error) {
            drop(self.buffer_use.lock().unwrap_or_else(|p| p.into_inner()).take());
            // An entry refused by a cancel moved nothing: not a request that ran.
            let refused = outcome == Outcome::OsError(libc::ECANCELED);
            if !refused {
                crate::stats::global().record(
                    self.device_ordinal,
                    crate::stats::Api::Batch,
                    self.direction,
                    self.size_bytes,
                    outcome,
                    self.submitted_at.elapsed(),
                );
            }
            self.shared.finish(self.slot, outcome);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;
    use crate::config::Config;
    use crate::device::cpu::CpuDevice;

    /// An entry cancelled before its job starts never touches the file or memory: the
    /// executor asks `may_start` first (the path a queued entry takes when its batch is
    /// cancelled; in the integration tests it depends on timing).
    #[test]
    fn an_entry_cancelled_before_its_job_starts_moves_nothing() {
        let device = CpuDevice::new(1);
        let config = Config {
            executor_cpus: vec![0],
            request_parallelism: 1,
            staging_per_executor_bytes: 4 << 20,
            ..Config::default()
        };
        config.validate().unwrap();
        let driver = Driver::new(config, device.clone());
        driver.open();
        let path = std::env::temp_dir().join(format!("hipfile-batch-unit-{}", std::process::id()));
        std::fs::write(&path, vec![0x5a_u8; 1 << 20]).unwrap();
        let file = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
        let handle = driver.handle_register(file.as_raw_fd()).unwrap();
        let addr = device.malloc_device(0, 1 << 20).unwrap();
        let batch = Batch::new(Arc::clone(&driver), 4).unwrap();
        let engine = driver.engine().unwrap();
        for direction in [Direction::Read, Direction::Write] {
            let entry = BatchEntry {
                direction,
                handle,
                buffer_base_addr: addr,
                buffer_offset_bytes: 0,
                file_offset_bytes: 0,
                size_bytes: 1 << 20,
                cookie: 9,
            };
            let prepared = batch.prepare(&entry).unwrap();
            let slot = batch.shared.ledger().reserve([9].into_iter()).unwrap()[0];
            assert_eq!(batch.shared.ledger().cancel(), 1);
            batch.post(engine, prepared, slot);
            let mut ledger = batch.shared.ledger();
            while ledger.cancelled_in_flight() > 0 {
                ledger = batch.shared.changed.wait(ledger).unwrap();
            }
            assert_eq!((ledger.outstanding(), ledger.ready()), (0, 0));
        }
        // SAFETY: cpu-device memory is host memory; 1 MiB allocated above, idle now.
        let memory = unsafe { std::slice::from_raw_parts(addr as *const u8, 1 << 20) };
        assert!(memory.iter().all(|&b| b == 0), "the cancelled read wrote device memory");
        assert!(std::fs::read(&path).unwrap().iter().all(|&b| b == 0x5a), "the write ran");
        assert_eq!(engine.stats().arena_chunks + engine.stats().fallback_chunks, 0);
        driver.handle_deregister(handle);
        std::fs::remove_file(&path).unwrap();
    }
}
