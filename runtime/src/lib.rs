//! qforge-runtime: the `Device` trait, the reference-interpreter device, the CPU device
//! (Cranelift JIT, multithreaded, cached by kernel hash) and the host-side ops with the
//! bitsandbytes functional API (`quantize_4bit`, `dequantize_4bit`, `quantize_blockwise`, ...).
#![deny(missing_docs)]

pub mod aot;
pub mod collective;
mod cpu;
#[cfg(feature = "cuda")]
mod cuda;
mod device;
mod error;
#[cfg(feature = "stablehlo")]
mod mosaic_twin;
mod profile;
#[cfg(feature = "stablehlo")]
mod python_runner;
#[cfg(feature = "stablehlo")]
mod stablehlo;
mod tensor;
#[cfg(feature = "wgpu")]
mod wgpu;
#[cfg(feature = "stablehlo")]
pub mod xla_spmd;

#[cfg(feature = "wgpu")]
pub use self::wgpu::{Conformance, WgpuDevice};
pub use aot::{AotDevice, AotKernel, Policy, TextArtifact};
pub use collective::{agree, Communicator, SingleRank};

/// Whether this build links the code generators and JITs (qforge-runtime's `compiler`
/// feature); `false` in a program that runs only ahead-of-time kernels.
pub const JIT_LINKED: bool = cfg!(feature = "compiler");
#[cfg(feature = "compiler")]
pub use cpu::CpuDevice;
pub use cpu::CpuOptions;
#[cfg(feature = "cuda")]
pub use cuda::CudaDevice;
pub use device::{launch_typed, Caps, Device, DeviceKind, InterpreterDevice};
pub use error::{Error, Result};
#[cfg(feature = "stablehlo")]
pub use mosaic_twin::MosaicTwinDevice;
pub use profile::{KernelTime, Profile, ProfiledDevice};
#[cfg(feature = "stablehlo")]
pub use stablehlo::StableHloDevice;
pub use tensor::{bytes_f32, f32_bytes, HostTensor};
