//! One-state optimizer update kernels with bitsandbytes' CUDA semantics: Lion, SGD with
//! momentum, RMSprop and Adagrad, with 32-bit or 8-bit blockwise state (`lion32_f32`,
//! `lion8bit_f32`, `sgd32_f32`, `sgd8bit_f32`, `rmsprop32_f32`, ..., parameter dtype `f32`).
//! The formulas and their sources are in `docs/optimizers.md`; every operation below is one
//! `f32` operation rounded to nearest even unless it says `fma`.
//!
//! Layout as in [`crate::adam`]: blocks of [`OPTIM_BLOCKSIZE`](crate::OPTIM_BLOCKSIZE) elements, one work
//! item per block. All four rules take the same scalar list ([`Optim1Scalars::kernel_args`]),
//! derived on the host in `f64` and rounded once to `f32`; a rule ignores the ones it does not
//! use.
//!
//! Per element, with `gw = wd > 0 ? fma(p, wd, g) : g` (coupled weight decay, all rules but
//! Lion) and a finite gradient `g`:
//! * Lion: `p = p * decay`; `u = fma(s, beta1, one_minus_beta1 * g)`;
//!   `s = fma(s, beta2, one_minus_beta2 * g)`; `p = p - (u > 0 ? lr : u < 0 ? -lr : 0)`;
//! * SGD: `s = first ? gw : fma(s, beta1, gw)`; `p = fma(neg_lr, s, p)`;
//! * RMSprop: `s = fma(s, beta1, t)`, `t = one_minus_beta1 * (gw * gw)` (8-bit) or
//!   `t = (one_minus_beta1 * gw) * gw` (32-bit);
//!   `p = fma(neg_lr, x / (sqrt(s) + eps), p)` with `x = gw` (32-bit) or `x = g` (8-bit);
//! * Adagrad: `s = fma(gw, gw, s)`; `p` as RMSprop.
//!
//! A non-finite `g` sets `s = +0.0` and leaves the parameter unchanged.
//!
//! 8-bit state: codes of the signed dynamic map (bitsandbytes uses it for the single state of
//! every one-state rule) and one `f32` absmax per block. Pass 1 dequantizes, updates the state
//! and takes the NaN-ignoring `max |s|`; pass 2 recomputes the same state from the unchanged
//! codes and parameter, updates the parameter and requantizes (exact nearest code, as
//! [`crate::adam`]).
//!
//! The `_gs` variants ([`crate::optim_ext`]) add `gnorm_scale: f32, skip_zeros: u32`
//! after the `f32` scalars (gradient scaled first; zero gradients skipped, 32-bit: after coupled
//! weight decay, 8-bit: the raw gradient).
//!
//! Parameters: `(n: u32, n_blocks: u32, first: u32, beta1, one_minus_beta1, beta2,
//! one_minus_beta2, weight_decay, decay, eps, lr, neg_lr: f32, p: f32[n] readwrite,
//! g: f32[n] read, state1: f32[n] readwrite)` for 32-bit; 8-bit replaces `state1` with
//! `state1: u8[n] readwrite, absmax1: f32[n_blocks] readwrite`.
//!
//! The kernels are written in the kernel language ([`kernel`]: [`kernel::optim1_32bit`],
//! [`kernel::optim1_8bit`]); the host ops launch them through their typed arguments
//! ([`Optim1Update32Args`], [`Optim1Update8Args`]).

mod catalog;
pub(crate) use catalog::example_args_gs;
pub(crate) mod host;
pub mod kernel;
#[cfg(test)]
mod reference;
#[cfg(test)]
pub(crate) mod tests;

pub use crate::optim1::kernel::{Optim1Update32, Optim1Update32Args};
pub use crate::optim1::kernel::{Optim1Update8, Optim1Update8Args};

use crate::adam::StateBits;
use crate::adam::{check_f32_scalars, step_exponent};
use qforge_ir::dsl::TypedKernel;
use qforge_ir::Kernel;
use qforge_ir::{DType, Scalar};
use qforge_ir::{Error, Result};

/// A one-state update rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Optim1Algo {
    /// Lion (sign of an interpolated momentum; decoupled weight decay before the update).
    Lion,
    /// SGD with momentum (bitsandbytes' `momentum`; coupled weight decay).
    Sgd,
    /// RMSprop without momentum (coupled weight decay).
    Rmsprop,
    /// Adagrad (coupled weight decay).
    Adagrad,
}

impl Optim1Algo {
    /// `lion`, `sgd`, `rmsprop` or `adagrad`.
    pub const fn name(self) -> &'static str {
        match self {
            Optim1Algo::Lion => "lion",
            Optim1Algo::Sgd => "sgd",
            Optim1Algo::Rmsprop => "rmsprop",
            Optim1Algo::Adagrad => "adagrad",
        }
    }

    /// All four rules.
    pub const ALL: [Optim1Algo; 4] = [
        Optim1Algo::Lion,
        Optim1Algo::Sgd,
        Optim1Algo::Rmsprop,
        Optim1Algo::Adagrad,
    ];
}

/// One one-state optimizer kernel variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Optim1Spec {
    /// The update rule.
    pub algo: Optim1Algo,
    /// 32-bit or 8-bit blockwise state.
    pub state: StateBits,
    /// Dtype of the parameter and the gradient: only `f32` is supported.
    pub dtype: DType,
}

/// Hyperparameters (bitsandbytes' names), in `f64`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Optim1Hyper {
    /// Learning rate.
    pub lr: f64,
    /// Lion: `betas[0]`; SGD: `momentum`; RMSprop: `alpha`; unused by Adagrad.
    pub beta1: f64,
    /// Lion: `betas[1]`; unused by the others.
    pub beta2: f64,
    /// RMSprop and Adagrad denominator epsilon; unused by Lion and SGD.
    pub eps: f64,
    /// Weight decay: decoupled for Lion (`p *= 1 - lr * wd`), added to the gradient otherwise.
    pub weight_decay: f64,
}

impl Optim1Hyper {
    /// Defaults of `algo`, bitsandbytes' where it has them: Lion lr 1e-4, betas (0.9, 0.99);
    /// RMSprop lr 1e-2, alpha 0.99, eps 1e-8; Adagrad lr 1e-2, eps 1e-10; SGD lr 1e-3 and
    /// momentum 0.9 (bitsandbytes' SGD has no default lr and rejects momentum 0); weight
    /// decay 0.
    pub fn defaults(algo: Optim1Algo) -> Optim1Hyper {
        let (lr, beta1, beta2, eps) = match algo {
            Optim1Algo::Lion => (1e-4, 0.9, 0.99, 0.0),
            Optim1Algo::Sgd => (1e-3, 0.9, 0.0, 0.0),
            Optim1Algo::Rmsprop => (1e-2, 0.99, 0.0, 1e-8),
            Optim1Algo::Adagrad => (1e-2, 0.0, 0.0, 1e-10),
        };
        Optim1Hyper {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay: 0.0,
        }
    }
}

/// The `f32` kernel scalars of one step, derived on the host in `f64` and rounded once.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Optim1Scalars {
    /// `1` on step 1 (SGD takes the gradient as its momentum), else `0`.
    pub first: u32,
    /// `f32(beta1)`.
    pub beta1: f32,
    /// `f32(1 - beta1)`.
    pub one_minus_beta1: f32,
    /// `f32(beta2)`.
    pub beta2: f32,
    /// `f32(1 - beta2)`.
    pub one_minus_beta2: f32,
    /// `f32(weight_decay)`.
    pub weight_decay: f32,
    /// `f32(1 - lr * weight_decay)` (Lion).
    pub decay: f32,
    /// `f32(eps)`.
    pub eps: f32,
    /// `f32(lr)`.
    pub lr: f32,
    /// `f32(-lr)`.
    pub neg_lr: f32,
}

impl Optim1Hyper {
    /// Checks the values: all finite, `lr >= 0`, `weight_decay >= 0`; betas in `[0, 1)` for
    /// Lion, momentum in `[0, 1)` for SGD, alpha in `[0, 1)` and `eps > 0` for RMSprop,
    /// `eps > 0` for Adagrad.
    ///
    /// # Errors
    /// [`Error::Unsupported`] naming the first bad value.
    pub fn check(&self, algo: Optim1Algo) -> Result<()> {
        let bad = |what: &str, v: f64, need: &str| {
            Err(Error::Unsupported(format!(
                "{} hyperparameter {what} = {v} is invalid: it must be {need}",
                algo.name()
            )))
        };
        let Optim1Hyper {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
        } = *self;
        if !(lr.is_finite() && lr >= 0.0) {
            return bad("lr", lr, "finite and >= 0");
        }
        if !(weight_decay.is_finite() && weight_decay >= 0.0) {
            return bad("weight_decay", weight_decay, "finite and >= 0");
        }
        let (uses_beta1, uses_beta2, uses_eps) = match algo {
            Optim1Algo::Lion => (true, true, false),
            Optim1Algo::Sgd => (true, false, false),
            Optim1Algo::Rmsprop => (true, false, true),
            Optim1Algo::Adagrad => (false, false, true),
        };
        for (used, name, x) in [(uses_beta1, "beta1", beta1), (uses_beta2, "beta2", beta2)] {
            if used && !(0.0..1.0).contains(&x) {
                return bad(name, x, "in [0, 1)");
            }
        }
        if uses_eps && !(eps.is_finite() && eps > 0.0) {
            return bad("eps", eps, "finite and > 0");
        }
        for (name, x) in [("beta1", beta1), ("beta2", beta2), ("eps", eps)] {
            if !x.is_finite() {
                return bad(name, x, "finite");
            }
        }
        Ok(())
    }

    /// The kernel scalars of step `step` (1-based).
    ///
    /// # Errors
    /// [`Error::Unsupported`] for step 0 or invalid hyperparameters ([`Optim1Hyper::check`]).
    pub fn scalars(&self, algo: Optim1Algo, step: u32) -> Result<Optim1Scalars> {
        self.check(algo)?;
        step_exponent(step)?;
        let s = Optim1Scalars {
            first: u32::from(step == 1),
            beta1: self.beta1 as f32,
            one_minus_beta1: (1.0 - self.beta1) as f32,
            beta2: self.beta2 as f32,
            one_minus_beta2: (1.0 - self.beta2) as f32,
            weight_decay: self.weight_decay as f32,
            decay: (1.0 - self.lr * self.weight_decay) as f32,
            eps: self.eps as f32,
            lr: self.lr as f32,
            neg_lr: (-self.lr) as f32,
        };
        // RMSprop and Adagrad divide by `sqrt(s) + eps`.
        let positive: &[&str] = match algo {
            Optim1Algo::Rmsprop | Optim1Algo::Adagrad => &["eps"],
            Optim1Algo::Lion | Optim1Algo::Sgd => &[],
        };
        check_f32_scalars(
            &[
                ("weight_decay", s.weight_decay),
                ("decay", s.decay),
                ("eps", s.eps),
                ("lr", s.lr),
            ],
            positive,
        )?;
        Ok(s)
    }
}

impl Optim1Scalars {
    /// The scalar arguments after `n` and `n_blocks`: `first` (u32) then the nine `f32`s.
    pub fn kernel_args(&self) -> Vec<Scalar> {
        let mut out = vec![Scalar::U32(self.first)];
        out.extend(
            [
                self.beta1,
                self.one_minus_beta1,
                self.beta2,
                self.one_minus_beta2,
                self.weight_decay,
                self.decay,
                self.eps,
                self.lr,
                self.neg_lr,
            ]
            .into_iter()
            .map(Scalar::f32),
        );
        out
    }
}

impl Optim1Spec {
    /// The kernel name, e.g. `lion8bit_f32`, `sgd32_f32`.
    pub fn name(&self) -> String {
        format!("{}{}_{}", self.algo.name(), self.state.name(), self.dtype)
    }

    /// `Ok` for an `f32` parameter dtype.
    ///
    /// # Errors
    /// [`Error::Unsupported`] for a parameter dtype other than `f32` (bitsandbytes' CUDA
    /// kernels round some intermediates to a 16-bit parameter dtype; that is not modelled).
    fn check_dtype(&self) -> Result<()> {
        if self.dtype != DType::F32 {
            return Err(Error::Unsupported(format!(
                "{}: one-state optimizer kernels support f32 parameters only, got {}",
                self.name(),
                self.dtype
            )));
        }
        Ok(())
    }

    /// Builds the kernel (see the module docs).
    ///
    /// # Errors
    /// As [`Optim1Spec::check_dtype`].
    pub fn build(&self) -> Result<Kernel> {
        self.check_dtype()?;
        build(self, &self.name(), false, false)
    }

    /// Builds the `_gs` variant named `name` ([`crate::optim_ext`]): the same kernel
    /// with the scalars `gnorm_scale: f32, skip_zeros: u32` after the others.
    ///
    /// # Errors
    /// As [`Optim1Spec::build`].
    pub(crate) fn build_ext(&self, name: &str) -> Result<Kernel> {
        self.check_dtype()?;
        build(self, name, true, false)
    }

    /// Builds the SGD kernel named `name` whose step is multiplied by a trust-ratio scale: one
    /// more buffer `scale: f32[1] read` after the others, and `neg_lr` replaced by
    /// `neg_lr * scale[0]` (one rounding, once per work item), as `lars32_f32` does
    /// ([`crate::optim_norm8`]). With `scale = 1` it equals the plain kernel bit for
    /// bit. `gs`: also the `_gs` scalars `gnorm_scale`, `skip_zeros` ([`Optim1Spec::build_ext`]).
    ///
    /// # Errors
    /// As [`Optim1Spec::build`]; [`Error::Unsupported`] for a rule other than SGD (the others
    /// use the learning rate in more than one place).
    pub(crate) fn build_scaled(&self, name: &str, gs: bool) -> Result<Kernel> {
        self.check_dtype()?;
        match self.algo {
            Optim1Algo::Sgd => build(self, name, gs, true),
            Optim1Algo::Lion | Optim1Algo::Rmsprop | Optim1Algo::Adagrad => {
                Err(Error::Unsupported(format!(
                    "{name}: only SGD has a trust-ratio scaled kernel, not {}",
                    self.algo.name()
                )))
            }
        }
    }

    /// The typed 32-bit kernel named `name` ([`kernel::optim1_32bit`]); `gs`: the `_gs` variant.
    ///
    /// # Errors
    /// As [`Optim1Spec::build`]; [`Error::Unsupported`] for 8-bit state.
    pub fn typed32(&self, name: &str, gs: bool) -> Result<TypedKernel<Optim1Update32>> {
        self.check_dtype()?;
        match self.state {
            StateBits::Bits32 => kernel::optim1_32bit(self, name, gs, false),
            StateBits::Bits8 => Err(Error::Unsupported(format!(
                "{name}: {} has 8-bit state, not 32-bit",
                self.name()
            ))),
        }
    }

    /// The typed 8-bit kernel named `name` ([`kernel::optim1_8bit`]); `gs`: the `_gs` variant.
    ///
    /// # Errors
    /// As [`Optim1Spec::build`]; [`Error::Unsupported`] for 32-bit state.
    pub fn typed8(&self, name: &str, gs: bool) -> Result<TypedKernel<Optim1Update8>> {
        self.check_dtype()?;
        match self.state {
            StateBits::Bits8 => kernel::optim1_8bit(self, name, gs, false),
            StateBits::Bits32 => Err(Error::Unsupported(format!(
                "{name}: {} has 32-bit state, not 8-bit",
                self.name()
            ))),
        }
    }
}

/// The kernel named `name` ([`kernel`]); `grad_opts`: the `_gs` scalars; `scaled`: the
/// trust-ratio buffer `scale: f32[1]` last ([`Optim1Spec::build_scaled`]).
fn build(spec: &Optim1Spec, name: &str, grad_opts: bool, scaled: bool) -> Result<Kernel> {
    match spec.state {
        StateBits::Bits32 => {
            kernel::optim1_32bit(spec, name, grad_opts, scaled).map(TypedKernel::into_kernel)
        }
        StateBits::Bits8 => {
            kernel::optim1_8bit(spec, name, grad_opts, scaled).map(TypedKernel::into_kernel)
        }
    }
}
