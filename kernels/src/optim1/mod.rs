//! One-state optimizer update kernels with bitsandbytes' CUDA semantics: Lion, SGD with
//! momentum, RMSprop and Adagrad, with 32-bit or 8-bit blockwise state (`lion32_f32`,
//! `lion8bit_f32`, `sgd32_f32`, `sgd8bit_f32`, `rmsprop32_f32`, ..., parameter dtype `f32`).
//! The formulas and their sources are in `docs/optimizers.md`; every operation below is one
//! `f32` operation rounded to nearest even unless it says `fma`.
//!
//! Layout as in [`crate::adam`]: blocks of [`OPTIM_BLOCKSIZE`] elements, one work
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

mod catalog;
pub(crate) mod host;
#[cfg(test)]
mod tests;

use crate::adam::{check_f32_scalars, step_exponent};
use crate::adam::{declare_grad_opts, read_grad_opts, skipped};
use crate::adam::{state_tables, StateBits, OPTIM_BLOCKSIZE};
use crate::emit::{block_range, inv_absmax};
use crate::nearest;
use crate::BlockwiseMap;
use qforge_ir::CmpOp;
use qforge_ir::KernelBuilder;
use qforge_ir::{Access, Dim, Kernel, Value};
use qforge_ir::{DType, Scalar, ScalarType};
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

/// The `f32` scalar names after `n`, `n_blocks` and `first`, in parameter order.
const SCALAR_NAMES: [&str; 9] = [
    "beta1",
    "one_minus_beta1",
    "beta2",
    "one_minus_beta2",
    "weight_decay",
    "decay",
    "eps",
    "lr",
    "neg_lr",
];

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

    /// Builds the kernel (see the module docs).
    ///
    /// # Errors
    /// [`Error::Unsupported`] for a parameter dtype other than `f32` (bitsandbytes' CUDA
    /// kernels round some intermediates to a 16-bit parameter dtype; that is not modelled).
    pub fn build(&self) -> Result<Kernel> {
        if self.dtype != DType::F32 {
            return Err(Error::Unsupported(format!(
                "{}: one-state optimizer kernels support f32 parameters only, got {}",
                self.name(),
                self.dtype
            )));
        }
        build(self, &self.name(), false, false)
    }

    /// Builds the `_gs` variant named `name` ([`crate::optim_ext`]): the same kernel
    /// with the scalars `gnorm_scale: f32, skip_zeros: u32` after the others.
    ///
    /// # Errors
    /// As [`Optim1Spec::build`].
    pub(crate) fn build_ext(&self, name: &str) -> Result<Kernel> {
        self.build()?;
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
        self.build()?;
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
}

/// The scalar values inside the kernel.
struct Hyper {
    first: Value,
    beta1: Value,
    one_minus_beta1: Value,
    beta2: Value,
    one_minus_beta2: Value,
    weight_decay: Value,
    decay: Value,
    eps: Value,
    lr: Value,
    neg_lr: Value,
}

/// The new state of one element from `(g, p, s_old)`: `(finite, gw, s)`, `s = +0.0` for a
/// non-finite `g`. Lion's `gw` is `g`.
fn new_state(
    b: &mut KernelBuilder,
    algo: Optim1Algo,
    bits8: bool,
    h: &Hyper,
    g: Value,
    p: Value,
    s_old: Value,
) -> [Value; 3] {
    let gw = match algo {
        Optim1Algo::Lion => g,
        Optim1Algo::Sgd | Optim1Algo::Rmsprop | Optim1Algo::Adagrad => {
            let zero = b.const_f32(0.0);
            let on = b.cmp(CmpOp::Lt, zero, h.weight_decay);
            let wg = b.fma(p, h.weight_decay, g);
            b.select(on, wg, g)
        }
    };
    let s = match algo {
        Optim1Algo::Lion => {
            let t = b.mul(h.one_minus_beta2, g);
            b.fma(s_old, h.beta2, t)
        }
        Optim1Algo::Sgd => {
            let m = b.fma(s_old, h.beta1, gw);
            let zero = b.const_u32(0);
            let first = b.cmp(CmpOp::Ne, h.first, zero);
            b.select(first, gw, m)
        }
        Optim1Algo::Rmsprop => {
            // CUDA: 8-bit `(1-b)*(g*g)`, 32-bit `(1-b)*g*g` (left to right).
            let t = if bits8 {
                let gg = b.mul(gw, gw);
                b.mul(h.one_minus_beta1, gg)
            } else {
                let t = b.mul(h.one_minus_beta1, gw);
                b.mul(t, gw)
            };
            b.fma(s_old, h.beta1, t)
        }
        Optim1Algo::Adagrad => b.fma(gw, gw, s_old),
    };
    let ag = b.abs(g);
    let inf = b.const_f32(f32::INFINITY);
    let finite = b.cmp(CmpOp::Lt, ag, inf);
    let zero = b.const_f32(0.0);
    let s = b.select(finite, s, zero);
    [finite, gw, s]
}

/// The new parameter of one element with a finite gradient. `x` is the numerator of RMSprop
/// and Adagrad (`gw` for 32-bit, the raw `g` for 8-bit, as bitsandbytes' CUDA kernels do).
#[allow(clippy::too_many_arguments)]
fn new_param(
    b: &mut KernelBuilder,
    algo: Optim1Algo,
    h: &Hyper,
    g: Value,
    p: Value,
    s_old: Value,
    s: Value,
    x: Value,
) -> Value {
    match algo {
        Optim1Algo::Lion => {
            let pd = b.mul(p, h.decay);
            let t = b.mul(h.one_minus_beta1, g);
            let u = b.fma(s_old, h.beta1, t);
            let zero = b.const_f32(0.0);
            let pos = b.cmp(CmpOp::Lt, zero, u);
            let neg = b.cmp(CmpOp::Lt, u, zero);
            let minus = b.select(neg, h.neg_lr, zero);
            let step = b.select(pos, h.lr, minus);
            b.sub(pd, step)
        }
        Optim1Algo::Sgd => b.fma(h.neg_lr, s, p),
        Optim1Algo::Rmsprop | Optim1Algo::Adagrad => {
            let sq = b.sqrt(s);
            let den = b.add(sq, h.eps);
            let r = b.div(x, den);
            b.fma(h.neg_lr, r, p)
        }
    }
}

/// The kernel named `name`; `grad_opts`: the `_gs` scalars; `scaled`: the trust-ratio buffer
/// `scale: f32[1]` last ([`Optim1Spec::build_scaled`]).
fn build(spec: &Optim1Spec, name: &str, grad_opts: bool, scaled: bool) -> Result<Kernel> {
    let mut b = KernelBuilder::new(name);
    let n = b.scalar_param("n", ScalarType::U32);
    let n_blocks = b.scalar_param("n_blocks", ScalarType::U32);
    let first = b.scalar_param("first", ScalarType::U32);
    let ps: Vec<_> = SCALAR_NAMES
        .iter()
        .map(|s| b.scalar_param(s, ScalarType::F32))
        .collect();
    let opts = grad_opts.then(|| declare_grad_opts(&mut b, true));
    let shape = [Dim::Param(n)];
    let p = b.buffer_param("p", spec.dtype, &shape, Access::ReadWrite);
    let g = b.buffer_param("g", spec.dtype, &shape, Access::Read);
    let (s1, a1) = match spec.state {
        StateBits::Bits32 => (
            b.buffer_param("state1", DType::F32, &shape, Access::ReadWrite),
            None,
        ),
        StateBits::Bits8 => (
            b.buffer_param("state1", DType::U8, &shape, Access::ReadWrite),
            Some(b.buffer_param(
                "absmax1",
                DType::F32,
                &[Dim::Param(n_blocks)],
                Access::ReadWrite,
            )),
        ),
    };
    let scale = scaled.then(|| b.buffer_param("scale", DType::F32, &[Dim::Const(1)], Access::Read));
    b.set_grid(Dim::Param(n_blocks));
    let v: Vec<Value> = ps.iter().map(|p| b.param(*p)).collect();
    // LARS: `nls = neg_lr * scale[0]`, where `lars32` multiplies it.
    let neg_lr = match scale {
        Some(scale) => {
            let zero = b.const_u32(0);
            let sc = b.load(scale, zero);
            b.mul(v[8], sc)
        }
        None => v[8],
    };
    let h = Hyper {
        first: b.param(first),
        beta1: v[0],
        one_minus_beta1: v[1],
        beta2: v[2],
        one_minus_beta2: v[3],
        weight_decay: v[4],
        decay: v[5],
        eps: v[6],
        lr: v[7],
        neg_lr,
    };
    let opts = opts.map(|o| read_grad_opts(&mut b, o));
    // `_gs`: `g * gnorm_scale` (the raw `g` without the variant).
    let scaled = |b: &mut KernelBuilder, g: Value| match opts {
        Some(o) => b.mul(g, o.scale),
        None => g,
    };
    let skip = opts.and_then(|o| o.skip);
    let algo = spec.algo;
    let block = b.work_item();
    let nv = b.param(n);
    let (start, end) = block_range(&mut b, block, OPTIM_BLOCKSIZE, nv);
    let Some(a1) = a1 else {
        b.for_range(start, end, 1, |b, e| {
            let graw = b.load(g, e);
            let gv = scaled(b, graw);
            let pv = b.load(p, e);
            let s_old = b.load(s1, e);
            let [mut finite, gw, mut s] = new_state(b, algo, false, &h, gv, pv, s_old);
            // `_gs` (bitsandbytes' 32-bit kernel): skipped when the gradient after scaling
            // and coupled weight decay is zero; state and parameter stay.
            if let Some(skip) = skip {
                let sk = skipped(b, skip, gw);
                s = b.select(sk, s_old, s);
                let keep = b.not(sk);
                finite = b.and(finite, keep);
            }
            b.store(s1, e, s);
            // Straight-line: a non-finite gradient keeps the old parameter.
            let stepped = new_param(b, algo, &h, gv, pv, s_old, s, gw);
            let out = b.select(finite, stepped, pv);
            b.store(p, e, out);
        });
        return Ok(b.finish());
    };
    let t1 = state_tables(&mut b, BlockwiseMap::Dynamic, "1")?;
    let old_a1 = b.load(a1, block);
    // `(g, p, s_old, finite, s)` of element `e`, from the unchanged codes and parameter.
    // `(graw, gs, pv, s_old, apply, s)`: `gs` is the scaled gradient; `apply` is false for a
    // non-finite or (`_gs`) skipped element.
    let update = |b: &mut KernelBuilder, e: Value| -> [Value; 6] {
        let graw = b.load(g, e);
        let gv = scaled(b, graw);
        let pv = b.load(p, e);
        let q = b.load(s1, e);
        let c = b.lookup(t1.code, q);
        let s_old = b.mul(c, old_a1);
        let [mut finite, _, mut s] = new_state(b, algo, true, &h, gv, pv, s_old);
        // `_gs` (bitsandbytes' 8-bit kernel): skipped when the raw gradient is zero; the
        // state keeps its dequantized value, which then takes part in the block's new absmax
        // and is requantized with it like every other element.
        if let Some(skip) = skip {
            let sk = skipped(b, skip, graw);
            s = b.select(sk, s_old, s);
            let keep = b.not(sk);
            finite = b.and(finite, keep);
        }
        [graw, gv, pv, s_old, finite, s]
    };
    let acc = b.var("absmax1_acc", ScalarType::F32);
    // Pass 1: the new absmax (NaN-ignoring max |s|).
    b.for_range(start, end, 1, |b, e| {
        let [_, _, _, _, _, s] = update(b, e);
        let a = b.abs(s);
        let cur = b.read_var(acc);
        let mx = b.max(cur, a);
        b.assign(acc, mx);
    });
    let new_a1 = b.read_var(acc);
    b.store(a1, block, new_a1);
    let inv = inv_absmax(&mut b, new_a1);
    // Pass 2 (straight-line): the same state again, the parameter (unchanged where the
    // gradient is not finite), and the requantized state.
    b.for_range(start, end, 1, |b, e| {
        let [graw, gv, pv, s_old, finite, s] = update(b, e);
        // RMSprop / Adagrad's numerator is the raw, unscaled gradient (bitsandbytes' 8-bit
        // kernel reloads `g_vals[j]`); Lion's sign uses the scaled one.
        let stepped = new_param(b, algo, &h, gv, pv, s_old, s, graw);
        let out = b.select(finite, stepped, pv);
        b.store(p, e, out);
        let sc = b.mul(s, inv);
        let q = nearest::emit_code(b, sc, &t1.nearest);
        b.store(s1, e, q);
    });
    Ok(b.finish())
}

/// The step of the catalog's example arguments (not 1, so SGD's momentum path runs).
const EXAMPLE_STEP: u32 = 3;

/// [`crate::KernelSpec::example_args`] of a one-state optimizer kernel on `values`
/// (`n >= 1`): parameter `values`; gradient `values` rotated by one with NaN at the last element
/// (n >= 2) and `+inf` at the middle one (n >= 3); 32-bit state `|values[i]| * 0.5` (Lion and
/// SGD: `values[i] * 0.5`); 8-bit codes mixed from the values, absmax the NaN-ignoring
/// `max |x|` of each block; hyperparameters with weight decay 0.01 (coupled and decoupled paths
/// both run).
pub(crate) fn example_args(
    spec: &Optim1Spec,
    values: &[f32],
    mix: impl Fn(usize, f32) -> u32,
    float_bytes: impl Fn(DType, &[f32]) -> Vec<u8>,
) -> Result<Vec<qforge_ir::OwnedArg>> {
    use qforge_ir::OwnedArg;
    let n = values.len();
    let bs = OPTIM_BLOCKSIZE as usize;
    let grad = crate::adam::example_grad(values);
    let hyper = Optim1Hyper {
        weight_decay: 0.01,
        ..Optim1Hyper::defaults(spec.algo)
    };
    let scalars = hyper.scalars(spec.algo, EXAMPLE_STEP)?;
    let mut args = vec![
        OwnedArg::Scalar(Scalar::U32(n as u32)),
        OwnedArg::Scalar(Scalar::U32(n.div_ceil(bs) as u32)),
    ];
    args.extend(scalars.kernel_args().into_iter().map(OwnedArg::Scalar));
    args.push(OwnedArg::Write(float_bytes(spec.dtype, values)));
    args.push(OwnedArg::Read(float_bytes(spec.dtype, &grad)));
    match spec.state {
        StateBits::Bits32 => {
            let signed = matches!(spec.algo, Optim1Algo::Lion | Optim1Algo::Sgd);
            let s: Vec<f32> = values
                .iter()
                .map(|v| if signed { v * 0.5 } else { v.abs() * 0.5 })
                .collect();
            args.push(OwnedArg::Write(float_bytes(DType::F32, &s)));
        }
        StateBits::Bits8 => {
            let absmax = crate::adam::example_absmax(values);
            let codes: Vec<u8> = values
                .iter()
                .enumerate()
                .map(|(i, v)| mix(i, *v) as u8)
                .collect();
            args.push(OwnedArg::Write(codes));
            args.push(OwnedArg::Write(float_bytes(DType::F32, &absmax)));
        }
    }
    Ok(args)
}
