//! Durability: a write reported complete is in the file.
//!
//! hipFile's promise, and ours: once `hipFileWrite` returns, or the stream has passed a
//! `hipFileWriteAsync`, every descriptor of the file reads the new bytes — through the
//! page cache and with O_DIRECT — and after the application's own `fdatasync` they are
//! on the storage device: they read back after the kernel dropped the file's cached
//! pages. Nothing is flushed for the application (as with `pwrite`): durability across a
//! crash or power loss needs its `fsync`/`fdatasync` (README, Reliability).
//!
//! Each case writes through both engine paths: O_DIRECT (page-aligned range on ext4) and
//! buffered (unaligned range), checked by the file's counters.

use std::fs::OpenOptions;
use std::os::unix::fs::{FileExt, OpenOptionsExt};

use hipfile_core::{Direction, RawIo};
use hipfile_test_support::rig::*;

const FILE_BYTES: usize = 8 * MIB;

/// Reads `len` bytes at `offset` through a descriptor opened anew, with `O_DIRECT`
/// when `direct` (bypassing the page cache; the kernel writes dirty cached pages of
/// the range back first).
fn read_fresh(path: &std::path::Path, offset: usize, len: usize, direct: bool) -> Vec<u8> {
    let mut options = OpenOptions::new();
    options.read(true);
    if direct {
        options.custom_flags(libc::O_DIRECT);
    }
    let file = options.open(path).expect("open the file anew");
    // O_DIRECT needs an aligned buffer: read into a page-aligned window.
    let start = offset / 4096 * 4096;
    let end = (offset + len).div_ceil(4096) * 4096;
    let layout = std::alloc::Layout::from_size_align(end - start, 4096).unwrap();
    // SAFETY: non-zero size; freed below with the same layout.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
    assert!(!ptr.is_null());
    // SAFETY: `ptr` holds `end - start` initialized bytes until it is freed.
    let window = unsafe { std::slice::from_raw_parts_mut(ptr, end - start) };
    let mut done = 0;
    while done < window.len() {
        let n = file.read_at(&mut window[done..], (start + done) as u64).expect("read back");
        assert!(n > 0, "short file");
        done += n;
    }
    let bytes = window[offset - start..offset - start + len].to_vec();
    // SAFETY: allocated above with `layout`, no longer borrowed.
    unsafe { std::alloc::dealloc(ptr, layout) };
    bytes
}

/// The ranges each case writes: `(file offset, length)`; the first is page-aligned (the
/// O_DIRECT path), the second is not (buffered).
const RANGES: [(usize, usize); 2] = [(MIB, 2 * MIB), (4 * MIB + 123, 1000 * 1000 + 7)];

fn check_everywhere(file: &TempFile, client: &std::fs::File, data: &[u8], what: &str) {
    for &(offset, len) in &RANGES {
        let want = &data[offset..offset + len];
        assert_bytes(&read_fresh(&file.path, offset, len, false), want, &format!("{what}: cached"));
        assert_bytes(
            &read_fresh(&file.path, offset, len, true),
            want,
            &format!("{what}: O_DIRECT"),
        );
    }
    page_cache::drop_cached_pages(client);
    for &(offset, len) in &RANGES {
        let want = &data[offset..offset + len];
        let back = read_fresh(&file.path, offset, len, false);
        assert_bytes(&back, want, &format!("{what}: after fdatasync and dropping the cache"));
    }
}

#[test]
fn a_completed_sync_write_is_in_the_file_for_every_descriptor() {
    let rig = Rig::new();
    let mut data = pattern(1, FILE_BYTES);
    let file = TempFile::new("durable-sync", &data);
    let client = file.open_rw();
    let handle = rig.register(&client);
    let buffer = rig.alloc(FILE_BYTES);
    let fresh = pattern(2, FILE_BYTES);
    rig.set_dev_bytes(buffer, &fresh);
    for &(offset, len) in &RANGES {
        let io = RawIo {
            size_bytes: len as u64,
            file_offset_bytes: offset as i64,
            buffer_offset_bytes: offset as i64,
        };
        assert_eq!(rig.driver.io_sync(Direction::Write, handle, buffer, io), Ok(len));
        data[offset..offset + len].copy_from_slice(&fresh[offset..offset + len]);
    }
    let counters = rig.driver.file(handle).unwrap().counters();
    assert!(counters.buffered_written_bytes > 0, "{counters:?}");
    if rig.driver.file(handle).unwrap().direct_fd().is_some() {
        assert!(counters.direct_written_bytes > 0, "the aligned range used O_DIRECT: {counters:?}");
    }
    check_everywhere(&file, &client, &data, "sync write");
    rig.driver.handle_deregister(handle);
}

#[test]
fn an_async_write_the_stream_has_passed_is_in_the_file_for_every_descriptor() {
    let rig = Rig::new();
    let mut data = pattern(3, FILE_BYTES);
    let file = TempFile::new("durable-async", &data);
    let client = file.open_rw();
    let handle = rig.register(&client);
    let buffer = rig.alloc(FILE_BYTES);
    let fresh = pattern(4, FILE_BYTES);
    rig.set_dev_bytes(buffer, &fresh);
    let stream = rig.stream();
    let ops: Vec<_> = RANGES
        .iter()
        .map(|&(offset, len)| {
            let p = params(len, offset as i64, offset as i64);
            rig.write(handle, buffer, &p, stream);
            data[offset..offset + len].copy_from_slice(&fresh[offset..offset + len]);
            (p, len)
        })
        .collect();
    rig.sync(stream);
    for (p, len) in &ops {
        assert_eq!(bytes(p), *len as isize);
    }
    check_everywhere(&file, &client, &data, "async write");
    rig.driver.handle_deregister(handle);
}
