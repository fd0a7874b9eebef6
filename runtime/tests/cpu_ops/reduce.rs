//! Reductions: sums in their stated order, absmax with both NaN modes, over f32/f16/bf16.

use super::*;

/// `y[q] = reduce(x[starts[q] .. starts[q] + lens[q]])` for each query `q`.
fn reduce_kernel(
    name: &str,
    dtype: DType,
    f: impl FnOnce(&mut KernelBuilder, ParamId, Value, Value) -> Value,
) -> Kernel {
    let mut b = KernelBuilder::new(name);
    let n = b.scalar_param("n", ScalarType::U32);
    let q = b.scalar_param("q", ScalarType::U32);
    let x = b.buffer_param("x", dtype, &[Dim::Param(n)], Access::Read);
    let starts = b.buffer_param("starts", DType::U32, &[Dim::Param(q)], Access::Read);
    let lens = b.buffer_param("lens", DType::U32, &[Dim::Param(q)], Access::Read);
    let y = b.buffer_param("y", DType::F32, &[Dim::Param(q)], Access::Write);
    b.set_grid(Dim::Param(q));
    let i = b.work_item();
    let s = b.load(starts, i);
    let l = b.load(lens, i);
    let r = f(&mut b, x, s, l);
    b.store(y, i, r);
    b.finish()
}

fn ref_sum(x: &[f32], order: ReduceOrder) -> f32 {
    match order {
        ReduceOrder::Sequential => x.iter().fold(-0.0, |a, v| a + v),
        ReduceOrder::Strided(ways) => {
            let mut acc = vec![-0.0f32; ways as usize];
            for (i, v) in x.iter().enumerate() {
                acc[i % ways as usize] += v;
            }
            let mut w = ways as usize;
            while w > 1 {
                w /= 2;
                for j in 0..w {
                    acc[j] += acc[j + w];
                }
            }
            acc[0]
        }
    }
}

fn ref_absmax(x: &[f32], nan: NanMode) -> f32 {
    if nan == NanMode::Propagate && x.iter().any(|v| v.is_nan()) {
        return f32::NAN;
    }
    x.iter()
        .filter(|v| !v.is_nan())
        .fold(0.0, |a, v| if v.abs() > a { v.abs() } else { a })
}

/// 200 values of mixed magnitude and sign (so that the summation order shows), a run of -0.0,
/// NaNs at 20 and 100, -inf at 50 (for absmax only), stored as `dtype`; returns the bytes and
/// the exactly widened values.
fn reduce_data(dtype: DType, specials: bool) -> (Vec<u8>, Vec<f32>) {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let max_exp: i32 = if dtype == DType::F32 { 30 } else { 8 };
    let mut x: Vec<f32> = (0..200)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let r = (state >> 33) as u32;
            let exp = (r % (2 * max_exp + 1) as u32) as i32 - max_exp;
            let sign = if r & (1 << 20) != 0 { -1.0 } else { 1.0 };
            sign * (1.0 + (r >> 21) as f32 / 2048.0) * 2f32.powi(exp)
        })
        .collect();
    x[150..160].fill(-0.0);
    if specials {
        x[20] = f32::NAN;
        x[100] = -f32::NAN;
        x[50] = f32::NEG_INFINITY;
    }
    let t = qforge_runtime::HostTensor::from_f32_as(dtype, vec![x.len()], &x).expect("float dtype");
    let widened = t.to_f32().expect("float dtype");
    (t.data, widened)
}

#[rustfmt::skip]
const QUERIES: [(u32, u32); 14] = [
    (0, 0), (5, 0), (200, 0), (0, 1), (3, 3), (0, 4), (1, 7),
    (0, 64), (2, 65), (0, 130), (7, 129), (150, 10), (0, 200), (60, 33),
];

fn run_reduce(kernel: &Kernel, data: &[u8], n: usize) -> Vec<f32> {
    let (starts, lens): (Vec<u32>, Vec<u32>) = QUERIES.iter().copied().unzip();
    let args = vec![
        OwnedArg::Scalar(Scalar::U32(n as u32)),
        OwnedArg::Scalar(Scalar::U32(QUERIES.len() as u32)),
        OwnedArg::Read(data.to_vec()),
        OwnedArg::Read(le_u32(&starts)),
        OwnedArg::Read(le_u32(&lens)),
        OwnedArg::Write(vec![0; 4 * QUERIES.len()]),
    ];
    match run(kernel, args).pop() {
        Some(OwnedArg::Write(b)) => f32s(&b),
        other => panic!("unexpected output {other:?}"),
    }
}

#[test]
fn sums_follow_their_order_exactly() {
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let (bytes, x) = reduce_data(dtype, false);
        let orders = [
            ReduceOrder::Sequential,
            ReduceOrder::Strided(2),
            ReduceOrder::Strided(4),
            ReduceOrder::Strided(8),
            ReduceOrder::Strided(32),
            ReduceOrder::Strided(64),
        ];
        for order in orders {
            let k = reduce_kernel(&format!("sum_{}", dtype.name()), dtype, |b, x, s, l| {
                b.reduce_sum(x, s, l, order)
            });
            let got = run_reduce(&k, &bytes, x.len());
            for (q, (s, l)) in QUERIES.iter().enumerate() {
                let want = ref_sum(&x[*s as usize..(*s + *l) as usize], order);
                assert_eq!(
                    got[q].to_bits(),
                    want.to_bits(),
                    "{dtype} sum {order:?} of [{s}; {l}]: {} vs {want}",
                    got[q]
                );
            }
        }
    }
    // The order matters on this data: sequential and 8-way differ somewhere.
    let (_, x) = reduce_data(DType::F32, false);
    assert_ne!(
        ref_sum(&x, ReduceOrder::Sequential).to_bits(),
        ref_sum(&x, ReduceOrder::Strided(8)).to_bits()
    );
}

#[test]
fn absmax_propagates_or_ignores_nan() {
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let (bytes, x) = reduce_data(dtype, true);
        for nan in [NanMode::Propagate, NanMode::Ignore] {
            let k = reduce_kernel(&format!("absmax_{}", dtype.name()), dtype, |b, x, s, l| {
                b.reduce_absmax(x, s, l, nan)
            });
            let got = run_reduce(&k, &bytes, x.len());
            for (q, (s, l)) in QUERIES.iter().enumerate() {
                let want = ref_absmax(&x[*s as usize..(*s + *l) as usize], nan);
                assert!(
                    same(got[q], want),
                    "{dtype} absmax {nan:?} of [{s}; {l}]: {} vs {want}",
                    got[q]
                );
            }
        }
    }
}
