//! The async API (`hipFileReadAsync`/`hipFileWriteAsync` and stream registration) on the
//! backend `HIPFILE_DEVICE` selects (`cpu` by default, `cuda` in the GPU suite): one
//! crate, one module per area. Tests that need a process of their own (they measure the
//! whole process, change process-wide limits or inject faults) are separate crates:
//! `arm_poller`, `async_soak`, `async_sweep`, `faults`, `stats`, `start_anywhere`,
//! `write_short`, `engine`, `cpu_device`, `staging_range`, `prefetch_parts`.

mod batch;
mod data_path_safety;
mod direct;
mod durability;
mod errors;
mod inline_reads;
mod lifetime;
mod multi_device;
mod no_memops;
mod paused;
mod prefetch_window;
mod rows;
mod stream_copies;
mod streams;
mod stress;
