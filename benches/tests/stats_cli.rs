//! `hipfile-bench stats` through the built binary: it reads the statistics this test
//! process publishes (`/dev/shm/hipfile-rs-stats.<pid>`) after doing I/O on the cpu
//! device, lists the processes that publish, and fails clearly for one that does not.

use std::os::fd::AsRawFd;
use std::process::Command;

use hipfile_core::{Direction, RawIo};
use hipfile_runtime::Driver;
use hipfile_runtime::config::Config;
use hipfile_runtime::device::cpu::CpuDevice;

fn stats_cli(args: &[&str]) -> (bool, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_hipfile-bench"))
        .arg("stats")
        .args(args)
        .output()
        .expect("run hipfile-bench stats");
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    (output.status.success(), text)
}

#[test]
fn another_process_reads_this_ones_statistics() {
    if std::env::var("HIPFILE_STATS").is_ok() {
        println!("skipped: HIPFILE_STATS is set (the page may be private)");
        return;
    }
    let device = CpuDevice::new(1);
    let config = Config { executor_cpus: vec![0], request_parallelism: 1, ..Config::default() };
    config.validate().unwrap();
    let driver = Driver::new(config, device.clone());
    driver.open();
    let path = std::env::temp_dir().join(format!("hipfile-stats-cli-{}", std::process::id()));
    std::fs::write(&path, vec![3u8; 1 << 20]).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    let handle = driver.handle_register(file.as_raw_fd()).unwrap();
    let buffer = device.malloc_device(0, 1 << 20).unwrap();
    for size in [4096u64, 65536, 1 << 20] {
        let raw = RawIo { size_bytes: size, file_offset_bytes: 0, buffer_offset_bytes: 0 };
        assert_eq!(driver.io_sync(Direction::Read, handle, buffer, raw).unwrap(), size as usize);
    }
    let pid = std::process::id().to_string();

    let (ok, text) = stats_cli(&[&pid]);
    assert!(ok, "{text}");
    assert!(text.contains(&format!("statistics of process {pid}")), "{text}");
    let row = text.lines().find(|l| l.starts_with("0 ") && l.contains(" sync ")).expect(&text);
    let fields: Vec<&str> = row.split_whitespace().collect();
    let expected_bytes = (4096 + 65536 + (1 << 20)).to_string();
    assert_eq!(&fields[..6], ["0", "sync", "read", "3", expected_bytes.as_str(), "0"], "{text}");

    let (ok, text) = stats_cli(&[&pid, "--interval", "0.1", "--count", "2"]);
    assert!(ok && text.matches("statistics of process").count() == 2, "{text}");

    let (ok, text) = stats_cli(&[]);
    assert!(ok && text.contains(&pid), "the list names this process: {text}");

    // Process 1 (init) publishes nothing: a clear failure, not a crash.
    let (ok, text) = stats_cli(&["1"]);
    assert!(!ok && text.contains("no statistics of process 1"), "{text}");

    driver.handle_deregister(handle);
    std::fs::remove_file(&path).unwrap();
}
