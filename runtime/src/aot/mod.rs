//! Ahead-of-time kernels: native CPU code compiled by `qforge-build` in a build script, linked
//! into the program and described by [`AotKernel`] records, run by [`AotDevice`] with no
//! compiler at run time; and text artifacts ([`TextArtifact`]: PTX, WGSL, StableHLO) embedded
//! next to them, which the GPU devices launch through a `TextStore` (`WgpuDevice::with_artifacts`,
//! `CudaDevice::with_artifacts`). `docs/aot.md` describes the pipeline, the manifest and the
//! policies.
//!
//! ```ignore
//! // build.rs: qforge_build::Builder::new().library("quantize_4bit_nf4_f32_64").run();
//! qforge_runtime::include_kernels!();
//! let dev = qforge_runtime::AotDevice::new(KERNELS, qforge_runtime::Policy::RequireAot)?;
//! ```

mod device;
mod record;
#[cfg(feature = "compiler")]
mod text_store;

pub use device::{AotDevice, Policy};
pub use record::{host_has, AotKernel, TextArtifact};
#[cfg(feature = "compiler")]
pub use text_store::{Embedded, TextStore};

pub use crate::cpu::entry::KernelFn;
pub use qforge_ir::cpu_abi::MANIFEST_VERSION;

/// Includes the kernels `qforge-build` generated for this crate (`$OUT_DIR/qforge_kernels.rs`):
/// a static [`AotKernel`] per kernel and CPU feature level, the slice `KERNELS` of all of them,
/// and `TEXT`, the embedded text artifacts.
#[macro_export]
macro_rules! include_kernels {
    () => {
        include!(concat!(env!("OUT_DIR"), "/qforge_kernels.rs"));
    };
}

#[cfg(test)]
pub(crate) mod tests;
#[cfg(all(test, feature = "compiler"))]
pub(crate) mod text_tests;
