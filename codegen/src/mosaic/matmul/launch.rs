//! A matmul's launch evaluated work item by work item (`super`): which outputs each
//! accumulator stores, and its per-work-item values as functions of them.

use qforge_ir::interp::{eval_binary, eval_cmp, eval_unary};
use qforge_ir::{Dim, Kernel, Op, ParamId, ParamKind, Scalar, ScalarType, Stmt, Value};

use super::statements::{first_weight_load, index_form, Statements};
use crate::error::Result;
use crate::mosaic::{refuse, Shapes};

/// One output of one accumulator: work item `w` stores `y[m * N + n]`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Item {
    pub(super) w: u32,
    pub(super) m: u32,
    pub(super) n: u32,
}

/// A per-work-item value as a function of the output's coordinates, on every work item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Fit {
    /// The same on every work item.
    Uniform(u32),
    /// `a * (n >> shift) + b` (wrapping `u32`): a column, or a column's panel or block.
    Col { a: u32, b: u32, shift: u32 },
    /// `a * m + b`.
    Row(u32, u32),
}

/// A matmul's dimensions as messages name them: the class's `M`, `N`, `K` with what each is
/// (an input gradient's output columns are its weight's `k`, its reduction the weight's `n`).
pub(super) fn named_dims(m: u32, n: u32, k: u32) -> String {
    format!("M = {m} rows, N = {n} output columns, K = {k} reduced")
}

/// The most accumulators (work items times accumulators per work item) the lowering
/// evaluates (about 10 s on the 2-core VM): a `4096 x 4096` output.
const MAX_EVALUATED: u64 = 1 << 24;

/// A matmul's dimensions at the launch and each accumulator's outputs.
pub(super) struct Outputs {
    /// The reduction's length `K`, and the output's `M x N`.
    pub(super) kk: u32,
    pub(super) m: u32,
    pub(super) n: u32,
    /// The activations `[M, K]` and the output `[M, N]`.
    pub(super) x: ParamId,
    pub(super) y: ParamId,
    /// Per accumulator, the outputs its work items store.
    pub(super) items: Vec<Vec<Item>>,
}

/// Evaluates every work item of the launch: each accumulator's row `m` (its activation
/// index at `k = 0`, over `K`) and column `n` (its store's index less the row's first) where
/// its guard holds; refuses a launch whose guarded stores are not `y[m * N + n]`, each output
/// once, all of them.
pub(super) fn outputs(
    k: &Kernel,
    f: &Statements<'_>,
    shapes: &Shapes,
    scalars: &[Option<u32>],
    eval: &mut Eval<'_>,
) -> Result<Outputs> {
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
    let kk = eval.at(f.len, 0).ok_or_else(|| {
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
    let y = &k.params[y_buf].name;
    let (m, n) = match (dims(x_buf).as_deref(), dims(y_buf).as_deref()) {
        (Some(&[m, kx]), Some(&[my, n])) if kx == kk && my == m => (m, n),
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
    let k_free = |v: Value| f.k_free(v);
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
        if first_weight_load(k, b, f).is_none() {
            return Err(refuse(
                k,
                "a weight factor without a load at an index that depends on k",
            ));
        }
        bases.push(x_base);
    }
    // Every work item is evaluated, and every output marked: a launch too large for that is
    // refused before (a sane one has at most an output per work item and accumulator).
    let evaluated = u64::from(shapes.grid) * f.accs.len() as u64;
    let outputs = u64::from(m) * u64::from(n);
    if m == 0 || n == 0 || kk == 0 {
        return Err(refuse(
            k,
            &format!("an empty matmul ({})", named_dims(m, n, kk)),
        ));
    }
    // The IR's indices are `u32`: `m * K + k` and `m * N + n` must not wrap.
    if u64::from(m) * u64::from(kk.max(n)) > 1 << 32 {
        return Err(refuse(
            k,
            &format!(
                "a matmul of {}: its activations or output have more than 2^32 elements \
                 (indices are 32-bit)",
                named_dims(m, n, kk)
            ),
        ));
    }
    let launch = format!(
        "a matmul launch of {} work items of {} accumulators",
        shapes.grid,
        f.accs.len()
    );
    if evaluated > MAX_EVALUATED {
        return Err(refuse(
            k,
            &format!(
                "{launch} (the lowering evaluates each: at most {MAX_EVALUATED} accumulators in all)"
            ),
        ));
    }
    if outputs > evaluated {
        return Err(refuse(
            k,
            &format!("{launch}, fewer than its {m} x {n} outputs"),
        ));
    }
    let mut stored = vec![false; outputs as usize];
    for w in 0..shapes.grid {
        for (t, (cond, body)) in f.epilogues.iter().enumerate() {
            if eval
                .at(*cond, w)
                .ok_or_else(|| refuse(k, "a matmul guard not computed from the work item"))?
                == 0
            {
                continue;
            }
            let xb = bases[t].map_or(Some(0), |b| eval.at(b, w));
            let index = body
                .iter()
                .find_map(|s| match s {
                    Stmt::Store { index, .. } => Some(*index),
                    _ => None,
                })
                .and_then(|i| eval.at(i, w));
            let (Some(xb), Some(index)) = (xb, index) else {
                return Err(refuse(
                    k,
                    "a matmul whose indices are not computed from the work item",
                ));
            };
            // The row is the activation's; the column what the store adds to the row's
            // first output (the weight's loads are checked against it: `leaves`).
            let (mi, ni) = (xb / kk, index % n);
            let ok = xb % kk == 0
                && mi < m
                && index / n == mi
                && !std::mem::replace(&mut stored[index as usize], true);
            if !ok {
                return Err(refuse(
                    k,
                    &format!(
                        "a matmul whose work item {w} (accumulator {t}) stores element {index} \
                         of {y}, not its row's and column's once"
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
                "a matmul whose launch stores no {y}[{missing}] (a grid of {} work items: \
                 each output must be stored by one; check the launch's tile and work-item \
                 counts)",
                shapes.grid
            ),
        ));
    }
    Ok(Outputs {
        kk,
        m,
        n,
        x: x_buf,
        y: y_buf,
        items,
    })
}

/// The function `a * (n >> s) + b` (the smallest `s`), `a * m + b` or constant through
/// `points` (an output and the value there), if one is.
pub(super) fn fit(points: &[(Item, u32)]) -> Option<Fit> {
    let &(_, first) = points.first()?;
    if points.iter().all(|&(_, x)| x == first) {
        return Some(Fit::Uniform(first));
    }
    let line = |coord: &dyn Fn(&Item) -> u32| -> Option<(u32, u32)> {
        // Through the point of the smallest coordinate and the next coordinate's (`a` the
        // values' wrapping difference over the coordinates', where it divides), checked on
        // every point.
        let &(i0, v0) = points.iter().min_by_key(|(it, _)| coord(it))?;
        let c0 = coord(&i0);
        let &(i1, v1) = points
            .iter()
            .filter(|(it, _)| coord(it) > c0)
            .min_by_key(|(it, _)| coord(it))?;
        let (dc, dv) = (coord(&i1) - c0, v1.wrapping_sub(v0));
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
    let col = |shift: u32| line(&|it: &Item| it.n >> shift).map(|(a, b)| Fit::Col { a, b, shift });
    col(0)
        .or_else(|| line(&|it: &Item| it.m).map(|(a, b)| Fit::Row(a, b)))
        .or_else(|| (1..32).find_map(col))
}
/// Evaluates per-work-item integer values of a kernel at one work item.
pub(super) struct Eval<'k> {
    k: &'k Kernel,
    scalars: &'k [Option<u32>],
    w: u32,
    cache: Vec<Option<Option<u32>>>,
}

impl<'k> Eval<'k> {
    pub(super) fn new(k: &'k Kernel, scalars: &'k [Option<u32>]) -> Self {
        Eval {
            k,
            scalars,
            w: 0,
            cache: vec![None; k.values.len()],
        }
    }

    /// The launch's integer scalars.
    pub(super) fn scalars(&self) -> &'k [Option<u32>] {
        self.scalars
    }

    /// `v` at work item `w`: `None` where it reads memory, a variable, the loop index or a
    /// parameter the launch does not give.
    pub(super) fn at(&mut self, v: Value, w: u32) -> Option<u32> {
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
