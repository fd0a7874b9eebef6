//! The quantized-AdamW kernels in the catalog: the ZIP-SR and ZE-EDEN recipes on `f32` and
//! `bf16`, 8-bit linear on `f32`, NF4 stochastic rounding with `dyn4_nz` on `f32`, and the staged
//! forms (both recipes, the 8-bit pair, SR in both moments' value spaces, an `f32` first moment).

use qforge_ir::{Kernel, OwnedArg, Result};

use qforge_ir::DType;

use super::scheme::example_args;
use super::{MomentScheme, QAdamSpec};
use crate::catalog::{float_bytes, mix};
use crate::CatalogEntry;

impl QAdamSpec {
    /// The catalog's quantized-AdamW kernels (module docs).
    pub fn variants() -> Vec<QAdamSpec> {
        let mut out = Vec::new();
        for m2 in [MomentScheme::Dyn4Sr, MomentScheme::Dyn4NzEden] {
            for dtype in [DType::F32, DType::BF16] {
                out.push(QAdamSpec::new(MomentScheme::Nf4, m2, dtype));
            }
        }
        out.push(QAdamSpec::new(
            MomentScheme::Linear8,
            MomentScheme::Linear8,
            DType::F32,
        ));
        out.push(QAdamSpec::new(
            MomentScheme::Nf4Sr,
            MomentScheme::Dyn4Nz,
            DType::F32,
        ));
        for (m1, m2, dtype) in [
            (MomentScheme::Nf4, MomentScheme::Dyn4Sr, DType::F32),
            (MomentScheme::Nf4, MomentScheme::Dyn4NzEden, DType::BF16),
            (MomentScheme::Linear8, MomentScheme::Linear8, DType::F32),
            (MomentScheme::Nf4Sr, MomentScheme::Dyn4Nz, DType::F32),
            (MomentScheme::Fp32, MomentScheme::Dyn4Sr, DType::F32),
        ] {
            out.push(QAdamSpec::new(m1, m2, dtype).staged());
        }
        out
    }
}

impl CatalogEntry for QAdamSpec {
    fn name(&self) -> String {
        QAdamSpec::name(self)
    }

    fn build(&self) -> Result<Kernel> {
        QAdamSpec::build(self)
    }

    fn blocksize(&self) -> usize {
        self.item_size() as usize
    }

    fn example_args(&self, values: &[f32]) -> Result<Vec<OwnedArg>> {
        example_args(self, values, mix, float_bytes)
    }
}
