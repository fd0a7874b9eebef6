//! The stores of an outer-plan accumulate's sums as vectors: a tile's epilogue (the kernels'
//! `store_sums`) stores each accumulator `j` of a group by a statement pair `let c_j; if c_j {
//! .. read acc_j .. store buf[.. col_j ..] = .. }`, and when the pairs of a group are the first
//! pair with `acc_0`, `col_0` replaced by `acc_j`, `col_j` (as `outer.rs` matched the
//! accumulators' factors), lane `j` of one vector evaluation of the first pair's body, with
//! `col_0 + lane` in place of `col_0` and the group's sums vector in place of `acc_0`, is pair
//! `j`'s body whenever every `c_j` holds and the columns are consecutive (the plan's run-time
//! condition). Then the group's stores are one vector evaluation (`lanes.rs`: a store at
//! `first + lane` is one vector store when the run lies in the buffer, else lane by lane with
//! the scalar checks, in lane order); otherwise the pairs run as written. Either way each
//! element gets the scalar code's bits: the run changes only how many instructions store them.
//!
//! The sums reach the vector through a `<lanes x float>` slot per group, which both paths of
//! the accumulate fill (`accumulate.rs`); LLVM keeps it in registers. The accumulators'
//! variables are set from the slots here, on the scalar path and after the stores, not at the
//! end of the accumulate, where LLVM extracted every lane for them on the vector path too.
//!
//! On the adapter's `y = a @ U.T` (`M = 512`, `L = 64`, `N = 4096`, 4 x 32 tiles) the
//! scalar epilogue was about as long as the products: each of a work item's 128 sums had its
//! own condition, index and bounds check.

use std::collections::{HashMap, HashSet};

use qforge_ir::{Op, Stmt, Value, VarId};

use super::emit::{internal, Emitter};
use super::outer::with_operands;
use crate::error::Result;

/// The sums of an accumulate that ran in the outer plan, for the statements after it.
pub(super) struct OuterSums {
    /// `i1`: whether every group's columns are consecutive (`Emitter::outer_condition`).
    pub(super) consecutive: String,
    /// The accumulator groups, in accumulator order.
    pub(super) groups: Vec<SumGroup>,
}

/// One group of an [`OuterSums`]: accumulator `j` is lane `j`.
pub(super) struct SumGroup {
    /// The accumulators' variables.
    pub(super) vars: Vec<VarId>,
    /// Their columns `col_j`.
    pub(super) cols: Vec<Value>,
    /// The `<lanes x float>*` slot holding the sums.
    pub(super) sums: String,
}

/// Pair `j` of a run: `let c; if c { body }` with no `else`, as `(c, body)`.
fn pair(stmts: &[Stmt], j: usize) -> Option<(Value, &[Stmt])> {
    match (stmts.get(2 * j)?, stmts.get(2 * j + 1)?) {
        (
            Stmt::Let(c),
            Stmt::If {
                cond,
                then_body,
                else_body,
            },
        ) if c == cond && else_body.is_empty() => Some((*c, then_body.as_slice())),
        _ => None,
    }
}

/// Matches pair `j`'s body against pair 0's, statement by statement (see the module docs).
struct BodyMatch<'k> {
    k: &'k qforge_ir::Kernel,
    /// `(col_0, col_j)`.
    cols: (Value, Value),
    /// `(acc_0, acc_j)`.
    vars: (VarId, VarId),
    /// Each value of pair `j`'s body with its counterpart in pair 0's.
    map: HashMap<usize, Value>,
}

impl BodyMatch<'_> {
    /// Whether operand `uj` of pair `j` stands where `u0` stands in pair 0.
    fn operand(&self, u0: Value, uj: Value) -> bool {
        if let Some(m) = self.map.get(&uj.index()) {
            return *m == u0;
        }
        if uj == self.cols.1 {
            return u0 == self.cols.0;
        }
        if u0 == self.cols.0 {
            return false;
        }
        let op = |v: Value| self.k.values.try_get(v).map(|d| &d.op);
        u0 == uj || matches!((op(u0), op(uj)), (Some(Op::Const(a)), Some(Op::Const(b))) if a == b)
    }

    fn stmt(&mut self, s0: &Stmt, sj: &Stmt) -> bool {
        match (s0, sj) {
            (Stmt::Let(x0), Stmt::Let(xj)) => {
                let (Some(d0), Some(dj)) = (self.k.values.try_get(*x0), self.k.values.try_get(*xj))
                else {
                    return false;
                };
                let same = match (&d0.op, &dj.op) {
                    (Op::ReadVar(v0), Op::ReadVar(vj)) => (*v0, *vj) == self.vars,
                    (Op::ReadVar(_), _) | (_, Op::ReadVar(_)) => false,
                    (o0, oj) => {
                        let (a0, aj) = (o0.operands(), oj.operands());
                        with_operands(oj, &a0).as_ref() == Some(o0)
                            && a0.iter().zip(&aj).all(|(u0, uj)| self.operand(*u0, *uj))
                    }
                };
                if same && d0.ty == dj.ty {
                    self.map.insert(xj.index(), *x0);
                }
                same && d0.ty == dj.ty
            }
            (
                Stmt::Store {
                    buf: b0,
                    index: i0,
                    value: v0,
                    rounding: r0,
                },
                Stmt::Store {
                    buf: bj,
                    index: ij,
                    value: vj,
                    rounding: rj,
                },
            ) => b0 == bj && r0 == rj && self.operand(*i0, *ij) && self.operand(*v0, *vj),
            _ => false,
        }
    }
}

impl Emitter<'_> {
    /// Whether `stmts` start with the pairs of `group` (see the module docs), pair 0's body
    /// reading no variable but `acc_0` and able to run in lanes of `col_0`.
    fn store_run(&self, stmts: &[Stmt], group: &SumGroup) -> bool {
        let Some((_, body0)) = pair(stmts, 0) else {
            return false;
        };
        let reads_only_acc0 = body0.iter().all(|s| match s {
            Stmt::Let(v) => match self.k.values.try_get(*v).map(|d| &d.op) {
                Some(Op::ReadVar(var)) => *var == group.vars[0],
                Some(Op::Reduce { .. } | Op::LoopIndex | Op::WorkItem) | None => false,
                Some(_) => true,
            },
            Stmt::Store { .. } => true,
            _ => false,
        });
        if !reads_only_acc0 || !super::lanes::eligible(self.k, group.cols[0], body0, true) {
            return false;
        }
        (1..group.vars.len()).all(|j| {
            let Some((_, body)) = pair(stmts, j) else {
                return false;
            };
            let mut m = BodyMatch {
                k: self.k,
                cols: (group.cols[0], group.cols[j]),
                vars: (group.vars[0], group.vars[j]),
                map: HashMap::new(),
            };
            body.len() == body0.len() && body0.iter().zip(body).all(|(s0, sj)| m.stmt(s0, sj))
        })
    }

    /// Lowers the store pairs of `sums`' groups that start `stmts` after `let`s of pure values
    /// (lowered first, as `block` would; see the module docs), sets every accumulator's
    /// variable to its sum, and returns how many statements that was. Must follow the
    /// accumulate that returned `sums`, which leaves the variables unset.
    pub(super) fn outer_stores(&mut self, stmts: &[Stmt], sums: &OuterSums) -> Result<usize> {
        // Accumulators may share a variable (the last one's sum is its value): then a pair's
        // `read acc_j` is not lane `j`, and the stores run as written.
        let mut seen = HashSet::new();
        let distinct = sums
            .groups
            .iter()
            .flat_map(|g| &g.vars)
            .all(|v| seen.insert(v.index()));
        let at = if distinct {
            self.store_runs(stmts, sums)?
        } else {
            0
        };
        for group in &sums.groups {
            self.assign_sums(group)?;
        }
        Ok(at)
    }

    /// Each accumulator variable of `group` set to its lane of the group's slot.
    fn assign_sums(&mut self, group: &SumGroup) -> Result<()> {
        let vt = format!("<{} x float>", group.vars.len());
        for (j, var) in group.vars.iter().enumerate() {
            let p = self.ins(format!(
                "getelementptr {vt}, {vt}* {}, i32 0, i32 {j}",
                group.sums
            ));
            let x = self.ins(format!("load float, float* {p}"));
            self.assign_var(*var, &x)?;
        }
        Ok(())
    }

    /// The part of [`Emitter::outer_stores`] before the variables are set.
    fn store_runs(&mut self, stmts: &[Stmt], sums: &OuterSums) -> Result<usize> {
        let mut at = 0;
        while pair(&stmts[at..], 0).is_none() {
            let Some(Stmt::Let(v)) = stmts.get(at) else {
                return Ok(at);
            };
            let pure = self.k.values.try_get(*v).is_some_and(|d| {
                !matches!(
                    d.op,
                    Op::Load { .. } | Op::Reduce { .. } | Op::ReadVar(_) | Op::LoopIndex
                )
            });
            if !pure {
                return Ok(at);
            }
            self.let_scalar(*v)?;
            at += 1;
        }
        for group in &sums.groups {
            let n = group.vars.len();
            if !self.store_run(&stmts[at..], group) {
                break;
            }
            self.store_group(&stmts[at..at + 2 * n], group, &sums.consecutive)?;
            at += 2 * n;
        }
        Ok(at)
    }

    /// One group's pairs: one vector evaluation of pair 0's body when every condition holds and
    /// the columns are consecutive, else the pairs as written.
    fn store_group(&mut self, stmts: &[Stmt], group: &SumGroup, consecutive: &str) -> Result<()> {
        let n = group.vars.len();
        let mut all = consecutive.to_string();
        for j in 0..n {
            let (c, _) = pair(stmts, j).ok_or_else(|| internal("store run without its pair"))?;
            self.let_scalar(c)?;
            let c = self.val(c)?;
            all = self.ins(format!("and i1 {all}, {c}"));
        }
        let (whole, each, join) = (
            self.label("sums_vector"),
            self.label("sums_each"),
            self.label("sums_stored"),
        );
        self.cond_br(&all, &whole, &each);
        self.start(&whole);
        let (_, body0) = pair(stmts, 0).ok_or_else(|| internal("store run without its pair"))?;
        let col0 = group.cols[0];
        let saved = self.vals[col0.index()].clone();
        let first = self.val(col0)?;
        self.lane_vars
            .insert(group.vars[0].index(), group.sums.clone());
        let lowered = self.lanes_group(col0, &first, n as u32, body0, &[], &mut |_| Ok(()));
        self.lane_vars.clear();
        self.vals[col0.index()] = saved;
        lowered?;
        self.br(&join);
        self.start(&each);
        self.assign_sums(group)?;
        for s in stmts.iter().skip(1).step_by(2) {
            self.stmt(s)?;
        }
        self.br(&join);
        self.start(&join);
        Ok(())
    }
}
