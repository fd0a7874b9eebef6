//! The `_gs` optimizer variants in the catalog (32-bit and 8-bit Adam / AdamW on `f32` and
//! `bf16`, every one-state rule with both widths), the gradient-norm kernel on every float dtype,
//! the `max_unorm` norm kernels of RMSprop and Adagrad (plain and `_gs`), and the `_gs` LAMB / LARS
//! kernels (32-bit LAMB on `f32` and `bf16`, 32-bit LARS, 8-bit LAMB and LARS on `f32`).

use qforge_ir::dsl::FloatIn;
use qforge_ir::{DType, Kernel, OwnedArg, Result};

use super::{grad_sqnorm, GradSqnormArgs, OptimExtSpec, EXAMPLE_GNORM_SCALE};
use crate::adam::example_grad;
use crate::catalog::{float_bytes, mix};
use crate::optim1::{Optim1Algo, Optim1Hyper};
use crate::optim_norm1::Optim1NormArgs;
use crate::CatalogEntry;
use crate::{
    NormRule, Optim1Spec, OptimAlgo, OptimNorm8Spec, OptimNormSpec, OptimSpec, StateBits,
    FLOAT_DTYPES, OPTIM_BLOCKSIZE,
};

impl OptimExtSpec {
    /// The catalog's `_gs` and norm kernels (module docs).
    pub fn variants() -> Vec<OptimExtSpec> {
        let mut out = Vec::new();
        for (algo, dtype) in [
            (OptimAlgo::AdamW, DType::F32),
            (OptimAlgo::Adam, DType::BF16),
        ] {
            for state in [StateBits::Bits32, StateBits::Bits8] {
                out.push(OptimExtSpec::Adam(OptimSpec { algo, state, dtype }));
            }
        }
        out.extend(Optim1Spec::variants().into_iter().map(OptimExtSpec::One));
        out.extend(FLOAT_DTYPES.iter().map(|&d| OptimExtSpec::GradNorm(d)));
        for &a in crate::optim_norm1::NORM1_ALGOS.iter() {
            out.extend([OptimExtSpec::Norm1(a), OptimExtSpec::Norm1Gs(a)]);
        }
        for (rule, dtype) in [
            (NormRule::Lamb, DType::F32),
            (NormRule::Lamb, DType::BF16),
            (NormRule::Lars, DType::F32),
        ] {
            out.push(OptimExtSpec::Norm(OptimNormSpec::Partials { rule, dtype }));
            out.push(OptimExtSpec::Norm(OptimNormSpec::Update { rule, dtype }));
        }
        for rule in NormRule::ALL {
            let dtype = DType::F32;
            out.push(OptimExtSpec::Norm8(OptimNorm8Spec::Partials {
                rule,
                dtype,
            }));
            out.push(OptimExtSpec::Norm8(OptimNorm8Spec::Update { rule, dtype }));
        }
        out
    }
}

impl CatalogEntry for OptimExtSpec {
    fn name(&self) -> String {
        OptimExtSpec::name(self)
    }

    fn build(&self) -> Result<Kernel> {
        OptimExtSpec::build(self)
    }

    fn blocksize(&self) -> usize {
        OPTIM_BLOCKSIZE as usize
    }

    fn example_args(&self, values: &[f32]) -> Result<Vec<OwnedArg>> {
        example_args(self, values, mix, float_bytes)
    }
}

/// [`crate::KernelSpec::example_args`] of a `_gs` variant, from the kernel's typed arguments:
/// the plain kernel's example arguments ([`crate::adam`]'s, [`crate::optim1`]'s,
/// ...) with `gnorm_scale = 0.75` and, where taken, `skip_zeros = 1` (the example values contain
/// zeros, so skipped elements occur). The norm kernel takes the gradient `values`.
pub(crate) fn example_args(
    spec: &OptimExtSpec,
    values: &[f32],
    mix: impl Fn(usize, f32) -> u32,
    float_bytes: impl Fn(DType, &[f32]) -> Vec<u8>,
) -> Result<Vec<OwnedArg>> {
    let gs = Some(EXAMPLE_GNORM_SCALE);
    match spec {
        OptimExtSpec::Adam(s) => crate::adam::example_args_gs(s, values, mix, float_bytes, gs),
        OptimExtSpec::One(s) => crate::optim1::example_args_gs(s, values, mix, float_bytes, gs),
        OptimExtSpec::GradNorm(d) => {
            let n = values.len();
            let n_blocks = n.div_ceil(OPTIM_BLOCKSIZE as usize);
            let g = float_bytes(*d, values);
            let kernel = grad_sqnorm(*d)?;
            Ok(OwnedArg::copy_all(&kernel.args(&mut GradSqnormArgs {
                n: n as u32,
                n_blocks: n_blocks as u32,
                g: FloatIn {
                    dtype: *d,
                    bytes: &g,
                },
                gnorm_part: &mut vec![0.0; n_blocks],
            })?))
        }
        OptimExtSpec::Norm1(a) => norm1_example_args(*a, values, float_bytes, None),
        OptimExtSpec::Norm1Gs(a) => norm1_example_args(*a, values, float_bytes, gs),
        OptimExtSpec::Norm(s) => crate::optim_norm::example_args_gs(s, values, float_bytes, gs),
        OptimExtSpec::Norm8(s) => {
            crate::optim_norm8::example_args_gs(s, values, mix, float_bytes, gs)
        }
    }
}

/// The example arguments of `{algo}_norm_f32` (`gnorm_scale: None`) or its `_gs` variant:
/// parameter `values`, the optimizers' example gradient (NaN, inf), state `|values| * 0.5`,
/// weight decay 0.01 at step 3.
fn norm1_example_args(
    algo: Optim1Algo,
    values: &[f32],
    float_bytes: impl Fn(DType, &[f32]) -> Vec<u8>,
    gnorm_scale: Option<f32>,
) -> Result<Vec<OwnedArg>> {
    let n = values.len();
    let n_blocks = n.div_ceil(OPTIM_BLOCKSIZE as usize);
    let h = Optim1Hyper {
        weight_decay: 0.01,
        ..Optim1Hyper::defaults(algo)
    };
    let s = h.scalars(algo, 3)?;
    let p = float_bytes(DType::F32, values);
    let g = float_bytes(DType::F32, &example_grad(values));
    let state1: Vec<f32> = values.iter().map(|v| v.abs() * 0.5).collect();
    let kernel = crate::optim_norm1::typed(algo, gnorm_scale.is_some())?;
    Ok(OwnedArg::copy_all(&kernel.args(&mut Optim1NormArgs {
        n: n as u32,
        n_blocks: n_blocks as u32,
        beta1: s.beta1,
        one_minus_beta1: s.one_minus_beta1,
        eps: s.eps,
        gnorm_scale,
        p: FloatIn {
            dtype: DType::F32,
            bytes: &p,
        },
        g: FloatIn {
            dtype: DType::F32,
            bytes: &g,
        },
        state1: &state1,
        unorm_part: &mut vec![0.0; n_blocks],
        pnorm_part: &mut vec![0.0; n_blocks],
    })?))
}
