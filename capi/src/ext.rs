//! The extension API of `hipfile_ext.h`: the process's statistics (`hipfileStats*`,
//! `hipfile_runtime::stats`) and "why this path" (`hipfileExplainPath`,
//! `hipfile_runtime::explain`) for C callers.

#![allow(non_snake_case, reason = "C function names follow hipFile's style")]

use core::ffi::{c_char, c_int, c_uint, c_void};

use hipfile_core::{Direction, OpError};
use hipfile_runtime::stats::{self, Api, ClassSnapshot, STATS_DEVICES};
use hipfile_runtime::{Error, HandleId};

use crate::api::driver;
use crate::boundary::{ffi_fn, out_ptr};
use crate::types::HipFileError;

/// `hipfileStatsPaths_t`: eight counters in the header's order.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct StatsPaths {
    /// The counters.
    pub counters: [u64; 8],
}

const _: () = assert!(size_of::<ClassSnapshot>() == 384 && size_of::<StatsPaths>() == 64);

fn invalid() -> Error {
    Error::new(OpError::InvalidValue)
}

ffi_fn! {
    /// `hipfileStatsGetClass`.
    ///
    /// # Safety
    /// A non-NULL `out` is writable.
    fn hipfileStatsGetClass(device: c_uint, api: c_int, write: c_int, out: *mut ClassSnapshot) -> HipFileError {
        let out = out_ptr(out).ok_or_else(invalid)?;
        let api = *Api::ALL.get(usize::try_from(api).map_err(|_| invalid())?).ok_or_else(invalid)?;
        if device as usize >= STATS_DEVICES {
            return Err(invalid());
        }
        let direction = if write != 0 { Direction::Write } else { Direction::Read };
        let snapshot = stats::snapshot();
        let value = snapshot.class(device, api, direction).clone();
        // SAFETY: non-NULL and writable per the contract.
        unsafe { out.write_unaligned(value) };
        Ok(())
    }

    /// `hipfileStatsGetPaths`.
    ///
    /// # Safety
    /// A non-NULL `out` is writable.
    fn hipfileStatsGetPaths(out: *mut StatsPaths) -> HipFileError {
        let out = out_ptr(out).ok_or_else(invalid)?;
        // SAFETY: non-NULL and writable per the contract.
        unsafe { out.write_unaligned(StatsPaths { counters: stats::snapshot().paths }) };
        Ok(())
    }

    /// `hipfileExplainPath`: the explanation as text (NUL-terminated).
    ///
    /// # Safety
    /// A non-NULL `text` has `len` writable bytes; `fh` and `buffer` are only looked up.
    fn hipfileExplainPath(fh: *mut c_void, buffer: *const c_void, text: *mut c_char, len: usize) -> HipFileError {
        let text = out_ptr(text).ok_or_else(invalid)?;
        let handle = (!fh.is_null()).then_some(HandleId(fh as usize));
        let buffer = (!buffer.is_null()).then_some(buffer as u64);
        let explanation = driver()?.explain_path(handle, buffer)?.to_string();
        if explanation.len() >= len {
            return Err(invalid());
        }
        // SAFETY: `len` writable bytes per the contract; the text and its NUL fit.
        unsafe {
            std::ptr::copy_nonoverlapping(explanation.as_ptr().cast::<c_char>(), text, explanation.len());
            text.add(explanation.len()).write(0);
        }
        Ok(())
    }

    /// `hipfileStatsReset`.
    ///
    /// # Safety
    /// None.
    fn hipfileStatsReset() -> HipFileError {
        stats::global().reset();
        Ok::<(), Error>(())
    }
}
