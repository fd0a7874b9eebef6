//! Quantized AdamW (4-bit AdamW) through the optimizer API: for each recipe (ZIP-SR, ZE-EDEN,
//! `QuantizedAdamW` 8-bit linear, deterministic NF4 + dyn4_nz), 10 steps straight equal 5 steps,
//! state_dict, load into a fresh optimizer, 5 steps (parameters and state bit for bit), with the
//! first moment of `a` switched to NF4 stochastic rounding before step 3; and both equal direct
//! whole-tensor calls of the host op (so chunking and bookkeeping change nothing). Files saved
//! with other schemes, truncated files and wrong shapes are clear errors.

use qforge::ir::DType;
use qforge::kernels::ops::{qadamw_step, QAdamRng, QAdamState};
use qforge::kernels::optim::{
    Optimizer, OptimizerKind, OptimizerOptions, ParamGroup, QAdamWConfig, StateBits, StateLayout,
    STATE_METADATA_KEY,
};
use qforge::kernels::MomentScheme;
use qforge::runtime::{Device, HostTensor};
use safetensors::{Dtype, SafeTensors};

use super::{assert_has, cpu, hyper, load_err, random_tensor};

/// `a` (5120, quantized by every scheme), `b` (300, stays f32), `c` (bf16, 4608), `d` (4224:
/// a multiple of 128 but not of 256, so 8-bit linear keeps it f32).
const SHAPES: [(&str, DType, &[usize]); 4] = [
    ("a", DType::F32, &[64, 80]),
    ("b", DType::F32, &[300]),
    ("c", DType::BF16, &[64, 72]),
    ("d", DType::F32, &[4224]),
];

const SEED: u64 = 0x1234_5678_9abc;
/// The step before which `a`'s first moment switches to NF4 stochastic rounding.
const SWITCH: u32 = 3;

fn init() -> Vec<HostTensor> {
    SHAPES
        .iter()
        .enumerate()
        .map(|(i, (_, dt, s))| random_tensor(*dt, s, 500 + i as u64, 1.0))
        .collect()
}

fn grads(t: u32) -> Vec<HostTensor> {
    SHAPES
        .iter()
        .enumerate()
        .map(|(i, (_, dt, s))| random_tensor(*dt, s, 7000 * t as u64 + i as u64, 0.01))
        .collect()
}

fn recipes() -> Vec<(&'static str, QAdamWConfig)> {
    let h = hyper(0.1);
    vec![
        ("zip_sr", QAdamWConfig::zip_sr(h)),
        ("ze_eden", QAdamWConfig::ze_eden(h)),
        ("lin8", QAdamWConfig::quantized(h)),
        (
            "det4",
            QAdamWConfig::new(h, MomentScheme::Nf4, MomentScheme::Dyn4Nz),
        ),
    ]
}

fn options(workspace_elems: usize) -> OptimizerOptions {
    OptimizerOptions {
        workspace_elems,
        seed: SEED,
        ..OptimizerOptions::default()
    }
}

fn make(cfg: QAdamWConfig, options: OptimizerOptions) -> Optimizer {
    let names: Vec<&str> = SHAPES.iter().map(|s| s.0).collect();
    Optimizer::with_options(
        vec![ParamGroup::new(
            names,
            OptimizerKind::QAdamW(cfg),
            StateBits::Bits8,
        )],
        options,
    )
    .expect("optimizer")
}

fn run(opt: &mut Optimizer, dev: &dyn Device, params: &mut [HostTensor], from: u32, to: u32) {
    for t in from..=to {
        if t == SWITCH && opt.m1_quant_scheme("a") == Some(MomentScheme::Nf4) {
            opt.set_m1_quant_scheme_for_parameters(&["a"], MomentScheme::Nf4Sr)
                .expect("switch");
        }
        opt.step(dev, params, &grads(t)).expect("step");
    }
}

/// The direct reference: whole-tensor host op calls, parameter id = position.
fn reference(cfg: QAdamWConfig, dev: &dyn Device, n: u32) -> Vec<HostTensor> {
    let mut params = init();
    let mut states: Vec<QAdamState> = params
        .iter()
        .map(|p| QAdamState::new(cfg.m1, cfg.m2, p.numel()))
        .collect();
    for t in 1..=n {
        if t == SWITCH && states[0].m1.scheme == MomentScheme::Nf4 {
            states[0].m1.scheme = MomentScheme::Nf4Sr;
        }
        let g = grads(t);
        for (i, p) in params.iter_mut().enumerate() {
            let rng = QAdamRng {
                seed: SEED,
                param_id: i as u32,
                offset: 0,
            };
            qadamw_step(dev, p, &g[i], &mut states[i], &cfg.hyper, t, rng).expect("step");
        }
    }
    params
}

#[test]
fn qadamw_resume_bit_identical_and_matches_host_op() {
    let dev = cpu();
    for (name, cfg) in recipes() {
        let mut straight = make(cfg, options(1000));
        let mut ps = init();
        run(&mut straight, &dev, &mut ps, 1, 10);

        let mut first = make(cfg, options(1000));
        let mut pr = init();
        run(&mut first, &dev, &mut pr, 1, 5);
        let bytes = first.state_dict().expect("state_dict");
        drop(first);
        let mut second = make(cfg, OptimizerOptions::default());
        second.load_state_dict(&bytes).expect("load");
        assert_eq!(second.options().seed, SEED, "{name}: seed restored");
        run(&mut second, &dev, &mut pr, 6, 10);

        assert_eq!(ps, pr, "{name}: parameters differ after resume");
        assert_eq!(
            straight.state_dict().unwrap(),
            second.state_dict().unwrap(),
            "{name}: state differs after resume"
        );
        let direct = reference(cfg, &dev, 10);
        assert_eq!(ps, direct, "{name}: differs from the host op");
        for (p, p0) in ps.iter().zip(init()) {
            assert_ne!(p.data, p0.data, "{name}: a parameter did not move");
        }
        let want_a = if cfg.m1 == MomentScheme::Nf4 {
            MomentScheme::Nf4Sr
        } else {
            cfg.m1
        };
        assert_eq!(second.m1_quant_scheme("a"), Some(want_a), "{name}");
        assert_eq!(second.m1_quant_scheme("b"), Some(cfg.m1), "{name}");
        // The reported layout is the stored one: `a` (5120 = 40 * 128 = 20 * 256) in every
        // scheme, `b` (300) in f32, `d` (4224 = 33 * 128, not a multiple of 256) 4-bit moments
        // quantized and 8-bit ones in f32.
        let qadam = |m1, m2| Some(StateLayout::QAdamW { m1, m2 });
        let four_only = |s: MomentScheme| {
            if s == MomentScheme::Linear8 {
                MomentScheme::Fp32
            } else {
                s
            }
        };
        assert_eq!(straight.state_layout("a"), qadam(want_a, cfg.m2), "{name}");
        let fp32 = MomentScheme::Fp32;
        assert_eq!(straight.state_layout("b"), qadam(fp32, fp32), "{name}");
        let want_d = qadam(four_only(cfg.m1), four_only(cfg.m2));
        assert_eq!(straight.state_layout("d"), want_d, "{name}");
        println!("{name}: 10 steps straight == 5 + load + 5 == host op");
    }
}

#[test]
fn qadamw_state_dict_layout_and_memory() {
    let dev = cpu();
    let mut opt = make(QAdamWConfig::zip_sr(hyper(0.1)), options(1 << 20));
    let mut p = init();
    run(&mut opt, &dev, &mut p, 1, SWITCH);
    let bytes = opt.state_dict().unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let t = |n: &str| {
        let v = st.tensor(n).unwrap_or_else(|_| panic!("{n}"));
        (v.dtype(), v.shape().to_vec())
    };
    assert_eq!(t("a.state1"), (Dtype::U8, vec![2560]));
    assert_eq!(t("a.absmax1"), (Dtype::F32, vec![40]));
    assert_eq!(t("a.state2"), (Dtype::U8, vec![2560]));
    assert_eq!(t("a.absmax2"), (Dtype::F32, vec![40]));
    assert_eq!(t("b.state1"), (Dtype::F32, vec![300]));
    assert_eq!(t("b.state2"), (Dtype::F32, vec![300]));
    assert_eq!(t("d.state1"), (Dtype::U8, vec![2112]));
    // 4-bit state: 12.5% of two f32 moments plus one f32 scale per 128 elements and moment.
    let a_bytes = 2 * 2560 + 2 * 4 * 40;
    assert_eq!(a_bytes * 10000 / (5120 * 8), 1328); // 12.5% + 0.78%
    let (_, header) = SafeTensors::read_metadata(&bytes).unwrap();
    let meta: serde_json::Value =
        serde_json::from_str(&header.metadata().as_ref().unwrap()[STATE_METADATA_KEY]).unwrap();
    assert_eq!(meta["groups"][0]["kind"], "qadamw");
    assert_eq!(meta["groups"][0]["m1_scheme"], "nf4");
    assert_eq!(meta["groups"][0]["m2_scheme"], "dyn4_sr");
    assert_eq!(meta["seed"], SEED);
    assert_eq!(meta["params"][0]["state"], "qadamw:nf4_sr+dyn4_sr");
    assert_eq!(meta["params"][0]["m1_scheme"], "nf4_sr");
    assert_eq!(meta["params"][1]["state"], "qadamw:fp32+fp32");
    assert!(meta["params"][1]["m1_scheme"].is_null());

    // Linear 8-bit: i8 codes of the parameter's shape, 256-element blocks.
    let mut opt = make(QAdamWConfig::quantized(hyper(0.1)), options(1 << 20));
    let mut p = init();
    run(&mut opt, &dev, &mut p, 1, 1);
    let bytes = opt.state_dict().unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let v = st.tensor("a.state1").unwrap();
    assert_eq!((v.dtype(), v.shape()), (Dtype::I8, &[64usize, 80][..]));
    assert_eq!(st.tensor("a.absmax2").unwrap().shape(), &[20]);
    assert_eq!(st.tensor("d.state1").unwrap().dtype(), Dtype::F32);
}

#[test]
fn qadamw_bad_files_settings_and_switches_are_errors() {
    let dev = cpu();
    let h = hyper(0.1);
    let mut opt = make(QAdamWConfig::zip_sr(h), options(1 << 20));
    let mut p = init();
    run(&mut opt, &dev, &mut p, 1, 2);
    let good = opt.state_dict().unwrap();

    // Other schemes, other rule.
    let e = load_err(&mut make(QAdamWConfig::ze_eden(h), options(1 << 20)), &good);
    assert_has(&e, &["m2_scheme", "dyn4_sr", "dyn4_nz_eden"]);
    let e = load_err(
        &mut make(QAdamWConfig::quantized(h), options(1 << 20)),
        &good,
    );
    assert_has(&e, &["m1_scheme", "nf4", "linear8"]);
    let adamw = Optimizer::new(vec![ParamGroup::new(
        SHAPES.iter().map(|s| s.0),
        OptimizerKind::AdamW(h),
        StateBits::Bits8,
    )]);
    let e = load_err(&mut adamw.unwrap(), &good);
    assert_has(&e, &["algorithm", "qadamw", "adamw"]);

    // Truncated.
    let e = load_err(
        &mut make(QAdamWConfig::zip_sr(h), options(1 << 20)),
        &good[..good.len() - 9],
    );
    assert_has(&e, &["truncated"]);

    // Wrong shape: the loading optimizer already stepped `a` with another shape.
    let mut other = make(QAdamWConfig::zip_sr(h), options(1 << 20));
    let mut q = init();
    q[0] = random_tensor(DType::F32, &[5120 * 2], 1, 1.0);
    let mut g = grads(1);
    g[0] = random_tensor(DType::F32, &[5120 * 2], 2, 0.01);
    other.step(&dev, &mut q, &g).unwrap();
    let e = load_err(&mut other, &good);
    assert_has(&e, &["'a'", "shape"]);

    // Switches.
    let e = opt
        .set_m1_quant_scheme_for_parameters(&["zz"], MomentScheme::Nf4Sr)
        .unwrap_err()
        .to_string();
    assert_has(&e, &["unknown parameter 'zz'"]);
    let e = opt
        .set_m1_quant_scheme_for_parameters(&["a"], MomentScheme::Dyn4)
        .unwrap_err()
        .to_string();
    assert_has(&e, &["dyn4", "first moment"]);
    let e = opt
        .set_m1_quant_scheme_for_parameters(&["a", "c"], MomentScheme::Linear8)
        .unwrap_err()
        .to_string();
    assert_has(&e, &["'a'", "nf4", "linear8"]);
    assert_eq!(
        opt.m1_quant_scheme("c"),
        Some(MomentScheme::Nf4),
        "nothing changed"
    );
    // `b` is f32 by the small-tensor rule: any first-moment scheme keeps it f32.
    opt.set_m1_quant_scheme_for_parameters(&["b"], MomentScheme::Linear8)
        .unwrap();
    let e = Optimizer::new(vec![ParamGroup::new(
        ["x"],
        OptimizerKind::QAdamW(QAdamWConfig::new(h, MomentScheme::Dyn4, MomentScheme::Dyn4)),
        StateBits::Bits8,
    )])
    .unwrap_err()
    .to_string();
    assert_has(&e, &["first-moment scheme 'dyn4'"]);
    let mut adamw = Optimizer::new(vec![ParamGroup::new(
        ["x"],
        OptimizerKind::AdamW(h),
        StateBits::Bits8,
    )])
    .unwrap();
    let e = adamw
        .set_m1_quant_scheme_for_parameters(&["x"], MomentScheme::Nf4Sr)
        .unwrap_err()
        .to_string();
    assert_has(&e, &["'x'", "adamw"]);
}
