//! Whether a matmul's accumulators compute one function of their outputs (`super`).

use std::collections::HashMap;

use qforge_ir::{Kernel, Op, Stmt, Value};

use super::launch::Outputs;
use super::statements::Statements;
use crate::error::Result;
use crate::mosaic::refuse;

/// Checks that every accumulator with outputs computes the same function of its own
/// `(m, n)` as accumulator 0 (its weight's loads are checked against its column by
/// `leaves::classify`). Returns, for each per-work-item value of accumulator 0, the
/// values standing in its place in each accumulator: `(accumulator, value)`.
pub(super) fn same_functions(
    k: &Kernel,
    f: &Statements<'_>,
    out: &Outputs,
) -> Result<HashMap<usize, Vec<(usize, Value)>>> {
    // Accumulators 1.. compute the same function of their own (m, n) as accumulator 0:
    // the same ops, and per-work-item values that are one function of (m, n) over all
    // accumulators' outputs (`pairs`: the value of each accumulator for each of 0's).
    let mut pairs: HashMap<usize, Vec<(usize, Value)>> = HashMap::new();
    for t in 0..f.accs.len() {
        if out.items[t].is_empty() {
            continue;
        }
        let mut same = Same {
            k,
            f,
            t,
            pairs: &mut pairs,
            memo: HashMap::new(),
        };
        if !same.accumulator() {
            return Err(refuse(
                k,
                &format!(
                    "a matmul whose accumulator {t} computes another function of its output \
                     than accumulator 0"
                ),
            ));
        }
    }
    Ok(pairs)
}

/// Compares accumulator `t`'s expressions with accumulator 0's op by op, recording which of
/// its per-work-item values stands where each of 0's does.
struct Same<'a, 'k> {
    k: &'k Kernel,
    f: &'a Statements<'k>,
    t: usize,
    pairs: &'a mut HashMap<usize, Vec<(usize, Value)>>,
    memo: HashMap<(usize, usize), bool>,
}

impl Same<'_, '_> {
    fn accumulator(&mut self) -> bool {
        let (_, x0, w0) = self.f.accs[0];
        let (_, xt, wt) = self.f.accs[self.t];
        let store = |body: &[Stmt]| {
            body.iter().find_map(|s| match s {
                Stmt::Store {
                    buf,
                    value,
                    rounding,
                    ..
                } => Some((*buf, *value, *rounding)),
                _ => None,
            })
        };
        let (Some((b0, s0, r0)), Some((bt, st, rt))) = (
            store(self.f.epilogues[0].1),
            store(self.f.epilogues[self.t].1),
        ) else {
            return false;
        };
        self.eq(x0, xt) && self.eq(w0, wt) && b0 == bt && r0 == rt && self.eq(s0, st)
    }

    fn eq(&mut self, a: Value, b: Value) -> bool {
        if let Some(&r) = self.memo.get(&(a.index(), b.index())) {
            return r;
        }
        let r = self.compare(a, b);
        self.memo.insert((a.index(), b.index()), r);
        r
    }

    fn compare(&mut self, a: Value, b: Value) -> bool {
        let (da, db) = (&self.k.values[a], &self.k.values[b]);
        if da.ty != db.ty {
            return false;
        }
        let top = |v: Value| self.f.top.contains(&v.index());
        if top(a) || top(b) {
            if top(a) && top(b) {
                self.pairs.entry(a.index()).or_default().push((self.t, b));
            }
            return top(a) && top(b);
        }
        let heads = match (&da.op, &db.op) {
            (Op::ReadVar(x), Op::ReadVar(y)) => {
                return x.index() == self.f.accs[0].0 && y.index() == self.f.accs[self.t].0;
            }
            (Op::Load { buf: x, .. }, Op::Load { buf: y, .. }) => x == y,
            (Op::Lookup { table: x, .. }, Op::Lookup { table: y, .. })
            | (Op::SearchSorted { table: x, .. }, Op::SearchSorted { table: y, .. }) => x == y,
            (Op::Unary(x, _), Op::Unary(y, _)) => x == y,
            (Op::Binary(x, ..), Op::Binary(y, ..)) => x == y,
            (Op::Cmp(x, ..), Op::Cmp(y, ..)) => x == y,
            (Op::Fma(..), Op::Fma(..)) | (Op::Select { .. }, Op::Select { .. }) => true,
            (
                Op::FloatToInt {
                    to: x, rounding: r, ..
                },
                Op::FloatToInt {
                    to: y, rounding: s, ..
                },
            ) => x == y && r == s,
            (Op::IntToFloat { rounding: r, .. }, Op::IntToFloat { rounding: s, .. }) => r == s,
            (Op::Bitcast { to: x, .. }, Op::Bitcast { to: y, .. }) => x == y,
            (Op::Const(x), Op::Const(y)) => x == y,
            (Op::Param(x), Op::Param(y)) => x == y,
            (Op::LoopIndex, Op::LoopIndex) => a == b,
            _ => false,
        };
        let (oa, ob) = (da.op.operands(), db.op.operands());
        heads && oa.len() == ob.len() && oa.iter().zip(&ob).all(|(&x, &y)| self.eq(x, y))
    }
}
