//! Synchronous reads and writes through the [`Driver`] and the safe API
//! ([`hipfile_runtime::api`]) on the `cpu` device, with data checked byte for byte.
//!
//! Files live in `std::env::temp_dir()` (ext4 here: our O_DIRECT path) and `/dev/shm`
//! (tmpfs: page cache only). Each test builds its own [`Driver`] with one or two
//! executors, 256 KiB chunks and 8 MiB of staging per executor.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;
use std::thread;

use hipfile_core::{Direction, OpError, max_io_bytes};
use hipfile_runtime::api::{DeviceSpan, HipFile, RegisteredDeviceBuffer, RegisteredFile};
use hipfile_runtime::file::{DirectPolicy, FileCounters};
use hipfile_runtime::{Driver, Error, HandleId, IoError};

#[allow(unused_imports, reason = "not every helper is used by every file")]
use hipfile_test_support::cpu_rig::*;
use hipfile_test_support::raw;

// ----------------------------------------------------------------------------------------
// Helpers
// ----------------------------------------------------------------------------------------

/// The handle's O_DIRECT offset alignment, `None` (with a note) when the file got no
/// O_DIRECT descriptor, in which case direct-path assertions are skipped.
fn direct_alignment(driver: &Driver, handle: HandleId) -> Option<u64> {
    let file = driver.file(handle).unwrap();
    let alignment = file.dio_alignment().map(|dio| dio.offset_bytes);
    if alignment.is_none() {
        eprintln!("skipped: {} has no O_DIRECT path", ext4_dir().display());
    }
    alignment
}

fn counters(driver: &Driver, handle: HandleId) -> FileCounters {
    driver.file(handle).unwrap().counters()
}

// ----------------------------------------------------------------------------------------
// Data, aligned and unaligned
// ----------------------------------------------------------------------------------------

const FILE_OFFSETS: [usize; 7] = [0, 1, 4095, 4096, 4097, CHUNK - 1, CHUNK + 1];
const SIZES: [usize; 8] = [1, 4095, 4096, 4097, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 17];
const BUFFER_OFFSETS: [usize; 3] = [0, 1, 4096 + 3];
const MATRIX_FILE_BYTES: usize = 2 * MIB;
const MATRIX_BUFFER_BYTES: usize = MIB;
const SENTINEL: u8 = 0xA5;

/// Every (file offset, size, buffer offset) of the matrix: the bytes read equal the
/// file's, and the device bytes just outside the target range are untouched.
fn read_matrix(dir: &Path, client_options: &mut OpenOptions) {
    let data = pattern(MATRIX_FILE_BYTES, 1);
    let file = TempFile::new(dir, &data);
    let client = file.open_with(client_options);
    let (driver, device) = driver();
    let handle = driver.handle_register(client.as_raw_fd()).unwrap();
    let buf = device.malloc_device(0, MATRIX_BUFFER_BYTES).unwrap();
    let sentinel = vec![SENTINEL; MATRIX_BUFFER_BYTES];
    let mut total = 0;
    for file_offset in FILE_OFFSETS {
        for size in SIZES {
            for buffer_offset in BUFFER_OFFSETS {
                let what = format!("read fo={file_offset} size={size} bo={buffer_offset}");
                fill_device(buf, &sentinel);
                let raw = raw(size, file_offset, buffer_offset);
                let n = driver.io_sync(Direction::Read, handle, buf, raw);
                assert_eq!(n, Ok(size), "{what}");
                let got = device_bytes(buf + buffer_offset as u64, size);
                assert!(got == data[file_offset..file_offset + size], "{what}: data");
                if buffer_offset > 0 {
                    let before = device_bytes(buf + buffer_offset as u64 - 1, 1)[0];
                    assert_eq!(before, SENTINEL, "{what}: byte before the target");
                }
                let after = device_bytes(buf + (buffer_offset + size) as u64, 1)[0];
                assert_eq!(after, SENTINEL, "{what}: byte after the target");
                total += size as u64;
            }
        }
    }
    assert_eq!(counters(&driver, handle).read_bytes(), total);
    driver.handle_deregister(handle);
}

/// Every (file offset, size, buffer offset) of the matrix: the file then holds the
/// device bytes at the target range and nothing else changed.
fn write_matrix(dir: &Path, client_options: &mut OpenOptions) {
    let mut model = pattern(MATRIX_FILE_BYTES, 2);
    let file = TempFile::new(dir, &model);
    let client = file.open_with(client_options);
    let checker = File::open(&file.path).unwrap();
    let (driver, device) = driver();
    let handle = driver.handle_register(client.as_raw_fd()).unwrap();
    let buf = device.malloc_device(0, MATRIX_BUFFER_BYTES).unwrap();
    let combos = FILE_OFFSETS.len() * SIZES.len() * BUFFER_OFFSETS.len();
    let sources = pattern(MATRIX_BUFFER_BYTES + combos * 4099, 3);
    let mut combo = 0;
    let mut total = 0;
    for file_offset in FILE_OFFSETS {
        for size in SIZES {
            for buffer_offset in BUFFER_OFFSETS {
                let what = format!("write fo={file_offset} size={size} bo={buffer_offset}");
                let source = &sources[combo * 4099..combo * 4099 + MATRIX_BUFFER_BYTES];
                combo += 1;
                fill_device(buf, source);
                let raw = raw(size, file_offset, buffer_offset);
                let n = driver.io_sync(Direction::Write, handle, buf, raw);
                assert_eq!(n, Ok(size), "{what}");
                model[file_offset..file_offset + size]
                    .copy_from_slice(&source[buffer_offset..buffer_offset + size]);
                let start = file_offset.saturating_sub(1);
                let end = (file_offset + size + 1).min(MATRIX_FILE_BYTES);
                let mut window = vec![0u8; end - start];
                checker.read_exact_at(&mut window, start as u64).unwrap();
                assert!(window == model[start..end], "{what}: file contents");
                total += size as u64;
            }
        }
    }
    assert!(file.contents() == model, "final file contents");
    assert_eq!(counters(&driver, handle).written_bytes(), total);
    driver.handle_deregister(handle);
}

#[test]
fn read_matrix_ext4_direct() {
    read_matrix(&ext4_dir(), OpenOptions::new().read(true).write(true));
}

#[test]
fn read_matrix_tmpfs_buffered() {
    read_matrix(&tmpfs_dir(), OpenOptions::new().read(true).write(true));
}

#[test]
fn write_matrix_ext4_direct() {
    write_matrix(&ext4_dir(), OpenOptions::new().read(true).write(true));
}

#[test]
fn write_matrix_tmpfs_buffered() {
    write_matrix(&tmpfs_dir(), OpenOptions::new().read(true).write(true));
}

/// The client's own descriptor has O_DIRECT (the driver then opens a buffered twin).
#[test]
fn read_and_write_matrix_client_fd_o_direct_ext4() {
    let mut options = OpenOptions::new();
    options.read(true).write(true).custom_flags(libc::O_DIRECT);
    read_matrix(&ext4_dir(), &mut options);
    write_matrix(&ext4_dir(), &mut options);
}

/// One large read and write spanning both executors, unaligned on both sides.
#[test]
fn large_unaligned_read_and_write_across_executors() {
    let len = 5 * MIB + 123;
    for dir in [ext4_dir(), tmpfs_dir()] {
        let data = pattern(len, 4);
        let file = TempFile::new(&dir, &data);
        let client = file.open_rw();
        let (driver, device) = driver();
        let handle = driver.handle_register(client.as_raw_fd()).unwrap();
        let buf = device.malloc_device(0, 8 * MIB).unwrap();
        let n = driver.io_sync(Direction::Read, handle, buf, raw(8 * MIB, 0, 0)).unwrap();
        assert_eq!(n, len, "{}: short at EOF", dir.display());
        assert!(device_bytes(buf, len) == data, "{}: data", dir.display());
        let n = driver.io_sync(Direction::Write, handle, buf, raw(3 * MIB + 1, 77, 5)).unwrap();
        assert_eq!(n, 3 * MIB + 1);
        let mut expected = data.clone();
        expected[77..77 + 3 * MIB + 1].copy_from_slice(&data[5..5 + 3 * MIB + 1]);
        assert!(file.contents() == expected, "{}: written data", dir.display());
        driver.handle_deregister(handle);
    }
}

// ----------------------------------------------------------------------------------------
// EOF, size 0, clamp
// ----------------------------------------------------------------------------------------

fn eof_on(dir: &Path) {
    let len = 3 * CHUNK + 100;
    let data = pattern(len, 5);
    let file = TempFile::new(dir, &data);
    let client = file.open_rw();
    let (driver, device) = driver();
    let handle = driver.handle_register(client.as_raw_fd()).unwrap();
    let buf = device.malloc_device(0, 2 * MIB).unwrap();
    let read =
        |size, file_offset| driver.io_sync(Direction::Read, handle, buf, raw(size, file_offset, 0));
    // Short counts.
    assert_eq!(read(4096, len - 10), Ok(10));
    assert!(device_bytes(buf, 10) == data[len - 10..]);
    assert_eq!(read(2 * MIB, 0), Ok(len), "a request split over both executors");
    assert!(device_bytes(buf, len) == data);
    assert_eq!(read(2 * CHUNK, len - CHUNK - 1), Ok(CHUNK + 1));
    assert!(device_bytes(buf, CHUNK + 1) == data[len - CHUNK - 1..]);
    // At and after EOF: 0.
    assert_eq!(read(4096, len), Ok(0));
    assert_eq!(read(1, len), Ok(0));
    assert_eq!(read(2 * MIB, len + 5000), Ok(0));
    assert_eq!(read(4096, 1 << 40), Ok(0));
    // A write past EOF extends the file; the gap reads as zeros.
    fill_device(buf, &[7u8; 100]);
    let n = driver.io_sync(Direction::Write, handle, buf, raw(100, len + 4096, 0));
    assert_eq!(n, Ok(100));
    let contents = file.contents();
    assert_eq!(contents.len(), len + 4096 + 100);
    assert!(contents[len..len + 4096].iter().all(|&b| b == 0));
    assert!(contents[len + 4096..].iter().all(|&b| b == 7));
    driver.handle_deregister(handle);
}

#[test]
fn eof_short_count_and_zero_at_or_after_eof_ext4() {
    eof_on(&ext4_dir());
}

#[test]
fn eof_short_count_and_zero_at_or_after_eof_tmpfs() {
    eof_on(&tmpfs_dir());
}

#[test]
fn size_zero_returns_zero_and_moves_nothing() {
    let data = pattern(8192, 6);
    let file = TempFile::new(&tmpfs_dir(), &data);
    let client = file.open_rw();
    let (driver, device) = driver();
    let handle = driver.handle_register(client.as_raw_fd()).unwrap();
    let buf = device.malloc_device(0, 8192).unwrap();
    fill_device(buf, &[SENTINEL; 8192]);
    for direction in [Direction::Read, Direction::Write] {
        for (file_offset, buffer_offset) in [(0, 0), (1, 1), (1 << 30, 8191)] {
            let raw = raw(0, file_offset, buffer_offset);
            assert_eq!(driver.io_sync(direction, handle, buf, raw), Ok(0));
        }
    }
    assert!(device_bytes(buf, 8192).iter().all(|&b| b == SENTINEL));
    assert!(file.contents() == data);
    assert_eq!(counters(&driver, handle), FileCounters::default());
    // Size 0 still validates the buffer offset (hipFile does too).
    let result = driver.io_sync(Direction::Read, handle, buf, raw(0, 0, 8192));
    assert_eq!(result, Err(IoError::Library(OpError::InvalidValue)));
    driver.handle_deregister(handle);
}

/// Sizes above the maximum I/O size are clamped to it before the buffer check: a 3 GiB
/// read into a buffer of exactly the maximum succeeds (short at EOF of a small file).
#[test]
fn size_above_max_io_is_clamped_not_rejected() {
    let data = pattern(8192 + 17, 7);
    let file = TempFile::new(&tmpfs_dir(), &data);
    let client = file.open_rw();
    let (driver, device) = driver();
    let handle = driver.handle_register(client.as_raw_fd()).unwrap();
    let max = max_io_bytes(driver.page_size_bytes()).unwrap() as usize;
    let Ok(buf) = device.malloc_device(0, max) else {
        eprintln!("skipped: cannot allocate {max} bytes of device memory");
        return;
    };
    for size in [max + 1, 3 << 30, usize::MAX] {
        let n = driver.io_sync(Direction::Read, handle, buf, raw(size, 0, 0));
        assert_eq!(n, Ok(data.len()), "size {size:#x} is clamped to {max:#x}");
    }
    assert!(device_bytes(buf, data.len()) == data);
    // Clamped, it still has to fit: from buffer offset 1 it does not.
    let result = driver.io_sync(Direction::Read, handle, buf, raw(3 << 30, 0, 1));
    assert_eq!(result, Err(IoError::Library(OpError::InvalidValue)));
    driver.handle_deregister(handle);
    // SAFETY: no reference into the allocation exists and no I/O on it is in flight.
    unsafe { device.free_device(buf) }.unwrap();
}

// ----------------------------------------------------------------------------------------
// Access modes
// ----------------------------------------------------------------------------------------

fn access_modes_on(dir: &Path) {
    let data = pattern(64 * KIB, 8);
    let file = TempFile::new(dir, &data);
    let read_only = file.open_with(OpenOptions::new().read(true));
    let write_only = file.open_with(OpenOptions::new().write(true));
    let (driver, device) = driver();
    let buf = device.malloc_device(0, 64 * KIB).unwrap();
    let ro = driver.handle_register(read_only.as_raw_fd()).unwrap();
    let wo = driver.handle_register(write_only.as_raw_fd()).unwrap();

    assert_eq!(driver.io_sync(Direction::Read, ro, buf, raw(64 * KIB, 0, 0)), Ok(64 * KIB));
    assert!(device_bytes(buf, 64 * KIB) == data);
    let forbidden_write = driver.io_sync(Direction::Write, ro, buf, raw(4096, 0, 0));
    let forbidden_read = driver.io_sync(Direction::Read, wo, buf, raw(4096, 0, 0));
    assert!(file.contents() == data, "nothing written through the read-only handle");
    fill_device(buf, &[9u8; 4096]);
    assert_eq!(driver.io_sync(Direction::Write, wo, buf, raw(4096, 4096, 0)), Ok(4096));
    assert!(file.contents()[4096..8192].iter().all(|&b| b == 9));
    let ebadf = Err(IoError::Os(libc::EBADF));
    assert_eq!(
        (forbidden_write, forbidden_read),
        (ebadf, ebadf),
        "(write through O_RDONLY, read through O_WRONLY) on {}",
        dir.display()
    );
    driver.handle_deregister(ro);
    driver.handle_deregister(wo);
}

#[test]
fn access_mode_preserved_ebadf_ext4() {
    access_modes_on(&ext4_dir());
}

#[test]
fn access_mode_preserved_ebadf_tmpfs() {
    access_modes_on(&tmpfs_dir());
}

/// The first file a fresh driver opens on ext4 is write-only (glommio's poll probe
/// cannot read it); writing, then reading another file on the same filesystem, works.
#[test]
fn write_only_file_first_on_ext4_then_read_write_file() {
    let file = TempFile::new(&ext4_dir(), &pattern(MIB, 9));
    let write_only = file.open_with(OpenOptions::new().write(true));
    let (driver, device) = driver();
    let buf = device.malloc_device(0, MIB).unwrap();
    let data = pattern(MIB, 10);
    fill_device(buf, &data);
    let wo = driver.handle_register(write_only.as_raw_fd()).unwrap();
    assert_eq!(driver.io_sync(Direction::Write, wo, buf, raw(MIB, 0, 0)), Ok(MIB));
    assert!(file.contents() == data);
    let other_data = pattern(MIB, 11);
    let other = TempFile::new(&ext4_dir(), &other_data);
    let client = other.open_rw();
    let rw = driver.handle_register(client.as_raw_fd()).unwrap();
    assert_eq!(driver.io_sync(Direction::Read, rw, buf, raw(MIB, 0, 0)), Ok(MIB));
    assert!(device_bytes(buf, MIB) == other_data);
    driver.handle_deregister(wo);
    driver.handle_deregister(rw);
}

// ----------------------------------------------------------------------------------------
// Deregistration with I/O in flight
// ----------------------------------------------------------------------------------------

/// The handle is deregistered while a read on it is in flight (held there by gating the
/// device's streams): the read completes with full data, new I/O fails at once.
#[test]
fn deregister_handle_with_read_in_flight_read_completes_new_io_5027() {
    let t = ReadInFlight::new(8 * MIB, 12);
    t.hold(|file_handle| {
        t.driver.handle_deregister(t.handle);
        assert!(file_handle.is_deregistered());
        for direction in [Direction::Read, Direction::Write] {
            let result = t.driver.io_sync(direction, t.handle, t.other, raw(4096, 0, 0));
            assert_eq!(result, Err(IoError::Library(OpError::HandleNotRegistered)));
        }
    });
    // The file can be registered again.
    let again = t.driver.handle_register(t.client.as_raw_fd()).unwrap();
    assert_eq!(t.driver.io_sync(Direction::Read, again, t.other, raw(4096, 0, 0)), Ok(4096));
    t.driver.handle_deregister(again);
}

// ----------------------------------------------------------------------------------------
// Direct / buffered split
// ----------------------------------------------------------------------------------------

#[test]
fn counters_aligned_io_on_ext4_is_all_direct() {
    let data = pattern(4 * MIB, 13);
    let file = TempFile::new(&ext4_dir(), &data);
    file.uncache();
    let client = file.open_rw();
    let (driver, device) = driver();
    let handle = driver.handle_register(client.as_raw_fd()).unwrap();
    let Some(_) = direct_alignment(&driver, handle) else { return };
    let buf = device.malloc_device(0, 2 * MIB).unwrap();
    assert_eq!(driver.io_sync(Direction::Read, handle, buf, raw(2 * MIB, 0, 0)), Ok(2 * MIB));
    assert!(device_bytes(buf, 2 * MIB) == data[..2 * MIB]);
    // A device buffer offset does not matter: staging is aligned, the device copy is not.
    assert_eq!(driver.io_sync(Direction::Read, handle, buf, raw(MIB, MIB, 1)), Ok(MIB));
    assert_eq!(driver.io_sync(Direction::Write, handle, buf, raw(MIB, 3 * MIB, 0)), Ok(MIB));
    let expected = FileCounters {
        direct_read_bytes: 3 * MIB as u64,
        buffered_read_bytes: 0,
        direct_written_bytes: MIB as u64,
        buffered_written_bytes: 0,
    };
    assert_eq!(counters(&driver, handle), expected);
    driver.handle_deregister(handle);
}

/// An unaligned request: only its head (up to the first aligned offset) and its tail
/// (past the last one) go through the page cache. The engine aligns chunks to the file's
/// DIO alignment rounded up to the page size (direct and buffered I/O never share a page).
fn unaligned_split(cpus: &[usize]) {
    let data = pattern(4 * MIB, 14);
    let file = TempFile::new(&ext4_dir(), &data);
    file.uncache();
    let client = file.open_rw();
    let (driver, device) = driver_with(config(cpus));
    let handle = driver.handle_register(client.as_raw_fd()).unwrap();
    let Some(alignment) = direct_alignment(&driver, handle) else { return };
    // SAFETY: sysconf has no memory effects.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    let alignment = alignment.max(page);
    let buf = device.malloc_device(0, 3 * MIB).unwrap();
    let (offset, size) = (100u64, 2 * MIB as u64 + 300);
    let head = alignment - offset % alignment;
    let tail = (offset + size) % alignment;
    let raw = raw(size as usize, offset as usize, 0);
    assert_eq!(driver.io_sync(Direction::Read, handle, buf, raw), Ok(size as usize));
    assert!(device_bytes(buf, size as usize) == data[100..100 + size as usize]);
    assert_eq!(driver.io_sync(Direction::Write, handle, buf, raw), Ok(size as usize));
    let expected = FileCounters {
        direct_read_bytes: size - head - tail,
        buffered_read_bytes: head + tail,
        direct_written_bytes: size - head - tail,
        buffered_written_bytes: head + tail,
    };
    assert_eq!(counters(&driver, handle), expected, "alignment {alignment}, {cpus:?}");
    driver.handle_deregister(handle);
}

#[test]
fn counters_unaligned_head_and_tail_buffered_one_executor() {
    unaligned_split(&[0]);
}

#[test]
fn counters_unaligned_head_and_tail_buffered_split_over_two_executors() {
    unaligned_split(&[0, 1]);
}

fn all_buffered(dir: &Path, direct: DirectPolicy) {
    let data = pattern(4 * MIB, 15);
    let file = TempFile::new(dir, &data);
    let client = file.open_rw();
    let mut config = config(&[0, 1]);
    config.direct = direct;
    let (driver, device) = driver_with(config);
    let handle = driver.handle_register(client.as_raw_fd()).unwrap();
    assert_eq!(driver.file(handle).unwrap().direct_fd(), None);
    let buf = device.malloc_device(0, 2 * MIB).unwrap();
    assert_eq!(driver.io_sync(Direction::Read, handle, buf, raw(2 * MIB, 0, 0)), Ok(2 * MIB));
    assert!(device_bytes(buf, 2 * MIB) == data[..2 * MIB]);
    assert_eq!(driver.io_sync(Direction::Write, handle, buf, raw(MIB, 2 * MIB, 0)), Ok(MIB));
    let expected = FileCounters {
        direct_read_bytes: 0,
        buffered_read_bytes: 2 * MIB as u64,
        direct_written_bytes: 0,
        buffered_written_bytes: MIB as u64,
    };
    assert_eq!(counters(&driver, handle), expected);
    driver.handle_deregister(handle);
}

#[test]
fn counters_tmpfs_is_all_buffered() {
    all_buffered(&tmpfs_dir(), DirectPolicy::Auto);
    all_buffered(&tmpfs_dir(), DirectPolicy::On);
}

#[test]
fn counters_direct_policy_off_is_all_buffered() {
    all_buffered(&ext4_dir(), DirectPolicy::Off);
}

// ----------------------------------------------------------------------------------------
// Files that start empty; compatibility mode off
// ----------------------------------------------------------------------------------------

/// glommio 0.9 probes the poll ring by reading the first O_DIRECT file it opens on a
/// device; an empty file fools it. The first file this driver opens is empty: writing
/// 1 MiB and reading it back must work, through io_uring (no blocking retries).
#[test]
fn empty_file_on_ext4_write_then_read_back() {
    let file = TempFile::new(&ext4_dir(), &[]);
    let client = file.open_rw();
    let (driver, device) = driver();
    let handle = driver.handle_register(client.as_raw_fd()).unwrap();
    let data = pattern(MIB, 16);
    let source = device.malloc_device(0, MIB).unwrap();
    let target = device.malloc_device(0, MIB).unwrap();
    fill_device(source, &data);
    assert_eq!(driver.io_sync(Direction::Write, handle, source, raw(MIB, 0, 0)), Ok(MIB));
    assert_eq!(driver.io_sync(Direction::Read, handle, target, raw(MIB, 0, 0)), Ok(MIB));
    assert!(device_bytes(target, MIB) == data, "data read back");
    assert!(file.contents() == data, "file contents");
    assert_eq!(driver.engine().unwrap().stats().sync_retry_chunks, 0);
    driver.handle_deregister(handle);
}

#[test]
fn compat_mode_false_sync_io_is_internal_error() {
    let file = TempFile::new(&ext4_dir(), &pattern(8192, 17));
    let client = file.open_rw();
    let mut config = config(&[0]);
    config.allow_compat_mode = false;
    let (driver, device) = driver_with(config);
    let hipfile = HipFile::open(driver);
    let registered = hipfile.register_file(&client).unwrap();
    let addr = device.malloc_device(0, 8192).unwrap();
    let span = DeviceSpan { addr, len_bytes: 4096 };
    let internal = Err(IoError::Library(OpError::InternalError));
    assert_eq!(registered.read(span, 0), internal);
    assert_eq!(registered.write(span, 0), internal);
    assert_eq!(registered.read(DeviceSpan { addr, len_bytes: 0 }, 0), internal);
}

// ----------------------------------------------------------------------------------------
// The safe API
// ----------------------------------------------------------------------------------------

#[test]
fn api_types_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<HipFile>();
    check::<RegisteredFile<'static>>();
    check::<RegisteredDeviceBuffer>();
    check::<DeviceSpan>();
}

#[test]
fn api_write_then_read_round_trip_and_drops_deregister() {
    let file = TempFile::new(&ext4_dir(), &pattern(2 * MIB, 18));
    let client = file.open_rw();
    let (driver, device) = driver();
    let hipfile = HipFile::open(Arc::clone(&driver));
    assert_eq!(driver.use_count(), 1);
    let registered = hipfile.register_file(&client).unwrap();
    let id = registered.id();
    assert!(driver.file(id).is_ok());

    let len = MIB + 4097;
    let source = DeviceSpan { addr: device.malloc_device(0, len).unwrap(), len_bytes: len as u64 };
    let target = DeviceSpan { addr: device.malloc_device(0, len).unwrap(), len_bytes: len as u64 };
    let buffer = hipfile.register_buffer(target).unwrap();
    assert_eq!(buffer.span(), target);
    let data = pattern(len, 19);
    fill_device(source.addr, &data);
    assert_eq!(registered.write(source, 4095), Ok(len));
    assert_eq!(registered.read(target, 4095), Ok(len));
    assert!(device_bytes(target.addr, len) == data);
    assert!(file.contents()[4095..4095 + len] == data);
    let counters = registered.counters();
    assert_eq!((counters.read_bytes(), counters.written_bytes()), (len as u64, len as u64));
    // Short at EOF, 0 after it; offsets beyond i64 are invalid.
    assert_eq!(registered.read(target, 2 * MIB as u64 - 10), Ok(10));
    assert_eq!(registered.read(target, 4 * MIB as u64), Ok(0));
    let invalid = Err(IoError::Library(OpError::InvalidValue));
    assert_eq!(registered.read(target, u64::MAX), invalid);

    drop(buffer);
    assert_eq!(driver.buf_deregister(target.addr), Err(Error::new(OpError::MemoryNotRegistered)));
    drop(registered);
    assert_eq!(driver.file(id).err(), Some(Error::new(OpError::HandleNotRegistered)));
    assert_eq!(driver.use_count(), 1);
    let second = hipfile.clone();
    assert_eq!(driver.use_count(), 2);
    drop(second);
    drop(hipfile);
    assert_eq!(driver.use_count(), 0);
}

#[test]
fn api_registration_errors() {
    let file = TempFile::new(&tmpfs_dir(), &pattern(4096, 20));
    let client = file.open_rw();
    let (driver, device) = driver();
    let hipfile = HipFile::open(Arc::clone(&driver));
    let registered = hipfile.register_file(&client).unwrap();
    let duplicate = hipfile.register_file(&client).map(|r| r.id());
    assert_eq!(duplicate, Err(Error::new(OpError::HandleAlreadyRegistered)));
    let directory = File::open(tmpfs_dir()).unwrap();
    let not_a_file = hipfile.register_file(&directory).map(|r| r.id());
    assert_eq!(not_a_file, Err(Error::new(OpError::IONotSupported)));

    let addr = device.malloc_device(0, 8192).unwrap();
    let host = device.malloc_host(8192).unwrap();
    let span = |addr, len_bytes| DeviceSpan { addr, len_bytes };
    let register = |s| hipfile.register_buffer(s).map(|b| b.span());
    assert_eq!(register(span(0, 8)), Err(Error::new(OpError::InvalidValue)));
    assert_eq!(register(span(host.device_addr, 8)), Err(Error::new(OpError::HipMemoryTypeInvalid)));
    assert_eq!(register(span(addr, 8193)), Err(Error::new(OpError::HipPointerRangeError)));
    let buffer = hipfile.register_buffer(span(addr, 8192)).unwrap();
    assert_eq!(register(span(addr, 8192)), Err(Error::new(OpError::MemoryAlreadyRegistered)));
    assert_eq!(buffer.deregister(), Ok(()));
    drop(registered);
}

/// `RegisteredDeviceBuffer::deregister` reports 5030 while a read uses the buffer; the
/// registration then stays until it can be removed.
#[test]
fn api_buffer_deregister_in_use_reports_5030() {
    let len = 4 * MIB;
    let data = pattern(len, 21);
    let file = TempFile::new(&tmpfs_dir(), &data);
    let client = file.open_rw();
    let (driver, device) = driver_with(config(&[0]));
    let hipfile = HipFile::open(Arc::clone(&driver));
    let registered = hipfile.register_file(&client).unwrap();
    let span = DeviceSpan { addr: device.malloc_device(0, len).unwrap(), len_bytes: len as u64 };
    let small = DeviceSpan { addr: span.addr, len_bytes: 4096 };
    let buffer = hipfile.register_buffer(span).unwrap();
    assert_eq!(registered.read(small, 0), Ok(4096));
    let file_handle = driver.file(registered.id()).unwrap();

    // The first read's op may still be finishing on the executor after it returned.
    eventually("first read drained", || file_handle.ops_in_flight() == 0);
    let gates = gate_streams(&device);
    assert!(!gates.is_empty(), "found no stream of the device to gate");
    thread::scope(|scope| {
        let reader = scope.spawn(|| registered.read(span, 0));
        eventually("read in flight", || file_handle.ops_in_flight() > 0);
        assert_eq!(buffer.deregister(), Err(Error::new(OpError::InternalError)));
        drop(gates);
        assert_eq!(reader.join().unwrap(), Ok(len));
    });
    assert!(device_bytes(span.addr, len) == data);
    // Still registered: the failed deregistration left it in place.
    assert_eq!(driver.buf_deregister(span.addr), Ok(()));
}

/// A driver closed behind the API's back (a direct `Driver::close` to 0) clears the
/// registrations: I/O then fails cleanly and the drops have nothing left to undo.
#[test]
fn api_survives_a_driver_closed_behind_its_back() {
    let file = TempFile::new(&tmpfs_dir(), &pattern(8192, 22));
    let client = file.open_rw();
    let (driver, device) = driver();
    let hipfile = HipFile::open(Arc::clone(&driver));
    let registered = hipfile.register_file(&client).unwrap();
    let span = DeviceSpan { addr: device.malloc_device(0, 8192).unwrap(), len_bytes: 4096 };
    let buffer = hipfile.register_buffer(span).unwrap();
    driver.close().unwrap();
    assert_eq!(registered.read(span, 0), Err(IoError::DriverClosed));
    let reopened = HipFile::open(Arc::clone(&driver));
    assert_eq!(registered.read(span, 0), Err(IoError::Library(OpError::HandleNotRegistered)));
    // A new registration of the same descriptor is not disturbed by the stale drops.
    drop(registered);
    let fresh = reopened.register_file(&client).unwrap();
    assert_eq!(buffer.deregister(), Err(Error::new(OpError::MemoryNotRegistered)));
    assert_eq!(fresh.read(span, 0), Ok(4096));
    drop(fresh);
    drop(reopened);
    assert_eq!(driver.use_count(), 0);
    // The first HipFile's close finds the count at 0 and does nothing.
    drop(hipfile);
    assert_eq!(driver.use_count(), 0);
}

#[test]
fn api_from_env_opens_the_global_driver() {
    let hipfile = HipFile::from_env().unwrap();
    let count = hipfile.driver().use_count();
    assert!(count >= 1);
    let same = HipFile::from_env().unwrap();
    assert!(Arc::ptr_eq(hipfile.driver(), same.driver()));
    assert_eq!(same.driver().use_count(), count + 1);
    drop(same);
    assert_eq!(hipfile.driver().use_count(), count);
}

/// Requests of at most one chunk run on the caller's thread (`pread`/`pwrite` + one
/// device copy, no executor hand-off); larger ones go to the executors. Both keep the
/// O_DIRECT choice of the engine: aligned requests direct, unaligned ones buffered.
#[test]
fn requests_of_one_chunk_run_on_the_callers_thread() {
    let data = pattern(4 * MIB, 15);
    let file = TempFile::new(&ext4_dir(), &data);
    file.uncache();
    let client = file.open_rw();
    let (driver, device) = driver();
    let handle = driver.handle_register(client.as_raw_fd()).unwrap();
    let buf = device.malloc_device(0, 2 * MIB).unwrap();
    let engine = driver.engine().unwrap();
    let on_caller = || engine.stats().caller_thread_requests;
    let jobs = || engine.stats().jobs;
    let (caller_before, jobs_before) = (on_caller(), jobs());
    assert_eq!(driver.io_sync(Direction::Read, handle, buf, raw(CHUNK, 4096, 0)), Ok(CHUNK));
    assert!(device_bytes(buf, CHUNK) == data[4096..4096 + CHUNK]);
    assert_eq!(driver.io_sync(Direction::Read, handle, buf, raw(7, 3, 5)), Ok(7));
    assert!(device_bytes(buf + 5, 7) == data[3..10]);
    assert_eq!((on_caller() - caller_before, jobs() - jobs_before), (2, 0), "no executor job");
    // One byte more than a chunk: the executors.
    assert_eq!(driver.io_sync(Direction::Read, handle, buf, raw(CHUNK + 1, 0, 0)), Ok(CHUNK + 1));
    assert_eq!(on_caller() - caller_before, 2);
    // A job counts itself just after it reports: wait for the count.
    eventually("larger requests are executor jobs", || jobs() > jobs_before);
    // Writes, then read back through the file.
    let new_data = pattern(CHUNK, 16);
    fill_device(buf, &new_data);
    assert_eq!(driver.io_sync(Direction::Write, handle, buf, raw(CHUNK, MIB, 0)), Ok(CHUNK));
    assert_eq!(driver.io_sync(Direction::Write, handle, buf, raw(100, 2 * MIB + 1, 0)), Ok(100));
    assert_eq!(on_caller() - caller_before, 4);
    let contents = file.contents();
    assert!(contents[MIB..MIB + CHUNK] == new_data[..]);
    assert!(contents[2 * MIB + 1..2 * MIB + 101] == new_data[..100]);
    // Short count at the end of the file.
    let end = data.len();
    assert_eq!(driver.io_sync(Direction::Read, handle, buf, raw(4096, end - 10, 0)), Ok(10));
    assert_eq!(driver.io_sync(Direction::Read, handle, buf, raw(4096, end, 0)), Ok(0));
    if direct_alignment(&driver, handle).is_some() {
        let counters = counters(&driver, handle);
        // Aligned: the two CHUNK reads' worth read direct and the CHUNK write written
        // direct; the 7-byte read, the 100-byte write and the tail reads buffered.
        assert!(counters.direct_read_bytes >= 2 * CHUNK as u64, "{counters:?}");
        assert_eq!(counters.direct_written_bytes, CHUNK as u64, "{counters:?}");
        assert_eq!(counters.buffered_written_bytes, 100, "{counters:?}");
    }
    driver.handle_deregister(handle);
}
