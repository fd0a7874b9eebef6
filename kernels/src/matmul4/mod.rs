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
//! * The reduction is one [`qforge_ir::Stmt::Accumulate`]: over `k` forward in [`K_ORDER`]
//!   (element `i` fused with `fma` into partial `i % 16`; the partials start at `-0.0` and
//!   are combined by the halving tree, `p[j] += p[j + W/2]` for `j < W/2`, then `W/4`, ...,
//!   1), over `n` backward in [`DX_ORDER`] (one running sum from `-0.0`). Tiling over `M`, `N`
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
//! * backward `matmul_4bit_dx_{qt}[_nested]_bs{B}_{dtype}_c{C}_t{TM}x{TK}`: the same with `dy:
//!   dtype[m, n] read` in place of `x`, `dx: dtype[m, k] write` in place of `y`, no bias,
//!   `n_items = ceil(m/TM) * ceil(k/TK)`, `n_tiles = ceil(k/TK)`, and the weight in the input
//!   gradient's panel layouts ([`panels`]): the codes as `n_panel_bytes, panels:
//!   u8[n_panel_bytes]` in place of `n_packed, packed`, the absmax (or `qabsmax`) as
//!   `n_scales = N * K / C` entries, one per `C` columns of a row (`C` the scale chunk of
//!   [`Direction::BackwardInput`], dividing `K` and the blocksize); the nested absmax stays
//!   flat. The host op packs them from bitsandbytes' layout ([`panels::pack_dx_panels`],
//!   [`panels::pack_dx_scales`]); the values and the order are the same, so are the bits.
//!
//! Rows of a tile past `m`, `n` or `k` read the last valid row (so no load leaves the buffers)
//! and store nothing.
//!
//! Both kernels are written in the kernel language ([`matmul_4bit_kernel`] with
//! [`Matmul4bitArgs`], [`matmul_4bit_dx_kernel`] with [`Matmul4bitDxArgs`]; the nested absmax
//! parameters are `#[when(nested)]`). The tile's one `accumulate` is a builder fragment in the
//! helper calling convention (`tile::accumulate_tile`): an `#[accumulate]` loop names a fixed
//! list of accumulators, a tile has a build-time number (`TM * TN`) of them. `reference.rs`
//! keeps the builder version, which the tests prove identical (same IR, so the same speed).

pub(crate) mod catalog;
mod chain;
pub mod decoded;
pub mod decoded_forward;
pub(crate) mod host;
mod interleave;
pub mod panels;
#[cfg(test)]
mod reference;
pub(crate) mod row_shard;
pub(crate) mod shard;
#[cfg(test)]
mod tests;
mod widen;
#[cfg(feature = "stablehlo")]
mod xla;

use qforge_macros::kernel;

use crate::funcs::{round_to, vars};
use panels::DX_PANEL;

use crate::tile::{
    accumulate_tile, load_rows, row_starts, store_sums, work_tile, Factors, Row, TileFactors,
};
use crate::{check_blocksize_4bit, check_float_dtype, QuantType, NESTED_BLOCKSIZE};
use qforge_ir::dsl::{Buf, Float, In, IntoDim, Out, Scalar, Table, TypedKernel, Val};
use qforge_ir::KernelBuilder;
use qforge_ir::ReduceOrder;
use qforge_ir::{DType, Dim, Kernel};
use qforge_ir::{Error, Result};

/// The canonical order of the forward K reduction: 16 strided partials and the halving tree. A
/// CPU SIMD loop of 4, 8 or 16 lanes, a GPU thread keeping the 16 partials (the PTX and WGSL
/// kernels), or 16 lanes of a warp per output (butterfly offsets 8, 4, 2, 1) reproduce it
/// exactly. 16 partials are one AVX-512 vector per output: on the
/// development machine (Zen 4, `cpu-llvm`) the NF4 GEMV ran 15 to 30% faster than with 8
/// partials, whose two 256-bit halves each step had to extract, and the M = 16 GEMM the same or
/// faster.
pub const K_ORDER: ReduceOrder = ReduceOrder::Strided(16);

/// The order of the backward (dX) N reduction: `sequential`, one running sum per output (`p =
/// fma(dY[m, n], w[n, k], p)` in increasing `n`, from `-0.0`), as a BLAS micro-kernel keeps it.
/// The CPU tile runs its columns as vector lanes and broadcasts `dY` (`outer.rs` of the LLVM
/// backend): every register holds 16 outputs' sums, so a tile of 8 rows and 32 columns decodes
/// each weight once for 8 rows and reads `dY` and the panels in address order. It was
/// [`crate::DOT_ORDER`] (8 partials) until issue 25: with 8 partials per output only one
/// partial of the tile fitted the registers, so the tile passed over `dY` and the panels once
/// per partial (M = 512, K = N = 4096 on the AVX-512 development VM: 83 -> 67 ms; with AVX2,
/// 346 -> 159 ms).
pub const DX_ORDER: ReduceOrder = ReduceOrder::Sequential;

/// The largest tile side (outputs per work item = `tm * tn`, at most [`MAX_TILE_OUTPUTS`]): 64
/// columns of the input gradient are 32 bytes of every weight row, half a cache line (see
/// [`crate::ops::suggest_backward_tile_sizes`]).
pub const MAX_TILE: u32 = 64;
/// The largest number of outputs one work item computes.
pub const MAX_TILE_OUTPUTS: u32 = 256;

/// Outputs per work item of a matmul kernel: `tm` rows of the activation times `tn` rows of
/// the weight (forward) or `tn` columns of `dX` (backward). A compile-time kernel parameter;
/// it never changes a bit of the result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TileConfig {
    /// Activation rows per work item (1..=[`MAX_TILE`]).
    pub tm: u32,
    /// Weight rows (forward) or `dX` columns (backward) per work item (1..=[`MAX_TILE`]).
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
    BackwardInput {
        /// Columns per scale of the input gradient's scale layout ([`panels`]): a power of two
        /// dividing the blocksize, and `K` at run time ([`panels::scale_chunk`]).
        chunk: u32,
    },
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
            Direction::BackwardInput { .. } => "_dx",
        };
        let chunk = match self.direction {
            Direction::BackwardInput { chunk } => format!("_c{chunk}"),
            Direction::Forward { .. } => String::new(),
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
            "matmul_4bit{dir}_{}{nested}_bs{}_{}{wd}{bias}{chunk}_t{}x{}",
            self.quant_type, self.blocksize, self.dtype, self.tile.tm, self.tile.tn
        )
    }

    /// Builds the kernel (see the module docs): [`matmul_4bit_kernel`] or
    /// [`matmul_4bit_dx_kernel`] by direction, as a plain [`Kernel`].
    ///
    /// # Errors
    /// [`Error::Unsupported`] for an unsupported blocksize, dtype or tile.
    pub fn build(&self) -> Result<Kernel> {
        match self.direction {
            Direction::Forward { .. } => self.build_forward().map(TypedKernel::into_kernel),
            Direction::BackwardInput { .. } => {
                self.build_backward_input().map(TypedKernel::into_kernel)
            }
        }
    }

    /// Builds the forward kernel with its typed signature ([`Matmul4bitArgs`]).
    ///
    /// # Errors
    /// [`Error::Unsupported`] for an unsupported blocksize, dtype or tile, or a backward
    /// direction.
    pub fn build_forward(&self) -> Result<TypedKernel<Matmul4bit>> {
        self.check(true)?;
        matmul_4bit_kernel(*self)
    }

    /// Builds the input-gradient kernel with its typed signature ([`Matmul4bitDxArgs`]).
    ///
    /// # Errors
    /// [`Error::Unsupported`] for an unsupported blocksize, dtype or tile, or a forward
    /// direction.
    pub fn build_backward_input(&self) -> Result<TypedKernel<Matmul4bitDx>> {
        self.check(false)?;
        matmul_4bit_dx_kernel(*self)
    }

    fn check(&self, forward: bool) -> Result<()> {
        check_blocksize_4bit(self.blocksize)?;
        check_float_dtype(self.dtype)?;
        check_float_dtype(self.weight_dtype)?;
        self.tile.check()?;
        if let Direction::BackwardInput { chunk } = self.direction {
            if !chunk.is_power_of_two() || chunk > self.blocksize {
                return Err(Error::Unsupported(format!(
                    "{}: the scale chunk {chunk} is not a power of two dividing the blocksize {}",
                    self.name(),
                    self.blocksize
                )));
            }
        }
        if matches!(self.direction, Direction::Forward { .. }) != forward {
            return Err(Error::Unsupported(format!(
                "{}: built as the {} kernel",
                self.name(),
                if forward { "forward" } else { "input-gradient" }
            )));
        }
        Ok(())
    }

    /// Whether the kernel takes a bias.
    fn has_bias(&self) -> bool {
        matches!(self.direction, Direction::Forward { bias: true })
    }
}

/// Where the per-block absmax comes from.
#[derive(Clone, Copy, Debug)]
enum Scale {
    Plain {
        absmax: Buf<In<f32>>,
    },
    Nested {
        offset: Scalar<f32>,
        qabsmax: Buf<In<u8>>,
        nested_absmax: Buf<In<f32>>,
        nested_code: Buf<In<f32>>,
    },
}

/// The scale parameters a kernel was built with (`absmax`, or the nested four).
///
/// # Errors
/// [`Error::Unsupported`] when they are neither (not reachable from the kernels'
/// `#[when]` conditions).
fn scale(
    _: &mut KernelBuilder,
    offset: Option<Scalar<f32>>,
    absmax: Option<Buf<In<f32>>>,
    qabsmax: Option<Buf<In<u8>>>,
    nested_absmax: Option<Buf<In<f32>>>,
    nested_code: Option<Buf<In<f32>>>,
) -> Result<Scale> {
    match (absmax, offset, qabsmax, nested_absmax, nested_code) {
        (Some(absmax), None, None, None, None) => Ok(Scale::Plain { absmax }),
        (None, Some(offset), Some(qabsmax), Some(nested_absmax), Some(nested_code)) => {
            Ok(Scale::Nested {
                offset,
                qabsmax,
                nested_absmax,
                nested_code,
            })
        }
        _ => Err(Error::Unsupported(
            "matmul_4bit: the absmax parameters are neither plain nor nested".into(),
        )),
    }
}

/// The dim of an optional (`#[when]`) scalar parameter, declared only where it is present.
struct OptionalDim(Option<Scalar<u32>>);

impl IntoDim for OptionalDim {
    fn dim(self) -> Dim {
        self.0.map_or(Dim::Const(0), IntoDim::dim)
    }
}

/// The 4-bit weight: codes, scales and the decode table.
#[derive(Clone, Copy, Debug)]
struct Weights {
    packed: Buf<In<u8>>,
    scale: Scale,
    code: Table<f32>,
    blocksize: u32,
}

/// The dequantized weight of flat element `e` whose code is nibble `at` of `packed` (`at = e`
/// in bitsandbytes' packing, the panel position in the input gradient's): `code[nibble] *
/// absmax[e / blocksize]`, the absmax (or `qabsmax`) read at `scale_at` when given (the input
/// gradient's scale layout; the nested absmax stays flat).
#[qforge_macros::func]
fn weight(w: Weights, at: Val<u32>, e: Val<u32>, scale_at: Option<Val<u32>>) -> Val<f32> {
    let c = nibble_code(w, at);
    let absmax = block_absmax(w, e, scale_at);
    c * absmax
}

/// `code[nibble]` for nibble `at` of `packed` (two per byte, the even one in the high half).
#[qforge_macros::func]
fn nibble_code(w: Weights, at: Val<u32>) -> Val<f32> {
    let packed = w.packed;
    let code = w.code;
    let one = val(1u32);
    let byte = packed[at >> one];
    // Even nibbles sit in the high half: shift by 4 * (1 - (at & 1)).
    let odd_flip = (at & one) ^ one;
    let shift = odd_flip << 2u32;
    let nibble = (byte >> shift) & 15u32;
    code[nibble]
}

/// The absmax of flat element `e`'s block (`absmax[e / blocksize]`, or the nested decode
/// `nested_code[qabsmax] * nested_absmax[block / 256] + offset`), the absmax (or `qabsmax`) read
/// at `scale_at` when given.
#[qforge_macros::func]
fn block_absmax(w: Weights, e: Val<u32>, scale_at: Option<Val<u32>>) -> Val<f32> {
    match w.scale {
        Scale::Plain { absmax } => match scale_at {
            Some(sa) => absmax[sa],
            None => {
                let block = e >> comptime!(w.blocksize.trailing_zeros());
                absmax[block]
            }
        },
        Scale::Nested {
            offset,
            qabsmax,
            nested_absmax,
            nested_code,
        } => {
            let block = e >> comptime!(w.blocksize.trailing_zeros());
            let qa = match scale_at {
                Some(sa) => sa,
                None => block,
            };
            let q = qabsmax[qa];
            let nc = nested_code[q];
            let na = nested_absmax[block >> comptime!(NESTED_BLOCKSIZE.trailing_zeros())];
            nc * na + read(offset)
        }
    }
}

/// The factors of a matmul tile: activation rows and decoded weights.
struct Products {
    /// `x` (forward) or `dY` (backward).
    act: Buf<In<Float>>,
    /// Row starts of the activation tile rows.
    act_base: Vec<Val<u32>>,
    /// The tile outputs (weight rows forward, `dX` columns backward).
    outs: Vec<Row>,
    weights: Weights,
    /// `K`, the weight's row length.
    k: Val<u32>,
    /// The input gradient's panel layout (`None` forward: bitsandbytes' packing).
    panels: Option<PanelRows>,
    weight_dtype: DType,
}

/// Where the input gradient finds the code of weight element `(n, k)`: nibble
/// `32 * (P * (N - 1) + n) + k` of the panels (`P = k / 32`; module `panels`), which is
/// `32 * (P * N + n) + (k mod 32)`.
#[derive(Clone, Copy, Debug)]
struct PanelRows {
    /// `N - 1`.
    n_minus_1: Val<u32>,
    /// The tile's panel when all its columns lie in one (`32 % TN == 0`: the tile starts at a
    /// multiple of `TN`), so that the columns' code positions differ only by the column;
    /// otherwise each column's own.
    tile_panel: Option<Val<u32>>,
    /// `N`.
    n: Val<u32>,
    /// The scale layout's columns per scale.
    chunk: u32,
    /// `(k0 / chunk) * N` for the tile's first column `k0` when all its columns share a chunk
    /// (`chunk % TN == 0`): a column's scale of row `n` is at this plus `n`.
    tile_scales: Option<Val<u32>>,
}

/// The decoded weight of each tile output at reduction index `i` (flat element `n * K + k`).
#[qforge_macros::func]
fn load_weights(p: &Products, i: Val<u32>) -> Vec<Val<f32>> {
    let kv = p.k;
    #[comptime]
    let mut ws = Vec::new();
    for o in p.outs.iter().copied() {
        let (at, e) = match p.panels {
            None => {
                let e = o.clamped * kv + i;
                (e, e)
            }
            Some(panels) => {
                let panel = match panels.tile_panel {
                    Some(tp) => tp,
                    None => o.clamped >> comptime!(DX_PANEL.trailing_zeros()),
                };
                let row = panel * panels.n_minus_1 + i;
                let at = (row << comptime!(DX_PANEL.trailing_zeros())) + o.clamped;
                (at, i * kv + o.clamped)
            }
        };
        let scale_at = match p.panels {
            None => None,
            Some(panels) => {
                let base = match panels.tile_scales {
                    Some(ts) => ts,
                    None => (o.clamped >> comptime!(panels.chunk.trailing_zeros())) * panels.n,
                };
                Some(base + i)
            }
        };
        let w = weight(p.weights, at, e, scale_at);
        let w = round_to(w, p.weight_dtype);
        ws.push(w);
    }
    ws
}

/// The factors of a matmul tile of `spec` (declaring its `code` table): the activation `act` at
/// the row starts `act_base`, and the 4-bit weight (`packed`, `scale`, `K = k`) of each output
/// `outs` (weight rows when `forward`, `dX` columns otherwise).
#[qforge_macros::func]
fn products(
    spec: Matmul4,
    act: Buf<In<Float>>,
    act_base: Vec<Val<u32>>,
    outs: &[Row],
    k: Val<u32>,
    packed: Buf<In<u8>>,
    scale: Scale,
    panels: Option<PanelRows>,
) -> Products {
    let code = table_f32("code", &spec.quant_type.dequant_table());
    let weights = Weights {
        packed,
        scale,
        code,
        blocksize: spec.blocksize,
    };
    Products {
        act,
        act_base,
        outs: outs.to_vec(),
        weights,
        k,
        panels,
        weight_dtype: spec.weight_dtype,
    }
}

impl TileFactors for Products {
    fn factors(&self, b: &mut KernelBuilder, i: Val<u32>) -> Result<Factors> {
        let acts = load_rows(b, self.act, &self.act_base, i)?;
        let weights = load_weights(b, self, i)?;
        Ok((acts, weights))
    }
}

/// Builds the forward kernel `matmul_4bit_{qt}[_nested]_bs{B}_{dtype}[_w{wdtype}][_bias]_t{TM}x{TN}`
/// (see the module docs): `y = x @ dequant(W).T (+ bias)`, reduced over `k` in [`K_ORDER`].
///
/// # Errors
/// None of its own ([`Matmul4::build_forward`] checks the spec first).
#[kernel(name = spec.name(), grid = n_items, signature = Matmul4bit)]
pub fn matmul_4bit_kernel(
    #[config] spec: Matmul4,
    m: u32,
    n: u32,
    k: u32,
    n_items: u32,
    n_tiles: u32,
    #[when(spec.nested)] offset: f32,
    n_packed: u32,
    n_blocks: u32,
    #[when(spec.nested)] n_nested: u32,
    #[shape(m, k)]
    #[dtype(spec.dtype)]
    x: In<Float>,
    #[shape(n_packed)] packed: In<u8>,
    #[when(!spec.nested)]
    #[shape(n_blocks)]
    absmax: In<f32>,
    #[when(spec.nested)]
    #[shape(n_blocks)]
    qabsmax: In<u8>,
    #[when(spec.nested)]
    #[shape(OptionalDim(n_nested))]
    nested_absmax: In<f32>,
    #[when(spec.nested)]
    #[shape(256u32)]
    nested_code: In<f32>,
    #[when(spec.has_bias())]
    #[shape(n)]
    #[dtype(spec.dtype)]
    bias: In<Float>,
    #[shape(m, n)]
    #[dtype(spec.dtype)]
    y: Out<Float>,
) {
    let mv = m;
    let nv = n;
    let kv = k;
    // Outputs (m, n), reduced over k.
    let (rows, outs) = work_tile(n_tiles, spec.tile, mv, nv);
    let act_base = row_starts(&rows, kv);
    let accs = vars::<f32>(comptime!(rows.len() * outs.len()), "acc");
    let scale = scale(offset, absmax, qabsmax, nested_absmax, nested_code);
    let products = products(spec, x, act_base, &outs, kv, packed, scale, None);
    accumulate_tile(kv, K_ORDER, &accs, &products);
    store_sums(y, nv, &rows, &outs, &accs, bias, None);
}

/// Builds the input-gradient kernel `matmul_4bit_dx_{qt}[_nested]_bs{B}_{dtype}[_w{wdtype}]_t{TM}x{TK}`
/// (see the module docs): `dX = dY @ dequant(W)`, reduced over `n` in [`DX_ORDER`].
///
/// # Errors
/// None of its own ([`Matmul4::build_backward_input`] checks the spec first).
#[kernel(name = spec.name(), grid = n_items, signature = Matmul4bitDx)]
pub fn matmul_4bit_dx_kernel(
    #[config] spec: Matmul4,
    m: u32,
    n: u32,
    k: u32,
    n_items: u32,
    n_tiles: u32,
    #[when(spec.nested)] offset: f32,
    n_panel_bytes: u32,
    n_scales: u32,
    #[when(spec.nested)] n_nested: u32,
    #[shape(m, n)]
    #[dtype(spec.dtype)]
    dy: In<Float>,
    #[shape(n_panel_bytes)] panels: In<u8>,
    #[when(!spec.nested)]
    #[shape(n_scales)]
    absmax: In<f32>,
    #[when(spec.nested)]
    #[shape(n_scales)]
    qabsmax: In<u8>,
    #[when(spec.nested)]
    #[shape(OptionalDim(n_nested))]
    nested_absmax: In<f32>,
    #[when(spec.nested)]
    #[shape(256u32)]
    nested_code: In<f32>,
    #[shape(m, k)]
    #[dtype(spec.dtype)]
    dx: Out<Float>,
) {
    let mv = m;
    let nv = n;
    let kv = k;
    // Outputs (m, k), reduced over n.
    let (rows, outs) = work_tile(n_tiles, spec.tile, mv, kv);
    let act_base = row_starts(&rows, nv);
    let accs = vars::<f32>(comptime!(rows.len() * outs.len()), "acc");
    let scale = scale(offset, absmax, qabsmax, nested_absmax, nested_code);
    let one = val(1u32);
    let n_minus_1 = nv - one;
    let tile_panel = if DX_PANEL.is_multiple_of(spec.tile.tn) {
        Some(outs[0].first >> comptime!(DX_PANEL.trailing_zeros()))
    } else {
        None
    };
    let chunk = match spec.direction {
        Direction::BackwardInput { chunk } => chunk,
        Direction::Forward { .. } => 1,
    };
    let tile_scales = if chunk.is_multiple_of(spec.tile.tn) {
        Some((outs[0].first >> comptime!(chunk.trailing_zeros())) * nv)
    } else {
        None
    };
    let panel_rows = PanelRows {
        n_minus_1,
        tile_panel,
        n: nv,
        chunk,
        tile_scales,
    };
    let products = products(
        spec,
        dy,
        act_base,
        &outs,
        kv,
        panels,
        scale,
        Some(panel_rows),
    );
    accumulate_tile(nv, DX_ORDER, &accs, &products);
    store_sums(dx, kv, &rows, &outs, &accs, None, None);
}
