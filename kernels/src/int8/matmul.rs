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
//!   f32(1/127))`, summed by one [`crate::Stmt::Accumulate`] in [`DOT_ORDER`] (element `o` fused
//!   into partial `o % 8`, the halving tree); finally `y = round_dtype(t + fp)`. This is
//!   bitsandbytes' `output.addmm(subA, subB)` on the dtype-rounded int8 result: two roundings to
//!   the dtype (a single rounding differs from bitsandbytes in about a quarter of the golden
//!   outputs). With no outliers `fp = -0.0` and `y = t` exactly.
//! * `int8_mixed_scaled_mm_dx` (`MatMul8bitLt.backward`, `dX = dY @ dequant(CB)`):
//!   `dX[i, k] = round_dtype(sum_n dY[i, n] * w(n, k))` with
//!   `w(n, k) = round_dtype(f32(CB[n, k]) * (SCB[n] * f32(1/127)))` (bitsandbytes'
//!   `CB.to(dtype).mul_(SCB.unsqueeze(1).mul(1.0 / 127.0))`: the scale is formed first), the
//!   sum one [`crate::Stmt::Accumulate`] over `n` in [`DOT_ORDER`].
//!
//! Tiling (the `_t{TM}x{TN}` suffix) only changes which work item computes an output, never its
//! bits: work item `t` computes rows `(t / n_tiles) * TM ..` and outputs `(t % n_tiles) * TN ..`;
//! rows past the end read the last valid row and store nothing.
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

use crate::check_float_dtype;
use crate::int8::DEQUANT_SCALE;
use crate::matmul4::TileConfig;
use crate::tile::{last_index, row_bases, store_tile, tile_of};
use crate::DOT_ORDER;
use qforge_ir::routines::round::round_to;
use qforge_ir::KernelBuilder;
use qforge_ir::Result;
use qforge_ir::{Access, Dim, Kernel, ParamId, Value, VarId};
use qforge_ir::{BinaryOp, CmpOp};
use qforge_ir::{DType, ScalarType};

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
pub(crate) fn element_row(
    b: &mut KernelBuilder,
    i: Value,
    rows: Value,
    cols: Value,
) -> (Value, Value) {
    let r = b.binary(BinaryOp::Div, i, cols);
    let start = b.mul(r, cols);
    let c = b.sub(i, start);
    let row_ok = b.cmp(CmpOp::Lt, r, rows);
    let col_ok = b.cmp(CmpOp::Lt, c, cols);
    let inside = b.and(row_ok, col_ok);
    (r, inside)
}

/// The exact integer dot products `sum_k a[ra + k] * b[rb + k]` of every (row, out) pair of a
/// tile, in `i32` variables (row-major over the tile).
fn int_dots(
    b: &mut KernelBuilder,
    (a, a_bases): (ParamId, &[Value]),
    (w, w_bases): (ParamId, &[Value]),
    k: Value,
) -> Vec<VarId> {
    let vars: Vec<VarId> = (0..a_bases.len() * w_bases.len())
        .map(|i| b.var(&format!("dot{i}"), ScalarType::I32))
        .collect();
    let zero = b.const_u32(0);
    b.for_range(zero, k, 1, |b, kk| {
        let avs: Vec<Value> = a_bases
            .iter()
            .map(|base| {
                let idx = b.add(*base, kk);
                b.load(a, idx)
            })
            .collect();
        let wvs: Vec<Value> = w_bases
            .iter()
            .map(|base| {
                let idx = b.add(*base, kk);
                b.load(w, idx)
            })
            .collect();
        for (ai, av) in avs.iter().enumerate() {
            for (wi, wv) in wvs.iter().enumerate() {
                let var = vars[ai * wvs.len() + wi];
                let p = b.mul(*av, *wv);
                let cur = b.read_var(var);
                let s = b.add(cur, p);
                b.assign(var, s);
            }
        }
    });
    vars
}

/// `(f32(c) * (rs * cs)) * 6.200124e-05`.
fn mm_scale(b: &mut KernelBuilder, c: Value, rs: Value, cs: Value) -> Value {
    let cf = b.int_to_float(c);
    let s = b.mul(rs, cs);
    let y = b.mul(cf, s);
    let k = b.const_f32(MM_DEQUANT_SCALE);
    b.mul(y, k)
}

/// The five size scalars of a tiled matmul: `(m, n, k, n_items, n_tiles)`.
fn tiled_sizes(b: &mut KernelBuilder) -> [ParamId; 5] {
    ["m", "n", "k", "n_items", "n_tiles"].map(|s| b.scalar_param(s, ScalarType::U32))
}

/// Builds `int8_linear_matmul_t{TM}x{TN}` (see the module docs).
///
/// # Errors
/// [`crate::Error::Unsupported`] for an invalid tile.
pub fn int8_linear_matmul(tile: TileConfig) -> Result<Kernel> {
    tile.check()?;
    let mut b = KernelBuilder::new(&linear_matmul_name(tile));
    let [m, n, k, n_items, n_tiles] = tiled_sizes(&mut b);
    let (pm, pn, pk) = (Dim::Param(m), Dim::Param(n), Dim::Param(k));
    let a = b.buffer_param("a", DType::I8, &[pm, pk], Access::Read);
    let w = b.buffer_param("b", DType::I8, &[pn, pk], Access::Read);
    let c = b.buffer_param("c", DType::I32, &[pm, pn], Access::Write);
    b.set_grid(Dim::Param(n_items));
    let (mv, nv, kv) = (b.param(m), b.param(n), b.param(k));
    let (rows, outs) = tile_of(&mut b, n_tiles, tile, mv, nv);
    let a_bases = row_bases(&mut b, &rows, kv);
    let w_bases = row_bases(&mut b, &outs, kv);
    let vars = int_dots(&mut b, (a, &a_bases), (w, &w_bases), kv);
    store_tile(&mut b, (&rows, &outs), c, nv, |b, at, _, _| {
        b.read_var(vars[at])
    });
    Ok(b.finish())
}

/// Builds `int8_mm_dequant_{dtype}[_bias]` (see the module docs).
///
/// # Errors
/// [`crate::Error::Unsupported`] for a non-float dtype.
pub fn int8_mm_dequant(dtype: DType, bias: bool) -> Result<Kernel> {
    check_float_dtype(dtype)?;
    let mut b = KernelBuilder::new(&mm_dequant_name(dtype, bias));
    let m = b.scalar_param("m", ScalarType::U32);
    let n = b.scalar_param("n", ScalarType::U32);
    let len = b.scalar_param("len", ScalarType::U32);
    let shape = [Dim::Param(m), Dim::Param(n)];
    let c = b.buffer_param("c", DType::I32, &shape, Access::Read);
    let rs = b.buffer_param("row_stats", DType::F32, &[Dim::Param(m)], Access::Read);
    let cs = b.buffer_param("col_stats", DType::F32, &[Dim::Param(n)], Access::Read);
    let bias = bias.then(|| b.buffer_param("bias", dtype, &[Dim::Param(n)], Access::Read));
    let out = b.buffer_param("out", dtype, &shape, Access::Write);
    b.set_grid(Dim::Param(len));
    let i = b.work_item();
    let (mv, nv) = (b.param(m), b.param(n));
    let (r, inside) = element_row(&mut b, i, mv, nv);
    b.if_then(inside, |b| {
        let start = b.mul(r, nv);
        let col = b.sub(i, start);
        let cv = b.load(c, i);
        let rv = b.load(rs, r);
        let colv = b.load(cs, col);
        let mut y = mm_scale(b, cv, rv, colv);
        if let Some(bias) = bias {
            let bv = b.load(bias, col);
            y = b.add(y, bv);
        }
        b.store_auto(out, i, y);
    });
    Ok(b.finish())
}

/// Builds `int8_mixed_scaled_mm_{dtype}[_bias]_t{TM}x{TN}` (see the module docs).
///
/// # Errors
/// [`crate::Error::Unsupported`] for a non-float dtype or an invalid tile.
pub fn int8_mixed_scaled_mm(dtype: DType, bias: bool, tile: TileConfig) -> Result<Kernel> {
    check_float_dtype(dtype)?;
    tile.check()?;
    let mut b = KernelBuilder::new(&mixed_name(dtype, bias, tile));
    let [m, n, k, n_items, n_tiles] = tiled_sizes(&mut b);
    let n_out = b.scalar_param("n_outliers", ScalarType::U32);
    let (pm, pn, pk) = (Dim::Param(m), Dim::Param(n), Dim::Param(k));
    let x = b.buffer_param("x", dtype, &[pm, pk], Access::Read);
    let ca = b.buffer_param("ca", DType::I8, &[pm, pk], Access::Read);
    let cb = b.buffer_param("cb", DType::I8, &[pn, pk], Access::Read);
    let sca = b.buffer_param("sca", DType::F32, &[pm], Access::Read);
    let scb = b.buffer_param("scb", DType::F32, &[pn], Access::Read);
    let cols = b.buffer_param(
        "outlier_cols",
        DType::U32,
        &[Dim::Param(n_out)],
        Access::Read,
    );
    let bias = bias.then(|| b.buffer_param("bias", dtype, &[pn], Access::Read));
    let y = b.buffer_param("y", dtype, &[pm, pn], Access::Write);
    b.set_grid(Dim::Param(n_items));
    let (mv, nv, kv) = (b.param(m), b.param(n), b.param(k));
    let (rows, outs) = tile_of(&mut b, n_tiles, tile, mv, nv);
    let x_bases = row_bases(&mut b, &rows, kv);
    let w_bases = row_bases(&mut b, &outs, kv);
    let dots = int_dots(&mut b, (ca, &x_bases), (cb, &w_bases), kv);
    let scbs: Vec<Value> = outs.iter().map(|o| b.load(scb, o.clamped)).collect();
    let fp_vars: Vec<VarId> = (0..dots.len())
        .map(|i| b.var(&format!("fp{i}"), ScalarType::F32))
        .collect();
    let last_col = last_index(&mut b, kv);
    let nov = b.param(n_out);
    b.accumulate(nov, DOT_ORDER, &fp_vars, |b, o| {
        let raw = b.load(cols, o);
        let col = b.min(raw, last_col);
        let xs: Vec<Value> = x_bases
            .iter()
            .map(|base| {
                let idx = b.add(*base, col);
                b.load(x, idx)
            })
            .collect();
        let ws: Vec<Value> = w_bases
            .iter()
            .zip(&scbs)
            .map(|(base, s)| {
                let idx = b.add(*base, col);
                let q = b.load(cb, idx);
                let qf = b.int_to_float(q);
                let v = b.mul(qf, *s);
                let c = b.const_f32(DEQUANT_SCALE);
                let v = b.mul(v, c);
                round_to(b, v, dtype)
            })
            .collect();
        let mut factors = Vec::new();
        for xv in &xs {
            for wv in &ws {
                factors.push((*xv, *wv));
            }
        }
        factors
    });
    let n_outs = outs.len();
    store_tile(&mut b, (&rows, &outs), y, nv, |b, at, r, o| {
        let dot = b.read_var(dots[at]);
        let rs = b.load(sca, r.clamped);
        let mut t = mm_scale(b, dot, rs, scbs[at % n_outs]);
        if let Some(bias) = bias {
            let bv = b.load(bias, o.clamped);
            t = b.add(t, bv);
        }
        let t = round_to(b, t, dtype);
        let fp = b.read_var(fp_vars[at]);
        b.add(t, fp)
    });
    Ok(b.finish())
}

/// Builds `int8_mixed_scaled_mm_dx_{dtype}_t{TM}x{TK}` (see the module docs).
///
/// # Errors
/// [`crate::Error::Unsupported`] for a non-float dtype or an invalid tile.
pub fn int8_mixed_scaled_mm_dx(dtype: DType, tile: TileConfig) -> Result<Kernel> {
    check_float_dtype(dtype)?;
    tile.check()?;
    let mut b = KernelBuilder::new(&mixed_dx_name(dtype, tile));
    let [m, n, k, n_items, n_tiles] = tiled_sizes(&mut b);
    let (pm, pn, pk) = (Dim::Param(m), Dim::Param(n), Dim::Param(k));
    let dy = b.buffer_param("dy", dtype, &[pm, pn], Access::Read);
    let cb = b.buffer_param("cb", DType::I8, &[pn, pk], Access::Read);
    let scb = b.buffer_param("scb", DType::F32, &[pn], Access::Read);
    let dx = b.buffer_param("dx", dtype, &[pm, pk], Access::Write);
    b.set_grid(Dim::Param(n_items));
    let (mv, nv, kv) = (b.param(m), b.param(n), b.param(k));
    let (rows, outs) = tile_of(&mut b, n_tiles, tile, mv, kv);
    let dy_bases = row_bases(&mut b, &rows, nv);
    let vars: Vec<VarId> = (0..rows.len() * outs.len())
        .map(|i| b.var(&format!("acc{i}"), ScalarType::F32))
        .collect();
    b.accumulate(nv, DOT_ORDER, &vars, |b, nn| {
        let ds: Vec<Value> = dy_bases
            .iter()
            .map(|base| {
                let idx = b.add(*base, nn);
                b.load(dy, idx)
            })
            .collect();
        let s = b.load(scb, nn);
        let c = b.const_f32(DEQUANT_SCALE);
        let scale = b.mul(s, c);
        let row = b.mul(nn, kv);
        let ws: Vec<Value> = outs
            .iter()
            .map(|o| {
                let idx = b.add(row, o.clamped);
                let q = b.load(cb, idx);
                let qf = b.int_to_float(q);
                let v = b.mul(qf, scale);
                round_to(b, v, dtype)
            })
            .collect();
        let mut factors = Vec::new();
        for d in &ds {
            for w in &ws {
                factors.push((*d, *w));
            }
        }
        factors
    });
    store_tile(&mut b, (&rows, &outs), dx, kv, |b, at, _, _| {
        b.read_var(vars[at])
    });
    Ok(b.finish())
}
