//! The error type of qforge-runtime.

use thiserror::Error;

/// Errors of qforge-runtime: from the IR (verification, arguments, interpretation), from code
/// generation, from a device, and from bad requests to the host-side ops.
#[derive(Debug, Error)]
pub enum Error {
    /// An IR-level error (verification, argument binding, interpreter).
    #[error(transparent)]
    Ir(#[from] qforge_ir::Error),
    /// Code generation failed.
    #[cfg(feature = "compiler")]
    #[error(transparent)]
    Codegen(#[from] qforge_codegen::Error),
    /// The device failed to compile or run a kernel.
    #[error("device '{device}': {message}")]
    Device {
        /// Device name.
        device: String,
        /// What happened.
        message: String,
    },
    /// A host-side op was called with bad input (shape, dtype, blocksize, sizes).
    #[error("{0}")]
    Invalid(String),
}

/// Result alias of qforge-runtime.
pub type Result<T, E = Error> = std::result::Result<T, E>;
