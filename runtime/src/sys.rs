//! Small fenced wrappers over Linux calls that have no safe std equivalent.

use std::io;

/// Raises the soft RLIMIT_MEMLOCK to the hard limit and returns the new soft limit in
/// bytes (`u64::MAX` for unlimited).
///
/// # Errors
/// `getrlimit`/`setrlimit` failed.
pub(crate) fn raise_memlock_to_hard_limit() -> io::Result<u64> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `limit` is a valid, writable rlimit struct for the duration of the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit { rlim_cur: limit.rlim_max, rlim_max: limit.rlim_max };
        // SAFETY: `raised` is a valid rlimit struct; setrlimit only reads it.
        if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &raised) } == 0 {
            limit = raised;
        }
    }
    Ok(if limit.rlim_cur == libc::RLIM_INFINITY { u64::MAX } else { limit.rlim_cur })
}

/// `true` when the process has CAP_IPC_LOCK in its effective set (memory locking is
/// then not limited by RLIMIT_MEMLOCK).
pub(crate) fn has_ipc_lock_capability() -> bool {
    const CAP_IPC_LOCK: u32 = 14;
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return false;
    };
    status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
}

/// Clears O_DIRECT on a descriptor (glommio opens every `DmaFile` with it; our buffered
/// twin must not have it).
///
/// # Errors
/// `fcntl` failed.
pub(crate) fn clear_o_direct(fd: std::os::fd::RawFd) -> io::Result<()> {
    // SAFETY: F_GETFL takes no argument and only reads the descriptor's flags; an invalid
    // fd yields -1/EBADF, handled below.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: F_SETFL with an int argument changes only the file status flags of `fd`.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_DIRECT) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Copies `len_bytes` between two raw addresses.
///
/// # Safety
/// `source` is readable and `target` writable for `len_bytes`, and the ranges do not
/// overlap.
pub(crate) unsafe fn copy_bytes(target: *mut u8, source: *const u8, len_bytes: usize) {
    // SAFETY: the caller guarantees validity and non-overlap.
    unsafe { std::ptr::copy_nonoverlapping(source, target, len_bytes) };
}

/// The system page size in bytes (4096 when sysconf cannot tell).
pub(crate) fn page_size_bytes() -> u64 {
    // SAFETY: sysconf takes a constant name and has no memory effects.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).ok().filter(|s| s.is_power_of_two()).unwrap_or(4096)
}

/// Physical memory in bytes (`_SC_PHYS_PAGES` × page size), if the system says.
pub(crate) fn physical_memory_bytes() -> Option<u64> {
    // SAFETY: sysconf takes a constant name and has no memory effects.
    let pages = unsafe { libc::sysconf(libc::_SC_PHYS_PAGES) };
    u64::try_from(pages).ok().filter(|&pages| pages > 0)?.checked_mul(page_size_bytes())
}

/// Sets the calling thread's timer slack (how late the kernel may wake a sleeping thread)
/// to `slack_ns`; the default 50 µs would dominate short polling sleeps. Best effort.
pub(crate) fn set_thread_timer_slack_ns(slack_ns: u64) {
    // SAFETY: PR_SET_TIMERSLACK takes an unsigned long by value and only changes this
    // thread's slack; a failure leaves the default, which is harmless.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, slack_ns as libc::c_ulong) };
}

/// Whether this process may create an io_uring: sets one up (4 entries) and closes it.
/// Fails as the kernel answers (EPERM under a seccomp profile that blocks io_uring,
/// ENOSYS without io_uring, ENOMEM under a tiny memlock limit on older kernels).
pub(crate) fn probe_io_uring() -> io::Result<()> {
    // struct io_uring_params is 120 bytes; zeroed asks for the defaults.
    let mut params = [0u8; 120];
    // SAFETY: io_uring_setup(entries, params) with a valid, writable 120-byte params
    // struct; the returned descriptor (if any) is closed below.
    let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 4u32, params.as_mut_ptr()) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor we own.
    unsafe { libc::close(fd as libc::c_int) };
    Ok(())
}
