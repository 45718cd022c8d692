//! Smoke test of the async path.
use hipfile_core::Direction;
use hipfile_runtime::config::Config;
use hipfile_runtime::device::Device;
use hipfile_runtime::device::cpu::CpuDevice;
use hipfile_runtime::{AsyncParams, Driver};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;

#[test]
fn async_read_and_write() {
    let dir = std::env::temp_dir().join(format!("hf-asmoke-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("data");
    let data: Vec<u8> = (0..(3 << 20)).map(|i| (i * 13 + i / 4096) as u8).collect();
    std::fs::write(&path, &data).unwrap();
    let file = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
    let device = CpuDevice::new(1);
    let mut config = Config::default();
    config.executor_cpus = vec![0, 1];
    let driver = Driver::new(config, device.clone());
    driver.open();
    let handle = driver.handle_register(file.as_raw_fd()).unwrap();
    let buf = device.malloc_device(0, 4 << 20).unwrap();
    let stream = device.create_stream(0).unwrap();
    for flags in [0u32, 7, 15] {
        let s = device.create_stream(0).unwrap();
        driver.stream_register(s, flags).unwrap();
        let params = AsyncParams::new(1 << 20, 4096);
        let gate = device.pause_stream(s).unwrap();
        driver.submit_async(Direction::Read, handle, buf, &params, s).unwrap();
        assert_eq!(params.bytes_done.load(Ordering::SeqCst), 0);
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(params.bytes_done.load(Ordering::SeqCst), 0, "must wait for the stream");
        gate.release();
        device.synchronize_stream(s).unwrap();
        assert_eq!(params.bytes_done.load(Ordering::SeqCst), 1 << 20, "flags {flags}");
        let got = unsafe { std::slice::from_raw_parts(buf as *const u8, 1 << 20) };
        assert!(got == &data[4096..4096 + (1 << 20)]);
        driver.stream_deregister(s).unwrap();
    }
    // write then read back
    let params = AsyncParams::new(100_000, 7);
    driver.submit_async(Direction::Write, handle, buf, &params, stream).unwrap();
    device.synchronize_stream(stream).unwrap();
    assert_eq!(params.bytes_done.load(Ordering::SeqCst), 100_000);
    let back = std::fs::read(&path).unwrap();
    let got = unsafe { std::slice::from_raw_parts(buf as *const u8, 100_000) };
    assert!(&back[7..100_007] == got);
    println!("stats {:?}", driver.async_stats());
    std::fs::remove_dir_all(&dir).unwrap();
}
