//! Splitting a request into chunk-aligned parts over several executors, and joining
//! the parts' results into the request's.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use hipfile_core::{Direction, OpError, Outcome};

use super::part_results;
use crate::device::DeviceError;

/// How many executors one request may fan out to, of `parallel`: one for a write to a
/// file without an O_DIRECT descriptor (`file_has_direct`), whose bytes all go through
/// the page cache, where buffered writes to one file take its inode lock one at a time
/// (parts on several executors would only queue for it, with more calls per byte);
/// `parallel` otherwise.
pub(super) fn fan_out(direction: Direction, file_has_direct: bool, parallel: usize) -> usize {
    match direction {
        Direction::Write if !file_has_direct => 1,
        _ => parallel,
    }
}

/// How many executors a request fans out to under `HIPFILE_BUSY_FAN_OUT=least`, when
/// `idle` executors have no job in flight: those idle ones, at least `least` and at most
/// `most` (`HIPFILE_REQUEST_PARALLELISM`, capped by the executor count). A request that
/// finds the engine idle spreads as wide as before; one that finds every executor busy
/// goes as `least` parts, each of more chunks, so the chunks of one part overlap their
/// reads and copies inside one job instead of as many short jobs. The parts go to
/// the idle executors by name ([`place_parts`]).
///
/// Why: on the H200 (`benches/results/h200-2026-12-06-h/`) 2 MiB chunks, which halve
/// the parts of a 16 MiB op, read 16 streams 1.18x as fast and 1 stream 0.93x; the
/// engine's CPU per GiB followed the number of chunks and parts, not the bytes.
/// Measured with `least` 2 on an H100 (`benches/results/h100-2026-12-07-a/`): sync reads
/// from 16 threads 1.10-1.16x, but async streams 0.70x (1 stream) and 0.83x (8), whose
/// own earlier ops make the executors look busy; so it is off by default.
pub(super) fn fan_out_for_load(idle: usize, least: usize, most: usize) -> usize {
    let most = most.max(1);
    idle.clamp(least.clamp(1, most), most)
}

/// How many parts a queued request (an async op's, a batch entry's: no thread waits on
/// it alone) goes as under `HIPFILE_LOADED_FAN_OUT=cap`, of `parallel`, when `queued`
/// queued requests (this one not counted) are split and not finished on `executors`
/// executors: `parallel` while fewer than half as many as executors are, at most `cap`
/// from then on.
///
/// Why: every part costs the executors the same work (a job, its chunks' reads, copies,
/// events and polls) whatever its length, and with that many requests queued every
/// executor has work anyway, so a wide split only adds that work. On an H100
/// (`benches/results/h100-2026-12-07-b/`), 16 MiB hot reads from 8 async streams as 2
/// parts instead of 14 cost 0.22 instead of 0.36 CPU-s/GiB at the same speed. The same
/// split for every request lost half the speed of a lone stream (its few read-ahead ops
/// need every executor), and sync threads lose with it too (8 threads read 0.85x as 2
/// parts: 16 parts do not spread evenly over 14 executors, and each thread waits for
/// its request's slowest part), so sync requests neither count nor are capped.
pub(super) fn fan_out_under_load(
    parallel: usize,
    queued: usize,
    executors: usize,
    cap: usize,
) -> usize {
    if queued * 2 >= executors.max(1) { parallel.min(cap.max(1)) } else { parallel }
}

/// Who waits for a request: the thread that made it (a sync call), or nobody in
/// particular (it is queued: an async op's, a batch entry's; see [`fan_out_under_load`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Waiter {
    /// A sync call's thread waits for it.
    Caller,
    /// Queued: an async op, a batch entry.
    Queue,
}

/// A queued request counted in flight (for [`fan_out_under_load`]) from its split until
/// every holder of it is gone: its parts are over (their joiner dropped it).
#[derive(Debug)]
pub(crate) struct InFlight(Option<Arc<AtomicUsize>>);

impl InFlight {
    /// Counts one more request in `count`.
    pub(super) fn count(count: &Arc<AtomicUsize>) -> InFlight {
        count.fetch_add(1, Ordering::Relaxed);
        InFlight(Some(Arc::clone(count)))
    }

    /// Counted nowhere (a sync call's request).
    pub(super) fn uncounted() -> InFlight {
        InFlight(None)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(count) = &self.0 {
            count.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// A request's parts (`(offset in the request, length)` in order, from
/// [`Engine::parts`](crate::engine::Engine::parts)); a queued request counts in flight as
/// long as they are held.
#[derive(Debug)]
pub(crate) struct Parts {
    list: Vec<(u64, u64)>,
    /// Fewer parts than the executors could take, for the load: they go to the least
    /// loaded executors ([`place_parts`]), not to consecutive ones from the request's.
    placed_by_load: bool,
    _in_flight: InFlight,
}

impl Parts {
    pub(super) fn new(list: Vec<(u64, u64)>, placed_by_load: bool, in_flight: InFlight) -> Parts {
        Parts { list, placed_by_load, _in_flight: in_flight }
    }

    /// A range of `len_bytes` cut in consecutive pieces of `piece_bytes` (the last one
    /// shorter), not counted among the queued requests: the pieces of a write copied on
    /// its stream (`async_op::write_pieces`), each posted on its own.
    pub(crate) fn in_pieces(len_bytes: u64, piece_bytes: u64) -> Parts {
        let piece_bytes = piece_bytes.max(1);
        let list = (0..len_bytes.div_ceil(piece_bytes))
            .map(|index| {
                let offset = index * piece_bytes;
                (offset, piece_bytes.min(len_bytes - offset))
            })
            .collect();
        Parts::new(list, false, InFlight::uncounted())
    }

    /// Whether the parts go to the least loaded executors.
    pub(super) fn placed_by_load(&self) -> bool {
        self.placed_by_load
    }

    /// The parts in order.
    pub(crate) fn list(&self) -> &[(u64, u64)] {
        &self.list
    }

    /// How many parts.
    pub(crate) fn len(&self) -> usize {
        self.list.len()
    }
}

/// The executors `parts` parts of a request go to under `HIPFILE_BUSY_FAN_OUT`, given each
/// executor's `jobs_in_flight` and the request's `hint` (its stream's executor): the idle
/// executors first, then the least loaded, ties broken in ring order from the hint. Every
/// index is distinct while `parts` does not exceed the executor count (past it the ring
/// order repeats). Without busy fan-out the parts go to consecutive executors from the
/// hint, which spreads requests evenly when every executor is busy but may stack a
/// request's parts on busy executors while others sit idle.
pub(super) fn place_parts(jobs_in_flight: &[u64], hint: usize, parts: usize) -> Vec<usize> {
    let executors = jobs_in_flight.len();
    if executors == 0 {
        return vec![0; parts];
    }
    let mut order: Vec<usize> = (0..executors).map(|step| (hint + step) % executors).collect();
    // A stable sort keeps the ring order among executors of equal load.
    order.sort_by_key(|&index| jobs_in_flight[index]);
    order.iter().copied().cycle().take(parts).collect()
}

/// The largest unit a request splits into parts by: chunks bigger than this (`HIPFILE_CHUNK_KB`
/// above 1024) still split requests at 1 MiB boundaries, so a chunk size chosen for
/// fewer, longer reads and copies inside a part does not also cut how many executors a
/// lone request reaches (on the H200 2 MiB chunks that also split at 2 MiB read a lone
/// 16 MiB op on 8 executors instead of 14, 0.93x; `benches/results/h200-2026-12-06-h/`).
/// A part starting inside a chunk reads up to the chunk's end first, then whole chunks.
pub(super) const PART_GRANULE_BYTES: u64 = 1 << 20;

/// The unit requests split into parts by with chunks of `chunk_bytes`.
pub(super) fn part_granule(chunk_bytes: u64) -> u64 {
    chunk_bytes.clamp(1, PART_GRANULE_BYTES)
}

/// How many `chunk_bytes`-aligned chunks of the file `len_bytes` at `file_offset_bytes`
/// touch (the most parts it splits into).
pub(super) fn chunks_touched(file_offset_bytes: u64, len_bytes: u64, chunk_bytes: u64) -> u64 {
    (file_offset_bytes + len_bytes).div_ceil(chunk_bytes) - file_offset_bytes / chunk_bytes
}

/// Splits `len_bytes` at `file_offset_bytes` into at most `parallel` parts of whole
/// chunks (`chunk_bytes`-aligned in the file), as even as chunks allow: the first parts
/// get one chunk more than the rest. Returns `(offset in the request, length)` pairs in
/// order; one empty part for an empty request.
///
/// A 16 MiB request on 14 executors becomes 2 parts of 2 chunks and 12 of 1, so every
/// executor takes a share (not 8 parts of 2 MiB, as rounding one part size up to whole
/// chunks would give).
pub(super) fn split_into_parts(
    file_offset_bytes: u64,
    len_bytes: u64,
    chunk_bytes: u64,
    parallel: usize,
) -> Vec<(u64, u64)> {
    if len_bytes == 0 {
        return vec![(0, 0)];
    }
    let file_end = file_offset_bytes + len_bytes;
    let first_chunk = file_offset_bytes / chunk_bytes;
    let chunks = chunks_touched(file_offset_bytes, len_bytes, chunk_bytes);
    let parts = chunks.min(parallel.max(1) as u64);
    let (base, extra) = (chunks / parts, chunks % parts);
    // Offset in the request of the boundary after `index` chunks.
    let boundary = |index: u64| {
        ((first_chunk + index) * chunk_bytes).clamp(file_offset_bytes, file_end) - file_offset_bytes
    };
    let mut result = Vec::with_capacity(parts as usize);
    let mut chunk_index = 0;
    for part in 0..parts {
        let start = boundary(chunk_index);
        chunk_index += base + u64::from(part < extra);
        result.push((start, boundary(chunk_index) - start));
    }
    result
}

/// The result of a request split into `parts` (offset, length) from the results of its
/// parts in part order: the bytes up to the first short part; the first failure, except
/// that a write whose earlier parts wrote bytes reports them (as `pwrite` does when the
/// disk fills: a short count, the error only when nothing was written).
pub(crate) fn combine(
    direction: Direction,
    parts: &[(u64, u64)],
    results: &[(usize, Outcome, Option<DeviceError>)],
) -> (Outcome, Option<DeviceError>) {
    let mut total = 0;
    for (&(_, len), &(_, outcome, device_error)) in parts.iter().zip(results) {
        match outcome {
            Outcome::Bytes(n) => {
                total += n;
                if n < len {
                    return (Outcome::Bytes(total), None);
                }
            }
            Outcome::OsError(_) if direction == Direction::Write && total > 0 => {
                return (Outcome::Bytes(total), None);
            }
            failure => return (failure, device_error),
        }
    }
    if results.len() < parts.len() {
        return (Outcome::Library(OpError::InternalError), None);
    }
    (Outcome::Bytes(total), None)
}

/// One part's result.
pub(crate) type PartResult = (Outcome, Option<DeviceError>);

/// Joins the results of a request split over several executors ([`Engine::parts`](crate::engine::Engine::parts)).
pub(crate) struct PartJoiner {
    direction: Direction,
    /// Held until the joiner goes: the request counts in flight until then.
    parts: Parts,
    results: part_results::PartResults<PartResult>,
}

impl PartJoiner {
    /// A joiner for a request split into `parts`.
    pub(crate) fn new(direction: Direction, parts: Parts) -> PartJoiner {
        let results = part_results::PartResults::new(parts.len());
        PartJoiner { direction, parts, results }
    }

    /// The parts joined, in order.
    pub(crate) fn parts(&self) -> &[(u64, u64)] {
        self.parts.list()
    }

    /// Records part `index`; returns the combined result ([`combine`]) to the part that
    /// was the last.
    pub(crate) fn part_done(
        &self,
        index: usize,
        outcome: Outcome,
        device_error: Option<DeviceError>,
    ) -> Option<PartResult> {
        let all = self.results.record(index, (outcome, device_error))?;
        let in_order: Vec<(usize, Outcome, Option<DeviceError>)> =
            all.into_iter().enumerate().map(|(index, (o, e))| (index, o, e)).collect();
        Some(combine(self.direction, self.parts.list(), &in_order))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn only_writes_through_the_page_cache_stay_on_one_executor() {
        assert_eq!(fan_out(Direction::Write, false, 14), 1, "buffered write");
        assert_eq!(fan_out(Direction::Write, true, 14), 14, "O_DIRECT write");
        assert_eq!(fan_out(Direction::Read, false, 14), 14, "buffered read");
        assert_eq!(fan_out(Direction::Read, true, 14), 14, "O_DIRECT read");
        assert_eq!(fan_out(Direction::Write, false, 0), 1);
    }

    #[test]
    fn the_fan_out_follows_the_idle_executors_between_its_bounds() {
        assert_eq!(fan_out_for_load(14, 2, 14), 14, "an idle engine: every executor");
        assert_eq!(fan_out_for_load(5, 2, 14), 5, "the idle ones");
        assert_eq!(fan_out_for_load(0, 2, 14), 2, "all busy: the least");
        assert_eq!(fan_out_for_load(1, 2, 14), 2);
        assert_eq!(fan_out_for_load(14, 2, 4), 4, "never past HIPFILE_REQUEST_PARALLELISM");
        assert_eq!(fan_out_for_load(0, 8, 4), 4, "the least is capped by the most");
        assert_eq!(fan_out_for_load(0, 0, 14), 1, "at least one part");
        assert_eq!(fan_out_for_load(0, 3, 0), 1);
    }

    proptest! {
        #[test]
        fn placed_parts_are_distinct_and_never_pass_over_an_idler_executor(
            loads in proptest::collection::vec(0u64..4, 1..20),
            hint in 0usize..40,
            parts in 1usize..20,
        ) {
            let placed = place_parts(&loads, hint, parts);
            prop_assert_eq!(placed.len(), parts);
            let distinct: std::collections::HashSet<_> = placed.iter().collect();
            prop_assert_eq!(distinct.len(), parts.min(loads.len()));
            let used_load = placed.iter().map(|&i| loads[i]).max().unwrap();
            for (index, load) in loads.iter().enumerate() {
                if !placed.contains(&index) {
                    prop_assert!(*load >= used_load, "executor {} (load {}) passed over", index, load);
                }
            }
        }

        #[test]
        fn the_fan_out_stays_in_bounds(idle in 0usize..300, least in 0usize..300, most in 0usize..300) {
            let parallel = fan_out_for_load(idle, least, most);
            prop_assert!(parallel >= 1 && parallel <= most.max(1));
            prop_assert!(parallel >= least.clamp(1, most.max(1)));
            if (least.max(1)..=most).contains(&idle) {
                prop_assert_eq!(parallel, idle);
            }
        }
    }

    #[test]
    fn queued_requests_keep_every_part_until_half_the_executors_are_queued() {
        // 14 executors: 0..=6 queued before keep 14 parts, 7 and more go as the cap.
        for queued in 0..7 {
            assert_eq!(fan_out_under_load(14, queued, 14, 2), 14, "{queued} queued");
        }
        for queued in [7, 8, 30, 1000] {
            assert_eq!(fan_out_under_load(14, queued, 14, 2), 2, "{queued} queued");
        }
        // The cap never widens a request, and a cap of 0 still leaves one part.
        assert_eq!(fan_out_under_load(1, 50, 14, 4), 1);
        assert_eq!(fan_out_under_load(14, 50, 14, 0), 1);
        // One executor: any queued request is past half of it.
        assert_eq!(fan_out_under_load(1, 1, 1, 1), 1);
        assert_eq!(fan_out_under_load(1, 0, 1, 1), 1);
    }

    #[test]
    fn a_request_counts_in_flight_while_its_parts_are_held() {
        let count = Arc::new(AtomicUsize::new(0));
        let first = Parts::new(vec![(0, 1)], false, InFlight::count(&count));
        let joiner = Arc::new(PartJoiner::new(
            Direction::Read,
            Parts::new(vec![(0, 1), (1, 1)], true, InFlight::count(&count)),
        ));
        let uncounted = Parts::new(vec![(0, 1)], false, InFlight::uncounted());
        assert_eq!(count.load(Ordering::Relaxed), 2);
        assert_eq!(joiner.parts(), &[(0, 1), (1, 1)]);
        drop(first);
        drop(uncounted);
        assert_eq!(count.load(Ordering::Relaxed), 1);
        let held = Arc::clone(&joiner);
        assert!(joiner.part_done(0, Outcome::Bytes(1), None).is_none());
        drop(joiner);
        assert_eq!(count.load(Ordering::Relaxed), 1, "a part's holder still has it");
        assert_eq!(
            held.part_done(1, Outcome::Bytes(1), None).map(|r| r.0),
            Some(Outcome::Bytes(2))
        );
        drop(held);
        assert_eq!(count.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn chunks_touched_counts_partial_chunks_at_both_ends() {
        assert_eq!(chunks_touched(0, 16 * MIB, MIB), 16);
        assert_eq!(chunks_touched(MIB / 2, MIB, MIB), 2);
        assert_eq!(chunks_touched(MIB - 1, 2, MIB), 2);
        assert_eq!(chunks_touched(3 * MIB, 1, MIB), 1);
        assert_eq!(chunks_touched(3 * MIB, 0, MIB), 0);
    }

    #[test]
    fn busy_fan_out_parts_go_to_the_idle_executors_first() {
        let loads = [3, 0, 2, 0, 1, 0];
        assert_eq!(place_parts(&loads, 0, 3), vec![1, 3, 5], "the idle ones, from the hint");
        assert_eq!(place_parts(&loads, 4, 3), vec![5, 1, 3], "ring order from the hint");
        assert_eq!(place_parts(&loads, 0, 5), vec![1, 3, 5, 4, 2], "then the least loaded");
        assert_eq!(place_parts(&[0; 4], 2, 2), vec![2, 3], "an idle engine: from the hint");
        assert_eq!(place_parts(&[1, 1], 1, 3), vec![1, 0, 1], "more parts than executors");
        assert_eq!(place_parts(&[], 5, 2), vec![0, 0]);
    }

    #[test]
    fn a_16_mib_request_uses_every_executor_up_to_its_chunk_count() {
        let sizes = |parts: Vec<(u64, u64)>| -> Vec<u64> {
            parts.iter().map(|&(_, len)| len / MIB).collect()
        };
        let split = |parallel| sizes(split_into_parts(0, 16 * MIB, MIB, parallel));
        assert_eq!(split(16), vec![1; 16]);
        assert_eq!(split(14), [vec![2, 2], vec![1; 12]].concat());
        assert_eq!(split(12), [vec![2; 4], vec![1; 8]].concat());
        assert_eq!(split(8), vec![2; 8]);
        assert_eq!(split(32), vec![1; 16], "never more parts than chunks");
        assert_eq!(split(1), vec![16]);
    }

    #[test]
    fn chunks_past_1_mib_still_split_requests_at_1_mib() {
        assert_eq!(part_granule(256 << 10), 256 << 10);
        assert_eq!(part_granule(MIB), MIB);
        assert_eq!(part_granule(2 * MIB), MIB);
        assert_eq!(part_granule(64 * MIB), MIB);
        assert_eq!(split_into_parts(0, 16 * MIB, part_granule(2 * MIB), 14).len(), 14);
    }

    #[test]
    fn unaligned_requests_split_at_chunk_boundaries_of_the_file() {
        // 3.5 chunks starting half a chunk in: pieces 0.5 | 1 | 1 | 1 chunks.
        let parts = split_into_parts(MIB / 2, 7 * MIB / 2, MIB, 2);
        assert_eq!(parts, vec![(0, 3 * MIB / 2), (3 * MIB / 2, 2 * MIB)]);
        assert_eq!(split_into_parts(100, 10, MIB, 8), vec![(0, 10)], "inside one chunk");
        assert_eq!(split_into_parts(0, 0, MIB, 8), vec![(0, 0)]);
    }

    proptest! {
        #[test]
        fn parts_tile_the_request_in_whole_chunks(
            offset in 0u64..(1 << 40),
            len in 1u64..(1 << 30),
            chunk_shift in 12u32..24,
            parallel in 0usize..64,
        ) {
            let chunk = 1u64 << chunk_shift;
            let parts = split_into_parts(offset, len, chunk, parallel);
            prop_assert!(!parts.is_empty() && parts.len() <= parallel.max(1));
            let mut next = 0;
            let mut chunk_counts = Vec::new();
            for &(start, part_len) in &parts {
                prop_assert_eq!(start, next, "parts are contiguous, in order");
                prop_assert!(part_len > 0);
                let end = start + part_len;
                if end < len {
                    prop_assert_eq!((offset + end) % chunk, 0, "inner boundaries are chunk-aligned");
                }
                let first = (offset + start) / chunk;
                chunk_counts.push((offset + end).div_ceil(chunk) - first);
                next = end;
            }
            prop_assert_eq!(next, len, "parts cover the request");
            let (min, max) = (chunk_counts.iter().min(), chunk_counts.iter().max());
            prop_assert!(max.unwrap() - min.unwrap() <= 1, "balanced: {:?}", chunk_counts);
        }
    }

    #[test]
    fn combine_stops_at_the_first_short_part() {
        let parts = [(0, 10), (10, 10), (20, 10)];
        let results = [(0, Outcome::Bytes(10)), (1, Outcome::Bytes(4)), (2, Outcome::Bytes(10))]
            .map(|(i, o)| (i, o, None));
        assert_eq!(combine(Direction::Read, &parts, &results).0, Outcome::Bytes(14));
    }

    #[test]
    fn combine_reports_the_first_failure() {
        let parts = [(0, 10), (10, 10)];
        let results = [(0, Outcome::OsError(5), None), (1, Outcome::OsError(28), None)];
        assert_eq!(combine(Direction::Read, &parts, &results).0, Outcome::OsError(5));
    }
}
