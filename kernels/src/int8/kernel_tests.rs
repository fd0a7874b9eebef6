//! The LLM.int8() kernels on the reference interpreter against host models written from the
//! documented semantics (plain Rust `f32`/`i64` arithmetic, no IR): codes, statistics, outlier
//! flags, integer products, both dequantizations, the mixed forward and its input gradient, over
//! edge rows (zero, NaN, inf, tiny, ties), thresholds 0 and > 0, one and several rows, and every
//! tile.

use crate::int8::matmul::MM_DEQUANT_SCALE;
use crate::int8::{self, Int8Spec, DEQUANT_SCALE};
use crate::matmul4::TileConfig;
use crate::test_util::{bytes, floats, round};
use qforge_ir::OwnedArg;
use qforge_ir::{DType, Scalar};

const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

fn rd(v: f32, dtype: DType) -> f32 {
    round(dtype, v)
}

fn bytes_of(dtype: DType, v: &[f32]) -> Vec<u8> {
    bytes(dtype, v)
}

fn floats_of(dtype: DType, b: &[u8]) -> Vec<f32> {
    floats(dtype, b)
}

fn u(v: usize) -> OwnedArg {
    OwnedArg::Scalar(Scalar::U32(v as u32))
}

/// Runs `spec` on the interpreter and returns the arguments after the launch.
fn run(spec: Int8Spec, mut args: Vec<OwnedArg>) -> Vec<OwnedArg> {
    let k = spec.build().unwrap();
    qforge_ir::verify(&k).unwrap_or_else(|e| panic!("{}: {e}", k.name));
    qforge_ir::interp::run(&k, &mut OwnedArg::borrow_all(&mut args))
        .unwrap_or_else(|e| panic!("{}: {e}", k.name));
    args
}

fn out(args: &[OwnedArg], i: usize) -> &[u8] {
    match &args[i] {
        OwnedArg::Write(b) => b,
        other => panic!("argument {i} is not an output: {other:?}"),
    }
}

fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// Deterministic normal-looking values in about [-4, 4].
fn noise(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            ((s >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * 8.0
        })
        .collect()
}

/// A `[rows, cols]` matrix of noise with planted edge rows and outliers.
fn matrix(rows: usize, cols: usize, seed: u32) -> Vec<f32> {
    let mut a = noise(rows * cols, seed);
    a[0] = 8.5;
    if cols > 2 {
        a[(rows - 1) * cols + cols - 1] = 6.0;
        a[cols / 2] = -12.25;
        a[1] = 5.9375;
    }
    if rows >= 6 {
        a[cols..2 * cols].fill(0.0); // zero row
        a[2 * cols + 1 % cols] = f32::NAN; // NaN row
        a[3 * cols] = f32::INFINITY; // inf row (an outlier when threshold > 0)
        for x in &mut a[4 * cols..5 * cols] {
            *x = -0.0;
        }
        a[4 * cols + cols - 1] = 1e-3;
        // Exact .5 ties: absmax 127 makes the scale (1/127)*127, close to 1.
        a[5 * cols] = 127.0;
        for (j, x) in a[5 * cols + 1..6 * cols].iter_mut().enumerate() {
            *x = j as f32 + 0.5;
            if *x >= 127.0 {
                *x = 126.5;
            }
        }
    }
    if rows >= 9 && cols >= 2 {
        // x = absmax / 2: exactly 63.5 in real arithmetic; `(1 / absmax) * 127` lands on 63 or
        // 64 where `127 / absmax` lands on the other (pairs from the golden vectors).
        for (r, (am, x)) in [
            (2.859375f32, 1.4296875f32),
            (5.9375, 2.96875),
            (3.40625, 1.703125),
        ]
        .into_iter()
        .enumerate()
        {
            let row = &mut a[(6 + r) * cols..(7 + r) * cols];
            row.fill(0.25);
            row[0] = am;
            row[1] = x;
        }
    }
    a
}

/// Host model of `int8_vectorwise_quant` (module docs): `(codes, row_stats, flags)`.
fn model_quant(
    a: &[f32],
    rows: usize,
    cols: usize,
    thr: f32,
    dtype: DType,
) -> (Vec<i8>, Vec<f32>, Vec<u32>) {
    let t = rd(thr, dtype);
    let outlier = |x: f32| thr > 0.0 && x.abs() >= t;
    let flags: Vec<u32> = (0..cols)
        .map(|c| u32::from((0..rows).any(|r| outlier(a[r * cols + c]))))
        .collect();
    let mut codes = vec![0i8; rows * cols];
    let mut stats = vec![0f32; rows];
    for r in 0..rows {
        let row = &a[r * cols..(r + 1) * cols];
        let mut m = 0.0f32;
        for &x in row {
            let v = if outlier(x) { 0.0 } else { x.abs() };
            if v.is_nan() || m.is_nan() {
                m = f32::NAN;
            } else if v > m {
                m = v;
            }
        }
        stats[r] = m;
        let scale = (1.0 / m) * 127.0;
        for (c, &x) in row.iter().enumerate() {
            let v = (x * scale).round_ties_even();
            let q = if v.is_nan() {
                0.0
            } else {
                v.clamp(-127.0, 127.0)
            };
            codes[r * cols + c] = if outlier(x) || flags[c] == 1 {
                0
            } else {
                q as i8
            };
        }
    }
    (codes, stats, flags)
}

#[test]
fn library_int8_vectorwise_quant_matches_the_host_model() {
    for dtype in DTYPES {
        for (rows, cols) in [(1, 1), (1, 7), (2, 3), (6, 40), (9, 67)] {
            for thr in [0.0f32, 6.0, 2.5, 1e-30] {
                let a: Vec<f32> = matrix(rows, cols, (rows * 31 + cols) as u32)
                    .into_iter()
                    .map(|x| rd(x, dtype))
                    .collect();
                let (codes, stats, flags) = model_quant(&a, rows, cols, thr, dtype);
                let head = || vec![u(rows), u(cols), OwnedArg::Scalar(Scalar::f32(thr))];
                let mut args = head();
                args.extend([
                    OwnedArg::Read(bytes_of(dtype, &a)),
                    OwnedArg::Write(vec![0; 4 * cols]),
                ]);
                let got = run(Int8Spec::OutlierCols { dtype }, args);
                let got_flags: Vec<u32> = out(&got, 4)
                    .chunks(4)
                    .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                assert_eq!(got_flags, flags, "{dtype} {rows}x{cols} t={thr}: flags");
                let mut args = head();
                args.extend([
                    OwnedArg::Read(bytes_of(dtype, &a)),
                    OwnedArg::Read(flags.iter().flat_map(|f| f.to_le_bytes()).collect()),
                    OwnedArg::Write(vec![0; rows * cols]),
                    OwnedArg::Write(vec![0; 4 * rows]),
                ]);
                let got = run(Int8Spec::VectorwiseQuant { dtype }, args);
                let got_codes: Vec<i8> = out(&got, 5).iter().map(|b| *b as i8).collect();
                assert_eq!(got_codes, codes, "{dtype} {rows}x{cols} t={thr}: codes");
                let got_stats = floats_of(DType::F32, out(&got, 6));
                for (g, w) in got_stats.iter().zip(&stats) {
                    assert!(
                        same(*g, *w),
                        "{dtype} {rows}x{cols} t={thr}: stats {g} vs {w}"
                    );
                }
                if thr == 0.0 {
                    let args = vec![
                        u(rows),
                        u(cols),
                        OwnedArg::Read(bytes_of(dtype, &a)),
                        OwnedArg::Write(vec![0; rows * cols]),
                        OwnedArg::Write(vec![0; 4 * rows]),
                    ];
                    let got = run(Int8Spec::QuantizeRowwise { dtype }, args);
                    let rw: Vec<i8> = out(&got, 3).iter().map(|b| *b as i8).collect();
                    assert_eq!(rw, codes, "{dtype} {rows}x{cols}: rowwise codes");
                    let rs = floats_of(DType::F32, out(&got, 4));
                    assert!(rs.iter().zip(&stats).all(|(g, w)| same(*g, *w)));
                }
            }
        }
    }
}

#[test]
fn library_int8_edge_rows_and_ties() {
    // Rows: zero, NaN, inf, -0 with one tiny value, exact ties, a tiny f32 row whose scale
    // overflows to inf (codes saturate to ±127).
    let cols = 4;
    let a = [
        0.0,
        0.0,
        -0.0,
        0.0, //
        1.0,
        f32::NAN,
        2.0,
        -3.0, //
        1.0,
        f32::INFINITY,
        -2.0,
        0.5, //
        -0.0,
        -0.0,
        1e-3,
        -0.0, //
        127.0,
        0.5,
        1.5,
        -2.5, //
        1e-40,
        -1e-40,
        0.0,
        5e-41, //
    ];
    let rows = a.len() / cols;
    let args = vec![
        u(rows),
        u(cols),
        OwnedArg::Read(bytes_of(DType::F32, &a)),
        OwnedArg::Write(vec![0; rows * cols]),
        OwnedArg::Write(vec![0; 4 * rows]),
    ];
    let got = run(Int8Spec::QuantizeRowwise { dtype: DType::F32 }, args);
    let codes: Vec<i8> = out(&got, 3).iter().map(|b| *b as i8).collect();
    assert_eq!(
        codes,
        [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 127, 0, 127, 0, 2, -2, 127, -127, 0, 127]
    );
}

#[test]
fn library_int8_vectorwise_dequant_matches_the_host_model() {
    let (rows, cols) = (5, 9);
    let codes: Vec<u8> = (0..rows * cols).map(|i| (i * 37 + 11) as u8).collect();
    let stats = [2.5f32, f32::NAN, 0.0, f32::INFINITY, 1e-39];
    for dtype in DTYPES {
        // Extra work items past the matrix must store nothing.
        let args = vec![
            u(rows),
            u(cols),
            u(rows * cols + 3),
            OwnedArg::Read(codes.clone()),
            OwnedArg::Read(bytes_of(DType::F32, &stats)),
            OwnedArg::Write(vec![0; rows * cols * dtype.size_bytes()]),
        ];
        let got = run(Int8Spec::VectorwiseDequant { dtype }, args);
        let y = floats_of(dtype, out(&got, 5));
        for (i, g) in y.iter().enumerate() {
            let want = rd(
                (codes[i] as i8 as f32 * stats[i / cols]) * DEQUANT_SCALE,
                dtype,
            );
            assert!(same(*g, want), "{dtype} [{i}]: {g} vs {want}");
        }
    }
}

const TILES: [TileConfig; 4] = [
    TileConfig { tm: 1, tn: 1 },
    TileConfig { tm: 2, tn: 4 },
    TileConfig { tm: 3, tn: 1 },
    TileConfig { tm: 4, tn: 8 },
];

fn i8s(n: usize, seed: usize) -> Vec<u8> {
    (0..n)
        .map(|i| ((i * 131 + seed * 17) ^ (i >> 3)) as u8)
        .collect()
}

fn tiled(m: usize, n: usize, k: usize, outs: usize, t: TileConfig) -> Vec<OwnedArg> {
    let n_tiles = outs.div_ceil(t.tn as usize);
    vec![
        u(m),
        u(n),
        u(k),
        u(m.div_ceil(t.tm as usize) * n_tiles),
        u(n_tiles),
    ]
}

#[test]
fn library_int8_linear_matmul_is_the_exact_integer_product() {
    for (m, n, k) in [(1, 1, 1), (3, 5, 17), (5, 9, 64)] {
        let (a, b) = (i8s(m * k, 1), i8s(n * k, 2));
        for tile in TILES {
            let mut args = tiled(m, n, k, n, tile);
            args.extend([
                OwnedArg::Read(a.clone()),
                OwnedArg::Read(b.clone()),
                OwnedArg::Write(vec![0; 4 * m * n]),
            ]);
            let got = run(Int8Spec::LinearMatmul { tile }, args);
            let c: Vec<i32> = out(&got, 7)
                .chunks(4)
                .map(|x| i32::from_le_bytes([x[0], x[1], x[2], x[3]]))
                .collect();
            for i in 0..m {
                for j in 0..n {
                    let want: i64 = (0..k)
                        .map(|kk| a[i * k + kk] as i8 as i64 * b[j * k + kk] as i8 as i64)
                        .sum();
                    assert_eq!(c[i * n + j] as i64, want, "{m}x{n}x{k} {tile:?} ({i}, {j})");
                }
            }
        }
    }
    // -128 * -128 * 140000 > 2^31: the sum wraps as i32 arithmetic.
    let k = 140_000;
    let tile = TileConfig { tm: 1, tn: 1 };
    let mut args = tiled(1, 1, k, 1, tile);
    args.extend([
        OwnedArg::Read(vec![0x80; k]),
        OwnedArg::Read(vec![0x80; k]),
        OwnedArg::Write(vec![0; 4]),
    ]);
    let got = run(Int8Spec::LinearMatmul { tile }, args);
    let c = i32::from_le_bytes(out(&got, 7).try_into().unwrap());
    assert_eq!(c, (16384i64 * k as i64) as i32);
}

#[test]
fn library_int8_mm_dequant_matches_the_host_model() {
    let (m, n) = (3, 5);
    let c: Vec<i32> = vec![
        0,
        1,
        -1,
        151586,
        -138760,
        16_777_217,
        i32::MAX,
        i32::MIN,
        79648,
        -5,
        7,
        123456789,
        -3,
        2,
        1 << 25,
    ];
    let rs = [0.75f32, f32::NAN, 3.25];
    let cs = [1.5f32, 0.0, f32::INFINITY, 2.0, 1e-20];
    let bias = [0.25f32, -1.0, 0.0, 3.0, -0.0];
    for dtype in DTYPES {
        for with_bias in [false, true] {
            let mut args = vec![
                u(m),
                u(n),
                u(m * n),
                OwnedArg::Read(c.iter().flat_map(|v| v.to_le_bytes()).collect()),
                OwnedArg::Read(bytes_of(DType::F32, &rs)),
                OwnedArg::Read(bytes_of(DType::F32, &cs)),
            ];
            if with_bias {
                args.push(OwnedArg::Read(bytes_of(dtype, &bias)));
            }
            args.push(OwnedArg::Write(vec![0; m * n * dtype.size_bytes()]));
            let last = args.len() - 1;
            let got = run(
                Int8Spec::MmDequant {
                    dtype,
                    bias: with_bias,
                },
                args,
            );
            let y = floats_of(dtype, out(&got, last));
            for i in 0..m {
                for j in 0..n {
                    let mut v = (c[i * n + j] as f32 * (rs[i] * cs[j])) * MM_DEQUANT_SCALE;
                    if with_bias {
                        v += rd(bias[j], dtype);
                    }
                    let want = rd(v, dtype);
                    assert!(
                        same(y[i * n + j], want),
                        "{dtype} bias={with_bias} ({i},{j})"
                    );
                }
            }
        }
    }
}

/// `sum a_i * b_i` in the `Strided(8)` order of `Stmt::Accumulate`.
fn strided8(terms: impl Iterator<Item = (f32, f32)>) -> f32 {
    let mut p = [-0.0f32; 8];
    for (i, (a, b)) in terms.enumerate() {
        p[i % 8] = a.mul_add(b, p[i % 8]);
    }
    let mut w = 8;
    while w > 1 {
        w /= 2;
        for j in 0..w {
            p[j] += p[j + w];
        }
    }
    p[0]
}

#[test]
fn library_int8_mixed_scaled_mm_matches_the_host_model_for_every_tile() {
    let (m, n, k) = (5, 7, 37);
    for dtype in DTYPES {
        let x: Vec<f32> = matrix(m, k, 3).into_iter().map(|v| rd(v, dtype)).collect();
        let (ca, sca, flags) = model_quant(&x, m, k, 2.0, dtype);
        let cols: Vec<u32> = (0..k as u32).filter(|c| flags[*c as usize] == 1).collect();
        assert!(cols.len() > 2, "the test needs outliers");
        let w: Vec<f32> = noise(n * k, 9)
            .iter()
            .map(|v| rd(v * 0.05, dtype))
            .collect();
        let (cb, scb, _) = model_quant(&w, n, k, 0.0, dtype);
        let bias: Vec<f32> = noise(n, 4).iter().map(|v| rd(v * 0.1, dtype)).collect();
        for with_bias in [false, true] {
            let mut want = vec![0f32; m * n];
            for i in 0..m {
                for j in 0..n {
                    let dot: i64 = (0..k)
                        .map(|c| ca[i * k + c] as i64 * cb[j * k + c] as i64)
                        .sum();
                    let mut t = (dot as f32 * (sca[i] * scb[j])) * MM_DEQUANT_SCALE;
                    if with_bias {
                        t += bias[j];
                    }
                    let t = rd(t, dtype);
                    let fp = strided8(cols.iter().map(|&c| {
                        let c = c as usize;
                        let wv = rd((cb[j * k + c] as f32 * scb[j]) * DEQUANT_SCALE, dtype);
                        (x[i * k + c], wv)
                    }));
                    want[i * n + j] = rd(t + fp, dtype);
                }
            }
            for tile in TILES {
                let mut args = tiled(m, n, k, n, tile);
                args.push(u(cols.len()));
                args.extend([
                    OwnedArg::Read(bytes_of(dtype, &x)),
                    OwnedArg::Read(ca.iter().map(|c| *c as u8).collect()),
                    OwnedArg::Read(cb.iter().map(|c| *c as u8).collect()),
                    OwnedArg::Read(bytes_of(DType::F32, &sca)),
                    OwnedArg::Read(bytes_of(DType::F32, &scb)),
                    OwnedArg::Read(cols.iter().flat_map(|c| c.to_le_bytes()).collect()),
                ]);
                if with_bias {
                    args.push(OwnedArg::Read(bytes_of(dtype, &bias)));
                }
                args.push(OwnedArg::Write(vec![0; m * n * dtype.size_bytes()]));
                let last = args.len() - 1;
                let spec = Int8Spec::MixedScaledMm {
                    dtype,
                    bias: with_bias,
                    tile,
                };
                let got = run(spec, args);
                let y = floats_of(dtype, out(&got, last));
                for (idx, (g, w)) in y.iter().zip(&want).enumerate() {
                    assert!(same(*g, *w), "{} [{idx}]: {g} vs {w}", spec.name());
                }
            }
        }
    }
}

#[test]
fn library_int8_mixed_scaled_mm_dx_matches_the_host_model_for_every_tile() {
    let (m, n, k) = (3, 21, 10);
    for dtype in DTYPES {
        let dy: Vec<f32> = noise(m * n, 5).into_iter().map(|v| rd(v, dtype)).collect();
        let cb = i8s(n * k, 3);
        let scb: Vec<f32> = noise(n, 6).iter().map(|v| v.abs() + 0.01).collect();
        let mut want = vec![0f32; m * k];
        for i in 0..m {
            for kk in 0..k {
                let s = strided8((0..n).map(|nn| {
                    let wv = rd(
                        cb[nn * k + kk] as i8 as f32 * (scb[nn] * DEQUANT_SCALE),
                        dtype,
                    );
                    (dy[i * n + nn], wv)
                }));
                want[i * k + kk] = rd(s, dtype);
            }
        }
        for tile in TILES {
            let mut args = tiled(m, n, k, k, tile);
            args.extend([
                OwnedArg::Read(bytes_of(dtype, &dy)),
                OwnedArg::Read(cb.clone()),
                OwnedArg::Read(bytes_of(DType::F32, &scb)),
                OwnedArg::Write(vec![0; m * k * dtype.size_bytes()]),
            ]);
            let spec = Int8Spec::MixedScaledMmDx { dtype, tile };
            let got = run(spec, args);
            let y = floats_of(dtype, out(&got, 8));
            for (idx, (g, w)) in y.iter().zip(&want).enumerate() {
                assert!(same(*g, *w), "{} [{idx}]: {g} vs {w}", spec.name());
            }
        }
    }
}

#[test]
fn library_int8_specs_name_build_and_reject_bad_tiles() {
    let bad = TileConfig { tm: 0, tn: 4 };
    assert!(Int8Spec::LinearMatmul { tile: bad }.build().is_err());
    assert!(int8::Int8Spec::MixedScaledMmDx {
        dtype: DType::F32,
        tile: bad
    }
    .build()
    .is_err());
    assert!(Int8Spec::MmDequant {
        dtype: DType::U8,
        bias: true
    }
    .build()
    .is_err());
    assert!(Int8Spec::OutlierCols { dtype: DType::F32 }
        .example_args(&[])
        .is_err());
    assert_eq!(
        Int8Spec::MixedScaledMm {
            dtype: DType::F16,
            bias: true,
            tile: TileConfig { tm: 2, tn: 2 }
        }
        .name(),
        "int8_mixed_scaled_mm_f16_bias_t2x2"
    );
}

/// The macro-built kernels are the builder-built ones (same IR, so the same snapshots), for
/// every dtype, bias variant and a range of tiles.
#[test]
fn library_int8_kernels_equal_the_builder_versions() {
    use crate::int8::{matmul as mm, reference};
    use crate::FLOAT_DTYPES;
    let same = |new: qforge_ir::Kernel, old: qforge_ir::Kernel, what: &str| {
        assert!(new == old, "{what} differs from the builder version");
    };
    let tiles =
        [(1, 1), (1, 4), (2, 2), (4, 1), (3, 5), (4, 4)].map(|(tm, tn)| TileConfig { tm, tn });
    for dtype in FLOAT_DTYPES {
        same(
            int8::int8_outlier_cols(dtype).unwrap().into_kernel(),
            reference::int8_outlier_cols(dtype).unwrap(),
            "outlier_cols",
        );
        same(
            int8::int8_vectorwise_quant(dtype).unwrap().into_kernel(),
            reference::int8_vectorwise_quant(dtype).unwrap(),
            "vectorwise_quant",
        );
        same(
            int8::quantize_rowwise_int8(dtype).unwrap().into_kernel(),
            reference::quantize_rowwise_int8(dtype).unwrap(),
            "quantize_rowwise",
        );
        same(
            int8::int8_vectorwise_dequant(dtype).unwrap().into_kernel(),
            reference::int8_vectorwise_dequant(dtype).unwrap(),
            "vectorwise_dequant",
        );
        for bias in [false, true] {
            same(
                mm::int8_mm_dequant(dtype, bias).unwrap().into_kernel(),
                reference::int8_mm_dequant(dtype, bias).unwrap(),
                "mm_dequant",
            );
            for tile in tiles {
                same(
                    mm::int8_mixed_scaled_mm(dtype, bias, tile)
                        .unwrap()
                        .into_kernel(),
                    reference::int8_mixed_scaled_mm(dtype, bias, tile).unwrap(),
                    "mixed_scaled_mm",
                );
            }
        }
        for tile in tiles {
            same(
                mm::int8_mixed_scaled_mm_dx(dtype, tile)
                    .unwrap()
                    .into_kernel(),
                reference::int8_mixed_scaled_mm_dx(dtype, tile).unwrap(),
                "mixed_scaled_mm_dx",
            );
        }
    }
    for tile in tiles {
        same(
            mm::int8_linear_matmul(tile).unwrap().into_kernel(),
            reference::int8_linear_matmul(tile).unwrap(),
            "linear_matmul",
        );
    }
}
