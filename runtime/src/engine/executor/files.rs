//! The executor's descriptors per registered file (a cache keyed by the handle),
//! opened through glommio, and glommio's poll-ring probe.

use std::cell::Cell;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt as _;
use std::rc::Rc;
use std::sync::{Arc, Weak};

use glommio::io::{DmaFile, OpenOptions};

use super::{Executor, glommio_errno, off_reactor, uring_refuses};
use crate::file::FileHandle;
use crate::sys;

/// The executor's descriptors for one registered file.
pub(super) struct OpenFiles {
    /// `None` when glommio cannot open the file (it opens with O_DIRECT, which some
    /// files refuse with EINVAL): every chunk then goes through blocking I/O.
    pub(super) buffered: Option<DmaFile>,
    pub(super) direct: Option<DmaFile>,
    /// io_uring refused this file (glommio's poll-ring misdetection): use blocking I/O.
    pub(super) uring_refused: Cell<bool>,
}

pub(super) struct FileEntry {
    handle: Weak<FileHandle>,
    files: Rc<OpenFiles>,
}

impl Executor {
    pub(super) fn prune_files(&self) {
        self.files.borrow_mut().retain(|_, entry| entry.handle.strong_count() > 0);
    }

    pub(super) async fn open_files(&self, file: &Arc<FileHandle>) -> io::Result<Rc<OpenFiles>> {
        let key = Arc::as_ptr(file) as usize;
        if let Some(entry) = self.files.borrow().get(&key)
            && entry.handle.upgrade().is_some_and(|live| Arc::ptr_eq(&live, file))
        {
            return Ok(Rc::clone(&entry.files));
        }
        {
            let _step = self.setup.watch.step(super::JobStep::Probe);
            self.probe_device_once(file).await;
        }
        let _step = self.setup.watch.step(super::JobStep::Open);
        let mut options = OpenOptions::new();
        options.read(file.can_read()).write(file.can_write());
        let buffered = match options.dma_open(proc_fd_path(file.buffered_fd())).await {
            Ok(buffered) => {
                sys::clear_o_direct(buffered.as_raw_fd())?;
                Some(buffered)
            }
            Err(error) => match glommio_errno(error) {
                errno if uring_refuses(errno) => None,
                errno => return Err(io::Error::from_raw_os_error(errno)),
            },
        };
        let direct = match (&buffered, file.direct_fd()) {
            (Some(_), Some(fd)) => options.dma_open(proc_fd_path(fd)).await.ok(),
            _ => None,
        };
        if self.arena.get().is_none()
            && let Some(buffered) = &buffered
        {
            self.discover_arena(buffered);
        }
        let uring_refused = Cell::new(buffered.is_none());
        let files = Rc::new(OpenFiles { buffered, direct, uring_refused });
        let entry = FileEntry { handle: Arc::downgrade(file), files: Rc::clone(&files) };
        self.files.borrow_mut().insert(key, entry);
        Ok(files)
    }

    /// glommio 0.9 decides once per device and thread whether the poll ring works, by
    /// reading the first block of the first O_DIRECT file it opens there; an empty file
    /// (or a hole) makes it answer "yes" wrongly, and every later read then fails with
    /// EOPNOTSUPP. Before the first open on a device we let glommio probe a non-empty
    /// anonymous file in the same directory instead. If that cannot be created, reads
    /// that io_uring refuses are redone with blocking I/O (correct, slower).
    async fn probe_device_once(&self, file: &Arc<FileHandle>) {
        let device_id = file.device_id();
        if self.probed_devices.borrow().contains(&device_id) {
            return;
        }
        // One probe per device: a job that opens a file on the device while another job's
        // probe runs waits for it here. Passing by would let glommio probe with that
        // job's file (its first open on the device), the very thing the probe avoids.
        let _probing = self.probe_lock.acquire_permit(1).await;
        if self.probed_devices.borrow().contains(&device_id) {
            return;
        }
        // Always probe a file we know has a clean block of data first: the user's file
        // may be empty, start with a hole, or be growing under a parallel write, and each
        // of those fools the probe or makes it wait ([`NonEmptyTmpFile`]). The user's
        // file serves when its first block is such a block; else a probe file of ours.
        // Decided off the reactor: it may write a block to the file system.
        let owner = Arc::clone(file);
        let probe = off_reactor(move || probe_target(&owner)).await;
        let what = probe.map_or("the job's file, as glommio opens it (no probe file)", |p| p.1);
        log::debug!(
            "executor {}: glommio's poll probe of device {device_id:?} reads {what}",
            self.setup.index
        );
        if let Some((fd, _)) = probe
            && let Ok(opened) = OpenOptions::new().read(true).dma_open(proc_fd_path(fd)).await
        {
            let _ = opened.close().await;
        }
        self.probed_devices.borrow_mut().insert(device_id);
    }
}

fn proc_fd_path(fd: std::os::fd::RawFd) -> String {
    format!("/proc/self/fd/{fd}")
}

/// The descriptor glommio's poll probe reads, and what it is: a file whose first block is
/// written, on disk and not dirty, on the device of `file` — `file` itself when its first
/// block is such a block, else a probe file of ours. `None` when neither serves (no room
/// or no permission beside the file). Blocks (it may write a block): off the reactor.
fn probe_target(file: &FileHandle) -> Option<(std::os::fd::RawFd, &'static str)> {
    let size_bytes = file.size_bytes().unwrap_or(0);
    if file.can_read() && first_block_is_clean_data(file.buffered_fd(), size_bytes) {
        return Some((file.buffered_fd(), "the job's file"));
    }
    NonEmptyTmpFile::fd_for_device_of(file).map(|fd| (fd, "a probe file"))
}

/// Whether the file's first block holds written data (no hole, not merely allocated)
/// that is neither dirty nor under writeback in the page cache. `false` where the kernel
/// cannot tell (no `cachestat`) or the file (of `size_bytes`) is shorter than a block.
fn first_block_is_clean_data(fd: std::os::fd::RawFd, size_bytes: u64) -> bool {
    let block = PROBE_BLOCK_BYTES as u64;
    size_bytes >= block
        && matches!(sys::first_data_at(fd, 0), Ok(Some(0)))
        && matches!(sys::unwritten_pages(fd, 0, block), Ok(Some(0)))
}

/// An anonymous (O_TMPFILE) file with one block of data on disk, in the directory of
/// another descriptor's file; used to give glommio's poll probe real data.
///
/// The block is written with O_DIRECT (or, where the file system refuses O_DIRECT,
/// written and then `fdatasync`ed), so that no page of the file is dirty when glommio's
/// probe reads it. An O_DIRECT read of a dirty page writes it back first and waits for
/// that write, queued on the device behind whatever a heavy writer (a build, a
/// checkpoint) dirtied: glommio's probe read then took over a minute (the kernel stack:
/// io-wq in `folio_wait_writeback` under `iomap_dio_rw`), the first jobs of the executor
/// waited for it and the executor spun on its poll ring meanwhile. A clean block is read
/// at once (and on a device without poll queues refused at once, the block layer's answer
/// that makes glommio say "no").
///
/// One per device for the life of the process ([`NonEmptyTmpFile::fd_for_device_of`]):
/// made once, not per executor and engine, and never closed, because its last close
/// frees its block, which on a file system mounted with `discard` waits for a discard
/// behind everything queued on the device (over a minute under a heavy writer, seen on an
/// executor thread). The process holds one descriptor per device it probed.
struct NonEmptyTmpFile(std::os::fd::OwnedFd);

/// The probe files made so far, by device (major, minor); never closed.
static PROBE_FILES: std::sync::Mutex<Vec<((u32, u32), NonEmptyTmpFile)>> =
    std::sync::Mutex::new(Vec::new());

/// Bytes of the probe's block (a multiple of every logical block size).
const PROBE_BLOCK_BYTES: usize = 4096;

impl NonEmptyTmpFile {
    /// The descriptor of `file`'s device's probe file: the one made earlier in the
    /// process, or a new one beside `file` (`None` if none can be made there; tried again
    /// next time). Valid for the life of the process ([`PROBE_FILES`] never closes it).
    fn fd_for_device_of(file: &FileHandle) -> Option<std::os::fd::RawFd> {
        let device_id = file.device_id();
        let mut made = PROBE_FILES.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some((_, probe)) = made.iter().find(|(device, _)| *device == device_id) {
            return Some(probe.fd());
        }
        let probe = NonEmptyTmpFile::beside(file.buffered_fd())?;
        let fd = probe.fd();
        made.push((device_id, probe));
        Some(fd)
    }

    fn beside(fd: std::os::fd::RawFd) -> Option<NonEmptyTmpFile> {
        let path = std::fs::read_link(proc_fd_path(fd)).ok()?;
        let dir = path.parent()?;
        let open = |direct: bool| {
            let flags = libc::O_TMPFILE | if direct { libc::O_DIRECT } else { 0 };
            std::fs::OpenOptions::new().read(true).write(true).custom_flags(flags).open(dir)
        };
        if let Ok(file) = open(true)
            && write_direct_block(&file)
        {
            return Some(NonEmptyTmpFile(file.into()));
        }
        let file = open(false).ok()?;
        use std::io::Write;
        (&file).write_all(&[0u8; PROBE_BLOCK_BYTES]).ok()?;
        file.sync_data().ok()?;
        Some(NonEmptyTmpFile(file.into()))
    }

    fn fd(&self) -> std::os::fd::RawFd {
        self.0.as_raw_fd()
    }
}

/// Writes the probe's block through an O_DIRECT descriptor, from memory aligned to the
/// block (the part of a buffer twice its size that starts at an aligned address).
fn write_direct_block(file: &std::fs::File) -> bool {
    use std::os::unix::fs::FileExt;
    let buffer = vec![0u8; 2 * PROBE_BLOCK_BYTES];
    let skip = buffer.as_ptr().align_offset(PROBE_BLOCK_BYTES);
    let Some(block) = buffer.get(skip..skip.saturating_add(PROBE_BLOCK_BYTES)) else {
        return false;
    };
    file.write_all_at(block, 0).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{FileExt as _, MetadataExt as _};

    /// A new file in the temporary directory (removed when the test's `File` is the last
    /// reference), written with `write` at the given offsets, then synced when `sync`.
    fn scratch_file(name: &str, writes: &[(u64, usize)], sync: bool) -> std::fs::File {
        let path = std::env::temp_dir().join(format!("hipfile-{name}-{}", std::process::id()));
        let file = std::fs::File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        for &(offset, len) in writes {
            file.write_all_at(&vec![7u8; len], offset).unwrap();
        }
        if sync {
            file.sync_data().unwrap();
        }
        file
    }

    /// The job's own file serves the probe only when its first block is written data
    /// that is clean: not a file whose first block was just written through the page
    /// cache (dirty), starts with a hole, or is shorter than a block.
    #[test]
    fn only_a_clean_written_first_block_serves_the_probe() {
        let clean = scratch_file("probe-clean", &[(0, 8192)], true);
        if sys::unwritten_pages(clean.as_raw_fd(), 0, 4096).unwrap().is_none() {
            eprintln!("skipped: this kernel has no cachestat (the probe file is used then)");
            return;
        }
        assert!(first_block_is_clean_data(clean.as_raw_fd(), 8192));
        let dirty = scratch_file("probe-dirty", &[(0, 8192)], false);
        assert!(!first_block_is_clean_data(dirty.as_raw_fd(), 8192));
        let hole_first = scratch_file("probe-hole", &[(1 << 20, 8192)], true);
        assert!(!first_block_is_clean_data(hole_first.as_raw_fd(), (1 << 20) + 8192));
        let short = scratch_file("probe-short", &[(0, 100)], true);
        assert!(!first_block_is_clean_data(short.as_raw_fd(), 100));
    }

    /// The probe's file holds one block on disk and none in the page cache, which an
    /// O_DIRECT descriptor reads back whole (a file without blocks, or with a hole first,
    /// fools glommio; a dirty page makes its read wait for writeback).
    #[test]
    fn the_probe_file_holds_one_block_on_disk() {
        let dir = std::env::temp_dir();
        let path = dir.join(format!("hipfile-probe-test-{}", std::process::id()));
        let beside = std::fs::File::create(&path).unwrap();
        let probe = NonEmptyTmpFile::beside(beside.as_raw_fd());
        std::fs::remove_file(&path).unwrap();
        let probe = probe.expect("no probe file made in the temporary directory");
        let meta = std::fs::metadata(proc_fd_path(probe.fd())).unwrap();
        assert_eq!(meta.len(), PROBE_BLOCK_BYTES as u64);
        assert!(meta.blocks() * 512 >= PROBE_BLOCK_BYTES as u64, "{} blocks", meta.blocks());
        let Ok(direct) = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(proc_fd_path(probe.fd()))
        else {
            eprintln!("skipped: {} has no O_DIRECT", dir.display());
            return;
        };
        // Written past the page cache: no page of it there, so none is dirty (an O_DIRECT
        // read of a dirty page waits for its writeback).
        let (cached, pages) = crate::sys::cached_pages(probe.fd(), 0, meta.len()).unwrap();
        assert_eq!(cached, 0, "{cached} of the probe's {pages} page(s) in the page cache");
        let mut buffer = vec![1u8; 2 * PROBE_BLOCK_BYTES];
        let skip = buffer.as_ptr().align_offset(PROBE_BLOCK_BYTES);
        let block = &mut buffer[skip..skip + PROBE_BLOCK_BYTES];
        assert_eq!(direct.read_at(block, 0).unwrap(), PROBE_BLOCK_BYTES);
        assert!(block.iter().all(|&byte| byte == 0));
    }
}
