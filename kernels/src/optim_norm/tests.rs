//! LAMB and LARS kernels on the reference interpreter against an independent host model written
//! here in plain Rust (`f32::mul_add` for `fma`, the pinned order of the partial sums written
//! out as loops), bit for bit over several steps; the model's scale is also checked against a
//! plain `f64` evaluation of bitsandbytes' formula, and `max_unorm = 0` against the AdamW / SGD
//! kernels.
#![allow(clippy::needless_range_loop)] // element-wise models index several arrays

use crate::adam::{AdamHyper, OptimAlgo, OptimSpec, StateBits};
use crate::optim1::{Optim1Algo, Optim1Hyper, Optim1Spec};
use crate::optim_ext::OptimExtSpec;
use crate::optim_norm::{LambHyper, LarsHyper, NormRule, OptimNormSpec};
use crate::test_util::{bytes, floats, out, round, run};
use qforge_ir::OwnedArg;
use qforge_ir::{DType, Scalar};

const BS: usize = 256;

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    bytes(DType::F32, v)
}

pub(crate) fn u32a(v: usize) -> OwnedArg {
    OwnedArg::Scalar(Scalar::U32(v as u32))
}

/// Model of the per-block sum of squares: 8 partials from `-0.0`, element `i` of the block
/// into partial `i % 8` with `fma(x, x, partial)`, then the halving tree.
pub(crate) fn block_sum_sq(x: &[f32]) -> f32 {
    let mut acc = [-0.0f32; 8];
    for (i, v) in x.iter().enumerate() {
        acc[i % 8] = v.mul_add(*v, acc[i % 8]);
    }
    let mut w = 8;
    while w > 1 {
        w /= 2;
        for j in 0..w {
            acc[j] += acc[j + w];
        }
    }
    acc[0]
}

/// Model of the scale kernel: sequential sums from `-0.0`, square roots, the threshold.
fn scale_model(up: &[f32], pp: &[f32], max_unorm: f32, eps: f32) -> f32 {
    let su = up.iter().fold(-0.0f32, |a, x| a + x);
    let sp = pp.iter().fold(-0.0f32, |a, x| a + x);
    let (unorm, pnorm) = (su.sqrt(), sp.sqrt());
    let thr = max_unorm * pnorm + eps;
    if max_unorm > 0.0 && unorm > thr {
        thr / unorm
    } else {
        1.0
    }
}

struct Lamb32 {
    p: Vec<f32>,
    m: Vec<f32>,
    v: Vec<f32>,
}

/// The `_gs` options of a step: `gnorm_scale` and `skip_zeros`.
#[derive(Clone, Copy)]
struct Gs {
    scale: f32,
    skip: bool,
}

/// One LAMB step of the model; returns the scale it used.
fn lamb_model(st: &mut Lamb32, g: &[f32], h: &LambHyper, t: u32, dtype: DType) -> f32 {
    lamb_model_gs(st, g, h, t, dtype, None)
}

/// One LAMB step of the model with `_gs` options: every `g` is `g * gnorm_scale` (one `f32`
/// product); a skipped element (scaled `g == 0`) keeps `p`, `m`, `v` but still counts in the
/// norm.
fn lamb_model_gs(
    st: &mut Lamb32,
    graw: &[f32],
    h: &LambHyper,
    t: u32,
    dtype: DType,
    gs: Option<Gs>,
) -> f32 {
    let g: Vec<f32> = graw
        .iter()
        .map(|x| gs.map_or(*x, |o| *x * o.scale))
        .collect();
    let skip = |x: f32| gs.is_some_and(|o| o.skip) && x == 0.0;
    let (b1, b2) = (h.beta1 as f32, h.beta2 as f32);
    let (o1, o2) = ((1.0 - h.beta1) as f32, (1.0 - h.beta2) as f32);
    let ti = t as i32;
    let c1 = 1.0 - h.beta1.powi(ti);
    let c2sq = 1.0 - h.beta2.powi(ti);
    let (ic1, ic2) = ((1.0 / c1) as f32, (1.0 / c2sq) as f32);
    let step_size = (-h.lr * c2sq.sqrt() / c1) as f32;
    let eps_c2 = (h.eps * c2sq.sqrt()) as f32;
    let decay = (1.0 - h.lr * h.weight_decay) as f32;
    let n = g.len();
    let mut u = vec![0.0f32; n];
    let mut nm = vec![0.0f32; n];
    let mut nv = vec![0.0f32; n];
    for i in 0..n {
        let gi = g[i];
        let m = gi.mul_add(o1, st.m[i] * b1);
        let v = (o2 * gi).mul_add(gi, st.v[i] * b2);
        if gi.is_finite() {
            nm[i] = m;
            nv[i] = v;
            u[i] = (m * ic1) / ((v * ic2).sqrt() + h.eps as f32);
        }
    }
    let up: Vec<f32> = u.chunks(BS).map(block_sum_sq).collect();
    let pp: Vec<f32> = st.p.chunks(BS).map(block_sum_sq).collect();
    let scale = scale_model(&up, &pp, h.max_unorm as f32, 0.0);
    let ss = scale * step_size;
    for i in 0..n {
        if skip(g[i]) {
            nm[i] = st.m[i];
            nv[i] = st.v[i];
        } else if g[i].is_finite() {
            let r = nm[i] / (nv[i].sqrt() + eps_c2);
            st.p[i] = round(dtype, r.mul_add(ss, st.p[i] * decay));
        }
    }
    st.m = nm;
    st.v = nv;
    scale
}

/// One LAMB step on the interpreter (partials, scale, update); returns the scale.
fn lamb_kernels(st: &mut Lamb32, g: &[f32], h: &LambHyper, t: u32, dtype: DType) -> f32 {
    lamb_kernels_gs(st, g, h, t, dtype, None)
}

/// `spec` built plain, or its `_gs` variant with the options' scalars for `gs`.
fn build_gs(spec: OptimNormSpec, gs: Option<Gs>) -> (qforge_ir::Kernel, Vec<OwnedArg>) {
    match gs {
        None => (spec.build().unwrap(), Vec::new()),
        Some(o) => {
            let ext = OptimExtSpec::Norm(spec);
            let extra = ext.ext_args(o.scale, o.skip);
            let k = ext.build().unwrap();
            (k, extra.into_iter().map(OwnedArg::Scalar).collect())
        }
    }
}

/// [`lamb_kernels`] through the `_gs` variants for `Some` options.
fn lamb_kernels_gs(
    st: &mut Lamb32,
    g: &[f32],
    h: &LambHyper,
    t: u32,
    dtype: DType,
    gs: Option<Gs>,
) -> f32 {
    let n = g.len();
    let nb = n.div_ceil(BS);
    let s = h.scalars(t).unwrap();
    let rule = NormRule::Lamb;
    let (part, extra) = build_gs(OptimNormSpec::Partials { rule, dtype }, gs);
    let k = extra.len();
    let mut args = vec![u32a(n), u32a(nb)];
    args.extend(s.partials_args().into_iter().map(OwnedArg::Scalar));
    args.extend(extra);
    args.extend([
        OwnedArg::Read(bytes(dtype, &st.p)),
        OwnedArg::Read(bytes(dtype, g)),
        OwnedArg::Read(f32_bytes(&st.m)),
        OwnedArg::Read(f32_bytes(&st.v)),
        OwnedArg::Write(vec![0; 4 * nb]),
        OwnedArg::Write(vec![0; 4 * nb]),
    ]);
    run(&part, &mut args);
    let (up, pp) = (out(&args, 13 + k).to_vec(), out(&args, 14 + k).to_vec());
    let scale = run_scale(up, pp, nb, s.scale_args());
    let (upd, extra) = build_gs(OptimNormSpec::Update { rule, dtype }, gs);
    let k = extra.len();
    let mut args = vec![u32a(n), u32a(nb)];
    args.extend(s.update_args().into_iter().map(OwnedArg::Scalar));
    args.extend(extra);
    args.extend([
        OwnedArg::Write(bytes(dtype, &st.p)),
        OwnedArg::Read(bytes(dtype, g)),
        OwnedArg::Write(f32_bytes(&st.m)),
        OwnedArg::Write(f32_bytes(&st.v)),
        OwnedArg::Read(f32_bytes(&[scale])),
    ]);
    run(&upd, &mut args);
    st.p = floats(dtype, out(&args, 9 + k));
    st.m = floats(DType::F32, out(&args, 11 + k));
    st.v = floats(DType::F32, out(&args, 12 + k));
    scale
}

fn run_scale(up: Vec<u8>, pp: Vec<u8>, nb: usize, tail: Vec<Scalar>) -> f32 {
    let k = OptimNormSpec::Scale.build().unwrap();
    let mut args = vec![u32a(nb)];
    args.extend(tail.into_iter().map(OwnedArg::Scalar));
    args.extend([
        OwnedArg::Read(up),
        OwnedArg::Read(pp),
        OwnedArg::Write(vec![0; 4]),
    ]);
    run(&k, &mut args);
    floats(DType::F32, out(&args, 5))[0]
}

/// Deterministic values in about `[-amp, amp]`.
pub(crate) fn wave(n: usize, seed: u32, amp: f32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let x = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8;
            (x as f32 / (1u32 << 24) as f32 * 2.0 - 1.0) * amp
        })
        .collect()
}

/// The gradient of step `t` with non-finite and special elements.
fn grad(n: usize, t: u32) -> Vec<f32> {
    let mut g = wave(n, 77 + t, 0.5);
    g[1] = f32::NAN;
    g[n / 2] = f32::INFINITY;
    g[n - 1] = -0.0;
    g[3] = 1e-41;
    g
}

/// `bitsandbytes`' scale in `f64` from the model's moments (before the step).
fn lamb_scale_f64(st: &Lamb32, g: &[f32], h: &LambHyper, t: u32) -> f64 {
    let ti = t as i32;
    let (c1, c2) = (1.0 - h.beta1.powi(ti), 1.0 - h.beta2.powi(ti));
    let (mut su, mut sp) = (0.0f64, 0.0f64);
    for i in 0..g.len() {
        let gi = g[i] as f64;
        sp += (st.p[i] as f64).powi(2);
        if !g[i].is_finite() {
            continue;
        }
        let m = h.beta1 * st.m[i] as f64 + (1.0 - h.beta1) * gi;
        let v = h.beta2 * st.v[i] as f64 + (1.0 - h.beta2) * gi * gi;
        su += ((m / c1) / ((v / c2).sqrt() + h.eps)).powi(2);
    }
    let (unorm, pnorm) = (su.sqrt(), sp.sqrt());
    if unorm > h.max_unorm * pnorm {
        h.max_unorm * pnorm / unorm
    } else {
        1.0
    }
}

fn check_lamb(h: LambHyper, n: usize, p0: Vec<f32>, dtype: DType, steps: u32) -> Vec<f32> {
    let mk = || Lamb32 {
        p: p0.iter().map(|x| round(dtype, *x)).collect(),
        m: vec![0.0; n],
        v: vec![0.0; n],
    };
    let (mut a, mut b) = (mk(), mk());
    let mut scales = Vec::new();
    for t in 1..=steps {
        let g: Vec<f32> = grad(n, t).iter().map(|x| round(dtype, *x)).collect();
        let want64 = lamb_scale_f64(&a, &g, &h, t);
        let sa = lamb_model(&mut a, &g, &h, t, dtype);
        let sb = lamb_kernels(&mut b, &g, &h, t, dtype);
        assert_eq!(
            sa.to_bits(),
            sb.to_bits(),
            "scale at step {t}: {sa} vs {sb}"
        );
        let rel = ((sa as f64 - want64) / want64).abs();
        assert!(rel < 1e-5, "scale {sa} vs f64 {want64} at step {t}");
        for (name, x, y) in [("p", &a.p, &b.p), ("m", &a.m, &b.m), ("v", &a.v, &b.v)] {
            for i in 0..n {
                assert_eq!(x[i].to_bits(), y[i].to_bits(), "{name}[{i}] step {t}");
            }
        }
        scales.push(sa);
    }
    // The non-finite gradient elements left their parameters alone (g[1] is NaN every step).
    assert_eq!(b.p[1].to_bits(), round(dtype, p0[1]).to_bits());
    scales
}

#[test]
fn lamb_kernels_match_the_host_model_with_and_without_clipping() {
    let n = 3 * BS + 37;
    // Large parameters: |u| (about sqrt(n)) is far below max_unorm * |p|: no clipping.
    let big = wave(n, 5, 40.0);
    let h = LambHyper {
        weight_decay: 0.01,
        ..LambHyper::default()
    };
    let s = check_lamb(h, n, big, DType::F32, 4);
    assert!(s.iter().all(|x| *x == 1.0), "{s:?}");
    // Small parameters: the update norm exceeds |p|: clipped (scale < 1).
    let small = wave(n, 9, 0.01);
    let s = check_lamb(LambHyper::default(), n, small.clone(), DType::F32, 4);
    assert!(s.iter().all(|x| *x < 1.0 && *x > 0.0), "{s:?}");
    // bf16 parameters, clipped.
    let s = check_lamb(LambHyper::default(), n, small, DType::BF16, 3);
    assert!(s.iter().all(|x| *x < 1.0), "{s:?}");
}

#[test]
fn lamb_zero_parameter_norm_freezes_the_parameter_but_not_the_state() {
    let n = BS + 5;
    let h = LambHyper::default();
    let mut st = Lamb32 {
        p: vec![0.0; n],
        m: vec![0.0; n],
        v: vec![0.0; n],
    };
    let g = grad(n, 1);
    let s = lamb_kernels(&mut st, &g, &h, 1, DType::F32);
    assert_eq!(s, 0.0, "max_unorm * 0 / unorm");
    assert!(st.p.iter().all(|x| x.to_bits() == 0), "parameters stay +0");
    assert!(st.m[0] != 0.0, "moments still update");
    // All-zero gradient too: unorm = 0 is not above 0, scale 1.
    let mut st = Lamb32 {
        p: vec![0.0; n],
        m: vec![0.0; n],
        v: vec![0.0; n],
    };
    assert_eq!(lamb_kernels(&mut st, &vec![0.0; n], &h, 1, DType::F32), 1.0);
}

#[test]
fn lamb_with_max_unorm_zero_is_adamw32() {
    let n = 2 * BS + 3;
    let h = LambHyper {
        weight_decay: 0.02,
        max_unorm: 0.0,
        ..LambHyper::default()
    };
    let mut st = Lamb32 {
        p: wave(n, 3, 0.01),
        m: wave(n, 4, 0.1),
        v: wave(n, 5, 0.1).iter().map(|x| x.abs()).collect(),
    };
    let (p0, m0, v0) = (st.p.clone(), st.m.clone(), st.v.clone());
    let g = grad(n, 2);
    assert_eq!(lamb_kernels(&mut st, &g, &h, 2, DType::F32), 1.0);
    let spec = OptimSpec {
        algo: OptimAlgo::AdamW,
        state: StateBits::Bits32,
        dtype: DType::F32,
    };
    let a = AdamHyper {
        weight_decay: 0.02,
        ..AdamHyper::default()
    };
    let k = spec.build().unwrap();
    let mut args = vec![u32a(n), u32a(n.div_ceil(BS))];
    args.extend(
        a.scalars(&spec, 2)
            .unwrap()
            .kernel_args(&spec)
            .into_iter()
            .map(OwnedArg::Scalar),
    );
    args.extend([
        OwnedArg::Write(f32_bytes(&p0)),
        OwnedArg::Read(f32_bytes(&g)),
        OwnedArg::Write(f32_bytes(&m0)),
        OwnedArg::Write(f32_bytes(&v0)),
    ]);
    run(&k, &mut args);
    assert_eq!(out(&args, 9), f32_bytes(&st.p).as_slice());
    assert_eq!(out(&args, 11), f32_bytes(&st.m).as_slice());
    assert_eq!(out(&args, 12), f32_bytes(&st.v).as_slice());
}

/// One LARS step of the model; returns the scale.
fn lars_model(p: &mut [f32], s: &mut [f32], g: &[f32], h: &LarsHyper, t: u32) -> f32 {
    lars_model_gs(p, s, g, h, t, None)
}

/// One LARS step of the model with `_gs` options: every `g` is `g * gnorm_scale`; a skipped
/// element (scaled `g` after coupled weight decay `== 0`) keeps `p` and `s` but still counts
/// in the norm.
fn lars_model_gs(
    p: &mut [f32],
    s: &mut [f32],
    graw: &[f32],
    h: &LarsHyper,
    t: u32,
    gs: Option<Gs>,
) -> f32 {
    let g: Vec<f32> = graw
        .iter()
        .map(|x| gs.map_or(*x, |o| *x * o.scale))
        .collect();
    let skip_on = gs.is_some_and(|o| o.skip);
    let (mom, wd, neg_lr) = (h.momentum as f32, h.weight_decay as f32, (-h.lr) as f32);
    let n = g.len();
    let u: Vec<f32> = (0..n)
        .map(|i| {
            let raw = if t == 1 {
                g[i]
            } else {
                s[i].mul_add(mom, g[i])
            };
            if g[i].is_finite() {
                raw
            } else {
                0.0
            }
        })
        .collect();
    let up: Vec<f32> = u.chunks(BS).map(block_sum_sq).collect();
    let pp: Vec<f32> = p.chunks(BS).map(block_sum_sq).collect();
    let scale = scale_model(&up, &pp, h.max_unorm as f32, 0.0);
    let nls = neg_lr * scale;
    for i in 0..n {
        if !g[i].is_finite() {
            s[i] = 0.0;
            continue;
        }
        let gw = if wd > 0.0 {
            p[i].mul_add(wd, g[i])
        } else {
            g[i]
        };
        if skip_on && gw == 0.0 {
            continue;
        }
        s[i] = if t == 1 { gw } else { s[i].mul_add(mom, gw) };
        p[i] = nls.mul_add(s[i], p[i]);
    }
    scale
}

/// One LARS step on the interpreter; returns the scale.
fn lars_kernels(p: &mut Vec<f32>, s: &mut Vec<f32>, g: &[f32], h: &LarsHyper, t: u32) -> f32 {
    lars_kernels_gs(p, s, g, h, t, None)
}

/// [`lars_kernels`] through the `_gs` variants for `Some` options.
fn lars_kernels_gs(
    p: &mut Vec<f32>,
    s: &mut Vec<f32>,
    g: &[f32],
    h: &LarsHyper,
    t: u32,
    gs: Option<Gs>,
) -> f32 {
    let n = g.len();
    let nb = n.div_ceil(BS);
    let sc = h.scalars(t).unwrap();
    let spec = |partials| {
        let (rule, dtype) = (NormRule::Lars, DType::F32);
        if partials {
            OptimNormSpec::Partials { rule, dtype }
        } else {
            OptimNormSpec::Update { rule, dtype }
        }
    };
    let (kp, extra) = build_gs(spec(true), gs);
    let k = extra.len();
    let mut args = vec![u32a(n), u32a(nb)];
    args.extend(sc.partials_args().into_iter().map(OwnedArg::Scalar));
    args.extend(extra);
    args.extend([
        OwnedArg::Read(f32_bytes(p)),
        OwnedArg::Read(f32_bytes(g)),
        OwnedArg::Read(f32_bytes(s)),
        OwnedArg::Write(vec![0; 4 * nb]),
        OwnedArg::Write(vec![0; 4 * nb]),
    ]);
    run(&kp, &mut args);
    let scale = run_scale(
        out(&args, 7 + k).to_vec(),
        out(&args, 8 + k).to_vec(),
        nb,
        sc.scale_args(),
    );
    let (ku, extra) = build_gs(spec(false), gs);
    let k = extra.len();
    let mut args = vec![u32a(n), u32a(nb)];
    args.extend(sc.update_args().into_iter().map(OwnedArg::Scalar));
    args.extend(extra);
    args.extend([
        OwnedArg::Write(f32_bytes(p)),
        OwnedArg::Read(f32_bytes(g)),
        OwnedArg::Write(f32_bytes(s)),
        OwnedArg::Read(f32_bytes(&[scale])),
    ]);
    run(&ku, &mut args);
    *p = floats(DType::F32, out(&args, 6 + k));
    *s = floats(DType::F32, out(&args, 8 + k));
    scale
}

#[test]
fn lars_kernels_match_the_host_model_with_and_without_clipping() {
    let n = 2 * BS + 100;
    for (amp, wd, clipped) in [(500.0f32, 0.0, false), (1.0, 0.01, true)] {
        let h = LarsHyper {
            weight_decay: wd,
            ..LarsHyper::default()
        };
        let (mut pa, mut sa) = (wave(n, 11, amp), vec![0.0f32; n]);
        let (mut pb, mut sb) = (pa.clone(), sa.clone());
        for t in 1..=4 {
            let g = grad(n, t);
            let x = lars_model(&mut pa, &mut sa, &g, &h, t);
            let y = lars_kernels(&mut pb, &mut sb, &g, &h, t);
            assert_eq!(x.to_bits(), y.to_bits(), "scale step {t}");
            assert_eq!(x < 1.0, clipped, "scale {x} at step {t}");
            for i in 0..n {
                assert_eq!(pa[i].to_bits(), pb[i].to_bits(), "p[{i}] step {t}");
                assert_eq!(sa[i].to_bits(), sb[i].to_bits(), "s[{i}] step {t}");
            }
        }
    }
}

#[test]
fn lars_with_max_unorm_zero_is_sgd32() {
    let n = BS + 9;
    let h = LarsHyper {
        weight_decay: 0.01,
        max_unorm: 0.0,
        ..LarsHyper::default()
    };
    let (mut p, mut s) = (wave(n, 1, 0.01), wave(n, 2, 0.3));
    let (p0, s0) = (p.clone(), s.clone());
    let g = grad(n, 3);
    assert_eq!(lars_kernels(&mut p, &mut s, &g, &h, 3), 1.0);
    let spec = Optim1Spec {
        algo: Optim1Algo::Sgd,
        state: StateBits::Bits32,
        dtype: DType::F32,
    };
    let sh = Optim1Hyper {
        lr: h.lr,
        beta1: h.momentum,
        weight_decay: h.weight_decay,
        ..Optim1Hyper::defaults(Optim1Algo::Sgd)
    };
    let mut args = vec![u32a(n), u32a(n.div_ceil(BS))];
    args.extend(
        sh.scalars(Optim1Algo::Sgd, 3)
            .unwrap()
            .kernel_args()
            .into_iter()
            .map(OwnedArg::Scalar),
    );
    args.extend([
        OwnedArg::Write(f32_bytes(&p0)),
        OwnedArg::Read(f32_bytes(&g)),
        OwnedArg::Write(f32_bytes(&s0)),
    ]);
    run(&spec.build().unwrap(), &mut args);
    assert_eq!(out(&args, 12), f32_bytes(&p).as_slice());
    assert_eq!(out(&args, 14), f32_bytes(&s).as_slice());
}

#[test]
fn scale_kernel_edge_cases() {
    let up = |v: &[f32]| f32_bytes(v);
    let s = |u: &[f32], p: &[f32], mu: f32| {
        run_scale(
            up(u),
            up(p),
            u.len(),
            vec![Scalar::f32(mu), Scalar::f32(0.0)],
        )
    };
    // |u| = 5, |p| = 2: threshold 2 -> 0.4; max_unorm 3 -> threshold 6 -> 1.
    assert_eq!(s(&[9.0, 16.0], &[4.0, 0.0], 1.0), 0.4);
    assert_eq!(s(&[9.0, 16.0], &[4.0, 0.0], 3.0), 1.0);
    assert_eq!(s(&[9.0, 16.0], &[4.0, 0.0], 0.0), 1.0, "off");
    // Infinite update norm: scale 0; NaN anywhere: the comparison fails, scale 1.
    assert_eq!(s(&[f32::INFINITY], &[1.0], 1.0), 0.0);
    assert_eq!(s(&[f32::NAN], &[1.0], 1.0), 1.0);
    assert_eq!(s(&[1.0], &[f32::NAN], 1.0), 1.0);
    // Hyperparameter checks.
    let e = LarsHyper {
        momentum: 0.0,
        ..LarsHyper::default()
    }
    .check()
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("momentum") && e.contains("without momentum"),
        "{e}"
    );
    let e = LambHyper {
        max_unorm: -1.0,
        ..LambHyper::default()
    }
    .scalars(1)
    .unwrap_err()
    .to_string();
    assert!(e.contains("max_unorm"), "{e}");
    assert!(LambHyper::default().scalars(0).is_err());
    let e = OptimNormSpec::Update {
        rule: NormRule::Lars,
        dtype: DType::BF16,
    }
    .build()
    .unwrap_err()
    .to_string();
    assert!(e.contains("lars32_bf16") && e.contains("f32"), "{e}");
}

/// The gradient of step `t` with exact zeros (every 13th element from `5 + t`, so they move
/// each step; `-0.0` at even indices) besides the special elements of [`grad`].
fn grad_zeros(n: usize, t: u32) -> Vec<f32> {
    let mut g = grad(n, t);
    for i in (5 + t as usize..n).step_by(13) {
        g[i] = if i % 2 == 0 { -0.0 } else { 0.0 };
    }
    g
}

#[test]
fn lamb_gs_kernels_match_the_host_model() {
    let n = 2 * BS + 41;
    for (dtype, gscale, skip) in [
        (DType::F32, 0.375f32, true),
        (DType::F32, 0.8, false),
        (DType::BF16, 0.375, true),
    ] {
        let gs = Some(Gs {
            scale: gscale,
            skip,
        });
        let h = LambHyper {
            weight_decay: 0.01,
            ..LambHyper::default()
        };
        let p0: Vec<f32> = wave(n, 9, 0.01).iter().map(|x| round(dtype, *x)).collect();
        let mk = || Lamb32 {
            p: p0.clone(),
            m: vec![0.0; n],
            v: vec![0.0; n],
        };
        let (mut a, mut b, mut plain, mut noskip) = (mk(), mk(), mk(), mk());
        for t in 1..=3 {
            let g: Vec<f32> = grad_zeros(n, t).iter().map(|x| round(dtype, *x)).collect();
            let no = Some(Gs {
                scale: gscale,
                skip: false,
            });
            lamb_model_gs(&mut noskip, &g, &h, t, dtype, no);
            let sa = lamb_model_gs(&mut a, &g, &h, t, dtype, gs);
            let sb = lamb_kernels_gs(&mut b, &g, &h, t, dtype, gs);
            let sp = lamb_kernels(&mut plain, &g, &h, t, dtype);
            assert_eq!(sa.to_bits(), sb.to_bits(), "{dtype} scale step {t}");
            assert!(sa < 1.0, "clipped: {sa}");
            assert_ne!(
                sa.to_bits(),
                sp.to_bits(),
                "the scaled gradient must matter"
            );
            for (name, x, y) in [("p", &a.p, &b.p), ("m", &a.m, &b.m), ("v", &a.v, &b.v)] {
                for i in 0..n {
                    assert_eq!(
                        x[i].to_bits(),
                        y[i].to_bits(),
                        "{dtype} {name}[{i}] step {t}"
                    );
                }
            }
        }
        // Skipping must change the result (the test can fail).
        assert_eq!(a.m != noskip.m && a.p != noskip.p, skip, "{dtype}");
    }
}

#[test]
fn lars_gs_kernels_match_the_host_model() {
    let n = 2 * BS + 41;
    for (wd, gscale, skip) in [
        (0.0, 0.375f32, true),
        (0.01, 0.375, true),
        (0.0, 0.8, false),
    ] {
        let gs = Some(Gs {
            scale: gscale,
            skip,
        });
        let h = LarsHyper {
            weight_decay: wd,
            ..LarsHyper::default()
        };
        let (mut pa, mut sa) = (wave(n, 11, 1.0), vec![0.0f32; n]);
        let (mut pb, mut sb) = (pa.clone(), sa.clone());
        let (mut pc, mut sc) = (pa.clone(), sa.clone());
        let (mut pd, mut sd) = (pa.clone(), sa.clone());
        for t in 1..=3 {
            let g = grad_zeros(n, t);
            let no = Some(Gs {
                scale: gscale,
                skip: false,
            });
            lars_model_gs(&mut pd, &mut sd, &g, &h, t, no);
            let x = lars_model_gs(&mut pa, &mut sa, &g, &h, t, gs);
            let y = lars_kernels_gs(&mut pb, &mut sb, &g, &h, t, gs);
            let z = lars_kernels(&mut pc, &mut sc, &g, &h, t);
            assert_eq!(x.to_bits(), y.to_bits(), "scale step {t}");
            assert!(x < 1.0, "clipped: {x}");
            assert_ne!(x.to_bits(), z.to_bits(), "the scaled gradient must matter");
            for i in 0..n {
                assert_eq!(pa[i].to_bits(), pb[i].to_bits(), "p[{i}] step {t}");
                assert_eq!(sa[i].to_bits(), sb[i].to_bits(), "s[{i}] step {t}");
            }
        }
        // Skipping must change the result (the test can fail); with coupled weight decay the
        // tested value `fma(p, wd, gs)` is not zero, so nothing is skipped.
        assert_eq!(sa != sd && pa != pd, skip && wd == 0.0, "wd {wd}");
    }
}

#[test]
fn the_scale_kernel_has_no_gs_variant() {
    let e = OptimExtSpec::Norm(OptimNormSpec::Scale)
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("reads no gradient"), "{e}");
}

#[test]
fn hyperparameters_the_f32_kernels_cannot_hold_are_refused_by_name() {
    let lamb = |f: &dyn Fn(&mut LambHyper)| {
        let mut h = LambHyper::default();
        f(&mut h);
        h.check().map_err(|e| e.to_string())
    };
    let lars = |f: &dyn Fn(&mut LarsHyper)| {
        let mut h = LarsHyper::default();
        f(&mut h);
        h.check().map_err(|e| e.to_string())
    };
    // A positive max_unorm that rounds to 0 in f32 would silently turn clipping off.
    for m in [1e-46, 1e39] {
        let e = lamb(&|h| h.max_unorm = m).unwrap_err();
        assert!(e.contains(&format!("max_unorm = {m:?}")), "{e}");
        let e = lars(&|h| h.max_unorm = m).unwrap_err();
        assert!(e.contains(&format!("max_unorm = {m:?}")), "{e}");
    }
    assert!(lamb(&|h| h.max_unorm = 1e-44).is_ok());
    assert!(lamb(&|h| h.max_unorm = 0.0).is_ok());
    for (name, v) in [("lr", 1e39), ("weight_decay", 1e300)] {
        let e = if name == "lr" {
            lamb(&|h| h.lr = v)
        } else {
            lamb(&|h| h.weight_decay = v)
        }
        .unwrap_err();
        assert!(e.contains(&format!("{name} = {v:?}")), "{e}");
        let e = if name == "lr" {
            lars(&|h| h.lr = v)
        } else {
            lars(&|h| h.weight_decay = v)
        }
        .unwrap_err();
        assert!(e.contains(&format!("{name} = {v:?}")), "{e}");
    }
}
