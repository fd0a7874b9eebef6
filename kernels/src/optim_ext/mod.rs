//! bitsandbytes' per-step gradient options of the optimizer updates, as `_gs` kernel variants
//! (`adamw32_f32_gs`, `adam8bit_bf16_gs`, `lion8bit_f32_gs`, ...), and the gradient-norm kernel
//! of percentile clipping (`grad_sqnorm_{dtype}`). The formulas and their sources are in
//! `docs/optimizers.md`, section "Gradient options".
//!
//! A `_gs` variant is the plain kernel ([`OptimSpec`] / [`Optim1Spec`]) with extra scalars after
//! the others (before the buffers): `gnorm_scale: f32` (percentile clipping's scale; every use
//! of the gradient `g` becomes `gs = g * gnorm_scale`, one rounding, as bitsandbytes' kernels
//! multiply first) and, except for the 8-bit Adam / AdamW kernels (bitsandbytes' blockwise
//! two-state kernel ignores `skip_zeros`), `skip_zeros: u32` (non-zero: on). With
//! `gnorm_scale = 1` and `skip_zeros = 0` a variant equals its plain kernel bit for bit.
//!
//! `skip_zeros` follows bitsandbytes' CUDA kernels (`kOptimizer32bit2State`,
//! `kOptimizer32bit1State`, `kOptimizerStatic8bit1StateBlockwise`); a skipped element keeps its
//! parameter (no weight decay either) and its state, selected (no branch), so the loops stay
//! straight-line:
//! * 32-bit Adam / AdamW: skipped when `gs == 0` (`+0` or `-0`);
//! * 32-bit one-state rules: skipped when `gw == 0`, `gw` the scaled gradient after coupled
//!   weight decay (`fma(p, weight_decay, gs)` for SGD, RMSprop, Adagrad; `gs` for Lion);
//! * 8-bit one-state rules: skipped when the raw `g == 0`; the element's state keeps its
//!   dequantized value `code * old_absmax`, takes part in the block's new absmax and is
//!   requantized with the new absmax like every other element (so its code stays the same when
//!   the absmax does not change, and follows the new absmax when it does). bitsandbytes leaves
//!   that register unset on this path; the dequantized value is what its load intends.
//!
//! RMSprop's and Adagrad's 8-bit update numerator is the raw gradient, unscaled, as in
//! bitsandbytes' 8-bit kernel (which reloads `g_vals[j]` for it); their state uses `gs`.
//!
//! The update-norm kernels have `_gs` variants too ([`OptimExtSpec::Norm`],
//! [`OptimExtSpec::Norm8`], [`OptimExtSpec::Norm1Gs`]; built by their own builders with a flag,
//! see [`crate::optim_norm`], [`crate::optim_norm8`],
//! [`crate::optim_norm1`]): `gnorm_scale` reaches the norm partials and the update
//! alike, `skip_zeros` only the updates that take it ([`OptimExtSpec::takes_skip_zeros`]).
//!
//! `grad_sqnorm_{dtype}` `(n: u32, n_blocks: u32, g: dtype[n] read, gnorm_part: f32[n_blocks]
//! write)`: one work item per block of [`OPTIM_BLOCKSIZE`](crate::OPTIM_BLOCKSIZE) elements stores the block's
//! `sum g^2` in LAMB's order ([`crate::optim_norm::NORM_ORDER`]: element `i` into partial
//! `i % 8` with `fma(g, g, partial)`, partials from `-0.0`, then the halving tree). The host sums
//! the partials in block order from `-0.0` (as `optim_norm_scale` does) to the squared norm. It
//! is written in the kernel language ([`kernel::grad_sqnorm`]) and launched through
//! [`GradSqnormArgs`].

mod catalog;
pub(crate) mod host;
pub mod kernel;
#[cfg(test)]
mod reference;
#[cfg(test)]
mod tests;

pub use crate::optim_ext::kernel::{GradSqnorm, GradSqnormArgs};

use crate::adam::{OptimSpec, StateBits};
use crate::check_float_dtype;
use crate::optim1::{Optim1Algo, Optim1Spec};
use crate::optim_norm::{NormRule, OptimNormSpec};
use crate::optim_norm8::OptimNorm8Spec;
use qforge_ir::dsl::TypedKernel;
use qforge_ir::Kernel;
use qforge_ir::Result;
use qforge_ir::{DType, Scalar};

/// A `_gs` kernel variant or the gradient-norm kernel (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OptimExtSpec {
    /// Adam / AdamW with `gnorm_scale` (and `skip_zeros` for 32-bit state).
    Adam(OptimSpec),
    /// A one-state rule with `gnorm_scale` and `skip_zeros`.
    One(Optim1Spec),
    /// `grad_sqnorm_{dtype}`: per-block partial sums of `g^2`.
    GradNorm(DType),
    /// `{algo}_norm_f32`: `max_unorm`'s update-norm partials of 32-bit RMSprop or Adagrad
    /// ([`crate::optim_norm1`]).
    Norm1(Optim1Algo),
    /// `{algo}_norm_f32_gs`: [`OptimExtSpec::Norm1`] with `gnorm_scale`.
    Norm1Gs(Optim1Algo),
    /// `{kernel}_gs` of a 32-bit LAMB / LARS partials or update kernel
    /// ([`crate::optim_norm`]): `gnorm_scale`, and `skip_zeros` for the update kernels.
    /// Not for [`OptimNormSpec::Scale`] (it reads no gradient).
    Norm(OptimNormSpec),
    /// `{kernel}_gs` of an 8-bit LAMB / LARS partials or update kernel
    /// ([`crate::optim_norm8`]): `gnorm_scale`, and `skip_zeros` for `lars8bit_f32`.
    Norm8(OptimNorm8Spec),
}

impl OptimExtSpec {
    /// The kernel name: the plain kernel's name with `_gs`, or `grad_sqnorm_{dtype}`.
    pub fn name(&self) -> String {
        match self {
            OptimExtSpec::Adam(s) => format!("{}_gs", s.name()),
            OptimExtSpec::One(s) => format!("{}_gs", s.name()),
            OptimExtSpec::GradNorm(d) => format!("grad_sqnorm_{d}"),
            OptimExtSpec::Norm1(a) => crate::optim_norm1::name(*a),
            OptimExtSpec::Norm1Gs(a) => format!("{}_gs", crate::optim_norm1::name(*a)),
            OptimExtSpec::Norm(s) => format!("{}_gs", s.name()),
            OptimExtSpec::Norm8(s) => format!("{}_gs", s.name()),
        }
    }

    /// The parameter and gradient dtype.
    pub fn dtype(&self) -> DType {
        match self {
            OptimExtSpec::Adam(s) => s.dtype,
            OptimExtSpec::One(s) => s.dtype,
            OptimExtSpec::GradNorm(d) => *d,
            OptimExtSpec::Norm1(_) | OptimExtSpec::Norm1Gs(_) => DType::F32,
            OptimExtSpec::Norm(s) => match *s {
                OptimNormSpec::Partials { dtype, .. } | OptimNormSpec::Update { dtype, .. } => {
                    dtype
                }
                OptimNormSpec::Scale => DType::F32,
            },
            OptimExtSpec::Norm8(s) => s.rule_dtype().1,
        }
    }

    /// Whether the variant takes `skip_zeros`: the 32-bit Adam / AdamW and every one-state
    /// update, the 32-bit LAMB / LARS updates and the 8-bit LARS update; not the 8-bit Adam /
    /// AdamW / LAMB updates (bitsandbytes' blockwise two-state kernel ignores it) and no norm
    /// kernel (bitsandbytes' precondition kernels take none).
    pub fn takes_skip_zeros(&self) -> bool {
        match self {
            OptimExtSpec::Adam(s) => s.state == StateBits::Bits32,
            OptimExtSpec::One(_) => true,
            OptimExtSpec::Norm(s) => matches!(s, OptimNormSpec::Update { .. }),
            OptimExtSpec::Norm8(s) => matches!(
                s,
                OptimNorm8Spec::Update {
                    rule: NormRule::Lars,
                    ..
                }
            ),
            OptimExtSpec::GradNorm(_) | OptimExtSpec::Norm1(_) | OptimExtSpec::Norm1Gs(_) => false,
        }
    }

    /// The extra scalar arguments of a `_gs` variant, in parameter order (after the plain
    /// kernel's scalars): `gnorm_scale`, then `skip_zeros` (0 or 1) where taken. Empty for
    /// `grad_sqnorm_*` and `{algo}_norm_f32` (no `_gs` suffix).
    pub fn ext_args(&self, gnorm_scale: f32, skip_zeros: bool) -> Vec<Scalar> {
        if matches!(self, OptimExtSpec::GradNorm(_) | OptimExtSpec::Norm1(_)) {
            return Vec::new();
        }
        let mut out = vec![Scalar::f32(gnorm_scale)];
        if self.takes_skip_zeros() {
            out.push(Scalar::U32(u32::from(skip_zeros)));
        }
        out
    }

    /// Builds the kernel.
    ///
    /// # Errors
    /// [`crate::Error::Unsupported`] for a dtype the plain kernel does not take (f32, f16,
    /// bf16 for Adam / AdamW / LAMB and the norm; f32 for the one-state rules and LARS), a
    /// rule without a norm kernel (Lion, SGD for `Norm1*`), and `OptimNormSpec::Scale`.
    pub fn build(&self) -> Result<Kernel> {
        match self {
            OptimExtSpec::Adam(s) => s.build_ext(&self.name()),
            OptimExtSpec::One(s) => s.build_ext(&self.name()),
            OptimExtSpec::GradNorm(d) => grad_sqnorm(*d).map(TypedKernel::into_kernel),
            OptimExtSpec::Norm1(a) => crate::optim_norm1::build(*a, false),
            OptimExtSpec::Norm1Gs(a) => crate::optim_norm1::build(*a, true),
            OptimExtSpec::Norm(s) => s.build_gs(&self.name()),
            OptimExtSpec::Norm8(s) => s.build_gs(&self.name()),
        }
    }
}

/// The typed `grad_sqnorm_{dtype}` kernel ([`kernel::grad_sqnorm`]).
///
/// # Errors
/// [`crate::Error::Unsupported`] for a dtype other than f32, f16, bf16.
pub fn grad_sqnorm(dtype: DType) -> Result<TypedKernel<GradSqnorm>> {
    check_float_dtype(dtype)?;
    kernel::grad_sqnorm(dtype)
}

/// The `gnorm_scale` of the catalog's example arguments (exercises the scaling).
pub(crate) const EXAMPLE_GNORM_SCALE: f32 = 0.75;
