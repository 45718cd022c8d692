//! The executor's descriptors per registered file (a cache keyed by the handle),
//! opened through glommio, and glommio's poll-ring probe.

use std::cell::Cell;
use std::io;
use std::os::fd::AsRawFd;
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
        self.probe_device_once(file).await;
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
        if !self.probed_devices.borrow_mut().insert(device_id) {
            return;
        }
        // Always probe a file we know has data: the user's file may be empty, start with
        // a hole, or be growing under a parallel write, and each of those fools the probe.
        // Made off the reactor: it writes a block to the file system.
        let owner = Arc::clone(file);
        let probe = off_reactor(move || NonEmptyTmpFile::beside(owner.buffered_fd())).await;
        if let Some(probe) = probe {
            let _ = OpenOptions::new().read(true).dma_open(proc_fd_path(probe.fd())).await;
        }
    }
}

fn proc_fd_path(fd: std::os::fd::RawFd) -> String {
    format!("/proc/self/fd/{fd}")
}

/// An anonymous (O_TMPFILE) file with one block of data, in the directory of another
/// descriptor's file; used to give glommio's poll probe real data.
struct NonEmptyTmpFile(std::os::fd::OwnedFd);

impl NonEmptyTmpFile {
    fn beside(fd: std::os::fd::RawFd) -> Option<NonEmptyTmpFile> {
        let path = std::fs::read_link(proc_fd_path(fd)).ok()?;
        let dir = path.parent()?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags_tmpfile()
            .open(dir)
            .ok()?;
        use std::io::Write;
        (&file).write_all(&[0u8; 4096]).ok()?;
        Some(NonEmptyTmpFile(file.into()))
    }

    fn fd(&self) -> std::os::fd::RawFd {
        self.0.as_raw_fd()
    }
}

trait TmpFileOption {
    fn custom_flags_tmpfile(&mut self) -> &mut Self;
}

impl TmpFileOption for std::fs::OpenOptions {
    fn custom_flags_tmpfile(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.custom_flags(libc::O_TMPFILE)
    }
}
