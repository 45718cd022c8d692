//! [`DeviceError`], what every device call returns on failure, and the device error a
//! test's fault plan injects at the library's calls into the device layer.

use core::fmt;

use crate::fault::{self, Site};

/// An error from a device runtime: the backend's raw code and a description.
///
/// `hip_error` is the `hipError_t` value a C caller sees in `hipFileError_t::hip_drv_err`
/// (the backend maps its native code to HIP's numbering).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceError {
    /// The `hipError_t` number.
    pub hip_error: i32,
    /// What failed.
    pub what: &'static str,
}

impl DeviceError {
    /// `hipErrorInvalidValue`.
    pub const HIP_ERROR_INVALID_VALUE: i32 = 1;
    /// `hipErrorOutOfMemory`.
    pub const HIP_ERROR_OUT_OF_MEMORY: i32 = 2;
    /// `hipErrorNotInitialized`.
    pub const HIP_ERROR_NOT_INITIALIZED: i32 = 3;
    /// `hipErrorInvalidDevice`.
    pub const HIP_ERROR_INVALID_DEVICE: i32 = 101;
    /// `hipErrorInvalidResourceHandle` (unknown stream or event).
    pub const HIP_ERROR_INVALID_HANDLE: i32 = 400;
    /// `hipErrorNotReady`.
    pub const HIP_ERROR_NOT_READY: i32 = 600;
    /// `hipErrorNotSupported`.
    pub const HIP_ERROR_NOT_SUPPORTED: i32 = 801;
    /// `hipErrorUnknown`.
    pub const HIP_ERROR_UNKNOWN: i32 = 999;

    /// Builds an error.
    pub const fn new(hip_error: i32, what: &'static str) -> Self {
        DeviceError { hip_error, what }
    }
}

impl fmt::Display for DeviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (hipError {})", self.what, self.hip_error)
    }
}

impl std::error::Error for DeviceError {}

/// The device error the installed fault plan injects at this call into the device layer
/// (HIP's invalid value; out of memory at [`Site::PinnedAlloc`]), if the plan fails
/// this call; `Ok` otherwise (always, while no plan is installed; after the delay of a
/// [`fault::Fault::Delay`]).
pub(crate) fn injected_fault(site: Site) -> Result<(), DeviceError> {
    match fault::at(site) {
        None => Ok(()),
        // The call goes through, that much later.
        Some(fault::Fault::Delay(delay)) => {
            std::thread::sleep(delay);
            Ok(())
        }
        Some(_) if site == Site::PinnedAlloc => {
            Err(DeviceError::new(DeviceError::HIP_ERROR_OUT_OF_MEMORY, "injected fault"))
        }
        Some(_) => Err(DeviceError::new(DeviceError::HIP_ERROR_INVALID_VALUE, "injected fault")),
    }
}
