//! hipfile-runtime: driver state, the glommio I/O engine, device backends and the Rust
//! API of hipfile-rs.

pub mod api;
mod arm;
pub mod async_op;
pub mod batch;
mod buffer;
pub mod config;
pub mod device;
pub mod driver;
pub mod engine;
pub mod error;
mod executor_thread;
pub mod explain;
#[doc(hidden)]
pub mod fault;
pub mod file;
pub mod logging;
pub mod parameters;
pub mod stats;
pub mod stream;
mod sys;
mod word;

pub use async_op::{AsyncParams, ParamSource};
pub use driver::{Driver, HandleId};
pub use error::{Error, IoError};
