//! The quantized-AdamW kernels on the reference interpreter against an independent host model
//! written here in plain Rust from the adamw4bit README rules (`f32::mul_add` for the `lerp_`
//! fma, linear scans for the table searches, the EDEN sums in torch's AVX2 order spelled out
//! with explicit vectors), over several steps, every scheme, NaN/inf/zero gradients and partial
//! blocks; Philox stochastic rounding is checked bit for bit against the host Philox and
//! statistically against its probabilities. The golden comparison is `tests/optim4.rs`.

use crate::adam::AdamHyper;
use crate::optim4::quant::{DYN4_BITS, NF4_BITS};
use crate::optim4::{MomentScheme, QAdamScalars, QAdamSpec, UniformSource};
use crate::test_util::{bytes, floats, out, round, run};
use qforge_ir::routines::philox::philox4x32_10_host;
use qforge_ir::OwnedArg;
use qforge_ir::{DType, Scalar};

use MomentScheme as S;

fn table(s: S) -> [f32; 16] {
    match s {
        S::Nf4 | S::Nf4Sr => NF4_BITS.map(f32::from_bits),
        _ => DYN4_BITS.map(f32::from_bits),
    }
}

/// Host state of one moment: dequantizable codes (one per element) and absmax per block, or
/// the f32 values.
#[derive(Clone, Debug, PartialEq)]
struct HostMoment {
    codes: Vec<i32>,
    absmax: Vec<f32>,
    values: Vec<f32>,
}

impl HostMoment {
    fn init(s: S, n: usize) -> HostMoment {
        let bs = s.block().max(1) as usize;
        let blocks = n.div_ceil(bs);
        let (code, a) = match s {
            S::Fp32 => (0, 0.0),
            S::Nf4 | S::Nf4Sr => (7, 1e-12),
            S::Dyn4 | S::Dyn4Sr => (0, 1e-12),
            S::Dyn4Nz => (1, 1e-12),
            S::Dyn4NzEden => (1, 0.0),
            S::Linear8 => (0, 1e-8),
        };
        HostMoment {
            codes: vec![code; n],
            absmax: vec![a; blocks],
            values: vec![0.0; n],
        }
    }

    fn get(&self, s: S, i: usize) -> f32 {
        match s {
            S::Fp32 => self.values[i],
            S::Linear8 => (self.codes[i] as f32 / 127.0) * self.absmax[i / 256],
            _ => table(s)[self.codes[i] as usize] * self.absmax[i / 128],
        }
    }

    /// The state as kernel buffers.
    fn buffers(&self, s: S) -> Vec<OwnedArg> {
        let f = |v: &[f32]| OwnedArg::Write(v.iter().flat_map(|x| x.to_le_bytes()).collect());
        match s.bits() {
            32 => vec![f(&self.values)],
            8 => vec![
                OwnedArg::Write(self.codes.iter().map(|c| *c as u8).collect()),
                f(&self.absmax),
            ],
            _ => {
                let packed = self
                    .codes
                    .chunks(2)
                    .map(|p| (p[0] | p.get(1).copied().unwrap_or(0) << 4) as u8)
                    .collect();
                vec![OwnedArg::Write(packed), f(&self.absmax)]
            }
        }
    }
}

/// `hi` = first index with `!(t[hi] < s)` clamped to 15, `lo = max(hi - 1, 0)`.
fn neighbours(t: &[f32; 16], s: f32) -> (usize, usize) {
    let hi = (0..16).find(|&k| t[k] >= s).unwrap_or(15);
    (hi.saturating_sub(1), hi)
}

fn rtn(t: &[f32; 16], s: f32) -> usize {
    let (lo, hi) = neighbours(t, s);
    if (s - t[lo]).abs() < (t[hi] - s).abs() {
        lo
    } else {
        hi
    }
}

fn clamp01(p: f32) -> f32 {
    if p.is_nan() {
        p
    } else {
        p.clamp(0.0, 1.0)
    }
}

/// The torch AVX2 sum of a 128-block of terms (absent terms are -0.0).
fn avx2_sum(x: &[f32; 128]) -> f32 {
    let v = |j: usize, l: usize| x[8 * j + l];
    let mut p = [0f32; 8];
    for (l, pl) in p.iter_mut().enumerate() {
        let a: Vec<f32> = (0..4)
            .map(|k| ((v(k, l) + v(k + 4, l)) + v(k + 8, l)) + v(k + 12, l))
            .collect();
        *pl = ((a[0] + a[1]) + a[2]) + a[3];
    }
    p[1..].iter().fold(p[0], |s, x| s + x)
}

/// Stores `x` (the updated moment of every element) into `st` with scheme `s`; `u(i)` is the
/// uniform of element `i`.
fn store(s: S, st: &mut HostMoment, x: &[f32], c2: f32, eps: f32, u: impl Fn(usize) -> f32) {
    if s == S::Fp32 {
        st.values = x.to_vec();
        return;
    }
    let bs = s.block() as usize;
    for (blk, chunk) in x.chunks(bs).enumerate() {
        let mut amax = 0f32;
        for v in chunk {
            if v.is_nan() || amax.is_nan() {
                amax = f32::NAN;
            } else {
                amax = amax.max(v.abs());
            }
        }
        let floor = s.absmax_floor();
        let amax = if amax.is_nan() { amax } else { amax.max(floor) };
        let t = table(s);
        let mut sq = [-0.0f32; 128];
        let mut dot = [-0.0f32; 128];
        for (j, v) in chunk.iter().enumerate() {
            let i = blk * bs + j;
            let sv = v / amax;
            let code = match s {
                S::Linear8 => {
                    let q = sv * 127.0;
                    let q = if q.is_nan() {
                        q
                    } else {
                        q.clamp(-127.0, 127.0)
                    };
                    if q.is_nan() {
                        0
                    } else {
                        q.round_ties_even() as i32
                    }
                }
                S::Nf4 | S::Dyn4 => rtn(&t, sv) as i32,
                S::Dyn4Nz | S::Dyn4NzEden => rtn(&t, sv).max(1) as i32,
                S::Nf4Sr => {
                    let (lo, hi) = neighbours(&t, sv);
                    let w = t[hi] - t[lo];
                    let p = if w <= 0.0 { 1.0 } else { (t[hi] - sv) / w };
                    if u(i) < clamp01(p) {
                        lo as i32
                    } else {
                        hi as i32
                    }
                }
                S::Dyn4Sr => {
                    let (lo, hi) = neighbours(&t, sv);
                    let f = |y: f32| {
                        let v = (amax * y) / c2;
                        let v = if v.is_nan() { v } else { v.max(0.0) };
                        1.0 / (v.sqrt() + eps)
                    };
                    let (fs, fa, fb) = (f(sv), f(t[lo]), f(t[hi]));
                    let den = fa - fb;
                    let p = (fs - fb) / if den.is_nan() { den } else { den.max(1e-30) };
                    let p = if t[hi] - t[lo] <= 0.0 || den <= 0.0 {
                        1.0
                    } else {
                        p
                    };
                    if u(i) < clamp01(p) {
                        lo as i32
                    } else {
                        hi as i32
                    }
                }
                S::Fp32 => unreachable!(),
            };
            st.codes[i] = code;
            if s == S::Dyn4NzEden {
                sq[j] = sv * sv;
                dot[j] = sv * t[code as usize];
            }
        }
        st.absmax[blk] = if s == S::Dyn4NzEden {
            let d = avx2_sum(&dot);
            let d = if d.is_nan() { d } else { d.max(1e-12) };
            amax * (avx2_sum(&sq) / d)
        } else {
            amax
        };
    }
}

/// One host step; returns nothing, updates `p`, `m1`, `m2`.
#[allow(clippy::too_many_arguments)]
fn model_step(
    spec: &QAdamSpec,
    h: &AdamHyper,
    t: u32,
    p: &mut [f32],
    g: &[f32],
    m1: &mut HostMoment,
    m2: &mut HostMoment,
    u: [&dyn Fn(usize) -> f32; 2],
) {
    let n = p.len();
    let c1 = 1.0 - h.beta1.powf(t as f64);
    let c2 = 1.0 - h.beta2.powf(t as f64);
    let (w1, w2) = ((1.0 - h.beta1) as f32, (1.0 - h.beta2) as f32);
    let mut x1 = vec![0f32; n];
    let mut x2 = vec![0f32; n];
    for i in 0..n {
        let gi = round(spec.dtype, g[i]);
        if !gi.is_finite() {
            continue;
        }
        let a = m1.get(spec.m1, i);
        let b = m2.get(spec.m2, i);
        x1[i] = w1.mul_add(gi - a, a);
        x2[i] = w2.mul_add(gi * gi - b, b);
        let pi = round(spec.dtype, p[i]) * (1.0 - h.lr * h.weight_decay) as f32;
        let den = x2[i].sqrt() / c2.sqrt() as f32 + h.eps as f32;
        p[i] = round(spec.dtype, pi + ((-(h.lr / c1)) as f32 * x1[i]) / den);
    }
    store(spec.m1, m1, &x1, c2 as f32, h.eps as f32, u[0]);
    store(spec.m2, m2, &x2, c2 as f32, h.eps as f32, u[1]);
}

fn hyper() -> AdamHyper {
    AdamHyper {
        lr: 1e-2,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.1,
    }
}

/// Gradients with NaN, inf, zeros, a subnormal and a whole zero block.
fn grads(n: usize, step: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            if (256..384).contains(&i) {
                return 0.0;
            }
            match (i * 7 + step as usize * 3) % 97 {
                0 => f32::NAN,
                1 => f32::INFINITY,
                2 => f32::NEG_INFINITY,
                3 => 0.0,
                4 => -0.0,
                5 => 1e-41,
                _ => (((i * 37 + step as usize * 11) % 101) as f32 * 0.013 - 0.6) * 1e-2,
            }
        })
        .collect()
}

const SEED: u64 = 77 | 5 << 32;
const PARAM_ID: u32 = 5;

fn philox_uniform(e: usize, step: u32, stream: u32) -> f32 {
    // Element e: word e % 2 of the call for the pair e / 2.
    let x = philox4x32_10_host(
        [e as u32 / 2, step, PARAM_ID, stream],
        [SEED as u32, (SEED >> 32) as u32],
    );
    let w = x[e % 2];
    (w >> 8) as f32 * (1.0 / 16_777_216.0)
}

fn buffer_uniform(e: usize, step: u32, stream: u32) -> f32 {
    // Any deterministic [0, 1) values; includes exact 0.
    ((e as u32).wrapping_mul(2_654_435_761) ^ step.wrapping_mul(40_503) ^ stream) as f32
        / 4_294_967_296.0
}

/// Runs `steps` steps of `spec` on the interpreter and of the host model; asserts bit equality
/// of parameters and state after each step.
fn check(spec: QAdamSpec, n: usize, steps: u32) {
    let h = hyper();
    let kernel = spec.build().unwrap();
    qforge_ir::verify(&kernel).unwrap();
    let mut p_host: Vec<f32> = (0..n)
        .map(|i| round(spec.dtype, ((i * 13) % 29) as f32 * 0.07 - 1.0))
        .collect();
    let (mut h1, mut h2) = (HostMoment::init(spec.m1, n), HostMoment::init(spec.m2, n));
    let mut p_bytes = bytes(spec.dtype, &p_host);
    let mut st1 = h1.buffers(spec.m1);
    let mut st2 = h2.buffers(spec.m2);
    let uni = match spec.uniforms {
        UniformSource::Philox => philox_uniform,
        UniformSource::Buffer => buffer_uniform,
    };
    for t in 1..=steps {
        let g = grads(n, t);
        let sc = QAdamScalars::new(&h, t).unwrap();
        let mut args: Vec<OwnedArg> = spec
            .sizes(n as u32)
            .args()
            .into_iter()
            .map(OwnedArg::Scalar)
            .collect();
        args.extend(
            sc.kernel_args(SEED, PARAM_ID, 0)
                .into_iter()
                .map(OwnedArg::Scalar),
        );
        args.push(OwnedArg::Write(p_bytes.clone()));
        args.push(OwnedArg::Read(bytes(spec.dtype, &g)));
        let first_state = args.len();
        args.extend(st1.iter().cloned());
        args.extend(st2.iter().cloned());
        if spec.uniforms == UniformSource::Buffer {
            for (k, m) in [(1u32, spec.m1), (2, spec.m2)] {
                if m.stochastic() {
                    let u: Vec<f32> = (0..n).map(|e| uni(e, t, k)).collect();
                    args.push(OwnedArg::Read(bytes(DType::F32, &u)));
                }
            }
        }
        // Staged: each quantized moment's workspace, stale NaN the kernel must not read.
        if spec.staged {
            for m in [spec.m1, spec.m2] {
                if m != S::Fp32 {
                    args.push(OwnedArg::Write(bytes(DType::F32, &vec![f32::NAN; n])));
                }
            }
        }
        run(&kernel, &mut args);
        let u1 = move |e: usize| uni(e, t, 1);
        let u2 = move |e: usize| uni(e, t, 2);
        model_step(&spec, &h, t, &mut p_host, &g, &mut h1, &mut h2, [&u1, &u2]);
        let ours = floats(spec.dtype, out(&args, first_state - 2));
        for i in 0..n {
            assert!(
                ours[i].to_bits() == p_host[i].to_bits()
                    || (ours[i].is_nan() && p_host[i].is_nan()),
                "{} step {t}: p[{i}] {} vs model {}",
                kernel.name,
                ours[i],
                p_host[i]
            );
        }
        p_bytes = out(&args, first_state - 2).to_vec();
        let l1 = st1.len();
        st1 = args[first_state..first_state + l1].to_vec();
        st2 = args[first_state + l1..first_state + l1 + st2.len()].to_vec();
        for (w, (st, hm, s)) in [(&st1, &h1, spec.m1), (&st2, &h2, spec.m2)]
            .into_iter()
            .enumerate()
        {
            let want = hm.buffers(s);
            for (a, b) in st.iter().zip(&want) {
                let (OwnedArg::Write(a), OwnedArg::Write(b)) = (a, b) else {
                    unreachable!()
                };
                assert!(
                    a == b,
                    "{} step {t}: state of m{} differs",
                    kernel.name,
                    w + 1
                );
            }
        }
    }
}

fn recipes() -> Vec<(S, S)> {
    vec![
        (S::Nf4, S::Dyn4NzEden),
        (S::Nf4, S::Dyn4Sr),
        (S::Nf4, S::Dyn4Nz),
        (S::Nf4, S::Dyn4),
        (S::Linear8, S::Linear8),
        (S::Nf4Sr, S::Fp32),
        (S::Fp32, S::Dyn4Sr),
        (S::Fp32, S::Fp32),
        (S::Nf4, S::Linear8),
        (S::Linear8, S::Dyn4Sr),
    ]
}

/// An f32 recipe with buffer uniforms, plain or staged.
fn buffer_spec(m1: S, m2: S, staged: bool) -> QAdamSpec {
    QAdamSpec {
        m1,
        m2,
        dtype: DType::F32,
        uniforms: UniformSource::Buffer,
        staged,
    }
}

#[test]
fn library_optim4_kernels_match_host_model() {
    for (m1, m2) in recipes() {
        check(buffer_spec(m1, m2, false), 640, 3);
    }
}

#[test]
fn library_optim4_staged_kernels_match_host_model() {
    for (m1, m2) in recipes() {
        let spec = buffer_spec(m1, m2, true);
        assert!(spec.name().ends_with("_staged_ubuf"), "{}", spec.name());
        check(spec, 640, 3);
    }
    for (m1, m2) in [(S::Nf4, S::Dyn4Sr), (S::Nf4Sr, S::Dyn4NzEden)] {
        check(QAdamSpec::new(m1, m2, DType::BF16).staged(), 301, 2);
    }
}

#[test]
fn library_optim4_partial_blocks_bf16_and_philox() {
    for (m1, m2) in [
        (S::Nf4Sr, S::Dyn4Sr),
        (S::Nf4, S::Dyn4NzEden),
        (S::Linear8, S::Dyn4Sr),
    ] {
        for (n, dtype) in [(3, DType::F32), (301, DType::BF16), (513, DType::F16)] {
            check(QAdamSpec::new(m1, m2, dtype), n, 2);
        }
    }
}

#[test]
fn library_optim4_philox_sr_is_unbiased_in_its_space() {
    // One step from zero state with a constant-magnitude spread of gradients: count how often
    // each stochastic element takes its lower code and compare with the sum of P_lo.
    let n = 4096;
    let spec = QAdamSpec::new(S::Nf4Sr, S::Dyn4Sr, DType::F32);
    let h = hyper();
    let kernel = spec.build().unwrap();
    let g: Vec<f32> = (0..n)
        .map(|i| ((i * 7919) % 1000) as f32 * 1e-3 - 0.5)
        .collect();
    let (h1, h2) = (HostMoment::init(spec.m1, n), HostMoment::init(spec.m2, n));
    let sc = QAdamScalars::new(&h, 1).unwrap();
    let mut args: Vec<OwnedArg> = spec
        .sizes(n as u32)
        .args()
        .into_iter()
        .map(OwnedArg::Scalar)
        .collect();
    args.extend(
        sc.kernel_args(SEED, PARAM_ID, 0)
            .into_iter()
            .map(OwnedArg::Scalar),
    );
    args.push(OwnedArg::Write(bytes(DType::F32, &vec![0.5; n])));
    args.push(OwnedArg::Read(bytes(DType::F32, &g)));
    let s1 = args.len();
    args.extend(h1.buffers(spec.m1));
    args.extend(h2.buffers(spec.m2));
    run(&kernel, &mut args);
    let w1 = (1.0 - h.beta1) as f32;
    let w2 = (1.0 - h.beta2) as f32;
    let c2 = (1.0 - h.beta2) as f32;
    let eps = h.eps as f32;
    for (k, (scheme, x)) in [
        (S::Nf4Sr, g.iter().map(|v| w1 * v).collect::<Vec<f32>>()),
        (S::Dyn4Sr, g.iter().map(|v| w2 * (v * v)).collect()),
    ]
    .into_iter()
    .enumerate()
    {
        let codes = out(&args, s1 + 2 * k);
        let absmax = floats(DType::F32, out(&args, s1 + 2 * k + 1));
        let t = table(scheme);
        let (mut expect, mut var, mut got) = (0f64, 0f64, 0f64);
        for i in 0..n {
            let a = absmax[i / 128];
            let s = x[i] / a;
            let (lo, hi) = neighbours(&t, s);
            let f = |y: f32| 1.0 / (((a * y) / c2).max(0.0).sqrt() + eps);
            let p = match scheme {
                S::Nf4Sr if t[hi] > t[lo] => (t[hi] - s) / (t[hi] - t[lo]),
                S::Dyn4Sr if t[hi] > t[lo] && f(t[lo]) > f(t[hi]) => {
                    (f(s) - f(t[hi])) / (f(t[lo]) - f(t[hi]))
                }
                _ => 1.0,
            };
            let p = clamp01(p) as f64;
            let c = ((codes[i / 2] >> (4 * (i % 2))) & 15) as usize;
            assert!(
                c == lo || c == hi,
                "element {i}: code {c} not in {{{lo}, {hi}}}"
            );
            if lo != hi {
                expect += p;
                var += p * (1.0 - p);
                got += f64::from(u8::from(c == lo));
            }
        }
        let z = (got - expect) / var.sqrt().max(1.0);
        assert!(
            z.abs() < 5.0,
            "{scheme}: {got} lower codes, expected {expect} (z = {z})"
        );
        assert!(
            var > 50.0,
            "{scheme}: the test must exercise randomness ({var})"
        );
    }
}

#[test]
fn library_optim4_bad_requests_name_the_value() {
    let e = QAdamSpec::new(S::Dyn4, S::Dyn4, DType::F32)
        .build()
        .unwrap_err()
        .to_string();
    assert!(e.contains("dyn4") && e.contains("nf4_sr"), "{e}");
    let e = QAdamSpec::new(S::Nf4, S::Nf4Sr, DType::F32)
        .build()
        .unwrap_err()
        .to_string();
    assert!(e.contains("nf4_sr") && e.contains("dyn4_nz_eden"), "{e}");
    let e = QAdamSpec::new(S::Nf4, S::Dyn4, DType::U8)
        .build()
        .unwrap_err()
        .to_string();
    assert!(e.contains("u8"), "{e}");
    let e = MomentScheme::parse("int3").unwrap_err().to_string();
    assert!(e.contains("int3") && e.contains("dyn4_sr"), "{e}");
    assert_eq!(MomentScheme::parse("linear").unwrap(), S::Linear8);
    assert_eq!(
        MomentScheme::parse("dyn4_upd_sr_fp32read").unwrap(),
        S::Dyn4Sr
    );
    assert!(QAdamScalars::new(&hyper(), 0).is_err());
    // The small-tensor rule.
    assert_eq!(S::Nf4.effective(4096), S::Nf4);
    assert_eq!(S::Nf4.effective(4095), S::Fp32);
    assert_eq!(S::Nf4.effective(4096 + 64), S::Fp32);
    assert_eq!(S::Linear8.effective(4096 + 128), S::Fp32);
    assert_eq!(S::Linear8.effective(8192), S::Linear8);
    let _ = Scalar::U32(0);
}
