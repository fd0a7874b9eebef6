//! The Adam / AdamW kernels in the catalog: 32-bit and 8-bit state on `f32` and `bf16`
//! parameters, plus 8-bit AdamW on `f16`; example arguments in [`example_args`].

use qforge_ir::{Kernel, OwnedArg, Result};

use qforge_ir::DType;

use super::{example_args, OptimAlgo, OptimSpec, StateBits, OPTIM_BLOCKSIZE};
use crate::catalog::{float_bytes, mix};
use crate::CatalogEntry;

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
