//! A write that runs out of room partway (behaviour as `pwrite`): the bytes written are
//! reported as a short count; `-errno` only when none were. The file size limit
//! (`RLIMIT_FSIZE`, with SIGXFSZ ignored) makes the kernel refuse bytes past a given
//! offset exactly as a full disk refuses them (EFBIG instead of ENOSPC), in a child
//! process, since a limit cannot be raised again.

use std::os::fd::AsRawFd;
use std::time::Duration;

use hipfile_core::{Direction, RawIo};
use hipfile_test_support::rig::*;

const CHILD_VARIABLE: &str = "HIPFILE_WRITE_SHORT_CHILD";
const LIMIT_BYTES: usize = 6 * MIB;

fn limit_file_size(bytes: u64) {
    // SAFETY: ignoring SIGXFSZ (whose default ends the process) and setting a limit;
    // plain libc calls with valid arguments.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
        let limit = libc::rlimit { rlim_cur: bytes, rlim_max: bytes };
        assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &limit), 0, "setrlimit");
    }
}

fn writes_past_the_limit() {
    let file = TempFile::new("write-short", &[]);
    let rig = Rig::new();
    let handle = rig.driver.handle_register(file.open_rw().as_raw_fd()).expect("register");
    let buffer = rig.alloc(8 * MIB);
    let data = pattern(0x5407, 8 * MIB);
    rig.set_dev_bytes(buffer, &data);
    limit_file_size(LIMIT_BYTES as u64);
    // Sync: 8 MiB from offset 0 stops at the limit (several chunks, several executors).
    let raw = RawIo { size_bytes: (8 * MIB) as u64, file_offset_bytes: 0, buffer_offset_bytes: 0 };
    let written = rig.driver.io_sync(Direction::Write, handle, buffer, raw);
    println!("sync 8 MiB write under a 6 MiB limit: {written:?}");
    assert_eq!(written.expect("a short count, not an error"), LIMIT_BYTES);
    assert_bytes(&file.contents(), &data[..LIMIT_BYTES], "bytes in the file");
    // Nothing fits: the error.
    let raw = RawIo {
        size_bytes: MIB as u64,
        file_offset_bytes: LIMIT_BYTES as i64,
        buffer_offset_bytes: 0,
    };
    let refused = rig.driver.io_sync(Direction::Write, handle, buffer, raw);
    println!("sync write at the limit: {refused:?}");
    assert!(matches!(refused, Err(hipfile_runtime::IoError::Os(libc::EFBIG))), "{refused:?}");
    // Async: the same two, through a stream.
    std::fs::OpenOptions::new().write(true).open(&file.path).unwrap().set_len(0).unwrap();
    let stream = rig.stream();
    let short = params(8 * MIB, 0, 0);
    let none = params(MIB, (7 * MIB) as i64, 0);
    rig.write(handle, buffer, &short, stream);
    rig.write(handle, buffer, &none, stream);
    rig.sync(stream);
    println!("async: {} and {}", bytes(&short), bytes(&none));
    assert_eq!(bytes(&short), LIMIT_BYTES as isize, "async short count");
    assert_eq!(bytes(&none), -(libc::EFBIG as isize), "async: nothing written");
    assert_bytes(&file.contents(), &data[..LIMIT_BYTES], "bytes in the file (async)");
}

#[test]
fn a_write_that_runs_out_of_room_reports_the_bytes_written() {
    match std::env::var(CHILD_VARIABLE).as_deref() {
        Ok(_) => writes_past_the_limit(),
        Err(_) => run_in_child(
            "a_write_that_runs_out_of_room_reports_the_bytes_written",
            CHILD_VARIABLE,
            "fsize-6m",
            Duration::from_secs(60),
        ),
    }
}
