//! The error type of the `qforge` facade crate and CLI.

use std::path::PathBuf;

use thiserror::Error;

/// Errors of the `qforge` commands. Every variant names the file, tensor or value at fault, so
/// the CLI prints it as one line.
#[derive(Debug, Error)]
pub enum Error {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A file is not a valid safetensors file (truncated, corrupt header, offsets outside it).
    #[error("{path}: not a valid safetensors file: {message}")]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A tensor cannot be processed (dtype, shape, missing companion tensors, bad quant state).
    #[error("{path}: tensor '{tensor}': {message}")]
    Tensor {
        /// The file.
        path: PathBuf,
        /// The tensor name.
        tensor: String,
        /// What is wrong.
        message: String,
    },
    /// A weight holds NaN or inf and `--allow-nonfinite` was not given.
    #[error("{path}: tensor '{tensor}' has a non-finite value {value} at flat index {index} (pass --allow-nonfinite to quantize it anyway)")]
    NonFinite {
        /// The file.
        path: PathBuf,
        /// The tensor name.
        tensor: String,
        /// Flat element index of the first non-finite value.
        index: usize,
        /// The value (NaN, inf or -inf).
        value: f32,
    },
    /// A command-line request that cannot be honoured (output equal to input, bad option value).
    #[error("{0}")]
    Usage(String),
    /// An error from the runtime (device, kernel, host op).
    #[error(transparent)]
    Runtime(#[from] qforge_runtime::Error),
    /// An error from the IR (op library request).
    #[error(transparent)]
    Ir(#[from] qforge_ir::Error),
}

/// Result alias of the facade crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
