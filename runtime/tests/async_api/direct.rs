//! O_DIRECT and buffered chunks of async writes on a real filesystem (ext4 under
//! `std::env::temp_dir()`): an unaligned write is planned as O_DIRECT chunks plus a
//! buffered head/tail; the two kinds must not collide in the page cache.
//!
//! The kernel reports a collision between O_DIRECT and buffered I/O on the same page by
//! poisoning the file's writeback error state (`dio_warn_stale_pagecache`: "Page cache
//! invalidation failure on direct I/O. Possible data corruption due to collision with
//! buffered I/O!"), so the client's next `fsync` fails with EIO — and, rarely, the page
//! cache keeps stale bytes over data the O_DIRECT write put on disk.

use hipfile_runtime::file::DirectPolicy;
use hipfile_test_support::rig::*;

/// Writes `size` bytes at `offset` `rounds` times from two alternating sources, checking
/// the data after each round, and returns the client's `fsync` result.
fn write_rounds(rig: &Rig, size: usize, offset: usize, rounds: usize) -> std::io::Result<()> {
    let file = TempFile::new("direct", &vec![0; 2 * MIB]);
    let fd = file.open_rw();
    let handle = rig.register(&fd);
    let sources = [pattern(80, MIB), pattern(81, MIB)];
    let buffers = [rig.alloc(MIB), rig.alloc(MIB)];
    for (buffer, source) in buffers.iter().zip(&sources) {
        rig.set_dev_bytes(*buffer, source);
    }
    let stream = rig.registered_stream(0);
    for round in 0..rounds {
        let p = params(size, offset as i64, 0);
        rig.write(handle, buffers[round % 2], &p, stream);
        rig.sync(stream);
        assert_eq!(bytes(&p), size as isize);
        let contents = file.contents();
        let what = format!("size {size} at {offset}, round {round}");
        assert_bytes(&contents[offset..offset + size], &sources[round % 2][..size], &what);
    }
    let synced = fd.sync_all();
    rig.driver.handle_deregister(handle);
    synced
}

#[test]
fn page_aligned_writes_leave_fsync_clean() {
    // Control: no buffered chunk, no collision.
    let rig = Rig::new();
    write_rounds(&rig, MIB, 0, 8).expect("fsync after aligned writes");
    write_rounds(&rig, 64 * KIB, 8192, 8).expect("fsync after aligned writes");
}

#[test]
fn buffered_only_unaligned_writes_leave_fsync_clean() {
    // Control: HIPFILE_ODIRECT=off, every chunk buffered.
    let mut config = small_config();
    config.direct = DirectPolicy::Off;
    let rig = Rig::with(1, config);
    write_rounds(&rig, MIB - 1, 0, 8).expect("fsync after buffered writes");
    write_rounds(&rig, 64 * KIB - 1, 8192, 8).expect("fsync after buffered writes");
}

/// BUG (runtime/src/engine/executor/ `plan` + `write_range`): the planner cuts O_DIRECT
/// chunks at the file's DIO offset alignment (512 on this disk), so the last O_DIRECT
/// chunk and the buffered tail share a 4 KiB page, and `write_range` runs them
/// concurrently. The O_DIRECT write then cannot invalidate the page the buffered write
/// just dirtied: the kernel poisons the mapping (fsync → EIO) and may keep stale bytes.
#[test]
fn unaligned_writes_leave_fsync_clean() {
    let rig = Rig::new();
    write_rounds(&rig, MIB - 1, 0, 8).expect("fsync after writes of 1 MiB - 1 (behaviour A5)");
    write_rounds(&rig, 64 * KIB - 1, 8192, 8).expect("fsync after writes of 64 KiB - 1");
    write_rounds(&rig, 4095, 0, 8).expect("fsync after writes of 4095 bytes");
}
