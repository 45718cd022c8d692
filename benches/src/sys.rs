//! Operating-system helpers: CPU time, page-cache control, O_DIRECT probes, limits,
//! SIGUSR1 (the sweep's watchdog), a report of fatal signals.

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

/// User + system CPU seconds of the whole process (every thread) so far.
pub fn cpu_seconds() -> f64 {
    // SAFETY: an all-zero rusage is a valid value of the plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid, writable rusage.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return 0.0;
    }
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// Opens `path` read-write, with `O_DIRECT` when `direct`; `create` makes it if missing.
pub fn open_rw(path: &Path, direct: bool, create: bool) -> io::Result<File> {
    let flags = if direct { libc::O_DIRECT } else { 0 };
    OpenOptions::new().read(true).write(true).create(create).custom_flags(flags).open(path)
}

/// `fdatasync(fd)`.
pub fn fdatasync(file: &File) -> io::Result<()> {
    file.sync_data()
}

/// Flushes the file and asks the kernel to drop its cached pages
/// (`posix_fadvise(POSIX_FADV_DONTNEED)`; always permitted).
pub fn drop_file_cache(file: &File) -> io::Result<()> {
    fdatasync(file)?;
    // SAFETY: a plain syscall on a descriptor we own; no memory is passed.
    let result = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if result == 0 { Ok(()) } else { Err(io::Error::from_raw_os_error(result)) }
}

/// `sync; echo 1 > /proc/sys/vm/drop_caches` (needs root and a writable /proc/sys).
pub fn drop_system_caches() -> io::Result<()> {
    // SAFETY: sync(2) has no arguments and no failure mode.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", b"1\n")
}

/// Whether `/proc/sys/vm/drop_caches` can be opened for writing (drops nothing).
pub fn can_drop_system_caches() -> io::Result<()> {
    OpenOptions::new().write(true).open("/proc/sys/vm/drop_caches").map(drop)
}

/// Opens a probe file in `dir` with `O_DIRECT` (created and removed here).
pub fn probe_direct(dir: &Path) -> io::Result<()> {
    probe_dir(dir).0
}

/// Creates a probe file in `dir`: whether it opens with `O_DIRECT`, and its DIO
/// alignment (see [`dio_alignment`]).
pub fn probe_dir(dir: &Path) -> (io::Result<()>, io::Result<Option<(u32, u32)>>) {
    let path = dir.join(format!(".hipfile-bench-direct-probe-{}", std::process::id()));
    let direct = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
        .map(drop);
    let dio = if path.exists() { dio_alignment(&path) } else { Ok(None) };
    let _ = std::fs::remove_file(&path);
    (direct, dio)
}

/// O_DIRECT alignment of a file from `statx(STATX_DIOALIGN)`: `(memory, offset)` bytes,
/// `None` when the kernel or the filesystem does not report it.
pub fn dio_alignment(path: &Path) -> io::Result<Option<(u32, u32)>> {
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: an all-zero statx is a valid value of the plain C struct.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `c_path` is a NUL-terminated string and `stx` a writable statx; both live
    // for the call.
    let result =
        unsafe { libc::statx(libc::AT_FDCWD, c_path.as_ptr(), 0, libc::STATX_DIOALIGN, &mut stx) };
    if result != 0 {
        return Err(io::Error::last_os_error());
    }
    let reported = stx.stx_mask & libc::STATX_DIOALIGN != 0 && stx.stx_dio_offset_align != 0;
    Ok(reported.then_some((stx.stx_dio_mem_align, stx.stx_dio_offset_align)))
}

/// The filesystem type of `path`, by `statfs` magic number.
pub fn fs_type(path: &Path) -> String {
    let Ok(c_path) = CString::new(path.as_os_str().as_bytes()) else {
        return "unknown".into();
    };
    // SAFETY: an all-zero statfs is a valid value of the plain C struct.
    let mut stfs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: NUL-terminated path and a writable statfs, both live for the call.
    if unsafe { libc::statfs(c_path.as_ptr(), &mut stfs) } != 0 {
        return "unknown".into();
    }
    let magic = stfs.f_type as u64;
    let name = match magic {
        0xEF53 => "ext4",
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs",
        0x0102_1994 => "tmpfs",
        0x794C_7630 => "overlayfs",
        0x6969 => "nfs",
        0x6573_5546 => "fuse",
        0x2FC1_2FC1 => "zfs",
        0xF2F5_2010 => "f2fs",
        _ => return format!("magic {magic:#x}"),
    };
    name.into()
}

/// `RLIMIT_MEMLOCK` as `(soft, hard)`; `None` means unlimited.
pub fn memlock_limit() -> io::Result<(Option<u64>, Option<u64>)> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `limit` is a valid, writable rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let value = |v: libc::rlim_t| (v != libc::RLIM_INFINITY).then_some(v);
    Ok((value(limit.rlim_cur), value(limit.rlim_max)))
}

/// `io_uring_setup(1, &params)`: whether the kernel lets this process make a ring.
pub fn probe_io_uring() -> io::Result<()> {
    // struct io_uring_params is 120 bytes; zeroed means "no flags".
    let mut params = [0u8; 120];
    // SAFETY: io_uring_setup reads and writes at most sizeof(struct io_uring_params) =
    // 120 bytes through the pointer, which `params` provides.
    let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 1u32, params.as_mut_ptr()) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is the ring descriptor just returned to us; closed once.
    unsafe { libc::close(fd as RawFd) };
    Ok(())
}

/// Threads for CPU-side verification and pattern fills.
pub fn worker_threads() -> usize {
    // Asked once: each call reads the cgroup's CPU quota from /proc and /sys.
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *THREADS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()).min(16))
}

/// `MemAvailable` from /proc/meminfo, in bytes.
pub fn mem_available_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Set by the SIGUSR1 handler; read (and cleared) by [`take_sigusr1`].
static SIGUSR1_SEEN: AtomicBool = AtomicBool::new(false);

/// The SIGUSR1 handler: one lock-free atomic store, which is async-signal-safe.
extern "C" fn note_sigusr1(_signal: libc::c_int) {
    SIGUSR1_SEEN.store(true, Ordering::SeqCst);
}

/// Installs a SIGUSR1 handler that only records the signal (see [`take_sigusr1`]);
/// interrupted system calls restart.
pub fn catch_sigusr1() -> io::Result<()> {
    let handler = note_sigusr1 as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: the handler only does an async-signal-safe atomic store.
    unsafe { install_handler(&[libc::SIGUSR1], handler, libc::SA_RESTART) }
}

/// Installs `handler` for each of `signals` with `flags` and an empty mask.
///
/// # Safety
/// `handler` is an `extern "C"` function of the signature `flags` asks for (with
/// `SA_SIGINFO`: signal, siginfo, context; else the signal alone) that is fit to run at any
/// point of any thread.
pub unsafe fn install_handler(
    signals: &[libc::c_int],
    handler: libc::sighandler_t,
    flags: libc::c_int,
) -> io::Result<()> {
    // SAFETY: an all-zero sigaction is a valid value of the plain C struct.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = handler;
    action.sa_flags = flags;
    // SAFETY: `action.sa_mask` is a valid, writable sigset_t.
    unsafe { libc::sigemptyset(&mut action.sa_mask) };
    for &signal in signals {
        // SAFETY: a valid sigaction whose handler the caller vouches for; the old action
        // is not asked for (NULL).
        if unsafe { libc::sigaction(signal, &action, std::ptr::null_mut()) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Whether SIGUSR1 arrived since the last call.
pub fn take_sigusr1() -> bool {
    SIGUSR1_SEEN.swap(false, Ordering::SeqCst)
}

/// Sends SIGUSR1 to `child`, which has not been reaped yet (so its pid is still ours).
pub fn send_sigusr1(child: &std::process::Child) -> io::Result<()> {
    let pid = libc::pid_t::try_from(child.id()).map_err(|_| io::Error::other("pid range"))?;
    // SAFETY: a plain syscall; `pid` is our own unreaped child, not a reused pid.
    if unsafe { libc::kill(pid, libc::SIGUSR1) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Set by the first fatal signal, so that a fault inside the report itself does not
/// report again.
static FATAL_SEEN: AtomicBool = AtomicBool::new(false);

/// Signals that end the process with a fault of one of its threads.
const FATAL_SIGNALS: [libc::c_int; 4] = [libc::SIGSEGV, libc::SIGBUS, libc::SIGILL, libc::SIGFPE];

/// The fatal-signal handler: names the thread, the signal and the address, writes the
/// faulting thread's return addresses (glibc's `backtrace`, which unwinds through the
/// signal frame; each as `binary(+offset)`, for `addr2line -f -C -e` on a copy of the
/// same binary), then puts the default action back and raises the signal again, so that
/// the process ends as it would have (core dump and exit status unchanged). Reading the
/// thread's name and formatting the first line allocate, which is not async-signal-safe:
/// a diagnostic for the GPU machine, which has no gdb to read a core.
extern "C" fn report_fatal_signal(
    signal: libc::c_int,
    info: *mut libc::siginfo_t,
    _context: *mut libc::c_void,
) {
    for fatal in FATAL_SIGNALS {
        // SAFETY: resetting a signal's action to the default is async-signal-safe.
        unsafe { libc::signal(fatal, libc::SIG_DFL) };
    }
    if !FATAL_SEEN.swap(true, Ordering::SeqCst) {
        // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
        let address = unsafe { info.as_ref().map_or(std::ptr::null_mut(), |info| info.si_addr()) };
        let thread = std::fs::read_to_string("/proc/thread-self/comm").unwrap_or_default();
        eprintln!(
            "hipfile-bench: fatal signal {signal} in thread \"{}\" at address {address:p}; \
             its return addresses:",
            thread.trim()
        );
        let mut frames = [std::ptr::null_mut::<libc::c_void>(); 64];
        // SAFETY: `frames` holds 64 writable pointers; backtrace writes at most that many
        // and backtrace_symbols_fd reads the ones it wrote, writing to stderr without
        // allocating.
        unsafe {
            let depth = libc::backtrace(frames.as_mut_ptr(), frames.len() as libc::c_int);
            libc::backtrace_symbols_fd(frames.as_ptr(), depth, libc::STDERR_FILENO);
        }
    }
    // Pending until the handler returns (the signal is blocked while it runs), then the
    // default action: also for a signal sent with kill(2), which no instruction repeats.
    // SAFETY: raise is async-signal-safe.
    unsafe { libc::raise(signal) };
}

/// Installs [`report_fatal_signal`] for SIGSEGV, SIGBUS, SIGILL and SIGFPE. It replaces
/// the standard library's handler, whose stack-overflow message it does not give.
pub fn report_fatal_signals() -> io::Result<()> {
    let handler = report_fatal_signal
        as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void)
        as libc::sighandler_t;
    // On the thread's own stack (no SA_ONSTACK): the alternate stacks the standard library
    // gives its threads are too small to unwind on (a stack overflow then simply ends the
    // process).
    // SAFETY: an SA_SIGINFO handler of the matching signature; it allocates, which is
    // accepted for a diagnostic (its doc).
    unsafe { install_handler(&FATAL_SIGNALS, handler, libc::SA_SIGINFO) }
}
