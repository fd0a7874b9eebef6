//! One-state optimizer steps (bitsandbytes' `Lion`, `SGD` with momentum, `RMSprop`, `Adagrad`
//! and their `8bit` variants) with 32-bit or 8-bit blockwise state, over any [`Device`]. The
//! formulas are in [`crate::optim1`] and `docs/optimizers.md`.

use crate::optim1::{Optim1Update32Args, Optim1Update8Args};
use crate::{
    Optim1Algo, Optim1Hyper, Optim1Scalars, Optim1Spec, OptimExtSpec, StateBits, OPTIM_BLOCKSIZE,
};
use qforge_ir::dsl::{FloatIn, FloatOut};
use qforge_ir::DType;

use crate::adam::host::{expect, expect_state8, f32_pair, variant, GradOptions};
use crate::ops::cached_typed;
#[cfg(doc)] // the `# Errors` sections link to it
use qforge_runtime::Error;
use qforge_runtime::HostTensor;
use qforge_runtime::Result;
use qforge_runtime::{launch_typed, Device};

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

    /// `Ok` when the state fits `n` elements: codes per element, absmax per block.
    pub(crate) fn check(&self, op: &str, n: u32) -> Result<()> {
        expect_state8(
            op,
            n,
            &[("state1", self.state1.len())],
            &[("absmax1", self.absmax1.len())],
        )
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
    let n = f32_pair(op, params, grads)?;
    let spec = Optim1Spec {
        algo,
        state,
        dtype: DType::F32,
    };
    Ok((n, spec))
}

/// The kernel name and whether it is the `_gs` variant ([`crate::optim_ext`]): the plain
/// kernel for the default options, else `{name}_gs`.
///
/// # Errors
/// [`Error::Invalid`] for a `gnorm_scale` outside `[0, 1]`.
fn variant1(op: &str, spec: Optim1Spec, opts: &GradOptions) -> Result<(String, bool)> {
    variant(op, spec.name(), OptimExtSpec::One(spec), opts)
}

/// One Lion / SGD / RMSprop / Adagrad step with 32-bit state (`state1`, one `f32` per element,
/// initially zeros), in place, for step number `step` (1-based; SGD takes the gradient as its
/// momentum on step 1). Gradient elements that are NaN or ±inf zero their state and leave their
/// parameter unchanged.
///
/// `opts` are bitsandbytes' gradient options ([`GradOptions`]; `GradOptions::default()` runs
/// the plain kernel): the gradient is scaled by `gnorm_scale`; with `skip_zeros`, an element
/// whose scaled gradient after coupled weight decay (`g * gnorm_scale + p * weight_decay`;
/// Lion: without it) is `±0` keeps its parameter and state.
///
/// # Errors
/// [`Error::Invalid`] for an empty or non-f32 parameter, a gradient of another dtype or shape,
/// state of the wrong length, more than `2^31 - 1` elements, a `gnorm_scale` outside `[0, 1]`;
/// [`Error::Ir`] for invalid hyperparameters or step 0; any device error.
#[allow(clippy::too_many_arguments)]
pub fn optim1_step_32bit(
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
    let (name, gs) = variant1(op, spec, opts)?;
    let kernel = cached_typed(&name, || spec.typed32(&name, gs))?;
    launch_typed(
        dev,
        &kernel,
        &mut Optim1Update32Args {
            n,
            n_blocks: n.div_ceil(OPTIM_BLOCKSIZE),
            first: scalars.first,
            beta1: scalars.beta1,
            one_minus_beta1: scalars.one_minus_beta1,
            beta2: scalars.beta2,
            one_minus_beta2: scalars.one_minus_beta2,
            weight_decay: scalars.weight_decay,
            decay: scalars.decay,
            eps: scalars.eps,
            lr: scalars.lr,
            neg_lr: scalars.neg_lr,
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
            scale: None,
        },
    )?;
    Ok(())
}

/// One Lion8bit / SGD8bit / RMSprop8bit / Adagrad8bit step with blockwise 8-bit state
/// (blocksize 256), in place: each block dequantizes its state, updates it and the parameters,
/// and requantizes the state with a new absmax and the exact nearest code. Otherwise as
/// [`optim1_step_32bit`].
///
/// `opts` are bitsandbytes' gradient options ([`GradOptions`]; `GradOptions::default()` runs
/// the plain kernel): the gradient is scaled by `gnorm_scale` (RMSprop's and Adagrad's update
/// numerator stays the raw gradient, as in bitsandbytes); with `skip_zeros`, an element whose
/// raw gradient is `±0` keeps its parameter, and its state keeps its dequantized value
/// (requantized with the block's new absmax).
///
/// # Errors
/// As [`optim1_step_32bit`], with the 8-bit state's lengths (codes per element, absmax per
/// block).
#[allow(clippy::too_many_arguments)]
pub fn optim1_step_8bit(
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
    state.check(OP, n)?;
    let scalars = hyper.scalars(algo, step)?;
    let (name, gs) = variant1(OP, spec, opts)?;
    let kernel = cached_typed(&name, || spec.typed8(&name, gs))?;
    launch_typed(
        dev,
        &kernel,
        &mut Optim1Update8Args {
            n,
            n_blocks: n.div_ceil(OPTIM_BLOCKSIZE),
            first: scalars.first,
            beta1: scalars.beta1,
            one_minus_beta1: scalars.one_minus_beta1,
            beta2: scalars.beta2,
            one_minus_beta2: scalars.one_minus_beta2,
            weight_decay: scalars.weight_decay,
            decay: scalars.decay,
            eps: scalars.eps,
            lr: scalars.lr,
            neg_lr: scalars.neg_lr,
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
            scale: None,
        },
    )?;
    Ok(())
}
