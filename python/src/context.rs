//! The process-wide runtime the bindings act on: the same driver as `libhipfile`'s C API
//! (`hipfile_runtime::driver::process::runtime`), built on first use from the `HIPFILE_*`
//! environment. Importing the module touches none of it, so it never fails at import.

use std::sync::Arc;

use hipfile_core::OpError;
use hipfile_runtime::Driver;
use hipfile_runtime::device::cpu::CpuDevice;
use hipfile_runtime::driver::process::{self, ProcessRuntime};
use pyo3::prelude::*;

use crate::errors::{from_error, op_error};

/// The runtime, selecting the device on the first call.
///
/// # Errors
/// `hipFileDeviceNotFound` (5029) when the device `HIPFILE_DEVICE` names is unavailable.
pub fn runtime(py: Python<'_>) -> PyResult<&'static ProcessRuntime> {
    process::runtime().map_err(|error| from_error(py, error))
}

/// The process-wide driver.
///
/// # Errors
/// As [`runtime`].
pub fn driver(py: Python<'_>) -> PyResult<&'static Arc<Driver>> {
    runtime(py).map(|runtime| &runtime.driver)
}

/// The driver's device when it is the in-process `cpu` device.
///
/// # Errors
/// As [`runtime`]; `hipFileDeviceNotSupported` (5009) on any other device, whose memory
/// and streams the application allocates itself (torch, cupy).
pub fn cpu_device(py: Python<'_>, what: &str) -> PyResult<&'static Arc<CpuDevice>> {
    let runtime = runtime(py)?;
    runtime.cpu.as_ref().ok_or_else(|| {
        let kind = runtime.driver.device().kind().name();
        let detail = format!(
            "{what} is provided on the cpu device only (this process uses the {kind} device: \
             allocate with torch or cupy instead)"
        );
        op_error(py, OpError::DeviceNotSupported, 0, Some(&detail))
    })
}

/// The name of the driver's device backend: `"cpu"`, `"cuda"` or `"rocm"`.
///
/// # Errors
/// As [`runtime`].
#[pyfunction]
pub fn device_kind(py: Python<'_>) -> PyResult<&'static str> {
    Ok(driver(py)?.device().kind().name())
}

/// Number of devices of the driver's backend.
///
/// # Errors
/// As [`runtime`].
#[pyfunction]
pub fn device_count(py: Python<'_>) -> PyResult<u32> {
    Ok(driver(py)?.device().device_count())
}
