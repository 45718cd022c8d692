//! "Why this path" (`Driver::explain_path`) and the one-time log lines when I/O leaves
//! O_DIRECT: each choice is named with its cause, on the cpu device.

use std::os::fd::AsRawFd;
use std::sync::{Mutex, OnceLock};

use hipfile_core::{Direction, OpError, RawIo};
use hipfile_runtime::HandleId;
use hipfile_runtime::config::Config;
use hipfile_runtime::explain::PathExplanation;
use hipfile_runtime::file::DirectPolicy;
use hipfile_test_support::cpu_rig::*;

/// Every log record of the process (this binary installs this logger once).
fn records() -> &'static Mutex<Vec<(log::Level, String)>> {
    struct Capture;
    impl log::Log for Capture {
        fn enabled(&self, _: &log::Metadata<'_>) -> bool {
            true
        }
        fn log(&self, record: &log::Record<'_>) {
            records().lock().unwrap().push((record.level(), record.args().to_string()));
        }
        fn flush(&self) {}
    }
    static RECORDS: OnceLock<Mutex<Vec<(log::Level, String)>>> = OnceLock::new();
    RECORDS.get_or_init(|| {
        let _ = log::set_boxed_logger(Box::new(Capture));
        log::set_max_level(log::LevelFilter::Trace);
        Mutex::new(Vec::new())
    })
}

fn logged(needle: &str) -> Vec<(log::Level, String)> {
    records().lock().unwrap().iter().filter(|(_, text)| text.contains(needle)).cloned().collect()
}

fn item<'a>(
    explanation: &'a PathExplanation,
    topic: &str,
) -> &'a hipfile_runtime::explain::PathItem {
    explanation
        .items
        .iter()
        .find(|i| i.topic == topic)
        .unwrap_or_else(|| panic!("no {topic}:\n{explanation}"))
}

#[test]
fn a_file_with_o_direct_says_which_requests_use_it_and_logs_the_first_unaligned_one() {
    let _ = records();
    let (driver, device) = driver();
    driver.open();
    let file = TempFile::new(&ext4_dir(), &pattern(MIB, 1));
    let fd = file.open_rw();
    let handle = driver.handle_register(fd.as_raw_fd()).unwrap();
    let buffer = device.malloc_device(0, MIB).unwrap();
    let explanation = driver.explain_path(Some(handle), Some(buffer)).unwrap();
    // The rig's configuration turns the fan-out under load off.
    let queued = item(&explanation, "queued requests");
    assert!(queued.text.contains("HIPFILE_LOADED_FAN_OUT=off"), "{explanation}");
    let direct = item(&explanation, "O_DIRECT");
    if !direct.text.starts_with("yes") {
        println!("skipped: {} has no O_DIRECT here: {}", ext4_dir().display(), direct.text);
        return;
    }
    assert!(direct.fast && direct.text.contains("multiples of 4096 bytes"), "{explanation}");
    assert!(item(&explanation, "buffer").text.contains("not registered"), "{explanation}");
    assert!(item(&explanation, "file").text.contains("read-write"));
    assert!(item(&explanation, "sync requests").text.contains("caller's thread"));
    assert!(item(&explanation, "async release").fast);
    assert!(explanation.all_fast(), "{explanation}");

    // An unaligned request is logged once for the handle (at info), aligned ones never.
    let fd_text = format!("fd {}:", fd.as_raw_fd());
    let raw = |offset: i64, size: u64| RawIo {
        size_bytes: size,
        file_offset_bytes: offset,
        buffer_offset_bytes: 0,
    };
    driver.io_sync(Direction::Read, handle, buffer, raw(0, 64 * 1024)).unwrap();
    assert!(logged(&fd_text).iter().all(|(_, t)| !t.contains("not aligned")));
    driver.io_sync(Direction::Read, handle, buffer, raw(100, 64 * 1024)).unwrap();
    driver.io_sync(Direction::Read, handle, buffer, raw(4196, 300 * 1024)).unwrap();
    let unaligned: Vec<_> =
        logged(&fd_text).into_iter().filter(|(_, t)| t.contains("not aligned")).collect();
    assert_eq!(unaligned.len(), 1, "{unaligned:?}");
    assert_eq!(unaligned[0].0, log::Level::Info);
    assert!(unaligned[0].1.contains("offset 100"), "{unaligned:?}");
    driver.handle_deregister(handle);
}

#[test]
fn a_file_without_o_direct_names_the_cause_and_logs_it_at_registration() {
    let _ = records();
    for (dir, policy, cause) in [
        (tmpfs_dir(), DirectPolicy::Auto, "tmpfs"),
        (ext4_dir(), DirectPolicy::Off, "HIPFILE_ODIRECT=off"),
    ] {
        let (driver, device) = driver_with(Config { direct: policy, ..config(&[0]) });
        driver.open();
        let file = TempFile::new(&dir, &pattern(64 * KIB, 2));
        let fd = file.open_rw();
        let handle = driver.handle_register(fd.as_raw_fd()).unwrap();
        let buffer = device.malloc_device(0, 64 * KIB).unwrap();
        let explanation = driver.explain_path(Some(handle), Some(buffer)).unwrap();
        let direct = item(&explanation, "O_DIRECT");
        assert!(!direct.fast && direct.text.contains(cause), "{explanation}");
        assert!(!explanation.all_fast());
        let lines = logged(&format!("fd {}: no O_DIRECT", fd.as_raw_fd()));
        assert!(lines.iter().any(|(_, t)| t.contains(cause)), "{cause}: {lines:?}");
        let level = if policy == DirectPolicy::Off { log::Level::Debug } else { log::Level::Info };
        assert!(lines.iter().any(|(l, _)| *l == level), "{cause}: {lines:?}");
        driver.handle_deregister(handle);
    }
}

#[test]
fn buffers_that_io_refuses_are_named_with_the_code() {
    let (driver, device) = driver();
    let host = vec![0u8; 4096];
    let managed = device.malloc_managed(4096).unwrap();
    for (addr, what) in [(host.as_ptr() as u64, "host memory"), (managed, "managed"), (0, "NULL")] {
        let explanation = driver.explain_path(None, Some(addr)).unwrap();
        let buffer = item(&explanation, "buffer");
        assert!(!buffer.fast && buffer.text.contains(what), "{explanation}");
        let code = if addr == 0 { "5022" } else { "5013" };
        assert!(buffer.text.contains(code), "{explanation}");
        assert!(explanation.items.iter().all(|i| i.topic != "async release"));
    }
    let registered = device.malloc_device(0, 8192).unwrap();
    driver.buf_register(registered, 8192, 0).unwrap();
    let explanation = driver.explain_path(None, Some(registered)).unwrap();
    assert!(item(&explanation, "buffer").text.starts_with("registered, 8192 bytes"));
    // Unknown handles are an error, as for I/O.
    let unknown = driver.explain_path(Some(HandleId(0x1234_5670)), None);
    assert_eq!(unknown.unwrap_err().code, OpError::HandleNotRegistered);
    // Compat mode off is named.
    let (off, _) = driver_with(Config { allow_compat_mode: false, ..config(&[0]) });
    let explanation = off.explain_path(None, None).unwrap();
    assert!(item(&explanation, "sync I/O").text.contains("HIPFILE_ALLOW_COMPAT_MODE=false"));
}

#[test]
fn a_handle_can_have_its_own_o_direct_policy() {
    let (driver, _device) = driver();
    driver.open();
    let file = TempFile::new(&ext4_dir(), &pattern(64 * KIB, 3));
    let (auto_fd, off_fd) = (file.open_rw(), file.open_rw());
    let auto = driver.handle_register(auto_fd.as_raw_fd()).unwrap();
    let off = driver.handle_register_with(off_fd.as_raw_fd(), DirectPolicy::Off).unwrap();
    let auto_text = driver.explain_path(Some(auto), None).unwrap();
    let off_text = driver.explain_path(Some(off), None).unwrap();
    let off_direct = item(&off_text, "O_DIRECT");
    assert!(!off_direct.fast && off_direct.text.contains("this handle's own policy"), "{off_text}");
    if item(&auto_text, "O_DIRECT").text.starts_with("yes") {
        assert!(driver.file(auto).unwrap().direct_fd().is_some());
    }
    assert!(driver.file(off).unwrap().direct_fd().is_none(), "no O_DIRECT descriptor");
    driver.handle_deregister(auto);
    driver.handle_deregister(off);
}

/// Under the `auto` policy a read of a range the page cache holds entirely takes the
/// page cache (a memory copy there, a trip to the device through O_DIRECT), also when
/// the range runs past the end of the file; once the pages are dropped the same reads
/// go through O_DIRECT again; under `on` they always do. Caller-thread (64 KiB) and
/// executor (3 MiB) requests alike, every byte checked.
#[test]
fn reads_of_cached_ranges_take_the_page_cache_unless_o_direct_is_forced() {
    let (driver, device) = driver();
    driver.open();
    let data = pattern(4 * MIB, 9);
    // Written through the page cache: every page of it is cached now.
    let file = TempFile::new(&ext4_dir(), &data);
    let fd = file.open_rw();
    let auto = driver.handle_register(fd.as_raw_fd()).unwrap();
    if driver.file(auto).unwrap().direct_fd().is_none() {
        println!("skipped: {} has no O_DIRECT here", ext4_dir().display());
        return;
    }
    let forced_fd = file.open_rw();
    let forced = driver.handle_register_with(forced_fd.as_raw_fd(), DirectPolicy::On).unwrap();
    let buffer = device.malloc_device(0, 4 * MIB).unwrap();
    // (file offset, size, bytes the read returns): one chunk on the caller's thread, three
    // over the executors, and one running 1 MiB past the end of the file.
    let reads = [(0, 64 * 1024, 64 * 1024), (MIB, 3 * MIB, 3 * MIB), (3 * MIB, 2 * MIB, MIB)];
    let read_all = |handle: HandleId| {
        for &(offset, size, got) in &reads {
            let raw = RawIo {
                size_bytes: size as u64,
                file_offset_bytes: offset as i64,
                buffer_offset_bytes: 0,
            };
            assert_eq!(driver.io_sync(Direction::Read, handle, buffer, raw).unwrap(), got);
            assert_eq!(device_bytes(buffer, got), &data[offset..offset + got]);
        }
    };
    let total: u64 = reads.iter().map(|r| r.2 as u64).sum();
    let counters = |handle: HandleId| driver.file(handle).unwrap().counters();

    read_all(auto);
    assert_eq!(counters(auto).direct_read_bytes, 0, "cached ranges read through O_DIRECT");
    assert_eq!(counters(auto).buffered_read_bytes, total);
    read_all(forced);
    assert_eq!(counters(forced).direct_read_bytes, total, "`on` took the page cache");

    // Dropped from the page cache: the auto handle's reads go to O_DIRECT again.
    page_cache::drop_cached_pages(&fd);
    read_all(auto);
    assert_eq!(counters(auto).direct_read_bytes, total, "uncached ranges skipped O_DIRECT");
    let explanation = driver.explain_path(Some(auto), None).unwrap();
    assert!(item(&explanation, "O_DIRECT").text.contains("page cache holds entirely"));
    let explanation = driver.explain_path(Some(forced), None).unwrap();
    assert!(!item(&explanation, "O_DIRECT").text.contains("holds entirely"));
    driver.handle_deregister(auto);
    driver.handle_deregister(forced);
    // SAFETY: our allocation; no I/O on it is in flight.
    unsafe { device.free_device(buffer) }.unwrap();
    driver.close().unwrap();
}

/// The "small async reads" line says whether small FIXED reads on an idle stream are read
/// inside the submit call: off with `HIPFILE_INLINE_READ_KB=0`, with the cap otherwise, and
/// whether the file's first byte could be read without waiting (a file just written is in
/// the page cache).
#[test]
fn small_async_reads_say_whether_they_are_read_inside_the_submit_call() {
    for (cap, expected) in [(0, "HIPFILE_INLINE_READ_KB=0"), (64 << 10, "at most 64 KiB")] {
        let (driver, _device) = driver_with(Config { inline_read_bytes: cap, ..config(&[0]) });
        driver.open();
        let file = TempFile::new(&ext4_dir(), &pattern(MIB, 2));
        let fd = file.open_rw();
        let handle = driver.handle_register(fd.as_raw_fd()).unwrap();
        let explanation = driver.explain_path(Some(handle), None).unwrap();
        let line = item(&explanation, "small async reads");
        assert!(line.fast && line.text.contains(expected), "{explanation}");
        if cap > 0 {
            assert!(!line.text.contains("not cached"), "a file just written: {explanation}");
        }
        driver.handle_deregister(handle);
    }
}
