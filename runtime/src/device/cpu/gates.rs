//! Gates: a stream held at a point on a pinned word until released, and host stores to
//! words that wake the streams waiting on them.

use std::sync::Arc;

use crate::device::{DeviceError, MemoryType, StreamHandle};

use super::commands::{Command, GateWord};
use super::memory::{Origin, check_word};
use super::{CpuDevice, read};

/// A point at which a stream is held (see [`CpuDevice::pause_stream`]): work enqueued on
/// the stream after the gate does not start until the gate is released. Dropping an
/// unreleased gate releases it, so a stream is never left hanging.
pub struct StreamGate {
    pub(super) word: Arc<GateWord>,
    released: bool,
}

impl StreamGate {
    /// Opens the gate: the stream proceeds past it (immediately if it is already waiting).
    pub fn release(mut self) {
        self.open();
    }

    /// Device address of the gate word (0 while closed, 1 once released).
    pub fn word_addr(&self) -> u64 {
        self.word.addr
    }

    fn open(&mut self) {
        if !self.released {
            self.released = true;
            self.word.open();
        }
    }
}

impl Drop for StreamGate {
    fn drop(&mut self) {
        self.open();
    }
}

impl core::fmt::Debug for StreamGate {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("StreamGate")
            .field("word_addr", &self.word.addr)
            .field("released", &self.released)
            .finish()
    }
}

impl CpuDevice {
    /// Holds `stream` at this point: enqueues a wait-value on a pinned gate word owned by
    /// the returned [`StreamGate`]; work enqueued afterwards does not start until the gate
    /// is released (or dropped). The word stays allocated while the stream waits on it.
    ///
    /// # Errors
    /// `HIP_ERROR_INVALID_HANDLE` for an unknown stream, `HIP_ERROR_OUT_OF_MEMORY`.
    pub fn pause_stream(&self, stream: StreamHandle) -> Result<StreamGate, DeviceError> {
        let target = self.stream(stream.0)?;
        let memory = &self.shared.memory;
        let addr = memory.allocate(4, MemoryType::Host, 0, Origin::Gate)?;
        let word = Arc::new(GateWord { shared: Arc::clone(&self.shared), addr });
        let keep_alive = Some(Arc::clone(&word));
        target.enqueue(Command::WaitValue { word_addr: addr, value: 1, keep_alive })?;
        Ok(StreamGate { word, released: false })
    }

    /// Atomically stores `value` (Release) to the 32-bit word at `word_addr` and wakes every
    /// stream waiting on a word at once (a plain atomic store from another thread is also
    /// seen, within about 200 µs).
    ///
    /// # Errors
    /// `HIP_ERROR_INVALID_VALUE` if the word is not 4-byte aligned inside tracked memory.
    ///
    /// # Safety
    /// Nothing accesses the word non-atomically during the store (no live `&mut` or
    /// non-atomic read of it).
    pub unsafe fn store_word(&self, word_addr: u64, value: u32) -> Result<(), DeviceError> {
        let map = read(&self.shared.memory.map);
        check_word(&map, word_addr)?;
        // SAFETY: the word is tracked and aligned (checked), the read lock keeps it
        // allocated during the store, and the caller promised only atomic access.
        unsafe { self.shared.store_and_wake(word_addr, value) };
        Ok(())
    }
}
