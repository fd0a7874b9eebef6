//! Update-norm (trust-ratio) optimizers with bitsandbytes' semantics: 32-bit LAMB and LARS,
//! i.e. bitsandbytes' `max_unorm` path of `optimizer_update_32bit` (CUDA
//! `kPreconditionOptimizer32bit{2,1}State` + `kOptimizer32bit{2,1}State`). The formulas, their
//! sources and the summation order are in `docs/optimizers.md`, section "LAMB and LARS"; every
//! operation below is one `f32` operation rounded to nearest even unless it says `fma`.
//!
//! A step is three kernels, each with one defined order:
//! 1. `lamb_norm_{dtype}` / `lars_norm_f32` ([`OptimNormSpec::Partials`]): one work item per
//!    block of [`OPTIM_BLOCKSIZE`](crate::OPTIM_BLOCKSIZE) elements writes the block's sum of squared updates
//!    `unorm_part[b]` and sum of squared parameters `pnorm_part[b]`, each a
//!    [`crate::Stmt::Accumulate`] with order `Strided(8)` over the block's elements (element `i`
//!    of the block into partial `i % 8` with `fma(x, x, partial)`, then the halving tree).
//! 2. `optim_norm_scale` ([`OptimNormSpec::Scale`]): one work item sums both partial arrays
//!    sequentially (`Op::Reduce`, `Sequential`, from `-0.0`), takes `unorm = sqrt(su)`,
//!    `pnorm = sqrt(sp)`, `thr = max_unorm * pnorm + eps` and stores
//!    `scale = (max_unorm > 0 && unorm > thr) ? thr / unorm : 1.0` into `scale[0]`.
//! 3. `lamb32_{dtype}` / `lars32_f32` ([`OptimNormSpec::Update`]): the AdamW / SGD-momentum
//!    update of [`crate::adam`] / [`crate::optim1`] with the step multiplied
//!    by `scale[0]` (once per work item: `ss = scale * step_size` resp. `nls = neg_lr * scale`),
//!    so with `scale = 1` they equal `adamw32_{dtype}` / `sgd32_f32` bit for bit.
//!
//! The update whose norm is taken is bitsandbytes' preconditioner output, without the learning
//! rate and without weight decay (neither backend of bitsandbytes puts weight decay into it):
//! * LAMB: `u = (m * inv_c1) / (sqrt(v * inv_c2) + eps)` with this step's moments
//!   `m = fma(g, one_minus_beta1, m_old * beta1)`, `v = fma(one_minus_beta2 * g, g, v_old * beta2)`
//!   (bit-identical to the update kernel's), `inv_c1 = f32(1 / (1 - beta1^t))`,
//!   `inv_c2 = f32(1 / (1 - beta2^t))`.
//! * LARS: `u = first ? g : fma(s_old, momentum, g)` (the momentum from the raw gradient).
//!
//! A non-finite gradient element (NaN, ±inf) contributes `u = +0.0` (its update is not applied:
//! the update kernels zero its state and leave its parameter unchanged, as the other optimizer
//! kernels do). The parameter norm is taken over the parameters before the step (widened to
//! `f32`), as bitsandbytes' `torch.norm(p.float())`.
//!
//! Parameter order:
//! * `lamb_norm_{dtype}`: `(n: u32, n_blocks: u32, beta1, one_minus_beta1, beta2,
//!   one_minus_beta2, inv_c1, inv_c2, eps: f32, p: dtype[n] read, g: dtype[n] read,
//!   state1: f32[n] read, state2: f32[n] read, unorm_part: f32[n_blocks] write,
//!   pnorm_part: f32[n_blocks] write)`.
//! * `lars_norm_f32`: `(n: u32, n_blocks: u32, first: u32, momentum: f32, p: f32[n] read,
//!   g: f32[n] read, state1: f32[n] read, unorm_part: f32[n_blocks] write,
//!   pnorm_part: f32[n_blocks] write)`.
//! * `optim_norm_scale`: `(n_blocks: u32, max_unorm: f32, eps: f32, unorm_part: f32[n_blocks]
//!   read, pnorm_part: f32[n_blocks] read, scale: f32[1] write)`.
//! * `lamb32_{dtype}`: `(n: u32, n_blocks: u32, beta1, one_minus_beta1, beta2, one_minus_beta2,
//!   decay, step_size, eps_c2: f32, p: dtype[n] readwrite, g: dtype[n] read,
//!   state1: f32[n] readwrite, state2: f32[n] readwrite, scale: f32[1] read)`.
//! * `lars32_f32`: `(n: u32, n_blocks: u32, first: u32, momentum, weight_decay, neg_lr: f32,
//!   p: f32[n] readwrite, g: f32[n] read, state1: f32[n] readwrite, scale: f32[1] read)`.
//!
//! Percentile clipping (bitsandbytes passes `gnorm_scale` to the precondition and the update
//! kernel alike): the `_gs` variants ([`crate::OptimExtSpec::Norm`], built here with a
//! flag) take `gnorm_scale: f32` after the other scalars and use `gs = g * gnorm_scale` (one
//! rounding) for every `g`, the non-finite test included. The update variants also take
//! `skip_zeros: u32`: LAMB skips an element whose `gs` is `±0` (as `adamw32_*_gs`), LARS one
//! whose `gw` (after coupled weight decay) is `±0` (as `sgd32_f32_gs`); a skipped element keeps
//! its parameter and state. The partials take no `skip_zeros` (bitsandbytes' precondition
//! kernels have none), so skipped elements count in the norm. With `gnorm_scale = 1` and
//! `skip_zeros = 0` each variant equals its plain kernel bit for bit.
//!
//! The kernels are written in the kernel language ([`kernel`]: [`kernel::lamb_norm`],
//! [`kernel::lars_norm`], [`kernel::optim_norm_scale`], [`kernel::lamb32`], [`kernel::lars32`]);
//! the host ops launch them through their typed arguments ([`LambNormArgs`], [`LarsNormArgs`],
//! [`OptimNormScaleArgs`], [`Lamb32Args`], [`Lars32Args`]).

mod catalog;
pub(crate) use catalog::example_args_gs;
pub(crate) mod host;
mod hyper;
pub mod kernel;
#[cfg(test)]
pub(crate) mod reference;
#[cfg(test)]
pub(crate) mod tests;

pub use crate::optim_norm::kernel::{Lamb32, Lamb32Args, LambNorm, LambNormArgs};
pub use crate::optim_norm::kernel::{Lars32, Lars32Args, LarsNorm, LarsNormArgs};
pub use crate::optim_norm::kernel::{OptimNormScale, OptimNormScaleArgs};

use crate::check_float_dtype;
use qforge_ir::dsl::TypedKernel;
use qforge_ir::ReduceOrder;
use qforge_ir::{DType, Kernel};
use qforge_ir::{Error, Result};

pub use crate::optim_norm::hyper::{LambHyper, LambScalars, LarsHyper, LarsScalars};

/// The summation order of the per-block partial sums (8 partials, then the halving tree).
pub const NORM_ORDER: ReduceOrder = ReduceOrder::Strided(8);

/// The rule whose update norm is taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NormRule {
    /// LAMB: AdamW with the trust ratio (bitsandbytes `LAMB`, `max_unorm` 1.0).
    Lamb,
    /// LARS: SGD with momentum and the trust ratio (bitsandbytes `LARS`, `max_unorm` 0.02).
    Lars,
}

impl NormRule {
    /// Both rules.
    pub const ALL: [NormRule; 2] = [NormRule::Lamb, NormRule::Lars];

    /// `lamb` or `lars`.
    pub const fn name(self) -> &'static str {
        match self {
            NormRule::Lamb => "lamb",
            NormRule::Lars => "lars",
        }
    }

    /// Parameter dtypes of the rule's kernels: `f32`, `f16`, `bf16` for LAMB (as Adam), `f32`
    /// for LARS (as SGD).
    pub const fn param_dtypes(self) -> &'static [DType] {
        match self {
            NormRule::Lamb => &[DType::F32, DType::F16, DType::BF16],
            NormRule::Lars => &[DType::F32],
        }
    }
}

/// One kernel of the update-norm optimizers (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OptimNormSpec {
    /// Per-block partial sums of the squared update and the squared parameter.
    Partials {
        /// LAMB or LARS.
        rule: NormRule,
        /// Parameter and gradient dtype.
        dtype: DType,
    },
    /// The trust-ratio scale from the partial sums (one work item).
    Scale,
    /// The scaled update.
    Update {
        /// LAMB or LARS.
        rule: NormRule,
        /// Parameter and gradient dtype.
        dtype: DType,
    },
}

impl OptimNormSpec {
    /// The kernel name: `lamb_norm_f32`, `lars_norm_f32`, `optim_norm_scale`, `lamb32_bf16`,
    /// `lars32_f32`, ...
    pub fn name(&self) -> String {
        match *self {
            OptimNormSpec::Partials { rule, dtype } => format!("{}_norm_{dtype}", rule.name()),
            OptimNormSpec::Scale => "optim_norm_scale".to_string(),
            OptimNormSpec::Update { rule, dtype } => format!("{}32_{dtype}", rule.name()),
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
    /// with `gnorm_scale: f32` (the update kernels also `skip_zeros: u32`) after the other
    /// scalars; every use of `g` becomes `g * gnorm_scale`.
    ///
    /// # Errors
    /// As [`OptimNormSpec::build`]; [`Error::Unsupported`] for the scale kernel (it reads no
    /// gradient).
    pub(crate) fn build_gs(&self, name: &str) -> Result<Kernel> {
        if *self == OptimNormSpec::Scale {
            return Err(Error::Unsupported(format!(
                "{name}: optim_norm_scale reads no gradient, so it has no gnorm_scale variant"
            )));
        }
        self.build_with(name, true)
    }

    fn build_with(&self, name: &str, gs: bool) -> Result<Kernel> {
        match *self {
            OptimNormSpec::Scale => kernel::optim_norm_scale().map(TypedKernel::into_kernel),
            OptimNormSpec::Partials { rule, dtype } | OptimNormSpec::Update { rule, dtype } => {
                check_float_dtype(dtype)?;
                if !rule.param_dtypes().contains(&dtype) {
                    return Err(Error::Unsupported(format!(
                        "{}: {} kernels support f32 parameters only, got {dtype}",
                        self.name(),
                        rule.name()
                    )));
                }
                let partials = matches!(self, OptimNormSpec::Partials { .. });
                match (rule, partials) {
                    (NormRule::Lamb, true) => {
                        kernel::lamb_norm(dtype, name, gs).map(TypedKernel::into_kernel)
                    }
                    (NormRule::Lamb, false) => {
                        kernel::lamb32(dtype, name, gs).map(TypedKernel::into_kernel)
                    }
                    (NormRule::Lars, true) => {
                        kernel::lars_norm(name, gs).map(TypedKernel::into_kernel)
                    }
                    (NormRule::Lars, false) => {
                        kernel::lars32(name, gs).map(TypedKernel::into_kernel)
                    }
                }
            }
        }
    }
}

/// The step of the catalog's example arguments (not 1, so the momentum path runs).
pub(crate) const EXAMPLE_STEP: u32 = 3;

/// The scale the catalog's update kernels read.
pub(crate) const EXAMPLE_SCALE: f32 = 0.375;
