//! Streams: `hipFileStreamRegister` / `hipFileStreamDeregister`, stream
//! synchronisation, and `hipfile.Stream`, a stream of the `cpu` device (on a GPU the
//! application's torch / cupy streams are used instead).

use std::sync::Arc;

use hipfile_runtime::device::cpu::CpuDevice;
use hipfile_runtime::device::user::UserDevice;
use hipfile_runtime::device::{StreamHandle, StreamMemoryOps};
use std::sync::Mutex;

use hipfile_runtime::device::cpu::StreamGate as CpuStreamGate;
use pyo3::prelude::*;

use crate::context::{cpu_device, driver};
use crate::errors::{from_device_error, from_error};

/// `hipFileStreamRegister(stream, flags)`; `flags` are the `HIPFILE_STREAM_FIXED_*` bits.
///
/// # Errors
/// `HipFileError` 5022 (already registered, unknown flag bits), 5011 (unknown stream).
#[pyfunction]
#[pyo3(signature = (stream, flags = 0))]
pub fn stream_register(py: Python<'_>, stream: usize, flags: u32) -> PyResult<()> {
    driver(py)?.stream_register(StreamHandle(stream), flags).map_err(|e| from_error(py, e))
}

/// `hipFileStreamDeregister(stream)`.
///
/// # Errors
/// `HipFileError(5022)` when the stream is not registered.
#[pyfunction]
pub fn stream_deregister(py: Python<'_>, stream: usize) -> PyResult<()> {
    driver(py)?.stream_deregister(StreamHandle(stream)).map_err(|e| from_error(py, e))
}

/// Waits (GIL released) until all work enqueued on `stream` so far has completed.
///
/// # Errors
/// `HipFileError(5011)` for an unknown stream or an asynchronous device error.
#[pyfunction]
pub fn stream_synchronize(py: Python<'_>, stream: usize) -> PyResult<()> {
    let device = driver(py)?.device();
    let result = py.allow_threads(|| device.synchronize_stream(StreamHandle(stream)));
    result.map_err(|e| from_device_error(py, e))
}

/// A stream of the `cpu` device (a worker thread running its work in order), destroyed
/// when the object dies (its queued work still completes).
#[pyclass(module = "hipfile._native", frozen)]
pub struct Stream {
    device: Arc<CpuDevice>,
    handle: StreamHandle,
}

#[pymethods]
impl Stream {
    /// Creates a stream on cpu device `device`.
    ///
    /// # Errors
    /// `HipFileError(5009)` on a GPU device; 5011 for an invalid ordinal.
    #[new]
    #[pyo3(signature = (device = 0))]
    fn new(py: Python<'_>, device: u32) -> PyResult<Stream> {
        let cpu = cpu_device(py, "hipfile.Stream")?;
        let handle = cpu.create_user_stream(device).map_err(|e| from_device_error(py, e))?;
        Ok(Stream { device: Arc::clone(cpu), handle })
    }

    /// The stream handle (`hipStream_t` as an int), as cupy's `Stream.ptr`.
    #[getter]
    fn ptr(&self) -> usize {
        self.handle.0
    }

    /// Waits (GIL released) until the stream's work so far has completed.
    ///
    /// # Errors
    /// `HipFileError(5011)` for an asynchronous device error.
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        let result = py.allow_threads(|| self.device.synchronize_stream(self.handle));
        result.map_err(|e| from_device_error(py, e))
    }

    /// Holds the stream at this point until the returned gate is released (or dies):
    /// work enqueued after it waits. For tests of stream ordering on the cpu device.
    ///
    /// # Errors
    /// `HipFileError(5011)` for a device error.
    fn pause(&self, py: Python<'_>) -> PyResult<StreamGate> {
        let gate = self.device.pause_stream(self.handle).map_err(|e| from_device_error(py, e))?;
        Ok(StreamGate { gate: Mutex::new(Some(gate)) })
    }

    fn __int__(&self) -> usize {
        self.handle.0
    }

    fn __repr__(&self) -> String {
        format!("Stream(ptr={})", self.handle.0)
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // Fails only for an unknown handle, which ours cannot be.
        let _ = self.device.destroy_user_stream(self.handle);
    }
}

/// A point where a cpu-device stream is held (from `Stream.pause()`); `release()` lets
/// the stream continue. Dropping it releases it, so a stream is never left hanging.
#[pyclass(module = "hipfile._native", frozen)]
pub struct StreamGate {
    gate: Mutex<Option<CpuStreamGate>>,
}

#[pymethods]
impl StreamGate {
    /// Lets the stream continue; releasing twice is a no-op.
    fn release(&self) {
        let gate = self.gate.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(gate) = gate {
            gate.release();
        }
    }
}
