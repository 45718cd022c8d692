//! Integration tests of `hipfile_runtime::file`: registering descriptors, our own
//! buffered / O_DIRECT descriptors and their access modes, lifecycle with ops in
//! flight, positional I/O helpers and byte counters.
//!
//! Files live under `std::env::temp_dir()` and, when it is tmpfs, `/dev/shm`; every
//! name is unique and removed on drop. Tests that check whether a descriptor *number* is
//! closed take [`fd_lock`] exclusively so no other test of this binary reuses the number
//! meanwhile; every other test that opens descriptors takes it shared.

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread;

use hipfile_core::{ChunkMode, Direction, OpError};
use hipfile_runtime::file::{
    AccessMode, DirectPolicy, FileCounters, FileHandle, FileKind, OpGuard, pread_full, pwrite_full,
};
use proptest::prelude::*;

const TMPFS_MAGIC: u64 = 0x0102_1994;

static FD_LOCK: RwLock<()> = RwLock::new(());

/// Shared: this test opens descriptors but does not check numbers for being closed.
fn fd_lock() -> RwLockReadGuard<'static, ()> {
    FD_LOCK.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Exclusive: no other test opens or closes descriptors meanwhile.
fn fd_lock_exclusive() -> RwLockWriteGuard<'static, ()> {
    FD_LOCK.write().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A file with a unique name, removed on drop.
struct TempFile {
    path: PathBuf,
}

impl TempFile {
    fn new(dir: &Path, tag: &str, contents: &[u8]) -> TempFile {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let unique = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("hipfile-file-test-{}-{tag}-{unique}", std::process::id());
        let path = dir.join(name);
        std::fs::write(&path, contents).expect("create test file");
        TempFile { path }
    }

    fn open(&self, options: &mut OpenOptions) -> File {
        options.open(&self.path).expect("open test file")
    }

    fn contents(&self) -> Vec<u8> {
        std::fs::read(&self.path).expect("read test file")
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn read_write() -> OpenOptions {
    let mut options = OpenOptions::new();
    options.read(true).write(true);
    options
}

fn read_only() -> OpenOptions {
    let mut options = OpenOptions::new();
    options.read(true);
    options
}

fn write_only() -> OpenOptions {
    let mut options = OpenOptions::new();
    options.write(true);
    options
}

/// `fstatfs(fd).f_type == TMPFS_MAGIC`.
fn is_tmpfs(file: &File) -> bool {
    let mut buf = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: `buf` is a live, writable `statfs` the kernel fills in.
    let result = unsafe { libc::fstatfs(file.as_raw_fd(), buf.as_mut_ptr()) };
    assert_eq!(result, 0, "fstatfs: {}", io::Error::last_os_error());
    // SAFETY: `statfs` is plain integers, valid zeroed, and the kernel filled it.
    let buf = unsafe { buf.assume_init() };
    u64::try_from(buf.f_type).ok() == Some(TMPFS_MAGIC)
}

/// `/dev/shm` when it exists and is tmpfs.
fn shm_dir() -> Option<PathBuf> {
    let dir = PathBuf::from("/dev/shm");
    let probe = TempFile::new(dir.is_dir().then_some(&dir)?, "probe", b"");
    is_tmpfs(&probe.open(&mut read_only())).then_some(dir)
}

/// `fcntl(fd, F_GETFL)`.
fn status_flags(fd: RawFd) -> io::Result<libc::c_int> {
    // SAFETY: F_GETFL takes no argument and touches no memory of ours.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 { Err(io::Error::last_os_error()) } else { Ok(flags) }
}

/// `true` when `fd` is an open descriptor (`fcntl(F_GETFD)` succeeds); panics on
/// errors other than EBADF.
fn fd_is_open(fd: RawFd) -> bool {
    // SAFETY: F_GETFD takes no argument and touches no memory of ours.
    let result = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    if result >= 0 {
        return true;
    }
    let error = io::Error::last_os_error();
    assert_eq!(error.raw_os_error(), Some(libc::EBADF), "F_GETFD: {error}");
    false
}

fn errno(result: io::Result<usize>) -> Option<i32> {
    result.expect_err("the call should fail").raw_os_error()
}

/// A buffer of `len_bytes` starting at a multiple of `align_bytes`, inside `storage`.
fn aligned(storage: &mut Vec<u8>, len_bytes: usize, align_bytes: usize) -> &mut [u8] {
    storage.clear();
    storage.resize(len_bytes + align_bytes, 0);
    let start = storage.as_ptr().align_offset(align_bytes);
    &mut storage[start..start + len_bytes]
}

/// `true` when the filesystem of `file` accepts an O_DIRECT open (the test's own probe).
fn accepts_o_direct(file: &TempFile) -> bool {
    OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(&file.path).is_ok()
}

fn open_handle(file: &File, policy: DirectPolicy) -> FileHandle {
    FileHandle::open(file.as_raw_fd(), policy).expect("register the file")
}

#[test]
fn handles_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<FileHandle>();
    assert_send_sync::<Arc<FileHandle>>();
    assert_send_sync::<OpGuard>();
}

#[test]
fn regular_file_in_temp_dir_gets_direct_fd_when_supported() {
    let _lock = fd_lock();
    let file = TempFile::new(&std::env::temp_dir(), "regular", &[7u8; 10_000]);
    let client = file.open(&mut read_write());
    let handle = open_handle(&client, DirectPolicy::Auto);
    let expect_direct = accepts_o_direct(&file) && !is_tmpfs(&client);
    println!("temp dir direct: {expect_direct}, alignment {:?}", handle.dio_alignment());

    assert_eq!(handle.kind(), FileKind::Regular);
    assert_eq!(handle.access(), AccessMode::ReadWrite);
    assert!(handle.can_read() && handle.can_write());
    assert_eq!(handle.client_fd(), client.as_raw_fd());
    assert_eq!(handle.size_bytes().expect("size"), 10_000);
    let metadata = client.metadata().expect("metadata");
    assert_eq!(handle.inode(), metadata.ino());
    assert_eq!(handle.device_id(), (libc::major(metadata.dev()), libc::minor(metadata.dev())));
    assert_ne!(handle.buffered_fd(), client.as_raw_fd());
    assert_eq!(handle.direct_fd().is_some(), expect_direct);
    assert_eq!(handle.dio_alignment().is_some(), handle.direct_fd().is_some());

    let (Some(direct_fd), Some(dio)) = (handle.direct_fd(), handle.dio_alignment()) else {
        return;
    };
    assert!(dio.offset_bytes.is_power_of_two() && dio.memory_bytes.is_power_of_two());
    let flags = status_flags(direct_fd).expect("F_GETFL of the direct fd");
    assert_ne!(flags & libc::O_DIRECT, 0);
    assert_eq!(status_flags(handle.buffered_fd()).expect("F_GETFL") & libc::O_DIRECT, 0);
    // Real O_DIRECT I/O with the reported alignment: write through the direct fd, read
    // back through the buffered one.
    let block_bytes = usize::try_from(dio.offset_bytes.max(dio.memory_bytes)).expect("usize");
    let mut storage = Vec::new();
    let buf = aligned(&mut storage, 2 * block_bytes, block_bytes);
    buf.iter_mut().enumerate().for_each(|(i, byte)| *byte = (i % 251) as u8);
    let expected = buf.to_vec();
    assert_eq!(pwrite_full(direct_fd, buf, dio.offset_bytes).expect("direct write"), buf.len());
    let mut back = vec![0u8; expected.len()];
    assert_eq!(pread_full(handle.buffered_fd(), &mut back, dio.offset_bytes).unwrap(), back.len());
    assert_eq!(back, expected);
    let buf = aligned(&mut storage, 2 * block_bytes, block_bytes);
    assert_eq!(pread_full(direct_fd, buf, dio.offset_bytes).expect("direct read"), buf.len());
    assert_eq!(buf, &expected[..]);
}

#[test]
fn tmpfs_file_has_no_direct_fd_and_buffered_io_works() {
    let _lock = fd_lock();
    let Some(dir) = shm_dir() else {
        println!("skipped: /dev/shm is missing or not tmpfs");
        return;
    };
    let file = TempFile::new(&dir, "tmpfs", b"hello tmpfs");
    let client = file.open(&mut read_write());
    for policy in [DirectPolicy::Auto, DirectPolicy::On] {
        let handle = open_handle(&client, policy);
        assert_eq!(handle.direct_fd(), None, "{policy:?}");
        assert_eq!(handle.dio_alignment(), None, "{policy:?}");
        assert_eq!(handle.direct_policy(), policy);
        assert_eq!(pwrite_full(handle.buffered_fd(), b"HELLO", 0).expect("write"), 5);
        let mut back = [0u8; 11];
        assert_eq!(pread_full(handle.buffered_fd(), &mut back, 0).expect("read"), 11);
        assert_eq!(&back, b"HELLO tmpfs");
    }
    assert_eq!(file.contents(), b"HELLO tmpfs");
}

/// The directories to test in: the temp dir, and `/dev/shm` when it is tmpfs.
fn test_dirs() -> Vec<PathBuf> {
    let mut dirs = vec![std::env::temp_dir()];
    dirs.extend(shm_dir());
    dirs
}

#[test]
fn read_only_client_fd_gives_read_only_fds() {
    let _lock = fd_lock();
    for dir in test_dirs() {
        let file = TempFile::new(&dir, "ro", &[1u8; 8192]);
        let client = file.open(&mut read_only());
        let handle = open_handle(&client, DirectPolicy::Auto);
        assert_eq!(handle.access(), AccessMode::ReadOnly);
        assert!(handle.can_read() && !handle.can_write());
        let mut ours = vec![handle.buffered_fd()];
        ours.extend(handle.direct_fd());
        let mut storage = Vec::new();
        for fd in ours {
            let flags = status_flags(fd).expect("F_GETFL");
            assert_eq!(flags & libc::O_ACCMODE, libc::O_RDONLY, "{dir:?}");
            let buf = aligned(&mut storage, 4096, 4096);
            buf.fill(9);
            assert_eq!(errno(pwrite_full(fd, buf, 0)), Some(libc::EBADF), "{dir:?}");
            assert_eq!(pread_full(fd, buf, 0).expect("read"), 4096);
            assert!(buf.iter().all(|&byte| byte == 1));
        }
        assert_eq!(file.contents(), vec![1u8; 8192], "the file must be unchanged");
    }
}

#[test]
fn write_only_client_fd_gives_write_only_fds() {
    let _lock = fd_lock();
    for dir in test_dirs() {
        let file = TempFile::new(&dir, "wo", &[3u8; 8192]);
        let client = file.open(&mut write_only());
        let handle = open_handle(&client, DirectPolicy::Auto);
        assert_eq!(handle.access(), AccessMode::WriteOnly);
        assert!(!handle.can_read() && handle.can_write());
        let mut ours = vec![handle.buffered_fd()];
        ours.extend(handle.direct_fd());
        let mut storage = Vec::new();
        for fd in ours {
            assert_eq!(status_flags(fd).expect("F_GETFL") & libc::O_ACCMODE, libc::O_WRONLY);
            let buf = aligned(&mut storage, 4096, 4096);
            assert_eq!(errno(pread_full(fd, buf, 0)), Some(libc::EBADF), "{dir:?}");
            buf.fill(4);
            assert_eq!(pwrite_full(fd, buf, 4096).expect("write"), 4096);
        }
        let contents = file.contents();
        assert!(contents[..4096].iter().all(|&byte| byte == 3));
        assert!(contents[4096..].iter().all(|&byte| byte == 4));
    }
}

#[test]
fn append_client_fd_does_not_make_our_writes_append() {
    let _lock = fd_lock();
    for dir in test_dirs() {
        let file = TempFile::new(&dir, "append", b"0123456789");
        let client = file.open(read_write().append(true));
        assert_ne!(status_flags(client.as_raw_fd()).unwrap() & libc::O_APPEND, 0);
        let handle = open_handle(&client, DirectPolicy::Auto);
        assert_eq!(status_flags(handle.buffered_fd()).unwrap() & libc::O_APPEND, 0);
        assert_eq!(pwrite_full(handle.buffered_fd(), b"AB", 0).expect("write"), 2);
        assert_eq!(file.contents(), b"AB23456789", "{dir:?}: written at offset 0");
        assert_eq!(handle.size_bytes().expect("size"), 10);
    }
}

#[test]
fn sync_flags_are_kept_and_other_status_flags_dropped() {
    let _lock = fd_lock();
    let file = TempFile::new(&std::env::temp_dir(), "dsync", b"data");
    let client = file.open(read_write().custom_flags(libc::O_DSYNC | libc::O_NONBLOCK));
    let handle = open_handle(&client, DirectPolicy::Auto);
    let mut ours = vec![handle.buffered_fd()];
    ours.extend(handle.direct_fd());
    for fd in ours {
        let flags = status_flags(fd).expect("F_GETFL");
        assert_ne!(flags & libc::O_DSYNC, 0, "O_DSYNC kept");
        assert_eq!(flags & libc::O_NONBLOCK, 0, "O_NONBLOCK dropped");
    }
}

#[test]
fn o_direct_client_fd_still_gets_a_buffered_fd() {
    let _lock = fd_lock();
    let file = TempFile::new(&std::env::temp_dir(), "odirect-client", &[0u8; 4096]);
    if !accepts_o_direct(&file) {
        println!("skipped: the temp dir refuses O_DIRECT");
        return;
    }
    let client = file.open(read_write().custom_flags(libc::O_DIRECT));
    let handle = open_handle(&client, DirectPolicy::Off);
    assert_eq!(status_flags(handle.buffered_fd()).unwrap() & libc::O_DIRECT, 0);
    assert_eq!(pwrite_full(handle.buffered_fd(), b"xyz", 1).expect("unaligned write"), 3);
    assert_eq!(&file.contents()[..4], b"\0xyz");
}

#[test]
fn unsupported_descriptors_are_io_not_supported() {
    let _lock = fd_lock();
    let (reader, writer) = io::pipe().expect("pipe");
    assert_eq!(
        FileHandle::open(reader.as_raw_fd(), DirectPolicy::Auto).err(),
        Some(OpError::IONotSupported)
    );
    assert_eq!(
        FileHandle::open(writer.as_raw_fd(), DirectPolicy::Auto).err(),
        Some(OpError::IONotSupported)
    );
    let dir = File::open(std::env::temp_dir()).expect("open the temp dir");
    assert_eq!(
        FileHandle::open(dir.as_raw_fd(), DirectPolicy::Auto).err(),
        Some(OpError::IONotSupported)
    );
    let file = TempFile::new(&std::env::temp_dir(), "opath", b"secret");
    let path_fd = file.open(read_only().custom_flags(libc::O_PATH));
    assert_ne!(status_flags(path_fd.as_raw_fd()).unwrap() & libc::O_PATH, 0);
    let result = FileHandle::open(path_fd.as_raw_fd(), DirectPolicy::Auto);
    assert_eq!(result.err(), Some(OpError::IONotSupported));
    assert_eq!(OpError::IONotSupported.code(), 5008);
}

#[test]
fn invalid_descriptors_are_internal_errors() {
    let _lock = fd_lock_exclusive();
    let closed_fd = {
        let file = TempFile::new(&std::env::temp_dir(), "closed", b"x");
        file.open(&mut read_only()).as_raw_fd()
    };
    assert!(!fd_is_open(closed_fd));
    for fd in [closed_fd, -1, libc::AT_FDCWD, i32::MAX] {
        let result = FileHandle::open(fd, DirectPolicy::Auto);
        assert_eq!(result.err(), Some(OpError::InternalError), "fd {fd}");
    }
    assert_eq!(OpError::InternalError.code(), 5030);
}

#[test]
fn begin_op_fails_after_deregistration_and_guards_count() {
    let _lock = fd_lock();
    let file = TempFile::new(&std::env::temp_dir(), "ops", b"abc");
    let client = file.open(&mut read_write());
    let handle = Arc::new(open_handle(&client, DirectPolicy::Auto));
    assert_eq!(handle.ops_in_flight(), 0);
    let first = handle.begin_op().expect("first op");
    let second = handle.begin_op().expect("second op");
    assert_eq!(handle.ops_in_flight(), 2);
    assert!(Arc::ptr_eq(first.handle(), &handle));
    assert_eq!(second.buffered_fd(), handle.buffered_fd(), "guards deref to the handle");
    drop(first);
    assert_eq!(handle.ops_in_flight(), 1);

    assert!(!handle.is_deregistered());
    handle.mark_deregistered();
    assert!(handle.is_deregistered());
    assert_eq!(handle.begin_op().err(), Some(OpError::HandleNotRegistered));
    assert_eq!(OpError::HandleNotRegistered.code(), 5027);
    assert_eq!(handle.ops_in_flight(), 1, "a refused op is not counted");
    let mut back = [0u8; 3];
    assert_eq!(pread_full(second.buffered_fd(), &mut back, 0).unwrap(), 3, "in-flight op works");
    drop(second);
    assert_eq!(handle.ops_in_flight(), 0);
}

#[test]
fn no_op_starts_after_mark_deregistered_returns() {
    let _lock = fd_lock();
    let file = TempFile::new(&std::env::temp_dir(), "race", b"abc");
    let client = file.open(&mut read_write());
    let handle = Arc::new(open_handle(&client, DirectPolicy::Off));
    let marked = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let (handle, marked) = (Arc::clone(&handle), Arc::clone(&marked));
            thread::spawn(move || {
                let mut refused = 0;
                while refused < 1000 {
                    let after_mark = marked.load(Ordering::SeqCst);
                    match handle.begin_op() {
                        Ok(_guard) => assert!(!after_mark, "op started after deregistration"),
                        Err(error) => {
                            assert_eq!(error, OpError::HandleNotRegistered);
                            refused += 1;
                        }
                    }
                }
            })
        })
        .collect();
    thread::sleep(std::time::Duration::from_millis(20));
    handle.mark_deregistered();
    marked.store(true, Ordering::SeqCst);
    for worker in workers {
        worker.join().expect("worker");
    }
    assert_eq!(handle.ops_in_flight(), 0);
}

#[test]
fn descriptors_close_when_the_last_arc_drops() {
    let _lock = fd_lock_exclusive();
    let file = TempFile::new(&std::env::temp_dir(), "lifecycle", &[5u8; 4096]);
    let client = file.open(&mut read_write());
    let handle = Arc::new(open_handle(&client, DirectPolicy::Auto));
    let mut ours = vec![handle.buffered_fd()];
    ours.extend(handle.direct_fd());
    let guard = handle.begin_op().expect("op");
    handle.mark_deregistered();
    drop(handle); // the registry's reference
    for &fd in &ours {
        assert!(fd_is_open(fd), "fd {fd} closed while an op is in flight");
    }
    let mut back = [0u8; 16];
    assert_eq!(pread_full(guard.buffered_fd(), &mut back, 0).expect("read"), 16);
    drop(guard); // the last op
    for &fd in &ours {
        assert!(!fd_is_open(fd), "fd {fd} still open after the last reference");
    }
    assert!(fd_is_open(client.as_raw_fd()), "the client's fd is never ours to close");
}

#[test]
fn pread_and_pwrite_full_round_trip_and_stop_at_eof() {
    let _lock = fd_lock();
    let file = TempFile::new(&std::env::temp_dir(), "rw", b"");
    let client = file.open(&mut read_write());
    let fd = client.as_raw_fd();
    let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 256) as u8).collect();
    assert_eq!(pwrite_full(fd, &data, 1000).expect("write"), data.len());
    let mut back = vec![0u8; data.len()];
    assert_eq!(pread_full(fd, &mut back, 1000).expect("read"), data.len());
    assert_eq!(back, data);
    let mut tail = vec![0xffu8; 500];
    assert_eq!(pread_full(fd, &mut tail, 100_800).expect("short read"), 200, "short at EOF");
    assert_eq!(&tail[..200], &data[99_800..]);
    assert!(tail[200..].iter().all(|&byte| byte == 0xff), "nothing past EOF is touched");
    assert_eq!(pread_full(fd, &mut tail, 1_000_000).expect("read past EOF"), 0);
    assert_eq!(pread_full(fd, &mut [], 0).expect("empty read"), 0);
    assert_eq!(pwrite_full(fd, &[], 0).expect("empty write"), 0);
    let head = pread_full(fd, &mut back[..1000], 0).expect("hole");
    assert_eq!(head, 1000);
    assert!(back[..1000].iter().all(|&byte| byte == 0), "the gap before 1000 is a hole");
    assert_eq!(errno(pread_full(fd, &mut tail, u64::MAX)), Some(libc::EINVAL));
    assert_eq!(errno(pwrite_full(fd, b"x", 1 << 63)), Some(libc::EINVAL));
    assert_eq!(errno(pread_full(i32::MAX, &mut tail, 0)), Some(libc::EBADF));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]
    #[test]
    fn pwrite_full_matches_a_model(writes in prop::collection::vec((0u64..20_000, prop::collection::vec(any::<u8>(), 0..5000)), 1..8)) {
        let _lock = fd_lock();
        let file = TempFile::new(&std::env::temp_dir(), "model", b"");
        let client = file.open(&mut read_write());
        let mut model = Vec::new();
        for (offset_bytes, data) in &writes {
            prop_assert_eq!(pwrite_full(client.as_raw_fd(), data, *offset_bytes).unwrap(), data.len());
            let start = *offset_bytes as usize;
            if !data.is_empty() {
                if model.len() < start + data.len() {
                    model.resize(start + data.len(), 0);
                }
                model[start..start + data.len()].copy_from_slice(data);
            }
        }
        let mut back = vec![0u8; model.len() + 100];
        prop_assert_eq!(pread_full(client.as_raw_fd(), &mut back, 0).unwrap(), model.len());
        prop_assert_eq!(&back[..model.len()], &model[..]);
    }
}

#[test]
fn counters_add_up_by_direction_and_mode() {
    let _lock = fd_lock();
    let file = TempFile::new(&std::env::temp_dir(), "counters", b"");
    let client = file.open(&mut read_write());
    let handle = open_handle(&client, DirectPolicy::Auto);
    assert_eq!(handle.counters(), FileCounters::default());
    handle.record_bytes(Direction::Read, ChunkMode::Direct, 4096);
    handle.record_bytes(Direction::Read, ChunkMode::Direct, 8192);
    handle.record_bytes(Direction::Read, ChunkMode::Buffered, 10);
    handle.record_bytes(Direction::Write, ChunkMode::Direct, 1 << 20);
    handle.record_bytes(Direction::Write, ChunkMode::Buffered, 3);
    handle.record_bytes(Direction::Write, ChunkMode::Buffered, 4);
    let counters = handle.counters();
    let expected = FileCounters {
        direct_read_bytes: 12_288,
        buffered_read_bytes: 10,
        direct_written_bytes: 1 << 20,
        buffered_written_bytes: 7,
    };
    assert_eq!(counters, expected);
    assert_eq!(counters.read_bytes(), 12_298);
    assert_eq!(counters.written_bytes(), (1 << 20) + 7);

    let handle = Arc::new(handle);
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let handle = Arc::clone(&handle);
            thread::spawn(move || {
                (0..1000).for_each(|_| handle.record_bytes(Direction::Read, ChunkMode::Buffered, 1))
            })
        })
        .collect();
    threads.into_iter().for_each(|thread| thread.join().expect("counter thread"));
    assert_eq!(handle.counters().buffered_read_bytes, 4010);
}

#[test]
fn direct_policy_off_never_opens_a_direct_fd() {
    let _lock = fd_lock();
    let file = TempFile::new(&std::env::temp_dir(), "policy", &[0u8; 4096]);
    let client = file.open(&mut read_write());
    let off = open_handle(&client, DirectPolicy::Off);
    assert_eq!(off.direct_fd(), None);
    assert_eq!(off.dio_alignment(), None);
    assert_eq!(off.direct_policy(), DirectPolicy::Off);
    let auto = open_handle(&client, DirectPolicy::Auto);
    let on = open_handle(&client, DirectPolicy::On);
    assert_eq!(on.direct_policy(), DirectPolicy::On);
    assert_eq!(on.direct_fd().is_some(), auto.direct_fd().is_some());
    assert_eq!(on.dio_alignment(), auto.dio_alignment());
    assert_eq!(DirectPolicy::default(), DirectPolicy::Auto);
}

#[test]
fn access_mode_from_flags() {
    assert_eq!(AccessMode::from_flags(libc::O_RDONLY), Some(AccessMode::ReadOnly));
    assert_eq!(
        AccessMode::from_flags(libc::O_WRONLY | libc::O_APPEND),
        Some(AccessMode::WriteOnly)
    );
    assert_eq!(AccessMode::from_flags(libc::O_RDWR | libc::O_DIRECT), Some(AccessMode::ReadWrite));
    assert_eq!(AccessMode::from_flags(libc::O_ACCMODE), None);
}

/// The first `/dev/loopN` block device this process can open read-only.
fn loop_device() -> Option<(PathBuf, File)> {
    (0..8).map(|n| PathBuf::from(format!("/dev/loop{n}"))).find_map(|path| {
        let file = File::open(&path).ok()?;
        let is_block =
            std::os::unix::fs::FileTypeExt::is_block_device(&file.metadata().ok()?.file_type());
        is_block.then_some((path, file))
    })
}

#[test]
fn block_device_registers_as_block_device() {
    let _lock = fd_lock();
    let Some((path, mut device)) = loop_device() else {
        println!("skipped: no /dev/loop0..7 block device can be opened read-only");
        return;
    };
    let handle = open_handle(&device, DirectPolicy::Auto);
    assert_eq!(handle.kind(), FileKind::BlockDevice, "{path:?}");
    assert_eq!(handle.access(), AccessMode::ReadOnly);
    let metadata = device.metadata().expect("metadata");
    assert_eq!(handle.inode(), metadata.ino());
    assert_eq!(handle.device_id(), (libc::major(metadata.dev()), libc::minor(metadata.dev())));
    let end_bytes = device.seek(SeekFrom::End(0)).expect("seek to the end");
    assert_eq!(handle.size_bytes().expect("BLKGETSIZE64"), end_bytes, "{path:?}");
    assert_eq!(handle.dio_alignment().is_some(), handle.direct_fd().is_some());
    if let Some(dio) = handle.dio_alignment() {
        assert!(dio.offset_bytes.is_power_of_two() && dio.memory_bytes.is_power_of_two());
    }
    println!("{path:?}: {end_bytes} bytes, direct alignment {:?}", handle.dio_alignment());
    let mut storage = Vec::new();
    let buf = aligned(&mut storage, 4096, 4096);
    assert_eq!(errno(pwrite_full(handle.buffered_fd(), buf, 0)), Some(libc::EBADF));
}
