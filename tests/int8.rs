//! LLM.int8() against bitsandbytes 0.50.2 (CPU) golden vectors (`../shared/golden/int8.safetensors`,
//! README section "LLM.int8"), through the host ops on the interpreter and on the CPU device:
//! * `vq_*` (30 cases): codes, row statistics and outlier columns of `int8_vectorwise_quant`
//!   bit for bit (and, for threshold 0, of `quantize_rowwise_int8`); `int8_vectorwise_dequant`
//!   of the stored codes bit for bit;
//! * `mm_*` (9 cases): `CA`/`SCA`/`CB`/`SCB` from quantizing `x` and `W`, the `i32` product and
//!   `int8_mm_dequant` with and without bias (`f16` out) bit for bit;
//! * `mixed_*` (2 cases): quantization with threshold 6, then `int8_mixed_scaled_mm` (and the
//!   `Linear8bitLt` composition) against bitsandbytes' `out` (bit for bit on these cases; the
//!   count of differing elements and the largest ulp distance are printed and asserted 0) and
//!   against an `f64` evaluation of the documented composition within the stated rounding bound;
//!   its input gradient within its bound against `f64`. bitsandbytes' `subA` (`x` at the outlier
//!   columns, which our kernel reads but does not return) equals `x` at our outlier columns bit
//!   for bit and is the fp operand of the `f64` reference.
//!
//! The counts `docs/compat.md` ("LLM.int8") states are asserted: the cases per prefix, the
//! codes, the 9 codes of the single-division scale, the 313 values of the CUDA
//! `int8_mm_dequant` form, the 126 / 157 outputs of a single rounding in the mixed forward.
//!
//! Needs `../shared` (fails without it where `qforge_testkit` requires it, as under CI; skips with a reason elsewhere).

#[path = "golden_support/mod.rs"]
mod golden_support;

use golden_support::*;
use qforge::ir::DType;
use qforge::kernels::int8::matmul::MM_DEQUANT_SCALE;
use qforge::kernels::int8::DEQUANT_SCALE;
use qforge::kernels::ops::{self, Linear8bitLt};
use qforge::runtime::{CpuDevice, Device, HostTensor, InterpreterDevice};

/// The interpreter, and the CPU device when it starts.
fn devices() -> Vec<Box<dyn Device>> {
    let mut d: Vec<Box<dyn Device>> = vec![Box::new(InterpreterDevice)];
    match CpuDevice::new() {
        Ok(cpu) => d.push(Box::new(cpu)),
        Err(e) => qforge_testkit::unavailable(
            "cpu",
            format!("int8 tests run on the interpreter only: {e}"),
        ),
    }
    d
}

fn i8_tensor(t: &Tensor) -> HostTensor {
    HostTensor::new(DType::I8, t.shape.clone(), t.data.clone()).unwrap()
}

fn i32_tensor(t: &Tensor) -> HostTensor {
    HostTensor::new(DType::I32, t.shape.clone(), t.data.clone()).unwrap()
}

fn i64s_as_u32(t: &Tensor) -> Vec<u32> {
    t.i64s().into_iter().map(|v| v as u32).collect()
}

fn assert_same_f32s(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            same_f32(*g, *w),
            "{what}[{i}]: ours {g:e} ({:#x}) vs bnb {w:e} ({:#x})",
            g.to_bits(),
            w.to_bits()
        );
    }
}

fn assert_same_bytes(what: &str, got: &HostTensor, want: &Tensor) {
    assert_eq!(got.shape, want.shape, "{what}: shape");
    let bad = got
        .data
        .iter()
        .zip(&want.data)
        .filter(|(a, b)| a != b)
        .count();
    assert!(got.data == want.data, "{what}: {bad} bytes differ");
}

/// Codes of a `vq_` case that the form `round(x * (127 / absmax))` (one `f32` division instead
/// of bitsandbytes' `(1 / absmax) * 127`) gets wrong: the artifact `docs/compat.md` records.
fn single_division_mismatches(case: &Case) -> usize {
    let thr = threshold(case);
    let a = case.field("input").f32s();
    let cols = case.field("input").shape[1];
    let (codes, stats) = (&case.field("CA").data, case.field("row_stats").f32s());
    let outlier = |x: f32| thr > 0.0 && x.abs() >= thr;
    let flagged: Vec<bool> = (0..cols)
        .map(|c| a.iter().skip(c).step_by(cols).any(|x| outlier(*x)))
        .collect();
    a.iter()
        .enumerate()
        .filter(|(i, x)| {
            let scale = 127.0 / stats[i / cols];
            let v = (**x * scale).round_ties_even();
            let q = if v.is_nan() || flagged[i % cols] {
                0
            } else {
                v.clamp(-127.0, 127.0) as i8
            };
            q != codes[*i] as i8
        })
        .count()
}

fn threshold(case: &Case) -> f32 {
    case.params["threshold"].as_f64().expect("threshold") as f32
}

/// `docs/compat.md` (LLM.int8): 42 cases, 30 `vq_`, 9 `mm_`, 2 `mixed_` and
/// `double_quant_f16_8x64`, which stores only its input (bitsandbytes' CPU backend raised
/// `NotImplementedError`). The tests below check every case with outputs.
#[test]
fn golden_int8_has_the_documented_cases() {
    let Some(cases) = load_cases("int8.safetensors") else {
        return;
    };
    let count = |p: &str| cases.keys().filter(|n| n.starts_with(p)).count();
    assert_eq!(
        (cases.len(), count("vq_"), count("mm_"), count("mixed_")),
        (42, 30, 9, 2),
        "int8.safetensors: (cases, vq_, mm_, mixed_)"
    );
    let dq = &cases["double_quant_f16_8x64"];
    assert_eq!(
        dq.fields.keys().map(String::as_str).collect::<Vec<_>>(),
        ["input"],
        "double_quant_f16_8x64 has no outputs"
    );
}

#[test]
fn golden_int8_vectorwise_quant_and_dequant_are_bit_exact() {
    let Some(cases) = load_cases("int8.safetensors") else {
        return;
    };
    for dev in devices() {
        let dev = dev.as_ref();
        let (mut n_cases, mut n_codes, mut one_division) = (0, 0, 0);
        for (name, case) in cases.iter().filter(|(n, _)| n.starts_with("vq_")) {
            let thr = threshold(case);
            let input = case.field("input").host();
            one_division += single_division_mismatches(case);
            let q = ops::int8_vectorwise_quant(dev, &input, thr).unwrap();
            assert_same_bytes(&format!("{name}: CA"), &q.codes, case.field("CA"));
            let stats = case.field("row_stats").f32s();
            assert_same_f32s(&format!("{name}: row_stats"), &q.row_stats, &stats);
            match case.fields.get("outlier_cols") {
                Some(t) => assert_eq!(q.outlier_cols, Some(i64s_as_u32(t)), "{name}"),
                None => assert_eq!(q.outlier_cols, None, "{name}: threshold 0 has no columns"),
            }
            if thr == 0.0 {
                let (codes, absmax) = ops::quantize_rowwise_int8(dev, &input).unwrap();
                assert_same_bytes(&format!("{name}: rowwise codes"), &codes, case.field("CA"));
                assert_same_f32s(&format!("{name}: rowwise absmax"), &absmax, &stats);
            }
            let ca = i8_tensor(case.field("CA"));
            let deq = ops::int8_vectorwise_dequant(dev, &ca, &stats, DType::F32).unwrap();
            let want = case.field("dequant").f32s();
            assert_same_f32s(&format!("{name}: dequant"), &deq.to_f32().unwrap(), &want);
            n_cases += 1;
            n_codes += q.codes.data.len();
        }
        println!(
            "vq on {}: {n_cases} cases, {n_codes} codes bit-exact; the single-division scale \
             127 / absmax would miss {one_division} codes",
            dev.name()
        );
        assert_eq!(n_cases, 30, "every vq case with outputs was checked");
        assert_eq!(
            n_codes, 83_280,
            "vq codes checked (docs/compat.md, LLM.int8)"
        );
        assert_eq!(
            one_division, 9,
            "codes the single-division scale 127 / absmax gets wrong (docs/compat.md, LLM.int8)"
        );
    }
}

#[test]
fn golden_int8_linear_matmul_and_mm_dequant_are_bit_exact() {
    let Some(cases) = load_cases("int8.safetensors") else {
        return;
    };
    for dev in devices() {
        let dev = dev.as_ref();
        let (mut n_cases, mut cuda_form, mut n_out, mut max_k) = (0, 0, 0, 0);
        for (name, case) in cases.iter().filter(|(n, _)| n.starts_with("mm_")) {
            max_k = max_k.max(case.field("x").shape[1]);
            let qa = ops::int8_vectorwise_quant(dev, &case.field("x").host(), 0.0).unwrap();
            assert_same_bytes(&format!("{name}: CA"), &qa.codes, case.field("CA"));
            assert_same_f32s(
                &format!("{name}: SCA"),
                &qa.row_stats,
                &case.field("SCA").f32s(),
            );
            let (cb, scb) = ops::quantize_rowwise_int8(dev, &case.field("W").host()).unwrap();
            assert_same_bytes(&format!("{name}: CB"), &cb, case.field("CB"));
            assert_same_f32s(&format!("{name}: SCB"), &scb, &case.field("SCB").f32s());
            let c = ops::int8_linear_matmul(dev, &qa.codes, &cb).unwrap();
            assert_same_bytes(&format!("{name}: C_int32"), &c, case.field("C_int32"));
            let c = i32_tensor(case.field("C_int32"));
            let (sa, sb) = (case.field("SCA").f32s(), case.field("SCB").f32s());
            let out = ops::int8_mm_dequant(dev, &c, &sa, &sb, None, DType::F16).unwrap();
            assert_same_bytes(&format!("{name}: out"), &out, case.field("out"));
            let bias = case.field("bias").host();
            let out = ops::int8_mm_dequant(dev, &c, &sa, &sb, Some(&bias), DType::F16).unwrap();
            assert_same_bytes(&format!("{name}: out_bias"), &out, case.field("out_bias"));
            cuda_form += cuda_form_mismatches(case);
            n_out += 2 * case.field("out").shape.iter().product::<usize>();
            n_cases += 1;
        }
        println!(
            "mm on {}: {n_cases} cases bit-exact; the CUDA kernel's form would give {cuda_form} \
             different f16 outputs",
            dev.name()
        );
        assert_eq!(n_cases, 9);
        // bnb's CPU i32 product is an f32 matmul, exact for K <= 1040 only.
        assert_eq!(
            max_k, 1000,
            "the largest golden K (docs/compat.md, LLM.int8)"
        );
        assert_eq!(
            n_out, 9_120,
            "golden out / out_bias values (docs/compat.md, LLM.int8)"
        );
        assert_eq!(
            cuda_form, 313,
            "out / out_bias values the CUDA kernel's form gets wrong (docs/compat.md, LLM.int8)"
        );
    }
}

/// `out` and `out_bias` elements of an `mm_` case that bitsandbytes' CUDA formula
/// `f16(fma(C * row * col, 6.200012e-05f, bias))` gets wrong (the CPU path that made the golden
/// data computes `C * (row * col) * 6.200124e-05 + bias`).
fn cuda_form_mismatches(case: &Case) -> usize {
    let c = case.field("C_int32");
    let n = c.shape[1];
    let (sa, sb) = (case.field("SCA").f32s(), case.field("SCB").f32s());
    let bias = case.field("bias").f32s();
    let (out, out_bias) = (case.field("out").f32s(), case.field("out_bias").f32s());
    c.data
        .chunks_exact(4)
        .enumerate()
        .map(|(i, b)| {
            let v = i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f32 * sa[i / n] * sb[i % n];
            let y = |add: f32| half::f16::from_f32(v.mul_add(6.200012e-05, add)).to_f32();
            usize::from(y(0.0) != out[i]) + usize::from(y(bias[i % n]) != out_bias[i])
        })
        .sum()
}

/// Unit roundoff of a dtype (half an ulp of 1).
fn unit_roundoff(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 2f64.powi(-11),
        DType::BF16 => 2f64.powi(-8),
        _ => 2f64.powi(-24),
    }
}

const U32: f64 = 1.0 / 16_777_216.0;

/// Half the smallest subnormal step of a dtype: the absolute rounding error below its normal
/// range.
fn tiny(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 2f64.powi(-25),
        DType::BF16 => 2f64.powi(-134),
        _ => 2f64.powi(-150),
    }
}

/// The decoded weight as the kernels define it (`f32` then rounded to the dtype).
fn round_dt(v: f32, dtype: DType) -> f64 {
    HostTensor::from_f32_as(dtype, vec![1], &[v])
        .unwrap()
        .to_f32()
        .unwrap()[0] as f64
}

/// The stated bound of one mixed-forward output. `t = C*SCA*SCB*K + bias` takes four `f32`
/// roundings (at most `4u|p| + u|t|`, `p` the product), then one rounding to the dtype; the fp
/// part is an `f32` strided sum of `n_o` products (`(ceil(n_o/8) + 3) u sum|x w|`); their sum one
/// `f32` rounding; then one rounding to the dtype.
fn mixed_bound(p: f64, t: f64, fp_abs: f64, n_o: usize, y: f64, dtype: DType) -> f64 {
    let ud = unit_roundoff(dtype);
    let e_t = 5.0 * U32 * (p.abs() + t.abs());
    let e_t = e_t + ud * (t.abs() + e_t) + tiny(dtype);
    let e_fp = (n_o.div_ceil(8) as f64 + 3.0) * U32 * fp_abs;
    let e_sum = e_t + e_fp + U32 * (y.abs() + e_t + e_fp);
    e_sum + ud * (y.abs() + e_sum) + tiny(dtype)
}

/// The mixed cases, with the outputs (of 512) that a single rounding of `t + fp` to the dtype
/// gets wrong, where bitsandbytes rounds twice (`docs/compat.md` and `docs/semantics.md`,
/// LLM.int8).
const MIXED_CASES: [(&str, usize); 2] = [
    ("mixed_bf16_M8_K256_N64_t6", 157),
    ("mixed_f16_M8_K256_N64_t6", 126),
];

/// `x` rounded to nearest even in `dtype` (the `half` crate, independent of the kernels).
fn to_dtype(x: f32, dtype: DType) -> f32 {
    match dtype {
        DType::F16 => half::f16::from_f32(x).to_f32(),
        DType::BF16 => half::bf16::from_f32(x).to_f32(),
        _ => x,
    }
}

/// Outputs of a `mixed_` case that differ from bitsandbytes' `out` when the int8 part
/// `t = (f32(C) * (SCA * SCB)) * 6.200124e-05 + bias` and the fp part (an `f32` sum of
/// `subA * dequant(CB)` over the outlier columns, fused steps into 8 partials, then the halving
/// tree) are (single rounding) added in `f32` and rounded once to the dtype, or (two roundings)
/// added after `t` was rounded to the dtype. All from bitsandbytes' stored `CA`, `CB`, `SCA`,
/// `SCB`, `subA` and bias.
fn rounding_mismatches(case: &Case) -> (usize, usize) {
    let dtype = case.field("x").float_dtype();
    let (ca, cb) = (&case.field("CA"), &case.field("CB"));
    let (m, k, n) = (ca.shape[0], ca.shape[1], cb.shape[0]);
    let (sca, scb) = (case.field("SCA").f32s(), case.field("SCB").f32s());
    let (bias, sub_a) = (case.field("bias").f32s(), case.field("subA").f32s());
    let cols = i64s_as_u32(case.field("outlier_cols"));
    let out = case.field("out").f32s();
    let (mut single, mut two) = (0, 0);
    for i in 0..m {
        for j in 0..n {
            let dot: i32 = (0..k)
                .map(|c| ca.data[i * k + c] as i8 as i32 * cb.data[j * k + c] as i8 as i32)
                .sum();
            let t = (dot as f32 * (sca[i] * scb[j])) * 6.200124e-05 + bias[j];
            let mut p = [-0.0f32; 8];
            for (o, c) in cols.iter().enumerate() {
                let w = to_dtype(
                    (cb.data[j * k + *c as usize] as i8 as f32 * scb[j]) * (1.0f32 / 127.0),
                    dtype,
                );
                p[o % 8] = sub_a[i * cols.len() + o].mul_add(w, p[o % 8]);
            }
            let mut w = 8;
            while w > 1 {
                w /= 2;
                for l in 0..w {
                    p[l] += p[l + w];
                }
            }
            let want = out[i * n + j];
            single += usize::from(!same_f32(to_dtype(t + p[0], dtype), want));
            two += usize::from(!same_f32(to_dtype(to_dtype(t, dtype) + p[0], dtype), want));
        }
    }
    (single, two)
}

#[test]
fn golden_int8_mixed_scaled_mm_matches_bitsandbytes_and_the_bound() {
    let Some(cases) = load_cases("int8.safetensors") else {
        return;
    };
    let mixed: Vec<&str> = cases
        .keys()
        .filter(|n| n.starts_with("mixed_"))
        .map(String::as_str)
        .collect();
    assert_eq!(mixed, MIXED_CASES.map(|(n, _)| n), "the mixed golden cases");
    for (name, single) in MIXED_CASES {
        let (got_single, got_two) = rounding_mismatches(&cases[name]);
        println!(
            "{name}: a single rounding to the dtype differs from bitsandbytes in {got_single} \
             outputs, two roundings in {got_two}"
        );
        assert_eq!(
            (got_single, got_two),
            (single, 0),
            "{name}: (single-rounding, two-rounding) mismatches (docs/compat.md, LLM.int8)"
        );
    }
    let devices = devices();
    let mut report = Vec::new();
    for dev in &devices {
        let dev = dev.as_ref();
        for (name, case) in cases.iter().filter(|(n, _)| n.starts_with("mixed_")) {
            let x = case.field("x").host();
            let dtype = x.dtype;
            let (m, k) = (x.shape[0], x.shape[1]);
            let q = ops::int8_vectorwise_quant(dev, &x, threshold(case)).unwrap();
            assert_same_bytes(&format!("{name}: CA"), &q.codes, case.field("CA"));
            assert_same_f32s(
                &format!("{name}: SCA"),
                &q.row_stats,
                &case.field("SCA").f32s(),
            );
            let cols = q.outlier_cols.clone().unwrap();
            assert_eq!(cols, i64s_as_u32(case.field("outlier_cols")), "{name}");
            // bnb's subA = x[:, outlier_cols]: the fp operand, which our kernel reads from x at
            // our outlier columns (it does not return it).
            let xs = x.to_f32().unwrap();
            let sub_a = case.field("subA");
            assert_eq!(sub_a.shape, [m, cols.len()], "{name}: subA shape");
            let sub_a = sub_a.f32s();
            for i in 0..m {
                for (o, c) in cols.iter().enumerate() {
                    let (ours, theirs) = (xs[i * k + *c as usize], sub_a[i * cols.len() + o]);
                    assert!(
                        same_f32(ours, theirs),
                        "{name}: subA[{i}, {o}] = {theirs:e}, x[{i}, {c}] = {ours:e}"
                    );
                }
            }
            let layer = Linear8bitLt::quantize(
                dev,
                &case.field("W").host(),
                Some(case.field("bias").host()),
                6.0,
            )
            .unwrap();
            assert_same_bytes(&format!("{name}: CB"), &layer.cb, case.field("CB"));
            let n = layer.scb.len();
            let y = ops::int8_mixed_scaled_mm(
                dev,
                &x,
                &q.codes,
                &layer.cb,
                &q.row_stats,
                &layer.scb,
                &cols,
                layer.bias.as_ref(),
            )
            .unwrap();
            let via_layer = layer.forward(dev, &x).unwrap();
            assert_eq!(via_layer, y, "{name}: Linear8bitLt composes the same ops");
            let ys = y.to_f32().unwrap();
            assert_eq!(ys.len(), 512, "{name}: outputs (docs/compat.md)");
            let theirs = case.field("out").f32s();
            let differ = ys
                .iter()
                .zip(&theirs)
                .filter(|(a, b)| !same_f32(**a, **b))
                .count();
            let max_diff = ys
                .iter()
                .zip(&theirs)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            // The f64 evaluation of the documented composition (the fp part on bnb's subA), and
            // the stated bound.
            let (ca, cb) = (&q.codes.data, &layer.cb.data);
            let bias = case.field("bias").f32s();
            let mut worst = 0f64;
            for i in 0..m {
                for j in 0..n {
                    let dot: i64 = (0..k)
                        .map(|c| ca[i * k + c] as i8 as i64 * cb[j * k + c] as i8 as i64)
                        .sum();
                    let p = dot as f64
                        * q.row_stats[i] as f64
                        * layer.scb[j] as f64
                        * MM_DEQUANT_SCALE as f64;
                    let t = p + bias[j] as f64;
                    let (mut fp, mut fp_abs) = (0f64, 0f64);
                    for (o, &c) in cols.iter().enumerate() {
                        let c = c as usize;
                        let w = round_dt(
                            (cb[j * k + c] as i8 as f32 * layer.scb[j]) * DEQUANT_SCALE,
                            dtype,
                        );
                        let a = sub_a[i * cols.len() + o] as f64;
                        fp += a * w;
                        fp_abs += (a * w).abs();
                    }
                    let exact = t + fp;
                    let bound = mixed_bound(p, t, fp_abs, cols.len(), exact, dtype);
                    worst = nan_max([worst, error_ratio(ys[i * n + j] as f64, exact, bound)]);
                }
            }
            report.push(format!(
                "{name} on {}: {differ} of {} outputs differ from bitsandbytes (max |diff| {max_diff:e}); \
                 error / bound vs f64 {worst:.3}",
                dev.name(),
                ys.len()
            ));
            assert_eq!(differ, 0, "{}", report.last().unwrap());
            assert!(worst <= 1.0, "{}", report.last().unwrap());
        }
    }
    println!("{}", report.join("\n"));
    assert_eq!(
        report.len(),
        MIXED_CASES.len() * devices.len(),
        "both mixed cases ran on every device"
    );
}

#[test]
fn golden_int8_mixed_backward_input_stays_within_the_bound() {
    let Some(cases) = load_cases("int8.safetensors") else {
        return;
    };
    let dev = CpuDevice::new().unwrap();
    let mut checked = Vec::new();
    for (name, case) in cases.iter().filter(|(n, _)| n.starts_with("mixed_")) {
        let dtype = case.field("x").float_dtype();
        let cb = i8_tensor(case.field("CB"));
        let scb = case.field("SCB").f32s();
        let (n, k) = (cb.shape[0], cb.shape[1]);
        // dY: bitsandbytes' forward output, a realistic [M, N] gradient in the dtype.
        let dy = case.field("out");
        let m = dy.shape[0];
        let dys = dy.f32s();
        let dx = ops::int8_mixed_scaled_mm_backward_input(&dev, &dy.host(), &cb, &scb)
            .unwrap()
            .to_f32()
            .unwrap();
        assert_eq!(dx.len(), m * k, "{name}: dX elements");
        let mut worst = 0f64;
        for i in 0..m {
            for kk in 0..k {
                let (mut s, mut a) = (0f64, 0f64);
                for nn in 0..n {
                    let w = round_dt(
                        cb.data[nn * k + kk] as i8 as f32 * (scb[nn] * DEQUANT_SCALE),
                        dtype,
                    );
                    s += dys[i * n + nn] as f64 * w;
                    a += (dys[i * n + nn] as f64 * w).abs();
                }
                let e_sum = (n.div_ceil(8) as f64 + 3.0) * U32 * a;
                let bound = e_sum + unit_roundoff(dtype) * (s.abs() + e_sum) + tiny(dtype);
                worst = nan_max([worst, error_ratio(dx[i * k + kk] as f64, s, bound)]);
            }
        }
        println!("{name}: dX error / bound vs f64 {worst:.3}");
        assert!(worst <= 1.0, "{name}: dX error / bound {worst}");
        checked.push(name.as_str());
    }
    assert_eq!(
        checked,
        MIXED_CASES.map(|(n, _)| n),
        "the input gradient was checked on every mixed case"
    );
}

#[test]
fn int8_ops_validate_inputs_with_clear_errors() {
    let dev = InterpreterDevice;
    let err = |r: qforge::runtime::Result<HostTensor>| r.unwrap_err().to_string();
    let x = HostTensor::from_f32(vec![2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
    for bad in [-1.0, f32::NAN, f32::INFINITY] {
        let e = ops::int8_vectorwise_quant(&dev, &x, bad)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("threshold") && e.contains(&bad.to_string()),
            "{e}"
        );
    }
    let ints = HostTensor::new(DType::I32, vec![2, 3], vec![0; 24]).unwrap();
    let e = ops::int8_vectorwise_quant(&dev, &ints, 6.0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("i32") && e.contains("f32, f16 or bf16"), "{e}");
    let empty = HostTensor::from_f32(vec![3, 0], &[]).unwrap();
    let e = ops::quantize_rowwise_int8(&dev, &empty)
        .unwrap_err()
        .to_string();
    assert!(e.contains("empty") && e.contains("[3, 0]"), "{e}");
    let q = ops::int8_vectorwise_quant(&dev, &x, 4.5).unwrap();
    assert_eq!(q.outlier_cols, Some(vec![1, 2]));
    assert_eq!(
        q.codes.data,
        vec![42, 0, 0, 127, 0, 0],
        "outlier columns are zeroed"
    );
    let e = err(ops::int8_vectorwise_dequant(
        &dev,
        &q.codes,
        &[1.0],
        DType::F32,
    ));
    assert!(
        e.contains("stats has 1 values") && e.contains("2 rows"),
        "{e}"
    );
    let e = err(ops::int8_vectorwise_dequant(
        &dev,
        &q.codes,
        &[1.0, 2.0],
        DType::U8,
    ));
    assert!(e.contains("u8"), "{e}");
    let b = HostTensor::new(DType::I8, vec![4, 2], vec![1; 8]).unwrap();
    let e = err(ops::int8_linear_matmul(&dev, &q.codes, &b));
    assert!(
        e.contains("[2, 3]") && e.contains("[4, 2]") && e.contains("K"),
        "{e}"
    );
    let e = err(ops::int8_linear_matmul(&dev, &x, &b));
    assert!(e.contains("A must be i8") && e.contains("f32"), "{e}");
    let c = HostTensor::new(DType::I32, vec![2, 4], vec![0; 32]).unwrap();
    let e = err(ops::int8_mm_dequant(
        &dev,
        &c,
        &[1.0, 1.0],
        &[1.0; 3],
        None,
        DType::F16,
    ));
    assert!(
        e.contains("col_stats has 3 values") && e.contains("4 columns"),
        "{e}"
    );
    let inexact = HostTensor::from_f32(vec![4], &[0.1, 0.0, 0.0, 0.0]).unwrap();
    let e = err(ops::int8_mm_dequant(
        &dev,
        &c,
        &[1.0, 1.0],
        &[1.0; 4],
        Some(&inexact),
        DType::F16,
    ));
    assert!(e.contains("not exactly representable in f16"), "{e}");
    let exact = HostTensor::from_f32(vec![4], &[0.5, -2.0, 0.0, 1.0]).unwrap();
    let y =
        ops::int8_mm_dequant(&dev, &c, &[1.0, 1.0], &[1.0; 4], Some(&exact), DType::F16).unwrap();
    assert_eq!(
        y.to_f32().unwrap(),
        [0.5, -2.0, 0.0, 1.0, 0.5, -2.0, 0.0, 1.0]
    );
    let cb = HostTensor::new(DType::I8, vec![4, 3], vec![1; 12]).unwrap();
    let e = err(ops::int8_mixed_scaled_mm(
        &dev,
        &x,
        &q.codes,
        &cb,
        &[1.0, 1.0],
        &[1.0; 4],
        &[3],
        None,
    ));
    assert!(e.contains("outlier column 3") && e.contains("K = 3"), "{e}");
    let e = err(ops::int8_mixed_scaled_mm(
        &dev,
        &x,
        &q.codes,
        &cb,
        &[1.0, 1.0],
        &[1.0; 2],
        &[1],
        None,
    ));
    assert!(
        e.contains("SCB has 2 values") && e.contains("4 rows"),
        "{e}"
    );
    let e = err(ops::int8_mixed_scaled_mm_backward_input(
        &dev, &x, &cb, &[1.0; 4],
    ));
    assert!(
        e.contains("dY has shape [2, 3]") && e.contains("N = 4"),
        "{e}"
    );
    let e = Linear8bitLt::quantize(&dev, &cb, None, 6.0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("i8") && e.contains("f32, f16 or bf16"), "{e}");
}
