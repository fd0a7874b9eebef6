//! `accumulate` with its accumulators as the vector lanes: when accumulator `j`'s factors are
//! accumulator 0's expressions with one value `col_0` (defined before the loop) replaced by
//! `col_j`, and `col_j = col_0 + j` at run time, lane `j` of one vector evaluation of
//! accumulator 0's expressions with `col_0 + lane` in place of `col_0` is accumulator `j`'s
//! factor. Element `i` is fused into partial vector `i % w`, whose lane `j` is accumulator
//! `j`'s partial `i % w`, so every accumulator sums its elements in its own pinned order, as
//! the scalar loop does.
//!
//! The partials of an order are independent chains, so the loop need not visit the elements in
//! index order: it runs the ways in bands of consecutive ways, one band after another, each
//! visiting only its ways' elements in increasing index (way-major). Only a band's partials
//! are live, so a tile of many rows keeps them in registers (16 partial vectors: all 8 ways of
//! 2 rows, 2 ways of 8 rows). A band's fast loop has no branch but its elements' fast-form
//! tests (`lanes::lanes_fast_or_exit`): the uniform loads at `base + i` (a row of `dY`) are
//! proven in range once before the loops (their last element in range, no wrap-around) and
//! loaded unchecked, and at the first element whose forms do not all hold the rest of the band
//! runs in a loop of checked groups, so that the checked code (gathers, per-lane reports) is
//! outside the fast loop and its registers. When the column loads' indices are affine in the
//! element (`band_proof.rs`), their fast forms are proven for the whole band before its loop,
//! and a first loop runs with no test at all.
//!
//! This is the 4-bit matmul's input gradient, `dX[m, k] = sum over n of dY[m, n] * W[n, k]`:
//! vectorized over `n` its weights are gathered one byte per lane, `K / 2` bytes apart; with
//! the tile's columns `k0 .. k0 + 16` as lanes they are 8 contiguous bytes, decoded by the
//! fused 4-bit path (`nibble.rs`, `deferred.rs`). The plan is taken only when every load that
//! depends on `col_0` has a fast form in it (`lanes::loads_are_runs`), so a forward tile (whose
//! column strides by `K`) keeps the usual vector loop; when the columns are not consecutive
//! (the tile's last columns clamped at the matrix edge) the usual loop runs.
//!
//! A tile of several rows (`tm x tn` accumulators, row-major) is several groups of `tn`
//! accumulators that differ in their row's `dY` value and share the weights: each group is
//! matched on its own, all with the same `col_0`, and one vector evaluation of the groups'
//! first accumulators' expressions gives every group's factors, so the weights of `tn` columns
//! are decoded once per element for all rows.

use std::collections::{HashMap, HashSet};

use qforge_ir::{Accum, BinaryOp, Op, ScalarType, Stmt, Value};

use super::band_proof::affine_loads;
use super::emit::{Emitter, InRange};
use super::reduce::NEG_ZERO;
use crate::error::Result;

/// An accumulate that runs with its accumulators as lanes (see the module docs). The columns
/// are `u32` values (load indices are `u32`; the lanes compute `col_0 + lane` with the IR's
/// wrapping add, as the run-time check does).
pub(super) struct Outer {
    /// `col_j` of each accumulator of each group (groups of consecutive accumulators, one
    /// vector each; every group's `col_0` is the same value).
    cols: Vec<Vec<Value>>,
    /// The lets the groups' first accumulators' factors depend on, in body order.
    body: Vec<Stmt>,
    /// Arena indices of every value the loop body defines.
    inside: HashSet<usize>,
}

impl Outer {
    /// `col_j` of each accumulator of each group.
    pub(super) fn cols(&self) -> &[Vec<Value>] {
        &self.cols
    }
}

/// The most partials (ways of the order) the outer loop unrolls.
const MAX_WAYS: u32 = 8;

/// The most accumulators the plan takes (a 16 x 16 tile).
const MAX_ACCUMULATORS: usize = 256;

/// `op` with its operands replaced by `new` (in operand order; `None` when too few).
pub(super) fn with_operands(op: &Op, new: &[Value]) -> Option<Op> {
    let mut it = new.iter().copied();
    let mut next = || it.next();
    Some(match op {
        Op::WorkItem | Op::LoopIndex | Op::Param(_) | Op::Const(_) | Op::ReadVar(_) => op.clone(),
        Op::Load { buf, .. } => Op::Load {
            buf: *buf,
            index: next()?,
        },
        Op::Lookup { table, .. } => Op::Lookup {
            table: *table,
            index: next()?,
        },
        Op::SearchSorted { table, .. } => Op::SearchSorted {
            table: *table,
            value: next()?,
        },
        Op::Unary(u, _) => Op::Unary(*u, next()?),
        Op::Binary(b, _, _) => Op::Binary(*b, next()?, next()?),
        Op::Cmp(c, _, _) => Op::Cmp(*c, next()?, next()?),
        Op::Fma(..) => Op::Fma(next()?, next()?, next()?),
        Op::Select { .. } => Op::Select {
            cond: next()?,
            if_true: next()?,
            if_false: next()?,
        },
        Op::FloatToInt { to, rounding, .. } => Op::FloatToInt {
            value: next()?,
            to: *to,
            rounding: *rounding,
        },
        Op::IntToFloat { rounding, .. } => Op::IntToFloat {
            value: next()?,
            rounding: *rounding,
        },
        Op::Bitcast { to, .. } => Op::Bitcast {
            value: next()?,
            to: *to,
        },
        Op::Reduce {
            kind, buf, order, ..
        } => Op::Reduce {
            kind: *kind,
            buf: *buf,
            start: next()?,
            len: next()?,
            order: *order,
        },
    })
}

/// Matches accumulator 0's expression `x` against accumulator `j`'s `y`. The first pass
/// finds the pair; the second, with the pair fixed, also requires every value the two
/// expressions share to be independent of `col_0` (the vector evaluation replaces `col_0`
/// everywhere in accumulator 0's expressions, so a shared use of it would differ in lane `j`).
struct Matcher<'k> {
    k: &'k qforge_ir::Kernel,
    /// Values defined by the body's lets.
    inside: HashSet<usize>,
    /// The one pair of values defined before the loop that differ (`col_0`, `col_j`).
    pair: Option<(Value, Value)>,
    /// Whether the pair is fixed (the second pass).
    fixed: bool,
    seen: HashMap<(usize, usize), bool>,
    uses_col: HashMap<usize, bool>,
}

impl Matcher<'_> {
    /// Whether `v` is `col_0` or a body value computed from it.
    fn uses_col(&mut self, v: Value) -> bool {
        let Some((c0, _)) = self.pair else {
            return false;
        };
        if v == c0 {
            return true;
        }
        if !self.inside.contains(&v.index()) {
            return false;
        }
        if let Some(r) = self.uses_col.get(&v.index()) {
            return *r;
        }
        let ops = self
            .k
            .values
            .try_get(v)
            .map(|d| d.op.operands())
            .unwrap_or_default();
        let r = ops.into_iter().any(|o| self.uses_col(o));
        self.uses_col.insert(v.index(), r);
        r
    }

    fn same(&mut self, x: Value, y: Value) -> bool {
        if x == y {
            return !self.fixed || !self.uses_col(x);
        }
        if let Some(r) = self.seen.get(&(x.index(), y.index())) {
            return *r;
        }
        let r = self.compare(x, y);
        self.seen.insert((x.index(), y.index()), r);
        r
    }

    fn compare(&mut self, x: Value, y: Value) -> bool {
        let (Some(dx), Some(dy)) = (self.k.values.try_get(x), self.k.values.try_get(y)) else {
            return false;
        };
        if dx.ty != dy.ty {
            return false;
        }
        match (
            self.inside.contains(&x.index()),
            self.inside.contains(&y.index()),
        ) {
            (true, true) => {
                let (ox, oy) = (dx.op.operands(), dy.op.operands());
                with_operands(&dy.op, &ox).as_ref() == Some(&dx.op)
                    && ox.iter().zip(&oy).all(|(a, b)| self.same(*a, *b))
            }
            (false, false) => match (&dx.op, &dy.op) {
                (Op::Const(a), Op::Const(b)) => a == b,
                _ => match self.pair {
                    None if !self.fixed => {
                        self.pair = Some((x, y));
                        true
                    }
                    p => p == Some((x, y)),
                },
            },
            _ => false,
        }
    }
}

/// Partial vectors the outer loop keeps live at once: enough independent `fma` chains to hide
/// the instruction's latency, few enough to stay in registers with the decode's.
const LIVE_PARTIALS: usize = 16;

/// The ways one band of the outer loop runs for `regs` vector registers of accumulators: all of
/// them (element-major) for one or two registers, fewer as they grow, one for 16 or more; a
/// power of two, so that the bands divide the ways (a power of two themselves) evenly.
fn outer_band(ways: u32, regs: usize) -> u32 {
    let fit = (LIVE_PARTIALS / regs.max(1)).max(1);
    (1u32 << fit.ilog2()).min(ways)
}

impl Emitter<'_> {
    /// The outer-lane plan of `accumulate` (see the module docs), or `None`: vector lanes on,
    /// at most 256 accumulators (a multiple of 4) in groups of 4 to 64 consecutive ones (a
    /// power of two dividing their count; the largest that matches, so a 6 x 16 tile is six
    /// groups of 16), at most [`MAX_WAYS`] partials (a power of two), every accumulator of a group
    /// matching the group's first up to one value, `col_0` the same in every group, and its
    /// loads all runs.
    pub(super) fn outer_plan(
        &self,
        index: Value,
        ways: u32,
        body: &[Stmt],
        accs: &[Accum],
    ) -> Option<Outer> {
        let n = accs.len();
        if self.opts.lanes == 0
            || ways > MAX_WAYS
            || !ways.is_power_of_two()
            || !(4..=MAX_ACCUMULATORS).contains(&n)
            || !n.is_multiple_of(4)
        {
            return None;
        }
        let inside: HashSet<usize> = body
            .iter()
            .filter_map(|s| match s {
                Stmt::Let(v) => Some(v.index()),
                _ => None,
            })
            .collect();
        // Group sizes: the powers of two from 64 down to 4 that divide `n`.
        let largest = (1usize << n.trailing_zeros()).min(64);
        let cols =
            std::iter::successors(Some(largest), |g| (*g > 4).then_some(g / 2)).find_map(|g| {
                let cols: Option<Vec<Vec<Value>>> = accs
                    .chunks(g)
                    .map(|group| self.group_cols(index, &inside, group))
                    .collect();
                cols.filter(|c| c.iter().all(|g| g[0] == c[0][0]))
            })?;
        // Columns that are products (a row-major operand's row starts `col_j * L`) are
        // consecutive only when the factor is 1: the plan would be code that never runs.
        let product = |v: Value| {
            matches!(self.k.values.try_get(v).map(|d| &d.op),
                Some(Op::Binary(BinaryOp::Mul, x, y))
                    if ![*x, *y].iter().any(|f| matches!(self.k.values.try_get(*f).map(|d| &d.op),
                        Some(Op::Const(c)) if c.bits() == 1)))
        };
        if cols.iter().flatten().all(|c| product(*c)) {
            return None;
        }
        // The groups' first accumulators' cone, in body order. Lane `j` of a group runs its
        // accumulator `j`'s cone, loads included; a load or reduce in no accumulator's cone
        // would not run at all (and its failed bounds check would not report), so the plan
        // refuses it.
        let cone_of = |factors: &[Value]| -> Option<HashSet<usize>> {
            let mut need: HashSet<usize> = factors.iter().map(|v| v.index()).collect();
            for stmt in body.iter().rev() {
                if let Stmt::Let(v) = stmt {
                    if need.contains(&v.index()) {
                        let ops = self.k.values.try_get(*v)?.op.operands();
                        need.extend(ops.iter().map(|o| o.index()));
                    }
                }
            }
            Some(need)
        };
        let g = cols[0].len();
        let firsts: Vec<Value> = accs.iter().step_by(g).flat_map(|a| [a.a, a.b]).collect();
        let need = cone_of(&firsts)?;
        let all: Vec<Value> = accs.iter().flat_map(|a| [a.a, a.b]).collect();
        let used = cone_of(&all)?;
        let unused_effect = body.iter().any(|s| {
            matches!(s, Stmt::Let(v) if !used.contains(&v.index())
                && self.k.values.try_get(*v).is_some_and(|d| matches!(d.op, Op::Load { .. } | Op::Reduce { .. })))
        });
        if unused_effect {
            return None;
        }
        let cone: Vec<Stmt> = body
            .iter()
            .filter(|s| matches!(s, Stmt::Let(v) if need.contains(&v.index())))
            .cloned()
            .collect();
        let col0 = cols[0][0];
        let eligible = super::lanes::eligible(self.k, col0, &cone, false)
            && super::lanes::loads_are_runs(self.k, col0, &cone);
        eligible.then_some(Outer {
            cols,
            body: cone,
            inside,
        })
    }

    /// The columns `col_j` of one group of accumulators, each matching the group's first up to
    /// one `u32` value defined before the loop (not the loop index), or `None`.
    fn group_cols(
        &self,
        index: Value,
        inside: &HashSet<usize>,
        group: &[Accum],
    ) -> Option<Vec<Value>> {
        let mut cols = vec![];
        for acc in &group[1..] {
            let mut pair = None;
            for fixed in [false, true] {
                let mut m = Matcher {
                    k: self.k,
                    inside: inside.clone(),
                    pair,
                    fixed,
                    seen: HashMap::new(),
                    uses_col: HashMap::new(),
                };
                if !(m.same(group[0].a, acc.a) && m.same(group[0].b, acc.b)) {
                    return None;
                }
                pair = m.pair;
            }
            let (c0, cj) = pair?;
            let u32_col = self
                .k
                .values
                .try_get(c0)
                .is_some_and(|d| d.ty == ScalarType::U32);
            if cols.first().is_some_and(|c| *c != c0) || c0 == index || cj == index || !u32_col {
                return None;
            }
            if cols.is_empty() {
                cols.push(c0);
            }
            cols.push(cj);
        }
        Some(cols)
    }

    /// For the scalar loads of the plan's body at `base + index` or `base + index * stride` (or
    /// without `base`), `base` and `stride` defined before the loop: `i1` whether all of them
    /// are in range for every element `0 .. len` (`len` at least 1: `base + (len - 1) * stride`
    /// below the buffer's element count, computed without wrapping, and below 2^32, so that
    /// the IR's 32-bit product and sum do not wrap either), and the loads'
    /// arena indices with their `(base, index or product)`. `true` and none without bounds
    /// checks. (The strided loads are a transposed `A`'s column, `A[l * M + row]`: the
    /// adapter's `dU = dY.T @ a` at `M = 4096`, `L = 512` ran in 2.5 ms with them checked per
    /// element, 1.2 ms from a row-major copy.)
    fn uniform_runs_in_range(
        &mut self,
        index: Value,
        len: &str,
        outer: &Outer,
    ) -> Result<(String, InRange)> {
        let mut proof = "true".to_string();
        let mut proven = HashMap::new();
        let last = self.ins(format!("sub i32 {len}, 1"));
        let last = self.ins(format!("zext i32 {last} to i64"));
        for stmt in &outer.body {
            let Stmt::Let(v) = stmt else { continue };
            let Some(Op::Load { buf, index: at }) = self.k.values.try_get(*v).map(|d| &d.op) else {
                continue;
            };
            let invariant = |w: Value| w != index && !outer.inside.contains(&w.index());
            // The index as `[base +] step`, `step` the loop index or `i * stride`.
            let op = |w: Value| self.k.values.try_get(w).map(|d| &d.op);
            let stride = |w: Value| match op(w) {
                _ if w == index => Some(None),
                Some(Op::Binary(BinaryOp::Mul, x, y)) if *x == index && invariant(*y) => {
                    Some(Some(*y))
                }
                Some(Op::Binary(BinaryOp::Mul, x, y)) if *y == index && invariant(*x) => {
                    Some(Some(*x))
                }
                _ => None,
            };
            let (base, step, stride) = match (stride(*at), op(*at)) {
                (Some(s), _) => (None, *at, s),
                (None, Some(Op::Binary(BinaryOp::Add, x, y))) => match (stride(*x), stride(*y)) {
                    (Some(s), None) if invariant(*y) => (Some(*y), *x, s),
                    (None, Some(s)) if invariant(*x) => (Some(*x), *y, s),
                    _ => continue,
                },
                _ => continue,
            };
            let (_, count, _, _) = self.buffer(*buf)?;
            let Some(count) = count else { continue };
            let mut top = last.clone();
            if let Some(s) = stride {
                let s = self.val(s)?;
                let s = self.ins(format!("zext i32 {s} to i64"));
                top = self.ins(format!("mul i64 {top}, {s}"));
            }
            if let Some(b) = base {
                let b = self.val(b)?;
                let b = self.ins(format!("zext i32 {b} to i64"));
                top = self.ins(format!("add i64 {b}, {top}"));
            }
            // The IR's `base + i` (and `i * stride`) wrap at 2^32; the address does not, and
            // a buffer may hold more than 2^32 elements.
            let inside = self.ins(format!("icmp ult i64 {top}, {count}"));
            let fits = self.ins(format!("icmp ult i64 {top}, 4294967296"));
            let ok = self.ins(format!("and i1 {inside}, {fits}"));
            proof = self.ins(format!("and i1 {proof}, {ok}"));
            proven.insert(v.index(), base.map(|b| (b, step)));
        }
        Ok((proof, proven))
    }

    /// `i1`: whether `col_j = col_0 + j` for every accumulator (the plan's run-time condition).
    pub(super) fn outer_condition(&mut self, outer: &Outer) -> Result<String> {
        let c0 = self.val(outer.cols[0][0])?;
        // The groups of a tile's rows share their columns: each is tested once, all in one
        // vector comparison.
        let mut seen = HashSet::new();
        let (mut have, mut want) = (Vec::new(), Vec::new());
        for cols in &outer.cols {
            for (j, c) in cols.iter().enumerate().skip(1) {
                if seen.insert((j, c.index())) {
                    have.push(self.val(*c)?);
                    want.push(j);
                }
            }
        }
        if have.is_empty() {
            return Ok("true".to_string());
        }
        let vt = format!("<{} x i32>", have.len());
        let mut cols = "undef".to_string();
        for (i, c) in have.iter().enumerate() {
            cols = self.ins(format!("insertelement {vt} {cols}, i32 {c}, i32 {i}"));
        }
        let base = self.splat(&c0, "i32", have.len() as u32);
        let steps: Vec<String> = want.iter().map(|j| format!("i32 {j}")).collect();
        let expect = self.ins(format!("add {vt} {base}, <{}>", steps.join(", ")));
        let eq = self.ins(format!("icmp eq {vt} {cols}, {expect}"));
        let name = format!("llvm.vector.reduce.and.v{}i1", have.len());
        Ok(self.call(&name, "i1", &[(&format!("<{} x i1>", have.len()), &eq)]))
    }

    /// The loop of the plan over elements `0 .. len` (see the module docs), leaving each
    /// group's sums (its accumulators' partials' halving trees) in its `<lanes x float>` slot
    /// of `sums`, accumulator `j` of the group in lane `j`.
    pub(super) fn outer_accumulate(
        &mut self,
        index: Value,
        len: &str,
        ways: u32,
        outer: &Outer,
        accs: &[Accum],
        sums: &[String],
    ) -> Result<()> {
        let lanes = outer.cols[0].len() as u32;
        let vt = format!("<{lanes} x float>");
        let neg: Vec<String> = (0..lanes).map(|_| format!("float {NEG_ZERO}")).collect();
        // `partials[g][r]`: group `g`'s partial vector `r`.
        let partials: Vec<Vec<String>> = outer
            .cols
            .iter()
            .map(|_| (0..ways).map(|_| self.alloca(&vt)).collect())
            .collect();
        for p in partials.iter().flatten() {
            self.line(format!("store {vt} <{}>, {vt}* {p}", neg.join(", ")));
        }
        let col0 = outer.cols[0][0];
        let saved = self.vals[col0.index()].clone();
        let first = self.val(col0)?;
        // The `fma`s of one element into partial `r` of every group.
        let fuse = |e: &mut Self, r: u32| -> Result<()> {
            for (group, parts) in accs.chunks(lanes as usize).zip(&partials) {
                let p = &parts[r as usize];
                let (x, y) = (e.get(group[0].a, lanes)?, e.get(group[0].b, lanes)?);
                let old = e.ins(format!("load {vt}, {vt}* {p}"));
                let new = e.fma(lanes, &x, &y, &old);
                e.line(format!("store {vt} {new}, {vt}* {p}"));
            }
            Ok(())
        };
        // One element `i` in a checked group.
        let element = |e: &mut Self, i: &str, r: u32| -> Result<()> {
            e.set(index, i.to_string(), 1);
            e.lanes_group(col0, &first, lanes, &outer.body, &[], &mut |e| fuse(e, r))?;
            e.vals[col0.index()] = saved.clone();
            Ok(())
        };
        // Bands of `band` consecutive ways, one band after another: a band's loops visit only
        // its ways' elements (`i % ways` in the band), in increasing `i`, so every partial still
        // fuses its elements in order while only the band's partials are live. The band's
        // fast loop runs the full rounds (`i < len - len % ways`) with no branch but the fast
        // forms' tests; at the first element whose forms do not all hold, that element and the
        // rest of its round run checked, then a loop of checked rounds, then the band's share
        // of the last `len % ways` elements.
        // The uniform loads at `base + i` (`base` from before the loop, as `dY[m*N + n]`) are
        // in range for every element when they are for the last one, without wrapping: one
        // check before the loops, and the fast loops load them unchecked.
        let (proof, in_range) = self.uniform_runs_in_range(index, len, outer)?;
        // And the loads at the column seed, when their indices are affine in `i`: once per band
        // (`band_proof.rs`), so that its first loop tests nothing per element.
        let affine = affine_loads(self.k, col0, index, &outer.inside, &outer.body);
        // Each group is `lanes / opts.lanes` vector registers (a group of 64 columns is 4).
        let regs = outer.cols.len() * (lanes / self.opts.lanes.max(1)).max(1) as usize;
        let band = outer_band(ways, regs);
        let end = self.ins(format!("and i32 {len}, {}", !(ways - 1) as i32));
        for first_way in (0..ways).step_by(band as usize) {
            let rs: Vec<u32> = (first_way..first_way + band).collect();
            let slot = self.alloca("i32");
            self.line(format!("store i32 0, i32* {slot}"));
            let (proven, head, checked, tail) = (
                self.label("outer_proven"),
                self.label("outer_band"),
                self.label("outer_checked"),
                self.label("outer_tail"),
            );
            let (all_proven, tested) = (self.label("outer_all_proven"), self.label("outer_tested"));
            let exits: Vec<String> = rs.iter().map(|_| self.label("outer_exit")).collect();
            let any = self.ins(format!("icmp ult i32 0, {end}"));
            self.cond_br(&any, &proven, &tail);
            // One round of the band's ways at `i0` from `slot`, each element in its fast form
            // (leaving for `exits[j]` when its forms do not hold; with no exits, proven), then on
            // to `head` while `i0 + ways < end` (written `end - i0 > ways`, as i0 < end), else
            // to `tail`. Returns `i0`.
            let round = |e: &mut Self, head: &str, exits: Option<&[String]>| -> Result<String> {
                let i0 = e.ins(format!("load i32, i32* {slot}"));
                for (j, r) in rs.iter().enumerate() {
                    let i = e.ins(format!("add i32 {i0}, {r}"));
                    e.set(index, i, 1);
                    e.in_range = in_range.clone();
                    let exit = exits.map(|x| x[j].as_str());
                    let fast = e.lanes_fast_or_exit(
                        col0,
                        &first,
                        lanes,
                        &outer.body,
                        &mut |e| fuse(e, *r),
                        exit,
                    );
                    e.in_range.clear();
                    fast?;
                    e.vals[col0.index()] = saved.clone();
                }
                let left = e.ins(format!("sub i32 {end}, {i0}"));
                let more = e.ins(format!("icmp ugt i32 {left}, {ways}"));
                let next = e.ins(format!("add i32 {i0}, {ways}"));
                e.line(format!("store i32 {next}, i32* {slot}"));
                e.cond_br(&more, head, &tail);
                Ok(i0)
            };
            self.start(&proven);
            if let Some(loads) = &affine {
                let lanes_proof =
                    self.band_proof(loads, index, &outer.inside, (&rs, ways, &end), lanes)?;
                self.vals[col0.index()] = saved.clone();
                let both = self.ins(format!("and i1 {proof}, {lanes_proof}"));
                self.cond_br(&both, &all_proven, &tested);
                // Every element's fast forms hold: the loop tests nothing.
                self.start(&all_proven);
                round(self, &all_proven, None)?;
            } else {
                self.br(&tested);
            }
            self.start(&tested);
            self.cond_br(&proof, &head, &checked);
            self.start(&head);
            let i0 = round(self, &head, Some(&exits))?;
            // Leaving at the band's `j`-th element: it and the rest of the round, checked.
            for (j, exit) in exits.iter().enumerate() {
                self.start(exit);
                self.vals[col0.index()] = saved.clone();
                if j > 0 {
                    for r in &rs[j..] {
                        let i = self.ins(format!("add i32 {i0}, {r}"));
                        element(self, &i, *r)?;
                    }
                    let next = self.ins(format!("add i32 {i0}, {ways}"));
                    self.line(format!("store i32 {next}, i32* {slot}"));
                }
                self.br(&checked);
            }
            self.start(&checked);
            let from = self.ins(format!("load i32, i32* {slot}"));
            self.counted_loop("i32", &from, &end, ways, |e, i0| {
                for r in &rs {
                    let i = e.ins(format!("add i32 {i0}, {r}"));
                    element(e, &i, *r)?;
                }
                Ok(())
            })?;
            self.br(&tail);
            self.start(&tail);
            // The band's share of the last `len % ways` elements: element `end + r` goes to
            // partial `r`.
            for r in rs.iter().filter(|r| **r < ways - 1) {
                let i = self.ins(format!("add i32 {end}, {r}"));
                let inside = self.ins(format!("icmp ult i32 {i}, {len}"));
                let (then, next) = (self.label("outer_last"), self.label("outer_next"));
                self.cond_br(&inside, &then, &next);
                self.start(&then);
                element(self, &i, *r)?;
                self.br(&next);
                self.start(&next);
            }
        }
        // The halving tree of every accumulator of a group at once: lane `j` of each step is
        // accumulator `j`'s `p[r] + p[r + w]`, the scalar tree's additions in its order.
        for (parts, slot) in partials.iter().zip(sums) {
            let p: Vec<String> = parts
                .iter()
                .map(|p| self.ins(format!("load {vt}, {vt}* {p}")))
                .collect();
            let tree = self.halving_tree(&vt, p);
            self.line(format!("store {vt} {tree}, {vt}* {slot}"));
        }
        Ok(())
    }
}
