//! hipFile's parameter and driver-property calls (`hipFileGet/SetParameter*`,
//! `hipFileDriverGetProperties`, `hipFileDriverSet*`), one function each, over the
//! runtime's [`hipfile_runtime::parameters`] (the same mapping the C API uses). Keys are
//! the C enums' integers (`hipfile.SizeTConfigParameter` & co. name them).

use hipfile_runtime::Error;
use hipfile_runtime::config::Config;
use hipfile_runtime::parameters::{
    API_VERSION, BoolParameter, DriverProperties, SizeParameter, StringParameter,
};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::context::driver;
use crate::errors::from_error;

/// Applies `change` to the driver's configuration (refused once the engine runs or a
/// file is registered).
fn configure(
    py: Python<'_>,
    change: impl FnOnce(&mut Config) -> Result<(), Error>,
) -> PyResult<()> {
    driver(py)?.configure(change).map_err(|e| from_error(py, e))
}

/// `hipFileGetParameterSizeT`: the value in force, in hipFile's unit.
///
/// # Errors
/// `HipFileError(5022)` for a key hipFile does not define.
#[pyfunction]
pub fn get_parameter_size_t(py: Python<'_>, param: i32) -> PyResult<u64> {
    let key = SizeParameter::from_raw(param).map_err(|e| from_error(py, e))?;
    Ok(key.get(&driver(py)?.config()))
}

/// `hipFileSetParameterSizeT`: applies the value.
///
/// # Errors
/// `HipFileError(5022)`: unknown key, out of range, or another value for a read-only key;
/// `HipFileError(5026)` once the engine runs or a file is registered.
#[pyfunction]
pub fn set_parameter_size_t(py: Python<'_>, param: i32, value: u64) -> PyResult<()> {
    let key = SizeParameter::from_raw(param).map_err(|e| from_error(py, e))?;
    configure(py, |config| key.set(config, value))
}

/// `hipFileGetParameterBool`.
///
/// # Errors
/// As [`get_parameter_size_t`].
#[pyfunction]
pub fn get_parameter_bool(py: Python<'_>, param: i32) -> PyResult<bool> {
    let key = BoolParameter::from_raw(param).map_err(|e| from_error(py, e))?;
    Ok(key.get(&driver(py)?.config()))
}

/// `hipFileSetParameterBool`.
///
/// # Errors
/// As [`set_parameter_size_t`].
#[pyfunction]
pub fn set_parameter_bool(py: Python<'_>, param: i32, value: bool) -> PyResult<()> {
    let key = BoolParameter::from_raw(param).map_err(|e| from_error(py, e))?;
    configure(py, |config| key.set(config, value))
}

/// `hipFileGetParameterString`.
///
/// # Errors
/// `HipFileError(5022)` for a key hipFile does not define.
#[pyfunction]
pub fn get_parameter_string(py: Python<'_>, param: i32) -> PyResult<&'static str> {
    let key = StringParameter::from_raw(param).map_err(|e| from_error(py, e))?;
    hipfile_runtime::logging::install_stderr_logger();
    Ok(key.get())
}

/// `hipFileSetParameterString`: `LoggingLevel` takes a level name (any time); the file
/// and directory keys only their own value (empty).
///
/// # Errors
/// `HipFileError(5022)` for an unknown key or value.
#[pyfunction]
pub fn set_parameter_string(py: Python<'_>, param: i32, value: &str) -> PyResult<()> {
    let key = StringParameter::from_raw(param).map_err(|e| from_error(py, e))?;
    hipfile_runtime::logging::install_stderr_logger();
    key.set(value).map_err(|e| from_error(py, e))
}

/// `hipFileDriverGetProperties`, as a dict with the fields of `hipFileDriverProps_t`
/// (`nvfs` flattened): versions, poll threshold and max direct I/O size (KiB), status,
/// control and feature flags, cache and pinned sizes (KiB), batch limits.
///
/// # Errors
/// `HipFileError(5001)` when the driver is not open (as the C call).
#[pyfunction]
pub fn driver_get_properties(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let driver = driver(py)?;
    if driver.use_count() <= 0 {
        return Err(from_error(py, Error::new(hipfile_core::OpError::DriverNotInitialized)));
    }
    let p = DriverProperties::of(&driver.config());
    let props = PyDict::new(py);
    props.set_item("major_version", API_VERSION.0)?;
    props.set_item("minor_version", API_VERSION.1)?;
    props.set_item("poll_thresh_size_kb", p.poll_threshold_kib)?;
    props.set_item("max_direct_io_size_kb", p.max_direct_io_kib)?;
    // No file system is served by a direct (peer-to-peer) path.
    props.set_item("driver_status_flags", 0u32)?;
    props.set_item("driver_control_flags", p.control_flags)?;
    props.set_item("feature_flags", p.feature_flags)?;
    props.set_item("max_device_cache_size_kb", p.max_device_cache_kib)?;
    props.set_item("per_buffer_cache_size_kb", p.per_buffer_cache_kib)?;
    props.set_item("max_device_pinned_mem_size_kb", p.max_pinned_kib)?;
    props.set_item("max_batch_io_count", p.max_batch_entries)?;
    props.set_item("max_batch_io_timeout_msecs", p.max_batch_timeout_ms)?;
    Ok(props)
}

/// `hipFileDriverSetPollMode`: `poll` must be true and the threshold (KiB) the staging
/// chunk's size (one-chunk sync requests always complete on the caller's thread).
///
/// # Errors
/// `HipFileError(5022)` otherwise; `HipFileError(5026)` once the engine runs or a file
/// is registered.
#[pyfunction]
pub fn driver_set_poll_mode(
    py: Python<'_>,
    poll: bool,
    poll_threshold_size_kb: u64,
) -> PyResult<()> {
    configure(py, |config| {
        BoolParameter::PropertiesUsePollMode.set(config, poll)?;
        SizeParameter::PollThresholdSizeKb.set(config, poll_threshold_size_kb)
    })
}

/// `hipFileDriverSetMaxDirectIOSize`: the staging chunk, KiB (a power of two, 4..=65536).
///
/// # Errors
/// As [`driver_set_poll_mode`].
#[pyfunction]
pub fn driver_set_max_direct_io_size(py: Python<'_>, size_kb: u64) -> PyResult<()> {
    configure(py, |config| SizeParameter::PropertiesMaxDirectIoSizeKb.set(config, size_kb))
}

/// `hipFileDriverSetMaxCacheSize`: all executors' staging arenas together, KiB.
///
/// # Errors
/// As [`driver_set_poll_mode`].
#[pyfunction]
pub fn driver_set_max_cache_size(py: Python<'_>, size_kb: u64) -> PyResult<()> {
    configure(py, |config| SizeParameter::PropertiesMaxDeviceCacheSizeKb.set(config, size_kb))
}

/// `hipFileDriverSetMaxPinnedMemSize`: the pinned memory the engine may hold, KiB.
///
/// # Errors
/// As [`driver_set_poll_mode`].
#[pyfunction]
pub fn driver_set_max_pinned_mem_size(py: Python<'_>, size_kb: u64) -> PyResult<()> {
    configure(py, |config| SizeParameter::PropertiesMaxDevicePinnedMemSizeKb.set(config, size_kb))
}
