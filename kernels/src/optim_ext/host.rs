//! Percentile clipping's gradient norm (bitsandbytes' `percentile_clipping`): the squared L2
//! norm of a gradient in one pinned order, through the `grad_sqnorm_{dtype}` kernel
//! ([`crate::optim_ext`]) and a sequential host sum of its per-block partials.

use crate::optim_ext::{grad_sqnorm, GradSqnormArgs};
use crate::{OptimExtSpec, OPTIM_BLOCKSIZE};
use qforge_ir::dsl::FloatIn;

use crate::ops::{cached_typed, float_input};
use qforge_runtime::HostTensor;
use qforge_runtime::Result;
use qforge_runtime::{launch_typed, Device};

/// The per-block partial sums of `g^2` of `grads` (one `f32` per block of [`OPTIM_BLOCKSIZE`]
/// elements, each in the order `Strided(8)` with `fma`), on `dev`.
///
/// # Errors
/// [`crate::Error::Invalid`] for an empty or non-float gradient; any device error.
pub fn grad_sqnorm_partials(dev: &dyn Device, grads: &HostTensor) -> Result<Vec<f32>> {
    let n = float_input("grad_sqnorm", grads)?;
    let spec = OptimExtSpec::GradNorm(grads.dtype);
    let kernel = cached_typed(&spec.name(), || grad_sqnorm(grads.dtype))?;
    let blocks = n.div_ceil(OPTIM_BLOCKSIZE);
    let mut out = vec![0.0f32; blocks as usize];
    launch_typed(
        dev,
        &kernel,
        &mut GradSqnormArgs {
            n,
            n_blocks: blocks,
            g: FloatIn {
                dtype: grads.dtype,
                bytes: &grads.data,
            },
            gnorm_part: &mut out,
        },
    )?;
    Ok(out)
}

/// The squared norm from the partials of every chunk, concatenated in block order: an `f32`
/// sum from `-0.0`, one block after another (the order of `optim_norm_scale`'s `Sequential`
/// reduction).
pub fn sum_partials(parts: &[f32]) -> f32 {
    parts.iter().fold(-0.0f32, |acc, x| acc + x)
}
