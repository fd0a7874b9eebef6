//! The scalar semantics of every arithmetic, comparison and conversion op on raw 32-bit
//! patterns (`f32` as its IEEE bits, `i32` as two's complement, `bool` as 0 or 1). These
//! functions are the letter of the doc comments in `ops.rs`; the interpreter calls them and a
//! constant folder may too.
//!
//! Each takes the operand type the verifier established. For a type the op is not defined on
//! (which a verified kernel never contains) the result is unspecified but there is no panic.

use crate::ops::{BinaryOp, CmpOp, UnaryOp};
use crate::types::{Rounding, ScalarType};

const SIGN: u32 = 0x8000_0000;

#[inline]
fn f(bits: u32) -> f32 {
    f32::from_bits(bits)
}

/// `op a` on an operand of type `ty`, as raw bits.
#[inline]
pub fn eval_unary(op: UnaryOp, ty: ScalarType, a: u32) -> u32 {
    use ScalarType::*;
    match (op, ty) {
        (UnaryOp::Neg, F32) => a ^ SIGN,
        (UnaryOp::Neg, U32 | I32 | Bool) => a.wrapping_neg(),
        (UnaryOp::Abs, F32) => a & !SIGN,
        (UnaryOp::Abs, I32) => (a as i32).wrapping_abs() as u32,
        (UnaryOp::Abs, U32 | Bool) => a,
        (UnaryOp::Sqrt, _) => f(a).sqrt().to_bits(),
        (UnaryOp::Not, Bool) => (a == 0) as u32,
        (UnaryOp::Not, U32 | I32 | F32) => !a,
    }
}

/// `a op b` on two operands of type `ty`, as raw bits.
#[inline]
pub fn eval_binary(op: BinaryOp, ty: ScalarType, a: u32, b: u32) -> u32 {
    match ty {
        ScalarType::F32 => binary_f32(op, a, b),
        ScalarType::I32 => binary_i32(op, a as i32, b as i32) as u32,
        ScalarType::U32 | ScalarType::Bool => binary_u32(op, a, b),
    }
}

#[inline]
fn binary_f32(op: BinaryOp, a: u32, b: u32) -> u32 {
    let (x, y) = (f(a), f(b));
    match op {
        BinaryOp::Add => (x + y).to_bits(),
        BinaryOp::Sub => (x - y).to_bits(),
        BinaryOp::Mul => (x * y).to_bits(),
        BinaryOp::Div => (x / y).to_bits(),
        // select(b < a, b, a) / select(b > a, b, a): any comparison with NaN is false.
        BinaryOp::Min => {
            if y < x {
                b
            } else {
                a
            }
        }
        BinaryOp::Max => {
            if y > x {
                b
            } else {
                a
            }
        }
        // Not defined on f32 (the verifier rejects them): act on the bits.
        BinaryOp::Rem
        | BinaryOp::And
        | BinaryOp::Or
        | BinaryOp::Xor
        | BinaryOp::Shl
        | BinaryOp::Shr
        | BinaryOp::MulHi => binary_u32(op, a, b),
    }
}

#[inline]
fn binary_u32(op: BinaryOp, a: u32, b: u32) -> u32 {
    match op {
        BinaryOp::Add => a.wrapping_add(b),
        BinaryOp::Sub => a.wrapping_sub(b),
        BinaryOp::Mul => a.wrapping_mul(b),
        BinaryOp::Div => a.checked_div(b).unwrap_or(0),
        BinaryOp::Rem => a.checked_rem(b).unwrap_or(0),
        BinaryOp::Min => {
            if b < a {
                b
            } else {
                a
            }
        }
        BinaryOp::Max => {
            if b > a {
                b
            } else {
                a
            }
        }
        BinaryOp::And => a & b,
        BinaryOp::Or => a | b,
        BinaryOp::Xor => a ^ b,
        BinaryOp::Shl => a << (b & 31),
        BinaryOp::Shr => a >> (b & 31),
        BinaryOp::MulHi => ((u64::from(a) * u64::from(b)) >> 32) as u32,
    }
}

#[inline]
fn binary_i32(op: BinaryOp, a: i32, b: i32) -> i32 {
    match op {
        BinaryOp::Add => a.wrapping_add(b),
        BinaryOp::Sub => a.wrapping_sub(b),
        BinaryOp::Mul => a.wrapping_mul(b),
        // wrapping_div/rem give MIN / -1 = MIN and MIN % -1 = 0; only zero needs a case.
        BinaryOp::Div => {
            if b == 0 {
                0
            } else {
                a.wrapping_div(b)
            }
        }
        BinaryOp::Rem => {
            if b == 0 {
                0
            } else {
                a.wrapping_rem(b)
            }
        }
        BinaryOp::Min => {
            if b < a {
                b
            } else {
                a
            }
        }
        BinaryOp::Max => {
            if b > a {
                b
            } else {
                a
            }
        }
        BinaryOp::And => a & b,
        BinaryOp::Or => a | b,
        BinaryOp::Xor => a ^ b,
        BinaryOp::Shl => a << (b & 31),
        // Arithmetic shift on i32.
        BinaryOp::Shr => a >> (b & 31),
        BinaryOp::MulHi => ((i64::from(a) * i64::from(b)) >> 32) as i32,
    }
}

/// `a op b` for two operands of type `ty`: IEEE comparison for `f32` (false with a NaN except
/// `Ne`; `-0 == +0`), signed for `i32`, unsigned for `u32`, by value for `bool`.
#[inline]
pub fn eval_cmp(op: CmpOp, ty: ScalarType, a: u32, b: u32) -> bool {
    match ty {
        ScalarType::F32 => cmp(op, f(a), f(b)),
        ScalarType::I32 => cmp(op, a as i32, b as i32),
        ScalarType::U32 | ScalarType::Bool => cmp(op, a, b),
    }
}

#[inline]
fn cmp<T: PartialOrd>(op: CmpOp, a: T, b: T) -> bool {
    match op {
        CmpOp::Eq => a == b,
        CmpOp::Ne => a != b,
        CmpOp::Lt => a < b,
        CmpOp::Le => a <= b,
        CmpOp::Gt => a > b,
        CmpOp::Ge => a >= b,
    }
}

/// `a * b + c` on `f32` bits with a single rounding to nearest even.
#[inline]
pub fn eval_fma(a: u32, b: u32, c: u32) -> u32 {
    f(a).mul_add(f(b), f(c)).to_bits()
}

/// `f32` bits to `to` (`U32` or `I32`): round with `rounding`, saturate to the target range,
/// NaN gives 0.
#[inline]
pub fn eval_float_to_int(bits: u32, to: ScalarType, rounding: Rounding) -> u32 {
    let x = f(bits);
    let r = match rounding {
        Rounding::NearestEven => x.round_ties_even(),
        Rounding::TowardZero => x.trunc(),
        Rounding::Down => x.floor(),
        Rounding::Up => x.ceil(),
    };
    // Rust's float-to-int `as` saturates and maps NaN to 0.
    match to {
        ScalarType::I32 => r as i32 as u32,
        ScalarType::U32 | ScalarType::F32 | ScalarType::Bool => r as u32,
    }
}

/// An integer of type `from` (`U32` or `I32`, given as raw bits) to `f32` bits, rounded with
/// `rounding` when it is not representable.
#[inline]
pub fn eval_int_to_float(bits: u32, from: ScalarType, rounding: Rounding) -> u32 {
    // Every 32-bit integer is exact in f64, and `as f32` rounds to nearest even.
    let (exact, nearest) = match from {
        ScalarType::I32 => (bits as i32 as f64, bits as i32 as f32),
        ScalarType::U32 | ScalarType::F32 | ScalarType::Bool => (bits as f64, bits as f32),
    };
    let wide = nearest as f64;
    let r = match rounding {
        Rounding::NearestEven => nearest,
        Rounding::Down if wide > exact => nearest.next_down(),
        Rounding::Up if wide < exact => nearest.next_up(),
        Rounding::TowardZero if wide.abs() > exact.abs() => {
            if exact > 0.0 {
                nearest.next_down()
            } else {
                nearest.next_up()
            }
        }
        Rounding::Down | Rounding::Up | Rounding::TowardZero => nearest,
    };
    r.to_bits()
}
