//! Smoke test of the sync path.
use hipfile_core::{Direction, RawIo};
use hipfile_runtime::config::Config;
use hipfile_runtime::device::cpu::CpuDevice;
use hipfile_runtime::Driver;
use std::os::fd::AsRawFd;

#[test]
fn read_back_a_file() {
    let dir = std::env::temp_dir().join(format!("hf-smoke-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("data");
    let data: Vec<u8> = (0..(5 << 20) + 123).map(|i| (i * 7 + i / 4096) as u8).collect();
    std::fs::write(&path, &data).unwrap();
    let file = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
    let device = CpuDevice::new(1);
    let mut config = Config::default();
    config.executor_cpus = vec![0, 1];
    config.request_parallelism = 2;
    let driver = Driver::new(config, device.clone());
    driver.open();
    let handle = driver.handle_register(file.as_raw_fd()).unwrap();
    let buf = device.malloc_device(0, 8 << 20).unwrap();
    let raw = RawIo { size_bytes: 8 << 20, file_offset_bytes: 0, buffer_offset_bytes: 0 };
    let n = driver.io_sync(Direction::Read, handle, buf, raw).unwrap();
    assert_eq!(n, data.len());
    let got = unsafe { std::slice::from_raw_parts(buf as *const u8, n) };
    assert!(got == &data[..], "data mismatch");
    let raw = RawIo { size_bytes: 1000, file_offset_bytes: 77, buffer_offset_bytes: 5 };
    let n = driver.io_sync(Direction::Write, handle, buf, raw).unwrap();
    assert_eq!(n, 1000);
    let back = std::fs::read(&path).unwrap();
    assert_eq!(&back[77..1077], &got[5..1005]);
    println!("counters {:?} stats {:?}", driver.file(handle).unwrap().counters(), driver.engine().unwrap().stats());
    driver.handle_deregister(handle);
    std::fs::remove_dir_all(&dir).unwrap();
}
