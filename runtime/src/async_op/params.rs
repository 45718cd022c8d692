//! Where an async op's parameters come from and where its result goes: a
//! [`ParamSource`]. The C API implements it over hipFile's pointers (`capi`), the safe
//! API by [`AsyncParams`]; the runtime touches caller memory only through it.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicIsize, AtomicUsize, Ordering};

use hipfile_core::RawIo;

/// The parameters and the result slot of one async op.
///
/// The op reads the parameters at submission and, for those its stream's flags do not
/// fix, again when the stream reaches it ([`ParamSource::read`]); it stores `0` at
/// submission and the result once the stream has passed it ([`ParamSource::publish`]).
///
/// # Safety
/// Implementors guarantee that every method may be called from any thread for as long
/// as the op holds the source (it holds it until it has published or was abandoned):
/// memory behind a raw pointer stays valid that long (hipFile's contract for the C
/// pointers).
pub unsafe trait ParamSource: Send + Sync {
    /// The size, file offset and buffer offset now; `None` when they cannot be read (a
    /// NULL pointer: the submission is refused with `InvalidValue`).
    fn read(&self) -> Option<RawIo>;

    /// The result slot's current value (`*bytes_p`).
    fn published(&self) -> isize;

    /// Stores `bytes` in the result slot (`*bytes_p`: 0, a byte count, `-errno` or
    /// `-code`).
    fn publish(&self, bytes: isize);
}

/// Parameters of an async op owned by the caller through an `Arc`, for the safe API:
/// the op keeps them alive until it has published its result in `bytes_done`.
#[derive(Debug, Default)]
pub struct AsyncParams {
    /// Bytes to move (read when the op binds, unless the stream fixes it).
    pub size_bytes: AtomicUsize,
    /// File offset.
    pub file_offset_bytes: AtomicI64,
    /// Offset inside the buffer.
    pub buffer_offset_bytes: AtomicI64,
    /// 0 at submission; the byte count, `-errno` or `-code` once the stream passes the op.
    pub bytes_done: AtomicIsize,
}

impl AsyncParams {
    /// Parameters for `size_bytes` at `file_offset_bytes`, buffer offset 0.
    pub fn new(size_bytes: usize, file_offset_bytes: i64) -> Arc<AsyncParams> {
        Arc::new(AsyncParams {
            size_bytes: AtomicUsize::new(size_bytes),
            file_offset_bytes: AtomicI64::new(file_offset_bytes),
            buffer_offset_bytes: AtomicI64::new(0),
            bytes_done: AtomicIsize::new(0),
        })
    }
}

// SAFETY: plain atomics owned through the op's `Arc`: valid on any thread while held.
unsafe impl ParamSource for AsyncParams {
    fn read(&self) -> Option<RawIo> {
        Some(RawIo {
            size_bytes: self.size_bytes.load(Ordering::SeqCst) as u64,
            file_offset_bytes: self.file_offset_bytes.load(Ordering::SeqCst),
            buffer_offset_bytes: self.buffer_offset_bytes.load(Ordering::SeqCst),
        })
    }

    fn published(&self) -> isize {
        self.bytes_done.load(Ordering::SeqCst)
    }

    fn publish(&self, bytes: isize) {
        self.bytes_done.store(bytes, Ordering::SeqCst);
    }
}
