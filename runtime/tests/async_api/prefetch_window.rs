//! The per-stream prefetch window and the driver-wide prefetch budget
//! (`HIPFILE_PREFETCH_MB`): fully FIXED reads beyond them are queued and start prefetching
//! as earlier ones finish (a sliding window), and every byte still lands.

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;

use hipfile_core::Direction;
use hipfile_runtime::config::Config;
use hipfile_runtime::device::StreamMemoryOps;
use hipfile_runtime::device::cpu::CpuDevice;
use hipfile_runtime::stream::PREFETCH_WINDOW_BYTES;
use hipfile_runtime::{AsyncParams, Driver};

const MIB: usize = 1 << 20;

/// Submits `ops` 1 MiB fully FIXED reads on a held stream under `config`, releases it,
/// checks every byte, and returns the prefetch count while held and at the end.
fn prefetched_while_held_and_in_all(config: Config, ops: usize) -> (u64, u64) {
    let data: Vec<u8> = (0..ops * MIB).map(|i| (i * 31 + i / 4096) as u8).collect();
    let dir = std::env::temp_dir().join(format!("hf-window-{}-{ops}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("data");
    std::fs::write(&path, &data).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    let device = CpuDevice::new(1);
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
    let held = driver.async_stats().prefetched.load(Ordering::SeqCst);
    gate.release();
    device.synchronize_stream(stream).unwrap();
    for p in &params {
        assert_eq!(p.bytes_done.load(Ordering::SeqCst), MIB as isize);
    }
    // SAFETY: cpu-device memory is host memory; the stream is synchronized.
    let got = unsafe { std::slice::from_raw_parts(buffer as *const u8, ops * MIB) };
    assert!(got == &data[..], "data differs");
    std::fs::remove_dir_all(&dir).unwrap();
    (held, driver.async_stats().prefetched.load(Ordering::SeqCst))
}

fn two_executors() -> Config {
    // 2 x 64 MiB of staging: the default budget (half) is 64 MiB, above one window. The
    // engine's path, whose read-ahead the window and budget bound (reads copied on their
    // stream are bounded by their slots instead; HIPFILE_PREFETCH_MB=0 stops both:
    // stream_copies.rs).
    Config {
        stream_copies: hipfile_runtime::config::StreamCopies::Off,
        executor_cpus: vec![0, 1],
        request_parallelism: 1,
        staging_per_executor_bytes: 64 * MIB,
        ..Config::default()
    }
}

#[test]
fn reads_beyond_the_window_prefetch_as_earlier_ones_finish() {
    let window_ops = PREFETCH_WINDOW_BYTES / MIB as u64;
    let (held, in_all) =
        prefetched_while_held_and_in_all(two_executors(), window_ops as usize + 16);
    assert_eq!(held, window_ops);
    // The first op to finish frees room while the stream is still far from the queued
    // ones, so at least one deferred read started early.
    assert!(in_all > window_ops, "{in_all}");
}

#[test]
fn the_drivers_prefetch_budget_bounds_every_stream_and_zero_turns_it_off() {
    let budget = Config { prefetch_budget_bytes: Some(8 * MIB), ..two_executors() };
    let (held, _) = prefetched_while_held_and_in_all(budget, 24);
    assert_eq!(held, 8, "8 MiB of budget holds eight 1 MiB reads");
    let off = Config { prefetch_budget_bytes: Some(0), ..two_executors() };
    assert_eq!(prefetched_while_held_and_in_all(off, 24), (0, 0));
}
