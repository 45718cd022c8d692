//! A file that io_uring refuses, with contents a test controls: anonymous memory of this
//! process, read and written through `/proc/self/mem`, where the file offset of a byte
//! is its address. `/proc/self/mem` has no `read_iter`/`write_iter` and refuses
//! O_DIRECT, so the engine moves every chunk of it with blocking `pread`/`pwrite`;
//! `pread` there reads the region's bytes and `pwrite` changes them.

use std::fs::{File, OpenOptions};

/// A region of anonymous memory and `/proc/self/mem` opened read-write.
pub struct ProcMemFile {
    /// `/proc/self/mem`, read-write: register it.
    pub file: File,
    addr: *mut u8,
    len: usize,
}

// SAFETY: the region is owned by this value; Rust code touches it only through `fill`
// and `contents`, which tests call while no I/O on the region is in flight (the kernel
// reads and writes it for the I/O itself).
unsafe impl Send for ProcMemFile {}
// SAFETY: as above.
unsafe impl Sync for ProcMemFile {}

impl ProcMemFile {
    /// A page-aligned region of `len_bytes` (at least 1) holding `contents` (zero past it).
    ///
    /// # Panics
    /// `mmap` or the open of `/proc/self/mem` failed, or `contents` is longer than the
    /// region.
    pub fn new(len_bytes: usize, contents: &[u8]) -> ProcMemFile {
        let len = len_bytes.max(1);
        assert!(contents.len() <= len, "contents longer than the region");
        // SAFETY: an anonymous private mapping chosen by the kernel; nothing else uses it.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(addr, libc::MAP_FAILED, "mmap: {}", std::io::Error::last_os_error());
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open("/proc/self/mem")
            .expect("open /proc/self/mem read-write");
        let region = ProcMemFile { file, addr: addr.cast(), len };
        region.fill(0, contents);
        region
    }

    /// The file offset of byte `index` of the region (its address).
    pub fn offset(&self, index: usize) -> i64 {
        assert!(index <= self.len, "index past the region");
        i64::try_from(self.addr as usize + index).expect("address fits hoff_t")
    }

    /// Stores `bytes` at byte `index` of the region.
    pub fn fill(&self, index: usize, bytes: &[u8]) {
        assert!(index + bytes.len() <= self.len, "range past the region");
        // SAFETY: in the region (checked), which this value owns; no I/O on it is in
        // flight (the type's contract), and `bytes` is ordinary memory elsewhere.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.addr.add(index), bytes.len()) };
    }

    /// A copy of the region.
    pub fn contents(&self) -> Vec<u8> {
        // SAFETY: the whole region, live and owned by this value; no I/O is writing it
        // while a test reads it (the type's contract).
        unsafe { std::slice::from_raw_parts(self.addr, self.len) }.to_vec()
    }
}

impl Drop for ProcMemFile {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.addr.cast(), self.len) };
    }
}
