//! The tile program: a kernel of the row-chunk class (module docs) as vector ops over one grid
//! step's `R x 1` (per work item) and `R x W` (per chunk element) tiles, in program order. Both
//! printers (`text.rs`, `twin.rs`) print these ops one to one, so the twin checks exactly
//! what the Mosaic module computes.

use std::collections::HashMap;

use qforge_ir::{
    Access, BinaryOp, CmpOp, DType, Dim, Kernel, Op, ParamId, ParamKind, Rounding, Scalar,
    ScalarType, Stmt, TableId, UnaryOp, Value,
};

use super::{refuse, Shapes, STEP_ROWS};
use crate::error::{Error, Result};

/// The shape of a value in one grid step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) enum Shape {
    /// The same in every lane (a constant): emitted at the shape of its use.
    Uniform,
    /// One element per work item: `R x 1`.
    Row,
    /// One element per chunk position of each work item: `R x W`.
    Chunk,
}

/// The element type of a vector value: `u32`/`i32` values are signless `i32` lanes (the op
/// says how they are read), `bool` is `i1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Elt {
    I32,
    F32,
    I1,
}

/// A binary lane-wise op (integer ops wrap; shift amounts are below 32).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Bin {
    AddI,
    SubI,
    MulI,
    AndI,
    OrI,
    XorI,
    Shl,
    ShrU,
    ShrS,
    AddF,
    SubF,
    MulF,
}

/// A comparison: `U`/`S` integer orders, `O` ordered float compares (false with a NaN; Mosaic
/// has no unordered ones: the IR's float `ne` is `not oeq`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pred {
    Eq,
    Ne,
    Ult,
    Ule,
    Ugt,
    Uge,
    Slt,
    Sle,
    Sgt,
    Sge,
    Oeq,
    Olt,
    Ole,
    Ogt,
    Oge,
}

/// One vector op; operands are earlier ops' indices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum VOp {
    /// The window's tile: `f32` for an `f32` buffer, otherwise the element's bits widened to
    /// `i32` (zero-extended, `i8` sign-extended).
    Load {
        window: usize,
    },
    /// `bits` in every lane, as `elt` (`f32` by its bit pattern).
    Const {
        bits: u32,
        elt: Elt,
    },
    /// A `Row` value repeated across the chunk.
    Broadcast(usize),
    Bin(Bin, usize, usize),
    Cmp(Pred, usize, usize),
    Select(usize, usize, usize),
    /// Reinterprets `i32` as `f32` or back.
    Bitcast(usize, Elt),
}

/// A buffer as a 2-D array of the tile program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Window {
    /// Parameter index.
    pub param: usize,
    /// Parameter name.
    pub name: String,
    /// Element dtype.
    pub dtype: DType,
    /// Columns of the array: 1 (one element per work item) or the chunk width `W`.
    pub width: u32,
    /// The buffer's element count: the array holds it flat, padded with zeros to
    /// `rows x width`.
    pub elements: usize,
    /// Whether the program reads it (an input of the Mosaic function).
    pub read: bool,
    /// Whether the program writes it (an output).
    pub written: bool,
}

/// A value with its shape and element type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Node {
    pub op: VOp,
    pub shape: Shape,
    pub elt: Elt,
}

/// The tile program of a kernel at given launch shapes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct TileProgram {
    pub name: String,
    /// Rows of every array: the grid rounded up to [`STEP_ROWS`].
    pub rows: u32,
    /// The chunk width `W`.
    pub width: u32,
    pub windows: Vec<Window>,
    pub nodes: Vec<Node>,
    /// `(window, node)` in program order; a later store to a window replaces the tile.
    pub stores: Vec<(usize, usize)>,
}

impl TileProgram {
    /// Grid steps over the rows: `rows / STEP_ROWS`.
    pub fn steps(&self) -> u32 {
        self.rows / STEP_ROWS
    }

    /// Columns of a chunk window: the chunk, or [`MAX_LANES`] when the chunk is a larger
    /// multiple of it (a value of `32 x 4096` `f32` lanes is 512 KiB, and libtpu keeps the
    /// body's values in 16 MiB of scoped VMEM).
    pub fn lanes(&self) -> u32 {
        if self.width > MAX_LANES && self.width.is_multiple_of(MAX_LANES) {
            MAX_LANES
        } else {
            self.width
        }
    }

    /// Grid steps over a chunk: `width / lanes`.
    pub fn lane_blocks(&self) -> u32 {
        self.width / self.lanes().max(1)
    }

    /// Columns of `w`'s window: 1 for a per-work-item array, else [`Self::lanes`].
    pub fn block_width(&self, w: &Window) -> u32 {
        if w.width == self.width {
            self.lanes()
        } else {
            1
        }
    }
}

/// The widest chunk window.
pub(super) const MAX_LANES: u32 = 512;

/// The chunk loop's bounds: `start = C * work_item`, `end = select(start < P, min(start + C,
/// P), start)`.
struct ChunkLoop {
    chunk: u32,
    limit: ParamId,
}

struct Lowering<'k> {
    k: &'k Kernel,
    shapes: &'k Shapes,
    work_item: Option<Value>,
    loop_index: Option<Value>,
    chunk: Option<ChunkLoop>,
    /// Window of each parameter.
    windows: HashMap<usize, usize>,
    program: TileProgram,
    /// Lowered values: `(value, shape)` to node.
    memo: HashMap<(usize, Shape), usize>,
    /// The current tile of each written window (a load after a store reads it).
    stored: HashMap<usize, usize>,
}

/// Lowers `k` at `shapes` to its tile program, or refuses it naming the first construct
/// outside the row-chunk class.
pub(super) fn tile_program(k: &Kernel, shapes: &Shapes) -> Result<TileProgram> {
    let rows = shapes.grid.div_ceil(STEP_ROWS).max(1) * STEP_ROWS;
    let mut l = Lowering {
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
            windows: Vec::new(),
            nodes: Vec::new(),
            stores: Vec::new(),
        },
        memo: HashMap::new(),
        stored: HashMap::new(),
    };
    l.top(&k.body)?;
    if l.chunk.is_none() {
        return Err(refuse(k, "a kernel without a chunk loop"));
    }
    l.program.windows.sort_by_key(|w| w.param);
    let order: HashMap<usize, usize> = l
        .program
        .windows
        .iter()
        .enumerate()
        .map(|(i, w)| (w.param, i))
        .collect();
    // Renumber the windows to parameter order.
    let old: HashMap<usize, usize> = l.windows.iter().map(|(p, w)| (*w, order[p])).collect();
    for n in &mut l.program.nodes {
        if let VOp::Load { window } = &mut n.op {
            *window = old[window];
        }
    }
    for (w, _) in &mut l.program.stores {
        *w = old[w];
    }
    Ok(l.program)
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

    fn is_work_item(&self, v: Value) -> bool {
        matches!(self.def(v), Ok(Op::WorkItem))
    }

    /// `start = C * work_item` and `end = select(start < P, min(start + C, P), start)`.
    fn chunk_bounds(&self, start: Value, end: Value) -> Option<ChunkLoop> {
        let chunk = match self.def(start).ok()? {
            Op::Binary(BinaryOp::Mul, a, b) if self.is_work_item(*a) => self.const_u32(*b)?,
            Op::Binary(BinaryOp::Mul, a, b) if self.is_work_item(*b) => self.const_u32(*a)?,
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
            .then_some(ChunkLoop { chunk, limit })
    }

    fn top(&mut self, body: &[Stmt]) -> Result<()> {
        for stmt in body {
            match stmt {
                Stmt::Let(v) => {
                    if matches!(self.def(*v)?, Op::WorkItem) {
                        self.work_item = Some(*v);
                    }
                    self.eager_load(*v)?;
                }
                Stmt::For {
                    index,
                    start,
                    end,
                    step,
                    body,
                } => {
                    if self.chunk.is_some() {
                        return Err(refuse(self.k, "a second loop"));
                    }
                    let bounds = self.chunk_bounds(*start, *end).filter(|_| *step == 1);
                    let Some(bounds) = bounds else {
                        return Err(refuse(
                            self.k,
                            "a loop other than `for i in C*w..min(C*w + C, n)` over the work \
                             item's chunk",
                        ));
                    };
                    self.program.width = bounds.chunk;
                    self.chunk = Some(bounds);
                    self.loop_index = Some(*index);
                    self.loop_body(body)?;
                }
                Stmt::Store { .. } => {
                    return Err(refuse(self.k, "a store outside the chunk loop"));
                }
                other => return Err(refuse(self.k, stmt_name(other))),
            }
        }
        Ok(())
    }

    fn loop_body(&mut self, body: &[Stmt]) -> Result<()> {
        for stmt in body {
            match stmt {
                Stmt::Let(v) => self.eager_load(*v)?,
                Stmt::Store {
                    buf,
                    index,
                    value,
                    rounding,
                } => {
                    if Some(*index) != self.loop_index {
                        return Err(refuse(
                            self.k,
                            &format!(
                                "a store to {} at an index other than the loop index",
                                self.param_name(*buf)
                            ),
                        ));
                    }
                    let w = self.window(*buf, Shape::Chunk)?;
                    self.program.windows[w].written = true;
                    let v = self.get(*value, Shape::Chunk)?;
                    let dtype = self.program.windows[w].dtype;
                    let bits = self.narrow(v, dtype, *rounding)?;
                    self.program.stores.push((w, bits));
                    self.stored.insert(w, bits);
                }
                other => return Err(refuse(self.k, stmt_name(other))),
            }
        }
        Ok(())
    }

    /// Loads are lowered where they stand (a later store may change the buffer); a load at
    /// an index of another form is refused only if a store uses it.
    fn eager_load(&mut self, v: Value) -> Result<()> {
        if let Op::Load { index, .. } = self.def(v)? {
            let index = *index;
            let shape = if Some(index) == self.loop_index {
                Shape::Chunk
            } else if Some(index) == self.work_item {
                Shape::Row
            } else {
                return Ok(());
            };
            self.get(v, shape)?;
        }
        Ok(())
    }

    /// The window of buffer `p` seen at `shape` (`Row` or `Chunk`).
    fn window(&mut self, p: ParamId, shape: Shape) -> Result<usize> {
        let width = match shape {
            Shape::Chunk => self.program.width,
            _ => 1,
        };
        if let Some(&w) = self.windows.get(&p.index()) {
            if self.program.windows[w].width != width {
                return Err(refuse(
                    self.k,
                    &format!(
                        "{} read both per work item and per chunk element",
                        self.param_name(p)
                    ),
                ));
            }
            return Ok(w);
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
        if shape == Shape::Chunk {
            // The chunk buffers are sized by the loop's limit, so the lanes past it are the
            // arrays' padding: no lane needs a mask.
            let limit = self.chunk.as_ref().map(|c| c.limit);
            if dims.as_slice() != [Dim::Param(limit.unwrap_or(p))] {
                return Err(refuse(
                    self.k,
                    &format!(
                        "{} is not sized by the loop's limit {}",
                        param.name,
                        limit.map_or("?", |l| self.param_name(l))
                    ),
                ));
            }
        }
        if elements as u64 > u64::from(self.shapes.grid) * u64::from(width) {
            return Err(refuse(
                self.k,
                &format!(
                    "a grid of {} work items that does not cover the {elements} elements of {}",
                    self.shapes.grid, param.name
                ),
            ));
        }
        if matches!(dtype, DType::F16) {
            return Err(refuse(self.k, &format!("the f16 buffer {}", param.name)));
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
        });
        if *access == Access::ReadWrite {
            // Its old contents are an input even where the program only stores.
            self.program.windows[w].read = true;
        }
        self.windows.insert(p.index(), w);
        Ok(w)
    }

    fn push(&mut self, op: VOp, shape: Shape, elt: Elt) -> usize {
        self.program.nodes.push(Node { op, shape, elt });
        self.program.nodes.len() - 1
    }

    fn konst(&mut self, bits: u32, elt: Elt, shape: Shape) -> usize {
        self.push(VOp::Const { bits, elt }, shape, elt)
    }

    fn node_shape(&self, n: usize) -> Shape {
        self.program.nodes[n].shape
    }

    fn node_elt(&self, n: usize) -> Elt {
        self.program.nodes[n].elt
    }

    /// Node `n` at `shape` (a `Row` broadcast across the chunk).
    fn widen(&mut self, n: usize, shape: Shape) -> usize {
        if self.node_shape(n) == Shape::Row && shape == Shape::Chunk {
            let elt = self.node_elt(n);
            self.push(VOp::Broadcast(n), Shape::Chunk, elt)
        } else {
            n
        }
    }

    /// The natural shape of `v`: where its loads are.
    fn natural(&self, v: Value) -> Result<Shape> {
        Ok(match self.def(v)? {
            Op::Const(_) => Shape::Uniform,
            Op::Load { index, .. } => {
                if Some(*index) == self.loop_index {
                    Shape::Chunk
                } else {
                    Shape::Row
                }
            }
            op => {
                let mut s = Shape::Uniform;
                for o in op.operands() {
                    s = s.max(self.natural(o)?);
                }
                s
            }
        })
    }

    /// Value `v` as a node of at least `shape` (constants at exactly `shape`).
    fn get(&mut self, v: Value, shape: Shape) -> Result<usize> {
        let at = self.natural(v)?.max(shape);
        if let Some(&n) = self.memo.get(&(v.index(), at)) {
            return Ok(n);
        }
        let own = self.natural(v)?;
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
                let shape = if Some(index) == self.loop_index {
                    Shape::Chunk
                } else if Some(index) == self.work_item {
                    Shape::Row
                } else {
                    return Err(refuse(
                        self.k,
                        &format!(
                            "a load of {} at an index other than the work item or the loop index",
                            self.param_name(buf)
                        ),
                    ));
                };
                let w = self.window(buf, shape)?;
                if let Some(&s) = self.stored.get(&w) {
                    return Ok(self.widen_stored(s, w));
                }
                self.program.windows[w].read = true;
                let dtype = self.program.windows[w].dtype;
                let raw_elt = if dtype == DType::F32 {
                    Elt::F32
                } else {
                    Elt::I32
                };
                let raw = self.push(VOp::Load { window: w }, shape, raw_elt);
                match dtype {
                    DType::BF16 => {
                        let sixteen = self.konst(16, Elt::I32, shape);
                        let bits = self.push(VOp::Bin(Bin::Shl, raw, sixteen), shape, Elt::I32);
                        self.push(VOp::Bitcast(bits, Elt::F32), shape, Elt::F32)
                    }
                    _ => raw,
                }
            }
            Op::Lookup { table, index } => {
                let i = self.get(index, at)?;
                self.lookup(table, i, at)?
            }
            Op::Unary(u, a) => {
                let a = self.get(a, at)?;
                self.unary(u, a, ty, at)?
            }
            Op::Binary(b, x, y) => {
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
            Op::Bitcast { value, to } => {
                let a = self.get(value, at)?;
                if elt_of(to) == self.node_elt(a) {
                    a
                } else {
                    self.push(VOp::Bitcast(a, elt_of(to)), at, elt_of(to))
                }
            }
            Op::WorkItem => return Err(refuse(self.k, "the work item index used as a value")),
            Op::LoopIndex => return Err(refuse(self.k, "the loop index used as a value")),
            Op::Param(p) => {
                return Err(refuse(
                    self.k,
                    &format!(
                        "the scalar parameter {} used as a value",
                        self.param_name(p)
                    ),
                ))
            }
            other => return Err(refuse(self.k, op_name(&other))),
        })
    }

    /// A stored tile read back by a later load (the store's bits widened as a load would).
    fn widen_stored(&mut self, bits: usize, w: usize) -> usize {
        let shape = self.node_shape(bits);
        match self.program.windows[w].dtype {
            DType::BF16 => {
                let sixteen = self.konst(16, Elt::I32, shape);
                let b = self.push(VOp::Bin(Bin::Shl, bits, sixteen), shape, Elt::I32);
                self.push(VOp::Bitcast(b, Elt::F32), shape, Elt::F32)
            }
            DType::U8 => {
                let ff = self.konst(0xff, Elt::I32, shape);
                self.push(VOp::Bin(Bin::AndI, bits, ff), shape, Elt::I32)
            }
            DType::I8 => {
                let s = self.konst(24, Elt::I32, shape);
                let up = self.push(VOp::Bin(Bin::Shl, bits, s), shape, Elt::I32);
                self.push(VOp::Bin(Bin::ShrS, up, s), shape, Elt::I32)
            }
            _ => bits,
        }
    }

    /// The node a store of `v` into a `dtype` window writes: `f32` stays, `bf16` becomes its
    /// rounded bits in the low half of an `i32` (`docs/semantics.md`, section 4: nearest even;
    /// a NaN stays a NaN), integers keep their bits (the printers truncate to the dtype).
    fn narrow(&mut self, v: usize, dtype: DType, rounding: Option<Rounding>) -> Result<usize> {
        let shape = self.node_shape(v);
        match dtype {
            DType::BF16 => {
                if rounding != Some(Rounding::NearestEven) {
                    return Err(refuse(self.k, "a bf16 store without `rne`"));
                }
                let bits = self.push(VOp::Bitcast(v, Elt::I32), shape, Elt::I32);
                let c16 = self.konst(16, Elt::I32, shape);
                let hi = self.push(VOp::Bin(Bin::ShrU, bits, c16), shape, Elt::I32);
                let one = self.konst(1, Elt::I32, shape);
                let lsb = self.push(VOp::Bin(Bin::AndI, hi, one), shape, Elt::I32);
                let half = self.konst(0x7fff, Elt::I32, shape);
                let biased = self.push(VOp::Bin(Bin::AddI, bits, half), shape, Elt::I32);
                let biased = self.push(VOp::Bin(Bin::AddI, biased, lsb), shape, Elt::I32);
                let rounded = self.push(VOp::Bin(Bin::ShrU, biased, c16), shape, Elt::I32);
                // A NaN keeps its sign and top payload bits, made quiet.
                let quiet = self.konst(0x40, Elt::I32, shape);
                let nan_bits = self.push(VOp::Bin(Bin::OrI, hi, quiet), shape, Elt::I32);
                let nan = self.float_ne(v, v, shape);
                Ok(self.push(VOp::Select(nan, nan_bits, rounded), shape, Elt::I32))
            }
            DType::F32 | DType::U32 | DType::I32 | DType::U8 | DType::I8 => Ok(v),
            DType::F16 => Err(refuse(self.k, "a store to an f16 buffer")),
        }
    }

    /// `table[min(i, len - 1)]` as a tree of selects on the index bits: the table is padded
    /// to a power of two with its last entry, level `b` picks by bit `b`.
    fn lookup(&mut self, table: TableId, i: usize, at: Shape) -> Result<usize> {
        let t = self
            .k
            .tables
            .try_get(table)
            .ok_or_else(|| refuse(self.k, "a missing table"))?
            .clone();
        if t.data.len() > super::MAX_TABLE {
            return Err(refuse(
                self.k,
                &format!(
                    "the table {} of {} entries (at most {} are selected by compares)",
                    t.name,
                    t.data.len(),
                    super::MAX_TABLE
                ),
            ));
        }
        let last = self.konst(t.data.len() as u32 - 1, Elt::I32, at);
        let i = self.pick(Pred::Ult, last, i, at);
        let size = t.data.len().next_power_of_two();
        let zero = self.konst(0, Elt::I32, at);
        let bits: Vec<usize> = (0..size.trailing_zeros())
            .map(|bit| {
                let mask = self.konst(1 << bit, Elt::I32, at);
                let b = self.push(VOp::Bin(Bin::AndI, i, mask), at, Elt::I32);
                self.push(VOp::Cmp(Pred::Ne, b, zero), at, Elt::I1)
            })
            .collect();
        Ok(self.select_tree(&t.data, elt_of(t.ty), &bits, 0, size, at))
    }

    /// Entries `first .. first + size` of `data` (the last entry past its end) selected by
    /// `bits`, depth first, so that only one path's values are live at a time (breadth first,
    /// a 256-entry table held 128 tiles at once: more than libtpu's scoped VMEM at 1024 lanes).
    fn select_tree(
        &mut self,
        data: &[u32],
        elt: Elt,
        bits: &[usize],
        first: usize,
        size: usize,
        at: Shape,
    ) -> usize {
        if size == 1 {
            return self.konst(data[first.min(data.len() - 1)], elt, at);
        }
        let half = size / 2;
        let low = self.select_tree(data, elt, bits, first, half, at);
        let high = self.select_tree(data, elt, bits, first + half, half, at);
        let set = bits[half.trailing_zeros() as usize];
        self.push(VOp::Select(set, high, low), at, elt)
    }

    /// The IR's float `ne` (true with a NaN): `not (x oeq y)`.
    fn float_ne(&mut self, x: usize, y: usize, at: Shape) -> usize {
        let eq = self.push(VOp::Cmp(Pred::Oeq, x, y), at, Elt::I1);
        let t = self.konst(1, Elt::I1, at);
        self.push(VOp::Bin(Bin::XorI, eq, t), at, Elt::I1)
    }

    /// `select(y pred x, y, x)`: the IR's `min`/`max` (Mosaic legalizes no integer min).
    fn pick(&mut self, p: Pred, y: usize, x: usize, at: Shape) -> usize {
        let elt = self.node_elt(x);
        let c = self.push(VOp::Cmp(p, y, x), at, Elt::I1);
        self.push(VOp::Select(c, y, x), at, elt)
    }

    fn unary(&mut self, u: UnaryOp, a: usize, ty: ScalarType, at: Shape) -> Result<usize> {
        Ok(match (u, ty) {
            (UnaryOp::Neg | UnaryOp::Abs, ScalarType::F32) => {
                let bits = self.push(VOp::Bitcast(a, Elt::I32), at, Elt::I32);
                let (op, mask) = if u == UnaryOp::Neg {
                    (Bin::XorI, 0x8000_0000)
                } else {
                    (Bin::AndI, 0x7fff_ffff)
                };
                let m = self.konst(mask, Elt::I32, at);
                let r = self.push(VOp::Bin(op, bits, m), at, Elt::I32);
                self.push(VOp::Bitcast(r, Elt::F32), at, Elt::F32)
            }
            (UnaryOp::Neg, _) => {
                let zero = self.konst(0, Elt::I32, at);
                self.push(VOp::Bin(Bin::SubI, zero, a), at, Elt::I32)
            }
            (UnaryOp::Abs, ScalarType::I32) => {
                let zero = self.konst(0, Elt::I32, at);
                let neg = self.push(VOp::Bin(Bin::SubI, zero, a), at, Elt::I32);
                let lt = self.push(VOp::Cmp(Pred::Slt, a, zero), at, Elt::I1);
                self.push(VOp::Select(lt, neg, a), at, Elt::I32)
            }
            (UnaryOp::Not, ScalarType::Bool) => {
                let t = self.konst(1, Elt::I1, at);
                self.push(VOp::Bin(Bin::XorI, a, t), at, Elt::I1)
            }
            (UnaryOp::Not, _) => {
                let ones = self.konst(u32::MAX, Elt::I32, at);
                self.push(VOp::Bin(Bin::XorI, a, ones), at, Elt::I32)
            }
            _ => return Err(refuse(self.k, &format!("{u:?} on {ty:?}").to_lowercase())),
        })
    }

    fn binary(
        &mut self,
        b: BinaryOp,
        x: usize,
        y: usize,
        ty: ScalarType,
        at: Shape,
    ) -> Result<usize> {
        let float = ty == ScalarType::F32;
        let signed = ty == ScalarType::I32;
        let elt = elt_of(ty);
        let op = match b {
            BinaryOp::Add if float => Bin::AddF,
            BinaryOp::Sub if float => Bin::SubF,
            BinaryOp::Mul if float => Bin::MulF,
            BinaryOp::Min | BinaryOp::Max => {
                // `min(a, b) = select(b < a, b, a)`, `max(a, b) = select(b > a, b, a)` in the
                // type's order (the IR's float definition; Mosaic has no unsigned min).
                let p = match (b, ty) {
                    (BinaryOp::Min, ScalarType::F32) => Pred::Olt,
                    (BinaryOp::Min, ScalarType::I32) => Pred::Slt,
                    (BinaryOp::Min, _) => Pred::Ult,
                    (_, ScalarType::F32) => Pred::Ogt,
                    (_, ScalarType::I32) => Pred::Sgt,
                    _ => Pred::Ugt,
                };
                return Ok(self.pick(p, y, x, at));
            }
            BinaryOp::Add => Bin::AddI,
            BinaryOp::Sub => Bin::SubI,
            BinaryOp::Mul => Bin::MulI,
            BinaryOp::And => Bin::AndI,
            BinaryOp::Or => Bin::OrI,
            BinaryOp::Xor => Bin::XorI,
            BinaryOp::Shl | BinaryOp::Shr => {
                // Shift amounts are taken modulo 32 (Mosaic's shifts past the width are
                // poison).
                let m = self.konst(31, Elt::I32, at);
                let s = self.push(VOp::Bin(Bin::AndI, y, m), at, Elt::I32);
                let op = match (b, signed) {
                    (BinaryOp::Shl, _) => Bin::Shl,
                    (_, true) => Bin::ShrS,
                    _ => Bin::ShrU,
                };
                return Ok(self.push(VOp::Bin(op, x, s), at, Elt::I32));
            }
            other => {
                return Err(refuse(
                    self.k,
                    &format!("{other:?} on {ty:?}").to_lowercase(),
                ))
            }
        };
        if float && !matches!(op, Bin::AddF | Bin::SubF | Bin::MulF) {
            return Err(refuse(self.k, &format!("{b:?} on f32").to_lowercase()));
        }
        Ok(self.push(VOp::Bin(op, x, y), at, elt))
    }
}

fn elt_of(ty: ScalarType) -> Elt {
    match ty {
        ScalarType::F32 => Elt::F32,
        ScalarType::Bool => Elt::I1,
        _ => Elt::I32,
    }
}

fn pred(c: CmpOp, ty: ScalarType) -> Pred {
    match (ty, c) {
        (ScalarType::F32, CmpOp::Eq | CmpOp::Ne) => Pred::Oeq,
        (ScalarType::F32, CmpOp::Lt) => Pred::Olt,
        (ScalarType::F32, CmpOp::Le) => Pred::Ole,
        (ScalarType::F32, CmpOp::Gt) => Pred::Ogt,
        (ScalarType::F32, CmpOp::Ge) => Pred::Oge,
        (_, CmpOp::Eq) => Pred::Eq,
        (_, CmpOp::Ne) => Pred::Ne,
        (ScalarType::I32, CmpOp::Lt) => Pred::Slt,
        (ScalarType::I32, CmpOp::Le) => Pred::Sle,
        (ScalarType::I32, CmpOp::Gt) => Pred::Sgt,
        (ScalarType::I32, CmpOp::Ge) => Pred::Sge,
        (_, CmpOp::Lt) => Pred::Ult,
        (_, CmpOp::Le) => Pred::Ule,
        (_, CmpOp::Gt) => Pred::Ugt,
        (_, CmpOp::Ge) => Pred::Uge,
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
        Op::Fma(..) => "fma (no exact f32-only form on TPU yet)",
        Op::Unary(UnaryOp::Sqrt, _) => "sqrt",
        Op::Binary(BinaryOp::Div, ..) => "div",
        Op::Binary(BinaryOp::Rem, ..) => "rem",
        Op::Binary(BinaryOp::MulHi, ..) => "mul_hi",
        Op::SearchSorted { .. } => "search_sorted",
        Op::Reduce { .. } => "reduce",
        Op::FloatToInt { .. } => "float_to_int",
        Op::IntToFloat { .. } => "int_to_float",
        Op::ReadVar(_) => "read_var",
        _ => "an op",
    }
}
