//! Convergence of quantized AdamW on a least-squares problem built from real all-MiniLM-L6-v2
//! weights (issue 6, "Convergence"): 8-bit AdamW must reach a loss within 2% (relative) of
//! fp32 AdamW after the same number of steps, with the same hyperparameters and start.
//!
//! 4-bit AdamW (ZIP-SR and ZE-EDEN through `OptimizerKind::QAdamW`, bit-exact with the
//! adamw4bit reference in `tests/optim4.rs`) runs the same problem, but the 2% target
//! does NOT hold for it here, so the test prints its gap and only asserts that it converges
//! (drop of at least [`MIN_DROP_4BIT`]). Measured at 200 steps: ZIP-SR 4.848e-4 (+284.8% over
//! fp32's 1.260e-4), ZE-EDEN 2.364e-4 (+87.6%). Isolating runs (measured once, not in the
//! test): `QAdamW` with both moments in f32 equals fp32 AdamW to 0.000%; NF4 m1 with f32 m2
//! +234.9% (NF4 RTN rounds every momentum below about 4% of its block's absmax to exactly 0);
//! f32 m1 with `dyn4_sr` m2 +22.9%, with `dyn4_nz_eden` m2 -23.1%; NF4 *stochastic* m1
//! (`nf4_sr`) with `dyn4_sr` +25.3%, with `dyn4_nz_eden` -21.8%. With betas (0.9, 0.95) the
//! gaps are larger (ZIP-SR +2428%, ZE-EDEN +196%, 8-bit 11.0%). So the 4-bit state's coarse
//! levels, not an implementation error, set the gap on this small, finely converging problem.
//!
//! The problem: inputs X are 256 real token embeddings (`embeddings.word_embeddings.weight`
//! rows 2000..2256, 256 x 384), the hidden true weight W* is the first 16 rows of
//! `encoder.layer.0.attention.self.query.weight` (16 x 384), targets Y = X W*^T. The trained
//! parameter W (16 x 384 = 6144 elements, above `min_8bit_size` = 4096, so the 8-bit group
//! really keeps 8-bit state: asserted) starts at zero and minimises
//! `L(W) = mean((X W^T - Y)^2)` over all 256 x 16 entries. Loss and gradient
//! `dL/dW = 2/(256*16) (X W^T - Y)^T X` are computed on the host in f64 from the f32
//! parameter (independent of the code under test); the gradient is rounded once to f32.
//!
//! How the numbers were chosen: lr, betas and eps are bitsandbytes' defaults; the step count
//! was picked on an fp32 NumPy prototype of the same problem (before any 8-bit run) so that the
//! loss falls by a large factor: x66.4 after 200 steps (x17.9 after 100), so [`MIN_DROP`] = 30
//! is under half the measured drop yet fails an optimizer taking steps half as large.
//!
//! Measured (CPU device): at 200 steps 8-bit ends 1.41% above fp32 (1.2776e-4 vs 1.2598e-4),
//! so the 2% check holds here, but with little margin and not uniformly: along the curve 8-bit
//! is first up to 3.8% *below* fp32 (step 86), crosses it near step 175, and then falls
//! behind; other settings measured for the record (not in the test) exceed 2%: lr 1e-3 for
//! 300/500 steps 6.1%/9.9%, lr 3e-3 for 100/300 steps 6.1%/2.7%, lr 1e-2 for 100 steps 4.7%.
//! The largest gap along the curve is printed.
//!
//! Needs `../shared` (fails under CI=true without it, skips with a reason elsewhere).

use std::path::Path;

use qforge::ir::library::AdamHyper;
use qforge::runtime::optim::{
    Optimizer, OptimizerKind, OptimizerOptions, ParamGroup, QAdamWConfig, StateBits,
};
use qforge::runtime::{CpuDevice, HostTensor};
use safetensors::SafeTensors;

/// Samples (token embeddings).
const N: usize = 256;
/// Outputs (rows of W*); N_OUT * D = 6144 parameter elements.
const N_OUT: usize = 16;
/// Model width of all-MiniLM-L6-v2.
const D: usize = 384;
/// First token id used as a sample.
const FIRST_TOKEN: usize = 2000;
/// Steps per run.
const STEPS: usize = 200;
/// The fp32 run must end at a loss at most `start / MIN_DROP`.
const MIN_DROP: f64 = 30.0;
/// Largest allowed relative distance of the 8-bit run's final loss from fp32's.
const MAX_REL: f64 = 0.02;
/// The 4-bit runs must end at a loss at most `start / MIN_DROP_4BIT` (measured: x17.2 ZIP-SR,
/// x35.4 ZE-EDEN).
const MIN_DROP_4BIT: f64 = 10.0;

/// bitsandbytes' defaults (lr 1e-3, betas (0.9, 0.999), eps 1e-8) with no weight decay.
fn hyper() -> AdamHyper {
    AdamHyper {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
    }
}

/// Runs compared against fp32 (the first entry is the fp32 reference): name, rule, width; the
/// 8-bit run is held to [`MAX_REL`], the 4-bit runs (names starting `adamw4bit`) to
/// [`MIN_DROP_4BIT`].
fn runs() -> Vec<(&'static str, OptimizerKind, StateBits)> {
    vec![
        ("adamw32", OptimizerKind::AdamW(hyper()), StateBits::Bits32),
        ("adamw8bit", OptimizerKind::AdamW(hyper()), StateBits::Bits8),
        (
            "adamw4bit_zip_sr",
            OptimizerKind::QAdamW(QAdamWConfig::zip_sr(hyper())),
            StateBits::Bits8,
        ),
        (
            "adamw4bit_ze_eden",
            OptimizerKind::QAdamW(QAdamWConfig::ze_eden(hyper())),
            StateBits::Bits8,
        ),
    ]
}

fn f32s(st: &SafeTensors, name: &str) -> (Vec<usize>, Vec<f32>) {
    let t = st.tensor(name).unwrap();
    let v = t
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    (t.shape().to_vec(), v)
}

/// The least-squares problem: X (N x D) and Y = X W*^T (N x N_OUT), in f64.
struct Problem {
    x: Vec<f64>,
    y: Vec<f64>,
}

impl Problem {
    /// Residual R = X W^T - Y (N x N_OUT) for the f32 parameter `w` (N_OUT x D).
    fn residual(&self, w: &[f32]) -> Vec<f64> {
        let mut r = vec![0f64; N * N_OUT];
        for s in 0..N {
            let xs = &self.x[s * D..(s + 1) * D];
            for o in 0..N_OUT {
                let wo = &w[o * D..(o + 1) * D];
                let dot: f64 = xs.iter().zip(wo).map(|(a, b)| a * *b as f64).sum();
                r[s * N_OUT + o] = dot - self.y[s * N_OUT + o];
            }
        }
        r
    }

    /// Mean squared error and its gradient (rounded once to f32) at `w`.
    fn loss_and_grad(&self, w: &[f32]) -> (f64, Vec<f32>) {
        let r = self.residual(w);
        let count = (N * N_OUT) as f64;
        let loss = r.iter().map(|e| e * e).sum::<f64>() / count;
        let mut g = vec![0f64; N_OUT * D];
        for s in 0..N {
            let xs = &self.x[s * D..(s + 1) * D];
            for o in 0..N_OUT {
                let c = 2.0 * r[s * N_OUT + o] / count;
                for (gi, xi) in g[o * D..(o + 1) * D].iter_mut().zip(xs) {
                    *gi += c * xi;
                }
            }
        }
        (loss, g.iter().map(|&v| v as f32).collect())
    }
}

/// Trains W from zero for [`STEPS`] steps; returns the loss before each step and after the last
/// (STEPS + 1 values).
fn train(dev: &CpuDevice, p: &Problem, kind: OptimizerKind, bits: StateBits) -> Vec<f64> {
    let options = OptimizerOptions {
        seed: 1234,
        ..OptimizerOptions::default()
    };
    let mut opt =
        Optimizer::with_options(vec![ParamGroup::new(["w"], kind, bits)], options).unwrap();
    let mut params = [HostTensor::from_f32(vec![N_OUT, D], &vec![0f32; N_OUT * D]).unwrap()];
    let mut losses = Vec::with_capacity(STEPS + 1);
    for _ in 0..STEPS {
        let (loss, g) = p.loss_and_grad(&params[0].to_f32().unwrap());
        losses.push(loss);
        let grads = [HostTensor::from_f32(vec![N_OUT, D], &g).unwrap()];
        opt.step(dev, &mut params, &grads).unwrap();
    }
    assert_eq!(opt.state_bits("w"), Some(bits), "state width actually used");
    losses.push(p.loss_and_grad(&params[0].to_f32().unwrap()).0);
    losses
}

#[test]
fn quantized_adamw_reaches_the_fp32_loss_on_minilm_least_squares() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/models/all-MiniLM-L6-v2");
    if !dir.join("model.safetensors").is_file() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{} missing under CI",
            dir.display()
        );
        println!("skipped: {} is missing", dir.display());
        return;
    }
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let (eshape, emb) = f32s(&st, "embeddings.word_embeddings.weight");
    let (qshape, q) = f32s(&st, "encoder.layer.0.attention.self.query.weight");
    assert_eq!((eshape[1], qshape[1]), (D, D), "MiniLM width");
    let x: Vec<f64> = emb[FIRST_TOKEN * D..(FIRST_TOKEN + N) * D]
        .iter()
        .map(|&v| v as f64)
        .collect();
    let w_star = &q[..N_OUT * D];
    let mut y = vec![0f64; N * N_OUT];
    for s in 0..N {
        for o in 0..N_OUT {
            y[s * N_OUT + o] = (0..D)
                .map(|i| x[s * D + i] * w_star[o * D + i] as f64)
                .sum();
        }
    }
    let p = Problem { x, y };
    // Independent sanity check of the host loss: zero at W*.
    assert!(p.loss_and_grad(w_star).0 < 1e-12, "loss at W* is not ~0");

    let dev = CpuDevice::new().unwrap();
    let runs = runs();
    let curves: Vec<Vec<f64>> = runs
        .iter()
        .map(|&(_, k, b)| train(&dev, &p, k, b))
        .collect();

    println!("loss (mean squared error) by step:");
    print!("{:>6}", "step");
    for (name, _, _) in &runs {
        print!(" {name:>18}");
    }
    println!();
    for t in (0..=STEPS).filter(|t| t % 10 == 0 || *t == STEPS) {
        print!("{t:>6}");
        for c in &curves {
            print!(" {:>18.5e}", c[t]);
        }
        println!();
    }
    let reference = &curves[0];
    let (start, end) = (reference[0], reference[STEPS]);
    println!(
        "{}: start {start:.6e}, final {end:.6e}, drop x{:.1}",
        runs[0].0,
        start / end
    );
    assert!(
        start / end >= MIN_DROP,
        "fp32 AdamW loss fell only x{:.1} (need x{MIN_DROP})",
        start / end
    );
    for (i, &(name, _, _)) in runs.iter().enumerate().skip(1) {
        let fin = curves[i][STEPS];
        let rel = (fin - end).abs() / end;
        let (worst_t, worst) = (0..=STEPS)
            .map(|t| (t, (curves[i][t] - reference[t]).abs() / reference[t]))
            .fold((0, 0f64), |a, b| if b.1 > a.1 { b } else { a });
        println!(
            "{name}: largest relative gap along the curve {:.3}% at step {worst_t} (not asserted)",
            worst * 100.0
        );
        println!(
            "{name}: final {fin:.6e} vs fp32 {end:.6e}: relative difference {:.3}%",
            rel * 100.0
        );
        if name.starts_with("adamw4bit") {
            println!(
                "{name}: NOT within {}% of fp32 (issue target; see the module docs); drop x{:.1}",
                MAX_REL * 100.0,
                curves[i][0] / fin
            );
            assert!(
                curves[i][0] / fin >= MIN_DROP_4BIT,
                "{name}: loss fell only x{:.1} (need x{MIN_DROP_4BIT})",
                curves[i][0] / fin
            );
            continue;
        }
        assert!(
            rel <= MAX_REL,
            "{name}: final loss {fin:.6e} is {:.3}% from fp32's {end:.6e} (limit {}%)",
            rel * 100.0,
            MAX_REL * 100.0
        );
    }
}
