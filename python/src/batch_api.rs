//! Batch I/O (`hipFileBatchIOSetUp` / `Submit` / `GetStatus` / `Cancel` / `Destroy`)
//! over [`hipfile_runtime::batch::Batch`]. Cookies may be any Python object: the batch
//! keeps them in a table and hands each back with its entry's status.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use hipfile_core::{Direction, OpError};
use hipfile_runtime::HandleId;
use hipfile_runtime::batch::{Batch as RuntimeBatch, BatchEntry};
use pyo3::prelude::*;

use crate::context::driver;
use crate::errors::{from_error, op_error};

/// `hipFileOpcode_t` values.
const OPCODE_READ: i32 = 0;
const OPCODE_WRITE: i32 = 1;

/// One entry as Python passes it: `(opcode, fh, dev_ptr, file_offset, size, buf_offset,
/// cookie)`, opcode 0 (`READ`) or 1 (`WRITE`).
type EntryTuple = (i32, usize, u64, i64, u64, i64, PyObject);

/// A batch context (`hipFileBatchHandle_t`) for up to `capacity` (1..=128) entries.
/// Entries are not stream-ordered; each is reported once its data is in device memory
/// or the file. Destroying it (or dropping it) cancels what has not finished.
#[pyclass(module = "hipfile._native")]
pub struct Batch {
    inner: Option<RuntimeBatch>,
    cookies: Mutex<CookieTable>,
}

/// Python cookies by the runtime's integer cookie.
#[derive(Default)]
struct CookieTable {
    next: usize,
    objects: HashMap<usize, PyObject>,
}

impl Batch {
    fn runtime(&self, py: Python<'_>) -> PyResult<&RuntimeBatch> {
        let detail = "the batch was destroyed";
        self.inner.as_ref().ok_or_else(|| op_error(py, OpError::InvalidValue, 0, Some(detail)))
    }

    fn cookies(&self) -> std::sync::MutexGuard<'_, CookieTable> {
        self.cookies.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn entry(&self, py: Python<'_>, tuple: EntryTuple) -> PyResult<(BatchEntry, PyObject)> {
        let (opcode, fh, dev_ptr, file_offset, size, buf_offset, cookie) = tuple;
        let direction = match opcode {
            OPCODE_READ => Direction::Read,
            OPCODE_WRITE => Direction::Write,
            _ => {
                return Err(op_error(
                    py,
                    OpError::InvalidValue,
                    0,
                    Some("opcode must be 0 (read) or 1 (write)"),
                ));
            }
        };
        let entry = BatchEntry {
            direction,
            handle: HandleId(fh),
            buffer_base_addr: dev_ptr,
            buffer_offset_bytes: buf_offset,
            file_offset_bytes: file_offset,
            size_bytes: size,
            cookie: 0,
        };
        Ok((entry, cookie))
    }
}

#[pymethods]
impl Batch {
    /// `hipFileBatchIOSetUp(capacity)`.
    ///
    /// # Errors
    /// `HipFileError(5022)` for a capacity of 0 or above 128.
    #[new]
    fn new(py: Python<'_>, capacity: u32) -> PyResult<Batch> {
        let driver = std::sync::Arc::clone(driver(py)?);
        let inner = RuntimeBatch::new(driver, capacity).map_err(|e| from_error(py, e))?;
        Ok(Batch { inner: Some(inner), cookies: Mutex::default() })
    }

    /// `hipFileBatchIOSubmit`: every entry is checked first; all are accepted or none.
    ///
    /// # Errors
    /// `HipFileError` 5001 (driver closed), 5027 (unknown handle), 5022 (bad offsets,
    /// range or too many entries), 5013 (not device memory), ...
    fn submit(&self, py: Python<'_>, entries: Vec<EntryTuple>) -> PyResult<()> {
        let batch = self.runtime(py)?;
        let mut parsed = Vec::with_capacity(entries.len());
        let mut cookies = Vec::with_capacity(entries.len());
        let mut table = self.cookies();
        for tuple in entries {
            let (mut entry, cookie) = self.entry(py, tuple)?;
            entry.cookie = table.next.wrapping_add(parsed.len());
            parsed.push(entry);
            cookies.push(cookie);
        }
        batch.submit(&parsed).map_err(|e| from_error(py, e))?;
        for (entry, cookie) in parsed.iter().zip(cookies) {
            table.objects.insert(entry.cookie, cookie);
        }
        table.next = table.next.wrapping_add(parsed.len());
        Ok(())
    }

    /// `hipFileBatchIOGetStatus`: waits (GIL released) until `min_nr` entries finished or
    /// `timeout` seconds passed (None: no limit), then returns up to `max_nr` of them as
    /// `(cookie, status, result)`; status 16 (`COMPLETE`, result = bytes) or 64
    /// (`FAILED`, result = -errno or -code). Each entry is reported once.
    ///
    /// # Errors
    /// `HipFileError(5022)` after `destroy()` or for a negative timeout.
    #[pyo3(signature = (min_nr, max_nr = None, timeout = None))]
    fn status(
        &self,
        py: Python<'_>,
        min_nr: usize,
        max_nr: Option<usize>,
        timeout: Option<f64>,
    ) -> PyResult<Vec<(PyObject, i32, i64)>> {
        let batch = self.runtime(py)?;
        let timeout = timeout.map(Duration::try_from_secs_f64).transpose().map_err(|_| {
            op_error(py, OpError::InvalidValue, 0, Some("timeout must be a non-negative number"))
        })?;
        let max_nr = max_nr.unwrap_or(batch.capacity());
        let events = py.allow_threads(|| batch.status(min_nr, max_nr, timeout));
        let mut table = self.cookies();
        let reported = events.into_iter().map(|event| {
            let cookie = table.objects.remove(&event.cookie).unwrap_or_else(|| py.None());
            (cookie, event.status as i32, event.result)
        });
        Ok(reported.collect())
    }

    /// `hipFileBatchIOCancel`: entries that have not started never will; returns (GIL
    /// released) once none is moving data. The batch is empty afterwards.
    ///
    /// # Errors
    /// `HipFileError(5022)` after `destroy()`.
    fn cancel(&self, py: Python<'_>) -> PyResult<()> {
        let batch = self.runtime(py)?;
        py.allow_threads(|| batch.cancel());
        self.cookies().objects.clear();
        Ok(())
    }

    /// Entries submitted and not yet reported.
    ///
    /// # Errors
    /// `HipFileError(5022)` after `destroy()`.
    fn outstanding(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.runtime(py)?.outstanding())
    }

    /// `hipFileBatchIODestroy`: cancels (waiting, GIL released, for entries moving data)
    /// and frees the batch; later calls raise. Destroying twice is a no-op.
    fn destroy(&mut self, py: Python<'_>) {
        if let Some(batch) = self.inner.take() {
            py.allow_threads(move || drop(batch));
        }
        self.cookies().objects.clear();
    }
}
