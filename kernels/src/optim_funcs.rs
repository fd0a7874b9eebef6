//! The optimizer kernels' shared per-element helpers in the kernel language (`#[func]`): the
//! `_gs` gradient options and skip rules ([`crate::optim_ext`]), the non-finite rule, the Adam
//! moments, SGD's momentum and the blockwise absmax step. Used by the Adam / AdamW kernels
//! ([`crate::adam`]), the one-state kernels ([`crate::optim1`]), AdEMAMix
//! ([`crate::optim_ademamix`]) and the LAMB / LARS / `max_unorm` kernels
//! ([`crate::optim_norm`], [`crate::optim_norm1`], [`crate::optim_norm8`]).

use qforge_macros::func;

use crate::adam::OPTIM_BLOCKSIZE;
use crate::funcs::block_range;
use qforge_ir::dsl::{Buf, Out, Scalar, Val, Var};

/// The moment decays, as values.
#[derive(Clone, Copy)]
pub(crate) struct Betas {
    pub(crate) beta1: Val<f32>,
    pub(crate) one_minus_beta1: Val<f32>,
    pub(crate) beta2: Val<f32>,
    pub(crate) one_minus_beta2: Val<f32>,
}

/// The [`Betas`] of `beta1, 1 - beta1, beta2, 1 - beta2` (read in that order).
#[func]
pub(crate) fn betas(
    beta1: Val<f32>,
    one_minus_beta1: Val<f32>,
    beta2: Val<f32>,
    one_minus_beta2: Val<f32>,
) -> Betas {
    Betas {
        beta1: beta1,
        one_minus_beta1: one_minus_beta1,
        beta2: beta2,
        one_minus_beta2: one_minus_beta2,
    }
}

/// `|g| < inf`: `g` is neither NaN nor ±inf.
#[func]
pub(crate) fn is_finite(g: Val<f32>) -> Val<bool> {
    let ag = abs(g);
    ag < f32::INFINITY
}

/// `u` for a finite gradient `g`, else `+0.0`.
#[func]
pub(crate) fn finite_or_zero(g: Val<f32>, u: Val<f32>) -> Val<f32> {
    let finite = is_finite(g);
    let zero = val(0.0f32);
    select(finite, u, zero)
}

/// The `_gs` values: `gnorm_scale` and `skip_zeros != 0`.
#[func]
pub(crate) fn grad_options(
    gnorm_scale: Option<Scalar<f32>>,
    skip_zeros: Option<Scalar<u32>>,
) -> (Option<Val<f32>>, Option<Val<bool>>) {
    let gs = read_option(gnorm_scale);
    let skip = match read_option(skip_zeros) {
        Some(s) => Some(s != 0u32),
        None => None,
    };
    (gs, skip)
}

/// `g * gnorm_scale` (one rounding) in a `_gs` kernel, else `g`.
#[func]
pub(crate) fn scaled_grad(g: Val<f32>, gnorm_scale: Option<Val<f32>>) -> Val<f32> {
    match gnorm_scale {
        Some(s) => g * s,
        None => g,
    }
}

/// `_gs`: a skipped element (`skip_zeros` on and `x == ±0`) keeps its old moments and is not
/// applied: `(finite && !skipped, m, v)`.
#[func]
#[allow(clippy::too_many_arguments)]
pub(crate) fn skip_moments(
    skip: Option<Val<bool>>,
    x: Val<f32>,
    m_old: Val<f32>,
    v_old: Val<f32>,
    finite: Val<bool>,
    m: Val<f32>,
    v: Val<f32>,
) -> (Val<bool>, Val<f32>, Val<f32>) {
    match skip {
        Some(on) => {
            let sk = on && x == 0.0f32;
            let m = select(sk, m_old, m);
            let v = select(sk, v_old, v);
            let keep = !sk;
            (finite && keep, m, v)
        }
        None => (finite, m, v),
    }
}

/// `_gs`: a skipped element (`skip_zeros` on and `x == ±0`) keeps its old state `s_old` and is
/// not applied: `(finite && !skipped, s)`.
#[func]
pub(crate) fn skip_state(
    skip: Option<Val<bool>>,
    x: Val<f32>,
    s_old: Val<f32>,
    finite: Val<bool>,
    s: Val<f32>,
) -> (Val<bool>, Val<f32>) {
    match skip {
        Some(on) => {
            let sk = on && x == 0.0f32;
            let s = select(sk, s_old, s);
            let keep = !sk;
            (finite && keep, s)
        }
        None => (finite, s),
    }
}

/// The Adam moments of one element before the non-finite rule:
/// `m = fma(g, one_minus_beta1, m * beta1)`, `v = fma(one_minus_beta2 * g, g, v * beta2)`.
#[func]
pub(crate) fn moment_update(
    h: Betas,
    g: Val<f32>,
    m_old: Val<f32>,
    v_old: Val<f32>,
) -> (Val<f32>, Val<f32>) {
    let mb = m_old * h.beta1;
    let m = fma(g, h.one_minus_beta1, mb);
    let gs = h.one_minus_beta2 * g;
    let vb = v_old * h.beta2;
    let v = fma(gs, g, vb);
    (m, v)
}

/// `(finite, m, v)`: the Adam moments ([`moment_update`]), both `+0.0` for a non-finite `g`.
#[func]
pub(crate) fn moments(
    h: Betas,
    g: Val<f32>,
    m_old: Val<f32>,
    v_old: Val<f32>,
) -> (Val<bool>, Val<f32>, Val<f32>) {
    let (m, v) = moment_update(h, g, m_old, v_old);
    let finite = is_finite(g);
    let zero = val(0.0f32);
    (finite, select(finite, m, zero), select(finite, v, zero))
}

/// `first ? g : fma(s_old, momentum, g)` (SGD's momentum).
#[func]
pub(crate) fn momentum_of(
    first: Val<u32>,
    mom: Val<f32>,
    g: Val<f32>,
    s_old: Val<f32>,
) -> Val<f32> {
    let m = fma(s_old, mom, g);
    let is_first = first != 0u32;
    select(is_first, g, m)
}

/// `acc = max(acc, |x|)` (`select(|x| > acc, |x|, acc)`: a NaN moment is skipped).
#[func]
pub(crate) fn absmax_step(acc: Var<f32>, x: Val<f32>) {
    let a = abs(x);
    acc = max(acc, a);
}

/// `(block, start, end)`: this work item's block of [`OPTIM_BLOCKSIZE`] elements of `n`.
#[func]
pub(crate) fn optim_block(n: Scalar<u32>) -> (Val<u32>, Val<u32>, Val<u32>) {
    let block = work_item();
    let nv = n;
    let (start, end) = block_range(block, OPTIM_BLOCKSIZE, nv);
    (block, start, end)
}

/// `(block, start, len)` of [`optim_block`] (the norm partials' loop range).
#[func]
pub(crate) fn norm_block(n: Scalar<u32>) -> (Val<u32>, Val<u32>, Val<u32>) {
    let (block, start, end) = optim_block(n);
    let len = end - start;
    (block, start, len)
}

/// Stores a block's two partial sums: `unorm_part[block] = unorm_acc`,
/// `pnorm_part[block] = pnorm_acc`.
#[func]
pub(crate) fn store_partials(
    unorm_part: Buf<Out<f32>>,
    pnorm_part: Buf<Out<f32>>,
    block: Val<u32>,
    unorm_acc: Var<f32>,
    pnorm_acc: Var<f32>,
) {
    let su = unorm_acc;
    let sp = pnorm_acc;
    unorm_part[block] = su;
    pnorm_part[block] = sp;
}
