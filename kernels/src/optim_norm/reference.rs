//! The builder versions of the 32-bit LAMB / LARS kernels, as they were before the kernels
//! moved to the kernel language ([`crate::optim_norm::kernel`]); tests prove the two equal. The
//! helpers are shared with the builder versions of the 8-bit partials
//! ([`crate::optim_norm8`]) and the `max_unorm` partials ([`crate::optim_norm1`]).

use crate::adam::{declare_grad_opts, moment_update, read_grad_opts, skipped, OPTIM_BLOCKSIZE};
use crate::emit::{block_range, range_len};
use crate::optim_norm::{NormRule, OptimNormSpec, NORM_ORDER};
use qforge_ir::KernelBuilder;
use qforge_ir::{Access, Dim, Kernel, ParamId, Value};
use qforge_ir::{CmpOp, ReduceOrder};
use qforge_ir::{DType, ScalarType};

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

pub(crate) fn build_scale() -> Kernel {
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

/// The builder version of `spec`'s kernel named `name` (`gs`: the `_gs` variant).
pub(crate) fn build_builder(spec: &OptimNormSpec, name: &str, gs: bool) -> Kernel {
    match *spec {
        OptimNormSpec::Scale => build_scale(),
        OptimNormSpec::Partials { rule, dtype } => match rule {
            NormRule::Lamb => build_lamb_partials(name, dtype, gs),
            NormRule::Lars => build_lars_partials(name, gs),
        },
        OptimNormSpec::Update { rule, dtype } => match rule {
            NormRule::Lamb => build_lamb_update(name, dtype, gs),
            NormRule::Lars => build_lars_update(name, gs),
        },
    }
}

/// The macro-built kernels are the builder-built ones (same IR, so the same snapshots) for
/// both rules, every dtype they take, plain and `_gs`, and the scale kernel.
#[test]
fn the_macro_kernels_equal_the_builder_versions() {
    let mut specs = vec![OptimNormSpec::Scale];
    for rule in NormRule::ALL {
        for &dtype in rule.param_dtypes() {
            specs.push(OptimNormSpec::Partials { rule, dtype });
            specs.push(OptimNormSpec::Update { rule, dtype });
        }
    }
    for spec in specs {
        let k = spec.build().unwrap();
        let old = build_builder(&spec, &spec.name(), false);
        assert!(k == old, "{} differs", spec.name());
        if spec != OptimNormSpec::Scale {
            let k = spec.build_gs("k_gs").unwrap();
            let old = build_builder(&spec, "k_gs", true);
            assert!(k == old, "{} _gs differs", spec.name());
        }
    }
}
