//! Soak of the async path and the registries: resources stay bounded under many ops.
//!
//! - Rounds of tiny unaligned reads (1–512 B) on 4 streams, every op of a round submitted
//!   before any stream is synchronized: every op completes with its whole size, the bytes
//!   land, the descriptors the engine opens stay few and are reused (no EMFILE), and the
//!   resident memory is flat after the first (warm-up) round.
//! - Stream register/deregister and buffer register/deregister cycles: resident memory
//!   flat.
//!
//! CI runs a short slice. The long version (the 100 000 ops a round):
//! `HIPFILE_SOAK_OPS=100000 HIPFILE_SOAK_ROUNDS=5 cargo test --release -p hipfile-runtime
//! --test async_soak` (a debug build may trip the 30 s hang guard of a stream sync).
//! With `HIPFILE_DEVICE=cuda` it runs on the GPU (the GPU suite runs the short slice).

use std::sync::{Arc, Mutex, MutexGuard};

use hipfile_runtime::AsyncParams;
use hipfile_test_support::rig::*;

const STREAMS: usize = 4;
const FILE_BYTES: usize = 4 * MIB;
const MAX_OP_BYTES: usize = 512;
/// Resident memory a warmed-up workload may still gain (allocator and page noise).
const RSS_SLACK_KIB: usize = 4 * 1024;
/// Descriptors beyond the warmed-up count tolerated during a round (none are expected;
/// a per-op descriptor would add thousands).
const FD_SLACK: usize = 8;

/// The tests measure the whole process (resident memory, descriptors): one at a time.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Resident set size of this process, KiB.
fn rss_kib() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS line");
    line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("VmRSS value")
}

/// Descriptors open in this process.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").expect("list /proc/self/fd").count()
}

#[test]
fn tiny_unaligned_reads_complete_with_bounded_descriptors_and_flat_memory() {
    let _serial = serial();
    let ops_per_round = setting("HIPFILE_SOAK_OPS", 10_000);
    let rounds = setting("HIPFILE_SOAK_ROUNDS", 3).max(2);
    let rig = Rig::new();
    let data = pattern(5, FILE_BYTES);
    let file = TempFile::new("soak", &data);
    let client = file.open_ro();
    let handle = rig.register(&client);
    let buffer = rig.alloc(FILE_BYTES);
    let streams: Vec<_> = (0..STREAMS).map(|_| rig.stream()).collect();
    let mut rng = Rng(0x50A6);
    let (mut warm_fds, mut warm_rss_kib) = (0, 0);
    for round in 0..rounds {
        let watchdog = Watchdog::arm(
            &rig.driver,
            format!("soak round {round}: {ops_per_round} tiny reads on {}", rig.backend()),
            std::time::Duration::from_secs(600),
        );
        rig.set_dev_bytes(buffer, &vec![0u8; FILE_BYTES]);
        let mut ops: Vec<(Arc<AsyncParams>, usize, usize)> = Vec::with_capacity(ops_per_round);
        let mut most_fds = 0;
        for i in 0..ops_per_round {
            let size = 1 + rng.below(MAX_OP_BYTES);
            let offset = rng.below(FILE_BYTES - size);
            let p = params(size, offset as i64, offset as i64);
            rig.read(handle, buffer, &p, streams[i % STREAMS]);
            ops.push((p, size, offset));
            if i % 500 == 0 {
                most_fds = most_fds.max(open_fds());
            }
        }
        for &stream in &streams {
            rig.sync(stream);
        }
        drop(watchdog);
        let failed: Vec<_> = ops
            .iter()
            .enumerate()
            .filter(|(_, (p, size, _))| bytes(p) != *size as isize)
            .map(|(i, (p, size, offset))| (i, *size, *offset, bytes(p)))
            .take(8)
            .collect();
        assert!(failed.is_empty(), "round {round}: ops (index, size, offset, *bytes): {failed:?}");
        let device = rig.dev_bytes(buffer, FILE_BYTES);
        for &(_, size, offset) in &ops {
            assert_bytes(&device[offset..offset + size], &data[offset..offset + size], "tiny read");
        }
        let (fds, rss) = (open_fds(), rss_kib());
        println!("round {round}: {ops_per_round} ops, fds {fds} (most {most_fds}), rss {rss} KiB");
        if round == 0 {
            (warm_fds, warm_rss_kib) = (fds, rss);
            continue;
        }
        assert!(
            most_fds <= warm_fds + FD_SLACK && fds <= warm_fds + FD_SLACK,
            "round {round}: {most_fds} descriptors during, {fds} after; {warm_fds} after warm-up"
        );
        assert!(
            rss <= warm_rss_kib + RSS_SLACK_KIB,
            "round {round}: resident {rss} KiB, {warm_rss_kib} KiB after warm-up"
        );
    }
    rig.driver.handle_deregister(handle);
}

#[test]
fn register_deregister_cycles_keep_memory_flat() {
    let _serial = serial();
    let cycles = setting("HIPFILE_SOAK_CYCLES", 20_000);
    let rig = Rig::new();
    let stream = rig.stream();
    let buffer = rig.alloc(MIB);
    let cycle = |count: usize| {
        for _ in 0..count {
            rig.driver.stream_register(stream, 0xF).expect("stream_register");
            rig.driver.stream_deregister(stream).expect("stream_deregister");
            rig.driver.buf_register(buffer, MIB as u64, 0).expect("buf_register");
            rig.driver.buf_deregister(buffer).expect("buf_deregister");
        }
    };
    cycle(cycles / 10);
    let warm_rss_kib = rss_kib();
    cycle(cycles);
    let rss = rss_kib();
    println!("{cycles} cycles: rss {warm_rss_kib} -> {rss} KiB");
    assert!(
        rss <= warm_rss_kib + 1024,
        "resident {rss} KiB after {cycles} cycles, {warm_rss_kib} KiB after warm-up"
    );
}
