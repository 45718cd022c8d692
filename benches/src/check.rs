//! `hipfile-bench check`: what this machine supports, like gdscheck.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hipfile_runtime::Driver;
use hipfile_runtime::config::{Config, DeviceSelection, ENV_VARS};
use hipfile_runtime::device::Device;
use hipfile_runtime::device::user::{UserDevice, backend_name};
use hipfile_runtime::driver::process::open_device;

use crate::cli::{CheckArgs, DeviceArg};
use crate::cufile;
use crate::error::{Context, Result};
use crate::sys;

fn section(title: &str) {
    println!("\n ==== {title} ====");
}

fn item(label: &str, value: impl std::fmt::Display) {
    println!(" {label:<34} : {value}");
}

fn mib(bytes: usize) -> String {
    format!("{} MiB", bytes >> 20)
}

fn yes_no(result: std::result::Result<(), impl std::fmt::Display>) -> String {
    match result {
        Ok(()) => "yes".into(),
        Err(e) => format!("no ({e})"),
    }
}

/// Runs the check; errors only for an invalid `HIPFILE_*` environment.
pub fn run(args: &CheckArgs) -> Result<bool> {
    println!("hipfile-bench check {} (hipfile-rs platform check)", env!("CARGO_PKG_VERSION"));
    let config = Config::from_env().ctx("invalid HIPFILE_* environment")?;
    kernel();
    filesystem(args.file.as_deref());
    let device = devices(args.device, &config);
    limits(&config);
    engine(&config, device, args.file.as_deref());
    cufile_library(args.cufile.as_deref());
    environment();
    Ok(true)
}

fn kernel() {
    section("KERNEL");
    // SAFETY: an all-zero utsname is a valid value of the plain C struct.
    let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `uts` is a valid, writable utsname.
    if unsafe { libc::uname(&mut uts) } == 0 {
        // SAFETY: uname fills NUL-terminated strings.
        let release = unsafe { std::ffi::CStr::from_ptr(uts.release.as_ptr()) };
        item("kernel", release.to_string_lossy());
    }
    item("io_uring_setup (1 entry)", yes_no(sys::probe_io_uring()));
    item("usable CPUs", format!("{:?}", hipfile_runtime::config::usable_cpus()));
}

fn filesystem(file: Option<&Path>) {
    section("FILESYSTEM");
    let target = file.map_or_else(std::env::temp_dir, Path::to_path_buf);
    let dir: PathBuf = if target.is_dir() {
        target.clone()
    } else {
        target.parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf)
    };
    item("path", target.display());
    item("filesystem", sys::fs_type(&target));
    let (direct, probed) = sys::probe_dir(&dir);
    item("O_DIRECT open", yes_no(direct));
    let dio_of = if target.is_file() { sys::dio_alignment(&target) } else { probed };
    let dio = match dio_of {
        Ok(Some((mem, offset))) => format!("memory {mem} B, offset {offset} B"),
        Ok(None) => "not reported (kernel < 6.1, or no O_DIRECT on this filesystem)".into(),
        Err(e) => format!("statx failed: {e}"),
    };
    item("DIO alignment (statx DIOALIGN)", dio);
    item("drop_caches writable", yes_no(sys::can_drop_system_caches()));
}

fn devices(arg: Option<DeviceArg>, config: &Config) -> Option<Arc<dyn UserDevice>> {
    section("DEVICES");
    let selection = match arg {
        Some(DeviceArg::Auto) => DeviceSelection::Auto,
        Some(DeviceArg::Cpu) => DeviceSelection::Cpu,
        Some(DeviceArg::Cuda) => DeviceSelection::Cuda,
        None => config.device,
    };
    match open_device(DeviceSelection::Cuda, 1) {
        Ok(cuda) => {
            item("cuda backend", format!("{} device(s)", cuda.device_count()));
            // Streams held on a wait-value block the streams sharing their hardware queue.
            if let Some(setting) = cuda.hardware_queue_setting() {
                item("cuda hardware queues", setting);
            }
        }
        Err(reason) => item("cuda backend", format!("not available ({reason})")),
    }
    item("rocm backend", "not built (cargo feature `rocm`)");
    item(
        "cpu backend",
        format!("always available ({} device(s) configured)", config.cpu_device_count),
    );
    let device = match open_device(selection, config.cpu_device_count) {
        Ok(device) => device,
        Err(reason) => {
            item(&format!("selected ({selection:?})"), format!("unavailable: {reason}"));
            return None;
        }
    };
    item(&format!("selected ({selection:?})"), backend_name(&*device));
    for ordinal in 0..device.device_count() {
        let memops = if device.supports_stream_memops(ordinal) { "yes" } else { "NO" };
        item(&format!("device {ordinal} stream memory ops"), memops);
    }
    Some(device)
}

fn limits(config: &Config) {
    section("MEMORY LIMITS");
    let show = |v: Option<u64>| v.map_or("unlimited".into(), |b| format!("{} KiB", b >> 10));
    match sys::memlock_limit() {
        Ok((soft, hard)) => {
            item("RLIMIT_MEMLOCK soft / hard", format!("{} / {}", show(soft), show(hard)))
        }
        Err(e) => item("RLIMIT_MEMLOCK", format!("getrlimit failed: {e}")),
    }
    item("pinned staging cap (config)", mib(config.pinned_cap_bytes()));
    item(
        "  executors x staging",
        format!("{} x {}", config.executor_count(), mib(config.staging_per_executor_bytes)),
    );
    item("  fallback cap", mib(config.pinned_fallback_cap_bytes));
    if config.fallback_pool_bytes() != config.pinned_fallback_cap_bytes {
        // HIPFILE_CALLER_THREAD=busy/always: a chunk per executor on top.
        item("  fallback pool", mib(config.fallback_pool_bytes()));
    }
}

fn engine(config: &Config, device: Option<Arc<dyn UserDevice>>, file: Option<&Path>) {
    section("ENGINE");
    let Some(device) = device else {
        item("engine start", "skipped (no device)");
        return;
    };
    let driver = Driver::new(config.clone(), Arc::clone(&device) as Arc<dyn Device>);
    match driver.engine() {
        Ok(engine) => {
            item("engine start", format!("ok, {} executor(s)", engine.executor_count()));
            item("engine pinned cap", mib(engine.pinned_cap_bytes()));
        }
        Err(e) => item("engine start", format!("FAILED ({e}; reason above)")),
    }
    item("executor CPUs", format!("{:?}", config.executor_cpus));
    item("staging chunk", format!("{} KiB", config.staging_chunk_bytes >> 10));
    item("O_DIRECT policy", format!("{:?}", config.direct));
    let resolved = driver.config();
    item(
        "async copies on the user's stream",
        format!(
            "{:?} (HIPFILE_STREAM_COPIES {}), read slots over 64 KiB {:?}, {} MiB of device slots per device (reads past it: {:?}), {}",
            resolved.stream_copies,
            if config.stream_copies == hipfile_runtime::config::StreamCopies::Auto {
                "unset: the backend's choice"
            } else {
                "set"
            },
            resolved.stream_copy_slots,
            resolved.stream_copy_device_cap_bytes >> 20,
            resolved.stream_copy_device_full,
            idle_text(resolved.stream_copy_device_idle_ms)
        ),
    );
    io_path(&driver, &device, file);
}

/// When device slots give their memory back (`HIPFILE_STREAM_COPY_DEVICE_IDLE_MS`).
pub(crate) fn idle_text(idle_ms: u64) -> String {
    if idle_ms == 0 {
        "never given back (kept until the driver is dropped)".to_owned()
    } else {
        format!("given back after {idle_ms} ms unused")
    }
}

/// "Why this path" for a file in the checked directory and a device buffer.
fn io_path(driver: &Arc<Driver>, device: &Arc<dyn UserDevice>, file: Option<&Path>) {
    section("I/O PATH (why this path)");
    let dir = match file {
        Some(path) if path.is_dir() => path.to_path_buf(),
        Some(path) => path.parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf),
        None => std::env::temp_dir(),
    };
    let path = dir.join(format!(".hipfile-check-{}", std::process::id()));
    let explained = (|| -> std::result::Result<String, String> {
        std::fs::write(&path, vec![0u8; 1 << 20])
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let opened = std::fs::File::open(&path).map_err(|e| e.to_string());
        let _ = std::fs::remove_file(&path);
        let file = opened?;
        let handle = driver.handle_register(file.as_raw_fd()).map_err(|e| e.to_string())?;
        let buffer = device.alloc_device(0, 1 << 20).map_err(|e| e.to_string());
        let explanation = driver.explain_path(Some(handle), buffer.as_ref().ok().copied());
        driver.handle_deregister(handle);
        if let Ok(addr) = buffer {
            // SAFETY: allocated above, used by nothing else.
            let _ = unsafe { device.free_device(addr) };
        }
        explanation.map(|e| e.to_string()).map_err(|e| e.to_string())
    })();
    match explained {
        Ok(text) => {
            item("file checked", dir.display());
            for line in text.lines() {
                let (topic, why) = line.split_once(": ").unwrap_or((line, ""));
                item(topic, why);
            }
        }
        Err(reason) => item("explain", format!("not possible: {reason}")),
    }
}

fn cufile_library(explicit: Option<&Path>) {
    section("cuFILE (baseline)");
    match cufile::load_library(explicit) {
        Ok((_, path)) => item("libcufile", format!("loadable: {}", path.display())),
        Err(reason) => item("libcufile", format!("not available ({reason})")),
    }
}

fn environment() {
    section("CONFIGURATION (HIPFILE_* in effect)");
    for (name, description) in ENV_VARS {
        let value = std::env::var(name).unwrap_or_else(|_| "(unset)".into());
        println!(" {name:<28} = {value:<10} {description}");
    }
}
