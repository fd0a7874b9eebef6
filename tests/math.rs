//! The `exp`, `erf`, `tanh` and `sigmoid` IR routines (`qforge::ir::routines::math`) and the
//! activation kernels (`qforge::kernels::activation`) across devices and against `f64`:
//! * bit-exact: the reference interpreter against the CPU device (Cranelift; SIMD on and off,
//!   native and baseline instruction set) and every device of `available_devices()` (WGSL on
//!   lavapipe with `--features wgpu`, PTX with `--features cuda` and a GPU), on edge values
//!   (±0, ±inf, NaN, ±88, ±89, the overflow and underflow thresholds, subnormals, the region
//!   boundaries of each routine) and proptest vectors;
//! * accuracy: the documented ulp bound ([`MathFn::max_ulp`]) on every 997th bit pattern plus
//!   the edges on the CPU device, against Rust's `f64` `exp`/`tanh` and `libm::erf`;
//!   `cargo test --release --test math -- --ignored --nocapture` runs all 2^32 inputs and prints
//!   the table of `docs/math.md`;
//! * the activation backward against central finite differences of the `f64` forward formula.

use proptest::prelude::*;
use qforge::devices::cpu_variants_and_available_devices;
use qforge::ir::dsl::{FloatIn, FloatOut};
use qforge::ir::routines::math::{MathFn, MATH_BLOCKSIZE};
use qforge::ir::{Arg, Kernel, Scalar};
use qforge::kernels::activation::ActBetaArgs;
use qforge::kernels::{Act, ActDirection, ActSpec, ACT_BLOCKSIZE};
use qforge::runtime::{launch_typed, CpuDevice, Device, InterpreterDevice};
use std::sync::OnceLock;
use std::time::Instant;

/// The CPU device in its four configurations, then every available device: made once per
/// process, so each device compiles a kernel once for all the cases.
fn devices() -> &'static [Box<dyn Device>] {
    static DEVICES: OnceLock<Vec<Box<dyn Device>>> = OnceLock::new();
    DEVICES.get_or_init(cpu_variants_and_available_devices)
}

/// `run` on the interpreter and on every device of [`devices`] side by side: the
/// interpreter's result, then each device's (in [`devices`]' order). `what` names the check in
/// the time each device took, which is printed.
fn on_interpreter_and_devices<T: Send>(
    what: &str,
    run: impl Fn(&dyn Device) -> T + Sync,
) -> (T, Vec<T>) {
    let mut all: Vec<&dyn Device> = vec![&InterpreterDevice];
    all.extend(devices().iter().map(|d| d.as_ref()));
    let timed = qforge_testkit::on_each(&all, |dev| {
        let start = Instant::now();
        let out = run(*dev);
        (out, start.elapsed().as_secs_f64())
    });
    let times: Vec<String> = all
        .iter()
        .zip(&timed)
        .map(|(d, (_, t))| format!("{} {t:.2} s", d.name()))
        .collect();
    println!("{what}: {}", times.join(", "));
    let mut outs = timed.into_iter().map(|(out, _)| out);
    let want = outs.next().expect("the interpreter ran");
    (want, outs.collect())
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn bytes_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|w| f32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        .collect()
}

fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// `y = f(x)` with the kernel of [`MathFn::kernel`] on `dev`.
fn run_math(dev: &dyn Device, kernel: &Kernel, xs: &[f32]) -> Vec<f32> {
    let input = f32_bytes(xs);
    let mut out = vec![0u8; input.len()];
    let n = xs.len();
    dev.launch(
        kernel,
        &mut [
            Arg::Scalar(Scalar::U32(n as u32)),
            Arg::Scalar(Scalar::U32(n.div_ceil(MATH_BLOCKSIZE as usize) as u32)),
            Arg::Read(&input),
            Arg::Write(&mut out),
        ],
    )
    .unwrap_or_else(|e| panic!("{} on {}: {e}", kernel.name, dev.name()));
    bytes_f32(&out)
}

/// Edge inputs: specials, the thresholds of `exp` and `sigmoid`, every region boundary of the
/// routines with their neighbours, and subnormals; both signs.
fn edges() -> Vec<f32> {
    let mut v = vec![
        0.0f32,
        f32::INFINITY,
        f32::NAN,
        f32::from_bits(1),
        f32::from_bits(0x007F_FFFF),
        f32::MIN_POSITIVE,
        f32::MAX,
        1e-30,
        88.0,
        89.0,
        88.72284,
        88.72283,
        103.97208,
        104.0,
        87.33655,
        16.635532,
        17.32868,
        9.010913,
        44.5,
        0.346_573_6,
        std::f32::consts::LN_2,
    ];
    for base in [1.0f32, 4.0, 2.5, 3.92, 0.5, 88.72284, 103.97, 87.3365] {
        for d in 0..16u32 {
            v.push(f32::from_bits(base.to_bits() + d - 8));
        }
    }
    let neg: Vec<f32> = v.iter().map(|x| -x).collect();
    v.extend(neg);
    v
}

/// An `f32` from the edge list, ordinary data or any bit pattern.
fn value() -> impl Strategy<Value = f32> {
    prop_oneof![
        3 => -12.0f32..12.0,
        2 => prop::sample::select(edges()),
        1 => -110.0f32..110.0,
        2 => any::<u32>().prop_map(f32::from_bits),
    ]
}

#[test]
fn math_routines_are_bit_exact_on_every_device() {
    let mut xs = edges();
    let n_edges = xs.len();
    xs.extend(
        (0..=u32::MAX)
            .step_by(65_537)
            .map(f32::from_bits)
            .collect::<Vec<_>>(),
    );
    // The StableHLO reference interpreter costs about 1 us per element and op (20 to 50 s per
    // routine for the whole sweep, 2 cores): it gets the edges and every 16th sweep value.
    let thinned: Vec<usize> = (0..xs.len())
        .filter(|i| *i < n_edges || (i - n_edges).is_multiple_of(16))
        .collect();
    let inputs = |dev: &dyn Device| -> Vec<usize> {
        if dev.backend() == "stablehlo" {
            thinned.clone()
        } else {
            (0..xs.len()).collect()
        }
    };
    for f in MathFn::ALL {
        let k = f.kernel();
        let (want, gots) = on_interpreter_and_devices(f.name(), |dev| {
            let at = inputs(dev);
            let x: Vec<f32> = at.iter().map(|i| xs[*i]).collect();
            (at, run_math(dev, &k, &x))
        });
        for (dev, (at, got)) in devices().iter().zip(&gots) {
            let bad: Vec<String> = at
                .iter()
                .zip(got)
                .map(|(i, g)| (xs[*i], *g, want.1[*i]))
                .filter(|(_, g, w)| !same(*g, *w))
                .take(5)
                .map(|(x, g, w)| format!("{x:e}: {g:e} != {w:e}"))
                .collect();
            assert!(bad.is_empty(), "{} on {}: {bad:?}", f.name(), dev.name());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]
    #[test]
    fn math_proptest_interpreter_equals_every_device(
        xs in prop::collection::vec(value(), 1..2100)
    ) {
        for f in MathFn::ALL {
            let k = f.kernel();
            let (want, gots) = on_interpreter_and_devices(f.name(), |dev| run_math(dev, &k, &xs));
            for (dev, got) in devices().iter().zip(&gots) {
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    prop_assert!(same(*g, *w), "{} on {}: f({:e}) = {:e}, interpreter {:e}",
                        f.name(), dev.name(), xs[i], g, w);
                }
            }
        }
    }
}

/// The exact value of `f` at `x`, in `f64`.
fn reference(f: MathFn, x: f32) -> f64 {
    let x = x as f64;
    match f {
        MathFn::Exp => x.exp(),
        MathFn::Erf => libm::erf(x),
        MathFn::Tanh => x.tanh(),
        MathFn::Sigmoid => 1.0 / (1.0 + (-x).exp()),
    }
}

/// `|got - want|` in units of the `f32` spacing at `want` (`2^-149` for subnormal `want`); 0 when
/// both are NaN, or `got` is the infinity `want` rounds to; infinite for a wrong NaN/infinity.
fn ulp_error(got: f32, want: f64) -> f64 {
    if want.is_nan() || got.is_nan() {
        return if want.is_nan() && got.is_nan() {
            0.0
        } else {
            f64::INFINITY
        };
    }
    if got.is_infinite() || want.is_infinite() {
        return if (want as f32) == got {
            0.0
        } else {
            f64::INFINITY
        };
    }
    // The binary exponent of `want` from its bits (`want` is finite and, if zero, gives -1023).
    let e = (((want.to_bits() >> 52) & 0x7ff) as i32 - 1023).max(-126);
    (got as f64 - want).abs() / f64::from_bits(((e - 23 + 1023) as u64) << 52)
}

/// The largest error of `f` over `xs` (results `got`): `(ulp, at)`, and the largest over the
/// inputs whose exact result is subnormal.
#[derive(Clone, Copy, Debug, Default)]
struct Worst {
    ulp: f64,
    at: f32,
    subnormal_ulp: f64,
    above_one: u64,
}

impl Worst {
    fn add(&mut self, f: MathFn, xs: &[f32], got: &[f32]) {
        for (x, g) in xs.iter().zip(got) {
            let want = reference(f, *x);
            let e = ulp_error(*g, want);
            if want.abs() < f32::MIN_POSITIVE as f64 {
                self.subnormal_ulp = self.subnormal_ulp.max(e);
            }
            if e > 1.0 {
                self.above_one += 1;
            }
            if e > self.ulp {
                self.ulp = e;
                self.at = *x;
            }
        }
    }
    fn merge(&mut self, o: Worst) {
        if o.ulp > self.ulp {
            self.ulp = o.ulp;
            self.at = o.at;
        }
        self.subnormal_ulp = self.subnormal_ulp.max(o.subnormal_ulp);
        self.above_one += o.above_one;
    }
}

#[test]
fn math_error_bound_on_a_strided_sweep() {
    let cpu = CpuDevice::new().unwrap();
    let mut xs: Vec<f32> = (0..=u32::MAX).step_by(997).map(f32::from_bits).collect();
    xs.extend(edges());
    for f in MathFn::ALL {
        let got = run_math(&cpu, &f.kernel(), &xs);
        let mut w = Worst::default();
        w.add(f, &xs, &got);
        println!(
            "{}: {} inputs, max {:.3} ulp at {:e} ({:#010x}); subnormal results {:.3} ulp",
            f.name(),
            xs.len(),
            w.ulp,
            w.at,
            w.at.to_bits(),
            w.subnormal_ulp
        );
        assert!(
            w.ulp <= f.max_ulp(),
            "{}: {:.3} ulp at {:e} exceeds the documented {}",
            f.name(),
            w.ulp,
            w.at,
            f.max_ulp()
        );
        assert!(w.subnormal_ulp <= 1.0, "{}: subnormal results", f.name());
    }
}

/// All 2^32 inputs on the CPU device in chunks of 2^24, the references on two threads.
#[test]
#[ignore = "all 2^32 inputs: minutes per routine; run with --release --ignored --nocapture"]
fn math_exhaustive_error_of_every_f32_input() {
    let cpu = CpuDevice::new().unwrap();
    let filter = std::env::var("QFORGE_MATH_FN").ok();
    for f in MathFn::ALL {
        if filter.as_deref().is_some_and(|n| n != f.name()) {
            continue;
        }
        let k = f.kernel();
        let mut total = Worst::default();
        let chunk = 1u64 << 24;
        for c in 0..(1u64 << 32) / chunk {
            let xs: Vec<f32> = (c * chunk..(c + 1) * chunk)
                .map(|b| f32::from_bits(b as u32))
                .collect();
            let got = run_math(&cpu, &k, &xs);
            let half = xs.len() / 2;
            let (a, b) = std::thread::scope(|s| {
                let h = s.spawn(|| {
                    let mut w = Worst::default();
                    w.add(f, &xs[..half], &got[..half]);
                    w
                });
                let mut w = Worst::default();
                w.add(f, &xs[half..], &got[half..]);
                (h.join().unwrap(), w)
            });
            total.merge(a);
            total.merge(b);
        }
        println!(
            "| {} | {:.3} | {:e} ({:#010x}) | {} | {:.3} |",
            f.name(),
            total.ulp,
            total.at,
            total.at.to_bits(),
            total.above_one,
            total.subnormal_ulp
        );
        assert!(total.ulp <= f.max_ulp(), "{}", f.name());
    }
}

// ----- activation kernels -----

/// Runs an `f32` activation kernel with `beta` on `z` (and `dy` for the backward).
fn run_act(dev: &dyn Device, spec: ActSpec, beta: f32, z: &[f32], dy: &[f32]) -> Vec<f32> {
    let k = spec.build().unwrap();
    let n = z.len();
    let mut out = vec![0f32; n];
    let backward = spec.direction == ActDirection::Backward;
    let mut args = ActBetaArgs {
        n: n as u32,
        n_blocks: n.div_ceil(ACT_BLOCKSIZE as usize) as u32,
        beta,
        z: FloatIn::f32(z),
        dy: backward.then(|| FloatIn::f32(dy)),
        y: None,
        dz: None,
    };
    let name = &k.kernel().name;
    if backward {
        args.dz = Some(FloatOut::f32(&mut out));
    } else {
        args.y = Some(FloatOut::f32(&mut out));
    }
    launch_typed(dev, &k, &mut args).unwrap_or_else(|e| panic!("{name} on {}: {e}", dev.name()));
    out
}

fn spec(act: Act, direction: ActDirection) -> ActSpec {
    ActSpec {
        act,
        dtype: qforge::ir::DType::F32,
        direction,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, ..ProptestConfig::default() })]
    #[test]
    fn activation_proptest_interpreter_equals_every_device(
        z in prop::collection::vec(value(), 1..1100),
        beta in prop::sample::select(vec![0.0f32, 1.0, 0.5, 0.123, -0.0, 1.5]),
    ) {
        let dy: Vec<f32> = z.iter().rev().copied().collect();
        for act in Act::ALL {
            for direction in [ActDirection::Forward, ActDirection::Backward] {
                let s = spec(act, direction);
                let (want, gots) =
                    on_interpreter_and_devices(&s.name(), |dev| run_act(dev, s, beta, &z, &dy));
                for (dev, got) in devices().iter().zip(&gots) {
                    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                        prop_assert!(same(*g, *w), "{} on {}: z = {:e}: {:e} != {:e}",
                            s.name(), dev.name(), z[i], g, w);
                    }
                }
            }
        }
    }
}

/// `act_beta(z)` in `f64` (the formulas of the module documentation, with `libm::erf`).
fn act_beta_f64(act: Act, beta: f64, z: f64) -> f64 {
    let a = match act {
        Act::Gelu => 0.5 * z * (1.0 + libm::erf(z / 2f64.sqrt())),
        Act::GeluTanh => {
            let s = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * z * (1.0 + (s * (z + 0.044715 * z * z * z)).tanh())
        }
        Act::Relu => z.max(0.0),
        Act::Silu => z / (1.0 + (-z).exp()),
    };
    beta * a + (1.0 - beta) * z
}

#[test]
fn activation_backward_matches_finite_differences_of_the_f64_forward() {
    let cpu = CpuDevice::new().unwrap();
    // Grid points avoid z = 0, where ReLU has no derivative.
    let z: Vec<f32> = (0..2400)
        .map(|i| -9.0 + (i as f32 + 0.5) * 0.0075)
        .collect();
    let ones = vec![1.0f32; z.len()];
    let h = 1e-6f64;
    for act in Act::ALL {
        for beta in [0.0f32, 0.25, 0.9, 1.0] {
            let dz = run_act(&cpu, spec(act, ActDirection::Backward), beta, &z, &ones);
            let y = run_act(&cpu, spec(act, ActDirection::Forward), beta, &z, &ones);
            let b = beta as f64;
            for i in 0..z.len() {
                let zi = z[i] as f64;
                let fd = (act_beta_f64(act, b, zi + h) - act_beta_f64(act, b, zi - h)) / (2.0 * h);
                let tol = 1e-6 * fd.abs().max(1.0);
                assert!(
                    (dz[i] as f64 - fd).abs() <= tol,
                    "{} beta {beta}: z = {}: dz = {} but the finite difference is {fd}",
                    act.name(),
                    z[i],
                    dz[i]
                );
                let want = act_beta_f64(act, b, zi);
                assert!(
                    (y[i] as f64 - want).abs() <= 1e-6 * want.abs().max(1.0),
                    "{} beta {beta}: z = {}: y = {} want {want}",
                    act.name(),
                    z[i],
                    y[i]
                );
            }
        }
    }
}
