//! Choosing devices by name for the CLI.

use qforge_runtime::{CpuDevice, Device, InterpreterDevice};

use crate::error::{Error, Result};

/// Device names accepted by `--device`.
pub const DEVICE_NAMES: &[&str] = &["cpu", "interpreter"];

/// The device called `name` (`cpu`: Cranelift JIT on all cores; `interpreter`: the reference).
///
/// # Errors
/// [`Error::Usage`] for an unknown name, or the device's own start-up error.
pub fn device_by_name(name: &str) -> Result<Box<dyn Device>> {
    match name {
        "cpu" => Ok(Box::new(CpuDevice::new()?)),
        "interpreter" => Ok(Box::new(InterpreterDevice)),
        other => Err(Error::Usage(format!("unknown device '{other}' (available: {})", DEVICE_NAMES.join(", ")))),
    }
}

/// Every device that can run on this machine, with the backend column each fills in `check`.
pub fn available_devices() -> Vec<Box<dyn Device>> {
    let mut devices: Vec<Box<dyn Device>> = Vec::new();
    if let Ok(cpu) = CpuDevice::new() {
        devices.push(Box::new(cpu));
    }
    devices
}
