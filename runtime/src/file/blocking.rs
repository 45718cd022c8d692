//! Blocking whole transfers on a descriptor: [`pread_full`] and [`pwrite_full`], which
//! retry `EINTR` and short transfers and take the faults an installed plan injects; and
//! [`pread_cached`], a read that never waits for the disk.

use std::io;
use std::os::fd::RawFd;

use crate::fault::{Fault, Site};

/// Reads into all of `buf` from `offset_bytes`, retrying `EINTR` and short reads; stops
/// early only at end of file. Returns the bytes read (`< buf.len()` only at EOF).
///
/// # Errors
/// The first OS error other than `EINTR` (bytes read before it are not reported);
/// `EINVAL` when an offset does not fit `off_t`.
pub fn pread_full(fd: RawFd, buf: &mut [u8], offset_bytes: u64) -> io::Result<usize> {
    let mut done_bytes = 0;
    while done_bytes < buf.len() {
        let offset = file_offset(offset_bytes, done_bytes)?;
        let Some(len) = injected_len(Site::FileRead, buf.len() - done_bytes)? else {
            continue;
        };
        let rest = &mut buf[done_bytes..done_bytes + len];
        // SAFETY: `rest` is a live, exclusively borrowed buffer of `rest.len()` bytes for
        // the whole call; the kernel writes at most that many.
        let result = unsafe { libc::pread(fd, rest.as_mut_ptr().cast(), rest.len(), offset) };
        match usize::try_from(result) {
            Ok(0) => break,
            Ok(n_bytes) => done_bytes += n_bytes,
            Err(_) => retry_or_fail(io::Error::last_os_error())?,
        }
    }
    Ok(done_bytes)
}

/// Reads into all of `buf` from `offset_bytes` only as far as the page cache holds it:
/// `preadv2(RWF_NOWAIT)`, which returns `EAGAIN` (or stops short) instead of waiting for
/// the disk. `Some(bytes)` when the whole range was read, or the file ended first (`bytes`
/// short only then); `None` when some byte would have needed the disk, the kernel or
/// file system cannot read without waiting (`EOPNOTSUPP`), or a read failed: the caller
/// then reads the ordinary way, which reports real errors.
pub fn pread_cached(fd: RawFd, buf: &mut [u8], offset_bytes: u64) -> Option<usize> {
    let mut done_bytes = 0;
    // Short reads with no error are the kernel's "the next page is not cached" (or the end
    // of the file): asked again from there, it answers EAGAIN or 0.
    while done_bytes < buf.len() {
        let offset = file_offset(offset_bytes, done_bytes).ok()?;
        let len = match injected_len(Site::FileRead, buf.len() - done_bytes) {
            Ok(Some(len)) => len,
            Ok(None) => continue,
            Err(_) => return None,
        };
        let rest = &mut buf[done_bytes..done_bytes + len];
        let iov = libc::iovec { iov_base: rest.as_mut_ptr().cast(), iov_len: rest.len() };
        // SAFETY: the one iovec describes `rest`, a live, exclusively borrowed buffer of
        // `rest.len()` bytes for the whole call; the kernel writes at most that many.
        let result = unsafe { libc::preadv2(fd, &iov, 1, offset, libc::RWF_NOWAIT) };
        match usize::try_from(result) {
            Ok(0) => break,
            Ok(n_bytes) => done_bytes += n_bytes,
            Err(_) if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    Some(done_bytes)
}

/// Writes all of `buf` at `offset_bytes`, retrying `EINTR` and short writes. Returns
/// the bytes written: `buf.len()`, or less only if the kernel reports 0 bytes written.
///
/// # Errors
/// The first OS error other than `EINTR` (bytes written before it are not reported);
/// `EINVAL` when an offset does not fit `off_t`.
pub fn pwrite_full(fd: RawFd, buf: &[u8], offset_bytes: u64) -> io::Result<usize> {
    let mut done_bytes = 0;
    while done_bytes < buf.len() {
        let offset = file_offset(offset_bytes, done_bytes)?;
        let Some(len) = injected_len(Site::FileWrite, buf.len() - done_bytes)? else {
            continue;
        };
        let rest = &buf[done_bytes..done_bytes + len];
        // SAFETY: `rest` is a live buffer of `rest.len()` bytes for the whole call; the
        // kernel only reads it.
        let result = unsafe { libc::pwrite(fd, rest.as_ptr().cast(), rest.len(), offset) };
        match usize::try_from(result) {
            Ok(0) => break,
            Ok(n_bytes) => done_bytes += n_bytes,
            Err(_) => retry_or_fail(io::Error::last_os_error())?,
        }
    }
    Ok(done_bytes)
}

/// How many of `wanted` bytes the next `pread`/`pwrite` at `site` moves, under an
/// installed fault plan (crate::fault): all of them without a fault, half (in whole
/// pages) for a short transfer; `None` for an interrupted call (retried, as `EINTR` is); the injected error.
fn injected_len(site: Site, wanted: usize) -> io::Result<Option<usize>> {
    match crate::fault::at(site) {
        // `fault::at` never returns a pass.
        None | Some(Fault::Pass) => Ok(Some(wanted)),
        // Whole pages, as the kernel's partial transfers are (O_DIRECT needs them).
        Some(Fault::Short) => Ok(Some(match (wanted / 2) & !4095 {
            0 => wanted,
            half => half,
        })),
        Some(Fault::Interrupt) => Ok(None),
        Some(Fault::Errno(errno)) => Err(io::Error::from_raw_os_error(errno)),
        Some(Fault::Delay(delay)) => {
            std::thread::sleep(delay);
            Ok(Some(wanted))
        }
    }
}

/// `Ok` for `EINTR` (retry), the error otherwise.
fn retry_or_fail(error: io::Error) -> io::Result<()> {
    if error.kind() == io::ErrorKind::Interrupted { Ok(()) } else { Err(error) }
}

/// `offset_bytes + done_bytes` as an `off_t`, `EINVAL` when it does not fit.
fn file_offset(offset_bytes: u64, done_bytes: usize) -> io::Result<libc::off_t> {
    u64::try_from(done_bytes)
        .ok()
        .and_then(|done| offset_bytes.checked_add(done))
        .and_then(|offset| libc::off_t::try_from(offset).ok())
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::fd::AsRawFd;

    use super::pread_cached;

    /// A file of `len` pattern bytes in the temporary directory, written and flushed.
    fn file_of(tag: &str, len: usize) -> (std::path::PathBuf, Vec<u8>) {
        let path =
            std::env::temp_dir().join(format!("hipfile-pread-cached-{tag}-{}", std::process::id()));
        let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        let mut file = std::fs::File::create(&path).expect("create");
        file.write_all(&data).expect("write");
        file.sync_all().expect("sync");
        (path, data)
    }

    /// A file just written is in the page cache: the whole range, a range cut short by the
    /// end of the file, and a range past it (0 bytes) read without waiting.
    #[test]
    fn cached_bytes_read_whole_or_up_to_the_end_of_the_file() {
        let (path, data) = file_of("whole", 64 << 10);
        let file = std::fs::File::open(&path).expect("open");
        let mut buf = vec![0u8; 16 << 10];
        assert_eq!(pread_cached(file.as_raw_fd(), &mut buf, 4096), Some(16 << 10));
        assert!(buf[..] == data[4096..4096 + (16 << 10)]);
        let tail = data.len() - 1000;
        assert_eq!(pread_cached(file.as_raw_fd(), &mut buf, tail as u64), Some(1000));
        assert!(buf[..1000] == data[tail..]);
        assert_eq!(pread_cached(file.as_raw_fd(), &mut buf, data.len() as u64), Some(0));
        std::fs::remove_file(&path).expect("remove");
    }

    /// Bytes the page cache does not hold are not read (the kernel's EAGAIN under
    /// RWF_NOWAIT), and are once an ordinary read brought them in; a descriptor that cannot
    /// read gives `None` too. Skipped where the file system keeps pages it is told to drop
    /// (tmpfs).
    #[test]
    fn bytes_outside_the_page_cache_are_not_read() {
        let (path, data) = file_of("evicted", 256 << 10);
        let file = std::fs::File::open(&path).expect("open");
        let fd = file.as_raw_fd();
        // SAFETY: a valid descriptor; advice only.
        let advised = unsafe { libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(advised, 0, "posix_fadvise");
        let mut buf = vec![0u8; 64 << 10];
        match pread_cached(fd, &mut buf, 128 << 10) {
            None => {}
            Some(_) => {
                println!("skipped: {} kept the dropped pages (tmpfs?)", path.display());
                std::fs::remove_file(&path).expect("remove");
                return;
            }
        }
        let got = super::pread_full(fd, &mut buf, 128 << 10).expect("ordinary read");
        assert_eq!(got, 64 << 10);
        buf.fill(0);
        assert_eq!(pread_cached(fd, &mut buf, 128 << 10), Some(64 << 10), "cached now");
        assert!(buf[..] == data[(128 << 10)..(192 << 10)]);
        let write_only = std::fs::OpenOptions::new().write(true).open(&path).expect("open wo");
        assert_eq!(pread_cached(write_only.as_raw_fd(), &mut buf, 0), None, "EBADF");
        std::fs::remove_file(&path).expect("remove");
    }
}
