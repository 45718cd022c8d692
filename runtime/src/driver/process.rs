//! The process-wide driver and the one device selection.
//!
//! The C API and the Rust API ([`runtime`]) share one driver per process, built on first use
//! from the environment ([`Config::global`]). The cpu HIP runtime
//! (`libhipfile_hip_cpu.so`) allocates "device" memory, creates streams and copies
//! through `libhipfile`'s `hipfileCpu*` extension functions, which must act on the
//! *same* [`CpuDevice`] the driver checks pointers and runs streams against;
//! [`Driver::device`] only gives an `Arc<dyn Device>`, which cannot be downcast, so the
//! selection keeps the typed handle too.
//!
//! Device selection, the one of the library ([`open_selected`]; `select_device` for a
//! configuration, behind the process-wide driver; [`open_device`] for tools and tests): `HIPFILE_DEVICE`; `auto` tries rocm (when built
//! with the feature), then cuda, then falls back to cpu.

use std::sync::{Arc, OnceLock};

use hipfile_core::OpError;

use super::Driver;
use crate::config::{Config, DeviceSelection};
use crate::device::Device;
use crate::device::cpu::CpuDevice;
use crate::device::cuda::CudaDevice;
#[cfg(feature = "rocm")]
use crate::device::rocm::RocmDevice;
use crate::device::user::UserDevice;
use crate::error::Error;

/// The process-wide driver and, on the cpu device, the typed device.
pub struct ProcessRuntime {
    /// The driver every `hipFile*` export and the Rust API's process-wide calls use.
    pub driver: Arc<Driver>,
    /// The driver's device when it is the `cpu` device (the same object).
    pub cpu: Option<Arc<CpuDevice>>,
}

impl std::fmt::Debug for ProcessRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessRuntime")
            .field("driver", &self.driver)
            .field("cpu", &self.cpu.is_some())
            .finish_non_exhaustive()
    }
}

/// The process-wide runtime, built on first use from the environment.
///
/// # Errors
/// The device `HIPFILE_DEVICE` selects is unavailable (`hipFileDeviceNotFound`; the
/// reason is printed once to stderr).
pub fn runtime() -> Result<&'static ProcessRuntime, Error> {
    static GLOBAL: OnceLock<Result<ProcessRuntime, Error>> = OnceLock::new();
    GLOBAL.get_or_init(|| build(Config::global().clone())).as_ref().map_err(|e| *e)
}

fn build(config: Config) -> Result<ProcessRuntime, Error> {
    let SelectedDevice { device, cpu } = select_device(&config)?;
    let driver = Driver::new(config, device as Arc<dyn Device>);
    Ok(ProcessRuntime { driver, cpu })
}

/// The device a selection opened.
pub struct SelectedDevice {
    /// The device with the application's operations.
    pub device: Arc<dyn UserDevice>,
    /// The same device, typed, when it is the `cpu` device.
    pub cpu: Option<Arc<CpuDevice>>,
}

/// Opens the backend `selection` names: the one device selection of the library.
/// `Auto` tries `rocm` (built with the cargo feature `rocm`, and HIP finds an AMD GPU),
/// then `cuda` (libcuda loads and finds a device), then falls back to `cpu`; the `cpu`
/// device has `cpu_device_count` devices.
///
/// # Errors
/// An explicitly selected backend is not built or finds no device (the message says
/// why); `Auto` always finds one.
pub fn open_selected(
    selection: DeviceSelection,
    cpu_device_count: u32,
) -> Result<SelectedDevice, String> {
    let typed_cpu = || {
        let cpu = CpuDevice::new(cpu_device_count);
        SelectedDevice { device: cpu.clone(), cpu: Some(cpu) }
    };
    let gpu = |device| SelectedDevice { device, cpu: None };
    match selection {
        DeviceSelection::Cpu => Ok(typed_cpu()),
        DeviceSelection::Cuda => open_cuda().map(gpu),
        DeviceSelection::Rocm => open_rocm().map(gpu),
        DeviceSelection::Auto => {
            Ok(open_rocm().or_else(|_| open_cuda()).map_or_else(|_| typed_cpu(), gpu))
        }
    }
}

/// [`open_selected`]'s device, for a program that needs no typed `cpu` device.
///
/// # Errors
/// As [`open_selected`].
pub fn open_device(
    selection: DeviceSelection,
    cpu_device_count: u32,
) -> Result<Arc<dyn UserDevice>, String> {
    open_selected(selection, cpu_device_count).map(|selected| selected.device)
}

fn open_cuda() -> Result<Arc<dyn UserDevice>, String> {
    CudaDevice::open().map(|device| device as Arc<dyn UserDevice>)
}

#[cfg(feature = "rocm")]
fn open_rocm() -> Result<Arc<dyn UserDevice>, String> {
    RocmDevice::open().map(|device| device as Arc<dyn UserDevice>)
}

#[cfg(not(feature = "rocm"))]
fn open_rocm() -> Result<Arc<dyn UserDevice>, String> {
    Err("the rocm backend is not built (cargo feature `rocm`)".into())
}

/// Opens the device `config.device` selects ([`open_selected`]).
///
/// # Errors
/// An explicitly selected backend is not built or finds no device
/// (`hipFileDeviceNotFound`; the reason is logged).
pub(crate) fn select_device(config: &Config) -> Result<SelectedDevice, Error> {
    open_selected(config.device, config.cpu_device_count).map_err(|reason| {
        log::error!("HIPFILE_DEVICE={:?}: {reason}", config.device);
        Error::new(OpError::DeviceNotFound)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{DeviceInfo, DeviceKind};

    #[test]
    fn cpu_comes_typed_with_its_device_count() {
        let selected = open_selected(DeviceSelection::Cpu, 3).expect("cpu always opens");
        let cpu = selected.cpu.expect("typed");
        assert_eq!(selected.device.kind(), DeviceKind::Cpu);
        assert_eq!(cpu.device_count(), 3);
        assert!(Arc::ptr_eq(&(cpu as Arc<dyn UserDevice>), &selected.device), "one device object");
    }

    #[test]
    fn auto_always_finds_a_device_and_a_cpu_fallback_comes_typed() {
        let selected = open_selected(DeviceSelection::Auto, 2).expect("auto falls back to cpu");
        assert_eq!(selected.device.kind() == DeviceKind::Cpu, selected.cpu.is_some());
        let device = open_device(DeviceSelection::Auto, 2).expect("auto falls back to cpu");
        assert_eq!(device.kind(), selected.device.kind(), "the same order both ways");
    }

    #[cfg(not(feature = "rocm"))]
    #[test]
    fn an_explicit_backend_that_is_not_built_is_an_error() {
        let reason = open_selected(DeviceSelection::Rocm, 1).err().expect("not built");
        assert!(reason.contains("cargo feature `rocm`"), "{reason}");
        let config = Config { device: DeviceSelection::Rocm, ..Config::default() };
        assert_eq!(select_device(&config).err().map(|e| e.code), Some(OpError::DeviceNotFound));
    }
}
