//! cuFile in compatibility mode as a baseline, loaded at run time with `dlopen` (no
//! build-time dependency), set up exactly as reference/anchors.md §3.4 says:
//! `CUFILE_ENV_PATH_JSON` (a compat-mode json) and `CUFILE_EXPERIMENTAL_FS=1` exported
//! before the library loads, CUDA initialised and the primary context current, then
//! `cuFileDriverOpen`, `cuFileHandleRegister` (OPAQUE_FD), `cuFileBufRegister` on the
//! whole device buffer, `cuFileStreamRegister(stream, 15)`, `cuFileReadAsync` with
//! per-op parameters in host memory that outlives the stream sync, then every byte
//! count and every byte checked.

use std::ffi::{CStr, CString, c_int, c_uint, c_void};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hipfile_runtime::AsyncParams;
use hipfile_runtime::device::StreamHandle;

use crate::bench::{Bench, RunError, Sample, failed};
use crate::mem::StreamSet;
use crate::workload::{
    Op, Target, check_counts, finish, make_params, prepare, run_async_with, threaded_sample,
    timed_threads,
};

/// Stream flags cuFile's streams are registered with (all four; anchors: 0 = 15).
pub const CUFILE_STREAM_FLAGS: c_uint = 15;

/// `CU_FILE_HANDLE_TYPE_OPAQUE_FD`.
const HANDLE_TYPE_OPAQUE_FD: c_int = 1;

/// The compat-mode configuration of anchors.md §3.4, step 2.
fn config_json(log_dir: &Path) -> String {
    format!(
        "{{\"logging\":{{\"dir\":\"{}\",\"level\":\"ERROR\"}},\
         \"properties\":{{\"allow_compat_mode\":true}},\
         \"execution\":{{\"parallel_io\":true,\"max_io_threads\":8,\"max_io_queue_depth\":128,\
         \"min_io_threshold_size_kb\":8192,\"max_request_parallelism\":4}}}}\n",
        log_dir.display()
    )
}

/// Writes the json and exports `CUFILE_ENV_PATH_JSON` and `CUFILE_EXPERIMENTAL_FS=1`
/// (unless the user set them). Must run before any thread starts; returns the json file
/// it wrote, to remove at exit.
pub fn prepare_environment() -> Option<PathBuf> {
    let mut written = None;
    if std::env::var_os("CUFILE_ENV_PATH_JSON").is_none() {
        let dir = std::env::temp_dir();
        let path = dir.join(format!("hipfile-bench-cufile-{}.json", std::process::id()));
        let log_dir = dir.join("cufile_logs");
        // cuFile refuses a configuration whose log directory does not exist.
        let _ = std::fs::create_dir_all(&log_dir);
        if std::fs::write(&path, config_json(&log_dir)).is_ok() {
            // SAFETY: called at the start of main, before the process has other threads
            // (nothing can read the environment concurrently).
            unsafe { std::env::set_var("CUFILE_ENV_PATH_JSON", &path) };
            written = Some(path);
        }
    }
    if std::env::var_os("CUFILE_EXPERIMENTAL_FS").is_none() {
        // SAFETY: as above.
        unsafe { std::env::set_var("CUFILE_EXPERIMENTAL_FS", "1") };
    }
    written
}

/// `CUfileError_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct CuFileError {
    err: c_int,
    cu_err: c_int,
}

impl CuFileError {
    fn check(self, what: &str) -> Result<(), String> {
        if self.err == 0 {
            Ok(())
        } else {
            Err(format!("{what} failed: cuFile error {} (CUresult {})", self.err, self.cu_err))
        }
    }
}

/// The `handle` union of `CUfileDescr_t`.
#[repr(C)]
union DescrHandle {
    fd: c_int,
    handle: *mut c_void,
}

/// `CUfileDescr_t`: `int type` at 0, the union at 8, `fs_ops` at 16.
#[repr(C)]
struct CuFileDescr {
    kind: c_int,
    handle: DescrHandle,
    fs_ops: *const c_void,
}

const _: () = assert!(size_of::<CuFileDescr>() == 24);

type AsyncFn = unsafe extern "C" fn(
    *mut c_void,
    *mut c_void,
    *mut usize,
    *mut i64,
    *mut i64,
    *mut isize,
    *mut c_void,
) -> CuFileError;

/// The entry points used.
struct Api {
    driver_open: unsafe extern "C" fn() -> CuFileError,
    driver_close: unsafe extern "C" fn() -> CuFileError,
    handle_register: unsafe extern "C" fn(*mut *mut c_void, *mut CuFileDescr) -> CuFileError,
    handle_deregister: unsafe extern "C" fn(*mut c_void),
    buf_register: unsafe extern "C" fn(*const c_void, usize, c_int) -> CuFileError,
    buf_deregister: unsafe extern "C" fn(*const c_void) -> CuFileError,
    read: unsafe extern "C" fn(*mut c_void, *mut c_void, usize, i64, i64) -> isize,
    write: unsafe extern "C" fn(*mut c_void, *const c_void, usize, i64, i64) -> isize,
    read_async: AsyncFn,
    write_async: AsyncFn,
    stream_register: unsafe extern "C" fn(*mut c_void, c_uint) -> CuFileError,
    stream_deregister: unsafe extern "C" fn(*mut c_void) -> CuFileError,
    get_version: Option<unsafe extern "C" fn(*mut c_int) -> CuFileError>,
    batch: Option<BatchApi>,
}

/// `CUfileIOParams_t` (the layout `hipFileIOParams_t` copies): 64 bytes.
#[repr(C)]
#[derive(Clone, Copy)]
struct CuFileIoParams {
    mode: c_int,
    dev_ptr_base: *mut c_void,
    file_offset: i64,
    dev_ptr_offset: i64,
    size: usize,
    fh: *mut c_void,
    opcode: c_int,
    cookie: *mut c_void,
}

/// `CUfileIOEvents_t`: 24 bytes.
#[repr(C)]
#[derive(Clone, Copy)]
struct CuFileIoEvents {
    cookie: *mut c_void,
    status: c_int,
    ret: usize,
}

const _: () = assert!(size_of::<CuFileIoParams>() == 64 && size_of::<CuFileIoEvents>() == 24);

/// `CUFILE_BATCH`, `CUFILE_READ`, `CUFILE_COMPLETE`.
const CUFILE_BATCH: c_int = 1;
const CUFILE_READ: c_int = 0;
const CUFILE_COMPLETE: c_int = 0x10;

/// cuFile's batch entry points.
struct BatchApi {
    setup: unsafe extern "C" fn(*mut *mut c_void, c_uint) -> CuFileError,
    submit: unsafe extern "C" fn(*mut c_void, c_uint, *mut CuFileIoParams, c_uint) -> CuFileError,
    status: unsafe extern "C" fn(
        *mut c_void,
        c_uint,
        *mut c_uint,
        *mut CuFileIoEvents,
        *mut libc::timespec,
    ) -> CuFileError,
    destroy: unsafe extern "C" fn(*mut c_void),
}

impl BatchApi {
    fn load(lib: *mut c_void) -> Result<BatchApi, String> {
        Ok(BatchApi {
            setup: symbol(lib, c"cuFileBatchIOSetUp")?,
            submit: symbol(lib, c"cuFileBatchIOSubmit")?,
            status: symbol(lib, c"cuFileBatchIOGetStatus")?,
            destroy: symbol(lib, c"cuFileBatchIODestroy")?,
        })
    }
}

/// `dlsym(lib, name)` as a function pointer of type `T`.
fn symbol<T: Copy>(lib: *mut c_void, name: &CStr) -> Result<T, String> {
    assert_eq!(size_of::<T>(), size_of::<*mut c_void>(), "symbol type must be a fn pointer");
    // SAFETY: `lib` is a live handle from dlopen and `name` NUL-terminated.
    let ptr = unsafe { libc::dlsym(lib, name.as_ptr()) };
    if ptr.is_null() {
        return Err(format!("symbol {} not found", name.to_string_lossy()));
    }
    // SAFETY: `T` is a function-pointer type of the same size as a data pointer (checked
    // above) whose signature matches cufile.h for this symbol (the callers' types).
    Ok(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&ptr) })
}

impl Api {
    fn load(lib: *mut c_void) -> Result<Api, String> {
        let close =
            symbol(lib, c"cuFileDriverClose_v2").or_else(|_| symbol(lib, c"cuFileDriverClose"))?;
        Ok(Api {
            driver_open: symbol(lib, c"cuFileDriverOpen")?,
            driver_close: close,
            handle_register: symbol(lib, c"cuFileHandleRegister")?,
            handle_deregister: symbol(lib, c"cuFileHandleDeregister")?,
            buf_register: symbol(lib, c"cuFileBufRegister")?,
            buf_deregister: symbol(lib, c"cuFileBufDeregister")?,
            read: symbol(lib, c"cuFileRead")?,
            write: symbol(lib, c"cuFileWrite")?,
            read_async: symbol(lib, c"cuFileReadAsync")?,
            write_async: symbol(lib, c"cuFileWriteAsync")?,
            stream_register: symbol(lib, c"cuFileStreamRegister")?,
            stream_deregister: symbol(lib, c"cuFileStreamDeregister")?,
            get_version: symbol(lib, c"cuFileGetVersion").ok(),
            batch: BatchApi::load(lib).ok(),
        })
    }
}

/// Directories where pip's `nvidia-cufile*` wheels and CUDA toolkits put libcufile.
fn search_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    let mut bases: Vec<PathBuf> =
        ["/usr/local/lib", "/usr/lib", "/opt/conda/lib"].map(PathBuf::from).to_vec();
    for var in ["HOME", "VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(root) = std::env::var_os(var) {
            let root = PathBuf::from(root);
            bases.push(if var == "HOME" { root.join(".local/lib") } else { root.join("lib") });
        }
    }
    // The lib folder beside every bin folder on PATH that holds a python3 (venvs).
    let path = std::env::var_os("PATH").unwrap_or_default();
    for bin in std::env::split_paths(&path).filter(|bin| bin.join("python3").exists()) {
        if let Some(prefix) = bin.parent() {
            bases.push(prefix.join("lib"));
        }
    }
    bases.dedup();
    let mut sites = vec![PathBuf::from("/usr/lib/python3/dist-packages")];
    for base in bases {
        for python in children(&base).into_iter().filter(|p| name_starts(p, "python3")) {
            sites.push(python.join("site-packages"));
            sites.push(python.join("dist-packages"));
        }
    }
    for site in sites {
        dirs.extend(children(&site.join("nvidia")).into_iter().map(|p| p.join("lib")));
    }
    for cuda in children(Path::new("/usr/local")).into_iter().filter(|p| name_starts(p, "cuda")) {
        dirs.push(cuda.join("lib64"));
        dirs.push(cuda.join("targets/x86_64-linux/lib"));
    }
    dirs.push(PathBuf::from("/usr/lib/x86_64-linux-gnu"));
    dirs
}

fn children(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    paths.sort();
    paths
}

fn name_starts(path: &Path, prefix: &str) -> bool {
    path.file_name().is_some_and(|n| n.to_string_lossy().starts_with(prefix))
}

/// Library files to try: the explicit one, else the loader's search by name, then the
/// search directories.
fn candidates(explicit: Option<&Path>) -> Vec<PathBuf> {
    if let Some(path) = explicit {
        return vec![path.to_owned()];
    }
    let mut list = vec![PathBuf::from("libcufile.so.0"), PathBuf::from("libcufile.so")];
    for dir in search_dirs() {
        list.extend(children(&dir).into_iter().filter(|p| name_starts(p, "libcufile.so")));
    }
    list
}

fn dlerror() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl call.
    let message = unsafe { libc::dlerror() };
    if message.is_null() {
        return "unknown dlopen error".into();
    }
    // SAFETY: non-NULL, NUL-terminated (see above); copied at once.
    unsafe { CStr::from_ptr(message) }.to_string_lossy().into_owned()
}

/// Loads libcufile (without opening the driver): the handle and the file it came from.
pub fn load_library(explicit: Option<&Path>) -> Result<(*mut c_void, PathBuf), String> {
    let mut first_error = None;
    for path in candidates(explicit) {
        let Ok(c_path) = CString::new(path.as_os_str().as_encoded_bytes()) else { continue };
        // SAFETY: a NUL-terminated path; loading runs the library's initialisers, which is
        // what using cuFile means.
        let lib = unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if !lib.is_null() {
            return Ok((lib, path));
        }
        first_error.get_or_insert_with(|| format!("{}: {}", path.display(), dlerror()));
    }
    Err(first_error.unwrap_or_else(|| "no libcufile found".into())
        + " (also searched pip nvidia-* and CUDA dirs)")
}

/// An open cuFile driver with one registered file and buffer.
pub struct CuFile {
    api: Api,
    /// The library file.
    pub path: PathBuf,
    /// `cuFileGetVersion`, when available.
    pub version: Option<i32>,
    handle: usize,
    buffers: Vec<u64>,
    batch_hung: std::sync::atomic::AtomicBool,
}

impl CuFile {
    /// Loads the library and opens the driver (the caller's thread has a current CUDA
    /// context: the device was used on it).
    pub fn open(explicit: Option<&Path>) -> Result<CuFile, String> {
        let (lib, path) = load_library(explicit)?;
        let api = Api::load(lib)?;
        // SAFETY: cuFileDriverOpen takes no arguments; CUDA is initialised.
        unsafe { (api.driver_open)() }.check("cuFileDriverOpen")?;
        let version = api.get_version.and_then(|get| {
            let mut version: c_int = 0;
            // SAFETY: a valid out-pointer.
            unsafe { get(&mut version) }.check("cuFileGetVersion").ok().map(|()| version)
        });
        let batch_hung = std::sync::atomic::AtomicBool::new(false);
        Ok(CuFile { api, path, version, handle: 0, buffers: Vec::new(), batch_hung })
    }

    /// `cuFileHandleRegister` for `fd` (OPAQUE_FD, no fs_ops).
    pub fn register_file(&mut self, fd: c_int) -> Result<(), String> {
        let mut handle = DescrHandle { handle: std::ptr::null_mut() };
        handle.fd = fd;
        let mut descr =
            CuFileDescr { kind: HANDLE_TYPE_OPAQUE_FD, handle, fs_ops: std::ptr::null() };
        let mut fh: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out-pointer and descriptor, both live for the call.
        unsafe { (self.api.handle_register)(&mut fh, &mut descr) }.check("cuFileHandleRegister")?;
        self.handle = fh as usize;
        Ok(())
    }

    /// `cuFileBufRegister(addr, len, 0)`.
    pub fn register_buffer(&mut self, addr: u64, len: usize) -> Result<(), String> {
        // SAFETY: `addr..addr+len` is a live device allocation of the caller, deregistered
        // in drop before the caller frees it (the CuFile is dropped first).
        unsafe { (self.api.buf_register)(addr as *const c_void, len, 0) }
            .check("cuFileBufRegister")?;
        self.buffers.push(addr);
        Ok(())
    }

    /// `cuFileStreamRegister(stream, flags)`.
    pub fn stream_register(&self, stream: StreamHandle, flags: c_uint) -> Result<(), String> {
        // SAFETY: a live CUDA stream (our StreamHandle is the CUstream value).
        unsafe { (self.api.stream_register)(stream.0 as *mut c_void, flags) }
            .check("cuFileStreamRegister")
    }

    /// `cuFileStreamDeregister(stream)`.
    pub fn stream_deregister(&self, stream: StreamHandle) {
        // SAFETY: a live stream registered with `stream_register`, synchronized.
        let _ = unsafe { (self.api.stream_deregister)(stream.0 as *mut c_void) };
    }

    /// `cuFileRead` / `cuFileWrite`: `len` bytes at `offset`, buffer offset = `offset`.
    pub fn io_sync(
        &self,
        read: bool,
        addr: u64,
        len: usize,
        offset: u64,
        buf_offset: u64,
    ) -> isize {
        let (file_off, buf_off) = (offset as i64, buf_offset as i64);
        let fh = self.handle as *mut c_void;
        // SAFETY: a registered handle and a registered device buffer covering
        // `buf_offset..buf_offset+len` (the callers' plans stay inside it).
        unsafe {
            if read {
                (self.api.read)(fh, addr as *mut c_void, len, file_off, buf_off)
            } else {
                (self.api.write)(fh, addr as *const c_void, len, file_off, buf_off)
            }
        }
    }

    /// `cuFileReadAsync` / `cuFileWriteAsync` with the parameters in `params`.
    pub fn submit(
        &self,
        read: bool,
        addr: u64,
        params: &Arc<AsyncParams>,
        stream: StreamHandle,
    ) -> Result<(), String> {
        let f = if read { self.api.read_async } else { self.api.write_async };
        // SAFETY: the parameter words live in `params`, which the caller keeps until the
        // stream is synchronized; the buffer is registered and covers the op's range; the
        // stream is registered with cuFile.
        unsafe {
            f(
                self.handle as *mut c_void,
                addr as *mut c_void,
                params.size_bytes.as_ptr(),
                params.file_offset_bytes.as_ptr(),
                params.buffer_offset_bytes.as_ptr(),
                params.bytes_done.as_ptr(),
                stream.0 as *mut c_void,
            )
        }
        .check(if read { "cuFileReadAsync" } else { "cuFileWriteAsync" })
    }
}

impl CuFile {
    fn batch_api(&self) -> Result<&BatchApi, String> {
        self.api.batch.as_ref().ok_or_else(|| "libcufile has no batch API".to_string())
    }

    /// `cuFileBatchIOSetUp(max_nr)`: the batch handle.
    pub fn batch_setup(&self, max_nr: u32) -> Result<usize, String> {
        let api = self.batch_api()?;
        let mut handle: *mut c_void = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        unsafe { (api.setup)(&mut handle, max_nr) }.check("cuFileBatchIOSetUp")?;
        Ok(handle as usize)
    }

    /// Reads `io_size` bytes at each of `offsets` (buffer offset = file offset) as one
    /// batch submission, and waits for every entry.
    pub fn batch_read(
        &self,
        batch: usize,
        addr: u64,
        io_size: usize,
        offsets: &[u64],
    ) -> Result<(), String> {
        let api = self.batch_api()?;
        let mut params: Vec<CuFileIoParams> = offsets
            .iter()
            .enumerate()
            .map(|(i, &off)| CuFileIoParams {
                mode: CUFILE_BATCH,
                dev_ptr_base: addr as *mut c_void,
                file_offset: off as i64,
                dev_ptr_offset: off as i64,
                size: io_size,
                fh: self.handle as *mut c_void,
                opcode: CUFILE_READ,
                cookie: i as *mut c_void,
            })
            .collect();
        let nr = params.len() as c_uint;
        // SAFETY: `nr` valid entries; the buffer is registered and covers every range.
        unsafe { (api.submit)(batch as *mut c_void, nr, params.as_mut_ptr(), 0) }
            .check("cuFileBatchIOSubmit")?;
        let blank = CuFileIoEvents { cookie: std::ptr::null_mut(), status: 0, ret: 0 };
        let mut events = vec![blank; params.len()];
        let (mut done, started) = (0usize, std::time::Instant::now());
        while done < params.len() {
            // Polled (min_nr 0, zero timeout): cuFile 1.15 in compat mode was seen to
            // block in GetStatus past its timeout with a batch that never completed
            // (128 x 64 KiB reads on the H200); polling keeps our own deadline.
            let mut got = (params.len() - done) as c_uint;
            let mut timeout = libc::timespec { tv_sec: 0, tv_nsec: 0 };
            // SAFETY: `events` has room for `got` events; valid pointers.
            unsafe {
                (api.status)(batch as *mut c_void, 0, &mut got, events.as_mut_ptr(), &mut timeout)
            }
            .check("cuFileBatchIOGetStatus")?;
            for event in &events[..got as usize] {
                if event.status != CUFILE_COMPLETE || event.ret != io_size {
                    return Err(format!(
                        "cuFile batch entry: status {:#x}, ret {}",
                        event.status, event.ret as isize
                    ));
                }
            }
            done += got as usize;
            if got == 0 {
                if started.elapsed() > crate::batch_mode::CUFILE_BATCH_TIMEOUT {
                    self.batch_hung.store(true, std::sync::atomic::Ordering::SeqCst);
                    return Err(format!(
                        "HANG: cuFile batch completed {done} of {} entries in {} s",
                        params.len(),
                        crate::batch_mode::CUFILE_BATCH_TIMEOUT.as_secs()
                    ));
                }
                std::thread::sleep(std::time::Duration::from_micros(10));
            }
        }
        Ok(())
    }

    /// Whether a cuFile batch never completed (its entries may still be in flight:
    /// neither the batch nor the driver is torn down then).
    pub fn batch_hung(&self) -> bool {
        self.batch_hung.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// `cuFileBatchIODestroy` (skipped after a hung batch).
    pub fn batch_destroy(&self, batch: usize) {
        if self.batch_hung() {
            return;
        }
        if let Ok(api) = self.batch_api() {
            // SAFETY: a handle from `batch_setup`, destroyed once, nothing in flight.
            unsafe { (api.destroy)(batch as *mut c_void) };
        }
    }
}

impl Drop for CuFile {
    fn drop(&mut self) {
        if self.batch_hung() {
            // Entries of a hung batch may still target the buffer: leave cuFile as it is.
            return;
        }
        for &addr in &self.buffers {
            // SAFETY: registered in `register_buffer`, still allocated, no op in flight.
            let _ = unsafe { (self.api.buf_deregister)(addr as *const c_void) };
        }
        if self.handle != 0 {
            // SAFETY: the handle from `register_file`, deregistered once.
            unsafe { (self.api.handle_deregister)(self.handle as *mut c_void) };
        }
        // SAFETY: the driver was opened in `open`; closed once. The library stays loaded.
        let _ = unsafe { (self.api.driver_close)() };
    }
}

/// CUFILE_ASYNC: the same plan as ASYNC, through cuFile's stream API.
pub fn run_async(
    cf: &CuFile,
    b: &mut Bench,
    plan: &[Vec<Op>],
    read: bool,
) -> Result<Sample, RunError> {
    let seed = prepare(b, read, Target::Device)?;
    let streams = StreamSet::create(b.device(), plan.len()).map_err(failed("streams"))?;
    for &stream in &streams.handles {
        cf.stream_register(stream, CUFILE_STREAM_FLAGS).map_err(RunError::Failed)?;
    }
    let params = make_params(plan);
    let (addr, handles) = (b.dev.addr, streams.handles.clone());
    let result = run_async_with(plan, &params, &streams, |s, p| {
        cf.submit(read, addr, p, handles[s]).map_err(RunError::Failed)
    });
    let _ = streams.sync_all();
    for &stream in &streams.handles {
        cf.stream_deregister(stream);
    }
    drop(streams);
    let sample = result?;
    check_counts(plan, &params)?;
    finish(b, read, seed, Target::Device)?;
    Ok(sample)
}

/// CUFILE_SYNC: `cuFileRead` / `cuFileWrite` per op, one thread per region.
pub fn run_sync(
    cf: &CuFile,
    b: &mut Bench,
    plan: &[Vec<Op>],
    read: bool,
) -> Result<Sample, RunError> {
    let seed = prepare(b, read, Target::Device)?;
    let (addr, device) = (b.dev.addr, b.device());
    // A stream per thread makes the device's primary context current on it, as cuFile
    // requires of its callers.
    let setup = || StreamSet::create(device, 1).map_err(failed("stream"));
    let measured = timed_threads(plan, setup, |_, op| {
        let n = cf.io_sync(read, addr, op.len, op.offset, op.offset);
        match usize::try_from(n) {
            Ok(n) if n == op.len => Ok(()),
            Ok(n) => Err(RunError::Wrong(format!(
                "cuFile moved {n} of {} bytes at {}",
                op.len, op.offset
            ))),
            Err(_) => Err(RunError::Failed(format!("cuFile returned {n} at {}", op.offset))),
        }
    })?;
    finish(b, read, seed, Target::Device)?;
    Ok(threaded_sample(plan, measured))
}
