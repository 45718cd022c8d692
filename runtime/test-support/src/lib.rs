//! Support shared by `hipfile-runtime`'s integration tests, as a library crate so that
//! every test crate uses what it needs and nothing is compiled as dead code per crate.
//!
//! - [`rig`]: a driver over the backend `HIPFILE_DEVICE` selects (`cpu` by default,
//!   `cuda` on an NVIDIA machine), stream and memory helpers, hang guards, children.
//! - [`cpu_rig`]: drivers over a `cpu` device of their own, for the synchronous-I/O tests
//!   that reach into the device (gates, host-visible device memory).
//! - [`page_cache`]: dropping a file's cached pages, for tests of the O_DIRECT path.
//! - [`proc_mem`]: a file io_uring refuses (`/proc/self/mem` over memory of the test).
//! - [`raw`]: the one way tests spell a request's size and offsets.
//! - [`let_file_changes_settle`]: the wait before a prefetch that must stay fresh.

pub mod cpu_rig;
pub mod page_cache;
pub mod proc_mem;
pub mod rig;

use std::time::Duration;

use hipfile_core::RawIo;

/// A request's size and offsets, as `hipFileRead`/`hipFileWrite` take them. The offsets
/// are any integer that fits `hoff_t` (`i64`): negative ones are the invalid inputs some
/// tests need, `usize` ones the offsets most tests compute.
///
/// # Panics
/// When an offset does not fit in `i64`.
pub fn raw(
    size_bytes: usize,
    file_offset_bytes: impl TryInto<i64>,
    buffer_offset_bytes: impl TryInto<i64>,
) -> RawIo {
    RawIo {
        size_bytes: size_bytes as u64,
        file_offset_bytes: file_offset_bytes
            .try_into()
            .unwrap_or_else(|_| panic!("offset beyond i64")),
        buffer_offset_bytes: buffer_offset_bytes
            .try_into()
            .unwrap_or_else(|_| panic!("offset beyond i64")),
    }
}

/// How long a test waits after writing a file before a prefetch of it that must not be
/// redone: the runtime takes a file changed less than 30 ms before a prefetch started as
/// *unsettled* (`ChangeStamp` in runtime/src/file/change.rs; the kernel's coarse change
/// times may not show a later change) and reads it again when the stream reaches the
/// read. The file's change times never run ahead of the clock, so any wait past 30 ms
/// settles it; 50 ms leaves room.
pub const FILE_SETTLE: Duration = Duration::from_millis(50);

/// Waits [`FILE_SETTLE`]: after it, a prefetch of a file written before the call stays
/// fresh (is not read again in stream order) unless the file changes again.
pub fn let_file_changes_settle() {
    std::thread::sleep(FILE_SETTLE);
}
