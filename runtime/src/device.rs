//! The `Device` trait and the interpreter device.

use qforge_ir::dsl::{Signature, TypedKernel};
use qforge_ir::{Arg, Kernel};

use crate::error::Result;

/// Something that compiles and runs kernels. Buffers are host byte slices; a device that keeps
/// memory elsewhere copies in and out around the launch.
pub trait Device: Send + Sync {
    /// Device name for messages (`interpreter`, `cpu`).
    fn name(&self) -> &str;

    /// Backend column name used by `qforge check` (`interpreter`, `cranelift`, ...).
    fn backend(&self) -> &'static str;

    /// Compiles `kernel` (verifying it first) into the device's cache, if it has one.
    ///
    /// # Errors
    /// Verification or code generation failure.
    fn compile(&self, kernel: &Kernel) -> Result<()>;

    /// Runs `kernel` on `args` (in parameter order), compiling it first if needed.
    ///
    /// # Errors
    /// Verification, argument mismatch (see [`qforge_ir::bind`]), code generation or device
    /// failure.
    fn launch(&self, kernel: &Kernel, args: &mut [Arg<'_>]) -> Result<()>;

    /// The `f32` lanes of the device's vector code: 4 for Cranelift's 128-bit vectors, 8 or 16
    /// for the LLVM backend (AVX2 or AVX-512), 1 for scalar code or when unknown (the
    /// default). Tile heuristics read it (`qforge_kernels::ops::DeviceCaps`); results never depend on it.
    fn vector_lanes(&self) -> u32 {
        1
    }
}

/// Runs a typed kernel (built with `#[qforge::kernel]`) on `dev` with named arguments: the
/// arguments are checked against the kernel by name, type, dtype and size first.
///
/// # Errors
/// An argument mismatch naming the parameter ([`qforge_ir::Error::Argument`]), or the
/// device's launch error.
pub fn launch_typed<S: Signature>(
    dev: &dyn Device,
    kernel: &TypedKernel<S>,
    args: &mut S::Args<'_>,
) -> Result<()> {
    let mut list = kernel.args(args)?;
    dev.launch(kernel.kernel(), &mut list)
}

/// The reference interpreter as a device: slow, sequential, and by definition exact.
#[derive(Debug, Default, Clone, Copy)]
pub struct InterpreterDevice;

impl Device for InterpreterDevice {
    fn name(&self) -> &str {
        "interpreter"
    }
    fn backend(&self) -> &'static str {
        "interpreter"
    }
    fn compile(&self, kernel: &Kernel) -> Result<()> {
        Ok(qforge_ir::verify(kernel)?)
    }
    fn launch(&self, kernel: &Kernel, args: &mut [Arg<'_>]) -> Result<()> {
        Ok(qforge_ir::interp::run(kernel, args)?)
    }
}
