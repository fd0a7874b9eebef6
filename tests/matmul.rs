//! The fused 4-bit matmul against bitsandbytes' golden vectors and a real checkpoint:
//! * the weight decoded inside the kernel is bit for bit bitsandbytes' `W_dequant` (an identity
//!   activation makes the kernel print its decoded weight);
//! * forward outputs and `x.grad` agree with `x @ W_dequant.T` / `grad_out @ W_dequant` computed
//!   in f64 within the documented bound (`docs/semantics.md`), and with bitsandbytes' BLAS
//!   outputs within the sum of both bounds; the worst error is printed;
//! * on every Linear weight of all-MiniLM-L6-v2 quantized to NF4, on real token embeddings.
//!
//! Needs `../shared` (fails without it where `qforge_testkit` requires it, as under CI; skips with a reason elsewhere).

#[path = "golden_support/mod.rs"]
mod golden_support;

use std::path::Path;

use golden_support::*;
use qforge::ir::{DType, ReduceOrder};
use qforge::kernels::matmul4::{DX_ORDER, K_ORDER};
use qforge::kernels::ops::{self, Absmax4, QuantState4};
use qforge::kernels::QuantType;
use qforge::runtime::{CpuDevice, HostTensor};
use safetensors::SafeTensors;

/// Unit roundoff of a dtype (half an ulp of 1).
fn unit_roundoff(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 2f64.powi(-11),
        DType::BF16 => 2f64.powi(-8),
        _ => 2f64.powi(-24),
    }
}

/// The documented error bound of one output: a sum in `order` (`W` strided partials) runs
/// `ceil(len / W)` fused steps in each partial and `log2(W)` tree adds, each at most one f32
/// rounding of a partial sum bounded by `sum |a_i w_i|`; then one rounding to the dtype.
fn bound(len: usize, order: ReduceOrder, abs_sum: f64, exact: f64, dtype: DType) -> f64 {
    let ways = order.ways();
    let steps = len.div_ceil(ways as usize) as f64 + ways.ilog2() as f64;
    let sum = steps * 2f64.powi(-24) * abs_sum;
    sum + unit_roundoff(dtype) * (exact.abs() + sum) + f64::MIN_POSITIVE
}

/// `a [rows, len] @ w` where `w(o, i)` gives the weight for output `o`, reduction index `i`:
/// exact values (f64) and `sum |a w|` per output.
fn reference(
    a: &[f32],
    rows: usize,
    len: usize,
    outs: usize,
    w: impl Fn(usize, usize) -> f32,
) -> (Vec<f64>, Vec<f64>) {
    let mut exact = Vec::with_capacity(rows * outs);
    let mut abs = Vec::with_capacity(rows * outs);
    for r in 0..rows {
        for o in 0..outs {
            let (mut s, mut t) = (0f64, 0f64);
            for i in 0..len {
                let p = a[r * len + i] as f64 * w(o, i) as f64;
                s += p;
                t += p.abs();
            }
            exact.push(s);
            abs.push(t);
        }
    }
    (exact, abs)
}

/// Largest `|got - exact| / bound` over the outputs (must stay at most 1); infinite for a NaN or
/// an infinity where the exact value is finite, and never drops a NaN (`error_ratio`,
/// `nan_max`).
fn worst_ratio(
    got: &[f32],
    exact: &[f64],
    abs: &[f64],
    (len, order): (usize, ReduceOrder),
    dtype: DType,
) -> f64 {
    assert_eq!(got.len(), exact.len(), "output length");
    nan_max(
        got.iter()
            .zip(exact.iter().zip(abs))
            .map(|(g, (e, a))| error_ratio(*g as f64, *e, bound(len, order, *a, *e, dtype))),
    )
}

fn state_of(case: &Case) -> (Vec<u8>, QuantState4) {
    let w = case.field("W");
    let (n, k) = (case.param_u32("N") as usize, case.param_u32("K") as usize);
    let absmax = if case.params["compress_statistics"].as_bool() == Some(true) {
        Absmax4::Nested {
            qabsmax: case.field("W_qabsmax").u8s(),
            nested_absmax: case.field("W_nested_absmax").f32s(),
            nested_code: case.field("W_nested_code").f32s(),
            offset: case.field("W_offset").f32s()[0],
            nested_blocksize: 256,
        }
    } else {
        Absmax4::Plain(case.field("W_absmax").f32s())
    };
    let state = QuantState4 {
        quant_type: QuantType::parse(case.param_str("quant_type")).unwrap(),
        blocksize: case.param_u32("blocksize") as usize,
        dtype: w.float_dtype(),
        shape: vec![n, k],
        absmax,
    };
    (case.field("W_packed").u8s(), state)
}

#[test]
fn golden_matmul_4bit_decodes_w_exactly_and_stays_within_the_bound() {
    let Some(cases) = load_cases("matmul4bit.safetensors") else {
        return;
    };
    let dev = CpuDevice::new().unwrap();
    let mut report = Vec::new();
    for (name, case) in &cases {
        let (packed, state) = state_of(case);
        let (n, k) = (state.shape[0], state.shape[1]);
        let dtype = case.field("x_m1").float_dtype();
        let w_dequant = case.field("W_dequant").f32s();
        // 1. Identity activation: y[i][o] = w[o][i] exactly (rounded to the dtype, as W_dequant).
        let eye: Vec<f32> = (0..k * k)
            .map(|i| if i % (k + 1) == 0 { 1.0 } else { 0.0 })
            .collect();
        let x = HostTensor::from_f32_as(dtype, vec![k, k], &eye).unwrap();
        let y = ops::matmul_4bit(&dev, &x, &packed, &state, None, None).unwrap();
        let y = y.to_f32().unwrap();
        let mut bad = 0;
        for i in 0..k {
            for o in 0..n {
                let (got, want) = (y[i * n + o], w_dequant[o * k + i]);
                if !(got == want || got.is_nan() && want.is_nan()) {
                    bad += 1;
                }
            }
        }
        assert_eq!(
            bad, 0,
            "{name}: the decoded weight differs from W_dequant in {bad} elements"
        );
        // 2. Forward and backward against f64 and against bitsandbytes' BLAS outputs.
        let mut worst = [0f64; 4];
        for m in ["m1", "m8"] {
            let x = case.field(&format!("x_{m}"));
            let rows = x.shape[0];
            let xs = x.f32s();
            let y = ops::matmul_4bit(&dev, &x.host(), &packed, &state, None, None)
                .unwrap()
                .to_f32()
                .unwrap();
            let (exact, abs) = reference(&xs, rows, k, n, |o, i| w_dequant[o * k + i]);
            worst[0] = nan_max([worst[0], worst_ratio(&y, &exact, &abs, (k, K_ORDER), dtype)]);
            let theirs = case.field(&format!("out_{m}")).f32s();
            let r = vs_blas(&y, &theirs, &exact, &abs, (k, K_ORDER), dtype);
            worst[1] = nan_max([worst[1], r]);
            let dy = case.field(&format!("grad_out_{m}"));
            let dys = dy.f32s();
            let dx = ops::matmul_4bit_backward_input(&dev, &dy.host(), &packed, &state, None)
                .unwrap()
                .to_f32()
                .unwrap();
            let (exact, abs) = reference(&dys, rows, n, k, |o, i| w_dequant[i * k + o]);
            worst[2] = nan_max([
                worst[2],
                worst_ratio(&dx, &exact, &abs, (n, DX_ORDER), dtype),
            ]);
            let theirs = case.field(&format!("dx_{m}")).f32s();
            let r = vs_blas(&dx, &theirs, &exact, &abs, (n, DX_ORDER), dtype);
            worst[3] = nan_max([worst[3], r]);
        }
        report.push(format!(
            "{name}: error/bound forward {:.3}, dX {:.3}; difference from bitsandbytes / (our bound + a sequential BLAS bound): out {:.3}, dx {:.3}",
            worst[0], worst[2], worst[1], worst[3]
        ));
        assert!(
            worst.iter().all(|w| *w <= 1.0),
            "{}",
            report.last().unwrap()
        );
    }
    println!("{}", report.join("\n"));
    assert_eq!(report.len(), 18, "every golden matmul case was checked");
}

/// Largest `|ours - theirs|` over our bound plus the worst-case bound of a sequential f32 sum
/// of `len` products (bitsandbytes' BLAS order is unknown), each rounded to the dtype;
/// infinite where ours is NaN or infinite and theirs finite, never dropping a NaN.
fn vs_blas(
    ours: &[f32],
    theirs: &[f32],
    exact: &[f64],
    abs: &[f64],
    (len, order): (usize, ReduceOrder),
    dtype: DType,
) -> f64 {
    assert_eq!(ours.len(), theirs.len(), "output length");
    nan_max(
        ours.iter()
            .zip(theirs)
            .zip(exact.iter().zip(abs))
            .map(|((o, t), (e, a))| {
                let blas = len as f64 * 2f64.powi(-24) * a + unit_roundoff(dtype) * e.abs();
                error_ratio(
                    *o as f64,
                    *t as f64,
                    bound(len, order, *a, *e, dtype) + blas,
                )
            }),
    )
}

#[test]
fn minilm_every_linear_weight_matches_f64_within_the_bound() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/models/all-MiniLM-L6-v2");
    if !dir.join("model.safetensors").is_file() {
        qforge_testkit::unavailable("models", format!("{} is missing", dir.display()));
        return;
    }
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let emb = st.tensor("embeddings.word_embeddings.weight").unwrap();
    let d = emb.shape()[1];
    let emb: Vec<f32> = emb
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let dev = CpuDevice::new().unwrap();
    let mut names: Vec<String> = st
        .names()
        .into_iter()
        .filter(|n| n.ends_with(".weight") && st.tensor(n).unwrap().shape().len() == 2)
        .filter(|n| !n.contains("embeddings"))
        .cloned()
        .collect();
    names.sort();
    let (mut checked, mut worst) = (0, 0f64);
    for name in &names {
        let t = st.tensor(name).unwrap();
        let (n, k) = (t.shape()[0], t.shape()[1]);
        let w = HostTensor::new(DType::F32, vec![n, k], t.data().to_vec()).unwrap();
        let layer = ops::Linear4bit::quantize(&dev, &w, QuantType::Nf4, 64, true, None).unwrap();
        let wd = ops::dequantize_4bit(&dev, &layer.packed, &layer.state)
            .unwrap()
            .to_f32()
            .unwrap();
        // 5 real token embeddings (rows 101..), laid end to end to fill K.
        let rows = 5;
        let x: Vec<f32> = (0..rows * k)
            .map(|i| emb[(101 + i / d) * d + i % d])
            .collect();
        let xt = HostTensor::from_f32(vec![rows, k], &x).unwrap();
        let y = layer.forward(&dev, &xt).unwrap().to_f32().unwrap();
        let (exact, abs) = reference(&x, rows, k, n, |o, i| wd[o * k + i]);
        let r = worst_ratio(&y, &exact, &abs, (k, K_ORDER), DType::F32);
        assert!(r <= 1.0, "{name}: forward error/bound {r}");
        worst = nan_max([worst, r]);
        let dy: Vec<f32> = (0..rows * n)
            .map(|i| emb[(2001 + i / d) * d + i % d])
            .collect();
        let dyt = HostTensor::from_f32(vec![rows, n], &dy).unwrap();
        let dx = layer.backward_input(&dev, &dyt).unwrap().to_f32().unwrap();
        let (exact, abs) = reference(&dy, rows, n, k, |o, i| wd[i * k + o]);
        let r = worst_ratio(&dx, &exact, &abs, (n, DX_ORDER), DType::F32);
        assert!(r <= 1.0, "{name}: dX error/bound {r}");
        worst = nan_max([worst, r]);
        checked += 1;
    }
    println!("{checked} MiniLM Linear weights: worst error/bound {worst:.3}");
    assert!(checked >= 37, "only {checked} weights checked");
}

/// A value mixed from normal data and edge values (±0, subnormals, ±inf, NaN, huge).
fn edge_value(bits: u32) -> f32 {
    match bits % 16 {
        0 => 0.0,
        1 => -0.0,
        2 => f32::from_bits(bits >> 9), // subnormal or tiny
        3 => [f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 3.0e38][(bits >> 4) as usize % 4],
        _ => ((bits >> 8) % 20001) as f32 / 5000.0 - 2.0,
    }
}

/// The fused matmul (forward with bias, plain and nested absmax, and dX) on every device bit for
/// bit against the interpreter, at the batch sizes M in {1, 2, 7, 16, 33} (each in a fixed case in
/// every run, plus `PROPTEST_CASES` (default 5) random ones), with K and N not multiples of the
/// block (64), of 8 or of the tile, on edge-value activations and absmax.
#[test]
fn matmul_4bit_is_bit_exact_on_every_device_at_every_batch_size() {
    use proptest::prelude::*;
    use qforge::devices::available_devices;
    use qforge::runtime::InterpreterDevice;

    let (devices, unavailable) = available_devices();
    for u in &unavailable {
        qforge_testkit::unavailable(u.device, &u.reason);
    }
    // 64: 16-bit activations widen on a CPU (`matmul4/widen.rs`; the input gradient from 2 rows
    // with AVX-512).
    const MS: [usize; 6] = [1, 2, 7, 16, 33, 64];
    const KS: [usize; 5] = [1, 5, 13, 70, 131];
    const NS: [usize; 4] = [1, 3, 9, 65];
    const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];
    // Fixed cases: every M with a K, N, dtype and absmax form that also each take all their
    // values (5 cases), in every run; random combinations on top.
    let fixed = (0..MS.len()).map(|i| {
        let case = (
            MS[i],
            KS[(i + 2) % KS.len()],
            NS[i % NS.len()],
            DTYPES[i % DTYPES.len()],
            i % 2 == 1,
            0x9e37_79b9u32.wrapping_mul(i as u32 + 1),
        );
        (format!("{case:?}"), case)
    });
    let strategy = (
        prop::sample::select(MS.to_vec()),
        prop::sample::select(KS.to_vec()),
        prop::sample::select(NS.to_vec()),
        prop::sample::select(DTYPES.to_vec()),
        any::<bool>(),
        any::<u32>(),
    );
    let random = qforge_testkit::random_cases(5);
    qforge_testkit::run_cases(
        file!(),
        fixed,
        strategy,
        random,
        |(m, k, n, dtype, nested, seed)| {
            let mut s = seed | 1;
            let mut next = || {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                s
            };
            let w: Vec<f32> = (0..n * k).map(|_| edge_value(next()) * 0.5).collect();
            let wt = HostTensor::from_f32_as(dtype, vec![n, k], &w).unwrap();
            let (packed, state) =
                ops::quantize_4bit(&InterpreterDevice, &wt, QuantType::Nf4, 64, nested).unwrap();
            let x: Vec<f32> = (0..m * k).map(|_| edge_value(next())).collect();
            let x = HostTensor::from_f32_as(dtype, vec![m, k], &x).unwrap();
            let bias: Vec<f32> = (0..n).map(|_| edge_value(next())).collect();
            let bias = HostTensor::from_f32_as(dtype, vec![n], &bias).unwrap();
            let dy: Vec<f32> = (0..m * n).map(|_| edge_value(next())).collect();
            let dy = HostTensor::from_f32_as(dtype, vec![m, n], &dy).unwrap();
            let run = |dev: &dyn qforge::runtime::Device| {
                (
                    ops::matmul_4bit(dev, &x, &packed, &state, Some(&bias), None).unwrap(),
                    ops::matmul_4bit_backward_input(dev, &dy, &packed, &state, None).unwrap(),
                )
            };
            let want = run(&InterpreterDevice);
            for dev in &devices {
                let got = run(dev.as_ref());
                for (g, w, what) in [(&got.0, &want.0, "y"), (&got.1, &want.1, "dX")] {
                    let (g, w) = (g.to_f32().unwrap(), w.to_f32().unwrap());
                    let bad = g
                        .iter()
                        .zip(&w)
                        .filter(|(a, b)| !(a.to_bits() == b.to_bits() || a.is_nan() && b.is_nan()))
                        .count();
                    prop_assert_eq!(
                        bad,
                        0,
                        "{} on {}: M={} K={} N={} {}",
                        what,
                        dev.backend(),
                        m,
                        k,
                        n,
                        dtype
                    );
                }
            }
            Ok(())
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    println!(
        "checked on {} device(s): {} fixed + {random} random cases",
        devices.len(),
        MS.len()
    );
}

/// From 32 rows on (the forward, and the input gradient with AVX2; from 128 with AVX-512), a
/// `cpu-llvm` device decodes the weight once and runs the dense GEMM on it (131 rows here, both
/// plans, a partial last row tile;
/// `matmul4/decoded_forward.rs`: `x` and the weight partial-major, 16 partials;
/// `matmul4/decoded.rs`): the same bits as the interpreter's fused kernels, `f32` and widened
/// `bf16` activations, plain and nested absmax, a bias, `K = 160` (10 groups of 16, 5 panels of
/// 32, a scale chunk of 32 columns, absmax blocks of 64 straddling weight rows) and `K = 192`
/// (blocks within rows: the forward decode's interleaved absmax per block rather than per 16
/// columns), `N = 70` (a partial last panel). The values are finite (an edge value's infinity
/// or NaN in a row would make the whole output row NaN and hide the rest). On other devices
/// (Cranelift) the fused kernels run, checked the same way.
#[test]
fn many_rows_are_bit_exact_on_every_device() {
    use qforge::devices::available_devices;
    use qforge::runtime::InterpreterDevice;
    let (devices, _) = available_devices();
    let (m, n) = (131usize, 70usize);
    for (dtype, nested, k) in [
        (DType::F32, false, 160usize),
        (DType::F32, true, 160),
        (DType::BF16, true, 160),
        (DType::F32, false, 192),
        (DType::BF16, true, 192),
    ] {
        let mut s = 0x2545_f491u32;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            s
        };
        let mut finite = || (next() >> 8) as f32 / (1u32 << 23) as f32 - 1.0;
        let w: Vec<f32> = (0..n * k).map(|_| finite() * 0.5).collect();
        let wt = HostTensor::from_f32_as(DType::F32, vec![n, k], &w).unwrap();
        let (packed, state) =
            ops::quantize_4bit(&InterpreterDevice, &wt, QuantType::Nf4, 64, nested).unwrap();
        let x: Vec<f32> = (0..m * k).map(|_| finite() * 3.0).collect();
        let x = HostTensor::from_f32_as(dtype, vec![m, k], &x).unwrap();
        let bias: Vec<f32> = (0..n).map(|_| finite()).collect();
        let bias = HostTensor::from_f32_as(dtype, vec![n], &bias).unwrap();
        let dy: Vec<f32> = (0..m * n).map(|_| finite() * 3.0).collect();
        let dy = HostTensor::from_f32_as(dtype, vec![m, n], &dy).unwrap();
        let run = |dev: &dyn qforge::runtime::Device| {
            let y = ops::matmul_4bit(dev, &x, &packed, &state, Some(&bias), None).unwrap();
            let dx = ops::matmul_4bit_backward_input(dev, &dy, &packed, &state, None).unwrap();
            (y.to_f32().unwrap(), dx.to_f32().unwrap())
        };
        let want = run(&InterpreterDevice);
        for dev in &devices {
            let got = run(dev.as_ref());
            for (what, got, want) in [("y", &got.0, &want.0), ("dX", &got.1, &want.1)] {
                let bad = got
                    .iter()
                    .zip(want)
                    .filter(|(a, b)| !(a.to_bits() == b.to_bits() || a.is_nan() && b.is_nan()))
                    .count();
                assert_eq!(
                    bad,
                    0,
                    "{what} on {}: {dtype}, nested {nested}, K = {k}",
                    dev.backend()
                );
            }
        }
    }
}

/// Bad input to the matmul and int8 host ops is an error naming the problem, never a panic or a
/// wrong `Ok` (the cases a new-user trial found).
#[test]
fn bad_inputs_are_errors_that_name_the_problem() {
    use qforge::kernels::ops::{suggest_tile_sizes, DeviceCaps};
    use qforge::runtime::InterpreterDevice;
    let dev = InterpreterDevice;
    let (n, k) = (8usize, 64usize);
    let w = HostTensor::from_f32(vec![n, k], &vec![0.5; n * k]).unwrap();
    let (packed, state) = ops::quantize_4bit(&dev, &w, QuantType::Nf4, 64, false).unwrap();
    let err = |r: Result<HostTensor, qforge::runtime::Error>| r.unwrap_err().to_string();
    // An empty batch still checks the quant state.
    let mut short = state.clone();
    short.absmax = Absmax4::Plain(vec![1.0]);
    let x0 = HostTensor::new(DType::F32, vec![0, k], vec![]).unwrap();
    let e = err(ops::matmul_4bit(&dev, &x0, &packed, &short, None, None));
    assert!(
        e.contains("absmax has 1 elements, the quant state needs 8"),
        "{e}"
    );
    // ... and returns [0, N] when the state is right.
    let y0 = ops::matmul_4bit(&dev, &x0, &packed, &state, None, None).unwrap();
    assert_eq!(y0.shape, vec![0, n]);
    // A bias of the right shape but too few bytes names the byte counts.
    let x = HostTensor::from_f32(vec![2, k], &vec![1.0; 2 * k]).unwrap();
    let bad_bias = qforge::runtime::HostTensor {
        dtype: DType::F32,
        shape: vec![n],
        data: vec![0; 4],
    };
    let e = err(ops::matmul_4bit(
        &dev,
        &x,
        &packed,
        &state,
        Some(&bad_bias),
        None,
    ));
    assert!(e.contains("(32 bytes)") && e.contains("(4 bytes)"), "{e}");
    // A non-float quant state dtype.
    let mut int_state = state.clone();
    int_state.dtype = DType::I8;
    let e = err(ops::matmul_4bit(&dev, &x, &packed, &int_state, None, None));
    assert!(e.contains("quant state's dtype") && e.contains("i8"), "{e}");
    // Linear4bit refuses a bias that does not have out_features values.
    let b3 = HostTensor::from_f32(vec![3], &[0.0; 3]).unwrap();
    let e = ops::Linear4bit::quantize(&dev, &w, QuantType::Nf4, 64, false, Some(b3))
        .unwrap_err()
        .to_string();
    assert!(e.contains("shape [8] (out_features)"), "{e}");
    // The tile heuristic saturates instead of overflowing.
    for caps in [
        DeviceCaps::Cpu {
            threads: u32::MAX,
            lanes: 4,
        },
        DeviceCaps::Gpu {
            parallel_threads: u32::MAX,
        },
    ] {
        let t = suggest_tile_sizes(usize::MAX, usize::MAX, 1, caps);
        assert!(t.check().is_ok(), "{t:?}");
        let t = ops::suggest_int8_tile_sizes(usize::MAX, usize::MAX, 1, caps);
        assert!(t.check().is_ok(), "{t:?}");
    }
    // int8: a K whose i32 sums could overflow, and repeated outlier columns.
    let kk = ops::MAX_INT8_K as usize + 1;
    let a = HostTensor::new(DType::I8, vec![1, kk], vec![0x80; kk]).unwrap();
    let e = err(ops::int8_linear_matmul(&dev, &a, &a));
    assert!(
        e.contains(&format!("K = {kk}")) && e.contains("overflow"),
        "{e}"
    );
    let x = HostTensor::from_f32(vec![1, 4], &[1.0, 2.0, 3.0, 4.0]).unwrap();
    let ca = HostTensor::new(DType::I8, vec![1, 4], vec![1; 4]).unwrap();
    let cb = HostTensor::new(DType::I8, vec![2, 4], vec![1; 8]).unwrap();
    let e = err(ops::int8_mixed_scaled_mm(
        &dev,
        &x,
        &ca,
        &cb,
        &[1.0],
        &[1.0, 1.0],
        &[1, 1],
        None,
    ));
    assert!(e.contains("strictly increasing"), "{e}");
}
