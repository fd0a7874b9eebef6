//! Vector lowering of a straight-line body for `lanes` consecutive values of a loop index
//! (a "group"): lane `l` computes what the scalar body computes for index `i0 + l`.
//!
//! Values that do not depend on the index are lowered once per group as scalars (uniform; a
//! vector op splats them). Index-dependent values are vectors of `lanes` lanes, computed by the
//! same lane-wise instructions as the scalar code (so every lane has the scalar bits), except for
//! memory, where the lowering uses what it knows of the index:
//! - Index forms are tracked through the body: `(f + l) >> s` for lane `l`, with `f` a scalar
//!   (the index itself is `s = 0`, `f = i0`; adding or subtracting a uniform keeps `s = 0`; a
//!   right shift by a constant adds to `s`).
//! - Each group first evaluates its uniform values and, for every access at such an index, the
//!   condition of its fast form; when all hold, the group runs the fast body, otherwise the
//!   checked body (both end in the same continuation, e.g. the `fma`s of an `accumulate`):
//!   - fast: a load at `(f + l) >> s` is one contiguous vector load of `lanes >> s` elements,
//!     each repeated `2^s` times (`f` a multiple of `2^s`, the run inside the buffer and not
//!     wrapping around 2^32), or, when `2^s >= lanes` and every lane names the same element,
//!     one scalar load, which later ops treat as uniform; a store at `f + l` is one vector
//!     store (the run inside the buffer);
//!   - checked: every varying load is a masked gather whose out-of-range lanes read nothing,
//!     yield 0 and report the work item, and every varying store runs lane by lane (in lane
//!     order) with the scalar store and its check, exactly as the scalar iterations would.
//!
//!   Loads and stores at indices without a form use those checked forms in both bodies.
//! - A loop of groups ([`Emitter::group_loop`]) first checks the conditions for all its groups
//!   at once (ranges at the last group, alignment and no wrap-around at the first, since the
//!   index grows by `lanes` per group); when they hold, every group runs the fast body with no
//!   check, otherwise each group decides as above.
//! - A varying table lookup clamps the index lanes; on AVX-512 (a multiple of 16 lanes) a table
//!   of at most 16 entries is deferred (`deferred.rs`: later ops with uniform operands apply to
//!   the table, and the lanes are permuted when needed), and one of up to
//!   [`super::PERMUTE_TABLE`] entries is selected by permutes, 16 lanes at a time;
//!   otherwise a table of at most 16 entries is a vector constant indexed lane by lane (a
//!   variable permute, e.g. `vpermps`) and a larger one is gathered from memory (`memory.rs`).
//!   In the fast body, the lookup of a packed 4-bit code may be fused with its byte's load
//!   (`nibble.rs`).

use std::collections::HashMap;

use qforge_ir::{BinaryOp, Op, ScalarType, Stmt, Value, VarId};

use crate::running::{Rule, Running};

use super::emit::{internal, ty, vec_of, Emitter};
use super::memory::elem_ty;
use crate::error::Result;

/// The longest chain of table lookups in the `let`s of `body` whose indices depend on each
/// other (a lookup counts 1 plus the longest chain among its operands' definitions), and the
/// number of lookups in tables of more than 16 entries.
pub(super) fn lookup_chain(k: &qforge_ir::Kernel, body: &[Stmt]) -> (u32, u32) {
    let mut depth: HashMap<usize, u32> = HashMap::new();
    let mut longest = 0;
    let mut large = 0;
    for stmt in body {
        if let Stmt::Let(v) = stmt {
            let Some(def) = k.values.try_get(*v) else {
                continue;
            };
            let below = def
                .op
                .operands()
                .iter()
                .filter_map(|o| depth.get(&o.index()))
                .max()
                .copied()
                .unwrap_or(0);
            let mut d = below;
            if let Op::Lookup { table, .. } = def.op {
                d += 1;
                large += u32::from(k.tables.try_get(table).is_some_and(|t| t.data.len() > 16));
            }
            longest = longest.max(d);
            depth.insert(v.index(), d);
        }
    }
    (longest, large)
}

/// The loads of `body` that depend on `seed` (a loop index, or a value treated as one), each
/// with the shift `s` of its index when the index has the form `(seed + u) >> s` (`u`
/// independent of `seed`), else `None` (a gather). A static version of the forms the vector
/// body tracks.
fn seeded_loads(k: &qforge_ir::Kernel, seed: Value, body: &[Stmt]) -> Vec<Option<u32>> {
    let mut varying = std::collections::HashSet::from([seed.index()]);
    let mut shift: HashMap<usize, u32> = HashMap::from([(seed.index(), 0)]);
    let mut loads = Vec::new();
    for stmt in body {
        let Stmt::Let(v) = stmt else { continue };
        let Some(def) = k.values.try_get(*v) else {
            continue;
        };
        let ops = def.op.operands();
        if !ops.iter().any(|o| varying.contains(&o.index())) {
            continue;
        }
        varying.insert(v.index());
        let run = |x: &Value| shift.get(&x.index()) == Some(&0);
        let uniform = |x: &Value| !varying.contains(&x.index());
        let s = match &def.op {
            Op::Binary(BinaryOp::Add, x, y) if def.ty != ScalarType::F32 => {
                ((run(x) && uniform(y)) || (run(y) && uniform(x))).then_some(0)
            }
            Op::Binary(BinaryOp::Sub, x, y) if def.ty != ScalarType::F32 => {
                (run(x) && uniform(y)).then_some(0)
            }
            Op::Binary(BinaryOp::Shr, x, y) if def.ty == ScalarType::U32 => {
                match k.values.try_get(*y).map(|d| &d.op) {
                    Some(Op::Const(c)) => shift.get(&x.index()).map(|s| s + (c.bits() & 31)),
                    _ => None,
                }
            }
            Op::Load { index: at, .. } => {
                loads.push(shift.get(&at.index()).copied().filter(|s| *s < 32));
                None
            }
            _ => None,
        };
        if let Some(s) = s {
            shift.insert(v.index(), s);
        }
    }
    loads
}

/// Whether `body` loads an element that is the same for `lanes` consecutive index values
/// (an aligned group): a load at an index of the form `(i + u) >> s` with `2^s >= lanes`,
/// such as the absmax of a 4-bit block of `2^s` elements.
pub(super) fn loads_per_block(
    k: &qforge_ir::Kernel,
    index: Value,
    body: &[Stmt],
    lanes: u32,
) -> bool {
    seeded_loads(k, index, body)
        .into_iter()
        .flatten()
        .any(|s| (1u64 << s) >= u64::from(lanes))
}

/// Whether every load of `body` that depends on `seed` has an index of the form
/// `(seed + u) >> s` (a run, a repeated run or a block element: no gather), and there is one.
pub(super) fn loads_are_runs(k: &qforge_ir::Kernel, seed: Value, body: &[Stmt]) -> bool {
    let loads = seeded_loads(k, seed, body);
    !loads.is_empty() && loads.iter().all(Option::is_some)
}

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
pub(super) struct Form {
    pub(super) first: String,
    pub(super) shift: u32,
}

/// A running reduction (`crate::running`) of a vectorized loop: the `<lanes x float>` alloca of
/// its per-lane running values (maxima), or `None` for a sum, which stays in its variable.
pub(super) struct Carried {
    pub(super) red: Running,
    pub(super) lanes: Option<String>,
}

impl Carried {
    /// The LLVM element type of a reduction's lane vector.
    pub(super) fn elem(rule: Rule) -> &'static str {
        match rule {
            Rule::IntSum => "i32",
            Rule::MaxSkipNan | Rule::MaxPropagateNan | Rule::Sum => "float",
        }
    }
}

/// What the first pass over a group's body found.
struct Plan {
    /// The varying values (and running reads), by arena index.
    varying: std::collections::HashSet<usize>,
    forms: HashMap<usize, Form>,
    /// The conjunction of the fast forms' conditions (`None`: no condition, always fast).
    fast: Option<String>,
}

/// Which conditions the first pass emits (see [`Emitter::group_loop`]).
#[derive(Clone, PartialEq, Eq)]
enum Check {
    /// Every fast form's condition for this group.
    Group,
    /// None (the loop-level check holds).
    Nothing,
    /// For the first group of a loop: the alignment that every later group keeps, and that
    /// the index does not wrap around 2^32 over the loop's span (`i32` operand).
    LoopFirst(String),
    /// For the last group of a loop: the ranges (which grow with the group).
    LoopLast,
}

/// How a group's body lowers its accesses at a form (see the module docs).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Fast,
    Checked,
}

impl Emitter<'_> {
    /// Lowers one group of `body` for the `lanes` index values `i0 .. i0 + lanes` (`i0`:
    /// `i32`), then `tail` (which reads the body's values): the plan, then the fast body or the
    /// checked body (see the module docs).
    pub(super) fn lanes_group(
        &mut self,
        index: Value,
        i0: &str,
        lanes: u32,
        body: &[Stmt],
        running: &[Carried],
        tail: &mut dyn FnMut(&mut Self) -> Result<()>,
    ) -> Result<()> {
        let plan = self.lanes_plan(index, i0, lanes, body, running, Check::Group)?;
        let Some(fast) = plan.fast.clone() else {
            self.lanes_body(index, i0, lanes, body, running, &plan, Mode::Fast)?;
            return tail(self);
        };
        let (fast_l, checked_l, join) = (
            self.label("fast"),
            self.label("checked"),
            self.label("group"),
        );
        self.cond_br(&fast, &fast_l, &checked_l);
        self.start(&fast_l);
        self.lanes_body(index, i0, lanes, body, running, &plan, Mode::Fast)?;
        tail(self)?;
        self.br(&join);
        self.start(&checked_l);
        self.lanes_body(index, i0, lanes, body, running, &plan, Mode::Checked)?;
        tail(self)?;
        self.br(&join);
        self.start(&join);
        Ok(())
    }

    /// One group in a loop that leaves for a checked loop on the first group whose fast forms
    /// do not all hold: lowers the uniform `let`s and the conditions, branches to `exit` when
    /// one fails (before the group has any effect but bounds reports, which are idempotent),
    /// else runs the fast body and `tail` and continues in the current block.
    /// With `exit = None` the fast forms are known to hold (proven before the loop): no
    /// conditions, no branch.
    pub(super) fn lanes_fast_or_exit(
        &mut self,
        index: Value,
        i0: &str,
        lanes: u32,
        body: &[Stmt],
        tail: &mut dyn FnMut(&mut Self) -> Result<()>,
        exit: Option<&str>,
    ) -> Result<()> {
        let check = if exit.is_some() {
            Check::Group
        } else {
            Check::Nothing
        };
        let plan = self.lanes_plan(index, i0, lanes, body, &[], check)?;
        if let (Some(fast), Some(exit)) = (&plan.fast, exit) {
            let fast_l = self.label("fast");
            self.cold_exits = true;
            self.line(format!(
                "br i1 {fast}, label %{fast_l}, label %{exit}, !prof !1"
            ));
            self.start(&fast_l);
        }
        self.lanes_body(index, i0, lanes, body, &[], &plan, Mode::Fast)?;
        tail(self)
    }

    /// The first pass: lowers the uniform `let`s, finds the varying values and the index forms,
    /// and emits the fast forms' conditions.
    fn lanes_plan(
        &mut self,
        index: Value,
        i0: &str,
        lanes: u32,
        body: &[Stmt],
        running: &[Carried],
        check: Check,
    ) -> Result<Plan> {
        let mut plan = Plan {
            varying: std::collections::HashSet::from([index.index()]),
            forms: HashMap::from([(
                index.index(),
                Form {
                    first: i0.to_string(),
                    shift: 0,
                },
            )]),
            fast: None,
        };
        let mut conds = Vec::new();
        for stmt in body {
            match stmt {
                Stmt::Let(v) => {
                    let def = self
                        .k
                        .values
                        .try_get(*v)
                        .ok_or_else(|| internal("let of a missing value"))?
                        .clone();
                    let is_read = running.iter().any(|c| c.red.read == *v)
                        || matches!(def.op, Op::ReadVar(var) if self.lane_vars.contains_key(&var.index()));
                    let dep = def
                        .op
                        .operands()
                        .iter()
                        .any(|o| plan.varying.contains(&o.index()));
                    if !dep && !is_read {
                        self.let_scalar(*v)?;
                        continue;
                    }
                    plan.varying.insert(v.index());
                    if let Some(form) = self.form_of(&def.op, &plan) {
                        plan.forms.insert(v.index(), form);
                    }
                    if let Op::Load { buf, index } = &def.op {
                        if let Some(form) = plan.forms.get(&index.index()).cloned() {
                            if let Some(c) = self.load_condition(*buf, &form, lanes, &check)? {
                                conds.push(c);
                            }
                        }
                    }
                }
                Stmt::Store { buf, index, .. } => {
                    if let Some(form) = plan.forms.get(&index.index()).filter(|f| f.shift == 0) {
                        let first = form.first.clone();
                        match &check {
                            Check::Group | Check::LoopLast => {
                                conds.push(self.run_condition(*buf, &first, lanes)?)
                            }
                            Check::LoopFirst(span) => conds.push(self.no_wrap(&first, span)),
                            Check::Nothing => {}
                        }
                    }
                }
                Stmt::Assign { .. } => {}
                _ => {
                    return Err(internal(
                        "a vector body holds only lets, stores and reductions",
                    ))
                }
            }
        }
        let mut all: Option<String> = None;
        for c in conds {
            all = Some(match all {
                None => c,
                Some(a) => self.ins(format!("and i1 {a}, {c}")),
            });
        }
        plan.fast = all;
        Ok(plan)
    }

    /// Whether `buf[first .. first + n]` lies in the buffer and does not wrap around 2^32.
    fn run_condition(&mut self, buf: qforge_ir::ParamId, first: &str, n: u32) -> Result<String> {
        let (_, count, _, _) = self.buffer(buf)?;
        let f64x = self.ins(format!("zext i32 {first} to i64"));
        let end = self.ins(format!("add i64 {f64x}, {n}"));
        let mut ok = self.ins(format!("icmp ule i64 {end}, 4294967296"));
        if let Some(c) = count {
            let inside = self.ins(format!("icmp ule i64 {end}, {c}"));
            ok = self.ins(format!("and i1 {ok}, {inside}"));
        }
        Ok(ok)
    }

    /// The condition of the fast form of a load at `form` (see the module docs) that `check`
    /// asks for. Across the groups of a loop `first` grows by `lanes` per group, so the ranges
    /// only need checking at the last group and the alignment at the first: a repeated run
    /// stays aligned to `2^s` (which divides `lanes`), and a group aligned to `lanes` never
    /// straddles a block of `2^s >= lanes` elements.
    fn load_condition(
        &mut self,
        buf: qforge_ir::ParamId,
        form: &Form,
        lanes: u32,
        check: &Check,
    ) -> Result<Option<String>> {
        let (s, first) = (form.shift, form.first.as_str());
        let mask = ((1u64 << s) - 1) as u32;
        let uniform = (1u64 << s) >= u64::from(lanes);
        let at = self.ins(format!("lshr i32 {first}, {s}"));
        let range = |e: &mut Self| e.run_condition(buf, &at, if uniform { 1 } else { lanes >> s });
        Ok(Some(match check {
            Check::Nothing => return Ok(None),
            Check::LoopLast => range(self)?,
            Check::LoopFirst(span) => {
                let align = if uniform { lanes - 1 } else { mask };
                let low = self.ins(format!("and i32 {first}, {align}"));
                let aligned = self.ins(format!("icmp eq i32 {low}, 0"));
                let no_wrap = self.no_wrap(first, span);
                self.ins(format!("and i1 {aligned}, {no_wrap}"))
            }
            Check::Group => {
                let low = self.ins(format!("and i32 {first}, {mask}"));
                let aligned = if uniform {
                    // Every lane names element `first >> s`.
                    let top = self.ins(format!("add i32 {low}, {}", lanes - 1));
                    self.ins(format!("icmp ule i32 {top}, {mask}"))
                } else {
                    // Aligned, and the unshifted run `first .. first + lanes` must not wrap
                    // around 2^32 either (a wrapped lane shifts to a small element).
                    let aligned = self.ins(format!("icmp eq i32 {low}, 0"));
                    let no_wrap = self.no_wrap(first, &lanes.to_string());
                    self.ins(format!("and i1 {aligned}, {no_wrap}"))
                };
                let inside = range(self)?;
                self.ins(format!("and i1 {aligned}, {inside}"))
            }
        }))
    }

    /// Whether `first + span` (`i32` operands, unsigned) stays at or below 2^32.
    fn no_wrap(&mut self, first: &str, span: &str) -> String {
        let f = self.ins(format!("zext i32 {first} to i64"));
        let n = self.ins(format!("zext i32 {span} to i64"));
        let end = self.ins(format!("add i64 {f}, {n}"));
        self.ins(format!("icmp ule i64 {end}, 4294967296"))
    }

    /// The loop over the groups `start .. end` (`end - start` a multiple of `lanes`), each
    /// followed by `tail` (given the group's lanes). When the fast forms hold for every group
    /// (checked once: the alignment at the first group, the ranges at the last, see
    /// [`Emitter::load_condition`]), every group runs the fast body with no per-group check;
    /// otherwise each group of `fallback` lanes (a divisor of `lanes`; e.g. 16 where a
    /// 64-lane group would straddle a 64-element block) chooses (see
    /// [`Emitter::lanes_group`]). The groups cover the same elements in the same order either
    /// way.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn group_loop(
        &mut self,
        index: Value,
        start: &str,
        end: &str,
        (lanes, fallback): (u32, u32),
        body: &[Stmt],
        running: &[Carried],
        tail: &mut dyn FnMut(&mut Self, u32) -> Result<()>,
    ) -> Result<()> {
        let (check_l, fast_l, slow_l, done) = (
            self.label("proof"),
            self.label("fastloop"),
            self.label("slowloop"),
            self.label("groups"),
        );
        let some = self.ins(format!("icmp ult i32 {start}, {end}"));
        self.cond_br(&some, &check_l, &done);
        self.start(&check_l);
        let span = self.ins(format!("sub i32 {end}, {start}"));
        let first = self.lanes_plan(index, start, lanes, body, running, Check::LoopFirst(span))?;
        let last_i0 = self.ins(format!("sub i32 {end}, {lanes}"));
        let last = self.lanes_plan(index, &last_i0, lanes, body, running, Check::LoopLast)?;
        let ok = match (first.fast, last.fast) {
            (Some(a), Some(b)) => self.ins(format!("and i1 {a}, {b}")),
            (Some(a), None) | (None, Some(a)) => a,
            (None, None) => "true".to_string(),
        };
        self.cond_br(&ok, &fast_l, &slow_l);
        self.start(&fast_l);
        self.counted_loop("i32", start, end, lanes, |e, i0| {
            let plan = e.lanes_plan(index, i0, lanes, body, running, Check::Nothing)?;
            e.lanes_body(index, i0, lanes, body, running, &plan, Mode::Fast)?;
            tail(e, lanes)
        })?;
        self.br(&done);
        self.start(&slow_l);
        self.counted_loop("i32", start, end, fallback, |e, i0| {
            e.lanes_group(index, i0, fallback, body, running, &mut |e| {
                tail(e, fallback)
            })
        })?;
        self.br(&done);
        self.start(&done);
        Ok(())
    }

    /// The second pass: lowers the varying values and the stores of one group in `mode`.
    #[allow(clippy::too_many_arguments)]
    fn lanes_body(
        &mut self,
        index: Value,
        i0: &str,
        lanes: u32,
        body: &[Stmt],
        running: &[Carried],
        plan: &Plan,
        mode: Mode,
    ) -> Result<()> {
        let it = vec_of("i32", lanes);
        let steps: Vec<String> = (0..lanes).map(|l| format!("i32 {l}")).collect();
        let base = self.splat(i0, "i32", lanes);
        let iv = self.ins(format!("add {it} {base}, <{}>", steps.join(", ")));
        self.set(index, iv, lanes);
        // Restored at the end (an error ends the whole lowering).
        let outer_seed = self.lanes_seed.replace(index);
        for stmt in body {
            let v = match stmt {
                Stmt::Let(v) => {
                    if !plan.varying.contains(&v.index())
                        || self.lane_var_let(*v, lanes)?
                        || self.running_let(*v, lanes, running)?
                    {
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
                    let run = plan
                        .forms
                        .get(&index.index())
                        .filter(|f| f.shift == 0 && mode == Mode::Fast)
                        .map(|f| f.first.clone());
                    self.store_lanes(*buf, *index, run, *value, *rounding, lanes)?;
                    continue;
                }
                _ => {
                    return Err(internal(
                        "a vector body holds only lets, stores and reductions",
                    ))
                }
            };
            let def = self
                .k
                .values
                .try_get(*v)
                .ok_or_else(|| internal("let of a missing value"))?
                .clone();
            let out = match &def.op {
                Op::Load { buf, index } => match plan.forms.get(&index.index()) {
                    Some(form) if mode == Mode::Fast => {
                        let (out, n) = self.load_fast(*buf, form, lanes)?;
                        self.set(*v, out, n);
                        continue;
                    }
                    _ => {
                        let idx = self.get(*index, lanes)?;
                        self.load_gather(*buf, &idx, lanes)?
                    }
                },
                Op::Lookup { table, index } => {
                    let forms = (mode == Mode::Fast).then_some(&plan.forms);
                    if self.defer_lookup(*v, *table, *index, forms, lanes)? {
                        continue;
                    }
                    let idx = self.get(*index, lanes)?;
                    self.lookup(*table, &idx, *index, lanes)?
                }
                Op::Reduce { .. }
                | Op::WorkItem
                | Op::LoopIndex
                | Op::Param(_)
                | Op::Const(_)
                | Op::ReadVar(_) => return Err(internal("not a varying op")),
                op => {
                    if self.defer_pure(*v, op, def.ty)? {
                        continue;
                    }
                    self.pure(op, def.ty, lanes)?
                }
            };
            self.set(*v, out, lanes);
        }
        self.lanes_seed = outer_seed;
        Ok(())
    }

    /// Lowers the `let` of `v` when it reads a variable of [`Emitter::lane_vars`]: its lanes
    /// from the slot.
    fn lane_var_let(&mut self, v: Value, lanes: u32) -> Result<bool> {
        let Some(Op::ReadVar(var)) = self.k.values.try_get(v).map(|d| &d.op) else {
            return Ok(false);
        };
        let Some(slot) = self.lane_vars.get(&var.index()).cloned() else {
            return Ok(false);
        };
        let vt = vec_of("float", lanes);
        let out = self.ins(format!("load {vt}, {vt}* {slot}"));
        self.set(v, out, lanes);
        Ok(true)
    }

    /// Lowers the `let` of `v` when it is a running reduction's read (a maximum's lane vector,
    /// a sum's scalar variable) or a sum's update (the lanes added to the variable in lane
    /// order, as the scalar loop adds them); false for any other value.
    fn running_let(&mut self, v: Value, lanes: u32, running: &[Carried]) -> Result<bool> {
        for c in running {
            if c.red.read == v {
                let out = match &c.lanes {
                    Some(acc) => {
                        let vt = vec_of(Carried::elem(c.red.rule), lanes);
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
        self.materialize(value)?;
        let o = self.opnd(value)?;
        match &c.lanes {
            Some(acc) => {
                let vt = vec_of(Carried::elem(c.red.rule), o.lanes);
                self.line(format!("store {vt} {}, {vt}* {acc}", o.text));
            }
            None => self.assign_var(var, &o.text)?,
        }
        Ok(())
    }

    /// The index form of a varying integer op whose operands' forms are in `forms`.
    fn form_of(&mut self, op: &Op, plan: &Plan) -> Option<Form> {
        let forms = &plan.forms;
        let Op::Binary(b, x, y) = op else {
            return None;
        };
        if self.k.values[*x].ty == ScalarType::F32 {
            return None;
        }
        let uniform = |e: &Self, w: &Value| {
            if plan.varying.contains(&w.index()) {
                return None;
            }
            e.vals[w.index()].as_ref().map(|o| o.text.clone())
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

    /// `buf[(first + l) >> shift]` for every lane, widened, in the fast form whose condition
    /// holds (no bounds check: the condition covers it), and its lanes: 1 when every lane
    /// names the same element (a uniform operand, splatted where a vector is needed).
    fn load_fast(
        &mut self,
        buf: qforge_ir::ParamId,
        form: &Form,
        lanes: u32,
    ) -> Result<(String, u32)> {
        let (base, _, dtype, _) = self.buffer(buf)?;
        let s = form.shift;
        let at = self.ins(format!("lshr i32 {}, {s}", form.first));
        let at64 = self.ins(format!("zext i32 {at} to i64"));
        if (1u64 << s) >= u64::from(lanes) {
            let et = elem_ty(dtype);
            let p = self.element_ptr(&base, &at64, dtype, et);
            let raw = self.ins(format!("load {et}, {et}* {p}, align 1"));
            return Ok((self.widen(dtype, &raw, 1), 1));
        }
        let n = lanes >> s;
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
        Ok((self.widen(dtype, &raw, lanes), lanes))
    }

    /// Stores `lanes` values at `index`: with `run = Some(first)` (the fast body, whose
    /// condition says `first .. first + lanes` lies in the buffer) one vector store, otherwise
    /// lane by lane in lane order with the scalar store and its bounds check. A uniform value
    /// at a uniform index is stored once (the scalar iterations would store it at the same place).
    fn store_lanes(
        &mut self,
        buf: qforge_ir::ParamId,
        index: Value,
        run: Option<String>,
        value: Value,
        rounding: Option<qforge_ir::Rounding>,
        lanes: u32,
    ) -> Result<()> {
        let uniform = |e: &Self, w: Value| e.vals[w.index()].as_ref().is_some_and(|o| o.lanes == 1);
        if uniform(self, index) && uniform(self, value) {
            let (i, v) = (self.val(index)?, self.val(value)?);
            return self.store(buf, &i, &v, rounding);
        }
        let (base, _, dtype, _) = self.buffer(buf)?;
        let vt = self.k.values[value].ty;
        let vals = self.get(value, lanes)?;
        if let Some(first) = run {
            let f64x = self.ins(format!("zext i32 {first} to i64"));
            let bits = self.narrow(dtype, rounding, &vals, lanes)?;
            let rt = vec_of(elem_ty(dtype), lanes);
            let p = self.element_ptr(&base, &f64x, dtype, &rt);
            self.line(format!("store {rt} {bits}, {rt}* {p}, align 1"));
            return Ok(());
        }
        let idx = self.get(index, lanes)?;
        let (it, t) = (vec_of("i32", lanes), ty(vt, lanes));
        for l in 0..lanes {
            let i = self.ins(format!("extractelement {it} {idx}, i32 {l}"));
            let v = self.ins(format!("extractelement {t} {vals}, i32 {l}"));
            self.store(buf, &i, &v, rounding)?;
        }
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
