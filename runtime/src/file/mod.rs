//! File handles registered from a client file descriptor (`hipFileHandleRegister`).
//!
//! [`FileHandle::open`] inspects the client's descriptor (`statx`, `fcntl(F_GETFL)`) and
//! opens descriptors of its own on the same file through `/proc/self/fd/N`:
//! - a **buffered** one (page cache), always present;
//! - a **direct** one (`O_DIRECT`), when the filesystem supports it and the policy allows.
//!
//! Our descriptors get exactly the client's access mode, never a wider one, plus
//! `O_CLOEXEC` and the client's `O_SYNC` / `O_DSYNC` (so durability requests survive).
//! `O_APPEND`, `O_NONBLOCK` and every other status flag are dropped: all I/O is
//! positional, and a `pwrite` on an `O_APPEND` descriptor would ignore its offset.
//!
//! A handle is shared as `Arc<FileHandle>` between the registry and in-flight ops
//! ([`OpGuard`]); its descriptors are closed when the last `Arc` goes away, so a handle
//! deregistered with ops in flight stays usable until the last of them finishes.
//!
//! This file holds the handle, its descriptors' accessors, the ops in flight on it and its
//! byte counters. The rest by job: `direct.rs` (the O_DIRECT policy and descriptor, why a
//! handle has none, the alignment, and when a read goes to the page cache instead),
//! `change.rs` (the change stamp that tells whether data read earlier is still the
//! file's), `blocking.rs` ([`pread_full`] / [`pwrite_full`]: whole transfers, their
//! retries and injected faults), `descriptors.rs` (the syscalls that inspect a client's
//! descriptor and open ours).

mod blocking;
mod change;
mod descriptors;
mod direct;

use std::io;
use std::ops::Deref;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use hipfile_core::{ChunkMode, DioAlignment, Direction, OpError};

pub use blocking::{pread_cached, pread_full, pwrite_full};
pub(crate) use change::ChangeStamp;
pub use direct::DirectPolicy;
pub(crate) use direct::NoDirectReason;

use descriptors::{block_device_size_bytes, fcntl_getfl, file_kind, open_buffered, statx_fd};
use direct::open_direct;

/// `statx` fields [`FileHandle::open`] needs.
const STATX_WANTED: u32 =
    libc::STATX_TYPE | libc::STATX_MODE | libc::STATX_INO | libc::STATX_DIOALIGN;

/// The access mode of a descriptor (`fcntl(F_GETFL) & O_ACCMODE`).
///
/// Public for the integration tests; embedders do not need it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AccessMode {
    /// `O_RDONLY`.
    ReadOnly,
    /// `O_WRONLY`.
    WriteOnly,
    /// `O_RDWR`.
    ReadWrite,
}

impl AccessMode {
    /// The mode in `flags` (as returned by `fcntl(F_GETFL)`), `None` for the value 3
    /// (`O_ACCMODE` itself: neither read nor write, used for ioctl-only opens).
    ///
    /// Public for the integration tests; embedders do not need it.
    pub fn from_flags(flags: libc::c_int) -> Option<AccessMode> {
        match flags & libc::O_ACCMODE {
            libc::O_RDONLY => Some(AccessMode::ReadOnly),
            libc::O_WRONLY => Some(AccessMode::WriteOnly),
            libc::O_RDWR => Some(AccessMode::ReadWrite),
            _ => None,
        }
    }

    /// `true` for `ReadOnly` and `ReadWrite`.
    pub(crate) fn can_read(self) -> bool {
        matches!(self, AccessMode::ReadOnly | AccessMode::ReadWrite)
    }

    /// `true` for `WriteOnly` and `ReadWrite`.
    pub(crate) fn can_write(self) -> bool {
        matches!(self, AccessMode::WriteOnly | AccessMode::ReadWrite)
    }
}

/// What a registered descriptor refers to.
///
/// Public for the integration tests; embedders do not need it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileKind {
    /// A regular file.
    Regular,
    /// A block device.
    BlockDevice,
}

/// Bytes moved through a handle, by path; see [`FileHandle::record_bytes`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FileCounters {
    /// Bytes read through the O_DIRECT descriptor.
    pub direct_read_bytes: u64,
    /// Bytes read through the buffered descriptor.
    pub buffered_read_bytes: u64,
    /// Bytes written through the O_DIRECT descriptor.
    pub direct_written_bytes: u64,
    /// Bytes written through the buffered descriptor.
    pub buffered_written_bytes: u64,
}

impl FileCounters {
    /// All bytes read, direct and buffered.
    pub fn read_bytes(&self) -> u64 {
        self.direct_read_bytes + self.buffered_read_bytes
    }

    /// All bytes written, direct and buffered.
    pub fn written_bytes(&self) -> u64 {
        self.direct_written_bytes + self.buffered_written_bytes
    }
}

/// Identity of a file: device and inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Identity {
    device_id: (u32, u32),
    inode: u64,
}

impl Identity {
    fn of(stx: &libc::statx) -> Identity {
        Identity { device_id: (stx.stx_dev_major, stx.stx_dev_minor), inode: stx.stx_ino }
    }
}

/// A registered file: the client's descriptor plus our own buffered and (optional)
/// O_DIRECT descriptors, closed when the handle is dropped.
#[derive(Debug)]
pub struct FileHandle {
    client_fd: RawFd,
    access: AccessMode,
    kind: FileKind,
    identity: Identity,
    buffered: OwnedFd,
    direct: Option<OwnedFd>,
    dio: Option<DioAlignment>,
    no_direct: Option<NoDirectReason>,
    policy: DirectPolicy,
    /// Whether the first request that left O_DIRECT for alignment was logged.
    logged_unaligned: AtomicBool,
    deregistered: AtomicBool,
    in_flight: AtomicUsize,
    direct_read_bytes: AtomicU64,
    buffered_read_bytes: AtomicU64,
    direct_written_bytes: AtomicU64,
    buffered_written_bytes: AtomicU64,
}

impl FileHandle {
    /// Registers `fd`: checks its type and access mode and opens our descriptors.
    /// The client keeps ownership of `fd`; we never close it.
    ///
    /// # Errors
    /// - [`OpError::InternalError`] when `fd` is negative or not open (`statx` or
    ///   `fcntl` fails), or when no buffered descriptor can be made;
    /// - [`OpError::IONotSupported`] when `fd` is not a regular file or block device, is
    ///   an `O_PATH` descriptor, or has the access mode 3 (neither read nor write).
    ///
    /// A missing O_DIRECT path is never an error: [`FileHandle::direct_fd`] is `None`.
    ///
    /// Public for the integration tests; embedders do not need it.
    pub fn open(fd: RawFd, direct: DirectPolicy) -> Result<FileHandle, OpError> {
        if fd < 0 {
            return Err(OpError::InternalError);
        }
        let stx = statx_fd(fd, STATX_WANTED).map_err(|_| OpError::InternalError)?;
        let flags = fcntl_getfl(fd).map_err(|_| OpError::InternalError)?;
        if flags & libc::O_PATH != 0 {
            return Err(OpError::IONotSupported);
        }
        let kind = file_kind(&stx)?;
        let access = AccessMode::from_flags(flags).ok_or(OpError::IONotSupported)?;
        let identity = Identity::of(&stx);
        let sync_flags = flags & (libc::O_SYNC | libc::O_DSYNC);
        let buffered = open_buffered(fd, flags, access, sync_flags, identity)?;
        let direct_path = if direct == DirectPolicy::Off {
            Err(NoDirectReason::PolicyOff)
        } else {
            open_direct(fd, access, sync_flags, kind, &stx, &buffered, identity)
        };
        let (direct_fd, dio, no_direct) = match direct_path {
            Ok((f, d)) => (Some(f), Some(d), None),
            Err(reason) => (None, None, Some(reason)),
        };
        Ok(FileHandle {
            client_fd: fd,
            access,
            kind,
            identity,
            buffered,
            direct: direct_fd,
            dio,
            no_direct,
            policy: direct,
            logged_unaligned: AtomicBool::new(false),
            deregistered: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            direct_read_bytes: AtomicU64::new(0),
            buffered_read_bytes: AtomicU64::new(0),
            direct_written_bytes: AtomicU64::new(0),
            buffered_written_bytes: AtomicU64::new(0),
        })
    }

    /// The descriptor the client registered (not ours: never closed by us).
    ///
    /// Public for the integration tests; embedders do not need it.
    pub fn client_fd(&self) -> RawFd {
        self.client_fd
    }

    /// The client's access mode, which our descriptors share.
    ///
    /// Public for the integration tests; embedders do not need it.
    pub fn access(&self) -> AccessMode {
        self.access
    }

    /// `true` when the file was opened for reading.
    ///
    /// Public for the integration tests; embedders do not need it.
    pub fn can_read(&self) -> bool {
        self.access.can_read()
    }

    /// `true` when the file was opened for writing.
    ///
    /// Public for the integration tests; embedders do not need it.
    pub fn can_write(&self) -> bool {
        self.access.can_write()
    }

    /// Regular file or block device.
    ///
    /// Public for the integration tests; embedders do not need it.
    pub fn kind(&self) -> FileKind {
        self.kind
    }

    /// Major and minor number of the device holding the file (`st_dev`).
    ///
    /// Public for the integration tests; embedders do not need it.
    pub fn device_id(&self) -> (u32, u32) {
        self.identity.device_id
    }

    /// Inode number.
    ///
    /// Public for the integration tests; embedders do not need it.
    pub fn inode(&self) -> u64 {
        self.identity.inode
    }

    /// Our buffered (page cache) descriptor.
    ///
    /// Public for the integration tests; embedders do not need it.
    pub fn buffered_fd(&self) -> RawFd {
        self.buffered.as_raw_fd()
    }

    /// The file's current size: `statx` for regular files, `BLKGETSIZE64` for block
    /// devices.
    ///
    /// # Errors
    /// The OS error of `statx` or `ioctl`.
    ///
    /// Public for the integration tests; embedders do not need it.
    pub fn size_bytes(&self) -> io::Result<u64> {
        match self.kind {
            FileKind::Regular => Ok(statx_fd(self.buffered_fd(), libc::STATX_SIZE)?.stx_size),
            FileKind::BlockDevice => block_device_size_bytes(self.buffered_fd()),
        }
    }

    /// Starts an op on the handle: the returned guard keeps the handle (and its
    /// descriptors) alive and counts in [`FileHandle::ops_in_flight`] until dropped.
    ///
    /// # Errors
    /// [`OpError::HandleNotRegistered`] once [`FileHandle::mark_deregistered`] was called.
    ///
    /// Public for the integration tests; embedders do not need it.
    pub fn begin_op(self: &Arc<Self>) -> Result<OpGuard, OpError> {
        if self.is_deregistered() {
            return Err(OpError::HandleNotRegistered);
        }
        // Count first, then check again: a deregistration that races with us either
        // sees our count or makes us back off.
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let guard = OpGuard { handle: Arc::clone(self) };
        if self.is_deregistered() {
            drop(guard);
            return Err(OpError::HandleNotRegistered);
        }
        Ok(guard)
    }

    /// Marks the handle deregistered: later [`FileHandle::begin_op`] calls fail; ops
    /// already in flight continue.
    ///
    /// Public for the integration tests; embedders do not need it.
    pub fn mark_deregistered(&self) {
        self.deregistered.store(true, Ordering::SeqCst);
    }

    /// `true` after [`FileHandle::mark_deregistered`].
    ///
    /// Public for the integration tests; embedders do not need it.
    pub fn is_deregistered(&self) -> bool {
        self.deregistered.load(Ordering::SeqCst)
    }

    /// Number of live [`OpGuard`]s.
    ///
    /// Public for the integration tests; embedders do not need it.
    pub fn ops_in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Adds `len_bytes` to the counter of `direction` and `mode`.
    ///
    /// Public for the integration tests; embedders do not need it.
    pub fn record_bytes(&self, direction: Direction, mode: ChunkMode, len_bytes: u64) {
        let counter = match (direction, mode) {
            (Direction::Read, ChunkMode::Direct) => &self.direct_read_bytes,
            (Direction::Read, ChunkMode::Buffered) => &self.buffered_read_bytes,
            (Direction::Write, ChunkMode::Direct) => &self.direct_written_bytes,
            (Direction::Write, ChunkMode::Buffered) => &self.buffered_written_bytes,
        };
        counter.fetch_add(len_bytes, Ordering::Relaxed);
        crate::stats::global().record_path_bytes(direction, mode, len_bytes);
    }

    /// A snapshot of the byte counters.
    pub fn counters(&self) -> FileCounters {
        FileCounters {
            direct_read_bytes: self.direct_read_bytes.load(Ordering::Relaxed),
            buffered_read_bytes: self.buffered_read_bytes.load(Ordering::Relaxed),
            direct_written_bytes: self.direct_written_bytes.load(Ordering::Relaxed),
            buffered_written_bytes: self.buffered_written_bytes.load(Ordering::Relaxed),
        }
    }
}

/// An op in flight on a handle (see [`FileHandle::begin_op`]); dereferences to the
/// handle.
///
/// Public for the integration tests; embedders do not need it.
#[derive(Debug)]
pub struct OpGuard {
    handle: Arc<FileHandle>,
}

impl OpGuard {
    /// The handle, as the shared pointer the guard holds.
    ///
    /// Public for the integration tests; embedders do not need it.
    pub fn handle(&self) -> &Arc<FileHandle> {
        &self.handle
    }
}

impl Deref for OpGuard {
    type Target = FileHandle;

    fn deref(&self) -> &FileHandle {
        &self.handle
    }
}

impl Drop for OpGuard {
    fn drop(&mut self) {
        self.handle.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl OpGuard {
    /// Another guard for the same op (e.g. one per part of an op split over executors).
    /// Unlike [`FileHandle::begin_op`] it succeeds after deregistration: the op was
    /// admitted before, and ops in flight complete.
    pub(crate) fn share(&self) -> OpGuard {
        self.handle.in_flight.fetch_add(1, Ordering::SeqCst);
        OpGuard { handle: Arc::clone(&self.handle) }
    }
}
