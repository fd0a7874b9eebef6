//! LAMB and LARS (bitsandbytes' `max_unorm` trust ratio) through the optimizer API and the host
//! ops: 10 steps straight equal 5 steps, state_dict, load into a fresh optimizer, 5 steps
//! (parameters and state bit for bit, chunked and unchunked), and equal direct whole-tensor
//! `lamb_step_32bit` / `lars_step_32bit` calls; the Cranelift CPU device equals an independent
//! `f32` model written here (the partial sums in their pinned order) bit for bit, with clipped
//! and unclipped parameters, non-finite gradient elements and a zero parameter; 16-bit LARS
//! parameters, bad hyperparameters and foreign state files are clear errors (8-bit state:
//! `norm8.rs`).
#![allow(clippy::needless_range_loop)] // element-wise models index several arrays

use qforge::ir::DType;
use qforge::kernels::ops::{
    lamb_step_32bit, lars_step_32bit, lars_update_32bit, norm_scale, AdamState32, GradOptions,
    NormPartials,
};
use qforge::kernels::optim::{Optimizer, OptimizerKind, OptimizerOptions, ParamGroup, StateBits};
use qforge::kernels::{LambHyper, LarsHyper};
use qforge::runtime::{Device, HostTensor};
use safetensors::SafeTensors;

use super::{assert_has, cpu, load_err, random_tensor, small_workspace};

/// `a` (f32, parameter norm about 41: clipped), `b` (f32, norm about 10^4: not clipped), `c`
/// (bf16, LAMB only).
fn specs(kind: &OptimizerKind) -> Vec<(&'static str, DType, Vec<usize>, f32)> {
    let mut v = vec![
        ("a", DType::F32, vec![64, 80], 1.0),
        ("b", DType::F32, vec![300], 1000.0),
    ];
    if matches!(kind, OptimizerKind::Lamb(_)) {
        v.push(("c", DType::BF16, vec![7, 33], 0.1));
    }
    v
}

fn init(kind: &OptimizerKind) -> Vec<HostTensor> {
    specs(kind)
        .iter()
        .enumerate()
        .map(|(i, (_, dt, shape, scale))| random_tensor(*dt, shape, 400 + i as u64, *scale))
        .collect()
}

/// The gradients of step `t`, with a NaN and an infinity in `a` on even steps.
fn grads(kind: &OptimizerKind, t: u32) -> Vec<HostTensor> {
    specs(kind)
        .iter()
        .enumerate()
        .map(|(i, (_, dt, shape, _))| {
            let g = random_tensor(*dt, shape, 5000 * t as u64 + i as u64, 0.5);
            if i == 0 && t.is_multiple_of(2) {
                let mut v = g.to_f32().unwrap();
                v[7] = f32::NAN;
                v[300] = f32::NEG_INFINITY;
                HostTensor::from_f32(shape.clone(), &v).unwrap()
            } else {
                g
            }
        })
        .collect()
}

fn lamb() -> OptimizerKind {
    OptimizerKind::Lamb(LambHyper {
        lr: 0.01,
        weight_decay: 0.01,
        ..LambHyper::default()
    })
}

fn lars() -> OptimizerKind {
    OptimizerKind::Lars(LarsHyper {
        lr: 0.1,
        weight_decay: 0.01,
        ..LarsHyper::default()
    })
}

fn make(kind: OptimizerKind, options: OptimizerOptions) -> Optimizer {
    let names: Vec<&str> = specs(&kind).iter().map(|s| s.0).collect();
    Optimizer::with_options(
        vec![ParamGroup::new(names, kind, StateBits::Bits32)],
        options,
    )
    .expect("optimizer")
}

fn run(opt: &mut Optimizer, dev: &dyn Device, ps: &mut [HostTensor], from: u32, to: u32) {
    let kind = opt.groups()[0].kind;
    for t in from..=to {
        opt.step(dev, ps, &grads(&kind, t)).expect("step");
    }
}

/// Direct whole-tensor host ops, step numbers 1..=n; also returns every scale applied.
fn reference(kind: OptimizerKind, dev: &dyn Device, n: u32) -> (Vec<HostTensor>, Vec<f32>) {
    let mut ps = init(&kind);
    let mut adam: Vec<AdamState32> = ps.iter().map(|p| AdamState32::zeros(p.numel())).collect();
    let mut one: Vec<Vec<f32>> = ps.iter().map(|p| vec![0.0; p.numel()]).collect();
    let mut scales = Vec::new();
    for t in 1..=n {
        let g = grads(&kind, t);
        for i in 0..ps.len() {
            let s = match kind {
                OptimizerKind::Lamb(h) => lamb_step_32bit(
                    dev,
                    &mut ps[i],
                    &g[i],
                    &mut adam[i],
                    &h,
                    t,
                    &GradOptions::default(),
                ),
                OptimizerKind::Lars(h) => lars_step_32bit(
                    dev,
                    &mut ps[i],
                    &g[i],
                    &mut one[i],
                    &h,
                    t,
                    &GradOptions::default(),
                ),
                _ => panic!("LAMB / LARS only"),
            };
            scales.push(s.expect("reference step"));
        }
    }
    (ps, scales)
}

#[test]
fn lamb_and_lars_resume_bit_identical_and_match_host_ops() {
    let dev = cpu();
    for kind in [lamb(), lars()] {
        let case = kind.name();
        let mut straight = make(kind, small_workspace());
        let mut ps = init(&kind);
        run(&mut straight, &dev, &mut ps, 1, 10);

        let mut first = make(kind, small_workspace());
        let mut pr = init(&kind);
        run(&mut first, &dev, &mut pr, 1, 5);
        let bytes = first.state_dict().expect("state_dict");
        drop(first);
        let mut second = make(kind, OptimizerOptions::default());
        second.load_state_dict(&bytes).expect("load_state_dict");
        assert_eq!(second.step_count("a"), Some(5), "{case}");
        run(&mut second, &dev, &mut pr, 6, 10);

        assert_eq!(ps, pr, "{case}: parameters differ after resume");
        let sd = straight.state_dict().unwrap();
        assert_eq!(sd, second.state_dict().unwrap(), "{case}: state differs");

        let st = SafeTensors::deserialize(&sd).unwrap();
        let mut names: Vec<String> = st.names().into_iter().cloned().collect();
        names.sort();
        let moments = if case == "lamb" { 2 } else { 1 };
        let mut want = Vec::new();
        for (p, ..) in specs(&kind) {
            for k in 1..=moments {
                want.push(format!("{p}.state{k}"));
            }
        }
        want.sort();
        assert_eq!(names, want, "{case}");

        let (direct, scales) = reference(kind, &dev, 10);
        assert_eq!(ps, direct, "{case}: differs from the host ops");
        assert!(scales.iter().any(|s| *s < 1.0), "{case}: never clipped");
        assert!(scales.contains(&1.0), "{case}: always clipped");
        for (p, p0) in ps.iter().zip(init(&kind)) {
            assert_ne!(p.data, p0.data, "{case}: a parameter did not move");
        }
    }
}

/// Model of one block's sum of squares: 8 partials from `-0.0` (element `i` into `i % 8`,
/// `fma`), then the halving tree.
fn block_sum_sq(x: &[f32]) -> f32 {
    let mut acc = [-0.0f32; 8];
    for (i, v) in x.iter().enumerate() {
        acc[i % 8] = v.mul_add(*v, acc[i % 8]);
    }
    for w in [4, 2, 1] {
        for j in 0..w {
            acc[j] += acc[j + w];
        }
    }
    acc[0]
}

/// Model of the trust-ratio scale: sequential sums of the block sums, square roots.
fn model_scale(u: &[f32], p: &[f32], max_unorm: f32) -> f32 {
    let su = u.chunks(256).map(block_sum_sq).fold(-0.0f32, |a, x| a + x);
    let sp = p.chunks(256).map(block_sum_sq).fold(-0.0f32, |a, x| a + x);
    let (un, pn) = (su.sqrt(), sp.sqrt());
    let thr = max_unorm * pn;
    if max_unorm > 0.0 && un > thr {
        thr / un
    } else {
        1.0
    }
}

/// One LAMB step of the f32 model (f32 parameters).
fn lamb_model(p: &mut [f32], m: &mut [f32], v: &mut [f32], g: &[f32], h: &LambHyper, t: u32) {
    let ti = t as i32;
    let (c1, c2) = (1.0 - h.beta1.powi(ti), 1.0 - h.beta2.powi(ti));
    let (b1, b2, o1, o2) = (
        h.beta1 as f32,
        h.beta2 as f32,
        (1.0 - h.beta1) as f32,
        (1.0 - h.beta2) as f32,
    );
    let n = g.len();
    let mut u = vec![0.0f32; n];
    for i in 0..n {
        if g[i].is_finite() {
            m[i] = g[i].mul_add(o1, m[i] * b1);
            v[i] = (o2 * g[i]).mul_add(g[i], v[i] * b2);
            u[i] = (m[i] * (1.0 / c1) as f32) / ((v[i] * (1.0 / c2) as f32).sqrt() + h.eps as f32);
        } else {
            m[i] = 0.0;
            v[i] = 0.0;
        }
    }
    let ss = model_scale(&u, p, h.max_unorm as f32) * (-h.lr * c2.sqrt() / c1) as f32;
    let (decay, eps_c2) = (
        (1.0 - h.lr * h.weight_decay) as f32,
        (h.eps * c2.sqrt()) as f32,
    );
    for i in 0..n {
        if g[i].is_finite() {
            p[i] = (m[i] / (v[i].sqrt() + eps_c2)).mul_add(ss, p[i] * decay);
        }
    }
}

/// One LARS step of the f32 model.
fn lars_model(p: &mut [f32], s: &mut [f32], g: &[f32], h: &LarsHyper, t: u32) {
    let (mom, wd) = (h.momentum as f32, h.weight_decay as f32);
    let n = g.len();
    let mom_of = |s: f32, x: f32| if t == 1 { x } else { s.mul_add(mom, x) };
    let u: Vec<f32> = (0..n)
        .map(|i| {
            if g[i].is_finite() {
                mom_of(s[i], g[i])
            } else {
                0.0
            }
        })
        .collect();
    let nls = (-h.lr) as f32 * model_scale(&u, p, h.max_unorm as f32);
    for i in 0..n {
        if g[i].is_finite() {
            let gw = if wd > 0.0 {
                p[i].mul_add(wd, g[i])
            } else {
                g[i]
            };
            s[i] = mom_of(s[i], gw);
            p[i] = nls.mul_add(s[i], p[i]);
        } else {
            s[i] = 0.0;
        }
    }
}

#[test]
fn cpu_device_matches_an_independent_f32_model() {
    let dev = cpu();
    for kind in [lamb(), lars()] {
        let case = kind.name();
        let mut opt = make(kind, small_workspace());
        let mut ps = init(&kind);
        ps.truncate(2); // the f32 parameters
                        // `b` replaced by zeros: a zero parameter norm freezes it (scale 0) on every step.
        ps[1] = HostTensor::from_f32(vec![300], &[0.0; 300]).unwrap();
        let names = ["a", "b"];
        let mut model: Vec<Vec<f32>> = ps.iter().map(|p| p.to_f32().unwrap()).collect();
        let mut s1: Vec<Vec<f32>> = model.iter().map(|p| vec![0.0; p.len()]).collect();
        let mut s2 = s1.clone();
        for t in 1..=4 {
            let g: Vec<HostTensor> = grads(&kind, t).into_iter().take(2).collect();
            let mut by_name: std::collections::HashMap<String, HostTensor> = names
                .iter()
                .map(|n| n.to_string())
                .zip(ps.iter().cloned())
                .collect();
            let gn = names
                .iter()
                .map(|n| n.to_string())
                .zip(g.iter().cloned())
                .collect();
            opt.step_named(&dev, &mut by_name, &gn).expect("step");
            for (i, n) in names.iter().enumerate() {
                ps[i] = by_name[*n].clone();
                let gv = g[i].to_f32().unwrap();
                match kind {
                    OptimizerKind::Lamb(h) => {
                        lamb_model(&mut model[i], &mut s1[i], &mut s2[i], &gv, &h, t)
                    }
                    OptimizerKind::Lars(h) => lars_model(&mut model[i], &mut s1[i], &gv, &h, t),
                    _ => unreachable!(),
                }
                let got = ps[i].to_f32().unwrap();
                for e in 0..got.len() {
                    assert_eq!(
                        got[e].to_bits(),
                        model[i][e].to_bits(),
                        "{case} {n}[{e}] step {t}: {} vs model {}",
                        got[e],
                        model[i][e]
                    );
                }
            }
        }
        // The non-finite gradient elements (a[7], a[300] on even steps) kept their state at 0
        // after step 4, and `b` never moved while its state did.
        let sd = SafeTensors::deserialize(&opt.state_dict().unwrap())
            .unwrap()
            .tensor("a.state1")
            .unwrap()
            .data()
            .to_vec();
        assert_eq!(&sd[28..32], &[0, 0, 0, 0], "{case}");
        assert!(
            ps[1].to_f32().unwrap().iter().all(|x| x.to_bits() == 0),
            "{case}"
        );
        assert!(s1[1].iter().any(|x| *x != 0.0), "{case}");
    }
}

#[test]
fn lamb_lars_errors_are_clear() {
    let dev = cpu();
    // 8-bit state is supported (blockwise, `optim_api/norm8.rs`).
    for kind in [lamb(), lars()] {
        Optimizer::new(vec![ParamGroup::new(["x"], kind, StateBits::Bits8)]).expect("8-bit");
    }
    // Bad hyperparameters.
    let bad = OptimizerKind::Lars(LarsHyper {
        momentum: 0.0,
        ..LarsHyper::default()
    });
    let e = Optimizer::new(vec![ParamGroup::new(["x"], bad, StateBits::Bits32)])
        .unwrap_err()
        .to_string();
    assert_has(&e, &["momentum", "without momentum"]);
    let bad = OptimizerKind::Lamb(LambHyper {
        max_unorm: f64::NAN,
        ..LambHyper::default()
    });
    let e = Optimizer::new(vec![ParamGroup::new(["x"], bad, StateBits::Bits32)])
        .unwrap_err()
        .to_string();
    assert_has(&e, &["max_unorm"]);
    // LARS takes f32 parameters only; nothing changes on error.
    let mut o = Optimizer::new(vec![ParamGroup::new(["x"], lars(), StateBits::Bits32)]).unwrap();
    let mut ps = vec![random_tensor(DType::BF16, &[10], 1, 1.0)];
    let before = ps.clone();
    let gs = ps.clone();
    let e = o.step(&dev, &mut ps, &gs).unwrap_err().to_string();
    assert_has(&e, &["'x'", "bf16", "lars"]);
    assert_eq!(ps, before);
    // Host ops: bad partials, max_unorm, dtype.
    let e = norm_scale(&dev, &NormPartials::default(), 1.0)
        .unwrap_err()
        .to_string();
    assert_has(&e, &["norm_scale", "non-empty"]);
    let e = norm_scale(&dev, &NormPartials::zeros(300), -1.0)
        .unwrap_err()
        .to_string();
    assert_has(&e, &["max_unorm = -1"]);
    let (mut p, g) = (ps[0].clone(), ps[0].clone());
    let e = lars_step_32bit(
        &dev,
        &mut p,
        &g,
        &mut [0.0; 10],
        &LarsHyper::default(),
        1,
        &GradOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert_has(&e, &["lars", "f32", "bf16"]);
    assert_eq!(
        norm_scale(&dev, &NormPartials::zeros(300), 1.0).unwrap(),
        1.0
    );
    let mut p = random_tensor(DType::F32, &[10], 1, 1.0);
    let g = p.clone();
    let e = lars_update_32bit(
        &dev,
        &mut p,
        &g,
        &mut [0.0; 10],
        &LarsHyper::default(),
        1,
        f32::NAN,
        &GradOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert_has(&e, &["lars_update_32bit", "scale = NaN"]);
    // A LAMB file does not load into AdamW, a LARS file not into SGD, another max_unorm not.
    let saved = |kind: OptimizerKind| {
        let mut o = make(kind, OptimizerOptions::default());
        let mut p = init(&kind);
        run(&mut o, &dev, &mut p, 1, 2);
        o.state_dict().unwrap()
    };
    let (lb, rb) = (saved(lamb()), saved(lars()));
    let OptimizerKind::Lamb(h) = lamb() else {
        unreachable!()
    };
    let adamw = OptimizerKind::AdamW(h.adam());
    let mut o = Optimizer::new(vec![ParamGroup::new(
        ["a", "b", "c"],
        adamw,
        StateBits::Bits32,
    )])
    .unwrap();
    assert_has(&load_err(&mut o, &lb), &["algorithm", "lamb", "adamw"]);
    let other = OptimizerKind::Lamb(LambHyper {
        max_unorm: 0.5,
        ..h
    });
    assert_has(
        &load_err(&mut make(other, OptimizerOptions::default()), &lb),
        &["hyperparameter max_unorm"],
    );
    let mut o =
        Optimizer::new(vec![ParamGroup::new(["a", "b"], lamb(), StateBits::Bits32)]).unwrap();
    assert_has(&load_err(&mut o, &rb), &["algorithm", "lars", "lamb"]);
}

/// A group of `kind` over `a`, `b` (and `c` for the Adam kinds) with a group `max_unorm`.
fn group_with(kind: OptimizerKind, max_unorm: f64, names: &[&str]) -> Optimizer {
    Optimizer::with_options(
        vec![ParamGroup::new(names.to_vec(), kind, StateBits::Bits32).with_max_unorm(max_unorm)],
        small_workspace(),
    )
    .expect("optimizer")
}

#[test]
fn max_unorm_on_adam_adamw_sgd_runs_the_lamb_lars_kernels() {
    use qforge::kernels::{AdamHyper, Optim1Hyper};
    let dev = cpu();
    let OptimizerKind::Lamb(lh) = lamb() else {
        unreachable!()
    };
    let OptimizerKind::Lars(rh) = lars() else {
        unreachable!()
    };
    let adamw = OptimizerKind::AdamW(lh.adam());
    let adam = OptimizerKind::Adam(AdamHyper {
        weight_decay: 0.0,
        ..lh.adam()
    });
    let sgd = OptimizerKind::Sgd(Optim1Hyper {
        lr: rh.lr,
        beta1: rh.momentum,
        beta2: 0.0,
        eps: 0.0,
        weight_decay: rh.weight_decay,
    });
    let lamb_wd0 = OptimizerKind::Lamb(LambHyper {
        weight_decay: 0.0,
        ..lh
    });
    // (plain rule with max_unorm, the same rule as LAMB / LARS, the data of which kind)
    for (plain, same, data) in [
        (adamw, lamb(), lamb()),
        (adam, lamb_wd0, lamb()),
        (sgd, lars(), lars()),
    ] {
        let case = plain.name();
        let names: Vec<&str> = specs(&data).iter().map(|s| s.0).collect();
        let max_unorm = match same {
            OptimizerKind::Lamb(h) => h.max_unorm,
            OptimizerKind::Lars(h) => h.max_unorm,
            _ => unreachable!(),
        };
        let mut with = group_with(plain, max_unorm, &names);
        let mut via = group_with(same, 0.0, &names);
        let mut off = group_with(plain, 0.0, &names);
        let (mut pw, mut pv, mut po) = (init(&data), init(&data), init(&data));
        for t in 1..=4 {
            let g = grads(&data, t);
            with.step(&dev, &mut pw, &g).unwrap();
            via.step(&dev, &mut pv, &g).unwrap();
            off.step(&dev, &mut po, &g).unwrap();
            if t == 1 {
                // `b` is not clipped on step 1 (LARS's momentum grows with `b`'s weight decay
                // later and does clip it): the plain rule's result, bit for bit.
                assert_eq!(
                    pw[1], po[1],
                    "{case}: unclipped parameter differs from the plain rule"
                );
            }
        }
        assert_eq!(
            pw, pv,
            "{case}: max_unorm differs from the trust-ratio rule"
        );
        assert_ne!(
            pw[0], po[0],
            "{case}: max_unorm had no effect on the clipped parameter"
        );
        // Resume: the group max_unorm is recorded and compared.
        let bytes = with.state_dict().unwrap();
        group_with(plain, max_unorm, &names)
            .load_state_dict(&bytes)
            .unwrap();
        let e = load_err(&mut group_with(plain, 0.0, &names), &bytes);
        assert_has(&e, &["hyperparameter max_unorm", "0 (off)"]);
        let e = load_err(&mut group_with(plain, max_unorm * 2.0, &names), &bytes);
        assert_has(&e, &["hyperparameter max_unorm"]);
        let e = load_err(
            &mut group_with(plain, max_unorm, &names),
            &off.state_dict().unwrap(),
        );
        assert_has(&e, &["hyperparameter max_unorm"]);
    }
    // Errors: other rules, a negative value, SGD without momentum (8-bit state:
    // `optim_api/norm8.rs`).
    let err = |g: ParamGroup| Optimizer::new(vec![g]).unwrap_err().to_string();
    let e = err(ParamGroup::new(["x"], lamb(), StateBits::Bits32).with_max_unorm(1.0));
    assert_has(&e, &["max_unorm", "lamb's hyperparameters"]);
    let lion = OptimizerKind::Lion(Optim1Hyper::defaults(qforge::kernels::Optim1Algo::Lion));
    let e = err(ParamGroup::new(["x"], lion, StateBits::Bits32).with_max_unorm(1.0));
    assert_has(
        &e,
        &["max_unorm", "adam, adamw, sgd, rmsprop, adagrad", "lion"],
    );
    let e = err(ParamGroup::new(["x"], adamw, StateBits::Bits32).with_max_unorm(-1.0));
    assert_has(&e, &["max_unorm = -1"]);
    let sgd0 = OptimizerKind::Sgd(Optim1Hyper {
        beta1: 0.0,
        ..Optim1Hyper::defaults(qforge::kernels::Optim1Algo::Sgd)
    });
    let e = err(ParamGroup::new(["x"], sgd0, StateBits::Bits32).with_max_unorm(0.02));
    assert_has(&e, &["sgd runs the lars kernels", "momentum"]);
}
