//! `max_unorm` on 32-bit RMSprop and Adagrad through the optimizer API: every step equals an
//! independent `f32` model written here (bitsandbytes' one-state precondition: the update
//! `g / (sqrt(s) + eps)` from the raw gradient and the state before the step, its norm in the
//! pinned order, `thr = max_unorm * |p| + eps`, the step scaled by `thr / |u|` when `|u| > thr`)
//! bit for bit, with clipped and unclipped parameters and non-finite gradient elements;
//! resume is bit-identical; an unclipped run equals the plain rule; unsupported rules, 8-bit
//! state and bad values are errors naming the value and the group.
#![allow(clippy::needless_range_loop)] // element-wise models index several arrays

use qforge::ir::DType;
use qforge::kernels::optim::{Optimizer, OptimizerKind, OptimizerOptions, ParamGroup, StateBits};
use qforge::kernels::{AdamHyper, Optim1Algo, Optim1Hyper};
use qforge::runtime::{Device, HostTensor};

use super::{assert_has, cpu, random_tensor, small_workspace};

/// `a` (norm about 41: clipped with max_unorm 0.01), `b` (norm about 10^4: clipped less).
const SHAPES: [(&str, usize, f32); 2] = [("a", 64 * 80, 1.0), ("b", 300, 1000.0)];

fn init() -> Vec<HostTensor> {
    SHAPES
        .iter()
        .enumerate()
        .map(|(i, (_, n, s))| random_tensor(DType::F32, &[*n], 600 + i as u64, *s))
        .collect()
}

/// Gradients with a NaN and a -inf in `a` on odd steps.
fn grads(t: u32) -> Vec<HostTensor> {
    SHAPES
        .iter()
        .enumerate()
        .map(|(i, (_, n, _))| {
            let mut v = random_tensor(DType::F32, &[*n], 7000 * t as u64 + i as u64, 0.5)
                .to_f32()
                .unwrap();
            if i == 0 && t % 2 == 1 {
                v[5] = f32::NAN;
                v[400] = f32::NEG_INFINITY;
            }
            HostTensor::from_f32(vec![*n], &v).unwrap()
        })
        .collect()
}

fn hyper(algo: Optim1Algo) -> Optim1Hyper {
    Optim1Hyper {
        lr: 0.01,
        eps: 1e-4,
        weight_decay: 0.02,
        ..Optim1Hyper::defaults(algo)
    }
}

fn kind(algo: Optim1Algo) -> OptimizerKind {
    match algo {
        Optim1Algo::Rmsprop => OptimizerKind::Rmsprop(hyper(algo)),
        _ => OptimizerKind::Adagrad(hyper(algo)),
    }
}

fn make(algo: Optim1Algo, max_unorm: f64, options: OptimizerOptions) -> Optimizer {
    let names = SHAPES.map(|s| s.0);
    let group = ParamGroup::new(names, kind(algo), StateBits::Bits32).with_max_unorm(max_unorm);
    Optimizer::with_options(vec![group], options).unwrap()
}

/// `sum x*x` in the pinned order: per 256-block 8 `fma` partials and the halving tree, the
/// blocks added in order from `-0.0`.
fn sum_sq(x: &[f32]) -> f32 {
    let mut total = -0.0f32;
    for block in x.chunks(256) {
        let mut acc = [-0.0f32; 8];
        for (i, v) in block.iter().enumerate() {
            acc[i % 8] = v.mul_add(*v, acc[i % 8]);
        }
        for w in [4, 2, 1] {
            for j in 0..w {
                acc[j] += acc[j + w];
            }
        }
        total += acc[0];
    }
    total
}

/// One model step of one parameter; returns the scale.
fn model_step(algo: Optim1Algo, p: &mut [f32], s: &mut [f32], g: &[f32], mu: f64) -> f32 {
    let h = hyper(algo);
    let (b1, c1) = (h.beta1 as f32, (1.0 - h.beta1) as f32);
    let (eps, wd) = (h.eps as f32, h.weight_decay as f32);
    let state = |s_old: f32, x: f32| match algo {
        Optim1Algo::Rmsprop => s_old.mul_add(b1, c1 * x * x),
        _ => x.mul_add(x, s_old),
    };
    // The precondition: raw gradient, no weight decay, state before the step.
    let u: Vec<f32> = (0..p.len())
        .map(|i| {
            if g[i].is_finite() {
                g[i] / (state(s[i], g[i]).sqrt() + eps)
            } else {
                0.0
            }
        })
        .collect();
    let unorm = sum_sq(&u).sqrt();
    let pnorm = sum_sq(p).sqrt();
    let thr = mu as f32 * pnorm + eps;
    let scale = if unorm > thr { thr / unorm } else { 1.0 };
    let neg_lr = (-h.lr) as f32 * scale;
    for i in 0..p.len() {
        if !g[i].is_finite() {
            s[i] = 0.0;
            continue;
        }
        let gw = p[i].mul_add(wd, g[i]);
        s[i] = state(s[i], gw);
        p[i] = neg_lr.mul_add(gw / (s[i].sqrt() + eps), p[i]);
    }
    scale
}

#[test]
fn rmsprop_and_adagrad_max_unorm_match_an_independent_model() {
    let dev = cpu();
    for algo in [Optim1Algo::Rmsprop, Optim1Algo::Adagrad] {
        let mu = 0.01;
        let mut opt = make(algo, mu, small_workspace());
        let mut ps = init();
        let mut model: Vec<Vec<f32>> = ps.iter().map(|p| p.to_f32().unwrap()).collect();
        let mut states: Vec<Vec<f32>> = model.iter().map(|p| vec![0.0; p.len()]).collect();
        let mut clipped = [0usize; 2];
        for t in 1..=6 {
            let g = grads(t);
            opt.step(&dev, &mut ps, &g).unwrap();
            for i in 0..2 {
                let gv = g[i].to_f32().unwrap();
                let scale = model_step(algo, &mut model[i], &mut states[i], &gv, mu);
                clipped[i] += usize::from(scale < 1.0);
                let got = ps[i].to_f32().unwrap();
                for k in 0..got.len() {
                    assert_eq!(
                        got[k].to_bits(),
                        model[i][k].to_bits(),
                        "{} t{t} {}[{k}]",
                        algo.name(),
                        SHAPES[i].0
                    );
                }
            }
        }
        assert_eq!(clipped[0], 6, "{}: a clips every step", algo.name());
        assert!(clipped[1] < 6, "{}: b is not always clipped", algo.name());
    }
}

#[test]
fn rmsprop_and_adagrad_max_unorm_resume_and_unclipped_equal_the_plain_rule() {
    let dev = cpu();
    for algo in [Optim1Algo::Rmsprop, Optim1Algo::Adagrad] {
        let mut straight = make(algo, 0.01, small_workspace());
        let mut ps = init();
        for t in 1..=10 {
            straight.step(&dev, &mut ps, &grads(t)).unwrap();
        }
        let mut first = make(algo, 0.01, small_workspace());
        let mut pr = init();
        for t in 1..=5 {
            first.step(&dev, &mut pr, &grads(t)).unwrap();
        }
        let bytes = first.state_dict().unwrap();
        let mut second = make(algo, 0.01, OptimizerOptions::default());
        second.load_state_dict(&bytes).unwrap();
        for t in 6..=10 {
            second.step(&dev, &mut pr, &grads(t)).unwrap();
        }
        assert_eq!(ps, pr, "{}", algo.name());
        assert_eq!(straight.state_dict().unwrap(), second.state_dict().unwrap());
        // A file with max_unorm does not load into a group without it.
        let names = SHAPES.map(|s| s.0);
        let plain = ParamGroup::new(names, kind(algo), StateBits::Bits32);
        let mut off = Optimizer::new(vec![plain.clone()]).unwrap();
        let e = off.load_state_dict(&bytes).unwrap_err().to_string();
        assert_has(&e, &["max_unorm"]);
        // A bound no step reaches: bit-identical to the plain rule.
        let mut big = make(algo, 1e30, OptimizerOptions::default());
        let mut plain_opt = Optimizer::new(vec![plain]).unwrap();
        let (mut pb, mut pp) = (init(), init());
        for t in 1..=4 {
            big.step(&dev, &mut pb, &grads(t)).unwrap();
            plain_opt.step(&dev, &mut pp, &grads(t)).unwrap();
        }
        assert_eq!(pb, pp, "{}", algo.name());
        assert_ne!(pb, ps[..].to_vec(), "the clipped run must differ");
    }
}

#[test]
fn unsupported_max_unorm_is_an_error_naming_value_and_group() {
    let ok = ParamGroup::new(["z"], kind(Optim1Algo::Rmsprop), StateBits::Bits32);
    let err = |g: ParamGroup| Optimizer::new(vec![ok.clone(), g]).unwrap_err().to_string();
    let lion = OptimizerKind::Lion(Optim1Hyper::defaults(Optim1Algo::Lion));
    let e = err(ParamGroup::new(["a"], lion, StateBits::Bits32).with_max_unorm(0.5));
    assert_has(&e, &["group 1", "max_unorm = 0.5", "lion"]);
    let am = OptimizerKind::Ademamix(qforge::kernels::AdemamixHyper::default());
    let e = err(ParamGroup::new(["a"], am, StateBits::Bits32).with_max_unorm(0.5));
    assert_has(&e, &["group 1", "max_unorm = 0.5", "ademamix"]);
    let q = OptimizerKind::QAdamW(qforge::kernels::optim::QAdamWConfig::zip_sr(
        AdamHyper::default(),
    ));
    let e = err(ParamGroup::new(["a"], q, StateBits::Bits8).with_max_unorm(0.5));
    assert_has(&e, &["group 1", "max_unorm = 0.5", "qadamw"]);
    let r8 = ParamGroup::new(["a"], kind(Optim1Algo::Adagrad), StateBits::Bits8);
    let e = err(r8.with_max_unorm(0.5));
    assert_has(&e, &["group 1", "max_unorm = 0.5", "8-bit"]);
    let neg = ParamGroup::new(["a"], kind(Optim1Algo::Rmsprop), StateBits::Bits32);
    let e = err(neg.clone().with_max_unorm(-1.0));
    assert_has(&e, &["group 1", "max_unorm = -1"]);
    // The gradient options are accepted with max_unorm (optim_api/norm_clip.rs runs them).
    Optimizer::new(vec![neg
        .with_max_unorm(0.5)
        .with_skip_zeros(true)
        .with_percentile_clipping(5)])
    .unwrap();
    let _: &dyn Fn() -> Box<dyn Device> = &|| Box::new(cpu());
}
