//! The CPU device: kernels lowered by `qforge_codegen::cranelift` (or, with the `llvm`
//! feature and [`CpuDevice::llvm`], by `qforge_codegen::llvm`), JIT-compiled for the host CPU,
//! cached by [`Kernel::fingerprint`], and launched on all cores when the work is large.

mod jit;
mod launch;
#[cfg(feature = "llvm")]
mod llvm_jit;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use qforge_codegen::cranelift::{lower, ArgLayout, LowerOptions};
use qforge_ir::{Arg, Kernel};

use crate::device::Device;
use crate::error::{Error, Result};
use jit::{Entry, Jit};

/// How the CPU device compiles, and when and how widely it runs a launch on several threads.
/// Splitting never changes a bit of the result: work items are independent and each runs the
/// same code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuOptions {
    /// Threads for a large launch, the calling thread included (the others are a pool the
    /// device starts on its first large launch and keeps, whatever that launch's size); `None`
    /// uses `std::thread::available_parallelism()`. If the system refuses the pool's threads,
    /// launches run on the calling thread alone (same bits, slower).
    pub threads: Option<usize>,
    /// A launch whose buffers hold at least this many bytes in total runs multi-threaded.
    pub parallel_min_bytes: usize,
    /// A launch with at least this many work items runs multi-threaded.
    pub parallel_min_grid: u32,
    /// Compile for every instruction-set extension of the host CPU (the default); `false`
    /// restricts code to the architecture's baseline (x86_64: SSE2), e.g. to test the exact
    /// software fallbacks of `fma` and rounding.
    pub native_features: bool,
    /// Allow vector code (the default): [`LowerOptions::simd`] on targets with 128-bit vectors
    /// (x86_64, aarch64). `false` gives purely scalar code, e.g. to compare the two bit for bit.
    pub simd: bool,
    /// Use AVX-512 where the host has it (the default; the `cpu-llvm` device only). `false`
    /// compiles x86-64 kernels for the host without its AVX-512 extensions (at most AVX2,
    /// 8 lanes), e.g. to check the AVX2 code on an AVX-512 host bit for bit.
    pub avx512: bool,
}

impl Default for CpuOptions {
    /// All cores, for launches over at least 256 KiB of buffers or 65536 work items; native
    /// CPU features.
    fn default() -> Self {
        CpuOptions {
            threads: None,
            parallel_min_bytes: 256 * 1024,
            parallel_min_grid: 1 << 16,
            native_features: true,
            simd: true,
            avx512: true,
        }
    }
}

/// The JIT a device compiles with.
enum Compiler {
    Cranelift(Box<Jit>),
    #[cfg(feature = "llvm")]
    Llvm(llvm_jit::LlvmJit),
}

/// A compiled kernel in the cache.
struct Compiled {
    /// The kernel it was compiled from (guards against hash collisions).
    kernel: Kernel,
    entry: Entry,
    layout: ArgLayout,
    /// Table data the code reads through `args`, owned here.
    tables: Vec<Vec<u32>>,
}

/// Runs kernels as native code on the host CPU (Cranelift JIT, or LLVM with the `llvm` feature),
/// compiled once per distinct kernel and cached by [`Kernel::fingerprint`]; thread-safe.
///
/// ```
/// use qforge_ir::{Access, Arg, DType, Dim, KernelBuilder, Scalar, ScalarType};
/// use qforge_runtime::{CpuDevice, Device};
/// let mut b = KernelBuilder::new("double");
/// let n = b.scalar_param("n", ScalarType::U32);
/// let x = b.buffer_param("x", DType::F32, &[Dim::Param(n)], Access::ReadWrite);
/// b.set_grid(Dim::Param(n));
/// let i = b.work_item();
/// let v = b.load(x, i);
/// let two = b.const_f32(2.0);
/// let y = b.mul(v, two);
/// b.store(x, i, y);
/// let kernel = b.finish();
/// let mut data: Vec<u8> = [1.0f32, 2.5].iter().flat_map(|v| v.to_le_bytes()).collect();
/// let cpu = CpuDevice::new().unwrap();
/// cpu.launch(&kernel, &mut [Arg::Scalar(Scalar::U32(2)), Arg::Write(&mut data)]).unwrap();
/// assert_eq!(&data[4..8], &5.0f32.to_le_bytes());
/// ```
pub struct CpuDevice {
    compiler: Compiler,
    cache: Mutex<HashMap<u64, Arc<Compiled>>>,
    options: CpuOptions,
    bounds_checks: bool,
    /// The threads of large launches, started by the first one.
    pool: launch::Pool,
}

impl std::fmt::Debug for CpuDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuDevice")
            .field("options", &self.options)
            .field("bounds_checks", &self.bounds_checks)
            .field("cached_kernels", &self.cached_kernels())
            .finish()
    }
}

impl CpuDevice {
    /// A CPU device with [`CpuOptions::default`] and bounds-checked buffer accesses (an
    /// out-of-range index makes the launch fail instead of touching other memory).
    ///
    /// # Errors
    /// [`Error::Device`] when Cranelift does not support the host CPU.
    pub fn new() -> Result<Self> {
        Self::with_options(CpuOptions::default())
    }

    /// A bounds-checked CPU device with the given options.
    ///
    /// # Errors
    /// As [`CpuDevice::new`].
    pub fn with_options(options: CpuOptions) -> Result<Self> {
        Ok(CpuDevice {
            compiler: Compiler::Cranelift(Box::new(Jit::new(options.native_features)?)),
            cache: Mutex::new(HashMap::new()),
            options,
            bounds_checks: true,
            pool: launch::Pool::new(),
        })
    }

    /// A bounds-checked CPU device that compiles with LLVM (`qforge_codegen::llvm`: the same
    /// bits as the Cranelift device, with the host's widest vectors, e.g. AVX-512). Its name is
    /// `cpu-llvm` and its backend `llvm`. `options.simd = false` gives scalar code.
    ///
    /// # Errors
    /// [`Error::Device`] when LLVM has no target machine for the host.
    #[cfg(feature = "llvm")]
    pub fn llvm(options: CpuOptions) -> Result<Self> {
        Ok(CpuDevice {
            compiler: Compiler::Llvm(llvm_jit::LlvmJit::new(
                options.native_features,
                options.avx512,
            )?),
            cache: Mutex::new(HashMap::new()),
            options,
            bounds_checks: true,
            pool: launch::Pool::new(),
        })
    }

    /// A CPU device whose kernels do not check buffer indices (a little faster).
    ///
    /// # Errors
    /// As [`CpuDevice::new`].
    ///
    /// # Safety
    /// Every kernel launched on this device must index every buffer in range for the arguments
    /// it is launched with (the op library's kernels do); an out-of-range access is undefined
    /// behaviour. Check new kernels on [`crate::InterpreterDevice`] or a checked device first.
    pub unsafe fn new_unchecked(options: CpuOptions) -> Result<Self> {
        Ok(CpuDevice {
            compiler: Compiler::Cranelift(Box::new(Jit::new(options.native_features)?)),
            cache: Mutex::new(HashMap::new()),
            options,
            bounds_checks: false,
            pool: launch::Pool::new(),
        })
    }

    /// The options the device was created with.
    pub fn options(&self) -> CpuOptions {
        self.options
    }

    /// Number of compiled kernels in the cache. The cache keeps every distinct kernel (and its
    /// machine code) for the life of the device.
    pub fn cached_kernels(&self) -> usize {
        self.cache.lock().map(|c| c.len()).unwrap_or(0)
    }

    /// The cached compilation of `kernel`, compiling (and verifying) it first if needed.
    fn compiled(&self, kernel: &Kernel) -> Result<Arc<Compiled>> {
        let hash = kernel.fingerprint();
        let lock_error = || Error::Device {
            device: "cpu".into(),
            message: "kernel cache lock poisoned".into(),
        };
        if let Some(c) = self.cache.lock().map_err(|_| lock_error())?.get(&hash) {
            if c.kernel == *kernel {
                return Ok(Arc::clone(c));
            }
        }
        // The kernel the backend lowers (its decompositions add tables, which the code reads).
        let (entry, layout, lowered) = match &self.compiler {
            Compiler::Cranelift(jit) => {
                let lowered = qforge_codegen::cranelift::prepare(kernel)?;
                let options = LowerOptions {
                    call_conv: jit.call_conv(),
                    bounds_checks: self.bounds_checks,
                    simd: self.options.simd
                        && cfg!(any(target_arch = "x86_64", target_arch = "aarch64")),
                    x86_pshufb: self.options.native_features && host_has_ssse3(),
                };
                let lk = lower(&lowered, &options)?;
                (jit.compile(&kernel.name, lk.function)?, lk.layout, lowered)
            }
            #[cfg(feature = "llvm")]
            Compiler::Llvm(jit) => {
                let options = qforge_codegen::llvm::LlvmOptions {
                    bounds_checks: self.bounds_checks,
                    lanes: if self.options.simd { jit.lanes() } else { 0 },
                    x86_avx512: jit.avx512(),
                    x86_avx512_vbmi: jit.vbmi(),
                    x86_avx2: jit.avx2(),
                };
                let lowered = qforge_codegen::llvm::prepare(kernel, &options)?;
                let text = qforge_codegen::llvm::lower(&lowered, &options)?;
                let entry = jit.compile(&kernel.name, &text)?;
                (entry, ArgLayout::new(&lowered, self.bounds_checks), lowered)
            }
        };
        let compiled = Arc::new(Compiled {
            kernel: kernel.clone(),
            entry,
            layout,
            tables: lowered.tables.iter().map(|(_, t)| t.data.clone()).collect(),
        });
        self.cache
            .lock()
            .map_err(|_| lock_error())?
            .insert(hash, Arc::clone(&compiled));
        Ok(compiled)
    }
}

impl Device for CpuDevice {
    fn name(&self) -> &str {
        match self.compiler {
            Compiler::Cranelift(_) => "cpu",
            #[cfg(feature = "llvm")]
            Compiler::Llvm(_) => "cpu-llvm",
        }
    }

    fn backend(&self) -> &'static str {
        match self.compiler {
            Compiler::Cranelift(_) => qforge_codegen::cranelift::BACKEND,
            #[cfg(feature = "llvm")]
            Compiler::Llvm(_) => qforge_codegen::llvm::BACKEND,
        }
    }

    fn compile(&self, kernel: &Kernel) -> Result<()> {
        self.compiled(kernel).map(|_| ())
    }

    fn launch(&self, kernel: &Kernel, args: &mut [Arg<'_>]) -> Result<()> {
        let compiled = self.compiled(kernel)?;
        launch::launch(&compiled, &self.options, &self.pool, args)
    }

    fn vector_lanes(&self) -> u32 {
        if !self.options.simd {
            return 1;
        }
        match &self.compiler {
            Compiler::Cranelift(_)
                if cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) =>
            {
                4
            }
            Compiler::Cranelift(_) => 1,
            #[cfg(feature = "llvm")]
            Compiler::Llvm(jit) => jit.lanes().max(1),
        }
    }
}

/// Whether the host CPU has x86's SSSE3 (`pshufb`), which native code may then use directly.
fn host_has_ssse3() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("ssse3")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}
