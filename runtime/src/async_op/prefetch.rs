//! Prefetch and write hazards: a fully FIXED read may read the file into staging before
//! its stream reaches it, unless an unfinished write of ours overlaps it (the per-file
//! hazard table) or its stream's window is full; at arm, staged data that a later write
//! (ours, counted per file, or through any descriptor, the file's change stamp) may have
//! made stale is dropped and read again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use hipfile_core::{Direction, FileRange, OpEvent, PrefetchVerdict, ValidIo, WriteHazards};

use super::AsyncOp;
use crate::engine::Engine;
use crate::file::FileHandle;
use crate::stream::DeferredStart;

/// Unfinished writes tracked per file for the prefetch hazard check.
pub(crate) const WRITE_HAZARDS_PER_FILE: usize = 64;

/// A write's entry in its file's hazard table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Hazard {
    /// Not a write.
    None,
    /// Recorded under this id.
    Tracked(u64),
    /// The table was full: counted only.
    Overflowed,
}

/// Per-file unfinished writes.
#[derive(Default)]
struct FileHazards {
    writes: WriteHazards<WRITE_HAZARDS_PER_FILE>,
    overflowed: usize,
}

/// The driver's unfinished async writes, per file.
#[derive(Default)]
pub(crate) struct WriteHazardTable {
    files: Mutex<HashMap<usize, FileHazards>>,
}

static NEXT_HAZARD_ID: AtomicU64 = AtomicU64::new(1);

impl WriteHazardTable {
    fn lock(&self) -> MutexGuard<'_, HashMap<usize, FileHazards>> {
        self.files.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records an unfinished write; when the table is full, prefetch on this file is off
    /// until the overflowing writes finish.
    pub(crate) fn add(&self, file: &Arc<FileHandle>, range: FileRange) -> Hazard {
        let id = NEXT_HAZARD_ID.fetch_add(1, Ordering::Relaxed);
        let mut hazards = self.lock();
        let entry = hazards.entry(Arc::as_ptr(file) as usize).or_default();
        match entry.writes.insert(id, range) {
            Ok(()) => Hazard::Tracked(id),
            Err(_) => {
                entry.overflowed += 1;
                Hazard::Overflowed
            }
        }
    }

    /// Forgets a finished (or abandoned) write.
    pub(crate) fn remove(&self, file: &Arc<FileHandle>, hazard: Hazard) {
        let key = Arc::as_ptr(file) as usize;
        let mut hazards = self.lock();
        if let Some(entry) = hazards.get_mut(&key) {
            match hazard {
                Hazard::None => return,
                Hazard::Tracked(id) => {
                    entry.writes.remove(id);
                }
                Hazard::Overflowed => entry.overflowed = entry.overflowed.saturating_sub(1),
            }
            if entry.writes.is_empty() && entry.overflowed == 0 {
                hazards.remove(&key);
            }
        }
    }

    /// Whether a read of `range` may start before its stream reaches it.
    pub(crate) fn may_prefetch(&self, file: &Arc<FileHandle>, range: FileRange) -> bool {
        match self.lock().get(&(Arc::as_ptr(file) as usize)) {
            None => true,
            Some(entry) => {
                entry.overflowed == 0 && entry.writes.may_prefetch(&range) == PrefetchVerdict::Clear
            }
        }
    }
}

/// Buckets of per-file write counts (see [`note_write`]).
const WRITE_GENERATION_BUCKETS: usize = 256;
static WRITE_GENERATIONS: [AtomicU64; WRITE_GENERATION_BUCKETS] =
    [const { AtomicU64::new(0) }; WRITE_GENERATION_BUCKETS];

fn write_generation_bucket(file: &Arc<FileHandle>) -> &'static AtomicU64 {
    let address = Arc::as_ptr(file) as usize;
    &WRITE_GENERATIONS[(address >> 6) % WRITE_GENERATION_BUCKETS]
}

/// Counts a write submitted to `file` (async or sync): prefetched reads compare the
/// count at arm with the count when they started.
pub(crate) fn note_write(file: &Arc<FileHandle>) {
    write_generation_bucket(file).fetch_add(1, Ordering::SeqCst);
}

/// The write count of `file` (shared by files hashing to the same bucket, which only
/// makes a prefetch redo more often, never less).
fn write_generation(file: &Arc<FileHandle>) -> u64 {
    write_generation_bucket(file).load(Ordering::SeqCst)
}

/// The file range an op covers.
pub(crate) fn file_range(io: &ValidIo) -> FileRange {
    FileRange { start_bytes: io.file_offset_bytes(), end_bytes: io.file_end_bytes() }
}

impl AsyncOp {
    /// Starts the prefetch of a fully FIXED read that the stream's window did not admit
    /// at submission, if the stream has not reached it yet and the window has room now.
    pub(super) fn try_start_deferred_prefetch(self: &Arc<Self>) -> DeferredStart {
        if self.slot.is_some() {
            return self.try_start_deferred_slot_read();
        }
        let len_bytes = self.submitted.size_bytes();
        if self.end.is_abandoned() || self.gate.reached() {
            return DeferredStart::Gone;
        }
        let Ok(engine) = self.host.engine() else { return DeferredStart::Gone };
        if !self.host.write_hazards().may_prefetch(&self.file, file_range(&self.submitted)) {
            return DeferredStart::Gone;
        }
        if !self.stream.admit_prefetch(len_bytes) {
            return DeferredStart::NoRoom;
        }
        // The window's share is the op's once the prefetch started (before its gate
        // exists: the arm may release it as soon as it finds the gate).
        self.holds_prefetch_window.store(true, Ordering::SeqCst);
        let Some(gate) = self.start_prefetch(engine) else {
            if self.holds_prefetch_window.swap(false, Ordering::SeqCst) {
                self.stream.release_prefetch(len_bytes);
            }
            return DeferredStart::Gone;
        };
        self.host.async_stats().prefetched.fetch_add(1, Ordering::Relaxed);
        self.post(engine, self.submitted, Some(gate));
        DeferredStart::Started
    }

    /// Starts the op's prefetch through its gate unless the stream reached the op (or it
    /// was abandoned): the gate its jobs wait on, which the arm opens once per part, so
    /// the jobs must be posted as exactly these parts (under `HIPFILE_BUSY_FAN_OUT` a
    /// second `Engine::parts` may split differently). Under a fault plan it returns a gate
    /// late ([`crate::fault::Site::PrefetchPost`]): its jobs are posted after the delay.
    pub(super) fn start_prefetch(&self, engine: &Engine) -> Option<PrefetchGate> {
        let mut gate = None;
        self.gate.start_prefetch(|| {
            // Legal by construction: only an eligible op holds or asks for a window, and
            // the gate runs this only before the stream reached the op.
            self.set_state(OpEvent::Prefetch);
            self.note_prefetch_start();
            let parts = engine.parts(
                crate::engine::Waiter::Queue,
                Direction::Read,
                &self.file,
                self.submitted.file_offset_bytes(),
                self.submitted.size_bytes(),
            );
            let (sender, waiting) = flume::bounded(parts.len());
            let count = parts.len();
            gate = Some(PrefetchGate { receiver: waiting, parts });
            Some((sender, count))
        });
        if gate.is_some() {
            injected_post_delay();
        }
        gate
    }

    /// Records what a prefetch starting now is read against: our write count of the
    /// file and the file's change stamp (taken before the read starts).
    pub(super) fn note_prefetch_start(&self) {
        let generation = write_generation(&self.file);
        self.prefetch_generation.store(generation, Ordering::SeqCst);
        *self.prefetch_stamp.lock().unwrap_or_else(|p| p.into_inner()) = self.file.change_stamp();
    }

    /// Whether the prefetched data is still what the file holds now that the stream
    /// reached the op: no write of ours was submitted since it started, and the file's
    /// size and change times are those seen then, with its last change settled before
    /// (`ChangeStamp::still_holds`). A write through any descriptor moves them.
    pub(super) fn prefetch_still_fresh(&self) -> bool {
        if write_generation(&self.file) != self.prefetch_generation.load(Ordering::SeqCst) {
            return false;
        }
        let then = *self.prefetch_stamp.lock().unwrap_or_else(|p| p.into_inner());
        match (then, self.file.change_stamp()) {
            (Some(then), Some(now)) => then.still_holds(&now),
            _ => false,
        }
    }

    /// Gives the op's share of its stream's prefetch window back (once).
    pub(super) fn release_prefetch_window(&self) {
        if self.holds_prefetch_window.swap(false, Ordering::SeqCst) {
            self.stream.release_prefetch(self.submitted.size_bytes());
            self.stream.start_deferred();
        }
    }
}

/// A fault plan's delay between a prefetch's gate and the posting of its jobs (tests
/// only; see [`crate::fault::Site::PrefetchPost`]; other faults pass there). One relaxed
/// atomic load while no plan is installed.
fn injected_post_delay() {
    use crate::fault::{Fault, Site};
    if let Some(Fault::Delay(delay)) = crate::fault::at(Site::PrefetchPost) {
        std::thread::sleep(delay);
    }
}

/// A prefetch's gate: what its jobs wait on, and the parts they were counted as.
pub(super) struct PrefetchGate {
    pub(super) receiver: flume::Receiver<bool>,
    pub(super) parts: crate::engine::Parts,
}
