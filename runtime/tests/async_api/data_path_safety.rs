//! Memory and descriptor safety of the data path:
//! - a handle kept after its deregistration never reaches a file registered later, even
//!   one that reuses the same descriptor number (handle values are never reused);
//! - a file registered from a read-only descriptor is never written: our own
//!   descriptors of it are read-only and writes are refused;
//! - canaries around every transfer: random unaligned reads and writes, sync and async,
//!   never touch a byte outside their range, in device memory or in the file.

use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd};

use hipfile_core::{Direction, OpError};
use hipfile_runtime::IoError;
use hipfile_test_support::raw;
use hipfile_test_support::rig::*;

#[test]
fn a_stale_handle_never_reaches_a_file_that_reuses_its_descriptor_number() {
    let rig = Rig::new();
    let (data_a, data_b) = (pattern(1, 2 * MIB), pattern(2, 2 * MIB));
    let (file_a, file_b) = (TempFile::new("stale-a", &data_a), TempFile::new("stale-b", &data_b));
    let fd_a = file_a.open_rw().into_raw_fd();
    let stale = rig.driver.handle_register(fd_a).expect("register a");
    let buffer = rig.alloc(2 * MIB);
    assert_eq!(rig.driver.io_sync(Direction::Read, stale, buffer, raw(MIB, 0, 0)), Ok(MIB));
    rig.driver.handle_deregister(stale);
    // SAFETY: fd_a is ours (into_raw_fd above) and no longer registered.
    drop(unsafe { std::fs::File::from_raw_fd(fd_a) });
    // The next descriptor takes the lowest free number: file b gets fd_a's.
    let client_b = file_b.open_rw();
    if client_b.as_raw_fd() != fd_a {
        // Another thread of the process (a GPU driver's) took the number first.
        println!("note: file b got descriptor {}, not {fd_a}", client_b.as_raw_fd());
    }
    let fresh = rig.driver.handle_register(client_b.as_raw_fd()).expect("register b");
    assert_ne!(fresh, stale, "a new registration never gets an old handle's value");
    rig.set_dev_bytes(buffer, &pattern(3, MIB));
    for direction in [Direction::Read, Direction::Write] {
        let got = rig.driver.io_sync(direction, stale, buffer, raw(MIB, 0, 0));
        assert_eq!(got, Err(IoError::Library(OpError::HandleNotRegistered)), "{direction:?}");
        let p = params(MIB, 0, 0);
        let stream = rig.stream();
        let submitted = rig.submit(direction, stale, buffer, &p, stream);
        assert_eq!(code(submitted), OpError::HandleNotRegistered, "async {direction:?}");
    }
    assert_bytes(&file_b.contents(), &data_b, "file b untouched by the stale handle");
    assert_bytes(&file_a.contents(), &data_a, "file a untouched after deregistration");
    // The new handle works on file b.
    assert_eq!(rig.driver.io_sync(Direction::Read, fresh, buffer, raw(MIB, MIB, 0)), Ok(MIB));
    assert_bytes(&rig.dev_bytes(buffer, MIB), &data_b[MIB..], "read through the new handle");
    rig.driver.handle_deregister(fresh);
    // Registrations and deregistrations that free each handle's memory (the engine
    // drops its last reference when it prunes, after the next job): no value comes back.
    let mut seen = std::collections::HashSet::from([stale, fresh]);
    for cycle in 0..200 {
        let id = rig.driver.handle_register(client_b.as_raw_fd()).expect("register");
        assert!(seen.insert(id), "cycle {cycle}: handle value {id:?} handed out twice");
        assert_eq!(rig.driver.io_sync(Direction::Read, id, buffer, raw(4096, 0, 0)), Ok(4096));
        rig.driver.handle_deregister(id);
    }
}

#[test]
fn a_file_registered_read_only_is_never_written() {
    let rig = Rig::new();
    let data = pattern(4, 2 * MIB);
    let file = TempFile::new("read-only", &data);
    let client = file.open_ro();
    let handle = rig.register(&client);
    let handle_file = rig.driver.file(handle).expect("file");
    let mut ours = vec![handle_file.buffered_fd()];
    ours.extend(handle_file.direct_fd());
    for fd in ours {
        // SAFETY: F_GETFL on a live descriptor of the handle.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        assert_eq!(flags & libc::O_ACCMODE, libc::O_RDONLY, "our descriptor {fd} is read-only");
    }
    let buffer = rig.alloc(2 * MIB);
    rig.set_dev_bytes(buffer, &pattern(5, 2 * MIB));
    for (size, offset) in [(4 * KIB, 0), (MIB, 4096), (MIB + 17, 3)] {
        let got = rig.driver.io_sync(Direction::Write, handle, buffer, raw(size, offset, 0));
        assert!(got.is_err(), "sync write of {size} at {offset}: {got:?}");
        let p = params(size, offset as i64, 0);
        let stream = rig.stream();
        match rig.submit(Direction::Write, handle, buffer, &p, stream) {
            Err(_) => {}
            Ok(()) => {
                rig.sync(stream);
                assert!(bytes(&p) < 0, "async write of {size} at {offset}: {}", bytes(&p));
            }
        }
    }
    assert_bytes(&file.contents(), &data, "the read-only file is unchanged");
    assert_eq!(rig.driver.file(handle).expect("file").counters().written_bytes(), 0);
    rig.driver.handle_deregister(handle);
}

#[test]
fn random_transfers_never_touch_a_byte_outside_their_range() {
    const SPAN: usize = 4 * MIB;
    const CANARY: u8 = 0xC5;
    let rig = Rig::new();
    let mut file_model = pattern(6, SPAN);
    let file = TempFile::new("canaries", &file_model);
    let client = file.open_rw();
    let handle = rig.register(&client);
    let buffer = rig.alloc(SPAN);
    let stream = rig.stream();
    let mut rng = Rng(0xCA7A);
    for round in 0..48 {
        let size = 1 + rng.below(if round % 3 == 0 { 600 * KIB } else { 9000 });
        let (file_offset, buffer_offset) = (rng.below(SPAN - size), rng.below(SPAN - size));
        let direction = if round % 2 == 0 { Direction::Read } else { Direction::Write };
        let on_stream = round % 4 >= 2;
        // Device memory: canaries everywhere, the source bytes in range for a write.
        let mut device_model = vec![CANARY; SPAN];
        if direction == Direction::Write {
            let source = pattern(100 + round, size);
            device_model[buffer_offset..buffer_offset + size].copy_from_slice(&source);
        }
        rig.set_dev_bytes(buffer, &device_model);
        let what = format!(
            "round {round}: {direction:?} {size} B, file {file_offset}, buffer {buffer_offset}, async {on_stream}"
        );
        let moved = if on_stream {
            let p = params(size, file_offset as i64, buffer_offset as i64);
            rig.submit(direction, handle, buffer, &p, stream).expect(&what);
            rig.sync(stream);
            bytes(&p)
        } else {
            let io = raw(size, file_offset, buffer_offset);
            rig.driver.io_sync(direction, handle, buffer, io).expect(&what) as isize
        };
        assert_eq!(moved, size as isize, "{what}");
        match direction {
            Direction::Read => device_model[buffer_offset..buffer_offset + size]
                .copy_from_slice(&file_model[file_offset..file_offset + size]),
            Direction::Write => file_model[file_offset..file_offset + size]
                .copy_from_slice(&device_model[buffer_offset..buffer_offset + size]),
        }
        assert_bytes(&rig.dev_bytes(buffer, SPAN), &device_model, &format!("{what}: device"));
        assert_bytes(&file.contents(), &file_model, &format!("{what}: file"));
    }
    rig.driver.handle_deregister(handle);
}
