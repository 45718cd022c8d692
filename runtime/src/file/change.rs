//! Whether data read from a file earlier is still what the file holds: a [`ChangeStamp`]
//! of its size and change times, and when they were read.

use std::os::fd::{AsRawFd, RawFd};

use super::FileHandle;
use super::descriptors::statx_fd;

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

impl FileHandle {
    /// What the kernel says about the file's last change now (see [`ChangeStamp`]);
    /// `None` when `statx` fails.
    pub(crate) fn change_stamp(&self) -> Option<ChangeStamp> {
        ChangeStamp::of(self.buffered.as_raw_fd())
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
