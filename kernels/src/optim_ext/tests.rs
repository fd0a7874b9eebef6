//! The `_gs` optimizer variants (`gnorm_scale`, `skip_zeros`) and the gradient-norm kernel on
//! the reference interpreter against independent host models written here in plain Rust
//! (`f32::mul_add` for `fma`, an `f64` brute-force nearest-code search for 8-bit state), over
//! several steps with many `±0` gradients, NaN and ±inf, with and without weight decay.
#![allow(clippy::needless_range_loop)] // element-wise models index several arrays

use crate::adam::tests::hyper as adam_hyper;
use crate::adam::{OptimAlgo, OptimSpec, StateBits};
use crate::optim1::tests::run_and_check8;
use crate::optim1::{Optim1Algo, Optim1Hyper, Optim1Spec};
use crate::optim_ext::OptimExtSpec;
use crate::optim_norm::tests::block_sum_sq;
use crate::test_util::{bytes, floats, nearest, out, round, run};
use crate::{BlockwiseMap, KernelSpec};
use qforge_ir::OwnedArg;
use qforge_ir::{DType, Scalar};

const SCALE: f32 = 0.625;

/// Gradients with a `±0` every few elements, NaN, ±inf and a subnormal.
fn grads(n: usize, step: u32) -> Vec<f32> {
    (0..n)
        .map(|i| match (i * 7 + step as usize * 3) % 23 {
            0 => f32::NAN,
            1 => f32::INFINITY,
            2 => f32::NEG_INFINITY,
            3 | 9 | 15 => 0.0,
            4 | 12 => -0.0,
            5 => 1e-41,
            _ => ((i * 37 + step as usize * 11) % 101) as f32 * 0.013 - 0.6,
        })
        .collect()
}

/// Parameters with exact zeros (so `p * wd + 0` is zero too).
fn init_p(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| {
            if i % 13 == 0 {
                0.0
            } else {
                (i as f32 - 150.0) * 0.01
            }
        })
        .collect()
}

fn scalars(head: Vec<Scalar>, n: usize, scale: f32, skip: Option<bool>) -> Vec<OwnedArg> {
    let mut args = vec![
        OwnedArg::Scalar(Scalar::U32(n as u32)),
        OwnedArg::Scalar(Scalar::U32(n.div_ceil(256) as u32)),
    ];
    args.extend(head.into_iter().map(OwnedArg::Scalar));
    args.push(OwnedArg::Scalar(Scalar::f32(scale)));
    if let Some(s) = skip {
        args.push(OwnedArg::Scalar(Scalar::U32(u32::from(s))));
    }
    args
}

#[test]
fn adam32_gs_matches_host_model() {
    for algo in [OptimAlgo::Adam, OptimAlgo::AdamW] {
        for dtype in [DType::F32, DType::BF16] {
            for skip in [false, true] {
                let spec = OptimSpec {
                    algo,
                    state: StateBits::Bits32,
                    dtype,
                };
                let k = OptimExtSpec::Adam(spec).build().unwrap();
                qforge_ir::verify(&k).unwrap();
                let h = adam_hyper(algo);
                let n = 300;
                let mut p: Vec<f32> = init_p(n).iter().map(|x| round(dtype, *x)).collect();
                let (mut m, mut v) = (vec![0.0f32; n], vec![0.0f32; n]);
                let mut tail = vec![
                    OwnedArg::Write(bytes(dtype, &p)),
                    OwnedArg::Read(vec![]),
                    OwnedArg::Write(bytes(DType::F32, &m)),
                    OwnedArg::Write(bytes(DType::F32, &v)),
                ];
                let mut skipped = 0;
                for t in 1..=4 {
                    let g: Vec<f32> = grads(n, t).iter().map(|x| round(dtype, *x)).collect();
                    let c1 = 1.0 - h.beta1.powi(t as i32);
                    let c2 = (1.0 - h.beta2.powi(t as i32)).sqrt();
                    for i in 0..n {
                        let gs = g[i] * SCALE;
                        if skip && gs == 0.0 {
                            skipped += 1;
                            continue;
                        }
                        if !gs.is_finite() {
                            (m[i], v[i]) = (0.0, 0.0);
                            continue;
                        }
                        m[i] = gs.mul_add((1.0 - h.beta1) as f32, m[i] * h.beta1 as f32);
                        v[i] = (((1.0 - h.beta2) as f32) * gs).mul_add(gs, v[i] * h.beta2 as f32);
                        let pd = if algo == OptimAlgo::AdamW {
                            p[i] * (1.0 - h.lr * h.weight_decay) as f32
                        } else {
                            p[i]
                        };
                        let r = m[i] / (v[i].sqrt() + (h.eps * c2) as f32);
                        p[i] = round(dtype, r.mul_add((-h.lr * c2 / c1) as f32, pd));
                    }
                    let head = h.scalars(&spec, t).unwrap().kernel_args(&spec);
                    let mut args = scalars(head, n, SCALE, Some(skip));
                    tail[1] = OwnedArg::Read(bytes(dtype, &g));
                    args.extend(tail);
                    run(&k, &mut args);
                    let base = args.len() - 4;
                    let kp = floats(dtype, out(&args, base));
                    let km = floats(DType::F32, out(&args, base + 2));
                    let kv = floats(DType::F32, out(&args, base + 3));
                    for i in 0..n {
                        let what = format!("{} skip {skip} t{t} [{i}]", k.name);
                        assert_eq!(km[i].to_bits(), m[i].to_bits(), "{what} m");
                        assert_eq!(kv[i].to_bits(), v[i].to_bits(), "{what} v");
                        assert_eq!(kp[i].to_bits(), p[i].to_bits(), "{what} p");
                    }
                    tail = args[base..].to_vec();
                }
                assert_eq!(skipped > 0, skip, "{}", k.name);
            }
        }
    }
}

#[test]
fn adam8bit_gs_scales_the_gradient() {
    let code1 = BlockwiseMap::Dynamic.code();
    let code2 = BlockwiseMap::DynamicUnsigned.code();
    for algo in [OptimAlgo::Adam, OptimAlgo::AdamW] {
        let dtype = DType::F32;
        let spec = OptimSpec {
            algo,
            state: StateBits::Bits8,
            dtype,
        };
        let ext = OptimExtSpec::Adam(spec);
        assert!(!ext.takes_skip_zeros());
        let k = ext.build().unwrap();
        qforge_ir::verify(&k).unwrap();
        let h = adam_hyper(algo);
        let n = 256 + 77;
        let nb = 2;
        let mut p = init_p(n);
        let (mut q1, mut q2) = (vec![0u8; n], vec![0u8; n]);
        let (mut a1, mut a2) = (vec![0.0f32; nb], vec![0.0f32; nb]);
        let mut tail = vec![
            OwnedArg::Write(bytes(dtype, &p)),
            OwnedArg::Read(vec![]),
            OwnedArg::Write(vec![0; n]),
            OwnedArg::Write(vec![0; 4 * nb]),
            OwnedArg::Write(vec![0; n]),
            OwnedArg::Write(vec![0; 4 * nb]),
        ];
        for t in 1..=3 {
            let g = grads(n, t);
            let c1 = 1.0 - h.beta1.powi(t as i32);
            let c2 = (1.0 - h.beta2.powi(t as i32)).sqrt();
            let (mut ms, mut vs) = (vec![0.0f32; n], vec![0.0f32; n]);
            for i in 0..n {
                if !g[i].is_finite() {
                    continue;
                }
                let gs = g[i] * SCALE;
                let m_old = code1[q1[i] as usize] * a1[i / 256];
                let v_old = code2[q2[i] as usize] * a2[i / 256];
                ms[i] = gs.mul_add((1.0 - h.beta1) as f32, m_old * h.beta1 as f32);
                vs[i] = (((1.0 - h.beta2) as f32) * gs).mul_add(gs, v_old * h.beta2 as f32);
                let pd = if algo == OptimAlgo::AdamW {
                    p[i] * (1.0 - h.lr * h.weight_decay) as f32
                } else {
                    p[i]
                };
                let den = vs[i].sqrt() / c2 as f32 + h.eps as f32;
                p[i] = pd + ((-h.lr / c1) as f32 * ms[i]) / den;
            }
            for b in 0..nb {
                let r = b * 256..((b + 1) * 256).min(n);
                a1[b] = ms[r.clone()].iter().fold(0.0f32, |a, x| a.max(x.abs()));
                a2[b] = vs[r.clone()].iter().fold(0.0f32, |a, x| a.max(x.abs()));
                for i in r {
                    q1[i] = nearest(&code1, ms[i] * (1.0 / a1[b].max(1e-38)));
                    q2[i] = nearest(&code2, vs[i] * (1.0 / a2[b].max(1e-38)));
                }
            }
            let head = h.scalars(&spec, t).unwrap().kernel_args(&spec);
            let mut args = scalars(head, n, SCALE, None);
            tail[1] = OwnedArg::Read(bytes(dtype, &g));
            args.extend(tail);
            run(&k, &mut args);
            let base = args.len() - 6;
            assert_eq!(out(&args, base + 2), &q1[..], "{} t{t} state1", k.name);
            assert_eq!(out(&args, base + 4), &q2[..], "{} t{t} state2", k.name);
            let kp = floats(dtype, out(&args, base));
            for i in 0..n {
                assert_eq!(kp[i].to_bits(), p[i].to_bits(), "{} t{t} p[{i}]", k.name);
            }
            tail = args[base..].to_vec();
        }
    }
}

fn one_hyper(algo: Optim1Algo, wd: f64) -> Optim1Hyper {
    Optim1Hyper {
        lr: 3e-3,
        beta1: 0.85,
        beta2: if algo == Optim1Algo::Lion { 0.97 } else { 0.0 },
        eps: 1e-6,
        weight_decay: wd,
    }
}

/// One-state host model of one element with a finite scaled gradient `gs`: `(s, p)`. `x` is
/// RMSprop's / Adagrad's numerator.
#[allow(clippy::too_many_arguments)]
fn one_model(
    algo: Optim1Algo,
    h: &Optim1Hyper,
    bits8: bool,
    t: u32,
    gs: f32,
    gw: f32,
    x: f32,
    p: f32,
    s_old: f32,
) -> (f32, f32) {
    let lr = h.lr as f32;
    let (b1, b2) = (h.beta1 as f32, h.beta2 as f32);
    let (c1, c2) = ((1.0 - h.beta1) as f32, (1.0 - h.beta2) as f32);
    match algo {
        Optim1Algo::Lion => {
            let pd = p * (1.0 - h.lr * h.weight_decay) as f32;
            let u = s_old.mul_add(b1, c1 * gs);
            let step = if u > 0.0 {
                lr
            } else if u < 0.0 {
                -lr
            } else {
                0.0
            };
            (s_old.mul_add(b2, c2 * gs), pd - step)
        }
        Optim1Algo::Sgd => {
            let s = if t == 1 { gw } else { s_old.mul_add(b1, gw) };
            (s, (-lr).mul_add(s, p))
        }
        Optim1Algo::Rmsprop | Optim1Algo::Adagrad => {
            let s = match algo {
                Optim1Algo::Rmsprop if bits8 => s_old.mul_add(b1, c1 * (gw * gw)),
                Optim1Algo::Rmsprop => s_old.mul_add(b1, c1 * gw * gw),
                _ => gw.mul_add(gw, s_old),
            };
            (s, (-lr).mul_add(x / (s.sqrt() + h.eps as f32), p))
        }
    }
}

/// `gw`: the scaled gradient after coupled weight decay (not Lion's).
fn coupled(algo: Optim1Algo, h: &Optim1Hyper, gs: f32, p: f32) -> f32 {
    if algo != Optim1Algo::Lion && h.weight_decay > 0.0 {
        p.mul_add(h.weight_decay as f32, gs)
    } else {
        gs
    }
}

#[test]
fn optim1_32bit_gs_matches_host_model() {
    for algo in Optim1Algo::ALL {
        for wd in [0.0, 0.05] {
            for skip in [false, true] {
                let spec = Optim1Spec {
                    algo,
                    state: StateBits::Bits32,
                    dtype: DType::F32,
                };
                let k = OptimExtSpec::One(spec).build().unwrap();
                qforge_ir::verify(&k).unwrap();
                let h = one_hyper(algo, wd);
                let n = 300;
                let mut p = init_p(n);
                let mut s = vec![0.0f32; n];
                let mut tail = vec![
                    OwnedArg::Write(bytes(DType::F32, &p)),
                    OwnedArg::Read(vec![]),
                    OwnedArg::Write(bytes(DType::F32, &s)),
                ];
                let mut skipped = 0;
                for t in 1..=4 {
                    let g = grads(n, t);
                    for i in 0..n {
                        let gs = g[i] * SCALE;
                        let gw = coupled(algo, &h, gs, p[i]);
                        if skip && gw == 0.0 {
                            skipped += 1;
                        } else if !gs.is_finite() {
                            s[i] = 0.0;
                        } else {
                            (s[i], p[i]) = one_model(algo, &h, false, t, gs, gw, gw, p[i], s[i]);
                        }
                    }
                    let head = h.scalars(algo, t).unwrap().kernel_args();
                    let mut args = scalars(head, n, SCALE, Some(skip));
                    tail[1] = OwnedArg::Read(bytes(DType::F32, &g));
                    args.extend(tail);
                    run(&k, &mut args);
                    let base = args.len() - 3;
                    let kp = floats(DType::F32, out(&args, base));
                    let ks = floats(DType::F32, out(&args, base + 2));
                    for i in 0..n {
                        let what = format!("{} wd {wd} skip {skip} t{t} [{i}]", k.name);
                        assert_eq!(ks[i].to_bits(), s[i].to_bits(), "{what} s");
                        assert_eq!(kp[i].to_bits(), p[i].to_bits(), "{what} p");
                    }
                    tail = args[base..].to_vec();
                }
                assert_eq!(skipped > 0, skip, "{}", k.name);
            }
        }
    }
}

#[test]
fn optim1_8bit_gs_matches_host_model() {
    let code = BlockwiseMap::Dynamic.code();
    for algo in Optim1Algo::ALL {
        for (wd, skip) in [(0.0, true), (0.05, true), (0.05, false)] {
            let spec = Optim1Spec {
                algo,
                state: StateBits::Bits8,
                dtype: DType::F32,
            };
            let k = OptimExtSpec::One(spec).build().unwrap();
            qforge_ir::verify(&k).unwrap();
            let h = one_hyper(algo, wd);
            // Two full blocks and a partial one; block 1 gets only zero gradients at step 3,
            // so with skip_zeros its absmax and codes stay.
            let n: usize = 2 * 256 + 77;
            let nb = n.div_ceil(256);
            let mut p = init_p(n);
            let mut q = vec![0u8; n];
            let mut a = vec![0.0f32; nb];
            let mut tail = vec![
                OwnedArg::Write(bytes(DType::F32, &p)),
                OwnedArg::Read(vec![]),
                OwnedArg::Write(vec![0; n]),
                OwnedArg::Write(vec![0; 4 * nb]),
            ];
            for t in 1..=4 {
                let mut g = grads(n, t);
                if t == 3 {
                    g[256..512]
                        .iter_mut()
                        .enumerate()
                        .for_each(|(j, x)| *x = if j % 2 == 0 { 0.0 } else { -0.0 });
                }
                let (q_before, a_before) = (q.clone(), a.clone());
                let mut s = vec![0.0f32; n];
                for i in 0..n {
                    let s_old = code[q[i] as usize] * a[i / 256];
                    let gs = g[i] * SCALE;
                    s[i] = if skip && g[i] == 0.0 {
                        s_old
                    } else if !g[i].is_finite() {
                        0.0
                    } else {
                        let gw = coupled(algo, &h, gs, p[i]);
                        let r = one_model(algo, &h, true, t, gs, gw, g[i], p[i], s_old);
                        p[i] = r.1;
                        r.0
                    };
                }
                for b in 0..nb {
                    let r = b * 256..((b + 1) * 256).min(n);
                    a[b] = s[r.clone()].iter().fold(0.0f32, |m, x| m.max(x.abs()));
                    for i in r {
                        q[i] = nearest(&code, s[i] * (1.0 / a[b].max(1e-38)));
                    }
                }
                if skip && t == 3 {
                    // An all-zero block with skip_zeros keeps its absmax and its codes.
                    assert_eq!(a[1].to_bits(), a_before[1].to_bits(), "{}", k.name);
                    assert_eq!(q[256..512], q_before[256..512], "{}", k.name);
                }
                let head = h.scalars(algo, t).unwrap().kernel_args();
                let mut args = scalars(head, n, SCALE, Some(skip));
                tail[1] = OwnedArg::Read(bytes(DType::F32, &g));
                args.extend(tail);
                let what = format!("{} wd {wd} skip {skip} t{t}", k.name);
                tail = run_and_check8(&k, args, &what, &q, &a, &p);
            }
        }
    }
}

/// With `gnorm_scale = 1` and `skip_zeros = 0` every `_gs` variant equals its plain kernel bit
/// for bit (on the catalog's example arguments, which hold NaN, inf and zeros).
#[test]
fn gs_variants_with_neutral_options_equal_the_plain_kernels() {
    let values: Vec<f32> = (0..300)
        .map(|i| match i % 17 {
            0 => 0.0,
            1 => -0.0,
            2 => f32::NAN,
            _ => (i as f32 - 140.0) * 0.02,
        })
        .collect();
    let mut checked = 0;
    for spec in crate::catalog() {
        let KernelSpec::OptimExt(ext) = spec else {
            continue;
        };
        let plain = match ext {
            OptimExtSpec::Adam(s) => KernelSpec::Optim(s),
            OptimExtSpec::One(s) => KernelSpec::Optim1(s),
            OptimExtSpec::Norm1Gs(a) => KernelSpec::OptimExt(OptimExtSpec::Norm1(a)),
            OptimExtSpec::Norm(s) => KernelSpec::OptimNorm(s),
            OptimExtSpec::Norm8(s) => KernelSpec::OptimNorm8(s),
            OptimExtSpec::GradNorm(_) | OptimExtSpec::Norm1(_) => continue,
        };
        let mut a = plain.example_args(&values).unwrap();
        let at = a
            .iter()
            .position(|x| !matches!(x, OwnedArg::Scalar(_)))
            .unwrap();
        let mut b = a.clone();
        let extra = ext.ext_args(1.0, false);
        b.splice(at..at, extra.into_iter().map(OwnedArg::Scalar));
        run(&plain.build().unwrap(), &mut a);
        run(&ext.build().unwrap(), &mut b);
        let b_tail = &b[b.len() - (a.len() - at)..];
        for (i, (x, y)) in a[at..].iter().zip(b_tail).enumerate() {
            assert_eq!(
                out(std::slice::from_ref(x), 0),
                out(std::slice::from_ref(y), 0),
                "{} buffer {i}",
                ext.name()
            );
        }
        checked += 1;
    }
    // 12 Adam / one-state updates, 2 `{algo}_norm_f32_gs`, 6 32-bit and 4 8-bit LAMB / LARS.
    assert_eq!(checked, 24);
}

#[test]
fn grad_sqnorm_matches_strided_host_sum() {
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let k = OptimExtSpec::GradNorm(dtype).build().unwrap();
        qforge_ir::verify(&k).unwrap();
        for n in [1usize, 7, 256, 600] {
            let g: Vec<f32> = (0..n)
                .map(|i| round(dtype, ((i * 29) % 97) as f32 * 0.37 - 17.0))
                .collect();
            let nb = n.div_ceil(256);
            let mut args = vec![
                OwnedArg::Scalar(Scalar::U32(n as u32)),
                OwnedArg::Scalar(Scalar::U32(nb as u32)),
                OwnedArg::Read(bytes(dtype, &g)),
                OwnedArg::Write(vec![0; 4 * nb]),
            ];
            run(&k, &mut args);
            let parts = floats(DType::F32, out(&args, 3));
            for b in 0..nb {
                // 8 partials from -0.0, element i of the block into i % 8, then the tree.
                let r = &g[b * 256..((b + 1) * 256).min(n)];
                assert_eq!(
                    parts[b].to_bits(),
                    block_sum_sq(r).to_bits(),
                    "{} n {n} [{b}]",
                    k.name
                );
                // Within rounding of the f64 sum (the order is what is pinned).
                let exact: f64 = r.iter().map(|x| f64::from(*x) * f64::from(*x)).sum();
                assert!(
                    (f64::from(parts[b]) - exact).abs() <= exact * 1e-5,
                    "{}",
                    k.name
                );
            }
        }
    }
}
