//! AdEMAMix update kernels (bitsandbytes' `AdEMAMix`, `AdEMAMix8bit`): two EMAs of the gradient
//! (fast `m1` with `beta1`, slow `m2` with `beta3`) and the second moment `nu`, with 32-bit or
//! 8-bit blockwise state (`ademamix32_f32`, `ademamix8bit_f32`; `f32` parameters only). The
//! formulas and their sources are in `docs/optimizers.md`; every operation is one `f32`
//! operation rounded to nearest even unless it says `fma`.
//!
//! Per element with a finite gradient `g`:
//! * `m1 = fma(m1, beta1, one_minus_beta1 * g)`, `m2 = fma(m2, beta3, one_minus_beta3 * g)`,
//!   `nu = fma(nu, beta2, (one_minus_beta2 * g) * g)`;
//! * `p = p * decay` (decoupled weight decay, before the update);
//! * `p = fma(neg_lr, fma(alpha, m2, m1 / c1) / (sqrt(nu) / c2 + eps), p)`.
//!
//! A non-finite `g` sets all three states to `+0.0` and leaves the parameter unchanged.
//!
//! 8-bit state: `m1` and `m2` as signed dynamic map codes, `nu` as unsigned dynamic map codes,
//! each with its own `f32` absmax per block of [`OPTIM_BLOCKSIZE`](crate::OPTIM_BLOCKSIZE); two passes as in
//! [`crate::adam`].
//!
//! Parameters: `(n: u32, n_blocks: u32, beta1, one_minus_beta1, beta2, one_minus_beta2, beta3,
//! one_minus_beta3, alpha, c1, c2, eps, decay, neg_lr: f32, p: f32[n] readwrite, g: f32[n] read,`
//! then 32-bit `state1, state2, state3: f32[n] readwrite` (`m1`, `nu`, `m2`) or 8-bit
//! `state1: u8[n], absmax1: f32[n_blocks], state2: u8[n], absmax2, state3: u8[n], absmax3`
//! (all readwrite)`)`.
//!
//! The kernels are written in the kernel language ([`kernel`]: [`kernel::ademamix32`],
//! [`kernel::ademamix8bit`]); the host ops launch them through their typed arguments
//! ([`Ademamix32Args`], [`Ademamix8Args`]).

mod catalog;
pub(crate) mod host;
pub mod kernel;
#[cfg(test)]
mod reference;
#[cfg(test)]
mod tests;

pub use crate::optim_ademamix::kernel::{Ademamix32, Ademamix32Args, Ademamix8, Ademamix8Args};

use crate::adam::StateBits;
use crate::adam::{check_f32_scalars, step_exponent};
use qforge_ir::dsl::TypedKernel;
use qforge_ir::Kernel;
use qforge_ir::{DType, Scalar};
use qforge_ir::{Error, Result};

/// One AdEMAMix kernel variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AdemamixSpec {
    /// 32-bit or 8-bit blockwise state.
    pub state: StateBits,
    /// Dtype of the parameter and the gradient: only `f32` is supported.
    pub dtype: DType,
}

/// AdEMAMix hyperparameters (bitsandbytes' names), in `f64`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdemamixHyper {
    /// Learning rate.
    pub lr: f64,
    /// Fast EMA decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Slow EMA decay (final value when `t_beta3` is set).
    pub beta3: f64,
    /// Weight of the slow EMA (final value when `t_alpha` is set).
    pub alpha: f64,
    /// Denominator epsilon.
    pub eps: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
    /// Warm-up steps of `alpha`: `alpha_t = min(t * alpha / t_alpha, alpha)`.
    pub t_alpha: Option<u32>,
    /// Warm-up steps of `beta3` (the AdEMAMix paper's scheduler).
    pub t_beta3: Option<u32>,
}

impl Default for AdemamixHyper {
    /// bitsandbytes' defaults: lr 1e-3, betas (0.9, 0.999, 0.9999), alpha 5, eps 1e-8,
    /// weight decay 1e-2, no schedulers.
    fn default() -> Self {
        AdemamixHyper {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            beta3: 0.9999,
            alpha: 5.0,
            eps: 1e-8,
            weight_decay: 1e-2,
            t_alpha: None,
            t_beta3: None,
        }
    }
}

/// The `f32` kernel scalars of one step (after `n`, `n_blocks`), derived in `f64`, each rounded
/// once: `beta1, 1 - beta1, beta2, 1 - beta2, beta3_t, 1 - beta3_t, alpha_t, c1 = 1 - beta1^t,
/// c2 = sqrt(1 - beta2^t), eps, decay = 1 - lr * wd, neg_lr = -lr`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdemamixScalars(pub [f32; 12]);

impl AdemamixHyper {
    /// Checks the values: finite, `lr >= 0`, betas in `[0, 1)`, `alpha >= 0`, `eps > 0`,
    /// `weight_decay >= 0`, schedulers `> 0` when set.
    ///
    /// # Errors
    /// [`Error::Unsupported`] naming the first bad value.
    pub fn check(&self) -> Result<()> {
        let bad = |what: &str, v: f64, need: &str| {
            Err(Error::Unsupported(format!(
                "ademamix hyperparameter {what} = {v} is invalid: it must be {need}"
            )))
        };
        for (name, x) in [("lr", self.lr), ("alpha", self.alpha)] {
            if !(x.is_finite() && x >= 0.0) {
                return bad(name, x, "finite and >= 0");
            }
        }
        let betas = [
            ("beta1", self.beta1),
            ("beta2", self.beta2),
            ("beta3", self.beta3),
        ];
        for (name, x) in betas {
            if !(0.0..1.0).contains(&x) {
                return bad(name, x, "in [0, 1)");
            }
        }
        if !(self.eps.is_finite() && self.eps > 0.0) {
            return bad("eps", self.eps, "finite and > 0");
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return bad("weight_decay", self.weight_decay, "finite and >= 0");
        }
        for (name, t) in [("t_alpha", self.t_alpha), ("t_beta3", self.t_beta3)] {
            if t == Some(0) {
                return bad(name, 0.0, "> 0 when set");
            }
        }
        Ok(())
    }

    /// `(alpha_t, beta3_t)` of step `step` (f64): the alpha warm-up `min(t*alpha/T, alpha)` and
    /// the beta3 warm-up `min(exp(ln b1 * ln b3 / ((1 - t/T) ln b3 + (t/T) ln b1)), b3)` of the
    /// AdEMAMix paper.
    pub fn scheduled(&self, step: u32) -> (f64, f64) {
        let t = step as f64;
        let alpha = match self.t_alpha {
            Some(ta) => (t * self.alpha / ta as f64).min(self.alpha),
            None => self.alpha,
        };
        let beta3 = match self.t_beta3 {
            Some(tb) if self.beta1 > 0.0 && self.beta3 > 0.0 => {
                let (l1, l3) = (self.beta1.ln(), self.beta3.ln());
                let f = t / tb as f64;
                ((l1 * l3) / ((1.0 - f) * l3 + f * l1))
                    .exp()
                    .min(self.beta3)
            }
            _ => self.beta3,
        };
        (alpha, beta3)
    }

    /// The kernel scalars of step `step` (1-based).
    ///
    /// # Errors
    /// [`Error::Unsupported`] for step 0 or invalid hyperparameters.
    pub fn scalars(&self, step: u32) -> Result<AdemamixScalars> {
        self.check()?;
        let t = step_exponent(step)?;
        let (alpha, beta3) = self.scheduled(step);
        let v = [
            self.beta1,
            1.0 - self.beta1,
            self.beta2,
            1.0 - self.beta2,
            beta3,
            1.0 - beta3,
            alpha,
            1.0 - self.beta1.powi(t),
            (1.0 - self.beta2.powi(t)).sqrt(),
            self.eps,
            1.0 - self.lr * self.weight_decay,
            -self.lr,
        ];
        let s = v.map(|x| x as f32);
        let named: Vec<(&str, f32)> = SCALAR_NAMES.iter().copied().zip(s).collect();
        check_f32_scalars(&named, &["eps"])?;
        Ok(AdemamixScalars(s))
    }
}

impl AdemamixScalars {
    /// The scalar arguments after `n` and `n_blocks`.
    pub fn kernel_args(&self) -> Vec<Scalar> {
        self.0.iter().map(|x| Scalar::f32(*x)).collect()
    }
}

/// The `f32` scalar names, in parameter order.
pub(crate) const SCALAR_NAMES: [&str; 12] = [
    "beta1",
    "one_minus_beta1",
    "beta2",
    "one_minus_beta2",
    "beta3",
    "one_minus_beta3",
    "alpha",
    "c1",
    "c2",
    "eps",
    "decay",
    "neg_lr",
];

impl AdemamixSpec {
    /// `ademamix32_f32` or `ademamix8bit_f32`.
    pub fn name(&self) -> String {
        format!("ademamix{}_{}", self.state.name(), self.dtype)
    }

    /// Builds the kernel (see the module docs).
    ///
    /// # Errors
    /// [`Error::Unsupported`] for a parameter dtype other than `f32`.
    pub fn build(&self) -> Result<Kernel> {
        self.check_dtype()?;
        match self.state {
            StateBits::Bits32 => kernel::ademamix32(self).map(TypedKernel::into_kernel),
            StateBits::Bits8 => kernel::ademamix8bit(self).map(TypedKernel::into_kernel),
        }
    }

    /// `Ok` for an `f32` parameter dtype.
    ///
    /// # Errors
    /// [`Error::Unsupported`] for a parameter dtype other than `f32`.
    fn check_dtype(&self) -> Result<()> {
        if self.dtype != DType::F32 {
            return Err(Error::Unsupported(format!(
                "{}: AdEMAMix kernels support f32 parameters only, got {}",
                self.name(),
                self.dtype
            )));
        }
        Ok(())
    }

    /// The typed 32-bit kernel ([`kernel::ademamix32`]).
    ///
    /// # Errors
    /// As [`AdemamixSpec::build`]; [`Error::Unsupported`] for 8-bit state.
    pub fn typed32(&self) -> Result<TypedKernel<Ademamix32>> {
        self.check_dtype()?;
        match self.state {
            StateBits::Bits32 => kernel::ademamix32(self),
            StateBits::Bits8 => Err(Error::Unsupported(format!(
                "{} has 8-bit state, not 32-bit",
                self.name()
            ))),
        }
    }

    /// The typed 8-bit kernel ([`kernel::ademamix8bit`]).
    ///
    /// # Errors
    /// As [`AdemamixSpec::build`]; [`Error::Unsupported`] for 32-bit state.
    pub fn typed8(&self) -> Result<TypedKernel<Ademamix8>> {
        self.check_dtype()?;
        match self.state {
            StateBits::Bits8 => kernel::ademamix8bit(self),
            StateBits::Bits32 => Err(Error::Unsupported(format!(
                "{} has 32-bit state, not 8-bit",
                self.name()
            ))),
        }
    }
}
