//! The optimizer kernels on the reference interpreter against an independent host model written
//! here in plain Rust (`f32::mul_add` for `fma`, an `f64` brute-force nearest-code search for the
//! 8-bit requantization), over several steps, with NaN, inf and zero gradients.

use crate::adam::{AdamHyper, OptimAlgo, OptimSpec, StateBits};
use crate::test_util::{bytes, floats, round};
use crate::test_util::{nearest, out, run};
use crate::BlockwiseMap;
use qforge_ir::OwnedArg;
use qforge_ir::{DType, Scalar};

/// Host model of one element's moments: `(finite, m, v)`.
fn model_moments(h: &AdamHyper, g: f32, m: f32, v: f32) -> (bool, f32, f32) {
    if !g.is_finite() {
        return (false, 0.0, 0.0);
    }
    let m = g.mul_add((1.0 - h.beta1) as f32, m * h.beta1 as f32);
    let v = (((1.0 - h.beta2) as f32) * g).mul_add(g, v * h.beta2 as f32);
    (true, m, v)
}

fn bias(h: &AdamHyper, t: u32) -> (f64, f64) {
    (
        1.0 - h.beta1.powi(t as i32),
        (1.0 - h.beta2.powi(t as i32)).sqrt(),
    )
}

fn decay(h: &AdamHyper, algo: OptimAlgo, p: f32) -> f32 {
    match algo {
        OptimAlgo::Adam => p,
        OptimAlgo::AdamW => p * (1.0 - h.lr * h.weight_decay) as f32,
    }
}

pub(crate) fn grads(n: usize, step: u32) -> Vec<f32> {
    (0..n)
        .map(|i| match (i + step as usize) % 41 {
            0 => f32::NAN,
            1 => f32::INFINITY,
            2 => f32::NEG_INFINITY,
            3 => 0.0,
            4 => -0.0,
            5 => 1e-41,
            _ => ((i * 37 + step as usize * 11) % 101) as f32 * 0.013 - 0.6,
        })
        .collect()
}

pub(crate) fn hyper(algo: OptimAlgo) -> AdamHyper {
    AdamHyper {
        lr: 3e-3,
        beta1: 0.85,
        beta2: 0.99,
        eps: 1e-6,
        weight_decay: if algo == OptimAlgo::AdamW { 0.05 } else { 0.0 },
    }
}

fn scalar_args(spec: &OptimSpec, h: &AdamHyper, n: usize, t: u32) -> Vec<OwnedArg> {
    let mut args = vec![
        OwnedArg::Scalar(Scalar::U32(n as u32)),
        OwnedArg::Scalar(Scalar::U32(n.div_ceil(256) as u32)),
    ];
    let s = h.scalars(spec, t).unwrap();
    args.extend(s.kernel_args(spec).into_iter().map(OwnedArg::Scalar));
    args
}

#[test]
fn optim_32bit_matches_host_model_over_steps() {
    for algo in [OptimAlgo::Adam, OptimAlgo::AdamW] {
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            let spec = OptimSpec {
                algo,
                state: StateBits::Bits32,
                dtype,
            };
            let k = spec.build().unwrap();
            qforge_ir::verify(&k).unwrap();
            let h = hyper(algo);
            let n = 300;
            let mut p: Vec<f32> = (0..n)
                .map(|i| round(dtype, (i as f32 - 150.0) * 0.01))
                .collect();
            let (mut m, mut v) = (vec![0.0f32; n], vec![0.0f32; n]);
            let mut args: Vec<OwnedArg> = Vec::new();
            for t in 1..=4 {
                let g: Vec<f32> = grads(n, t).iter().map(|x| round(dtype, *x)).collect();
                // Model.
                let (c1, c2) = bias(&h, t);
                for i in 0..n {
                    let (fin, mi, vi) = model_moments(&h, g[i], m[i], v[i]);
                    m[i] = mi;
                    v[i] = vi;
                    if fin {
                        let pi = decay(&h, algo, p[i]);
                        let r = mi / (vi.sqrt() + (h.eps * c2) as f32);
                        p[i] = round(dtype, r.mul_add((-h.lr * c2 / c1) as f32, pi));
                    }
                }
                // Kernel, fed with its own previous outputs.
                let (pb, mb, vb) = if t == 1 {
                    let p0: Vec<f32> = (0..n)
                        .map(|i| round(dtype, (i as f32 - 150.0) * 0.01))
                        .collect();
                    (
                        bytes(dtype, &p0),
                        bytes(DType::F32, &vec![0.0; n]),
                        bytes(DType::F32, &vec![0.0; n]),
                    )
                } else {
                    let base = args.len() - 4;
                    (
                        out(&args, base).to_vec(),
                        out(&args, base + 2).to_vec(),
                        out(&args, base + 3).to_vec(),
                    )
                };
                args = scalar_args(&spec, &h, n, t);
                args.extend([
                    OwnedArg::Write(pb),
                    OwnedArg::Read(bytes(dtype, &g)),
                    OwnedArg::Write(mb),
                    OwnedArg::Write(vb),
                ]);
                run(&k, &mut args);
                let base = args.len() - 4;
                let (kp, km, kv) = (
                    floats(dtype, out(&args, base)),
                    floats(DType::F32, out(&args, base + 2)),
                    floats(DType::F32, out(&args, base + 3)),
                );
                for i in 0..n {
                    assert_eq!(km[i].to_bits(), m[i].to_bits(), "{} t{t} m[{i}]", k.name);
                    assert_eq!(kv[i].to_bits(), v[i].to_bits(), "{} t{t} v[{i}]", k.name);
                    assert_eq!(kp[i].to_bits(), p[i].to_bits(), "{} t{t} p[{i}]", k.name);
                }
            }
        }
    }
}

#[test]
fn optim_8bit_matches_host_model_over_steps() {
    let code1 = BlockwiseMap::Dynamic.code();
    let code2 = BlockwiseMap::DynamicUnsigned.code();
    for algo in [OptimAlgo::Adam, OptimAlgo::AdamW] {
        for dtype in [DType::F32, DType::BF16] {
            let spec = OptimSpec {
                algo,
                state: StateBits::Bits8,
                dtype,
            };
            let k = spec.build().unwrap();
            qforge_ir::verify(&k).unwrap();
            let h = hyper(algo);
            // Two full blocks and a partial one; block 1 gets only zero gradients at step 1.
            let n = 2 * 256 + 77;
            let mut p: Vec<f32> = (0..n)
                .map(|i| round(dtype, (i as f32 - 300.0) * 0.003))
                .collect();
            let (mut q1, mut q2) = (vec![0u8; n], vec![0u8; n]);
            let nb = n.div_ceil(256);
            let (mut a1, mut a2) = (vec![0.0f32; nb], vec![0.0f32; nb]);
            let mut state: Option<Vec<OwnedArg>> = None;
            for t in 1..=4 {
                let mut g: Vec<f32> = grads(n, t).iter().map(|x| round(dtype, *x)).collect();
                if t == 1 {
                    g[256..512].iter_mut().for_each(|x| *x = 0.0);
                }
                // Model.
                let (c1, c2) = bias(&h, t);
                let mut ms = vec![0.0f32; n];
                let mut vs = vec![0.0f32; n];
                for i in 0..n {
                    let b = i / 256;
                    let m_old = code1[q1[i] as usize] * a1[b];
                    let v_old = code2[q2[i] as usize] * a2[b];
                    let (fin, m, v) = model_moments(&h, g[i], m_old, v_old);
                    ms[i] = m;
                    vs[i] = v;
                    if fin {
                        let pi = decay(&h, algo, p[i]);
                        let num = (-h.lr / c1) as f32 * m;
                        let den = v.sqrt() / c2 as f32 + h.eps as f32;
                        p[i] = round(dtype, pi + num / den);
                    }
                }
                for b in 0..nb {
                    let r = b * 256..((b + 1) * 256).min(n);
                    a1[b] = ms[r.clone()].iter().fold(0.0f32, |a, x| a.max(x.abs()));
                    a2[b] = vs[r.clone()].iter().fold(0.0f32, |a, x| a.max(x.abs()));
                    let (i1, i2) = (1.0 / a1[b].max(1e-38), 1.0 / a2[b].max(1e-38));
                    for i in r {
                        q1[i] = nearest(&code1, ms[i] * i1);
                        q2[i] = nearest(&code2, vs[i] * i2);
                    }
                }
                // Kernel, fed with its own previous outputs.
                let tail: Vec<OwnedArg> = match state.take() {
                    None => {
                        let p0: Vec<f32> = (0..n)
                            .map(|i| round(dtype, (i as f32 - 300.0) * 0.003))
                            .collect();
                        vec![
                            OwnedArg::Write(bytes(dtype, &p0)),
                            OwnedArg::Read(vec![]),
                            OwnedArg::Write(vec![0; n]),
                            OwnedArg::Write(vec![0; 4 * nb]),
                            OwnedArg::Write(vec![0; n]),
                            OwnedArg::Write(vec![0; 4 * nb]),
                        ]
                    }
                    Some(prev) => prev[prev.len() - 6..].to_vec(),
                };
                let mut args = scalar_args(&spec, &h, n, t);
                args.extend(tail);
                let base = args.len() - 6;
                args[base + 1] = OwnedArg::Read(bytes(dtype, &g));
                run(&k, &mut args);
                let kp = floats(dtype, out(&args, base));
                assert_eq!(out(&args, base + 2), &q1[..], "{} t{t} state1", k.name);
                assert_eq!(out(&args, base + 4), &q2[..], "{} t{t} state2", k.name);
                let ka1 = floats(DType::F32, out(&args, base + 3));
                let ka2 = floats(DType::F32, out(&args, base + 5));
                for b in 0..nb {
                    assert_eq!(
                        ka1[b].to_bits(),
                        a1[b].to_bits(),
                        "{} t{t} absmax1[{b}]",
                        k.name
                    );
                    assert_eq!(
                        ka2[b].to_bits(),
                        a2[b].to_bits(),
                        "{} t{t} absmax2[{b}]",
                        k.name
                    );
                }
                for i in 0..n {
                    assert_eq!(kp[i].to_bits(), p[i].to_bits(), "{} t{t} p[{i}]", k.name);
                }
                state = Some(args);
            }
            // The model's zero block at step 1 and the non-finite elements were exercised.
            assert!(grads(n, 1).iter().any(|x| x.is_nan()));
        }
    }
}

#[test]
fn optim_hyperparameters_are_checked_and_derived_in_f64() {
    let spec = OptimSpec {
        algo: OptimAlgo::Adam,
        state: StateBits::Bits8,
        dtype: DType::F32,
    };
    let bad = AdamHyper {
        weight_decay: 0.1,
        ..AdamHyper::default()
    };
    let e = bad.scalars(&spec, 1).unwrap_err().to_string();
    assert!(e.contains("weight_decay") && e.contains("AdamW"), "{e}");
    let e = AdamHyper::default()
        .scalars(&spec, 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("step"), "{e}");
    let e = AdamHyper {
        beta2: 1.0,
        ..AdamHyper::default()
    }
    .scalars(&spec, 1)
    .unwrap_err()
    .to_string();
    assert!(e.contains("beta2"), "{e}");
    let s = AdamHyper::default().scalars(&spec, 2).unwrap();
    // c1 = 1 - 0.9^2 = 0.19, c2 = sqrt(1 - 0.999^2) (f64, rounded once).
    assert_eq!(s.step_size, (-1e-3f64 / (1.0 - 0.81)) as f32);
    assert_eq!(s.c2, (1.0f64 - 0.998001).sqrt() as f32);
    assert_eq!(s.one_minus_beta1.to_bits(), 0x3dcc_cccd);
    assert!(OptimSpec {
        dtype: DType::U8,
        ..spec
    }
    .build()
    .is_err());
}
