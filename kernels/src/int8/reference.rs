//! The builder versions of the LLM.int8() kernels, as they were before the family moved to the
//! kernel language: `super::kernel_tests` proves the macro-built kernels equal to them (same IR,
//! so the same snapshots).
#![allow(missing_docs)]

use crate::check_float_dtype;
use crate::int8::matmul::MM_DEQUANT_SCALE;
use crate::int8::matmul::{linear_matmul_name, mixed_dx_name, mixed_name, mm_dequant_name};
use crate::int8::{Int8Spec, DEQUANT_SCALE, MAX_CODE};
use crate::matmul4::TileConfig;
use crate::tile::builder::{last_index, row_bases, store_tile, tile_of};
use crate::DOT_ORDER;
use qforge_ir::routines::round::round_to;
use qforge_ir::KernelBuilder;
use qforge_ir::Result;
use qforge_ir::{Access, Dim, Kernel, ParamId, Value, VarId};
use qforge_ir::{BinaryOp, CmpOp, NanMode};
use qforge_ir::{DType, Rounding, ScalarType};

/// `(threshold > 0, threshold rounded to dtype)`: the outlier test's two inputs.
fn outlier_setup(b: &mut KernelBuilder, threshold: ParamId, dtype: DType) -> (Value, Value) {
    let t = b.param(threshold);
    let zero = b.const_f32(0.0);
    let active = b.cmp(CmpOp::Gt, t, zero);
    let rounded = round_to(b, t, dtype);
    (active, rounded)
}

/// `active && |x| >= t` for `ax = |x|`.
fn is_outlier(b: &mut KernelBuilder, ax: Value, setup: (Value, Value)) -> Value {
    let ge = b.cmp(CmpOp::Ge, ax, setup.1);
    b.and(setup.0, ge)
}

/// `(1 / absmax) * 127` in `f32`.
fn code_scale(b: &mut KernelBuilder, absmax: Value) -> Value {
    let one = b.const_f32(1.0);
    let inv = b.div(one, absmax);
    let c127 = b.const_f32(MAX_CODE as f32);
    b.mul(inv, c127)
}

/// `clamp(round_half_even(x * scale), -127, 127)` as `i32` (NaN gives 0).
fn code_of(b: &mut KernelBuilder, x: Value, scale: Value) -> Value {
    let v = b.mul(x, scale);
    let q = b.float_to_int(v, ScalarType::I32, Rounding::NearestEven);
    let lo = b.const_i32(-MAX_CODE);
    let hi = b.const_i32(MAX_CODE);
    let q = b.max(q, lo);
    b.min(q, hi)
}

fn check(dtype: DType) -> Result<()> {
    check_float_dtype(dtype)
}

/// Builds `int8_outlier_cols_{dtype}`: `outlier_flags[c] = 1` when any element of column `c` is
/// an outlier (see the module docs), else 0.
///
/// # Errors
/// [`Error::Unsupported`] for a non-float dtype.
pub fn int8_outlier_cols(dtype: DType) -> Result<Kernel> {
    check(dtype)?;
    let mut b = KernelBuilder::new(&Int8Spec::OutlierCols { dtype }.name());
    let rows = b.scalar_param("rows", ScalarType::U32);
    let cols = b.scalar_param("cols", ScalarType::U32);
    let threshold = b.scalar_param("threshold", ScalarType::F32);
    let a = b.buffer_param(
        "a",
        dtype,
        &[Dim::Param(rows), Dim::Param(cols)],
        Access::Read,
    );
    let flags = b.buffer_param(
        "outlier_flags",
        DType::U32,
        &[Dim::Param(cols)],
        Access::Write,
    );
    b.set_grid(Dim::Param(cols));
    let c = b.work_item();
    let setup = outlier_setup(&mut b, threshold, dtype);
    let flag = b.var("flag", ScalarType::U32);
    let (rv, cv) = (b.param(rows), b.param(cols));
    let zero = b.const_u32(0);
    b.for_range(zero, rv, 1, |b, r| {
        let row = b.mul(r, cv);
        let idx = b.add(row, c);
        let x = b.load(a, idx);
        let ax = b.abs(x);
        let out = is_outlier(b, ax, setup);
        let one = b.const_u32(1);
        let z = b.const_u32(0);
        let bit = b.select(out, one, z);
        let cur = b.read_var(flag);
        let f = b.or(cur, bit);
        b.assign(flag, f);
    });
    let f = b.read_var(flag);
    b.store(flags, c, f);
    Ok(b.finish())
}

/// Builds `int8_vectorwise_quant_{dtype}` (bitsandbytes `int8_vectorwise_quant`): row
/// statistics over the non-outlier elements and the codes, outliers and flagged columns coded 0
/// (see the module docs). `outlier_flags` comes from [`int8_outlier_cols`] (all zero for
/// threshold 0).
///
/// # Errors
/// [`Error::Unsupported`] for a non-float dtype.
pub fn int8_vectorwise_quant(dtype: DType) -> Result<Kernel> {
    check(dtype)?;
    let mut b = KernelBuilder::new(&Int8Spec::VectorwiseQuant { dtype }.name());
    let rows = b.scalar_param("rows", ScalarType::U32);
    let cols = b.scalar_param("cols", ScalarType::U32);
    let threshold = b.scalar_param("threshold", ScalarType::F32);
    let shape = [Dim::Param(rows), Dim::Param(cols)];
    let a = b.buffer_param("a", dtype, &shape, Access::Read);
    let flags = b.buffer_param(
        "outlier_flags",
        DType::U32,
        &[Dim::Param(cols)],
        Access::Read,
    );
    let ca = b.buffer_param("ca", DType::I8, &shape, Access::Write);
    let stats = b.buffer_param("row_stats", DType::F32, &[Dim::Param(rows)], Access::Write);
    b.set_grid(Dim::Param(rows));
    let r = b.work_item();
    let setup = outlier_setup(&mut b, threshold, dtype);
    let cv = b.param(cols);
    let base = b.mul(r, cv);
    let zero = b.const_u32(0);
    let acc = b.var("absmax", ScalarType::F32);
    b.for_range(zero, cv, 1, |b, c| {
        let idx = b.add(base, c);
        let x = b.load(a, idx);
        let ax = b.abs(x);
        let out = is_outlier(b, ax, setup);
        let z = b.const_f32(0.0);
        let v = b.select(out, z, ax);
        // torch `max`: a NaN element makes the result NaN, and a NaN result stays NaN.
        let cur = b.read_var(acc);
        let gt = b.cmp(CmpOp::Gt, v, cur);
        let nan = b.cmp(CmpOp::Ne, v, v);
        let take = b.or(gt, nan);
        let m = b.select(take, v, cur);
        b.assign(acc, m);
    });
    let am = b.read_var(acc);
    b.store(stats, r, am);
    let scale = code_scale(&mut b, am);
    b.for_range(zero, cv, 1, |b, c| {
        let idx = b.add(base, c);
        let x = b.load(a, idx);
        let ax = b.abs(x);
        let out = is_outlier(b, ax, setup);
        let flag = b.load(flags, c);
        let z = b.const_u32(0);
        let flagged = b.cmp(CmpOp::Ne, flag, z);
        let zeroed = b.or(out, flagged);
        let q = code_of(b, x, scale);
        let zi = b.const_i32(0);
        let code = b.select(zeroed, zi, q);
        b.store(ca, idx, code);
    });
    Ok(b.finish())
}

/// Builds `quantize_rowwise_int8_{dtype}`: per-row symmetric absmax int8 (the vector-wise codes
/// and statistics with threshold 0, see the module docs), the row absmax from one NaN-propagating
/// [`crate::Op::Reduce`].
///
/// # Errors
/// [`Error::Unsupported`] for a non-float dtype.
pub fn quantize_rowwise_int8(dtype: DType) -> Result<Kernel> {
    check(dtype)?;
    let mut b = KernelBuilder::new(&Int8Spec::QuantizeRowwise { dtype }.name());
    let rows = b.scalar_param("rows", ScalarType::U32);
    let cols = b.scalar_param("cols", ScalarType::U32);
    let shape = [Dim::Param(rows), Dim::Param(cols)];
    let a = b.buffer_param("a", dtype, &shape, Access::Read);
    let q = b.buffer_param("q", DType::I8, &shape, Access::Write);
    let absmax = b.buffer_param("absmax", DType::F32, &[Dim::Param(rows)], Access::Write);
    b.set_grid(Dim::Param(rows));
    let r = b.work_item();
    let cv = b.param(cols);
    let base = b.mul(r, cv);
    let am = b.reduce_absmax(a, base, cv, NanMode::Propagate);
    b.store(absmax, r, am);
    let scale = code_scale(&mut b, am);
    let zero = b.const_u32(0);
    b.for_range(zero, cv, 1, |b, c| {
        let idx = b.add(base, c);
        let x = b.load(a, idx);
        let code = code_of(b, x, scale);
        b.store(q, idx, code);
    });
    Ok(b.finish())
}

/// Builds `int8_vectorwise_dequant_{dtype}` (bitsandbytes `int8_vectorwise_dequant`, which
/// returns `f32`): `out = (f32(ca) * stats[r]) * f32(1/127)`, rounded once to `dtype`.
///
/// # Errors
/// [`Error::Unsupported`] for a non-float dtype.
pub fn int8_vectorwise_dequant(dtype: DType) -> Result<Kernel> {
    check(dtype)?;
    let mut b = KernelBuilder::new(&Int8Spec::VectorwiseDequant { dtype }.name());
    let rows = b.scalar_param("rows", ScalarType::U32);
    let cols = b.scalar_param("cols", ScalarType::U32);
    let n = b.scalar_param("n", ScalarType::U32);
    let shape = [Dim::Param(rows), Dim::Param(cols)];
    let ca = b.buffer_param("ca", DType::I8, &shape, Access::Read);
    let stats = b.buffer_param("stats", DType::F32, &[Dim::Param(rows)], Access::Read);
    let out = b.buffer_param("out", dtype, &shape, Access::Write);
    b.set_grid(Dim::Param(n));
    let i = b.work_item();
    let (rv, cv) = (b.param(rows), b.param(cols));
    let (r, inside) = element_row(&mut b, i, rv, cv);
    b.if_then(inside, |b| {
        let q = b.load(ca, i);
        let qf = b.int_to_float(q);
        let s = b.load(stats, r);
        let y = b.mul(qf, s);
        let c = b.const_f32(DEQUANT_SCALE);
        let y = b.mul(y, c);
        b.store_auto(out, i, y);
    });
    Ok(b.finish())
}

/// For a flat element index `i` of a `[rows, cols]` matrix: `(i / cols, whether (row, col) is
/// inside the matrix)`.
fn element_row(b: &mut KernelBuilder, i: Value, rows: Value, cols: Value) -> (Value, Value) {
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
