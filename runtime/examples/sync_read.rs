//! Writes a file, reads it into `cpu` device memory through the safe API
//! ([`hipfile_runtime::api`]), checks every byte, and prints the throughput.
//!
//! ```text
//! cargo run --release -p hipfile-runtime --example sync_read [MiB]   # default 64
//! ```
//!
//! The `HIPFILE_*` environment variables configure the engine (executors, staging,
//! O_DIRECT policy, ...); the file goes to the temporary directory (`TMPDIR`).

use std::error::Error;
use std::fs::File;
use std::time::Instant;

use hipfile_runtime::Driver;
use hipfile_runtime::api::{DeviceSpan, HipFile};
use hipfile_runtime::config::Config;
use hipfile_runtime::device::cpu::CpuDevice;

fn main() -> Result<(), Box<dyn Error>> {
    let mib: usize = std::env::args().nth(1).map(|arg| arg.parse()).transpose()?.unwrap_or(64);
    let len = mib << 20;

    let device = CpuDevice::new(1);
    let hipfile = HipFile::open(Driver::new(Config::from_env()?, device.clone()));

    let path = std::env::temp_dir().join(format!("hipfile-sync-read-{}", std::process::id()));
    let data: Vec<u8> = (0..len).map(|i| (i ^ (i >> 11) ^ (i >> 23)) as u8).collect();
    std::fs::write(&path, &data)?;
    let file = File::open(&path)?;
    let result = read_and_check(&hipfile, &device, &file, &data);
    std::fs::remove_file(&path)?;
    let (n_bytes, seconds) = result?;
    println!(
        "read {n_bytes} bytes from {} into cpu device memory in {:.3} ms: {:.2} GB/s (data verified)",
        path.display(),
        seconds * 1e3,
        n_bytes as f64 / seconds / 1e9
    );
    Ok(())
}

/// Reads the whole file into a registered device buffer; returns the byte count and the
/// seconds the read took.
fn read_and_check(
    hipfile: &HipFile,
    device: &CpuDevice,
    file: &File,
    data: &[u8],
) -> Result<(usize, f64), Box<dyn Error>> {
    let registered = hipfile.register_file(file)?;
    let addr = device.malloc_device(0, data.len())?;
    let span = DeviceSpan { addr, len_bytes: data.len() as u64 };
    let buffer = hipfile.register_buffer(span)?;

    let start = Instant::now();
    let n_bytes = registered.read(span, 0)?;
    let seconds = start.elapsed().as_secs_f64();

    // SAFETY: `cpu` device memory is host memory; the read returned, so its `n_bytes`
    // bytes are written and nothing else writes them while the slice lives.
    let got = unsafe { std::slice::from_raw_parts(addr as *const u8, n_bytes) };
    if n_bytes != data.len() || got != data {
        return Err(format!("read {n_bytes} bytes, expected {}; data differs", data.len()).into());
    }
    buffer.deregister()?;
    // SAFETY: the buffer is deregistered, no I/O on it is in flight, and `got` is dead.
    unsafe { device.free_device(addr) }?;
    Ok((n_bytes, seconds))
}
