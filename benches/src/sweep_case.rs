//! One case of `--mode sweep`, run in a child process (`--sweep-case`): N registered
//! streams, one device buffer, every op submitted before any synchronization, then each
//! stream synchronized and every byte and byte count checked. A watchdog thread prints
//! the driver's pending report when the parent's SIGUSR1 says the case timed out.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use clap::ValueEnum;
use hipfile_runtime::device::user::{StreamGate, UserDevice};
use hipfile_runtime::file::{pread_full, pwrite_full};
use hipfile_runtime::{AsyncParams, Driver};
use serde::{Deserialize, Serialize};

use crate::bench::{Env, POISON, RunError, TestFile, Timer, failed, open_env};
use crate::cli::{RunArgs, SweepFlags, format_size, parse_size};
use crate::error::{Context, Failure, Result, fail};
use crate::mem::{DeviceBuf, Pinned, StreamSet, download, memset, upload};
use crate::workload::{Op, check_counts, direction, op_params, round_robin};
use crate::{pattern, runner, sys};

/// Seed of the sweep file's pattern: reads check against it, writes write it back.
pub const FILE_SEED: u64 = 1;
/// First line of the watchdog's output on stderr.
pub const REPORT_BEGIN: &str = "sweep watchdog: SIGUSR1 (case timeout); pending report:";
/// Last line of the watchdog's output on stderr (the parent waits for it).
pub const REPORT_END: &str = "sweep watchdog: end of report";
/// Prefix of the child's result line on stdout (JSON follows).
pub const RESULT_PREFIX: &str = "sweep-result ";
/// How often the watchdog looks at the SIGUSR1 flag.
const WATCHDOG_POLL: Duration = Duration::from_millis(50);

/// One sweep case as the child runs it (after the parent fitted it to the file).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CaseSpec {
    /// Reads (else writes).
    pub read: bool,
    /// User streams.
    pub streams: usize,
    /// How the streams are registered.
    pub flags: SweepFlags,
    /// Bytes per op (a multiple of 4K).
    pub io_size: u64,
    /// Ops per stream.
    pub ops_per_stream: usize,
}

impl CaseSpec {
    /// `read` or `write`.
    pub fn direction_name(&self) -> &'static str {
        if self.read { "read" } else { "write" }
    }

    /// Ops of all streams.
    pub fn ops(&self) -> usize {
        self.streams * self.ops_per_stream
    }

    /// Bytes of all ops (the device buffer, and the file range `[0, bytes)` they cover).
    pub fn bytes(&self) -> u64 {
        self.ops() as u64 * self.io_size
    }

    /// Op `i` of stream `s`: file slot `i * streams + s` (the streams walk the file
    /// together), buffer slot `s * ops_per_stream + i` (each stream owns a contiguous
    /// part of the buffer). Both are permutations of the slots, so the ops are disjoint
    /// in the file and in the buffer, and a buffer offset is not its file offset.
    pub fn plan(&self) -> Vec<Vec<Op>> {
        let op = |s: usize, i: usize| Op {
            offset: (i * self.streams + s) as u64 * self.io_size,
            len: self.io_size as usize,
        };
        (0..self.streams).map(|s| (0..self.ops_per_stream).map(|i| op(s, i)).collect()).collect()
    }

    /// Buffer offset of op `i` of stream `s` (see [`CaseSpec::plan`]).
    pub fn buffer_offset(&self, s: usize, i: usize) -> u64 {
        (s * self.ops_per_stream + i) as u64 * self.io_size
    }

    /// `read:24:mixed:4M:4`, the `--sweep-case` argument.
    pub fn to_arg(self) -> String {
        format!(
            "{}:{}:{}:{}:{}",
            self.direction_name(),
            self.streams,
            self.flags.name(),
            format_size(self.io_size),
            self.ops_per_stream
        )
    }

    /// Parses [`CaseSpec::to_arg`]'s form.
    ///
    /// # Errors
    /// Not five fields, or a field out of range.
    pub fn parse(text: &str) -> std::result::Result<CaseSpec, String> {
        let bad = || format!("--sweep-case `{text}`: expected read|write:STREAMS:FLAGS:SIZE:OPS");
        let fields: Vec<&str> = text.split(':').collect();
        let [dir, streams, flags, size, ops] = fields[..] else { return Err(bad()) };
        let read = match dir {
            "read" => true,
            "write" => false,
            _ => return Err(bad()),
        };
        let count = |f: &str| f.parse::<usize>().ok().filter(|&n| (1..=4096).contains(&n));
        let spec = CaseSpec {
            read,
            streams: count(streams).ok_or_else(bad)?,
            flags: SweepFlags::from_str(flags, false)?,
            io_size: parse_size(size)?,
            ops_per_stream: count(ops).ok_or_else(bad)?,
        };
        if !spec.io_size.is_multiple_of(4096) {
            return Err(bad());
        }
        Ok(spec)
    }
}

/// What the child reports on stdout (one line: [`RESULT_PREFIX`] and this as JSON).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CaseResult {
    /// `PASS`, `WRONG` or `FAIL`.
    pub status: String,
    /// Submit of the first op to the last stream synchronized, seconds.
    pub seconds: Option<f64>,
    /// Why WRONG or FAIL.
    pub detail: Option<String>,
}

/// Separates the cases of one `--sweep-case` argument.
pub const CASE_SEPARATOR: char = ',';

/// Runs the cases `--sweep-case` names (one, or several separated by
/// [`CASE_SEPARATOR`]) in this process, one after another with one driver, and prints a
/// result line for each; stops after the first that is not PASS (the parent runs the
/// rest in a new process). `Ok(false)` when one is not PASS.
///
/// # Errors
/// No `--file` / `--file-size`, a bad case, or no device / driver (the parent reports
/// these as FAIL with this process's stderr).
pub fn run(args: &RunArgs, text: &str) -> Result<bool> {
    sys::catch_sigusr1().ctx("installing the SIGUSR1 handler")?;
    let specs = text
        .split(CASE_SEPARATOR)
        .map(CaseSpec::parse)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(Failure)?;
    let (Some(path), Some(size)) = (&args.file, args.file_size) else {
        return fail("--sweep-case needs --file and --file-size");
    };
    let env = open_env(args.device, args.threads, args.direct, &runner::file_dir(path))?;
    let watchdog = Watchdog::start(&env.driver);
    for spec in &specs {
        let result = match run_case(&env, path, size, spec, args) {
            Ok(seconds) => {
                CaseResult { status: "PASS".into(), seconds: Some(seconds), detail: None }
            }
            Err(RunError::Wrong(detail)) => {
                CaseResult { status: "WRONG".into(), seconds: None, detail: Some(detail) }
            }
            Err(RunError::Failed(detail)) => {
                CaseResult { status: "FAIL".into(), seconds: None, detail: Some(detail) }
            }
        };
        let json = serde_json::to_string(&result).ctx("encoding the result")?;
        // One line each (stdout is line-buffered): the parent counts them as they come.
        println!("{RESULT_PREFIX}{json}");
        if result.status != "PASS" {
            return Ok(false);
        }
    }
    drop(watchdog);
    Ok(true)
}

/// The case's streams and buffers: one device buffer per device the streams are spread
/// over (`--spread-devices`: stream `s` on device `s mod N`; else every stream on device
/// 0). Fields drop in declaration order: the streams first (they synchronize), then the
/// memory they used.
struct Rig {
    streams: StreamSet,
    host: Pinned,
    devs: Vec<DeviceBuf>,
}

impl Rig {
    fn new(env: &Env, spec: &CaseSpec, spread: bool) -> Result<Rig> {
        let len = usize::try_from(spec.bytes()).ctx("case size")?;
        let devices = if spread { env.device.device_count().max(1) } else { 1 };
        let mut devs = Vec::new();
        for ordinal in 0..devices {
            let dev = DeviceBuf::alloc_on(&env.device, ordinal, len)?;
            env.driver.buf_register(dev.addr, spec.bytes(), 0).ctx("buf_register")?;
            devs.push(dev);
        }
        let host = Pinned::alloc(&env.device, len)?;
        let mut streams = StreamSet::create_spread(&env.device, spec.streams, devices)?;
        streams.register_each(&env.driver, |s| spec.flags.of(s))?;
        Ok(Rig { streams, host, devs })
    }

    fn len(&self) -> usize {
        self.host.len()
    }

    /// The device buffer stream `s` moves data to or from (on that stream's device).
    fn dev_of(&self, s: usize) -> &DeviceBuf {
        &self.devs[s % self.devs.len()]
    }
}

/// Sets up, submits every op, synchronizes every stream, checks; the seconds from the
/// first submit to the last synchronization.
fn run_case(
    env: &Env,
    path: &Path,
    size: u64,
    spec: &CaseSpec,
    args: &RunArgs,
) -> std::result::Result<f64, RunError> {
    if spec.bytes() > size {
        return Err(RunError::Failed(format!("the case needs {} bytes of the file", spec.bytes())));
    }
    let file = TestFile::open_existing(path, size, env.direct.effective, FILE_SEED)
        .map_err(failed("test file"))?;
    let handle = env
        .driver
        .handle_register(file.io.as_raw_fd())
        .ctx("handle_register")
        .map_err(failed("setup"))?;
    let mut rig = Rig::new(env, spec, args.spread_devices).map_err(failed("setup"))?;
    let plan = spec.plan();
    let params: Vec<Vec<Arc<AsyncParams>>> = (0..spec.streams)
        .map(|s| {
            let one =
                |i: usize| op_params(plan[s][i].len, plan[s][i].offset, spec.buffer_offset(s, i));
            (0..spec.ops_per_stream).map(one).collect()
        })
        .collect();
    prepare(env, &file, &mut rig, spec)?;
    // Held (never opened) until the process is killed: the case hangs on purpose.
    let _gates = if args
        .sweep_selftest_hang
        .is_some_and(|streams| streams == 0 || streams as usize == spec.streams)
    {
        pause_all(&env.device, &rig.streams)?
    } else {
        Vec::new()
    };
    let timer = Timer::start();
    for (s, i) in round_robin(&plan) {
        env.driver
            .submit_async(
                direction(spec.read),
                handle,
                rig.dev_of(s).addr,
                &params[s][i],
                rig.streams.handles[s],
            )
            .map_err(|e| RunError::Failed(format!("submit_async (stream {s}, op {i}): {e}")))?;
    }
    rig.streams.sync_all().map_err(failed("stream synchronize"))?;
    let (seconds, _) = timer.stop();
    check_counts(&plan, &params)?;
    if spec.read { check_device(env, &mut rig, spec) } else { check_file(&file, &mut rig, spec) }?;
    // The process's next case registers its own file handle and buffers (every stream
    // is synchronized: nothing uses these any more).
    for dev in &rig.devs {
        env.driver.buf_deregister(dev.addr).ctx("buf_deregister").map_err(failed("cleanup"))?;
    }
    env.driver.handle_deregister(handle);
    Ok(seconds)
}

/// Reads: the device buffer poisoned. Writes: the buffer holds each op's file bytes at
/// its buffer offset, and the file range the case covers is poisoned (the ops write the
/// file's pattern back, so a write that did nothing fails and the file is whole again).
fn prepare(
    env: &Env,
    file: &TestFile,
    rig: &mut Rig,
    spec: &CaseSpec,
) -> std::result::Result<(), RunError> {
    let len = rig.len();
    if spec.read {
        for dev in &rig.devs {
            memset(&env.device, dev.addr, POISON, len).map_err(failed("poison"))?;
        }
        return Ok(());
    }
    let host = &mut rig.host.bytes_mut()[..len];
    for (s, ops) in spec.plan().iter().enumerate() {
        for (i, op) in ops.iter().enumerate() {
            let at = spec.buffer_offset(s, i) as usize;
            pattern::fill(&mut host[at..at + op.len], op.offset, FILE_SEED);
        }
    }
    for dev in &rig.devs {
        upload(&env.device, dev.addr, &rig.host, len).map_err(failed("upload"))?;
    }
    let host = &mut rig.host.bytes_mut()[..len];
    host.fill(POISON);
    pwrite_full(file.plain.as_raw_fd(), host, 0)
        .map_err(|e| RunError::Failed(format!("poisoning the file: {e}")))?;
    Ok(())
}

/// Pauses every stream with a gate that is never opened (`--sweep-selftest-hang`).
fn pause_all(
    device: &Arc<dyn UserDevice>,
    streams: &StreamSet,
) -> std::result::Result<Vec<StreamGate>, RunError> {
    let pause = |&stream| StreamGate::pause(device, stream);
    streams
        .handles
        .iter()
        .map(pause)
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| RunError::Failed(format!("pausing a stream: {e}")))
}

/// Where file offset `offset` belongs: `stream s op i`.
fn op_of(spec: &CaseSpec, offset: u64) -> String {
    let slot = (offset / spec.io_size) as usize;
    format!("stream {} op {}", slot % spec.streams, slot / spec.streams)
}

/// Reads: every op's bytes in its stream's device buffer against the file's pattern.
fn check_device(env: &Env, rig: &mut Rig, spec: &CaseSpec) -> std::result::Result<(), RunError> {
    let len = rig.len();
    for d in 0..rig.devs.len() {
        let addr = rig.devs[d].addr;
        download(&env.device, &mut rig.host, addr, len).map_err(failed("download"))?;
        check_ops_of_device(&rig.host.bytes()[..len], spec, d, rig.devs.len())?;
    }
    Ok(())
}

/// The ops of the streams on device `d` (of `devices`), in `host` (that device's buffer).
fn check_ops_of_device(
    host: &[u8],
    spec: &CaseSpec,
    d: usize,
    devices: usize,
) -> std::result::Result<(), RunError> {
    for (s, ops) in spec.plan().iter().enumerate().filter(|(s, _)| s % devices == d) {
        for (i, op) in ops.iter().enumerate() {
            let at = spec.buffer_offset(s, i) as usize;
            pattern::verify(&host[at..at + op.len], op.offset, FILE_SEED).map_err(|bad| {
                RunError::Wrong(format!(
                    "stream {s} op {i}: device byte for file offset {bad} (buffer offset {}) differs",
                    at as u64 + bad - op.offset
                ))
            })?;
        }
    }
    Ok(())
}

/// Writes: the file range the case covers, read back with `pread`, against the pattern.
fn check_file(
    file: &TestFile,
    rig: &mut Rig,
    spec: &CaseSpec,
) -> std::result::Result<(), RunError> {
    let len = rig.len();
    let host = &mut rig.host.bytes_mut()[..len];
    let read = pread_full(file.plain.as_raw_fd(), host, 0)
        .map_err(|e| RunError::Failed(format!("reading the file back: {e}")))?;
    if read != len {
        return Err(RunError::Wrong(format!("file read back {read} of {len} bytes")));
    }
    pattern::verify(host, 0, FILE_SEED).map_err(|bad| {
        RunError::Wrong(format!("file byte at offset {bad} ({}) differs", op_of(spec, bad)))
    })
}

/// Prints [`Driver::pending_report`] to stderr, between [`REPORT_BEGIN`] and
/// [`REPORT_END`], each time SIGUSR1 arrives; a thread polling the flag the signal
/// handler sets, every [`WATCHDOG_POLL`].
struct Watchdog {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Watchdog {
    fn start(driver: &Arc<Driver>) -> Watchdog {
        let stop = Arc::new(AtomicBool::new(false));
        let (driver, flag) = (Arc::clone(driver), Arc::clone(&stop));
        let thread = std::thread::Builder::new()
            .name("sweep-watchdog".into())
            .spawn(move || {
                while !flag.load(Ordering::Acquire) {
                    if sys::take_sigusr1() {
                        let text =
                            format!("{REPORT_BEGIN}\n{}{REPORT_END}\n", driver.pending_report());
                        let _ = std::io::stderr().lock().write_all(text.as_bytes());
                    }
                    std::thread::sleep(WATCHDOG_POLL);
                }
            })
            .ok();
        Watchdog { stop, thread }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn case_specs_round_trip() {
        let spec = CaseSpec {
            read: false,
            streams: 24,
            flags: SweepFlags::Mixed,
            io_size: 4 << 20,
            ops_per_stream: 4,
        };
        assert_eq!(spec.to_arg(), "write:24:mixed:4M:4");
        assert_eq!(CaseSpec::parse(&spec.to_arg()), Ok(spec));
        for bad in [
            "",
            "read:1:fixed:4K",
            "peek:1:fixed:4K:1",
            "read:0:fixed:4K:1",
            "read:1:all:4K:1",
            "read:1:none:100:1",
        ] {
            assert!(CaseSpec::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn plan_slots_are_disjoint_permutations() {
        let spec = CaseSpec {
            read: true,
            streams: 3,
            flags: SweepFlags::None,
            io_size: 4096,
            ops_per_stream: 4,
        };
        let plan = spec.plan();
        let mut file_slots: Vec<u64> = plan.iter().flatten().map(|op| op.offset / 4096).collect();
        let mut buffer_slots: Vec<u64> = (0..3)
            .flat_map(|s| (0..4).map(move |i| (s, i)))
            .map(|(s, i)| spec.buffer_offset(s, i) / 4096)
            .collect();
        file_slots.sort_unstable();
        buffer_slots.sort_unstable();
        assert_eq!(file_slots, (0..12).collect::<Vec<_>>());
        assert_eq!(buffer_slots, (0..12).collect::<Vec<_>>());
        assert_eq!(plan[1][2].offset, (2 * 3 + 1) * 4096);
        assert_eq!(spec.buffer_offset(1, 2), (4 + 2) * 4096);
        assert_eq!(op_of(&spec, plan[1][2].offset + 5), "stream 1 op 2");
    }
}
