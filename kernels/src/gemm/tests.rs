//! The dense products on the interpreter against a plain Rust model written from the module
//! docs (`mul_add` in increasing `l` from `-0.0`, bias, one rounding), at every layout,
//! dtype and tile (tiles never change a bit), and the adapter identities (`dX`, `dW`, `db` from
//! the same kernel) against f64 sums.

use crate::gemm::host::packed;
use crate::gemm::{Gemm, Layout};
use crate::matmul4::TileConfig;
use crate::test_util::{bytes, floats, out, round, run};
use qforge_ir::OwnedArg;
use qforge_ir::{DType, Scalar};

/// xorshift values in [-2, 2) with a few edge values, rounded to `dtype`.
fn data(dtype: DType, len: usize, seed: u32) -> Vec<f32> {
    let mut s = seed | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            let v = match s % 29 {
                0 => -0.0,
                1 => f32::from_bits(s >> 10),
                _ => (s >> 8) as f32 / (1u32 << 22) as f32 - 2.0,
            };
            round(dtype, v)
        })
        .collect()
}

/// Element `(r, l)` of a logical `[rows, L]` operand stored with `layout` (panels are given
/// row-major here: `launch` packs them).
fn at(v: &[f32], layout: Layout, rows: usize, l_len: usize, r: usize, l: usize) -> f32 {
    match layout {
        Layout::RowMajor | Layout::Panels => v[r * l_len + l],
        Layout::Transposed => v[l * rows + r],
    }
}

/// The documented sum for output `(i, j)`.
fn model(
    g: &Gemm,
    (a, b, bias, res): (&[f32], &[f32], &[f32], &[f32]),
    (m, n, l): (usize, usize, usize),
) -> Vec<u32> {
    let mut c = Vec::with_capacity(m * n);
    for i in 0..m {
        for j in 0..n {
            let mut p = -0.0f32;
            for k in 0..l {
                p = at(a, g.a, m, l, i, k).mul_add(at(b, g.b, n, l, j, k), p);
            }
            let mut s = if g.bias { p + bias[j] } else { p };
            if g.residual {
                s += res[i * n + j];
            }
            c.push(round(g.dtype, s).to_bits());
        }
    }
    c
}

/// Runs `g` on the interpreter with `group` row tiles per group of work items.
fn launch(
    g: &Gemm,
    (a, b, bias, res): (&[f32], &[f32], &[f32], &[f32]),
    (m, n, l): (usize, usize, usize),
    group: u32,
) -> Vec<u32> {
    let kernel = g.build().unwrap();
    let tn = g.tile.tn as usize;
    let (m_tiles, n_tiles) = (m.div_ceil(g.tile.tm as usize), n.div_ceil(tn));
    let u32_arg = |v: usize| OwnedArg::Scalar(Scalar::U32(v as u32));
    let mut args = vec![
        u32_arg(m),
        u32_arg(n),
        u32_arg(l),
        u32_arg(m_tiles * n_tiles),
        u32_arg(m_tiles),
        u32_arg(n_tiles),
        OwnedArg::Scalar(Scalar::U32(group)),
    ];
    let mut b = bytes(g.dtype, b);
    if g.b == Layout::Panels {
        args.push(u32_arg(l * tn));
        b = packed(&b, g.dtype, Layout::RowMajor, (n, l), tn, 1);
    }
    args.extend([OwnedArg::Read(bytes(g.dtype, a)), OwnedArg::Read(b)]);
    if g.bias {
        args.push(OwnedArg::Read(bytes(g.dtype, bias)));
    }
    if g.residual {
        args.push(OwnedArg::Read(bytes(g.dtype, res)));
    }
    args.push(OwnedArg::Write(vec![0xA5; m * n * g.dtype.size_bytes()]));
    run(&kernel, &mut args);
    let last = args.len() - 1;
    floats(g.dtype, out(&args, last))
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

/// Every layout pair (`B` also in panels), dtype, bias and residual, at tiles and groups of
/// row tiles that never change a bit.
#[test]
fn every_layout_dtype_and_tile_matches_the_model() {
    let layouts = [Layout::RowMajor, Layout::Transposed];
    for (la, lb) in layouts.iter().flat_map(|a| {
        [Layout::RowMajor, Layout::Transposed, Layout::Panels]
            .into_iter()
            .map(move |b| (*a, b))
    }) {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            for (m, n, l) in [
                (1usize, 1usize, 1usize),
                (3, 5, 19),
                (7, 2, 64),
                (2, 9, 0),
                // Several groups (the last one partial) of several output tiles.
                (7, 9, 5),
            ] {
                let (a, b, bias, res) = (
                    data(dtype, m * l, 3),
                    data(dtype, n * l, 5),
                    data(dtype, n, 7),
                    data(dtype, m * n, 9),
                );
                for (bias_on, res_on) in
                    [(false, false), (true, false), (false, true), (true, true)]
                {
                    let mut want = None;
                    for (tm, tn, group) in [
                        (1u32, 1u32, 1u32),
                        (2, 3, 2),
                        (4, 4, 0),
                        (1, 8, 3),
                        (2, 2, 9),
                    ] {
                        let g = Gemm {
                            a: la,
                            b: lb,
                            dtype,
                            bias: bias_on,
                            residual: res_on,
                            partials: 1,
                            tile: TileConfig { tm, tn },
                        };
                        let ops = (&a[..], &b[..], &bias[..], &res[..]);
                        let got = launch(&g, ops, (m, n, l), group);
                        let w = want.get_or_insert_with(|| model(&g, ops, (m, n, l)));
                        assert_eq!(&got, w, "{} at {m}x{n}x{l}", g.name());
                    }
                }
            }
        }
    }
}

/// `strided W` of the logical operands (`W = g.partials`): partial `l % W` fused in increasing
/// `l` from `-0.0`, the halving tree, then the bias and the residual (`docs/semantics.md`).
fn strided_model(
    g: &Gemm,
    (a, b, bias, res): (&[f32], &[f32], &[f32], &[f32]),
    (m, n, l): (usize, usize, usize),
) -> Vec<u32> {
    let w = g.partials as usize;
    let mut c = Vec::with_capacity(m * n);
    for i in 0..m {
        for j in 0..n {
            let mut p = vec![-0.0f32; w];
            for k in 0..l {
                p[k % w] = a[i * l + k].mul_add(b[j * l + k], p[k % w]);
            }
            while p.len() > 1 {
                let half = p.len() / 2;
                p = (0..half).map(|q| p[q] + p[q + half]).collect();
            }
            let mut s = if g.bias { p[0] + bias[j] } else { p[0] };
            if g.residual {
                s += res[i * n + j];
            }
            c.push(round(g.dtype, s).to_bits());
        }
    }
    c
}

/// Partial-major operands ([`Gemm::partials`]): `A` row-major and `B` row-major or in panels,
/// each row's columns stored partial-major, give `strided W` of the logical operands at every
/// tile, dtype, bias and residual, for `W` = 2, 4 and 16 (the 4-bit forward's), `L` = 0 (every
/// output `-0.0`, or the bias) and `L` of one and of several elements per partial; a
/// transposed operand and a partial count that is not a power of two up to 16 are refused.
#[test]
fn partial_major_operands_give_the_strided_order() {
    let partial_major = |v: &[f32], rows: usize, l: usize, w: usize| -> Vec<f32> {
        let mut out = vec![0.0; v.len()];
        for r in 0..rows {
            for c in 0..l {
                out[r * l + (c % w) * (l / w) + c / w] = v[r * l + c];
            }
        }
        out
    };
    for lb in [Layout::RowMajor, Layout::Panels] {
        for dtype in [DType::F32, DType::BF16] {
            for (w, m, n, l) in [(16, 3, 5, 48), (16, 7, 9, 16), (4, 5, 3, 12), (2, 2, 2, 0)] {
                let (a, b, bias, res) = (
                    data(dtype, m * l, 3),
                    data(dtype, n * l, 5),
                    data(dtype, n, 7),
                    data(dtype, m * n, 9),
                );
                let (ap, bp) = (partial_major(&a, m, l, w), partial_major(&b, n, l, w));
                for (bias_on, res_on) in [(false, false), (true, true)] {
                    for (tm, tn, group) in [(1u32, 1u32, 1u32), (2, 4, 2), (3, 8, 0)] {
                        let g = Gemm {
                            a: Layout::RowMajor,
                            b: lb,
                            dtype,
                            bias: bias_on,
                            residual: res_on,
                            partials: w as u32,
                            tile: TileConfig { tm, tn },
                        };
                        let got = launch(&g, (&ap, &bp, &bias, &res), (m, n, l), group);
                        let want = strided_model(&g, (&a, &b, &bias, &res), (m, n, l));
                        assert_eq!(got, want, "{} at {m}x{n}x{l}", g.name());
                    }
                }
            }
        }
    }
    let refused = |a, b, partials| {
        let g = Gemm {
            a,
            b,
            dtype: DType::F32,
            bias: false,
            residual: false,
            partials,
            tile: TileConfig { tm: 1, tn: 1 },
        };
        g.build().is_err()
    };
    assert!(refused(Layout::Transposed, Layout::Panels, 16));
    assert!(refused(Layout::RowMajor, Layout::Transposed, 2));
    assert!(refused(Layout::RowMajor, Layout::Panels, 3));
    assert!(refused(Layout::RowMajor, Layout::Panels, 32));
    assert!(refused(Layout::RowMajor, Layout::Panels, 0));
    assert!(!refused(Layout::RowMajor, Layout::Panels, 16));
}

#[test]
fn linear_layer_gradients_from_one_kernel_match_f64() {
    // y = x @ W.T + b with x [M, K], W [N, K]; dX = dY @ W, dW = dY.T @ x, db = sum_m dY.
    let (m, k, n) = (5usize, 13usize, 6usize);
    let x = data(DType::F32, m * k, 11);
    let w = data(DType::F32, n * k, 13);
    let dy = data(DType::F32, m * n, 17);
    let tile = TileConfig { tm: 2, tn: 2 };
    let gemm = |a, b| Gemm {
        a,
        b,
        dtype: DType::F32,
        bias: false,
        residual: false,
        partials: 1,
        tile,
    };
    let f = |v: u32| f32::from_bits(v) as f64;
    let close = |got: &[u32], want: &[f64], what: &str| {
        for (g, w) in got.iter().zip(want) {
            assert!(
                (f(*g) - w).abs() <= 1e-5 * (1.0 + w.abs()),
                "{what}: {} vs {w}",
                f(*g)
            );
        }
    };
    let dx = launch(
        &gemm(Layout::RowMajor, Layout::Transposed),
        (&dy, &w, &[], &[]),
        (m, k, n),
        1,
    );
    let want: Vec<f64> = (0..m * k)
        .map(|e| {
            (0..n)
                .map(|j| dy[(e / k) * n + j] as f64 * w[j * k + e % k] as f64)
                .sum()
        })
        .collect();
    close(&dx, &want, "dX");
    let dw = launch(
        &gemm(Layout::Transposed, Layout::Transposed),
        (&dy, &x, &[], &[]),
        (n, k, m),
        1,
    );
    let want: Vec<f64> = (0..n * k)
        .map(|e| {
            (0..m)
                .map(|i| dy[i * n + e / k] as f64 * x[i * k + e % k] as f64)
                .sum()
        })
        .collect();
    close(&dw, &want, "dW");
    let ones = vec![1.0f32; m];
    let db = launch(
        &gemm(Layout::RowMajor, Layout::Transposed),
        (&ones, &dy, &[], &[]),
        (1, n, m),
        1,
    );
    let want: Vec<f64> = (0..n)
        .map(|j| (0..m).map(|i| dy[i * n + j] as f64).sum())
        .collect();
    close(&db, &want, "db");
}

/// `A` cannot be stored in panels, and bad dtypes and tiles are refused by name.
#[test]
fn bad_specs_are_refused() {
    use Layout::{Panels as P, RowMajor as N};
    let spec = |a, dtype, tm| Gemm {
        a,
        b: N,
        dtype,
        bias: false,
        residual: false,
        partials: 1,
        tile: TileConfig { tm, tn: 1 },
    };
    let e = spec_error(spec_build(&spec(P, DType::F32, 1)));
    assert!(e.contains("A cannot be stored in panels"), "{e}");
    let e = spec_error(spec_build(&spec(N, DType::I32, 1)));
    assert!(e.contains("i32"), "{e}");
    spec_error(spec_build(&spec(N, DType::F32, 0)));
}

fn spec_build(spec: &Gemm) -> qforge_ir::Result<()> {
    spec.build().map(|_| ())
}

fn spec_error(r: qforge_ir::Result<()>) -> String {
    r.expect_err("must be rejected").to_string()
}
