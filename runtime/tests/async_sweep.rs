//! The never-hang sweep (DESIGN.md, invariant "Isolation"): N user streams of async
//! reads or writes, N = 1 … 256, registered with every FIXED flag, with none, or mixed;
//! every op of every stream submitted before any synchronization; then every stream
//! synchronized, every `*bytes_p` and every byte verified. Variants: the application
//! holds some of its own streams on its own gates while the others run, and creates
//! half its streams before the driver opens and half after.
//!
//! On a GPU backend (the GPU suite, `HIPFILE_DEVICE=cuda`) this is the proof that the
//! engine's copies never wait behind a held application stream: with the copies in the
//! application's context, 24–32 streams hung forever on the H200. On the `cpu` device
//! (CI) a smaller slice checks the protocol itself at every stream count.
//!
//! Every case runs under a [`Watchdog`]: a case that does not finish fails the test
//! process with the driver's report of what is pending, instead of hanging the suite.

use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hipfile_core::Direction;
use hipfile_runtime::AsyncParams;
use hipfile_runtime::config::Config;
use hipfile_runtime::device::StreamHandle;
use hipfile_test_support::rig::*;

/// The stream counts of the sweep: around every power of two, and 24–33, where CUDA's
/// 32 hardware queues start to be shared.
const STREAM_COUNTS: [usize; 14] = [1, 2, 4, 8, 16, 24, 28, 32, 33, 40, 48, 64, 128, 256];
/// Ops submitted on each stream before any synchronization (fewer when a case would
/// pass [`case_cap_bytes`]).
const OPS_PER_STREAM: usize = 4;
/// How long one case may take before the watchdog fails it (less than the helpers'
/// [`HANG_GUARD`], so that the watchdog's report comes first).
const CASE_LIMIT: Duration = Duration::from_secs(20);

/// Registration flags of the streams of one case.
#[derive(Clone, Copy, Debug)]
enum FlagSet {
    /// Every stream 0xF: size, offsets fixed, page-aligned inputs (reads prefetch).
    AllFixed,
    /// Every stream registered with 0: every parameter is read when the stream gets there.
    NoneFixed,
    /// Even streams 0xF, odd streams 0.
    Mixed,
}

impl FlagSet {
    const ALL: [FlagSet; 3] = [FlagSet::AllFixed, FlagSet::NoneFixed, FlagSet::Mixed];

    fn flags(self, stream_index: usize) -> u32 {
        match self {
            FlagSet::AllFixed => 0xF,
            FlagSet::NoneFixed => 0,
            FlagSet::Mixed if stream_index.is_multiple_of(2) => 0xF,
            FlagSet::Mixed => 0,
        }
    }
}

/// What else the application does around the case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    /// Nothing.
    Plain,
    /// Every third stream is first held on a gate of the application's own, released
    /// once every op is submitted.
    AppGates,
    /// Half the streams exist before the driver opens (and its engine starts).
    CreatedAroundOpen,
}

/// Bytes one case moves at most: op count, then op size, shrink to fit.
fn case_cap_bytes() -> usize {
    if on_cpu() { 16 * MIB } else { 512 * MIB }
}

/// The engine: the small test engine on the `cpu` device (2 cores here); on a GPU the
/// configuration an application gets (defaults and `HIPFILE_*` variables).
fn sweep_config() -> Config {
    if on_cpu() { small_config() } else { Config::from_env().expect("HIPFILE_* variables") }
}

/// Ops per stream and op size of a case of `streams` streams of `size`-byte ops.
fn case_shape(streams: usize, size: usize) -> (usize, usize) {
    let (mut ops, mut size) = (OPS_PER_STREAM, size);
    while streams * ops * size > case_cap_bytes() && ops > 1 {
        ops -= 1;
    }
    while streams * ops * size > case_cap_bytes() {
        size /= 2;
    }
    (ops, size)
}

/// A driver, one file and one device buffer shared by every case of a test.
struct Sweep {
    rig: Rig,
    file: TempFile,
    handle: hipfile_runtime::HandleId,
    buffer: u64,
    /// The file's bytes (read cases compare against them).
    contents: Vec<u8>,
    /// Cases run, for the write patterns' seeds.
    cases: usize,
}

impl Sweep {
    /// A rig over the selected backend whose driver is still closed.
    fn new(tag: &str) -> Sweep {
        Sweep::with_config(tag, sweep_config())
    }

    fn with_config(tag: &str, config: Config) -> Sweep {
        let cap = case_cap_bytes();
        let contents = pattern(0x5EED, cap);
        let file = TempFile::new(tag, &contents);
        let rig = Rig::closed(1, config);
        let handle = rig.register(&file.open_rw());
        let buffer = rig.alloc(cap);
        Sweep { rig, file, handle, buffer, contents, cases: 0 }
    }

    /// Runs one case and checks it; the watchdog fails the process if it hangs.
    fn run(
        &mut self,
        direction: Direction,
        streams: usize,
        flags: FlagSet,
        size: usize,
        variant: Variant,
    ) {
        let (ops, size) = case_shape(streams, size);
        let total = streams * ops * size;
        self.cases += 1;
        let seed = self.cases as u64;
        let what = format!(
            "{direction:?} streams={streams} flags={flags:?} size={size} ops/stream={ops} \
             variant={variant:?} on {}",
            self.rig.backend()
        );
        // Make the case able to fail: reads land in zeroed memory, writes carry bytes no
        // earlier case wrote.
        let expected = match direction {
            Direction::Read => {
                self.rig.set_dev_bytes(self.buffer, &vec![0; total]);
                self.contents[..total].to_vec()
            }
            Direction::Write => {
                let bytes = pattern(seed, total);
                self.rig.set_dev_bytes(self.buffer, &bytes);
                bytes
            }
        };
        let before_open = if variant == Variant::CreatedAroundOpen { streams / 2 } else { 0 };
        let mut handles: Vec<StreamHandle> = (0..before_open).map(|_| self.rig.stream()).collect();
        self.rig.driver.open();
        // The engine (its streams, its context) starts between the two halves.
        self.rig.driver.engine().expect("engine starts");
        handles.extend((before_open..streams).map(|_| self.rig.stream()));
        println!("case: {what}");
        let watchdog = Watchdog::arm(&self.rig.driver, what.clone(), CASE_LIMIT);
        let mut gates = Vec::new();
        for (index, &stream) in handles.iter().enumerate() {
            self.rig.driver.stream_register(stream, flags.flags(index)).expect("register");
            if variant == Variant::AppGates && index.is_multiple_of(3) {
                gates.push(self.rig.pause(stream).expect("pause"));
            }
        }
        // Op k of stream i covers bytes (k·streams + i)·size of the file and the buffer.
        let op_params: Vec<Arc<AsyncParams>> = (0..ops * streams)
            .map(|op| {
                let offset = (op * size) as i64;
                params(size, offset, offset)
            })
            .collect();
        for (op, p) in op_params.iter().enumerate() {
            let stream = handles[op % streams];
            match direction {
                Direction::Read => self.rig.read(self.handle, self.buffer, p, stream),
                Direction::Write => self.rig.write(self.handle, self.buffer, p, stream),
            }
        }
        for gate in gates {
            gate.release();
        }
        for &stream in &handles {
            self.rig.sync(stream);
        }
        drop(watchdog);
        for (op, p) in op_params.iter().enumerate() {
            assert_eq!(bytes(p), size as isize, "{what}: op {op}");
        }
        let got = match direction {
            Direction::Read => self.rig.dev_bytes(self.buffer, total),
            Direction::Write => {
                let mut got = vec![0; total];
                self.file.open_ro().read_exact_at(&mut got, 0).expect("read the file back");
                got
            }
        };
        assert_bytes(&got, &expected, &what);
        for stream in handles {
            self.rig.driver.stream_deregister(stream).expect("deregister");
            self.rig.destroy_stream(stream);
        }
        if direction == Direction::Write {
            // The next read case compares against the original contents.
            self.file.open_rw().write_all_at(&self.contents[..total], 0).expect("restore file");
        }
    }

    /// Every stream count × every flag set, `direction`, ops of `size`.
    fn every_count_and_flag_set(&mut self, direction: Direction, size: usize) {
        for flags in FlagSet::ALL {
            for streams in STREAM_COUNTS {
                self.run(direction, streams, flags, size, Variant::Plain);
            }
        }
        println!("{} cases on {}: every byte verified", self.cases, self.rig.backend());
    }
}

macro_rules! sweep_tests {
    ($( $name:ident: $direction:expr, $size:expr, gpu_only = $gpu_only:expr; )*) => {$(
        #[test]
        fn $name() {
            if $gpu_only && on_cpu() {
                println!("skipped on cpu: the cpu device runs the 4 KiB and 1 MiB sweeps (CI time)");
                return;
            }
            Sweep::new(stringify!($name)).every_count_and_flag_set($direction, $size);
        }
    )*};
}

sweep_tests! {
    sweep_reads_4k: Direction::Read, 4 * KIB, gpu_only = false;
    sweep_reads_1m: Direction::Read, MIB, gpu_only = false;
    sweep_reads_4m: Direction::Read, 4 * MIB, gpu_only = true;
    sweep_reads_16m: Direction::Read, 16 * MIB, gpu_only = true;
    sweep_writes_4k: Direction::Write, 4 * KIB, gpu_only = false;
    sweep_writes_1m: Direction::Write, MIB, gpu_only = false;
    sweep_writes_4m: Direction::Write, 4 * MIB, gpu_only = true;
    sweep_writes_16m: Direction::Write, 16 * MIB, gpu_only = true;
}

/// The never-hang configuration with slots of device memory (`HIPFILE_STREAM_COPIES=all`,
/// `HIPFILE_STREAM_COPY_SLOTS=device`): 1 MiB reads, every stream count and flag set,
/// through slots of the engine's device memory (filled through the arena, copied device →
/// device on their stream; ops on streams that fix nothing take theirs for the range as
/// submitted, which does not move here) or, past the slots' cap, pinned slots and spares —
/// every byte verified.
#[test]
fn sweep_reads_1m_through_device_slots() {
    let config = Config {
        stream_copies: hipfile_runtime::config::StreamCopies::All,
        stream_copy_slots: hipfile_runtime::config::StreamCopySlots::Device,
        ..sweep_config()
    };
    Sweep::with_config("device-slots", config).every_count_and_flag_set(Direction::Read, MIB);
}

/// The fan-out that follows the load (`HIPFILE_BUSY_FAN_OUT=1`): a request that finds every
/// executor busy goes as one part, others over the idle executors. 1 MiB reads and writes,
/// every stream count and flag set, every byte verified.
#[test]
fn sweep_1m_with_the_fan_out_following_the_load() {
    let config = Config { busy_fan_out: Some(1), ..sweep_config() };
    let mut sweep = Sweep::with_config("busy-fan-out", config);
    sweep.every_count_and_flag_set(Direction::Read, MIB);
    sweep.every_count_and_flag_set(Direction::Write, MIB);
}

/// The application holds every third stream on its own gate while the others run, at
/// the counts that used to hang and around them, reads and writes.
#[test]
fn sweep_with_application_gates() {
    let mut sweep = Sweep::new("gates");
    for direction in [Direction::Read, Direction::Write] {
        for streams in [8, 24, 28, 32, 40, 64] {
            sweep.run(direction, streams, FlagSet::Mixed, 4 * MIB, Variant::AppGates);
        }
    }
}

/// Half the streams exist before the driver opens and starts its engine, half after
/// (a fresh driver per case, so its engine starts in between).
#[test]
fn sweep_with_streams_created_around_open() {
    for direction in [Direction::Read, Direction::Write] {
        for streams in [8, 24, 28, 32, 40, 64] {
            let mut sweep = Sweep::new("around-open");
            sweep.run(direction, streams, FlagSet::Mixed, 4 * MIB, Variant::CreatedAroundOpen);
        }
    }
}

/// A sweep chosen from the environment, for investigating one corner by hand:
/// `HIPFILE_SWEEP_SIZE` (bytes per op), `HIPFILE_SWEEP_STREAMS` (counts, comma-separated),
/// `HIPFILE_SWEEP_FLAGS` (`fixed`, `none` or `mixed`), `HIPFILE_SWEEP_WRITE=1` for writes.
/// Skipped when `HIPFILE_SWEEP_SIZE` is unset.
#[test]
fn sweep_from_environment() {
    let Some(size) = std::env::var("HIPFILE_SWEEP_SIZE").ok().and_then(|v| v.parse().ok()) else {
        println!("skipped: HIPFILE_SWEEP_SIZE is unset");
        return;
    };
    let counts: Vec<usize> = std::env::var("HIPFILE_SWEEP_STREAMS")
        .ok()
        .map(|list| list.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| STREAM_COUNTS.to_vec());
    let flags = match std::env::var("HIPFILE_SWEEP_FLAGS").as_deref() {
        Ok("none") => FlagSet::NoneFixed,
        Ok("mixed") => FlagSet::Mixed,
        _ => FlagSet::AllFixed,
    };
    let direction = if std::env::var("HIPFILE_SWEEP_WRITE").as_deref() == Ok("1") {
        Direction::Write
    } else {
        Direction::Read
    };
    let mut sweep = Sweep::new("environment");
    for streams in counts {
        sweep.run(direction, streams, flags, size, Variant::Plain);
    }
}

/// `hipFileRead` / `hipFileWrite` (one chunk: on the caller's thread; larger: through the
/// engine) while 24 application streams are held on gates of the application's own with
/// an async read of ours queued behind each, from the same thread: with ops of ours
/// alive, the library's copies never wait behind an application stream. The bytes are
/// checked after the gates open (the test's own device copies are application work and
/// may queue behind a held stream).
#[test]
fn sync_io_while_streams_hold_async_ops() {
    sync_io_beside_held_streams("sync-held-ops", true);
}

/// The same with nothing of ours queued: only the application's own waits hold its
/// streams. With `HIPFILE_CUDA_CALLER_COPY=engine` (and on the `cpu` device) the sync
/// I/O completes while the streams are held. In the default mode a short sync read copies
/// in the application's (primary) context, as the application's own copies do, and on
/// CUDA such a copy waits while the application holds the hardware queue its stream
/// shares; it completes once the application releases them, which a helper thread does
/// after 300 ms.
#[test]
fn sync_io_while_the_application_holds_its_streams() {
    sync_io_beside_held_streams("sync-held", false);
}

fn sync_io_beside_held_streams(tag: &str, with_ops: bool) {
    let sweep = Sweep::new(tag);
    let rig = &sweep.rig;
    rig.driver.open();
    let streams: Vec<StreamHandle> = (0..24).map(|_| rig.stream()).collect();
    let gates: Vec<_> = streams.iter().map(|&stream| rig.pause(stream).expect("pause")).collect();
    let fresh = pattern(0xF00D, 4 * MIB);
    rig.set_dev_bytes(sweep.buffer + (8 * MIB) as u64, &fresh);
    // Async 4 KiB reads of file bytes 14 MiB + 4 KiB·i into the same buffer offsets.
    let async_base = 14 * MIB;
    let async_params: Vec<Arc<AsyncParams>> = (0..streams.len())
        .map(|i| {
            let offset = (async_base + i * 4 * KIB) as i64;
            params(4 * KIB, offset, offset)
        })
        .collect();
    if with_ops {
        for (&stream, p) in streams.iter().zip(&async_params) {
            rig.read(sweep.handle, sweep.buffer, p, stream);
        }
    }
    let may_wait_for_the_application = !with_ops
        && !on_cpu()
        && std::env::var("HIPFILE_CUDA_CALLER_COPY").as_deref() != Ok("engine");
    // In the default mode without ops of ours, the application releases its streams from
    // another thread after a while; otherwise they stay held until the I/O is done.
    let released = Arc::new(AtomicBool::new(false));
    let mut gates = Some(gates);
    let releaser = may_wait_for_the_application.then(|| {
        let released = Arc::clone(&released);
        let gates = gates.take().unwrap_or_default();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            released.store(true, Ordering::SeqCst);
            for gate in gates {
                gate.release();
            }
        })
    });
    let sizes = [4 * KIB, 64 * KIB, 4 * MIB];
    let watchdog = Watchdog::arm(
        &rig.driver,
        format!("sync I/O beside 24 held application streams on {} ({tag})", rig.backend()),
        CASE_LIMIT,
    );
    // Reads: file and buffer offsets 0, 1, 2 MiB; writes: buffer 8 MiB to file 8, 9, 10 MiB.
    for (index, &size) in sizes.iter().enumerate() {
        let offset = index * MIB;
        let raw = hipfile_core::RawIo {
            size_bytes: size as u64,
            file_offset_bytes: offset as i64,
            buffer_offset_bytes: offset as i64,
        };
        let read = rig.driver.io_sync(Direction::Read, sweep.handle, sweep.buffer, raw);
        assert_eq!(read.expect("sync read"), size);
        let raw = hipfile_core::RawIo {
            size_bytes: size as u64,
            file_offset_bytes: (8 * MIB + offset) as i64,
            buffer_offset_bytes: (8 * MIB) as i64,
        };
        let written = rig.driver.io_sync(Direction::Write, sweep.handle, sweep.buffer, raw);
        assert_eq!(written.expect("sync write"), size);
    }
    drop(watchdog);
    match releaser {
        Some(releaser) => {
            println!(
                "{tag}: sync I/O done with the application's streams {} (default mode)",
                if released.load(Ordering::SeqCst) { "released" } else { "still held" }
            );
            releaser.join().expect("releaser");
        }
        None => {
            assert!(!released.load(Ordering::SeqCst));
            for gate in gates.into_iter().flatten() {
                gate.release();
            }
        }
    }
    for &stream in &streams {
        rig.sync(stream);
        rig.destroy_stream(stream);
    }
    let contents = sweep.file.contents();
    for (index, &size) in sizes.iter().enumerate() {
        let offset = index * MIB;
        let got = rig.dev_bytes(sweep.buffer + offset as u64, size);
        assert_bytes(&got, &sweep.contents[offset..offset + size], "sync read");
        let at = 8 * MIB + offset;
        assert_bytes(&contents[at..at + size], &fresh[..size], "sync write");
    }
    if with_ops {
        for p in &async_params {
            assert_eq!(bytes(p), (4 * KIB) as isize, "async read");
        }
        let len = streams.len() * 4 * KIB;
        let got = rig.dev_bytes(sweep.buffer + async_base as u64, len);
        assert_bytes(&got, &sweep.contents[async_base..async_base + len], "async reads");
    }
}
