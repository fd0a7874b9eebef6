//! The AdEMAMix kernels in the kernel language: 32-bit state ([`ademamix32`]) and 8-bit
//! blockwise state ([`ademamix8bit`]). Semantics, parameters and the two passes of the 8-bit
//! kernel are documented in [`crate::optim_ademamix`].

use qforge_macros::{func, kernel};

use crate::adam::optim8::{state8, State8};
use crate::funcs::inv_absmax;
use crate::optim_ademamix::AdemamixSpec;
use crate::optim_funcs::{absmax_step, is_finite, optim_block};
use crate::BlockwiseMap;
use qforge_ir::dsl::{Buf, Float, In, InOut, Val};
use qforge_ir::Rounding;

/// The scalar values inside the kernel.
#[derive(Clone, Copy)]
struct Hyper {
    beta1: Val<f32>,
    one_minus_beta1: Val<f32>,
    beta2: Val<f32>,
    one_minus_beta2: Val<f32>,
    beta3: Val<f32>,
    one_minus_beta3: Val<f32>,
    alpha: Val<f32>,
    c1: Val<f32>,
    c2: Val<f32>,
    eps: Val<f32>,
    decay: Val<f32>,
    neg_lr: Val<f32>,
}

/// `(finite, [m1, nu, m2])` of one element from the old states; all `+0.0` for a non-finite
/// `g`.
#[func]
fn moments(h: Hyper, g: Val<f32>, old: [Val<f32>; 3]) -> (Val<bool>, [Val<f32>; 3]) {
    let [m1_old, nu_old, m2_old] = old;
    let m1 = fma(m1_old, h.beta1, h.one_minus_beta1 * g);
    let nu = fma(nu_old, h.beta2, h.one_minus_beta2 * g * g);
    let m2 = fma(m2_old, h.beta3, h.one_minus_beta3 * g);
    let finite = is_finite(g);
    let zero = val(0.0f32);
    let s = [
        select(finite, m1, zero),
        select(finite, nu, zero),
        select(finite, m2, zero),
    ];
    (finite, s)
}

/// The new parameter from the old one (decayed first) and the new states `[m1, nu, m2]`.
#[func]
fn param(h: Hyper, p: Val<f32>, s: [Val<f32>; 3]) -> Val<f32> {
    let [m1, nu, m2] = s;
    let pd = p * h.decay;
    let num = fma(h.alpha, m2, m1 / h.c1);
    let den = sqrt(nu) / h.c2 + h.eps;
    fma(h.neg_lr, num / den, pd)
}

/// The 32-bit AdEMAMix kernel of `spec` (`state1, state2, state3` = `m1, nu, m2`).
#[kernel(name = spec.name(), grid = n_blocks, signature = Ademamix32)]
#[allow(clippy::too_many_arguments)]
pub fn ademamix32(
    #[config] spec: &AdemamixSpec,
    n: u32,
    n_blocks: u32,
    beta1: f32,
    one_minus_beta1: f32,
    beta2: f32,
    one_minus_beta2: f32,
    beta3: f32,
    one_minus_beta3: f32,
    alpha: f32,
    c1: f32,
    c2: f32,
    eps: f32,
    decay: f32,
    neg_lr: f32,
    #[shape(n)]
    #[dtype(spec.dtype)]
    p: InOut<Float>,
    #[shape(n)]
    #[dtype(spec.dtype)]
    g: In<Float>,
    #[shape(n)] state1: InOut<f32>,
    #[shape(n)] state2: InOut<f32>,
    #[shape(n)] state3: InOut<f32>,
) {
    let h = Hyper {
        beta1: beta1,
        one_minus_beta1: one_minus_beta1,
        beta2: beta2,
        one_minus_beta2: one_minus_beta2,
        beta3: beta3,
        one_minus_beta3: one_minus_beta3,
        alpha: alpha,
        c1: c1,
        c2: c2,
        eps: eps,
        decay: decay,
        neg_lr: neg_lr,
    };
    let (_, start, end) = optim_block(n);
    for e in start..end {
        let gv = g[e];
        let old = [state1[e], state2[e], state3[e]];
        let (finite, s) = moments(h, gv, old);
        let [m1, nu, m2] = s;
        state1[e] = m1;
        state2[e] = nu;
        state3[e] = m2;
        // Straight-line: a non-finite gradient keeps the old parameter.
        let pv = p[e];
        let stepped = param(h, pv, s);
        store_rounded(p, e, select(finite, stepped, pv), Rounding::NearestEven);
    }
}

/// `(finite, [m1, nu, m2])` of element `e` of the 8-bit kernel, from the unchanged codes.
#[func]
fn update8(
    h: Hyper,
    g: Buf<In<Float>>,
    st: [State8; 3],
    old_a: [Val<f32>; 3],
    e: Val<u32>,
) -> (Val<bool>, [Val<f32>; 3]) {
    let gv = g[e];
    let [t1, t2, t3] = st;
    let [a1, a2, a3] = old_a;
    let old = [
        t1.code[t1.codes[e]] * a1,
        t2.code[t2.codes[e]] * a2,
        t3.code[t3.codes[e]] * a3,
    ];
    moments(h, gv, old)
}

/// The 8-bit AdEMAMix kernel of `spec`: `m1` (`state1`) and `m2` (`state3`) on the signed
/// dynamic map, `nu` (`state2`) on the unsigned one, each with its absmax per block.
#[kernel(name = spec.name(), grid = n_blocks, signature = Ademamix8)]
#[allow(clippy::too_many_arguments)]
pub fn ademamix8bit(
    #[config] spec: &AdemamixSpec,
    n: u32,
    n_blocks: u32,
    beta1: f32,
    one_minus_beta1: f32,
    beta2: f32,
    one_minus_beta2: f32,
    beta3: f32,
    one_minus_beta3: f32,
    alpha: f32,
    c1: f32,
    c2: f32,
    eps: f32,
    decay: f32,
    neg_lr: f32,
    #[shape(n)]
    #[dtype(spec.dtype)]
    p: InOut<Float>,
    #[shape(n)]
    #[dtype(spec.dtype)]
    g: In<Float>,
    #[shape(n)] state1: InOut<u8>,
    #[shape(n_blocks)] absmax1: InOut<f32>,
    #[shape(n)] state2: InOut<u8>,
    #[shape(n_blocks)] absmax2: InOut<f32>,
    #[shape(n)] state3: InOut<u8>,
    #[shape(n_blocks)] absmax3: InOut<f32>,
) {
    let h = Hyper {
        beta1: beta1,
        one_minus_beta1: one_minus_beta1,
        beta2: beta2,
        one_minus_beta2: one_minus_beta2,
        beta3: beta3,
        one_minus_beta3: one_minus_beta3,
        alpha: alpha,
        c1: c1,
        c2: c2,
        eps: eps,
        decay: decay,
        neg_lr: neg_lr,
    };
    let (block, start, end) = optim_block(n);
    // m1 and m2 on the signed map, nu on the unsigned one.
    let s1 = state8(state1, BlockwiseMap::Dynamic, "1");
    let s2 = state8(state2, BlockwiseMap::DynamicUnsigned, "2");
    let s3 = State8 {
        codes: state3,
        code: s1.code,
        thresholds: s1.thresholds,
    };
    let st = [s1, s2, s3];
    let old_a = [absmax1[block], absmax2[block], absmax3[block]];
    let acc1 = var::<f32>("absmax1_acc");
    let acc2 = var::<f32>("absmax2_acc");
    let acc3 = var::<f32>("absmax3_acc");
    // Pass 1: the new absmax of each state.
    for e in start..end {
        let (_, s) = update8(h, g, st, old_a, e);
        let [m1, nu, m2] = s;
        absmax_step(acc1, m1);
        absmax_step(acc2, nu);
        absmax_step(acc3, m2);
    }
    let new_a1 = acc1;
    absmax1[block] = new_a1;
    let inv1 = inv_absmax(new_a1);
    let new_a2 = acc2;
    absmax2[block] = new_a2;
    let inv2 = inv_absmax(new_a2);
    let new_a3 = acc3;
    absmax3[block] = new_a3;
    let inv3 = inv_absmax(new_a3);
    // Pass 2 (straight-line): the same states again, the parameter (unchanged where the
    // gradient is not finite) and the requantized states.
    for e in start..end {
        let (finite, s) = update8(h, g, st, old_a, e);
        let pv = p[e];
        let stepped = param(h, pv, s);
        store_rounded(p, e, select(finite, stepped, pv), Rounding::NearestEven);
        let [m1, nu, m2] = s;
        state1[e] = search_sorted(s1.thresholds, m1 * inv1);
        state2[e] = search_sorted(s2.thresholds, nu * inv2);
        state3[e] = search_sorted(s3.thresholds, m2 * inv3);
    }
}
