//! hipfile-runtime: driver state, the glommio I/O engine, device backends and the Rust
//! API of hipfile-rs.
//!
//! The public surface is what embedders (the C API, the Python package, the benches, the
//! integration tests) use; everything else is `pub(crate)` or private, and
//! `unreachable_pub` keeps it so.

#![deny(unreachable_pub)]

pub mod api;
mod arm;
mod async_op;
pub mod batch;
mod buffer;
pub mod config;
pub mod device;
pub mod driver;
pub mod engine;
mod error;
mod executor_thread;
pub mod explain;
#[doc(hidden)]
pub mod fault;
pub mod file;
#[cfg(test)]
mod layering;
pub mod logging;
pub mod parameters;
pub mod stats;
pub mod stream;
mod sys;
mod word;

pub use async_op::{AsyncParams, ParamSource};
pub use driver::{Driver, HandleId};
pub use error::{Error, IoError};
