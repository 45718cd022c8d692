//! Engine-level properties seen through the [`Driver`] on the `cpu` device: arena
//! staging, fallback staging under pressure and its cap, idle executors that burn no
//! CPU, thread teardown on drop, and glommio's poll probe.
//!
//! The tests of this binary run one at a time ([`serial`]): two of them measure the
//! whole process (CPU time, thread list).

use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use hipfile_core::Direction;
use hipfile_runtime::config::{CallerThread, Config};
use hipfile_runtime::engine::EnginePhases;

#[allow(unused_imports, reason = "not every helper is used by every file")]
use hipfile_test_support::cpu_rig::*;
use hipfile_test_support::raw;

// ----------------------------------------------------------------------------------------
// Helpers
// ----------------------------------------------------------------------------------------

/// Serialises the tests of this binary.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// User plus system CPU time of the whole process.
fn process_cpu_time() -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `usage` is a live, writable rusage the kernel fills in.
    let result = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
    assert_eq!(result, 0, "getrusage");
    // SAFETY: rusage is plain integers, valid zeroed, and the kernel filled it.
    let usage = unsafe { usage.assume_init() };
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// Number of this process's threads whose name starts with `prefix`.
fn threads_named(prefix: &str) -> usize {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return 0 };
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("comm")).ok())
        .filter(|comm| comm.starts_with(prefix))
        .count()
}

/// Aborts the process unless dropped within `limit` (a hang would otherwise stall the
/// whole test run).
struct Watchdog {
    done: Arc<AtomicBool>,
}

impl Watchdog {
    fn new(what: &'static str, limit: Duration) -> Watchdog {
        let done = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&done);
        thread::spawn(move || {
            let deadline = Instant::now() + limit;
            while !flag.load(Ordering::SeqCst) {
                if Instant::now() > deadline {
                    eprintln!("watchdog: {what} did not finish within {limit:?}; aborting");
                    std::process::abort();
                }
                thread::sleep(Duration::from_millis(10));
            }
        });
        Watchdog { done }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.done.store(true, Ordering::SeqCst);
    }
}

// ----------------------------------------------------------------------------------------
/// The engine's phases once every executor is idle again (an executor adds its busy
/// time when its last job has ended, just after the job reported its result).
fn settled_phases(engine: &hipfile_runtime::engine::Engine) -> EnginePhases {
    eventually("every job ended", || engine.jobs_in_flight() == 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = engine.phases();
    loop {
        thread::sleep(Duration::from_millis(20));
        let now = engine.phases();
        if now == last || Instant::now() > deadline {
            return now;
        }
        last = now;
    }
}

// Tests
// ----------------------------------------------------------------------------------------

/// Also: every staging copy's event is destroyed once waited for, so reads and writes
/// through the executors leave no event behind on the device (a write used to leak one
/// per chunk).
#[test]
fn reads_and_writes_stage_through_the_arena_and_leave_no_events_behind() {
    let _serial = serial();
    let data = pattern(4 * MIB, 1);
    let file = TempFile::new(&tmpfs_dir(), &data);
    let client = file.open_rw();
    let (driver, device) = driver_with(config(&[0, 1]));
    let handle = driver.handle_register(client.as_raw_fd()).unwrap();
    let buf = device.malloc_device(0, 4 * MIB).unwrap();
    assert_eq!(driver.io_sync(Direction::Read, handle, buf, raw(4 * MIB, 0, 0)), Ok(4 * MIB));
    assert!(device_bytes(buf, 4 * MIB) == data);
    assert_eq!(device.live_events(), 0, "after a read");
    let engine = driver.engine().unwrap();
    // A job is counted just after it reports its result.
    let deadline = Instant::now() + Duration::from_secs(10);
    while engine.stats().jobs < 2 && Instant::now() < deadline {
        thread::yield_now();
    }
    let stats = engine.stats();
    assert!(stats.arena_chunks >= (4 * MIB / CHUNK) as u64, "{stats:?}");
    assert_eq!(stats.fallback_chunks, 0, "{stats:?}");
    assert_eq!(stats.jobs, 2, "one job per executor: {stats:?}");
    // The phase counters (`hipfile-bench --profile`) saw both jobs and every chunk.
    let phases = settled_phases(engine);
    assert_eq!(phases.chunks_read, (4 * MIB / CHUNK) as u64, "{phases:?}");
    assert_eq!(phases.chunks_written, 0, "{phases:?}");
    assert!(phases.job_ns > 0 && phases.read_wait_ns > 0, "{phases:?}");
    assert!(phases.read_wait_ns <= phases.job_ns, "a job waits within its time: {phases:?}");
    assert!(phases.busy_ns > 0, "{phases:?}");
    assert_eq!(phases.write_wait_ns, 0, "{phases:?}");
    assert_eq!(driver.io_sync(Direction::Write, handle, buf, raw(2 * MIB, 0, 0)), Ok(2 * MIB));
    assert_eq!(device.live_events(), 0, "after a write");
    let after = engine.stats();
    assert!(after.arena_chunks >= stats.arena_chunks + (2 * MIB / CHUNK) as u64, "{after:?}");
    let written = settled_phases(engine).since(&phases);
    assert_eq!(written.chunks_written, (2 * MIB / CHUNK) as u64, "{written:?}");
    assert_eq!((written.chunks_read, written.read_wait_ns), (0, 0), "{written:?}");
    assert!(written.write_wait_ns > 0 && written.write_wait_ns <= written.job_ns, "{written:?}");
    assert_eq!(engine.executor_count(), 2);
    assert_eq!(engine.pinned_cap_bytes(), 2 * 8 * MIB + 4 * MIB);
    driver.handle_deregister(handle);
}

/// 8 threads keep far more chunks in flight than a 1 MiB arena per executor holds: the
/// data stays right, the fallback pool is used, and never grows past its cap.
#[test]
fn tiny_arena_under_parallel_reads_falls_back_correctly_within_the_cap() {
    let _serial = serial();
    const THREADS: usize = 8;
    const PER_THREAD: usize = 4 * MIB;
    let data = pattern(THREADS * PER_THREAD, 2);
    let file = TempFile::new(&tmpfs_dir(), &data);
    let client = file.open_rw();
    let mut config = config(&[0, 1]);
    config.staging_per_executor_bytes = MIB;
    config.chunks_in_flight = 16;
    config.pinned_fallback_cap_bytes = 2 * MIB;
    config.validate().unwrap();
    let cap = config.pinned_fallback_cap_bytes;
    let (driver, device) = driver_with(config);
    let handle = driver.handle_register(client.as_raw_fd()).unwrap();
    let buffers: Vec<u64> =
        (0..THREADS).map(|_| device.malloc_device(0, PER_THREAD).unwrap()).collect();
    let barrier = Barrier::new(THREADS);
    let results: Vec<Vec<Result<usize, _>>> = thread::scope(|scope| {
        let workers: Vec<_> = buffers
            .iter()
            .enumerate()
            .map(|(i, &buf)| {
                let (driver, barrier, data) = (&driver, &barrier, &data);
                scope.spawn(move || {
                    barrier.wait();
                    (0..3)
                        .map(|round| {
                            // Rotate the ranges so every round reads different data.
                            let slot = (i + round) % THREADS;
                            let read = raw(PER_THREAD, slot * PER_THREAD, 0);
                            let result = driver.io_sync(Direction::Read, handle, buf, read);
                            let good = device_bytes(buf, PER_THREAD)
                                == data[slot * PER_THREAD..(slot + 1) * PER_THREAD];
                            result.map(|n| if good { n } else { usize::MAX })
                        })
                        .collect()
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    for (i, rounds) in results.iter().enumerate() {
        for (round, result) in rounds.iter().enumerate() {
            assert_eq!(*result, Ok(PER_THREAD), "thread {i} round {round} (MAX: bad data)");
        }
    }
    let engine = driver.engine().unwrap();
    let stats = engine.stats();
    assert!(stats.fallback_chunks > 0, "the arena never ran out: {stats:?}");
    assert!(engine.fallback_pinned_bytes() <= cap, "{} > {cap}", engine.fallback_pinned_bytes());
    driver.handle_deregister(handle);
}

/// Four executors under `HIPFILE_BUSY_FAN_OUT=1`, a request in at most `parallelism`
/// parts, every executor's internal stream made by reads of 8 MiB and then gated: a read
/// of `held_bytes` goes in flight as `held_jobs` jobs, then a read of `busy_bytes`;
/// `while_both` looks at the engine while both are held, then both finish with every
/// byte right and no job left in flight. Returns the engine's jobs, all reads counted.
fn a_held_and_a_busy_read(
    parallelism: usize,
    (held_bytes, held_jobs): (usize, u64),
    busy_bytes: usize,
    while_both: impl FnOnce(&hipfile_runtime::engine::Engine),
) -> u64 {
    let _serial = serial();
    let data = pattern(8 * MIB, parallelism as u64);
    let file = TempFile::new(&tmpfs_dir(), &data);
    let client = file.open_rw();
    let mut config = config(&[0, 1, 0, 1]);
    config.busy_fan_out = Some(1);
    config.request_parallelism = parallelism;
    config.validate().unwrap();
    let (driver, device) = driver_with(config);
    let handle = driver.handle_register(client.as_raw_fd()).unwrap();
    let engine = driver.engine().unwrap();
    let first = device.malloc_device(0, 8 * MIB).unwrap();
    let second = device.malloc_device(0, 8 * MIB).unwrap();
    for warm in 0..4u64.div_ceil(parallelism as u64) {
        assert_eq!(driver.io_sync(Direction::Read, handle, first, raw(8 * MIB, 0, 0)), Ok(8 * MIB));
        let jobs = (warm + 1) * parallelism as u64;
        eventually("the warm-up read's jobs counted", || engine.stats().jobs == jobs);
    }
    eventually("the warm-up reads' jobs ended", || engine.jobs_in_flight() == 0);
    let gates = gate_streams(&device);
    assert!(gates.len() >= 4, "one internal stream per executor: {}", gates.len());
    thread::scope(|scope| {
        let driver = &driver;
        let held = scope
            .spawn(move || driver.io_sync(Direction::Read, handle, first, raw(held_bytes, 0, 0)));
        eventually("the held read in flight", || engine.jobs_in_flight() == held_jobs);
        let busy = scope
            .spawn(move || driver.io_sync(Direction::Read, handle, second, raw(busy_bytes, 0, 0)));
        eventually("the second read posted", || engine.jobs_in_flight() > held_jobs);
        while_both(engine);
        drop(gates);
        assert_eq!(held.join().unwrap(), Ok(held_bytes));
        assert_eq!(busy.join().unwrap(), Ok(busy_bytes));
    });
    assert!(device_bytes(first, held_bytes) == data[..held_bytes]);
    assert!(device_bytes(second, busy_bytes) == data[..busy_bytes]);
    eventually("every job ended", || engine.jobs_in_flight() == 0);
    let jobs = engine.stats().jobs;
    driver.handle_deregister(handle);
    jobs
}

/// A request that finds the executors idle spreads over all four; one that finds every
/// executor busy goes as one part (`HIPFILE_BUSY_FAN_OUT=1`).
#[test]
fn a_request_finding_every_executor_busy_goes_as_the_least_parts() {
    let jobs = a_held_and_a_busy_read(4, (2 * MIB, 4), 8 * MIB, |engine| {
        thread::sleep(Duration::from_millis(50));
        assert_eq!(engine.jobs_in_flight(), 5, "every executor busy: one part");
    });
    assert_eq!(jobs, 4 + 4 + 1);
}

/// Requests in two parts at most: the parts of a request go to the idle executors by
/// name, not to consecutive ones from its hint. The held read takes the executors h and
/// h + 1; the next request's hint is h + 1, busy, and its two parts go to h + 2 and
/// h + 3, so every executor holds exactly one job (consecutive placement would put two
/// on h + 1 and none on h + 3).
#[test]
fn busy_fan_out_parts_go_to_the_idle_executors() {
    a_held_and_a_busy_read(2, (2 * MIB, 2), 4 * MIB, |engine| {
        eventually("the second read's two parts posted", || engine.jobs_in_flight() == 4);
        assert_eq!(engine.jobs_in_flight_by_executor(), vec![1, 1, 1, 1], "one job each");
    });
}

/// An 8 MiB file under `config`: `len` bytes at `offset` read into the device and checked,
/// `after_read` shown the engine, then new bytes written back there through the engine
/// and the file checked, around them too.
fn read_and_write_back(
    config: hipfile_runtime::config::Config,
    (offset, len): (usize, usize),
    after_read: impl FnOnce(&hipfile_runtime::engine::Engine),
) {
    let _serial = serial();
    let data = pattern(8 * MIB, 13);
    let file = TempFile::new(&tmpfs_dir(), &data);
    let client = file.open_rw();
    let (driver, device) = driver_with(config);
    let handle = driver.handle_register(client.as_raw_fd()).unwrap();
    let buf = device.malloc_device(0, 8 * MIB).unwrap();
    assert_eq!(driver.io_sync(Direction::Read, handle, buf, raw(len, offset, 0)), Ok(len));
    assert!(device_bytes(buf, len) == data[offset..offset + len]);
    after_read(driver.engine().unwrap());
    let written = pattern(len, 14);
    fill_device(buf, &written);
    assert_eq!(driver.io_sync(Direction::Write, handle, buf, raw(len, offset, 0)), Ok(len));
    let on_disk = file.contents();
    assert!(on_disk[offset..offset + len] == written[..]);
    assert!(on_disk[..offset] == data[..offset] && on_disk[offset + len..] == data[offset + len..]);
    driver.handle_deregister(handle);
}

/// With 2 MiB chunks a 4 MiB read on four idle executors still goes as four parts of
/// 1 MiB (requests split by at most 1 MiB), read and written back byte for byte, one
/// starting inside a chunk.
#[test]
fn chunks_past_1_mib_still_split_requests_at_1_mib() {
    let mut config = config(&[0, 1, 0, 1]);
    config.staging_chunk_bytes = 2 * MIB;
    config.validate().unwrap();
    read_and_write_back(config, (MIB, 4 * MIB), |engine| {
        eventually("the read's jobs counted", || engine.stats().jobs == 4);
    });
}

/// `HIPFILE_COPY_SPIN_US=0`: copies' completions are waited for by timer sleeps alone,
/// and reads and writes over every executor still move every byte.
#[test]
fn copies_waited_for_without_spinning_move_every_byte() {
    let config = hipfile_runtime::config::Config { copy_spin_us: 0, ..config(&[0, 1, 0, 1]) };
    read_and_write_back(config, (0, 8 * MIB), |_| {});
}

/// `HIPFILE_CALLER_THREAD=always`: sync requests of many chunks move on the calling
/// thread, piece by piece at chunk boundaries, and the executors get no job: a read at an
/// unaligned offset, a read across the end of the file (the bytes up to it), a write at
/// an unaligned offset, read back from the file.
#[test]
fn caller_thread_always_moves_requests_of_many_chunks_itself() {
    let _serial = serial();
    let data = pattern(4 * MIB, 7);
    let file = TempFile::new(&tmpfs_dir(), &data);
    let client = file.open_rw();
    let config = Config { caller_thread: CallerThread::Always, ..config(&[0, 1]) };
    let (driver, device) = driver_with(config);
    let handle = driver.handle_register(client.as_raw_fd()).unwrap();
    let engine = driver.engine().unwrap();
    let buf = device.malloc_device(0, 4 * MIB).unwrap();
    let (offset, len) = (1000, 3 * MIB + 5000);
    assert_eq!(driver.io_sync(Direction::Read, handle, buf, raw(len, offset, 0)), Ok(len));
    assert!(device_bytes(buf, len) == data[offset..offset + len]);
    let near_end = 3 * MIB - 50;
    let to_end = data.len() - near_end;
    assert_eq!(driver.io_sync(Direction::Read, handle, buf, raw(2 * MIB, near_end, 0)), Ok(to_end));
    assert!(device_bytes(buf, to_end) == data[near_end..]);
    let new = pattern(2 * MIB + 333, 8);
    fill_device(buf, &new);
    let at = 777;
    assert_eq!(driver.io_sync(Direction::Write, handle, buf, raw(new.len(), at, 0)), Ok(new.len()));
    let mut expected = data.clone();
    expected[at..at + new.len()].copy_from_slice(&new);
    assert!(file.contents() == expected, "the file after the write");
    let stats = engine.stats();
    assert_eq!((stats.jobs, stats.caller_thread_large_requests), (0, 3), "{stats:?}");
    assert_eq!(stats.caller_thread_requests, 3, "{stats:?}");
    driver.handle_deregister(handle);
}

/// A `HIPFILE_CALLER_THREAD=busy` engine on two executors over an 8 MiB pattern file on
/// tmpfs, whose idle executors read it whole first (two jobs, which made their internal
/// streams, now gated), and device buffers of 8 MiB (`first`) and 4 MiB (`second`).
struct BusyEngine {
    data: Vec<u8>,
    file: TempFile,
    _client: std::fs::File,
    driver: Arc<hipfile_runtime::Driver>,
    handle: hipfile_runtime::HandleId,
    first: u64,
    second: u64,
    gates: Vec<hipfile_runtime::device::cpu::StreamGate>,
}

impl BusyEngine {
    fn new(seed: u64) -> BusyEngine {
        let data = pattern(8 * MIB, seed);
        let file = TempFile::new(&tmpfs_dir(), &data);
        let client = file.open_rw();
        let config = Config { caller_thread: CallerThread::Busy, ..config(&[0, 1]) };
        let (driver, device) = driver_with(config);
        let handle = driver.handle_register(client.as_raw_fd()).unwrap();
        let engine = driver.engine().unwrap();
        let (first, second) =
            (device.malloc_device(0, 8 * MIB).unwrap(), device.malloc_device(0, 4 * MIB).unwrap());
        let whole = raw(8 * MIB, 0, 0);
        assert_eq!(driver.io_sync(Direction::Read, handle, first, whole), Ok(8 * MIB));
        eventually("the idle engine's read in two jobs", || engine.stats().jobs == 2);
        eventually("its jobs ended", || engine.jobs_in_flight() == 0);
        assert_eq!(engine.stats().caller_thread_requests, 0, "idle executors took it");
        let gates = gate_streams(&device);
        assert!(gates.len() >= 2, "one internal stream per executor: {}", gates.len());
        BusyEngine { data, file, _client: client, driver, handle, first, second, gates }
    }
}

/// `HIPFILE_CALLER_THREAD=busy`: a request of many chunks goes to the executors while one
/// of them is idle, and moves on the calling thread while every executor has a job in
/// flight; it then ends while those jobs are still held (their copies gated), so it
/// waited for none of them.
#[test]
fn caller_thread_busy_moves_a_large_request_itself_only_while_every_executor_is_busy() {
    let _serial = serial();
    let BusyEngine { data, file: _file, _client, driver, handle, first, second, gates } =
        BusyEngine::new(9);
    let engine = driver.engine().unwrap();
    let _watchdog = Watchdog::new("the caller-thread read beside held jobs", HANG_GUARD);
    thread::scope(|scope| {
        let driver = &driver;
        let held =
            scope.spawn(move || driver.io_sync(Direction::Read, handle, first, raw(8 * MIB, 0, 0)));
        eventually("the held read's jobs in flight", || engine.jobs_in_flight() == 2);
        let read = raw(4 * MIB, MIB, 0);
        assert_eq!(driver.io_sync(Direction::Read, handle, second, read), Ok(4 * MIB));
        assert_eq!(engine.jobs_in_flight(), 2, "the held jobs are still held");
        assert!(device_bytes(second, 4 * MIB) == data[MIB..5 * MIB]);
        drop(gates);
        assert_eq!(held.join().unwrap(), Ok(8 * MIB));
    });
    assert!(device_bytes(first, 8 * MIB) == data);
    eventually("every job counted", || engine.stats().jobs == 4);
    let stats = engine.stats();
    assert_eq!(stats.caller_thread_large_requests, 1, "{stats:?}");
    driver.handle_deregister(handle);
}

/// `HIPFILE_CALLER_THREAD=busy`: while one executor holds a job and the other is idle, a
/// request of many chunks still goes to the executors, one part on each (the caller's
/// thread is for when every executor is busy).
#[test]
fn caller_thread_busy_leaves_a_large_request_to_the_executors_while_one_is_idle() {
    let _serial = serial();
    let BusyEngine { data, file, _client, driver, handle, first, second, gates } =
        BusyEngine::new(10);
    let engine = driver.engine().unwrap();
    // A buffered write to one file is one job (`Engine::parts`): one executor held.
    let source = pattern(2 * MIB, 11);
    fill_device(first, &source);
    let _watchdog = Watchdog::new("a large read beside one held job", HANG_GUARD);
    thread::scope(|scope| {
        let driver = &driver;
        let write = raw(2 * MIB, 6 * MIB, 0);
        let held = scope.spawn(move || driver.io_sync(Direction::Write, handle, first, write));
        eventually("the held write's one job in flight", || engine.jobs_in_flight() == 1);
        let read = scope
            .spawn(move || driver.io_sync(Direction::Read, handle, second, raw(4 * MIB, MIB, 0)));
        eventually("the read's two parts posted beside it", || engine.jobs_in_flight() == 3);
        assert_eq!(engine.stats().caller_thread_requests, 0, "nothing on the caller's thread");
        drop(gates);
        assert_eq!(held.join().unwrap(), Ok(2 * MIB));
        assert_eq!(read.join().unwrap(), Ok(4 * MIB));
    });
    assert!(device_bytes(second, 4 * MIB) == data[MIB..5 * MIB]);
    assert!(file.contents()[6 * MIB..] == source[..], "the written bytes");
    let stats = engine.stats();
    assert_eq!((stats.caller_thread_requests, stats.caller_thread_large_requests), (0, 0));
    driver.handle_deregister(handle);
}

/// `HIPFILE_CALLER_THREAD=always` on a file with an O_DIRECT descriptor: an aligned read
/// of many chunks the page cache does not hold and an aligned write go through O_DIRECT
/// piece by piece (each piece ends on a chunk boundary, so stays aligned); an unaligned
/// read through the page cache. The executors get no job.
#[test]
fn caller_thread_always_moves_aligned_requests_of_many_chunks_through_o_direct() {
    let _serial = serial();
    let data = pattern(4 * MIB, 12);
    let file = TempFile::new(&ext4_dir(), &data);
    let client = file.open_rw();
    let config = Config { caller_thread: CallerThread::Always, ..config(&[0, 1]) };
    let (driver, device) = driver_with(config);
    let handle = driver.handle_register(client.as_raw_fd()).unwrap();
    if driver.file(handle).unwrap().direct_fd().is_none() {
        eprintln!("skipped: {} has no O_DIRECT path", ext4_dir().display());
        return;
    }
    let engine = driver.engine().unwrap();
    let buf = device.malloc_device(0, 4 * MIB).unwrap();
    let counters = || driver.file(handle).unwrap().counters();
    hipfile_test_support::page_cache::drop_cached_pages(&client);
    let before = counters();
    let (offset, len) = (64 * KIB, 3 * MIB + 8 * KIB);
    assert_eq!(driver.io_sync(Direction::Read, handle, buf, raw(len, offset, 0)), Ok(len));
    assert!(device_bytes(buf, len) == data[offset..offset + len], "the aligned read");
    let read = counters();
    assert_eq!(read.direct_read_bytes - before.direct_read_bytes, len as u64, "{read:?}");
    let (offset, len) = (1000, 2 * MIB);
    assert_eq!(driver.io_sync(Direction::Read, handle, buf, raw(len, offset, 0)), Ok(len));
    assert!(device_bytes(buf, len) == data[offset..offset + len], "the unaligned read");
    let unaligned = counters();
    assert_eq!(unaligned.buffered_read_bytes - read.buffered_read_bytes, len as u64);
    let fresh = pattern(2 * MIB + 4 * KIB, 13);
    fill_device(buf, &fresh);
    let at = 512 * KIB;
    assert_eq!(
        driver.io_sync(Direction::Write, handle, buf, raw(fresh.len(), at, 0)),
        Ok(fresh.len())
    );
    let written = counters();
    assert_eq!(written.direct_written_bytes - unaligned.direct_written_bytes, fresh.len() as u64);
    let mut expected = data.clone();
    expected[at..at + fresh.len()].copy_from_slice(&fresh);
    assert!(file.contents() == expected, "the file after the write");
    let stats = engine.stats();
    assert_eq!((stats.jobs, stats.caller_thread_large_requests), (0, 3), "{stats:?}");
    driver.handle_deregister(handle);
}

/// `HIPFILE_CALLER_THREAD=busy` and `always` under load, with io_uring and with blocking
/// executors (which take a fallback chunk for every chunk they move): twelve threads
/// write and read back regions of four chunks at once, through a fallback pool of four
/// chunks beside the executors' own. Every byte lands, nothing waits forever, and the
/// pool never grows past its size.
#[test]
fn caller_threads_and_executors_share_the_fallback_pool_under_load() {
    let _serial = serial();
    const THREADS: usize = 12;
    const ROUNDS: usize = 4;
    let region = 4 * CHUNK;
    for caller_thread in [CallerThread::Busy, CallerThread::Always] {
        for use_io_uring in [true, false] {
            let what = format!("{caller_thread:?}, io_uring {use_io_uring}");
            let data = pattern(THREADS * region, 14);
            let file = TempFile::new(&tmpfs_dir(), &data);
            let client = file.open_rw();
            let config = Config {
                caller_thread,
                use_io_uring,
                pinned_fallback_cap_bytes: 4 * CHUNK,
                ..config(&[0, 1])
            };
            let pool_bytes = config.fallback_pool_bytes();
            let (driver, device) = driver_with(config);
            let handle = driver.handle_register(client.as_raw_fd()).unwrap();
            let engine = driver.engine().unwrap();
            let _watchdog = Watchdog::new("caller threads and executors under load", HANG_GUARD);
            thread::scope(|scope| {
                for index in 0..THREADS {
                    let (driver, device, what) = (&driver, &device, &what);
                    scope.spawn(move || {
                        let buffer = device.malloc_device(0, 2 * region).unwrap();
                        let at = index * region;
                        for round in 0..ROUNDS {
                            let fresh = pattern(region, (index * ROUNDS + round) as u64);
                            fill_device(buffer, &fresh);
                            let write = raw(region, at, 0);
                            let wrote = driver.io_sync(Direction::Write, handle, buffer, write);
                            assert_eq!(wrote, Ok(region), "{what}: thread {index} write");
                            let read = raw(region, at, region);
                            let got = driver.io_sync(Direction::Read, handle, buffer, read);
                            assert_eq!(got, Ok(region), "{what}: thread {index} read");
                            let back = device_bytes(buffer + region as u64, region);
                            assert!(back == fresh, "{what}: thread {index} round {round}");
                        }
                    });
                }
            });
            assert!(engine.fallback_pinned_bytes() <= pool_bytes, "{what}: the pool's size");
            let stats = engine.stats();
            if caller_thread == CallerThread::Always {
                // Each request goes on its caller's thread unless the pool is down to the
                // executors' reserve: then to the executors.
                assert!(stats.caller_thread_large_requests > 0, "{what}: {stats:?}");
            }
            driver.handle_deregister(handle);
        }
    }
}

/// After the engine started and served a read, 300 ms of idleness cost the process
/// (executors, device stream workers, everything) less than 30 ms of CPU time.
#[test]
fn idle_executors_and_stream_workers_park() {
    let _serial = serial();
    let data = pattern(2 * MIB, 3);
    let file = TempFile::new(&tmpfs_dir(), &data);
    let client = file.open_rw();
    let (driver, device) = driver_with(config(&[0, 1]));
    let handle = driver.handle_register(client.as_raw_fd()).unwrap();
    let buf = device.malloc_device(0, 2 * MIB).unwrap();
    assert_eq!(driver.io_sync(Direction::Read, handle, buf, raw(2 * MIB, 0, 0)), Ok(2 * MIB));
    assert_eq!(driver.io_sync(Direction::Write, handle, buf, raw(2 * MIB, 0, 0)), Ok(2 * MIB));
    thread::sleep(Duration::from_millis(50));
    let before = process_cpu_time();
    thread::sleep(Duration::from_millis(300));
    let spent = process_cpu_time() - before;
    assert!(spent < Duration::from_millis(30), "300 ms idle cost {spent:?} of CPU time");
    driver.handle_deregister(handle);
}

/// Dropping a driver whose engine runs joins its executor threads (and the device's
/// stream workers) without hanging.
///
/// Thread names cannot tell an executor from the blocking-I/O helper thread glommio
/// starts for it (an unnamed thread inherits its creator's name); glommio does not join
/// the helpers but they exit once their executor is gone, so the check allows them a
/// moment.
#[test]
fn dropping_a_driver_joins_its_threads() {
    let _serial = serial();
    let _watchdog = Watchdog::new("dropping a driver", Duration::from_secs(20));
    let data = pattern(2 * MIB, 4);
    let file = TempFile::new(&tmpfs_dir(), &data);
    let client = file.open_rw();
    let (driver, device) = driver_with(config(&[0, 1]));
    let handle = driver.handle_register(client.as_raw_fd()).unwrap();
    let buf = device.malloc_device(0, 2 * MIB).unwrap();
    assert_eq!(driver.io_sync(Direction::Read, handle, buf, raw(2 * MIB, 0, 0)), Ok(2 * MIB));
    assert!(threads_named("hipfile-io-") >= 2, "one thread per executor at least");
    assert!(threads_named("hfcpu-s") >= 2, "one internal stream per executor");
    // Still registered and open: the drop has to clean that up too.
    drop(device);
    drop(driver);
    assert_eq!(threads_named("hfcpu-s"), 0, "stream workers left after the drop");
    let deadline = Instant::now() + Duration::from_secs(2);
    while threads_named("hipfile-io-") > 0 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(threads_named("hipfile-io-"), 0, "executor threads left after the drop");
}

/// glommio 0.9 decides whether the poll ring works on a device by reading the first
/// block of the first O_DIRECT file it opens there. A file whose first block is a hole
/// is answered without touching the device, so the probe wrongly says "yes" and every
/// later read on the device fails with EOPNOTSUPP (which the engine then redoes with
/// blocking I/O). The first file this driver opens is such a sparse file.
#[test]
fn poll_probe_is_not_fooled_by_a_sparse_first_file() {
    let _serial = serial();
    let file = TempFile::new(&ext4_dir(), &[]);
    let client = file.open_rw();
    client.set_len(2 * MIB as u64).unwrap();
    let data = pattern(MIB, 5);
    client.write_all_at(&data, MIB as u64).unwrap();
    client.sync_all().unwrap();
    let (driver, device) = driver_with(config(&[0]));
    let handle = driver.handle_register(client.as_raw_fd()).unwrap();
    if driver.file(handle).unwrap().direct_fd().is_none() {
        eprintln!("skipped: {} has no O_DIRECT path", ext4_dir().display());
        return;
    }
    let buf = device.malloc_device(0, MIB).unwrap();
    assert_eq!(driver.io_sync(Direction::Read, handle, buf, raw(MIB, MIB, 0)), Ok(MIB));
    assert!(device_bytes(buf, MIB) == data);
    let stats = driver.engine().unwrap().stats();
    assert_eq!(stats.sync_retry_chunks, 0, "io_uring refused the reads: {stats:?}");
    driver.handle_deregister(handle);
}
