//! `max_unorm` steps of 32-bit RMSprop and Adagrad (bitsandbytes' `max_unorm` of
//! `Optimizer1State`), over any [`Device`]: the update-norm partials
//! ([`crate::optim_norm1`]), LAMB/LARS's scale kernel with the optimizer's `eps`
//! as the threshold epsilon, and the plain update kernel with `lr` and `neg_lr` multiplied by
//! the scale. As with LAMB/LARS the pieces are public, so a chunked caller gathers the partials
//! of every chunk, takes one scale, then updates chunk by chunk. Formulas:
//! `docs/optimizers.md`, section "max_unorm for RMSprop and Adagrad".

use crate::optim_norm1::partials_args;
use crate::{Optim1Algo, Optim1Hyper, OptimExtSpec, StateBits};
use qforge_ir::DType;

use crate::adam::host::{expect, kernel_for, GradOptions};
use crate::ops::{count_u32, f32_le, float_input};
use crate::optim1::host::{launch32, prepare};
use crate::optim_norm::host::{
    check_scale, norm_scale_eps, partials_opts, partials_with, NormPartials,
};
use qforge_runtime::Device;
use qforge_runtime::HostTensor;
use qforge_runtime::{Error, Result};

/// Checks the rule: RMSprop and Adagrad only.
fn check_algo(op: &str, algo: Optim1Algo) -> Result<()> {
    match algo {
        Optim1Algo::Rmsprop | Optim1Algo::Adagrad => Ok(()),
        Optim1Algo::Lion | Optim1Algo::Sgd => Err(Error::Invalid(format!(
            "{op}: max_unorm here is for rmsprop and adagrad, not {} (SGD: the LARS ops)",
            algo.name()
        ))),
    }
}

/// The update-norm partials of step `step` (1-based) of RMSprop / Adagrad for an `f32`
/// parameter, its gradient and its state before the step; nothing is modified.
///
/// # Errors
/// [`Error::Invalid`] for another rule, an empty or non-f32 parameter, a gradient of another
/// dtype or shape, state of the wrong length, more than `2^31 - 1` elements; [`Error::Ir`] for
/// invalid hyperparameters or step 0; any device error.
pub fn optim1_norm_partials(
    dev: &dyn Device,
    algo: Optim1Algo,
    params: &HostTensor,
    grads: &HostTensor,
    state1: &[f32],
    hyper: &Optim1Hyper,
    step: u32,
) -> Result<NormPartials> {
    let opts = GradOptions::default();
    optim1_norm_partials_opts(dev, algo, params, grads, state1, hyper, step, &opts)
}

/// [`optim1_norm_partials`] with bitsandbytes' gradient options: the gradient is multiplied by
/// `opts.gnorm_scale` before any use (`{algo}_norm_f32_gs`); `skip_zeros` does not apply to
/// the norm (bitsandbytes' precondition kernel takes none).
///
/// # Errors
/// As [`optim1_norm_partials`]; [`Error::Invalid`] for a `gnorm_scale` outside `[0, 1]`.
#[allow(clippy::too_many_arguments)]
pub fn optim1_norm_partials_opts(
    dev: &dyn Device,
    algo: Optim1Algo,
    params: &HostTensor,
    grads: &HostTensor,
    state1: &[f32],
    hyper: &Optim1Hyper,
    step: u32,
    opts: &GradOptions,
) -> Result<NormPartials> {
    const OP: &str = "optim1_norm_partials";
    check_algo(OP, algo)?;
    let n = float_input(OP, params)?;
    float_input(OP, grads)?;
    if params.dtype != DType::F32 || grads.dtype != DType::F32 || grads.shape != params.shape {
        return Err(Error::Invalid(format!(
            "{OP}: the parameter and the gradient must both be f32 of one shape, got {} {:?} and \
             {} {:?}",
            params.dtype, params.shape, grads.dtype, grads.shape
        )));
    }
    let n = count_u32(OP, "the parameter", n as usize)?;
    expect(OP, "state1", state1.len(), n as usize)?;
    let s = hyper.scalars(algo, step)?;
    let s1 = f32_le(state1);
    let inputs: [&[u8]; 3] = [&params.data, &grads.data, &s1];
    let spec = OptimExtSpec::Norm1(algo);
    let (kernel, extra) = kernel_for(
        OP,
        (spec.name(), &|| spec.build()),
        OptimExtSpec::Norm1Gs(algo),
        &partials_opts(opts),
    )?;
    let mut scalars = partials_args(&s);
    scalars.extend(extra);
    partials_with(dev, &kernel, n, scalars, &inputs)
}

/// The scale of a whole tensor from its partials: `norm_scale` with the threshold epsilon
/// `f32(hyper.eps)`.
///
/// # Errors
/// As [`norm_scale_eps`].
pub fn optim1_norm_scale(
    dev: &dyn Device,
    partials: &NormPartials,
    hyper: &Optim1Hyper,
    max_unorm: f64,
) -> Result<f32> {
    norm_scale_eps(dev, partials, max_unorm, hyper.eps as f32)
}

/// The RMSprop / Adagrad update of step `step` with the step multiplied by `scale`, in place:
/// the plain 32-bit kernel with `lr * scale` and `-lr * scale` (`f32` products).
///
/// # Errors
/// As [`optim1_norm_partials`]; [`Error::Invalid`] for a `scale` that is not finite and
/// `>= 0`.
#[allow(clippy::too_many_arguments)]
pub fn optim1_update_scaled_32bit(
    dev: &dyn Device,
    algo: Optim1Algo,
    params: &mut HostTensor,
    grads: &HostTensor,
    state1: &mut [f32],
    hyper: &Optim1Hyper,
    step: u32,
    scale: f32,
) -> Result<()> {
    let opts = GradOptions::default();
    optim1_update_scaled_32bit_opts(dev, algo, params, grads, state1, hyper, step, scale, &opts)
}

/// [`optim1_update_scaled_32bit`] with bitsandbytes' gradient options: the `_gs` kernel
/// (`rmsprop32_f32_gs` / `adagrad32_f32_gs`, [`crate::ops::optim1_step_32bit_opts`]) with `lr` and
/// `neg_lr` multiplied by `scale`.
///
/// # Errors
/// As [`optim1_update_scaled_32bit`]; [`Error::Invalid`] for a `gnorm_scale` outside `[0, 1]`.
#[allow(clippy::too_many_arguments)]
pub fn optim1_update_scaled_32bit_opts(
    dev: &dyn Device,
    algo: Optim1Algo,
    params: &mut HostTensor,
    grads: &HostTensor,
    state1: &mut [f32],
    hyper: &Optim1Hyper,
    step: u32,
    scale: f32,
    opts: &GradOptions,
) -> Result<()> {
    const OP: &str = "optim1_update_scaled_32bit";
    check_algo(OP, algo)?;
    check_scale(OP, scale)?;
    let (n, _) = prepare(OP, algo, StateBits::Bits32, params, grads)?;
    expect(OP, "state1", state1.len(), n as usize)?;
    let mut s = hyper.scalars(algo, step)?;
    s.lr *= scale;
    s.neg_lr *= scale;
    launch32(OP, dev, algo, params, grads, state1, &s, opts)
}

/// One whole-tensor RMSprop / Adagrad step with `max_unorm` (partials, scale, scaled update);
/// returns the scale.
///
/// # Errors
/// As the pieces.
#[allow(clippy::too_many_arguments)]
pub fn optim1_step_32bit_max_unorm(
    dev: &dyn Device,
    algo: Optim1Algo,
    params: &mut HostTensor,
    grads: &HostTensor,
    state1: &mut [f32],
    hyper: &Optim1Hyper,
    step: u32,
    max_unorm: f64,
) -> Result<f32> {
    let opts = GradOptions::default();
    optim1_step_32bit_max_unorm_opts(
        dev, algo, params, grads, state1, hyper, step, max_unorm, &opts,
    )
}

/// [`optim1_step_32bit_max_unorm`] with bitsandbytes' gradient options, passed to both the norm
/// partials and the update.
///
/// # Errors
/// As the pieces.
#[allow(clippy::too_many_arguments)]
pub fn optim1_step_32bit_max_unorm_opts(
    dev: &dyn Device,
    algo: Optim1Algo,
    params: &mut HostTensor,
    grads: &HostTensor,
    state1: &mut [f32],
    hyper: &Optim1Hyper,
    step: u32,
    max_unorm: f64,
    opts: &GradOptions,
) -> Result<f32> {
    let parts = optim1_norm_partials_opts(dev, algo, params, grads, state1, hyper, step, opts)?;
    let scale = optim1_norm_scale(dev, &parts, hyper, max_unorm)?;
    optim1_update_scaled_32bit_opts(dev, algo, params, grads, state1, hyper, step, scale, opts)?;
    Ok(scale)
}
