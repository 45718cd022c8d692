//! Integration tests of the `cpu` device: memory tracking, copies, stream ordering,
//! stream memory operations, events, gates, error handling and idle behaviour.
//!
//! Timeouts here are hang guards only; no test passes or fails on speed.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use hipfile_runtime::device::cpu::{CpuDevice, StreamGate};
use hipfile_runtime::device::{
    Device, DeviceCopies, DeviceError, DeviceEvents, DeviceInfo, DeviceKind, EventHandle,
    HostMemory, InternalStream, MemoryType, PinnedRegion, StreamHandle, StreamMemoryOps,
};

/// Hang guard for anything that should finish.
const HANG_GUARD: Duration = Duration::from_secs(30);

/// Runs `f` on another thread and fails the test if it does not return within the hang
/// guard.
fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (sender, receiver) = mpsc::channel();
    thread::spawn(move || {
        let _ = sender.send(f());
    });
    match receiver.recv_timeout(HANG_GUARD) {
        Ok(value) => value,
        Err(_) => panic!("hang guard: {what} did not finish in {HANG_GUARD:?}"),
    }
}

/// Polls `condition` until it holds; fails the test after the hang guard.
fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + HANG_GUARD;
    while !condition() {
        assert!(Instant::now() < deadline, "hang guard: {what} never became true");
        thread::sleep(Duration::from_millis(1));
    }
}

fn sync(device: &Arc<CpuDevice>, stream: StreamHandle) -> Result<(), DeviceError> {
    let device = Arc::clone(device);
    within("synchronize_stream", move || device.synchronize_stream(stream))
}

fn event_sync(device: &Arc<CpuDevice>, event: &EventHandle) -> Result<(), DeviceError> {
    let device = Arc::clone(device);
    // The cpu device's events are plain ids: the copy names the same event.
    let event = EventHandle::from_raw(event.raw());
    within("event_synchronize", move || device.event_synchronize(&event))
}

/// A closure enqueued on `stream` that sets the returned flag when it runs.
fn flag_on(device: &CpuDevice, stream: StreamHandle) -> Arc<AtomicBool> {
    let flag = Arc::new(AtomicBool::new(false));
    let setter = Arc::clone(&flag);
    device
        .launch_host_closure(stream, move || setter.store(true, Ordering::SeqCst))
        .expect("enqueue closure");
    flag
}

fn word_at(addr: u64) -> &'static AtomicU32 {
    // SAFETY: tests only pass addresses of live, 4-aligned words of pinned allocations that
    // outlive every use of the returned reference within the test.
    unsafe { AtomicU32::from_ptr(addr as usize as *mut u32) }
}

fn fill(region: PinnedRegion, pattern: impl Fn(usize) -> u8) {
    // SAFETY: `region` is a live allocation of `len_bytes` bytes owned by the test.
    let bytes = unsafe { std::slice::from_raw_parts_mut(region.host_ptr, region.len_bytes) };
    for (index, byte) in bytes.iter_mut().enumerate() {
        *byte = pattern(index);
    }
}

fn bytes_of(region: PinnedRegion) -> Vec<u8> {
    // SAFETY: `region` is a live allocation of `len_bytes` bytes; no copy into it is
    // pending when tests read it.
    unsafe { std::slice::from_raw_parts(region.host_ptr, region.len_bytes) }.to_vec()
}

fn assert_code<T: std::fmt::Debug>(result: Result<T, DeviceError>, code: i32) {
    match result {
        Err(error) => assert_eq!(error.hip_error, code, "{error}"),
        Ok(value) => panic!("expected hipError {code}, got Ok({value:?})"),
    }
}

// ---------------------------------------------------------------------------------------
// Memory
// ---------------------------------------------------------------------------------------

#[test]
fn kind_count_and_memops() {
    let device = CpuDevice::new(2);
    let as_trait_object: Arc<dyn Device> = device.clone();
    assert_eq!(as_trait_object.kind(), DeviceKind::Cpu);
    assert_eq!(device.device_count(), 2);
    assert!(device.supports_stream_memops(0));
    assert!(device.supports_stream_memops(1));
    assert!(!device.supports_stream_memops(2));
}

#[test]
fn pointer_info_device_and_interior_pointers() {
    let device = CpuDevice::new(2);
    let base = device.malloc_device(1, 10_000).unwrap();
    assert_eq!(base % 4096, 0);
    for ptr in [base, base + 1, base + 5_000, base + 9_999] {
        let info = device.pointer_info(ptr).unwrap();
        assert_eq!(info.memory_type, MemoryType::Device);
        assert_eq!(info.device_ordinal, 1);
        assert_eq!(info.allocation_base, base);
        assert_eq!(info.allocation_len_bytes, 10_000);
    }
    // One past the end is not part of the allocation.
    let past = device.pointer_info(base + 10_000).unwrap();
    assert_eq!(past.allocation_len_bytes, 0);
    assert_eq!(past.memory_type, MemoryType::Host);
}

#[test]
fn pointer_info_host_managed_registered_unknown() {
    let device = CpuDevice::new(1);
    let pinned = device.malloc_host(100).unwrap();
    assert_eq!(pinned.device_addr, pinned.host_ptr as u64);
    let info = device.pointer_info(pinned.device_addr + 99).unwrap();
    assert_eq!(info.memory_type, MemoryType::Host);
    assert_eq!((info.allocation_base, info.allocation_len_bytes), (pinned.device_addr, 100));

    let managed = device.malloc_managed(64).unwrap();
    let info = device.pointer_info(managed + 63).unwrap();
    assert_eq!(info.memory_type, MemoryType::Managed);
    assert_eq!((info.allocation_base, info.allocation_len_bytes), (managed, 64));

    let mut user = vec![0u8; 256];
    let user_addr = user.as_mut_ptr() as u64;
    assert_eq!(device.pointer_info(user_addr + 8).unwrap().allocation_len_bytes, 0);
    // SAFETY: `user` outlives the registration (unregistered below).
    let mapped = unsafe { device.register_host(user.as_mut_ptr().add(16), 128) }.unwrap();
    assert_eq!(mapped, user_addr + 16);
    let info = device.pointer_info(user_addr + 100).unwrap();
    assert_eq!(info.memory_type, MemoryType::Host);
    assert_eq!((info.allocation_base, info.allocation_len_bytes), (user_addr + 16, 128));
    assert_eq!(device.pointer_info(user_addr + 8).unwrap().allocation_len_bytes, 0);
    // SAFETY: registered above; nothing enqueued uses it.
    unsafe { device.unregister_host(user.as_mut_ptr().add(16)) };
    assert_eq!(device.pointer_info(user_addr + 100).unwrap().allocation_len_bytes, 0);

    let unknown = device.pointer_info(0x10).unwrap();
    assert_eq!(unknown.memory_type, MemoryType::Host);
    assert_eq!((unknown.allocation_base, unknown.allocation_len_bytes), (0, 0));
    assert_eq!(unknown.device_ordinal, 0);
    assert_eq!(device.stats().invalid_releases, 0);
}

#[test]
fn allocation_errors_and_frees() {
    let device = CpuDevice::new(1);
    assert_code(device.malloc_device(1, 64), DeviceError::HIP_ERROR_INVALID_DEVICE);
    assert_code(device.malloc_device(0, 0), DeviceError::HIP_ERROR_INVALID_VALUE);
    assert_code(device.malloc_device(0, usize::MAX), DeviceError::HIP_ERROR_OUT_OF_MEMORY);
    let first = device.malloc_device(0, 64).unwrap();
    let second = device.malloc_device(0, 64).unwrap();
    assert_ne!(first, second);
    let pinned = device.alloc_pinned(4096).unwrap();
    // SAFETY: freeing test-owned allocations that nothing uses.
    unsafe {
        assert_code(device.free_device(first + 1), DeviceError::HIP_ERROR_INVALID_VALUE);
        assert_code(device.free_device(pinned.device_addr), DeviceError::HIP_ERROR_INVALID_VALUE);
        device.free_device(first).unwrap();
        assert_code(device.free_device(first), DeviceError::HIP_ERROR_INVALID_VALUE);
        device.free_pinned(pinned);
        assert_eq!(device.stats().invalid_releases, 0);
        device.free_pinned(pinned);
        assert_eq!(device.stats().invalid_releases, 1);
    }
    assert_eq!(device.pointer_info(first).unwrap().allocation_len_bytes, 0);
    assert_eq!(device.pointer_info(second).unwrap().memory_type, MemoryType::Device);
}

#[test]
fn register_host_rejects_overlaps() {
    let device = CpuDevice::new(1);
    let mut user = vec![0u8; 4096];
    let ptr = user.as_mut_ptr();
    // SAFETY: `user` outlives every registration; all are undone below.
    unsafe {
        device.register_host(ptr, 1024).unwrap();
        assert_code(device.register_host(ptr.add(512), 1024), DeviceError::HIP_ERROR_INVALID_VALUE);
        assert_code(device.register_host(ptr.add(1023), 1), DeviceError::HIP_ERROR_INVALID_VALUE);
        device.register_host(ptr.add(1024), 1024).unwrap();
        assert_code(device.register_host(ptr.add(2048), 0), DeviceError::HIP_ERROR_INVALID_VALUE);
        device.unregister_host(ptr);
        device.unregister_host(ptr.add(1024));
        assert_eq!(device.stats().invalid_releases, 0);
        device.unregister_host(ptr);
        assert_eq!(device.stats().invalid_releases, 1);
    }
}

// ---------------------------------------------------------------------------------------
// Copies
// ---------------------------------------------------------------------------------------

#[test]
fn host_to_device_and_back_copies_bytes() {
    let device = CpuDevice::new(1);
    let stream = device.create_internal_stream(0).unwrap();
    let len_bytes = 3 * 4096 + 17;
    let dev = device.malloc_device(0, len_bytes).unwrap();
    let source = device.alloc_pinned(len_bytes).unwrap();
    let target = device.alloc_pinned(len_bytes).unwrap();
    fill(source, |i| (i * 7 % 251) as u8);
    // SAFETY: all ranges are live test allocations untouched until the sync below.
    unsafe {
        device.copy_to_device_async(&stream, dev, source.host_ptr, len_bytes).unwrap();
        device.copy_from_device_async(&stream, target.host_ptr, dev, len_bytes).unwrap();
    }
    sync(&device, StreamHandle(stream.raw())).unwrap();
    assert_eq!(bytes_of(target), bytes_of(source));
    let stats = device.stats();
    assert_eq!(stats.bytes_host_to_device, len_bytes as u64);
    assert_eq!(stats.bytes_device_to_host, len_bytes as u64);
    assert_eq!(stats.async_errors, 0);
    device.destroy_internal_stream(stream);
}

#[test]
fn partial_copies_into_the_middle_of_allocations() {
    let device = CpuDevice::new(1);
    let stream = device.create_internal_stream(0).unwrap();
    let dev = device.malloc_device(0, 100).unwrap();
    let host = device.alloc_pinned(100).unwrap();
    fill(host, |i| i as u8);
    // SAFETY: live test allocations, synchronized before reading.
    unsafe {
        device.copy_to_device_async(&stream, dev + 10, host.host_ptr.add(50), 50).unwrap();
        device.copy_from_device_async(&stream, host.host_ptr, dev, 100).unwrap();
    }
    device.synchronize_internal(&stream).unwrap();
    let bytes = bytes_of(host);
    assert!(bytes[..10].iter().all(|&b| b == 0), "device memory starts zeroed");
    assert_eq!(bytes[10..60], (50..100).map(|i| i as u8).collect::<Vec<_>>()[..]);
    assert!(bytes[60..].iter().all(|&b| b == 0));
}

#[test]
fn copies_outside_the_rules_are_rejected() {
    let device = CpuDevice::new(1);
    let stream = device.create_internal_stream(0).unwrap();
    let dev = device.malloc_device(0, 4096).unwrap();
    let other_dev = device.malloc_device(0, 4096).unwrap();
    let managed = device.malloc_managed(4096).unwrap();
    let pinned = device.alloc_pinned(4096).unwrap();
    let mut unpinned = vec![0u8; 4096];
    let invalid = DeviceError::HIP_ERROR_INVALID_VALUE;
    // SAFETY: every call is rejected before anything is enqueued.
    unsafe {
        // Host side not pinned.
        assert_code(device.copy_to_device_async(&stream, dev, unpinned.as_ptr(), 16), invalid);
        assert_code(
            device.copy_from_device_async(&stream, unpinned.as_mut_ptr(), dev, 16),
            invalid,
        );
        // Device side past the allocation's end, or spanning two allocations.
        assert_code(device.copy_to_device_async(&stream, dev + 4000, pinned.host_ptr, 97), invalid);
        assert_code(
            device.copy_from_device_async(&stream, pinned.host_ptr, dev + 1, 4096),
            invalid,
        );
        let spanning = dev.min(other_dev) + 4000;
        assert_code(device.copy_to_device_async(&stream, spanning, pinned.host_ptr, 200), invalid);
        // Host side past the pinned range's end.
        assert_code(
            device.copy_to_device_async(&stream, dev, pinned.host_ptr.add(1), 4096),
            invalid,
        );
        // Wrong memory types: managed is not device memory, device is not pinned host.
        assert_code(device.copy_to_device_async(&stream, managed, pinned.host_ptr, 16), invalid);
        let dev_as_host = dev as usize as *const u8;
        assert_code(device.copy_to_device_async(&stream, other_dev, dev_as_host, 16), invalid);
        assert_code(
            device.copy_to_device_async(&stream, pinned.device_addr, pinned.host_ptr, 16),
            invalid,
        );
        // Unknown stream.
        let unknown = InternalStream::from_raw(usize::MAX);
        let result = device.copy_to_device_async(&unknown, dev, pinned.host_ptr, 16);
        assert_code(result, DeviceError::HIP_ERROR_INVALID_HANDLE);
    }
    device.synchronize_internal(&stream).unwrap();
    let stats = device.stats();
    assert_eq!(stats.bytes_host_to_device + stats.bytes_device_to_host, 0);
}

#[test]
fn registered_host_memory_counts_as_pinned() {
    let device = CpuDevice::new(1);
    let stream = device.create_internal_stream(0).unwrap();
    let dev = device.malloc_device(0, 64).unwrap();
    let mut arena = vec![0u8; 128];
    for (i, byte) in arena[..64].iter_mut().enumerate() {
        *byte = 200 - i as u8;
    }
    let ptr = arena.as_mut_ptr();
    // SAFETY: `arena` outlives the registration; the stream is synchronized before the
    // arena is read or unregistered.
    unsafe {
        device.register_host(ptr, 128).unwrap();
        device.copy_to_device_async(&stream, dev, ptr, 64).unwrap();
        device.copy_from_device_async(&stream, ptr.add(64), dev, 64).unwrap();
        device.synchronize_internal(&stream).unwrap();
        device.unregister_host(ptr);
        let result = device.copy_to_device_async(&stream, dev, ptr, 64);
        assert_code(result, DeviceError::HIP_ERROR_INVALID_VALUE);
    }
    assert_eq!(arena[..64], arena[64..]);
}

#[test]
fn memcpy_and_memset_on_user_streams() {
    let device = CpuDevice::new(1);
    let stream = device.create_stream(0).unwrap();
    let dev = device.malloc_device(0, 256).unwrap();
    let managed = device.malloc_managed(256).unwrap();
    let host = device.malloc_host(256).unwrap();
    let mut unpinned = vec![0u8; 256];
    // SAFETY: live test allocations, synchronized before reading.
    unsafe {
        device.memset_async(stream, dev, 0xAB, 200).unwrap();
        device.memcpy_async(stream, managed, dev, 256).unwrap();
        device.memcpy_async(stream, host.device_addr, managed, 256).unwrap();
        let invalid = DeviceError::HIP_ERROR_INVALID_VALUE;
        let unpinned_addr = unpinned.as_mut_ptr() as u64;
        assert_code(device.memcpy_async(stream, unpinned_addr, dev, 16), invalid);
        assert_code(device.memcpy_async(stream, dev, unpinned_addr, 16), invalid);
        assert_code(device.memcpy_async(stream, dev + 200, host.device_addr, 57), invalid);
        assert_code(device.memset_async(stream, unpinned_addr, 1, 16), invalid);
        assert_code(device.memset_async(stream, dev + 1, 1, 256), invalid);
    }
    sync(&device, stream).unwrap();
    let bytes = bytes_of(host);
    assert!(bytes[..200].iter().all(|&b| b == 0xAB));
    assert!(bytes[200..].iter().all(|&b| b == 0));
    let stats = device.stats();
    assert_eq!(stats.bytes_memset, 200);
    assert_eq!(stats.bytes_copied_other, 512);
    assert_eq!(unpinned, vec![0u8; 256]);
}

#[test]
fn freeing_memory_under_queued_copy_is_an_async_error() {
    let device = CpuDevice::new(1);
    let stream = device.create_internal_stream(0).unwrap();
    let dev = device.malloc_device(0, 64).unwrap();
    let host = device.alloc_pinned(64).unwrap();
    let gate = device.pause_stream(StreamHandle(stream.raw())).unwrap();
    // SAFETY: the copy is validated now; the device memory is freed before it runs, which
    // the device must turn into an error instead of a use-after-free.
    unsafe {
        device.copy_to_device_async(&stream, dev, host.host_ptr, 64).unwrap();
        let event = device.record_event(&stream).unwrap();
        device.free_device(dev).unwrap();
        gate.release();
        let error = event_sync(&device, &event).unwrap_err();
        assert_eq!(error.hip_error, DeviceError::HIP_ERROR_INVALID_VALUE);
        assert_code(device.event_done(&event), DeviceError::HIP_ERROR_INVALID_VALUE);
    }
    // The error is sticky for the stream.
    assert_code(device.synchronize_internal(&stream), DeviceError::HIP_ERROR_INVALID_VALUE);
    assert_eq!(device.stats().async_errors, 1);
    assert_eq!(device.stats().bytes_host_to_device, 0);
}

// ---------------------------------------------------------------------------------------
// Stream ordering
// ---------------------------------------------------------------------------------------

struct Recorder {
    order: Mutex<Vec<usize>>,
}

struct Step {
    recorder: Arc<Recorder>,
    index: usize,
}

unsafe extern "C" fn record_step(user_data: *mut c_void) {
    // SAFETY: `user_data` is a `Box<Step>` leaked by the test for exactly this call.
    let step = unsafe { Box::from_raw(user_data.cast::<Step>()) };
    step.recorder.order.lock().unwrap().push(step.index);
}

#[test]
fn host_functions_run_in_fifo_order() {
    let device = CpuDevice::new(1);
    let stream = device.create_stream(0).unwrap();
    let recorder = Arc::new(Recorder { order: Mutex::new(Vec::new()) });
    for index in 0..1000 {
        let step = Box::new(Step { recorder: Arc::clone(&recorder), index });
        // SAFETY: the boxed step is valid until `record_step` consumes it.
        unsafe { device.launch_host_func(stream, record_step, Box::into_raw(step).cast()) }
            .unwrap();
        if index % 100 == 0 {
            thread::yield_now();
        }
    }
    sync(&device, stream).unwrap();
    let order = recorder.order.lock().unwrap().clone();
    assert_eq!(order, (0..1000).collect::<Vec<_>>());
    assert_eq!(device.stats().host_fns_run, 1000);
}

#[test]
fn mixed_commands_keep_order() {
    // A copy, a host function that reads its result, a memset, and a second reader.
    let device = CpuDevice::new(1);
    let stream = device.create_stream(0).unwrap();
    let host = device.malloc_host(8).unwrap();
    let dev = device.malloc_device(0, 8).unwrap();
    fill(host, |_| 9);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let reader = |seen: &Arc<Mutex<Vec<u8>>>| {
        let (seen, dev) = (Arc::clone(seen), dev);
        move || {
            // SAFETY: `dev` is live until the device is dropped, and this stream is the
            // only one touching it (its earlier copy or memset has completed).
            let first_byte = unsafe { *(dev as usize as *const u8) };
            seen.lock().unwrap().push(first_byte);
        }
    };
    // SAFETY: live allocations, synchronized before being read here.
    unsafe {
        device.memcpy_async(stream, dev, host.device_addr, 8).unwrap();
        device.launch_host_closure(stream, reader(&seen)).unwrap();
        device.memset_async(stream, dev, 3, 8).unwrap();
        device.launch_host_closure(stream, reader(&seen)).unwrap();
    }
    sync(&device, stream).unwrap();
    assert_eq!(*seen.lock().unwrap(), vec![9, 3]);
}

#[test]
fn streams_run_in_parallel() {
    let device = CpuDevice::new(1);
    let blocked = device.create_stream(0).unwrap();
    let free = device.create_stream(0).unwrap();
    let gate = device.pause_stream(blocked).unwrap();
    let blocked_done = flag_on(&device, blocked);
    let blocked_event = device.record_event_on(blocked).unwrap();
    let free_done = flag_on(&device, free);
    // Stream B completes although stream A cannot proceed.
    sync(&device, free).unwrap();
    assert!(free_done.load(Ordering::SeqCst));
    assert!(!blocked_done.load(Ordering::SeqCst));
    assert!(!device.event_done(&blocked_event).unwrap());
    gate.release();
    event_sync(&device, &blocked_event).unwrap();
    assert!(blocked_done.load(Ordering::SeqCst));
}

#[test]
fn synchronize_waits_for_slow_work() {
    let device = CpuDevice::new(1);
    let stream = device.create_stream(0).unwrap();
    let finished = Arc::new(AtomicBool::new(false));
    let setter = Arc::clone(&finished);
    device
        .launch_host_closure(stream, move || {
            thread::sleep(Duration::from_millis(50));
            setter.store(true, Ordering::SeqCst);
        })
        .unwrap();
    sync(&device, stream).unwrap();
    assert!(finished.load(Ordering::SeqCst));
}

#[test]
fn events_complete_only_after_preceding_work() {
    let device = CpuDevice::new(1);
    let stream = device.create_internal_stream(0).unwrap();
    let gate = device.pause_stream(StreamHandle(stream.raw())).unwrap();
    let before = flag_on(&device, StreamHandle(stream.raw()));
    let event = device.record_event(&stream).unwrap();
    let after_gate = device.pause_stream(StreamHandle(stream.raw())).unwrap();
    for _ in 0..20 {
        assert!(!device.event_done(&event).unwrap());
        thread::sleep(Duration::from_millis(1));
    }
    gate.release();
    event_sync(&device, &event).unwrap();
    assert!(before.load(Ordering::SeqCst));
    assert!(device.event_done(&event).unwrap());
    // The event does not wait for work enqueued after it.
    let later = device.record_event(&stream).unwrap();
    assert!(!device.event_done(&later).unwrap());
    drop(after_gate);
    event_sync(&device, &later).unwrap();
    let destroyed = event.raw();
    device.destroy_event(event);
    device.destroy_event(later);
    // A destroyed event's id, named again, is an unknown event (and so is a handle that
    // no device made).
    let again = EventHandle::from_raw(destroyed);
    assert_code(device.event_done(&again), DeviceError::HIP_ERROR_INVALID_HANDLE);
    assert_code(device.event_synchronize(&again), DeviceError::HIP_ERROR_INVALID_HANDLE);
    assert_eq!(device.stats().invalid_releases, 0);
    device.destroy_event(again);
    assert_eq!(device.stats().invalid_releases, 1);
}

#[test]
fn event_on_idle_stream_is_done_at_once() {
    let device = CpuDevice::new(1);
    let stream = device.create_stream(0).unwrap();
    let event = device.record_event_on(stream).unwrap();
    assert!(device.event_done(&event).unwrap());
}

// ---------------------------------------------------------------------------------------
// Stream memory operations
// ---------------------------------------------------------------------------------------

#[test]
fn wait_value_released_by_plain_store_from_another_thread() {
    let device = CpuDevice::new(1);
    let stream = device.create_stream(0).unwrap();
    let words = device.malloc_host(64).unwrap();
    let addr = words.device_addr;
    // SAFETY: the word lives until the device is dropped, after the wait.
    unsafe { device.stream_wait_value32(stream, addr, 5) }.unwrap();
    let after = flag_on(&device, stream);
    let event = device.record_event_on(stream).unwrap();
    // Below the value (GEQ, unsigned): still blocked.
    word_at(addr).store(4, Ordering::Release);
    thread::sleep(Duration::from_millis(20));
    assert!(!after.load(Ordering::SeqCst));
    assert!(!device.event_done(&event).unwrap());
    let storer = thread::spawn(move || word_at(addr).store(7, Ordering::Release));
    storer.join().unwrap();
    event_sync(&device, &event).unwrap();
    assert!(after.load(Ordering::SeqCst));
    assert_eq!(device.stats().wait_values_executed, 1);
}

#[test]
fn wait_value_released_by_store_word() {
    let device = CpuDevice::new(1);
    let stream = device.create_stream(0).unwrap();
    let words = device.malloc_host(64).unwrap();
    let addr = words.device_addr + 8;
    // SAFETY: the word lives until the device is dropped.
    unsafe { device.stream_wait_value32(stream, addr, 1) }.unwrap();
    let after = flag_on(&device, stream);
    thread::sleep(Duration::from_millis(10));
    assert!(!after.load(Ordering::SeqCst));
    // SAFETY: the word is only accessed atomically.
    unsafe { device.store_word(addr, 1) }.unwrap();
    sync(&device, stream).unwrap();
    assert!(after.load(Ordering::SeqCst));
    assert_eq!(word_at(addr).load(Ordering::Acquire), 1);
    // SAFETY: as above; these are rejected.
    unsafe {
        let misaligned = device.store_word(addr + 1, 1);
        assert_code(misaligned, DeviceError::HIP_ERROR_INVALID_VALUE);
        let past_end = device.store_word(words.device_addr + 64, 1);
        assert_code(past_end, DeviceError::HIP_ERROR_INVALID_VALUE);
    }
}

#[test]
fn wait_value_rejects_untracked_or_misaligned_words() {
    let device = CpuDevice::new(1);
    let stream = device.create_stream(0).unwrap();
    let own_word = Box::new(AtomicU32::new(0));
    let own_addr = &*own_word as *const AtomicU32 as u64;
    let pinned = device.malloc_host(8).unwrap();
    let invalid = DeviceError::HIP_ERROR_INVALID_VALUE;
    // SAFETY: every call is rejected before anything is enqueued.
    unsafe {
        assert_code(device.stream_wait_value32(stream, own_addr, 1), invalid);
        assert_code(device.stream_write_value32(stream, own_addr, 1), invalid);
        assert_code(device.stream_wait_value32(stream, pinned.device_addr + 2, 1), invalid);
        assert_code(device.stream_write_value32(stream, pinned.device_addr + 6, 1), invalid);
    }
    sync(&device, stream).unwrap();
}

#[test]
fn write_value_on_one_stream_releases_wait_on_another() {
    let device = CpuDevice::new(1);
    let waiter = device.create_stream(0).unwrap();
    let writer = device.create_internal_stream(0).unwrap();
    let words = device.malloc_host(4).unwrap();
    let addr = words.device_addr;
    // SAFETY: the word lives until the device is dropped.
    unsafe { device.stream_wait_value32(waiter, addr, 3) }.unwrap();
    let after = flag_on(&device, waiter);
    // The writer itself waits for a gate, so the release is ordered after it.
    let gate = device.pause_stream(StreamHandle(writer.raw())).unwrap();
    // SAFETY: as above.
    unsafe { device.write_value32_internal(&writer, addr, 3) }.unwrap();
    thread::sleep(Duration::from_millis(10));
    assert!(!after.load(Ordering::SeqCst));
    assert_eq!(word_at(addr).load(Ordering::Acquire), 0);
    gate.release();
    sync(&device, waiter).unwrap();
    assert!(after.load(Ordering::SeqCst));
    assert_eq!(word_at(addr).load(Ordering::Acquire), 3);
    let stats = device.stats();
    assert_eq!(stats.write_values_executed, 1);
    assert_eq!(stats.wait_values_executed, 2, "the gate's wait and the word's wait");
}

#[test]
fn write_value_is_ordered_after_earlier_work() {
    let device = CpuDevice::new(1);
    let stream = device.create_stream(0).unwrap();
    let words = device.malloc_host(4).unwrap();
    let addr = words.device_addr;
    let seen_at_write = Arc::new(AtomicU32::new(u32::MAX));
    let seen = Arc::clone(&seen_at_write);
    device
        .launch_host_closure(stream, move || {
            thread::sleep(Duration::from_millis(20));
            seen.store(word_at(addr).load(Ordering::Acquire), Ordering::SeqCst);
        })
        .unwrap();
    // SAFETY: the word lives until the device is dropped.
    unsafe { device.stream_write_value32(stream, addr, 42) }.unwrap();
    sync(&device, stream).unwrap();
    assert_eq!(seen_at_write.load(Ordering::SeqCst), 0);
    assert_eq!(word_at(addr).load(Ordering::Acquire), 42);
}

// ---------------------------------------------------------------------------------------
// Gates
// ---------------------------------------------------------------------------------------

#[test]
fn pause_stream_holds_until_release() {
    let device = CpuDevice::new(1);
    let stream = device.create_stream(0).unwrap();
    let before = flag_on(&device, stream);
    let gate = device.pause_stream(stream).unwrap();
    let info = device.pointer_info(gate.word_addr()).unwrap();
    assert_eq!(info.memory_type, MemoryType::Host, "gate word is pinned host memory");
    let after = flag_on(&device, stream);
    eventually("work before the gate", || before.load(Ordering::SeqCst));
    thread::sleep(Duration::from_millis(20));
    assert!(!after.load(Ordering::SeqCst));
    gate.release();
    sync(&device, stream).unwrap();
    assert!(after.load(Ordering::SeqCst));
}

#[test]
fn dropping_a_gate_releases_it() {
    let device = CpuDevice::new(1);
    let stream = device.create_stream(0).unwrap();
    let gate: StreamGate = device.pause_stream(stream).unwrap();
    let word = gate.word_addr();
    let after = flag_on(&device, stream);
    thread::sleep(Duration::from_millis(10));
    assert!(!after.load(Ordering::SeqCst));
    drop(gate);
    sync(&device, stream).unwrap();
    assert!(after.load(Ordering::SeqCst));
    // Once both the gate and the wait are gone, the gate word is freed.
    eventually("gate word freed", || device.pointer_info(word).unwrap().allocation_len_bytes == 0);
}

#[test]
fn gates_on_several_streams_release_independently() {
    let device = CpuDevice::new(2);
    let streams: Vec<_> = (0..4).map(|i| device.create_stream(i % 2).unwrap()).collect();
    let gates: Vec<_> = streams.iter().map(|&s| device.pause_stream(s).unwrap()).collect();
    let flags: Vec<_> = streams.iter().map(|&s| flag_on(&device, s)).collect();
    for (index, gate) in gates.into_iter().enumerate().rev() {
        gate.release();
        sync(&device, streams[index]).unwrap();
        for (other, flag) in flags.iter().enumerate() {
            assert_eq!(flag.load(Ordering::SeqCst), other >= index, "stream {other}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// Handles, devices, errors
// ---------------------------------------------------------------------------------------

#[test]
fn unknown_and_destroyed_streams_are_invalid_handles() {
    let device = CpuDevice::new(1);
    let stream = device.create_stream(0).unwrap();
    let words = device.malloc_host(64).unwrap();
    let word = words.device_addr;
    device.destroy_stream(stream).unwrap();
    let other = CpuDevice::new(1).create_stream(0).unwrap();
    for bad in [stream, StreamHandle(usize::MAX), other] {
        let internal = InternalStream::from_raw(bad.0);
        let handle = DeviceError::HIP_ERROR_INVALID_HANDLE;
        assert_code(device.stream_device(bad), handle);
        assert_code(device.synchronize_stream(bad), handle);
        assert_code(device.synchronize_internal(&internal), handle);
        assert_code(device.record_event_on(bad), handle);
        assert_code(device.record_event(&internal), handle);
        assert_code(device.launch_host_closure(bad, || {}), handle);
        assert_code(device.pause_stream(bad), handle);
        assert_code(device.destroy_stream(bad), handle);
        // SAFETY: every call is rejected before anything is enqueued.
        unsafe {
            extern "C" fn nothing(_: *mut c_void) {}
            assert_code(device.launch_host_func(bad, nothing, std::ptr::null_mut()), handle);
            assert_code(device.stream_wait_value32(bad, word, 0), handle);
            assert_code(device.stream_write_value32(bad, word, 0), handle);
            assert_code(device.write_value32_internal(&internal, word, 0), handle);
            assert_code(device.memset_async(bad, word, 0, 4), handle);
            assert_code(device.memcpy_async(bad, word, word + 8, 4), handle);
            let pinned = words.host_ptr;
            assert_code(device.copy_to_device_async(&internal, word, pinned, 4), handle);
            assert_code(device.copy_from_device_async(&internal, pinned, word, 4), handle);
        }
    }
    assert_code(device.destroy_stream(StreamHandle::NULL), DeviceError::HIP_ERROR_INVALID_HANDLE);
    device.destroy_internal_stream(InternalStream::from_raw(stream.0));
    assert_eq!(device.stats().invalid_releases, 1);
}

#[test]
fn destroy_stream_drains_queued_work() {
    let device = CpuDevice::new(1);
    let stream = device.create_stream(0).unwrap();
    let gate = device.pause_stream(stream).unwrap();
    let ran = flag_on(&device, stream);
    device.destroy_stream(stream).unwrap();
    assert!(!ran.load(Ordering::SeqCst));
    gate.release();
    eventually("queued work of a destroyed stream runs", || ran.load(Ordering::SeqCst));
}

#[test]
fn stream_handles_are_unique_and_never_zero() {
    let device = CpuDevice::new(2);
    let mut handles = Vec::new();
    for i in 0..20 {
        let stream = device.create_stream(i % 2).unwrap();
        assert_eq!(device.stream_device(stream).unwrap(), i % 2);
        handles.push(stream.0);
        if i % 3 == 0 {
            device.destroy_stream(stream).unwrap();
        }
    }
    handles.push(device.create_internal_stream(1).unwrap().raw());
    let count = handles.len();
    handles.sort_unstable();
    handles.dedup();
    assert_eq!(handles.len(), count);
    assert!(!handles.contains(&0));
    assert_code(device.create_stream(2), DeviceError::HIP_ERROR_INVALID_DEVICE);
    assert_code(device.create_internal_stream(7), DeviceError::HIP_ERROR_INVALID_DEVICE);
}

#[test]
fn null_stream_exists_and_follows_current_device() {
    let device = CpuDevice::new(3);
    assert_eq!(device.current_device(), 0);
    assert_eq!(device.stream_device(StreamHandle::NULL).unwrap(), 0);
    device.set_current_device(2).unwrap();
    assert_eq!(device.current_device(), 2);
    assert_eq!(device.stream_device(StreamHandle::NULL).unwrap(), 2);
    assert_code(device.set_current_device(3), DeviceError::HIP_ERROR_INVALID_DEVICE);
    assert_eq!(device.current_device(), 2);
    // The current device is per thread.
    let other = Arc::clone(&device);
    let seen = thread::spawn(move || other.stream_device(StreamHandle::NULL).unwrap());
    assert_eq!(seen.join().unwrap(), 0);
    // ... and per device object.
    assert_eq!(CpuDevice::new(3).current_device(), 0);
    // The NULL stream runs work.
    let ran = flag_on(&device, StreamHandle::NULL);
    sync(&device, StreamHandle::NULL).unwrap();
    assert!(ran.load(Ordering::SeqCst));
}

#[test]
fn zero_devices_means_no_streams() {
    let device = CpuDevice::new(0);
    let invalid_device = DeviceError::HIP_ERROR_INVALID_DEVICE;
    assert_code(device.create_stream(0), invalid_device);
    assert_code(device.malloc_device(0, 64), invalid_device);
    assert_code(device.synchronize_stream(StreamHandle::NULL), invalid_device);
    assert!(!device.supports_stream_memops(0));
}

#[test]
fn panicking_host_closure_does_not_hang_the_stream() {
    let device = CpuDevice::new(1);
    let stream = device.create_stream(0).unwrap();
    // (The panic message on stderr is expected.)
    device.launch_host_closure(stream, || panic!("expected test panic in a host closure")).unwrap();
    let after = flag_on(&device, stream);
    sync(&device, stream).unwrap();
    assert!(after.load(Ordering::SeqCst));
    let stats = device.stats();
    assert_eq!(stats.host_fn_panics, 1);
    assert_eq!(stats.host_fns_run, 2);
}

#[test]
fn dropping_the_device_with_a_held_gate_does_not_hang() {
    let device = CpuDevice::new(1);
    let stream = device.create_stream(0).unwrap();
    let gate = device.pause_stream(stream).unwrap();
    let never = flag_on(&device, stream);
    within("device drop", move || drop(device));
    assert!(!never.load(Ordering::SeqCst), "work after an abandoned wait is discarded");
    drop(gate);
}

#[test]
fn dropping_the_device_drains_runnable_work() {
    let device = CpuDevice::new(1);
    let stream = device.create_stream(0).unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    for _ in 0..100 {
        let count = Arc::clone(&count);
        device
            .launch_host_closure(stream, move || {
                count.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
    }
    within("device drop", move || drop(device));
    assert_eq!(count.load(Ordering::SeqCst), 100);
}

#[test]
fn concurrent_enqueuers_on_one_stream() {
    let device = CpuDevice::new(1);
    let stream = device.create_stream(0).unwrap();
    let total = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (device, total) = (Arc::clone(&device), Arc::clone(&total));
            thread::spawn(move || {
                for _ in 0..250 {
                    let total = Arc::clone(&total);
                    let add = move || {
                        total.fetch_add(1, Ordering::SeqCst);
                    };
                    device.launch_host_closure(stream, add).unwrap();
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    sync(&device, stream).unwrap();
    assert_eq!(total.load(Ordering::SeqCst), 1000);
}

// ---------------------------------------------------------------------------------------
// Idle behaviour
// ---------------------------------------------------------------------------------------

/// Total CPU time (user + system) in milliseconds of this process's threads whose name is
/// one of `names`, read from `/proc/self/task/*/{comm,stat}`.
fn cpu_ms_of_threads(names: &[String]) -> u64 {
    // SAFETY: sysconf has no preconditions.
    let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let mut ticks = 0;
    let mut found = 0;
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if !names.iter().any(|name| name == comm.trim_end()) {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        let after_name = &stat[stat.rfind(')').map_or(0, |i| i + 2)..];
        let fields: Vec<&str> = after_name.split_whitespace().collect();
        // Fields 14 and 15 of stat (utime, stime) are 11 and 12 after the name.
        ticks += fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
        found += 1;
    }
    assert_eq!(found, names.len(), "worker threads not found: {names:?}");
    ticks * 1000 / ticks_per_second
}

#[test]
fn idle_and_waiting_workers_do_not_burn_cpu() {
    let device = CpuDevice::new(1);
    let streams: Vec<_> = (0..4).map(|_| device.create_stream(0).unwrap()).collect();
    for &stream in &streams {
        flag_on(&device, stream);
        sync(&device, stream).unwrap();
    }
    let waiting = device.create_stream(0).unwrap();
    let gate = device.pause_stream(waiting).unwrap();
    let names = |streams: &[StreamHandle]| -> Vec<String> {
        streams.iter().map(|s| format!("hfcpu-s{}", s.0)).collect()
    };
    let (idle_names, waiting_names) = (names(&streams), names(&[waiting]));
    thread::sleep(Duration::from_millis(20));
    let idle_before = cpu_ms_of_threads(&idle_names);
    let waiting_before = cpu_ms_of_threads(&waiting_names);
    thread::sleep(Duration::from_millis(200));
    let idle_ms = cpu_ms_of_threads(&idle_names) - idle_before;
    let waiting_ms = cpu_ms_of_threads(&waiting_names) - waiting_before;
    assert!(idle_ms <= 20, "4 idle workers used {idle_ms} ms of CPU in 200 ms");
    // A waiting worker polls every ~200 µs (about 10-15% of a core on a VM, measured);
    // a spinning one would use the whole 200 ms.
    assert!(waiting_ms <= 100, "a waiting worker used {waiting_ms} ms of CPU in 200 ms");
    gate.release();
    sync(&device, waiting).unwrap();
}

/// A process that used the cpu device forks; in the child (where the stream workers do
/// not exist) using a stream of the parent's device fails with hipErrorNotInitialized
/// instead of waiting forever; the parent's streams go on working.
#[test]
fn a_forked_child_gets_an_error_from_the_parents_streams_not_a_hang() {
    let device = CpuDevice::new(1);
    let stream = device.create_stream(0).unwrap();
    sync(&device, stream).unwrap();
    // SAFETY: fork in a test process; the child only calls the device (no allocation
    // before the check that fails, no locks) and leaves with _exit.
    let child = unsafe { libc::fork() };
    assert!(child >= 0, "fork");
    if child == 0 {
        unsafe extern "C" fn nothing(_: *mut c_void) {}
        // Work for the stream, then a wait for it: without a worker it would never run.
        // SAFETY: a host function that does nothing, with no data.
        let launched = unsafe { device.launch_host_func(stream, nothing, std::ptr::null_mut()) };
        let synced = launched.and_then(|()| device.synchronize_stream(stream));
        let code = match synced {
            Err(error) if error.hip_error == DeviceError::HIP_ERROR_NOT_INITIALIZED => 0,
            Err(_) => 2,
            Ok(()) => 3,
        };
        // SAFETY: leaves the child at once, running no destructors or atexit handlers.
        unsafe { libc::_exit(code) };
    }
    let deadline = Instant::now() + HANG_GUARD;
    let mut status = 0;
    loop {
        // SAFETY: waits for our own child without blocking.
        let done = unsafe { libc::waitpid(child, &mut status, libc::WNOHANG) };
        if done == child {
            break;
        }
        if Instant::now() > deadline {
            // SAFETY: our child.
            unsafe { libc::kill(child, libc::SIGKILL) };
            panic!("the forked child hung on the parent's stream");
        }
        thread::sleep(Duration::from_millis(5));
    }
    assert!(libc::WIFEXITED(status), "child status {status}");
    assert_eq!(libc::WEXITSTATUS(status), 0, "0: error 3 as expected; 2: another error; 3: Ok");
    sync(&device, stream).unwrap();
}

/// The permissions (`rw-p`, `---p`, …) of the mapping holding `addr`, from
/// `/proc/self/maps`.
fn permissions_at(addr: u64) -> Option<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        let (range, permissions) = (fields.next()?, fields.next()?);
        let (start, end) = range.split_once('-')?;
        let (start, end) =
            (u64::from_str_radix(start, 16).ok()?, u64::from_str_radix(end, 16).ok()?);
        (start <= addr && addr < end).then(|| permissions.to_string())
    })
}

/// Every allocation of the device (device memory, pinned host memory) sits between two
/// inaccessible guard pages, so a read or write by the library just outside a buffer
/// faults instead of touching a neighbour (the data-path canary tests check the bytes;
/// this checks the fence).
#[test]
fn allocations_sit_between_guard_pages() {
    let device = CpuDevice::new(1);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    for len in [1usize, 4096, 5000, 3 * 4096, 1 << 20] {
        let base = device.malloc_device(0, len).unwrap();
        let pinned = device.malloc_host(len).unwrap();
        for (what, start) in [("device", base), ("pinned", pinned.host_ptr as u64)] {
            assert_eq!(start % page, 0, "{what} allocation of {len} B is page-aligned");
            let body_end = start + (len as u64).next_multiple_of(page);
            assert_eq!(
                permissions_at(start - 1).as_deref(),
                Some("---p"),
                "{what} {len} B: guard before"
            );
            assert_eq!(permissions_at(start).as_deref(), Some("rw-p"), "{what} {len} B: body");
            assert_eq!(
                permissions_at(body_end - 1).as_deref(),
                Some("rw-p"),
                "{what} {len} B: last byte"
            );
            assert_eq!(
                permissions_at(body_end).as_deref(),
                Some("---p"),
                "{what} {len} B: guard after"
            );
        }
        // SAFETY: nothing uses the memory any more.
        unsafe {
            device.free_device(base).unwrap();
            device.free_host(pinned).unwrap();
        }
    }
}
