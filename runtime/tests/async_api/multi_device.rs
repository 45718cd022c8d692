//! Several devices in one process: each device's buffer registered, streams of each
//! device (registered with every FIXED flag and unregistered), async reads and writes and
//! sync reads on all devices at once from one thread per device, every byte checked, and
//! a buffer of one device refused on a stream of another; one batch reading into and
//! writing from buffers of every device. The `cpu` device exposes 4
//! devices here (CI); on a GPU machine the same test runs on every GPU it has.

use std::os::unix::fs::FileExt;
use std::sync::Arc;

use hipfile_core::{Direction, OpError, RawIo};
use hipfile_runtime::AsyncParams;
use hipfile_test_support::rig::*;

/// Bytes each device loads (its shard of the file) and then writes back elsewhere.
fn shard_bytes() -> usize {
    if on_cpu() { 4 * MIB } else { 64 * MIB }
}

/// Ops per device: the shard in this many async reads, half on each stream.
const OPS: usize = 8;

#[test]
fn every_device_loads_and_stores_its_own_shard_at_once() {
    let rig = Rig::with(4, small_config());
    let devices = rig.device.device_count() as usize;
    println!("{} device(s) on {}", devices, rig.backend());
    let shard = shard_bytes();
    // The file: every device's shard to read, then room for every device's write.
    let data = pattern(0xD15C, devices * shard);
    let mut contents = data.clone();
    contents.resize(2 * devices * shard, 0);
    let file = TempFile::new("multi-device", &contents);
    let fd = file.open_rw();
    let handle = rig.register(&fd);
    let buffers: Vec<u64> = (0..devices as u32)
        .map(|device| {
            let buffer = rig.alloc_on(device, shard);
            rig.driver.buf_register(buffer, shard as u64, 0).expect("buf_register");
            buffer
        })
        .collect();
    let streams: Vec<_> = (0..devices as u32)
        .map(|device| {
            let fixed = rig.device.create_user_stream(device).expect("stream");
            rig.driver.stream_register(fixed, 0xF).expect("register stream");
            let plain = rig.device.create_user_stream(device).expect("stream");
            (fixed, plain)
        })
        .collect();
    // One thread per device: async reads of its shard on its two streams, then a sync
    // read of its first 64 KiB (the caller-thread path), then an async write of the whole
    // buffer to its slot in the second half of the file.
    let op_bytes = shard / OPS;
    let per_device: Vec<Vec<Arc<AsyncParams>>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..devices)
            .map(|device| {
                let (rig, buffer, (fixed, plain)) = (&rig, buffers[device], streams[device]);
                scope.spawn(move || {
                    let reads: Vec<Arc<AsyncParams>> = (0..OPS)
                        .map(|op| {
                            let offset = op * op_bytes;
                            params(op_bytes, (device * shard + offset) as i64, offset as i64)
                        })
                        .collect();
                    for (op, p) in reads.iter().enumerate() {
                        rig.read(handle, buffer, p, if op % 2 == 0 { fixed } else { plain });
                    }
                    rig.device.synchronize_stream(fixed).expect("sync");
                    rig.device.synchronize_stream(plain).expect("sync");
                    let raw = RawIo {
                        size_bytes: (64 * KIB) as u64,
                        file_offset_bytes: (device * shard) as i64,
                        buffer_offset_bytes: 0,
                    };
                    let read = rig.driver.io_sync(Direction::Read, handle, buffer, raw);
                    assert_eq!(read.expect("sync read"), 64 * KIB, "device {device}");
                    let write = params(shard, ((devices + device) * shard) as i64, 0);
                    rig.write(handle, buffer, &write, plain);
                    rig.device.synchronize_stream(plain).expect("sync");
                    let mut all = reads;
                    all.push(write);
                    all
                })
            })
            .collect();
        workers.into_iter().map(|worker| worker.join().expect("device thread")).collect()
    });
    for (device, ops) in per_device.iter().enumerate() {
        for (op, p) in ops.iter().enumerate() {
            let want = if op < OPS { op_bytes } else { shard };
            assert_eq!(bytes(p), want as isize, "device {device} op {op}");
        }
        let expected = &data[device * shard..(device + 1) * shard];
        assert_bytes(&rig.dev_bytes(buffers[device], shard), expected, "device's buffer");
        let mut written = vec![0; shard];
        fd.read_exact_at(&mut written, ((devices + device) * shard) as u64).expect("read back");
        assert_bytes(&written, expected, "device's write");
    }
    // A buffer of one device on a stream of another: refused, as hipFile does.
    if devices > 1 {
        for device in 0..devices {
            let other = streams[(device + 1) % devices].1;
            let p = params(4096, 0, 0);
            let got = rig.submit(Direction::Read, handle, buffers[device], &p, other);
            assert_eq!(got.map_err(|e| e.code), Err(OpError::InvalidValue), "device {device}");
        }
    } else {
        println!("one device: the cross-device refusal is not exercised here");
    }
    for (fixed, plain) in streams {
        rig.device.destroy_user_stream(fixed).expect("destroy");
        rig.device.destroy_user_stream(plain).expect("destroy");
    }
}

#[test]
fn one_batch_reads_into_and_writes_from_every_device() {
    use hipfile_runtime::batch::{Batch, BatchEntry};
    let rig = Rig::with(4, small_config());
    let devices = rig.device.device_count() as usize;
    let chunk = 256 * KIB;
    let data = pattern(0xBA7C, devices * chunk);
    let mut contents = data.clone();
    contents.resize(2 * devices * chunk, 0);
    let file = TempFile::new("multi-device-batch", &contents);
    let fd = file.open_rw();
    let handle = rig.register(&fd);
    let buffers: Vec<u64> = (0..devices as u32).map(|d| rig.alloc_on(d, 2 * chunk)).collect();
    // Each device's second half holds what it writes back.
    let outgoing: Vec<Vec<u8>> = (0..devices).map(|d| pattern(0x5EED + d as u64, chunk)).collect();
    for (d, &buffer) in buffers.iter().enumerate() {
        rig.set_dev_bytes(buffer + chunk as u64, &outgoing[d]);
    }
    let entry =
        |direction, d: usize, buffer_offset: usize, file_offset: usize, cookie| BatchEntry {
            direction,
            handle,
            buffer_base_addr: buffers[d],
            buffer_offset_bytes: buffer_offset as i64,
            file_offset_bytes: file_offset as i64,
            size_bytes: chunk as u64,
            cookie,
        };
    let mut entries = Vec::new();
    for d in 0..devices {
        entries.push(entry(Direction::Read, d, 0, d * chunk, 2 * d));
        entries.push(entry(Direction::Write, d, chunk, (devices + d) * chunk, 2 * d + 1));
    }
    let batch = Batch::new(Arc::clone(&rig.driver), entries.len() as u32).unwrap();
    batch.submit(&entries).unwrap();
    let mut seen = 0;
    while seen < entries.len() {
        for event in batch.status(entries.len() - seen, entries.len(), Some(HANG_GUARD)) {
            assert_eq!(event.result, chunk as i64, "entry {}", event.cookie);
            seen += 1;
        }
    }
    for (d, &buffer) in buffers.iter().enumerate() {
        let got = rig.dev_bytes(buffer, chunk);
        assert_bytes(&got, &data[d * chunk..(d + 1) * chunk], &format!("device {d} read"));
    }
    let written = file.contents();
    for (d, sent) in outgoing.iter().enumerate() {
        let at = (devices + d) * chunk;
        assert_bytes(&written[at..at + chunk], sent, &format!("device {d} write"));
    }
}
