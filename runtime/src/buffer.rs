//! Device buffers as I/O calls see them: registered (`hipFileBufRegister`) or not, and
//! the count of ops using a registered one (its deregistration is refused meanwhile).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use hipfile_core::BufferSpan;

/// A buffer registered with `Driver::buf_register` (the registry's key is its base
/// address, the exact pointer registered).
#[derive(Debug)]
pub(crate) struct RegisteredBuffer {
    /// Registered length in bytes (may be 0).
    pub(crate) len_bytes: u64,
    /// Device owning the memory.
    pub(crate) device_ordinal: u32,
    pub(crate) in_flight: AtomicUsize,
}

/// A buffer as an I/O call resolved it.
#[derive(Clone, Debug)]
pub(crate) struct ResolvedBuffer {
    /// Base and usable length.
    pub(crate) span: BufferSpan,
    /// Device owning the memory.
    pub(crate) device_ordinal: u32,
    pub(crate) registered: Option<Arc<RegisteredBuffer>>,
}

impl ResolvedBuffer {
    /// Whether the buffer is a registered one.
    pub(crate) fn is_registered(&self) -> bool {
        self.registered.is_some()
    }

    /// Counts an op on a registered buffer until the guard drops (deregistering it in
    /// the meantime is refused with 5030, as hipFile does).
    pub(crate) fn begin_use(&self) -> BufferUse {
        if let Some(buffer) = &self.registered {
            buffer.in_flight.fetch_add(1, Ordering::SeqCst);
        }
        BufferUse(self.registered.clone())
    }
}

/// An op using a registered buffer; see [`ResolvedBuffer::begin_use`].
#[derive(Debug)]
pub(crate) struct BufferUse(Option<Arc<RegisteredBuffer>>);

impl Drop for BufferUse {
    fn drop(&mut self) {
        if let Some(buffer) = &self.0 {
            buffer.in_flight.fetch_sub(1, Ordering::SeqCst);
        }
    }
}
