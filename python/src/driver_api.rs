//! The synchronous C API, one call per function: driver, handle and buffer
//! registration, `read` / `write`. Handles are the integers C callers hold as
//! `hipFileHandle_t`; device memory is named by its address (an `int`).

use std::os::fd::RawFd;

use hipfile_core::{Direction, OpError, RawIo};
use hipfile_runtime::HandleId;
use hipfile_runtime::file::DirectPolicy;
use pyo3::prelude::*;

use crate::context::driver;
use crate::errors::{from_error, from_io_error};

/// `hipFileDriverOpen`: increments the driver's use count.
///
/// # Errors
/// `HipFileError(5029)` when the selected device is unavailable.
#[pyfunction]
pub fn driver_open(py: Python<'_>) -> PyResult<()> {
    driver(py)?.open();
    Ok(())
}

/// `hipFileDriverClose`: decrements the use count; at 0 every file handle and buffer is
/// deregistered.
///
/// # Errors
/// `HipFileError(5001)` when the use count is already 0.
#[pyfunction]
pub fn driver_close(py: Python<'_>) -> PyResult<()> {
    driver(py)?.close().map_err(|e| from_error(py, e))
}

/// `hipFileUseCount`: the driver's use count.
///
/// # Errors
/// As [`driver_open`].
#[pyfunction]
pub fn use_count(py: Python<'_>) -> PyResult<i64> {
    Ok(driver(py)?.use_count())
}

/// `hipFileGetOpErrorString`: hipFile's message for a code.
#[pyfunction]
pub fn get_op_error_string(code: i32) -> &'static str {
    OpError::message_for_code(code)
}

/// `hipFileHandleRegister` for a file descriptor: returns the handle (an `int`, never 0).
/// `direct`: `None` follows the process-wide policy (`HIPFILE_ODIRECT`), `True` asks for
/// O_DIRECT on this file, `False` keeps it in the page cache.
///
/// # Errors
/// `HipFileError` 5028 (already registered), 5008 (not a regular file or block device),
/// 5030 (a descriptor the driver cannot inspect, e.g. closed or negative).
#[pyfunction]
#[pyo3(signature = (fd, direct = None))]
pub fn handle_register(py: Python<'_>, fd: RawFd, direct: Option<bool>) -> PyResult<usize> {
    let driver = driver(py)?;
    let registered = match direct {
        None => driver.handle_register(fd),
        Some(true) => driver.handle_register_with(fd, DirectPolicy::On),
        Some(false) => driver.handle_register_with(fd, DirectPolicy::Off),
    };
    registered.map(|id| id.0).map_err(|error| from_error(py, error))
}

/// Why this path (`hipfileExplainPath`): one line per decision of the path I/O on `fh`
/// (a registered handle, or `None`) into `dev_ptr` (device memory, or `None`) takes.
///
/// # Errors
/// `HipFileError` 5027 for an unknown handle.
#[pyfunction]
#[pyo3(signature = (fh = None, dev_ptr = None))]
pub fn explain_path(py: Python<'_>, fh: Option<usize>, dev_ptr: Option<u64>) -> PyResult<String> {
    let driver = driver(py)?;
    let handle = fh.map(HandleId);
    match driver.explain_path(handle, dev_ptr) {
        Ok(explanation) => Ok(explanation.to_string()),
        Err(error) => Err(from_error(py, error)),
    }
}

/// `hipFileHandleDeregister`: unknown handles are ignored, as in hipFile.
///
/// # Errors
/// As [`driver_open`].
#[pyfunction]
pub fn handle_deregister(py: Python<'_>, fh: usize) -> PyResult<()> {
    driver(py)?.handle_deregister(HandleId(fh));
    Ok(())
}

/// Bytes a registered handle moved so far: `(direct_read, buffered_read,
/// direct_written, buffered_written)` (O_DIRECT or page cache).
///
/// # Errors
/// `HipFileError(5027)` for an unknown handle.
#[pyfunction]
pub fn handle_counters(py: Python<'_>, fh: usize) -> PyResult<(u64, u64, u64, u64)> {
    let file = driver(py)?.file(HandleId(fh)).map_err(|e| from_error(py, e))?;
    let c = file.counters();
    Ok((
        c.direct_read_bytes,
        c.buffered_read_bytes,
        c.direct_written_bytes,
        c.buffered_written_bytes,
    ))
}

/// `hipFileBufRegister(devPtr_base, length, flags)`.
///
/// # Errors
/// `HipFileError` 5022 (address 0), 5013 (not device memory), 5014 (range beyond the
/// allocation), 5023 (already registered), 5011 (device error).
#[pyfunction]
#[pyo3(signature = (dev_ptr, size, flags = 0))]
pub fn buf_register(py: Python<'_>, dev_ptr: u64, size: u64, flags: i32) -> PyResult<()> {
    driver(py)?.buf_register(dev_ptr, size, flags).map_err(|e| from_error(py, e))
}

/// `hipFileBufDeregister(devPtr_base)`.
///
/// # Errors
/// `HipFileError` 5024 (not registered), 5006 (driver closed), 5030 (I/O in flight).
#[pyfunction]
pub fn buf_deregister(py: Python<'_>, dev_ptr: u64) -> PyResult<()> {
    driver(py)?.buf_deregister(dev_ptr).map_err(|e| from_error(py, e))
}

/// `hipFileRead(fh, devPtr_base, size, file_offset, devPtr_offset)`: returns the byte
/// count (short only at end of file). The GIL is released while the data moves.
///
/// # Errors
/// `HipFileError` (5027 unknown handle, 5013 not device memory, 5022 invalid arguments,
/// 5001 driver not open, ...); `OSError` for the errno of a failed read.
#[pyfunction]
#[pyo3(signature = (fh, dev_ptr, size, file_offset = 0, buf_offset = 0))]
pub fn read(
    py: Python<'_>,
    fh: usize,
    dev_ptr: u64,
    size: u64,
    file_offset: i64,
    buf_offset: i64,
) -> PyResult<usize> {
    let raw =
        RawIo { size_bytes: size, file_offset_bytes: file_offset, buffer_offset_bytes: buf_offset };
    io_sync(py, Direction::Read, fh, dev_ptr, raw)
}

/// `hipFileWrite(fh, devPtr_base, size, file_offset, devPtr_offset)`: returns the byte
/// count. The GIL is released while the data moves.
///
/// # Errors
/// As [`read`].
#[pyfunction]
#[pyo3(signature = (fh, dev_ptr, size, file_offset = 0, buf_offset = 0))]
pub fn write(
    py: Python<'_>,
    fh: usize,
    dev_ptr: u64,
    size: u64,
    file_offset: i64,
    buf_offset: i64,
) -> PyResult<usize> {
    let raw =
        RawIo { size_bytes: size, file_offset_bytes: file_offset, buffer_offset_bytes: buf_offset };
    io_sync(py, Direction::Write, fh, dev_ptr, raw)
}

fn io_sync(
    py: Python<'_>,
    direction: Direction,
    fh: usize,
    dev_ptr: u64,
    raw: RawIo,
) -> PyResult<usize> {
    let driver = driver(py)?;
    let result = py.allow_threads(|| driver.io_sync(direction, HandleId(fh), dev_ptr, raw));
    result.map_err(|e| from_io_error(py, e))
}
