//! Tests of the activation kernels on the reference interpreter: every variant builds and
//! verifies; `f32` results against the `f64` formulas; the `beta` endpoints; ReLU's derivative
//! at 0 and NaN; `f16`/`bf16` storage equal to the `f32` kernel's result rounded once. The
//! cross-backend checks and the finite-difference check of the backward are in `tests/math.rs`.

use crate::activation::{Act, ActDirection, ActSpec, ACT_BLOCKSIZE};
use crate::normal::erfc;
use qforge_ir::OwnedArg;
use qforge_ir::{DType, Scalar};

fn bytes(dtype: DType, v: &[f32]) -> Vec<u8> {
    crate::catalog::float_bytes(dtype, v)
}

fn floats(dtype: DType, b: &[u8]) -> Vec<f32> {
    match dtype {
        DType::F16 => b
            .chunks(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        DType::BF16 => b
            .chunks(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        _ => b
            .chunks(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    }
}

/// Runs `spec` with `beta` on `z` (and `dy` for the backward) with the interpreter.
fn run(spec: ActSpec, beta: f32, z: &[f32], dy: &[f32]) -> Vec<f32> {
    let k = spec.build().unwrap().into_kernel();
    qforge_ir::verify(&k).unwrap();
    let n = z.len();
    let mut args = vec![
        OwnedArg::Scalar(Scalar::U32(n as u32)),
        OwnedArg::Scalar(Scalar::U32(n.div_ceil(ACT_BLOCKSIZE as usize) as u32)),
        OwnedArg::Scalar(Scalar::f32(beta)),
        OwnedArg::Read(bytes(spec.dtype, z)),
    ];
    if spec.direction == ActDirection::Backward {
        args.push(OwnedArg::Read(bytes(spec.dtype, dy)));
    }
    args.push(OwnedArg::Write(vec![0; n * spec.dtype.size_bytes()]));
    qforge_ir::interp::run(&k, &mut OwnedArg::borrow_all(&mut args)).unwrap();
    match args.last() {
        Some(OwnedArg::Write(o)) => floats(spec.dtype, o),
        _ => unreachable!(),
    }
}

fn erf64(x: f64) -> f64 {
    (1.0 - erfc(x.abs())).copysign(x)
}

/// `act(z)` and `act'(z)` in `f64`.
fn host(act: Act, z: f64) -> (f64, f64) {
    let pdf = (-0.5 * z * z).exp() / (2.0 * std::f64::consts::PI).sqrt();
    match act {
        Act::Gelu => {
            let cdf = 0.5 * (1.0 + erf64(z / 2f64.sqrt()));
            (z * cdf, cdf + z * pdf)
        }
        Act::GeluTanh => {
            let s = (2.0 / std::f64::consts::PI).sqrt();
            let t = (s * (z + 0.044715 * z * z * z)).tanh();
            let d = 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * s * (1.0 + 3.0 * 0.044715 * z * z);
            (0.5 * z * (1.0 + t), d)
        }
        Act::Relu => (z.max(0.0), if z <= 0.0 { 0.0 } else { 1.0 }),
        Act::Silu => {
            let s = 1.0 / (1.0 + (-z).exp());
            (z * s, s * (1.0 + z * (1.0 - s)))
        }
    }
}

fn inputs() -> Vec<f32> {
    let mut z: Vec<f32> = (0..1500).map(|i| -12.0 + i as f32 * 0.016).collect();
    z.extend([0.0, -0.0, 1e-30, -1e-30, 30.0, -30.0, 100.0, -100.0]);
    z
}

#[test]
fn activation_every_variant_builds_equals_the_builder_version_and_bad_dtypes_are_named() {
    let all = ActSpec::all();
    assert_eq!(all.len(), 24);
    let mut names = std::collections::HashSet::new();
    for spec in &all {
        let k = spec.build().unwrap().into_kernel();
        qforge_ir::verify(&k).unwrap_or_else(|e| panic!("{}: {e}", k.name));
        assert!(names.insert(k.name.clone()));
        // The macro-built kernel is the builder-built one (same IR, so the same snapshots).
        let old = crate::activation::reference::build(spec).unwrap();
        assert!(k == old, "{} differs from the builder version", k.name);
    }
    assert!(names.contains("act_beta_gelu_tanh_backward_bf16"));
    let bad = ActSpec {
        act: Act::Relu,
        dtype: DType::I8,
        direction: ActDirection::Forward,
    };
    let e = bad.build().unwrap_err().to_string();
    assert!(e.contains("i8") && e.contains("bf16"), "{e}");
    assert_eq!(Act::from_name("gelu_tanh"), Some(Act::GeluTanh));
}

#[test]
fn activation_f32_matches_the_f64_formulas() {
    let z = inputs();
    let dy: Vec<f32> = (0..z.len()).map(|i| 0.5 + (i % 7) as f32 * 0.25).collect();
    for act in Act::ALL {
        for beta in [0.0f32, 0.3, 1.0] {
            let spec = |direction| ActSpec {
                act,
                dtype: DType::F32,
                direction,
            };
            let y = run(spec(ActDirection::Forward), beta, &z, &dy);
            let dz = run(spec(ActDirection::Backward), beta, &z, &dy);
            let b = beta as f64;
            for i in 0..z.len() {
                let zi = z[i] as f64;
                let (a, d) = host(act, zi);
                let want_y = b * a + (1.0 - b) * zi;
                let want_dz = dy[i] as f64 * (b * d + (1.0 - b));
                let tol = |w: f64| 2e-6 * w.abs().max(1.0);
                assert!(
                    (y[i] as f64 - want_y).abs() <= tol(want_y),
                    "{} beta {beta} forward z={}: {} want {want_y}",
                    act.name(),
                    z[i],
                    y[i]
                );
                assert!(
                    (dz[i] as f64 - want_dz).abs() <= tol(want_dz),
                    "{} beta {beta} backward z={}: {} want {want_dz}",
                    act.name(),
                    z[i],
                    dz[i]
                );
            }
            if beta == 0.0 {
                // The linear end: y = z and dz = dy exactly.
                for i in 0..z.len() {
                    assert_eq!(y[i], z[i], "{} z={}", act.name(), z[i]);
                    assert_eq!(dz[i], dy[i]);
                }
            }
        }
    }
}

#[test]
fn activation_relu_derivative_at_zero_and_nan() {
    let spec = ActSpec {
        act: Act::Relu,
        dtype: DType::F32,
        direction: ActDirection::Backward,
    };
    let z = [0.0f32, -0.0, f32::NAN, 1e-45, -1e-45, f32::INFINITY];
    let dy = [3.0f32; 6];
    let dz = run(spec, 1.0, &z, &dy);
    assert_eq!(dz, [0.0, 0.0, 3.0, 3.0, 0.0, 3.0]);
    let fwd = ActSpec {
        direction: ActDirection::Forward,
        ..spec
    };
    let y = run(fwd, 1.0, &[0.0, -2.0, 2.5, f32::INFINITY], &[]);
    assert_eq!(y[..3], [0.0, 0.0, 2.5]);
    // (1 - beta) * z = 0 * inf: NaN, as the formula in IEEE arithmetic (documented).
    assert!(y[3].is_nan());
    let y = run(fwd, 0.5, &[f32::INFINITY, f32::NEG_INFINITY], &[]);
    assert_eq!(y, [f32::INFINITY, f32::NEG_INFINITY]);
}

#[test]
fn activation_narrow_storage_is_the_f32_result_rounded_once() {
    // Inputs exactly representable in f16 and bf16: the kernels compute the same f32 value.
    let z: Vec<f32> = (0..256).map(|i| -8.0 + i as f32 * 0.0625).collect();
    let dy: Vec<f32> = (0..256).map(|i| 1.0 - (i % 5) as f32 * 0.25).collect();
    for act in Act::ALL {
        for direction in [ActDirection::Forward, ActDirection::Backward] {
            let f = run(
                ActSpec {
                    act,
                    dtype: DType::F32,
                    direction,
                },
                0.75,
                &z,
                &dy,
            );
            for dtype in [DType::F16, DType::BF16] {
                let got = run(
                    ActSpec {
                        act,
                        dtype,
                        direction,
                    },
                    0.75,
                    &z,
                    &dy,
                );
                let want = floats(dtype, &bytes(dtype, &f));
                for i in 0..z.len() {
                    assert_eq!(
                        got[i].to_bits(),
                        want[i].to_bits(),
                        "{} {} {dtype} z={}",
                        act.name(),
                        direction.name(),
                        z[i]
                    );
                }
            }
        }
    }
}
