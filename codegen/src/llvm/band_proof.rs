//! The fast forms of an outer-lane band (`outer.rs`) proven once before its loop, so that the
//! loop tests nothing per element.
//!
//! A band visits elements `i = r + ways * t` (`r` one of its ways, `t = 0 .. T`, `T = end /
//! ways`). Each load that depends on the column seed has the form `(first + l) >> s`, `first`
//! the load's unshifted index at lane 0. `first` may be affine in `i`: built from `i` and loop
//! constants (values defined before the loop, constants, parameters, and `+ - * << >>` of
//! them; no loads) by wrapping `+`, `-`, `*` by a loop constant and `<<` by a constant. Then it
//! is `f(t) = f(0) + t * A (mod 2^32)` with `A = f(1) - f(0)`, both computed without side
//! effects (no load runs at an element past the end), and every element's fast-form condition
//! (`lanes::load_condition`) holds when:
//! * the low `s` bits of `f(0)` are as the form needs (zero, or for a uniform load `f(0) mod
//!   2^s + lanes - 1 < 2^s`) and those of `A` are zero: every `f(t)` has the same low bits; or,
//!   for a uniform load, `f(0)` and `A` are multiples of `lanes` (a power of two dividing
//!   `2^s`): every run lies in one aligned block of `lanes`, so in one of `2^s`;
//! * `f(0) + (T - 1) * A + lanes <= 2^32` as integers: no `f(t)` wraps, the largest is the last;
//! * the last run `(f(T - 1) >> s) ..` lies in the buffer.

use std::collections::HashSet;

use qforge_ir::{BinaryOp, Op, ParamId, ScalarType, Stmt, Value};

use super::emit::Emitter;
use crate::error::Result;

/// A load whose index is `base >> shift`, `base` affine in the loop index.
pub(super) struct AffineLoad {
    buf: ParamId,
    base: Value,
    shift: u32,
}

/// The loads of `body` (the outer plan's cone) that depend on `seed`, each with its affine
/// base and shift, or `None` when one is not of that form. `inside`: the values the loop body
/// defines (the others are loop constants).
pub(super) fn affine_loads(
    k: &qforge_ir::Kernel,
    seed: Value,
    index: Value,
    inside: &HashSet<usize>,
    body: &[Stmt],
) -> Option<Vec<AffineLoad>> {
    let mut varying = HashSet::from([seed.index()]);
    let mut loads = Vec::new();
    let walk = Affine { k, index, inside };
    for stmt in body {
        let Stmt::Let(v) = stmt else { continue };
        let def = k.values.try_get(*v)?;
        if !def
            .op
            .operands()
            .iter()
            .any(|o| varying.contains(&o.index()))
        {
            continue;
        }
        varying.insert(v.index());
        if let Op::Load { buf, index: at } = def.op {
            let (mut base, mut shift) = (at, 0u32);
            while let Some(Op::Binary(BinaryOp::Shr, x, y)) = k.values.try_get(base).map(|d| &d.op)
            {
                let Some(Op::Const(c)) = k.values.try_get(*y).map(|d| &d.op) else {
                    break;
                };
                shift += c.bits() & 31;
                base = *x;
            }
            if shift >= 32 || !walk.affine(base) {
                return None;
            }
            loads.push(AffineLoad { buf, base, shift });
        }
    }
    Some(loads)
}

/// Affinity in the loop index (module docs).
struct Affine<'k> {
    k: &'k qforge_ir::Kernel,
    index: Value,
    inside: &'k HashSet<usize>,
}

impl Affine<'_> {
    /// Whether `v` is an integer expression of the module docs' form.
    fn affine(&self, v: Value) -> bool {
        if v == self.index || self.constant(v) {
            return true;
        }
        let Some(def) = self.k.values.try_get(v) else {
            return false;
        };
        if !matches!(def.ty, ScalarType::U32 | ScalarType::I32) {
            return false;
        }
        match def.op {
            Op::Binary(BinaryOp::Add | BinaryOp::Sub, x, y) => self.affine(x) && self.affine(y),
            Op::Binary(BinaryOp::Mul, x, y) => {
                (self.constant(x) && self.affine(y)) || (self.constant(y) && self.affine(x))
            }
            Op::Binary(BinaryOp::Shl, x, y) => {
                matches!(self.k.values.try_get(y).map(|d| &d.op), Some(Op::Const(_)))
                    && self.affine(x)
            }
            _ => false,
        }
    }

    /// Whether `v` is the same for every element: defined before the loop, a constant, a
    /// scalar parameter, the work item, or integer arithmetic on such values (no load).
    fn constant(&self, v: Value) -> bool {
        if v == self.index {
            return false;
        }
        if !self.inside.contains(&v.index()) {
            return true;
        }
        let Some(def) = self.k.values.try_get(v) else {
            return false;
        };
        match def.op {
            Op::Const(_) | Op::Param(_) | Op::WorkItem => true,
            Op::Binary(BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Shl, x, y)
                if matches!(def.ty, ScalarType::U32 | ScalarType::I32) =>
            {
                self.constant(x) && self.constant(y)
            }
            Op::Binary(BinaryOp::Shr, x, y) if def.ty == ScalarType::U32 => {
                self.constant(x) && self.constant(y)
            }
            _ => false,
        }
    }
}

impl Emitter<'_> {
    /// `i1`: whether the fast forms of `loads` hold at every element `r + ways * t` (`t <
    /// end / ways`, `end` a multiple of `ways` and at least `ways`) of a band with ways `rs`,
    /// for a group of `lanes` columns starting at the seed's value (module docs).
    pub(super) fn band_proof(
        &mut self,
        loads: &[AffineLoad],
        index: Value,
        inside: &HashSet<usize>,
        (rs, ways, end): (&[u32], u32, &str),
        lanes: u32,
    ) -> Result<String> {
        let rounds = self.ins(format!("lshr i32 {end}, {}", ways.trailing_zeros()));
        let steps = self.ins(format!("sub i32 {rounds}, 1"));
        let steps = self.ins(format!("zext i32 {steps} to i64"));
        let mut all = "true".to_string();
        for r in rs {
            for load in loads {
                let (s, mask) = (load.shift, ((1u64 << load.shift) - 1) as u32);
                let uniform = (1u64 << s) >= u64::from(lanes);
                let f0 = self.eval_affine(load.base, index, inside, &r.to_string())?;
                let f1 = self.eval_affine(load.base, index, inside, &(r + ways).to_string())?;
                let step = self.ins(format!("sub i32 {f1}, {f0}"));
                let low = self.ins(format!("and i32 {f0}, {mask}"));
                let step_low = self.ins(format!("and i32 {step}, {mask}"));
                let keeps = self.ins(format!("icmp eq i32 {step_low}, 0"));
                let aligned = if uniform {
                    // Every element's lanes in one block of `2^s`: the same low bits each time
                    // and room for the lanes, or each run aligned to `lanes` (which divides
                    // `2^s`), as for a block of blocks that rows of a multiple of 32 never
                    // straddle.
                    let top = self.ins(format!("add i32 {low}, {}", lanes - 1));
                    let room = self.ins(format!("icmp ule i32 {top}, {mask}"));
                    let same = self.ins(format!("and i1 {room}, {keeps}"));
                    let runs = self.ins(format!("or i32 {f0}, {step}"));
                    let runs = self.ins(format!("and i32 {runs}, {}", lanes - 1));
                    let runs = self.ins(format!("icmp eq i32 {runs}, 0"));
                    self.ins(format!("or i1 {same}, {runs}"))
                } else {
                    let low_ok = self.ins(format!("icmp eq i32 {low}, 0"));
                    self.ins(format!("and i1 {low_ok}, {keeps}"))
                };
                let f0 = self.ins(format!("zext i32 {f0} to i64"));
                let step = self.ins(format!("zext i32 {step} to i64"));
                let span = self.ins(format!("mul i64 {step}, {steps}"));
                let last = self.ins(format!("add i64 {f0}, {span}"));
                let end_run = self.ins(format!("add i64 {last}, {lanes}"));
                let mut ok = self.ins(format!("icmp ule i64 {end_run}, 4294967296"));
                let (_, count, _, _) = self.buffer(load.buf)?;
                if let Some(count) = count {
                    let at = self.ins(format!("lshr i64 {last}, {s}"));
                    let n = if uniform { 1 } else { lanes >> s };
                    let top = self.ins(format!("add i64 {at}, {n}"));
                    let inside = self.ins(format!("icmp ule i64 {top}, {count}"));
                    ok = self.ins(format!("and i1 {ok}, {inside}"));
                }
                for c in [aligned, ok] {
                    all = self.ins(format!("and i1 {all}, {c}"));
                }
            }
        }
        Ok(all)
    }

    /// The `i32` value of the affine expression `v` with the loop index at `at`: the cone of
    /// `v` in the loop body lowered by [`Emitter::let_scalar`] (load-free: see
    /// [`affine_loads`]), the emitter's values of the cone restored afterwards.
    fn eval_affine(
        &mut self,
        v: Value,
        index: Value,
        inside: &HashSet<usize>,
        at: &str,
    ) -> Result<String> {
        let mut cone = Vec::new();
        self.affine_cone(v, index, inside, &mut cone);
        let saved: Vec<_> = cone.iter().map(|c| self.vals[c.index()].clone()).collect();
        let saved_index = self.vals[index.index()].clone();
        self.set(index, at.to_string(), 1);
        let value = cone
            .iter()
            .try_for_each(|c| self.let_scalar(*c))
            .and_then(|()| self.val(v));
        for (c, old) in cone.iter().zip(saved) {
            self.vals[c.index()] = old;
        }
        self.vals[index.index()] = saved_index;
        value
    }

    /// Appends the values of the loop body that `v` depends on (itself included, the index
    /// excluded) to `cone`, operands first.
    fn affine_cone(&self, v: Value, index: Value, inside: &HashSet<usize>, cone: &mut Vec<Value>) {
        if v == index || !inside.contains(&v.index()) || cone.contains(&v) {
            return;
        }
        for o in self.k.values[v].op.operands() {
            self.affine_cone(o, index, inside, cone);
        }
        cone.push(v);
    }
}
