//! Fixed-capacity bookkeeping: the ops in flight on one stream, in FIFO order, and the
//! unfinished writes of one file (the prefetch hazard check). Nothing here allocates: a
//! full table hands the item back.

use heapless::Deque;

/// Position of an op in its stream's submission order.
pub type Sequence = u64;

/// Ops submitted to one stream and not yet retired, in submission order.
///
/// Ops may *finish* out of order inside the engine (a prefetch), but they retire in
/// order: [`StreamFifo::retire_front`] pops only finished ops from the front.
#[derive(Debug)]
pub struct StreamFifo<T, const N: usize> {
    entries: Deque<(Sequence, T, bool), N>,
    next_sequence: Sequence,
}

impl<T, const N: usize> Default for StreamFifo<T, N> {
    fn default() -> Self {
        StreamFifo::new()
    }
}

impl<T, const N: usize> StreamFifo<T, N> {
    /// An empty queue.
    pub const fn new() -> Self {
        StreamFifo { entries: Deque::new(), next_sequence: 0 }
    }

    /// Appends an op and returns its sequence number.
    ///
    /// # Errors
    /// The queue is full: the op is handed back.
    pub fn push(&mut self, item: T) -> Result<Sequence, T> {
        let sequence = self.next_sequence;
        self.entries.push_back((sequence, item, false)).map_err(|(_, item, _)| item)?;
        self.next_sequence += 1;
        Ok(sequence)
    }

    /// Marks op `sequence` finished. Returns `false` when it is not in the queue.
    pub fn finish(&mut self, sequence: Sequence) -> bool {
        match self.entries.iter_mut().find(|(s, _, _)| *s == sequence) {
            Some(entry) => {
                entry.2 = true;
                true
            }
            None => false,
        }
    }

    /// Removes and returns the oldest op if it is finished.
    pub fn retire_front(&mut self) -> Option<(Sequence, T)> {
        match self.entries.front() {
            Some((_, _, true)) => self.entries.pop_front().map(|(s, item, _)| (s, item)),
            _ => None,
        }
    }

    /// The oldest op still in the queue.
    pub fn front(&self) -> Option<(Sequence, &T)> {
        self.entries.front().map(|(s, item, _)| (*s, item))
    }

    /// Ops in the queue, oldest first, with their sequence numbers and finished flags.
    pub fn iter(&self) -> impl Iterator<Item = (Sequence, &T, bool)> {
        self.entries.iter().map(|(s, item, done)| (*s, item, *done))
    }

    /// Number of ops in the queue.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// `true` when no op is in flight.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// `true` when [`StreamFifo::push`] would hand the op back.
    pub fn is_full(&self) -> bool {
        self.entries.is_full()
    }

    /// The capacity `N`.
    pub const fn capacity(&self) -> usize {
        N
    }
}

/// A half-open byte range of a file: `[start_bytes, end_bytes)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileRange {
    /// First byte.
    pub start_bytes: u64,
    /// One past the last byte.
    pub end_bytes: u64,
}

impl FileRange {
    /// `true` when the two ranges share at least one byte.
    pub const fn overlaps(&self, other: &FileRange) -> bool {
        self.start_bytes < other.end_bytes && other.start_bytes < self.end_bytes
    }
}

/// The unfinished writes of one file, so that a prefetching read never reads bytes an
/// earlier write has not written yet.
#[derive(Debug, Default)]
pub struct WriteHazards<const N: usize> {
    writes: heapless::Vec<(Sequence, FileRange), N>,
}

/// The answer of [`WriteHazards::may_prefetch`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefetchVerdict {
    /// No unfinished write overlaps: the read may start now.
    Clear,
    /// An unfinished write overlaps (or the table overflowed earlier): wait for order.
    Ordered,
}

impl<const N: usize> WriteHazards<N> {
    /// An empty table.
    pub const fn new() -> Self {
        WriteHazards { writes: heapless::Vec::new() }
    }

    /// Records an unfinished write.
    ///
    /// # Errors
    /// The table is full: the caller must stop prefetching on this file until writes
    /// drain (the range is handed back).
    pub fn insert(&mut self, id: Sequence, range: FileRange) -> Result<(), FileRange> {
        self.writes.push((id, range)).map_err(|(_, range)| range)
    }

    /// Forgets a finished write. Returns `false` when `id` was not recorded.
    pub fn remove(&mut self, id: Sequence) -> bool {
        match self.writes.iter().position(|(w, _)| *w == id) {
            Some(index) => {
                self.writes.swap_remove(index);
                true
            }
            None => false,
        }
    }

    /// Whether a read of `range` may start before the stream reaches it.
    pub fn may_prefetch(&self, range: &FileRange) -> PrefetchVerdict {
        if self.writes.iter().any(|(_, w)| w.overlaps(range)) {
            PrefetchVerdict::Ordered
        } else {
            PrefetchVerdict::Clear
        }
    }

    /// Number of unfinished writes recorded.
    pub fn len(&self) -> usize {
        self.writes.len()
    }

    /// `true` when no write is recorded.
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_hands_back_when_full() {
        let mut fifo: StreamFifo<u32, 2> = StreamFifo::new();
        assert_eq!(fifo.push(10), Ok(0));
        assert_eq!(fifo.push(11), Ok(1));
        assert!(fifo.is_full());
        assert_eq!(fifo.push(12), Err(12));
        assert_eq!(fifo.len(), 2);
    }

    #[test]
    fn fifo_retires_in_order_only() {
        let mut fifo: StreamFifo<&str, 4> = StreamFifo::new();
        let a = fifo.push("a").unwrap();
        let b = fifo.push("b").unwrap();
        assert!(fifo.finish(b));
        assert_eq!(fifo.retire_front(), None, "a is not finished");
        assert!(fifo.finish(a));
        assert_eq!(fifo.retire_front(), Some((a, "a")));
        assert_eq!(fifo.retire_front(), Some((b, "b")));
        assert!(fifo.is_empty());
        assert!(!fifo.finish(a), "already retired");
    }

    #[test]
    fn fifo_sequence_keeps_counting_after_retire() {
        let mut fifo: StreamFifo<(), 1> = StreamFifo::new();
        for expected in 0..5 {
            let s = fifo.push(()).unwrap();
            assert_eq!(s, expected);
            fifo.finish(s);
            fifo.retire_front().unwrap();
        }
        assert_eq!(fifo.capacity(), 1);
    }

    #[test]
    fn ranges_overlap_half_open() {
        let r = |start_bytes, end_bytes| FileRange { start_bytes, end_bytes };
        assert!(r(0, 10).overlaps(&r(9, 20)));
        assert!(!r(0, 10).overlaps(&r(10, 20)));
        assert!(!r(10, 20).overlaps(&r(0, 10)));
        assert!(r(5, 6).overlaps(&r(0, 100)));
    }

    #[test]
    fn hazards_block_overlapping_prefetch_until_removed() {
        let mut hazards: WriteHazards<2> = WriteHazards::new();
        let write = FileRange { start_bytes: 4096, end_bytes: 8192 };
        hazards.insert(7, write).unwrap();
        let read = FileRange { start_bytes: 0, end_bytes: 4097 };
        assert_eq!(hazards.may_prefetch(&read), PrefetchVerdict::Ordered);
        let apart = FileRange { start_bytes: 8192, end_bytes: 9000 };
        assert_eq!(hazards.may_prefetch(&apart), PrefetchVerdict::Clear);
        assert!(hazards.remove(7));
        assert_eq!(hazards.may_prefetch(&read), PrefetchVerdict::Clear);
        assert!(!hazards.remove(7));
    }

    #[test]
    fn hazards_hand_back_when_full() {
        let mut hazards: WriteHazards<1> = WriteHazards::new();
        let range = FileRange { start_bytes: 0, end_bytes: 1 };
        hazards.insert(1, range).unwrap();
        assert_eq!(hazards.insert(2, range), Err(range));
        assert_eq!(hazards.len(), 1);
    }
}
