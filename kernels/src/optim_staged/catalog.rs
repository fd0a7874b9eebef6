//! The staged 8-bit Adam / AdamW kernels in the catalog: both rules on `f32` and `bf16`, and
//! the `_gs` variants of the `_gs` catalog's 8-bit pairs (AdamW on `f32`, Adam on `bf16`).

use qforge_ir::{Kernel, OwnedArg, Result};

use qforge_ir::DType;

use super::OptimStagedSpec;
use crate::catalog::{float_bytes, mix};
use crate::CatalogEntry;
use crate::{OptimAlgo, OptimSpec, StateBits, OPTIM_BLOCKSIZE};

impl OptimStagedSpec {
    /// The catalog's staged kernels (module docs).
    pub fn variants() -> Vec<OptimStagedSpec> {
        [
            (OptimAlgo::Adam, DType::F32, false),
            (OptimAlgo::Adam, DType::BF16, false),
            (OptimAlgo::AdamW, DType::F32, false),
            (OptimAlgo::AdamW, DType::BF16, false),
            (OptimAlgo::AdamW, DType::F32, true),
            (OptimAlgo::Adam, DType::BF16, true),
        ]
        .into_iter()
        .map(|(algo, dtype, grad_opts)| OptimStagedSpec {
            spec: OptimSpec {
                algo,
                state: StateBits::Bits8,
                dtype,
            },
            grad_opts,
        })
        .collect()
    }
}

impl CatalogEntry for OptimStagedSpec {
    fn name(&self) -> String {
        OptimStagedSpec::name(self)
    }

    fn build(&self) -> Result<Kernel> {
        OptimStagedSpec::build(self)
    }

    fn blocksize(&self) -> usize {
        OPTIM_BLOCKSIZE as usize
    }

    fn example_args(&self, values: &[f32]) -> Result<Vec<OwnedArg>> {
        crate::adam::example_args_staged(self, values, mix, float_bytes)
    }
}
