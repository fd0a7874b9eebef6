//! 8-bit LAMB and LARS kernels on the reference interpreter against an independent host model
//! written here in plain Rust (`f32::mul_add` for `fma`, the pinned order of the partial sums
//! written out as loops, an `f64` brute-force nearest-code search for the requantization), bit
//! for bit over several steps with NaN, inf, zero and subnormal gradients; and `scale = 1`
//! against the `adamw8bit_*` / `sgd8bit_f32` kernels, byte for byte.
#![allow(clippy::needless_range_loop)] // element-wise models index several arrays

use crate::optim_ext::OptimExtSpec;
use crate::optim_norm::tests::{block_sum_sq, u32a, wave};
use crate::optim_norm::{LambHyper, LarsHyper, NormRule, OptimNormSpec};
use crate::optim_norm8::OptimNorm8Spec;
use crate::test_util::{bytes, floats, nearest, out, round, run};
use crate::{BlockwiseMap, KernelSpec, OptimAlgo, OptimSpec, StateBits};
use crate::{Optim1Algo, Optim1Spec};
use qforge_ir::OwnedArg;
use qforge_ir::{DType, Scalar};

const BS: usize = 256;

/// Model of the scale kernel (threshold epsilon 0): sequential sums from `-0.0`, square roots,
/// `thr / unorm` when clipping.
fn scale_model(u: &[f32], p: &[f32], max_unorm: f32) -> f32 {
    let up: Vec<f32> = u.chunks(BS).map(block_sum_sq).collect();
    let pp: Vec<f32> = p.chunks(BS).map(block_sum_sq).collect();
    let su = up.iter().fold(-0.0f32, |a, x| a + x);
    let sp = pp.iter().fold(-0.0f32, |a, x| a + x);
    let (unorm, pnorm) = (su.sqrt(), sp.sqrt());
    let thr = max_unorm * pnorm;
    if max_unorm > 0.0 && unorm > thr {
        thr / unorm
    } else {
        1.0
    }
}

/// One 8-bit state (codes and absmax per block).
#[derive(Clone)]
struct State8 {
    q: Vec<u8>,
    a: Vec<f32>,
}

impl State8 {
    fn zeros(n: usize) -> State8 {
        State8 {
            q: vec![0; n],
            a: vec![0.0; n.div_ceil(BS)],
        }
    }

    fn decode(&self, code: &[f32], i: usize) -> f32 {
        code[self.q[i] as usize] * self.a[i / BS]
    }

    /// New absmax (NaN-ignoring `max |x|`) and exact nearest codes of `x * (1 / max(a, 1e-38))`.
    fn requantize(&mut self, code: &[f32], x: &[f32]) {
        for (b, chunk) in x.chunks(BS).enumerate() {
            self.a[b] = chunk.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            let inv = 1.0 / self.a[b].max(1e-38);
            for (j, v) in chunk.iter().enumerate() {
                self.q[b * BS + j] = nearest(code, v * inv);
            }
        }
    }
}

/// The gradient of step `t`: NaN, ±inf, ±0 and a subnormal among wave values.
fn grad(n: usize, t: u32, dtype: DType) -> Vec<f32> {
    let mut g = wave(n, 77 + t, 0.5);
    g[1] = f32::NAN;
    g[n / 2] = f32::INFINITY;
    g[n / 3] = f32::NEG_INFINITY;
    g[n - 1] = -0.0;
    g[5] = 0.0;
    g[3] = 1e-41;
    g.iter().map(|x| round(dtype, *x)).collect()
}

struct Lamb8 {
    p: Vec<f32>,
    s1: State8,
    s2: State8,
}

/// One 8-bit LAMB step of the model; returns the scale it used.
fn lamb8_model(st: &mut Lamb8, g: &[f32], h: &LambHyper, t: u32, dtype: DType) -> f32 {
    let code1 = BlockwiseMap::Dynamic.code();
    let code2 = BlockwiseMap::DynamicUnsigned.code();
    let (b1, b2) = (h.beta1 as f32, h.beta2 as f32);
    let (o1, o2) = ((1.0 - h.beta1) as f32, (1.0 - h.beta2) as f32);
    let ti = t as i32;
    let c1 = 1.0 - h.beta1.powi(ti);
    let c2sq = 1.0 - h.beta2.powi(ti);
    let (ic1, ic2) = ((1.0 / c1) as f32, (1.0 / c2sq) as f32);
    let step_size = (-h.lr / c1) as f32;
    let c2 = c2sq.sqrt() as f32;
    let eps = h.eps as f32;
    let decay = (1.0 - h.lr * h.weight_decay) as f32;
    let n = g.len();
    let (mut u, mut nm, mut nv) = (vec![0.0f32; n], vec![0.0f32; n], vec![0.0f32; n]);
    for i in 0..n {
        let (m_old, v_old) = (st.s1.decode(&code1, i), st.s2.decode(&code2, i));
        let gi = g[i];
        if gi.is_finite() {
            nm[i] = gi.mul_add(o1, m_old * b1);
            nv[i] = (o2 * gi).mul_add(gi, v_old * b2);
            u[i] = (nm[i] * ic1) / ((nv[i] * ic2).sqrt() + eps);
        }
    }
    let scale = scale_model(&u, &st.p, h.max_unorm as f32);
    let ss = scale * step_size;
    for i in 0..n {
        if g[i].is_finite() {
            let upd = (ss * nm[i]) / (nv[i].sqrt() / c2 + eps);
            st.p[i] = round(dtype, st.p[i] * decay + upd);
        }
    }
    st.s1.requantize(&code1, &nm);
    st.s2.requantize(&code2, &nv);
    scale
}

/// The scale kernel on the partials in `args[up]`, `args[up + 1]`.
fn run_scale(args: &[OwnedArg], up: usize, max_unorm: f32) -> f32 {
    let nb = out(args, up).len() / 4;
    let k = OptimNormSpec::Scale.build().unwrap();
    let mut sargs = vec![
        u32a(nb),
        OwnedArg::Scalar(Scalar::f32(max_unorm)),
        OwnedArg::Scalar(Scalar::f32(0.0)),
        OwnedArg::Read(out(args, up).to_vec()),
        OwnedArg::Read(out(args, up + 1).to_vec()),
        OwnedArg::Write(vec![0; 4]),
    ];
    run(&k, &mut sargs);
    floats(DType::F32, out(&sargs, 5))[0]
}

/// One 8-bit LAMB step on the interpreter (partials, scale, update); returns the scale.
fn lamb8_kernels(st: &mut Lamb8, g: &[f32], h: &LambHyper, t: u32, dtype: DType) -> f32 {
    lamb8_kernels_gs(st, g, h, t, dtype, None)
}

/// `spec` built plain, or its `_gs` variant with the scalars of `(gnorm_scale, skip_zeros)`.
fn build_gs(spec: OptimNorm8Spec, gs: Option<(f32, bool)>) -> (qforge_ir::Kernel, Vec<OwnedArg>) {
    let (k, extra) = match gs {
        None => (spec.build().unwrap(), Vec::new()),
        Some((scale, skip)) => {
            let ext = OptimExtSpec::Norm8(spec);
            (ext.build().unwrap(), ext.ext_args(scale, skip))
        }
    };
    qforge_ir::verify(&k).unwrap();
    (k, extra.into_iter().map(OwnedArg::Scalar).collect())
}

/// [`lamb8_kernels`] through the `_gs` variants for `Some((gnorm_scale, skip_zeros))`.
fn lamb8_kernels_gs(
    st: &mut Lamb8,
    g: &[f32],
    h: &LambHyper,
    t: u32,
    dtype: DType,
    gs: Option<(f32, bool)>,
) -> f32 {
    let (n, nb) = (g.len(), g.len().div_ceil(BS));
    let rule = NormRule::Lamb;
    let (part, extra) = build_gs(OptimNorm8Spec::Partials { rule, dtype }, gs);
    let k = extra.len();
    let mut args = vec![u32a(n), u32a(nb)];
    let s = h.scalars(t).unwrap();
    args.extend(s.partials_args().into_iter().map(OwnedArg::Scalar));
    args.extend(extra);
    let state = |st: &Lamb8, write: bool| {
        let arg = |b: Vec<u8>| {
            if write {
                OwnedArg::Write(b)
            } else {
                OwnedArg::Read(b)
            }
        };
        [
            arg(st.s1.q.clone()),
            arg(bytes(DType::F32, &st.s1.a)),
            arg(st.s2.q.clone()),
            arg(bytes(DType::F32, &st.s2.a)),
        ]
    };
    args.extend([
        OwnedArg::Read(bytes(dtype, &st.p)),
        OwnedArg::Read(bytes(dtype, g)),
    ]);
    args.extend(state(st, false));
    args.extend([
        OwnedArg::Write(vec![0; 4 * nb]),
        OwnedArg::Write(vec![0; 4 * nb]),
    ]);
    run(&part, &mut args);
    let scale = run_scale(&args, 15 + k, s.max_unorm);
    let (upd, extra) = build_gs(OptimNorm8Spec::Update { rule, dtype }, gs);
    let k = extra.len();
    let mut args = vec![u32a(n), u32a(nb)];
    args.extend(h.update8_args(t).unwrap().into_iter().map(OwnedArg::Scalar));
    args.extend(extra);
    args.extend([
        OwnedArg::Write(bytes(dtype, &st.p)),
        OwnedArg::Read(bytes(dtype, g)),
    ]);
    args.extend(state(st, true));
    args.push(OwnedArg::Read(bytes(DType::F32, &[scale])));
    run(&upd, &mut args);
    st.p = floats(dtype, out(&args, 10 + k));
    st.s1 = State8 {
        q: out(&args, 12 + k).to_vec(),
        a: floats(DType::F32, out(&args, 13 + k)),
    };
    st.s2 = State8 {
        q: out(&args, 14 + k).to_vec(),
        a: floats(DType::F32, out(&args, 15 + k)),
    };
    scale
}

fn assert_bits(what: &str, a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    for i in 0..a.len() {
        assert_eq!(
            a[i].to_bits(),
            b[i].to_bits(),
            "{what}[{i}]: {} vs {}",
            a[i],
            b[i]
        );
    }
}

#[test]
fn lamb8_matches_host_model_over_steps() {
    let mut clipped = 0;
    let mut unclipped = 0;
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        for max_unorm in [1.0, 0.0, 40.0] {
            let h = LambHyper {
                lr: 1e-2,
                beta1: 0.85,
                beta2: 0.99,
                eps: 1e-6,
                weight_decay: 0.05,
                max_unorm,
            };
            // Two full blocks and a partial one.
            let n = 2 * BS + 77;
            let p0: Vec<f32> = wave(n, 5, 0.6).iter().map(|x| round(dtype, *x)).collect();
            let fresh = || Lamb8 {
                p: p0.clone(),
                s1: State8::zeros(n),
                s2: State8::zeros(n),
            };
            let (mut model, mut kern) = (fresh(), fresh());
            for t in 1..=4 {
                let g = grad(n, t, dtype);
                let sm = lamb8_model(&mut model, &g, &h, t, dtype);
                let sk = lamb8_kernels(&mut kern, &g, &h, t, dtype);
                let what = format!("lamb8 {dtype} max_unorm {max_unorm} t{t}");
                assert_eq!(sk.to_bits(), sm.to_bits(), "{what}: scale");
                assert_bits(&format!("{what} p"), &kern.p, &model.p);
                assert_eq!(kern.s1.q, model.s1.q, "{what}: state1");
                assert_eq!(kern.s2.q, model.s2.q, "{what}: state2");
                assert_bits(&format!("{what} absmax1"), &kern.s1.a, &model.s1.a);
                assert_bits(&format!("{what} absmax2"), &kern.s2.a, &model.s2.a);
                if sm < 1.0 {
                    clipped += 1;
                } else {
                    unclipped += 1;
                }
            }
            // Non-finite gradients kept their parameters.
            assert_eq!(kern.p[1].to_bits(), p0[1].to_bits());
            assert_eq!(kern.p[n / 2].to_bits(), p0[n / 2].to_bits());
        }
    }
    assert!(clipped > 0 && unclipped > 0, "{clipped} {unclipped}");
}

struct Lars8 {
    p: Vec<f32>,
    s: State8,
}

/// One 8-bit LARS step of the model; returns the scale it used.
fn lars8_model(st: &mut Lars8, g: &[f32], h: &LarsHyper, t: u32) -> f32 {
    lars8_model_skip(st, g, h, t, &vec![false; g.len()])
}

/// [`lars8_model`] where element `i` is skipped when `skip[i]`: it keeps its parameter and
/// its dequantized momentum (requantized with the block's new absmax), but its update still
/// counts in the norm.
fn lars8_model_skip(st: &mut Lars8, g: &[f32], h: &LarsHyper, t: u32, skip: &[bool]) -> f32 {
    let code = BlockwiseMap::Dynamic.code();
    let mom = h.momentum as f32;
    let wd = h.weight_decay as f32;
    let neg_lr = (-h.lr) as f32;
    let n = g.len();
    let (mut u, mut ns) = (vec![0.0f32; n], vec![0.0f32; n]);
    for i in 0..n {
        let s_old = st.s.decode(&code, i);
        let gi = g[i];
        if gi.is_finite() {
            u[i] = if t == 1 { gi } else { s_old.mul_add(mom, gi) };
            let gw = if wd > 0.0 {
                st.p[i].mul_add(wd, gi)
            } else {
                gi
            };
            ns[i] = if t == 1 { gw } else { s_old.mul_add(mom, gw) };
        }
        if skip[i] {
            ns[i] = s_old;
        }
    }
    let scale = scale_model(&u, &st.p, h.max_unorm as f32);
    let nls = neg_lr * scale;
    for i in 0..n {
        if g[i].is_finite() && !skip[i] {
            st.p[i] = nls.mul_add(ns[i], st.p[i]);
        }
    }
    st.s.requantize(&code, &ns);
    scale
}

/// One 8-bit LARS step on the interpreter; returns the scale.
fn lars8_kernels(st: &mut Lars8, g: &[f32], h: &LarsHyper, t: u32) -> f32 {
    lars8_kernels_gs(st, g, h, t, None)
}

/// [`lars8_kernels`] through the `_gs` variants for `Some((gnorm_scale, skip_zeros))`.
fn lars8_kernels_gs(
    st: &mut Lars8,
    g: &[f32],
    h: &LarsHyper,
    t: u32,
    gs: Option<(f32, bool)>,
) -> f32 {
    let (n, nb) = (g.len(), g.len().div_ceil(BS));
    let (rule, dtype) = (NormRule::Lars, DType::F32);
    let (part, extra) = build_gs(OptimNorm8Spec::Partials { rule, dtype }, gs);
    let k = extra.len();
    let s = h.scalars(t).unwrap();
    let mut args = vec![u32a(n), u32a(nb)];
    args.extend(s.partials_args().into_iter().map(OwnedArg::Scalar));
    args.extend(extra);
    args.extend([
        OwnedArg::Read(bytes(dtype, &st.p)),
        OwnedArg::Read(bytes(dtype, g)),
        OwnedArg::Read(st.s.q.clone()),
        OwnedArg::Read(bytes(DType::F32, &st.s.a)),
        OwnedArg::Write(vec![0; 4 * nb]),
        OwnedArg::Write(vec![0; 4 * nb]),
    ]);
    run(&part, &mut args);
    let scale = run_scale(&args, 8 + k, s.max_unorm);
    let (upd, extra) = build_gs(OptimNorm8Spec::Update { rule, dtype }, gs);
    let k = extra.len();
    let mut args = vec![u32a(n), u32a(nb)];
    args.extend(h.update8_args(t).unwrap().into_iter().map(OwnedArg::Scalar));
    args.extend(extra);
    args.extend([
        OwnedArg::Write(bytes(dtype, &st.p)),
        OwnedArg::Read(bytes(dtype, g)),
        OwnedArg::Write(st.s.q.clone()),
        OwnedArg::Write(bytes(DType::F32, &st.s.a)),
        OwnedArg::Read(bytes(DType::F32, &[scale])),
    ]);
    run(&upd, &mut args);
    st.p = floats(dtype, out(&args, 12 + k));
    st.s = State8 {
        q: out(&args, 14 + k).to_vec(),
        a: floats(DType::F32, out(&args, 15 + k)),
    };
    scale
}

#[test]
fn lars8_matches_host_model_over_steps() {
    let mut clipped = 0;
    let mut unclipped = 0;
    for (max_unorm, wd) in [(0.02, 0.01), (0.0, 0.0), (0.5, 0.0)] {
        let h = LarsHyper {
            lr: 0.05,
            momentum: 0.9,
            weight_decay: wd,
            max_unorm,
        };
        let n = 2 * BS + 77;
        let p0 = wave(n, 9, 0.6);
        let fresh = || Lars8 {
            p: p0.clone(),
            s: State8::zeros(n),
        };
        let (mut model, mut kern) = (fresh(), fresh());
        for t in 1..=4 {
            let g = grad(n, t, DType::F32);
            let sm = lars8_model(&mut model, &g, &h, t);
            let sk = lars8_kernels(&mut kern, &g, &h, t);
            let what = format!("lars8 max_unorm {max_unorm} wd {wd} t{t}");
            assert_eq!(sk.to_bits(), sm.to_bits(), "{what}: scale");
            assert_bits(&format!("{what} p"), &kern.p, &model.p);
            assert_eq!(kern.s.q, model.s.q, "{what}: state1");
            assert_bits(&format!("{what} absmax1"), &kern.s.a, &model.s.a);
            if sm < 1.0 {
                clipped += 1;
            } else {
                unclipped += 1;
            }
        }
        assert_eq!(kern.p[1].to_bits(), p0[1].to_bits());
    }
    assert!(clipped > 0 && unclipped > 0, "{clipped} {unclipped}");
}

/// Values with NaN, ±inf, ±0, a subnormal and three blocks (the last partial).
fn example_values() -> Vec<f32> {
    let mut v = wave(2 * BS + 41, 3, 2.0);
    v[0] = f32::NAN;
    v[7] = 0.0;
    v[8] = -0.0;
    v[300] = f32::INFINITY;
    v[301] = 1e-40;
    v
}

/// Runs `base` and `scaled` (the same arguments plus `scale = 1`) and compares every buffer.
fn assert_scale_one_equal(base: KernelSpec, scaled: OptimNorm8Spec) {
    let values = example_values();
    let mut args = base.example_args(&values).unwrap();
    let mut sargs = args.clone();
    sargs.push(OwnedArg::Read(bytes(DType::F32, &[1.0])));
    let bk = base.build().unwrap();
    let sk = scaled.build().unwrap();
    run(&bk, &mut args);
    run(&sk, &mut sargs);
    for i in 0..args.len() {
        if let OwnedArg::Write(b) = &args[i] {
            assert_eq!(
                out(&sargs, i),
                &b[..],
                "{} vs {}: arg {i}",
                sk.name,
                bk.name
            );
        }
    }
    // The example reaches the update (some parameter changed).
    let pi = args.len()
        - if scaled.rule_dtype().0 == NormRule::Lamb {
            6
        } else {
            4
        };
    let before = base.example_args(&values).unwrap();
    assert_ne!(
        out(&args, pi),
        out(&before, pi),
        "{}: no parameter changed",
        bk.name
    );
}

#[test]
fn scale_one_equals_adamw8bit_and_sgd8bit() {
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        let base = KernelSpec::Optim(OptimSpec {
            algo: OptimAlgo::AdamW,
            state: StateBits::Bits8,
            dtype,
        });
        let rule = NormRule::Lamb;
        assert_scale_one_equal(base, OptimNorm8Spec::Update { rule, dtype });
    }
    let base = KernelSpec::Optim1(Optim1Spec {
        algo: Optim1Algo::Sgd,
        state: StateBits::Bits8,
        dtype: DType::F32,
    });
    let (rule, dtype) = (NormRule::Lars, DType::F32);
    assert_scale_one_equal(base, OptimNorm8Spec::Update { rule, dtype });
}

#[test]
fn scale_changes_the_parameter_step_only() {
    // Scale 0 and scale 1: the same state, different parameters.
    let values = example_values();
    for spec in OptimNorm8Spec::variants() {
        if matches!(spec, OptimNorm8Spec::Partials { .. }) {
            continue;
        }
        let k = spec.build().unwrap();
        let mut one = KernelSpec::OptimNorm8(spec).example_args(&values).unwrap();
        let last = one.len() - 1;
        one[last] = OwnedArg::Read(bytes(DType::F32, &[1.0]));
        let mut zero = one.clone();
        zero[last] = OwnedArg::Read(bytes(DType::F32, &[0.0]));
        run(&k, &mut one);
        run(&k, &mut zero);
        let states = if spec.rule_dtype().0 == NormRule::Lamb {
            4
        } else {
            2
        };
        let pi = last - states - 2;
        for i in pi + 2..last {
            assert_eq!(
                out(&one, i),
                out(&zero, i),
                "{}: state argument {i}",
                k.name
            );
        }
        assert_ne!(out(&one, pi), out(&zero, pi), "{}: parameter", k.name);
    }
}

#[test]
fn names_dtypes_and_scalars() {
    let lamb = |dtype| OptimNorm8Spec::Partials {
        rule: NormRule::Lamb,
        dtype,
    };
    assert_eq!(lamb(DType::BF16).name(), "lamb8_norm_bf16");
    let upd = OptimNorm8Spec::Update {
        rule: NormRule::Lars,
        dtype: DType::F32,
    };
    assert_eq!(upd.name(), "lars8bit_f32");
    for bad in [
        OptimNorm8Spec::Update {
            rule: NormRule::Lars,
            dtype: DType::F16,
        },
        OptimNorm8Spec::Partials {
            rule: NormRule::Lars,
            dtype: DType::BF16,
        },
        lamb(DType::U8),
    ] {
        let e = bad.build().unwrap_err().to_string();
        assert!(e.contains(&bad.name()) || e.contains("u8"), "{e}");
    }
    // The update scalars are the plain kernels'.
    let h = LambHyper::default();
    let spec = OptimSpec {
        algo: OptimAlgo::AdamW,
        state: StateBits::Bits8,
        dtype: DType::F32,
    };
    let want = h.adam().scalars(&spec, 7).unwrap().kernel_args(&spec);
    assert_eq!(h.update8_args(7).unwrap(), want);
    let l = LarsHyper::default();
    let want = l.sgd().scalars(Optim1Algo::Sgd, 1).unwrap().kernel_args();
    assert_eq!(l.update8_args(1).unwrap(), want);
    assert_eq!(want[0], Scalar::U32(1));
    // Invalid hyperparameters and step 0 are refused.
    assert!(h.update8_args(0).is_err());
    let e = LarsHyper { momentum: 0.0, ..l }
        .update8_args(2)
        .unwrap_err()
        .to_string();
    assert!(e.contains("momentum"), "{e}");
}

/// The gradient of step `t` (as [`grad`]) with exact zeros at every 13th element from `5 + t`.
fn grad_zeros(n: usize, t: u32, dtype: DType) -> Vec<f32> {
    let mut g = grad(n, t, dtype);
    for i in (5 + t as usize..n).step_by(13) {
        g[i] = if i % 2 == 0 { -0.0 } else { 0.0 };
    }
    g
}

#[test]
fn lamb8_gs_matches_the_model_on_the_scaled_gradient() {
    // The model sees `g * gnorm_scale` (f32 products); `skip_zeros` is ignored (the kernel
    // takes none, as adamw8bit_*_gs).
    for dtype in [DType::F32, DType::BF16] {
        let h = LambHyper {
            weight_decay: 0.01,
            ..LambHyper::default()
        };
        let n = 2 * BS + 77;
        let p0: Vec<f32> = wave(n, 9, 0.02).iter().map(|x| round(dtype, *x)).collect();
        let fresh = || Lamb8 {
            p: p0.clone(),
            s1: State8::zeros(n),
            s2: State8::zeros(n),
        };
        let (mut model, mut kern, mut plain) = (fresh(), fresh(), fresh());
        for t in 1..=3 {
            let g = grad_zeros(n, t, dtype);
            let gsc = [0.375f32, 0.75, 0.5][t as usize - 1];
            let scaled: Vec<f32> = g.iter().map(|x| x * gsc).collect();
            let sm = lamb8_model(&mut model, &scaled, &h, t, dtype);
            let sk = lamb8_kernels_gs(&mut kern, &g, &h, t, dtype, Some((gsc, true)));
            let sp = lamb8_kernels(&mut plain, &g, &h, t, dtype);
            let what = format!("lamb8 gs {dtype} t{t}");
            assert_eq!(sk.to_bits(), sm.to_bits(), "{what}: scale");
            assert!(sm < 1.0, "{what}: clipped");
            assert_ne!(
                sk.to_bits(),
                sp.to_bits(),
                "{what}: the scaled gradient must matter"
            );
            assert_bits(&format!("{what} p"), &kern.p, &model.p);
            assert_eq!(kern.s1.q, model.s1.q, "{what}: state1");
            assert_eq!(kern.s2.q, model.s2.q, "{what}: state2");
            assert_bits(&format!("{what} absmax1"), &kern.s1.a, &model.s1.a);
            assert_bits(&format!("{what} absmax2"), &kern.s2.a, &model.s2.a);
        }
    }
}

#[test]
fn lars8_gs_matches_the_model_with_skip_zeros() {
    let n = 2 * BS + 77;
    for (wd, skip) in [(0.0, true), (0.01, true), (0.0, false)] {
        let h = LarsHyper {
            lr: 0.05,
            momentum: 0.9,
            weight_decay: wd,
            max_unorm: 0.02,
        };
        let p0 = wave(n, 9, 0.6);
        let fresh = || Lars8 {
            p: p0.clone(),
            s: State8::zeros(n),
        };
        let (mut model, mut kern, mut noskip) = (fresh(), fresh(), fresh());
        for t in 1..=3 {
            let g = grad_zeros(n, t, DType::F32);
            let gsc = 0.625f32;
            let scaled: Vec<f32> = g.iter().map(|x| x * gsc).collect();
            // bitsandbytes' 8-bit one-state kernel tests the raw gradient.
            let mask: Vec<bool> = g.iter().map(|x| skip && *x == 0.0).collect();
            lars8_model(&mut noskip, &scaled, &h, t);
            let sm = lars8_model_skip(&mut model, &scaled, &h, t, &mask);
            let sk = lars8_kernels_gs(&mut kern, &g, &h, t, Some((gsc, skip)));
            let what = format!("lars8 gs wd {wd} skip {skip} t{t}");
            assert_eq!(sk.to_bits(), sm.to_bits(), "{what}: scale");
            assert_bits(&format!("{what} p"), &kern.p, &model.p);
            assert_eq!(kern.s.q, model.s.q, "{what}: state1");
            assert_bits(&format!("{what} absmax1"), &kern.s.a, &model.s.a);
        }
        assert_eq!(
            model.p != noskip.p,
            skip,
            "skip_zeros must matter (wd {wd})"
        );
    }
}
