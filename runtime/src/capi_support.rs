//! What the C API (`hipfile-capi`) needs from the runtime beyond its Rust API: the
//! process-wide driver of the C API, with a typed handle on its device when that device
//! is the in-process `cpu` device.
//!
//! The cpu HIP runtime (`libhipfile_hip_cpu.so`) allocates "device" memory, creates
//! streams and copies through `libhipfile`'s `hipfileCpu*` extension functions, which
//! must act on the *same* [`CpuDevice`] the driver checks pointers and runs streams
//! against. [`Driver::device`] only gives an `Arc<dyn Device>`, which cannot be
//! downcast, so [`global`] builds the C API's driver itself and keeps both handles.
//!
//! Device selection: `HIPFILE_DEVICE` through [`Config::global`]; `auto` tries rocm (when
//! built with the feature), then cuda, then falls back to cpu. [`Driver::global`] returns
//! this same driver, so the Rust and C APIs share one process-wide state.

use std::sync::{Arc, OnceLock};

use hipfile_core::OpError;

use crate::config::{Config, DeviceSelection};
use crate::device::Device;
use crate::device::cpu::CpuDevice;
use crate::device::user::{UserDevice, open_device};
use crate::driver::Driver;
use crate::error::Error;

/// The C API's driver, its device as an application sees it, and, on the cpu device,
/// the typed device.
pub struct CapiRuntime {
    /// The driver every `hipFile*` export uses.
    pub driver: Arc<Driver>,
    /// The driver's device (the same object) with the application's operations:
    /// allocation, streams, copies (the Python package allocates through it).
    pub device: Arc<dyn UserDevice>,
    /// The driver's device when it is the `cpu` device (the same object).
    pub cpu: Option<Arc<CpuDevice>>,
}

impl std::fmt::Debug for CapiRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CapiRuntime")
            .field("driver", &self.driver)
            .field("cpu", &self.cpu.is_some())
            .finish_non_exhaustive()
    }
}

/// The process-wide runtime of the C API, built on first use from the environment.
///
/// # Errors
/// The device `HIPFILE_DEVICE` selects is unavailable (`hipFileDeviceNotFound`; the
/// reason is printed once to stderr).
pub fn global() -> Result<&'static CapiRuntime, Error> {
    static GLOBAL: OnceLock<Result<CapiRuntime, Error>> = OnceLock::new();
    GLOBAL.get_or_init(|| build(Config::global().clone())).as_ref().map_err(|e| *e)
}

fn build(config: Config) -> Result<CapiRuntime, Error> {
    let cpu_devices = config.cpu_device_count;
    let typed_cpu = || {
        let cpu = CpuDevice::new(cpu_devices);
        let device: Arc<dyn UserDevice> = cpu.clone();
        (device, Some(cpu))
    };
    let (device, cpu) = match config.device {
        DeviceSelection::Cpu => typed_cpu(),
        DeviceSelection::Auto => match open_device(DeviceSelection::Rocm, cpu_devices)
            .or_else(|_| open_device(DeviceSelection::Cuda, cpu_devices))
        {
            Ok(device) => (device, None),
            Err(_) => typed_cpu(),
        },
        other => match open_device(other, cpu_devices) {
            Ok(device) => (device, None),
            Err(reason) => {
                log::error!("HIPFILE_DEVICE={other:?}: {reason}");
                return Err(Error::new(OpError::DeviceNotFound));
            }
        },
    };
    let driver = Driver::new(config, Arc::clone(&device) as Arc<dyn Device>);
    Ok(CapiRuntime { driver, device, cpu })
}
