//! Errors of the runtime, in the shapes hipFile reports them.

use std::fmt;

use hipfile_core::OpError;

use crate::device::DeviceError;

/// `hipFileError_t`: a hipFile code plus, for `hipFileHipDriverError` (5011) only, the
/// HIP error behind it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Error {
    /// The hipFile code.
    pub code: OpError,
    /// `hipError_t` value; `0` (hipSuccess) unless `code` is `HipDriverError`.
    pub hip_error: i32,
}

impl Error {
    /// A library error with no HIP error.
    pub const fn new(code: OpError) -> Error {
        Error { code, hip_error: 0 }
    }

    /// `hipFileHipDriverError` carrying the device's HIP error.
    pub const fn device(error: DeviceError) -> Error {
        Error { code: OpError::HipDriverError, hip_error: error.hip_error }
    }
}

impl From<OpError> for Error {
    fn from(code: OpError) -> Error {
        Error::new(code)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.code == OpError::HipDriverError {
            write!(f, "{} (hipError {})", self.code, self.hip_error)
        } else {
            self.code.fmt(f)
        }
    }
}

impl std::error::Error for Error {}

/// Why a synchronous read or write failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoError {
    /// The driver is not open: hipFile returns -1 with errno EINVAL.
    DriverClosed,
    /// An OS error (errno).
    Os(i32),
    /// A library error (returned as its negated code, e.g. -5022).
    Library(OpError),
    /// A device error (returned as the negated `hipError_t`).
    Device(DeviceError),
}

impl IoError {
    /// The `ssize_t` hipFile's `hipFileRead`/`hipFileWrite` return, and the errno to
    /// set when it is -1.
    pub fn as_ssize(self) -> (isize, Option<i32>) {
        match self {
            IoError::DriverClosed => (-1, Some(libc::EINVAL)),
            IoError::Os(errno) => (-1, Some(errno)),
            IoError::Library(code) => (-(code.code() as isize), None),
            IoError::Device(error) => (-(error.hip_error as isize), None),
        }
    }
}

impl From<OpError> for IoError {
    fn from(code: OpError) -> IoError {
        IoError::Library(code)
    }
}

impl From<Error> for IoError {
    fn from(error: Error) -> IoError {
        if error.code == OpError::HipDriverError {
            IoError::Device(DeviceError::new(error.hip_error, "device error"))
        } else {
            IoError::Library(error.code)
        }
    }
}

impl fmt::Display for IoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IoError::DriverClosed => f.write_str("the hipFile driver is not open"),
            IoError::Os(errno) => write!(f, "{}", std::io::Error::from_raw_os_error(*errno)),
            IoError::Library(code) => code.fmt(f),
            IoError::Device(error) => error.fmt(f),
        }
    }
}

impl std::error::Error for IoError {}
