//! The one-state optimizer kernels (Lion, SGD, RMSprop, Adagrad) in the kernel language, with
//! 32-bit ([`optim1_32bit`]) or 8-bit blockwise ([`optim1_8bit`]) state, each plain, `_gs`
//! (`gnorm_scale`, `skip_zeros`) and trust-ratio scaled (`scale: f32[1]`). Semantics,
//! parameters and the two passes of the 8-bit kernel are documented in [`crate::optim1`].

use qforge_macros::{func, kernel};

use crate::adam::optim8::{state8, State8};
use crate::funcs::inv_absmax;
use crate::optim1::{Optim1Algo, Optim1Spec};
use crate::optim_funcs::{
    absmax_step, grad_options, is_finite, momentum_of, optim_block, scaled_grad, skip_state,
};
use crate::BlockwiseMap;
use qforge_ir::dsl::{Buf, Float, In, InOut, Scalar, Val};
use qforge_ir::Rounding;

/// The scalar values inside the kernel.
#[derive(Clone, Copy)]
struct Hyper {
    first: Val<u32>,
    beta1: Val<f32>,
    one_minus_beta1: Val<f32>,
    beta2: Val<f32>,
    one_minus_beta2: Val<f32>,
    weight_decay: Val<f32>,
    decay: Val<f32>,
    eps: Val<f32>,
    lr: Val<f32>,
    neg_lr: Val<f32>,
}

/// The scalars from the nine `f32` values (`beta1` .. `neg_lr`, read in parameter order), with
/// `neg_lr * scale[0]` in a trust-ratio scaled kernel (LARS), then `first`.
#[func]
fn hyper(v: [Val<f32>; 9], scale: Option<Buf<In<f32>>>, first: Scalar<u32>) -> Hyper {
    let [beta1, one_minus_beta1, beta2, one_minus_beta2, weight_decay, decay, eps, lr, neg_lr] = v;
    // LARS: `nls = neg_lr * scale[0]`, where `lars32` multiplies it.
    let neg_lr = match scale {
        Some(sc) => {
            let zero = val(0u32);
            neg_lr * sc[zero]
        }
        None => neg_lr,
    };
    Hyper {
        first: first,
        beta1: beta1,
        one_minus_beta1: one_minus_beta1,
        beta2: beta2,
        one_minus_beta2: one_minus_beta2,
        weight_decay: weight_decay,
        decay: decay,
        eps: eps,
        lr: lr,
        neg_lr: neg_lr,
    }
}

/// The new state of one element from `(g, p, s_old)`: `(finite, gw, s)`, `s = +0.0` for a
/// non-finite `g`. Lion's `gw` is `g`.
#[func]
fn new_state(
    algo: Optim1Algo,
    bits8: bool,
    h: Hyper,
    g: Val<f32>,
    p: Val<f32>,
    s_old: Val<f32>,
) -> (Val<bool>, Val<f32>, Val<f32>) {
    let gw = match algo {
        Optim1Algo::Lion => g,
        Optim1Algo::Sgd | Optim1Algo::Rmsprop | Optim1Algo::Adagrad => {
            let zero = val(0.0f32);
            let on = zero < h.weight_decay;
            let wg = fma(p, h.weight_decay, g);
            select(on, wg, g)
        }
    };
    let s = match algo {
        Optim1Algo::Lion => fma(s_old, h.beta2, h.one_minus_beta2 * g),
        Optim1Algo::Sgd => momentum_of(h.first, h.beta1, gw, s_old),
        Optim1Algo::Rmsprop => {
            // CUDA: 8-bit `(1-b)*(g*g)`, 32-bit `(1-b)*g*g` (left to right).
            let t = if bits8 {
                h.one_minus_beta1 * (gw * gw)
            } else {
                h.one_minus_beta1 * gw * gw
            };
            fma(s_old, h.beta1, t)
        }
        Optim1Algo::Adagrad => fma(gw, gw, s_old),
    };
    let finite = is_finite(g);
    let zero = val(0.0f32);
    (finite, gw, select(finite, s, zero))
}

/// The new parameter of one element with a finite gradient. `x` is the numerator of RMSprop
/// and Adagrad (`gw` for 32-bit, the raw `g` for 8-bit, as bitsandbytes' CUDA kernels do).
#[func]
fn new_param(
    algo: Optim1Algo,
    h: Hyper,
    g: Val<f32>,
    p: Val<f32>,
    s_old: Val<f32>,
    s: Val<f32>,
    x: Val<f32>,
) -> Val<f32> {
    match algo {
        Optim1Algo::Lion => {
            let pd = p * h.decay;
            let u = fma(s_old, h.beta1, h.one_minus_beta1 * g);
            let zero = val(0.0f32);
            let pos = zero < u;
            let neg = u < zero;
            let minus = select(neg, h.neg_lr, zero);
            let step = select(pos, h.lr, minus);
            pd - step
        }
        Optim1Algo::Sgd => fma(h.neg_lr, s, p),
        Optim1Algo::Rmsprop | Optim1Algo::Adagrad => {
            let den = sqrt(s) + h.eps;
            fma(h.neg_lr, x / den, p)
        }
    }
}

/// The 32-bit kernel `name` of `spec`: `grad_opts` adds the `_gs` scalars, `scaled` the
/// trust-ratio buffer `scale: f32[1]` last ([`Optim1Spec::build_scaled`]).
#[kernel(name = name, grid = n_blocks, signature = Optim1Update32)]
#[allow(clippy::too_many_arguments)]
pub fn optim1_32bit(
    #[config] spec: &Optim1Spec,
    #[config] name: &str,
    #[config] grad_opts: bool,
    #[config] scaled: bool,
    n: u32,
    n_blocks: u32,
    first: u32,
    beta1: f32,
    one_minus_beta1: f32,
    beta2: f32,
    one_minus_beta2: f32,
    weight_decay: f32,
    decay: f32,
    eps: f32,
    lr: f32,
    neg_lr: f32,
    #[when(grad_opts)] gnorm_scale: f32,
    #[when(grad_opts)] skip_zeros: u32,
    #[shape(n)]
    #[dtype(spec.dtype)]
    p: InOut<Float>,
    #[shape(n)]
    #[dtype(spec.dtype)]
    g: In<Float>,
    #[shape(n)] state1: InOut<f32>,
    #[when(scaled)]
    #[shape(1)]
    scale: In<f32>,
) {
    let v = [
        beta1,
        one_minus_beta1,
        beta2,
        one_minus_beta2,
        weight_decay,
        decay,
        eps,
        lr,
        neg_lr,
    ];
    let h = hyper(v, scale, first);
    let (gs, skip) = grad_options(gnorm_scale, skip_zeros);
    let algo = spec.algo;
    let (_, start, end) = optim_block(n);
    for e in start..end {
        let graw = g[e];
        let gv = scaled_grad(graw, gs);
        let pv = p[e];
        let s_old = state1[e];
        let (finite, gw, s) = new_state(algo, false, h, gv, pv, s_old);
        // `_gs` (bitsandbytes' 32-bit kernel): skipped when the gradient after scaling and
        // coupled weight decay is zero; state and parameter stay.
        let (finite, s) = skip_state(skip, gw, s_old, finite, s);
        state1[e] = s;
        // Straight-line: a non-finite gradient keeps the old parameter.
        let stepped = new_param(algo, h, gv, pv, s_old, s, gw);
        store_rounded(p, e, select(finite, stepped, pv), Rounding::NearestEven);
    }
}

/// `(graw, gs, pv, s_old, apply, s)` of element `e` of an 8-bit kernel, from the unchanged
/// codes and parameter: `gs` is the scaled gradient; `apply` is false for a non-finite or
/// (`_gs`) skipped element.
#[func]
fn update8(
    algo: Optim1Algo,
    h: Hyper,
    g: Buf<In<Float>>,
    gs: Option<Val<f32>>,
    skip: Option<Val<bool>>,
    p: Buf<InOut<Float>>,
    s1: State8,
    old_a1: Val<f32>,
    e: Val<u32>,
) -> (Val<f32>, Val<f32>, Val<f32>, Val<f32>, Val<bool>, Val<f32>) {
    let graw = g[e];
    let gv = scaled_grad(graw, gs);
    let pv = p[e];
    let s_old = s1.code[s1.codes[e]] * old_a1;
    let (finite, _, s) = new_state(algo, true, h, gv, pv, s_old);
    // `_gs` (bitsandbytes' 8-bit kernel): skipped when the raw gradient is zero; the state
    // keeps its dequantized value, which then takes part in the block's new absmax and is
    // requantized with it like every other element.
    let (finite, s) = skip_state(skip, graw, s_old, finite, s);
    (graw, gv, pv, s_old, finite, s)
}

/// The 8-bit blockwise kernel `name` of `spec`; `grad_opts` and `scaled` as [`optim1_32bit`].
#[kernel(name = name, grid = n_blocks, signature = Optim1Update8)]
#[allow(clippy::too_many_arguments)]
pub fn optim1_8bit(
    #[config] spec: &Optim1Spec,
    #[config] name: &str,
    #[config] grad_opts: bool,
    #[config] scaled: bool,
    n: u32,
    n_blocks: u32,
    first: u32,
    beta1: f32,
    one_minus_beta1: f32,
    beta2: f32,
    one_minus_beta2: f32,
    weight_decay: f32,
    decay: f32,
    eps: f32,
    lr: f32,
    neg_lr: f32,
    #[when(grad_opts)] gnorm_scale: f32,
    #[when(grad_opts)] skip_zeros: u32,
    #[shape(n)]
    #[dtype(spec.dtype)]
    p: InOut<Float>,
    #[shape(n)]
    #[dtype(spec.dtype)]
    g: In<Float>,
    #[shape(n)] state1: InOut<u8>,
    #[shape(n_blocks)] absmax1: InOut<f32>,
    #[when(scaled)]
    #[shape(1)]
    scale: In<f32>,
) {
    let v = [
        beta1,
        one_minus_beta1,
        beta2,
        one_minus_beta2,
        weight_decay,
        decay,
        eps,
        lr,
        neg_lr,
    ];
    let h = hyper(v, scale, first);
    let (gs, skip) = grad_options(gnorm_scale, skip_zeros);
    let algo = spec.algo;
    let (block, start, end) = optim_block(n);
    let s1 = state8(state1, BlockwiseMap::Dynamic, "1");
    let old_a1 = absmax1[block];
    let acc = var::<f32>("absmax1_acc");
    // Pass 1: the new absmax (NaN-ignoring max |s|).
    for e in start..end {
        let (_, _, _, _, _, s) = update8(algo, h, g, gs, skip, p, s1, old_a1, e);
        absmax_step(acc, s);
    }
    let new_a1 = acc;
    absmax1[block] = new_a1;
    let inv = inv_absmax(new_a1);
    // Pass 2 (straight-line): the same state again, the parameter (unchanged where the
    // gradient is not finite), and the requantized state.
    for e in start..end {
        let (graw, gv, pv, s_old, finite, s) = update8(algo, h, g, gs, skip, p, s1, old_a1, e);
        // RMSprop / Adagrad's numerator is the raw, unscaled gradient (bitsandbytes' 8-bit
        // kernel reloads `g_vals[j]`); Lion's sign uses the scaled one.
        let stepped = new_param(algo, h, gv, pv, s_old, s, graw);
        store_rounded(p, e, select(finite, stepped, pv), Rounding::NearestEven);
        state1[e] = search_sorted(s1.thresholds, s * inv);
    }
}
