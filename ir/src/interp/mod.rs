//! The reference interpreter: runs any verified kernel sequentially with exactly the IR's
//! semantics. It defines what every kernel means; every backend is checked against it.

use crate::args::Arg;
use crate::error::Result;
use crate::kernel::Kernel;

/// Verifies `kernel`, binds `args` and runs every work item in order.
///
/// # Errors
/// Verification, argument binding, or an execution error (out-of-bounds load or store).
pub fn run(kernel: &Kernel, args: &mut [Arg<'_>]) -> Result<()> {
    crate::verify(kernel)?;
    crate::bind(kernel, args)?;
    Err(crate::Error::Unsupported("the interpreter is not written yet".into()))
}
