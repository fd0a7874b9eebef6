//! The matmul class: a kernel whose work item computes outputs `y[m, n]` as an `accumulate`
//! over `k` of an activation `x[m * K + k]` times a weight element `w(n, k)` computed from
//! buffers read at `n * K + k` (one element), `(n * K + k) >> 1` (a byte of two 4-bit codes)
//! or `(n * K + k) >> s` (a block's absmax), then stores a function of the total (and of
//! per-column buffers `[N]`: a bias) into `y[m * N + n]`: the fused 4-bit matmul's forward.
//!
//! How the IR's work items map to outputs is not parsed but checked: at the launch (Mosaic
//! modules are specialized to its shapes) every work item's per-work-item values are
//! evaluated, which gives each accumulator's row `m` (its activation index at `k = 0`, over
//! `K`) and column `n` (its weight index at `k = 0`, over `K`). The kernel is in the class when
//! every guarded store is `y[m * N + n]`, each output once, all `M x N` of them, and every
//! accumulator computes the same function of its own `(m, n)`: compared op by op, each
//! per-work-item value fitted as `a * m + b` or `a * n + b` on every work item.
//!
//! The tile program (`docs/backends/mosaic.md`, "The matmul class"): grid step `(i, j, l)`
//! loads activation tile `x[i*TM.., l*TK..]` and decodes weight tile `w[j*TN.., l*TK..]`
//! (`TN x TK`, or two `TN x TK/2` halves, the even and odd `k` of each byte), turned so `n` is
//! on the lanes. Its loop takes the step's `k` in increasing order: partial `k % W` (a VMEM
//! scratch of `W` tiles `TM x TN`, `-0.0` at `l = 0`) becomes `fma(x[:, k], w[k, :], partial)`
//! with the exact integer `fma` of `soft.rs`. At the last `l` the halving tree combines the
//! partials and the epilogue's values are stored: `accumulate`'s order exactly
//! (`docs/semantics.md`, section 5).

use std::collections::{HashMap, HashSet};

use qforge_ir::interp::{eval_binary, eval_cmp, eval_unary};
use qforge_ir::{
    Access, BinaryOp, Dim, Kernel, Op, ParamId, ParamKind, ReduceOrder, Scalar, ScalarType, Stmt,
    Value,
};

use super::lowering::Lowering;
use super::ops::elt_of;
use super::tile::{Elt, MatmulPlan, Shape, Stage, TileProgram, VOp, Window, WindowKind};
use super::{refuse, Shapes};
use crate::error::Result;

/// Output rows per step where the activations and the output are 32-bit (a 16-bit array's
/// native tile has 16 rows: then 16).
const TM_32: u32 = 8;
/// Output columns per step: a vector register's lanes.
const TN: u32 = 128;
/// Reduction elements per step: a byte tile of two 4-bit codes is then `TN x 128`.
const TK: u32 = 256;

/// Which part of the program is being lowered, and so what its leaves stand for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Domain {
    /// The weight element `w(n, k)`: per-work-item values are functions of `n`; `half` is the
    /// half of each byte the lanes hold where the weight is read per byte.
    Weight { half: Option<u32> },
    /// The epilogue: the total, and per-work-item values of `m` and `n`.
    Out,
}

/// A per-work-item value as a function of the output's coordinates, on every work item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fit {
    /// The same on every work item.
    Uniform(u32),
    /// `a * n + b` (wrapping `u32`).
    Col(u32, u32),
    /// `a * m + b`.
    Row(u32, u32),
}

/// What a load at an index that depends on `k` reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Form {
    /// `w[n * K + k]`: one element per `k`.
    Element,
    /// `w[(n * K + k) >> 1]`: a byte of two elements.
    Byte,
    /// `w[(n * K + k) >> s]`: one element per block of `2^s` (`s >= 2`).
    Blocks(u32),
}

/// The leaves of the part being lowered (see [`Domain`]).
#[derive(Clone)]
pub(super) struct Part {
    domain: Domain,
    /// The reduction's index.
    k: Value,
    /// Accumulator 0's variable: the total, in the epilogue.
    total_var: usize,
    /// The node of the total.
    total: usize,
    /// Accumulator 0's per-work-item values (defined outside the `accumulate`) as functions
    /// of `(m, n)`.
    fits: HashMap<usize, Fit>,
    /// Accumulator 0's weight loads.
    forms: HashMap<usize, Form>,
    /// The launch's integer scalars: constants of the module.
    scalars: Vec<Option<u32>>,
}

/// One output of one accumulator: work item `w` stores `y[m * N + n]`.
#[derive(Clone, Copy, Debug)]
struct Item {
    w: u32,
    m: u32,
    n: u32,
}

/// The kernel's statements: the `accumulate` and each accumulator's epilogue.
struct Form2<'k> {
    k_index: Value,
    order: ReduceOrder,
    /// `(variable, activation factor, weight factor)` per accumulator.
    accs: Vec<(usize, Value, Value)>,
    /// Per accumulator: its `if`'s condition and body (which stores its output).
    epilogues: Vec<(Value, &'k [Stmt])>,
    /// The values defined outside the `accumulate` (per work item).
    top: HashSet<usize>,
}

/// The value of each integer scalar parameter of a launch (`None` for the others): what
/// [`super::lower_with`] takes.
pub fn scalar_values(args: &[qforge_ir::Arg<'_>]) -> Vec<Option<u32>> {
    args.iter()
        .map(|a| match a {
            qforge_ir::Arg::Scalar(Scalar::U32(v)) => Some(*v),
            qforge_ir::Arg::Scalar(Scalar::I32(v)) => Some(*v as u32),
            _ => None,
        })
        .collect()
}

/// Whether `k` has the matmul class's top-level `accumulate`.
pub(super) fn is_matmul(k: &Kernel) -> bool {
    k.body.iter().any(|s| matches!(s, Stmt::Accumulate { .. }))
}

/// Lowers a matmul-class kernel (module docs) at `shapes`, the launch's integer scalars
/// `scalars`, or refuses it naming what is outside the class.
pub(super) fn tile_program(
    k: &Kernel,
    shapes: &Shapes,
    scalars: &[Option<u32>],
) -> Result<TileProgram> {
    let f = form(k)?;
    let mut eval = Eval::new(k, scalars);
    let dims = |p: ParamId| -> Option<Vec<u32>> {
        match &k.params.try_get(p)?.kind {
            ParamKind::Buffer { shape, .. } => shape
                .iter()
                .map(|d| match d {
                    Dim::Const(c) => Some(*c),
                    Dim::Param(q) => scalars.get(q.index()).copied().flatten(),
                })
                .collect(),
            ParamKind::Scalar(_) => None,
        }
    };
    let kk = eval.at(k_len(k).unwrap_or(f.k_index), 0).ok_or_else(|| {
        refuse(
            k,
            "a matmul without its launch's scalars (the reduction's length K)",
        )
    })?;
    let x_buf = match k.values[f.accs[0].1].op {
        Op::Load { buf, .. } => buf,
        _ => return Err(refuse(k, "a matmul whose first factor is not a load")),
    };
    let y_buf = f.epilogues[0]
        .1
        .iter()
        .find_map(|s| match s {
            Stmt::Store { buf, .. } => Some(*buf),
            _ => None,
        })
        .ok_or_else(|| refuse(k, "a matmul whose epilogue stores nothing"))?;
    let (m, n) = match (dims(x_buf).as_deref(), dims(y_buf).as_deref()) {
        (Some(&[m, kx]), Some(&[my, n])) if kx == kk && my == m && m * n * kk != 0 => (m, n),
        _ => {
            return Err(refuse(
                k,
                &format!(
                    "a matmul whose activations are not [M, K] and output [M, N] (K = {kk}) at \
                     this launch"
                ),
            ))
        }
    };
    for (buf, need) in [
        (x_buf, m as usize * kk as usize),
        (y_buf, m as usize * n as usize),
    ] {
        if shapes.elements.get(buf.index()).copied() != Some(need) {
            return Err(refuse(
                k,
                "a matmul launched with other buffer sizes than its dims",
            ));
        }
    }
    let k_free = |v: Value| !depends_on(k, v, f.k_index);
    // Each accumulator's outputs.
    let mut items: Vec<Vec<Item>> = vec![Vec::new(); f.accs.len()];
    let mut bases = Vec::new();
    for (t, &(_, a, b)) in f.accs.iter().enumerate() {
        let Op::Load { buf, index } = k.values[a].op else {
            return Err(refuse(
                k,
                &format!("a matmul whose accumulator {t}'s first factor is not a load"),
            ));
        };
        let x_base = match index_form(k, index, f.k_index, &k_free) {
            Some((base, 0)) if buf == x_buf => base,
            _ => {
                return Err(refuse(
                    k,
                    "an activation load at an index other than m * K + k",
                ))
            }
        };
        let w_base = first_weight_load(k, b, f.k_index)
            .and_then(|i| index_form(k, i, f.k_index, &k_free))
            .ok_or_else(|| refuse(k, "a weight factor without a load at (n * K + k) >> s"))?
            .0;
        bases.push((x_base, w_base));
    }
    let mut stored = vec![false; m as usize * n as usize];
    for w in 0..shapes.grid {
        for (t, (cond, body)) in f.epilogues.iter().enumerate() {
            if eval
                .at(*cond, w)
                .ok_or_else(|| refuse(k, "a matmul guard not computed from the work item"))?
                == 0
            {
                continue;
            }
            let base = |e: &mut Eval, b: Option<Value>| b.map_or(Some(0), |b| e.at(b, w));
            let (xb, wb) = (base(&mut eval, bases[t].0), base(&mut eval, bases[t].1));
            let index = body
                .iter()
                .find_map(|s| match s {
                    Stmt::Store { index, .. } => Some(*index),
                    _ => None,
                })
                .and_then(|i| eval.at(i, w));
            let (Some(xb), Some(wb), Some(index)) = (xb, wb, index) else {
                return Err(refuse(
                    k,
                    "a matmul whose indices are not computed from the work item",
                ));
            };
            let (mi, ni) = (xb / kk, wb / kk);
            let ok = xb % kk == 0
                && wb % kk == 0
                && mi < m
                && ni < n
                && u64::from(index) == u64::from(mi) * u64::from(n) + u64::from(ni)
                && !std::mem::replace(&mut stored[index as usize], true);
            if !ok {
                return Err(refuse(
                    k,
                    &format!(
                        "a matmul whose work item {w} (accumulator {t}) stores element {index} \
                         of y, not its row's and column's once"
                    ),
                ));
            }
            items[t].push(Item { w, m: mi, n: ni });
        }
    }
    if let Some(missing) = stored.iter().position(|s| !s) {
        return Err(refuse(
            k,
            &format!(
                "a matmul whose launch stores no y[{missing}] (a grid of {} work items)",
                shapes.grid
            ),
        ));
    }
    // Accumulators 1.. compute the same function of their own (m, n) as accumulator 0:
    // the same ops, and per-work-item values that are one function of (m, n) over all
    // accumulators' outputs (`pairs`: the value of each accumulator for each of 0's).
    let mut pairs: HashMap<usize, Vec<(usize, Value)>> = HashMap::new();
    for t in 0..f.accs.len() {
        if items[t].is_empty() {
            continue;
        }
        let mut same = Same {
            k,
            f: &f,
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
        // Its weight loads read its own column's row.
        let mut loads = Vec::new();
        weight_loads(k, f.accs[t].2, f.k_index, &mut loads);
        for index in loads {
            let base = index_form(k, index, f.k_index, &k_free).and_then(|b| b.0);
            for it in &items[t] {
                if base.map_or(Some(0), |b| eval.at(b, it.w)) != Some(it.n.wrapping_mul(kk)) {
                    return Err(refuse(
                        k,
                        "a weight load at another row than the accumulator's output column",
                    ));
                }
            }
        }
    }
    // Accumulator 0's leaves: weight loads, and per-work-item values fitted over all
    // accumulators.
    let mut leaves = Vec::new();
    let mut seen = HashSet::new();
    collect_leaves(k, f.accs[0].2, &f, &mut leaves, &mut seen);
    for s in f.epilogues[0].1 {
        if let Stmt::Store { value, .. } = s {
            collect_leaves(k, *value, &f, &mut leaves, &mut seen);
        }
    }
    let mut fits = HashMap::new();
    let mut forms = HashMap::new();
    for &v in &leaves {
        if let Op::Load { index, .. } = k.values[v].op {
            let Some((_, shift)) = index_form(k, index, f.k_index, &k_free) else {
                return Err(refuse(
                    k,
                    "a weight load at an index other than (n * K + k) >> s",
                ));
            };
            let form = match shift {
                0 => Form::Element,
                1 => Form::Byte,
                s if s < 32 && kk % (1 << s) == 0 && TK % (1 << s) == 0 => Form::Blocks(s),
                s => {
                    return Err(refuse(
                        k,
                        &format!(
                            "a weight read per block of 2^{s} elements where K = {kk} (a block \
                             must divide K, and {TK})"
                        ),
                    ))
                }
            };
            forms.insert(v.index(), form);
        } else {
            let points: Vec<(Item, u32)> = pairs
                .get(&v.index())
                .map(Vec::as_slice)
                .unwrap_or(&[])
                .iter()
                .flat_map(|&(t, b)| items[t].iter().map(move |it| (*it, b)))
                .map(|(it, b)| eval.at(b, it.w).map(|x| (it, x)))
                .collect::<Option<_>>()
                .unwrap_or_default();
            let fit = fit(&points).ok_or_else(|| {
                refuse(
                    k,
                    &format!(
                        "the per-work-item value %{} of a matmul, which is not a * m + b or a * n + b",
                        v.index()
                    ),
                )
            })?;
            fits.insert(v.index(), fit);
        }
    }
    let halves = forms.values().any(|f| *f == Form::Byte);
    if halves && forms.values().any(|f| *f == Form::Element) {
        return Err(refuse(k, "a weight read both per element and per byte"));
    }
    let shifts: HashSet<u32> = forms
        .values()
        .filter_map(|f| match f {
            Form::Blocks(s) => Some(*s),
            _ => None,
        })
        .collect();
    if shifts.len() > 1 {
        return Err(refuse(k, "a weight read in blocks of two sizes"));
    }
    if halves && kk % 2 == 1 {
        return Err(refuse(
            k,
            &format!("a weight read per byte with an odd K = {kk}"),
        ));
    }
    let sixteen = |b: ParamId| match &k.params[b].kind {
        ParamKind::Buffer { dtype, .. } => dtype.size_bytes() != 4,
        ParamKind::Scalar(_) => false,
    };
    // A dimension smaller than its tile is its own tile (a block may equal the array).
    let tm = if sixteen(x_buf) || sixteen(y_buf) {
        16
    } else {
        TM_32
    }
    .min(m);
    let tn = TN.min(n);
    let ways = match f.order {
        ReduceOrder::Sequential => 1,
        ReduceOrder::Strided(w) => w,
    };
    let mut l = Lowering::new(k, shapes, 1);
    l.program.matmul = Some(MatmulPlan {
        m,
        n,
        k: kk,
        tm,
        tn,
        tk: TK,
        ways,
        halves,
        blocks_shift: shifts.into_iter().next(),
        x: 0,
        w: Vec::new(),
        loop_start: 0,
        fma: 0,
        total_start: 0,
    });
    let mut part = Part {
        domain: Domain::Out,
        k: f.k_index,
        total_var: f.accs[0].0,
        total: 0,
        fits,
        forms,
        scalars: scalars.to_vec(),
    };
    let x_window = l.matmul_window(x_buf, WindowKind::MmX)?;
    let x = l.load_window(x_window, Shape::XTile);
    let mut w = Vec::new();
    for half in if halves {
        vec![Some(0), Some(1)]
    } else {
        vec![None]
    } {
        part.domain = Domain::Weight { half };
        l.matmul_part(Some(part.clone()));
        w.push(l.get(f.accs[0].2, Shape::WTile)?);
    }
    let loop_start = l.program.nodes.len();
    let px = l.push(VOp::Staged(Stage::X), Shape::Acc, Elt::F32);
    let pw = l.push(VOp::Staged(Stage::W), Shape::Acc, Elt::F32);
    let pp = l.push(VOp::Staged(Stage::Partial), Shape::Acc, Elt::F32);
    let fma = l.fma_f32(px, pw, pp);
    let total_start = l.program.nodes.len();
    part.total = l.push(VOp::Staged(Stage::Total), Shape::Acc, Elt::F32);
    part.domain = Domain::Out;
    l.matmul_part(Some(part));
    for s in f.epilogues[0].1 {
        if let Stmt::Store {
            buf,
            value,
            rounding,
            ..
        } = s
        {
            let v = l.get(*value, Shape::Acc)?;
            let out = l.matmul_window(*buf, WindowKind::MmOut)?;
            let dtype = l.program.windows[out].dtype;
            let bits = l.narrow(v, dtype, *rounding)?;
            l.program.stores.push((out, bits));
        }
    }
    l.matmul_part(None);
    let plan = l.program.matmul.as_mut().expect("set above");
    plan.x = x;
    plan.w = w;
    plan.loop_start = loop_start;
    plan.fma = fma;
    plan.total_start = total_start;
    Ok(super::lowering::by_param(l.program))
}

/// The `accumulate`'s length.
fn k_len(k: &Kernel) -> Option<Value> {
    k.body.iter().find_map(|s| match s {
        Stmt::Accumulate { len, .. } => Some(*len),
        _ => None,
    })
}

/// The kernel's statements in the class's form: `let`s, one `accumulate`, then `let`s and one
/// `if` per accumulator whose body reads it and stores once.
fn form(k: &Kernel) -> Result<Form2<'_>> {
    let mut top = HashSet::new();
    let mut acc = None;
    let mut ifs = Vec::new();
    for s in &k.body {
        match s {
            Stmt::Let(v) => {
                top.insert(v.index());
            }
            Stmt::Accumulate {
                index, order, accs, ..
            } if acc.is_none() => {
                acc = Some((*index, *order, accs));
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
    let (k_index, order, accs) = acc.ok_or_else(|| refuse(k, "a matmul without `accumulate`"))?;
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
    Ok(Form2 {
        k_index,
        order,
        accs: accs.iter().map(|a| (a.var.index(), a.a, a.b)).collect(),
        epilogues,
        top,
    })
}

/// Whether `v` depends on `k` (through its operands).
fn depends_on(kernel: &Kernel, v: Value, k: Value) -> bool {
    v == k
        || kernel.values[v]
            .op
            .operands()
            .iter()
            .any(|&o| depends_on(kernel, o, k))
}

/// `index` as `(base + k) >> s` with `base` free of `k` (`None` for 0): `(base, s)`.
fn index_form(
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

/// The index of the first load in `v`'s expression at an index that depends on `k`.
fn first_weight_load(kernel: &Kernel, v: Value, k: Value) -> Option<Value> {
    match kernel.values[v].op {
        Op::Load { index, .. } if depends_on(kernel, index, k) => Some(index),
        ref op => op
            .operands()
            .into_iter()
            .find_map(|o| first_weight_load(kernel, o, k)),
    }
}

/// The indices of every load in `v`'s expression at an index that depends on `k`.
fn weight_loads(kernel: &Kernel, v: Value, k: Value, out: &mut Vec<Value>) {
    match kernel.values[v].op {
        Op::Load { index, .. } if depends_on(kernel, index, k) => out.push(index),
        ref op => {
            for o in op.operands() {
                weight_loads(kernel, o, k, out);
            }
        }
    }
}

/// The leaves of `v`'s expression: loads at an index that depends on `k` (whose indices are
/// not lowered), and values defined outside the `accumulate`; other loads' indices are
/// walked.
fn collect_leaves(
    kernel: &Kernel,
    v: Value,
    f: &Form2<'_>,
    out: &mut Vec<Value>,
    seen: &mut HashSet<usize>,
) {
    if !seen.insert(v.index()) {
        return;
    }
    let op = &kernel.values[v].op;
    if let Op::Load { index, .. } = op {
        if depends_on(kernel, *index, f.k_index) {
            out.push(v);
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

/// The function `a * n + b`, `a * m + b` or constant through `points` (an output and the
/// value there), if one is.
fn fit(points: &[(Item, u32)]) -> Option<Fit> {
    let &(_, first) = points.first()?;
    if points.iter().all(|&(_, x)| x == first) {
        return Some(Fit::Uniform(first));
    }
    let line = |coord: &dyn Fn(&Item) -> u32| -> Option<(u32, u32)> {
        let (i0, v0) = points[0];
        let &(i1, v1) = points.iter().find(|(it, _)| coord(it) != coord(&i0))?;
        let (c0, c1) = (coord(&i0), coord(&i1));
        // Coordinates are below 2^32 and the values wrap: `a = (v1 - v0) / (c1 - c0)` where
        // it divides, checked on every point.
        let (dc, dv) = (c1.wrapping_sub(c0), v1.wrapping_sub(v0));
        if dv % dc != 0 {
            return None;
        }
        let a = dv / dc;
        let b = v0.wrapping_sub(a.wrapping_mul(c0));
        points
            .iter()
            .all(|(it, x)| a.wrapping_mul(coord(it)).wrapping_add(b) == *x)
            .then_some((a, b))
    };
    if let Some((a, b)) = line(&|it: &Item| it.n) {
        return Some(Fit::Col(a, b));
    }
    line(&|it: &Item| it.m).map(|(a, b)| Fit::Row(a, b))
}

/// Evaluates per-work-item integer values of a kernel at one work item.
struct Eval<'k> {
    k: &'k Kernel,
    scalars: &'k [Option<u32>],
    w: u32,
    cache: Vec<Option<Option<u32>>>,
}

impl<'k> Eval<'k> {
    fn new(k: &'k Kernel, scalars: &'k [Option<u32>]) -> Self {
        Eval {
            k,
            scalars,
            w: 0,
            cache: vec![None; k.values.len()],
        }
    }

    /// `v` at work item `w`: `None` where it reads memory, a variable, the loop index or a
    /// parameter the launch does not give.
    fn at(&mut self, v: Value, w: u32) -> Option<u32> {
        if w != self.w {
            self.cache.fill(None);
            self.w = w;
        }
        self.value(v)
    }

    fn value(&mut self, v: Value) -> Option<u32> {
        if let Some(c) = self.cache[v.index()] {
            return c;
        }
        let ty = |x: Value| self.k.values[x].ty;
        let r = match self.k.values[v].op {
            Op::WorkItem => Some(self.w),
            Op::Param(p) => self.scalars.get(p.index()).copied().flatten(),
            Op::Const(s) => Some(match s {
                Scalar::U32(u) => u,
                Scalar::I32(i) => i as u32,
                Scalar::Bool(b) => u32::from(b),
                Scalar::F32(b) => b,
            }),
            Op::Unary(u, a) => {
                let t = ty(a);
                self.value(a).map(|a| eval_unary(u, t, a))
            }
            Op::Binary(b, x, y) if ty(x) != ScalarType::F32 => {
                let t = ty(x);
                match (self.value(x), self.value(y)) {
                    (Some(x), Some(y)) => Some(eval_binary(b, t, x, y)),
                    _ => None,
                }
            }
            Op::Cmp(c, x, y) if ty(x) != ScalarType::F32 => {
                let t = ty(x);
                match (self.value(x), self.value(y)) {
                    (Some(x), Some(y)) => Some(u32::from(eval_cmp(c, t, x, y))),
                    _ => None,
                }
            }
            Op::Select {
                cond,
                if_true,
                if_false,
            } => match self.value(cond) {
                Some(0) => self.value(if_false),
                Some(_) => self.value(if_true),
                None => None,
            },
            _ => None,
        };
        self.cache[v.index()] = Some(r);
        r
    }
}

/// Compares accumulator `t`'s expressions with accumulator 0's op by op, recording which of
/// its per-work-item values stands where each of 0's does.
struct Same<'a, 'k> {
    k: &'k Kernel,
    f: &'a Form2<'k>,
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

impl Lowering<'_> {
    /// Starts lowering a part of a matmul (or ends it: `None`): values lowered for another
    /// part are forgotten, as the leaves mean other things there.
    pub(super) fn matmul_part(&mut self, part: Option<Part>) {
        self.memo.clear();
        self.natural_shapes.clear();
        self.matmul = part;
    }

    /// The natural shape of a matmul part's leaf, or `None` for an op lowered as usual.
    pub(super) fn matmul_natural(&self, v: Value) -> Result<Option<Shape>> {
        let Some(p) = &self.matmul else {
            return Ok(None);
        };
        let weight = matches!(p.domain, Domain::Weight { .. });
        Ok(Some(match self.k.values[v].op {
            Op::Param(_) => Shape::Uniform,
            Op::LoopIndex if v == p.k && weight => Shape::WTile,
            Op::ReadVar(x) if !weight && x.index() == p.total_var => Shape::Acc,
            Op::ReadVar(_) | Op::LoopIndex => {
                return Err(refuse(
                    self.k,
                    "a matmul reading another variable or loop index",
                ))
            }
            Op::Load { .. } if weight => match p.forms.get(&v.index()) {
                Some(Form::Blocks(_)) => Shape::WBlocks,
                Some(_) => Shape::WTile,
                None => {
                    return Err(refuse(
                        self.k,
                        "a weight load at an index other than (n * K + k) >> s",
                    ))
                }
            },
            Op::Load { .. } => Shape::Acc,
            _ => match p.fits.get(&v.index()) {
                Some(Fit::Uniform(_)) => Shape::Uniform,
                Some(Fit::Col(..)) if weight => Shape::WRow,
                Some(Fit::Row(..)) if weight => {
                    return Err(refuse(
                        self.k,
                        "a weight element computed from the output's row m",
                    ))
                }
                Some(_) => Shape::Acc,
                None => return Ok(None),
            },
        }))
    }

    /// A matmul part's leaf `v` at `at`, or `None` for an op lowered as usual.
    pub(super) fn matmul_leaf(&mut self, v: Value, at: Shape) -> Result<Option<usize>> {
        let Some(p) = self.matmul.clone() else {
            return Ok(None);
        };
        let ty = self.k.values[v].ty;
        let node = match self.k.values[v].op {
            Op::Param(q) => match p.scalars.get(q.index()).copied().flatten() {
                Some(c) => self.konst(c, elt_of(ty), at),
                None => {
                    let w = self.scalar_window(q)?;
                    self.push(VOp::Scalar { window: w }, at, elt_of(ty))
                }
            },
            Op::LoopIndex => {
                let half = match p.domain {
                    Domain::Weight { half } => half,
                    Domain::Out => None,
                };
                self.push(VOp::ReductionIndex { half }, Shape::WTile, Elt::I32)
            }
            Op::ReadVar(_) => p.total,
            Op::Load { buf, index } => match (p.domain, p.forms.get(&v.index())) {
                (Domain::Weight { .. }, Some(Form::Blocks(_))) => {
                    let w = self.matmul_window(buf, WindowKind::MmBlocks)?;
                    self.load_window(w, Shape::WBlocks)
                }
                (Domain::Weight { .. }, Some(_)) => {
                    let w = self.matmul_window(buf, WindowKind::MmWeight)?;
                    self.load_window(w, Shape::WTile)
                }
                _ => {
                    if p.fits.get(&index.index()) != Some(&Fit::Col(1, 0)) {
                        return Err(refuse(
                            self.k,
                            &format!(
                                "an epilogue load of {} at another index than the output's column n",
                                self.k.params[buf].name
                            ),
                        ));
                    }
                    let w = self.matmul_window(buf, WindowKind::MmCols)?;
                    self.load_window(w, Shape::Acc)
                }
            },
            _ => {
                let Some(&fit) = p.fits.get(&v.index()) else {
                    return Ok(None);
                };
                let (coord, a, b) = match fit {
                    Fit::Uniform(c) => return Ok(Some(self.konst(c, elt_of(ty), at))),
                    Fit::Col(a, b) if matches!(p.domain, Domain::Weight { .. }) => {
                        (VOp::WeightRow, a, b)
                    }
                    Fit::Col(a, b) => (VOp::OutCol, a, b),
                    Fit::Row(a, b) => (VOp::OutRow, a, b),
                };
                let shape = if coord == VOp::WeightRow {
                    Shape::WRow
                } else {
                    Shape::Acc
                };
                let mut c = self.push(coord, shape, Elt::I32);
                if a != 1 {
                    let a = self.konst(a, Elt::I32, shape);
                    c = self.push(VOp::Bin(super::tile::Bin::MulI, c, a), shape, Elt::I32);
                }
                if b != 0 {
                    let b = self.konst(b, Elt::I32, shape);
                    c = self.push(VOp::Bin(super::tile::Bin::AddI, c, b), shape, Elt::I32);
                }
                c
            }
        };
        Ok(Some(node))
    }

    /// The window of a matmul's buffer `p` of `kind` (one per buffer and kind).
    pub(super) fn matmul_window(&mut self, p: ParamId, kind: WindowKind) -> Result<usize> {
        if let Some(&w) = self.windows.get(&(p.index(), kind)) {
            return Ok(w);
        }
        let plan = self.program.matmul.clone().expect("a matmul's plan");
        let param = &self.k.params[p];
        let ParamKind::Buffer { dtype, access, .. } = &param.kind else {
            return Err(refuse(self.k, &format!("{} used as a buffer", param.name)));
        };
        let (kp, np) = (
            plan.k.div_ceil(plan.tk) * plan.tk,
            plan.n.div_ceil(plan.tn) * plan.tn,
        );
        let shift = u32::from(plan.halves);
        let blocks = plan.k >> plan.blocks_shift.unwrap_or(0);
        // Columns of the array, and the buffer's elements it holds.
        let (width, elements) = match kind {
            WindowKind::MmX => (kp, plan.m as usize * plan.k as usize),
            WindowKind::MmWeight => (kp >> shift, plan.n as usize * (plan.k >> shift) as usize),
            WindowKind::MmBlocks => (blocks, plan.n as usize * blocks as usize),
            WindowKind::MmCols => (np, plan.n as usize),
            _ => (np, plan.m as usize * plan.n as usize),
        };
        let have = self.shapes.elements.get(p.index()).copied().unwrap_or(0);
        let written = kind == WindowKind::MmOut;
        if have < elements || (kind == WindowKind::MmCols && have != elements) {
            return Err(refuse(
                self.k,
                &format!(
                    "a matmul's {} of {have} elements ({elements} needed at M = {}, N = {}, K = {})",
                    param.name, plan.m, plan.n, plan.k
                ),
            ));
        }
        if !written && *access != Access::Read {
            return Err(refuse(
                self.k,
                &format!("a matmul reading {}, which it writes", param.name),
            ));
        }
        let w = self.program.windows.len();
        self.program.windows.push(Window {
            param: p.index(),
            name: param.name.clone(),
            dtype: *dtype,
            width,
            elements,
            read: !written,
            written,
            kind,
        });
        self.windows.insert((p.index(), kind), w);
        Ok(w)
    }
}

impl TileProgram {
    /// The buffer a matmul's window holds as `[rows, columns]` (zero-padded on both to the
    /// array's shape), or `None` for a flat buffer padded at its end.
    pub fn buffer_shape(&self, w: &Window) -> Option<[u32; 2]> {
        let p = self.matmul.as_ref()?;
        let shift = u32::from(p.halves);
        Some(match w.kind {
            WindowKind::MmX => [p.m, p.k],
            WindowKind::MmWeight => [p.n, p.k >> shift],
            WindowKind::MmBlocks => [p.n, w.width],
            WindowKind::MmCols => [1, p.n],
            WindowKind::MmOut => [p.m, p.n],
            _ => return None,
        })
    }
}
