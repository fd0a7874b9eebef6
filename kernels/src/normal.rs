//! The standard normal distribution in `f64`: `erfc`, the CDF and its inverse (the quantile
//! function `ppf`, scipy's `norm.ppf` / `ndtri`), accurate to a few `f64` ulps. Used on the host
//! only: to construct the NF4 table (`create_normal_map`) and to draw normal values
//! ([`scaled_ppf_f32`], the adapters' initial weights and the synthetic fine-tuning model);
//! kernels never call it.
//!
//! Method: `erfc(z)` from the all-positive series `erf(z) = 2/sqrt(pi) * exp(-z^2) * sum z (2z^2)^n
//! / (2n+1)!!` for `z < 2` and from the Laplace continued fraction for `z >= 2`; the quantile by
//! bisection on the lower tail (where `Phi` has full relative accuracy) followed by one Newton
//! step. The unit tests check it against reference values and round trips.

use std::f64::consts::{FRAC_1_SQRT_2, PI};

/// `erf(z)` by the positive-term series; accurate for `0 <= z < ~3`.
fn erf_series(z: f64) -> f64 {
    let two_z2 = 2.0 * z * z;
    let mut term = z;
    let mut sum = z;
    let mut n = 0.0_f64;
    while term > sum * 1e-18 {
        n += 1.0;
        term *= two_z2 / (2.0 * n + 1.0);
        sum += term;
        if n > 400.0 {
            break;
        }
    }
    2.0 / PI.sqrt() * (-z * z).exp() * sum
}

/// `erfc(z)` by the continued fraction `exp(-z^2)/sqrt(pi) / (z + (1/2)/(z + 1/(z + (3/2)/(z + ...))))`,
/// evaluated backward with a fixed depth; accurate for `z >= 2`.
fn erfc_cf(z: f64) -> f64 {
    let mut f = z;
    for k in (1..=160).rev() {
        f = z + (k as f64 * 0.5) / f;
    }
    (-z * z).exp() / (PI.sqrt() * f)
}

/// The complementary error function `1 - erf(z)`, with full relative accuracy in the upper tail.
pub fn erfc(z: f64) -> f64 {
    if z.is_nan() {
        f64::NAN
    } else if z < 0.0 {
        2.0 - erfc(-z)
    } else if z < 2.0 {
        1.0 - erf_series(z)
    } else {
        erfc_cf(z)
    }
}

/// The standard normal CDF `Phi(x) = erfc(-x / sqrt(2)) / 2`.
pub fn normal_cdf(x: f64) -> f64 {
    0.5 * erfc(-x * FRAC_1_SQRT_2)
}

/// The quantile of the lower tail: the `x <= 0` with `Phi(x) = p`, for `0 < p <= 0.5`.
fn lower_quantile(p: f64) -> f64 {
    // Phi(-40) is far below the smallest positive f64, so [-40, 0] brackets every p > 0.
    let (mut lo, mut hi) = (-40.0_f64, 0.0_f64);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if mid <= lo || mid >= hi {
            break;
        }
        if normal_cdf(mid) < p {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let x = 0.5 * (lo + hi);
    // One Newton step on Phi(x) - p, kept inside the bracket.
    let pdf = (-0.5 * x * x).exp() / (2.0 * PI).sqrt();
    if pdf > 0.0 {
        let step = x - (normal_cdf(x) - p) / pdf;
        if step >= lo && step <= hi {
            return step;
        }
    }
    x
}

/// The standard normal quantile `Phi^-1(q)` (scipy `norm.ppf`): `-inf` at 0, `+inf` at 1, NaN
/// outside `[0, 1]`. The upper half uses `Phi^-1(q) = -Phi^-1(1 - q)`, where `1 - q` is exact.
pub fn normal_ppf(q: f64) -> f64 {
    if q.is_nan() || !(0.0..=1.0).contains(&q) {
        f64::NAN
    } else if q == 0.0 {
        f64::NEG_INFINITY
    } else if q == 1.0 {
        f64::INFINITY
    } else if q == 0.5 {
        0.0
    } else if q < 0.5 {
        lower_quantile(q)
    } else {
        -lower_quantile(1.0 - q)
    }
}

/// How far [`scaled_ppf_f32`] trusts Newton's root `x`: within `x * MARGIN_REL + MARGIN_ABS` of
/// the bisection's. Over every input of [`crate::adapter::normal_f32`] they differ by at most
/// `2^-44 * |x| + 2^-50` (`normal_f32_newton_matches_the_bisection_on_every_input`; the absolute
/// term near `x = 0`, where `Phi` resolves `x` only to about `2^-53 / pdf(0)`): 16 times less.
const MARGIN_REL: f64 = 1.0 / (1u64 << 40) as f64;
/// See [`MARGIN_REL`].
const MARGIN_ABS: f64 = 1.0 / (1u64 << 46) as f64;

/// Newton's method on `Phi(x) = p` for `0 < p < 0.5` with the CDF [`normal_cdf`] that
/// [`lower_quantile`] bisects, from Abramowitz and Stegun's 26.2.23 (absolute error below
/// `4.5e-4`); `None` when six steps do not settle (a step below `2^-46 |x| + 2^-52`).
fn lower_quantile_newton(p: f64) -> Option<f64> {
    let t = (-2.0 * p.ln()).sqrt();
    let num = 2.515517 + t * (0.802853 + t * 0.010328);
    let den = 1.0 + t * (1.432788 + t * (0.189269 + t * 0.001308));
    let mut x = num / den - t;
    let scale = 1.0 / (2.0 * PI).sqrt();
    for _ in 0..6 {
        let pdf = (-0.5 * x * x).exp() * scale;
        if pdf <= 0.0 {
            return None;
        }
        let step = (normal_cdf(x) - p) / pdf;
        x -= step;
        if step.abs() <= x.abs() * (1.0 / (1u64 << 46) as f64) + 1.0 / (1u64 << 52) as f64 {
            return Some(x);
        }
    }
    None
}

/// `(std * normal_ppf(q)) as f32` (the product in `f64`, then rounded to nearest `f32`), bit for
/// bit for every `q` that [`crate::adapter::normal_f32`] passes (all 2^24 are checked, for any
/// `std`: the check bounds the quantile, not the product), about ten times faster: the
/// quantile by Newton's method on the same CDF
/// (a few `erfc` calls where the bisection of [`normal_ppf`] makes about 60), which lands within
/// a few ulps of the bisection's root; where `std * x` lies within the margin ([`MARGIN_REL`])
/// of a rounding boundary of `f32` (about one value in 65 000), or Newton does not settle,
/// [`normal_ppf`] decides. Other `q` (0, 1, 0.5, outside `[0, 1]`, NaN) go to [`normal_ppf`].
pub(crate) fn scaled_ppf_f32(q: f64, std: f64) -> f32 {
    let slow = || (std * normal_ppf(q)) as f32;
    let fast = if q > 0.0 && q < 0.5 {
        lower_quantile_newton(q)
    } else if q > 0.5 && q < 1.0 {
        lower_quantile_newton(1.0 - q).map(|x| -x)
    } else {
        None
    };
    let Some(x) = fast else {
        return slow();
    };
    // Every x' within the margin of x rounds std * x' to the same f32: so does the bisection's.
    let e = x.abs() * MARGIN_REL + MARGIN_ABS;
    let (a, b) = ((std * (x - e)) as f32, (std * (x + e)) as f32);
    if a.to_bits() == b.to_bits() && a.is_finite() {
        a
    } else {
        slow()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::excessive_precision)] // reference values as published
    use super::*;

    fn rel(a: f64, b: f64) -> f64 {
        ((a - b) / b).abs()
    }

    #[test]
    fn library_erfc_matches_reference_values() {
        // Reference values (A&S tables / high-precision evaluations).
        let cases = [
            (0.5, 0.4795001221869535),
            (1.0, 0.15729920705028513),
            (1.5, 0.033894853524689274),
            (2.0, 0.004677734981047266),
            (3.0, 2.209049699858544e-05),
            (5.0, 1.5374597944280349e-12),
        ];
        for (z, want) in cases {
            assert!(
                rel(erfc(z), want) < 1e-14,
                "erfc({z}) = {} want {want}",
                erfc(z)
            );
        }
        assert!(rel(erfc(-1.0), 2.0 - 0.15729920705028513) < 1e-15);
    }

    #[test]
    fn library_ppf_matches_reference_values() {
        let cases = [
            (0.975, 1.959963984540054),
            (0.95, 1.6448536269514722),
            (0.9, 1.2815515655446004),
            (0.99, 2.3263478740408408),
            (0.999, 3.090232306167813),
            (0.025, -1.959963984540054),
        ];
        for (q, want) in cases {
            assert!(
                rel(normal_ppf(q), want) < 1e-14,
                "ppf({q}) = {} want {want}",
                normal_ppf(q)
            );
        }
        assert_eq!(normal_ppf(0.5), 0.0);
        assert_eq!(normal_ppf(0.0), f64::NEG_INFINITY);
        assert_eq!(normal_ppf(1.0), f64::INFINITY);
        assert!(normal_ppf(1.5).is_nan() && normal_ppf(f64::NAN).is_nan());
    }

    #[test]
    fn library_ppf_round_trips_through_the_cdf() {
        for i in 1..2000 {
            let q = i as f64 / 2000.0;
            let x = normal_ppf(q);
            let back = if q < 0.5 {
                normal_cdf(x)
            } else {
                1.0 - normal_cdf(x)
            };
            let want = if q < 0.5 { q } else { 1.0 - q };
            assert!(rel(back, want) < 1e-13, "q={q}: Phi(ppf(q)) = {back}");
        }
        for e in 1..300 {
            let q = 10f64.powi(-e);
            assert!(rel(normal_cdf(normal_ppf(q)), q) < 1e-12, "tail q=1e-{e}");
        }
    }

    /// Input `b` of [`crate::adapter::normal_f32`]: `(b + 0.5) / 2^24`.
    fn input(b: u32) -> f64 {
        (b as f64 + 0.5) / 16_777_216.0
    }

    /// Newton's root against the bisection's, and the fast `f32` values against the slow ones,
    /// at inputs `bs` of `normal_f32` (the upper half mirrors the lower one exactly). Returns
    /// the largest difference in units of the bound `2^-44 |x| + 2^-50` and how many inputs
    /// Newton left to the bisection (it does not settle where the root is next to `x =
    /// -2 sqrt(2)`, where `erfc` switches from its series to its continued fraction and the
    /// computed `Phi` jumps by a few ulps).
    fn check_inputs(bs: impl Iterator<Item = u32>) -> (f64, usize) {
        let (mut worst, mut unsettled) = (0.0f64, 0);
        for b in bs {
            let q = input(b);
            let slow = lower_quantile(q);
            if let Some(fast) = lower_quantile_newton(q) {
                let bound = slow.abs() / (1u64 << 44) as f64 + 1.0 / (1u64 << 50) as f64;
                let diff = (fast - slow).abs() / bound;
                worst = worst.max(diff);
                assert!(diff <= 1.0, "b = {b}: {fast} against {slow}");
            } else {
                unsettled += 1;
            }
            // normal_ppf(q) is `slow`, normal_ppf(1 - q) is `-slow` (1 - q is exact).
            for std in [0.02, 0.05, 1.0] {
                for (q, x) in [(q, slow), (1.0 - q, -slow)] {
                    assert_eq!(
                        scaled_ppf_f32(q, std).to_bits(),
                        ((std * x) as f32).to_bits(),
                        "b = {b}, q = {q}, std = {std}"
                    );
                }
            }
        }
        (worst, unsettled)
    }

    /// A sample of `normal_f32`'s inputs: both tails and an even spread between.
    #[test]
    fn scaled_ppf_f32_is_the_bisection_rounded_to_f32() {
        let spread = (0..(1u32 << 23)).step_by(1021);
        let (_, unsettled) = check_inputs((0..64).chain(spread).chain((1 << 23) - 64..1 << 23));
        assert!(unsettled < 10, "{unsettled} inputs left to the bisection");
        // Inputs off the grid, and the ones normal_ppf answers alone.
        for q in [
            1e-300,
            1e-20,
            0.1,
            0.3,
            0.4999999,
            0.5,
            0.75,
            1.0 - 1e-12,
            0.0,
            1.0,
            2.0,
        ] {
            let want = (0.7 * normal_ppf(q)) as f32;
            let got = scaled_ppf_f32(q, 0.7);
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "q = {q}"
            );
        }
    }

    /// Every one of the 2^23 lower-half inputs (the upper half is its mirror); 24 s on 2 cores
    /// of the development VM in a release build: `cargo test --release -p qforge-kernels --lib
    /// normal_f32_newton -- --ignored --nocapture`. It prints the largest difference in units of
    /// the bound and how many inputs went to the bisection.
    #[test]
    #[ignore = "all 2^23 lower-half inputs: 24 s on 2 cores in release, minutes in debug; run with --release --ignored --nocapture"]
    fn normal_f32_newton_matches_the_bisection_on_every_input() {
        let half = 1u32 << 22;
        let (worst, unsettled) = std::thread::scope(|s| {
            let parts = [0, half].map(|start| s.spawn(move || check_inputs(start..start + half)));
            parts
                .map(|p| p.join().expect("thread"))
                .into_iter()
                .fold((0.0, 0), |(w, u), (pw, pu)| (f64::max(w, pw), u + pu))
        });
        eprintln!(
            "largest difference {worst:e} of the bound; {unsettled} inputs left to the bisection"
        );
        assert!(
            unsettled < 1 << 13,
            "{unsettled} inputs left to the bisection"
        );
    }
}
