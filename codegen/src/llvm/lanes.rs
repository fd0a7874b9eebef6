//! Vector lowering of a straight-line body (`let`s only) for `lanes` consecutive values of a
//! loop index: lane `l` computes what the scalar body computes for index `i0 + l`.
//!
//! Values that do not depend on the index are lowered once as scalars (uniform; a vector op
//! splats them). Index-dependent values are vectors of `lanes` lanes, computed by the same
//! lane-wise instructions as the scalar code (so every lane has the scalar bits), except for
//! memory, where the lowering uses what it knows of the index:
//! - Index forms are tracked through the body: `(f + l) >> s` for lane `l`, with `f` a scalar
//!   (the index itself is `s = 0`, `f = i0`; adding or subtracting a uniform keeps `s = 0`; a
//!   right shift by a constant adds to `s`).
//! - A load at `(f + l) >> s` is one contiguous vector load of `lanes >> s` elements, each
//!   repeated `2^s` times, when `f` is a multiple of `2^s` and the run lies in the buffer
//!   (without wrapping around 2^32); one scalar load, splatted, when `2^s >= lanes` and all
//!   lanes name the same element; otherwise, and at any other varying index, a masked gather:
//!   out-of-range lanes read nothing, yield 0 and report the work item, exactly as the scalar
//!   bounds check does per element. The choice is made at run time, per group.
//! - A varying table lookup clamps the index lanes; a table of at most 16 entries is a vector
//!   constant indexed lane by lane (a variable permute, e.g. `vpermps`), a larger one is
//!   gathered from memory.

use std::collections::HashMap;

use qforge_ir::{BinaryOp, Op, ScalarType, Stmt, Value, VarId};

use crate::running::{Rule, Running};

use super::emit::{internal, ty, vec_of, Emitter};
use super::memory::elem_ty;
use crate::error::Result;

/// Whether `body` can run in lanes: `let`s (index-dependent ones not reductions or loop
/// indices) and, when `stores` is set, stores, under the memory rule of a vectorized loop: each
/// buffer is stored by at most one statement, and a buffer both stored and read is accessed
/// only at the loop index itself (so no lane reads what another lane writes).
pub(super) fn eligible(k: &qforge_ir::Kernel, index: Value, body: &[Stmt], stores: bool) -> bool {
    let mut varying = vec![false; k.values.len()];
    varying[index.index()] = true;
    let (mut stored, mut read, mut elsewhere) = (Vec::new(), Vec::new(), Vec::new());
    for stmt in body {
        match stmt {
            Stmt::Let(v) => {
                let Some(def) = k.values.try_get(*v) else {
                    return false;
                };
                let dep = def.op.operands().iter().any(|o| varying[o.index()]);
                match &def.op {
                    Op::Reduce { buf, .. } => {
                        if dep {
                            return false;
                        }
                        read.push(buf.index());
                        elsewhere.push(buf.index());
                    }
                    Op::Load { buf, index: at } => {
                        read.push(buf.index());
                        if *at != index {
                            elsewhere.push(buf.index());
                        }
                    }
                    Op::LoopIndex => return false,
                    _ => {}
                }
                varying[v.index()] = dep;
            }
            Stmt::Store { buf, index: at, .. } if stores => {
                if stored.contains(&buf.index()) {
                    return false;
                }
                stored.push(buf.index());
                if *at != index {
                    elsewhere.push(buf.index());
                }
            }
            // Running reductions only (checked below).
            Stmt::Assign { .. } if stores => {}
            _ => return false,
        }
    }
    if stores && crate::running::running_reductions(k, body).is_none() {
        return false;
    }
    stored
        .iter()
        .all(|b| !read.contains(b) || !elsewhere.contains(b))
}

/// The form `(first + l) >> shift` of a varying `u32`/`i32` index value.
#[derive(Clone)]
struct Form {
    first: String,
    shift: u32,
}

/// A running reduction (`crate::running`) of a vectorized loop: the `<lanes x float>` alloca of
/// its per-lane running values (maxima), or `None` for a sum, which stays in its variable.
pub(super) struct Carried {
    pub(super) red: Running,
    pub(super) lanes: Option<String>,
}

impl Emitter<'_> {
    /// Lowers `body` for the `lanes` index values `i0 .. i0 + lanes` (`i0`: `i32`), setting the
    /// operand of every value it defines (see the module docs).
    pub(super) fn lanes_body(
        &mut self,
        index: Value,
        i0: &str,
        lanes: u32,
        body: &[Stmt],
        running: &[Carried],
    ) -> Result<()> {
        let mut forms: HashMap<usize, Form> = HashMap::new();
        let it = vec_of("i32", lanes);
        let steps: Vec<String> = (0..lanes).map(|l| format!("i32 {l}")).collect();
        let base = self.splat(i0, "i32", lanes);
        let iv = self.ins(format!("add {it} {base}, <{}>", steps.join(", ")));
        self.set(index, iv, lanes);
        forms.insert(
            index.index(),
            Form {
                first: i0.to_string(),
                shift: 0,
            },
        );
        for stmt in body {
            let v = match stmt {
                Stmt::Let(v) => {
                    if self.running_let(*v, lanes, running)? {
                        continue;
                    }
                    v
                }
                Stmt::Assign { var, value } => {
                    self.running_assign(*var, *value, running)?;
                    continue;
                }
                Stmt::Store {
                    buf,
                    index,
                    value,
                    rounding,
                } => {
                    let first = forms
                        .get(&index.index())
                        .filter(|f| f.shift == 0)
                        .map(|f| f.first.clone());
                    self.store_lanes(*buf, *index, first, *value, *rounding, lanes)?;
                    continue;
                }
                _ => return Err(internal("a vector body holds only lets and stores")),
            };
            let def = self
                .k
                .values
                .try_get(*v)
                .ok_or_else(|| internal("let of a missing value"))?
                .clone();
            let varying = def
                .op
                .operands()
                .iter()
                .any(|o| self.vals[o.index()].as_ref().is_some_and(|x| x.lanes != 1));
            if !varying {
                self.let_scalar(*v)?;
                continue;
            }
            let out = match &def.op {
                Op::Load { buf, index } => match forms.get(&index.index()).cloned() {
                    Some(form) => self.load_form(*buf, &form, *index, lanes)?,
                    None => {
                        let idx = self.get(*index, lanes)?;
                        self.load_gather(*buf, &idx, lanes)?
                    }
                },
                Op::Lookup { table, index } => {
                    let idx = self.get(*index, lanes)?;
                    self.lookup(*table, &idx, lanes)?
                }
                Op::Reduce { .. }
                | Op::WorkItem
                | Op::LoopIndex
                | Op::Param(_)
                | Op::Const(_)
                | Op::ReadVar(_) => return Err(internal("not a varying op")),
                op => self.pure(op, def.ty, lanes)?,
            };
            if let Some(form) = self.form_of(&def.op, &forms) {
                forms.insert(v.index(), form);
            }
            self.set(*v, out, lanes);
        }
        Ok(())
    }

    /// Lowers the `let` of `v` when it is a running reduction's read (a maximum's lane vector,
    /// a sum's scalar variable) or a sum's update (the lanes added to the variable in lane
    /// order, as the scalar loop adds them); false for any other value.
    fn running_let(&mut self, v: Value, lanes: u32, running: &[Carried]) -> Result<bool> {
        for c in running {
            if c.red.read == v {
                let out = match &c.lanes {
                    Some(acc) => {
                        let vt = vec_of("float", lanes);
                        (self.ins(format!("load {vt}, {vt}* {acc}")), lanes)
                    }
                    None => (self.op(&Op::ReadVar(c.red.var), ScalarType::F32)?, 1),
                };
                self.set(v, out.0, out.1);
                return Ok(true);
            }
            if c.red.update == v && matches!(c.red.rule, Rule::Sum) {
                let x = self.get(c.red.addend, lanes)?;
                let mut acc = self.val(c.red.read)?;
                for l in 0..lanes {
                    let xl = self.ins(format!(
                        "extractelement {} {x}, i32 {l}",
                        vec_of("float", lanes)
                    ));
                    acc = self.ins(format!("fadd float {acc}, {xl}"));
                }
                self.set(v, acc, 1);
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// `Stmt::Assign` in a vector iteration: a running reduction's update (a maximum's lane
    /// vector, a sum's total).
    fn running_assign(&mut self, var: VarId, value: Value, running: &[Carried]) -> Result<()> {
        let c = running
            .iter()
            .find(|c| c.red.var == var)
            .ok_or_else(|| internal("assignment in a vectorized loop"))?;
        let o = self.opnd(value)?;
        match &c.lanes {
            Some(acc) => {
                let vt = vec_of("float", o.lanes);
                self.line(format!("store {vt} {}, {vt}* {acc}", o.text));
            }
            None => self.assign_var(var, &o.text)?,
        }
        Ok(())
    }

    /// The index form of a varying integer op whose operands' forms are in `forms`.
    fn form_of(&mut self, op: &Op, forms: &HashMap<usize, Form>) -> Option<Form> {
        let Op::Binary(b, x, y) = op else {
            return None;
        };
        if self.k.values[*x].ty == ScalarType::F32 {
            return None;
        }
        let uniform = |e: &Self, w: &Value| {
            e.vals[w.index()]
                .as_ref()
                .and_then(|o| (o.lanes == 1).then(|| o.text.clone()))
        };
        let constant = |e: &Self, w: &Value| match e.k.values.try_get(*w).map(|d| &d.op) {
            Some(Op::Const(c)) => Some(c.bits()),
            _ => None,
        };
        let stride1 = |w: &Value| forms.get(&w.index()).filter(|f| f.shift == 0).cloned();
        let (first, u, name) = match b {
            BinaryOp::Add => match (stride1(x), stride1(y)) {
                (Some(f), None) => (f.first, uniform(self, y)?, "add"),
                (None, Some(f)) => (f.first, uniform(self, x)?, "add"),
                _ => return None,
            },
            BinaryOp::Sub => (stride1(x)?.first, uniform(self, y)?, "sub"),
            // Only for `u32`: a logical shift of the run.
            BinaryOp::Shr if self.k.values[*x].ty == ScalarType::U32 => {
                let f = forms.get(&x.index())?.clone();
                let c = constant(self, y)? & 31;
                let shift = f.shift + c;
                return (shift < 32).then_some(Form {
                    first: f.first,
                    shift,
                });
            }
            _ => return None,
        };
        let first = self.ins(format!("{name} i32 {first}, {u}"));
        Some(Form { first, shift: 0 })
    }

    /// `buf[(first + l) >> shift]` for every lane, widened (see the module docs).
    fn load_form(
        &mut self,
        buf: qforge_ir::ParamId,
        form: &Form,
        index: Value,
        lanes: u32,
    ) -> Result<String> {
        let (base, count, dtype, _) = self.buffer(buf)?;
        let s = form.shift;
        let first = &form.first;
        let block = 1u64 << s;
        let mask = (block - 1) as u32;
        let (fast_l, slow_l, join) = (
            self.label("run"),
            self.label("gather"),
            self.label("loaded"),
        );
        let vt = ty(dtype.value_type(), lanes);
        let fast;
        if block >= u64::from(lanes) {
            // All lanes name element `first >> s` when `(first & mask) + lanes - 1 <= mask`.
            let low = self.ins(format!("and i32 {first}, {mask}"));
            let top = self.ins(format!("add i32 {low}, {}", lanes - 1));
            let same = self.ins(format!("icmp ule i32 {top}, {mask}"));
            self.cond_br(&same, &fast_l, &slow_l);
            self.start(&fast_l);
            let at = self.ins(format!("lshr i32 {first}, {s}"));
            let one = self.load(buf, &at)?;
            let elem = super::emit::scalar_ty(dtype.value_type());
            fast = self.splat(&one, elem, lanes);
        } else {
            // `lanes >> s` elements from `first >> s`, each repeated `2^s` times, when `first`
            // is a multiple of `2^s` and the run lies in the buffer.
            let n = lanes >> s;
            let low = self.ins(format!("and i32 {first}, {mask}"));
            let aligned = self.ins(format!("icmp eq i32 {low}, 0"));
            let at = self.ins(format!("lshr i32 {first}, {s}"));
            let at64 = self.ins(format!("zext i32 {at} to i64"));
            let end = self.ins(format!("add i64 {at64}, {n}"));
            let mut ok = aligned;
            if s == 0 {
                let nowrap = self.ins(format!("icmp ule i64 {end}, 4294967296"));
                ok = self.ins(format!("and i1 {ok}, {nowrap}"));
            }
            if let Some(c) = &count {
                let inside = self.ins(format!("icmp ule i64 {end}, {c}"));
                ok = self.ins(format!("and i1 {ok}, {inside}"));
            }
            self.cond_br(&ok, &fast_l, &slow_l);
            self.start(&fast_l);
            let rt = vec_of(elem_ty(dtype), n);
            let p = self.element_ptr(&base, &at64, dtype, &rt);
            let mut raw = self.ins(format!("load {rt}, {rt}* {p}, align 1"));
            if s > 0 {
                let ids: Vec<String> = (0..lanes).map(|l| format!("i32 {}", l >> s)).collect();
                raw = self.ins(format!(
                    "shufflevector {rt} {raw}, {rt} undef, <{lanes} x i32> <{}>",
                    ids.join(", ")
                ));
            }
            fast = self.widen(dtype, &raw, lanes);
        }
        let fast_end = self.current.clone();
        self.br(&join);
        self.start(&slow_l);
        let idx = self.get(index, lanes)?;
        let slow = self.load_gather(buf, &idx, lanes)?;
        let slow_end = self.current.clone();
        self.br(&join);
        self.start(&join);
        Ok(self.ins(format!(
            "phi {vt} [ {fast}, %{fast_end} ], [ {slow}, %{slow_end} ]"
        )))
    }

    /// Stores `lanes` values at `index` (lane order): one vector store when the index is
    /// `first + l` and the run lies in the buffer (and does not wrap), else lane by lane with
    /// the scalar store and its bounds check. A uniform store at a uniform index runs once (the
    /// scalar iterations would store the same value at the same place).
    fn store_lanes(
        &mut self,
        buf: qforge_ir::ParamId,
        index: Value,
        first: Option<String>,
        value: Value,
        rounding: Option<qforge_ir::Rounding>,
        lanes: u32,
    ) -> Result<()> {
        let uniform = |e: &Self, w: Value| e.vals[w.index()].as_ref().is_some_and(|o| o.lanes == 1);
        if uniform(self, index) && uniform(self, value) {
            let (i, v) = (self.val(index)?, self.val(value)?);
            return self.store(buf, &i, &v, rounding);
        }
        let (base, count, dtype, _) = self.buffer(buf)?;
        let vt = self.k.values[value].ty;
        let vals = self.get(value, lanes)?;
        let (fast_l, slow_l, join) = (
            self.label("put"),
            self.label("scatter"),
            self.label("stored"),
        );
        if let Some(first) = first {
            let f64x = self.ins(format!("zext i32 {first} to i64"));
            let end = self.ins(format!("add i64 {f64x}, {lanes}"));
            let mut ok = self.ins(format!("icmp ule i64 {end}, 4294967296"));
            if let Some(c) = &count {
                let inside = self.ins(format!("icmp ule i64 {end}, {c}"));
                ok = self.ins(format!("and i1 {ok}, {inside}"));
            }
            self.cond_br(&ok, &fast_l, &slow_l);
            self.start(&fast_l);
            let bits = self.narrow(dtype, rounding, &vals, lanes)?;
            let rt = vec_of(elem_ty(dtype), lanes);
            let p = self.element_ptr(&base, &f64x, dtype, &rt);
            self.line(format!("store {rt} {bits}, {rt}* {p}, align 1"));
            self.br(&join);
            self.start(&slow_l);
        }
        let idx = self.get(index, lanes)?;
        let (it, t) = (vec_of("i32", lanes), ty(vt, lanes));
        for l in 0..lanes {
            let i = self.ins(format!("extractelement {it} {idx}, i32 {l}"));
            let v = self.ins(format!("extractelement {t} {vals}, i32 {l}"));
            self.store(buf, &i, &v, rounding)?;
        }
        self.br(&join);
        self.start(&join);
        Ok(())
    }

    /// `buf[idx[l]]` for every lane, widened; with bounds checks the lanes past the buffer read
    /// nothing, yield 0 and report the work item.
    fn load_gather(&mut self, buf: qforge_ir::ParamId, idx: &str, lanes: u32) -> Result<String> {
        let (base, count, dtype, _) = self.buffer(buf)?;
        let et = elem_ty(dtype);
        let typed = self.ins(format!("bitcast i8* {base} to {et}*"));
        let raw = match count {
            Some(c) => {
                let (it, lt) = (vec_of("i32", lanes), vec_of("i64", lanes));
                let wide = self.ins(format!("zext {it} {idx} to {lt}"));
                let cv = self.splat(&c, "i64", lanes);
                let inside = self.ins(format!("icmp ult {lt} {wide}, {cv}"));
                let bits = self.ins(format!(
                    "bitcast {} {inside} to i{lanes}",
                    vec_of("i1", lanes)
                ));
                let oob = self.ins(format!("icmp ne i{lanes} {bits}, -1"));
                self.guarded(&oob, None, "", |_| None)?;
                self.gather(et, &typed, idx, lanes, Some(&inside))
            }
            None => self.gather(et, &typed, idx, lanes, None),
        };
        Ok(self.widen(dtype, &raw, lanes))
    }
}
