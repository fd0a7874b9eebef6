//! The fused 4-bit matmuls in the catalog: blocksize 64 in every quant type, dtype, absmax form
//! and direction, plus blocksize 256 with an `f32` activation and a `bf16` weight.

use qforge_ir::dsl::{FloatIn, FloatOut};
use qforge_ir::{DType, Kernel, OwnedArg, Result};

use super::panels::{panels_of, scales_of};
use super::{Direction, Matmul4, Matmul4bitArgs, Matmul4bitDxArgs, TileConfig};
use crate::catalog::{first_finite, float_bytes, mix};
use crate::doublequant::NESTED_MAP;
use crate::{CatalogEntry, QuantType, FLOAT_DTYPES, NESTED_BLOCKSIZE};

/// The matmul directions, each in the catalog.
const DIRECTIONS: [Direction; 3] = [
    Direction::Forward { bias: false },
    Direction::Forward { bias: true },
    Direction::BackwardInput { chunk: 1 },
];

/// The direction of a catalog kernel: the input gradient with a scale chunk varied with the
/// dtype and blocksize, so that the backends run both the tile's shared scale row (`f32`:
/// the blocksize, `bf16`: 2) and each column's own (`f16`: chunk 1 with two columns).
fn with_chunk(direction: Direction, dtype: DType, blocksize: u32) -> Direction {
    match (direction, dtype) {
        (Direction::Forward { .. }, _) => direction,
        (_, DType::F32) => Direction::BackwardInput { chunk: blocksize },
        (_, DType::BF16) => Direction::BackwardInput { chunk: 2 },
        _ => Direction::BackwardInput { chunk: 1 },
    }
}

/// The tile a catalog matmul kernel uses: varied with the dtype so every backend runs tiles
/// with several activation rows, several weight rows and a side that is not a power of two
/// (the int8 matmuls use it too).
pub(crate) fn catalog_tile(dtype: DType, direction: Direction) -> TileConfig {
    match (dtype, direction) {
        (DType::F16, _) => TileConfig { tm: 2, tn: 2 },
        (DType::BF16, Direction::Forward { .. }) => TileConfig { tm: 4, tn: 1 },
        (DType::BF16, Direction::BackwardInput { .. }) => TileConfig { tm: 3, tn: 1 },
        _ => TileConfig { tm: 1, tn: 4 },
    }
}

impl Matmul4 {
    /// The catalog's matmuls (module docs).
    pub fn variants() -> Vec<Matmul4> {
        let mut out = Vec::new();
        for quant_type in QuantType::ALL {
            for dtype in FLOAT_DTYPES {
                for nested in [false, true] {
                    for direction in DIRECTIONS {
                        out.push(Matmul4 {
                            quant_type,
                            blocksize: 64,
                            dtype,
                            weight_dtype: dtype,
                            nested,
                            direction: with_chunk(direction, dtype, 64),
                            tile: catalog_tile(dtype, direction),
                        });
                    }
                }
            }
        }
        for direction in DIRECTIONS {
            out.push(Matmul4 {
                quant_type: QuantType::Nf4,
                blocksize: 256,
                dtype: DType::F32,
                weight_dtype: DType::BF16,
                nested: false,
                direction: with_chunk(direction, DType::F32, 256),
                tile: catalog_tile(DType::F32, direction),
            });
        }
        out
    }
}

impl CatalogEntry for Matmul4 {
    fn name(&self) -> String {
        Matmul4::name(self)
    }

    fn build(&self) -> Result<Kernel> {
        Matmul4::build(self)
    }

    fn blocksize(&self) -> usize {
        self.blocksize as usize
    }

    /// A reduction over `n = values.len()` elements (`K` forward, `N` backward) with
    /// `M = 1 + n % 3` activation rows and `3 + n % 5` outputs per row (the input gradient
    /// with scale chunks: `chunk * (1 + n % 2)`, one or two chunks; with up to three, the
    /// `bs256`, `c256` kernel took 271 s of the conformance suite's 894 s on the StableHLO
    /// reference interpreter); the activations cycle through `values`, the codes are mixed
    /// from them and each block's absmax is `|values[b % n]|`.
    fn example_args(&self, values: &[f32]) -> Result<Vec<OwnedArg>> {
        let len = values.len();
        let m = 1 + len % 3;
        // The input gradient's outputs are K: a multiple of its scale chunk.
        let outs = match self.direction {
            Direction::BackwardInput { chunk } if chunk > 1 => chunk as usize * (1 + len % 2),
            _ => 3 + len % 5,
        };
        let (n, k) = match self.direction {
            Direction::Forward { .. } => (outs, len),
            Direction::BackwardInput { .. } => (len, outs),
        };
        let (tm, tn) = (self.tile.tm as usize, self.tile.tn as usize);
        let n_tiles = outs.div_ceil(tn);
        let n_items = m.div_ceil(tm) * n_tiles;
        let elems = n * k;
        let n_packed = elems.div_ceil(2);
        let n_blocks = elems.div_ceil(self.blocksize as usize);
        let n_nested = n_blocks.div_ceil(NESTED_BLOCKSIZE as usize);
        let cycle = |count: usize, shift: usize| -> Vec<f32> {
            (0..count)
                .map(|i| values[(i + i / len + shift) % len])
                .collect()
        };
        let dtype = self.dtype;
        let act = float_bytes(dtype, &cycle(m * len, 0));
        let packed: Vec<u8> = (0..n_packed)
            .map(|j| mix(j, values[j % len]) as u8)
            .collect();
        let absmax: Vec<f32> = (0..n_blocks).map(|b| values[b % len].abs()).collect();
        let qabsmax: Vec<u8> = (0..n_blocks).map(|b| mix(b, absmax[b]) as u8).collect();
        let nested_absmax: Vec<f32> = (0..n_nested).map(|i| values[(i + 1) % len].abs()).collect();
        let nested_code = NESTED_MAP.code();
        let bias = float_bytes(dtype, &cycle(n, 3));
        let mut out = vec![0u8; m * outs * dtype.size_bytes()];
        let nested = self.nested;
        let u = |v: usize| v as u32;
        let args = match self.direction {
            Direction::Forward { bias: has_bias } => {
                let kernel = self.build_forward()?;
                let mut args = Matmul4bitArgs {
                    m: u(m),
                    n: u(n),
                    k: u(k),
                    n_items: u(n_items),
                    n_tiles: u(n_tiles),
                    offset: nested.then_some(first_finite(values) * 0.5),
                    n_packed: u(n_packed),
                    n_blocks: u(n_blocks),
                    n_nested: nested.then_some(u(n_nested)),
                    x: FloatIn { dtype, bytes: &act },
                    packed: &packed,
                    absmax: (!nested).then_some(&absmax[..]),
                    qabsmax: nested.then_some(&qabsmax[..]),
                    nested_absmax: nested.then_some(&nested_absmax[..]),
                    nested_code: nested.then_some(&nested_code[..]),
                    bias: has_bias.then_some(FloatIn {
                        dtype,
                        bytes: &bias,
                    }),
                    y: FloatOut {
                        dtype,
                        bytes: &mut out,
                    },
                };
                OwnedArg::copy_all(&kernel.args(&mut args)?)
            }
            Direction::BackwardInput { chunk } => {
                let kernel = self.build_backward_input()?;
                let panels = panels_of(&packed, n, k, 1);
                let absmax = scales_of(&absmax, n, k, self.blocksize, chunk);
                let qabsmax = scales_of(&qabsmax, n, k, self.blocksize, chunk);
                let mut args = Matmul4bitDxArgs {
                    m: u(m),
                    n: u(n),
                    k: u(k),
                    n_items: u(n_items),
                    n_tiles: u(n_tiles),
                    offset: nested.then_some(first_finite(values) * 0.5),
                    n_panel_bytes: u(panels.len()),
                    n_scales: u(absmax.len()),
                    n_nested: nested.then_some(u(n_nested)),
                    dy: FloatIn { dtype, bytes: &act },
                    panels: &panels,
                    absmax: (!nested).then_some(&absmax[..]),
                    qabsmax: nested.then_some(&qabsmax[..]),
                    nested_absmax: nested.then_some(&nested_absmax[..]),
                    nested_code: nested.then_some(&nested_code[..]),
                    dx: FloatOut {
                        dtype,
                        bytes: &mut out,
                    },
                };
                OwnedArg::copy_all(&kernel.args(&mut args)?)
            }
        };
        Ok(args)
    }
}
