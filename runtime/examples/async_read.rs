//! Stream-ordered reads with the safe async API: four streams read disjoint slices of a
//! file into one device buffer, a fifth op's size is changed after submission while its
//! stream is held, and every result is checked.
//!
//! ```sh
//! cargo run --release -p hipfile-runtime --example async_read
//! HIPFILE_DEVICE=cuda cargo run --release -p hipfile-runtime --example async_read
//! ```

use std::error::Error;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use hipfile_core::Direction;
use hipfile_runtime::config::Config;
use hipfile_runtime::device::Device;
use hipfile_runtime::device::user::{StreamGate, UserDevice};
use hipfile_runtime::driver::process::open_device;
use hipfile_runtime::{AsyncParams, Driver};

const SLICE_BYTES: usize = 4 << 20;
const STREAMS: usize = 4;

fn main() -> Result<(), Box<dyn Error>> {
    let data: Vec<u8> = (0..SLICE_BYTES * STREAMS).map(|i| (i % 251) as u8).collect();
    let path = std::env::temp_dir().join(format!("hipfile-async-example-{}", std::process::id()));
    std::fs::write(&path, &data)?;
    let file = std::fs::File::open(&path)?;

    let config = Config::global().clone();
    let device: Arc<dyn UserDevice> = open_device(config.device, config.cpu_device_count)?;
    let driver = Driver::new(config, Arc::clone(&device) as Arc<dyn Device>);
    driver.open();
    let handle = driver.handle_register(file.as_raw_fd())?;
    let buffer = device.alloc_device(0, data.len())?;

    // Streams registered with every parameter FIXED: reads start at submission
    // (prefetch) and only the copies to the device wait for stream order.
    let mut ops = Vec::new();
    for i in 0..STREAMS {
        let stream = device.create_user_stream(0)?;
        driver.stream_register(stream, 0x7)?;
        let params = AsyncParams::new(SLICE_BYTES, (i * SLICE_BYTES) as i64);
        params.buffer_offset_bytes.store((i * SLICE_BYTES) as i64, Ordering::SeqCst);
        driver.submit_async(Direction::Read, handle, buffer, &params, stream)?;
        ops.push((stream, params));
    }

    // Deferred binding: an unregistered stream (flags 0) reads the size when the stream
    // reaches the op, so the change made while the stream is held is honoured.
    let held = device.create_user_stream(0)?;
    let gate = StreamGate::pause(&device, held)?;
    let shrunk = AsyncParams::new(SLICE_BYTES, 0);
    driver.submit_async(Direction::Read, handle, buffer, &shrunk, held)?;
    shrunk.size_bytes.store(4096, Ordering::SeqCst);
    gate.release();

    for (stream, params) in &ops {
        device.synchronize_stream(*stream)?;
        assert_eq!(params.bytes_done.load(Ordering::SeqCst), SLICE_BYTES as isize);
    }
    device.synchronize_stream(held)?;
    assert_eq!(shrunk.bytes_done.load(Ordering::SeqCst), 4096);
    println!(
        "{} reads on {STREAMS} streams + 1 deferred read: ok ({} prefetched, device {:?})",
        STREAMS,
        driver.async_stats().prefetched.load(Ordering::SeqCst),
        device.kind()
    );
    for (stream, _) in ops {
        driver.stream_deregister(stream)?;
        device.destroy_user_stream(stream)?;
    }
    driver.handle_deregister(handle);
    std::fs::remove_file(&path)?;
    Ok(())
}
