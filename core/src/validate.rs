//! Submission validation: raw arguments in, a [`ValidIo`] out, or hipFile's exact error.
//!
//! # Order of checks (it decides which error wins)
//!
//! The C layer and the runtime run the first checks (see `hipfile-runtime`): driver
//! open, NULL pointers, file handle lookup (5027), buffer lookup (5013/5014/5011), stream
//! lookup. Then [`validate`] runs, in this order:
//!
//! 1. `page_size_bytes` is a power of two ≥ 512 and ≤ 1 GiB, else `InvalidValue`.
//! 2. The size is clamped to [`max_io_bytes`] (`INT_MAX` rounded down to the page size);
//!    the clamp is silent and the op moves at most that many bytes.
//! 3. `file_offset < 0` → `InvalidValue`.
//! 4. `buffer_offset < 0` → `InvalidValue`.
//! 5. `buffer_offset >= buffer_len` → `InvalidValue` (also for size 0, as hipFile).
//! 6. `size > buffer_len − buffer_offset` (the clamped size) → `InvalidValue`.
//! 7. `file_offset + size` overflows `i64`, or `buffer_addr + buffer_len` overflows the
//!    address space → `InvalidValue`.
//! 8. With `PAGE_ALIGNED_INPUTS`: file offset, size and `buffer_addr + buffer_offset`
//!    must be multiples of [`PAGE_ALIGNED_BYTES`] → `InvalidValue` (hipFile ignores the
//!    flag; we check the promise because we rely on it for O_DIRECT).
//!
//! When the stream reaches an op, [`revalidate`] binds the values that were not FIXED and
//! runs the same checks plus one: the bound (clamped) size may shrink but not grow beyond
//! the size validated at submission (`InvalidValue`, published as `*bytes_p = -5022`).

use crate::{OpError, StreamFlags};

/// Alignment promised by `HIPFILE_STREAM_PAGE_ALIGNED_INPUTS`: 4 KiB, whatever the
/// system page size.
pub const PAGE_ALIGNED_BYTES: u64 = 4096;

/// Smallest and largest page sizes [`validate`] accepts.
pub const PAGE_SIZE_RANGE_BYTES: (u64, u64) = (512, 1 << 30);

static_assertions::const_assert!(PAGE_ALIGNED_BYTES.is_power_of_two());
static_assertions::const_assert!(PAGE_SIZE_RANGE_BYTES.0.is_power_of_two());
static_assertions::const_assert!(PAGE_SIZE_RANGE_BYTES.1 <= i32::MAX as u64);

/// The largest byte count one op moves: `INT_MAX & ~(page_size − 1)` (0x7fff_f000 with
/// 4 KiB pages). `None` when `page_size_bytes` is not an acceptable page size.
pub const fn max_io_bytes(page_size_bytes: u64) -> Option<u64> {
    if !page_size_bytes.is_power_of_two()
        || page_size_bytes < PAGE_SIZE_RANGE_BYTES.0
        || page_size_bytes > PAGE_SIZE_RANGE_BYTES.1
    {
        return None;
    }
    Some(i32::MAX as u64 & !(page_size_bytes - 1))
}

/// The arguments of one read or write as the caller gave them (values, after the
/// pointers have been read).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawIo {
    /// `*size_p` / `size` (C `size_t`).
    pub size_bytes: u64,
    /// `*file_offset_p` / `file_offset` (C `hoff_t`).
    pub file_offset_bytes: i64,
    /// `*buffer_offset_p` / `buffer_offset` (C `hoff_t`).
    pub buffer_offset_bytes: i64,
}

/// The buffer an op targets, as the runtime resolved it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferSpan {
    /// Device address of `buffer_base`.
    pub base_addr: u64,
    /// Usable length from `base_addr`: the registered length, or what remains of the
    /// allocation from `base_addr` onward.
    pub len_bytes: u64,
}

/// A request that passed validation. It cannot hold an invalid request: offsets are
/// non-negative, the byte range lies inside the buffer, and no sum overflows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ValidIo {
    size_bytes: u64,
    requested_size_bytes: u64,
    file_offset_bytes: u64,
    buffer_offset_bytes: u64,
    buffer: BufferSpan,
}

impl ValidIo {
    /// Bytes this op moves at most (after the clamp).
    pub const fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    /// The size the caller asked for (before the clamp).
    pub const fn requested_size_bytes(&self) -> u64 {
        self.requested_size_bytes
    }

    /// `true` when the clamp shortened the request.
    pub const fn was_clamped(&self) -> bool {
        self.size_bytes < self.requested_size_bytes
    }

    /// File offset of the first byte.
    pub const fn file_offset_bytes(&self) -> u64 {
        self.file_offset_bytes
    }

    /// Offset of the first byte inside the buffer.
    pub const fn buffer_offset_bytes(&self) -> u64 {
        self.buffer_offset_bytes
    }

    /// The buffer.
    pub const fn buffer(&self) -> BufferSpan {
        self.buffer
    }

    /// Device address of the first byte (`buffer_base + buffer_offset`).
    pub const fn device_addr(&self) -> u64 {
        // Cannot overflow: validate checked base + len and offset < len.
        self.buffer.base_addr + self.buffer_offset_bytes
    }

    /// File offset one past the last byte.
    pub const fn file_end_bytes(&self) -> u64 {
        // Cannot overflow: validate checked file_offset + size <= i64::MAX.
        self.file_offset_bytes + self.size_bytes
    }

    /// `true` for size 0: succeeds at once with nothing to move.
    pub const fn is_empty(&self) -> bool {
        self.size_bytes == 0
    }
}

/// Validates one request (steps 1–8 of the module docs).
///
/// # Errors
/// [`OpError::InvalidValue`] for every rule broken, in the documented order.
pub fn validate(
    raw: RawIo,
    buffer: BufferSpan,
    flags: StreamFlags,
    page_size_bytes: u64,
) -> Result<ValidIo, OpError> {
    let max_bytes = max_io_bytes(page_size_bytes).ok_or(OpError::InvalidValue)?;
    let size_bytes = raw.size_bytes.min(max_bytes);
    let file_offset_bytes =
        u64::try_from(raw.file_offset_bytes).map_err(|_| OpError::InvalidValue)?;
    let buffer_offset_bytes =
        u64::try_from(raw.buffer_offset_bytes).map_err(|_| OpError::InvalidValue)?;
    if buffer_offset_bytes >= buffer.len_bytes {
        return Err(OpError::InvalidValue);
    }
    if size_bytes > buffer.len_bytes - buffer_offset_bytes {
        return Err(OpError::InvalidValue);
    }
    let file_end = file_offset_bytes.checked_add(size_bytes).ok_or(OpError::InvalidValue)?;
    if file_end > i64::MAX as u64 || buffer.base_addr.checked_add(buffer.len_bytes).is_none() {
        return Err(OpError::InvalidValue);
    }
    let io = ValidIo {
        size_bytes,
        requested_size_bytes: raw.size_bytes,
        file_offset_bytes,
        buffer_offset_bytes,
        buffer,
    };
    if flags.contains(StreamFlags::PAGE_ALIGNED_INPUTS) && !is_page_aligned(&io) {
        return Err(OpError::InvalidValue);
    }
    Ok(io)
}

fn is_page_aligned(io: &ValidIo) -> bool {
    io.file_offset_bytes.is_multiple_of(PAGE_ALIGNED_BYTES)
        && io.size_bytes.is_multiple_of(PAGE_ALIGNED_BYTES)
        && io.device_addr().is_multiple_of(PAGE_ALIGNED_BYTES)
}

/// Binds the values read when the stream reaches an op and re-validates them.
///
/// Parameters covered by a FIXED flag keep their submitted value (`bound` is ignored
/// for them); the others take the value in `bound`. The result obeys every rule of
/// [`validate`], and its clamped size is not larger than the submitted one.
///
/// # Errors
/// [`OpError::InvalidValue`] when a bound value breaks a rule or the size grew.
pub fn revalidate(
    submitted: &ValidIo,
    bound: RawIo,
    flags: StreamFlags,
    page_size_bytes: u64,
) -> Result<ValidIo, OpError> {
    let raw = RawIo {
        size_bytes: if flags.contains(StreamFlags::FIXED_FILE_SIZE) {
            submitted.requested_size_bytes
        } else {
            bound.size_bytes
        },
        file_offset_bytes: if flags.contains(StreamFlags::FIXED_FILE_OFFSET) {
            submitted.file_offset_bytes as i64
        } else {
            bound.file_offset_bytes
        },
        buffer_offset_bytes: if flags.contains(StreamFlags::FIXED_BUF_OFFSET) {
            submitted.buffer_offset_bytes as i64
        } else {
            bound.buffer_offset_bytes
        },
    };
    let io = validate(raw, submitted.buffer, flags, page_size_bytes)?;
    if io.size_bytes > submitted.size_bytes {
        return Err(OpError::InvalidValue);
    }
    Ok(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: u64 = 4096;
    const MIB: u64 = 1 << 20;
    const BUF: BufferSpan = BufferSpan { base_addr: 0x10_0000, len_bytes: MIB };

    fn raw(size_bytes: u64, file_offset_bytes: i64, buffer_offset_bytes: i64) -> RawIo {
        RawIo { size_bytes, file_offset_bytes, buffer_offset_bytes }
    }

    fn check(raw: RawIo) -> Result<ValidIo, OpError> {
        validate(raw, BUF, StreamFlags::empty(), PAGE)
    }

    #[test]
    fn max_io_is_int_max_rounded_to_the_page() {
        assert_eq!(max_io_bytes(4096), Some(0x7fff_f000));
        assert_eq!(max_io_bytes(65536), Some(0x7fff_0000));
        assert_eq!(max_io_bytes(0), None);
        assert_eq!(max_io_bytes(3000), None);
        assert_eq!(max_io_bytes(256), None);
        assert_eq!(max_io_bytes(1 << 31), None);
    }

    #[test]
    fn accepts_the_whole_buffer() {
        let io = check(raw(MIB, 0, 0)).unwrap();
        assert_eq!(
            (io.size_bytes(), io.file_offset_bytes(), io.buffer_offset_bytes()),
            (MIB, 0, 0)
        );
        assert_eq!(io.device_addr(), BUF.base_addr);
        assert_eq!(io.file_end_bytes(), MIB);
        assert!(!io.was_clamped() && !io.is_empty());
    }

    #[test]
    fn size_zero_passes_but_buffer_offset_must_be_inside() {
        assert!(check(raw(0, 0, 0)).unwrap().is_empty());
        assert!(check(raw(0, 0, (MIB - 1) as i64)).is_ok());
        assert_eq!(check(raw(0, 0, MIB as i64)), Err(OpError::InvalidValue));
    }

    #[test]
    fn negative_offsets_are_invalid() {
        assert_eq!(check(raw(PAGE, -4096, 0)), Err(OpError::InvalidValue));
        assert_eq!(check(raw(PAGE, 0, -4096)), Err(OpError::InvalidValue));
        assert_eq!(check(raw(PAGE, i64::MIN, i64::MIN)), Err(OpError::InvalidValue));
    }

    #[test]
    fn range_must_fit_the_buffer() {
        assert_eq!(check(raw(MIB + PAGE, 0, 0)), Err(OpError::InvalidValue));
        assert_eq!(check(raw(MIB, 0, 1)), Err(OpError::InvalidValue));
        assert_eq!(check(raw(PAGE, 0, (MIB + PAGE) as i64)), Err(OpError::InvalidValue));
        assert!(check(raw(MIB - 1, 0, 1)).is_ok());
        assert!(check(raw(MIB - PAGE, 0, PAGE as i64)).is_ok());
    }

    #[test]
    fn oversize_is_clamped_before_the_range_check() {
        let big = BufferSpan { base_addr: 0x1000, len_bytes: 1 << 31 };
        let io = validate(raw(4 << 30, 0, 0), big, StreamFlags::empty(), PAGE).unwrap();
        assert_eq!(io.size_bytes(), 0x7fff_f000);
        assert_eq!(io.requested_size_bytes(), 4 << 30);
        assert!(io.was_clamped());
        assert_eq!(
            validate(raw(u64::MAX, 0, 0), big, StreamFlags::empty(), PAGE).unwrap().size_bytes(),
            0x7fff_f000
        );
    }

    #[test]
    fn file_end_overflow_is_invalid() {
        assert_eq!(check(raw(PAGE, i64::MAX, 0)), Err(OpError::InvalidValue));
        assert_eq!(check(raw(PAGE, i64::MAX - 4095, 0)), Err(OpError::InvalidValue));
        assert_eq!(check(raw(PAGE, i64::MAX - 4096, 0)).unwrap().file_end_bytes(), i64::MAX as u64);
        let wrapping = BufferSpan { base_addr: u64::MAX - 10, len_bytes: 100 };
        assert_eq!(
            validate(raw(1, 0, 0), wrapping, StreamFlags::empty(), PAGE),
            Err(OpError::InvalidValue)
        );
    }

    #[test]
    fn bad_page_size_is_invalid() {
        assert_eq!(
            validate(raw(1, 0, 0), BUF, StreamFlags::empty(), 1000),
            Err(OpError::InvalidValue)
        );
    }

    #[test]
    fn page_aligned_promise_is_checked() {
        let aligned = StreamFlags::PAGE_ALIGNED_INPUTS;
        assert!(validate(raw(MIB, 0, 0), BUF, aligned, PAGE).is_ok());
        assert!(validate(raw(PAGE, 8192, 4096), BUF, aligned, PAGE).is_ok());
        for bad in [raw(MIB - 1, 0, 0), raw(PAGE, 1, 0), raw(PAGE, 0, 1), raw(PAGE, 512, 0)] {
            assert_eq!(validate(bad, BUF, aligned, PAGE), Err(OpError::InvalidValue), "{bad:?}");
            assert!(validate(bad, BUF, StreamFlags::empty(), PAGE).is_ok(), "{bad:?}");
        }
        let odd_base = BufferSpan { base_addr: 0x10_0100, len_bytes: MIB };
        assert_eq!(validate(raw(PAGE, 0, 0), odd_base, aligned, PAGE), Err(OpError::InvalidValue));
    }

    #[test]
    fn the_first_broken_rule_wins() {
        // Negative file offset is reported even when the range is also wrong: all are
        // InvalidValue, so the order shows in which check runs, not the code.
        assert_eq!(check(raw(2 * MIB, -1, -1)), Err(OpError::InvalidValue));
    }

    #[test]
    fn revalidate_honours_a_shrinking_size() {
        let submitted = check(raw(MIB, 0, 0)).unwrap();
        let bound =
            revalidate(&submitted, raw(MIB - PAGE, 0, 0), StreamFlags::empty(), PAGE).unwrap();
        assert_eq!(bound.size_bytes(), MIB - PAGE);
    }

    #[test]
    fn revalidate_rejects_a_growing_size() {
        let submitted = check(raw(MIB - PAGE, 0, 0)).unwrap();
        assert_eq!(
            revalidate(&submitted, raw(MIB, 0, 0), StreamFlags::empty(), PAGE),
            Err(OpError::InvalidValue)
        );
    }

    #[test]
    fn revalidate_rejects_values_now_out_of_range() {
        let submitted = check(raw(MIB, 0, 0)).unwrap();
        assert_eq!(
            revalidate(&submitted, raw(MIB, 0, PAGE as i64), StreamFlags::empty(), PAGE),
            Err(OpError::InvalidValue)
        );
        assert_eq!(
            revalidate(&submitted, raw(MIB, -1, 0), StreamFlags::empty(), PAGE),
            Err(OpError::InvalidValue)
        );
    }

    #[test]
    fn revalidate_keeps_fixed_values() {
        let submitted = check(raw(MIB - PAGE, PAGE as i64, PAGE as i64)).unwrap();
        let wild = raw(u64::MAX, -1, -1);
        let bound = revalidate(&submitted, wild, StreamFlags::FIXED_ALL, PAGE).unwrap();
        assert_eq!(bound, submitted);
        let only_size =
            revalidate(&submitted, raw(PAGE, 0, 0), StreamFlags::FIXED_FILE_SIZE, PAGE).unwrap();
        assert_eq!(only_size.size_bytes(), MIB - PAGE);
        assert_eq!((only_size.file_offset_bytes(), only_size.buffer_offset_bytes()), (0, 0));
    }

    #[test]
    fn revalidate_rechecks_the_page_aligned_promise() {
        let flags = StreamFlags::PAGE_ALIGNED_INPUTS;
        let submitted = validate(raw(MIB, 0, 0), BUF, flags, PAGE).unwrap();
        assert_eq!(
            revalidate(&submitted, raw(MIB - 1, 0, 0), flags, PAGE),
            Err(OpError::InvalidValue)
        );
    }
}
