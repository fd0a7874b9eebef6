//! Loads (exact widening), stores (rounding and truncation) and reductions.

use qforge_ir::{Error, NanMode, Op, ReduceKind, ReduceOrder, Scalar};

use super::*;

// ----- loads and stores -----

/// `out[i] = load(in[i])` from an `inp` buffer of `dtype` into a buffer of its value type.
fn widen(dtype: DType, input: Vec<u8>) -> Vec<u32> {
    let n = (input.len() / dtype.size_bytes()) as u32;
    let mut k = KernelBuilder::new("widen");
    let inp = k.buffer_param("inp", dtype, &[Dim::Const(n)], Access::Read);
    let out = k.buffer_param(
        "out",
        dtype_of(dtype.value_type()),
        &[Dim::Const(n)],
        Access::Write,
    );
    k.set_grid(Dim::Const(n));
    let i = k.work_item();
    let v = k.load(inp, i);
    k.store(out, i, v);
    let args = run(
        &k.finish(),
        vec![
            OwnedArg::Read(input),
            OwnedArg::Write(vec![0; n as usize * 4]),
        ],
    );
    words(out_bytes(&args[1]))
}

#[test]
fn loads_widen_exactly() {
    // f16: smallest subnormal 2^-24, largest subnormal 1023 * 2^-24, max 65504, 1, -2, -0, ±inf,
    // a quiet and a signalling NaN, -2^-24.
    let h = [
        0x0001u16, 0x03FF, 0x7BFF, 0x3C00, 0xC000, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0x7C01, 0x8001,
    ];
    let want = [
        0x3380_0000u32,
        0x387F_C000,
        65504.0f32.to_bits(),
        0x3F80_0000,
        0xC000_0000,
        0x8000_0000,
        0x7F80_0000,
        0xFF80_0000,
        0x7FC0_0000,
        0x7FC0_0000,
        0xB380_0000,
    ];
    let labels: Vec<String> = h.iter().map(|x| format!("f16 {x:#06x}")).collect();
    assert_f32s("load", &labels, &widen(DType::F16, le16(&h)), &want);
    // bf16 is the top half of an f32: widening is a shift, NaNs stay NaNs, subnormals stay.
    let h = [0x0001u16, 0x3F80, 0xFF80, 0x7F81, 0x8000, 0x7F7F, 0x0080];
    let want = [
        0x0001_0000u32,
        0x3F80_0000,
        0xFF80_0000,
        0x7FC0_0000,
        0x8000_0000,
        0x7F7F_0000,
        0x0080_0000,
    ];
    let labels: Vec<String> = h.iter().map(|x| format!("bf16 {x:#06x}")).collect();
    assert_f32s("load", &labels, &widen(DType::BF16, le16(&h)), &want);
    // u8 zero-extends, i8 sign-extends.
    let bytes = vec![0u8, 1, 127, 128, 255];
    assert_eq!(widen(DType::U8, bytes.clone()), [0, 1, 127, 128, 255]);
    assert_eq!(widen(DType::I8, bytes), i32s(&[0, 1, 127, -128, -1]));
    // 32-bit types pass through unchanged (NaN payload included).
    let w = [0x7FC0_1234u32, 0xFFFF_FFFF, 0x8000_0000];
    assert_eq!(widen(DType::F32, le32(&w)), w);
    assert_eq!(widen(DType::I32, le32(&w)), w);
    assert_eq!(widen(DType::U32, le32(&w)), w);
}

/// `out[i] = narrow(in[i])` from 32-bit values into a `dtype` buffer; returns the output bytes.
/// The output starts filled with 0xAB so that writes outside an element would show.
fn narrow(dtype: DType, input: &[u32]) -> Vec<u8> {
    let n = input.len() as u32;
    let mut k = KernelBuilder::new("narrow");
    let inp = k.buffer_param(
        "inp",
        dtype_of(dtype.value_type()),
        &[Dim::Const(n)],
        Access::Read,
    );
    let out = k.buffer_param("out", dtype, &[Dim::Const(n)], Access::Write);
    k.set_grid(Dim::Const(n));
    let i = k.work_item();
    let v = k.load(inp, i);
    k.store_auto(out, i, v);
    let args = vec![
        OwnedArg::Read(le32(input)),
        OwnedArg::Write(vec![0xAB; n as usize * dtype.size_bytes()]),
    ];
    out_bytes(&run(&k.finish(), args)[1]).to_vec()
}

#[test]
fn f16_stores_round_to_nearest_even() {
    let p = |e: i32| 2f32.powi(e);
    let cases: &[(f32, u16)] = &[
        (1.0 + p(-11), 0x3C00),          // tie between 1 and 1 + 2^-10: even is 1
        (1.0 + 3.0 * p(-11), 0x3C02),    // tie between 1 + 2^-10 (odd) and 1 + 2^-9
        (1.0 + p(-11) + p(-20), 0x3C01), // just above the tie
        (65504.0, 0x7BFF),
        (65519.0, 0x7BFF), // below the midpoint 65520
        (65520.0, 0x7C00), // the midpoint: ties to even, which is +inf
        (-65520.0, 0xFC00),
        (1e10, 0x7C00),
        (f32::INFINITY, 0x7C00),
        (f32::NEG_INFINITY, 0xFC00),
        (-0.0, 0x8000),
        (p(-14), 0x0400),          // smallest normal
        (p(-24), 0x0001),          // smallest subnormal
        (p(-25), 0x0000),          // tie between 0 and 2^-24: even is 0
        (p(-25) + p(-40), 0x0001), // above the tie
        (3.0 * p(-25), 0x0002),    // tie between 2^-24 (odd) and 2^-23
        (-p(-26), 0x8000),         // underflows to -0
        (f32::from_bits(1), 0x0000),
    ];
    let input: Vec<u32> = cases.iter().map(|c| c.0.to_bits()).collect();
    let got = halves(&narrow(DType::F16, &input));
    for (i, c) in cases.iter().enumerate() {
        assert_eq!(got[i], c.1, "f32 {:e} -> f16", c.0);
    }
    // NaN stays NaN (exponent all ones, mantissa not zero), signalling or quiet.
    let got = halves(&narrow(
        DType::F16,
        &[0x7FC0_0000, 0x7F80_0001, 0xFFC0_0000],
    ));
    for h in got {
        assert!(
            h & 0x7C00 == 0x7C00 && h & 0x03FF != 0,
            "NaN became {h:#06x}"
        );
    }
}

#[test]
fn bf16_stores_round_to_nearest_even() {
    let cases: &[(u32, u16)] = &[
        (0x3F80_8000, 0x3F80), // 1 + 2^-8: tie, even is 1
        (0x3F81_8000, 0x3F82), // 1 + 3*2^-8: tie, even is above
        (0x3F80_8001, 0x3F81), // above the tie
        (0x3F80_7FFF, 0x3F80), // below the tie
        (0x7F7F_FFFF, 0x7F80), // f32::MAX rounds to +inf
        (0x7F7F_7FFF, 0x7F7F), // stays the largest finite bf16
        (0x7F7F_8000, 0x7F80), // tie with odd last bit: to +inf
        (0xFF7F_FFFF, 0xFF80),
        (0x8000_0000, 0x8000), // -0
        (0x0000_8000, 0x0000), // subnormal tie to even (0)
        (0x0001_8000, 0x0002), // subnormal tie to even (2)
        (0x7F80_0000, 0x7F80), // inf
    ];
    let input: Vec<u32> = cases.iter().map(|c| c.0).collect();
    let got = halves(&narrow(DType::BF16, &input));
    for (i, c) in cases.iter().enumerate() {
        assert_eq!(got[i], c.1, "f32 {:#010x} -> bf16", c.0);
    }
    // A NaN whose payload sits only in the low 16 bits must not truncate to inf.
    let got = halves(&narrow(
        DType::BF16,
        &[0x7F80_0001, 0xFF80_0001, 0x7FC0_0000],
    ));
    for h in got {
        assert!(
            h & 0x7F80 == 0x7F80 && h & 0x007F != 0,
            "NaN became {h:#06x}"
        );
    }
}

#[test]
fn byte_stores_keep_the_low_8_bits() {
    assert_eq!(
        narrow(DType::U8, &[0x1FF, 256, 255, 0x1234_5678]),
        [0xFF, 0x00, 0xFF, 0x78]
    );
    assert_eq!(
        narrow(DType::I8, &i32s(&[-1, 200, -129, -128, 127])),
        [0xFF, 0xC8, 0x7F, 0x80, 0x7F]
    );
    // 32-bit stores write the exact bits, little endian.
    assert_eq!(narrow(DType::U32, &[0x1234_5678]), [0x78, 0x56, 0x34, 0x12]);
}

#[test]
fn stores_touch_only_their_element_and_readwrite_works_in_place() {
    // Write every other f16 element of a Write buffer: the others keep their initial bytes.
    let mut k = KernelBuilder::new("sparse");
    let out = k.buffer_param("out", DType::F16, &[Dim::Const(6)], Access::Write);
    let state = k.buffer_param("state", DType::F32, &[Dim::Const(3)], Access::ReadWrite);
    k.set_grid(Dim::Const(3));
    let i = k.work_item();
    let two = k.const_u32(2);
    let j = k.mul(i, two);
    let one = k.const_f32(1.0);
    k.store_auto(out, j, one);
    let s = k.load(state, i);
    let twice = k.add(s, s);
    k.store(state, i, twice);
    let args = run(
        &k.finish(),
        vec![
            OwnedArg::Write(vec![0xAB; 12]),
            OwnedArg::Write(le32(&f32s(&[1.5, -3.0, 1e38]))),
        ],
    );
    assert_eq!(
        halves(out_bytes(&args[0])),
        [0x3C00, 0xABAB, 0x3C00, 0xABAB, 0x3C00, 0xABAB]
    );
    assert_eq!(words(out_bytes(&args[1])), f32s(&[3.0, -6.0, 2e38]));
}

// ----- reductions -----

/// Runs one `reduce` over `data` (elements of `dtype`) from `start`, `len` elements.
fn reduce(
    dtype: DType,
    data: Vec<u8>,
    start: u32,
    len: u32,
    kind: ReduceKind,
    order: ReduceOrder,
) -> qforge_ir::Result<u32> {
    let n = (data.len() / dtype.size_bytes()) as u32;
    let mut k = KernelBuilder::new("reduce");
    let x = k.buffer_param("x", dtype, &[Dim::Const(n)], Access::Read);
    let ps = k.scalar_param("start", ScalarType::U32);
    let pl = k.scalar_param("len", ScalarType::U32);
    let out = k.buffer_param("out", DType::F32, &[Dim::Const(1)], Access::Write);
    let (s, l) = (k.param(ps), k.param(pl));
    let r = k.op(Op::Reduce {
        kind,
        buf: x,
        start: s,
        len: l,
        order,
    });
    let zero = k.const_u32(0);
    k.store(out, zero, r);
    let kernel = k.finish();
    let mut args = vec![
        OwnedArg::Read(data),
        OwnedArg::Scalar(Scalar::U32(start)),
        OwnedArg::Scalar(Scalar::U32(len)),
        OwnedArg::Write(vec![0; 4]),
    ];
    try_run(&kernel, &mut args)?;
    Ok(words(out_bytes(&args[3]))[0])
}

fn sum(xs: &[f32], order: ReduceOrder) -> f32 {
    let bits = reduce(
        DType::F32,
        le32(&f32s(xs)),
        0,
        xs.len() as u32,
        ReduceKind::Sum,
        order,
    )
    .unwrap();
    f32::from_bits(bits)
}

#[test]
fn sum_order_is_exactly_the_named_one() {
    use ReduceOrder::*;
    // 1e8 has an ulp of 8, so 1e8 + 1 rounds back to 1e8.
    // Sequential: ((1e8 + 1) - 1e8) + 1 = 1. Strided(4): acc = [1e8, 1, -1e8, 1], tree
    // (1e8 + -1e8) + (1 + 1) = 2. Strided(2): acc0 = 1e8 - 1e8 = 0, acc1 = 1 + 1 = 2 -> 2.
    let xs = [1e8f32, 1.0, -1e8, 1.0];
    assert_eq!(sum(&xs, Sequential), 1.0);
    assert_eq!(sum(&xs, Strided(4)), 2.0);
    assert_eq!(sum(&xs, Strided(2)), 2.0);
    // The tree pairs acc[j] with acc[j + w]: acc = [1e8, -1e8, 1, 1] gives
    // (1e8 + 1) + (-1e8 + 1) = 1e8 - 1e8 = 0, where neighbour pairing or a sequential sum gives 2.
    let ys = [1e8f32, -1e8, 1.0, 1.0];
    assert_eq!(sum(&ys, Strided(4)).to_bits(), 0);
    assert_eq!(sum(&ys, Sequential), 2.0);
    // A length that is not a multiple of the ways: element 4 goes to acc0.
    // acc = [1e8 + -1e8, 1, 1, 1] = [0, 1, 1, 1] -> (0 + 1) + (1 + 1) = 3; sequential gives 0.
    let zs = [1e8f32, 1.0, 1.0, 1.0, -1e8];
    assert_eq!(sum(&zs, Strided(4)), 3.0);
    assert_eq!(sum(&zs, Sequential), 0.0);
    // 64 ways over 130 elements: lanes 0 and 1 get three elements, the rest two; all small
    // integers, so every order gives the exact sum.
    let big: Vec<f32> = (0..130).map(|i| i as f32).collect();
    assert_eq!(sum(&big, Strided(64)), (0..130).sum::<i32>() as f32);
    assert_eq!(sum(&big, Strided(8)), 8385.0);
}

#[test]
fn sum_identity_is_negative_zero() {
    use ReduceOrder::*;
    for order in [Sequential, Strided(2), Strided(4), Strided(64)] {
        assert_eq!(
            sum(&[], order).to_bits(),
            0x8000_0000,
            "empty sum, {order:?}"
        );
        assert_eq!(
            sum(&[-0.0, -0.0, -0.0], order).to_bits(),
            0x8000_0000,
            "all -0, {order:?}"
        );
        assert_eq!(
            sum(&[-0.0, 0.0, -0.0], order).to_bits(),
            0,
            "one +0, {order:?}"
        );
        assert!(sum(&[1.0, f32::NAN, 2.0], order).is_nan());
        assert!(sum(&[f32::INFINITY, 1.0, f32::NEG_INFINITY], order).is_nan());
        assert_eq!(sum(&[f32::MAX, f32::MAX], order), f32::INFINITY);
    }
    // An empty range reads nothing, so even a start past the end is not an error.
    let r = reduce(
        DType::F32,
        le32(&[0; 4]),
        100,
        0,
        ReduceKind::Sum,
        Sequential,
    )
    .unwrap();
    assert_eq!(r, 0x8000_0000);
}

#[test]
fn sums_over_narrow_floats_and_subranges() {
    use ReduceOrder::*;
    // f16 [1, 2, 0.5, 65504] from element 1, 2 elements: 2 + 0.5.
    let h = le16(&[0x3C00, 0x4000, 0x3800, 0x7BFF]);
    let r = reduce(DType::F16, h.clone(), 1, 2, ReduceKind::Sum, Sequential).unwrap();
    assert_eq!(f32::from_bits(r), 2.5);
    // The sum is in f32, not f16: 65504 + 65504 is finite.
    let r = reduce(
        DType::F16,
        le16(&[0x7BFF, 0x7BFF]),
        0,
        2,
        ReduceKind::Sum,
        Strided(2),
    )
    .unwrap();
    assert_eq!(f32::from_bits(r), 131_008.0);
    // bf16 [1, -2, 3] (0x3F80, 0xC000, 0x4040).
    let r = reduce(
        DType::BF16,
        le16(&[0x3F80, 0xC000, 0x4040]),
        0,
        3,
        ReduceKind::Sum,
        Sequential,
    )
    .unwrap();
    assert_eq!(f32::from_bits(r), 2.0);
}

#[test]
fn absmax_propagates_or_ignores_nan() {
    let run_am = |xs: &[f32], nan: NanMode| {
        reduce(
            DType::F32,
            le32(&f32s(xs)),
            0,
            xs.len() as u32,
            ReduceKind::AbsMax(nan),
            ReduceOrder::Sequential,
        )
        .map(f32::from_bits)
        .unwrap()
    };
    use NanMode::*;
    let xs = [1.0f32, -3.0, f32::NAN, 2.0];
    assert!(run_am(&xs, Propagate).is_nan());
    assert_eq!(run_am(&xs, Ignore), 3.0);
    assert!(run_am(&[f32::NAN, 5.0], Propagate).is_nan());
    assert!(run_am(&[5.0, -f32::NAN], Propagate).is_nan());
    assert_eq!(
        run_am(&[f32::NEG_INFINITY, f32::NAN], Ignore),
        f32::INFINITY
    );
    assert_eq!(run_am(&[f32::NAN], Ignore).to_bits(), 0, "only NaNs: +0.0");
    assert_eq!(run_am(&[], Propagate).to_bits(), 0, "empty: +0.0");
    assert_eq!(run_am(&[-0.0, -0.0], Ignore).to_bits(), 0, "|-0| = +0");
    assert_eq!(run_am(&[-5.0, -2.0], Propagate), 5.0);
    assert_eq!(
        run_am(&[f32::from_bits(0x8000_0001)], Propagate).to_bits(),
        1,
        "subnormal kept"
    );
    // Over f16: |-65504| is the max.
    let r = reduce(
        DType::F16,
        le16(&[0x3C00, 0xFBFF, 0x7E00]),
        0,
        2,
        ReduceKind::AbsMax(Propagate),
        ReduceOrder::Sequential,
    );
    assert_eq!(f32::from_bits(r.unwrap()), 65504.0);
}

#[test]
fn reduce_out_of_bounds_is_an_error() {
    let data = le32(&[0; 8]);
    let err = reduce(
        DType::F32,
        data.clone(),
        6,
        4,
        ReduceKind::Sum,
        ReduceOrder::Sequential,
    )
    .unwrap_err();
    let Error::Execution {
        work_item, message, ..
    } = err
    else {
        panic!("wrong error {err:?}")
    };
    assert_eq!(work_item, 0);
    assert!(
        message.contains("'x'") && message.contains("6..10") && message.contains("length 8"),
        "{message}"
    );
    // start + len overflowing u32 is reported, not wrapped around or panicking.
    let err = reduce(
        DType::F32,
        data,
        u32::MAX,
        2,
        ReduceKind::AbsMax(NanMode::Ignore),
        ReduceOrder::Sequential,
    );
    assert!(matches!(err, Err(Error::Execution { .. })), "{err:?}");
}
