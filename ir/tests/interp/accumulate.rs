//! `Stmt::Accumulate`: the pinned summation order and the fused multiply-add, checked against
//! sums written out by hand and against a plain Rust model of the documented order.

use qforge_ir::ReduceOrder;

use super::*;

/// `out[0] = sum a[i] * b[i]` and `out[1] = sum b[i] * 1.0` over `len` elements in `order`.
fn dot(order: ReduceOrder, a: &[f32], b: &[f32]) -> [u32; 2] {
    let n = a.len();
    let mut k = KernelBuilder::new("dot");
    let np = k.scalar_param("n", ScalarType::U32);
    let pa = k.buffer_param("a", DType::F32, &[Dim::Param(np)], Access::Read);
    let pb = k.buffer_param("b", DType::F32, &[Dim::Param(np)], Access::Read);
    let out = k.buffer_param("out", DType::F32, &[Dim::Const(2)], Access::Write);
    let s0 = k.var("s0", ScalarType::F32);
    let s1 = k.var("s1", ScalarType::F32);
    let len = k.param(np);
    k.accumulate(len, order, &[s0, s1], |k, i| {
        let (x, y) = (k.load(pa, i), k.load(pb, i));
        let one = k.const_f32(1.0);
        vec![(x, y), (y, one)]
    });
    let (r0, r1) = (k.read_var(s0), k.read_var(s1));
    let (i0, i1) = (k.const_u32(0), k.const_u32(1));
    k.store(out, i0, r0);
    k.store(out, i1, r1);
    let kernel = k.finish();
    qforge_ir::verify(&kernel).unwrap();
    let args = vec![
        OwnedArg::Scalar(Scalar::U32(n as u32)),
        OwnedArg::Read(le32(&f32s(a))),
        OwnedArg::Read(le32(&f32s(b))),
        OwnedArg::Write(vec![0; 8]),
    ];
    let w = words(out_bytes(&run(&kernel, args)[3]));
    [w[0], w[1]]
}

/// The documented order, written independently: partial `i % ways` with `mul_add`, then the
/// halving tree.
fn model(ways: usize, a: &[f32], b: &[f32]) -> u32 {
    let mut p = vec![-0.0f32; ways];
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        p[i % ways] = x.mul_add(*y, p[i % ways]);
    }
    let mut w = ways;
    while w > 1 {
        w /= 2;
        for j in 0..w {
            p[j] += p[j + w];
        }
    }
    p[0].to_bits()
}

#[test]
fn accumulate_order_is_the_documented_one() {
    // [1e8, 1, -1e8, 1]: sequentially (1e8 + 1) rounds back to 1e8, so the sum is 1; with two
    // strided partials the large terms cancel in partial 0 and the ones meet in partial 1.
    let a = [1e8f32, 1.0, -1e8, 1.0];
    let ones = [1.0f32; 4];
    assert_eq!(
        f32::from_bits(dot(ReduceOrder::Sequential, &a, &ones)[0]),
        1.0
    );
    assert_eq!(
        f32::from_bits(dot(ReduceOrder::Strided(2), &a, &ones)[0]),
        2.0
    );
    // With 4 partials each element is alone; the tree adds (1e8 + -1e8) + (1 + 1) = 2.
    assert_eq!(
        f32::from_bits(dot(ReduceOrder::Strided(4), &a, &ones)[0]),
        2.0
    );
}

#[test]
fn accumulate_fuses_each_product() {
    // x = 1 + 2^-12: x*x = 1 + 2^-11 + 2^-24 exactly; rounded alone it loses the 2^-24.
    let x = 1.0f32 + f32::powi(2.0, -12);
    let a = [1.0f32, x];
    let b = [-(1.0 + f32::powi(2.0, -11)), x];
    let got = f32::from_bits(dot(ReduceOrder::Sequential, &a, &b)[0]);
    assert_eq!(got, f32::powi(2.0, -24), "fma keeps the low product bits");
}

#[test]
fn accumulate_empty_and_signed_zero() {
    // Empty: -0.0 for every accumulator.
    assert_eq!(dot(ReduceOrder::Strided(8), &[], &[]), [0x8000_0000; 2]);
    // All products -0: the partials stay -0.
    let r = dot(
        ReduceOrder::Strided(2),
        &[-0.0, 0.0, -0.0],
        &[1.0, -1.0, 2.0],
    );
    assert_eq!(r[0], 0x8000_0000);
    // A +0 product turns a -0 partial into +0.
    let r = dot(ReduceOrder::Sequential, &[0.0], &[1.0]);
    assert_eq!(r[0], 0);
}

#[test]
fn accumulate_matches_the_model_on_many_lengths_and_orders() {
    let mut seed = 0x1234_5678u32;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        seed
    };
    for len in [1usize, 3, 7, 8, 9, 31, 33, 100] {
        let a: Vec<f32> = (0..len)
            .map(|_| (next() % 2001) as f32 * 0.37 - 370.0)
            .collect();
        let b: Vec<f32> = (0..len)
            .map(|i| match i % 5 {
                0 => f32::from_bits(next() % 0x0080_0000), // subnormal
                1 => 1e30,
                _ => (next() % 1000) as f32 * 1e-3 - 0.5,
            })
            .collect();
        for (order, ways) in [
            (ReduceOrder::Sequential, 1),
            (ReduceOrder::Strided(2), 2),
            (ReduceOrder::Strided(8), 8),
            (ReduceOrder::Strided(64), 64),
        ] {
            let got = dot(order, &a, &b);
            assert_eq!(got[0], model(ways, &a, &b), "len {len} ways {ways}");
            assert_eq!(
                got[1],
                model(ways, &b, &vec![1.0; len]),
                "len {len} ways {ways}"
            );
        }
    }
    // NaN and inf propagate as in IEEE arithmetic.
    let r = dot(
        ReduceOrder::Strided(2),
        &[f32::INFINITY, 1.0, 0.0],
        &[1.0, 1.0, f32::INFINITY],
    );
    assert!(f32::from_bits(r[0]).is_nan(), "0 * inf is NaN");
}
