//! Property tests: validation never panics and agrees with a wide-integer model, chunk
//! plans tile the range exactly with correct direct/buffered marking, and no event
//! sequence drives the op state machine into an illegal state.

use hipfile_core::{
    BufferSpan, ChunkMode, DioAlignment, OpError, OpEvent, OpMachine, OpState, Outcome,
    PAGE_ALIGNED_BYTES, PlanConfig, RawIo, StreamFlags, max_io_bytes, revalidate, validate,
};
use proptest::prelude::*;

/// The rules of `validate`, restated with i128 arithmetic (no overflow possible).
fn model(
    raw: RawIo,
    buffer: BufferSpan,
    flags: StreamFlags,
    page: u64,
) -> Result<(u64, u64, u64), OpError> {
    let max = max_io_bytes(page).ok_or(OpError::InvalidValue)? as i128;
    let size = (raw.size_bytes as i128).min(max);
    let (file, boff, len) =
        (raw.file_offset_bytes as i128, raw.buffer_offset_bytes as i128, buffer.len_bytes as i128);
    let invalid = file < 0
        || boff < 0
        || boff >= len
        || size > len - boff
        || file + size > i64::MAX as i128
        || buffer.base_addr as i128 + len > u64::MAX as i128;
    if invalid {
        return Err(OpError::InvalidValue);
    }
    let addr = buffer.base_addr as i128 + boff;
    let page_aligned = [file, size, addr].iter().all(|v| v % PAGE_ALIGNED_BYTES as i128 == 0);
    if flags.contains(StreamFlags::PAGE_ALIGNED_INPUTS) && !page_aligned {
        return Err(OpError::InvalidValue);
    }
    Ok((size as u64, file as u64, boff as u64))
}

fn any_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        any::<u64>(),
        0u64..(1 << 22),
        Just(0),
        Just(u64::MAX),
        (0u64..64).prop_map(|s| 1u64 << s)
    ]
}

fn any_i64() -> impl Strategy<Value = i64> {
    prop_oneof![
        any::<i64>(),
        -8192i64..(1 << 22),
        Just(i64::MAX),
        Just(i64::MIN),
        (0u32..63).prop_map(|s| 1i64 << s)
    ]
}

fn any_raw() -> impl Strategy<Value = RawIo> {
    (any_u64(), any_i64(), any_i64()).prop_map(
        |(size_bytes, file_offset_bytes, buffer_offset_bytes)| RawIo {
            size_bytes,
            file_offset_bytes,
            buffer_offset_bytes,
        },
    )
}

fn any_buffer() -> impl Strategy<Value = BufferSpan> {
    (any_u64(), any_u64()).prop_map(|(base_addr, len_bytes)| BufferSpan { base_addr, len_bytes })
}

fn any_page() -> impl Strategy<Value = u64> {
    prop_oneof![Just(4096u64), Just(65536), Just(16384), any_u64()]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    #[test]
    fn validate_never_panics_and_matches_the_model(raw in any_raw(), buffer in any_buffer(), bits in 0u32..16, page in any_page()) {
        let flags = StreamFlags::parse(bits).unwrap();
        let got = validate(raw, buffer, flags, page);
        let expected = model(raw, buffer, flags, page);
        prop_assert_eq!(got.map(|io| (io.size_bytes(), io.file_offset_bytes(), io.buffer_offset_bytes())), expected);
        if let Ok(io) = got {
            prop_assert!(io.buffer_offset_bytes() + io.size_bytes() <= buffer.len_bytes);
            prop_assert!(io.file_end_bytes() <= i64::MAX as u64);
            prop_assert_eq!(io.device_addr(), buffer.base_addr + io.buffer_offset_bytes());
        }
    }

    #[test]
    fn revalidate_never_grows_and_keeps_fixed_values(raw in any_raw(), bound in any_raw(), buffer in any_buffer(), bits in 0u32..16) {
        let flags = StreamFlags::parse(bits).unwrap();
        if let Ok(submitted) = validate(raw, buffer, flags, 4096)
            && let Ok(io) = revalidate(&submitted, bound, flags, 4096) {
                prop_assert!(io.size_bytes() <= submitted.size_bytes());
                if flags.contains(StreamFlags::FIXED_FILE_OFFSET) {
                    prop_assert_eq!(io.file_offset_bytes(), submitted.file_offset_bytes());
                }
                if flags.contains(StreamFlags::FIXED_BUF_OFFSET) {
                    prop_assert_eq!(io.buffer_offset_bytes(), submitted.buffer_offset_bytes());
                }
                if flags.contains(StreamFlags::FIXED_FILE_SIZE) {
                    prop_assert_eq!(io.size_bytes(), submitted.size_bytes());
                }
            }
    }

    #[test]
    fn chunks_tile_the_range_with_correct_marking(
        size in 0u64..(1 << 24),
        file_offset in 0i64..(1 << 30),
        chunk_shift in 9u32..24,
        chunk_extra in 0u64..5000,
        offset_shift in 9u32..14,
        memory_shift in 0u32..14,
        staging_shift in 0u32..16,
        dio_on in any::<bool>(),
    ) {
        let buffer = BufferSpan { base_addr: 1 << 40, len_bytes: 1 << 24 };
        let io = validate(RawIo { size_bytes: size, file_offset_bytes: file_offset, buffer_offset_bytes: 0 }, buffer, StreamFlags::empty(), 4096).unwrap();
        let dio = DioAlignment { offset_bytes: 1 << offset_shift, memory_bytes: 1 << memory_shift };
        let chunk_bytes = (1u64 << chunk_shift) + chunk_extra;
        let staging_align = 1u64 << staging_shift;
        let config = PlanConfig::new(chunk_bytes, dio_on.then_some(dio), staging_align).unwrap();
        let direct_possible = dio_on && staging_align.is_multiple_of(dio.memory_bytes) && chunk_bytes >= dio.offset_bytes;
        prop_assert_eq!(config.dio().is_some(), direct_possible);

        let mut position = io.file_offset_bytes();
        for (i, chunk) in config.plan(&io).enumerate() {
            prop_assert_eq!(chunk.index as usize, i);
            prop_assert_eq!(chunk.file_offset_bytes, position, "gap or overlap");
            prop_assert_eq!(chunk.op_offset_bytes, position - io.file_offset_bytes());
            prop_assert!(chunk.len_bytes > 0 && chunk.len_bytes <= chunk_bytes);
            let aligned = chunk.file_offset_bytes % dio.offset_bytes == 0 && chunk.len_bytes % dio.offset_bytes == 0;
            match chunk.mode {
                ChunkMode::Direct => prop_assert!(direct_possible && aligned),
                // A buffered chunk is only used where direct is impossible: unaligned
                // start, a tail shorter than the alignment, or no direct path at all.
                ChunkMode::Buffered => prop_assert!(
                    !direct_possible
                        || chunk.file_offset_bytes % dio.offset_bytes != 0
                        || chunk.len_bytes < dio.offset_bytes
                ),
            }
            position += chunk.len_bytes;
        }
        prop_assert_eq!(position, io.file_end_bytes(), "plan must end at the range end");
    }

    #[test]
    fn no_event_sequence_reaches_an_illegal_state(
        size in 0u64..100_000,
        prefetch in any::<bool>(),
        events in proptest::collection::vec(any_event(), 0..40),
    ) {
        let mut op = OpMachine::new(size, prefetch);
        let mut published_at = None;
        for (i, event) in events.into_iter().enumerate() {
            let before = op;
            match op.apply(event) {
                Ok(state) => {
                    prop_assert_eq!(state, op.state());
                    prop_assert!(published_at.is_none(), "event accepted after Published");
                    if let OpState::Published(outcome) = state {
                        prop_assert!(op.is_armed());
                        if let Outcome::Bytes(n) = outcome { prop_assert!(n <= size); }
                        published_at = Some(i);
                    }
                    if state == OpState::Prefetching { prop_assert!(prefetch); }
                    if matches!(state, OpState::Armed | OpState::Running) && !matches!(before.state(), OpState::Prefetching) {
                        prop_assert!(op.is_armed());
                    }
                }
                Err(e) => {
                    prop_assert_eq!(op, before, "a rejected event must not change anything");
                    prop_assert_eq!(e.state, before.state());
                }
            }
            prop_assert!(op.transferred_bytes() <= size);
        }
    }
}

fn any_event() -> impl Strategy<Value = OpEvent> {
    prop_oneof![
        Just(OpEvent::Prefetch),
        Just(OpEvent::Arm),
        Just(OpEvent::BindFailed),
        Just(OpEvent::Start),
        (0u64..70_000).prop_map(OpEvent::Transferred),
        Just(OpEvent::Finish),
        (0i32..200).prop_map(|e| OpEvent::Fail(Outcome::OsError(e))),
        Just(OpEvent::Fail(Outcome::Library(OpError::InvalidValue))),
        (0u64..10).prop_map(|n| OpEvent::Fail(Outcome::Bytes(n))),
        Just(OpEvent::Publish),
    ]
}
