//! The benchmark's context: device, driver, test file, buffers, and the steps every run
//! shares (cache control, pattern fills, verification).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use hipfile_runtime::config::{Config, DeviceSelection, usable_cpus};
use hipfile_runtime::device::Device;
use hipfile_runtime::device::user::{UserDevice, backend_name};
use hipfile_runtime::driver::process::open_device;
use hipfile_runtime::file::{DirectPolicy, pread_full};
use hipfile_runtime::{Driver, HandleId};

use crate::cli::{DeviceArg, DirectArg};
use crate::error::{Context, Failure, Result, fail};
use crate::mem::{DeviceBuf, Pinned, download, memset, upload};
use crate::{pattern, sys};

/// Byte written over buffers before a read run, so that a read that did nothing fails.
pub const POISON: u8 = 0xA5;

/// Device, driver and configuration in effect.
pub struct Env {
    /// The device (application view).
    pub device: Arc<dyn UserDevice>,
    /// `cpu`, `cuda` or `rocm`.
    pub backend: &'static str,
    /// The driver, open, engine started.
    pub driver: Arc<Driver>,
    /// The driver's configuration.
    pub config: Config,
    /// O_DIRECT decision.
    pub direct: DirectChoice,
}

/// O_DIRECT: what was asked and what happens.
#[derive(Clone, Debug)]
pub struct DirectChoice {
    /// Whether O_DIRECT is used (the filesystem accepted it and the policy allows it).
    pub effective: bool,
    /// Why not, when asked for and refused.
    pub note: Option<String>,
}

impl DirectChoice {
    /// `O_DIRECT` or `page cache`, for reports.
    pub fn label(&self) -> &'static str {
        if self.effective { "O_DIRECT" } else { "page cache" }
    }
}

/// Opens the device and the driver as the options and `HIPFILE_*` say.
pub fn open_env(
    device: Option<DeviceArg>,
    threads: Option<u32>,
    direct: Option<DirectArg>,
    dir: &Path,
) -> Result<Env> {
    let mut config = Config::from_env().ctx("invalid HIPFILE_* environment")?;
    config.device = match device {
        Some(DeviceArg::Auto) => DeviceSelection::Auto,
        Some(DeviceArg::Cpu) => DeviceSelection::Cpu,
        Some(DeviceArg::Cuda) => DeviceSelection::Cuda,
        None => config.device,
    };
    if let Some(threads) = threads {
        config.executor_cpus = usable_cpus().into_iter().cycle().take(threads as usize).collect();
        config.request_parallelism = threads as usize;
    }
    config.direct = direct_policy(direct, config.direct);
    config.validate().ctx("invalid configuration")?;
    let device = open_device(config.device, config.cpu_device_count).map_err(|reason| {
        Failure(format!(
            "device {} unavailable: {reason}",
            format!("{:?}", config.device).to_lowercase()
        ))
    })?;
    let backend = backend_name(&*device);
    let driver = Driver::new(config.clone(), Arc::clone(&device) as Arc<dyn Device>);
    driver.open();
    if driver.engine().is_err() {
        return fail(
            "the hipfile-rs engine did not start (reason above); see `hipfile-bench check`",
        );
    }
    let direct = decide_direct(config.direct, dir);
    // What the driver runs with (`Auto` settings resolved for the device).
    let config = Config::clone(&driver.config());
    Ok(Env { device, backend, driver, config, direct })
}

/// `--direct`, else `HIPFILE_ODIRECT` when set, else off (page-cache numbers, the ones
/// anchors.md compares).
fn direct_policy(arg: Option<DirectArg>, from_env: DirectPolicy) -> DirectPolicy {
    let env_set = std::env::var("HIPFILE_ODIRECT").is_ok_and(|v| !v.trim().is_empty());
    match arg {
        Some(DirectArg::Auto) => DirectPolicy::Auto,
        Some(DirectArg::On) => DirectPolicy::On,
        Some(DirectArg::Off) => DirectPolicy::Off,
        None if env_set => from_env,
        None => DirectPolicy::Off,
    }
}

fn decide_direct(policy: DirectPolicy, dir: &Path) -> DirectChoice {
    if policy == DirectPolicy::Off {
        return DirectChoice { effective: false, note: None };
    }
    match sys::probe_direct(dir) {
        Ok(()) => DirectChoice { effective: true, note: None },
        Err(error) => DirectChoice {
            effective: false,
            note: Some(format!(
                "O_DIRECT refused on {} ({}): {error}; page cache used",
                dir.display(),
                sys::fs_type(dir)
            )),
        },
    }
}

/// The test file: a known pattern, removed on drop unless the user named it.
pub struct TestFile {
    /// Where it is.
    pub path: PathBuf,
    /// Read-write descriptor used by the driver, cuFile and the baselines (`O_DIRECT`
    /// when in effect).
    pub io: File,
    /// Buffered read-write descriptor for creating and checking the file.
    pub plain: File,
    /// Size in bytes.
    pub size: u64,
    /// Seed of the pattern the file holds now.
    pub seed: u64,
    keep: bool,
}

impl Drop for TestFile {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The default test file path in the temp directory.
pub fn default_file_path() -> PathBuf {
    std::env::temp_dir().join(format!("hipfile-bench-{}.dat", std::process::id()))
}

impl TestFile {
    /// Creates (overwrites) the file at `path` with the pattern for `seed`, written
    /// through `scratch` in pieces of its length; removed on drop unless `keep`.
    pub fn create(
        path: &Path,
        size: u64,
        direct: bool,
        keep: bool,
        scratch: &mut [u8],
        seed: u64,
    ) -> Result<TestFile> {
        let plain = sys::open_rw(path, false, true).ctx(format!("creating {}", path.display()))?;
        let remove = |e: Failure| {
            if !keep {
                let _ = std::fs::remove_file(path);
            }
            e
        };
        plain.set_len(0).ctx("truncating the test file").map_err(remove)?;
        write_pattern(&plain, 0, size, seed, scratch)
            .ctx(format!("writing {}", path.display()))
            .map_err(remove)?;
        sys::fdatasync(&plain).ctx("fdatasync of the test file").map_err(remove)?;
        let io = sys::open_rw(path, direct, false)
            .ctx(format!("opening {}", path.display()))
            .map_err(remove)?;
        Ok(TestFile { path: path.to_owned(), io, plain, size, seed, keep })
    }

    /// Opens a file that another process made with [`TestFile::create`] and that holds
    /// the pattern for `seed`; kept on drop.
    pub fn open_existing(path: &Path, size: u64, direct: bool, seed: u64) -> Result<TestFile> {
        let open = |direct| sys::open_rw(path, direct, false);
        let plain = open(false).ctx(format!("opening {}", path.display()))?;
        let len = plain.metadata().ctx(format!("stat {}", path.display()))?.len();
        if len < size {
            return fail(format!("{} is {len} bytes, expected {size}", path.display()));
        }
        let io = open(direct).ctx(format!("opening {}", path.display()))?;
        Ok(TestFile { path: path.to_owned(), io, plain, size, seed, keep: true })
    }
}

/// Writes the file bytes `[offset, offset + len)` of the pattern for `seed` to `file`,
/// through `scratch` (filled here) in pieces of its length.
pub fn write_pattern(
    file: &File,
    offset: u64,
    len: u64,
    seed: u64,
    scratch: &mut [u8],
) -> std::io::Result<()> {
    let piece_max = scratch.len().max(1) as u64;
    let mut done = 0;
    while done < len {
        let piece = &mut scratch[..piece_max.min(len - done) as usize];
        pattern::fill(piece, offset + done, seed);
        hipfile_runtime::file::pwrite_full(file.as_raw_fd(), piece, offset + done)?;
        done += piece.len() as u64;
    }
    Ok(())
}

/// What the cold-cache option could do.
#[derive(Clone, Debug)]
pub struct ColdInfo {
    /// `Ok` when writing /proc/sys/vm/drop_caches was permitted (tried once at start).
    pub system_drop: std::result::Result<(), String>,
}

/// How a run went wrong.
#[derive(Clone, Debug)]
pub enum RunError {
    /// It completed but the data (or a byte count) is wrong.
    Wrong(String),
    /// It could not run to completion.
    Failed(String),
}

/// A failed step of a run.
pub fn failed(what: impl std::fmt::Display) -> impl FnOnce(Failure) -> RunError {
    move |e| RunError::Failed(format!("{what}: {e}"))
}

/// One measured repetition.
#[derive(Clone, Debug, Default)]
pub struct Sample {
    /// Wall time of the timed part.
    pub seconds: f64,
    /// Bytes moved.
    pub bytes: u64,
    /// Ops issued.
    pub ops: u64,
    /// Per-op latency in µs (empty when not measurable per op).
    pub latencies_us: Vec<f64>,
    /// Per-op duration of the submit call in µs (async paths only).
    pub submit_us: Vec<f64>,
    /// Process CPU seconds (user + system) spent in the timed part.
    pub cpu_seconds: f64,
}

/// Wall clock and process CPU time from a start point.
pub struct Timer {
    start: Instant,
    cpu: f64,
    /// The per-thread CPU of the window, under `--profile`.
    window: std::cell::Cell<Option<crate::profile::TimedWindow>>,
}

impl Timer {
    /// Starts both clocks.
    pub fn start() -> Timer {
        let window = std::cell::Cell::new(crate::profile::TimedWindow::start());
        Timer { cpu: sys::cpu_seconds(), start: Instant::now(), window }
    }

    /// `(wall seconds, CPU seconds)` since the start (the first stop ends the profile's
    /// window).
    pub fn stop(&self) -> (f64, f64) {
        let wall = self.start.elapsed().as_secs_f64();
        let cpu = sys::cpu_seconds() - self.cpu;
        if let Some(window) = self.window.take() {
            window.end();
        }
        (wall, cpu)
    }
}

/// Everything a run needs.
pub struct Bench {
    /// Device, driver, configuration.
    pub env: Env,
    /// The test file.
    pub file: TestFile,
    /// The file registered with the driver.
    pub handle: HandleId,
    /// The device buffer: the whole file (op at file offset X uses buffer offset X).
    pub dev: DeviceBuf,
    /// Pinned host memory of the file's size (baselines' target, fills, downloads).
    pub host: Pinned,
    /// Stream registration flags.
    pub flags: u32,
    /// Whether runs verify their data.
    pub verify: bool,
    /// `Some` with `--cold`.
    pub cold: Option<ColdInfo>,
    /// `--profile`: profile every case.
    pub profile: bool,
    next_seed: u64,
    cache_warm: bool,
}

impl Bench {
    /// Allocates the buffers, creates the file and registers it and the device buffer.
    pub fn new(
        env: Env,
        path: PathBuf,
        keep: bool,
        size: u64,
        flags: u32,
        verify: bool,
        cold: bool,
    ) -> Result<Bench> {
        let len = usize::try_from(size).ctx("file size")?;
        let mut host = Pinned::alloc(&env.device, len)?;
        let dev = DeviceBuf::alloc(&env.device, len)?;
        let file = TestFile::create(&path, size, env.direct.effective, keep, host.bytes_mut(), 1)?;
        let handle = env.driver.handle_register(file.io.as_raw_fd()).ctx("handle_register")?;
        env.driver.buf_register(dev.addr, size, 0).ctx("buf_register")?;
        let cold = cold.then(|| ColdInfo {
            system_drop: sys::drop_system_caches().map_err(|e| e.to_string()),
        });
        Ok(Bench {
            env,
            file,
            handle,
            dev,
            host,
            flags,
            verify,
            cold,
            profile: false,
            next_seed: 2,
            cache_warm: true,
        })
    }

    /// The device.
    pub fn device(&self) -> &Arc<dyn UserDevice> {
        &self.env.device
    }

    /// File size as `usize`.
    pub fn size(&self) -> usize {
        self.file.size as usize
    }

    /// A fresh pattern seed for a write run.
    pub fn new_seed(&mut self) -> u64 {
        self.next_seed += 1;
        self.next_seed
    }

    /// Before a read run: drop the cache (`--cold`) or make sure the file is cached.
    pub fn before_read(&mut self) -> std::result::Result<(), RunError> {
        if let Some(cold) = &self.cold {
            sys::drop_file_cache(&self.file.io)
                .map_err(|e| RunError::Failed(format!("fadvise: {e}")))?;
            if cold.system_drop.is_ok() {
                let _ = sys::drop_system_caches();
            }
            self.cache_warm = false;
        } else if !self.cache_warm && !self.env.direct.effective {
            let size = self.size();
            pread_full(self.file.plain.as_raw_fd(), &mut self.host.bytes_mut()[..size], 0)
                .map_err(|e| RunError::Failed(format!("warming the page cache: {e}")))?;
            self.cache_warm = true;
        }
        Ok(())
    }

    /// After a write run: flush, so that writeback does not spill into the next run.
    pub fn after_write(&mut self) {
        let _ = sys::fdatasync(&self.file.io);
        self.cache_warm = !self.env.direct.effective;
    }

    /// Overwrites the device buffer with [`POISON`].
    pub fn poison_device(&self) -> std::result::Result<(), RunError> {
        memset(self.device(), self.dev.addr, POISON, self.dev.len).map_err(failed("poison"))
    }

    /// Overwrites the host buffer with [`POISON`].
    pub fn poison_host(&mut self) {
        self.host.bytes_mut().fill(POISON);
    }

    /// Fills the host buffer with the pattern for `seed`.
    pub fn fill_host(&mut self, seed: u64) {
        let size = self.size();
        pattern::fill(&mut self.host.bytes_mut()[..size], 0, seed);
    }

    /// Fills the device buffer with the pattern for `seed` (through the host buffer).
    pub fn fill_device(&mut self, seed: u64) -> std::result::Result<(), RunError> {
        self.fill_host(seed);
        upload(&self.env.device, self.dev.addr, &self.host, self.size()).map_err(failed("upload"))
    }

    /// Checks the host buffer against the pattern for `seed`.
    pub fn check_host(&self, seed: u64, what: &str) -> std::result::Result<(), RunError> {
        if !self.verify {
            return Ok(());
        }
        pattern::verify(&self.host.bytes()[..self.size()], 0, seed)
            .map_err(|bad| RunError::Wrong(format!("{what}: byte at offset {bad} differs")))
    }

    /// Downloads the device buffer and checks it against the pattern for `seed`.
    pub fn check_device(&mut self, seed: u64) -> std::result::Result<(), RunError> {
        if !self.verify {
            return Ok(());
        }
        let size = self.size();
        download(&self.env.device, &mut self.host, self.dev.addr, size)
            .map_err(failed("download"))?;
        self.check_host(seed, "device buffer")
    }

    /// Reads the file back (buffered) and checks it against the pattern for `seed`; the
    /// file is then taken to hold that pattern. A wrong file is rewritten.
    pub fn check_file(&mut self, seed: u64) -> std::result::Result<(), RunError> {
        if !self.verify {
            self.file.seed = seed;
            return Ok(());
        }
        let size = self.size();
        let fd = self.file.plain.as_raw_fd();
        let read = pread_full(fd, &mut self.host.bytes_mut()[..size], 0)
            .map_err(|e| RunError::Failed(format!("reading the file back: {e}")))?;
        let result = if read != size {
            Err(RunError::Wrong(format!("file is {read} bytes, expected {size}")))
        } else {
            self.check_host(seed, "file")
        };
        match result {
            Ok(()) => self.file.seed = seed,
            Err(_) => self.rewrite_file()?,
        }
        result
    }

    /// Rewrites the whole file with a fresh pattern (after a wrong write).
    pub fn rewrite_file(&mut self) -> std::result::Result<(), RunError> {
        let seed = self.new_seed();
        self.fill_host(seed);
        let size = self.size();
        hipfile_runtime::file::pwrite_full(
            self.file.plain.as_raw_fd(),
            &self.host.bytes()[..size],
            0,
        )
        .map_err(|e| RunError::Failed(format!("rewriting the file: {e}")))?;
        let _ = sys::fdatasync(&self.file.plain);
        self.file.seed = seed;
        Ok(())
    }
}
