//! A safe, owning Rust API over [`Driver`] for embedders (synchronous I/O).
//!
//! The C-shaped [`Driver`] works with raw descriptors, handle ids and an explicit use
//! count. This module ties each of them to a Rust value instead:
//!
//! - [`HipFile`] holds one use of the driver: [`HipFile::open`] calls [`Driver::open`]
//!   and dropping it calls [`Driver::close`]. Clones hold one use each.
//! - [`RegisteredFile`] is a registered file handle (`hipFileHandleRegister`); dropping
//!   it deregisters the handle. It borrows the descriptor it was registered from, so the
//!   descriptor cannot be closed (and its number reused) while it is registered.
//! - [`RegisteredDeviceBuffer`] is a registered device buffer (`hipFileBufRegister`);
//!   dropping it deregisters the buffer.
//!
//! Device memory is named by a [`DeviceSpan`] (a device address and a length), as GPU
//! runtimes name it: an opaque `u64`, never dereferenced by safe code. Every read and
//! write checks with the device that the span is device memory before touching it.
//!
//! Reads and writes do not need a registered buffer: an unregistered span is resolved to
//! the device allocation holding it. A span whose address is the base of a registered
//! buffer uses that registration (and its length), as `hipFileRead` does.
//!
//! # Example
//!
//! Reading a file into memory of the in-process `cpu` device:
//!
//! ```
//! use hipfile_runtime::Driver;
//! use hipfile_runtime::api::{DeviceSpan, HipFile};
//! use hipfile_runtime::config::Config;
//! use hipfile_runtime::device::cpu::CpuDevice;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let device = CpuDevice::new(1);
//! let mut config = Config::default();
//! config.executor_cpus = vec![0];
//! config.request_parallelism = 1;
//! config.staging_chunk_bytes = 256 << 10;
//! config.staging_per_executor_bytes = 4 << 20;
//! config.validate()?;
//! let hipfile = HipFile::open(Driver::new(config, device.clone()));
//!
//! let path = std::env::temp_dir().join(format!("hipfile-api-doc-{}", std::process::id()));
//! let data: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
//! std::fs::write(&path, &data)?;
//! let file = std::fs::File::open(&path)?;
//! let registered = hipfile.register_file(&file)?;
//!
//! let addr = device.malloc_device(0, data.len())?;
//! let span = DeviceSpan { addr, len_bytes: data.len() as u64 };
//! let buffer = hipfile.register_buffer(span)?; // optional: I/O works without it
//! let n_bytes = registered.read(span, 0)?;
//! assert_eq!(n_bytes, data.len());
//!
//! // SAFETY: `cpu` device memory is host memory; `addr` holds `n_bytes` initialised
//! // bytes and nothing writes them while the slice lives.
//! let got = unsafe { std::slice::from_raw_parts(addr as *const u8, n_bytes) };
//! assert_eq!(got, &data[..]);
//!
//! drop(buffer);
//! drop(registered);
//! std::fs::remove_file(&path)?;
//! # Ok(())
//! # }
//! ```

use std::marker::PhantomData;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::Arc;

use hipfile_core::{Direction, OpError, RawIo};

use crate::driver::{Driver, HandleId};
use crate::error::{Error, IoError};
use crate::file::{FileCounters, FileHandle};

/// A range of device memory: `len_bytes` bytes from the device address `addr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DeviceSpan {
    /// Device address of the first byte.
    pub addr: u64,
    /// Length in bytes.
    pub len_bytes: u64,
}

/// One use of a [`Driver`]: opened on creation, closed on drop.
///
/// While any `HipFile` of a driver lives, the driver's use count is above 0, so its file
/// and buffer registrations stay in place (unless someone calls [`Driver::close`]
/// directly, which this type cannot prevent).
#[derive(Debug)]
pub struct HipFile {
    driver: Arc<Driver>,
}

impl HipFile {
    /// Opens `driver` (`hipFileDriverOpen`: increments its use count).
    pub fn open(driver: Arc<Driver>) -> HipFile {
        driver.open();
        HipFile { driver }
    }

    /// Opens the process-wide driver, configured from the `HIPFILE_*` environment
    /// ([`crate::driver::process::runtime`]'s driver).
    ///
    /// # Errors
    /// The device selected by `HIPFILE_DEVICE` is not available
    /// (`hipFileDeviceNotFound`).
    pub fn from_env() -> Result<HipFile, Error> {
        Ok(HipFile::open(Arc::clone(Driver::global()?)))
    }

    /// The driver.
    pub fn driver(&self) -> &Arc<Driver> {
        &self.driver
    }

    /// Registers `file` (`hipFileHandleRegister`). The returned value borrows `file`:
    /// the descriptor stays open, and registered, until it is dropped.
    ///
    /// The driver keeps descriptors of its own on the same file, with the same access
    /// mode, so reads need `file` opened for reading and writes need it opened for
    /// writing.
    ///
    /// # Errors
    /// - `hipFileHandleAlreadyRegistered` when this descriptor is already registered;
    /// - `hipFileIONotSupported` when it is not a regular file or block device, or is
    ///   open neither for reading nor writing;
    /// - `hipFileInternalError` when the driver cannot inspect or reopen it.
    pub fn register_file<'fd, F: AsFd>(&self, file: &'fd F) -> Result<RegisteredFile<'fd>, Error> {
        let fd = file.as_fd();
        let id = self.driver.handle_register(fd.as_raw_fd())?;
        // Keeping the handle alive keeps its id (its address) unique: a later handle
        // cannot get the same id while this one exists.
        let handle = self.driver.file(id)?;
        Ok(RegisteredFile { driver: Arc::clone(&self.driver), id, handle, _fd: PhantomData })
    }

    /// Registers a device buffer (`hipFileBufRegister`); the registration ends when the
    /// returned value is dropped.
    ///
    /// # Errors
    /// - `hipFileInvalidValue` for address 0;
    /// - `hipFileHipMemoryTypeInvalid` when `span` is not device memory (host, managed);
    /// - `hipFileHipPointerRangeError` when `span` runs past the end of its allocation;
    /// - `hipFileMemoryAlreadyRegistered` when `span.addr` is already registered;
    /// - `hipFileHipDriverError` for a device error.
    pub fn register_buffer(&self, span: DeviceSpan) -> Result<RegisteredDeviceBuffer, Error> {
        self.driver.buf_register(span.addr, span.len_bytes, 0)?;
        Ok(RegisteredDeviceBuffer { driver: Arc::clone(&self.driver), span, deregistered: false })
    }
}

impl Clone for HipFile {
    /// Another use of the same driver (the use count goes up by one).
    fn clone(&self) -> HipFile {
        HipFile::open(Arc::clone(&self.driver))
    }
}

impl Drop for HipFile {
    fn drop(&mut self) {
        // Fails only when someone closed the driver behind our back; nothing to undo.
        let _ = self.driver.close();
    }
}

/// A registered file handle; deregistered on drop. Borrows the descriptor it was
/// registered from (lifetime `'fd`).
///
/// Dropping it while reads or writes are in flight on other threads is allowed: they
/// complete, and new ones on the handle fail with `hipFileHandleNotRegistered`.
#[derive(Debug)]
pub struct RegisteredFile<'fd> {
    driver: Arc<Driver>,
    id: HandleId,
    handle: Arc<FileHandle>,
    _fd: PhantomData<BorrowedFd<'fd>>,
}

impl RegisteredFile<'_> {
    /// Reads up to `target.len_bytes` bytes from `file_offset_bytes` into device memory
    /// (`hipFileRead`) and returns the byte count: short only at end of file, 0 at or
    /// after it. Requests beyond the maximum I/O size (0x7fff_f000 bytes with 4 KiB
    /// pages) are clamped to it.
    ///
    /// # Errors
    /// - [`IoError::DriverClosed`] when the driver's use count dropped to 0;
    /// - [`IoError::Library`] with `hipFileHandleNotRegistered` after the driver closed
    ///   its registrations, `hipFileHipMemoryTypeInvalid` for memory that is not device
    ///   memory, `hipFileInvalidValue` for a span beyond the buffer or an offset above
    ///   `i64::MAX`, `hipFileInternalError` when the compatibility path is disabled;
    /// - [`IoError::Os`] with the errno of a failed read (e.g. `EBADF` when the file is
    ///   not open for reading);
    /// - [`IoError::Device`] for a device error.
    pub fn read(&self, target: DeviceSpan, file_offset_bytes: u64) -> Result<usize, IoError> {
        self.io(Direction::Read, target, file_offset_bytes)
    }

    /// Writes `source.len_bytes` bytes of device memory at `file_offset_bytes`
    /// (`hipFileWrite`) and returns the byte count (clamped as for
    /// [`RegisteredFile::read`]).
    ///
    /// # Errors
    /// As [`RegisteredFile::read`]; `EBADF` when the file is not open for writing.
    pub fn write(&self, source: DeviceSpan, file_offset_bytes: u64) -> Result<usize, IoError> {
        self.io(Direction::Write, source, file_offset_bytes)
    }

    /// The handle id (`hipFileHandle_t`).
    pub fn id(&self) -> HandleId {
        self.id
    }

    /// Bytes moved through the handle so far, by path (O_DIRECT or page cache).
    pub fn counters(&self) -> FileCounters {
        self.handle.counters()
    }

    fn io(&self, direction: Direction, span: DeviceSpan, offset: u64) -> Result<usize, IoError> {
        let file_offset_bytes =
            i64::try_from(offset).map_err(|_| IoError::Library(OpError::InvalidValue))?;
        let raw = RawIo { size_bytes: span.len_bytes, file_offset_bytes, buffer_offset_bytes: 0 };
        self.driver.io_sync(direction, self.id, span.addr, raw)
    }
}

impl Drop for RegisteredFile<'_> {
    fn drop(&mut self) {
        // Only our own handle can be registered under our id (we keep it alive); after
        // a driver close it is gone already and there is nothing to do.
        if self.driver.file(self.id).is_ok_and(|f| Arc::ptr_eq(&f, &self.handle)) {
            self.driver.handle_deregister(self.id);
        }
    }
}

/// A registered device buffer; deregistered on drop.
#[derive(Debug)]
pub struct RegisteredDeviceBuffer {
    driver: Arc<Driver>,
    span: DeviceSpan,
    deregistered: bool,
}

impl RegisteredDeviceBuffer {
    /// The registered range.
    pub fn span(&self) -> DeviceSpan {
        self.span
    }

    /// Deregisters the buffer now (`hipFileBufDeregister`), reporting failures that
    /// dropping it ignores.
    ///
    /// # Errors
    /// - `hipFileInternalError` while I/O on the buffer is in flight; the buffer then
    ///   stays registered until the driver's use count drops to 0;
    /// - `hipFileDriverClosing` / `hipFileMemoryNotRegistered` when the driver was
    ///   closed (which deregistered it already).
    pub fn deregister(mut self) -> Result<(), Error> {
        self.deregistered = true;
        self.driver.buf_deregister(self.span.addr)
    }
}

impl Drop for RegisteredDeviceBuffer {
    fn drop(&mut self) {
        if self.deregistered {
            return;
        }
        // Failures: in use (it stays registered until the driver closes), or already
        // gone with a driver close. Use `deregister` to see them.
        let _ = self.driver.buf_deregister(self.span.addr);
    }
}
