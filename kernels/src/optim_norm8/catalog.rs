//! The 8-bit LAMB / LARS kernels in the catalog: LAMB's partials and update on every float
//! dtype, LARS's on `f32`.

use qforge_ir::dsl::{FloatIn, FloatOut};
use qforge_ir::{DType, Kernel, OwnedArg, Result};

use super::{kernel, lamb8_update, lars8_update, Lamb8NormArgs, Lars8NormArgs, OptimNorm8Spec};
use crate::adam::{example_absmax, example_grad, Adam8bitArgs};
use crate::catalog::{float_bytes, mix};
use crate::optim1::Optim1Update8Args;
use crate::optim_norm::{LambHyper, LarsHyper, EXAMPLE_SCALE, EXAMPLE_STEP};
use crate::CatalogEntry;
use crate::{NormRule, OPTIM_BLOCKSIZE};

impl OptimNorm8Spec {
    /// The catalog's 8-bit LAMB / LARS kernels (module docs).
    pub fn variants() -> Vec<OptimNorm8Spec> {
        let mut out = Vec::new();
        for rule in NormRule::ALL {
            for &dtype in rule.param_dtypes() {
                out.push(OptimNorm8Spec::Partials { rule, dtype });
                out.push(OptimNorm8Spec::Update { rule, dtype });
            }
        }
        out
    }
}

impl CatalogEntry for OptimNorm8Spec {
    fn name(&self) -> String {
        OptimNorm8Spec::name(self)
    }

    fn build(&self) -> Result<Kernel> {
        OptimNorm8Spec::build(self)
    }

    fn blocksize(&self) -> usize {
        OPTIM_BLOCKSIZE as usize
    }

    fn example_args(&self, values: &[f32]) -> Result<Vec<OwnedArg>> {
        example_args(self, values, mix, float_bytes)
    }
}

/// [`crate::KernelSpec::example_args`] of an 8-bit update-norm kernel on `values`
/// (`n >= 1`), from its typed arguments, as the 8-bit AdamW / SGD kernels' ([`crate::adam`]):
/// parameter `values`; gradient `values` rotated by one with NaN at the last element (n >= 2)
/// and `+inf` at the middle one (n >= 3); codes mixed from the values, `absmax1` the NaN-ignoring
/// `max |x|` of each block of the values and `absmax2` its square; weight decay 0.01 at step 3;
/// the update kernels read `scale = 0.375`.
pub(crate) fn example_args(
    spec: &OptimNorm8Spec,
    values: &[f32],
    mix: impl Fn(usize, f32) -> u32,
    float_bytes: impl Fn(DType, &[f32]) -> Vec<u8>,
) -> Result<Vec<OwnedArg>> {
    example_args_gs(spec, values, mix, float_bytes, None)
}

/// [`example_args`] of the plain kernel (`gnorm_scale: None`) or of its `_gs` variant
/// ([`crate::optim_ext`]) with `gnorm_scale` and, for `lars8bit_f32_gs`, `skip_zeros = 1`.
pub(crate) fn example_args_gs(
    spec: &OptimNorm8Spec,
    values: &[f32],
    mix: impl Fn(usize, f32) -> u32,
    float_bytes: impl Fn(DType, &[f32]) -> Vec<u8>,
    gnorm_scale: Option<f32>,
) -> Result<Vec<OwnedArg>> {
    let n = values.len();
    let n_blocks = n.div_ceil(OPTIM_BLOCKSIZE as usize);
    let (rule, dtype) = spec.rule_dtype();
    let partials = matches!(spec, OptimNorm8Spec::Partials { .. });
    let gs = gnorm_scale.is_some();
    let name = if gs {
        crate::OptimExtSpec::Norm8(*spec).name()
    } else {
        spec.name()
    };
    let lamb = LambHyper {
        weight_decay: 0.01,
        ..LambHyper::default()
    };
    let lars = LarsHyper {
        weight_decay: 0.01,
        ..LarsHyper::default()
    };
    let mut p = float_bytes(dtype, values);
    let g = float_bytes(dtype, &example_grad(values));
    let g = FloatIn { dtype, bytes: &g };
    let mut absmax1 = example_absmax(values);
    let mut absmax2: Vec<f32> = absmax1.iter().map(|a| a * a).collect();
    let codes = |salt: usize| -> Vec<u8> {
        values
            .iter()
            .enumerate()
            .map(|(i, v)| mix(i + salt, *v) as u8)
            .collect()
    };
    let (mut state1, mut state2) = (codes(0), codes(7919));
    let mut unorm_part = vec![0.0; n_blocks];
    let mut pnorm_part = vec![0.0; n_blocks];
    let scale = [EXAMPLE_SCALE];
    let n = n as u32;
    let n_blocks = n_blocks as u32;
    match (rule, partials) {
        (NormRule::Lamb, true) => {
            let s = lamb.scalars(EXAMPLE_STEP)?;
            Ok(OwnedArg::copy_all(
                &kernel::lamb8_norm(dtype, &name, gs)?.args(&mut Lamb8NormArgs {
                    n,
                    n_blocks,
                    beta1: s.beta1,
                    one_minus_beta1: s.one_minus_beta1,
                    beta2: s.beta2,
                    one_minus_beta2: s.one_minus_beta2,
                    inv_c1: s.inv_c1,
                    inv_c2: s.inv_c2,
                    eps: s.eps,
                    gnorm_scale,
                    p: FloatIn { dtype, bytes: &p },
                    g,
                    state1: &state1,
                    absmax1: &absmax1,
                    state2: &state2,
                    absmax2: &absmax2,
                    unorm_part: &mut unorm_part,
                    pnorm_part: &mut pnorm_part,
                })?,
            ))
        }
        (NormRule::Lamb, false) => {
            let s = lamb.update8_scalars(EXAMPLE_STEP)?;
            Ok(OwnedArg::copy_all(&lamb8_update(dtype, &name, gs)?.args(
                &mut Adam8bitArgs {
                    n,
                    n_blocks,
                    beta1: s.beta1,
                    one_minus_beta1: s.one_minus_beta1,
                    beta2: s.beta2,
                    one_minus_beta2: s.one_minus_beta2,
                    decay: Some(s.decay),
                    step_size: s.step_size,
                    c2: s.c2,
                    eps: s.eps,
                    gnorm_scale,
                    p: FloatOut {
                        dtype,
                        bytes: &mut p,
                    },
                    g,
                    state1: &mut state1,
                    absmax1: &mut absmax1,
                    state2: &mut state2,
                    absmax2: &mut absmax2,
                    scale: Some(&scale),
                    m_stage: None,
                    v_stage: None,
                },
            )?))
        }
        (NormRule::Lars, true) => {
            let s = lars.scalars(EXAMPLE_STEP)?;
            Ok(OwnedArg::copy_all(&kernel::lars8_norm(&name, gs)?.args(
                &mut Lars8NormArgs {
                    n,
                    n_blocks,
                    first: s.first,
                    momentum: s.momentum,
                    gnorm_scale,
                    p: FloatIn { dtype, bytes: &p },
                    g,
                    state1: &state1,
                    absmax1: &absmax1,
                    unorm_part: &mut unorm_part,
                    pnorm_part: &mut pnorm_part,
                },
            )?))
        }
        (NormRule::Lars, false) => {
            let s = lars.update8_scalars(EXAMPLE_STEP)?;
            Ok(OwnedArg::copy_all(&lars8_update(&name, gs)?.args(
                &mut Optim1Update8Args {
                    n,
                    n_blocks,
                    first: s.first,
                    beta1: s.beta1,
                    one_minus_beta1: s.one_minus_beta1,
                    beta2: s.beta2,
                    one_minus_beta2: s.one_minus_beta2,
                    weight_decay: s.weight_decay,
                    decay: s.decay,
                    eps: s.eps,
                    lr: s.lr,
                    neg_lr: s.neg_lr,
                    gnorm_scale,
                    skip_zeros: gs.then_some(1),
                    p: FloatOut {
                        dtype,
                        bytes: &mut p,
                    },
                    g,
                    state1: &mut state1,
                    absmax1: &mut absmax1,
                    scale: Some(&scale),
                },
            )?))
        }
    }
}
