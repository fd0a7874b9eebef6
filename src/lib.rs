//! qforge: a kernel-generation compiler for low-bit training and inference kernels.
//!
//! This facade crate re-exports the IR ([`ir`]), code generation ([`codegen`]), runtime
//! ([`runtime`]) and op library ([`kernels`]) crates and holds the checkpoint tooling behind the `qforge` CLI
//! ([`checkpoint`]: `quantize`, `dequantize`) and `qforge check` ([`cli::check`]).
#![deny(missing_docs)]

/// `f16` and `bf16` element types (the `half` crate), for typed kernel arguments.
pub use half;
pub use qforge_codegen as codegen;
pub use qforge_ir as ir;
pub use qforge_kernels as kernels;
/// `#[qforge::kernel]` and `#[qforge::func]`: kernels written in a subset of Rust
/// (`docs/custom-ops.md`).
pub use qforge_macros::{func, kernel};
pub use qforge_runtime as runtime;

/// Every library kernel compiled ahead of time for every CPU feature level of the target
/// (feature `aot`; `build.rs`): `KERNELS` for [`qforge_runtime::AotDevice`] (device `cpu-aot`).
#[cfg(feature = "aot")]
pub mod aot_kernels {
    qforge_runtime::include_kernels!();
}
pub mod aligned_alloc;
pub mod bench;
pub mod checkpoint;
pub mod cli;
pub mod conformance;
pub mod devices;
mod error;
pub mod finetune;
pub mod probe;

pub use error::{Error, Result};
