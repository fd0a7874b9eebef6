//! Adam / AdamW update steps with 32-bit or 8-bit blockwise state (bitsandbytes' `Adam`,
//! `AdamW`, `Adam8bit`, `AdamW8bit`), over any [`Device`]. The formulas are in
//! [`crate::adam`] and `docs/optimizers.md`.

use crate::{AdamHyper, OptimAlgo, OptimExtSpec, OptimSpec, StateBits, OPTIM_BLOCKSIZE};
use qforge_ir::{Arg, DType, Kernel};

use crate::ops::{cached_kernel, count_u32, f32_le, float_input, le_f32, scalar_u32};
use crate::optim_staged::host::{launch_adam8, Adam8Buffers};
use qforge_runtime::Device;
use qforge_runtime::HostTensor;
use qforge_runtime::{Error, Result};

/// 32-bit optimizer state: both moments in `f32`, one value per parameter element.
#[derive(Clone, Debug, PartialEq)]
pub struct AdamState32 {
    /// First moment `m`.
    pub state1: Vec<f32>,
    /// Second moment `v`.
    pub state2: Vec<f32>,
}

impl AdamState32 {
    /// Zero state for `n` parameter elements (bitsandbytes' initial state).
    pub fn zeros(n: usize) -> AdamState32 {
        AdamState32 {
            state1: vec![0.0; n],
            state2: vec![0.0; n],
        }
    }
}

/// 8-bit blockwise optimizer state (blocks of [`OPTIM_BLOCKSIZE`] elements): `m` as codes of the
/// signed dynamic map and `v` as codes of the unsigned dynamic map, each with one `f32` absmax
/// per block.
#[derive(Clone, Debug, PartialEq)]
pub struct AdamState8 {
    /// First-moment codes, one per element.
    pub state1: Vec<u8>,
    /// First-moment absmax, one per block.
    pub absmax1: Vec<f32>,
    /// Second-moment codes, one per element.
    pub state2: Vec<u8>,
    /// Second-moment absmax, one per block.
    pub absmax2: Vec<f32>,
}

impl AdamState8 {
    /// bitsandbytes' initial state for `n` elements: all codes 0 and all absmax 0 (which
    /// dequantize to `m = -0.0`, `v = 0.0`).
    pub fn zeros(n: usize) -> AdamState8 {
        let blocks = n.div_ceil(OPTIM_BLOCKSIZE as usize);
        AdamState8 {
            state1: vec![0; n],
            absmax1: vec![0.0; blocks],
            state2: vec![0; n],
            absmax2: vec![0.0; blocks],
        }
    }
}

/// Checks a parameter/gradient pair of an optimizer step (non-empty floats, the gradient of the
/// parameter's dtype and shape, at most `2^31 - 1` elements); returns the element count.
pub(crate) fn param_grad_pair(op: &str, params: &HostTensor, grads: &HostTensor) -> Result<u32> {
    let n = float_input(op, params)?;
    float_input(op, grads)?;
    if grads.dtype != params.dtype || grads.shape != params.shape {
        return Err(Error::Invalid(format!(
            "{op}: the gradient ({} {:?}) must have the parameter's dtype and shape ({} {:?})",
            grads.dtype, grads.shape, params.dtype, params.shape
        )));
    }
    count_u32(op, "the parameter", n as usize)
}

/// Checks the parameter/gradient pair; returns `n` and the spec.
fn prepare(
    op: &str,
    algo: OptimAlgo,
    state: StateBits,
    params: &HostTensor,
    grads: &HostTensor,
) -> Result<(u32, OptimSpec)> {
    let n = param_grad_pair(op, params, grads)?;
    let spec = OptimSpec {
        algo,
        state,
        dtype: params.dtype,
    };
    Ok((n, spec))
}

/// `Ok` when a state buffer has the length the parameter needs.
pub(crate) fn expect(op: &str, what: &str, got: usize, want: usize) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "{op}: {what} has {got} elements, the parameter needs {want}"
        )))
    }
}

/// bitsandbytes' per-step gradient options of an update ([`crate::optim_ext`]):
/// the gradient is multiplied by `gnorm_scale` first (percentile clipping), and with
/// `skip_zeros` elements whose gradient is zero keep their parameter and state (where
/// bitsandbytes honours it: not the 8-bit Adam / AdamW kernels). The default (`1.0`, off) runs
/// the plain kernels.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GradOptions {
    /// Factor applied to the gradient (`1.0`: none).
    pub gnorm_scale: f32,
    /// Skip elements whose gradient is exactly zero.
    pub skip_zeros: bool,
}

impl Default for GradOptions {
    fn default() -> Self {
        GradOptions {
            gnorm_scale: 1.0,
            skip_zeros: false,
        }
    }
}

impl GradOptions {
    /// Whether these are the defaults (the plain kernels run).
    pub fn is_default(&self) -> bool {
        *self == GradOptions::default()
    }

    /// `Ok` for a finite `gnorm_scale` in `[0, 1]` (percentile clipping only scales down).
    ///
    /// # Errors
    /// [`Error::Invalid`] naming the value.
    pub(crate) fn check(&self, op: &str) -> Result<()> {
        let s = self.gnorm_scale;
        if (0.0..=1.0).contains(&s) {
            Ok(())
        } else {
            Err(Error::Invalid(format!(
                "{op}: gnorm_scale = {s} is invalid: it must be in [0, 1]"
            )))
        }
    }
}

/// The extra scalars of `ext`'s `_gs` variant for `opts`: none for the defaults (the plain
/// kernel runs).
///
/// # Errors
/// [`Error::Invalid`] for a `gnorm_scale` outside `[0, 1]`.
pub(crate) fn ext_scalars(
    op: &str,
    ext: OptimExtSpec,
    opts: &GradOptions,
) -> Result<Vec<qforge_ir::Scalar>> {
    opts.check(op)?;
    Ok(if opts.is_default() {
        Vec::new()
    } else {
        ext.ext_args(opts.gnorm_scale, opts.skip_zeros)
    })
}

/// The kernel of `plain` (with its name) or, for non-default options, of its `_gs` variant;
/// and the extra scalars the variant takes.
pub(crate) fn kernel_for(
    op: &str,
    plain: (String, &dyn Fn() -> qforge_ir::Result<Kernel>),
    ext: OptimExtSpec,
    opts: &GradOptions,
) -> Result<(std::sync::Arc<Kernel>, Vec<qforge_ir::Scalar>)> {
    let extra = ext_scalars(op, ext, opts)?;
    if extra.is_empty() {
        return Ok((cached_kernel(&plain.0, plain.1)?, extra));
    }
    Ok((cached_kernel(&ext.name(), || ext.build())?, extra))
}

/// One Adam (`algo = Adam`) or AdamW step with 32-bit state, in place: `params` and `state` are
/// updated for step number `step` (1-based; bias corrections use it). Gradient elements that are
/// NaN or ±inf zero their state and leave their parameter unchanged.
///
/// # Errors
/// [`Error::Invalid`] for an empty or non-float parameter, a gradient of another dtype or shape,
/// state of the wrong length, more than `2^31 - 1` elements; [`Error::Ir`] for invalid
/// hyperparameters (non-finite, betas outside `[0, 1)`, `eps <= 0`, weight decay with Adam) or
/// step 0; any device error.
pub fn adam_step_32bit(
    dev: &dyn Device,
    algo: OptimAlgo,
    params: &mut HostTensor,
    grads: &HostTensor,
    state: &mut AdamState32,
    hyper: &AdamHyper,
    step: u32,
) -> Result<()> {
    adam_step_32bit_opts(
        dev,
        algo,
        params,
        grads,
        state,
        hyper,
        step,
        &GradOptions::default(),
    )
}

/// [`adam_step_32bit`] with bitsandbytes' gradient options ([`GradOptions`]): the gradient is
/// scaled by `gnorm_scale`, and with `skip_zeros` an element whose scaled gradient is `±0`
/// keeps its parameter and both moments.
///
/// # Errors
/// As [`adam_step_32bit`]; [`Error::Invalid`] for a `gnorm_scale` outside `[0, 1]`.
#[allow(clippy::too_many_arguments)]
pub fn adam_step_32bit_opts(
    dev: &dyn Device,
    algo: OptimAlgo,
    params: &mut HostTensor,
    grads: &HostTensor,
    state: &mut AdamState32,
    hyper: &AdamHyper,
    step: u32,
    opts: &GradOptions,
) -> Result<()> {
    const OP: &str = "adam_step_32bit";
    let (n, spec) = prepare(OP, algo, StateBits::Bits32, params, grads)?;
    expect(OP, "state1", state.state1.len(), n as usize)?;
    expect(OP, "state2", state.state2.len(), n as usize)?;
    let scalars = hyper.scalars(&spec, step)?;
    let (kernel, extra) = kernel_for(
        OP,
        (spec.name(), &|| spec.build()),
        OptimExtSpec::Adam(spec),
        opts,
    )?;
    let mut s1 = f32_le(&state.state1);
    let mut s2 = f32_le(&state.state2);
    let mut args = vec![scalar_u32(n), scalar_u32(n.div_ceil(OPTIM_BLOCKSIZE))];
    args.extend(scalars.kernel_args(&spec).into_iter().map(Arg::Scalar));
    args.extend(extra.into_iter().map(Arg::Scalar));
    args.extend([
        Arg::Write(&mut params.data),
        Arg::Read(&grads.data),
        Arg::Write(&mut s1),
        Arg::Write(&mut s2),
    ]);
    dev.launch(&kernel, &mut args)?;
    state.state1 = le_f32(&s1);
    state.state2 = le_f32(&s2);
    Ok(())
}

/// One Adam8bit / AdamW8bit step with blockwise 8-bit state (blocksize 256), in place: each block
/// dequantizes its moments, updates them and the parameters, and requantizes the moments with a
/// new absmax and the exact nearest code. `step` is 1-based. Non-finite gradient elements as in
/// [`adam_step_32bit`]. CPU devices run the staged kernel in chunks
/// ([`crate::optim_staged`]; the same bits, a workspace of at most 4 MiB).
///
/// # Errors
/// As [`adam_step_32bit`], with the 8-bit state's lengths (codes per element, absmax per block).
pub fn adam_step_8bit(
    dev: &dyn Device,
    algo: OptimAlgo,
    params: &mut HostTensor,
    grads: &HostTensor,
    state: &mut AdamState8,
    hyper: &AdamHyper,
    step: u32,
) -> Result<()> {
    adam_step_8bit_opts(
        dev,
        algo,
        params,
        grads,
        state,
        hyper,
        step,
        &GradOptions::default(),
    )
}

/// [`adam_step_8bit`] with bitsandbytes' gradient options: the gradient is scaled by
/// `gnorm_scale`; `skip_zeros` is ignored, as bitsandbytes' blockwise 8-bit Adam kernel does.
///
/// # Errors
/// As [`adam_step_8bit`]; [`Error::Invalid`] for a `gnorm_scale` outside `[0, 1]`.
#[allow(clippy::too_many_arguments)]
pub fn adam_step_8bit_opts(
    dev: &dyn Device,
    algo: OptimAlgo,
    params: &mut HostTensor,
    grads: &HostTensor,
    state: &mut AdamState8,
    hyper: &AdamHyper,
    step: u32,
    opts: &GradOptions,
) -> Result<()> {
    const OP: &str = "adam_step_8bit";
    let (n, spec) = prepare(OP, algo, StateBits::Bits8, params, grads)?;
    let blocks = n.div_ceil(OPTIM_BLOCKSIZE);
    expect(OP, "state1", state.state1.len(), n as usize)?;
    expect(OP, "state2", state.state2.len(), n as usize)?;
    expect(OP, "absmax1", state.absmax1.len(), blocks as usize)?;
    expect(OP, "absmax2", state.absmax2.len(), blocks as usize)?;
    let scalars = hyper.scalars(&spec, step)?;
    // Without a scale there is nothing for the variant to do.
    let opts = GradOptions {
        skip_zeros: false,
        ..*opts
    };
    let extra = ext_scalars(OP, OptimExtSpec::Adam(spec), &opts)?;
    let mut a1 = f32_le(&state.absmax1);
    let mut a2 = f32_le(&state.absmax2);
    let bufs = Adam8Buffers {
        params: &mut params.data,
        grads: &grads.data,
        state1: &mut state.state1,
        absmax1: &mut a1,
        state2: &mut state.state2,
        absmax2: &mut a2,
    };
    launch_adam8(dev, spec, &scalars.kernel_args(&spec), &extra, bufs)?;
    state.absmax1 = le_f32(&a1);
    state.absmax2 = le_f32(&a2);
    Ok(())
}

/// The parameter dtypes the optimizer kernels accept.
pub const OPTIM_PARAM_DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];
