//! LAMB and LARS steps with blockwise 8-bit state (qforge's 8-bit optimizer state: blocks of
//! 256 elements, the 8-bit AdamW / SGD-momentum layout), over any [`Device`]. A step is three
//! kernel launches ([`crate::optim_norm8`]): per-block norm partials from the
//! 8-bit state, the trust-ratio scale ([`norm_scale`], shared with 32-bit state), and the
//! scaled 8-bit update. As for 32-bit state the pieces are public, so a caller that processes a
//! tensor in chunks of whole blocks (the optimizer API) gathers the partials of every chunk,
//! takes one scale and updates chunk by chunk, bit-identically to one whole-tensor
//! [`lamb_step_8bit`] / [`lars_step_8bit`]. Formulas: `docs/optimizers.md`, section "8-bit LAMB
//! and LARS". The state is not bitsandbytes' `LAMB8bit` / `LARS8bit` state (non-blockwise
//! there).

use crate::{LambHyper, LarsHyper, NormRule, OptimExtSpec, OptimNorm8Spec, OPTIM_BLOCKSIZE};
use qforge_ir::{Arg, DType, Scalar};

use crate::adam::host::{expect, kernel_for, GradOptions};
use crate::ops::{f32_le, le_f32};
use crate::ops::{norm_scale, AdamState8, NormPartials, Optim1State8};
use crate::optim_norm::host::{check_scale, partials_opts, partials_with, prepare, update_with};
use qforge_runtime::Device;
use qforge_runtime::HostTensor;
use qforge_runtime::Result;

/// Checks the lengths of an 8-bit state for `n` elements: codes per element, absmax per block.
fn expect_state8(
    op: &str,
    n: u32,
    codes: &[(&str, usize)],
    absmax: &[(&str, usize)],
) -> Result<()> {
    for (what, len) in codes {
        expect(op, what, *len, n as usize)?;
    }
    let blocks = n.div_ceil(OPTIM_BLOCKSIZE) as usize;
    for (what, len) in absmax {
        expect(op, what, *len, blocks)?;
    }
    Ok(())
}

fn check_adam8(op: &str, n: u32, s: &AdamState8) -> Result<()> {
    expect_state8(
        op,
        n,
        &[("state1", s.state1.len()), ("state2", s.state2.len())],
        &[("absmax1", s.absmax1.len()), ("absmax2", s.absmax2.len())],
    )
}

fn check_one8(op: &str, n: u32, s: &Optim1State8) -> Result<()> {
    expect_state8(
        op,
        n,
        &[("state1", s.state1.len())],
        &[("absmax1", s.absmax1.len())],
    )
}

/// The kernel of `spec` (its `_gs` variant for non-default `opts`) and the extra scalars.
fn kernel8(
    op: &str,
    spec: OptimNorm8Spec,
    opts: &GradOptions,
) -> Result<(std::sync::Arc<qforge_ir::Kernel>, Vec<Scalar>)> {
    kernel_for(
        op,
        (spec.name(), &|| spec.build()),
        OptimExtSpec::Norm8(spec),
        opts,
    )
}

/// The 8-bit LAMB norm partials of step `step` (1-based) for a parameter, its gradient and its
/// 8-bit state before the step; nothing is modified.
///
/// # Errors
/// [`crate::Error::Invalid`] for an empty or non-float parameter, a gradient of another dtype
/// or shape, state of the wrong length (codes per element, absmax per 256-element block), more
/// than `2^31 - 1` elements; [`crate::Error::Ir`] for invalid hyperparameters or step 0; any
/// device error.
pub fn lamb8_norm_partials(
    dev: &dyn Device,
    params: &HostTensor,
    grads: &HostTensor,
    state: &AdamState8,
    hyper: &LambHyper,
    step: u32,
) -> Result<NormPartials> {
    let opts = GradOptions::default();
    lamb8_norm_partials_opts(dev, params, grads, state, hyper, step, &opts)
}

/// [`lamb8_norm_partials`] with bitsandbytes' gradient options: the gradient is multiplied by
/// `opts.gnorm_scale` before any use (`lamb8_norm_*_gs`); `skip_zeros` does not apply to the
/// norm.
///
/// # Errors
/// As [`lamb8_norm_partials`]; [`crate::Error::Invalid`] for a `gnorm_scale` outside `[0, 1]`.
pub fn lamb8_norm_partials_opts(
    dev: &dyn Device,
    params: &HostTensor,
    grads: &HostTensor,
    state: &AdamState8,
    hyper: &LambHyper,
    step: u32,
    opts: &GradOptions,
) -> Result<NormPartials> {
    const OP: &str = "lamb8_norm_partials";
    let (n, dtype) = prepare(OP, NormRule::Lamb, params, grads)?;
    check_adam8(OP, n, state)?;
    let s = hyper.scalars(step)?;
    let spec = OptimNorm8Spec::Partials {
        rule: NormRule::Lamb,
        dtype,
    };
    let (kernel, extra) = kernel8(OP, spec, &partials_opts(opts))?;
    let mut scalars = s.partials_args();
    scalars.extend(extra);
    let (a1, a2) = (f32_le(&state.absmax1), f32_le(&state.absmax2));
    let inputs: [&[u8]; 6] = [
        &params.data,
        &grads.data,
        &state.state1,
        &a1,
        &state.state2,
        &a2,
    ];
    partials_with(dev, &kernel, n, scalars, &inputs)
}

/// The 8-bit LARS norm partials of step `step` (1-based) for an `f32` parameter, its gradient
/// and its 8-bit momentum before the step; nothing is modified.
///
/// # Errors
/// As [`lamb8_norm_partials`]; the parameter must be `f32`.
pub fn lars8_norm_partials(
    dev: &dyn Device,
    params: &HostTensor,
    grads: &HostTensor,
    state: &Optim1State8,
    hyper: &LarsHyper,
    step: u32,
) -> Result<NormPartials> {
    let opts = GradOptions::default();
    lars8_norm_partials_opts(dev, params, grads, state, hyper, step, &opts)
}

/// [`lars8_norm_partials`] with bitsandbytes' gradient options (`gnorm_scale` only, as
/// [`lamb8_norm_partials_opts`]).
///
/// # Errors
/// As [`lars8_norm_partials`]; [`crate::Error::Invalid`] for a `gnorm_scale` outside `[0, 1]`.
pub fn lars8_norm_partials_opts(
    dev: &dyn Device,
    params: &HostTensor,
    grads: &HostTensor,
    state: &Optim1State8,
    hyper: &LarsHyper,
    step: u32,
    opts: &GradOptions,
) -> Result<NormPartials> {
    const OP: &str = "lars8_norm_partials";
    let (n, _) = prepare(OP, NormRule::Lars, params, grads)?;
    check_one8(OP, n, state)?;
    let s = hyper.scalars(step)?;
    let spec = OptimNorm8Spec::Partials {
        rule: NormRule::Lars,
        dtype: DType::F32,
    };
    let (kernel, extra) = kernel8(OP, spec, &partials_opts(opts))?;
    let mut scalars = s.partials_args();
    scalars.extend(extra);
    let a1 = f32_le(&state.absmax1);
    let inputs: [&[u8]; 4] = [&params.data, &grads.data, &state.state1, &a1];
    partials_with(dev, &kernel, n, scalars, &inputs)
}

/// The 8-bit LAMB update of step `step` with a given `scale` (from [`norm_scale`]), in place:
/// the 8-bit AdamW step (decoupled weight decay before the update) with the step multiplied by
/// `scale`, the moments requantized per block. Gradient elements that are NaN or ±inf zero
/// their moments and leave their parameter unchanged.
///
/// # Errors
/// As [`lamb8_norm_partials`]; [`crate::Error::Invalid`] for a `scale` that is not finite and
/// `>= 0`.
pub fn lamb_update_8bit(
    dev: &dyn Device,
    params: &mut HostTensor,
    grads: &HostTensor,
    state: &mut AdamState8,
    hyper: &LambHyper,
    step: u32,
    scale: f32,
) -> Result<()> {
    let opts = GradOptions::default();
    lamb_update_8bit_opts(dev, params, grads, state, hyper, step, scale, &opts)
}

/// [`lamb_update_8bit`] with bitsandbytes' gradient options (`lamb8bit_*_gs`): the gradient
/// is multiplied by `opts.gnorm_scale` first; `skip_zeros` is ignored, as for
/// [`crate::ops::adam_step_8bit_opts`] (bitsandbytes' blockwise 8-bit two-state kernel ignores it).
///
/// # Errors
/// As [`lamb_update_8bit`]; [`crate::Error::Invalid`] for a `gnorm_scale` outside `[0, 1]`.
#[allow(clippy::too_many_arguments)]
pub fn lamb_update_8bit_opts(
    dev: &dyn Device,
    params: &mut HostTensor,
    grads: &HostTensor,
    state: &mut AdamState8,
    hyper: &LambHyper,
    step: u32,
    scale: f32,
    opts: &GradOptions,
) -> Result<()> {
    const OP: &str = "lamb_update_8bit";
    check_scale(OP, scale)?;
    let (n, dtype) = prepare(OP, NormRule::Lamb, params, grads)?;
    check_adam8(OP, n, state)?;
    let mut scalars = hyper.update8_args(step)?;
    let spec = OptimNorm8Spec::Update {
        rule: NormRule::Lamb,
        dtype,
    };
    let (kernel, extra) = kernel8(OP, spec, &partials_opts(opts))?;
    scalars.extend(extra);
    let (mut a1, mut a2) = (f32_le(&state.absmax1), f32_le(&state.absmax2));
    let buffers = vec![
        Arg::Write(&mut params.data),
        Arg::Read(&grads.data),
        Arg::Write(&mut state.state1),
        Arg::Write(&mut a1),
        Arg::Write(&mut state.state2),
        Arg::Write(&mut a2),
    ];
    update_with(dev, &kernel, n, scalars, buffers, scale)?;
    state.absmax1 = le_f32(&a1);
    state.absmax2 = le_f32(&a2);
    Ok(())
}

/// The 8-bit LARS update of step `step` with a given `scale`, in place: the 8-bit SGD-momentum
/// step (coupled weight decay, the gradient itself as momentum on step 1) with the step
/// multiplied by `scale`, the momentum requantized per block. Non-finite gradient elements zero
/// their momentum and leave their parameter unchanged.
///
/// # Errors
/// As [`lars8_norm_partials`]; [`crate::Error::Invalid`] for a `scale` that is not finite and
/// `>= 0`.
pub fn lars_update_8bit(
    dev: &dyn Device,
    params: &mut HostTensor,
    grads: &HostTensor,
    state: &mut Optim1State8,
    hyper: &LarsHyper,
    step: u32,
    scale: f32,
) -> Result<()> {
    let opts = GradOptions::default();
    lars_update_8bit_opts(dev, params, grads, state, hyper, step, scale, &opts)
}

/// [`lars_update_8bit`] with bitsandbytes' gradient options (`lars8bit_f32_gs`): the gradient
/// is multiplied by `opts.gnorm_scale` first, and with `skip_zeros` an element whose raw
/// gradient is `±0` keeps its parameter and its dequantized momentum (as
/// [`crate::ops::optim1_step_8bit_opts`] for SGD).
///
/// # Errors
/// As [`lars_update_8bit`]; [`crate::Error::Invalid`] for a `gnorm_scale` outside `[0, 1]`.
#[allow(clippy::too_many_arguments)]
pub fn lars_update_8bit_opts(
    dev: &dyn Device,
    params: &mut HostTensor,
    grads: &HostTensor,
    state: &mut Optim1State8,
    hyper: &LarsHyper,
    step: u32,
    scale: f32,
    opts: &GradOptions,
) -> Result<()> {
    const OP: &str = "lars_update_8bit";
    check_scale(OP, scale)?;
    let (n, _) = prepare(OP, NormRule::Lars, params, grads)?;
    check_one8(OP, n, state)?;
    let mut scalars = hyper.update8_args(step)?;
    let spec = OptimNorm8Spec::Update {
        rule: NormRule::Lars,
        dtype: DType::F32,
    };
    let (kernel, extra) = kernel8(OP, spec, opts)?;
    scalars.extend(extra);
    let mut a1 = f32_le(&state.absmax1);
    let buffers = vec![
        Arg::Write(&mut params.data),
        Arg::Read(&grads.data),
        Arg::Write(&mut state.state1),
        Arg::Write(&mut a1),
    ];
    update_with(dev, &kernel, n, scalars, buffers, scale)?;
    state.absmax1 = le_f32(&a1);
    Ok(())
}

/// One whole-tensor 8-bit LAMB step (partials, scale, update); returns the scale it applied.
///
/// # Errors
/// As [`lamb8_norm_partials`].
pub fn lamb_step_8bit(
    dev: &dyn Device,
    params: &mut HostTensor,
    grads: &HostTensor,
    state: &mut AdamState8,
    hyper: &LambHyper,
    step: u32,
) -> Result<f32> {
    let opts = GradOptions::default();
    lamb_step_8bit_opts(dev, params, grads, state, hyper, step, &opts)
}

/// [`lamb_step_8bit`] with bitsandbytes' gradient options, passed to both the norm partials
/// and the update.
///
/// # Errors
/// As [`lamb_update_8bit_opts`].
pub fn lamb_step_8bit_opts(
    dev: &dyn Device,
    params: &mut HostTensor,
    grads: &HostTensor,
    state: &mut AdamState8,
    hyper: &LambHyper,
    step: u32,
    opts: &GradOptions,
) -> Result<f32> {
    let parts = lamb8_norm_partials_opts(dev, params, grads, state, hyper, step, opts)?;
    let scale = norm_scale(dev, &parts, hyper.max_unorm)?;
    lamb_update_8bit_opts(dev, params, grads, state, hyper, step, scale, opts)?;
    Ok(scale)
}

/// One whole-tensor 8-bit LARS step (partials, scale, update); returns the scale it applied.
///
/// # Errors
/// As [`lars8_norm_partials`].
pub fn lars_step_8bit(
    dev: &dyn Device,
    params: &mut HostTensor,
    grads: &HostTensor,
    state: &mut Optim1State8,
    hyper: &LarsHyper,
    step: u32,
) -> Result<f32> {
    let opts = GradOptions::default();
    lars_step_8bit_opts(dev, params, grads, state, hyper, step, &opts)
}

/// [`lars_step_8bit`] with bitsandbytes' gradient options, passed to both the norm partials
/// and the update.
///
/// # Errors
/// As [`lars_update_8bit_opts`].
pub fn lars_step_8bit_opts(
    dev: &dyn Device,
    params: &mut HostTensor,
    grads: &HostTensor,
    state: &mut Optim1State8,
    hyper: &LarsHyper,
    step: u32,
    opts: &GradOptions,
) -> Result<f32> {
    let parts = lars8_norm_partials_opts(dev, params, grads, state, hyper, step, opts)?;
    let scale = norm_scale(dev, &parts, hyper.max_unorm)?;
    lars_update_8bit_opts(dev, params, grads, state, hyper, step, scale, opts)?;
    Ok(scale)
}
