//! O_DIRECT for a handle: the policy (`HIPFILE_ODIRECT`), opening the O_DIRECT descriptor
//! and the file's alignment, why a handle has none, the log of a request that leaves it
//! for its alignment, and when a read of cached pages goes through the page cache instead.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering;

use hipfile_core::DioAlignment;

use super::descriptors::{reopen, same_file};
use super::{AccessMode, FileHandle, FileKind, Identity};

/// `TMPFS_MAGIC` from `<linux/magic.h>`; libc does not export it.
const TMPFS_MAGIC: u64 = 0x0102_1994;

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

impl FileHandle {
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
}

/// Our O_DIRECT descriptor and the file's alignment, `None` when there is no direct
/// path: the kernel reports a 0 or odd alignment, the file is on tmpfs (whose O_DIRECT
/// since Linux 6.6 is page-cache emulation, and EINVAL before), or the open fails.
pub(super) fn open_direct(
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
