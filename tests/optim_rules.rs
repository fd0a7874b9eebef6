//! One-state optimizer rules (Lion, SGD with momentum, RMSprop, Adagrad) and AdEMAMix, 32-bit
//! and 8-bit blockwise state, through the runtime's host ops on every device present
//! (interpreter, CPU), against an independent plain-Rust model of each formula written here:
//! parameters, state,
//! codes and absmax bit-exact over 5 steps, with NaN/±inf/±0/subnormal gradients, weight decay,
//! and a partial last block. There is no bitsandbytes golden data for these rules.

use qforge::ir::DType;
use qforge::kernels::ops::{self, AdemamixState32, AdemamixState8, GradOptions, Optim1State8};
use qforge::kernels::{AdemamixHyper, BlockwiseMap, Optim1Algo, Optim1Hyper};
use qforge::runtime::{CpuDevice, Device, HostTensor, InterpreterDevice};

fn devices() -> Vec<Box<dyn Device>> {
    let mut d: Vec<Box<dyn Device>> = vec![Box::new(InterpreterDevice)];
    match CpuDevice::new() {
        Ok(cpu) => d.push(Box::new(cpu)),
        Err(e) => qforge_testkit::unavailable(
            "cpu",
            format!("optimizer tests run on the interpreter: {e}"),
        ),
    }
    d
}

fn tensor(v: &[f32]) -> HostTensor {
    HostTensor::new(
        DType::F32,
        vec![v.len()],
        v.iter().flat_map(|x| x.to_le_bytes()).collect(),
    )
    .expect("tensor")
}

fn values(t: &HostTensor) -> Vec<f32> {
    t.data
        .chunks(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Exact nearest code (f64 distances, ties to the lower index, NaN to 0).
fn nearest(code: &[f32], v: f32) -> u8 {
    let d = |k: usize| (v as f64 - code[k] as f64).abs();
    if v.is_nan() {
        return 0;
    }
    (1..code.len()).fold(0, |best, k| if d(k) < d(best) { k } else { best }) as u8
}

/// The model of one element at step `t`: `(state, param)`.
fn model(
    a: Optim1Algo,
    h: &Optim1Hyper,
    bits8: bool,
    t: u32,
    g: f32,
    p: f32,
    s: f32,
) -> (f32, f32) {
    if !g.is_finite() {
        return (0.0, p);
    }
    let lr = h.lr as f32;
    let b1 = h.beta1 as f32;
    let gw = match a {
        Optim1Algo::Lion => g,
        _ if h.weight_decay > 0.0 => p.mul_add(h.weight_decay as f32, g),
        _ => g,
    };
    match a {
        Optim1Algo::Lion => {
            let p = p * (1.0 - h.lr * h.weight_decay) as f32;
            let u = s.mul_add(b1, (1.0 - h.beta1) as f32 * g);
            let s = s.mul_add(h.beta2 as f32, (1.0 - h.beta2) as f32 * g);
            let p = match u.partial_cmp(&0.0) {
                Some(std::cmp::Ordering::Greater) => p - lr,
                Some(std::cmp::Ordering::Less) => p + lr,
                _ => p,
            };
            (s, p)
        }
        Optim1Algo::Sgd => {
            let s = if t == 1 { gw } else { s.mul_add(b1, gw) };
            (s, (-lr).mul_add(s, p))
        }
        Optim1Algo::Rmsprop | Optim1Algo::Adagrad => {
            let s = if a == Optim1Algo::Rmsprop {
                {
                    let c = (1.0 - h.beta1) as f32;
                    s.mul_add(b1, if bits8 { c * (gw * gw) } else { (c * gw) * gw })
                }
            } else {
                gw.mul_add(gw, s)
            };
            let x = if bits8 { g } else { gw };
            (s, (-lr).mul_add(x / (s.sqrt() + h.eps as f32), p))
        }
    }
}

fn grad(n: usize, t: u32) -> Vec<f32> {
    (0..n)
        .map(|i| match (i * 7 + t as usize) % 53 {
            0 => f32::NAN,
            1 => f32::INFINITY,
            2 => f32::NEG_INFINITY,
            3 => 0.0,
            4 => -0.0,
            5 => -3e-42,
            k => ((k * 31 + t as usize * 17) % 97) as f32 * 0.021 - 1.0,
        })
        .collect()
}

fn hyper(a: Optim1Algo) -> Optim1Hyper {
    Optim1Hyper {
        lr: 2e-3,
        weight_decay: 0.02,
        ..Optim1Hyper::defaults(a)
    }
}

const N: usize = 1000; // 3 full blocks of 256 and a partial one of 232.
const STEPS: u32 = 5;

#[test]
fn one_state_rules_32bit_match_the_model_on_every_device() {
    let mut launches = 0;
    for dev in devices() {
        for a in Optim1Algo::ALL {
            let h = hyper(a);
            let p0: Vec<f32> = (0..N).map(|i| (i as f32 - 500.0) * 0.002).collect();
            let (mut p, mut s) = (p0.clone(), vec![0.0f32; N]);
            let mut pt = tensor(&p0);
            let mut st = vec![0.0f32; N];
            for t in 1..=STEPS {
                let g = grad(N, t);
                for i in 0..N {
                    (s[i], p[i]) = model(a, &h, false, t, g[i], p[i], s[i]);
                }
                ops::optim1_step_32bit(
                    dev.as_ref(),
                    a,
                    &mut pt,
                    &tensor(&g),
                    &mut st,
                    &h,
                    t,
                    &GradOptions::default(),
                )
                .expect("step");
                launches += 1;
                let kp = values(&pt);
                for i in 0..N {
                    let what = format!("{} {} t{t} [{i}]", dev.name(), a.name());
                    assert_eq!(st[i].to_bits(), s[i].to_bits(), "{what} state");
                    assert_eq!(kp[i].to_bits(), p[i].to_bits(), "{what} param");
                }
            }
            assert!(p.iter().zip(&p0).filter(|(x, y)| x != y).count() > N / 2);
        }
    }
    println!("one-state 32-bit: {launches} steps compared bit-exact");
}

#[test]
fn one_state_rules_8bit_match_the_model_on_every_device() {
    let code = BlockwiseMap::Dynamic.code();
    let mut launches = 0;
    for dev in devices() {
        for a in Optim1Algo::ALL {
            let h = hyper(a);
            let mut p: Vec<f32> = (0..N).map(|i| (i as f32 - 500.0) * 0.002).collect();
            let mut pt = tensor(&p);
            let mut st = Optim1State8::zeros(N);
            let (mut q, mut absmax) = (vec![0u8; N], vec![0.0f32; N.div_ceil(256)]);
            for t in 1..=STEPS {
                let g = grad(N, t);
                let mut s = vec![0.0f32; N];
                for i in 0..N {
                    let old = code[q[i] as usize] * absmax[i / 256];
                    (s[i], p[i]) = model(a, &h, true, t, g[i], p[i], old);
                }
                for (b, am) in absmax.iter_mut().enumerate() {
                    let r = b * 256..((b + 1) * 256).min(N);
                    *am = s[r.clone()].iter().fold(0.0f32, |m, x| m.max(x.abs()));
                    let inv = 1.0 / am.max(1e-38);
                    for i in r {
                        q[i] = nearest(&code, s[i] * inv);
                    }
                }
                ops::optim1_step_8bit(
                    dev.as_ref(),
                    a,
                    &mut pt,
                    &tensor(&g),
                    &mut st,
                    &h,
                    t,
                    &GradOptions::default(),
                )
                .expect("step");
                launches += 1;
                let what = format!("{} {}8bit t{t}", dev.name(), a.name());
                assert_eq!(st.state1, q, "{what} codes");
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&st.absmax1), bits(&absmax), "{what} absmax");
                assert_eq!(bits(&values(&pt)), bits(&p), "{what} params");
            }
        }
    }
    println!("one-state 8-bit: {launches} steps compared bit-exact");
}

#[test]
fn one_state_host_ops_reject_bad_inputs_and_keep_non_finite_elements() {
    let dev = InterpreterDevice;
    let h = hyper(Optim1Algo::Lion);
    let mut p = tensor(&[1.0; 4]);
    let e = ops::optim1_step_32bit(
        &dev,
        Optim1Algo::Lion,
        &mut p,
        &tensor(&[0.5; 3]),
        &mut [0.0; 4],
        &h,
        1,
        &GradOptions::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("shape"), "{e}");
    let g = tensor(&[0.5; 4]);
    let e = ops::optim1_step_32bit(
        &dev,
        Optim1Algo::Sgd,
        &mut p,
        &g,
        &mut [0.0; 3],
        &h,
        1,
        &GradOptions::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("state1"), "{e}");
    let e = ops::optim1_step_32bit(
        &dev,
        Optim1Algo::Sgd,
        &mut p,
        &g,
        &mut [0.0; 4],
        &h,
        0,
        &GradOptions::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("step"), "{e}");
    let mut bad = Optim1State8::zeros(4);
    bad.absmax1.push(0.0);
    let e = ops::optim1_step_8bit(
        &dev,
        Optim1Algo::Adagrad,
        &mut p,
        &g,
        &mut bad,
        &h,
        1,
        &GradOptions::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("absmax1"), "{e}");
    let mut half = HostTensor::new(DType::BF16, vec![4], vec![0; 8]).expect("tensor");
    let g16 = HostTensor::new(DType::BF16, vec![4], vec![0; 8]).expect("tensor");
    let e = ops::optim1_step_32bit(
        &dev,
        Optim1Algo::Rmsprop,
        &mut half,
        &g16,
        &mut [0.0; 4],
        &h,
        1,
        &GradOptions::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("f32"), "{e}");
    // Lion moves each parameter with a finite gradient by exactly lr (after the decay), and a
    // NaN / inf gradient leaves the parameter and zeroes the state.
    let g = tensor(&[f32::NAN, 0.5, f32::INFINITY, -1.0]);
    let mut s = [0.25f32; 4];
    ops::optim1_step_32bit(
        &dev,
        Optim1Algo::Lion,
        &mut p,
        &g,
        &mut s,
        &h,
        1,
        &GradOptions::default(),
    )
    .expect("step");
    let decayed = (1.0 - h.lr * h.weight_decay) as f32;
    let got = values(&p);
    assert_eq!((got[0], got[2]), (1.0, 1.0));
    assert_eq!((s[0], s[2]), (0.0, 0.0));
    assert_eq!(got[1], decayed - h.lr as f32);
    assert_eq!(
        got[3],
        decayed - h.lr as f32,
        "u = 0.9*0.25 - 0.1 > 0: still a step down"
    );
}

/// The AdEMAMix model of one element at step `t`: `([m1, nu, m2], param)`.
fn ademamix_model(h: &AdemamixHyper, t: u32, g: f32, p: f32, s: [f32; 3]) -> ([f32; 3], f32) {
    if !g.is_finite() {
        return ([0.0; 3], p);
    }
    let alpha = (t as f64 * h.alpha / 4.0).min(h.alpha) as f32; // t_alpha = 4
    let b3 = h.beta3 as f32; // no beta3 scheduler here
    let c1 = (1.0 - h.beta1.powi(t as i32)) as f32;
    let c2 = (1.0 - h.beta2.powi(t as i32)).sqrt() as f32;
    let m1 = s[0].mul_add(h.beta1 as f32, (1.0 - h.beta1) as f32 * g);
    let nu = s[1].mul_add(h.beta2 as f32, ((1.0 - h.beta2) as f32 * g) * g);
    let m2 = s[2].mul_add(b3, (1.0 - h.beta3) as f32 * g);
    let p = p * (1.0 - h.lr * h.weight_decay) as f32;
    let upd = alpha.mul_add(m2, m1 / c1) / (nu.sqrt() / c2 + h.eps as f32);
    ([m1, nu, m2], (-h.lr as f32).mul_add(upd, p))
}

#[test]
fn ademamix_matches_the_model_on_every_device() {
    let h = AdemamixHyper {
        t_alpha: Some(4),
        lr: 3e-3,
        ..AdemamixHyper::default()
    };
    let signed = BlockwiseMap::Dynamic.code();
    let maps = [&signed, &BlockwiseMap::DynamicUnsigned.code(), &signed].map(|m| m.clone());
    let mut launches = 0;
    for dev in devices() {
        let p0: Vec<f32> = (0..N).map(|i| (i as f32 - 500.0) * 0.002).collect();
        // 32-bit.
        let (mut p, mut s) = (p0.clone(), vec![[0.0f32; 3]; N]);
        let mut pt = tensor(&p0);
        let mut st = AdemamixState32::zeros(N);
        for t in 1..=STEPS {
            let g = grad(N, t);
            for i in 0..N {
                (s[i], p[i]) = ademamix_model(&h, t, g[i], p[i], s[i]);
            }
            ops::ademamix_step_32bit(dev.as_ref(), &mut pt, &tensor(&g), &mut st, &h, t)
                .expect("step");
            launches += 1;
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            for (k, got) in [&st.m1, &st.nu, &st.m2].into_iter().enumerate() {
                let want: Vec<f32> = s.iter().map(|x| x[k]).collect();
                assert_eq!(
                    bits(got),
                    bits(&want),
                    "{} 32-bit t{t} state {k}",
                    dev.name()
                );
            }
            assert_eq!(
                bits(&values(&pt)),
                bits(&p),
                "{} 32-bit t{t} params",
                dev.name()
            );
        }
        // 8-bit.
        let mut p = p0.clone();
        let mut pt = tensor(&p0);
        let mut st = AdemamixState8::zeros(N);
        let mut q = [vec![0u8; N], vec![0u8; N], vec![0u8; N]];
        let mut am = [0, 1, 2].map(|_| vec![0.0f32; N.div_ceil(256)]);
        for t in 1..=STEPS {
            let g = grad(N, t);
            let mut s = vec![[0.0f32; 3]; N];
            for i in 0..N {
                let old = [0, 1, 2].map(|k| maps[k][q[k][i] as usize] * am[k][i / 256]);
                (s[i], p[i]) = ademamix_model(&h, t, g[i], p[i], old);
            }
            for k in 0..3 {
                for (b, a) in am[k].iter_mut().enumerate() {
                    let r = b * 256..((b + 1) * 256).min(N);
                    *a = r.clone().fold(0.0f32, |m, i| m.max(s[i][k].abs()));
                    let inv = 1.0 / a.max(1e-38);
                    for i in r {
                        q[k][i] = nearest(&maps[k], s[i][k] * inv);
                    }
                }
            }
            ops::ademamix_step_8bit(dev.as_ref(), &mut pt, &tensor(&g), &mut st, &h, t)
                .expect("step");
            launches += 1;
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            for k in 0..3 {
                assert_eq!(st.codes[k], q[k], "{} 8-bit t{t} codes {k}", dev.name());
                assert_eq!(
                    bits(&st.absmax[k]),
                    bits(&am[k]),
                    "{} t{t} absmax {k}",
                    dev.name()
                );
            }
            assert_eq!(
                bits(&values(&pt)),
                bits(&p),
                "{} 8-bit t{t} params",
                dev.name()
            );
        }
    }
    println!("AdEMAMix: {launches} steps compared bit-exact");
    let e = ops::ademamix_step_8bit(
        &InterpreterDevice,
        &mut tensor(&[1.0; 4]),
        &tensor(&[1.0; 4]),
        &mut AdemamixState8::zeros(3),
        &h,
        1,
    )
    .unwrap_err();
    assert!(e.to_string().contains("codes[0]"), "{e}");
}
