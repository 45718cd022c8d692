//! The driver rows of behaviour.md §5.2 (D1–D27) and the rules of §3.1–§3.4, one test
//! per row, on the `cpu` device.
//!
//! Rows that do not apply to a [`Driver`] (they are C-API concerns) are not here:
//! - D3 (`HandleRegister` with a NULL handle or descriptor pointer): NULL pointers do
//!   not exist below the C API; the Rust analogue, a failed registration leaving the
//!   count at 0, is D7.
//! - D8 (descriptor types Win32 / UserspaceFS → 5008): the type field exists only in the
//!   C descriptor; the driver takes an OpaqueFD.
//! - D27 (`GetVersion`): a C entry point with no driver state.
//!
//! Each test builds its own [`Driver`] (drivers are independent instances), with one or
//! two executors and small staging. Files live in `std::env::temp_dir()` (ext4 here:
//! the O_DIRECT path) or `/dev/shm` (tmpfs: the buffered path).

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use hipfile_core::{Direction, OpError};
use hipfile_runtime::device::DeviceError;
use hipfile_runtime::{Error, HandleId, IoError};

#[allow(unused_imports, reason = "not every helper is used by every file")]
use hipfile_test_support::cpu_rig::*;
use hipfile_test_support::raw;

// ----------------------------------------------------------------------------------------
// Helpers
// ----------------------------------------------------------------------------------------

fn err(code: OpError) -> Error {
    Error::new(code)
}

// ----------------------------------------------------------------------------------------
// §3.4 Driver lifecycle
// ----------------------------------------------------------------------------------------

#[test]
fn d1_open_n_times_then_close_n_times_counts() {
    let (driver, _device) = driver();
    assert_eq!(driver.use_count(), 0);
    for n in 1..=5 {
        driver.open();
        assert_eq!(driver.use_count(), n);
    }
    for n in (0..5).rev() {
        assert_eq!(driver.close(), Ok(()));
        assert_eq!(driver.use_count(), n);
    }
    assert!(!driver.is_open());
}

#[test]
fn d2_close_at_zero_is_5001() {
    let (driver, _device) = driver();
    assert_eq!(driver.close(), Err(err(OpError::DriverNotInitialized)));
    assert_eq!(driver.use_count(), 0);
    driver.open();
    driver.close().unwrap();
    assert_eq!(driver.close(), Err(err(OpError::DriverNotInitialized)));
    assert_eq!(driver.use_count(), 0);
}

#[test]
fn implicit_open_rules_which_calls_open_the_driver() {
    let file = TempFile::new(&tmpfs_dir(), &pattern(8192, 1));
    let client = file.open_rw();
    let (driver, device) = driver();
    let buf = device.malloc_device(0, 8192).unwrap();

    // Do not open: sync I/O, handle deregister, buffer deregister, starting the engine,
    // a failed handle registration.
    let read = driver.io_sync(Direction::Read, HandleId(1), buf, raw(4096, 0, 0));
    assert_eq!(read, Err(IoError::DriverClosed));
    let write = driver.io_sync(Direction::Write, HandleId(1), buf, raw(4096, 0, 0));
    assert_eq!(write, Err(IoError::DriverClosed));
    driver.handle_deregister(HandleId(1));
    assert_eq!(driver.buf_deregister(buf), Err(err(OpError::DriverClosing)));
    driver.engine().unwrap();
    assert!(driver.handle_register(-1).is_err());
    assert_eq!(driver.use_count(), 0);

    // Opens 0 → 1: a successful handle registration.
    let handle = driver.handle_register(client.as_raw_fd()).unwrap();
    assert_eq!(driver.use_count(), 1);
    // A duplicate leaves an open driver as it is (it only opens a closed one, which
    // cannot hold a registration: closing to 0 clears them).
    let duplicate = driver.handle_register(client.as_raw_fd());
    assert_eq!(duplicate, Err(err(OpError::HandleAlreadyRegistered)));
    assert_eq!(driver.use_count(), 1);
    driver.handle_deregister(handle);
    driver.close().unwrap();
    assert_eq!(driver.use_count(), 0);

    // Opens 0 → 1: a successful buffer registration, and a failing one.
    driver.buf_register(buf, 8192, 0).unwrap();
    assert_eq!(driver.use_count(), 1);
    driver.close().unwrap();
    assert_eq!(driver.buf_register(0, 4096, 0), Err(err(OpError::InvalidValue)));
    assert_eq!(driver.use_count(), 1);

    // Implicit opens never raise a count above 1.
    driver.open();
    driver.open();
    assert_eq!(driver.buf_register(buf, 8192, 0), Ok(()));
    let handle = driver.handle_register(client.as_raw_fd()).unwrap();
    assert_eq!(driver.use_count(), 3);
    driver.handle_deregister(handle);
}

#[test]
fn close_at_zero_clears_files_and_buffers_engine_keeps_working() {
    let data = pattern(3 * MIB, 2);
    let file = TempFile::new(&tmpfs_dir(), &data);
    let client = file.open_rw();
    let (driver, device) = driver();
    let buf = device.malloc_device(0, 3 * MIB).unwrap();

    let handle = driver.handle_register(client.as_raw_fd()).unwrap();
    driver.buf_register(buf, 3 * MIB as u64, 0).unwrap();
    let n = driver.io_sync(Direction::Read, handle, buf, raw(3 * MIB, 0, 0)).unwrap();
    assert_eq!(n, 3 * MIB);
    let jobs = || driver.engine().unwrap().stats().jobs;
    // A job counts itself just after it reports: wait for the count.
    eventually("the read's jobs counted", || jobs() > 0);
    let jobs_before = jobs();
    let file_handle = driver.file(handle).unwrap();

    driver.open();
    driver.close().unwrap();
    // Count 2 → 1: nothing cleared.
    assert!(driver.file(handle).is_ok());
    driver.close().unwrap();
    // Count 1 → 0: files and buffers are gone.
    assert_eq!(driver.use_count(), 0);
    assert_eq!(driver.file(handle).err(), Some(err(OpError::HandleNotRegistered)));
    assert!(file_handle.is_deregistered());
    driver.open();
    assert_eq!(
        driver.io_sync(Direction::Read, handle, buf, raw(4096, 0, 0)),
        Err(IoError::Library(OpError::HandleNotRegistered))
    );
    assert_eq!(driver.buf_deregister(buf), Err(err(OpError::MemoryNotRegistered)));

    // Everything can be registered again and the same engine keeps working.
    let handle = driver.handle_register(client.as_raw_fd()).unwrap();
    driver.buf_register(buf, 3 * MIB as u64, 0).unwrap();
    let n = driver.io_sync(Direction::Read, handle, buf, raw(3 * MIB, 0, 0)).unwrap();
    assert_eq!(n, 3 * MIB);
    assert!(device_bytes(buf, 3 * MIB) == data, "data after re-registration");
    eventually("the same engine's jobs", || jobs() > jobs_before);
    driver.buf_deregister(buf).unwrap();
    driver.handle_deregister(handle);
}

// ----------------------------------------------------------------------------------------
// §3.2 Handle registration
// ----------------------------------------------------------------------------------------

#[test]
fn d4_handle_register_sets_count_1_then_open_2() {
    let file = TempFile::new(&ext4_dir(), &pattern(4096, 3));
    let client = file.open_rw();
    let (driver, _device) = driver();
    let handle = driver.handle_register(client.as_raw_fd()).unwrap();
    assert_ne!(handle, HandleId(0));
    assert_eq!(driver.use_count(), 1);
    driver.open();
    assert_eq!(driver.use_count(), 2);
    driver.handle_deregister(handle);
    assert_eq!(driver.use_count(), 2);
}

#[test]
fn d5_64_threads_register_distinct_fds_all_succeed_count_1() {
    const THREADS: usize = 64;
    let files: Vec<TempFile> =
        (0..THREADS).map(|i| TempFile::new(&tmpfs_dir(), &pattern(4096, i as u64))).collect();
    let clients: Vec<File> = files.iter().map(TempFile::open_rw).collect();
    let (driver, _device) = driver();
    let barrier = Barrier::new(THREADS);
    let handles: Vec<Result<HandleId, Error>> = thread::scope(|scope| {
        let workers: Vec<_> = clients
            .iter()
            .map(|client| {
                let (driver, barrier) = (&driver, &barrier);
                scope.spawn(move || {
                    barrier.wait();
                    driver.handle_register(client.as_raw_fd())
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let ids: Vec<HandleId> = handles.into_iter().map(|h| h.expect("registration")).collect();
    let mut unique = ids.clone();
    unique.sort_by_key(|id| id.0);
    unique.dedup();
    assert_eq!(unique.len(), THREADS, "handles are distinct");
    assert_eq!(driver.use_count(), 1);
    for (id, client) in ids.iter().zip(&clients) {
        assert_eq!(driver.file(*id).unwrap().client_fd(), client.as_raw_fd());
    }
    for id in ids {
        driver.handle_deregister(id);
    }
}

#[test]
fn d6_register_same_fd_twice_5028_then_after_close_ok() {
    let file = TempFile::new(&ext4_dir(), &pattern(4096, 4));
    let client = file.open_rw();
    let (driver, _device) = driver();
    let first = driver.handle_register(client.as_raw_fd()).unwrap();
    assert_eq!(
        driver.handle_register(client.as_raw_fd()),
        Err(err(OpError::HandleAlreadyRegistered))
    );
    assert_eq!(driver.use_count(), 1);
    assert!(driver.file(first).is_ok(), "the first registration is intact");
    driver.close().unwrap();
    assert_eq!(driver.file(first).err(), Some(err(OpError::HandleNotRegistered)));
    let again = driver.handle_register(client.as_raw_fd()).unwrap();
    assert_eq!(driver.use_count(), 1);
    driver.handle_deregister(again);
}

#[test]
fn d7_register_bad_fd_errors_and_count_stays_0() {
    let (driver, _device) = driver();
    // Negative, and a number far above any open descriptor.
    assert_eq!(driver.handle_register(-1), Err(err(OpError::InternalError)));
    assert_eq!(driver.handle_register(i32::MAX), Err(err(OpError::InternalError)));
    // Open, but not a regular file or block device.
    let dir = File::open(tmpfs_dir()).unwrap();
    assert_eq!(driver.handle_register(dir.as_raw_fd()), Err(err(OpError::IONotSupported)));
    let (reader, writer) = std::io::pipe().unwrap();
    assert_eq!(driver.handle_register(reader.as_raw_fd()), Err(err(OpError::IONotSupported)));
    assert_eq!(driver.handle_register(writer.as_raw_fd()), Err(err(OpError::IONotSupported)));
    assert_eq!(driver.use_count(), 0);
}

#[test]
fn d9_handle_deregister_null_garbage_or_closed_is_ignored() {
    let file = TempFile::new(&tmpfs_dir(), &pattern(4096, 5));
    let client = file.open_rw();
    let (driver, _device) = driver();
    // Closed driver.
    driver.handle_deregister(HandleId(0));
    driver.handle_deregister(HandleId(0xdead_beef));
    assert_eq!(driver.use_count(), 0);
    // Open driver with a registration that must survive.
    let handle = driver.handle_register(client.as_raw_fd()).unwrap();
    driver.handle_deregister(HandleId(0));
    driver.handle_deregister(HandleId(0xdead_beef));
    driver.handle_deregister(HandleId(handle.0 + 1));
    assert_eq!(driver.use_count(), 1);
    assert!(driver.file(handle).is_ok());
    // Deregistering twice is ignored too.
    driver.handle_deregister(handle);
    driver.handle_deregister(handle);
    assert_eq!(driver.use_count(), 1);
    assert!(driver.file(handle).is_err());
}

// ----------------------------------------------------------------------------------------
// §3.3 Buffer registration
// ----------------------------------------------------------------------------------------

#[test]
fn d10_buf_register_null_5022_and_count_becomes_1() {
    let (driver, _device) = driver();
    assert_eq!(driver.buf_register(0, 4096, 0), Err(err(OpError::InvalidValue)));
    assert_eq!(driver.use_count(), 1);
}

#[test]
fn d11_buf_register_device_memory_and_interior_pointer_succeed() {
    let (driver, device) = driver();
    let buf = device.malloc_device(0, 64 * KIB).unwrap();
    assert_eq!(driver.buf_register(buf, 64 * KIB as u64, 0), Ok(()));
    // An interior pointer with an in-range length is a separate registration.
    assert_eq!(driver.buf_register(buf + 4096, 60 * KIB as u64, 0), Ok(()));
    // Length 0 is allowed; flags are ignored.
    assert_eq!(driver.buf_register(buf + 8192, 0, 0x7f), Ok(()));
    assert_eq!(driver.use_count(), 1);
    for addr in [buf, buf + 4096, buf + 8192] {
        assert_eq!(driver.buf_deregister(addr), Ok(()));
    }
}

#[test]
fn d12_buf_register_oversize_interior_oversize_or_u64_max_5014() {
    let (driver, device) = driver();
    let len = 64 * KIB as u64;
    let buf = device.malloc_device(0, 64 * KIB).unwrap();
    let range_error = Err(err(OpError::HipPointerRangeError));
    assert_eq!(driver.buf_register(buf, len + 1, 0), range_error);
    assert_eq!(driver.buf_register(buf + 4096, len - 4095, 0), range_error);
    assert_eq!(driver.buf_register(buf, u64::MAX, 0), range_error);
    assert_eq!(driver.buf_register(buf + 1, u64::MAX, 0), range_error);
    // Nothing got registered.
    assert_eq!(driver.buf_deregister(buf), Err(err(OpError::MemoryNotRegistered)));
}

#[test]
fn d13_register_same_buffer_twice_5023_close_clears_then_ok() {
    let (driver, device) = driver();
    let buf = device.malloc_device(0, 64 * KIB).unwrap();
    driver.buf_register(buf, 4096, 0).unwrap();
    assert_eq!(driver.buf_register(buf, 4096, 0), Err(err(OpError::MemoryAlreadyRegistered)));
    // Even with another length.
    assert_eq!(driver.buf_register(buf, 8192, 0), Err(err(OpError::MemoryAlreadyRegistered)));
    driver.close().unwrap();
    assert_eq!(driver.use_count(), 0);
    assert_eq!(driver.buf_register(buf, 4096, 0), Ok(()));
    assert_eq!(driver.use_count(), 1);
    driver.buf_deregister(buf).unwrap();
}

#[test]
fn d14_64_threads_register_buffers_count_1() {
    const THREADS: usize = 64;
    let (driver, device) = driver();
    let buffers: Vec<u64> = (0..THREADS).map(|_| device.malloc_device(0, 4096).unwrap()).collect();
    let barrier = Barrier::new(THREADS);
    let results: Vec<Result<(), Error>> = thread::scope(|scope| {
        let workers: Vec<_> = buffers
            .iter()
            .map(|&buf| {
                let (driver, barrier) = (&driver, &barrier);
                scope.spawn(move || {
                    barrier.wait();
                    driver.buf_register(buf, 4096, 0)
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(driver.use_count(), 1);
    for buf in buffers {
        assert_eq!(driver.buf_deregister(buf), Ok(()));
    }
}

#[test]
fn d15_buf_deregister_with_driver_closed_5006() {
    let (driver, device) = driver();
    let buf = device.malloc_device(0, 4096).unwrap();
    assert_eq!(driver.buf_deregister(buf), Err(err(OpError::DriverClosing)));
    driver.buf_register(buf, 4096, 0).unwrap();
    driver.close().unwrap();
    assert_eq!(driver.buf_deregister(buf), Err(err(OpError::DriverClosing)));
    assert_eq!(driver.buf_deregister(0), Err(err(OpError::DriverClosing)));
    assert_eq!(driver.use_count(), 0);
}

#[test]
fn d16_buf_deregister_unregistered_5024() {
    let (driver, device) = driver();
    let buf = device.malloc_device(0, 8192).unwrap();
    driver.open();
    assert_eq!(driver.buf_deregister(buf), Err(err(OpError::MemoryNotRegistered)));
    // An interior pointer of a registered buffer is not the registration.
    driver.buf_register(buf, 8192, 0).unwrap();
    assert_eq!(driver.buf_deregister(buf + 4096), Err(err(OpError::MemoryNotRegistered)));
    assert_eq!(driver.buf_deregister(buf), Ok(()));
    assert_eq!(driver.buf_deregister(buf), Err(err(OpError::MemoryNotRegistered)));
}

/// D17, deterministic: the device copies of the read are held by gates on the device's
/// streams, so the read is in flight for as long as the test wants.
#[test]
fn d17_buf_deregister_while_read_in_flight_5030_deterministic() {
    let t = ReadInFlight::new(8 * MIB, 17);
    t.hold(|_| {
        for _ in 0..3 {
            assert_eq!(t.driver.buf_deregister(t.buf), Err(err(OpError::InternalError)));
            thread::sleep(Duration::from_millis(2));
        }
    });
    assert_eq!(t.driver.buf_deregister(t.buf), Ok(()));
    t.driver.handle_deregister(t.handle);
}

/// D17 as hipFile's test does it: a large read on another thread, deregistration retried
/// until it succeeds. 5030 must have been seen when the attempt clearly overlapped the
/// read (the read finished well after the first attempt returned).
#[test]
fn d17_buf_deregister_while_read_in_flight_5030_racing() {
    let len = 64 * MIB;
    let data = pattern(len, 170);
    let file = TempFile::new(&tmpfs_dir(), &data);
    let client = file.open_rw();
    let (driver, device) = driver();
    let handle = driver.handle_register(client.as_raw_fd()).unwrap();
    let buf = device.malloc_device(0, len).unwrap();
    driver.buf_register(buf, len as u64, 0).unwrap();
    let file_handle = driver.file(handle).unwrap();

    let (busy, first_attempt_end, read_end) = thread::scope(|scope| {
        let reader = scope.spawn(|| {
            let result = driver.io_sync(Direction::Read, handle, buf, raw(len, 0, 0));
            (result, Instant::now())
        });
        eventually("read started", || file_handle.ops_in_flight() > 0 || reader.is_finished());
        let mut busy = 0;
        let mut first_attempt_end = None;
        loop {
            let result = driver.buf_deregister(buf);
            first_attempt_end.get_or_insert_with(Instant::now);
            match result {
                Ok(()) => break,
                Err(e) if e == err(OpError::InternalError) => busy += 1,
                Err(other) => panic!("unexpected deregistration error {other:?}"),
            }
        }
        let (result, read_end) = reader.join().unwrap();
        assert_eq!(result, Ok(len));
        (busy, first_attempt_end.unwrap(), read_end)
    });
    assert!(device_bytes(buf, len) == data, "data of the read");
    if read_end > first_attempt_end + Duration::from_millis(20) {
        assert!(busy > 0, "deregistration succeeded while the read was in flight");
    } else {
        eprintln!("d17 racing: the read did not overlap the first attempt; nothing to assert");
    }
    driver.handle_deregister(handle);
}

#[test]
fn d18_buf_register_host_managed_or_unregistered_memory_5013() {
    let (driver, device) = driver();
    let type_error = Err(err(OpError::HipMemoryTypeInvalid));
    let host = device.malloc_host(4096).unwrap();
    assert_eq!(driver.buf_register(host.device_addr, 4096, 0), type_error);
    let managed = device.malloc_managed(4096).unwrap();
    assert_eq!(driver.buf_register(managed, 4096, 0), type_error);
    let heap = vec![0u8; 4096];
    assert_eq!(driver.buf_register(heap.as_ptr() as u64, 4096, 0), type_error);
    // Array and unified memory do not exist on the cpu device.
    assert_eq!(driver.use_count(), 1);
}

// ----------------------------------------------------------------------------------------
// §3.1 Sync I/O
// ----------------------------------------------------------------------------------------

#[test]
fn d19_sync_io_with_driver_closed_minus1_einval_count_0() {
    let file = TempFile::new(&tmpfs_dir(), &pattern(8192, 19));
    let client = file.open_rw();
    let (driver, device) = driver();
    let buf = device.malloc_device(0, 8192).unwrap();
    // A handle that was registered, then cleared by the close.
    let handle = driver.handle_register(client.as_raw_fd()).unwrap();
    driver.close().unwrap();
    for direction in [Direction::Read, Direction::Write] {
        for id in [handle, HandleId(0)] {
            let result = driver.io_sync(direction, id, buf, raw(4096, 0, 0));
            assert_eq!(result, Err(IoError::DriverClosed));
            assert_eq!(result.unwrap_err().as_ssize(), (-1, Some(libc::EINVAL)));
        }
    }
    assert_eq!(driver.use_count(), 0);
}

fn d20_d21_on(dir: &Path) {
    let len = 256 * KIB;
    let data = pattern(len, 20);
    let file = TempFile::new(dir, &data);
    let client = file.open_rw();
    let (driver, device) = driver();
    let handle = driver.handle_register(client.as_raw_fd()).unwrap();
    let buf = device.malloc_device(0, len).unwrap();
    // D20: unregistered buffer, offset 4096, size = len − 4096.
    let n = driver.io_sync(Direction::Read, handle, buf, raw(len - 4096, 0, 4096)).unwrap();
    assert_eq!(n, len - 4096);
    assert!(device_bytes(buf + 4096, len - 4096) == data[..len - 4096], "data");
    assert!(device_bytes(buf, 4096).iter().all(|&b| b == 0), "bytes before the offset");
    // D21: size = len at offset 4096 runs past the buffer.
    let result = driver.io_sync(Direction::Read, handle, buf, raw(len, 0, 4096));
    assert_eq!(result, Err(IoError::Library(OpError::InvalidValue)));
    assert_eq!(result.unwrap_err().as_ssize(), (-5022, None));
    // The same with a registered buffer (shorter than its allocation).
    let registered_len = len - 8192;
    driver.buf_register(buf, registered_len as u64, 0).unwrap();
    let n =
        driver.io_sync(Direction::Read, handle, buf, raw(registered_len - 4096, 0, 4096)).unwrap();
    assert_eq!(n, registered_len - 4096);
    let result = driver.io_sync(Direction::Read, handle, buf, raw(registered_len, 0, 4096));
    assert_eq!(result, Err(IoError::Library(OpError::InvalidValue)));
    driver.buf_deregister(buf).unwrap();
    driver.handle_deregister(handle);
}

#[test]
fn d20_d21_unregistered_buffer_offset_4096_size_len_minus_4096_ok_len_5022_direct() {
    d20_d21_on(&ext4_dir());
}

#[test]
fn d20_d21_unregistered_buffer_offset_4096_size_len_minus_4096_ok_len_5022_buffered() {
    d20_d21_on(&tmpfs_dir());
}

#[test]
fn d22_sync_io_with_host_memory_5013() {
    let file = TempFile::new(&tmpfs_dir(), &pattern(8192, 22));
    let client = file.open_rw();
    let (driver, device) = driver();
    let handle = driver.handle_register(client.as_raw_fd()).unwrap();
    let host = device.malloc_host(8192).unwrap();
    let managed = device.malloc_managed(8192).unwrap();
    let heap = vec![0u8; 8192];
    for addr in [host.device_addr, managed, heap.as_ptr() as u64] {
        for direction in [Direction::Read, Direction::Write] {
            let result = driver.io_sync(direction, handle, addr, raw(4096, 0, 0));
            assert_eq!(result, Err(IoError::Library(OpError::HipMemoryTypeInvalid)));
            assert_eq!(result.unwrap_err().as_ssize(), (-5013, None));
        }
    }
    // A NULL buffer is 5022.
    let result = driver.io_sync(Direction::Read, handle, 0, raw(4096, 0, 0));
    assert_eq!(result, Err(IoError::Library(OpError::InvalidValue)));
    driver.handle_deregister(handle);
}

#[test]
fn d23_sync_io_with_unregistered_handle_5027() {
    let file = TempFile::new(&tmpfs_dir(), &pattern(8192, 23));
    let client = file.open_rw();
    let (driver, device) = driver();
    let buf = device.malloc_device(0, 8192).unwrap();
    let handle = driver.handle_register(client.as_raw_fd()).unwrap();
    driver.handle_deregister(handle);
    for id in [HandleId(0), HandleId(0xdead_beef), handle] {
        for direction in [Direction::Read, Direction::Write] {
            let result = driver.io_sync(direction, id, buf, raw(4096, 0, 0));
            assert_eq!(result, Err(IoError::Library(OpError::HandleNotRegistered)));
            assert_eq!(result.unwrap_err().as_ssize(), (-5027, None));
        }
    }
    // The handle check precedes the buffer check.
    let result = driver.io_sync(Direction::Read, HandleId(0), 0, raw(4096, 0, 0));
    assert_eq!(result, Err(IoError::Library(OpError::HandleNotRegistered)));
}

#[test]
fn d24_sync_io_errno_failure_minus1_with_errno() {
    let file = TempFile::new(&tmpfs_dir(), &pattern(8192, 24));
    let read_only = file.open_with(OpenOptions::new().read(true));
    let write_only = file.open_with(OpenOptions::new().write(true));
    let (driver, device) = driver();
    let buf = device.malloc_device(0, 8192).unwrap();
    let ro = driver.handle_register(read_only.as_raw_fd()).unwrap();
    let wo = driver.handle_register(write_only.as_raw_fd()).unwrap();
    let write = driver.io_sync(Direction::Write, ro, buf, raw(4096, 0, 0));
    let read = driver.io_sync(Direction::Read, wo, buf, raw(4096, 0, 0));
    let ebadf = Err(IoError::Os(libc::EBADF));
    assert_eq!((write, read), (ebadf, ebadf), "(write through O_RDONLY, read through O_WRONLY)");
    assert_eq!(write.unwrap_err().as_ssize(), (-1, Some(libc::EBADF)));
    driver.handle_deregister(ro);
    driver.handle_deregister(wo);
}

/// D25: the cpu device refuses copies into or out of memory it does not track. A buffer
/// registered and then freed keeps its registration (the driver does not look the
/// pointer up again), so the I/O reaches the device, whose copy fails with
/// hipErrorInvalidValue: an `IoError::Device` carrying it.
#[test]
fn d25_sync_io_with_device_error_minus_hip_error() {
    let file = TempFile::new(&tmpfs_dir(), &pattern(64 * KIB, 25));
    let client = file.open_rw();
    let (driver, device) = driver();
    let handle = driver.handle_register(client.as_raw_fd()).unwrap();
    let buf = device.malloc_device(0, 64 * KIB).unwrap();
    driver.buf_register(buf, 64 * KIB as u64, 0).unwrap();
    // SAFETY: no reference into the allocation exists and no I/O on it is in flight;
    // later copies naming it are refused by the device, never performed.
    unsafe { device.free_device(buf) }.unwrap();
    for direction in [Direction::Read, Direction::Write] {
        let result = driver.io_sync(direction, handle, buf, raw(64 * KIB, 0, 0));
        match result {
            Err(IoError::Device(error)) => {
                assert_eq!(error.hip_error, DeviceError::HIP_ERROR_INVALID_VALUE);
                // hipErrorInvalidValue = 1 gives −1, as in hipFile.
                assert_eq!(result.unwrap_err().as_ssize(), (-1, None));
            }
            other => panic!("{direction:?}: expected a device error, got {other:?}"),
        }
    }
    driver.buf_deregister(buf).unwrap();
    driver.handle_deregister(handle);
}

#[test]
fn d26_sync_io_no_backend_accepts_5030() {
    let file = TempFile::new(&tmpfs_dir(), &pattern(8192, 26));
    let client = file.open_rw();
    let mut config = config(&[0, 1]);
    config.allow_compat_mode = false;
    let (driver, device) = driver_with(config);
    let handle = driver.handle_register(client.as_raw_fd()).unwrap();
    let buf = device.malloc_device(0, 8192).unwrap();
    for direction in [Direction::Read, Direction::Write] {
        let result = driver.io_sync(direction, handle, buf, raw(4096, 0, 0));
        assert_eq!(result, Err(IoError::Library(OpError::InternalError)));
        assert_eq!(result.unwrap_err().as_ssize(), (-5030, None));
    }
    driver.handle_deregister(handle);
}
