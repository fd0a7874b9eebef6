//! `KernelBuilder`: the public API that builds every kernel, library and custom alike.

use crate::handle::Arena;
use crate::kernel::{
    infer_type, Access, Dim, Kernel, Param, ParamId, ParamKind, Stmt, Table, TableId, Value,
    ValueDef, Var, VarId,
};
use crate::ops::{BinaryOp, CmpOp, NanMode, Op, ReduceKind, ReduceOrder, UnaryOp};
use crate::source::{SourceLoc, SourceMap};
use crate::types::{DType, Rounding, Scalar, ScalarType};

/// The type recorded for an ill-typed op (which [`crate::verify`] reports): the type the op
/// always yields when it has one, so that the verifier does not blame its uses as well.
fn fallback_type(op: &Op) -> ScalarType {
    if matches!(op, Op::SearchSorted { .. }) {
        ScalarType::U32
    } else {
        ScalarType::F32
    }
}

/// Builds a [`Kernel`] statement by statement. Nested blocks (`if`, `for`) are built inside
/// closures. The builder never panics on ill-typed input: it records what it was given and
/// [`crate::verify`] reports every problem with its location.
///
/// ```
/// use qforge_ir::{KernelBuilder, DType, Access, Dim, ScalarType, verify};
/// let mut b = KernelBuilder::new("scale_f32");
/// let n = b.scalar_param("n", ScalarType::U32);
/// let x = b.buffer_param("x", DType::F32, &[Dim::Param(n)], Access::Read);
/// let y = b.buffer_param("y", DType::F32, &[Dim::Param(n)], Access::Write);
/// b.set_grid(Dim::Param(n));
/// let i = b.work_item();
/// let v = b.load(x, i);
/// let two = b.const_f32(2.0);
/// let r = b.mul(v, two);
/// b.store(y, i, r);
/// let k = b.finish();
/// verify(&k).unwrap();
/// ```
pub struct KernelBuilder {
    kernel: Kernel,
    blocks: Vec<Vec<Stmt>>,
    /// The verifier's path of each open block (`body`, `body[3].then`, ...).
    paths: Vec<String>,
    /// Where the code being built comes from, and what was built where.
    location: Option<SourceLoc>,
    source: SourceMap,
}

impl KernelBuilder {
    /// Starts a kernel called `name` with a grid of one work item.
    pub fn new(name: &str) -> Self {
        KernelBuilder {
            kernel: Kernel {
                name: name.to_string(),
                params: Arena::new(),
                tables: Arena::new(),
                vars: Arena::new(),
                values: Arena::new(),
                grid: Dim::Const(1),
                body: Vec::new(),
            },
            blocks: vec![Vec::new()],
            paths: vec!["body".into()],
            location: None,
            source: SourceMap::default(),
        }
    }

    /// Sets the source location of what is built next (a macro-built kernel sets it before each
    /// statement of the user's code), or clears it. Values and statements built while it is set
    /// are recorded in the [`SourceMap`], which is kept outside the kernel (its equality and
    /// hash do not see it).
    pub fn set_location(&mut self, location: Option<SourceLoc>) {
        self.location = location;
    }

    /// Where each value and statement built under [`KernelBuilder::set_location`] comes from.
    pub fn source_map(&self) -> &SourceMap {
        &self.source
    }

    /// Declares a buffer parameter.
    pub fn buffer_param(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &[Dim],
        access: Access,
    ) -> ParamId {
        self.kernel.params.append(Param {
            name: name.to_string(),
            kind: ParamKind::Buffer {
                dtype,
                shape: shape.to_vec(),
                access,
            },
        })
    }

    /// Declares a scalar parameter.
    pub fn scalar_param(&mut self, name: &str, ty: ScalarType) -> ParamId {
        self.kernel.params.append(Param {
            name: name.to_string(),
            kind: ParamKind::Scalar(ty),
        })
    }

    /// Sets the number of work items.
    pub fn set_grid(&mut self, grid: Dim) {
        self.kernel.grid = grid;
    }

    /// Declares a constant `f32` table.
    pub fn table_f32(&mut self, name: &str, data: &[f32]) -> TableId {
        self.table(
            name,
            ScalarType::F32,
            data.iter().map(|v| v.to_bits()).collect(),
        )
    }

    /// Declares a constant `u32` table.
    pub fn table_u32(&mut self, name: &str, data: &[u32]) -> TableId {
        self.table(name, ScalarType::U32, data.to_vec())
    }

    /// Declares a constant table of raw 32-bit patterns of type `ty`.
    pub fn table(&mut self, name: &str, ty: ScalarType, data: Vec<u32>) -> TableId {
        self.kernel.tables.append(Table {
            name: name.to_string(),
            ty,
            data,
        })
    }

    /// Declares a local variable (zero at the start of each work item).
    pub fn var(&mut self, name: &str, ty: ScalarType) -> VarId {
        self.kernel.vars.append(Var {
            name: name.to_string(),
            ty,
        })
    }

    /// Appends `op` as a `Let` in the current block and returns its value.
    pub fn op(&mut self, op: Op) -> Value {
        let ty = infer_type(&self.kernel, &op).unwrap_or_else(|_| fallback_type(&op));
        let v = self.kernel.values.append(ValueDef { op, ty });
        if let Some(loc) = self.location {
            self.source.values.insert(v, loc);
        }
        self.push(Stmt::Let(v));
        v
    }

    fn push(&mut self, stmt: Stmt) {
        let block = self
            .blocks
            .last_mut()
            .expect("builder always has an open block");
        if let (Some(loc), Some(path)) = (self.location, self.paths.last()) {
            self.source
                .stmts
                .insert(format!("{path}[{}]", block.len()), loc);
        }
        block.push(stmt);
    }

    /// Builds the block `kind` (`then`, `else` or `body`) of the statement that will be pushed
    /// next into the current block.
    fn nested(&mut self, kind: &str, f: impl FnOnce(&mut Self)) -> Vec<Stmt> {
        let parent = self.paths.last().map_or("body", String::as_str);
        let at = self.blocks.last().map_or(0, Vec::len);
        let path = format!("{parent}[{at}].{kind}");
        self.paths.push(path);
        self.blocks.push(Vec::new());
        f(self);
        self.paths.pop();
        self.blocks.pop().expect("pushed above")
    }

    // ----- index space, arguments, constants, variables -----

    /// The work item index (`u32`).
    pub fn work_item(&mut self) -> Value {
        self.op(Op::WorkItem)
    }
    /// The value of a scalar parameter.
    pub fn param(&mut self, p: ParamId) -> Value {
        self.op(Op::Param(p))
    }
    /// A typed constant.
    pub fn constant(&mut self, c: Scalar) -> Value {
        self.op(Op::Const(c))
    }
    /// An `f32` constant.
    pub fn const_f32(&mut self, v: f32) -> Value {
        self.constant(Scalar::f32(v))
    }
    /// A `u32` constant.
    pub fn const_u32(&mut self, v: u32) -> Value {
        self.constant(Scalar::U32(v))
    }
    /// An `i32` constant.
    pub fn const_i32(&mut self, v: i32) -> Value {
        self.constant(Scalar::I32(v))
    }
    /// A `bool` constant.
    pub fn const_bool(&mut self, v: bool) -> Value {
        self.constant(Scalar::Bool(v))
    }
    /// Reads a local variable.
    pub fn read_var(&mut self, var: VarId) -> Value {
        self.op(Op::ReadVar(var))
    }
    /// Sets a local variable.
    pub fn assign(&mut self, var: VarId, value: Value) {
        self.push(Stmt::Assign { var, value });
    }

    // ----- memory -----

    /// Loads `buf[index]`.
    pub fn load(&mut self, buf: ParamId, index: Value) -> Value {
        self.op(Op::Load { buf, index })
    }
    /// Reads `table[min(index, len-1)]`.
    pub fn lookup(&mut self, table: TableId, index: Value) -> Value {
        self.op(Op::Lookup { table, index })
    }
    /// The number of entries of the sorted `f32` `table` below `value` ([`Op::SearchSorted`]).
    pub fn search_sorted(&mut self, table: TableId, value: Value) -> Value {
        self.op(Op::SearchSorted { table, value })
    }
    /// Stores into a buffer whose dtype needs no rounding.
    pub fn store(&mut self, buf: ParamId, index: Value, value: Value) {
        self.push(Stmt::Store {
            buf,
            index,
            value,
            rounding: None,
        });
    }
    /// Stores an `f32` into an `f16`/`bf16` buffer with the named rounding.
    pub fn store_rounded(&mut self, buf: ParamId, index: Value, value: Value, rounding: Rounding) {
        self.push(Stmt::Store {
            buf,
            index,
            value,
            rounding: Some(rounding),
        });
    }
    /// Stores `value`, rounding to nearest even when `buf` has a narrow float dtype.
    pub fn store_auto(&mut self, buf: ParamId, index: Value, value: Value) {
        let narrow = matches!(
            self.kernel.params.try_get(buf).map(|p| &p.kind),
            Some(ParamKind::Buffer { dtype, .. }) if dtype.is_narrow_float()
        );
        let rounding = narrow.then_some(Rounding::NearestEven);
        self.push(Stmt::Store {
            buf,
            index,
            value,
            rounding,
        });
    }

    // ----- arithmetic -----

    /// A unary op.
    pub fn unary(&mut self, op: UnaryOp, a: Value) -> Value {
        self.op(Op::Unary(op, a))
    }
    /// A binary op.
    pub fn binary(&mut self, op: BinaryOp, a: Value, b: Value) -> Value {
        self.op(Op::Binary(op, a, b))
    }
    /// `a + b`.
    pub fn add(&mut self, a: Value, b: Value) -> Value {
        self.binary(BinaryOp::Add, a, b)
    }
    /// `a - b`.
    pub fn sub(&mut self, a: Value, b: Value) -> Value {
        self.binary(BinaryOp::Sub, a, b)
    }
    /// `a * b`.
    pub fn mul(&mut self, a: Value, b: Value) -> Value {
        self.binary(BinaryOp::Mul, a, b)
    }
    /// The high 32 bits of the 64-bit product `a * b` (integers; [`BinaryOp::MulHi`]).
    pub fn mul_hi(&mut self, a: Value, b: Value) -> Value {
        self.binary(BinaryOp::MulHi, a, b)
    }
    /// `a / b`.
    pub fn div(&mut self, a: Value, b: Value) -> Value {
        self.binary(BinaryOp::Div, a, b)
    }
    /// `a % b` (integers).
    pub fn rem(&mut self, a: Value, b: Value) -> Value {
        self.binary(BinaryOp::Rem, a, b)
    }
    /// `select(b < a, b, a)`.
    pub fn min(&mut self, a: Value, b: Value) -> Value {
        self.binary(BinaryOp::Min, a, b)
    }
    /// `select(b > a, b, a)`.
    pub fn max(&mut self, a: Value, b: Value) -> Value {
        self.binary(BinaryOp::Max, a, b)
    }
    /// Bitwise / logical and.
    pub fn and(&mut self, a: Value, b: Value) -> Value {
        self.binary(BinaryOp::And, a, b)
    }
    /// Bitwise / logical or.
    pub fn or(&mut self, a: Value, b: Value) -> Value {
        self.binary(BinaryOp::Or, a, b)
    }
    /// Shift left by `b & 31`.
    pub fn shl(&mut self, a: Value, b: Value) -> Value {
        self.binary(BinaryOp::Shl, a, b)
    }
    /// Shift right by `b & 31`.
    pub fn shr(&mut self, a: Value, b: Value) -> Value {
        self.binary(BinaryOp::Shr, a, b)
    }
    /// `f32` negation (sign flip) or wrapping integer negation.
    pub fn neg(&mut self, a: Value) -> Value {
        self.unary(UnaryOp::Neg, a)
    }
    /// `f32` absolute value (clear sign).
    pub fn abs(&mut self, a: Value) -> Value {
        self.unary(UnaryOp::Abs, a)
    }
    /// Correctly rounded square root.
    pub fn sqrt(&mut self, a: Value) -> Value {
        self.unary(UnaryOp::Sqrt, a)
    }
    /// Bitwise / logical not.
    pub fn not(&mut self, a: Value) -> Value {
        self.unary(UnaryOp::Not, a)
    }
    /// Fused multiply-add `a * b + c`, one rounding.
    pub fn fma(&mut self, a: Value, b: Value, c: Value) -> Value {
        self.op(Op::Fma(a, b, c))
    }

    // ----- comparison and selection -----

    /// A comparison yielding `bool`.
    pub fn cmp(&mut self, op: CmpOp, a: Value, b: Value) -> Value {
        self.op(Op::Cmp(op, a, b))
    }
    /// `cond ? if_true : if_false`.
    pub fn select(&mut self, cond: Value, if_true: Value, if_false: Value) -> Value {
        self.op(Op::Select {
            cond,
            if_true,
            if_false,
        })
    }

    // ----- conversions -----

    /// `f32` to `u32`/`i32` with rounding and saturation (NaN to 0).
    pub fn float_to_int(&mut self, value: Value, to: ScalarType, rounding: Rounding) -> Value {
        self.op(Op::FloatToInt {
            value,
            to,
            rounding,
        })
    }
    /// `u32`/`i32` to `f32`, round to nearest even.
    pub fn int_to_float(&mut self, value: Value) -> Value {
        self.op(Op::IntToFloat {
            value,
            rounding: Rounding::NearestEven,
        })
    }
    /// Reinterprets the bits as `to`.
    pub fn bitcast(&mut self, value: Value, to: ScalarType) -> Value {
        self.op(Op::Bitcast { value, to })
    }

    // ----- reductions -----

    /// `f32` sum of `buf[start..start+len]` in `order`.
    pub fn reduce_sum(
        &mut self,
        buf: ParamId,
        start: Value,
        len: Value,
        order: ReduceOrder,
    ) -> Value {
        self.op(Op::Reduce {
            kind: ReduceKind::Sum,
            buf,
            start,
            len,
            order,
        })
    }
    /// `max |x|` of `buf[start..start+len]`.
    pub fn reduce_absmax(&mut self, buf: ParamId, start: Value, len: Value, nan: NanMode) -> Value {
        self.op(Op::Reduce {
            kind: ReduceKind::AbsMax(nan),
            buf,
            start,
            len,
            order: ReduceOrder::Sequential,
        })
    }

    // ----- control flow -----

    /// `if cond { then }`.
    pub fn if_then(&mut self, cond: Value, then: impl FnOnce(&mut Self)) {
        let then_body = self.nested("then", then);
        self.push(Stmt::If {
            cond,
            then_body,
            else_body: Vec::new(),
        });
    }
    /// `if cond { then } else { otherwise }`.
    pub fn if_else(
        &mut self,
        cond: Value,
        then: impl FnOnce(&mut Self),
        otherwise: impl FnOnce(&mut Self),
    ) {
        let then_body = self.nested("then", then);
        let else_body = self.nested("else", otherwise);
        self.push(Stmt::If {
            cond,
            then_body,
            else_body,
        });
    }
    /// `for i in (start..end).step_by(step) { body(i) }`.
    pub fn for_range(
        &mut self,
        start: Value,
        end: Value,
        step: u32,
        body: impl FnOnce(&mut Self, Value),
    ) {
        let index = self.kernel.values.append(ValueDef {
            op: Op::LoopIndex,
            ty: ScalarType::U32,
        });
        let body = self.nested("body", |b| body(b, index));
        self.push(Stmt::For {
            index,
            start,
            end,
            step,
            body,
        });
    }

    /// A summation loop ([`Stmt::Accumulate`]): `body(b, i)` emits the `Let`s of element `i`
    /// and returns one `(a, b)` factor pair per variable of `vars`, in order; after the
    /// statement each variable holds `sum over i in 0..len of a * b` in `order`.
    pub fn accumulate(
        &mut self,
        len: Value,
        order: crate::ops::ReduceOrder,
        vars: &[VarId],
        body: impl FnOnce(&mut Self, Value) -> Vec<(Value, Value)>,
    ) {
        let index = self.kernel.values.append(ValueDef {
            op: Op::LoopIndex,
            ty: ScalarType::U32,
        });
        let mut factors = Vec::new();
        let body = self.nested("body", |b| factors = body(b, index));
        let accs = vars
            .iter()
            .zip(factors)
            .map(|(&var, (a, b))| crate::kernel::Accum { var, a, b })
            .collect();
        self.push(Stmt::Accumulate {
            index,
            len,
            order,
            body,
            accs,
        });
    }

    /// Finishes the kernel. Run [`crate::verify`] before handing it to a backend.
    pub fn finish(mut self) -> Kernel {
        self.kernel.body = self.blocks.pop().unwrap_or_default();
        self.kernel
    }

    // ----- rewriting an existing kernel (passes) -----

    /// Continues building `kernel` for a pass that rewrites it: returns a builder whose new
    /// tables, variables and values append to the kernel's arenas, and the kernel's body, which
    /// the pass rebuilds and hands back to [`KernelBuilder::finish_with`]. The statements the
    /// builder emits are collected by [`KernelBuilder::take_block`].
    pub fn edit(mut kernel: Kernel) -> (Self, Vec<Stmt>) {
        let body = std::mem::take(&mut kernel.body);
        (
            KernelBuilder {
                kernel,
                blocks: vec![Vec::new()],
                paths: vec!["body".into()],
                location: None,
                source: SourceMap::default(),
            },
            body,
        )
    }

    /// The statements emitted since the last call (the current block, left empty).
    pub fn take_block(&mut self) -> Vec<Stmt> {
        self.blocks
            .last_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Gives the existing value `v` the definition `op` and emits its `let`: a pass that
    /// replaces an op by a sequence keeps the op's handle, so every use of it stays valid.
    pub fn define(&mut self, v: Value, op: Op) {
        let ty = infer_type(&self.kernel, &op).unwrap_or_else(|_| fallback_type(&op));
        if let Some(def) = self.kernel.values.get_mut(v) {
            *def = ValueDef { op, ty };
        }
        self.push(Stmt::Let(v));
    }

    /// The kernel with `body` as its code (after [`KernelBuilder::edit`]).
    pub fn finish_with(mut self, body: Vec<Stmt>) -> Kernel {
        self.kernel.body = body;
        self.kernel
    }

    /// The kernel being built (read-only), e.g. for a pass to read a value's definition.
    pub fn kernel(&self) -> &Kernel {
        &self.kernel
    }
}
