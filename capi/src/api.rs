//! The hipFile API (`hipfile.h`): every function of hipFile's public header.
//!
//! Behaviour is hipFile's (`reference/behaviour.md` §2, §3) except where `hipfile.h`
//! and the README say "differs from hipFile". Functions whose feature is not
//! implemented yet (driver properties, parameters, batch status/cancel) return
//! `hipFileInternalError` (5030) as hipFile does today, and write no output.

#![allow(non_snake_case, reason = "C function names are hipFile's")]

use core::ffi::{c_char, c_int, c_uint, c_void};
use std::ffi::CString;
use std::sync::{Arc, OnceLock};

use hipfile_core::{Direction, OpError, RawIo, UNKNOWN_ERROR_MESSAGE};
use hipfile_runtime::device::StreamHandle;
use hipfile_runtime::{AsyncArgs, Driver, Error, HandleId, capi_support};

use crate::boundary::{ffi_fn, in_ref, out_ptr};
use crate::types::{
    HipFileDescr, HipFileDriverProps, HipFileError, HipFileIoEvents, VERSION, handle_type,
};

/// The C API's driver (built on first use; see `capi_support::global`).
pub(crate) fn driver() -> Result<&'static Arc<Driver>, Error> {
    capi_support::global().map(|runtime| &runtime.driver)
}

/// `hipFileInternalError`: what the functions not implemented yet return.
fn not_implemented() -> HipFileError {
    HipFileError::from(OpError::InternalError)
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
///
/// # Safety
/// As the exports.
unsafe fn io_async(
    direction: Direction,
    fh: *mut c_void,
    buffer_base: *mut c_void,
    args: AsyncArgs,
    stream: *mut c_void,
) -> Result<(), Error> {
    let driver = driver()?;
    let (handle, buffer, stream) =
        (HandleId(fh as usize), buffer_base as u64, StreamHandle(stream as usize));
    // SAFETY: forwarded contract of hipFileReadAsync / hipFileWriteAsync.
    unsafe {
        match direction {
            Direction::Read => driver.read_async(handle, buffer, args, stream),
            Direction::Write => driver.write_async(handle, buffer, args, stream),
        }
    }
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

    /// `hipFileDriverGetProperties`: not implemented yet (5030); writes nothing.
    ///
    /// # Safety
    /// None: `props` is not accessed.
    fn hipFileDriverGetProperties(props: *mut HipFileDriverProps) -> HipFileError {
        let _ = props;
        not_implemented()
    }

    /// `hipFileDriverSetPollMode`: not implemented yet (5030).
    ///
    /// # Safety
    /// None.
    fn hipFileDriverSetPollMode(poll: bool, poll_threshold_size: usize) -> HipFileError {
        let _ = (poll, poll_threshold_size);
        not_implemented()
    }

    /// `hipFileDriverSetMaxDirectIOSize`: not implemented yet (5030).
    ///
    /// # Safety
    /// None.
    fn hipFileDriverSetMaxDirectIOSize(max_direct_io_size: usize) -> HipFileError {
        let _ = max_direct_io_size;
        not_implemented()
    }

    /// `hipFileDriverSetMaxCacheSize`: not implemented yet (5030).
    ///
    /// # Safety
    /// None.
    fn hipFileDriverSetMaxCacheSize(max_cache_size: usize) -> HipFileError {
        let _ = max_cache_size;
        not_implemented()
    }

    /// `hipFileDriverSetMaxPinnedMemSize`: not implemented yet (5030).
    ///
    /// # Safety
    /// None.
    fn hipFileDriverSetMaxPinnedMemSize(max_pinned_size: usize) -> HipFileError {
        let _ = max_pinned_size;
        not_implemented()
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
        let args = AsyncArgs {
            size_p: size_p.cast_const(),
            file_offset_p: file_offset_p.cast_const(),
            buffer_offset_p: buffer_offset_p.cast_const(),
            bytes_p: bytes_read_p,
        };
        // SAFETY: forwarded contract.
        unsafe { io_async(Direction::Read, fh, buffer_base, args, stream) }
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
        let args = AsyncArgs {
            size_p: size_p.cast_const(),
            file_offset_p: file_offset_p.cast_const(),
            buffer_offset_p: buffer_offset_p.cast_const(),
            bytes_p: bytes_written_p,
        };
        // SAFETY: forwarded contract.
        unsafe { io_async(Direction::Write, fh, buffer_base, args, stream) }
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

    /// `hipFileBatchIOGetStatus`: not implemented yet (5030); writes nothing.
    ///
    /// # Safety
    /// None: no pointer is accessed.
    fn hipFileBatchIOGetStatus(
        batch_idp: *mut c_void,
        min_nr: c_uint,
        nr: *mut c_uint,
        iocbp: *mut HipFileIoEvents,
        timeout: *mut libc::timespec,
    ) -> HipFileError {
        let _ = (batch_idp, min_nr, nr, iocbp, timeout);
        not_implemented()
    }

    /// `hipFileBatchIOCancel`: not implemented yet (5030).
    ///
    /// # Safety
    /// None.
    fn hipFileBatchIOCancel(batch_idp: *mut c_void) -> HipFileError {
        let _ = batch_idp;
        not_implemented()
    }

    /// `hipFileGetParameterSizeT`: not implemented yet (5030); writes nothing.
    ///
    /// # Safety
    /// None: `value` is not accessed.
    fn hipFileGetParameterSizeT(param: c_int, value: *mut usize) -> HipFileError {
        let _ = (param, value);
        not_implemented()
    }

    /// `hipFileGetParameterBool`: not implemented yet (5030); writes nothing.
    ///
    /// # Safety
    /// None: `value` is not accessed.
    fn hipFileGetParameterBool(param: c_int, value: *mut bool) -> HipFileError {
        let _ = (param, value);
        not_implemented()
    }

    /// `hipFileGetParameterString`: not implemented yet (5030); writes nothing.
    ///
    /// # Safety
    /// None: `desc_str` is not accessed.
    fn hipFileGetParameterString(param: c_int, desc_str: *mut c_char, len: c_int) -> HipFileError {
        let _ = (param, desc_str, len);
        not_implemented()
    }

    /// `hipFileSetParameterSizeT`: not implemented yet (5030).
    ///
    /// # Safety
    /// None.
    fn hipFileSetParameterSizeT(param: c_int, value: usize) -> HipFileError {
        let _ = (param, value);
        not_implemented()
    }

    /// `hipFileSetParameterBool`: not implemented yet (5030).
    ///
    /// # Safety
    /// None.
    fn hipFileSetParameterBool(param: c_int, value: bool) -> HipFileError {
        let _ = (param, value);
        not_implemented()
    }

    /// `hipFileSetParameterString`: not implemented yet (5030).
    ///
    /// # Safety
    /// None: `desc_str` is not accessed.
    fn hipFileSetParameterString(param: c_int, desc_str: *const c_char) -> HipFileError {
        let _ = (param, desc_str);
        not_implemented()
    }
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
    fn stubs_return_5030_and_write_nothing() {
        let mut value = 7usize;
        // SAFETY: valid pointers.
        let status = unsafe { hipFileGetParameterSizeT(0, &mut value) };
        assert_eq!((status.err, status.hip_drv_err, value), (5030, 0, 7));
        // SAFETY: NULL is accepted.
        assert_eq!(unsafe { hipFileDriverGetProperties(std::ptr::null_mut()) }.err, 5030);
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
