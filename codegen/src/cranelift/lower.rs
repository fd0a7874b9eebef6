//! The function skeleton (argument loads, work-item loop), structured control flow and the
//! dispatch from each IR op to its lowering.

use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::types::{F32, I32, I64, I8};
use cranelift_codegen::ir::{
    AbiParam, Function, InstBuilder, MemFlagsData, Signature, Type, UserFuncName, Value,
};
use cranelift_codegen::isa::TargetFrontendConfig;
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext, Variable};
use qforge_ir::{Access, DType, Kernel, Op, ParamId, ParamKind, ScalarType, Stmt, VarId};
use target_lexicon::PointerWidth;

use super::{ArgLayout, LowerOptions, BACKEND};
use crate::error::{Error, Result};

/// What a parameter lowers to, loaded once in the entry block.
#[derive(Clone, Copy)]
pub(super) enum ParamVal {
    /// A buffer: base pointer, element count (bounds checks only), dtype, access.
    Buffer {
        base: Value,
        count: Option<Value>,
        dtype: DType,
        access: Access,
    },
    /// A scalar, already of its Cranelift type.
    Scalar(Value),
}

/// The state of one lowering.
pub(super) struct Lowerer<'a> {
    pub(super) k: &'a Kernel,
    pub(super) b: FunctionBuilder<'a>,
    pub(super) opts: LowerOptions,
    /// Cranelift value of each IR value, once lowered.
    values: Vec<Option<Value>>,
    /// Upper bound of each `u32` IR value, once lowered (`u32::MAX`: unknown).
    pub(super) bounds: Vec<u32>,
    /// Cranelift variable and type of each IR variable.
    vars: Vec<(Variable, Type)>,
    pub(super) params: Vec<ParamVal>,
    /// Base pointer of each table.
    pub(super) tables: Vec<Value>,
    /// Pointer to the `u32` status word (bounds checks only).
    status: Option<Value>,
    /// Set while lowering a load proven in range for every iteration of its loop (see
    /// `accumulate_range.rs`): [`Lowerer::buffer`] reports no element count, so the access is
    /// emitted without a bounds check.
    pub(super) unchecked: bool,
    /// The current work item.
    work_item: Option<Value>,
}

/// The Cranelift type of an IR value type (`bool` is an `i8` holding 0 or 1).
pub(super) fn clif_type(ty: ScalarType) -> Type {
    match ty {
        ScalarType::F32 => F32,
        ScalarType::U32 | ScalarType::I32 => I32,
        ScalarType::Bool => I8,
    }
}

/// An internal error: something the verifier should have excluded.
pub(super) fn internal(what: impl Into<String>) -> Error {
    Error::Backend {
        backend: BACKEND,
        message: format!("internal: {}", what.into()),
    }
}

/// Builds the whole function for `kernel`.
pub(super) fn build(kernel: &Kernel, opts: &LowerOptions) -> Result<Function> {
    let mut sig = Signature::new(opts.call_conv);
    sig.params.push(AbiParam::new(I64));
    sig.params.push(AbiParam::new(I32));
    sig.params.push(AbiParam::new(I32));
    let mut func = Function::with_name_signature(UserFuncName::user(0, 0), sig);
    let mut fctx = FunctionBuilderContext::new();
    let b = FunctionBuilder::new(&mut func, &mut fctx);
    let mut l = Lowerer {
        k: kernel,
        b,
        opts: *opts,
        values: vec![None; kernel.values.len()],
        bounds: vec![u32::MAX; kernel.values.len()],
        vars: Vec::new(),
        params: Vec::new(),
        tables: Vec::new(),
        status: None,
        unchecked: false,
        work_item: None,
    };
    l.function_body()?;
    let config = TargetFrontendConfig {
        default_call_conv: opts.call_conv,
        pointer_width: PointerWidth::U64,
        page_size_align_log2: 12,
    };
    l.b.seal_all_blocks();
    l.b.finalize(config);
    Ok(func)
}

impl Lowerer<'_> {
    /// `iconst.i32` of `v` (zero-extended immediate, as Cranelift requires).
    pub(super) fn c32(&mut self, v: u32) -> Value {
        self.b.ins().iconst(I32, v as i64)
    }

    /// `iconst.i64`.
    pub(super) fn c64(&mut self, v: u64) -> Value {
        self.b.ins().iconst(I64, v as i64)
    }

    /// Flags of the loads of `args`, tables: aligned, never trapping, immutable, movable.
    pub(super) fn const_mem() -> MemFlagsData {
        MemFlagsData::trusted().with_readonly().with_can_move()
    }

    fn function_body(&mut self) -> Result<()> {
        let entry = self.b.create_block();
        self.b.append_block_params_for_function_params(entry);
        self.b.switch_to_block(entry);
        self.b.seal_block(entry);
        let (args, begin, end) = {
            let p = self.b.block_params(entry);
            (p[0], p[1], p[2])
        };
        let layout = ArgLayout::new(self.k, self.opts.bounds_checks);
        let slot = |b: &mut FunctionBuilder, i: usize| {
            b.ins().load(I64, Self::const_mem(), args, (8 * i) as i32)
        };
        for (i, (_, param)) in self.k.params.iter().enumerate() {
            let v = match &param.kind {
                ParamKind::Buffer { dtype, access, .. } => {
                    let base = slot(&mut self.b, i);
                    let count = layout.count(i).map(|c| slot(&mut self.b, c));
                    ParamVal::Buffer {
                        base,
                        count,
                        dtype: *dtype,
                        access: *access,
                    }
                }
                ParamKind::Scalar(ty) => {
                    let raw = slot(&mut self.b, i);
                    let low = self.b.ins().ireduce(I32, raw);
                    ParamVal::Scalar(match ty {
                        ScalarType::F32 => self.b.ins().bitcast(F32, MemFlagsData::new(), low),
                        ScalarType::U32 | ScalarType::I32 => low,
                        ScalarType::Bool => return Err(internal("bool scalar parameter")),
                    })
                }
            };
            self.params.push(v);
        }
        for t in 0..self.k.tables.len() {
            let v = slot(&mut self.b, layout.table(t));
            self.tables.push(v);
        }
        self.status = layout.status().map(|s| slot(&mut self.b, s));
        for (_, var) in self.k.vars.iter() {
            let ty = clif_type(var.ty);
            let v = self.b.declare_var(ty);
            self.vars.push((v, ty));
        }

        self.counted_loop(begin, end, 1, |l, wi| {
            l.work_item = Some(wi);
            for i in 0..l.vars.len() {
                let (var, ty) = l.vars[i];
                let zero = l.zero(ty);
                l.b.def_var(var, zero);
            }
            let k = l.k;
            l.block(&k.body)
        })?;
        self.b.ins().return_(&[]);
        Ok(())
    }

    pub(super) fn zero(&mut self, ty: Type) -> Value {
        if ty == F32 {
            self.b.ins().f32const(0.0)
        } else {
            self.b.ins().iconst(ty, 0)
        }
    }

    /// Emits `if oob { report } else { in_range }`: the report (a cold block) records the
    /// current work item in the status word unless an earlier one is there (`*status = wi + 1`
    /// when `*status == 0`) and yields zero; `in_range` emits the access. Returns the value of
    /// type `ty` the access yields (`None` for a store).
    pub(super) fn guarded(
        &mut self,
        oob: Value,
        ty: Option<Type>,
        in_range: impl FnOnce(&mut Self) -> Option<Value>,
    ) -> Result<Option<Value>> {
        let status = self
            .status
            .ok_or_else(|| internal("bounds check without a status word"))?;
        let wi = self
            .work_item
            .ok_or_else(|| internal("bounds check outside the work-item loop"))?;
        let ok = self.b.create_block();
        let cold = self.b.create_block();
        let join = self.b.create_block();
        let result = ty.map(|ty| self.b.append_block_param(join, ty));
        self.b.set_cold_block(cold);
        self.b.ins().brif(oob, cold, &[], ok, &[]);
        self.b.seal_block(ok);
        self.b.seal_block(cold);

        self.b.switch_to_block(cold);
        let old = self.b.ins().load(I32, MemFlagsData::trusted(), status, 0);
        let none = self.b.ins().icmp_imm_u(IntCC::Equal, old, 0);
        let one = self.c32(1);
        let wi1 = self.b.ins().iadd(wi, one);
        let new = self.b.ins().select(none, wi1, old);
        self.b.ins().store(MemFlagsData::trusted(), new, status, 0);
        let zero = ty.map(|ty| self.zero(ty));
        let args: Vec<_> = zero.into_iter().map(Into::into).collect();
        self.b.ins().jump(join, &args);

        self.b.switch_to_block(ok);
        let value = in_range(self);
        let args: Vec<_> = value.into_iter().map(Into::into).collect();
        self.b.ins().jump(join, &args);
        self.b.seal_block(join);
        self.b.switch_to_block(join);
        Ok(result)
    }

    /// The Cranelift variable of IR variable `var`.
    pub(super) fn var_of(&self, var: VarId) -> Result<Variable> {
        self.vars
            .get(var.index())
            .map(|(v, _)| *v)
            .ok_or_else(|| internal("missing variable"))
    }

    /// Emits `for i in (start..end).step_by(step) { body(i) }` on unsigned integers of the type
    /// of `start` (no wrap-around: the loop stops when `i + step` would reach or pass `end`).
    /// Leaves the builder after the loop.
    pub(super) fn counted_loop(
        &mut self,
        start: Value,
        end: Value,
        step: u32,
        body: impl FnOnce(&mut Self, Value) -> Result<()>,
    ) -> Result<()> {
        let ty = self.b.func.dfg.value_type(start);
        let body_block = self.b.create_block();
        let i = self.b.append_block_param(body_block, ty);
        let exit = self.b.create_block();
        let enter = self.b.ins().icmp(IntCC::UnsignedLessThan, start, end);
        self.b
            .ins()
            .brif(enter, body_block, &[start.into()], exit, &[]);
        self.b.switch_to_block(body_block);
        body(self, i)?;
        // Continue while `i + step < end`, written as `end - i > step` (no overflow: i < end).
        let left = self.b.ins().isub(end, i);
        let step_v = self.b.ins().iconst(ty, step as i64);
        let more = self.b.ins().icmp(IntCC::UnsignedGreaterThan, left, step_v);
        let next = self.b.ins().iadd(i, step_v);
        self.b
            .ins()
            .brif(more, body_block, &[next.into()], exit, &[]);
        self.b.seal_block(body_block);
        self.b.seal_block(exit);
        self.b.switch_to_block(exit);
        Ok(())
    }

    /// The Cranelift value of an IR value lowered earlier.
    pub(super) fn val(&self, v: qforge_ir::Value) -> Result<Value> {
        self.values
            .get(v.index())
            .copied()
            .flatten()
            .ok_or_else(|| internal(format!("%{} used before it was lowered", v.index())))
    }

    /// The buffer behind parameter `p` (no element count while [`Lowerer::unchecked`]).
    pub(super) fn buffer(&self, p: ParamId) -> Result<(Value, Option<Value>, DType, Access)> {
        match self.params.get(p.index()) {
            Some(ParamVal::Buffer {
                base,
                count,
                dtype,
                access,
            }) => Ok((*base, count.filter(|_| !self.unchecked), *dtype, *access)),
            _ => Err(internal(format!(
                "parameter #{} is not a buffer",
                p.index()
            ))),
        }
    }

    /// Records the Cranelift value of IR value `v`.
    pub(super) fn set_value(&mut self, v: qforge_ir::Value, out: Value) {
        self.values[v.index()] = Some(out);
    }

    /// Sets IR variable `var` to `value` (of the variable's type).
    pub(super) fn assign_var(&mut self, var: qforge_ir::VarId, value: Value) -> Result<()> {
        let (var, _) = *self
            .vars
            .get(var.index())
            .ok_or_else(|| internal("missing variable"))?;
        self.b.def_var(var, value);
        Ok(())
    }

    /// Records the upper bound of IR value `v` defined by `def` (see [`Lowerer::bound_of`]).
    pub(super) fn set_bound(&mut self, v: qforge_ir::Value, def: &qforge_ir::ValueDef) {
        self.bounds[v.index()] = self.bound_of(def);
    }

    /// Lowers a block of statements.
    pub(super) fn scalar_block(&mut self, stmts: &[Stmt]) -> Result<()> {
        self.block(stmts)
    }

    fn block(&mut self, stmts: &[Stmt]) -> Result<()> {
        for stmt in stmts {
            self.stmt(stmt)?;
        }
        Ok(())
    }

    fn stmt(&mut self, stmt: &Stmt) -> Result<()> {
        match stmt {
            Stmt::Accumulate {
                index,
                len,
                order,
                body,
                accs,
            } => self.accumulate(*index, *len, *order, body, accs)?,
            Stmt::Let(v) => {
                let def = self
                    .k
                    .values
                    .try_get(*v)
                    .ok_or_else(|| internal("let of a missing value"))?;
                let out = self.op(&def.op, def.ty)?;
                self.values[v.index()] = Some(out);
                self.bounds[v.index()] = self.bound_of(def);
            }
            Stmt::Store {
                buf,
                index,
                value,
                rounding,
            } => {
                let (index, value) = (self.val(*index)?, self.val(*value)?);
                self.store(*buf, index, value, *rounding)?;
            }
            Stmt::Assign { var, value } => {
                let value = self.val(*value)?;
                let var = self.var_of(*var)?;
                self.b.def_var(var, value);
            }
            Stmt::If {
                cond,
                then_body,
                else_body,
            } => {
                let cond = self.val(*cond)?;
                let then_block = self.b.create_block();
                let merge = self.b.create_block();
                let else_block = if else_body.is_empty() {
                    merge
                } else {
                    self.b.create_block()
                };
                self.b.ins().brif(cond, then_block, &[], else_block, &[]);
                self.b.seal_block(then_block);
                self.b.switch_to_block(then_block);
                self.block(then_body)?;
                self.b.ins().jump(merge, &[]);
                if !else_body.is_empty() {
                    self.b.seal_block(else_block);
                    self.b.switch_to_block(else_block);
                    self.block(else_body)?;
                    self.b.ins().jump(merge, &[]);
                }
                self.b.seal_block(merge);
                self.b.switch_to_block(merge);
            }
            Stmt::For {
                index,
                start,
                end,
                step,
                body,
            } => {
                // The index stays below `end`.
                self.bounds[index.index()] = self.upper_bound(*end).saturating_sub(1);
                let (start, end) = (self.val(*start)?, self.val(*end)?);
                if self.opts.simd
                    && *step == 1
                    && super::vectorize::eligible(self.k, Some(*index), body)
                {
                    return self.vector_for(*index, start, end, body);
                }
                self.counted_loop(start, end, *step, |l, i| {
                    l.values[index.index()] = Some(i);
                    l.block(body)
                })?;
            }
        }
        Ok(())
    }

    /// Lowers one op yielding a value of IR type `ty`.
    pub(super) fn op(&mut self, op: &Op, ty: ScalarType) -> Result<Value> {
        Ok(match op {
            Op::WorkItem => self
                .work_item
                .ok_or_else(|| internal("work item outside the loop"))?,
            Op::LoopIndex => return Err(internal("loop index defined by a let")),
            Op::Param(p) => match self.params.get(p.index()) {
                Some(ParamVal::Scalar(v)) => *v,
                _ => {
                    return Err(internal(format!(
                        "parameter #{} is not a scalar",
                        p.index()
                    )))
                }
            },
            Op::Const(c) => match ty {
                ScalarType::F32 => self.b.ins().f32const(f32::from_bits(c.bits())),
                ScalarType::U32 | ScalarType::I32 => self.c32(c.bits()),
                ScalarType::Bool => self.b.ins().iconst(I8, c.bits() as i64),
            },
            Op::ReadVar(var) => {
                let var = self.var_of(*var)?;
                self.b.use_var(var)
            }
            Op::Load { buf, index } => {
                let index = self.val(*index)?;
                self.load(*buf, index)?
            }
            Op::Lookup { table, index } => self.lookup(*table, *index)?,
            Op::SearchSorted { .. } => return Err(crate::decompose::undecomposed(BACKEND)),
            Op::Unary(u, a) => match (u, self.negatable_compare(*a)) {
                // `not(cmp)` is one compare with the complemented condition, which the
                // instruction selector can fuse into a following select or branch.
                (qforge_ir::UnaryOp::Not, Some((c, x, y))) => {
                    let operand_ty = self.k.values[x].ty;
                    let (x, y) = (self.val(x)?, self.val(y)?);
                    self.compare_negated(c, operand_ty, x, y)?
                }
                _ => {
                    let a = self.val(*a)?;
                    self.unary(*u, ty, a)?
                }
            },
            Op::Binary(bop, x, y) => {
                let operand_ty = self.k.values[*x].ty;
                let (x, y) = (self.val(*x)?, self.val(*y)?);
                self.binary(*bop, operand_ty, x, y)?
            }
            Op::Fma(a, b, c) => {
                let (a, b, c) = (self.val(*a)?, self.val(*b)?, self.val(*c)?);
                self.b.ins().fma(a, b, c)
            }
            Op::Cmp(c, x, y) => {
                let operand_ty = self.k.values[*x].ty;
                let (x, y) = (self.val(*x)?, self.val(*y)?);
                self.compare(*c, operand_ty, x, y)?
            }
            Op::Select {
                cond,
                if_true,
                if_false,
            } => {
                let (c, t, f) = (self.val(*cond)?, self.val(*if_true)?, self.val(*if_false)?);
                self.b.ins().select(c, t, f)
            }
            Op::FloatToInt {
                value,
                to,
                rounding,
            } => {
                let v = self.val(*value)?;
                self.float_to_int(v, *to, *rounding)?
            }
            Op::IntToFloat { value, rounding } => {
                let from = self.k.values[*value].ty;
                let v = self.val(*value)?;
                self.int_to_float(v, from, *rounding)?
            }
            Op::Bitcast { value, to } => {
                let from = self.k.values[*value].ty;
                let v = self.val(*value)?;
                self.bitcast(v, from, *to)?
            }
            Op::Reduce {
                kind,
                buf,
                start,
                len,
                order,
            } => {
                let (start, len) = (self.val(*start)?, self.val(*len)?);
                self.reduce(*kind, *buf, start, len, *order)?
            }
        })
    }
}
