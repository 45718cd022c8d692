//! The arm poller (`runtime/src/arm.rs`): the thread that learns from each stream's
//! doorbell word that the stream reached an op. It must arm ops in stream order on many
//! streams at once, back off while streams hold their ops, and cost no CPU once no op
//! waits. A crate of its own with one test (this file), so that the only `hipfile-arm`
//! thread of the process is this test's (inside `async_api` it counted every test's
//! pollers and failed while stress tests ran beside it).

use std::time::{Duration, Instant};

use hipfile_test_support::rig::*;

/// CPU time (user + system) of the process's `hipfile-arm` threads, in clock ticks.
fn arm_thread_ticks() -> Option<u64> {
    let mut total = None;
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() != "hipfile-arm" {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("stat")).ok()?;
        // Fields after the parenthesized name; utime and stime are fields 14 and 15.
        let after_name = &stat[stat.rfind(')')? + 2..];
        let fields: Vec<&str> = after_name.split_whitespace().collect();
        let ticks = fields[11].parse::<u64>().ok()? + fields[12].parse::<u64>().ok()?;
        total = Some(total.unwrap_or(0) + ticks);
    }
    total
}

/// Ticks the arm threads burn over `window`.
fn ticks_over(window: Duration) -> u64 {
    // The thread names itself as it starts, which can lag its spawn on a loaded machine.
    wait_until("a thread named hipfile-arm", || arm_thread_ticks().is_some());
    let before = arm_thread_ticks().expect("a hipfile-arm thread runs");
    std::thread::sleep(window);
    arm_thread_ticks().expect("a hipfile-arm thread runs") - before
}

#[test]
fn ops_on_many_held_streams_arm_in_order_and_an_idle_poller_costs_no_cpu() {
    const STREAMS: usize = 8;
    const OPS_PER_STREAM: usize = 16;
    const OP: usize = 4 * KIB;
    let variable_before = std::env::var_os("CUDA_DEVICE_MAX_CONNECTIONS");
    let rig = Rig::new();
    // Eight held streams need more than CUDA's default 8 hardware queues: the cuda
    // backend raises them to 32 when it starts CUDA and the caller left the variable unset.
    if variable_before.is_none() && rig.backend() == "cuda" {
        let setting = rig.device.hardware_queue_setting().expect("cuda reports its queues");
        assert!(setting.contains("set by hipFile"), "{setting}");
        assert_eq!(std::env::var("CUDA_DEVICE_MAX_CONNECTIONS").as_deref(), Ok("32"));
    }
    if !rig.device.supports_stream_memops(0) {
        println!("skipped on {}: no stream memory operations (host-function arm)", rig.backend());
        return;
    }
    let data = pattern(41, STREAMS * OPS_PER_STREAM * OP);
    let file = TempFile::new("arm", &data);
    let fd = file.open_rw();
    let handle = rig.register(&fd);
    let buffer = rig.alloc(data.len());
    let streams: Vec<_> = (0..STREAMS).map(|i| rig.stream_with(Some(i as u32 % 4))).collect();
    let gates: Vec<_> = streams.iter().map(|&s| rig.pause(s).expect("pause")).collect();
    let mut ops = Vec::new();
    for (index, &stream) in streams.iter().enumerate() {
        for k in 0..OPS_PER_STREAM {
            let at = (index * OPS_PER_STREAM + k) * OP;
            let p = params(OP, at as i64, at as i64);
            rig.read(handle, buffer, &p, stream);
            ops.push((index, p));
        }
    }
    // Held: the poller backs off instead of spinning a core (a spinning thread burns
    // about one tick per tick of wall time; 50 % is far above its sleeps' cost).
    let window = Duration::from_millis(500);
    let ticks_per_s = 100;
    let held = ticks_over(window);
    println!("arm poller while {STREAMS} streams hold {} ops: {held} ticks in 500 ms", ops.len());
    assert!(held * 1000 < window.as_millis() as u64 * ticks_per_s / 2, "poller spins: {held}");
    assert!(ops.iter().all(|(_, p)| bytes(p) == 0), "nothing published while held");
    // Released last stream first: each stream's ops complete on their own.
    for (index, gate) in gates.into_iter().enumerate().rev() {
        gate.release();
        rig.sync(streams[index]);
        for (_, p) in ops.iter().filter(|(stream, _)| *stream == index) {
            assert_eq!(bytes(p), OP as isize, "stream {index}");
        }
        if index > 0 {
            assert!(
                ops.iter().filter(|(s, _)| *s < index).all(|(_, p)| bytes(p) == 0),
                "streams still held stay unpublished"
            );
        }
    }
    assert_bytes(&rig.dev_bytes(buffer, data.len()), &data, "data");
    // Idle: parked. Allow a tick for the spin that follows the last arm.
    let started = Instant::now();
    let idle = ticks_over(window);
    println!("arm poller idle: {idle} ticks in {:?}", started.elapsed());
    assert!(idle <= 2, "an idle poller burns CPU: {idle} ticks in 500 ms");
}
