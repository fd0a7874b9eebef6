//! `Stmt::Accumulate`: summation loops whose order is pinned by the IR.
//!
//! Element `i` of `0..len` runs the body, then each accumulator `t` does
//! `partial[t][i % w] = fma(a_t, b_t, partial[t][i % w])` (`w` = the ways of the order, 1 for
//! `Sequential`; every partial starts at `-0.0`), and the partials of each accumulator are
//! combined by the halving tree `w' = w; while w' > 1 { w' /= 2; p[j] += p[j + w'] for j < w' }`.
//! Every `fma` is Cranelift's fused `fma` (one rounding: the hardware instruction, or the exact
//! software routine the JIT registers when the host lacks it), every tree step one IEEE `fadd`.
//!
//! First, the body `let`s that depend only on values defined before the statement and cannot
//! fault (every op but loads and reductions: integer division is guarded, lookups clamp) are
//! computed once before the loop; they have no side effects, so computing them when `len` is 0
//! changes nothing. Then one of three shapes, all giving the same bits:
//! - `Sequential`: one partial per accumulator, kept in a Cranelift variable; runs of 4
//!   accumulators whose second factors are consecutive elements (the dense products' tile)
//!   as one `f32x4` (`accumulate_columns.rs`).
//! - `Strided(w)`, scalar: the `w` partials of each accumulator live in a stack slot; element
//!   `i` updates slot entry `i & (w - 1)`.
//! - `Strided(w)` with `w` a multiple of 4, SIMD on and a body the loop vectorizer accepts:
//!   groups of 4 consecutive elements `4g .. 4g + 3` run the body once in vectors (lane `l` =
//!   element `4g + l`, lowered by `vectorize.rs`, including its exact lane-by-lane fallbacks and
//!   bounds reports); since `w` is a multiple of 4, those elements go to the partials
//!   `(4g) % w + l`, i.e. lane `l` of the `f32x4` at slot entry `(4g) % w`, updated with one
//!   `f32x4` `fma` (loads proven in range for the whole loop run unchecked, see
//!   `accumulate_range.rs`). The last `len % 4` elements run the scalar body on the same slot. The tree
//!   then adds whole vectors while `w' >= 4` (lane `l` of vector `q` is partial `4q + l`, so
//!   `p[j] += p[j + w']` for `j < w'` is `v[q] += v[q + w'/4]` for `q < w'/4`), and finishes the
//!   last two steps (`p0 += p2, p1 += p3; p0 += p1`) on extracted lanes.

use std::collections::HashSet;

use cranelift_codegen::ir::types::{F32, F32X4, I64};
use cranelift_codegen::ir::{InstBuilder, MemFlagsData, StackSlotData, StackSlotKind, Value};
use cranelift_frontend::Variable;
use qforge_ir::{Accum, Op, ReduceOrder, Stmt, Value as IrValue};

use super::accumulate_wide::WIDE;
use super::lower::{internal, Lowerer};
use super::vectorize::{eligible, Body, LANES};
use crate::error::Result;

/// Flags of the partial-sum slot accesses: aligned (the slot is 16-aligned, every offset a
/// multiple of the access size), never trapping.
pub(super) fn slot_mem() -> MemFlagsData {
    MemFlagsData::trusted()
}

/// What the vector loop over groups of 4 elements works on.
pub(super) struct Groups<'b> {
    /// The loop index value.
    pub(super) index: IrValue,
    /// Partials per accumulator (a multiple of 4).
    pub(super) ways: u32,
    /// Address of the partials slot.
    pub(super) slot: Value,
    /// The body after hoisting.
    pub(super) body: &'b [Stmt],
    pub(super) accs: &'b [Accum],
}

/// Whether evaluating `op` can have an effect beyond its value (a failed bounds check).
pub(super) fn may_fault(op: &Op) -> bool {
    match op {
        Op::Load { .. } | Op::Reduce { .. } | Op::LoopIndex => true,
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
        | Op::Bitcast { .. } => false,
    }
}

impl Lowerer<'_> {
    /// Lowers `Stmt::Accumulate` (see the module docs).
    pub(super) fn accumulate(
        &mut self,
        index: IrValue,
        len: IrValue,
        order: ReduceOrder,
        body: &[Stmt],
        accs: &[Accum],
    ) -> Result<()> {
        // A power of two in 1..=64 for a verified kernel.
        let ways = order.ways();
        if accs.is_empty() {
            return Err(internal("accumulate without accumulators"));
        }
        // The index stays below `len`.
        self.bounds[index.index()] = self.upper_bound(len).saturating_sub(1);
        let len = self.val(len)?;
        let body = &self.hoist_invariants(index, body)?;
        if ways == 1 {
            return self.accumulate_sequential(index, len, body, accs);
        }
        let vector =
            self.opts.simd && ways.is_multiple_of(LANES as u32) && eligible(self.k, None, body);
        let slot = self.partials_slot(ways, accs.len(), vector);
        let zero = self.c32(0);
        let tail_start = if vector {
            let groups_end = self.b.ins().band_imm_u(len, !3u32 as i64);
            let lp = Groups {
                index,
                ways,
                slot,
                body,
                accs,
            };
            let (proof, proven) = self.proven_loads(index, body, groups_end)?;
            if proven.is_empty() {
                self.group_loop(&lp, zero, groups_end, &proven)?;
            } else {
                // The loop with the proven loads unchecked when the proof holds, else the
                // checked loop (see `accumulate_range.rs`).
                let (fast, slow, join) = (
                    self.b.create_block(),
                    self.b.create_block(),
                    self.b.create_block(),
                );
                self.b.ins().brif(proof, fast, &[], slow, &[]);
                self.b.seal_block(fast);
                self.b.seal_block(slow);
                self.b.switch_to_block(fast);
                let start = if WIDE.is_multiple_of(ways) {
                    let plan = self.wide_plan(body, &proven);
                    let wide_end = self.b.ins().band_imm_u(len, !(WIDE - 1) as i64);
                    self.wide_loop(&lp, &plan, wide_end, &proven)?;
                    wide_end
                } else {
                    zero
                };
                self.group_loop(&lp, start, groups_end, &proven)?;
                self.b.ins().jump(join, &[]);
                self.b.switch_to_block(slow);
                self.group_loop(&lp, zero, groups_end, &HashSet::new())?;
                self.b.ins().jump(join, &[]);
                self.b.seal_block(join);
                self.b.switch_to_block(join);
            }
            groups_end
        } else {
            zero
        };
        self.counted_loop(tail_start, len, 1, |l, i| {
            l.set_value(index, i);
            l.scalar_block(body)?;
            let entry = l.b.ins().band_imm_u(i, (ways - 1) as i64);
            let entry = l.b.ins().uextend(I64, entry);
            let bytes = l.b.ins().ishl_imm_u(entry, 2);
            let at = l.b.ins().iadd(slot, bytes);
            for (t, acc) in accs.iter().enumerate() {
                let (a, b) = (l.val(acc.a)?, l.val(acc.b)?);
                let offset = (4 * ways as usize * t) as i32;
                let p = l.b.ins().load(F32, slot_mem(), at, offset);
                let p = l.b.ins().fma(a, b, p);
                l.b.ins().store(slot_mem(), p, at, offset);
            }
            Ok(())
        })?;
        for (t, acc) in accs.iter().enumerate() {
            let first = (4 * ways as usize * t) as i32;
            let total = if vector {
                self.tree_vector(slot, first, ways)
            } else {
                self.tree_scalar(slot, first, ways)
            };
            self.assign_var(acc.var, total)?;
        }
        Ok(())
    }

    /// Lowers the hoistable `let`s of `body` (see the module docs) here and returns the other
    /// statements, in order.
    fn hoist_invariants(&mut self, index: IrValue, body: &[Stmt]) -> Result<Vec<Stmt>> {
        let mut varying: HashSet<usize> = HashSet::from([index.index()]);
        let mut rest = Vec::new();
        for stmt in body {
            let Stmt::Let(v) = stmt else {
                rest.push(stmt.clone());
                continue;
            };
            let def = self
                .k
                .values
                .try_get(*v)
                .ok_or_else(|| internal("let of a missing value"))?
                .clone();
            let invariant = !may_fault(&def.op)
                && def
                    .op
                    .operands()
                    .iter()
                    .all(|o| !varying.contains(&o.index()));
            if invariant {
                let out = self.op(&def.op, def.ty)?;
                self.set_value(*v, out);
                self.set_bound(*v, &def);
            } else {
                varying.insert(v.index());
                rest.push(stmt.clone());
            }
        }
        Ok(rest)
    }

    /// `Sequential`: one partial per accumulator, `p = fma(a, b, p)` per element; with runs of
    /// accumulators as vector lanes when the column plan applies (`accumulate_columns.rs`),
    /// else [`Lowerer::sequential_loop`].
    fn accumulate_sequential(
        &mut self,
        index: IrValue,
        len: Value,
        body: &[Stmt],
        accs: &[Accum],
    ) -> Result<()> {
        match self.column_plan(index, body, accs) {
            Some(plan) => self.accumulate_columns(index, len, body, accs, &plan, |l| {
                l.sequential_loop(index, len, body, accs)
            }),
            None => self.sequential_loop(index, len, body, accs),
        }
    }

    /// The scalar `Sequential` loop: each partial in a variable.
    fn sequential_loop(
        &mut self,
        index: IrValue,
        len: Value,
        body: &[Stmt],
        accs: &[Accum],
    ) -> Result<()> {
        let neg_zero = self.b.ins().f32const(-0.0);
        let partials: Vec<_> = accs
            .iter()
            .map(|_| {
                let v = self.b.declare_var(F32);
                self.b.def_var(v, neg_zero);
                v
            })
            .collect();
        let zero = self.c32(0);
        self.counted_loop(zero, len, 1, |l, i| {
            l.set_value(index, i);
            l.scalar_block(body)?;
            for (acc, p) in accs.iter().zip(&partials) {
                let (a, b) = (l.val(acc.a)?, l.val(acc.b)?);
                l.fma_into(*p, a, b);
            }
            Ok(())
        })?;
        for (acc, p) in accs.iter().zip(&partials) {
            let total = self.b.use_var(*p);
            self.assign_var(acc.var, total)?;
        }
        Ok(())
    }

    /// `p = fma(a, b, p)` on the variable `p` (scalars or vectors alike).
    pub(super) fn fma_into(&mut self, p: Variable, a: Value, b: Value) {
        let old = self.b.use_var(p);
        let new = self.b.ins().fma(a, b, old);
        self.b.def_var(p, new);
    }

    /// A 16-aligned stack slot of `n_acc * ways` partials (accumulator `t`'s partial `j` at
    /// byte `4 * (t * ways + j)`), all set to `-0.0`; returns its address.
    fn partials_slot(&mut self, ways: u32, n_acc: usize, vector: bool) -> Value {
        let bytes = 4 * ways * n_acc as u32;
        let slot = self.b.create_sized_stack_slot(StackSlotData::new(
            StackSlotKind::ExplicitSlot,
            bytes,
            4,
        ));
        let addr = self.b.ins().stack_addr(I64, slot, 0);
        // `ways` is even, so the slot is a whole number of 8-byte (and, for the vector shape,
        // 16-byte) pieces.
        if vector {
            let neg_zero = self.b.ins().f32const(-0.0);
            let v = self.b.ins().splat(F32X4, neg_zero);
            for k in 0..bytes / 16 {
                self.b.ins().store(slot_mem(), v, addr, (16 * k) as i32);
            }
        } else {
            let v = self.c64(0x8000_0000_8000_0000);
            for k in 0..bytes / 8 {
                self.b.ins().store(slot_mem(), v, addr, (8 * k) as i32);
            }
        }
        addr
    }

    /// The two factors of `acc` as `f32x4` vectors of the vector iteration `local`.
    pub(super) fn factors(&mut self, local: &Body, acc: &Accum) -> Result<(Value, Value)> {
        let a = self.vval(local, acc.a)?;
        let a = self.as_vec(a, qforge_ir::ScalarType::F32);
        let b = self.vval(local, acc.b)?;
        let b = self.as_vec(b, qforge_ir::ScalarType::F32);
        Ok((a, b))
    }

    /// The vector loop over the groups of 4 elements from `start` (a multiple of 4) below
    /// `groups_end`, with the loads in `trusted` unchecked.
    fn group_loop(
        &mut self,
        lp: &Groups<'_>,
        start: Value,
        groups_end: Value,
        trusted: &HashSet<usize>,
    ) -> Result<()> {
        self.counted_loop(start, groups_end, LANES as u32, |l, i0| {
            l.accumulate_group(lp, i0, trusted)
        })
    }

    /// Elements `i0 .. i0 + 4` (`i0` a multiple of 4) in one vector iteration of the body,
    /// each accumulator updating the `f32x4` of partials `i0 % ways .. + 4`.
    fn accumulate_group(
        &mut self,
        lp: &Groups<'_>,
        i0: Value,
        trusted: &HashSet<usize>,
    ) -> Result<()> {
        let mut local = Body::at_index(lp.index, i0, trusted);
        for stmt in lp.body {
            self.vector_stmt(stmt, &mut local)?;
        }
        let entry = self.b.ins().band_imm_u(i0, (lp.ways - 1) as i64);
        let entry = self.b.ins().uextend(I64, entry);
        let bytes = self.b.ins().ishl_imm_u(entry, 2);
        let at = self.b.ins().iadd(lp.slot, bytes);
        for (t, acc) in lp.accs.iter().enumerate() {
            let (a, b) = self.factors(&local, acc)?;
            let offset = (4 * lp.ways as usize * t) as i32;
            let p = self.b.ins().load(F32X4, slot_mem(), at, offset);
            let p = self.b.ins().fma(a, b, p);
            self.b.ins().store(slot_mem(), p, at, offset);
        }
        Ok(())
    }

    /// The halving tree over the `ways` partials at byte `first` of the slot, one scalar
    /// `fadd` per step.
    fn tree_scalar(&mut self, slot: Value, first: i32, ways: u32) -> Value {
        let mut p: Vec<Value> = (0..ways as i32)
            .map(|j| self.b.ins().load(F32, slot_mem(), slot, first + 4 * j))
            .collect();
        let mut w = ways as usize;
        while w > 1 {
            w /= 2;
            for j in 0..w {
                p[j] = self.b.ins().fadd(p[j], p[j + w]);
            }
        }
        p[0]
    }

    /// The halving tree over the `ways` (a multiple of 4) partials at byte `first` of the
    /// slot: whole-vector adds while at least 4 partials remain, then the last two steps on
    /// the lanes of the remaining vector.
    fn tree_vector(&mut self, slot: Value, first: i32, ways: u32) -> Value {
        let mut v: Vec<Value> = (0..(ways / 4) as i32)
            .map(|q| self.b.ins().load(F32X4, slot_mem(), slot, first + 16 * q))
            .collect();
        let mut w = ways as usize;
        while w > 4 {
            w /= 2;
            for q in 0..w / 4 {
                v[q] = self.b.ins().fadd(v[q], v[q + w / 4]);
            }
        }
        let p: Vec<Value> = (0..LANES)
            .map(|l| self.b.ins().extractlane(v[0], l))
            .collect();
        let s0 = self.b.ins().fadd(p[0], p[2]);
        let s1 = self.b.ins().fadd(p[1], p[3]);
        self.b.ins().fadd(s0, s1)
    }
}
