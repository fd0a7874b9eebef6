//! f32 arithmetic, integer arithmetic and bit operations, comparisons, bool logic.

use proptest::prelude::*;
use qforge_ir::{Access, BinaryOp, CmpOp, DType, Dim, KernelBuilder, OwnedArg, ScalarType};

use super::*;

// ----- f32 arithmetic -----

#[test]
fn f32_arithmetic_matches_ieee_on_all_edge_pairs() {
    let (a, b) = pairs(&f32_edges());
    let labels: Vec<String> = a
        .iter()
        .zip(&b)
        .map(|(x, y)| format!("({x:e}, {y:e})"))
        .collect();
    let (ab, bb) = (f32s(&a), f32s(&b));
    type Case = (BinaryOp, fn(f32, f32) -> f32);
    let cases: [Case; 4] = [
        (BinaryOp::Add, |x, y| x + y),
        (BinaryOp::Sub, |x, y| x - y),
        (BinaryOp::Mul, |x, y| x * y),
        (BinaryOp::Div, |x, y| x / y),
    ];
    for (op, std_op) in cases {
        let got = map2(ScalarType::F32, ScalarType::F32, &ab, &bb, |k, x, y| {
            k.binary(op, x, y)
        });
        let want: Vec<u32> = a
            .iter()
            .zip(&b)
            .map(|(x, y)| std_op(*x, *y).to_bits())
            .collect();
        assert_f32s(op.name(), &labels, &got, &want);
    }
}

#[test]
fn f32_arithmetic_hand_derived_constants() {
    let h = f32::from_bits;
    // (op, a, b, expected bits)
    let cases: &[(BinaryOp, f32, f32, u32)] = &[
        (BinaryOp::Add, 0.1, 0.2, 0x3E99_999A), // 0.3 rounds up in f32
        (BinaryOp::Div, 1.0, 3.0, 0x3EAA_AAAB), // 1/3 rounds up
        (BinaryOp::Add, -0.0, -0.0, 0x8000_0000), // -0 + -0 = -0
        (BinaryOp::Add, -0.0, 0.0, 0x0000_0000), // exact zero sum is +0 under rne
        (BinaryOp::Sub, 1.0, 1.0, 0x0000_0000),
        (BinaryOp::Sub, -0.0, 0.0, 0x8000_0000),
        (BinaryOp::Mul, f32::MIN_POSITIVE, 0.5, 0x0040_0000), // subnormal kept, not flushed
        (BinaryOp::Mul, h(1), 0.5, 0x0000_0000),              // 2^-150 is a tie: to even (0)
        (BinaryOp::Mul, h(3), 0.5, 0x0000_0002),              // 1.5 * 2^-149: tie to even (2)
        (BinaryOp::Mul, h(1), -1.0, 0x8000_0001),
        (BinaryOp::Add, f32::MAX, f32::MAX, 0x7F80_0000), // overflow to +inf
        (BinaryOp::Mul, f32::MIN, 2.0, 0xFF80_0000),
        (BinaryOp::Div, 1.0, 0.0, 0x7F80_0000),
        (BinaryOp::Div, 1.0, -0.0, 0xFF80_0000),
        (BinaryOp::Div, -1.0, 0.0, 0xFF80_0000),
        (BinaryOp::Div, 0.0, 0.0, 0x7FC0_0000), // NaN
        (BinaryOp::Sub, f32::INFINITY, f32::INFINITY, 0x7FC0_0000),
        (BinaryOp::Mul, 0.0, f32::INFINITY, 0x7FC0_0000),
        (BinaryOp::Add, 16_777_216.0, 1.0, 0x4B80_0000), // 2^24 + 1 rounds (tie) to 2^24
        (BinaryOp::Add, 16_777_216.0, 3.0, 0x4B80_0002), // 2^24 + 3: tie to even 2^24 + 4
    ];
    let a: Vec<u32> = cases.iter().map(|c| c.1.to_bits()).collect();
    let b: Vec<u32> = cases.iter().map(|c| c.2.to_bits()).collect();
    for op in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div] {
        let got = map2(ScalarType::F32, ScalarType::F32, &a, &b, |k, x, y| {
            k.binary(op, x, y)
        });
        for (k, c) in cases.iter().enumerate() {
            if c.0 == op {
                assert!(
                    same_f32(got[k], c.3),
                    "{} {:e} {:e}: got {:#x}, want {:#x}",
                    op.name(),
                    c.1,
                    c.2,
                    got[k],
                    c.3
                );
            }
        }
    }
}

#[test]
fn f32_unary_sqrt_neg_abs() {
    // sqrt: correctly rounded sqrt(2), exact sqrt(4), sqrt(-0) = -0, sqrt(<0) = NaN,
    // sqrt(inf) = inf, sqrt(-inf) = NaN, and subnormal inputs are not flushed:
    // sqrt(2^-148) = 2^-74, sqrt(2^-146) = 2^-73.
    let xs = [
        2.0f32,
        4.0,
        -0.0,
        0.0,
        -1.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::from_bits(2),
        f32::from_bits(8),
    ];
    let got = map1(ScalarType::F32, ScalarType::F32, &f32s(&xs), |k, x| {
        k.sqrt(x)
    });
    let want = [
        0x3FB5_04F3,
        0x4000_0000,
        0x8000_0000,
        0,
        0x7FC0_0000,
        0x7F80_0000,
        0x7FC0_0000,
        0x1A80_0000,
        0x1B00_0000,
    ];
    let labels: Vec<String> = xs.iter().map(|x| format!("{x:e}")).collect();
    assert_f32s("sqrt", &labels, &got, &want);

    // neg / abs act on the sign bit only, NaN payloads included.
    let bits = [
        0x0000_0000u32,
        0x8000_0000,
        0x7FC0_0001,
        0xFFC0_0002,
        0x3F80_0000,
        0xFF80_0000,
        0x0000_0001,
    ];
    let neg = map1(ScalarType::F32, ScalarType::F32, &bits, |k, x| k.neg(x));
    let abs = map1(ScalarType::F32, ScalarType::F32, &bits, |k, x| k.abs(x));
    for (k, &x) in bits.iter().enumerate() {
        assert_eq!(neg[k], x ^ 0x8000_0000, "neg {x:#x}");
        assert_eq!(abs[k], x & 0x7FFF_FFFF, "abs {x:#x}");
    }
}

#[test]
fn f32_min_max_are_compare_and_select() {
    let nan = f32::NAN;
    // (a, b, min, max)
    let cases: &[(f32, f32, u32, u32)] = &[
        (1.0, 2.0, 1.0f32.to_bits(), 2.0f32.to_bits()),
        (2.0, 1.0, 1.0f32.to_bits(), 2.0f32.to_bits()),
        (nan, 1.0, nan.to_bits(), nan.to_bits()), // NaN in a propagates
        (1.0, nan, 1.0f32.to_bits(), 1.0f32.to_bits()), // NaN in b yields a
        (-0.0, 0.0, 0x8000_0000, 0x8000_0000),    // equal: a is kept
        (0.0, -0.0, 0x0000_0000, 0x0000_0000),
        (f32::NEG_INFINITY, 3.0, 0xFF80_0000, 3.0f32.to_bits()),
        (f32::from_bits(1), 0.0, 0, 1),
    ];
    let a: Vec<u32> = cases.iter().map(|c| c.0.to_bits()).collect();
    let b: Vec<u32> = cases.iter().map(|c| c.1.to_bits()).collect();
    let min = map2(ScalarType::F32, ScalarType::F32, &a, &b, |k, x, y| {
        k.min(x, y)
    });
    let max = map2(ScalarType::F32, ScalarType::F32, &a, &b, |k, x, y| {
        k.max(x, y)
    });
    for (k, c) in cases.iter().enumerate() {
        assert!(
            same_f32(min[k], c.2),
            "min({:e}, {:e}) = {:#x}",
            c.0,
            c.1,
            min[k]
        );
        assert!(
            same_f32(max[k], c.3),
            "max({:e}, {:e}) = {:#x}",
            c.0,
            c.1,
            max[k]
        );
        // ±0 cases must keep the exact sign, not just compare equal.
        if c.2 & 0x7FFF_FFFF == 0 {
            assert_eq!(min[k], c.2);
        }
    }
    // Integer min/max follow the signedness of the type.
    let got = map2(
        ScalarType::I32,
        ScalarType::I32,
        &i32s(&[-1, i32::MIN]),
        &i32s(&[1, i32::MAX]),
        |k, x, y| k.min(x, y),
    );
    assert_eq!(got, i32s(&[-1, i32::MIN]));
    let got = map2(
        ScalarType::U32,
        ScalarType::U32,
        &[u32::MAX, 0],
        &[1, 5],
        |k, x, y| k.min(x, y),
    );
    assert_eq!(got, [1, 0]);
    let got = map2(
        ScalarType::U32,
        ScalarType::U32,
        &[u32::MAX, 0],
        &[1, 5],
        |k, x, y| k.max(x, y),
    );
    assert_eq!(got, [u32::MAX, 5]);
}

#[test]
fn fma_rounds_once_and_mul_add_rounds_twice() {
    // a = 1 + 2^-12: a*a = 1 + 2^-11 + 2^-24 exactly. With c = -(1 + 2^-11) the fused result is
    // exactly 2^-24; rounding a*a first loses the 2^-24 (a tie, to even) and gives 0.
    let a = 1.0f32 + f32::from_bits(0x3980_0000); // 2^-12
    assert_eq!(a.to_bits(), 0x3F80_0800);
    let c = -(1.0f32 + f32::from_bits(0x3A00_0000)); // -(1 + 2^-11)
    let args = |v: f32| vec![v.to_bits(); 1];
    let fused = map3(
        ScalarType::F32,
        ScalarType::F32,
        &args(a),
        &args(a),
        &args(c),
        |k, x, y, z| k.fma(x, y, z),
    );
    assert_eq!(fused, [0x3380_0000], "fma = 2^-24");
    let split = map3(
        ScalarType::F32,
        ScalarType::F32,
        &args(a),
        &args(a),
        &args(c),
        |k, x, y, z| {
            let p = k.mul(x, y);
            k.add(p, z)
        },
    );
    assert_eq!(split, [0], "mul then add is two roundings (no contraction)");

    // Special values: 0 * inf + 1 = NaN; -0 * 1 + -0 = -0; -0 * 1 + +0 = +0; overflow of the
    // product is not an overflow of the fused result.
    let xs = [0.0f32, -0.0, -0.0, f32::MAX];
    let ys = [f32::INFINITY, 1.0, 1.0, 2.0];
    let zs = [1.0f32, -0.0, 0.0, f32::MIN];
    let got = map3(
        ScalarType::F32,
        ScalarType::F32,
        &f32s(&xs),
        &f32s(&ys),
        &f32s(&zs),
        |k, x, y, z| k.fma(x, y, z),
    );
    let want = [0x7FC0_0000, 0x8000_0000, 0, f32::MAX.to_bits()];
    let labels: Vec<String> = (0..4)
        .map(|i| format!("fma({:e},{:e},{:e})", xs[i], ys[i], zs[i]))
        .collect();
    assert_f32s("fma", &labels, &got, &want);
}

// ----- integer arithmetic, bit operations, comparisons, select -----

fn int_cases(ty: ScalarType, op: BinaryOp, cases: &[(u32, u32, u32)]) {
    let a: Vec<u32> = cases.iter().map(|c| c.0).collect();
    let b: Vec<u32> = cases.iter().map(|c| c.1).collect();
    let got = map2(ty, ty, &a, &b, |k, x, y| k.binary(op, x, y));
    for (k, c) in cases.iter().enumerate() {
        assert_eq!(got[k], c.2, "{ty} {}({:#x}, {:#x})", op.name(), c.0, c.1);
    }
}

#[test]
fn i32_ops_wrap_and_define_every_corner() {
    const MIN: u32 = i32::MIN as u32;
    const MAX: u32 = i32::MAX as u32;
    let n = |v: i32| v as u32;
    use BinaryOp::*;
    let ty = ScalarType::I32;
    int_cases(
        ty,
        Add,
        &[(MAX, 1, MIN), (n(-1), n(-1), n(-2)), (MIN, n(-1), MAX)],
    );
    int_cases(ty, Sub, &[(MIN, 1, MAX), (0, MIN, MIN), (3, 5, n(-2))]);
    int_cases(
        ty,
        Mul,
        &[
            (65536, 65536, 0),
            (MAX, 2, n(-2)),
            (n(-3), 7, n(-21)),
            (MIN, n(-1), MIN),
        ],
    );
    // The signed high word: (-1) * (-1) = 1; MIN * MIN = 2^62; MIN * (-1) = 2^31;
    // (-1) * 1 = -1 (high word all ones); MAX * MAX = 2^62 - 2^32 + 1.
    int_cases(
        ty,
        MulHi,
        &[
            (n(-1), n(-1), 0),
            (MIN, MIN, 0x4000_0000),
            (MIN, n(-1), 0),
            (n(-1), 1, n(-1)),
            (MAX, MAX, 0x3FFF_FFFF),
            (n(-65536), 65536, n(-1)),
        ],
    );
    int_cases(
        ty,
        Div,
        &[
            (7, 2, 3),
            (n(-7), 2, n(-3)),
            (7, n(-2), n(-3)),
            (n(-7), n(-2), 3),
            (5, 0, 0),
            (0, 0, 0),
            (MIN, n(-1), MIN),
            (MIN, 1, MIN),
        ],
    );
    int_cases(
        ty,
        Rem,
        &[
            (7, 2, 1),
            (n(-7), 2, n(-1)),
            (7, n(-2), 1),
            (n(-7), n(-2), n(-1)),
            (5, 0, 0),
            (MIN, n(-1), 0),
            (MIN, 3, n(-2)),
        ],
    );
    int_cases(ty, Min, &[(n(-1), 1, n(-1)), (MIN, MAX, MIN)]);
    int_cases(ty, Max, &[(n(-1), 1, 1), (MIN, MAX, MAX)]);
    int_cases(ty, And, &[(n(-1), 0x0F0F, 0x0F0F)]);
    int_cases(ty, Or, &[(0x00F0, 0x0F00, 0x0FF0)]);
    int_cases(ty, Xor, &[(n(-1), 0x0F, n(-16))]);
    // Shift amounts are taken mod 32; shr on i32 is arithmetic.
    int_cases(
        ty,
        Shl,
        &[
            (1, 31, MIN),
            (1, 32, 1),
            (1, 33, 2),
            (n(-1), 4, n(-16)),
            (3, n(-1), MIN),
        ],
    );
    int_cases(
        ty,
        Shr,
        &[
            (n(-8), 1, n(-4)),
            (MIN, 31, n(-1)),
            (n(-1), 100, n(-1)),
            (16, 36, 1),
            (MAX, 30, 1),
        ],
    );

    let xs = i32s(&[i32::MIN, 5, 0, -5]);
    assert_eq!(
        map1(ty, ty, &xs, |k, x| k.neg(x)),
        i32s(&[i32::MIN, -5, 0, 5])
    );
    assert_eq!(
        map1(ty, ty, &xs, |k, x| k.abs(x)),
        i32s(&[i32::MIN, 5, 0, 5])
    );
    assert_eq!(
        map1(ty, ty, &xs, |k, x| k.not(x)),
        i32s(&[i32::MAX, -6, -1, 4])
    );
}

#[test]
fn u32_ops_wrap_and_define_every_corner() {
    const M: u32 = u32::MAX;
    use BinaryOp::*;
    let ty = ScalarType::U32;
    int_cases(ty, Add, &[(M, 1, 0), (M, M, M - 1)]);
    int_cases(ty, Sub, &[(0, 1, M), (5, 3, 2)]);
    int_cases(
        ty,
        Mul,
        &[(0x1_0000, 0x1_0000, 0), (M, M, 1), (3, 0x5555_5556, 2)],
    );
    // The high word: (2^32 - 1)^2 = 0xFFFF_FFFE_0000_0001; 2^16 * 2^16 = 2^32;
    // 0xD251_1F53 * 0x1234_5678 = 0x0EF4_B3B8_0968_90E8 (Philox's first multiplier).
    int_cases(
        ty,
        MulHi,
        &[
            (M, M, 0xFFFF_FFFE),
            (0x1_0000, 0x1_0000, 1),
            (0xD251_1F53, 0x1234_5678, 0x0EF4_B3B8),
            (M, 1, 0),
            (0, M, 0),
        ],
    );
    int_cases(
        ty,
        Div,
        &[
            (M, 2, 0x7FFF_FFFF),
            (5, 0, 0),
            (0x8000_0000, M, 0),
            (M, M, 1),
        ],
    );
    int_cases(
        ty,
        Rem,
        &[(M, 10, 5), (7, 0, 0), (0x8000_0000, M, 0x8000_0000)],
    );
    int_cases(ty, Min, &[(M, 1, 1)]);
    int_cases(ty, Max, &[(M, 1, M)]);
    int_cases(ty, Shl, &[(M, 31, 0x8000_0000), (1, 32, 1), (5, 0, 5)]);
    // Logical shift right on u32.
    int_cases(
        ty,
        Shr,
        &[
            (0x8000_0000, 31, 1),
            (0x8000_0000, 63, 1),
            (M, 4, 0x0FFF_FFFF),
            (M, 32, M),
        ],
    );
    assert_eq!(map1(ty, ty, &[1, 0, M], |k, x| k.neg(x)), [M, 0, 1]);
    assert_eq!(
        map1(ty, ty, &[0, M, 0xF0F0_F0F0], |k, x| k.not(x)),
        [M, 0, 0x0F0F_0F0F]
    );
}

#[test]
fn comparisons_follow_ieee_and_signedness() {
    use CmpOp::*;
    let ops = [Eq, Ne, Lt, Le, Gt, Ge];
    let check = |ty: ScalarType, cases: &[(u32, u32, [bool; 6])]| {
        let a: Vec<u32> = cases.iter().map(|c| c.0).collect();
        let b: Vec<u32> = cases.iter().map(|c| c.1).collect();
        for (j, op) in ops.iter().enumerate() {
            let got = map2(ty, ScalarType::Bool, &a, &b, |k, x, y| k.cmp(*op, x, y));
            for (i, c) in cases.iter().enumerate() {
                assert_eq!(
                    got[i],
                    c.2[j] as u32,
                    "{ty} {}({:#x}, {:#x})",
                    op.name(),
                    c.0,
                    c.1
                );
            }
        }
    };
    const T: bool = true;
    const F: bool = false;
    let b = |x: f32| x.to_bits();
    check(
        ScalarType::F32,
        &[
            (b(1.0), b(2.0), [F, T, T, T, F, F]),
            (b(-0.0), b(0.0), [T, F, F, T, F, T]),
            (b(f32::NAN), b(1.0), [F, T, F, F, F, F]),
            (b(1.0), b(f32::NAN), [F, T, F, F, F, F]),
            (b(f32::NAN), b(f32::NAN), [F, T, F, F, F, F]),
            (b(f32::NEG_INFINITY), b(f32::INFINITY), [F, T, T, T, F, F]),
            (b(f32::INFINITY), b(f32::INFINITY), [T, F, F, T, F, T]),
            (1, 0, [F, T, F, F, T, T]), // smallest subnormal > 0
            (b(-1.0), b(1.0), [F, T, T, T, F, F]),
        ],
    );
    check(
        ScalarType::I32,
        &[
            ((-1i32) as u32, 0, [F, T, T, T, F, F]),
            (i32::MIN as u32, i32::MAX as u32, [F, T, T, T, F, F]),
            (7, 7, [T, F, F, T, F, T]),
        ],
    );
    check(
        ScalarType::U32,
        &[
            (u32::MAX, 0, [F, T, F, F, T, T]),
            (5, 5, [T, F, F, T, F, T]),
            (0, 1, [F, T, T, T, F, F]),
        ],
    );
}

#[test]
fn bool_logic_and_select() {
    // Every combination of two booleans through and / or / xor / not / eq / ne, and select.
    let mut k = KernelBuilder::new("bools");
    let out = k.buffer_param("out", DType::U32, &[Dim::Const(4 * 6)], Access::Write);
    let mut slot = 0;
    for (p, q) in [(false, false), (false, true), (true, false), (true, true)] {
        let (x, y) = (k.const_bool(p), k.const_bool(q));
        let rs = [
            k.and(x, y),
            k.or(x, y),
            k.binary(BinaryOp::Xor, x, y),
            k.not(x),
            k.cmp(CmpOp::Eq, x, y),
            k.cmp(CmpOp::Ne, x, y),
        ];
        for r in rs {
            let (ten, twenty) = (k.const_u32(10), k.const_u32(20));
            let v = k.select(r, ten, twenty);
            let i = k.const_u32(slot);
            k.store(out, i, v);
            slot += 1;
        }
    }
    let kernel = k.finish();
    let got = words(out_bytes(
        &run(&kernel, vec![OwnedArg::Write(vec![0; 96])])[0],
    ));
    let mut want = Vec::new();
    for (p, q) in [(false, false), (false, true), (true, false), (true, true)] {
        for r in [p && q, p || q, p ^ q, !p, p == q, p != q] {
            want.push(if r { 10 } else { 20 });
        }
    }
    assert_eq!(got, want);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// f32 + - * / min max on random bit patterns against Rust's IEEE ops and the select rule.
    #[test]
    fn f32_binary_ops_on_random_bits(a in proptest::collection::vec(any::<u32>(), 32),
                                     b in proptest::collection::vec(any::<u32>(), 32)) {
        let fa: Vec<f32> = a.iter().map(|x| f32::from_bits(*x)).collect();
        let fb: Vec<f32> = b.iter().map(|x| f32::from_bits(*x)).collect();
        type Case = (BinaryOp, fn(f32, f32) -> f32);
        let cases: [Case; 6] = [
            (BinaryOp::Add, |x, y| x + y),
            (BinaryOp::Sub, |x, y| x - y),
            (BinaryOp::Mul, |x, y| x * y),
            (BinaryOp::Div, |x, y| x / y),
            (BinaryOp::Min, |x, y| if y < x { y } else { x }),
            (BinaryOp::Max, |x, y| if y > x { y } else { x }),
        ];
        for (op, f) in cases {
            let got = map2(ScalarType::F32, ScalarType::F32, &a, &b, |k, x, y| k.binary(op, x, y));
            for i in 0..a.len() {
                let want = f(fa[i], fb[i]).to_bits();
                prop_assert!(same_f32(got[i], want), "{} {:#x} {:#x}: {:#x} vs {:#x}", op.name(), a[i], b[i], got[i], want);
            }
        }
    }
}
