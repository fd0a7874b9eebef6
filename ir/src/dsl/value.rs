//! Typed IR values: [`Val<T>`] is an SSA value of kernel type `T` (`f32`, `u32`, `i32` or
//! `bool`); plain Rust values of those types are build-time ("comptime") values that become IR
//! constants where they meet a `Val`.

use std::marker::PhantomData;

use crate::builder::KernelBuilder;
use crate::kernel::Value;
use crate::types::{Scalar, ScalarType};

/// A kernel value type: `f32`, `u32`, `i32` or `bool` (the IR's [`ScalarType`]s).
pub trait Kind: Copy + 'static + sealed::Sealed {
    /// The IR type.
    const TY: ScalarType;
    /// This Rust value as an IR constant.
    fn scalar(self) -> Scalar;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for u32 {}
    impl Sealed for i32 {}
    impl Sealed for bool {}
}

impl Kind for f32 {
    const TY: ScalarType = ScalarType::F32;
    fn scalar(self) -> Scalar {
        Scalar::f32(self)
    }
}
impl Kind for u32 {
    const TY: ScalarType = ScalarType::U32;
    fn scalar(self) -> Scalar {
        Scalar::U32(self)
    }
}
impl Kind for i32 {
    const TY: ScalarType = ScalarType::I32;
    fn scalar(self) -> Scalar {
        Scalar::I32(self)
    }
}
impl Kind for bool {
    const TY: ScalarType = ScalarType::Bool;
    fn scalar(self) -> Scalar {
        Scalar::Bool(self)
    }
}

/// An SSA value of type `T` in the kernel being built (a handle: copying it copies the handle,
/// not the computation).
pub struct Val<T: Kind> {
    value: Value,
    _ty: PhantomData<T>,
}

impl<T: Kind> Clone for Val<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T: Kind> Copy for Val<T> {}

impl<T: Kind> std::fmt::Debug for Val<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Val<{}>({:?})", T::TY, self.value)
    }
}

impl<T: Kind> Val<T> {
    /// Wraps an untyped value the caller knows to have type `T` (for mixing the typed front end
    /// with raw [`KernelBuilder`] calls; the verifier checks the types when the kernel is done).
    pub fn from_value(value: Value) -> Self {
        Val {
            value,
            _ty: PhantomData,
        }
    }

    /// The untyped handle.
    pub fn value(self) -> Value {
        self.value
    }
}

/// Something usable where a `Val<T>` is expected: the value itself, or a build-time Rust value
/// of type `T`, which becomes a constant (one `const` op at the point of use).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be used as a kernel value of type `{T}`",
    label = "expected a `Val<{T}>` or a `{T}` constant here",
    note = "kernel values do not convert implicitly: use `.to_f32()`, `.to_u32(rounding)`, `.to_i32(rounding)` or a bitcast"
)]
pub trait Lift<T: Kind>: Copy {
    /// The IR value (a constant op for a Rust value).
    fn lift(self, b: &mut KernelBuilder) -> Val<T>;
}

impl<T: Kind> Lift<T> for Val<T> {
    fn lift(self, _: &mut KernelBuilder) -> Val<T> {
        self
    }
}

macro_rules! lift_rust {
    ($($t:ty),*) => {$(
        impl Lift<$t> for $t {
            fn lift(self, b: &mut KernelBuilder) -> Val<$t> {
                Val::from_value(b.constant(self.scalar()))
            }
        }
    )*};
}
lift_rust!(f32, u32, i32, bool);

/// `x` as an IR value: a build-time constant becomes a `const` op here (e.g. to give a loop
/// constant bounds instead of unrolling it, or to reuse one constant).
pub fn val<T: Kind>(b: &mut KernelBuilder, x: impl Lift<T>) -> Val<T> {
    x.lift(b)
}

/// A value that may be a build-time Rust value or an IR value, as the operators' results are:
/// `Val<T>` stays a `Val`, a Rust value stays a Rust value.
pub trait Operand: Copy {
    /// The kernel type.
    type Kind: Kind;
    /// The IR value.
    fn to_val(self, b: &mut KernelBuilder) -> Val<Self::Kind>;
}

impl<T: Kind> Operand for Val<T> {
    type Kind = T;
    fn to_val(self, _: &mut KernelBuilder) -> Val<T> {
        self
    }
}

macro_rules! operand_rust {
    ($($t:ty),*) => {$(
        impl Operand for $t {
            type Kind = $t;
            fn to_val(self, b: &mut KernelBuilder) -> Val<$t> {
                self.lift(b)
            }
        }
    )*};
}
operand_rust!(f32, u32, i32, bool);
