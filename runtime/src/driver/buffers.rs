//! The driver's buffers: `hipFileBufRegister` / `hipFileBufDeregister` and the
//! resolution of an I/O's buffer pointer (registered, else the allocation holding it).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use hipfile_core::{BufferSpan, OpError};

use super::{Driver, read_lock, write_lock};
use crate::buffer::{RegisteredBuffer, ResolvedBuffer};
use crate::device::{DeviceError, MemoryType, PointerInfo};
use crate::error::Error;

impl Driver {
    /// `hipFileBufRegister`. Opens the driver implicitly first, even when it then fails.
    ///
    /// # Errors
    /// NULL → `InvalidValue`; not device memory → `HipMemoryTypeInvalid`; range beyond
    /// the allocation (or overflowing) → `HipPointerRangeError`; already registered →
    /// `MemoryAlreadyRegistered`; a device error → `HipDriverError` (or `InvalidValue`
    /// for hipErrorInvalidValue, as hipFile).
    pub fn buf_register(&self, base_addr: u64, len_bytes: u64, _flags: i32) -> Result<(), Error> {
        self.ensure_open();
        if base_addr == 0 {
            return Err(Error::new(OpError::InvalidValue));
        }
        let info = self.pointer_info(base_addr)?;
        if info.memory_type != MemoryType::Device {
            return Err(Error::new(OpError::HipMemoryTypeInvalid));
        }
        let allocation_end = info.allocation_base.checked_add(info.allocation_len_bytes);
        let end = base_addr.checked_add(len_bytes);
        if !matches!((end, allocation_end), (Some(e), Some(a)) if e <= a) {
            return Err(Error::new(OpError::HipPointerRangeError));
        }
        let mut buffers = write_lock(&self.buffers);
        if buffers.contains_key(&base_addr) {
            return Err(Error::new(OpError::MemoryAlreadyRegistered));
        }
        let buffer = RegisteredBuffer {
            len_bytes,
            device_ordinal: info.device_ordinal,
            in_flight: AtomicUsize::new(0),
        };
        buffers.insert(base_addr, Arc::new(buffer));
        Ok(())
    }

    /// `hipFileBufDeregister`.
    ///
    /// # Errors
    /// Driver closed → `DriverClosing`; not registered → `MemoryNotRegistered`; ops in
    /// flight on it → `InternalError` (as hipFile).
    pub fn buf_deregister(&self, base_addr: u64) -> Result<(), Error> {
        if !self.is_open() {
            return Err(Error::new(OpError::DriverClosing));
        }
        let mut buffers = write_lock(&self.buffers);
        let buffer = buffers.get(&base_addr).ok_or(Error::new(OpError::MemoryNotRegistered))?;
        if buffer.in_flight.load(Ordering::SeqCst) > 0 {
            return Err(Error::new(OpError::InternalError));
        }
        buffers.remove(&base_addr);
        Ok(())
    }

    /// Resolves an I/O buffer: a registered buffer by its exact base pointer, else the
    /// allocation holding it (usable length: the rest of the allocation).
    ///
    /// # Errors
    /// NULL → `InvalidValue`; not device memory → `HipMemoryTypeInvalid`; a device error
    /// → `HipDriverError`.
    pub(crate) fn resolve_buffer(&self, base_addr: u64) -> Result<ResolvedBuffer, Error> {
        if base_addr == 0 {
            return Err(Error::new(OpError::InvalidValue));
        }
        if let Some(buffer) = read_lock(&self.buffers).get(&base_addr) {
            return Ok(ResolvedBuffer {
                span: BufferSpan { base_addr, len_bytes: buffer.len_bytes },
                device_ordinal: buffer.device_ordinal,
                registered: Some(Arc::clone(buffer)),
            });
        }
        let info = self.pointer_info(base_addr)?;
        if info.memory_type != MemoryType::Device {
            return Err(Error::new(OpError::HipMemoryTypeInvalid));
        }
        let end = info.allocation_base.saturating_add(info.allocation_len_bytes);
        let span = BufferSpan { base_addr, len_bytes: end.saturating_sub(base_addr) };
        Ok(ResolvedBuffer { span, device_ordinal: info.device_ordinal, registered: None })
    }

    fn pointer_info(&self, addr: u64) -> Result<PointerInfo, Error> {
        self.device.pointer_info(addr).map_err(|e| {
            if e.hip_error == DeviceError::HIP_ERROR_INVALID_VALUE {
                Error::new(OpError::InvalidValue)
            } else {
                Error::device(e)
            }
        })
    }
}
