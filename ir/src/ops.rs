//! The closed set of operations, grouped by family. The doc comment of each variant is its exact
//! semantics; `docs/semantics.md` repeats them in one table. Every backend must reproduce these
//! bits exactly (NaN payloads excepted, see the numeric contract in DESIGN.md).

use crate::kernel::{ParamId, TableId, Value, VarId};
use crate::types::{Rounding, Scalar, ScalarType};

/// One operation producing one value. Operands are [`Value`]s defined earlier in the same or an
/// enclosing block.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    // ----- index space and arguments -----
    /// The `u32` index of the work item executing the body, in `0..grid`.
    WorkItem,
    /// The index of the innermost `for` loop that defines this value (`u32`). Only valid as the
    /// `index` of a [`crate::Stmt::For`]; it has no operands.
    LoopIndex,
    /// The value of a scalar parameter (any [`ScalarType`] but `bool`).
    Param(ParamId),
    /// A typed constant.
    Const(Scalar),
    /// The current value of a local variable. Variables start as all-zero bits (`0`, `+0.0`,
    /// `false`) at the start of each work item.
    ReadVar(VarId),

    // ----- memory -----
    /// Loads element `index` (`u32`, in elements, not bytes) of a readable buffer parameter.
    /// Floats widen exactly to `f32` (f16/bf16 keep NaN-ness and sign), `u8`/`u32` zero-extend
    /// to `u32`, `i8`/`i32` sign-extend to `i32`. An index outside the buffer is a kernel bug:
    /// the interpreter reports it, compiled backends do not check.
    Load {
        /// Buffer parameter with `Read` or `ReadWrite` access.
        buf: ParamId,
        /// Element index, `u32`.
        index: Value,
    },
    /// Reads `table[min(index, len - 1)]` from a constant table (`index` is `u32`). The clamp
    /// makes every index defined on every backend.
    Lookup {
        /// The table.
        table: TableId,
        /// Element index, `u32`.
        index: Value,
    },
    /// The number of entries of a constant `f32` table that are `< value` (`value` is `f32`;
    /// the result is `u32`, in `0..=len`): numpy's `searchsorted(table, value, side="left")`,
    /// torch's `bucketize(value, table)`. The table must be sorted non-decreasing without NaN
    /// (a typing rule). Comparisons are IEEE `<`: `-0.0` and `+0.0` are equal, a NaN `value`
    /// gives 0. With the midpoints of a code table as entries it is the nearest code, ties to
    /// the lower code (bitsandbytes' 8-bit quantization, `qforge_kernels::nearest`). Backends
    /// choose the search (`qforge_codegen::decompose` rewrites it into lookups and compares
    /// for those that do not lower it themselves).
    SearchSorted {
        /// The sorted `f32` table.
        table: TableId,
        /// The searched value, `f32`.
        value: Value,
    },

    // ----- arithmetic and bit operations -----
    /// A unary operation; see [`UnaryOp`].
    Unary(UnaryOp, Value),
    /// A binary operation on two operands of the same type; see [`BinaryOp`].
    Binary(BinaryOp, Value, Value),
    /// `a * b + c` on `f32` with a single rounding (round to nearest even). The only way to get
    /// a fused multiply-add: `Mul` followed by `Add` is always two roundings.
    Fma(Value, Value, Value),

    // ----- comparison and selection -----
    /// Compares two operands of the same type and yields a `bool`; see [`CmpOp`].
    Cmp(CmpOp, Value, Value),
    /// `if cond { if_true } else { if_false }` on values (both evaluated; no side effects).
    Select {
        /// `bool` condition.
        cond: Value,
        /// Value when `cond` is true.
        if_true: Value,
        /// Value when `cond` is false; same type as `if_true`.
        if_false: Value,
    },

    // ----- conversions (each names its rounding) -----
    /// `f32` to `u32` or `i32`: round with `rounding`, then saturate to the target range;
    /// NaN converts to 0.
    FloatToInt {
        /// An `f32` value.
        value: Value,
        /// `U32` or `I32`.
        to: ScalarType,
        /// How to round to an integer.
        rounding: Rounding,
    },
    /// `u32` or `i32` to `f32`, rounded with `rounding` when the integer is not representable.
    IntToFloat {
        /// A `u32` or `i32` value.
        value: Value,
        /// How to round to `f32`.
        rounding: Rounding,
    },
    /// Reinterprets the 32 bits of an `f32`, `u32` or `i32` value as another of these types.
    Bitcast {
        /// The value.
        value: Value,
        /// `F32`, `U32` or `I32`.
        to: ScalarType,
    },

    // ----- reductions (each names its order) -----
    /// Reduces the elements `buf[start .. start + len]` of a readable float buffer (widened to
    /// `f32`) to one `f32`, in the given order. `len` may be 0 (the result is the identity).
    Reduce {
        /// What to compute.
        kind: ReduceKind,
        /// A readable buffer with a float dtype.
        buf: ParamId,
        /// First element index (`u32`).
        start: Value,
        /// Number of elements (`u32`).
        len: Value,
        /// The summation order; see [`ReduceOrder`].
        order: ReduceOrder,
    },
}

/// Unary operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    /// `f32`: flips the sign bit (exact, also for NaN, inf and zero). `i32`/`u32`: wrapping
    /// two's-complement negation.
    Neg,
    /// `f32`: clears the sign bit. `i32`: wrapping absolute value (`i32::MIN` stays `i32::MIN`).
    /// Not defined on `u32`.
    Abs,
    /// `f32` only: correctly rounded square root (round to nearest even); `sqrt(-0) = -0`,
    /// `sqrt(x < 0) = NaN`, `sqrt(+inf) = +inf`.
    Sqrt,
    /// `u32`/`i32`: bitwise not. `bool`: logical not.
    Not,
}

/// Binary operations. Both operands have the same type, which is also the result type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// `f32`: IEEE addition, round to nearest even. Integers: wrapping.
    Add,
    /// `f32`: IEEE subtraction, round to nearest even. Integers: wrapping.
    Sub,
    /// `f32`: IEEE multiplication, round to nearest even. Integers: wrapping (low 32 bits).
    Mul,
    /// `f32`: IEEE division, round to nearest even. Integers: truncating division; a zero
    /// divisor gives 0, and `i32::MIN / -1` gives `i32::MIN`.
    Div,
    /// Integers only: remainder with the sign of the dividend; a zero divisor gives 0, and
    /// `i32::MIN % -1` gives 0.
    Rem,
    /// `min(a, b) = select(b < a, b, a)`. For `f32` this is compare + select: a NaN in `a`
    /// propagates, a NaN in `b` yields `a`, and `min(-0, +0) = -0`, `min(+0, -0) = +0`.
    Min,
    /// `max(a, b) = select(b > a, b, a)`. For `f32`: a NaN in `a` propagates, a NaN in `b`
    /// yields `a`, and `max(-0, +0) = -0`, `max(+0, -0) = +0`.
    Max,
    /// Integers: bitwise and. `bool`: logical and.
    And,
    /// Integers: bitwise or. `bool`: logical or.
    Or,
    /// Integers: bitwise xor. `bool`: logical xor.
    Xor,
    /// Integers: shift left by `b & 31`.
    Shl,
    /// Integers: shift right by `b & 31`; logical for `u32`, arithmetic for `i32`.
    Shr,
    /// Integers only: the high 32 bits of the exact 64-bit product `a * b` (unsigned for
    /// `u32`, signed for `i32`); with [`BinaryOp::Mul`] (the low 32 bits) the whole product,
    /// as Philox's rounds need (`routines::philox`; CUDA's `__umulhi`/`__mulhi`, PTX `mul.hi`).
    MulHi,
}

/// Comparisons. Floats compare as IEEE 754: every comparison with a NaN is false except `Ne`,
/// which is true; `-0 == +0`. Integers compare by the signedness of their type. `bool` supports
/// `Eq` and `Ne` only.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CmpOp {
    /// Equal.
    Eq,
    /// Not equal (unordered or different).
    Ne,
    /// Less than.
    Lt,
    /// Less than or equal.
    Le,
    /// Greater than.
    Gt,
    /// Greater than or equal.
    Ge,
}

/// What a [`Op::Reduce`] computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceKind {
    /// Sum of the elements, each addition an IEEE `f32` addition (round to nearest even) in the
    /// stated order. The identity (and every partial accumulator's start) is `-0.0`, so an
    /// all-`-0` range sums to `-0` and an empty range gives `-0.0`.
    Sum,
    /// `max |x|` over the range, starting from `+0.0` (an empty range gives `+0.0`). The result
    /// never depends on the order. What a NaN element does is named by [`NanMode`].
    AbsMax(NanMode),
}

/// How a max-style reduction treats NaN elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NanMode {
    /// Any NaN element makes the result NaN (PyTorch `max`, bitsandbytes' 4-bit absmax).
    Propagate,
    /// NaN elements are skipped (C `fmaxf`, bitsandbytes' 8-bit blockwise absmax).
    Ignore,
}

/// The order in which a reduction combines elements. Sums depend on it; max/min do not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOrder {
    /// `acc = identity; for i in 0..len { acc = acc (+) x[i] }`.
    Sequential,
    /// `ways` partial accumulators (a power of two, 2..=64), all starting at the identity:
    /// element `i` is combined into `acc[i % ways]` in increasing `i`; then a fixed tree:
    /// `w = ways; while w > 1 { w /= 2; for j in 0..w { acc[j] = acc[j] (+) acc[j + w] } }`,
    /// and the result is `acc[0]`. This is the order a SIMD loop with `ways` lanes, or a warp
    /// doing a butterfly, produces.
    Strided(u32),
}

impl ReduceOrder {
    /// The number of partial sums: 1 for `Sequential`, `w` for `Strided(w)` (the verifier keeps
    /// `w` a power of two in 2..=64).
    pub const fn ways(self) -> u32 {
        match self {
            ReduceOrder::Sequential => 1,
            ReduceOrder::Strided(w) => w,
        }
    }
}

impl UnaryOp {
    /// All unary ops.
    pub const ALL: [UnaryOp; 4] = [UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Sqrt, UnaryOp::Not];
    /// Name in the text form.
    pub const fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Abs => "abs",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Not => "not",
        }
    }
}

impl BinaryOp {
    /// All binary ops.
    pub const ALL: [BinaryOp; 13] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Rem,
        BinaryOp::Min,
        BinaryOp::Max,
        BinaryOp::And,
        BinaryOp::Or,
        BinaryOp::Xor,
        BinaryOp::Shl,
        BinaryOp::Shr,
        BinaryOp::MulHi,
    ];
    /// Name in the text form.
    pub const fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Rem => "rem",
            BinaryOp::Min => "min",
            BinaryOp::Max => "max",
            BinaryOp::And => "and",
            BinaryOp::Or => "or",
            BinaryOp::Xor => "xor",
            BinaryOp::Shl => "shl",
            BinaryOp::Shr => "shr",
            BinaryOp::MulHi => "mul_hi",
        }
    }
    /// Whether the op is defined on operands of type `ty`.
    pub const fn accepts(self, ty: ScalarType) -> bool {
        use ScalarType::*;
        match self {
            BinaryOp::Add
            | BinaryOp::Sub
            | BinaryOp::Mul
            | BinaryOp::Div
            | BinaryOp::Min
            | BinaryOp::Max => matches!(ty, F32 | U32 | I32),
            BinaryOp::Rem | BinaryOp::Shl | BinaryOp::Shr | BinaryOp::MulHi => {
                matches!(ty, U32 | I32)
            }
            BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => matches!(ty, U32 | I32 | Bool),
        }
    }
}

impl UnaryOp {
    /// Whether the op is defined on an operand of type `ty`.
    pub const fn accepts(self, ty: ScalarType) -> bool {
        use ScalarType::*;
        match self {
            UnaryOp::Neg => matches!(ty, F32 | U32 | I32),
            UnaryOp::Abs => matches!(ty, F32 | I32),
            UnaryOp::Sqrt => matches!(ty, F32),
            UnaryOp::Not => matches!(ty, U32 | I32 | Bool),
        }
    }
}

impl CmpOp {
    /// All comparisons.
    pub const ALL: [CmpOp; 6] = [
        CmpOp::Eq,
        CmpOp::Ne,
        CmpOp::Lt,
        CmpOp::Le,
        CmpOp::Gt,
        CmpOp::Ge,
    ];
    /// Name in the text form.
    pub const fn name(self) -> &'static str {
        match self {
            CmpOp::Eq => "eq",
            CmpOp::Ne => "ne",
            CmpOp::Lt => "lt",
            CmpOp::Le => "le",
            CmpOp::Gt => "gt",
            CmpOp::Ge => "ge",
        }
    }
}

impl Op {
    /// The values this op reads, in operand order.
    pub fn operands(&self) -> Vec<Value> {
        match self {
            Op::WorkItem | Op::LoopIndex | Op::Param(_) | Op::Const(_) | Op::ReadVar(_) => vec![],
            Op::Load { index, .. } | Op::Lookup { index, .. } => vec![*index],
            Op::SearchSorted { value, .. } => vec![*value],
            Op::Unary(_, a) => vec![*a],
            Op::Binary(_, a, b) | Op::Cmp(_, a, b) => vec![*a, *b],
            Op::Fma(a, b, c) => vec![*a, *b, *c],
            Op::Select {
                cond,
                if_true,
                if_false,
            } => vec![*cond, *if_true, *if_false],
            Op::FloatToInt { value, .. }
            | Op::IntToFloat { value, .. }
            | Op::Bitcast { value, .. } => {
                vec![*value]
            }
            Op::Reduce { start, len, .. } => vec![*start, *len],
        }
    }
}
