//! The one-state rules (Lion, SGD, RMSprop, Adagrad) and AdEMAMix through the optimizer API:
//! for each rule and width, 10 steps straight equal 5 steps, state_dict, load into a fresh
//! optimizer, 5 steps (parameters and state bit for bit), and equal direct whole-tensor calls
//! of the host ops with step numbers 1 to 10. A state file of one rule does not load into an
//! optimizer of another (or with other hyperparameters).

use qforge::ir::DType;
use qforge::kernels::ops::{
    ademamix_step_32bit, ademamix_step_8bit, optim1_step_32bit, optim1_step_8bit, AdemamixState32,
    AdemamixState8, GradOptions, Optim1State8,
};
use qforge::kernels::optim::{
    Optimizer, OptimizerKind, OptimizerOptions, ParamGroup, StateBits, StateLayout,
};
use qforge::kernels::{AdemamixHyper, Optim1Algo, Optim1Hyper};
use qforge::runtime::{Device, HostTensor};
use safetensors::{Dtype, SafeTensors};

use super::{assert_has, cpu, load_err, random_tensor, small_workspace};

/// `a` takes 8-bit state in 8-bit groups, `b` (under `min_8bit_size`) keeps 32-bit state.
const SHAPES: [&[usize]; 2] = [&[64, 80], &[300]];

fn init() -> Vec<HostTensor> {
    (0..2)
        .map(|i| random_tensor(DType::F32, SHAPES[i], 200 + i as u64, 1.0))
        .collect()
}

fn grads(t: u32) -> Vec<HostTensor> {
    (0..2)
        .map(|i| random_tensor(DType::F32, SHAPES[i], 3000 * t as u64 + i as u64, 0.5))
        .collect()
}

fn one(lr: f64, beta1: f64, beta2: f64, eps: f64, weight_decay: f64) -> Optim1Hyper {
    Optim1Hyper {
        lr,
        beta1,
        beta2,
        eps,
        weight_decay,
    }
}

fn ademamix() -> AdemamixHyper {
    AdemamixHyper {
        lr: 0.01,
        t_alpha: Some(5),
        t_beta3: Some(7),
        ..AdemamixHyper::default()
    }
}

/// Every new kind, with hyperparameters that use weight decay.
fn kinds() -> Vec<OptimizerKind> {
    vec![
        OptimizerKind::Lion(one(1e-3, 0.9, 0.99, 0.0, 0.1)),
        OptimizerKind::Sgd(one(0.01, 0.9, 0.0, 0.0, 0.01)),
        OptimizerKind::Rmsprop(one(0.01, 0.99, 0.0, 1e-8, 0.01)),
        OptimizerKind::Adagrad(one(0.01, 0.0, 0.0, 1e-10, 0.01)),
        OptimizerKind::Ademamix(ademamix()),
    ]
}

fn make(kind: OptimizerKind, bits: StateBits, options: OptimizerOptions) -> Optimizer {
    Optimizer::with_options(vec![ParamGroup::new(["a", "b"], kind, bits)], options)
        .expect("optimizer")
}

fn run(opt: &mut Optimizer, dev: &dyn Device, params: &mut [HostTensor], from: u32, to: u32) {
    for t in from..=to {
        opt.step(dev, params, &grads(t)).expect("step");
    }
}

/// Per-parameter state of the direct host-op reference.
enum Direct {
    One32(Vec<f32>),
    One8(Optim1State8),
    Ade32(AdemamixState32),
    Ade8(AdemamixState8),
}

/// Independent reference: whole-tensor host ops, 8-bit state only for `a` in 8-bit groups.
fn reference(kind: OptimizerKind, bits: StateBits, dev: &dyn Device, n: u32) -> Vec<HostTensor> {
    let mut params = init();
    let algo = match kind {
        OptimizerKind::Lion(_) => Some(Optim1Algo::Lion),
        OptimizerKind::Sgd(_) => Some(Optim1Algo::Sgd),
        OptimizerKind::Rmsprop(_) => Some(Optim1Algo::Rmsprop),
        OptimizerKind::Adagrad(_) => Some(Optim1Algo::Adagrad),
        OptimizerKind::Ademamix(_)
        | OptimizerKind::Adam(_)
        | OptimizerKind::AdamW(_)
        | OptimizerKind::QAdamW(_)
        | OptimizerKind::Lamb(_)
        | OptimizerKind::Lars(_) => None,
    };
    let mut states: Vec<Direct> = params
        .iter()
        .map(|p| {
            let (numel, eight) = (p.numel(), bits == StateBits::Bits8 && p.numel() >= 4096);
            match (algo.is_some(), eight) {
                (true, false) => Direct::One32(vec![0.0; numel]),
                (true, true) => Direct::One8(Optim1State8::zeros(numel)),
                (false, false) => Direct::Ade32(AdemamixState32::zeros(numel)),
                (false, true) => Direct::Ade8(AdemamixState8::zeros(numel)),
            }
        })
        .collect();
    for t in 1..=n {
        let g = grads(t);
        for (i, s) in states.iter_mut().enumerate() {
            let p = &mut params[i];
            match (kind, s) {
                (
                    OptimizerKind::Lion(h)
                    | OptimizerKind::Sgd(h)
                    | OptimizerKind::Rmsprop(h)
                    | OptimizerKind::Adagrad(h),
                    s,
                ) => {
                    let algo = algo.expect("one-state algo");
                    match s {
                        Direct::One32(s) => optim1_step_32bit(
                            dev,
                            algo,
                            p,
                            &g[i],
                            s,
                            &h,
                            t,
                            &GradOptions::default(),
                        ),
                        Direct::One8(s) => {
                            optim1_step_8bit(dev, algo, p, &g[i], s, &h, t, &GradOptions::default())
                        }
                        Direct::Ade32(_) | Direct::Ade8(_) => panic!("wrong reference state"),
                    }
                }
                (OptimizerKind::Ademamix(h), Direct::Ade32(s)) => {
                    ademamix_step_32bit(dev, p, &g[i], s, &h, t)
                }
                (OptimizerKind::Ademamix(h), Direct::Ade8(s)) => {
                    ademamix_step_8bit(dev, p, &g[i], s, &h, t)
                }
                _ => panic!("wrong reference state"),
            }
            .expect("reference step");
        }
    }
    params
}

#[test]
fn new_rules_resume_bit_identical_and_match_host_ops() {
    let dev = cpu();
    for kind in kinds() {
        for bits in [StateBits::Bits32, StateBits::Bits8] {
            let case = format!("{}/{bits:?}", kind.name());
            let mut straight = make(kind, bits, small_workspace());
            let mut ps = init();
            run(&mut straight, &dev, &mut ps, 1, 10);

            let mut first = make(kind, bits, small_workspace());
            let mut pr = init();
            run(&mut first, &dev, &mut pr, 1, 5);
            let bytes = first.state_dict().expect("state_dict");
            drop(first);
            let mut second = make(kind, bits, OptimizerOptions::default());
            second.load_state_dict(&bytes).expect("load_state_dict");
            assert_eq!(second.step_count("a"), Some(5), "{case}");
            run(&mut second, &dev, &mut pr, 6, 10);

            assert_eq!(ps, pr, "{case}: parameters differ after resume");
            let sd = straight.state_dict().unwrap();
            assert_eq!(sd, second.state_dict().unwrap(), "{case}: state differs");
            let want_a = match bits {
                StateBits::Bits32 => StateLayout::Bits32,
                StateBits::Bits8 => StateLayout::Bits8,
            };
            assert_eq!(straight.state_layout("a"), Some(want_a), "{case}");
            assert_eq!(
                straight.state_layout("b"),
                Some(StateLayout::Bits32),
                "{case}"
            );

            // State tensors: one per moment (+ absmax for 8-bit), named state1.. / absmax1..
            let moments = if matches!(kind, OptimizerKind::Ademamix(_)) {
                3
            } else {
                1
            };
            let st = SafeTensors::deserialize(&sd).unwrap();
            let mut names: Vec<String> = st.names().into_iter().cloned().collect();
            names.sort();
            let mut want = Vec::new();
            for k in 1..=moments {
                if bits == StateBits::Bits8 {
                    want.push(format!("a.absmax{k}"));
                }
                want.push(format!("a.state{k}"));
                want.push(format!("b.state{k}"));
            }
            want.sort();
            assert_eq!(names, want, "{case}");
            let a1 = st.tensor("a.state1").unwrap();
            let dt = if bits == StateBits::Bits8 {
                Dtype::U8
            } else {
                Dtype::F32
            };
            assert_eq!((a1.dtype(), a1.shape()), (dt, &[64usize, 80][..]), "{case}");

            let direct = reference(kind, bits, &dev, 10);
            assert_eq!(ps, direct, "{case}: differs from the host ops");
            for (p, p0) in ps.iter().zip(init()) {
                assert_ne!(p.data, p0.data, "{case}: a parameter did not move");
            }
        }
    }
}

#[test]
fn wrong_kind_or_hyperparameters_do_not_load() {
    let dev = cpu();
    let def = OptimizerOptions::default();
    let saved = |kind: OptimizerKind| {
        let mut o = make(kind, StateBits::Bits8, def);
        let mut p = init();
        run(&mut o, &dev, &mut p, 1, 2);
        o.state_dict().unwrap()
    };
    let ks = kinds();
    // Every new kind's file is refused by every other kind (same bits, same parameters).
    for (i, &from) in ks.iter().enumerate() {
        let bytes = saved(from);
        make(from, StateBits::Bits8, def)
            .load_state_dict(&bytes)
            .unwrap();
        for (j, &to) in ks.iter().enumerate() {
            if i != j {
                let e = load_err(&mut make(to, StateBits::Bits8, def), &bytes);
                assert_has(&e, &["algorithm", from.name(), to.name()]);
            }
        }
        let adamw = OptimizerKind::AdamW(super::hyper(0.1));
        let e = load_err(&mut make(adamw, StateBits::Bits8, def), &bytes);
        assert_has(&e, &["algorithm", from.name(), "adamw"]);
    }
    // A scheduler set in the file but not here; a one-ulp lr difference.
    let bytes = saved(OptimizerKind::Ademamix(ademamix()));
    let mut h = ademamix();
    h.t_beta3 = None;
    let e = load_err(
        &mut make(OptimizerKind::Ademamix(h), StateBits::Bits8, def),
        &bytes,
    );
    assert_has(&e, &["hyperparameter t_beta3"]);
    let bytes = saved(ks[0]);
    let mut h = one(1e-3, 0.9, 0.99, 0.0, 0.1);
    h.lr = f64::from_bits(h.lr.to_bits() + 1);
    let e = load_err(
        &mut make(OptimizerKind::Lion(h), StateBits::Bits8, def),
        &bytes,
    );
    assert_has(&e, &["hyperparameter lr"]);
}

#[test]
fn new_rules_reject_16_bit_parameters_and_bad_hyperparameters() {
    let dev = cpu();
    for kind in kinds() {
        let mut o = make(kind, StateBits::Bits32, OptimizerOptions::default());
        let mut ps: Vec<HostTensor> = (0..2)
            .map(|i| random_tensor(DType::BF16, SHAPES[i], i as u64, 1.0))
            .collect();
        let before = ps.clone();
        let gs = ps.clone();
        let e = o.step(&dev, &mut ps, &gs).unwrap_err().to_string();
        assert_has(&e, &["'a'", "bf16", kind.name()]);
        assert_eq!(ps, before);
        assert_eq!(o.step_count("a"), Some(0));
    }
    let bad = OptimizerKind::Rmsprop(one(0.01, 1.0, 0.0, 1e-8, 0.0));
    let e = Optimizer::new(vec![ParamGroup::new(["x"], bad, StateBits::Bits8)])
        .unwrap_err()
        .to_string();
    assert_has(&e, &["beta1"]);
    let bad = OptimizerKind::Ademamix(AdemamixHyper {
        t_alpha: Some(0),
        ..AdemamixHyper::default()
    });
    let e = Optimizer::new(vec![ParamGroup::new(["x"], bad, StateBits::Bits32)])
        .unwrap_err()
        .to_string();
    assert_has(&e, &["t_alpha"]);
}
