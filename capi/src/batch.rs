//! Batch I/O: `hipFileBatchIO{SetUp,Submit,GetStatus,Cancel,Destroy}` over the runtime's
//! [`Batch`] (entries run at once on the engine and are reported as they finish).
//!
//! A `hipFileBatchHandle_t` is a value from a process-wide counter (pointer-like, never
//! handed out twice), looked up in a table: an unknown, NULL or destroyed handle is
//! `hipFileInvalidValue` and is never dereferenced.
//!
//! Codes follow hipFile's batch checks (behaviour.md §3.5): bad entries 5022, an
//! unregistered file handle or a closed driver 5030, all-or-nothing submission.

#![allow(non_snake_case, reason = "C function names are hipFile's")]

use core::ffi::{c_uint, c_void};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use hipfile_core::{OpError, batch_direction};
use hipfile_runtime::batch::{Batch, BatchEntry};
use hipfile_runtime::{Error, HandleId};

use crate::api::driver;
use crate::boundary::{ffi_fn, out_ptr};
use crate::types::{HipFileError, HipFileIoEvents, HipFileIoParams};

type Contexts = BTreeMap<usize, Arc<Batch>>;

fn contexts() -> MutexGuard<'static, Contexts> {
    static CONTEXTS: Mutex<Contexts> = Mutex::new(BTreeMap::new());
    CONTEXTS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The next batch handle: pointer-like (16-byte steps), far from small integers and from
/// file handle values, never reused.
fn next_handle() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(3 << 44);
    NEXT.fetch_add(16, Ordering::Relaxed)
}

fn invalid() -> Error {
    Error::new(OpError::InvalidValue)
}

fn lookup(handle: *mut c_void) -> Result<Arc<Batch>, Error> {
    contexts().get(&(handle as usize)).cloned().ok_or_else(invalid)
}

/// One `hipFileIOParams_t` as a runtime entry: mode, opcode and offsets' signs checked
/// here, before the driver, in hipFile's order (a bad entry is 5022 even while the
/// driver is closed; [`Batch::submit`] checks the driver first).
fn entry(params: &HipFileIoParams) -> Result<BatchEntry, Error> {
    // SAFETY: `batch` is the union's only member; its fields are plain integers and a
    // pointer, valid for every bit pattern.
    let io = unsafe { params.u.batch };
    let direction = batch_direction(params.mode, params.opcode).map_err(Error::new)?;
    if io.file_offset < 0 || io.dev_ptr_offset < 0 {
        return Err(invalid());
    }
    Ok(BatchEntry {
        direction,
        handle: HandleId(params.fh as usize),
        buffer_base_addr: io.dev_ptr_base as u64,
        buffer_offset_bytes: io.dev_ptr_offset,
        file_offset_bytes: io.file_offset,
        size_bytes: io.size as u64,
        cookie: params.cookie as usize,
    })
}

/// hipFile's codes for a refused submission: a closed driver or an unknown file handle
/// is 5030 (its `runtime_error`), a buffer that does not hold the range is 5022.
fn submit_error(error: Error) -> Error {
    match error.code {
        OpError::DriverNotInitialized | OpError::HandleNotRegistered => {
            Error::new(OpError::InternalError)
        }
        OpError::InternalError | OpError::InvalidValue => error,
        _ => invalid(),
    }
}

/// # Safety
/// A non-NULL `iocbp` points to `nr` readable `hipFileIOParams_t`.
unsafe fn submit(handle: *mut c_void, nr: u32, iocbp: *const HipFileIoParams) -> Result<(), Error> {
    let batch = lookup(handle)?;
    if nr == 0 {
        return Ok(());
    }
    // Checked before `iocbp` is read: never more entries than the batch can take.
    if nr as usize > batch.capacity() || iocbp.is_null() {
        return Err(invalid());
    }
    // SAFETY: non-NULL, and `nr` readable elements per the contract.
    let params = unsafe { std::slice::from_raw_parts(iocbp, nr as usize) };
    let entries = params.iter().map(entry).collect::<Result<Vec<_>, _>>()?;
    batch.submit(&entries).map_err(submit_error)
}

/// A `struct timespec` timeout: `None` for NULL (no limit).
///
/// # Safety
/// A non-NULL `timeout` is readable.
unsafe fn timeout_of(timeout: *const libc::timespec) -> Result<Option<Duration>, Error> {
    if timeout.is_null() {
        return Ok(None);
    }
    // SAFETY: non-NULL and readable per the contract.
    let timeout = unsafe { timeout.read_unaligned() };
    let seconds = u64::try_from(timeout.tv_sec).map_err(|_| invalid())?;
    let nanos = u32::try_from(timeout.tv_nsec).ok().filter(|&n| n < 1_000_000_000);
    Ok(Some(Duration::new(seconds, nanos.ok_or_else(invalid)?)))
}

/// # Safety
/// As `hipFileBatchIOGetStatus`.
unsafe fn get_status(
    handle: *mut c_void,
    min_nr: u32,
    nr: *mut c_uint,
    iocbp: *mut HipFileIoEvents,
    timeout: *const libc::timespec,
) -> Result<(), Error> {
    let batch = lookup(handle)?;
    let nr = out_ptr(nr).ok_or_else(invalid)?;
    // SAFETY: non-NULL; readable and writable per the contract.
    let max_nr = unsafe { nr.read_unaligned() };
    if min_nr > max_nr || (max_nr > 0 && iocbp.is_null()) {
        return Err(invalid());
    }
    // SAFETY: forwarded contract.
    let timeout = unsafe { timeout_of(timeout) }?;
    let events = batch.status(min_nr as usize, max_nr as usize, timeout);
    for (index, event) in events.iter().enumerate() {
        let out = HipFileIoEvents {
            cookie: event.cookie as *mut c_void,
            status: event.status as i32,
            // `size_t ret`: a negative result keeps its two's-complement bits, so a C
            // caller reading it as `ssize_t` sees `-errno` / `-code`.
            ret: event.result as usize,
        };
        // SAFETY: `index < events.len() <= max_nr` elements are writable per the
        // contract.
        unsafe { iocbp.add(index).write_unaligned(out) };
    }
    // SAFETY: as above.
    unsafe { nr.write_unaligned(events.len() as c_uint) };
    Ok(())
}

ffi_fn! {
    /// `hipFileBatchIOSetUp`: a context for 1..=128 entries; needs no open driver.
    ///
    /// # Safety
    /// A non-NULL `batch_idp` is writable.
    fn hipFileBatchIOSetUp(batch_idp: *mut *mut c_void, max_nr: c_uint) -> HipFileError {
        let Some(batch_idp) = out_ptr(batch_idp) else {
            return Err(invalid());
        };
        let batch = Batch::new(Arc::clone(driver()?), max_nr)?;
        let handle = next_handle();
        contexts().insert(handle, Arc::new(batch));
        // SAFETY: non-NULL and writable per the contract.
        unsafe { batch_idp.write_unaligned(handle as *mut c_void) };
        Ok(())
    }

    /// `hipFileBatchIOSubmit`: checks every entry, then runs all of them (or none).
    /// `nr == 0` on a valid handle succeeds. `flags` is ignored (hipFile defines none).
    ///
    /// # Safety
    /// A non-NULL `iocbp` points to `nr` readable `hipFileIOParams_t`.
    fn hipFileBatchIOSubmit(batch_idp: *mut c_void, nr: c_uint, iocbp: *mut HipFileIoParams, flags: c_uint) -> HipFileError {
        let _ = flags;
        // SAFETY: forwarded contract.
        unsafe { submit(batch_idp, nr, iocbp.cast_const()) }
    }

    /// `hipFileBatchIOGetStatus`: waits for `min_nr` finished entries (capped at those
    /// that can still finish) or the relative `timeout` (NULL: no limit), then writes
    /// up to `*nr` events and their count to `*nr`.
    ///
    /// # Safety
    /// A non-NULL `nr` is readable and writable; a non-NULL `iocbp` has room for `*nr`
    /// events; a non-NULL `timeout` is readable.
    fn hipFileBatchIOGetStatus(
        batch_idp: *mut c_void,
        min_nr: c_uint,
        nr: *mut c_uint,
        iocbp: *mut HipFileIoEvents,
        timeout: *mut libc::timespec,
    ) -> HipFileError {
        // SAFETY: forwarded contract.
        unsafe { get_status(batch_idp, min_nr, nr, iocbp, timeout.cast_const()) }
    }

    /// `hipFileBatchIOCancel`: entries not started never run, running ones stop at
    /// their next part; returns once none is in flight. The batch is then empty.
    ///
    /// # Safety
    /// None: the handle is only looked up.
    fn hipFileBatchIOCancel(batch_idp: *mut c_void) -> HipFileError {
        lookup(batch_idp)?.cancel();
        Ok(())
    }

    /// `hipFileBatchIODestroy`: cancels (waiting for entries moving data) and frees the
    /// context; NULL and unknown handles are ignored.
    ///
    /// # Safety
    /// None: the handle is only looked up.
    fn hipFileBatchIODestroy(batch_idp: *mut c_void) {
        let batch = contexts().remove(&(batch_idp as usize));
        if let Some(batch) = batch {
            batch.cancel();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setup_validates_and_destroy_frees() {
        let mut handle = core::ptr::null_mut();
        let max = hipfile_core::MAX_BATCH_ENTRIES as u32;
        // SAFETY: valid out-pointer.
        unsafe {
            assert_eq!(hipFileBatchIOSetUp(&mut handle, 0).err, 5022);
            assert_eq!(hipFileBatchIOSetUp(&mut handle, max + 1).err, 5022);
            assert!(handle.is_null());
            assert_eq!(hipFileBatchIOSetUp(&mut handle, 2).err, 0);
            assert!(!handle.is_null());
            assert_eq!(hipFileBatchIOSubmit(handle, 0, core::ptr::null_mut(), 0).err, 0);
            assert_eq!(hipFileBatchIOSubmit(handle, 3, core::ptr::null_mut(), 0).err, 5022);
            assert_eq!(hipFileBatchIOCancel(handle).err, 0);
            hipFileBatchIODestroy(handle);
            assert_eq!(hipFileBatchIOSubmit(handle, 0, core::ptr::null_mut(), 0).err, 5022);
            assert_eq!(hipFileBatchIOCancel(handle).err, 5022);
            hipFileBatchIODestroy(handle);
        }
    }

    #[test]
    fn timeouts_are_checked() {
        let ts = |tv_sec, tv_nsec| libc::timespec { tv_sec, tv_nsec };
        // SAFETY: valid pointers.
        unsafe {
            assert_eq!(timeout_of(core::ptr::null()).unwrap(), None);
            assert_eq!(timeout_of(&ts(1, 5)).unwrap(), Some(Duration::new(1, 5)));
            assert!(timeout_of(&ts(-1, 0)).is_err());
            assert!(timeout_of(&ts(0, 1_000_000_000)).is_err());
            assert!(timeout_of(&ts(0, -1)).is_err());
        }
    }
}
