//! One quantized-AdamW step over raw buffers ([`launch_qadam`]): on CPU devices the staged
//! kernel ([`QAdamSpec::staged`]: each quantized moment's updated values kept in an `f32`
//! workspace instead of being decoded and updated again by the absmax, EDEN and code passes;
//! the same bits, 1.05x to 1.2x faster there) over chunks of [`STAGE_CHUNK`] elements sharing one
//! workspace; elsewhere the plain kernel in one launch. Chunking changes nothing: every block
//! lies in one chunk and the random bits are keyed by the element's index in the whole
//! parameter (`offset`). Each launch goes through the kernel's typed arguments
//! (`QAdamC4C4Args`, ... of [`crate::optim4::kernel`]).

use std::ops::Range;

use crate::{MomentScheme, QAdamScalars, QAdamSpec, UniformSource};
use qforge_ir::dsl::{FloatIn, FloatOut};

use crate::ops::{cached_typed, f32_le, le_f32};
use crate::optim4::host::QAdamRng;
use crate::optim4::kernel::{qadamw_c4_c4, qadamw_c4_c8, qadamw_c8_c4, qadamw_c8_c8, CodeTypes};
use crate::optim4::kernel::{QAdamC4C4Args, QAdamC4C8Args, QAdamC8C4Args, QAdamC8C8Args};
use crate::optim_staged::host::{stages, STAGE_CHUNK};
use qforge_runtime::{launch_typed, Device};
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

/// The range of the scales of the blocks of elements `elems` (empty for `fp32`).
fn absmax_range(scheme: MomentScheme, elems: &Range<usize>) -> Range<usize> {
    match scheme.block() as usize {
        0 => 0..0,
        bs => elems.start / bs..elems.end.div_ceil(bs),
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
    check_range(OP, n, rng)?;
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
        lens.push((names[1], absmax.len(), 4 * absmax_range(s, &all).len()));
    }
    for (what, got, want) in lens {
        if got != want {
            return Err(Error::Invalid(format!(
                "{OP}: {what} has {got} bytes, {n} elements of {} need {want}",
                spec.name()
            )));
        }
    }
    let mut a1 = le_f32(bufs.m1_absmax);
    let mut a2 = le_f32(bufs.m2_absmax);
    let mut m1 = TypedMoment::new(spec.m1, bufs.m1_codes, &mut a1);
    let mut m2 = TypedMoment::new(spec.m2, bufs.m2_codes, &mut a2);
    let r = launch_qadam_typed(
        dev,
        spec,
        scalars,
        rng,
        bufs.params,
        bufs.grads,
        [&mut m1, &mut m2],
    );
    // Also after a failing chunk: the chunks before it are updated.
    m1.finish();
    m2.finish();
    bufs.m1_absmax.copy_from_slice(&f32_le(&a1));
    bufs.m2_absmax.copy_from_slice(&f32_le(&a2));
    r
}

/// Checks the element count and the random-bits offset of a launch of `n` elements: between 1
/// and `2^31 - 1` elements, an even offset that with them stays within `u32`.
///
/// # Errors
/// [`Error::Invalid`] naming `op`, the count and the offset.
pub(crate) fn check_range(op: &str, n: usize, rng: QAdamRng) -> Result<()> {
    let end = u32::try_from(n)
        .ok()
        .and_then(|n32| rng.offset.checked_add(n32));
    if n == 0 || n >= 1 << 31 || end.is_none() || !rng.offset.is_multiple_of(2) {
        return Err(Error::Invalid(format!(
            "{op}: needs between 1 and 2^31 - 1 elements and an even offset that with them stays \
             within u32, got {n} elements at offset {}",
            rng.offset
        )));
    }
    Ok(())
}

/// One moment's state as the typed kernel arguments take it: 4-bit codes as bytes, `linear8`
/// codes as `i8` and `fp32` values as `f32` (copies of the bytes, written back by
/// [`TypedMoment::finish`]), and the `f32` scales.
pub(crate) struct TypedMoment<'a> {
    scheme: MomentScheme,
    /// The codes as bytes (4-bit codes are passed as they are).
    bytes: &'a mut [u8],
    /// `fp32`: the values.
    values: Vec<f32>,
    /// `linear8`: the codes.
    codes8: Vec<i8>,
    /// The scales (empty for `fp32`).
    absmax: &'a mut [f32],
}

impl<'a> TypedMoment<'a> {
    /// The state of a `scheme` moment from its code bytes ([`MomentScheme::state_lens`]) and
    /// scales.
    pub(crate) fn new(scheme: MomentScheme, bytes: &'a mut [u8], absmax: &'a mut [f32]) -> Self {
        let values = if scheme.bits() == 32 {
            le_f32(bytes)
        } else {
            Vec::new()
        };
        let codes8 = if scheme.bits() == 8 {
            bytes.iter().map(|&c| c as i8).collect()
        } else {
            Vec::new()
        };
        TypedMoment {
            scheme,
            bytes,
            values,
            codes8,
            absmax,
        }
    }

    /// The arguments of the elements `elems`: `(m{k}, u8 codes, i8 codes, m{k}_absmax)`, each
    /// present when the scheme has it.
    #[allow(clippy::type_complexity)]
    fn chunk(
        &mut self,
        elems: &Range<usize>,
    ) -> (
        Option<&mut [f32]>,
        Option<&mut [u8]>,
        Option<&mut [i8]>,
        Option<&mut [f32]>,
    ) {
        let s = self.scheme;
        let absmax = (s != MomentScheme::Fp32).then(|| &mut self.absmax[absmax_range(s, elems)]);
        match s.bits() {
            32 => (Some(&mut self.values[elems.clone()]), None, None, absmax),
            8 => (None, None, Some(&mut self.codes8[elems.clone()]), absmax),
            _ => (
                None,
                Some(&mut self.bytes[code_bytes(s, elems)]),
                None,
                absmax,
            ),
        }
    }

    /// Writes `fp32` values and `linear8` codes back into the code bytes.
    pub(crate) fn finish(self) {
        match self.scheme.bits() {
            32 => self.bytes.copy_from_slice(&f32_le(&self.values)),
            8 => {
                for (b, c) in self.bytes.iter_mut().zip(&self.codes8) {
                    *b = *c as u8;
                }
            }
            _ => {}
        }
    }
}

/// The first `len` values of a stage, if it has any (staged form, quantized moment).
fn stage_slice(stage: &mut [f32], len: usize) -> Option<&mut [f32]> {
    (!stage.is_empty()).then(|| &mut stage[..len])
}

/// The element type of a kernel's `m{k}_code` ([`crate::optim4::kernel`]): picks the codes of
/// that type from [`TypedMoment::chunk`].
pub(crate) trait CodeElem: Sized {
    fn pick<'s>(u: Option<&'s mut [u8]>, i: Option<&'s mut [i8]>) -> Option<&'s mut [Self]>;
}
impl CodeElem for u8 {
    fn pick<'s>(u: Option<&'s mut [u8]>, _: Option<&'s mut [i8]>) -> Option<&'s mut [u8]> {
        u
    }
}
impl CodeElem for i8 {
    fn pick<'s>(_: Option<&'s mut [u8]>, i: Option<&'s mut [i8]>) -> Option<&'s mut [i8]> {
        i
    }
}

/// [`launch_qadam`] on checked buffers with typed moments (what [`crate::ops::qadamw_step`]
/// calls): the plain kernel of `spec` in one launch through its `<Name>Args`, or the staged
/// kernel in chunks on CPU devices.
///
/// # Errors
/// Kernel construction or device failure (a chunked step keeps the chunks before a failing one
/// updated).
pub(crate) fn launch_qadam_typed(
    dev: &dyn Device,
    spec: QAdamSpec,
    scalars: &QAdamScalars,
    rng: QAdamRng,
    params: &mut [u8],
    grads: &[u8],
    [m1, m2]: [&mut TypedMoment<'_>; 2],
) -> Result<()> {
    let es = spec.dtype.size_bytes();
    let n = grads.len() / es;
    let staged = stages(dev);
    let (kspec, chunk) = if staged {
        (spec.staged(), STAGE_CHUNK.min(n))
    } else {
        (spec, n)
    };
    // One `f32` stage of `chunk` elements per quantized moment.
    let stage_len = |s: MomentScheme| {
        if staged && s != MomentScheme::Fp32 {
            chunk
        } else {
            0
        }
    };
    let mut stage1 = vec![0f32; stage_len(spec.m1)];
    let mut stage2 = vec![0f32; stage_len(spec.m2)];
    macro_rules! run {
        ($build:path, $args:ident, $c1:ty, $c2:ty) => {{
            let kernel = cached_typed(&kspec.name(), || {
                kspec.check()?;
                $build(&kspec)
            })?;
            for start in (0..n).step_by(chunk) {
                let elems = start..(start + chunk).min(n);
                let len = elems.len();
                // `start + len <= n < 2^31` and `rng.offset + n` fits in u32 (checked).
                let sizes = spec.sizes(len as u32);
                let bytes = elems.start * es..elems.end * es;
                let (m1v, m1u, m1i, m1a) = m1.chunk(&elems);
                let (m2v, m2u, m2i, m2a) = m2.chunk(&elems);
                launch_typed(
                    dev,
                    &kernel,
                    &mut $args {
                        n: sizes.n,
                        n_items: sizes.n_items,
                        n_packed: sizes.n_packed,
                        n_blocks1: sizes.n_blocks1,
                        n_blocks2: sizes.n_blocks2,
                        w1: scalars.w1,
                        w2: scalars.w2,
                        decay: scalars.decay,
                        neg_step: scalars.neg_step,
                        sqrt_c2: scalars.sqrt_c2,
                        eps: scalars.eps,
                        c2: scalars.c2,
                        seed_lo: rng.seed as u32,
                        seed_hi: (rng.seed >> 32) as u32,
                        param_id: rng.param_id,
                        step: scalars.step,
                        offset: rng.offset + start as u32,
                        p: FloatOut {
                            dtype: spec.dtype,
                            bytes: &mut params[bytes.clone()],
                        },
                        g: FloatIn {
                            dtype: spec.dtype,
                            bytes: &grads[bytes],
                        },
                        m1: m1v,
                        m1_code: <$c1 as CodeElem>::pick(m1u, m1i),
                        m1_absmax: m1a,
                        m2: m2v,
                        m2_code: <$c2 as CodeElem>::pick(m2u, m2i),
                        m2_absmax: m2a,
                        m1_uniform: None,
                        m2_uniform: None,
                        m1_stage: stage_slice(&mut stage1, len),
                        m2_stage: stage_slice(&mut stage2, len),
                    },
                )?;
            }
        }};
    }
    match CodeTypes::of(&spec) {
        CodeTypes::C4C4 => run!(qadamw_c4_c4, QAdamC4C4Args, u8, u8),
        CodeTypes::C4C8 => run!(qadamw_c4_c8, QAdamC4C8Args, u8, i8),
        CodeTypes::C8C4 => run!(qadamw_c8_c4, QAdamC8C4Args, i8, u8),
        CodeTypes::C8C8 => run!(qadamw_c8_c8, QAdamC8C8Args, i8, i8),
    }
    Ok(())
}
