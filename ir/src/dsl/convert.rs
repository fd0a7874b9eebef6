//! Explicit conversions (the kernel language converts nothing implicitly), written as methods in
//! kernels (`x.to_f32()`, `x.to_u32(Rounding::TowardZero)`, `x.to_bits()`, ...). Each is one IR
//! op; a build-time operand becomes a constant first.

use crate::builder::KernelBuilder;
use crate::types::{Rounding, ScalarType};

use super::arith::operand;
use super::value::{Lift, Operand, Val};

/// An integer operand (`u32` or `i32`).
#[diagnostic::on_unimplemented(
    message = "`.to_f32()` converts an integer (`u32`/`i32`), not `{Self}`",
    note = "an `f32` needs no conversion; a `bool` converts with `select(b, 1.0, 0.0)`"
)]
pub trait IntOperand: Operand {}
impl IntOperand for Val<u32> {}
impl IntOperand for Val<i32> {}
impl IntOperand for u32 {}
impl IntOperand for i32 {}

/// `u32`/`i32` to `f32`, rounded to nearest even.
pub fn to_f32(b: &mut KernelBuilder, x: impl IntOperand) -> Val<f32> {
    let x = operand(b, x);
    Val::from_value(b.int_to_float(x.value()))
}

/// `f32` to `u32` with `rounding`, saturating (NaN gives 0).
pub fn to_u32(b: &mut KernelBuilder, x: impl Lift<f32>, rounding: Rounding) -> Val<u32> {
    let x = x.lift(b);
    Val::from_value(b.float_to_int(x.value(), ScalarType::U32, rounding))
}

/// `f32` to `i32` with `rounding`, saturating (NaN gives 0).
pub fn to_i32(b: &mut KernelBuilder, x: impl Lift<f32>, rounding: Rounding) -> Val<i32> {
    let x = x.lift(b);
    Val::from_value(b.float_to_int(x.value(), ScalarType::I32, rounding))
}

/// The bits of an `f32` as a `u32` (a bitcast).
pub fn to_bits(b: &mut KernelBuilder, x: impl Lift<f32>) -> Val<u32> {
    let x = x.lift(b);
    Val::from_value(b.bitcast(x.value(), ScalarType::U32))
}

/// The `f32` with the bits of a `u32` (a bitcast).
pub fn from_bits(b: &mut KernelBuilder, x: impl Lift<u32>) -> Val<f32> {
    let x = x.lift(b);
    Val::from_value(b.bitcast(x.value(), ScalarType::F32))
}

/// The bits of an `i32` as a `u32` (a bitcast, `x.as_u32()`).
pub fn as_u32(b: &mut KernelBuilder, x: impl Lift<i32>) -> Val<u32> {
    let x = x.lift(b);
    Val::from_value(b.bitcast(x.value(), ScalarType::U32))
}

/// The bits of a `u32` as an `i32` (a bitcast, `x.as_i32()`).
pub fn as_i32(b: &mut KernelBuilder, x: impl Lift<u32>) -> Val<i32> {
    let x = x.lift(b);
    Val::from_value(b.bitcast(x.value(), ScalarType::I32))
}
