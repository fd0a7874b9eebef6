//! Adam / AdamW update steps with 32-bit or 8-bit blockwise state (bitsandbytes' `Adam`,
//! `AdamW`, `Adam8bit`, `AdamW8bit`), over any [`Device`]. The formulas are in
//! [`crate::adam`] and `docs/optimizers.md`.

use crate::adam::Adam32Args;
use crate::{AdamHyper, OptimAlgo, OptimExtSpec, OptimSpec, StateBits, OPTIM_BLOCKSIZE};
use qforge_ir::dsl::{FloatIn, FloatOut};
use qforge_ir::DType;

use crate::ops::{cached_typed, count_u32, float_input};
use crate::optim_staged::host::{launch_adam8_typed, Adam8Scalars, Adam8State};
use qforge_runtime::HostTensor;
use qforge_runtime::{launch_typed, Device};
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

    /// `Ok` when both moments have `n` elements.
    pub(crate) fn check(&self, op: &str, n: u32) -> Result<()> {
        expect(op, "state1", self.state1.len(), n as usize)?;
        expect(op, "state2", self.state2.len(), n as usize)
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

    /// `Ok` when the state fits `n` elements: codes per element, absmax per block.
    pub(crate) fn check(&self, op: &str, n: u32) -> Result<()> {
        expect_state8(
            op,
            n,
            &[("state1", self.state1.len()), ("state2", self.state2.len())],
            &[
                ("absmax1", self.absmax1.len()),
                ("absmax2", self.absmax2.len()),
            ],
        )
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

/// Checks an `f32`-only parameter/gradient pair (non-empty, both `f32` of one shape, at most
/// `2^31 - 1` elements); returns the element count.
pub(crate) fn f32_pair(op: &str, params: &HostTensor, grads: &HostTensor) -> Result<u32> {
    let n = float_input(op, params)?;
    float_input(op, grads)?;
    if params.dtype != DType::F32 || grads.dtype != DType::F32 || grads.shape != params.shape {
        return Err(Error::Invalid(format!(
            "{op}: the parameter and the gradient must both be f32 of one shape, got {} {:?} and \
             {} {:?}",
            params.dtype, params.shape, grads.dtype, grads.shape
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

/// Checks the lengths of an 8-bit state for `n` elements: codes per element, absmax per block.
pub(crate) fn expect_state8(
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

/// The options a kernel without `skip_zeros` honours: `gnorm_scale` only (bitsandbytes'
/// precondition kernels and blockwise 8-bit two-state kernels take no `skip_zeros`).
pub(crate) fn partials_opts(opts: &GradOptions) -> GradOptions {
    GradOptions {
        skip_zeros: false,
        ..*opts
    }
}

/// The kernel name and whether it is the `_gs` variant ([`crate::optim_ext`]): `plain` for
/// the default options, else `ext`'s name.
///
/// # Errors
/// [`Error::Invalid`] for a `gnorm_scale` outside `[0, 1]`.
pub(crate) fn variant(
    op: &str,
    plain: String,
    ext: OptimExtSpec,
    opts: &GradOptions,
) -> Result<(String, bool)> {
    opts.check(op)?;
    Ok(if opts.is_default() {
        (plain, false)
    } else {
        (ext.name(), true)
    })
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

/// One Adam (`algo = Adam`) or AdamW step with 32-bit state, in place: `params` and `state` are
/// updated for step number `step` (1-based; bias corrections use it). Gradient elements that are
/// NaN or ±inf zero their state and leave their parameter unchanged.
///
/// `opts` are bitsandbytes' gradient options ([`GradOptions`]; `GradOptions::default()` runs
/// the plain kernel): the gradient is scaled by `gnorm_scale`, and with `skip_zeros` an element
/// whose scaled gradient is `±0` keeps its parameter and both moments.
///
/// # Errors
/// [`Error::Invalid`] for an empty or non-float parameter, a gradient of another dtype or shape,
/// state of the wrong length, more than `2^31 - 1` elements, a `gnorm_scale` outside `[0, 1]`;
/// [`Error::Ir`] for invalid hyperparameters (non-finite, betas outside `[0, 1)`, `eps <= 0`,
/// weight decay with Adam) or step 0; any device error.
#[allow(clippy::too_many_arguments)]
pub fn adam_step_32bit(
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
    state.check(OP, n)?;
    let scalars = hyper.scalars(&spec, step)?;
    let (name, gs) = variant(OP, spec.name(), OptimExtSpec::Adam(spec), opts)?;
    let kernel = cached_typed(&name, || spec.typed32(&name, gs))?;
    launch_typed(
        dev,
        &kernel,
        &mut Adam32Args {
            n,
            n_blocks: n.div_ceil(OPTIM_BLOCKSIZE),
            beta1: scalars.beta1,
            one_minus_beta1: scalars.one_minus_beta1,
            beta2: scalars.beta2,
            one_minus_beta2: scalars.one_minus_beta2,
            decay: (algo == OptimAlgo::AdamW).then_some(scalars.decay),
            step_size: scalars.step_size,
            eps_c2: scalars.eps_c2,
            gnorm_scale: gs.then_some(opts.gnorm_scale),
            skip_zeros: gs.then_some(u32::from(opts.skip_zeros)),
            p: FloatOut {
                dtype: spec.dtype,
                bytes: &mut params.data,
            },
            g: FloatIn {
                dtype: spec.dtype,
                bytes: &grads.data,
            },
            state1: &mut state.state1,
            state2: &mut state.state2,
        },
    )?;
    Ok(())
}

/// One Adam8bit / AdamW8bit step with blockwise 8-bit state (blocksize 256), in place: each block
/// dequantizes its moments, updates them and the parameters, and requantizes the moments with a
/// new absmax and the exact nearest code. `step` is 1-based. Non-finite gradient elements as in
/// [`adam_step_32bit`]. CPU devices run the staged kernel in chunks
/// ([`crate::optim_staged`]; the same bits, a workspace of at most 4 MiB).
///
/// `opts` are bitsandbytes' gradient options ([`GradOptions`]; `GradOptions::default()` runs
/// the plain kernel): the gradient is scaled by `gnorm_scale`; `skip_zeros` is ignored, as
/// bitsandbytes' blockwise 8-bit Adam kernel does.
///
/// # Errors
/// As [`adam_step_32bit`], with the 8-bit state's lengths (codes per element, absmax per block).
#[allow(clippy::too_many_arguments)]
pub fn adam_step_8bit(
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
    state.check(OP, n)?;
    let scalars = hyper.scalars(&spec, step)?;
    // Without a scale there is nothing for the variant to do.
    let opts = partials_opts(opts);
    opts.check(OP)?;
    let gnorm_scale = (!opts.is_default()).then_some(opts.gnorm_scale);
    let bufs = Adam8State {
        params: &mut params.data,
        grads: &grads.data,
        state1: &mut state.state1,
        absmax1: &mut state.absmax1,
        state2: &mut state.state2,
        absmax2: &mut state.absmax2,
    };
    let s = Adam8Scalars::new(&spec, &scalars, gnorm_scale);
    launch_adam8_typed(OP, dev, spec, &s, bufs)
}

/// The parameter dtypes the optimizer kernels accept.
pub const OPTIM_PARAM_DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];
