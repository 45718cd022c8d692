//! `--profile`: where a case's CPU time and the engine's time went.
//!
//! - CPU time per thread group, from `/proc/self/task/*/schedstat` (nanoseconds on the
//!   CPU; `stat`'s clock ticks where schedstat is missing), threads grouped by name with
//!   digits replaced by `N` (`hipfile-io-N` = the executors, `iou-wrk-N` = the kernel's
//!   io_uring workers that run punted requests, `hipfile-arm`, the bench's own threads);
//!   threads that ended during the case are one group, from the process total.
//! - The engine's phase counters ([`EnginePhases`]): executor busy time, and what its
//!   jobs waited for (file reads and writes, device copies, staging).
//!
//! CPU time per thread group is taken over the timed part of every repetition (the
//! windows [`crate::bench::Timer`] measures, the same as the row's CPU-s/GiB column), so
//! the bench's own filling and verification are not in it; threads that start and end
//! inside a window (a baseline's workers) show as `(ended threads)`. The engine's phases
//! are taken over the whole case.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use hipfile_runtime::engine::EnginePhases;
use serde::Serialize;

use crate::bench::Bench;

const GIB: f64 = (1u64 << 30) as f64;

/// CPU nanoseconds per thread group, and of the whole process.
#[derive(Clone, Debug, Default)]
struct ThreadCpu {
    /// (thread id, group) → CPU ns, and clock ticks in the kernel (`stat`'s stime).
    threads: BTreeMap<(u32, String), (u64, u64)>,
    process_ns: u64,
    /// The thread that read: its id, and the CPU ns the reading itself cost it.
    reader: u32,
    reading_ns: u64,
}

/// CPU ns of the calling thread (exact, where a running thread's `schedstat` lags).
fn own_cpu_ns() -> u64 {
    // SAFETY: an all-zero timespec is a valid value of the plain C struct.
    let mut now: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: `now` is a valid, writable timespec.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) } != 0 {
        return 0;
    }
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

impl ThreadCpu {
    /// Every thread's CPU time, the reading thread's last (from its own clock), then the
    /// process's: what reading `/proc` cost the reader is known and left out of a window
    /// ([`ThreadCpu::since`]), where it once counted as the row's CPU.
    fn now() -> ThreadCpu {
        let began_ns = own_cpu_ns();
        // SAFETY: gettid has no preconditions.
        let reader = unsafe { libc::gettid() } as u32;
        let mut threads = BTreeMap::new();
        let read_task = |path: &std::path::Path| {
            let name = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
            let stat = std::fs::read_to_string(path.join("stat")).unwrap_or_default();
            (group_of(name.trim_end()), stat_ticks(&stat))
        };
        if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
            for task in tasks.flatten() {
                let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
                    continue;
                };
                if tid == reader {
                    continue;
                }
                let path = task.path();
                let (group, ticks) = read_task(&path);
                let ns = std::fs::read_to_string(path.join("schedstat"))
                    .ok()
                    .and_then(|s| s.split_whitespace().next()?.parse().ok())
                    .or(ticks.map(|(user, system)| (user + system) * TICK_NS));
                if let Some(ns) = ns {
                    let system_ticks = ticks.map_or(0, |(_, system)| system);
                    threads.insert((tid, group), (ns, system_ticks));
                }
            }
        }
        let (group, ticks) =
            read_task(&std::path::Path::new("/proc/self/task").join(reader.to_string()));
        let own_ns = own_cpu_ns();
        threads.insert((reader, group), (own_ns, ticks.map_or(0, |(_, system)| system)));
        let process_ns = (crate::sys::cpu_seconds() * 1e9) as u64;
        ThreadCpu { threads, process_ns, reader, reading_ns: own_ns.saturating_sub(began_ns) }
    }

    /// CPU ns of thread `key` between `earlier` and `self`, less this reading's cost for
    /// the thread that read.
    fn thread_delta_ns(&self, key: &(u32, String), earlier: &ThreadCpu) -> u64 {
        let ns = self.threads.get(key).map_or(0, |&(ns, _)| ns);
        let before = earlier.threads.get(key).map_or(0, |&(ns, _)| ns);
        let delta = ns.saturating_sub(before);
        if key.0 == self.reader { delta.saturating_sub(self.reading_ns) } else { delta }
    }

    /// CPU ns and kernel ns per group between `earlier` and `self`; threads that ended
    /// meanwhile as `(ended threads)` (kernel share unknown). The reading of `self` is
    /// left out (that of `earlier` came before its figures were taken).
    fn since(&self, earlier: &ThreadCpu) -> BTreeMap<String, (u64, u64)> {
        let mut groups: BTreeMap<String, (u64, u64)> = BTreeMap::new();
        let mut live_ns = 0u64;
        for (key, &(_, system)) in &self.threads {
            let delta = self.thread_delta_ns(key, earlier);
            let system_before = earlier.threads.get(key).map_or(0, |&(_, system)| system);
            live_ns += delta;
            let entry = groups.entry(key.1.clone()).or_default();
            entry.0 += delta;
            entry.1 += system.saturating_sub(system_before) * TICK_NS;
        }
        let process =
            self.process_ns.saturating_sub(earlier.process_ns).saturating_sub(self.reading_ns);
        // getrusage and schedstat round differently: only a clear remainder is shown.
        let ended = process.saturating_sub(live_ns);
        if ended > process / 50 {
            groups.insert("(ended threads)".into(), (ended, 0));
        }
        groups.retain(|_, (ns, _)| *ns > 0);
        groups
    }
}

/// Whether timed windows are recorded (`--profile`).
static RECORDING: AtomicBool = AtomicBool::new(false);

/// CPU and kernel ns per thread group over the timed windows of the case being profiled.
static TIMED: Mutex<BTreeMap<String, (u64, u64)>> = Mutex::new(BTreeMap::new());

/// Records the timed windows of every case from now on (`--profile`).
pub fn record_timed_windows() {
    RECORDING.store(true, Ordering::SeqCst);
}

/// The thread CPU at a timed window's start, while `--profile` records.
pub struct TimedWindow(ThreadCpu);

impl TimedWindow {
    /// A window starting now, if windows are recorded.
    pub fn start() -> Option<TimedWindow> {
        RECORDING.load(Ordering::SeqCst).then(|| TimedWindow(ThreadCpu::now()))
    }

    /// Adds the CPU time of each thread group since the start to the case's total.
    pub fn end(self) {
        let groups = ThreadCpu::now().since(&self.0);
        let mut timed = TIMED.lock().unwrap_or_else(|p| p.into_inner());
        for (group, (ns, system_ns)) in groups {
            let entry = timed.entry(group).or_default();
            entry.0 += ns;
            entry.1 += system_ns;
        }
    }
}

/// The case's timed CPU so far, emptied.
fn take_timed() -> BTreeMap<String, (u64, u64)> {
    std::mem::take(&mut *TIMED.lock().unwrap_or_else(|p| p.into_inner()))
}

/// Nanoseconds per clock tick of `/proc/.../stat` (USER_HZ is 100 on Linux).
const TICK_NS: u64 = 10_000_000;

/// (utime, stime) of a `/proc/.../stat` line, in clock ticks.
fn stat_ticks(stat: &str) -> Option<(u64, u64)> {
    // The command name may hold spaces: fields count from after its closing ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i)?.parse::<u64>().ok();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    Some((ticks(11)?, ticks(12)?))
}

/// A thread's group: its name with every run of digits replaced by `N`.
fn group_of(name: &str) -> String {
    let mut group = String::with_capacity(name.len());
    let mut in_digits = false;
    for c in name.chars() {
        if c.is_ascii_digit() {
            if !in_digits {
                group.push('N');
            }
            in_digits = true;
        } else {
            group.push(c);
            in_digits = false;
        }
    }
    group
}

/// What `--profile` takes before a case.
pub struct ProfileStart {
    engine: Option<(EnginePhases, u64)>,
    round_trip: RoundTripCounters,
}

/// The async path's round-trip counters (`AsyncStats`): arm-to-release ns and ops,
/// release-to-next-arm ns and arms.
#[derive(Clone, Copy, Debug, Default)]
struct RoundTripCounters([u64; 6]);

impl RoundTripCounters {
    fn now(b: &Bench) -> RoundTripCounters {
        let a = b.env.driver.async_stats();
        let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        RoundTripCounters([
            load(&a.arm_to_release_ns),
            load(&a.timed_releases),
            load(&a.release_to_arm_ns),
            load(&a.timed_arms),
            load(&a.arm_look_gap_ns),
            load(&a.arm_behind_look_ns),
        ])
    }

    /// Mean µs of each half since `earlier`, where the case timed any.
    fn since(&self, earlier: &RoundTripCounters) -> Option<AsyncRoundTrip> {
        let d = |i: usize| self.0[i].saturating_sub(earlier.0[i]);
        let mean_us = |ns: u64, n: u64| ns as f64 * 1e-3 / n.max(1) as f64;
        (d(1) > 0).then(|| AsyncRoundTrip {
            arm_to_release_us: mean_us(d(0), d(1)),
            release_to_arm_us: mean_us(d(2), d(3)),
            arm_look_gap_us: mean_us(d(4), d(3)),
            arm_behind_look_us: mean_us(d(5), d(3)),
        })
    }
}

/// A stream's per-op round trip on the async path, split where the host hands over to
/// the device.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct AsyncRoundTrip {
    /// Mean µs from an op's arm to its release enqueued (host: executor wake-up, copy
    /// and release enqueued).
    pub arm_to_release_us: f64,
    /// Mean µs from a release enqueued to the next arm on that stream (device: copy,
    /// release, next doorbell; then the poller noticing it).
    pub release_to_arm_us: f64,
    /// Of that, mean µs between the poller's look that found the next doorbell and its
    /// look before: the doorbell rang in that gap, so it bounds the poller's share.
    pub arm_look_gap_us: f64,
    /// Of that, mean µs from the look that found the doorbell to the arm running (the arms
    /// of that look before it).
    pub arm_behind_look_us: f64,
}

impl ProfileStart {
    /// Takes the counters now.
    pub fn take(b: &Bench) -> ProfileStart {
        // Windows of an earlier case that ended without a profile are not this one's.
        take_timed();
        ProfileStart { engine: engine_counters(b), round_trip: RoundTripCounters::now(b) }
    }
}

/// The engine's phases and jobs so far.
fn engine_counters(b: &Bench) -> Option<(EnginePhases, u64)> {
    b.env.driver.engine().ok().map(|engine| (engine.phases(), engine.stats().jobs))
}

/// Where a case's time went.
#[derive(Clone, Debug, Serialize)]
pub struct Profile {
    /// CPU seconds per GiB moved in the timed windows, per thread group (largest first),
    /// and the share of it spent in the kernel (from clock ticks: coarse for short cases).
    pub cpu_s_per_gib: Vec<(String, f64, f64)>,
    /// The engine's executors, where the case used them.
    pub engine: Option<EngineProfile>,
    /// The async path's per-op round trip, where the case released ops device-side.
    pub round_trip: Option<AsyncRoundTrip>,
}

/// The engine's share of a case.
#[derive(Clone, Debug, Serialize)]
pub struct EngineProfile {
    /// Executor busy time (at least one job) as a fraction of executors × timed wall.
    pub busy: f64,
    /// Jobs' waits as fractions of the jobs' time: file reads, file writes, device
    /// copies, staging.
    pub read_wait: f64,
    /// See `read_wait`.
    pub write_wait: f64,
    /// See `read_wait`.
    pub copy_wait: f64,
    /// See `read_wait`.
    pub staging_wait: f64,
    /// Mean job time, µs.
    pub job_us: f64,
    /// Chunks read and written.
    pub chunks: u64,
    /// Prefetched reads: mean µs from the job resuming at its opened gate to its copy
    /// enqueued, and to its release enqueued (0 without prefetched reads).
    pub gate_to_copy_us: f64,
    /// See `gate_to_copy_us`.
    pub gate_to_release_us: f64,
}

impl Profile {
    /// The profile since `start`, for `bytes` moved in `timed_s` timed seconds.
    pub fn since(start: &ProfileStart, b: &Bench, bytes: u64, timed_s: f64) -> Profile {
        let gib = bytes as f64 / GIB;
        let mut cpu_s_per_gib: Vec<(String, f64, f64)> = take_timed()
            .into_iter()
            .filter(|_| bytes > 0)
            .map(|(group, (ns, system_ns))| {
                (group, ns as f64 * 1e-9 / gib, (system_ns as f64 / ns as f64).min(1.0))
            })
            .collect();
        cpu_s_per_gib.sort_by(|a, b| b.1.total_cmp(&a.1));
        let executors = b.env.config.executor_cpus.len().max(1) as f64;
        let engine = match (start.engine, engine_counters(b)) {
            (Some((before, jobs_before)), Some((after, jobs_after))) => {
                let p = after.since(&before);
                let jobs = jobs_after.saturating_sub(jobs_before).max(1);
                (p.job_ns > 0).then(|| {
                    let of_jobs = |ns: u64| ns as f64 / p.job_ns as f64;
                    EngineProfile {
                        busy: p.busy_ns as f64 * 1e-9 / (executors * timed_s.max(1e-9)),
                        read_wait: of_jobs(p.read_wait_ns),
                        write_wait: of_jobs(p.write_wait_ns),
                        copy_wait: of_jobs(p.copy_wait_ns),
                        staging_wait: of_jobs(p.staging_wait_ns),
                        job_us: p.job_ns as f64 * 1e-3 / jobs as f64,
                        chunks: p.chunks_read + p.chunks_written,
                        gate_to_copy_us: p.gate_to_copy_ns as f64 * 1e-3
                            / p.gates_opened.max(1) as f64,
                        gate_to_release_us: p.gate_to_release_ns as f64 * 1e-3
                            / p.gates_opened.max(1) as f64,
                    }
                })
            }
            _ => None,
        };
        let round_trip = RoundTripCounters::now(b).since(&start.round_trip);
        Profile { cpu_s_per_gib, engine, round_trip }
    }

    /// The profile's text lines (indented, under the row).
    pub fn lines(&self) -> String {
        let groups: Vec<String> = self
            .cpu_s_per_gib
            .iter()
            .map(|(group, s, system)| match group.as_str() {
                "(ended threads)" => format!("{group} {s:.3}"),
                _ => format!("{group} {s:.3} ({:.0}% sys)", system * 100.0),
            })
            .collect();
        let mut out = match groups.is_empty() {
            true => "    cpu-s/GiB by thread: - (no bytes moved)\n".to_string(),
            false => format!("    cpu-s/GiB by thread: {}\n", groups.join(", ")),
        };
        if let Some(e) = &self.engine {
            let pct = |f: f64| f * 100.0;
            out.push_str(&format!(
                "    engine: executors busy {:.0}% of the wall; of job time: read wait {:.0}%, write wait {:.0}%, copy wait {:.0}%, staging wait {:.0}%; {:.0} us/job, {} chunks\n",
                pct(e.busy),
                pct(e.read_wait),
                pct(e.write_wait),
                pct(e.copy_wait),
                pct(e.staging_wait),
                e.job_us,
                e.chunks
            ));
            if e.gate_to_release_us > 0.0 {
                out.push_str(&format!(
                    "    prefetched reads, from the opened gate: copy enqueued {:.1} us, release enqueued {:.1} us\n",
                    e.gate_to_copy_us, e.gate_to_release_us
                ));
            }
        }
        if let Some(r) = &self.round_trip {
            out.push_str(&format!(
                "    async round trip per op and stream: arm to release enqueued {:.1} us (host), release to next arm {:.1} us (device + poller; the poller's looks {:.1} us apart where it found the doorbell, and {:.1} us from that look to the arm)\n",
                r.arm_to_release_us, r.release_to_arm_us, r.arm_look_gap_us, r.arm_behind_look_us
            ));
        }
        out
    }
}

/// Runs `work` while `count` more threads of this process sit idle (as the bench's
/// executors, stream workers and device threads do): each one the profile reads.
#[cfg(test)]
pub(crate) fn with_idle_threads<T>(count: usize, work: impl FnOnce() -> T) -> T {
    let (done, idle) = std::sync::mpsc::channel::<()>();
    let idle = std::sync::Mutex::new(idle);
    std::thread::scope(|scope| {
        for _ in 0..count {
            // Each waits its turn for the channel, whose end is the wake.
            scope.spawn(|| idle.lock().unwrap().recv().unwrap_err());
        }
        let result = work();
        drop(done);
        result
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_names_group_by_their_digits() {
        assert_eq!(group_of("hipfile-io-12"), "hipfile-io-N");
        assert_eq!(group_of("hipfile-io-3-blocking"), "hipfile-io-N-blocking");
        assert_eq!(group_of("iou-wrk-40211"), "iou-wrk-N");
        assert_eq!(group_of("hipfile-arm"), "hipfile-arm");
    }

    #[test]
    fn stat_lines_give_utime_plus_stime() {
        // pid (comm with a space) state ppid ... utime=7 stime=5 (fields 14, 15).
        let line = "42 (a b) S 1 2 3 4 5 6 7 8 9 10 7 5 0 0 20 0 1 0";
        assert_eq!(stat_ticks(line), Some((7, 5)));
    }

    /// Reading `/proc` for every thread is not the window's CPU: two readings one after
    /// the other, with a hundred idle threads to read, find next to nothing of the reader's
    /// between them (the reading itself was once most of a short row's CPU).
    #[test]
    fn the_readings_own_cost_is_left_out() {
        let (before, after) = with_idle_threads(100, || (ThreadCpu::now(), ThreadCpu::now()));
        assert!(after.threads.len() > 100, "every thread read");
        // The reader's own time: other tests run beside this one.
        let reader = after.threads.keys().find(|(tid, _)| *tid == after.reader).unwrap();
        let between = after.thread_delta_ns(reader, &before);
        assert!(
            between < after.reading_ns / 4,
            "{between} ns of the reader between two readings that cost {} ns each",
            after.reading_ns
        );
    }

    #[test]
    fn busy_threads_show_in_their_group() {
        let before = ThreadCpu::now();
        let worker = std::thread::Builder::new()
            .name("spin-7".into())
            .spawn(move || {
                // Spins until this thread has had 60 ms on a CPU by its own schedstat (a
                // wall-clock spin gets less where other tests or processes share the cores),
                // at most 10 s.
                let own_ns = || {
                    std::fs::read_to_string("/proc/thread-self/schedstat")
                        .ok()
                        .and_then(|line| line.split_whitespace().next()?.parse::<u64>().ok())
                };
                let started = std::time::Instant::now();
                let mut x = 0u64;
                while own_ns().is_some_and(|ns| ns < 60_000_000)
                    && started.elapsed() < std::time::Duration::from_secs(10)
                {
                    for _ in 0..10_000 {
                        x = x.wrapping_mul(31).wrapping_add(1);
                    }
                }
                std::hint::black_box(x);
                ThreadCpu::now()
            })
            .expect("spawn");
        let during = worker.join().expect("worker");
        let groups = during.since(&before);
        let (spin_ns, _) = groups.get("spin-N").copied().unwrap_or((0, 0));
        // Counted under its own group while alive (not among the ended threads, whose
        // share other tests running in parallel make unpredictable).
        assert!(spin_ns >= 20_000_000, "the spinning thread's CPU: {groups:?}");
    }

    /// Burns a fixed amount of CPU work (`rounds` million steps of a dependent chain).
    fn work(rounds: u64) {
        let mut x = 1u64;
        for _ in 0..rounds * 1_000_000 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(1));
        }
        std::hint::black_box(x);
    }

    #[test]
    fn only_the_timed_windows_count() {
        record_timed_windows();
        take_timed();
        // One thread, alive throughout: four parts of work outside any window and one
        // inside (the window opens and closes on this thread, as a bench run's do).
        let worker = std::thread::Builder::new()
            .name("windowed-9".into())
            .spawn(|| {
                work(40);
                let timer = crate::bench::Timer::start();
                work(20);
                timer.stop();
                // A second stop does not count the window again.
                work(40);
                timer.stop();
                let own = ThreadCpu::now();
                own.threads.iter().find(|((_, group), _)| group == "windowed-N").map(|(_, v)| v.0)
            })
            .expect("spawn");
        let total_ns = worker.join().expect("worker").expect("the thread sees itself");
        let (timed_ns, _) = take_timed().get("windowed-N").copied().unwrap_or((0, 0));
        // About a fifth of the thread's CPU, whatever the machine's speed or load.
        assert!(
            timed_ns > 0 && timed_ns * 2 < total_ns,
            "timed {timed_ns} ns of the thread's {total_ns} ns"
        );
    }
}
