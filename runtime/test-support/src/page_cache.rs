//! Dropping a file's pages from the page cache, for tests of the O_DIRECT path: a file
//! the test wrote (or read) is cached, and under the `auto` policy a read of a range the
//! cache holds entirely takes the cache instead of O_DIRECT.

use std::os::fd::AsRawFd;

/// Drops the file's cached pages (after `fdatasync`, so that none is dirty).
pub fn drop_cached_pages(file: &impl AsRawFd) {
    // SAFETY: plain syscalls on a live descriptor.
    unsafe {
        assert_eq!(libc::fdatasync(file.as_raw_fd()), 0, "fdatasync");
        let advice = libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
        assert_eq!(advice, 0, "posix_fadvise");
    }
}
