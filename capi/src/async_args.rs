//! The parameter pointers of `hipFileReadAsync` / `hipFileWriteAsync` as the runtime's
//! [`ParamSource`]: the only place where the async path reads or writes C memory.

use hipfile_core::RawIo;
use hipfile_runtime::ParamSource;

/// The parameter pointers of one async call, as the C caller passed them.
#[derive(Debug)]
pub(crate) struct AsyncArgs {
    size_p: *const usize,
    file_offset_p: *const i64,
    buffer_offset_p: *const i64,
    bytes_p: *mut isize,
}

impl AsyncArgs {
    /// The pointers of one call (any of them may be NULL: the submission then fails
    /// with `hipFileInvalidValue` after the driver-open check, as hipFile's does).
    ///
    /// # Safety
    /// hipFile's contract for the async calls: the non-NULL pointers are valid now; those
    /// not covered by a FIXED stream flag stay valid until the stream reaches the op,
    /// and `bytes_p` until the op has published (the runtime holds these args that long).
    pub(crate) unsafe fn new(
        size_p: *const usize,
        file_offset_p: *const i64,
        buffer_offset_p: *const i64,
        bytes_p: *mut isize,
    ) -> AsyncArgs {
        AsyncArgs { size_p, file_offset_p, buffer_offset_p, bytes_p }
    }

    fn any_null(&self) -> bool {
        self.size_p.is_null()
            || self.file_offset_p.is_null()
            || self.buffer_offset_p.is_null()
            || self.bytes_p.is_null()
    }
}

// SAFETY: the pointers are the C caller's, who guarantees (hipFile's contract, taken on
// by `AsyncArgs::new`) that they stay valid until the op has bound and published; they
// are only accessed with volatile reads and writes, from whichever thread runs the op.
unsafe impl Send for AsyncArgs {}
// SAFETY: as above.
unsafe impl Sync for AsyncArgs {}

// SAFETY: `AsyncArgs::new`'s contract keeps every non-NULL pointer valid as long as the
// op holds the args; `read` refuses NULL ones, and the runtime calls `published` /
// `publish` only after a successful `read` (bytes_p is then not NULL).
unsafe impl ParamSource for AsyncArgs {
    fn read(&self) -> Option<RawIo> {
        if self.any_null() {
            return None;
        }
        // SAFETY: not NULL and valid per the contract; volatile because another thread
        // (the user) may change them until the op binds them.
        unsafe {
            Some(RawIo {
                size_bytes: self.size_p.read_volatile() as u64,
                file_offset_bytes: self.file_offset_p.read_volatile(),
                buffer_offset_bytes: self.buffer_offset_p.read_volatile(),
            })
        }
    }

    fn published(&self) -> isize {
        debug_assert!(!self.bytes_p.is_null());
        // SAFETY: valid per the contract (the runtime reads it only after `read` saw
        // every pointer non-NULL).
        unsafe { self.bytes_p.read_volatile() }
    }

    fn publish(&self, bytes: isize) {
        debug_assert!(!self.bytes_p.is_null());
        // SAFETY: as in `published`.
        unsafe { self.bytes_p.write_volatile(bytes) };
    }
}
