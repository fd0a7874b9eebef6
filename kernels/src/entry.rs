//! [`CatalogEntry`]: what the conformance suite and `qforge check` need of a kernel, so that a
//! user's kernel joins them the same way the library's do (no edit of the catalog).

use qforge_ir::Kernel;
use qforge_ir::OwnedArg;
use qforge_ir::Result;

/// A kernel variant that can be checked on every device against the reference interpreter.
pub trait CatalogEntry: Send + Sync {
    /// The kernel's name (unique among the entries checked together).
    fn name(&self) -> String;

    /// Builds the kernel (devices verify it before they run it).
    ///
    /// # Errors
    /// The kernel's own build or verification error.
    fn build(&self) -> Result<Kernel>;

    /// The elements one work item handles (test sizes are chosen around it: 1, 3, one block
    /// minus and plus one, several blocks).
    fn blocksize(&self) -> usize;

    /// Launch arguments built from `values` (length at least 1), which mix ordinary numbers with
    /// edge values (0, -0, subnormals, inf, NaN, 4-bit midpoints): the inputs should carry them
    /// into the kernel, outputs start zeroed.
    ///
    /// # Errors
    /// When no arguments can be built for this many values.
    fn example_args(&self, values: &[f32]) -> Result<Vec<OwnedArg>>;
}

impl CatalogEntry for crate::KernelSpec {
    fn name(&self) -> String {
        crate::KernelSpec::name(self)
    }
    fn build(&self) -> Result<Kernel> {
        crate::KernelSpec::build(self)
    }
    fn blocksize(&self) -> usize {
        crate::KernelSpec::blocksize(self)
    }
    fn example_args(&self, values: &[f32]) -> Result<Vec<OwnedArg>> {
        crate::KernelSpec::example_args(self, values)
    }
}
