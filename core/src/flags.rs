//! Stream flags of `hipFileStreamRegister`, with their ABI values.

use crate::OpError;

bitflags::bitflags! {
    /// Flags a stream is registered with. Values are ABI (`HIPFILE_STREAM_*`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct StreamFlags: u32 {
        /// `*buffer_offset_p` is read once, at submission.
        const FIXED_BUF_OFFSET = 1;
        /// `*file_offset_p` is read once, at submission.
        const FIXED_FILE_OFFSET = 1 << 1;
        /// `*size_p` is read once, at submission.
        const FIXED_FILE_SIZE = 1 << 2;
        /// The caller promises 4 KiB-aligned file offset, size and buffer address.
        const PAGE_ALIGNED_INPUTS = 1 << 3;
    }
}

/// `HIPFILE_STREAM_FLAGS_MASK`: every defined bit.
pub const STREAM_FLAGS_MASK: u32 = 0xf;

static_assertions::const_assert_eq!(StreamFlags::all().bits(), STREAM_FLAGS_MASK);
static_assertions::const_assert_eq!(StreamFlags::FIXED_BUF_OFFSET.bits(), 1);
static_assertions::const_assert_eq!(StreamFlags::FIXED_FILE_OFFSET.bits(), 2);
static_assertions::const_assert_eq!(StreamFlags::FIXED_FILE_SIZE.bits(), 4);
static_assertions::const_assert_eq!(StreamFlags::PAGE_ALIGNED_INPUTS.bits(), 8);

impl StreamFlags {
    /// The three FIXED flags together: every parameter is frozen at submission.
    pub const FIXED_ALL: StreamFlags = StreamFlags::FIXED_BUF_OFFSET
        .union(StreamFlags::FIXED_FILE_OFFSET)
        .union(StreamFlags::FIXED_FILE_SIZE);

    /// Parses flags from the C API. Unknown bits are an error, never dropped.
    ///
    /// # Errors
    /// [`OpError::InvalidValue`] when a bit outside [`STREAM_FLAGS_MASK`] is set.
    pub const fn parse(bits: u32) -> Result<StreamFlags, OpError> {
        match StreamFlags::from_bits(bits) {
            Some(flags) => Ok(flags),
            None => Err(OpError::InvalidValue),
        }
    }

    /// `true` when size and both offsets are frozen at submission (prefetch is possible).
    pub const fn all_fixed(self) -> bool {
        self.contains(StreamFlags::FIXED_ALL)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_accepts_every_combination_of_defined_bits() {
        for bits in 0..=STREAM_FLAGS_MASK {
            assert_eq!(StreamFlags::parse(bits).map(|f| f.bits()), Ok(bits));
        }
    }

    #[test]
    fn parse_rejects_unknown_bits() {
        for bits in [0x10, 0x1f, 0x8000_0000, u32::MAX, 0x100] {
            assert_eq!(StreamFlags::parse(bits), Err(OpError::InvalidValue), "{bits:#x}");
        }
    }

    #[test]
    fn all_fixed_needs_all_three() {
        assert!(StreamFlags::parse(7).unwrap().all_fixed());
        assert!(StreamFlags::parse(0xf).unwrap().all_fixed());
        assert!(!StreamFlags::parse(3).unwrap().all_fixed());
        assert!(!StreamFlags::parse(0xe).unwrap().all_fixed());
    }
}
