//! The `_gs` optimizer variants in the catalog (32-bit and 8-bit Adam / AdamW on `f32` and
//! `bf16`, every one-state rule with both widths), the gradient-norm kernel on every float dtype,
//! the `max_unorm` norm kernels of RMSprop and Adagrad (plain and `_gs`), and the `_gs` LAMB / LARS
//! kernels (32-bit LAMB on `f32` and `bf16`, 32-bit LARS, 8-bit LAMB and LARS on `f32`).

use qforge_ir::{Kernel, OwnedArg, Result};

use qforge_ir::DType;

use super::{example_args, OptimExtSpec};
use crate::catalog::{float_bytes, mix};
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
