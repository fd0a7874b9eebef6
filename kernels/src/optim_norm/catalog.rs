//! The 32-bit LAMB / LARS kernels in the catalog: LAMB's partials and update on `f32` and
//! `bf16`, LARS's on `f32`, and the shared scale kernel.

use qforge_ir::{Kernel, OwnedArg, Result};

use qforge_ir::DType;

use super::{example_args, NormRule, OptimNormSpec};
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
