//! One quantized-AdamW step over raw buffers ([`launch_qadam`]): on CPU devices the staged
//! kernel ([`QAdamSpec::staged`]: each quantized moment's updated values kept in an `f32`
//! workspace instead of being decoded and updated again by the absmax, EDEN and code passes;
//! the same bits, 1.05x to 1.2x faster there) over chunks of [`STAGE_CHUNK`] elements sharing one
//! workspace; elsewhere the plain kernel in one launch. Chunking changes nothing: every block
//! lies in one chunk and the random bits are keyed by the element's index in the whole
//! parameter (`offset`).

use std::ops::Range;

use crate::{MomentScheme, QAdamScalars, QAdamSpec, UniformSource};
use qforge_ir::Arg;

use crate::ops::cached_kernel;
use crate::optim4::host::QAdamRng;
use crate::optim_staged::host::{stages, STAGE_CHUNK};
use qforge_runtime::Device;
use qforge_runtime::{Error, Result};

/// The buffers of one quantized-AdamW step as the kernel takes them (little-endian bytes): `n`
/// parameter and gradient elements of the spec's dtype and, for each moment, its codes (packed
/// nibbles, `i8` codes or `f32` values, [`MomentScheme::state_lens`]) and its `f32` scales (empty
/// for an `fp32` moment).
#[derive(Debug)]
pub struct QAdamBuffers<'a> {
    /// Parameter, updated in place.
    pub params: &'a mut [u8],
    /// Gradient.
    pub grads: &'a [u8],
    /// First-moment codes.
    pub m1_codes: &'a mut [u8],
    /// First-moment scales.
    pub m1_absmax: &'a mut [u8],
    /// Second-moment codes.
    pub m2_codes: &'a mut [u8],
    /// Second-moment scales.
    pub m2_absmax: &'a mut [u8],
}

/// The byte range of elements `elems` in a moment's codes.
fn code_bytes(scheme: MomentScheme, elems: &Range<usize>) -> Range<usize> {
    match scheme.bits() {
        32 => 4 * elems.start..4 * elems.end,
        8 => elems.clone(),
        // Two per byte: every chunk but the last starts and ends on an even element.
        _ => elems.start / 2..elems.end.div_ceil(2),
    }
}

/// The byte range of the scales of the blocks of elements `elems` (empty for `fp32`).
fn absmax_bytes(scheme: MomentScheme, elems: &Range<usize>) -> Range<usize> {
    match scheme.block() as usize {
        0 => 0..0,
        bs => 4 * (elems.start / bs)..4 * elems.end.div_ceil(bs),
    }
}

/// Runs one quantized-AdamW step of `spec` (Philox uniforms, plain form: the function picks the
/// form) on `bufs`, as [`crate::ops::qadamw_step`] does. `n` is the gradient's element count; a
/// last, partial block is updated as the kernel defines it (`qadamw_step` never has one).
///
/// # Errors
/// [`Error::Invalid`] for a staged or buffer-uniform spec, no elements or more than `2^31 - 1`,
/// a buffer whose length does not match `n` elements of the schemes, an odd `rng.offset` or
/// one that with `n` overflows `u32`; kernel
/// construction or device failure (a chunked step keeps the chunks before a failing one
/// updated).
pub fn launch_qadam(
    dev: &dyn Device,
    spec: QAdamSpec,
    scalars: &QAdamScalars,
    rng: QAdamRng,
    bufs: QAdamBuffers<'_>,
) -> Result<()> {
    const OP: &str = "launch_qadam";
    let n = bufs.grads.len() / spec.dtype.size_bytes();
    if spec.staged || spec.uniforms != UniformSource::Philox {
        return Err(Error::Invalid(format!(
            "{OP}: takes the plain Philox kernel's spec, got {}",
            spec.name()
        )));
    }
    let end = u32::try_from(n)
        .ok()
        .and_then(|n32| rng.offset.checked_add(n32));
    if n == 0 || n >= 1 << 31 || end.is_none() || !rng.offset.is_multiple_of(2) {
        return Err(Error::Invalid(format!(
            "{OP}: needs between 1 and 2^31 - 1 elements and an even offset that with them stays \
             within u32, got {n} elements at offset {}",
            rng.offset
        )));
    }
    let all = 0..n;
    let es = spec.dtype.size_bytes();
    let mut lens = vec![
        ("params", bufs.params.len(), n * es),
        ("grads", bufs.grads.len(), n * es),
    ];
    for (names, s, codes, absmax) in [
        (
            ["m1_codes", "m1_absmax"],
            spec.m1,
            &bufs.m1_codes,
            &bufs.m1_absmax,
        ),
        (
            ["m2_codes", "m2_absmax"],
            spec.m2,
            &bufs.m2_codes,
            &bufs.m2_absmax,
        ),
    ] {
        lens.push((names[0], codes.len(), code_bytes(s, &all).len()));
        lens.push((names[1], absmax.len(), absmax_bytes(s, &all).len()));
    }
    for (what, got, want) in lens {
        if got != want {
            return Err(Error::Invalid(format!(
                "{OP}: {what} has {got} bytes, {n} elements of {} need {want}",
                spec.name()
            )));
        }
    }
    let staged = stages(dev);
    let (kernel, chunk) = if staged {
        let spec = spec.staged();
        (
            cached_kernel(&spec.name(), || spec.build())?,
            STAGE_CHUNK.min(n),
        )
    } else {
        (cached_kernel(&spec.name(), || spec.build())?, n)
    };
    // One `f32` stage of `chunk` elements per quantized moment.
    let stages_n = [spec.m1, spec.m2]
        .iter()
        .filter(|s| staged && **s != MomentScheme::Fp32)
        .count();
    let mut workspace = vec![0u8; 4 * chunk * stages_n];
    for start in (0..n).step_by(chunk) {
        let elems = start..(start + chunk).min(n);
        let len = elems.len();
        // `start + len <= n < 2^31` and `rng.offset + n` fits in u32 (checked above).
        let mut args: Vec<Arg> = spec
            .sizes(len as u32)
            .args()
            .into_iter()
            .map(Arg::Scalar)
            .collect();
        let offset = rng.offset + start as u32;
        let s = scalars.kernel_args(rng.seed, rng.param_id, offset);
        args.extend(s.into_iter().map(Arg::Scalar));
        let bytes = elems.start * es..elems.end * es;
        args.push(Arg::Write(&mut bufs.params[bytes.clone()]));
        args.push(Arg::Read(&bufs.grads[bytes]));
        for (s, codes, absmax) in [
            (spec.m1, &mut *bufs.m1_codes, &mut *bufs.m1_absmax),
            (spec.m2, &mut *bufs.m2_codes, &mut *bufs.m2_absmax),
        ] {
            args.push(Arg::Write(&mut codes[code_bytes(s, &elems)]));
            if s != MomentScheme::Fp32 {
                args.push(Arg::Write(&mut absmax[absmax_bytes(s, &elems)]));
            }
        }
        for stage in workspace.chunks_exact_mut(4 * chunk) {
            args.push(Arg::Write(&mut stage[..4 * len]));
        }
        dev.launch(&kernel, &mut args)?;
    }
    Ok(())
}
