//! hipfile-capi: `libhipfile`, the hipFile C API of hipfile-rs.
//!
//! It owns the C boundary of the project — the only `extern "C"` exports:
//! - every function of hipFile's `hipfile.h` ([`api`], [`batch`]), declared in
//!   `include/hipfile.h` with hipFile's signatures, enum values and struct layouts;
//! - the `hipfileCpu*` extension API of `include/hipfile_cpu.h` (`cpu_ext`, cargo feature
//!   `cpu-hip-runtime`, on by default), through which `libhipfile_hip_cpu.so` (the cpu
//!   HIP runtime, `capi/hip-cpu`) and the C tests reach the in-process cpu device the
//!   driver uses;
//! - the extension API of `include/hipfile_ext.h` ([`ext`]): the process's I/O
//!   statistics (`hipfileStats*`) and "why this path" (`hipfileExplainPath`).
//!
//! Built as `libhipfile.so` (soname `libhipfile.so.0`) and `libhipfile.a`; `hipfile.pc.in`
//! and `install.sh` install both with the headers and a pkg-config file.
//!
//! Every export is declared through `boundary::ffi_fn!`: `#[unsafe(no_mangle)] pub
//! unsafe extern "C" fn`, body under a guard that turns a panic into
//! `hipFileInternalError`. The exports use one process-wide driver
//! (`hipfile_runtime::driver::process::runtime`), configured from `HIPFILE_*`; the
//! async calls hand their pointers to the runtime as a `ParamSource` (`async_args`), the
//! only place that reads or writes their C memory.
//!
//! # Example
//!
//! The exports are ordinary Rust functions too:
//!
//! ```
//! use hipfile::api::hipFileGetVersion;
//!
//! let (mut major, mut minor) = (9, 9);
//! // SAFETY: valid pointers; NULL is allowed for `patch`.
//! let status = unsafe { hipFileGetVersion(&mut major, &mut minor, std::ptr::null_mut()) };
//! assert_eq!((status.err, major, minor), (0, 0, 2));
//! ```

pub mod api;
mod async_args;
pub mod batch;
pub mod boundary;
#[cfg(feature = "cpu-hip-runtime")]
pub mod cpu_ext;
pub mod ext;
pub mod types;
