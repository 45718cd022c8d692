//! The blocking fallback for devices without stream memory operations: the arm host
//! function holds the stream until the op has published (no wait-value, no device-side
//! release), with the same results as the normal protocol.

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use hipfile_core::Direction;
use hipfile_runtime::config::Config;
use hipfile_runtime::device::StreamMemoryOps;
use hipfile_runtime::device::cpu::CpuDevice;
use hipfile_runtime::{AsyncParams, Driver};

const KIB: usize = 1 << 10;

#[test]
fn ops_complete_in_order_without_stream_memops() {
    let data: Vec<u8> = (0..(4 << 20)).map(|i: usize| (i * 7 + i / 4096) as u8).collect();
    let dir = std::env::temp_dir().join(format!("hf-nomemops-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("data");
    std::fs::write(&path, &data).unwrap();
    let file = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
    let device = CpuDevice::new(1);
    device.report_stream_memops(false);
    let config = Config { executor_cpus: vec![0, 1], ..Config::default() };
    let driver = Driver::new(config, device.clone());
    driver.open();
    let handle = driver.handle_register(file.as_raw_fd()).unwrap();
    let buffer = device.malloc_device(0, 4 << 20).unwrap();
    let stream = device.create_stream(0).unwrap();
    let gate = device.pause_stream(stream).unwrap();
    // 20 reads of 64 KiB, one with a size shrunk while the stream is held (flags 0).
    let ops: Vec<_> = (0..20)
        .map(|i| {
            let p = AsyncParams::new(64 * KIB, (i * 64 * KIB) as i64);
            p.buffer_offset_bytes.store((i * 64 * KIB) as i64, Ordering::SeqCst);
            driver.submit_async(Direction::Read, handle, buffer, &p, stream).unwrap();
            p
        })
        .collect();
    ops[3].size_bytes.store(60 * KIB, Ordering::SeqCst);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (observed, last) = (Arc::clone(&seen), Arc::clone(&ops[19]));
    device
        .launch_host_closure(stream, move || {
            observed.lock().unwrap().push(last.bytes_done.load(Ordering::SeqCst))
        })
        .unwrap();
    // A write after the reads, from the data the reads brought in.
    let write = AsyncParams::new(128 * KIB, (3 << 20) as i64);
    driver.submit_async(Direction::Write, handle, buffer, &write, stream).unwrap();
    gate.release();
    device.synchronize_stream(stream).unwrap();
    for (i, p) in ops.iter().enumerate() {
        let want = if i == 3 { 60 * KIB } else { 64 * KIB };
        assert_eq!(p.bytes_done.load(Ordering::SeqCst), want as isize, "op {i}");
    }
    assert_eq!(*seen.lock().unwrap(), vec![(64 * KIB) as isize], "stream order");
    assert_eq!(write.bytes_done.load(Ordering::SeqCst), (128 * KIB) as isize);
    // SAFETY: cpu-device memory is host memory; the stream is synchronized.
    let got = unsafe { std::slice::from_raw_parts(buffer as *const u8, 20 * 64 * KIB) };
    for i in 0..20 {
        let len = if i == 3 { 60 * KIB } else { 64 * KIB };
        let at = i * 64 * KIB;
        assert!(got[at..at + len] == data[at..at + len], "op {i} data");
    }
    let back = std::fs::read(&path).unwrap();
    assert!(back[3 << 20..(3 << 20) + 128 * KIB] == got[..128 * KIB], "written data");
    assert_eq!(driver.async_stats().device_releases.load(Ordering::SeqCst), 0);
    std::fs::remove_dir_all(&dir).unwrap();
}
