//! The dense products in the catalog ([`Gemm::catalog`]).

use qforge_ir::{Kernel, OwnedArg, Result};

use super::Gemm;
use crate::catalog::float_bytes;
use crate::CatalogEntry;

impl CatalogEntry for Gemm {
    fn name(&self) -> String {
        Gemm::name(self)
    }

    fn build(&self) -> Result<Kernel> {
        Gemm::build(self)
    }

    fn blocksize(&self) -> usize {
        64
    }

    fn example_args(&self, values: &[f32]) -> Result<Vec<OwnedArg>> {
        Ok(Gemm::example_args(self, values, float_bytes))
    }
}
