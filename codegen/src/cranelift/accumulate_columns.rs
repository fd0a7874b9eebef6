//! `Stmt::Accumulate` in `Sequential` order with accumulators as vector lanes: the dense
//! products' tile (`qforge_kernels::gemm`, `B` stored `[L, N]`), where each output keeps one
//! running sum and the `fma`s of 4 outputs of a row are one `f32x4` `fma`.
//!
//! A run is 4 consecutive accumulators `t .. t + 4` with one shared factor `a` and the other
//! factors `b_k = buf[row + col_k]` (the second factor, or else the first: the product is the
//! same): loads of one `f32` or `bf16` buffer defined in the body and used by nothing but runs
//! as such (no statement, no other factor), `row` the loop index `i` or
//! `i * s`, either plus a loop constant `o` (the same value for the 4), `col_k` available before
//! the loop. Before the loop one check covers every run: `col_k = col_0 + k`, and
//! `(len - 1) * s + o + col_0 + 3` (in 64 bits) below `2^32` (so no `u32` index of any iteration
//! wraps) and below the buffer's element count.
//! The body's other loads at `u + i` (`accumulate_range.rs`) or `i * s + u` are proven in range
//! the same way and run unchecked. When it holds, the loop lowers the body without the runs' loads and loads each run's 4 values
//! with one vector load at `row + col_0` (a `bf16` run: one 8-byte load widened exactly), every
//! other accumulator as in the scalar loop; lane `k` of the run does `p = fma(a, b_k, p)` from
//! `-0.0` in increasing `i`, the same operations as the scalar loop, so the same bits. When it
//! fails (a tile's last columns clamped to the last one, a short buffer) the scalar loop runs,
//! with its bounds checks and reports. A skipped load is proven in range, so it could never have
//! reported. The totals are assigned in accumulator order, so accumulators that share a variable
//! leave the last one's total, as in the scalar loop.

use std::collections::{HashMap, HashSet};

use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::types::{F32, F32X4, I16X8, I64, I64X2, I8};
use cranelift_codegen::ir::{InstBuilder, Value};
use cranelift_frontend::Variable;
use qforge_ir::{Accum, BinaryOp, DType, Op, ParamId, ScalarType, Stmt, Value as IrValue};

use super::accumulate_range::loop_defined;
use super::lower::{internal, Lowerer};
use super::vectorize::{vec_cast, LANES};
use crate::error::Result;

/// Accumulators per run: the `f32` lanes of a Cranelift vector.
const RUN: usize = LANES as usize;

/// 4 accumulators computed as one vector (see the module docs).
pub(super) struct Run {
    /// Positions of the accumulators in the statement's list, lane by lane.
    accs: [usize; RUN],
    /// Their shared factor.
    a: IrValue,
    /// Lane 0's other factor (the others differ in `col` only).
    first: Column,
    /// The loop-invariant part of each lane's index.
    cols: [IrValue; RUN],
}

/// The runs of an accumulate and the loads the vector loop does not lower.
pub(super) struct ColumnPlan {
    runs: Vec<Run>,
    skipped: HashSet<usize>,
}

/// A load at `buf[row + col]`: `row` the loop index or `index * stride`, plus `offset` if any,
/// `stride`, `offset` and `col` available before the loop (`offset`: a dense product's `B` in
/// panels, `row = l * P + first * (L - 1)`).
#[derive(Clone, Copy)]
struct Column {
    buf: ParamId,
    row: IrValue,
    stride: Option<IrValue>,
    offset: Option<IrValue>,
    col: IrValue,
}

impl Lowerer<'_> {
    /// The column plan of a `Sequential` accumulate over `index` (body after hoisting), or
    /// `None` when no run qualifies or SIMD is off.
    pub(super) fn column_plan(
        &self,
        index: IrValue,
        body: &[Stmt],
        accs: &[Accum],
    ) -> Option<ColumnPlan> {
        if !self.opts.simd {
            return None;
        }
        let defined = loop_defined(index, body);
        // Each accumulator's column factor (the second factor, else the first: `fma` gives the
        // same bits either way) and its other, shared factor.
        let factors: Vec<Option<(Column, IrValue, IrValue)>> = accs
            .iter()
            .map(|acc| {
                [(acc.b, acc.a), (acc.a, acc.b)]
                    .into_iter()
                    .find_map(|(col, shared)| {
                        defined.contains(&col.index()).then_some(())?;
                        let c = self.column_of(col, index, &defined)?;
                        Some((c, col, shared))
                    })
            })
            .collect();
        // Values a body statement reads: a load among them must be lowered.
        let mut operands: HashSet<usize> = HashSet::new();
        for stmt in body {
            if let Stmt::Let(v) = stmt {
                let def = self.k.values.try_get(*v)?;
                operands.extend(def.op.operands().iter().map(|o| o.index()));
            }
        }
        let mut banned: HashSet<usize> = HashSet::new();
        loop {
            let plan = self.runs(accs, &factors, &banned);
            // A skipped load must have no use but as a run's column factor.
            let mut needed = operands.clone();
            let mut in_run = vec![false; accs.len()];
            for run in &plan.runs {
                needed.insert(run.a.index());
                for t in run.accs {
                    in_run[t] = true;
                }
            }
            for (t, acc) in accs.iter().enumerate() {
                if !in_run[t] {
                    needed.extend([acc.a.index(), acc.b.index()]);
                }
            }
            let bad: Vec<usize> = plan.skipped.intersection(&needed).copied().collect();
            if bad.is_empty() {
                return (!plan.runs.is_empty()).then_some(plan);
            }
            banned.extend(bad);
        }
    }

    /// The runs of 4 consecutive accumulators (greedy, in order) whose `factors` are columns of
    /// one buffer at one row, with one shared factor, no column factor in `banned`.
    fn runs(
        &self,
        accs: &[Accum],
        factors: &[Option<(Column, IrValue, IrValue)>],
        banned: &HashSet<usize>,
    ) -> ColumnPlan {
        let (mut runs, mut skipped, mut t) = (Vec::new(), HashSet::new(), 0);
        while t + RUN <= accs.len() {
            let lanes: Option<Vec<&(Column, IrValue, IrValue)>> =
                factors[t..t + RUN].iter().map(Option::as_ref).collect();
            let fits = lanes.as_ref().is_some_and(|f| {
                let (c0, _, a0) = f[0];
                f.iter().all(|(c, col, a)| {
                    *a == *a0
                        && c.buf == c0.buf
                        && c.row == c0.row
                        && c.stride == c0.stride
                        && c.offset == c0.offset
                        && !banned.contains(&col.index())
                })
            });
            match lanes {
                Some(f) if fits => {
                    skipped.extend(f.iter().map(|(_, col, _)| col.index()));
                    runs.push(Run {
                        accs: std::array::from_fn(|k| t + k),
                        a: f[0].2,
                        first: f[0].0,
                        cols: std::array::from_fn(|k| f[k].0.col),
                    });
                    t += RUN;
                }
                _ => t += 1,
            }
        }
        ColumnPlan { runs, skipped }
    }

    /// `b` as `buf[row + col]` (see the module docs), `buf` an `f32` or `bf16` buffer.
    fn column_of(&self, b: IrValue, index: IrValue, defined: &HashSet<usize>) -> Option<Column> {
        let column = self.strided_load(b, index, defined)?;
        let (_, _, dtype, _) = self.buffer(column.buf).ok()?;
        matches!(dtype, DType::F32 | DType::BF16).then_some(column)
    }

    /// The load `v` as `buf[row + col]`, `row` the loop index `index` or `index * s`, either
    /// plus `o`, with `s`, `o` and `col` not in `defined` (available before the loop).
    fn strided_load(&self, v: IrValue, index: IrValue, defined: &HashSet<usize>) -> Option<Column> {
        let op = |v: IrValue| self.k.values.try_get(v).map(|d| (&d.op, d.ty));
        let Some((Op::Load { buf, index: at }, _)) = op(v) else {
            return None;
        };
        let Some((Op::Binary(BinaryOp::Add, x, y), ScalarType::U32)) = op(*at) else {
            return None;
        };
        let inside = |v: &IrValue| defined.contains(&v.index());
        let (row, col) = match (inside(x), inside(y)) {
            (true, false) => (*x, *y),
            (false, true) => (*y, *x),
            _ => return None,
        };
        // `index`, `index * s` or either plus a loop constant: `(stride, offset)`.
        let scaled = |v: IrValue| -> Option<Option<IrValue>> {
            if v == index {
                return Some(None);
            }
            match op(v) {
                Some((Op::Binary(BinaryOp::Mul, p, q), ScalarType::U32)) => {
                    if *p == index && !inside(q) {
                        Some(Some(*q))
                    } else if *q == index && !inside(p) {
                        Some(Some(*p))
                    } else {
                        None
                    }
                }
                _ => None,
            }
        };
        let (stride, offset) = match scaled(row) {
            Some(stride) => (stride, None),
            None => match op(row) {
                Some((Op::Binary(BinaryOp::Add, p, q), ScalarType::U32)) => {
                    match (inside(p), inside(q)) {
                        (true, false) => (scaled(*p)?, Some(*q)),
                        (false, true) => (scaled(*q)?, Some(*p)),
                        _ => return None,
                    }
                }
                _ => return None,
            },
        };
        Some(Column {
            buf: *buf,
            row,
            stride,
            offset,
            col,
        })
    }

    /// The `i8` condition "`(len - 1) * s + offset + col + span` is below `2^32` and below
    /// `buf`'s element count" (`last_i = len - 1` in 64 bits): every element `row + col + k`,
    /// `k <= span`, of every iteration exists and no `u32` index wraps.
    fn span_proof(
        &mut self,
        column: &Column,
        col: Value,
        last_i: Value,
        span: u32,
    ) -> Result<Value> {
        let last_row = match column.stride {
            Some(s) => {
                let s = self.val(s)?;
                let s64 = self.b.ins().uextend(I64, s);
                self.b.ins().imul(last_i, s64)
            }
            None => last_i,
        };
        let c64 = self.b.ins().uextend(I64, col);
        let mut last = self.b.ins().iadd(last_row, c64);
        if let Some(offset) = column.offset {
            let o = self.val(offset)?;
            let o64 = self.b.ins().uextend(I64, o);
            last = self.b.ins().iadd(last, o64);
        }
        let last = self.b.ins().iadd_imm_u(last, span as i64);
        let limit = self.c64(1 << 32);
        let (_, count, _, _) = self.buffer(column.buf)?;
        let bound = match count {
            Some(c) => self.b.ins().umin(c, limit),
            None => limit,
        };
        Ok(self.b.ins().icmp(IntCC::UnsignedLessThan, last, bound))
    }

    /// The `i8` condition under which every run of `plan` and every load of `strided` (loads
    /// at `row + col` of `rest`, see [`Lowerer::strided_load`]) is proven (see the module docs),
    /// for a loop of `len` (`u32`) iterations.
    fn columns_proof(
        &mut self,
        plan: &ColumnPlan,
        strided: &[Column],
        len: Value,
    ) -> Result<Value> {
        let mut proof = self.b.ins().iconst(I8, 1);
        let len64 = self.b.ins().uextend(I64, len);
        let last_i = self.b.ins().iadd_imm_s(len64, -1);
        for run in &plan.runs {
            let c0 = self.val(run.cols[0])?;
            for (k, col) in run.cols.iter().enumerate().skip(1) {
                let want = self.b.ins().iadd_imm_u(c0, k as i64);
                let got = self.val(*col)?;
                let same = self.b.ins().icmp(IntCC::Equal, got, want);
                proof = self.b.ins().band(proof, same);
            }
            let inside = self.span_proof(&run.first, c0, last_i, (RUN - 1) as u32)?;
            proof = self.b.ins().band(proof, inside);
        }
        for column in strided {
            let col = self.val(column.col)?;
            let inside = self.span_proof(column, col, last_i, 0)?;
            proof = self.b.ins().band(proof, inside);
        }
        // With no iteration nothing is read; `len - 1` wrapped above, so say so explicitly.
        let some = self.b.ins().icmp_imm_u(IntCC::NotEqual, len, 0);
        Ok(self.b.ins().band(proof, some))
    }

    /// The 4 values of `run` in the current iteration: one vector load at `row + col_0`.
    fn run_values(&mut self, run: &Run) -> Result<Value> {
        let row = self.val(run.first.row)?;
        let c0 = self.val(run.first.col)?;
        let at = self.b.ins().iadd(row, c0);
        let at = self.b.ins().uextend(I64, at);
        let (base, _, dtype, access) = self.buffer(run.first.buf)?;
        let flags = self.buffer_mem(access);
        let addr = self.offset(base, at, dtype);
        Ok(match dtype {
            DType::BF16 => {
                // Four bf16 in 8 bytes, each widened exactly: its bits in the high half.
                let word = self.b.ins().load(I64, flags, addr, 0);
                let v = self.b.ins().scalar_to_vector(I64X2, word);
                let halves = self.b.ins().bitcast(I16X8, vec_cast(), v);
                let words = self.b.ins().uwiden_low(halves);
                let bits = self.b.ins().ishl_imm_u(words, 16);
                self.b.ins().bitcast(F32X4, vec_cast(), bits)
            }
            DType::F32 => self.b.ins().load(F32X4, flags, addr, 0),
            other => return Err(internal(format!("column run of a {other} buffer"))),
        })
    }

    /// The accumulate with `plan`'s runs as vectors when [`Lowerer::columns_proof`] holds,
    /// else `scalar` (the plain sequential loop, laid out as the cold path); joins after both.
    pub(super) fn accumulate_columns(
        &mut self,
        index: IrValue,
        len: Value,
        body: &[Stmt],
        accs: &[Accum],
        plan: &ColumnPlan,
        scalar: impl FnOnce(&mut Self) -> Result<()>,
    ) -> Result<()> {
        let rest: Vec<Stmt> = body
            .iter()
            .filter(|s| !matches!(s, Stmt::Let(v) if plan.skipped.contains(&v.index())))
            .cloned()
            .collect();
        let (loads_proof, mut proven) = self.proven_loads(index, &rest, len)?;
        let defined = loop_defined(index, &rest);
        let mut strided = Vec::new();
        for stmt in &rest {
            if let Stmt::Let(v) = stmt {
                if proven.contains(&v.index()) {
                    continue;
                }
                if let Some(column) = self.strided_load(*v, index, &defined) {
                    strided.push(column);
                    proven.insert(v.index());
                }
            }
        }
        let proof = self.columns_proof(plan, &strided, len)?;
        let proof = self.b.ins().band(proof, loads_proof);
        self.two_paths(
            proof,
            None,
            |l| {
                l.column_loop(index, len, &rest, accs, plan, &proven)?;
                Ok(None)
            },
            |l| {
                scalar(l)?;
                Ok(None)
            },
        )?;
        Ok(())
    }

    /// The vector loop of the module docs over `rest` (the body without the runs' loads), the
    /// loads in `proven` unchecked, then the totals assigned in accumulator order.
    fn column_loop(
        &mut self,
        index: IrValue,
        len: Value,
        rest: &[Stmt],
        accs: &[Accum],
        plan: &ColumnPlan,
        proven: &HashSet<usize>,
    ) -> Result<()> {
        let in_run: HashSet<usize> = plan.runs.iter().flat_map(|r| r.accs).collect();
        let neg_zero = self.b.ins().f32const(-0.0);
        let neg_zeros = self.b.ins().splat(F32X4, neg_zero);
        let declare = |l: &mut Self, ty, init| {
            let v: Variable = l.b.declare_var(ty);
            l.b.def_var(v, init);
            v
        };
        let vectors: Vec<Variable> = plan
            .runs
            .iter()
            .map(|_| declare(self, F32X4, neg_zeros))
            .collect();
        let scalars: Vec<Option<Variable>> = (0..accs.len())
            .map(|t| (!in_run.contains(&t)).then(|| declare(self, F32, neg_zero)))
            .collect();
        let zero = self.c32(0);
        self.counted_loop(zero, len, 1, |l, i| {
            l.set_value(index, i);
            for stmt in rest {
                let trusted = matches!(stmt, Stmt::Let(v) if proven.contains(&v.index()));
                let saved = l.unchecked;
                l.unchecked = saved || trusted;
                let done = l.scalar_block(std::slice::from_ref(stmt));
                l.unchecked = saved;
                done?;
            }
            // Each shared factor splatted once, each run of columns loaded once.
            let mut splats: HashMap<usize, Value> = HashMap::new();
            let mut loaded: HashMap<(usize, usize, usize), Value> = HashMap::new();
            for (run, p) in plan.runs.iter().zip(&vectors) {
                let key = (
                    run.first.buf.index(),
                    run.first.row.index(),
                    run.first.col.index(),
                );
                let b = match loaded.get(&key) {
                    Some(b) => *b,
                    None => {
                        let b = l.run_values(run)?;
                        loaded.insert(key, b);
                        b
                    }
                };
                let a = match splats.get(&run.a.index()) {
                    Some(a) => *a,
                    None => {
                        let a = l.val(run.a)?;
                        let a = l.b.ins().splat(F32X4, a);
                        splats.insert(run.a.index(), a);
                        a
                    }
                };
                l.fma_into(*p, a, b);
            }
            for (acc, p) in accs.iter().zip(&scalars) {
                if let Some(p) = p {
                    let (a, b) = (l.val(acc.a)?, l.val(acc.b)?);
                    l.fma_into(*p, a, b);
                }
            }
            Ok(())
        })?;
        let mut totals: Vec<Option<Value>> = scalars
            .iter()
            .map(|p| p.map(|p| self.b.use_var(p)))
            .collect();
        for (run, p) in plan.runs.iter().zip(&vectors) {
            let v = self.b.use_var(*p);
            for (k, t) in run.accs.iter().enumerate() {
                totals[*t] = Some(self.b.ins().extractlane(v, k as u8));
            }
        }
        for (acc, total) in accs.iter().zip(totals) {
            let total = total.ok_or_else(|| internal("accumulator without a total"))?;
            self.assign_var(acc.var, total)?;
        }
        Ok(())
    }
}
