//! The process-wide driver and the one device selection.
//!
//! The C API and [`Driver::global`] share one driver per process, built on first use
//! from the environment ([`Config::global`]). The cpu HIP runtime
//! (`libhipfile_hip_cpu.so`) allocates "device" memory, creates streams and copies
//! through `libhipfile`'s `hipfileCpu*` extension functions, which must act on the
//! *same* [`CpuDevice`] the driver checks pointers and runs streams against;
//! [`Driver::device`] only gives an `Arc<dyn Device>`, which cannot be downcast, so the
//! selection keeps the typed handle too.
//!
//! Device selection ([`select_device`], also behind [`Driver::from_config`]):
//! `HIPFILE_DEVICE`; `auto` tries rocm (when built with the feature), then cuda, then
//! falls back to cpu.

use std::sync::{Arc, OnceLock};

use hipfile_core::OpError;

use super::Driver;
use crate::config::{Config, DeviceSelection};
use crate::device::Device;
use crate::device::cpu::CpuDevice;
use crate::device::user::{UserDevice, open_device};
use crate::error::Error;

/// The process-wide driver, its device as an application sees it, and, on the cpu
/// device, the typed device.
pub struct ProcessRuntime {
    /// The driver every `hipFile*` export and [`Driver::global`] use.
    pub driver: Arc<Driver>,
    /// The driver's device (the same object) with the application's operations:
    /// allocation, streams, copies (the Python package allocates through it).
    pub device: Arc<dyn UserDevice>,
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
    let driver = Driver::new(config, Arc::clone(&device) as Arc<dyn Device>);
    Ok(ProcessRuntime { driver, device, cpu })
}

/// The device a configuration selects.
pub struct SelectedDevice {
    /// The device with the application's operations.
    pub device: Arc<dyn UserDevice>,
    /// The same device, typed, when it is the `cpu` device.
    pub cpu: Option<Arc<CpuDevice>>,
}

/// Opens the device `config.device` selects (`auto`: rocm, then cuda, then cpu).
///
/// # Errors
/// An explicitly selected backend is not built or finds no device
/// (`hipFileDeviceNotFound`; the reason is logged).
pub fn select_device(config: &Config) -> Result<SelectedDevice, Error> {
    let cpu_devices = config.cpu_device_count;
    let typed_cpu = || {
        let cpu = CpuDevice::new(cpu_devices);
        SelectedDevice { device: cpu.clone(), cpu: Some(cpu) }
    };
    let gpu = |device| SelectedDevice { device, cpu: None };
    match config.device {
        DeviceSelection::Cpu => Ok(typed_cpu()),
        DeviceSelection::Auto => Ok(open_device(DeviceSelection::Rocm, cpu_devices)
            .or_else(|_| open_device(DeviceSelection::Cuda, cpu_devices))
            .map_or_else(|_| typed_cpu(), gpu)),
        other => match open_device(other, cpu_devices) {
            Ok(device) => Ok(gpu(device)),
            Err(reason) => {
                log::error!("HIPFILE_DEVICE={other:?}: {reason}");
                Err(Error::new(OpError::DeviceNotFound))
            }
        },
    }
}
