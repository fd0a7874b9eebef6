//! The example's own kernel, written with `#[qforge_macros::kernel]`: compiled ahead of time by
//! `build.rs` (which includes this file) and built again at run time to launch it (the device
//! finds its artifact by the kernel's content hash).

use qforge_ir::dsl::{Float, In, Out};
use qforge_ir::{DType, Rounding};

/// `y[i] = fma(x[i], scale, residual[i])` rounded to `dtype` (round to nearest even): a scaled
/// residual branch added with one rounding in `f32`. One work item per element; `x`,
/// `residual` and `y` hold `n` elements of `dtype`.
#[qforge_macros::kernel(name = "scaled_residual_{dtype}", grid = n)]
pub fn scaled_residual(
    #[config] dtype: DType,
    n: u32,
    scale: f32,
    #[shape(n)]
    #[dtype(dtype)]
    x: In<Float>,
    #[shape(n)]
    #[dtype(dtype)]
    residual: In<Float>,
    #[shape(n)]
    #[dtype(dtype)]
    y: Out<Float>,
) {
    let i = work_item();
    store_rounded(y, i, fma(x[i], scale, residual[i]), Rounding::NearestEven);
}
