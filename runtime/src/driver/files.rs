//! The driver's file handles: `hipFileHandleRegister` / `hipFileHandleDeregister` and
//! the lookup of a handle's file.

use std::os::fd::RawFd;
use std::sync::Arc;

use hipfile_core::OpError;

use super::{Driver, read_lock, write_lock};
use crate::error::Error;
use crate::file::{DirectPolicy, FileHandle, NoDirectReason};

/// The value a C caller holds as `hipFileHandle_t`: never 0 for a registered handle.
///
/// Values are never handed out twice in a process (not the handle's address, which a
/// later registration could reuse): a handle kept after its deregistration stays
/// unknown (5027) and never reaches a file registered later, even one that reuses the
/// same descriptor number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HandleId(pub usize);

impl HandleId {
    /// The first value handed out: pointer-like (16-byte steps) and far from small
    /// integers and typical garbage.
    const FIRST: usize = 1 << 44;
    const STEP: usize = 16;

    fn next() -> HandleId {
        static NEXT: std::sync::atomic::AtomicUsize =
            std::sync::atomic::AtomicUsize::new(HandleId::FIRST);
        HandleId(NEXT.fetch_add(HandleId::STEP, std::sync::atomic::Ordering::Relaxed))
    }
}

impl Driver {
    /// `hipFileHandleRegister` for an OpaqueFD.
    ///
    /// # Errors
    /// `HandleAlreadyRegistered` (the driver is opened implicitly first), and every
    /// error of [`FileHandle::open`] (`IONotSupported`, `InternalError`; the use count is
    /// then unchanged).
    pub fn handle_register(&self, fd: RawFd) -> Result<HandleId, Error> {
        self.handle_register_with(fd, self.config().direct)
    }

    /// [`Driver::handle_register`] with this handle's own O_DIRECT policy instead of the
    /// process-wide one (`HIPFILE_ODIRECT`): `Off` keeps every byte of this file in the
    /// page cache, `On` asks for O_DIRECT (a warning where the file cannot have it).
    ///
    /// # Errors
    /// As [`Driver::handle_register`].
    pub fn handle_register_with(&self, fd: RawFd, direct: DirectPolicy) -> Result<HandleId, Error> {
        if read_lock(&self.files).values().any(|f| f.client_fd() == fd) {
            self.ensure_open();
            return Err(Error::new(OpError::HandleAlreadyRegistered));
        }
        let file = Arc::new(FileHandle::open(fd, direct)?);
        log_direct_path(fd, &file);
        let id = HandleId::next();
        let mut files = write_lock(&self.files);
        if files.values().any(|f| f.client_fd() == fd) {
            drop(files);
            self.ensure_open();
            return Err(Error::new(OpError::HandleAlreadyRegistered));
        }
        files.insert(id, file);
        drop(files);
        self.ensure_open();
        Ok(id)
    }

    /// `hipFileHandleDeregister`: unknown handles are ignored. Ops in flight keep the
    /// file open and complete; new ops are refused at once.
    pub fn handle_deregister(&self, id: HandleId) {
        let removed = write_lock(&self.files).remove(&id);
        if let Some(file) = removed {
            file.mark_deregistered();
            drop(file);
            if let Some(engine) = self.engine.get() {
                engine.prune_files();
            }
        }
    }

    /// The file behind a handle.
    ///
    /// # Errors
    /// `HandleNotRegistered` for an unknown (or NULL, or deregistered) handle.
    pub fn file(&self, id: HandleId) -> Result<Arc<FileHandle>, Error> {
        read_lock(&self.files).get(&id).cloned().ok_or(Error::new(OpError::HandleNotRegistered))
    }
}

/// Says once, at registration, when a file's I/O leaves O_DIRECT for good: at `info`
/// (`warn` when O_DIRECT was asked for with `HIPFILE_ODIRECT=on`; `debug` when it was
/// turned off).
fn log_direct_path(fd: RawFd, file: &FileHandle) {
    let Some(reason) = file.no_direct_reason() else { return };
    let text = format!("fd {fd}: no O_DIRECT ({reason}): every byte goes through the page cache");
    match (reason, file.direct_policy()) {
        (NoDirectReason::PolicyOff, _) => log::debug!("{text}"),
        (_, DirectPolicy::On) => log::warn!("{text}, although HIPFILE_ODIRECT=on"),
        _ => log::info!("{text}"),
    }
}
