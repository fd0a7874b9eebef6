//! qforge-codegen: lowering of verified kernels to backend code. Device-free: every backend's
//! output can be produced and snapshot-tested on any machine.
#![deny(missing_docs)]

mod backend;
pub mod compile;
pub mod cranelift;
pub mod decompose;
mod error;
pub mod llvm;
pub mod mosaic;
pub mod ptx;
mod running;
pub mod stablehlo;
pub mod wgsl;

pub use backend::Backend;
pub use compile::{compile, Artifact, Target};
pub use error::{Error, Result};
