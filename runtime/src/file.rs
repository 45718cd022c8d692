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

use std::fs::OpenOptions;
use std::io;
use std::mem::MaybeUninit;
use std::ops::Deref;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use hipfile_core::{ChunkMode, DioAlignment, Direction, OpError};

use crate::fault::{Fault, Site};

/// `statx` fields [`FileHandle::open`] needs.
const STATX_WANTED: u32 =
    libc::STATX_TYPE | libc::STATX_MODE | libc::STATX_INO | libc::STATX_DIOALIGN;

/// `BLKGETSIZE64` from `<linux/fs.h>` (`_IOR(0x12, 114, size_t)`); libc does not export it.
const BLKGETSIZE64: libc::Ioctl = libc::_IOR::<libc::size_t>(0x12, 114);

/// `TMPFS_MAGIC` from `<linux/magic.h>`; libc does not export it.
const TMPFS_MAGIC: u64 = 0x0102_1994;

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

/// Whether [`FileHandle::open`] opens an `O_DIRECT` descriptor (`HIPFILE_ODIRECT`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum DirectPolicy {
    /// Use O_DIRECT where the file supports it, except for reads of ranges the page cache
    /// holds entirely (`FileHandle::read_hits_page_cache`).
    #[default]
    Auto,
    /// O_DIRECT wherever the file supports it, cached or not; [`FileHandle::direct_policy`]
    /// lets callers report files where it was impossible. Never an error.
    On,
    /// Never open an O_DIRECT descriptor: every byte goes through the page cache.
    Off,
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

/// How long after a change the file's timestamps may still look unchanged: the kernel
/// stamps changes with its coarse clock (one tick, 1–10 ms) and may lag it by a tick. A
/// file changed less than this before a stamp was taken is *unsettled*: a later change
/// could carry the same timestamps.
const CHANGE_SETTLE_NS: i128 = 30_000_000;

/// A file's size and change times, and when they were read: data read after an equal,
/// settled stamp was taken is still what the file holds (any write since, through any
/// descriptor, moves `ctime` past the stamp). Writes through a shared mapping to pages
/// already dirty change no timestamp and are not seen.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ChangeStamp {
    size_bytes: u64,
    modified_ns: i128,
    changed_ns: i128,
    taken_ns: i128,
}

impl ChangeStamp {
    fn of(fd: RawFd) -> Option<ChangeStamp> {
        let nanoseconds =
            |t: libc::statx_timestamp| i128::from(t.tv_sec) * 1_000_000_000 + i128::from(t.tv_nsec);
        let taken = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).ok()?;
        let stx = statx_fd(fd, libc::STATX_SIZE | libc::STATX_MTIME | libc::STATX_CTIME).ok()?;
        Some(ChangeStamp {
            size_bytes: stx.stx_size,
            modified_ns: nanoseconds(stx.stx_mtime),
            changed_ns: nanoseconds(stx.stx_ctime),
            taken_ns: taken.as_nanos() as i128,
        })
    }

    /// Whether data read after `self` was taken is still the file's, judging by `now`:
    /// the same size and times, and the last change well before `self` was taken.
    pub(crate) fn still_holds(&self, now: &ChangeStamp) -> bool {
        let settled = self.changed_ns.max(self.modified_ns) + CHANGE_SETTLE_NS < self.taken_ns;
        settled
            && (self.size_bytes, self.modified_ns, self.changed_ns)
                == (now.size_bytes, now.modified_ns, now.changed_ns)
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

/// Why a handle has no O_DIRECT descriptor (every byte of it goes through the page
/// cache).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum NoDirectReason {
    /// The policy said so: `HIPFILE_ODIRECT=off`, or this handle's own policy
    /// ([`crate::Driver::handle_register_with`]).
    PolicyOff,
    /// The filesystem reports no usable O_DIRECT alignment (`statx` DIOALIGN 0).
    FilesystemHasNone,
    /// The file is on tmpfs (O_DIRECT opens there but only adds copies).
    Tmpfs,
    /// Opening the file with O_DIRECT failed with this errno.
    OpenRefused(i32),
    /// The O_DIRECT open reached another file (the path was replaced meanwhile).
    OtherFile,
}

impl std::fmt::Display for NoDirectReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NoDirectReason::PolicyOff => {
                write!(f, "turned off: HIPFILE_ODIRECT=off, or this handle's own policy")
            }
            NoDirectReason::FilesystemHasNone => {
                write!(f, "the filesystem reports no O_DIRECT alignment (statx DIOALIGN)")
            }
            NoDirectReason::Tmpfs => write!(f, "the file is on tmpfs (page cache only)"),
            NoDirectReason::OpenRefused(errno) => write!(
                f,
                "opening it with O_DIRECT failed: {}",
                io::Error::from_raw_os_error(*errno)
            ),
            NoDirectReason::OtherFile => write!(f, "the O_DIRECT open reached another file"),
        }
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

    /// Whether a read of `[offset_bytes, offset_bytes + len_bytes)` should go through
    /// the page cache although the file has O_DIRECT: under [`DirectPolicy::Auto`], when
    /// the page cache holds every page of the range (up to the end of the file). A
    /// buffered read of cached pages is a memory copy, while an O_DIRECT read goes to the
    /// device: on the H200 machine a hot 4 GiB checkpoint read through O_DIRECT came at
    /// the disk's 2 GiB/s. One `cachestat` call (`mmap` + `mincore` on older kernels);
    /// `false` when the check fails.
    pub(crate) fn read_hits_page_cache(&self, offset_bytes: u64, len_bytes: u64) -> bool {
        if self.policy != DirectPolicy::Auto || self.direct.is_none() || len_bytes == 0 {
            return false;
        }
        let fd = self.buffered_fd();
        match crate::sys::cached_pages(fd, offset_bytes, len_bytes) {
            Ok((cached, pages)) if cached >= pages => true,
            // Pages past the end of the file are never cached: count up to the end only.
            Ok((cached, _)) if cached > 0 => self.size_bytes().is_ok_and(|size| {
                let end = (offset_bytes + len_bytes).min(size);
                end > offset_bytes
                    && crate::sys::cached_pages(fd, offset_bytes, end - offset_bytes)
                        .is_ok_and(|(cached, pages)| cached >= pages)
            }),
            _ => false,
        }
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

    /// What the kernel says about the file's last change now (see [`ChangeStamp`]);
    /// `None` when `statx` fails.
    pub(crate) fn change_stamp(&self) -> Option<ChangeStamp> {
        ChangeStamp::of(self.buffered.as_raw_fd())
    }

    /// Our buffered (page cache) descriptor.
    ///
    /// Public for the integration tests; embedders do not need it.
    pub fn buffered_fd(&self) -> RawFd {
        self.buffered.as_raw_fd()
    }

    /// Our O_DIRECT descriptor; `None` when the filesystem does not support O_DIRECT
    /// (tmpfs included, whose O_DIRECT is page-cache emulation) or the policy is `Off`.
    pub fn direct_fd(&self) -> Option<RawFd> {
        self.direct.as_ref().map(AsRawFd::as_raw_fd)
    }

    /// O_DIRECT alignment of the file; `None` exactly when [`FileHandle::direct_fd`] is.
    ///
    /// Public for the integration tests; embedders do not need it.
    pub fn dio_alignment(&self) -> Option<DioAlignment> {
        self.dio
    }

    /// The policy the handle was opened with.
    ///
    /// Public for the integration tests; embedders do not need it.
    pub fn direct_policy(&self) -> DirectPolicy {
        self.policy
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

    /// Why the handle has no O_DIRECT descriptor (`None` when it has one).
    pub(crate) fn no_direct_reason(&self) -> Option<NoDirectReason> {
        self.no_direct
    }

    /// Logs once per handle (at `info`) that a request at `offset_bytes` of
    /// `len_bytes` left O_DIRECT for the page cache because of its alignment.
    pub(crate) fn note_unaligned_request(&self, offset_bytes: u64, len_bytes: u64) {
        if let Some(dio) = self.dio
            && !self.logged_unaligned.swap(true, Ordering::Relaxed)
        {
            log::info!(
                "fd {}: a request of {len_bytes} bytes at offset {offset_bytes} is not aligned for \
                 O_DIRECT (file offsets and lengths in multiples of {} bytes, offsets also of the \
                 page): its unaligned part goes through the page cache (logged once per handle)",
                self.client_fd,
                dio.offset_bytes
            );
        }
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
        None => Ok(Some(wanted)),
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

/// Regular file or block device, [`OpError::IONotSupported`] for anything else.
fn file_kind(stx: &libc::statx) -> Result<FileKind, OpError> {
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
fn open_buffered(
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

/// Our O_DIRECT descriptor and the file's alignment, `None` when there is no direct
/// path: the kernel reports a 0 or odd alignment, the file is on tmpfs (whose O_DIRECT
/// since Linux 6.6 is page-cache emulation, and EINVAL before), or the open fails.
fn open_direct(
    fd: RawFd,
    access: AccessMode,
    sync_flags: libc::c_int,
    kind: FileKind,
    stx: &libc::statx,
    buffered: &OwnedFd,
    identity: Identity,
) -> Result<(OwnedFd, DioAlignment), NoDirectReason> {
    let dio = if stx.stx_mask & libc::STATX_DIOALIGN != 0 {
        let dio = DioAlignment {
            offset_bytes: u64::from(stx.stx_dio_offset_align),
            memory_bytes: u64::from(stx.stx_dio_mem_align),
        };
        // A reported 0 means "no O_DIRECT"; anything but a power of two is unusable.
        if !dio.offset_bytes.is_power_of_two() || !dio.memory_bytes.is_power_of_two() {
            return Err(NoDirectReason::FilesystemHasNone);
        }
        dio
    } else {
        DioAlignment::DEFAULT
    };
    if kind == FileKind::Regular && on_tmpfs(buffered) {
        return Err(NoDirectReason::Tmpfs);
    }
    let owned = reopen(fd, access, sync_flags | libc::O_DIRECT)
        .map_err(|e| NoDirectReason::OpenRefused(e.raw_os_error().unwrap_or(libc::EINVAL)))?;
    if same_file(&owned, identity) { Ok((owned, dio)) } else { Err(NoDirectReason::OtherFile) }
}

/// Opens `/proc/self/fd/{fd}` with exactly `access`, `O_CLOEXEC` and `extra_flags`.
fn reopen(fd: RawFd, access: AccessMode, extra_flags: libc::c_int) -> io::Result<OwnedFd> {
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
fn same_file(owned: &OwnedFd, identity: Identity) -> bool {
    statx_fd(owned.as_raw_fd(), libc::STATX_INO).is_ok_and(|stx| Identity::of(&stx) == identity)
}

/// `true` when `owned` is on tmpfs (`fstatfs` failing counts as "no").
fn on_tmpfs(owned: &OwnedFd) -> bool {
    let mut buf = MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: `buf` is a live, writable `statfs` the kernel fills in.
    let result = unsafe { libc::fstatfs(owned.as_raw_fd(), buf.as_mut_ptr()) };
    if result != 0 {
        return false;
    }
    // SAFETY: `statfs` is plain integers, valid zeroed, and the kernel filled it.
    let buf = unsafe { buf.assume_init() };
    u64::try_from(buf.f_type).ok() == Some(TMPFS_MAGIC)
}

/// `statx(fd, "", AT_EMPTY_PATH, mask)`.
fn statx_fd(fd: RawFd, mask: u32) -> io::Result<libc::statx> {
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
fn fcntl_getfl(fd: RawFd) -> io::Result<libc::c_int> {
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
fn block_device_size_bytes(fd: RawFd) -> io::Result<u64> {
    let mut size_bytes: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which points to a live
    // local.
    let result = unsafe { libc::ioctl(fd, BLKGETSIZE64, &raw mut size_bytes) };
    if result < 0 { Err(io::Error::last_os_error()) } else { Ok(size_bytes) }
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

#[cfg(test)]
mod change_stamp_tests {
    use super::*;

    const SECOND_NS: i128 = 1_000_000_000;

    fn stamp(size_bytes: u64, changed_ns: i128, taken_ns: i128) -> ChangeStamp {
        ChangeStamp { size_bytes, modified_ns: changed_ns, changed_ns, taken_ns }
    }

    #[test]
    fn a_settled_unchanged_file_still_holds() {
        let then = stamp(4096, 100 * SECOND_NS, 101 * SECOND_NS);
        assert!(then.still_holds(&stamp(4096, 100 * SECOND_NS, 102 * SECOND_NS)));
    }

    #[test]
    fn a_change_of_size_or_time_is_seen() {
        let then = stamp(4096, 100 * SECOND_NS, 101 * SECOND_NS);
        assert!(!then.still_holds(&stamp(8192, 100 * SECOND_NS, 102 * SECOND_NS)));
        assert!(!then.still_holds(&stamp(4096, 101 * SECOND_NS + 5, 102 * SECOND_NS)));
        let touched = ChangeStamp { modified_ns: 100 * SECOND_NS + 1, ..then };
        assert!(!then.still_holds(&touched));
    }

    #[test]
    fn a_file_changed_just_before_the_stamp_is_never_trusted() {
        // Changed 10 ms before the stamp: a later change in the same clock tick could
        // leave the times as they were.
        let then = stamp(4096, 100 * SECOND_NS, 100 * SECOND_NS + 10_000_000);
        assert!(!then.still_holds(&then));
    }

    #[test]
    fn a_stamp_of_a_real_file_changes_when_it_is_written() {
        use std::io::Write;
        let path = std::env::temp_dir().join(format!("hf-stamp-{}", std::process::id()));
        let mut file = std::fs::File::create(&path).unwrap();
        file.write_all(&[1; 4096]).unwrap();
        let before = ChangeStamp::of(file.as_raw_fd()).unwrap();
        file.write_all(&[2; 10]).unwrap();
        let after = ChangeStamp::of(file.as_raw_fd()).unwrap();
        assert_eq!(after.size_bytes, 4106);
        assert!(!before.still_holds(&after));
        std::fs::remove_file(&path).unwrap();
    }
}
