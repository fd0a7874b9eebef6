//! Percentile clipping and `skip_zeros` on the update-norm optimizers (LAMB, LARS, and the
//! `max_unorm` paths of Adam / AdamW / SGD / RMSprop / Adagrad), 32-bit and 8-bit state,
//! through the optimizer API: 10 steps straight equal 5 steps, state_dict, load into a fresh
//! optimizer, 5 steps (parameters, state and the clipping history bit for bit); the trajectory
//! equals whole-tensor host ops called with the `gnorm_scale` of the model history written in
//! `grad_opts.rs` (norms in the pinned order), so the same scale reaches the norm and the
//! update; clipping and skipping must change the result (the tests can fail); what stays
//! refused is a clear error.
#![allow(clippy::needless_range_loop)] // element-wise models index several arrays

use qforge::ir::DType;
use qforge::kernels::ops::{
    lamb_step_32bit, lamb_step_8bit, lars_step_32bit, lars_step_8bit, optim1_step_32bit_max_unorm,
    AdamState32, AdamState8, GradOptions, Optim1State8,
};
use qforge::kernels::optim::{Optimizer, OptimizerKind, OptimizerOptions, ParamGroup, StateBits};
use qforge::kernels::{AdamHyper, LambHyper, LarsHyper, Optim1Algo, Optim1Hyper};
use qforge::runtime::{Device, HostTensor};
use safetensors::SafeTensors;

use super::grad_opts::{model_clip, model_sqnorm};
use super::{assert_has, cpu, random_tensor, small_workspace};

/// `a` (f32, 8-bit in an 8-bit group), `s` (f32, under `min_8bit_size`: 32-bit state), `c`
/// (bf16, LAMB only).
fn specs(lamb: bool) -> Vec<(&'static str, DType, Vec<usize>)> {
    let mut v = vec![
        ("a", DType::F32, vec![64, 80]),
        ("s", DType::F32, vec![300]),
    ];
    if lamb {
        v.push(("c", DType::BF16, vec![7, 33]));
    }
    v
}

fn init(lamb: bool) -> Vec<HostTensor> {
    specs(lamb)
        .iter()
        .enumerate()
        .map(|(i, (_, dt, shape))| random_tensor(*dt, shape, 910 + i as u64, 1.0))
        .collect()
}

/// The gradients of step `t`: a size that varies by step (so clipping acts), an exact zero
/// at every 17th element from `t % 17` (so skipped elements have state), a NaN in `a` on
/// step 4.
fn grads(lamb: bool, t: u32) -> Vec<HostTensor> {
    specs(lamb)
        .iter()
        .enumerate()
        .map(|(i, (_, dt, shape))| {
            let scale = [0.3, 0.1, 0.8, 0.2, 2.0, 0.4][t as usize % 6];
            let g = random_tensor(*dt, shape, 7000 * u64::from(t) + i as u64, scale);
            let mut v = g.to_f32().unwrap();
            v.iter_mut()
                .skip(t as usize % 17)
                .step_by(17)
                .for_each(|x| *x = 0.0);
            if i == 0 && t == 4 {
                v[9] = f32::NAN;
            }
            HostTensor::from_f32_as(*dt, shape.clone(), &v).unwrap()
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
        ..LarsHyper::default()
    })
}

fn is_lamb(kind: &OptimizerKind) -> bool {
    matches!(kind, OptimizerKind::Lamb(_))
}

#[derive(Clone, Copy)]
struct Case {
    kind: OptimizerKind,
    bits: StateBits,
    clip: u32,
    skip: bool,
}

fn make(c: Case, options: OptimizerOptions) -> Optimizer {
    let names: Vec<&str> = specs(is_lamb(&c.kind)).iter().map(|s| s.0).collect();
    let g = ParamGroup::new(names, c.kind, c.bits)
        .with_percentile_clipping(c.clip)
        .with_skip_zeros(c.skip);
    Optimizer::with_options(vec![g], options).expect("optimizer")
}

fn run(opt: &mut Optimizer, dev: &dyn Device, ps: &mut [HostTensor], lamb: bool, a: u32, b: u32) {
    for t in a..=b {
        opt.step(dev, ps, &grads(lamb, t)).expect("step");
    }
}

/// Whole-tensor host ops, steps 1..=n, each with the model's `gnorm_scale`; returns the
/// parameters, the histories and the number of clipped parameter steps.
fn reference(c: Case, dev: &dyn Device, n: u32) -> (Vec<HostTensor>, Vec<Vec<f32>>, usize) {
    let lamb = is_lamb(&c.kind);
    let mut ps = init(lamb);
    let eight: Vec<bool> = ps
        .iter()
        .map(|p| c.bits == StateBits::Bits8 && p.numel() >= 4096)
        .collect();
    let mut a8: Vec<AdamState8> = ps.iter().map(|p| AdamState8::zeros(p.numel())).collect();
    let mut a32: Vec<AdamState32> = ps.iter().map(|p| AdamState32::zeros(p.numel())).collect();
    let mut o8: Vec<Optim1State8> = ps.iter().map(|p| Optim1State8::zeros(p.numel())).collect();
    let mut o32: Vec<Vec<f32>> = ps.iter().map(|p| vec![0.0; p.numel()]).collect();
    let mut history = vec![vec![0.0f32; 100]; ps.len()];
    let mut clipped = 0;
    for t in 1..=n {
        let g = grads(lamb, t);
        for i in 0..ps.len() {
            let mut opts = GradOptions {
                gnorm_scale: 1.0,
                skip_zeros: c.skip,
            };
            if c.clip < 100 {
                let sq = model_sqnorm(&g[i].to_f32().unwrap());
                opts.gnorm_scale = model_clip(&mut history[i], sq, t, c.clip);
                clipped += usize::from(opts.gnorm_scale < 1.0);
            }
            let (p, gi) = (&mut ps[i], &g[i]);
            match (c.kind, eight[i]) {
                (OptimizerKind::Lamb(h), true) => {
                    lamb_step_8bit(dev, p, gi, &mut a8[i], &h, t, &opts)
                }
                (OptimizerKind::Lamb(h), false) => {
                    lamb_step_32bit(dev, p, gi, &mut a32[i], &h, t, &opts)
                }
                (OptimizerKind::Lars(h), true) => {
                    lars_step_8bit(dev, p, gi, &mut o8[i], &h, t, &opts)
                }
                (OptimizerKind::Lars(h), false) => {
                    lars_step_32bit(dev, p, gi, &mut o32[i], &h, t, &opts)
                }
                _ => panic!("LAMB / LARS only"),
            }
            .expect("reference step");
        }
    }
    (ps, history, clipped)
}

/// The saved history of parameter `name` as bits.
fn saved_history(opt: &Optimizer, name: &str) -> Vec<u32> {
    let bytes = opt.state_dict().unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let hv = st.tensor(&format!("{name}.gnorm_vec")).unwrap();
    hv.data()
        .chunks(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn lamb_lars_with_clipping_resume_bit_identical_and_match_host_ops() {
    let dev = cpu();
    for kind in [lamb(), lars()] {
        for bits in [StateBits::Bits32, StateBits::Bits8] {
            let c = Case {
                kind,
                bits,
                clip: 5,
                skip: true,
            };
            let lamb = is_lamb(&kind);
            let what = format!("{}/{bits:?}", kind.name());
            let mut straight = make(c, small_workspace());
            let mut ps = init(lamb);
            run(&mut straight, &dev, &mut ps, lamb, 1, 10);

            let mut first = make(c, small_workspace());
            let mut pr = init(lamb);
            run(&mut first, &dev, &mut pr, lamb, 1, 5);
            let bytes = first.state_dict().expect("state_dict");
            drop(first);
            let mut second = make(c, OptimizerOptions::default());
            second.load_state_dict(&bytes).expect("load_state_dict");
            run(&mut second, &dev, &mut pr, lamb, 6, 10);
            assert_eq!(ps, pr, "{what}: parameters differ after resume");
            assert_eq!(
                straight.state_dict().unwrap(),
                second.state_dict().unwrap(),
                "{what}: state differs after resume"
            );

            // The host ops with the model's scales, in norm and update alike.
            let (want, history, clipped) = reference(c, &dev, 10);
            assert!(clipped >= 4, "{what}: clipping must act ({clipped})");
            assert_eq!(ps, want, "{what}: parameters differ from the host ops");
            for (i, (name, _, _)) in specs(lamb).iter().enumerate() {
                let h: Vec<u32> = history[i].iter().map(|x| x.to_bits()).collect();
                assert_eq!(
                    saved_history(&straight, name),
                    h,
                    "{what}: {name}.gnorm_vec"
                );
            }

            // Without clipping (or without skip_zeros) the trajectory differs.
            for other in [Case { clip: 100, ..c }, Case { skip: false, ..c }] {
                let mut o = make(other, small_workspace());
                let mut po = init(lamb);
                run(&mut o, &dev, &mut po, lamb, 1, 10);
                // 8-bit LAMB ignores skip_zeros (as 8-bit AdamW), on its 8-bit parameter `a`.
                let ignored = lamb && bits == StateBits::Bits8 && !other.skip;
                assert_eq!(po[0] == ps[0], ignored, "{what}: the option must matter");
            }
        }
    }
}

#[test]
fn max_unorm_groups_take_clipping_and_skip_zeros() {
    let dev = cpu();
    let adamw = AdamHyper {
        lr: 0.01,
        weight_decay: 0.01,
        ..AdamHyper::default()
    };
    let sgd = Optim1Hyper {
        lr: 0.1,
        beta1: 0.9,
        ..Optim1Hyper::defaults(Optim1Algo::Sgd)
    };
    for bits in [StateBits::Bits32, StateBits::Bits8] {
        // AdamW / SGD with a group max_unorm are LAMB / LARS with these hyperparameters.
        for (plain, norm, lamb) in [
            (
                OptimizerKind::AdamW(adamw),
                OptimizerKind::Lamb(LambHyper {
                    lr: 0.01,
                    weight_decay: 0.01,
                    max_unorm: 0.5,
                    ..LambHyper::default()
                }),
                true,
            ),
            (
                OptimizerKind::Sgd(sgd),
                OptimizerKind::Lars(LarsHyper {
                    lr: 0.1,
                    momentum: 0.9,
                    weight_decay: 0.0,
                    max_unorm: 0.5,
                }),
                false,
            ),
        ] {
            let names: Vec<&str> = specs(lamb).iter().map(|s| s.0).collect();
            let g = ParamGroup::new(names, plain, bits)
                .with_max_unorm(0.5)
                .with_percentile_clipping(10)
                .with_skip_zeros(true);
            let mut a = Optimizer::with_options(vec![g], small_workspace()).unwrap();
            let mut b = make(
                Case {
                    kind: norm,
                    bits,
                    clip: 10,
                    skip: true,
                },
                small_workspace(),
            );
            let (mut pa, mut pb) = (init(lamb), init(lamb));
            run(&mut a, &dev, &mut pa, lamb, 1, 6);
            run(&mut b, &dev, &mut pb, lamb, 1, 6);
            assert_eq!(pa, pb, "{}/{bits:?}", plain.name());
        }
    }
    // RMSprop with max_unorm: the host op with the model's scales.
    let h = Optim1Hyper::defaults(Optim1Algo::Rmsprop);
    let g = ParamGroup::new(["a", "s"], OptimizerKind::Rmsprop(h), StateBits::Bits32)
        .with_max_unorm(0.05)
        .with_percentile_clipping(10)
        .with_skip_zeros(true);
    let mut opt = Optimizer::with_options(vec![g], small_workspace()).unwrap();
    let mut ps = init(false);
    run(&mut opt, &dev, &mut ps, false, 1, 6);
    let mut want = init(false);
    let mut states: Vec<Vec<f32>> = want.iter().map(|p| vec![0.0; p.numel()]).collect();
    let mut history = vec![vec![0.0f32; 100]; 2];
    let (mut clipped, mut trust) = (0, 0);
    for t in 1..=6 {
        let gs = grads(false, t);
        for i in 0..2 {
            let sq = model_sqnorm(&gs[i].to_f32().unwrap());
            let opts = GradOptions {
                gnorm_scale: model_clip(&mut history[i], sq, t, 10),
                skip_zeros: true,
            };
            clipped += usize::from(opts.gnorm_scale < 1.0);
            let (p, s) = (&mut want[i], &mut states[i]);
            let r = Optim1Algo::Rmsprop;
            let scale =
                optim1_step_32bit_max_unorm(&dev, r, p, &gs[i], s, &h, t, 0.05, &opts).unwrap();
            trust += usize::from(scale < 1.0);
        }
    }
    assert!(clipped >= 2 && trust >= 2, "{clipped} {trust}");
    assert_eq!(ps, want, "rmsprop max_unorm with clipping");
}

#[test]
fn what_stays_refused_is_a_clear_error() {
    let ok = |g: ParamGroup| Optimizer::new(vec![g]).map(|_| ());
    // Accepted now: LAMB / LARS and max_unorm groups with both options, both widths.
    for bits in [StateBits::Bits32, StateBits::Bits8] {
        for kind in [lamb(), lars()] {
            ok(ParamGroup::new(["a"], kind, bits)
                .with_percentile_clipping(3)
                .with_skip_zeros(true))
            .unwrap();
        }
    }
    let ad = qforge::kernels::AdemamixHyper::default();
    let e = ok(
        ParamGroup::new(["a"], OptimizerKind::Ademamix(ad), StateBits::Bits8)
            .with_percentile_clipping(7),
    )
    .unwrap_err()
    .to_string();
    assert_has(
        &e,
        &["percentile_clipping = 7", "ademamix", "no gnorm_scale"],
    );
    // skip_zeros alone stays accepted (and ignored) for AdEMAMix.
    ok(ParamGroup::new(["a"], OptimizerKind::Ademamix(ad), StateBits::Bits8).with_skip_zeros(true))
        .unwrap();
}
