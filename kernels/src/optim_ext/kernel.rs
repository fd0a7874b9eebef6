//! Percentile clipping's gradient-norm kernel `grad_sqnorm_{dtype}` in the kernel language
//! (semantics and parameters in [`crate::optim_ext`]).

use qforge_macros::kernel;

use crate::optim_funcs::norm_block;
use crate::optim_norm::NORM_ORDER;
use qforge_ir::dsl::{Float, In, Out};
use qforge_ir::DType;

/// The per-block partial sums of `g^2` (one work item per block of
/// [`OPTIM_BLOCKSIZE`](crate::adam::OPTIM_BLOCKSIZE) elements, in the order [`NORM_ORDER`]).
#[kernel(name = "grad_sqnorm_{dtype}", grid = n_blocks, signature = GradSqnorm)]
pub fn grad_sqnorm(
    #[config] dtype: DType,
    n: u32,
    n_blocks: u32,
    #[shape(n)]
    #[dtype(dtype)]
    g: In<Float>,
    #[shape(n_blocks)] gnorm_part: Out<f32>,
) {
    let (block, start, len) = norm_block(n);
    let gnorm_acc = var::<f32>("gnorm_acc");
    #[accumulate(NORM_ORDER)]
    for i in 0..len {
        let e = start + i;
        let gv = g[e];
        gnorm_acc = sum(gv * gv);
    }
    let s = gnorm_acc;
    gnorm_part[block] = s;
}
