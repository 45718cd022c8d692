//! Baselines measured in the same run, each verified: CPUONLY (storage limit), CPU_GPU
//! (naive pread + device copy per op) and GPU_COPY (device copies alone: PCIe limit).

use std::os::fd::AsRawFd;

use hipfile_runtime::device::user::UserDevice;
use hipfile_runtime::file::{pread_full, pwrite_full};

use crate::bench::{Bench, RunError, Sample, Timer, failed};
use crate::mem::{Pinned, SharedPtr, StreamSet};
use crate::workload::{Op, Target, finish, prepare, threaded_sample, timed_threads, totals};

/// A pread/pwrite result against the op.
fn check_io(result: std::io::Result<usize>, op: &Op, what: &str) -> Result<(), RunError> {
    match result {
        Ok(n) if n == op.len => Ok(()),
        Ok(n) => {
            Err(RunError::Wrong(format!("{what} at {} moved {n} of {} bytes", op.offset, op.len)))
        }
        Err(e) => Err(RunError::Failed(format!("{what} at {}: {e}", op.offset))),
    }
}

/// CPUONLY: `pread`/`pwrite` between the file and host memory, one thread per region.
pub fn run_cpu_only(b: &mut Bench, plan: &[Vec<Op>], read: bool) -> Result<Sample, RunError> {
    let seed = prepare(b, read, Target::Host)?;
    let fd = b.file.io.as_raw_fd();
    let host = SharedPtr::of(&b.host);
    let measured = timed_threads(
        plan,
        || Ok(()),
        |_, op| {
            // SAFETY: the plan's ops are disjoint ranges inside the file, the host buffer
            // has the file's size and outlives the threads, and each range is touched by
            // exactly one thread.
            let bytes = unsafe { host.slice_mut(op.offset as usize, op.len) };
            if read {
                check_io(pread_full(fd, bytes, op.offset), op, "pread")
            } else {
                check_io(pwrite_full(fd, bytes, op.offset), op, "pwrite")
            }
        },
    )?;
    finish(b, read, seed, Target::Host)?;
    Ok(threaded_sample(plan, measured))
}

/// Per-thread state of CPU_GPU: a stream and a pinned chunk of the I/O size.
struct Staging {
    streams: StreamSet,
    chunk: Pinned,
}

/// CPU_GPU: per op, `pread` into a pinned chunk, copy it to the device, sync (writes:
/// copy to the chunk, sync, `pwrite`), one thread per region.
pub fn run_cpu_gpu(b: &mut Bench, plan: &[Vec<Op>], read: bool) -> Result<Sample, RunError> {
    let seed = prepare(b, read, Target::Device)?;
    let (fd, addr, device) = (b.file.io.as_raw_fd(), b.dev.addr, b.device());
    let io_size = plan.iter().flatten().map(|op| op.len).max().unwrap_or(1);
    let setup = || {
        let streams = StreamSet::create(device, 1).map_err(failed("stream"))?;
        let chunk = Pinned::alloc(device, io_size).map_err(failed("pinned chunk"))?;
        Ok(Staging { streams, chunk })
    };
    let measured = timed_threads(plan, setup, |state, op| {
        let stream = state.streams.handles[0];
        let (ptr, len) = (state.chunk.ptr(), op.len);
        if read {
            check_io(pread_full(fd, &mut state.chunk.bytes_mut()[..len], op.offset), op, "pread")?;
            // SAFETY: the chunk is pinned, holds `len` bytes and is not touched until the
            // sync below; the target range lies inside the device buffer.
            unsafe { device.copy_to_device_on(stream, addr + op.offset, ptr, len) }
                .map_err(|e| RunError::Failed(format!("copy: {e}")))?;
            return state.streams.sync_all().map_err(failed("sync"));
        }
        // SAFETY: as above, the chunk being the copy's target.
        unsafe { device.copy_from_device_on(stream, ptr, addr + op.offset, len) }
            .map_err(|e| RunError::Failed(format!("copy: {e}")))?;
        state.streams.sync_all().map_err(failed("sync"))?;
        check_io(pwrite_full(fd, &state.chunk.bytes()[..len], op.offset), op, "pwrite")
    })?;
    finish(b, read, seed, Target::Device)?;
    Ok(threaded_sample(plan, measured))
}

/// Enqueues one copy of GPU_COPY.
fn enqueue_copy(
    device: &dyn UserDevice,
    stream: usize,
    host: SharedPtr,
    addr: u64,
    op: &Op,
    read: bool,
) -> Result<(), RunError> {
    let stream = hipfile_runtime::device::StreamHandle(stream);
    let host_ptr = (host.0 + op.offset as usize) as *mut u8;
    // SAFETY: the host range lies inside the pinned host buffer and the device range
    // inside the device buffer (both of the file's size); both outlive the sync that
    // follows in `run_gpu_copy`, and no other work touches them meanwhile.
    let result = unsafe {
        if read {
            device.copy_to_device_on(stream, addr + op.offset, host_ptr, op.len)
        } else {
            device.copy_from_device_on(stream, host_ptr, addr + op.offset, op.len)
        }
    };
    result.map_err(|e| RunError::Failed(format!("copy: {e}")))
}

/// GPU_COPY: pinned host → device copies (reads) or device → host (writes) of the same
/// ops on S streams, all enqueued, then sync. No file I/O: the PCIe ceiling.
pub fn run_gpu_copy(b: &mut Bench, plan: &[Vec<Op>], read: bool) -> Result<Sample, RunError> {
    let seed = b.new_seed();
    if read {
        b.fill_host(seed);
        b.poison_device()?;
    } else {
        b.fill_device(seed)?;
        b.poison_host();
    }
    let streams = StreamSet::create(b.device(), plan.len()).map_err(failed("streams"))?;
    let (host, addr, device) = (SharedPtr::of(&b.host), b.dev.addr, &**b.device());
    let longest = plan.iter().map(Vec::len).max().unwrap_or(0);
    let timer = Timer::start();
    for i in 0..longest {
        for (s, ops) in plan.iter().enumerate().filter(|(_, ops)| i < ops.len()) {
            enqueue_copy(device, streams.handles[s].0, host, addr, &ops[i], read)?;
        }
    }
    streams.sync_all().map_err(failed("sync"))?;
    let (seconds, cpu_seconds) = timer.stop();
    drop(streams);
    if read {
        b.check_device(seed)?
    } else {
        b.check_host(seed, "host buffer")?
    }
    let (bytes, ops) = totals(plan);
    Ok(Sample { seconds, bytes, ops, latencies_us: Vec::new(), submit_us: Vec::new(), cpu_seconds })
}
