//! bitsandbytes' `skip_zeros` and percentile clipping through the optimizer API, against
//! models written here: the gradient norm in the pinned order (per 256-element block, 8
//! `fma` partials from `-0.0` and the halving tree; blocks summed in order from `-0.0`), the
//! 100-entry history and its percentile (bitsandbytes' `percentile_clipping`), and "a zero
//! gradient leaves its element untouched". The history is saved and loaded with the state
//! (the resume test in `optim_api.rs` runs clipped groups too).

use qforge::ir::DType;
use qforge::kernels::ops::{optim1_step_32bit, optim1_step_8bit, GradOptions};
use qforge::kernels::ops::{LambHyper, Optim1State8};
use qforge::kernels::optim::{
    Optimizer, OptimizerKind, OptimizerOptions, ParamGroup, QAdamWConfig, StateBits,
};
use qforge::kernels::{AdamHyper, Optim1Algo, Optim1Hyper};
use qforge::runtime::{Device, HostTensor};
use safetensors::{Dtype, SafeTensors};

use super::{assert_has, cpu, load_err, random_tensor, rewrite, small_workspace};

/// Model: the squared L2 norm of `g` in the pinned order.
pub(crate) fn model_sqnorm(g: &[f32]) -> f32 {
    let mut total = -0.0f32;
    for block in g.chunks(256) {
        let mut acc = [-0.0f32; 8];
        for (i, x) in block.iter().enumerate() {
            acc[i % 8] = x.mul_add(*x, acc[i % 8]);
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

/// Model: bitsandbytes' `percentile_clipping` for step `t` (1-based): the history holds
/// squared norms; step 1 fills all 100 entries with the first one, later steps overwrite entry
/// `t % 100`; the scale is `clip / current` when the current norm exceeds the norm at index
/// `percentile` of the sorted history, else 1.
pub(crate) fn model_clip(history: &mut [f32], sq: f32, t: u32, percentile: u32) -> f32 {
    if t == 1 {
        history.iter_mut().for_each(|h| *h = sq);
    } else {
        history[t as usize % 100] = sq;
    }
    let mut sorted = history.to_vec();
    sorted.sort_by(f32::total_cmp);
    let current = history[t as usize % 100].sqrt();
    let clip = sorted[percentile as usize].sqrt();
    if current > clip {
        clip / current
    } else {
        1.0
    }
}

const SHAPE: [usize; 2] = [64, 80];

fn init() -> Vec<HostTensor> {
    vec![random_tensor(DType::F32, &SHAPE, 77, 1.0)]
}

/// Gradients whose size varies by step; zeros at `i % 11 == 0` from step 3 on, and the whole
/// third block zero at step 4.
fn grads(t: u32) -> Vec<HostTensor> {
    let scale = [0.3, 0.1, 0.8, 0.2, 2.0, 0.4][t as usize % 6];
    let g = random_tensor(DType::F32, &SHAPE, 500 + u64::from(t), scale);
    let mut v = g.to_f32().unwrap();
    if t >= 3 {
        v.iter_mut().step_by(11).for_each(|x| *x = 0.0);
    }
    if t == 4 {
        v[512..768].iter_mut().for_each(|x| *x = -0.0);
    }
    vec![HostTensor::from_f32(SHAPE.to_vec(), &v).unwrap()]
}

fn one(algo: Optim1Algo, weight_decay: f64) -> Optim1Hyper {
    Optim1Hyper {
        weight_decay,
        ..Optim1Hyper::defaults(algo)
    }
}

fn adam() -> AdamHyper {
    AdamHyper {
        lr: 0.01,
        ..AdamHyper::default()
    }
}

/// The kinds honouring `skip_zeros`, with weight decay only where it is decoupled (with
/// coupled decay bitsandbytes' 32-bit kernels test `g + p * wd`, not `g`).
fn skip_kinds() -> Vec<(OptimizerKind, StateBits)> {
    let mut out = vec![
        (OptimizerKind::Adam(adam()), StateBits::Bits32),
        (
            OptimizerKind::AdamW(AdamHyper {
                weight_decay: 0.1,
                ..adam()
            }),
            StateBits::Bits32,
        ),
    ];
    for bits in [StateBits::Bits32, StateBits::Bits8] {
        out.push((OptimizerKind::Lion(one(Optim1Algo::Lion, 0.1)), bits));
        out.push((OptimizerKind::Sgd(one(Optim1Algo::Sgd, 0.0)), bits));
        out.push((OptimizerKind::Rmsprop(one(Optim1Algo::Rmsprop, 0.0)), bits));
        // 8-bit kernels test the raw g, so coupled decay can stay on.
        let wd = if bits == StateBits::Bits8 { 0.01 } else { 0.0 };
        out.push((OptimizerKind::Adagrad(one(Optim1Algo::Adagrad, wd)), bits));
    }
    out
}

fn make(group: ParamGroup) -> Optimizer {
    Optimizer::with_options(vec![group], small_workspace()).expect("optimizer")
}

fn run(opt: &mut Optimizer, dev: &dyn Device, p: &mut [HostTensor], from: u32, to: u32) {
    for t in from..=to {
        opt.step(dev, p, &grads(t)).expect("step");
    }
}

/// Every state tensor of `a` as raw bytes, by name.
fn state(opt: &Optimizer) -> Vec<(String, Vec<u8>)> {
    let bytes = opt.state_dict().unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut out: Vec<_> = st
        .tensors()
        .into_iter()
        .filter(|(n, _)| !n.ends_with("gnorm_vec"))
        .map(|(n, v)| (n, v.data().to_vec()))
        .collect();
    out.sort();
    out
}

/// The bytes of element `i` of a state tensor (`f32` or `u8` per element; absmax per block).
fn elem(name: &str, data: &[u8], i: usize) -> Vec<u8> {
    if name.contains("absmax") {
        let b = i / 256;
        data[4 * b..4 * b + 4].to_vec()
    } else if data.len() == SHAPE[0] * SHAPE[1] {
        vec![data[i]]
    } else {
        data[4 * i..4 * i + 4].to_vec()
    }
}

#[test]
fn skip_zeros_leaves_zero_gradient_elements_untouched() {
    let dev = cpu();
    for (kind, bits) in skip_kinds() {
        let case = format!("{}/{bits:?}", kind.name());
        let mut opt = make(ParamGroup::new(["a"], kind, bits).with_skip_zeros(true));
        let mut plain = make(ParamGroup::new(["a"], kind, bits));
        let (mut p, mut q) = (init(), init());
        run(&mut opt, &dev, &mut p, 1, 3);
        run(&mut plain, &dev, &mut q, 1, 3);
        let (p3, s3) = (p[0].to_f32().unwrap(), state(&opt));
        let (q3, r3) = (q[0].to_f32().unwrap(), state(&plain));
        run(&mut opt, &dev, &mut p, 4, 4);
        run(&mut plain, &dev, &mut q, 4, 4);
        let (p4, s4) = (p[0].to_f32().unwrap(), state(&opt));
        let (q4, r4) = (q[0].to_f32().unwrap(), state(&plain));
        let g = grads(4)[0].to_f32().unwrap();
        let (mut zeros, mut moved_plain) = (0, 0);
        for i in 0..g.len() {
            if g[i] != 0.0 {
                continue;
            }
            zeros += 1;
            let eight = bits == StateBits::Bits8;
            // 8-bit state of a skipped element is requantized with its block's new absmax,
            // so only the all-zero block keeps its codes for sure.
            let whole_block = (512..768).contains(&i);
            assert_eq!(p4[i].to_bits(), p3[i].to_bits(), "{case}: p[{i}] moved");
            for ((name, before), (_, after)) in s3.iter().zip(&s4) {
                if !eight || whole_block {
                    assert_eq!(
                        elem(name, before, i),
                        elem(name, after, i),
                        "{case}: {name}[{i}] changed"
                    );
                }
            }
            // Without skip_zeros the element changes (its parameter or its state).
            let state_moved = r3
                .iter()
                .zip(&r4)
                .any(|((n, b), (_, a))| elem(n, b, i) != elem(n, a, i));
            if q4[i].to_bits() != q3[i].to_bits() || state_moved {
                moved_plain += 1;
            }
        }
        assert!(zeros > 600, "{case}: {zeros} zero gradients");
        // (32-bit Adagrad without weight decay does not change an element whose gradient is
        // zero: there skip_zeros has nothing to skip.)
        let noop = matches!(kind, OptimizerKind::Adagrad(_)) && bits == StateBits::Bits32;
        let want = if noop { 0 } else { zeros };
        assert_eq!(moved_plain, want, "{case}: the test must be able to fail");
        // The other elements still step.
        assert_ne!(p4, p3, "{case}");
    }
}

#[test]
fn skip_zeros_is_ignored_where_bitsandbytes_ignores_it() {
    let dev = cpu();
    let kinds = [
        (OptimizerKind::Adam(adam()), StateBits::Bits8),
        (OptimizerKind::AdamW(adam()), StateBits::Bits8),
        (
            OptimizerKind::Ademamix(qforge::kernels::AdemamixHyper::default()),
            StateBits::Bits32,
        ),
        (
            OptimizerKind::Ademamix(qforge::kernels::AdemamixHyper::default()),
            StateBits::Bits8,
        ),
    ];
    for (kind, bits) in kinds {
        let mut a = make(ParamGroup::new(["a"], kind, bits).with_skip_zeros(true));
        let mut b = make(ParamGroup::new(["a"], kind, bits));
        let (mut p, mut q) = (init(), init());
        run(&mut a, &dev, &mut p, 1, 4);
        run(&mut b, &dev, &mut q, 1, 4);
        assert_eq!(p, q, "{}/{bits:?}", kind.name());
        assert_eq!(state(&a), state(&b), "{}/{bits:?}", kind.name());
    }
}

#[test]
fn percentile_clipping_history_and_scale_match_the_model() {
    let dev = cpu();
    let kinds = [
        (
            OptimizerKind::Lion(one(Optim1Algo::Lion, 0.1)),
            StateBits::Bits8,
        ),
        (
            OptimizerKind::Sgd(one(Optim1Algo::Sgd, 0.01)),
            StateBits::Bits32,
        ),
        (
            OptimizerKind::Rmsprop(one(Optim1Algo::Rmsprop, 0.0)),
            StateBits::Bits8,
        ),
        (
            OptimizerKind::Adagrad(one(Optim1Algo::Adagrad, 0.01)),
            StateBits::Bits32,
        ),
    ];
    for (kind, bits) in kinds {
        for (percentile, skip) in [(5, false), (50, true)] {
            let case = format!("{}/{bits:?}/p{percentile}", kind.name());
            let group = ParamGroup::new(["a"], kind, bits)
                .with_percentile_clipping(percentile)
                .with_skip_zeros(skip);
            let mut opt = make(group);
            let mut p = init();
            run(&mut opt, &dev, &mut p, 1, 6);
            // The model: history, scales, and whole-tensor host ops with those scales.
            let (OptimizerKind::Lion(h)
            | OptimizerKind::Sgd(h)
            | OptimizerKind::Rmsprop(h)
            | OptimizerKind::Adagrad(h)) = kind
            else {
                panic!("one-state kinds")
            };
            let algo = match kind {
                OptimizerKind::Lion(_) => Optim1Algo::Lion,
                OptimizerKind::Sgd(_) => Optim1Algo::Sgd,
                OptimizerKind::Rmsprop(_) => Optim1Algo::Rmsprop,
                _ => Optim1Algo::Adagrad,
            };
            let mut history = vec![0.0f32; 100];
            let mut q = init();
            let n = q[0].numel();
            let (mut s32, mut s8) = (vec![0.0f32; n], Optim1State8::zeros(n));
            let mut clipped = 0;
            for t in 1..=6 {
                let g = grads(t);
                let sq = model_sqnorm(&g[0].to_f32().unwrap());
                let exact: f64 = g[0]
                    .to_f32()
                    .unwrap()
                    .iter()
                    .map(|x| f64::from(*x).powi(2))
                    .sum();
                assert!((f64::from(sq) - exact).abs() <= 1e-5 * exact, "{case}");
                let gnorm_scale = model_clip(&mut history, sq, t, percentile);
                clipped += usize::from(gnorm_scale < 1.0);
                let opts = GradOptions {
                    gnorm_scale,
                    skip_zeros: skip,
                };
                match bits {
                    StateBits::Bits32 => {
                        optim1_step_32bit(&dev, algo, &mut q[0], &g[0], &mut s32, &h, t, &opts)
                    }
                    StateBits::Bits8 => {
                        optim1_step_8bit(&dev, algo, &mut q[0], &g[0], &mut s8, &h, t, &opts)
                    }
                }
                .unwrap();
            }
            assert!(clipped >= 2, "{case}: clipping must act ({clipped} steps)");
            assert_eq!(p, q, "{case}: parameters differ from the model's");
            let bytes = opt.state_dict().unwrap();
            let st = SafeTensors::deserialize(&bytes).unwrap();
            let hv = st.tensor("a.gnorm_vec").unwrap();
            assert_eq!((hv.dtype(), hv.shape()), (Dtype::F32, &[100usize][..]));
            let saved: Vec<u32> = hv
                .data()
                .chunks(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            let want: Vec<u32> = history.iter().map(|x| x.to_bits()).collect();
            assert_eq!(saved, want, "{case}: saved history");
        }
    }
}

#[test]
fn clipping_history_resumes_and_mismatches_are_errors() {
    let dev = cpu();
    let kind = OptimizerKind::Sgd(one(Optim1Algo::Sgd, 0.0));
    let group = || ParamGroup::new(["a"], kind, StateBits::Bits8).with_percentile_clipping(10);
    let mut straight = make(group());
    let mut ps = init();
    run(&mut straight, &dev, &mut ps, 1, 6);
    let mut first = make(group());
    let mut pr = init();
    run(&mut first, &dev, &mut pr, 1, 3);
    let bytes = first.state_dict().unwrap();
    let mut second = make(group());
    second.load_state_dict(&bytes).unwrap();
    run(&mut second, &dev, &mut pr, 4, 6);
    assert_eq!(ps, pr);
    assert_eq!(straight.state_dict().unwrap(), second.state_dict().unwrap());
    // A history that was not restored (zeros) gives another trajectory: the test can fail.
    let wiped = rewrite(&bytes, |tensors, _| {
        for (n, _, _, data) in tensors.iter_mut() {
            if n == "a.gnorm_vec" {
                data.iter_mut().for_each(|b| *b = 0);
            }
        }
    });
    let mut third = make(group());
    third.load_state_dict(&wiped).unwrap();
    let mut pw = init();
    run(&mut make(group()), &dev, &mut pw, 1, 3);
    run(&mut third, &dev, &mut pw, 4, 6);
    assert_ne!(ps, pw, "the history must matter");
    // Other settings, a missing history, a history of the wrong shape.
    let mut off = make(ParamGroup::new(["a"], kind, StateBits::Bits8));
    assert_has(
        &load_err(&mut off, &bytes),
        &["percentile_clipping is 10 in the file, 100 (off) here"],
    );
    let mut other =
        make(ParamGroup::new(["a"], kind, StateBits::Bits8).with_percentile_clipping(20));
    assert_has(
        &load_err(&mut other, &bytes),
        &["percentile_clipping", "20"],
    );
    let missing = rewrite(&bytes, |tensors, _| {
        tensors.retain(|t| t.0 != "a.gnorm_vec")
    });
    assert_has(
        &load_err(&mut make(group()), &missing),
        &["missing tensor 'a.gnorm_vec'"],
    );
    let short = rewrite(&bytes, |tensors, _| {
        for t in tensors.iter_mut().filter(|t| t.0 == "a.gnorm_vec") {
            t.2 = vec![50];
            t.3.truncate(200);
        }
    });
    assert_has(
        &load_err(&mut make(group()), &short),
        &["a.gnorm_vec", "[100]"],
    );
    let skip = rewrite(&bytes, |_, meta| {
        meta["groups"][0]["hyper"]["skip_zeros"] = serde_json::json!(1.0);
    });
    assert_has(
        &load_err(&mut make(group()), &skip),
        &["skip_zeros is true in the file, false here"],
    );
    // The exact bits of a hyperparameter decide; the message shows the file's exact value.
    let nan_lr = rewrite(&bytes, |_, meta| {
        meta["groups"][0]["hyper_bits"]["lr"] = serde_json::json!("7ff8000000000000");
    });
    assert_has(
        &load_err(&mut make(group()), &nan_lr),
        &["hyperparameter lr is NaN in the file"],
    );
    let no_bits = rewrite(&bytes, |_, meta| {
        if let Some(bits) = meta["groups"][0]["hyper_bits"].as_object_mut() {
            bits.remove("lr");
        }
    });
    assert_has(
        &load_err(&mut make(group()), &no_bits),
        &["hyperparameter lr", "missing or malformed"],
    );
    // A step count past i32::MAX is refused when loading, not at the next step.
    let late = rewrite(&bytes, |_, meta| {
        meta["params"][0]["step"] = serde_json::json!(2_147_483_648u64);
    });
    assert_has(
        &load_err(&mut make(group()), &late),
        &["invalid step 2147483648", "0..=2147483647"],
    );
}

#[test]
fn bad_gradient_options_are_errors_naming_value_and_group() {
    let sgd = OptimizerKind::Sgd(one(Optim1Algo::Sgd, 0.0));
    let err = |g: ParamGroup| {
        let ok = ParamGroup::new(["z"], sgd, StateBits::Bits32);
        Optimizer::new(vec![ok, g]).unwrap_err().to_string()
    };
    for p in [0, 101, 1000] {
        let e = err(ParamGroup::new(["a"], sgd, StateBits::Bits32).with_percentile_clipping(p));
        assert_has(
            &e,
            &["group 1", &format!("percentile_clipping = {p}"), "1..=100"],
        );
    }
    let q = OptimizerKind::QAdamW(QAdamWConfig::zip_sr(adam()));
    let e = err(ParamGroup::new(["a"], q, StateBits::Bits8).with_skip_zeros(true));
    assert_has(&e, &["group 1", "skip_zeros = true", "qadamw"]);
    let e = err(ParamGroup::new(["a"], q, StateBits::Bits8).with_percentile_clipping(5));
    assert_has(&e, &["group 1", "percentile_clipping = 5", "qadamw"]);
    let am = OptimizerKind::Ademamix(qforge::kernels::AdemamixHyper::default());
    let e = err(ParamGroup::new(["a"], am, StateBits::Bits32).with_percentile_clipping(5));
    assert_has(&e, &["group 1", "percentile_clipping = 5", "ademamix"]);
    // The update-norm paths take both options (optim_api/norm_clip.rs checks them).
    let lamb = OptimizerKind::Lamb(LambHyper::default());
    Optimizer::new(vec![
        ParamGroup::new(["a"], lamb, StateBits::Bits32).with_skip_zeros(true)
    ])
    .unwrap();
    Optimizer::new(vec![ParamGroup::new(
        ["a"],
        OptimizerKind::AdamW(adam()),
        StateBits::Bits32,
    )
    .with_max_unorm(1.0)
    .with_skip_zeros(true)
    .with_percentile_clipping(5)])
    .unwrap();
    // max_unorm must be finite and non-zero in f32 (the kernels' type), named in scientific form.
    for (m, shown) in [
        (1e-46, "1e-46"),
        (1e39, "1e39"),
        (1e300, "1e300"),
        (-1.0, "-1.0"),
    ] {
        let e = err(ParamGroup::new(["a"], sgd, StateBits::Bits32).with_max_unorm(m));
        assert_has(&e, &["group 1", &format!("max_unorm = {shown}"), "f32"]);
    }
    // 100 is "off" and valid; 1 is valid.
    for p in [1, 100] {
        Optimizer::new(vec![
            ParamGroup::new(["a"], sgd, StateBits::Bits8).with_percentile_clipping(p)
        ])
        .unwrap();
    }
    // gnorm_scale outside [0, 1] at the host op.
    let dev = cpu();
    let mut p = init();
    let mut s = vec![0.0f32; p[0].numel()];
    let opts = GradOptions {
        gnorm_scale: 1.5,
        skip_zeros: false,
    };
    let h = one(Optim1Algo::Sgd, 0.0);
    let e = optim1_step_32bit(
        &dev,
        Optim1Algo::Sgd,
        &mut p[0],
        &grads(1)[0],
        &mut s,
        &h,
        1,
        &opts,
    )
    .unwrap_err()
    .to_string();
    assert_has(&e, &["gnorm_scale = 1.5", "[0, 1]"]);
    let _ = OptimizerOptions::default();
}

/// 130 steps (the history wraps around) on a small parameter with a gradient size that differs
/// every step, at low, middle and high percentiles: the parameters equal whole-tensor host ops
/// run with the model's scales, and the saved history equals the model's.
#[test]
fn long_history_wraps_and_the_percentile_index_is_exact() {
    let dev = cpu();
    let kind = OptimizerKind::Sgd(one(Optim1Algo::Sgd, 0.0));
    let h = one(Optim1Algo::Sgd, 0.0);
    let g = |t: u32| {
        let scale = 0.05 + ((t * 37) % 101) as f32 * 0.01;
        random_tensor(DType::F32, &[300], 9000 + u64::from(t), scale)
    };
    for percentile in [1, 37, 90] {
        let group =
            ParamGroup::new(["a"], kind, StateBits::Bits32).with_percentile_clipping(percentile);
        let mut opt = make(group);
        let mut p = vec![random_tensor(DType::F32, &[300], 5, 1.0)];
        let mut q = p.clone();
        let mut s = vec![0.0f32; 300];
        let mut history = vec![0.0f32; 100];
        let mut scales = Vec::new();
        for t in 1..=130 {
            let gt = g(t);
            opt.step(&dev, &mut p, std::slice::from_ref(&gt)).unwrap();
            let sq = model_sqnorm(&gt.to_f32().unwrap());
            let gnorm_scale = model_clip(&mut history, sq, t, percentile);
            scales.push(gnorm_scale);
            let opts = GradOptions {
                gnorm_scale,
                skip_zeros: false,
            };
            optim1_step_32bit(&dev, Optim1Algo::Sgd, &mut q[0], &gt, &mut s, &h, t, &opts).unwrap();
            assert_eq!(p, q, "p{percentile} step {t}");
        }
        let clipped = scales.iter().filter(|s| **s < 1.0).count();
        assert!(
            clipped > 0 && clipped < 130,
            "p{percentile}: {clipped} clipped"
        );
        let bytes = opt.state_dict().unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let saved: Vec<u8> = st.tensor("a.gnorm_vec").unwrap().data().to_vec();
        let want: Vec<u8> = history.iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(saved, want, "p{percentile}");
    }
}
