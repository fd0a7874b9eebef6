//! `max_unorm` steps of 32-bit RMSprop and Adagrad (bitsandbytes' `max_unorm` of
//! `Optimizer1State`), over any [`Device`]: the update-norm partials
//! ([`crate::optim_norm1`]), LAMB/LARS's scale kernel with the optimizer's `eps`
//! as the threshold epsilon, and the plain update kernel with `lr` and `neg_lr` multiplied by
//! the scale. As with LAMB/LARS the pieces are public, so a chunked caller gathers the partials
//! of every chunk, takes one scale, then updates chunk by chunk. Formulas:
//! `docs/optimizers.md`, section "max_unorm for RMSprop and Adagrad".

use crate::optim_norm1::Optim1NormArgs;
use crate::{Optim1Algo, Optim1Hyper, OptimExtSpec, StateBits};
use qforge_ir::dsl::FloatIn;
use qforge_ir::DType;

use crate::adam::host::{expect, partials_opts, variant, GradOptions};
use crate::ops::cached_typed;
use crate::optim1::host::{launch32, prepare};
use crate::optim_norm::host::NormPartials;
use crate::optim_norm::host::{blocks, check_scale, norm_scale_eps};
use qforge_runtime::HostTensor;
use qforge_runtime::{launch_typed, Device};
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
/// `opts` are bitsandbytes' gradient options ([`GradOptions`]; `GradOptions::default()` runs
/// the plain kernel): the gradient is multiplied by `opts.gnorm_scale` before any use
/// (`{algo}_norm_f32_gs`); `skip_zeros` does not apply to the norm (bitsandbytes'
/// precondition kernel takes none).
///
/// # Errors
/// [`Error::Invalid`] for another rule, an empty or non-f32 parameter, a gradient of another
/// dtype or shape, state of the wrong length, more than `2^31 - 1` elements, a `gnorm_scale`
/// outside `[0, 1]`; [`Error::Ir`] for invalid hyperparameters or step 0; any device error.
#[allow(clippy::too_many_arguments)]
pub fn optim1_norm_partials(
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
    let (n, _) = prepare(OP, algo, StateBits::Bits32, params, grads)?;
    expect(OP, "state1", state1.len(), n as usize)?;
    let s = hyper.scalars(algo, step)?;
    let opts = partials_opts(opts);
    let plain = OptimExtSpec::Norm1(algo).name();
    let (name, gs) = variant(OP, plain, OptimExtSpec::Norm1Gs(algo), &opts)?;
    let kernel = cached_typed(&name, || crate::optim_norm1::typed(algo, gs))?;
    let mut out = NormPartials::zeros(n as usize);
    launch_typed(
        dev,
        &kernel,
        &mut Optim1NormArgs {
            n,
            n_blocks: blocks(n),
            beta1: s.beta1,
            one_minus_beta1: s.one_minus_beta1,
            eps: s.eps,
            gnorm_scale: gs.then_some(opts.gnorm_scale),
            p: FloatIn {
                dtype: DType::F32,
                bytes: &params.data,
            },
            g: FloatIn {
                dtype: DType::F32,
                bytes: &grads.data,
            },
            state1,
            unorm_part: &mut out.unorm,
            pnorm_part: &mut out.pnorm,
        },
    )?;
    Ok(out)
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
/// `opts` are bitsandbytes' gradient options ([`GradOptions`]; `GradOptions::default()` runs
/// the plain kernel): non-default options run the `_gs` kernel (`rmsprop32_f32_gs` /
/// `adagrad32_f32_gs`, as [`crate::ops::optim1_step_32bit`]) with `lr` and `neg_lr`
/// multiplied by `scale`.
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
/// returns the scale. `opts` ([`GradOptions`]; `GradOptions::default()`: the plain kernels)
/// are passed to both the norm partials and the update.
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
    opts: &GradOptions,
) -> Result<f32> {
    let parts = optim1_norm_partials(dev, algo, params, grads, state1, hyper, step, opts)?;
    let scale = optim1_norm_scale(dev, &parts, hyper, max_unorm)?;
    optim1_update_scaled_32bit(dev, algo, params, grads, state1, hyper, step, scale, opts)?;
    Ok(scale)
}
