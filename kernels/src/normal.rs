//! The standard normal distribution in `f64`: `erfc`, the CDF and its inverse (the quantile
//! function `ppf`, scipy's `norm.ppf` / `ndtri`), accurate to a few `f64` ulps. Only used at
//! kernel-build time to construct the NF4 table (`create_normal_map`); kernels never call it.
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
}
