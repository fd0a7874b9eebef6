//! The one-state optimizer kernels in the catalog: each rule (Lion, SGD, RMSprop, Adagrad)
//! with 32-bit and 8-bit state on `f32`.

use qforge_ir::dsl::{FloatIn, FloatOut};
use qforge_ir::{DType, Kernel, OwnedArg, Result};

use super::{kernel, Optim1Algo, Optim1Hyper, Optim1Spec, Optim1Update32Args, Optim1Update8Args};
use crate::adam::{example_absmax, example_grad};
use crate::catalog::{float_bytes, mix};
use crate::CatalogEntry;
use crate::OptimExtSpec;
use crate::{StateBits, OPTIM_BLOCKSIZE};

impl Optim1Spec {
    /// The catalog's one-state kernels (module docs).
    pub fn variants() -> Vec<Optim1Spec> {
        let mut out = Vec::new();
        for algo in Optim1Algo::ALL {
            for state in [StateBits::Bits32, StateBits::Bits8] {
                out.push(Optim1Spec {
                    algo,
                    state,
                    dtype: DType::F32,
                });
            }
        }
        out
    }
}

impl CatalogEntry for Optim1Spec {
    fn name(&self) -> String {
        Optim1Spec::name(self)
    }

    fn build(&self) -> Result<Kernel> {
        Optim1Spec::build(self)
    }

    fn blocksize(&self) -> usize {
        OPTIM_BLOCKSIZE as usize
    }

    fn example_args(&self, values: &[f32]) -> Result<Vec<OwnedArg>> {
        example_args(self, values, mix, float_bytes)
    }
}

/// The step of the catalog's example arguments (not 1, so SGD's momentum path runs).
const EXAMPLE_STEP: u32 = 3;

/// [`crate::KernelSpec::example_args`] of a one-state optimizer kernel on `values`
/// (`n >= 1`), from its typed arguments ([`Optim1Update32Args`], [`Optim1Update8Args`]):
/// parameter `values`; gradient `values` rotated by one with NaN at the last element (n >= 2)
/// and `+inf` at the middle one (n >= 3); 32-bit state `|values[i]| * 0.5` (Lion and SGD:
/// `values[i] * 0.5`); 8-bit codes mixed from the values, absmax the NaN-ignoring `max |x|` of
/// each block; hyperparameters with weight decay 0.01 (coupled and decoupled paths both run).
pub(crate) fn example_args(
    spec: &Optim1Spec,
    values: &[f32],
    mix: impl Fn(usize, f32) -> u32,
    float_bytes: impl Fn(DType, &[f32]) -> Vec<u8>,
) -> Result<Vec<OwnedArg>> {
    example_args_gs(spec, values, mix, float_bytes, None)
}

/// [`example_args`] of the plain kernel (`gnorm_scale: None`) or of its `_gs` variant
/// ([`crate::optim_ext`]) with `gnorm_scale` and, where the kernel takes it, `skip_zeros = 1`.
pub(crate) fn example_args_gs(
    spec: &Optim1Spec,
    values: &[f32],
    mix: impl Fn(usize, f32) -> u32,
    float_bytes: impl Fn(DType, &[f32]) -> Vec<u8>,
    gnorm_scale: Option<f32>,
) -> Result<Vec<OwnedArg>> {
    let gs = gnorm_scale.is_some();
    let skip_zeros = gs.then_some(1);
    let n = values.len();
    let n_blocks = n.div_ceil(OPTIM_BLOCKSIZE as usize);
    let hyper = Optim1Hyper {
        weight_decay: 0.01,
        ..Optim1Hyper::defaults(spec.algo)
    };
    let s = hyper.scalars(spec.algo, EXAMPLE_STEP)?;
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
        OptimExtSpec::One(*spec).name()
    } else {
        spec.name()
    };
    match spec.state {
        StateBits::Bits32 => {
            let signed = matches!(spec.algo, Optim1Algo::Lion | Optim1Algo::Sgd);
            let mut state1: Vec<f32> = values
                .iter()
                .map(|v| if signed { v * 0.5 } else { v.abs() * 0.5 })
                .collect();
            let kernel = kernel::optim1_32bit(spec, &name, gs, false)?;
            Ok(OwnedArg::copy_all(&kernel.args(
                &mut Optim1Update32Args {
                    n: n as u32,
                    n_blocks: n_blocks as u32,
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
                    skip_zeros,
                    p,
                    g,
                    state1: &mut state1,
                    scale: None,
                },
            )?))
        }
        StateBits::Bits8 => {
            let mut absmax1 = example_absmax(values);
            let mut state1: Vec<u8> = values
                .iter()
                .enumerate()
                .map(|(i, v)| mix(i, *v) as u8)
                .collect();
            let kernel = kernel::optim1_8bit(spec, &name, gs, false)?;
            Ok(OwnedArg::copy_all(&kernel.args(
                &mut Optim1Update8Args {
                    n: n as u32,
                    n_blocks: n_blocks as u32,
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
                    skip_zeros,
                    p,
                    g,
                    state1: &mut state1,
                    absmax1: &mut absmax1,
                    scale: None,
                },
            )?))
        }
    }
}
