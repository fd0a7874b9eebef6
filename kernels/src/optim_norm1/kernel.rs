//! The `max_unorm` partials of 32-bit RMSprop and Adagrad (`rmsprop_norm_f32`,
//! `adagrad_norm_f32`, each plain or `_gs`) in the kernel language. Semantics and parameters
//! are documented in [`crate::optim_norm1`].

use qforge_macros::kernel;

use crate::optim_funcs::{finite_or_zero, norm_block, scaled_grad, store_partials};
use crate::optim_norm::NORM_ORDER;
use qforge_ir::dsl::{Float, In, Out};
use qforge_ir::DType;

/// `{algo}_norm_f32` (or its `_gs` variant, `name`): the per-block sums of squared precondition
/// updates `g / (sqrt(s) + eps)` and squared parameters; `rms` selects RMSprop's state update
/// `fma(s_old, beta1, (one_minus_beta1 * g) * g)`, else Adagrad's `fma(g, g, s_old)`.
#[kernel(name = name, grid = n_blocks, signature = Optim1Norm)]
#[allow(clippy::too_many_arguments)]
pub fn optim1_norm(
    #[config] rms: bool,
    #[config] name: &str,
    #[config] gs: bool,
    n: u32,
    n_blocks: u32,
    beta1: f32,
    one_minus_beta1: f32,
    eps: f32,
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
    let b1 = beta1;
    let omb1 = one_minus_beta1;
    let ev = eps;
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
        let s = if rms {
            let t = omb1 * gv * gv;
            fma(s_old, b1, t)
        } else {
            fma(gv, gv, s_old)
        };
        let sq = sqrt(s);
        let den = sq + ev;
        let u = gv / den;
        let u = finite_or_zero(gv, u);
        let pv = p[e];
        unorm_acc = sum(u * u);
        pnorm_acc = sum(pv * pv);
    }
    store_partials(unorm_part, pnorm_part, block, unorm_acc, pnorm_acc);
}
