//! The device-contract suite: the same tests against whichever backend
//! `HIPFILE_DEVICE` selects (`cpu` by default here; `cuda` on an NVIDIA machine;
//! `rocm` on AMD). It checks the `Device` contract the engine relies on, then the
//! library end to end (sync and stream-ordered async I/O, deferred binding on a paused
//! stream, FIFO, several streams into one buffer, failures that must not hang).
//!
//! Run on a GPU machine: `HIPFILE_DEVICE=cuda ./device_contract-<hash> --test-threads=1`.

use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use hipfile_core::{Direction, OpError};
use hipfile_runtime::config::{CallerThread, Config, DeviceSelection};
use hipfile_runtime::device::user::{StreamGate, UserDevice};
use hipfile_runtime::device::{
    Device, DeviceError, DeviceKind, EventHandle, InternalStream, MemoryType, StreamHandle,
};
use hipfile_runtime::driver::process::open_device;
use hipfile_runtime::{AsyncParams, Driver, HandleId};

fn selection() -> DeviceSelection {
    match std::env::var("HIPFILE_DEVICE").as_deref() {
        Ok("cuda") => DeviceSelection::Cuda,
        Ok("rocm") => DeviceSelection::Rocm,
        Ok("auto") => DeviceSelection::Auto,
        _ => DeviceSelection::Cpu,
    }
}

/// The selected backend; `None` (after printing why) when `HIPFILE_DEVICE=rocm` finds no
/// AMD GPU (rocm feature built), so that the test skips. Any other unavailable backend
/// fails the test.
fn device() -> Option<Arc<dyn UserDevice>> {
    match open_device(selection(), 1) {
        Ok(device) => Some(device),
        Err(reason) if cfg!(feature = "rocm") && selection() == DeviceSelection::Rocm => {
            println!("skipped: HIPFILE_DEVICE=rocm: {reason}");
            None
        }
        Err(reason) => panic!("HIPFILE_DEVICE={:?} unavailable: {reason}", selection()),
    }
}

/// Host staging for test data, pinned so copies are truly asynchronous.
struct Pinned {
    device: Arc<dyn UserDevice>,
    region: hipfile_runtime::device::PinnedRegion,
}

impl Pinned {
    fn new(device: &Arc<dyn UserDevice>, len: usize) -> Pinned {
        Pinned { device: Arc::clone(device), region: device.alloc_pinned(len.max(1)).unwrap() }
    }

    #[allow(clippy::mut_from_ref, reason = "device-visible memory: the test synchronizes access")]
    fn bytes(&self) -> &mut [u8] {
        // SAFETY: the region is live pinned memory of len_bytes, used by one test thread
        // at a time between synchronizations.
        unsafe { std::slice::from_raw_parts_mut(self.region.host_ptr, self.region.len_bytes) }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: every copy using the region was synchronized by the test.
        unsafe { self.device.free_pinned(self.region) };
    }
}

fn download(device: &Arc<dyn UserDevice>, addr: u64, len: usize) -> Vec<u8> {
    let stream = device.create_user_stream(0).unwrap();
    let host = Pinned::new(device, len);
    // SAFETY: host is pinned and len long; addr..addr+len is device memory of the test.
    unsafe { device.copy_from_device_on(stream, host.region.host_ptr, addr, len).unwrap() };
    device.synchronize_stream(stream).unwrap();
    device.destroy_user_stream(stream).unwrap();
    host.bytes()[..len].to_vec()
}

fn upload(device: &Arc<dyn UserDevice>, addr: u64, data: &[u8]) {
    let stream = device.create_user_stream(0).unwrap();
    let host = Pinned::new(device, data.len());
    host.bytes()[..data.len()].copy_from_slice(data);
    // SAFETY: as in download.
    unsafe { device.copy_to_device_on(stream, addr, host.region.host_ptr, data.len()).unwrap() };
    device.synchronize_stream(stream).unwrap();
    device.destroy_user_stream(stream).unwrap();
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

struct TempFile {
    path: PathBuf,
    file: std::fs::File,
}

impl TempFile {
    /// A new file named after `name` and unique in the process: tests that run at once
    /// (the two sync round trips share a body) never share a file.
    fn new(name: &str, data: &[u8]) -> TempFile {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let unique = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("hf-contract-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{name}-{unique}"));
        std::fs::write(&path, data).unwrap();
        let file = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
        TempFile { path, file }
    }

    fn read_only(&self) -> std::fs::File {
        std::fs::File::open(&self.path).unwrap()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn driver(device: &Arc<dyn UserDevice>) -> Arc<Driver> {
    driver_with(device, CallerThread::Small)
}

/// [`driver`] with sync requests moved on the caller's thread as `caller_thread` says.
fn driver_with(device: &Arc<dyn UserDevice>, caller_thread: CallerThread) -> Arc<Driver> {
    let mut config = Config { caller_thread, ..Config::default() };
    config.executor_cpus = hipfile_runtime::config::usable_cpus().into_iter().take(4).collect();
    config.request_parallelism = config.executor_cpus.len();
    config.staging_per_executor_bytes = 16 << 20;
    config.staging_chunk_bytes = 1 << 20;
    let base: Arc<dyn Device> = Arc::clone(device) as Arc<dyn Device>;
    let driver = Driver::new(config, base);
    driver.open();
    driver
}

/// Fails the process with a diagnosis if the test outlives `seconds` (a hang guard only).
struct Watchdog(Arc<std::sync::atomic::AtomicBool>);

impl Watchdog {
    fn start(seconds: u64, diagnose: impl FnOnce() -> String + Send + 'static) -> Watchdog {
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = Arc::clone(&done);
        std::thread::spawn(move || {
            for _ in 0..seconds * 10 {
                std::thread::sleep(std::time::Duration::from_millis(100));
                if flag.load(Ordering::SeqCst) {
                    return;
                }
            }
            eprintln!("WATCHDOG: hung after {seconds} s: {}", diagnose());
            std::process::exit(3);
        });
        Watchdog(done)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[test]
fn contract_pointer_info_classifies_memory() {
    let Some(device) = device() else { return };
    let addr = device.alloc_device(0, 1 << 20).unwrap();
    let info = device.pointer_info(addr + 4096).unwrap();
    assert_eq!(info.memory_type, MemoryType::Device);
    assert_eq!(info.allocation_base, addr);
    assert!(info.allocation_len_bytes >= 1 << 20);
    let pinned = Pinned::new(&device, 4096);
    assert_eq!(
        device.pointer_info(pinned.region.host_ptr as u64).unwrap().memory_type,
        MemoryType::Host
    );
    let plain = vec![0u8; 4096];
    let info = device.pointer_info(plain.as_ptr() as u64).unwrap();
    assert_eq!((info.memory_type, info.allocation_len_bytes), (MemoryType::Host, 0));
    // SAFETY: no work uses the allocation.
    unsafe { device.free_device(addr).unwrap() };
}

#[test]
fn contract_copies_events_and_internal_streams() {
    let Some(device) = device() else { return };
    let data = pattern(3 << 20, 1);
    let addr = device.alloc_device(0, data.len()).unwrap();
    let stream = device.create_internal_stream(0).unwrap();
    let source = Pinned::new(&device, data.len());
    source.bytes().copy_from_slice(&data);
    // SAFETY: pinned source and device target of the right length, synchronized below.
    unsafe {
        device.copy_to_device_async(&stream, addr, source.region.host_ptr, data.len()).unwrap()
    };
    let event = device.record_event(&stream).unwrap();
    while !device.event_done(&event).unwrap() {
        std::hint::spin_loop();
    }
    device.destroy_event(event);
    let target = Pinned::new(&device, data.len());
    // SAFETY: as above.
    unsafe {
        device.copy_from_device_async(&stream, target.region.host_ptr, addr, data.len()).unwrap()
    };
    device.synchronize_internal(&stream).unwrap();
    assert!(target.bytes() == &data[..]);
    device.destroy_internal_stream(stream);
    // SAFETY: synchronized.
    unsafe { device.free_device(addr).unwrap() };
}

/// Copies on the user's own stream (`HIPFILE_STREAM_COPIES`), where the backend has them:
/// host → device and device → host from pinned memory, and device → device out of the
/// engine's own memory where it has that, each run in stream order — behind a held gate
/// nothing is copied, after its release every byte lands. A backend without them says so.
#[test]
fn contract_copies_on_user_streams_run_in_stream_order() {
    let Some(device) = device() else { return };
    if !device.copies_on_user_streams() {
        let host = Pinned::new(&device, 4096);
        let stream = device.create_user_stream(0).unwrap();
        // SAFETY: a live pinned page; the backend refuses before touching anything.
        let refused = unsafe {
            device.copy_on_stream(stream, Direction::Read, 0, host.region.host_ptr, 4096)
        };
        assert_code(refused, DeviceError::HIP_ERROR_NOT_SUPPORTED, "copy_on_stream");
        device.destroy_user_stream(stream).unwrap();
        println!("skipped: this backend does not copy on user streams");
        return;
    }
    let len = (1 << 20) + 4096;
    let data = pattern(len, 21);
    let target = device.alloc_device(0, len).unwrap();
    upload(&device, target, &vec![0xEE; len]);
    let source = Pinned::new(&device, len);
    source.bytes().copy_from_slice(&data);
    let back = Pinned::new(&device, len);
    let stream = device.create_user_stream(0).unwrap();
    let gate = StreamGate::pause(&device, stream).unwrap();
    // SAFETY: pinned memory of this device and a device range of `len`, all live until
    // the stream is synchronized below.
    unsafe {
        device
            .copy_on_stream(stream, Direction::Read, target, source.region.host_ptr, len)
            .unwrap();
        device.copy_on_stream(stream, Direction::Write, target, back.region.host_ptr, len).unwrap();
    }
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert!(back.bytes().iter().all(|&b| b == 0), "copied past a closed gate");
    gate.release();
    device.synchronize_stream(stream).unwrap();
    assert!(back.bytes() == &data[..], "host → device → host in stream order");
    match device.alloc_engine_device(0, len) {
        Ok(engine_memory) => {
            let other = pattern(len, 22);
            let staging = device.create_internal_stream(0).unwrap();
            source.bytes().copy_from_slice(&other);
            // SAFETY: as above; the engine memory lives until freed below.
            unsafe {
                device
                    .copy_to_device_async(&staging, engine_memory, source.region.host_ptr, len)
                    .unwrap();
                device.synchronize_internal(&staging).unwrap();
                device.copy_device_on_stream(stream, target, engine_memory, len).unwrap();
            }
            device.synchronize_stream(stream).unwrap();
            assert_eq!(download(&device, target, len), other, "device → device on the stream");
            device.destroy_internal_stream(staging);
            // SAFETY: every copy out of it was synchronized.
            unsafe { device.free_engine_device(0, engine_memory) };
        }
        Err(error) => println!("no engine device memory here ({error}): device slots stay pinned"),
    }
    device.destroy_user_stream(stream).unwrap();
    // SAFETY: synchronized.
    unsafe { device.free_device(target).unwrap() };
}

/// Asserts that `result` failed with the `hipError_t` `code`.
fn assert_code<T: std::fmt::Debug>(result: Result<T, DeviceError>, code: i32, what: &str) {
    match result {
        Err(error) => assert_eq!(error.hip_error, code, "{what}: {error}"),
        Ok(value) => panic!("{what}: expected hipError {code}, got Ok({value:?})"),
    }
}

#[test]
fn contract_handles_not_made_by_the_device_are_refused() {
    let Some(device) = device() else { return };
    let invalid = DeviceError::HIP_ERROR_INVALID_HANDLE;
    let addr = device.alloc_device(0, 4096).unwrap();
    let pinned = Pinned::new(&device, 4096);
    let host = pinned.region.host_ptr;
    // Raw values no device made: the cpu device knows no such id, the GPU backends refuse
    // a handle without their owner id before they look at the raw value.
    let forged = InternalStream::from_raw(usize::MAX);
    let forged_event = EventHandle::from_raw(usize::MAX);
    assert_code(device.synchronize_internal(&forged), invalid, "forged stream: synchronize");
    assert_code(device.record_event(&forged), invalid, "forged stream: record_event");
    assert_code(device.event_done(&forged_event), invalid, "forged event: event_done");
    // SAFETY: refused before anything is enqueued (and the ranges are live anyway).
    unsafe {
        let copied = device.copy_to_device_async(&forged, addr, host, 4);
        assert_code(copied, invalid, "forged stream: copy to device");
        let copied = device.copy_from_device_async(&forged, host, addr, 4);
        assert_code(copied, invalid, "forged stream: copy from device");
        let written = device.write_value32_internal(&forged, pinned.region.device_addr, 1);
        assert_code(written, invalid, "forged stream: write value");
    }
    device.destroy_event(forged_event);
    device.destroy_internal_stream(forged);

    let stream = device.create_internal_stream(0).unwrap();
    let event = device.record_event(&stream).unwrap();
    if device.kind() != DeviceKind::Cpu {
        // A GPU backend's raw value is the address of its entry: a copy of a live handle's
        // raw value is refused, and destroying it leaves the real handle working.
        let copy = InternalStream::from_raw(stream.raw());
        assert_code(device.synchronize_internal(&copy), invalid, "copied stream: synchronize");
        assert_code(device.record_event(&copy), invalid, "copied stream: record_event");
        device.destroy_internal_stream(copy);
        let event_copy = EventHandle::from_raw(event.raw());
        assert_code(device.event_done(&event_copy), invalid, "copied event: event_done");
        device.destroy_event(event_copy);
    }
    // Another device object of the same backend refuses this one's handles (the cpu
    // device: its registry knows no such id).
    let other = open_device(selection(), 1).unwrap();
    assert_code(other.synchronize_internal(&stream), invalid, "other device: synchronize");
    assert_code(other.event_done(&event), invalid, "other device: event_done");
    // The real handles still work.
    device.synchronize_internal(&stream).unwrap();
    assert!(device.event_done(&event).unwrap(), "an event of a synchronized stream is done");
    device.destroy_event(event);
    device.destroy_internal_stream(stream);
    drop(pinned);
    // SAFETY: nothing was enqueued on the memory.
    unsafe { device.free_device(addr).unwrap() };
}

#[test]
fn contract_wait_value_blocks_until_released_and_host_functions_run_in_order() {
    let Some(device) = device() else { return };
    assert!(device.supports_stream_memops(0), "the protocol needs 32-bit stream memops");
    let stream = device.create_user_stream(0).unwrap();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let gate = StreamGate::pause(&device, stream).unwrap();
    for i in 0..100 {
        let order = Arc::clone(&order);
        device.launch_closure(stream, Box::new(move || order.lock().unwrap().push(i))).unwrap();
    }
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(order.lock().unwrap().is_empty(), "work ran past a closed gate");
    assert!(!device.stream_done(stream).unwrap(), "a held stream is not done");
    gate.release();
    device.synchronize_stream(stream).unwrap();
    assert!(device.stream_done(stream).unwrap(), "a synchronized stream is done");
    assert_eq!(*order.lock().unwrap(), (0..100).collect::<Vec<_>>());
    // A write-value on an internal stream releases a wait on a user stream.
    let word = device.alloc_pinned(4096).unwrap();
    // SAFETY: fresh pinned word.
    unsafe { word.host_ptr.cast::<u32>().write_volatile(0) };
    let ran = Arc::new(AtomicU32::new(0));
    // SAFETY: the word outlives the waits (freed after synchronize).
    unsafe { device.stream_wait_value32(stream, word.device_addr, 7).unwrap() };
    let flag = Arc::clone(&ran);
    device.launch_closure(stream, Box::new(move || flag.store(1, Ordering::SeqCst))).unwrap();
    let internal = device.create_internal_stream(0).unwrap();
    // SAFETY: live word.
    unsafe { device.write_value32_internal(&internal, word.device_addr, 7).unwrap() };
    device.synchronize_stream(stream).unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    device.synchronize_internal(&internal).unwrap();
    device.destroy_internal_stream(internal);
    // SAFETY: both streams synchronized.
    unsafe { device.free_pinned(word) };
}

/// The streams the device makes for the application (`create_user_stream`: non-blocking on
/// CUDA and HIP) do not wait for the NULL stream's work, and neither does the NULL stream
/// itself (reads inside the submit call on a stream that follows the NULL stream also need
/// the NULL stream idle: `async_op::inline_read`).
#[test]
fn contract_user_streams_do_not_follow_the_null_stream() {
    let Some(device) = device() else { return };
    let stream = device.create_user_stream(0).unwrap();
    assert!(!device.stream_follows_null_stream(stream).unwrap(), "a user stream");
    assert!(!device.stream_follows_null_stream(StreamHandle::NULL).unwrap(), "the NULL stream");
    device.destroy_user_stream(stream).unwrap();
}

#[test]
fn library_sync_read_write_round_trip() {
    sync_read_write_round_trip(CallerThread::Small);
}

/// The same requests, every one moved on the calling thread chunk by chunk
/// (`HIPFILE_CALLER_THREAD=always`): on CUDA, one `copy_now` per chunk.
#[test]
fn library_sync_read_write_round_trip_on_the_caller_thread() {
    sync_read_write_round_trip(CallerThread::Always);
}

fn sync_read_write_round_trip(caller_thread: CallerThread) {
    let Some(device) = device() else { return };
    let driver = driver_with(&device, caller_thread);
    let data = pattern((9 << 20) + 333, 2);
    let file = TempFile::new("sync", &data);
    let handle = driver.handle_register(file.file.as_raw_fd()).unwrap();
    let addr = device.alloc_device(0, 16 << 20).unwrap();
    for (file_offset, buffer_offset, size) in
        [(0, 0, data.len()), (1, 3, 5 << 20), (4096, 0, 1 << 20)]
    {
        let raw = hipfile_core::RawIo {
            size_bytes: size as u64,
            file_offset_bytes: file_offset as i64,
            buffer_offset_bytes: buffer_offset as i64,
        };
        let n = driver.io_sync(Direction::Read, handle, addr, raw).unwrap();
        let expected = size.min(data.len() - file_offset);
        assert_eq!(n, expected);
        let got = download(&device, addr + buffer_offset as u64, n);
        assert!(
            got == data[file_offset..file_offset + n],
            "read {file_offset}/{buffer_offset}/{size}"
        );
    }
    let fresh = pattern(2 << 20, 3);
    upload(&device, addr, &fresh);
    let raw = hipfile_core::RawIo {
        size_bytes: fresh.len() as u64,
        file_offset_bytes: 12345,
        buffer_offset_bytes: 0,
    };
    assert_eq!(driver.io_sync(Direction::Write, handle, addr, raw).unwrap(), fresh.len());
    let back = std::fs::read(&file.path).unwrap();
    assert!(back[12345..12345 + fresh.len()] == fresh[..]);
    let stats = driver.engine().unwrap().stats();
    // Every request above is larger than a chunk but the last read (1 MiB at 4096), which
    // a device that copies on callers' threads at all (every backend but rocm) moves
    // there anyway; under `always` all four go there, three of them large.
    let on_caller = selection() != DeviceSelection::Rocm;
    let always = caller_thread == CallerThread::Always;
    let (requests, large) = match (on_caller, always) {
        (false, _) => (0, 0),
        (true, false) => (1, 0),
        (true, true) => (4, 3),
    };
    assert_eq!(stats.caller_thread_requests, requests, "{stats:?}");
    assert_eq!(stats.caller_thread_large_requests, large, "{stats:?}");
    driver.handle_deregister(handle);
}

fn register(driver: &Arc<Driver>, file: &std::fs::File) -> HandleId {
    driver.handle_register(file.as_raw_fd()).unwrap()
}

#[test]
fn library_async_deferred_binding_on_a_paused_stream() {
    let Some(device) = device() else { return };
    let driver = driver(&device);
    let data = pattern(4 << 20, 4);
    let file = TempFile::new("deferred", &data);
    let handle = register(&driver, &file.file);
    let addr = device.alloc_device(0, 4 << 20).unwrap();
    for flags in [0u32, 7] {
        let stream = device.create_user_stream(0).unwrap();
        driver.stream_register(stream, flags).unwrap();
        upload(&device, addr, &vec![0u8; 4 << 20]);
        let params = AsyncParams::new(1 << 20, 0);
        let gate = StreamGate::pause(&device, stream).unwrap();
        driver.submit_async(Direction::Read, handle, addr, &params, stream).unwrap();
        params.size_bytes.store((1 << 20) - 4096, Ordering::SeqCst);
        params.file_offset_bytes.store(8192, Ordering::SeqCst);
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(params.bytes_done.load(Ordering::SeqCst), 0);
        gate.release();
        device.synchronize_stream(stream).unwrap();
        let (size, offset) = if flags == 7 { (1 << 20, 0) } else { ((1 << 20) - 4096, 8192) };
        assert_eq!(params.bytes_done.load(Ordering::SeqCst), size as isize, "flags {flags}");
        let got = download(&device, addr, 1 << 20);
        assert!(got[..size] == data[offset..offset + size], "flags {flags}");
        assert!(got[size..].iter().all(|&b| b == 0), "bytes past the bound size were written");
        driver.stream_deregister(stream).unwrap();
        device.destroy_user_stream(stream).unwrap();
    }
}

#[test]
fn library_async_fifo_and_later_stream_work_sees_the_result() {
    let Some(device) = device() else { return };
    let driver = driver(&device);
    let data = pattern(2 << 20, 5);
    let file = TempFile::new("fifo", &data);
    let handle = register(&driver, &file.file);
    let addr = device.alloc_device(0, 2 << 20).unwrap();
    let stream = device.create_user_stream(0).unwrap();
    // The gate opens from another thread after a while: CUDA blocks an enqueue once a
    // blocked stream holds ~100 commands (measured on the H200: the 56th op's host
    // function + wait), so a test that holds the gate while it submits 64 ops would
    // deadlock itself. Submission may wait for the stream to drain; it must not hang.
    let gate = StreamGate::pause(&device, stream).unwrap();
    let opener = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(300));
        gate.release();
    });
    let ops: Vec<_> = (0..64).map(|i| AsyncParams::new(32 << 10, i * (32 << 10))).collect();
    let submitted = Arc::new(AtomicUsize::new(0));
    let released = Arc::new(AtomicUsize::new(0));
    let (watched, count, gate_open) = (ops.clone(), Arc::clone(&submitted), Arc::clone(&released));
    let stats_driver = Arc::clone(&driver);
    let _watchdog = Watchdog::start(20, move || {
        let pending: Vec<_> = watched
            .iter()
            .enumerate()
            .filter(|(_, p)| p.bytes_done.load(Ordering::SeqCst) != 32 << 10)
            .map(|(i, p)| (i, p.bytes_done.load(Ordering::SeqCst)))
            .collect();
        format!(
            "submitted {} of 64, gate released {}; ops not done (index, bytes): {pending:?}; \
             async {:?}; engine {:?}",
            count.load(Ordering::SeqCst),
            gate_open.load(Ordering::SeqCst),
            stats_driver.async_stats(),
            stats_driver.engine().map(|e| e.stats())
        )
    });
    for (i, params) in ops.iter().enumerate() {
        params.buffer_offset_bytes.store((i * (32 << 10)) as i64, Ordering::SeqCst);
        driver.submit_async(Direction::Read, handle, addr, params, stream).unwrap();
        submitted.fetch_add(1, Ordering::SeqCst);
    }
    let seen = Arc::new(AtomicUsize::new(usize::MAX));
    let last = Arc::clone(&ops[63]);
    let observed = Arc::clone(&seen);
    device
        .launch_closure(
            stream,
            Box::new(move || {
                observed.store(last.bytes_done.load(Ordering::SeqCst) as usize, Ordering::SeqCst)
            }),
        )
        .unwrap();
    opener.join().unwrap();
    released.store(1, Ordering::SeqCst);
    device.synchronize_stream(stream).unwrap();
    assert_eq!(seen.load(Ordering::SeqCst), 32 << 10, "a later host function saw an unfinished op");
    for params in &ops {
        assert_eq!(params.bytes_done.load(Ordering::SeqCst), 32 << 10);
    }
    assert!(download(&device, addr, 2 << 20) == data);
}

#[test]
fn library_async_many_streams_into_one_buffer() {
    let Some(device) = device() else { return };
    let driver = driver(&device);
    for streams in [1usize, 2, 8, 16] {
        let slice = 1 << 20;
        let data = pattern(streams * slice, streams as u64);
        let file = TempFile::new(&format!("multi{streams}"), &data);
        let handle = register(&driver, &file.file);
        let addr = device.alloc_device(0, data.len()).unwrap();
        upload(&device, addr, &vec![0u8; data.len()]);
        let handles: Vec<_> = (0..streams).map(|_| device.create_user_stream(0).unwrap()).collect();
        let mut params = Vec::new();
        for (i, &stream) in handles.iter().enumerate() {
            let _ = driver.stream_register(stream, [0u32, 7, 15, 3][i % 4]);
            let p = AsyncParams::new(slice, (i * slice) as i64);
            p.buffer_offset_bytes.store((i * slice) as i64, Ordering::SeqCst);
            driver.submit_async(Direction::Read, handle, addr, &p, stream).unwrap();
            params.push(p);
        }
        for &stream in &handles {
            device.synchronize_stream(stream).unwrap();
        }
        for p in &params {
            assert_eq!(p.bytes_done.load(Ordering::SeqCst), slice as isize);
        }
        assert!(download(&device, addr, data.len()) == data, "{streams} streams: data differs");
        for &stream in &handles {
            let _ = driver.stream_deregister(stream);
            device.destroy_user_stream(stream).unwrap();
        }
        driver.handle_deregister(handle);
    }
}

#[test]
fn library_async_failures_release_the_stream() {
    let Some(device) = device() else { return };
    let driver = driver(&device);
    let data = pattern(1 << 20, 6);
    let file = TempFile::new("fail", &data);
    let read_only = file.read_only();
    let ro_handle = register(&driver, &read_only);
    let handle = register(&driver, &file.file);
    let addr = device.alloc_device(0, 2 << 20).unwrap();
    let stream = device.create_user_stream(0).unwrap();
    // Write through a read-only descriptor: -EBADF, and the stream goes on.
    let write = AsyncParams::new(4096, 0);
    driver.submit_async(Direction::Write, ro_handle, addr, &write, stream).unwrap();
    // Deferred size grown beyond the submitted size: -5022.
    let grown = AsyncParams::new(4096, 0);
    let gate = StreamGate::pause(&device, stream).unwrap();
    driver.submit_async(Direction::Read, handle, addr, &grown, stream).unwrap();
    grown.size_bytes.store(8192, Ordering::SeqCst);
    // Short read at end of file.
    let short = AsyncParams::new(1 << 20, (1 << 20) - 100);
    driver.submit_async(Direction::Read, handle, addr, &short, stream).unwrap();
    // Handle deregistered while its op is queued: the op still completes.
    let queued = AsyncParams::new(8192, 0);
    driver.submit_async(Direction::Read, handle, addr, &queued, stream).unwrap();
    driver.handle_deregister(handle);
    gate.release();
    device.synchronize_stream(stream).unwrap();
    assert_eq!(write.bytes_done.load(Ordering::SeqCst), -(libc::EBADF as isize));
    assert_eq!(grown.bytes_done.load(Ordering::SeqCst), -(OpError::InvalidValue.code() as isize));
    assert_eq!(short.bytes_done.load(Ordering::SeqCst), 100);
    assert_eq!(queued.bytes_done.load(Ordering::SeqCst), 8192);
    assert!(download(&device, addr, 8192) == data[..8192]);
}
