//! The stateful optimizer API (`qforge_kernels::optim`). Resuming from a saved state gives the
//! bit-identical trajectory (10 steps straight against 5 steps, state_dict, load into a fresh
//! optimizer, 5 steps) for Adam / AdamW with 32-bit and 8-bit state, including a parameter under
//! `min_8bit_size` in an 8-bit group (which must keep 32-bit state). The trajectory equals direct
//! calls of the host ops on whole tensors with step numbers 1 to 10 (independent of the
//! optimizer's bookkeeping, chunking and state choice). Saving to a file is atomic; every bad
//! state file or mismatched setting is an error naming the problem. The other rules (Lion, SGD,
//! RMSprop, Adagrad, AdEMAMix) get the same checks in `optim_api/rules.rs`.

use std::collections::HashMap;

use qforge::ir::DType;
use qforge::kernels::ops::{adam_step_32bit, adam_step_8bit, GradOptions};
use qforge::kernels::ops::{AdamState32, AdamState8};
use qforge::kernels::optim::{
    Optimizer, OptimizerKind, OptimizerOptions, ParamGroup, StateBits, StateLayout,
    STATE_METADATA_KEY,
};
use qforge::kernels::{AdamHyper, OptimAlgo};
use qforge::runtime::{CpuDevice, Device, HostTensor, InterpreterDevice};
use safetensors::{Dtype, SafeTensors};

/// Lion, SGD, RMSprop, Adagrad and AdEMAMix through the API.
#[path = "optim_api/rules.rs"]
mod rules;

/// Quantized AdamW (4-bit AdamW) through the API.
#[path = "optim_api/qadam.rs"]
mod qadam;

/// LAMB and LARS (the `max_unorm` trust ratio) through the API and the host ops.
#[path = "optim_api/norm.rs"]
mod norm;

/// Blockwise 8-bit LAMB and LARS (and `max_unorm` with 8-bit state) through the API.
#[path = "optim_api/norm8.rs"]
mod norm8;

/// `skip_zeros` and percentile clipping through the API, against independent models.
#[path = "optim_api/grad_opts.rs"]
mod grad_opts;

/// `max_unorm` on RMSprop and Adagrad through the API, against an independent model.
#[path = "optim_api/unorm1.rs"]
mod unorm1;

/// Percentile clipping and `skip_zeros` on LAMB / LARS and `max_unorm` groups.
#[path = "optim_api/norm_clip.rs"]
mod norm_clip;

/// splitmix64: deterministic pseudo-random numbers.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

fn random_tensor(dtype: DType, shape: &[usize], seed: u64, scale: f32) -> HostTensor {
    let mut rng = Rng(seed);
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|_| rng.uniform() * scale).collect();
    HostTensor::from_f32_as(dtype, shape.to_vec(), &v).expect("tensor")
}

/// The parameters of every case: `a` large enough for 8-bit state, `b` under `min_8bit_size`
/// (so 32-bit state even in an 8-bit group), `c` bf16 and also small.
fn param_specs() -> Vec<(&'static str, DType, Vec<usize>)> {
    vec![
        ("a", DType::F32, vec![64, 80]),
        ("b", DType::F32, vec![300]),
        ("c", DType::BF16, vec![7, 33]),
    ]
}

fn init_params() -> Vec<HostTensor> {
    param_specs()
        .iter()
        .enumerate()
        .map(|(i, (_, dt, shape))| random_tensor(*dt, shape, 100 + i as u64, 1.0))
        .collect()
}

/// Random gradients with an exact zero every 17th element (for `skip_zeros`) and a size that
/// varies by step (for percentile clipping).
fn grads(step: u32) -> Vec<HostTensor> {
    param_specs()
        .iter()
        .enumerate()
        .map(|(i, (_, dt, shape))| {
            let scale = [0.5, 0.2, 0.9, 0.4, 1.5][step as usize % 5];
            let t = random_tensor(*dt, shape, 1000 * step as u64 + i as u64, scale);
            let mut v = t.to_f32().expect("floats");
            v.iter_mut().step_by(17).for_each(|x| *x = 0.0);
            HostTensor::from_f32_as(*dt, shape.clone(), &v).expect("tensor")
        })
        .collect()
}

fn hyper(wd: f64) -> AdamHyper {
    AdamHyper {
        lr: 0.01,
        beta1: 0.9,
        beta2: 0.99,
        eps: 1e-8,
        weight_decay: wd,
    }
}

#[derive(Clone, Copy, Debug)]
struct Case {
    name: &'static str,
    algo: OptimAlgo,
    bits: StateBits,
    /// The group's `percentile_clipping` (100: off).
    clip: u32,
    /// The group's `skip_zeros`.
    skip: bool,
}

const fn case(name: &'static str, algo: OptimAlgo, bits: StateBits) -> Case {
    Case {
        name,
        algo,
        bits,
        clip: 100,
        skip: false,
    }
}

const CASES: [Case; 6] = [
    case("adam32", OptimAlgo::Adam, StateBits::Bits32),
    case("adamw32", OptimAlgo::AdamW, StateBits::Bits32),
    case("adam8bit", OptimAlgo::Adam, StateBits::Bits8),
    case("adamw8bit", OptimAlgo::AdamW, StateBits::Bits8),
    // Percentile clipping (its history is part of the state) and skip_zeros.
    Case {
        clip: 40,
        skip: true,
        ..case("adamw32_clip_skip", OptimAlgo::AdamW, StateBits::Bits32)
    },
    Case {
        clip: 5,
        skip: true,
        ..case("adam8bit_clip_skip", OptimAlgo::Adam, StateBits::Bits8)
    },
];

fn kind(algo: OptimAlgo) -> OptimizerKind {
    match algo {
        OptimAlgo::Adam => OptimizerKind::Adam(hyper(0.0)),
        OptimAlgo::AdamW => OptimizerKind::AdamW(hyper(0.1)),
    }
}

fn optimizer(case: Case, options: OptimizerOptions) -> Optimizer {
    let names: Vec<&str> = param_specs().iter().map(|p| p.0).collect();
    let group = ParamGroup::new(names, kind(case.algo), case.bits)
        .with_percentile_clipping(case.clip)
        .with_skip_zeros(case.skip);
    Optimizer::with_options(vec![group], options).expect("optimizer")
}

/// Small workspace so every parameter runs in several chunks (one with a partial block).
fn small_workspace() -> OptimizerOptions {
    OptimizerOptions {
        workspace_elems: 1000, // rounded down to 768
        ..OptimizerOptions::default()
    }
}

fn steps(opt: &mut Optimizer, dev: &dyn Device, params: &mut [HostTensor], from: u32, to: u32) {
    for t in from..=to {
        opt.step(dev, params, &grads(t)).expect("step");
    }
}

/// The independent reference: host ops on whole tensors, 32-bit state for `b` and `c`
/// (under 4096 elements), step numbers 1..=steps; with clipping, the scale of each step from
/// the model history of `grad_opts` (norms summed in the pinned order here).
fn reference(case: Case, dev: &dyn Device, n_steps: u32) -> Vec<HostTensor> {
    let mut params = init_params();
    let k = kind(case.algo);
    let (OptimizerKind::Adam(h) | OptimizerKind::AdamW(h)) = k else {
        panic!("the Adam cases use Adam kinds")
    };
    let mut s32: Vec<AdamState32> = params
        .iter()
        .map(|p| AdamState32::zeros(p.numel()))
        .collect();
    let mut s8: Vec<AdamState8> = params
        .iter()
        .map(|p| AdamState8::zeros(p.numel()))
        .collect();
    let mut history = vec![vec![0.0f32; 100]; params.len()];
    for t in 1..=n_steps {
        let g = grads(t);
        for i in 0..params.len() {
            let mut opts = GradOptions {
                gnorm_scale: 1.0,
                skip_zeros: case.skip,
            };
            if case.clip < 100 {
                let sq = grad_opts::model_sqnorm(&g[i].to_f32().expect("floats"));
                opts.gnorm_scale = grad_opts::model_clip(&mut history[i], sq, t, case.clip);
            }
            let eight = case.bits == StateBits::Bits8 && params[i].numel() >= 4096;
            let (p, a) = (&mut params[i], case.algo);
            if eight {
                adam_step_8bit(dev, a, p, &g[i], &mut s8[i], &h, t, &opts)
            } else {
                adam_step_32bit(dev, a, p, &g[i], &mut s32[i], &h, t, &opts)
            }
            .expect("reference step");
        }
    }
    params
}

fn cpu() -> CpuDevice {
    CpuDevice::new().expect("CPU device")
}

#[test]
fn resume_is_bit_identical_and_matches_host_ops() {
    let dev = cpu();
    for case in CASES {
        // Straight: 10 steps.
        let mut straight = optimizer(case, small_workspace());
        let mut p_straight = init_params();
        steps(&mut straight, &dev, &mut p_straight, 1, 10);

        // 5 steps, state_dict, a fresh optimizer loads it, 5 more steps.
        let mut first = optimizer(case, small_workspace());
        let mut p_resumed = init_params();
        steps(&mut first, &dev, &mut p_resumed, 1, 5);
        let bytes = first.state_dict().expect("state_dict");
        drop(first);
        let mut second = optimizer(case, OptimizerOptions::default());
        second.load_state_dict(&bytes).expect("load_state_dict");
        assert_eq!(second.step_count("a"), Some(5), "{}", case.name);
        steps(&mut second, &dev, &mut p_resumed, 6, 10);

        assert_eq!(
            p_straight, p_resumed,
            "{}: parameters differ after resume",
            case.name
        );
        assert_eq!(
            straight.state_dict().unwrap(),
            second.state_dict().unwrap(),
            "{}: state differs after resume",
            case.name
        );
        for name in ["a", "b", "c"] {
            assert_eq!(straight.step_count(name), Some(10));
        }
        let want_a = match case.bits {
            StateBits::Bits32 => StateLayout::Bits32,
            StateBits::Bits8 => StateLayout::Bits8,
        };
        assert_eq!(straight.state_layout("a"), Some(want_a), "{}", case.name);
        assert_eq!(
            straight.state_layout("b"),
            Some(StateLayout::Bits32),
            "{}",
            case.name
        );
        assert_eq!(
            straight.state_layout("c"),
            Some(StateLayout::Bits32),
            "{}",
            case.name
        );

        // Independent reference and a real change of every parameter.
        let want = reference(case, &dev, 10);
        assert_eq!(p_straight, want, "{}: differs from the host ops", case.name);
        for (p, p0) in p_straight.iter().zip(init_params()) {
            assert_ne!(p.data, p0.data, "{}: a parameter did not move", case.name);
        }
        println!(
            "{}: 10 steps straight == 5 + load + 5 == host ops",
            case.name
        );
    }
}

#[test]
fn state_dict_tensors_and_metadata() {
    let dev = cpu();
    let case = CASES[3];
    let mut opt = optimizer(case, OptimizerOptions::default());
    let mut p = init_params();
    steps(&mut opt, &dev, &mut p, 1, 3);
    let bytes = opt.state_dict().unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut names: Vec<String> = st.names().into_iter().cloned().collect();
    names.sort();
    assert_eq!(
        names,
        [
            "a.absmax1",
            "a.absmax2",
            "a.state1",
            "a.state2",
            "b.state1",
            "b.state2",
            "c.state1",
            "c.state2"
        ]
    );
    let a1 = st.tensor("a.state1").unwrap();
    assert_eq!((a1.dtype(), a1.shape()), (Dtype::U8, &[64usize, 80][..]));
    let m1 = st.tensor("a.absmax1").unwrap();
    assert_eq!((m1.dtype(), m1.shape()), (Dtype::F32, &[20usize][..]));
    let c1 = st.tensor("c.state1").unwrap();
    assert_eq!((c1.dtype(), c1.shape()), (Dtype::F32, &[7usize, 33][..]));
    let (_, header) = SafeTensors::read_metadata(&bytes).unwrap();
    let meta: serde_json::Value =
        serde_json::from_str(&header.metadata().as_ref().unwrap()[STATE_METADATA_KEY]).unwrap();
    assert_eq!(meta["version"], 1);
    assert_eq!(meta["min_8bit_size"], 4096);
    assert_eq!(meta["groups"][0]["kind"], "adamw");
    assert_eq!(meta["groups"][0]["bits"], 8);
    assert_eq!(meta["groups"][0]["hyper"]["lr"], 0.01);
    assert_eq!(meta["params"][0]["step"], 3);
    assert_eq!(meta["params"][0]["state"], "8bit");
    assert_eq!(meta["params"][1]["state"], "32bit");
}

#[test]
fn interpreter_small_chunks_resume() {
    // 700 elements: 3 blocks (one partial), chunks of 256; 8-bit above min_8bit_size = 256.
    let dev = InterpreterDevice;
    let options = OptimizerOptions {
        min_8bit_size: 256,
        workspace_elems: 256,
        seed: 7,
    };
    let kind = OptimizerKind::AdamW(hyper(0.05));
    let make = || {
        Optimizer::with_options(
            vec![ParamGroup::new(["w"], kind, StateBits::Bits8)],
            options,
        )
        .unwrap()
    };
    let g = |t: u32| vec![random_tensor(DType::F32, &[700], 77 + t as u64, 1.0)];
    let p0 = vec![random_tensor(DType::F32, &[700], 5, 1.0)];
    let mut straight = make();
    let mut ps = p0.clone();
    for t in 1..=6 {
        straight.step(&dev, &mut ps, &g(t)).unwrap();
    }
    let mut half = make();
    let mut pr = p0.clone();
    for t in 1..=3 {
        half.step(&dev, &mut pr, &g(t)).unwrap();
    }
    let mut resumed = make();
    resumed
        .load_state_dict(&half.state_dict().unwrap())
        .unwrap();
    assert_eq!(resumed.options().seed, 7);
    for t in 4..=6 {
        resumed.step(&dev, &mut pr, &g(t)).unwrap();
    }
    assert_eq!(ps, pr);
    assert_eq!(
        straight.state_dict().unwrap(),
        resumed.state_dict().unwrap()
    );
    // Independent: one whole-tensor host op per step.
    let (OptimizerKind::Adam(h) | OptimizerKind::AdamW(h)) = kind else {
        panic!("an AdamW kind")
    };
    let mut pw = p0[0].clone();
    let mut s = AdamState8::zeros(700);
    for t in 1..=6 {
        adam_step_8bit(
            &dev,
            OptimAlgo::AdamW,
            &mut pw,
            &g(t)[0],
            &mut s,
            &h,
            t,
            &GradOptions::default(),
        )
        .unwrap();
    }
    assert_eq!(ps[0], pw);
}

#[test]
fn save_and_load_file() {
    let dev = cpu();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("opt.safetensors");
    for case in CASES {
        let mut opt = optimizer(case, OptimizerOptions::default());
        let mut p = init_params();
        steps(&mut opt, &dev, &mut p, 1, 4);
        opt.save(&path).unwrap();
        let mut back = optimizer(case, OptimizerOptions::default());
        back.load(&path).unwrap();
        assert_eq!(back.state_dict().unwrap(), opt.state_dict().unwrap());
        assert_eq!(std::fs::read(&path).unwrap(), opt.state_dict().unwrap());
    }
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["opt.safetensors"], "temporary files left behind");
    // A directory in the way is refused, and a missing file is named.
    let opt = optimizer(CASES[0], OptimizerOptions::default());
    let e = opt.save(dir.path()).unwrap_err().to_string();
    assert!(e.contains("not a regular file"), "{e}");
    let mut fresh = optimizer(CASES[0], OptimizerOptions::default());
    let e = fresh.load(dir.path().join("nope")).unwrap_err().to_string();
    assert!(e.contains("nope"), "{e}");
}

/// A 5-step adamw8bit state file.
fn saved_state() -> Vec<u8> {
    let dev = cpu();
    let mut opt = optimizer(CASES[3], OptimizerOptions::default());
    let mut p = init_params();
    steps(&mut opt, &dev, &mut p, 1, 5);
    opt.state_dict().unwrap()
}

/// Rewrites a state file: `edit` gets every tensor as (name, dtype, shape, bytes) and the
/// metadata JSON.
fn rewrite(
    bytes: &[u8],
    edit: impl FnOnce(&mut Vec<(String, Dtype, Vec<usize>, Vec<u8>)>, &mut serde_json::Value),
) -> Vec<u8> {
    let st = SafeTensors::deserialize(bytes).unwrap();
    let (_, header) = SafeTensors::read_metadata(bytes).unwrap();
    let mut meta: serde_json::Value =
        serde_json::from_str(&header.metadata().as_ref().unwrap()[STATE_METADATA_KEY]).unwrap();
    let mut tensors: Vec<_> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, v.dtype(), v.shape().to_vec(), v.data().to_vec()))
        .collect();
    edit(&mut tensors, &mut meta);
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(n, d, s, b)| {
            let v = safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap();
            (n.clone(), v)
        })
        .collect();
    let md = Some(HashMap::from([(
        STATE_METADATA_KEY.to_string(),
        meta.to_string(),
    )]));
    safetensors::serialize(views, &md).unwrap()
}

fn load_err(opt: &mut Optimizer, bytes: &[u8]) -> String {
    let before = opt.state_dict().unwrap();
    let e = opt
        .load_state_dict(bytes)
        .expect_err("load must fail")
        .to_string();
    assert_eq!(
        opt.state_dict().unwrap(),
        before,
        "a failed load changed the state"
    );
    e
}

fn assert_has(e: &str, needles: &[&str]) {
    for n in needles {
        assert!(e.contains(n), "error '{e}' does not mention '{n}'");
    }
}

#[test]
fn bad_state_files_are_clear_errors() {
    let good = saved_state();
    let fresh = || optimizer(CASES[3], OptimizerOptions::default());
    // Sanity: the untouched file and a no-op rewrite load.
    fresh().load_state_dict(&good).unwrap();
    fresh().load_state_dict(&rewrite(&good, |_, _| {})).unwrap();

    // Truncated, in the header and in the data; not safetensors at all.
    assert_has(&load_err(&mut fresh(), &good[..5]), &["truncated"]);
    assert_has(&load_err(&mut fresh(), &good[..100]), &["truncated"]);
    assert_has(
        &load_err(&mut fresh(), &good[..good.len() - 10]),
        &["truncated"],
    );
    assert_has(
        &load_err(&mut fresh(), b"this is not a safetensors file at all"),
        &["not a safetensors file"],
    );
    // Truncated file on disk: the error names the path.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cut.safetensors");
    std::fs::write(&path, &good[..good.len() / 2]).unwrap();
    let e = fresh().load(&path).unwrap_err().to_string();
    assert_has(&e, &["cut.safetensors", "truncated"]);

    // Valid safetensors without our metadata.
    let plain = safetensors::serialize(
        [(
            "x",
            safetensors::tensor::TensorView::new(Dtype::U8, vec![1], &[0]).unwrap(),
        )],
        &None,
    )
    .unwrap();
    assert_has(&load_err(&mut fresh(), &plain), &["no metadata entry"]);

    // Missing tensor.
    let b = rewrite(&good, |t, _| t.retain(|x| x.0 != "a.absmax2"));
    assert_has(&load_err(&mut fresh(), &b), &["missing tensor 'a.absmax2'"]);
    // Unexpected tensor.
    let b = rewrite(&good, |t, _| {
        t.push(("a.state3".into(), Dtype::U8, vec![2], vec![0, 0]))
    });
    assert_has(
        &load_err(&mut fresh(), &b),
        &["unexpected tensor 'a.state3'"],
    );
    // Wrong shape (same element count) and wrong dtype.
    let b = rewrite(&good, |t, _| {
        t.iter_mut().find(|x| x.0 == "a.state1").unwrap().2 = vec![80, 64];
    });
    assert_has(&load_err(&mut fresh(), &b), &["'a.state1'", "wrong shape"]);
    let b = rewrite(&good, |t, _| {
        t.iter_mut().find(|x| x.0 == "b.state2").unwrap().1 = Dtype::I32;
    });
    assert_has(&load_err(&mut fresh(), &b), &["'b.state2'", "dtype"]);
    // Wrong shape recorded for the parameter (changes the absmax length).
    let b = rewrite(&good, |_, m| {
        m["params"][0]["shape"] = serde_json::json!([64, 81])
    });
    assert_has(&load_err(&mut fresh(), &b), &["wrong shape"]);
    // Another format version.
    let b = rewrite(&good, |_, m| m["version"] = serde_json::json!(99));
    assert_has(&load_err(&mut fresh(), &b), &["version 99"]);
}

#[test]
fn mismatched_settings_are_clear_errors() {
    let good = saved_state(); // adamw, 8-bit, params a b c, lr 0.01, min_8bit_size 4096
    let names = ["a", "b", "c"];
    let with = |k: OptimizerKind, bits: StateBits, params: &[&str], options: OptimizerOptions| {
        Optimizer::with_options(vec![ParamGroup::new(params.to_vec(), k, bits)], options).unwrap()
    };
    let def = OptimizerOptions::default();
    let adamw = kind(OptimAlgo::AdamW);

    let mut o = with(kind(OptimAlgo::Adam), StateBits::Bits8, &names, def);
    assert_has(&load_err(&mut o, &good), &["algorithm", "adamw", "adam"]);
    let mut o = with(adamw, StateBits::Bits32, &names, def);
    assert_has(&load_err(&mut o, &good), &["state bits"]);
    let mut h = hyper(0.1);
    h.lr = 0.02;
    let mut o = with(OptimizerKind::AdamW(h), StateBits::Bits8, &names, def);
    assert_has(&load_err(&mut o, &good), &["hyperparameter lr"]);
    let mut h = hyper(0.1);
    h.beta2 = f64::from_bits(h.beta2.to_bits() + 1); // one ulp apart
    let mut o = with(OptimizerKind::AdamW(h), StateBits::Bits8, &names, def);
    assert_has(&load_err(&mut o, &good), &["hyperparameter beta2"]);
    let mut o = with(adamw, StateBits::Bits8, &["a", "b"], def);
    assert_has(&load_err(&mut o, &good), &["unknown parameter 'c'"]);
    let mut o = with(adamw, StateBits::Bits8, &["a", "b", "c", "d"], def);
    assert_has(&load_err(&mut o, &good), &["parameter 'd' is missing"]);
    let mut o = with(adamw, StateBits::Bits8, &["b", "a", "c"], def);
    assert_has(&load_err(&mut o, &good), &["parameter list"]);
    let small = OptimizerOptions {
        min_8bit_size: 256,
        ..def
    };
    let mut o = with(adamw, StateBits::Bits8, &names, small);
    assert_has(&load_err(&mut o, &good), &["min_8bit_size"]);
    // Two groups instead of one.
    let mut o = Optimizer::new(vec![
        ParamGroup::new(["a"], adamw, StateBits::Bits8),
        ParamGroup::new(["b", "c"], adamw, StateBits::Bits8),
    ])
    .unwrap();
    assert_has(
        &load_err(&mut o, &good),
        &["1 parameter group(s), this optimizer has 2"],
    );
}

#[test]
fn bad_steps_and_groups_are_errors() {
    let dev = InterpreterDevice;
    let adamw = kind(OptimAlgo::AdamW);
    // Constructor.
    let e = Optimizer::new(vec![ParamGroup::new(["x", "x"], adamw, StateBits::Bits32)])
        .unwrap_err()
        .to_string();
    assert_has(&e, &["'x'", "twice"]);
    let e = Optimizer::new(vec![ParamGroup::new(
        ["x"],
        OptimizerKind::Adam(hyper(0.1)),
        StateBits::Bits32,
    )])
    .unwrap_err()
    .to_string();
    assert_has(&e, &["weight_decay"]);
    assert!(Optimizer::new(vec![]).is_err());

    let mut o =
        Optimizer::new(vec![ParamGroup::new(["x", "y"], adamw, StateBits::Bits32)]).unwrap();
    let x = random_tensor(DType::F32, &[10], 1, 1.0);
    let y = random_tensor(DType::F32, &[4, 3], 2, 1.0);
    // Wrong count.
    let e = o
        .step(&dev, &mut [x.clone()], std::slice::from_ref(&x))
        .unwrap_err()
        .to_string();
    assert_has(&e, &["2 parameters"]);
    // Gradient of another shape: nothing is updated.
    let mut ps = [x.clone(), y.clone()];
    let bad = random_tensor(DType::F32, &[12], 3, 1.0);
    let e = o
        .step(&dev, &mut ps, &[x.clone(), bad])
        .unwrap_err()
        .to_string();
    assert_has(&e, &["'y'", "shape"]);
    assert_eq!(ps, [x.clone(), y.clone()]);
    assert_eq!(o.step_count("x"), Some(0));
    // One good step, then a parameter whose shape changed.
    o.step(&dev, &mut ps, &[x.clone(), y.clone()]).unwrap();
    let y2 = random_tensor(DType::F32, &[3, 4], 2, 1.0);
    let e = o
        .step(&dev, &mut [x.clone(), y2.clone()], &[x.clone(), y2])
        .unwrap_err()
        .to_string();
    assert_has(&e, &["'y'", "shape"]);

    // step_named: only parameters with a gradient step; unknown names are errors.
    let mut params = HashMap::from([("x".to_string(), x.clone()), ("y".to_string(), y.clone())]);
    let grads = HashMap::from([("x".to_string(), x.clone())]);
    o.step_named(&dev, &mut params, &grads).unwrap();
    assert_eq!((o.step_count("x"), o.step_count("y")), (Some(2), Some(1)));
    assert_eq!(params["y"], y);
    assert_ne!(params["x"], x);
    let grads = HashMap::from([("z".to_string(), x.clone())]);
    let e = o
        .step_named(&dev, &mut params, &grads)
        .unwrap_err()
        .to_string();
    assert_has(&e, &["unknown parameter 'z'"]);
}

/// A device whose launch number `fail_at` (counted from 0) fails: a device error mid-step.
struct FailingDevice {
    inner: InterpreterDevice,
    launches: std::sync::atomic::AtomicUsize,
    fail_at: usize,
}

impl Device for FailingDevice {
    fn name(&self) -> &str {
        "failing"
    }
    fn backend(&self) -> &'static str {
        "failing"
    }
    fn compile(&self, kernel: &qforge::ir::Kernel) -> qforge::runtime::Result<()> {
        self.inner.compile(kernel)
    }
    fn launch(
        &self,
        kernel: &qforge::ir::Kernel,
        args: &mut [qforge::ir::Arg<'_>],
    ) -> qforge::runtime::Result<()> {
        let n = self
            .launches
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if n == self.fail_at {
            return Err(qforge::runtime::Error::Invalid(
                "injected device failure".into(),
            ));
        }
        self.inner.launch(kernel, args)
    }
}

/// Found by a fresh-user pass: a malformed tensor, hyperparameters whose f32 values overflow
/// or whose eps rounds to 0, step counts past i32::MAX, and a failed first step.
#[test]
fn malformed_tensors_extreme_hyperparameters_and_failed_steps_are_clear_errors() {
    let dev = InterpreterDevice;
    let adamw = |h: AdamHyper| OptimizerKind::AdamW(h);
    let x = random_tensor(DType::F32, &[300], 1, 1.0);
    // A tensor whose bytes do not match its shape (the fields are public).
    let mut o = Optimizer::new(vec![ParamGroup::new(
        ["x"],
        kind(OptimAlgo::AdamW),
        StateBits::Bits32,
    )])
    .unwrap();
    let mut short = x.clone();
    short.data.truncate(40);
    let e = o
        .step(&dev, &mut [short.clone()], &[short])
        .unwrap_err()
        .to_string();
    assert_has(&e, &["'x'", "40 bytes", "1200"]);
    // Finite f64 hyperparameters whose f32 kernel values are not usable.
    for (h, needle) in [
        (
            AdamHyper {
                lr: 1e39,
                ..hyper(0.0)
            },
            "step_size",
        ),
        (
            AdamHyper {
                weight_decay: 1e300,
                ..hyper(0.0)
            },
            "decay",
        ),
        (
            AdamHyper {
                eps: 1e-50,
                ..hyper(0.0)
            },
            "eps",
        ),
    ] {
        for bits in [StateBits::Bits32, StateBits::Bits8] {
            let mut o = Optimizer::new(vec![ParamGroup::new(["x"], adamw(h), bits)]).unwrap();
            let mut p = [x.clone()];
            let e = o
                .step(&dev, &mut p, std::slice::from_ref(&x))
                .unwrap_err()
                .to_string();
            assert_has(&e, &[needle, "f32"]);
            assert_eq!(p[0], x, "nothing is updated");
        }
    }
    // A first step whose device fails leaves no state: what is saved next loads again.
    let failing = FailingDevice {
        inner: InterpreterDevice,
        launches: std::sync::atomic::AtomicUsize::new(0),
        fail_at: 0,
    };
    let mut o = Optimizer::new(vec![ParamGroup::new(
        ["x"],
        kind(OptimAlgo::AdamW),
        StateBits::Bits32,
    )])
    .unwrap();
    let mut p = [x.clone()];
    let e = o
        .step(&failing, &mut p, std::slice::from_ref(&x))
        .unwrap_err()
        .to_string();
    assert_has(&e, &["injected device failure"]);
    assert_eq!((o.step_count("x"), o.state_layout("x")), (Some(0), None));
    let saved = o.state_dict().unwrap();
    let mut fresh = Optimizer::new(vec![ParamGroup::new(
        ["x"],
        kind(OptimAlgo::AdamW),
        StateBits::Bits32,
    )])
    .unwrap();
    fresh.load_state_dict(&saved).unwrap();
}

/// Step numbers past `i32::MAX` (where `beta.powi(t)` would wrap) are refused by every rule's
/// scalars instead of giving NaN parameters.
#[test]
fn step_numbers_past_i32_max_are_refused() {
    use qforge::kernels::{AdemamixHyper, LambHyper, OptimSpec, QAdamScalars};
    let spec = OptimSpec {
        algo: OptimAlgo::AdamW,
        state: StateBits::Bits32,
        dtype: DType::F32,
    };
    let big = i32::MAX as u32 + 1;
    assert!(hyper(0.0).scalars(&spec, i32::MAX as u32).is_ok());
    let errors = [
        hyper(0.0).scalars(&spec, big).map(|_| ()),
        LambHyper::default().scalars(big).map(|_| ()),
        AdemamixHyper::default().scalars(big).map(|_| ()),
        QAdamScalars::new(&hyper(0.0), big).map(|_| ()),
    ];
    for e in errors {
        assert_has(&e.unwrap_err().to_string(), &["2147483648", "step"]);
    }
}
