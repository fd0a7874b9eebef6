//! Tests of the `exp`, `erf`, `tanh` and `sigmoid` routines on the reference interpreter: special
//! values, symmetry, tiny and subnormal inputs, and the error against independent `f64`
//! references (Rust's `f64::exp`/`tanh`, and an `f64` `erf` from its Taylor series and the
//! library's `f64` `erfc`) on a stride through all bit patterns. The cross-backend checks and
//! the full sweeps are in `tests/math.rs`.

use crate::normal::erfc;
use qforge_ir::routines::math::{MathFn, MATH_BLOCKSIZE};
use qforge_ir::OwnedArg;
use qforge_ir::Scalar;

/// Runs `f` on every input with the interpreter.
fn run(f: MathFn, xs: &[f32]) -> Vec<f32> {
    let k = f.kernel();
    qforge_ir::verify(&k).unwrap();
    let n = xs.len();
    let mut args = vec![
        OwnedArg::Scalar(Scalar::U32(n as u32)),
        OwnedArg::Scalar(Scalar::U32(n.div_ceil(MATH_BLOCKSIZE as usize) as u32)),
        OwnedArg::Read(xs.iter().flat_map(|v| v.to_le_bytes()).collect()),
        OwnedArg::Write(vec![0; 4 * n]),
    ];
    qforge_ir::interp::run(&k, &mut OwnedArg::borrow_all(&mut args)).unwrap();
    match &args[3] {
        OwnedArg::Write(o) => o
            .chunks(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        _ => unreachable!(),
    }
}

/// `erf` in `f64`: the Taylor series below 1, `1 - erfc` above.
fn erf_f64(x: f64) -> f64 {
    let a = x.abs();
    let r = if a < 1.0 {
        let t = a * a;
        let (mut term, mut sum, mut k) = (a, a, 0.0f64);
        while term.abs() > 1e-22 * sum {
            k += 1.0;
            term *= -t / k;
            sum += term / (2.0 * k + 1.0);
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        1.0 - erfc(a)
    };
    r.copysign(x)
}

/// The exact value of `f` at `x`, in `f64`.
fn reference(f: MathFn, x: f32) -> f64 {
    let x = x as f64;
    match f {
        MathFn::Exp => x.exp(),
        MathFn::Erf => erf_f64(x),
        MathFn::Tanh => x.tanh(),
        MathFn::Sigmoid => 1.0 / (1.0 + (-x).exp()),
    }
}

/// `|got - want|` in units of the `f32` spacing at `want` (`2^-149` below `2^-126`); 0 when both
/// are the same infinity or `want` rounds to the infinity `got` is; infinite for a NaN or
/// infinity that should not be there.
fn ulp_error(got: f32, want: f64) -> f64 {
    if want.is_nan() || got.is_nan() {
        return if want.is_nan() && got.is_nan() {
            0.0
        } else {
            f64::INFINITY
        };
    }
    if got.is_infinite() || want.is_infinite() {
        return if got as f64 == want || (want as f32) == got {
            0.0
        } else {
            f64::INFINITY
        };
    }
    let e = (want.abs().log2().floor() as i32).max(-126);
    let ulp = (2.0f64).powi(e - 23);
    (got as f64 - want).abs() / ulp
}

#[test]
fn math_special_values() {
    let (inf, nan) = (f32::INFINITY, f32::NAN);
    let cases: [(MathFn, &[(f32, f32)]); 4] = [
        (
            MathFn::Exp,
            &[
                (0.0, 1.0),
                (-0.0, 1.0),
                (inf, inf),
                (-inf, 0.0),
                (89.0, inf),
                (88.8, inf),
                (1e30, inf),
                (-104.0, 0.0),
                (-1e30, 0.0),
                (1.0, std::f32::consts::E),
            ],
        ),
        (
            MathFn::Erf,
            &[
                (0.0, 0.0),
                (-0.0, -0.0),
                (inf, 1.0),
                (-inf, -1.0),
                (4.0, 1.0),
                (-10.0, -1.0),
            ],
        ),
        (
            MathFn::Tanh,
            &[
                (0.0, 0.0),
                (-0.0, -0.0),
                (inf, 1.0),
                (-inf, -1.0),
                (9.1, 1.0),
                (-50.0, -1.0),
            ],
        ),
        (
            MathFn::Sigmoid,
            &[
                (0.0, 0.5),
                (-0.0, 0.5),
                (inf, 1.0),
                (-inf, 0.0),
                (17.0, 0.999_999_94),
                (17.4, 1.0),
                (-104.0, 0.0),
            ],
        ),
    ];
    for (f, pairs) in cases {
        let xs: Vec<f32> = pairs.iter().map(|p| p.0).chain([nan, -nan]).collect();
        let got = run(f, &xs);
        for ((x, want), g) in pairs.iter().zip(&got) {
            assert_eq!(
                g.to_bits(),
                want.to_bits(),
                "{}({x}) = {g}, want {want}",
                f.name()
            );
        }
        assert!(got[got.len() - 1].is_nan() && got[got.len() - 2].is_nan());
    }
}

#[test]
fn math_odd_functions_are_odd_and_exact_for_tiny_inputs() {
    let mut xs: Vec<f32> = (0..4000u32)
        .map(|i| f32::from_bits(i.wrapping_mul(1_073_741)))
        .filter(|x| x.is_finite())
        .map(f32::abs)
        .collect();
    xs.extend([
        f32::from_bits(1),
        f32::MIN_POSITIVE,
        1e-20,
        2e-4,
        0.999_999_94,
        1.0,
        4.0,
    ]);
    let neg: Vec<f32> = xs.iter().map(|x| -x).collect();
    for f in [MathFn::Erf, MathFn::Tanh] {
        let (p, m) = (run(f, &xs), run(f, &neg));
        for ((x, a), b) in xs.iter().zip(&p).zip(&m) {
            assert_eq!((-a).to_bits(), b.to_bits(), "{}(-{x})", f.name());
        }
    }
    // Tiny and subnormal inputs: tanh returns x, erf the correctly rounded 2/sqrt(pi) x.
    let tiny: Vec<f32> = (1..2000u32)
        .map(|i| f32::from_bits(i * 523_249))
        .filter(|x| *x < 2.5e-4)
        .collect();
    assert!(tiny.len() > 1000);
    let t = run(MathFn::Tanh, &tiny);
    let e = run(MathFn::Erf, &tiny);
    // erf's linear term: x * (1 + s0) with s0 = ERF_SMALL[0], exact in f64, rounded once.
    let one_plus_s0 = 1.0 + f32::from_bits(qforge_ir::routines::math::ERF_SMALL[0]) as f64;
    for ((x, tv), ev) in tiny.iter().zip(&t).zip(&e) {
        if *x < 1.0 / 4096.0 {
            assert_eq!(tv.to_bits(), x.to_bits(), "tanh({x:e})");
        }
        if *x < 1e-12 {
            let lin = (*x as f64 * one_plus_s0) as f32;
            assert_eq!(ev.to_bits(), lin.to_bits(), "erf({x:e}) = {ev:e}");
        }
    }
}

#[test]
fn math_error_against_f64_on_a_stride_of_all_inputs() {
    // Every 65537th bit pattern (both signs, all exponents) plus the region boundaries.
    let mut xs: Vec<f32> = (0..=u32::MAX)
        .step_by(65_537)
        .map(f32::from_bits)
        .filter(|x| x.is_finite())
        .collect();
    for edge in [1.0f32, 4.0, 88.72, 89.0, -87.3, -103.97, 0.3466, 16.6] {
        for d in 0..64u32 {
            for s in [1.0f32, -1.0] {
                xs.push(s * f32::from_bits(edge.to_bits() + d - 32));
            }
        }
    }
    for f in MathFn::ALL {
        let got = run(f, &xs);
        let (mut worst, mut at) = (0.0f64, 0.0f32);
        for (x, g) in xs.iter().zip(&got) {
            let e = ulp_error(*g, reference(f, *x));
            if e > worst {
                (worst, at) = (e, *x);
            }
        }
        println!("{}: max {worst:.3} ulp at {at:e}", f.name());
        assert!(
            worst <= f.max_ulp(),
            "{}: {worst:.3} ulp at x = {at:e} ({:#010x})",
            f.name(),
            at.to_bits()
        );
    }
}
