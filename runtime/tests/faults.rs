//! Seeded fault injection (`hipfile_runtime::fault`) behind the I/O and device layers:
//! for every fault, the right error in the right place (the sync call's result, the
//! async op's `*bytes_p`, or the submit call), every stream completes, later ops work,
//! and nothing leaks (descriptors, threads; pinned fallback staging stays within its
//! cap).
//!
//! Each case installs one plan, runs a fixed workload — sync and async reads and writes
//! of one chunk (64 KiB: the caller-thread path for sync) and of four chunks (1 MiB:
//! the engine) — checks each result, removes the plan and runs the workload again, which
//! must succeed with every byte right. The tests run one at a time (the plan is
//! process-wide).

use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use hipfile_core::{Direction, OpError, RawIo};
use hipfile_runtime::IoError;
use hipfile_runtime::config::{BufferedWrites, CallerThread, Config};
use hipfile_runtime::device::StreamHandle;
use hipfile_runtime::fault::{self, Fault, Plan, Rule, Site};
use hipfile_runtime::file::DirectPolicy;
use hipfile_runtime::{AsyncParams, HandleId};
use hipfile_test_support::rig::*;

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

const FILE_BYTES: usize = 4 * MIB;
const SIZES: [usize; 2] = [64 * KIB, MIB];

/// What one op of the workload gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Got {
    /// All bytes moved.
    Done,
    /// A write moved fewer bytes (a short count, as `pwrite` gives).
    Short(usize),
    /// Failed with this errno (sync: `-1`/errno; async: `*bytes_p = -errno`).
    Errno(i32),
    /// Failed with this hipFile code (sync or `*bytes_p`, or the submit call).
    Code(i32),
    /// Failed with a device error.
    Device,
}

struct Workload {
    rig: Rig,
    file: TempFile,
    _client: std::fs::File,
    handle: HandleId,
    buffer: u64,
    /// The stream of every async op (one stream: each new stream of the cpu device is a
    /// thread, and the thread count is checked).
    stream: hipfile_runtime::device::StreamHandle,
    data: Vec<u8>,
}

impl Workload {
    fn new() -> Workload {
        // The ordinary paths' sites: reads inside the submit call would take the small
        // reads of idle streams first (their own faults: the last test of this file).
        let rig = Rig::with(1, Config { inline_read_bytes: 0, ..small_config() });
        let data = pattern(9, FILE_BYTES);
        let file = TempFile::new("faults", &data);
        let client = file.open_rw();
        let handle = rig.driver.handle_register(client.as_raw_fd()).expect("register");
        let buffer = rig.alloc(FILE_BYTES);
        let stream = rig.stream();
        Workload { rig, file, _client: client, handle, buffer, stream, data }
    }

    /// Sync and async reads and writes of each size; the results in order.
    fn run(&mut self) -> Vec<(String, Got)> {
        let mut results = Vec::new();
        for (index, &size) in SIZES.iter().enumerate() {
            let base = index * 2 * MIB;
            for direction in [Direction::Read, Direction::Write] {
                let what = format!("sync {direction:?} {size}");
                results.push((what, self.sync(direction, base, size)));
                let what = format!("async {direction:?} {size}");
                results.push((what, self.async_op(direction, base + size, size)));
            }
        }
        results
    }

    /// Prepares the device or file for a transfer of `size` at `offset` (same offset in
    /// file and buffer) and checks the bytes after it: the file's bytes for a read, the
    /// buffer's for a write.
    fn prepare(&mut self, direction: Direction, offset: usize, size: usize) {
        if direction == Direction::Write {
            let fresh = pattern(offset as u64 ^ 0x5A, size);
            self.rig.set_dev_bytes(self.buffer + offset as u64, &fresh);
            self.data[offset..offset + size].copy_from_slice(&fresh);
        } else {
            self.rig.set_dev_bytes(self.buffer + offset as u64, &vec![0; size]);
        }
    }

    fn verify(&self, direction: Direction, offset: usize, size: usize, what: &str) {
        let got = match direction {
            Direction::Read => self.rig.dev_bytes(self.buffer + offset as u64, size),
            Direction::Write => self.file.contents()[offset..offset + size].to_vec(),
        };
        assert_bytes(&got, &self.data[offset..offset + size], what);
    }

    fn sync(&mut self, direction: Direction, offset: usize, size: usize) -> Got {
        self.prepare(direction, offset, size);
        let io = RawIo {
            size_bytes: size as u64,
            file_offset_bytes: offset as i64,
            buffer_offset_bytes: offset as i64,
        };
        let got = match self.rig.driver.io_sync(direction, self.handle, self.buffer, io) {
            Ok(n) if n == size => Got::Done,
            Ok(n) => Got::Short(n),
            Err(IoError::Os(errno)) => Got::Errno(errno),
            Err(IoError::Library(code)) => Got::Code(code.code()),
            Err(IoError::Device(_)) => Got::Device,
            Err(IoError::DriverClosed) => Got::Code(-1),
        };
        if got == Got::Done {
            self.verify(direction, offset, size, &format!("sync {direction:?} {size}"));
        }
        got
    }

    fn async_op(&mut self, direction: Direction, offset: usize, size: usize) -> Got {
        self.prepare(direction, offset, size);
        let stream = self.stream;
        let p: Arc<AsyncParams> = params(size, offset as i64, offset as i64);
        if let Err(error) = self.rig.submit(direction, self.handle, self.buffer, &p, stream) {
            return Got::Code(code(Err(error)).code());
        }
        self.rig.sync(stream);
        let got = match bytes(&p) {
            n if n == size as isize => Got::Done,
            n if n >= 0 => Got::Short(n as usize),
            n if -n >= 5000 => Got::Code((-n) as i32),
            n => Got::Errno((-n) as i32),
        };
        if got == Got::Done {
            self.verify(direction, offset, size, &format!("async {direction:?} {size}"));
        }
        got
    }
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").expect("list fds").count()
}

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").expect("list threads").count()
}

/// The thread count once it has held still for 200 ms (at most 5 s): threads of an
/// earlier test's dropped driver (its teardown helper, a device's stream workers) may
/// still be ending.
fn settled_threads() -> usize {
    let started = std::time::Instant::now();
    let mut count = threads();
    let mut still_since = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
        let now = threads();
        if now != count {
            count = now;
            still_since = std::time::Instant::now();
        } else if still_since.elapsed() >= Duration::from_millis(200) {
            break;
        }
    }
    count
}

/// Runs the workload under `rule`; every result must be `Done` or one `allowed` says
/// is right; at least one fault must have been injected; afterwards the workload runs
/// clean and nothing leaked.
fn case(rule: Rule, allowed: impl Fn(Direction, Got) -> bool) {
    let _serial = serial();
    let mut work = Workload::new();
    work.run(); // warm-up: executors, files, streams, staging
    let threads_before = settled_threads();
    let fds = open_fds();
    let guard = fault::install(Plan { seed: 0xFA17, rules: vec![rule] });
    let results = work.run();
    let injected = guard.injected()[0];
    drop(guard);
    assert!(injected > 0, "{rule:?}: never injected; results {results:?}");
    for (what, got) in &results {
        let direction = if what.contains("Read") { Direction::Read } else { Direction::Write };
        assert!(
            *got == Got::Done || allowed(direction, *got),
            "{rule:?}: {what} gave {got:?} (all: {results:?})"
        );
    }
    for (what, got) in work.run() {
        assert_eq!(got, Got::Done, "{rule:?}: {what} after the plan was removed");
    }
    let engine = work.rig.driver.engine().expect("engine");
    assert!(engine.fallback_pinned_bytes() <= engine.pinned_cap_bytes());
    assert_eq!(open_fds(), fds, "{rule:?}: descriptors");
    // No thread leaked (one of an earlier test's teardown may have ended meanwhile).
    let threads_after = settled_threads();
    assert!(
        threads_after <= threads_before,
        "{rule:?}: threads {threads_before} -> {threads_after}"
    );
    println!("{rule:?}: {injected} injected; {results:?}");
}

fn every(site: Site, fault: Fault) -> Rule {
    Rule { site, fault, one_in: 1, limit: u64::MAX }
}

fn once(site: Site, fault: Fault) -> Rule {
    Rule { site, fault, one_in: 1, limit: 1 }
}

/// A write that fails partway may report the bytes written before the failure.
fn errno_or_short(errno: i32) -> impl Fn(Direction, Got) -> bool {
    move |direction, got| match got {
        Got::Errno(e) => e == errno,
        Got::Short(_) => direction == Direction::Write,
        _ => false,
    }
}

#[test]
fn interrupted_and_short_transfers_are_retried_transparently() {
    // An interrupted call is retried as it is, so the rules have a limit (the kernel
    // does not interrupt forever either).
    case(Rule { limit: 200, ..every(Site::FileRead, Fault::Interrupt) }, |_, _| false);
    case(Rule { limit: 200, ..every(Site::FileRead, Fault::Short) }, |_, _| false);
    case(Rule { limit: 200, ..every(Site::FileWrite, Fault::Interrupt) }, |_, _| false);
    case(Rule { limit: 200, ..every(Site::FileWrite, Fault::Short) }, |_, _| false);
}

#[test]
fn slow_completions_only_take_longer() {
    let delay = Fault::Delay(Duration::from_millis(20));
    case(every(Site::ChunkRead, delay), |_, _| false);
    case(every(Site::ChunkWrite, delay), |_, _| false);
    case(every(Site::FileRead, delay), |_, _| false);
}

#[test]
fn io_errors_reach_the_caller_as_their_errno() {
    case(every(Site::FileRead, Fault::Errno(libc::EIO)), errno_or_short(libc::EIO));
    case(every(Site::ChunkRead, Fault::Errno(libc::EIO)), errno_or_short(libc::EIO));
    case(every(Site::ChunkRead, Fault::Errno(libc::EAGAIN)), errno_or_short(libc::EAGAIN));
    case(every(Site::FileWrite, Fault::Errno(libc::ENOSPC)), errno_or_short(libc::ENOSPC));
    case(every(Site::ChunkWrite, Fault::Errno(libc::ENOSPC)), errno_or_short(libc::ENOSPC));
    case(once(Site::ChunkWrite, Fault::Errno(libc::EIO)), errno_or_short(libc::EIO));
}

/// `HIPFILE_CALLER_THREAD=always`: a sync request of four chunks moved on the calling
/// thread piece by piece. A write whose third piece fails reports the two pieces written
/// before (as `pwrite` does), a read whose third piece fails its errno; a device copy
/// that fails at the second piece hands the whole request to the executors, which move
/// it (each byte counted once, by them).
#[test]
fn a_request_of_many_chunks_on_the_caller_thread_fails_piece_by_piece() {
    let _serial = serial();
    let rig = Rig::with(1, Config { caller_thread: CallerThread::Always, ..small_config() });
    let chunk = rig.driver.config().staging_chunk_bytes;
    let len = 4 * chunk;
    let data = pattern(41, 2 * len);
    let file = TempFile::new("caller-pieces", &data);
    let client = file.open_rw();
    let handle = rig.driver.handle_register(client.as_raw_fd()).expect("register");
    let buffer = rig.alloc(len);
    let engine = rig.driver.engine().expect("engine");
    let io = |offset: usize| RawIo {
        size_bytes: len as u64,
        file_offset_bytes: offset as i64,
        buffer_offset_bytes: 0,
    };
    // The first `pieces` calls at `site` go through, the next fails.
    let fail_after = |site, pieces, fault| Plan {
        seed: 3,
        rules: vec![Rule { site, fault: Fault::Pass, one_in: 1, limit: pieces }, once(site, fault)],
    };
    let large = || engine.stats().caller_thread_large_requests;
    let jobs = || engine.stats().jobs;
    let (large_before, jobs_before) = (large(), jobs());

    let source = pattern(42, len);
    rig.set_dev_bytes(buffer, &source);
    let guard = fault::install(fail_after(Site::FileWrite, 2, Fault::Errno(libc::EIO)));
    let written = rig.driver.io_sync(Direction::Write, handle, buffer, io(0));
    assert_eq!(guard.injected()[1], 1, "the third piece's write failed");
    drop(guard);
    assert_eq!(written, Ok(2 * chunk), "the pieces written before the failure");
    let contents = file.contents();
    assert_bytes(&contents[..2 * chunk], &source[..2 * chunk], "the pieces written");
    assert_bytes(&contents[2 * chunk..], &data[2 * chunk..], "the rest as it was");

    let guard = fault::install(fail_after(Site::FileRead, 2, Fault::Errno(libc::EIO)));
    let read = rig.driver.io_sync(Direction::Read, handle, buffer, io(len));
    assert_eq!(guard.injected()[1], 1, "the third piece's read failed");
    drop(guard);
    assert_eq!(read, Err(IoError::Os(libc::EIO)));
    assert_eq!((large() - large_before, jobs()), (2, jobs_before), "both on the caller's thread");

    rig.set_dev_bytes(buffer, &vec![0; len]);
    let counted = rig.driver.file(handle).expect("file").counters().read_bytes();
    let guard = fault::install(fail_after(Site::DeviceCopy, 1, Fault::Errno(0)));
    let read = rig.driver.io_sync(Direction::Read, handle, buffer, io(len));
    assert_eq!(guard.injected()[1], 1, "the second piece's copy failed");
    drop(guard);
    assert_eq!(read, Ok(len));
    assert_bytes(&rig.dev_bytes(buffer, len), &data[len..], "the read the executors redid");
    wait_until("the executors' jobs counted", || jobs() > jobs_before);
    assert_eq!(large() - large_before, 2, "the redone read is not counted as the caller's");
    let now = rig.driver.file(handle).expect("file").counters().read_bytes();
    assert_eq!(now - counted, len as u64, "each byte counted once");
    rig.driver.handle_deregister(handle);
}

#[test]
fn device_failures_are_driver_errors() {
    let driver_error =
        |_, got| matches!(got, Got::Device) || got == Got::Code(OpError::HipDriverError.code());
    case(every(Site::DeviceCopy, Fault::Errno(0)), driver_error);
    case(once(Site::DeviceCopy, Fault::Errno(0)), driver_error);
    case(every(Site::DeviceEvent, Fault::Errno(0)), driver_error);
}

#[test]
fn a_failed_pinned_allocation_refuses_the_submission_that_needed_it() {
    let _serial = serial();
    // Release words come from pinned slabs: the first async op of a fresh driver needs
    // one, and its submission is refused with hipFileHipDriverError; nothing else is.
    let mut work = Workload::new();
    // The test's own staging for device bytes, before the plan.
    work.rig.set_dev_bytes(work.buffer, &[0; 4096]);
    let guard =
        fault::install(Plan { seed: 2, rules: vec![once(Site::PinnedAlloc, Fault::Errno(0))] });
    let results = work.run();
    assert_eq!(guard.injected(), vec![1]);
    drop(guard);
    // The op that needed the allocation is refused (or the engine went on without it);
    // nothing else fails.
    for (what, got) in &results {
        let refused = Got::Code(OpError::HipDriverError.code());
        assert!(*got == Got::Done || *got == refused, "{what}: {got:?} ({results:?})");
    }
    println!("pinned allocation refused once: {results:?}");
    for (what, got) in work.run() {
        assert_eq!(got, Got::Done, "{what} after the plan was removed");
    }
}

#[test]
fn an_executor_that_fails_to_start_is_replaced() {
    let _serial = serial();
    let guard =
        fault::install(Plan { seed: 1, rules: vec![once(Site::ExecutorStart, Fault::Errno(0))] });
    let mut work = Workload::new();
    for (what, got) in work.run() {
        assert_eq!(got, Got::Done, "{what}");
    }
    assert_eq!(guard.injected(), vec![1]);
    drop(guard);
    let stats = work.rig.driver.engine().expect("engine").stats();
    assert!(stats.blocking_jobs > 0, "a blocking executor served jobs: {stats:?}");
}

#[test]
fn a_wait_that_could_not_be_queued_leaves_the_op_unrun_even_when_the_stream_reached_it() {
    let _serial = serial();
    let work = Workload::new();
    let rig = &work.rig;
    if rig.cpu_only("needs the doorbell path of the cpu device's stream memory ops").is_none() {
        return;
    }
    let stream = rig.registered_stream(0);
    let buffer = rig.alloc(64 * KIB);
    // The refusal is reported 100 ms late: by then the stream has rung the doorbell and
    // the arm has had every chance to run. The op must still not run (the caller is told
    // it failed, and may reuse the buffer) and *bytes_p must stay as it was.
    let guard = fault::install(Plan {
        seed: 3,
        rules: vec![once(Site::StreamWait, Fault::Delay(Duration::from_millis(100)))],
    });
    let p = params(64 * KIB, 0, 0);
    p.bytes_done.store(-777, std::sync::atomic::Ordering::SeqCst);
    let refused = rig.submit(Direction::Read, work.handle, buffer, &p, stream);
    assert_eq!(guard.injected(), vec![1]);
    drop(guard);
    assert_eq!(code(refused), OpError::HipDriverError);
    rig.sync(stream);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(bytes(&p), -777, "a refused submission leaves *bytes_p alone");
    assert_all(&rig.dev_bytes(buffer, 64 * KIB), 0, "the refused op never ran");
    // The stream goes on: a later op on it runs.
    let later = params(64 * KIB, 0, 0);
    rig.read(work.handle, buffer, &later, stream);
    rig.sync(stream);
    assert_eq!(bytes(&later), 64 * KIB as isize);
    assert_bytes(&rig.dev_bytes(buffer, 64 * KIB), &work.data[..64 * KIB], "the later op");
}

/// Engine writes of page-cache chunks go through `pwrite` on the executors' blocking
/// threads by default (a `pwrite` fault reaches them, as EIO), and through io_uring
/// with `HIPFILE_BUFFERED_WRITES=io_uring` (no `pwrite` is made: the write succeeds).
#[test]
fn buffered_engine_writes_take_pwrite_unless_io_uring_is_asked_for() {
    let _serial = serial();
    for (mode, through_pwrite) in [(BufferedWrites::Thread, true), (BufferedWrites::IoUring, false)]
    {
        let config = Config { buffered_writes: mode, direct: DirectPolicy::Off, ..small_config() };
        let rig = Rig::with(1, config);
        let data = pattern(31, MIB);
        let file = TempFile::new("buffered-writes", &vec![0; MIB]);
        let client = file.open_rw();
        let handle = rig.driver.handle_register(client.as_raw_fd()).expect("register");
        let buffer = rig.alloc(MIB);
        rig.set_dev_bytes(buffer, &data);
        // Four chunks: the engine, not the caller's thread.
        let io = RawIo { size_bytes: MIB as u64, file_offset_bytes: 0, buffer_offset_bytes: 0 };
        let guard = fault::install(Plan {
            seed: 0xB0F,
            rules: vec![every(Site::FileWrite, Fault::Errno(libc::EIO))],
        });
        let result = rig.driver.io_sync(Direction::Write, handle, buffer, io);
        let injected = guard.injected()[0];
        drop(guard);
        if through_pwrite {
            assert!(injected > 0, "{mode:?}: no pwrite was made");
            assert!(matches!(result, Err(IoError::Os(libc::EIO))), "{mode:?}: {result:?}");
        } else {
            assert_eq!(injected, 0, "{mode:?}: a pwrite was made");
            assert_eq!(result, Ok(MIB), "{mode:?}");
            assert_bytes(&file.contents(), &data, "the file after the write");
        }
        // Without the fault, the write lands either way.
        assert_eq!(rig.driver.io_sync(Direction::Write, handle, buffer, io), Ok(MIB), "{mode:?}");
        assert_bytes(&file.contents(), &data, "the file after the clean write");
        rig.driver.handle_deregister(handle);
    }
}

/// A small fully FIXED read is copied on its own stream out of a slot
/// (`async_op::stream_copy`); when its file read fails, the stream still runs that copy,
/// and the destination must come out as it was, with `*bytes_p = -EIO`.
#[test]
fn a_failed_read_copied_on_its_stream_leaves_the_destination_as_it_was() {
    let _serial = serial();
    let rig = Rig::with(
        1,
        hipfile_runtime::config::Config {
            stream_copies: hipfile_runtime::config::StreamCopies::Idle,
            ..small_config()
        },
    );
    let data = pattern(5, MIB);
    let file = TempFile::new("slot-eio", &data);
    let fd = file.open_rw();
    let handle = rig.register(&fd);
    let buffer = rig.alloc(MIB);
    rig.driver.buf_register(buffer, MIB as u64, 0).expect("buf_register");
    let old = pattern(6, 64 * KIB);
    rig.set_dev_bytes(buffer, &old);
    let stream = rig.registered_stream(7);
    let copies =
        || rig.driver.async_stats().stream_copies.load(std::sync::atomic::Ordering::SeqCst);
    let before = copies();
    let guard = fault::install(Plan {
        seed: 0x510,
        rules: vec![
            every(Site::ChunkRead, Fault::Errno(libc::EIO)),
            every(Site::FileRead, Fault::Errno(libc::EIO)),
        ],
    });
    let p = params(16 * KIB, 4096, 4096);
    rig.read(handle, buffer, &p, stream);
    rig.sync(stream);
    drop(guard);
    assert_eq!(bytes(&p), -(libc::EIO as isize));
    assert_bytes(&rig.dev_bytes(buffer, 64 * KIB), &old, "the destination as it was");
    assert_eq!(copies(), before + 1, "copied on its stream");
    // The same read without the fault moves the file's bytes.
    let p = params(16 * KIB, 4096, 4096);
    rig.read(handle, buffer, &p, stream);
    rig.sync(stream);
    assert_eq!(bytes(&p), 16 * KIB as isize);
    assert_bytes(
        &rig.dev_bytes(buffer, 16 * KIB + 4096)[4096..],
        &data[4096..4096 + 16 * KIB],
        "data",
    );
}

/// A fully FIXED write copied into a slot on its own stream (`HIPFILE_STREAM_COPIES=all`):
/// when that copy cannot be enqueued the submission is refused with
/// hipFileHipDriverError and `*bytes_p` untouched (later writes are copied again); when
/// the file write fails, `*bytes_p` is the error and the stream goes
/// on.
#[test]
fn a_write_copied_into_a_slot_fails_cleanly() {
    let _serial = serial();
    let config = Config {
        stream_copies: hipfile_runtime::config::StreamCopies::All,
        stream_copy_slots: hipfile_runtime::config::StreamCopySlots::Pinned,
        ..small_config()
    };
    let rig = Rig::with(1, config);
    let file = TempFile::new("slot-write", &pattern(7, MIB));
    let fd = file.open_rw();
    let handle = rig.register(&fd);
    let buffer = rig.alloc(MIB);
    let data = pattern(8, 64 * KIB);
    rig.set_dev_bytes(buffer, &data);
    let stream = rig.registered_stream(15);
    let copies =
        || rig.driver.async_stats().stream_copies.load(std::sync::atomic::Ordering::SeqCst);
    let before = copies();
    let refused = params(64 * KIB, 0, 0);
    refused.bytes_done.store(-77, std::sync::atomic::Ordering::SeqCst);
    let guard =
        fault::install(Plan { seed: 0x511, rules: vec![once(Site::DeviceCopy, Fault::Errno(0))] });
    let got = rig.submit(Direction::Write, handle, buffer, &refused, stream);
    assert_eq!(guard.injected(), vec![1]);
    drop(guard);
    assert_eq!(got.map_err(|e| e.code), Err(OpError::HipDriverError));
    assert_eq!(bytes(&refused), -77, "*bytes_p untouched");
    // Later writes are copied into slots on the stream and land.
    let written: Vec<_> = (0..4).map(|i| params(64 * KIB, (i * 64 * KIB) as i64, 0)).collect();
    for p in &written {
        rig.write(handle, buffer, p, stream);
    }
    rig.sync(stream);
    assert!(written.iter().all(|p| bytes(p) == (64 * KIB) as isize));
    assert_eq!(copies(), before + 4, "copied into slots on the stream");
    assert_bytes(&file.contents()[3 * 64 * KIB..4 * 64 * KIB], &data, "the last write");
    // A failing file write: -EIO, and the stream goes on.
    let guard = fault::install(Plan {
        seed: 0x512,
        rules: vec![
            every(Site::ChunkWrite, Fault::Errno(libc::EIO)),
            every(Site::FileWrite, Fault::Errno(libc::EIO)),
        ],
    });
    let failed = params(64 * KIB, 0, 0);
    rig.write(handle, buffer, &failed, stream);
    rig.sync(stream);
    drop(guard);
    assert_eq!(bytes(&failed), -(libc::EIO as isize));
}

/// A long op copied on its stream in pieces (`HIPFILE_STREAM_COPIES=all`): each piece is
/// enqueued and watched like an op of its own, so one that cannot be enqueued cannot
/// refuse what the pieces before it started. The first piece's wait refused: the
/// submission is refused (hipFileHipDriverError, `*bytes_p` untouched, nothing moved).
/// The third piece's wait refused: the op is accepted and ends, after its first two
/// pieces (which moved their 32 MiB), with hipFileHipDriverError; nothing past them
/// moves. The stream goes on either way.
#[test]
fn a_long_op_whose_piece_cannot_be_enqueued_fails_cleanly() {
    long_op_with_a_refused_piece(256 * MIB, 16 * MIB);
}

/// The same through a stream's spare slots: with a small slot cap (32 MiB: two 16 MiB
/// slots, room for the eight streams' spares the test makes) no ring of four is free, so
/// the 64 MiB op goes through its stream's spares in 4 MiB pieces (`async_op/slots.rs`);
/// the third piece refused, 8 MiB moved. The stream's spares are then retired (a read of
/// the refused piece may have been posted ahead into one), and the next op takes the
/// engine's path.
#[test]
fn an_op_through_a_spare_whose_piece_cannot_be_enqueued_fails_cleanly() {
    long_op_with_a_refused_piece(32 * MIB, 4 * MIB);
}

/// The test above with `cap_bytes` of slots of each large size, where the pieces are
/// `piece_bytes` long.
fn long_op_with_a_refused_piece(cap_bytes: usize, piece_bytes: usize) {
    let _serial = serial();
    let config = Config {
        stream_copies: hipfile_runtime::config::StreamCopies::All,
        stream_copy_slots: hipfile_runtime::config::StreamCopySlots::Pinned,
        stream_copy_cap_bytes: cap_bytes,
        ..small_config()
    };
    let rig = Rig::with(1, config);
    let len = 80 * MIB;
    let file_data = pattern(21, len);
    let file = TempFile::new("long-refused", &file_data);
    let fd = file.open_rw();
    let handle = rig.register(&fd);
    let buffer = rig.alloc(len);
    let old = pattern(22, len);
    let file_reset = std::fs::OpenOptions::new().write(true).open(&file.path).expect("open");
    for direction in [Direction::Read, Direction::Write] {
        // Flags 15: the read's first pieces are staged at submission; 5: read at arm.
        for flags in [15u32, 5] {
            for failing_piece in [0u64, 2] {
                let what = format!("{direction:?} flags {flags}, piece {failing_piece} refused");
                rig.set_dev_bytes(buffer, &old);
                std::os::unix::fs::FileExt::write_all_at(&file_reset, &file_data, 0)
                    .expect("reset");
                let stream = rig.registered_stream(flags);
                let gate = rig.pause(stream).expect("pause");
                let p = params(64 * MIB, 0, 0);
                p.bytes_done.store(-77, std::sync::atomic::Ordering::SeqCst);
                let mut rules = Vec::new();
                if failing_piece > 0 {
                    rules.push(Rule {
                        limit: failing_piece,
                        ..every(Site::StreamWait, Fault::Pass)
                    });
                }
                rules.push(once(Site::StreamWait, Fault::Errno(0)));
                let guard = fault::install(Plan { seed: 0x513, rules });
                let got = rig.submit(direction, handle, buffer, &p, stream);
                drop(guard);
                drop(gate);
                rig.sync(stream);
                let moved = match failing_piece {
                    0 => {
                        assert_eq!(got.map_err(|e| e.code), Err(OpError::HipDriverError), "{what}");
                        assert_eq!(bytes(&p), -77, "{what}: *bytes_p untouched");
                        0
                    }
                    n => {
                        got.expect("accepted");
                        assert_eq!(bytes(&p), neg(OpError::HipDriverError), "{what}");
                        n as usize * piece_bytes
                    }
                };
                let (device, contents) = (rig.dev_bytes(buffer, len), file.contents());
                match direction {
                    Direction::Read => {
                        assert_bytes(&device[..moved], &file_data[..moved], &what);
                        assert_bytes(&device[moved..], &old[moved..], &format!("{what}: past"));
                        assert_bytes(&contents, &file_data, &format!("{what}: the file"));
                    }
                    Direction::Write => {
                        assert_bytes(&contents[..moved], &old[..moved], &what);
                        let rest = &file_data[moved..];
                        assert_bytes(&contents[moved..], rest, &format!("{what}: past"));
                        assert_bytes(&device, &old, &format!("{what}: the buffer"));
                    }
                }
                // The stream goes on: a long op after it moves its bytes.
                let spared =
                    || rig.driver.async_stats().spare_ops.load(std::sync::atomic::Ordering::SeqCst);
                let spared_before = spared();
                let next = params(40 * MIB, (8 * MIB) as i64, 0);
                rig.submit(Direction::Read, handle, buffer, &next, stream).expect("accepted");
                rig.sync(stream);
                // Through spares only where the op went through them and no later piece
                // of it was refused (then they are retired).
                let through_spares = piece_bytes < 16 * MIB && failing_piece == 0;
                assert_eq!(spared() - spared_before, u64::from(through_spares), "{what}: spares");
                assert_eq!(bytes(&next), (40 * MIB) as isize, "{what}: the next op");
                let got = rig.dev_bytes(buffer, 40 * MIB);
                let want = &file.contents()[8 * MIB..48 * MIB];
                assert_bytes(&got, want, &format!("{what}: the next op"));
            }
        }
    }
}

/// With `all`, a slot size's pinned allocation that waits (on CUDA it can wait for as long
/// as an application's `cuStreamCreate` waits for streams our ops hold) holds up nobody
/// else: the pool lets its lock go while it allocates, so a second submission needing the
/// same size (and every thread handing a slot of that size back: executors and the arm
/// poller, on which releases depend) goes on. Here the first 1 MiB slot's allocation takes
/// 2 s longer; a 1 MiB read on another stream submitted meanwhile returns at once (it
/// allocates a slab of its own), and both reads land.
#[test]
fn a_slot_allocation_that_waits_holds_up_no_other_thread() {
    let _serial = serial();
    let config = Config {
        stream_copies: hipfile_runtime::config::StreamCopies::All,
        stream_copy_slots: hipfile_runtime::config::StreamCopySlots::Pinned,
        stream_copy_cap_bytes: 64 * MIB,
        ..small_config()
    };
    let rig = Arc::new(Rig::with(1, config));
    let data = pattern(25, 4 * MIB);
    let file = TempFile::new("slot-alloc-waits", &data);
    let fd = file.open_rw();
    let handle = rig.register(&fd);
    let buffer = rig.alloc(4 * MIB);
    let streams = [rig.registered_stream(15), rig.registered_stream(15), rig.registered_stream(15)];
    // The engine and the streams' words are allocated before the plan: its one delayed
    // allocation is the first 1 MiB slab.
    let warm = params(16 * KIB, 0, (3 * MIB) as i64);
    rig.submit(Direction::Read, handle, buffer, &warm, streams[2]).expect("warm-up");
    rig.sync(streams[2]);
    let delay = Duration::from_secs(2);
    let guard = fault::install(Plan {
        seed: 0x514,
        rules: vec![once(Site::PinnedAlloc, Fault::Delay(delay))],
    });
    let first = params(MIB, 0, 0);
    let submitter = {
        let (rig, first, stream) = (Arc::clone(&rig), Arc::clone(&first), streams[0]);
        std::thread::spawn(move || {
            let started = std::time::Instant::now();
            rig.submit(Direction::Read, handle, buffer, &first, stream).expect("first read");
            started.elapsed()
        })
    };
    wait_until("the first read in its delayed allocation", || guard.injected() == vec![1]);
    let second = params(MIB, MIB as i64, MIB as i64);
    let started = std::time::Instant::now();
    rig.submit(Direction::Read, handle, buffer, &second, streams[1]).expect("second read");
    let second_submit = started.elapsed();
    let first_submit = submitter.join().expect("submitter");
    drop(guard);
    assert!(
        first_submit >= delay / 2,
        "the delayed allocation was the first read's ({first_submit:?})"
    );
    assert!(
        second_submit < Duration::from_secs(1),
        "the second submission waited for the first one's allocation: {second_submit:?}"
    );
    rig.sync(streams[0]);
    rig.sync(streams[1]);
    assert_eq!((bytes(&first), bytes(&second)), (MIB as isize, MIB as isize));
    assert_bytes(&rig.dev_bytes(buffer, 2 * MIB), &data[..2 * MIB], "both reads");
}

/// A rig with `HIPFILE_STREAM_COPIES=all`, a 1 MiB pattern file and a 1 MiB buffer
/// holding other bytes, on which one 16 KiB read at file offset 8192 is submitted from
/// another thread while the enqueue of its slot's copy takes [`SLOW_ENQUEUE`] more
/// (injected).
struct SlowCopyEnqueue {
    rig: Arc<Rig>,
    data: Vec<u8>,
    old: Vec<u8>,
    _file: TempFile,
    _fd: std::fs::File,
    handle: HandleId,
    buffer: u64,
}

/// How long [`SlowCopyEnqueue`]'s copy enqueue is held: what the tests do meanwhile (an
/// arm, a 16 KiB read, a release, a poll) takes milliseconds; a second leaves a loaded
/// machine room.
const SLOW_ENQUEUE: Duration = Duration::from_secs(1);

impl SlowCopyEnqueue {
    fn new(tag: &str) -> SlowCopyEnqueue {
        let config = Config {
            stream_copies: hipfile_runtime::config::StreamCopies::All,
            stream_copy_slots: hipfile_runtime::config::StreamCopySlots::Pinned,
            // The stream copies' path: reads inside the submit call would take these.
            inline_read_bytes: 0,
            ..small_config()
        };
        let rig = Arc::new(Rig::with(1, config));
        let data = pattern(23, MIB);
        let file = TempFile::new(tag, &data);
        let fd = file.open_rw();
        let handle = rig.register(&fd);
        let buffer = rig.alloc(MIB);
        let old = pattern(24, MIB);
        rig.set_dev_bytes(buffer, &old);
        SlowCopyEnqueue { rig, data, old, _file: file, _fd: fd, handle, buffer }
    }

    /// Submits the read on `stream` from another thread, its copy's enqueue slowed; the
    /// plan's guard and the submitting thread.
    fn submit(
        &self,
        stream: StreamHandle,
        p: &Arc<AsyncParams>,
    ) -> (fault::PlanGuard, std::thread::JoinHandle<Result<(), hipfile_runtime::Error>>) {
        let guard = fault::install(Plan {
            seed: 0x514,
            rules: vec![once(Site::DeviceCopy, Fault::Delay(SLOW_ENQUEUE))],
        });
        let (rig, p, handle, buffer) =
            (Arc::clone(&self.rig), Arc::clone(p), self.handle, self.buffer);
        let submitter =
            std::thread::spawn(move || rig.submit(Direction::Read, handle, buffer, &p, stream));
        (guard, submitter)
    }

    /// Holds `stream` until the submission is in its copy's enqueue (its doorbell and
    /// wait queued), applies `change`, lets the stream reach the op and waits for it.
    fn run_held(
        &self,
        stream: StreamHandle,
        p: &Arc<AsyncParams>,
        change: impl FnOnce(&AsyncParams),
    ) {
        let gate = self.rig.pause(stream).expect("pause");
        let (guard, submitter) = self.submit(stream, p);
        wait_until("the submission in its copy's enqueue", || guard.injected() == vec![1]);
        assert!(!submitter.is_finished(), "the submission is still in its copy's enqueue");
        change(p);
        drop(gate);
        submitter.join().expect("submitter").expect("accepted");
        assert_eq!(guard.injected(), vec![1]);
        drop(guard);
        self.rig.sync(stream);
    }
}

/// `HIPFILE_STREAM_COPIES=all`: an op copied on its own stream is watched before its
/// copy is enqueued, and its stream is released without waiting for that enqueue: on
/// CUDA the enqueue may wait for a lock that a thread making streams holds while it waits
/// for this very stream (README, Known limits; found on the H200 when the release waited
/// for the enqueue). While the enqueue is slow (an injected second), the op's arm, its
/// read and its release run; it publishes once the copy is queued, and the copy, queued
/// behind the released wait, still lands. For a read at arm (flags 5) and one staged at
/// submission (15).
#[test]
fn a_read_copied_on_its_stream_is_released_before_its_copy_is_enqueued() {
    let _serial = serial();
    let t = SlowCopyEnqueue::new("slow-copy-enqueue");
    for flags in [5u32, 15] {
        let stream = t.rig.registered_stream(flags);
        let releases =
            || t.rig.driver.async_stats().host_releases.load(std::sync::atomic::Ordering::SeqCst);
        let before = releases();
        let p = params(16 * KIB, 8192, 0);
        let (guard, submitter) = t.submit(stream, &p);
        wait_until("the release, while the copy is being enqueued", || releases() > before);
        assert_eq!(bytes(&p), 0, "flags {flags}: not published before its copy is enqueued");
        assert!(!submitter.is_finished(), "flags {flags}: the submission is still enqueueing");
        submitter.join().expect("submitter").expect("accepted");
        assert_eq!(guard.injected(), vec![1]);
        drop(guard);
        t.rig.sync(stream);
        assert_eq!(bytes(&p), 16 * KIB as isize, "flags {flags}");
        let read = &t.data[8192..8192 + 16 * KIB];
        assert_bytes(&t.rig.dev_bytes(t.buffer, 16 * KIB), read, &format!("flags {flags}"));
        t.rig.set_dev_bytes(t.buffer, &t.old);
    }
}

/// The driver's pending report (what a hang guard prints) does not wait for a submission
/// stuck in its enqueue (on CUDA: behind a lock a blocked `cuStreamCreate` holds, the hang
/// such a report must explain); it names the stream as enqueueing now.
#[test]
fn the_pending_report_does_not_wait_for_a_stuck_submission() {
    let _serial = serial();
    let t = SlowCopyEnqueue::new("report-during-enqueue");
    let stream = t.rig.registered_stream(15);
    let p = params(16 * KIB, 0, 0);
    let (guard, submitter) = t.submit(stream, &p);
    // The submission reaches its copy's enqueue after the engine's start (on CUDA: its
    // context, a hundred milliseconds and more), so the report is asked until it names
    // the stream; a report that waited for the stream's lock would return only after
    // the submission, and never name it.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        assert!(!submitter.is_finished(), "the submission ended before a report named it");
        let report = t.rig.driver.pending_report();
        if report.contains("a submission is enqueueing its commands now") {
            assert!(!submitter.is_finished(), "the report waited for the submission:\n{report}");
            break;
        }
        assert!(Instant::now() < deadline, "no report named the submission:\n{report}");
        std::thread::sleep(Duration::from_millis(5));
    }
    submitter.join().expect("submitter").expect("accepted");
    assert_eq!(guard.injected(), vec![1]);
    drop(guard);
    t.rig.sync(stream);
    assert_eq!(bytes(&p), 16 * KIB as isize);
    assert_bytes(&t.rig.dev_bytes(t.buffer, 16 * KIB), &t.data[..16 * KIB], "read");
}

/// `HIPFILE_STREAM_COPIES=all`: when the copy out of a read's slot cannot be enqueued
/// (after the op was watched), the op is not refused — its stream may already have
/// reached it — but ends with hipFileHipDriverError, its destination untouched; for a
/// read staged at submission (flags 15) and one read at arm (5).
#[test]
fn a_read_whose_copy_cannot_be_enqueued_ends_with_a_driver_error() {
    let _serial = serial();
    let config = Config {
        stream_copies: hipfile_runtime::config::StreamCopies::All,
        stream_copy_slots: hipfile_runtime::config::StreamCopySlots::Pinned,
        // The stream copies' path: reads inside the submit call would take these.
        inline_read_bytes: 0,
        ..small_config()
    };
    let rig = Rig::with(1, config);
    let data = pattern(24, MIB);
    let file = TempFile::new("failed-copy-enqueue", &data);
    let fd = file.open_rw();
    let handle = rig.register(&fd);
    let buffer = rig.alloc(MIB);
    let old = pattern(25, 64 * KIB);
    rig.set_dev_bytes(buffer, &old);
    for flags in [15u32, 5] {
        let stream = rig.registered_stream(flags);
        let p = params(16 * KIB, 4096, 0);
        let guard = fault::install(Plan {
            seed: 0x515,
            rules: vec![once(Site::DeviceCopy, Fault::Errno(0))],
        });
        rig.submit(Direction::Read, handle, buffer, &p, stream).expect("accepted");
        assert_eq!(guard.injected(), vec![1], "flags {flags}");
        drop(guard);
        rig.sync(stream);
        assert_eq!(bytes(&p), neg(OpError::HipDriverError), "flags {flags}");
        assert_bytes(&rig.dev_bytes(buffer, 64 * KIB), &old, &format!("flags {flags}: untouched"));
        // The stream goes on.
        let next = params(16 * KIB, 4096, 0);
        rig.read(handle, buffer, &next, stream);
        rig.sync(stream);
        assert_eq!(bytes(&next), 16 * KIB as isize, "flags {flags}: the next read");
        rig.set_dev_bytes(buffer, &old);
    }
}

/// The same slow copy enqueue ([`SLOW_ENQUEUE`]) for a read at arm whose late file offset turns out
/// invalid when the stream reaches it: it fails with -5022 and its destination stays as it
/// was — the slot is filled from the destination only once the copy is queued, which
/// writes those bytes back.
#[test]
fn a_read_bound_invalid_while_its_copy_is_enqueued_leaves_the_destination() {
    let _serial = serial();
    let t = SlowCopyEnqueue::new("slow-copy-invalid");
    let stream = t.rig.registered_stream(5);
    let p = params(16 * KIB, 8192, 0);
    t.run_held(stream, &p, |p| {
        p.file_offset_bytes.store(-4096, std::sync::atomic::Ordering::SeqCst)
    });
    assert_eq!(bytes(&p), neg(OpError::InvalidValue));
    assert_bytes(&t.rig.dev_bytes(t.buffer, MIB), &t.old, "the destination as it was");
}

/// The same slow copy enqueue for a read on a stream without FIXED flags whose buffer
/// offset moves before the stream reaches it: it declines its slot, the engine moves it to
/// the new range, and its release (with the fill of the slot from the submitted range)
/// waits for the copy's enqueue, so the submitted range stays as it was.
#[test]
fn a_read_declining_its_slot_while_its_copy_is_enqueued_leaves_the_submitted_range() {
    let _serial = serial();
    let t = SlowCopyEnqueue::new("slow-copy-declined");
    let stream = t.rig.registered_stream(0);
    let p = params(16 * KIB, 8192, 0);
    let moved = (512 * KIB) as i64;
    t.run_held(stream, &p, |p| {
        p.buffer_offset_bytes.store(moved, std::sync::atomic::Ordering::SeqCst)
    });
    assert_eq!(bytes(&p), 16 * KIB as isize);
    let got = t.rig.dev_bytes(t.buffer, MIB);
    assert_bytes(&got[..16 * KIB], &t.old[..16 * KIB], "the submitted range");
    let moved = &got[512 * KIB..512 * KIB + 16 * KIB];
    assert_bytes(moved, &t.data[8192..8192 + 16 * KIB], "the bound range");
}

/// Reads of 4 MiB staged into pinned slots (`HIPFILE_STREAM_COPIES=all`; pinned slots are
/// filled by one `pread` each, on every device): a rig under `config`, a file of `ops`
/// reads' pattern bytes, its handle and a device buffer as long.
struct StagedReads {
    rig: Rig,
    data: Vec<u8>,
    _file: TempFile,
    _fd: std::fs::File,
    handle: HandleId,
    buffer: u64,
}

const STAGED_OP_BYTES: usize = 4 * MIB;

impl StagedReads {
    fn new(tag: &str, ops: usize, config: Config) -> StagedReads {
        let config = Config {
            stream_copies: hipfile_runtime::config::StreamCopies::All,
            stream_copy_slots: hipfile_runtime::config::StreamCopySlots::Pinned,
            ..config
        };
        let rig = Rig::with(1, config);
        let data = pattern(71, ops * STAGED_OP_BYTES);
        let file = TempFile::new(tag, &data);
        let fd = file.open_rw();
        let handle = rig.register(&fd);
        let buffer = rig.alloc(ops * STAGED_OP_BYTES);
        StagedReads { rig, data, _file: file, _fd: fd, handle, buffer }
    }

    /// Submits read `i` (file and buffer offset `i` × 4 MiB) on `stream`.
    fn read(&self, i: usize, stream: StreamHandle) -> Arc<AsyncParams> {
        let offset = (i * STAGED_OP_BYTES) as i64;
        let p = params(STAGED_OP_BYTES, offset, offset);
        self.rig.read(self.handle, self.buffer, &p, stream);
        p
    }

    /// Reads started ahead of their stream so far.
    fn prefetched(&self) -> u64 {
        self.rig.driver.async_stats().prefetched.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Checks reads `range` (each moved 4 MiB, the right bytes in place).
    fn check(&self, range: std::ops::Range<usize>, ops: &[Arc<AsyncParams>], what: &str) {
        for (i, p) in range.clone().zip(ops) {
            assert_eq!(bytes(p), STAGED_OP_BYTES as isize, "{what}: op {i}");
        }
        let (start, end) = (range.start * STAGED_OP_BYTES, range.end * STAGED_OP_BYTES);
        let got = self.rig.dev_bytes(self.buffer + start as u64, end - start);
        assert_bytes(&got, &self.data[start..end], what);
    }
}

/// `HIPFILE_STREAM_COPIES=all`: reads staged into slots of their own read ahead within
/// their stream's read-ahead window, like the engine's prefetch, instead of all at once.
/// With every file read slowed (500 ms), sixteen 4 MiB reads submitted on a held stream
/// start no more than the window's worth (32 MiB: eight) before the first fills end; the
/// rest start as those end or when the stream reaches them, and every byte lands.
#[test]
fn staged_slot_reads_read_ahead_within_the_stream_window() {
    let _serial = serial();
    const OPS: usize = 16;
    // The driver-wide budget above the stream's window: the window bounds.
    let config = Config { prefetch_budget_bytes: Some(256 * MIB), ..small_config() };
    let t = StagedReads::new("slot-window", OPS, config);
    let stream = t.rig.registered_stream(7);
    let window_ops = hipfile_runtime::stream::PREFETCH_WINDOW_BYTES as usize / STAGED_OP_BYTES;
    let guard = fault::install(Plan {
        seed: 0x5107,
        rules: vec![every(Site::FileRead, Fault::Delay(Duration::from_millis(500)))],
    });
    let gate = t.rig.pause(stream).expect("pause");
    let started = Instant::now();
    let ops: Vec<_> = (0..OPS).map(|i| t.read(i, stream)).collect();
    let ahead = t.prefetched();
    // Submitting takes milliseconds; the bound leaves a loaded machine 400 ms.
    assert!(started.elapsed() < Duration::from_millis(400), "submitted before a fill ended");
    assert_eq!(ahead, window_ops as u64, "reads started ahead of the held stream");
    // The window slides while the stream is held: deferred reads start as fills end.
    wait_until("a deferred read to start", || t.prefetched() > ahead);
    gate.release();
    t.rig.sync(stream);
    drop(guard);
    t.check(0..OPS, &ops, "every read");
    let copies = t.rig.driver.async_stats().stream_copies.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(copies, OPS as u64, "every read copied on its stream");
}

/// The same reads past the driver's read-ahead budget, which another stream's slow
/// staged read holds: none can start ahead, so each is read when its stream reaches it
/// (in stream order, no read-ahead), every byte right, while that other read is still in.
#[test]
fn staged_slot_reads_past_the_budget_are_read_when_their_stream_reaches_them() {
    let _serial = serial();
    const OPS: usize = 6;
    let config = Config {
        prefetch_budget_bytes: Some(STAGED_OP_BYTES),
        // One job per read, each stream on an executor of its own: the holder's slow
        // read holds its executor's blocking thread, not the reader's.
        request_parallelism: 1,
        ..small_config()
    };
    let t = StagedReads::new("slot-budget", OPS + 1, config);
    let (holder, reader) = (t.rig.registered_stream(7), t.rig.registered_stream(7));
    // The first file read (the holder's) takes 3 s; the rest are not slowed.
    let guard = fault::install(Plan {
        seed: 0x5108,
        rules: vec![once(Site::FileRead, Fault::Delay(Duration::from_secs(3)))],
    });
    let held = t.read(OPS, holder);
    wait_until("the holder's read to start", || guard.injected() == vec![1]);
    let started = Instant::now();
    let ops: Vec<_> = (0..OPS).map(|i| t.read(i, reader)).collect();
    t.rig.sync(reader);
    assert!(started.elapsed() < Duration::from_secs(2), "read while the budget was held");
    assert_eq!(t.prefetched(), 1, "only the holder's read started ahead");
    t.check(0..OPS, &ops, "reads at arm");
    t.rig.sync(holder);
    drop(guard);
    t.check(OPS..OPS + 1, &[held], "the holder's read");
}

/// A read inside the submit call (`HIPFILE_INLINE_READ_KB`) that meets a byte the page
/// cache does not hold (the kernel's `EAGAIN` under `RWF_NOWAIT`, injected), a failing
/// read, or a copy the device refuses goes the ordinary way: the same bytes, nothing
/// counted inside the call; the stream's next read goes inside the call again.
#[test]
fn a_read_inside_the_submit_call_that_cannot_finish_goes_the_ordinary_way() {
    let _serial = serial();
    let rig = Rig::with(1, Config { inline_read_bytes: 64 * KIB, ..small_config() });
    let data = pattern(26, MIB);
    let file = TempFile::new("inline-fallback", &data);
    let fd = file.open_rw();
    let handle = rig.register(&fd);
    let buffer = rig.alloc(MIB);
    let stream = rig.registered_stream(7);
    let inline =
        || rig.driver.async_stats().read_at_submission.load(std::sync::atomic::Ordering::SeqCst);
    let faults = [
        (Site::FileRead, Fault::Errno(libc::EAGAIN)),
        (Site::FileRead, Fault::Errno(libc::EIO)),
        (Site::DeviceCopy, Fault::Errno(0)),
    ];
    for (i, (site, fault)) in faults.into_iter().enumerate() {
        let what = format!("{site:?} {fault:?}");
        let before = inline();
        let offset = (i + 1) * 64 * KIB;
        let p = params(16 * KIB, offset as i64, 0);
        let guard = fault::install(Plan { seed: 0x520 + i as u64, rules: vec![once(site, fault)] });
        rig.read(handle, buffer, &p, stream);
        assert_eq!(guard.injected(), vec![1], "{what}");
        drop(guard);
        rig.sync(stream);
        assert_eq!(inline(), before, "{what}: the ordinary way");
        assert_eq!(bytes(&p), (16 * KIB) as isize, "{what}");
        let got = rig.dev_bytes(buffer, 16 * KIB);
        assert_bytes(&got, &data[offset..offset + 16 * KIB], &what);
        let next = params(16 * KIB, 0, 0);
        rig.read(handle, buffer, &next, stream);
        rig.sync(stream);
        assert_eq!(inline(), before + 1, "{what}: the next read goes inside the call");
        assert_bytes(&rig.dev_bytes(buffer, 16 * KIB), &data[..16 * KIB], &what);
    }
}

/// A write copied on its stream in pieces (`HIPFILE_STREAM_WRITE_PIECE_KB`) whose third
/// piece's copy cannot be enqueued, after the first two pieces' copies and doorbells were:
/// the submission is refused (hipFileHipDriverError), nothing of the op is written, its
/// stream is not held, and the stream's next ops run and land in order (the sequence
/// numbers those doorbells rang are not given to them: one would be armed by the stale
/// doorbell before its stream reached it). A refusal at the first piece gives every
/// number back and changes nothing either.
#[test]
fn a_write_in_pieces_refused_midway_leaves_its_stream_working() {
    let _serial = serial();
    let config = Config {
        stream_copies: hipfile_runtime::config::StreamCopies::All,
        stream_copy_slots: hipfile_runtime::config::StreamCopySlots::Pinned,
        direct: DirectPolicy::Off,
        stream_write_piece_bytes: MIB,
        ..small_config()
    };
    let rig = Arc::new(Rig::with(1, config));
    let len = 16 * MIB;
    let data = pattern(5, len);
    let file = TempFile::new("write-pieces-refused", &data);
    let fd = file.open_rw();
    let handle = rig.register(&fd);
    let buffer = rig.alloc(len);
    rig.driver.buf_register(buffer, len as u64, 0).expect("buf_register");
    let fresh = pattern(99, len);
    rig.set_dev_bytes(buffer, &fresh);
    let stream = rig.registered_stream(15);
    for passed in [2u64, 0] {
        let refused = params(4 * MIB, 0, 0);
        let guard = fault::install(Plan {
            seed: 3,
            rules: vec![
                Rule { site: Site::DeviceCopy, fault: Fault::Pass, one_in: 1, limit: passed },
                Rule { site: Site::DeviceCopy, fault: Fault::Errno(0), one_in: 1, limit: 1 },
            ],
        });
        let submitted = rig.driver.submit_async(Direction::Write, handle, buffer, &refused, stream);
        assert_eq!(guard.injected(), vec![passed, 1], "{passed} pieces copied, then refused");
        drop(guard);
        assert_eq!(
            submitted.map_err(|e| e.code),
            Err(OpError::HipDriverError),
            "refused after {passed} pieces"
        );
        // The stream goes on: later writes (in pieces and whole) land, in order.
        let after = params(4 * MIB, (8 * MIB) as i64, (8 * MIB) as i64);
        let small = params(64 * KIB, (4 * MIB) as i64, (4 * MIB) as i64);
        rig.write(handle, buffer, &after, stream);
        rig.write(handle, buffer, &small, stream);
        let synced = Arc::clone(&rig);
        run_watched(&rig.driver, "writes after a refused one", HANG_GUARD, move || {
            synced.sync(stream)
        });
        assert_eq!(bytes(&after), (4 * MIB) as isize);
        assert_eq!(bytes(&small), (64 * KIB) as isize);
        assert_eq!(bytes(&refused), 0, "the refused write has no result");
        let contents = file.contents();
        assert_bytes(&contents[..4 * MIB], &data[..4 * MIB], "nothing of the refused write");
        let next = 8 * MIB..12 * MIB;
        assert_bytes(&contents[next.clone()], &fresh[next], "the next write");
        let small_range = 4 * MIB..4 * MIB + 64 * KIB;
        assert_bytes(&contents[small_range.clone()], &fresh[small_range], "the small one");
    }
    let pieces =
        rig.driver.async_stats().writes_in_pieces.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(pieces, 2, "the writes after the refusals went in pieces");
}

/// A rig for long writes under `all` (pinned slots, 256 MiB of them per size, the page
/// cache): a file holding `contents`, registered, and a device buffer as long.
struct LongWrites {
    rig: Rig,
    file: TempFile,
    fd: std::fs::File,
    handle: HandleId,
    buffer: u64,
}

impl LongWrites {
    fn new(tag: &str, contents: &[u8]) -> LongWrites {
        let config = Config {
            stream_copies: hipfile_runtime::config::StreamCopies::All,
            stream_copy_slots: hipfile_runtime::config::StreamCopySlots::Pinned,
            stream_copy_cap_bytes: 256 * MIB,
            direct: DirectPolicy::Off,
            ..small_config()
        };
        let rig = Rig::with(1, config);
        let file = TempFile::new(tag, contents);
        let fd = file.open_rw();
        let handle = rig.register(&fd);
        let buffer = rig.alloc(contents.len());
        LongWrites { rig, file, fd, handle, buffer }
    }
}

/// `all`, long writes (pieces of 16 MiB sharing a ring of slots): the stream copies piece
/// `j + 1` into its slot while the engine writes piece `j`, not after piece `j`'s release.
/// The first piece's `pwrite` is made 2 s slower: meanwhile the stream has copied the
/// first two pieces (32 MiB device → host) and no more (the third piece's copy stands
/// behind the first piece's wait), and nothing is published. Then the op lands whole.
/// On a fully FIXED stream and an unregistered one.
#[test]
fn a_long_write_has_its_stream_copy_the_next_piece_while_one_is_written() {
    let _serial = serial();
    let len = 48 * MIB;
    let LongWrites { rig, file, fd: _fd, handle, buffer } =
        LongWrites::new("long-write-overlap", &pattern(31, len));
    let Some(cpu) = rig.cpu_only("counts the cpu device's device -> host bytes") else { return };
    for flags in [Some(15), None] {
        let what = format!("flags {flags:?}");
        let fresh = pattern(32 + u64::from(flags.unwrap_or(0)), len);
        rig.set_dev_bytes(buffer, &fresh);
        let stream = rig.stream_with(flags);
        let before = cpu.stats().bytes_device_to_host;
        let p = params(len, 0, 0);
        let guard = fault::install(Plan {
            seed: 0x0E1,
            rules: vec![once(Site::FileWrite, Fault::Delay(Duration::from_secs(2)))],
        });
        rig.submit(Direction::Write, handle, buffer, &p, stream).expect("accepted");
        let copied = || (cpu.stats().bytes_device_to_host - before) as usize;
        let deadline = Instant::now() + Duration::from_millis(1500);
        while copied() < 32 * MIB && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        // Give a third copy, were one to run early, the time to show.
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(copied(), 32 * MIB, "{what}: two pieces copied while the first is written");
        assert_eq!(bytes(&p), 0, "{what}: nothing published yet");
        rig.sync(stream);
        let injected = guard.injected()[0];
        drop(guard);
        assert_eq!(injected, 1, "{what}: the first pwrite was slowed");
        assert_eq!(bytes(&p), len as isize, "{what}");
        assert_eq!(copied(), len, "{what}: each piece copied once");
        assert_bytes(&file.contents(), &fresh, &format!("{what}: the file"));
    }
}

/// A long write whose third piece's copy into its slot is refused (that copy is enqueued
/// by the second piece, between its doorbell and its wait): the op is accepted, its first
/// two pieces land (32 MiB), it ends with hipFileHipDriverError, nothing past them is
/// written, and the stream goes on (a write after it lands whole).
#[test]
fn a_long_write_whose_next_piece_copy_is_refused_ends_after_the_pieces_before_it() {
    let _serial = serial();
    let len = 64 * MIB;
    let old = pattern(41, len);
    let LongWrites { rig, file, fd, handle, buffer } =
        LongWrites::new("long-write-copy-refused", &old);
    for flags in [Some(15), None] {
        let what = format!("flags {flags:?}");
        std::os::unix::fs::FileExt::write_all_at(&fd, &old, 0).expect("reset");
        let fresh = pattern(42 + u64::from(flags.unwrap_or(0)), len);
        rig.set_dev_bytes(buffer, &fresh);
        let stream = rig.stream_with(flags);
        let p = params(len, 0, 0);
        let rules = vec![
            Rule { limit: 2, ..every(Site::DeviceCopy, Fault::Pass) },
            once(Site::DeviceCopy, Fault::Errno(0)),
        ];
        let guard = fault::install(Plan { seed: 0x0E2, rules });
        rig.submit(Direction::Write, handle, buffer, &p, stream).expect("accepted");
        rig.sync(stream);
        let injected = guard.injected();
        drop(guard);
        assert!(!injected.is_empty(), "{what}: the third copy was refused");
        assert_eq!(bytes(&p), neg(OpError::HipDriverError), "{what}");
        let contents = file.contents();
        assert_bytes(&contents[..32 * MIB], &fresh[..32 * MIB], &format!("{what}: two pieces"));
        assert_bytes(&contents[32 * MIB..], &old[32 * MIB..], &format!("{what}: past them"));
        // The stream goes on.
        let next = params(len, 0, 0);
        rig.submit(Direction::Write, handle, buffer, &next, stream).expect("accepted");
        rig.sync(stream);
        assert_eq!(bytes(&next), len as isize, "{what}: the next write");
        assert_bytes(&file.contents(), &fresh, &format!("{what}: the next write"));
    }
}
