//! The 8-bit Adam / AdamW step in the staged form ([`crate::optim_staged`]) on a
//! CPU device: the kernel keeps each block's updated moments in two `f32` workspace buffers
//! between its passes instead of decoding the codes twice (the same bits as the plain kernel,
//! 1.2x to 1.4x faster on CPUs, where table reads dominate the step). The step is launched over
//! chunks of [`STAGE_CHUNK`] elements sharing one workspace, so the extra memory is bounded
//! whatever the parameter's size. GPU devices run the plain kernel: their table reads are cheap
//! and a stage would live in device memory.

use crate::{OptimExtSpec, OptimSpec, OptimStagedSpec, StateBits, OPTIM_BLOCKSIZE};
use qforge_ir::{Arg, Scalar};

use crate::ops::{cached_kernel, scalar_u32};
use qforge_runtime::Device;
use qforge_runtime::{Error, Result};

/// Elements per launch of the staged step: 512 Ki (2048 blocks), so the workspace (two `f32`
/// stages) is at most 4 MiB, as `OptimizerOptions::workspace_elems`' default chunk.
pub const STAGE_CHUNK: usize = 512 * 1024;

// Chunks must not split a block (256 for 8-bit state and 8-bit linear moments, 128 for 4-bit)
// and must start on an even element (one Philox call per element pair).
const _: () = assert!(STAGE_CHUNK.is_multiple_of(256));

/// Whether `dev` runs the staged form: every backend but the GPU ones (`ptx`, `wgsl`), as
/// `ops::DeviceCaps::of` tells CPUs from GPUs.
pub(crate) fn stages(dev: &dyn Device) -> bool {
    !matches!(dev.backend(), "ptx" | "wgsl")
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

/// Launches one 8-bit Adam / AdamW step of `spec` on `bufs`, as [`crate::ops::adam_step_8bit_opts`]
/// does: the staged kernel over chunks of [`STAGE_CHUNK`] elements on CPU devices, the plain
/// kernel (`adam{,w}8bit_{dtype}`, or its `_gs` variant when `extra` is not empty) in one launch
/// elsewhere. `scalars` are
/// [`crate::AdamScalars::kernel_args`]; `extra` the `_gs` scalars
/// ([`crate::OptimExtSpec::ext_args`]: `gnorm_scale`), empty for the plain kernel.
///
/// # Errors
/// [`Error::Invalid`] for 32-bit state, no elements, more than `2^31 - 1`, or a buffer whose
/// length does not match the codes' count `n`; kernel construction or device failure (a
/// chunked step keeps the chunks before a failing one updated).
pub fn launch_adam8(
    dev: &dyn Device,
    spec: OptimSpec,
    scalars: &[Scalar],
    extra: &[Scalar],
    bufs: Adam8Buffers<'_>,
) -> Result<()> {
    const OP: &str = "launch_adam8";
    let n = bufs.state1.len();
    let es = spec.dtype.size_bytes();
    let nb = n.div_ceil(OPTIM_BLOCKSIZE as usize);
    if spec.state != StateBits::Bits8 || n == 0 || n >= 1 << 31 {
        return Err(Error::Invalid(format!(
            "{OP}: needs 8-bit state and between 1 and 2^31 - 1 elements, got {} state and \
             {n} codes",
            spec.state.name()
        )));
    }
    for (what, got, want) in [
        ("params", bufs.params.len(), n * es),
        ("grads", bufs.grads.len(), n * es),
        ("state2", bufs.state2.len(), n),
        ("absmax1", bufs.absmax1.len(), 4 * nb),
        ("absmax2", bufs.absmax2.len(), 4 * nb),
    ] {
        if got != want {
            return Err(Error::Invalid(format!(
                "{OP}: {what} has {got} bytes, {n} {} elements need {want}",
                spec.dtype
            )));
        }
    }
    if stages(dev) {
        return launch_staged(dev, spec, scalars, extra, bufs);
    }
    let kernel = if extra.is_empty() {
        cached_kernel(&spec.name(), || spec.build())?
    } else {
        let ext = OptimExtSpec::Adam(spec);
        cached_kernel(&ext.name(), || ext.build())?
    };
    // `n < 2^31` and `nb <= n`: both fit in u32.
    let mut args = vec![scalar_u32(n as u32), scalar_u32(nb as u32)];
    args.extend(scalars.iter().chain(extra).map(|s| Arg::Scalar(*s)));
    args.extend([
        Arg::Write(bufs.params),
        Arg::Read(bufs.grads),
        Arg::Write(bufs.state1),
        Arg::Write(bufs.absmax1),
        Arg::Write(bufs.state2),
        Arg::Write(bufs.absmax2),
    ]);
    dev.launch(&kernel, &mut args)
}

/// The staged kernel of `spec` over the checked `bufs` in chunks of [`STAGE_CHUNK`] sharing one
/// workspace.
fn launch_staged(
    dev: &dyn Device,
    spec: OptimSpec,
    scalars: &[Scalar],
    extra: &[Scalar],
    bufs: Adam8Buffers<'_>,
) -> Result<()> {
    let staged = OptimStagedSpec {
        spec,
        grad_opts: !extra.is_empty(),
    };
    let kernel = cached_kernel(&staged.name(), || staged.build())?;
    let n = bufs.state1.len();
    let es = spec.dtype.size_bytes();
    let block = OPTIM_BLOCKSIZE as usize;
    let chunk = STAGE_CHUNK.min(n);
    let mut workspace = vec![0u8; 8 * chunk];
    let (m_stage, v_stage) = workspace.split_at_mut(4 * chunk);
    for start in (0..n).step_by(chunk) {
        let len = chunk.min(n - start);
        let (b0, nb) = (start / block, len.div_ceil(block));
        let elems = start..start + len;
        let bytes = start * es..(start + len) * es;
        let blocks = 4 * b0..4 * (b0 + nb);
        let mut args = vec![scalar_u32(len as u32), scalar_u32(nb as u32)];
        args.extend(scalars.iter().chain(extra).map(|s| Arg::Scalar(*s)));
        args.extend([
            Arg::Write(&mut bufs.params[bytes.clone()]),
            Arg::Read(&bufs.grads[bytes]),
            Arg::Write(&mut bufs.state1[elems.clone()]),
            Arg::Write(&mut bufs.absmax1[blocks.clone()]),
            Arg::Write(&mut bufs.state2[elems]),
            Arg::Write(&mut bufs.absmax2[blocks]),
            Arg::Write(&mut m_stage[..4 * len]),
            Arg::Write(&mut v_stage[..4 * len]),
        ]);
        dev.launch(&kernel, &mut args)?;
    }
    Ok(())
}
