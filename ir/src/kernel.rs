//! The kernel: parameters, constant tables, local variables, the value arena and the body.

use crate::handle::{Arena, Handle};
use crate::ops::{CmpOp, Op};
use crate::types::{DType, Rounding, ScalarType};

/// Handle of a parameter.
pub type ParamId = Handle<Param>;
/// Handle of a constant table.
pub type TableId = Handle<Table>;
/// Handle of a local variable.
pub type VarId = Handle<Var>;
/// Handle of an SSA value (the result of one [`Op`]).
pub type Value = Handle<ValueDef>;

/// Access mode of a buffer parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    /// Loaded from only.
    Read,
    /// Stored to only.
    Write,
    /// Loaded from and stored to (e.g. optimizer state updated in place).
    ReadWrite,
}

impl Access {
    /// Name in the text form.
    pub const fn name(self) -> &'static str {
        match self {
            Access::Read => "read",
            Access::Write => "write",
            Access::ReadWrite => "readwrite",
        }
    }
    /// True for `Read` and `ReadWrite`.
    pub const fn can_read(self) -> bool {
        matches!(self, Access::Read | Access::ReadWrite)
    }
    /// True for `Write` and `ReadWrite`.
    pub const fn can_write(self) -> bool {
        matches!(self, Access::Write | Access::ReadWrite)
    }
}

/// One dimension of a buffer shape, or the grid size: a constant or a `u32` scalar parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dim {
    /// A fixed size.
    Const(u32),
    /// The value of a `u32` scalar parameter, known at launch.
    Param(ParamId),
}

/// What a parameter is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ParamKind {
    /// A buffer of `dtype` elements whose element count is the product of `shape`.
    Buffer {
        /// Element type in memory.
        dtype: DType,
        /// Shape; the element count is the product of the dims (row-major, flat indexing).
        shape: Vec<Dim>,
        /// Whether the kernel loads, stores or both.
        access: Access,
    },
    /// A scalar passed by value (not `bool`).
    Scalar(ScalarType),
}

/// A kernel parameter.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Param {
    /// Name, unique within the kernel (an identifier).
    pub name: String,
    /// Buffer or scalar.
    pub kind: ParamKind,
}

/// A constant table, read with [`Op::Lookup`] (e.g. the 16 NF4 code values).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Table {
    /// Name, unique among the kernel's tables.
    pub name: String,
    /// Element type: `f32`, `u32` or `i32`.
    pub ty: ScalarType,
    /// Raw 32-bit patterns of the elements (at least one).
    pub data: Vec<u32>,
}

/// A local variable of one work item (mutable, zero-initialized per work item).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Var {
    /// Name, unique among the kernel's variables.
    pub name: String,
    /// Its type.
    pub ty: ScalarType,
}

/// Definition of an SSA value: the op and the type it yields.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ValueDef {
    /// The operation.
    pub op: Op,
    /// The result type (checked by the verifier against [`infer_type`]).
    pub ty: ScalarType,
}

/// A statement of a work item's sequential code.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Stmt {
    /// Evaluates the op of `value` here; later statements of this block and of nested blocks
    /// may use it. Each value is evaluated by exactly one `Let` (or defined by one `For`).
    Let(Value),
    /// Stores `value` into element `index` (`u32`) of a writable buffer. The value type must be
    /// the buffer dtype's [`DType::value_type`]. `f16`/`bf16` buffers need a `rounding` (from
    /// `f32`); other dtypes take none. `u8`/`i8` keep the low 8 bits of the value.
    Store {
        /// Buffer parameter with `Write` or `ReadWrite` access.
        buf: ParamId,
        /// Element index (`u32`).
        index: Value,
        /// The value to store.
        value: Value,
        /// Rounding to the narrow float format; `None` for every other dtype.
        rounding: Option<Rounding>,
    },
    /// Sets a local variable.
    Assign {
        /// The variable.
        var: VarId,
        /// A value of the variable's type.
        value: Value,
    },
    /// Runs `then_body` when `cond` (`bool`) is true, otherwise `else_body`.
    If {
        /// The condition.
        cond: Value,
        /// Statements run when true.
        then_body: Vec<Stmt>,
        /// Statements run when false.
        else_body: Vec<Stmt>,
    },
    /// `for index in (start..end).step_by(step) { body }` over `u32`; no iteration when
    /// `start >= end`. `index` is a value whose op is [`Op::LoopIndex`].
    For {
        /// The loop index value.
        index: Value,
        /// First index (`u32`).
        start: Value,
        /// Exclusive bound (`u32`).
        end: Value,
        /// Increment, at least 1.
        step: u32,
        /// The loop body.
        body: Vec<Stmt>,
    },
    /// A summation loop (dot products, the K reduction of a matmul): for `index` in `0..len`
    /// in increasing order, the body (only `Let`s: no stores, assignments, ifs or loops) computes
    /// values, then each accumulator of `accs`, in order, adds `a * b` with one `fma` into its
    /// partial sum for that element. Partials and their combination follow `order` exactly as
    /// [`crate::ReduceOrder`] defines for [`crate::Op::Reduce`]: with `Strided(w)` element `i`
    /// goes to partial `i % w` (`Sequential` is one partial); every partial starts at `-0.0`
    /// (so `fma(a, b, -0.0)` is the rounded product); after the loop the partials are combined
    /// by the fixed halving tree and the total is assigned to the accumulator's `f32` variable.
    /// Body values are not visible after the statement. This pins the summation order so a CPU
    /// SIMD loop (lanes = consecutive `i`) or a GPU warp (lane `j` takes `i % w == j`, then a
    /// butterfly) reproduces it bit for bit.
    Accumulate {
        /// The loop index value ([`crate::Op::LoopIndex`], `u32`).
        index: Value,
        /// Number of elements (`u32`); 0 gives `-0.0` for every accumulator.
        len: Value,
        /// Partial sums and how they are combined.
        order: crate::ops::ReduceOrder,
        /// Straight-line `Let`s computing each element's factors.
        body: Vec<Stmt>,
        /// The sums computed (at least one).
        accs: Vec<Accum>,
    },
}

/// One sum of a [`Stmt::Accumulate`]: `var = sum over i of a(i) * b(i)` (each product fused
/// into its partial with `fma`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Accum {
    /// The `f32` variable receiving the total.
    pub var: VarId,
    /// First factor (`f32`), usually defined in the body.
    pub a: Value,
    /// Second factor (`f32`).
    pub b: Value,
}

/// A kernel: typed parameters plus a body run once per work item of a one-dimensional grid.
/// Work items are independent: they may run in any order or in parallel, so two work items must
/// never write the same element (the op library's kernels each own whole blocks).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Kernel {
    /// Kernel name, e.g. `quantize_4bit_nf4_bs64_f32`.
    pub name: String,
    /// Parameters, in call order.
    pub params: Arena<Param>,
    /// Constant tables.
    pub tables: Arena<Table>,
    /// Local variables.
    pub vars: Arena<Var>,
    /// All SSA values.
    pub values: Arena<ValueDef>,
    /// Number of work items.
    pub grid: Dim,
    /// The code of one work item.
    pub body: Vec<Stmt>,
}

impl Kernel {
    /// The parameter called `name`, if any.
    pub fn param_by_name(&self, name: &str) -> Option<ParamId> {
        self.params
            .iter()
            .find(|(_, p)| p.name == name)
            .map(|(h, _)| h)
    }

    /// A stable 64-bit hash (FNV-1a) of the kernel's text form: equal text, equal hash, in every
    /// process and version that prints the same text. Used in artifact manifests and module
    /// keys; a device's in-process kernel cache uses the much cheaper [`Kernel::fingerprint`].
    pub fn content_hash(&self) -> u64 {
        crate::cpu_abi::fnv1a(crate::text::print(self).as_bytes())
    }

    /// A 64-bit hash of the kernel's structure (the derived [`Hash`] with `FxHasher`): equal
    /// kernels (`==`) have equal fingerprints. About a microsecond for a library kernel, where
    /// [`Kernel::content_hash`] prints the kernel first (tens of microseconds), so devices key
    /// their compiled-kernel caches by it and confirm a hit with `==`. Not stable across
    /// versions of qforge or of the hasher: never store it.
    pub fn fingerprint(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = rustc_hash::FxHasher::default();
        self.hash(&mut h);
        h.finish()
    }
}

/// The type an op yields given the kernel's parameters, tables, variables and value types, or a
/// description of the first typing rule it breaks. The builder records this type and the verifier
/// checks it; handles are assumed in range (the verifier checks them first).
pub fn infer_type(kernel: &Kernel, op: &Op) -> Result<ScalarType, String> {
    use ScalarType::*;
    let ty = |v: Value| -> Result<ScalarType, String> {
        kernel
            .values
            .try_get(v)
            .map(|d| d.ty)
            .ok_or_else(|| format!("value %{} does not exist", v.index()))
    };
    let want = |v: Value, t: ScalarType, what: &str| -> Result<(), String> {
        let got = ty(v)?;
        if got == t {
            Ok(())
        } else {
            Err(format!("{what} must be {t}, got {got} (%{})", v.index()))
        }
    };
    let buffer = |p: ParamId| -> Result<(DType, Access), String> {
        match kernel.params.try_get(p).map(|p| &p.kind) {
            Some(ParamKind::Buffer { dtype, access, .. }) => Ok((*dtype, *access)),
            Some(ParamKind::Scalar(_)) => Err(format!(
                "parameter '{}' is a scalar, not a buffer",
                kernel.params[p].name
            )),
            None => Err(format!("parameter #{} does not exist", p.index())),
        }
    };
    match op {
        Op::WorkItem | Op::LoopIndex => Ok(U32),
        Op::Param(p) => match kernel.params.try_get(*p).map(|p| &p.kind) {
            Some(ParamKind::Scalar(t)) if *t != Bool => Ok(*t),
            Some(ParamKind::Scalar(_)) => Err("scalar parameters cannot be bool".into()),
            Some(ParamKind::Buffer { .. }) => Err(format!(
                "parameter '{}' is a buffer, not a scalar",
                kernel.params[*p].name
            )),
            None => Err(format!("parameter #{} does not exist", p.index())),
        },
        Op::Const(c) => Ok(c.ty()),
        Op::ReadVar(v) => kernel
            .vars
            .try_get(*v)
            .map(|v| v.ty)
            .ok_or_else(|| format!("variable #{} does not exist", v.index())),
        Op::Load { buf, index } => {
            let (dtype, access) = buffer(*buf)?;
            want(*index, U32, "load index")?;
            if !access.can_read() {
                return Err(format!(
                    "load from write-only buffer '{}'",
                    kernel.params[*buf].name
                ));
            }
            Ok(dtype.value_type())
        }
        Op::Lookup { table, index } => {
            want(*index, U32, "lookup index")?;
            kernel
                .tables
                .try_get(*table)
                .map(|t| t.ty)
                .ok_or_else(|| format!("table #{} does not exist", table.index()))
        }
        Op::SearchSorted { table, value } => {
            want(*value, F32, "search_sorted value")?;
            let t = kernel
                .tables
                .try_get(*table)
                .ok_or_else(|| format!("table #{} does not exist", table.index()))?;
            if t.ty != F32 {
                return Err(format!(
                    "search_sorted table '{}' is {}, not f32",
                    t.name, t.ty
                ));
            }
            let x = |i: usize| f32::from_bits(t.data[i]);
            if let Some(i) = (0..t.data.len()).find(|i| x(*i).is_nan()) {
                return Err(format!("search_sorted table '{}' has NaN at {i}", t.name));
            }
            if let Some(i) = (1..t.data.len()).find(|i| x(*i) < x(i - 1)) {
                return Err(format!(
                    "search_sorted table '{}' is not sorted: entry {i} is below entry {}",
                    t.name,
                    i - 1
                ));
            }
            Ok(U32)
        }
        Op::Unary(u, a) => {
            let t = ty(*a)?;
            if u.accepts(t) {
                Ok(t)
            } else {
                Err(format!("{} is not defined on {t}", u.name()))
            }
        }
        Op::Binary(b, x, y) => {
            let (tx, ty_) = (ty(*x)?, ty(*y)?);
            if tx != ty_ {
                return Err(format!(
                    "{} operands differ in type: {tx} and {ty_}",
                    b.name()
                ));
            }
            if b.accepts(tx) {
                Ok(tx)
            } else {
                Err(format!("{} is not defined on {tx}", b.name()))
            }
        }
        Op::Fma(a, b, c) => {
            want(*a, F32, "fma operand")?;
            want(*b, F32, "fma operand")?;
            want(*c, F32, "fma operand")?;
            Ok(F32)
        }
        Op::Cmp(c, x, y) => {
            let (tx, ty_) = (ty(*x)?, ty(*y)?);
            if tx != ty_ {
                return Err(format!(
                    "{} operands differ in type: {tx} and {ty_}",
                    c.name()
                ));
            }
            if tx == Bool && !matches!(c, CmpOp::Eq | CmpOp::Ne) {
                return Err(format!("{} is not defined on bool", c.name()));
            }
            Ok(Bool)
        }
        Op::Select {
            cond,
            if_true,
            if_false,
        } => {
            want(*cond, Bool, "select condition")?;
            let t = ty(*if_true)?;
            want(*if_false, t, "select operands")?;
            Ok(t)
        }
        Op::FloatToInt { value, to, .. } => {
            want(*value, F32, "float_to_int operand")?;
            if to.is_int() {
                Ok(*to)
            } else {
                Err(format!("float_to_int target must be u32 or i32, got {to}"))
            }
        }
        Op::IntToFloat { value, .. } => {
            let t = ty(*value)?;
            if t.is_int() {
                Ok(F32)
            } else {
                Err(format!("int_to_float operand must be u32 or i32, got {t}"))
            }
        }
        Op::Bitcast { value, to } => {
            let t = ty(*value)?;
            if t == Bool || *to == Bool {
                Err("bitcast is not defined on bool".into())
            } else {
                Ok(*to)
            }
        }
        Op::Reduce {
            kind,
            buf,
            start,
            len,
            order,
        } => {
            let (dtype, access) = buffer(*buf)?;
            if !access.can_read() {
                return Err(format!(
                    "reduce over write-only buffer '{}'",
                    kernel.params[*buf].name
                ));
            }
            if !dtype.is_float() {
                return Err(format!(
                    "reduce needs a float buffer, '{}' is {dtype}",
                    kernel.params[*buf].name
                ));
            }
            want(*start, U32, "reduce start")?;
            want(*len, U32, "reduce len")?;
            if let crate::ops::ReduceOrder::Strided(w) = order {
                if !(2..=64).contains(w) || !w.is_power_of_two() {
                    return Err(format!(
                        "strided reduce needs a power of two in 2..=64 ways, got {w}"
                    ));
                }
            }
            let _ = kind; // every kind yields f32
            Ok(F32)
        }
    }
}
