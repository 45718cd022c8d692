//! Statistics (`hipfile_runtime::stats`): every sync, async and batch request is counted
//! once in its (device, API, direction) class, with its bytes, errors, latency and size,
//! and the path counters move with the bytes; another process reads the same numbers
//! from `/dev/shm/hipfile-rs-stats.<pid>`; `HIPFILE_STATS=0` keeps them private.
//!
//! One test drives the I/O (the counters are per process, and the tests of a binary run
//! at once); runs on the selected backend.

use std::sync::Arc;
use std::time::Duration;

use hipfile_core::{Direction, RawIo};
use hipfile_runtime::batch::{Batch, BatchEntry};
use hipfile_runtime::stats::{self, Api, ClassSnapshot, StatsSnapshot};
use hipfile_test_support::rig::*;

fn delta(after: &ClassSnapshot, before: &ClassSnapshot) -> (u64, u64, u64) {
    (after.ops - before.ops, after.bytes - before.bytes, after.errors - before.errors)
}

#[test]
fn every_request_is_counted_once_in_its_class() {
    if std::env::var("HIPFILE_STATS").is_ok_and(|v| v == "off") {
        println!("skipped: HIPFILE_STATS=off records nothing");
        return;
    }
    let rig = Rig::new();
    let data = pattern(71, MIB);
    let file = TempFile::new("stats", &data);
    let (rw, wo) = (file.open_rw(), file.open_wo());
    let (handle, write_only) = (rig.register(&rw), rig.register(&wo));
    let buffer = rig.alloc(MIB);
    let before = stats::snapshot();

    // Sync: 3 reads of 4 KiB, 64 KiB and 512 KiB; 1 write of 8 KiB; 1 failing read.
    for (size, offset) in [(4096u64, 0i64), (64 << 10, 4096), (512 << 10, 65536)] {
        let raw = RawIo { size_bytes: size, file_offset_bytes: offset, buffer_offset_bytes: 0 };
        assert_eq!(
            rig.driver.io_sync(Direction::Read, handle, buffer, raw).unwrap(),
            size as usize
        );
    }
    let raw = RawIo { size_bytes: 8192, file_offset_bytes: 0, buffer_offset_bytes: 0 };
    assert_eq!(rig.driver.io_sync(Direction::Write, handle, buffer, raw).unwrap(), 8192);
    assert!(rig.driver.io_sync(Direction::Read, write_only, buffer, raw).is_err());

    // Async: 2 reads of 16 KiB on a registered stream.
    let stream = rig.registered_stream(0);
    let params: Vec<_> = (0..2).map(|i| params(16 << 10, i * 16384, i * 16384)).collect();
    for p in &params {
        rig.read(handle, buffer, p, stream);
    }
    rig.sync(stream);
    assert!(params.iter().all(|p| bytes(p) == 16 << 10));

    // Batch: 5 reads of 4 KiB.
    let batch = Batch::new(Arc::clone(&rig.driver), 8).unwrap();
    let entries: Vec<BatchEntry> = (0..5)
        .map(|i| BatchEntry {
            direction: Direction::Read,
            handle,
            buffer_base_addr: buffer,
            buffer_offset_bytes: i * 4096,
            file_offset_bytes: i * 4096,
            size_bytes: 4096,
            cookie: i as usize,
        })
        .collect();
    batch.submit(&entries).unwrap();
    let mut reported = 0;
    while reported < 5 {
        reported += batch.status(5 - reported, 5, Some(Duration::from_secs(10))).len();
    }

    let after = stats::snapshot();
    let class = |s: &StatsSnapshot, api, direction| s.class(0, api, direction).clone();
    let sync_read = class(&after, Api::Sync, Direction::Read);
    assert_eq!(
        delta(&sync_read, &class(&before, Api::Sync, Direction::Read)),
        (4, 4096 + (64 << 10) + (512 << 10), 1),
        "sync reads: 3 good, 1 failed"
    );
    assert_eq!(
        delta(
            &class(&after, Api::Sync, Direction::Write),
            &class(&before, Api::Sync, Direction::Write)
        ),
        (1, 8192, 0)
    );
    assert_eq!(
        delta(
            &class(&after, Api::Async, Direction::Read),
            &class(&before, Api::Async, Direction::Read)
        ),
        (2, 32 << 10, 0)
    );
    assert_eq!(
        delta(
            &class(&after, Api::Batch, Direction::Read),
            &class(&before, Api::Batch, Direction::Read)
        ),
        (5, 5 * 4096, 0)
    );
    // Histograms: the three sync read sizes land in their buckets.
    let sizes_before = class(&before, Api::Sync, Direction::Read).size_buckets;
    for size in [4096u64, 64 << 10, 512 << 10] {
        let bucket = stats::size_bucket(size);
        assert!(sync_read.size_buckets[bucket] > sizes_before[bucket], "size {size}");
    }
    let latencies: u64 = sync_read.latency_buckets.iter().sum();
    assert_eq!(latencies, sync_read.ops, "one latency sample per request");
    assert!(sync_read.latency_ns_sum > class(&before, Api::Sync, Direction::Read).latency_ns_sum);
    // Paths: at least the bytes of the good requests went through the file.
    let moved: u64 = (0..4).map(|i| after.paths[i] - before.paths[i]).sum();
    assert!(moved >= 4096 + (64 << 10) + (512 << 10) + 8192 + (32 << 10) + 5 * 4096);
    assert!(after.paths[4] + after.paths[5] > before.paths[4] + before.paths[5], "requests ran");

    // Recording turned off and on again at run time: nothing counted meanwhile.
    let sync_reads = || stats::snapshot().class(0, Api::Sync, Direction::Read).ops;
    let raw = RawIo { size_bytes: 4096, file_offset_bytes: 0, buffer_offset_bytes: 0 };
    let counted = sync_reads();
    assert!(stats::set_recording(false), "recording was on");
    assert_eq!(rig.driver.io_sync(Direction::Read, handle, buffer, raw).unwrap(), 4096);
    assert_eq!(sync_reads(), counted, "recorded while off");
    assert!(!stats::set_recording(true), "recording was off");
    assert_eq!(rig.driver.io_sync(Direction::Read, handle, buffer, raw).unwrap(), 4096);
    assert_eq!(sync_reads(), counted + 1);

    // Another process sees the same page (unless HIPFILE_STATS keeps it private).
    if std::env::var("HIPFILE_STATS").is_ok() {
        return;
    }
    let remote = StatsSnapshot::of_process(std::process::id()).expect("the shared page");
    let local = stats::snapshot();
    assert_eq!(remote.pid, u64::from(std::process::id()));
    assert_eq!(
        remote.class(0, Api::Batch, Direction::Read),
        local.class(0, Api::Batch, Direction::Read)
    );
    assert_eq!(
        remote.class(0, Api::Sync, Direction::Write),
        local.class(0, Api::Sync, Direction::Write)
    );
}

#[test]
fn with_hipfile_stats_off_nothing_is_recorded() {
    if std::env::var("HIPFILE_STATS").is_ok_and(|v| v == "off") {
        let rig = Rig::new();
        let file = TempFile::new("stats-off", &pattern(72, 64 * KIB));
        let fd = file.open_ro();
        let handle = rig.register(&fd);
        let buffer = rig.alloc(64 * KIB);
        let raw =
            RawIo { size_bytes: 64 * KIB as u64, file_offset_bytes: 0, buffer_offset_bytes: 0 };
        assert_eq!(rig.driver.io_sync(Direction::Read, handle, buffer, raw).unwrap(), 64 * KIB);
        let snapshot = stats::snapshot();
        assert_eq!(snapshot.total(Api::Sync, Direction::Read), ClassSnapshot::default());
        assert_eq!(snapshot.paths, [0; 8]);
        return;
    }
    if std::env::var("HIPFILE_STATS").is_ok() {
        return; // the child of the other test
    }
    run_in_child(
        "with_hipfile_stats_off_nothing_is_recorded",
        "HIPFILE_STATS",
        "off",
        Duration::from_secs(60),
    );
}

#[test]
fn with_hipfile_stats_0_no_shared_page_is_made() {
    // In the child (or a run with HIPFILE_STATS=0): check; else run this test in a child.
    if std::env::var("HIPFILE_STATS").is_ok_and(|v| v == "off") {
        return; // the child of the other test
    }
    if std::env::var("HIPFILE_STATS").is_ok_and(|v| v == "0") {
        let _ = stats::snapshot();
        let path = format!("/dev/shm/hipfile-rs-stats.{}", std::process::id());
        assert!(!std::path::Path::new(&path).exists(), "{path} exists");
        assert!(StatsSnapshot::of_process(std::process::id()).is_err());
        return;
    }
    run_in_child(
        "with_hipfile_stats_0_no_shared_page_is_made",
        "HIPFILE_STATS",
        "0",
        Duration::from_secs(60),
    );
}
