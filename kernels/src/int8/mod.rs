//! LLM.int8() (Dettmers et al. 2022, arXiv 2208.07339) as bitsandbytes implements it:
//! vector-wise int8 quantization with fp outlier columns, int8 x int8 -> int32 matmul, the
//! dequantization of its result, the mixed-precision forward and its input gradient; plus a
//! simpler uniform per-row int8 weight format. This file holds the quantize/dequantize kernels
//! and [`Int8Spec`]; [`crate::int8::matmul`] holds the matmul kernels.
//!
//! Layout: a matrix `A [rows, cols]` is row-major (a `[..., cols]` tensor flattened to rows);
//! codes are `i8` with `A`'s shape, one `f32` statistic (the row absmax) per row.
//!
//! Semantics (bitsandbytes 0.50.2, the CPU/default backend that produced the golden vectors;
//! every rule below is reproduced bit for bit on `../shared/golden/int8.safetensors`, see
//! `tests/int8.rs` and `docs/semantics.md`, section "LLM.int8"):
//! * Outliers: when `threshold > 0`, element `x` is an outlier when `|x| >= t`, where `t` is
//!   `threshold` rounded (nearest even) to `A`'s dtype, as torch compares an f16/bf16 tensor
//!   with a Python float in the tensor's dtype (6.0 itself counts). NaN is never an outlier;
//!   `±inf` is one. A column holding any outlier is an outlier column
//!   ([`int8_outlier_cols`] flags them, `1` or `0` per column).
//! * `row_stats[r] = max |x|` over the row's non-outlier elements (outliers count as 0), starting
//!   at `+0.0`; a NaN element makes it NaN (torch `max`).
//! * `scale = (1 / row_stats) * 127` (two `f32` roundings: torch evaluates `127.0 / t` as
//!   `t.reciprocal() * 127.0`), then `code = clamp(round_half_even(x * scale), -127, 127)` with
//!   NaN giving 0. So a zero row (`scale = inf`, `0 * inf = NaN`), a NaN row and an inf row
//!   (`scale = 0`, finite `x` gives 0, `inf * 0 = NaN`) give all-zero codes. The clamp only acts
//!   when `scale` overflows to `inf` (`row_stats` below about `127 * 2^-128`, f32 inputs only),
//!   where bitsandbytes' conversion of `±inf` to int8 is platform-defined; here it gives `±127`.
//! * Outlier elements are coded 0, and so is every element of a flagged column. (bitsandbytes
//!   zeroes outlier columns only when `rows > 1`; with one row a column holds one element, which
//!   is then the outlier itself, so the rule is the same.)
//! * Dequant: `(f32(code) * stats[r]) * 7.874015718698502e-3` (`f32(1/127)`, bitsandbytes'
//!   constant), two `f32` roundings in this order, then one rounding (nearest even) to the
//!   output dtype (`f32` in bitsandbytes).
//! * [`quantize_rowwise_int8`]: the same codes and absmax as the vector-wise quantizer with
//!   threshold 0 (so its output is bitsandbytes' `CB`/`SCB` of `Linear8bitLt`), in one launch
//!   with no outlier pass; it is dequantized by [`int8_vectorwise_dequant`].
//!
//! Parameter order (scalars first, then buffers):
//! * `int8_outlier_cols_{dtype}`: `(rows: u32, cols: u32, threshold: f32, a: dtype[rows, cols]
//!   read, outlier_flags: u32[cols] write)`, grid `cols` (one work item per column).
//! * `int8_vectorwise_quant_{dtype}`: `(rows: u32, cols: u32, threshold: f32, a: dtype[rows,
//!   cols] read, outlier_flags: u32[cols] read, ca: i8[rows, cols] write, row_stats: f32[rows]
//!   write)`, grid `rows` (one work item per row).
//! * `quantize_rowwise_int8_{dtype}`: `(rows: u32, cols: u32, a: dtype[rows, cols] read,
//!   q: i8[rows, cols] write, absmax: f32[rows] write)`, grid `rows`.
//! * `int8_vectorwise_dequant_{dtype}` (output dtype): `(rows: u32, cols: u32, n: u32,
//!   ca: i8[rows, cols] read, stats: f32[rows] read, out: dtype[rows, cols] write)`, grid
//!   `n = rows * cols` (one work item per element; items past the matrix store nothing).

pub(crate) mod args;
mod catalog;
pub(crate) mod host;
#[cfg(test)]
mod kernel_tests;
pub mod matmul;

use crate::check_float_dtype;
use crate::int8::matmul::{self as mm};
use crate::matmul4::TileConfig;
use qforge_ir::routines::round::round_to;
use qforge_ir::KernelBuilder;
use qforge_ir::OwnedArg;
use qforge_ir::{Access, Dim, Kernel, ParamId, Value};
use qforge_ir::{CmpOp, NanMode};
use qforge_ir::{DType, Rounding, ScalarType};
use qforge_ir::{Error, Result};

/// bitsandbytes' dequantization constant `f32(1 / 127)` = 7.874015718698502e-3.
pub const DEQUANT_SCALE: f32 = 7.874_016e-3;
/// The largest code magnitude, 127.
pub const MAX_CODE: i32 = 127;
/// bitsandbytes' default LLM.int8() outlier threshold.
pub const DEFAULT_THRESHOLD: f32 = 6.0;
/// The test length [`Int8Spec::blocksize`] reports for every int8 kernel.
pub const INT8_TEST_LEN: usize = 64;

/// One LLM.int8() kernel variant. [`Int8Spec::name`] is the kernel name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Int8Spec {
    /// [`int8_outlier_cols`].
    OutlierCols {
        /// Input dtype.
        dtype: DType,
    },
    /// [`int8_vectorwise_quant`].
    VectorwiseQuant {
        /// Input dtype.
        dtype: DType,
    },
    /// [`int8_vectorwise_dequant`].
    VectorwiseDequant {
        /// Output dtype.
        dtype: DType,
    },
    /// [`quantize_rowwise_int8`].
    QuantizeRowwise {
        /// Input dtype.
        dtype: DType,
    },
    /// [`mm::int8_linear_matmul`].
    LinearMatmul {
        /// Outputs per work item.
        tile: TileConfig,
    },
    /// [`mm::int8_mm_dequant`].
    MmDequant {
        /// Output (and bias) dtype.
        dtype: DType,
        /// Whether a bias `[n]` is added.
        bias: bool,
    },
    /// [`mm::int8_mixed_scaled_mm`].
    MixedScaledMm {
        /// Activation, bias and output dtype.
        dtype: DType,
        /// Whether a bias `[n]` is added.
        bias: bool,
        /// Outputs per work item.
        tile: TileConfig,
    },
    /// [`mm::int8_mixed_scaled_mm_dx`].
    MixedScaledMmDx {
        /// Gradient dtype.
        dtype: DType,
        /// Outputs per work item.
        tile: TileConfig,
    },
}

impl Int8Spec {
    /// The kernel name.
    pub fn name(&self) -> String {
        match *self {
            Int8Spec::OutlierCols { dtype } => format!("int8_outlier_cols_{dtype}"),
            Int8Spec::VectorwiseQuant { dtype } => format!("int8_vectorwise_quant_{dtype}"),
            Int8Spec::VectorwiseDequant { dtype } => format!("int8_vectorwise_dequant_{dtype}"),
            Int8Spec::QuantizeRowwise { dtype } => format!("quantize_rowwise_int8_{dtype}"),
            Int8Spec::LinearMatmul { tile } => mm::linear_matmul_name(tile),
            Int8Spec::MmDequant { dtype, bias } => mm::mm_dequant_name(dtype, bias),
            Int8Spec::MixedScaledMm { dtype, bias, tile } => mm::mixed_name(dtype, bias, tile),
            Int8Spec::MixedScaledMmDx { dtype, tile } => mm::mixed_dx_name(dtype, tile),
        }
    }

    /// The dtype of the kernel's float data (`i8` for the integer matmul, which has none).
    pub fn dtype(&self) -> DType {
        match *self {
            Int8Spec::OutlierCols { dtype }
            | Int8Spec::VectorwiseQuant { dtype }
            | Int8Spec::VectorwiseDequant { dtype }
            | Int8Spec::QuantizeRowwise { dtype }
            | Int8Spec::MmDequant { dtype, .. }
            | Int8Spec::MixedScaledMm { dtype, .. }
            | Int8Spec::MixedScaledMmDx { dtype, .. } => dtype,
            Int8Spec::LinearMatmul { .. } => DType::I8,
        }
    }

    /// Builds the kernel.
    ///
    /// # Errors
    /// [`Error::Unsupported`] for a non-float dtype or an invalid tile.
    pub fn build(&self) -> Result<Kernel> {
        match *self {
            Int8Spec::OutlierCols { dtype } => int8_outlier_cols(dtype),
            Int8Spec::VectorwiseQuant { dtype } => int8_vectorwise_quant(dtype),
            Int8Spec::VectorwiseDequant { dtype } => int8_vectorwise_dequant(dtype),
            Int8Spec::QuantizeRowwise { dtype } => quantize_rowwise_int8(dtype),
            Int8Spec::LinearMatmul { tile } => mm::int8_linear_matmul(tile),
            Int8Spec::MmDequant { dtype, bias } => mm::int8_mm_dequant(dtype, bias),
            Int8Spec::MixedScaledMm { dtype, bias, tile } => {
                mm::int8_mixed_scaled_mm(dtype, bias, tile)
            }
            Int8Spec::MixedScaledMmDx { dtype, tile } => mm::int8_mixed_scaled_mm_dx(dtype, tile),
        }
    }

    /// A useful test length: [`INT8_TEST_LEN`] (the columns of a quantized matrix, the reduction
    /// length of a matmul).
    pub fn blocksize(&self) -> usize {
        INT8_TEST_LEN
    }

    /// Launch arguments derived from `values` (see [`crate::KernelSpec::example_args`]).
    ///
    /// # Errors
    /// [`Error::Unsupported`] for an empty `values`.
    pub fn example_args(&self, values: &[f32]) -> Result<Vec<OwnedArg>> {
        if values.is_empty() {
            return Err(Error::Unsupported(
                "int8 example arguments need at least one value".into(),
            ));
        }
        Ok(crate::int8::args::example_args(self, values))
    }
}

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
    let (r, inside) = mm::element_row(&mut b, i, rv, cv);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_int8_constants_are_bitsandbytes_values() {
        // f32(1/127), the value bitsandbytes writes as 7.874015718698502e-3.
        assert_eq!(DEQUANT_SCALE, (1.0f64 / 127.0) as f32);
        assert_eq!(DEQUANT_SCALE as f64, 7.874015718698502e-3);
        assert_eq!(mm::MM_DEQUANT_SCALE, 6.200124e-05);
    }

    #[test]
    fn library_int8_rejects_integer_dtypes() {
        for e in [
            int8_outlier_cols(DType::I8),
            int8_vectorwise_quant(DType::U8),
            int8_vectorwise_dequant(DType::I32),
            quantize_rowwise_int8(DType::U32),
        ] {
            let msg = e.unwrap_err().to_string();
            assert!(msg.contains("not supported"), "{msg}");
        }
    }
}
