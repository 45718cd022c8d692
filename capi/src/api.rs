//! The hipFile API (`hipfile.h`): every function of hipFile's public header.
//!
//! Behaviour is hipFile's (`reference/behaviour.md` §2, §3) except where `hipfile.h`
//! and the README say "differs from hipFile". Parameters and driver properties are
//! implemented (hipFile returns 5030 for them): `hipfile_runtime::parameters`; batch I/O
//! is in `batch.rs` (hipFile never runs a batch).

#![allow(non_snake_case, reason = "C function names are hipFile's")]

use core::ffi::{c_char, c_int, c_uint, c_void};
use std::ffi::CString;
use std::sync::{Arc, OnceLock};

use hipfile_core::{Direction, OpError, RawIo, UNKNOWN_ERROR_MESSAGE};
use hipfile_runtime::config::Config;
use hipfile_runtime::device::StreamHandle;
use hipfile_runtime::driver::process;
use hipfile_runtime::parameters::{
    BoolParameter, DriverProperties, SizeParameter, StringParameter,
};
use hipfile_runtime::{Driver, Error, HandleId};

use crate::async_args::AsyncArgs;

use crate::boundary::{ffi_fn, in_ref, out_ptr};
use crate::types::{
    HipFileDescr, HipFileDriverProps, HipFileError, NvfsProps, VERSION, handle_type,
};

/// The C API's driver (built on first use; see `process::runtime`). A C program has
/// no logger of its own: the library's messages go to stderr at `HIPFILE_LOG`'s level.
pub(crate) fn driver() -> Result<&'static Arc<Driver>, Error> {
    hipfile_runtime::logging::install_stderr_logger();
    process::runtime().map(|runtime| &runtime.driver)
}

/// The static, NUL-terminated message of `value` ("Unknown hipFile error" for values
/// that are not codes).
fn error_string(value: c_int) -> *const c_char {
    static MESSAGES: OnceLock<Vec<(OpError, CString)>> = OnceLock::new();
    static UNKNOWN: OnceLock<CString> = OnceLock::new();
    let messages = MESSAGES.get_or_init(|| {
        OpError::ALL.iter().map(|&code| (code, c_string(code.message()))).collect()
    });
    let known = OpError::from_code(value)
        .and_then(|code| messages.iter().find(|(c, _)| *c == code))
        .map(|(_, message)| message.as_ptr());
    known.unwrap_or_else(|| UNKNOWN.get_or_init(|| c_string(UNKNOWN_ERROR_MESSAGE)).as_ptr())
}

fn c_string(message: &str) -> CString {
    CString::new(message).unwrap_or_else(|_| c"Unknown hipFile error".to_owned())
}

/// Sets the calling thread's `errno`.
fn set_errno(errno: c_int) {
    // SAFETY: `__errno_location` returns the calling thread's errno slot, valid for the
    // thread's life.
    unsafe { *libc::__errno_location() = errno };
}

/// `hipFileRead` / `hipFileWrite`.
fn io_sync(direction: Direction, fh: *mut c_void, buffer_base: u64, raw: RawIo) -> isize {
    let driver = match driver() {
        Ok(driver) => driver,
        Err(error) => return -(error.code.code() as isize),
    };
    match driver.io_sync(direction, HandleId(fh as usize), buffer_base, raw) {
        Ok(n_bytes) => n_bytes as isize,
        Err(error) => {
            let (value, errno) = error.as_ssize();
            if let Some(errno) = errno {
                set_errno(errno);
            }
            value
        }
    }
}

fn raw_io(size: usize, file_offset: i64, buffer_offset: i64) -> RawIo {
    RawIo {
        size_bytes: size as u64,
        file_offset_bytes: file_offset,
        buffer_offset_bytes: buffer_offset,
    }
}

/// `hipFileReadAsync` / `hipFileWriteAsync`: every check (driver open first, then the
/// NULL pointers, then the handle, ...) is the driver's, in hipFile's order.
fn io_async(
    direction: Direction,
    fh: *mut c_void,
    buffer_base: *mut c_void,
    args: AsyncArgs,
    stream: *mut c_void,
) -> Result<(), Error> {
    let driver = driver()?;
    let (handle, buffer, stream) =
        (HandleId(fh as usize), buffer_base as u64, StreamHandle(stream as usize));
    driver.submit_async_from(direction, handle, buffer, std::sync::Arc::new(args), stream)
}

ffi_fn! {
    /// `hipFileGetOpErrorString`: the message of a code, "Unknown hipFile error" for
    /// other values. The string is static.
    ///
    /// # Safety
    /// None: any value is accepted.
    fn hipFileGetOpErrorString(status: c_int) -> *const c_char {
        error_string(status)
    }

    /// `hipFileGetVersion`: writes the version to the non-NULL arguments.
    ///
    /// # Safety
    /// Each non-NULL argument points to a writable `unsigned`.
    fn hipFileGetVersion(major: *mut c_uint, minor: *mut c_uint, patch: *mut c_uint) -> HipFileError {
        for (target, value) in [(major, VERSION.0), (minor, VERSION.1), (patch, VERSION.2)] {
            if let Some(target) = out_ptr(target) {
                // SAFETY: non-NULL and writable per the contract.
                unsafe { target.write_unaligned(value) };
            }
        }
        Ok::<(), Error>(())
    }

    /// `hipFileDriverOpen`: increments the use count.
    ///
    /// # Safety
    /// None.
    fn hipFileDriverOpen() -> HipFileError {
        driver().map(|driver| driver.open())
    }

    /// `hipFileDriverClose`: decrements the use count (5001 at 0).
    ///
    /// # Safety
    /// None.
    fn hipFileDriverClose() -> HipFileError {
        driver().and_then(|driver| driver.close())
    }

    /// `hipFileUseCount`: the use count, -1 when the device is unavailable.
    ///
    /// # Safety
    /// None.
    fn hipFileUseCount() -> i64 {
        driver().map_or(-1, |driver| driver.use_count())
    }

    /// `hipFileDriverGetProperties`: the driver's properties, from the configuration in
    /// force (`hipfile_runtime::parameters::DriverProperties`). NULL → 5022; the driver
    /// not open → 5001 (as cuFile); nothing is written on failure.
    ///
    /// # Safety
    /// A non-NULL `props` points to a writable `hipFileDriverProps_t`.
    fn hipFileDriverGetProperties(props: *mut HipFileDriverProps) -> HipFileError {
        let Some(props) = out_ptr(props) else { return invalid_value() };
        let driver = match driver() {
            Ok(driver) => driver,
            Err(error) => return HipFileError::from(error),
        };
        if driver.use_count() <= 0 {
            return HipFileError::from(OpError::DriverNotInitialized);
        }
        let p = DriverProperties::of(&driver.config());
        let value = HipFileDriverProps {
            nvfs: NvfsProps {
                major_version: VERSION.0,
                minor_version: VERSION.1,
                poll_thresh_size_kib: p.poll_threshold_kib,
                max_direct_io_size_kib: p.max_direct_io_kib,
                // No file system is served by a direct (peer-to-peer) path: all I/O is the
                // compatibility path.
                driver_status_flags: 0,
                driver_control_flags: p.control_flags,
            },
            feature_flags: p.feature_flags,
            max_device_cache_size_kib: p.max_device_cache_kib,
            per_buffer_cache_size_kib: p.per_buffer_cache_kib,
            max_device_pinned_mem_size_kib: p.max_pinned_kib,
            max_batch_io_count: p.max_batch_entries,
            max_batch_io_timeout_msecs: p.max_batch_timeout_ms,
        };
        // SAFETY: non-NULL and writable per the contract.
        unsafe { props.write_unaligned(value) };
        HipFileError::from(Ok::<(), Error>(()))
    }

    /// `hipFileDriverSetPollMode`: one-chunk sync requests always complete on the
    /// caller's thread, up to the staging chunk: `poll` must be true and the threshold
    /// (KiB) the chunk's size, else 5022; 5026 once the engine runs or a file is
    /// registered.
    ///
    /// # Safety
    /// None.
    fn hipFileDriverSetPollMode(poll: bool, poll_threshold_size: usize) -> HipFileError {
        configure(|config| {
            BoolParameter::PropertiesUsePollMode.set(config, poll)?;
            SizeParameter::PollThresholdSizeKb.set(config, poll_threshold_size as u64)
        })
    }

    /// `hipFileDriverSetMaxDirectIOSize`: the staging chunk, in KiB (a power of two,
    /// 4..=65536; 5022 otherwise); 5026 once the engine runs or a file is registered.
    ///
    /// # Safety
    /// None.
    fn hipFileDriverSetMaxDirectIOSize(max_direct_io_size: usize) -> HipFileError {
        set_size(SizeParameter::PropertiesMaxDirectIoSizeKb, max_direct_io_size as u64)
    }

    /// `hipFileDriverSetMaxCacheSize`: all executors' staging arenas together, in KiB
    /// (each at least 2 chunks; 5022 otherwise); 5026 once the engine runs or a file is
    /// registered.
    ///
    /// # Safety
    /// None.
    fn hipFileDriverSetMaxCacheSize(max_cache_size: usize) -> HipFileError {
        set_size(SizeParameter::PropertiesMaxDeviceCacheSizeKb, max_cache_size as u64)
    }

    /// `hipFileDriverSetMaxPinnedMemSize`: the pinned memory the engine may hold, in KiB
    /// (arenas plus at least one fallback chunk; 5022 otherwise); 5026 once the engine
    /// runs or a file is registered.
    ///
    /// # Safety
    /// None.
    fn hipFileDriverSetMaxPinnedMemSize(max_pinned_size: usize) -> HipFileError {
        set_size(SizeParameter::PropertiesMaxDevicePinnedMemSizeKb, max_pinned_size as u64)
    }

    /// `hipFileHandleRegister`: NULL `fh` or `descr` → 5022 without opening the driver;
    /// a type other than OpaqueFD → 5008; then the driver registers `descr->handle.fd`
    /// (a bad descriptor → 5030 or 5008, count unchanged; a duplicate → 5028) and the
    /// handle is written to `*fh` on success only.
    ///
    /// # Safety
    /// Non-NULL `fh` is writable; non-NULL `descr` points to a readable `hipFileDescr_t`.
    fn hipFileHandleRegister(fh: *mut *mut c_void, descr: *const HipFileDescr) -> HipFileError {
        // SAFETY: a non-NULL descr is readable per the contract.
        let (Some(fh), Some(descr)) = (out_ptr(fh), unsafe { in_ref(descr) }) else {
            return Err(Error::new(OpError::InvalidValue));
        };
        if descr.handle_type != handle_type::OPAQUE_FD {
            return Err(Error::new(OpError::IONotSupported));
        }
        // SAFETY: for OpaqueFD the union holds `int fd`; every bit pattern is an int.
        let fd = unsafe { descr.handle.fd };
        let handle = driver()?.handle_register(fd)?;
        // SAFETY: non-NULL and writable per the contract.
        unsafe { fh.write_unaligned(handle.0 as *mut c_void) };
        Ok(())
    }

    /// `hipFileHandleDeregister`: NULL and unknown handles are ignored.
    ///
    /// # Safety
    /// None: the handle is only looked up.
    fn hipFileHandleDeregister(fh: *mut c_void) {
        if let Ok(driver) = driver() {
            driver.handle_deregister(HandleId(fh as usize));
        }
    }

    /// `hipFileBufRegister` (`flags` ignored). Opens the driver first.
    ///
    /// # Safety
    /// None: the pointer is only looked up in the device's allocation table.
    fn hipFileBufRegister(buffer_base: *const c_void, length: usize, flags: c_int) -> HipFileError {
        driver()?.buf_register(buffer_base as u64, length as u64, flags)
    }

    /// `hipFileBufDeregister`.
    ///
    /// # Safety
    /// None: the pointer is only looked up.
    fn hipFileBufDeregister(buffer_base: *const c_void) -> HipFileError {
        driver()?.buf_deregister(buffer_base as u64)
    }

    /// `hipFileRead`: bytes read, -1 with errno, -50xx or -hipError_t.
    ///
    /// # Safety
    /// `buffer_base` is device memory the caller may write (the device checks it is
    /// device memory; the range is checked against the allocation).
    fn hipFileRead(fh: *mut c_void, buffer_base: *mut c_void, size: usize, file_offset: i64, buffer_offset: i64) -> isize {
        io_sync(Direction::Read, fh, buffer_base as u64, raw_io(size, file_offset, buffer_offset))
    }

    /// `hipFileWrite`: bytes written, -1 with errno, -50xx or -hipError_t.
    ///
    /// # Safety
    /// As `hipFileRead`.
    fn hipFileWrite(fh: *mut c_void, buffer_base: *const c_void, size: usize, file_offset: i64, buffer_offset: i64) -> isize {
        io_sync(Direction::Write, fh, buffer_base as u64, raw_io(size, file_offset, buffer_offset))
    }

    /// `hipFileReadAsync`: see `hipfile.h` for the checks and their order.
    ///
    /// # Safety
    /// The pointers are valid; those not fixed by the stream's flags stay valid until
    /// the stream reaches the op, `bytes_read_p` until it has passed it; `buffer_base`
    /// stays allocated until then.
    fn hipFileReadAsync(
        fh: *mut c_void,
        buffer_base: *mut c_void,
        size_p: *mut usize,
        file_offset_p: *mut i64,
        buffer_offset_p: *mut i64,
        bytes_read_p: *mut isize,
        stream: *mut c_void,
    ) -> HipFileError {
        // SAFETY: forwarded contract of the export.
        let args = unsafe {
            AsyncArgs::new(
                size_p.cast_const(),
                file_offset_p.cast_const(),
                buffer_offset_p.cast_const(),
                bytes_read_p,
            )
        };
        io_async(Direction::Read, fh, buffer_base, args, stream)
    }

    /// `hipFileWriteAsync`: as `hipFileReadAsync`.
    ///
    /// # Safety
    /// As `hipFileReadAsync`.
    fn hipFileWriteAsync(
        fh: *mut c_void,
        buffer_base: *mut c_void,
        size_p: *mut usize,
        file_offset_p: *mut i64,
        buffer_offset_p: *mut i64,
        bytes_written_p: *mut isize,
        stream: *mut c_void,
    ) -> HipFileError {
        // SAFETY: forwarded contract of the export.
        let args = unsafe {
            AsyncArgs::new(
                size_p.cast_const(),
                file_offset_p.cast_const(),
                buffer_offset_p.cast_const(),
                bytes_written_p,
            )
        };
        io_async(Direction::Write, fh, buffer_base, args, stream)
    }

    /// `hipFileStreamRegister`: needs no driver and does not open it.
    ///
    /// # Safety
    /// `stream` is NULL or a stream of the driver's device (others give 5011).
    fn hipFileStreamRegister(stream: *mut c_void, flags: c_uint) -> HipFileError {
        driver()?.stream_register(StreamHandle(stream as usize), flags)
    }

    /// `hipFileStreamDeregister`: not registered → 5022.
    ///
    /// # Safety
    /// None: the stream is only looked up.
    fn hipFileStreamDeregister(stream: *mut c_void) -> HipFileError {
        driver()?.stream_deregister(StreamHandle(stream as usize))
    }

    /// `hipFileGetParameterSizeT`: the value in force, in hipFile's unit (README,
    /// "Parameters"). NULL `value` or an unknown key → 5022, nothing written.
    ///
    /// # Safety
    /// A non-NULL `value` points to a writable `size_t`.
    fn hipFileGetParameterSizeT(param: c_int, value: *mut usize) -> HipFileError {
        let Some(value) = out_ptr(value) else { return invalid_value() };
        let result = SizeParameter::from_raw(param).and_then(|key| {
            let got = key.get(&driver()?.config());
            usize::try_from(got).map_err(|_| Error::new(OpError::InternalError))
        });
        match result {
            Ok(got) => {
                // SAFETY: non-NULL and writable per the contract.
                unsafe { value.write_unaligned(got) };
                HipFileError::from(Ok::<(), Error>(()))
            }
            Err(error) => HipFileError::from(error),
        }
    }

    /// `hipFileGetParameterBool`: as `hipFileGetParameterSizeT`.
    ///
    /// # Safety
    /// A non-NULL `value` points to a writable `bool`.
    fn hipFileGetParameterBool(param: c_int, value: *mut bool) -> HipFileError {
        let Some(value) = out_ptr(value) else { return invalid_value() };
        let result =
            BoolParameter::from_raw(param).and_then(|key| Ok(key.get(&driver()?.config())));
        match result {
            Ok(got) => {
                // SAFETY: non-NULL and writable per the contract.
                unsafe { value.write_unaligned(got) };
                HipFileError::from(Ok::<(), Error>(()))
            }
            Err(error) => HipFileError::from(error),
        }
    }

    /// `hipFileGetParameterString`: the value, NUL-terminated, into `desc_str` of `len`
    /// bytes. NULL, `len` ≤ 0, a buffer too short for the value and its NUL, or an
    /// unknown key → 5022, nothing written.
    ///
    /// # Safety
    /// A non-NULL `desc_str` points to `len` writable bytes.
    fn hipFileGetParameterString(param: c_int, desc_str: *mut c_char, len: c_int) -> HipFileError {
        let Some(target) = out_ptr(desc_str) else { return invalid_value() };
        hipfile_runtime::logging::install_stderr_logger();
        let key = match StringParameter::from_raw(param) {
            Ok(key) => key,
            Err(error) => return HipFileError::from(error),
        };
        let text = key.get().as_bytes();
        if usize::try_from(len).map_or(true, |len| len <= text.len()) {
            return invalid_value();
        }
        // SAFETY: `len` > text.len() writable bytes per the contract.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr().cast::<c_char>(), target, text.len());
            target.add(text.len()).write(0);
        }
        HipFileError::from(Ok::<(), Error>(()))
    }

    /// `hipFileSetParameterSizeT`: applies the value (README, "Parameters"): out of
    /// range, an unknown key, or another value for a read-only key → 5022; 5026 once the
    /// engine runs or a file is registered; nothing changes on failure.
    ///
    /// # Safety
    /// None.
    fn hipFileSetParameterSizeT(param: c_int, value: usize) -> HipFileError {
        match SizeParameter::from_raw(param) {
            Ok(key) => set_size(key, value as u64),
            Err(error) => HipFileError::from(error),
        }
    }

    /// `hipFileSetParameterBool`: as `hipFileSetParameterSizeT`.
    ///
    /// # Safety
    /// None.
    fn hipFileSetParameterBool(param: c_int, value: bool) -> HipFileError {
        match BoolParameter::from_raw(param) {
            Ok(key) => configure(|config| key.set(config, value)),
            Err(error) => HipFileError::from(error),
        }
    }

    /// `hipFileSetParameterString`: `LoggingLevel` takes a level name (`OFF`, `ERROR`,
    /// `WARN`, `INFO`, `DEBUG`, `TRACE`, any case) at any time; the file and directory
    /// keys only their own value (empty: messages go to stderr). Anything else, NULL,
    /// non-UTF-8 or an unknown key → 5022.
    ///
    /// # Safety
    /// A non-NULL `desc_str` points to a NUL-terminated string.
    fn hipFileSetParameterString(param: c_int, desc_str: *const c_char) -> HipFileError {
        if desc_str.is_null() {
            return invalid_value();
        }
        hipfile_runtime::logging::install_stderr_logger();
        // SAFETY: non-NULL and NUL-terminated per the contract.
        let text = unsafe { std::ffi::CStr::from_ptr(desc_str) };
        let result = StringParameter::from_raw(param).and_then(|key| {
            key.set(text.to_str().map_err(|_| Error::new(OpError::InvalidValue))?)
        });
        HipFileError::from(result)
    }
}

/// `hipFileInvalidValue`.
fn invalid_value() -> HipFileError {
    HipFileError::from(OpError::InvalidValue)
}

/// Changes the C API driver's configuration (see `Driver::configure`).
fn configure(change: impl FnOnce(&mut Config) -> Result<(), Error>) -> HipFileError {
    HipFileError::from(driver().and_then(|driver| driver.configure(change)))
}

fn set_size(key: SizeParameter, value: u64) -> HipFileError {
    configure(|config| key.set(config, value))
}

#[cfg(test)]
mod tests {
    use std::ffi::CStr;

    use super::*;

    fn message(value: c_int) -> &'static str {
        // SAFETY: the export returns a static NUL-terminated string for any value.
        unsafe { CStr::from_ptr(hipFileGetOpErrorString(value)) }.to_str().expect("UTF-8")
    }

    #[test]
    fn every_code_has_its_message_and_others_are_unknown() {
        for &code in OpError::ALL {
            assert_eq!(message(code.code()), code.message());
        }
        for value in [5000, 5021, 5032, 5040, -5022, 1, i32::MAX, i32::MIN] {
            assert_eq!(message(value), "Unknown hipFile error");
        }
        assert_eq!(message(5022), "One or more arguments have an invalid value");
    }

    #[test]
    fn bad_parameter_calls_are_5022_and_write_nothing() {
        let mut value = 7usize;
        // SAFETY: valid pointers.
        let status = unsafe { hipFileGetParameterSizeT(12, &mut value) };
        assert_eq!((status.err, status.hip_drv_err, value), (5022, 0, 7));
        // SAFETY: NULL is accepted.
        assert_eq!(unsafe { hipFileDriverGetProperties(std::ptr::null_mut()) }.err, 5022);
        let mut text = [b'x' as c_char; 4];
        // SAFETY: 4 writable bytes; "WARN" needs 5.
        let status = unsafe { hipFileGetParameterString(0, text.as_mut_ptr(), 4) };
        assert_eq!((status.err, text), (5022, [b'x' as c_char; 4]));
    }

    #[test]
    fn handle_register_checks_arguments_before_the_driver() {
        let mut fh = std::ptr::null_mut();
        // SAFETY: NULL descr and a valid fh.
        let status = unsafe { hipFileHandleRegister(&mut fh, std::ptr::null()) };
        assert_eq!(status.err, 5022);
        let descr = HipFileDescr {
            handle_type: handle_type::USERSPACE_FS,
            handle: crate::types::DescrHandle { fd: 0 },
            fs_ops: std::ptr::null(),
        };
        // SAFETY: valid pointers.
        assert_eq!(unsafe { hipFileHandleRegister(&mut fh, &descr) }.err, 5008);
        assert!(fh.is_null());
    }
}
