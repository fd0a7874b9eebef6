//! Running reductions in a vectorized loop: an `f32` variable `acc` updated once per iteration,
//! the loop reading `acc` only in that update and using the update's intermediate values nowhere
//! else, as
//! * `acc = max(acc, a)` (NaN skipped: the absmax of the 8-bit optimizers and blockwise
//!   quantizers) or `acc = select(a > acc || a != a, a, acc)` (NaN propagated: torch's `max`,
//!   the absmax of the 4-bit optimizers), with `a = abs(x)`: the vector loop keeps one running
//!   value per lane in an `f32x4` variable, each lane starting from the value `c` the variable
//!   has before the loop; after the vector loop the lanes are combined in lane order with the
//!   same scalar update, and the scalar remainder loop continues from the result;
//! * `acc = acc + x` (a sum in iteration order, as the EDEN sums of the 4-bit optimizers): each
//!   vector iteration adds its 4 lanes to the scalar `acc` in lane order, which is the order of
//!   the scalar loop, so this one is exact by construction. A `u32`/`i32` sum (the int8 dot
//!   products) is lowered the same way with integer adds.
//!
//! Exactness of the maxima: every `a` has its sign bit clear, and two floats that compare equal differ in bits
//! only as `+0` / `-0`, so all the `a` equal to the largest non-NaN one have the same bits.
//! * NaN skipped: the scalar fold gives `c` when `c` is NaN or no `a` exceeds `c`, otherwise the
//!   largest non-NaN `a`. Each lane gives the same over its own elements, and so does the
//!   combination of the lanes: the split cannot matter.
//! * NaN propagated: without a NaN `a` the fold is the one above. With one, the scalar result
//!   is the last NaN `a` (each NaN replaces the running value, and only a NaN replaces a NaN);
//!   some lane then holds a NaN and the combination is a NaN too, possibly another one: the
//!   numeric contract (DESIGN.md, rule 1) leaves NaN payloads free, and the checker compares
//!   NaNs as equal.

use cranelift_codegen::ir::types::F32X4;
use cranelift_codegen::ir::{InstBuilder, Value};
use cranelift_frontend::Variable;
use qforge_ir::{BinaryOp, CmpOp, ScalarType, Value as IrValue, VarId};

pub(super) use crate::running::running_reductions;
use crate::running::{Rule, Running};

use super::lower::{internal, Lowerer};
use super::vectorize::{Body, VVal, LANES};
use crate::error::Result;

/// A reduction during lowering, with its `f32x4` lane variable (the scalar variable itself for
/// a sum).
#[derive(Clone, Copy)]
pub(super) struct Carried {
    red: Running,
    lanes: Variable,
}

impl Lowerer<'_> {
    /// Before the vector loop: the lane variables, every lane set to the variable's current
    /// value.
    pub(super) fn start_running(&mut self, reductions: &[Running]) -> Result<Vec<Carried>> {
        let mut out = Vec::with_capacity(reductions.len());
        for red in reductions {
            let scalar = self.var_of(red.var)?;
            let lanes = if matches!(red.rule, Rule::Sum | Rule::IntSum) {
                scalar
            } else {
                let c = self.b.use_var(scalar);
                let lanes = self.b.declare_var(F32X4);
                let splat = self.b.ins().splat(F32X4, c);
                self.b.def_var(lanes, splat);
                lanes
            };
            out.push(Carried { red: *red, lanes });
        }
        Ok(out)
    }

    /// In one vector iteration: the reads of the reduced variables are their lane vectors (a
    /// sum's read and update are not lowered as values: the assignment does the adds).
    pub(super) fn read_running(&mut self, carried: &[Carried], local: &mut Body) {
        for c in carried {
            let v = self.b.use_var(c.lanes);
            if matches!(c.red.rule, Rule::Sum | Rule::IntSum) {
                local.insert(c.red.read, VVal::Uniform(v));
                local.insert(c.red.update, VVal::Uniform(v));
                local
                    .sums
                    .insert(c.red.var.index(), (c.lanes, c.red.addend));
            } else {
                local.insert(c.red.read, VVal::Vector(v));
                local.carried.insert(c.red.var.index(), c.lanes);
            }
        }
    }

    /// `Stmt::Assign` in a vector iteration: only a reduction's update (see
    /// [`running_reductions`]), which sets its lane vector.
    pub(super) fn assign_running(
        &mut self,
        var: VarId,
        value: IrValue,
        local: &Body,
    ) -> Result<()> {
        if let Some(&(scalar, addend)) = local.sums.get(&var.index()) {
            let x = self.vval(local, addend)?;
            let ty = self
                .k
                .values
                .try_get(addend)
                .ok_or_else(|| internal("missing addend"))?
                .ty;
            let mut acc = self.b.use_var(scalar);
            for j in 0..LANES {
                let xj = self.lane(x, ty, j);
                acc = match ty {
                    ScalarType::F32 => self.b.ins().fadd(acc, xj),
                    _ => self.b.ins().iadd(acc, xj),
                };
            }
            self.b.def_var(scalar, acc);
            return Ok(());
        }
        let lanes = *local
            .carried
            .get(&var.index())
            .ok_or_else(|| internal("assignment in a vectorized loop"))?;
        let Some(VVal::Vector(v)) = local.get(value) else {
            return Err(internal("reduction update is not a vector"));
        };
        self.b.def_var(lanes, v);
        Ok(())
    }

    /// After the vector loop: the lanes combined in lane order with the scalar update, assigned
    /// to the variable.
    pub(super) fn finish_running(&mut self, carried: &[Carried]) -> Result<()> {
        for c in carried {
            if matches!(c.red.rule, Rule::Sum | Rule::IntSum) {
                continue;
            }
            let v = self.b.use_var(c.lanes);
            let lanes: Vec<Value> = (0..LANES).map(|j| self.b.ins().extractlane(v, j)).collect();
            let mut acc = lanes[0];
            for &x in &lanes[1..] {
                acc = self.max_update(c.red.rule, acc, x)?;
            }
            let scalar = self.var_of(c.red.var)?;
            self.b.def_var(scalar, acc);
        }
        Ok(())
    }

    /// The scalar update of a reduction's rule: the next running value after `acc` and `x`.
    fn max_update(&mut self, rule: Rule, acc: Value, x: Value) -> Result<Value> {
        match rule {
            Rule::MaxSkipNan => self.binary(BinaryOp::Max, ScalarType::F32, acc, x),
            Rule::Sum | Rule::IntSum => Err(internal("a sum has no lanes to combine")),
            Rule::MaxPropagateNan => {
                let gt = self.compare(CmpOp::Gt, ScalarType::F32, x, acc)?;
                let nan = self.compare(CmpOp::Ne, ScalarType::F32, x, x)?;
                let take = self.b.ins().bor(gt, nan);
                Ok(self.b.ins().select(take, x, acc))
            }
        }
    }
}
