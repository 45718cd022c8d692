//! The synchronous API and the driver's state (`hipFileDriverOpen`, handles, buffers,
//! `hipFileRead`/`hipFileWrite`, configuration, "why this path"): one crate, one module
//! per area.

mod config;
mod driver_rows;
mod explain;
mod file_handles;
mod sync_io;
