//! The AdEMAMix kernels in the catalog: 32-bit and 8-bit state on `f32`.

use qforge_ir::{Kernel, OwnedArg, Result};

use qforge_ir::DType;

use super::{example_args, AdemamixSpec};
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
