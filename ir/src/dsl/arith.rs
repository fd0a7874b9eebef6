//! Operators of the kernel language: `+ - * / % & | ^ << >>`, comparisons, negation and `!`,
//! and the builtins `fma`, `min`, `max`, `select`, `abs`, `sqrt`, `mul_hi`.
//!
//! Each operator takes two operands of one kernel type. An IR value (`Val<T>`) and a build-time
//! Rust value of the same type mix (the Rust value becomes a constant where it is used); two Rust
//! values are computed by Rust when the kernel is built, with the IR's semantics
//! (`docs/semantics.md`: wrapping integers, `a / 0 = 0`, `a % 0 = 0`, shift amounts `& 31`,
//! `min`/`max` as compare + select). Operands of different types are a compile error: the
//! language converts nothing implicitly.

use crate::builder::KernelBuilder;
use crate::ops::{BinaryOp, CmpOp, UnaryOp};

use super::value::{Kind, Lift, Operand, Val};

/// The IR semantics of the integer operators on build-time values.
trait IntSemantics: Sized {
    fn div_ir(self, b: Self) -> Self;
    fn rem_ir(self, b: Self) -> Self;
}
impl IntSemantics for u32 {
    fn div_ir(self, b: u32) -> u32 {
        self.checked_div(b).unwrap_or(0)
    }
    fn rem_ir(self, b: u32) -> u32 {
        self.checked_rem(b).unwrap_or(0)
    }
}
impl IntSemantics for i32 {
    fn div_ir(self, b: i32) -> i32 {
        if b == 0 {
            0
        } else {
            self.wrapping_div(b)
        }
    }
    fn rem_ir(self, b: i32) -> i32 {
        if b == 0 {
            0
        } else {
            self.wrapping_rem(b)
        }
    }
}

/// Declares one binary operator: its trait (with the message of a misuse), the impls for the
/// listed types (`Val op Val`, `Val op T`, `T op Val`, and `T op T` evaluated by Rust), and the
/// function the macro expands `a op b` to.
macro_rules! binary_op {
    (
        $(#[$doc:meta])* $Trait:ident, $func:ident, $op:expr, $msg:literal,
        [$($t:ty => |$x:ident, $y:ident| $rust:expr),* $(,)?]
    ) => {
        $(#[$doc])*
        #[diagnostic::on_unimplemented(
            message = $msg,
            label = "`{Self}` and `{Rhs}` here",
            note = "both operands must have the same kernel type; convert one explicitly (`.to_f32()`, `.to_u32(rounding)`, `.to_i32(rounding)`, or a bitcast)"
        )]
        pub trait $Trait<Rhs> {
            /// The result: a `Val` when an operand is one, else the Rust value.
            type Out;
            /// Emits (or computes) `self op rhs`.
            fn apply(self, rhs: Rhs, b: &mut KernelBuilder) -> Self::Out;
        }
        $(
            impl $Trait<Val<$t>> for Val<$t> {
                type Out = Val<$t>;
                fn apply(self, rhs: Val<$t>, b: &mut KernelBuilder) -> Val<$t> {
                    Val::from_value(b.binary($op, self.value(), rhs.value()))
                }
            }
            impl $Trait<$t> for Val<$t> {
                type Out = Val<$t>;
                fn apply(self, rhs: $t, b: &mut KernelBuilder) -> Val<$t> {
                    let rhs = rhs.lift(b);
                    Val::from_value(b.binary($op, self.value(), rhs.value()))
                }
            }
            impl $Trait<Val<$t>> for $t {
                type Out = Val<$t>;
                fn apply(self, rhs: Val<$t>, b: &mut KernelBuilder) -> Val<$t> {
                    let lhs = self.lift(b);
                    Val::from_value(b.binary($op, lhs.value(), rhs.value()))
                }
            }
            impl $Trait<$t> for $t {
                type Out = $t;
                fn apply(self, rhs: $t, _: &mut KernelBuilder) -> $t {
                    let ($x, $y) = (self, rhs);
                    $rust
                }
            }
        )*
        #[doc = concat!("`a ", stringify!($func), " b` (see [`", stringify!($Trait), "`]).")]
        pub fn $func<A: $Trait<B>, B>(b: &mut KernelBuilder, x: A, y: B) -> A::Out {
            x.apply(y, b)
        }
    };
}

binary_op!(
    /// `a + b`: IEEE `f32`, wrapping integers.
    KAdd, add, BinaryOp::Add, "cannot add `{Rhs}` to `{Self}` in a kernel",
    [f32 => |a, b| a + b, u32 => |a, b| a.wrapping_add(b), i32 => |a, b| a.wrapping_add(b)]
);
binary_op!(
    /// `a - b`.
    KSub, sub, BinaryOp::Sub, "cannot subtract `{Rhs}` from `{Self}` in a kernel",
    [f32 => |a, b| a - b, u32 => |a, b| a.wrapping_sub(b), i32 => |a, b| a.wrapping_sub(b)]
);
binary_op!(
    /// `a * b`.
    KMul, mul, BinaryOp::Mul, "cannot multiply `{Self}` by `{Rhs}` in a kernel",
    [f32 => |a, b| a * b, u32 => |a, b| a.wrapping_mul(b), i32 => |a, b| a.wrapping_mul(b)]
);
binary_op!(
    /// `a / b`: IEEE `f32`; truncating integers with `a / 0 = 0`.
    KDiv, div, BinaryOp::Div, "cannot divide `{Self}` by `{Rhs}` in a kernel",
    [f32 => |a, b| a / b, u32 => |a, b| a.div_ir(b), i32 => |a, b| a.div_ir(b)]
);
binary_op!(
    /// `a % b` on integers, `a % 0 = 0` (no `f32` remainder in the IR).
    KRem, rem, BinaryOp::Rem, "`%` takes two integers of one type in a kernel, not `{Self}` and `{Rhs}`",
    [u32 => |a, b| a.rem_ir(b), i32 => |a, b| a.rem_ir(b)]
);
binary_op!(
    /// Bitwise and (logical on `bool`).
    KAnd, and, BinaryOp::And, "`&` takes two integers or two bools of one type, not `{Self}` and `{Rhs}`",
    [u32 => |a, b| a & b, i32 => |a, b| a & b, bool => |a, b| a & b]
);
binary_op!(
    /// Bitwise or (logical on `bool`).
    KOr, or, BinaryOp::Or, "`|` takes two integers or two bools of one type, not `{Self}` and `{Rhs}`",
    [u32 => |a, b| a | b, i32 => |a, b| a | b, bool => |a, b| a | b]
);
binary_op!(
    /// Bitwise exclusive or.
    KXor, xor, BinaryOp::Xor, "`^` takes two integers or two bools of one type, not `{Self}` and `{Rhs}`",
    [u32 => |a, b| a ^ b, i32 => |a, b| a ^ b, bool => |a, b| a ^ b]
);
binary_op!(
    /// `a << (b & 31)`.
    KShl, shl, BinaryOp::Shl, "`<<` takes two integers of one type in a kernel, not `{Self}` and `{Rhs}`",
    [u32 => |a, b| a.wrapping_shl(b), i32 => |a, b| a.wrapping_shl(b as u32)]
);
binary_op!(
    /// `a >> (b & 31)`: logical on `u32`, arithmetic on `i32`.
    KShr, shr, BinaryOp::Shr, "`>>` takes two integers of one type in a kernel, not `{Self}` and `{Rhs}`",
    [u32 => |a, b| a.wrapping_shr(b), i32 => |a, b| a.wrapping_shr(b as u32)]
);
binary_op!(
    /// `min(a, b) = select(b < a, b, a)` (so `min(NaN, x) = NaN`, `min(x, NaN) = x`).
    KMin, min, BinaryOp::Min, "`min` takes two values of one kernel type, not `{Self}` and `{Rhs}`",
    [f32 => |a, b| if b < a { b } else { a }, u32 => |a, b| a.min(b), i32 => |a, b| a.min(b)]
);
binary_op!(
    /// `max(a, b) = select(b > a, b, a)`.
    KMax, max, BinaryOp::Max, "`max` takes two values of one kernel type, not `{Self}` and `{Rhs}`",
    [f32 => |a, b| if b > a { b } else { a }, u32 => |a, b| a.max(b), i32 => |a, b| a.max(b)]
);
binary_op!(
    /// The high 32 bits of the 64-bit product (integers).
    KMulHi, mul_hi, BinaryOp::MulHi, "`mul_hi` takes two integers of one type, not `{Self}` and `{Rhs}`",
    [
        u32 => |a, b| ((a as u64 * b as u64) >> 32) as u32,
        i32 => |a, b| ((a as i64 * b as i64) >> 32) as i32,
    ]
);

/// A comparison of two operands of one kernel type: `bool` for two Rust values, `Val<bool>`
/// otherwise.
#[diagnostic::on_unimplemented(
    message = "cannot compare `{Self}` with `{Rhs}` in a kernel",
    label = "`{Self}` and `{Rhs}` here",
    note = "both operands must have the same kernel type; convert one explicitly"
)]
pub trait KCmp<Rhs> {
    /// `bool` or `Val<bool>`.
    type Out;
    /// Emits (or computes) the comparison.
    fn apply(self, op: CmpOp, rhs: Rhs, b: &mut KernelBuilder) -> Self::Out;
}

macro_rules! compare {
    ($($t:ty),*) => {$(
        impl KCmp<Val<$t>> for Val<$t> {
            type Out = Val<bool>;
            fn apply(self, op: CmpOp, rhs: Val<$t>, b: &mut KernelBuilder) -> Val<bool> {
                Val::from_value(b.cmp(op, self.value(), rhs.value()))
            }
        }
        impl KCmp<$t> for Val<$t> {
            type Out = Val<bool>;
            fn apply(self, op: CmpOp, rhs: $t, b: &mut KernelBuilder) -> Val<bool> {
                let rhs = rhs.lift(b);
                Val::from_value(b.cmp(op, self.value(), rhs.value()))
            }
        }
        impl KCmp<Val<$t>> for $t {
            type Out = Val<bool>;
            fn apply(self, op: CmpOp, rhs: Val<$t>, b: &mut KernelBuilder) -> Val<bool> {
                let lhs = self.lift(b);
                Val::from_value(b.cmp(op, lhs.value(), rhs.value()))
            }
        }
        impl KCmp<$t> for $t {
            type Out = bool;
            fn apply(self, op: CmpOp, rhs: $t, _: &mut KernelBuilder) -> bool {
                match op {
                    CmpOp::Eq => self == rhs,
                    CmpOp::Ne => self != rhs,
                    CmpOp::Lt => self < rhs,
                    CmpOp::Le => self <= rhs,
                    CmpOp::Gt => self > rhs,
                    CmpOp::Ge => self >= rhs,
                }
            }
        }
    )*};
}
compare!(f32, u32, i32, bool);

/// `a == b`, `a < b`, ... (`op` names which): IEEE comparisons on `f32` (false with a NaN,
/// except `!=`).
pub fn cmp<A: KCmp<B>, B>(b: &mut KernelBuilder, op: CmpOp, x: A, y: B) -> A::Out {
    x.apply(op, y, b)
}

/// A unary operator on one operand (`-a`, `!a`, `abs`, `sqrt`).
#[diagnostic::on_unimplemented(
    message = "this operation does not apply to `{Self}` in a kernel",
    note = "`-` takes `f32`/`u32`/`i32`, `!` integers or `bool`, `abs` `f32`/`i32`, `sqrt` `f32`"
)]
pub trait KUnary<const OP: u8> {
    /// The result.
    type Out;
    /// Emits (or computes) the operation.
    fn apply(self, b: &mut KernelBuilder) -> Self::Out;
}

const NEG: u8 = 0;
const NOT: u8 = 1;
const ABS: u8 = 2;
const SQRT: u8 = 3;

const fn unary_op(op: u8) -> UnaryOp {
    match op {
        NEG => UnaryOp::Neg,
        NOT => UnaryOp::Not,
        ABS => UnaryOp::Abs,
        _ => UnaryOp::Sqrt,
    }
}

macro_rules! unary {
    ($op:ident: $($t:ty => |$x:ident| $rust:expr),*) => {$(
        impl KUnary<$op> for Val<$t> {
            type Out = Val<$t>;
            fn apply(self, b: &mut KernelBuilder) -> Val<$t> {
                Val::from_value(b.unary(unary_op($op), self.value()))
            }
        }
        impl KUnary<$op> for $t {
            type Out = $t;
            fn apply(self, _: &mut KernelBuilder) -> $t {
                let $x = self;
                $rust
            }
        }
    )*};
}
unary!(NEG: f32 => |a| -a, u32 => |a| a.wrapping_neg(), i32 => |a| a.wrapping_neg());
unary!(NOT: u32 => |a| !a, i32 => |a| !a, bool => |a| !a);
unary!(ABS: f32 => |a| f32::from_bits(a.to_bits() & 0x7fff_ffff), i32 => |a| a.wrapping_abs());
unary!(SQRT: f32 => |a| a.sqrt());

/// `-a`: sign flip on `f32`, wrapping negation on integers.
pub fn neg<A: KUnary<NEG>>(b: &mut KernelBuilder, a: A) -> A::Out {
    a.apply(b)
}
/// `!a`: bitwise not, logical not on `bool`.
pub fn not<A: KUnary<NOT>>(b: &mut KernelBuilder, a: A) -> A::Out {
    a.apply(b)
}
/// `|a|`: clears the sign bit of an `f32` (also of NaN); wrapping on `i32`.
pub fn abs<A: KUnary<ABS>>(b: &mut KernelBuilder, a: A) -> A::Out {
    a.apply(b)
}
/// The correctly rounded square root of an `f32`.
pub fn sqrt<A: KUnary<SQRT>>(b: &mut KernelBuilder, a: A) -> A::Out {
    a.apply(b)
}

/// `a * b + c` with one rounding (`f32`). Always an IR op (a build-time `fma` would need the
/// platform's, which the numeric contract does not trust).
pub fn fma(
    b: &mut KernelBuilder,
    x: impl Lift<f32>,
    y: impl Lift<f32>,
    z: impl Lift<f32>,
) -> Val<f32> {
    let (x, y, z) = (x.lift(b), y.lift(b), z.lift(b));
    Val::from_value(b.fma(x.value(), y.value(), z.value()))
}

/// `cond ? if_true : if_false` (both evaluated: they are values, not branches).
pub fn select<T: Kind>(
    b: &mut KernelBuilder,
    cond: impl Lift<bool>,
    if_true: impl Lift<T>,
    if_false: impl Lift<T>,
) -> Val<T> {
    let cond = cond.lift(b);
    let (t, f) = (if_true.lift(b), if_false.lift(b));
    Val::from_value(b.select(cond.value(), t.value(), f.value()))
}

/// Lifts an operand (for the conversions, which take either kind).
pub(crate) fn operand<O: Operand>(b: &mut KernelBuilder, o: O) -> Val<O::Kind> {
    o.to_val(b)
}
