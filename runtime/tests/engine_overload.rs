//! 10× overload of the engine through the async API, on the `cpu` device: every round
//! submits ten times more ops than the executor's job queue holds (`JOB_QUEUE_CAPACITY`)
//! and, in bytes, many times more than its pinned staging holds (arena plus fallback
//! cap), on many fully FIXED streams held while they are submitted to (so that reads
//! prefetch up to the driver's budget and the rest wait as deferred prefetches).
//!
//! The first ops of two streams are as large as the whole prefetch budget: when one
//! ends, its executor starts the stream's deferred prefetches (thousands of small
//! reads) in one go and posts them to its own full queue. It once spawned a thread per
//! post there (`hipfile-post`); it must neither block nor spawn.
//!
//! Checked: every op publishes its whole size and the device buffer ends equal to the
//! file; pinned staging sampled during the run never exceeds `Engine::pinned_cap_bytes`;
//! no `hipfile-post` thread ever exists and the thread count stays bounded; descriptors
//! and RSS are flat from the second round on. Run for a glommio executor and for a
//! blocking one (io_uring turned off), on the device `HIPFILE_DEVICE` selects (the GPU
//! suite runs it on CUDA, where the streams are let go after at most two seconds: a
//! CUDA stream takes only ~510 of our ops behind a hold before enqueue blocks).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use hipfile_runtime::HandleId;
use hipfile_runtime::config::Config;
use hipfile_runtime::device::StreamHandle;
use hipfile_runtime::engine::JOB_QUEUE_CAPACITY;
use hipfile_test_support::rig::*;

const STREAMS: usize = 32;
const SUBMITTERS: usize = 4;
/// Streams whose first op is a burst op.
const BURST_STREAMS: usize = 2;
/// The burst op's size: the whole prefetch budget.
const BURST_OP: usize = 8 * MIB;
/// Each stream's region of small ops, in the file and in the buffer.
const REGION: usize = 256 * KIB;
const SMALL_OP: usize = 4 * KIB;
/// Every [`LARGE_EVERY`]th small-region op is this large.
const LARGE_OP: usize = 64 * KIB;
const LARGE_EVERY: usize = 16;
const ROUNDS: usize = 3;
/// How many more ops than the queue holds one round submits.
const OVERLOAD: usize = 10;
/// How long a round holds its streams at most while it submits.
const HOLD_AT_MOST: std::time::Duration = std::time::Duration::from_secs(2);

/// Serialises the tests of this binary: they measure the whole process.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Names of this process's threads, less this test's own (named `overload-`) and the
/// kernel's io_uring workers (`iou-wrk-`, bounded by the kernel per ring and CPU).
fn thread_names() -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return Vec::new() };
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("comm")).ok())
        .map(|comm| comm.trim_end().to_string())
        .filter(|name| !name.starts_with("overload-") && !name.starts_with("iou-wrk-"))
        .collect()
}

fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").map(|entries| entries.count()).unwrap_or(0)
}

fn rss_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: usize = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
    pages * 4096
}

fn spawn_named<T: Send + 'static>(
    name: &str,
    work: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    std::thread::Builder::new().name(name.into()).spawn(work).expect("spawn")
}

/// What the sampler saw during a round.
#[derive(Debug, Default, Clone, Copy)]
struct Seen {
    max_pinned_bytes: usize,
    max_threads: usize,
    post_threads: usize,
}

/// One op: (size, offset in the file and in the buffer).
type Op = (usize, usize);

/// Stream `k`'s ops in one round: for a burst stream, the burst op and then enough
/// small ones to fill the budget it gives back; for the others, `ops` ops cycling over
/// the stream's region.
fn stream_ops(k: usize, ops: usize) -> Vec<Op> {
    let base = k * REGION;
    if k < BURST_STREAMS {
        let burst_at = STREAMS * REGION + k * BURST_OP;
        let small = (0..BURST_OP / SMALL_OP).map(|i| (SMALL_OP, base + i * SMALL_OP % REGION));
        return std::iter::once((BURST_OP, burst_at)).chain(small).collect();
    }
    let mut at = 0;
    (0..ops)
        .map(|i| {
            let size = if i % LARGE_EVERY == LARGE_EVERY - 1 { LARGE_OP } else { SMALL_OP };
            if at + size > REGION {
                at = 0;
            }
            let op = (size, base + at);
            at += size;
            op
        })
        .collect()
}

fn overload(config: Config) {
    let _serial = serial();
    config.validate().expect("config");
    let rig = Arc::new(Rig::with(1, config.clone()));
    let engine = rig.driver.engine().expect("engine");
    let cap = engine.pinned_cap_bytes();
    let arenas = config.staging_per_executor_bytes * engine.executor_count();
    let queued_jobs = JOB_QUEUE_CAPACITY * engine.executor_count();
    let per_stream = (OVERLOAD * queued_jobs).div_ceil(STREAMS);
    let ops: Vec<Vec<Op>> = (0..STREAMS).map(|k| stream_ops(k, per_stream)).collect();
    let op_count: usize = ops.iter().map(Vec::len).sum();
    let round_bytes: usize = ops.iter().flatten().map(|&(size, _)| size).sum();
    assert!(op_count >= OVERLOAD * queued_jobs, "{op_count} ops per round");
    assert!(round_bytes >= OVERLOAD * cap, "{round_bytes} B per round, staging {cap} B");

    let data = pattern(95, STREAMS * REGION + BURST_STREAMS * BURST_OP);
    let file = TempFile::new("overload", &data);
    let fd = file.open_rw();
    let handle = rig.register(&fd);
    let buffer = rig.alloc(data.len());
    let streams: Vec<StreamHandle> = (0..STREAMS).map(|_| rig.stream_with(Some(7))).collect();
    let threads_at_start = thread_names().len();

    let mut flat = Vec::new();
    for round in 0..ROUNDS {
        rig.set_dev_bytes(buffer, &vec![0; data.len()]);
        let (seen, wrong) = run_round(&rig, handle, buffer, &streams, &ops, arenas);
        println!(
            "round {round}: {op_count} ops, {round_bytes} B, {seen:?}, engine {:?}, async {:?}",
            engine.stats(),
            rig.driver.async_stats()
        );
        assert_eq!(wrong, Vec::<String>::new(), "ops that did not move their size");
        assert_bytes(&rig.dev_bytes(buffer, data.len()), &data, "buffer after the round");
        assert!(seen.max_pinned_bytes <= cap, "pinned {} B > cap {cap} B", seen.max_pinned_bytes);
        assert_eq!(seen.post_threads, 0, "threads spawned to post jobs (one per post)");
        assert!(
            seen.max_threads <= threads_at_start + 8,
            "threads grew from {threads_at_start} to {} under load",
            seen.max_threads
        );
        flat.push((open_descriptors(), rss_bytes()));
    }
    // The first round warms caches (pools, streams, descriptors); later ones add nothing.
    let (fds_after_second, rss_after_second) = flat[1];
    let (fds_at_end, rss_at_end) = flat[ROUNDS - 1];
    assert!(fds_at_end <= fds_after_second, "descriptors grew: {flat:?}");
    assert!(rss_at_end <= rss_after_second + 32 * MIB, "RSS grew: {flat:?}");
}

/// One round: every stream held, its ops submitted from [`SUBMITTERS`] threads at once,
/// the streams let go and synchronized; what the sampler saw and the ops that published
/// a wrong count.
fn run_round(
    rig: &Arc<Rig>,
    handle: HandleId,
    buffer: u64,
    streams: &[StreamHandle],
    ops: &[Vec<Op>],
    arenas: usize,
) -> (Seen, Vec<String>) {
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (rig, stop) = (Arc::clone(rig), Arc::clone(&stop));
        spawn_named("overload-sample", move || {
            let mut seen = Seen::default();
            let engine = rig.driver.engine().expect("engine");
            while !stop.load(Ordering::SeqCst) {
                let pinned = arenas + engine.fallback_pinned_bytes();
                seen.max_pinned_bytes = seen.max_pinned_bytes.max(pinned);
                let names = thread_names();
                seen.max_threads = seen.max_threads.max(names.len());
                let posting = names.iter().filter(|name| name.starts_with("hipfile-post")).count();
                seen.post_threads = seen.post_threads.max(posting);
                std::thread::sleep(std::time::Duration::from_micros(500));
            }
            seen
        })
    };
    let gates: Vec<_> = streams.iter().map(|&stream| rig.pause(stream).expect("pause")).collect();
    let per_submitter = streams.len() / SUBMITTERS;
    let submitters: Vec<_> = (0..SUBMITTERS)
        .map(|s| {
            let mine: Vec<usize> = (s * per_submitter..(s + 1) * per_submitter).collect();
            let (rig, streams, ops) = (Arc::clone(rig), streams.to_vec(), ops.to_vec());
            spawn_named("overload-submit", move || {
                let mut submitted = Vec::new();
                // Round-robin over the submitter's streams, so that all of them fill up.
                let longest = mine.iter().map(|&k| ops[k].len()).max().unwrap_or(0);
                for i in 0..longest {
                    for &k in &mine {
                        let Some(&(size, at)) = ops[k].get(i) else { continue };
                        let p = params(size, at as i64, at as i64);
                        rig.read(handle, buffer, &p, streams[k]);
                        submitted.push((p, size));
                    }
                }
                submitted
            })
        })
        .collect();
    // The gates open when every submitter is done, or after [`HOLD_AT_MOST`]: on CUDA an
    // enqueue blocks once ~510 of our ops wait behind a held stream (README, Known
    // limits), so a submitter can only finish once its streams move.
    let submitters_done = Arc::new(AtomicBool::new(false));
    let opener = {
        let done = Arc::clone(&submitters_done);
        spawn_named("overload-open", move || {
            let held_since = std::time::Instant::now();
            while !done.load(Ordering::SeqCst) && held_since.elapsed() < HOLD_AT_MOST {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            gates.into_iter().for_each(|gate| gate.release());
        })
    };
    let submitted: Vec<_> =
        submitters.into_iter().flat_map(|s| s.join().expect("submitter")).collect();
    submitters_done.store(true, Ordering::SeqCst);
    opener.join().expect("opener");
    for &stream in streams {
        rig.sync(stream);
    }
    stop.store(true, Ordering::SeqCst);
    let wrong = submitted
        .iter()
        .filter(|(p, size)| bytes(p) != *size as isize)
        .map(|(p, size)| format!("{size} B op published {}", bytes(p)))
        .take(10)
        .collect();
    (sampler.join().expect("sampler"), wrong)
}

/// One executor (its queue is the one its own posts fill), small staging (a 2 MiB arena,
/// a 1 MiB fallback cap), and a prefetch budget of one burst op.
fn overload_config() -> Config {
    Config {
        executor_cpus: vec![0],
        request_parallelism: 1,
        staging_per_executor_bytes: 2 * MIB,
        pinned_fallback_cap_bytes: MIB,
        prefetch_budget_bytes: Some(BURST_OP),
        ..small_config()
    }
}

#[test]
fn ten_times_overload_on_a_glommio_executor() {
    overload(overload_config());
}

#[test]
fn ten_times_overload_on_a_blocking_executor() {
    overload(Config { use_io_uring: false, ..overload_config() });
}
