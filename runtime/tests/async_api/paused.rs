//! Ops submitted on a paused stream (a closed `StreamGate` before them): deferred binding
//! of the parameters that are not FIXED (behaviour.md §5.2 A10–A13 and the full flag
//! matrix), `*bytes_p` staying 0 until the stream reaches the op, and prefetch of
//! FIXED-all reads with its write hazard (DESIGN.md "Stream-ordering protocol" step 4).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use hipfile_core::{Direction, OpError};
use hipfile_runtime::device::StreamHandle;
use hipfile_runtime::{AsyncParams, HandleId};
use hipfile_test_support::rig::*;

const SIZE: usize = MIB;

/// A rig with a pattern file and a registered buffer (also `stream_copies.rs`'s).
pub(crate) struct Paused {
    pub(crate) rig: Rig,
    pub(crate) data: Vec<u8>,
    pub(crate) file: TempFile,
    _fd: std::fs::File,
    pub(crate) handle: HandleId,
    pub(crate) buffer: u64,
}

impl Paused {
    fn new(tag: &str, file_len: usize, buffer_len: usize) -> Paused {
        Paused::with(Rig::new(), tag, file_len, buffer_len)
    }

    pub(crate) fn with(rig: Rig, tag: &str, file_len: usize, buffer_len: usize) -> Paused {
        let data = pattern(11, file_len);
        let file = TempFile::new(tag, &data);
        // A prefetch of a file changed in the last 30 ms is redone when the stream
        // reaches the read; the tests that count file reads want a settled file.
        hipfile_test_support::let_file_changes_settle();
        let fd = file.open_rw();
        let handle = rig.register(&fd);
        let buffer = rig.alloc(buffer_len);
        rig.driver.buf_register(buffer, buffer_len as u64, 0).expect("buf_register");
        Paused { rig, data, file, _fd: fd, handle, buffer }
    }

    /// Submits on a paused `stream`, checks `*bytes_p == 0`, applies `change`, releases
    /// the stream and waits for it.
    fn run(
        &self,
        direction: Direction,
        stream: StreamHandle,
        p: &Arc<AsyncParams>,
        change: impl FnOnce(&AsyncParams),
    ) {
        let gate = self.rig.pause(stream).expect("pause");
        p.bytes_done.store(-1, Ordering::SeqCst);
        self.rig.submit(direction, self.handle, self.buffer, p, stream).expect("accepted");
        assert_eq!(bytes(p), 0, "*bytes_p = 0 at submission");
        change(p);
        assert_eq!(bytes(p), 0, "*bytes_p stays 0 while the stream is held");
        gate.release();
        self.rig.sync(stream);
    }

    pub(crate) fn reset_file(&self) {
        std::fs::write(&self.file.path, &self.data).expect("reset file");
    }

    /// Reads of `sizes` at odd file offsets (page multiples with flag 8) into one buffer,
    /// each on its own new stream registered with `flags`, all submitted before any stream
    /// is synchronized; `after_submit` sees each read (and its index) once submitted.
    pub(crate) fn place_reads(
        &self,
        flags: u32,
        sizes: &[usize],
        after_submit: impl Fn(usize, &PlacedRead),
    ) -> Vec<PlacedRead> {
        let mut placed = Vec::new();
        let mut buffer_offset = 0usize;
        for (i, &size) in sizes.iter().enumerate() {
            let file_offset = if flags & 8 != 0 { (i + 3) * 4096 * 5 } else { 4096 * 7 * i + 13 };
            let params = params(size, file_offset as i64, buffer_offset as i64);
            let stream = self.rig.registered_stream(flags);
            self.rig.read(self.handle, self.buffer, &params, stream);
            let read = PlacedRead { params, size, file_offset, buffer_offset, stream };
            after_submit(i, &read);
            placed.push(read);
            buffer_offset += size.next_multiple_of(4096) + 4096;
        }
        placed
    }

    /// Synchronizes the streams of `placed` (from [`Paused::place_reads`]) and checks that
    /// each read published its size and landed where it should, and that nothing between
    /// the reads was written.
    pub(crate) fn check_placed_reads(&self, placed: &[PlacedRead], what: &str) {
        for read in placed {
            self.rig.sync(read.stream);
        }
        let end = placed.last().map_or(0, |read| read.buffer_offset + read.size);
        let got = self.rig.dev_bytes(self.buffer, end);
        let mut end_of_last = 0;
        for PlacedRead { params, size, file_offset, buffer_offset, .. } in placed {
            let what = format!("{what}: {size} bytes at file offset {file_offset}");
            assert_eq!(bytes(params), *size as isize, "{what}");
            assert_bytes(
                &got[*buffer_offset..buffer_offset + size],
                &self.data[*file_offset..file_offset + size],
                &what,
            );
            assert_all(&got[end_of_last..*buffer_offset], 0, "between the reads");
            end_of_last = buffer_offset + size;
        }
    }
}

/// One read of [`Paused::place_reads`].
pub(crate) struct PlacedRead {
    pub(crate) params: Arc<AsyncParams>,
    pub(crate) size: usize,
    pub(crate) file_offset: usize,
    pub(crate) buffer_offset: usize,
    pub(crate) stream: StreamHandle,
}

fn set(p: &AsyncParams, size: usize, file_offset: i64, buffer_offset: i64) {
    p.size_bytes.store(size, Ordering::SeqCst);
    p.file_offset_bytes.store(file_offset, Ordering::SeqCst);
    p.buffer_offset_bytes.store(buffer_offset, Ordering::SeqCst);
}

#[test]
fn bytes_stay_zero_while_the_stream_is_held() {
    let t = Paused::new("held", SIZE, SIZE);
    for flags in [None, Some(0), Some(7), Some(15)] {
        let stream = t.rig.stream_with(flags);
        let file_before = t.file.contents();
        let gate = t.rig.pause(stream).expect("pause");
        let read = params(SIZE / 2, 0, 0);
        let write = params(SIZE / 2, (SIZE / 2) as i64, (SIZE / 2) as i64);
        t.rig.read(t.handle, t.buffer, &read, stream);
        t.rig.write(t.handle, t.buffer, &write, stream);
        // Not a timing assertion: whatever the engine does meanwhile, nothing may be
        // published before the stream reaches the ops.
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!((bytes(&read), bytes(&write)), (0, 0), "flags {flags:?}");
        assert_all(&t.rig.dev_bytes(t.buffer, SIZE / 2), 0, "device memory while held");
        assert_bytes(&t.file.contents(), &file_before, "file while held");
        gate.release();
        t.rig.sync(stream);
        assert_eq!((bytes(&read), bytes(&write)), ((SIZE / 2) as isize, (SIZE / 2) as isize));
        t.rig.set_dev_bytes(t.buffer, &vec![0; SIZE]);
    }
}

#[test]
fn a10_size_shrunk_while_held_is_honoured() {
    // Raw form: the library reads `*size_p` through the caller's pointer when the stream
    // reaches the op.
    for direction in [Direction::Read, Direction::Write] {
        let t = Paused::new("a10", SIZE, SIZE);
        let stream = t.rig.registered_stream(0);
        let source = pattern(12, SIZE);
        if direction == Direction::Write {
            std::fs::write(&t.file.path, vec![0; SIZE]).expect("zero file");
            t.rig.set_dev_bytes(t.buffer, &source);
        }
        let p = AsyncParams::new(SIZE, 0);
        let gate = t.rig.pause(stream).expect("pause");
        let args = args_of(&p);
        // SAFETY: `p` outlives the op (the stream is synchronized below before it drops),
        // the buffer lives as long as the device.
        let submitted =
            unsafe { submit_args(&t.rig.driver, direction, t.handle, t.buffer, args, stream) };
        submitted.expect("accepted");
        p.size_bytes.fetch_sub(4096, Ordering::SeqCst);
        gate.release();
        t.rig.sync(stream);
        assert_eq!(bytes(&p), (SIZE - 4096) as isize, "{direction:?}");
        let n = SIZE - 4096;
        match direction {
            Direction::Read => {
                let got = t.rig.dev_bytes(t.buffer, SIZE);
                assert_bytes(&got[..n], &t.data[..n], "A10 read");
                assert_all(&got[n..], 0, "A10: the 4 KiB tail is untouched");
            }
            Direction::Write => {
                let file = t.file.contents();
                assert_bytes(&file[..n], &source[..n], "A10 write");
                assert_all(&file[n..], 0, "A10: the file's 4 KiB tail is untouched");
            }
        }
    }
}

#[test]
fn a11_size_grown_while_held_is_invalid() {
    // Starts at 1 MiB - 4 KiB so that the grown size still fits the buffer: the only
    // rule broken is "the size grew".
    for direction in [Direction::Read, Direction::Write] {
        let t = Paused::new("a11", SIZE, SIZE);
        let stream = t.rig.registered_stream(0);
        t.rig.set_dev_bytes(t.buffer, &vec![0xcc; SIZE]);
        let p = params(SIZE - 4096, 0, 0);
        t.run(direction, stream, &p, |p| {
            p.size_bytes.fetch_add(4096, Ordering::SeqCst);
        });
        assert_eq!(bytes(&p), neg(OpError::InvalidValue), "{direction:?}");
        assert_all(&t.rig.dev_bytes(t.buffer, SIZE), 0xcc, "A11: buffer untouched");
        assert_bytes(&t.file.contents(), &t.data, "A11: file untouched");
    }
}

#[test]
fn a12_buffer_offset_out_of_range_while_held_is_invalid() {
    for direction in [Direction::Read, Direction::Write] {
        let t = Paused::new("a12", SIZE, SIZE);
        let stream = t.rig.registered_stream(0);
        let p = params(SIZE, 0, 0);
        t.run(direction, stream, &p, |p| {
            p.buffer_offset_bytes.fetch_add(4096, Ordering::SeqCst);
        });
        assert_eq!(bytes(&p), neg(OpError::InvalidValue), "{direction:?}");
        assert_all(&t.rig.dev_bytes(t.buffer, SIZE), 0, "A12: buffer untouched");
        assert_bytes(&t.file.contents(), &t.data, "A12: file untouched");
    }
}

#[test]
fn a13_new_offsets_and_size_are_honoured() {
    let cases: [(&str, i64, i64); 3] = [
        ("size and file offset", 4096, 0),
        ("size and buffer offset", 0, 4096),
        ("all", 4096, 4096),
    ];
    for direction in [Direction::Read, Direction::Write] {
        for (what, file_delta, buffer_delta) in cases {
            let t = Paused::new("a13", 2 * SIZE, SIZE);
            let stream = t.rig.registered_stream(0);
            let source = pattern(13, SIZE);
            if direction == Direction::Write {
                t.rig.set_dev_bytes(t.buffer, &source);
            }
            let p = params(SIZE, 0, 0);
            t.run(direction, stream, &p, |p| {
                set(p, SIZE - 4096, file_delta, buffer_delta);
            });
            let n = SIZE - 4096;
            assert_eq!(bytes(&p), n as isize, "{direction:?} {what}");
            let (f, b) = (file_delta as usize, buffer_delta as usize);
            match direction {
                Direction::Read => {
                    let got = t.rig.dev_bytes(t.buffer, SIZE);
                    assert_bytes(&got[b..b + n], &t.data[f..f + n], what);
                    assert_all(&got[..b], 0, "before the new range");
                    assert_all(&got[b + n..], 0, "after the new range");
                }
                Direction::Write => {
                    let file = t.file.contents();
                    assert_bytes(&file[f..f + n], &source[b..b + n], what);
                    assert_bytes(&file[..f], &t.data[..f], "file before the new range");
                    assert_bytes(&file[f + n..], &t.data[f + n..], "file after the new range");
                }
            }
        }
    }
}

/// One change applied while the stream is held: deltas to size, file and buffer offset.
#[derive(Clone, Copy, Debug)]
struct Change {
    name: &'static str,
    size: i64,
    file: i64,
    buffer: i64,
}

const fn change(name: &'static str, size: i64, file: i64, buffer: i64) -> Change {
    Change { name, size, file, buffer }
}

const CHANGES: [Change; 12] = [
    change("none", 0, 0, 0),
    change("size -4K", -4096, 0, 0),
    change("size +4K (grew)", 4096, 0, 0),
    change("file +4K", 0, 4096, 0),
    change("buffer +4K", 0, 0, 4096),
    change("size -4K, file +4K", -4096, 4096, 0),
    change("size -4K, buffer +4K", -4096, 0, 4096),
    change("all three", -4096, 4096, 4096),
    change("buffer +16K (out of range)", 0, 0, 16384),
    change("file negative", 0, -(MATRIX_FILE_OFFSET + 1), 0),
    change("size -1 (unaligned)", -1, 0, 0),
    change("buffer -1 (unaligned)", 0, 0, -1),
];

const MATRIX_SIZE: usize = 64 * KIB;
const MATRIX_FILE_OFFSET: i64 = 8192;
const MATRIX_BUFFER_OFFSET: i64 = 8192;
const MATRIX_BUFFER: usize = 80 * KIB;
const MATRIX_FILE: usize = 256 * KIB;

/// What the op must do: `Some((size, file offset, buffer offset))` or `None` for -5022.
fn expected(flags: u32, c: Change) -> Option<(usize, usize, usize)> {
    let fixed = |bit: u32| flags & bit != 0;
    let size = if fixed(4) { MATRIX_SIZE as i64 } else { MATRIX_SIZE as i64 + c.size };
    let file = if fixed(2) { MATRIX_FILE_OFFSET } else { MATRIX_FILE_OFFSET + c.file };
    let buffer = if fixed(1) { MATRIX_BUFFER_OFFSET } else { MATRIX_BUFFER_OFFSET + c.buffer };
    let in_range = file >= 0
        && buffer >= 0
        && (buffer as usize) < MATRIX_BUFFER
        && size as usize <= MATRIX_BUFFER - buffer as usize
        && size as usize <= MATRIX_SIZE;
    let aligned = size % 4096 == 0 && file % 4096 == 0 && buffer % 4096 == 0;
    (in_range && (flags & 8 == 0 || aligned)).then_some((
        size as usize,
        file as usize,
        buffer as usize,
    ))
}

/// Every flag value 0..=15 (and an unregistered stream) × every change × read and write:
/// FIXED parameters keep their submitted value, the others take the value they hold
/// when the stream reaches the op and are re-validated then (-5022, nothing touched,
/// when invalid or when the size grew; with PAGE_ALIGNED the new values must be aligned).
/// Under the default configuration (on CUDA: ops copied on their streams, large reads
/// through device slots).
#[test]
fn deferred_binding_matrix_over_all_flags() {
    // Buffered I/O only: the "size -1" writes would hit the bug of async_direct.rs.
    binding_matrix(unaligned_write_config());
}

/// The same matrix with `HIPFILE_STREAM_COPIES=all`: every op takes a slot copied on the
/// stream for the device range it was submitted with — reads read at arm or staged,
/// writes copied into the slot before the doorbell — and binds exactly as the engine's
/// path does: an op whose buffer offset (or, for a read, size) moved declines its slot at
/// arm and the engine moves it, the queued copy writing the destination's own bytes
/// back; an invalid late parameter leaves the destination as it was.
#[test]
fn deferred_binding_matrix_with_every_fixed_range_copied_on_the_stream() {
    let config = hipfile_runtime::config::Config {
        stream_copies: hipfile_runtime::config::StreamCopies::All,
        stream_copy_slots: hipfile_runtime::config::StreamCopySlots::Pinned,
        ..unaligned_write_config()
    };
    binding_matrix(config);
}

fn binding_matrix(config: hipfile_runtime::config::Config) {
    let rig = Rig::with(1, config);
    // What the driver runs with: unset, the backend's choice (`all` on CUDA).
    let copies_on_stream =
        rig.driver.config().stream_copies == hipfile_runtime::config::StreamCopies::All;
    let t = Paused::with(rig, "matrix", MATRIX_FILE, MATRIX_BUFFER);
    let source = pattern(14, MATRIX_BUFFER);
    let flag_sets = (0..16u32).map(Some).chain([None]);
    for flags in flag_sets {
        let stream = t.rig.stream_with(flags);
        for c in CHANGES {
            for direction in [Direction::Read, Direction::Write] {
                let what = format!("flags {flags:?}, {direction:?}, change {}", c.name);
                let fill = if direction == Direction::Read {
                    vec![0; MATRIX_BUFFER]
                } else {
                    source.clone()
                };
                t.rig.set_dev_bytes(t.buffer, &fill);
                let copies_before = t.rig.driver.async_stats().stream_copies.load(Ordering::SeqCst);
                let p = params(MATRIX_SIZE, MATRIX_FILE_OFFSET, MATRIX_BUFFER_OFFSET);
                t.run(direction, stream, &p, |p| {
                    let size = (MATRIX_SIZE as i64 + c.size) as usize;
                    set(p, size, MATRIX_FILE_OFFSET + c.file, MATRIX_BUFFER_OFFSET + c.buffer);
                });
                let copied =
                    t.rig.driver.async_stats().stream_copies.load(Ordering::SeqCst) - copies_before;
                // Every write's source goes into a slot at submission (a write whose
                // buffer offset moved declines it at arm). A read is copied on its stream
                // when it binds to the device range it was submitted with (always with
                // flags 5: buffer offset and size FIXED); one that fails to bind or moved
                // declines (the engine moves it, its stream copies the destination's own
                // bytes back).
                let unmoved = expected(flags.unwrap_or(0), c).is_some_and(|(n, _, b)| {
                    n == MATRIX_SIZE && b == MATRIX_BUFFER_OFFSET as usize
                });
                let slot_kept = direction == Direction::Write || unmoved;
                let want_copied = u64::from(copies_on_stream && slot_kept);
                assert_eq!(copied, want_copied, "{what}: copied on the stream");
                let Some((n, f, b)) = expected(flags.unwrap_or(0), c) else {
                    assert_eq!(bytes(&p), neg(OpError::InvalidValue), "{what}");
                    assert_bytes(&t.rig.dev_bytes(t.buffer, MATRIX_BUFFER), &fill, &what);
                    assert_bytes(&t.file.contents(), &t.data, &what);
                    continue;
                };
                assert_eq!(bytes(&p), n as isize, "{what}");
                match direction {
                    Direction::Read => {
                        let got = t.rig.dev_bytes(t.buffer, MATRIX_BUFFER);
                        assert_bytes(&got[b..b + n], &t.data[f..f + n], &what);
                        assert_all(&got[..b], 0, &what);
                        assert_all(&got[b + n..], 0, &what);
                    }
                    Direction::Write => {
                        let file = t.file.contents();
                        assert_bytes(&file[f..f + n], &source[b..b + n], &what);
                        assert_bytes(&file[..f], &t.data[..f], &what);
                        assert_bytes(&file[f + n..], &t.data[f + n..], &what);
                        t.reset_file();
                    }
                }
            }
        }
    }
}

#[test]
fn fixed_all_changes_are_ignored() {
    for flags in [7u32, 15] {
        for direction in [Direction::Read, Direction::Write] {
            let t = Paused::new("fixed", 2 * SIZE, SIZE);
            let stream = t.rig.registered_stream(flags);
            let source = pattern(15, SIZE);
            if direction == Direction::Write {
                t.rig.set_dev_bytes(t.buffer, &source);
            }
            let p = params(SIZE, 0, 0);
            t.run(direction, stream, &p, |p| set(p, SIZE - 4096, 4096, 4096));
            assert_eq!(bytes(&p), SIZE as isize, "flags {flags} {direction:?}");
            match direction {
                Direction::Read => {
                    let got = t.rig.dev_bytes(t.buffer, SIZE);
                    assert_bytes(&got, &t.data[..SIZE], "submitted values used");
                }
                Direction::Write => {
                    let file = t.file.contents();
                    assert_bytes(&file[..SIZE], &source, "submitted values used");
                    assert_bytes(&file[SIZE..], &t.data[SIZE..], "rest of the file");
                }
            }
        }
    }
}

#[test]
fn page_aligned_stream_revalidates_alignment_when_reached() {
    // Flags 8 (PAGE_ALIGNED, nothing fixed): a size made unaligned while the stream is
    // held fails with -5022 when the stream reaches the op (decided behaviour).
    let t = Paused::new("pa-late", SIZE, SIZE);
    let stream = t.rig.registered_stream(8);
    for (what, size, file, buffer) in
        [("size", SIZE - 100, 0, 0), ("file offset", SIZE / 2, 512, 0), ("buffer", 4096, 0, 8)]
    {
        let p = params(SIZE / 2, 0, 0);
        t.run(Direction::Read, stream, &p, |p| set(p, size, file, buffer));
        assert_eq!(bytes(&p), neg(OpError::InvalidValue), "{what}");
    }
    assert_all(&t.rig.dev_bytes(t.buffer, SIZE), 0, "buffer untouched");
    let p = params(SIZE / 2, 0, 0);
    t.run(Direction::Read, stream, &p, |p| set(p, SIZE / 4, 4096, 8192));
    assert_eq!(bytes(&p), (SIZE / 4) as isize, "aligned new values work");
    let got = t.rig.dev_bytes(t.buffer + 8192, SIZE / 4);
    assert_bytes(&got, &t.data[4096..4096 + SIZE / 4], "aligned new values");
}

/// Bytes the engine has read from the file so far.
fn read_bytes(t: &Paused) -> u64 {
    t.rig.driver.file(t.handle).expect("file").counters().read_bytes()
}

fn prefetched(rig: &Rig) -> u64 {
    rig.driver.async_stats().prefetched.load(Ordering::SeqCst)
}

#[test]
fn fixed_all_read_prefetches_before_the_stream_reaches_it() {
    // One chunk (256 KiB): the whole read is staged while the stream is held.
    for flags in [7u32, 15] {
        let t = Paused::new("prefetch", SIZE, SIZE);
        let stream = t.rig.registered_stream(flags);
        let gate = t.rig.pause(stream).expect("pause");
        let (before, prefetched_before) = (read_bytes(&t), prefetched(&t.rig));
        let n = 256 * KIB;
        let p = params(n, 64 * KIB as i64, 4096);
        t.rig.read(t.handle, t.buffer, &p, stream);
        assert_eq!(prefetched(&t.rig), prefetched_before + 1, "flags {flags}: prefetched");
        wait_until("the prefetch to read the file", || read_bytes(&t) - before == n as u64);
        assert_eq!(bytes(&p), 0, "published only when the stream reaches the op");
        assert_all(&t.rig.dev_bytes(t.buffer, SIZE), 0, "device memory untouched while held");
        gate.release();
        t.rig.sync(stream);
        assert_eq!(bytes(&p), n as isize);
        let got = t.rig.dev_bytes(t.buffer, SIZE);
        assert_bytes(&got[4096..4096 + n], &t.data[64 * KIB..64 * KIB + n], "prefetched data");
        assert_all(&got[..4096], 0, "before");
        assert_all(&got[4096 + n..], 0, "after");
        assert_eq!(read_bytes(&t) - before, n as u64, "read from disk once");
    }
}

/// A FIXED-all read prefetched while its stream is held; the application then rewrites
/// the range with a plain `pwrite` on a descriptor of its own; when the stream reaches
/// the read it returns what the file holds then (the stale prefetch is redone). It
/// returned the old bytes 5 of 5 times before the file's change stamp was compared.
#[test]
fn prefetched_read_sees_a_rewrite_through_another_descriptor() {
    use std::os::unix::fs::FileExt;
    for round in 0..5u64 {
        let t = Paused::new("prefetch-rewritten", SIZE, SIZE);
        let stream = t.rig.registered_stream(7);
        let gate = t.rig.pause(stream).expect("pause");
        let (before, redone_before) = (read_bytes(&t), redone(&t.rig));
        let n = 128 * KIB;
        let p = params(n, 0, 0);
        t.rig.read(t.handle, t.buffer, &p, stream);
        wait_until("the prefetch to read the file", || read_bytes(&t) - before == n as u64);
        let fresh = pattern(40 + round, n);
        let other = std::fs::OpenOptions::new().write(true).open(&t.file.path).expect("open");
        other.write_all_at(&fresh, 0).expect("pwrite");
        gate.release();
        t.rig.sync(stream);
        assert_eq!(bytes(&p), n as isize, "round {round}");
        let got = t.rig.dev_bytes(t.buffer, n);
        assert_bytes(&got, &fresh, &format!("round {round}: the file as the stream reaches it"));
        assert_eq!(redone(&t.rig), redone_before + 1, "round {round}: the prefetch was redone");
    }
}

fn redone(rig: &Rig) -> u64 {
    rig.driver.async_stats().prefetches_redone.load(Ordering::SeqCst)
}

#[test]
fn large_fixed_all_read_starts_early_and_completes() {
    let t = Paused::new("prefetch-large", 2 * SIZE, SIZE);
    let stream = t.rig.registered_stream(7);
    let gate = t.rig.pause(stream).expect("pause");
    let before = read_bytes(&t);
    let p = params(SIZE, 4096, 0);
    t.rig.read(t.handle, t.buffer, &p, stream);
    wait_until("the prefetch to start reading", || read_bytes(&t) > before);
    assert_eq!(bytes(&p), 0);
    assert_all(&t.rig.dev_bytes(t.buffer, SIZE), 0, "device memory untouched while held");
    gate.release();
    t.rig.sync(stream);
    assert_eq!(bytes(&p), SIZE as isize);
    assert_bytes(&t.rig.dev_bytes(t.buffer, SIZE), &t.data[4096..4096 + SIZE], "data");
}

#[test]
fn reads_with_unfixed_parameters_do_not_prefetch() {
    let t = Paused::new("no-prefetch", SIZE, SIZE);
    for flags in [None, Some(0), Some(3), Some(5), Some(6), Some(8)] {
        let stream = t.rig.stream_with(flags);
        let gate = t.rig.pause(stream).expect("pause");
        let (before, prefetched_before) = (read_bytes(&t), prefetched(&t.rig));
        let p = params(64 * KIB, 0, 0);
        t.rig.read(t.handle, t.buffer, &p, stream);
        assert_eq!(prefetched(&t.rig), prefetched_before, "flags {flags:?}");
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(read_bytes(&t), before, "flags {flags:?}: no disk read before the stream");
        gate.release();
        t.rig.sync(stream);
        assert_eq!(bytes(&p), (64 * KIB) as isize);
    }
}

/// BUG (runtime/src/async_io.rs `AsyncOp::enqueue`): the arm host function is enqueued
/// before the prefetch is decided and its gate installed. On an idle stream the arm can
/// run in between: it finds no gate, binds and posts a normal job, and moves the op from
/// Prefetching to Running; then `enqueue` installs the gate and posts the prefetch job
/// too. That second job reads the file again and waits for a gate nobody will open:
/// it holds its staging, the file and (through the op) the driver forever, and
/// `Engine::drop` then waits for it forever. Observed on about 2% of such ops.
#[test]
fn fixed_all_read_on_an_idle_stream_runs_exactly_once() {
    const N: usize = 500;
    // Reads inside the submit call would take every one of them (`inline_reads.rs`).
    let config = hipfile_runtime::config::Config { inline_read_bytes: 0, ..small_config() };
    let t = Paused::with(Rig::with(1, config), "prefetch-idle", 64 * KIB, 64 * KIB);
    let stream = t.rig.registered_stream(7);
    let before = read_bytes(&t);
    for i in 0..N {
        let p = params(4096, (i % 16 * 4096) as i64, 0);
        t.rig.read(t.handle, t.buffer, &p, stream);
        t.rig.sync(stream);
        assert_eq!(bytes(&p), 4096, "op {i}");
    }
    let engine = t.rig.driver.engine().expect("engine");
    wait_until("every job to finish", || engine.stats().jobs >= N as u64);
    let read = read_bytes(&t) - before;
    assert_eq!(read, (N * 4096) as u64, "bytes read from the file for {N} reads of 4 KiB");
    let file = t.rig.driver.file(t.handle).expect("file");
    wait_until("no op to hold the file", || file.ops_in_flight() == 0);
}

/// Stream A holds a write of file[64K..192K); stream B, FIXED-all, is ordered after A
/// (a host function on A opens B's gate) and reads file[128K..256K): the read must not
/// prefetch and must see the written bytes.
#[test]
fn read_overlapping_an_unfinished_write_on_another_stream_waits_for_it() {
    let t = Paused::new("hazard-x", SIZE, SIZE);
    let rig = &t.rig;
    let (a, b) = (rig.registered_stream(0), rig.registered_stream(7));
    let source = rig.alloc(128 * KIB);
    let written = pattern(16, 128 * KIB);
    rig.set_dev_bytes(source, &written);
    let gate_a = rig.pause(a).expect("pause a");
    let gate_b = rig.pause(b).expect("pause b");
    let w = params(128 * KIB, 64 * KIB as i64, 0);
    rig.write(t.handle, source, &w, a);
    rig.launch(a, move || gate_b.release()).expect("host closure");
    let before = prefetched(rig);
    let r = params(128 * KIB, 128 * KIB as i64, 0);
    rig.read(t.handle, t.buffer, &r, b);
    assert_eq!(prefetched(rig), before, "an overlapping unfinished write forbids prefetch");
    // Control: a FIXED-all read of a range the write does not touch still prefetches.
    let control = params(64 * KIB, 512 * KIB as i64, (256 * KIB) as i64);
    rig.read(t.handle, t.buffer, &control, b);
    assert_eq!(prefetched(rig), before + 1, "a disjoint read prefetches");
    gate_a.release();
    rig.sync(a);
    rig.sync(b);
    assert_eq!((bytes(&w), bytes(&r)), ((128 * KIB) as isize, (128 * KIB) as isize));
    let got = rig.dev_bytes(t.buffer, 128 * KIB);
    assert_bytes(&got[..64 * KIB], &written[64 * KIB..], "the read saw the write");
    assert_bytes(&got[64 * KIB..], &t.data[192 * KIB..256 * KIB], "rest of the read");
    assert_eq!(bytes(&control), (64 * KIB) as isize);
    let got = rig.dev_bytes(t.buffer + (256 * KIB) as u64, 64 * KIB);
    assert_bytes(&got, &t.data[512 * KIB..576 * KIB], "control read");
    // The write finished: its hazard is gone, the same read prefetches again.
    let again = params(128 * KIB, 128 * KIB as i64, 0);
    let gate = rig.pause(b).expect("pause b");
    rig.read(t.handle, t.buffer, &again, b);
    assert_eq!(prefetched(rig), before + 2, "hazard cleared once the write finished");
    gate.release();
    rig.sync(b);
    let got = rig.dev_bytes(t.buffer, 64 * KIB);
    assert_bytes(&got, &written[64 * KIB..], "prefetch after the write sees it");
}

#[test]
fn read_after_unfinished_write_on_the_same_stream_sees_it() {
    for flags in [7u32, 15] {
        let t = Paused::new("hazard-same", SIZE, SIZE);
        let rig = &t.rig;
        let stream = rig.registered_stream(flags);
        let source = rig.alloc(256 * KIB);
        let written = pattern(17, 256 * KIB);
        rig.set_dev_bytes(source, &written);
        let gate = rig.pause(stream).expect("pause");
        let w = params(256 * KIB, 0, 0);
        rig.write(t.handle, source, &w, stream);
        let before = prefetched(rig);
        let r = params(256 * KIB, 0, 0);
        rig.read(t.handle, t.buffer, &r, stream);
        assert_eq!(prefetched(rig), before, "flags {flags}: no prefetch over a pending write");
        gate.release();
        rig.sync(stream);
        assert_eq!((bytes(&w), bytes(&r)), ((256 * KIB) as isize, (256 * KIB) as isize));
        assert_bytes(&rig.dev_bytes(t.buffer, 256 * KIB), &written, "read after write");
    }
}

/// A FIXED-all read on held stream B, then a write of the same range on stream A
/// submitted *after* the read but ordered *before* it (a host function on A opens B's
/// gate once the write is done). Stream order says the read runs after the write, so it
/// must see the written bytes; the prefetch already read the old ones at submission.
///
/// BUG (runtime/src/async_io.rs `AsyncOp::new` / `AsyncOp::arm`): the hazard check
/// only looks at writes submitted *before* the read, so the staged (stale) bytes are
/// copied when the stream reaches the read.
#[test]
fn prefetched_read_ordered_after_a_later_submitted_write_sees_it() {
    let t = Paused::new("hazard-late", SIZE, SIZE);
    let rig = &t.rig;
    let (a, b) = (rig.registered_stream(0), rig.registered_stream(7));
    let gate_b = rig.pause(b).expect("pause b");
    let r = params(128 * KIB, 0, 0);
    let before = read_bytes(&t);
    rig.read(t.handle, t.buffer, &r, b);
    wait_until("the prefetch to read", || read_bytes(&t) - before == (128 * KIB) as u64);
    let source = rig.alloc(128 * KIB);
    let written = pattern(18, 128 * KIB);
    rig.set_dev_bytes(source, &written);
    let w = params(128 * KIB, 0, 0);
    rig.write(t.handle, source, &w, a);
    rig.launch(a, move || gate_b.release()).expect("host closure");
    rig.sync(a);
    rig.sync(b);
    assert_eq!((bytes(&w), bytes(&r)), ((128 * KIB) as isize, (128 * KIB) as isize));
    assert_bytes(&rig.dev_bytes(t.buffer, 128 * KIB), &written, "stream order: read after write");
}

/// A one-chunk sync read on the caller's thread is told whether an async op may hold an
/// application stream (the CUDA backend then bounces a short copy through its scratch so
/// that no held stream can stall it; otherwise it copies directly, 4–5 µs faster): yes
/// while an op waits on a paused stream, no before and once the op is gone.
#[test]
fn caller_thread_copies_know_whether_async_ops_hold_streams() {
    let rig = Rig::new();
    let Some(cpu) = rig.cpu_only("counts copy_now calls of the cpu device") else { return };
    let t = Paused::with(rig, "copy-hint", 2 * SIZE, SIZE);
    let engine = t.rig.driver.engine().expect("engine");
    let one_chunk = hipfile_core::RawIo {
        size_bytes: 4096,
        file_offset_bytes: 0,
        buffer_offset_bytes: (SIZE / 2) as i64,
    };
    let sync_read = || {
        let read = t.rig.driver.io_sync(Direction::Read, t.handle, t.buffer, one_chunk);
        assert_eq!(read.expect("sync read"), 4096);
        let stats = cpu.stats();
        (stats.caller_copies, stats.caller_copies_while_ops_hold_streams)
    };
    let before = cpu.stats();
    let base = (before.caller_copies, before.caller_copies_while_ops_hold_streams);
    assert_eq!(engine.async_ops_alive(), 0);
    assert_eq!(sync_read(), (base.0 + 1, base.1), "no op alive: direct");

    let stream = t.rig.stream();
    let gate = t.rig.pause(stream).expect("pause");
    let p = AsyncParams::new(SIZE / 4, 0);
    t.rig.submit(Direction::Read, t.handle, t.buffer, &p, stream).expect("accepted");
    assert_eq!(engine.async_ops_alive(), 1, "the held op counts");
    assert_eq!(sync_read(), (base.0 + 2, base.1 + 1), "an op holds a stream: told so");

    gate.release();
    t.rig.sync(stream);
    assert_eq!(bytes(&p), (SIZE / 4) as isize);
    drop(p);
    let deadline = std::time::Instant::now() + HANG_GUARD;
    while engine.async_ops_alive() > 0 {
        assert!(std::time::Instant::now() < deadline, "the released op was never dropped");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(sync_read(), (base.0 + 3, base.1 + 1), "the op is gone: direct again");
    t.rig.destroy_stream(stream);
    assert_eq!(t.rig.dev_bytes(t.buffer, SIZE / 4), t.data[..SIZE / 4]);
}

/// On CUDA an op of any driver in the process can hold a stream of the primary context
/// that another driver's primary-context copy would queue behind, so a one-chunk sync read
/// of a second driver takes the path no held stream can stall while the first driver's op
/// waits; on the cpu device each instance has streams of its own and it need not.
#[test]
fn another_drivers_held_op_counts_where_the_backend_shares_streams() {
    let a = Paused::with(Rig::new(), "two-drivers-a", 2 * SIZE, SIZE);
    let b = Paused::with(Rig::new(), "two-drivers-b", 2 * SIZE, SIZE);
    let b_engine = b.rig.driver.engine().expect("engine");
    let beside = || b_engine.stats().caller_thread_requests_beside_ops;
    let one_chunk =
        hipfile_core::RawIo { size_bytes: 4096, file_offset_bytes: 0, buffer_offset_bytes: 0 };
    let before = beside();
    let stream = a.rig.stream();
    let gate = a.rig.pause(stream).expect("pause");
    let p = AsyncParams::new(SIZE / 4, 0);
    a.rig.submit(Direction::Read, a.handle, a.buffer, &p, stream).expect("accepted");
    let read = b.rig.driver.io_sync(Direction::Read, b.handle, b.buffer, one_chunk);
    assert_eq!(read.expect("sync read"), 4096);
    let shared = b.rig.backend() == "cuda";
    assert_eq!(beside() - before, u64::from(shared), "backend {}", b.rig.backend());
    gate.release();
    a.rig.sync(stream);
    assert_eq!(bytes(&p), (SIZE / 4) as isize);
    assert_bytes(&b.rig.dev_bytes(b.buffer, 4096), &b.data[..4096], "the sync read");
}
