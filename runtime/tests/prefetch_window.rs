//! The per-stream prefetch window: fully FIXED reads beyond it are queued and start
//! prefetching as earlier ones finish (a sliding window), and every byte still lands.

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;

use hipfile_core::Direction;
use hipfile_runtime::config::Config;
use hipfile_runtime::device::Device;
use hipfile_runtime::device::cpu::CpuDevice;
use hipfile_runtime::stream::PREFETCH_WINDOW_BYTES;
use hipfile_runtime::{AsyncParams, Driver};

const MIB: usize = 1 << 20;

#[test]
fn reads_beyond_the_window_prefetch_as_earlier_ones_finish() {
    let ops = (PREFETCH_WINDOW_BYTES as usize / MIB) + 16;
    let data: Vec<u8> = (0..ops * MIB).map(|i| (i * 31 + i / 4096) as u8).collect();
    let dir = std::env::temp_dir().join(format!("hf-window-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("data");
    std::fs::write(&path, &data).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    let device = CpuDevice::new(1);
    let config = Config { executor_cpus: vec![0, 1], request_parallelism: 1, ..Config::default() };
    let driver = Driver::new(config, device.clone());
    driver.open();
    let handle = driver.handle_register(file.as_raw_fd()).unwrap();
    let buffer = device.malloc_device(0, ops * MIB).unwrap();
    let stream = device.create_stream(0).unwrap();
    driver.stream_register(stream, 7).unwrap();
    let gate = device.pause_stream(stream).unwrap();
    let params: Vec<_> = (0..ops)
        .map(|i| {
            let p = AsyncParams::new(MIB, (i * MIB) as i64);
            p.buffer_offset_bytes.store((i * MIB) as i64, Ordering::SeqCst);
            driver.submit_async(Direction::Read, handle, buffer, &p, stream).unwrap();
            p
        })
        .collect();
    let window_ops = (PREFETCH_WINDOW_BYTES as usize / MIB) as u64;
    assert_eq!(driver.async_stats().prefetched.load(Ordering::SeqCst), window_ops);
    gate.release();
    device.synchronize_stream(stream).unwrap();
    // The first op to finish frees room while the stream is still far from the queued
    // ones, so at least one deferred read started early.
    assert!(driver.async_stats().prefetched.load(Ordering::SeqCst) > window_ops);
    for p in &params {
        assert_eq!(p.bytes_done.load(Ordering::SeqCst), MIB as isize);
    }
    // SAFETY: cpu-device memory is host memory; the stream is synchronized.
    let got = unsafe { std::slice::from_raw_parts(buffer as *const u8, ops * MIB) };
    assert!(got == &data[..], "data differs");
    std::fs::remove_dir_all(&dir).unwrap();
}
