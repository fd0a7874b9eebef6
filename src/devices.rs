//! Choosing devices by name for the CLI.

use qforge_runtime::{CpuDevice, Device, InterpreterDevice};

use crate::error::{Error, Result};

/// Device names accepted by `--device` in this build: `cpu` (Cranelift), `interpreter`, and with
/// their features `cpu-llvm` (LLVM), `wgpu` (the first wgpu adapter, WGSL backend), `cuda`
/// (GPU 0 through the CUDA driver, PTX backend) and `stablehlo` (the StableHLO reference
/// interpreter through jaxlib).
pub const DEVICE_NAMES: &[&str] = &[
    "cpu",
    "interpreter",
    #[cfg(feature = "llvm")]
    "cpu-llvm",
    #[cfg(feature = "wgpu")]
    "wgpu",
    #[cfg(feature = "cuda")]
    "cuda",
    #[cfg(feature = "stablehlo")]
    "stablehlo",
];

/// The device called `name` (`cpu`: Cranelift JIT on all cores; `interpreter`: the reference;
/// `cpu-llvm`, `wgpu` and `cuda` with their features).
///
/// # Errors
/// [`Error::Usage`] for an unknown name, or the device's own start-up error.
pub fn device_by_name(name: &str) -> Result<Box<dyn Device>> {
    match name {
        "cpu" => Ok(Box::new(CpuDevice::new()?)),
        "interpreter" => Ok(Box::new(InterpreterDevice)),
        #[cfg(feature = "llvm")]
        "cpu-llvm" => Ok(Box::new(CpuDevice::llvm(Default::default())?)),
        #[cfg(feature = "wgpu")]
        "wgpu" => Ok(Box::new(qforge_runtime::WgpuDevice::new()?)),
        #[cfg(feature = "cuda")]
        "cuda" => Ok(Box::new(qforge_runtime::CudaDevice::new()?)),
        #[cfg(feature = "stablehlo")]
        "stablehlo" => Ok(Box::new(qforge_runtime::StableHloDevice::new()?)),
        other => {
            let missing: Vec<String> = [
                ("cpu-llvm", "llvm"),
                ("wgpu", "wgpu"),
                ("cuda", "cuda"),
                ("stablehlo", "stablehlo"),
            ]
            .iter()
            .filter(|(d, _)| !DEVICE_NAMES.contains(d))
            .map(|(d, f)| format!("{d} needs `--features {f}`"))
            .collect();
            let hint = if missing.is_empty() {
                String::new()
            } else {
                format!("; {}", missing.join(", "))
            };
            Err(Error::Usage(format!(
                "unknown device '{other}' (available in this build: {}{hint})",
                DEVICE_NAMES.join(", ")
            )))
        }
    }
}

/// A backend compiled in whose device cannot run on this machine, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unavailable {
    /// The device's `--device` name (`cpu`, `cpu-llvm`, `wgpu`, `cuda`, `stablehlo`).
    pub device: &'static str,
    /// Backend column name.
    pub backend: &'static str,
    /// Why its device could not start.
    pub reason: String,
}

/// Every device of the backends compiled in that can run here (the interpreter is not among
/// them: it is the reference), plus the backends whose device could not start, with the reason.
pub fn available_devices() -> (Vec<Box<dyn Device>>, Vec<Unavailable>) {
    let mut devices: Vec<Box<dyn Device>> = Vec::new();
    let mut unavailable = Vec::new();
    match CpuDevice::new() {
        Ok(cpu) => devices.push(Box::new(cpu)),
        Err(e) => unavailable.push(Unavailable {
            device: "cpu",
            backend: "cranelift",
            reason: e.to_string(),
        }),
    }
    #[cfg(feature = "llvm")]
    match CpuDevice::llvm(Default::default()) {
        Ok(cpu) => devices.push(Box::new(cpu)),
        Err(e) => unavailable.push(Unavailable {
            device: "cpu-llvm",
            backend: qforge_codegen::llvm::BACKEND,
            reason: e.to_string(),
        }),
    }
    #[cfg(feature = "wgpu")]
    match qforge_runtime::WgpuDevice::new() {
        Ok(wgpu) => devices.push(Box::new(wgpu)),
        Err(e) => unavailable.push(Unavailable {
            device: "wgpu",
            backend: "wgsl",
            reason: e.to_string(),
        }),
    }
    #[cfg(feature = "cuda")]
    match qforge_runtime::CudaDevice::new() {
        Ok(cuda) => devices.push(Box::new(cuda)),
        Err(e) => unavailable.push(Unavailable {
            device: "cuda",
            backend: qforge_codegen::ptx::BACKEND,
            reason: e.to_string(),
        }),
    }
    #[cfg(feature = "stablehlo")]
    match qforge_runtime::StableHloDevice::new() {
        Ok(d) => devices.push(Box::new(d)),
        Err(e) => unavailable.push(Unavailable {
            device: "stablehlo",
            backend: qforge_codegen::stablehlo::BACKEND,
            reason: e.to_string(),
        }),
    }
    (devices, unavailable)
}
