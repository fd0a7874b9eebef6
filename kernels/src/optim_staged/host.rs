//! The 8-bit Adam / AdamW step in the staged form ([`crate::optim_staged`]) on a
//! CPU device: the kernel keeps each block's updated moments in two `f32` workspace buffers
//! between its passes instead of decoding the codes twice (the same bits as the plain kernel,
//! 1.2x to 1.4x faster on CPUs, where table reads dominate the step). The step is launched over
//! chunks of [`STAGE_CHUNK`] elements sharing one workspace, so the extra memory is bounded
//! whatever the parameter's size. GPU devices run the plain kernel: their table reads are cheap
//! and a stage would live in device memory.

use crate::adam::{Adam8bitArgs, AdamScalars, Form};
use crate::{OptimAlgo, OptimSpec, OptimStagedSpec, StateBits, OPTIM_BLOCKSIZE};
use qforge_ir::dsl::{FloatIn, FloatOut};
use qforge_ir::Scalar;

use crate::ops::{cached_typed, f32_le, le_f32};
use qforge_runtime::{launch_typed, Device};
use qforge_runtime::{Error, Result};

/// Elements per launch of the staged step: 512 Ki (2048 blocks), so the workspace (two `f32`
/// stages) is at most 4 MiB, as `OptimizerOptions::workspace_elems`' default chunk.
pub const STAGE_CHUNK: usize = 512 * 1024;

// Chunks must not split a block (256 for 8-bit state and 8-bit linear moments, 128 for 4-bit)
// and must start on an even element (one Philox call per element pair).
const _: () = assert!(STAGE_CHUNK.is_multiple_of(256));

/// Whether `dev` runs the staged form: every device but a GPU ([`Device::caps`]).
pub(crate) fn stages(dev: &dyn Device) -> bool {
    !dev.caps().is_gpu()
}

/// The buffers of one 8-bit Adam / AdamW step as the kernels take them (little-endian bytes):
/// `n` parameter and gradient elements of the spec's dtype, one code per element and one `f32`
/// absmax per block of 256 for each moment.
#[derive(Debug)]
pub struct Adam8Buffers<'a> {
    /// Parameter, `n` elements, updated in place.
    pub params: &'a mut [u8],
    /// Gradient, `n` elements.
    pub grads: &'a [u8],
    /// First-moment codes (signed dynamic map), `n` bytes.
    pub state1: &'a mut [u8],
    /// First-moment absmax, one `f32` per block.
    pub absmax1: &'a mut [u8],
    /// Second-moment codes (unsigned dynamic map), `n` bytes.
    pub state2: &'a mut [u8],
    /// Second-moment absmax, one `f32` per block.
    pub absmax2: &'a mut [u8],
}

/// [`Adam8Buffers`] with the absmax as `f32` values, as the typed kernel arguments take them
/// ([`Adam8bitArgs`]).
#[derive(Debug)]
pub(crate) struct Adam8State<'a> {
    /// Parameter, `n` elements of the spec's dtype (bytes), updated in place.
    pub(crate) params: &'a mut [u8],
    /// Gradient, `n` elements of the spec's dtype (bytes).
    pub(crate) grads: &'a [u8],
    /// First-moment codes, `n` bytes.
    pub(crate) state1: &'a mut [u8],
    /// First-moment absmax, one per block.
    pub(crate) absmax1: &'a mut [f32],
    /// Second-moment codes, `n` bytes.
    pub(crate) state2: &'a mut [u8],
    /// Second-moment absmax, one per block.
    pub(crate) absmax2: &'a mut [f32],
}

/// The scalars of one 8-bit Adam / AdamW step, named as the kernel's parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Adam8Scalars {
    beta1: f32,
    one_minus_beta1: f32,
    beta2: f32,
    one_minus_beta2: f32,
    /// AdamW only.
    decay: Option<f32>,
    step_size: f32,
    c2: f32,
    eps: f32,
    /// The `_gs` variant only.
    gnorm_scale: Option<f32>,
}

impl Adam8Scalars {
    /// The scalars of `spec`'s kernel from the step's [`AdamScalars`]; `gnorm_scale`: the
    /// `_gs` variant's.
    pub(crate) fn new(spec: &OptimSpec, s: &AdamScalars, gnorm_scale: Option<f32>) -> Self {
        Adam8Scalars {
            beta1: s.beta1,
            one_minus_beta1: s.one_minus_beta1,
            beta2: s.beta2,
            one_minus_beta2: s.one_minus_beta2,
            decay: (spec.algo == OptimAlgo::AdamW).then_some(s.decay),
            step_size: s.step_size,
            c2: s.c2,
            eps: s.eps,
            gnorm_scale,
        }
    }

    /// The scalars from [`launch_adam8`]'s lists: `scalars` as
    /// [`AdamScalars::kernel_args`] gives them (`beta1`, `one_minus_beta1`, `beta2`,
    /// `one_minus_beta2`, `decay` for AdamW, `step_size`, `c2`, `eps`) and `extra` empty or
    /// `[gnorm_scale]` ([`crate::OptimExtSpec::ext_args`]).
    ///
    /// # Errors
    /// [`Error::Invalid`] for a list of another length or a value that is not an `f32`.
    fn from_lists(
        op: &str,
        spec: &OptimSpec,
        scalars: &[Scalar],
        extra: &[Scalar],
    ) -> Result<Self> {
        let adamw = spec.algo == OptimAlgo::AdamW;
        let mut names = vec!["beta1", "one_minus_beta1", "beta2", "one_minus_beta2"];
        if adamw {
            names.push("decay");
        }
        names.extend(["step_size", "c2", "eps"]);
        if scalars.len() != names.len() || extra.len() > 1 {
            return Err(Error::Invalid(format!(
                "{op}: {} takes the f32 scalars ({}) and at most one extra scalar                  (gnorm_scale), got {} and {}",
                spec.name(),
                names.join(", "),
                scalars.len(),
                extra.len()
            )));
        }
        let f = |name: &str, s: &Scalar| match *s {
            Scalar::F32(bits) => Ok(f32::from_bits(bits)),
            other => Err(Error::Invalid(format!(
                "{op}: the scalar {name} must be an f32, got {other:?}"
            ))),
        };
        let mut v = Vec::with_capacity(names.len());
        for (name, s) in names.iter().zip(scalars) {
            v.push(f(name, s)?);
        }
        let rest = &v[4 + usize::from(adamw)..];
        Ok(Adam8Scalars {
            beta1: v[0],
            one_minus_beta1: v[1],
            beta2: v[2],
            one_minus_beta2: v[3],
            decay: adamw.then(|| v[4]),
            step_size: rest[0],
            c2: rest[1],
            eps: rest[2],
            gnorm_scale: extra.first().map(|s| f("gnorm_scale", s)).transpose()?,
        })
    }
}

/// `Ok` for 8-bit state, `1 <= n < 2^31` codes and buffers of the lengths `n` needs (each given
/// in bytes).
fn check_buffers(op: &str, spec: &OptimSpec, n: usize, bytes: [(&str, usize); 5]) -> Result<()> {
    let es = spec.dtype.size_bytes();
    let nb = n.div_ceil(OPTIM_BLOCKSIZE as usize);
    if spec.state != StateBits::Bits8 || n == 0 || n >= 1 << 31 {
        return Err(Error::Invalid(format!(
            "{op}: needs 8-bit state and between 1 and 2^31 - 1 elements, got {} state and \
             {n} codes",
            spec.state.name()
        )));
    }
    let want = [n * es, n * es, n, 4 * nb, 4 * nb];
    for ((what, got), want) in bytes.into_iter().zip(want) {
        if got != want {
            return Err(Error::Invalid(format!(
                "{op}: {what} has {got} bytes, {n} {} elements need {want}",
                spec.dtype
            )));
        }
    }
    Ok(())
}

/// Launches one 8-bit Adam / AdamW step of `spec` on `bufs`, as [`crate::ops::adam_step_8bit`]
/// does: the staged kernel over chunks of [`STAGE_CHUNK`] elements on CPU devices, the plain
/// kernel (`adam{,w}8bit_{dtype}`, or its `_gs` variant when `extra` is not empty) in one launch
/// elsewhere. `scalars` are
/// [`crate::AdamScalars::kernel_args`]; `extra` the `_gs` scalars
/// ([`crate::OptimExtSpec::ext_args`]: `gnorm_scale`), empty for the plain kernel.
///
/// # Errors
/// [`Error::Invalid`] for 32-bit state, no elements, more than `2^31 - 1`, a buffer whose
/// length does not match the codes' count `n`, or scalar lists that are not the kernel's;
/// kernel construction or device failure (a chunked step keeps the chunks before a failing one
/// updated).
pub fn launch_adam8(
    dev: &dyn Device,
    spec: OptimSpec,
    scalars: &[Scalar],
    extra: &[Scalar],
    bufs: Adam8Buffers<'_>,
) -> Result<()> {
    const OP: &str = "launch_adam8";
    let n = bufs.state1.len();
    check_buffers(
        OP,
        &spec,
        n,
        [
            ("params", bufs.params.len()),
            ("grads", bufs.grads.len()),
            ("state2", bufs.state2.len()),
            ("absmax1", bufs.absmax1.len()),
            ("absmax2", bufs.absmax2.len()),
        ],
    )?;
    let s = Adam8Scalars::from_lists(OP, &spec, scalars, extra)?;
    let mut a1 = le_f32(bufs.absmax1);
    let mut a2 = le_f32(bufs.absmax2);
    let state = Adam8State {
        params: bufs.params,
        grads: bufs.grads,
        state1: bufs.state1,
        absmax1: &mut a1,
        state2: bufs.state2,
        absmax2: &mut a2,
    };
    let r = launch_adam8_typed(OP, dev, spec, &s, state);
    // Also after a failing chunk: the chunks before it are updated.
    bufs.absmax1.copy_from_slice(&f32_le(&a1));
    bufs.absmax2.copy_from_slice(&f32_le(&a2));
    r
}

/// [`launch_adam8`] with named scalars and `f32` absmax (what [`crate::ops::adam_step_8bit`]
/// calls): the plain (`_gs` when `s` has a `gnorm_scale`) kernel in one launch through
/// [`Adam8bitArgs`], or the staged kernel in chunks on CPU devices.
///
/// # Errors
/// As [`launch_adam8`].
pub(crate) fn launch_adam8_typed(
    op: &str,
    dev: &dyn Device,
    spec: OptimSpec,
    s: &Adam8Scalars,
    bufs: Adam8State<'_>,
) -> Result<()> {
    let n = bufs.state1.len();
    check_buffers(
        op,
        &spec,
        n,
        [
            ("params", bufs.params.len()),
            ("grads", bufs.grads.len()),
            ("state2", bufs.state2.len()),
            ("absmax1", 4 * bufs.absmax1.len()),
            ("absmax2", 4 * bufs.absmax2.len()),
        ],
    )?;
    if stages(dev) {
        return launch_staged(dev, spec, s, bufs);
    }
    let gs = s.gnorm_scale.is_some();
    let name = if gs {
        crate::OptimExtSpec::Adam(spec).name()
    } else {
        spec.name()
    };
    let form = Form {
        grad_opts: gs,
        ..Form::default()
    };
    let kernel = cached_typed(&name, || spec.typed8(&name, form))?;
    let mut args = adam8_args(spec, s, bufs, None);
    launch_typed(dev, &kernel, &mut args)
}

/// The typed arguments of one launch on `bufs` (`n` = its codes' count), with the staged
/// kernel's workspace `stage` (`m_stage`, `v_stage`).
fn adam8_args<'a>(
    spec: OptimSpec,
    s: &Adam8Scalars,
    bufs: Adam8State<'a>,
    stage: Option<(&'a mut [f32], &'a mut [f32])>,
) -> Adam8bitArgs<'a> {
    // Checked: `n < 2^31` and `n_blocks <= n`, both fit in u32.
    let n = bufs.state1.len();
    let (m_stage, v_stage) = stage.unzip();
    Adam8bitArgs {
        n: n as u32,
        n_blocks: n.div_ceil(OPTIM_BLOCKSIZE as usize) as u32,
        beta1: s.beta1,
        one_minus_beta1: s.one_minus_beta1,
        beta2: s.beta2,
        one_minus_beta2: s.one_minus_beta2,
        decay: s.decay,
        step_size: s.step_size,
        c2: s.c2,
        eps: s.eps,
        gnorm_scale: s.gnorm_scale,
        p: FloatOut {
            dtype: spec.dtype,
            bytes: bufs.params,
        },
        g: FloatIn {
            dtype: spec.dtype,
            bytes: bufs.grads,
        },
        state1: bufs.state1,
        absmax1: bufs.absmax1,
        state2: bufs.state2,
        absmax2: bufs.absmax2,
        scale: None,
        m_stage,
        v_stage,
    }
}

/// The staged kernel of `spec` over the checked `bufs` in chunks of [`STAGE_CHUNK`] sharing one
/// workspace.
fn launch_staged(
    dev: &dyn Device,
    spec: OptimSpec,
    s: &Adam8Scalars,
    bufs: Adam8State<'_>,
) -> Result<()> {
    let staged = OptimStagedSpec {
        spec,
        grad_opts: s.gnorm_scale.is_some(),
    };
    let kernel = cached_typed(&staged.name(), || staged.typed())?;
    let n = bufs.state1.len();
    let es = spec.dtype.size_bytes();
    let block = OPTIM_BLOCKSIZE as usize;
    let chunk = STAGE_CHUNK.min(n);
    let mut workspace = vec![0f32; 2 * chunk];
    let (m_stage, v_stage) = workspace.split_at_mut(chunk);
    for start in (0..n).step_by(chunk) {
        let len = chunk.min(n - start);
        let (b0, nb) = (start / block, len.div_ceil(block));
        let elems = start..start + len;
        let bytes = start * es..(start + len) * es;
        let blocks = b0..b0 + nb;
        let part = Adam8State {
            params: &mut bufs.params[bytes.clone()],
            grads: &bufs.grads[bytes],
            state1: &mut bufs.state1[elems.clone()],
            absmax1: &mut bufs.absmax1[blocks.clone()],
            state2: &mut bufs.state2[elems],
            absmax2: &mut bufs.absmax2[blocks],
        };
        let stage = (&mut m_stage[..len], &mut v_stage[..len]);
        launch_typed(dev, &kernel, &mut adam8_args(spec, s, part, Some(stage)))?;
    }
    Ok(())
}
