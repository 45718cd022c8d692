//! A sampling profile of the process's CPU time where there is no perf (the GPU machines):
//! with `HIPFILE_BENCH_CPU_SAMPLES=PATH`, every [`SAMPLE_EVERY_US`] of CPU time the process
//! spends (all threads, user and system: `ITIMER_PROF`) the thread that spent it records
//! its return addresses; at the end the distinct stacks, each with its count, are written
//! to `PATH` with the process's executable mappings and its threads' names, for
//! `benches/scripts/cpu-samples.py` to resolve against a copy of the same binary (`nm`)
//! and count by thread kind and function. A sample taken inside a system call shows the
//! call's wrapper innermost: that is kernel time.
//!
//! A diagnostic, opt-in: glibc's `backtrace` in a signal handler walks the loader's list
//! of objects, so a thread interrupted while it holds the loader's lock (loading a library,
//! or unwinding a panic) could wait on itself; the bench neither loads libraries nor
//! panics while it measures.

use std::collections::HashMap;
use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// CPU time between two samples (of the whole process).
const SAMPLE_EVERY_US: i64 = 10_000;
/// The most samples kept (later ones are counted, not kept).
const MAX_SAMPLES: usize = 100_000;
/// Return addresses kept per sample, innermost first.
const MAX_FRAMES: usize = 24;

/// One sample: the thread and its return addresses.
#[derive(Clone, Copy)]
struct Sample {
    tid: libc::pid_t,
    depth: usize,
    frames: [usize; MAX_FRAMES],
}

const EMPTY: Sample = Sample { tid: 0, depth: 0, frames: [0; MAX_FRAMES] };

/// The sample buffer ([`MAX_SAMPLES`] entries, leaked when sampling starts).
static SAMPLES: AtomicPtr<Sample> = AtomicPtr::new(std::ptr::null_mut());
/// Samples claimed so far (may pass [`MAX_SAMPLES`]: those are dropped).
static NEXT: AtomicUsize = AtomicUsize::new(0);
/// Whether the handler records (cleared before the buffer is read).
static RECORDING: AtomicBool = AtomicBool::new(false);

/// The SIGPROF handler: claims a slot and writes the thread's return addresses into it.
/// glibc's `backtrace` was called once before the timer started, so it does not load its
/// unwinder here; it does not allocate after that.
extern "C" fn take_sample(_signal: libc::c_int) {
    if !RECORDING.load(Ordering::Acquire) {
        return;
    }
    let index = NEXT.fetch_add(1, Ordering::AcqRel);
    let buffer = SAMPLES.load(Ordering::Acquire);
    if buffer.is_null() || index >= MAX_SAMPLES {
        return;
    }
    // SAFETY: `index` < MAX_SAMPLES, the buffer's length, and was claimed by this call
    // alone (fetch_add), so no other writer touches this entry; readers wait until
    // RECORDING is cleared and the timer stopped.
    let sample = unsafe { &mut *buffer.add(index) };
    // SAFETY: `frames` holds MAX_FRAMES pointer-sized entries (usize and a pointer share
    // size and alignment); backtrace writes at most that many. gettid is a plain system
    // call.
    let depth = unsafe {
        sample.tid = libc::gettid();
        libc::backtrace(sample.frames.as_mut_ptr().cast(), MAX_FRAMES as libc::c_int)
    };
    sample.depth = depth.max(0) as usize;
}

/// Sampling in progress: the threads' names, read every 200 ms by a thread of its own
/// (threads that end before the report keep the name last seen).
pub struct CpuSamples {
    path: std::path::PathBuf,
    names: Arc<Mutex<HashMap<libc::pid_t, String>>>,
    stop_names: Arc<AtomicBool>,
    namer: Option<std::thread::JoinHandle<()>>,
}

/// Starts sampling when `HIPFILE_BENCH_CPU_SAMPLES` names a file.
pub fn start_from_env() -> Option<CpuSamples> {
    let path = std::env::var_os("HIPFILE_BENCH_CPU_SAMPLES")?;
    match start(path.into()) {
        Ok(samples) => Some(samples),
        Err(error) => {
            eprintln!("hipfile-bench: CPU sampling not started: {error}");
            None
        }
    }
}

fn start(path: std::path::PathBuf) -> io::Result<CpuSamples> {
    let buffer: &'static mut [Sample] = vec![EMPTY; MAX_SAMPLES].leak();
    SAMPLES.store(buffer.as_mut_ptr(), Ordering::Release);
    // Load glibc's unwinder now, outside any signal handler.
    let mut warm = [std::ptr::null_mut::<libc::c_void>(); 4];
    // SAFETY: `warm` holds 4 writable pointers.
    unsafe { libc::backtrace(warm.as_mut_ptr(), 4) };
    let handler = take_sample as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: the handler writes only the entry it claimed (the module doc has the one
    // caveat: the loader's lock).
    unsafe { crate::sys::install_handler(&[libc::SIGPROF], handler, libc::SA_RESTART)? };
    RECORDING.store(true, Ordering::Release);
    set_timer(SAMPLE_EVERY_US)?;
    let names = Arc::new(Mutex::new(HashMap::new()));
    let stop_names = Arc::new(AtomicBool::new(false));
    let namer = {
        let (names, stop) = (Arc::clone(&names), Arc::clone(&stop_names));
        std::thread::Builder::new().name("hf-sample-names".into()).spawn(move || {
            while !stop.load(Ordering::Acquire) {
                read_thread_names(&names);
                std::thread::sleep(Duration::from_millis(200));
            }
        })?
    };
    Ok(CpuSamples { path, names, stop_names, namer: Some(namer) })
}

/// `ITIMER_PROF` every `every_us` of process CPU time (0 stops it).
fn set_timer(every_us: i64) -> io::Result<()> {
    let interval = libc::timeval { tv_sec: 0, tv_usec: every_us as libc::suseconds_t };
    let timer = libc::itimerval { it_interval: interval, it_value: interval };
    // SAFETY: a valid itimerval; the old value is not asked for (NULL).
    if unsafe { libc::setitimer(libc::ITIMER_PROF, &timer, std::ptr::null_mut()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Adds the name of every thread alive now to `names`.
fn read_thread_names(names: &Mutex<HashMap<libc::pid_t, String>>) {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return };
    let mut names = names.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    for task in tasks.flatten() {
        let Some(tid) = task.file_name().to_str().and_then(|tid| tid.parse().ok()) else {
            continue;
        };
        if let Ok(name) = std::fs::read_to_string(task.path().join("comm")) {
            names.insert(tid, name.trim().to_string());
        }
    }
}

impl CpuSamples {
    /// Stops sampling and writes the report; says where on stderr.
    pub fn finish(mut self) {
        let _ = set_timer(0);
        RECORDING.store(false, Ordering::Release);
        // A handler that passed the RECORDING check just before may still be writing.
        std::thread::sleep(Duration::from_millis(50));
        self.stop_names.store(true, Ordering::Release);
        if let Some(namer) = self.namer.take() {
            let _ = namer.join();
        }
        read_thread_names(&self.names);
        match self.write() {
            Ok(kept) => eprintln!(
                "hipfile-bench: {kept} CPU samples (one per {} ms of CPU time, {} taken) in {}",
                SAMPLE_EVERY_US / 1000,
                NEXT.load(Ordering::Acquire),
                self.path.display()
            ),
            Err(error) => eprintln!(
                "hipfile-bench: CPU samples not written to {}: {error}",
                self.path.display()
            ),
        }
    }

    fn write(&self) -> io::Result<usize> {
        let kept = NEXT.load(Ordering::Acquire).min(MAX_SAMPLES);
        let buffer = SAMPLES.load(Ordering::Acquire);
        let mut out = io::BufWriter::new(std::fs::File::create(&self.path)?);
        writeln!(
            out,
            "# hipfile-bench CPU samples, one per {SAMPLE_EVERY_US} us of process CPU time"
        )?;
        for line in std::fs::read_to_string("/proc/self/maps")?.lines() {
            // Executable mappings, and the first mapping of each file (its load base).
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() >= 6 && (fields[1].contains('x') || fields[2] == "00000000") {
                writeln!(out, "map {} {} {} {}", fields[0], fields[1], fields[2], fields[5])?;
            }
        }
        let names = self.names.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        for (tid, name) in names.iter() {
            writeln!(out, "thread {tid} {name}")?;
        }
        // The same stack of the same thread, counted once.
        let mut stacks: HashMap<(libc::pid_t, Vec<usize>), usize> = HashMap::new();
        for index in 0..kept {
            // SAFETY: entries below `kept` were claimed and written before RECORDING was
            // cleared and the timer stopped (and the 50 ms grace above).
            let sample = unsafe { buffer.add(index).read() };
            let frames = sample.frames[..sample.depth.min(MAX_FRAMES)].to_vec();
            *stacks.entry((sample.tid, frames)).or_default() += 1;
        }
        // Frames in shared libraries named by their nearest exported symbol (dladdr; the
        // binary's own functions are not exported: the script names them with nm).
        let mut named: HashMap<usize, String> = HashMap::new();
        for (_, frames) in stacks.keys() {
            for &frame in frames {
                if let std::collections::hash_map::Entry::Vacant(entry) = named.entry(frame)
                    && let Some(symbol) = exported_symbol(frame)
                {
                    entry.insert(symbol);
                }
            }
        }
        for (frame, symbol) in &named {
            writeln!(out, "sym {frame:x} {symbol}")?;
        }
        for ((tid, frames), count) in stacks {
            write!(out, "stack {count} {tid}")?;
            for frame in frames {
                write!(out, " {frame:x}")?;
            }
            writeln!(out)?;
        }
        out.flush()?;
        Ok(kept)
    }
}

/// The exported symbol nearest below `address` in a shared library, as `name+0xoffset`.
fn exported_symbol(address: usize) -> Option<String> {
    // SAFETY: an all-zero Dl_info is a valid value of the plain C struct.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the loader's tables for `address` and fills `info`.
    if unsafe { libc::dladdr(address as *const libc::c_void, &mut info) } == 0
        || info.dli_sname.is_null()
    {
        return None;
    }
    // SAFETY: dladdr set dli_sname to a NUL-terminated string of the loader's, which lives
    // as long as the library stays loaded (it is, while we run).
    let name = unsafe { std::ffi::CStr::from_ptr(info.dli_sname) }.to_string_lossy();
    Some(format!("{name}+{:#x}", address - info.dli_saddr as usize))
}
