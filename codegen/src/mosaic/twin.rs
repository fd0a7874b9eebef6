//! Prints a tile program as its StableHLO twin: the grid as a `stablehlo.while` over steps,
//! each window a `dynamic_slice` of its array at row `step * STEP_ROWS`, each vector op the
//! StableHLO op of the same lane-wise meaning, each store a `dynamic_update_slice`. The
//! signature is the StableHLO backend's (each parameter as raw bits: `tensor<n x ui8|ui16|ui32>`,
//! a scalar `tensor<ui32>`; results the final raw contents of the writable buffers in parameter
//! order), so the `stablehlo` device's runner evaluates it with the reference interpreter.
//! Lanes hold `i32` values as `ui32` (signed ops reinterpret them as `i32`).

use std::fmt::Write;

use qforge_ir::{Access, DType, Kernel, ParamKind};

use super::tile::{Bin, Elt, Node, Pred, Shape, TileProgram, VOp, WindowKind};
use super::{Shapes, STEP_ROWS};

/// The raw element type of a buffer of `dtype` in the signature.
pub(super) fn raw(dtype: DType) -> &'static str {
    match dtype.size_bytes() {
        1 => "ui8",
        2 => "ui16",
        _ => "ui32",
    }
}

pub(super) fn elt(e: Elt) -> &'static str {
    match e {
        Elt::I32 => "ui32",
        Elt::F32 => "f32",
        Elt::I1 => "i1",
    }
}

pub(super) struct Printer<'p> {
    pub(super) p: &'p TileProgram,
    pub(super) out: String,
    pub(super) indent: &'static str,
    /// The array of each window (its old contents).
    pub(super) arrays: Vec<String>,
    /// A matmul's block of each window: its first row and column (`i32` scalars).
    pub(super) starts: Vec<(String, String)>,
}

/// The name of node `i`'s window elements as loaded (see [`Printer::widen`]).
pub(super) fn raw_name(i: usize, dtype: DType) -> String {
    match dtype {
        DType::U32 | DType::I32 => format!("%v{i}"),
        _ => format!("%v{i}_raw"),
    }
}

impl<'p> Printer<'p> {
    pub(super) fn new(p: &'p TileProgram, indent: &'static str, arrays: Vec<String>) -> Self {
        Printer {
            p,
            out: String::new(),
            indent,
            arrays,
            starts: Vec::new(),
        }
    }

    pub(super) fn tty(&self, shape: Shape, e: &str) -> String {
        format!(
            "tensor<{}x{}x{e}>",
            self.p.rows_of(shape),
            self.p.columns(shape)
        )
    }

    pub(super) fn line(&mut self, s: String) {
        self.out.push_str(self.indent);
        self.out.push_str(&s);
        self.out.push('\n');
    }

    /// `%v{i}`, a value of `shape` and type `elt`, from the `ui32` bits `%v{i}_{from}` of
    /// type `from_ty` (reshaped to `shape`, then reinterpreted as `f32` where `elt` is).
    fn bits_as(&mut self, i: usize, shape: Shape, elt: Elt, from: &str, from_ty: &str) {
        let row = self.tty(shape, "ui32");
        let bits = if elt == Elt::F32 {
            format!("%v{i}_row")
        } else {
            format!("%v{i}")
        };
        self.line(format!(
            "{bits} = stablehlo.reshape %v{i}_{from} : ({from_ty}) -> {row}"
        ));
        if elt == Elt::F32 {
            let f = self.tty(shape, "f32");
            self.line(format!(
                "%v{i} = stablehlo.bitcast_convert {bits} : ({row}) -> {f}"
            ));
        }
    }

    /// `%v{i}_s` = node `a` (of `shape`) reinterpreted as `i32`.
    fn signed(&mut self, name: &str, a: usize, shape: Shape) -> String {
        let (u, s) = (self.tty(shape, "ui32"), self.tty(shape, "i32"));
        self.line(format!(
            "{name} = stablehlo.bitcast_convert %v{a} : ({u}) -> {s}"
        ));
        name.to_string()
    }

    /// `%v{i}` of type `ty` from [`raw_name`], a window's raw elements of `dtype` at `shape`
    /// (a 4-byte integer's raw tile is `%v{i}` itself: nothing to do).
    pub(super) fn widen(&mut self, i: usize, dtype: DType, shape: Shape, ty: &str) {
        let rt = self.tty(shape, raw(dtype));
        match dtype {
            DType::U32 | DType::I32 => {}
            DType::F32 => self.line(format!(
                "%v{i} = stablehlo.bitcast_convert %v{i}_raw : ({rt}) -> {ty}"
            )),
            DType::I8 => {
                let s8 = self.tty(shape, "i8");
                let s32 = self.tty(shape, "i32");
                self.line(format!(
                    "%v{i}_s8 = stablehlo.bitcast_convert %v{i}_raw : ({rt}) -> {s8}"
                ));
                self.line(format!(
                    "%v{i}_s32 = stablehlo.convert %v{i}_s8 : ({s8}) -> {s32}"
                ));
                self.line(format!(
                    "%v{i} = stablehlo.bitcast_convert %v{i}_s32 : ({s32}) -> {ty}"
                ));
            }
            _ => self.line(format!(
                "%v{i} = stablehlo.convert %v{i}_raw : ({rt}) -> {ty}"
            )),
        }
    }

    pub(super) fn node(&mut self, i: usize, n: &Node) {
        let ty = self.tty(n.shape, elt(n.elt));
        match &n.op {
            VOp::Load { window } => {
                let w = &self.p.windows[*window];
                let (dtype, width, block) = (w.dtype, w.width, self.p.block_width(w));
                let (block_rows, array_rows) = (self.p.block_rows(w), self.p.array_rows(w));
                let (row, col) = match (self.starts.get(*window), w.kind) {
                    (Some((r, c)), _) => (r.clone(), c.clone()),
                    (None, _) if w.by_row() => ("%start".into(), "%zero".into()),
                    (None, WindowKind::Pairs) => ("%start".into(), "%pair_col".into()),
                    _ => ("%start".into(), "%col".into()),
                };
                let rt = self.tty(n.shape, raw(dtype));
                let array = self.arrays[*window].clone();
                // A 4-byte integer tile is already the node; others are converted from `_raw`.
                let name = raw_name(i, dtype);
                if w.one_row() && !w.fixed() {
                    // The lane block of the one-row array, broadcast to the step's rows.
                    let r = raw(dtype);
                    self.line(format!(
                        "%v{i}_row = stablehlo.dynamic_slice {array}, %c0, {col}, sizes = [1, {block}] : (tensor<1x{width}x{r}>, tensor<i32>, tensor<i32>) -> tensor<1x{block}x{r}>"
                    ));
                    self.line(format!(
                        "{name} = stablehlo.broadcast_in_dim %v{i}_row, dims = [0, 1] : (tensor<1x{block}x{r}>) -> {rt}"
                    ));
                } else {
                    self.line(format!(
                        "{name} = stablehlo.dynamic_slice {array}, {row}, {col}, sizes = [{block_rows}, {block}] : (tensor<{array_rows}x{width}x{}>, tensor<i32>, tensor<i32>) -> {rt}",
                        raw(dtype)
                    ));
                }
                self.widen(i, dtype, n.shape, &ty);
            }
            VOp::Const { bits, elt: e } => match e {
                Elt::I32 => self.line(format!("%v{i} = stablehlo.constant dense<{bits}> : {ty}")),
                Elt::I1 => self.line(format!(
                    "%v{i} = stablehlo.constant dense<{}> : {ty}",
                    *bits != 0
                )),
                Elt::F32 => {
                    let u = self.tty(n.shape, "ui32");
                    self.line(format!(
                        "%v{i}_bits = stablehlo.constant dense<{bits}> : {u}"
                    ));
                    self.line(format!(
                        "%v{i} = stablehlo.bitcast_convert %v{i}_bits : ({u}) -> {ty}"
                    ));
                }
            },
            VOp::Broadcast(a) => {
                let from = self.tty(self.p.nodes[*a].shape, elt(n.elt));
                self.line(format!(
                    "%v{i} = stablehlo.broadcast_in_dim %v{a}, dims = [0, 1] : ({from}) -> {ty}"
                ));
            }
            VOp::WorkItem => {
                self.line(format!("%v{i}_sub = stablehlo.iota dim = 0 : {ty}"));
                self.line(format!(
                    "%v{i}_first = stablehlo.convert %start : (tensor<i32>) -> tensor<ui32>"
                ));
                self.line(format!(
                    "%v{i}_base = stablehlo.broadcast_in_dim %v{i}_first, dims = [] : (tensor<ui32>) -> {ty}"
                ));
                self.line(format!(
                    "%v{i} = stablehlo.add %v{i}_sub, %v{i}_base : {ty}"
                ));
            }
            VOp::Lane => {
                self.line(format!("%v{i}_lane = stablehlo.iota dim = 1 : {ty}"));
                self.line(format!(
                    "%v{i}_first = stablehlo.convert %col : (tensor<i32>) -> tensor<ui32>"
                ));
                self.line(format!(
                    "%v{i}_base = stablehlo.broadcast_in_dim %v{i}_first, dims = [] : (tensor<ui32>) -> {ty}"
                ));
                self.line(format!(
                    "%v{i} = stablehlo.add %v{i}_lane, %v{i}_base : {ty}"
                ));
            }
            VOp::Gather { window, index } => {
                // One-hot: the entry's bits where the lane is the index, 0 elsewhere, then the
                // unsigned max over the lanes (the same bits as the module's signed max from
                // `i32::MIN`).
                let len = self.p.block_width(&self.p.windows[*window]);
                let table = self.arrays[*window].clone();
                let wide = format!("tensor<{STEP_ROWS}x{len}xui32>");
                let row = self.tty(Shape::Row, "ui32");
                self.line(format!(
                    "%v{i}_all = stablehlo.broadcast_in_dim {table}, dims = [0, 1] : (tensor<1x{len}xui32>) -> {wide}"
                ));
                self.line(format!("%v{i}_lane = stablehlo.iota dim = 1 : {wide}"));
                self.line(format!(
                    "%v{i}_at = stablehlo.broadcast_in_dim %v{index}, dims = [0, 1] : ({row}) -> {wide}"
                ));
                self.line(format!(
                    "%v{i}_hit = stablehlo.compare EQ, %v{i}_lane, %v{i}_at, UNSIGNED : ({wide}, {wide}) -> tensor<{STEP_ROWS}x{len}xi1>"
                ));
                self.line(format!("%v{i}_none = stablehlo.constant dense<0> : {wide}"));
                self.line(format!(
                    "%v{i}_one = stablehlo.select %v{i}_hit, %v{i}_all, %v{i}_none : tensor<{STEP_ROWS}x{len}xi1>, {wide}"
                ));
                self.line(format!(
                    "%v{i}_zero = stablehlo.constant dense<0> : tensor<ui32>"
                ));
                self.line(format!(
                    "%v{i}_max = stablehlo.reduce(%v{i}_one init: %v{i}_zero) applies stablehlo.maximum across dimensions = [1] : ({wide}, tensor<ui32>) -> tensor<{STEP_ROWS}xui32>"
                ));
                self.bits_as(
                    i,
                    n.shape,
                    n.elt,
                    "max",
                    &format!("tensor<{STEP_ROWS}xui32>"),
                );
            }
            VOp::Scalar { window } => {
                let param = self.p.windows[*window].param;
                let row = self.tty(n.shape, "ui32");
                self.line(format!(
                    "%v{i}_all = stablehlo.broadcast_in_dim %arg{param}, dims = [] : (tensor<ui32>) -> {row}"
                ));
                self.bits_as(i, n.shape, n.elt, "all", &row);
            }
            VOp::MaxLanes(a) => {
                // The lanes are not negative: the unsigned max from 0 is the signed one.
                let from = self.tty(self.p.nodes[*a].shape, "ui32");
                self.line(format!(
                    "%v{i}_zero = stablehlo.constant dense<0> : tensor<ui32>"
                ));
                self.line(format!(
                    "%v{i}_max = stablehlo.reduce(%v{a} init: %v{i}_zero) applies stablehlo.maximum across dimensions = [1] : ({from}, tensor<ui32>) -> tensor<{STEP_ROWS}xui32>"
                ));
                self.line(format!(
                    "%v{i} = stablehlo.reshape %v{i}_max : (tensor<{STEP_ROWS}xui32>) -> {ty}"
                ));
            }
            VOp::Bin(Bin::ShrS, a, b) => {
                let x = self.signed(&format!("%v{i}_a"), *a, n.shape);
                let y = self.signed(&format!("%v{i}_b"), *b, n.shape);
                let s = self.tty(n.shape, "i32");
                self.line(format!(
                    "%v{i}_s = stablehlo.shift_right_arithmetic {x}, {y} : {s}"
                ));
                self.line(format!(
                    "%v{i} = stablehlo.bitcast_convert %v{i}_s : ({s}) -> {ty}"
                ));
            }
            VOp::Bin(op, a, b) => {
                let name = match op {
                    Bin::AddI | Bin::AddF => "add",
                    Bin::SubI | Bin::SubF => "subtract",
                    Bin::MulI | Bin::MulF => "multiply",
                    Bin::AndI => "and",
                    Bin::OrI => "or",
                    Bin::XorI => "xor",
                    Bin::Shl => "shift_left",
                    Bin::ShrU | Bin::ShrS => "shift_right_logical",
                };
                self.line(format!("%v{i} = stablehlo.{name} %v{a}, %v{b} : {ty}"));
            }
            VOp::Cmp(pred, a, b) => {
                let (dir, kind) = match pred {
                    Pred::Eq => ("EQ", "UNSIGNED"),
                    Pred::Ne => ("NE", "UNSIGNED"),
                    Pred::Ult => ("LT", "UNSIGNED"),
                    Pred::Ule => ("LE", "UNSIGNED"),
                    Pred::Ugt => ("GT", "UNSIGNED"),
                    Pred::Uge => ("GE", "UNSIGNED"),
                    Pred::Slt => ("LT", "SIGNED"),
                    Pred::Sle => ("LE", "SIGNED"),
                    Pred::Sgt => ("GT", "SIGNED"),
                    Pred::Sge => ("GE", "SIGNED"),
                    Pred::Oeq => ("EQ", "FLOAT"),
                    Pred::Olt => ("LT", "FLOAT"),
                    Pred::Ole => ("LE", "FLOAT"),
                    Pred::Ogt => ("GT", "FLOAT"),
                    Pred::Oge => ("GE", "FLOAT"),
                };
                let operand_elt = self.p.nodes[*a].elt;
                let (x, y, t) = if kind == "SIGNED" {
                    let x = self.signed(&format!("%v{i}_a"), *a, n.shape);
                    let y = self.signed(&format!("%v{i}_b"), *b, n.shape);
                    (x, y, self.tty(n.shape, "i32"))
                } else {
                    (
                        format!("%v{a}"),
                        format!("%v{b}"),
                        self.tty(n.shape, elt(operand_elt)),
                    )
                };
                self.line(format!(
                    "%v{i} = stablehlo.compare {dir}, {x}, {y}, {kind} : ({t}, {t}) -> {ty}"
                ));
            }
            VOp::Select(c, t, f) => {
                let cty = self.tty(n.shape, "i1");
                self.line(format!(
                    "%v{i} = stablehlo.select %v{c}, %v{t}, %v{f} : ({cty}, {ty}, {ty}) -> {ty}"
                ));
            }
            VOp::Bitcast(a, _) => {
                let from = self.tty(n.shape, elt(self.p.nodes[*a].elt));
                self.line(format!(
                    "%v{i} = stablehlo.bitcast_convert %v{a} : ({from}) -> {ty}"
                ));
            }
            VOp::Interleave(a, b) => {
                let (l, e) = (self.p.lanes(), elt(n.elt));
                let from = self.tty(Shape::Chunk, e);
                let one = format!("tensor<{STEP_ROWS}x{l}x1x{e}>");
                let two = format!("tensor<{STEP_ROWS}x{l}x2x{e}>");
                for (x, part) in [(a, "even"), (b, "odd")] {
                    self.line(format!(
                        "%v{i}_{part} = stablehlo.reshape %v{x} : ({from}) -> {one}"
                    ));
                }
                self.line(format!(
                    "%v{i}_both = stablehlo.concatenate %v{i}_even, %v{i}_odd, dim = 2 : ({one}, {one}) -> {two}"
                ));
                self.line(format!(
                    "%v{i} = stablehlo.reshape %v{i}_both : ({two}) -> {ty}"
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
            | VOp::Staged(_) => super::matmul::twin::node(self, i, n),
            VOp::Deinterleave(a, half) => {
                let (l, e) = (self.p.lanes(), elt(n.elt));
                let from = self.tty(Shape::Pairs, e);
                let one = format!("tensor<{STEP_ROWS}x{l}x1x{e}>");
                let two = format!("tensor<{STEP_ROWS}x{l}x2x{e}>");
                self.line(format!(
                    "%v{i}_both = stablehlo.reshape %v{a} : ({from}) -> {two}"
                ));
                self.line(format!(
                    "%v{i}_one = stablehlo.slice %v{i}_both [0:{STEP_ROWS}, 0:{l}, {half}:{}] : ({two}) -> {one}",
                    half + 1
                ));
                self.line(format!(
                    "%v{i} = stablehlo.reshape %v{i}_one : ({one}) -> {ty}"
                ));
            }
        }
    }

    /// The raw tile a store writes (`%t{k}`).
    pub(super) fn store_tile(&mut self, k: usize, window: usize, node: usize) -> String {
        let dtype = self.p.windows[window].dtype;
        let n = &self.p.nodes[node];
        let from = self.tty(n.shape, elt(n.elt));
        let rt = self.tty(n.shape, raw(dtype));
        match dtype {
            DType::F32 => self.line(format!(
                "%t{k} = stablehlo.bitcast_convert %v{node} : ({from}) -> {rt}"
            )),
            DType::U32 | DType::I32 => return format!("%v{node}"),
            _ => {
                // The low 8 or 16 bits (`convert` to a narrower unsigned type wraps).
                let mask = if dtype.size_bytes() == 1 {
                    0xff
                } else {
                    0xffff
                };
                self.line(format!(
                    "%t{k}_mask = stablehlo.constant dense<{mask}> : {from}"
                ));
                self.line(format!(
                    "%t{k}_low = stablehlo.and %v{node}, %t{k}_mask : {from}"
                ));
                self.line(format!(
                    "%t{k} = stablehlo.convert %t{k}_low : ({from}) -> {rt}"
                ));
            }
        }
        format!("%t{k}")
    }
}

/// The twin's parameters (each buffer as raw bits, each scalar as `tensor<ui32>`) and its
/// results: `(parameter, elements, dtype)` per writable buffer.
pub(super) fn signature(
    kernel: &Kernel,
    shapes: &Shapes,
) -> (Vec<String>, Vec<(usize, usize, DType)>) {
    let mut sig = Vec::new();
    let mut results = Vec::new();
    for (i, (_, param)) in kernel.params.iter().enumerate() {
        match &param.kind {
            ParamKind::Buffer { dtype, access, .. } => {
                let n = shapes.elements.get(i).copied().unwrap_or(0);
                sig.push(format!("%arg{i}: tensor<{n}x{}>", raw(*dtype)));
                if *access != Access::Read {
                    results.push((i, n, *dtype));
                }
            }
            ParamKind::Scalar(_) => sig.push(format!("%arg{i}: tensor<ui32>")),
        }
    }
    (sig, results)
}

/// The twin of `p`, the tile program of `kernel` at `shapes` (see the module docs).
pub(super) fn print(kernel: &Kernel, shapes: &Shapes, p: &TileProgram) -> String {
    if p.matmul.is_some() {
        return super::matmul::twin::print(kernel, shapes, p);
    }
    let (sig, results) = signature(kernel, shapes);
    let rows = p.rows;
    let mut head = Printer::new(p, "    ", Vec::new());
    // Each window's array: the raw buffer padded with zeros and reshaped to `rows x width`
    // (named by window: a buffer may have a chunk and a whole-chunk window).
    for (i, w) in p.windows.iter().enumerate() {
        if w.kind == WindowKind::Scalar {
            // Read from its `tensor<ui32>` argument directly.
            continue;
        }
        let (param, width, n) = (w.param, w.width, w.elements);
        let r = raw(w.dtype);
        let array_rows = p.array_rows(w);
        let total = array_rows as usize * width as usize;
        head.line(format!(
            "%zero{i} = stablehlo.constant dense<0> : tensor<{r}>"
        ));
        head.line(format!(
            "%pad{i} = stablehlo.pad %arg{param}, %zero{i}, low = [0], high = [{}], interior = [0] : (tensor<{n}x{r}>, tensor<{r}>) -> tensor<{total}x{r}>",
            total - n
        ));
        head.line(format!(
            "%array{i} = stablehlo.reshape %pad{i} : (tensor<{total}x{r}>) -> tensor<{array_rows}x{width}x{r}>"
        ));
    }
    let arrays: Vec<String> = (0..p.windows.len()).map(|i| format!("%array{i}")).collect();
    let outs: Vec<usize> = (0..p.windows.len())
        .filter(|&w| p.windows[w].written)
        .collect();
    let array_ty = |w: usize| {
        let win = &p.windows[w];
        format!("tensor<{rows}x{}x{}>", win.width, raw(win.dtype))
    };
    head.line("%c0 = stablehlo.constant dense<0> : tensor<i32>".into());
    head.line(format!(
        "%steps = stablehlo.constant dense<{}> : tensor<i32>",
        p.steps() * p.lane_blocks()
    ));
    let mut carried = vec!["%it = %c0".to_string()];
    let mut carried_ty = vec!["tensor<i32>".to_string()];
    for &w in &outs {
        carried.push(format!("%o{w} = {}", arrays[w]));
        carried_ty.push(array_ty(w));
    }
    head.line(format!(
        "%loop:{} = stablehlo.while({}) : {}",
        carried.len(),
        carried.join(", "),
        carried_ty.join(", ")
    ));
    head.line("cond {".into());
    head.line(
        "  %more = stablehlo.compare LT, %it, %steps, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>"
            .into(),
    );
    head.line("  stablehlo.return %more : tensor<i1>".into());
    head.line("} do {".into());
    let mut body = Printer::new(p, "      ", arrays);
    body.line(format!(
        "%rows = stablehlo.constant dense<{STEP_ROWS}> : tensor<i32>"
    ));
    // Step `it` is rows step `it / lane_blocks`, lane block `it % lane_blocks`.
    body.line(format!(
        "%blocks = stablehlo.constant dense<{}> : tensor<i32>",
        p.lane_blocks()
    ));
    body.line(format!(
        "%lanes = stablehlo.constant dense<{}> : tensor<i32>",
        p.lanes()
    ));
    body.line("%r = stablehlo.divide %it, %blocks : tensor<i32>".into());
    body.line("%c = stablehlo.remainder %it, %blocks : tensor<i32>".into());
    body.line("%start = stablehlo.multiply %r, %rows : tensor<i32>".into());
    body.line("%col = stablehlo.multiply %c, %lanes : tensor<i32>".into());
    if p.windows.iter().any(|w| w.width == 2 * p.width) {
        body.line(format!(
            "%pair_lanes = stablehlo.constant dense<{}> : tensor<i32>",
            2 * p.lanes()
        ));
        body.line("%pair_col = stablehlo.multiply %c, %pair_lanes : tensor<i32>".into());
    }
    body.line("%zero = stablehlo.constant dense<0> : tensor<i32>".into());
    for (i, n) in p.nodes.iter().enumerate() {
        body.node(i, n);
    }
    // Each written window takes its last store's tile.
    let mut next: Vec<String> = outs.iter().map(|w| format!("%o{w}")).collect();
    for (k, (w, node)) in p.stores.iter().enumerate() {
        let tile = body.store_tile(k, *w, *node);
        let slot = outs.iter().position(|o| o == w).unwrap_or(0);
        let old = next[slot].clone();
        let shape = p.nodes[*node].shape;
        let tty = body.tty(shape, raw(p.windows[*w].dtype));
        let col = match shape {
            Shape::Pairs => "%pair_col",
            Shape::Row => "%zero",
            _ => "%col",
        };
        body.line(format!(
            "%u{k} = stablehlo.dynamic_update_slice {old}, {tile}, %start, {col} : ({}, {tty}, tensor<i32>, tensor<i32>) -> {}",
            array_ty(*w),
            array_ty(*w)
        ));
        next[slot] = format!("%u{k}");
    }
    body.line("%one = stablehlo.constant dense<1> : tensor<i32>".into());
    body.line("%it_next = stablehlo.add %it, %one : tensor<i32>".into());
    let mut ret = vec!["%it_next".to_string()];
    ret.extend(next);
    body.line(format!(
        "stablehlo.return {} : {}",
        ret.join(", "),
        carried_ty.join(", ")
    ));
    let mut out = String::new();
    let _ = writeln!(
        out,
        "// qforge kernel {} (Mosaic twin, grid {}, {} x {} steps of {STEP_ROWS} rows x {} lanes)",
        p.name,
        shapes.grid,
        p.steps(),
        p.lane_blocks(),
        p.lanes()
    );
    let _ = writeln!(out, "module @qforge_mosaic_twin {{");
    let result_tys: Vec<String> = results
        .iter()
        .map(|(_, n, d)| format!("tensor<{n}x{}>", raw(*d)))
        .collect();
    let _ = writeln!(
        out,
        "  func.func public @main({}) -> ({}) {{",
        sig.join(", "),
        result_tys.join(", ")
    );
    out.push_str(&head.out);
    out.push_str(&body.out);
    out.push_str("    }\n");
    // The results: a written window's array flattened and cut to the buffer; any other
    // writable buffer unchanged.
    let mut values = Vec::new();
    for (i, n, dtype) in &results {
        match outs.iter().position(|&w| p.windows[w].param == *i) {
            Some(slot) => {
                let w = outs[slot];
                let r = raw(*dtype);
                let total = rows as usize * p.windows[w].width as usize;
                let _ = writeln!(
                    out,
                    "    %flat{i} = stablehlo.reshape %loop#{} : ({}) -> tensor<{total}x{r}>",
                    slot + 1,
                    array_ty(w)
                );
                let _ = writeln!(
                    out,
                    "    %res{i} = stablehlo.slice %flat{i} [0:{n}] : (tensor<{total}x{r}>) -> tensor<{n}x{r}>"
                );
                values.push(format!("%res{i}"));
            }
            None => values.push(format!("%arg{i}")),
        }
    }
    let _ = writeln!(
        out,
        "    return {} : {}",
        values.join(", "),
        result_tys.join(", ")
    );
    out.push_str("  }\n}\n");
    out
}
