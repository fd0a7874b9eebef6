//! The matmul class's statements (`super`): the kernel's top level as `let`s, one
//! `accumulate` and an `if` per accumulator; and the shapes of its indices.

use std::collections::HashSet;
use std::rc::Rc;

use qforge_ir::{BinaryOp, Kernel, Op, ReduceOrder, Scalar, Stmt, Value};

use crate::error::Result;
use crate::mosaic::refuse;

/// The kernel's statements: the `accumulate` and each accumulator's epilogue.
pub(super) struct Statements<'k> {
    /// The reduction's index.
    pub(super) k_index: Value,
    /// Its length `K`.
    pub(super) len: Value,
    /// Its order.
    pub(super) order: ReduceOrder,
    /// `(variable, activation factor, weight factor)` per accumulator.
    pub(super) accs: Vec<(usize, Value, Value)>,
    /// Per accumulator: its `if`'s condition and body (which stores its output).
    pub(super) epilogues: Vec<(Value, &'k [Stmt])>,
    /// The values defined outside the `accumulate` (per work item).
    pub(super) top: HashSet<usize>,
    /// The values that depend on the reduction's index (through their operands), it included.
    pub(super) on_k: Rc<HashSet<usize>>,
}

impl Statements<'_> {
    /// Whether `v` is free of the reduction's index.
    pub(super) fn k_free(&self, v: Value) -> bool {
        !self.on_k.contains(&v.index())
    }
}

/// The kernel's statements in the class's form: `let`s, one `accumulate`, then `let`s and one
/// `if` per accumulator whose body reads it and stores once.
pub(super) fn statements(k: &Kernel) -> Result<Statements<'_>> {
    let mut top = HashSet::new();
    let mut acc = None;
    let mut ifs = Vec::new();
    for s in &k.body {
        match s {
            Stmt::Let(v) => {
                top.insert(v.index());
            }
            Stmt::Accumulate {
                index,
                len,
                order,
                accs,
                body,
            } if acc.is_none() => {
                acc = Some((*index, *len, *order, accs, body));
            }
            Stmt::If {
                cond,
                then_body,
                else_body,
            } if acc.is_some() && else_body.is_empty() => ifs.push((*cond, then_body.as_slice())),
            _ => {
                return Err(refuse(
                    k,
                    "a matmul's statement other than a `let`, its `accumulate` and an `if` per \
                     accumulator",
                ))
            }
        }
    }
    let (k_index, len, order, accs, body) =
        acc.ok_or_else(|| refuse(k, "a matmul without `accumulate`"))?;
    let reads = |body: &[Stmt], var: usize| {
        body.iter().any(|s| {
            matches!(s, Stmt::Let(v) if matches!(k.values[*v].op, Op::ReadVar(x) if x.index() == var))
        })
    };
    let mut epilogues = Vec::new();
    for a in accs.iter() {
        let mine: Vec<_> = ifs
            .iter()
            .filter(|(_, body)| reads(body, a.var.index()))
            .collect();
        let ok = |body: &[Stmt]| {
            body.iter()
                .all(|s| matches!(s, Stmt::Let(_) | Stmt::Store { .. }))
                && body
                    .iter()
                    .filter(|s| matches!(s, Stmt::Store { .. }))
                    .count()
                    == 1
        };
        match mine[..] {
            [&(cond, body)] if ok(body) => epilogues.push((cond, body)),
            _ => {
                return Err(refuse(
                    k,
                    "a matmul accumulator not stored by exactly one `if` of `let`s and one store",
                ))
            }
        }
    }
    if ifs.len() != accs.len() {
        return Err(refuse(k, "a matmul `if` that stores no accumulator"));
    }
    Ok(Statements {
        k_index,
        len,
        order,
        accs: accs.iter().map(|a| (a.var.index(), a.a, a.b)).collect(),
        epilogues,
        top,
        on_k: Rc::new(dependent(k, k_index, body)),
    })
}

/// The values of an `accumulate`'s `body` (only `let`s, in order) that depend on its index
/// `k`, and `k`.
fn dependent(kernel: &Kernel, k: Value, body: &[Stmt]) -> HashSet<usize> {
    let mut on_k = HashSet::from([k.index()]);
    for s in body {
        if let Stmt::Let(v) = s {
            let ops = kernel.values[*v].op.operands();
            if ops.iter().any(|o| on_k.contains(&o.index())) {
                on_k.insert(v.index());
            }
        }
    }
    on_k
}

/// `index` as `(base + k) >> s` with `base` free of `k` (`None` for 0): `(base, s)`.
pub(super) fn index_form(
    kernel: &Kernel,
    index: Value,
    k: Value,
    k_free: &dyn Fn(Value) -> bool,
) -> Option<(Option<Value>, u32)> {
    let mut shift = 0u32;
    let mut e = index;
    while let Op::Binary(BinaryOp::Shr, a, c) = kernel.values[e].op {
        let Op::Const(Scalar::U32(c)) = kernel.values[c].op else {
            return None;
        };
        shift = shift.checked_add(c)?;
        e = a;
    }
    if e == k {
        return Some((None, shift));
    }
    match kernel.values[e].op {
        Op::Binary(BinaryOp::Add, a, b) if a == k && k_free(b) => Some((Some(b), shift)),
        Op::Binary(BinaryOp::Add, a, b) if b == k && k_free(a) => Some((Some(a), shift)),
        _ => None,
    }
}

/// An index as `(sum of coef * term + konst + a * k) >> shift` (wrapping `u32` before the
/// shift), each term a value free of `k`: how the weight's loads are addressed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Affine {
    pub(super) terms: Vec<(Value, u32)>,
    pub(super) konst: u32,
    /// `k`'s coefficient.
    pub(super) a: u32,
    pub(super) shift: u32,
}

impl Affine {
    /// The value before the shift at `k = 0` on work item `w`, if its terms evaluate.
    pub(super) fn base(&self, eval: &mut super::launch::Eval<'_>, w: u32) -> Option<u32> {
        self.terms.iter().try_fold(self.konst, |acc, &(t, c)| {
            Some(acc.wrapping_add(c.wrapping_mul(eval.at(t, w)?)))
        })
    }
}

/// `index` as an [`Affine`] in `k`: shifts right by constants outermost, then sums, constant
/// left shifts and products by a constant or a launch scalar (`scalars`) of `k` and of
/// values free of it. `None` for any other form.
pub(super) fn affine(
    kernel: &Kernel,
    index: Value,
    k: Value,
    k_free: &dyn Fn(Value) -> bool,
    scalars: &[Option<u32>],
) -> Option<Affine> {
    let mut shift = 0u32;
    let mut e = index;
    while let Op::Binary(BinaryOp::Shr, a, c) = kernel.values[e].op {
        let Op::Const(Scalar::U32(c)) = kernel.values[c].op else {
            return None;
        };
        shift = shift.checked_add(c).filter(|s| *s < 32)?;
        e = a;
    }
    let mut out = Affine {
        terms: Vec::new(),
        konst: 0,
        a: 0,
        shift,
    };
    linear(kernel, e, 1, k, k_free, scalars, &mut out).then_some(out)
}

/// Adds `coef * v` to `out` (see [`affine`]); false where `v` is not linear in `k`.
fn linear(
    kernel: &Kernel,
    v: Value,
    coef: u32,
    k: Value,
    k_free: &dyn Fn(Value) -> bool,
    scalars: &[Option<u32>],
    out: &mut Affine,
) -> bool {
    let constant = |x: Value| match kernel.values[x].op {
        Op::Const(Scalar::U32(c)) => Some(c),
        Op::Param(p) => scalars.get(p.index()).copied().flatten(),
        _ => None,
    };
    if v == k {
        out.a = out.a.wrapping_add(coef);
        return true;
    }
    if k_free(v) {
        match constant(v) {
            Some(c) => out.konst = out.konst.wrapping_add(coef.wrapping_mul(c)),
            None => out.terms.push((v, coef)),
        }
        return true;
    }
    let mut go = |x: Value, c: u32| linear(kernel, x, c, k, k_free, scalars, out);
    match kernel.values[v].op {
        Op::Binary(BinaryOp::Add, a, b) => go(a, coef) && go(b, coef),
        Op::Binary(BinaryOp::Shl, a, b) => match constant(b) {
            Some(c) if c < 32 => go(a, coef.wrapping_mul(1 << c)),
            _ => false,
        },
        Op::Binary(BinaryOp::Mul, a, b) => match (constant(a), constant(b)) {
            (_, Some(c)) => go(a, coef.wrapping_mul(c)),
            (Some(c), _) => go(b, coef.wrapping_mul(c)),
            _ => false,
        },
        _ => false,
    }
}

/// The index of the first load in `v`'s expression (depth first) at an index that depends
/// on the reduction's index.
pub(super) fn first_weight_load(kernel: &Kernel, v: Value, f: &Statements<'_>) -> Option<Value> {
    let mut stack = vec![v];
    let mut seen = HashSet::new();
    while let Some(v) = stack.pop() {
        if !seen.insert(v.index()) {
            continue;
        }
        match kernel.values[v].op {
            Op::Load { index, .. } if !f.k_free(index) => return Some(index),
            ref op => stack.extend(op.operands().into_iter().rev()),
        }
    }
    None
}

/// The leaves of `v`'s expression: loads at an index that depends on `k` (whose indices are
/// not lowered), and values defined outside the `accumulate`; other loads' indices are
/// walked.
pub(super) fn collect_leaves(
    kernel: &Kernel,
    v: Value,
    f: &Statements<'_>,
    out: &mut Vec<Value>,
    seen: &mut HashSet<usize>,
) {
    if !seen.insert(v.index()) {
        return;
    }
    let op = &kernel.values[v].op;
    if let Op::Load { index, .. } = op {
        if !f.k_free(*index) {
            out.push(v);
            // A gather's index may read loads too.
            collect_leaves(kernel, *index, f, out, seen);
            return;
        }
    }
    if f.top.contains(&v.index()) {
        out.push(v);
        return;
    }
    for o in op.operands() {
        collect_leaves(kernel, o, f, out, seen);
    }
}
