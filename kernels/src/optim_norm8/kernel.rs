//! The norm partials of blockwise 8-bit LAMB and LARS (`lamb8_norm_{dtype}`,
//! `lars8_norm_f32`, each plain or `_gs`) in the kernel language. Semantics and parameters are
//! documented in [`crate::optim_norm8`]; the scaled 8-bit updates are the 8-bit AdamW / SGD
//! kernels' trust-ratio forms ([`crate::adam::optim8::adam8bit`],
//! [`crate::optim1::kernel::optim1_8bit`]).

use qforge_macros::kernel;

use crate::optim_funcs::{norm_block, scaled_grad, store_partials};
use crate::optim_norm::kernel::{lamb_norm_update, lars_norm_update};
use crate::optim_norm::NORM_ORDER;
use crate::BlockwiseMap;
use qforge_ir::dsl::{Float, In, Out};
use qforge_ir::DType;

/// `lamb8_norm_{dtype}` (or its `_gs` variant `name`): LAMB's per-block partial sums with the
/// old moments decoded from the 8-bit state (`code[q] * absmax[block]`).
#[kernel(name = name, grid = n_blocks, signature = Lamb8Norm)]
#[allow(clippy::too_many_arguments)]
pub fn lamb8_norm(
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
    #[shape(n)] state1: In<u8>,
    #[shape(n_blocks)] absmax1: In<f32>,
    #[shape(n)] state2: In<u8>,
    #[shape(n_blocks)] absmax2: In<f32>,
    #[shape(n_blocks)] unorm_part: Out<f32>,
    #[shape(n_blocks)] pnorm_part: Out<f32>,
) {
    let code1 = table_f32("code1", &comptime!(BlockwiseMap::Dynamic.code()));
    let code2 = table_f32("code2", &comptime!(BlockwiseMap::DynamicUnsigned.code()));
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
    let item = work_item();
    let old_a1 = absmax1[item];
    let old_a2 = absmax2[item];
    let (block, start, len) = norm_block(n);
    let unorm_acc = var::<f32>("unorm_acc");
    let pnorm_acc = var::<f32>("pnorm_acc");
    #[accumulate(NORM_ORDER)]
    for i in 0..len {
        let e = start + i;
        let graw = g[e];
        let gv = scaled_grad(graw, gsv);
        let m_old = code1[state1[e]] * old_a1;
        let v_old = code2[state2[e]] * old_a2;
        let u = lamb_norm_update(s, gv, m_old, v_old);
        let pv = p[e];
        unorm_acc = sum(u * u);
        pnorm_acc = sum(pv * pv);
    }
    store_partials(unorm_part, pnorm_part, block, unorm_acc, pnorm_acc);
}

/// `lars8_norm_f32` (or its `_gs` variant `name`): LARS's per-block partial sums with the old
/// momentum decoded from the 8-bit state.
#[kernel(name = name, grid = n_blocks, signature = Lars8Norm)]
#[allow(clippy::too_many_arguments)]
pub fn lars8_norm(
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
    #[shape(n)] state1: In<u8>,
    #[shape(n_blocks)] absmax1: In<f32>,
    #[shape(n_blocks)] unorm_part: Out<f32>,
    #[shape(n_blocks)] pnorm_part: Out<f32>,
) {
    let code1 = table_f32("code1", &comptime!(BlockwiseMap::Dynamic.code()));
    let fv = first;
    let mom = momentum;
    let gsv = read_option(gnorm_scale);
    let item = work_item();
    let old_a1 = absmax1[item];
    let (block, start, len) = norm_block(n);
    let unorm_acc = var::<f32>("unorm_acc");
    let pnorm_acc = var::<f32>("pnorm_acc");
    #[accumulate(NORM_ORDER)]
    for i in 0..len {
        let e = start + i;
        let graw = g[e];
        let gv = scaled_grad(graw, gsv);
        let s_old = code1[state1[e]] * old_a1;
        let u = lars_norm_update(fv, mom, gv, s_old);
        let pv = p[e];
        unorm_acc = sum(u * u);
        pnorm_acc = sum(pv * pv);
    }
    store_partials(unorm_part, pnorm_part, block, unorm_acc, pnorm_acc);
}
