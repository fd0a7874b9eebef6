//! The LLM.int8() matmul kernels: `int8_linear_matmul` (exact `i8 x i8 -> i32`),
//! `int8_mm_dequant`, the fused mixed-precision forward `int8_mixed_scaled_mm` and its input
//! gradient (bitsandbytes 0.50.2 default backend and `MatMul8bitLt.backward`). Quantization is in
//! [`crate::int8`].
//!
//! Semantics, per output element:
//! * `int8_linear_matmul`: `C[i, j] = sum_k A[i, k] * B[j, k]` with `A: i8[M, K]`,
//!   `B: i8[N, K]` (so `A @ B.T`), `i32` wrapping adds in a plain loop. Every product is at most
//!   `2^14` in magnitude, so the sum is exact (order-free) for `K < 2^17`; beyond that it wraps
//!   as `i32` arithmetic does.
//! * `int8_mm_dequant`: `y = (f32(C) * (row_stats[i] * col_stats[j])) * 6.200124e-05` in `f32`
//!   (`f32(C)` rounds to nearest even above `2^24`; three roundings in this order), then
//!   `+ f32(bias[j])` (one `f32` add) when there is a bias, then one rounding (nearest even) to
//!   the output dtype. 6.200124e-05 is bitsandbytes' CPU/default constant (the CUDA kernel uses
//!   `6.200012e-05f` and an `fma` with the bias; see `docs/compat.md`).
//! * `int8_mixed_scaled_mm` (bitsandbytes `int8_mixed_scaled_mm(A, CA, CB, SCA, SCB,
//!   outlier_cols, bias)`): with `CA` the quantized activation (outlier columns already zeroed),
//!   `t = round_dtype(int8_mm_dequant(CA @ CB.T, SCA, SCB, bias))`, then the fp part over the
//!   outlier column list `cols[0..n_outliers]`:
//!   `fp = sum_o x[i, cols[o]] * w(j, cols[o])` with the weight decoded as
//!   `int8_vectorwise_dequant` decodes it, `w(j, c) = round_dtype((f32(CB[j, c]) * SCB[j]) *
//!   f32(1/127))`, summed by one [`qforge_ir::Stmt::Accumulate`] in [`DOT_ORDER`] (element `o` fused
//!   into partial `o % 8`, the halving tree); finally `y = round_dtype(t + fp)`. This is
//!   bitsandbytes' `output.addmm(subA, subB)` on the dtype-rounded int8 result: two roundings to
//!   the dtype (a single rounding differs from bitsandbytes in about a quarter of the golden
//!   outputs). With no outliers `fp = -0.0` and `y = t` exactly.
//! * `int8_mixed_scaled_mm_dx` (`MatMul8bitLt.backward`, `dX = dY @ dequant(CB)`):
//!   `dX[i, k] = round_dtype(sum_n dY[i, n] * w(n, k))` with
//!   `w(n, k) = round_dtype(f32(CB[n, k]) * (SCB[n] * f32(1/127)))` (bitsandbytes'
//!   `CB.to(dtype).mul_(SCB.unsqueeze(1).mul(1.0 / 127.0))`: the scale is formed first), the
//!   sum one [`qforge_ir::Stmt::Accumulate`] over `n` in [`DOT_ORDER`].
//!
//! Tiling (the `_t{TM}x{TN}` suffix) only changes which work item computes an output, never its
//! bits: work item `t` computes rows `(t / n_tiles) * TM ..` and outputs `(t % n_tiles) * TN ..`;
//! rows past the end read the last valid row and store nothing.
//!
//! Written in the kernel language, with the tile helpers of gemm and matmul4 (`crate::tile`:
//! `work_tile`, `row_starts`, `load_rows`, `cells`, `store_sums`, and `accumulate_tile` for the
//! tile's one `accumulate` over a build-time number of accumulators). `reference.rs` keeps the builder
//! versions, which the tests prove identical (same IR).
//!
//! Parameter order (scalars first, then buffers):
//! * `int8_linear_matmul_t{TM}x{TN}`: `(m, n, k, n_items, n_tiles: u32, a: i8[m, k] read,
//!   b: i8[n, k] read, c: i32[m, n] write)`, grid `n_items = ceil(m/TM) * ceil(n/TN)`,
//!   `n_tiles = ceil(n/TN)`.
//! * `int8_mm_dequant_{dtype}[_bias]`: `(m, n, len: u32, c: i32[m, n] read, row_stats: f32[m]
//!   read, col_stats: f32[n] read, [bias: dtype[n] read,] out: dtype[m, n] write)`, grid
//!   `len = m * n`.
//! * `int8_mixed_scaled_mm_{dtype}[_bias]_t{TM}x{TN}`: `(m, n, k, n_items, n_tiles, n_outliers:
//!   u32, x: dtype[m, k] read, ca: i8[m, k] read, cb: i8[n, k] read, sca: f32[m] read, scb:
//!   f32[n] read, outlier_cols: u32[n_outliers] read, [bias: dtype[n] read,] y: dtype[m, n]
//!   write)`; a column index past `k - 1` reads column `k - 1`.
//! * `int8_mixed_scaled_mm_dx_{dtype}_t{TM}x{TK}`: `(m, n, k, n_items, n_tiles: u32,
//!   dy: dtype[m, n] read, cb: i8[n, k] read, scb: f32[n] read, dx: dtype[m, k] write)`, grid
//!   `ceil(m/TM) * ceil(k/TK)`, `n_tiles = ceil(k/TK)`.

use qforge_macros::{func, kernel};

use crate::check_float_dtype;
use crate::funcs::{round_to, vars};
use crate::int8::DEQUANT_SCALE;
use crate::matmul4::TileConfig;
use crate::tile::{
    accumulate_tile, cells, last_valid, load_rows, row_starts, store_sums, work_tile, Factors, Row,
    TileFactors,
};
use crate::DOT_ORDER;
use qforge_ir::dsl::{Buf, Float, In, Out, TypedKernel, Val, Var};
use qforge_ir::KernelBuilder;
use qforge_ir::Result;
use qforge_ir::{DType, Rounding};

/// bitsandbytes' CPU/default `int8_mm_dequant` constant, `6.200124e-05` as `f32` (close to, but
/// not, `1/127^2 = 6.2000124e-05`).
pub const MM_DEQUANT_SCALE: f32 = 6.200124e-05;

/// Name of the integer matmul, e.g. `int8_linear_matmul_t1x4`.
pub fn linear_matmul_name(tile: TileConfig) -> String {
    format!("int8_linear_matmul_t{}x{}", tile.tm, tile.tn)
}

/// Name of the dequantization of an integer product, e.g. `int8_mm_dequant_f16_bias`.
pub fn mm_dequant_name(dtype: DType, bias: bool) -> String {
    format!("int8_mm_dequant_{dtype}{}", if bias { "_bias" } else { "" })
}

/// Name of the mixed forward, e.g. `int8_mixed_scaled_mm_bf16_bias_t4x1`.
pub fn mixed_name(dtype: DType, bias: bool, tile: TileConfig) -> String {
    format!(
        "int8_mixed_scaled_mm_{dtype}{}_t{}x{}",
        if bias { "_bias" } else { "" },
        tile.tm,
        tile.tn
    )
}

/// Name of the mixed forward's input gradient, e.g. `int8_mixed_scaled_mm_dx_f16_t2x2`.
pub fn mixed_dx_name(dtype: DType, tile: TileConfig) -> String {
    format!("int8_mixed_scaled_mm_dx_{dtype}_t{}x{}", tile.tm, tile.tn)
}

/// For a flat element index `i` of a `[rows, cols]` matrix: `(i / cols, whether (row, col) is
/// inside the matrix)`.
#[func]
pub(crate) fn element_row(i: Val<u32>, rows: Val<u32>, cols: Val<u32>) -> (Val<u32>, Val<bool>) {
    let r = i / cols;
    let start = r * cols;
    let c = i - start;
    let row_ok = r < rows;
    let col_ok = c < cols;
    (r, row_ok & col_ok)
}

/// `acc = acc + a * w` (wrapping `i32`).
#[func]
fn add_product(acc: Var<i32>, a: Val<i32>, w: Val<i32>) {
    let p = a * w;
    acc = acc + p;
}

/// The exact integer dot products `sum_k a[ra + k] * w[rb + k]` of every (row, out) pair of a
/// tile, in `i32` variables `dot{i}` (row-major over the tile).
#[func]
fn int_dots(
    a: Buf<In<i8>>,
    a_bases: &[Val<u32>],
    w: Buf<In<i8>>,
    w_bases: &[Val<u32>],
    k: Val<u32>,
) -> Vec<Var<i32>> {
    let dots = vars::<i32>(comptime!(a_bases.len() * w_bases.len()), "dot");
    for kk in val(0u32)..k {
        let avs = load_rows(a, a_bases, kk);
        let wvs = load_rows(w, w_bases, kk);
        for (ai, av) in avs.iter().enumerate() {
            for (wi, wv) in wvs.iter().enumerate() {
                add_product(comptime!(dots[ai * wvs.len() + wi]), *av, *wv);
            }
        }
    }
    dots
}

/// `(f32(c) * (rs * cs)) * 6.200124e-05`.
#[func]
fn mm_scale(c: Val<i32>, rs: Val<f32>, cs: Val<f32>) -> Val<f32> {
    let cf = c.to_f32();
    let s = rs * cs;
    let y = cf * s;
    y * MM_DEQUANT_SCALE
}

/// The kernel of [`int8_linear_matmul`].
#[kernel(name = linear_matmul_name(tile), grid = n_items, signature = Int8LinearMatmul)]
pub fn linear_matmul_kernel(
    #[config] tile: TileConfig,
    m: u32,
    n: u32,
    k: u32,
    n_items: u32,
    n_tiles: u32,
    #[shape(m, k)] a: In<i8>,
    #[shape(n, k)] b: In<i8>,
    #[shape(m, n)] c: Out<i32>,
) {
    let mv = m;
    let nv = n;
    let kv = k;
    let (rows, outs) = work_tile(n_tiles, tile, mv, nv);
    let a_bases = row_starts(&rows, kv);
    let w_bases = row_starts(&outs, kv);
    let dots = int_dots(a, &a_bases, b, &w_bases, kv);
    for cell in cells(&rows, &outs, &dots) {
        if cell.row.inside && cell.out.inside {
            let v = read(cell.acc);
            c[cell.row.clamped * nv + cell.out.clamped] = v;
        }
    }
}

/// Builds `int8_linear_matmul_t{TM}x{TN}` (see the module docs).
///
/// # Errors
/// [`crate::Error::Unsupported`] for an invalid tile.
pub fn int8_linear_matmul(tile: TileConfig) -> Result<TypedKernel<Int8LinearMatmul>> {
    tile.check()?;
    linear_matmul_kernel(tile)
}

/// The kernel of [`int8_mm_dequant`].
#[kernel(name = mm_dequant_name(dtype, with_bias), grid = len, signature = Int8MmDequant)]
pub fn mm_dequant_kernel(
    #[config] dtype: DType,
    #[config] with_bias: bool,
    m: u32,
    n: u32,
    len: u32,
    #[shape(m, n)] c: In<i32>,
    #[shape(m)] row_stats: In<f32>,
    #[shape(n)] col_stats: In<f32>,
    #[when(with_bias)]
    #[shape(n)]
    #[dtype(dtype)]
    bias: In<Float>,
    #[shape(m, n)]
    #[dtype(dtype)]
    out: Out<Float>,
) {
    let i = work_item();
    let mv = m;
    let nv = n;
    let (r, inside) = element_row(i, mv, nv);
    if inside {
        let start = r * nv;
        let col = i - start;
        let cv = c[i];
        let rv = row_stats[r];
        let colv = col_stats[col];
        let y = mm_scale(cv, rv, colv);
        let y = match bias {
            Some(bb) => y + bb[col],
            None => y,
        };
        store_rounded(out, i, y, Rounding::NearestEven);
    }
}

/// Builds `int8_mm_dequant_{dtype}[_bias]` (see the module docs).
///
/// # Errors
/// [`crate::Error::Unsupported`] for a non-float dtype.
pub fn int8_mm_dequant(dtype: DType, bias: bool) -> Result<TypedKernel<Int8MmDequant>> {
    check_float_dtype(dtype)?;
    mm_dequant_kernel(dtype, bias)
}

/// The outlier column `cb[base + col]` decoded as `int8_vectorwise_dequant` decodes it:
/// `round_dtype((f32(q) * scb) * f32(1/127))`.
#[func]
fn outlier_weight(
    cb: Buf<In<i8>>,
    base: Val<u32>,
    col: Val<u32>,
    scb: Val<f32>,
    dtype: DType,
) -> Val<f32> {
    let q = cb[base + col];
    let qf = q.to_f32();
    let v = qf * scb;
    let v = v * DEQUANT_SCALE;
    round_to(v, dtype)
}

/// The factors of the mixed forward's fp part: the outlier column list, the activation rows
/// and the weight rows of a tile.
struct Outliers {
    cols: Buf<In<u32>>,
    /// `k - 1` (a column index past it reads column `k - 1`).
    last_col: Val<u32>,
    x: Buf<In<Float>>,
    x_bases: Vec<Val<u32>>,
    cb: Buf<In<i8>>,
    w_bases: Vec<Val<u32>>,
    /// `scb` of each tile output.
    scbs: Vec<Val<f32>>,
    dtype: DType,
}

/// The factors of outlier `o`: `x[row, col]` of each tile row and `w(out, col)` of each output,
/// `col = min(cols[o], k - 1)`.
#[func]
fn outlier_factors(p: &Outliers, o: Val<u32>) -> Factors {
    let cols = p.cols;
    let raw = cols[o];
    let col = min(raw, p.last_col);
    let xs = load_rows(p.x, &p.x_bases, col);
    #[comptime]
    let mut ws = Vec::new();
    for (base, s) in p.w_bases.iter().zip(&p.scbs) {
        let w = outlier_weight(p.cb, *base, col, *s, p.dtype);
        ws.push(w);
    }
    (xs, ws)
}

impl TileFactors for Outliers {
    fn factors(&self, b: &mut KernelBuilder, o: Val<u32>) -> Result<Factors> {
        outlier_factors(b, self, o)
    }
}

/// What the mixed forward keeps for one output of a tile: its integer dot product, its fp part
/// and its `scb`.
#[derive(Clone, Copy)]
struct MixedSums {
    dot: Var<i32>,
    fp: Var<f32>,
    scb: Val<f32>,
}

/// The [`MixedSums`] of a tile's outputs, row-major (`scbs` has one entry per output).
fn mixed_sums(dots: &[Var<i32>], fp: &[Var<f32>], scbs: &[Val<f32>]) -> Vec<MixedSums> {
    (0..dots.len())
        .map(|at| MixedSums {
            dot: dots[at],
            fp: fp[at],
            scb: scbs[at % scbs.len()],
        })
        .collect()
}

/// The kernel of [`int8_mixed_scaled_mm`].
#[kernel(name = mixed_name(dtype, with_bias, tile), grid = n_items, signature = Int8MixedScaledMm)]
pub fn mixed_scaled_mm_kernel(
    #[config] dtype: DType,
    #[config] with_bias: bool,
    #[config] tile: TileConfig,
    m: u32,
    n: u32,
    k: u32,
    n_items: u32,
    n_tiles: u32,
    n_outliers: u32,
    #[shape(m, k)]
    #[dtype(dtype)]
    x: In<Float>,
    #[shape(m, k)] ca: In<i8>,
    #[shape(n, k)] cb: In<i8>,
    #[shape(m)] sca: In<f32>,
    #[shape(n)] scb: In<f32>,
    #[shape(n_outliers)] outlier_cols: In<u32>,
    #[when(with_bias)]
    #[shape(n)]
    #[dtype(dtype)]
    bias: In<Float>,
    #[shape(m, n)]
    #[dtype(dtype)]
    y: Out<Float>,
) {
    let mv = m;
    let nv = n;
    let kv = k;
    let (rows, outs) = work_tile(n_tiles, tile, mv, nv);
    let x_bases = row_starts(&rows, kv);
    let w_bases = row_starts(&outs, kv);
    let dots = int_dots(ca, &x_bases, cb, &w_bases, kv);
    #[comptime]
    let mut scbs = Vec::new();
    for o in outs.iter() {
        let s = scb[o.clamped];
        comptime!(scbs.push(s));
    }
    let fp = vars::<f32>(comptime!(dots.len()), "fp");
    let last_col = last_valid(kv);
    let nov = n_outliers;
    let outliers = Outliers {
        cols: outlier_cols,
        last_col,
        x,
        x_bases,
        cb,
        w_bases,
        scbs: scbs.clone(),
        dtype,
    };
    accumulate_tile(nov, DOT_ORDER, &fp, &outliers);
    let sums = comptime!(mixed_sums(&dots, &fp, &scbs));
    for cell in cells(&rows, &outs, &sums) {
        if cell.row.inside && cell.out.inside {
            let dot = read(cell.acc.dot);
            let rs = sca[cell.row.clamped];
            let t = mm_scale(dot, rs, cell.acc.scb);
            let t = match bias {
                Some(bb) => t + bb[cell.out.clamped],
                None => t,
            };
            let t = round_to(t, dtype);
            let v = t + read(cell.acc.fp);
            store_rounded(
                y,
                cell.row.clamped * nv + cell.out.clamped,
                v,
                Rounding::NearestEven,
            );
        }
    }
}

/// Builds `int8_mixed_scaled_mm_{dtype}[_bias]_t{TM}x{TN}` (see the module docs).
///
/// # Errors
/// [`crate::Error::Unsupported`] for a non-float dtype or an invalid tile.
pub fn int8_mixed_scaled_mm(
    dtype: DType,
    bias: bool,
    tile: TileConfig,
) -> Result<TypedKernel<Int8MixedScaledMm>> {
    check_float_dtype(dtype)?;
    tile.check()?;
    mixed_scaled_mm_kernel(dtype, bias, tile)
}

/// The weight `w(nn, out) = round_dtype(f32(cb[row + out]) * scale)` for each output of a tile.
#[func]
fn dx_weights(
    cb: Buf<In<i8>>,
    row: Val<u32>,
    outs: &[Row],
    scale: Val<f32>,
    dtype: DType,
) -> Vec<Val<f32>> {
    #[comptime]
    let mut ws = Vec::new();
    for o in outs {
        let q = cb[row + o.clamped];
        let qf = q.to_f32();
        let v = qf * scale;
        let w = round_to(v, dtype);
        comptime!(ws.push(w));
    }
    ws
}

/// The factors of the input gradient's tile: the `dY` rows and the weights of the outputs.
struct DxProducts {
    dy: Buf<In<Float>>,
    dy_bases: Vec<Val<u32>>,
    cb: Buf<In<i8>>,
    scb: Buf<In<f32>>,
    outs: Vec<Row>,
    /// `K`, the weight's row length.
    k: Val<u32>,
    dtype: DType,
}

/// The factors at reduction index `nn`: `dy[row, nn]` of each tile row and `w(nn, out)` of each
/// output.
#[func]
fn dx_factors(p: &DxProducts, nn: Val<u32>) -> Factors {
    let ds = load_rows(p.dy, &p.dy_bases, nn);
    let scb = p.scb;
    let s = scb[nn];
    let scale = s * DEQUANT_SCALE;
    let row = nn * p.k;
    let ws = dx_weights(p.cb, row, &p.outs, scale, p.dtype);
    (ds, ws)
}

impl TileFactors for DxProducts {
    fn factors(&self, b: &mut KernelBuilder, nn: Val<u32>) -> Result<Factors> {
        dx_factors(b, self, nn)
    }
}

/// The kernel of [`int8_mixed_scaled_mm_dx`].
#[kernel(name = mixed_dx_name(dtype, tile), grid = n_items, signature = Int8MixedScaledMmDx)]
pub fn mixed_scaled_mm_dx_kernel(
    #[config] dtype: DType,
    #[config] tile: TileConfig,
    m: u32,
    n: u32,
    k: u32,
    n_items: u32,
    n_tiles: u32,
    #[shape(m, n)]
    #[dtype(dtype)]
    dy: In<Float>,
    #[shape(n, k)] cb: In<i8>,
    #[shape(n)] scb: In<f32>,
    #[shape(m, k)]
    #[dtype(dtype)]
    dx: Out<Float>,
) {
    let mv = m;
    let nv = n;
    let kv = k;
    let (rows, outs) = work_tile(n_tiles, tile, mv, kv);
    let dy_bases = row_starts(&rows, nv);
    let accs = vars::<f32>(comptime!(rows.len() * outs.len()), "acc");
    let products = DxProducts {
        dy,
        dy_bases,
        cb,
        scb,
        outs: outs.clone(),
        k: kv,
        dtype,
    };
    accumulate_tile(nv, DOT_ORDER, &accs, &products);
    store_sums(dx, kv, &rows, &outs, &accs, None, None);
}

/// Builds `int8_mixed_scaled_mm_dx_{dtype}_t{TM}x{TK}` (see the module docs).
///
/// # Errors
/// [`crate::Error::Unsupported`] for a non-float dtype or an invalid tile.
pub fn int8_mixed_scaled_mm_dx(
    dtype: DType,
    tile: TileConfig,
) -> Result<TypedKernel<Int8MixedScaledMmDx>> {
    check_float_dtype(dtype)?;
    tile.check()?;
    mixed_scaled_mm_dx_kernel(dtype, tile)
}
