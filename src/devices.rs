//! Choosing devices by name for the CLI.

use qforge_runtime::{CpuDevice, Device, InterpreterDevice};

use crate::error::{Error, Result};

/// Device names accepted by `--device` in this build: `auto` (see [`AUTO_ORDER`]), `cpu`
/// (Cranelift), `interpreter`, and with their features `cpu-llvm` (LLVM), `cpu-aot` (every
/// library kernel compiled ahead of time into the binary, feature `aot`), `wgpu` (the first wgpu
/// adapter, WGSL backend), `cuda` (GPU 0 through the CUDA driver, PTX backend) and `stablehlo`
/// (the StableHLO reference interpreter through jaxlib).
pub const DEVICE_NAMES: &[&str] = &[
    AUTO,
    "cpu",
    "interpreter",
    #[cfg(feature = "llvm")]
    "cpu-llvm",
    #[cfg(feature = "aot")]
    "cpu-aot",
    #[cfg(feature = "wgpu")]
    "wgpu",
    #[cfg(feature = "cuda")]
    "cuda",
    #[cfg(feature = "stablehlo")]
    "stablehlo",
];

/// The name of the device chosen for you: `--device auto`, the default of `bench`, `quantize`,
/// `dequantize` and `finetune` (and of `check --device auto`).
pub const AUTO: &str = "auto";

/// What [`AUTO`] resolves to: the conformant devices compiled in, fastest first (`cpu-llvm`
/// with the `llvm` feature, then `cpu`). The first that starts is chosen. Only devices that
/// run every library kernel bit-exactly on the host's CPU are listed (GPU devices need a GPU
/// and are never chosen for you).
pub const AUTO_ORDER: &[&str] = &[
    #[cfg(feature = "llvm")]
    "cpu-llvm",
    "cpu",
];

/// The device [`AUTO`] resolves to in this build: its `--device` name, the device, and the
/// faster devices of [`AUTO_ORDER`] that could not start, with their errors.
///
/// # Errors
/// The last device's start-up error when none of [`AUTO_ORDER`] starts.
pub fn auto_device() -> Result<AutoChoice> {
    let mut skipped = Vec::new();
    for (i, &name) in AUTO_ORDER.iter().enumerate() {
        match device_by_name(name) {
            Ok(device) => {
                return Ok(AutoChoice {
                    name,
                    device,
                    skipped,
                })
            }
            Err(e) if i + 1 < AUTO_ORDER.len() => skipped.push((name, e.to_string())),
            Err(e) => return Err(e),
        }
    }
    Err(Error::Usage("no device compiled in".into()))
}

/// The outcome of [`auto_device`].
pub struct AutoChoice {
    /// The chosen device's `--device` name (`cpu-llvm`, `cpu`).
    pub name: &'static str,
    /// The device.
    pub device: Box<dyn Device>,
    /// Faster devices that could not start, and why.
    pub skipped: Vec<(&'static str, String)>,
}

impl AutoChoice {
    /// The line the CLI prints at start: `device: cpu-llvm (auto)`, with the faster devices
    /// that could not start and why.
    pub fn announcement(&self) -> String {
        let mut line = format!("device: {} (auto)", self.name);
        for (name, why) in &self.skipped {
            line += &format!("; {name} could not start: {why}");
        }
        line
    }
}

/// The device called `name` (`auto`: see [`AUTO_ORDER`]; `cpu`: Cranelift JIT on all cores;
/// `interpreter`: the reference; `cpu-llvm`, `wgpu` and `cuda` with their features).
///
/// # Errors
/// [`Error::Usage`] for an unknown name, or the device's own start-up error.
pub fn device_by_name(name: &str) -> Result<Box<dyn Device>> {
    match name {
        AUTO => auto_device().map(|c| c.device),
        "cpu" => Ok(Box::new(CpuDevice::new()?)),
        "interpreter" => Ok(Box::new(InterpreterDevice)),
        #[cfg(feature = "llvm")]
        "cpu-llvm" => Ok(Box::new(CpuDevice::llvm(Default::default())?)),
        // A kernel the library builds outside its catalog (none today) falls back to the JIT,
        // said once on standard error.
        #[cfg(feature = "aot")]
        "cpu-aot" => Ok(Box::new(aot_device(qforge_runtime::Policy::PreferAot)?)),
        #[cfg(feature = "wgpu")]
        "wgpu" => Ok(Box::new(qforge_runtime::WgpuDevice::new()?)),
        #[cfg(feature = "cuda")]
        "cuda" => Ok(Box::new(qforge_runtime::CudaDevice::new()?)),
        #[cfg(feature = "stablehlo")]
        "stablehlo" => Ok(Box::new(qforge_runtime::StableHloDevice::new()?)),
        other => {
            let missing: Vec<String> = [
                ("cpu-llvm", "llvm"),
                ("cpu-aot", "aot"),
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

/// The `cpu-aot` device: every library kernel compiled ahead of time (`crate::aot_kernels`).
///
/// # Errors
/// As [`qforge_runtime::AotDevice::new`].
#[cfg(feature = "aot")]
pub fn aot_device(policy: qforge_runtime::Policy) -> Result<qforge_runtime::AotDevice> {
    Ok(qforge_runtime::AotDevice::new(
        crate::aot_kernels::KERNELS,
        policy,
    )?)
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
    // Suites run kernels of their own on every device too: those fall back to the JIT (said on
    // stderr). `tests/aot_levels.rs` requires an artifact for every library kernel at every
    // level.
    #[cfg(feature = "aot")]
    match aot_device(qforge_runtime::Policy::PreferAot) {
        Ok(aot) => devices.push(Box::new(aot)),
        Err(e) => unavailable.push(Unavailable {
            device: "cpu-aot",
            backend: if cfg!(feature = "llvm") {
                "llvm-aot"
            } else {
                "cranelift-aot"
            },
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

/// The devices a bit-exactness suite runs a kernel on: the Cranelift CPU device in its four
/// configurations (vector code on and off, the host's extensions on and off), then
/// [`available_devices`] (the CPU device again among them, plus every other backend compiled in
/// that can start here). The devices that cannot start are printed with the reason.
pub fn cpu_variants_and_available_devices() -> Vec<Box<dyn Device>> {
    let mut out: Vec<Box<dyn Device>> = Vec::new();
    for simd in [true, false] {
        for native_features in [true, false] {
            match CpuDevice::with_options(qforge_runtime::CpuOptions {
                simd,
                native_features,
                ..Default::default()
            }) {
                Ok(dev) => out.push(Box::new(dev)),
                Err(e) => println!(
                    "cranelift (simd {simd}, native features {native_features}) unavailable: {e}"
                ),
            }
        }
    }
    let (available, unavailable) = available_devices();
    for u in unavailable {
        println!("{} unavailable: {}", u.backend, u.reason);
    }
    out.extend(available);
    out
}

/// The device `--device name` asks for, as the CLI opens it ([`device_by_name`]), with the line
/// to print when the name was [`AUTO`] ([`AutoChoice::announcement`]: `device: cpu-llvm
/// (auto)`).
///
/// # Errors
/// As [`device_by_name`].
pub fn open_device(name: &str) -> Result<(Box<dyn Device>, Option<String>)> {
    if name == AUTO {
        let choice = auto_device()?;
        let line = choice.announcement();
        Ok((choice.device, Some(line)))
    } else {
        Ok((device_by_name(name)?, None))
    }
}
