//! From a kernel of the row-chunk class to its tile program: the loop's structure, the windows
//! and each value's shape (`ops.rs` lowers the ops themselves).

use std::collections::{HashMap, HashSet};

use qforge_ir::{
    Access, BinaryOp, CmpOp, DType, Dim, Kernel, NanMode, Op, ParamId, ParamKind, ReduceKind,
    Scalar, ScalarType, Stmt, UnaryOp, Value,
};

use super::ops::{elt_of, pred};
use super::tile::{Bin, Elt, Node, Pred, Shape, TileProgram, VOp, Window, WindowKind, MAX_LANES};
use super::{refuse, Shapes, STEP_ROWS};
use crate::error::{Error, Result};

mod rows;
mod running;

use rows::Alias;

/// The most lanes of the chunk a step takes in a program whose loop reads pairs (`2i` and
/// `2i + 1`). Splitting the `R x 2L` pairs tile views it as `R x L x 2`, whose last dimension
/// libtpu pads to 128 lanes: 64 times the tile, 4 MiB at `L = 256` in `f32`. At 512 lanes the
/// 4-bit quantization ran out of v5e's 16 MiB of scoped VMEM, and at 256 a test kernel with
/// three more tiles live needed 16.2 MiB.
const MAX_PAIRS_READ: u32 = 128;

/// The chunk loop's bounds: `start = C * work_item`, `end = select(start < P, min(start + C,
/// P), start)`; or a row loop `for j in 0..P` over row `w` of `[rows, P]` buffers (elements
/// `start + j`, `start = w * P`, `end` the loop's end, `C` the row length).
struct ChunkLoop {
    chunk: u32,
    limit: ParamId,
    start: Value,
    end: Value,
    /// Whether this is a row loop (or an element-wise kernel's rows).
    row: bool,
    /// An element-wise kernel's row count `R`: its chunk buffers are `[R, P]`.
    element_rows: Option<ParamId>,
}

pub(super) struct Lowering<'k> {
    pub(super) k: &'k Kernel,
    pub(super) shapes: &'k Shapes,
    work_item: Option<Value>,
    loop_index: Option<Value>,
    chunk: Option<ChunkLoop>,
    /// The windows of each parameter, by kind.
    pub(super) windows: HashMap<(usize, WindowKind), usize>,
    /// The current value (a `Row` node) of each variable assigned at the top level.
    vars: HashMap<usize, usize>,
    pub(super) program: TileProgram,
    /// Lowered values: `(value, shape)` to node.
    pub(super) memo: HashMap<(usize, Shape), usize>,
    /// [`Lowering::natural`]'s results.
    pub(super) natural_shapes: HashMap<usize, Shape>,
    /// The current tile of each written window (a load after a store reads it).
    stored: HashMap<usize, usize>,
    /// The stores of the loop body so far at `2i` and `2i + 1` of each pairs buffer.
    pairs: HashMap<usize, [Option<usize>; 2]>,
    /// The load of each pairs window read by the loop at `2i` and `2i + 1` (one per window).
    pairs_loads: HashMap<usize, usize>,
    /// The variables assigned in both branches of an `if` in the current loop's body: each
    /// element's own value, never read before that `if` nor after the loop.
    loop_local: HashSet<usize>,
    /// The current value (a `Chunk` node) of each loop-local variable in this iteration.
    loop_vars: HashMap<usize, usize>,
    /// Whether the chunk loop has been lowered.
    loop_done: bool,
    /// An element-wise kernel's guard, when the kernel is one (see [`Self::find_elements`]).
    element_guard: Option<Value>,
    /// In an element-wise kernel, what its values of the work item stand for.
    aliases: HashMap<usize, Alias>,
    /// While a matmul's part is lowered: what its leaves stand for (`super::matmul`).
    pub(super) matmul: Option<super::matmul::Part>,
}

/// Lowers `k` at `shapes` to its tile program, or refuses it naming the first construct
/// outside the row-chunk class.
pub(super) fn tile_program(k: &Kernel, shapes: &Shapes) -> Result<TileProgram> {
    let rows = shapes
        .grid
        .div_ceil(STEP_ROWS)
        .max(1)
        .checked_mul(STEP_ROWS)
        .ok_or_else(|| {
            refuse(
                k,
                &format!(
                    "a grid of {} work items (its rows rounded up to {STEP_ROWS} pass 2^32)",
                    shapes.grid
                ),
            )
        })?;
    let mut l = Lowering::new(k, shapes, rows);
    l.find_chunk_loop(&k.body);
    if l.chunk.is_none() {
        l.find_elements(&k.body)?;
    }
    l.top(&k.body)?;
    if !l.loop_done {
        return Err(refuse(k, "a kernel without a chunk loop"));
    }
    Ok(by_param(l.program))
}

/// `p` with its windows in parameter order (a whole-chunk window after the chunk one).
pub(super) fn by_param(mut p: TileProgram) -> TileProgram {
    let mut by_param: Vec<usize> = (0..p.windows.len()).collect();
    by_param.sort_by_key(|&w| (p.windows[w].param, p.windows[w].kind));
    let mut new = vec![0; by_param.len()];
    for (i, &w) in by_param.iter().enumerate() {
        new[w] = i;
    }
    p.windows = by_param.iter().map(|&w| p.windows[w].clone()).collect();
    for n in &mut p.nodes {
        match &mut n.op {
            VOp::Load { window }
            | VOp::Gather { window, .. }
            | VOp::Scalar { window }
            | VOp::TableGather { window, .. }
            | VOp::PanelBytes { window }
            | VOp::ColScales { window } => {
                *window = new[*window];
            }
            _ => {}
        }
    }
    for (w, _) in &mut p.stores {
        *w = new[*w];
    }
    p
}

impl<'k> Lowering<'k> {
    /// An empty lowering of `k` at `shapes`, its arrays `rows` rows.
    pub(super) fn new(k: &'k Kernel, shapes: &'k Shapes, rows: u32) -> Self {
        Lowering {
            k,
            shapes,
            work_item: None,
            loop_index: None,
            chunk: None,
            windows: HashMap::new(),
            program: TileProgram {
                name: k.name.clone(),
                rows,
                width: 0,
                max_lanes: MAX_LANES,
                windows: Vec::new(),
                nodes: Vec::new(),
                stores: Vec::new(),
                matmul: None,
            },
            memo: HashMap::new(),
            natural_shapes: HashMap::new(),
            stored: HashMap::new(),
            pairs: HashMap::new(),
            pairs_loads: HashMap::new(),
            loop_local: HashSet::new(),
            loop_vars: HashMap::new(),
            loop_done: false,
            vars: HashMap::new(),
            element_guard: None,
            aliases: HashMap::new(),
            matmul: None,
        }
    }
}

impl Lowering<'_> {
    fn def(&self, v: Value) -> Result<&Op> {
        self.k
            .values
            .try_get(v)
            .map(|d| &d.op)
            .ok_or_else(|| Error::Backend {
                backend: super::BACKEND,
                message: format!("{}: a value without a definition", self.k.name),
            })
    }

    fn ty(&self, v: Value) -> ScalarType {
        self.k.values.try_get(v).map_or(ScalarType::U32, |d| d.ty)
    }

    fn param_name(&self, p: ParamId) -> &str {
        self.k.params.try_get(p).map_or("?", |p| p.name.as_str())
    }

    fn const_u32(&self, v: Value) -> Option<u32> {
        match self.def(v).ok()? {
            Op::Const(Scalar::U32(c)) => Some(*c),
            _ => None,
        }
    }

    fn param_of(&self, v: Value) -> Option<ParamId> {
        match self.def(v).ok()? {
            Op::Param(p) => Some(*p),
            _ => None,
        }
    }

    /// Whether `index` is the work item: the work item itself, times 1 or plus 0 (the
    /// optimizers' `block = w * blocks_per_item + j` with one block per work item).
    fn at_work_item(&self, index: Value) -> bool {
        if let Some(&a) = self.aliases.get(&index.index()) {
            return a == Alias::Row;
        }
        match self.def(index) {
            Ok(Op::WorkItem) => true,
            Ok(Op::Binary(BinaryOp::Mul, a, b)) => {
                (self.const_u32(*b) == Some(1) && self.at_work_item(*a))
                    || (self.const_u32(*a) == Some(1) && self.at_work_item(*b))
            }
            Ok(Op::Binary(BinaryOp::Add, a, b)) => {
                (self.const_u32(*b) == Some(0) && self.at_work_item(*a))
                    || (self.const_u32(*a) == Some(0) && self.at_work_item(*b))
            }
            _ => false,
        }
    }

    /// `start = C * work_item` and `end = select(start < P, min(start + C, P), start)`.
    fn chunk_bounds(&self, start: Value, end: Value) -> Option<ChunkLoop> {
        let chunk = match self.def(start).ok()? {
            Op::Binary(BinaryOp::Mul, a, b) if self.at_work_item(*a) => self.const_u32(*b)?,
            Op::Binary(BinaryOp::Mul, a, b) if self.at_work_item(*b) => self.const_u32(*a)?,
            _ => return None,
        };
        let Op::Select {
            cond,
            if_true,
            if_false,
        } = self.def(end).ok()?
        else {
            return None;
        };
        let Op::Cmp(CmpOp::Lt, s, p) = self.def(*cond).ok()? else {
            return None;
        };
        let limit = self.param_of(*p)?;
        let Op::Binary(BinaryOp::Min, a, b) = self.def(*if_true).ok()? else {
            return None;
        };
        let (sum, lim) = if self.param_of(*b) == Some(limit) {
            (*a, *b)
        } else {
            (*b, *a)
        };
        let sum_ok = match self.def(sum).ok()? {
            Op::Binary(BinaryOp::Add, x, y) => {
                (*x == start && self.const_u32(*y) == Some(chunk))
                    || (*y == start && self.const_u32(*x) == Some(chunk))
            }
            _ => false,
        };
        (*s == start && *if_false == start && sum_ok && self.param_of(lim) == Some(limit))
            .then_some(ChunkLoop {
                chunk,
                limit,
                start,
                end,
                row: false,
                element_rows: None,
            })
    }

    /// Whether `for i in start..end step step` runs over the chunk loop's range (the same `C`
    /// and limit).
    fn over_the_chunk(&self, start: Value, end: Value, step: u32) -> bool {
        step == 1
            && self.chunk.as_ref().is_some_and(|c| match c.row {
                true => self.const_u32(start) == Some(0) && self.param_of(end) == Some(c.limit),
                false => self
                    .chunk_bounds(start, end)
                    .is_some_and(|b| (b.chunk, b.limit) == (c.chunk, c.limit)),
            })
    }

    /// Takes the kernel's first loop as the chunk loop before its statements are lowered (a
    /// reduction over the chunk may come first) if it has the chunk loop's bounds; [`Self::top`]
    /// refuses any other loop where it stands.
    fn find_chunk_loop(&mut self, body: &[Stmt]) {
        let first = first_loop(body);
        let Some((index, start, end, step, body)) = first else {
            return;
        };
        let bounds = self
            .chunk_bounds(start, end)
            .or_else(|| self.row_bounds(index, start, end, body));
        if let Some(bounds) = bounds.filter(|_| step == 1) {
            self.program.width = bounds.chunk;
            self.chunk = Some(bounds);
            self.loop_index = Some(index);
            if self.reads_pairs(body) {
                self.program.max_lanes = MAX_PAIRS_READ;
            }
            // A row's running maximum needs the whole row in one step (a row of 4096 columns
            // is 8 lane blocks of 512 otherwise).
            let row = self.chunk.as_ref().is_some_and(|c| c.row);
            if row && body.iter().any(|s| matches!(s, Stmt::Assign { .. })) {
                self.program.max_lanes = self.program.max_lanes.max(self.program.width);
            }
        }
    }

    fn top(&mut self, body: &[Stmt]) -> Result<()> {
        for stmt in body {
            match stmt {
                Stmt::Let(v) => {
                    if matches!(self.def(*v)?, Op::WorkItem) {
                        self.work_item = Some(*v);
                    }
                    self.eager_load(*v)?;
                    self.eager_read_var(*v)?;
                }
                Stmt::For {
                    index,
                    start,
                    end,
                    step,
                    body,
                } => {
                    // A later loop over the same chunk (the 8-bit optimizers' second pass)
                    // runs on the same tile, after the first.
                    let again = self.loop_done && self.over_the_chunk(*start, *end, *step);
                    if !again && (self.loop_done || self.loop_index != Some(*index)) {
                        return Err(refuse(
                            self.k,
                            if self.loop_done {
                                "a second loop over another range"
                            } else {
                                "a loop other than `for i in C*w..min(C*w + C, n)` over the \
                                 work item's chunk"
                            },
                        ));
                    }
                    self.loop_index = Some(*index);
                    self.loop_body(body)?;
                    self.loop_done = true;
                }
                Stmt::Store {
                    buf,
                    index,
                    value,
                    rounding,
                } => {
                    if !self.at_work_item(*index) || self.natural(*value)? > Shape::Row {
                        return Err(refuse(
                            self.k,
                            &format!(
                                "a store to {} outside the chunk loop at an index other than \
                                 the work item, or of a value of the chunk",
                                self.param_name(*buf)
                            ),
                        ));
                    }
                    let w = self.window(*buf, Shape::Row)?;
                    self.program.windows[w].written = true;
                    let v = self.get(*value, Shape::Row)?;
                    let dtype = self.program.windows[w].dtype;
                    let bits = self.narrow(v, dtype, *rounding)?;
                    self.program.stores.push((w, bits));
                    self.stored.insert(w, bits);
                }
                Stmt::If {
                    cond, then_body, ..
                } if Some(*cond) == self.element_guard && !self.loop_done => {
                    self.loop_body(then_body)?;
                    self.loop_done = true;
                }
                // Bodies that run on every row: `if w < P { store buf[w] = .. }` with `buf`
                // sized by `P` (the rows where it is false store into the array's padding),
                // and `if` the chunk is not empty, where the launch proves it.
                Stmt::If {
                    cond,
                    then_body,
                    else_body,
                } if else_body.is_empty()
                    && ((self.stores_past_the_end(*cond, then_body)
                        && matches!(self.def(*cond)?, Op::Cmp(_, w, _) if self.at_work_item(*w)))
                        || self.chunk_not_empty(*cond)?) =>
                {
                    self.top(then_body)?;
                }
                Stmt::If {
                    cond,
                    then_body,
                    else_body,
                } if has_loop(then_body) || has_loop(else_body) => {
                    self.branch_loops(*cond, then_body, else_body)?;
                }
                Stmt::Assign { .. } | Stmt::If { .. } => {
                    let always = self.konst(1, Elt::I1, Shape::Row);
                    self.per_work_item(std::slice::from_ref(stmt), always)?;
                }
                other => return Err(refuse(self.k, stmt_name(other))),
            }
        }
        Ok(())
    }

    /// Top-level statements run by the rows where `when` (an `i1` `Row` node) holds, converted
    /// to selects: an `assign` gives its variable the new value in those rows and keeps the
    /// old one in the others, an `if` narrows `when` by its condition (`else` by its negation).
    /// Their values are lane-wise ops and gathers, which neither trap nor read outside their
    /// windows, so they run in every row. Stores and loops inside are refused.
    fn per_work_item(&mut self, body: &[Stmt], when: usize) -> Result<()> {
        for stmt in body {
            match stmt {
                Stmt::Let(v) => self.eager_read_var(*v)?,
                Stmt::Assign { var, value } => {
                    if self.natural(*value)? > Shape::Row {
                        return Err(refuse(self.k, "a variable assigned a value of the chunk"));
                    }
                    let new = self.get(*value, Shape::Row)?;
                    let old = self.var_value(*var);
                    let elt = self.node_elt(new);
                    let v = self.push(VOp::Select(when, new, old), Shape::Row, elt);
                    self.vars.insert(var.index(), v);
                }
                Stmt::If {
                    cond,
                    then_body,
                    else_body,
                } => {
                    if self.natural(*cond)? > Shape::Row {
                        return Err(refuse(self.k, "an `if` on a value of the chunk"));
                    }
                    let c = self.get(*cond, Shape::Row)?;
                    let then_when = self.push(VOp::Bin(Bin::AndI, when, c), Shape::Row, Elt::I1);
                    self.per_work_item(then_body, then_when)?;
                    if !else_body.is_empty() {
                        let t = self.konst(1, Elt::I1, Shape::Row);
                        let not_c = self.push(VOp::Bin(Bin::XorI, c, t), Shape::Row, Elt::I1);
                        let else_when =
                            self.push(VOp::Bin(Bin::AndI, when, not_c), Shape::Row, Elt::I1);
                        self.per_work_item(else_body, else_when)?;
                    }
                }
                Stmt::Store { .. } => {
                    return Err(refuse(
                        self.k,
                        "a store under an `if` outside the chunk loop",
                    ))
                }
                other => return Err(refuse(self.k, stmt_name(other))),
            }
        }
        Ok(())
    }

    /// The current value of variable `var` (a `Row` node): all-zero bits before its first
    /// `assign`, as every work item's variables start.
    fn var_value(&mut self, var: qforge_ir::VarId) -> usize {
        if let Some(&v) = self.vars.get(&var.index()) {
            return v;
        }
        let ty = self.k.vars.try_get(var).map_or(ScalarType::U32, |v| v.ty);
        self.konst(0, elt_of(ty), Shape::Row)
    }

    fn loop_body(&mut self, body: &[Stmt]) -> Result<()> {
        self.loop_vars.clear();
        self.loop_local = HashSet::new();
        branch_assigned(body, &mut self.loop_local);
        for &var in &self.loop_local {
            let var = qforge_ir::VarId::from_index(var as u32);
            if var_reads(self.k, &self.k.body, var) != var_reads(self.k, body, var) {
                return Err(refuse(
                    self.k,
                    &format!(
                        "the variable {} assigned under an `if` in the loop and read outside it",
                        self.var_name(var)
                    ),
                ));
            }
        }
        self.loop_stmts(body, body, false)?;
        if let Some((&p, _)) = self.pairs.iter().next() {
            return Err(refuse(
                self.k,
                &format!(
                    "a store to {} at only one of `2i` and `2i + 1`",
                    self.param_name(ParamId::from_index(p as u32))
                ),
            ));
        }
        Ok(())
    }

    /// The statements `body` of the loop body `all`; `guarded` inside an `if` that only skips
    /// stores past the end of their buffers.
    fn loop_stmts(&mut self, body: &[Stmt], all: &[Stmt], guarded: bool) -> Result<()> {
        for stmt in body {
            match stmt {
                Stmt::Let(v) => {
                    self.eager_load(*v)?;
                    if matches!(self.def(*v)?, Op::ReadVar(var) if self.loop_local.contains(&var.index()))
                    {
                        self.get(*v, Shape::Chunk)?;
                    }
                }
                Stmt::Assign { var, .. } if self.loop_local.contains(&var.index()) => {
                    return Err(refuse(
                        self.k,
                        &format!(
                            "the variable {} assigned in the loop both under an `if` and outside it",
                            self.var_name(*var)
                        ),
                    ))
                }
                Stmt::Assign { var, value } if !guarded => self.running_max(*var, *value, all)?,
                Stmt::Store {
                    buf,
                    index,
                    value,
                    rounding,
                } => {
                    let Some(slot) = self.slot(*index) else {
                        return Err(refuse(
                            self.k,
                            &format!(
                                "a store to {} at an index other than the loop index `i`, `2i` \
                                 or `2i + 1`",
                                self.param_name(*buf)
                            ),
                        ));
                    };
                    let shape = if slot.is_some() {
                        Shape::Pairs
                    } else {
                        Shape::Chunk
                    };
                    let w = self.window(*buf, shape)?;
                    if shape == Shape::Pairs && !guarded {
                        self.pairs_fill(w)?;
                    }
                    self.program.windows[w].written = true;
                    let v = self.get(*value, Shape::Chunk)?;
                    let dtype = self.program.windows[w].dtype;
                    let bits = self.narrow(v, dtype, *rounding)?;
                    match slot {
                        None => {
                            self.program.stores.push((w, bits));
                            self.stored.insert(w, bits);
                        }
                        Some(half) => self.store_half(*buf, w, half, bits)?,
                    }
                }
                Stmt::If {
                    cond,
                    then_body,
                    else_body,
                } if else_body.is_empty() && self.stores_past_the_end(*cond, then_body) => {
                    self.loop_stmts(then_body, all, true)?;
                }
                Stmt::If {
                    cond,
                    then_body,
                    else_body,
                } if !guarded && only_assigns(then_body) && only_assigns(else_body) => {
                    self.loop_select(*cond, then_body, else_body)?;
                }
                other => return Err(refuse(self.k, stmt_name(other))),
            }
        }
        Ok(())
    }

    /// `if c { assign v = a; .. } else { assign v = b; .. }` in the loop body, every variable
    /// assigned in both branches: each becomes `select(c, a, b)`, its value for this element
    /// (`load_f32_or_zero`'s guarded load, whose branches run unmasked: a load reads its
    /// window, past the buffer's end its padding, and neither traps).
    fn loop_select(&mut self, cond: Value, then_body: &[Stmt], else_body: &[Stmt]) -> Result<()> {
        let c = self.get(cond, Shape::Chunk)?;
        let mut sides: [HashMap<usize, usize>; 2] = [HashMap::new(), HashMap::new()];
        for (side, body) in [then_body, else_body].into_iter().enumerate() {
            for stmt in body {
                match stmt {
                    Stmt::Let(v) => self.eager_load(*v)?,
                    Stmt::Assign { var, value } => {
                        let n = self.get(*value, Shape::Chunk)?;
                        if sides[side].insert(var.index(), n).is_some() {
                            return Err(refuse(
                                self.k,
                                &format!(
                                    "the variable {} assigned twice in one branch of an `if` in the loop",
                                    self.var_name(*var)
                                ),
                            ));
                        }
                    }
                    other => return Err(refuse(self.k, stmt_name(other))),
                }
            }
        }
        let [then_vars, else_vars] = sides;
        let mut vars: Vec<(usize, usize)> = then_vars.iter().map(|(&v, &n)| (v, n)).collect();
        vars.sort_unstable();
        if vars.len() != else_vars.len() || vars.iter().any(|(v, _)| !else_vars.contains_key(v)) {
            return Err(refuse(
                self.k,
                "a variable assigned in one branch of an `if` in the loop and not in the other \
                 (its value would come from an earlier element)",
            ));
        }
        for (var, t) in vars {
            let f = else_vars[&var];
            let elt = self.node_elt(t);
            let sel = self.push(VOp::Select(c, t, f), Shape::Chunk, elt);
            self.loop_vars.insert(var, sel);
        }
        Ok(())
    }

    /// `if c { for .. } else { for .. }` at the top level, both loops over the chunk (the 4-bit
    /// quantization's loop for a full block and its guarded loop for the last one): both run
    /// on every row, in turn, and every buffer stored by one is stored by the other, once at
    /// the same index form; a row where `c` (a per-work-item value) holds takes the first's
    /// tile, the others the second's. Each branch is `let`s and one loop.
    fn branch_loops(&mut self, cond: Value, then_body: &[Stmt], else_body: &[Stmt]) -> Result<()> {
        if self.natural(cond)? > Shape::Row {
            return Err(refuse(self.k, "an `if` on a value of the chunk"));
        }
        let c = self.get(cond, Shape::Row)?;
        let before = self.stored.clone();
        let mut stores = Vec::new();
        for body in [then_body, else_body] {
            self.stored = before.clone();
            let first = self.program.stores.len();
            self.branch_loop(body)?;
            let mut own = self.program.stores.split_off(first);
            own.sort_unstable_by_key(|&(w, _)| w);
            stores.push(own);
        }
        self.stored = before;
        self.loop_done = true;
        let (then_stores, else_stores) = (&stores[0], &stores[1]);
        let same = then_stores.len() == else_stores.len()
            && then_stores
                .iter()
                .zip(else_stores)
                .all(|(a, b)| a.0 == b.0 && self.node_shape(a.1) == self.node_shape(b.1))
            && then_stores.windows(2).all(|p| p[0].0 != p[1].0);
        if !same {
            return Err(refuse(
                self.k,
                "an `if` around the chunk loop whose branches do not store the same buffers, \
                 once each",
            ));
        }
        for (&(w, t), &(_, f)) in then_stores.iter().zip(else_stores) {
            let shape = self.node_shape(t);
            let cw = self.widen(c, shape);
            let elt = self.node_elt(t);
            let sel = self.push(VOp::Select(cw, t, f), shape, elt);
            self.program.stores.push((w, sel));
            self.stored.insert(w, sel);
        }
        Ok(())
    }

    /// One branch of [`Self::branch_loops`]: `let`s and one loop over the chunk.
    fn branch_loop(&mut self, body: &[Stmt]) -> Result<()> {
        let mut loops = 0;
        for stmt in body {
            match stmt {
                Stmt::Let(v) => {
                    self.eager_load(*v)?;
                    self.eager_read_var(*v)?;
                }
                Stmt::For {
                    index,
                    start,
                    end,
                    step,
                    body,
                } if loops == 0 && self.over_the_chunk(*start, *end, *step) => {
                    loops += 1;
                    self.loop_index = Some(*index);
                    self.loop_body(body)?;
                }
                _ => {
                    return Err(refuse(
                        self.k,
                        "an `if` around the chunk loop whose branch holds more than `let`s and \
                         one loop over the chunk",
                    ))
                }
            }
        }
        if loops == 0 {
            return Err(refuse(
                self.k,
                "an `if` around the chunk loop with a branch without the loop",
            ));
        }
        Ok(())
    }

    fn var_name(&self, var: qforge_ir::VarId) -> &str {
        self.k.vars.try_get(var).map_or("?", |v| v.name.as_str())
    }

    /// The number of this row's chunk elements, at every lane (`i32`, `Chunk`): `end - start`
    /// of the chunk loop, `C` for a row loop.
    fn chunk_len(&mut self) -> Result<usize> {
        let c = self
            .chunk
            .as_ref()
            .map(|c| (c.row, c.chunk, c.start, c.end))
            .ok_or_else(|| refuse(self.k, "a loop without a chunk"))?;
        Ok(match c {
            (true, chunk, _, _) => self.konst(chunk, Elt::I32, Shape::Chunk),
            (false, _, start, end) => {
                let (start, end) = (self.get(start, Shape::Row)?, self.get(end, Shape::Row)?);
                let len = self.int(Bin::SubI, end, start);
                self.widen(len, Shape::Chunk)
            }
        })
    }

    /// Where a load or store at `index` goes: `Some(None)` for the loop's element (the loop
    /// index `i`, or `w * P + j` in a row loop), `Some(Some(0))` for `2i` (`i << 1` or `2 * i`),
    /// `Some(Some(1))` for `2i + 1`; `None` for any other index.
    fn slot(&self, index: Value) -> Option<Option<u32>> {
        if self.element_guard.is_some() {
            return (self.aliases.get(&index.index()) == Some(&Alias::Element)).then_some(None);
        }
        let i = self.loop_index?;
        if let Some(c) = self.chunk.as_ref().filter(|c| c.row) {
            let element = match self.def(index).ok()? {
                Op::Binary(BinaryOp::Add, a, b) => [(*a, *b), (*b, *a)]
                    .iter()
                    .any(|&(x, j)| j == i && (x == c.start || self.row_start(x) == Some(c.limit))),
                _ => false,
            };
            return element.then_some(None);
        }
        if index == i {
            return Some(None);
        }
        let doubled = |v: Value| match self.def(v) {
            Ok(Op::Binary(BinaryOp::Shl, a, b)) => *a == i && self.const_u32(*b) == Some(1),
            Ok(Op::Binary(BinaryOp::Mul, a, b)) => {
                (*a == i && self.const_u32(*b) == Some(2))
                    || (*b == i && self.const_u32(*a) == Some(2))
            }
            _ => false,
        };
        if doubled(index) {
            return Some(Some(0));
        }
        match self.def(index).ok()? {
            Op::Binary(BinaryOp::Add, a, b)
                if (doubled(*a) && self.const_u32(*b) == Some(1))
                    || (doubled(*b) && self.const_u32(*a) == Some(1)) =>
            {
                Some(Some(1))
            }
            _ => None,
        }
    }

    /// Records the store of `bits` at `2i + half` of `buf` (window `w`); once both halves are
    /// there, stores their interleave.
    fn store_half(&mut self, buf: ParamId, w: usize, half: u32, bits: usize) -> Result<()> {
        let halves = self.pairs.entry(buf.index()).or_insert([None, None]);
        if halves[half as usize].replace(bits).is_some() {
            return Err(refuse(
                self.k,
                &format!(
                    "a second store to {} at `2i + {half}`",
                    self.param_name(buf)
                ),
            ));
        }
        if let [Some(even), Some(odd)] = *halves {
            self.pairs.remove(&buf.index());
            let elt = self.node_elt(even);
            if elt != self.node_elt(odd) {
                return Err(refuse(
                    self.k,
                    &format!("stores of two types to {}", self.param_name(buf)),
                ));
            }
            let both = self.push(VOp::Interleave(even, odd), Shape::Pairs, elt);
            self.program.stores.push((w, both));
        }
        Ok(())
    }

    /// Whether `if cond { then_body }` only stores past the end of buffers: `cond` is
    /// `index < P` and every statement of the body is a `let` or a store at `index` into a
    /// buffer sized by `P`. Then a false condition means a lane whose store lands in the
    /// arrays' padding, so the body runs unmasked (its values are lane-wise ops, which
    /// neither trap nor read outside the windows).
    fn stores_past_the_end(&self, cond: Value, then_body: &[Stmt]) -> bool {
        let Ok(Op::Cmp(CmpOp::Lt, index, p)) = self.def(cond) else {
            return false;
        };
        let Some(limit) = self.param_of(*p) else {
            return false;
        };
        then_body.iter().all(|s| match s {
            Stmt::Let(_) => true,
            Stmt::Store { buf, index: at, .. } => {
                *at == *index
                    && matches!(self.k.params.try_get(*buf).map(|p| &p.kind),
                        Some(ParamKind::Buffer { shape, .. }) if shape.as_slice() == [Dim::Param(limit)])
            }
            _ => false,
        })
    }

    /// Whether `cond` is `start < end` of the chunk loop's bounds (the 4-bit optimizers' `if
    /// the block is not empty`) and holds for every work item of the launch: the last work
    /// item's chunk starts below `n`. Such an `if` runs its body on every row.
    ///
    /// # Errors
    /// The condition, for a launch whose last chunk is empty.
    fn chunk_not_empty(&self, cond: Value) -> Result<bool> {
        let Ok(Op::Cmp(CmpOp::Lt, start, end)) = self.def(cond) else {
            return Ok(false);
        };
        let same = match (self.chunk_bounds(*start, *end), &self.chunk) {
            (Some(b), Some(c)) => !c.row && (b.chunk, b.limit) == (c.chunk, c.limit),
            _ => false,
        };
        if !same {
            return Ok(false);
        }
        let n = self.limit_value()?;
        let last_start = u64::from(self.shapes.grid.max(1) - 1) * u64::from(self.program.width);
        if last_start >= n {
            return Err(refuse(
                self.k,
                &format!(
                    "an `if` on the chunk not being empty, at a grid of {} work items whose last \
                     chunk starts at {last_start}, past {} = {n}",
                    self.shapes.grid,
                    self.limit_name()
                ),
            ));
        }
        Ok(true)
    }

    /// A `read_var` is lowered where it stands: a later `assign` changes the variable.
    fn eager_read_var(&mut self, v: Value) -> Result<()> {
        if matches!(self.def(v)?, Op::ReadVar(_)) {
            self.get(v, Shape::Row)?;
        }
        Ok(())
    }

    /// The `Table` window of buffer `p` (the whole buffer, read at indices computed per work
    /// item: read-only, 32-bit, at most [`super::MAX_GATHER`] elements), its `Cols` window (read
    /// at a row loop's index: read-only, 32-bit, `[P]` for the row length `P`) or the `Scalar`
    /// window of scalar `p`.
    fn fixed_window(&mut self, p: ParamId, kind: WindowKind) -> Result<usize> {
        if let Some(&w) = self.windows.get(&(p.index(), kind)) {
            return Ok(w);
        }
        let param = self.k.params.try_get(p).ok_or_else(|| Error::Backend {
            backend: super::BACKEND,
            message: format!("{}: a missing parameter", self.k.name),
        })?;
        let name = param.name.clone();
        let (dtype, elements) = match (&param.kind, kind) {
            (ParamKind::Buffer { dtype, access, .. }, WindowKind::Table) => {
                let elements = self.shapes.elements.get(p.index()).copied().unwrap_or(0);
                if *access != Access::Read {
                    return Err(refuse(
                        self.k,
                        &format!("a load of {name}, which the kernel writes, at an index computed per work item"),
                    ));
                }
                if dtype.size_bytes() != 4 {
                    return Err(refuse(
                        self.k,
                        &format!("a load of the {dtype:?} buffer {name} at an index computed per work item (32-bit buffers only)").to_lowercase(),
                    ));
                }
                if elements == 0 || elements > super::MAX_GATHER {
                    return Err(refuse(
                        self.k,
                        &format!(
                            "a load at an index computed per work item from {name} of {elements} elements (1 to {} are selected by compares)",
                            super::MAX_GATHER
                        ),
                    ));
                }
                (*dtype, elements)
            }
            (
                ParamKind::Buffer {
                    dtype,
                    access,
                    shape,
                },
                WindowKind::Cols,
            ) => {
                let row_length = self.chunk.as_ref().filter(|c| c.row).map(|c| c.limit);
                if *access != Access::Read
                    || row_length.is_none_or(|p| shape.as_slice() != [Dim::Param(p)])
                {
                    return Err(refuse(
                        self.k,
                        &format!(
                            "a load of {name} at the row's column other than from a read-only \
                             buffer of one element per column"
                        ),
                    ));
                }
                (*dtype, self.program.width as usize)
            }
            (ParamKind::Scalar(ty), WindowKind::Scalar) => {
                let dtype = match ty {
                    ScalarType::F32 => DType::F32,
                    ScalarType::U32 => DType::U32,
                    ScalarType::I32 => DType::I32,
                    ScalarType::Bool => {
                        return Err(refuse(
                            self.k,
                            &format!("the bool scalar {name} used as a value"),
                        ))
                    }
                };
                (dtype, 1)
            }
            _ => {
                return Err(refuse(
                    self.k,
                    &format!("{name} used as a scalar and a buffer"),
                ))
            }
        };
        let w = self.program.windows.len();
        self.program.windows.push(Window {
            param: p.index(),
            name,
            dtype,
            width: elements as u32,
            elements,
            read: true,
            written: false,
            kind,
        });
        self.windows.insert((p.index(), kind), w);
        Ok(w)
    }

    /// Loads are lowered where they stand (a later store may change the buffer); a load at
    /// an index of another form is refused only if a store uses it.
    fn eager_load(&mut self, v: Value) -> Result<()> {
        if let Op::Load { index, .. } = self.def(v)? {
            let index = *index;
            let shape = if self.slot(index).is_some() {
                Shape::Chunk
            } else if self.at_work_item(index) {
                Shape::Row
            } else {
                return Ok(());
            };
            self.get(v, shape)?;
        }
        Ok(())
    }

    /// The window of buffer `p` seen at `shape` (`Row`, `Chunk`, `Pairs` or `Whole`).
    fn window(&mut self, p: ParamId, shape: Shape) -> Result<usize> {
        let kind = match shape {
            Shape::Chunk => WindowKind::Chunk,
            Shape::Pairs => WindowKind::Pairs,
            Shape::Whole => WindowKind::Whole,
            Shape::WholePairs => WindowKind::WholePairs,
            _ => WindowKind::Row,
        };
        let width = match shape {
            Shape::Chunk | Shape::Whole => self.program.width,
            Shape::Pairs | Shape::WholePairs => {
                self.program.width.checked_mul(2).ok_or_else(|| {
                    refuse(
                        self.k,
                        &format!(
                            "a chunk of {} stored at `2i` and `2i + 1` (2C passes 2^32)",
                            self.program.width
                        ),
                    )
                })?
            }
            _ => 1,
        };
        if let Some(&w) = self.windows.get(&(p.index(), kind)) {
            return Ok(w);
        }
        // One array per buffer and index form: a buffer read or written at two of `w`, `i`
        // and `2i`/`2i + 1` would be two arrays that do not see each other's stores. Only a
        // reduction's whole-chunk window may sit beside the chunk window (it reads the
        // buffer before any store: `Self::reduce`).
        let clash = self.windows.keys().any(|&(q, k)| {
            q == p.index()
                && k != WindowKind::Table
                && !matches!(
                    (k, kind),
                    (WindowKind::Chunk, WindowKind::Whole)
                        | (WindowKind::Whole, WindowKind::Chunk)
                        | (WindowKind::Pairs, WindowKind::WholePairs)
                        | (WindowKind::WholePairs, WindowKind::Pairs)
                )
        });
        if clash {
            return Err(refuse(
                self.k,
                &format!(
                    "{} used at two index forms (per work item, per chunk element `i`, or at \
                     `2i` and `2i + 1`)",
                    self.param_name(p)
                ),
            ));
        }
        let param = self.k.params.try_get(p).ok_or_else(|| Error::Backend {
            backend: super::BACKEND,
            message: format!("{}: a missing parameter", self.k.name),
        })?;
        let ParamKind::Buffer {
            dtype,
            shape: dims,
            access,
        } = &param.kind
        else {
            return Err(refuse(self.k, "a scalar used as a buffer"));
        };
        let elements = self.shapes.elements.get(p.index()).copied().unwrap_or(0);
        // The chunk buffers (only seen inside the loop) are sized by the loop's limit, so the
        // lanes past it are the arrays' padding: no lane needs a mask.
        if let (Shape::Chunk | Shape::Whole, Some(chunk)) = (shape, &self.chunk) {
            let sized = match (chunk.row, chunk.element_rows) {
                (true, Some(r)) => dims.as_slice() == [Dim::Param(r), Dim::Param(chunk.limit)],
                (true, None) => dims.len() == 2 && dims[1] == Dim::Param(chunk.limit),
                (false, _) => dims.as_slice() == [Dim::Param(chunk.limit)],
            };
            if !sized {
                return Err(refuse(
                    self.k,
                    &format!(
                        "{} is not sized by the loop's limit {}",
                        param.name,
                        self.param_name(chunk.limit)
                    ),
                ));
            }
        }
        // A pairs buffer's elements must all be written: the stores at `2i` and `2i + 1`
        // cover `0 .. 2n` for the loop's limit `n`.
        if matches!(shape, Shape::Pairs | Shape::WholePairs) {
            let n = self.limit_value()?;
            if elements as u64 > 2 * n {
                return Err(refuse(
                    self.k,
                    &format!(
                        "{elements} elements of {}, stored at `2i` and `2i + 1` for `i` below \
                         {} = {n}",
                        param.name,
                        self.limit_name(),
                    ),
                ));
            }
        }
        // An element-wise kernel's work items are its elements: whole rows of `C`.
        let rows = match self.element_guard {
            Some(_) => self.shapes.grid / self.program.width.max(1),
            None => self.shapes.grid,
        };
        if elements as u64 > u64::from(rows) * u64::from(width) {
            return Err(refuse(
                self.k,
                &format!(
                    "a grid of {} work items that does not cover the {elements} elements of {}{}",
                    self.shapes.grid,
                    param.name,
                    if self.element_guard.is_some() {
                        " (an element-wise kernel: one work item per element)"
                    } else {
                        ""
                    }
                ),
            ));
        }
        let w = self.program.windows.len();
        self.program.windows.push(Window {
            param: p.index(),
            name: param.name.clone(),
            dtype: *dtype,
            width,
            elements,
            read: false,
            written: false,
            kind,
        });
        if *access == Access::ReadWrite {
            // Its old contents are an input even where the program only stores.
            self.program.windows[w].read = true;
        }
        self.windows.insert((p.index(), kind), w);
        Ok(w)
    }

    /// `reduce absmax` over the work item's chunk (`start` and `len` the chunk loop's start and
    /// `end - start`) as a `Row` value: the buffer's whole-chunk window widened to `f32`, its
    /// magnitudes' bits (a NaN's above `+inf`'s; with `ignore` a NaN's are `0`) reduced by an
    /// integer max. The lanes past the chunk are the array's zero padding: `+0.0`, the
    /// reduction's start. A sum (whose order matters) is refused.
    fn reduce(
        &mut self,
        kind: ReduceKind,
        buf: ParamId,
        start: Value,
        len: Value,
    ) -> Result<usize> {
        let ReduceKind::AbsMax(nan) = kind else {
            return Err(refuse(self.k, "`reduce sum` (a pinned-order sum)"));
        };
        let chunk = self
            .chunk
            .as_ref()
            .map(|c| (c.start, c.end, c.row, c.limit));
        let over_chunk = chunk.is_some_and(|(s, e, row, limit)| match row {
            true => start == s && self.param_of(len) == Some(limit),
            false => {
                start == s
                    && matches!(self.def(len), Ok(Op::Binary(BinaryOp::Sub, a, b)) if *a == e && *b == s)
            }
        });
        if chunk.is_none() {
            return Err(refuse(
                self.k,
                &format!(
                    "a reduction of {} outside a kernel whose top level has the chunk loop",
                    self.param_name(buf)
                ),
            ));
        }
        let over_pairs = !over_chunk && self.over_pairs(buf, start, len);
        if !over_chunk && !over_pairs {
            return Err(refuse(
                self.k,
                &format!(
                    "a reduction of {} over a range other than the work item's chunk",
                    self.param_name(buf)
                ),
            ));
        }
        // Over the pairs, the step's own pairs tile when it holds the whole chunk, else a
        // second, whole-pairs window.
        let shape = match (over_pairs, self.program.lane_blocks()) {
            (true, 1) => Shape::Pairs,
            (true, _) => Shape::WholePairs,
            (false, _) => Shape::Whole,
        };
        let w = self.window(buf, shape)?;
        let stored = self
            .windows
            .iter()
            .any(|(&(q, _), w)| q == buf.index() && self.stored.contains_key(w));
        if stored {
            return Err(refuse(
                self.k,
                &format!(
                    "a reduction of {} after a store to it",
                    self.param_name(buf)
                ),
            ));
        }
        if !matches!(
            self.program.windows[w].dtype,
            DType::F32 | DType::BF16 | DType::F16
        ) {
            return Err(refuse(
                self.k,
                &format!("a reduction of the integer buffer {}", self.param_name(buf)),
            ));
        }
        let value = if shape == Shape::Pairs {
            self.pairs_load(buf)?
        } else {
            self.load_window(w, shape)
        };
        let bits = self.push(VOp::Bitcast(value, Elt::I32), shape, Elt::I32);
        let mask = self.konst(0x7fff_ffff, Elt::I32, shape);
        let mut mag = self.push(VOp::Bin(Bin::AndI, bits, mask), shape, Elt::I32);
        if nan == NanMode::Ignore {
            let inf = self.konst(0x7f80_0000, Elt::I32, shape);
            let is_nan = self.push(VOp::Cmp(Pred::Ugt, mag, inf), shape, Elt::I1);
            let zero = self.konst(0, Elt::I32, shape);
            mag = self.push(VOp::Select(is_nan, zero, mag), shape, Elt::I32);
        }
        let max = self.push(VOp::MaxLanes(mag), Shape::Row, Elt::I32);
        Ok(self.push(VOp::Bitcast(max, Elt::F32), Shape::Row, Elt::F32))
    }

    /// Whether the loop body `body` loads at `2i` or `2i + 1`, nested blocks included.
    fn reads_pairs(&self, body: &[Stmt]) -> bool {
        body.iter().any(|s| match s {
            Stmt::Let(v) => {
                matches!(self.def(*v), Ok(Op::Load { index, .. }) if matches!(self.slot(*index), Some(Some(_))))
            }
            Stmt::If {
                then_body,
                else_body,
                ..
            } => self.reads_pairs(then_body) || self.reads_pairs(else_body),
            _ => false,
        })
    }

    /// Whether `reduce buf[start, len]` covers the chunk's pairs: the range of a work item's
    /// `2C` elements, `start = 2C * w` and `len = end - start` with `end = select(start < P,
    /// min(start + 2C, P), start)`, `buf` sized by `P` (its elements past `P` are the pairs
    /// array's zero padding).
    fn over_pairs(&self, buf: ParamId, start: Value, len: Value) -> bool {
        let Some(chunk) = self.chunk.as_ref().map(|c| c.chunk) else {
            return false;
        };
        let Ok(Op::Binary(BinaryOp::Sub, end, s)) = self.def(len) else {
            return false;
        };
        let Some(b) = self.chunk_bounds(start, *end).filter(|_| *s == start) else {
            return false;
        };
        u64::from(b.chunk) == 2 * u64::from(chunk)
            && matches!(self.k.params.try_get(buf).map(|p| &p.kind),
                Some(ParamKind::Buffer { shape, .. }) if shape.as_slice() == [Dim::Param(b.limit)])
    }

    /// Window `w`'s tile at `shape`, read: `f32` for an `f32` buffer, `bf16` and `f16` widened
    /// to `f32`, integers as `i32` lanes.
    pub(super) fn load_window(&mut self, w: usize, shape: Shape) -> usize {
        self.load_with(w, shape, VOp::Load { window: w })
    }

    /// [`Self::load_window`] by `load`, an op reading window `w` as a `Load` does (its
    /// elements as `f32`, or as `i32`: integers widened, 16-bit floats' bits).
    pub(super) fn load_with(&mut self, w: usize, shape: Shape, load: VOp) -> usize {
        self.program.windows[w].read = true;
        let dtype = self.program.windows[w].dtype;
        let raw_elt = if dtype == DType::F32 {
            Elt::F32
        } else {
            Elt::I32
        };
        let raw = self.push(load, shape, raw_elt);
        match dtype {
            DType::BF16 => self.bf16_to_f32(raw),
            DType::F16 => self.f16_to_f32(raw),
            _ => raw,
        }
    }

    /// The tile of pairs window of `buf`, read by the loop at `2i` and `2i + 1` or reduced
    /// over the chunk's `2C` elements: loaded once (the 4-bit quantization's input `x`).
    /// Row `w` of the array holds elements `2C*w .. 2C*w + 2C`, so every element the IR reads
    /// inside the buffer is its lane, and one past its end is the array's zero padding.
    fn pairs_load(&mut self, buf: ParamId) -> Result<usize> {
        let w = self.window(buf, Shape::Pairs)?;
        if let Some(&n) = self.pairs_loads.get(&w) {
            return Ok(n);
        }
        if self.program.lanes() > MAX_PAIRS_READ {
            return Err(refuse(
                self.k,
                &format!(
                    "a read of {} as pairs in steps of {} lanes, more than {MAX_PAIRS_READ} \
                     (v5e's scoped VMEM; the first loop does not read it)",
                    self.param_name(buf),
                    self.program.lanes()
                ),
            ));
        }
        if self.stored.contains_key(&w) || self.program.stores.iter().any(|&(s, _)| s == w) {
            return Err(refuse(
                self.k,
                &format!(
                    "a load of {} at `2i` or `2i + 1` after a store to it",
                    self.param_name(buf)
                ),
            ));
        }
        let n = self.load_window(w, Shape::Pairs);
        self.pairs_loads.insert(w, n);
        Ok(n)
    }

    fn limit_name(&self) -> &str {
        self.chunk
            .as_ref()
            .map_or("?", |c| self.param_name(c.limit))
    }

    /// The value of the chunk loop's limit at these shapes: the element count of a buffer
    /// sized by it.
    fn limit_value(&self) -> Result<u64> {
        let limit = self.chunk.as_ref().map(|c| c.limit);
        self.k
            .params
            .iter()
            .enumerate()
            .find(|(_, (_, p))| {
                matches!(&p.kind, ParamKind::Buffer { shape, .. }
                    if limit.is_some_and(|l| shape.as_slice() == [Dim::Param(l)]))
            })
            .map(|(i, _)| self.shapes.elements.get(i).copied().unwrap_or(0) as u64)
            .ok_or_else(|| {
                refuse(
                    self.k,
                    &format!("no buffer sized by the loop's limit {}", self.limit_name()),
                )
            })
    }

    /// Refuses an unguarded store at `2i` or `2i + 1` into pairs window `w` unless the buffer
    /// holds exactly `2n` elements (else the IR's store would be out of bounds where the
    /// Mosaic one lands in padding).
    fn pairs_fill(&self, w: usize) -> Result<()> {
        let win = &self.program.windows[w];
        if win.elements as u64 == 2 * self.limit_value()? {
            return Ok(());
        }
        Err(refuse(
            self.k,
            &format!(
                "a store to {} at `2i` or `2i + 1` past its end without an `if` on its length",
                win.name
            ),
        ))
    }

    pub(super) fn push(&mut self, op: VOp, shape: Shape, elt: Elt) -> usize {
        self.program.nodes.push(Node { op, shape, elt });
        self.program.nodes.len() - 1
    }

    pub(super) fn konst(&mut self, bits: u32, elt: Elt, shape: Shape) -> usize {
        self.push(VOp::Const { bits, elt }, shape, elt)
    }

    pub(super) fn node_shape(&self, n: usize) -> Shape {
        self.program.nodes[n].shape
    }

    pub(super) fn node_elt(&self, n: usize) -> Elt {
        self.program.nodes[n].elt
    }

    /// Node `n` at `shape` (a `Row` broadcast across the chunk or its pairs; a matmul's
    /// `WRow` across its weight tile or blocks, its `WBlocks` spread over the tile's lanes).
    fn widen(&mut self, n: usize, shape: Shape) -> usize {
        let elt = self.node_elt(n);
        match (self.node_shape(n), shape) {
            (Shape::Row, Shape::Chunk | Shape::Pairs)
            | (Shape::WRow, Shape::WBlocks | Shape::WTile) => {
                self.push(VOp::Broadcast(n), shape, elt)
            }
            (Shape::WBlocks, Shape::WTile) => self.push(VOp::Spread(n), shape, elt),
            _ => n,
        }
    }

    /// The window of scalar parameter `p`'s value.
    pub(super) fn scalar_window(&mut self, p: ParamId) -> Result<usize> {
        self.fixed_window(p, WindowKind::Scalar)
    }

    /// The whole-buffer window of `p`, read at computed indices.
    pub(super) fn scalar_table(&mut self, p: ParamId) -> Result<usize> {
        self.fixed_window(p, WindowKind::Table)
    }

    /// [`Self::natural`], for the matmul's lowering.
    pub(super) fn natural_of(&mut self, v: Value) -> Result<Shape> {
        self.natural(v)
    }

    /// The natural shape of `v`: where its loads are (memoized: values form a DAG).
    fn natural(&mut self, v: Value) -> Result<Shape> {
        if let Some(&s) = self.natural_shapes.get(&v.index()) {
            return Ok(s);
        }
        if let Some(s) = self.matmul_natural(v)? {
            self.natural_shapes.insert(v.index(), s);
            return Ok(s);
        }
        if let Some(&a) = self.aliases.get(&v.index()) {
            return Ok(match a {
                Alias::Row => Shape::Row,
                Alias::Element | Alias::Col => Shape::Chunk,
            });
        }
        let s = match self.def(v)? {
            Op::Const(_) => Shape::Uniform,
            Op::ReadVar(var) if self.loop_local.contains(&var.index()) => Shape::Chunk,
            Op::Reduce { .. } | Op::WorkItem | Op::Param(_) | Op::ReadVar(_) => Shape::Row,
            Op::LoopIndex => Shape::Chunk,
            Op::Load { index, .. } => {
                if self.slot(*index).is_some() {
                    Shape::Chunk
                } else {
                    self.natural(*index)?.max(Shape::Row)
                }
            }
            op => {
                let mut s = Shape::Uniform;
                for o in op.operands() {
                    s = s.max(self.natural(o)?);
                }
                s
            }
        };
        self.natural_shapes.insert(v.index(), s);
        Ok(s)
    }

    /// Value `v` as a node of at least `shape` (constants at exactly `shape`).
    pub(super) fn get(&mut self, v: Value, shape: Shape) -> Result<usize> {
        let own = self.natural(v)?;
        let at = own.max(shape);
        if let Some(&n) = self.memo.get(&(v.index(), at)) {
            return Ok(n);
        }
        let n = if own < at && own != Shape::Uniform {
            let n = self.get(v, own)?;
            self.widen(n, at)
        } else {
            self.lower(v, at)?
        };
        self.memo.insert((v.index(), at), n);
        Ok(n)
    }

    fn lower(&mut self, v: Value, at: Shape) -> Result<usize> {
        if let Some(n) = self.matmul_leaf(v, at)? {
            return Ok(n);
        }
        if let Some(&a) = self.aliases.get(&v.index()) {
            let row = self.push(VOp::WorkItem, Shape::Row, Elt::I32);
            return Ok(match a {
                Alias::Row => self.widen(row, at),
                Alias::Col => self.push(VOp::Lane, Shape::Chunk, Elt::I32),
                Alias::Element => {
                    let c = self.konst(self.program.width, Elt::I32, Shape::Row);
                    let first = self.int(Bin::MulI, row, c);
                    let first = self.widen(first, Shape::Chunk);
                    let lane = self.push(VOp::Lane, Shape::Chunk, Elt::I32);
                    self.push(VOp::Bin(Bin::AddI, first, lane), Shape::Chunk, Elt::I32)
                }
            });
        }
        let op = self.def(v)?.clone();
        let ty = self.ty(v);
        Ok(match op {
            Op::Const(s) => {
                let (bits, elt) = match s {
                    Scalar::F32(b) => (b, Elt::F32),
                    Scalar::U32(u) => (u, Elt::I32),
                    Scalar::I32(i) => (i as u32, Elt::I32),
                    Scalar::Bool(b) => (u32::from(b), Elt::I1),
                };
                self.konst(bits, elt, at)
            }
            Op::Load { buf, index } => {
                let row_loop = self.chunk.as_ref().is_some_and(|c| c.row);
                let column = self.aliases.get(&index.index()) == Some(&Alias::Col);
                if row_loop && (column || Some(index) == self.loop_index) {
                    let w = self.fixed_window(buf, WindowKind::Cols)?;
                    return Ok(self.load_window(w, Shape::Chunk));
                }
                let shape = if self.slot(index) == Some(None) {
                    Shape::Chunk
                } else if self.at_work_item(index) {
                    Shape::Row
                } else if let Some(Some(half)) = self.slot(index) {
                    // One node per half of the tile: each `[R, L, 2]` view of it takes
                    // 64 times its size in VMEM (its last dimension padded to 128 lanes).
                    let pairs = self.pairs_load(buf)?;
                    let same = |n: &Node| n.op == VOp::Deinterleave(pairs, half);
                    if let Some(n) = self.program.nodes.iter().position(same) {
                        return Ok(n);
                    }
                    let elt = self.node_elt(pairs);
                    return Ok(self.push(VOp::Deinterleave(pairs, half), Shape::Chunk, elt));
                } else if self.natural(index)? <= Shape::Row {
                    let i = self.get(index, Shape::Row)?;
                    let w = self.fixed_window(buf, WindowKind::Table)?;
                    let elt = if self.program.windows[w].dtype == DType::F32 {
                        Elt::F32
                    } else {
                        Elt::I32
                    };
                    return Ok(self.push(
                        VOp::Gather {
                            window: w,
                            index: i,
                        },
                        Shape::Row,
                        elt,
                    ));
                } else {
                    return Err(refuse(
                        self.k,
                        &format!(
                            "a load of {} at an index of the chunk other than the loop index",
                            self.param_name(buf)
                        ),
                    ));
                };
                let w = self.window(buf, shape)?;
                if let Some(&s) = self.stored.get(&w) {
                    return Ok(self.widen_stored(s, w));
                }
                self.load_window(w, shape)
            }
            Op::Lookup { table, index } => {
                let i = self.get(index, at)?;
                self.lookup(table, i, at)?
            }
            Op::Unary(u, a) if u != UnaryOp::Sqrt => {
                let a = self.get(a, at)?;
                self.unary(u, a, ty, at)?
            }
            Op::Binary(b, x, y) if !(b == BinaryOp::Div && ty == ScalarType::F32) => {
                let (x, y) = (self.get(x, at)?, self.get(y, at)?);
                self.binary(b, x, y, ty, at)?
            }
            Op::Cmp(c, x, y) => {
                let operand_ty = self.ty(x);
                let (x, y) = (self.get(x, at)?, self.get(y, at)?);
                if operand_ty == ScalarType::F32 && c == CmpOp::Ne {
                    self.float_ne(x, y, at)
                } else {
                    self.push(VOp::Cmp(pred(c, operand_ty), x, y), at, Elt::I1)
                }
            }
            Op::Select {
                cond,
                if_true,
                if_false,
            } => {
                let c = self.get(cond, at)?;
                let (t, f) = (self.get(if_true, at)?, self.get(if_false, at)?);
                self.push(VOp::Select(c, t, f), at, elt_of(ty))
            }
            Op::Reduce {
                kind,
                buf,
                start,
                len,
                ..
            } => self.reduce(kind, buf, start, len)?,
            Op::Binary(BinaryOp::Div, x, y) if ty == ScalarType::F32 => {
                let (x, y) = (self.get(x, at)?, self.get(y, at)?);
                self.div_f32(x, y)
            }
            Op::Fma(x, y, z) => {
                let (x, y, z) = (self.get(x, at)?, self.get(y, at)?, self.get(z, at)?);
                self.fma_f32(x, y, z)
            }
            Op::Unary(UnaryOp::Sqrt, x) if ty == ScalarType::F32 => {
                let x = self.get(x, at)?;
                self.sqrt_f32(x)
            }
            Op::FloatToInt {
                value,
                to,
                rounding,
            } => {
                let v = self.get(value, at)?;
                self.f32_to_int(v, to == ScalarType::I32, rounding)
            }
            Op::IntToFloat { value, rounding } => {
                let signed = self.ty(value) == ScalarType::I32;
                let v = self.get(value, at)?;
                self.int_to_f32(v, signed, rounding)
            }
            Op::Bitcast { value, to } => {
                let a = self.get(value, at)?;
                if elt_of(to) == self.node_elt(a) {
                    a
                } else {
                    self.push(VOp::Bitcast(a, elt_of(to)), at, elt_of(to))
                }
            }
            Op::WorkItem => self.push(VOp::WorkItem, Shape::Row, Elt::I32),
            Op::LoopIndex if Some(v) == self.loop_index => {
                // Element `i` is position `i - C*w` of the chunk; a row loop's `j` is the
                // position itself.
                let (start, row) =
                    self.chunk
                        .as_ref()
                        .map(|c| (c.start, c.row))
                        .ok_or_else(|| {
                            refuse(
                                self.k,
                                "the loop index used as a value outside the chunk loop",
                            )
                        })?;
                let lane = self.push(VOp::Lane, Shape::Chunk, Elt::I32);
                if row {
                    lane
                } else {
                    let s = self.get(start, Shape::Chunk)?;
                    self.push(VOp::Bin(Bin::AddI, s, lane), Shape::Chunk, Elt::I32)
                }
            }
            Op::LoopIndex => {
                return Err(refuse(
                    self.k,
                    "the index of a loop other than the chunk loop used as a value",
                ))
            }
            Op::Param(p) => {
                let w = self.fixed_window(p, WindowKind::Scalar)?;
                self.push(VOp::Scalar { window: w }, Shape::Row, elt_of(ty))
            }
            Op::ReadVar(var) if self.loop_local.contains(&var.index()) => {
                match self.loop_vars.get(&var.index()) {
                    Some(&n) => n,
                    None => {
                        return Err(refuse(
                            self.k,
                            &format!(
                                "the variable {} read in the loop before the `if` that assigns \
                                 it (an earlier element's value)",
                                self.var_name(var)
                            ),
                        ))
                    }
                }
            }
            Op::ReadVar(var) => self.var_value(var),
            other => return Err(refuse(self.k, op_name(&other))),
        })
    }
}

/// How many times `v` is an operand in `body` (its `let`s, stores, assignments and `if`
/// conditions, nested blocks included).
fn uses(k: &Kernel, body: &[Stmt], v: Value) -> usize {
    body.iter()
        .map(|s| match s {
            Stmt::Let(x) => k
                .values
                .try_get(*x)
                .map_or(0, |d| d.op.operands().iter().filter(|&&o| o == v).count()),
            Stmt::Store { index, value, .. } => usize::from(*index == v) + usize::from(*value == v),
            Stmt::Assign { value, .. } => usize::from(*value == v),
            Stmt::If {
                cond,
                then_body,
                else_body,
            } => usize::from(*cond == v) + uses(k, then_body, v) + uses(k, else_body, v),
            Stmt::For {
                start, end, body, ..
            } => usize::from(*start == v) + usize::from(*end == v) + uses(k, body, v),
            Stmt::Accumulate {
                len, body, accs, ..
            } => {
                usize::from(*len == v)
                    + uses(k, body, v)
                    + accs
                        .iter()
                        .map(|a| usize::from(a.a == v) + usize::from(a.b == v))
                        .sum::<usize>()
            }
        })
        .sum()
}

/// How many `read_var var` values `body` defines, nested blocks included.
fn var_reads(k: &Kernel, body: &[Stmt], var: qforge_ir::VarId) -> usize {
    body.iter()
        .map(|s| match s {
            Stmt::Let(x) => usize::from(matches!(
                k.values.try_get(*x).map(|d| &d.op),
                Some(Op::ReadVar(r)) if *r == var
            )),
            Stmt::If {
                then_body,
                else_body,
                ..
            } => var_reads(k, then_body, var) + var_reads(k, else_body, var),
            Stmt::For { body, .. } | Stmt::Accumulate { body, .. } => var_reads(k, body, var),
            Stmt::Store { .. } | Stmt::Assign { .. } => 0,
        })
        .sum()
}

/// A loop's index, start, end, step and body.
type Loop<'a> = (Value, Value, Value, u32, &'a [Stmt]);

/// The first loop of `body` in program order, inside `if`s too (not inside other loops).
fn first_loop(body: &[Stmt]) -> Option<Loop<'_>> {
    body.iter().find_map(|s| match s {
        Stmt::For {
            index,
            start,
            end,
            step,
            body,
        } => Some((*index, *start, *end, *step, body.as_slice())),
        Stmt::If {
            then_body,
            else_body,
            ..
        } => first_loop(then_body).or_else(|| first_loop(else_body)),
        _ => None,
    })
}

/// Whether `body` holds a loop (inside `if`s too).
fn has_loop(body: &[Stmt]) -> bool {
    first_loop(body).is_some()
}

/// Whether `body` is only `let`s and `assign`s, at least one.
fn only_assigns(body: &[Stmt]) -> bool {
    body.iter().any(|s| matches!(s, Stmt::Assign { .. }))
        && body
            .iter()
            .all(|s| matches!(s, Stmt::Let(_) | Stmt::Assign { .. }))
}

/// Adds to `vars` the variables assigned under an `if` directly in the loop body `body`.
fn branch_assigned(body: &[Stmt], vars: &mut HashSet<usize>) {
    for s in body {
        if let Stmt::If {
            then_body,
            else_body,
            ..
        } = s
        {
            for s in then_body.iter().chain(else_body) {
                if let Stmt::Assign { var, .. } = s {
                    vars.insert(var.index());
                }
            }
        }
    }
}

fn stmt_name(s: &Stmt) -> &'static str {
    match s {
        Stmt::Let(_) => "let",
        Stmt::Store { .. } => "store",
        Stmt::Assign { .. } => "a variable (`assign`)",
        Stmt::If { .. } => "`if` (control flow other than the chunk loop)",
        Stmt::For { .. } => "a nested loop",
        Stmt::Accumulate { .. } => "`accumulate` (a pinned-order sum)",
        #[allow(unreachable_patterns)]
        _ => "a statement",
    }
}

fn op_name(op: &Op) -> &'static str {
    match op {
        // `lower` rewrites it into lookups and compares first.
        Op::SearchSorted { .. } => "search_sorted",
        _ => "an op",
    }
}
