//! The JIT CPU device (feature `compiler`): kernels compiled through `qforge_codegen::compile`
//! for the host CPU by Cranelift or LLVM, cached by [`Kernel::fingerprint`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

#[cfg(feature = "llvm")]
use qforge_codegen::compile::LlvmTarget;
use qforge_codegen::compile::{CpuLevel, Launch, Options, Target};
use qforge_ir::cpu_abi::ArgLayout;
use qforge_ir::{Arg, Kernel, SharedKernel};

use super::entry::Compiled;
use super::jit::Jit;
use super::{launch, CpuOptions};
use crate::device::{Caps, Device, DeviceKind, KernelRef};
use crate::error::{Error, Result};

/// The JIT a device compiles with.
enum Compiler {
    Cranelift(Box<Jit>),
    #[cfg(feature = "llvm")]
    Llvm(super::llvm_jit::LlvmJit),
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
            pool: launch::Pool::default(),
        })
    }

    /// A bounds-checked CPU device that compiles with LLVM (`qforge_codegen::llvm`: the same
    /// bits as the Cranelift device, with the host's widest vectors, e.g. AVX-512). Its name is
    /// `cpu-llvm` and its backend `llvm`. `options.simd = false` gives scalar code.
    ///
    /// Compiled objects are kept in the disk cache the environment names (`QFORGE_JIT_CACHE`;
    /// [`CpuDevice::llvm_with_object_cache`] has the rules), so a later process loads them
    /// instead of compiling again (the same code, so the same bits).
    ///
    /// # Errors
    /// [`Error::Device`] when LLVM has no target machine for the host.
    #[cfg(feature = "llvm")]
    pub fn llvm(options: CpuOptions) -> Result<Self> {
        Self::llvm_caching(options, super::jit_cache::JitCache::from_env())
    }

    /// [`CpuDevice::llvm`] with its disk cache of compiled objects in `cache_dir` (created on
    /// the first write), or none (`None`).
    ///
    /// For [`CpuDevice::llvm`] the folder is `QFORGE_JIT_CACHE` (or `off`), else
    /// `$XDG_CACHE_HOME/qforge/llvm-jit`, else `$HOME/.cache/qforge/llvm-jit`. Entries are
    /// keyed by the SHA-256 of the kernel's LLVM IR text and the host's CPU and features, so
    /// they are never shared between different CPUs; a damaged entry is compiled again and
    /// replaced, and a folder that cannot be written only costs the compile time. The entries
    /// are code the process runs: keep the folder private. The full rules (format, size
    /// bound, trust) are in `docs/backends/llvm.md`.
    ///
    /// # Errors
    /// As [`CpuDevice::llvm`].
    #[cfg(feature = "llvm")]
    pub fn llvm_with_object_cache(
        options: CpuOptions,
        cache_dir: Option<&std::path::Path>,
    ) -> Result<Self> {
        Self::llvm_caching(options, cache_dir.map(super::jit_cache::JitCache::at))
    }

    #[cfg(feature = "llvm")]
    fn llvm_caching(
        options: CpuOptions,
        cache: Option<super::jit_cache::JitCache>,
    ) -> Result<Self> {
        Ok(CpuDevice {
            compiler: Compiler::Llvm(super::llvm_jit::LlvmJit::new(
                options.native_features,
                options.avx512,
                cache,
            )?),
            cache: Mutex::new(HashMap::new()),
            options,
            bounds_checks: true,
            pool: launch::Pool::default(),
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
            pool: launch::Pool::default(),
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

    /// The cached compilation of `kernel`, compiling (and verifying) it first if needed; a
    /// shared kernel is found by its own fingerprint and `Arc`, without hashing or comparing.
    fn compiled(&self, kernel: KernelRef<'_>) -> Result<Arc<Compiled>> {
        let hash = kernel.fingerprint();
        let lock_error = || Error::Device {
            device: "cpu".into(),
            message: "kernel cache lock poisoned".into(),
        };
        if let Some(c) = self.cache.lock().map_err(|_| lock_error())?.get(&hash) {
            if kernel.is(&c.kernel) {
                return Ok(Arc::clone(c));
            }
        }
        let to_keep = kernel.to_arc();
        let kernel = kernel.kernel();
        let (target, options) = self.target();
        let artifact = qforge_codegen::compile(kernel, &target, &options)?;
        let manifest = &artifact.manifest;
        let tables: Vec<Vec<u32>> = manifest.tables.iter().map(|t| t.data.clone()).collect();
        let layout =
            ArgLayout::from_counts(manifest.params.len(), tables.len(), self.bounds_checks);
        let symbol = match &manifest.launch {
            Launch::Cpu {
                symbol,
                slots,
                bounds_checks,
            } if *slots == layout.len() && *bounds_checks == self.bounds_checks => symbol,
            other => {
                return Err(self.error(format!(
                    "kernel '{}': the {} artifact launches as {other:?}, expected the CPU ABI \
                     with {} slots and bounds checks {}",
                    kernel.name,
                    manifest.target,
                    layout.len(),
                    if self.bounds_checks { "on" } else { "off" }
                )))
            }
        };
        let code = artifact.code.text().ok_or_else(|| {
            self.error(format!(
                "kernel '{}': the {} artifact has no text",
                kernel.name, manifest.target
            ))
        })?;
        let entry = match &self.compiler {
            // The text's one function (the launch's symbol is the kernel's name).
            Compiler::Cranelift(jit) => jit.compile(symbol, code)?,
            #[cfg(feature = "llvm")]
            Compiler::Llvm(jit) => jit.compile(&kernel.name, code, symbol)?,
        };
        let compiled = Arc::new(Compiled {
            kernel: to_keep,
            entry,
            layout,
            tables,
        });
        self.cache
            .lock()
            .map_err(|_| lock_error())?
            .insert(hash, Arc::clone(&compiled));
        Ok(compiled)
    }
}

impl CpuDevice {
    /// What this device compiles kernels for: Cranelift IR text (`Target::Clif`) whose level
    /// allows what the host has, or LLVM IR (`Target::LlvmIr`) with the JIT's vector lanes and
    /// x86 extensions; bounds checks as the device, vector code as [`CpuOptions::simd`].
    fn target(&self) -> (Target, Options) {
        let simd = self.options.simd;
        match &self.compiler {
            Compiler::Cranelift(_) => (
                Target::Clif {
                    level: clif_level(self.options.native_features),
                },
                Options {
                    bounds_checks: self.bounds_checks,
                    // Cranelift's 128-bit vectors exist on these targets only.
                    simd: simd && cfg!(any(target_arch = "x86_64", target_arch = "aarch64")),
                },
            ),
            #[cfg(feature = "llvm")]
            Compiler::Llvm(jit) => (
                Target::LlvmIr(LlvmTarget {
                    lanes: jit.lanes(),
                    x86_avx2: jit.avx2(),
                    x86_avx512: jit.avx512(),
                    x86_avx512_vbmi: jit.vbmi(),
                }),
                Options {
                    bounds_checks: self.bounds_checks,
                    simd,
                },
            ),
        }
    }

    fn error(&self, message: String) -> Error {
        Error::Device {
            device: self.name().to_string(),
            message,
        }
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
        self.compiled(KernelRef::Plain(kernel)).map(|_| ())
    }

    fn launch(&self, kernel: &Kernel, args: &mut [Arg<'_>]) -> Result<()> {
        let compiled = self.compiled(KernelRef::Plain(kernel))?;
        launch::launch(&compiled, &self.options, &self.pool, args)
    }

    fn compile_shared(&self, kernel: &SharedKernel) -> Result<()> {
        self.compiled(KernelRef::Shared(kernel)).map(|_| ())
    }

    fn launch_shared(&self, kernel: &SharedKernel, args: &mut [Arg<'_>]) -> Result<()> {
        let compiled = self.compiled(KernelRef::Shared(kernel))?;
        launch::launch(&compiled, &self.options, &self.pool, args)
    }

    fn caps(&self) -> Caps {
        let vector_lanes = if !self.options.simd {
            1
        } else {
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
        };
        Caps {
            kind: DeviceKind::Cpu,
            vector_lanes,
            parallel_threads: launch::pool_threads(&self.options) as u32,
        }
    }
}

/// The level of the Cranelift IR the JIT compiles. The lowering reads only whether the level
/// has x86's `pshufb` (SSSE3), so x86-64-v2 stands for every host with SSSE3 when native
/// features are on (the JIT itself still compiles for all the host's extensions), the
/// baseline x86-64 otherwise; AArch64 on AArch64.
fn clif_level(native_features: bool) -> CpuLevel {
    if cfg!(target_arch = "aarch64") {
        CpuLevel::Aarch64
    } else if native_features && host_has_ssse3() {
        CpuLevel::X86_64V2
    } else {
        CpuLevel::X86_64
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::InterpreterDevice;

    #[test]
    fn caps_say_what_the_device_runs() {
        let cpu = CpuDevice::with_options(CpuOptions {
            threads: Some(3),
            ..Default::default()
        })
        .expect("host JIT");
        let caps = cpu.caps();
        assert_eq!(caps.kind, DeviceKind::Cpu);
        assert_eq!(caps.parallel_threads, 3);
        let lanes = if cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
            4
        } else {
            1
        };
        assert_eq!((caps.vector_lanes, cpu.vector_lanes()), (lanes, lanes));
        let scalar = CpuDevice::with_options(CpuOptions {
            simd: false,
            ..Default::default()
        })
        .expect("host JIT");
        assert_eq!(scalar.caps().vector_lanes, 1);
        assert_eq!(InterpreterDevice.caps(), Caps::SEQUENTIAL);
        assert_eq!(InterpreterDevice.vector_lanes(), 1);
    }

    #[cfg(feature = "llvm")]
    #[test]
    fn llvm_caps_follow_the_jit() {
        let cpu = CpuDevice::llvm(CpuOptions::default()).expect("host LLVM");
        let Compiler::Llvm(jit) = &cpu.compiler else {
            panic!("not the LLVM compiler")
        };
        assert_eq!(cpu.caps().kind, DeviceKind::Cpu);
        assert_eq!(cpu.caps().vector_lanes, jit.lanes().max(1));
    }
}
