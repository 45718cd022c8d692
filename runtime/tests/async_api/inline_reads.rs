//! Reads done inside the submit call (`runtime/src/async_op/inline_read.rs`,
//! `HIPFILE_INLINE_READ_KB`): small reads on idle streams publish their bytes
//! when the call returns and land in stream order; short reads at the end of the file keep
//! the rest of the destination; every read the call may not take (a held or busy stream,
//! over the cap, the feature off, an unfinished write of ours over the range) takes the
//! ordinary path with the same result.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use hipfile_core::Direction;
use hipfile_runtime::AsyncParams;
use hipfile_runtime::config::Config;

use super::paused::Paused;
use hipfile_test_support::rig::*;

/// A rig whose reads of at most `cap_bytes` may be read inside the submit call.
fn rig(cap_bytes: usize) -> Rig {
    Rig::with(1, Config { inline_read_bytes: cap_bytes, ..small_config() })
}

fn inline_reads(rig: &Rig) -> u64 {
    rig.driver.async_stats().read_at_submission.load(Ordering::SeqCst)
}

fn engine_jobs(rig: &Rig) -> u64 {
    rig.driver.engine().expect("engine").stats().jobs
}

fn read(t: &Paused, p: &Arc<AsyncParams>, stream: hipfile_runtime::device::StreamHandle) {
    t.rig.read(t.handle, t.buffer, p, stream);
}

/// Reads of 1 B to 64 KiB at odd offsets, each on its own idle stream, all submitted
/// before any stream is synchronized: each is read inside its submit call (its byte count
/// is published when the call returns, before the stream ran anything) and no engine job
/// runs for it; a read of 64 KiB + 1 goes the ordinary way. Every byte lands where it
/// should and nothing else is written.
#[test]
fn small_fixed_reads_on_idle_streams_are_read_inside_the_submit_call() {
    for flags in [7u32, 15] {
        let t = Paused::with(rig(64 * KIB), "inline", 2 * MIB, 2 * MIB);
        // Page-aligned inputs (flag 8) take page multiples; the last size of each list is
        // past the cap.
        let sizes: &[usize] = if flags & 8 != 0 {
            &[4096, 8192, 16 * KIB, 64 * KIB, 64 * KIB + 4096]
        } else {
            &[1, 4095, 4096, 5000, 16 * KIB + 1, 64 * KIB, 64 * KIB + 1]
        };
        let (inline_before, jobs_before) = (inline_reads(&t.rig), engine_jobs(&t.rig));
        let placed = t.place_reads(flags, sizes, |i, read| {
            if i + 1 < sizes.len() {
                let what = format!("flags {flags}: published by the call");
                assert_eq!(bytes(&read.params), read.size as isize, "{what}");
            }
        });
        assert_eq!(inline_reads(&t.rig) - inline_before, sizes.len() as u64 - 1, "flags {flags}");
        t.check_placed_reads(&placed, &format!("flags {flags}"));
        // Only the read past the cap went through the engine (its parts: at least one job).
        let jobs = engine_jobs(&t.rig) - jobs_before;
        assert!((1..=4).contains(&jobs), "flags {flags}: {jobs} engine jobs");
    }
}

/// One stream, one read after the other, each synchronized: every read of the stream is
/// read inside its call (the stream is idle again each time), and they land in order
/// over the same destination.
#[test]
fn reads_of_one_stream_synchronized_in_turn_all_go_inside_the_call() {
    let t = Paused::with(rig(64 * KIB), "inline-turns", MIB, MIB);
    let stream = t.rig.registered_stream(7);
    let before = inline_reads(&t.rig);
    for i in 0..64usize {
        let offset = (i * 12_289) % (MIB - 8 * KIB);
        let p = params(8 * KIB, offset as i64, 0);
        read(&t, &p, stream);
        t.rig.sync(stream);
        assert_eq!(bytes(&p), (8 * KIB) as isize);
        let got = t.rig.dev_bytes(t.buffer, 8 * KIB);
        assert_bytes(&got, &t.data[offset..offset + 8 * KIB], &format!("read {i}"));
    }
    assert_eq!(inline_reads(&t.rig) - before, 64);
}

/// A read that comes back short at the end of the file publishes the bytes it read and
/// leaves the destination past them as it was; a read at the end publishes 0 and changes
/// nothing. Both inside their calls (the stream synchronized in between: a stream still
/// running the first copy is busy).
#[test]
fn a_short_read_at_the_end_of_the_file_keeps_the_rest_of_the_destination() {
    let file_len = 100_000;
    let t = Paused::with(rig(64 * KIB), "inline-eof", file_len, MIB);
    let stream = t.rig.registered_stream(7);
    let old = pattern(97, 64 * KIB);
    t.rig.set_dev_bytes(t.buffer, &old);
    let before = inline_reads(&t.rig);
    let tail = params(16 * KIB, (file_len - 5000) as i64, 0);
    let at_end = params(4096, file_len as i64, 32 * KIB as i64);
    read(&t, &tail, stream);
    assert_eq!(bytes(&tail), 5000, "published by the call");
    // The stream is idle again once it ran the first copy.
    t.rig.sync(stream);
    read(&t, &at_end, stream);
    assert_eq!(bytes(&at_end), 0);
    t.rig.sync(stream);
    assert_eq!(inline_reads(&t.rig) - before, 2);
    let got = t.rig.dev_bytes(t.buffer, 64 * KIB);
    assert_bytes(&got[..5000], &t.data[file_len - 5000..], "the bytes the file has");
    assert_bytes(&got[5000..], &old[5000..], "past them: as the destination was");
}

/// Reads the call may not take go the ordinary way, with the same bytes: on a held
/// stream (and the next read of that stream, behind it), past the cap, with the feature
/// off. Reads whose parameters the stream does not fix (flags 0 or 3, an unregistered
/// stream) are taken on an idle stream: it reaches them at once, so they bind in the call.
#[test]
fn reads_the_call_may_not_take_go_the_ordinary_way() {
    let t = Paused::with(rig(64 * KIB), "inline-not", MIB, MIB);
    let n = 16 * KIB;
    let check = |p: &Arc<AsyncParams>, offset: usize, buffer_offset: usize, what: &str| {
        assert_eq!(bytes(p), n as isize, "{what}");
        let got = t.rig.dev_bytes(t.buffer + buffer_offset as u64, n);
        assert_bytes(&got, &t.data[offset..offset + n], what);
    };
    let before = inline_reads(&t.rig);
    // A held stream: the read waits for it (and so does the next one of that stream).
    let held = t.rig.registered_stream(7);
    let gate = t.rig.pause(held).expect("pause");
    let first = params(n, 4096, 0);
    let second = params(n, 8192, n as i64);
    read(&t, &first, held);
    read(&t, &second, held);
    assert_eq!((bytes(&first), bytes(&second)), (0, 0), "held: nothing published yet");
    gate.release();
    t.rig.sync(held);
    check(&first, 4096, 0, "held stream, first read");
    check(&second, 8192, n, "held stream, second read");
    assert_eq!(inline_reads(&t.rig), before, "none of them inside the call");
    // Parameters the stream does not fix, on idle streams: inside the call.
    for (i, flags) in [Some(0u32), Some(3), None].into_iter().enumerate() {
        let stream = t.rig.stream_with(flags);
        let offset = 65_536 + i * 4096;
        let p = params(n, offset as i64, (2 + i) as i64 * n as i64);
        read(&t, &p, stream);
        t.rig.sync(stream);
        check(&p, offset, (2 + i) * n, &format!("flags {flags:?}"));
    }
    assert_eq!(inline_reads(&t.rig), before + 3, "flags not FIXED, idle streams");
    // Past the cap, and with the feature off.
    for (cap, size) in [(4 * KIB, 8 * KIB), (0, 4 * KIB)] {
        let t = Paused::with(rig(cap), "inline-cap", MIB, MIB);
        let stream = t.rig.registered_stream(7);
        let p = params(size, 12_288, 0);
        read(&t, &p, stream);
        t.rig.sync(stream);
        assert_eq!(bytes(&p), size as isize);
        let got = t.rig.dev_bytes(t.buffer, size);
        assert_bytes(&got, &t.data[12_288..12_288 + size], &format!("cap {cap}"));
        assert_eq!(inline_reads(&t.rig), 0, "cap {cap}: {size} bytes go the ordinary way");
    }
}

/// An unfinished async write of ours over the range (its stream held) keeps a read on
/// another, idle stream out of the submit call; a read of a range the write does not
/// touch is still read inside its call. Once the write's stream runs, a read of its range
/// sees the written bytes (inside its call again: nothing unfinished any more).
#[test]
fn an_unfinished_write_over_the_range_keeps_the_read_out_of_the_call() {
    let t = Paused::with(rig(64 * KIB), "inline-hazard", MIB, MIB);
    let rig = &t.rig;
    let (writer, reader) = (rig.registered_stream(7), rig.registered_stream(7));
    let source = rig.alloc(32 * KIB);
    let written = pattern(41, 32 * KIB);
    rig.set_dev_bytes(source, &written);
    let gate = rig.pause(writer).expect("pause");
    let w = params(32 * KIB, 64 * KIB as i64, 0);
    rig.submit(Direction::Write, t.handle, source, &w, writer).expect("write accepted");
    let before = inline_reads(rig);
    let overlapping = params(8 * KIB, 90 * KIB as i64, 0);
    read(&t, &overlapping, reader);
    rig.sync(reader);
    assert_eq!(inline_reads(rig), before, "overlapping an unfinished write");
    assert_eq!(bytes(&overlapping), (8 * KIB) as isize);
    let apart = params(8 * KIB, 512 * KIB as i64, 16 * KIB as i64);
    read(&t, &apart, reader);
    assert_eq!(inline_reads(rig), before + 1, "a range the write does not touch");
    rig.sync(reader);
    gate.release();
    rig.sync(writer);
    assert_eq!(bytes(&w), (32 * KIB) as isize);
    wait_until("the write to leave the hazard table", || {
        let after = params(32 * KIB, 64 * KIB as i64, 64 * KIB as i64);
        let taken = inline_reads(rig);
        read(&t, &after, reader);
        rig.sync(reader);
        assert_eq!(bytes(&after), (32 * KIB) as isize);
        let got = rig.dev_bytes(t.buffer + 64 * KIB as u64, 32 * KIB);
        assert_bytes(&got, &written, "the written bytes");
        inline_reads(rig) > taken
    });
}
