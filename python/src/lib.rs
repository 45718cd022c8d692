//! `hipfile._native`: the Python extension of hipfile-rs, on top of `hipfile-runtime`.
//!
//! One Python function per hipFile C call (driver, handle and buffer registration,
//! `read` / `write`, async I/O on streams, batches), acting on the process-wide driver
//! the C API uses, plus what Python needs around them: cpu-device memory
//! ([`memory::DeviceMemory`]) and streams ([`streams::Stream`]), and futures owning the
//! async cells ([`async_api::StreamFuture`]). The pure-Python package `hipfile` builds
//! the high-level API (`hipfile.File`, `hipfile.safetensors`) on this module.
//!
//! Importing touches no device: the driver and its device are chosen on the first call
//! that needs them (`HIPFILE_DEVICE`, `auto` falling back to the cpu device), so the
//! module imports on machines without CUDA or HIP.

use pyo3::prelude::*;

mod async_api;
mod batch_api;
mod context;
mod driver_api;
mod errors;
mod memory;
mod params_api;
mod streams;

/// The extension module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("HipFileError", py.get_type::<errors::HipFileError>())?;
    m.add_class::<memory::DeviceMemory>()?;
    m.add_class::<streams::Stream>()?;
    m.add_class::<streams::StreamGate>()?;
    m.add_class::<async_api::StreamFuture>()?;
    m.add_class::<batch_api::Batch>()?;
    m.add_function(wrap_pyfunction!(context::device_kind, m)?)?;
    m.add_function(wrap_pyfunction!(context::device_count, m)?)?;
    m.add_function(wrap_pyfunction!(driver_api::driver_open, m)?)?;
    m.add_function(wrap_pyfunction!(driver_api::driver_close, m)?)?;
    m.add_function(wrap_pyfunction!(driver_api::use_count, m)?)?;
    m.add_function(wrap_pyfunction!(driver_api::get_op_error_string, m)?)?;
    m.add_function(wrap_pyfunction!(driver_api::handle_register, m)?)?;
    m.add_function(wrap_pyfunction!(driver_api::explain_path, m)?)?;
    m.add_function(wrap_pyfunction!(driver_api::handle_deregister, m)?)?;
    m.add_function(wrap_pyfunction!(driver_api::handle_counters, m)?)?;
    m.add_function(wrap_pyfunction!(driver_api::buf_register, m)?)?;
    m.add_function(wrap_pyfunction!(driver_api::buf_deregister, m)?)?;
    m.add_function(wrap_pyfunction!(driver_api::read, m)?)?;
    m.add_function(wrap_pyfunction!(driver_api::write, m)?)?;
    m.add_function(wrap_pyfunction!(streams::stream_register, m)?)?;
    m.add_function(wrap_pyfunction!(streams::stream_deregister, m)?)?;
    m.add_function(wrap_pyfunction!(streams::stream_synchronize, m)?)?;
    m.add_function(wrap_pyfunction!(async_api::read_async, m)?)?;
    m.add_function(wrap_pyfunction!(async_api::write_async, m)?)?;
    m.add_function(wrap_pyfunction!(params_api::get_parameter_size_t, m)?)?;
    m.add_function(wrap_pyfunction!(params_api::set_parameter_size_t, m)?)?;
    m.add_function(wrap_pyfunction!(params_api::get_parameter_bool, m)?)?;
    m.add_function(wrap_pyfunction!(params_api::set_parameter_bool, m)?)?;
    m.add_function(wrap_pyfunction!(params_api::get_parameter_string, m)?)?;
    m.add_function(wrap_pyfunction!(params_api::set_parameter_string, m)?)?;
    m.add_function(wrap_pyfunction!(params_api::driver_get_properties, m)?)?;
    m.add_function(wrap_pyfunction!(params_api::driver_set_poll_mode, m)?)?;
    m.add_function(wrap_pyfunction!(params_api::driver_set_max_direct_io_size, m)?)?;
    m.add_function(wrap_pyfunction!(params_api::driver_set_max_cache_size, m)?)?;
    m.add_function(wrap_pyfunction!(params_api::driver_set_max_pinned_mem_size, m)?)?;
    m.add("VERSION", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
