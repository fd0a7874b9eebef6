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

use crate::adam::optim8::Adam8bitArgs;
use crate::optim1::Optim1Update8Args;
use crate::optim_norm8::kernel::{lamb8_norm, lars8_norm};
use crate::optim_norm8::{lamb8_update, lars8_update, Lamb8NormArgs, Lars8NormArgs};
use crate::{LambHyper, LarsHyper, NormRule, OptimExtSpec, OptimNorm8Spec};
use qforge_ir::dsl::{FloatIn, FloatOut};
use qforge_ir::DType;

use crate::adam::host::{partials_opts, variant, GradOptions};
use crate::ops::cached_typed;
use crate::ops::{norm_scale, AdamState8, NormPartials, Optim1State8};
use crate::optim_norm::host::{blocks, check_scale, prepare};
use qforge_runtime::HostTensor;
use qforge_runtime::Result;
use qforge_runtime::{launch_typed, Device};

/// The kernel name of `spec` and whether it is the `_gs` variant (for non-default `opts`).
fn variant8(op: &str, spec: OptimNorm8Spec, opts: &GradOptions) -> Result<(String, bool)> {
    variant(op, spec.name(), OptimExtSpec::Norm8(spec), opts)
}

/// The 8-bit LAMB norm partials of step `step` (1-based) for a parameter, its gradient and its
/// 8-bit state before the step; nothing is modified.
///
/// `opts` are bitsandbytes' gradient options ([`GradOptions`]; `GradOptions::default()` runs
/// the plain kernel): the gradient is multiplied by `opts.gnorm_scale` before any use
/// (`lamb8_norm_*_gs`); `skip_zeros` does not apply to the norm.
///
/// # Errors
/// [`qforge_runtime::Error::Invalid`] for an empty or non-float parameter, a gradient of
/// another dtype or shape, state of the wrong length (codes per element, absmax per
/// 256-element block), more than `2^31 - 1` elements, a `gnorm_scale` outside `[0, 1]`;
/// [`qforge_runtime::Error::Ir`] for invalid hyperparameters or step 0; any device error.
pub fn lamb8_norm_partials(
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
    state.check(OP, n)?;
    let s = hyper.scalars(step)?;
    let spec = OptimNorm8Spec::Partials {
        rule: NormRule::Lamb,
        dtype,
    };
    let opts = partials_opts(opts);
    let (name, gs) = variant8(OP, spec, &opts)?;
    let kernel = cached_typed(&name, || lamb8_norm(dtype, &name, gs))?;
    let mut out = NormPartials::zeros(n as usize);
    launch_typed(
        dev,
        &kernel,
        &mut Lamb8NormArgs {
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
            absmax1: &state.absmax1,
            state2: &state.state2,
            absmax2: &state.absmax2,
            unorm_part: &mut out.unorm,
            pnorm_part: &mut out.pnorm,
        },
    )?;
    Ok(out)
}

/// The 8-bit LARS norm partials of step `step` (1-based) for an `f32` parameter, its gradient
/// and its 8-bit momentum before the step; nothing is modified. `opts` as for
/// [`lamb8_norm_partials`] (`gnorm_scale` only; `GradOptions::default()` runs the plain
/// kernel).
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
    opts: &GradOptions,
) -> Result<NormPartials> {
    const OP: &str = "lars8_norm_partials";
    let (n, _) = prepare(OP, NormRule::Lars, params, grads)?;
    state.check(OP, n)?;
    let s = hyper.scalars(step)?;
    let spec = OptimNorm8Spec::Partials {
        rule: NormRule::Lars,
        dtype: DType::F32,
    };
    let opts = partials_opts(opts);
    let (name, gs) = variant8(OP, spec, &opts)?;
    let kernel = cached_typed(&name, || lars8_norm(&name, gs))?;
    let mut out = NormPartials::zeros(n as usize);
    launch_typed(
        dev,
        &kernel,
        &mut Lars8NormArgs {
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
            state1: &state.state1,
            absmax1: &state.absmax1,
            unorm_part: &mut out.unorm,
            pnorm_part: &mut out.pnorm,
        },
    )?;
    Ok(out)
}

/// The 8-bit LAMB update of step `step` with a given `scale` (from [`norm_scale`]), in place:
/// the 8-bit AdamW step (decoupled weight decay before the update) with the step multiplied by
/// `scale`, the moments requantized per block. Gradient elements that are NaN or ±inf zero
/// their moments and leave their parameter unchanged.
///
/// `opts` are bitsandbytes' gradient options ([`GradOptions`]; `GradOptions::default()` runs
/// the plain kernel; otherwise `lamb8bit_*_gs`): the gradient is multiplied by
/// `opts.gnorm_scale` first; `skip_zeros` is ignored, as for [`crate::ops::adam_step_8bit`]
/// (bitsandbytes' blockwise 8-bit two-state kernel ignores it).
///
/// # Errors
/// As [`lamb8_norm_partials`]; [`qforge_runtime::Error::Invalid`] for a `scale` that is not
/// finite and `>= 0`.
#[allow(clippy::too_many_arguments)]
pub fn lamb_update_8bit(
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
    state.check(OP, n)?;
    let s = hyper.update8_scalars(step)?;
    let spec = OptimNorm8Spec::Update {
        rule: NormRule::Lamb,
        dtype,
    };
    // `skip_zeros` is ignored (no `skip_zeros` parameter, as `adamw8bit_*_gs`).
    let opts = partials_opts(opts);
    let (name, gs) = variant8(OP, spec, &opts)?;
    let kernel = cached_typed(&name, || lamb8_update(dtype, &name, gs))?;
    launch_typed(
        dev,
        &kernel,
        &mut Adam8bitArgs {
            n,
            n_blocks: blocks(n),
            beta1: s.beta1,
            one_minus_beta1: s.one_minus_beta1,
            beta2: s.beta2,
            one_minus_beta2: s.one_minus_beta2,
            decay: Some(s.decay),
            step_size: s.step_size,
            c2: s.c2,
            eps: s.eps,
            gnorm_scale: gs.then_some(opts.gnorm_scale),
            p: FloatOut {
                dtype,
                bytes: &mut params.data,
            },
            g: FloatIn {
                dtype,
                bytes: &grads.data,
            },
            state1: &mut state.state1,
            absmax1: &mut state.absmax1,
            state2: &mut state.state2,
            absmax2: &mut state.absmax2,
            scale: Some(&[scale]),
            m_stage: None,
            v_stage: None,
        },
    )?;
    Ok(())
}

/// The 8-bit LARS update of step `step` with a given `scale`, in place: the 8-bit SGD-momentum
/// step (coupled weight decay, the gradient itself as momentum on step 1) with the step
/// multiplied by `scale`, the momentum requantized per block. Non-finite gradient elements zero
/// their momentum and leave their parameter unchanged.
///
/// `opts` are bitsandbytes' gradient options ([`GradOptions`]; `GradOptions::default()` runs
/// the plain kernel; otherwise `lars8bit_f32_gs`): the gradient is multiplied by
/// `opts.gnorm_scale` first, and with `skip_zeros` an element whose raw gradient is `±0` keeps
/// its parameter and its dequantized momentum (as [`crate::ops::optim1_step_8bit`] for SGD).
///
/// # Errors
/// As [`lars8_norm_partials`]; [`qforge_runtime::Error::Invalid`] for a `scale` that is not
/// finite and `>= 0`.
#[allow(clippy::too_many_arguments)]
pub fn lars_update_8bit(
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
    state.check(OP, n)?;
    let s = hyper.update8_scalars(step)?;
    let spec = OptimNorm8Spec::Update {
        rule: NormRule::Lars,
        dtype: DType::F32,
    };
    let (name, gs) = variant8(OP, spec, opts)?;
    let kernel = cached_typed(&name, || lars8_update(&name, gs))?;
    launch_typed(
        dev,
        &kernel,
        &mut Optim1Update8Args {
            n,
            n_blocks: blocks(n),
            first: s.first,
            beta1: s.beta1,
            one_minus_beta1: s.one_minus_beta1,
            beta2: s.beta2,
            one_minus_beta2: s.one_minus_beta2,
            weight_decay: s.weight_decay,
            decay: s.decay,
            eps: s.eps,
            lr: s.lr,
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
            state1: &mut state.state1,
            absmax1: &mut state.absmax1,
            scale: Some(&[scale]),
        },
    )?;
    Ok(())
}

/// One whole-tensor 8-bit LAMB step (partials, scale, update); returns the scale it applied.
/// `opts` ([`GradOptions`]; `GradOptions::default()`: the plain kernels) are passed to both the
/// norm partials ([`lamb8_norm_partials`]) and the update ([`lamb_update_8bit`]).
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
    opts: &GradOptions,
) -> Result<f32> {
    let parts = lamb8_norm_partials(dev, params, grads, state, hyper, step, opts)?;
    let scale = norm_scale(dev, &parts, hyper.max_unorm)?;
    lamb_update_8bit(dev, params, grads, state, hyper, step, scale, opts)?;
    Ok(scale)
}

/// One whole-tensor 8-bit LARS step (partials, scale, update); returns the scale it applied.
/// `opts` ([`GradOptions`]; `GradOptions::default()`: the plain kernels) are passed to both the
/// norm partials ([`lars8_norm_partials`]) and the update ([`lars_update_8bit`]).
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
    opts: &GradOptions,
) -> Result<f32> {
    let parts = lars8_norm_partials(dev, params, grads, state, hyper, step, opts)?;
    let scale = norm_scale(dev, &parts, hyper.max_unorm)?;
    lars_update_8bit(dev, params, grads, state, hyper, step, scale, opts)?;
    Ok(scale)
}
