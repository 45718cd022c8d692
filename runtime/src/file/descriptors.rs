//! The syscalls behind a handle's descriptors: inspecting the client's descriptor
//! (`statx`, `fcntl`, the file's kind), reopening it through `/proc/self/fd/N` or
//! duplicating it, and a block device's size.

use std::fs::OpenOptions;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;

use hipfile_core::OpError;

use super::{AccessMode, FileKind, Identity};

/// `BLKGETSIZE64` from `<linux/fs.h>` (`_IOR(0x12, 114, size_t)`); libc does not export it.
const BLKGETSIZE64: libc::Ioctl = libc::_IOR::<libc::size_t>(0x12, 114);

/// Regular file or block device, [`OpError::IONotSupported`] for anything else.
pub(super) fn file_kind(stx: &libc::statx) -> Result<FileKind, OpError> {
    if stx.stx_mask & libc::STATX_TYPE == 0 {
        return Err(OpError::InternalError);
    }
    match u32::from(stx.stx_mode) & libc::S_IFMT {
        libc::S_IFREG => Ok(FileKind::Regular),
        libc::S_IFBLK => Ok(FileKind::BlockDevice),
        _ => Err(OpError::IONotSupported),
    }
}

/// Our buffered descriptor: a reopen of `/proc/self/fd/N`, or a duplicate of the client
/// descriptor when that fails and the duplicate would behave like a fresh open (neither
/// `O_DIRECT` nor `O_APPEND`).
pub(super) fn open_buffered(
    fd: RawFd,
    flags: libc::c_int,
    access: AccessMode,
    sync_flags: libc::c_int,
    identity: Identity,
) -> Result<OwnedFd, OpError> {
    let owned = match reopen(fd, access, sync_flags) {
        Ok(owned) => owned,
        Err(_) if flags & (libc::O_DIRECT | libc::O_APPEND) == 0 => {
            dup_cloexec(fd).map_err(|_| OpError::InternalError)?
        }
        Err(_) => return Err(OpError::InternalError),
    };
    // The client may have closed `fd` and reused the number since our statx.
    if same_file(&owned, identity) { Ok(owned) } else { Err(OpError::InternalError) }
}

/// Opens `/proc/self/fd/{fd}` with exactly `access`, `O_CLOEXEC` and `extra_flags`.
pub(super) fn reopen(
    fd: RawFd,
    access: AccessMode,
    extra_flags: libc::c_int,
) -> io::Result<OwnedFd> {
    // std adds O_CLOEXEC and nothing else when create/truncate/append are unset, and
    // masks O_ACCMODE out of the custom flags.
    OpenOptions::new()
        .read(access.can_read())
        .write(access.can_write())
        .custom_flags(extra_flags)
        .open(format!("/proc/self/fd/{fd}"))
        .map(OwnedFd::from)
}

/// `true` when `owned` refers to the file `identity` names.
pub(super) fn same_file(owned: &OwnedFd, identity: Identity) -> bool {
    statx_fd(owned.as_raw_fd(), libc::STATX_INO).is_ok_and(|stx| Identity::of(&stx) == identity)
}

/// `statx(fd, "", AT_EMPTY_PATH, mask)`.
pub(super) fn statx_fd(fd: RawFd, mask: u32) -> io::Result<libc::statx> {
    let mut stx = MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: the path is a NUL-terminated string; `stx` is a live, writable `statx`
    // the kernel fills in.
    let result =
        unsafe { libc::statx(fd, c"".as_ptr(), libc::AT_EMPTY_PATH, mask, stx.as_mut_ptr()) };
    if result != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `statx` is plain integers, valid zeroed, and the kernel filled it.
    Ok(unsafe { stx.assume_init() })
}

/// `fcntl(fd, F_GETFL)`.
pub(super) fn fcntl_getfl(fd: RawFd) -> io::Result<libc::c_int> {
    // SAFETY: F_GETFL takes no argument and touches no memory of ours.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 { Err(io::Error::last_os_error()) } else { Ok(flags) }
}

/// `fcntl(fd, F_DUPFD_CLOEXEC, 0)`, owned.
fn dup_cloexec(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC takes an integer and touches no memory of ours.
    let new_fd = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if new_fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `new_fd` is a descriptor the kernel just created for us; nothing else
    // owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(new_fd) })
}

/// `ioctl(fd, BLKGETSIZE64)`.
pub(super) fn block_device_size_bytes(fd: RawFd) -> io::Result<u64> {
    let mut size_bytes: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which points to a live
    // local.
    let result = unsafe { libc::ioctl(fd, BLKGETSIZE64, &raw mut size_bytes) };
    if result < 0 { Err(io::Error::last_os_error()) } else { Ok(size_bytes) }
}
