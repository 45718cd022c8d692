//! `hipFileReadAsync` / `hipFileWriteAsync` on a stream. The C API takes pointers to
//! the size, offsets and result, which must stay valid until the stream has passed the
//! op — the trap users hit most. Here every op owns its cells
//! ([`hipfile_runtime::AsyncParams`], kept alive by the runtime's op too) and returns a
//! [`StreamFuture`] holding them and the buffer's owner.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use hipfile_core::Direction;
use hipfile_runtime::device::StreamHandle;
use hipfile_runtime::{AsyncParams, Driver, HandleId};
use pyo3::prelude::*;

use crate::context::driver;
use crate::errors::{from_device_error, from_error, from_negative_result};

/// An async read or write submitted on a stream. `result()` waits for the stream and
/// returns the byte count or raises. Until then the op's cells may be changed through
/// `size`, `file_offset` and `buf_offset` when the stream was registered without the
/// matching `HIPFILE_STREAM_FIXED_*` flag. Dropping an unfinished future waits for the
/// stream, so the buffer it holds is never freed under the op.
#[pyclass(module = "hipfile._native")]
pub struct StreamFuture {
    driver: Arc<Driver>,
    params: Arc<AsyncParams>,
    stream: StreamHandle,
    /// The buffer's owner (a `DeviceBuffer`, a tensor, ...), kept until the stream
    /// passed the op.
    owner: Option<PyObject>,
    finished: bool,
}

impl StreamFuture {
    fn wait_for_stream(&mut self, py: Python<'_>) -> PyResult<()> {
        if self.finished {
            return Ok(());
        }
        let (driver, stream) = (&self.driver, self.stream);
        let synced = py.allow_threads(|| driver.device().synchronize_stream(stream));
        synced.map_err(|e| from_device_error(py, e))?;
        self.finished = true;
        self.owner = None;
        Ok(())
    }
}

#[pymethods]
impl StreamFuture {
    /// Waits (GIL released) until the stream has passed the op; returns the bytes moved.
    ///
    /// # Errors
    /// `HipFileError` for a library error of the op (e.g. 5022 for cells changed to
    /// invalid values), `OSError` for its errno, `HipFileError(5011)` for a stream error.
    fn result(&mut self, py: Python<'_>) -> PyResult<usize> {
        self.wait_for_stream(py)?;
        let bytes = self.params.bytes_done.load(Ordering::SeqCst) as i64;
        usize::try_from(bytes).map_err(|_| from_negative_result(py, bytes))
    }

    /// Whether the stream has passed the op (non-blocking: the stream has no work left,
    /// `cuStreamQuery` / `hipStreamQuery`; work queued on it after the op counts too).
    ///
    /// # Errors
    /// `HipFileError(5011)` for a stream error.
    fn done(&mut self, py: Python<'_>) -> PyResult<bool> {
        if self.finished {
            return Ok(true);
        }
        let passed = self.driver.device().stream_done(self.stream);
        if passed.map_err(|e| from_device_error(py, e))? {
            self.finished = true;
            self.owner = None;
        }
        Ok(self.finished)
    }

    /// The raw result cell (`*bytes_p`): 0 until the op published, then the byte count,
    /// `-errno` or `-code`. Read it after `result()` or a stream synchronisation.
    #[getter]
    fn bytes_done(&self) -> isize {
        self.params.bytes_done.load(Ordering::SeqCst)
    }

    /// The size cell (`*size_p`); a size changed before arm may shrink, never grow
    /// (the op then fails with 5022).
    #[getter]
    fn get_size(&self) -> usize {
        self.params.size_bytes.load(Ordering::SeqCst)
    }

    #[setter]
    fn set_size(&self, size: usize) {
        self.params.size_bytes.store(size, Ordering::SeqCst);
    }

    /// The file offset cell (`*file_offset_p`).
    #[getter]
    fn get_file_offset(&self) -> i64 {
        self.params.file_offset_bytes.load(Ordering::SeqCst)
    }

    #[setter]
    fn set_file_offset(&self, offset: i64) {
        self.params.file_offset_bytes.store(offset, Ordering::SeqCst);
    }

    /// The buffer offset cell (`*buffer_offset_p`).
    #[getter]
    fn get_buf_offset(&self) -> i64 {
        self.params.buffer_offset_bytes.load(Ordering::SeqCst)
    }

    #[setter]
    fn set_buf_offset(&self, offset: i64) {
        self.params.buffer_offset_bytes.store(offset, Ordering::SeqCst);
    }

    /// The stream handle.
    #[getter]
    fn stream(&self) -> usize {
        self.stream.0
    }

    fn __repr__(&self) -> String {
        format!(
            "StreamFuture(stream={}, done={}, bytes_done={})",
            self.stream.0,
            if self.finished { "True" } else { "False" },
            self.params.bytes_done.load(Ordering::SeqCst)
        )
    }
}

impl Drop for StreamFuture {
    fn drop(&mut self) {
        if self.finished || self.stream == StreamHandle::NULL {
            return;
        }
        let (driver, stream) = (&self.driver, self.stream);
        // A destructor cannot raise: a stream error here was the op's to report.
        Python::with_gil(|py| {
            let _ = py.allow_threads(|| driver.device().synchronize_stream(stream));
        });
    }
}

/// The arguments of one async submission.
struct Submission {
    direction: Direction,
    fh: usize,
    dev_ptr: u64,
    size: usize,
    file_offset: i64,
    buf_offset: i64,
    stream: usize,
}

fn submit(py: Python<'_>, sub: Submission, owner: Option<PyObject>) -> PyResult<StreamFuture> {
    let driver = Arc::clone(driver(py)?);
    let params = AsyncParams::new(sub.size, sub.file_offset);
    params.buffer_offset_bytes.store(sub.buf_offset, Ordering::SeqCst);
    let stream = StreamHandle(sub.stream);
    let submitted = py.allow_threads(|| {
        driver.submit_async(sub.direction, HandleId(sub.fh), sub.dev_ptr, &params, stream)
    });
    submitted.map_err(|e| from_error(py, e))?;
    Ok(StreamFuture { driver, params, stream, owner, finished: false })
}

/// `hipFileReadAsync` on `stream` (an int; 0 is the NULL stream, on which the read runs
/// at once): returns a [`StreamFuture`] owning the size/offset/result cells. `owner` is
/// kept alive until the stream has passed the op (pass the buffer's Python object).
///
/// # Errors
/// `HipFileError` when the submission is refused (5027, 5013, 5022, ...).
#[pyfunction]
#[pyo3(signature = (fh, dev_ptr, size, file_offset = 0, buf_offset = 0, stream = 0, owner = None))]
#[allow(clippy::too_many_arguments, reason = "the C call's arguments, plus the owner")]
pub fn read_async(
    py: Python<'_>,
    fh: usize,
    dev_ptr: u64,
    size: usize,
    file_offset: i64,
    buf_offset: i64,
    stream: usize,
    owner: Option<PyObject>,
) -> PyResult<StreamFuture> {
    let direction = Direction::Read;
    let sub = Submission { direction, fh, dev_ptr, size, file_offset, buf_offset, stream };
    submit(py, sub, owner)
}

/// `hipFileWriteAsync`: as [`read_async`], from device memory to the file.
///
/// # Errors
/// As [`read_async`].
#[pyfunction]
#[pyo3(signature = (fh, dev_ptr, size, file_offset = 0, buf_offset = 0, stream = 0, owner = None))]
#[allow(clippy::too_many_arguments, reason = "the C call's arguments, plus the owner")]
pub fn write_async(
    py: Python<'_>,
    fh: usize,
    dev_ptr: u64,
    size: usize,
    file_offset: i64,
    buf_offset: i64,
    stream: usize,
    owner: Option<PyObject>,
) -> PyResult<StreamFuture> {
    let direction = Direction::Write;
    let sub = Submission { direction, fh, dev_ptr, size, file_offset, buf_offset, stream };
    submit(py, sub, owner)
}
