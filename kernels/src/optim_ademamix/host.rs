//! AdEMAMix steps (bitsandbytes' `AdEMAMix`, `AdEMAMix8bit`) with 32-bit or 8-bit blockwise
//! state, over any [`Device`]. The formulas are in [`crate::optim_ademamix`] and
//! `docs/optimizers.md`.

use crate::optim_ademamix::{Ademamix32Args, Ademamix8Args, AdemamixScalars};
use crate::{AdemamixHyper, AdemamixSpec, StateBits, OPTIM_BLOCKSIZE};
use qforge_ir::dsl::{FloatIn, FloatOut};
use qforge_ir::DType;

use crate::adam::host::{expect, f32_pair};
use crate::ops::cached_typed;
#[cfg(doc)] // the `# Errors` sections link to it
use qforge_runtime::Error;
use qforge_runtime::HostTensor;
use qforge_runtime::Result;
use qforge_runtime::{launch_typed, Device};

/// 32-bit AdEMAMix state, one `f32` per element each (initially zeros).
#[derive(Clone, Debug, PartialEq)]
pub struct AdemamixState32 {
    /// Fast EMA `m1` (beta1).
    pub m1: Vec<f32>,
    /// Second moment `nu` (beta2).
    pub nu: Vec<f32>,
    /// Slow EMA `m2` (beta3).
    pub m2: Vec<f32>,
}

impl AdemamixState32 {
    /// Zero state for `n` elements.
    pub fn zeros(n: usize) -> AdemamixState32 {
        AdemamixState32 {
            m1: vec![0.0; n],
            nu: vec![0.0; n],
            m2: vec![0.0; n],
        }
    }
}

/// 8-bit blockwise AdEMAMix state: `codes[0]`/`absmax[0]` hold `m1` (signed dynamic map),
/// `[1]` hold `nu` (unsigned dynamic map), `[2]` hold `m2` (signed dynamic map); one code per
/// element and one absmax per block of [`OPTIM_BLOCKSIZE`].
#[derive(Clone, Debug, PartialEq)]
pub struct AdemamixState8 {
    /// Codes of `m1`, `nu`, `m2`.
    pub codes: [Vec<u8>; 3],
    /// Absmax per block of `m1`, `nu`, `m2`.
    pub absmax: [Vec<f32>; 3],
}

impl AdemamixState8 {
    /// Initial state for `n` elements: all codes 0 and all absmax 0.
    pub fn zeros(n: usize) -> AdemamixState8 {
        let blocks = n.div_ceil(OPTIM_BLOCKSIZE as usize);
        AdemamixState8 {
            codes: [vec![0; n], vec![0; n], vec![0; n]],
            absmax: [vec![0.0; blocks], vec![0.0; blocks], vec![0.0; blocks]],
        }
    }
}

fn prepare(
    op: &str,
    state: StateBits,
    p: &HostTensor,
    g: &HostTensor,
) -> Result<(u32, AdemamixSpec)> {
    let n = f32_pair(op, p, g)?;
    let spec = AdemamixSpec {
        state,
        dtype: DType::F32,
    };
    Ok((n, spec))
}

/// One AdEMAMix step with 32-bit state, in place, for step number `step` (1-based; bias
/// corrections and the schedulers use it). Non-finite gradient elements zero their state and
/// leave their parameter unchanged.
///
/// # Errors
/// [`Error::Invalid`] for an empty or non-f32 parameter, a gradient of another dtype or shape,
/// state of the wrong length; [`Error::Ir`] for invalid hyperparameters or step 0; any device
/// error.
pub fn ademamix_step_32bit(
    dev: &dyn Device,
    params: &mut HostTensor,
    grads: &HostTensor,
    state: &mut AdemamixState32,
    hyper: &AdemamixHyper,
    step: u32,
) -> Result<()> {
    const OP: &str = "ademamix_step_32bit";
    let (n, spec) = prepare(OP, StateBits::Bits32, params, grads)?;
    for (what, s) in [("m1", &state.m1), ("nu", &state.nu), ("m2", &state.m2)] {
        expect(OP, what, s.len(), n as usize)?;
    }
    let scalars = hyper.scalars(step)?;
    let kernel = cached_typed(&spec.name(), || spec.typed32())?;
    let AdemamixScalars(
        [beta1, one_minus_beta1, beta2, one_minus_beta2, beta3, one_minus_beta3, alpha, c1, c2, eps, decay, neg_lr],
    ) = scalars;
    launch_typed(
        dev,
        &kernel,
        &mut Ademamix32Args {
            n,
            n_blocks: n.div_ceil(OPTIM_BLOCKSIZE),
            beta1,
            one_minus_beta1,
            beta2,
            one_minus_beta2,
            beta3,
            one_minus_beta3,
            alpha,
            c1,
            c2,
            eps,
            decay,
            neg_lr,
            p: FloatOut {
                dtype: DType::F32,
                bytes: &mut params.data,
            },
            g: FloatIn {
                dtype: DType::F32,
                bytes: &grads.data,
            },
            state1: &mut state.m1,
            state2: &mut state.nu,
            state3: &mut state.m2,
        },
    )?;
    Ok(())
}

/// One AdEMAMix8bit step with blockwise 8-bit state (blocksize 256), in place. Otherwise as
/// [`ademamix_step_32bit`].
///
/// # Errors
/// As [`ademamix_step_32bit`], with the 8-bit state's lengths.
pub fn ademamix_step_8bit(
    dev: &dyn Device,
    params: &mut HostTensor,
    grads: &HostTensor,
    state: &mut AdemamixState8,
    hyper: &AdemamixHyper,
    step: u32,
) -> Result<()> {
    const OP: &str = "ademamix_step_8bit";
    let (n, spec) = prepare(OP, StateBits::Bits8, params, grads)?;
    let blocks = n.div_ceil(OPTIM_BLOCKSIZE);
    for k in 0..3 {
        expect(OP, &format!("codes[{k}]"), state.codes[k].len(), n as usize)?;
        let what = format!("absmax[{k}]");
        expect(OP, &what, state.absmax[k].len(), blocks as usize)?;
    }
    let scalars = hyper.scalars(step)?;
    let kernel = cached_typed(&spec.name(), || spec.typed8())?;
    let AdemamixScalars(
        [beta1, one_minus_beta1, beta2, one_minus_beta2, beta3, one_minus_beta3, alpha, c1, c2, eps, decay, neg_lr],
    ) = scalars;
    let [codes1, codes2, codes3] = &mut state.codes;
    let [absmax1, absmax2, absmax3] = &mut state.absmax;
    launch_typed(
        dev,
        &kernel,
        &mut Ademamix8Args {
            n,
            n_blocks: blocks,
            beta1,
            one_minus_beta1,
            beta2,
            one_minus_beta2,
            beta3,
            one_minus_beta3,
            alpha,
            c1,
            c2,
            eps,
            decay,
            neg_lr,
            p: FloatOut {
                dtype: DType::F32,
                bytes: &mut params.data,
            },
            g: FloatIn {
                dtype: DType::F32,
                bytes: &grads.data,
            },
            state1: codes1,
            absmax1,
            state2: codes2,
            absmax2,
            state3: codes3,
            absmax3,
        },
    )?;
    Ok(())
}
