//! Update-norm (trust-ratio) optimizers with bitsandbytes' semantics: 32-bit LAMB and LARS,
//! i.e. bitsandbytes' `max_unorm` path of `optimizer_update_32bit` (CUDA
//! `kPreconditionOptimizer32bit{2,1}State` + `kOptimizer32bit{2,1}State`). The formulas, their
//! sources and the summation order are in `docs/optimizers.md`, section "LAMB and LARS"; every
//! operation below is one `f32` operation rounded to nearest even unless it says `fma`.
//!
//! A step is three kernels, each with one defined order:
//! 1. `lamb_norm_{dtype}` / `lars_norm_f32` ([`OptimNormSpec::Partials`]): one work item per
//!    block of [`OPTIM_BLOCKSIZE`] elements writes the block's sum of squared updates
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

mod catalog;
pub(crate) mod host;
mod hyper;
#[cfg(test)]
mod tests;

use crate::adam::{declare_grad_opts, moment_update, read_grad_opts, skipped, OPTIM_BLOCKSIZE};
use crate::check_float_dtype;
use crate::emit::{block_range, range_len};
use qforge_ir::KernelBuilder;
use qforge_ir::OwnedArg;
use qforge_ir::{Access, Dim, Kernel, ParamId, Value};
use qforge_ir::{CmpOp, ReduceOrder};
use qforge_ir::{DType, Scalar, ScalarType};
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
            OptimNormSpec::Scale => Ok(build_scale()),
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
                Ok(match (rule, partials) {
                    (NormRule::Lamb, true) => build_lamb_partials(name, dtype, gs),
                    (NormRule::Lamb, false) => build_lamb_update(name, dtype, gs),
                    (NormRule::Lars, true) => build_lars_partials(name, gs),
                    (NormRule::Lars, false) => build_lars_update(name, gs),
                })
            }
        }
    }
}

/// `|g| < inf`: false for NaN and ±inf.
pub(crate) fn is_finite(b: &mut KernelBuilder, g: Value) -> Value {
    let ag = b.abs(g);
    let inf = b.const_f32(f32::INFINITY);
    b.cmp(CmpOp::Lt, ag, inf)
}

/// `first ? g : fma(s_old, momentum, g)` (SGD's momentum).
fn momentum(b: &mut KernelBuilder, first: Value, mom: Value, g: Value, s_old: Value) -> Value {
    let m = b.fma(s_old, mom, g);
    let zero = b.const_u32(0);
    let is_first = b.cmp(CmpOp::Ne, first, zero);
    b.select(is_first, g, m)
}

/// Declares `n`, `n_blocks`, the `u32` scalars `ints` and the `f32` scalars `floats`.
pub(crate) fn declare(
    b: &mut KernelBuilder,
    ints: &[&str],
    floats: &[&str],
) -> (ParamId, ParamId, Vec<ParamId>) {
    let n = b.scalar_param("n", ScalarType::U32);
    let n_blocks = b.scalar_param("n_blocks", ScalarType::U32);
    let mut ps: Vec<ParamId> = ints
        .iter()
        .map(|s| b.scalar_param(s, ScalarType::U32))
        .collect();
    ps.extend(floats.iter().map(|s| b.scalar_param(s, ScalarType::F32)));
    (n, n_blocks, ps)
}

/// Declares the `_gs` scalar `gnorm_scale` of a partials kernel (after the other scalars) when
/// `gs`; bitsandbytes' precondition kernels take no `skip_zeros`.
pub(crate) fn declare_gs(b: &mut KernelBuilder, gs: bool) -> Option<ParamId> {
    gs.then(|| declare_grad_opts(b, false).0)
}

/// `g * gnorm_scale` (one rounding) for a `_gs` kernel, else `g`.
pub(crate) fn scaled_grad(b: &mut KernelBuilder, gnorm_scale: Option<Value>, g: Value) -> Value {
    match gnorm_scale {
        Some(s) => b.mul(g, s),
        None => g,
    }
}

/// The two per-block outputs of a partials kernel.
pub(crate) fn partial_outputs(b: &mut KernelBuilder, n_blocks: ParamId) -> [ParamId; 2] {
    let blocks = [Dim::Param(n_blocks)];
    [
        b.buffer_param("unorm_part", DType::F32, &blocks, Access::Write),
        b.buffer_param("pnorm_part", DType::F32, &blocks, Access::Write),
    ]
}

/// The block loop of a partials kernel: `update(b, e, p)` gives element `e`'s update value
/// (already `+0.0` for a non-finite gradient); stores both sums of squares.
pub(crate) fn emit_partials(
    b: &mut KernelBuilder,
    n: ParamId,
    p: ParamId,
    outs: [ParamId; 2],
    update: impl FnOnce(&mut KernelBuilder, Value) -> Value,
) {
    let block = b.work_item();
    let nv = b.param(n);
    let (start, end) = block_range(b, block, OPTIM_BLOCKSIZE, nv);
    let len = range_len(b, start, end);
    let uacc = b.var("unorm_acc", ScalarType::F32);
    let pacc = b.var("pnorm_acc", ScalarType::F32);
    b.accumulate(len, NORM_ORDER, &[uacc, pacc], |b, i| {
        let e = b.add(start, i);
        let u = update(b, e);
        let pv = b.load(p, e);
        vec![(u, u), (pv, pv)]
    });
    let su = b.read_var(uacc);
    let sp = b.read_var(pacc);
    b.store(outs[0], block, su);
    b.store(outs[1], block, sp);
}

/// The `f32` scalar names of `lamb_norm_*` (and `lamb8_norm_*`), in parameter order.
pub(crate) const LAMB_NORM_SCALARS: [&str; 7] = [
    "beta1",
    "one_minus_beta1",
    "beta2",
    "one_minus_beta2",
    "inv_c1",
    "inv_c2",
    "eps",
];

fn build_lamb_partials(name: &str, dtype: DType, gs: bool) -> Kernel {
    let mut b = KernelBuilder::new(name);
    let (n, n_blocks, ps) = declare(&mut b, &[], &LAMB_NORM_SCALARS);
    let gsp = declare_gs(&mut b, gs);
    let shape = [Dim::Param(n)];
    let p = b.buffer_param("p", dtype, &shape, Access::Read);
    let g = b.buffer_param("g", dtype, &shape, Access::Read);
    let s1 = b.buffer_param("state1", DType::F32, &shape, Access::Read);
    let s2 = b.buffer_param("state2", DType::F32, &shape, Access::Read);
    let outs = partial_outputs(&mut b, n_blocks);
    b.set_grid(Dim::Param(n_blocks));
    let s: Vec<Value> = ps.iter().map(|q| b.param(*q)).collect();
    let gsv = gsp.map(|q| b.param(q));
    emit_partials(&mut b, n, p, outs, |b, e| {
        let graw = b.load(g, e);
        let gv = scaled_grad(b, gsv, graw);
        let m_old = b.load(s1, e);
        let v_old = b.load(s2, e);
        lamb_norm_update(b, &s, gv, m_old, v_old)
    });
    b.finish()
}

/// LAMB's update value of one element for the norm, from the values of [`LAMB_NORM_SCALARS`]
/// (in that order), the widened gradient and the old moments:
/// `(m * inv_c1) / (sqrt(v * inv_c2) + eps)` with this step's moments, `+0.0` for a
/// non-finite gradient (also 8-bit LAMB's, [`crate::optim_norm8`]).
pub(crate) fn lamb_norm_update(
    b: &mut KernelBuilder,
    s: &[Value],
    gv: Value,
    m_old: Value,
    v_old: Value,
) -> Value {
    let [m, v] = moment_update(b, [s[0], s[1], s[2], s[3]], gv, m_old, v_old);
    let mh = b.mul(m, s[4]);
    let vh = b.mul(v, s[5]);
    let sv = b.sqrt(vh);
    let den = b.add(sv, s[6]);
    let u = b.div(mh, den);
    let finite = is_finite(b, gv);
    let zero = b.const_f32(0.0);
    b.select(finite, u, zero)
}

/// LARS's update value of one element for the norm: `first ? g : fma(s_old, momentum, g)`,
/// `+0.0` for a non-finite gradient (also 8-bit LARS's, [`crate::optim_norm8`]).
pub(crate) fn lars_norm_update(
    b: &mut KernelBuilder,
    first: Value,
    mom: Value,
    gv: Value,
    s_old: Value,
) -> Value {
    let u = momentum(b, first, mom, gv, s_old);
    let finite = is_finite(b, gv);
    let zero = b.const_f32(0.0);
    b.select(finite, u, zero)
}

fn build_lars_partials(name: &str, gs: bool) -> Kernel {
    let mut b = KernelBuilder::new(name);
    let (n, n_blocks, ps) = declare(&mut b, &["first"], &["momentum"]);
    let gsp = declare_gs(&mut b, gs);
    let shape = [Dim::Param(n)];
    let p = b.buffer_param("p", DType::F32, &shape, Access::Read);
    let g = b.buffer_param("g", DType::F32, &shape, Access::Read);
    let s1 = b.buffer_param("state1", DType::F32, &shape, Access::Read);
    let outs = partial_outputs(&mut b, n_blocks);
    b.set_grid(Dim::Param(n_blocks));
    let first = b.param(ps[0]);
    let mom = b.param(ps[1]);
    let gsv = gsp.map(|q| b.param(q));
    emit_partials(&mut b, n, p, outs, |b, e| {
        let graw = b.load(g, e);
        let gv = scaled_grad(b, gsv, graw);
        let s_old = b.load(s1, e);
        lars_norm_update(b, first, mom, gv, s_old)
    });
    b.finish()
}

fn build_scale() -> Kernel {
    let mut b = KernelBuilder::new("optim_norm_scale");
    let n_blocks = b.scalar_param("n_blocks", ScalarType::U32);
    let max_unorm = b.scalar_param("max_unorm", ScalarType::F32);
    let eps = b.scalar_param("eps", ScalarType::F32);
    let blocks = [Dim::Param(n_blocks)];
    let up = b.buffer_param("unorm_part", DType::F32, &blocks, Access::Read);
    let pp = b.buffer_param("pnorm_part", DType::F32, &blocks, Access::Read);
    let scale = b.buffer_param("scale", DType::F32, &[Dim::Const(1)], Access::Write);
    b.set_grid(Dim::Const(1));
    let zero = b.const_u32(0);
    let nb = b.param(n_blocks);
    let su = b.reduce_sum(up, zero, nb, ReduceOrder::Sequential);
    let sp = b.reduce_sum(pp, zero, nb, ReduceOrder::Sequential);
    let unorm = b.sqrt(su);
    let pnorm = b.sqrt(sp);
    let mu = b.param(max_unorm);
    let ev = b.param(eps);
    let t = b.mul(mu, pnorm);
    let thr = b.add(t, ev);
    let fzero = b.const_f32(0.0);
    let on = b.cmp(CmpOp::Gt, mu, fzero);
    let above = b.cmp(CmpOp::Gt, unorm, thr);
    let clip = b.and(on, above);
    let ratio = b.div(thr, unorm);
    let one = b.const_f32(1.0);
    let s = b.select(clip, ratio, one);
    b.store(scale, zero, s);
    b.finish()
}

/// `scale[0]` of the `scale: f32[1]` input.
fn read_scale(b: &mut KernelBuilder, scale: ParamId) -> Value {
    let zero = b.const_u32(0);
    b.load(scale, zero)
}

fn build_lamb_update(name: &str, dtype: DType, gs: bool) -> Kernel {
    let mut b = KernelBuilder::new(name);
    let names = [
        "beta1",
        "one_minus_beta1",
        "beta2",
        "one_minus_beta2",
        "decay",
        "step_size",
        "eps_c2",
    ];
    let (n, n_blocks, ps) = declare(&mut b, &[], &names);
    let opts = gs.then(|| declare_grad_opts(&mut b, true));
    let shape = [Dim::Param(n)];
    let p = b.buffer_param("p", dtype, &shape, Access::ReadWrite);
    let g = b.buffer_param("g", dtype, &shape, Access::Read);
    let s1 = b.buffer_param("state1", DType::F32, &shape, Access::ReadWrite);
    let s2 = b.buffer_param("state2", DType::F32, &shape, Access::ReadWrite);
    let scale = b.buffer_param("scale", DType::F32, &[Dim::Const(1)], Access::Read);
    b.set_grid(Dim::Param(n_blocks));
    let s: Vec<Value> = ps.iter().map(|q| b.param(*q)).collect();
    let opts = opts.map(|o| read_grad_opts(&mut b, o));
    let sc = read_scale(&mut b, scale);
    let ss = b.mul(sc, s[5]);
    let block = b.work_item();
    let nv = b.param(n);
    let (start, end) = block_range(&mut b, block, OPTIM_BLOCKSIZE, nv);
    b.for_range(start, end, 1, |b, e| {
        let graw = b.load(g, e);
        let gv = scaled_grad(b, opts.map(|o| o.scale), graw);
        let m_old = b.load(s1, e);
        let v_old = b.load(s2, e);
        let [m, v] = moment_update(b, [s[0], s[1], s[2], s[3]], gv, m_old, v_old);
        let mut finite = is_finite(b, gv);
        let zero = b.const_f32(0.0);
        let mut m = b.select(finite, m, zero);
        let mut v = b.select(finite, v, zero);
        // `_gs` (as `adamw32_*_gs`): a skipped element (scaled gradient `±0`) keeps its
        // moments and its parameter.
        if let Some(skip) = opts.and_then(|o| o.skip) {
            let sk = skipped(b, skip, gv);
            m = b.select(sk, m_old, m);
            v = b.select(sk, v_old, v);
            let keep = b.not(sk);
            finite = b.and(finite, keep);
        }
        b.store(s1, e, m);
        b.store(s2, e, v);
        // Straight-line (as `adamw32`): a non-finite gradient keeps the old parameter.
        let pv = b.load(p, e);
        let pd = b.mul(pv, s[4]);
        let sv = b.sqrt(v);
        let den = b.add(sv, s[6]);
        let r = b.div(m, den);
        let stepped = b.fma(r, ss, pd);
        let out = b.select(finite, stepped, pv);
        b.store_auto(p, e, out);
    });
    b.finish()
}

fn build_lars_update(name: &str, gs: bool) -> Kernel {
    let mut b = KernelBuilder::new(name);
    let (n, n_blocks, ps) = declare(&mut b, &["first"], &["momentum", "weight_decay", "neg_lr"]);
    let opts = gs.then(|| declare_grad_opts(&mut b, true));
    let shape = [Dim::Param(n)];
    let p = b.buffer_param("p", DType::F32, &shape, Access::ReadWrite);
    let g = b.buffer_param("g", DType::F32, &shape, Access::Read);
    let s1 = b.buffer_param("state1", DType::F32, &shape, Access::ReadWrite);
    let scale = b.buffer_param("scale", DType::F32, &[Dim::Const(1)], Access::Read);
    b.set_grid(Dim::Param(n_blocks));
    let v: Vec<Value> = ps.iter().map(|q| b.param(*q)).collect();
    let (first, mom, wd, neg_lr) = (v[0], v[1], v[2], v[3]);
    let opts = opts.map(|o| read_grad_opts(&mut b, o));
    let sc = read_scale(&mut b, scale);
    let nls = b.mul(neg_lr, sc);
    let block = b.work_item();
    let nv = b.param(n);
    let (start, end) = block_range(&mut b, block, OPTIM_BLOCKSIZE, nv);
    b.for_range(start, end, 1, |b, e| {
        let graw = b.load(g, e);
        let gv = scaled_grad(b, opts.map(|o| o.scale), graw);
        let pv = b.load(p, e);
        let s_old = b.load(s1, e);
        let fzero = b.const_f32(0.0);
        let on = b.cmp(CmpOp::Lt, fzero, wd);
        let wg = b.fma(pv, wd, gv);
        let gw = b.select(on, wg, gv);
        let st = momentum(b, first, mom, gw, s_old);
        let mut finite = is_finite(b, gv);
        let mut st = b.select(finite, st, fzero);
        // `_gs` (as `sgd32_f32_gs`): skipped when the scaled gradient after coupled weight
        // decay is `±0`; momentum and parameter stay.
        if let Some(skip) = opts.and_then(|o| o.skip) {
            let sk = skipped(b, skip, gw);
            st = b.select(sk, s_old, st);
            let keep = b.not(sk);
            finite = b.and(finite, keep);
        }
        b.store(s1, e, st);
        // Straight-line (as `sgd32`): a non-finite gradient keeps the old parameter.
        let stepped = b.fma(nls, st, pv);
        let out = b.select(finite, stepped, pv);
        b.store(p, e, out);
    });
    b.finish()
}

/// The step of the catalog's example arguments (not 1, so the momentum path runs).
pub(crate) const EXAMPLE_STEP: u32 = 3;

/// The scale the catalog's update kernels read.
pub(crate) const EXAMPLE_SCALE: f32 = 0.375;

/// [`crate::KernelSpec::example_args`] of an update-norm kernel on `values`
/// (`n >= 1`): parameter `values`, gradient `values` rotated by one with NaN at the last element
/// (n >= 2) and `+inf` at the middle one (n >= 3), `state1 = values * 0.5`,
/// `state2 = |values|`; weight decay 0.01 at step 3; the update kernels read `scale = 0.375`.
/// The scale kernel takes `n` partials: `unorm_part = values * values`, `pnorm_part = |values|`
/// rotated by one (so NaN, inf and zero partials reach it).
pub(crate) fn example_args(
    spec: &OptimNormSpec,
    values: &[f32],
    float_bytes: impl Fn(DType, &[f32]) -> Vec<u8>,
) -> Result<Vec<OwnedArg>> {
    let n = values.len();
    let n_blocks = n.div_ceil(OPTIM_BLOCKSIZE as usize);
    let u32_arg = |v: usize| OwnedArg::Scalar(Scalar::U32(v as u32));
    let (rule, dtype, partials) = match *spec {
        OptimNormSpec::Scale => {
            let up: Vec<f32> = values.iter().map(|v| v * v).collect();
            let pp: Vec<f32> = (0..n).map(|i| values[(i + 1) % n].abs()).collect();
            return Ok(vec![
                u32_arg(n),
                OwnedArg::Scalar(Scalar::f32(1.0)),
                OwnedArg::Scalar(Scalar::f32(0.0)),
                OwnedArg::Read(float_bytes(DType::F32, &up)),
                OwnedArg::Read(float_bytes(DType::F32, &pp)),
                OwnedArg::Write(vec![0; 4]),
            ]);
        }
        OptimNormSpec::Partials { rule, dtype } => (rule, dtype, true),
        OptimNormSpec::Update { rule, dtype } => (rule, dtype, false),
    };
    let grad = crate::adam::example_grad(values);
    let mut args = vec![u32_arg(n), u32_arg(n_blocks)];
    let scalars = match rule {
        NormRule::Lamb => {
            let s = LambHyper {
                weight_decay: 0.01,
                ..LambHyper::default()
            }
            .scalars(EXAMPLE_STEP)?;
            if partials {
                s.partials_args()
            } else {
                s.update_args()
            }
        }
        NormRule::Lars => {
            let s = LarsHyper {
                weight_decay: 0.01,
                ..LarsHyper::default()
            }
            .scalars(EXAMPLE_STEP)?;
            if partials {
                s.partials_args()
            } else {
                s.update_args()
            }
        }
    };
    args.extend(scalars.into_iter().map(OwnedArg::Scalar));
    let p = float_bytes(dtype, values);
    args.push(if partials {
        OwnedArg::Read(p)
    } else {
        OwnedArg::Write(p)
    });
    args.push(OwnedArg::Read(float_bytes(dtype, &grad)));
    let m: Vec<f32> = values.iter().map(|v| v * 0.5).collect();
    let v: Vec<f32> = values.iter().map(|v| v.abs()).collect();
    let mut states = vec![m];
    if rule == NormRule::Lamb {
        states.push(v);
    }
    for s in states {
        let bytes = float_bytes(DType::F32, &s);
        args.push(if partials {
            OwnedArg::Read(bytes)
        } else {
            OwnedArg::Write(bytes)
        });
    }
    if partials {
        args.push(OwnedArg::Write(vec![0; 4 * n_blocks]));
        args.push(OwnedArg::Write(vec![0; 4 * n_blocks]));
    } else {
        args.push(OwnedArg::Read(float_bytes(DType::F32, &[EXAMPLE_SCALE])));
    }
    Ok(args)
}
