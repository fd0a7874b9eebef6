//! LAMB and LARS steps with 32-bit state (bitsandbytes' `LAMB` / `LAMB32bit` and `LARS` /
//! `LARS32bit`), over any [`Device`]. A step is three kernel launches
//! ([`crate::optim_norm`]): per-block norm partials, the trust-ratio scale (one
//! work item, fixed order), and the scaled update. The pieces are public so a caller that
//! processes a tensor in chunks of whole 256-element blocks (the optimizer API) can gather the
//! partials of every chunk, take one scale and then update chunk by chunk, bit-identically to
//! one whole-tensor [`lamb_step_32bit`] / [`lars_step_32bit`]. Formulas: `docs/optimizers.md`,
//! section "LAMB and LARS".

use crate::{LambHyper, LarsHyper, NormRule, OptimExtSpec, OptimNormSpec, OPTIM_BLOCKSIZE};
use qforge_ir::{Arg, DType, Scalar};

use crate::adam::host::{expect, kernel_for, param_grad_pair, GradOptions};
use crate::ops::{cached_kernel, count_u32, f32_le, le_f32, scalar_u32, AdamState32};
use qforge_runtime::Device;
use qforge_runtime::HostTensor;
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

/// The options a partials kernel honours: `gnorm_scale` only (bitsandbytes' precondition
/// kernels take no `skip_zeros`).
pub(crate) fn partials_opts(opts: &GradOptions) -> GradOptions {
    GradOptions {
        skip_zeros: false,
        ..*opts
    }
}

/// Launches a partials kernel (its `_gs` variant for a `gnorm_scale` other than 1) and returns
/// the two per-block arrays.
fn partials(
    op: &str,
    dev: &dyn Device,
    spec: OptimNormSpec,
    n: u32,
    mut scalars: Vec<Scalar>,
    inputs: &[&[u8]],
    opts: &GradOptions,
) -> Result<NormPartials> {
    let (kernel, extra) = kernel_for(
        op,
        (spec.name(), &|| spec.build()),
        OptimExtSpec::Norm(spec),
        &partials_opts(opts),
    )?;
    scalars.extend(extra);
    partials_with(dev, &kernel, n, scalars, inputs)
}

/// The update kernel of `spec` (its `_gs` variant for non-default options) and the scalars
/// `first` followed by the variant's.
fn update_kernel(
    op: &str,
    spec: OptimNormSpec,
    first: Vec<Scalar>,
    opts: &GradOptions,
) -> Result<(std::sync::Arc<qforge_ir::Kernel>, Vec<Scalar>)> {
    let (kernel, extra) = kernel_for(
        op,
        (spec.name(), &|| spec.build()),
        OptimExtSpec::Norm(spec),
        opts,
    )?;
    let mut scalars = first;
    scalars.extend(extra);
    Ok((kernel, scalars))
}

/// Launches a built update kernel: `(n, n_blocks, scalars.., buffers.., scale)`, the layout
/// every update-norm update kernel shares (`buffers`: params, grads, then the state in kernel
/// order).
pub(crate) fn update_with(
    dev: &dyn Device,
    kernel: &qforge_ir::Kernel,
    n: u32,
    scalars: Vec<Scalar>,
    buffers: Vec<Arg<'_>>,
    scale: f32,
) -> Result<()> {
    let sc = scale.to_le_bytes();
    let mut args = vec![scalar_u32(n), scalar_u32(n.div_ceil(OPTIM_BLOCKSIZE))];
    args.extend(scalars.into_iter().map(Arg::Scalar));
    args.extend(buffers);
    args.push(Arg::Read(&sc));
    dev.launch(kernel, &mut args)
}

/// Launches a built partials kernel (the layout of [`partials`]).
pub(crate) fn partials_with(
    dev: &dyn Device,
    kernel: &qforge_ir::Kernel,
    n: u32,
    scalars: Vec<Scalar>,
    inputs: &[&[u8]],
) -> Result<NormPartials> {
    let blocks = n.div_ceil(OPTIM_BLOCKSIZE);
    let mut up = vec![0u8; 4 * blocks as usize];
    let mut pp = vec![0u8; 4 * blocks as usize];
    let mut args = vec![scalar_u32(n), scalar_u32(blocks)];
    args.extend(scalars.into_iter().map(Arg::Scalar));
    args.extend(inputs.iter().map(|b| Arg::Read(b)));
    args.extend([Arg::Write(&mut up), Arg::Write(&mut pp)]);
    dev.launch(kernel, &mut args)?;
    Ok(NormPartials {
        unorm: le_f32(&up),
        pnorm: le_f32(&pp),
    })
}

/// The LAMB norm partials of step `step` (1-based) for a parameter, its gradient and its
/// 32-bit state before the step; nothing is modified.
///
/// # Errors
/// [`Error::Invalid`] for an empty or non-float parameter, a gradient of another dtype or
/// shape, state of the wrong length, more than `2^31 - 1` elements; [`Error::Ir`] for invalid
/// hyperparameters or step 0; any device error.
pub fn lamb_norm_partials(
    dev: &dyn Device,
    params: &HostTensor,
    grads: &HostTensor,
    state: &AdamState32,
    hyper: &LambHyper,
    step: u32,
) -> Result<NormPartials> {
    let opts = GradOptions::default();
    lamb_norm_partials_opts(dev, params, grads, state, hyper, step, &opts)
}

/// [`lamb_norm_partials`] with bitsandbytes' gradient options: the gradient is multiplied by
/// `opts.gnorm_scale` before any use (`lamb_norm_*_gs`); `skip_zeros` does not apply to the
/// norm (bitsandbytes' precondition kernel takes none).
///
/// # Errors
/// As [`lamb_norm_partials`]; [`Error::Invalid`] for a `gnorm_scale` outside `[0, 1]`.
pub fn lamb_norm_partials_opts(
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
    expect(OP, "state1", state.state1.len(), n as usize)?;
    expect(OP, "state2", state.state2.len(), n as usize)?;
    let s = hyper.scalars(step)?;
    let (s1, s2) = (f32_le(&state.state1), f32_le(&state.state2));
    let spec = OptimNormSpec::Partials {
        rule: NormRule::Lamb,
        dtype,
    };
    let inputs: [&[u8]; 4] = [&params.data, &grads.data, &s1, &s2];
    partials(OP, dev, spec, n, s.partials_args(), &inputs, opts)
}

/// The LARS norm partials of step `step` (1-based) for an `f32` parameter, its gradient and its
/// momentum before the step; nothing is modified.
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
) -> Result<NormPartials> {
    let opts = GradOptions::default();
    lars_norm_partials_opts(dev, params, grads, state1, hyper, step, &opts)
}

/// [`lars_norm_partials`] with bitsandbytes' gradient options (as
/// [`lamb_norm_partials_opts`]: `gnorm_scale` only).
///
/// # Errors
/// As [`lars_norm_partials`]; [`Error::Invalid`] for a `gnorm_scale` outside `[0, 1]`.
pub fn lars_norm_partials_opts(
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
    let s1 = f32_le(state1);
    let spec = OptimNormSpec::Partials {
        rule: NormRule::Lars,
        dtype: DType::F32,
    };
    let inputs: [&[u8]; 3] = [&params.data, &grads.data, &s1];
    partials(OP, dev, spec, n, s.partials_args(), &inputs, opts)
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
    let spec = OptimNormSpec::Scale;
    let kernel = cached_kernel(&spec.name(), || spec.build())?;
    let (up, pp) = (f32_le(&partials.unorm), f32_le(&partials.pnorm));
    let mut out = vec![0u8; 4];
    let mut args = vec![
        scalar_u32(nb),
        Arg::Scalar(Scalar::f32(max_unorm as f32)),
        Arg::Scalar(Scalar::f32(eps)),
        Arg::Read(&up),
        Arg::Read(&pp),
        Arg::Write(&mut out),
    ];
    dev.launch(&kernel, &mut args)?;
    Ok(f32::from_le_bytes([out[0], out[1], out[2], out[3]]))
}

/// The LAMB update of step `step` with a given `scale` (from [`norm_scale`]), in place: AdamW
/// (decoupled weight decay before the update) with the step multiplied by `scale`. Gradient
/// elements that are NaN or ±inf zero their moments and leave their parameter unchanged.
///
/// # Errors
/// As [`lamb_norm_partials`]; [`Error::Invalid`] for a `scale` that is not finite and `>= 0`.
pub fn lamb_update_32bit(
    dev: &dyn Device,
    params: &mut HostTensor,
    grads: &HostTensor,
    state: &mut AdamState32,
    hyper: &LambHyper,
    step: u32,
    scale: f32,
) -> Result<()> {
    let opts = GradOptions::default();
    lamb_update_32bit_opts(dev, params, grads, state, hyper, step, scale, &opts)
}

/// [`lamb_update_32bit`] with bitsandbytes' gradient options (`lamb32_*_gs`): the gradient is
/// multiplied by `opts.gnorm_scale` first, and with `skip_zeros` an element whose scaled
/// gradient is `±0` keeps its parameter and both moments (as [`crate::ops::adam_step_32bit_opts`]).
///
/// # Errors
/// As [`lamb_update_32bit`]; [`Error::Invalid`] for a `gnorm_scale` outside `[0, 1]`.
#[allow(clippy::too_many_arguments)]
pub fn lamb_update_32bit_opts(
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
    expect(OP, "state1", state.state1.len(), n as usize)?;
    expect(OP, "state2", state.state2.len(), n as usize)?;
    let s = hyper.scalars(step)?;
    let spec = OptimNormSpec::Update {
        rule: NormRule::Lamb,
        dtype,
    };
    let (kernel, scalars) = update_kernel(OP, spec, s.update_args(), opts)?;
    let (mut s1, mut s2) = (f32_le(&state.state1), f32_le(&state.state2));
    let buffers = vec![
        Arg::Write(&mut params.data),
        Arg::Read(&grads.data),
        Arg::Write(&mut s1),
        Arg::Write(&mut s2),
    ];
    update_with(dev, &kernel, n, scalars, buffers, scale)?;
    state.state1 = le_f32(&s1);
    state.state2 = le_f32(&s2);
    Ok(())
}

/// The LARS update of step `step` with a given `scale`, in place: SGD with momentum (coupled
/// weight decay, the gradient itself as momentum on step 1) with the step multiplied by
/// `scale`. Non-finite gradient elements zero their momentum and leave their parameter
/// unchanged.
///
/// # Errors
/// As [`lars_norm_partials`]; [`Error::Invalid`] for a `scale` that is not finite and `>= 0`.
pub fn lars_update_32bit(
    dev: &dyn Device,
    params: &mut HostTensor,
    grads: &HostTensor,
    state1: &mut [f32],
    hyper: &LarsHyper,
    step: u32,
    scale: f32,
) -> Result<()> {
    let opts = GradOptions::default();
    lars_update_32bit_opts(dev, params, grads, state1, hyper, step, scale, &opts)
}

/// [`lars_update_32bit`] with bitsandbytes' gradient options (`lars32_f32_gs`): the gradient
/// is multiplied by `opts.gnorm_scale` first, and with `skip_zeros` an element whose scaled
/// gradient after coupled weight decay is `±0` keeps its parameter and momentum (as
/// [`crate::ops::optim1_step_32bit_opts`] for SGD).
///
/// # Errors
/// As [`lars_update_32bit`]; [`Error::Invalid`] for a `gnorm_scale` outside `[0, 1]`.
#[allow(clippy::too_many_arguments)]
pub fn lars_update_32bit_opts(
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
    let (kernel, scalars) = update_kernel(OP, spec, s.update_args(), opts)?;
    let mut s1 = f32_le(state1);
    let buffers = vec![
        Arg::Write(&mut params.data),
        Arg::Read(&grads.data),
        Arg::Write(&mut s1),
    ];
    update_with(dev, &kernel, n, scalars, buffers, scale)?;
    state1.copy_from_slice(&le_f32(&s1));
    Ok(())
}

/// One whole-tensor LAMB step (partials, scale, update); returns the scale it applied.
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
) -> Result<f32> {
    let opts = GradOptions::default();
    lamb_step_32bit_opts(dev, params, grads, state, hyper, step, &opts)
}

/// [`lamb_step_32bit`] with bitsandbytes' gradient options, passed to both the norm partials
/// ([`lamb_norm_partials_opts`]) and the update ([`lamb_update_32bit_opts`]).
///
/// # Errors
/// As [`lamb_update_32bit_opts`].
pub fn lamb_step_32bit_opts(
    dev: &dyn Device,
    params: &mut HostTensor,
    grads: &HostTensor,
    state: &mut AdamState32,
    hyper: &LambHyper,
    step: u32,
    opts: &GradOptions,
) -> Result<f32> {
    let parts = lamb_norm_partials_opts(dev, params, grads, state, hyper, step, opts)?;
    let scale = norm_scale(dev, &parts, hyper.max_unorm)?;
    lamb_update_32bit_opts(dev, params, grads, state, hyper, step, scale, opts)?;
    Ok(scale)
}

/// One whole-tensor LARS step (partials, scale, update); returns the scale it applied.
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
) -> Result<f32> {
    let opts = GradOptions::default();
    lars_step_32bit_opts(dev, params, grads, state1, hyper, step, &opts)
}

/// [`lars_step_32bit`] with bitsandbytes' gradient options, passed to both the norm partials
/// ([`lars_norm_partials_opts`]) and the update ([`lars_update_32bit_opts`]).
///
/// # Errors
/// As [`lars_update_32bit_opts`].
pub fn lars_step_32bit_opts(
    dev: &dyn Device,
    params: &mut HostTensor,
    grads: &HostTensor,
    state1: &mut [f32],
    hyper: &LarsHyper,
    step: u32,
    opts: &GradOptions,
) -> Result<f32> {
    let parts = lars_norm_partials_opts(dev, params, grads, state1, hyper, step, opts)?;
    let scale = norm_scale(dev, &parts, hyper.max_unorm)?;
    lars_update_32bit_opts(dev, params, grads, state1, hyper, step, scale, opts)?;
    Ok(scale)
}
