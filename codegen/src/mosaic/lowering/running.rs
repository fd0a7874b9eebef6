//! A variable assigned in the chunk loop: a running maximum, lowered as its closed form.

use qforge_ir::{BinaryOp, CmpOp, Op, Scalar, ScalarType, Stmt, UnaryOp, Value};

use super::super::tile::{Bin, Elt, Pred, Shape, VOp, MAX_LANES};
use super::{refuse, uses, var_reads, Lowering};
use crate::error::Result;

impl Lowering<'_> {
    /// `assign var = max(read_var var, m)` in the loop body `body`, the running maximum of a
    /// chunk value `m` that is never negative (an `abs`, or a select of such values and
    /// non-negative constants: the 8-bit optimizers' new absmax), as its closed form: the IR's
    /// `max(a, b) = select(b > a, b, a)` folded over the chunk in order takes the largest `M`
    /// of the elements that are not NaN (NaN is never greater, and every zero is `+0`) where
    /// there is one and `M > v` (so a NaN `v` stays), and keeps `v` otherwise. `M` is an
    /// integer max of the values' bits (their order as floats), each plus one, over the lanes
    /// inside the chunk that are not NaN (`0` for the others), less one: with no element it is
    /// all ones, a NaN, never greater than `v`.
    ///
    /// The NaN-keeping form `select(m > v || m != m, m, v)` (LLM.int8's row absmax, the 4-bit
    /// optimizers') is the same where no element is NaN; otherwise its value is the last NaN
    /// element (each later NaN replaces the one before, and nothing replaces a NaN): the bits
    /// at the greatest lane holding a NaN, found by an integer max of `lane + 1` over them.
    ///
    /// The read of `var` and the running value may have no other use in the loop; the chunk
    /// must be one step's lanes.
    pub(super) fn running_max(
        &mut self,
        var: qforge_ir::VarId,
        value: Value,
        body: &[Stmt],
    ) -> Result<()> {
        let Some((x, nan_last)) = self.running_form(var, value, body) else {
            return Err(refuse(
                self.k,
                "a variable assigned in the loop other than a running `max(v, m)` of a chunk \
                 value `m` that is never negative",
            ));
        };
        if self.program.lanes() < self.program.width {
            return Err(refuse(
                self.k,
                &format!(
                    "a running maximum over a chunk of {} elements, wider than one step's {}",
                    self.program.width, MAX_LANES
                ),
            ));
        }
        let magnitude = self.get(x, Shape::Chunk)?;
        let bits = self.push(VOp::Bitcast(magnitude, Elt::I32), Shape::Chunk, Elt::I32);
        let len = self.chunk_len()?;
        let lane = self.push(VOp::Lane, Shape::Chunk, Elt::I32);
        let inside = self.push(VOp::Cmp(Pred::Ult, lane, len), Shape::Chunk, Elt::I1);
        let number = self.cmp_c(Pred::Ule, bits, 0x7f80_0000);
        let counted = self.push(VOp::Bin(Bin::AndI, inside, number), Shape::Chunk, Elt::I1);
        let keyed = self.int_c(Bin::AddI, bits, 1);
        let zero = self.konst(0, Elt::I32, Shape::Chunk);
        let keyed = self.select_i(counted, keyed, zero);
        let top = self.push(VOp::MaxLanes(keyed), Shape::Row, Elt::I32);
        let top = self.int_c(Bin::SubI, top, 1);
        let top = self.push(VOp::Bitcast(top, Elt::F32), Shape::Row, Elt::F32);
        let old = self.var_value(var);
        let above = self.push(VOp::Cmp(Pred::Ogt, top, old), Shape::Row, Elt::I1);
        let mut new = self.push(VOp::Select(above, top, old), Shape::Row, Elt::F32);
        if nan_last {
            let nan = self.cmp_c(Pred::Ugt, bits, 0x7f80_0000);
            let nan = self.push(VOp::Bin(Bin::AndI, inside, nan), Shape::Chunk, Elt::I1);
            let after = self.int_c(Bin::AddI, lane, 1);
            let keyed = self.select_i(nan, after, zero);
            let last = self.push(VOp::MaxLanes(keyed), Shape::Row, Elt::I32);
            let last_wide = self.widen(last, Shape::Chunk);
            let at = self.push(VOp::Cmp(Pred::Eq, after, last_wide), Shape::Chunk, Elt::I1);
            let at = self.push(VOp::Bin(Bin::AndI, at, nan), Shape::Chunk, Elt::I1);
            let picked = self.select_i(at, bits, zero);
            let picked = self.push(VOp::MaxLanes(picked), Shape::Row, Elt::I32);
            let picked = self.push(VOp::Bitcast(picked, Elt::F32), Shape::Row, Elt::F32);
            let any = self.cmp_c(Pred::Ne, last, 0);
            new = self.push(VOp::Select(any, picked, new), Shape::Row, Elt::F32);
        }
        self.vars.insert(var.index(), new);
        Ok(())
    }

    /// The running value `m` of [`Self::running_max`] and whether the form keeps NaN, when
    /// `value` is `max(read_var var, m)` or `select(m > r || m != m, m, r)` with `r = read_var
    /// var`, `m` never negative, and neither the read nor `value` used elsewhere in `body`.
    fn running_form(
        &self,
        var: qforge_ir::VarId,
        value: Value,
        body: &[Stmt],
    ) -> Option<(Value, bool)> {
        let reads = |v: Value| matches!(self.def(v), Ok(Op::ReadVar(r)) if *r == var);
        let (read, m, nan_last, read_uses) = match self.def(value).ok()? {
            Op::Binary(BinaryOp::Max, acc, x) => (*acc, *x, false, 1),
            Op::Select {
                cond,
                if_true,
                if_false,
            } => {
                let (m, r) = (*if_true, *if_false);
                let Op::Binary(BinaryOp::Or, a, b) = self.def(*cond).ok()? else {
                    return None;
                };
                let greater = |c: Value| matches!(self.def(c), Ok(Op::Cmp(CmpOp::Gt, x, y)) if *x == m && *y == r);
                let nan = |c: Value| matches!(self.def(c), Ok(Op::Cmp(CmpOp::Ne, x, y)) if *x == m && *y == m);
                let shaped = (greater(*a) && nan(*b)) || (nan(*a) && greater(*b));
                if !shaped
                    || uses(self.k, body, *cond) != 1
                    || uses(self.k, body, *a) != 1
                    || uses(self.k, body, *b) != 1
                {
                    return None;
                }
                (r, m, true, 2)
            }
            _ => return None,
        };
        (reads(read)
            && self.ty(m) == ScalarType::F32
            && self.never_negative(m)
            && var_reads(self.k, body, var) == 1
            && uses(self.k, body, read) == read_uses
            && uses(self.k, body, value) == 1)
            .then_some((m, nan_last))
    }

    /// Whether `v`'s sign bit is always clear: an `abs`, a constant, or a select of such.
    fn never_negative(&self, v: Value) -> bool {
        match self.def(v) {
            Ok(Op::Unary(UnaryOp::Abs, _)) => true,
            Ok(Op::Const(Scalar::F32(bits))) => bits >> 31 == 0,
            Ok(Op::Select {
                if_true, if_false, ..
            }) => self.never_negative(*if_true) && self.never_negative(*if_false),
            _ => false,
        }
    }
}
