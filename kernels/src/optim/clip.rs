//! Percentile clipping (bitsandbytes' `percentile_clipping` / `gnorm_scale`): each parameter's
//! history of its last 100 squared gradient norms and the scale of this step's gradient. The
//! formulas and their source are in `docs/optimizers.md`, section "Gradient options".

use crate::ops::{grad_sqnorm_partials, sum_partials};
use qforge_runtime::Device;
use qforge_runtime::HostTensor;
use qforge_runtime::Result;

/// Entries of a parameter's norm history (bitsandbytes' `gnorm_vec`).
pub const GNORM_HISTORY: usize = 100;

/// The squared L2 norm of `grads` in the pinned order: per-block partials of the
/// `grad_sqnorm_{dtype}` kernel over chunks of `chunk` elements (a multiple of the block, so the
/// partials do not depend on it), summed in block order from `-0.0`.
///
/// # Errors
/// Any host op or device error.
pub(crate) fn grad_sqnorm(dev: &dyn Device, grads: &HostTensor, chunk: usize) -> Result<f32> {
    let n = grads.numel();
    let size = grads.dtype.size_bytes();
    let mut parts = Vec::with_capacity(n.div_ceil(256));
    let mut start = 0;
    while start < n {
        let end = (start + chunk).min(n);
        let g = HostTensor::new(
            grads.dtype,
            vec![end - start],
            grads.data[start * size..end * size].to_vec(),
        )?;
        parts.extend(grad_sqnorm_partials(dev, &g)?);
        start = end;
    }
    Ok(sum_partials(&parts))
}

/// Records the squared norm `sq` of step `step` (1-based) in `history` and returns this step's
/// `gnorm_scale`, as bitsandbytes: slot `step % 100` is cleared, then step 1 adds `sq` to every
/// slot (filling the history with the first norm) and later steps add it to slot `step % 100`;
/// `current = sqrt(history[step % 100])`, `clip = sqrt(sorted(history)[percentile])` (ascending,
/// NaN last), and the scale is `clip / current` when `current > clip`, else `1.0` (all `f32`).
/// `percentile` is below 100 (the caller clips only then).
pub(crate) fn record_and_scale(history: &mut [f32], sq: f32, step: u32, percentile: u32) -> f32 {
    let slot = step as usize % GNORM_HISTORY;
    history[slot] = 0.0;
    if step == 1 {
        for h in history.iter_mut() {
            *h += sq;
        }
    } else {
        history[slot] += sq;
    }
    let current = history[slot].sqrt();
    let mut sorted = history.to_vec();
    sorted.sort_by(|a, b| match (a.is_nan(), b.is_nan()) {
        (true, true) => std::cmp::Ordering::Equal,
        (true, false) => std::cmp::Ordering::Greater,
        (false, true) => std::cmp::Ordering::Less,
        (false, false) => a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal),
    });
    let index = (percentile as usize).min(GNORM_HISTORY - 1);
    let clip = sorted[index].sqrt();
    if current > clip {
        clip / current
    } else {
        1.0
    }
}
