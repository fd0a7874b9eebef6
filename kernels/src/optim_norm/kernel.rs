//! The 32-bit LAMB / LARS kernels in the kernel language: the norm partials ([`lamb_norm`],
//! [`lars_norm`]), the trust-ratio scale ([`optim_norm_scale`]) and the scaled updates
//! ([`lamb32`], [`lars32`]), each plain or `_gs`. Semantics and parameters are documented in
//! [`crate::optim_norm`]; the per-element helpers here are shared with the 8-bit partials
//! ([`crate::optim_norm8`]) and the `max_unorm` partials ([`crate::optim_norm1`]).

use qforge_macros::{func, kernel};

use crate::optim_funcs::{betas, optim_block, store_partials};
use crate::optim_funcs::{finite_or_zero, grad_options, is_finite, moment_update, moments};
use crate::optim_funcs::{momentum_of, norm_block, scaled_grad, skip_moments, skip_state};
use crate::optim_norm::NORM_ORDER;
use qforge_ir::dsl::{Float, In, InOut, Out, Val};
use qforge_ir::{DType, ReduceOrder, Rounding};

/// LAMB's update value of one element for the norm, from `[beta1, one_minus_beta1, beta2,
/// one_minus_beta2, inv_c1, inv_c2, eps]`, the widened gradient and the old moments:
/// `(m * inv_c1) / (sqrt(v * inv_c2) + eps)` with this step's moments, `+0.0` for a
/// non-finite gradient (also 8-bit LAMB's).
#[func]
pub(crate) fn lamb_norm_update(
    s: [Val<f32>; 7],
    gv: Val<f32>,
    m_old: Val<f32>,
    v_old: Val<f32>,
) -> Val<f32> {
    let [beta1, one_minus_beta1, beta2, one_minus_beta2, inv_c1, inv_c2, eps] = s;
    let h = betas(beta1, one_minus_beta1, beta2, one_minus_beta2);
    let (m, v) = moment_update(h, gv, m_old, v_old);
    let mh = m * inv_c1;
    let vh = v * inv_c2;
    let sv = sqrt(vh);
    let den = sv + eps;
    let u = mh / den;
    finite_or_zero(gv, u)
}

/// LARS's update value of one element for the norm: `first ? g : fma(s_old, momentum, g)`,
/// `+0.0` for a non-finite gradient (also 8-bit LARS's).
#[func]
pub(crate) fn lars_norm_update(
    first: Val<u32>,
    mom: Val<f32>,
    gv: Val<f32>,
    s_old: Val<f32>,
) -> Val<f32> {
    let u = momentum_of(first, mom, gv, s_old);
    finite_or_zero(gv, u)
}

/// `lamb_norm_{dtype}` (or its `_gs` variant `name`): the per-block sums of squared updates and
/// squared parameters.
#[kernel(name = name, grid = n_blocks, signature = LambNorm)]
#[allow(clippy::too_many_arguments)]
pub fn lamb_norm(
    #[config] dtype: DType,
    #[config] name: &str,
    #[config] gs: bool,
    n: u32,
    n_blocks: u32,
    beta1: f32,
    one_minus_beta1: f32,
    beta2: f32,
    one_minus_beta2: f32,
    inv_c1: f32,
    inv_c2: f32,
    eps: f32,
    #[when(gs)] gnorm_scale: f32,
    #[shape(n)]
    #[dtype(dtype)]
    p: In<Float>,
    #[shape(n)]
    #[dtype(dtype)]
    g: In<Float>,
    #[shape(n)] state1: In<f32>,
    #[shape(n)] state2: In<f32>,
    #[shape(n_blocks)] unorm_part: Out<f32>,
    #[shape(n_blocks)] pnorm_part: Out<f32>,
) {
    let s = [
        beta1,
        one_minus_beta1,
        beta2,
        one_minus_beta2,
        inv_c1,
        inv_c2,
        eps,
    ];
    let gsv = read_option(gnorm_scale);
    let (block, start, len) = norm_block(n);
    let unorm_acc = var::<f32>("unorm_acc");
    let pnorm_acc = var::<f32>("pnorm_acc");
    #[accumulate(NORM_ORDER)]
    for i in 0..len {
        let e = start + i;
        let graw = g[e];
        let gv = scaled_grad(graw, gsv);
        let m_old = state1[e];
        let v_old = state2[e];
        let u = lamb_norm_update(s, gv, m_old, v_old);
        let pv = p[e];
        unorm_acc = sum(u * u);
        pnorm_acc = sum(pv * pv);
    }
    store_partials(unorm_part, pnorm_part, block, unorm_acc, pnorm_acc);
}

/// `lars_norm_f32` (or its `_gs` variant `name`): the per-block sums of squared updates and
/// squared parameters.
#[kernel(name = name, grid = n_blocks, signature = LarsNorm)]
#[allow(clippy::too_many_arguments)]
pub fn lars_norm(
    #[config] name: &str,
    #[config] gs: bool,
    n: u32,
    n_blocks: u32,
    first: u32,
    momentum: f32,
    #[when(gs)] gnorm_scale: f32,
    #[shape(n)]
    #[dtype(DType::F32)]
    p: In<Float>,
    #[shape(n)]
    #[dtype(DType::F32)]
    g: In<Float>,
    #[shape(n)] state1: In<f32>,
    #[shape(n_blocks)] unorm_part: Out<f32>,
    #[shape(n_blocks)] pnorm_part: Out<f32>,
) {
    let fv = first;
    let mom = momentum;
    let gsv = read_option(gnorm_scale);
    let (block, start, len) = norm_block(n);
    let unorm_acc = var::<f32>("unorm_acc");
    let pnorm_acc = var::<f32>("pnorm_acc");
    #[accumulate(NORM_ORDER)]
    for i in 0..len {
        let e = start + i;
        let graw = g[e];
        let gv = scaled_grad(graw, gsv);
        let s_old = state1[e];
        let u = lars_norm_update(fv, mom, gv, s_old);
        let pv = p[e];
        unorm_acc = sum(u * u);
        pnorm_acc = sum(pv * pv);
    }
    store_partials(unorm_part, pnorm_part, block, unorm_acc, pnorm_acc);
}

/// `optim_norm_scale`: one work item sums both partial arrays sequentially and stores
/// `scale = (max_unorm > 0 && unorm > thr) ? thr / unorm : 1.0`, `thr = max_unorm * pnorm + eps`.
#[kernel(name = "optim_norm_scale", grid = 1, signature = OptimNormScale)]
pub fn optim_norm_scale(
    n_blocks: u32,
    max_unorm: f32,
    eps: f32,
    #[shape(n_blocks)] unorm_part: In<f32>,
    #[shape(n_blocks)] pnorm_part: In<f32>,
    #[shape(1)] scale: Out<f32>,
) {
    let zero = val(0u32);
    let nb = n_blocks;
    let su = reduce_sum(unorm_part, zero, nb, ReduceOrder::Sequential);
    let sp = reduce_sum(pnorm_part, zero, nb, ReduceOrder::Sequential);
    let unorm = sqrt(su);
    let pnorm = sqrt(sp);
    let mu = max_unorm;
    let ev = eps;
    let t = mu * pnorm;
    let thr = t + ev;
    let on = mu > 0.0f32;
    let above = unorm > thr;
    let clip = on && above;
    let ratio = thr / unorm;
    let one = val(1.0f32);
    let s = select(clip, ratio, one);
    scale[zero] = s;
}

/// `lamb32_{dtype}` (or its `_gs` variant `name`): AdamW with the step multiplied by
/// `scale[0]` (`ss = scale * step_size`, once per work item).
#[kernel(name = name, grid = n_blocks, signature = Lamb32)]
#[allow(clippy::too_many_arguments)]
pub fn lamb32(
    #[config] dtype: DType,
    #[config] name: &str,
    #[config] gs: bool,
    n: u32,
    n_blocks: u32,
    beta1: f32,
    one_minus_beta1: f32,
    beta2: f32,
    one_minus_beta2: f32,
    decay: f32,
    step_size: f32,
    eps_c2: f32,
    #[when(gs)] gnorm_scale: f32,
    #[when(gs)] skip_zeros: u32,
    #[shape(n)]
    #[dtype(dtype)]
    p: InOut<Float>,
    #[shape(n)]
    #[dtype(dtype)]
    g: In<Float>,
    #[shape(n)] state1: InOut<f32>,
    #[shape(n)] state2: InOut<f32>,
    #[shape(1)] scale: In<f32>,
) {
    let h = betas(beta1, one_minus_beta1, beta2, one_minus_beta2);
    let dec = decay;
    let step = step_size;
    let ec2 = eps_c2;
    let (gsv, skip) = grad_options(gnorm_scale, skip_zeros);
    let zero = val(0u32);
    let sc = scale[zero];
    let ss = sc * step;
    let (_, start, end) = optim_block(n);
    for e in start..end {
        let graw = g[e];
        let gv = scaled_grad(graw, gsv);
        let m_old = state1[e];
        let v_old = state2[e];
        let (finite, m, v) = moments(h, gv, m_old, v_old);
        // `_gs` (as `adamw32_*_gs`): a skipped element (scaled gradient `±0`) keeps its
        // moments and its parameter.
        let (finite, m, v) = skip_moments(skip, gv, m_old, v_old, finite, m, v);
        state1[e] = m;
        state2[e] = v;
        // Straight-line (as `adamw32`): a non-finite gradient keeps the old parameter.
        let pv = p[e];
        let pd = pv * dec;
        let sv = sqrt(v);
        let den = sv + ec2;
        let r = m / den;
        let stepped = fma(r, ss, pd);
        store_rounded(p, e, select(finite, stepped, pv), Rounding::NearestEven);
    }
}

/// `lars32_f32` (or its `_gs` variant `name`): SGD with momentum with the step multiplied by
/// `scale[0]` (`nls = neg_lr * scale`, once per work item).
#[kernel(name = name, grid = n_blocks, signature = Lars32)]
#[allow(clippy::too_many_arguments)]
pub fn lars32(
    #[config] name: &str,
    #[config] gs: bool,
    n: u32,
    n_blocks: u32,
    first: u32,
    momentum: f32,
    weight_decay: f32,
    neg_lr: f32,
    #[when(gs)] gnorm_scale: f32,
    #[when(gs)] skip_zeros: u32,
    #[shape(n)]
    #[dtype(DType::F32)]
    p: InOut<Float>,
    #[shape(n)]
    #[dtype(DType::F32)]
    g: In<Float>,
    #[shape(n)] state1: InOut<f32>,
    #[shape(1)] scale: In<f32>,
) {
    let fv = first;
    let mom = momentum;
    let wd = weight_decay;
    let nl = neg_lr;
    let (gsv, skip) = grad_options(gnorm_scale, skip_zeros);
    let zero = val(0u32);
    let sc = scale[zero];
    let nls = nl * sc;
    let (_, start, end) = optim_block(n);
    for e in start..end {
        let graw = g[e];
        let gv = scaled_grad(graw, gsv);
        let pv = p[e];
        let s_old = state1[e];
        let fzero = val(0.0f32);
        let on = fzero < wd;
        let wg = fma(pv, wd, gv);
        let gw = select(on, wg, gv);
        let st = momentum_of(fv, mom, gw, s_old);
        let finite = is_finite(gv);
        let st = select(finite, st, fzero);
        // `_gs` (as `sgd32_f32_gs`): skipped when the scaled gradient after coupled weight
        // decay is `±0`; momentum and parameter stay.
        let (finite, st) = skip_state(skip, gw, s_old, finite, st);
        state1[e] = st;
        // Straight-line (as `sgd32`): a non-finite gradient keeps the old parameter.
        let stepped = fma(nls, st, pv);
        store_rounded(p, e, select(finite, stepped, pv), Rounding::NearestEven);
    }
}
