//! Parameters and driver properties through the C exports, in a process of their own
//! (they change the process-wide driver): settings apply to the engine that starts
//! after them, and are refused (5026) once a file handle is registered or the engine
//! runs, without changing anything. Runs on the cpu device (skips elsewhere).

use core::ffi::c_void;
use std::os::fd::AsRawFd;

use hipfile::api::{
    hipFileDriverClose, hipFileDriverGetProperties, hipFileDriverOpen,
    hipFileDriverSetMaxDirectIOSize, hipFileGetParameterBool, hipFileGetParameterSizeT,
    hipFileHandleDeregister, hipFileHandleRegister, hipFileRead, hipFileSetParameterBool,
    hipFileSetParameterSizeT,
};
use hipfile::cpu_ext::hipfileCpuMalloc;
use hipfile::types::{DescrHandle, HipFileDescr, HipFileDriverProps, handle_type};

const QUEUE_DEPTH: i32 = 1;
const THREADS: i32 = 2;
const PARALLELISM: i32 = 4;
const MAX_DIRECT_IO_KB: i32 = 5;
const PREFER_IO_URING: i32 = 8;
const ALLOW_COMPAT_MODE: i32 = 1;

fn get_size(key: i32) -> usize {
    let mut value = usize::MAX;
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { hipFileGetParameterSizeT(key, &mut value) }.err, 0, "get {key}");
    value
}

fn register(file: &std::fs::File) -> *mut c_void {
    let descr = HipFileDescr {
        handle_type: handle_type::OPAQUE_FD,
        handle: DescrHandle { fd: file.as_raw_fd() },
        fs_ops: core::ptr::null(),
    };
    let mut fh = core::ptr::null_mut();
    // SAFETY: valid pointers.
    assert_eq!(unsafe { hipFileHandleRegister(&mut fh, &descr) }.err, 0);
    fh
}

#[test]
fn settings_shape_the_engine_until_it_starts() {
    let mut buffer = core::ptr::null_mut();
    // SAFETY: a valid out-pointer.
    if unsafe { hipfileCpuMalloc(&mut buffer, 1 << 20) }.0 != 0 {
        println!("skipped: the driver's device is not the cpu device");
        return;
    }
    // Before anything: settings change, properties need an open driver.
    // SAFETY: plain values.
    unsafe {
        assert_eq!(hipFileSetParameterSizeT(QUEUE_DEPTH, 7).err, 0);
        assert_eq!(hipFileSetParameterSizeT(THREADS, 1).err, 0);
        assert_eq!(hipFileSetParameterBool(PREFER_IO_URING, false).err, 0);
        assert_eq!(hipFileDriverSetMaxDirectIOSize(256).err, 0);
    }
    assert_eq!((get_size(QUEUE_DEPTH), get_size(THREADS)), (7, 1));
    assert_eq!(get_size(PARALLELISM), 1, "clamped to the one executor");
    assert_eq!(get_size(MAX_DIRECT_IO_KB), 256);
    let mut props = HipFileDriverProps::default();
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { hipFileDriverGetProperties(&mut props) }.err, 5001, "closed driver");
    // SAFETY: no arguments.
    assert_eq!(unsafe { hipFileDriverOpen() }.err, 0);
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { hipFileDriverGetProperties(&mut props) }.err, 0);
    assert_eq!(props.nvfs.max_direct_io_size_kib, 256);
    assert_eq!(props.feature_flags & (1 << 3), 0, "no parallel I/O with one executor");

    // A registered handle freezes the settings (its descriptors follow them).
    let data: Vec<u8> = (0..1 << 20).map(|i: u32| (i * 7) as u8).collect();
    let path = std::env::temp_dir().join(format!("hipfile-parameters-{}", std::process::id()));
    std::fs::write(&path, &data).expect("write the file");
    let file = std::fs::OpenOptions::new().read(true).write(true).open(&path).expect("open");
    let fh = register(&file);
    // SAFETY: plain values.
    unsafe {
        assert_eq!(hipFileSetParameterSizeT(QUEUE_DEPTH, 9).err, 5026);
        assert_eq!(hipFileDriverSetMaxDirectIOSize(128).err, 5026);
    }
    assert_eq!(get_size(QUEUE_DEPTH), 7, "a refused change changes nothing");
    // SAFETY: our handle.
    unsafe { hipFileHandleDeregister(fh) };
    // SAFETY: a plain value.
    assert_eq!(unsafe { hipFileSetParameterSizeT(QUEUE_DEPTH, 6) }.err, 0, "free again");

    // Compat mode off: sync I/O is refused (5030, as hipFile with no backend left), and
    // the engine does not start.
    // SAFETY: a plain value.
    assert_eq!(unsafe { hipFileSetParameterBool(ALLOW_COMPAT_MODE, false) }.err, 0);
    let fh = register(&file);
    // SAFETY: a registered handle and 1 MiB of device memory.
    assert_eq!(unsafe { hipFileRead(fh, buffer, 1 << 20, 0, 0) }, -5030);
    // SAFETY: our handle.
    unsafe { hipFileHandleDeregister(fh) };
    // SAFETY: a plain value.
    assert_eq!(unsafe { hipFileSetParameterBool(ALLOW_COMPAT_MODE, true) }.err, 0);

    // The first I/O starts the engine with the settings in force.
    let fh = register(&file);
    // SAFETY: a registered handle and 1 MiB of device memory.
    let read = unsafe { hipFileRead(fh, buffer, 1 << 20, 0, 0) };
    assert_eq!(read, 1 << 20);
    let driver = &hipfile_runtime::driver::process::runtime().expect("driver").driver;
    let engine = driver.engine().expect("engine");
    assert_eq!(engine.executor_count(), 1, "ExecutionMaxIOThreads");
    assert_eq!(engine.blocking_executor_count(), 1, "PreferIOUring false: blocking executor");
    assert_eq!(driver.config().chunks_in_flight, 6);
    // SAFETY: our handle.
    unsafe { hipFileHandleDeregister(fh) };
    // SAFETY: plain values.
    unsafe {
        assert_eq!(hipFileSetParameterSizeT(QUEUE_DEPTH, 5).err, 5026, "the engine runs");
        assert_eq!(hipFileSetParameterBool(PREFER_IO_URING, true).err, 5026);
    }
    let mut flag = true;
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { hipFileGetParameterBool(PREFER_IO_URING, &mut flag) }.err, 0);
    assert!(!flag);
    // SAFETY: no arguments.
    assert_eq!(unsafe { hipFileDriverClose() }.err, 0);
    let _ = std::fs::remove_file(&path);
}
