//! "Start anywhere" (DESIGN.md invariants): in a container that blocks io_uring
//! (seccomp: `io_uring_setup` → EPERM) or under a low `RLIMIT_MEMLOCK`, sync and async
//! I/O complete through a slower path or fail with a clear code; never a hang.
//!
//! Each case runs in a child process (this test binary re-run with one test selected and
//! `HIPFILE_START_ANYWHERE_CHILD` naming the restriction), because a seccomp filter or a
//! lowered limit cannot be taken back; the parent kills a child that has not finished in
//! 60 s and fails the case as a hang.

mod async_support;

use std::os::fd::AsRawFd;
use std::time::Duration;

use async_support::*;
use hipfile_core::{Direction, RawIo};
use hipfile_runtime::config::Config;

const CHILD_VARIABLE: &str = "HIPFILE_START_ANYWHERE_CHILD";
const CHILD_LIMIT: Duration = Duration::from_secs(60);

/// Blocks `io_uring_setup` (and the other io_uring calls) with EPERM for this process and
/// its threads, as Docker's default seccomp profile does.
fn block_io_uring() {
    // The filter: EPERM for io_uring_setup (425), io_uring_enter (426),
    // io_uring_register (427) on x86_64; allow everything else.
    const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
    const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
    let eperm = SECCOMP_RET_ERRNO | libc::EPERM as u32;
    let filter = [
        // A = seccomp_data.nr
        libc::sock_filter { code: 0x20, jt: 0, jf: 0, k: 0 },
        // if A == 425 / 426 / 427 goto deny
        libc::sock_filter { code: 0x15, jt: 3, jf: 0, k: 425 },
        libc::sock_filter { code: 0x15, jt: 2, jf: 0, k: 426 },
        libc::sock_filter { code: 0x15, jt: 1, jf: 0, k: 427 },
        libc::sock_filter { code: 0x06, jt: 0, jf: 0, k: SECCOMP_RET_ALLOW },
        libc::sock_filter { code: 0x06, jt: 0, jf: 0, k: eperm },
    ];
    let program = libc::sock_fprog { len: filter.len() as u16, filter: filter.as_ptr().cast_mut() };
    // SAFETY: prctl with documented arguments; `program` outlives the call (the kernel
    // copies the filter).
    unsafe {
        assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0, "no_new_privs");
        let installed = libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &program as *const libc::sock_fprog,
        );
        assert_eq!(installed, 0, "seccomp filter: {}", std::io::Error::last_os_error());
    }
}

/// Lowers `RLIMIT_MEMLOCK` (soft and hard) to `bytes`.
fn limit_memlock(bytes: u64) {
    let limit = libc::rlimit { rlim_cur: bytes, rlim_max: bytes };
    // SAFETY: a valid rlimit.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit) }, 0, "setrlimit");
}

/// Runs `test` in a child with restriction `what`; fails on a hang or a failed child.
fn in_child(test: &str, what: &str) {
    run_in_child(test, CHILD_VARIABLE, what, CHILD_LIMIT);
}

/// The child's work: 4 MiB and 4 KiB sync reads and writes and one async read, each
/// either right or failed with a clear error.
fn io_completes_or_fails_clearly() {
    let data = pattern(0xAB, 8 * MIB);
    let file = TempFile::new("start-anywhere", &data);
    let config = Config { ..small_config() };
    let rig = Rig::with(1, config);
    let handle = rig.driver.handle_register(file.open_rw().as_raw_fd()).expect("register");
    let buffer = rig.alloc(8 * MIB);
    for size in [4 * KIB, 4 * MIB] {
        let raw = RawIo { size_bytes: size as u64, file_offset_bytes: 0, buffer_offset_bytes: 0 };
        let read = rig.driver.io_sync(Direction::Read, handle, buffer, raw);
        println!("sync read of {size} B: {read:?}");
        assert_eq!(read.expect("sync read works without io_uring"), size);
        assert_bytes(&rig.dev_bytes(buffer, size), &data[..size], "sync read");
        let raw = RawIo {
            size_bytes: size as u64,
            file_offset_bytes: (4 * MIB) as i64,
            buffer_offset_bytes: 0,
        };
        let written = rig.driver.io_sync(Direction::Write, handle, buffer, raw);
        println!("sync write of {size} B: {written:?}");
        assert_eq!(written.expect("sync write works without io_uring"), size);
    }
    // Async: reads on a stream with every FIXED flag (they prefetch, and wait for the
    // stream before touching device memory) and on an unregistered stream, then a write.
    let fixed = rig.registered_stream(0xF);
    let plain = rig.stream();
    rig.set_dev_bytes(buffer, &vec![0; 8 * MIB]);
    let reads: Vec<_> = (0..4).map(|i| params(MIB, (i * MIB) as i64, (i * MIB) as i64)).collect();
    for (i, p) in reads.iter().enumerate() {
        rig.read(handle, buffer, p, if i % 2 == 0 { fixed } else { plain });
    }
    rig.sync(fixed);
    rig.sync(plain);
    for p in &reads {
        assert_eq!(bytes(p), MIB as isize, "async read works without io_uring");
    }
    assert_bytes(&rig.dev_bytes(buffer, 4 * MIB), &data[..4 * MIB], "async reads");
    let fresh = pattern(0xCD, MIB);
    rig.set_dev_bytes(buffer, &fresh);
    let write = params(MIB, (6 * MIB) as i64, 0);
    rig.write(handle, buffer, &write, plain);
    rig.sync(plain);
    assert_eq!(bytes(&write), MIB as isize, "async write works without io_uring");
    assert_bytes(&file.contents()[6 * MIB..7 * MIB], &fresh, "async write");
    println!("async reads and write: every byte right");
}

#[test]
fn io_works_where_io_uring_is_blocked() {
    match std::env::var(CHILD_VARIABLE).as_deref() {
        Ok("no-io-uring") => {
            block_io_uring();
            io_completes_or_fails_clearly();
        }
        Ok(_) => {}
        Err(_) => in_child("io_works_where_io_uring_is_blocked", "no-io-uring"),
    }
}

#[test]
fn io_works_under_a_64_kib_memlock_limit() {
    match std::env::var(CHILD_VARIABLE).as_deref() {
        Ok("memlock-64k") => {
            limit_memlock(64 << 10);
            io_completes_or_fails_clearly();
        }
        Ok(_) => {}
        Err(_) => in_child("io_works_under_a_64_kib_memlock_limit", "memlock-64k"),
    }
}
