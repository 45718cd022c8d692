//! The engine's own device memory on CUDA — the slots of reads copied on the user's
//! stream (`HIPFILE_STREAM_COPY_SLOTS=device`) and the engine streams' scratch — mapped
//! through virtual memory management (`cuMemCreate` + `cuMemMap`, read-write for its
//! device) with the engine context current, or allocated in the engine context
//! (`cuMemAlloc`) where the driver lacks that or `HIPFILE_CUDA_ENGINE_MEMORY=context`.
//!
//! Why mapped: `benches/probes/slot_copy_probe.cu` on an H100, 8 application streams each
//! copying a 16 MiB slot into its buffer at once, device → device on the stream: out of
//! `cuMemAlloc` memory of the engine context 404 µs per copy (480 µs while the engine's
//! host → device copies ran); out of mapped memory 51 µs under the same load (16 streams:
//! 528 against 82 µs). Mapped memory belongs to no context; `cuMemAlloc` memory of
//! another context seems to take CUDA's slower path for copies between contexts (not
//! documented; measured only). Each allocation is rounded up to the driver's allocation
//! granularity (typically 2 MiB), which the small slot sizes' 1 MiB slabs and the 1 MiB
//! scratches of the engine's streams pay.

use std::collections::BTreeMap;
use std::ffi::c_int;
use std::sync::Mutex;

use super::sys::*;
use super::{CudaDevice, result};
use crate::device::DeviceError;

/// Mapped allocations of the process: base address → bytes mapped (the request rounded up
/// to the allocation granularity). What is not here came from `cuMemAlloc`.
static MAPPED: Mutex<BTreeMap<CUdeviceptr, usize>> = Mutex::new(BTreeMap::new());

/// How the engine's device memory is allocated (`HIPFILE_CUDA_ENGINE_MEMORY`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum EngineMemory {
    /// Mapped through virtual memory management (the default), `cuMemAlloc` where that
    /// fails.
    Mapped,
    /// `cuMemAlloc` in the engine context (`context`; diagnostic: the slower copies out of
    /// it above).
    Context,
}

impl EngineMemory {
    pub(super) fn from_environment() -> EngineMemory {
        EngineMemory::parse(std::env::var("HIPFILE_CUDA_ENGINE_MEMORY").ok().as_deref())
    }

    /// The setting's value (`None`: unset); an unknown value warns and keeps the default.
    fn parse(value: Option<&str>) -> EngineMemory {
        match value.map(str::trim) {
            Some("context") => EngineMemory::Context,
            Some("mapped" | "") | None => EngineMemory::Mapped,
            Some(other) => {
                log::warn!(
                    "HIPFILE_CUDA_ENGINE_MEMORY={other:?} is neither \"mapped\" nor \"context\": mapped"
                );
                EngineMemory::Mapped
            }
        }
    }
}

impl CudaDevice {
    /// `len_bytes` of device memory on `device_ordinal` for the engine. The engine context
    /// of that device is current (the caller's contract; it owns `cuMemAlloc` memory).
    pub(super) fn alloc_engine_memory(
        &self,
        device_ordinal: u32,
        len_bytes: usize,
    ) -> Result<CUdeviceptr, DeviceError> {
        if self.engine_memory == EngineMemory::Mapped {
            match self.alloc_mapped(device_ordinal, len_bytes) {
                Ok(address) => return Ok(address),
                Err(error) => log::debug!(
                    "engine device memory: mapping {len_bytes} bytes failed ({error}); cuMemAlloc"
                ),
            }
        }
        result::mem_alloc(&self.api, len_bytes)
    }

    fn alloc_mapped(
        &self,
        device_ordinal: u32,
        len_bytes: usize,
    ) -> Result<CUdeviceptr, DeviceError> {
        let ordinal = c_int::try_from(device_ordinal)
            .map_err(|_| DeviceError::new(DeviceError::HIP_ERROR_INVALID_DEVICE, "ordinal"))?;
        let prop = result::device_allocation_prop(ordinal);
        let granularity = result::mem_get_allocation_granularity(&self.api, &prop)?.max(1);
        let bytes = len_bytes.max(1).div_ceil(granularity) * granularity;
        let handle = result::mem_create(&self.api, bytes, &prop)?;
        let mapped = self.map_handle(handle, bytes, granularity, ordinal);
        // The mapping holds the memory until it is unmapped; the handle is not needed.
        // SAFETY: created above, released once.
        let _ = unsafe { result::mem_release(&self.api, handle) };
        let address = mapped?;
        MAPPED.lock().unwrap_or_else(|p| p.into_inner()).insert(address, bytes);
        Ok(address)
    }

    /// Reserves an address range for `handle`'s `bytes`, maps it and lets `ordinal` read
    /// and write it; on failure nothing stays reserved or mapped.
    fn map_handle(
        &self,
        handle: CUmemGenericAllocationHandle,
        bytes: usize,
        granularity: usize,
        ordinal: c_int,
    ) -> Result<CUdeviceptr, DeviceError> {
        let address = result::mem_address_reserve(&self.api, bytes, granularity)?;
        // SAFETY: reserved just now and unmapped; the handle holds `bytes`.
        let mapped = unsafe { result::mem_map(&self.api, address, bytes, handle) };
        let usable = match mapped {
            // SAFETY: mapped just now.
            Ok(()) => match unsafe {
                result::mem_set_access_read_write(&self.api, address, bytes, ordinal)
            } {
                Ok(()) => Ok(()),
                Err(error) => {
                    // SAFETY: mapped above; nothing queued uses it yet.
                    let _ = unsafe { result::mem_unmap(&self.api, address, bytes) };
                    Err(error)
                }
            },
            Err(error) => Err(error),
        };
        if let Err(error) = usable {
            // SAFETY: reserved above, nothing mapped in it any more.
            let _ = unsafe { result::mem_address_free(&self.api, address, bytes) };
            return Err(error);
        }
        Ok(address)
    }

    /// Frees memory of [`CudaDevice::alloc_engine_memory`] (unmapped and its range freed,
    /// or `cuMemFree` in the current context: the engine context of its device).
    ///
    /// # Safety
    /// `address` came from `alloc_engine_memory`, is freed once, and no queued work uses it.
    pub(super) unsafe fn free_engine_memory(&self, address: CUdeviceptr) {
        let mapped = MAPPED.lock().unwrap_or_else(|p| p.into_inner()).remove(&address);
        match mapped {
            Some(bytes) => {
                // SAFETY: the caller's contract: mapped by us, idle, freed once.
                let _ = unsafe { result::mem_unmap(&self.api, address, bytes) };
                // SAFETY: as above; nothing is mapped in the range now.
                let _ = unsafe { result::mem_address_free(&self.api, address, bytes) };
            }
            None => {
                // SAFETY: the caller's contract: from cuMemAlloc, idle, freed once.
                let _ = unsafe { result::mem_free_status(&self.api, address) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::EngineMemory;

    #[test]
    fn the_engine_memory_setting_picks_context_only_when_asked() {
        assert_eq!(EngineMemory::parse(None), EngineMemory::Mapped);
        assert_eq!(EngineMemory::parse(Some("mapped")), EngineMemory::Mapped);
        assert_eq!(EngineMemory::parse(Some(" context ")), EngineMemory::Context);
        assert_eq!(EngineMemory::parse(Some("")), EngineMemory::Mapped);
        assert_eq!(EngineMemory::parse(Some("cuMemAlloc")), EngineMemory::Mapped);
    }
}
