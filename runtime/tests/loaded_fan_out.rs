//! `HIPFILE_LOADED_FAN_OUT`: once half as many queued requests (batch entries, async ops)
//! as executors are in flight, a queued request goes as at most that many parts; sync
//! requests are neither capped nor counted; a request stops counting once its parts are
//! over.
//!
//! Deterministic: the engine's copies wait on gated streams, so every request's jobs stay
//! in flight until the test lets them go, and the count each split saw is set by the
//! order of submission alone.
//!
//! A crate of its own: it gates every internal stream of the process, which would hold
//! other tests' copies too.

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;

use hipfile_core::{BatchStatus, Direction};
use hipfile_runtime::batch::{Batch, BatchEntry};
use hipfile_runtime::config::StreamCopies;
use hipfile_runtime::device::StreamMemoryOps;
use hipfile_runtime::device::cpu::CpuDevice;
use hipfile_runtime::{AsyncParams, Driver, HandleId};
use hipfile_test_support::cpu_rig::{
    CHUNK, MIB, TempFile, config, device_bytes, driver_with, eventually, gate_streams, pattern,
    tmpfs_dir,
};
use hipfile_test_support::{let_file_changes_settle, raw};

const EXECUTORS: usize = 4;
/// Each entry spans four chunks: four parts when not capped, two when capped.
const ENTRY_BYTES: usize = 4 * CHUNK;
const ENTRIES: usize = 6;
/// The parts of an entry split under load (`HIPFILE_LOADED_FAN_OUT=2`).
const CAP: usize = 2;

/// One test at a time: each gates every internal stream of the process.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// An 8 MiB file of `seed`'s pattern read once through a driver of four executors with
/// the cap on (`stream_copies` as given), so that every executor's internal stream exists
/// to gate; the read's jobs ended.
struct Rig {
    data: Vec<u8>,
    _file: TempFile,
    _client: std::fs::File,
    driver: Arc<Driver>,
    device: Arc<CpuDevice>,
    handle: HandleId,
    /// 8 MiB of device memory.
    target: u64,
}

impl Rig {
    fn new(seed: u64, stream_copies: StreamCopies) -> Rig {
        let data = pattern(8 * MIB, seed);
        let file = TempFile::new(&tmpfs_dir(), &data);
        let client = file.open_rw();
        let mut config = config(&[0, 1, 0, 1]);
        config.request_parallelism = EXECUTORS;
        config.loaded_fan_out = Some(CAP);
        config.stream_copies = stream_copies;
        config.validate().unwrap();
        let (driver, device) = driver_with(config);
        driver.open();
        let handle = driver.handle_register(client.as_raw_fd()).unwrap();
        let target = device.malloc_device(0, 8 * MIB).unwrap();
        let read = driver.io_sync(Direction::Read, handle, target, raw(8 * MIB, 0, 0));
        assert_eq!(read, Ok(8 * MIB));
        let engine = driver.engine().unwrap();
        eventually("the first read's jobs ended", || engine.jobs_in_flight() == 0);
        Rig { data, _file: file, _client: client, driver, device, handle, target }
    }
}

#[test]
fn queued_requests_past_half_the_executors_go_as_the_capped_parts() {
    let _serial = serial();
    let Rig { data, driver, device, handle, target, .. } = &Rig::new(31, StreamCopies::Off);
    let (driver, device, handle, target) = (driver, device, *handle, *target);
    let engine = driver.engine().unwrap();
    let sync_target = device.malloc_device(0, ENTRY_BYTES).unwrap();
    let split_before = engine.stats().requests_split_under_load;
    assert_eq!(split_before, 0, "one sync request is never capped");
    // Made before the gates, so that a failing assertion drops the gates first (the
    // batch's drop waits for its entries, whose copies the gates hold).
    let batch = Batch::new(Arc::clone(driver), ENTRIES as u32).unwrap();
    let gates = gate_streams(device);
    assert!(gates.len() >= EXECUTORS, "one internal stream per executor: {}", gates.len());

    let entry = |index: usize| BatchEntry {
        direction: Direction::Read,
        handle,
        buffer_base_addr: target,
        buffer_offset_bytes: (index * ENTRY_BYTES) as i64,
        file_offset_bytes: (index * ENTRY_BYTES) as i64,
        size_bytes: ENTRY_BYTES as u64,
        cookie: index,
    };
    let entries: Vec<BatchEntry> = (0..ENTRIES).map(entry).collect();
    batch.submit(&entries).unwrap();
    // The first two entries found 0 and 1 queued (fewer than half of four executors):
    // four parts each; the other four found 2..=5: two parts each.
    let expected_jobs = 2 * EXECUTORS as u64 + (ENTRIES as u64 - 2) * CAP as u64;
    eventually("every entry's jobs posted", || engine.jobs_in_flight() == expected_jobs);
    assert_eq!(engine.stats().requests_split_under_load, ENTRIES as u64 - 2);
    // Capped parts go to the least loaded executors: each holds as many jobs.
    let loads = engine.jobs_in_flight_by_executor();
    assert!(loads.iter().all(|&jobs| jobs == expected_jobs / EXECUTORS as u64), "{loads:?}");

    thread::scope(|scope| {
        // A sync request beside them: a thread waits on it alone, so it keeps every part.
        let sync = scope.spawn(move || {
            driver.io_sync(Direction::Read, handle, sync_target, raw(ENTRY_BYTES, 0, 0))
        });
        eventually("the sync request's four parts posted", || {
            engine.jobs_in_flight() == expected_jobs + EXECUTORS as u64
        });
        drop(gates);
        assert_eq!(sync.join().unwrap(), Ok(ENTRY_BYTES));
    });
    let events = batch.status(ENTRIES, ENTRIES, None);
    assert_eq!(events.len(), ENTRIES);
    for event in &events {
        assert_eq!((event.status, event.result), (BatchStatus::Complete, ENTRY_BYTES as i64));
    }
    assert!(device_bytes(target, ENTRIES * ENTRY_BYTES) == data[..ENTRIES * ENTRY_BYTES]);
    assert!(device_bytes(sync_target, ENTRY_BYTES) == data[..ENTRY_BYTES]);
    eventually("every job ended", || engine.jobs_in_flight() == 0);
    assert_eq!(engine.stats().requests_split_under_load, ENTRIES as u64 - 2, "sync not capped");

    // Their parts over, the entries no longer count: a lone entry spreads again. (An
    // entry counts until its joiner drops, a moment after its last job reported.)
    eventually("no queued request counted", || engine.queued_requests_in_flight() == 0);
    let jobs_before = engine.stats().jobs;
    batch.submit(&[entry(0)]).unwrap();
    let events = batch.status(1, 1, None);
    assert_eq!((events[0].status, events[0].result), (BatchStatus::Complete, ENTRY_BYTES as i64));
    eventually("the lone entry's jobs counted", || engine.stats().jobs - jobs_before == 4);
    assert_eq!(engine.stats().requests_split_under_load, ENTRIES as u64 - 2);
    driver.handle_deregister(handle);
}

/// Async ops are queued requests too: six fully FIXED reads on six held streams prefetch
/// at submission, the first two as four parts, the other four as two.
#[test]
fn async_reads_count_as_queued_requests() {
    let _serial = serial();
    // The engine's path: a FIXED read prefetches through its own jobs at submission.
    let Rig { data, driver, device, handle, target, .. } = &Rig::new(37, StreamCopies::Off);
    let (driver, device, handle, target) = (driver, device, *handle, *target);
    let engine = driver.engine().unwrap();
    let gates = gate_streams(device);
    assert!(gates.len() >= EXECUTORS, "one internal stream per executor: {}", gates.len());
    // Made after the gates (`gate_streams` holds every stream that exists); held, so
    // that every read is posted by its prefetch, not at its arm.
    let streams: Vec<_> = (0..ENTRIES)
        .map(|_| {
            let stream = device.create_stream(0).unwrap();
            driver.stream_register(stream, 7).unwrap();
            let held = device.pause_stream(stream).unwrap();
            (stream, held)
        })
        .collect();
    // Else a prefetch may be read again in stream order, as parts of its own.
    let_file_changes_settle();
    let params: Vec<Arc<AsyncParams>> = (0..ENTRIES)
        .map(|index| {
            let params = AsyncParams::new(ENTRY_BYTES, (index * ENTRY_BYTES) as i64);
            params.buffer_offset_bytes.store((index * ENTRY_BYTES) as i64, Ordering::SeqCst);
            params
        })
        .collect();
    let split_before = engine.stats().requests_split_under_load;
    for ((stream, _), params) in streams.iter().zip(&params) {
        driver.submit_async(Direction::Read, handle, target, params, *stream).unwrap();
    }
    let expected_jobs = 2 * EXECUTORS as u64 + (ENTRIES as u64 - 2) * CAP as u64;
    eventually("every read's prefetch posted", || engine.jobs_in_flight() == expected_jobs);
    let split = engine.stats().requests_split_under_load - split_before;
    assert_eq!(split, ENTRIES as u64 - 2);
    drop(gates);
    for (stream, held) in streams {
        held.release();
        device.synchronize_stream(stream).unwrap();
    }
    for params in &params {
        assert_eq!(params.bytes_done.load(Ordering::SeqCst), ENTRY_BYTES as isize);
    }
    assert!(device_bytes(target, ENTRIES * ENTRY_BYTES) == data[..ENTRIES * ENTRY_BYTES]);
    let redone = driver.async_stats().prefetches_redone.load(Ordering::SeqCst);
    assert_eq!(redone, 0, "every prefetch used, none read again in stream order");
    driver.handle_deregister(handle);
}
