//! x
use pyo3::prelude::*;
/// x
#[pymodule]
fn _native(_m: &Bound<'_, PyModule>) -> PyResult<()> { Ok(()) }
