//! A loop vectorizer: a `for` loop with step 1 whose body is straight-line code (only `let`s
//! and stores) runs four iterations at a time in 128-bit vectors (`f32x4`, `i32x4`; a `bool`
//! is an `i32x4` lane mask of 0 or -1), then the plain scalar loop runs the remaining 0..=3
//! iterations.
//!
//! Exactness: every vector op used computes, lane by lane, exactly the scalar op of
//! [`qforge_ir::Op`] (IEEE add/sub/mul/div/sqrt, fused `fma`, sign-bit neg/abs, wrapping
//! integer arithmetic, bitwise ops, compares, min/max as compare + `bitselect`). Every other op
//! (integer division, variable shifts, float/int conversions but `i32` to `f32` to nearest,
//! lookups, reductions, narrow loads but `u8`/`i8`/`bf16` at stride 1) is computed lane by
//! lane by the scalar lowering itself, so it is exact by construction. Two exceptions use a
//! proof of which values a lane can hold (a "value set": constants combined by selects and
//! integer ops, or a `u32` whose upper bound is below 4, such as a parity `x & 1`): a lookup at
//! such an index is a chain of compares and selects of the table entries, and a shift by such
//! an amount (the nibble shift `4 * (1 - parity)` of packed 4-bit codes) is the vector shift by
//! each possible constant, selected lane by lane by comparing the amount with it.
//!
//! Values defined outside the loop, and body values computed only from them, stay scalar
//! ("uniform"). Integer values of the form `base + lane * stride` with a constant stride (the
//! loop index and sums, differences, constant multiples and constant left shifts of it) are
//! kept as a scalar `base` plus the stride ("affine"), so that loads and stores at such
//! indices can be whole-vector accesses. Such an access first checks that all lanes lie inside
//! the buffer (and do not wrap around `u32`); otherwise it runs lane by lane with the scalar
//! access, including its bounds check and report, so an out-of-range lane behaves exactly as
//! the scalar iteration would. Loads at `(affine of stride 1) >> c` (a packed byte, a block's
//! scale) have fast paths too, see `vector_mem.rs`.
//!
//! Memory order: a loop is vectorized only when no buffer it stores to is also read in it
//! (unless every access to that buffer is at the loop index itself) and each buffer is stored
//! by at most one statement; within one vector iteration the lanes of a
//! store are written in increasing lane order, so the final memory contents equal those of the
//! scalar loop. The vector loads and stores are in `vector_mem.rs`.

use std::collections::{HashMap, HashSet};

use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::types::{F32X4, I32, I32X4, I8};
use cranelift_codegen::ir::{ConstantData, InstBuilder, MemFlagsData, Type, Value};
use cranelift_frontend::Variable;
use qforge_ir::{
    BinaryOp, CmpOp, Kernel, Op, Rounding, ScalarType, Stmt, UnaryOp, Value as IrValue,
};

use super::lower::{internal, Lowerer};
use super::vector_running::running_reductions;
use crate::error::Result;

/// Lanes of a vector iteration.
pub(super) const LANES: u8 = 4;

/// Largest set of possible index values for which a lookup is a chain of compares and
/// selects instead of one scalar load per lane.
const MAX_SET: usize = 4;

/// The lowered body values of one vector iteration.
#[derive(Default)]
pub(super) struct Body {
    /// Lowered form of each value defined in the body (by arena index).
    vals: HashMap<usize, VVal>,
    /// For varying integer values: every value a lane can hold, when there are few (constants
    /// combined by selects, adds, subs and bit operations, as in a branch-free search, or a
    /// value whose upper bound is below [`MAX_SET`], such as a parity `x & 1`).
    sets: HashMap<usize, Vec<u32>>,
    /// `u32` values whose lane `j` is `(base + j) >> shift` (a logical shift by a constant of
    /// an affine value of stride 1): `(base, shift)`, for the loads in `vector_mem.rs`.
    pub(super) shifted: HashMap<usize, (Value, u32)>,
    /// Loads proven in range for every iteration of the loop (see `accumulate_range.rs`):
    /// lowered without bounds checks.
    trusted: HashSet<usize>,
    /// The `f32x4` lane variable of each running maximum, by IR variable index
    /// (see `vector_running.rs`).
    pub(super) carried: HashMap<usize, Variable>,
    /// The scalar variable and the addend of each running sum, by IR variable index.
    pub(super) sums: HashMap<usize, (Variable, IrValue)>,
}

impl Body {
    /// The start of a vector iteration whose loop index `index` is `base + lane` in lane `lane`,
    /// with the loads `trusted` proven in range.
    pub(super) fn at_index(index: IrValue, base: Value, trusted: &HashSet<usize>) -> Self {
        let mut body = Body {
            trusted: trusted.clone(),
            ..Body::default()
        };
        body.vals
            .insert(index.index(), VVal::Affine { base, stride: 1 });
        body
    }

    /// Whether IR value `v` is lowered in this iteration.
    pub(super) fn has(&self, v: IrValue) -> bool {
        self.vals.contains_key(&v.index())
    }

    /// The lowered form of IR value `v` in this iteration, if lowered.
    pub(super) fn get(&self, v: IrValue) -> Option<VVal> {
        self.vals.get(&v.index()).copied()
    }

    /// Sets the lowered form of IR value `v` (a value computed another way, see
    /// `accumulate_wide.rs`).
    pub(super) fn insert(&mut self, v: IrValue, x: VVal) {
        self.vals.insert(v.index(), x);
    }
}

/// The lowered form of a value defined in a vectorized loop body.
#[derive(Clone, Copy)]
pub(super) enum VVal {
    /// The same in every lane: one scalar (also recorded as the value's scalar lowering).
    Uniform(Value),
    /// One 128-bit vector (`f32x4` or `i32x4`; a `bool` is an `i32x4` mask of 0 / -1).
    Vector(Value),
    /// Lane `j` is `base + j * stride` (wrapping 32-bit arithmetic); `base` is an `i32`.
    Affine { base: Value, stride: u32 },
}

/// `x op y` on lane values for the ops [`Lowerer::value_set`] follows (wrapping, shift amounts
/// modulo 32, `shr` arithmetic on `i32`); `None` for the others.
fn set_binary(op: BinaryOp, signed: bool, x: u32, y: u32) -> Option<u32> {
    Some(match op {
        BinaryOp::Add => x.wrapping_add(y),
        BinaryOp::Sub => x.wrapping_sub(y),
        BinaryOp::And => x & y,
        BinaryOp::Or => x | y,
        BinaryOp::Xor => x ^ y,
        BinaryOp::Shl => x.wrapping_shl(y),
        BinaryOp::Shr if signed => (x as i32).wrapping_shr(y) as u32,
        BinaryOp::Shr => x.wrapping_shr(y),
        BinaryOp::Mul
        | BinaryOp::Div
        | BinaryOp::Rem
        | BinaryOp::Min
        | BinaryOp::Max
        | BinaryOp::MulHi => return None,
    })
}

/// Whether the `for` loop with this body (loop index `index`) can run 4 iterations at a time:
/// straight-line code whose only assignments are running reductions
/// (`vector_running.rs`), no buffer stored by two statements, and no buffer both stored to and
/// read unless every access to it is at `index` itself (each iteration then touches only its
/// own element, as an in-place update `p[i] = f(p[i])` does, so running the iterations' loads
/// before their stores changes nothing).
pub(super) fn eligible(kernel: &Kernel, index: Option<IrValue>, body: &[Stmt]) -> bool {
    if running_reductions(kernel, body).is_none() {
        return false;
    }
    let mut stored = HashSet::new();
    let mut read = HashSet::new();
    // Buffers accessed at another index than the loop index.
    let mut elsewhere = HashSet::new();
    // `at`: the index of an access, `None` for a whole-buffer read.
    let mut access = |buf: usize, at: Option<IrValue>| {
        if at.is_none() || at != index {
            elsewhere.insert(buf);
        }
    };
    for stmt in body {
        match stmt {
            Stmt::Let(v) => match kernel.values.try_get(*v).map(|d| &d.op) {
                Some(Op::Load { buf, index: at }) => {
                    read.insert(buf.index());
                    access(buf.index(), Some(*at));
                }
                Some(Op::Reduce { buf, .. }) => {
                    read.insert(buf.index());
                    access(buf.index(), None);
                }
                Some(Op::LoopIndex) | None => return false,
                Some(
                    Op::WorkItem
                    | Op::Param(_)
                    | Op::Const(_)
                    | Op::ReadVar(_)
                    | Op::Lookup { .. }
                    | Op::SearchSorted { .. }
                    | Op::Unary(..)
                    | Op::Binary(..)
                    | Op::Fma(..)
                    | Op::Cmp(..)
                    | Op::Select { .. }
                    | Op::FloatToInt { .. }
                    | Op::IntToFloat { .. }
                    | Op::Bitcast { .. },
                ) => {}
            },
            Stmt::Store { buf, index: at, .. } => {
                if !stored.insert(buf.index()) {
                    return false;
                }
                access(buf.index(), Some(*at));
            }
            // Checked by `running_reductions` above.
            Stmt::Assign { .. } => {}
            Stmt::If { .. } | Stmt::For { .. } | Stmt::Accumulate { .. } => return false,
        }
    }
    stored
        .intersection(&read)
        .all(|buf| !elsewhere.contains(buf))
}

/// The vector type holding lanes of IR type `ty`.
pub(super) fn vec_type(ty: ScalarType) -> Type {
    match ty {
        ScalarType::F32 => F32X4,
        ScalarType::U32 | ScalarType::I32 | ScalarType::Bool => I32X4,
    }
}

/// Flags of a bitcast between two vector types (lane order defined as little endian).
pub(super) fn vec_cast() -> MemFlagsData {
    MemFlagsData::new().with_endianness(cranelift_codegen::ir::Endianness::Little)
}

impl Lowerer<'_> {
    /// Emits the vectorized loop `for index in start..end` (step 1) over `body`, which
    /// [`eligible`] accepted: full groups of 4 iterations in vectors, then the rest scalar.
    pub(super) fn vector_for(
        &mut self,
        index: IrValue,
        start: Value,
        end: Value,
        body: &[Stmt],
    ) -> Result<()> {
        // vend = start + ((end - start) & !3), or start when the loop is empty.
        let nonempty = self.b.ins().icmp(IntCC::UnsignedGreaterThan, end, start);
        let diff = self.b.ins().isub(end, start);
        let zero = self.c32(0);
        let n = self.b.ins().select(nonempty, diff, zero);
        let n4 = self.b.ins().band_imm_u(n, !3u32 as i64);
        let vend = self.b.ins().iadd(start, n4);
        let reductions = running_reductions(self.k, body)
            .ok_or_else(|| internal("vectorizing a loop with a plain assignment"))?;
        let reductions = self.start_running(&reductions)?;
        self.counted_loop(start, vend, LANES as u32, |l, i| {
            let mut local = Body::default();
            local
                .vals
                .insert(index.index(), VVal::Affine { base: i, stride: 1 });
            l.read_running(&reductions, &mut local);
            for stmt in body {
                l.vector_stmt(stmt, &mut local)?;
            }
            Ok(())
        })?;
        self.finish_running(&reductions)?;
        self.counted_loop(vend, end, 1, |l, i| {
            l.set_value(index, i);
            l.scalar_block(body)
        })
    }

    /// The lowered form of operand `v`: local to the vector body, or uniform from outside.
    pub(super) fn vval(&self, local: &Body, v: IrValue) -> Result<VVal> {
        match local.vals.get(&v.index()) {
            Some(x) => Ok(*x),
            None => Ok(VVal::Uniform(self.val(v)?)),
        }
    }

    /// Lowers one statement of a vectorized body for the 4 lanes of one iteration.
    pub(super) fn vector_stmt(&mut self, stmt: &Stmt, local: &mut Body) -> Result<()> {
        match stmt {
            // A reduced variable's read, already its lane vector.
            Stmt::Let(v) if local.has(*v) => {}
            Stmt::Let(v) => {
                let def = self
                    .k
                    .values
                    .try_get(*v)
                    .ok_or_else(|| internal("let of a missing value"))?
                    .clone();
                self.set_bound(*v, &def);
                let operands = def.op.operands();
                let mut uniform = true;
                for o in &operands {
                    if !matches!(self.vval(local, *o)?, VVal::Uniform(_)) {
                        uniform = false;
                    }
                }
                let out = if uniform {
                    let s = self.op(&def.op, def.ty)?;
                    self.set_value(*v, s);
                    VVal::Uniform(s)
                } else {
                    let bound = self.upper_bound(*v);
                    if let Some(set) = self.value_set(&def.op, local) {
                        local.sets.insert(v.index(), set);
                    } else if bound < MAX_SET as u32 {
                        local.sets.insert(v.index(), (0..=bound).collect());
                    }
                    if let Some(shifted) = self.shifted_affine(&def.op, def.ty, local) {
                        local.shifted.insert(v.index(), shifted);
                    }
                    let saved = self.unchecked;
                    self.unchecked = saved || local.trusted.contains(&v.index());
                    let out = self.vector_op(&def.op, def.ty, local);
                    self.unchecked = saved;
                    out?
                };
                local.vals.insert(v.index(), out);
            }
            Stmt::Store {
                buf,
                index,
                value,
                rounding,
            } => {
                let vty = self.k.values[*value].ty;
                let idx = self.vval(local, *index)?;
                let val = self.vval(local, *value)?;
                self.vector_store(*buf, idx, val, vty, *rounding)?;
            }
            Stmt::Assign { var, value } => self.assign_running(*var, *value, local)?,
            Stmt::If { .. } | Stmt::For { .. } | Stmt::Accumulate { .. } => {
                return Err(internal("control flow in a vectorized loop"))
            }
        }
        Ok(())
    }

    /// `v` as a vector of IR type `ty` (a splat for uniform values).
    pub(super) fn as_vec(&mut self, v: VVal, ty: ScalarType) -> Value {
        match v {
            VVal::Vector(x) => x,
            VVal::Uniform(s) => match ty {
                ScalarType::Bool => {
                    let w = self.b.ins().uextend(I32, s);
                    let m = self.b.ins().ineg(w);
                    self.b.ins().splat(I32X4, m)
                }
                ScalarType::F32 | ScalarType::U32 | ScalarType::I32 => {
                    self.b.ins().splat(vec_type(ty), s)
                }
            },
            VVal::Affine { base, stride } => {
                let b = self.b.ins().splat(I32X4, base);
                let steps =
                    self.const_i32x4([0, stride, stride.wrapping_mul(2), stride.wrapping_mul(3)]);
                self.b.ins().iadd(b, steps)
            }
        }
    }

    pub(super) fn const_i32x4(&mut self, lanes: [u32; 4]) -> Value {
        let bytes: Vec<u8> = lanes.iter().flat_map(|l| l.to_le_bytes()).collect();
        let c = self.b.func.dfg.constants.insert(ConstantData::from(bytes));
        self.b.ins().vconst(I32X4, c)
    }

    /// Lane `j` of `v` (of IR type `ty`) as a scalar (`bool`: an `i8` 0/1).
    pub(super) fn lane(&mut self, v: VVal, ty: ScalarType, j: u8) -> Value {
        match v {
            VVal::Uniform(s) => s,
            VVal::Affine { base, stride } => {
                let off = stride.wrapping_mul(j as u32);
                if off == 0 {
                    base
                } else {
                    self.b.ins().iadd_imm_u(base, off as i64)
                }
            }
            VVal::Vector(x) => {
                let s = self.b.ins().extractlane(x, j);
                if ty == ScalarType::Bool {
                    let s = self.b.ins().ireduce(I8, s);
                    self.b.ins().band_imm_u(s, 1)
                } else {
                    s
                }
            }
        }
    }

    /// The vector of IR type `ty` whose lanes are the scalars `lanes`.
    fn build_vector(&mut self, ty: ScalarType, lanes: &[Value]) -> Value {
        let mut out = None;
        for (j, s) in lanes.iter().enumerate() {
            let s = if ty == ScalarType::Bool {
                let w = self.b.ins().uextend(I32, *s);
                self.b.ins().ineg(w)
            } else {
                *s
            };
            out = Some(match out {
                None => self.b.ins().scalar_to_vector(vec_type(ty), s),
                Some(v) => self.b.ins().insertlane(v, s, j as u8),
            });
        }
        out.unwrap_or_else(|| self.b.ins().splat(vec_type(ty), lanes[0]))
    }

    /// `op` computed lane by lane with the scalar lowering.
    pub(super) fn lanewise(&mut self, op: &Op, ty: ScalarType, local: &Body) -> Result<Value> {
        let operands = op.operands();
        let mut lanes = Vec::with_capacity(LANES as usize);
        for j in 0..LANES {
            for o in &operands {
                if let Some(v) = local.vals.get(&o.index()).copied() {
                    let oty = self.k.values[*o].ty;
                    let s = self.lane(v, oty, j);
                    self.set_value(*o, s);
                }
            }
            lanes.push(self.op(op, ty)?);
        }
        Ok(self.build_vector(ty, &lanes))
    }

    /// The integer constant defining `v`, if any.
    pub(super) fn const_of(&self, v: IrValue) -> Option<u32> {
        match self.k.values.try_get(v).map(|d| &d.op) {
            Some(Op::Const(c)) => Some(c.bits()),
            _ => None,
        }
    }

    /// The value of `v` when it is an integer constant or an add, sub, mul or shl of such
    /// (looking at most `depth` ops deep).
    fn const_eval(&self, v: IrValue, depth: u32) -> Option<u32> {
        let def = self.k.values.try_get(v)?;
        if !matches!(def.ty, ScalarType::U32 | ScalarType::I32) {
            return None;
        }
        match &def.op {
            Op::Const(c) => Some(c.bits()),
            Op::Binary(op, a, b) if depth > 0 => {
                let (x, y) = (
                    self.const_eval(*a, depth - 1)?,
                    self.const_eval(*b, depth - 1)?,
                );
                match op {
                    BinaryOp::Add => Some(x.wrapping_add(y)),
                    BinaryOp::Sub => Some(x.wrapping_sub(y)),
                    BinaryOp::Mul => Some(x.wrapping_mul(y)),
                    BinaryOp::Shl => Some(x.wrapping_shl(y)),
                    BinaryOp::Div
                    | BinaryOp::Rem
                    | BinaryOp::Min
                    | BinaryOp::Max
                    | BinaryOp::And
                    | BinaryOp::Or
                    | BinaryOp::Xor
                    | BinaryOp::Shr
                    | BinaryOp::MulHi => None,
                }
            }
            _ => None,
        }
    }

    /// An op with at least one non-uniform operand.
    fn vector_op(&mut self, op: &Op, ty: ScalarType, local: &Body) -> Result<VVal> {
        let vt = vec_type(ty);
        let v = match op {
            Op::WorkItem | Op::LoopIndex | Op::Param(_) | Op::Const(_) | Op::ReadVar(_) => {
                return Err(internal("operand-free op with a varying operand"))
            }
            Op::Load { buf, index } => {
                let idx = self.vval(local, *index)?;
                return self.vector_load(*buf, idx, op, ty, local);
            }
            Op::SearchSorted { .. } => return Err(crate::decompose::undecomposed(super::BACKEND)),
            Op::Lookup { table, index } => match local.sets.get(&index.index()) {
                Some(set) => {
                    let set = set.clone();
                    let idx = self.vval(local, *index)?;
                    let idx = self.as_vec(idx, ScalarType::U32);
                    self.lookup_by_compares(*table, idx, &set)?
                }
                None => self.lanewise(op, ty, local)?,
            },
            // Cranelift's vector `fma` is fused lane by lane (the instruction, or the exact
            // routine on hosts without FMA), as the scalar one.
            Op::Fma(a, b, c) => {
                let [x, y, z] = [a, b, c].map(|o| self.vval(local, *o));
                let (x, y, z) = (x?, y?, z?);
                let (x, y, z) = (
                    self.as_vec(x, ScalarType::F32),
                    self.as_vec(y, ScalarType::F32),
                    self.as_vec(z, ScalarType::F32),
                );
                self.b.ins().fma(x, y, z)
            }
            Op::Reduce { .. } | Op::FloatToInt { .. } => self.lanewise(op, ty, local)?,
            Op::IntToFloat { value, rounding } => {
                let from = self.k.values[*value].ty;
                if from == ScalarType::I32 && *rounding == Rounding::NearestEven {
                    let x = self.vval(local, *value)?;
                    let x = self.as_vec(x, from);
                    self.b.ins().fcvt_from_sint(F32X4, x)
                } else {
                    self.lanewise(op, ty, local)?
                }
            }
            Op::Bitcast { value, to } => {
                let from = self.k.values[*value].ty;
                let x = self.vval(local, *value)?;
                match x {
                    VVal::Affine { .. } if from != ScalarType::F32 && *to != ScalarType::F32 => {
                        return Ok(x)
                    }
                    _ => {
                        let x = self.as_vec(x, from);
                        if vec_type(from) == vec_type(*to) {
                            x
                        } else {
                            self.b.ins().bitcast(vec_type(*to), vec_cast(), x)
                        }
                    }
                }
            }
            Op::Unary(u, a) => {
                let x = self.vval(local, *a)?;
                let x = self.as_vec(x, ty);
                match (u, ty) {
                    (UnaryOp::Neg, ScalarType::F32) => self.b.ins().fneg(x),
                    (UnaryOp::Abs, ScalarType::F32) => self.b.ins().fabs(x),
                    (UnaryOp::Sqrt, ScalarType::F32) => self.b.ins().sqrt(x),
                    (UnaryOp::Neg, ScalarType::U32 | ScalarType::I32) => self.b.ins().ineg(x),
                    (UnaryOp::Abs, ScalarType::I32) => self.b.ins().iabs(x),
                    (UnaryOp::Not, ScalarType::U32 | ScalarType::I32 | ScalarType::Bool) => {
                        self.b.ins().bnot(x)
                    }
                    (UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sqrt | UnaryOp::Not, _) => {
                        return Err(internal(format!(
                            "{} on {ty} passed the verifier",
                            u.name()
                        )))
                    }
                }
            }
            Op::Binary(bop, a, b) => {
                let (xa, xb) = (self.vval(local, *a)?, self.vval(local, *b)?);
                if let Some(aff) = self.affine(*bop, ty, xa, xb, *b) {
                    return Ok(aff);
                }
                // Integer division, remainder and the high word (no `i32x4` instruction on
                // x86): lane by lane.
                if matches!(bop, BinaryOp::Div | BinaryOp::Rem | BinaryOp::MulHi)
                    && ty != ScalarType::F32
                {
                    self.lanewise(op, ty, local)?
                } else if matches!(bop, BinaryOp::Shl | BinaryOp::Shr) {
                    if let (VVal::Vector(_) | VVal::Affine { .. }, Some(set)) =
                        (xb, local.sets.get(&b.index()))
                    {
                        let set = set.clone();
                        let x = self.as_vec(xa, ty);
                        let amount = self.as_vec(xb, ScalarType::U32);
                        return Ok(VVal::Vector(self.shift_by_set(*bop, ty, x, amount, &set)));
                    }
                    match xb {
                        VVal::Uniform(amount) => {
                            let x = self.as_vec(xa, ty);
                            let amount = self.b.ins().band_imm_u(amount, 31);
                            match (bop, ty) {
                                (BinaryOp::Shl, _) => self.b.ins().ishl(x, amount),
                                (_, ScalarType::I32) => self.b.ins().sshr(x, amount),
                                _ => self.b.ins().ushr(x, amount),
                            }
                        }
                        VVal::Vector(_) | VVal::Affine { .. } => self.lanewise(op, ty, local)?,
                    }
                } else {
                    let x = self.as_vec(xa, ty);
                    let y = self.as_vec(xb, ty);
                    self.vector_binary(*bop, ty, x, y)?
                }
            }
            Op::Cmp(c, a, b) => {
                let oty = self.k.values[*a].ty;
                let (xa, xb) = (self.vval(local, *a)?, self.vval(local, *b)?);
                let x = self.as_vec(xa, oty);
                let y = self.as_vec(xb, oty);
                self.vector_compare(*c, oty, x, y)
            }
            Op::Select {
                cond,
                if_true,
                if_false,
            } => {
                let c = self.vval(local, *cond)?;
                let (t, f) = (self.vval(local, *if_true)?, self.vval(local, *if_false)?);
                let (t, f) = (self.as_vec(t, ty), self.as_vec(f, ty));
                match c {
                    VVal::Uniform(c) => self.b.ins().select(c, t, f),
                    VVal::Vector(_) | VVal::Affine { .. } => {
                        let m = self.as_vec(c, ScalarType::Bool);
                        self.bitselect(m, t, f)
                    }
                }
            }
        };
        debug_assert_eq!(self.b.func.dfg.value_type(v), vt);
        Ok(VVal::Vector(v))
    }

    /// Every value the integer `op` can yield in a lane, when its operands are constants or
    /// values with known small sets (or upper bounds below [`MAX_SET`]) combined by a select,
    /// an add, a sub or a bit operation (at most [`MAX_SET`] values).
    fn value_set(&self, op: &Op, local: &Body) -> Option<Vec<u32>> {
        let set_of = |v: IrValue| match self.const_eval(v, 8) {
            Some(c) => Some(vec![c]),
            None => local.sets.get(&v.index()).cloned().or_else(|| {
                let ub = self.upper_bound(v);
                (ub < MAX_SET as u32).then(|| (0..=ub).collect())
            }),
        };
        let mut signed = false;
        if let Op::Binary(_, a, _) = op {
            signed = self.k.values.try_get(*a).map(|d| d.ty) == Some(ScalarType::I32);
        }
        let mut out: Vec<u32> = match op {
            Op::Select {
                if_true, if_false, ..
            } => {
                let mut s = set_of(*if_true)?;
                s.extend(set_of(*if_false)?);
                s
            }
            Op::Binary(op, a, b) => {
                let (sa, sb) = (set_of(*a)?, set_of(*b)?);
                let mut out = Vec::with_capacity(sa.len() * sb.len());
                for x in &sa {
                    for y in &sb {
                        out.push(set_binary(*op, signed, *x, *y)?);
                    }
                }
                out
            }
            _ => return None,
        };
        out.sort_unstable();
        out.dedup();
        (out.len() <= MAX_SET).then_some(out)
    }

    /// `table[min(index, len - 1)]` per lane when every lane of `idx` is one of `set`:
    /// `t[set[0]]`, replaced by `t[s]` in the lanes where `idx == s` for each further `s`.
    fn lookup_by_compares(
        &mut self,
        table: qforge_ir::TableId,
        idx: Value,
        set: &[u32],
    ) -> Result<Value> {
        let t = self
            .k
            .tables
            .try_get(table)
            .ok_or_else(|| internal("missing table"))?;
        let last = t.data.len().saturating_sub(1);
        let entry = |s: u32| t.data[(s as usize).min(last)];
        let entries: Vec<u32> = set.iter().map(|s| entry(*s)).collect();
        let vt = vec_type(t.ty);
        let mut r = self.const_i32x4([entries[0]; 4]);
        for (s, e) in set.iter().zip(&entries).skip(1) {
            let sv = self.const_i32x4([*s; 4]);
            let m = self.b.ins().icmp(IntCC::Equal, idx, sv);
            let ev = self.const_i32x4([*e; 4]);
            r = self.b.ins().bitselect(m, ev, r);
        }
        Ok(if vt == I32X4 {
            r
        } else {
            self.b.ins().bitcast(vt, vec_cast(), r)
        })
    }

    /// `(base, shift)` when `op` (of type `ty`) is a logical right shift by a constant of an
    /// affine value of stride 1 (lane `j` = `(base + j) >> shift`, see [`Body::shifted`]).
    fn shifted_affine(&self, op: &Op, ty: ScalarType, local: &Body) -> Option<(Value, u32)> {
        match op {
            Op::Binary(BinaryOp::Shr, a, b) if ty == ScalarType::U32 => {
                match (local.vals.get(&a.index()), self.const_of(*b)) {
                    (Some(VVal::Affine { base, stride: 1 }), Some(c)) => Some((*base, c & 31)),
                    _ => None,
                }
            }
            _ => None,
        }
    }

    /// `x shl/shr amount` per lane (IR type `ty`) when every lane of `amount` is one of `set`
    /// (never empty):
    /// the shift of `x` by each constant `s & 31` of the set, selected lane by lane by
    /// `amount == s`.
    fn shift_by_set(
        &mut self,
        op: BinaryOp,
        ty: ScalarType,
        x: Value,
        amount: Value,
        set: &[u32],
    ) -> Value {
        let shift = |l: &mut Self, s: u32| {
            let s = (s & 31) as i64;
            match (op, ty) {
                (BinaryOp::Shl, _) => l.b.ins().ishl_imm_u(x, s),
                (_, ScalarType::I32) => l.b.ins().sshr_imm_u(x, s),
                _ => l.b.ins().ushr_imm_u(x, s),
            }
        };
        let (first, rest) = set.split_first().unwrap_or((&0, &[]));
        let mut r = shift(self, *first);
        for s in rest {
            let sv = self.const_i32x4([*s; 4]);
            let m = self.b.ins().icmp(IntCC::Equal, amount, sv);
            let v = shift(self, *s);
            r = self.bitselect(m, v, r);
        }
        r
    }

    /// `mask ? t : f` per lane, `mask` an `i32x4` of 0 / -1.
    fn bitselect(&mut self, mask: Value, t: Value, f: Value) -> Value {
        let ty = self.b.func.dfg.value_type(t);
        let m = if ty == I32X4 {
            mask
        } else {
            self.b.ins().bitcast(ty, vec_cast(), mask)
        };
        self.b.ins().bitselect(m, t, f)
    }

    /// The affine form of `a op b` on integers, when it has one.
    fn affine(
        &mut self,
        op: BinaryOp,
        ty: ScalarType,
        a: VVal,
        b: VVal,
        b_ir: IrValue,
    ) -> Option<VVal> {
        if !matches!(ty, ScalarType::U32 | ScalarType::I32) {
            return None;
        }
        let parts = |v: VVal| match v {
            VVal::Uniform(s) => Some((s, 0u32)),
            VVal::Affine { base, stride } => Some((base, stride)),
            VVal::Vector(_) => None,
        };
        let ((ba, sa), (bb, sb)) = (parts(a)?, parts(b)?);
        let (base, stride) = match op {
            BinaryOp::Add => (self.b.ins().iadd(ba, bb), sa.wrapping_add(sb)),
            BinaryOp::Sub => (self.b.ins().isub(ba, bb), sa.wrapping_sub(sb)),
            BinaryOp::Mul if sb == 0 => {
                let k = self.const_of(b_ir)?;
                (self.b.ins().imul(ba, bb), sa.wrapping_mul(k))
            }
            BinaryOp::Shl if sb == 0 => {
                let k = self.const_of(b_ir)?;
                (self.b.ins().ishl(ba, bb), sa.wrapping_shl(k))
            }
            BinaryOp::Mul
            | BinaryOp::Shl
            | BinaryOp::Div
            | BinaryOp::Rem
            | BinaryOp::Min
            | BinaryOp::Max
            | BinaryOp::And
            | BinaryOp::Or
            | BinaryOp::Xor
            | BinaryOp::Shr
            | BinaryOp::MulHi => return None,
        };
        Some(VVal::Affine { base, stride })
    }

    /// A binary op on two vectors of IR type `ty` (not integer div/rem/high word, not shifts).
    fn vector_binary(&mut self, op: BinaryOp, ty: ScalarType, x: Value, y: Value) -> Result<Value> {
        use ScalarType::{Bool, F32 as Sf, I32 as Si, U32 as Su};
        Ok(match (op, ty) {
            (BinaryOp::Add, Sf) => self.b.ins().fadd(x, y),
            (BinaryOp::Sub, Sf) => self.b.ins().fsub(x, y),
            (BinaryOp::Mul, Sf) => self.b.ins().fmul(x, y),
            (BinaryOp::Div, Sf) => self.b.ins().fdiv(x, y),
            (BinaryOp::Add, Su | Si) => self.b.ins().iadd(x, y),
            (BinaryOp::Sub, Su | Si) => self.b.ins().isub(x, y),
            (BinaryOp::Mul, Su | Si) => self.b.ins().imul(x, y),
            // min(x, y) = select(y < x, y, x); max(x, y) = select(y > x, y, x): a compare
            // mask and a bitselect, never fmin/fmax.
            (BinaryOp::Min, Sf | Su | Si) => {
                let m = self.vector_compare(CmpOp::Lt, ty, y, x);
                self.bitselect(m, y, x)
            }
            (BinaryOp::Max, Sf | Su | Si) => {
                let m = self.vector_compare(CmpOp::Gt, ty, y, x);
                self.bitselect(m, y, x)
            }
            (BinaryOp::And, Su | Si | Bool) => self.b.ins().band(x, y),
            (BinaryOp::Or, Su | Si | Bool) => self.b.ins().bor(x, y),
            (BinaryOp::Xor, Su | Si | Bool) => self.b.ins().bxor(x, y),
            (
                BinaryOp::Add
                | BinaryOp::Sub
                | BinaryOp::Mul
                | BinaryOp::Div
                | BinaryOp::Rem
                | BinaryOp::Min
                | BinaryOp::Max
                | BinaryOp::And
                | BinaryOp::Or
                | BinaryOp::Xor
                | BinaryOp::Shl
                | BinaryOp::Shr
                | BinaryOp::MulHi,
                _,
            ) => return Err(internal(format!("vector {} on {ty}", op.name()))),
        })
    }

    /// A lane-wise comparison of two vectors with lanes of IR type `ty`: an `i32x4` mask.
    fn vector_compare(&mut self, op: CmpOp, ty: ScalarType, x: Value, y: Value) -> Value {
        match ty {
            ScalarType::F32 => {
                let cc = match op {
                    CmpOp::Eq => FloatCC::Equal,
                    CmpOp::Ne => FloatCC::NotEqual,
                    CmpOp::Lt => FloatCC::LessThan,
                    CmpOp::Le => FloatCC::LessThanOrEqual,
                    CmpOp::Gt => FloatCC::GreaterThan,
                    CmpOp::Ge => FloatCC::GreaterThanOrEqual,
                };
                self.b.ins().fcmp(cc, x, y)
            }
            ScalarType::U32 | ScalarType::I32 | ScalarType::Bool => {
                let signed = ty == ScalarType::I32;
                let cc = match (op, signed) {
                    (CmpOp::Eq, _) => IntCC::Equal,
                    (CmpOp::Ne, _) => IntCC::NotEqual,
                    (CmpOp::Lt, true) => IntCC::SignedLessThan,
                    (CmpOp::Le, true) => IntCC::SignedLessThanOrEqual,
                    (CmpOp::Gt, true) => IntCC::SignedGreaterThan,
                    (CmpOp::Ge, true) => IntCC::SignedGreaterThanOrEqual,
                    (CmpOp::Lt, false) => IntCC::UnsignedLessThan,
                    (CmpOp::Le, false) => IntCC::UnsignedLessThanOrEqual,
                    (CmpOp::Gt, false) => IntCC::UnsignedGreaterThan,
                    (CmpOp::Ge, false) => IntCC::UnsignedGreaterThanOrEqual,
                };
                self.b.ins().icmp(cc, x, y)
            }
        }
    }
}
