//! The error type of qforge-codegen.

use thiserror::Error;

/// Errors of code generation.
#[derive(Debug, Error)]
pub enum Error {
    /// The kernel did not verify; backends accept only verified kernels.
    #[error(transparent)]
    Ir(#[from] qforge_ir::Error),
    /// The backend has no lowering for an op.
    #[error("backend '{backend}' does not support {op}")]
    Unsupported {
        /// Backend name.
        backend: &'static str,
        /// The op (text-form name).
        op: String,
    },
    /// A target this build cannot produce (unknown triple or level, a level of another
    /// architecture).
    #[error("target: {0}")]
    Target(String),
    /// An artifact or manifest that cannot be used (wrong version, corrupted code).
    #[error("artifact: {0}")]
    Artifact(String),
    /// The backend's own tool rejected the emitted code (a bug in qforge).
    #[error("backend '{backend}': {message}")]
    Backend {
        /// Backend name.
        backend: &'static str,
        /// The tool's message.
        message: String,
    },
}

/// Result alias of qforge-codegen.
pub type Result<T, E = Error> = std::result::Result<T, E>;
