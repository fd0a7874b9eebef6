//! The one-state optimizer kernels in the catalog: each rule (Lion, SGD, RMSprop, Adagrad)
//! with 32-bit and 8-bit state on `f32`.

use qforge_ir::{Kernel, OwnedArg, Result};

use qforge_ir::DType;

use super::{example_args, Optim1Algo, Optim1Spec};
use crate::catalog::{float_bytes, mix};
use crate::CatalogEntry;
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
