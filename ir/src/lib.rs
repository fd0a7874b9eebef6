//! qforge-ir: the tensor-op IR of qforge.
//!
//! A [`Kernel`] is typed parameters plus a body run once per work item of a one-dimensional
//! grid. Values are SSA ([`Value`] handles into an arena), statements are structured (`if`,
//! `for`), and every op has exact semantics (see [`Op`] and `docs/semantics.md`): no
//! contraction, explicit `fma`, `min`/`max` as compare + select, named rounding on every
//! conversion, subnormals kept, reductions with a named order.
//!
//! The crate also holds the verifier ([`verify()`]), the text form ([`text`]), the reference
//! interpreter ([`interp`]) that defines what every kernel means, the typed front end of the
//! kernel language ([`dsl`]) and the IR routines kernels call ([`routines`]). The op library is
//! the crate `qforge-kernels`, built with the same public [`KernelBuilder`].
#![deny(missing_docs)]

// Lets `#[qforge::kernel]` refer to this crate as `::qforge_ir` inside it too.
extern crate self as qforge_ir;

mod args;
mod builder;
mod error;
mod handle;
mod kernel;
mod ops;
mod shared;
mod source;
mod types;

pub mod cpu_abi;
pub mod dsl;
pub mod interp;
pub mod routines;
pub mod text;
mod verify;

pub use args::{bind, count_mismatches, Arg, Binding, OwnedArg};
pub use builder::KernelBuilder;
pub use error::{Error, Result, VerifyError};
pub use handle::{Arena, Handle};
pub use kernel::{
    infer_type, Access, Accum, Dim, Kernel, Param, ParamId, ParamKind, Stmt, Table, TableId, Value,
    ValueDef, Var, VarId,
};
pub use ops::{BinaryOp, CmpOp, NanMode, Op, ReduceKind, ReduceOrder, UnaryOp};
pub use shared::SharedKernel;
pub use source::{SourceLoc, SourceMap};
pub use types::{DType, Rounding, Scalar, ScalarType};
pub use verify::verify;
