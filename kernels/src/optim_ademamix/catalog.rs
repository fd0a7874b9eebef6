//! The AdEMAMix kernels in the catalog: 32-bit and 8-bit state on `f32`.

use qforge_ir::dsl::{FloatIn, FloatOut};
use qforge_ir::{DType, Kernel, OwnedArg, Result};

use super::{Ademamix32Args, Ademamix8Args, AdemamixHyper, AdemamixScalars, AdemamixSpec};
use crate::adam::{example_absmax, example_grad};
use crate::catalog::{float_bytes, mix};
use crate::CatalogEntry;
use crate::{StateBits, OPTIM_BLOCKSIZE};

impl AdemamixSpec {
    /// The catalog's AdEMAMix kernels (module docs).
    pub fn variants() -> Vec<AdemamixSpec> {
        [StateBits::Bits32, StateBits::Bits8]
            .into_iter()
            .map(|state| AdemamixSpec {
                state,
                dtype: DType::F32,
            })
            .collect()
    }
}

impl CatalogEntry for AdemamixSpec {
    fn name(&self) -> String {
        AdemamixSpec::name(self)
    }

    fn build(&self) -> Result<Kernel> {
        AdemamixSpec::build(self)
    }

    fn blocksize(&self) -> usize {
        OPTIM_BLOCKSIZE as usize
    }

    fn example_args(&self, values: &[f32]) -> Result<Vec<OwnedArg>> {
        example_args(self, values, mix, float_bytes)
    }
}

/// [`crate::KernelSpec::example_args`] of an AdEMAMix kernel on `values` (`n >= 1`), from its
/// typed arguments ([`Ademamix32Args`], [`Ademamix8Args`]): parameter `values`; gradient
/// `values` rotated by one with NaN at the last element (n >= 2) and `+inf` at the middle one
/// (n >= 3); 32-bit state `m1 = v/2`, `nu = |v|`, `m2 = v/4`; 8-bit codes mixed from the
/// values with absmax the NaN-ignoring `max |x|` of each block; default hyperparameters with
/// both schedulers, step 3.
pub(crate) fn example_args(
    spec: &AdemamixSpec,
    values: &[f32],
    mix: impl Fn(usize, f32) -> u32,
    float_bytes: impl Fn(DType, &[f32]) -> Vec<u8>,
) -> Result<Vec<OwnedArg>> {
    let n = values.len();
    let n_blocks = n.div_ceil(OPTIM_BLOCKSIZE as usize);
    let hyper = AdemamixHyper {
        t_alpha: Some(10),
        t_beta3: Some(10),
        ..AdemamixHyper::default()
    };
    let AdemamixScalars(
        [beta1, one_minus_beta1, beta2, one_minus_beta2, beta3, one_minus_beta3, alpha, c1, c2, eps, decay, neg_lr],
    ) = hyper.scalars(3)?;
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
    match spec.state {
        StateBits::Bits32 => {
            let [mut state1, mut state2, mut state3] = [0.5f32, -1.0, 0.25].map(|f| {
                values
                    .iter()
                    .map(|v| if f < 0.0 { v.abs() } else { v * f })
                    .collect::<Vec<f32>>()
            });
            let kernel = spec.typed32()?;
            Ok(OwnedArg::copy_all(&kernel.args(&mut Ademamix32Args {
                n: n as u32,
                n_blocks: n_blocks as u32,
                beta1,
                one_minus_beta1,
                beta2,
                one_minus_beta2,
                beta3,
                one_minus_beta3,
                alpha,
                c1,
                c2,
                eps,
                decay,
                neg_lr,
                p,
                g,
                state1: &mut state1,
                state2: &mut state2,
                state3: &mut state3,
            })?))
        }
        StateBits::Bits8 => {
            let [mut state1, mut state2, mut state3] = [0usize, 7919, 104_729].map(|salt| {
                values
                    .iter()
                    .enumerate()
                    .map(|(i, v)| mix(i + salt, *v) as u8)
                    .collect::<Vec<u8>>()
            });
            let [mut absmax1, mut absmax2, mut absmax3] = [(); 3].map(|()| example_absmax(values));
            let kernel = spec.typed8()?;
            Ok(OwnedArg::copy_all(&kernel.args(&mut Ademamix8Args {
                n: n as u32,
                n_blocks: n_blocks as u32,
                beta1,
                one_minus_beta1,
                beta2,
                one_minus_beta2,
                beta3,
                one_minus_beta3,
                alpha,
                c1,
                c2,
                eps,
                decay,
                neg_lr,
                p,
                g,
                state1: &mut state1,
                absmax1: &mut absmax1,
                state2: &mut state2,
                absmax2: &mut absmax2,
                state3: &mut state3,
                absmax3: &mut absmax3,
            })?))
        }
    }
}
