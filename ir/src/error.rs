//! The error type of qforge-ir.

use thiserror::Error;

/// One problem found by the verifier, with where it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifyError {
    /// Where: a parameter name, `%N` for a value, `stmt` paths like `body[3].then[0]`.
    pub location: String,
    /// What is wrong.
    pub message: String,
}

impl std::fmt::Display for VerifyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.location, self.message)
    }
}

/// Errors of qforge-ir: verification, parsing, argument binding, interpretation and the op
/// library's parameter checks.
#[derive(Debug, Error)]
pub enum Error {
    /// The kernel broke one or more rules; every problem found is listed.
    #[error("kernel '{kernel}' failed verification ({} problem(s)): {}", errors.len(), errors.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))]
    Verify {
        /// Kernel name.
        kernel: String,
        /// All problems found.
        errors: Vec<VerifyError>,
    },
    /// The text form could not be parsed.
    #[error("parse error at line {line}, column {col}: {message}")]
    Parse {
        /// 1-based line.
        line: usize,
        /// 1-based column.
        col: usize,
        /// What was expected or found.
        message: String,
    },
    /// The arguments do not match the kernel's parameters (count, kind, dtype, size).
    #[error("kernel '{kernel}', parameter '{param}': {message}")]
    Argument {
        /// Kernel name.
        kernel: String,
        /// Parameter name (or `#N` when the argument has no parameter).
        param: String,
        /// What was wrong.
        message: String,
    },
    /// The interpreter hit a kernel bug (e.g. an out-of-bounds load or store).
    #[error("kernel '{kernel}', work item {work_item}: {message}")]
    Execution {
        /// Kernel name.
        kernel: String,
        /// Work item that failed.
        work_item: u32,
        /// What happened.
        message: String,
    },
    /// An op-library request that is not supported (blocksize, quant type, dtype, shape).
    #[error("{0}")]
    Unsupported(String),
}

/// Result alias of qforge-ir.
pub type Result<T, E = Error> = std::result::Result<T, E>;
