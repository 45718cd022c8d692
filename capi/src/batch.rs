//! Batch I/O: contexts are real (`hipFileBatchIOSetUp` / `hipFileBatchIODestroy`), and
//! `hipFileBatchIOSubmit` validates like hipFile, but execution is not implemented yet:
//! a submission that passes the checks returns `hipFileInternalError` (5030) and queues
//! nothing. hipFile reports success there and never runs the ops; a silent success is
//! what we must not do. `GetStatus` and `Cancel` are in `api.rs` (5030, as hipFile).

#![allow(non_snake_case, reason = "C function names are hipFile's")]

use core::ffi::{c_uint, c_void};
use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use hipfile_core::{OpError, RawIo, StreamFlags, validate};
use hipfile_runtime::{Driver, Error, HandleId};

use crate::api::driver;
use crate::boundary::{ffi_fn, out_ptr};
use crate::types::{BATCH_MAX_OPS, BATCH_MODE, HipFileError, HipFileIoParams, opcode};

/// A batch context. The C handle is the address of the boxed context, which the table
/// owns: a handle is valid exactly while the table holds it.
#[derive(Debug)]
struct BatchContext {
    /// `max_nr` of `hipFileBatchIOSetUp` (1..=128).
    capacity_ops: u32,
}

type Contexts = BTreeMap<usize, Box<BatchContext>>;

fn contexts() -> MutexGuard<'static, Contexts> {
    static CONTEXTS: Mutex<Contexts> = Mutex::new(BTreeMap::new());
    CONTEXTS.lock().unwrap_or_else(PoisonError::into_inner)
}

fn invalid() -> Error {
    Error::new(OpError::InvalidValue)
}

/// The checks of one operation that need no driver: mode, opcode, offsets' signs.
fn check_shape(op: &HipFileIoParams) -> Result<(), Error> {
    // SAFETY: `batch` is the union's only member; its fields are plain integers and a
    // pointer, valid for every bit pattern.
    let batch = unsafe { op.u.batch };
    let opcode_ok = op.opcode == opcode::BATCH_READ || op.opcode == opcode::BATCH_WRITE;
    if op.mode != BATCH_MODE || !opcode_ok || batch.file_offset < 0 || batch.dev_ptr_offset < 0 {
        return Err(invalid());
    }
    Ok(())
}

/// The checks against the driver: handle registered (else 5030, as hipFile), buffer
/// known and the range inside it (else 5022).
fn check_against_driver(driver: &Driver, op: &HipFileIoParams) -> Result<(), Error> {
    // SAFETY: as in `check_shape`.
    let batch = unsafe { op.u.batch };
    driver.file(HandleId(op.fh as usize)).map_err(|_| Error::new(OpError::InternalError))?;
    let buffer = driver.resolve_buffer(batch.dev_ptr_base as u64).map_err(|_| invalid())?;
    let raw = RawIo {
        size_bytes: batch.size as u64,
        file_offset_bytes: batch.file_offset,
        buffer_offset_bytes: batch.dev_ptr_offset,
    };
    validate(raw, buffer.span, StreamFlags::empty(), driver.page_size_bytes())
        .map_err(|_| invalid())?;
    Ok(())
}

/// `hipFileBatchIOSubmit`'s checks, all-or-nothing; then 5030 (not executed yet).
///
/// # Safety
/// A non-NULL `iocbp` points to `nr` readable `hipFileIOParams_t`.
unsafe fn submit(batch: usize, nr: u32, iocbp: *const HipFileIoParams) -> Result<(), Error> {
    let capacity_ops =
        contexts().get(&batch).map(|context| context.capacity_ops).ok_or_else(invalid)?;
    if nr == 0 {
        return Ok(());
    }
    if nr > capacity_ops || iocbp.is_null() {
        return Err(invalid());
    }
    // SAFETY: non-NULL, and `nr` readable elements per the contract.
    let ops = unsafe { std::slice::from_raw_parts(iocbp, nr as usize) };
    ops.iter().try_for_each(check_shape)?;
    let driver = driver()?;
    if !driver.is_open() {
        return Err(Error::new(OpError::InternalError));
    }
    ops.iter().try_for_each(|op| check_against_driver(driver, op))?;
    Err(Error::new(OpError::InternalError))
}

ffi_fn! {
    /// `hipFileBatchIOSetUp`: a context for 1..=128 operations; needs no driver.
    ///
    /// # Safety
    /// A non-NULL `batch_idp` is writable.
    fn hipFileBatchIOSetUp(batch_idp: *mut *mut c_void, max_nr: c_uint) -> HipFileError {
        let Some(batch_idp) = out_ptr(batch_idp) else {
            return Err(invalid());
        };
        if max_nr == 0 || max_nr > BATCH_MAX_OPS {
            return Err(invalid());
        }
        let context = Box::new(BatchContext { capacity_ops: max_nr });
        let handle = &*context as *const BatchContext as usize;
        contexts().insert(handle, context);
        // SAFETY: non-NULL and writable per the contract.
        unsafe { batch_idp.write_unaligned(handle as *mut c_void) };
        Ok(())
    }

    /// `hipFileBatchIOSubmit`: validates (5022 / 5030 as hipFile), then returns 5030:
    /// batch execution is not implemented yet. `nr == 0` on a valid handle succeeds
    /// (there is nothing to run). `flags` is ignored.
    ///
    /// # Safety
    /// A non-NULL `iocbp` points to `nr` readable `hipFileIOParams_t`.
    fn hipFileBatchIOSubmit(batch_idp: *mut c_void, nr: c_uint, iocbp: *mut HipFileIoParams, flags: c_uint) -> HipFileError {
        let _ = flags;
        // SAFETY: forwarded contract.
        unsafe { submit(batch_idp as usize, nr, iocbp.cast_const()) }
    }

    /// `hipFileBatchIODestroy`: frees the context; NULL and unknown handles are ignored.
    ///
    /// # Safety
    /// None: the handle is only looked up.
    fn hipFileBatchIODestroy(batch_idp: *mut c_void) {
        drop(contexts().remove(&(batch_idp as usize)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setup_validates_and_destroy_frees() {
        let mut handle = core::ptr::null_mut();
        // SAFETY: valid out-pointer.
        unsafe {
            assert_eq!(hipFileBatchIOSetUp(&mut handle, 0).err, 5022);
            assert_eq!(hipFileBatchIOSetUp(&mut handle, BATCH_MAX_OPS + 1).err, 5022);
            assert!(handle.is_null());
            assert_eq!(hipFileBatchIOSetUp(&mut handle, 2).err, 0);
            assert!(!handle.is_null());
            assert_eq!(hipFileBatchIOSubmit(handle, 0, core::ptr::null_mut(), 0).err, 0);
            assert_eq!(hipFileBatchIOSubmit(handle, 3, core::ptr::null_mut(), 0).err, 5022);
            hipFileBatchIODestroy(handle);
            assert_eq!(hipFileBatchIOSubmit(handle, 0, core::ptr::null_mut(), 0).err, 5022);
            hipFileBatchIODestroy(handle);
        }
    }
}
