//! Prints a tile program as a Mosaic module in the Pallas convention: one `func.func` with
//! the grid index and one VMEM memref per window (inputs, then outputs), the attributes
//! `dimension_semantics`, `iteration_bounds`, `scalar_prefetch`, `scratch_operands`,
//! `tpu.core_type` and `window_params`, and one index map `@transform_0`.

use std::fmt::Write;

use qforge_ir::DType;

use super::tile::{Bin, Elt, Node, Pred, Shape, TileProgram, VOp, WindowKind};
use super::STEP_ROWS;

/// The name of node `i`'s window elements as loaded (see [`Printer::widen`]).
pub(super) fn raw_name(i: usize, dtype: DType) -> String {
    match dtype {
        DType::F32 | DType::U32 | DType::I32 => format!("%v{i}"),
        _ => format!("%v{i}_raw"),
    }
}

/// The memref element type of a window of `dtype`: `f16` as its bits (`i16`), since libtpu
/// neither stores `f16` vectors (v5e) nor casts them to `i16` (v6e).
pub(super) fn mem_elt(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "f32",
        DType::F16 => "i16",
        DType::BF16 => "bf16",
        DType::U8 | DType::I8 => "i8",
        DType::U32 | DType::I32 => "i32",
    }
}

pub(super) fn elt(e: Elt) -> &'static str {
    match e {
        Elt::I32 => "i32",
        Elt::F32 => "f32",
        Elt::I1 => "i1",
    }
}

pub(super) struct Printer<'p> {
    pub(super) p: &'p TileProgram,
    pub(super) out: String,
    /// The function argument of each window: (input, output).
    pub(super) args: Vec<(Option<String>, Option<String>)>,
    /// The pairs nodes already viewed as `[R, L, 2]` (`%v{a}_split`).
    split: std::collections::HashSet<usize>,
}

impl<'p> Printer<'p> {
    pub(super) fn new(p: &'p TileProgram) -> Self {
        Printer {
            p,
            out: String::new(),
            args: Vec::new(),
            split: Default::default(),
        }
    }

    pub(super) fn vty(&self, shape: Shape, e: &str) -> String {
        format!(
            "vector<{}x{}x{e}>",
            self.p.rows_of(shape),
            self.p.columns(shape)
        )
    }

    /// `%v{i}` of type `ty` from [`raw_name`], a window's elements of `dtype` at `shape` as
    /// loaded: 4-byte elements as they are (the raw name is `%v{i}`), 8-bit integers and
    /// `f16` widened to `i32`, `bf16` as its bits.
    pub(super) fn widen(&mut self, i: usize, dtype: DType, shape: Shape, ty: &str) {
        let raw = self.vty(shape, mem_elt(dtype));
        match dtype {
            DType::F32 | DType::U32 | DType::I32 => {}
            DType::U8 | DType::I8 | DType::F16 => {
                let ext = if dtype == DType::I8 { "extsi" } else { "extui" };
                self.line(format!("%v{i} = arith.{ext} %v{i}_raw : {raw} to {ty}"));
            }
            DType::BF16 => {
                let half = self.vty(shape, "i16");
                self.line(format!(
                    "%v{i}_half = arith.bitcast %v{i}_raw : {raw} to {half}"
                ));
                self.line(format!("%v{i} = arith.extui %v{i}_half : {half} to {ty}"));
            }
        }
    }

    pub(super) fn mem(&self, window: usize) -> String {
        let w = &self.p.windows[window];
        let dims: Vec<String> = self.p.block_shape(w).iter().map(u32::to_string).collect();
        format!(
            "memref<{}x{}, #tpu.memory_space<vmem>>",
            dims.join("x"),
            mem_elt(w.dtype)
        )
    }

    /// `%v{i}_bits`, the 32-bit window `window` (`1 x n`) as `i32` lanes, loaded.
    fn fixed_bits(&mut self, i: usize, window: usize) -> String {
        let w = &self.p.windows[window];
        let (n, e) = (self.p.block_width(w), mem_elt(w.dtype));
        let arg = self.args[window].0.clone().unwrap_or_default();
        let mem = self.mem(window);
        self.line(format!(
            "%v{i}_raw = vector.load {arg}[%c0, %c0] : {mem}, vector<1x{n}x{e}>"
        ));
        if e == "i32" {
            return format!("%v{i}_raw");
        }
        self.line(format!(
            "%v{i}_bits = arith.bitcast %v{i}_raw : vector<1x{n}x{e}> to vector<1x{n}xi32>"
        ));
        format!("%v{i}_bits")
    }

    pub(super) fn line(&mut self, s: String) {
        self.out.push_str("    ");
        self.out.push_str(&s);
        self.out.push('\n');
    }

    pub(super) fn node(&mut self, i: usize, n: &Node) {
        let ty = self.vty(n.shape, elt(n.elt));
        let v = |j: usize| format!("%v{j}");
        match &n.op {
            VOp::Load { window } => {
                let dtype = self.p.windows[*window].dtype;
                let arg = self.args[*window].0.clone().unwrap_or_default();
                let raw = self.vty(n.shape, mem_elt(dtype));
                let mem = self.mem(*window);
                let w = &self.p.windows[*window];
                let load = if w.one_row() && !w.fixed() {
                    // One row, broadcast to the step's rows.
                    let row = format!("vector<1x{}x{}>", self.p.columns(n.shape), mem_elt(dtype));
                    self.line(format!(
                        "%v{i}_row = vector.load {arg}[%c0, %c0] : {mem}, {row}"
                    ));
                    format!("vector.broadcast %v{i}_row : {row} to {raw}")
                } else {
                    format!("vector.load {arg}[%c0, %c0] : {mem}, {raw}")
                };
                self.line(format!("{} = {load}", raw_name(i, dtype)));
                self.widen(i, dtype, n.shape, &ty);
            }
            VOp::Const { bits, elt: e } => match e {
                Elt::I32 => self.line(format!(
                    "%v{i} = arith.constant dense<{}> : {ty}",
                    *bits as i32
                )),
                Elt::I1 => self.line(format!(
                    "%v{i} = arith.constant dense<{}> : {ty}",
                    *bits != 0
                )),
                Elt::F32 => {
                    let ity = self.vty(n.shape, "i32");
                    self.line(format!(
                        "%v{i}_bits = arith.constant dense<{}> : {ity}",
                        *bits as i32
                    ));
                    self.line(format!("%v{i} = arith.bitcast %v{i}_bits : {ity} to {ty}"));
                }
            },
            VOp::Broadcast(a) => {
                let from = self.vty(self.p.nodes[*a].shape, elt(n.elt));
                self.line(format!(
                    "%v{i} = vector.broadcast {} : {from} to {ty}",
                    v(*a)
                ));
            }
            VOp::Bin(op, a, b) => {
                let name = match op {
                    Bin::AddI => "addi",
                    Bin::SubI => "subi",
                    Bin::MulI => "muli",
                    Bin::AndI => "andi",
                    Bin::OrI => "ori",
                    Bin::XorI => "xori",
                    Bin::Shl => "shli",
                    Bin::ShrU => "shrui",
                    Bin::ShrS => "shrsi",
                    Bin::AddF => "addf",
                    Bin::SubF => "subf",
                    Bin::MulF => "mulf",
                };
                self.line(format!("%v{i} = arith.{name} {}, {} : {ty}", v(*a), v(*b)));
            }
            VOp::Cmp(pred, a, b) => {
                let (op, p) = match pred {
                    Pred::Eq => ("cmpi", "eq"),
                    Pred::Ne => ("cmpi", "ne"),
                    Pred::Ult => ("cmpi", "ult"),
                    Pred::Ule => ("cmpi", "ule"),
                    Pred::Ugt => ("cmpi", "ugt"),
                    Pred::Uge => ("cmpi", "uge"),
                    Pred::Slt => ("cmpi", "slt"),
                    Pred::Sle => ("cmpi", "sle"),
                    Pred::Sgt => ("cmpi", "sgt"),
                    Pred::Sge => ("cmpi", "sge"),
                    Pred::Oeq => ("cmpf", "oeq"),
                    Pred::Olt => ("cmpf", "olt"),
                    Pred::Ole => ("cmpf", "ole"),
                    Pred::Ogt => ("cmpf", "ogt"),
                    Pred::Oge => ("cmpf", "oge"),
                };
                let operand = self.vty(n.shape, elt(self.p.nodes[*a].elt));
                self.line(format!(
                    "%v{i} = arith.{op} {p}, {}, {} : {operand}",
                    v(*a),
                    v(*b)
                ));
            }
            VOp::Select(c, t, f) if n.elt == Elt::I1 => {
                // libtpu does not lay out a select of `i1` vectors (it widens them to `i8`
                // with an invalid layout): `(c and t) or (not c and f)`.
                let (c, t, f) = (v(*c), v(*t), v(*f));
                self.line(format!("%v{i}_true = arith.constant dense<true> : {ty}"));
                self.line(format!("%v{i}_not = arith.xori {c}, %v{i}_true : {ty}"));
                self.line(format!("%v{i}_then = arith.andi {c}, {t} : {ty}"));
                self.line(format!("%v{i}_else = arith.andi %v{i}_not, {f} : {ty}"));
                self.line(format!("%v{i} = arith.ori %v{i}_then, %v{i}_else : {ty}"));
            }
            VOp::Select(c, t, f) => {
                let cty = self.vty(n.shape, "i1");
                self.line(format!(
                    "%v{i} = arith.select {}, {}, {} : {cty}, {ty}",
                    v(*c),
                    v(*t),
                    v(*f)
                ));
            }
            VOp::Bitcast(a, _) => {
                let from = self.vty(n.shape, elt(self.p.nodes[*a].elt));
                self.line(format!("%v{i} = arith.bitcast {} : {from} to {ty}", v(*a)));
            }
            VOp::MaxLanes(a) => {
                // libtpu takes only the neutral start (`i32::MIN`) as a splat accumulator.
                let from = self.vty(self.p.nodes[*a].shape, "i32");
                self.line(format!(
                    "%v{i}_init = arith.constant dense<-2147483648> : vector<{STEP_ROWS}xi32>"
                ));
                self.line(format!(
                    "%v{i}_max = vector.multi_reduction <maxsi>, {}, %v{i}_init [1] : {from} to vector<{STEP_ROWS}xi32>",
                    v(*a)
                ));
                self.line(format!(
                    "%v{i} = vector.shape_cast %v{i}_max : vector<{STEP_ROWS}xi32> to {ty}"
                ));
            }
            VOp::WorkItem => {
                self.line(format!(
                    "%v{i}_sub = tpu.iota {{dimensions = array<i32: 0>}} : {ty}"
                ));
                self.line(format!("%v{i}_rows = arith.constant {STEP_ROWS} : i32"));
                self.line(format!("%v{i}_first = arith.muli %arg0, %v{i}_rows : i32"));
                self.line(format!(
                    "%v{i}_base = vector.broadcast %v{i}_first : i32 to {ty}"
                ));
                self.line(format!("%v{i} = arith.addi %v{i}_sub, %v{i}_base : {ty}"));
            }
            VOp::Lane => {
                self.line(format!(
                    "%v{i}_lane = tpu.iota {{dimensions = array<i32: 1>}} : {ty}"
                ));
                self.line(format!(
                    "%v{i}_lanes = arith.constant {} : i32",
                    self.p.lanes()
                ));
                self.line(format!("%v{i}_first = arith.muli %arg1, %v{i}_lanes : i32"));
                self.line(format!(
                    "%v{i}_base = vector.broadcast %v{i}_first : i32 to {ty}"
                ));
                self.line(format!("%v{i} = arith.addi %v{i}_lane, %v{i}_base : {ty}"));
            }
            VOp::Gather { window, index } => {
                // One-hot: the entry's bits where the lane is the index, `i32::MIN` elsewhere
                // (libtpu's only start for the max), then the max over the lanes.
                let bits = self.fixed_bits(i, *window);
                let len = self.p.block_width(&self.p.windows[*window]);
                let wide = format!("vector<{STEP_ROWS}x{len}xi32>");
                let row = self.vty(Shape::Row, "i32");
                self.line(format!(
                    "%v{i}_all = vector.broadcast {bits} : vector<1x{len}xi32> to {wide}"
                ));
                self.line(format!(
                    "%v{i}_lane = tpu.iota {{dimensions = array<i32: 1>}} : {wide}"
                ));
                self.line(format!(
                    "%v{i}_at = vector.broadcast {} : {row} to {wide}",
                    v(*index)
                ));
                self.line(format!(
                    "%v{i}_hit = arith.cmpi eq, %v{i}_lane, %v{i}_at : {wide}"
                ));
                self.line(format!(
                    "%v{i}_none = arith.constant dense<-2147483648> : {wide}"
                ));
                self.line(format!(
                    "%v{i}_one = arith.select %v{i}_hit, %v{i}_all, %v{i}_none : vector<{STEP_ROWS}x{len}xi1>, {wide}"
                ));
                self.line(format!(
                    "%v{i}_init = arith.constant dense<-2147483648> : vector<{STEP_ROWS}xi32>"
                ));
                self.line(format!(
                    "%v{i}_max = vector.multi_reduction <maxsi>, %v{i}_one, %v{i}_init [1] : {wide} to vector<{STEP_ROWS}xi32>"
                ));
                let out = if n.elt == Elt::F32 {
                    format!("%v{i}_int")
                } else {
                    format!("%v{i}")
                };
                self.line(format!(
                    "{out} = vector.shape_cast %v{i}_max : vector<{STEP_ROWS}xi32> to {row}"
                ));
                if out != format!("%v{i}") {
                    self.line(format!("%v{i} = arith.bitcast {out} : {row} to {ty}"));
                }
            }
            VOp::Scalar { window } => {
                let w = &self.p.windows[*window];
                let e = mem_elt(w.dtype);
                let arg = self.args[*window].0.clone().unwrap_or_default();
                let mem = self.mem(*window);
                self.line(format!(
                    "%v{i}_raw = vector.load {arg}[%c0, %c0] : {mem}, vector<1x1x{e}>"
                ));
                self.line(format!(
                    "%v{i} = vector.broadcast %v{i}_raw : vector<1x1x{e}> to {ty}"
                ));
            }
            VOp::Interleave(a, b) => {
                // As Pallas lowers `jnp.stack([a, b], -1).reshape(R, 2 * L)`.
                let (l, e) = (self.p.lanes(), elt(n.elt));
                let from = self.vty(Shape::Chunk, e);
                let one = format!("vector<{STEP_ROWS}x{l}x1x{e}>");
                let two = format!("vector<{STEP_ROWS}x{l}x2x{e}>");
                for (x, part) in [(a, "even"), (b, "odd")] {
                    self.line(format!(
                        "%v{i}_{part} = vector.shape_cast {} : {from} to {one}",
                        v(*x)
                    ));
                }
                self.line(format!(
                    "%v{i}_both = tpu.concatenate %v{i}_even, %v{i}_odd in 2 : {one}, {one} -> {two}"
                ));
                self.line(format!(
                    "%v{i} = vector.shape_cast %v{i}_both : {two} to {ty}"
                ));
            }
            VOp::WeightRow
            | VOp::BlockCol
            | VOp::TableGather { .. }
            | VOp::ReductionIndex { .. }
            | VOp::OutRow
            | VOp::OutCol
            | VOp::Spread(_)
            | VOp::PanelBytes { .. }
            | VOp::ColScales { .. }
            | VOp::Staged(_) => super::matmul::text::node(self, i, n),
            VOp::Deinterleave(a, half) => {
                // The inverse of `Interleave`: `[R, 2L]` as `[R, L, 2]`, slice `half` of the
                // last dimension.
                let (l, e) = (self.p.lanes(), elt(n.elt));
                let from = self.vty(Shape::Pairs, e);
                let one = format!("vector<{STEP_ROWS}x{l}x1x{e}>");
                let two = format!("vector<{STEP_ROWS}x{l}x2x{e}>");
                if self.split.insert(*a) {
                    self.line(format!(
                        "%v{a}_split = vector.shape_cast {} : {from} to {two}",
                        v(*a)
                    ));
                }
                self.line(format!(
                    "%v{i}_one = vector.extract_strided_slice %v{a}_split {{offsets = [0, 0, {half}], sizes = [{STEP_ROWS}, {l}, 1], strides = [1, 1, 1]}} : {two} to {one}"
                ));
                self.line(format!(
                    "%v{i} = vector.shape_cast %v{i}_one : {one} to {ty}"
                ));
            }
        }
    }

    pub(super) fn store(&mut self, k: usize, window: usize, node: usize) {
        let dtype = self.p.windows[window].dtype;
        let arg = self.args[window].1.clone().unwrap_or_default();
        let mem = self.mem(window);
        let shape = self.p.nodes[node].shape;
        let value_ty = self.vty(shape, elt(self.p.nodes[node].elt));
        let raw = self.vty(shape, mem_elt(dtype));
        let value = match dtype {
            DType::F32 | DType::U32 | DType::I32 => format!("%v{node}"),
            DType::U8 | DType::I8 | DType::F16 => {
                self.line(format!(
                    "%s{k} = arith.trunci %v{node} : {value_ty} to {raw}"
                ));
                format!("%s{k}")
            }
            DType::BF16 => {
                let half = self.vty(shape, "i16");
                self.line(format!(
                    "%s{k}_half = arith.trunci %v{node} : {value_ty} to {half}"
                ));
                self.line(format!(
                    "%s{k} = arith.bitcast %s{k}_half : {half} to {raw}"
                ));
                format!("%s{k}")
            }
        };
        self.line(format!(
            "tpu.vector_store {arg}[%c0, %c0], {value} {{strides = array<i32>}} : {mem}, {raw},"
        ));
    }
}

/// The Mosaic module of `p` (see the module docs).
pub(super) fn print(p: &TileProgram) -> String {
    if p.matmul.is_some() {
        return super::matmul::text::print(p);
    }
    let mut args = vec![(None, None); p.windows.len()];
    let mut params = vec!["%arg0: i32".to_string(), "%arg1: i32".to_string()];
    // Each window's block (rows, columns) and index map.
    let mut bounds: Vec<(u32, u32, &str)> = Vec::new();
    let map = |w: &super::tile::Window| {
        if w.fixed() {
            "fixed"
        } else if w.by_row() {
            "row"
        } else if w.kind == WindowKind::Cols {
            "cols"
        } else {
            "chunk"
        }
    };
    let mut printer = Printer::new(p);
    let ins = p.windows.iter().enumerate().filter(|(_, w)| w.read);
    let outs = p.windows.iter().enumerate().filter(|(_, w)| w.written);
    for (i, w) in ins {
        let whole = if matches!(w.kind, WindowKind::Whole | WindowKind::WholePairs) {
            "_whole"
        } else {
            ""
        };
        let name = format!("%in_{}{whole}", w.name);
        params.push(format!("{name}: {}", printer.mem(i)));
        bounds.push((p.block_rows(w), p.block_width(w), map(w)));
        args[i].0 = Some(name);
    }
    for (i, w) in outs {
        let name = format!("%out_{}", w.name);
        params.push(format!("{name}: {}", printer.mem(i)));
        bounds.push((p.block_rows(w), p.block_width(w), map(w)));
        args[i].1 = Some(name);
    }
    printer.args = args;
    printer.line("%c0 = arith.constant 0 : index".into());
    for (i, n) in p.nodes.iter().enumerate() {
        printer.node(i, n);
    }
    for (k, (w, n)) in p.stores.iter().enumerate() {
        printer.store(k, *w, *n);
    }
    printer.line("return".into());
    let windows: Vec<String> = bounds
        .iter()
        .map(|&(rows, columns, map)| {
            format!(
                "{{transform_indices = @transform_{map}, window_bounds = array<i64: {rows}, {columns}>}}"
            )
        })
        .collect();
    // A per-work-item output is written by every lane block of its rows: those steps must
    // run in order on one core, not be split across cores.
    let lanes_semantics = if p.windows.iter().any(|w| w.written && w.by_row()) {
        "arbitrary"
    } else {
        "parallel"
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "// qforge kernel {} (Mosaic, {} x {} steps of {STEP_ROWS} rows x {} lanes)",
        p.name,
        p.steps(),
        p.lane_blocks(),
        p.lanes()
    );
    let _ = writeln!(
        out,
        "module attributes {{stable_mosaic.version = 11 : i64}} {{"
    );
    let _ = writeln!(
        out,
        "  func.func @{}({}) attributes {{dimension_semantics = [#tpu.dimension_semantics<parallel>, \
         #tpu.dimension_semantics<{}>], iteration_bounds = array<i64: {}, {}>, scalar_prefetch = 0 : i64, scratch_operands = 0 : i64, \
         tpu.core_type = #tpu.core_type<tc>, window_params = [{}]}} {{",
        p.name,
        params.join(", "),
        lanes_semantics,
        p.steps(),
        p.lane_blocks(),
        windows.join(", ")
    );
    out.push_str(&printer.out);
    out.push_str("  }\n");
    out.push_str(
        "  func.func @transform_chunk(%arg0: i32, %arg1: i32) -> (i32, i32) {\n    \
         return %arg0, %arg1 : i32, i32\n  }\n  \
         func.func @transform_row(%arg0: i32, %arg1: i32) -> (i32, i32) {\n    \
         %c0_i32 = arith.constant 0 : i32\n    return %arg0, %c0_i32 : i32, i32\n  }\n",
    );
    if p.windows.iter().any(|w| w.kind == WindowKind::Cols) {
        out.push_str(
            "  func.func @transform_cols(%arg0: i32, %arg1: i32) -> (i32, i32) {\n    \
             %c0_i32 = arith.constant 0 : i32\n    return %c0_i32, %arg1 : i32, i32\n  }\n",
        );
    }
    if p.windows.iter().any(|w| w.fixed()) {
        out.push_str(
            "  func.func @transform_fixed(%arg0: i32, %arg1: i32) -> (i32, i32) {\n    \
             %c0_i32 = arith.constant 0 : i32\n    return %c0_i32, %c0_i32 : i32, i32\n  }\n",
        );
    }
    out.push_str("}\n");
    out
}
