//! hipfile-core: the rules of hipFile, with no I/O, no allocation and no unsafe code.
//!
//! It owns what every layer above must agree on:
//! - [`OpError`]: every `hipFileOpError_t` code with its number and message;
//! - [`StreamFlags`]: the stream flags, parsed so unknown bits are an error;
//! - [`validate()`] / [`revalidate`]: raw submission arguments → a [`ValidIo`] or the exact
//!   hipFile error, in a documented order of checks;
//! - [`PlanConfig`] / [`ChunkPlan`]: staging-sized chunks marked direct or buffered;
//! - [`OpMachine`]: the async op state machine and the value published in `*bytes_p`;
//! - [`StreamFifo`] / [`WriteHazards`]: fixed-capacity per-stream and per-file
//!   bookkeeping;
//! - [`BatchLedger`]: the entry slots of one batch (batch I/O), with hipFile's limits.
//!
//! It is `#![no_std]` without `alloc`, so a runtime can embed it anywhere.
//!
//! # Example
//! ```
//! use hipfile_core::{BufferSpan, ChunkMode, DioAlignment, OpError, PlanConfig, RawIo, StreamFlags, validate};
//!
//! let buffer = BufferSpan { base_addr: 0x7f00_0000_0000, len_bytes: 1 << 20 };
//! let flags = StreamFlags::parse(0x7)?;
//! let raw = RawIo { size_bytes: 1 << 20, file_offset_bytes: 4096, buffer_offset_bytes: 0 };
//! let io = validate(raw, buffer, flags, 4096)?;
//! let plan = PlanConfig::new(256 << 10, Some(DioAlignment::DEFAULT), 4096)?;
//! assert!(plan.plan(&io).all(|chunk| chunk.mode == ChunkMode::Direct));
//!
//! let bad = RawIo { file_offset_bytes: -1, ..raw };
//! assert_eq!(validate(bad, buffer, flags, 4096), Err(OpError::InvalidValue));
//! # Ok::<(), OpError>(())
//! ```
#![no_std]
#![forbid(unsafe_code)]
#![warn(clippy::std_instead_of_core, clippy::alloc_instead_of_core)]

mod batch;
mod error;
mod flags;
mod op;
mod plan;
mod queue;
mod validate;

pub use batch::{
    BATCH_MODE, BatchEvent, BatchLedger, BatchStatus, MAX_BATCH_ENTRIES, SlotIndex, batch_capacity,
    batch_direction,
};
pub use error::{BASE_ERR, OpError, UNKNOWN_ERROR_MESSAGE, is_hipfile_err};
pub use flags::{STREAM_FLAGS_MASK, StreamFlags};
pub use op::{Direction, IllegalTransition, OpEvent, OpMachine, OpState, Outcome};
pub use plan::{Chunk, ChunkMode, ChunkPlan, DioAlignment, PlanConfig};
pub use queue::{FileRange, PrefetchVerdict, Sequence, StreamFifo, WriteHazards};
pub use validate::{
    BufferSpan, PAGE_ALIGNED_BYTES, PAGE_SIZE_RANGE_BYTES, RawIo, ValidIo, max_io_bytes,
    revalidate, validate,
};

/// hipFile's version, as `HIPFILE_VERSION_{MAJOR,MINOR,PATCH}` (the API we implement).
pub const HIPFILE_VERSION: (u32, u32, u32) = (0, 2, 0);
