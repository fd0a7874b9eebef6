//! The small trait every backend implements.

use qforge_ir::Kernel;

use crate::error::Result;

/// A code generator for one target. Implementations verify the kernel before lowering it
/// (backends accept only verified IR) and report an op they cannot lower as
/// [`crate::Error::Unsupported`] naming the op and the backend.
pub trait Backend {
    /// What lowering produces (a Cranelift function, PTX text, a naga module, ...).
    type Artifact;

    /// The backend's column name in `qforge check` (`cranelift`, `wgsl`, `ptx`, ...).
    fn name(&self) -> &'static str;

    /// Verifies and lowers `kernel`.
    ///
    /// # Errors
    /// Verification failure, an unsupported op, or the target tool rejecting the output.
    fn lower(&self, kernel: &Kernel) -> Result<Self::Artifact>;

    /// The deterministic, target-independent text of the lowered kernel, as snapshotted in
    /// `snapshots/`.
    ///
    /// # Errors
    /// As [`Backend::lower`].
    fn emit_text(&self, kernel: &Kernel) -> Result<String>;
}
