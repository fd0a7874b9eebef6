//! The typed front end of [`KernelBuilder`] that `#[qforge::kernel]` expands to (and that
//! hand-written builders may use): typed values ([`Val`]), operators with the IR's semantics,
//! build-time ("comptime") Rust values that become constants where they meet IR values,
//! parameters, tables, variables, control flow, and typed signatures ([`TypedKernel`]).
//!
//! Every function takes the builder first; the macro passes it. The language and the meaning of
//! each construct are documented in `docs/custom-ops.md`.
//!
//! [`KernelBuilder`]: crate::KernelBuilder

mod arith;
mod control;
mod convert;
mod params;
mod signature;
mod value;

pub use arith::{
    abs, add, and, cmp, div, fma, max, min, mul, mul_hi, neg, not, or, rem, select, shl, shr, sqrt,
    sub, xor, KAdd, KAnd, KCmp, KDiv, KMax, KMin, KMul, KMulHi, KOr, KRem, KShl, KShr, KSub,
    KUnary, KXor,
};
pub use control::{
    accumulate, assign, for_, if_, if_value, pass, read, read_option, var, var_init, Bounds, Cond,
    Pass, Read, StaticCond, Var,
};
pub use convert::{as_i32, as_u32, from_bits, to_bits, to_f32, to_i32, to_u32, IntOperand};
pub use params::{
    buffer_param, index, reduce_absmax, reduce_sum, scalar_param, search_sorted, store,
    store_rounded, table_f32, table_u32, work_item, Buf, BufferParam, Elem, Float, In, InOut,
    IntoDim, KIndex, Out, PlainStore, Readable, Scalar, Table, Writable, BF16, F16,
};
pub use signature::{optional_arg, ArgType, FloatIn, FloatOut, KernelArgs, Signature, TypedKernel};
pub use value::{val, Kind, Lift, Operand, Val};

/// Records the user's source location for what is built next (the macro emits one before each
/// statement).
pub fn at(b: &mut crate::KernelBuilder, file: &'static str, line: u32, column: u32) {
    b.set_location(Some(crate::SourceLoc { file, line, column }));
}
