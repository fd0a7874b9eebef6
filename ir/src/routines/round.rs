//! Rounding an `f32` value to `f16` or `bf16` (round to nearest, ties to even) and widening it
//! back, written with integer ops so every backend computes it identically. The result equals
//! storing with `rne` into an `f16`/`bf16` buffer and loading it again (NaN stays a NaN; its
//! payload is free, as everywhere in the numeric contract).

use crate::builder::KernelBuilder;
use crate::kernel::Value;
use crate::ops::{BinaryOp, CmpOp};
use crate::types::{DType, Rounding, ScalarType};

/// `v` rounded to `dtype` and widened back to `f32` (`f32` and every other dtype: `v`).
pub fn round_to(b: &mut KernelBuilder, v: Value, dtype: DType) -> Value {
    match dtype {
        DType::BF16 => round_bf16(b, v),
        DType::F16 => round_f16(b, v),
        _ => v,
    }
}

/// bf16 keeps the f32 exponent: add `0x7FFF + lsb` to the bits and clear the low 16.
fn round_bf16(b: &mut KernelBuilder, v: Value) -> Value {
    let bits = b.bitcast(v, ScalarType::U32);
    let sixteen = b.const_u32(16);
    let one = b.const_u32(1);
    let hi = b.shr(bits, sixteen);
    let lsb = b.and(hi, one);
    let half = b.const_u32(0x7FFF);
    let biased = b.add(bits, half);
    let biased = b.add(biased, lsb);
    let mask = b.const_u32(0xFFFF_0000);
    let rounded = b.and(biased, mask);
    let r = b.bitcast(rounded, ScalarType::F32);
    let nan = b.cmp(CmpOp::Ne, v, v);
    b.select(nan, v, r)
}

/// f16: normal results round the f32 bits at bit 13 (a carry may reach 2^16, which is inf);
/// results below 2^-14 are multiples of 2^-24, found by rounding `|v| * 2^24` to an integer.
fn round_f16(b: &mut KernelBuilder, v: Value) -> Value {
    let bits = b.bitcast(v, ScalarType::U32);
    let sign_mask = b.const_u32(0x8000_0000);
    let sign = b.and(bits, sign_mask);
    let abs_mask = b.const_u32(0x7FFF_FFFF);
    let abs = b.and(bits, abs_mask);
    // Normal range: round at bit 13, ties to even.
    let thirteen = b.const_u32(13);
    let one = b.const_u32(1);
    let low = b.shr(abs, thirteen);
    let lsb = b.and(low, one);
    let half = b.const_u32(0xFFF);
    let biased = b.add(abs, half);
    let biased = b.add(biased, lsb);
    let keep = b.const_u32(!0x1FFF);
    let normal = b.and(biased, keep);
    let two16 = b.const_u32(0x4780_0000); // 65536.0: the rounding overflowed f16
    let inf = b.const_u32(0x7F80_0000);
    let overflow = b.cmp(CmpOp::Ge, normal, two16);
    let normal = b.select(overflow, inf, normal);
    // Below 2^-14: a multiple of 2^-24 (the scaling by 2^24 and back is exact).
    let absf = b.bitcast(abs, ScalarType::F32);
    let up = b.const_f32(16_777_216.0);
    let scaled = b.mul(absf, up);
    let q = b.float_to_int(scaled, ScalarType::U32, Rounding::NearestEven);
    let qf = b.int_to_float(q);
    let down = b.const_f32(1.0 / 16_777_216.0);
    let sub = b.mul(qf, down);
    let sub = b.bitcast(sub, ScalarType::U32);
    let min_normal = b.const_u32(0x3880_0000); // 2^-14
    let is_sub = b.cmp(CmpOp::Lt, abs, min_normal);
    let mag = b.select(is_sub, sub, normal);
    let signed = b.binary(BinaryOp::Or, mag, sign);
    let r = b.bitcast(signed, ScalarType::F32);
    let nan = b.cmp(CmpOp::Ne, v, v);
    b.select(nan, v, r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::OwnedArg;
    use crate::kernel::{Access, Dim};
    use crate::types::Scalar;

    fn run(dtype: DType, xs: &[u32]) -> Vec<u32> {
        let mut b = KernelBuilder::new("round");
        let n = b.scalar_param("n", ScalarType::U32);
        let x = b.buffer_param("x", DType::F32, &[Dim::Param(n)], Access::Read);
        let y = b.buffer_param("y", DType::F32, &[Dim::Param(n)], Access::Write);
        b.set_grid(Dim::Param(n));
        let i = b.work_item();
        let v = b.load(x, i);
        let r = round_to(&mut b, v, dtype);
        b.store(y, i, r);
        let k = b.finish();
        crate::verify(&k).unwrap();
        let mut args = vec![
            OwnedArg::Scalar(Scalar::U32(xs.len() as u32)),
            OwnedArg::Read(xs.iter().flat_map(|v| v.to_le_bytes()).collect()),
            OwnedArg::Write(vec![0; 4 * xs.len()]),
        ];
        crate::interp::run(&k, &mut OwnedArg::borrow_all(&mut args)).unwrap();
        match &args[2] {
            OwnedArg::Write(o) => o
                .chunks(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            _ => unreachable!(),
        }
    }

    /// Bit patterns: a stride through all of them, plus every boundary of both formats.
    fn patterns() -> Vec<u32> {
        let mut xs: Vec<u32> = (0..=u32::MAX).step_by(9973).collect();
        for base in [
            0x3880_0000u32,
            0x477F_E000,
            0x477F_F000,
            0x3300_0000,
            0x7F7F_FFFF,
            0x0080_0000,
            1,
            0x7F80_0000,
            0x7FC0_0001,
        ] {
            for d in 0..4200u32 {
                for s in [0, 0x8000_0000] {
                    xs.push(base.wrapping_add(d).wrapping_sub(2100) | s);
                }
            }
        }
        xs
    }

    #[test]
    fn library_round_to_bf16_and_f16_equals_the_half_crate() {
        let xs = patterns();
        for (dtype, want) in [
            (
                DType::BF16,
                xs.iter()
                    .map(|x| half::bf16::from_f32(f32::from_bits(*x)).to_f32().to_bits())
                    .collect::<Vec<_>>(),
            ),
            (
                DType::F16,
                xs.iter()
                    .map(|x| half::f16::from_f32(f32::from_bits(*x)).to_f32().to_bits())
                    .collect(),
            ),
        ] {
            let got = run(dtype, &xs);
            for ((x, g), w) in xs.iter().zip(&got).zip(&want) {
                let same = g == w || (f32::from_bits(*g).is_nan() && f32::from_bits(*w).is_nan());
                assert!(same, "{dtype}: {x:#010x} -> {g:#010x}, want {w:#010x}");
            }
        }
    }
}
