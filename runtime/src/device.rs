//! The `Device` trait, what a device can do ([`Caps`]) and the interpreter device.

use qforge_ir::dsl::{Signature, TypedKernel};
use std::sync::Arc;

use qforge_ir::{Arg, Kernel, SharedKernel};

use crate::error::Result;

/// What kind of machine runs a device's kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DeviceKind {
    /// Native code on the host CPU: work items spread over threads, vectorized
    /// [`Caps::vector_lanes`] wide.
    Cpu,
    /// A GPU: one work item per thread, [`Caps::parallel_threads`] threads resident at once.
    Gpu,
    /// The reference interpreter or another sequential evaluator (the default).
    Interpreter,
    /// An XLA/StableHLO evaluator: whole-kernel modules, one launch at a time.
    Xla,
}

/// What a device can do, for host ops that choose tiles and kernel variants: they read these,
/// never a device's name or backend. Results never depend on them, only speed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Caps {
    /// The kind of machine.
    pub kind: DeviceKind,
    /// `f32` lanes of the device's vector code: 4 for Cranelift's 128-bit vectors, 8 or 16
    /// for the LLVM backend (AVX2 or AVX-512), 1 for scalar code, GPUs and evaluators.
    pub vector_lanes: u32,
    /// Work items that run at once: a CPU device's launch threads, a GPU's resident threads,
    /// 1 for a sequential device.
    pub parallel_threads: u32,
}

impl Caps {
    /// A sequential device without vector code (the interpreter; the default of
    /// [`Device::caps`]).
    pub const SEQUENTIAL: Caps = Caps {
        kind: DeviceKind::Interpreter,
        vector_lanes: 1,
        parallel_threads: 1,
    };

    /// Resident threads assumed for a GPU whose real number is not queried (64 Ki, e.g. 32
    /// SMs x 2048).
    pub const GPU_THREADS: u32 = 65536;

    /// A GPU (or a device that stands in for one, such as the XLA SPMD engine's recorder) whose
    /// resident threads are not queried: scalar code, [`Caps::GPU_THREADS`] threads.
    pub const GPU: Caps = Caps {
        kind: DeviceKind::Gpu,
        vector_lanes: 1,
        parallel_threads: Caps::GPU_THREADS,
    };

    /// Whether the device is a GPU (host ops then pick their GPU tiles and unstaged kernels).
    pub fn is_gpu(&self) -> bool {
        self.kind == DeviceKind::Gpu
    }
}

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

    /// [`Device::compile`] of a shared, immutable kernel: a device that caches compilations
    /// keeps the shared kernel, so that [`Device::launch_shared`] finds it without comparing.
    /// The default compiles `kernel.kernel()`.
    ///
    /// # Errors
    /// As [`Device::compile`].
    fn compile_shared(&self, kernel: &SharedKernel) -> Result<()> {
        self.compile(kernel.kernel())
    }

    /// [`Device::launch`] of a shared, immutable kernel whose fingerprint is known: a device
    /// that caches compilations finds this one without hashing or comparing the kernel (the
    /// CPU devices do; the default launches `kernel.kernel()`). The same results as `launch`.
    ///
    /// # Errors
    /// As [`Device::launch`].
    fn launch_shared(&self, kernel: &SharedKernel, args: &mut [Arg<'_>]) -> Result<()> {
        self.launch(kernel.kernel(), args)
    }

    /// What the device can do ([`Caps`]); host ops choose tiles and kernels from it. The
    /// default is [`Caps::SEQUENTIAL`].
    fn caps(&self) -> Caps {
        Caps::SEQUENTIAL
    }

    /// The `f32` lanes of the device's vector code: [`Caps::vector_lanes`] of [`Device::caps`].
    fn vector_lanes(&self) -> u32 {
        self.caps().vector_lanes
    }
}

/// A kernel as a device method received it: by reference ([`Device::launch`]) or shared
/// ([`Device::launch_shared`]). Devices with a compiled-kernel cache take one path for both.
#[derive(Clone, Copy)]
pub(crate) enum KernelRef<'a> {
    Plain(&'a Kernel),
    Shared(&'a SharedKernel),
}

impl<'a> KernelRef<'a> {
    /// The kernel.
    pub(crate) fn kernel(self) -> &'a Kernel {
        match self {
            KernelRef::Plain(k) => k,
            KernelRef::Shared(s) => s.kernel(),
        }
    }

    /// Its fingerprint: computed now for a plain kernel, the shared kernel's own otherwise.
    pub(crate) fn fingerprint(self) -> u64 {
        match self {
            KernelRef::Plain(k) => k.fingerprint(),
            KernelRef::Shared(s) => s.fingerprint(),
        }
    }

    /// Whether `cached` is this very kernel, or equal to it.
    pub(crate) fn is(self, cached: &Arc<Kernel>) -> bool {
        matches!(self, KernelRef::Shared(s) if s.same(cached)) || **cached == *self.kernel()
    }

    /// The kernel for a cache to keep: the shared `Arc`, or a copy.
    pub(crate) fn to_arc(self) -> Arc<Kernel> {
        match self {
            KernelRef::Plain(k) => Arc::new(k.clone()),
            KernelRef::Shared(s) => Arc::clone(s.arc()),
        }
    }

    /// [`Device::compile`] or [`Device::compile_shared`] of it on `dev`.
    pub(crate) fn compile_on(self, dev: &dyn Device) -> Result<()> {
        match self {
            KernelRef::Plain(k) => dev.compile(k),
            KernelRef::Shared(s) => dev.compile_shared(s),
        }
    }

    /// [`Device::launch`] or [`Device::launch_shared`] of it on `dev`.
    pub(crate) fn launch_on(self, dev: &dyn Device, args: &mut [Arg<'_>]) -> Result<()> {
        match self {
            KernelRef::Plain(k) => dev.launch(k, args),
            KernelRef::Shared(s) => dev.launch_shared(s, args),
        }
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
    dev.launch_shared(kernel.shared(), &mut list)
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
    fn caps(&self) -> Caps {
        Caps::SEQUENTIAL
    }
}
