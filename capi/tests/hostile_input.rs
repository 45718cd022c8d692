//! Hostile input at the C boundary (issue #20, item 3): random call sequences straight
//! into the `extern "C"` exports of `libhipfile`, on the in-process cpu device.
//!
//! Every call's result must be one of the codes `include/hipfile.h` and
//! `reference/behaviour.md` document for that function ([`codes`]); no call may panic
//! (the boundary turns a panic into 5030, so a panic hook counts them), crash or hang
//! (a watchdog aborts the process when no call finishes for [`HANG_SECS`], and the
//! multi-thread test has an overall deadline).
//!
//! The universe: two temp files (one registered from an `O_RDWR` descriptor, one from an
//! `O_RDONLY` one), two 4 MiB device buffers, a pinned host region, a host heap region,
//! two streams, the NULL stream and one stream value the device never made (the cpu
//! device looks streams up in its table; the header documents 5011 for a stream whose
//! device is unknown). Garbage *values* (sizes, offsets, flags, handles, codes) and NULL
//! pointers are the point; a non-NULL pointer argument always points to valid storage
//! owned by the test (the async size/offset/bytes cells are boxed and kept until the
//! streams have been synchronised at the end of the sequence).
//!
//! - `random_sequences`: proptest, one sequence of 1..60 ops per case (most often after
//!   a prelude that opens the driver and registers both files, a buffer and a stream),
//!   from a reset driver (closed, nothing registered); a failure is shrunk to a minimal
//!   sequence, printed with the failing call.
//! - `concurrent_random_sequences`: 4 threads run random sequences at once on shared
//!   handles, buffers and streams (deregistrations and driver closes race with I/O).
//! - `a_submission_refused_by_a_racing_deregistration_leaves_bytes_p_alone`: the bug
//!   this driver found (a refused submission wrote `*bytes_p = 0`), kept as a
//!   regression test.
//!
//! With `--nocapture` each test prints how often each function returned each result.
//!
//! Cost: 256 cases by default (both tests together take a few seconds in a debug build).
//! `HIPFILE_HOSTILE_CASES=N` sets the proptest case count, and the multi-thread test runs
//! N/4 sequences per thread (its deadline grows with N). `HIPFILE_HOSTILE_SEED=S` fixes
//! the multi-thread test's seed (it prints the one it used). A long run (1.7 million
//! calls per test; 1 to 3 minutes on 2 cores):
//!
//! ```text
//! HIPFILE_HOSTILE_CASES=50000 cargo test -p hipfile-capi --release --test hostile_input -- --nocapture
//! ```
//!
//! Needs the cpu device (`HIPFILE_DEVICE` unset/`auto` without a GPU, or `cpu`); on
//! another device the tests print SKIP and pass.

use core::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, Once, OnceLock, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hipfile::api::{
    hipFileBufDeregister, hipFileBufRegister, hipFileDriverClose, hipFileDriverGetProperties,
    hipFileDriverOpen, hipFileDriverSetMaxCacheSize, hipFileDriverSetMaxDirectIOSize,
    hipFileDriverSetMaxPinnedMemSize, hipFileDriverSetPollMode, hipFileGetOpErrorString,
    hipFileGetParameterBool, hipFileGetParameterSizeT, hipFileGetParameterString,
    hipFileGetVersion, hipFileHandleDeregister, hipFileHandleRegister, hipFileRead,
    hipFileReadAsync, hipFileSetParameterBool, hipFileSetParameterSizeT, hipFileSetParameterString,
    hipFileStreamDeregister, hipFileStreamRegister, hipFileUseCount, hipFileWrite,
    hipFileWriteAsync,
};
use hipfile::batch::{
    hipFileBatchIOCancel, hipFileBatchIODestroy, hipFileBatchIOGetStatus, hipFileBatchIOSetUp,
    hipFileBatchIOSubmit,
};
use hipfile::cpu_ext::{
    hipfileCpuDeviceSynchronize, hipfileCpuHostMalloc, hipfileCpuMalloc, hipfileCpuStreamCreate,
    hipfileCpuStreamSynchronize,
};
use hipfile::ext::{hipfileExplainPath, hipfileStatsGetClass, hipfileStatsGetPaths};
use hipfile::types::{
    BatchIo, DescrHandle, HipFileDescr, HipFileDriverProps, HipFileError, HipFileIoEvents,
    HipFileIoParams, IoParamsUnion,
};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{RngAlgorithm, TestRng, TestRunner};

/// The page size the sizes below are built from (the library clamps to
/// `2^31 - its page size`, which is this on x86_64 Linux).
const PAGE: usize = 4096;
/// Each device buffer.
const BUF_LEN: usize = 4 << 20;
/// The pinned and heap host regions.
const HOST_LEN: usize = 64 << 10;
/// Largest byte count one call moves (`INT_MAX & ~(page - 1)`).
const MAX_IO: usize = (1 << 31) - PAGE;
/// No call may take longer than this (the watchdog aborts the process).
const HANG_SECS: u64 = 120;
/// A stream value the device never made.
const BOGUS_STREAM: usize = 0x7777_0000;
/// A handle value the library never gave out.
const GARBAGE_HANDLE: usize = 0xdead_bee0;

/// The documented result sets, from `include/hipfile.h` (the comment of each function)
/// and `reference/behaviour.md` §2.1, §2.6, §2.10, §3.1-§3.5.
mod codes {
    use core::ffi::c_int;

    /// Every `hipFileOpError_t` value (5021 and 5032 are not codes).
    pub const ALL: &[c_int] = &[
        0, 5001, 5002, 5003, 5004, 5005, 5006, 5007, 5008, 5009, 5010, 5011, 5012, 5013, 5014,
        5015, 5016, 5017, 5018, 5019, 5020, 5022, 5023, 5024, 5025, 5026, 5027, 5028, 5029, 5030,
        5031, 5033, 5034, 5035, 5036, 5037, 5038, 5039,
    ];
    /// `hipFileDriverOpen`: always succeeds (5026 is never returned).
    pub const DRIVER_OPEN: &[c_int] = &[0];
    /// `hipFileDriverClose`: 5001 when the count is 0.
    pub const DRIVER_CLOSE: &[c_int] = &[0, 5001];
    /// `hipFileHandleRegister` of the two regular files: success, or 5028 when that
    /// descriptor is registered already.
    pub const HANDLE_REGISTER_GOOD_FD: &[c_int] = &[0, 5028];
    /// `hipFileHandleRegister` of a descriptor that cannot be used (negative, closed,
    /// O_PATH, a directory): 5030 or 5008.
    pub const HANDLE_REGISTER_BAD_FD: &[c_int] = &[5008, 5030];
    /// `hipFileHandleRegister`: NULL fh or descr.
    pub const HANDLE_REGISTER_NULL: &[c_int] = &[5022];
    /// `hipFileHandleRegister`: a type other than OpaqueFD.
    pub const HANDLE_REGISTER_BAD_TYPE: &[c_int] = &[5008];
    /// `hipFileBufRegister` of device memory inside the allocation: success, or 5023
    /// when that base is registered already.
    pub const BUF_REGISTER_IN_RANGE: &[c_int] = &[0, 5023];
    /// `hipFileBufRegister` beyond the allocation.
    pub const BUF_REGISTER_OUT_OF_RANGE: &[c_int] = &[5014];
    /// `hipFileBufRegister(NULL, ..)`.
    pub const BUF_REGISTER_NULL: &[c_int] = &[5022];
    /// `hipFileBufRegister` of memory that is not device memory (host heap, pinned host).
    pub const BUF_REGISTER_NOT_DEVICE: &[c_int] = &[5013];
    /// `hipFileBufDeregister`: driver closed 5006, not registered 5024, ops in flight
    /// 5030.
    pub const BUF_DEREGISTER: &[c_int] = &[0, 5006, 5024, 5030];
    /// `hipFileRead`/`hipFileWrite`: the negated hipFile codes they may return
    /// (NULL buffer / bad arguments 5022, unknown handle 5027, not device memory 5013,
    /// no backend / internal 5030, also while a parameter call of another thread has
    /// turned compat mode off).
    pub const SYNC_IO_NEGATED: &[c_int] = &[5013, 5022, 5027, 5030];
    /// The `hipError_t` values the cpu device reports (a sync call returns them
    /// negated; 1 coincides with -1 and errno).
    pub const HIP_ERRORS: &[c_int] = &[1, 2, 3, 101, 400, 600, 801, 999];
    /// `hipFileReadAsync`/`hipFileWriteAsync` at submission: driver closed, NULL
    /// pointer or invalid argument 5022; unknown fh 5027; not device memory 5013; stream
    /// device error 5011.
    pub const ASYNC_SUBMIT: &[c_int] = &[0, 5011, 5013, 5022, 5027];
    /// The same with a NULL buffer/size/offset/bytes pointer: always 5022.
    pub const ASYNC_SUBMIT_NULL: &[c_int] = &[5022];
    /// `*bytes_p` once the stream has passed the op, when negative and not an errno
    /// (the header: "-50xx"): a parameter invalid when the stream reached the op (5022),
    /// an internal error (5030), or the handle deregistered between the submission
    /// checks and the I/O (5027; only when another thread deregisters it, or closes the
    /// driver, while the call runs).
    pub const ASYNC_BYTES_NEGATED: &[c_int] = &[5022, 5027, 5030];
    /// `hipFileStreamRegister` with flags inside the mask: success, 5022 when
    /// registered already, 5011 when the stream's device is unknown.
    pub const STREAM_REGISTER: &[c_int] = &[0, 5011, 5022];
    /// `hipFileStreamRegister` with bits outside `HIPFILE_STREAM_FLAGS_MASK`.
    pub const STREAM_REGISTER_BAD_FLAGS: &[c_int] = &[5022];
    /// `hipFileStreamDeregister`: not registered (NULL included) 5022.
    pub const STREAM_DEREGISTER: &[c_int] = &[0, 5022];
    /// `hipFileBatchIOSetUp` with a NULL out-pointer or max_nr outside 1..=128.
    pub const BATCH_SETUP_BAD: &[c_int] = &[5022];
    /// `hipFileBatchIOSetUp` otherwise.
    pub const BATCH_SETUP: &[c_int] = &[0];
    /// `hipFileBatchIOSubmit`: accepted 0; validation or no room 5022; driver closed,
    /// unregistered fh, or compat mode off 5030.
    pub const BATCH_SUBMIT: &[c_int] = &[0, 5022, 5030];
    /// `hipfileExplainPath` (`hipfile_ext.h`): 0; NULL or too small text 5022; unknown
    /// handle 5027.
    pub const EXPLAIN: &[c_int] = &[0, 5022, 5027];
    /// `hipfileStatsGetClass` / `hipfileStatsGetPaths`: 0; NULL out, unknown API or
    /// device 5022.
    pub const STATS: &[c_int] = &[0, 5022];
    /// `hipFileBatchIOGetStatus` / `hipFileBatchIOCancel`: 0; unknown handle, NULL `nr`,
    /// NULL events, `min_nr > *nr` or a bad timeout 5022.
    pub const BATCH_STATUS: &[c_int] = &[0, 5022];
    /// Parameter and property calls: success; NULL, unknown key or bad value 5022;
    /// properties of a closed driver 5001; a change once the engine runs or a file is
    /// registered 5026.
    pub const PARAMETER: &[c_int] = &[0, 5001, 5022, 5026];
}

// ---------------------------------------------------------------------------------
// Process-wide setup: the universe, the panic counter, the watchdog.
// ---------------------------------------------------------------------------------

/// The objects every sequence works on (addresses and descriptors as plain integers).
struct Universe {
    rw_fd: c_int,
    ro_fd: c_int,
    dir_fd: c_int,
    opath_fd: c_int,
    /// A descriptor number no descriptor can have: `c_int::MAX`, above any RLIMIT_NOFILE
    /// and `fs.nr_open` (the limit itself is not safe: valgrind keeps its own descriptors
    /// just above the limit it reports to the program).
    never_fd: c_int,
    bufs: [usize; 2],
    pinned: usize,
    heap: usize,
    streams: [usize; 2],
}

/// `None` when the driver's device is not the cpu device.
fn universe() -> Option<&'static Universe> {
    static UNIVERSE: OnceLock<Option<Universe>> = OnceLock::new();
    UNIVERSE.get_or_init(build_universe).as_ref()
}

fn build_universe() -> Option<Universe> {
    let mut bufs = [0usize; 2];
    for buf in &mut bufs {
        let mut ptr = core::ptr::null_mut();
        // SAFETY: valid out-pointer.
        let status = unsafe { hipfileCpuMalloc(&mut ptr, BUF_LEN) };
        if status.0 != 0 {
            println!("SKIP: the driver's device is not the cpu device (hipError {})", status.0);
            return None;
        }
        *buf = ptr as usize;
    }
    let mut pinned = core::ptr::null_mut();
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { hipfileCpuHostMalloc(&mut pinned, HOST_LEN) }.0, 0);
    let mut streams = [0usize; 2];
    for stream in &mut streams {
        let mut handle = core::ptr::null_mut();
        // SAFETY: valid out-pointer.
        assert_eq!(unsafe { hipfileCpuStreamCreate(&mut handle) }.0, 0);
        *stream = handle as usize;
    }
    assert!(!streams.contains(&BOGUS_STREAM));
    let heap = Box::leak(vec![0u8; HOST_LEN].into_boxed_slice()).as_mut_ptr() as usize;

    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("hostile_input-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create the temp directory");
    let rw_path = dir.join("rw.bin");
    let ro_path = dir.join("ro.bin");
    let pattern: Vec<u8> = (0..(1usize << 20)).map(|i| (i * 7 + 3) as u8).collect();
    std::fs::write(&rw_path, &pattern).expect("write rw.bin");
    std::fs::write(&ro_path, &pattern[..256 << 10]).expect("write ro.bin");
    let open = |path: &std::path::Path, flags: c_int| {
        let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: a NUL-terminated path.
        let fd = unsafe { libc::open(c_path.as_ptr(), flags | libc::O_CLOEXEC) };
        assert!(fd >= 0, "open {}: {}", path.display(), std::io::Error::last_os_error());
        fd
    };
    let universe = Universe {
        rw_fd: open(&rw_path, libc::O_RDWR),
        ro_fd: open(&ro_path, libc::O_RDONLY),
        dir_fd: open(&dir, libc::O_RDONLY | libc::O_DIRECTORY),
        opath_fd: open(&rw_path, libc::O_PATH),
        never_fd: c_int::MAX,
        bufs,
        pinned: pinned as usize,
        heap,
        streams,
    };
    // The descriptors keep the files (and the directory) alive; nothing is left behind.
    std::fs::remove_dir_all(&dir).expect("remove the temp directory");
    Some(universe)
}

/// Panics seen anywhere in the process (the boundary catches a panic of an export and
/// returns 5030, which is a documented code for many calls; a panic is still a bug).
static PANICS: AtomicUsize = AtomicUsize::new(0);
/// When the last call finished (ms since [`epoch`]), and the call in progress.
static LAST_BEAT_MS: AtomicU64 = AtomicU64::new(0);
static CURRENT_CALL: Mutex<String> = Mutex::new(String::new());

/// How often each function returned each result (printed with `--nocapture`, to show
/// what the sequences reached).
static OUTCOMES: Mutex<std::collections::BTreeMap<(&'static str, i64), usize>> =
    Mutex::new(std::collections::BTreeMap::new());

fn record(function: &'static str, outcome: i64) {
    *lock(&OUTCOMES).entry((function, outcome)).or_default() += 1;
}

/// A byte count is recorded as 1 (some bytes) or 0 (none); errors as their value.
fn outcome_of_count(value: isize) -> i64 {
    if value > 0 { 1 } else { value as i64 }
}

fn print_outcomes(test: &str) {
    let mut text =
        format!("{test}: results (function: value x count; counts as 1 = bytes moved):\n");
    let outcomes = std::mem::take(&mut *lock(&OUTCOMES));
    let mut current = "";
    for ((function, outcome), count) in outcomes {
        if function != current {
            let _ = write!(text, "\n  {function}:");
            current = function;
        }
        let _ = write!(text, " {outcome} x{count}");
    }
    println!("{text}");
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn install_hooks() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            previous(info);
        }));
        beat();
        std::thread::Builder::new()
            .name("hostile-watchdog".into())
            .spawn(|| {
                loop {
                    std::thread::sleep(Duration::from_secs(1));
                    let now = epoch().elapsed().as_millis() as u64;
                    let last = LAST_BEAT_MS.load(Ordering::SeqCst);
                    if now.saturating_sub(last) > HANG_SECS * 1000 {
                        abort_loudly(&format!(
                            "hostile_input: HANG: no call finished for {HANG_SECS} s; last call \
                             started: {}",
                            lock(&CURRENT_CALL)
                        ));
                    }
                }
            })
            .expect("start the watchdog");
    });
}

/// Prints to the real stderr (not the test harness's capture, which threads spawned by
/// a test inherit) and aborts the process.
fn abort_loudly(message: &str) -> ! {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "{message}");
    std::process::abort();
}

fn beat() {
    LAST_BEAT_MS.store(epoch().elapsed().as_millis() as u64, Ordering::SeqCst);
}

/// One test at a time: the driver is process-wide, and `random_sequences` resets it
/// between cases.
fn serialize() -> MutexGuard<'static, ()> {
    static TESTS: Mutex<()> = Mutex::new(());
    lock(&TESTS)
}

fn cases() -> u32 {
    std::env::var("HIPFILE_HOSTILE_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256)
}

// ---------------------------------------------------------------------------------
// Operations.
// ---------------------------------------------------------------------------------

/// A file descriptor for `hipFileHandleRegister`.
#[derive(Clone, Copy, Debug)]
enum FdKind {
    ReadWrite,
    ReadOnly,
    MinusOne,
    /// Opened and closed just before the call (single thread; the library's own
    /// threads may reuse the number meanwhile, which the check allows for), or a number
    /// above the descriptor limit (multi-thread).
    Closed,
    /// A number above the descriptor limit (RLIMIT_NOFILE): never open.
    AboveLimit,
    Directory,
    OPath,
    IntMin,
}

/// A handle-like value kept in [`Slots`]: the one held now in a slot, the last one a
/// slot ever held (possibly released since), NULL, or a value never given out.
#[derive(Clone, Copy, Debug)]
enum SlotRef {
    Current(usize),
    Last(usize),
    Null,
    Garbage,
}

/// A file handle (slot 0: the O_RDWR file, 1: the O_RDONLY one).
type HandleRef = SlotRef;
/// A batch context.
type BatchRef = SlotRef;

/// A buffer pointer.
#[derive(Clone, Copy, Debug)]
enum BufRef {
    /// A device buffer's base, or base + 1.
    Device {
        index: usize,
        plus_one: bool,
    },
    Null,
    /// Host heap memory the device does not know.
    Heap,
    /// Pinned host memory of the device.
    Pinned,
}

#[derive(Clone, Copy, Debug)]
enum StreamRef {
    Made(usize),
    Null,
    Bogus,
}

/// One `hipFileIOParams_t` template of a batch submission.
#[derive(Clone, Copy, Debug)]
struct BatchTemplate {
    mode: c_int,
    opcode: c_int,
    fh: HandleRef,
    buf: BufRef,
    size: usize,
    file_offset: i64,
    buffer_offset: i64,
}

#[derive(Clone, Debug)]
enum Op {
    DriverOpen,
    DriverClose,
    UseCount,
    Version {
        null_mask: u8,
    },
    HandleRegister {
        fd: FdKind,
        handle_type: c_int,
        null_fh: bool,
        null_descr: bool,
    },
    HandleDeregister(HandleRef),
    BufRegister {
        buf: BufRef,
        len: usize,
        flags: c_int,
    },
    BufDeregister(BufRef),
    Io {
        write: bool,
        fh: HandleRef,
        buf: BufRef,
        size: usize,
        file_offset: i64,
        buffer_offset: i64,
    },
    Async {
        write: bool,
        fh: HandleRef,
        buf: BufRef,
        size: usize,
        file_offset: i64,
        buffer_offset: i64,
        /// Bits 0..3: NULL size_p, file_offset_p, buffer_offset_p, bytes_p.
        null_mask: u8,
        stream: StreamRef,
    },
    StreamRegister {
        stream: StreamRef,
        flags: c_uint,
    },
    StreamDeregister(StreamRef),
    StreamSynchronize(StreamRef),
    ErrorString(c_int),
    Stub {
        which: u8,
        param: c_int,
        value: usize,
    },
    BatchSetUp {
        slot: usize,
        max_nr: c_uint,
        null_out: bool,
    },
    BatchSubmit {
        batch: BatchRef,
        nr: c_uint,
        null_iocbp: bool,
        op: BatchTemplate,
    },
    BatchDestroy(BatchRef),
    BatchStatus {
        batch: BatchRef,
        min_nr: c_uint,
        max_nr: c_uint,
        /// `None`: NULL timeout (wait for `min_nr`); else milliseconds, -1 invalid.
        timeout_ms: Option<i64>,
        null_events: bool,
    },
    BatchCancel(BatchRef),
    Explain {
        fh: Option<HandleRef>,
        buf: Option<BufRef>,
        len: usize,
        null_text: bool,
    },
    StatsGet {
        device: c_uint,
        api: c_int,
        write: c_int,
        null_out: bool,
    },
}

/// Sizes: mostly ones that fit the buffers, the rest hostile.
fn sizes() -> impl Strategy<Value = usize> {
    let fitting = vec![0, 1, PAGE - 1, PAGE, PAGE + 1, 64 << 10, 1 << 20];
    let hostile =
        vec![BUF_LEN - 1, BUF_LEN, BUF_LEN + 1, MAX_IO - 1, MAX_IO, MAX_IO + 1, usize::MAX];
    prop_oneof![3 => prop::sample::select(fitting), 1 => prop::sample::select(hostile)]
}

/// File offsets: mostly small, the rest negative or huge.
fn file_offsets() -> impl Strategy<Value = i64> {
    let fitting = vec![0, 1, 4095, 4096, 1 << 20];
    let hostile = vec![-1, -4096, i64::MAX - 4096, i64::MAX, i64::MIN];
    prop_oneof![3 => prop::sample::select(fitting), 1 => prop::sample::select(hostile)]
}

/// Buffer offsets: mostly inside the buffer, the rest at or past its end, or negative.
fn buffer_offsets() -> impl Strategy<Value = i64> {
    let len = BUF_LEN as i64;
    let fitting = vec![0, 1, 4095, 4096, len - 4096];
    let hostile = vec![-1, -4096, len - 1, len, len + 1, i64::MAX, i64::MIN];
    prop_oneof![3 => prop::sample::select(fitting), 1 => prop::sample::select(hostile)]
}

fn buf_lens() -> impl Strategy<Value = usize> {
    prop::sample::select(vec![
        0,
        1,
        4095,
        4096,
        4097,
        BUF_LEN - 1,
        BUF_LEN,
        BUF_LEN + 1,
        (1 << 31) - PAGE - 1,
        (1 << 31) - PAGE,
        (1 << 31) - PAGE + 1,
        usize::MAX,
    ])
}

fn handle_ref() -> impl Strategy<Value = HandleRef> {
    prop_oneof![
        6 => (0..2usize).prop_map(HandleRef::Current),
        2 => (0..2usize).prop_map(HandleRef::Last),
        1 => Just(HandleRef::Null),
        1 => Just(HandleRef::Garbage),
    ]
}

fn buf_ref() -> impl Strategy<Value = BufRef> {
    prop_oneof![
        6 => (0..2usize).prop_map(|index| BufRef::Device { index, plus_one: false }),
        2 => (0..2usize).prop_map(|index| BufRef::Device { index, plus_one: true }),
        1 => Just(BufRef::Null),
        1 => Just(BufRef::Heap),
        1 => Just(BufRef::Pinned),
    ]
}

fn stream_ref() -> impl Strategy<Value = StreamRef> {
    prop_oneof![
        6 => (0..2usize).prop_map(StreamRef::Made),
        3 => Just(StreamRef::Null),
        1 => Just(StreamRef::Bogus),
    ]
}

fn batch_ref() -> impl Strategy<Value = BatchRef> {
    prop_oneof![
        4 => (0..2usize).prop_map(BatchRef::Current),
        2 => (0..2usize).prop_map(BatchRef::Last),
        1 => Just(BatchRef::Null),
        1 => Just(BatchRef::Garbage),
    ]
}

fn fd_kind() -> impl Strategy<Value = FdKind> {
    prop_oneof![
        4 => Just(FdKind::ReadWrite),
        4 => Just(FdKind::ReadOnly),
        1 => Just(FdKind::MinusOne),
        1 => Just(FdKind::Closed),
        1 => Just(FdKind::AboveLimit),
        1 => Just(FdKind::Directory),
        1 => Just(FdKind::OPath),
        1 => Just(FdKind::IntMin),
    ]
}

fn error_codes() -> impl Strategy<Value = c_int> {
    prop_oneof![
        3 => prop::sample::select(codes::ALL.to_vec()),
        1 => prop::sample::select(vec![
            5000, 5021, 5032, 5040, -5022, -1, 1, 4999, c_int::MIN, c_int::MAX
        ]),
        1 => any::<c_int>(),
    ]
}

fn batch_template() -> impl Strategy<Value = BatchTemplate> {
    (
        prop::sample::select(vec![1, 0, 2]),
        prop::sample::select(vec![0, 1, 7, -1]),
        handle_ref(),
        buf_ref(),
        sizes(),
        file_offsets(),
        buffer_offsets(),
    )
        .prop_map(|(mode, opcode, fh, buf, size, file_offset, buffer_offset)| BatchTemplate {
            mode,
            opcode,
            fh,
            buf,
            size,
            file_offset,
            buffer_offset,
        })
}

fn op() -> impl Strategy<Value = Op> {
    let io = (any::<bool>(), handle_ref(), buf_ref(), sizes(), file_offsets(), buffer_offsets())
        .prop_map(|(write, fh, buf, size, file_offset, buffer_offset)| Op::Io {
            write,
            fh,
            buf,
            size,
            file_offset,
            buffer_offset,
        });
    let io_async = (
        (any::<bool>(), handle_ref(), buf_ref(), sizes(), file_offsets(), buffer_offsets()),
        prop_oneof![6 => Just(0u8), 1 => 1u8..16],
        stream_ref(),
    )
        .prop_map(|((write, fh, buf, size, file_offset, buffer_offset), null_mask, stream)| {
            Op::Async { write, fh, buf, size, file_offset, buffer_offset, null_mask, stream }
        });
    let flags =
        prop_oneof![8 => 0u32..=0xF, 1 => Just(0x10u32), 1 => Just(0x1F), 1 => Just(u32::MAX)];
    let handle_types =
        prop_oneof![8 => Just(1), 1 => Just(2), 1 => Just(3), 1 => Just(0), 1 => Just(99)];
    let register = (fd_kind(), handle_types, prop::bool::weighted(0.1), prop::bool::weighted(0.1))
        .prop_map(|(fd, handle_type, null_fh, null_descr)| Op::HandleRegister {
            fd,
            handle_type,
            null_fh,
            null_descr,
        });
    let buf_register = (buf_ref(), buf_lens(), prop::sample::select(vec![0, 1, 2, 3, -1]))
        .prop_map(|(buf, len, flags)| Op::BufRegister { buf, len, flags });
    let stub = (0u8..14, any::<c_int>(), any::<usize>())
        .prop_map(|(which, param, value)| Op::Stub { which, param, value });
    let max_nrs = prop::sample::select(vec![0u32, 1, 2, 128, 129, u32::MAX]);
    let batch_setup = (0..2usize, max_nrs, prop::bool::weighted(0.1))
        .prop_map(|(slot, max_nr, null_out)| Op::BatchSetUp { slot, max_nr, null_out });
    let nrs = prop::sample::select(vec![0u32, 1, 2, 128, 129]);
    let batch_submit = (batch_ref(), nrs, prop::bool::weighted(0.2), batch_template())
        .prop_map(|(batch, nr, null_iocbp, op)| Op::BatchSubmit { batch, nr, null_iocbp, op });
    let timeouts = prop::sample::select(vec![None, Some(0), Some(1), Some(20), Some(-1)]);
    let status_nrs = prop::sample::select(vec![0u32, 1, 2, 3, 128]);
    let batch_status =
        (batch_ref(), status_nrs.clone(), status_nrs, timeouts, prop::bool::weighted(0.1))
            .prop_map(|(batch, min_nr, max_nr, timeout_ms, null_events)| Op::BatchStatus {
                batch,
                min_nr,
                max_nr,
                timeout_ms,
                null_events,
            });
    let explain = (
        prop::option::of(handle_ref()),
        prop::option::of(buf_ref()),
        prop::sample::select(vec![0usize, 1, 8, 64, 4096]),
        prop::bool::weighted(0.1),
    )
        .prop_map(|(fh, buf, len, null_text)| Op::Explain { fh, buf, len, null_text });
    let stats_get = (0u32..10, -1i32..4, 0i32..2, prop::bool::weighted(0.1))
        .prop_map(|(device, api, write, null_out)| Op::StatsGet { device, api, write, null_out });
    prop_oneof![
        3 => Just(Op::DriverOpen),
        1 => Just(Op::DriverClose),
        1 => Just(Op::UseCount),
        1 => (0u8..8).prop_map(|null_mask| Op::Version { null_mask }),
        5 => register,
        1 => handle_ref().prop_map(Op::HandleDeregister),
        4 => buf_register,
        2 => buf_ref().prop_map(Op::BufDeregister),
        8 => io,
        8 => io_async,
        3 => (stream_ref(), flags).prop_map(|(stream, flags)| Op::StreamRegister { stream, flags }),
        2 => stream_ref().prop_map(Op::StreamDeregister),
        1 => stream_ref().prop_map(Op::StreamSynchronize),
        1 => error_codes().prop_map(Op::ErrorString),
        1 => stub,
        1 => batch_setup,
        1 => batch_submit,
        1 => batch_ref().prop_map(Op::BatchDestroy),
        2 => batch_status,
        1 => batch_ref().prop_map(Op::BatchCancel),
        1 => explain,
        1 => stats_get,
    ]
}

/// 1..60 random ops, most often after a prelude that opens the driver, registers both
/// files, a buffer and a stream (so that the random ops reach the I/O paths).
fn sequences() -> impl Strategy<Value = Vec<Op>> {
    (prop::bool::weighted(0.8), 0u32..=0xF, prop::collection::vec(op(), 1..60)).prop_map(
        |(prelude, flags, ops)| {
            if !prelude {
                return ops;
            }
            let mut all = vec![
                Op::DriverOpen,
                Op::DriverOpen,
                Op::HandleRegister {
                    fd: FdKind::ReadWrite,
                    handle_type: 1,
                    null_fh: false,
                    null_descr: false,
                },
                Op::HandleRegister {
                    fd: FdKind::ReadOnly,
                    handle_type: 1,
                    null_fh: false,
                    null_descr: false,
                },
                Op::BufRegister {
                    buf: BufRef::Device { index: 0, plus_one: false },
                    len: BUF_LEN,
                    flags: 0,
                },
                Op::StreamRegister { stream: StreamRef::Made(0), flags },
            ];
            all.extend(ops);
            all
        },
    )
}

// ---------------------------------------------------------------------------------
// Running operations.
// ---------------------------------------------------------------------------------

/// Handles and batch contexts the sequences share (several threads in the
/// multi-thread test): per slot, the one held now (0: none) and the last one held.
#[derive(Default)]
struct Slots {
    current: [AtomicUsize; 2],
    last: [AtomicUsize; 2],
}

impl Slots {
    fn set(&self, slot: usize, value: usize) -> usize {
        self.last[slot].store(value, Ordering::SeqCst);
        self.current[slot].swap(value, Ordering::SeqCst)
    }

    /// The value `which` names, as the pointer the C API takes.
    fn pointer(&self, which: SlotRef) -> *mut c_void {
        let value = match which {
            SlotRef::Current(slot) => self.current[slot].load(Ordering::SeqCst),
            SlotRef::Last(slot) => self.last[slot].load(Ordering::SeqCst),
            SlotRef::Null => 0,
            SlotRef::Garbage => GARBAGE_HANDLE,
        };
        value as *mut c_void
    }

    /// Forgets `value` as slot `slot`'s current one, unless another thread replaced it.
    fn forget(&self, slot: usize, value: usize) {
        let _ = self.current[slot].compare_exchange(value, 0, Ordering::SeqCst, Ordering::SeqCst);
    }
}

#[derive(Default)]
struct Shared {
    handles: Slots,
    batches: Slots,
}

/// An async op submitted successfully on a stream: its cells stay here until the
/// streams have been synchronised.
struct Pending {
    cells: Box<AsyncCells>,
    size: usize,
    what: String,
}

/// The storage behind the pointers of one async call.
struct AsyncCells {
    size: usize,
    file_offset: i64,
    buffer_offset: i64,
    bytes: isize,
}

/// What `*bytes_p` holds before the call (untouched when the call fails).
const BYTES_SENTINEL: isize = 0x5a5a_5a5a;

/// Runs ops against the universe and checks every result.
struct Runner<'a> {
    universe: &'static Universe,
    shared: &'a Shared,
    multi_thread: bool,
    pending: Vec<Pending>,
}

type Check = Result<(), String>;

/// The C function an op's description names (for [`record`]).
fn function_name(what: &str) -> &'static str {
    const NAMES: &[(&str, &str)] = &[
        ("DriverOpen", "hipFileDriverOpen"),
        ("DriverClose", "hipFileDriverClose"),
        ("Version", "hipFileGetVersion"),
        ("HandleRegister", "hipFileHandleRegister"),
        ("BufRegister", "hipFileBufRegister"),
        ("BufDeregister", "hipFileBufDeregister"),
        ("Io { write: true", "hipFileWrite"),
        ("Io { write: false", "hipFileRead"),
        ("Async { write: true", "hipFileWriteAsync"),
        ("Async { write: false", "hipFileReadAsync"),
        ("StreamRegister", "hipFileStreamRegister"),
        ("StreamDeregister", "hipFileStreamDeregister"),
        ("Stub", "(parameters, raw batch values)"),
        ("BatchSetUp", "hipFileBatchIOSetUp"),
        ("BatchSubmit", "hipFileBatchIOSubmit"),
        ("BatchStatus", "hipFileBatchIOGetStatus"),
        ("BatchCancel", "hipFileBatchIOCancel"),
        ("Explain", "hipfileExplainPath"),
        ("StatsGet", "hipfileStatsGetClass"),
    ];
    NAMES.iter().find(|(prefix, _)| what.starts_with(prefix)).map_or("other", |&(_, name)| name)
}

fn check_status(what: &str, status: HipFileError, allowed: &[c_int]) -> Check {
    record(function_name(what), i64::from(status.err));
    if !allowed.contains(&status.err) {
        return Err(format!("{what}: returned {status:?}, documented: {allowed:?}"));
    }
    // hip_drv_err is set with hipFileHipDriverError only, and then it is an error.
    let drv_ok = if status.err == 5011 { status.hip_drv_err != 0 } else { status.hip_drv_err == 0 };
    if !drv_ok {
        return Err(format!("{what}: returned {status:?}: hip_drv_err must be set with 5011 only"));
    }
    Ok(())
}

/// `hipFileRead`/`hipFileWrite`'s `ssize_t`: a byte count no larger than asked (and the
/// clamp), -1 (errno), a negated documented hipFile code, or a negated hipError_t.
fn check_ssize(what: &str, value: isize, size: usize) -> Check {
    record(function_name(what), outcome_of_count(value));
    if value >= 0 {
        let most = size.min(MAX_IO);
        if value as usize > most {
            return Err(format!("{what}: returned {value} bytes, more than {most}"));
        }
        return Ok(());
    }
    let negated = value.unsigned_abs();
    let documented = negated == 1
        || codes::SYNC_IO_NEGATED.iter().any(|&c| c as usize == negated)
        || codes::HIP_ERRORS.iter().any(|&c| c as usize == negated);
    if documented { Ok(()) } else { Err(format!("{what}: returned {value}, not documented")) }
}

/// `*bytes_p` once the stream has passed the op: a byte count no larger than asked,
/// -errno, or a negated documented code.
fn check_bytes(what: &str, value: isize, size: usize) -> Check {
    record("*bytes_p", outcome_of_count(value));
    if value >= 0 {
        let most = size.min(MAX_IO);
        if value as usize > most {
            return Err(format!("{what}: *bytes_p = {value}, more than {most}"));
        }
        return Ok(());
    }
    let negated = value.unsigned_abs();
    let errno = (1..=133).contains(&negated);
    let code = codes::ASYNC_BYTES_NEGATED.iter().any(|&c| c as usize == negated);
    if errno || code { Ok(()) } else { Err(format!("{what}: *bytes_p = {value}, not documented")) }
}

fn check_that(what: &str, ok: bool, message: impl FnOnce() -> String) -> Check {
    if ok { Ok(()) } else { Err(format!("{what}: {}", message())) }
}

impl Runner<'_> {
    fn handle(&self, handle: HandleRef) -> *mut c_void {
        self.shared.handles.pointer(handle)
    }

    fn batch(&self, batch: BatchRef) -> *mut c_void {
        self.shared.batches.pointer(batch)
    }

    fn buf(&self, buf: BufRef) -> *mut c_void {
        let address = match buf {
            BufRef::Device { index, plus_one } => self.universe.bufs[index] + usize::from(plus_one),
            BufRef::Null => 0,
            BufRef::Heap => self.universe.heap,
            BufRef::Pinned => self.universe.pinned,
        };
        address as *mut c_void
    }

    fn stream(&self, stream: StreamRef) -> *mut c_void {
        let value = match stream {
            StreamRef::Made(index) => self.universe.streams[index],
            StreamRef::Null => 0,
            StreamRef::Bogus => BOGUS_STREAM,
        };
        value as *mut c_void
    }

    fn fd(&self, fd: FdKind) -> c_int {
        match fd {
            FdKind::ReadWrite => self.universe.rw_fd,
            FdKind::ReadOnly => self.universe.ro_fd,
            FdKind::MinusOne => -1,
            FdKind::Closed if self.multi_thread => self.universe.never_fd,
            FdKind::AboveLimit => self.universe.never_fd,
            FdKind::Closed => {
                // SAFETY: a NUL-terminated path; the descriptor is closed at once.
                let fd = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY) };
                assert!(fd >= 0);
                // SAFETY: our descriptor.
                unsafe { libc::close(fd) };
                fd
            }
            FdKind::Directory => self.universe.dir_fd,
            FdKind::OPath => self.universe.opath_fd,
            FdKind::IntMin => c_int::MIN,
        }
    }

    /// Runs one op and checks its results.
    fn run(&mut self, op: &Op) -> Check {
        let what = format!("{op:?}");
        *lock(&CURRENT_CALL) = what.clone();
        let panics = PANICS.load(Ordering::SeqCst);
        let result = self.run_op(op, &what);
        beat();
        if PANICS.load(Ordering::SeqCst) != panics {
            return Err(format!("{what}: a panic (printed above) happened during the call"));
        }
        result
    }

    fn run_op(&mut self, op: &Op, what: &str) -> Check {
        match *op {
            Op::DriverOpen => {
                // SAFETY: no arguments.
                check_status(what, unsafe { hipFileDriverOpen() }, codes::DRIVER_OPEN)
            }
            Op::DriverClose => {
                // SAFETY: no arguments.
                check_status(what, unsafe { hipFileDriverClose() }, codes::DRIVER_CLOSE)
            }
            Op::UseCount => {
                // SAFETY: no arguments.
                let count = unsafe { hipFileUseCount() };
                check_that(what, count >= 0, || format!("use count {count} on the cpu device"))
            }
            Op::Version { null_mask } => self.version(what, null_mask),
            Op::HandleRegister { fd, handle_type, null_fh, null_descr } => {
                self.handle_register(what, fd, handle_type, null_fh, null_descr)
            }
            Op::HandleDeregister(handle) => {
                let value = self.handle(handle);
                if let HandleRef::Current(slot) = handle {
                    self.shared.handles.forget(slot, value as usize);
                }
                // SAFETY: the handle is only looked up (any value is accepted).
                unsafe { hipFileHandleDeregister(value) };
                Ok(())
            }
            Op::BufRegister { buf, len, flags } => {
                let allowed = match buf {
                    BufRef::Device { plus_one, .. } => {
                        if len <= BUF_LEN - usize::from(plus_one) {
                            codes::BUF_REGISTER_IN_RANGE
                        } else {
                            codes::BUF_REGISTER_OUT_OF_RANGE
                        }
                    }
                    BufRef::Null => codes::BUF_REGISTER_NULL,
                    BufRef::Heap | BufRef::Pinned => codes::BUF_REGISTER_NOT_DEVICE,
                };
                // SAFETY: the pointer is only looked up in the device's table.
                let status = unsafe { hipFileBufRegister(self.buf(buf), len, flags) };
                check_status(what, status, allowed)
            }
            Op::BufDeregister(buf) => {
                // SAFETY: the pointer is only looked up.
                let status = unsafe { hipFileBufDeregister(self.buf(buf)) };
                check_status(what, status, codes::BUF_DEREGISTER)
            }
            Op::Io { write, fh, buf, size, file_offset, buffer_offset } => {
                let (fh, buf) = (self.handle(fh), self.buf(buf));
                // SAFETY: the handle is only looked up; the buffer is device memory the
                // test owns (its contents do not matter), NULL, or host memory, which the
                // device reports as not device memory before anything is accessed; the
                // range is checked against the allocation.
                let value = unsafe {
                    if write {
                        hipFileWrite(fh, buf, size, file_offset, buffer_offset)
                    } else {
                        hipFileRead(fh, buf, size, file_offset, buffer_offset)
                    }
                };
                check_ssize(what, value, size)
            }
            Op::Async { write, fh, buf, size, file_offset, buffer_offset, null_mask, stream } => {
                let request = AsyncRequest { write, fh, buf, size, file_offset, buffer_offset };
                self.io_async(what, request, null_mask, stream)
            }
            Op::StreamRegister { stream, flags } => {
                let allowed = if flags & !0xF != 0 {
                    codes::STREAM_REGISTER_BAD_FLAGS
                } else {
                    codes::STREAM_REGISTER
                };
                // SAFETY: NULL, a stream of the device, or a value the cpu device looks up
                // in its stream table and does not find (5011).
                let status = unsafe { hipFileStreamRegister(self.stream(stream), flags) };
                check_status(what, status, allowed)
            }
            Op::StreamDeregister(stream) => {
                // SAFETY: the stream is only looked up.
                let status = unsafe { hipFileStreamDeregister(self.stream(stream)) };
                check_status(what, status, codes::STREAM_DEREGISTER)
            }
            Op::StreamSynchronize(stream) => {
                // SAFETY: the handle is only looked up.
                let status = unsafe { hipfileCpuStreamSynchronize(self.stream(stream)) };
                let ok = match stream {
                    StreamRef::Bogus => status.0 != 0,
                    _ => status.0 == 0,
                };
                check_that(what, ok, || format!("hipfileCpuStreamSynchronize: {}", status.0))
            }
            Op::ErrorString(code) => error_string(what, code),
            Op::Stub { which, param, value } => stub(what, which, param, value),
            Op::BatchSetUp { slot, max_nr, null_out } => {
                let mut handle: *mut c_void = GARBAGE_HANDLE as *mut c_void;
                let out = if null_out { core::ptr::null_mut() } else { &raw mut handle };
                // SAFETY: NULL or a valid out-pointer.
                let status = unsafe { hipFileBatchIOSetUp(out, max_nr) };
                if null_out || max_nr == 0 || max_nr > 128 {
                    check_status(what, status, codes::BATCH_SETUP_BAD)?;
                    return check_that(what, handle as usize == GARBAGE_HANDLE, || {
                        "wrote the out-pointer on failure".into()
                    });
                }
                check_status(what, status, codes::BATCH_SETUP)?;
                check_that(what, !handle.is_null(), || "success with a NULL handle".into())?;
                let old = self.shared.batches.set(slot, handle as usize);
                // SAFETY: the handle is only looked up.
                unsafe { hipFileBatchIODestroy(old as *mut c_void) };
                Ok(())
            }
            Op::BatchSubmit { batch, nr, null_iocbp, op } => {
                let template = HipFileIoParams {
                    mode: op.mode,
                    u: IoParamsUnion {
                        batch: BatchIo {
                            dev_ptr_base: self.buf(op.buf),
                            file_offset: op.file_offset,
                            dev_ptr_offset: op.buffer_offset,
                            size: op.size,
                        },
                    },
                    fh: self.handle(op.fh),
                    opcode: op.opcode,
                    cookie: core::ptr::null_mut(),
                };
                let mut params = vec![template; (nr as usize).max(1)];
                let iocbp = if null_iocbp { core::ptr::null_mut() } else { params.as_mut_ptr() };
                // SAFETY: NULL or `nr` readable elements; handles and buffers are only
                // looked up.
                let status = unsafe { hipFileBatchIOSubmit(self.batch(batch), nr, iocbp, 0) };
                check_status(what, status, codes::BATCH_SUBMIT)
            }
            Op::BatchDestroy(batch) => {
                let value = self.batch(batch);
                if let BatchRef::Current(slot) = batch {
                    self.shared.batches.forget(slot, value as usize);
                }
                // SAFETY: the handle is only looked up.
                unsafe { hipFileBatchIODestroy(value) };
                Ok(())
            }
            Op::BatchStatus { batch, min_nr, max_nr, timeout_ms, null_events } => {
                self.batch_status(what, batch, min_nr, max_nr, timeout_ms, null_events)
            }
            Op::Explain { fh, buf, len, null_text } => {
                let fh = fh.map_or(core::ptr::null_mut(), |h| self.handle(h));
                let buf = buf.map_or(core::ptr::null_mut(), |b| self.buf(b));
                explain(what, fh, buf, len, null_text)
            }
            Op::StatsGet { device, api, write, null_out } => {
                stats_get(what, device, api, write, null_out)
            }
            Op::BatchCancel(batch) => {
                // SAFETY: the handle is only looked up.
                let status = unsafe { hipFileBatchIOCancel(self.batch(batch)) };
                check_status(what, status, codes::BATCH_STATUS)
            }
        }
    }

    /// `hipFileBatchIOGetStatus` with real storage: at most `max_nr` events, each
    /// complete (at most the largest entry's bytes) or failed (a documented negative
    /// code), and nothing written past `*nr`.
    fn batch_status(
        &self,
        what: &str,
        batch: BatchRef,
        min_nr: c_uint,
        max_nr: c_uint,
        timeout_ms: Option<i64>,
        null_events: bool,
    ) -> Check {
        const UNTOUCHED: usize = 0xdead_beef;
        let blank = HipFileIoEvents { cookie: core::ptr::null_mut(), status: -7, ret: UNTOUCHED };
        let mut events = vec![blank; max_nr as usize + 1];
        let mut nr = max_nr;
        let timeout = timeout_ms.map(|ms| libc::timespec {
            tv_sec: if ms < 0 { -1 } else { ms / 1000 },
            tv_nsec: (ms.max(0) % 1000) * 1_000_000,
        });
        let timeout_ptr =
            timeout.as_ref().map_or(core::ptr::null_mut(), |t| core::ptr::from_ref(t).cast_mut());
        let events_ptr = if null_events { core::ptr::null_mut() } else { events.as_mut_ptr() };
        // SAFETY: `nr` is valid; `events` has room for `max_nr` (+1 sentinel); the
        // timeout is NULL or valid.
        let status = unsafe {
            hipFileBatchIOGetStatus(self.batch(batch), min_nr, &mut nr, events_ptr, timeout_ptr)
        };
        check_status(what, status, codes::BATCH_STATUS)?;
        if status.err != 0 {
            return check_that(what, nr == max_nr, || "wrote *nr on failure".into());
        }
        check_that(what, nr <= max_nr, || format!("{nr} events for room of {max_nr}"))?;
        check_that(what, events[max_nr as usize].ret == UNTOUCHED, || "wrote past *nr".into())?;
        for event in &events[..nr as usize] {
            let ret = event.ret as isize;
            let ok = match event.status {
                16 => (0..=BUF_LEN as isize).contains(&ret),
                64 => ret < 0 && (codes::ALL.contains(&(-ret as c_int)) || -ret < 4096),
                _ => false,
            };
            check_that(what, ok, || format!("event {event:?}"))?;
        }
        Ok(())
    }

    fn version(&self, what: &str, null_mask: u8) -> Check {
        let mut values = [77 as c_uint; 3];
        let [major, minor, patch] = values.each_mut().map(|v| v as *mut c_uint);
        let pick = |bit: u8, ptr: *mut c_uint| {
            if null_mask & bit != 0 { core::ptr::null_mut() } else { ptr }
        };
        // SAFETY: NULL or valid pointers.
        let status = unsafe { hipFileGetVersion(pick(1, major), pick(2, minor), pick(4, patch)) };
        check_status(what, status, &[0])?;
        for (i, expected) in [0, 2, 0].into_iter().enumerate() {
            let want = if null_mask & (1 << i) != 0 { 77 } else { expected };
            check_that(what, values[i] == want, || format!("version field {i}: {}", values[i]))?;
        }
        Ok(())
    }

    fn handle_register(
        &mut self,
        what: &str,
        fd_kind: FdKind,
        handle_type: c_int,
        null_fh: bool,
        null_descr: bool,
    ) -> Check {
        let fd = self.fd(fd_kind);
        let descr =
            HipFileDescr { handle_type, handle: DescrHandle { fd }, fs_ops: core::ptr::null() };
        let mut fh = GARBAGE_HANDLE as *mut c_void;
        let fh_p = if null_fh { core::ptr::null_mut() } else { &raw mut fh };
        let descr_p = if null_descr { core::ptr::null() } else { &raw const descr };
        // SAFETY: NULL or valid pointers.
        let status = unsafe { hipFileHandleRegister(fh_p, descr_p) };
        let slot = match fd_kind {
            FdKind::ReadWrite => Some(0),
            FdKind::ReadOnly => Some(1),
            _ => None,
        };
        // A number closed before the call may have been reused by one of the library's
        // threads (it opens descriptors of its own): then it names an open file again.
        // SAFETY: F_GETFD only asks whether the number is open.
        let reused =
            matches!(fd_kind, FdKind::Closed) && unsafe { libc::fcntl(fd, libc::F_GETFD) } != -1;
        let allowed = if null_fh || null_descr {
            codes::HANDLE_REGISTER_NULL
        } else if handle_type != 1 {
            codes::HANDLE_REGISTER_BAD_TYPE
        } else if slot.is_some() {
            codes::HANDLE_REGISTER_GOOD_FD
        } else if reused {
            &[0, 5008, 5028, 5030]
        } else {
            codes::HANDLE_REGISTER_BAD_FD
        };
        check_status(what, status, allowed)?;
        if reused && status.err == 0 {
            // SAFETY: the handle is only looked up.
            unsafe { hipFileHandleDeregister(fh) };
            return Ok(());
        }
        if status.err != 0 {
            return check_that(what, fh as usize == GARBAGE_HANDLE, || {
                format!("wrote *fh = {fh:?} on failure")
            });
        }
        check_that(what, !fh.is_null() && fh as usize != GARBAGE_HANDLE, || {
            format!("success with handle {fh:?}")
        })?;
        if let Some(slot) = slot {
            self.shared.handles.set(slot, fh as usize);
        }
        Ok(())
    }

    fn io_async(
        &mut self,
        what: &str,
        request: AsyncRequest,
        null_mask: u8,
        stream: StreamRef,
    ) -> Check {
        let AsyncRequest { write, fh, buf, size, file_offset, buffer_offset } = request;
        let mut cells =
            Box::new(AsyncCells { size, file_offset, buffer_offset, bytes: BYTES_SENTINEL });
        let null = |bit: u8| null_mask & bit != 0;
        let size_p = if null(1) { core::ptr::null_mut() } else { &raw mut cells.size };
        let file_offset_p =
            if null(2) { core::ptr::null_mut() } else { &raw mut cells.file_offset };
        let buffer_offset_p =
            if null(4) { core::ptr::null_mut() } else { &raw mut cells.buffer_offset };
        let bytes_p = if null(8) { core::ptr::null_mut() } else { &raw mut cells.bytes };
        let (fh, buf_ptr, stream_ptr) = (self.handle(fh), self.buf(buf), self.stream(stream));
        // SAFETY: the pointers are NULL or point into `cells`, which is kept (in
        // `self.pending`) until the streams have been synchronised and is not written
        // meanwhile; the buffer is NULL, host memory (refused at submission) or device
        // memory that stays allocated; the stream is looked up.
        let status = unsafe {
            if write {
                hipFileWriteAsync(
                    fh,
                    buf_ptr,
                    size_p,
                    file_offset_p,
                    buffer_offset_p,
                    bytes_p,
                    stream_ptr,
                )
            } else {
                hipFileReadAsync(
                    fh,
                    buf_ptr,
                    size_p,
                    file_offset_p,
                    buffer_offset_p,
                    bytes_p,
                    stream_ptr,
                )
            }
        };
        let any_null = null_mask != 0 || matches!(buf, BufRef::Null);
        let allowed = if any_null { codes::ASYNC_SUBMIT_NULL } else { codes::ASYNC_SUBMIT };
        check_status(what, status, allowed)?;
        if status.err != 0 {
            // SAFETY: nothing was enqueued; the library does not touch the cells.
            let bytes = unsafe { (&raw const cells.bytes).read_volatile() };
            return check_that(what, bytes == BYTES_SENTINEL, || {
                format!("failed with {status:?}, yet *bytes_p = {bytes}")
            });
        }
        if size == 0 || matches!(stream, StreamRef::Null) {
            // Size 0: *bytes_p = 0 at once, nothing enqueued. The NULL stream: complete
            // when the call returns.
            // SAFETY: nothing is in flight on the cells.
            let bytes = unsafe { (&raw const cells.bytes).read_volatile() };
            if size == 0 {
                return check_that(what, bytes == 0, || format!("size 0, yet *bytes_p = {bytes}"));
            }
            return check_bytes(what, bytes, size);
        }
        self.pending.push(Pending { cells, size, what: what.to_string() });
        Ok(())
    }

    /// Waits for every stream and checks the async results; the cells are freed after.
    fn finish(&mut self) -> Check {
        *lock(&CURRENT_CALL) = "hipfileCpuDeviceSynchronize".into();
        // SAFETY: no arguments.
        let status = unsafe { hipfileCpuDeviceSynchronize() };
        for &stream in &self.universe.streams {
            // SAFETY: the handle is only looked up.
            let one = unsafe { hipfileCpuStreamSynchronize(stream as *mut c_void) };
            check_that("hipfileCpuStreamSynchronize", one.0 == 0, || format!("{}", one.0))?;
        }
        beat();
        check_that("hipfileCpuDeviceSynchronize", status.0 == 0, || format!("{}", status.0))?;
        let mut result = Ok(());
        for pending in self.pending.drain(..) {
            // SAFETY: the streams have passed the op.
            let bytes = unsafe { (&raw const pending.cells.bytes).read_volatile() };
            let checked = check_that(&pending.what, bytes != BYTES_SENTINEL, || {
                "*bytes_p never written".into()
            })
            .and_then(|()| check_bytes(&pending.what, bytes, pending.size));
            if result.is_ok() {
                result = checked;
            }
        }
        result
    }
}

#[derive(Clone, Copy)]
struct AsyncRequest {
    write: bool,
    fh: HandleRef,
    buf: BufRef,
    size: usize,
    file_offset: i64,
    buffer_offset: i64,
}

fn error_string(what: &str, code: c_int) -> Check {
    // SAFETY: any value is accepted.
    let ptr = unsafe { hipFileGetOpErrorString(code) };
    check_that(what, !ptr.is_null(), || "NULL".into())?;
    // SAFETY: non-NULL; the export returns a static NUL-terminated string.
    let text = unsafe { CStr::from_ptr(ptr) };
    let text = text.to_str().map_err(|e| format!("{what}: not UTF-8: {e}"))?;
    let unknown = text == "Unknown hipFile error";
    check_that(what, !text.is_empty() && unknown != codes::ALL.contains(&code), || {
        format!("message {text:?}")
    })
}

fn stub(what: &str, which: u8, param: c_int, value: usize) -> Check {
    if which < 12 {
        return parameter_call(what, which, param, value);
    }
    // SAFETY: every pointer is NULL; the stubs access none.
    let status = unsafe {
        match which {
            12 => hipFileBatchIOGetStatus(
                value as *mut c_void,
                param as c_uint,
                core::ptr::null_mut(),
                core::ptr::null_mut(),
                core::ptr::null_mut(),
            ),
            _ => hipFileBatchIOCancel(value as *mut c_void),
        }
    };
    check_status(what, status, codes::BATCH_STATUS)
}

/// `hipfileExplainPath` into `len` bytes: on success a NUL inside them and nothing
/// written past; on failure nothing written.
fn explain(what: &str, fh: *mut c_void, buf: *mut c_void, len: usize, null_text: bool) -> Check {
    let mut text = vec![b'#' as c_char; len + 1];
    let ptr = if null_text { core::ptr::null_mut() } else { text.as_mut_ptr() };
    // SAFETY: NULL or `len` writable bytes (+1 sentinel); fh and buf are only looked up.
    let status = unsafe { hipfileExplainPath(fh, buf.cast_const(), ptr, len) };
    check_status(what, status, codes::EXPLAIN)?;
    check_that(what, text[len] == b'#' as c_char, || "wrote past len".into())?;
    if status.err != 0 {
        return check_that(what, text.iter().all(|&c| c == b'#' as c_char), || {
            "wrote the text on failure".into()
        });
    }
    check_that(what, text[..len].contains(&0), || "no NUL within len".into())
}

/// `hipfileStatsGetClass` (and `hipfileStatsGetPaths` with the same NULL choice).
fn stats_get(what: &str, device: c_uint, api: c_int, write: c_int, null_out: bool) -> Check {
    let mut class = hipfile_runtime::stats::ClassSnapshot { ops: 77, ..Default::default() };
    let out = if null_out { core::ptr::null_mut() } else { &raw mut class };
    // SAFETY: NULL or a valid out-pointer.
    let status = unsafe { hipfileStatsGetClass(device, api, write, out) };
    check_status(what, status, codes::STATS)?;
    let valid = !null_out && (0..3).contains(&api) && device < 8;
    check_that(what, (status.err == 0) == valid, || format!("valid {valid}, got {status:?}"))?;
    if !valid {
        check_that(what, class.ops == 77, || "wrote the class on failure".into())?;
    }
    let mut paths = hipfile::ext::StatsPaths { counters: [7; 8] };
    let out = if null_out { core::ptr::null_mut() } else { &raw mut paths };
    // SAFETY: NULL or a valid out-pointer.
    let status = unsafe { hipfileStatsGetPaths(out) };
    check_status(what, status, codes::STATS)
}

/// The size_t parameter a `hipFileDriverSet*` call (`which` 3..=5) changes.
fn size_key_of(which: u8, param: c_int) -> c_int {
    match which {
        3 => 5, // PropertiesMaxDirectIOSizeKB
        4 => 6, // PropertiesMaxDeviceCacheSizeKB
        5 => 8, // PropertiesMaxDevicePinnedMemSizeKB
        _ => param,
    }
}

fn get_size(key: c_int) -> Option<usize> {
    let mut value = 0usize;
    // SAFETY: a valid out-pointer.
    (unsafe { hipFileGetParameterSizeT(key, &mut value) }.err == 0).then_some(value)
}

fn get_bool(key: c_int) -> Option<bool> {
    let mut value = false;
    // SAFETY: a valid out-pointer.
    (unsafe { hipFileGetParameterBool(key, &mut value) }.err == 0).then_some(value)
}

/// A parameter or property call with hostile arguments. A change that succeeds is
/// undone at once (the value read before it set back, and the executor count's
/// request parallelism with it), so that the rest of the run keeps its configuration;
/// the undo must succeed unless the engine started in between (5026).
fn parameter_call(what: &str, which: u8, param: c_int, value: usize) -> Check {
    let mut props = HipFileDriverProps::default();
    props.nvfs.major_version = 0x5a5a;
    let key = size_key_of(which, param);
    let (size_before, bool_before, parallelism_before) =
        (get_size(key), get_bool(param), get_size(4));
    // SAFETY: every pointer is NULL or valid.
    let status = unsafe {
        match which {
            0 => hipFileDriverGetProperties(core::ptr::null_mut()),
            1 => hipFileDriverGetProperties(&mut props),
            2 => hipFileDriverSetPollMode(value & 1 == 1, value),
            3 => hipFileDriverSetMaxDirectIOSize(value),
            4 => hipFileDriverSetMaxCacheSize(value),
            5 => hipFileDriverSetMaxPinnedMemSize(value),
            6 => hipFileGetParameterSizeT(param, core::ptr::null_mut()),
            7 => hipFileGetParameterBool(param, core::ptr::null_mut()),
            8 => hipFileGetParameterString(param, core::ptr::null_mut::<c_char>(), param),
            9 => hipFileSetParameterSizeT(param, value),
            10 => hipFileSetParameterBool(param, value & 1 == 1),
            _ => hipFileSetParameterString(param, core::ptr::null()),
        }
    };
    check_status(what, status, codes::PARAMETER)?;
    let wrote = props.nvfs.major_version != 0x5a5a;
    check_that(what, wrote == (which == 1 && status.err == 0), || {
        format!("properties written: {wrote} with status {}", status.err)
    })?;
    if status.err != 0 || !matches!(which, 2..=5 | 9 | 10) {
        return Ok(());
    }
    // Undo the change.
    // SAFETY: plain values.
    let undone = unsafe {
        match (which, size_before, bool_before) {
            (10, _, Some(before)) => hipFileSetParameterBool(param, before),
            (2..=5 | 9, Some(before), _) => {
                let first = hipFileSetParameterSizeT(key, before);
                match (key, parallelism_before) {
                    (2, Some(parallelism)) if first.err == 0 => {
                        hipFileSetParameterSizeT(4, parallelism)
                    }
                    _ => first,
                }
            }
            _ => return Ok(()),
        }
    };
    check_status(&format!("{what} (undo)"), undone, &[0, 5026])
}

/// Back to a closed driver with nothing registered (streams and batches included).
fn reset(universe: &Universe, shared: &Shared) {
    for slot in 0..2 {
        for value in [
            shared.handles.current[slot].swap(0, Ordering::SeqCst),
            shared.handles.last[slot].swap(0, Ordering::SeqCst),
        ] {
            // SAFETY: the handle is only looked up.
            unsafe { hipFileHandleDeregister(value as *mut c_void) };
        }
        for value in [
            shared.batches.current[slot].swap(0, Ordering::SeqCst),
            shared.batches.last[slot].swap(0, Ordering::SeqCst),
        ] {
            // SAFETY: the handle is only looked up.
            unsafe { hipFileBatchIODestroy(value as *mut c_void) };
        }
    }
    for stream in [universe.streams[0], universe.streams[1], 0, BOGUS_STREAM] {
        // SAFETY: the stream is only looked up.
        let _ = unsafe { hipFileStreamDeregister(stream as *mut c_void) };
    }
    for _ in 0..1_000_000 {
        // SAFETY: no arguments.
        if unsafe { hipFileDriverClose() }.err != 0 {
            break;
        }
    }
    // SAFETY: no arguments.
    assert_eq!(unsafe { hipFileUseCount() }, 0, "the driver did not close");
}

fn describe(ops: &[Op]) -> String {
    let mut text = String::new();
    for (i, op) in ops.iter().enumerate() {
        let _ = writeln!(text, "  {i:2}: {op:?}");
    }
    text
}

/// Runs one sequence from a reset driver; `Err` names the failing call.
fn run_sequence(universe: &'static Universe, ops: &[Op]) -> Check {
    let shared = Shared::default();
    reset(universe, &shared);
    let mut runner = Runner { universe, shared: &shared, multi_thread: false, pending: Vec::new() };
    let mut result = Ok(());
    for op in ops {
        result = runner.run(op);
        if result.is_err() {
            break;
        }
    }
    let finished = runner.finish();
    reset(universe, &shared);
    result.and(finished)
}

/// Random sequences, one thread, each from a reset driver: every result is documented.
/// A failure is shrunk to a minimal sequence.
#[test]
fn random_sequences() {
    let _serial = serialize();
    install_hooks();
    let Some(universe) = universe() else { return };
    let config = ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        max_shrink_iters: 4096,
        ..ProptestConfig::default()
    };
    let (started, sequences_run, calls) =
        (Instant::now(), AtomicUsize::new(0), AtomicUsize::new(0));
    let result = TestRunner::new(config).run(&sequences(), |ops| {
        sequences_run.fetch_add(1, Ordering::Relaxed);
        calls.fetch_add(ops.len(), Ordering::Relaxed);
        run_sequence(universe, &ops).map_err(|message| {
            TestCaseError::fail(format!("{message}\nsequence:\n{}", describe(&ops)))
        })
    });
    println!(
        "random_sequences: {} sequences (shrinking included), {} calls in {:?}",
        sequences_run.into_inner(),
        calls.into_inner(),
        started.elapsed()
    );
    print_outcomes("random_sequences");
    if let Err(error) = result {
        panic!("{error}");
    }
}

/// Draws sequences from a seeded proptest runner.
fn draw(runner: &mut TestRunner) -> Vec<Op> {
    sequences().new_tree(runner).expect("a sequence").current()
}

/// Four threads at once on shared handles, buffers and streams: deregistrations and
/// driver closes race with I/O. Bounded; a hang aborts the process.
#[test]
fn concurrent_random_sequences() {
    const THREADS: usize = 4;
    let _serial = serialize();
    install_hooks();
    let Some(universe) = universe() else { return };
    let rounds = (cases() as usize / THREADS).max(4);
    let seed: u64 =
        std::env::var("HIPFILE_HOSTILE_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(
            || SystemTime::now().duration_since(UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64),
        );
    println!(
        "concurrent_random_sequences: HIPFILE_HOSTILE_SEED={seed}, \
         {THREADS} threads x {rounds} sequences"
    );

    // Overall deadline, on top of the per-call watchdog.
    let deadline = Duration::from_secs(120 + rounds as u64);
    let done = std::sync::Arc::new(AtomicBool::new(false));
    let watch = std::sync::Arc::clone(&done);
    std::thread::spawn(move || {
        let start = Instant::now();
        while !watch.load(Ordering::SeqCst) {
            if start.elapsed() > deadline {
                abort_loudly(&format!(
                    "concurrent_random_sequences: HANG: not finished after {deadline:?} \
                     (HIPFILE_HOSTILE_SEED={seed}); last call: {}",
                    lock(&CURRENT_CALL)
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    });

    let shared = Shared::default();
    reset(universe, &shared);
    let started = Instant::now();
    let failures: Vec<String> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let shared = &shared;
                scope.spawn(move || {
                    let mut seed_bytes = [0u8; 32];
                    seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
                    seed_bytes[8] = t as u8;
                    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes);
                    let mut generator = TestRunner::new_with_rng(ProptestConfig::default(), rng);
                    let mut runner =
                        Runner { universe, shared, multi_thread: true, pending: Vec::new() };
                    let mut ops_run = 0usize;
                    for round in 0..rounds {
                        let ops = draw(&mut generator);
                        let mut result = Ok(());
                        for op in &ops {
                            result = runner.run(op);
                            ops_run += 1;
                            if result.is_err() {
                                break;
                            }
                        }
                        let finished = runner.finish();
                        if let Err(message) = result.and(finished) {
                            return Err(format!(
                                "thread {t}, sequence {round} (HIPFILE_HOSTILE_SEED={seed}): \
                                 {message}\nsequence:\n{}",
                                describe(&ops)
                            ));
                        }
                    }
                    Ok(ops_run)
                })
            })
            .collect();
        let mut failures = Vec::new();
        let mut total = 0;
        for worker in workers {
            match worker.join() {
                Ok(Ok(n)) => total += n,
                Ok(Err(message)) => failures.push(message),
                Err(_) => failures.push("a worker thread panicked".to_string()),
            }
        }
        println!("concurrent_random_sequences: {total} calls in {:?}", started.elapsed());
        failures
    });
    print_outcomes("concurrent_random_sequences");
    reset(universe, &shared);
    done.store(true, Ordering::SeqCst);
    assert!(failures.is_empty(), "undocumented results:\n{}", failures.join("\n"));
}

/// A submission that fails because another thread deregistered the handle after the
/// handle lookup (5027) leaves `*bytes_p` untouched (behaviour.md §2.4). It once wrote
/// `*bytes_p = 0` before `file.begin_op()` refused; found by the random driver.
#[test]
fn a_submission_refused_by_a_racing_deregistration_leaves_bytes_p_alone() {
    let _serial = serialize();
    install_hooks();
    let Some(universe) = universe() else { return };
    let shared = Shared::default();
    reset(universe, &shared);
    // SAFETY: no arguments.
    assert_eq!(unsafe { hipFileDriverOpen() }.err, 0);
    let handle = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let started = Instant::now();
    let violations = std::thread::scope(|scope| {
        scope.spawn(|| {
            while !stop.load(Ordering::SeqCst) {
                let descr = HipFileDescr {
                    handle_type: 1,
                    handle: DescrHandle { fd: universe.rw_fd },
                    fs_ops: core::ptr::null(),
                };
                let mut fh = core::ptr::null_mut();
                // SAFETY: valid pointers.
                if unsafe { hipFileHandleRegister(&mut fh, &descr) }.err == 0 {
                    handle.store(fh as usize, Ordering::SeqCst);
                    std::thread::yield_now();
                    // SAFETY: the handle is only looked up.
                    unsafe { hipFileHandleDeregister(fh) };
                }
            }
        });
        let mut kept = Vec::new();
        let mut violations = 0usize;
        while started.elapsed() < Duration::from_secs(3) && violations == 0 {
            let mut cells = Box::new(AsyncCells {
                size: 4096,
                file_offset: 0,
                buffer_offset: 0,
                bytes: BYTES_SENTINEL,
            });
            let fh = handle.load(Ordering::SeqCst) as *mut c_void;
            // SAFETY: the cells are kept until the device has been synchronised; the
            // buffer is device memory of the test.
            let status = unsafe {
                hipFileReadAsync(
                    fh,
                    universe.bufs[0] as *mut c_void,
                    &raw mut cells.size,
                    &raw mut cells.file_offset,
                    &raw mut cells.buffer_offset,
                    &raw mut cells.bytes,
                    universe.streams[0] as *mut c_void,
                )
            };
            if status.err != 0 {
                // SAFETY: nothing was enqueued.
                let bytes = unsafe { (&raw const cells.bytes).read_volatile() };
                if bytes != BYTES_SENTINEL {
                    println!("{status:?} with *bytes_p = {bytes}");
                    violations += 1;
                }
            }
            kept.push(cells);
            if kept.len() >= 256 {
                // SAFETY: no arguments.
                assert_eq!(unsafe { hipfileCpuDeviceSynchronize() }.0, 0);
                kept.clear();
            }
        }
        stop.store(true, Ordering::SeqCst);
        // SAFETY: no arguments.
        assert_eq!(unsafe { hipfileCpuDeviceSynchronize() }.0, 0);
        violations
    });
    reset(universe, &shared);
    assert_eq!(violations, 0, "a failed submission wrote *bytes_p");
}
