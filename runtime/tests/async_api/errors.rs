//! Failures of async ops: each one is reported (in `*bytes_p` or by the call) and never
//! leaves a stream hanging. Short reads at end of file, OS errors (`-errno`, decided
//! behaviour: hipFile publishes -1 and loses errno), parameters found invalid when the
//! stream reaches the op, handles, buffers, streams and the driver going away while ops
//! are queued, and device errors at submission.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use hipfile_core::{Direction, OpError};
use hipfile_runtime::device::DeviceError;
use hipfile_test_support::rig::*;

#[test]
fn short_read_at_end_of_file_publishes_the_short_count() {
    const FILE: usize = 100_000;
    for flags in [None, Some(0), Some(7)] {
        let rig = Rig::new();
        let data = pattern(60, FILE);
        let file = TempFile::new("eof", &data);
        let fd = file.open_rw();
        let handle = rig.register(&fd);
        let buffer = rig.alloc(MIB);
        rig.set_dev_bytes(buffer, &vec![0xee; MIB]);
        let stream = rig.stream_with(flags);
        let whole = params(MIB, 0, 0);
        rig.read(handle, buffer, &whole, stream);
        let tail = params(4096, (FILE - 1000) as i64, (512 * KIB) as i64);
        rig.read(handle, buffer, &tail, stream);
        rig.sync(stream);
        assert_eq!(bytes(&whole), FILE as isize, "flags {flags:?}");
        assert_eq!(bytes(&tail), 1000, "flags {flags:?}");
        let got = rig.dev_bytes(buffer, MIB);
        assert_bytes(&got[..FILE], &data, "data up to EOF");
        // As hipFile: device bytes beyond a short read are left untouched.
        assert_all(&got[FILE..512 * KIB], 0xee, "beyond the short read");
        assert_bytes(&got[512 * KIB..512 * KIB + 1000], &data[FILE - 1000..], "tail data");
        assert_all(&got[512 * KIB + 1000..], 0xee, "beyond the tail read");
    }
}

#[test]
fn read_at_or_past_end_of_file_publishes_zero() {
    const FILE: usize = 64 * KIB;
    for flags in [None, Some(0), Some(7), Some(15)] {
        let rig = Rig::new();
        let file = TempFile::new("past-eof", &pattern(61, FILE));
        let fd = file.open_rw();
        let handle = rig.register(&fd);
        let buffer = rig.alloc(256 * KIB);
        rig.set_dev_bytes(buffer, &vec![0x77; 256 * KIB]);
        let stream = rig.stream_with(flags);
        let ops: Vec<_> =
            [FILE, FILE + 4096, 1 << 30].iter().map(|&at| params(8192, at as i64, 0)).collect();
        for p in &ops {
            p.bytes_done.store(-7, Ordering::SeqCst);
            rig.read(handle, buffer, p, stream);
        }
        rig.sync(stream);
        for p in &ops {
            assert_eq!(bytes(p), 0, "flags {flags:?}");
        }
        assert_all(&rig.dev_bytes(buffer, 256 * KIB), 0x77, "buffer untouched");
    }
}

#[test]
fn write_through_a_read_only_handle_is_ebadf() {
    // Decided behaviour: `*bytes_p = -errno` (hipFile: -1). Our descriptors never get
    // more access than the client's, so the write fails in the kernel with EBADF.
    for flags in [None, Some(0), Some(7), Some(15)] {
        let rig = Rig::new();
        let data = pattern(62, MIB);
        let file = TempFile::new("rdonly", &data);
        let fd = file.open_ro();
        let handle = rig.register(&fd);
        let buffer = rig.alloc(MIB);
        rig.set_dev_bytes(buffer, &pattern(63, MIB));
        let stream = rig.stream_with(flags);
        let writes: Vec<_> =
            [(MIB, 0), (4096, 8192)].iter().map(|&(n, at)| params(n, at, 0)).collect();
        for p in &writes {
            rig.write(handle, buffer, p, stream);
        }
        // The stream goes on: a read after the failed writes works.
        let read = params(64 * KIB, 0, (MIB - 64 * KIB) as i64);
        rig.read(handle, buffer, &read, stream);
        rig.sync(stream);
        for p in &writes {
            assert_eq!(bytes(p), -(libc::EBADF as isize), "flags {flags:?}");
        }
        assert_eq!(bytes(&read), (64 * KIB) as isize);
        assert_bytes(
            &rig.dev_bytes(buffer + (MIB - 64 * KIB) as u64, 64 * KIB),
            &data[..64 * KIB],
            "read",
        );
        assert_bytes(&file.contents(), &data, "file unchanged");
    }
}

#[test]
fn read_through_a_write_only_handle_is_ebadf() {
    for flags in [None, Some(0), Some(7)] {
        let rig = Rig::new();
        let file = TempFile::new("wronly", &pattern(64, MIB));
        let fd = file.open_wo();
        let handle = rig.register(&fd);
        let buffer = rig.alloc(MIB);
        let stream = rig.stream_with(flags);
        let read = params(256 * KIB, 4096, 0);
        rig.read(handle, buffer, &read, stream);
        let source = pattern(65, 4096);
        rig.set_dev_bytes(buffer + (MIB - 4096) as u64, &source);
        let write = params(4096, 0, (MIB - 4096) as i64);
        rig.write(handle, buffer, &write, stream);
        rig.sync(stream);
        assert_eq!(bytes(&read), -(libc::EBADF as isize), "flags {flags:?}");
        assert_all(&rig.dev_bytes(buffer, 256 * KIB), 0, "nothing copied by the failed read");
        assert_eq!(bytes(&write), 4096, "the stream goes on");
        assert_bytes(&file.contents()[..4096], &source, "write after the failed read");
    }
}

/// A parameter change applied while the stream is held, and its name.
type LateChange = (&'static str, fn(&hipfile_runtime::AsyncParams));

#[test]
fn parameters_invalid_when_reached_publish_invalid_value_and_release_the_stream() {
    let rig = Rig::new();
    let data = pattern(66, MIB);
    let file = TempFile::new("late-invalid", &data);
    let fd = file.open_rw();
    let handle = rig.register(&fd);
    let buffer = rig.alloc(MIB);
    let stream = rig.registered_stream(0);
    let gate = rig.pause(stream).expect("pause");
    let changes: [LateChange; 5] = [
        ("file offset -1", |p| p.file_offset_bytes.store(-1, Ordering::SeqCst)),
        ("buffer offset -1", |p| p.buffer_offset_bytes.store(-1, Ordering::SeqCst)),
        ("buffer offset = buffer", |p| p.buffer_offset_bytes.store(MIB as i64, Ordering::SeqCst)),
        ("size = buffer + 1", |p| p.size_bytes.store(MIB + 1, Ordering::SeqCst)),
        ("file offset i64::MAX", |p| p.file_offset_bytes.store(i64::MAX, Ordering::SeqCst)),
    ];
    let mut ops = Vec::new();
    for (what, change) in changes {
        for direction in [Direction::Read, Direction::Write] {
            let p = params(64 * KIB, 0, 0);
            rig.submit(direction, handle, buffer, &p, stream).expect("accepted");
            change(&p);
            ops.push((what, direction, p));
        }
    }
    let good = params(64 * KIB, 4096, 0);
    rig.read(handle, buffer, &good, stream);
    gate.release();
    rig.sync(stream);
    for (what, direction, p) in &ops {
        assert_eq!(bytes(p), neg(OpError::InvalidValue), "{direction:?}: {what}");
    }
    assert_eq!(bytes(&good), (64 * KIB) as isize, "an op after the failures still runs");
    assert_bytes(&rig.dev_bytes(buffer, 64 * KIB), &data[4096..4096 + 64 * KIB], "good op");
    assert_bytes(&file.contents(), &data, "no failed write touched the file");
}

#[test]
fn deregistering_the_file_handle_while_ops_are_queued() {
    // DESIGN.md "Files": new ops are refused at once; the queued ones still complete and
    // the file stays open until the last of them finishes (hipFile instead keeps the
    // handle registered and swallows the error).
    for flags in [None, Some(0), Some(7)] {
        let rig = Rig::new();
        let data = pattern(67, MIB);
        let file = TempFile::new("dereg-file", &data);
        let fd = file.open_rw();
        let handle = rig.register(&fd);
        let buffer = rig.alloc(MIB);
        let written = pattern(68, 256 * KIB);
        rig.set_dev_bytes(buffer + (768 * KIB) as u64, &written);
        let stream = rig.stream_with(flags);
        let gate = rig.pause(stream).expect("pause");
        let read = params(512 * KIB, 4096, 0);
        rig.read(handle, buffer, &read, stream);
        let write = params(256 * KIB, (MIB - 256 * KIB) as i64, (768 * KIB) as i64);
        rig.write(handle, buffer, &write, stream);
        let file_handle = rig.driver.file(handle).expect("registered");
        // Each op holds the file (a prefetching read holds it twice: op and job).
        assert!(file_handle.ops_in_flight() >= 2);
        rig.driver.handle_deregister(handle);
        let refused = params(4096, 0, 0);
        let got = code(rig.submit(Direction::Read, handle, buffer, &refused, stream));
        assert_eq!(got, OpError::HandleNotRegistered, "flags {flags:?}: new ops refused");
        gate.release();
        rig.sync(stream);
        assert_eq!(bytes(&read), (512 * KIB) as isize, "flags {flags:?}");
        assert_eq!(bytes(&write), (256 * KIB) as isize, "flags {flags:?}");
        assert_bytes(&rig.dev_bytes(buffer, 512 * KIB), &data[4096..4096 + 512 * KIB], "read");
        assert_bytes(&file.contents()[MIB - 256 * KIB..], &written, "write");
        wait_until("the ops to release the file", || file_handle.ops_in_flight() == 0);
        assert!(file_handle.is_deregistered());
    }
}

#[test]
fn closing_the_driver_while_ops_are_queued() {
    // Close at use count 0 deregisters every handle and buffer; queued ops still finish.
    let rig = Rig::new();
    let data = pattern(69, MIB);
    let file = TempFile::new("close", &data);
    let fd = file.open_rw();
    let handle = rig.register(&fd);
    let buffer = rig.alloc(MIB);
    rig.driver.buf_register(buffer, MIB as u64, 0).expect("buf_register");
    let streams = [rig.stream(), rig.registered_stream(7)];
    let mut ops = Vec::new();
    let mut gates = Vec::new();
    for (i, &stream) in streams.iter().enumerate() {
        gates.push(rig.pause(stream).expect("pause"));
        let p = params(256 * KIB, (i * 256 * KIB) as i64, (i * 256 * KIB) as i64);
        rig.read(handle, buffer, &p, stream);
        ops.push(p);
    }
    rig.driver.close().expect("close");
    assert_eq!(rig.driver.use_count(), 0);
    for gate in gates {
        gate.release();
    }
    for &stream in &streams {
        rig.sync(stream);
    }
    for p in &ops {
        assert_eq!(bytes(p), (256 * KIB) as isize);
    }
    assert_bytes(&rig.dev_bytes(buffer, 512 * KIB), &data[..512 * KIB], "queued reads");
}

#[test]
fn deregistering_a_buffer_with_ops_in_flight_is_refused() {
    // hipFile: BufDeregister of a buffer in use → 5030 (D17); it works once the ops end.
    let rig = Rig::new();
    let file = TempFile::new("dereg-buf", &pattern(70, MIB));
    let fd = file.open_rw();
    let handle = rig.register(&fd);
    let buffer = rig.alloc(MIB);
    rig.driver.buf_register(buffer, MIB as u64, 0).expect("buf_register");
    let stream = rig.registered_stream(0);
    let gate = rig.pause(stream).expect("pause");
    let p = params(MIB, 0, 0);
    rig.read(handle, buffer, &p, stream);
    assert_eq!(code(rig.driver.buf_deregister(buffer)), OpError::InternalError);
    gate.release();
    rig.sync(stream);
    assert_eq!(bytes(&p), MIB as isize);
    wait_until("the buffer to be released", || rig.driver.buf_deregister(buffer).is_ok());
}

#[test]
fn submission_on_a_destroyed_stream_is_a_driver_error() {
    // The nearest honest stand-in for A17: a device error during submission is returned
    // as {5011 hipFileHipDriverError, hipError}, and nothing is published.
    let rig = Rig::new();
    if rig.cpu_only("submitting on a destroyed stream is undefined behaviour on a GPU").is_none() {
        return;
    }
    let file = TempFile::new("destroyed", &pattern(71, 64 * KIB));
    let fd = file.open_rw();
    let handle = rig.register(&fd);
    let buffer = rig.alloc(64 * KIB);
    let unregistered = rig.stream();
    let registered = rig.registered_stream(7);
    rig.destroy_stream(unregistered);
    rig.destroy_stream(registered);
    for stream in [unregistered, registered] {
        for direction in [Direction::Read, Direction::Write] {
            let p = params(64 * KIB, 0, 0);
            p.bytes_done.store(-3, Ordering::SeqCst);
            let error = rig.submit(direction, handle, buffer, &p, stream).expect_err("refused");
            assert_eq!(error.code, OpError::HipDriverError, "{stream:?} {direction:?}");
            assert_eq!(error.hip_error, DeviceError::HIP_ERROR_INVALID_HANDLE);
            // The failure may come after `*bytes_p = 0` (the enqueue fails); it must not
            // be left at a value that looks like a result in flight forever: it is 0 or
            // untouched, and stays so.
            let published = bytes(&p);
            assert!(published == 0 || published == -3, "{published}");
        }
    }
    assert_eq!(rig.driver.async_stats().submitted.load(Ordering::SeqCst), 0);
    assert_eq!(rig.driver.file(handle).expect("file").ops_in_flight(), 0, "no op leaked");
}

#[test]
fn stream_destroyed_with_ops_queued_still_runs_them() {
    // hipStreamDestroy semantics: queued work still runs. Our ops complete, and the
    // event recorded after them (on the destroyed stream) completes.
    for flags in [None, Some(0), Some(7)] {
        let rig = Rig::new();
        let reason = "needs the cpu device's events on a destroyed stream";
        let Some(cpu) = rig.cpu_only(reason) else { return };
        let data = pattern(72, MIB);
        let file = TempFile::new("destroy-queued", &data);
        let fd = file.open_rw();
        let handle = rig.register(&fd);
        let buffer = rig.alloc(MIB);
        let stream = rig.stream_with(flags);
        let gate = rig.pause(stream).expect("pause");
        let p = params(MIB, 0, 0);
        rig.read(handle, buffer, &p, stream);
        let event = cpu.record_event_on(stream).expect("event");
        cpu.destroy_stream(stream).expect("destroy");
        gate.release();
        let device = Arc::clone(&cpu);
        run_guarded("the event after the op", move || device.event_synchronize(&event))
            .expect("event ok");
        assert_eq!(bytes(&p), MIB as isize, "flags {flags:?}");
        assert_bytes(&rig.dev_bytes(buffer, MIB), &data, "read on a destroyed stream");
    }
}

#[test]
fn an_executor_that_cannot_start_is_replaced_by_a_blocking_one() {
    // A CPU outside this process's affinity mask: the glommio executor cannot be pinned,
    // so a blocking executor serves its jobs (start anywhere: slower, never a hang and
    // never a refusal). It used to fail every submission with hipFileInternalError.
    let mut config = small_config();
    config.executor_cpus = vec![usize::from(u16::MAX)];
    config.request_parallelism = 1;
    // The executors' path: a read inside the submit call would take the async read.
    config.inline_read_bytes = 0;
    let rig = Rig::with(1, config);
    let data = pattern(73, 64 * KIB);
    let file = TempFile::new("no-engine", &data);
    let fd = file.open_rw();
    let handle = rig.register(&fd);
    let buffer = rig.alloc(64 * KIB);
    let stream = rig.stream();
    for s in [stream, hipfile_runtime::device::StreamHandle::NULL] {
        rig.set_dev_bytes(buffer, &[0; 64 * KIB]);
        let p = params(64 * KIB, 0, 0);
        rig.read(handle, buffer, &p, s);
        rig.sync(stream);
        assert_eq!(bytes(&p), (64 * KIB) as isize, "{s:?}");
        assert_bytes(&rig.dev_bytes(buffer, 64 * KIB), &data, "read through a blocking executor");
    }
    let engine = rig.driver.engine().expect("engine");
    assert_eq!(engine.blocking_executor_count(), 1);
    assert!(engine.stats().blocking_jobs >= 1, "{:?}", engine.stats());
}

#[test]
fn a_read_the_kernel_fails_publishes_minus_errno_and_the_stream_goes_on() {
    // A real kernel failure of an accepted op: /proc/self/mem fails reads of unmapped
    // addresses (address 0 never is) with EIO through read(2); io_uring refuses the file
    // with EINVAL (it has no read_iter), and the engine then reads it with pread, so the
    // op publishes -EIO as pread would (it published -EINVAL for ops of several chunks);
    // the stream must be released and later ops on it must work.
    for (flags, size) in
        [(None, 256 * KIB), (Some(0), 2 * MIB), (Some(7), 2 * MIB), (Some(15), 256 * KIB)]
    {
        let rig = Rig::new();
        let mem = std::fs::File::open("/proc/self/mem").expect("open /proc/self/mem");
        let failing = rig.register(&mem);
        let data = pattern(66, 64 * KIB);
        let file = TempFile::new("after-eio", &data);
        let fd = file.open_rw();
        let good = rig.register(&fd);
        let buffer = rig.alloc(4 * MIB);
        rig.set_dev_bytes(buffer, &vec![0x5a; 4 * MIB]);
        let stream = rig.stream_with(flags);
        let failed = params(size, 0, 0);
        rig.read(failing, buffer, &failed, stream);
        let after = params(64 * KIB, 0, (4 * MIB - 64 * KIB) as i64);
        rig.read(good, buffer, &after, stream);
        rig.sync(stream);
        let failure = bytes(&failed);
        assert_eq!(failure, -(libc::EIO as isize), "flags {flags:?}, {size} B");
        assert_eq!(bytes(&after), (64 * KIB) as isize, "flags {flags:?}: the stream goes on");
        assert_bytes(
            &rig.dev_bytes(buffer + (4 * MIB - 64 * KIB) as u64, 64 * KIB),
            &data,
            "read after the failure",
        );
        // hipFileRead of the same range: -1 with errno EIO, as pread gives.
        let raw = hipfile_core::RawIo {
            size_bytes: size as u64,
            file_offset_bytes: 0,
            buffer_offset_bytes: 0,
        };
        let sync = rig.driver.io_sync(Direction::Read, failing, buffer, raw);
        assert!(matches!(sync, Err(hipfile_runtime::IoError::Os(libc::EIO))), "{size} B: {sync:?}");
    }
}
