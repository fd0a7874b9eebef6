//! The staged form of the 8-bit blockwise Adam / AdamW kernels: `adam8bit_staged_{dtype}`,
//! `adamw8bit_staged_{dtype}` and their `_gs` variants (`gnorm_scale`,
//! [`crate::optim_ext`]).
//!
//! The plain 8-bit kernel ([`crate::adam`]) decodes each element's two codes twice:
//! once in the pass that finds the block's new absmax and once more in the pass that updates the
//! parameter and requantizes, which recomputes the moments bit for bit. The staged kernel stores
//! the updated moments of the first pass in two `f32` workspace buffers and the second pass reads
//! them back (it reads the gradient again only to tell whether it is finite). The arithmetic of
//! every value is the same, so the parameter, codes and absmax equal the plain kernel's bit for
//! bit; it trades two table reads per element (on CPUs the costliest part of the step) for one
//! `f32` store and load each, which a work item's block (256 elements, 2 KiB of stage) keeps in
//! the data cache.
//!
//! Parameters: the plain kernel's ([`OptimSpec::build`]; `_gs` adds `gnorm_scale` after its
//! scalars), then `m_stage: f32[n] readwrite` and `v_stage: f32[n] readwrite`. Their contents on
//! entry are never read; on exit they hold the updated moments before requantization (`+0.0`
//! for both where the gradient is not finite). The runtime launches the kernel over chunks of
//! the parameter with one reused workspace, so the stage stays small.
//!
//! The kernel is the kernel-language [`crate::adam::optim8::adam8bit`] in its staged form; the
//! host launches it through its typed arguments ([`crate::adam::Adam8bitArgs`]).

mod catalog;
pub(crate) mod host;
#[cfg(test)]
mod tests;

use crate::adam::{Adam8bit, Form, OptimSpec, StateBits};
use qforge_ir::dsl::TypedKernel;
use qforge_ir::Kernel;
use qforge_ir::{Error, Result};

/// One staged 8-bit Adam / AdamW kernel (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OptimStagedSpec {
    /// The plain kernel's spec; its state must be [`StateBits::Bits8`].
    pub spec: OptimSpec,
    /// The `_gs` variant (`gnorm_scale` after the other scalars).
    pub grad_opts: bool,
}

impl OptimStagedSpec {
    /// The kernel name, e.g. `adamw8bit_staged_f32`, `adam8bit_staged_bf16_gs`.
    pub fn name(&self) -> String {
        let gs = if self.grad_opts { "_gs" } else { "" };
        format!(
            "{}{}_staged_{}{gs}",
            self.spec.algo.name(),
            self.spec.state.name(),
            self.spec.dtype
        )
    }

    /// Builds the kernel.
    ///
    /// # Errors
    /// [`Error::Unsupported`] for 32-bit state (it has no codes to stage) or a parameter dtype
    /// other than f32, f16, bf16.
    pub fn build(&self) -> Result<Kernel> {
        self.typed().map(TypedKernel::into_kernel)
    }

    /// The typed kernel ([`crate::adam::optim8::adam8bit`] in its staged form), launched
    /// through [`Adam8bitArgs`](crate::adam::Adam8bitArgs).
    ///
    /// # Errors
    /// As [`OptimStagedSpec::build`].
    pub fn typed(&self) -> Result<TypedKernel<Adam8bit>> {
        crate::check_float_dtype(self.spec.dtype)?;
        if self.spec.state != StateBits::Bits8 {
            return Err(Error::Unsupported(format!(
                "{}: only 8-bit state has a staged kernel",
                self.name()
            )));
        }
        let form = Form {
            grad_opts: self.grad_opts,
            scaled: false,
            staged: true,
        };
        self.spec.typed8(&self.name(), form)
    }
}
