//! The C boundary: one macro, `ffi_fn!`, declares every export of the library.
//!
//! It expands to `#[unsafe(no_mangle)] pub unsafe extern "C" fn` whose body runs under
//! [`guard`]: a panic never unwinds into C; it becomes the value [`OnPanic`] gives for
//! the return type (`hipFileInternalError` for `hipFileError_t`, `-5030` for `ssize_t`,
//! `-1` for the use count, `hipErrorUnknown` for the `hipfileCpu*` functions, nothing
//! for `void`). The body's value is converted with `Into`, so a body may return a
//! `Result` of the runtime and let the conversion fill `hipFileError_t` as hipFile does
//! (`hip_drv_err` set only with `hipFileHipDriverError`).
//!
//! NULL checks go through [`out_ptr`] / [`in_ref`]; outputs are written only where the
//! function's documentation says so.

use core::ffi::{c_char, c_int};
use std::panic::{AssertUnwindSafe, catch_unwind};

use hipfile_core::OpError;
use hipfile_runtime::Error;
use hipfile_runtime::device::DeviceError;

use crate::types::HipFileError;

/// The value an export returns when its body panicked.
pub trait OnPanic {
    /// That value.
    fn on_panic() -> Self;
}

impl OnPanic for HipFileError {
    fn on_panic() -> Self {
        HipFileError::from(OpError::InternalError)
    }
}

impl OnPanic for isize {
    fn on_panic() -> Self {
        -(OpError::InternalError.code() as isize)
    }
}

impl OnPanic for i64 {
    fn on_panic() -> Self {
        -1
    }
}

impl OnPanic for () {
    fn on_panic() -> Self {}
}

impl OnPanic for *const c_char {
    fn on_panic() -> Self {
        c"Internal GPU IO library error".as_ptr()
    }
}

/// A `hipError_t` returned by the `hipfileCpu*` extension functions (`int` in C).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HipStatus(pub c_int);

impl HipStatus {
    /// `hipSuccess`.
    pub const SUCCESS: HipStatus = HipStatus(0);
    /// `hipErrorInvalidValue`.
    pub const INVALID_VALUE: HipStatus = HipStatus(DeviceError::HIP_ERROR_INVALID_VALUE);
    /// `hipErrorNoDevice`: the driver does not use the cpu device.
    pub const NO_DEVICE: HipStatus = HipStatus(100);
    /// `hipErrorNotReady`.
    pub const NOT_READY: HipStatus = HipStatus(DeviceError::HIP_ERROR_NOT_READY);
    /// `hipErrorUnknown`.
    pub const UNKNOWN: HipStatus = HipStatus(DeviceError::HIP_ERROR_UNKNOWN);
}

impl OnPanic for HipStatus {
    fn on_panic() -> Self {
        HipStatus::UNKNOWN
    }
}

impl From<Result<(), HipStatus>> for HipStatus {
    fn from(result: Result<(), HipStatus>) -> HipStatus {
        result.err().unwrap_or(HipStatus::SUCCESS)
    }
}

impl From<DeviceError> for HipStatus {
    fn from(error: DeviceError) -> HipStatus {
        HipStatus(error.hip_error)
    }
}

impl From<OpError> for HipFileError {
    fn from(code: OpError) -> HipFileError {
        HipFileError::from(Error::new(code))
    }
}

impl From<Error> for HipFileError {
    /// `hip_drv_err` is set only with `hipFileHipDriverError`, as hipFile does.
    fn from(error: Error) -> HipFileError {
        let hip_drv_err = if error.code == OpError::HipDriverError { error.hip_error } else { 0 };
        HipFileError { err: error.code.code(), hip_drv_err }
    }
}

impl From<Result<(), Error>> for HipFileError {
    fn from(result: Result<(), Error>) -> HipFileError {
        match result {
            Ok(()) => HipFileError { err: OpError::Success.code(), hip_drv_err: 0 },
            Err(error) => HipFileError::from(error),
        }
    }
}

/// Runs an export's body: catches a panic (the default hook has printed it) and returns
/// `R::on_panic()` instead; otherwise converts the body's value into the C return type.
pub fn guard<R: OnPanic, T: Into<R>>(body: impl FnOnce() -> T) -> R {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(value) => value.into(),
        Err(_) => R::on_panic(),
    }
}

/// An output pointer: `None` when NULL.
pub fn out_ptr<T>(ptr: *mut T) -> Option<*mut T> {
    (!ptr.is_null()).then_some(ptr)
}

/// Reads an input struct the caller passed by pointer; `None` when NULL.
///
/// # Safety
/// A non-NULL `ptr` points to a readable, initialised `T`.
pub unsafe fn in_ref<T: Copy>(ptr: *const T) -> Option<T> {
    // SAFETY: non-NULL per the check; readable and initialised per the caller.
    (!ptr.is_null()).then(|| unsafe { ptr.read_unaligned() })
}

/// Declares exported C functions: each becomes `#[unsafe(no_mangle)] pub unsafe extern
/// "C" fn` with its body run under [`guard`]. Write the documentation (with its
/// `# Safety` section) on each function inside the macro.
macro_rules! ffi_fn {
    ($(
        $(#[$meta:meta])*
        fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block
    )*) => {$(
        $(#[$meta])*
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) $(-> $ret)? {
            $crate::boundary::guard(move || $body)
        }
    )*};
}
pub(crate) use ffi_fn;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_the_documented_value() {
        let status: HipFileError = guard(|| -> Result<(), Error> { panic!("boom") });
        assert_eq!(status, HipFileError { err: 5030, hip_drv_err: 0 });
        let bytes: isize = guard(|| -> isize { panic!("boom") });
        assert_eq!(bytes, -5030);
        let count: i64 = guard(|| -> i64 { panic!("boom") });
        assert_eq!(count, -1);
        let hip: HipStatus = guard(|| -> Result<(), HipStatus> { panic!("boom") });
        assert_eq!(hip, HipStatus::UNKNOWN);
        let (): () = guard(|| -> () { panic!("boom") });
    }

    #[test]
    fn hip_drv_err_is_set_only_with_5011() {
        let device = Error::device(DeviceError::new(400, "unknown stream"));
        assert_eq!(HipFileError::from(device), HipFileError { err: 5011, hip_drv_err: 400 });
        let odd = Error { code: OpError::InvalidValue, hip_error: 7 };
        assert_eq!(HipFileError::from(odd), HipFileError { err: 5022, hip_drv_err: 0 });
        assert_eq!(HipFileError::from(Ok(())), HipFileError { err: 0, hip_drv_err: 0 });
    }

    #[test]
    fn null_helpers() {
        assert!(out_ptr(core::ptr::null_mut::<u32>()).is_none());
        let mut value = 5u32;
        assert!(out_ptr(&mut value as *mut u32).is_some());
        // SAFETY: NULL and a valid pointer.
        unsafe {
            assert_eq!(in_ref(core::ptr::null::<u32>()), None);
            assert_eq!(in_ref(&value as *const u32), Some(5));
        }
    }
}
