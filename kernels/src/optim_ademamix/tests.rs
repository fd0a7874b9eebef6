//! The AdEMAMix kernels on the reference interpreter against an independent host model written
//! here in plain Rust (`f32::mul_add` for `fma`, an `f64` brute-force nearest-code search for the
//! 8-bit requantization), over several steps with both schedulers, NaN/±inf/±0/subnormal
//! gradients and a partial last block.
#![allow(clippy::needless_range_loop)] // element-wise models index several arrays

use crate::adam::StateBits;
use crate::optim_ademamix::{AdemamixHyper, AdemamixSpec};
use crate::test_util::{bytes, floats};
use crate::test_util::{nearest, out};
use crate::BlockwiseMap;
use qforge_ir::OwnedArg;
use qforge_ir::{DType, Scalar};

fn hyper() -> AdemamixHyper {
    AdemamixHyper {
        lr: 2e-3,
        beta1: 0.8,
        beta2: 0.95,
        beta3: 0.99,
        alpha: 3.0,
        eps: 1e-6,
        weight_decay: 0.03,
        t_alpha: Some(6),
        t_beta3: Some(5),
    }
}

/// Host model: `[m1, nu, m2]` and `p` after step `t`.
fn model(h: &AdemamixHyper, t: u32, g: f32, p: f32, s: [f32; 3]) -> ([f32; 3], f32) {
    if !g.is_finite() {
        return ([0.0; 3], p);
    }
    // Schedulers, written out independently of `AdemamixHyper::scheduled`.
    let f = t as f64 / 5.0;
    let (l1, l3) = (0.8f64.ln(), 0.99f64.ln());
    let beta3 = ((l1 * l3) / ((1.0 - f) * l3 + f * l1)).exp().min(0.99);
    let alpha = (3.0 * t as f64 / 6.0).min(3.0) as f32;
    let c1 = (1.0 - 0.8f64.powi(t as i32)) as f32;
    let c2 = (1.0 - 0.95f64.powi(t as i32)).sqrt() as f32;
    let m1 = s[0].mul_add(0.8, (1.0 - h.beta1) as f32 * g);
    let nu = s[1].mul_add(0.95, ((1.0 - h.beta2) as f32 * g) * g);
    let m2 = s[2].mul_add(beta3 as f32, (1.0 - beta3) as f32 * g);
    let p = p * (1.0 - h.lr * h.weight_decay) as f32;
    let num = alpha.mul_add(m2, m1 / c1);
    let den = nu.sqrt() / c2 + h.eps as f32;
    ([m1, nu, m2], (-h.lr as f32).mul_add(num / den, p))
}

fn grads(n: usize, step: u32) -> Vec<f32> {
    (0..n)
        .map(|i| match (i * 5 + step as usize) % 43 {
            0 => f32::NAN,
            1 => f32::INFINITY,
            2 => f32::NEG_INFINITY,
            3 => 0.0,
            4 => -0.0,
            5 => 2e-41,
            k => ((k * 29 + step as usize * 13) % 89) as f32 * 0.017 - 0.7,
        })
        .collect()
}

fn run(spec: &AdemamixSpec, n: usize, t: u32, tail: Vec<OwnedArg>) -> Vec<OwnedArg> {
    let k = spec.build().unwrap();
    qforge_ir::verify(&k).unwrap();
    let mut args = vec![
        OwnedArg::Scalar(Scalar::U32(n as u32)),
        OwnedArg::Scalar(Scalar::U32(n.div_ceil(256) as u32)),
    ];
    let sc = hyper().scalars(t).unwrap();
    args.extend(sc.kernel_args().into_iter().map(OwnedArg::Scalar));
    args.extend(tail);
    let mut borrowed = OwnedArg::borrow_all(&mut args);
    qforge_ir::interp::run(&k, &mut borrowed).unwrap_or_else(|e| panic!("{}: {e}", k.name));
    args
}

#[test]
fn ademamix_32bit_matches_host_model_over_steps() {
    let spec = AdemamixSpec {
        state: StateBits::Bits32,
        dtype: DType::F32,
    };
    let n = 300;
    let h = hyper();
    let mut p: Vec<f32> = (0..n).map(|i| (i as f32 - 150.0) * 0.01).collect();
    let mut s = vec![[0.0f32; 3]; n];
    let mut tail = vec![
        OwnedArg::Write(bytes(DType::F32, &p)),
        OwnedArg::Read(vec![]),
    ];
    tail.extend((0..3).map(|_| OwnedArg::Write(bytes(DType::F32, &vec![0.0; n]))));
    for t in 1..=5 {
        let g = grads(n, t);
        for i in 0..n {
            (s[i], p[i]) = model(&h, t, g[i], p[i], s[i]);
        }
        tail[1] = OwnedArg::Read(bytes(DType::F32, &g));
        let args = run(&spec, n, t, tail);
        let base = args.len() - 5;
        let kp = floats(DType::F32, out(&args, base));
        for k in 0..3 {
            let ks = floats(DType::F32, out(&args, base + 2 + k));
            for i in 0..n {
                assert_eq!(
                    ks[i].to_bits(),
                    s[i][k].to_bits(),
                    "t{t} state{} [{i}]",
                    k + 1
                );
            }
        }
        for i in 0..n {
            assert_eq!(kp[i].to_bits(), p[i].to_bits(), "t{t} p[{i}]");
        }
        tail = args[base..].to_vec();
    }
}

#[test]
fn ademamix_8bit_matches_host_model_over_steps() {
    let spec = AdemamixSpec {
        state: StateBits::Bits8,
        dtype: DType::F32,
    };
    let maps = [
        BlockwiseMap::Dynamic.code(),
        BlockwiseMap::DynamicUnsigned.code(),
        BlockwiseMap::Dynamic.code(),
    ];
    let h = hyper();
    let n: usize = 2 * 256 + 77;
    let nb = n.div_ceil(256);
    let mut p: Vec<f32> = (0..n).map(|i| (i as f32 - 300.0) * 0.003).collect();
    let mut q = vec![vec![0u8; n]; 3];
    let mut a = vec![vec![0.0f32; nb]; 3];
    let mut tail = vec![
        OwnedArg::Write(bytes(DType::F32, &p)),
        OwnedArg::Read(vec![]),
    ];
    for _ in 0..3 {
        tail.push(OwnedArg::Write(vec![0; n]));
        tail.push(OwnedArg::Write(vec![0; 4 * nb]));
    }
    for t in 1..=4 {
        let mut g = grads(n, t);
        if t == 1 {
            g[256..512].iter_mut().for_each(|x| *x = 0.0);
        }
        let mut s = vec![[0.0f32; 3]; n];
        for i in 0..n {
            let old = [0, 1, 2].map(|k| maps[k][q[k][i] as usize] * a[k][i / 256]);
            (s[i], p[i]) = model(&h, t, g[i], p[i], old);
        }
        for k in 0..3 {
            for b in 0..nb {
                let r = b * 256..((b + 1) * 256).min(n);
                a[k][b] = r.clone().fold(0.0f32, |m, i| m.max(s[i][k].abs()));
                let inv = 1.0 / a[k][b].max(1e-38);
                for i in r {
                    q[k][i] = nearest(&maps[k], s[i][k] * inv);
                }
            }
        }
        tail[1] = OwnedArg::Read(bytes(DType::F32, &g));
        let args = run(&spec, n, t, tail);
        let base = args.len() - 8;
        for k in 0..3 {
            assert_eq!(
                out(&args, base + 2 + 2 * k),
                &q[k][..],
                "t{t} state{}",
                k + 1
            );
            let ka = floats(DType::F32, out(&args, base + 3 + 2 * k));
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&ka), bits(&a[k]), "t{t} absmax{}", k + 1);
        }
        let kp = floats(DType::F32, out(&args, base));
        for i in 0..n {
            assert_eq!(kp[i].to_bits(), p[i].to_bits(), "t{t} p[{i}]");
        }
        tail = args[base..].to_vec();
    }
}

#[test]
fn ademamix_hyperparameters_and_schedulers() {
    let h = AdemamixHyper::default();
    assert_eq!(h.scheduled(7), (5.0, 0.9999));
    let s = AdemamixHyper {
        t_alpha: Some(10),
        t_beta3: Some(10),
        ..h
    };
    let (alpha, beta3) = s.scheduled(4);
    assert_eq!(alpha, 2.0);
    // At t = 0 the beta3 warm-up starts at beta1, at t = T it reaches beta3.
    assert!((s.scheduled(0).1 - 0.9).abs() < 1e-12);
    assert!((s.scheduled(10).1 - 0.9999).abs() < 1e-12);
    assert!(beta3 > 0.9 && beta3 < 0.9999, "{beta3}");
    assert_eq!(s.scheduled(20), (5.0, 0.9999));
    let e = h.scalars(0).unwrap_err().to_string();
    assert!(e.contains("step"), "{e}");
    let e = AdemamixHyper { beta3: 1.0, ..h }
        .scalars(1)
        .unwrap_err()
        .to_string();
    assert!(e.contains("beta3"), "{e}");
    let e = AdemamixHyper {
        t_alpha: Some(0),
        ..h
    }
    .scalars(1)
    .unwrap_err()
    .to_string();
    assert!(e.contains("t_alpha"), "{e}");
    let bf = AdemamixSpec {
        state: StateBits::Bits8,
        dtype: DType::BF16,
    };
    assert!(bf.build().unwrap_err().to_string().contains("f32"));
}
