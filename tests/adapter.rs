//! Bottleneck adapters: the exact merge of a linear (`beta = 0`) adapter into a real MiniLM
//! layer against f64, the shard-aware merge against the unsharded one, bad inputs, gradients
//! against f64 finite differences, and a proptest of the forward and backward passes on every
//! device against the interpreter, bit for bit, with extreme inputs.

mod merge_support;

use std::path::Path;

use proptest::prelude::*;
use qforge::ir::DType;
use qforge::kernels::activation::Act;
use qforge::kernels::adapter::{normal_f32, BottleneckAdapter};
use qforge::kernels::ops::{gemm, Layout};
use qforge::runtime::{CpuDevice, HostTensor};
use safetensors::SafeTensors;

/// `encoder.layer.0.output.dense` of MiniLM (`W: [384, 1536]`, `b: [384]`), or a random layer
/// of that shape when the checkpoint is missing outside CI.
fn layer() -> (HostTensor, HostTensor) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/models/all-MiniLM-L6-v2/model.safetensors");
    let f32s = |b: &[u8]| -> Vec<f32> {
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    let (w, b) = match std::fs::read(&path) {
        Ok(bytes) => {
            let st = SafeTensors::deserialize(&bytes).unwrap();
            let get = |n: &str| f32s(st.tensor(n).unwrap().data());
            (
                get("encoder.layer.0.output.dense.weight"),
                get("encoder.layer.0.output.dense.bias"),
            )
        }
        Err(e) => {
            qforge_testkit::unavailable(
                "models",
                format!("{} ({e}): a random layer instead", path.display()),
            );
            (normal_f32(384 * 1536, 0.05, 1), normal_f32(384, 0.05, 2))
        }
    };
    (
        HostTensor::from_f32_as(DType::F32, vec![384, 1536], &w).unwrap(),
        HostTensor::from_f32_as(DType::F32, vec![384], &b).unwrap(),
    )
}

/// A trained-looking adapter: every weight and bias random (a fresh one has `up = 0`).
fn adapter(d: usize, r: usize) -> BottleneckAdapter {
    let t = |shape: Vec<usize>, seed| {
        let n = shape.iter().product();
        HostTensor::from_f32_as(DType::F32, shape, &normal_f32(n, 0.05, seed)).unwrap()
    };
    BottleneckAdapter {
        down_weight: t(vec![r, d], 11),
        down_bias: t(vec![r], 12),
        up_weight: t(vec![d, r], 13),
        up_bias: t(vec![d], 14),
    }
}

/// The exact merged weight `W + U (D W)` and bias `b + U (D b + b_d) + b_u` in f64, with an
/// error bound per weight for an `f32` evaluation: `(d + r + 2) eps` times the sum of the
/// magnitudes of every term (each product's sum has at most `d + r + 2` roundings on the way).
fn reference(
    w: &HostTensor,
    b: &HostTensor,
    a: &BottleneckAdapter,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let f =
        |t: &HostTensor| -> Vec<f64> { t.to_f32().unwrap().iter().map(|x| *x as f64).collect() };
    let (wf, bf, df, dbf, uf, ubf) = (
        f(w),
        f(b),
        f(&a.down_weight),
        f(&a.down_bias),
        f(&a.up_weight),
        f(&a.up_bias),
    );
    let (d, k) = (w.shape[0], w.shape[1]);
    let r = a.down_bias.shape[0];
    let mut dw = vec![0.0f64; r * k];
    let mut dw_abs = vec![0.0f64; r * k];
    for q in 0..r {
        for l in 0..d {
            for j in 0..k {
                dw[q * k + j] += df[q * d + l] * wf[l * k + j];
                dw_abs[q * k + j] += (df[q * d + l] * wf[l * k + j]).abs();
            }
        }
    }
    let eps = f32::EPSILON as f64;
    let (mut exact, mut bound) = (vec![0.0; d * k], vec![0.0; d * k]);
    for i in 0..d {
        for j in 0..k {
            let (mut s, mut mag) = (wf[i * k + j], wf[i * k + j].abs());
            for q in 0..r {
                s += uf[i * r + q] * dw[q * k + j];
                mag += uf[i * r + q].abs() * dw_abs[q * k + j];
            }
            exact[i * k + j] = s;
            bound[i * k + j] = (d + r + 2) as f64 * eps * mag;
        }
    }
    let t: Vec<f64> = (0..r)
        .map(|q| (0..d).map(|l| df[q * d + l] * bf[l]).sum::<f64>() + dbf[q])
        .collect();
    let bias = (0..d)
        .map(|i| bf[i] + ubf[i] + (0..r).map(|q| uf[i * r + q] * t[q]).sum::<f64>())
        .collect();
    (exact, bound, bias)
}

/// The largest `error / bound` of `got` (rows from `row0` on), asserting every error is within.
fn within(got: &HostTensor, row0: usize, exact: &[f64], bound: &[f64], what: &str) -> f64 {
    let width = got.shape[1..].iter().product::<usize>();
    let mut worst = 0.0f64;
    for (i, v) in got.to_f32().unwrap().iter().enumerate() {
        let at = row0 * width + i;
        let err = (*v as f64 - exact[at]).abs();
        assert!(
            err <= bound[at],
            "{what}[{at}]: error {err} above {}",
            bound[at]
        );
        worst = worst.max(err / bound[at]);
    }
    worst
}

#[test]
fn merged_minilm_layer_matches_f64_and_the_direct_kernels() {
    let dev = CpuDevice::new().unwrap();
    let (w, b) = layer();
    let (d, r) = (384usize, 16usize);
    let a = adapter(d, r);
    let (w2, b2) = a.merge_into(&dev, &w, &b).unwrap();
    let (exact, bound, bias) = reference(&w, &b, &a);
    let worst = within(&w2, 0, &exact, &bound, "W'");
    for (i, v) in b2.to_f32().unwrap().iter().enumerate() {
        assert!(
            (*v as f64 - bias[i]).abs() <= 1e-5 * (1.0 + bias[i].abs()),
            "b'[{i}]"
        );
    }
    println!("merge W' worst error / bound = {worst:.3}");
    // The same kernels called directly give the same bits (one shard: no extra all-reduce add).
    use Layout::{RowMajor as N, Transposed as T};
    let dwt = gemm(&dev, (&a.down_weight, N), (&w, T), None, None).unwrap();
    let w2d = gemm(&dev, (&a.up_weight, N), (&dwt, T), None, Some(&w)).unwrap();
    assert_eq!(w2d, w2);
    let brow = HostTensor::new(DType::F32, vec![1, d], b.data.clone()).unwrap();
    let t = gemm(
        &dev,
        (&brow, N),
        (&a.down_weight, N),
        Some(&a.down_bias),
        None,
    )
    .unwrap();
    let b2d = gemm(
        &dev,
        (&t, N),
        (&a.up_weight, N),
        Some(&a.up_bias),
        Some(&brow),
    )
    .unwrap();
    assert_eq!(b2d.data, b2.data);
}

#[test]
fn sharded_merge_is_within_the_same_bound_as_the_unsharded_one() {
    let dev = CpuDevice::new().unwrap();
    let (w, b) = layer();
    let (d, k, r) = (384usize, 1536usize, 8usize);
    let a = adapter(d, r);
    let (w2, _) = a.merge_into(&dev, &w, &b).unwrap();
    let (exact, bound, bias) = reference(&w, &b, &a);
    let (wv, bv) = (w.to_f32().unwrap(), b.to_f32().unwrap());
    let cuts = [0usize, 100, 300, 384];
    let shards: Vec<(HostTensor, HostTensor)> = cuts
        .windows(2)
        .map(|s| {
            (
                HostTensor::from_f32_as(DType::F32, vec![s[1] - s[0], k], &wv[s[0] * k..s[1] * k])
                    .unwrap(),
                HostTensor::from_f32_as(DType::F32, vec![s[1] - s[0]], &bv[s[0]..s[1]]).unwrap(),
            )
        })
        .collect();
    let merged = a.merge_sharded(&dev, &shards).unwrap();
    let (mut worst, mut differ) = (0.0f64, 0usize);
    let w2v = w2.to_f32().unwrap();
    for (s, (ws, bs)) in cuts.windows(2).zip(&merged) {
        worst = worst.max(within(ws, s[0], &exact, &bound, "sharded W'"));
        let x = ws.to_f32().unwrap();
        differ += x
            .iter()
            .zip(&w2v[s[0] * k..s[1] * k])
            .filter(|(p, q)| p.to_bits() != q.to_bits())
            .count();
        for (i, v) in bs.to_f32().unwrap().iter().enumerate() {
            let want = bias[s[0] + i];
            assert!(
                (*v as f64 - want).abs() <= 1e-5 * (1.0 + want.abs()),
                "sharded b'"
            );
        }
    }
    println!(
        "sharded merge: worst error / bound = {worst:.3}; {differ} of {} weights differ in bits \
         from the unsharded merge (the all-reduce splits the sums over d)",
        d * k
    );
}

#[test]
fn bad_merge_inputs_name_the_problem() {
    let dev = CpuDevice::new().unwrap();
    let a = BottleneckAdapter::new(6, 2, 3).unwrap();
    let w = HostTensor::from_f32_as(DType::F32, vec![6, 4], &[0.5; 24]).unwrap();
    let short = HostTensor::from_f32_as(DType::F32, vec![5], &[0.5; 5]).unwrap();
    let w5 = HostTensor::from_f32_as(DType::F32, vec![5, 4], &[0.5; 20]).unwrap();
    let w3 = HostTensor::from_f32_as(DType::F32, vec![3, 3], &[0.5; 9]).unwrap();
    let b3 = HostTensor::from_f32_as(DType::F32, vec![3], &[0.5; 3]).unwrap();
    let w3k = HostTensor::from_f32_as(DType::F32, vec![3, 4], &[0.5; 12]).unwrap();
    for (got, want) in [
        (a.merge_into(&dev, &w, &short).map(|_| ()), "bias [d]"),
        (a.merge_into(&dev, &w5, &short).map(|_| ()), "d = 6"),
        (
            a.merge_sharded(&dev, &[(w3k.clone(), b3.clone()), (w3, b3.clone())])
                .map(|_| ()),
            "K = 3",
        ),
        (a.merge_sharded(&dev, &[]).map(|_| ()), "d = 6"),
    ] {
        let e = got.expect_err(want).to_string();
        assert!(e.contains(want), "{e:?} does not say {want:?}");
    }
}

/// `[rows, cols]` of `N(0, std^2)` values.
fn normal(rows: usize, cols: usize, std: f64, seed: u64) -> HostTensor {
    HostTensor::from_f32_as(
        DType::F32,
        vec![rows, cols],
        &normal_f32(rows * cols, std, seed),
    )
    .unwrap()
}

#[test]
fn a_fresh_adapter_is_the_identity() {
    let dev = CpuDevice::new().unwrap();
    let a = BottleneckAdapter::new(24, 4, 9).unwrap();
    let h = normal(5, 24, 1.0, 3);
    for act in Act::ALL {
        let (y, _) = a.forward(&dev, act, &h, 1.0).unwrap();
        assert_eq!(y, h, "{act:?}");
    }
}

/// The f64 model of the forward pass: `sum(g * y)` for the adapter `p` (down, b_d, up, b_u
/// flattened) and input `h`, with GELU (erf form).
fn loss_f64(
    p: &[Vec<f64>; 4],
    h: &[f64],
    g: &[f64],
    (m, d, r): (usize, usize, usize),
    beta: f64,
) -> f64 {
    let gelu = |z: f64| 0.5 * z * (2.0 - qforge::kernels::erfc(z / std::f64::consts::SQRT_2));
    let mut loss = 0.0;
    for i in 0..m {
        let a: Vec<f64> = (0..r)
            .map(|q| {
                let z = (0..d).map(|l| h[i * d + l] * p[0][q * d + l]).sum::<f64>() + p[1][q];
                beta * gelu(z) + (1.0 - beta) * z
            })
            .collect();
        for j in 0..d {
            let y = h[i * d + j] + (0..r).map(|q| a[q] * p[2][j * r + q]).sum::<f64>() + p[3][j];
            loss += g[i * d + j] * y;
        }
    }
    loss
}

/// An adapter of width `d` and rank `r` with every weight and bias `N(0, 0.5^2)`, from seeds
/// `seed .. seed + 4`.
fn random_adapter(d: usize, r: usize, seed: u64) -> BottleneckAdapter {
    let vector = |n: usize, seed| {
        HostTensor::from_f32_as(DType::F32, vec![n], &normal_f32(n, 0.5, seed)).unwrap()
    };
    BottleneckAdapter {
        down_weight: normal(r, d, 0.5, seed),
        down_bias: vector(r, seed + 1),
        up_weight: normal(d, r, 0.5, seed + 2),
        up_bias: vector(d, seed + 3),
    }
}

#[test]
fn backward_matches_f64_finite_differences() {
    let dev = CpuDevice::new().unwrap();
    let (m, d, r, beta) = (3usize, 10usize, 4usize, 0.7f32);
    let a = random_adapter(d, r, 21);
    let h = normal(m, d, 1.0, 25);
    let g = normal(m, d, 1.0, 26);
    let (_, cache) = a.forward(&dev, Act::Gelu, &h, beta).unwrap();
    let grads = a.backward(&dev, Act::Gelu, &h, &cache, &g, beta).unwrap();
    let f =
        |t: &HostTensor| -> Vec<f64> { t.to_f32().unwrap().iter().map(|x| *x as f64).collect() };
    let params = [
        f(&a.down_weight),
        f(&a.down_bias),
        f(&a.up_weight),
        f(&a.up_bias),
    ];
    let (hf, gf) = (f(&h), f(&g));
    let dims = (m, d, r);
    let step = 1e-6;
    let check = |analytic: &HostTensor, numeric: &dyn Fn(usize) -> f64, what: &str| {
        for (i, got) in f(analytic).iter().enumerate() {
            let want = numeric(i);
            assert!(
                (got - want).abs() <= 1e-4 * want.abs() + 1e-5,
                "{what}[{i}]: analytic {got}, finite difference {want}"
            );
        }
    };
    for (k, (what, t)) in [
        ("down_weight", &grads.down_weight),
        ("down_bias", &grads.down_bias),
        ("up_weight", &grads.up_weight),
        ("up_bias", &grads.up_bias),
    ]
    .into_iter()
    .enumerate()
    {
        let numeric = |i: usize| {
            let mut p = params.clone();
            p[k][i] += step;
            let up = loss_f64(&p, &hf, &gf, dims, beta as f64);
            p[k][i] -= 2.0 * step;
            let down = loss_f64(&p, &hf, &gf, dims, beta as f64);
            (up - down) / (2.0 * step)
        };
        check(t, &numeric, what);
    }
    let numeric = |i: usize| {
        let mut x = hf.clone();
        x[i] += step;
        let up = loss_f64(&params, &x, &gf, dims, beta as f64);
        x[i] -= 2.0 * step;
        let down = loss_f64(&params, &x, &gf, dims, beta as f64);
        (up - down) / (2.0 * step)
    };
    check(&grads.dh, &numeric, "dh");
}

#[test]
fn merged_layer_equals_the_linear_adapter_within_the_bound() {
    let dev = CpuDevice::new().unwrap();
    let (w, b) = layer();
    let (d, k, r) = (384usize, 1536usize, 16usize);
    let a = adapter(d, r);
    let x = normal(8, k, 1.0, 31);
    use Layout::RowMajor as N;
    let h = gemm(&dev, (&x, N), (&w, N), Some(&b), None).unwrap();
    // beta = 0: the adapter is linear.
    let (y, _) = a.forward(&dev, Act::Gelu, &h, 0.0).unwrap();
    let (w2, b2) = a.merge_into(&dev, &w, &b).unwrap();
    let y2 = gemm(&dev, (&x, N), (&w2, N), Some(&b2), None).unwrap();
    // Both are f32 evaluations of one exact value: within the bound of docs/adapters.md.
    let worst = merge_support::merged_within_bound(&x, &w, &b, &a, &y, &y2)
        .unwrap_or_else(|e| panic!("{e}"));
    println!("merged vs unmerged adapter output: worst difference / bound = {worst:.2e}");
}

/// Finite edge values for the cross-device test: signed zeros, subnormals, the boundaries where
/// `exp`, `erf`, `tanh` and `sigmoid` change regime (`88.72284` is where `exp` overflows `f32`,
/// `-87.33655` and `-103.97208` where it leaves the normal and the subnormal range), the largest
/// and `±1` so that a product can pass a value through unchanged.
const EDGES: [f32; 17] = [
    0.0,
    -0.0,
    f32::MIN_POSITIVE / 3.0,
    -f32::MIN_POSITIVE / 5.0,
    1.0e-45,
    88.0,
    -88.0,
    88.72284,
    -88.72284,
    -87.33655,
    -103.97208,
    89.0,
    1.0,
    -1.0,
    0.5,
    -9.0,
    9.0,
];

/// The non-finite values and the largest finite magnitudes, drawn less often than [`EDGES`]
/// (one spreads inf or NaN through every sum it is in).
const NON_FINITE: [f32; 5] = [f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 3.0e38, -3.0e38];

/// One input tensor: uniform data in `(-3, 3)` times `scale`, each value replaced by an edge
/// value with probability `edges` per mille and by a non-finite (or huge) one with probability
/// `non_finite` per mille.
fn tensor_values(
    n: usize,
    scale: f32,
    (edges, non_finite): (u16, u16),
) -> impl Strategy<Value = Vec<f32>> {
    prop::collection::vec(
        (
            -3.0f32..3.0,
            0u16..1000,
            prop::sample::select(EDGES.to_vec()),
            prop::sample::select(NON_FINITE.to_vec()),
        )
            .prop_map(move |(x, roll, edge, bad)| {
                if roll < non_finite {
                    bad
                } else if roll < non_finite + edges {
                    edge
                } else {
                    x * scale
                }
            }),
        n,
    )
}

/// One random adapter problem: shapes, activation, `beta` and every tensor.
#[derive(Clone, Debug)]
struct Case {
    m: usize,
    d: usize,
    r: usize,
    act: Act,
    beta: f32,
    /// `down_weight [r, d]`, `down_bias [r]`, `up_weight [d, r]`, `up_bias [d]`, `h [m, d]`,
    /// `dy [m, d]`.
    values: [Vec<f32>; 6],
}

fn case() -> impl Strategy<Value = Case> {
    (
        1usize..=7,
        1usize..=40,
        1usize..=8,
        prop::sample::select(Act::ALL.to_vec()),
        prop_oneof![
            Just(1.0f32),
            Just(0.0f32),
            (1e-6f32..1.0).prop_filter("beta in (0, 1)", |b| *b > 0.0 && *b < 1.0)
        ],
        // The weights' scale (the activation sees sums of products of h and down_weight, so
        // `|z|` reaches the regime changes near 88 at the larger scales) and how many values
        // per mille are edge values and non-finite values.
        prop::sample::select(vec![0.05f32, 1.0, 30.0]),
        prop::sample::select(vec![0u16, 50, 300]),
        prop::sample::select(vec![0u16, 0, 5, 30]),
        // A pass-through down projection (row q is 1 at column q % d, b_d = 0), so that z is
        // exactly h and the edge values of h reach the activation unchanged.
        prop::bool::weighted(0.3),
    )
        .prop_flat_map(|(m, d, r, act, beta, scale, edges, non_finite, pass)| {
            let t = |n: usize, s: f32| tensor_values(n, s, (edges, non_finite));
            (
                t(r * d, scale),
                t(r, scale),
                t(d * r, scale),
                t(d, scale),
                t(m * d, scale.max(1.0)),
                t(m * d, 1.0),
            )
                .prop_map(move |(mut dw, mut db, uw, ub, h, dy)| {
                    if pass {
                        for (i, w) in dw.iter_mut().enumerate() {
                            *w = if i % d == (i / d) % d { 1.0 } else { 0.0 };
                        }
                        db.fill(0.0);
                    }
                    Case {
                        m,
                        d,
                        r,
                        act,
                        beta,
                        values: [dw, db, uw, ub, h, dy],
                    }
                })
        })
}

/// `dU` and `db_u` come out of one product (`[a | 1].T @ dy`); each has the bits of its own
/// product, `dy.T @ a` and `1 @ dy`, on the interpreter and a compiled CPU device, at a shape
/// off the tiles (M = 37, d = 21, r = 5).
#[test]
fn the_up_gradients_have_the_bits_of_their_own_products() {
    use qforge::runtime::InterpreterDevice;
    use Layout::{RowMajor as N, Transposed as T};
    let (m, d, r, beta) = (37usize, 21usize, 5usize, 0.5f32);
    let a = random_adapter(d, r, 31);
    let (h, dy) = (normal(m, d, 1.0, 35), normal(m, d, 1.0, 36));
    let ones = HostTensor::from_f32_as(DType::F32, vec![1, m], &vec![1.0; m]).unwrap();
    let cpu = CpuDevice::new().unwrap();
    for dev in [&InterpreterDevice as &dyn qforge::runtime::Device, &cpu] {
        let (_, cache) = a.forward(dev, Act::Gelu, &h, beta).unwrap();
        let g = a.backward(dev, Act::Gelu, &h, &cache, &dy, beta).unwrap();
        let du = gemm(dev, (&dy, T), (&cache.a, T), None, None).unwrap();
        let dbu = gemm(dev, (&ones, N), (&dy, T), None, None).unwrap();
        assert_eq!(g.up_weight, du, "dU on {}", dev.backend());
        assert_eq!(g.up_bias.shape, [d]);
        assert_eq!(g.up_bias.data, dbu.data, "db_u on {}", dev.backend());
    }
}

/// Every output of one forward and backward pass, named: `y`, the cache `z` and `a`, and the
/// five gradients.
fn run_case(
    dev: &dyn qforge::runtime::Device,
    c: &Case,
    beta: f32,
) -> Vec<(&'static str, HostTensor)> {
    let t = |shape: Vec<usize>, v: &[f32]| HostTensor::from_f32_as(DType::F32, shape, v).unwrap();
    let (m, d, r) = (c.m, c.d, c.r);
    let [dw, db, uw, ub, h, dy] = &c.values;
    let a = BottleneckAdapter {
        down_weight: t(vec![r, d], dw),
        down_bias: t(vec![r], db),
        up_weight: t(vec![d, r], uw),
        up_bias: t(vec![d], ub),
    };
    let (h, dy) = (t(vec![m, d], h), t(vec![m, d], dy));
    let (y, cache) = a.forward(dev, c.act, &h, beta).unwrap();
    let g = a.backward(dev, c.act, &h, &cache, &dy, beta).unwrap();
    vec![
        ("y", y),
        ("z", cache.z),
        ("a", cache.a),
        ("dh", g.dh),
        ("dD", g.down_weight),
        ("db_d", g.down_bias),
        ("dU", g.up_weight),
        ("db_u", g.up_bias),
    ]
}

/// The first element whose bits differ (any NaN equals any NaN), as `(index, want, got)`.
fn first_difference(want: &HostTensor, got: &HostTensor) -> Option<(usize, f32, f32)> {
    let (w, g) = (want.to_f32().unwrap(), got.to_f32().unwrap());
    if w.len() != g.len() {
        return Some((w.len().min(g.len()), f32::NAN, f32::NAN));
    }
    w.iter()
        .zip(&g)
        .position(|(p, q)| p.to_bits() != q.to_bits() && !(p.is_nan() && q.is_nan()))
        .map(|i| (i, w[i], g[i]))
}

/// Interpreter vs every device, bitwise, on random adapters: every activation, `beta` 1, 0 or
/// in between, shapes that are not multiples of 4 or 16, and inputs mixed with edge values.
#[test]
fn forward_and_backward_are_bit_exact_on_every_device() {
    use qforge::devices::available_devices;
    use qforge::runtime::InterpreterDevice;
    let (devices, unavailable) = available_devices();
    for u in &unavailable {
        qforge_testkit::unavailable(u.device, &u.reason);
    }
    if devices.is_empty() {
        println!("skipped: no device besides the interpreter can run on this machine");
        return;
    }
    // How many output values are NaN (the edge values should not turn every case into NaN),
    // and how many activation inputs z land where exp/erf/tanh/sigmoid change regime.
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    let (nan_outputs, outputs, regime) = (
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicUsize::new(0),
    );
    // The interpreter and every device run each case side by side.
    let mut runs: Vec<&dyn qforge::runtime::Device> = vec![&InterpreterDevice];
    runs.extend(devices.iter().map(|d| d.as_ref()));
    // Two runners at once (the StableHLO runner of a case is the slow part, one core each).
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cases = qforge_testkit::random_cases(640);
    let result = qforge_testkit::run_split(file!(), cases, threads, &case(), |c| {
        let mut outputs_of = qforge_testkit::on_each(&runs, |dev| run_case(*dev, &c, c.beta));
        let want = outputs_of.remove(0);
        for (name, t) in &want {
            let v = t.to_f32().unwrap();
            if *name == "z" {
                let near = v.iter().filter(|z| (80.0..=110.0).contains(&z.abs()));
                regime.fetch_add(near.count(), Relaxed);
            }
            outputs.fetch_add(v.len(), Relaxed);
            nan_outputs.fetch_add(v.iter().filter(|x| x.is_nan()).count(), Relaxed);
        }
        for (dev, got) in devices.iter().zip(&outputs_of) {
            for ((name, w), (_, g)) in want.iter().zip(got) {
                if let Some((i, x, y)) = first_difference(w, g) {
                    return Err(TestCaseError::fail(format!(
                        "{name}[{i}] on {}: interpreter {x:e} ({:#010x}), device {y:e} \
                         ({:#010x}); {:?} beta {} M {} d {} r {}",
                        dev.backend(),
                        x.to_bits(),
                        y.to_bits(),
                        c.act,
                        c.beta,
                        c.m,
                        c.d,
                        c.r
                    )));
                }
            }
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let (nan, total, near) = (
        nan_outputs.into_inner(),
        outputs.into_inner(),
        regime.into_inner(),
    );
    println!(
        "{} device(s); {nan} of {total} output values were NaN; {near} activation inputs had \
         |z| in [80, 110]",
        devices.len()
    );
    // The generator's coverage: the regime changes are reached, and most outputs stay numbers.
    assert!(near > 0, "no activation input near the exp overflow");
    assert!(2 * nan < total, "{nan} of {total} outputs are NaN");
}
