//! `max_unorm` for 32-bit RMSprop and Adagrad (bitsandbytes' `max_unorm` argument of
//! `Optimizer1State`, CUDA `kPreconditionOptimizer32bit1State` + `kOptimizer32bit1State`): the
//! per-block norm partials of the update, `rmsprop_norm_f32` / `adagrad_norm_f32`. The scale is
//! LAMB/LARS's `optim_norm_scale` with the optimizer's `eps` as the threshold epsilon, and the
//! scaled update is the plain `rmsprop32_f32` / `adagrad32_f32` kernel with `lr` and `neg_lr`
//! multiplied by the scale on the host (`f32(lr) * scale`, `f32(-lr) * scale`, one rounding each,
//! the product LARS's update kernel forms inside). Formulas: `docs/optimizers.md`, section
//! "max_unorm for RMSprop and Adagrad".
//!
//! The update whose norm is taken is bitsandbytes' precondition one, from the raw gradient
//! (no weight decay, as the CUDA precondition kernel) and the state before the step:
//! * RMSprop: `s = fma(s_old, beta1, (one_minus_beta1 * g) * g)`, `u = g / (sqrt(s) + eps)`;
//! * Adagrad: `s = fma(g, g, s_old)`, `u = g / (sqrt(s) + eps)`;
//! * a non-finite `g` contributes `u = +0.0`.
//!
//! `unorm_part[b] = sum u*u`, `pnorm_part[b] = sum p*p` in LAMB's order
//! ([`crate::optim_norm::NORM_ORDER`]).
//!
//! Parameters: `(n: u32, n_blocks: u32, beta1, one_minus_beta1, eps: f32, p: f32[n] read,
//! g: f32[n] read, state1: f32[n] read, unorm_part: f32[n_blocks] write,
//! pnorm_part: f32[n_blocks] write)`.
//!
//! The kernel is written in the kernel language ([`kernel::optim1_norm`]); the host ops launch
//! it through its typed arguments ([`Optim1NormArgs`]).

pub(crate) mod host;
pub mod kernel;
#[cfg(test)]
mod reference;
#[cfg(test)]
mod tests;

pub use crate::optim_norm1::kernel::{Optim1Norm, Optim1NormArgs};

use crate::optim1::{Optim1Algo, Optim1Scalars};
use qforge_ir::dsl::TypedKernel;
use qforge_ir::Kernel;
use qforge_ir::Scalar;
use qforge_ir::{Error, Result};

/// The rules with a `max_unorm` norm kernel here.
pub const NORM1_ALGOS: [Optim1Algo; 2] = [Optim1Algo::Rmsprop, Optim1Algo::Adagrad];

/// `{algo}_norm_f32`.
pub(crate) fn name(algo: Optim1Algo) -> String {
    format!("{}_norm_f32", algo.name())
}

/// The scalar arguments after `n`, `n_blocks`: `beta1`, `one_minus_beta1`, `eps`.
pub fn partials_args(s: &Optim1Scalars) -> Vec<Scalar> {
    [s.beta1, s.one_minus_beta1, s.eps]
        .into_iter()
        .map(Scalar::f32)
        .collect()
}

/// The typed `{algo}_norm_f32` ([`kernel::optim1_norm`], see the module docs); with `gs` its
/// `_gs` variant `{algo}_norm_f32_gs`, which takes `gnorm_scale: f32` after `eps` and uses
/// `g * gnorm_scale` for every `g` (bitsandbytes' precondition kernel scales the gradient
/// first).
///
/// # Errors
/// [`Error::Unsupported`] for Lion and SGD (SGD's is LARS's `lars_norm_f32`; Lion has none,
/// see `docs/optimizers.md`).
pub(crate) fn typed(algo: Optim1Algo, gs: bool) -> Result<TypedKernel<Optim1Norm>> {
    let rms = match algo {
        Optim1Algo::Rmsprop => true,
        Optim1Algo::Adagrad => false,
        Optim1Algo::Lion | Optim1Algo::Sgd => {
            return Err(Error::Unsupported(format!(
                "{}: no update-norm kernel for {} (SGD's is lars_norm_f32; Lion has none)",
                name(algo),
                algo.name()
            )))
        }
    };
    let kname = if gs {
        format!("{}_gs", name(algo))
    } else {
        name(algo)
    };
    kernel::optim1_norm(rms, &kname, gs)
}

/// Builds `{algo}_norm_f32` ([`typed`]); with `gs` its `_gs` variant.
///
/// # Errors
/// As [`typed`].
pub(crate) fn build(algo: Optim1Algo, gs: bool) -> Result<Kernel> {
    typed(algo, gs).map(TypedKernel::into_kernel)
}
