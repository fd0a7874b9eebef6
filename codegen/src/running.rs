//! Running reductions in a loop body: the analysis both CPU backends vectorize from (the
//! lowering, and why it is exact, are in `cranelift/vector_running.rs` and `llvm/lanes.rs`).
//! A variable `acc` updated once per iteration, the loop reading `acc` only in that update and
//! using the update's intermediate values nowhere else, as
//! * `acc = max(acc, a)` (NaN skipped) or `acc = select(a > acc || a != a, a, acc)` (NaN
//!   propagated), with `a = abs(x)` (`f32`);
//! * `acc = acc + x` (`f32`: a sum in iteration order);
//! * `acc = acc + x` (`u32`/`i32`: a wrapping sum, the same bits in any order, since wrapping
//!   addition is associative and commutative).

use std::collections::HashMap;

use qforge_ir::{BinaryOp, CmpOp, Kernel, Op, ScalarType, Stmt, UnaryOp, Value as IrValue, VarId};

/// The update of a running reduction.
#[derive(Clone, Copy)]
pub(crate) enum Rule {
    /// `max(acc, a)`: a NaN `a` is skipped.
    MaxSkipNan,
    /// `select(a > acc || a != a, a, acc)`: a NaN `a` wins.
    MaxPropagateNan,
    /// `acc + x` (`f32`): a sum in iteration order.
    Sum,
    /// `acc + x` (`u32`/`i32`): a wrapping sum, whose bits do not depend on the order.
    IntSum,
}

/// One running reduction of a loop body.
#[derive(Clone, Copy)]
pub(crate) struct Running {
    /// The variable.
    pub(crate) var: VarId,
    /// The body's one `read_var(acc)`.
    pub(crate) read: IrValue,
    /// The assigned value.
    pub(crate) update: IrValue,
    /// The value added (a sum) or compared (a maximum) each iteration.
    pub(crate) addend: IrValue,
    /// Its update.
    pub(crate) rule: Rule,
}

/// The op of body value `v`.
fn op_of(kernel: &Kernel, v: IrValue) -> Option<&Op> {
    kernel.values.try_get(v).map(|d| &d.op)
}

/// Whether `a` is `abs(_)`.
fn is_abs(kernel: &Kernel, a: IrValue) -> bool {
    matches!(op_of(kernel, a), Some(Op::Unary(UnaryOp::Abs, _)))
}

/// The reduction assigning `value` to a variable: the variable's loop read `cur`, the rule,
/// the added (or compared) value, and the intermediate values that must have no other use.
fn pattern(kernel: &Kernel, value: IrValue) -> Option<(IrValue, Rule, IrValue, Vec<IrValue>)> {
    match *op_of(kernel, value)? {
        // Addition commutes exactly (floats too, NaN payloads aside): the variable's read may
        // be either operand.
        Op::Binary(BinaryOp::Add, a, b) => {
            let (cur, x) = match op_of(kernel, a) {
                Some(Op::ReadVar(_)) => (a, b),
                _ => (b, a),
            };
            match kernel.values.try_get(value)?.ty {
                ScalarType::F32 => Some((cur, Rule::Sum, x, vec![])),
                ScalarType::U32 | ScalarType::I32 => Some((cur, Rule::IntSum, x, vec![])),
                ScalarType::Bool => None,
            }
        }
        Op::Binary(BinaryOp::Max, cur, a) if is_abs(kernel, a) => {
            Some((cur, Rule::MaxSkipNan, a, vec![]))
        }
        Op::Select {
            cond,
            if_true: a,
            if_false: cur,
        } if is_abs(kernel, a) => {
            let Op::Binary(BinaryOp::Or, gt, nan) = *op_of(kernel, cond)? else {
                return None;
            };
            let gt_ok =
                matches!(op_of(kernel, gt), Some(&Op::Cmp(CmpOp::Gt, x, y)) if x == a && y == cur);
            let nan_ok =
                matches!(op_of(kernel, nan), Some(&Op::Cmp(CmpOp::Ne, x, y)) if x == a && y == a);
            (gt_ok && nan_ok).then(|| (cur, Rule::MaxPropagateNan, a, vec![cond, gt, nan]))
        }
        _ => None,
    }
}

/// The running reductions of a straight-line loop body, or `None` when an assignment in it
/// is anything else (the loop then is not vectorized). An empty list when it assigns nothing.
pub(crate) fn running_reductions(kernel: &Kernel, body: &[Stmt]) -> Option<Vec<Running>> {
    // Number of uses of each body value as an operand, a store index or value, or an assigned
    // value.
    let mut uses: HashMap<usize, usize> = HashMap::new();
    let mut reads: HashMap<usize, Vec<IrValue>> = HashMap::new();
    let mut assigned = Vec::new();
    for stmt in body {
        match stmt {
            Stmt::Let(v) => {
                let op = op_of(kernel, *v)?;
                for o in op.operands() {
                    *uses.entry(o.index()).or_default() += 1;
                }
                if let Op::ReadVar(var) = op {
                    reads.entry(var.index()).or_default().push(*v);
                }
            }
            Stmt::Store { index, value, .. } => {
                for o in [index, value] {
                    *uses.entry(o.index()).or_default() += 1;
                }
            }
            Stmt::Assign { var, value } => {
                *uses.entry(value.index()).or_default() += 1;
                assigned.push((*var, *value));
            }
            Stmt::If { .. } | Stmt::For { .. } | Stmt::Accumulate { .. } => return None,
        }
    }
    let used = |v: IrValue| uses.get(&v.index()).copied().unwrap_or(0);
    let mut found: Vec<Running> = Vec::new();
    for (var, value) in assigned {
        let (cur, rule, addend, inner) = pattern(kernel, value)?;
        let int_var = matches!(
            kernel.vars.try_get(var)?.ty,
            ScalarType::U32 | ScalarType::I32
        );
        if int_var != matches!(rule, Rule::IntSum) {
            return None;
        }
        // `cur` must be the loop's only read of `var`, used only by the update (once by `max`,
        // twice by the NaN-propagating select and compare), and the update's values used only
        // inside it.
        let cur_uses = match rule {
            Rule::MaxSkipNan | Rule::Sum | Rule::IntSum => 1,
            Rule::MaxPropagateNan => 2,
        };
        let only_read = reads.get(&var.index()).is_some_and(|r| r == &[cur]);
        if !only_read
            || used(cur) != cur_uses
            || used(value) != 1
            || inner.iter().any(|&v| used(v) != 1)
            || found.iter().any(|r| r.var == var)
        {
            return None;
        }
        found.push(Running {
            var,
            read: cur,
            update: value,
            addend,
            rule,
        });
    }
    Some(found)
}
