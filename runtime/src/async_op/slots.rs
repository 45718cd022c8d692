//! Staging slots of reads copied on the user's own stream.
//!
//! A small fully FIXED read (at most [`SLOT_BYTES`]; with `HIPFILE_STREAM_COPIES=all` any
//! of at most [`MAX_SLOT_BYTES`] inside the file, and writes with FIXED buffer offset and
//! size too: their stream
//! copies the source into the slot ahead of the op's doorbell, `stream_copy`) takes a
//! slot of pinned, portable host memory at submission and enqueues on its stream, behind the op's wait-value, the
//! copy slot → destination and a write of the slot's *done word*. The engine reads the
//! file into the slot while the stream works towards the op; when the stream reaches it,
//! the poller only checks that the staged bytes are still fresh and stores the release
//! word from the host: no executor wake-up, no copy or release enqueued per op on the
//! engine's streams. The stream's release then depends on the host alone (the read), so
//! no application stream can hold it back (DESIGN.md, isolation).
//!
//! With `all`, a stream whose op finds no free slot (or ring) of its size takes *spare*
//! slots: a ring of [`SPARE_RING`] slots of [`SPARE_BYTES`] that stays with that stream
//! ([`SpareSlot`]); ops with a FIXED device range then go through it in pieces, each read
//! when the stream reaches it or read ahead by the piece before it (a write's piece is
//! copied into its slot ahead of its doorbell): stream order alone keeps the ring safe
//! across pieces and ops (`super::pieces`), so no op of such a stream falls back to the
//! engine's path however many are in flight. Spares may take the [`SPARE_BYTES`] size to
//! twice its cap; spares go back to the pool once their stream's state is gone, no op
//! holds them, and their done words show their last uses.
//!
//! A slot is handed out again once its done word shows the generation of its last use:
//! the stream's copy out of it has run. A slot whose done write could not be enqueued is
//! never handed out again; slabs with a copy not yet run when the pool drops are leaked
//! rather than freed under a stream that may still read them.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use crate::device::{Device, PinnedRegion};
use crate::word::ReleaseWord;

/// Largest read served through a slot on an idle stream (`HIPFILE_STREAM_COPIES=on`).
pub(crate) const SLOT_BYTES: usize = 64 * 1024;
/// Largest read served through a slot with `HIPFILE_STREAM_COPIES=all`.
pub(crate) const MAX_SLOT_BYTES: usize = 16 << 20;
/// Slot sizes: a read takes the smallest that holds it.
const CLASS_BYTES: [usize; 7] =
    [4 * 1024, 16 * 1024, SLOT_BYTES, 256 * 1024, 1 << 20, 4 << 20, MAX_SLOT_BYTES];
/// Bytes of slots per pinned slab (plus a page of done words), for slots of at most this.
const SLAB_BYTES: usize = 1 << 20;
/// Most pinned bytes of slots of one small size; past that, ops take the engine's path.
const SMALL_CLASS_CAP_BYTES: usize = 16 << 20;
/// Bytes of a stream's spare slot, and of the pieces of the ops that go through it: large
/// enough that a 16 MiB op is four pieces (four stream operations each), small enough
/// that 256 streams' spares fit 1 GiB.
pub(crate) const SPARE_BYTES: usize = 4 << 20;
/// The slot size of [`SPARE_BYTES`].
const SPARE_CLASS: usize = 5;
/// The slot size of [`MAX_SLOT_BYTES`].
#[cfg(test)]
const MAX_SLOT_CLASS: usize = 6;
/// Spare slots per stream: two, so that a piece is read into one while the stream copies
/// the one before out of the other.
pub(crate) const SPARE_RING: usize = 2;

/// One slot lent to an op.
#[derive(Clone, Copy)]
pub(crate) struct Slot {
    class: usize,
    /// `Some(ordinal)`: a slot of the engine's device memory on that device
    /// (`HIPFILE_STREAM_COPY_SLOTS=device`, reads over [`SLOT_BYTES`]); `None`: pinned.
    device: Option<u32>,
    index: usize,
    /// The slot's bytes (pinned, portable: any context may copy from it); null for a slot
    /// of device memory.
    pub(crate) host_ptr: *mut u8,
    /// The device address of a device-memory slot's bytes (0 for a pinned slot).
    device_data: u64,
    /// Written by the stream after its copy out of the slot.
    pub(crate) done_word: ReleaseWord,
    /// The value the stream writes into `done_word` for this use.
    pub(crate) generation: u32,
    /// A slot shared with an earlier read of the same stream whose copy out of it may not
    /// have run yet ([`SlotPool::try_take_for_read`]): that use's generation and stream.
    /// Given back unused, the slot waits for that copy again instead of being lent.
    prior: Option<(u32, StreamKey)>,
}

impl Slot {
    /// For a slot of the engine's device memory: the device address of its bytes (the
    /// engine copies into it, the stream copies device → device out of it).
    pub(crate) fn device_memory(&self) -> Option<u64> {
        self.device.map(|_| self.device_data)
    }

    /// The same slot, as of its use `generation`.
    pub(crate) fn with_generation(self, generation: u32) -> Slot {
        Slot { generation, ..self }
    }

    /// Whether the slot is shared with an earlier read of the stream
    /// ([`SlotPool::try_take_for_read`]).
    pub(crate) fn is_shared(&self) -> bool {
        self.prior.is_some()
    }

    /// For a shared slot: whether the stream's copy of the earlier use has yet to run (its
    /// done word does not show that use); nothing may be read into the slot until it has.
    pub(crate) fn waits_for_earlier_copy(&self) -> bool {
        self.prior.is_some_and(|(generation, _)| self.done_word.load() != generation)
    }
}

// SAFETY: the slot's memory belongs to the pool, which lives as long as the driver that
// every op holding a slot keeps alive; the op is the only writer while it holds the slot.
unsafe impl Send for Slot {}
// SAFETY: as above.
unsafe impl Sync for Slot {}

struct Slab {
    /// `None`: given back while its size was idle (device memory only,
    /// [`SlotClass::give_back_idle`]); none of its slots is listed then.
    data: Option<SlabData>,
    words: PinnedRegion,
}

/// A slab's bytes: pinned host memory, or the engine's device memory.
enum SlabData {
    Pinned(PinnedRegion),
    Device(u64),
}

/// The stream a retired slot's last copy was enqueued on: the serial of its
/// [`StreamState`](crate::stream::StreamState) (never reused, unlike its address). A stream
/// runs its copies in order, so the pool looks at each stream's retired slots oldest first
/// and stops at the first whose copy has not run ([`SlotClass::reclaim`]), and a read of
/// the same stream may share a slot whose copy is still queued ([`SlotPool::try_take_for_read`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StreamKey(u64);

impl StreamKey {
    pub(crate) fn of(stream: &crate::stream::StreamState) -> StreamKey {
        StreamKey(stream.serial())
    }
}

/// One stream's retired slots, in the order they were retired: (slot, generation).
struct StreamPending {
    stream: StreamKey,
    slots: VecDeque<(usize, u32)>,
}

#[derive(Default)]
struct PoolState {
    slabs: Vec<Slab>,
    /// Slots ready to lend.
    free: Vec<usize>,
    /// Slots whose stream copy may not have run yet, by stream (only streams with some).
    pending: Vec<StreamPending>,
    /// Done words read by [`SlotClass::reclaim`] so far (what a take costs, for the tests).
    #[cfg(test)]
    done_words_read: usize,
    next_generation: u32,
    /// A slab allocation failed: the pool stays at its size.
    alloc_failed: bool,
    /// Slabs being allocated now, outside the lock (they count against the cap).
    growing: usize,
    /// Slabs whose device memory was given back ([`Slab::data`] `None`), reused first when
    /// the size grows again.
    given_back: Vec<usize>,
    /// When a slot of this size was last asked for.
    last_asked: Option<Instant>,
}

/// A stream's spare slots (see the module's text): [`SPARE_RING`] slots (one where only one
/// could be had), lent to the ops of their stream in turn as a ring, a new generation per
/// use; what the pool must know to take them back.
pub(crate) struct SpareSlot {
    /// The slots as first lent (their memory and done words; uses take new generations).
    pub(crate) slots: Vec<Slot>,
    /// Each slot's last use whose copy was enqueued, or whether a done write was refused.
    last: Mutex<Vec<SpareUse>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SpareUse {
    Unused,
    Queued(u32),
    Lost,
}

impl SpareSlot {
    /// A copy out of or into slot `index` was enqueued for the use `generation` (uses are
    /// enqueued in stream order, under the stream's submit lock: the last noted is the
    /// last run).
    pub(crate) fn note_queued(&self, index: usize, generation: u32) {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last[index] != SpareUse::Lost {
            last[index] = SpareUse::Queued(generation);
        }
    }

    /// A copy was enqueued without its done write: that slot is never lent again, and the
    /// stream takes no other spares.
    pub(crate) fn note_lost(&self, index: usize) {
        self.last.lock().unwrap_or_else(|p| p.into_inner())[index] = SpareUse::Lost;
    }

    fn lost(&self) -> bool {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).contains(&SpareUse::Lost)
    }
}

/// The spares lent to streams: each with the stream it belongs to.
type Spares = Vec<(Weak<crate::stream::StreamState>, StreamKey, Arc<SpareSlot>)>;

/// The driver's slots, by size (allocated on first use, a slab at a time).
pub(crate) struct SlotPool {
    classes: [SlotClass; CLASS_BYTES.len()],
    /// With `HIPFILE_STREAM_COPY_SLOTS=device`: per device ordinal, slots of the engine's
    /// device memory for reads over [`SLOT_BYTES`] (the smaller sizes stay unused); empty
    /// otherwise.
    device_classes: Vec<[SlotClass; CLASS_BYTES.len()]>,
    spares: Mutex<Spares>,
    /// `HIPFILE_STREAM_COPIES=all`: every fully FIXED read inside the file, up to
    /// [`MAX_SLOT_BYTES`], on any stream; otherwise small reads on idle streams only.
    all_reads: bool,
    /// Bytes of a long op's pieces (`HIPFILE_STREAM_COPY_PIECE_MB`): a slot size of at
    /// least 1 MiB.
    piece_bytes: usize,
    /// Told of every slab of device memory allocated (`super::idle_slots`).
    grown: Arc<GrowSignal>,
    /// Reads that wanted a device slot and found none free ([`SlotPool::try_take_for_read`]).
    reads_past_device_slots: AtomicU64,
    /// Of those, reads that shared a slot with an earlier read of their stream.
    reads_sharing_device_slots: AtomicU64,
    /// `HIPFILE_STREAM_COPY_DEVICE_FULL=share`: a read that finds no device slot free
    /// shares one of its stream's ([`SlotPool::try_take_for_read`]).
    share_when_full: bool,
    /// The cap of each device's slots (`HIPFILE_STREAM_COPY_DEVICE_MB`), for the message.
    device_cap_bytes: Option<usize>,
}

impl SlotPool {
    /// Pinned slots only ([`SlotPool::with_memory`] without device slots; tests).
    #[cfg(test)]
    pub(crate) fn new(
        device: Arc<dyn Device>,
        all_reads: bool,
        large_cap_bytes: usize,
        piece_bytes: usize,
    ) -> SlotPool {
        SlotPool::with_memory(device, all_reads, large_cap_bytes, piece_bytes, None, false)
    }

    /// Slots of every size, none allocated yet; `large_cap_bytes` bounds each size above
    /// [`SLOT_BYTES`] (`HIPFILE_STREAM_COPY_MB`), small sizes hold 16 MiB each; long ops
    /// go in pieces of `piece_bytes` (rounded up to a slot size of at least 1 MiB). With
    /// `device_cap_bytes`, reads over [`SLOT_BYTES`] take slots of the engine's device
    /// memory on their device (all sizes of one device together up to `device_cap_bytes`:
    /// `HIPFILE_STREAM_COPY_DEVICE_MB`), pinned ones where the backend has none to give or
    /// the device's cap is reached.
    pub(crate) fn with_memory(
        device: Arc<dyn Device>,
        all_reads: bool,
        large_cap_bytes: usize,
        piece_bytes: usize,
        device_cap_bytes: Option<usize>,
        share_when_full: bool,
    ) -> SlotPool {
        let grown = Arc::new(GrowSignal::default());
        let classes_of = |memory: Option<u32>| -> [SlotClass; CLASS_BYTES.len()] {
            // One budget for all the sizes of a device's memory.
            let budget = memory.zip(device_cap_bytes).map(|(_, cap_bytes)| {
                Arc::new(DeviceBudget { cap_bytes, used_bytes: AtomicUsize::new(0) })
            });
            std::array::from_fn(|class| {
                let slot_bytes = CLASS_BYTES[class];
                // Device memory is bounded by its device's budget alone.
                let cap_bytes = match (budget.as_ref(), slot_bytes <= SLOT_BYTES) {
                    (_, true) => SMALL_CLASS_CAP_BYTES,
                    (Some(budget), false) => budget.cap_bytes,
                    (None, false) => large_cap_bytes,
                };
                SlotClass {
                    device: Arc::clone(&device),
                    class,
                    memory,
                    slot_bytes,
                    cap_bytes,
                    budget: budget.clone(),
                    grown: memory.map(|_| Arc::clone(&grown)),
                    state: Mutex::new(PoolState::default()),
                }
            })
        };
        let device_classes = if device_cap_bytes.is_some() && all_reads {
            (0..device.device_count()).map(|ordinal| classes_of(Some(ordinal))).collect()
        } else {
            Vec::new()
        };
        let piece_bytes = CLASS_BYTES
            .iter()
            .copied()
            .find(|&bytes| bytes >= piece_bytes.max(1 << 20))
            .unwrap_or(MAX_SLOT_BYTES);
        let classes = classes_of(None);
        SlotPool {
            grown,
            reads_past_device_slots: AtomicU64::new(0),
            reads_sharing_device_slots: AtomicU64::new(0),
            share_when_full,
            device_cap_bytes,
            all_reads,
            piece_bytes,
            spares: Mutex::new(Vec::new()),
            classes,
            device_classes,
        }
    }

    /// Whether the pool has slots of the engine's device memory.
    pub(crate) fn has_device_slots(&self) -> bool {
        !self.device_classes.is_empty()
    }

    /// What the thread that gives idle device memory back waits on.
    pub(crate) fn grow_signal(&self) -> &Arc<GrowSignal> {
        &self.grown
    }

    /// Gives back the device memory of the free slots of every size of device slots that
    /// no read asked for during `idle` ([`SlotClass::give_back_idle`]); returns the bytes.
    pub(crate) fn give_back_idle(&self, idle: Duration) -> usize {
        let now = Instant::now();
        self.device_classes.iter().flatten().map(|class| class.give_back_idle(idle, now)).sum()
    }

    /// Bytes of the engine's device memory the slots hold now, all devices together.
    pub(crate) fn device_bytes_held(&self) -> usize {
        self.device_classes
            .iter()
            .filter_map(|classes| classes.iter().find_map(|class| class.budget.as_ref()))
            .map(|budget| budget.used_bytes.load(Ordering::Relaxed))
            .sum()
    }

    /// Whether every fully FIXED read inside the file takes a slot (`all`), not only
    /// small ones on idle streams.
    pub(crate) fn all_reads(&self) -> bool {
        self.all_reads
    }

    /// Bytes of a long op's pieces (a slot size).
    pub(crate) fn piece_bytes(&self) -> u64 {
        self.piece_bytes as u64
    }

    /// A free slot of at least `len_bytes` (at most [`MAX_SLOT_BYTES`]), if one is free
    /// or can be made; never blocks on a stream.
    pub(crate) fn try_take(&self, len_bytes: usize) -> Option<Slot> {
        let class = CLASS_BYTES.iter().position(|&bytes| len_bytes <= bytes)?;
        self.classes[class].try_take()
    }

    /// A slot for a read of `len_bytes` into memory of device `device_ordinal`: one of the
    /// engine's device memory there when the pool has them and the read is over
    /// [`SLOT_BYTES`] (`HIPFILE_STREAM_COPY_SLOTS=device`), else — or when none is free or
    /// can be made — a pinned one ([`SlotPool::try_take`]). Never blocks on a stream.
    ///
    /// With [`SlotPool::with_memory`]'s `share_when_full`, a read that finds no device slot
    /// free shares one with an earlier read of its own `stream` whose copy out of it is
    /// queued but may not have run (that stream's oldest such slot of its size): the stream
    /// runs that copy before it reaches this read, so the read may fill the slot once that
    /// copy ran ([`Slot::waits_for_earlier_copy`]: read ahead from then on) and at the
    /// latest at its arm. Returns the slot and whether it is shared so.
    pub(crate) fn try_take_for_read(
        &self,
        len_bytes: usize,
        device_ordinal: u32,
        stream: StreamKey,
    ) -> Option<(Slot, bool)> {
        let Some(class) = self.device_class_for(len_bytes, device_ordinal) else {
            return self.try_take(len_bytes).map(|slot| (slot, false));
        };
        if let Some(slot) = class.try_take() {
            return Some((slot, false));
        }
        self.note_read_past_device_slots();
        if self.share_when_full
            && let Some(slot) = class.take_from_stream(stream)
        {
            self.reads_sharing_device_slots.fetch_add(1, Ordering::Relaxed);
            return Some((slot, true));
        }
        self.try_take(len_bytes).map(|slot| (slot, false))
    }

    /// Whether a read past the device slots' cap shares its stream's queued slot.
    pub(crate) fn shares_when_full(&self) -> bool {
        self.share_when_full && self.has_device_slots()
    }

    /// Reads that shared a device slot with an earlier read of their stream.
    pub(crate) fn reads_sharing_device_slots(&self) -> u64 {
        self.reads_sharing_device_slots.load(Ordering::Relaxed)
    }

    /// Counts a read that wanted a device slot and found none free (its device's cap is
    /// reached, or its memory refused a slab) and says so once: such reads take pinned
    /// slots, whose copy to the device runs on the user's stream after the release, in the
    /// stream's round trip (on an H100, 16 MiB reads at 16 streams ran at 25–26 GiB/s with
    /// half of them past the cap against 30–31 GiB/s with none: README, Measured).
    fn note_read_past_device_slots(&self) {
        if self.reads_past_device_slots.fetch_add(1, Ordering::Relaxed) == 0 {
            log::info!(
                "a read over {} KiB found no free slot of device memory ({} MiB of them per \
                 device, HIPFILE_STREAM_COPY_DEVICE_MB): it and later ones like it take pinned \
                 slots, whose copy runs on the application's stream after the release (slower \
                 for large reads); a larger cap holds bursts this large (logged once)",
                SLOT_BYTES >> 10,
                self.device_cap_bytes.unwrap_or(0) >> 20
            );
        }
    }

    /// Reads that wanted a slot of device memory and found none free (they took pinned
    /// slots, or none).
    pub(crate) fn reads_past_device_slots(&self) -> u64 {
        self.reads_past_device_slots.load(Ordering::Relaxed)
    }

    /// The size of device slots on `device_ordinal` that a read of `len_bytes` takes: one
    /// when the pool has device slots there and the read is over [`SLOT_BYTES`] (and at
    /// most [`MAX_SLOT_BYTES`]).
    fn device_class_for(&self, len_bytes: usize, device_ordinal: u32) -> Option<&SlotClass> {
        let classes = self.device_classes.get(device_ordinal as usize)?;
        let class = CLASS_BYTES.iter().position(|&bytes| len_bytes <= bytes)?;
        (len_bytes > SLOT_BYTES).then(|| &classes[class])
    }

    /// The class a slot of this pool belongs to.
    fn class_of(&self, slot: &Slot) -> &SlotClass {
        match slot.device {
            None => &self.classes[slot.class],
            Some(ordinal) => &self.device_classes[ordinal as usize][slot.class],
        }
    }

    /// `count` free slots of at least `len_bytes` each, or none (a ring for the pieces of
    /// a long op: `super::pieces`); never blocks on a stream.
    pub(crate) fn try_take_ring(&self, len_bytes: usize, count: usize) -> Option<Vec<Slot>> {
        self.take_ring(count, || self.try_take(len_bytes))
    }

    /// A ring for the pieces of a long read into memory of device `device_ordinal`: slots of
    /// the engine's device memory there when the pool has them and the pieces are over
    /// [`SLOT_BYTES`] (as [`SlotPool::try_take_for_read`]), else — or when the device's
    /// cap leaves no room for the whole ring, counted as a read past the device slots —
    /// pinned ones.
    pub(crate) fn try_take_ring_for_read(
        &self,
        len_bytes: usize,
        count: usize,
        device_ordinal: u32,
    ) -> Option<Vec<Slot>> {
        let Some(class) = self.device_class_for(len_bytes, device_ordinal) else {
            return self.try_take_ring(len_bytes, count);
        };
        if let Some(ring) = self.take_ring(count, || class.try_take()) {
            return Some(ring);
        }
        self.note_read_past_device_slots();
        self.try_take_ring(len_bytes, count)
    }

    /// `count` slots from `take`, or none (the ones taken go back).
    fn take_ring(&self, count: usize, take: impl Fn() -> Option<Slot>) -> Option<Vec<Slot>> {
        let mut ring = Vec::with_capacity(count);
        while ring.len() < count {
            match take() {
                Some(slot) => ring.push(slot),
                None => {
                    for slot in &ring {
                        self.give_back(slot);
                    }
                    return None;
                }
            }
        }
        Some(ring)
    }

    /// The spare slots of `stream` (`HIPFILE_STREAM_COPIES=all`, for ops that found no slot
    /// of their own): the ones it has, else [`SPARE_RING`] free slots of [`SPARE_BYTES`]
    /// (one if only one can be had), allocated past that size's cap up to twice it; `None`
    /// when none can be had. Takes back the spares of streams that are gone. Never blocks
    /// on a stream.
    pub(crate) fn spare_for(
        &self,
        stream: &Arc<crate::stream::StreamState>,
    ) -> Option<Arc<SpareSlot>> {
        {
            let mut spares = self.spares.lock().unwrap_or_else(|p| p.into_inner());
            self.take_back_spares(&mut spares, false);
            let key = StreamKey::of(stream);
            if let Some((.., spare)) = spares.iter().find(|(_, owner, _)| *owner == key) {
                return (!spare.lost()).then(|| Arc::clone(spare));
            }
        }
        // Taken without the list's lock (an allocation may wait: `SlotClass::grow`); the
        // caller holds the stream's submit lock, so no other spare is taken for it now.
        let class = &self.classes[SPARE_CLASS];
        let slots: Vec<Slot> = (0..SPARE_RING).map_while(|_| class.try_take_spare()).collect();
        if slots.is_empty() {
            return None;
        }
        let last = Mutex::new(vec![SpareUse::Unused; slots.len()]);
        let spare = Arc::new(SpareSlot { slots, last });
        let mut spares = self.spares.lock().unwrap_or_else(|p| p.into_inner());
        spares.push((Arc::downgrade(stream), StreamKey::of(stream), Arc::clone(&spare)));
        Some(spare)
    }

    /// Spares whose stream is gone (all of them when `all`, the pool's end) and that no op
    /// holds any more go back: at once if never used, once their done word shows their
    /// last use, never if a done write was refused.
    fn take_back_spares(&self, spares: &mut Spares, all: bool) {
        spares.retain(|(owner, key, spare)| {
            // At the pool's end no op is left (each holds the driver), whatever the count.
            let free = all || (owner.strong_count() == 0 && Arc::strong_count(spare) == 1);
            if !free {
                // A lost spare stays listed too, so that its stream does not take another.
                return true;
            }
            let last = spare.last.lock().unwrap_or_else(|p| p.into_inner()).clone();
            for (slot, last) in spare.slots.iter().zip(last) {
                match last {
                    SpareUse::Unused => self.give_back(slot),
                    SpareUse::Queued(generation) => {
                        self.retire(&slot.with_generation(generation), *key)
                    }
                    SpareUse::Lost => self.lose(),
                }
            }
            false
        });
    }

    /// Spares lent to streams now (not yet taken back).
    #[cfg(test)]
    fn spares_lent(&self) -> usize {
        self.spares.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// The same slot for its next use by the op that holds it (a ring's piece): a new
    /// generation, so that its done word tells this use from the earlier ones.
    pub(crate) fn next_use(&self, slot: &Slot) -> Slot {
        let class = self.class_of(slot);
        let mut state = class.lock();
        state.next_generation = state.next_generation.wrapping_add(1).max(1);
        class.slot(&state, slot.index, state.next_generation)
    }

    /// Gives back a slot whose stream copy was never enqueued (a shared one goes back to
    /// waiting for its earlier use's copy).
    pub(crate) fn give_back(&self, slot: &Slot) {
        match slot.prior {
            Some((generation, stream)) => {
                self.retire(&Slot { prior: None, ..slot.with_generation(generation) }, stream);
            }
            None => self.class_of(slot).lock().free.push(slot.index),
        }
    }

    /// The copy out of `slot` and its done write are enqueued on `stream`: lend it again
    /// once the done word shows `slot.generation`.
    pub(crate) fn retire(&self, slot: &Slot, stream: StreamKey) {
        let mut state = self.class_of(slot).lock();
        let entry = (slot.index, slot.generation);
        match state.pending.iter_mut().rev().find(|pending| pending.stream == stream) {
            Some(pending) => pending.slots.push_back(entry),
            None => state.pending.push(StreamPending { stream, slots: VecDeque::from([entry]) }),
        }
    }

    /// The stream's copy out of a slot is enqueued but its done write is not: the slot is
    /// never lent again.
    pub(crate) fn lose(&self) {
        log::warn!("a read staging slot is retired for good (its done write was refused)");
    }
}

/// Slots of one size.
struct SlotClass {
    device: Arc<dyn Device>,
    class: usize,
    /// `Some(ordinal)`: slabs of the engine's device memory on that device; `None`: pinned.
    memory: Option<u32>,
    slot_bytes: usize,
    /// The most pinned bytes of slabs of this size (at least one slab).
    cap_bytes: usize,
    /// Slots of device memory: the bytes all sizes of that device may hold together.
    budget: Option<Arc<DeviceBudget>>,
    /// Slots of device memory: told of every slab allocated, for the thread that gives
    /// idle ones back (`super::idle_slots`).
    grown: Option<Arc<GrowSignal>>,
    state: Mutex<PoolState>,
}

/// The device memory that the slots of one device hold, all sizes together, and its cap
/// (`HIPFILE_STREAM_COPY_DEVICE_MB`).
struct DeviceBudget {
    cap_bytes: usize,
    used_bytes: AtomicUsize,
}

/// Wakes the thread that gives idle device memory back (`super::idle_slots`) when a slab of
/// device memory is allocated, and stops it.
#[derive(Default)]
pub(crate) struct GrowSignal {
    flags: Mutex<GrowFlags>,
    wake: Condvar,
}

#[derive(Default)]
struct GrowFlags {
    /// A slab was allocated since the thread last looked.
    grown: bool,
    stop: bool,
}

impl GrowSignal {
    fn lock(&self) -> MutexGuard<'_, GrowFlags> {
        self.flags.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn note_grown(&self) {
        self.lock().grown = true;
        self.wake.notify_all();
    }

    /// Tells the waiting thread to end.
    pub(crate) fn stop(&self) {
        self.lock().stop = true;
        self.wake.notify_all();
    }

    /// Waits until a slab was allocated since the last call (`true`) or [`GrowSignal::stop`]
    /// was called (`false`).
    pub(crate) fn wait_grown(&self) -> bool {
        let mut flags = self.lock();
        while !flags.grown && !flags.stop {
            flags = self.wake.wait(flags).unwrap_or_else(|p| p.into_inner());
        }
        flags.grown = false;
        !flags.stop
    }

    /// Sleeps for `period`; `false` if [`GrowSignal::stop`] was called.
    pub(crate) fn sleep(&self, period: Duration) -> bool {
        let flags = self.lock();
        let (flags, _) = self
            .wake
            .wait_timeout_while(flags, period, |flags| !flags.stop)
            .unwrap_or_else(|p| p.into_inner());
        !flags.stop
    }
}

impl DeviceBudget {
    /// Counts `bytes` more if they fit the cap.
    fn reserve(&self, bytes: usize) -> bool {
        self.used_bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(bytes).filter(|&after| after <= self.cap_bytes)
            })
            .is_ok()
    }

    fn release(&self, bytes: usize) {
        self.used_bytes.fetch_sub(bytes, Ordering::Relaxed);
    }
}

impl SlotClass {
    fn lock(&self) -> MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Bytes of one slab: [`SLAB_BYTES`], or one slot when slots are larger.
    fn slab_bytes(&self) -> usize {
        SLAB_BYTES.max(self.slot_bytes)
    }

    fn slots_per_slab(&self) -> usize {
        self.slab_bytes() / self.slot_bytes
    }

    fn max_slabs(&self) -> usize {
        (self.cap_bytes / self.slab_bytes()).max(1)
    }

    fn try_take(&self) -> Option<Slot> {
        self.take_up_to(self.max_slabs())
    }

    /// The oldest retired slot of `stream` whose copy has not run, for a later read of the
    /// same stream (a new generation; `prior` records the one its queued copy will write).
    fn take_from_stream(&self, stream: StreamKey) -> Option<Slot> {
        let mut state = self.lock();
        let position = state.pending.iter().position(|pending| pending.stream == stream)?;
        let (index, prior) = state.pending[position].slots.pop_front()?;
        if state.pending[position].slots.is_empty() {
            state.pending.swap_remove(position);
        }
        state.next_generation = state.next_generation.wrapping_add(1).max(1);
        let generation = state.next_generation;
        Some(Slot { prior: Some((prior, stream)), ..self.slot(&state, index, generation) })
    }

    /// A slot for a stream's spare: as [`SlotClass::try_take`], growing past the cap up to
    /// twice it.
    fn try_take_spare(&self) -> Option<Slot> {
        self.take_up_to(2 * self.max_slabs())
    }

    /// A free slot, reclaiming copied ones first and growing while fewer than `max_slabs`
    /// slabs exist (or are being allocated).
    fn take_up_to(&self, max_slabs: usize) -> Option<Slot> {
        let mut state = self.lock();
        if self.memory.is_some() {
            state.last_asked = Some(Instant::now());
        }
        if state.free.is_empty() {
            self.reclaim(&mut state);
        }
        if state.free.is_empty()
            && !state.alloc_failed
            && state.slabs.len() - state.given_back.len() + state.growing < max_slabs
            && self.budget.as_ref().is_none_or(|budget| budget.reserve(self.slab_bytes()))
        {
            state = self.grow(state);
        }
        let index = state.free.pop()?;
        state.next_generation = state.next_generation.wrapping_add(1).max(1);
        let generation = state.next_generation;
        Some(self.slot(&state, index, generation))
    }

    fn slot(&self, state: &PoolState, index: usize, generation: u32) -> Slot {
        self.slot_in(&state.slabs, index, generation)
    }

    fn slot_in(&self, slabs: &[Slab], index: usize, generation: u32) -> Slot {
        let per_slab = self.slots_per_slab();
        let slab = &slabs[index / per_slab];
        let within = index % per_slab;
        let (host_ptr, device_data) = match slab.data {
            Some(SlabData::Pinned(data)) => {
                // SAFETY: `within` < slots per slab: the slot lies inside the slab.
                (unsafe { data.host_ptr.add(within * self.slot_bytes) }, 0)
            }
            Some(SlabData::Device(base)) => {
                (std::ptr::null_mut(), base + (within * self.slot_bytes) as u64)
            }
            None => unreachable!("a slot of a slab given back is neither lent nor pending"),
        };
        Slot {
            class: self.class,
            device: self.memory,
            index,
            host_ptr,
            device_data,
            done_word: self.done_word_in(slabs, index),
            generation,
            prior: None,
        }
    }

    /// The done word of slot `index` (its slab's memory may have been given back).
    fn done_word_in(&self, slabs: &[Slab], index: usize) -> ReleaseWord {
        let per_slab = self.slots_per_slab();
        let words = slabs[index / per_slab].words;
        let within = index % per_slab;
        // SAFETY: `within` < slots per slab < 1024; words are 4-byte aligned in a
        // page-aligned region of 4096 bytes.
        let word_ptr = unsafe { words.host_ptr.cast::<u32>().add(within) };
        ReleaseWord { host_ptr: word_ptr, device_addr: words.device_addr + 4 * within as u64 }
    }

    /// Moves pending slots whose copy has run to the free list: each stream's oldest
    /// first, up to the first whose copy has not run (its stream runs its copies in order,
    /// so the later ones have not either, but for a write's slot, which is retired when
    /// its op ends and may be behind a later op's: it waits for that op's copy). One done
    /// word per stream with slots pending plus one per slot moved: a take costs the same
    /// with 16 or 4096 slots in flight (a scan of every pending slot cost the H200's
    /// submitting thread up to 16 µs per 4 KiB op, and 16 % of its CPU on the cpu device).
    fn reclaim(&self, state: &mut PoolState) {
        let PoolState { slabs, free, pending, .. } = state;
        #[cfg(test)]
        let mut read = 0;
        pending.retain_mut(|stream| {
            while let Some(&(slot, generation)) = stream.slots.front() {
                #[cfg(test)]
                {
                    read += 1;
                }
                if self.done_word_in(slabs, slot).load() != generation {
                    break;
                }
                stream.slots.pop_front();
                free.push(slot);
            }
            !stream.slots.is_empty()
        });
        #[cfg(test)]
        {
            state.done_words_read += read;
        }
    }

    /// Allocates one more slab with the lock let go: a pinned allocation may wait (on
    /// CUDA, for as long as a `cuStreamCreate` of the application waits for streams our
    /// ops hold), and the threads that hand slots back (executors, the arm poller) must
    /// never wait for it (README, Known limits). Returns the lock, taken again.
    fn grow<'a>(&'a self, mut state: MutexGuard<'a, PoolState>) -> MutexGuard<'a, PoolState> {
        state.growing += 1;
        // A slab whose memory was given back gets new memory (its done words stayed).
        let refill = state.given_back.pop();
        drop(state);
        let allocated = match refill {
            Some(index) => self.allocate_data().map(|data| Grown::Refilled(index, data)),
            None => self.allocate_slab().map(Grown::New),
        };
        let mut state = self.lock();
        state.growing -= 1;
        match allocated {
            Ok(grown) => {
                if let Some(signal) = &self.grown {
                    signal.note_grown();
                }
                let index = match grown {
                    Grown::Refilled(index, data) => {
                        state.slabs[index].data = Some(data);
                        index
                    }
                    Grown::New(slab) => {
                        state.slabs.push(slab);
                        state.slabs.len() - 1
                    }
                };
                let per_slab = self.slots_per_slab();
                let first = index * per_slab;
                state.free.extend((first..first + per_slab).rev());
            }
            Err(error) => {
                state.given_back.extend(refill);
                if let Some(budget) = &self.budget {
                    budget.release(self.slab_bytes());
                }
                // Reads past device slots take pinned ones (`try_take_for_read`); past
                // pinned ones, the engine's path.
                let (memory, then) = if self.memory.is_some() {
                    ("engine device", "pinned slots")
                } else {
                    ("pinned", "the engine's path")
                };
                log::info!(
                    "read staging slots: no more {memory} memory ({error}); reads take {then}"
                );
                state.alloc_failed = true;
            }
        }
        state
    }

    /// A slab of pinned memory (or the engine's device memory) and its page of done words
    /// (pinned, zeroed).
    fn allocate_slab(&self) -> Result<Slab, crate::device::DeviceError> {
        let data = self.allocate_data()?;
        let words = match self.device.alloc_pinned(4096) {
            Ok(words) => words,
            Err(error) => {
                // SAFETY: allocated just above, never used.
                unsafe { self.free_data(data) };
                return Err(error);
            }
        };
        // SAFETY: a fresh page of pinned memory, not yet shared.
        unsafe { words.host_ptr.write_bytes(0, 4096) };
        Ok(Slab { data: Some(data), words })
    }

    /// A slab's bytes: pinned memory, or the engine's device memory.
    fn allocate_data(&self) -> Result<SlabData, crate::device::DeviceError> {
        crate::device::injected_fault(crate::fault::Site::PinnedAlloc).and_then(|()| {
            match self.memory {
                None => self.device.alloc_pinned(self.slab_bytes()).map(SlabData::Pinned),
                Some(ordinal) => self
                    .device
                    .alloc_engine_device(ordinal, self.slab_bytes())
                    .map(SlabData::Device),
            }
        })
    }

    /// With device memory: when no slot of this size was asked for during `idle` (before
    /// `now`), gives back the memory of every slab whose slots are all free (their
    /// streams' copies have run) and returns how many bytes. Their done words stay (freeing
    /// pinned memory waits for held streams on CUDA; freeing device memory does not,
    /// measured on the H100: README, Known limits); the size grows again on demand.
    fn give_back_idle(&self, idle: Duration, now: Instant) -> usize {
        if self.memory.is_none() {
            return 0;
        }
        let mut state = self.lock();
        let quiet =
            state.last_asked.is_none_or(|asked| now.saturating_duration_since(asked) >= idle);
        if !quiet || state.growing > 0 {
            return 0;
        }
        self.reclaim(&mut state);
        let per_slab = self.slots_per_slab();
        let mut free_slots = vec![0; state.slabs.len()];
        for &slot in &state.free {
            free_slots[slot / per_slab] += 1;
        }
        let idle_slab = |slab: usize| free_slots[slab] == per_slab;
        state.free.retain(|&slot| !idle_slab(slot / per_slab));
        let mut given_back = Vec::new();
        for (index, slab) in state.slabs.iter_mut().enumerate() {
            if idle_slab(index)
                && let Some(data) = slab.data.take()
            {
                given_back.push((index, data));
            }
        }
        state.given_back.extend(given_back.iter().map(|&(index, _)| index));
        if !given_back.is_empty() {
            // Memory freed: an allocation that failed before may succeed now.
            state.alloc_failed = false;
        }
        drop(state);
        // Freed with the lock let go; the slots are in no list, so none is lent meanwhile.
        let bytes = given_back.len() * self.slab_bytes();
        for (_, data) in given_back {
            // SAFETY: from this class's allocations; every slot of the slab was free (no
            // copy uses it) and none can be lent now.
            unsafe { self.free_data(data) };
        }
        if let Some(budget) = &self.budget {
            budget.release(bytes);
        }
        bytes
    }
}

/// What [`SlotClass::grow`] allocated.
enum Grown {
    /// New memory for a slab whose memory was given back.
    Refilled(usize, SlabData),
    New(Slab),
}

impl Drop for SlotPool {
    /// Spares go back to their size's pending list first, so that a slab a stream may
    /// still copy out of is leaked, not freed (`SlotClass`'s drop).
    fn drop(&mut self) {
        let mut spares = std::mem::take(self.spares.get_mut().unwrap_or_else(|p| p.into_inner()));
        self.take_back_spares(&mut spares, true);
    }
}

impl SlotClass {
    /// Frees a slab's bytes.
    ///
    /// # Safety
    /// `data` came from [`SlotClass::allocate_slab`] of this class, is freed once, and no
    /// copy still uses it.
    unsafe fn free_data(&self, data: SlabData) {
        match (data, self.memory) {
            // SAFETY: the caller's contract.
            (SlabData::Pinned(region), _) => unsafe { self.device.free_pinned(region) },
            // SAFETY: the caller's contract (allocated on this class's device).
            (SlabData::Device(addr), Some(ordinal)) => unsafe {
                self.device.free_engine_device(ordinal, addr)
            },
            (SlabData::Device(_), None) => unreachable!("a pinned class holds pinned slabs"),
        }
    }
}

impl Drop for SlotClass {
    fn drop(&mut self) {
        let per_slab = self.slots_per_slab();
        let mut state =
            std::mem::take(&mut *self.state.get_mut().unwrap_or_else(|p| p.into_inner()));
        let pending = std::mem::take(&mut state.pending);
        let mut busy = vec![false; state.slabs.len()];
        for (slot, generation) in pending.into_iter().flat_map(|stream| stream.slots) {
            if self.done_word_in(&state.slabs, slot).load() != generation {
                busy[slot / per_slab] = true;
            }
        }
        let slabs = std::mem::take(&mut state.slabs);
        for (slab, busy) in slabs.into_iter().zip(busy) {
            if busy {
                log::warn!(
                    "a read staging slab is leaked: a stream has not yet run its copy out of it"
                );
                continue;
            }
            // SAFETY: from this class's allocations on this device; no copy still reads it.
            unsafe {
                if let Some(data) = slab.data {
                    self.free_data(data);
                }
                self.device.free_pinned(slab.words);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::cpu::CpuDevice;

    fn pool() -> SlotPool {
        let device: Arc<dyn Device> = CpuDevice::new(1);
        SlotPool::new(device, false, LARGE_CAP_BYTES, MAX_SLOT_BYTES)
    }

    /// The large sizes' cap in these tests (the default of `HIPFILE_STREAM_COPY_MB`).
    const LARGE_CAP_BYTES: usize = 64 << 20;

    fn class_cap_bytes(slot_bytes: usize) -> usize {
        if slot_bytes <= SLOT_BYTES { SMALL_CLASS_CAP_BYTES } else { LARGE_CAP_BYTES }
    }

    #[test]
    fn a_read_takes_the_smallest_slot_that_holds_it_and_none_past_the_largest() {
        let pool = pool();
        let sizes = [
            (1, 0),
            (4096, 0),
            (4097, 1),
            (16 * 1024, 1),
            (SLOT_BYTES, 2),
            (SLOT_BYTES + 1, 3),
            (1 << 20, 4),
            (3 << 20, 5),
            (MAX_SLOT_BYTES, 6),
        ];
        for (len, class) in sizes {
            let slot = pool.try_take(len).expect("a slot");
            assert_eq!(slot.class, class, "{len} bytes");
            // The slot's bytes are all writable pinned memory (the cpu device guards
            // every allocation with inaccessible pages).
            // SAFETY: the slot holds at least `len` bytes and is ours until given back.
            unsafe { slot.host_ptr.write_bytes(0xa5, len) };
            pool.give_back(&slot);
        }
        assert!(pool.try_take(MAX_SLOT_BYTES + 1).is_none());
    }

    /// A read's slot for stream 0, never shared (these tests' pools do not share).
    fn read_slot(pool: &SlotPool, len_bytes: usize, device_ordinal: u32) -> Option<Slot> {
        let (slot, shared) = pool.try_take_for_read(len_bytes, device_ordinal, StreamKey(0))?;
        assert!(!shared, "a pool that does not share lent a shared slot");
        Some(slot)
    }

    /// Two cpu devices and a pool with device slots: pinned sizes up to 32 MiB each, each
    /// device's slots up to `device_cap_bytes`.
    fn two_device_pool(device_cap_bytes: usize) -> (Arc<CpuDevice>, Arc<dyn Device>, SlotPool) {
        two_device_pool_sharing(device_cap_bytes, false)
    }

    fn two_device_pool_sharing(
        device_cap_bytes: usize,
        share_when_full: bool,
    ) -> (Arc<CpuDevice>, Arc<dyn Device>, SlotPool) {
        let cpu = CpuDevice::new(2);
        let device: Arc<dyn Device> = cpu.clone();
        let pool = SlotPool::with_memory(
            Arc::clone(&device),
            true,
            32 << 20,
            MAX_SLOT_BYTES,
            Some(device_cap_bytes),
            share_when_full,
        );
        (cpu, device, pool)
    }

    /// `HIPFILE_STREAM_COPY_DEVICE_FULL=share`: with the device's slots all taken, a read
    /// shares the oldest slot of its own stream whose copy is queued (never another
    /// stream's, never one still held by an op), with a new generation; given back unused,
    /// a shared slot waits for its earlier use's copy again instead of being lent; once that
    /// copy ran, the slot is lent as a free one. A stream with no such slot gets a pinned one.
    #[test]
    fn a_read_past_the_cap_shares_its_own_streams_queued_slot() {
        let (cpu, _, pool) = two_device_pool_sharing(32 << 20, true);
        let (a, b) = (StreamKey(1), StreamKey(2));
        let take = |stream| pool.try_take_for_read(MAX_SLOT_BYTES, 0, stream).expect("a slot");
        let (first, shared) = take(a);
        assert!(first.device_memory().is_some() && !shared);
        let (held, shared) = take(b);
        assert!(held.device_memory().is_some() && !shared, "the cap: two 16 MiB slots");
        pool.retire(&first, a);
        // Stream b holds its slot (no copy queued): b's next read finds nothing to share.
        let (pinned, shared) = take(b);
        assert!(pinned.device_memory().is_none() && !shared, "b: pinned");
        // Stream a's copy out of `first` has not run: a's next read shares it.
        let (second, shared) = take(a);
        assert!(shared, "a shares its queued slot");
        assert_eq!(second.device_memory(), first.device_memory(), "the same memory");
        assert_ne!(second.generation, first.generation, "a use of its own");
        assert_eq!(pool.reads_sharing_device_slots(), 1);
        assert_eq!(pool.reads_past_device_slots(), 2);
        // Given back unused (its op ended before enqueueing its copy), it waits again for
        // the first use's copy: b cannot have it, a can share it again.
        pool.give_back(&second);
        let (pinned_too, shared) = take(b);
        assert!(pinned_too.device_memory().is_none() && !shared, "not lent to another stream");
        let (third, shared) = take(a);
        assert!(shared && third.device_memory() == first.device_memory());
        pool.retire(&third, a);
        // The stream ran both copies: the slot is free again, for any stream.
        third.done_word.store(third.generation);
        let (free, shared) = take(b);
        assert!(!shared && free.device_memory() == first.device_memory(), "lent as a free slot");
        for slot in [&held, &pinned, &pinned_too, &free] {
            pool.give_back(slot);
        }
        drop(pool);
        assert_eq!(cpu.stats().invalid_releases, 0, "every slab freed as allocated");
    }

    /// Without `share`, a read past the cap never takes its stream's queued slot.
    #[test]
    fn without_sharing_a_read_past_the_cap_takes_a_pinned_slot() {
        let (_, _, pool) = two_device_pool(16 << 20);
        let stream = StreamKey(1);
        let (slot, _) = pool.try_take_for_read(MAX_SLOT_BYTES, 0, stream).expect("device");
        pool.retire(&slot, stream);
        let (past, shared) = pool.try_take_for_read(MAX_SLOT_BYTES, 0, stream).expect("pinned");
        assert!(!shared && past.device_memory().is_none());
        assert_eq!((pool.reads_past_device_slots(), pool.reads_sharing_device_slots()), (1, 0));
        pool.give_back(&past);
    }

    /// With device slots: reads over 64 KiB take slots of the engine's device memory on the
    /// read's device (a distinct range per slot, up to the device's cap, then pinned ones),
    /// reads of at most 64 KiB and every other take pinned slots; a slot given back is lent
    /// again; without device slots no read gets one.
    #[test]
    fn with_device_slots_large_reads_take_device_memory_of_their_device() {
        let (cpu, device, pool) = two_device_pool(32 << 20);
        let small = read_slot(&pool, SLOT_BYTES, 1).expect("small");
        assert!(small.device_memory().is_none() && !small.host_ptr.is_null(), "64 KiB: pinned");
        let write = pool.try_take(1 << 20).expect("write");
        assert!(write.device_memory().is_none(), "try_take: pinned");
        let mut taken = Vec::new();
        for ordinal in [0, 1] {
            // 32 MiB of device slots per device: two of 16 MiB, then pinned ones.
            for _ in 0..2 {
                let slot = read_slot(&pool, MAX_SLOT_BYTES, ordinal).expect("slot");
                let addr = slot.device_memory().expect("device memory");
                assert!(slot.host_ptr.is_null());
                let info = device.pointer_info(addr).expect("tracked");
                assert_eq!(info.device_ordinal, ordinal, "on the read's device");
                taken.push(slot);
            }
        }
        let mut ranges: Vec<u64> = taken.iter().filter_map(Slot::device_memory).collect();
        ranges.sort_unstable();
        assert!(ranges.windows(2).all(|w| w[1] - w[0] >= MAX_SLOT_BYTES as u64), "distinct");
        let past_cap = read_slot(&pool, MAX_SLOT_BYTES, 0).expect("a pinned one");
        assert!(past_cap.device_memory().is_none(), "past the device cap: pinned");
        pool.give_back(&taken[0]);
        let again = read_slot(&pool, MAX_SLOT_BYTES, 0).expect("given back");
        assert_eq!(again.device_memory(), taken[0].device_memory(), "lent again");
        let plain = SlotPool::with_memory(device, true, 32 << 20, MAX_SLOT_BYTES, None, false);
        let slot = read_slot(&plain, MAX_SLOT_BYTES, 0).expect("slot");
        assert!(slot.device_memory().is_none(), "device slots off");
        for slot in [small, write, past_cap, again].iter().chain(&taken[1..]) {
            pool.give_back(slot);
        }
        plain.give_back(&slot);
        drop((pool, plain));
        assert_eq!(cpu.stats().invalid_releases, 0, "every slab freed as allocated");
    }

    /// The device cap bounds all sizes of one device together, not the other device's;
    /// past it reads take pinned slots.
    #[test]
    fn device_slots_of_all_sizes_share_their_devices_cap() {
        // Each device up to 40 MiB of device slots.
        let (cpu, _, pool) = two_device_pool(40 << 20);
        let mut taken = Vec::new();
        let mut take = |len_bytes: usize, ordinal: u32| {
            let slot = read_slot(&pool, len_bytes, ordinal).expect("a slot");
            let on_device = slot.device_memory().is_some();
            taken.push(slot);
            on_device
        };
        assert!(take(MAX_SLOT_BYTES, 0) && take(MAX_SLOT_BYTES, 0), "32 MiB of 16 MiB slots");
        assert!(!take(MAX_SLOT_BYTES, 0), "48 MiB would pass the cap: pinned");
        assert!(take(4 << 20, 0) && take(4 << 20, 0), "40 MiB on device 0");
        assert!(!take(4 << 20, 0) && !take(1 << 20, 0), "device 0's cap reached: pinned");
        assert!(take(4 << 20, 1) && take(MAX_SLOT_BYTES, 1), "device 1 has its own cap");
        assert_eq!(pool.reads_past_device_slots(), 3, "the reads that took pinned slots");
        assert!(!take(SLOT_BYTES, 0), "64 KiB: pinned by size");
        assert_eq!(pool.reads_past_device_slots(), 3, "a small read never wants device memory");
        for slot in &taken {
            pool.give_back(slot);
        }
        let device_bytes: usize = (0..2)
            .map(|ordinal| {
                pool.device_classes[ordinal]
                    .iter()
                    .map(|class| {
                        class.budget.as_ref().expect("budget").used_bytes.load(Ordering::Relaxed)
                    })
                    .max()
                    .unwrap_or(0)
            })
            .sum();
        assert_eq!(device_bytes, (40 << 20) + (20 << 20), "what each device's slots hold");
        drop(pool);
        assert_eq!(cpu.stats().invalid_releases, 0, "every slab freed as allocated");
    }

    /// Device memory of a size no read asked for during the idle time goes back, slab by
    /// slab, once every slot of the slab is free (lent ones and ones whose stream has not
    /// copied out of them keep theirs); the size grows again on demand, in the same slabs;
    /// pinned slots keep their memory.
    #[test]
    fn idle_device_slots_give_their_memory_back_and_grow_again() {
        let (cpu, _, pool) = two_device_pool(64 << 20);
        let large = read_slot(&pool, MAX_SLOT_BYTES, 0).expect("16 MiB");
        // 256 KiB slots: four to a 1 MiB slab.
        let quarters: Vec<Slot> =
            (0..4).map(|_| read_slot(&pool, 256 * 1024, 0).expect("256 KiB")).collect();
        let on_device_1 = read_slot(&pool, 4 << 20, 1).expect("4 MiB");
        let pinned = read_slot(&pool, SLOT_BYTES, 0).expect("pinned");
        assert!(quarters.iter().all(|slot| slot.device_memory().is_some()));
        assert_eq!(pool.device_bytes_held(), (16 << 20) + (1 << 20) + (4 << 20));
        assert_eq!(pool.give_back_idle(Duration::ZERO), 0, "every slot lent");
        pool.give_back(&large);
        assert_eq!(pool.give_back_idle(Duration::from_secs(3600)), 0, "asked for just now");
        assert_eq!(pool.give_back_idle(Duration::ZERO), 16 << 20, "the 16 MiB slab");
        // Three of the four quarters free, one retired but not yet copied out of.
        for slot in &quarters[..3] {
            pool.give_back(slot);
        }
        pool.retire(&quarters[3], StreamKey(1));
        assert_eq!(pool.give_back_idle(Duration::ZERO), 0, "a stream still copies out of it");
        stream_copied(&quarters[3]);
        assert_eq!(pool.give_back_idle(Duration::ZERO), 1 << 20, "the whole slab, copied");
        pool.give_back(&on_device_1);
        pool.give_back(&pinned);
        assert_eq!(pool.give_back_idle(Duration::ZERO), 4 << 20, "device 1's too");
        assert_eq!(pool.device_bytes_held(), 0);
        // None of the given-back slots is lent; new reads get memory again, in the slabs
        // of before (their done words kept), up to the cap as before.
        let again = read_slot(&pool, MAX_SLOT_BYTES, 0).expect("16 MiB again");
        assert!(again.device_memory().is_some());
        assert_eq!(again.index, large.index, "the same slab, new memory");
        assert!(again.generation > large.generation);
        let classes = &pool.device_classes[0];
        assert_eq!(classes[MAX_SLOT_CLASS].lock().slabs.len(), 1);
        let more: Vec<Slot> =
            (0..3).map(|_| read_slot(&pool, MAX_SLOT_BYTES, 0).expect("slot")).collect();
        assert!(more.iter().all(|slot| slot.device_memory().is_some()), "64 MiB: the cap");
        let past = read_slot(&pool, MAX_SLOT_BYTES, 0).expect("pinned");
        assert!(past.device_memory().is_none(), "past the cap: pinned, as before");
        assert_eq!(pool.give_back_idle(Duration::ZERO), 0, "all lent");
        {
            let pinned = pool.classes[2].lock();
            assert!(pinned.slabs.len() == 1 && pinned.slabs[0].data.is_some(), "pinned: kept");
        }
        for slot in more.iter().chain([&again, &past]) {
            pool.give_back(slot);
        }
        drop(pool);
        assert_eq!(cpu.stats().invalid_releases, 0, "every slab freed once");
    }

    /// The idle-slots thread's signal: a wait ends on a growth (once per growth) or on
    /// stop; a sleep ends early on stop only.
    #[test]
    fn the_grow_signal_wakes_on_growth_and_ends_sleeps_on_stop() {
        let signal = Arc::new(GrowSignal::default());
        let waiter = {
            let signal = Arc::clone(&signal);
            std::thread::spawn(move || {
                let grown = signal.wait_grown();
                let started = Instant::now();
                let slept_whole = signal.sleep(Duration::from_secs(30));
                (grown, slept_whole, started.elapsed(), signal.wait_grown())
            })
        };
        std::thread::sleep(Duration::from_millis(20));
        signal.note_grown();
        std::thread::sleep(Duration::from_millis(50));
        signal.stop();
        let (grown, slept_whole, slept, after_stop) = waiter.join().expect("waiter");
        assert!(grown, "woken by the growth");
        assert!(!slept_whole && slept < Duration::from_secs(5), "the stop ended the sleep");
        assert!(!after_stop, "stopped: no more waiting");
        // A growth before the wait is not lost.
        let signal = GrowSignal::default();
        signal.note_grown();
        assert!(signal.wait_grown());
        assert!(signal.sleep(Duration::from_millis(1)), "a sleep without stop runs out");
    }

    /// Every slot of `slot_bytes` up to its size's cap; none past it.
    fn take_all(pool: &SlotPool, slot_bytes: usize) -> Vec<Slot> {
        let per_class = class_cap_bytes(slot_bytes) / slot_bytes;
        let taken: Vec<Slot> =
            (0..per_class).map(|_| pool.try_take(slot_bytes).expect("slot")).collect();
        assert!(pool.try_take(slot_bytes).is_none(), "no slot past the cap");
        taken
    }

    /// A ring is taken whole or not at all; a slot's next use is the same memory and
    /// done word with a new generation.
    #[test]
    fn a_ring_is_all_or_nothing_and_a_next_use_has_a_new_generation() {
        let device: Arc<dyn Device> = CpuDevice::new(1);
        let pool = SlotPool::new(device, true, 64 << 20, MAX_SLOT_BYTES);
        let held = pool.try_take(MAX_SLOT_BYTES).expect("slot");
        assert!(pool.try_take_ring(MAX_SLOT_BYTES, 4).is_none(), "three free, four asked");
        let ring = pool.try_take_ring(MAX_SLOT_BYTES, 3).expect("the three left");
        pool.give_back(&held);
        let again = pool.next_use(&ring[0]);
        assert_eq!(
            (again.host_ptr, again.done_word.host_ptr),
            (ring[0].host_ptr, ring[0].done_word.host_ptr)
        );
        assert_ne!(again.generation, ring[0].generation);
        assert!(pool.try_take(MAX_SLOT_BYTES).is_some(), "the slot given back");
        assert!(pool.try_take(MAX_SLOT_BYTES).is_none(), "the ring's are still out");
    }

    #[test]
    fn the_large_sizes_cap_is_the_one_given() {
        let device: Arc<dyn Device> = CpuDevice::new(1);
        let pool = SlotPool::new(device, true, 32 << 20, MAX_SLOT_BYTES);
        let taken: Vec<Slot> =
            (0..2).map(|_| pool.try_take(MAX_SLOT_BYTES).expect("slot")).collect();
        assert!(pool.try_take(MAX_SLOT_BYTES).is_none(), "two 16 MiB slots in 32 MiB");
        assert_eq!(
            (0..32).filter_map(|_| pool.try_take(1 << 20)).count(),
            32,
            "32 of 1 MiB in 32 MiB"
        );
        assert!(pool.try_take(1 << 20).is_none());
        for slot in &taken {
            pool.give_back(slot);
        }
    }

    #[test]
    fn large_slots_are_a_slab_each_up_to_their_cap() {
        let pool = pool();
        let taken = take_all(&pool, MAX_SLOT_BYTES);
        assert!(pool.try_take(SLOT_BYTES).is_some(), "each size has its own cap");
        for slot in &taken {
            pool.give_back(slot);
        }
        assert!(pool.try_take(MAX_SLOT_BYTES).is_some());
    }

    #[test]
    fn slots_run_out_at_the_cap_and_come_back_once_their_done_word_shows_their_use() {
        let pool = pool();
        let taken = take_all(&pool, SLOT_BYTES);
        // Distinct, non-overlapping memory and distinct generations.
        let mut starts: Vec<usize> = taken.iter().map(|s| s.host_ptr as usize).collect();
        starts.sort_unstable();
        assert!(starts.windows(2).all(|w| w[1] - w[0] >= SLOT_BYTES));
        // Retired on eight streams in turn (slot i on stream i mod 8).
        for (i, slot) in taken.iter().enumerate() {
            pool.retire(slot, StreamKey((i % 8) as u64));
        }
        assert!(pool.try_take(SLOT_BYTES).is_none(), "pending until the stream copied");
        // Stream 7's done write for its first slot: that slot, and only it, comes back.
        let done = taken[7];
        // SAFETY: the slot's live done word.
        unsafe { std::sync::atomic::AtomicU32::from_ptr(done.done_word.host_ptr) }
            .store(done.generation, std::sync::atomic::Ordering::Release);
        let again = pool.try_take(SLOT_BYTES).expect("the copied slot");
        assert_eq!(again.host_ptr, done.host_ptr);
        assert_ne!(again.generation, done.generation, "a new use, a new generation");
        assert!(pool.try_take(SLOT_BYTES).is_none());
        // Other sizes have their own slots.
        assert!(pool.try_take(4096).is_some());
    }

    /// Done words read by the reclaims of the size of `slot_bytes` so far.
    fn done_words_read(pool: &SlotPool, slot_bytes: usize) -> usize {
        let class = CLASS_BYTES.iter().position(|&bytes| slot_bytes <= bytes).expect("a size");
        pool.classes[class].lock().done_words_read
    }

    /// Every slot of `slot_bytes` taken and retired, `per_stream` on each stream in turn
    /// (stream `s` gets slots `s * per_stream ..`), in stream order.
    fn retire_all(pool: &SlotPool, slot_bytes: usize, per_stream: usize) -> Vec<Slot> {
        let taken = take_all(pool, slot_bytes);
        for (i, slot) in taken.iter().enumerate() {
            pool.retire(slot, StreamKey((i / per_stream) as u64));
        }
        taken
    }

    /// A take with nothing free reads one done word per stream that has slots pending,
    /// plus one per slot it moves, however many slots are pending (it used to read every
    /// pending slot's word on every take: 256 here, 4096 for 4 KiB slots).
    #[test]
    fn a_take_reads_one_done_word_per_stream_however_many_slots_are_pending() {
        let pool = pool();
        let taken = retire_all(&pool, SLOT_BYTES, 64);
        assert_eq!(taken.len(), 256);
        let before = done_words_read(&pool, SLOT_BYTES);
        assert!(pool.try_take(SLOT_BYTES).is_none());
        assert_eq!(done_words_read(&pool, SLOT_BYTES) - before, 4, "four streams, none copied");
        // Stream 0 copied its first ten slots: they come back, the eleventh stops the look.
        taken[..10].iter().for_each(stream_copied);
        let before = done_words_read(&pool, SLOT_BYTES);
        let again = pool.try_take(SLOT_BYTES).expect("a copied slot");
        assert!(taken[..10].iter().any(|slot| slot.host_ptr == again.host_ptr));
        assert_eq!(done_words_read(&pool, SLOT_BYTES) - before, 11 + 3);
        // The other nine are free now: no done word is read for them.
        let before = done_words_read(&pool, SLOT_BYTES);
        assert_eq!((0..9).filter_map(|_| pool.try_take(SLOT_BYTES)).count(), 9);
        assert_eq!(done_words_read(&pool, SLOT_BYTES), before);
        assert!(pool.try_take(SLOT_BYTES).is_none());
    }

    /// A stream that holds its slots (the application holds it) keeps only its own: the
    /// slots another stream copied since come back.
    #[test]
    fn a_held_stream_holds_back_only_its_own_slots() {
        let pool = pool();
        let taken = retire_all(&pool, SLOT_BYTES, 128);
        // Stream 0 (slots 0..128, retired first) is held; stream 1 copied its first two.
        taken[128..130].iter().for_each(stream_copied);
        let first = pool.try_take(SLOT_BYTES).expect("stream 1's");
        let second = pool.try_take(SLOT_BYTES).expect("stream 1's");
        let mut got = [first.host_ptr, second.host_ptr];
        got.sort_unstable();
        let mut copied = [taken[128].host_ptr, taken[129].host_ptr];
        copied.sort_unstable();
        assert_eq!(got, copied);
        assert!(pool.try_take(SLOT_BYTES).is_none());
    }

    /// A slot retired after a later one of its stream (a write's, retired when its op
    /// ends) comes back once the later one's copy has run too: never while a slot ahead
    /// of it on its stream is still pending, and never lost.
    #[test]
    fn a_slot_retired_out_of_stream_order_comes_back_with_the_one_ahead_of_it() {
        let pool = pool();
        let taken = take_all(&pool, SLOT_BYTES);
        let (write, read) = (taken[0], taken[1]);
        // The read (later on the stream) is retired first, when its copy is enqueued.
        pool.retire(&read, StreamKey(9));
        pool.retire(&write, StreamKey(9));
        stream_copied(&write);
        assert!(pool.try_take(SLOT_BYTES).is_none(), "behind the read's");
        stream_copied(&read);
        let mut got = [
            pool.try_take(SLOT_BYTES).expect("one").host_ptr,
            pool.try_take(SLOT_BYTES).expect("two").host_ptr,
        ];
        got.sort_unstable();
        let mut both = [write.host_ptr, read.host_ptr];
        both.sort_unstable();
        assert_eq!(got, both);
    }

    /// A stream state for the spare tests (its words are never used).
    fn stream() -> Arc<crate::stream::StreamState> {
        let unused = ReleaseWord { host_ptr: std::ptr::null_mut(), device_addr: 0 };
        Arc::new(crate::stream::StreamState::for_arm_tests(crate::arm::ArmQueue::new(unused)))
    }

    /// Marks `slot`'s use as copied by its stream (the done write).
    fn stream_copied(slot: &Slot) {
        // SAFETY: the slot's live done word.
        unsafe { std::sync::atomic::AtomicU32::from_ptr(slot.done_word.host_ptr) }
            .store(slot.generation, std::sync::atomic::Ordering::Release);
    }

    /// A stream keeps its spares (a ring of two slots of [`SPARE_BYTES`]; one where only
    /// one can be had); spares may take that size to twice its cap, no further.
    #[test]
    fn each_stream_keeps_its_spares_and_spares_stop_at_twice_the_cap() {
        let device: Arc<dyn Device> = CpuDevice::new(1);
        // A cap of 16 MiB: four slots of 4 MiB for ops, eight with spares.
        let pool = SlotPool::new(device, true, 16 << 20, MAX_SLOT_BYTES);
        let first = stream();
        let spare = pool.spare_for(&first).expect("spares");
        assert_eq!(spare.slots.len(), SPARE_RING);
        assert!(spare.slots.iter().all(|slot| slot.class == SPARE_CLASS));
        assert_eq!(CLASS_BYTES[SPARE_CLASS], SPARE_BYTES);
        let again = pool.spare_for(&first).expect("the same spares");
        assert!(Arc::ptr_eq(&spare, &again), "one ring per stream");
        let held: Vec<Slot> = (0..2).map(|_| pool.try_take(SPARE_BYTES).expect("slot")).collect();
        assert!(pool.try_take(SPARE_BYTES).is_none(), "the cap: two spares and two slots");
        let streams: Vec<_> = (0..2).map(|_| stream()).collect();
        for owner in &streams {
            let got = pool.spare_for(owner).expect("spares past the cap");
            assert_eq!(got.slots.len(), 2);
        }
        let late = stream();
        assert!(pool.spare_for(&late).is_none(), "none past twice the cap");
        assert!(pool.try_take(SPARE_BYTES).is_none(), "ops stay within the cap");
        // One slot free: a stream that finds only one takes a ring of one.
        pool.give_back(&held[0]);
        assert_eq!(pool.spare_for(&late).expect("one spare").slots.len(), 1);
        assert_eq!(pool.spares_lent(), 4);
    }

    /// Spares go back once their stream is gone and no op holds them: at once if never
    /// used, else each once its done word shows its last use; while an op holds them,
    /// they stay.
    #[test]
    fn spares_go_back_after_their_stream_their_ops_and_their_last_copies() {
        let device: Arc<dyn Device> = CpuDevice::new(1);
        // A cap of 8 MiB: two slots of 4 MiB, four with spares (two rings).
        let pool = SlotPool::new(device, true, 8 << 20, MAX_SLOT_BYTES);
        let unused_owner = stream();
        let unused = pool.spare_for(&unused_owner).expect("spares");
        let used_owner = stream();
        let used = pool.spare_for(&used_owner).expect("a second ring");
        assert!(pool.spare_for(&stream()).is_none(), "twice the cap");
        // A use of each slot queued on the second ring's stream; an op still holds it.
        let first_use = pool.next_use(&used.slots[0]);
        used.note_queued(0, first_use.generation);
        let second_use = pool.next_use(&used.slots[1]);
        used.note_queued(1, second_use.generation);
        drop(unused);
        drop(unused_owner);
        drop(used_owner);
        let third = stream();
        let spare = pool.spare_for(&third).expect("the never-used ring, back at once");
        assert_eq!(spare.slots.len(), 2);
        assert_eq!(pool.spares_lent(), 2, "the used ring stays listed: an op holds it");
        // The op lets go: each used slot is pending until its last use is copied.
        drop(used);
        let fourth = stream();
        assert!(pool.spare_for(&fourth).is_none(), "the used ring waits for its copies");
        stream_copied(&first_use);
        let one = pool.spare_for(&fourth).expect("the slot whose copy ran");
        assert_eq!(one.slots[0].host_ptr, first_use.host_ptr);
        assert_eq!(one.slots.len(), 1, "the other one's copy has not run");
        let fifth = stream();
        assert!(pool.spare_for(&fifth).is_none());
        stream_copied(&second_use);
        assert!(pool.spare_for(&fifth).is_some(), "back once its last copy ran");
    }

    /// A spare slot whose done write was refused is never lent again, and its stream
    /// takes no other spares (its ops take the engine's path).
    #[test]
    fn a_lost_spare_is_never_lent_again() {
        let device: Arc<dyn Device> = CpuDevice::new(1);
        let pool = SlotPool::new(device, true, 16 << 20, MAX_SLOT_BYTES);
        let owner = stream();
        let spare = pool.spare_for(&owner).expect("spares");
        spare.note_queued(0, 7);
        spare.note_lost(1);
        spare.note_queued(1, 9);
        drop(spare);
        assert!(pool.spare_for(&owner).is_none(), "the stream's spares are lost");
        drop(owner);
        assert!(pool.spare_for(&stream()).is_some(), "other streams take spares");
        assert_eq!(pool.spares_lent(), 1, "the lost ring is dropped with its stream");
    }
}
