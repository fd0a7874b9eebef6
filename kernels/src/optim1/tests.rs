//! The one-state optimizer kernels (Lion, SGD, RMSprop, Adagrad) on the reference interpreter
//! against an independent host model written here in plain Rust (`f32::mul_add` for `fma`, an
//! `f64` brute-force nearest-code search for the 8-bit requantization), over several steps,
//! with NaN, ±inf, ±0 and subnormal gradients, with and without weight decay, and a partial
//! last block.
#![allow(clippy::needless_range_loop)] // element-wise models index several arrays

use crate::adam::tests::grads;
use crate::adam::StateBits;
use crate::optim1::{Optim1Algo, Optim1Hyper, Optim1Spec};
use crate::test_util::{bytes, floats};
use crate::test_util::{nearest, out, run};
use crate::BlockwiseMap;
use qforge_ir::OwnedArg;
use qforge_ir::{DType, Scalar};

/// Runs an 8-bit one-state kernel on `args` (the scalars, then `p, g, state1, absmax1`) and
/// checks `state1`, `absmax1` and `p` bit for bit against the model's `q`, `a` and `p`;
/// returns the four buffers for the next step.
pub(crate) fn run_and_check8(
    k: &qforge_ir::Kernel,
    mut args: Vec<OwnedArg>,
    what: &str,
    q: &[u8],
    a: &[f32],
    p: &[f32],
) -> Vec<OwnedArg> {
    run(k, &mut args);
    let base = args.len() - 4;
    assert_eq!(out(&args, base + 2), q, "{what} state1");
    let ka = floats(DType::F32, out(&args, base + 3));
    for b in 0..a.len() {
        assert_eq!(ka[b].to_bits(), a[b].to_bits(), "{what} absmax1[{b}]");
    }
    let kp = floats(DType::F32, out(&args, base));
    for i in 0..p.len() {
        assert_eq!(kp[i].to_bits(), p[i].to_bits(), "{what} p[{i}]");
    }
    args[base..].to_vec()
}

/// Host model of one element: `(s, p)` after step `t`.
fn model(
    algo: Optim1Algo,
    h: &Optim1Hyper,
    bits8: bool,
    t: u32,
    g: f32,
    p: f32,
    s_old: f32,
) -> (f32, f32) {
    if g.is_nan() || g.is_infinite() {
        return (0.0, p);
    }
    let (lr, wd) = (h.lr as f32, h.weight_decay as f32);
    let (b1, b2, eps) = (h.beta1 as f32, h.beta2 as f32, h.eps as f32);
    let (c1, c2) = ((1.0 - h.beta1) as f32, (1.0 - h.beta2) as f32);
    let gw = if algo != Optim1Algo::Lion && h.weight_decay > 0.0 {
        p.mul_add(wd, g)
    } else {
        g
    };
    match algo {
        Optim1Algo::Lion => {
            let pd = p * (1.0 - h.lr * h.weight_decay) as f32;
            let u = s_old.mul_add(b1, c1 * g);
            let p = if u > 0.0 {
                pd - lr
            } else if u < 0.0 {
                pd + lr
            } else {
                pd
            };
            (s_old.mul_add(b2, c2 * g), p)
        }
        Optim1Algo::Sgd => {
            let s = if t == 1 { gw } else { s_old.mul_add(b1, gw) };
            (s, (-lr).mul_add(s, p))
        }
        Optim1Algo::Rmsprop | Optim1Algo::Adagrad => {
            let s = if algo == Optim1Algo::Rmsprop {
                s_old.mul_add(b1, if bits8 { c1 * (gw * gw) } else { c1 * gw * gw })
            } else {
                gw.mul_add(gw, s_old)
            };
            let x = if bits8 { g } else { gw };
            (s, (-lr).mul_add(x / (s.sqrt() + eps), p))
        }
    }
}

fn hyper(algo: Optim1Algo, wd: f64) -> Optim1Hyper {
    Optim1Hyper {
        lr: 3e-3,
        beta1: 0.85,
        beta2: if algo == Optim1Algo::Lion { 0.97 } else { 0.0 },
        eps: 1e-6,
        weight_decay: wd,
    }
}

fn scalar_args(algo: Optim1Algo, h: &Optim1Hyper, n: usize, t: u32) -> Vec<OwnedArg> {
    let mut args = vec![
        OwnedArg::Scalar(Scalar::U32(n as u32)),
        OwnedArg::Scalar(Scalar::U32(n.div_ceil(256) as u32)),
    ];
    let s = h.scalars(algo, t).unwrap();
    args.extend(s.kernel_args().into_iter().map(OwnedArg::Scalar));
    args
}

fn init_p(n: usize) -> Vec<f32> {
    (0..n).map(|i| (i as f32 - 150.0) * 0.01).collect()
}

#[test]
fn optim1_32bit_matches_host_model_over_steps() {
    for algo in Optim1Algo::ALL {
        for wd in [0.0, 0.05] {
            let spec = Optim1Spec {
                algo,
                state: StateBits::Bits32,
                dtype: DType::F32,
            };
            let k = spec.build().unwrap();
            qforge_ir::verify(&k).unwrap();
            let h = hyper(algo, wd);
            let n = 300;
            let mut p = init_p(n);
            let mut s = vec![0.0f32; n];
            let (mut pb, mut sb) = (bytes(DType::F32, &p), bytes(DType::F32, &s));
            for t in 1..=4 {
                let g = grads(n, t);
                for i in 0..n {
                    (s[i], p[i]) = model(algo, &h, false, t, g[i], p[i], s[i]);
                }
                let mut args = scalar_args(algo, &h, n, t);
                args.extend([
                    OwnedArg::Write(pb),
                    OwnedArg::Read(bytes(DType::F32, &g)),
                    OwnedArg::Write(sb),
                ]);
                run(&k, &mut args);
                let base = args.len() - 3;
                let kp = floats(DType::F32, out(&args, base));
                let ks = floats(DType::F32, out(&args, base + 2));
                for i in 0..n {
                    let what = format!("{} wd {wd} t{t}", k.name);
                    assert_eq!(ks[i].to_bits(), s[i].to_bits(), "{what} s[{i}]");
                    assert_eq!(kp[i].to_bits(), p[i].to_bits(), "{what} p[{i}]");
                }
                pb = out(&args, base).to_vec();
                sb = out(&args, base + 2).to_vec();
            }
            // Some parameters moved and the non-finite ones kept their value.
            assert_ne!(p, init_p(n), "{}", k.name);
        }
    }
}

#[test]
fn optim1_8bit_matches_host_model_over_steps() {
    let code = BlockwiseMap::Dynamic.code();
    for algo in Optim1Algo::ALL {
        for wd in [0.0, 0.05] {
            let spec = Optim1Spec {
                algo,
                state: StateBits::Bits8,
                dtype: DType::F32,
            };
            let k = spec.build().unwrap();
            qforge_ir::verify(&k).unwrap();
            let h = hyper(algo, wd);
            // Two full blocks and a partial one; block 1 gets only zero gradients at step 1.
            let n: usize = 2 * 256 + 77;
            let nb = n.div_ceil(256);
            let mut p: Vec<f32> = (0..n).map(|i| (i as f32 - 300.0) * 0.003).collect();
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
                if t == 1 {
                    g[256..512].iter_mut().for_each(|x| *x = 0.0);
                }
                let mut s = vec![0.0f32; n];
                for i in 0..n {
                    let s_old = code[q[i] as usize] * a[i / 256];
                    (s[i], p[i]) = model(algo, &h, true, t, g[i], p[i], s_old);
                }
                for b in 0..nb {
                    let r = b * 256..((b + 1) * 256).min(n);
                    a[b] = s[r.clone()].iter().fold(0.0f32, |m, x| m.max(x.abs()));
                    let inv = 1.0 / a[b].max(1e-38);
                    for i in r {
                        q[i] = nearest(&code, s[i] * inv);
                    }
                }
                let mut args = scalar_args(algo, &h, n, t);
                tail[1] = OwnedArg::Read(bytes(DType::F32, &g));
                args.extend(tail);
                let what = format!("{} wd {wd} t{t}", k.name);
                tail = run_and_check8(&k, args, &what, &q, &a, &p);
            }
        }
    }
}

#[test]
fn optim1_hyperparameters_are_checked() {
    let h = Optim1Hyper::defaults(Optim1Algo::Lion);
    let e = h.scalars(Optim1Algo::Lion, 0).unwrap_err().to_string();
    assert!(e.contains("step"), "{e}");
    let e = Optim1Hyper { beta2: 1.0, ..h }
        .scalars(Optim1Algo::Lion, 1)
        .unwrap_err()
        .to_string();
    assert!(e.contains("lion") && e.contains("beta2"), "{e}");
    // Adagrad ignores the betas but needs eps > 0.
    let a = Optim1Hyper {
        beta1: 0.5,
        eps: 0.0,
        ..Optim1Hyper::defaults(Optim1Algo::Adagrad)
    };
    let e = a.scalars(Optim1Algo::Adagrad, 1).unwrap_err().to_string();
    assert!(e.contains("eps"), "{e}");
    let e = Optim1Hyper {
        weight_decay: -1.0,
        ..Optim1Hyper::defaults(Optim1Algo::Sgd)
    }
    .scalars(Optim1Algo::Sgd, 1)
    .unwrap_err()
    .to_string();
    assert!(e.contains("weight_decay"), "{e}");
    // Derived in f64, rounded once.
    let s = Optim1Hyper {
        weight_decay: 0.1,
        ..h
    }
    .scalars(Optim1Algo::Lion, 2)
    .unwrap();
    assert_eq!(s.decay, (1.0f64 - 1e-4 * 0.1) as f32);
    assert_eq!(s.one_minus_beta2, (1.0f64 - 0.99) as f32);
    assert_eq!((s.first, s.neg_lr), (0, -1e-4f32));
    assert_eq!(h.scalars(Optim1Algo::Lion, 1).unwrap().first, 1);
    let spec = Optim1Spec {
        algo: Optim1Algo::Rmsprop,
        state: StateBits::Bits8,
        dtype: DType::BF16,
    };
    let e = spec.build().unwrap_err().to_string();
    assert!(e.contains("rmsprop8bit_bf16") && e.contains("f32"), "{e}");
}

/// The typed kernels refuse the other state width, and their arguments are checked by name:
/// a `_gs` kernel launched without `gnorm_scale` is an error naming it.
#[test]
fn typed_kernels_check_the_state_width_and_the_gs_arguments() {
    use crate::optim1::Optim1Update32Args;
    use qforge_ir::dsl::{FloatIn, FloatOut};
    let spec = |state| Optim1Spec {
        algo: Optim1Algo::Sgd,
        state,
        dtype: DType::F32,
    };
    assert!(spec(StateBits::Bits8).typed32("x", false).is_err());
    assert!(spec(StateBits::Bits32).typed8("x", false).is_err());
    let k = spec(StateBits::Bits32)
        .typed32("sgd32_f32_gs", true)
        .unwrap();
    let (mut p, g, mut s) = (vec![0u8; 8], vec![0u8; 8], vec![0.0f32; 2]);
    let s1 = Optim1Hyper::defaults(Optim1Algo::Sgd)
        .scalars(Optim1Algo::Sgd, 1)
        .unwrap();
    let mut args = Optim1Update32Args {
        n: 2,
        n_blocks: 1,
        first: s1.first,
        beta1: s1.beta1,
        one_minus_beta1: s1.one_minus_beta1,
        beta2: s1.beta2,
        one_minus_beta2: s1.one_minus_beta2,
        weight_decay: s1.weight_decay,
        decay: s1.decay,
        eps: s1.eps,
        lr: s1.lr,
        neg_lr: s1.neg_lr,
        gnorm_scale: None,
        skip_zeros: Some(0),
        p: FloatOut {
            dtype: DType::F32,
            bytes: &mut p,
        },
        g: FloatIn {
            dtype: DType::F32,
            bytes: &g,
        },
        state1: &mut s,
        scale: None,
    };
    let e = k.args(&mut args).unwrap_err().to_string();
    assert!(e.contains("gnorm_scale"), "{e}");
    args.gnorm_scale = Some(1.0);
    assert!(k.args(&mut args).is_ok());
}
