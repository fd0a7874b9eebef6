//! The LLM.int8() kernels in the catalog: every kernel for every float dtype (the matmuls with
//! and without bias, tiles from the matmul catalog), and the integer matmul with two tiles.

use qforge_ir::{Kernel, OwnedArg, Result};

use super::Int8Spec;
use crate::matmul4::catalog::catalog_tile;
use crate::matmul4::{Direction, TileConfig};
use crate::CatalogEntry;
use crate::FLOAT_DTYPES;

impl Int8Spec {
    /// The catalog's LLM.int8() kernels (module docs).
    pub fn variants() -> Vec<Int8Spec> {
        let mut out = Vec::new();
        for dtype in FLOAT_DTYPES {
            out.extend([
                Int8Spec::OutlierCols { dtype },
                Int8Spec::VectorwiseQuant { dtype },
                Int8Spec::VectorwiseDequant { dtype },
                Int8Spec::QuantizeRowwise { dtype },
            ]);
            for bias in [false, true] {
                out.push(Int8Spec::MmDequant { dtype, bias });
                out.push(Int8Spec::MixedScaledMm {
                    dtype,
                    bias,
                    tile: catalog_tile(dtype, Direction::Forward { bias }),
                });
            }
            out.push(Int8Spec::MixedScaledMmDx {
                dtype,
                tile: catalog_tile(dtype, Direction::BackwardInput { chunk: 1 }),
            });
        }
        for tile in [TileConfig { tm: 1, tn: 1 }, TileConfig { tm: 2, tn: 4 }] {
            out.push(Int8Spec::LinearMatmul { tile });
        }
        out
    }
}

impl CatalogEntry for Int8Spec {
    fn name(&self) -> String {
        Int8Spec::name(self)
    }

    fn build(&self) -> Result<Kernel> {
        Int8Spec::build(self)
    }

    fn blocksize(&self) -> usize {
        Int8Spec::blocksize(self)
    }

    fn example_args(&self, values: &[f32]) -> Result<Vec<OwnedArg>> {
        Int8Spec::example_args(self, values)
    }
}
