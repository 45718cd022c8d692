//! The driver's synchronous I/O: `hipFileRead` / `hipFileWrite`, and the move-now body
//! they share with async calls on the NULL stream.

use std::sync::Arc;

use hipfile_core::{Direction, OpError, Outcome, RawIo, StreamFlags, ValidIo, validate};

use super::{Driver, HandleId};
use crate::buffer::ResolvedBuffer;
use crate::device::DeviceError;
use crate::engine::SyncRequest;
use crate::error::{Error, IoError};
use crate::file::FileHandle;

impl Driver {
    /// `hipFileRead` / `hipFileWrite`: moves up to `size_bytes` (clamped to the max I/O
    /// size) between the file and device memory and returns the byte count (short at
    /// end of file for reads).
    ///
    /// # Errors
    /// See [`IoError`]; the order of checks is hipFile's: driver open, handle, buffer,
    /// arguments, then the I/O.
    pub fn io_sync(
        &self,
        direction: Direction,
        handle: HandleId,
        buffer_addr: u64,
        raw: RawIo,
    ) -> Result<usize, IoError> {
        if !self.is_open() {
            return Err(IoError::DriverClosed);
        }
        let file = self.file(handle)?;
        let buffer = self.resolve_buffer(buffer_addr)?;
        if !self.compat_mode_allowed() {
            return Err(IoError::Library(OpError::InternalError));
        }
        let io = validate(raw, buffer.span, StreamFlags::empty(), self.page_size_bytes)?;
        if io.is_empty() {
            return Ok(0);
        }
        let started = std::time::Instant::now();
        let moved = self.move_now(direction, file, &io, &buffer)?;
        crate::stats::global().record(
            buffer.device_ordinal,
            crate::stats::Api::Sync,
            direction,
            io.size_bytes(),
            moved.0,
            started.elapsed(),
        );
        match moved {
            (Outcome::Bytes(n), _) => Ok(n as usize),
            (Outcome::OsError(errno), _) => Err(IoError::Os(errno)),
            (Outcome::Library(OpError::HipDriverError), Some(error)) => Err(IoError::Device(error)),
            (Outcome::Library(code), _) => Err(IoError::Library(code)),
        }
    }

    /// Moves a validated range now, on the engine, and waits for it: the body of the
    /// sync calls and of async calls on the NULL stream.
    ///
    /// # Errors
    /// The engine could not start.
    pub(crate) fn move_now(
        &self,
        direction: Direction,
        file: Arc<FileHandle>,
        io: &ValidIo,
        buffer: &ResolvedBuffer,
    ) -> Result<(Outcome, Option<DeviceError>), Error> {
        let engine = self.engine()?;
        let _buffer_use = buffer.begin_use();
        if direction == Direction::Write {
            crate::async_op::prefetch::note_write(&file);
        }
        let request = SyncRequest {
            file,
            direction,
            file_offset_bytes: io.file_offset_bytes(),
            device_addr: io.device_addr(),
            len_bytes: io.size_bytes(),
            device_ordinal: buffer.device_ordinal,
            executor_hint: self.next_executor(),
        };
        Ok(engine.run_sync(request))
    }
}
