//! Update-norm (trust-ratio) optimizers with 8-bit blockwise state: 8-bit LAMB and LARS. The
//! state is qforge's 8-bit optimizer state exactly as the 8-bit AdamW / SGD-momentum kernels
//! keep it (blocks of [`OPTIM_BLOCKSIZE`](crate::OPTIM_BLOCKSIZE) elements; `state1` codes of the signed dynamic map,
//! `state2` codes of the unsigned dynamic map, one `f32` absmax per block and state), and the
//! trust ratio is the one of the 32-bit LAMB / LARS kernels ([`crate::optim_norm`]).
//! bitsandbytes' `LAMB8bit` / `LARS8bit` use its non-blockwise 8-bit path instead (one absmax
//! per tensor); the states are not interchangeable. Formulas: `docs/optimizers.md`, section
//! "8-bit LAMB and LARS".
//!
//! A step is three kernels, as for 32-bit state:
//! 1. `lamb8_norm_{dtype}` / `lars8_norm_f32` ([`OptimNorm8Spec::Partials`]): the per-block
//!    partial sums of `lamb_norm_*` / `lars_norm_f32` (order `Strided(8)`), with the old
//!    moments decoded from the 8-bit state exactly as the 8-bit update decodes them
//!    (`code[q] * absmax[block]`, the absmax loaded once per work item), so the moments in `u`
//!    are bit-identical to the ones the update computes. LAMB:
//!    `u = (m * inv_c1) / (sqrt(v * inv_c2) + eps)`; LARS: `u = first ? g : fma(s_old, momentum, g)`;
//!    `u = +0.0` for a non-finite gradient.
//! 2. `optim_norm_scale` (shared with 32-bit state).
//! 3. `lamb8bit_{dtype}` / `lars8bit_f32` ([`OptimNorm8Spec::Update`]): the `adamw8bit_{dtype}` /
//!    `sgd8bit_f32` kernel with one more buffer `scale: f32[1] read` after the others, and the
//!    step multiplied by `scale[0]` where the 32-bit LAMB / LARS kernels multiply it (once per
//!    work item: `ss = scale * step_size` resp. `nls = neg_lr * scale`); with `scale = 1` they
//!    equal `adamw8bit_{dtype}` / `sgd8bit_f32` bit for bit. A non-finite gradient element
//!    zeroes its state and leaves its parameter unchanged, as in every 8-bit kernel.
//!
//! Parameter order:
//! * `lamb8_norm_{dtype}`: `(n: u32, n_blocks: u32, beta1, one_minus_beta1, beta2,
//!   one_minus_beta2, inv_c1, inv_c2, eps: f32, p: dtype[n] read, g: dtype[n] read,
//!   state1: u8[n] read, absmax1: f32[n_blocks] read, state2: u8[n] read,
//!   absmax2: f32[n_blocks] read, unorm_part: f32[n_blocks] write,
//!   pnorm_part: f32[n_blocks] write)`; scalars [`crate::LambScalars::partials_args`].
//! * `lars8_norm_f32`: `(n: u32, n_blocks: u32, first: u32, momentum: f32, p: f32[n] read,
//!   g: f32[n] read, state1: u8[n] read, absmax1: f32[n_blocks] read,
//!   unorm_part: f32[n_blocks] write, pnorm_part: f32[n_blocks] write)`; scalars
//!   [`crate::LarsScalars::partials_args`].
//! * `lamb8bit_{dtype}`: `adamw8bit_{dtype}`'s parameters (`n, n_blocks, beta1,
//!   one_minus_beta1, beta2, one_minus_beta2, decay, step_size, c2, eps, p, g, state1, absmax1,
//!   state2, absmax2`), then `scale: f32[1] read`; scalars [`LambHyper::update8_args`].
//! * `lars8bit_f32`: `sgd8bit_f32`'s parameters (`n, n_blocks, first, beta1, one_minus_beta1,
//!   beta2, one_minus_beta2, weight_decay, decay, eps, lr, neg_lr, p, g, state1, absmax1`), then
//!   `scale: f32[1] read`; scalars [`LarsHyper::update8_args`].
//!
//! Percentile clipping: the `_gs` variants ([`crate::OptimExtSpec::Norm8`], built here
//! with a flag) take `gnorm_scale: f32` after the other scalars and use `g * gnorm_scale` for
//! every `g`; `lars8bit_f32_gs` also takes `skip_zeros: u32` with `sgd8bit_f32_gs`'s semantics
//! (raw `g == 0`), `lamb8bit_*_gs` none (as `adamw8bit_*_gs`), the partials none.
//!
//! The partials are written in the kernel language ([`kernel::lamb8_norm`],
//! [`kernel::lars8_norm`]); the updates are the kernel-language 8-bit AdamW / SGD kernels in
//! their trust-ratio scaled form ([`crate::adam::optim8::adam8bit`],
//! [`crate::optim1::kernel::optim1_8bit`]). The host ops launch all four through their typed
//! arguments ([`Lamb8NormArgs`], [`Lars8NormArgs`], `Adam8bitArgs`,
//! [`crate::optim1::Optim1Update8Args`]).

mod catalog;
pub(crate) use catalog::example_args_gs;
pub(crate) mod host;
pub mod kernel;
#[cfg(test)]
mod reference;
#[cfg(test)]
mod tests;

pub use crate::optim_norm8::kernel::{Lamb8Norm, Lamb8NormArgs, Lars8Norm, Lars8NormArgs};

use crate::adam::optim8::{adam8bit, Adam8bit};
use crate::adam::Form;
use crate::adam::{AdamScalars, OptimAlgo, OptimSpec, StateBits};
use crate::check_float_dtype;
use crate::optim1::kernel::optim1_8bit;
use crate::optim1::{Optim1Algo, Optim1Hyper, Optim1Scalars, Optim1Spec, Optim1Update8};
use crate::optim_norm::{LambHyper, LarsHyper, NormRule};
use qforge_ir::dsl::TypedKernel;
use qforge_ir::Kernel;
use qforge_ir::{DType, Scalar};
use qforge_ir::{Error, Result};

/// One kernel of the 8-bit update-norm optimizers (the scale kernel is
/// [`crate::OptimNormSpec::Scale`], shared with 32-bit state).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OptimNorm8Spec {
    /// Per-block partial sums of the squared update and the squared parameter, from 8-bit
    /// state.
    Partials {
        /// LAMB or LARS.
        rule: NormRule,
        /// Parameter and gradient dtype.
        dtype: DType,
    },
    /// The scaled 8-bit update.
    Update {
        /// LAMB or LARS.
        rule: NormRule,
        /// Parameter and gradient dtype.
        dtype: DType,
    },
}

impl OptimNorm8Spec {
    /// The kernel name: `lamb8_norm_f32`, `lars8_norm_f32`, `lamb8bit_bf16`, `lars8bit_f32`, ...
    pub fn name(&self) -> String {
        match *self {
            OptimNorm8Spec::Partials { rule, dtype } => format!("{}8_norm_{dtype}", rule.name()),
            OptimNorm8Spec::Update { rule, dtype } => format!("{}8bit_{dtype}", rule.name()),
        }
    }

    /// The rule and the parameter dtype.
    pub fn rule_dtype(&self) -> (NormRule, DType) {
        match *self {
            OptimNorm8Spec::Partials { rule, dtype } | OptimNorm8Spec::Update { rule, dtype } => {
                (rule, dtype)
            }
        }
    }

    /// Builds the kernel (see the module docs).
    ///
    /// # Errors
    /// [`Error::Unsupported`] for a dtype the rule does not take ([`NormRule::param_dtypes`]).
    pub fn build(&self) -> Result<Kernel> {
        self.build_with(&self.name(), false)
    }

    /// Builds the `_gs` variant named `name` ([`crate::optim_ext`]): the same kernel
    /// with `gnorm_scale: f32` after the other scalars (`lars8bit_f32_gs` also `skip_zeros: u32`,
    /// as `sgd8bit_f32_gs`); every use of `g` becomes `g * gnorm_scale`.
    ///
    /// # Errors
    /// As [`OptimNorm8Spec::build`].
    pub(crate) fn build_gs(&self, name: &str) -> Result<Kernel> {
        self.build_with(name, true)
    }

    fn build_with(&self, name: &str, gs: bool) -> Result<Kernel> {
        let (rule, dtype) = self.rule_dtype();
        check_float_dtype(dtype)?;
        if !rule.param_dtypes().contains(&dtype) {
            return Err(Error::Unsupported(format!(
                "{}: {} kernels support f32 parameters only, got {dtype}",
                self.name(),
                rule.name()
            )));
        }
        match (*self, rule) {
            (OptimNorm8Spec::Partials { .. }, NormRule::Lamb) => {
                kernel::lamb8_norm(dtype, name, gs).map(TypedKernel::into_kernel)
            }
            (OptimNorm8Spec::Partials { .. }, NormRule::Lars) => {
                kernel::lars8_norm(name, gs).map(TypedKernel::into_kernel)
            }
            (OptimNorm8Spec::Update { .. }, NormRule::Lamb) => {
                adamw8_spec(dtype).build_scaled(name, gs)
            }
            (OptimNorm8Spec::Update { .. }, NormRule::Lars) => sgd8_spec().build_scaled(name, gs),
        }
    }
}

/// The typed `lamb8bit_{dtype}` kernel named `name`: [`adam8bit`] of `adamw8bit_{dtype}` in its
/// trust-ratio scaled form (`gs`: also the `_gs` scalar `gnorm_scale`).
///
/// # Errors
/// [`Error::Unsupported`] for a parameter dtype other than f32, f16, bf16.
pub(crate) fn lamb8_update(dtype: DType, name: &str, gs: bool) -> Result<TypedKernel<Adam8bit>> {
    let form = Form {
        grad_opts: gs,
        scaled: true,
        staged: false,
    };
    adam8bit(&adamw8_spec(dtype), name, form)
}

/// The typed `lars8bit_f32` kernel named `name`: [`optim1_8bit`] of `sgd8bit_f32` with the
/// trust-ratio buffer (`gs`: also the `_gs` scalars `gnorm_scale`, `skip_zeros`).
///
/// # Errors
/// None in practice (`sgd8bit_f32` always builds); the builder's errors otherwise.
pub(crate) fn lars8_update(name: &str, gs: bool) -> Result<TypedKernel<Optim1Update8>> {
    optim1_8bit(&sgd8_spec(), name, gs, true)
}

/// `adamw8bit_{dtype}`: the kernel `lamb8bit_{dtype}` scales.
fn adamw8_spec(dtype: DType) -> OptimSpec {
    OptimSpec {
        algo: OptimAlgo::AdamW,
        state: StateBits::Bits8,
        dtype,
    }
}

/// `sgd8bit_f32`: the kernel `lars8bit_f32` scales.
fn sgd8_spec() -> Optim1Spec {
    Optim1Spec {
        algo: Optim1Algo::Sgd,
        state: StateBits::Bits8,
        dtype: DType::F32,
    }
}

impl LambHyper {
    /// The `f32` scalars of `lamb8bit_*` after `n`, `n_blocks` for step `step` (1-based): those
    /// of `adamw8bit_*` ([`AdamScalars::kernel_args`]) for [`LambHyper::adam`].
    ///
    /// # Errors
    /// [`Error::Unsupported`] for step 0 or invalid hyperparameters ([`LambHyper::check`]).
    pub fn update8_args(&self, step: u32) -> Result<Vec<Scalar>> {
        let spec = adamw8_spec(DType::F32);
        Ok(self.update8_scalars(step)?.kernel_args(&spec))
    }

    /// The scalars of `lamb8bit_*` for step `step` (1-based) as a struct (as
    /// [`LambHyper::update8_args`]).
    ///
    /// # Errors
    /// As [`LambHyper::update8_args`].
    pub fn update8_scalars(&self, step: u32) -> Result<AdamScalars> {
        self.check()?;
        self.adam().scalars(&adamw8_spec(DType::F32), step)
    }
}

impl LarsHyper {
    /// The SGD-with-momentum hyperparameters of the update: `lr`, `beta1 = momentum`,
    /// `weight_decay` (coupled), `beta2 = eps = 0` (unused by SGD).
    pub fn sgd(&self) -> Optim1Hyper {
        Optim1Hyper {
            lr: self.lr,
            beta1: self.momentum,
            beta2: 0.0,
            eps: 0.0,
            weight_decay: self.weight_decay,
        }
    }

    /// The scalars of `lars8bit_f32` after `n`, `n_blocks` for step `step` (1-based): those of
    /// `sgd8bit_f32` ([`crate::Optim1Scalars::kernel_args`]) for [`LarsHyper::sgd`].
    ///
    /// # Errors
    /// [`Error::Unsupported`] for step 0 or invalid hyperparameters ([`LarsHyper::check`]).
    pub fn update8_args(&self, step: u32) -> Result<Vec<Scalar>> {
        Ok(self.update8_scalars(step)?.kernel_args())
    }

    /// The scalars of `lars8bit_f32` for step `step` (1-based) as a struct (as
    /// [`LarsHyper::update8_args`]).
    ///
    /// # Errors
    /// As [`LarsHyper::update8_args`].
    pub fn update8_scalars(&self, step: u32) -> Result<Optim1Scalars> {
        self.check()?;
        self.sgd().scalars(Optim1Algo::Sgd, step)
    }
}
