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
