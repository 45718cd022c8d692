//! The statistics page in shared memory, `/dev/shm/hipfile-rs-stats.<pid>` (and its
//! private fallback): mapping it, filling its header, removing it at exit and the pages of
//! processes that are gone.

use std::ffi::CString;
use std::path::PathBuf;
use std::sync::atomic::Ordering;

use super::{STATS_MAGIC, STATS_VERSION, StatsPage};

/// Where process `pid` keeps its page.
pub(super) fn path_of(pid: u32) -> PathBuf {
    PathBuf::from(format!("/dev/shm/hipfile-rs-stats.{pid}"))
}

/// Maps the page (shared when allowed), fills its header and returns it; never
/// unmapped (it lives as long as the process).
pub(super) fn create() -> &'static StatsPage {
    let shared = std::env::var("HIPFILE_STATS").map_or(true, |v| v != "0" && v != "off");
    let page = if shared { map_shared() } else { None };
    let page = page.unwrap_or_else(|| Box::leak(Box::new(zeroed_page())));
    page.pid.store(u64::from(std::process::id()), Ordering::Relaxed);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    let now_ns = now.map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    page.started_unix_ns.store(now_ns, Ordering::Relaxed);
    page.version.store(STATS_VERSION, Ordering::Relaxed);
    page.magic.store(STATS_MAGIC, Ordering::Release);
    page
}

fn zeroed_page() -> StatsPage {
    // SAFETY: StatsPage is made only of AtomicU64, for which all-zero bytes are 0.
    unsafe { std::mem::zeroed() }
}

/// `/dev/shm/hipfile-rs-stats.<pid>`, sized and mapped shared; removed at exit.
fn map_shared() -> Option<&'static StatsPage> {
    remove_files_of_gone_processes();
    let path =
        CString::new(path_of(std::process::id()).into_os_string().into_encoded_bytes()).ok()?;
    let len = size_of::<StatsPage>();
    // SAFETY: plain syscalls on a descriptor of ours; the mapping is checked, never
    // unmapped, and `len` bytes long (ftruncate zero-fills it), which is what a
    // StatsPage of AtomicU64s needs (page alignment exceeds its alignment).
    unsafe {
        let fd = libc::open(
            path.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC,
            0o644,
        );
        if fd < 0 {
            return None;
        }
        let sized = libc::ftruncate(fd, len as libc::off_t) == 0;
        let addr = if sized {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        } else {
            libc::MAP_FAILED
        };
        libc::close(fd);
        if addr == libc::MAP_FAILED {
            libc::unlink(path.as_ptr());
            return None;
        }
        libc::atexit(remove_own_file);
        Some(&*addr.cast::<StatsPage>())
    }
}

extern "C" fn remove_own_file() {
    let _ = std::fs::remove_file(path_of(std::process::id()));
}

/// Removes the pages of processes that no longer exist.
fn remove_files_of_gone_processes() {
    let Ok(entries) = std::fs::read_dir("/dev/shm") else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let pid = name
            .to_str()
            .and_then(|n| n.strip_prefix("hipfile-rs-stats."))
            .and_then(|p| p.parse::<i32>().ok());
        if let Some(pid) = pid
            // SAFETY: signal 0 only checks whether the process exists.
            && unsafe { libc::kill(pid, 0) } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
        {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}
