//! The driver's asynchronous calls: stream registration and the submission of async ops
//! (`hipFileReadAsync` / `hipFileWriteAsync`; the op itself: [`crate::async_op`]).

use std::sync::Arc;

use hipfile_core::{Direction, OpError, ValidIo, validate};

use super::{Driver, HandleId};
use crate::async_op::{
    AsyncOp, AsyncParams, EnqueueError, InlineReads, OpHost, ParamSource, Submission,
};
use crate::buffer::ResolvedBuffer;
use crate::device::StreamHandle;
use crate::error::Error;
use crate::file::FileHandle;

impl Driver {
    /// `hipFileStreamRegister`: see [`crate::stream`]. Needs no open driver.
    ///
    /// # Errors
    /// Already registered or unknown flag bits → `InvalidValue`; the device cannot tell
    /// the stream's device → `HipDriverError`.
    pub fn stream_register(&self, stream: StreamHandle, flags: u32) -> Result<(), Error> {
        self.streams().register(&**self.device(), stream, flags)
    }

    /// `hipFileStreamDeregister`. Ops in flight on the stream complete normally.
    ///
    /// # Errors
    /// Not registered → `InvalidValue`.
    pub fn stream_deregister(&self, stream: StreamHandle) -> Result<(), Error> {
        self.streams().deregister(stream)
    }

    /// An async read or write whose parameters and result live in `params`: the op
    /// keeps them alive until it has published `params.bytes_done`. The device buffer
    /// must stay allocated until the stream has passed the op, as for any GPU work.
    ///
    /// # Errors
    /// In hipFile's order: driver closed or a NULL pointer (`InvalidValue`; a closed
    /// driver opens), the file handle, the buffer, the stream, the arguments
    /// (`hipfile_core::validate`), buffer and stream on different devices
    /// (`InvalidValue`); then the engine's start and the enqueue on the stream.
    /// Parameters the stream's flags do not fix are checked again when the stream
    /// reaches the op; a failure then is published in `params.bytes_done`.
    pub fn submit_async(
        self: &Arc<Self>,
        direction: Direction,
        handle: HandleId,
        buffer_base: u64,
        params: &Arc<AsyncParams>,
        stream: StreamHandle,
    ) -> Result<(), Error> {
        let params: Arc<dyn ParamSource> = Arc::clone(params) as Arc<dyn ParamSource>;
        self.submit_async_from(direction, handle, buffer_base, params, stream)
    }

    /// Where reads inside the submit call happen (`async_op::inline_read`): the driver,
    /// its inline slots and `HIPFILE_INLINE_READ_KB`.
    pub(crate) fn inline_reads(&self) -> InlineReads<'_> {
        InlineReads {
            host: self,
            pool: self.inline_slots.as_deref(),
            cap_bytes: self.inline_read_bytes,
        }
    }

    /// [`Driver::submit_async`] over any [`ParamSource`] (the C API's pointers): the
    /// parameters not fixed by the stream's flags are read again when the stream
    /// reaches the op; the result is published through `params` once.
    ///
    /// # Errors
    /// As [`Driver::submit_async`]; a refused submission leaves the result slot as it
    /// was.
    pub fn submit_async_from(
        self: &Arc<Self>,
        direction: Direction,
        handle: HandleId,
        buffer_base: u64,
        params: Arc<dyn ParamSource>,
        stream: StreamHandle,
    ) -> Result<(), Error> {
        if !self.is_open() {
            self.ensure_open();
            return Err(Error::new(OpError::InvalidValue));
        }
        let raw = match params.read() {
            Some(raw) if buffer_base != 0 => raw,
            _ => return Err(Error::new(OpError::InvalidValue)),
        };
        let file = self.file(handle)?;
        let buffer = self.resolve_buffer(buffer_base)?;
        let state = self.streams().lookup(&**self.device(), stream)?;
        let io = validate(raw, buffer.span, state.flags, self.page_size_bytes())?;
        if buffer.device_ordinal != state.device_ordinal {
            return Err(Error::new(OpError::InvalidValue));
        }
        if io.is_empty() || stream == StreamHandle::NULL {
            params.publish(0);
            if io.is_empty() {
                return Ok(());
            }
            return self.run_on_null_stream(direction, file, &buffer, &io, &*params);
        }
        // Every check that can refuse the submission comes before `*bytes_p = 0`: a
        // refused submission leaves it untouched (a deregistration racing with us makes
        // `begin_op` refuse).
        let engine = self.engine()?;
        let guard = file.begin_op()?;
        let mut submit_lock = state.lock_submit();
        let bytes_before = params.published();
        // Before the enqueue: once enqueued, the op may publish at any time.
        params.publish(0);
        if self.inline_reads().try_read(
            &state,
            &submit_lock,
            &buffer,
            (direction, &io, &file, &*params),
        ) {
            return Ok(());
        }
        let host: Arc<dyn OpHost> = Arc::clone(self) as Arc<dyn OpHost>;
        let submit = Submission { host, engine, state: &state, buffer: &buffer };
        let submitted =
            AsyncOp::submit(submit, &mut submit_lock, (direction, &params, io, &file, &guard));
        let Err(EnqueueError { error, .. }) = submitted else {
            return Ok(());
        };
        // The op was abandoned before its arm could run (`enqueue_doorbell_arm`), so
        // nothing of ours writes `*bytes_p` any more: a refused submission leaves it as
        // it was.
        params.publish(bytes_before);
        Err(error)
    }

    /// NULL stream: synchronous, after the NULL stream's earlier work.
    fn run_on_null_stream(
        &self,
        direction: Direction,
        file: Arc<FileHandle>,
        buffer: &ResolvedBuffer,
        io: &ValidIo,
        params: &dyn ParamSource,
    ) -> Result<(), Error> {
        self.device().synchronize_stream(StreamHandle::NULL).map_err(Error::device)?;
        let (outcome, _) = self.move_now(direction, file, io, buffer)?;
        params.publish(outcome.bytes_p_value() as isize);
        Ok(())
    }
}
