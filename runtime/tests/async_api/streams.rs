//! Stream order and concurrency: FIFO execution on one stream (behaviour.md §5.2 A9),
//! other stream work (host functions, copies, memsets) ordered around our ops, several
//! streams into one buffer (DESIGN.md "Decided behaviour": correct data, always),
//! registration while ops are in flight, and large ops fanned out over executors.

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use hipfile_core::Direction;
use hipfile_runtime::config::{Config, StreamCopies, StreamCopySlots};
use hipfile_runtime::device::StreamHandle;
use hipfile_runtime::file::DirectPolicy;
use hipfile_runtime::{AsyncParams, HandleId};
use hipfile_test_support::rig::*;

/// The A9 op count: hipFile's 127 on `cpu`; 40 on a GPU backend, where an enqueue
/// blocks once about 55 of our ops wait behind a held stream (the submitting thread holds
/// the gate, so it would never return).
fn op_count() -> usize {
    if on_cpu() { 127 } else { 40 }
}
const OP_BYTES: usize = 16 * KIB;
const STEP: usize = 8 * KIB;

/// One A9 op: its own offsets and result, sharing `size` with the others.
fn a9_args(size: &AsyncParams, own: &AsyncParams) -> AsyncArgs {
    AsyncArgs { size_p: size.size_bytes.as_ptr(), ..args_of(own) }
}

/// Submits the [`op_count`] A9 ops on a held `stream` (raw form), releases it, waits, and
/// checks every `*bytes_p`.
fn a9_run(
    rig: &Rig,
    direction: Direction,
    handle: HandleId,
    buffer: u64,
    stream: StreamHandle,
    offsets: &[(i64, i64)],
) {
    let size = AsyncParams::new(OP_BYTES, 0);
    let ops: Vec<Arc<AsyncParams>> = offsets
        .iter()
        .map(|&(file, buffer)| {
            let p = AsyncParams::new(0, file);
            p.buffer_offset_bytes.store(buffer, Ordering::SeqCst);
            p
        })
        .collect();
    let gate = rig.pause(stream).expect("pause");
    for op in &ops {
        let args = a9_args(&size, op);
        // SAFETY: `size` and `ops` outlive the ops (the stream is synchronized below,
        // and `ops` is never resized); the buffer lives as long as the device.
        let result = unsafe { submit_args(&rig.driver, direction, handle, buffer, args, stream) };
        result.expect("A9 op accepted");
    }
    gate.release();
    rig.sync(stream);
    for (i, op) in ops.iter().enumerate() {
        assert_eq!(bytes(op), OP_BYTES as isize, "A9 {direction:?} op {i}");
    }
}

#[test]
fn a9_fifo_reads_at_overlapping_buffer_offsets() {
    // Op i reads file[16K·i..+16K] into buffer[8K·i..+16K]: each op overwrites the second
    // half of the previous one, so only FIFO execution leaves buffer chunk j = the first
    // half of op j's data.
    for flags in [Some(0), None, Some(3)] {
        let rig = Rig::new();
        let data = pattern(21, op_count() * OP_BYTES);
        let file = TempFile::new("a9r", &data);
        let fd = file.open_rw();
        let handle = rig.register(&fd);
        let buffer_len = (op_count() + 1) * STEP;
        let buffer = rig.alloc(buffer_len);
        let stream = rig.stream_with(flags);
        let offsets: Vec<(i64, i64)> =
            (0..op_count()).map(|i| ((i * OP_BYTES) as i64, (i * STEP) as i64)).collect();
        a9_run(&rig, Direction::Read, handle, buffer, stream, &offsets);
        let mut want = Vec::with_capacity(buffer_len);
        for j in 0..op_count() {
            want.extend_from_slice(&data[j * OP_BYTES..j * OP_BYTES + STEP]);
        }
        want.extend_from_slice(&data[(op_count() - 1) * OP_BYTES + STEP..op_count() * OP_BYTES]);
        assert_bytes(&rig.dev_bytes(buffer, buffer_len), &want, &format!("A9 reads {flags:?}"));
    }
}

#[test]
fn a9_fifo_writes_at_overlapping_file_offsets() {
    // Op i writes buffer[16K·i..+16K] to file[8K·i..+16K].
    for flags in [Some(0), None, Some(3)] {
        let rig = Rig::new();
        let file_len = (op_count() + 1) * STEP;
        let file = TempFile::new("a9w", &vec![0; file_len]);
        let fd = file.open_rw();
        let handle = rig.register(&fd);
        let source = pattern(22, op_count() * OP_BYTES);
        let buffer = rig.alloc(op_count() * OP_BYTES);
        rig.set_dev_bytes(buffer, &source);
        let stream = rig.stream_with(flags);
        let offsets: Vec<(i64, i64)> =
            (0..op_count()).map(|i| ((i * STEP) as i64, (i * OP_BYTES) as i64)).collect();
        a9_run(&rig, Direction::Write, handle, buffer, stream, &offsets);
        let mut want = Vec::with_capacity(file_len);
        for j in 0..op_count() {
            want.extend_from_slice(&source[j * OP_BYTES..j * OP_BYTES + STEP]);
        }
        want.extend_from_slice(&source[(op_count() - 1) * OP_BYTES + STEP..op_count() * OP_BYTES]);
        assert_bytes(&file.contents(), &want, &format!("A9 writes {flags:?}"));
    }
}

#[test]
fn a9_shared_size_changed_while_held_applies_to_every_unfixed_op() {
    // The ops share one size variable: shrinking it while the stream is held changes
    // every op (flags 0), none (FIXED_FILE_SIZE).
    for (flags, want) in [(0u32, 12 * KIB), (4, OP_BYTES)] {
        let rig = Rig::new();
        let data = pattern(23, op_count() * OP_BYTES);
        let file = TempFile::new("a9s", &data);
        let fd = file.open_rw();
        let handle = rig.register(&fd);
        let buffer = rig.alloc(op_count() * OP_BYTES);
        let stream = rig.registered_stream(flags);
        let size = AsyncParams::new(OP_BYTES, 0);
        let ops: Vec<Arc<AsyncParams>> = (0..op_count())
            .map(|i| {
                let p = AsyncParams::new(0, (i * OP_BYTES) as i64);
                p.buffer_offset_bytes.store((i * OP_BYTES) as i64, Ordering::SeqCst);
                p
            })
            .collect();
        let gate = rig.pause(stream).expect("pause");
        for op in &ops {
            // SAFETY: as in `a9_run`.
            unsafe {
                submit_args(
                    &rig.driver,
                    Direction::Read,
                    handle,
                    buffer,
                    a9_args(&size, op),
                    stream,
                )
            }
            .expect("accepted");
        }
        size.size_bytes.store(12 * KIB, Ordering::SeqCst);
        gate.release();
        rig.sync(stream);
        let got = rig.dev_bytes(buffer, op_count() * OP_BYTES);
        for (i, op) in ops.iter().enumerate() {
            assert_eq!(bytes(op), want as isize, "flags {flags} op {i}");
            let at = i * OP_BYTES;
            assert_bytes(&got[at..at + want], &data[at..at + want], "op data");
            assert_all(&got[at + want..at + OP_BYTES], 0, "beyond the bound size");
        }
    }
}

/// What a host function saw: `*bytes_p` and the bytes it read.
type Seen = Arc<Mutex<Option<(isize, Vec<u8>)>>>;

#[test]
fn host_function_after_an_op_sees_its_result() {
    for flags in [None, Some(0), Some(7), Some(15)] {
        let rig = Rig::new();
        let data = pattern(24, MIB);
        let file = TempFile::new("hostfn", &data);
        let fd = file.open_rw();
        let handle = rig.register(&fd);
        let buffer = rig.alloc(MIB);
        let stream = rig.stream_with(flags);
        let gate = rig.pause(stream).expect("pause");
        let mut snapshots = Vec::new();
        let read = params(512 * KIB, 4096, 0);
        rig.read(handle, buffer, &read, stream);
        let seen: Seen = Arc::default();
        {
            // The device memory as the stream has it right after the read (a host
            // function must not call the device API on a GPU).
            // SAFETY: the closure below holds a clone of the snapshot until it has run,
            // after the copy.
            let snapshot = unsafe { rig.snapshot(stream, buffer, 512 * KIB) };
            let (read, seen, keep) = (Arc::clone(&read), Arc::clone(&seen), Arc::clone(&snapshot));
            let observe = move || {
                let got = keep.bytes(512 * KIB);
                *seen.lock().expect("lock") = Some((bytes(&read), got));
                // `keep` is dropped here, but `snapshot` (below) still owns the memory:
                // no device call happens in the host function.
            };
            rig.launch(stream, observe).expect("host closure");
            snapshots.push(snapshot);
        }
        // A write, then a host function that reads the file.
        let source = rig.alloc(256 * KIB);
        let written = pattern(25, 256 * KIB);
        rig.set_dev_bytes(source, &written);
        let write = params(256 * KIB, (MIB - 256 * KIB) as i64, 0);
        rig.write(handle, source, &write, stream);
        let file_seen: Seen = Arc::default();
        {
            let (write, file_seen, path) =
                (Arc::clone(&write), Arc::clone(&file_seen), file.path.clone());
            let observe = move || {
                let contents = std::fs::read(&path).expect("read file");
                *file_seen.lock().expect("lock") = Some((bytes(&write), contents));
            };
            rig.launch(stream, observe).expect("host closure");
        }
        assert!(seen.lock().expect("lock").is_none(), "host function ran before the gate");
        gate.release();
        rig.sync(stream);
        let (n, got) = seen.lock().expect("lock").take().expect("host function ran");
        assert_eq!(n, (512 * KIB) as isize, "flags {flags:?}: final bytes seen by the host fn");
        assert_bytes(&got, &data[4096..4096 + 512 * KIB], "data seen by the host function");
        let (n, contents) = file_seen.lock().expect("lock").take().expect("ran");
        assert_eq!(n, (256 * KIB) as isize, "flags {flags:?}: write bytes seen");
        assert_bytes(&contents[MIB - 256 * KIB..], &written, "file seen by the host function");
        drop(snapshots);
    }
}

#[test]
fn copy_after_a_read_copies_the_read_data() {
    for flags in [None, Some(0), Some(7)] {
        let rig = Rig::new();
        let data = pattern(26, MIB);
        let file = TempFile::new("memcpy", &data);
        let fd = file.open_rw();
        let handle = rig.register(&fd);
        let buffer = rig.alloc(MIB);
        let copy = rig.alloc(MIB);
        let host = rig.pinned(MIB);
        let stream = rig.stream_with(flags);
        let gate = rig.pause(stream).expect("pause");
        let p = params(MIB - 1, 1, 0);
        rig.read(handle, buffer, &p, stream);
        // Device to device through pinned staging (UserDevice has no d2d copy), all
        // ordered on `stream` after the read; then device to host.
        let staging = rig.pinned(MIB);
        // SAFETY: `copy`, `staging` and `host` are the test's, untouched by anything else
        // and kept alive until the stream is synchronized; `buffer` is only written by the
        // read before them.
        unsafe {
            rig.copy_from_device_on(stream, &staging, buffer, MIB).expect("copy d2h (staging)");
            rig.copy_to_device_on(stream, copy, &staging, MIB).expect("copy h2d (staging)");
            rig.copy_from_device_on(stream, &host, buffer, MIB).expect("copy d2h");
        }
        gate.release();
        rig.sync(stream);
        assert_eq!(bytes(&p), (MIB - 1) as isize);
        let got = rig.dev_bytes(copy, MIB - 1);
        assert_bytes(&got, &data[1..], &format!("device copy after the read, flags {flags:?}"));
        // The stream that wrote `host` is synchronized.
        assert_bytes(&host.bytes(MIB - 1), &data[1..], "host copy after the read");
    }
}

#[test]
fn write_after_a_memset_writes_the_memset_bytes() {
    for flags in [None, Some(0), Some(7)] {
        let rig = Rig::new();
        let file = TempFile::new("memset", &vec![0; MIB]);
        let fd = file.open_rw();
        let handle = rig.register(&fd);
        let buffer = rig.alloc(MIB);
        rig.set_dev_bytes(buffer, &pattern(27, MIB));
        let stream = rig.stream_with(flags);
        let gate = rig.pause(stream).expect("pause");
        // SAFETY: `buffer` is the test's; the memset and the write are ordered on `stream`.
        unsafe { rig.memset_on(stream, buffer, 0xa5, MIB) }.expect("memset");
        let p = params(MIB, 0, 0);
        rig.write(handle, buffer, &p, stream);
        // And a memset after the write must not leak into it.
        // SAFETY: as above.
        unsafe { rig.memset_on(stream, buffer, 0x11, MIB) }.expect("memset");
        gate.release();
        rig.sync(stream);
        assert_eq!(bytes(&p), MIB as isize);
        assert_all(&file.contents(), 0xa5, &format!("write ordered between memsets, {flags:?}"));
    }
}

/// Stream `k` of `n` moves its own slice: buffer slice `k` ⇄ file slice `n-1-k`. Flags
/// cycle through unregistered, 0, 7 and 15; streams without PAGE_ALIGNED use unaligned
/// op boundaries and leave a few bytes of their slice untouched.
fn many_streams_one_buffer(n: usize, direction: Direction) {
    const TOTAL: usize = 4 * MIB;
    // Writes with unaligned boundaries use buffered I/O only for now (see
    // `unaligned_write_config`); reads keep O_DIRECT.
    let rig = match direction {
        Direction::Read => Rig::new(),
        Direction::Write => Rig::with(1, unaligned_write_config()),
    };
    let slice = TOTAL / n;
    let data = pattern(30 + n as u64, TOTAL);
    let (file_init, buffer_init) = match direction {
        Direction::Read => (data.clone(), vec![0; TOTAL]),
        Direction::Write => (vec![0; TOTAL], data.clone()),
    };
    let file = TempFile::new("streams", &file_init);
    let fd = file.open_rw();
    let handle = rig.register(&fd);
    let buffer = rig.alloc(TOTAL);
    rig.set_dev_bytes(buffer, &buffer_init);
    let flag_cycle = [None, Some(0), Some(7), Some(15)];
    let mut streams = Vec::new();
    let mut ops = Vec::new();
    let mut want = match direction {
        Direction::Read => vec![0; TOTAL],
        Direction::Write => vec![0; TOTAL],
    };
    // Every stream is made before any is held: on CUDA, cuStreamCreate can wait for the
    // context's held streams (README "Known limits").
    let made: Vec<StreamHandle> =
        (0..n).map(|k| rig.stream_with(flag_cycle[k % flag_cycle.len()])).collect();
    for (k, &stream) in made.iter().enumerate() {
        let flags = flag_cycle[k % flag_cycle.len()];
        let gate = rig.pause(stream).expect("pause");
        let aligned = flags.is_some_and(|f| f & 8 != 0);
        let (buffer_start, file_start) = (k * slice, (n - 1 - k) * slice);
        let cuts = if aligned { [0, slice / 2, slice] } else { [1, slice / 2 + 3, slice - 5] };
        for pair in cuts.windows(2) {
            let (from, to) = (pair[0], pair[1]);
            let p = params(to - from, (file_start + from) as i64, (buffer_start + from) as i64);
            rig.submit(direction, handle, buffer, &p, stream).expect("accepted");
            let (target, source) = match direction {
                Direction::Read => (buffer_start, file_start),
                Direction::Write => (file_start, buffer_start),
            };
            want[target + from..target + to].copy_from_slice(&data[source + from..source + to]);
            ops.push((k, p, to - from));
        }
        streams.push((stream, gate));
    }
    let streams: Vec<StreamHandle> = streams
        .into_iter()
        .map(|(stream, gate)| {
            gate.release();
            stream
        })
        .collect();
    for &stream in &streams {
        rig.sync(stream);
    }
    for (k, p, n_bytes) in &ops {
        assert_eq!(bytes(p), *n_bytes as isize, "{n} streams, stream {k}");
    }
    let got = match direction {
        Direction::Read => rig.dev_bytes(buffer, TOTAL),
        Direction::Write => file.contents(),
    };
    assert_bytes(&got, &want, &format!("{n} streams, {direction:?}"));
}

#[test]
fn one_stream_into_one_buffer() {
    many_streams_one_buffer(1, Direction::Read);
    many_streams_one_buffer(1, Direction::Write);
}

#[test]
fn two_streams_into_one_buffer() {
    many_streams_one_buffer(2, Direction::Read);
    many_streams_one_buffer(2, Direction::Write);
}

#[test]
fn eight_streams_into_one_buffer() {
    many_streams_one_buffer(8, Direction::Read);
    many_streams_one_buffer(8, Direction::Write);
}

#[test]
fn sixteen_streams_into_one_buffer() {
    many_streams_one_buffer(16, Direction::Read);
    many_streams_one_buffer(16, Direction::Write);
}

#[test]
fn deregister_a_stream_with_ops_in_flight() {
    // hipFile: deregistration only removes the map entry; ops in flight complete.
    for flags in [0u32, 7, 15] {
        let rig = Rig::new();
        let data = pattern(40, MIB);
        let file = TempFile::new("dereg-stream", &data);
        let fd = file.open_rw();
        let handle = rig.register(&fd);
        let buffer = rig.alloc(MIB);
        let stream = rig.registered_stream(flags);
        let gate = rig.pause(stream).expect("pause");
        let ops: Vec<_> = (0..4)
            .map(|i| params(256 * KIB, (i * 256 * KIB) as i64, (i * 256 * KIB) as i64))
            .collect();
        for p in &ops {
            rig.read(handle, buffer, p, stream);
        }
        rig.driver.stream_deregister(stream).expect("deregister with ops queued");
        // The stream is unregistered now: registering it again works, and a second
        // deregistration fails.
        assert_eq!(code(rig.driver.stream_deregister(stream)), hipfile_core::OpError::InvalidValue);
        gate.release();
        rig.sync(stream);
        for (i, p) in ops.iter().enumerate() {
            assert_eq!(bytes(p), (256 * KIB) as isize, "flags {flags} op {i}");
        }
        assert_bytes(&rig.dev_bytes(buffer, MIB), &data, "data after deregistration");
        // Reused unregistered, then registered again: both work and stay in order with
        // the earlier ops.
        let after = params(4096, 0, 0);
        rig.write(handle, buffer + (MIB - 4096) as u64, &after, stream);
        rig.driver.stream_register(stream, flags).expect("register again");
        let again = params(4096, 0, 0);
        rig.read(handle, buffer, &again, stream);
        rig.sync(stream);
        assert_eq!((bytes(&after), bytes(&again)), (4096, 4096));
        let contents = file.contents();
        assert_bytes(&contents[..4096], &data[MIB - 4096..], "write after deregistration");
        assert_bytes(&rig.dev_bytes(buffer, 4096), &data[MIB - 4096..], "read after re-register");
    }
}

#[test]
fn ops_from_several_threads_on_one_stream_keep_submission_order() {
    // Four threads submit to one stream, each op recording (in a host
    // function right after it) a ticket: the tickets must come in the order the ops were
    // enqueued, and each op must be complete when its host function runs.
    let rig = Arc::new(Rig::new());
    let data = pattern(41, MIB);
    let file = TempFile::new("threads", &data);
    let fd = file.open_rw();
    let handle = rig.register(&fd);
    let buffer = rig.alloc(MIB);
    let stream = rig.registered_stream(0);
    let order: Arc<Mutex<Vec<(usize, isize)>>> = Arc::default();
    let submit_lock = Arc::new(Mutex::new(0usize));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let (rig, order, submit_lock) =
                (Arc::clone(&rig), Arc::clone(&order), Arc::clone(&submit_lock));
            std::thread::spawn(move || {
                for i in 0..16 {
                    let slot = t * 16 + i;
                    let p = params(16 * KIB, (slot * 16 * KIB) as i64, (slot * 16 * KIB) as i64);
                    // The lock makes "op then its host function" atomic against the other
                    // threads, so the expected order is the order of lock acquisition.
                    let mut seq = submit_lock.lock().expect("lock");
                    let ticket = *seq;
                    *seq += 1;
                    rig.read(handle, buffer, &p, stream);
                    let order = Arc::clone(&order);
                    rig.launch(stream, move || {
                        order.lock().expect("lock").push((ticket, bytes(&p)));
                    })
                    .expect("closure");
                    drop(seq);
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("submitter");
    }
    rig.sync(stream);
    let order = order.lock().expect("lock");
    assert_eq!(order.len(), 64);
    for (i, &(ticket, n)) in order.iter().enumerate() {
        assert_eq!(ticket, i, "host functions ran in enqueue order");
        assert_eq!(n, (16 * KIB) as isize, "op {ticket} complete before its host function");
    }
    assert_bytes(&rig.dev_bytes(buffer, MIB), &data, "all slots read");
}

/// 32 MiB in 256 KiB chunks over 2 executors (request_parallelism 2), on the engine's path
/// (`HIPFILE_STREAM_COPIES=off`: under `all` such ops go in pieces, `pieces.rs`). Reads
/// fan out; writes fan out only where the file has an O_DIRECT descriptor (through the
/// page cache, writes to one file queue for its inode lock: `Engine::parts`), so a handle
/// registered with O_DIRECT off writes each op as one job.
#[test]
fn large_ops_fan_out_and_are_verified() {
    const LARGE: usize = 32 * MIB;
    let rig = Rig::with(1, Config { stream_copies: StreamCopies::Off, ..small_config() });
    assert_eq!(rig.driver.config().request_parallelism, 2);
    let data = pattern(50, LARGE + 4096);
    let file = TempFile::new("large", &data);
    let jobs = |rig: &Rig| rig.driver.engine().expect("engine").stats().jobs;
    for policy in [None, Some(DirectPolicy::Off)] {
        let fd = file.open_rw();
        let handle = match policy {
            None => rig.register(&fd),
            Some(policy) => rig.driver.handle_register_with(fd.as_raw_fd(), policy).unwrap(),
        };
        let has_direct = rig.driver.file(handle).unwrap().direct_fd().is_some();
        assert!(policy.is_none() || !has_direct, "O_DIRECT off: no O_DIRECT descriptor");
        let buffer = rig.alloc(LARGE);
        for flags in [0u32, 7] {
            let what = format!("policy {policy:?}, flags {flags}");
            let stream = rig.registered_stream(flags);
            rig.set_dev_bytes(buffer, &vec![0; LARGE]);
            // The previous round wrote the file: a prefetch (flags 7) of a file changed
            // in the last 30 ms is read again in stream order, as parts of its own.
            hipfile_test_support::let_file_changes_settle();
            let before = jobs(&rig);
            let want = file.contents();
            let p = params(LARGE, 4096, 0);
            rig.read(handle, buffer, &p, stream);
            rig.sync(stream);
            assert_eq!(bytes(&p), LARGE as isize, "{what}");
            assert_bytes(&rig.dev_bytes(buffer, LARGE), &want[4096..], &format!("read, {what}"));
            // The op is split in two parts, one per executor (a prefetching read too:
            // each part waits at the gate for the stream).
            let parts = 2;
            wait_until("the read's jobs to finish", || jobs(&rig) - before >= parts);
            assert_eq!(jobs(&rig) - before, parts, "{what}: jobs of the read");

            let source = pattern(51 + u64::from(flags), LARGE);
            rig.set_dev_bytes(buffer, &source);
            let before = jobs(&rig);
            let p = params(LARGE, 0, 0);
            rig.write(handle, buffer, &p, stream);
            rig.sync(stream);
            assert_eq!(bytes(&p), LARGE as isize, "write, {what}");
            let contents = file.contents();
            assert_bytes(&contents[..LARGE], &source, &format!("write, {what}"));
            assert_bytes(&contents[LARGE..], &data[LARGE..], "past the write");
            let parts = if has_direct { 2 } else { 1 };
            wait_until("the write's jobs to finish", || jobs(&rig) - before >= parts);
            // Give a second job time to show up where one is expected.
            std::thread::sleep(std::time::Duration::from_millis(20));
            assert_eq!(jobs(&rig) - before, parts, "{what}: jobs of the write");
        }
        rig.driver.handle_deregister(handle);
    }
}

/// An application thread that makes streams while ops of ours hold other streams is never
/// stuck for good. On CUDA, `cuStreamCreate` in a context of about 35 streams waits for the
/// context's streams held on wait-values (ours, until their data is in) and meanwhile can
/// hold a lock that pinned allocations, stream creation and (seen once) the engine's copy
/// into the application's memory also take (`tests/gpu/cuda_lock_probe.c`; found as a hang
/// of a whole test binary in one process). So the engine makes what its data path needs
/// when it starts (the fallback pool, each executor's stream, events, device scratch).
/// This runs the default configuration (on CUDA: reads and FIXED writes copied on their
/// own streams, reads over 64 KiB through device slots); the engine's own path is
/// [`streams_made_while_engine_path_ops_hold_streams`]. On the cpu device stream creation
/// never waits, and the test checks the data and that the pool was allocated at the start
/// and never grew.
#[test]
fn streams_made_while_ops_hold_streams() {
    let flags = [None, Some(0), Some(7), Some(15)];
    streams_made_during(Rig::new(), Direction::Read, 4, 256 * KIB, flags);
    streams_made_during(Rig::new(), Direction::Write, 4, 256 * KIB, flags);
}

/// The same on the engine's path (`HIPFILE_STREAM_COPIES=off`). **Open on CUDA** (README
/// "Known limits"): the copy into the application's buffer waits for the lock that the
/// blocked `cuStreamCreate` holds, so this hangs there; it is the control of the lock
/// checks (`tests/gpu/lock-checks.sh`).
#[test]
fn streams_made_while_engine_path_ops_hold_streams() {
    let off = || Rig::with(1, Config { stream_copies: StreamCopies::Off, ..small_config() });
    let flags = [None, Some(0), Some(7), Some(15)];
    streams_made_during(off(), Direction::Read, 4, 256 * KIB, flags);
    streams_made_during(off(), Direction::Write, 4, 256 * KIB, flags);
}

/// Writes alone on the engine's path (`HIPFILE_STREAM_COPY_WRITES=off`, or
/// `HIPFILE_STREAM_COPIES=off`): its copies come *out of* the application's memory (device
/// → pinned staging on an engine stream). **Open on CUDA**, as for reads: on an H100
/// (thirty-first session) those copies wait for the lock a blocked `cuStreamCreate` holds
/// just as copies into the application's memory do (`tests/gpu/cuda_lock_probe.c` probes
/// 16 and 17), and this hangs (README "Known limits"). A control of
/// `tests/gpu/lock-checks.sh`; the GPU suite runs it apart, as known open.
#[test]
fn streams_made_while_engine_path_writes_hold_streams() {
    let off = Rig::with(1, Config { stream_copies: StreamCopies::Off, ..small_config() });
    let flags = [None, Some(0), Some(7), Some(15)];
    streams_made_during(off, Direction::Write, 4, 256 * KIB, flags);
}

/// The same with reads copied on their own streams (`HIPFILE_STREAM_COPIES=all`: streams
/// with a FIXED destination range, reads staged at submission (flags 15, 7) or read when
/// the stream reaches them (5, 13: the file offset binds late)): their release is a host
/// write, no CUDA call, so nothing a blocked `cuStreamCreate` holds can stop it. Every op
/// must have been copied on its stream.
#[test]
fn streams_made_while_reads_copied_on_their_streams_hold_streams() {
    let rig = Rig::with(
        1,
        Config {
            stream_copies: StreamCopies::All,
            stream_copy_slots: StreamCopySlots::Pinned,
            ..small_config()
        },
    );
    let flags = [Some(15), Some(5), Some(7), Some(13)];
    let copies = streams_made_during(rig, Direction::Read, 4, 256 * KIB, flags);
    assert_eq!(copies, 8 * 4 * 6, "every read copied on its own stream");
}

/// The same with reads of 256 KiB in slots of the engine's device memory
/// (`HIPFILE_STREAM_COPY_SLOTS=device`): the engine fills the slot through its staging and
/// a copy into its own memory, the stream copies device → device behind the op's wait, and
/// the release is a host write once the fill completed. Every read must have been copied
/// on its stream.
#[test]
fn streams_made_while_reads_copied_from_device_slots_hold_streams() {
    let config = Config {
        stream_copies: StreamCopies::All,
        stream_copy_slots: hipfile_runtime::config::StreamCopySlots::Device,
        ..small_config()
    };
    let flags = [Some(15), Some(5), Some(7), Some(13)];
    let copies = streams_made_during(Rig::with(1, config), Direction::Read, 4, 256 * KIB, flags);
    assert_eq!(copies, 8 * 4 * 6, "every read copied on its own stream");
}

/// The same with 16 MiB reads past a 128 MiB cap of device slots (room for one per
/// stream) that share their stream's slot (`HIPFILE_STREAM_COPY_DEVICE_FULL=share`): a
/// shared read is filled only after the earlier read's copy ran on the stream, at the
/// latest at its own arm, so the stream waits on nothing but its own doorbell while
/// another thread makes streams.
#[test]
fn streams_made_while_reads_share_their_streams_device_slots_hold_streams() {
    let config = Config {
        stream_copies: StreamCopies::All,
        stream_copy_slots: StreamCopySlots::Device,
        stream_copy_device_cap_bytes: 128 * MIB,
        stream_copy_device_full: hipfile_runtime::config::DeviceSlotsFull::Share,
        ..small_config()
    };
    let rig = Rig::with(1, config);
    let driver = Arc::clone(&rig.driver);
    let copies = streams_made_during(rig, Direction::Read, 2, 16 * MIB, [Some(15); 4]);
    assert_eq!(copies, 8 * 2 * 6, "every read copied on its own stream");
    // Each round submits every stream's first read before its second: the second shares.
    let shared = driver.reads_sharing_device_slots();
    assert!(shared >= 24, "most second reads shared their stream's slot ({shared})");
}

/// The same with fully FIXED writes of 4 MiB copied on their stream in 1 MiB pieces
/// (`HIPFILE_STREAM_WRITE_PIECE_KB=1024`), each piece written once its own
/// doorbell rang: the op's release still waits only for host work (its pieces' writes)
/// and its own doorbell, behind every copy of the op.
#[test]
fn streams_made_while_writes_in_pieces_hold_streams() {
    let rig = Rig::with(
        1,
        Config {
            stream_copies: StreamCopies::All,
            stream_copy_slots: StreamCopySlots::Pinned,
            direct: DirectPolicy::Off,
            stream_write_piece_bytes: 1 << 20,
            ..small_config()
        },
    );
    let driver = Arc::clone(&rig.driver);
    let flags = [Some(15), Some(7), Some(15), Some(7)];
    let copies = streams_made_during(rig, Direction::Write, 2, 4 << 20, flags);
    assert_eq!(copies, 8 * 2 * 6, "every write copied on its own stream");
    let pieces = driver.async_stats().writes_in_pieces.load(Ordering::SeqCst);
    assert_eq!(pieces, 8 * 2 * 6, "every write in pieces");
}

/// The same with writes whose bytes their stream copies into a slot ahead of their
/// doorbell (`HIPFILE_STREAM_COPIES=all`, buffer offset and size FIXED).
#[test]
fn streams_made_while_writes_copied_into_slots_hold_streams() {
    let rig = Rig::with(
        1,
        Config {
            stream_copies: StreamCopies::All,
            stream_copy_slots: StreamCopySlots::Pinned,
            ..small_config()
        },
    );
    let flags = [Some(15), Some(5), Some(7), Some(13)];
    let copies = streams_made_during(rig, Direction::Write, 4, 256 * KIB, flags);
    assert_eq!(copies, 8 * 4 * 6, "every write copied into a slot on its own stream");
}

/// The same on streams that fix no device range (unregistered, flags 0, 2, 8): with
/// `HIPFILE_STREAM_COPIES=all` each op takes a slot for the range it was submitted with
/// and keeps it (its parameters do not move), so these too release with no CUDA call.
#[test]
fn streams_made_while_unfixed_ops_copied_on_their_streams_hold_streams() {
    let flags = [None, Some(0), Some(2), Some(8)];
    for direction in [Direction::Read, Direction::Write] {
        let rig = Rig::with(
            1,
            Config {
                stream_copies: StreamCopies::All,
                stream_copy_slots: StreamCopySlots::Pinned,
                ..small_config()
            },
        );
        let copies = streams_made_during(rig, direction, 4, 256 * KIB, flags);
        assert_eq!(copies, 8 * 4 * 6, "{direction:?}: every op copied on its stream");
    }
}

/// The same with ops of 24 MiB, copied on their streams in pieces sharing rings of slots
/// (`HIPFILE_STREAM_COPIES=all`, `async_op/pieces.rs`): reads and writes, fully FIXED and
/// with a late file offset. Every piece must have been copied on its stream.
#[test]
fn streams_made_while_long_ops_copied_in_pieces_hold_streams() {
    long_ops_in_pieces_while_streams_are_made([Some(15), Some(5), Some(7), Some(13)]);
}

/// The same with ops of 24 MiB on streams that fix no device range (unregistered, flags
/// 0, 2, 8): since the thirty-third session their pieces are copied on their streams like
/// a FIXED range's (until then they took the engine's path, which hangs here on CUDA).
#[test]
fn streams_made_while_unfixed_long_ops_copied_in_pieces_hold_streams() {
    long_ops_in_pieces_while_streams_are_made([None, Some(0), Some(2), Some(8)]);
}

/// Reads and writes of 24 MiB on streams of `flags` while streams are made: every piece
/// of every op copied on its stream.
fn long_ops_in_pieces_while_streams_are_made(flags: [Option<u32>; 4]) {
    // Room for two rounds of rings (8 ops × 2 slots of 16 MiB each): a write's ring goes
    // back when its op is dropped, which may come just after its stream synchronized,
    // and an op finding no ring would take the engine's path (seen once: 94 of 96).
    let config = Config {
        stream_copies: StreamCopies::All,
        stream_copy_slots: StreamCopySlots::Pinned,
        stream_copy_cap_bytes: 512 * MIB,
        ..small_config()
    };
    for direction in [Direction::Read, Direction::Write] {
        let copies =
            streams_made_during(Rig::with(1, config.clone()), direction, 1, 24 * MIB, flags);
        assert_eq!(copies, 8 * 6 * 2, "{direction:?}: both pieces of every op");
    }
}

/// The same with a small slot cap (32 MiB of each large size: two 16 MiB slots, room for
/// eight streams' spares) and ops of 16 MiB: nearly every op finds no slot of its own and
/// goes through its stream's spare slots in 4 MiB pieces (`HIPFILE_STREAM_COPIES=all`,
/// `async_op/slots.rs`), reads and writes, fully FIXED and with a late file offset. None
/// may take the engine's path.
#[test]
fn streams_made_while_ops_through_spare_slots_hold_streams() {
    let config = Config {
        stream_copies: StreamCopies::All,
        stream_copy_slots: StreamCopySlots::Pinned,
        stream_copy_cap_bytes: 32 * MIB,
        direct: DirectPolicy::Off,
        ..small_config()
    };
    let flags = [Some(15), Some(5), Some(7), Some(13)];
    for direction in [Direction::Read, Direction::Write] {
        let rig = Rig::with(1, config.clone());
        let stats = Arc::clone(&rig.driver);
        let arena_before = rig.driver.engine().expect("engine").stats().arena_chunks;
        let copies = streams_made_during(rig, direction, 2, 16 * MIB, flags);
        let spared = stats.async_stats().spare_ops.load(Ordering::SeqCst);
        let arena = stats.engine().expect("engine").stats().arena_chunks - arena_before;
        // 96 ops: each either one slot copy or four spare pieces.
        assert_eq!(copies, 96 + 3 * spared, "{direction:?}: {spared} ops through spares");
        assert!(spared >= 48, "{direction:?}: most ops through spares ({spared})");
        assert_eq!(arena, 0, "{direction:?}: nothing on the engine's path");
    }
}

/// 8 streams registered with `flags` in turn run 6 rounds of `ops` reads or writes of
/// `op` bytes each (every byte checked) while another thread makes 200 streams, all under
/// a watchdog. Returns the ops copied on their streams.
fn streams_made_during(
    rig: Rig,
    direction: Direction,
    ops: usize,
    op: usize,
    flags: [Option<u32>; 4],
) -> u64 {
    const STREAMS: usize = 8;
    let rig = Arc::new(rig);
    let engine = rig.driver.engine().expect("engine");
    let cap = engine.fallback_cap_bytes();
    assert_eq!(engine.fallback_pinned_bytes(), cap, "the fallback pool is made at the start");
    let total = STREAMS * ops * op;
    let data = pattern(77, total);
    let file = match direction {
        Direction::Read => TempFile::new("streams-made", &data),
        Direction::Write => TempFile::new("streams-made", &vec![0; total]),
    };
    let fd = file.open_rw();
    let handle = rig.register(&fd);
    let buffer = rig.alloc(total);
    if direction == Direction::Write {
        rig.set_dev_bytes(buffer, &data);
    }
    let streams: Vec<StreamHandle> =
        (0..STREAMS).map(|k| rig.stream_with(flags[k % flags.len()])).collect();
    let copied_before = rig.driver.async_stats().stream_copies.load(Ordering::SeqCst);
    let work_rig = Arc::clone(&rig);
    let what = format!("{direction:?}s while another thread makes streams");
    let made = run_watched(&rig.driver, &what, HANG_GUARD, {
        move || {
            let rig = &work_rig;
            std::thread::scope(|scope| {
                let creator = scope.spawn(|| {
                    let made: Vec<StreamHandle> = (0..200).map(|_| rig.stream()).collect();
                    made.len()
                });
                for round in 0..6 {
                    let what = format!("round {round}");
                    rig.run_disjoint(direction, (handle, buffer), &streams, (ops, op), &what);
                }
                creator.join().expect("creator")
            })
        }
    });
    assert_eq!(made, 200);
    match direction {
        Direction::Read => assert_bytes(&rig.dev_bytes(buffer, total), &data, "every read"),
        Direction::Write => assert_bytes(&file.contents(), &data, "every write"),
    }
    assert_eq!(engine.fallback_pinned_bytes(), cap, "the fallback pool never grew");
    rig.driver.async_stats().stream_copies.load(Ordering::SeqCst) - copied_before
}
