//! Vectorized `for` loops: a loop with step 1 whose body [`super::lanes::eligible`] accepts
//! (`let`s, stores and running reductions) runs its iterations in groups of `lanes`
//! (`lanes.rs`), then the remaining iterations as scalar code. A running maximum keeps one
//! value per lane, every lane starting from the variable's value before the loop, and the
//! lanes are combined in lane order with the scalar update after the groups (exact: see
//! `crate::running` and `cranelift/vector_running.rs`); a running `f32` sum adds each group's
//! lanes to the variable in lane order, as the scalar loop does; a running integer sum keeps one
//! wrapping partial sum per lane, from 0, added to the variable after the groups (wrapping
//! addition gives the same bits in any order).

use qforge_ir::{BinaryOp, CmpOp, ScalarType, Stmt, Value};

use super::emit::{internal, vec_of, Emitter};
use super::lanes::Carried;
use crate::error::Result;
use crate::running::Rule;

impl Emitter<'_> {
    /// `for index in start..end` (step 1) over a body that [`super::lanes::eligible`]
    /// accepted with stores: groups of `lanes` iterations in vectors (`lanes.rs`), then the
    /// remaining iterations as scalar code.
    pub(super) fn vector_for(
        &mut self,
        index: Value,
        start: &str,
        end: &str,
        lanes: u32,
        body: &[Stmt],
    ) -> Result<()> {
        let some = self.ins(format!("icmp ult i32 {start}, {end}"));
        let diff = self.ins(format!("sub i32 {end}, {start}"));
        let n = self.ins(format!("select i1 {some}, i32 {diff}, i32 0"));
        let whole = self.ins(format!("and i32 {n}, {}", !(lanes - 1) as i32));
        let vend = self.ins(format!("add i32 {start}, {whole}"));
        let reductions = crate::running::running_reductions(self.k, body)
            .ok_or_else(|| internal("vector loop with an assignment that is not a reduction"))?;
        let mut running = Vec::new();
        for red in reductions {
            let vt = vec_of(Carried::elem(red.rule), lanes);
            // Maxima: every lane starts from the variable's value before the loop; integer
            // sums from 0.
            let acc = match red.rule {
                Rule::Sum => None,
                Rule::MaxSkipNan | Rule::MaxPropagateNan => {
                    let acc = self.alloca(&vt);
                    let c = self.op(&qforge_ir::Op::ReadVar(red.var), ScalarType::F32)?;
                    let splat = self.splat(&c, "float", lanes);
                    self.line(format!("store {vt} {splat}, {vt}* {acc}"));
                    Some(acc)
                }
                Rule::IntSum => {
                    let acc = self.alloca(&vt);
                    self.line(format!("store {vt} zeroinitializer, {vt}* {acc}"));
                    Some(acc)
                }
            };
            running.push(Carried { red, lanes: acc });
        }
        let no_tail = &mut |_: &mut Self, _| Ok(());
        self.group_loop(index, start, &vend, (lanes, lanes), body, &running, no_tail)?;
        // A loop widened past the options' lanes (`for_lanes`) runs what is left in groups of
        // those lanes (e.g. a 4-bit block's 32 bytes under a 64-lane rule ran all scalar: 12x
        // slower). Per-lane running values (maxima, integer sums) are kept at one width, so a
        // loop with them goes straight to the scalar tail.
        let base = self.opts.lanes;
        let vend = if lanes > base && base >= 4 && running.iter().all(|c| c.lanes.is_none()) {
            let rest = self.ins(format!("sub i32 {end}, {vend}"));
            let more = self.ins(format!("icmp ult i32 {vend}, {end}"));
            let rest = self.ins(format!("select i1 {more}, i32 {rest}, i32 0"));
            let whole = self.ins(format!("and i32 {rest}, {}", !(base - 1) as i32));
            let vend2 = self.ins(format!("add i32 {vend}, {whole}"));
            self.group_loop(index, &vend, &vend2, (base, base), body, &running, no_tail)?;
            vend2
        } else {
            vend
        };
        // The lanes of each maximum combined in lane order with the scalar update; an integer
        // sum's lanes added to the variable.
        for c in &running {
            let Some(acc) = &c.lanes else { continue };
            let vt = vec_of(Carried::elem(c.red.rule), lanes);
            let v = self.ins(format!("load {vt}, {vt}* {acc}"));
            let mut total = match c.red.rule {
                Rule::IntSum => {
                    let ty = self.k.vars.try_get(c.red.var).map(|d| d.ty);
                    self.op(
                        &qforge_ir::Op::ReadVar(c.red.var),
                        ty.ok_or_else(|| internal("missing variable"))?,
                    )?
                }
                _ => self.ins(format!("extractelement {vt} {v}, i32 0")),
            };
            let first = u32::from(!matches!(c.red.rule, Rule::IntSum));
            for l in first..lanes {
                let x = self.ins(format!("extractelement {vt} {v}, i32 {l}"));
                total = match c.red.rule {
                    Rule::MaxPropagateNan => {
                        let gt = self.compare(CmpOp::Gt, ScalarType::F32, 1, &x, &total);
                        let nan = self.compare(CmpOp::Ne, ScalarType::F32, 1, &x, &x);
                        let take = self.ins(format!("or i1 {gt}, {nan}"));
                        self.select(&take, ScalarType::F32, 1, &x, &total)
                    }
                    Rule::MaxSkipNan | Rule::Sum => {
                        self.binary(BinaryOp::Max, ScalarType::F32, 1, &total, &x)?
                    }
                    Rule::IntSum => self.ins(format!("add i32 {total}, {x}")),
                };
            }
            self.assign_var(c.red.var, &total)?;
        }
        self.counted_loop("i32", &vend, end, 1, |e, i| {
            e.set(index, i.to_string(), 1);
            e.block(body)
        })
    }
}
