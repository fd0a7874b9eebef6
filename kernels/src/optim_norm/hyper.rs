//! Hyperparameters of the update-norm optimizers (32-bit and 8-bit LAMB and LARS, see
//! [`crate::optim_norm`]): bitsandbytes' names in `f64`, their checks (every value the
//! `f32` kernels receive must be finite there, `max_unorm` must not round to 0), and the `f32`
//! kernel scalars of a step (`docs/optimizers.md`, "LAMB and LARS").

use crate::adam::{check_f32_scalars, step_exponent, AdamHyper, OptimAlgo, OptimSpec, StateBits};
use crate::optim_norm::NormRule;
use qforge_ir::{DType, Scalar};
use qforge_ir::{Error, Result};

/// LAMB hyperparameters (bitsandbytes' names), in `f64`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LambHyper {
    /// Learning rate.
    pub lr: f64,
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Denominator epsilon.
    pub eps: f64,
    /// Decoupled weight decay (applied before the update, as qforge's AdamW; not in the norm).
    pub weight_decay: f64,
    /// Trust-ratio bound: the update is scaled by `max_unorm * |p| / |u|` when
    /// `|u| > max_unorm * |p|`; 0 turns the scaling off (plain AdamW).
    pub max_unorm: f64,
}

impl Default for LambHyper {
    /// bitsandbytes' `LAMB` defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 0,
    /// max_unorm 1.0.
    fn default() -> Self {
        LambHyper {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            max_unorm: 1.0,
        }
    }
}

/// LARS hyperparameters (bitsandbytes' names), in `f64`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LarsHyper {
    /// Learning rate (bitsandbytes has no default).
    pub lr: f64,
    /// Momentum, in `(0, 1)` (bitsandbytes rejects LARS without momentum).
    pub momentum: f64,
    /// Coupled weight decay `g + wd * p` (in the update, not in the norm).
    pub weight_decay: f64,
    /// Trust-ratio bound (see [`LambHyper::max_unorm`]); 0 turns the scaling off (plain SGD).
    pub max_unorm: f64,
}

impl Default for LarsHyper {
    /// lr 1e-2 (PyTorch-LARS' default; bitsandbytes' `LARS` has none), momentum 0.9 (its
    /// default 0 is rejected), weight decay 0, max_unorm 0.02 (bitsandbytes).
    fn default() -> Self {
        LarsHyper {
            lr: 1e-2,
            momentum: 0.9,
            weight_decay: 0.0,
            max_unorm: 0.02,
        }
    }
}

fn bad(rule: NormRule, what: &str, v: f64, need: &str) -> Error {
    Error::Unsupported(format!(
        "{} hyperparameter {what} = {v:?} is invalid: it must be {need}",
        rule.name()
    ))
}

fn check_max_unorm(rule: NormRule, max_unorm: f64) -> Result<()> {
    // The kernels take it as f32: a positive value must not round to 0 (no clipping at all)
    // or to infinity.
    let m32 = max_unorm as f32;
    if max_unorm.is_finite()
        && max_unorm >= 0.0
        && m32.is_finite()
        && (max_unorm == 0.0) == (m32 == 0.0)
    {
        Ok(())
    } else {
        Err(bad(
            rule,
            "max_unorm",
            max_unorm,
            "0 (off) or a positive value that is finite and non-zero in f32",
        ))
    }
}

/// `value` (hyperparameter `name`) must be finite as an `f32` (the kernels' precision).
fn check_f32_range(rule: NormRule, name: &str, value: f64) -> Result<()> {
    if (value as f32).is_finite() {
        Ok(())
    } else {
        Err(bad(rule, name, value, "within f32 range (at most 3.4e38)"))
    }
}

impl LambHyper {
    /// The AdamW hyperparameters of the update.
    pub fn adam(&self) -> AdamHyper {
        AdamHyper {
            lr: self.lr,
            beta1: self.beta1,
            beta2: self.beta2,
            eps: self.eps,
            weight_decay: self.weight_decay,
        }
    }

    /// Checks the values: as [`AdamHyper::check`] for AdamW, `lr` and `weight_decay` within
    /// `f32` range, and `max_unorm` 0 or positive, finite and non-zero in `f32`.
    ///
    /// # Errors
    /// [`Error::Unsupported`] naming the first bad value.
    pub fn check(&self) -> Result<()> {
        self.adam().check(OptimAlgo::AdamW)?;
        for (name, v) in [("lr", self.lr), ("weight_decay", self.weight_decay)] {
            check_f32_range(NormRule::Lamb, name, v)?;
        }
        check_max_unorm(NormRule::Lamb, self.max_unorm)
    }

    /// The kernel scalars of step `step` (1-based): the AdamW 32-bit scalars of
    /// [`AdamHyper::scalars`] plus `inv_c1 = f32(1 / (1 - beta1^t))`,
    /// `inv_c2 = f32(1 / (1 - beta2^t))` (f64, rounded once).
    ///
    /// # Errors
    /// [`Error::Unsupported`] for step 0 or invalid hyperparameters.
    pub fn scalars(&self, step: u32) -> Result<LambScalars> {
        self.check()?;
        let t = step_exponent(step)?;
        let spec = OptimSpec {
            algo: OptimAlgo::AdamW,
            state: StateBits::Bits32,
            dtype: DType::F32,
        };
        let a = self.adam().scalars(&spec, step)?;
        let s = LambScalars {
            beta1: a.beta1,
            one_minus_beta1: a.one_minus_beta1,
            beta2: a.beta2,
            one_minus_beta2: a.one_minus_beta2,
            inv_c1: (1.0 / (1.0 - self.beta1.powi(t))) as f32,
            inv_c2: (1.0 / (1.0 - self.beta2.powi(t))) as f32,
            eps: self.eps as f32,
            decay: a.decay,
            step_size: a.step_size,
            eps_c2: a.eps_c2,
            max_unorm: self.max_unorm as f32,
        };
        check_f32_scalars(
            &[
                ("inv_c1", s.inv_c1),
                ("inv_c2", s.inv_c2),
                ("max_unorm", s.max_unorm),
            ],
            &[],
        )?;
        Ok(s)
    }
}

impl LarsHyper {
    /// Checks the values: all finite, `lr >= 0`, momentum in `(0, 1)`, `weight_decay >= 0`,
    /// `max_unorm >= 0`.
    ///
    /// # Errors
    /// [`Error::Unsupported`] naming the first bad value.
    pub fn check(&self) -> Result<()> {
        let r = NormRule::Lars;
        if !(self.lr.is_finite() && self.lr >= 0.0) {
            return Err(bad(r, "lr", self.lr, "finite and >= 0"));
        }
        if !(self.momentum > 0.0 && self.momentum < 1.0) {
            return Err(bad(
                r,
                "momentum",
                self.momentum,
                "in (0, 1) (LARS without momentum is not supported, as in bitsandbytes)",
            ));
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return Err(bad(r, "weight_decay", self.weight_decay, "finite and >= 0"));
        }
        for (name, v) in [("lr", self.lr), ("weight_decay", self.weight_decay)] {
            check_f32_range(r, name, v)?;
        }
        check_max_unorm(r, self.max_unorm)
    }

    /// The kernel scalars of step `step` (1-based), each `f32(x)` of the `f64` value.
    ///
    /// # Errors
    /// [`Error::Unsupported`] for step 0 or invalid hyperparameters.
    pub fn scalars(&self, step: u32) -> Result<LarsScalars> {
        self.check()?;
        step_exponent(step)?;
        let s = LarsScalars {
            first: u32::from(step == 1),
            momentum: self.momentum as f32,
            weight_decay: self.weight_decay as f32,
            neg_lr: (-self.lr) as f32,
            max_unorm: self.max_unorm as f32,
        };
        check_f32_scalars(
            &[
                ("weight_decay", s.weight_decay),
                ("neg_lr", s.neg_lr),
                ("max_unorm", s.max_unorm),
            ],
            &[],
        )?;
        Ok(s)
    }
}

/// The `f32` scalars of one LAMB step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LambScalars {
    /// `f32(beta1)`.
    pub beta1: f32,
    /// `f32(1 - beta1)`.
    pub one_minus_beta1: f32,
    /// `f32(beta2)`.
    pub beta2: f32,
    /// `f32(1 - beta2)`.
    pub one_minus_beta2: f32,
    /// `f32(1 / (1 - beta1^t))` (norm only).
    pub inv_c1: f32,
    /// `f32(1 / (1 - beta2^t))` (norm only).
    pub inv_c2: f32,
    /// `f32(eps)` (norm only).
    pub eps: f32,
    /// `f32(1 - lr * weight_decay)`.
    pub decay: f32,
    /// `f32(-lr * sqrt(1 - beta2^t) / (1 - beta1^t))`.
    pub step_size: f32,
    /// `f32(eps * sqrt(1 - beta2^t))`.
    pub eps_c2: f32,
    /// `f32(max_unorm)` (scale kernel).
    pub max_unorm: f32,
}

impl LambScalars {
    /// The `f32` arguments of `lamb_norm_*` after `n`, `n_blocks`.
    pub fn partials_args(&self) -> Vec<Scalar> {
        [
            self.beta1,
            self.one_minus_beta1,
            self.beta2,
            self.one_minus_beta2,
            self.inv_c1,
            self.inv_c2,
            self.eps,
        ]
        .into_iter()
        .map(Scalar::f32)
        .collect()
    }

    /// The `f32` arguments of `lamb32_*` after `n`, `n_blocks`.
    pub fn update_args(&self) -> Vec<Scalar> {
        [
            self.beta1,
            self.one_minus_beta1,
            self.beta2,
            self.one_minus_beta2,
            self.decay,
            self.step_size,
            self.eps_c2,
        ]
        .into_iter()
        .map(Scalar::f32)
        .collect()
    }

    /// The `f32` arguments of `optim_norm_scale` after `n_blocks`: `max_unorm`, then the
    /// threshold epsilon `+0.0` (bitsandbytes' two-state kernel adds none).
    pub fn scale_args(&self) -> Vec<Scalar> {
        vec![Scalar::f32(self.max_unorm), Scalar::f32(0.0)]
    }
}

/// The scalars of one LARS step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LarsScalars {
    /// `1` on step 1 (the momentum is the gradient itself), else `0`.
    pub first: u32,
    /// `f32(momentum)`.
    pub momentum: f32,
    /// `f32(weight_decay)`.
    pub weight_decay: f32,
    /// `f32(-lr)`.
    pub neg_lr: f32,
    /// `f32(max_unorm)` (scale kernel).
    pub max_unorm: f32,
}

impl LarsScalars {
    /// The arguments of `lars_norm_f32` after `n`, `n_blocks`: `first`, `momentum`.
    pub fn partials_args(&self) -> Vec<Scalar> {
        vec![Scalar::U32(self.first), Scalar::f32(self.momentum)]
    }

    /// The arguments of `lars32_f32` after `n`, `n_blocks`.
    pub fn update_args(&self) -> Vec<Scalar> {
        vec![
            Scalar::U32(self.first),
            Scalar::f32(self.momentum),
            Scalar::f32(self.weight_decay),
            Scalar::f32(self.neg_lr),
        ]
    }

    /// The `f32` arguments of `optim_norm_scale` after `n_blocks`: `max_unorm`, then the
    /// threshold epsilon: bitsandbytes' one-state kernel adds the optimizer's `eps`, which
    /// `LARS` passes as 0, so `+0.0`.
    pub fn scale_args(&self) -> Vec<Scalar> {
        vec![Scalar::f32(self.max_unorm), Scalar::f32(0.0)]
    }
}
