//! Stress of the async path: 10 000 ops over 16 streams submitted from 4 threads, random
//! sizes (1 B..256 KiB, log-uniform so most are small: the whole run stays within ~20 s
//! of a debug build on 2 cores), random offsets, random flags per stream (unregistered,
//! or any of 0..=15), reads and writes, each stream owning a disjoint 1 MiB region of one
//! file and one device buffer.
//!
//! Every op is checked in stream order by a host function enqueued right after it:
//! `*bytes_p` is final and the bytes it moved match a model of the stream's region (for a
//! read, device memory as a copy enqueued on the stream right after the op; for a write,
//! the file). At the end both regions must equal the model, and the pinned fallback
//! staging sampled during the run must never exceed its configured cap.
//!
//! Offsets and sizes are unaligned for reads and writes (except on PAGE_ALIGNED streams).

use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use hipfile_core::{Direction, OpError};
use hipfile_runtime::HandleId;
use hipfile_runtime::device::StreamHandle;
use hipfile_test_support::rig::*;

/// The size of one stress run.
#[derive(Clone, Copy)]
struct Shape {
    streams: usize,
    threads: usize,
    ops: usize,
    /// Bytes of each stream's region (of the file and of the buffer).
    region: usize,
    max_op: usize,
    max_outstanding: usize,
    /// Ops on streams that do not fix the file offset move it after submission (it binds
    /// when the stream reaches the op).
    late_file_offsets: bool,
}

/// The default run: 10 000 ops of up to 256 KiB.
const SMALL: Shape = Shape {
    streams: 16,
    threads: 4,
    ops: 10_000,
    region: MIB,
    max_op: 256 * KIB,
    max_outstanding: 48,
    late_file_offsets: false,
};

/// One stream, its region and its model.
struct Lane {
    stream: StreamHandle,
    flags: Option<u32>,
    /// First byte of the stream's region, in the file and in the buffer.
    base: usize,
    file: Vec<u8>,
    buffer: Vec<u8>,
    outstanding: Arc<AtomicUsize>,
}

struct Shared {
    shape: Shape,
    rig: Rig,
    handle: HandleId,
    buffer: u64,
    file: std::fs::File,
    failures: Mutex<Vec<String>>,
    accepted: AtomicUsize,
    /// Free pinned buffers (of powers of two bytes) for the reads' snapshots: a host
    /// function must not call the device API (CUDA), so it returns its buffer here
    /// instead of freeing it.
    pool: Mutex<Vec<Pinned>>,
}

impl Shared {
    fn fail(&self, message: String) {
        let mut failures = self.failures.lock().expect("lock");
        if failures.len() < 20 {
            failures.push(message);
        }
    }
}

/// One op: what it moves, or `None` when it must be refused (unaligned on a PAGE_ALIGNED
/// stream).
fn plan_op(rng: &mut Rng, lane: &Lane, shape: Shape) -> (Direction, usize, usize, usize, bool) {
    let (region, max_op) = (shape.region, shape.max_op);
    let direction = if rng.below(2) == 0 { Direction::Read } else { Direction::Write };
    let page_aligned = lane.flags.is_some_and(|f| f & 8 != 0);
    let mut size = if rng.below(100) == 0 { 0 } else { rng.size(max_op) };
    let mut file_offset = rng.below(region - size + 1);
    let mut buffer_offset = rng.below(region - size + 1);
    let mut refused = false;
    let align = |v: usize| v / 4096 * 4096;
    if page_aligned {
        size = align(size).max(if size == 0 { 0 } else { 4096 });
        file_offset = align(file_offset).min(region - size);
    }
    buffer_offset = buffer_offset.min(region - size);
    if page_aligned {
        buffer_offset = align(buffer_offset).min(region - size);
        if size > 0 && rng.below(50) == 0 {
            // Deliberately unaligned: refused at submission (decided behaviour).
            buffer_offset += 1 + rng.below(4095);
            buffer_offset = buffer_offset.min(region - size);
            refused = !buffer_offset.is_multiple_of(4096);
        }
    }
    (direction, size, file_offset, buffer_offset, refused)
}

/// Submits one op on `lane` and, after it, the host function that checks it.
fn run_op(shared: &Arc<Shared>, rng: &mut Rng, lane: &mut Lane, id: usize) {
    let (direction, size, mut f, b, refused) = plan_op(rng, lane, shared.shape);
    let rig = &shared.rig;
    let p = params(size, (lane.base + f) as i64, (lane.base + b) as i64);
    // A file offset the stream does not fix may be moved until the stream reaches the op:
    // submitted at another (valid) offset, set to the real one right after.
    let late = shared.shape.late_file_offsets
        && lane.flags.is_none_or(|flags| flags & 2 == 0)
        && !refused
        && rng.below(2) == 0;
    let real_f = f;
    // The stream is held until the offset is moved: without the gate a stream with nothing
    // ahead may reach the op before the move (a loaded machine descheduling this thread
    // between the submission and the store was enough on the cpu device), and the op then
    // rightly reads the offset as submitted.
    if late {
        f = rng.below(shared.shape.region - size + 1);
        if lane.flags.is_some_and(|flags| flags & 8 != 0) {
            f = f / 4096 * 4096;
        }
        p.file_offset_bytes.store((lane.base + f) as i64, Ordering::SeqCst);
    }
    let gate = late.then(|| rig.pause(lane.stream).expect("pause"));
    let result = rig.submit(direction, shared.handle, shared.buffer, &p, lane.stream);
    if late {
        p.file_offset_bytes.store((lane.base + real_f) as i64, Ordering::SeqCst);
        f = real_f;
    }
    if let Some(gate) = gate {
        gate.release();
    }
    if refused {
        if code(result) != OpError::InvalidValue {
            shared.fail(format!("op {id}: unaligned op on PAGE_ALIGNED stream was accepted"));
        }
        return;
    }
    if let Err(error) = result {
        shared.fail(format!("op {id}: {direction:?} {size} refused: {error}"));
        return;
    }
    if size == 0 {
        if bytes(&p) != 0 {
            shared.fail(format!("op {id}: size 0 published {}", bytes(&p)));
        }
        return;
    }
    shared.accepted.fetch_add(1, Ordering::Relaxed);
    let expected = match direction {
        Direction::Read => {
            let data = lane.file[f..f + size].to_vec();
            lane.buffer[b..b + size].copy_from_slice(&data);
            data
        }
        Direction::Write => {
            let data = lane.buffer[b..b + size].to_vec();
            lane.file[f..f + size].copy_from_slice(&data);
            data
        }
    };
    let (check_shared, outstanding) = (Arc::clone(shared), Arc::clone(&lane.outstanding));
    let (file_at, buffer_at) = (lane.base + f, lane.base + b);
    let stream = lane.stream;
    lane.outstanding.fetch_add(1, Ordering::SeqCst);
    // What the device memory holds once the stream has passed the op (device memory
    // cannot be read from a host function on a GPU): copied on the stream, after the op.
    let snapshot = match direction {
        Direction::Read => {
            let pinned = {
                let mut pool = shared.pool.lock().expect("lock");
                let fits = pool.iter().position(|p| p.region.len_bytes >= size);
                fits.map(|at| pool.swap_remove(at))
            };
            let pinned = pinned.unwrap_or_else(|| rig.pinned(size.next_power_of_two()));
            let source = shared.buffer + buffer_at as u64;
            // SAFETY: the buffer moves into the host function below, which runs after
            // the copy and hands it back to the pool (it is freed only when `shared`
            // drops, after every stream was synchronized).
            unsafe { rig.copy_from_device_on(stream, &pinned, source, size) }.expect("copy d2h");
            Some(pinned)
        }
        Direction::Write => None,
    };
    let check = move || {
        let s = &check_shared;
        let n = bytes(&p);
        let what = format!(
            "op {id} {direction:?} {size} B file {file_at} buffer {buffer_at} on {stream:?}"
        );
        if n != size as isize {
            s.fail(format!("{what}: *bytes_p = {n}"));
        } else {
            let got = match direction {
                Direction::Read => snapshot.as_ref().expect("snapshot").bytes(size),
                Direction::Write => {
                    let mut got = vec![0; size];
                    s.file.read_exact_at(&mut got, file_at as u64).expect("pread");
                    got
                }
            };
            if let Some(i) = got.iter().zip(&expected).position(|(g, e)| g != e) {
                s.fail(format!("{what}: data differs at byte {i}"));
            }
        }
        if let Some(pinned) = snapshot {
            s.pool.lock().expect("lock").push(pinned);
        }
        outstanding.fetch_sub(1, Ordering::SeqCst);
    };
    rig.launch(lane.stream, check).expect("host closure");
}

fn submitter(shared: Arc<Shared>, mut lanes: Vec<Lane>, seed: u64) -> Vec<Lane> {
    let mut rng = Rng(seed);
    let shape = shared.shape;
    let per_thread = shape.ops / shape.threads;
    for i in 0..per_thread {
        let lane = rng.below(lanes.len());
        let lane = &mut lanes[lane];
        let outstanding = Arc::clone(&lane.outstanding);
        wait_until("a stream to drain below its outstanding limit", || {
            outstanding.load(Ordering::SeqCst) < shape.max_outstanding
        });
        run_op(&shared, &mut rng, lane, seed as usize * per_thread + i);
    }
    for lane in &lanes {
        shared.rig.sync(lane.stream);
    }
    lanes
}

#[test]
fn stress_10k_ops_16_streams_4_threads() {
    stress(Rig::new(), SMALL);
}

/// The same with `HIPFILE_STREAM_COPIES=all` and ops of up to 40 MiB (log-uniform: most
/// stay small), file offsets moved after submission on streams that do not fix them:
/// every op with a FIXED device range goes through slots copied on its stream — staged,
/// read when the stream reaches it, or in pieces sharing a ring (`async_op/pieces.rs`) —
/// next to the engine's path of the others, and every byte must match the model.
#[test]
fn stress_with_every_fixed_range_copied_on_the_stream() {
    let config = hipfile_runtime::config::Config {
        stream_copies: hipfile_runtime::config::StreamCopies::All,
        stream_copy_slots: hipfile_runtime::config::StreamCopySlots::Pinned,
        stream_copy_cap_bytes: 256 * MIB,
        ..hipfile_runtime::config::Config::default()
    };
    let shape = Shape {
        streams: 8,
        threads: 4,
        ops: 300,
        region: 48 * MIB,
        max_op: 40 * MIB,
        max_outstanding: 8,
        late_file_offsets: true,
    };
    let copied = stress(Rig::with(1, config), shape);
    assert!(copied > 0, "ops copied on their streams");
}

/// The same with the least slot cap (one 16 MiB slot of each large size): most ops with a
/// FIXED device range find no slot of their own and go through their stream's spare slot
/// in 4 MiB pieces, read when the stream reaches them, interleaved on each stream with
/// ops in slots, in rings and on the engine's path; every byte must match the model.
#[test]
fn stress_with_every_fixed_range_copied_on_the_stream_through_spares() {
    let config = hipfile_runtime::config::Config {
        stream_copies: hipfile_runtime::config::StreamCopies::All,
        stream_copy_slots: hipfile_runtime::config::StreamCopySlots::Pinned,
        stream_copy_cap_bytes: 16 * MIB,
        ..hipfile_runtime::config::Config::default()
    };
    let shape = Shape {
        streams: 6,
        threads: 3,
        ops: 150,
        region: 24 * MIB,
        max_op: 20 * MIB,
        max_outstanding: 8,
        late_file_offsets: true,
    };
    let rig = Rig::with(1, config);
    let driver = std::sync::Arc::clone(&rig.driver);
    let copied = stress(rig, shape);
    assert!(copied > 0, "ops copied on their streams");
    let spared = driver.async_stats().spare_ops.load(std::sync::atomic::Ordering::SeqCst);
    assert!(spared > 0, "ops through spares");
}

/// The same with device slots at their least cap (16 MiB per device) and
/// `HIPFILE_STREAM_COPY_DEVICE_FULL=share`: reads over 64 KiB past the cap share the queued
/// slot of an earlier read of their stream (read ahead once that read's copy ran, else when
/// the stream reaches them), between ops in slots of their own, pinned slots, rings, spares
/// and the engine's path, with late file offsets; every byte must match the model.
#[test]
fn stress_with_reads_sharing_their_streams_device_slots() {
    let config = hipfile_runtime::config::Config {
        stream_copies: hipfile_runtime::config::StreamCopies::All,
        stream_copy_slots: hipfile_runtime::config::StreamCopySlots::Device,
        stream_copy_device_cap_bytes: 16 * MIB,
        stream_copy_device_full: hipfile_runtime::config::DeviceSlotsFull::Share,
        stream_copy_cap_bytes: 64 * MIB,
        ..hipfile_runtime::config::Config::default()
    };
    let shape = Shape {
        streams: 4,
        threads: 2,
        ops: 300,
        region: 24 * MIB,
        max_op: 16 * MIB,
        max_outstanding: 48,
        late_file_offsets: true,
    };
    let rig = Rig::with(1, config);
    let driver = std::sync::Arc::clone(&rig.driver);
    let copied = stress(rig, shape);
    assert!(copied > 0, "ops copied on their streams");
    let (past, shared) = (driver.reads_past_device_slots(), driver.reads_sharing_device_slots());
    assert!(shared > 0, "reads that shared their stream's slot: {shared} of {past} past the cap");
}

/// The same with pieces of 1 MiB (`HIPFILE_STREAM_COPY_PIECE_MB=1`): every op of more than
/// 1 MiB with a FIXED device range goes in pieces sharing a ring of four 1 MiB slots,
/// several of them on one stream at once, and every byte must match the model.
#[test]
fn stress_with_every_fixed_range_copied_on_the_stream_in_small_pieces() {
    let config = hipfile_runtime::config::Config {
        stream_copies: hipfile_runtime::config::StreamCopies::All,
        stream_copy_slots: hipfile_runtime::config::StreamCopySlots::Pinned,
        stream_copy_cap_bytes: 256 * MIB,
        stream_copy_piece_bytes: MIB,
        ..hipfile_runtime::config::Config::default()
    };
    let shape = Shape {
        streams: 6,
        threads: 3,
        ops: 120,
        region: 24 * MIB,
        max_op: 12 * MIB,
        max_outstanding: 8,
        late_file_offsets: true,
    };
    let copied = stress(Rig::with(1, config), shape);
    assert!(copied > 0, "ops copied on their streams");
}

/// Runs `shape` on `rig`; returns the ops copied on their streams.
fn stress(rig: Rig, shape: Shape) -> u64 {
    let Shape { streams, threads, region, ops, .. } = shape;
    let cap = rig.driver.config().pinned_fallback_cap_bytes;
    let initial_file = pattern(90, streams * region);
    let initial_buffer = pattern(91, streams * region);
    let file = TempFile::new("stress", &initial_file);
    let fd = file.open_rw();
    let handle = rig.register(&fd);
    let buffer = rig.alloc(streams * region);
    rig.set_dev_bytes(buffer, &initial_buffer);
    let mut rng = Rng(7);
    let mut lanes: Vec<Lane> = (0..streams)
        .map(|k| {
            let choice = rng.below(17);
            let flags = (choice < 16).then_some(choice as u32);
            let base = k * region;
            Lane {
                stream: rig.stream_with(flags),
                flags,
                base,
                file: initial_file[base..base + region].to_vec(),
                buffer: initial_buffer[base..base + region].to_vec(),
                outstanding: Arc::default(),
            }
        })
        .collect();
    let reader = fd.try_clone().expect("dup");
    let shared = Arc::new(Shared {
        shape,
        rig,
        handle,
        buffer,
        file: reader,
        failures: Mutex::default(),
        accepted: AtomicUsize::new(0),
        pool: Mutex::default(),
    });
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (shared, stop) = (Arc::clone(&shared), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut max = 0;
            while !stop.load(Ordering::SeqCst) {
                if let Ok(engine) = shared.rig.driver.engine() {
                    max = max.max(engine.fallback_pinned_bytes());
                }
                std::thread::sleep(std::time::Duration::from_micros(500));
            }
            max
        })
    };
    let per_thread = streams / threads;
    let threads: Vec<_> = (0..threads)
        .map(|t| {
            let mine: Vec<Lane> = lanes.drain(..per_thread).collect();
            let shared = Arc::clone(&shared);
            std::thread::spawn(move || submitter(shared, mine, t as u64))
        })
        .collect();
    let lanes: Vec<Lane> =
        threads.into_iter().flat_map(|t| t.join().expect("submitter thread")).collect();
    stop.store(true, Ordering::SeqCst);
    let max_fallback = sampler.join().expect("sampler");

    let failures = shared.failures.lock().expect("lock").clone();
    assert!(failures.is_empty(), "failures:\n{}", failures.join("\n"));
    let accepted = shared.accepted.load(Ordering::SeqCst);
    let submitted = shared.rig.driver.async_stats().submitted.load(Ordering::SeqCst);
    assert_eq!(submitted as usize, accepted, "async_stats().submitted");
    assert!(accepted > ops * 9 / 10, "most ops run: {accepted}");
    let engine = shared.rig.driver.engine().expect("engine");
    println!(
        "accepted {accepted}, max fallback {max_fallback} B, engine {:?}, async {:?}",
        engine.stats(),
        shared.rig.driver.async_stats()
    );
    assert!(max_fallback <= cap, "fallback pinned {max_fallback} > cap {cap}");
    assert!(engine.fallback_pinned_bytes() <= cap);
    let contents = file.contents();
    let device = shared.rig.dev_bytes(buffer, streams * region);
    for lane in &lanes {
        let range = lane.base..lane.base + region;
        let what = format!("stream {:?} flags {:?}", lane.stream, lane.flags);
        assert_bytes(&contents[range.clone()], &lane.file, &format!("final file, {what}"));
        assert_bytes(&device[range], &lane.buffer, &format!("final buffer, {what}"));
    }
    shared.rig.driver.async_stats().stream_copies.load(Ordering::SeqCst)
}

/// More reads in flight than the staging arenas hold (16 streams × 2 MiB ops, 2 × 8 MiB
/// arenas, 4 chunks of 256 KiB in flight per op), with a pinned fallback pool of only
/// `cap` bytes: ops must wait for staging (backpressure),
/// never fail, and the pool must stay within its cap. Prefetching streams (FIXED-all)
/// hold their staged chunks while the stream is held, which adds to the pressure.
fn staging_pressure(cap: usize) {
    let mut config = small_config();
    config.pinned_fallback_cap_bytes = cap;
    config.validate().expect("config");
    let rig = Rig::with(1, config);
    let cap = rig.driver.config().pinned_fallback_cap_bytes;
    const OP: usize = 2 * MIB;
    const PER_STREAM: usize = 2;
    const STREAMS: usize = 16;
    let data = pattern(92, STREAMS * PER_STREAM * OP);
    let file = TempFile::new("pressure", &data);
    let fd = file.open_rw();
    let handle = rig.register(&fd);
    let buffer = rig.alloc(data.len());
    let mut gates = Vec::new();
    let mut ops = Vec::new();
    let mut streams = Vec::new();
    for k in 0..STREAMS {
        let stream = rig.stream_with(if k % 2 == 0 { Some(7) } else { None });
        gates.push(rig.pause(stream).expect("pause"));
        for i in 0..PER_STREAM {
            let at = (k * PER_STREAM + i) * OP;
            let p = params(OP, at as i64, at as i64);
            rig.read(handle, buffer, &p, stream);
            ops.push(p);
        }
        streams.push(stream);
    }
    let engine = rig.driver.engine().expect("engine");
    let mut max_fallback = engine.fallback_pinned_bytes();
    for gate in gates {
        gate.release();
    }
    let done = || ops.iter().all(|p| bytes(p) != 0);
    wait_until("every op to publish", || {
        max_fallback = max_fallback.max(engine.fallback_pinned_bytes());
        done()
    });
    for &stream in &streams {
        rig.sync(stream);
    }
    let failed: Vec<isize> = ops.iter().map(|p| bytes(p)).filter(|&n| n != OP as isize).collect();
    assert!(failed.is_empty(), "ops that did not move {OP} bytes published {failed:?}");
    assert!(max_fallback <= cap, "fallback pinned {max_fallback} > cap {cap}");
    println!("max fallback {max_fallback} B, engine {:?}", engine.stats());
    assert_bytes(&rig.dev_bytes(buffer, data.len()), &data, "every byte");
}

#[test]
fn staging_pressure_with_a_1_mib_fallback_cap() {
    staging_pressure(MIB);
}

#[test]
fn staging_pressure_with_the_smallest_fallback() {
    // The smallest cap the configuration accepts: one staging chunk
    // (HIPFILE_PINNED_FALLBACK_MB=0 is rejected: the engine's backpressure needs one).
    staging_pressure(256 << 10);
}

/// Many streams on executors whose arenas hold two chunks each: every chunk waits for its
/// share of the arena (`StagingBudget`), reached ops and prefetching ones compete for
/// it, and ops are split over both executors. Every op must move all its bytes (a job
/// that gave up when no share was free once published short counts) and every byte must
/// land, for reads and then writes.
#[test]
fn arenas_of_two_chunks_serve_eight_streams_of_large_ops() {
    const CHUNK: usize = 256 * KIB;
    const OP: usize = 4 * MIB;
    const PER_STREAM: usize = 3;
    const STREAMS_HERE: usize = 8;
    let config = hipfile_runtime::config::Config {
        staging_per_executor_bytes: 2 * CHUNK,
        staging_chunk_bytes: CHUNK,
        pinned_fallback_cap_bytes: CHUNK,
        ..small_config()
    };
    config.validate().expect("config");
    let rig = Rig::with(1, config);
    let data = pattern(93, STREAMS_HERE * PER_STREAM * OP);
    let file = TempFile::new("arena-admission", &data);
    let fd = file.open_rw();
    let handle = rig.register(&fd);
    let buffer = rig.alloc(data.len());
    let streams: Vec<StreamHandle> = (0..STREAMS_HERE)
        .map(|k| rig.stream_with(if k % 2 == 0 { Some(7) } else { None }))
        .collect();
    let run = |direction: Direction| {
        let what = format!("{direction:?}");
        rig.run_disjoint(direction, (handle, buffer), &streams, (PER_STREAM, OP), &what);
    };
    run(Direction::Read);
    assert_bytes(&rig.dev_bytes(buffer, data.len()), &data, "every byte read");
    let new_data = pattern(94, data.len());
    rig.set_dev_bytes(buffer, &new_data);
    run(Direction::Write);
    assert_bytes(&file.contents(), &new_data, "every byte written");
}
