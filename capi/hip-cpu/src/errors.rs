//! `hipGetErrorName` / `hipGetErrorString`: the `hipError_t` values of HIP 5.2 with
//! their names and descriptions.

use core::ffi::{CStr, c_int};

/// `(value, name, description)` of every `hipError_t` this runtime may return, and the
/// common others.
const ERRORS: &[(c_int, &CStr, &CStr)] = &[
    (0, c"hipSuccess", c"no error"),
    (1, c"hipErrorInvalidValue", c"invalid argument"),
    (2, c"hipErrorOutOfMemory", c"out of memory"),
    (3, c"hipErrorNotInitialized", c"initialization error"),
    (4, c"hipErrorDeinitialized", c"driver shutting down"),
    (17, c"hipErrorInvalidDevicePointer", c"invalid device pointer"),
    (21, c"hipErrorInvalidMemcpyDirection", c"invalid copy direction for memcpy"),
    (35, c"hipErrorInsufficientDriver", c"driver version is insufficient for runtime version"),
    (100, c"hipErrorNoDevice", c"no ROCm-capable device is detected"),
    (101, c"hipErrorInvalidDevice", c"invalid device ordinal"),
    (201, c"hipErrorInvalidContext", c"invalid device context"),
    (400, c"hipErrorInvalidHandle", c"invalid resource handle"),
    (500, c"hipErrorNotFound", c"named symbol not found"),
    (600, c"hipErrorNotReady", c"device not ready"),
    (700, c"hipErrorIllegalAddress", c"an illegal memory access was encountered"),
    (709, c"hipErrorContextIsDestroyed", c"context is destroyed"),
    (801, c"hipErrorNotSupported", c"operation not supported"),
    (999, c"hipErrorUnknown", c"unknown error"),
];

/// The name of `error` ("hipErrorUnknown" for values not in the table).
pub fn name(error: c_int) -> &'static CStr {
    ERRORS.iter().find(|(value, _, _)| *value == error).map_or(c"hipErrorUnknown", |e| e.1)
}

/// The description of `error` ("unknown error" for values not in the table).
pub fn description(error: c_int) -> &'static CStr {
    ERRORS.iter().find(|(value, _, _)| *value == error).map_or(c"unknown error", |e| e.2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_descriptions() {
        assert_eq!(name(0), c"hipSuccess");
        assert_eq!(name(600), c"hipErrorNotReady");
        assert_eq!(description(1), c"invalid argument");
        assert_eq!(name(12345), c"hipErrorUnknown");
        assert_eq!(description(-7), c"unknown error");
    }
}
