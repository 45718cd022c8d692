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

/// `cachestat(2)`'s number (Linux 6.5+; the same in the generic and x86_64 tables).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
const SYS_CACHESTAT: libc::c_long = 451;

/// Whether `cachestat` answered before (1), failed with ENOSYS/EPERM (2) or is untried (0).
static CACHESTAT_STATE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Pages of `[offset_bytes, offset_bytes + len_bytes)` of `fd` that are in the page cache,
/// and the pages the range spans: `cachestat(2)` where the kernel has it (one call, no
/// mapping), else `mmap` + `mincore` (the fd must then be readable).
///
/// # Errors
/// Both ways failed (a write-only descriptor without `cachestat`, a range beyond what
/// can be mapped); callers take "not cached" then.
pub(crate) fn cached_pages(
    fd: std::os::fd::RawFd,
    offset_bytes: u64,
    len_bytes: u64,
) -> io::Result<(u64, u64)> {
    let page = page_size_bytes();
    let first = offset_bytes / page;
    let end = offset_bytes.checked_add(len_bytes).ok_or(io::ErrorKind::InvalidInput)?;
    let pages = end.div_ceil(page).saturating_sub(first);
    if pages == 0 {
        return Ok((0, 0));
    }
    if let Some(stat) = cachestat(fd, first * page, pages * page)? {
        return Ok((stat[0].min(pages), pages));
    }
    mincore_pages(fd, first * page, pages, page)
}

/// `cachestat(2)` of `[offset_bytes, offset_bytes + len_bytes)`: its counters `nr_cache,
/// nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted` (pages), or `None` where the
/// kernel has no `cachestat` (before Linux 6.5, or refused by seccomp).
///
/// # Errors
/// `cachestat` failed otherwise (a bad descriptor).
fn cachestat(
    fd: std::os::fd::RawFd,
    offset_bytes: u64,
    len_bytes: u64,
) -> io::Result<Option<[u64; 5]>> {
    use std::sync::atomic::Ordering;
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    if CACHESTAT_STATE.load(Ordering::Relaxed) != 2 {
        // struct cachestat_range { u64 off, len } and struct cachestat { u64 nr_cache,
        // nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted }.
        let range = [offset_bytes, len_bytes];
        let mut stat = [0u64; 5];
        // SAFETY: cachestat(fd, &range, &stat, 0) reads the 16-byte range and writes the
        // 40-byte stat, both valid for the call.
        let result =
            unsafe { libc::syscall(SYS_CACHESTAT, fd, range.as_ptr(), stat.as_mut_ptr(), 0u32) };
        if result == 0 {
            CACHESTAT_STATE.store(1, Ordering::Relaxed);
            return Ok(Some(stat));
        }
        let error = io::Error::last_os_error();
        match error.raw_os_error() {
            Some(libc::ENOSYS | libc::EPERM) => CACHESTAT_STATE.store(2, Ordering::Relaxed),
            _ => return Err(error),
        }
    }
    Ok(None)
}

/// Pages of `[offset_bytes, offset_bytes + len_bytes)` of `fd` that are dirty or under
/// writeback in the page cache (`cachestat`); `None` where the kernel cannot tell.
///
/// # Errors
/// `cachestat` failed (a bad descriptor).
pub(crate) fn unwritten_pages(
    fd: std::os::fd::RawFd,
    offset_bytes: u64,
    len_bytes: u64,
) -> io::Result<Option<u64>> {
    Ok(cachestat(fd, offset_bytes, len_bytes)?.map(|stat| stat[1] + stat[2]))
}

/// Where the first data of `fd` at or after `offset_bytes` starts (`lseek(SEEK_DATA)`:
/// holes and, on file systems that track them, allocated but unwritten ranges are
/// skipped); `None` when nothing but holes follows.
///
/// # Errors
/// `lseek` failed otherwise (a file system without SEEK_DATA answers as if all data).
pub(crate) fn first_data_at(fd: std::os::fd::RawFd, offset_bytes: u64) -> io::Result<Option<u64>> {
    let offset = libc::off_t::try_from(offset_bytes).map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: lseek only reads the descriptor's state; it moves the descriptor's offset,
    // which our positioned I/O (`pread`/`pwrite`, io_uring with offsets) never uses.
    let at = unsafe { libc::lseek(fd, offset, libc::SEEK_DATA) };
    if at < 0 {
        let error = io::Error::last_os_error();
        return match error.raw_os_error() {
            Some(libc::ENXIO) => Ok(None),
            _ => Err(error),
        };
    }
    Ok(Some(at as u64))
}

/// [`cached_pages`] through a read-only shared mapping of the range and `mincore`.
fn mincore_pages(
    fd: std::os::fd::RawFd,
    offset_bytes: u64,
    pages: u64,
    page_bytes: u64,
) -> io::Result<(u64, u64)> {
    let len = usize::try_from(pages * page_bytes).map_err(|_| io::ErrorKind::InvalidInput)?;
    let offset = libc::off_t::try_from(offset_bytes).map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: a new read-only shared mapping chosen by the kernel; unmapped below. Nothing
    // reads through it (mincore only asks about residency), so a file shorter than the
    // mapping cannot fault us.
    let addr = unsafe {
        libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, fd, offset)
    };
    if addr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let mut residency = vec![0u8; pages as usize];
    // SAFETY: `addr..addr + len` is our mapping; `residency` holds one byte per page.
    let result = unsafe { libc::mincore(addr, len, residency.as_mut_ptr()) };
    let error = io::Error::last_os_error();
    // SAFETY: the mapping made above, unmapped once.
    unsafe { libc::munmap(addr, len) };
    if result != 0 {
        return Err(error);
    }
    let cached = residency.iter().filter(|&&byte| byte & 1 != 0).count() as u64;
    Ok((cached, pages))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    /// A file of `pages` pages written through the page cache (so cached), in the
    /// current directory's filesystem (tmpfs would keep every page whatever we ask).
    fn written_file(pages: usize) -> (std::path::PathBuf, std::fs::File) {
        let path =
            std::env::temp_dir().join(format!("hipfile-sys-cached-{}-{pages}", std::process::id()));
        let mut file = std::fs::File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        file.write_all(&vec![7u8; pages * page_size_bytes() as usize]).unwrap();
        (path, file)
    }

    fn drop_pages(file: &std::fs::File) -> bool {
        // SAFETY: plain syscalls on a live descriptor.
        unsafe {
            libc::fdatasync(file.as_raw_fd()) == 0
                && libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) == 0
        }
    }

    #[test]
    fn written_pages_are_cached_and_dropped_ones_are_not_by_either_way() {
        let page = page_size_bytes();
        let (path, file) = written_file(16);
        let fd = file.as_raw_fd();
        // An unaligned range spans whole pages: 1 byte into page 2 to 1 byte into page 5.
        assert_eq!(cached_pages(fd, 2 * page + 1, 3 * page).unwrap(), (4, 4));
        assert_eq!(mincore_pages(fd, 0, 16, page).unwrap(), (16, 16));
        assert_eq!(cached_pages(fd, 0, 0).unwrap(), (0, 0));
        assert!(drop_pages(&file));
        let (cached, pages) = cached_pages(fd, 0, 16 * page).unwrap();
        let (mapped_cached, _) = mincore_pages(fd, 0, 16, page).unwrap();
        std::fs::remove_file(&path).unwrap();
        if cached == pages && mapped_cached == pages {
            // tmpfs (or a filesystem that keeps its pages) as temp dir: nothing to drop.
            println!("skipped the dropped half: the page cache kept the pages");
            return;
        }
        assert_eq!((cached, pages), (0, 16));
        assert_eq!(mapped_cached, 0);
    }

    #[test]
    fn a_range_overflowing_the_offsets_is_an_error() {
        let (path, file) = written_file(1);
        assert!(cached_pages(file.as_raw_fd(), u64::MAX - 10, 100).is_err());
        std::fs::remove_file(&path).unwrap();
    }
}
