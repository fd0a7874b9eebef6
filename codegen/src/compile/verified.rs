//! The verified-kernel token: code generation accepts only kernels that passed
//! [`qforge_ir::verify`], and verifies each kernel once.

use std::borrow::Cow;

use qforge_ir::Kernel;

use crate::error::Result;

/// A kernel that passed [`qforge_ir::verify`]. Only [`Verified::new`] (which verifies) and the
/// pipeline's passes (whose output is verified in debug builds and tests) create one, so
/// [`crate::compile()`] never verifies twice.
#[derive(Clone, Debug)]
pub struct Verified<'k>(Cow<'k, Kernel>);

impl<'k> Verified<'k> {
    /// Verifies `kernel`.
    ///
    /// # Errors
    /// [`crate::Error::Ir`] with the verifier's message (which names the kernel and the op).
    pub fn new(kernel: &'k Kernel) -> Result<Self> {
        qforge_ir::verify(kernel)?;
        Ok(Verified(Cow::Borrowed(kernel)))
    }

    /// The kernel.
    pub fn kernel(&self) -> &Kernel {
        &self.0
    }

    /// The result of a pass over this kernel: `rewritten` is re-verified in debug builds (every
    /// test run), trusted otherwise (passes keep a verified kernel verified).
    pub(crate) fn after_pass(rewritten: Cow<'k, Kernel>) -> Result<Self> {
        if cfg!(debug_assertions) {
            qforge_ir::verify(&rewritten)?;
        }
        Ok(Verified(rewritten))
    }

    /// Takes the kernel out (borrowed when no pass rewrote it).
    pub(crate) fn into_inner(self) -> Cow<'k, Kernel> {
        self.0
    }
}
