//! The chunk planner: splits a [`ValidIo`] into staging-sized chunks and marks which
//! ones may use O_DIRECT.
//!
//! A chunk is **direct** when its file offset and length are multiples of the file's
//! DIO offset alignment and the staging memory it lands in is aligned to the DIO memory
//! alignment. Each chunk uses its own staging buffer, whose start is aligned to
//! `staging_align_bytes`, so the memory rule is "`staging_align_bytes` is a multiple of
//! the memory alignment". An unaligned head (up to the next aligned file offset) and a
//! tail shorter than the alignment are **buffered** chunks; everything between is cut
//! into direct chunks of at most `chunk_bytes` rounded down to the alignment.
//! Chunks cover the request exactly once, in file order.

use crate::{OpError, ValidIo};

/// O_DIRECT alignment of a file (`statx` `STATX_DIOALIGN`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DioAlignment {
    /// Required alignment of file offsets and lengths (`stx_dio_offset_align`).
    pub offset_bytes: u64,
    /// Required alignment of memory addresses (`stx_dio_mem_align`).
    pub memory_bytes: u64,
}

impl DioAlignment {
    /// The fallback when the kernel reports nothing: 4096 for both.
    pub const DEFAULT: DioAlignment = DioAlignment { offset_bytes: 4096, memory_bytes: 4096 };
}

/// How a chunk reaches the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChunkMode {
    /// Through the O_DIRECT descriptor: all three alignments hold.
    Direct,
    /// Through the buffered (page cache) descriptor.
    Buffered,
}

/// One piece of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// Position of the chunk in the plan, from 0.
    pub index: u32,
    /// File offset of the chunk's first byte.
    pub file_offset_bytes: u64,
    /// Offset of the chunk's first byte from the request's first byte.
    pub op_offset_bytes: u64,
    /// Length in bytes (> 0).
    pub len_bytes: u64,
    /// Direct or buffered.
    pub mode: ChunkMode,
}

/// How to plan: staging chunk size and the file's O_DIRECT alignment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanConfig {
    chunk_bytes: u64,
    direct_chunk_bytes: u64,
    dio: Option<DioAlignment>,
}

impl PlanConfig {
    /// `chunk_bytes`: the staging buffer size, > 0. `dio`: `None` when the file has no
    /// O_DIRECT descriptor (or O_DIRECT is off). `staging_align_bytes`: the alignment of
    /// every staging buffer's start.
    ///
    /// # Errors
    /// [`OpError::InvalidValue`] when `chunk_bytes` is 0 or an alignment is not a power of
    /// two.
    pub fn new(
        chunk_bytes: u64,
        dio: Option<DioAlignment>,
        staging_align_bytes: u64,
    ) -> Result<PlanConfig, OpError> {
        let powers =
            |d: DioAlignment| d.offset_bytes.is_power_of_two() && d.memory_bytes.is_power_of_two();
        if chunk_bytes == 0 || !staging_align_bytes.is_power_of_two() || !dio.is_none_or(powers) {
            return Err(OpError::InvalidValue);
        }
        // Direct I/O needs the staging start aligned for memory and room for one aligned
        // block per chunk; otherwise every chunk is buffered.
        let dio = dio.filter(|d| {
            staging_align_bytes.is_multiple_of(d.memory_bytes) && chunk_bytes >= d.offset_bytes
        });
        let direct_chunk_bytes = dio.map_or(0, |d| chunk_bytes - chunk_bytes % d.offset_bytes);
        Ok(PlanConfig { chunk_bytes, direct_chunk_bytes, dio })
    }

    /// The staging buffer size.
    pub const fn chunk_bytes(&self) -> u64 {
        self.chunk_bytes
    }

    /// The alignment in force, `None` when every chunk is buffered.
    pub const fn dio(&self) -> Option<DioAlignment> {
        self.dio
    }

    /// The chunks of `io`.
    pub fn plan(&self, io: &ValidIo) -> ChunkPlan {
        ChunkPlan {
            config: *self,
            start_bytes: io.file_offset_bytes(),
            next_bytes: io.file_offset_bytes(),
            end_bytes: io.file_end_bytes(),
            next_index: 0,
        }
    }
}

/// Iterator over the chunks of one request, in file order. Allocates nothing.
#[derive(Clone, Debug)]
pub struct ChunkPlan {
    config: PlanConfig,
    start_bytes: u64,
    next_bytes: u64,
    end_bytes: u64,
    next_index: u32,
}

impl ChunkPlan {
    fn next_piece(&self) -> (u64, ChunkMode) {
        let position = self.next_bytes;
        let remaining = self.end_bytes - position;
        let buffered = (remaining.min(self.config.chunk_bytes), ChunkMode::Buffered);
        let Some(dio) = self.config.dio else {
            return buffered;
        };
        let misalignment = position % dio.offset_bytes;
        if misalignment != 0 {
            let head =
                (dio.offset_bytes - misalignment).min(remaining).min(self.config.chunk_bytes);
            return (head, ChunkMode::Buffered);
        }
        let aligned_remaining = remaining - remaining % dio.offset_bytes;
        if aligned_remaining == 0 {
            return buffered;
        }
        (aligned_remaining.min(self.config.direct_chunk_bytes), ChunkMode::Direct)
    }
}

impl Iterator for ChunkPlan {
    type Item = Chunk;

    fn next(&mut self) -> Option<Chunk> {
        if self.next_bytes >= self.end_bytes {
            return None;
        }
        let (len_bytes, mode) = self.next_piece();
        let chunk = Chunk {
            index: self.next_index,
            file_offset_bytes: self.next_bytes,
            op_offset_bytes: self.next_bytes - self.start_bytes,
            len_bytes,
            mode,
        };
        self.next_bytes += len_bytes;
        self.next_index = self.next_index.saturating_add(1);
        Some(chunk)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BufferSpan, RawIo, StreamFlags, validate};

    const KIB: u64 = 1024;
    const MIB: u64 = 1 << 20;

    fn io(size_bytes: u64, file_offset_bytes: i64) -> ValidIo {
        let buffer = BufferSpan { base_addr: 0x1000_0000, len_bytes: 64 * MIB };
        let raw = RawIo { size_bytes, file_offset_bytes, buffer_offset_bytes: 0 };
        validate(raw, buffer, StreamFlags::empty(), 4096).unwrap()
    }

    fn summary(plan: ChunkPlan) -> heapless::Vec<(u64, u64, ChunkMode), 64> {
        plan.map(|c| (c.file_offset_bytes, c.len_bytes, c.mode)).collect()
    }

    fn config(chunk_bytes: u64) -> PlanConfig {
        PlanConfig::new(chunk_bytes, Some(DioAlignment::DEFAULT), 4096).unwrap()
    }

    #[test]
    fn aligned_request_is_all_direct() {
        let chunks = summary(config(MIB).plan(&io(3 * MIB, 0)));
        assert_eq!(
            chunks.as_slice(),
            &[
                (0, MIB, ChunkMode::Direct),
                (MIB, MIB, ChunkMode::Direct),
                (2 * MIB, MIB, ChunkMode::Direct),
            ]
        );
    }

    #[test]
    fn unaligned_head_and_tail_are_buffered() {
        let chunks = summary(config(MIB).plan(&io(8 * KIB, 100)));
        assert_eq!(
            chunks.as_slice(),
            &[
                (100, 4096 - 100, ChunkMode::Buffered),
                (4096, 4096, ChunkMode::Direct),
                (8192, 100, ChunkMode::Buffered),
            ]
        );
    }

    #[test]
    fn small_unaligned_request_is_one_buffered_chunk() {
        let chunks = summary(config(MIB).plan(&io(10, 5)));
        assert_eq!(chunks.as_slice(), &[(5, 10, ChunkMode::Buffered)]);
    }

    #[test]
    fn without_dio_everything_is_buffered_in_chunk_sizes() {
        let plan = PlanConfig::new(MIB, None, 4096).unwrap();
        let chunks = summary(plan.plan(&io(2 * MIB + 1, 0)));
        assert_eq!(
            chunks.as_slice(),
            &[
                (0, MIB, ChunkMode::Buffered),
                (MIB, MIB, ChunkMode::Buffered),
                (2 * MIB, 1, ChunkMode::Buffered),
            ]
        );
    }

    #[test]
    fn unaligned_chunk_size_rounds_direct_chunks_down() {
        let chunks = summary(config(10_000).plan(&io(20_480, 0)));
        assert_eq!(
            chunks.as_slice(),
            &[
                (0, 8192, ChunkMode::Direct),
                (8192, 8192, ChunkMode::Direct),
                (16384, 4096, ChunkMode::Direct),
            ]
        );
    }

    #[test]
    fn misaligned_staging_or_tiny_chunks_disable_direct() {
        let staging = PlanConfig::new(MIB, Some(DioAlignment::DEFAULT), 512).unwrap();
        assert_eq!(staging.dio(), None);
        let tiny = PlanConfig::new(1024, Some(DioAlignment::DEFAULT), 4096).unwrap();
        assert!(
            tiny.plan(&io(8192, 0)).all(|c| c.mode == ChunkMode::Buffered && c.len_bytes == 1024)
        );
    }

    #[test]
    fn config_rejects_bad_values() {
        assert_eq!(PlanConfig::new(0, None, 4096), Err(OpError::InvalidValue));
        assert_eq!(PlanConfig::new(MIB, None, 3000), Err(OpError::InvalidValue));
        let bad = DioAlignment { offset_bytes: 3000, memory_bytes: 4096 };
        assert_eq!(PlanConfig::new(MIB, Some(bad), 4096), Err(OpError::InvalidValue));
    }

    #[test]
    fn empty_request_has_no_chunks() {
        assert_eq!(config(MIB).plan(&io(0, 0)).count(), 0);
    }

    #[test]
    fn indices_and_op_offsets_count_up() {
        for (i, chunk) in config(4096).plan(&io(5 * 4096 + 7, 3)).enumerate() {
            assert_eq!(chunk.index as usize, i);
            assert_eq!(chunk.op_offset_bytes, chunk.file_offset_bytes - 3);
        }
    }
}
