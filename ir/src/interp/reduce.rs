//! `Op::Reduce`: sums in the named order and NaN-aware absolute maxima over a range of a float
//! buffer, decoding elements straight from the bytes.

use crate::ops::{NanMode, ReduceKind, ReduceOrder};
use crate::types::DType;

/// Reduces the little-endian elements in `bytes` (a whole number of `dtype` elements, a float
/// dtype) to the `f32` bits of the result, exactly as [`ReduceKind`] and [`ReduceOrder`] say.
pub(super) fn reduce(kind: ReduceKind, order: ReduceOrder, dtype: DType, bytes: &[u8]) -> u32 {
    match dtype {
        DType::F32 => over(
            kind,
            order,
            bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        ),
        DType::F16 => over(
            kind,
            order,
            bytes
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()),
        ),
        DType::BF16 => over(
            kind,
            order,
            bytes
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()),
        ),
        // Not float buffers: the verifier rejects a reduce over them; decode their widened bits.
        DType::U8 | DType::I8 | DType::I32 | DType::U32 => {
            let size = dtype.size_bytes();
            let n = bytes.len() / size;
            over(
                kind,
                order,
                (0..n).map(|i| f32::from_bits(super::memory::decode(dtype, bytes, i))),
            )
        }
    }
}

fn over(kind: ReduceKind, order: ReduceOrder, xs: impl Iterator<Item = f32>) -> u32 {
    match kind {
        ReduceKind::Sum => match order {
            ReduceOrder::Sequential => xs.fold(-0.0f32, |acc, x| acc + x).to_bits(),
            ReduceOrder::Strided(ways) => strided_sum(ways, xs),
        },
        ReduceKind::AbsMax(nan) => abs_max(nan, xs),
    }
}

/// `ways` accumulators filled round robin, then the fixed halving tree of [`ReduceOrder`].
fn strided_sum(ways: u32, xs: impl Iterator<Item = f32>) -> u32 {
    // The verifier keeps `ways` a power of two in 2..=64; clamp so nothing here can index out.
    let ways = (ways as usize).clamp(1, 64);
    let mut acc = [-0.0f32; 64];
    let mut lane = 0;
    for x in xs {
        acc[lane] += x;
        lane += 1;
        if lane == ways {
            lane = 0;
        }
    }
    let mut w = ways;
    while w > 1 {
        w /= 2;
        for j in 0..w {
            acc[j] += acc[j + w];
        }
    }
    acc[0].to_bits()
}

/// `max |x|` from `+0.0`: a NaN either makes the result NaN or is skipped.
fn abs_max(nan: NanMode, xs: impl Iterator<Item = f32>) -> u32 {
    let mut acc = 0.0f32;
    for x in xs {
        let a = x.abs();
        if a > acc {
            acc = a;
        } else if a.is_nan() {
            match nan {
                NanMode::Propagate => return f32::NAN.to_bits(),
                NanMode::Ignore => {}
            }
        }
    }
    acc.to_bits()
}
