//! The data pattern of the test file: every 8-byte word is a hash of (seed, word index),
//! so any byte can be checked from its file offset alone, a stale buffer or a misplaced
//! chunk is caught, and each write run uses a new seed (a write that did nothing fails).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::sys::worker_threads;

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;
/// Bytes per unit of parallel work (a multiple of 8).
const PIECE_BYTES: usize = 8 << 20;

/// The word at index `index` for `seed` (splitmix64).
fn word(seed: u64, index: u64) -> u64 {
    let mut z = (seed ^ index.wrapping_mul(GOLDEN)).wrapping_add(GOLDEN);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The byte at file offset `offset` for `seed`.
pub fn byte_at(seed: u64, offset: u64) -> u8 {
    word(seed, offset / 8).to_le_bytes()[(offset % 8) as usize]
}

/// Bytes before the first 8-aligned file offset (at most `len`).
fn head_len(offset: u64, len: usize) -> usize {
    (((8 - offset % 8) % 8) as usize).min(len)
}

fn fill_serial(buf: &mut [u8], offset: u64, seed: u64) {
    let len = buf.len();
    let head = head_len(offset, buf.len());
    let (head_bytes, rest) = buf.split_at_mut(head);
    for (i, byte) in head_bytes.iter_mut().enumerate() {
        *byte = byte_at(seed, offset + i as u64);
    }
    let base = offset + head as u64;
    let mut words = rest.chunks_exact_mut(8);
    for (i, chunk) in (&mut words).enumerate() {
        chunk.copy_from_slice(&word(seed, base / 8 + i as u64).to_le_bytes());
    }
    let tail = words.into_remainder();
    let tail_offset = offset + (len - tail.len()) as u64;
    for (i, byte) in tail.iter_mut().enumerate() {
        *byte = byte_at(seed, tail_offset + i as u64);
    }
}

/// File offset of the first byte of `buf` (holding file bytes from `offset`) that
/// differs from the pattern.
fn check_serial(buf: &[u8], offset: u64, seed: u64) -> Option<u64> {
    let bytewise = |bytes: &[u8], from: u64| {
        bytes
            .iter()
            .enumerate()
            .find(|&(i, &b)| b != byte_at(seed, from + i as u64))
            .map(|(i, _)| from + i as u64)
    };
    let head = head_len(offset, buf.len());
    if let Some(bad) = bytewise(&buf[..head], offset) {
        return Some(bad);
    }
    let base = offset + head as u64;
    let mut words = buf[head..].chunks_exact(8);
    for (i, chunk) in (&mut words).enumerate() {
        let expected = word(seed, base / 8 + i as u64).to_le_bytes();
        if chunk != expected {
            return bytewise(chunk, base + 8 * i as u64);
        }
    }
    let tail = words.remainder();
    bytewise(tail, offset + (buf.len() - tail.len()) as u64)
}

/// Runs `work(piece_index)` for every piece on the worker threads; one piece on the
/// calling thread (the latency mode checks tens of thousands of 4 KiB blocks, one thread
/// start and stack unmapping each otherwise).
fn for_each_piece(pieces: usize, work: impl Fn(usize) + Sync) {
    if pieces <= 1 {
        (0..pieces).for_each(work);
        return;
    }
    let next = AtomicUsize::new(0);
    let threads = worker_threads().min(pieces).max(1);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    if index >= pieces {
                        break;
                    }
                    work(index);
                }
            });
        }
    });
}

/// Fills `buf` with the file bytes at `offset` for `seed` (in parallel).
pub fn fill(buf: &mut [u8], offset: u64, seed: u64) {
    let pieces: Vec<std::sync::Mutex<&mut [u8]>> =
        buf.chunks_mut(PIECE_BYTES).map(std::sync::Mutex::new).collect();
    for_each_piece(pieces.len(), |index| {
        let mut piece = pieces[index].lock().unwrap_or_else(|p| p.into_inner());
        fill_serial(&mut piece, offset + (index * PIECE_BYTES) as u64, seed);
    });
}

/// Checks `buf` against the file bytes at `offset` for `seed` (in parallel); `Err` with
/// the file offset of the first differing byte.
pub fn verify(buf: &[u8], offset: u64, seed: u64) -> Result<(), u64> {
    let first_bad = AtomicU64::new(u64::MAX);
    let pieces = buf.len().div_ceil(PIECE_BYTES);
    for_each_piece(pieces, |index| {
        let start = index * PIECE_BYTES;
        let piece = &buf[start..(start + PIECE_BYTES).min(buf.len())];
        if let Some(bad) = check_serial(piece, offset + start as u64, seed) {
            first_bad.fetch_min(bad, Ordering::Relaxed);
        }
    });
    match first_bad.into_inner() {
        u64::MAX => Ok(()),
        bad => Err(bad),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_and_verify_agree_at_any_offset() {
        for offset in [0u64, 1, 7, 8, 4093] {
            let mut buf = vec![0u8; (3 * PIECE_BYTES) / 2 + 5];
            fill(&mut buf, offset, 42);
            assert_eq!(verify(&buf, offset, 42), Ok(()));
            assert_eq!(buf[10], byte_at(42, offset + 10));
            buf[PIECE_BYTES + 3] ^= 1;
            assert_eq!(verify(&buf, offset, 42), Err(offset + PIECE_BYTES as u64 + 3));
            assert!(verify(&buf, offset, 43).is_err());
        }
    }
}
