//! Device memory of the `cpu` device for Python (`hipfile.empty`): the driver accepts
//! only device memory of its own device, and on the cpu device only this allocator
//! makes some. The memory is host memory, so Python reads it through the buffer
//! protocol (the `hipfile.DeviceBuffer` wrapper in `_memory.py`).

use std::sync::Arc;

use hipfile_runtime::device::cpu::CpuDevice;
use pyo3::prelude::*;

use crate::context::cpu_device;
use crate::errors::from_device_error;

/// One allocation of cpu-device memory, zero-filled, 4096-aligned; freed when the object
/// dies. Every view of the memory (`hipfile.DeviceBuffer`, numpy arrays over it, async
/// ops in flight) holds a reference to this object, so nothing reaches freed memory.
#[pyclass(module = "hipfile._native", frozen)]
pub struct DeviceMemory {
    device: Arc<CpuDevice>,
    addr: u64,
    len_bytes: usize,
    device_ordinal: u32,
}

#[pymethods]
impl DeviceMemory {
    /// Allocates `nbytes` (at least 1) of device memory on cpu device `device`.
    ///
    /// # Errors
    /// `HipFileError(5009)` on a GPU device; `HipFileError(5011)` with the HIP error for
    /// a size of 0 (hipErrorInvalidValue), an invalid ordinal or no memory.
    #[new]
    #[pyo3(signature = (nbytes, device = 0))]
    fn new(py: Python<'_>, nbytes: usize, device: u32) -> PyResult<DeviceMemory> {
        let cpu = cpu_device(py, "hipfile.empty")?;
        let addr = cpu.malloc_device(device, nbytes).map_err(|e| from_device_error(py, e))?;
        Ok(DeviceMemory {
            device: Arc::clone(cpu),
            addr,
            len_bytes: nbytes,
            device_ordinal: device,
        })
    }

    /// Device address of the first byte.
    #[getter]
    fn ptr(&self) -> u64 {
        self.addr
    }

    /// Length in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.len_bytes
    }

    /// The device ordinal.
    #[getter]
    fn device(&self) -> u32 {
        self.device_ordinal
    }

    fn __len__(&self) -> usize {
        self.len_bytes
    }

    fn __repr__(&self) -> String {
        format!(
            "DeviceMemory(ptr=0x{:x}, nbytes={}, device={})",
            self.addr, self.len_bytes, self.device_ordinal
        )
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        // SAFETY: the allocation is ours and freed once (here). Nothing uses it any
        // more: Python views and in-flight async ops hold a reference to this object, so
        // it only dies after them; sync I/O finishes before its call returns.
        let freed = unsafe { self.device.free_device(self.addr) };
        if let Err(error) = freed {
            // Only a bug could make the base unknown; a destructor cannot raise.
            eprintln!("hipfile: freeing cpu-device memory 0x{:x}: {error}", self.addr);
        }
    }
}
