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
//! pseudo-random ones, never empty.

use crate::catalog::{float_bytes, mix, u32_arg};
use crate::int8::Int8Spec;
use crate::matmul4::TileConfig;
use qforge_ir::OwnedArg;
use qforge_ir::{DType, Scalar};

/// `count` values cycling through `values`, shifted by `shift` and by one more per full cycle.
fn cycle(values: &[f32], count: usize, shift: usize) -> Vec<f32> {
    let len = values.len();
    (0..count)
        .map(|i| values[(i + i / len + shift) % len])
        .collect()
}

/// `count` pseudo-random bytes (i8 codes, all 256 values possible).
fn codes(values: &[f32], count: usize, salt: usize) -> Vec<u8> {
    let len = values.len();
    (0..count)
        .map(|i| mix(i + salt, values[(i + salt) % len]) as u8)
        .collect()
}

fn f32_arg(v: f32) -> OwnedArg {
    OwnedArg::Scalar(Scalar::f32(v))
}

fn threshold_for(n: usize) -> f32 {
    if n.is_multiple_of(3) {
        0.0
    } else {
        2.0
    }
}

/// The scalars `(m, n, k, n_items, n_tiles)` of a tiled matmul whose outputs are `m x outs`.
fn tiled(m: usize, n: usize, k: usize, outs: usize, tile: TileConfig) -> Vec<OwnedArg> {
    let n_tiles = outs.div_ceil(tile.tn as usize);
    let n_items = m.div_ceil(tile.tm as usize) * n_tiles;
    vec![
        u32_arg(m),
        u32_arg(n),
        u32_arg(k),
        u32_arg(n_items),
        u32_arg(n_tiles),
    ]
}

/// See the module docs. `values` is not empty.
pub(crate) fn example_args(spec: &Int8Spec, values: &[f32]) -> Vec<OwnedArg> {
    let len = values.len();
    let rows = 2 + len % 3;
    let outs = 3 + len % 5;
    match *spec {
        Int8Spec::OutlierCols { dtype }
        | Int8Spec::VectorwiseQuant { dtype }
        | Int8Spec::QuantizeRowwise { dtype } => {
            let cols = len;
            let a = cycle(values, rows * cols, 0);
            let a_bytes = OwnedArg::Read(float_bytes(dtype, &a));
            let thr = threshold_for(len);
            match spec {
                Int8Spec::OutlierCols { .. } => vec![
                    u32_arg(rows),
                    u32_arg(cols),
                    f32_arg(thr),
                    a_bytes,
                    OwnedArg::Write(vec![0; 4 * cols]),
                ],
                Int8Spec::VectorwiseQuant { .. } => {
                    // Columns holding an outlier, plus some that do not (flags are an input).
                    let flags: Vec<u8> = (0..cols)
                        .map(|c| {
                            let hit = thr > 0.0 && (0..rows).any(|r| a[r * cols + c].abs() >= thr);
                            u32::from(hit || mix(c, a[c]).is_multiple_of(5))
                        })
                        .flat_map(u32::to_le_bytes)
                        .collect();
                    vec![
                        u32_arg(rows),
                        u32_arg(cols),
                        f32_arg(thr),
                        a_bytes,
                        OwnedArg::Read(flags),
                        OwnedArg::Write(vec![0; rows * cols]),
                        OwnedArg::Write(vec![0; 4 * rows]),
                    ]
                }
                _ => vec![
                    u32_arg(rows),
                    u32_arg(cols),
                    a_bytes,
                    OwnedArg::Write(vec![0; rows * cols]),
                    OwnedArg::Write(vec![0; 4 * rows]),
                ],
            }
        }
        Int8Spec::VectorwiseDequant { dtype } => {
            let cols = len;
            vec![
                u32_arg(rows),
                u32_arg(cols),
                u32_arg(rows * cols),
                OwnedArg::Read(codes(values, rows * cols, 0)),
                OwnedArg::Read(float_bytes(DType::F32, &cycle(values, rows, 1))),
                OwnedArg::Write(vec![0; rows * cols * dtype.size_bytes()]),
            ]
        }
        Int8Spec::LinearMatmul { tile } => {
            let k = len;
            let mut args = tiled(rows, outs, k, outs, tile);
            args.extend([
                OwnedArg::Read(codes(values, rows * k, 0)),
                OwnedArg::Read(codes(values, outs * k, 7)),
                OwnedArg::Write(vec![0; 4 * rows * outs]),
            ]);
            args
        }
        Int8Spec::MmDequant { dtype, bias } => {
            let cols = len;
            let c: Vec<u8> = (0..rows * cols)
                .flat_map(|i| mix(i, values[i % len]).to_le_bytes())
                .collect();
            let mut args = vec![
                u32_arg(rows),
                u32_arg(cols),
                u32_arg(rows * cols),
                OwnedArg::Read(c),
                OwnedArg::Read(float_bytes(DType::F32, &cycle(values, rows, 1))),
                OwnedArg::Read(float_bytes(DType::F32, &cycle(values, cols, 2))),
            ];
            if bias {
                args.push(OwnedArg::Read(float_bytes(dtype, &cycle(values, cols, 3))));
            }
            args.push(OwnedArg::Write(vec![0; rows * cols * dtype.size_bytes()]));
            args
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
            let abs = |v: Vec<f32>| -> Vec<f32> { v.iter().map(|x| x.abs()).collect() };
            let mut args = tiled(rows, outs, k, outs, tile);
            args.push(u32_arg(cols.len()));
            args.extend([
                OwnedArg::Read(float_bytes(dtype, &x)),
                OwnedArg::Read(codes(values, rows * k, 0)),
                OwnedArg::Read(codes(values, outs * k, 7)),
                OwnedArg::Read(float_bytes(DType::F32, &abs(cycle(values, rows, 1)))),
                OwnedArg::Read(float_bytes(DType::F32, &abs(cycle(values, outs, 2)))),
                OwnedArg::Read(cols.iter().flat_map(|c| c.to_le_bytes()).collect()),
            ]);
            if bias {
                args.push(OwnedArg::Read(float_bytes(dtype, &cycle(values, outs, 3))));
            }
            args.push(OwnedArg::Write(vec![0; rows * outs * dtype.size_bytes()]));
            args
        }
        Int8Spec::MixedScaledMmDx { dtype, tile } => {
            let (n, k) = (len, outs);
            let mut args = tiled(rows, n, k, k, tile);
            args.extend([
                OwnedArg::Read(float_bytes(dtype, &cycle(values, rows * n, 0))),
                OwnedArg::Read(codes(values, n * k, 7)),
                OwnedArg::Read(float_bytes(DType::F32, &cycle(values, n, 1))),
                OwnedArg::Write(vec![0; rows * k * dtype.size_bytes()]),
            ]);
            args
        }
    }
}
