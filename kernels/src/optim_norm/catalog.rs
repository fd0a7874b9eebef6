//! The 32-bit LAMB / LARS kernels in the catalog: LAMB's partials and update on `f32` and
//! `bf16`, LARS's on `f32`, and the shared scale kernel.

use qforge_ir::dsl::{FloatIn, FloatOut};
use qforge_ir::{DType, Kernel, OwnedArg, Result};

use super::{
    kernel, Lamb32Args, LambHyper, LambNormArgs, Lars32Args, LarsHyper, LarsNormArgs, NormRule,
    OptimNormScaleArgs, OptimNormSpec, EXAMPLE_SCALE, EXAMPLE_STEP,
};
use crate::adam::example_grad;
use crate::catalog::float_bytes;
use crate::CatalogEntry;
use crate::OPTIM_BLOCKSIZE;

impl OptimNormSpec {
    /// The catalog's LAMB / LARS kernels (module docs).
    pub fn variants() -> Vec<OptimNormSpec> {
        let mut out = Vec::new();
        for (rule, dtypes) in [
            (NormRule::Lamb, &[DType::F32, DType::BF16][..]),
            (NormRule::Lars, &[DType::F32][..]),
        ] {
            for &dtype in dtypes {
                out.push(OptimNormSpec::Partials { rule, dtype });
                out.push(OptimNormSpec::Update { rule, dtype });
            }
        }
        out.push(OptimNormSpec::Scale);
        out
    }
}

impl CatalogEntry for OptimNormSpec {
    fn name(&self) -> String {
        OptimNormSpec::name(self)
    }

    fn build(&self) -> Result<Kernel> {
        OptimNormSpec::build(self)
    }

    fn blocksize(&self) -> usize {
        OPTIM_BLOCKSIZE as usize
    }

    fn example_args(&self, values: &[f32]) -> Result<Vec<OwnedArg>> {
        example_args(self, values, float_bytes)
    }
}

/// [`crate::KernelSpec::example_args`] of an update-norm kernel on `values`
/// (`n >= 1`), from its typed arguments: parameter `values`, gradient `values` rotated by one
/// with NaN at the last element (n >= 2) and `+inf` at the middle one (n >= 3),
/// `state1 = values * 0.5`, `state2 = |values|`; weight decay 0.01 at step 3; the update kernels
/// read `scale = 0.375`. The scale kernel takes `n` partials: `unorm_part = values * values`,
/// `pnorm_part = |values|` rotated by one (so NaN, inf and zero partials reach it).
pub(crate) fn example_args(
    spec: &OptimNormSpec,
    values: &[f32],
    float_bytes: impl Fn(DType, &[f32]) -> Vec<u8>,
) -> Result<Vec<OwnedArg>> {
    example_args_gs(spec, values, float_bytes, None)
}

/// [`example_args`] of the plain kernel (`gnorm_scale: None`) or of its `_gs` variant
/// ([`crate::optim_ext`]) with `gnorm_scale` and, for the update kernels, `skip_zeros = 1`.
pub(crate) fn example_args_gs(
    spec: &OptimNormSpec,
    values: &[f32],
    float_bytes: impl Fn(DType, &[f32]) -> Vec<u8>,
    gnorm_scale: Option<f32>,
) -> Result<Vec<OwnedArg>> {
    let n = values.len();
    let n_blocks = n.div_ceil(OPTIM_BLOCKSIZE as usize);
    let gs = gnorm_scale.is_some();
    let skip_zeros = gs.then_some(1);
    let (rule, dtype, partials) = match *spec {
        OptimNormSpec::Scale => {
            let up: Vec<f32> = values.iter().map(|v| v * v).collect();
            let pp: Vec<f32> = (0..n).map(|i| values[(i + 1) % n].abs()).collect();
            let kernel = kernel::optim_norm_scale()?;
            return Ok(OwnedArg::copy_all(&kernel.args(
                &mut OptimNormScaleArgs {
                    n_blocks: n as u32,
                    max_unorm: 1.0,
                    eps: 0.0,
                    unorm_part: &up,
                    pnorm_part: &pp,
                    scale: &mut [0.0],
                },
            )?));
        }
        OptimNormSpec::Partials { rule, dtype } => (rule, dtype, true),
        OptimNormSpec::Update { rule, dtype } => (rule, dtype, false),
    };
    let name = if gs {
        crate::OptimExtSpec::Norm(*spec).name()
    } else {
        spec.name()
    };
    let mut p = float_bytes(dtype, values);
    let g = float_bytes(dtype, &example_grad(values));
    let g = FloatIn { dtype, bytes: &g };
    let mut state1: Vec<f32> = values.iter().map(|v| v * 0.5).collect();
    let mut state2: Vec<f32> = values.iter().map(|v| v.abs()).collect();
    let mut unorm_part = vec![0.0; n_blocks];
    let mut pnorm_part = vec![0.0; n_blocks];
    let scale = [EXAMPLE_SCALE];
    let n = n as u32;
    let n_blocks = n_blocks as u32;
    let args = match rule {
        NormRule::Lamb => {
            let s = LambHyper {
                weight_decay: 0.01,
                ..LambHyper::default()
            }
            .scalars(EXAMPLE_STEP)?;
            if partials {
                OwnedArg::copy_all(&kernel::lamb_norm(dtype, &name, gs)?.args(
                    &mut LambNormArgs {
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
                        state2: &state2,
                        unorm_part: &mut unorm_part,
                        pnorm_part: &mut pnorm_part,
                    },
                )?)
            } else {
                OwnedArg::copy_all(&kernel::lamb32(dtype, &name, gs)?.args(&mut Lamb32Args {
                    n,
                    n_blocks,
                    beta1: s.beta1,
                    one_minus_beta1: s.one_minus_beta1,
                    beta2: s.beta2,
                    one_minus_beta2: s.one_minus_beta2,
                    decay: s.decay,
                    step_size: s.step_size,
                    eps_c2: s.eps_c2,
                    gnorm_scale,
                    skip_zeros,
                    p: FloatOut {
                        dtype,
                        bytes: &mut p,
                    },
                    g,
                    state1: &mut state1,
                    state2: &mut state2,
                    scale: &scale,
                })?)
            }
        }
        NormRule::Lars => {
            let s = LarsHyper {
                weight_decay: 0.01,
                ..LarsHyper::default()
            }
            .scalars(EXAMPLE_STEP)?;
            if partials {
                OwnedArg::copy_all(&kernel::lars_norm(&name, gs)?.args(&mut LarsNormArgs {
                    n,
                    n_blocks,
                    first: s.first,
                    momentum: s.momentum,
                    gnorm_scale,
                    p: FloatIn { dtype, bytes: &p },
                    g,
                    state1: &state1,
                    unorm_part: &mut unorm_part,
                    pnorm_part: &mut pnorm_part,
                })?)
            } else {
                OwnedArg::copy_all(&kernel::lars32(&name, gs)?.args(&mut Lars32Args {
                    n,
                    n_blocks,
                    first: s.first,
                    momentum: s.momentum,
                    weight_decay: s.weight_decay,
                    neg_lr: s.neg_lr,
                    gnorm_scale,
                    skip_zeros,
                    p: FloatOut {
                        dtype,
                        bytes: &mut p,
                    },
                    g,
                    state1: &mut state1,
                    scale: &scale,
                })?)
            }
        }
    };
    Ok(args)
}
