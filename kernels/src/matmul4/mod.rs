//! The fused 4-bit linear layer: `y = x @ dequant(W).T (+ bias)` and its input gradient
//! `dX = dY @ dequant(W)`, with `W` stored as [`crate::quant4`] codes and never
//! expanded in memory (bitsandbytes `matmul_4bit` / `gemm_4bit`, QLoRA, arXiv 2305.14314).
//!
//! Layout: `W` is an `[N, K]` row-major weight quantized as one flat tensor by
//! `quantize_4bit` (element `(n, k)` is flat element `e = n*K + k`: nibble `e` of `packed`, the
//! high nibble first; absmax block `e / blocksize`, so blocks may straddle rows). `x` is
//! `[M, K]`, `y` is `[M, N]`, `dY` is `[M, N]`, `dX` is `[M, K]`, all row-major in the
//! activation dtype (`f32`, `f16` or `bf16`).
//!
//! Semantics, per output element:
//! * The weight is decoded exactly as `dequantize_4bit` decodes it: `w = table[nibble] * absmax`
//!   in `f32` (the nested variant first decodes `absmax = nested_code[qabsmax] *
//!   nested_absmax[block / 256] + offset`, two roundings), then rounded to nearest even to the
//!   `weight_dtype` (`f16`/`bf16`; nothing for `f32`), so `w` is bit for bit the output of
//!   `dequantize_4bit` in that dtype. bitsandbytes computes `x @ dequantize_4bit(W).to(x.dtype).T`,
//!   which the host op reproduces by choosing `weight_dtype` from the weight and `x` dtypes.
//! * Activations are widened to `f32` exactly.
//! * The reduction is one [`crate::Stmt::Accumulate`]: over `k` forward in [`K_ORDER`]
//!   (element `i` fused with `fma` into partial `i % 16`), over `n` backward in [`DX_ORDER`]
//!   (partial `i % 8`); the partials start at `-0.0` and are combined by the halving tree
//!   (`p[j] += p[j + W/2]` for `j < W/2`, then `W/4`, ..., 1). Tiling over `M`, `N`
//!   (forward) or `M`, `K` (backward) only changes which work item computes an element, never
//!   its order, so every [`TileConfig`] gives identical bits.
//! * Forward with bias: `sum + f32(bias[n])` (one `f32` add); then one rounding (nearest even)
//!   to the output dtype. An empty reduction (`K = 0`) sums to `-0.0`.
//!
//! Parameters (scalars first, then buffers):
//! * forward `matmul_4bit_{qt}[_nested]_bs{B}_{dtype}[_bias]_t{TM}x{TN}`: `(m, n, k, n_items,
//!   n_tiles: u32, [offset: f32,] n_packed, n_blocks, [n_nested,] x: dtype[m, k] read,
//!   packed: u8[n_packed] read, absmax: f32[n_blocks] read | qabsmax: u8[n_blocks] read,
//!   nested_absmax: f32[n_nested] read, nested_code: f32[256] read, [bias: dtype[n] read,]
//!   y: dtype[m, n] write)`; grid `n_items = ceil(m/TM) * ceil(n/TN)`, `n_tiles = ceil(n/TN)`;
//!   work item `t` computes rows `(t / n_tiles)*TM ..` of `x` against rows `(t % n_tiles)*TN ..`
//!   of `W`.
//! * backward `matmul_4bit_dx_{qt}[_nested]_bs{B}_{dtype}_t{TM}x{TK}`: the same with `dy:
//!   dtype[m, n] read` in place of `x`, `dx: dtype[m, k] write` in place of `y`, no bias,
//!   `n_items = ceil(m/TM) * ceil(k/TK)`, `n_tiles = ceil(k/TK)`.
//!
//! Rows of a tile past `m`, `n` or `k` read the last valid row (so no load leaves the buffers)
//! and store nothing.

pub(crate) mod catalog;
pub(crate) mod host;
#[cfg(test)]
mod tests;

use crate::tile::{row_bases, store_tile, tile_of};
use crate::{check_blocksize_4bit, check_float_dtype, QuantType, NESTED_BLOCKSIZE};
use qforge_ir::routines::round::round_to;
use qforge_ir::KernelBuilder;
use qforge_ir::{Access, Dim, Kernel, ParamId, TableId, Value, VarId};
use qforge_ir::{BinaryOp, ReduceOrder};
use qforge_ir::{DType, ScalarType};
use qforge_ir::{Error, Result};

/// The canonical order of the forward K reduction: 16 strided partials and the halving tree. A
/// CPU SIMD loop of 4, 8 or 16 lanes, a GPU thread keeping the 16 partials (the PTX and WGSL
/// kernels), or 16 lanes of a warp per output (butterfly offsets 8, 4, 2, 1) reproduce it
/// exactly. 16 partials are one AVX-512 vector per output: on the
/// development machine (Zen 4, `cpu-llvm`) the NF4 GEMV ran 15 to 30% faster than with 8
/// partials, whose two 256-bit halves each step had to extract, and the M = 16 GEMM the same or
/// faster.
pub const K_ORDER: ReduceOrder = ReduceOrder::Strided(16);

/// The order of the backward (dX) N reduction: [`crate::DOT_ORDER`] (8 partials). Its CPU tile
/// keeps the partials of two rows and 16 columns in registers (`outer.rs` of the LLVM backend),
/// which 16 partials would double (the M = 16 input gradient took 4.5 times as long).
pub const DX_ORDER: ReduceOrder = crate::DOT_ORDER;

/// The largest tile side (outputs per work item = `tm * tn`, at most [`MAX_TILE_OUTPUTS`]).
pub const MAX_TILE: u32 = 16;
/// The largest number of outputs one work item computes.
pub const MAX_TILE_OUTPUTS: u32 = 32;

/// Outputs per work item of a matmul kernel: `tm` rows of the activation times `tn` rows of
/// the weight (forward) or `tn` columns of `dX` (backward). A compile-time kernel parameter;
/// it never changes a bit of the result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TileConfig {
    /// Activation rows per work item (1..=16).
    pub tm: u32,
    /// Weight rows (forward) or `dX` columns (backward) per work item (1..=16).
    pub tn: u32,
}

impl TileConfig {
    /// Checks the tile sides (1..=[`MAX_TILE`], product at most [`MAX_TILE_OUTPUTS`]).
    ///
    /// # Errors
    /// [`Error::Unsupported`] naming the tile.
    pub fn check(self) -> Result<()> {
        if self.tm == 0
            || self.tn == 0
            || self.tm > MAX_TILE
            || self.tn > MAX_TILE
            || self.tm * self.tn > MAX_TILE_OUTPUTS
        {
            return Err(Error::Unsupported(format!(
                "tile {}x{} is not supported: sides 1..={MAX_TILE}, at most {MAX_TILE_OUTPUTS} outputs",
                self.tm, self.tn
            )));
        }
        Ok(())
    }
}

/// Whether the matmul computes `y` (forward) or `dX` (backward for the input).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// `y = x @ dequant(W).T (+ bias)`, reduction over `K`.
    Forward {
        /// Whether a bias `[N]` is added.
        bias: bool,
    },
    /// `dX = dY @ dequant(W)`, reduction over `N` (`W` frozen: no `dW`).
    BackwardInput,
}

/// A fused 4-bit matmul variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Matmul4 {
    /// NF4 or FP4.
    pub quant_type: QuantType,
    /// Elements per absmax block of the flattened weight.
    pub blocksize: u32,
    /// Activation (and output) dtype.
    pub dtype: DType,
    /// The dtype the decoded weight is rounded to before the products (`f32`: not rounded).
    pub weight_dtype: DType,
    /// Whether the absmax is double-quantized (decoded in the kernel).
    pub nested: bool,
    /// Forward or input gradient.
    pub direction: Direction,
    /// Outputs per work item.
    pub tile: TileConfig,
}

impl Matmul4 {
    /// The kernel name, e.g. `matmul_4bit_nf4_bs64_f32_t1x4`,
    /// `matmul_4bit_dx_fp4_nested_bs64_bf16_t2x2`, `matmul_4bit_nf4_bs64_f32_wbf16_bias_t1x4`
    /// (the `_w` part only when the weight dtype differs from the activation dtype).
    pub fn name(&self) -> String {
        let dir = match self.direction {
            Direction::Forward { .. } => "",
            Direction::BackwardInput => "_dx",
        };
        let nested = if self.nested { "_nested" } else { "" };
        let bias = match self.direction {
            Direction::Forward { bias: true } => "_bias",
            _ => "",
        };
        let wd = if self.weight_dtype == self.dtype {
            String::new()
        } else {
            format!("_w{}", self.weight_dtype)
        };
        format!(
            "matmul_4bit{dir}_{}{nested}_bs{}_{}{wd}{bias}_t{}x{}",
            self.quant_type, self.blocksize, self.dtype, self.tile.tm, self.tile.tn
        )
    }

    /// Builds the kernel (see the module docs).
    ///
    /// # Errors
    /// [`Error::Unsupported`] for an unsupported blocksize, dtype or tile.
    pub fn build(&self) -> Result<Kernel> {
        check_blocksize_4bit(self.blocksize)?;
        check_float_dtype(self.dtype)?;
        check_float_dtype(self.weight_dtype)?;
        self.tile.check()?;
        let mut b = KernelBuilder::new(&self.name());
        let p = Params::declare(&mut b, self);
        let (tm, tn) = (self.tile.tm, self.tile.tn);
        let (mv, nv, kv) = (b.param(p.m), b.param(p.n), b.param(p.k));
        // Forward: outputs (m, n), reduce over k; backward: outputs (m, k), reduce over n.
        let (cols, reduce_len, act_len) = match self.direction {
            Direction::Forward { .. } => (nv, kv, kv),
            Direction::BackwardInput => (kv, nv, nv),
        };
        let (rows, outs) = tile_of(&mut b, p.n_tiles, self.tile, mv, cols);
        // Row starts of the activation (`m * K` or `m * N`).
        let act_base = row_bases(&mut b, &rows, act_len);
        let vars: Vec<VarId> = (0..tm * tn)
            .map(|i| b.var(&format!("acc{i}"), ScalarType::F32))
            .collect();
        let table = b.table_f32("code", &self.quant_type.dequant_table());
        let direction = self.direction;
        let order = match direction {
            Direction::Forward { .. } => K_ORDER,
            Direction::BackwardInput => DX_ORDER,
        };
        b.accumulate(reduce_len, order, &vars, |b, i| {
            let acts: Vec<Value> = act_base
                .iter()
                .map(|base| {
                    let idx = b.add(*base, i);
                    b.load(p.act, idx)
                })
                .collect();
            let weights: Vec<Value> = outs
                .iter()
                .map(|o| {
                    // Flat weight element: (n, k) -> n*K + k.
                    let e = match direction {
                        Direction::Forward { .. } => {
                            let row = b.mul(o.clamped, kv);
                            b.add(row, i)
                        }
                        Direction::BackwardInput => {
                            let row = b.mul(i, kv);
                            b.add(row, o.clamped)
                        }
                    };
                    let w = weight(b, &p, table, self.blocksize, e);
                    round_to(b, w, self.weight_dtype)
                })
                .collect();
            let mut factors = Vec::new();
            for a in &acts {
                for w in &weights {
                    factors.push((*a, *w));
                }
            }
            factors
        });
        store_tile(&mut b, (&rows, &outs), p.out, cols, |b, at, _, o| {
            let y = b.read_var(vars[at]);
            match p.bias {
                Some(bias) => {
                    let bv = b.load(bias, o.clamped);
                    b.add(y, bv)
                }
                None => y,
            }
        });
        Ok(b.finish())
    }
}

/// The parameters of a matmul kernel.
struct Params {
    m: ParamId,
    n: ParamId,
    k: ParamId,
    n_tiles: ParamId,
    /// `x` (forward) or `dY` (backward).
    act: ParamId,
    packed: ParamId,
    scale: Scale,
    bias: Option<ParamId>,
    /// `y` (forward) or `dX` (backward).
    out: ParamId,
}

/// Where the per-block absmax comes from.
enum Scale {
    Plain {
        absmax: ParamId,
    },
    Nested {
        offset: ParamId,
        qabsmax: ParamId,
        nested_absmax: ParamId,
        nested_code: ParamId,
    },
}

impl Params {
    fn declare(b: &mut KernelBuilder, spec: &Matmul4) -> Params {
        let m = b.scalar_param("m", ScalarType::U32);
        let n = b.scalar_param("n", ScalarType::U32);
        let k = b.scalar_param("k", ScalarType::U32);
        let n_items = b.scalar_param("n_items", ScalarType::U32);
        let n_tiles = b.scalar_param("n_tiles", ScalarType::U32);
        let offset = spec
            .nested
            .then(|| b.scalar_param("offset", ScalarType::F32));
        let n_packed = b.scalar_param("n_packed", ScalarType::U32);
        let n_blocks = b.scalar_param("n_blocks", ScalarType::U32);
        let n_nested = spec
            .nested
            .then(|| b.scalar_param("n_nested", ScalarType::U32));
        let dt = spec.dtype;
        let (act_name, act_cols, out_name, out_cols) = match spec.direction {
            Direction::Forward { .. } => ("x", k, "y", n),
            Direction::BackwardInput => ("dy", n, "dx", k),
        };
        let act = b.buffer_param(
            act_name,
            dt,
            &[Dim::Param(m), Dim::Param(act_cols)],
            Access::Read,
        );
        let packed = b.buffer_param("packed", DType::U8, &[Dim::Param(n_packed)], Access::Read);
        let scale = match (offset, n_nested) {
            (Some(offset), Some(n_nested)) => Scale::Nested {
                offset,
                qabsmax: b.buffer_param(
                    "qabsmax",
                    DType::U8,
                    &[Dim::Param(n_blocks)],
                    Access::Read,
                ),
                nested_absmax: b.buffer_param(
                    "nested_absmax",
                    DType::F32,
                    &[Dim::Param(n_nested)],
                    Access::Read,
                ),
                nested_code: b.buffer_param(
                    "nested_code",
                    DType::F32,
                    &[Dim::Const(256)],
                    Access::Read,
                ),
            },
            _ => Scale::Plain {
                absmax: b.buffer_param("absmax", DType::F32, &[Dim::Param(n_blocks)], Access::Read),
            },
        };
        let bias = matches!(spec.direction, Direction::Forward { bias: true })
            .then(|| b.buffer_param("bias", dt, &[Dim::Param(n)], Access::Read));
        let out = b.buffer_param(
            out_name,
            dt,
            &[Dim::Param(m), Dim::Param(out_cols)],
            Access::Write,
        );
        b.set_grid(Dim::Param(n_items));
        Params {
            m,
            n,
            k,
            n_tiles,
            act,
            packed,
            scale,
            bias,
            out,
        }
    }
}

/// The dequantized weight of flat element `e`: `table[nibble] * absmax[e / blocksize]`.
fn weight(b: &mut KernelBuilder, p: &Params, table: TableId, blocksize: u32, e: Value) -> Value {
    let one = b.const_u32(1);
    let byte_idx = b.shr(e, one);
    let byte = b.load(p.packed, byte_idx);
    // Even elements sit in the high nibble: shift by 4 * (1 - (e & 1)).
    let parity = b.and(e, one);
    let odd_flip = b.binary(BinaryOp::Xor, parity, one);
    let two = b.const_u32(2);
    let shift = b.shl(odd_flip, two);
    let shifted = b.shr(byte, shift);
    let fifteen = b.const_u32(15);
    let nibble = b.and(shifted, fifteen);
    let code = b.lookup(table, nibble);
    let bs_shift = b.const_u32(blocksize.trailing_zeros());
    let block = b.shr(e, bs_shift);
    let absmax = match p.scale {
        Scale::Plain { absmax } => b.load(absmax, block),
        Scale::Nested {
            offset,
            qabsmax,
            nested_absmax,
            nested_code,
        } => {
            let q = b.load(qabsmax, block);
            let c = b.load(nested_code, q);
            let nshift = b.const_u32(NESTED_BLOCKSIZE.trailing_zeros());
            let nb = b.shr(block, nshift);
            let na = b.load(nested_absmax, nb);
            let prod = b.mul(c, na);
            let off = b.param(offset);
            b.add(prod, off)
        }
    };
    b.mul(code, absmax)
}
