//! The quantized-AdamW kernels in the catalog: the ZIP-SR and ZE-EDEN recipes on `f32` and
//! `bf16`, 8-bit linear on `f32`, NF4 stochastic rounding with `dyn4_nz` on `f32`, and the staged
//! forms (both recipes, the 8-bit pair, SR in both moments' value spaces, an `f32` first moment).

use qforge_ir::dsl::{FloatIn, FloatOut};
use qforge_ir::{DType, Error, Kernel, OwnedArg, Result};

use super::kernel::{
    qadamw_c4_c4, qadamw_c4_c8, qadamw_c8_c4, qadamw_c8_c8, CodeTypes, QAdamC4C4Args,
    QAdamC4C8Args, QAdamC8C4Args, QAdamC8C8Args,
};
use super::launch::CodeElem;
use super::{MomentScheme, QAdamScalars, QAdamSpec, UniformSource};
use crate::adam::AdamHyper;
use crate::catalog::{float_bytes, mix};
use crate::CatalogEntry;

impl QAdamSpec {
    /// The catalog's quantized-AdamW kernels (module docs).
    pub fn variants() -> Vec<QAdamSpec> {
        let mut out = Vec::new();
        for m2 in [MomentScheme::Dyn4Sr, MomentScheme::Dyn4NzEden] {
            for dtype in [DType::F32, DType::BF16] {
                out.push(QAdamSpec::new(MomentScheme::Nf4, m2, dtype));
            }
        }
        out.push(QAdamSpec::new(
            MomentScheme::Linear8,
            MomentScheme::Linear8,
            DType::F32,
        ));
        out.push(QAdamSpec::new(
            MomentScheme::Nf4Sr,
            MomentScheme::Dyn4Nz,
            DType::F32,
        ));
        for (m1, m2, dtype) in [
            (MomentScheme::Nf4, MomentScheme::Dyn4Sr, DType::F32),
            (MomentScheme::Nf4, MomentScheme::Dyn4NzEden, DType::BF16),
            (MomentScheme::Linear8, MomentScheme::Linear8, DType::F32),
            (MomentScheme::Nf4Sr, MomentScheme::Dyn4Nz, DType::F32),
            (MomentScheme::Fp32, MomentScheme::Dyn4Sr, DType::F32),
        ] {
            out.push(QAdamSpec::new(m1, m2, dtype).staged());
        }
        out
    }
}

impl CatalogEntry for QAdamSpec {
    fn name(&self) -> String {
        QAdamSpec::name(self)
    }

    fn build(&self) -> Result<Kernel> {
        QAdamSpec::build(self)
    }

    fn blocksize(&self) -> usize {
        self.item_size() as usize
    }

    fn example_args(&self, values: &[f32]) -> Result<Vec<OwnedArg>> {
        example_args(self, values, mix, float_bytes)
    }
}

/// One moment's example buffers: the `f32` state or the codes (`u8` or `i8`, by the scheme's
/// width) with their absmax, the uniforms (`Buffer` source, stochastic scheme) and the stage
/// (staged, quantized).
struct Moment {
    values: Option<Vec<f32>>,
    codes_u8: Option<Vec<u8>>,
    codes_i8: Option<Vec<i8>>,
    absmax: Option<Vec<f32>>,
    uniform: Option<Vec<f32>>,
    stage: Option<Vec<f32>>,
}

/// [`crate::KernelSpec::example_args`] of a quantized-AdamW kernel on `values`
/// (`n >= 1`, Philox uniforms), from its typed arguments (`QAdamC4C4Args`, ...): the parameter
/// is `values`; the gradient is `values` rotated by one with a NaN at the last element (n >= 2)
/// and `+inf` at the middle one (n >= 3); `f32` moments are `values[i] * 0.5` and
/// `|values[i]|`; quantized moments have codes mixed from the values and each absmax is the
/// NaN-propagating `max |x|` of the block's values (so 0, inf and NaN blocks reach the kernel);
/// hyperparameters are AdamW-like values at step 3, seed 1234, parameter id 3.
pub(crate) fn example_args(
    spec: &QAdamSpec,
    values: &[f32],
    mix: impl Fn(usize, f32) -> u32,
    float_bytes: impl Fn(DType, &[f32]) -> Vec<u8>,
) -> Result<Vec<OwnedArg>> {
    let n = values.len();
    let n32 =
        u32::try_from(n).map_err(|_| Error::Unsupported(format!("{n} elements exceed u32")))?;
    let hyper = AdamHyper {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.1,
    };
    let scalars = QAdamScalars::new(&hyper, 3)?;
    let (seed, param_id, offset) = (1234u64, 3u32, 0u32);
    let sizes = spec.sizes(n32);
    let mut p = float_bytes(spec.dtype, values);
    let g = float_bytes(spec.dtype, &crate::adam::example_grad(values));
    let moment = |which: usize, scheme: MomentScheme| -> Moment {
        let salt = 7919 * which;
        let uniform = (spec.uniforms == UniformSource::Buffer && scheme.stochastic()).then(|| {
            (0..n)
                .map(|i| (mix(i, values[i]) >> 8) as f32 / 16_777_216.0)
                .collect()
        });
        let stage = (spec.staged && scheme != MomentScheme::Fp32).then(|| vec![f32::NAN; n]);
        match scheme.bits() {
            32 => Moment {
                values: Some(
                    values
                        .iter()
                        .map(|v| if which == 0 { v * 0.5 } else { v.abs() })
                        .collect(),
                ),
                codes_u8: None,
                codes_i8: None,
                absmax: None,
                uniform,
                stage,
            },
            bits => {
                let (codes, _) = scheme.state_lens(n);
                let q: Vec<u8> = (0..codes)
                    .map(|i| mix(i + salt, values[(i * (8 / bits as usize)) % n]) as u8)
                    .collect();
                let absmax: Vec<f32> = values
                    .chunks(scheme.block() as usize)
                    .map(|c| {
                        c.iter().fold(0.0f32, |acc, v| {
                            if v.is_nan() || acc.is_nan() {
                                f32::NAN
                            } else {
                                acc.max(v.abs())
                            }
                        })
                    })
                    .collect();
                let (codes_u8, codes_i8) = if bits == 8 {
                    (None, Some(q.iter().map(|&c| c as i8).collect()))
                } else {
                    (Some(q), None)
                };
                Moment {
                    values: None,
                    codes_u8,
                    codes_i8,
                    absmax: Some(absmax),
                    uniform,
                    stage,
                }
            }
        }
    };
    let mut m1 = moment(0, spec.m1);
    let mut m2 = moment(1, spec.m2);
    macro_rules! args {
        ($build:path, $args:ident, $c1:ty, $c2:ty) => {{
            let kernel = $build(spec)?;
            OwnedArg::copy_all(&kernel.args(&mut $args {
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
                seed_lo: seed as u32,
                seed_hi: (seed >> 32) as u32,
                param_id,
                step: scalars.step,
                offset,
                p: FloatOut {
                    dtype: spec.dtype,
                    bytes: &mut p,
                },
                g: FloatIn {
                    dtype: spec.dtype,
                    bytes: &g,
                },
                m1: m1.values.as_deref_mut(),
                m1_code: <$c1 as CodeElem>::pick(
                    m1.codes_u8.as_deref_mut(),
                    m1.codes_i8.as_deref_mut(),
                ),
                m1_absmax: m1.absmax.as_deref_mut(),
                m2: m2.values.as_deref_mut(),
                m2_code: <$c2 as CodeElem>::pick(
                    m2.codes_u8.as_deref_mut(),
                    m2.codes_i8.as_deref_mut(),
                ),
                m2_absmax: m2.absmax.as_deref_mut(),
                m1_uniform: m1.uniform.as_deref(),
                m2_uniform: m2.uniform.as_deref(),
                m1_stage: m1.stage.as_deref_mut(),
                m2_stage: m2.stage.as_deref_mut(),
            })?)
        }};
    }
    Ok(match CodeTypes::of(spec) {
        CodeTypes::C4C4 => args!(qadamw_c4_c4, QAdamC4C4Args, u8, u8),
        CodeTypes::C4C8 => args!(qadamw_c4_c8, QAdamC4C8Args, u8, i8),
        CodeTypes::C8C4 => args!(qadamw_c8_c4, QAdamC8C4Args, i8, u8),
        CodeTypes::C8C8 => args!(qadamw_c8_c8, QAdamC8C8Args, i8, i8),
    })
}
