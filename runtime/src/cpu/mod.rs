//! Native CPU code: the launcher every CPU device shares (`launch.rs`: binding, the argument
//! slots of `qforge_ir::cpu_abi`, the split over threads), compiled entries (`entry.rs`), the
//! routines compiled code may call (`libcalls.rs`), and with the `compiler` feature the JIT
//! device `CpuDevice`: kernels compiled through `qforge_codegen::compile` (Cranelift IR text, or
//! with the `llvm` feature LLVM IR) for the host CPU, cached by `Kernel::fingerprint`.
//! Ahead-of-time kernels run through the same launcher (`crate::aot`).

pub(crate) mod entry;
#[cfg(feature = "compiler")]
mod jit;
#[cfg(feature = "llvm")]
mod jit_cache;
#[cfg(feature = "compiler")]
mod jit_device;
pub(crate) mod launch;
mod libcalls;
#[cfg(feature = "llvm")]
mod llvm_jit;
#[cfg(feature = "llvm")]
mod orc;
#[cfg(feature = "llvm")]
mod perf_map;
mod pool;

#[cfg(feature = "compiler")]
pub use jit_device::CpuDevice;

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
    /// Allow vector code (the default): `qforge_codegen::compile::Options::simd` on targets with 128-bit vectors
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
