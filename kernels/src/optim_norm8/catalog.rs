//! The 8-bit LAMB / LARS kernels in the catalog: LAMB's partials and update on every float
//! dtype, LARS's on `f32`.

use qforge_ir::{Kernel, OwnedArg, Result};

use super::{example_args, OptimNorm8Spec};
use crate::catalog::{float_bytes, mix};
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
