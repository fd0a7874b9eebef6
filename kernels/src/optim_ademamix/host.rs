//! AdEMAMix steps (bitsandbytes' `AdEMAMix`, `AdEMAMix8bit`) with 32-bit or 8-bit blockwise
//! state, over any [`Device`]. The formulas are in [`crate::optim_ademamix`] and
//! `docs/optimizers.md`.

use crate::{AdemamixHyper, AdemamixSpec, StateBits, OPTIM_BLOCKSIZE};
use qforge_ir::{Arg, DType};

use crate::adam::host::expect;
use crate::ops::{cached_kernel, count_u32, f32_le, float_input, le_f32, scalar_u32};
use qforge_runtime::Device;
use qforge_runtime::HostTensor;
use qforge_runtime::{Error, Result};

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
    let n = float_input(op, p)?;
    float_input(op, g)?;
    if p.dtype != DType::F32 || g.dtype != DType::F32 || g.shape != p.shape {
        return Err(Error::Invalid(format!(
            "{op}: the parameter and the gradient must both be f32 of one shape, got {} {:?} and \
             {} {:?}",
            p.dtype, p.shape, g.dtype, g.shape
        )));
    }
    let spec = AdemamixSpec {
        state,
        dtype: DType::F32,
    };
    Ok((count_u32(op, "the parameter", n as usize)?, spec))
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
    let kernel = cached_kernel(&spec.name(), || spec.build())?;
    let (mut m1, mut nu, mut m2) = (f32_le(&state.m1), f32_le(&state.nu), f32_le(&state.m2));
    let mut args = vec![scalar_u32(n), scalar_u32(n.div_ceil(OPTIM_BLOCKSIZE))];
    args.extend(scalars.kernel_args().into_iter().map(Arg::Scalar));
    args.extend([
        Arg::Write(&mut params.data),
        Arg::Read(&grads.data),
        Arg::Write(&mut m1),
        Arg::Write(&mut nu),
        Arg::Write(&mut m2),
    ]);
    dev.launch(&kernel, &mut args)?;
    (state.m1, state.nu, state.m2) = (le_f32(&m1), le_f32(&nu), le_f32(&m2));
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
    let kernel = cached_kernel(&spec.name(), || spec.build())?;
    let mut a: Vec<Vec<u8>> = state.absmax.iter().map(|x| f32_le(x)).collect();
    let mut args = vec![scalar_u32(n), scalar_u32(blocks)];
    args.extend(scalars.kernel_args().into_iter().map(Arg::Scalar));
    args.extend([Arg::Write(&mut params.data), Arg::Read(&grads.data)]);
    for (c, ab) in state.codes.iter_mut().zip(a.iter_mut()) {
        args.push(Arg::Write(c));
        args.push(Arg::Write(ab));
    }
    dev.launch(&kernel, &mut args)?;
    drop(args);
    for (dst, src) in state.absmax.iter_mut().zip(&a) {
        *dst = le_f32(src);
    }
    Ok(())
}
