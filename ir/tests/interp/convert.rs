//! Conversions (float to int, int to float with every rounding), bitcast and table lookup.

use proptest::prelude::*;
use qforge_ir::{Op, Rounding, ScalarType};

use super::*;

// ----- conversions -----

#[test]
fn float_to_int_rounds_by_mode_then_saturates() {
    const MAX: i32 = i32::MAX;
    const MIN: i32 = i32::MIN;
    const UM: u32 = u32::MAX;
    let xs: [f32; 21] = [
        2.5,
        -2.5,
        3.5,
        -0.5,
        0.5,
        1.5,
        -0.0,
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        3e9,
        -3e9,
        2_147_483_520.0, // largest f32 below 2^31
        2_147_483_648.0, // 2^31
        -2_147_483_648.0,
        4_294_967_040.0, // largest f32 below 2^32
        4_294_967_296.0, // 2^32
        f32::from_bits(1),
        -f32::from_bits(1),
        -1.0,
        0.499_999_97, // largest f32 below 0.5: rne gives 0 (floor(x + 0.5) would give 1)
    ];
    let i32_want: [(Rounding, [i32; 21]); 4] = [
        (
            Rounding::NearestEven,
            [
                2,
                -2,
                4,
                0,
                0,
                2,
                0,
                0,
                MAX,
                MIN,
                MAX,
                MIN,
                2_147_483_520,
                MAX,
                MIN,
                MAX,
                MAX,
                0,
                0,
                -1,
                0,
            ],
        ),
        (
            Rounding::TowardZero,
            [
                2,
                -2,
                3,
                0,
                0,
                1,
                0,
                0,
                MAX,
                MIN,
                MAX,
                MIN,
                2_147_483_520,
                MAX,
                MIN,
                MAX,
                MAX,
                0,
                0,
                -1,
                0,
            ],
        ),
        (
            Rounding::Down,
            [
                2,
                -3,
                3,
                -1,
                0,
                1,
                0,
                0,
                MAX,
                MIN,
                MAX,
                MIN,
                2_147_483_520,
                MAX,
                MIN,
                MAX,
                MAX,
                0,
                -1,
                -1,
                0,
            ],
        ),
        (
            Rounding::Up,
            [
                3,
                -2,
                4,
                0,
                1,
                2,
                0,
                0,
                MAX,
                MIN,
                MAX,
                MIN,
                2_147_483_520,
                MAX,
                MIN,
                MAX,
                MAX,
                1,
                0,
                -1,
                1,
            ],
        ),
    ];
    let e9 = 3_000_000_000;
    let u32_want: [(Rounding, [u32; 21]); 4] = [
        (
            Rounding::NearestEven,
            [
                2,
                0,
                4,
                0,
                0,
                2,
                0,
                0,
                UM,
                0,
                e9,
                0,
                2_147_483_520,
                2_147_483_648,
                0,
                4_294_967_040,
                UM,
                0,
                0,
                0,
                0,
            ],
        ),
        (
            Rounding::TowardZero,
            [
                2,
                0,
                3,
                0,
                0,
                1,
                0,
                0,
                UM,
                0,
                e9,
                0,
                2_147_483_520,
                2_147_483_648,
                0,
                4_294_967_040,
                UM,
                0,
                0,
                0,
                0,
            ],
        ),
        (
            Rounding::Down,
            [
                2,
                0,
                3,
                0,
                0,
                1,
                0,
                0,
                UM,
                0,
                e9,
                0,
                2_147_483_520,
                2_147_483_648,
                0,
                4_294_967_040,
                UM,
                0,
                0,
                0,
                0,
            ],
        ),
        (
            Rounding::Up,
            [
                3,
                0,
                4,
                0,
                1,
                2,
                0,
                0,
                UM,
                0,
                e9,
                0,
                2_147_483_520,
                2_147_483_648,
                0,
                4_294_967_040,
                UM,
                1,
                0,
                0,
                1,
            ],
        ),
    ];
    let input = f32s(&xs);
    for (r, want) in i32_want {
        let got = map1(ScalarType::F32, ScalarType::I32, &input, |k, x| {
            k.float_to_int(x, ScalarType::I32, r)
        });
        for (i, x) in xs.iter().enumerate() {
            assert_eq!(got[i] as i32, want[i], "f32 {x:e} -> i32 {}", r.name());
        }
    }
    for (r, want) in u32_want {
        let got = map1(ScalarType::F32, ScalarType::U32, &input, |k, x| {
            k.float_to_int(x, ScalarType::U32, r)
        });
        for (i, x) in xs.iter().enumerate() {
            assert_eq!(got[i], want[i], "f32 {x:e} -> u32 {}", r.name());
        }
    }
}

fn int_to_float(ty: ScalarType, xs: &[u32], r: Rounding) -> Vec<u32> {
    map1(ty, ScalarType::F32, xs, |k, x| {
        k.op(Op::IntToFloat {
            value: x,
            rounding: r,
        })
    })
}

#[test]
fn int_to_float_all_roundings() {
    use Rounding::*;
    // (input, [rne, rtz, rdn, rup]) — f32 has 24 significant bits, so between 2^24 and 2^25 the
    // spacing is 2, between 2^31 and 2^32 it is 256.
    let i32_cases: &[(i32, [f32; 4])] = &[
        (0, [0.0; 4]),
        (-1, [-1.0; 4]),
        (
            16_777_217,
            [16_777_216.0, 16_777_216.0, 16_777_216.0, 16_777_218.0],
        ),
        (
            16_777_219,
            [16_777_220.0, 16_777_218.0, 16_777_218.0, 16_777_220.0],
        ),
        (
            -16_777_217,
            [-16_777_216.0, -16_777_216.0, -16_777_218.0, -16_777_216.0],
        ),
        (
            -16_777_219,
            [-16_777_220.0, -16_777_218.0, -16_777_220.0, -16_777_218.0],
        ),
        (
            i32::MAX,
            [
                2_147_483_648.0,
                2_147_483_520.0,
                2_147_483_520.0,
                2_147_483_648.0,
            ],
        ),
        (i32::MIN, [-2_147_483_648.0; 4]),
        (
            i32::MIN + 1,
            [
                -2_147_483_648.0,
                -2_147_483_520.0,
                -2_147_483_648.0,
                -2_147_483_520.0,
            ],
        ),
    ];
    let u32_cases: &[(u32, [f32; 4])] = &[
        (0, [0.0; 4]),
        (
            u32::MAX,
            [
                4_294_967_296.0,
                4_294_967_040.0,
                4_294_967_040.0,
                4_294_967_296.0,
            ],
        ),
        (
            0x8000_0001,
            [
                2_147_483_648.0,
                2_147_483_648.0,
                2_147_483_648.0,
                2_147_483_904.0,
            ],
        ),
        (
            2_147_483_776,
            [
                2_147_483_648.0,
                2_147_483_648.0,
                2_147_483_648.0,
                2_147_483_904.0,
            ],
        ), // tie, even below
        (
            2_147_484_032,
            [
                2_147_484_160.0,
                2_147_483_904.0,
                2_147_483_904.0,
                2_147_484_160.0,
            ],
        ), // tie, even above
        (
            16_777_217,
            [16_777_216.0, 16_777_216.0, 16_777_216.0, 16_777_218.0],
        ),
    ];
    for (j, r) in [NearestEven, TowardZero, Down, Up].into_iter().enumerate() {
        let xs: Vec<u32> = i32_cases.iter().map(|c| c.0 as u32).collect();
        let got = int_to_float(ScalarType::I32, &xs, r);
        for (i, c) in i32_cases.iter().enumerate() {
            assert_eq!(got[i], c.1[j].to_bits(), "i32 {} -> f32 {}", c.0, r.name());
        }
        let xs: Vec<u32> = u32_cases.iter().map(|c| c.0).collect();
        let got = int_to_float(ScalarType::U32, &xs, r);
        for (i, c) in u32_cases.iter().enumerate() {
            assert_eq!(got[i], c.1[j].to_bits(), "u32 {} -> f32 {}", c.0, r.name());
        }
    }
}

#[test]
fn bitcast_keeps_all_bits() {
    let bits = [
        0x7FC0_0001u32,
        0xFF80_0001,
        0x8000_0000,
        0x0000_0001,
        0xFFFF_FFFF,
        0x3F80_0000,
    ];
    // u32 -> f32 -> i32 -> u32 must be the identity, NaN payloads and signalling NaNs included.
    let got = map1(ScalarType::U32, ScalarType::U32, &bits, |k, x| {
        let f = k.bitcast(x, ScalarType::F32);
        let i = k.bitcast(f, ScalarType::I32);
        k.bitcast(i, ScalarType::U32)
    });
    assert_eq!(got, bits);
    // f32 -> i32: -0.0 is i32::MIN, 1.0 is 0x3F800000.
    let got = map1(
        ScalarType::F32,
        ScalarType::I32,
        &f32s(&[-0.0, 1.0]),
        |k, x| k.bitcast(x, ScalarType::I32),
    );
    assert_eq!(got, [0x8000_0000, 0x3F80_0000]);
}

#[test]
fn lookup_clamps_the_index() {
    let idx = [0u32, 1, 2, 3, 1000, u32::MAX];
    let got = map1(ScalarType::U32, ScalarType::F32, &idx, |k, i| {
        let t = k.table_f32("t", &[-1.5, 0.25, 7.0]);
        k.lookup(t, i)
    });
    assert_eq!(got, f32s(&[-1.5, 0.25, 7.0, 7.0, 7.0, 7.0]));
    let got = map1(ScalarType::U32, ScalarType::U32, &idx, |k, i| {
        let t = k.table_u32("single", &[42]);
        k.lookup(t, i)
    });
    assert_eq!(got, [42; 6]);
}

/// `search_sorted` counts the entries `< v` by IEEE comparison: equal entries (including
/// `-0.0 == +0.0`) do not count, `+inf` entries never count, a NaN counts nothing. Expected
/// counts written by hand from those rules.
#[test]
fn search_sorted_counts_the_entries_below() {
    let table = [
        f32::NEG_INFINITY,
        -1.0,
        -0.0,
        0.0,
        0.5,
        0.5,
        2.0,
        f32::INFINITY,
    ];
    let cases: [(f32, u32); 14] = [
        (f32::NEG_INFINITY, 0),
        (-3.0, 1),
        (-1.0, 1),
        (-0.5, 2),
        (-0.0, 2),
        (0.0, 2),
        (f32::from_bits(1), 4),
        (0.5, 4),
        (1.0, 6),
        (2.0, 6),
        (f32::MAX, 7),
        (f32::INFINITY, 7),
        (f32::NAN, 0),
        (-f32::NAN, 0),
    ];
    let values: Vec<f32> = cases.iter().map(|c| c.0).collect();
    let got = map1(ScalarType::F32, ScalarType::U32, &f32s(&values), |k, v| {
        let t = k.table_f32("t", &table);
        k.search_sorted(t, v)
    });
    let want: Vec<u32> = cases.iter().map(|c| c.1).collect();
    assert_eq!(got, want);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Directed int-to-float roundings bracket the exact value: rdn is the largest f32 <= x,
    /// rup the smallest f32 >= x, rtz the one of those two nearer zero, rne is Rust's `as`.
    #[test]
    fn int_to_float_brackets_the_exact_value(xs in proptest::collection::vec(any::<u32>(), 32)) {
        use Rounding::*;
        for ty in [ScalarType::U32, ScalarType::I32] {
            let exact: Vec<f64> = xs.iter().map(|&x| if ty == ScalarType::I32 { x as i32 as f64 } else { x as f64 }).collect();
            let down = int_to_float(ty, &xs, Down);
            let up = int_to_float(ty, &xs, Up);
            let rtz = int_to_float(ty, &xs, TowardZero);
            let rne = int_to_float(ty, &xs, NearestEven);
            for i in 0..xs.len() {
                let (d, u) = (f32::from_bits(down[i]), f32::from_bits(up[i]));
                let x = exact[i];
                prop_assert!((d as f64) <= x && x < (d.next_up() as f64), "rdn {x}: {d}");
                prop_assert!((u as f64) >= x && x > (u.next_down() as f64), "rup {x}: {u}");
                let t = if x >= 0.0 { d } else { u };
                prop_assert_eq!(rtz[i], t.to_bits(), "rtz {}", x);
                let n = if ty == ScalarType::I32 { xs[i] as i32 as f32 } else { xs[i] as f32 };
                prop_assert_eq!(rne[i], n.to_bits(), "rne {}", x);
            }
        }
    }

    /// Float-to-int against Rust's rounding functions and saturating `as`, on random bits.
    #[test]
    fn float_to_int_on_random_bits(xs in proptest::collection::vec(any::<u32>(), 32)) {
        use Rounding::*;
        let fs: Vec<f32> = xs.iter().map(|x| f32::from_bits(*x)).collect();
        type R = (Rounding, fn(f32) -> f32);
        let modes: [R; 4] = [(NearestEven, f32::round_ties_even), (TowardZero, f32::trunc), (Down, f32::floor), (Up, f32::ceil)];
        for (r, f) in modes {
            let gi = map1(ScalarType::F32, ScalarType::I32, &xs, |k, x| k.float_to_int(x, ScalarType::I32, r));
            let gu = map1(ScalarType::F32, ScalarType::U32, &xs, |k, x| k.float_to_int(x, ScalarType::U32, r));
            for i in 0..xs.len() {
                prop_assert_eq!(gi[i] as i32, f(fs[i]) as i32, "{} {:e}", r.name(), fs[i]);
                prop_assert_eq!(gu[i], f(fs[i]) as u32, "{} {:e}", r.name(), fs[i]);
            }
        }
    }
}
