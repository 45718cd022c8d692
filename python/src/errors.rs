//! Errors as Python sees them: `hipfile.HipFileError` carrying the hipFile code, and
//! `OSError` for the errno of a failed read or write.

use hipfile_core::OpError;
use hipfile_runtime::device::DeviceError;
use hipfile_runtime::{Error, IoError};
use pyo3::exceptions::{PyException, PyOSError};
use pyo3::prelude::*;

pyo3::create_exception!(
    hipfile,
    HipFileError,
    PyException,
    "A hipFile error: `.code` is the hipFileOpError_t value (e.g. 5022), `.name` its C \
     name, `.message` hipFile's message, `.hip_error` the HIP error behind code 5011."
);

/// A `HipFileError` for `code`, with `detail` replacing hipFile's message when given.
pub fn op_error(py: Python<'_>, code: OpError, hip_error: i32, detail: Option<&str>) -> PyErr {
    let message = detail.unwrap_or(code.message());
    let text = match hip_error {
        0 => format!("{} ({}): {message}", code.c_name(), code.code()),
        _ => format!("{} ({}): {message} (hipError {hip_error})", code.c_name(), code.code()),
    };
    let error = HipFileError::new_err(text);
    let value = error.value(py);
    // Setting attributes on a fresh exception instance cannot fail short of memory
    // exhaustion; the message carries the same facts if it does.
    let _ = value.setattr("code", code.code());
    let _ = value.setattr("name", code.c_name());
    let _ = value.setattr("message", message);
    let _ = value.setattr("hip_error", hip_error);
    error
}

/// The Python error for a runtime [`Error`].
pub fn from_error(py: Python<'_>, error: Error) -> PyErr {
    op_error(py, error.code, error.hip_error, None)
}

/// The Python error for a device error (`hipFileHipDriverError`, 5011).
pub fn from_device_error(py: Python<'_>, error: DeviceError) -> PyErr {
    op_error(py, OpError::HipDriverError, error.hip_error, Some(error.what))
}

/// The Python error for a failed synchronous read or write: `OSError` for an errno,
/// `HipFileError` otherwise (a closed driver is `hipFileDriverNotInitialized`, 5001).
pub fn from_io_error(py: Python<'_>, error: IoError) -> PyErr {
    match error {
        IoError::DriverClosed => op_error(
            py,
            OpError::DriverNotInitialized,
            0,
            Some("the hipFile driver is not open (hipFileRead/hipFileWrite: -1, errno EINVAL)"),
        ),
        IoError::Os(errno) => os_error(errno),
        IoError::Library(code) => op_error(py, code, 0, None),
        IoError::Device(device) => from_device_error(py, device),
    }
}

/// `OSError(errno, strerror)` (Python picks the subclass, e.g. `IsADirectoryError`).
pub fn os_error(errno: i32) -> PyErr {
    let text = std::io::Error::from_raw_os_error(errno).to_string();
    PyOSError::new_err((errno, text))
}

/// The error an async or batch result encodes (`-errno` or `-hipFileOpError`).
pub fn from_negative_result(py: Python<'_>, result: i64) -> PyErr {
    let value = result.unsigned_abs();
    match i32::try_from(value).ok().and_then(OpError::from_code) {
        Some(code) if hipfile_core::is_hipfile_err(result) => op_error(py, code, 0, None),
        _ => os_error(i32::try_from(value).unwrap_or(libc_eio())),
    }
}

/// `EIO`, for a result too large to be an errno (never produced by the runtime).
const fn libc_eio() -> i32 {
    5
}
