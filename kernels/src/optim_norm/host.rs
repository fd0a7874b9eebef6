//! LAMB and LARS steps with 32-bit state (bitsandbytes' `LAMB` / `LAMB32bit` and `LARS` /
//! `LARS32bit`), over any [`Device`]. A step is three kernel launches
//! ([`crate::optim_norm`]): per-block norm partials, the trust-ratio scale (one
//! work item, fixed order), and the scaled update. The pieces are public so a caller that
//! processes a tensor in chunks of whole 256-element blocks (the optimizer API) can gather the
//! partials of every chunk, take one scale and then update chunk by chunk, bit-identically to
//! one whole-tensor [`lamb_step_32bit`] / [`lars_step_32bit`]. Formulas: `docs/optimizers.md`,
//! section "LAMB and LARS".

use crate::optim_norm::kernel::{lamb32, lamb_norm, lars32, lars_norm, optim_norm_scale};
use crate::optim_norm::{Lamb32Args, LambNormArgs, Lars32Args, LarsNormArgs, OptimNormScaleArgs};
use crate::{LambHyper, LarsHyper, NormRule, OptimExtSpec, OptimNormSpec, OPTIM_BLOCKSIZE};
use qforge_ir::dsl::{FloatIn, FloatOut};
use qforge_ir::DType;

use crate::adam::host::{expect, param_grad_pair, partials_opts, variant, GradOptions};
use crate::ops::{cached_typed, count_u32, AdamState32};
use qforge_runtime::HostTensor;
use qforge_runtime::{launch_typed, Device};
use qforge_runtime::{Error, Result};

/// Per-block partial sums of one tensor (or chunk): `unorm[b]` the sum of squared updates and
/// `pnorm[b]` the sum of squared parameters of block `b` (256 elements, order `Strided(8)`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NormPartials {
    /// Sums of squared update elements, one per block.
    pub unorm: Vec<f32>,
    /// Sums of squared parameter elements, one per block.
    pub pnorm: Vec<f32>,
}

impl NormPartials {
    /// Zeros for a tensor of `n` elements (one entry per block).
    pub fn zeros(n: usize) -> NormPartials {
        let blocks = n.div_ceil(OPTIM_BLOCKSIZE as usize);
        NormPartials {
            unorm: vec![0.0; blocks],
            pnorm: vec![0.0; blocks],
        }
    }
}

/// Checks a scale from [`norm_scale`]: finite and `>= 0` (the kernel yields values in `[0, 1]`).
pub(crate) fn check_scale(op: &str, scale: f32) -> Result<()> {
    if scale.is_finite() && scale >= 0.0 {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "{op}: scale = {scale} is invalid: it must be finite and >= 0 (norm_scale gives [0, 1])"
        )))
    }
}

/// Checks the pair for `rule`; returns `n` and the parameter dtype.
pub(crate) fn prepare(
    op: &str,
    rule: NormRule,
    params: &HostTensor,
    grads: &HostTensor,
) -> Result<(u32, DType)> {
    let n = param_grad_pair(op, params, grads)?;
    if !rule.param_dtypes().contains(&params.dtype) {
        return Err(Error::Invalid(format!(
            "{op}: {} takes f32 parameters only, got {}",
            rule.name(),
            params.dtype
        )));
    }
    Ok((n, params.dtype))
}

/// The number of [`OPTIM_BLOCKSIZE`]-element blocks of `n` elements.
pub(crate) fn blocks(n: u32) -> u32 {
    n.div_ceil(OPTIM_BLOCKSIZE)
}

/// The LAMB norm partials of step `step` (1-based) for a parameter, its gradient and its
/// 32-bit state before the step; nothing is modified.
///
/// `opts` are bitsandbytes' gradient options ([`GradOptions`]; `GradOptions::default()` runs
/// the plain kernel): the gradient is multiplied by `opts.gnorm_scale` before any use
/// (`lamb_norm_*_gs`); `skip_zeros` does not apply to the norm (bitsandbytes' precondition
/// kernel takes none).
///
/// # Errors
/// [`Error::Invalid`] for an empty or non-float parameter, a gradient of another dtype or
/// shape, state of the wrong length, more than `2^31 - 1` elements, a `gnorm_scale` outside
/// `[0, 1]`; [`Error::Ir`] for invalid hyperparameters or step 0; any device error.
pub fn lamb_norm_partials(
    dev: &dyn Device,
    params: &HostTensor,
    grads: &HostTensor,
    state: &AdamState32,
    hyper: &LambHyper,
    step: u32,
    opts: &GradOptions,
) -> Result<NormPartials> {
    const OP: &str = "lamb_norm_partials";
    let (n, dtype) = prepare(OP, NormRule::Lamb, params, grads)?;
    state.check(OP, n)?;
    let s = hyper.scalars(step)?;
    let spec = OptimNormSpec::Partials {
        rule: NormRule::Lamb,
        dtype,
    };
    let opts = partials_opts(opts);
    let (name, gs) = variant(OP, spec.name(), OptimExtSpec::Norm(spec), &opts)?;
    let kernel = cached_typed(&name, || lamb_norm(dtype, &name, gs))?;
    let mut out = NormPartials::zeros(n as usize);
    launch_typed(
        dev,
        &kernel,
        &mut LambNormArgs {
            n,
            n_blocks: blocks(n),
            beta1: s.beta1,
            one_minus_beta1: s.one_minus_beta1,
            beta2: s.beta2,
            one_minus_beta2: s.one_minus_beta2,
            inv_c1: s.inv_c1,
            inv_c2: s.inv_c2,
            eps: s.eps,
            gnorm_scale: gs.then_some(opts.gnorm_scale),
            p: FloatIn {
                dtype,
                bytes: &params.data,
            },
            g: FloatIn {
                dtype,
                bytes: &grads.data,
            },
            state1: &state.state1,
            state2: &state.state2,
            unorm_part: &mut out.unorm,
            pnorm_part: &mut out.pnorm,
        },
    )?;
    Ok(out)
}

/// The LARS norm partials of step `step` (1-based) for an `f32` parameter, its gradient and its
/// momentum before the step; nothing is modified. `opts` as for [`lamb_norm_partials`]
/// (`gnorm_scale` only; `GradOptions::default()` runs the plain kernel).
///
/// # Errors
/// As [`lamb_norm_partials`]; the parameter must be `f32`.
pub fn lars_norm_partials(
    dev: &dyn Device,
    params: &HostTensor,
    grads: &HostTensor,
    state1: &[f32],
    hyper: &LarsHyper,
    step: u32,
    opts: &GradOptions,
) -> Result<NormPartials> {
    const OP: &str = "lars_norm_partials";
    let (n, _) = prepare(OP, NormRule::Lars, params, grads)?;
    expect(OP, "state1", state1.len(), n as usize)?;
    let s = hyper.scalars(step)?;
    let spec = OptimNormSpec::Partials {
        rule: NormRule::Lars,
        dtype: DType::F32,
    };
    let opts = partials_opts(opts);
    let (name, gs) = variant(OP, spec.name(), OptimExtSpec::Norm(spec), &opts)?;
    let kernel = cached_typed(&name, || lars_norm(&name, gs))?;
    let mut out = NormPartials::zeros(n as usize);
    launch_typed(
        dev,
        &kernel,
        &mut LarsNormArgs {
            n,
            n_blocks: blocks(n),
            first: s.first,
            momentum: s.momentum,
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

/// The trust-ratio scale of a whole tensor from its partials (all blocks, in order):
/// `max_unorm > 0 && unorm > max_unorm * pnorm ? max_unorm * pnorm / unorm : 1` with
/// `unorm`, `pnorm` the square roots of the sequential sums (the `optim_norm_scale` kernel).
///
/// # Errors
/// [`Error::Invalid`] for empty partials, arrays of different lengths, more than `2^31 - 1`
/// blocks, or a `max_unorm` that is not finite and `>= 0`; any device error.
pub fn norm_scale(dev: &dyn Device, partials: &NormPartials, max_unorm: f64) -> Result<f32> {
    norm_scale_eps(dev, partials, max_unorm, 0.0)
}

/// [`norm_scale`] with a threshold epsilon: `thr = max_unorm * pnorm + eps` (bitsandbytes'
/// one-state kernels add the optimizer's `eps`; LARS passes 0).
///
/// # Errors
/// As [`norm_scale`]; [`Error::Invalid`] for an `eps` that is not finite and `>= 0`.
pub fn norm_scale_eps(
    dev: &dyn Device,
    partials: &NormPartials,
    max_unorm: f64,
    eps: f32,
) -> Result<f32> {
    const OP: &str = "norm_scale";
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(Error::Invalid(format!(
            "{OP}: eps = {eps} is invalid: it must be finite and >= 0"
        )));
    }
    let blocks = partials.unorm.len();
    if blocks == 0 || partials.pnorm.len() != blocks {
        return Err(Error::Invalid(format!(
            "{OP}: the partials must be non-empty and of one length, got {} and {}",
            blocks,
            partials.pnorm.len()
        )));
    }
    if !(max_unorm.is_finite() && max_unorm >= 0.0) {
        return Err(Error::Invalid(format!(
            "{OP}: max_unorm = {max_unorm} is invalid: it must be finite and >= 0"
        )));
    }
    let nb = count_u32(OP, "the partials", blocks)?;
    let kernel = cached_typed(&OptimNormSpec::Scale.name(), optim_norm_scale)?;
    let mut scale = [0.0f32];
    launch_typed(
        dev,
        &kernel,
        &mut OptimNormScaleArgs {
            n_blocks: nb,
            max_unorm: max_unorm as f32,
            eps,
            unorm_part: &partials.unorm,
            pnorm_part: &partials.pnorm,
            scale: &mut scale,
        },
    )?;
    Ok(scale[0])
}

/// The LAMB update of step `step` with a given `scale` (from [`norm_scale`]), in place: AdamW
/// (decoupled weight decay before the update) with the step multiplied by `scale`. Gradient
/// elements that are NaN or ±inf zero their moments and leave their parameter unchanged.
///
/// `opts` are bitsandbytes' gradient options ([`GradOptions`]; `GradOptions::default()` runs
/// the plain kernel; otherwise `lamb32_*_gs`): the gradient is multiplied by
/// `opts.gnorm_scale` first, and with `skip_zeros` an element whose scaled gradient is `±0`
/// keeps its parameter and both moments (as [`crate::ops::adam_step_32bit`]).
///
/// # Errors
/// As [`lamb_norm_partials`]; [`Error::Invalid`] for a `scale` that is not finite and `>= 0`.
#[allow(clippy::too_many_arguments)]
pub fn lamb_update_32bit(
    dev: &dyn Device,
    params: &mut HostTensor,
    grads: &HostTensor,
    state: &mut AdamState32,
    hyper: &LambHyper,
    step: u32,
    scale: f32,
    opts: &GradOptions,
) -> Result<()> {
    const OP: &str = "lamb_update_32bit";
    check_scale(OP, scale)?;
    let (n, dtype) = prepare(OP, NormRule::Lamb, params, grads)?;
    state.check(OP, n)?;
    let s = hyper.scalars(step)?;
    let spec = OptimNormSpec::Update {
        rule: NormRule::Lamb,
        dtype,
    };
    let (name, gs) = variant(OP, spec.name(), OptimExtSpec::Norm(spec), opts)?;
    let kernel = cached_typed(&name, || lamb32(dtype, &name, gs))?;
    launch_typed(
        dev,
        &kernel,
        &mut Lamb32Args {
            n,
            n_blocks: blocks(n),
            beta1: s.beta1,
            one_minus_beta1: s.one_minus_beta1,
            beta2: s.beta2,
            one_minus_beta2: s.one_minus_beta2,
            decay: s.decay,
            step_size: s.step_size,
            eps_c2: s.eps_c2,
            gnorm_scale: gs.then_some(opts.gnorm_scale),
            skip_zeros: gs.then_some(u32::from(opts.skip_zeros)),
            p: FloatOut {
                dtype,
                bytes: &mut params.data,
            },
            g: FloatIn {
                dtype,
                bytes: &grads.data,
            },
            state1: &mut state.state1,
            state2: &mut state.state2,
            scale: &[scale],
        },
    )?;
    Ok(())
}

/// The LARS update of step `step` with a given `scale`, in place: SGD with momentum (coupled
/// weight decay, the gradient itself as momentum on step 1) with the step multiplied by
/// `scale`. Non-finite gradient elements zero their momentum and leave their parameter
/// unchanged.
///
/// `opts` are bitsandbytes' gradient options ([`GradOptions`]; `GradOptions::default()` runs
/// the plain kernel; otherwise `lars32_f32_gs`): the gradient is multiplied by
/// `opts.gnorm_scale` first, and with `skip_zeros` an element whose scaled gradient after
/// coupled weight decay is `±0` keeps its parameter and momentum (as
/// [`crate::ops::optim1_step_32bit`] for SGD).
///
/// # Errors
/// As [`lars_norm_partials`]; [`Error::Invalid`] for a `scale` that is not finite and `>= 0`.
#[allow(clippy::too_many_arguments)]
pub fn lars_update_32bit(
    dev: &dyn Device,
    params: &mut HostTensor,
    grads: &HostTensor,
    state1: &mut [f32],
    hyper: &LarsHyper,
    step: u32,
    scale: f32,
    opts: &GradOptions,
) -> Result<()> {
    const OP: &str = "lars_update_32bit";
    check_scale(OP, scale)?;
    let (n, _) = prepare(OP, NormRule::Lars, params, grads)?;
    expect(OP, "state1", state1.len(), n as usize)?;
    let s = hyper.scalars(step)?;
    let spec = OptimNormSpec::Update {
        rule: NormRule::Lars,
        dtype: DType::F32,
    };
    let (name, gs) = variant(OP, spec.name(), OptimExtSpec::Norm(spec), opts)?;
    let kernel = cached_typed(&name, || lars32(&name, gs))?;
    launch_typed(
        dev,
        &kernel,
        &mut Lars32Args {
            n,
            n_blocks: blocks(n),
            first: s.first,
            momentum: s.momentum,
            weight_decay: s.weight_decay,
            neg_lr: s.neg_lr,
            gnorm_scale: gs.then_some(opts.gnorm_scale),
            skip_zeros: gs.then_some(u32::from(opts.skip_zeros)),
            p: FloatOut {
                dtype: DType::F32,
                bytes: &mut params.data,
            },
            g: FloatIn {
                dtype: DType::F32,
                bytes: &grads.data,
            },
            state1,
            scale: &[scale],
        },
    )?;
    Ok(())
}

/// One whole-tensor LAMB step (partials, scale, update); returns the scale it applied. `opts`
/// ([`GradOptions`]; `GradOptions::default()`: the plain kernels) are passed to both the norm
/// partials ([`lamb_norm_partials`]) and the update ([`lamb_update_32bit`]).
///
/// # Errors
/// As [`lamb_norm_partials`].
pub fn lamb_step_32bit(
    dev: &dyn Device,
    params: &mut HostTensor,
    grads: &HostTensor,
    state: &mut AdamState32,
    hyper: &LambHyper,
    step: u32,
    opts: &GradOptions,
) -> Result<f32> {
    let parts = lamb_norm_partials(dev, params, grads, state, hyper, step, opts)?;
    let scale = norm_scale(dev, &parts, hyper.max_unorm)?;
    lamb_update_32bit(dev, params, grads, state, hyper, step, scale, opts)?;
    Ok(scale)
}

/// One whole-tensor LARS step (partials, scale, update); returns the scale it applied. `opts`
/// ([`GradOptions`]; `GradOptions::default()`: the plain kernels) are passed to both the norm
/// partials ([`lars_norm_partials`]) and the update ([`lars_update_32bit`]).
///
/// # Errors
/// As [`lars_norm_partials`].
pub fn lars_step_32bit(
    dev: &dyn Device,
    params: &mut HostTensor,
    grads: &HostTensor,
    state1: &mut [f32],
    hyper: &LarsHyper,
    step: u32,
    opts: &GradOptions,
) -> Result<f32> {
    let parts = lars_norm_partials(dev, params, grads, state1, hyper, step, opts)?;
    let scale = norm_scale(dev, &parts, hyper.max_unorm)?;
    lars_update_32bit(dev, params, grads, state1, hyper, step, scale, opts)?;
    Ok(scale)
}
