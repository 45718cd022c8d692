//! `hipFileOpError_t`: every code hipFile defines, with its exact number and message.

use core::fmt;

/// The base of hipFile's error numbering (`HIPFILE_BASE_ERR`).
pub const BASE_ERR: i32 = 5000;

macro_rules! op_errors {
    ($( $(#[$doc:meta])* $variant:ident = $value:literal => $message:literal, )*) => {
        /// A `hipFileOpError_t` value. The discriminants are the C values and never change.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(i32)]
        pub enum OpError {
            $( $(#[$doc])* $variant = $value, )*
        }

        impl OpError {
            /// Every code, in numeric order.
            pub const ALL: &'static [OpError] = &[ $( OpError::$variant, )* ];

            /// The code for `value`, or `None` when hipFile defines no such code (5000,
            /// 5021, 5032 and anything outside `0 | 5001..=5039` are not codes).
            pub const fn from_code(value: i32) -> Option<OpError> {
                match value {
                    $( $value => Some(OpError::$variant), )*
                    _ => None,
                }
            }

            /// The message `hipFileGetOpErrorString` returns for this code.
            pub const fn message(self) -> &'static str {
                match self {
                    $( OpError::$variant => $message, )*
                }
            }

            /// The C name of the enumerator (`hipFileInvalidValue`, …).
            pub const fn c_name(self) -> &'static str {
                match self {
                    $( OpError::$variant => concat!("hipFile", stringify!($variant)), )*
                }
            }
        }
    };
}

op_errors! {
    /// `hipFileSuccess`.
    Success = 0 => "hipFile success",
    /// `hipFileDriverNotInitialized`.
    DriverNotInitialized = 5001 => "GPU IO driver is not loaded",
    /// `hipFileDriverInvalidProps`.
    DriverInvalidProps = 5002 => "Invalid GPU IO driver property provided",
    /// `hipFileDriverUnsupportedLimit`.
    DriverUnsupportedLimit = 5003 => "GPU IO Driver property value is unsupported",
    /// `hipFileDriverVersionMismatch`.
    DriverVersionMismatch = 5004 => "hipFile version does not match GPU IO driver version",
    /// `hipFileDriverVersionReadError`.
    DriverVersionReadError = 5005 => "Unable to read the GPU IO driver version",
    /// `hipFileDriverClosing`.
    DriverClosing = 5006 => "GPU IO driver is closing and not accepting new requests",
    /// `hipFilePlatformNotSupported`.
    PlatformNotSupported = 5007 => "hipFile is not supported on the current platform",
    /// `hipFileIONotSupported`.
    IONotSupported = 5008 => "hipFile is not supported on the selected file",
    /// `hipFileDeviceNotSupported`.
    DeviceNotSupported = 5009 => "The selected GPU does not support hipFile",
    /// `hipFileDriverError`.
    DriverError = 5010 => "GPU IO driver error",
    /// `hipFileHipDriverError`: inspect `hip_drv_err`.
    HipDriverError = 5011 => "GPU driver error: Inspect hip_drv_err for more details",
    /// `hipFileHipPointerInvalid`.
    HipPointerInvalid = 5012 => "Invalid GPU pointer",
    /// `hipFileHipMemoryTypeInvalid`.
    HipMemoryTypeInvalid = 5013 => "Memory type backing pointer is incompatible with hipFile",
    /// `hipFileHipPointerRangeError`.
    HipPointerRangeError = 5014 => "Pointer range exceeds allocated memory region",
    /// `hipFileHipContextMismatch`.
    HipContextMismatch = 5015 => "GPU driver context mismatch",
    /// `hipFileInvalidMappingSize`.
    InvalidMappingSize = 5016 => "Accessing memory beyond pinned memory buffer",
    /// `hipFileInvalidMappingRange`.
    InvalidMappingRange = 5017 => "Accessing memory beyond mapped memory region",
    /// `hipFileInvalidFileType`.
    InvalidFileType = 5018 => "Unsupported file type",
    /// `hipFileInvalidFileOpenFlag`.
    InvalidFileOpenFlag = 5019 => "Unsupported file open flags",
    /// `hipFileDIONotSet`.
    DIONotSet = 5020 => "O_DIRECT flag not set",
    /// `hipFileInvalidValue`.
    InvalidValue = 5022 => "One or more arguments have an invalid value",
    /// `hipFileMemoryAlreadyRegistered`.
    MemoryAlreadyRegistered = 5023 => "Device pointer is already registered",
    /// `hipFileMemoryNotRegistered`.
    MemoryNotRegistered = 5024 => "Device pointer is not registered",
    /// `hipFilePermissionDenied`.
    PermissionDenied = 5025 => "Permission error on device or file access",
    /// `hipFileDriverAlreadyOpen`.
    DriverAlreadyOpen = 5026 => "GPU IO driver is already open",
    /// `hipFileHandleNotRegistered`.
    HandleNotRegistered = 5027 => "File handle for GPU IO is not registered",
    /// `hipFileHandleAlreadyRegistered`.
    HandleAlreadyRegistered = 5028 => "File handle for GPU IO is already registered",
    /// `hipFileDeviceNotFound`.
    DeviceNotFound = 5029 => "Selected device not found",
    /// `hipFileInternalError`: the catch-all.
    InternalError = 5030 => "Internal GPU IO library error",
    /// `hipFileGetNewFDFailed`.
    GetNewFDFailed = 5031 => "Unable to obtain a new file descriptor",
    /// `hipFileDriverSetupError`.
    DriverSetupError = 5033 => "GPU IO Driver initialization error",
    /// `hipFileIODisabled`.
    IODisabled = 5034 => "GPU IO config file prohibits GPU IO on specified file",
    /// `hipFileBatchSubmitFailed`.
    BatchSubmitFailed = 5035 => "Failed to submit request for batch operation",
    /// `hipFileGPUMemoryPinningFailed`.
    GPUMemoryPinningFailed = 5036 => "Failed to allocated pinned device memory",
    /// `hipFileBatchFull`.
    BatchFull = 5037 => "Batch operation queue is full",
    /// `hipFileAsyncNotSupported`.
    AsyncNotSupported = 5038 => "hipFile async IO is not supported",
    /// `hipFileIOMaxError`: marks the largest code.
    IOMaxError = 5039 => "Internal flag to mark largest hipFile error code",
}

/// The string `hipFileGetOpErrorString` returns for values that are not codes.
pub const UNKNOWN_ERROR_MESSAGE: &str = "Unknown hipFile error";

impl OpError {
    /// The C value.
    pub const fn code(self) -> i32 {
        self as i32
    }

    /// `true` for `hipFileSuccess` only.
    pub const fn is_success(self) -> bool {
        matches!(self, OpError::Success)
    }

    /// `true` for every code except `hipFileSuccess`.
    pub const fn is_error(self) -> bool {
        !self.is_success()
    }

    /// `true` for the catch-all `hipFileInternalError`, which says "a bug or an
    /// unexpected condition inside the library" rather than "your input is wrong".
    pub const fn is_internal(self) -> bool {
        matches!(self, OpError::InternalError)
    }

    /// The value hipFile stores in `*bytes_p` or returns from `hipFileRead` for this
    /// error: the negated code (`-5022`, …).
    pub const fn negated(self) -> i64 {
        -(self as i64)
    }

    /// `hipFileGetOpErrorString` for any integer: the message, or
    /// [`UNKNOWN_ERROR_MESSAGE`].
    pub const fn message_for_code(value: i32) -> &'static str {
        match OpError::from_code(value) {
            Some(code) => code.message(),
            None => UNKNOWN_ERROR_MESSAGE,
        }
    }
}

impl fmt::Display for OpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}): {}", self.c_name(), self.code(), self.message())
    }
}

impl core::error::Error for OpError {}

/// `IS_HIPFILE_ERR(x)`: `abs(x) > HIPFILE_BASE_ERR`, computed without overflow.
pub const fn is_hipfile_err(value: i64) -> bool {
    value.unsigned_abs() > BASE_ERR as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_match_the_c_enum() {
        assert_eq!(OpError::Success.code(), 0);
        assert_eq!(OpError::DriverNotInitialized.code(), 5001);
        assert_eq!(OpError::DIONotSet.code(), 5020);
        assert_eq!(OpError::InvalidValue.code(), 5022);
        assert_eq!(OpError::InternalError.code(), 5030);
        assert_eq!(OpError::GetNewFDFailed.code(), 5031);
        assert_eq!(OpError::DriverSetupError.code(), 5033);
        assert_eq!(OpError::IOMaxError.code(), 5039);
        assert_eq!(OpError::ALL.len(), 38);
    }

    #[test]
    fn from_code_round_trips_every_code() {
        for &code in OpError::ALL {
            assert_eq!(OpError::from_code(code.code()), Some(code));
        }
    }

    #[test]
    fn unused_and_out_of_range_values_are_not_codes() {
        for value in [5000, 5021, 5032, 5040, -5022, 1, -1, 4999, i32::MIN, i32::MAX] {
            assert_eq!(OpError::from_code(value), None, "{value}");
            assert_eq!(OpError::message_for_code(value), UNKNOWN_ERROR_MESSAGE);
        }
    }

    #[test]
    fn every_value_in_the_range_except_the_gaps_is_a_code() {
        for value in 5001..=5039 {
            let expected = !matches!(value, 5021 | 5032);
            assert_eq!(OpError::from_code(value).is_some(), expected, "{value}");
        }
    }

    #[test]
    fn messages_and_names() {
        assert_eq!(OpError::Success.message(), "hipFile success");
        assert_eq!(OpError::InvalidValue.message(), "One or more arguments have an invalid value");
        assert_eq!(OpError::InvalidValue.c_name(), "hipFileInvalidValue");
        assert_eq!(OpError::IONotSupported.c_name(), "hipFileIONotSupported");
        assert_eq!(OpError::message_for_code(5027), OpError::HandleNotRegistered.message());
    }

    #[test]
    fn success_and_internal_are_distinguished() {
        assert!(OpError::Success.is_success() && !OpError::Success.is_error());
        assert!(OpError::InternalError.is_internal() && OpError::InternalError.is_error());
        assert!(!OpError::InvalidValue.is_internal());
        assert_eq!(OpError::InvalidValue.negated(), -5022);
    }

    #[test]
    fn is_hipfile_err_matches_the_macro() {
        assert!(is_hipfile_err(-5022));
        assert!(is_hipfile_err(5001));
        assert!(!is_hipfile_err(5000));
        assert!(!is_hipfile_err(-1));
        assert!(!is_hipfile_err(4096));
        assert!(is_hipfile_err(i64::MIN));
    }
}
