//! [`DeviceInfo`] on the CUDA device: kind, device count, pointer and stream queries, the
//! hardware-queue report, support for stream memory operations.

use crate::device::{DeviceError, DeviceInfo, DeviceKind, MemoryType, PointerInfo, StreamHandle};

use super::sys::*;
use super::{CudaDevice, result};

impl DeviceInfo for CudaDevice {
    fn kind(&self) -> DeviceKind {
        DeviceKind::Cuda
    }

    fn device_count(&self) -> u32 {
        self.contexts.len() as u32
    }

    fn pointer_info(&self, ptr: u64) -> Result<PointerInfo, DeviceError> {
        self.ensure_any_current()?;
        let (memory_type, is_managed, ordinal, start, size) =
            result::pointer_get_attributes(&self.api, ptr)?;
        let known = memory_type != 0 || is_managed != 0;
        let memory_type = match (is_managed != 0, memory_type) {
            (true, _) => MemoryType::Managed,
            (false, CU_MEMORYTYPE_DEVICE) => MemoryType::Device,
            (false, CU_MEMORYTYPE_ARRAY) => MemoryType::Array,
            (false, CU_MEMORYTYPE_UNIFIED) => MemoryType::Managed,
            _ => MemoryType::Host,
        };
        Ok(PointerInfo {
            memory_type,
            device_ordinal: ordinal.max(0) as u32,
            allocation_base: if known { start } else { 0 },
            allocation_len_bytes: if known { size as u64 } else { 0 },
        })
    }

    fn stream_device(&self, stream: StreamHandle) -> Result<u32, DeviceError> {
        self.ensure_any_current()?;
        let context = if stream == StreamHandle::NULL {
            result::ctx_get_current(&self.api)?
        } else {
            // SAFETY: a user stream handle; an invalid stream yields an error code.
            unsafe { result::stream_get_ctx(&self.api, stream.0 as CUstream) }?
        };
        self.ordinal_of_context(context)
    }

    fn hardware_queue_setting(&self) -> Option<String> {
        let isolation: Vec<&str> = (0..self.contexts.len() as u32)
            .map(|ordinal| {
                if self.engine_isolated(ordinal) { "own context" } else { "SHARED primary context" }
            })
            .collect();
        Some(format!(
            "{}; engine copies per device: {}",
            self.hardware_queues.describe(),
            isolation.join(", ")
        ))
    }

    fn supports_stream_memops(&self, device_ordinal: u32) -> bool {
        self.memops.get(device_ordinal as usize).copied().unwrap_or(false)
    }
}
