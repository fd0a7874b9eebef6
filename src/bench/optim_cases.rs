//! Bench cases of one AdamW optimizer step on `f32` parameters: the library kernels
//! `adamw32_f32` (`f32` moments), `adamw8bit_f32` (8-bit blockwise moments) and the 4-bit AdamW
//! recipes `adamw4bit_zip_sr` (`qadamw_nf4_dyn4_sr_f32`) and `adamw4bit_ze_eden`
//! (`qadamw_nf4_dyn4_nz_eden_f32`), each against the 32-bit step itself (`adamw32`) and a memcpy
//! of the bytes the step touches (`memcpy`).
//!
//! Each case runs on preallocated buffers: parameters in `±0.02` (an initialisation scale),
//! gradients of standard deviation about `1e-3` (uniform in `±`[`GRAD_SCALE`]), and moments
//! that start at zero and are filled by [`WARMUP_STEPS`] steps on the untimed warm-up call.
//! Every timed run is one more step on the same buffers with the scalars of step
//! `WARMUP_STEPS + 1`. `adamw32` launches its kernel; the quantized steps go through the
//! runtime's launchers (`ops::launch_adam8`, `ops::launch_qadam`), which on a CPU device run the
//! staged kernels over 512 Ki-element chunks and allocate their workspace in the timed call.
//!
//! Bytes per case ([`bytes_per_step`]) count each buffer the step touches once, as
//! `KernelSpec::Optim`'s `bytes_moved` does (the memcpy baseline reads and writes that many):
//! parameters (read and written) 4, gradients 4, and the state: 8 bytes per parameter for
//! `adamw32` (two `f32` moments), `2 + 8/256` for `adamw8bit` (two 8-bit codes and two `f32`
//! absmax per block of 256), `1 + 8/128` for the 4-bit recipes (two packed 4-bit codes, 12.5% of
//! the `f32` moments, and two `f32` scales per block of 128). At 16 Mi parameters that is
//! 256 MiB, 160.5 MiB and 145 MiB.

use qforge_ir::{Arg, DType, Kernel, Scalar};
use qforge_kernels::ops::{launch_adam8, launch_qadam, Adam8Buffers, QAdamBuffers, QAdamRng};
use qforge_kernels::{
    AdamHyper, MomentScheme, OptimAlgo, OptimSpec, QAdamScalars, QAdamSpec, StateBits,
    OPTIM_BLOCKSIZE,
};
use qforge_runtime::Device;

use super::baselines::{memcpy_baseline, pseudo_random};
use super::cases::{CaseSize, FULL_ELEMENTS};
use super::{Baseline, BenchCase, Runner};
use crate::error::Result;

/// Kernel name (and baseline name) of the 32-bit step.
pub const ADAMW32: &str = "adamw32";
/// Kernel name of the 8-bit step.
pub const ADAMW8BIT: &str = "adamw8bit";
/// Case name of the 4-bit ZIP-SR step.
pub const ADAMW4BIT_ZIP_SR: &str = "adamw4bit_zip_sr";
/// Case name of the 4-bit ZE-EDEN step.
pub const ADAMW4BIT_ZE_EDEN: &str = "adamw4bit_ze_eden";

/// Which step a case runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepKind {
    /// bitsandbytes-style AdamW with 32-bit or 8-bit state.
    Adam(StateBits),
    /// Quantized AdamW (4-bit AdamW) with these schemes.
    QAdam(QAdamSpec),
}

impl StepKind {
    /// ZIP-SR on `f32` parameters.
    pub fn zip_sr() -> StepKind {
        StepKind::QAdam(QAdamSpec::new(
            MomentScheme::Nf4,
            MomentScheme::Dyn4Sr,
            DType::F32,
        ))
    }
    /// ZE-EDEN on `f32` parameters.
    pub fn ze_eden() -> StepKind {
        StepKind::QAdam(QAdamSpec::new(
            MomentScheme::Nf4,
            MomentScheme::Dyn4NzEden,
            DType::F32,
        ))
    }
}
/// Steps run on the untimed warm-up call to fill the moments.
pub const WARMUP_STEPS: u32 = 3;
/// Gradients are uniform in `±GRAD_SCALE`: standard deviation `GRAD_SCALE / sqrt(3)`, about `1e-3`.
pub const GRAD_SCALE: f32 = 1.7e-3;
/// Parameters are uniform in `±PARAM_SCALE`.
pub const PARAM_SCALE: f32 = 0.02;

/// The optimizer cases for a device of this size class: `adamw32`, `adamw8bit`,
/// `adamw4bit_zip_sr`, `adamw4bit_ze_eden`, each with the baselines `adamw32` (for `adamw32`
/// itself a ratio near 1, kept so every optimizer line has the same baselines) and `memcpy`.
pub fn optim_cases(size: CaseSize) -> Vec<BenchCase> {
    let n = size.elements();
    let mut shape = format!("params={n}");
    if size == CaseSize::Interpreter {
        shape.push_str(&format!(" (interpreter: scaled down from {FULL_ELEMENTS})"));
    }
    [
        (ADAMW32, StepKind::Adam(StateBits::Bits32)),
        (ADAMW8BIT, StepKind::Adam(StateBits::Bits8)),
        (ADAMW4BIT_ZIP_SR, StepKind::zip_sr()),
        (ADAMW4BIT_ZE_EDEN, StepKind::ze_eden()),
    ]
    .into_iter()
    .map(|(kernel, which)| {
        let bytes = bytes_per_step_of(which, n);
        BenchCase::new(
            kernel,
            shape.clone(),
            DType::F32,
            bytes,
            step_runner(which, n),
        )
        .baseline(Baseline {
            name: ADAMW32.to_string(),
            run: step_runner(StepKind::Adam(StateBits::Bits32), n),
        })
        .baseline(memcpy_baseline(bytes))
    })
    .collect()
}

/// Bytes one `f32` AdamW step on `n` parameters touches, each buffer counted once: parameters
/// `4n` (read and written), gradients `4n`, and the state (`8n` for 32-bit; `2n` codes plus
/// `8` bytes of absmax per block of [`OPTIM_BLOCKSIZE`] for 8-bit).
pub fn bytes_per_step(state: StateBits, n: usize) -> usize {
    let state_bytes = match state {
        StateBits::Bits32 => 8 * n,
        StateBits::Bits8 => 2 * n + 8 * n.div_ceil(OPTIM_BLOCKSIZE as usize),
    };
    8 * n + state_bytes
}

/// Bytes one step of `which` on `n` `f32` parameters touches: as [`bytes_per_step`]; for a
/// quantized step, each moment's codes (`n / 2` bytes at 4 bits, `n` at 8, `4n` in `f32`) and
/// `4` bytes per scale block.
pub fn bytes_per_step_of(which: StepKind, n: usize) -> usize {
    match which {
        StepKind::Adam(state) => bytes_per_step(state, n),
        StepKind::QAdam(spec) => {
            let moment = |s: MomentScheme| {
                let (codes, blocks) = s.state_lens(n);
                let code_bytes = if s.bits() == 32 { 4 * codes } else { codes };
                code_bytes + 4 * blocks
            };
            8 * n + moment(spec.m1) + moment(spec.m2)
        }
    }
}

/// The kernel spec of a case.
fn spec(state: StateBits) -> OptimSpec {
    OptimSpec {
        algo: OptimAlgo::AdamW,
        state,
        dtype: DType::F32,
    }
}

/// bitsandbytes' defaults with a weight decay of 0.01 (so the decay multiply is not trivial).
fn hyper() -> AdamHyper {
    AdamHyper {
        weight_decay: 0.01,
        ..AdamHyper::default()
    }
}

/// A runner that prepares a [`Step`] on its first call, then runs one step per call.
fn step_runner(which: StepKind, n: usize) -> Runner {
    let mut step: Option<Step> = None;
    Box::new(move |dev: &dyn Device| {
        if step.is_none() {
            step = Some(match which {
                StepKind::Adam(state) => Step::prepare(dev, state, n)?,
                StepKind::QAdam(spec) => Step::prepare_qadam(dev, spec, n)?,
            });
        }
        if let Some(s) = step.as_mut() {
            s.launch(dev)?;
        }
        Ok(())
    })
}

/// How a [`Step`] runs.
enum Launch {
    /// One launch of this kernel.
    Kernel(Kernel),
    /// The runtime's 8-bit step ([`qforge_kernels::ops::launch_adam8`]): on a CPU device the
    /// staged kernel over chunks with a bounded workspace, as `adam_step_8bit` runs it.
    Adam8(OptimSpec),
    /// The runtime's quantized-AdamW step ([`qforge_kernels::ops::launch_qadam`], seed 0,
    /// parameter id 0) with the scalars of one step: on a CPU device the staged kernel over
    /// chunks, as `qadamw_step` runs it.
    QAdam(QAdamSpec, QAdamScalars),
}

/// One optimizer's kernel and buffers.
struct Step {
    launch: Launch,
    /// The scalars of the timed step: for [`Launch::Kernel`] all of them (`n`, `n_blocks` and
    /// the hyperparameters), for [`Launch::Adam8`] the hyperparameters; unused by
    /// [`Launch::QAdam`], which holds its own.
    scalars: Vec<Scalar>,
    params: Vec<u8>,
    grads: Vec<u8>,
    /// 32-bit: `[state1, state2]`; 8-bit: `[state1, absmax1, state2, absmax2]`.
    state: Vec<Vec<u8>>,
}

fn f32_bytes(values: impl Iterator<Item = f32>) -> Vec<u8> {
    values.flat_map(f32::to_le_bytes).collect()
}

impl Step {
    /// Builds the kernel and the buffers (zero moments), then runs [`WARMUP_STEPS`] steps.
    fn prepare(dev: &dyn Device, state: StateBits, n: usize) -> Result<Step> {
        let spec = spec(state);
        let launch = match state {
            StateBits::Bits32 => Launch::Kernel(spec.build()?),
            StateBits::Bits8 => Launch::Adam8(spec),
        };
        let params = f32_bytes(pseudo_random(n, 10).into_iter().map(|v| v * PARAM_SCALE));
        let grads = f32_bytes(pseudo_random(n, 11).into_iter().map(|v| v * GRAD_SCALE));
        let n_blocks = n.div_ceil(OPTIM_BLOCKSIZE as usize);
        // Zero absmax makes every code dequantize to 0, so 8-bit moments start at zero too.
        let state_bufs = match state {
            StateBits::Bits32 => vec![vec![0u8; 4 * n], vec![0u8; 4 * n]],
            StateBits::Bits8 => vec![
                vec![0u8; n],
                vec![0u8; 4 * n_blocks],
                vec![0u8; n],
                vec![0u8; 4 * n_blocks],
            ],
        };
        // `n` and `n_blocks` first for a kernel launched directly; `launch_adam8` takes the rest.
        let sizes = match state {
            StateBits::Bits32 => vec![Scalar::U32(n as u32), Scalar::U32(n_blocks as u32)],
            StateBits::Bits8 => Vec::new(),
        };
        let scalars_of = |t: u32| -> Result<Vec<Scalar>> {
            let mut s = sizes.clone();
            s.extend(hyper().scalars(&spec, t)?.kernel_args(&spec));
            Ok(s)
        };
        let mut step = Step {
            launch,
            scalars: Vec::new(),
            params,
            grads,
            state: state_bufs,
        };
        for t in 1..=WARMUP_STEPS {
            step.scalars = scalars_of(t)?;
            step.launch(dev)?;
        }
        step.scalars = scalars_of(WARMUP_STEPS + 1)?;
        Ok(step)
    }

    /// Builds a quantized-AdamW kernel and its buffers (the reference's initial state), then
    /// runs [`WARMUP_STEPS`] steps (seed 0, parameter id 0).
    fn prepare_qadam(dev: &dyn Device, spec: QAdamSpec, n: usize) -> Result<Step> {
        let params = f32_bytes(pseudo_random(n, 10).into_iter().map(|v| v * PARAM_SCALE));
        let grads = f32_bytes(pseudo_random(n, 11).into_iter().map(|v| v * GRAD_SCALE));
        let mut state = Vec::new();
        for s in [spec.m1, spec.m2] {
            let (codes, absmax) = s.initial_state(n);
            state.push(codes);
            state.push(f32_bytes(absmax.into_iter()));
        }
        let mut step = Step {
            launch: Launch::QAdam(spec, QAdamScalars::new(&hyper(), 1)?),
            scalars: Vec::new(),
            params,
            grads,
            state,
        };
        for t in 1..=WARMUP_STEPS {
            step.launch = Launch::QAdam(spec, QAdamScalars::new(&hyper(), t)?);
            step.launch(dev)?;
        }
        step.launch = Launch::QAdam(spec, QAdamScalars::new(&hyper(), WARMUP_STEPS + 1)?);
        Ok(step)
    }

    /// One step on the preallocated buffers.
    fn launch(&mut self, dev: &dyn Device) -> Result<()> {
        let kernel = match &self.launch {
            Launch::Kernel(k) => k,
            Launch::Adam8(spec) => {
                let [s1, a1, s2, a2] = &mut self.state[..] else {
                    return Err(crate::error::Error::Usage(
                        "bench: an 8-bit step needs four state buffers".into(),
                    ));
                };
                let bufs = Adam8Buffers {
                    params: &mut self.params,
                    grads: &self.grads,
                    state1: s1,
                    absmax1: a1,
                    state2: s2,
                    absmax2: a2,
                };
                launch_adam8(dev, *spec, &self.scalars, &[], bufs)?;
                return Ok(());
            }
            Launch::QAdam(spec, scalars) => {
                let [c1, a1, c2, a2] = &mut self.state[..] else {
                    return Err(crate::error::Error::Usage(
                        "bench: a quantized step needs four state buffers".into(),
                    ));
                };
                let bufs = QAdamBuffers {
                    params: &mut self.params,
                    grads: &self.grads,
                    m1_codes: c1,
                    m1_absmax: a1,
                    m2_codes: c2,
                    m2_absmax: a2,
                };
                launch_qadam(dev, *spec, scalars, QAdamRng::default(), bufs)?;
                return Ok(());
            }
        };
        let mut args: Vec<Arg> = self.scalars.iter().map(|s| Arg::Scalar(*s)).collect();
        args.push(Arg::Write(&mut self.params));
        args.push(Arg::Read(&self.grads));
        args.extend(self.state.iter_mut().map(|b| Arg::Write(b)));
        dev.launch(kernel, &mut args)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qforge_runtime::InterpreterDevice;

    fn floats(b: &[u8]) -> Vec<f32> {
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    #[test]
    fn bytes_per_parameter_by_hand() {
        let n = 16 << 20;
        assert_eq!(bytes_per_step(StateBits::Bits32, n), 256 << 20);
        // 64 MiB params + 64 MiB grads + 32 MiB codes + 2 * 64 Ki blocks * 4 bytes.
        assert_eq!(
            bytes_per_step(StateBits::Bits8, n),
            (160 << 20) + (512 << 10)
        );
        // A partial last block still has its two absmax.
        assert_eq!(bytes_per_step(StateBits::Bits8, 300), 300 * 10 + 2 * 8);
    }

    #[test]
    fn the_cases_have_the_issue_names_shapes_and_baselines() {
        let cases = optim_cases(CaseSize::Full);
        let names: Vec<&str> = cases.iter().map(|c| c.kernel.as_str()).collect();
        assert_eq!(
            names,
            [
                "adamw32",
                "adamw8bit",
                "adamw4bit_zip_sr",
                "adamw4bit_ze_eden"
            ]
        );
        for c in &cases {
            assert_eq!(c.shape, "params=16777216");
            assert_eq!(c.dtype, DType::F32);
            let b: Vec<&str> = c.baselines.iter().map(|b| b.name.as_str()).collect();
            assert_eq!(b, ["adamw32", "memcpy"]);
        }
        let small = optim_cases(CaseSize::Interpreter);
        assert_eq!(
            small[0].shape,
            "params=262144 (interpreter: scaled down from 16777216)"
        );
    }

    #[test]
    fn the_32bit_moments_after_the_warmup_match_the_closed_form() {
        // With a constant gradient g and zero start, after t steps m = (1 - b1^t) g and
        // v = (1 - b2^t) g^2 (f64 reference; f32 rounding of a few steps is far below 1e-4).
        let n = 300;
        let dev = InterpreterDevice;
        let mut s = Step::prepare(&dev, StateBits::Bits32, n).expect("prepares");
        s.launch(&dev).expect("one more step");
        let t = (WARMUP_STEPS + 1) as i32;
        let g = floats(&s.grads);
        let (m, v) = (floats(&s.state[0]), floats(&s.state[1]));
        let p0: Vec<f32> = pseudo_random(n, 10)
            .iter()
            .map(|x| x * PARAM_SCALE)
            .collect();
        let p = floats(&s.params);
        for i in 0..n {
            let gi = f64::from(g[i]);
            let want_m = (1.0 - 0.9f64.powi(t)) * gi;
            let want_v = (1.0 - 0.999f64.powi(t)) * gi * gi;
            assert!(
                (f64::from(m[i]) - want_m).abs() <= 1e-4 * want_m.abs(),
                "m[{i}]"
            );
            assert!((f64::from(v[i]) - want_v).abs() <= 1e-4 * want_v, "v[{i}]");
            // Each step moves p against g by about lr (Adam's normalised step).
            let moved = f64::from(p[i]) - f64::from(p0[i]);
            assert!(
                gi == 0.0 || moved * gi < 0.0,
                "p[{i}] moved against its gradient"
            );
        }
    }

    #[test]
    fn the_8bit_step_fills_the_state_and_moves_the_parameters() {
        let n = 300;
        let dev = InterpreterDevice;
        let mut s = Step::prepare(&dev, StateBits::Bits8, n).expect("prepares");
        s.launch(&dev).expect("one more step");
        let t = (WARMUP_STEPS + 1) as i32;
        let g = floats(&s.grads);
        let absmax1 = floats(&s.state[1]);
        // Block 0's absmax of m is about (1 - b1^t) max |g| (the 8-bit state adds a few percent
        // of quantization error per step).
        let gmax = g[..256].iter().fold(0.0f32, |a, x| a.max(x.abs()));
        let want = (1.0 - 0.9f32.powi(t)) * gmax;
        assert!(
            (absmax1[0] - want).abs() <= 0.05 * want,
            "{absmax1:?} vs {want}"
        );
        assert_eq!(absmax1.len(), 2);
        let p0: Vec<f32> = pseudo_random(n, 10)
            .iter()
            .map(|x| x * PARAM_SCALE)
            .collect();
        let p = floats(&s.params);
        let moved = p.iter().zip(&p0).filter(|(a, b)| a != b).count();
        assert!(moved > n * 9 / 10, "only {moved} of {n} parameters changed");
    }

    #[test]
    fn the_4bit_bytes_and_step_by_hand() {
        let n = 16 << 20;
        // 64 MiB params + 64 MiB grads + 2 * 8 MiB packed codes + 2 * 128 Ki blocks * 4 bytes.
        let want = (144 << 20) + (1 << 20);
        assert_eq!(bytes_per_step_of(StepKind::zip_sr(), n), want);
        assert_eq!(bytes_per_step_of(StepKind::ze_eden(), n), want);
        // One more step after the warm-up: the 4-bit scales are about max |m| of each block,
        // m1 ~ (1 - b1^t) g, and the parameters move against the gradient.
        let n = 512;
        let dev = InterpreterDevice;
        let mut s = Step::prepare_qadam(
            &dev,
            QAdamSpec::new(MomentScheme::Nf4, MomentScheme::Dyn4Sr, DType::F32),
            n,
        )
        .expect("prepares");
        s.launch(&dev).expect("one more step");
        let t = (WARMUP_STEPS + 1) as i32;
        let g = floats(&s.grads);
        let absmax1 = floats(&s.state[1]);
        assert_eq!(absmax1.len(), 4);
        let gmax = g[..128].iter().fold(0.0f32, |a, x| a.max(x.abs()));
        let want = (1.0 - 0.9f32.powi(t)) * gmax;
        assert!(
            (absmax1[0] - want).abs() <= 0.2 * want,
            "{absmax1:?} vs {want}"
        );
        let p0: Vec<f32> = pseudo_random(n, 10)
            .iter()
            .map(|x| x * PARAM_SCALE)
            .collect();
        let p = floats(&s.params);
        let moved = p.iter().zip(&p0).filter(|(a, b)| a != b).count();
        assert!(moved > n * 9 / 10, "only {moved} of {n} parameters changed");
    }

    #[test]
    fn a_case_and_its_baselines_run_again_and_again() {
        for mut c in optim_cases(CaseSize::Elements(300)) {
            (c.run)(&InterpreterDevice).expect("warm-up call");
            (c.run)(&InterpreterDevice).expect("timed call");
            for b in &mut c.baselines {
                (b.run)(&InterpreterDevice).expect("baseline warm-up");
                (b.run)(&InterpreterDevice).expect("baseline timed call");
            }
        }
    }
}
