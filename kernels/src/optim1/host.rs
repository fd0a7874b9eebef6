//! One-state optimizer steps (bitsandbytes' `Lion`, `SGD` with momentum, `RMSprop`, `Adagrad`
//! and their `8bit` variants) with 32-bit or 8-bit blockwise state, over any [`Device`]. The
//! formulas are in [`crate::optim1`] and `docs/optimizers.md`.

use crate::{
    Optim1Algo, Optim1Hyper, Optim1Scalars, Optim1Spec, OptimExtSpec, StateBits, OPTIM_BLOCKSIZE,
};
use qforge_ir::{Arg, DType};

use crate::adam::host::{expect, kernel_for, GradOptions};
use crate::ops::{count_u32, f32_le, float_input, le_f32, scalar_u32};
use qforge_runtime::Device;
use qforge_runtime::HostTensor;
use qforge_runtime::{Error, Result};

/// 8-bit blockwise one-state optimizer state: codes of the signed dynamic map, one per element,
/// and one `f32` absmax per block of [`OPTIM_BLOCKSIZE`] elements.
#[derive(Clone, Debug, PartialEq)]
pub struct Optim1State8 {
    /// State codes, one per element.
    pub state1: Vec<u8>,
    /// State absmax, one per block.
    pub absmax1: Vec<f32>,
}

impl Optim1State8 {
    /// bitsandbytes' initial state for `n` elements: all codes 0 and all absmax 0.
    pub fn zeros(n: usize) -> Optim1State8 {
        Optim1State8 {
            state1: vec![0; n],
            absmax1: vec![0.0; n.div_ceil(OPTIM_BLOCKSIZE as usize)],
        }
    }
}

/// Checks the parameter/gradient pair (f32 only, same shape); returns `n` and the spec.
pub(crate) fn prepare(
    op: &str,
    algo: Optim1Algo,
    state: StateBits,
    params: &HostTensor,
    grads: &HostTensor,
) -> Result<(u32, Optim1Spec)> {
    let n = float_input(op, params)?;
    float_input(op, grads)?;
    if params.dtype != DType::F32 || grads.dtype != DType::F32 || grads.shape != params.shape {
        return Err(Error::Invalid(format!(
            "{op}: the parameter and the gradient must both be f32 of one shape, got {} {:?} and \
             {} {:?}",
            params.dtype, params.shape, grads.dtype, grads.shape
        )));
    }
    let spec = Optim1Spec {
        algo,
        state,
        dtype: DType::F32,
    };
    Ok((count_u32(op, "the parameter", n as usize)?, spec))
}

/// One Lion / SGD / RMSprop / Adagrad step with 32-bit state (`state1`, one `f32` per element,
/// initially zeros), in place, for step number `step` (1-based; SGD takes the gradient as its
/// momentum on step 1). Gradient elements that are NaN or ±inf zero their state and leave their
/// parameter unchanged.
///
/// # Errors
/// [`Error::Invalid`] for an empty or non-f32 parameter, a gradient of another dtype or shape,
/// state of the wrong length, more than `2^31 - 1` elements; [`Error::Ir`] for invalid
/// hyperparameters or step 0; any device error.
pub fn optim1_step_32bit(
    dev: &dyn Device,
    algo: Optim1Algo,
    params: &mut HostTensor,
    grads: &HostTensor,
    state1: &mut [f32],
    hyper: &Optim1Hyper,
    step: u32,
) -> Result<()> {
    let opts = GradOptions::default();
    optim1_step_32bit_opts(dev, algo, params, grads, state1, hyper, step, &opts)
}

/// [`optim1_step_32bit`] with bitsandbytes' gradient options ([`GradOptions`]): the gradient
/// is scaled by `gnorm_scale`; with `skip_zeros`, an element whose scaled gradient after
/// coupled weight decay (`g * gnorm_scale + p * weight_decay`; Lion: without it) is `±0` keeps
/// its parameter and state.
///
/// # Errors
/// As [`optim1_step_32bit`]; [`Error::Invalid`] for a `gnorm_scale` outside `[0, 1]`.
#[allow(clippy::too_many_arguments)]
pub fn optim1_step_32bit_opts(
    dev: &dyn Device,
    algo: Optim1Algo,
    params: &mut HostTensor,
    grads: &HostTensor,
    state1: &mut [f32],
    hyper: &Optim1Hyper,
    step: u32,
    opts: &GradOptions,
) -> Result<()> {
    const OP: &str = "optim1_step_32bit";
    // The tensors first, then the hyperparameters (the errors' order of the plain op).
    let (n, _) = prepare(OP, algo, StateBits::Bits32, params, grads)?;
    expect(OP, "state1", state1.len(), n as usize)?;
    let scalars = hyper.scalars(algo, step)?;
    launch32(OP, dev, algo, params, grads, state1, &scalars, opts)
}

/// Launches the 32-bit kernel of `algo` (or its `_gs` variant) with the given scalars.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch32(
    op: &str,
    dev: &dyn Device,
    algo: Optim1Algo,
    params: &mut HostTensor,
    grads: &HostTensor,
    state1: &mut [f32],
    scalars: &Optim1Scalars,
    opts: &GradOptions,
) -> Result<()> {
    let (n, spec) = prepare(op, algo, StateBits::Bits32, params, grads)?;
    expect(op, "state1", state1.len(), n as usize)?;
    let (kernel, extra) = kernel_for(
        op,
        (spec.name(), &|| spec.build()),
        OptimExtSpec::One(spec),
        opts,
    )?;
    let mut s1 = f32_le(state1);
    let mut args = vec![scalar_u32(n), scalar_u32(n.div_ceil(OPTIM_BLOCKSIZE))];
    args.extend(scalars.kernel_args().into_iter().map(Arg::Scalar));
    args.extend(extra.into_iter().map(Arg::Scalar));
    args.extend([
        Arg::Write(&mut params.data),
        Arg::Read(&grads.data),
        Arg::Write(&mut s1),
    ]);
    dev.launch(&kernel, &mut args)?;
    state1.copy_from_slice(&le_f32(&s1));
    Ok(())
}

/// One Lion8bit / SGD8bit / RMSprop8bit / Adagrad8bit step with blockwise 8-bit state
/// (blocksize 256), in place: each block dequantizes its state, updates it and the parameters,
/// and requantizes the state with a new absmax and the exact nearest code. Otherwise as
/// [`optim1_step_32bit`].
///
/// # Errors
/// As [`optim1_step_32bit`], with the 8-bit state's lengths (codes per element, absmax per
/// block).
pub fn optim1_step_8bit(
    dev: &dyn Device,
    algo: Optim1Algo,
    params: &mut HostTensor,
    grads: &HostTensor,
    state: &mut Optim1State8,
    hyper: &Optim1Hyper,
    step: u32,
) -> Result<()> {
    let opts = GradOptions::default();
    optim1_step_8bit_opts(dev, algo, params, grads, state, hyper, step, &opts)
}

/// [`optim1_step_8bit`] with bitsandbytes' gradient options ([`GradOptions`]): the gradient is
/// scaled by `gnorm_scale` (RMSprop's and Adagrad's update numerator stays the raw gradient,
/// as in bitsandbytes); with `skip_zeros`, an element whose raw gradient is `±0` keeps its
/// parameter, and its state keeps its dequantized value (requantized with the block's new
/// absmax).
///
/// # Errors
/// As [`optim1_step_8bit`]; [`Error::Invalid`] for a `gnorm_scale` outside `[0, 1]`.
#[allow(clippy::too_many_arguments)]
pub fn optim1_step_8bit_opts(
    dev: &dyn Device,
    algo: Optim1Algo,
    params: &mut HostTensor,
    grads: &HostTensor,
    state: &mut Optim1State8,
    hyper: &Optim1Hyper,
    step: u32,
    opts: &GradOptions,
) -> Result<()> {
    const OP: &str = "optim1_step_8bit";
    let (n, spec) = prepare(OP, algo, StateBits::Bits8, params, grads)?;
    let blocks = n.div_ceil(OPTIM_BLOCKSIZE);
    expect(OP, "state1", state.state1.len(), n as usize)?;
    expect(OP, "absmax1", state.absmax1.len(), blocks as usize)?;
    let scalars = hyper.scalars(algo, step)?;
    let (kernel, extra) = kernel_for(
        OP,
        (spec.name(), &|| spec.build()),
        OptimExtSpec::One(spec),
        opts,
    )?;
    let mut a1 = f32_le(&state.absmax1);
    let mut args = vec![scalar_u32(n), scalar_u32(blocks)];
    args.extend(scalars.kernel_args().into_iter().map(Arg::Scalar));
    args.extend(extra.into_iter().map(Arg::Scalar));
    args.extend([
        Arg::Write(&mut params.data),
        Arg::Read(&grads.data),
        Arg::Write(&mut state.state1),
        Arg::Write(&mut a1),
    ]);
    dev.launch(&kernel, &mut args)?;
    state.absmax1 = le_f32(&a1);
    Ok(())
}
