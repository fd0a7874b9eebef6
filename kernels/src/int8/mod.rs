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
//! The kernels are written in the kernel language (`#[kernel]` / `#[func]`, docs/custom-ops.md);
//! each comes with its typed signature and `<Name>Args` struct ([`Int8OutlierColsArgs`], ...),
//! through which the host ops (`int8::host`) launch them. The builder versions they
//! replaced are kept in `reference.rs` for the tests that prove both build the same IR.
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
#[cfg(test)]
mod reference;

use qforge_macros::{func, kernel};

use crate::check_float_dtype;
use crate::funcs::round_to;
use crate::int8::matmul::{self as mm, element_row};
use crate::matmul4::TileConfig;
use qforge_ir::dsl::{Float, In, Out, TypedKernel, Val};
use qforge_ir::Kernel;
use qforge_ir::NanMode;
use qforge_ir::OwnedArg;
use qforge_ir::{DType, Rounding};
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
            Int8Spec::OutlierCols { dtype } => {
                int8_outlier_cols(dtype).map(TypedKernel::into_kernel)
            }
            Int8Spec::VectorwiseQuant { dtype } => {
                int8_vectorwise_quant(dtype).map(TypedKernel::into_kernel)
            }
            Int8Spec::VectorwiseDequant { dtype } => {
                int8_vectorwise_dequant(dtype).map(TypedKernel::into_kernel)
            }
            Int8Spec::QuantizeRowwise { dtype } => {
                quantize_rowwise_int8(dtype).map(TypedKernel::into_kernel)
            }
            Int8Spec::LinearMatmul { tile } => {
                mm::int8_linear_matmul(tile).map(TypedKernel::into_kernel)
            }
            Int8Spec::MmDequant { dtype, bias } => {
                mm::int8_mm_dequant(dtype, bias).map(TypedKernel::into_kernel)
            }
            Int8Spec::MixedScaledMm { dtype, bias, tile } => {
                mm::int8_mixed_scaled_mm(dtype, bias, tile).map(TypedKernel::into_kernel)
            }
            Int8Spec::MixedScaledMmDx { dtype, tile } => {
                mm::int8_mixed_scaled_mm_dx(dtype, tile).map(TypedKernel::into_kernel)
            }
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
        crate::int8::args::example_args(self, values)
    }
}

/// `(threshold > 0, threshold rounded to dtype)`: the outlier test's two inputs.
#[func]
fn outlier_setup(threshold: Val<f32>, dtype: DType) -> (Val<bool>, Val<f32>) {
    let active = threshold > 0.0f32;
    let rounded = round_to(threshold, dtype);
    (active, rounded)
}

/// `active && |x| >= t` for `ax = |x|`.
#[func]
fn is_outlier(ax: Val<f32>, setup: (Val<bool>, Val<f32>)) -> Val<bool> {
    let (active, t) = setup;
    let ge = ax >= t;
    active & ge
}

/// `(1 / absmax) * 127` in `f32`.
#[func]
fn code_scale(absmax: Val<f32>) -> Val<f32> {
    let inv = 1.0f32 / absmax;
    inv * comptime!(MAX_CODE as f32)
}

/// `clamp(round_half_even(x * scale), -127, 127)` as `i32` (NaN gives 0).
#[func]
fn code_of(x: Val<f32>, scale: Val<f32>) -> Val<i32> {
    let v = x * scale;
    let q = v.to_i32(Rounding::NearestEven);
    let lo = val(comptime!(-MAX_CODE));
    let hi = val(MAX_CODE);
    let q = max(q, lo);
    min(q, hi)
}

fn check(dtype: DType) -> Result<()> {
    check_float_dtype(dtype)
}

/// The kernel of [`int8_outlier_cols`].
#[kernel(name = Int8Spec::OutlierCols { dtype }.name(), grid = cols, signature = Int8OutlierCols)]
pub fn outlier_cols_kernel(
    #[config] dtype: DType,
    rows: u32,
    cols: u32,
    threshold: f32,
    #[shape(rows, cols)]
    #[dtype(dtype)]
    a: In<Float>,
    #[shape(cols)] outlier_flags: Out<u32>,
) {
    let c = work_item();
    let setup = outlier_setup(threshold, dtype);
    let mut flag: u32;
    let rv = rows;
    let cv = cols;
    for r in 0u32..rv {
        let row = r * cv;
        let idx = row + c;
        let x = a[idx];
        let ax = abs(x);
        let out = is_outlier(ax, setup);
        let bit = select(out, 1u32, 0u32);
        flag = flag | bit;
    }
    outlier_flags[c] = flag;
}

/// Builds `int8_outlier_cols_{dtype}`: `outlier_flags[c] = 1` when any element of column `c` is
/// an outlier (see the module docs), else 0.
///
/// # Errors
/// [`Error::Unsupported`] for a non-float dtype.
pub fn int8_outlier_cols(dtype: DType) -> Result<TypedKernel<Int8OutlierCols>> {
    check(dtype)?;
    outlier_cols_kernel(dtype)
}

/// The kernel of [`int8_vectorwise_quant`].
#[kernel(
    name = Int8Spec::VectorwiseQuant { dtype }.name(),
    grid = rows,
    signature = Int8VectorwiseQuant
)]
pub fn vectorwise_quant_kernel(
    #[config] dtype: DType,
    rows: u32,
    cols: u32,
    threshold: f32,
    #[shape(rows, cols)]
    #[dtype(dtype)]
    a: In<Float>,
    #[shape(cols)] outlier_flags: In<u32>,
    #[shape(rows, cols)] ca: Out<i8>,
    #[shape(rows)] row_stats: Out<f32>,
) {
    let r = work_item();
    let setup = outlier_setup(threshold, dtype);
    let cv = cols;
    let base = r * cv;
    let zero = val(0u32);
    let acc = var::<f32>("absmax");
    for c in zero..cv {
        let idx = base + c;
        let x = a[idx];
        let ax = abs(x);
        let out = is_outlier(ax, setup);
        let v = select(out, 0.0f32, ax);
        // torch `max`: a NaN element makes the result NaN, and a NaN result stays NaN.
        let cur = acc;
        let take = (v > cur) | (v != v);
        acc = select(take, v, cur);
    }
    let am = acc;
    row_stats[r] = am;
    let scale = code_scale(am);
    for c in zero..cv {
        let idx = base + c;
        let x = a[idx];
        let ax = abs(x);
        let out = is_outlier(ax, setup);
        let flagged = outlier_flags[c] != 0u32;
        let zeroed = out | flagged;
        let q = code_of(x, scale);
        ca[idx] = select(zeroed, 0i32, q);
    }
}

/// Builds `int8_vectorwise_quant_{dtype}` (bitsandbytes `int8_vectorwise_quant`): row
/// statistics over the non-outlier elements and the codes, outliers and flagged columns coded 0
/// (see the module docs). `outlier_flags` comes from [`int8_outlier_cols`] (all zero for
/// threshold 0).
///
/// # Errors
/// [`Error::Unsupported`] for a non-float dtype.
pub fn int8_vectorwise_quant(dtype: DType) -> Result<TypedKernel<Int8VectorwiseQuant>> {
    check(dtype)?;
    vectorwise_quant_kernel(dtype)
}

/// The kernel of [`quantize_rowwise_int8`].
#[kernel(
    name = Int8Spec::QuantizeRowwise { dtype }.name(),
    grid = rows,
    signature = QuantizeRowwiseInt8
)]
pub fn quantize_rowwise_kernel(
    #[config] dtype: DType,
    rows: u32,
    cols: u32,
    #[shape(rows, cols)]
    #[dtype(dtype)]
    a: In<Float>,
    #[shape(rows, cols)] q: Out<i8>,
    #[shape(rows)] absmax: Out<f32>,
) {
    let r = work_item();
    let cv = cols;
    let base = r * cv;
    let am = reduce_absmax(a, base, cv, NanMode::Propagate);
    absmax[r] = am;
    let scale = code_scale(am);
    for c in 0u32..cv {
        let idx = base + c;
        let x = a[idx];
        q[idx] = code_of(x, scale);
    }
}

/// Builds `quantize_rowwise_int8_{dtype}`: per-row symmetric absmax int8 (the vector-wise codes
/// and statistics with threshold 0, see the module docs), the row absmax from one NaN-propagating
/// [`qforge_ir::Op::Reduce`].
///
/// # Errors
/// [`Error::Unsupported`] for a non-float dtype.
pub fn quantize_rowwise_int8(dtype: DType) -> Result<TypedKernel<QuantizeRowwiseInt8>> {
    check(dtype)?;
    quantize_rowwise_kernel(dtype)
}

/// The kernel of [`int8_vectorwise_dequant`].
#[kernel(
    name = Int8Spec::VectorwiseDequant { dtype }.name(),
    grid = n,
    signature = Int8VectorwiseDequant
)]
pub fn vectorwise_dequant_kernel(
    #[config] dtype: DType,
    rows: u32,
    cols: u32,
    n: u32,
    #[shape(rows, cols)] ca: In<i8>,
    #[shape(rows)] stats: In<f32>,
    #[shape(rows, cols)]
    #[dtype(dtype)]
    out: Out<Float>,
) {
    let i = work_item();
    let rv = rows;
    let cv = cols;
    let (r, inside) = element_row(i, rv, cv);
    if inside {
        let q = ca[i];
        let qf = q.to_f32();
        let s = stats[r];
        let y = qf * s;
        let y = y * DEQUANT_SCALE;
        store_rounded(out, i, y, Rounding::NearestEven);
    }
}

/// Builds `int8_vectorwise_dequant_{dtype}` (bitsandbytes `int8_vectorwise_dequant`, which
/// returns `f32`): `out = (f32(ca) * stats[r]) * f32(1/127)`, rounded once to `dtype`.
///
/// # Errors
/// [`Error::Unsupported`] for a non-float dtype.
pub fn int8_vectorwise_dequant(dtype: DType) -> Result<TypedKernel<Int8VectorwiseDequant>> {
    check(dtype)?;
    vectorwise_dequant_kernel(dtype)
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
            int8_outlier_cols(DType::I8).map(TypedKernel::into_kernel),
            int8_vectorwise_quant(DType::U8).map(TypedKernel::into_kernel),
            int8_vectorwise_dequant(DType::I32).map(TypedKernel::into_kernel),
            quantize_rowwise_int8(DType::U32).map(TypedKernel::into_kernel),
        ] {
            let msg = e.unwrap_err().to_string();
            assert!(msg.contains("not supported"), "{msg}");
        }
    }
}
