//! Small fully FIXED reads staged ahead into a slot and copied on the user's own stream
//! (`runtime/src/async_op/slots.rs`, `stream_copy.rs`): the bytes, the counters, short
//! reads at the end of the file (the destination past them stays as it was), a write
//! that lands while the stream is held, the engine's path for larger reads and with the
//! feature off.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use hipfile_core::OpError;
use hipfile_runtime::AsyncParams;
use hipfile_runtime::config::{Config, DeviceSlotsFull, StreamCopies, StreamCopySlots};
use hipfile_runtime::file::DirectPolicy;

use super::paused::Paused;
use hipfile_test_support::rig::*;

/// A rig with stream copies on (`HIPFILE_STREAM_COPIES=on`; off by default), and reads
/// inside the submit call off (they would take these reads first: `inline_reads.rs`).
fn on() -> Rig {
    Rig::with(1, Config { stream_copies: StreamCopies::Idle, ..no_inline_reads() })
}

/// [`small_config`] with reads inside the submit call off.
fn no_inline_reads() -> Config {
    Config { inline_read_bytes: 0, ..small_config() }
}

fn read(t: &Paused, p: &Arc<AsyncParams>, stream: hipfile_runtime::device::StreamHandle) {
    t.rig.read(t.handle, t.buffer, p, stream);
}

fn stream_copies(rig: &Rig) -> u64 {
    rig.driver.async_stats().stream_copies.load(Ordering::SeqCst)
}

fn redone(rig: &Rig) -> u64 {
    rig.driver.async_stats().prefetches_redone.load(Ordering::SeqCst)
}

/// Reads of 1 B to 64 KiB at odd offsets into one buffer, each on its own idle stream, all
/// submitted before any stream is synchronized: each is copied on its stream; a read of
/// 64 KiB + 1 takes the engine's path. Every byte lands where it should and nothing else
/// is written.
#[test]
fn small_fixed_reads_are_copied_on_their_own_stream() {
    for flags in [7u32, 15] {
        let t = Paused::with(on(), "stream-copies", 2 * MIB, 2 * MIB);
        // Page-aligned inputs (flag 8) take page multiples; the last size of each list is
        // past the largest slot.
        let sizes: &[usize] = if flags & 8 != 0 {
            &[4096, 8192, 16 * KIB, 64 * KIB, 64 * KIB + 4096]
        } else {
            &[1, 4095, 4096, 5000, 16 * KIB, 16 * KIB + 1, 64 * KIB, 64 * KIB + 1]
        };
        let before = stream_copies(&t.rig);
        let placed = t.place_reads(flags, sizes, |_, _| {});
        t.check_placed_reads(&placed, &format!("flags {flags}"));
        let copied = stream_copies(&t.rig) - before;
        assert_eq!(copied, sizes.len() as u64 - 1, "flags {flags}: all but the last read");
    }
}

/// A read that comes back short at the end of the file publishes the bytes it read, and
/// the destination past them keeps what it held (the stream's copy writes it back); a
/// read at the end publishes 0 and changes nothing.
#[test]
fn a_short_read_at_the_end_of_the_file_keeps_the_rest_of_the_destination() {
    let file_len = 100_000;
    let t = Paused::with(on(), "stream-copies-eof", file_len, MIB);
    let stream = t.rig.registered_stream(7);
    let old = pattern(99, 64 * KIB);
    t.rig.set_dev_bytes(t.buffer, &old);
    let before = stream_copies(&t.rig);
    let tail = params(16 * KIB, (file_len - 5000) as i64, 0);
    let at_end = params(4096, file_len as i64, 32 * KIB as i64);
    read(&t, &tail, stream);
    t.rig.sync(stream);
    read(&t, &at_end, stream);
    t.rig.sync(stream);
    assert_eq!(bytes(&tail), 5000);
    assert_eq!(bytes(&at_end), 0);
    let got = t.rig.dev_bytes(t.buffer, 64 * KIB);
    assert_bytes(&got[..5000], &t.data[file_len - 5000..], "the bytes the file has");
    assert_bytes(&got[5000..], &old[5000..], "past them: as the destination was");
    assert_eq!(stream_copies(&t.rig) - before, 2, "both copied on the stream");
}

/// Under `all`, a read that reaches past the end of the file has its stream copy only the
/// bytes inside the file (as the file was when the read was submitted, at the file offset
/// it was submitted with): at the end of an unchanged file it needs no device call before
/// its release (no fill of its slot from the destination), and the destination past the
/// file keeps what it held. A file that grew or shrank by the time the stream reached the
/// read, or (on a stream that does not fix the file offset) a read bound to another
/// offset, makes the one device call that puts it right: the bytes past the copy into the
/// destination, or the destination's own bytes into the slot. On a registered stream
/// that fixes every parameter and on an unregistered one; every count and byte checked.
#[test]
fn with_all_a_read_past_the_end_of_the_file_copies_only_what_the_file_holds() {
    for flags in [7, 0] {
        read_past_the_end_of_the_file_copies_only_what_the_file_holds(flags);
    }
}

fn read_past_the_end_of_the_file_copies_only_what_the_file_holds(flags: u32) {
    let config = Config {
        stream_copies: StreamCopies::All,
        stream_copy_slots: StreamCopySlots::Pinned,
        ..no_inline_reads()
    };
    let rig = Rig::with(1, config);
    let Some(cpu) = rig.cpu_only("counts the cpu device's copy_now calls") else { return };
    let file_len = 100_000;
    let t = Paused::with(rig, "stream-copies-past-eof", file_len, MIB);
    let stream = t.rig.stream_with((flags != 0).then_some(flags));
    let old = pattern(98, MIB);
    t.rig.set_dev_bytes(t.buffer, &old);
    let now_copies = || cpu.stats().caller_copies;
    // (size, file offset, buffer offset): the file's last 1696 bytes in a page-aligned
    // 64 KiB read, a read at the end (0 bytes), one wholly past it (0 bytes), and one of
    // 256 KiB over the largest small slot.
    let reads = [
        (64 * KIB, 96 * KIB, 0),
        (4096, file_len, 128 * KIB),
        (4096, 2 * file_len, 192 * KIB),
        (256 * KIB, 16 * KIB, 256 * KIB),
    ];
    let gate = t.rig.pause(stream).expect("pause");
    let before = now_copies();
    let placed: Vec<_> = reads
        .iter()
        .map(|&(size, file_offset, at)| {
            let p = params(size, file_offset as i64, at as i64);
            read(&t, &p, stream);
            (p, size, file_offset, at)
        })
        .collect();
    assert_eq!(bytes(&placed[0].0), 0, "flags {flags}: held, nothing read yet");
    gate.release();
    t.rig.sync(stream);
    assert_eq!(now_copies() - before, 0, "flags {flags}: no device call before any release");
    let got = t.rig.dev_bytes(t.buffer, MIB);
    for (p, size, file_offset, at) in &placed {
        let inside = file_len.saturating_sub(*file_offset).min(*size);
        let what = format!("flags {flags}: {size} bytes at file offset {file_offset}");
        assert_eq!(bytes(p), inside as isize, "{what}");
        let from = (*file_offset).min(file_len);
        assert_bytes(&got[*at..at + inside], &t.data[from..from + inside], &what);
        let what = format!("flags {flags}: past the file, read at file offset {file_offset}");
        assert_bytes(&got[at + inside..at + size], &old[at + inside..at + size], &what);
    }

    // The file grows or shrinks while the stream is held, or (unregistered) the read is
    // bound to another file offset: the read gets what the file holds where it was bound,
    // the bytes its copy does not cover through one device call, and past that the
    // destination keeps what it held.
    use std::os::unix::fs::FileExt;
    let fd = t.file.open_rw();
    let (grown, shrunk) = (file_len + 20_000, 97 * KIB + 100);
    let appended = pattern(97, grown - file_len);
    // (file length while held, file offset as submitted, as bound, what)
    let mut cases =
        vec![(grown, 96 * KIB, 96 * KIB, "grown"), (shrunk, 96 * KIB, 96 * KIB, "shrunk")];
    if flags & 2 == 0 {
        cases.push((file_len, 96 * KIB, 16 * KIB, "bound inside the file"));
        cases.push((file_len, 16 * KIB, 96 * KIB, "bound past its end"));
    }
    for (new_len, submitted_at, bound_at, what) in cases {
        t.rig.set_dev_bytes(t.buffer, &old);
        let gate = t.rig.pause(stream).expect("pause");
        let p = params(64 * KIB, submitted_at as i64, 0);
        read(&t, &p, stream);
        p.file_offset_bytes.store(bound_at as i64, Ordering::SeqCst);
        let before = now_copies();
        if new_len > file_len {
            fd.write_all_at(&appended, file_len as u64).expect("append");
        } else if new_len < file_len {
            fd.set_len(new_len as u64).expect("truncate");
        }
        gate.release();
        t.rig.sync(stream);
        assert_eq!(now_copies() - before, 1, "flags {flags}, {what}: one device call");
        let inside = (new_len - bound_at).min(64 * KIB);
        assert_eq!(bytes(&p), inside as isize, "flags {flags}, {what}");
        let contents = t.file.contents();
        let got = t.rig.dev_bytes(t.buffer, 64 * KIB);
        let want = &contents[bound_at..bound_at + inside];
        assert_bytes(&got[..inside], want, &format!("flags {flags}, {what}"));
        let past = format!("flags {flags}, {what}: past the file");
        assert_bytes(&got[inside..], &old[inside..64 * KIB], &past);
        // Back to the file as it was for the next case.
        fd.set_len(file_len as u64).expect("restore");
        fd.write_all_at(&t.data[96 * KIB..file_len], (96 * KIB) as u64).expect("restore");
    }
}

/// The same through slots of the engine's device memory (the CUDA default for reads over
/// 64 KiB): a 256 KiB read reaching past the end of a file has its stream copy device →
/// device only the bytes inside the file; at the end of an unchanged file nothing else is
/// copied, and a file that grew or shrank while the stream was held costs one device →
/// device copy of exactly the difference (slot → destination, or destination → slot).
/// Every byte checked, the destination past the file kept.
#[test]
fn with_device_slots_a_read_past_the_end_of_the_file_copies_only_what_the_file_holds() {
    let config = Config {
        stream_copies: StreamCopies::All,
        stream_copy_slots: StreamCopySlots::Device,
        ..no_inline_reads()
    };
    let rig = Rig::with(1, config);
    let Some(cpu) = rig.cpu_only("counts the cpu device's device → device bytes") else {
        return;
    };
    let file_len = 300_000;
    let t = Paused::with(rig, "stream-copies-device-past-eof", file_len, MIB);
    let stream = t.rig.registered_stream(7);
    let old = pattern(94, MIB);
    let (size, file_offset) = (256 * KIB, 128 * KIB);
    let device_bytes = || cpu.stats().bytes_copied_other;
    use std::os::unix::fs::FileExt;
    let fd = t.file.open_rw();
    let appended = pattern(93, 30_000);
    // (file length while the stream is held, what)
    for (new_len, what) in
        [(file_len, "unchanged"), (file_len + 30_000, "grown"), (file_len - 50_000, "shrunk")]
    {
        t.rig.set_dev_bytes(t.buffer, &old);
        let gate = t.rig.pause(stream).expect("pause");
        let p = params(size, file_offset as i64, 0);
        read(&t, &p, stream);
        let before = device_bytes();
        match new_len.cmp(&file_len) {
            std::cmp::Ordering::Greater => {
                fd.write_all_at(&appended, file_len as u64).expect("append");
            }
            std::cmp::Ordering::Less => fd.set_len(new_len as u64).expect("truncate"),
            std::cmp::Ordering::Equal => {}
        }
        gate.release();
        t.rig.sync(stream);
        let (at_submit, inside) = (file_len - file_offset, new_len - file_offset);
        assert_eq!(bytes(&p), inside as isize, "{what}");
        let copied = (device_bytes() - before) as usize;
        assert_eq!(copied, at_submit + at_submit.abs_diff(inside), "{what}: device → device bytes");
        let contents = t.file.contents();
        let got = t.rig.dev_bytes(t.buffer, size);
        assert_bytes(&got[..inside], &contents[file_offset..new_len], what);
        assert_bytes(&got[inside..], &old[inside..size], &format!("{what}: past the file"));
        // Back to the file as it was for the next case.
        fd.set_len(file_len as u64).expect("restore");
        fd.write_all_at(&t.data[file_offset..file_len], file_offset as u64).expect("restore");
    }
}

/// The same for a long read (pieces sharing a ring of slots) and for one through its
/// stream's spare slots: each piece's copy covers only what the file holds, so a read of
/// 40 MiB over a file of 20 MiB + 12345 bytes makes no device call before its release, and
/// the destination past the file keeps what it held; on a stream that fixes every
/// parameter and on an unregistered one.
#[test]
fn with_all_a_long_read_past_the_end_of_the_file_copies_only_what_the_file_holds() {
    let spare_only = || Config { stream_copy_cap_bytes: 16 * MIB, ..all_config() };
    let cases = [
        (all_config(), "ring", Some(7)),
        (spare_only(), "spare", Some(7)),
        (all_config(), "ring, unregistered", None),
        (spare_only(), "spare, unregistered", None),
    ];
    for (config, what, flags) in cases {
        let rig = Rig::with(1, Config { inline_read_bytes: 0, ..config });
        let Some(cpu) = rig.cpu_only("counts the cpu device's copy_now calls") else { return };
        let (file_len, len) = (20 * MIB + 12_345, 40 * MIB);
        let t = Paused::with(rig, "stream-copies-long-past-eof", file_len, 2 * len);
        let stream = t.rig.stream_with(flags);
        let old = pattern(96, 2 * len);
        t.rig.set_dev_bytes(t.buffer, &old);
        let spares_before = t.rig.driver.async_stats().spare_ops.load(Ordering::SeqCst);
        let gate = t.rig.pause(stream).expect("pause");
        let before = cpu.stats().caller_copies;
        // In the spare case the first read holds the only 16 MiB slot, and the second
        // goes through the stream's spare slots.
        let (first, second) = (params(len, 0, 0), params(len, 0, len as i64));
        read(&t, &first, stream);
        read(&t, &second, stream);
        gate.release();
        t.rig.sync(stream);
        assert_eq!(cpu.stats().caller_copies - before, 0, "{what}: no device call");
        let spares = t.rig.driver.async_stats().spare_ops.load(Ordering::SeqCst) - spares_before;
        assert_eq!(spares > 0, what.starts_with("spare"), "{what}: through the spare slots");
        let got = t.rig.dev_bytes(t.buffer, 2 * len);
        for (p, at) in [(&first, 0), (&second, len)] {
            assert_eq!(bytes(p), file_len as isize, "{what}");
            assert_bytes(&got[at..at + file_len], &t.data, &format!("{what}: the file"));
            let past = &format!("{what}: past the file");
            assert_bytes(&got[at + file_len..at + len], &old[at + file_len..at + len], past);
        }
    }
}

/// A read staged while its stream is held, then the range rewritten through another
/// descriptor: when the stream reaches the read it gets what the file holds then (the
/// staged bytes are read again, once).
#[test]
fn a_staged_read_sees_a_rewrite_made_while_its_stream_was_held() {
    use std::os::unix::fs::FileExt;
    for round in 0..3u64 {
        let t = Paused::with(on(), "stream-copies-rewrite", MIB, MIB);
        let stream = t.rig.registered_stream(7);
        let gate = t.rig.pause(stream).expect("pause");
        let (copies_before, redone_before) = (stream_copies(&t.rig), redone(&t.rig));
        let read_before = t.rig.driver.file(t.handle).expect("file").counters().read_bytes();
        let n = 8 * KIB;
        let p = params(n, 4096, 0);
        read(&t, &p, stream);
        wait_until("the staged read", || {
            t.rig.driver.file(t.handle).expect("file").counters().read_bytes() - read_before
                == n as u64
        });
        assert_eq!(bytes(&p), 0, "published only when the stream reaches the op");
        let fresh = pattern(70 + round, n);
        let other = std::fs::OpenOptions::new().write(true).open(&t.file.path).expect("open");
        other.write_all_at(&fresh, 4096).expect("pwrite");
        gate.release();
        t.rig.sync(stream);
        assert_eq!(bytes(&p), n as isize, "round {round}");
        assert_bytes(&t.rig.dev_bytes(t.buffer, n), &fresh, &format!("round {round}"));
        assert_eq!(redone(&t.rig), redone_before + 1, "round {round}: read again");
        assert_eq!(stream_copies(&t.rig), copies_before + 1, "round {round}");
    }
}

/// Reads with parameters that are not all FIXED, and every read with stream copies off,
/// take the engine's path (and are right).
#[test]
fn unfixed_reads_and_the_switch_off_take_the_engines_path() {
    let off = || Rig::with(1, Config { stream_copies: StreamCopies::Off, ..small_config() });
    for (rig, flags) in [(on(), 0u32), (on(), 3), (off(), 7)] {
        let t = Paused::with(rig, "stream-copies-off", MIB, MIB);
        let stream = t.rig.registered_stream(flags);
        let before = stream_copies(&t.rig);
        let p = params(8 * KIB, 12_345, 0);
        read(&t, &p, stream);
        t.rig.sync(stream);
        assert_eq!(bytes(&p), 8 * KIB as isize);
        assert_bytes(
            &t.rig.dev_bytes(t.buffer, 8 * KIB),
            &t.data[12_345..12_345 + 8 * KIB],
            "data",
        );
        assert_eq!(stream_copies(&t.rig), before, "flags {flags}: not copied on the stream");
    }
}

/// Unset, stream copies are the backend's choice: `all` through device slots on CUDA
/// (where the engine's own path can meet the `cuStreamCreate` cycle), off on the cpu
/// device; a driver runs with the choice made, a setting given is kept, and a fully
/// FIXED 1 MiB read under the default is copied on its stream exactly where the choice
/// says so.
#[test]
fn unset_stream_copies_are_the_backends_choice() {
    let t = Paused::with(Rig::new(), "stream-copies-default", 4 * MIB, 2 * MIB);
    let config = t.rig.driver.config();
    let (copies, slots) = match t.rig.backend() {
        "cuda" => (StreamCopies::All, StreamCopySlots::Device),
        _ => (StreamCopies::Off, StreamCopySlots::Pinned),
    };
    assert_eq!((config.stream_copies, config.stream_copy_slots), (copies, slots), "resolved");
    let stream = t.rig.registered_stream(7);
    let before = stream_copies(&t.rig);
    let p = params(MIB, 3 * 4096, 0);
    read(&t, &p, stream);
    t.rig.sync(stream);
    assert_eq!(bytes(&p), MIB as isize);
    assert_bytes(&t.rig.dev_bytes(t.buffer, MIB), &t.data[3 * 4096..3 * 4096 + MIB], "data");
    let copied = stream_copies(&t.rig) - before;
    assert_eq!(copied, u64::from(copies == StreamCopies::All), "copied on its stream");
    // A setting given is kept, whatever the backend.
    let given = Config {
        stream_copies: StreamCopies::Idle,
        stream_copy_slots: StreamCopySlots::Pinned,
        ..small_config()
    };
    let kept = Rig::with(1, given).driver.config();
    assert_eq!(
        (kept.stream_copies, kept.stream_copy_slots),
        (StreamCopies::Idle, StreamCopySlots::Pinned)
    );
}

/// Thousands of small reads in flight on four streams, twice: every byte right; reads
/// submitted to an idle stream are copied on it, reads queued behind others take the
/// engine's path (more of them per second), and slots come back once the streams have
/// copied out of them.
#[test]
fn many_small_reads_on_several_streams_and_slots_come_back() {
    let t = Paused::with(on(), "stream-copies-many", 8 * MIB, 8 * MIB);
    let streams: Vec<_> = (0..4).map(|_| t.rig.registered_stream(7)).collect();
    let ops = 2048;
    let mut all = Vec::new();
    for round in 0..2 {
        let before = stream_copies(&t.rig);
        for i in 0..ops {
            let offset = ((i * 7919) % ops) * 4096;
            let p = params(4096, offset as i64, (i * 4096) as i64);
            read(&t, &p, streams[i % streams.len()]);
            all.push((p, offset, i * 4096));
        }
        for &stream in &streams {
            t.rig.sync(stream);
        }
        let got = t.rig.dev_bytes(t.buffer, ops * 4096);
        for (p, offset, at) in all.drain(..) {
            assert_eq!(bytes(&p), 4096);
            assert_bytes(
                &got[at..at + 4096],
                &t.data[offset..offset + 4096],
                &format!("round {round}"),
            );
        }
        let copied = stream_copies(&t.rig) - before;
        assert!(copied >= 1, "round {round}: the first read on an idle stream is copied on it");
        assert!(copied < ops as u64, "round {round}: reads queued behind take the engine");
    }
}

/// With io_uring off every executor is a blocking one: a read copied on its stream is
/// read straight into its slot there, and a short read still keeps the destination.
#[test]
fn blocking_executors_read_straight_into_the_slot() {
    let config =
        Config { stream_copies: StreamCopies::Idle, use_io_uring: false, ..no_inline_reads() };
    let file_len = 100_000;
    let t = Paused::with(Rig::with(1, config), "stream-copies-blocking", file_len, MIB);
    let stream = t.rig.registered_stream(7);
    let old = pattern(98, 32 * KIB);
    t.rig.set_dev_bytes(t.buffer, &old);
    let before = stream_copies(&t.rig);
    let whole = params(8 * KIB, 4096, 0);
    read(&t, &whole, stream);
    t.rig.sync(stream);
    let tail = params(16 * KIB, (file_len - 3000) as i64, 16 * KIB as i64);
    read(&t, &tail, stream);
    t.rig.sync(stream);
    assert_eq!(bytes(&whole), 8 * KIB as isize);
    assert_eq!(bytes(&tail), 3000);
    let got = t.rig.dev_bytes(t.buffer, 32 * KIB);
    assert_bytes(&got[..8 * KIB], &t.data[4096..4096 + 8 * KIB], "the whole read");
    assert_bytes(&got[8 * KIB..16 * KIB], &old[8 * KIB..16 * KIB], "between");
    assert_bytes(&got[16 * KIB..16 * KIB + 3000], &t.data[file_len - 3000..], "the tail");
    assert_bytes(&got[16 * KIB + 3000..], &old[16 * KIB + 3000..], "past the end of the file");
    assert_eq!(stream_copies(&t.rig) - before, 2);
    let blocking = t.rig.driver.engine().expect("engine").stats().blocking_jobs;
    assert!(blocking >= 2, "served by blocking executors: {blocking}");
}

/// A read submitted by a test: its parameters, size, bytes expected, file offset and
/// buffer offset.
type Placed = (Arc<AsyncParams>, usize, usize, usize, usize);

/// Submits `later` reads (size, file offset, bytes expected, stream) one after another
/// from buffer offset `at`, each 4 KiB past the one before; returns the offset past them.
fn submit_later(
    t: &Paused,
    later: &[(usize, usize, usize, hipfile_runtime::device::StreamHandle)],
    placed: &mut Vec<Placed>,
    mut at: usize,
) -> usize {
    for &(size, file_offset, want, stream) in later {
        let p = params(size, file_offset as i64, at as i64);
        read(t, &p, stream);
        placed.push((p, size, want, file_offset, at));
        at += size + 4096;
    }
    at
}

/// Checks every placed read: `*bytes_p`, the file's bytes where it read, and the
/// destination past them as it was (`old`).
fn check_placed(t: &Paused, placed: &[Placed], old: &[u8], end: usize) {
    let got = t.rig.dev_bytes(t.buffer, end);
    for (p, size, want, file_offset, at) in placed {
        assert_eq!(bytes(p), *want as isize, "{want} bytes at file offset {file_offset}");
        let what = format!("{want} bytes at file offset {file_offset}");
        assert_bytes(&got[*at..at + want], &t.data[*file_offset..file_offset + want], &what);
        let past = format!("{what}: the destination past the bytes read");
        assert_bytes(&got[at + want..at + size], &old[at + want..at + size], &past);
    }
}

/// `HIPFILE_STREAM_COPIES=all`: fully FIXED reads of up to 16 MiB are copied on their own
/// stream also behind ops in flight (all queued on one held stream), so their release is a
/// host write and needs no CUDA call — those inside the file staged at once, one reaching
/// past the end of the file read when the stream reaches it (short: the rest of its
/// destination stays as it was), one over 16 MiB in two pieces (`pieces`), and one on a
/// stream without FIXED flags whose parameters did not move before the stream reached
/// it. Every byte lands where it should.
#[test]
fn with_all_every_fixed_read_is_copied_on_its_stream() {
    let rig = Rig::with(
        1,
        Config {
            stream_copies: StreamCopies::All,
            stream_copy_slots: StreamCopySlots::Pinned,
            ..no_inline_reads()
        },
    );
    let file_len = 40 * MIB;
    let t = Paused::with(rig, "stream-copies-all", file_len, 40 * MIB);
    let old = pattern(97, 40 * MIB);
    t.rig.set_dev_bytes(t.buffer, &old);
    let fixed = t.rig.registered_stream(15);
    let plain = t.rig.registered_stream(0);
    let gate = t.rig.pause(fixed).expect("pause");
    let before = stream_copies(&t.rig);
    let read_before = t.rig.driver.file(t.handle).expect("file").counters().read_bytes();
    let preads = || t.rig.driver.engine().expect("engine").stats().host_memory_preads;
    let preads_before = preads();
    let sizes = [4096, 64 * KIB, 256 * KIB + 4096, MIB, 3 * MIB, 16 * MIB];
    let mut placed = Vec::new();
    let mut at = 0usize;
    for (i, &size) in sizes.iter().enumerate() {
        let file_offset = (i * 5 + 1) * 4096;
        let p = params(size, file_offset as i64, at as i64);
        read(&t, &p, fixed);
        placed.push((p, size, size, file_offset, at));
        at += size + 4096;
    }
    let staged: usize = sizes.iter().sum();
    wait_until("the reads inside the file staged", || {
        t.rig.driver.file(t.handle).expect("file").counters().read_bytes() - read_before
            == staged as u64
    });
    // Read from the page cache straight into the slots (a `pread` per part), not through
    // the staging arenas.
    assert!(preads() - preads_before >= sizes.len() as u64, "read straight into the slots");
    // Past the end of the file (short: 4 KiB; read at arm), over the largest slot (two
    // pieces), and unfixed (read at arm, its parameters unmoved).
    let later = [
        (8 * KIB, file_len - 4096, 4096, fixed),
        (16 * MIB + 4096, 4096, 16 * MIB + 4096, fixed),
        (64 * KIB, 8192, 64 * KIB, plain),
    ];
    at = submit_later(&t, &later, &mut placed, at);
    assert!(at <= 40 * MIB);
    assert_eq!(bytes(&placed[0].0), 0, "held: nothing done yet");
    gate.release();
    t.rig.sync(fixed);
    t.rig.sync(plain);
    check_placed(&t, &placed, &old, at);
    let copied = stream_copies(&t.rig) - before;
    // The sizes, the read past the end, the long one's two pieces, and the unfixed one
    // (its parameters did not move: it keeps its slot).
    assert_eq!(copied, sizes.len() as u64 + 1 + 2 + 1, "every read");
}

/// `HIPFILE_STREAM_COPIES=all` with `HIPFILE_STREAM_COPY_SLOTS=device`: fully FIXED reads
/// over 64 KiB take slots of the engine's device memory, which the engine fills through
/// its staging arena (no `pread` straight into a slot), and their stream copies device →
/// device behind the op's wait; reads of at most 64 KiB keep pinned slots. All queued on
/// one held stream (so their release is a host store after the fill, no CUDA call): those
/// inside the file staged at once, one of 256 KiB reaching past the end of the file read
/// when the stream reaches it (its stream copies only the 4 KiB inside the file, so the
/// destination past them stays as it was with no fill of the slot), and a plain stream's
/// unfixed read. Every byte lands where it should.
#[test]
fn with_device_slots_reads_over_64_kib_are_filled_by_the_engine_and_copied_on_their_stream() {
    let config = Config {
        stream_copies: StreamCopies::All,
        stream_copy_slots: StreamCopySlots::Device,
        ..small_config()
    };
    let rig = Rig::with(1, config);
    let file_len = 24 * MIB;
    let t = Paused::with(rig, "stream-copies-device-slots", file_len, 24 * MIB);
    let old = pattern(95, 24 * MIB);
    t.rig.set_dev_bytes(t.buffer, &old);
    let fixed = t.rig.registered_stream(15);
    let plain = t.rig.registered_stream(0);
    let gate = t.rig.pause(fixed).expect("pause");
    let before = stream_copies(&t.rig);
    let read_before = t.rig.driver.file(t.handle).expect("file").counters().read_bytes();
    let preads = || t.rig.driver.engine().expect("engine").stats().host_memory_preads;
    let (preads_before, chunks_before) = (preads(), arena_chunks(&t.rig));
    let copied_other = || t.rig.cpu.as_ref().map(|cpu| cpu.stats().bytes_copied_other);
    let other_before = copied_other();
    let small = [4096, 64 * KIB];
    let large = [64 * KIB + 4096, 256 * KIB + 4096, MIB, 3 * MIB, 16 * MIB];
    let mut placed = Vec::new();
    let mut at = 0usize;
    for (i, &size) in small.iter().chain(&large).enumerate() {
        let file_offset = (i * 5 + 1) * 4096;
        let p = params(size, file_offset as i64, at as i64);
        read(&t, &p, fixed);
        placed.push((p, size, size, file_offset, at));
        at += size + 4096;
    }
    let staged: usize = small.iter().chain(&large).sum();
    wait_until("the reads inside the file staged", || {
        t.rig.driver.file(t.handle).expect("file").counters().read_bytes() - read_before
            == staged as u64
    });
    // The small ones straight into their pinned slots, the large ones through the arena.
    assert_eq!(preads() - preads_before, small.len() as u64, "a pread per small read only");
    let chunks = arena_chunks(&t.rig) - chunks_before;
    let least: usize = large.iter().map(|size| size.div_ceil(256 * KIB)).sum();
    assert!(chunks >= least as u64, "{chunks} arena chunks for the large reads (at least {least})");
    // Past the end of the file (short: 4 KiB of 256 KiB; read at arm), and unfixed.
    let later = [(256 * KIB, file_len - 4096, 4096, fixed), (MIB, 8192, MIB, plain)];
    at = submit_later(&t, &later, &mut placed, at);
    assert!(at <= 24 * MIB);
    assert_eq!(bytes(&placed[0].0), 0, "held: nothing done yet");
    gate.release();
    t.rig.sync(fixed);
    t.rig.sync(plain);
    check_placed(&t, &placed, &old, at);
    assert_eq!(stream_copies(&t.rig) - before, placed.len() as u64, "every read");
    // On the cpu device: the device → device copies out of the slots are what the device
    // copied besides host ↔ device. The read past the end of the file copies only its
    // 4 KiB inside it, and needs no fill of its slot from the destination.
    if let (Some(after), Some(before)) = (copied_other(), other_before) {
        let device_slots: usize = large.iter().sum::<usize>() + 4096 + MIB;
        assert_eq!(after - before, device_slots as u64, "device → device bytes");
    }
}

/// Device slots that no read asked for during `HIPFILE_STREAM_COPY_DEVICE_IDLE_MS` give
/// their device memory back (the driver's own thread; nothing to call); slots lent to ops
/// whose stream is held keep theirs however long; the slots grow again for the next reads,
/// every byte right. With 0 the memory stays until the driver is dropped.
#[test]
fn idle_device_slots_give_their_memory_back() {
    for idle_ms in [60, 0] {
        let config = Config {
            stream_copies: StreamCopies::All,
            stream_copy_slots: StreamCopySlots::Device,
            stream_copy_device_idle_ms: idle_ms,
            ..small_config()
        };
        let t = Paused::with(Rig::with(1, config), "device-slots-idle", 8 * MIB, 8 * MIB);
        let held = || t.rig.driver.device_slot_bytes();
        let stream = t.rig.registered_stream(15);
        let round = |seed: u64, gated: bool| {
            t.rig.set_dev_bytes(t.buffer, &pattern(seed, 8 * MIB));
            let gate = gated.then(|| t.rig.pause(stream).expect("pause"));
            let reads: Vec<_> =
                (0..4).map(|i| params(MIB, (i * 2 * MIB) as i64, (i * 2 * MIB) as i64)).collect();
            for p in &reads {
                read(&t, p, stream);
            }
            if let Some(gate) = gate {
                // Lent to ops the stream has not reached: kept past the idle time.
                std::thread::sleep(Duration::from_millis(4 * idle_ms.max(50)));
                assert_eq!(held(), 4 * MIB, "idle {idle_ms} ms: four 1 MiB slots lent");
                let report = t.rig.driver.pending_report();
                assert!(report.contains("device slots hold 4 MiB"), "{report}");
                gate.release();
            }
            t.rig.sync(stream);
            let got = t.rig.dev_bytes(t.buffer, 8 * MIB);
            for (i, p) in reads.iter().enumerate() {
                assert_eq!(bytes(p), MIB as isize);
                let at = i * 2 * MIB;
                assert_bytes(&got[at..at + MIB], &t.data[at..at + MIB], "read");
            }
        };
        round(1, true);
        if idle_ms == 0 {
            std::thread::sleep(Duration::from_millis(300));
            assert_eq!(held(), 4 * MIB, "never given back");
            continue;
        }
        wait_until("the idle slots' memory given back", || held() == 0);
        round(2, true);
        round(3, false);
        wait_until("given back again", || held() == 0);
    }
}

/// `HIPFILE_PREFETCH_MB=0` turns read-ahead off under `all` too: fully FIXED reads are
/// still copied on their stream through slots (pinned and device, single and in pieces),
/// but read when the stream reaches them, not staged at submission — nothing of the file
/// is read while the stream is held. The default budget stages them at once.
#[test]
fn with_all_a_zero_read_ahead_budget_reads_when_the_stream_reaches_the_op() {
    for budget in [Some(0), None] {
        let config = Config {
            stream_copies: StreamCopies::All,
            stream_copy_slots: StreamCopySlots::Device,
            prefetch_budget_bytes: budget,
            ..small_config()
        };
        let t =
            Paused::with(Rig::with(1, config), "stream-copies-no-read-ahead", 24 * MIB, 24 * MIB);
        let old = pattern(93, 24 * MIB);
        t.rig.set_dev_bytes(t.buffer, &old);
        let stream = t.rig.registered_stream(15);
        let gate = t.rig.pause(stream).expect("pause");
        let file_read = || t.rig.driver.file(t.handle).expect("file").counters().read_bytes();
        let before = (file_read(), stream_copies(&t.rig));
        // 4 KiB (pinned slot), 1 MiB (device slot), 20 MiB (two pieces, device ring).
        let reads = [(4096, 0), (MIB, MIB), (20 * MIB, 4 * MIB)];
        let params: Vec<_> =
            reads.iter().map(|&(size, at)| params(size, at as i64, at as i64)).collect();
        for p in &params {
            read(&t, p, stream);
        }
        std::thread::sleep(Duration::from_millis(100));
        let read_while_held = file_read() - before.0;
        match budget {
            Some(0) => assert_eq!(read_while_held, 0, "read ahead with the budget at 0"),
            _ => {
                wait_until("the reads staged", || file_read() - before.0 > 0);
            }
        }
        gate.release();
        t.rig.sync(stream);
        let got = t.rig.dev_bytes(t.buffer, 24 * MIB);
        for (p, &(size, at)) in params.iter().zip(&reads) {
            assert_eq!(bytes(p), size as isize, "budget {budget:?}");
            assert_bytes(&got[at..at + size], &t.data[at..at + size], "read");
        }
        // Every op still copied on its stream: 1 + 1 + 2 pieces.
        assert_eq!(stream_copies(&t.rig) - before.1, 4, "budget {budget:?}");
    }
}

/// The thread that gives idle device slots back never holds up the driver's end: with an
/// idle time of a day it sleeps in one-second looks, and a driver dropped with device
/// memory held goes at once (the thread is woken, not waited out).
#[test]
fn a_driver_with_device_slots_held_drops_at_once() {
    let config = Config {
        stream_copies: StreamCopies::All,
        stream_copy_slots: StreamCopySlots::Device,
        stream_copy_device_idle_ms: 86_400_000,
        ..small_config()
    };
    let t = Paused::with(Rig::with(1, config), "device-slots-drop", 4 * MIB, 4 * MIB);
    let stream = t.rig.registered_stream(15);
    let p = params(2 * MIB, 0, 0);
    read(&t, &p, stream);
    t.rig.sync(stream);
    assert_eq!(bytes(&p), (2 * MIB) as isize);
    assert_eq!(t.rig.driver.device_slot_bytes(), 4 * MIB, "a 4 MiB slot held: a day is not over");
    // Just past the thread's first look (a second), so that it sleeps in its second: a
    // drop that waited it out would take about 950 ms.
    std::thread::sleep(Duration::from_millis(1050));
    let Paused { rig, file, .. } = t;
    let (device, driver, streams) = rig.into_parts();
    let weak = Arc::downgrade(&driver);
    let started = std::time::Instant::now();
    drop(driver);
    let took = started.elapsed();
    assert!(weak.upgrade().is_none(), "the last owner dropped it");
    assert!(took < Duration::from_millis(700), "the drop took {took:?}");
    for stream in streams {
        device.destroy_user_stream(stream).expect("destroy stream");
    }
    drop(file);
}

/// `HIPFILE_STREAM_COPIES=all`: a read whose destination range is FIXED but whose file
/// offset is not (flags 5) is read into its slot when the stream reaches it, at the
/// file offset its parameters hold then; a fully FIXED read of a range an earlier write
/// of the same stream is still to write (here past the end of the file, which the write
/// extends) is read when the stream reaches it too, and sees the write. A late file
/// offset that is invalid fails the read with -5022, the destination as it was.
#[test]
fn with_all_reads_with_a_fixed_destination_are_read_when_the_stream_reaches_them() {
    let rig = Rig::with(
        1,
        Config {
            stream_copies: StreamCopies::All,
            stream_copy_slots: StreamCopySlots::Pinned,
            ..small_config()
        },
    );
    let file_len = 4 * MIB;
    let t = Paused::with(rig, "stream-copies-at-arm", file_len, 4 * MIB);
    let old = pattern(96, 4 * MIB);
    t.rig.set_dev_bytes(t.buffer, &old);
    let (late, fixed) = (t.rig.registered_stream(5), t.rig.registered_stream(15));
    let gates = [t.rig.pause(late).expect("pause"), t.rig.pause(fixed).expect("pause")];
    let before = stream_copies(&t.rig);
    // Late file offset: submitted as 0, bound as 1 MiB + 4 KiB; and one bound invalid.
    let bound_late = params(256 * KIB, 0, 0);
    read(&t, &bound_late, late);
    bound_late.file_offset_bytes.store((MIB + 4096) as i64, Ordering::SeqCst);
    let invalid = params(64 * KIB, 0, (256 * KIB) as i64);
    read(&t, &invalid, late);
    invalid.file_offset_bytes.store(-4096, Ordering::SeqCst);
    // Stream order: write 256 KiB from the buffer at 2 MiB to the file's last 64 KiB and
    // past, then read them back into the buffer at 3 MiB.
    let write = params(256 * KIB, (file_len - 64 * KIB) as i64, (2 * MIB) as i64);
    t.rig.write(t.handle, t.buffer, &write, fixed);
    let read_back = params(256 * KIB, (file_len - 64 * KIB) as i64, (3 * MIB) as i64);
    read(&t, &read_back, fixed);
    drop(gates);
    t.rig.sync(late);
    t.rig.sync(fixed);
    assert_eq!(bytes(&bound_late), (256 * KIB) as isize);
    assert_eq!(bytes(&invalid), neg(OpError::InvalidValue));
    assert_eq!(bytes(&write), (256 * KIB) as isize);
    assert_eq!(bytes(&read_back), (256 * KIB) as isize, "the file as the write left it");
    let got = t.rig.dev_bytes(t.buffer, 4 * MIB);
    let at_late = &t.data[MIB + 4096..MIB + 4096 + 256 * KIB];
    assert_bytes(&got[..256 * KIB], at_late, "at the late file offset");
    assert_bytes(&got[256 * KIB..320 * KIB], &old[256 * KIB..320 * KIB], "the failed read's");
    let written = &old[2 * MIB..2 * MIB + 256 * KIB];
    assert_bytes(&got[3 * MIB..3 * MIB + 256 * KIB], written, "read back after the write");
    assert_eq!(stream_copies(&t.rig) - before, 3, "two reads and the write (not the failed)");
}

/// `HIPFILE_STREAM_COPIES=all`, writes: a fully FIXED write of up to 16 MiB has its bytes
/// copied into a slot on its own stream, in stream order (after the device copy the
/// application enqueued before it on the held stream, not at submission), and the engine
/// writes the file from the slot; so does a write on a stream without FIXED flags whose
/// buffer offset did not move. The file holds exactly what the buffer held at each
/// write's turn.
#[test]
fn with_all_fixed_writes_take_their_bytes_from_a_slot_filled_in_stream_order() {
    writes_from_slots(Config {
        stream_copies: StreamCopies::All,
        stream_copy_slots: StreamCopySlots::Pinned,
        ..small_config()
    });
}

/// The same through the page cache alone (O_DIRECT off): glommio executors write each
/// part with one `pwrite` straight from the slot.
#[test]
fn with_all_page_cache_writes_go_straight_from_the_slot() {
    let config = Config {
        stream_copies: StreamCopies::All,
        stream_copy_slots: StreamCopySlots::Pinned,
        direct: DirectPolicy::Off,
        ..small_config()
    };
    writes_from_slots(config);
}

/// The same on blocking executors (io_uring off): one `pwrite` from the slot.
#[test]
fn with_all_blocking_executors_write_straight_from_the_slot() {
    let config = Config {
        stream_copies: StreamCopies::All,
        stream_copy_slots: StreamCopySlots::Pinned,
        use_io_uring: false,
        ..small_config()
    };
    writes_from_slots(config);
}

fn writes_from_slots(config: Config) {
    // Page-cache writes on glommio executors go straight from the slot.
    let straight_from_slot = config.use_io_uring && config.direct == DirectPolicy::Off;
    let rig = Rig::with(1, config);
    let len = 40 * MIB;
    let t = Paused::with(rig, "stream-copies-writes", len, len);
    let fixed = t.rig.registered_stream(15);
    let plain = t.rig.registered_stream(0);
    let sizes = [4096, 64 * KIB, MIB + 4096, 16 * MIB];
    let fresh = pattern(123, len);
    let staged = t.rig.pinned(len);
    staged.fill(&fresh);
    let gate = t.rig.pause(fixed).expect("pause");
    let before = stream_copies(&t.rig);
    let pwrites = || t.rig.driver.engine().expect("engine").stats().host_memory_pwrites;
    let pwrites_before = pwrites();
    let mut placed = Vec::new();
    let mut at = 0usize;
    for (i, &size) in sizes.iter().enumerate() {
        let file_offset = (i * 3 + 1) * MIB;
        // The application's own copy of new bytes into the source, queued before the
        // write: the write must see them.
        // The application's own copy of `fresh[..size]` into the source, queued before
        // the write: the write must see it.
        // SAFETY: `staged` lives until the stream has run the copy (synchronized below).
        unsafe { t.rig.copy_to_device_on(fixed, t.buffer + at as u64, &staged, size) }
            .expect("copy");
        let p = params(size, file_offset as i64, at as i64);
        t.rig.write(t.handle, t.buffer, &p, fixed);
        placed.push((p, size, file_offset));
        at += size + 4096;
    }
    let unfixed_at = at;
    let unfixed = params(64 * KIB, (30 * MIB) as i64, unfixed_at as i64);
    t.rig.write(t.handle, t.buffer, &unfixed, plain);
    assert_eq!(bytes(&placed[0].0), 0, "held: nothing done yet");
    gate.release();
    t.rig.sync(fixed);
    t.rig.sync(plain);
    let contents = t.file.contents();
    for (p, size, file_offset) in &placed {
        assert_eq!(bytes(p), *size as isize, "{size} bytes at file offset {file_offset}");
        let what = format!("{size} bytes written at file offset {file_offset}");
        assert_bytes(&contents[*file_offset..file_offset + size], &fresh[..*size], &what);
    }
    assert_eq!(bytes(&unfixed), (64 * KIB) as isize);
    let buffer_then = t.rig.dev_bytes(t.buffer + unfixed_at as u64, 64 * KIB);
    let got = &contents[30 * MIB..30 * MIB + 64 * KIB];
    assert_bytes(got, &buffer_then, "the unfixed write");
    // The unfixed write takes a slot too (its buffer offset did not move).
    assert_eq!(stream_copies(&t.rig) - before, sizes.len() as u64 + 1, "every write");
    if straight_from_slot {
        // A `pwrite` per part from the slot, not through the staging arenas.
        let straight = pwrites() - pwrites_before;
        assert!(straight >= sizes.len() as u64, "written straight from the slots: {straight}");
    }
}

/// `HIPFILE_STREAM_COPY_WRITES=off` under `all`: every write takes the engine's path —
/// small, 16 MiB, longer than a slot (which would go in pieces), on a held FIXED stream
/// and on an unfixed one (which would go through its spare slot) — and lands in stream
/// order after the application's own copy into its source, while a read on the same
/// stream is still copied on it.
#[test]
fn with_writes_off_writes_take_the_engines_path_and_reads_stay_on_their_streams() {
    let rig = Rig::with(1, Config { stream_copy_writes: false, ..all_config() });
    let len = 64 * MIB;
    let t = Paused::with(rig, "stream-copies-writes-off", len, len);
    let (fixed, plain) = (t.rig.registered_stream(15), t.rig.registered_stream(0));
    let fresh = pattern(125, len);
    let staged = t.rig.pinned(len);
    staged.fill(&fresh);
    let gate = t.rig.pause(fixed).expect("pause");
    let before = stream_copies(&t.rig);
    // (size, file offset, buffer offset): disjoint in the file and in the buffer.
    let writes = [(4096, 0, 0), (MIB + 4096, 2 * MIB, 4 * MIB), (16 * MIB, 4 * MIB, 8 * MIB)];
    let long = (20 * MIB, 20 * MIB, 24 * MIB);
    let mut placed = Vec::new();
    for &(size, file_offset, at) in writes.iter().chain([&long]) {
        // SAFETY: `staged` lives until the stream has run the copy (synchronized below).
        unsafe { t.rig.copy_to_device_on(fixed, t.buffer + at as u64, &staged, size) }
            .expect("copy");
        let p = params(size, file_offset as i64, at as i64);
        t.rig.write(t.handle, t.buffer, &p, fixed);
        placed.push((p, size, file_offset));
    }
    // A read of a range no write touches, on the held stream: still copied on it.
    let read_p = params(MIB, (48 * MIB) as i64, (48 * MIB) as i64);
    read(&t, &read_p, fixed);
    assert_eq!(bytes(&placed[0].0), 0, "held: nothing done yet");
    // An unfixed stream's write (its source already in the buffer).
    let unfixed = params(4 * MIB, (42 * MIB) as i64, (50 * MIB) as i64);
    t.rig.write(t.handle, t.buffer, &unfixed, plain);
    t.rig.sync(plain);
    gate.release();
    t.rig.sync(fixed);
    let contents = t.file.contents();
    for (p, size, file_offset) in &placed {
        assert_eq!(bytes(p), *size as isize, "{size} bytes at file offset {file_offset}");
        let what = format!("{size} bytes written at file offset {file_offset}");
        assert_bytes(&contents[*file_offset..file_offset + size], &fresh[..*size], &what);
    }
    assert_eq!(bytes(&unfixed), (4 * MIB) as isize);
    let source = t.rig.dev_bytes(t.buffer + (50 * MIB) as u64, 4 * MIB);
    assert_bytes(&contents[42 * MIB..46 * MIB], &source, "the unfixed stream's write");
    assert_eq!(bytes(&read_p), MIB as isize);
    let got = t.rig.dev_bytes(t.buffer + (48 * MIB) as u64, MIB);
    assert_bytes(&got, &t.data[48 * MIB..49 * MIB], "the read");
    assert_eq!(stream_copies(&t.rig) - before, 1, "the read alone was copied on its stream");
}

/// `HIPFILE_STREAM_COPIES=all`: a write whose buffer offset and size are FIXED but whose
/// file offset is not takes a slot too (its source range is known at submission), and
/// lands at the file offset the parameters hold when the stream reaches it; a write on a
/// stream that fixes only the file offset and size takes a slot for its buffer range as
/// submitted, which did not move.
#[test]
fn with_all_a_write_with_a_fixed_source_takes_a_slot_and_binds_its_file_offset_late() {
    let rig = Rig::with(
        1,
        Config {
            stream_copies: StreamCopies::All,
            stream_copy_slots: StreamCopySlots::Pinned,
            ..small_config()
        },
    );
    let t = Paused::with(rig, "stream-copies-late-offset", 4 * MIB, MIB);
    let data = pattern(124, 256 * KIB);
    t.rig.set_dev_bytes(t.buffer, &data);
    // FIXED_BUF_OFFSET | FIXED_FILE_SIZE, and FIXED_FILE_OFFSET | FIXED_FILE_SIZE.
    let (source_fixed, offset_fixed) = (t.rig.registered_stream(5), t.rig.registered_stream(6));
    let gates =
        [t.rig.pause(source_fixed).expect("pause"), t.rig.pause(offset_fixed).expect("pause")];
    let before = stream_copies(&t.rig);
    let late = params(128 * KIB, 0, 0);
    t.rig.write(t.handle, t.buffer, &late, source_fixed);
    // Bound when the stream reaches the op: 2 MiB, not 0.
    late.file_offset_bytes.store((2 * MIB) as i64, Ordering::SeqCst);
    let offset_only = params(128 * KIB, (3 * MIB) as i64, (128 * KIB) as i64);
    t.rig.write(t.handle, t.buffer, &offset_only, offset_fixed);
    assert_eq!(stream_copies(&t.rig) - before, 2, "both into slots");
    drop(gates);
    t.rig.sync(source_fixed);
    t.rig.sync(offset_fixed);
    assert_eq!((bytes(&late), bytes(&offset_only)), ((128 * KIB) as isize, (128 * KIB) as isize));
    let contents = t.file.contents();
    assert_bytes(&contents[2 * MIB..2 * MIB + 128 * KIB], &data[..128 * KIB], "at the late offset");
    assert_bytes(&contents[..128 * KIB], &t.data[..128 * KIB], "not at the submitted one");
    assert_bytes(&contents[3 * MIB..3 * MIB + 128 * KIB], &data[128 * KIB..], "the engine's write");
}

/// A read for [`held_reads_land`]: (size, file offset submitted, file offset bound,
/// buffer offset, bytes it reads).
type HeldRead = (usize, usize, usize, usize, usize);

/// Submits `reads` on a new stream registered with `flags` while the stream is held,
/// moves each file offset to its bound value after submission, then releases the stream
/// and checks each read: nothing published while held, then its `*bytes_p`, its bytes
/// (from the submitted file offset when the stream fixes it, flag 2, else the bound one),
/// and the destination past a short read as `old` had it. `buffer_len` bytes of the
/// buffer are read back.
fn held_reads_land(t: &Paused, flags: u32, reads: &[HeldRead], old: &[u8], buffer_len: usize) {
    let stream = t.rig.registered_stream(flags);
    let gate = t.rig.pause(stream).expect("pause");
    let mut placed = Vec::new();
    for &(size, submitted, bound, at, want) in reads {
        let p = params(size, submitted as i64, at as i64);
        read(t, &p, stream);
        p.file_offset_bytes.store(bound as i64, Ordering::SeqCst);
        let from = if flags & 2 != 0 { submitted } else { bound };
        placed.push((p, size, from, at, want));
    }
    assert!(placed.iter().all(|(p, ..)| bytes(p) == 0), "held: nothing published yet");
    gate.release();
    t.rig.sync(stream);
    // The ops hand their slots back as they end, just after the stream ran their copies:
    // the caller's next reads find them free.
    let engine = t.rig.driver.engine().expect("engine");
    wait_until("the ops to end", || engine.async_ops_alive() == 0);
    let got = t.rig.dev_bytes(t.buffer, buffer_len);
    for (p, size, from, at, want) in &placed {
        let what = format!("flags {flags}: {size} bytes from file offset {from}");
        assert_eq!(bytes(p), *want as isize, "{what}");
        assert_bytes(&got[*at..at + want], &t.data[*from..from + want], &what);
        assert_bytes(&got[at + want..at + size], &old[at + want..at + size], &what);
    }
}

/// Device slots with the smallest cap (`HIPFILE_STREAM_COPY_DEVICE_MB=16`): of three
/// 16 MiB reads queued on a held stream the first takes the device slot, the other two
/// find none free, which the driver counts (the bench prints it, the log says it once).
/// With `HIPFILE_STREAM_COPY_DEVICE_FULL=pinned` they take pinned slots (copied host →
/// device); with `share` each shares the slot of the read before it on the stream and is
/// read into it when the stream reaches it, after that read's copy ran (all three copied
/// device → device out of the one slot). Every byte lands either way, also with a late
/// file offset (flags 5). Reads of 64 KiB never want device memory and are not counted.
#[test]
fn reads_past_the_device_slots_cap_take_pinned_slots_or_share_their_streams() {
    for full in [DeviceSlotsFull::Pinned, DeviceSlotsFull::Share] {
        let config = Config {
            stream_copy_slots: StreamCopySlots::Device,
            stream_copy_device_cap_bytes: 16 * MIB,
            stream_copy_device_full: full,
            ..all_config()
        };
        let t = Paused::with(Rig::with(1, config), "stream-copies-past-cap", 64 * MIB, 64 * MIB);
        let old = pattern(97, 64 * MIB);
        let copied_other = || t.rig.cpu.as_ref().map(|cpu| cpu.stats().bytes_copied_other);
        for (round, flags) in [15u32, 5].into_iter().enumerate() {
            t.rig.set_dev_bytes(t.buffer, &old);
            let other_before = copied_other();
            let (past_before, shared_before) =
                (t.rig.driver.reads_past_device_slots(), t.rig.driver.reads_sharing_device_slots());
            // (size, file offset submitted, file offset bound, buffer offset, bytes read)
            let reads = [
                (16 * MIB, 0, 4096, 0, 16 * MIB),
                (16 * MIB, 16 * MIB, 16 * MIB + 4096, 20 * MIB, 16 * MIB),
                (16 * MIB, 40 * MIB, 40 * MIB + 4096, 40 * MIB, 16 * MIB),
                (64 * KIB, 60 * MIB, 60 * MIB + 4096, 60 * MIB, 64 * KIB),
            ];
            held_reads_land(&t, flags, &reads, &old, 64 * MIB);
            let what = format!("{full:?}, flags {flags}");
            let past = t.rig.driver.reads_past_device_slots() - past_before;
            let shared = t.rig.driver.reads_sharing_device_slots() - shared_before;
            // The first round's slot is the pool's after its copy ran: taken again first.
            assert_eq!(past, 2, "{what}: the two reads past the cap");
            let want_shared = if full == DeviceSlotsFull::Share { 2 } else { 0 };
            assert_eq!(shared, want_shared, "{what}: reads that shared their stream's slot");
            // On the cpu device: device → device copies out of device slots only.
            if let (Some(after), Some(before)) = (copied_other(), other_before) {
                let device_reads = 1 + shared;
                assert_eq!(
                    after - before,
                    device_reads * 16 * MIB as u64,
                    "{what} (round {round})"
                );
            }
        }
        let report = t.rig.driver.pending_report();
        assert!(report.contains("4 reads found none free"), "{report}");
    }
}

/// `HIPFILE_STREAM_COPY_DEVICE_FULL=share`: a fully FIXED read sharing the slot of an
/// earlier read of its stream reads ahead as soon as the stream ran that read's copy —
/// here when the stream reaches a 64 KiB write between them (an arm after that copy),
/// while a gate of the application holds the stream before the shared read — not only at
/// its own arm; every byte lands once the gate opens.
#[test]
fn a_read_sharing_its_streams_slot_reads_ahead_once_the_earlier_copy_ran() {
    let config = Config {
        stream_copy_slots: StreamCopySlots::Device,
        stream_copy_device_cap_bytes: 16 * MIB,
        stream_copy_device_full: DeviceSlotsFull::Share,
        ..all_config()
    };
    let t = Paused::with(Rig::with(1, config), "stream-copies-share-ahead", 64 * MIB, 64 * MIB);
    let old = pattern(98, 64 * MIB);
    t.rig.set_dev_bytes(t.buffer, &old);
    let prefetched = || t.rig.driver.async_stats().prefetched.load(Ordering::SeqCst);
    let stream = t.rig.registered_stream(15);
    let first_gate = t.rig.pause(stream).expect("pause");
    let first = params(16 * MIB, 0, 0);
    read(&t, &first, stream);
    // A write between them (no read ahead of its own): its arm follows the first's copy.
    let written = params(64 * KIB, 60 * MIB as i64, 30 * MIB as i64);
    t.rig.write(t.handle, t.buffer, &written, stream);
    let second_gate = t.rig.pause(stream).expect("pause");
    let shared = params(16 * MIB, 40 * MIB as i64, 40 * MIB as i64);
    read(&t, &shared, stream);
    assert_eq!(t.rig.driver.reads_sharing_device_slots(), 1, "the read shares the first's slot");
    // The first read is staged by now (milliseconds on the cpu device); the shared one must
    // not start while the first's copy is queued.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let before = prefetched();
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert_eq!(prefetched(), before, "not read ahead while the first's copy is queued");
    first_gate.release();
    wait_until("the shared read to read ahead", || prefetched() > before);
    assert_eq!(bytes(&shared), 0, "still held by the application's second gate");
    second_gate.release();
    t.rig.sync(stream);
    let got = t.rig.dev_bytes(t.buffer, 64 * MIB);
    for (p, at, len) in [(&first, 0, 16 * MIB), (&shared, 40 * MIB, 16 * MIB)] {
        assert_eq!(bytes(p), len as isize);
        assert_bytes(&got[at..at + len], &t.data[at..at + len], &format!("{len} bytes at {at}"));
    }
    assert_bytes(&got[16 * MIB..40 * MIB], &old[16 * MIB..40 * MIB], "untouched");
    assert_eq!(bytes(&written), (64 * KIB) as isize);
    let contents = t.file.contents();
    assert_bytes(
        &contents[60 * MIB..60 * MIB + 64 * KIB],
        &old[30 * MIB..30 * MIB + 64 * KIB],
        "written",
    );
}

/// `all` with room for the rings of several long ops in flight (256 MiB of 16 MiB slots;
/// the default 64 MiB holds one ring of four).
fn all_config() -> Config {
    Config {
        stream_copies: StreamCopies::All,
        stream_copy_slots: StreamCopySlots::Pinned,
        stream_copy_cap_bytes: 256 * MIB,
        ..small_config()
    }
}

/// `HIPFILE_STREAM_COPIES=all`, long reads: a read of more than 16 MiB is copied on its
/// stream in 16 MiB pieces sharing a ring of at most four slots (pieces past the fourth
/// reuse a slot the stream has copied out of). Reads of 16 MiB + 4 KiB, 40 MiB and
/// 100 MiB on a held stream (fully FIXED, with a late file offset, and with nothing
/// FIXED), one reaching past the end of the file (short; the rest of its
/// destination as it was): every byte right, `*bytes_p` once for the whole op. With device
/// slots the rings are of the engine's device memory (the stream copies device → device).
#[test]
fn with_all_long_reads_are_copied_on_their_stream_in_pieces() {
    for slots in [StreamCopySlots::Pinned, StreamCopySlots::Device] {
        long_reads_in_pieces(Config {
            stream_copy_slots: slots,
            stream_copy_device_cap_bytes: 256 * MIB,
            ..all_config()
        });
    }
}

fn long_reads_in_pieces(config: Config) {
    let file_len = 180 * MIB;
    let slots = config.stream_copy_slots;
    let t = Paused::with(Rig::with(1, config), "stream-copies-long", file_len, 200 * MIB);
    let old = pattern(95, 200 * MIB);
    t.rig.set_dev_bytes(t.buffer, &old);
    let copied_other = || t.rig.cpu.as_ref().map(|cpu| cpu.stats().bytes_copied_other);
    for flags in [15u32, 5, 0] {
        let other_before = copied_other();
        let before = stream_copies(&t.rig);
        let ahead_before = t.rig.driver.async_stats().read_ahead.load(Ordering::SeqCst);
        let reads = [
            (16 * MIB + 4096, 4096, 8192, 0, 16 * MIB + 4096),
            (40 * MIB, 20 * MIB, 24 * MIB, 20 * MIB, 40 * MIB),
            (100 * MIB, 60 * MIB, 64 * MIB, 64 * MIB, 100 * MIB),
            (32 * MIB, file_len - 20 * MIB, file_len - 20 * MIB, 168 * MIB, 20 * MIB),
        ];
        held_reads_land(&t, flags, &reads, &old, 200 * MIB);
        let pieces: u64 = reads.iter().map(|r| r.0.div_ceil(16 * MIB) as u64).sum();
        assert_eq!(stream_copies(&t.rig) - before, pieces, "flags {flags}: every piece");
        // Pieces past the staged ones are read ahead as earlier pieces' arms free their
        // slots: fully FIXED, pieces inside the file among the first four of each op are
        // staged at submission (read ahead: the 100 MiB read's last three, and the second
        // piece of the read past the end of the file); with a late file offset every
        // piece after the first is read ahead (1 + 2 + 6 + 1).
        let ahead = t.rig.driver.async_stats().read_ahead.load(Ordering::SeqCst) - ahead_before;
        assert_eq!(ahead, if flags == 15 { 4 } else { 10 }, "flags {flags}: read ahead");
        // On the cpu device: pinned rings are copied host → device, device rings device →
        // device (every byte read, and the short read's fill).
        if let (Some(after), Some(before)) = (copied_other(), other_before) {
            let read: usize = reads.iter().map(|r| r.4).sum();
            let copied = after - before;
            let past = t.rig.driver.reads_past_device_slots();
            match slots {
                StreamCopySlots::Device => assert!(
                    copied >= read as u64,
                    "{slots:?}, flags {flags}: {copied} bytes copied device → device of {read} \
                     read ({past} reads found no device slot)"
                ),
                _ => assert_eq!(copied, 0, "{slots:?}, flags {flags}"),
            }
        }
        t.rig.set_dev_bytes(t.buffer, &old);
    }
}

/// `HIPFILE_STREAM_COPY_PIECE_MB=1`: ops longer than 1 MiB whose device range is FIXED go
/// in pieces of 1 MiB sharing a ring of four 1 MiB slots (a 16 MiB op uses each slot four
/// times), so the stream copies each piece as soon as it is read; an op of 1 MiB or less
/// takes one slot as before. Reads (fully FIXED and with a late file offset; one reaching
/// past the end of the file) and a write, on a held stream: every byte right, `*bytes_p`
/// once per op, every piece copied on the stream.
/// With device slots, the reads' rings of 1 MiB slots are device memory, the write's pinned.
#[test]
fn with_all_ops_longer_than_the_piece_size_go_in_pieces_of_that_size() {
    for slots in [StreamCopySlots::Pinned, StreamCopySlots::Device] {
        pieces_of_one_mib(Config {
            stream_copy_piece_bytes: MIB,
            stream_copy_slots: slots,
            ..all_config()
        });
    }
}

fn pieces_of_one_mib(config: Config) {
    let file_len = 40 * MIB;
    let device_slots = config.stream_copy_slots == StreamCopySlots::Device;
    let t = Paused::with(Rig::with(1, config), "stream-copies-small-pieces", file_len, 48 * MIB);
    let old = pattern(91, 48 * MIB);
    t.rig.set_dev_bytes(t.buffer, &old);
    for flags in [15u32, 5] {
        let before = stream_copies(&t.rig);
        // (size, file offset submitted, file offset bound, buffer offset, bytes read)
        let reads = [
            (4 * MIB + 4096, 4096, 8192, 0, 4 * MIB + 4096),
            (MIB, 6 * MIB, 7 * MIB, 5 * MIB, MIB),
            (3 * MIB, 9 * MIB, 10 * MIB, 6 * MIB, 3 * MIB),
            (16 * MIB, 12 * MIB, 13 * MIB, 10 * MIB, 16 * MIB),
            (
                6 * MIB,
                file_len - 2 * MIB - 4096,
                file_len - 2 * MIB - 4096,
                30 * MIB,
                2 * MIB + 4096,
            ),
        ];
        held_reads_land(&t, flags, &reads, &old, 48 * MIB);
        // 5 + 1 + 3 + 16 + 6 pieces (the op of 1 MiB is one slot op).
        assert_eq!(stream_copies(&t.rig) - before, 31, "flags {flags}: every piece");
        // Device rings (of 1 MiB slots) are given back after their uses: held, not lost.
        if device_slots {
            assert!(t.rig.driver.device_slot_bytes() >= 4 * MIB, "flags {flags}: device rings");
        }
        t.rig.set_dev_bytes(t.buffer, &old);
    }
    // A write of 6 MiB + 4 KiB from a FIXED source range: seven pieces.
    let stream = t.rig.registered_stream(15);
    let gate = t.rig.pause(stream).expect("pause");
    let before = stream_copies(&t.rig);
    let size = 6 * MIB + 4096;
    let p = params(size, (20 * MIB) as i64, MIB as i64);
    t.rig.write(t.handle, t.buffer, &p, stream);
    gate.release();
    t.rig.sync(stream);
    assert_eq!(bytes(&p), size as isize, "the write");
    assert_bytes(&t.file.contents()[20 * MIB..20 * MIB + size], &old[MIB..MIB + size], "the file");
    assert_eq!(stream_copies(&t.rig) - before, 7, "the write's pieces");
}

/// `all` with the least slot cap (16 MiB of each large size: one 16 MiB slot) and the
/// page cache only (so that the engine's arena serves no slot job).
fn all_exhausted_config() -> Config {
    Config {
        stream_copies: StreamCopies::All,
        stream_copy_slots: StreamCopySlots::Pinned,
        stream_copy_cap_bytes: 16 * MIB,
        direct: DirectPolicy::Off,
        ..small_config()
    }
}

fn spare_ops(rig: &Rig) -> u64 {
    rig.driver.async_stats().spare_ops.load(Ordering::SeqCst)
}

fn arena_chunks(rig: &Rig) -> u64 {
    rig.driver.engine().expect("engine").stats().arena_chunks
}

/// `all` with every slot of the size taken: reads that find no slot of their own go
/// through their stream's spare slots in pieces of 4 MiB, the first read when the stream
/// reaches it, each later one read ahead at the arm of the one before it into the other
/// slot of the ring (fully FIXED, with a late file offset, and with nothing FIXED; one
/// reaching past the end of the file: short, the rest of its destination as it was). None takes the engine's path (no
/// arena chunk, no device-side release), every byte lands where it should.
#[test]
fn with_all_reads_that_find_no_slot_go_through_their_streams_spare() {
    let file_len = 100 * MIB;
    let t = Paused::with(Rig::with(1, all_exhausted_config()), "spare-reads", file_len, 112 * MIB);
    let old = pattern(90, 112 * MIB);
    t.rig.set_dev_bytes(t.buffer, &old);
    for flags in [15u32, 5, 0] {
        let stats = t.rig.driver.async_stats();
        let before = (stream_copies(&t.rig), spare_ops(&t.rig), arena_chunks(&t.rig));
        let device_releases = stats.device_releases.load(Ordering::SeqCst);
        let ahead_before = stats.read_ahead.load(Ordering::SeqCst);
        // (size, file offset submitted, file offset bound, buffer offset, bytes read):
        // the first takes the one 16 MiB slot, the 8 KiB one a small slot (sizes have
        // their own slots), the others the spares (4 + 4 + 2 + 4 pieces; the last reaches
        // past the end of the file).
        let reads = [
            (16 * MIB, 0, 4096, 0, 16 * MIB),
            (16 * MIB, 16 * MIB, 20 * MIB, 16 * MIB, 16 * MIB),
            (13 * MIB + 4096, 40 * MIB, 44 * MIB, 32 * MIB, 13 * MIB + 4096),
            (6 * MIB, 60 * MIB, 61 * MIB, 48 * MIB, 6 * MIB),
            (8192, 70 * MIB + 4096, 71 * MIB, 56 * MIB, 8192),
            (16 * MIB, file_len - 6 * MIB, file_len - 6 * MIB, 64 * MIB, 6 * MIB),
        ];
        held_reads_land(&t, flags, &reads, &old, 112 * MIB);
        let what = format!("flags {flags}");
        assert_eq!(spare_ops(&t.rig) - before.1, 4, "{what}: four ops through the spare");
        assert_eq!(stream_copies(&t.rig) - before.0, 1 + 4 + 4 + 2 + 1 + 4, "{what}: pieces");
        assert_eq!(arena_chunks(&t.rig) - before.2, 0, "{what}: nothing on the engine's path");
        let released_on_device = stats.device_releases.load(Ordering::SeqCst) - device_releases;
        assert_eq!(released_on_device, 0, "{what}: every release from the host");
        // Each piece after an op's first is read ahead at the arm of the one before it,
        // into the other slot of the stream's ring of two.
        let ahead = stats.read_ahead.load(Ordering::SeqCst) - ahead_before;
        assert_eq!(ahead, 3 + 3 + 1 + 3, "{what}: pieces read ahead");
        t.rig.set_dev_bytes(t.buffer, &old);
    }
}

/// The same for writes: with the one 16 MiB slot taken, writes (from a FIXED source range,
/// and on streams with nothing FIXED) have their stream copy each 4 MiB piece into a spare
/// slot ahead of the piece's
/// doorbell, and the engine writes the file from there. A later round reuses its streams'
/// spares; each stream has spares of its own. The file holds exactly the bytes written.
#[test]
fn with_all_writes_that_find_no_slot_go_through_their_streams_spare() {
    // The spares of four streams fill twice the 16 MiB cap of 4 MiB slots: a driver per
    // set of four.
    spare_writes(&[15, 5], &[15, 5, 15]);
    spare_writes(&[0], &[0, 0]);
}

/// Rounds of writes that find no slot, on two streams of each of `kinds` (registration
/// flags), a round per entry of `rounds` (a later round finds its streams' spares again).
fn spare_writes(kinds: &[u32], rounds: &[u32]) {
    let len = 96 * MIB;
    let t = Paused::with(Rig::with(1, all_exhausted_config()), "spare-writes", len, len);
    let fresh = pattern(89, len);
    t.rig.set_dev_bytes(t.buffer, &fresh);
    let pairs: Vec<[_; 2]> = kinds
        .iter()
        .map(|&flags| [t.rig.registered_stream(flags), t.rig.registered_stream(flags)])
        .collect();
    for (round, &flags) in rounds.iter().enumerate() {
        let streams = pairs[kinds.iter().position(|&k| k == flags).expect("a kind")];
        let gates: Vec<_> = streams.iter().map(|&s| t.rig.pause(s).expect("pause")).collect();
        let before = (spare_ops(&t.rig), arena_chunks(&t.rig));
        let mut placed = Vec::new();
        // Three writes per stream, the last one short of a whole piece.
        for (k, &stream) in streams.iter().enumerate() {
            for (i, size) in [16 * MIB, 16 * MIB, 9 * MIB + 4096].into_iter().enumerate() {
                let at = (k * 3 + i) * 16 * MIB;
                let file_offset = len - 16 * MIB - at;
                let submitted = if flags & 2 != 0 { file_offset } else { 0 };
                let p = params(size, submitted as i64, at as i64);
                t.rig.write(t.handle, t.buffer, &p, stream);
                p.file_offset_bytes.store(file_offset as i64, Ordering::SeqCst);
                placed.push((p, size, at, file_offset));
            }
        }
        for gate in gates {
            gate.release();
        }
        for &stream in &streams {
            t.rig.sync(stream);
        }
        let contents = t.file.contents();
        for (p, size, at, file_offset) in &placed {
            let what =
                format!("round {round}: {size} bytes from {at} to file offset {file_offset}");
            assert_eq!(bytes(p), *size as isize, "{what}");
            assert_bytes(
                &contents[*file_offset..file_offset + size],
                &fresh[*at..at + size],
                &what,
            );
        }
        // One write may find the 16 MiB slot; the others go through their stream's spare.
        let spared = spare_ops(&t.rig) - before.0;
        let what = format!("flags {flags}, round {round}");
        assert!((5..=6).contains(&spared), "{what}: {spared} writes through spares");
        assert_eq!(arena_chunks(&t.rig) - before.1, 0, "{what}: no engine path");
        t.reset_file();
    }
}

/// Long writes in pieces: 40 MiB and 100 MiB from a FIXED source range, with the file
/// offset FIXED or bound late; the application rewrote the source on the held stream just
/// before each write. The file holds exactly those bytes; rounds after the first find the
/// ring's slots back in the pool (else they would take the engine's path, uncounted).
#[test]
fn with_all_long_writes_are_copied_into_a_ring_of_slots_in_pieces() {
    let len = 200 * MIB;
    let t = Paused::with(Rig::with(1, all_config()), "stream-copies-long-writes", len, len);
    let fresh = pattern(94, len);
    let staged = t.rig.pinned(len);
    staged.fill(&fresh);
    for (round, flags) in [15u32, 5, 15, 5].into_iter().enumerate() {
        let stream = t.rig.registered_stream(flags);
        let gate = t.rig.pause(stream).expect("pause");
        let before = stream_copies(&t.rig);
        let mut placed = Vec::new();
        for (size, at, file_offset) in [(40 * MIB, 0, 8 * MIB), (100 * MIB, 48 * MIB, 60 * MIB)] {
            // SAFETY: `staged` lives until the stream has run the copy (synchronized below).
            unsafe { t.rig.copy_to_device_on(stream, t.buffer + at as u64, &staged, size) }
                .expect("copy");
            let submitted = if flags & 2 != 0 { file_offset } else { 0 };
            let p = params(size, submitted as i64, at as i64);
            t.rig.write(t.handle, t.buffer, &p, stream);
            p.file_offset_bytes.store(file_offset as i64, Ordering::SeqCst);
            placed.push((p, size, file_offset));
        }
        gate.release();
        t.rig.sync(stream);
        let contents = t.file.contents();
        for (p, size, file_offset) in &placed {
            let what = format!("round {round}, flags {flags}: {size} bytes at {file_offset}");
            assert_eq!(bytes(p), *size as isize, "{what}");
            assert_bytes(&contents[*file_offset..file_offset + size], &fresh[..*size], &what);
        }
        assert_eq!(stream_copies(&t.rig) - before, 3 + 7, "round {round}: every piece");
        t.reset_file();
    }
}

/// A late file offset that is invalid for the whole long read fails every piece:
/// `*bytes_p` is -5022 once, and the destination stays as it was (the pieces' copies write
/// its own bytes back).
#[test]
fn with_all_a_long_read_bound_invalid_fails_whole() {
    let t = Paused::with(Rig::with(1, all_config()), "stream-copies-long-bad", 64 * MIB, 64 * MIB);
    let old = pattern(93, 64 * MIB);
    t.rig.set_dev_bytes(t.buffer, &old);
    let stream = t.rig.registered_stream(5);
    let gate = t.rig.pause(stream).expect("pause");
    let stats = t.rig.driver.async_stats();
    let (submitted, releases) = (&stats.submitted, &stats.host_releases);
    let before = (submitted.load(Ordering::SeqCst), releases.load(Ordering::SeqCst));
    let p = params(40 * MIB, 0, 0);
    read(&t, &p, stream);
    assert_eq!(submitted.load(Ordering::SeqCst) - before.0, 1, "one op");
    // Negative: the first piece alone would fail, the later ones (-4 KiB + 16 MiB · k)
    // would not.
    p.file_offset_bytes.store(-4096, Ordering::SeqCst);
    gate.release();
    t.rig.sync(stream);
    assert_eq!(bytes(&p), neg(OpError::InvalidValue));
    assert_bytes(&t.rig.dev_bytes(t.buffer, 64 * MIB), &old, "the destination");
    let released = releases.load(Ordering::SeqCst) - before.1;
    assert_eq!(released, 3, "three pieces, each releasing its stream");
}

/// `HIPFILE_STREAM_COPIES=all` on a stream without FIXED flags: each op takes a slot for
/// the device range it was submitted with. A read whose buffer offset (or size) moves
/// before the stream reaches it declines the slot: the engine moves it to the bound
/// range, and the slot is filled from the destination first, so the stream's queued copy
/// leaves the submitted range as it was (here, bytes unlike the file's). A write whose
/// buffer offset moved writes from the bound range.
#[test]
fn with_all_an_unfixed_op_whose_range_moved_declines_its_slot() {
    let t = Paused::with(Rig::with(1, all_config()), "stream-copies-declined", 4 * MIB, 4 * MIB);
    let old = pattern(92, 4 * MIB);
    t.rig.set_dev_bytes(t.buffer, &old);
    let stream = t.rig.registered_stream(0);
    let gate = t.rig.pause(stream).expect("pause");
    let before = stream_copies(&t.rig);
    // Submitted into [0, 256 KiB), bound to [1 MiB, +256 KiB).
    let moved = params(256 * KIB, 8192, 0);
    read(&t, &moved, stream);
    moved.buffer_offset_bytes.store(MIB as i64, Ordering::SeqCst);
    // Submitted as 256 KiB into [512 KiB, ..), bound to 100 KiB there.
    let shrunk = params(256 * KIB, 4096, (512 * KIB) as i64);
    read(&t, &shrunk, stream);
    shrunk.size_bytes.store(100 * KIB, Ordering::SeqCst);
    // A write submitted from [2 MiB, ..), bound to [3 MiB, ..).
    let write = params(64 * KIB, (2 * MIB) as i64, (2 * MIB) as i64);
    t.rig.write(t.handle, t.buffer, &write, stream);
    write.buffer_offset_bytes.store((3 * MIB) as i64, Ordering::SeqCst);
    drop(gate);
    t.rig.sync(stream);
    assert_eq!(bytes(&moved), (256 * KIB) as isize);
    assert_eq!(bytes(&shrunk), (100 * KIB) as isize);
    assert_eq!(bytes(&write), (64 * KIB) as isize);
    let got = t.rig.dev_bytes(t.buffer, 4 * MIB);
    assert_bytes(&got[..512 * KIB], &old[..512 * KIB], "the moved read's submitted range");
    assert_bytes(&got[MIB..MIB + 256 * KIB], &t.data[8192..8192 + 256 * KIB], "moved");
    let shrunk_at = 512 * KIB;
    let want = &t.data[4096..4096 + 100 * KIB];
    assert_bytes(&got[shrunk_at..shrunk_at + 100 * KIB], want, "the shrunk read");
    let rest = shrunk_at + 100 * KIB..shrunk_at + 256 * KIB;
    assert_bytes(&got[rest.clone()], &old[rest], "past the shrunk read");
    let file = t.file.contents();
    assert_bytes(&file[2 * MIB..2 * MIB + 64 * KIB], &old[3 * MIB..3 * MIB + 64 * KIB], "write");
    // The write's source went into its slot at submission (counted); the reads declined.
    assert_eq!(stream_copies(&t.rig) - before, 1, "only the write's copy into its slot");
}

/// `HIPFILE_STREAM_COPIES=all` on a stream without FIXED flags, ops longer than 16 MiB:
/// their pieces' copies are enqueued for the device range as submitted, and each piece
/// whose bound range differs declines its slot at its arm, as an op of its own does
/// (`with_all_an_unfixed_op_whose_range_moved_declines_its_slot`). On a held stream, in
/// stream order: a 40 MiB read moved up by 1 MiB (bound and submitted ranges overlap: the
/// pieces' copies back must not undo what the pieces before them moved); a 40 MiB read
/// shrunk to 20 MiB (a whole piece, a shrunk one, one past the end); a 20 MiB read
/// shrunk to 0; a 20 MiB write moved by 2 MiB, which reads what the first read placed.
/// Every byte of destination and file is checked, `*bytes_p` is the bound size, and the
/// stream copied only the shrunk read's first piece (its range did not change) and the
/// write's two pieces into their slots: the moved pieces declined, the pieces past the
/// end moved nothing.
#[test]
fn with_all_unfixed_long_ops_whose_range_moved_decline_piece_by_piece() {
    for slots in [StreamCopySlots::Pinned, StreamCopySlots::Device] {
        let config = Config {
            stream_copy_slots: slots,
            stream_copy_device_cap_bytes: 256 * MIB,
            ..all_config()
        };
        let rig = Rig::with(1, config);
        let t = Paused::with(rig, "stream-copies-long-declined", 64 * MIB, 128 * MIB);
        let old = pattern(91, 128 * MIB);
        t.rig.set_dev_bytes(t.buffer, &old);
        let stream = t.rig.registered_stream(0);
        let gate = t.rig.pause(stream).expect("pause");
        let before = stream_copies(&t.rig);
        // Submitted into [0, 40 MiB), bound to [1 MiB, 41 MiB).
        let moved = params(40 * MIB, 0, 0);
        read(&t, &moved, stream);
        moved.buffer_offset_bytes.store(MIB as i64, Ordering::SeqCst);
        // Submitted as 40 MiB into [64 MiB, ..), bound to 20 MiB there.
        let shrunk = params(40 * MIB, 4096, (64 * MIB) as i64);
        read(&t, &shrunk, stream);
        shrunk.size_bytes.store(20 * MIB, Ordering::SeqCst);
        // Submitted as 20 MiB into [106 MiB, ..), bound to nothing.
        let emptied = params(20 * MIB, 8192, (106 * MIB) as i64);
        read(&t, &emptied, stream);
        emptied.size_bytes.store(0, Ordering::SeqCst);
        // A write to [44 MiB, 64 MiB) of the file submitted from [0, ..), bound to [2 MiB, ..).
        let write = params(20 * MIB, (44 * MIB) as i64, 0);
        t.rig.write(t.handle, t.buffer, &write, stream);
        write.buffer_offset_bytes.store((2 * MIB) as i64, Ordering::SeqCst);
        assert_eq!(bytes(&moved), 0, "{slots:?}: held, nothing published yet");
        drop(gate);
        t.rig.sync(stream);
        assert_eq!(bytes(&moved), (40 * MIB) as isize, "{slots:?}: moved");
        assert_eq!(bytes(&shrunk), (20 * MIB) as isize, "{slots:?}: shrunk");
        assert_eq!(bytes(&emptied), 0, "{slots:?}: shrunk to nothing");
        assert_eq!(bytes(&write), (20 * MIB) as isize, "{slots:?}: write");
        let got = t.rig.dev_bytes(t.buffer, 128 * MIB);
        let what = |part: &str| format!("{slots:?}: {part}");
        assert_bytes(&got[..MIB], &old[..MIB], &what("below the moved read"));
        assert_bytes(&got[MIB..41 * MIB], &t.data[..40 * MIB], &what("the moved read"));
        assert_bytes(&got[41 * MIB..64 * MIB], &old[41 * MIB..64 * MIB], &what("between"));
        let shrunk_want = &t.data[4096..4096 + 20 * MIB];
        assert_bytes(&got[64 * MIB..84 * MIB], shrunk_want, &what("the shrunk read"));
        assert_bytes(&got[84 * MIB..], &old[84 * MIB..], &what("past the shrunk read"));
        // The write ran after the moved read: its bound source holds file bytes 1..21 MiB.
        let file = t.file.contents();
        let written = &file[44 * MIB..64 * MIB];
        assert_bytes(written, &t.data[MIB..21 * MIB], &what("the moved write"));
        assert_bytes(&file[..44 * MIB], &t.data[..44 * MIB], &what("the file before it"));
        let copied = stream_copies(&t.rig) - before;
        assert_eq!(copied, 3, "{slots:?}: one read piece and two write pieces");
    }
}

/// `all` through the page cache with writes in pieces of `piece_bytes`
/// (`HIPFILE_STREAM_WRITE_PIECE_KB`; 0: whole).
fn write_pieces_config(piece_bytes: usize) -> Config {
    Config {
        stream_copies: StreamCopies::All,
        stream_copy_slots: StreamCopySlots::Pinned,
        direct: DirectPolicy::Off,
        stream_write_piece_bytes: piece_bytes,
        ..small_config()
    }
}

fn writes_in_pieces(rig: &Rig) -> u64 {
    rig.driver.async_stats().writes_in_pieces.load(Ordering::SeqCst)
}

/// Writes of `sizes` on a stream registered with `flags`, held while they are submitted,
/// each behind the application's own copy of new bytes into its source (a piece written
/// before the stream reached it would write the old ones): nothing is written while the
/// stream is held, then every byte lands and `*bytes_p` holds each whole op. Returns
/// how many went in pieces.
fn held_writes_land(config: Config, flags: u32, sizes: &[usize]) -> u64 {
    let len = 48 * MIB;
    let t = Paused::with(Rig::with(1, config), "write-pieces", len, len);
    let stream = t.rig.registered_stream(flags);
    let fresh = pattern(321, len);
    let before = writes_in_pieces(&t.rig);
    let gate = t.rig.pause(stream).expect("pause");
    let mut placed = Vec::new();
    let mut sources = Vec::new();
    let (mut at, mut file_at) = (0usize, MIB / 2);
    for &size in sizes {
        let staged = t.rig.pinned(size);
        staged.fill(&fresh[at..at + size]);
        // SAFETY: `staged` lives until the stream has run the copy (synchronized below).
        unsafe { t.rig.copy_to_device_on(stream, t.buffer + at as u64, &staged, size) }
            .expect("copy");
        sources.push(staged);
        let p = params(size, file_at as i64, at as i64);
        t.rig.write(t.handle, t.buffer, &p, stream);
        placed.push((p, size, at, file_at));
        at += size + 4096;
        file_at += size + 8192;
    }
    std::thread::sleep(Duration::from_millis(50));
    assert_bytes(&t.file.contents(), &t.data, "nothing written while the stream is held");
    assert!(placed.iter().all(|(p, ..)| bytes(p) == 0), "held: no result yet");
    gate.release();
    t.rig.sync(stream);
    let contents = t.file.contents();
    for (p, size, at, file_at) in &placed {
        assert_eq!(bytes(p), *size as isize, "{size} bytes at file offset {file_at}");
        let what = format!("{size} bytes written at file offset {file_at}");
        assert_bytes(&contents[*file_at..file_at + size], &fresh[*at..at + size], &what);
    }
    let end = placed.last().map_or(0, |&(_, size, _, file_at)| file_at + size);
    assert_bytes(&contents[end..], &t.data[end..], "the file past the writes as it was");
    writes_in_pieces(&t.rig) - before
}

/// `HIPFILE_STREAM_WRITE_PIECE_KB` (1 MiB here; off by default): a fully FIXED write
/// longer than the piece size, copied into its slot on its stream, goes in pieces, each
/// written to the file once the stream copied it: in stream order (after the
/// application's copy queued before it on the held stream), every byte in place, one
/// result for the whole op. A write of exactly one piece goes whole, and so does one
/// whose pieces would leave more than 64 arms waiting on its stream.
#[test]
fn with_all_long_fixed_writes_go_in_pieces_written_once_their_stream_copied_them() {
    let sizes = [16 * MIB, 4 * MIB + 4096, MIB, 3 * MIB, 2 * MIB + 8192];
    let pieces = held_writes_land(write_pieces_config(MIB), 15, &sizes);
    assert_eq!(pieces, 4, "every write longer than a piece");
    // Pieces of 64 KiB: 32 and 16 doorbells for the first two ops; the 16 MiB op would
    // take 256, more than may wait on a stream (its commands could fill CUDA's queue behind
    // the held stream and block the submit call), so it goes whole; a write over 16 MiB
    // (the largest slot) is a long op of 16 MiB pieces.
    let sizes = [2 * MIB, MIB, 16 * MIB, 16 * MIB + 4096];
    let pieces = held_writes_land(write_pieces_config(64 * KIB), 7, &sizes);
    assert_eq!(pieces, 2);
    // Six writes of 16 pieces each on the held stream: four in pieces (64 arms waiting),
    // then whole.
    let pieces = held_writes_land(write_pieces_config(256 * KIB), 15, &[4 * MIB; 6]);
    assert_eq!(pieces, 4, "pieces while at most 64 arms wait on the stream");
}

/// Only writes whose size and both offsets are FIXED go in pieces (the file range must be
/// known before the op's own arm binds it), and none with the setting at 0; they land
/// the same.
#[test]
fn writes_with_a_late_file_offset_or_pieces_off_go_whole() {
    let sizes = [16 * MIB, 3 * MIB];
    // Buffer offset and size FIXED, file offset bound at arm: a slot, no pieces.
    assert_eq!(held_writes_land(write_pieces_config(MIB), 5, &sizes), 0);
    assert_eq!(held_writes_land(write_pieces_config(0), 15, &sizes), 0);
}
