//! Batch I/O (`hipfile_runtime::batch`, `hipFileBatchIO*`): entries of several files and
//! buffers, reads and writes mixed, all-or-nothing submission, per-entry status and byte
//! counts, `min` + timeout waiting, cancel and destroy with entries in flight.
//!
//! Runs on the selected backend (the cpu device in CI, every GPU test on the GPU
//! machine); the cases that hold entries in flight gate the cpu device's internal
//! streams and skip elsewhere.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hipfile_core::{BatchEvent, BatchStatus, Direction, OpError};
use hipfile_runtime::HandleId;
use hipfile_runtime::batch::{Batch, BatchEntry};
use hipfile_runtime::device::cpu::CpuDevice;
use hipfile_runtime::device::cpu::StreamGate;
use hipfile_test_support::rig::*;

fn entry(
    direction: Direction,
    handle: HandleId,
    buffer: u64,
    buffer_offset: usize,
    file_offset: usize,
    size: usize,
    cookie: usize,
) -> BatchEntry {
    BatchEntry {
        direction,
        handle,
        buffer_base_addr: buffer,
        buffer_offset_bytes: buffer_offset as i64,
        file_offset_bytes: file_offset as i64,
        size_bytes: size as u64,
        cookie,
    }
}

/// Waits (under the hang guard) for `count` events and returns them by cookie; fails on
/// a cookie reported twice.
fn collect(batch: &Batch, count: usize) -> BTreeMap<usize, BatchEvent<usize>> {
    let mut events = BTreeMap::new();
    let deadline = Instant::now() + HANG_GUARD;
    while events.len() < count {
        assert!(Instant::now() < deadline, "hang guard: {} of {count} events", events.len());
        for event in batch.status(1, count, Some(Duration::from_millis(100))) {
            assert!(events.insert(event.cookie, event).is_none(), "cookie {} twice", event.cookie);
        }
    }
    events
}

/// Gates every internal stream of the cpu device, after one read made them exist, so
/// that entries stay in flight until the gates drop.
fn hold_engine_copies(
    rig: &Rig,
    cpu: &CpuDevice,
    handle: HandleId,
    buffer: u64,
) -> Vec<StreamGate> {
    let warm = Batch::new(Arc::clone(&rig.driver), 8).unwrap();
    let entries: Vec<_> =
        (0..8).map(|i| entry(Direction::Read, handle, buffer, 0, 0, 4096, i)).collect();
    warm.submit(&entries).unwrap();
    assert_eq!(collect(&warm, 8).len(), 8);
    let gates = hipfile_test_support::cpu_rig::gate_streams(cpu);
    assert!(!gates.is_empty(), "the engine's streams exist after a read");
    gates
}

#[test]
fn reads_and_writes_of_several_files_and_buffers_in_one_batch() {
    let rig = Rig::new();
    let source_data = pattern(11, 8 * MIB);
    let source = TempFile::new("batch-src", &source_data);
    let target = TempFile::new("batch-dst", &vec![0u8; 4 * MIB]);
    let (source_fd, target_fd) = (source.open_ro(), target.open_rw());
    let (from, to) = (rig.register(&source_fd), rig.register(&target_fd));
    let read_buffer = rig.alloc(8 * MIB);
    rig.driver.buf_register(read_buffer, 8 * MIB as u64, 0).unwrap();
    let write_buffer = rig.alloc(4 * MIB); // not registered
    let write_data = pattern(12, 4 * MIB);
    rig.set_dev_bytes(write_buffer, &write_data);

    // 100 entries over two submissions: 4 KiB .. 3 MiB reads at random offsets into
    // disjoint buffer ranges (some large enough to fan out), and 36 writes of
    // disjoint 100 KiB ranges of the target file.
    let mut rng = Rng(5);
    let mut entries = Vec::new();
    let mut expected_reads = Vec::new();
    let slice = 8 * MIB / 64;
    for i in 0..64 {
        let size = if i % 16 == 0 { slice } else { rng.size(slice) };
        let file_offset = rng.below(8 * MIB - size);
        entries.push(entry(Direction::Read, from, read_buffer, i * slice, file_offset, size, i));
        expected_reads.push((i * slice, file_offset, size));
    }
    let write_len = 100 * KIB;
    for w in 0..36 {
        let offset = w * write_len;
        entries.push(entry(Direction::Write, to, write_buffer, offset, offset, write_len, 64 + w));
    }
    let batch = Batch::new(Arc::clone(&rig.driver), 128).unwrap();
    batch.submit(&entries[..50]).unwrap();
    batch.submit(&entries[50..]).unwrap();
    assert_eq!(batch.outstanding(), 100);

    let events = collect(&batch, 100);
    for (cookie, entry) in entries.iter().enumerate() {
        let event = events[&cookie];
        assert_eq!(
            (event.status, event.result),
            (BatchStatus::Complete, entry.size_bytes as i64),
            "entry {cookie}"
        );
    }
    assert_eq!(batch.outstanding(), 0);
    let device = rig.dev_bytes(read_buffer, 8 * MIB);
    for (i, &(buffer_offset, file_offset, size)) in expected_reads.iter().enumerate() {
        assert_bytes(
            &device[buffer_offset..buffer_offset + size],
            &source_data[file_offset..file_offset + size],
            &format!("read entry {i}"),
        );
    }
    let written = target.contents();
    assert_bytes(&written[..36 * write_len], &write_data[..36 * write_len], "written range");
    assert_all(&written[36 * write_len..], 0, "past the written range");
    drop(batch);
    rig.driver.buf_deregister(read_buffer).expect("no entry holds the buffer any more");
}

#[test]
fn random_4k_reads_fill_a_128_entry_batch_again_and_again() {
    let rig = Rig::new();
    let data = pattern(21, 16 * MIB);
    let file = TempFile::new("batch-4k", &data);
    let fd = file.open_ro();
    let handle = rig.register(&fd);
    let buffer = rig.alloc(128 * 4096);
    let batch = Batch::new(Arc::clone(&rig.driver), 128).unwrap();
    let mut rng = Rng(22);
    for round in 0..4 {
        let offsets: Vec<usize> = (0..128).map(|_| rng.below(16 * MIB / 4096) * 4096).collect();
        let entries: Vec<_> = offsets
            .iter()
            .enumerate()
            .map(|(i, &offset)| entry(Direction::Read, handle, buffer, i * 4096, offset, 4096, i))
            .collect();
        batch.submit(&entries).unwrap();
        let events = batch.status(128, 128, None);
        assert_eq!(events.len(), 128, "round {round}: min 128 waits for all");
        assert!(events.iter().all(|e| e.status == BatchStatus::Complete && e.result == 4096));
        let device = rig.dev_bytes(buffer, 128 * 4096);
        for (i, &offset) in offsets.iter().enumerate() {
            let got = &device[i * 4096..(i + 1) * 4096];
            assert_bytes(got, &data[offset..offset + 4096], &format!("round {round} entry {i}"));
        }
    }
}

#[test]
fn submission_is_all_or_nothing() {
    let rig = Rig::new();
    let file = TempFile::new("batch-aon", &pattern(31, MIB));
    let fd = file.open_rw();
    let handle = rig.register(&fd);
    let buffer = rig.alloc(MIB);
    let batch = Batch::new(Arc::clone(&rig.driver), 4).unwrap();
    let good = |i| entry(Direction::Read, handle, buffer, i * 4096, i * 4096, 4096, i);
    let code = |result: Result<(), hipfile_runtime::Error>| result.unwrap_err().code;

    let cases: Vec<(&str, BatchEntry, OpError)> = vec![
        (
            "negative file offset",
            BatchEntry { file_offset_bytes: -1, ..good(3) },
            OpError::InvalidValue,
        ),
        (
            "negative buffer offset",
            BatchEntry { buffer_offset_bytes: -4096, ..good(3) },
            OpError::InvalidValue,
        ),
        (
            "buffer offset at its end",
            BatchEntry { buffer_offset_bytes: MIB as i64, ..good(3) },
            OpError::InvalidValue,
        ),
        (
            "range past the buffer",
            BatchEntry { size_bytes: MIB as u64, ..good(3) },
            OpError::InvalidValue,
        ),
        (
            "file end past i64::MAX",
            BatchEntry { file_offset_bytes: i64::MAX, ..good(3) },
            OpError::InvalidValue,
        ),
        (
            "unknown handle",
            BatchEntry { handle: HandleId(0x1234_5670), ..good(3) },
            OpError::HandleNotRegistered,
        ),
        ("NULL buffer", BatchEntry { buffer_base_addr: 0, ..good(3) }, OpError::InvalidValue),
    ];
    for (what, bad, want) in cases {
        let entries = [good(0), good(1), good(2), bad];
        assert_eq!(code(batch.submit(&entries)), want, "{what}");
        assert_eq!(batch.outstanding(), 0, "{what}: nothing accepted");
    }
    // Host memory is not device memory (the cpu device tells them apart).
    if rig.cpu.is_some() {
        let host = vec![0u8; 8192];
        let bad = BatchEntry { buffer_base_addr: host.as_ptr() as u64, ..good(3) };
        let result = batch.submit(&[good(0), bad]);
        assert_eq!(code(result), OpError::HipMemoryTypeInvalid);
    }
    assert!(batch.status(0, 4, Some(Duration::ZERO)).is_empty());
    assert_all(&rig.dev_bytes(buffer, MIB), 0, "no refused entry ran");

    // Room: capacity minus outstanding.
    batch.submit(&[good(0), good(1), good(2)]).unwrap();
    assert_eq!(code(batch.submit(&[good(3), good(4)])), OpError::InvalidValue);
    batch.submit(&[good(3)]).unwrap();
    assert_eq!(code(batch.submit(&[good(5)])), OpError::InvalidValue, "full");
    assert_eq!(collect(&batch, 4).len(), 4);
    assert_eq!(code(Batch::new(Arc::clone(&rig.driver), 0).map(drop)), OpError::InvalidValue);
    assert_eq!(code(Batch::new(Arc::clone(&rig.driver), 129).map(drop)), OpError::InvalidValue);

    // A closed driver refuses; a batch made while it is closed works once it opens.
    let closed = Rig::closed(1, small_config());
    let early = Batch::new(Arc::clone(&closed.driver), 2).unwrap();
    let e = entry(Direction::Read, handle, buffer, 0, 0, 4096, 0);
    assert_eq!(code(early.submit(&[e])), OpError::DriverNotInitialized);
    assert!(early.submit(&[]).is_ok(), "an empty submission needs nothing");
}

#[test]
fn each_entry_reports_its_own_bytes_or_error() {
    let rig = Rig::new();
    let data = pattern(41, 100 * KIB);
    let file = TempFile::new("batch-errors", &data);
    let (read_only, write_only) = (file.open_ro(), file.open_wo());
    let (ro, wo) = (rig.register(&read_only), rig.register(&write_only));
    let buffer = rig.alloc(MIB);
    let batch = Batch::new(Arc::clone(&rig.driver), 8).unwrap();
    let entries = [
        entry(Direction::Read, ro, buffer, 0, 0, 64 * KIB, 0),
        entry(Direction::Read, ro, buffer, 64 * KIB, 90 * KIB, 64 * KIB, 1), // short at EOF
        entry(Direction::Read, ro, buffer, 128 * KIB, 200 * KIB, 4096, 2),   // past EOF
        entry(Direction::Read, wo, buffer, 256 * KIB, 0, 4096, 3),           // not readable
        entry(Direction::Write, ro, buffer, 0, 0, 4096, 4),                  // not writable
        entry(Direction::Read, ro, buffer, 512 * KIB, 0, 0, 5),              // empty
    ];
    batch.submit(&entries).unwrap();
    let events = collect(&batch, entries.len());
    let got: Vec<(BatchStatus, i64)> =
        (0..6).map(|c| (events[&c].status, events[&c].result)).collect();
    assert_eq!(
        got,
        vec![
            (BatchStatus::Complete, 64 * KIB as i64),
            (BatchStatus::Complete, 10 * KIB as i64),
            (BatchStatus::Complete, 0),
            (BatchStatus::Failed, -i64::from(libc::EBADF)),
            (BatchStatus::Failed, -i64::from(libc::EBADF)),
            (BatchStatus::Complete, 0),
        ]
    );
    let device = rig.dev_bytes(buffer, 74 * KIB);
    assert_bytes(&device[..64 * KIB], &data[..64 * KIB], "entry 0");
    assert_bytes(&device[64 * KIB..], &data[90 * KIB..], "entry 1");
    assert_eq!(file.contents(), data, "the refused write changed nothing");
}

#[test]
fn status_waits_for_min_entries_or_the_timeout() {
    let rig = Rig::new();
    let Some(cpu) = rig.cpu_only("holds entries in flight by gating cpu-device streams") else {
        return;
    };
    let file = TempFile::new("batch-wait", &pattern(51, MIB));
    let fd = file.open_ro();
    let handle = rig.register(&fd);
    let buffer = rig.alloc(MIB);
    let gates = hold_engine_copies(&rig, &cpu, handle, buffer);
    let batch = Batch::new(Arc::clone(&rig.driver), 16).unwrap();
    let entries: Vec<_> = (0..4)
        .map(|i| entry(Direction::Read, handle, buffer, i * 4096, i * 4096, 4096, i))
        .collect();
    batch.submit(&entries).unwrap();

    assert!(batch.status(0, 4, None).is_empty(), "min 0 never waits");
    let started = Instant::now();
    assert!(batch.status(1, 4, Some(Duration::from_millis(150))).is_empty());
    assert!(started.elapsed() >= Duration::from_millis(150), "waited the whole timeout");

    let released = Arc::new(AtomicBool::new(false));
    let releaser = {
        let released = Arc::clone(&released);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            released.store(true, Ordering::SeqCst);
            drop(gates);
        })
    };
    // No limit, and more than were submitted: waits for the four, then returns.
    let events = run_guarded("status(8, 8, None)", {
        let batch = Arc::new(batch);
        move || batch.status(8, 8, None)
    });
    assert!(released.load(Ordering::SeqCst), "returned only once the entries could finish");
    assert_eq!(events.len(), 4);
    releaser.join().unwrap();
}

#[test]
fn cancel_and_drop_wait_for_entries_moving_data_then_the_batch_is_empty() {
    let rig = Rig::new();
    let Some(cpu) = rig.cpu_only("holds entries in flight by gating cpu-device streams") else {
        return;
    };
    let data = pattern(61, 4 * MIB);
    let file = TempFile::new("batch-cancel", &data);
    let fd = file.open_ro();
    let handle = rig.register(&fd);
    let buffer = rig.alloc(4 * MIB);
    rig.driver.buf_register(buffer, 4 * MIB as u64, 0).unwrap();
    let batch = Arc::new(Batch::new(Arc::clone(&rig.driver), 64).unwrap());
    for (round, by_drop) in [(0, false), (1, true)] {
        let gates = hold_engine_copies(&rig, &cpu, handle, buffer);
        let batch = if by_drop {
            Arc::new(Batch::new(Arc::clone(&rig.driver), 64).unwrap())
        } else {
            Arc::clone(&batch)
        };
        let entries: Vec<_> = (0..64)
            .map(|i| {
                entry(Direction::Read, handle, buffer, i * 64 * KIB, i * 64 * KIB, 64 * KIB, i)
            })
            .collect();
        let staged = || {
            let stats = rig.driver.engine().unwrap().stats();
            stats.arena_chunks + stats.fallback_chunks
        };
        let staged_before = staged();
        batch.submit(&entries).unwrap();
        assert!(
            rig.driver.buf_deregister(buffer).is_err(),
            "round {round}: entries hold the buffer"
        );
        // At least one entry is moving data (its copy waits behind the gate); entries
        // still queued would be refused at once, and cancel would not wait for them.
        wait_until("an entry's copy is enqueued", || staged() > staged_before);

        let returned = Arc::new(AtomicBool::new(false));
        let canceller = {
            let returned = Arc::clone(&returned);
            std::thread::spawn(move || {
                if by_drop {
                    drop(Arc::into_inner(batch).expect("the only reference"));
                } else {
                    batch.cancel();
                }
                returned.store(true, Ordering::SeqCst);
            })
        };
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            !returned.load(Ordering::SeqCst),
            "round {round}: returned with entries moving data"
        );
        drop(gates);
        run_guarded("cancel returns", move || canceller.join().unwrap());
        let snapshot = rig.dev_bytes(buffer, 4 * MIB);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(
            rig.dev_bytes(buffer, 4 * MIB),
            snapshot,
            "round {round}: nothing moves after cancel"
        );
    }
    assert_eq!(batch.outstanding(), 0);
    assert!(batch.status(0, 64, Some(Duration::ZERO)).is_empty(), "cancel forgot every entry");
    // The batch takes new work.
    let entries: Vec<_> = (0..8)
        .map(|i| entry(Direction::Read, handle, buffer, i * 4096, 4096, 4096, 100 + i))
        .collect();
    batch.submit(&entries).unwrap();
    assert_eq!(collect(&batch, 8).len(), 8);
    assert_bytes(&rig.dev_bytes(buffer + 7 * 4096, 4096), &data[4096..8192], "after cancel");
    rig.driver.buf_deregister(buffer).expect("no entry holds the buffer after cancel");
}
