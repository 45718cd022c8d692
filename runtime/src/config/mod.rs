//! Configuration from `HIPFILE_*` environment variables, read once per process.
//!
//! [`Config::global`] reads the environment the first time it is called and never
//! again. Every variable is listed in [`ENV_VARS`]. A variable that is unset, or set to
//! an empty (all-whitespace) value, takes its default. Numbers are trimmed decimal
//! integers; anything else (signs, garbage, overflow, out of range) is a
//! [`ConfigError`] naming the variable. `HIPFILE_ALLOW_COMPAT_MODE` follows hipFile
//! instead: only `true` / `false` (any case, untrimmed) count, anything else is unset.
//!
//! Executors: `HIPFILE_CPUS` (a list such as `0,2,4-7`, each CPU in this process's
//! affinity mask, no CPU twice) replaces the pool of usable CPUs, which otherwise is
//! the affinity mask. `HIPFILE_THREADS=N` takes the first `N` CPUs of the pool, reusing
//! them round-robin when `N` exceeds it. Without `HIPFILE_THREADS` there is one executor
//! per listed CPU when `HIPFILE_CPUS` is set, else [`default_executor_count`] of the usable
//! CPUs: one per CPU up to 8, two CPUs left free beyond, at most 16.
//!
//! This file holds the variables, their defaults and limits, [`Config`] and its checks;
//! `parse.rs` parses and checks each variable's value.

mod parse;

use std::fmt;
use std::sync::OnceLock;

use crate::file::DirectPolicy;

use parse::{
    check, chunk_ok, in_unit, parse_choice, parse_chunk_bytes, parse_count, parse_device,
    parse_direct, parse_executor_cpus, parse_hipfile_bool, parse_mib,
};

const DEVICE: &str = "HIPFILE_DEVICE";
const THREADS: &str = "HIPFILE_THREADS";
const IO_URING: &str = "HIPFILE_IO_URING";
const BUFFERED_WRITES: &str = "HIPFILE_BUFFERED_WRITES";
const STREAM_COPIES: &str = "HIPFILE_STREAM_COPIES";
const STREAM_COPY_MB: &str = "HIPFILE_STREAM_COPY_MB";
const STREAM_COPY_PIECE_MB: &str = "HIPFILE_STREAM_COPY_PIECE_MB";
const STREAM_COPY_SLOTS: &str = "HIPFILE_STREAM_COPY_SLOTS";
const STREAM_COPY_DEVICE_MB: &str = "HIPFILE_STREAM_COPY_DEVICE_MB";
/// Default of `HIPFILE_STREAM_COPY_DEVICE_MB`.
const DEFAULT_STREAM_COPY_DEVICE_MB: usize = 1024;
const STREAM_COPY_DEVICE_FULL: &str = "HIPFILE_STREAM_COPY_DEVICE_FULL";
const REASON_STREAM_COPY_DEVICE_FULL: &str = "must be pinned or share";
const STREAM_COPY_DEVICE_IDLE_MS: &str = "HIPFILE_STREAM_COPY_DEVICE_IDLE_MS";
/// Default of `HIPFILE_STREAM_COPY_DEVICE_IDLE_MS`.
const DEFAULT_STREAM_COPY_DEVICE_IDLE_MS: u64 = 5_000;
const REASON_STREAM_COPY_SLOTS: &str = "must be pinned or device";
const REASON_BUFFERED_WRITES: &str = "must be thread or io_uring";
const CALLER_THREAD: &str = "HIPFILE_CALLER_THREAD";
const REASON_CALLER_THREAD: &str = "must be small, busy or always";
const REASON_ON_OFF: &str = "must be 1/on/true or 0/off/false";
const REASON_STREAM_COPIES: &str = "must be 1/on/true, 0/off/false or all";
const REASON_STREAM_COPY_MB: &str = "must be an integer number of MiB, at least 16";
/// Largest `HIPFILE_STREAM_COPY_DEVICE_IDLE_MS`: one day.
const MAX_STREAM_COPY_DEVICE_IDLE_MS: u64 = 86_400_000;
const REASON_STREAM_COPY_DEVICE_IDLE: &str =
    "must be an integer number of milliseconds, 0 (never) to 86400000";
const REASON_STREAM_COPY_PIECE_MB: &str = "must be 1, 4 or 16 (MiB: a slot size)";
/// Default of `HIPFILE_STREAM_COPY_PIECE_MB`: the largest slot.
const DEFAULT_STREAM_COPY_PIECE_MB: usize = 16;
/// Default of `HIPFILE_STREAM_COPY_MB`: a 64th of the machine's memory, rounded down to
/// a whole 16 MiB slot, between [`MIN_DEFAULT_STREAM_COPY_MB`] and
/// [`MAX_DEFAULT_STREAM_COPY_MB`] ([`default_stream_copy_mib`]).
const STREAM_COPY_MEMORY_SHARE: u64 = 64;
/// The least default of `HIPFILE_STREAM_COPY_MB`: one long op's ring of four 16 MiB slots.
const MIN_DEFAULT_STREAM_COPY_MB: usize = 64;
/// The most default of `HIPFILE_STREAM_COPY_MB`: 64 ops of 16 MiB (or 16 long ops) in
/// flight per size; slots are pinned only as ops use them, and never shrink.
const MAX_DEFAULT_STREAM_COPY_MB: usize = 1024;
/// Default of `HIPFILE_LOADED_FAN_OUT` (a request never has more parts than executors,
/// so on one or two executors it changes nothing): on two H100 machines, 16 MiB hot reads
/// from 8 / 16 async streams read 1.11 / 1.19x and 1.02 / 1.15x as fast as with every
/// request over 14 executors, at 8-16 % less CPU per GiB (README, Measured,
/// twenty-eighth session).
const DEFAULT_LOADED_FAN_OUT: Option<usize> = Some(2);
/// Default of `HIPFILE_INLINE_READ_KB`: a read of at most this submitted to an idle stream
/// is read inside the submit call when the page cache holds it (`async_op::inline_read`).
const DEFAULT_INLINE_READ_KB: usize = 64;
/// Most of `HIPFILE_INLINE_READ_KB`: the largest pinned slot.
const MAX_INLINE_READ_KB: usize = 16 * 1024;
const INLINE_READ_KB: &str = "HIPFILE_INLINE_READ_KB";
const REASON_INLINE_READ: &str = "must be an integer between 0 and 16384 (KiB)";
/// Default of `HIPFILE_STREAM_WRITE_PIECE_KB` (a fully FIXED write copied into a slot on
/// its stream, longer than this, is copied in pieces of this size, each written to the
/// file as soon as the stream has copied it: `async_op::write_pieces`): off, since 1 and
/// 4 MiB pieces moved 16 MiB writes by no more than the noise on an H100 (README,
/// Measured, thirty-first session).
const DEFAULT_STREAM_WRITE_PIECE_KB: usize = 0;
const STREAM_WRITE_PIECE_KB: &str = "HIPFILE_STREAM_WRITE_PIECE_KB";
const REASON_STREAM_WRITE_PIECE_KB: &str =
    "must be 0 (off) or a power of two between 64 and 8192 (KiB)";
const STREAM_COPY_WRITES: &str = "HIPFILE_STREAM_COPY_WRITES";
const CPUS: &str = "HIPFILE_CPUS";
const CHUNK_KB: &str = "HIPFILE_CHUNK_KB";
const STAGING_MB: &str = "HIPFILE_STAGING_MB";
const PINNED_FALLBACK_MB: &str = "HIPFILE_PINNED_FALLBACK_MB";
const ODIRECT: &str = "HIPFILE_ODIRECT";
const REQUEST_PARALLELISM: &str = "HIPFILE_REQUEST_PARALLELISM";
const BUSY_FAN_OUT: &str = "HIPFILE_BUSY_FAN_OUT";
const LOADED_FAN_OUT: &str = "HIPFILE_LOADED_FAN_OUT";
const QUEUE_DEPTH: &str = "HIPFILE_QUEUE_DEPTH";
const COPY_SPIN_US: &str = "HIPFILE_COPY_SPIN_US";
const PARK_SPIN_US: &str = "HIPFILE_PARK_SPIN_US";
const PREFETCH_MB: &str = "HIPFILE_PREFETCH_MB";
const CPU_DEVICES: &str = "HIPFILE_CPU_DEVICES";
const ALLOW_COMPAT_MODE: &str = "HIPFILE_ALLOW_COMPAT_MODE";

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

/// Most executors a configuration may ask for (`HIPFILE_THREADS`, `HIPFILE_CPUS`).
pub const MAX_EXECUTORS: usize = 256;
/// Most executors the default configuration uses (see [`default_executor_count`]).
pub const DEFAULT_MAX_EXECUTORS: usize = 16;
/// Executors the default configuration always allows, CPUs permitting: below this many
/// no CPU is left aside for the application and the arm poller.
pub(crate) const DEFAULT_MIN_EXECUTORS: usize = 8;

/// The default executor count for `usable` CPUs: one per CPU up to
/// `DEFAULT_MIN_EXECUTORS` (8); beyond, two CPUs stay free for the application and the arm
/// poller (so that the poller and idle executors may spin, see
/// `config::spare_cores_for_spinning`), up to [`DEFAULT_MAX_EXECUTORS`]. Hot page-cache
/// reads are bound by the executors' copies out of the page cache: on the 16-core H200
/// machine 8 streams read 39 GiB/s with 12-16 executors and 24-29 GiB/s with 8 (README,
/// Measured). Idle executors park and cost no CPU.
pub fn default_executor_count(usable: usize) -> usize {
    usable.min(DEFAULT_MIN_EXECUTORS).max(usable.saturating_sub(2).min(DEFAULT_MAX_EXECUTORS))
}
/// Smallest staging chunk (`HIPFILE_CHUNK_KB=4`).
pub(crate) const MIN_CHUNK_BYTES: usize = 4 * KIB;
/// Largest staging chunk (`HIPFILE_CHUNK_KB=65536`).
pub(crate) const MAX_CHUNK_BYTES: usize = 64 * MIB;
/// Largest `HIPFILE_QUEUE_DEPTH`.
pub(crate) const MAX_CHUNKS_IN_FLIGHT: usize = 64;
/// Largest `HIPFILE_COPY_SPIN_US`.
pub(crate) const MAX_COPY_SPIN_US: usize = 10_000;
/// How long an executor polls a staging copy's completion by yielding before it sleeps:
/// copies of small chunks finish in microseconds, and a timer sleep costs ~50 µs of
/// wake-up.
const DEFAULT_COPY_SPIN_US: usize = 200;
/// How long an executor keeps polling after its last work before it parks, where cores
/// are to spare: a job posted within it starts without the park/wake-up round trip (~7 µs
/// of the 21 µs hop, shared/reference/glommio.md); an idle executor parks, costing no CPU.
/// Each wake-up of a busy executor (a read or copy completing) costs up to this much
/// CPU again before it parks.
pub const DEFAULT_PARK_SPIN_US: usize = 50;
/// Largest `HIPFILE_PARK_SPIN_US`.
pub(crate) const MAX_PARK_SPIN_US: usize = 1000;
/// Largest `HIPFILE_CPU_DEVICES`.
pub(crate) const MAX_CPU_DEVICES: u32 = 16;

const DEFAULT_CHUNK_KB: usize = 1024;
const DEFAULT_STAGING_MB: usize = 32;
const DEFAULT_PINNED_FALLBACK_MB: usize = 16;
const DEFAULT_CHUNKS_IN_FLIGHT: usize = 4;
/// Default prefetch budget: two streams' windows. It hides the gap between one stream's
/// ops; more only holds staging while the executors are busy anyway. On the H200 with 16
/// executors, 8 streams read 36-37 GiB/s with 32-128 MiB and 24-26 GiB/s with 256 MiB
/// (README, Measured).
pub const DEFAULT_PREFETCH_CAP_BYTES: usize = 64 * MIB;

const REASON_DEVICE: &str = "must be auto, cpu, cuda or rocm";
const REASON_ODIRECT: &str = "must be auto, on or off";
const REASON_THREADS: &str = "must be an integer between 1 and 256";
const REASON_CPUS_SYNTAX: &str = "must be a list of CPU numbers and ranges such as 0,2,4-7";
const REASON_CPUS_MASK: &str = "lists a CPU outside this process's affinity mask";
const REASON_CPUS_TWICE: &str = "lists a CPU twice";
const REASON_CPUS_MANY: &str = "lists more than 256 CPUs";
const REASON_NO_CPU: &str = "no usable CPU: the process affinity mask is empty";
const REASON_CHUNK: &str = "must be a power of two between 4 and 65536";
const REASON_STAGING: &str = "must be a positive integer number of MiB that fits in usize bytes";
const REASON_STAGING_CHUNKS: &str = "must hold at least 2 chunks of HIPFILE_CHUNK_KB";
const REASON_PINNED_OVERFLOW: &str =
    "executor count x staging + pinned fallback overflows usize bytes";
const REASON_PINNED_MEMORY: &str =
    "executor count x staging + pinned fallback exceeds the machine's physical memory";
const REASON_FALLBACK: &str = "must be an integer number of MiB that fits in usize";
const REASON_FALLBACK_CHUNK: &str =
    "must hold at least one chunk of HIPFILE_CHUNK_KB (the engine's backpressure needs one)";
const REASON_PARALLELISM: &str = "must be an integer between 1 and the executor count";
const REASON_BUSY_FAN_OUT: &str = "must be an integer between 1 and the executor count";
const REASON_LOADED_FAN_OUT: &str = "must be off or an integer between 1 and 256";
const REASON_QUEUE_DEPTH: &str = "must be an integer between 1 and 64";
const REASON_COPY_SPIN: &str = "must be an integer between 0 and 10000";
const REASON_PARK_SPIN: &str = "must be an integer between 0 and 1000";
const REASON_PREFETCH: &str = "must be an integer number of MiB that fits in usize";
const REASON_CPU_DEVICES: &str = "must be an integer between 1 and 16";

/// Every variable, with a one-line description that states its default.
pub const ENV_VARS: &[(&str, &str)] = &[
    (DEVICE, "device backend: auto, cpu, cuda or rocm (default auto)"),
    (
        THREADS,
        "I/O executors, 1..=256, on the first CPUs of the pool, reused round-robin \
         (default: one per usable CPU up to 8, beyond that all but two, at most 16; one per CPU of HIPFILE_CPUS if set)",
    ),
    (CPUS, "CPU pool for the executors, e.g. 0,2,4-7 (default: the process affinity mask)"),
    (CHUNK_KB, "staging chunk size in KiB, a power of two in 4..=65536 (default 1024)"),
    (STAGING_MB, "pinned staging arena per executor in MiB, at least 2 chunks (default 32)"),
    (
        PINNED_FALLBACK_MB,
        "extra pinned staging in MiB used when an arena is exhausted, at least one chunk \
         (default 16, or one chunk if larger)",
    ),
    (ODIRECT, "O_DIRECT policy: auto, on or off (default auto)"),
    (
        REQUEST_PARALLELISM,
        "executors one large request may fan out to, 1..=executor count (default: all)",
    ),
    (
        BUSY_FAN_OUT,
        "fan-out that follows the load: a request spreads over the executors that have no \
         job, at least this many, at most HIPFILE_REQUEST_PARALLELISM; 1..=executor count \
         (default unset: always HIPFILE_REQUEST_PARALLELISM)",
    ),
    (
        LOADED_FAN_OUT,
        "parts per queued request (async op, batch entry) once at least half as many queued \
         requests as executors are in flight, on the least loaded executors (fewer, longer \
         parts when every executor has work anyway); off or 1..=256 (default 2)",
    ),
    (QUEUE_DEPTH, "chunks in flight per op, 1..=64 (default 4)"),
    (
        COPY_SPIN_US,
        "microseconds an executor polls a staging copy's completion by yielding to its other \
         work before it sleeps between polls, 0..=10000 (default 200)",
    ),
    (
        PARK_SPIN_US,
        "microseconds an executor keeps polling after its last work before it parks \
         (sleeps until woken), 0..=1000 (default: 50 where the machine has two cores \
         besides the executors, else 0)",
    ),
    (
        PREFETCH_MB,
        "MiB of fully FIXED async reads all streams together may read ahead of their \
         streams; 0 turns prefetch off (default: half the staging arenas)",
    ),
    (CPU_DEVICES, "devices the cpu backend exposes, 1..=16 (default 1)"),
    (
        ALLOW_COMPAT_MODE,
        "allow the POSIX compatibility path: true or false, any case; other values are \
         ignored (default true)",
    ),
    (IO_URING, "the engine uses io_uring: 1/on/true or 0/off/false (default on)"),
    (
        STREAM_COPIES,
        "async ops copied on the user's own stream through pinned slots: on (fully FIXED \
         reads of 64 KiB or less submitted to an idle stream), all (every op whose buffer \
         offset and size stay as submitted, on any stream: up to 16 MiB in a slot, longer \
         ones in pieces, ops past the slots' cap through their stream's spare slots) or \
         off; also 1/true, 0/false (default: all on cuda, off on the cpu and rocm devices)",
    ),
    (
        INLINE_READ_KB,
        "async reads of at most this many KiB submitted to an idle stream are read inside \
         the submit call when the page cache holds them, and only their copy is enqueued on \
         the stream; 0..=16384, 0 turns it off (default 64)",
    ),
    (
        STREAM_COPY_MB,
        "with HIPFILE_STREAM_COPIES=all: the most pinned MiB of slots of each size above \
         64 KiB (256 KiB, 1, 4 and 16 MiB), at least 16 (default a 64th of the machine's \
         memory in whole 16 MiB slots, 64 to 1024)",
    ),
    (
        STREAM_COPY_PIECE_MB,
        "with HIPFILE_STREAM_COPIES=all: the MiB of each piece of an op longer than that \
         whose buffer offset and size are FIXED, 1, 4 or 16 (default 16)",
    ),
    (
        STREAM_WRITE_PIECE_KB,
        "with HIPFILE_STREAM_COPIES=all: a write whose size and offsets are all FIXED, \
         through the page cache, copied into a slot of its own on its stream and longer \
         than this many KiB, goes in pieces of it, each written to the file while the \
         stream copies the next; 0 or a power of two from 64 to 8192 (default 0: copied \
         whole, then written: pieces moved nothing beyond the noise on an H100)",
    ),
    (
        STREAM_COPY_WRITES,
        "with HIPFILE_STREAM_COPIES=all: writes copied on their own streams into slots, \
         1/on/true, or on the engine's path, each copied out of the buffer by the engine \
         in chunks as it writes them, 0/off/false (default on)",
    ),
    (
        STREAM_COPY_SLOTS,
        "with HIPFILE_STREAM_COPIES=all: the memory of the slots of reads over 64 KiB, \
         pinned (the engine reads the file into them, the stream copies host -> device) or \
         device (the engine's own device memory: the engine reads through its arena and \
         copies into them, the stream copies device -> device); default device on cuda, \
         pinned elsewhere",
    ),
    (
        STREAM_COPY_DEVICE_MB,
        "with HIPFILE_STREAM_COPY_SLOTS=device: the most MiB of the engine's device memory \
         that the slots of one device hold, all sizes together, at least 16 (default 1024); \
         reads past it share their stream's slots or take pinned ones \
         (HIPFILE_STREAM_COPY_DEVICE_FULL)",
    ),
    (
        STREAM_COPY_DEVICE_FULL,
        "with HIPFILE_STREAM_COPY_SLOTS=device: what a read over 64 KiB does when its \
         device's slots are all taken: share (share the slot of an earlier read of its own \
         stream whose copy is still queued, and read the file into it once that copy ran; \
         the default) or pinned (take a pinned slot)",
    ),
    (
        STREAM_COPY_DEVICE_IDLE_MS,
        "with HIPFILE_STREAM_COPY_SLOTS=device: after how many milliseconds without a read \
         taking a slot of its size the free slots of that size give their device memory \
         back (default 5000; 0: kept until the driver is dropped)",
    ),
    (
        BUFFERED_WRITES,
        "how executors write page-cache (not O_DIRECT) chunks: thread (pwrite on the \
         executor's blocking thread) or io_uring (default thread)",
    ),
    (
        CALLER_THREAD,
        "which sync requests the calling thread moves itself, chunk by chunk, instead of \
         the executors: small (at most one chunk; the default), busy (also larger ones \
         that find every executor with a job in flight) or always (every one)",
    ),
];

/// Which synchronous requests the calling thread moves itself (`pread`/`pwrite` and one
/// device copy per chunk, through a pinned fallback chunk) instead of handing them to the
/// executors (`HIPFILE_CALLER_THREAD`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CallerThread {
    /// Requests of at most one chunk (`small`): an executor would do the same work, with
    /// nothing to overlap, after two hand-offs between threads.
    #[default]
    Small,
    /// Also larger requests that find every executor with a job in flight (`busy`): the
    /// executors' parts would only queue behind other work, while the calling thread,
    /// which would wait for them, is a core of its own (cuFile's compat mode moves every
    /// request on its caller's thread).
    Busy,
    /// Every request (`always`): the calling thread alone, as cuFile's compat mode does;
    /// for comparisons.
    Always,
}

/// How the executors write chunks that go through the page cache
/// (`HIPFILE_BUFFERED_WRITES`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum BufferedWrites {
    /// `pwrite` on the executor's blocking thread, from the staging in place. io_uring
    /// hands buffered writes of a regular file to its io-wq workers, one at a time per
    /// file and ring; on the H200 machine plain threads wrote 1.3-1.45x faster
    /// (`benches/results/h200-levers-2026-12-04.txt`).
    #[default]
    Thread,
    /// Through io_uring, like reads and O_DIRECT writes.
    IoUring,
}

/// Which async ops go through a slot of pinned memory copied on the user's own stream
/// (`HIPFILE_STREAM_COPIES`; `async_op::slots`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum StreamCopies {
    /// The backend's choice (unset, the default; a driver resolves it when it is made,
    /// `Driver::new`): `all` on CUDA, where the engine's own copies can be held up by an
    /// application thread's `cuStreamCreate` (README, Known limits), `off` elsewhere.
    #[default]
    Auto,
    /// None: the engine copies every read (`off`).
    Off,
    /// Fully FIXED reads of at most 64 KiB submitted to an idle stream (`on`): on the H200
    /// it took 3-10 µs off a lone 4 KiB read and cost 18-22 % of the small random reads
    /// per second of 8 busy streams.
    Idle,
    /// Every op, on any stream (`all`): ops of at most 16 MiB through a slot for their
    /// device range as submitted (fully FIXED reads inside the file staged at once, other
    /// reads read when the stream reaches them, writes copied into the slot by the stream
    /// before the op's doorbell; an op whose buffer offset or size moved before the stream
    /// reached it declines the slot), ops over 16 MiB with FIXED buffer offset and size in
    /// 16 MiB pieces sharing a ring of slots (`async_op::pieces`). Between the stream
    /// reaching such an op and its release there is no CUDA call (but on the rare paths of
    /// a short or failed read and a declined slot), so an application thread's
    /// `cuStreamCreate` waiting for held streams cannot stall it (README "Known limits").
    /// The default on CUDA.
    All,
}

/// The memory of the slots of reads over 64 KiB under [`StreamCopies::All`]
/// (`HIPFILE_STREAM_COPY_SLOTS`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum StreamCopySlots {
    /// The backend's choice (unset, the default; resolved by `Driver::new`): `device`
    /// where the backend has engine device memory and a device → device copy is cheaper
    /// than a second host pass (CUDA), `pinned` elsewhere.
    #[default]
    Auto,
    /// Pinned host memory (`pinned`): the engine reads the file straight into the slot,
    /// the stream copies host → device.
    Pinned,
    /// Device memory of the engine's own (its context on CUDA), on the op's device
    /// (`device`): the engine reads through its staging arena and copies into the slot as
    /// on its own path, the stream copies device → device. The slots' footprint is then
    /// GPU memory, and the host side reads into the arena's few, reused chunks instead of
    /// as many slots as ops in flight. Writes and reads of at most 64 KiB keep pinned
    /// slots. A backend without engine device memory (rocm today) uses pinned slots.
    Device,
}

/// What a read over 64 KiB does when every slot of device memory of its size is taken
/// and the device's cap is reached (`HIPFILE_STREAM_COPY_DEVICE_FULL`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum DeviceSlotsFull {
    /// Take a pinned slot (`pinned`): read ahead like any staged read, its stream then
    /// copies host → device after the release, in the stream's round trip.
    Pinned,
    /// Share the slot of an earlier read of the same stream whose copy out of it is
    /// queued (`share`): the stream runs that copy before it reaches this read, which is
    /// therefore read into the slot only once that copy ran (ahead of the stream from then
    /// on, at the latest when the stream reaches it); its stream copies device → device
    /// as for a slot of its own. No memory beyond the cap; where the stream has no such
    /// slot, a pinned one. The default: on an H100, 16 MiB reads at 8 and 16 streams
    /// past the cap ran 1.09–1.13× `Pinned` (`benches/results/h100-2026-12-06-f/`).
    #[default]
    Share,
}

/// Which device backend to use (`HIPFILE_DEVICE`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum DeviceSelection {
    /// The first backend that finds a device.
    #[default]
    Auto,
    /// The in-process `cpu` device.
    Cpu,
    /// NVIDIA GPUs through CUDA.
    Cuda,
    /// AMD GPUs through ROCm / HIP.
    Rocm,
}

/// A rejected variable (or, from [`Config::validate`], field): displays as
/// `HIPFILE_CHUNK_KB=3000: must be a power of two between 4 and 65536`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The variable's name.
    pub variable: &'static str,
    /// The rejected value, as given (trimmed) or, from [`Config::validate`], the field's
    /// value in the variable's unit.
    pub value: String,
    /// What the value must be.
    pub reason: &'static str,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}: {}", self.variable, self.value, self.reason)
    }
}

impl std::error::Error for ConfigError {}

/// The runtime's configuration. Build it from the environment ([`Config::from_env`],
/// [`Config::global`]) or by hand, then call [`Config::validate`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Device backend (`HIPFILE_DEVICE`).
    pub device: DeviceSelection,
    /// The CPU each executor pins to, one entry per executor; a CPU may repeat
    /// (`HIPFILE_THREADS`, `HIPFILE_CPUS`).
    pub executor_cpus: Vec<usize>,
    /// Staging chunk size, a power of two in 4 KiB..=64 MiB (`HIPFILE_CHUNK_KB`).
    pub staging_chunk_bytes: usize,
    /// Each executor's pinned staging arena, at least 2 chunks (`HIPFILE_STAGING_MB`).
    pub staging_per_executor_bytes: usize,
    /// Cap of the extra pinned chunks used when an arena is exhausted and by requests
    /// moved on the caller's thread (`HIPFILE_PINNED_FALLBACK_MB`); the pool holds one
    /// chunk per executor more under `busy`/`always` ([`Config::fallback_pool_bytes`]).
    pub pinned_fallback_cap_bytes: usize,
    /// O_DIRECT policy for registered files (`HIPFILE_ODIRECT`).
    pub direct: DirectPolicy,
    /// Executors one large request may fan out to, 1..=executor count
    /// (`HIPFILE_REQUEST_PARALLELISM`).
    pub request_parallelism: usize,
    /// The fan-out that follows the load (`HIPFILE_BUSY_FAN_OUT`): `Some(n)`, a request
    /// spreads over the executors that have no job in flight, at least `n` of them and at
    /// most `request_parallelism`, so that a lone request uses every executor and requests
    /// that find every executor busy go as `n` longer parts; `None`: always
    /// `request_parallelism`.
    pub busy_fan_out: Option<usize>,
    /// The fan-out under load (`HIPFILE_LOADED_FAN_OUT`), 1..=256: `Some(n)`, a queued
    /// request (an async op's, a batch entry's) split while at least half as many queued
    /// requests as executors are in flight goes as at most `n` parts; `None`: the fan-out
    /// does not look at the requests in flight.
    pub loaded_fan_out: Option<usize>,
    /// Chunks in flight per op, 1..=64 (`HIPFILE_QUEUE_DEPTH`).
    pub chunks_in_flight: usize,
    /// Microseconds an executor polls a staging copy's completion by yielding before it
    /// sleeps between polls, 0..=10000 (`HIPFILE_COPY_SPIN_US`).
    pub copy_spin_us: usize,
    /// Microseconds an executor keeps polling after its last work before it parks,
    /// 0..=1000 (`HIPFILE_PARK_SPIN_US`); `None`: [`DEFAULT_PARK_SPIN_US`] where the
    /// machine has two cores besides the executors, else 0
    /// ([`Config::park_spin_us_on`]).
    pub park_spin_us: Option<usize>,
    /// Bytes of fully FIXED async reads all streams together may prefetch; 0 = off;
    /// `None`: [`DEFAULT_PREFETCH_CAP_BYTES`] or half the staging arenas, whichever is
    /// less (`HIPFILE_PREFETCH_MB`). See [`Config::prefetch_cap_bytes`].
    pub prefetch_budget_bytes: Option<usize>,
    /// Devices the cpu backend exposes, 1..=16 (`HIPFILE_CPU_DEVICES`).
    pub cpu_device_count: u32,
    /// Whether the POSIX compatibility path is allowed (`HIPFILE_ALLOW_COMPAT_MODE`).
    pub allow_compat_mode: bool,
    /// Whether the engine uses io_uring (`HIPFILE_IO_URING`, default on); off: every
    /// executor runs blocking `pread`/`pwrite`.
    pub use_io_uring: bool,
    /// How io_uring executors write page-cache chunks (`HIPFILE_BUFFERED_WRITES`).
    pub buffered_writes: BufferedWrites,
    /// Which sync requests the calling thread moves itself (`HIPFILE_CALLER_THREAD`).
    pub caller_thread: CallerThread,
    /// Which fully FIXED async reads stage ahead into a slot and copy on the user's own
    /// stream (`HIPFILE_STREAM_COPIES`, default the backend's choice; [`StreamCopies`]).
    pub stream_copies: StreamCopies,
    /// Async reads of at most this many bytes submitted to a stream with nothing left to
    /// run are read inside the submit call when the page cache holds every byte, and only
    /// their copy (and its slot's done write) is enqueued on the stream
    /// (`HIPFILE_INLINE_READ_KB`, default 64 KiB; 0: off). See `async_op::inline_read`.
    pub inline_read_bytes: usize,
    /// With [`StreamCopies::All`]: the most pinned bytes of slots of each size above
    /// 64 KiB (`HIPFILE_STREAM_COPY_MB`); an op that finds no free slot goes through its
    /// stream's spare slot (buffer offset and size FIXED; spares may take their size to
    /// twice this) or takes the engine's path.
    pub stream_copy_cap_bytes: usize,
    /// With [`StreamCopies::All`]: the bytes of each piece of a long op whose buffer
    /// offset and size are FIXED, 1, 4 or 16 MiB (`HIPFILE_STREAM_COPY_PIECE_MB`, default
    /// 16): an op longer than that goes as pieces sharing a ring of four slots of that
    /// size, and the stream copies each piece as soon as it is read.
    pub stream_copy_piece_bytes: usize,
    /// With [`StreamCopies::All`]: a write whose size and offsets are all FIXED, copied
    /// into a slot of its own on its stream and longer than this, is copied in pieces of
    /// this many bytes, each written to the file as soon as the stream has copied it
    /// (`HIPFILE_STREAM_WRITE_PIECE_KB`; 0, the default (within the noise on an H100): one copy,
    /// written after it).
    /// See `async_op::write_pieces`.
    pub stream_write_piece_bytes: usize,
    /// With [`StreamCopies::All`]: whether writes are copied on their own streams too
    /// (`HIPFILE_STREAM_COPY_WRITES`, default on); off, every write takes the engine's
    /// path (the engine copies the source out of the buffer chunk by chunk and writes
    /// each chunk from its staging while it copies the next), reads still as `all` says.
    pub stream_copy_writes: bool,
    /// With [`StreamCopies::All`]: the memory of read slots over 64 KiB
    /// (`HIPFILE_STREAM_COPY_SLOTS`, default the backend's choice; [`StreamCopySlots`]).
    pub stream_copy_slots: StreamCopySlots,
    /// With [`StreamCopySlots::Device`]: the most bytes of the engine's device memory that
    /// the slots of one device hold, all sizes together (`HIPFILE_STREAM_COPY_DEVICE_MB`);
    /// reads past it share their stream's slots or take pinned ones
    /// ([`Config::stream_copy_device_full`]).
    pub stream_copy_device_cap_bytes: usize,
    /// With [`StreamCopySlots::Device`]: what a read does when its device's slots are all
    /// taken (`HIPFILE_STREAM_COPY_DEVICE_FULL`; [`DeviceSlotsFull`]).
    pub stream_copy_device_full: DeviceSlotsFull,
    /// With [`StreamCopySlots::Device`]: the milliseconds after which a slot size that no
    /// read took gives the device memory of its free slots back
    /// (`HIPFILE_STREAM_COPY_DEVICE_IDLE_MS`, default 5000; 0: never, until the driver is
    /// dropped).
    pub stream_copy_device_idle_ms: u64,
}

/// The default of `HIPFILE_STREAM_COPY_MB` on a machine of `physical_bytes` of memory
/// (unknown: the least).
fn default_stream_copy_mib(physical_bytes: Option<u64>) -> usize {
    let share_mib = physical_bytes.map_or(0, |bytes| bytes / STREAM_COPY_MEMORY_SHARE / MIB as u64);
    let whole_slots_mib = usize::try_from(share_mib / 16 * 16).unwrap_or(usize::MAX);
    whole_slots_mib.clamp(MIN_DEFAULT_STREAM_COPY_MB, MAX_DEFAULT_STREAM_COPY_MB)
}

/// A switch: `1`/`on`/`true` or `0`/`off`/`false` (surrounding blanks ignored), `default`
/// when unset.
fn on_off(
    variable: &'static str,
    value: Option<String>,
    default: bool,
) -> Result<bool, ConfigError> {
    match value.as_deref().map(str::trim) {
        None => Ok(default),
        Some("1" | "on" | "true") => Ok(true),
        Some("0" | "off" | "false") => Ok(false),
        Some(other) => {
            Err(ConfigError { variable, value: other.to_string(), reason: REASON_ON_OFF })
        }
    }
}

impl Default for Config {
    /// The configuration with every variable unset, for this process's affinity mask.
    fn default() -> Config {
        Config::defaults_for(&usable_cpus())
    }
}

impl Config {
    /// Number of executors (`executor_cpus.len()`).
    pub fn executor_count(&self) -> usize {
        self.executor_cpus.len()
    }

    /// Bytes of fully FIXED async reads all streams together may prefetch ahead of their
    /// streams (0: none): `HIPFILE_PREFETCH_MB`, else [`DEFAULT_PREFETCH_CAP_BYTES`] or
    /// half of executors x staging, whichever is less (the other half serves the ops the
    /// streams have reached).
    pub fn prefetch_cap_bytes(&self) -> usize {
        self.prefetch_budget_bytes.unwrap_or_else(|| {
            let half_arenas =
                self.executor_count().saturating_mul(self.staging_per_executor_bytes) / 2;
            half_arenas.min(DEFAULT_PREFETCH_CAP_BYTES)
        })
    }

    /// The most pinned staging memory the engine ever holds: every executor's arena
    /// plus the fallback pool ([`Config::fallback_pool_bytes`]; saturating,
    /// [`Config::validate`] rejects overflow).
    pub fn pinned_cap_bytes(&self) -> usize {
        self.checked_pinned_cap_bytes().unwrap_or(usize::MAX)
    }

    /// Reads the `HIPFILE_*` variables of the process environment (values that are not
    /// UTF-8 are read lossily, and so rejected as garbage).
    ///
    /// # Errors
    /// The first variable with an invalid value, or an invalid combination.
    pub fn from_env() -> Result<Config, ConfigError> {
        Config::from_lookup(|name| std::env::var_os(name).map(|v| v.to_string_lossy().into()))
    }

    /// Like [`Config::from_env`], reading variables through `lookup` (`None` = unset),
    /// with this process's affinity mask as the usable CPUs.
    ///
    /// # Errors
    /// The first variable with an invalid value, or an invalid combination.
    ///
    /// Public for the integration tests; embedders do not need it.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        Config::from_lookup_with_cpus(lookup, &usable_cpus())
    }

    /// Like [`Config::from_lookup`], with `usable_cpus` standing for the affinity mask
    /// (the default CPU pool, and the CPUs `HIPFILE_CPUS` may name).
    ///
    /// # Errors
    /// The first variable with an invalid value, or an invalid combination.
    ///
    /// Public for the integration tests; embedders do not need it.
    pub fn from_lookup_with_cpus(
        lookup: impl Fn(&str) -> Option<String>,
        usable_cpus: &[usize],
    ) -> Result<Config, ConfigError> {
        // Empty or all-whitespace values count as unset.
        let get = |name: &str| lookup(name).filter(|value| !value.trim().is_empty());
        let mut config = Config::defaults_for(usable_cpus);
        config.device = parse_device(get(DEVICE))?;
        config.direct = parse_direct(get(ODIRECT))?;
        config.executor_cpus = parse_executor_cpus(get(THREADS), get(CPUS), usable_cpus)?;
        config.staging_chunk_bytes = parse_chunk_bytes(get(CHUNK_KB))?;
        config.staging_per_executor_bytes =
            parse_mib(STAGING_MB, get(STAGING_MB), DEFAULT_STAGING_MB, 1, REASON_STAGING)?;
        // Unset: 16 MiB, or one chunk when chunks are larger.
        let default_fallback_mb =
            DEFAULT_PINNED_FALLBACK_MB.max(config.staging_chunk_bytes.div_ceil(MIB));
        config.pinned_fallback_cap_bytes = parse_mib(
            PINNED_FALLBACK_MB,
            get(PINNED_FALLBACK_MB),
            default_fallback_mb,
            0,
            REASON_FALLBACK,
        )?;
        let executors = config.executor_count();
        config.request_parallelism = parse_count(
            REQUEST_PARALLELISM,
            get(REQUEST_PARALLELISM),
            1..=executors,
            executors,
            REASON_PARALLELISM,
        )?;
        config.busy_fan_out = match get(BUSY_FAN_OUT) {
            None => None,
            raw => Some(parse_count(BUSY_FAN_OUT, raw, 1..=executors, 1, REASON_BUSY_FAN_OUT)?),
        };
        config.loaded_fan_out = match get(LOADED_FAN_OUT) {
            None => config.loaded_fan_out,
            Some(raw) if raw.trim().eq_ignore_ascii_case("off") => None,
            raw => {
                let range = 1..=MAX_EXECUTORS;
                Some(parse_count(LOADED_FAN_OUT, raw, range, 1, REASON_LOADED_FAN_OUT)?)
            }
        };
        config.inline_read_bytes = parse_count(
            INLINE_READ_KB,
            get(INLINE_READ_KB),
            0..=MAX_INLINE_READ_KB,
            DEFAULT_INLINE_READ_KB,
            REASON_INLINE_READ,
        )? * KIB;
        config.chunks_in_flight = parse_count(
            QUEUE_DEPTH,
            get(QUEUE_DEPTH),
            1..=MAX_CHUNKS_IN_FLIGHT,
            DEFAULT_CHUNKS_IN_FLIGHT,
            REASON_QUEUE_DEPTH,
        )?;
        config.copy_spin_us = parse_count(
            COPY_SPIN_US,
            get(COPY_SPIN_US),
            0..=MAX_COPY_SPIN_US,
            DEFAULT_COPY_SPIN_US,
            REASON_COPY_SPIN,
        )?;
        config.park_spin_us = match get(PARK_SPIN_US) {
            None => None,
            raw => Some(parse_count(PARK_SPIN_US, raw, 0..=MAX_PARK_SPIN_US, 0, REASON_PARK_SPIN)?),
        };
        config.prefetch_budget_bytes = match get(PREFETCH_MB) {
            None => None,
            raw => Some(parse_mib(PREFETCH_MB, raw, 0, 0, REASON_PREFETCH)?),
        };
        let max_devices = MAX_CPU_DEVICES as usize;
        let cpu_devices =
            parse_count(CPU_DEVICES, get(CPU_DEVICES), 1..=max_devices, 1, REASON_CPU_DEVICES)?;
        config.cpu_device_count = u32::try_from(cpu_devices).unwrap_or(MAX_CPU_DEVICES);
        // hipFile's bool parsing sees the raw value, empty included.
        config.allow_compat_mode = parse_hipfile_bool(lookup(ALLOW_COMPAT_MODE)).unwrap_or(true);
        config.use_io_uring = on_off(IO_URING, get(IO_URING), true)?;
        config.stream_copies = match get(STREAM_COPIES).as_deref().map(str::trim) {
            None => StreamCopies::Auto,
            Some("all") => StreamCopies::All,
            raw => match on_off(STREAM_COPIES, raw.map(str::to_string), false) {
                Ok(true) => StreamCopies::Idle,
                Ok(false) => StreamCopies::Off,
                Err(error) => return Err(ConfigError { reason: REASON_STREAM_COPIES, ..error }),
            },
        };
        config.stream_copy_cap_bytes = parse_mib(
            STREAM_COPY_MB,
            get(STREAM_COPY_MB),
            default_stream_copy_mib(crate::sys::physical_memory_bytes()),
            16,
            REASON_STREAM_COPY_MB,
        )?;
        config.stream_copy_piece_bytes = parse_mib(
            STREAM_COPY_PIECE_MB,
            get(STREAM_COPY_PIECE_MB),
            DEFAULT_STREAM_COPY_PIECE_MB,
            1,
            REASON_STREAM_COPY_PIECE_MB,
        )?;
        if ![1, 4, 16].contains(&(config.stream_copy_piece_bytes / MIB)) {
            return Err(ConfigError {
                variable: STREAM_COPY_PIECE_MB,
                value: get(STREAM_COPY_PIECE_MB).unwrap_or_default().trim().to_owned(),
                reason: REASON_STREAM_COPY_PIECE_MB,
            });
        }
        config.stream_write_piece_bytes = parse_count(
            STREAM_WRITE_PIECE_KB,
            get(STREAM_WRITE_PIECE_KB),
            0..=8192,
            DEFAULT_STREAM_WRITE_PIECE_KB,
            REASON_STREAM_WRITE_PIECE_KB,
        )? * KIB;
        config.stream_copy_writes = on_off(STREAM_COPY_WRITES, get(STREAM_COPY_WRITES), true)?;
        config.stream_copy_slots = parse_choice(
            STREAM_COPY_SLOTS,
            get(STREAM_COPY_SLOTS),
            &[("pinned", StreamCopySlots::Pinned), ("device", StreamCopySlots::Device)],
            StreamCopySlots::Auto,
            REASON_STREAM_COPY_SLOTS,
        )?;
        config.stream_copy_device_cap_bytes = parse_mib(
            STREAM_COPY_DEVICE_MB,
            get(STREAM_COPY_DEVICE_MB),
            DEFAULT_STREAM_COPY_DEVICE_MB,
            16,
            REASON_STREAM_COPY_MB,
        )?;
        config.stream_copy_device_full = parse_choice(
            STREAM_COPY_DEVICE_FULL,
            get(STREAM_COPY_DEVICE_FULL),
            &[("pinned", DeviceSlotsFull::Pinned), ("share", DeviceSlotsFull::Share)],
            DeviceSlotsFull::Share,
            REASON_STREAM_COPY_DEVICE_FULL,
        )?;
        config.stream_copy_device_idle_ms = parse_count(
            STREAM_COPY_DEVICE_IDLE_MS,
            get(STREAM_COPY_DEVICE_IDLE_MS),
            0..=MAX_STREAM_COPY_DEVICE_IDLE_MS as usize,
            DEFAULT_STREAM_COPY_DEVICE_IDLE_MS as usize,
            REASON_STREAM_COPY_DEVICE_IDLE,
        )? as u64;
        config.buffered_writes = parse_choice(
            BUFFERED_WRITES,
            get(BUFFERED_WRITES),
            &[("thread", BufferedWrites::Thread), ("io_uring", BufferedWrites::IoUring)],
            BufferedWrites::Thread,
            REASON_BUFFERED_WRITES,
        )?;
        config.caller_thread = parse_choice(
            CALLER_THREAD,
            get(CALLER_THREAD),
            &[
                ("small", CallerThread::Small),
                ("busy", CallerThread::Busy),
                ("always", CallerThread::Always),
            ],
            CallerThread::Small,
            REASON_CALLER_THREAD,
        )?;
        config.validate()?;
        Ok(config)
    }

    /// The process-wide configuration, read from the environment on first use.
    ///
    /// When the environment is invalid, one warning line naming the variable goes to
    /// stderr and **every** field takes its default ([`Config::default`]): a half-applied
    /// configuration would be harder to reason about than none.
    pub fn global() -> &'static Config {
        static GLOBAL: OnceLock<Config> = OnceLock::new();
        GLOBAL.get_or_init(|| {
            Config::from_env().unwrap_or_else(|error| {
                log::warn!("ignoring HIPFILE_* settings, {error}; using defaults");
                Config::default()
            })
        })
    }

    /// Checks the ranges of every field and the relations between them (staging holds 2
    /// chunks, parallelism within the executor count, pinned cap fits `usize`, ...). The
    /// error names the variable that sets the offending field.
    ///
    /// # Errors
    /// The first field out of range, as a [`ConfigError`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        let executors = self.executor_count();
        let chunk_bytes = self.staging_chunk_bytes;
        let staging_bytes = self.staging_per_executor_bytes;
        check(THREADS, executors.to_string(), REASON_THREADS, || {
            (1..=MAX_EXECUTORS).contains(&executors)
        })?;
        check(CHUNK_KB, in_unit(chunk_bytes, KIB), REASON_CHUNK, || chunk_ok(chunk_bytes))?;
        check(STAGING_MB, in_unit(staging_bytes, MIB), REASON_STAGING_CHUNKS, || {
            staging_bytes / 2 >= chunk_bytes
        })?;
        check(STAGING_MB, in_unit(staging_bytes, MIB), REASON_PINNED_OVERFLOW, || {
            self.checked_pinned_cap_bytes().is_some()
        })?;
        // Pinned memory cannot be paged out: more than the machine has can never be
        // allocated (and a typo such as a size in KiB given as MiB would only fail later).
        check(STAGING_MB, in_unit(staging_bytes, MIB), REASON_PINNED_MEMORY, || {
            let physical = crate::sys::physical_memory_bytes().unwrap_or(u64::MAX);
            self.pinned_cap_bytes() as u64 <= physical
        })?;
        let fallback_bytes = self.pinned_fallback_cap_bytes;
        check(PINNED_FALLBACK_MB, in_unit(fallback_bytes, MIB), REASON_FALLBACK_CHUNK, || {
            fallback_bytes >= chunk_bytes
        })?;
        let parallelism = self.request_parallelism;
        check(REQUEST_PARALLELISM, parallelism.to_string(), REASON_PARALLELISM, || {
            (1..=executors).contains(&parallelism)
        })?;
        if let Some(busy) = self.busy_fan_out {
            check(BUSY_FAN_OUT, busy.to_string(), REASON_BUSY_FAN_OUT, || {
                (1..=executors).contains(&busy)
            })?;
        }
        if let Some(parts) = self.loaded_fan_out {
            check(LOADED_FAN_OUT, parts.to_string(), REASON_LOADED_FAN_OUT, || {
                (1..=MAX_EXECUTORS).contains(&parts)
            })?;
        }
        let inline = self.inline_read_bytes;
        check(INLINE_READ_KB, in_unit(inline, KIB), REASON_INLINE_READ, || {
            inline <= MAX_INLINE_READ_KB * KIB
        })?;
        let write_piece = self.stream_write_piece_bytes;
        check(
            STREAM_WRITE_PIECE_KB,
            in_unit(write_piece, KIB),
            REASON_STREAM_WRITE_PIECE_KB,
            || {
                write_piece == 0
                    || (write_piece.is_power_of_two()
                        && (64 * KIB..=8192 * KIB).contains(&write_piece))
            },
        )?;
        let depth = self.chunks_in_flight;
        check(QUEUE_DEPTH, depth.to_string(), REASON_QUEUE_DEPTH, || {
            (1..=MAX_CHUNKS_IN_FLIGHT).contains(&depth)
        })?;
        let spin = self.copy_spin_us;
        check(COPY_SPIN_US, spin.to_string(), REASON_COPY_SPIN, || spin <= MAX_COPY_SPIN_US)?;
        if let Some(park) = self.park_spin_us {
            check(PARK_SPIN_US, park.to_string(), REASON_PARK_SPIN, || park <= MAX_PARK_SPIN_US)?;
        }
        let devices = self.cpu_device_count;
        check(CPU_DEVICES, devices.to_string(), REASON_CPU_DEVICES, || {
            (1..=MAX_CPU_DEVICES).contains(&devices)
        })
    }

    /// Every variable unset, with `usable_cpus` as the CPU pool.
    pub(crate) fn defaults_for(usable_cpus: &[usize]) -> Config {
        // Fails only for an empty pool; CPU 0 then stands in.
        let executor_cpus =
            parse_executor_cpus(None, None, usable_cpus).unwrap_or_else(|_| vec![0]);
        Config {
            device: DeviceSelection::Auto,
            request_parallelism: executor_cpus.len(),
            busy_fan_out: None,
            loaded_fan_out: DEFAULT_LOADED_FAN_OUT,
            prefetch_budget_bytes: None,
            executor_cpus,
            staging_chunk_bytes: DEFAULT_CHUNK_KB * KIB,
            staging_per_executor_bytes: DEFAULT_STAGING_MB * MIB,
            pinned_fallback_cap_bytes: DEFAULT_PINNED_FALLBACK_MB * MIB,
            direct: DirectPolicy::Auto,
            chunks_in_flight: DEFAULT_CHUNKS_IN_FLIGHT,
            copy_spin_us: DEFAULT_COPY_SPIN_US,
            park_spin_us: None,
            cpu_device_count: 1,
            allow_compat_mode: true,
            use_io_uring: true,
            buffered_writes: BufferedWrites::Thread,
            caller_thread: CallerThread::Small,
            stream_copies: StreamCopies::Auto,
            inline_read_bytes: DEFAULT_INLINE_READ_KB * KIB,
            stream_copy_cap_bytes: default_stream_copy_mib(crate::sys::physical_memory_bytes())
                * MIB,
            stream_copy_piece_bytes: DEFAULT_STREAM_COPY_PIECE_MB * MIB,
            stream_write_piece_bytes: DEFAULT_STREAM_WRITE_PIECE_KB * KIB,
            stream_copy_writes: true,
            stream_copy_slots: StreamCopySlots::Auto,
            stream_copy_device_cap_bytes: DEFAULT_STREAM_COPY_DEVICE_MB * MIB,
            stream_copy_device_full: DeviceSlotsFull::Share,
            stream_copy_device_idle_ms: DEFAULT_STREAM_COPY_DEVICE_IDLE_MS,
        }
    }

    fn checked_pinned_cap_bytes(&self) -> Option<usize> {
        self.executor_count()
            .checked_mul(self.staging_per_executor_bytes)?
            .checked_add(self.checked_fallback_pool_bytes()?)
    }

    /// The pinned fallback pool's size: the cap (`HIPFILE_PINNED_FALLBACK_MB`) and, when
    /// the caller's thread moves requests of many chunks (`HIPFILE_CALLER_THREAD=busy` or
    /// `always`), one chunk per executor, which those requests leave free for the
    /// executors (blocking executors take one for every chunk they move): the callers
    /// get the cap, the executors their own chunk (saturating; [`Config::validate`]
    /// rejects overflow).
    pub fn fallback_pool_bytes(&self) -> usize {
        self.checked_fallback_pool_bytes().unwrap_or(usize::MAX)
    }

    /// How long each executor polls after its last work before it parks, on a machine
    /// with `cores` cores: `HIPFILE_PARK_SPIN_US` when set, else [`DEFAULT_PARK_SPIN_US`]
    /// when two cores are left besides the executors (the arm poller and the
    /// application; without them a spinning executor takes CPU from the work it waits
    /// for), else zero (no spinning).
    pub fn park_spin_us_on(&self, cores: usize) -> usize {
        self.park_spin_us.unwrap_or(if spare_cores_for_spinning(self.executor_count(), cores) {
            DEFAULT_PARK_SPIN_US
        } else {
            0
        })
    }

    /// [`Config::park_spin_us_on`] this machine ([`available_cores`]): what the engine
    /// uses.
    pub fn park_spin_us(&self) -> usize {
        self.park_spin_us_on(available_cores())
    }

    fn checked_fallback_pool_bytes(&self) -> Option<usize> {
        let executors_chunks = match self.caller_thread {
            CallerThread::Small => 0,
            CallerThread::Busy | CallerThread::Always => self.executor_count(),
        };
        executors_chunks
            .checked_mul(self.staging_chunk_bytes)?
            .checked_add(self.pinned_fallback_cap_bytes)
    }
}

/// The cores this process may run on (`available_parallelism`; 1 when unknown).
pub fn available_cores() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

/// Whether `cores` leave two to spare for spinning threads besides `executors` executors
/// (the arm poller and the application). Without them, a spinning thread takes CPU from
/// the work it waits for.
pub(crate) fn spare_cores_for_spinning(executors: usize, cores: usize) -> bool {
    cores >= executors + 2
}

/// The CPUs in this process's affinity mask (`sched_getaffinity`), in increasing order;
/// `0..available_parallelism` if the mask cannot be read. Never empty.
pub fn usable_cpus() -> Vec<usize> {
    affinity_cpus()
        .filter(|cpus| !cpus.is_empty())
        .unwrap_or_else(|| (0..available_cores()).collect())
}

/// `sched_getaffinity(0)`, growing the mask until the kernel accepts its size.
fn affinity_cpus() -> Option<Vec<usize>> {
    const MAX_WORDS: usize = 1 << 16; // 4 Mi CPUs
    let mut words = size_of::<libc::cpu_set_t>() / size_of::<u64>();
    while words <= MAX_WORDS {
        let mut mask = vec![0u64; words];
        let len_bytes = words * size_of::<u64>();
        // SAFETY: `mask` is a live, writable buffer of `len_bytes` bytes, 8-aligned like
        // `cpu_set_t` (an array of u64 words); the call writes at most `len_bytes` bytes.
        let result = unsafe { libc::sched_getaffinity(0, len_bytes, mask.as_mut_ptr().cast()) };
        if result == 0 {
            let bits = mask.iter().enumerate().flat_map(|(index, &word)| {
                (0..64).filter(move |bit| word >> bit & 1 == 1).map(move |bit| index * 64 + bit)
            });
            return Some(bits.collect());
        }
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
            return None;
        }
        words *= 2;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stream_copy_default_follows_the_machines_memory() {
        const GIB: u64 = 1 << 30;
        // Unknown or small machines: one long op's ring; large ones: the ceiling.
        assert_eq!(default_stream_copy_mib(None), 64);
        assert_eq!(default_stream_copy_mib(Some(2 * GIB)), 64);
        assert_eq!(default_stream_copy_mib(Some(128 * GIB)), 1024);
        assert_eq!(default_stream_copy_mib(Some(u64::MAX)), 1024);
        // In between: a 64th, in whole 16 MiB slots.
        assert_eq!(default_stream_copy_mib(Some(24 * GIB)), 384);
        assert_eq!(default_stream_copy_mib(Some(23 * GIB)), 368);
        assert_eq!(default_stream_copy_mib(Some(5 * GIB + 7)), 80);
    }
}
