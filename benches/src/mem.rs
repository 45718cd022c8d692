//! Device memory, pinned host memory and user streams, owned with RAII, on any backend
//! (through [`UserDevice`]).

use std::sync::Arc;

use hipfile_runtime::Driver;
use hipfile_runtime::device::user::UserDevice;
use hipfile_runtime::device::{PinnedRegion, StreamHandle};

use crate::error::{Context, Result};

/// A device allocation, freed on drop.
pub struct DeviceBuf {
    device: Arc<dyn UserDevice>,
    /// Device address of the first byte.
    pub addr: u64,
    /// Length in bytes.
    pub len: usize,
}

impl DeviceBuf {
    /// Allocates `len` bytes on device 0.
    pub fn alloc(device: &Arc<dyn UserDevice>, len: usize) -> Result<DeviceBuf> {
        DeviceBuf::alloc_on(device, 0, len)
    }

    /// Allocates `len` bytes on device `ordinal`.
    pub fn alloc_on(device: &Arc<dyn UserDevice>, ordinal: u32, len: usize) -> Result<DeviceBuf> {
        let addr = device
            .alloc_device(ordinal, len)
            .ctx(format!("allocating {len} bytes of memory on device {ordinal}"))?;
        Ok(DeviceBuf { device: Arc::clone(device), addr, len })
    }
}

impl Drop for DeviceBuf {
    fn drop(&mut self) {
        // SAFETY: every user of the buffer synchronizes the streams that touched it before
        // the buffer goes away ([`StreamSet`] synchronizes on drop; the driver's ops are
        // stream-ordered on those streams, and sync I/O has returned).
        let _ = unsafe { self.device.free_device(self.addr) };
    }
}

/// Pinned, device-mapped host memory, freed on drop.
pub struct Pinned {
    device: Arc<dyn UserDevice>,
    region: PinnedRegion,
}

impl Pinned {
    /// Allocates `len` bytes (at least 1) of pinned memory, 4096-aligned.
    pub fn alloc(device: &Arc<dyn UserDevice>, len: usize) -> Result<Pinned> {
        let region = device
            .alloc_pinned(len.max(1))
            .ctx(format!("allocating {len} bytes of pinned memory"))?;
        Ok(Pinned { device: Arc::clone(device), region })
    }

    /// Host address of the first byte.
    pub fn ptr(&self) -> *mut u8 {
        self.region.host_ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.region.len_bytes
    }

    /// The bytes; look only after the copies that write them have been synchronized.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: a live allocation of `len_bytes` bytes; the tool reads it only between
        // synchronizations, when no copy or thread writes it.
        unsafe { std::slice::from_raw_parts(self.region.host_ptr, self.region.len_bytes) }
    }

    /// The bytes, exclusively.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `bytes`, and `&mut self` makes the borrow exclusive on the host side.
        unsafe { std::slice::from_raw_parts_mut(self.region.host_ptr, self.region.len_bytes) }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: every copy using the region was synchronized by its user before the
        // region goes away (see `StreamSet`).
        unsafe { self.device.free_pinned(self.region) };
    }
}

/// A host address that threads may share (each thread touches a disjoint range).
#[derive(Clone, Copy)]
pub struct SharedPtr(pub usize);

impl SharedPtr {
    /// The address of `pinned`'s first byte.
    pub fn of(pinned: &Pinned) -> SharedPtr {
        SharedPtr(pinned.ptr() as usize)
    }

    /// `len` bytes at `offset`, exclusively.
    ///
    /// # Safety
    /// The range lies inside the allocation, which outlives the slice, and no other
    /// thread or copy touches it while the slice lives.
    pub unsafe fn slice_mut<'a>(self, offset: usize, len: usize) -> &'a mut [u8] {
        // SAFETY: guaranteed by the caller.
        unsafe { std::slice::from_raw_parts_mut((self.0 + offset) as *mut u8, len) }
    }
}

/// User streams, synchronized, deregistered (when registered) and destroyed on drop.
pub struct StreamSet {
    device: Arc<dyn UserDevice>,
    driver: Option<Arc<Driver>>,
    /// The streams.
    pub handles: Vec<StreamHandle>,
}

impl StreamSet {
    /// Creates `count` streams on device 0.
    pub fn create(device: &Arc<dyn UserDevice>, count: usize) -> Result<StreamSet> {
        StreamSet::create_on(device, 0, count)
    }

    /// Creates `count` streams on device `ordinal`.
    pub fn create_on(
        device: &Arc<dyn UserDevice>,
        ordinal: u32,
        count: usize,
    ) -> Result<StreamSet> {
        let mut set = StreamSet { device: Arc::clone(device), driver: None, handles: Vec::new() };
        for _ in 0..count {
            set.handles.push(device.create_user_stream(ordinal).ctx("creating a stream")?);
        }
        Ok(set)
    }

    /// Creates `count` streams spread over `devices` devices: stream `i` on device
    /// `i mod devices`.
    pub fn create_spread(
        device: &Arc<dyn UserDevice>,
        count: usize,
        devices: u32,
    ) -> Result<StreamSet> {
        let mut set = StreamSet { device: Arc::clone(device), driver: None, handles: Vec::new() };
        for i in 0..count {
            let ordinal = (i % devices.max(1) as usize) as u32;
            set.handles.push(device.create_user_stream(ordinal).ctx("creating a stream")?);
        }
        Ok(set)
    }

    /// Registers every stream with the driver (`hipFileStreamRegister(stream, flags)`).
    pub fn register(&mut self, driver: &Arc<Driver>, flags: u32) -> Result<()> {
        self.register_each(driver, |_| flags)
    }

    /// Registers stream `i` with the driver with flags `flags_of(i)`.
    pub fn register_each(
        &mut self,
        driver: &Arc<Driver>,
        flags_of: impl Fn(usize) -> u32,
    ) -> Result<()> {
        // Set first: a failure part-way still deregisters the streams registered so far
        // (deregistering one that is not registered is a harmless error).
        self.driver = Some(Arc::clone(driver));
        for (index, &stream) in self.handles.iter().enumerate() {
            let flags = flags_of(index);
            driver.stream_register(stream, flags).ctx(format!("stream_register(flags {flags})"))?;
        }
        Ok(())
    }

    /// Waits for every stream.
    pub fn sync_all(&self) -> Result<()> {
        for &stream in &self.handles {
            self.device.synchronize_stream(stream).ctx("synchronizing a stream")?;
        }
        Ok(())
    }
}

impl Drop for StreamSet {
    fn drop(&mut self) {
        for &stream in &self.handles {
            let _ = self.device.synchronize_stream(stream);
            if let Some(driver) = &self.driver {
                let _ = driver.stream_deregister(stream);
            }
            let _ = self.device.destroy_user_stream(stream);
        }
    }
}

/// Sets `len` bytes of device memory at `target` to `byte`, and waits.
pub fn memset(device: &Arc<dyn UserDevice>, target: u64, byte: u8, len: usize) -> Result<()> {
    let streams = StreamSet::create(device, 1)?;
    // SAFETY: the caller passes a range of its own device allocation that no other work
    // uses; synchronized below.
    unsafe { device.memset_on(streams.handles[0], target, byte, len) }.ctx("device memset")?;
    streams.sync_all()
}

/// Copies `len` bytes of `host` (from its start) to device address `target`, and waits.
pub fn upload(device: &Arc<dyn UserDevice>, target: u64, host: &Pinned, len: usize) -> Result<()> {
    let streams = StreamSet::create(device, 1)?;
    // SAFETY: `host` is pinned, holds at least `len` bytes (callers pass its length or
    // less) and stays alive until the synchronization below; the target is device memory
    // of the caller's allocation.
    unsafe {
        device.copy_to_device_on(streams.handles[0], target, host.ptr(), len.min(host.len()))
    }
    .ctx("host-to-device copy")?;
    streams.sync_all()
}

/// Copies `len` bytes from device address `source` into `host` (from its start), and waits.
pub fn download(
    device: &Arc<dyn UserDevice>,
    host: &mut Pinned,
    source: u64,
    len: usize,
) -> Result<()> {
    let streams = StreamSet::create(device, 1)?;
    // SAFETY: as in `upload`, with `host` written (exclusively borrowed) by the copy.
    unsafe {
        device.copy_from_device_on(streams.handles[0], host.ptr(), source, len.min(host.len()))
    }
    .ctx("device-to-host copy")?;
    streams.sync_all()
}
