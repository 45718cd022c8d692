//! A prefetching read's jobs are posted as exactly the parts its gate was counted for,
//! under `HIPFILE_BUSY_FAN_OUT`, however the executors' loads change in between (the
//! regression test of the fix that made `start_prefetch` hand its parts to `post`).
//!
//! A crate of its own: its test installs a process-wide fault plan
//! ([`Site::PrefetchPost`]), which the prefetching reads of `async_api`'s tests, running
//! at the same time in that process, would meet too (and might take the plan's one
//! delay from this test).

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::thread;
use std::time::Duration;

use hipfile_core::Direction;
use hipfile_runtime::AsyncParams;
use hipfile_runtime::config::StreamCopies;
use hipfile_runtime::device::StreamMemoryOps;
use hipfile_runtime::fault::{self, Fault, Plan, Rule, Site};
use hipfile_test_support::cpu_rig::{
    KIB, MIB, TempFile, config, device_bytes, driver_with, eventually, gate_streams, pattern,
    tmpfs_dir,
};
use hipfile_test_support::{let_file_changes_settle, raw};

/// The file, and the first read over every executor (which creates their internal
/// streams, to gate).
const FILE_BYTES: usize = 8 * MIB;
/// The sync read held in flight: one job on each of the four executors.
const HELD_BYTES: usize = 2 * MIB;
/// The prefetching read: four parts on idle executors, one when every executor is busy.
const READ_BYTES: usize = 4 * MIB;
const READ_FILE_OFFSET: usize = MIB;
const READ_BUFFER_OFFSET: usize = 4 * KIB;
/// How late the prefetch's jobs are posted: far longer than the held read takes to finish
/// once its streams go on (milliseconds); the test checks that it did finish in time.
const POST_DELAY: Duration = Duration::from_secs(2);

/// A fully FIXED read prefetches on a held stream while every executor is busy, so its
/// gate is counted for one part; its jobs are posted (`Site::PrefetchPost` delays them)
/// only after every executor went idle, when a second `Engine::parts` would give four.
/// The read still returns every byte, as one job. Before the fix `post` split again: four
/// jobs waited on a gate the arm opened once, and the op ended with
/// hipFileInternalError (-5030).
///
/// Deterministic: the loads are set by the test, not by timing — every executor holds a
/// job of a read whose copies wait on gated streams when the gate is counted (the delay
/// fired: the count is done), and none does before the jobs are posted (checked: no job
/// in flight while the op has not counted its prefetch yet, which it does just before
/// posting). The delay only has to outlast the held read's end, and the test fails,
/// never passes, should it not.
#[test]
fn a_prefetch_posts_the_parts_its_gate_was_counted_for() {
    let data = pattern(FILE_BYTES, 21);
    let file = TempFile::new(&tmpfs_dir(), &data);
    let client = file.open_rw();
    let mut config = config(&[0, 1, 0, 1]);
    config.busy_fan_out = Some(1);
    // The engine's path, where a prefetch waits on its gate.
    config.stream_copies = StreamCopies::Off;
    config.validate().unwrap();
    let (driver, device) = driver_with(config);
    driver.open();
    let handle = driver.handle_register(client.as_raw_fd()).unwrap();
    let engine = driver.engine().unwrap();
    let held = device.malloc_device(0, FILE_BYTES).unwrap();
    let target = device.malloc_device(0, READ_BUFFER_OFFSET + READ_BYTES).unwrap();
    let first = driver.io_sync(Direction::Read, handle, held, raw(FILE_BYTES, 0, 0));
    assert_eq!(first, Ok(FILE_BYTES));
    eventually("the first read's jobs counted", || engine.stats().jobs == 4);
    eventually("the first read's jobs ended", || engine.jobs_in_flight() == 0);
    let gates = gate_streams(&device);
    assert!(gates.len() >= 4, "one internal stream per executor: {}", gates.len());
    // Made after the gates (`gate_streams` holds every stream that exists).
    let stream = device.create_stream(0).unwrap();
    driver.stream_register(stream, 7).unwrap();
    let user_gate = device.pause_stream(stream).unwrap();
    // Else the prefetch is redone in stream order as parts of its own (on a fast machine
    // the set-up above takes about 30 ms).
    let_file_changes_settle();
    let params = AsyncParams::new(READ_BYTES, READ_FILE_OFFSET as i64);
    params.buffer_offset_bytes.store(READ_BUFFER_OFFSET as i64, Ordering::SeqCst);
    let plan = fault::install(Plan {
        seed: 1,
        rules: vec![Rule {
            site: Site::PrefetchPost,
            fault: Fault::Delay(POST_DELAY),
            one_in: 1,
            limit: 1,
        }],
    });
    let prefetched = || driver.async_stats().prefetched.load(Ordering::SeqCst);
    thread::scope(|scope| {
        let (driver, params) = (&driver, &params);
        let held_read = scope
            .spawn(move || driver.io_sync(Direction::Read, handle, held, raw(HELD_BYTES, 0, 0)));
        eventually("every executor busy with the held read", || engine.jobs_in_flight() == 4);
        let submit = scope
            .spawn(move || driver.submit_async(Direction::Read, handle, target, params, stream));
        eventually("the prefetch's gate counted", || plan.injected() == [1]);
        drop(gates);
        assert_eq!(held_read.join().unwrap(), Ok(HELD_BYTES));
        eventually("every executor idle", || engine.jobs_in_flight() == 0);
        assert_eq!(prefetched(), 0, "the delay ran out before the executors went idle");
        assert_eq!(submit.join().unwrap(), Ok(()));
    });
    assert_eq!(plan.injected(), vec![1], "the post was delayed once");
    assert_eq!(prefetched(), 1, "the read prefetched");
    let redone = || driver.async_stats().prefetches_redone.load(Ordering::SeqCst);
    user_gate.release();
    eventually("the read published", || params.bytes_done.load(Ordering::SeqCst) != 0);
    device.synchronize_stream(stream).unwrap();
    drop(plan);
    assert_eq!(
        params.bytes_done.load(Ordering::SeqCst),
        READ_BYTES as isize,
        "every byte of the prefetched read (-5030: a part found its gate closed)"
    );
    let read = device_bytes(target + READ_BUFFER_OFFSET as u64, READ_BYTES);
    assert!(read == data[READ_FILE_OFFSET..READ_FILE_OFFSET + READ_BYTES], "the read's data");
    assert!(device_bytes(held, HELD_BYTES) == data[..HELD_BYTES], "the held read's data");
    eventually("every job ended", || engine.jobs_in_flight() == 0);
    assert_eq!(redone(), 0, "the prefetch was used, not read again in stream order");
    assert_eq!(engine.stats().jobs, 4 + 4 + 1, "the prefetch ran as the one part counted");
    driver.handle_deregister(handle);
}
