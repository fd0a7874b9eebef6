//! Blockwise 8-bit LAMB and LARS through the optimizer API and the host ops: 10 steps straight
//! equal 5 steps, state_dict, load into a fresh optimizer (another workspace size), 5 steps
//! (parameters and state bit for bit); the trajectory equals direct whole-tensor
//! `lamb_step_8bit` / `lars_step_8bit` calls on the reference interpreter (32-bit calls for the
//! parameter under `min_8bit_size`), with clipped and unclipped parameters, non-finite gradient
//! elements and a partial last block; `max_unorm` on 8-bit Adam / AdamW / SGD runs the same
//! kernels and equals the plain 8-bit rule where nothing is clipped; mismatched state files and
//! 8-bit RMSprop / Adagrad with `max_unorm` are clear errors.

use qforge::ir::DType;
use qforge::kernels::ops::{
    lamb_step_32bit, lamb_step_8bit, lars_step_32bit, lars_step_8bit, lars_update_8bit,
    AdamState32, AdamState8, GradOptions, Optim1State8,
};
use qforge::kernels::optim::{Optimizer, OptimizerKind, OptimizerOptions, ParamGroup, StateBits};
use qforge::kernels::{AdamHyper, LambHyper, LarsHyper, Optim1Algo, Optim1Hyper};
use qforge::runtime::{Device, HostTensor, InterpreterDevice};
use safetensors::{Dtype, SafeTensors};

use super::{assert_has, cpu, load_err, random_tensor, small_workspace};

/// `a` (f32, 8-bit, parameter norm about 41: clipped), `b` (f32, 8-bit, norm about 3.8e4: not
/// clipped), `s` (f32, under `min_8bit_size`: 32-bit state), `c` (bf16, 8-bit with a partial
/// last block, LAMB only).
fn specs(kind: &OptimizerKind) -> Vec<(&'static str, DType, Vec<usize>, f32)> {
    let mut v = vec![
        ("a", DType::F32, vec![64, 80], 1.0),
        ("b", DType::F32, vec![4352], 1000.0),
        ("s", DType::F32, vec![300], 1.0),
    ];
    if matches!(
        kind,
        OptimizerKind::Lamb(_) | OptimizerKind::Adam(_) | OptimizerKind::AdamW(_)
    ) {
        v.push(("c", DType::BF16, vec![30, 150], 0.1));
    }
    v
}

fn names(kind: &OptimizerKind) -> Vec<&'static str> {
    specs(kind).iter().map(|s| s.0).collect()
}

fn init(kind: &OptimizerKind) -> Vec<HostTensor> {
    specs(kind)
        .iter()
        .enumerate()
        .map(|(i, (_, dt, shape, scale))| random_tensor(*dt, shape, 700 + i as u64, *scale))
        .collect()
}

/// The gradients of step `t`, with a NaN and an infinity in `a` and `c` on even steps.
fn grads(kind: &OptimizerKind, t: u32) -> Vec<HostTensor> {
    specs(kind)
        .iter()
        .enumerate()
        .map(|(i, (_, dt, shape, _))| {
            let g = random_tensor(*dt, shape, 9000 * t as u64 + i as u64, 0.5);
            if (i == 0 || i == 3) && t.is_multiple_of(2) {
                let mut v = g.to_f32().unwrap();
                v[7] = f32::NAN;
                v[300] = f32::NEG_INFINITY;
                HostTensor::from_f32_as(*dt, shape.clone(), &v).unwrap()
            } else {
                g
            }
        })
        .collect()
}

fn lamb_hyper() -> LambHyper {
    LambHyper {
        lr: 0.01,
        weight_decay: 0.01,
        ..LambHyper::default()
    }
}

fn lars_hyper() -> LarsHyper {
    LarsHyper {
        lr: 0.1,
        weight_decay: 0.01,
        ..LarsHyper::default()
    }
}

fn make(kind: OptimizerKind, max_unorm: f64, options: OptimizerOptions) -> Optimizer {
    let g = ParamGroup::new(names(&kind), kind, StateBits::Bits8).with_max_unorm(max_unorm);
    Optimizer::with_options(vec![g], options).expect("optimizer")
}

fn run(opt: &mut Optimizer, dev: &dyn Device, ps: &mut [HostTensor], data: &OptimizerKind, t: u32) {
    opt.step(dev, ps, &grads(data, t)).expect("step");
}

/// Direct whole-tensor host ops on the interpreter, steps 1..=n (8-bit state from
/// `min_8bit_size` = 4096 elements); also returns every scale applied.
fn reference(kind: OptimizerKind, n: u32) -> (Vec<HostTensor>, Vec<f32>) {
    let dev = InterpreterDevice;
    let mut ps = init(&kind);
    let eight: Vec<bool> = ps.iter().map(|p| p.numel() >= 4096).collect();
    let mut a8: Vec<AdamState8> = ps.iter().map(|p| AdamState8::zeros(p.numel())).collect();
    let mut a32: Vec<AdamState32> = ps.iter().map(|p| AdamState32::zeros(p.numel())).collect();
    let mut o8: Vec<Optim1State8> = ps.iter().map(|p| Optim1State8::zeros(p.numel())).collect();
    let mut o32: Vec<Vec<f32>> = ps.iter().map(|p| vec![0.0; p.numel()]).collect();
    let mut scales = Vec::new();
    for t in 1..=n {
        let g = grads(&kind, t);
        for i in 0..ps.len() {
            let (p, gi) = (&mut ps[i], &g[i]);
            let s = match (kind, eight[i]) {
                (OptimizerKind::Lamb(h), true) => {
                    lamb_step_8bit(&dev, p, gi, &mut a8[i], &h, t, &GradOptions::default())
                }
                (OptimizerKind::Lamb(h), false) => {
                    lamb_step_32bit(&dev, p, gi, &mut a32[i], &h, t, &GradOptions::default())
                }
                (OptimizerKind::Lars(h), true) => {
                    lars_step_8bit(&dev, p, gi, &mut o8[i], &h, t, &GradOptions::default())
                }
                (OptimizerKind::Lars(h), false) => {
                    lars_step_32bit(&dev, p, gi, &mut o32[i], &h, t, &GradOptions::default())
                }
                _ => panic!("LAMB / LARS only"),
            };
            scales.push(s.expect("reference step"));
        }
    }
    (ps, scales)
}

#[test]
fn lamb8_lars8_resume_bit_identical_and_match_host_ops() {
    let dev = cpu();
    for kind in [
        OptimizerKind::Lamb(lamb_hyper()),
        OptimizerKind::Lars(lars_hyper()),
    ] {
        let case = kind.name();
        let mut straight = make(kind, 0.0, small_workspace());
        let mut ps = init(&kind);
        for t in 1..=10 {
            run(&mut straight, &dev, &mut ps, &kind, t);
        }
        let mut first = make(kind, 0.0, small_workspace());
        let mut pr = init(&kind);
        for t in 1..=5 {
            run(&mut first, &dev, &mut pr, &kind, t);
        }
        let bytes = first.state_dict().expect("state_dict");
        drop(first);
        let mut second = make(kind, 0.0, OptimizerOptions::default());
        second.load_state_dict(&bytes).expect("load_state_dict");
        assert_eq!(second.step_count("a"), Some(5), "{case}");
        for t in 6..=10 {
            run(&mut second, &dev, &mut pr, &kind, t);
        }
        assert_eq!(ps, pr, "{case}: parameters differ after resume");
        let sd = straight.state_dict().unwrap();
        assert_eq!(sd, second.state_dict().unwrap(), "{case}: state differs");

        // 8-bit codes and absmax for the large tensors, f32 state for `s`.
        let st = SafeTensors::deserialize(&sd).unwrap();
        let moments = if case == "lamb" { 2 } else { 1 };
        let mut want = Vec::new();
        for (p, ..) in specs(&kind) {
            for k in 1..=moments {
                want.push(format!("{p}.state{k}"));
                if p != "s" {
                    want.push(format!("{p}.absmax{k}"));
                }
            }
        }
        want.sort();
        let mut got: Vec<String> = st.names().into_iter().cloned().collect();
        got.sort();
        assert_eq!(got, want, "{case}");
        assert_eq!(st.tensor("a.state1").unwrap().dtype(), Dtype::U8, "{case}");
        assert_eq!(st.tensor("s.state1").unwrap().dtype(), Dtype::F32, "{case}");
        assert_eq!(st.tensor("a.absmax1").unwrap().shape(), &[20], "{case}");

        let (direct, scales) = reference(kind, 10);
        assert_eq!(ps, direct, "{case}: differs from the host ops");
        assert!(scales.iter().any(|s| *s < 1.0), "{case}: never clipped");
        assert!(scales.contains(&1.0), "{case}: always clipped");
        for (p, p0) in ps.iter().zip(init(&kind)) {
            assert_ne!(p.data, p0.data, "{case}: a parameter did not move");
        }
        // The non-finite gradient elements of `a` left their parameters alone on step 2.
        let mut o = make(kind, 0.0, OptimizerOptions::default());
        let mut p2 = init(&kind);
        run(&mut o, &dev, &mut p2, &kind, 1);
        let before = p2[0].to_f32().unwrap();
        run(&mut o, &dev, &mut p2, &kind, 2);
        let after = p2[0].to_f32().unwrap();
        assert_eq!(before[7].to_bits(), after[7].to_bits(), "{case}");
        assert_eq!(before[300].to_bits(), after[300].to_bits(), "{case}");
        assert_ne!(before[8].to_bits(), after[8].to_bits(), "{case}");
    }
}

#[test]
fn max_unorm_on_8bit_adam_adamw_sgd_runs_the_8bit_lamb_lars_kernels() {
    let dev = cpu();
    let lh = lamb_hyper();
    let rh = lars_hyper();
    let adamw = OptimizerKind::AdamW(lh.adam());
    let adam = OptimizerKind::Adam(AdamHyper {
        weight_decay: 0.0,
        ..lh.adam()
    });
    let sgd = OptimizerKind::Sgd(rh.sgd());
    let lamb_wd0 = OptimizerKind::Lamb(LambHyper {
        weight_decay: 0.0,
        ..lh
    });
    for (plain, same) in [
        (adamw, OptimizerKind::Lamb(lh)),
        (adam, lamb_wd0),
        (sgd, OptimizerKind::Lars(rh)),
    ] {
        let case = plain.name();
        let max_unorm = match same {
            OptimizerKind::Lamb(h) => h.max_unorm,
            OptimizerKind::Lars(h) => h.max_unorm,
            _ => unreachable!(),
        };
        let mut with = make(plain, max_unorm, small_workspace());
        let mut via = make(same, 0.0, small_workspace());
        let mut off = make(plain, 0.0, small_workspace());
        let (mut pw, mut pv, mut po) = (init(&plain), init(&plain), init(&plain));
        for t in 1..=4 {
            let g = grads(&plain, t);
            with.step(&dev, &mut pw, &g).unwrap();
            via.step(&dev, &mut pv, &g).unwrap();
            off.step(&dev, &mut po, &g).unwrap();
            if t == 1 {
                // `b` is not clipped on step 1: the plain 8-bit rule's result, bit for bit.
                assert_eq!(pw[1], po[1], "{case}: unclipped parameter differs");
            }
        }
        assert_eq!(
            pw, pv,
            "{case}: max_unorm differs from the trust-ratio rule"
        );
        assert_ne!(pw[0], po[0], "{case}: max_unorm had no effect");
        // The same state tensors (the files differ in the recorded rule).
        let sd = with.state_dict().unwrap();
        let sv = via.state_dict().unwrap();
        let (tw, tv) = (
            SafeTensors::deserialize(&sd).unwrap(),
            SafeTensors::deserialize(&sv).unwrap(),
        );
        let mut nw: Vec<String> = tw.names().into_iter().cloned().collect();
        nw.sort();
        assert!(nw.contains(&"a.absmax1".to_string()), "{case}: {nw:?}");
        for n in &nw {
            let (x, y) = (tw.tensor(n).unwrap(), tv.tensor(n).unwrap());
            assert_eq!(x.data(), y.data(), "{case}: {n}");
        }
        // Resume: the group max_unorm is recorded and compared.
        make(plain, max_unorm, OptimizerOptions::default())
            .load_state_dict(&sd)
            .unwrap();
        let e = load_err(&mut make(plain, 0.0, OptimizerOptions::default()), &sd);
        assert_has(&e, &["hyperparameter max_unorm", "0 (off)"]);
    }
}

#[test]
fn lamb8_lars8_errors_are_clear() {
    let dev = cpu();
    // An 8-bit LAMB file does not load into 32-bit LAMB, nor the reverse.
    let kind = OptimizerKind::Lamb(lamb_hyper());
    let mut o8 = make(kind, 0.0, OptimizerOptions::default());
    let mut p = init(&kind);
    run(&mut o8, &dev, &mut p, &kind, 1);
    let b8 = o8.state_dict().unwrap();
    let g32 = ParamGroup::new(names(&kind), kind, StateBits::Bits32);
    let mut o32 = Optimizer::new(vec![g32]).unwrap();
    assert_has(
        &load_err(&mut o32, &b8),
        &["state bits is 8 in the file, 32 here"],
    );
    let mut p = init(&kind);
    run(&mut o32, &dev, &mut p, &kind, 1);
    let b32 = o32.state_dict().unwrap();
    let mut o8 = make(kind, 0.0, OptimizerOptions::default());
    assert_has(
        &load_err(&mut o8, &b32),
        &["state bits is 32 in the file, 8 here"],
    );
    // 8-bit RMSprop / Adagrad with max_unorm: still refused, naming the rule.
    for algo in [Optim1Algo::Rmsprop, Optim1Algo::Adagrad] {
        let k = match algo {
            Optim1Algo::Rmsprop => OptimizerKind::Rmsprop(Optim1Hyper::defaults(algo)),
            _ => OptimizerKind::Adagrad(Optim1Hyper::defaults(algo)),
        };
        let g = ParamGroup::new(["x"], k, StateBits::Bits8).with_max_unorm(0.5);
        let e = Optimizer::new(vec![g]).unwrap_err().to_string();
        assert_has(&e, &["max_unorm = 0.5", "8-bit", algo.name(), "32-bit"]);
    }
    // Host ops: state of the wrong length, a bad scale, 16-bit LARS parameters.
    let mut p = random_tensor(DType::F32, &[600], 1, 1.0);
    let g = p.clone();
    let mut short = Optim1State8::zeros(600);
    short.absmax1.pop();
    let e = lars_step_8bit(
        &dev,
        &mut p,
        &g,
        &mut short,
        &lars_hyper(),
        1,
        &GradOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert_has(
        &e,
        &["lars8_norm_partials", "absmax1", "2 elements", "needs 3"],
    );
    let mut st = Optim1State8::zeros(600);
    let e = lars_update_8bit(
        &dev,
        &mut p,
        &g,
        &mut st,
        &lars_hyper(),
        1,
        -1.0,
        &GradOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert_has(&e, &["lars_update_8bit", "scale = -1"]);
    let mut pb = random_tensor(DType::BF16, &[600], 1, 1.0);
    let gb = pb.clone();
    let e = lars_step_8bit(
        &dev,
        &mut pb,
        &gb,
        &mut st,
        &lars_hyper(),
        1,
        &GradOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert_has(&e, &["lars", "f32", "bf16"]);
    let mut st8 = AdamState8::zeros(600);
    let e = lamb_step_8bit(
        &dev,
        &mut p,
        &g,
        &mut st8,
        &lamb_hyper(),
        0,
        &GradOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert_has(&e, &["step"]);
}
