//! hipfile-runtime: driver state, the glommio I/O engine, device backends and the Rust
//! API of hipfile-rs.

pub mod device;
pub mod config;
pub mod file;
pub mod engine;
pub mod error;
pub mod driver;
pub mod api;
pub mod async_io;
pub mod stream;
pub mod capi_support;
mod sys;

pub use driver::{Driver, HandleId};
pub use error::{Error, IoError};
pub use async_io::{AsyncArgs, AsyncParams};
