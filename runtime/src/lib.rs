//! hipfile-runtime: driver state, the glommio I/O engine, device backends and the Rust
//! API of hipfile-rs.

pub mod device;
