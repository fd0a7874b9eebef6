//! The Adam / AdamW kernels in the catalog: 32-bit and 8-bit state on `f32` and `bf16`
//! parameters, plus 8-bit AdamW on `f16`; example arguments in [`example_args`].

use qforge_ir::dsl::{FloatIn, FloatOut};
use qforge_ir::{DType, Error, Kernel, OwnedArg, Result};

use super::{
    example_absmax, example_grad, Adam32Args, Adam8bitArgs, AdamHyper, Form, OptimAlgo, OptimSpec,
    StateBits, EXAMPLE_STEP, OPTIM_BLOCKSIZE,
};
use crate::catalog::{float_bytes, mix};
use crate::CatalogEntry;
use crate::OptimExtSpec;
use crate::OptimStagedSpec;

impl OptimSpec {
    /// The catalog's Adam / AdamW kernels (module docs).
    pub fn variants() -> Vec<OptimSpec> {
        let mut out = Vec::new();
        for algo in [OptimAlgo::Adam, OptimAlgo::AdamW] {
            for state in [StateBits::Bits32, StateBits::Bits8] {
                for dtype in [DType::F32, DType::BF16] {
                    out.push(OptimSpec { algo, state, dtype });
                }
            }
        }
        out.push(OptimSpec {
            algo: OptimAlgo::AdamW,
            state: StateBits::Bits8,
            dtype: DType::F16,
        });
        out
    }
}

impl CatalogEntry for OptimSpec {
    fn name(&self) -> String {
        OptimSpec::name(self)
    }

    fn build(&self) -> Result<Kernel> {
        OptimSpec::build(self)
    }

    fn blocksize(&self) -> usize {
        OPTIM_BLOCKSIZE as usize
    }

    fn example_args(&self, values: &[f32]) -> Result<Vec<OwnedArg>> {
        example_args(self, values, mix, float_bytes)
    }
}

/// [`crate::KernelSpec::example_args`] of an optimizer kernel on `values` (`n >= 1`), from its
/// typed arguments ([`Adam32Args`], [`Adam8bitArgs`]): the parameter is `values`; the gradient
/// is `values` rotated by one with a NaN at the last element (n >= 2) and `+inf` at the middle
/// one (n >= 3); 32-bit state is `m = values[i] * 0.5`, `v = |values[i]|`; 8-bit codes are
/// mixed from the values and each absmax is the NaN-ignoring `max |x|` of the block's values
/// (0, inf and NaN-only blocks included).
pub(crate) fn example_args(
    spec: &OptimSpec,
    values: &[f32],
    mix: impl Fn(usize, f32) -> u32,
    float_bytes: impl Fn(DType, &[f32]) -> Vec<u8>,
) -> Result<Vec<OwnedArg>> {
    example_args_gs(spec, values, mix, float_bytes, None)
}

/// [`example_args`] of the plain kernel (`gnorm_scale: None`) or of its `_gs` variant
/// ([`crate::optim_ext`]) with `gnorm_scale` and, where the kernel takes it, `skip_zeros = 1`.
pub(crate) fn example_args_gs(
    spec: &OptimSpec,
    values: &[f32],
    mix: impl Fn(usize, f32) -> u32,
    float_bytes: impl Fn(DType, &[f32]) -> Vec<u8>,
    gnorm_scale: Option<f32>,
) -> Result<Vec<OwnedArg>> {
    example_args_with(spec, values, mix, float_bytes, gnorm_scale, None)
}

/// [`example_args`] of a staged kernel ([`crate::optim_staged`]): the plain (or `_gs`, with
/// `gnorm_scale = 0.75`) kernel's example arguments, then both stages filled with NaN (contents
/// the kernel must not read).
pub(crate) fn example_args_staged(
    staged: &OptimStagedSpec,
    values: &[f32],
    mix: impl Fn(usize, f32) -> u32,
    float_bytes: impl Fn(DType, &[f32]) -> Vec<u8>,
) -> Result<Vec<OwnedArg>> {
    let gnorm_scale = staged
        .grad_opts
        .then_some(crate::optim_ext::EXAMPLE_GNORM_SCALE);
    example_args_with(
        &staged.spec,
        values,
        mix,
        float_bytes,
        gnorm_scale,
        Some(staged),
    )
}

/// The example arguments of `spec`'s kernel: plain, `_gs` (`gnorm_scale`) and/or `staged`.
fn example_args_with(
    spec: &OptimSpec,
    values: &[f32],
    mix: impl Fn(usize, f32) -> u32,
    float_bytes: impl Fn(DType, &[f32]) -> Vec<u8>,
    gnorm_scale: Option<f32>,
    staged: Option<&OptimStagedSpec>,
) -> Result<Vec<OwnedArg>> {
    let gs = gnorm_scale.is_some();
    let skip_zeros = gs.then_some(1);
    let n = values.len();
    let n_blocks = n.div_ceil(OPTIM_BLOCKSIZE as usize);
    let hyper = AdamHyper {
        weight_decay: if spec.algo == OptimAlgo::AdamW {
            0.01
        } else {
            0.0
        },
        ..AdamHyper::default()
    };
    let s = hyper.scalars(spec, EXAMPLE_STEP)?;
    let decay = (spec.algo == OptimAlgo::AdamW).then_some(s.decay);
    let mut p = float_bytes(spec.dtype, values);
    let g = float_bytes(spec.dtype, &example_grad(values));
    let p = FloatOut {
        dtype: spec.dtype,
        bytes: &mut p,
    };
    let g = FloatIn {
        dtype: spec.dtype,
        bytes: &g,
    };
    let name = if gs {
        OptimExtSpec::Adam(*spec).name()
    } else {
        spec.name()
    };
    match spec.state {
        StateBits::Bits32 if staged.is_some() => Err(Error::Unsupported(format!(
            "{name}: only 8-bit state has a staged kernel"
        ))),
        StateBits::Bits32 => {
            let mut m: Vec<f32> = values.iter().map(|v| v * 0.5).collect();
            let mut v: Vec<f32> = values.iter().map(|v| v.abs()).collect();
            let kernel = spec.typed32(&name, gs)?;
            Ok(OwnedArg::copy_all(&kernel.args(&mut Adam32Args {
                n: n as u32,
                n_blocks: n_blocks as u32,
                beta1: s.beta1,
                one_minus_beta1: s.one_minus_beta1,
                beta2: s.beta2,
                one_minus_beta2: s.one_minus_beta2,
                decay,
                step_size: s.step_size,
                eps_c2: s.eps_c2,
                gnorm_scale,
                skip_zeros,
                p,
                g,
                state1: &mut m,
                state2: &mut v,
            })?))
        }
        StateBits::Bits8 => {
            let mut absmax1 = example_absmax(values);
            let codes = |salt: usize| -> Vec<u8> {
                values
                    .iter()
                    .enumerate()
                    .map(|(i, v)| mix(i + salt, *v) as u8)
                    .collect()
            };
            let (mut state1, mut state2) = (codes(0), codes(7919));
            let mut absmax2: Vec<f32> = absmax1.iter().map(|a| a * a).collect();
            let kernel = match staged {
                Some(st) => st.typed()?,
                None => spec.typed8(
                    &name,
                    Form {
                        grad_opts: gs,
                        ..Form::default()
                    },
                )?,
            };
            let mut m_stage = vec![f32::NAN; n];
            let mut v_stage = vec![f32::NAN; n];
            Ok(OwnedArg::copy_all(&kernel.args(&mut Adam8bitArgs {
                n: n as u32,
                n_blocks: n_blocks as u32,
                beta1: s.beta1,
                one_minus_beta1: s.one_minus_beta1,
                beta2: s.beta2,
                one_minus_beta2: s.one_minus_beta2,
                decay,
                step_size: s.step_size,
                c2: s.c2,
                eps: s.eps,
                gnorm_scale,
                p,
                g,
                state1: &mut state1,
                absmax1: &mut absmax1,
                state2: &mut state2,
                absmax2: &mut absmax2,
                scale: None,
                m_stage: staged.map(|_| &mut m_stage[..]),
                v_stage: staged.map(|_| &mut v_stage[..]),
            })?))
        }
    }
}
