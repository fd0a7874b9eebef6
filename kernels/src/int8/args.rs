//! Example launch arguments of the LLM.int8() kernels ([`Int8Spec::example_args`]), for the
//! conformance suite and `qforge check`.
//!
//! With `n = values.len()`: quantized matrices are `[2 + n % 3, n]` (always more than one row);
//! matmuls reduce over `K = n` (forward) or `N = n` (input gradient) with `M = 2 + n % 3`
//! activation rows and `3 + n % 5` outputs per row. Float inputs cycle through `values` (so NaN,
//! inf, zero and huge values reach the kernels), codes and integer products are mixed from the
//! values' bits, statistics are `|values|` or `values` cycled. The outlier threshold is 0 when
//! `n % 3 == 0` and 2.0 otherwise (about a third of normal-looking values are outliers); the
//! outlier column list of the mixed forward holds the columns with an element `|x| >= 2` plus
//! pseudo-random ones, never empty. The lists come from each kernel's named arguments
//! (`<Name>Args`), so they are checked against its signature as a launch is.

use crate::catalog::{float_bytes, mix};
use crate::int8::matmul::{
    self as mm, Int8LinearMatmulArgs, Int8MixedScaledMmArgs, Int8MixedScaledMmDxArgs,
    Int8MmDequantArgs,
};
use crate::int8::{
    self, Int8OutlierColsArgs, Int8Spec, Int8VectorwiseDequantArgs, Int8VectorwiseQuantArgs,
    QuantizeRowwiseInt8Args,
};
use crate::matmul4::TileConfig;
use qforge_ir::dsl::{FloatIn, FloatOut, Signature, TypedKernel};
use qforge_ir::DType;
use qforge_ir::OwnedArg;
use qforge_ir::Result;

/// `count` values cycling through `values`, shifted by `shift` and by one more per full cycle.
fn cycle(values: &[f32], count: usize, shift: usize) -> Vec<f32> {
    let len = values.len();
    (0..count)
        .map(|i| values[(i + i / len + shift) % len])
        .collect()
}

/// `count` pseudo-random i8 codes (all 256 values possible).
fn codes(values: &[f32], count: usize, salt: usize) -> Vec<i8> {
    let len = values.len();
    (0..count)
        .map(|i| mix(i + salt, values[(i + salt) % len]) as u8 as i8)
        .collect()
}

fn threshold_for(n: usize) -> f32 {
    if n.is_multiple_of(3) {
        0.0
    } else {
        2.0
    }
}

/// `(n_items, n_tiles)` of a tiled matmul whose outputs are `m x outs`.
fn tiled(m: usize, outs: usize, tile: TileConfig) -> (u32, u32) {
    let n_tiles = outs.div_ceil(tile.tn as usize);
    let n_items = m.div_ceil(tile.tm as usize) * n_tiles;
    (n_items as u32, n_tiles as u32)
}

/// The owned launch arguments of `kernel` from its named ones (checked by name, type and
/// shape, as a launch checks them).
fn owned<S: Signature>(kernel: &TypedKernel<S>, args: &mut S::Args<'_>) -> Result<Vec<OwnedArg>> {
    Ok(OwnedArg::copy_all(&kernel.args(args)?))
}

/// `bytes` of `dtype` as a float input.
fn float_in(dtype: DType, bytes: &[u8]) -> FloatIn<'_> {
    FloatIn { dtype, bytes }
}

/// A zeroed float output of `count` elements of `dtype`.
fn zeros(dtype: DType, count: usize) -> Vec<u8> {
    vec![0; count * dtype.size_bytes()]
}

/// See the module docs. `values` is not empty.
///
/// # Errors
/// A kernel that does not build (an invalid spec).
pub(crate) fn example_args(spec: &Int8Spec, values: &[f32]) -> Result<Vec<OwnedArg>> {
    let len = values.len();
    let rows = 2 + len % 3;
    let outs = 3 + len % 5;
    let abs = |v: Vec<f32>| -> Vec<f32> { v.iter().map(|x| x.abs()).collect() };
    Ok(match *spec {
        Int8Spec::OutlierCols { dtype }
        | Int8Spec::VectorwiseQuant { dtype }
        | Int8Spec::QuantizeRowwise { dtype } => {
            let cols = len;
            let a = cycle(values, rows * cols, 0);
            let a_bytes = float_bytes(dtype, &a);
            let threshold = threshold_for(len);
            let (r, c) = (rows as u32, cols as u32);
            match spec {
                Int8Spec::OutlierCols { .. } => owned(
                    &int8::int8_outlier_cols(dtype)?,
                    &mut Int8OutlierColsArgs {
                        rows: r,
                        cols: c,
                        threshold,
                        a: float_in(dtype, &a_bytes),
                        outlier_flags: &mut vec![0; cols],
                    },
                )?,
                Int8Spec::VectorwiseQuant { .. } => {
                    // Columns holding an outlier, plus some that do not (flags are an input).
                    let flags: Vec<u32> = (0..cols)
                        .map(|c| {
                            let hit = threshold > 0.0
                                && (0..rows).any(|r| a[r * cols + c].abs() >= threshold);
                            u32::from(hit || mix(c, a[c]).is_multiple_of(5))
                        })
                        .collect();
                    owned(
                        &int8::int8_vectorwise_quant(dtype)?,
                        &mut Int8VectorwiseQuantArgs {
                            rows: r,
                            cols: c,
                            threshold,
                            a: float_in(dtype, &a_bytes),
                            outlier_flags: &flags,
                            ca: &mut vec![0; rows * cols],
                            row_stats: &mut vec![0.0; rows],
                        },
                    )?
                }
                _ => owned(
                    &int8::quantize_rowwise_int8(dtype)?,
                    &mut QuantizeRowwiseInt8Args {
                        rows: r,
                        cols: c,
                        a: float_in(dtype, &a_bytes),
                        q: &mut vec![0; rows * cols],
                        absmax: &mut vec![0.0; rows],
                    },
                )?,
            }
        }
        Int8Spec::VectorwiseDequant { dtype } => {
            let cols = len;
            owned(
                &int8::int8_vectorwise_dequant(dtype)?,
                &mut Int8VectorwiseDequantArgs {
                    rows: rows as u32,
                    cols: cols as u32,
                    n: (rows * cols) as u32,
                    ca: &codes(values, rows * cols, 0),
                    stats: &cycle(values, rows, 1),
                    out: FloatOut {
                        dtype,
                        bytes: &mut zeros(dtype, rows * cols),
                    },
                },
            )?
        }
        Int8Spec::LinearMatmul { tile } => {
            let k = len;
            let (n_items, n_tiles) = tiled(rows, outs, tile);
            owned(
                &mm::int8_linear_matmul(tile)?,
                &mut Int8LinearMatmulArgs {
                    m: rows as u32,
                    n: outs as u32,
                    k: k as u32,
                    n_items,
                    n_tiles,
                    a: &codes(values, rows * k, 0),
                    b: &codes(values, outs * k, 7),
                    c: &mut vec![0; rows * outs],
                },
            )?
        }
        Int8Spec::MmDequant { dtype, bias } => {
            let cols = len;
            let c: Vec<i32> = (0..rows * cols)
                .map(|i| mix(i, values[i % len]) as i32)
                .collect();
            let bias_bytes = bias.then(|| float_bytes(dtype, &cycle(values, cols, 3)));
            owned(
                &mm::int8_mm_dequant(dtype, bias)?,
                &mut Int8MmDequantArgs {
                    m: rows as u32,
                    n: cols as u32,
                    len: (rows * cols) as u32,
                    c: &c,
                    row_stats: &cycle(values, rows, 1),
                    col_stats: &cycle(values, cols, 2),
                    bias: bias_bytes.as_deref().map(|b| float_in(dtype, b)),
                    out: FloatOut {
                        dtype,
                        bytes: &mut zeros(dtype, rows * cols),
                    },
                },
            )?
        }
        Int8Spec::MixedScaledMm { dtype, bias, tile } => {
            let k = len;
            let x = cycle(values, rows * k, 0);
            let cols: Vec<u32> = (0..k)
                .filter(|&c| {
                    (0..rows).any(|r| x[r * k + c].abs() >= 2.0) || mix(c, x[c]).is_multiple_of(7)
                })
                .map(|c| c as u32)
                .collect();
            let cols = if cols.is_empty() {
                vec![(k - 1) as u32]
            } else {
                cols
            };
            let (n_items, n_tiles) = tiled(rows, outs, tile);
            let x_bytes = float_bytes(dtype, &x);
            let bias_bytes = bias.then(|| float_bytes(dtype, &cycle(values, outs, 3)));
            owned(
                &mm::int8_mixed_scaled_mm(dtype, bias, tile)?,
                &mut Int8MixedScaledMmArgs {
                    m: rows as u32,
                    n: outs as u32,
                    k: k as u32,
                    n_items,
                    n_tiles,
                    n_outliers: cols.len() as u32,
                    x: float_in(dtype, &x_bytes),
                    ca: &codes(values, rows * k, 0),
                    cb: &codes(values, outs * k, 7),
                    sca: &abs(cycle(values, rows, 1)),
                    scb: &abs(cycle(values, outs, 2)),
                    outlier_cols: &cols,
                    bias: bias_bytes.as_deref().map(|b| float_in(dtype, b)),
                    y: FloatOut {
                        dtype,
                        bytes: &mut zeros(dtype, rows * outs),
                    },
                },
            )?
        }
        Int8Spec::MixedScaledMmDx { dtype, tile } => {
            let (n, k) = (len, outs);
            let (n_items, n_tiles) = tiled(rows, k, tile);
            let dy = float_bytes(dtype, &cycle(values, rows * n, 0));
            owned(
                &mm::int8_mixed_scaled_mm_dx(dtype, tile)?,
                &mut Int8MixedScaledMmDxArgs {
                    m: rows as u32,
                    n: n as u32,
                    k: k as u32,
                    n_items,
                    n_tiles,
                    dy: float_in(dtype, &dy),
                    cb: &codes(values, n * k, 7),
                    scb: &cycle(values, n, 1),
                    dx: FloatOut {
                        dtype,
                        bytes: &mut zeros(dtype, rows * k),
                    },
                },
            )?
        }
    })
}
