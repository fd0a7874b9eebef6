//! Prints a matmul's tile program (`super`) as its StableHLO twin: each buffer sliced
//! to the elements its array holds, reshaped to `[rows, columns]` and zero-padded to the
//! array; the grid a `while` over steps `(i, j, l)` (`l` fastest) carrying the partials and
//! the outputs; the step's reduction loop a `while` over its elements reading element `k`'s
//! activation column and weight row with `dynamic_slice` and partial `k % W` with
//! `dynamic_slice`/`dynamic_update_slice`, as the module's scratch buffers do.

use std::fmt::Write;

use qforge_ir::Kernel;

use crate::mosaic::tile::PANEL_BYTES;
use crate::mosaic::tile::{Elt, Node, Shape, TileProgram, VOp, WindowKind};
use crate::mosaic::twin::{elt, raw, raw_name, signature, Printer};
use crate::mosaic::Shapes;

/// The matmul's own ops (the others print as in the row-chunk class).
pub(in crate::mosaic) fn node(pr: &mut Printer<'_>, i: usize, n: &Node) {
    let p = pr.p;
    let m = p.matmul.as_ref().expect("a matmul");
    let ty = pr.tty(n.shape, elt(n.elt));
    // `%v{i}` = `iota(dim) * scale + add + first` (`first` an `i32` scalar).
    let iota = |pr: &mut Printer<'_>, dim: u32, scale: u32, add: u32, first: &str| {
        pr.line(format!("%v{i}_iota = stablehlo.iota dim = {dim} : {ty}"));
        let mut at = format!("%v{i}_iota");
        if scale != 1 {
            pr.line(format!(
                "%v{i}_scale = stablehlo.constant dense<{scale}> : {ty}"
            ));
            pr.line(format!(
                "%v{i}_scaled = stablehlo.multiply {at}, %v{i}_scale : {ty}"
            ));
            at = format!("%v{i}_scaled");
        }
        if add != 0 {
            pr.line(format!(
                "%v{i}_add = stablehlo.constant dense<{add}> : {ty}"
            ));
            pr.line(format!(
                "%v{i}_added = stablehlo.add {at}, %v{i}_add : {ty}"
            ));
            at = format!("%v{i}_added");
        }
        pr.line(format!(
            "%v{i}_first = stablehlo.convert {first} : (tensor<i32>) -> tensor<ui32>"
        ));
        pr.line(format!(
            "%v{i}_base = stablehlo.broadcast_in_dim %v{i}_first, dims = [] : (tensor<ui32>) -> {ty}"
        ));
        pr.line(format!("%v{i} = stablehlo.add {at}, %v{i}_base : {ty}"));
    };
    match n.op {
        VOp::WeightRow => iota(pr, 0, 1, 0, "%w_row"),
        VOp::ReductionIndex { half: None } => iota(pr, 1, 1, 0, "%x_col"),
        VOp::ReductionIndex { half: Some(h) } => iota(pr, 1, 2, h, "%x_col"),
        VOp::OutRow => iota(pr, 0, 1, 0, "%x_row"),
        VOp::BlockCol => pr.line(format!("%v{i} = stablehlo.iota dim = 1 : {ty}")),
        VOp::TableGather { window, index } => {
            // The chain of selects of the module, on the raw bits.
            let len = p.windows[window].width;
            let table = pr.arrays[window].clone();
            let (uty, cty) = (pr.tty(n.shape, "ui32"), pr.tty(n.shape, "i1"));
            let mut prev = String::new();
            for c in 0..len {
                pr.line(format!(
                    "%v{i}_e{c} = stablehlo.slice {table} [0:1, {c}:{}] : (tensor<1x{len}xui32>) -> tensor<1x1xui32>",
                    c + 1
                ));
                let b = format!("%v{i}_b{c}");
                pr.line(format!(
                    "{b} = stablehlo.broadcast_in_dim %v{i}_e{c}, dims = [0, 1] : (tensor<1x1xui32>) -> {uty}"
                ));
                if c == 0 {
                    prev = b;
                    continue;
                }
                pr.line(format!(
                    "%v{i}_k{c} = stablehlo.constant dense<{c}> : {uty}"
                ));
                pr.line(format!(
                    "%v{i}_h{c} = stablehlo.compare EQ, %v{index}, %v{i}_k{c}, UNSIGNED : ({uty}, {uty}) -> {cty}"
                ));
                pr.line(format!(
                    "%v{i}_s{c} = stablehlo.select %v{i}_h{c}, {b}, {prev} : ({cty}, {uty}, {uty}) -> {uty}"
                ));
                prev = format!("%v{i}_s{c}");
            }
            pr.line(format!(
                "%v{i} = stablehlo.bitcast_convert {prev} : ({uty}) -> {ty}"
            ));
        }
        VOp::OutCol => iota(pr, 1, 1, 0, "%o_col"),
        VOp::Spread(a) => {
            // The step's blocks (the row of blocks padded so the slice is never moved back),
            // each repeated over its group of lanes.
            let s = m.blocks_shift.unwrap_or(0);
            let group = s - u32::from(m.halves);
            let groups = p.columns(Shape::WTile) >> group;
            let (rows, kb) = (p.rows_of(Shape::WBlocks), p.columns(Shape::WBlocks));
            let e = elt(n.elt);
            let zero = if n.elt == Elt::F32 { "0.0" } else { "0" };
            pr.line(format!(
                "%v{i}_zero = stablehlo.constant dense<{zero}> : tensor<{e}>"
            ));
            pr.line(format!(
                "%v{i}_pad = stablehlo.pad %v{a}, %v{i}_zero, low = [0, 0], high = [0, {groups}], interior = [0, 0] : (tensor<{rows}x{kb}x{e}>, tensor<{e}>) -> tensor<{rows}x{}x{e}>",
                kb + groups
            ));
            pr.line(format!(
                "%v{i}_per = stablehlo.constant dense<{}> : tensor<i32>",
                m.tk >> s
            ));
            pr.line(format!(
                "%v{i}_first = stablehlo.multiply %gl, %v{i}_per : tensor<i32>"
            ));
            pr.line(format!(
                "%v{i}_step = stablehlo.dynamic_slice %v{i}_pad, %c0, %v{i}_first, sizes = [{rows}, {groups}] : (tensor<{rows}x{}x{e}>, tensor<i32>, tensor<i32>) -> tensor<{rows}x{groups}x{e}>",
                kb + groups
            ));
            pr.line(format!(
                "%v{i}_wide = stablehlo.broadcast_in_dim %v{i}_step, dims = [0, 1] : (tensor<{rows}x{groups}x{e}>) -> tensor<{rows}x{groups}x{}x{e}>",
                1u32 << group
            ));
            pr.line(format!(
                "%v{i} = stablehlo.reshape %v{i}_wide : (tensor<{rows}x{groups}x{}x{e}>) -> {ty}",
                1u32 << group
            ));
        }
        VOp::PanelBytes { window } => panel_bytes(pr, i, window),
        VOp::ColScales { window } => col_scales(pr, i, window),
        // Printed by `print` where the loop provides them.
        VOp::Staged(_) => {}
        _ => unreachable!("not a matmul op"),
    }
}

/// The type of a tensor of `dims` of element `e`.
fn tensor(dims: &[u32], e: &str) -> String {
    let d: Vec<String> = dims.iter().map(u32::to_string).collect();
    format!("tensor<{}x{e}>", d.join("x"))
}

/// The module's `VOp::PanelBytes` (`text.rs`): the step's panels sliced, widened, turned to
/// `[panel, byte, k]`, stacked and every row repeated twice.
fn panel_bytes(pr: &mut Printer<'_>, i: usize, window: usize) {
    let p = pr.p;
    let m = p.matmul.as_ref().expect("a matmul");
    let w = &p.windows[window];
    let (per, tk, tn, b) = (p.lead(w).map_or(1, |l| l.1), m.tk, m.tn, PANEL_BYTES);
    let array = pr.arrays[window].clone();
    let at = tensor(&p.array_shape(w), "ui8");
    let rows = b * per;
    for l in [
        format!("%v{i}_per = stablehlo.constant dense<{per}> : tensor<i32>"),
        format!("%v{i}_lead = stablehlo.multiply %gj, %v{i}_per : tensor<i32>"),
        format!(
            "%v{i}_blk = stablehlo.dynamic_slice {array}, %v{i}_lead, %x_col, %c0, sizes = [{per}, {tk}, {b}] : ({at}, tensor<i32>, tensor<i32>, tensor<i32>) -> {}",
            tensor(&[per, tk, b], "ui8")
        ),
        format!(
            "%v{i}_wide = stablehlo.convert %v{i}_blk : ({}) -> {}",
            tensor(&[per, tk, b], "ui8"),
            tensor(&[per, tk, b], "ui32")
        ),
        format!(
            "%v{i}_t = stablehlo.transpose %v{i}_wide, dims = [0, 2, 1] : ({}) -> {}",
            tensor(&[per, tk, b], "ui32"),
            tensor(&[per, b, tk], "ui32")
        ),
        format!(
            "%v{i}_rows = stablehlo.reshape %v{i}_t : ({}) -> {}",
            tensor(&[per, b, tk], "ui32"),
            tensor(&[rows, tk], "ui32")
        ),
        format!(
            "%v{i}_two = stablehlo.broadcast_in_dim %v{i}_rows, dims = [0, 2] : ({}) -> {}",
            tensor(&[rows, tk], "ui32"),
            tensor(&[rows, 2, tk], "ui32")
        ),
        format!(
            "%v{i}_all = stablehlo.reshape %v{i}_two : ({}) -> {}",
            tensor(&[rows, 2, tk], "ui32"),
            tensor(&[2 * rows, tk], "ui32")
        ),
        format!(
            "%v{i} = stablehlo.slice %v{i}_all [0:{tn}, 0:{tk}] : ({}) -> {}",
            tensor(&[2 * rows, tk], "ui32"),
            tensor(&[tn, tk], "ui32")
        ),
    ] {
        pr.line(l);
    }
}

/// The module's `VOp::ColScales` (`text.rs`): tile `j`'s group of rows at step `l`, each
/// row repeated over its `TN / G` rows of the tile.
fn col_scales(pr: &mut Printer<'_>, i: usize, window: usize) {
    let p = pr.p;
    let m = p.matmul.as_ref().expect("a matmul");
    let w = &p.windows[window];
    let WindowKind::MmColBlocks(t) = w.kind else {
        unreachable!("a column-block window")
    };
    let (tk, tn, dtype) = (m.tk, m.tn, w.dtype);
    let g = p.block_rows(w);
    let rep = tn / g;
    let r = raw(dtype);
    let array = pr.arrays[window].clone();
    let at = tensor(&p.array_shape(w), r);
    if 1u64 << t > u64::from(tn) {
        pr.line(format!(
            "%v{i}_tn = stablehlo.constant dense<{tn}> : tensor<i32>"
        ));
        pr.line(format!(
            "%v{i}_first = stablehlo.multiply %gj, %v{i}_tn : tensor<i32>"
        ));
        pr.line(format!(
            "%v{i}_t = stablehlo.constant dense<{t}> : tensor<i32>"
        ));
        pr.line(format!(
            "%v{i}_group = stablehlo.shift_right_logical %v{i}_first, %v{i}_t : tensor<i32>"
        ));
    } else {
        pr.line(format!(
            "%v{i}_group = stablehlo.add %gj, %c0 : tensor<i32>"
        ));
    }
    let name = raw_name(i, dtype);
    for l in [
        format!(
            "%v{i}_blk = stablehlo.dynamic_slice {array}, %v{i}_group, %c0, %x_col, sizes = [1, {g}, {tk}] : ({at}, tensor<i32>, tensor<i32>, tensor<i32>) -> {}",
            tensor(&[1, g, tk], r)
        ),
        format!(
            "%v{i}_g = stablehlo.reshape %v{i}_blk : ({}) -> {}",
            tensor(&[1, g, tk], r),
            tensor(&[g, 1, tk], r)
        ),
        format!(
            "%v{i}_rep = stablehlo.broadcast_in_dim %v{i}_g, dims = [0, 1, 2] : ({}) -> {}",
            tensor(&[g, 1, tk], r),
            tensor(&[g, rep, tk], r)
        ),
        format!(
            "{name} = stablehlo.reshape %v{i}_rep : ({}) -> {}",
            tensor(&[g, rep, tk], r),
            tensor(&[tn, tk], r)
        ),
    ] {
        pr.line(l);
    }
    let ty = pr.tty(Shape::WTile, elt(pr.p.nodes[i].elt));
    pr.widen(i, dtype, Shape::WTile, &ty);
}

/// The twin of matmul program `p` of `kernel` at `shapes`.
pub(in crate::mosaic) fn print(kernel: &Kernel, shapes: &Shapes, p: &TileProgram) -> String {
    let m = p.matmul.as_ref().expect("a matmul");
    let (sig, results) = signature(kernel, shapes);
    let mut head = Printer::new(p, "    ", Vec::new());
    // Each window's array: the buffer's elements as `[rows, columns]`, zero-padded.
    for (i, w) in p.windows.iter().enumerate() {
        if w.kind == WindowKind::Scalar {
            continue;
        }
        let r = raw(w.dtype);
        let n = shapes.elements.get(w.param).copied().unwrap_or(0);
        // A table (whole in every step) is the buffer as one row.
        let buffer = p.buffer_shape(w).unwrap_or(vec![1, n as u32]);
        // The array with its leading dimensions merged to the buffer's rank.
        let array = p.array_shape(w);
        let cut = array.len() + 1 - buffer.len();
        let mut merged = vec![array[..cut].iter().product::<u32>()];
        merged.extend(&array[cut..]);
        let e = w.elements;
        let ty = |dims: &[u32]| {
            let d: Vec<String> = dims.iter().map(u32::to_string).collect();
            format!("tensor<{}x{r}>", d.join("x"))
        };
        let (bt, mt) = (ty(&buffer), ty(&merged));
        head.line(format!(
            "%flat{i} = stablehlo.slice %arg{} [0:{e}] : (tensor<{n}x{r}>) -> tensor<{e}x{r}>",
            w.param
        ));
        head.line(format!(
            "%buf{i} = stablehlo.reshape %flat{i} : (tensor<{e}x{r}>) -> {bt}"
        ));
        head.line(format!(
            "%zero{i} = stablehlo.constant dense<0> : tensor<{r}>"
        ));
        let zeros = vec!["0"; buffer.len()].join(", ");
        let high: Vec<String> = merged
            .iter()
            .zip(&buffer)
            .map(|(a, b)| (a - b).to_string())
            .collect();
        let padded = if merged == array {
            format!("%array{i}")
        } else {
            format!("%merged{i}")
        };
        head.line(format!(
            "{padded} = stablehlo.pad %buf{i}, %zero{i}, low = [{zeros}], high = [{}], interior = [{zeros}] : ({bt}, tensor<{r}>) -> {mt}",
            high.join(", ")
        ));
        if merged != array {
            head.line(format!(
                "%array{i} = stablehlo.reshape {padded} : ({mt}) -> {}",
                ty(&array)
            ));
        }
    }
    let array_ty = |w: usize| {
        let win = &p.windows[w];
        let d: Vec<String> = p.array_shape(win).iter().map(u32::to_string).collect();
        format!("tensor<{}x{}>", d.join("x"), raw(win.dtype))
    };
    let outs: Vec<usize> = (0..p.windows.len())
        .filter(|&w| p.windows[w].written)
        .collect();
    let (gm, gn, gk) = (m.m.div_ceil(m.tm), m.n.div_ceil(m.tn), m.k.div_ceil(m.tk));
    let tile = format!("tensor<{}x{}xf32>", m.tm, m.tn);
    let parts = format!("tensor<{}x{}x{}xf32>", m.ways, m.tm, m.tn);
    head.line("%c0 = stablehlo.constant dense<0> : tensor<i32>".into());
    head.line(format!(
        "%steps = stablehlo.constant dense<{}> : tensor<i32>",
        gm * gn * gk
    ));
    head.line(format!(
        "%neg_zeros = stablehlo.constant dense<-0.0> : {parts}"
    ));
    let mut carried = vec!["%it = %c0".to_string(), "%parts = %neg_zeros".to_string()];
    let mut carried_ty = vec!["tensor<i32>".to_string(), parts.clone()];
    for &w in &outs {
        carried.push(format!("%o{w} = %array{w}"));
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
    let arrays = (0..p.windows.len()).map(|i| format!("%array{i}")).collect();
    let mut body = Printer::new(p, "      ", arrays);
    let int = |name: &str, v: u32| format!("{name} = stablehlo.constant dense<{v}> : tensor<i32>");
    let i32op = |name: &str, op: &str, a: &str, b: &str| {
        format!("{name} = stablehlo.{op} {a}, {b} : tensor<i32>")
    };
    for l in [
        int("%nk", gk),
        int("%nnk", gn * gk),
        int("%tm", m.tm),
        int("%tn", m.tn),
        int("%tk", m.tk),
        int("%tw", m.tk >> u32::from(m.halves)),
        i32op("%gi", "divide", "%it", "%nnk"),
        i32op("%rest", "remainder", "%it", "%nnk"),
        i32op("%gj", "divide", "%rest", "%nk"),
        i32op("%gl", "remainder", "%rest", "%nk"),
        i32op("%x_row", "multiply", "%gi", "%tm"),
        i32op("%x_col", "multiply", "%gl", "%tk"),
        i32op("%w_row", "multiply", "%gj", "%tn"),
        i32op("%w_col", "multiply", "%gl", "%tw"),
        i32op("%o_col", "multiply", "%gj", "%tn"),
    ] {
        body.line(l);
    }
    body.starts = p
        .windows
        .iter()
        .map(|w| {
            let (r, c) = match w.kind {
                WindowKind::MmX => ("%x_row", "%x_col"),
                WindowKind::MmWeight => ("%w_row", "%w_col"),
                WindowKind::MmBlocks => ("%w_row", "%c0"),
                WindowKind::MmCols => ("%c0", "%o_col"),
                _ => ("%x_row", "%o_col"),
            };
            (r.to_string(), c.to_string())
        })
        .collect();
    for (i, n) in p.nodes[..m.loop_start].iter().enumerate() {
        body.node(i, n);
    }
    // The step's weight as `TK x TN` (row `k`; halves interleaved: row `2i + h`).
    let tw = p.columns(Shape::WTile);
    let wty = body.tty(Shape::WTile, "f32");
    for (h, &w) in m.w.iter().enumerate() {
        body.line(format!(
            "%wt{h} = stablehlo.transpose %v{w}, dims = [1, 0] : ({wty}) -> tensor<{tw}x{}xf32>",
            m.tn
        ));
    }
    let turned = format!("tensor<{}x{}xf32>", m.tk, m.tn);
    if m.halves {
        let one = format!("tensor<{tw}x1x{}xf32>", m.tn);
        let two = format!("tensor<{tw}x2x{}xf32>", m.tn);
        for h in 0..2 {
            body.line(format!(
                "%wt{h}_one = stablehlo.reshape %wt{h} : (tensor<{tw}x{}xf32>) -> {one}",
                m.tn
            ));
        }
        body.line(format!(
            "%w_both = stablehlo.concatenate %wt0_one, %wt1_one, dim = 1 : ({one}, {one}) -> {two}"
        ));
        body.line(format!(
            "%w_all = stablehlo.reshape %w_both : ({two}) -> {turned}"
        ));
    } else {
        body.line(format!(
            "%w_all = stablehlo.reshape %wt0 : ({turned}) -> {turned}"
        ));
    }
    // The partials start at `-0.0` at the first reduction step.
    body.line(
        "%first = stablehlo.compare EQ, %gl, %c0, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>"
            .into(),
    );
    body.line(format!(
        "%parts_in = stablehlo.select %first, %neg_zeros, %parts : tensor<i1>, {parts}"
    ));
    body.line(int("%l_last", gk - 1));
    body.line(
        "%last = stablehlo.compare EQ, %gl, %l_last, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>"
            .into(),
    );
    body.line(int("%count_last", m.k - (gk - 1) * m.tk));
    body.line("%count = stablehlo.select %last, %count_last, %tk : tensor<i1>, tensor<i32>".into());
    body.line(int("%ways_mask", m.ways - 1));
    body.line(format!(
        "%inner:2 = stablehlo.while(%kk = %c0, %p = %parts_in) : tensor<i32>, {parts}"
    ));
    body.line("cond {".into());
    body.line(
        "  %go = stablehlo.compare LT, %kk, %count, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>"
            .into(),
    );
    body.line("  stablehlo.return %go : tensor<i1>".into());
    body.line("} do {".into());
    let mut inner = Printer::new(p, "        ", body.arrays.clone());
    inner.starts = body.starts.clone();
    let (px, pw, pp) = (m.loop_start, m.loop_start + 1, m.loop_start + 2);
    let xt = format!("tensor<{}x{}xf32>", m.tm, m.tk);
    let col = format!("tensor<{}x1xf32>", m.tm);
    let row = format!("tensor<1x{}xf32>", m.tn);
    let one = format!("tensor<1x{}x{}xf32>", m.tm, m.tn);
    for l in [
        format!(
            "%xk = stablehlo.dynamic_slice %v{}, %c0, %kk, sizes = [{}, 1] : ({xt}, tensor<i32>, tensor<i32>) -> {col}",
            m.x, m.tm
        ),
        format!("%v{px} = stablehlo.broadcast_in_dim %xk, dims = [0, 1] : ({col}) -> {tile}"),
        format!(
            "%wk = stablehlo.dynamic_slice %w_all, %kk, %c0, sizes = [1, {}] : ({turned}, tensor<i32>, tensor<i32>) -> {row}",
            m.tn
        ),
        format!("%v{pw} = stablehlo.broadcast_in_dim %wk, dims = [0, 1] : ({row}) -> {tile}"),
        "%slot = stablehlo.and %kk, %ways_mask : tensor<i32>".into(),
        format!(
            "%pk = stablehlo.dynamic_slice %p, %slot, %c0, %c0, sizes = [1, {}, {}] : ({parts}, tensor<i32>, tensor<i32>, tensor<i32>) -> {one}",
            m.tm, m.tn
        ),
        format!("%v{pp} = stablehlo.reshape %pk : ({one}) -> {tile}"),
    ] {
        inner.line(l);
    }
    for (i, n) in p.nodes[..m.total_start]
        .iter()
        .enumerate()
        .skip(m.loop_start)
    {
        inner.node(i, n);
    }
    for l in [
        format!("%pn = stablehlo.reshape %v{} : ({tile}) -> {one}", m.fma),
        format!(
            "%p_next = stablehlo.dynamic_update_slice %p, %pn, %slot, %c0, %c0 : ({parts}, {one}, tensor<i32>, tensor<i32>, tensor<i32>) -> {parts}"
        ),
        "%one = stablehlo.constant dense<1> : tensor<i32>".into(),
        "%kk_next = stablehlo.add %kk, %one : tensor<i32>".into(),
        format!("stablehlo.return %kk_next, %p_next : tensor<i32>, {parts}"),
    ] {
        inner.line(l);
    }
    body.out.push_str(&inner.out);
    body.line("}".into());
    // The total: the halving tree over the partials.
    let total = m.total_start;
    let mut names: Vec<String> = (0..m.ways).map(|j| format!("%q{j}")).collect();
    if m.ways == 1 {
        names[0] = format!("%v{total}");
    }
    for (j, name) in names.iter().enumerate() {
        body.line(format!(
            "{name}_one = stablehlo.slice %inner#1 [{j}:{}, 0:{}, 0:{}] : ({parts}) -> {one}",
            j + 1,
            m.tm,
            m.tn
        ));
        body.line(format!(
            "{name} = stablehlo.reshape {name}_one : ({one}) -> {tile}"
        ));
    }
    for (name, a, b) in super::halving_tree(names, &format!("%v{total}")) {
        body.line(format!("{name} = stablehlo.add {a}, {b} : {tile}"));
    }
    for (i, n) in p.nodes.iter().enumerate().skip(total + 1) {
        body.node(i, n);
    }
    // Each output takes its tile at the last reduction step.
    let mut next: Vec<String> = outs.iter().map(|w| format!("%o{w}")).collect();
    for (k, (w, node)) in p.stores.iter().enumerate() {
        let t = body.store_tile(k, *w, *node);
        let slot = outs.iter().position(|o| o == w).unwrap_or(0);
        let old = next[slot].clone();
        let tty = body.tty(Shape::Acc, raw(p.windows[*w].dtype));
        let aty = array_ty(*w);
        body.line(format!(
            "%u{k}_new = stablehlo.dynamic_update_slice {old}, {t}, %x_row, %o_col : ({aty}, {tty}, tensor<i32>, tensor<i32>) -> {aty}"
        ));
        body.line(format!(
            "%u{k} = stablehlo.select %last, %u{k}_new, {old} : tensor<i1>, {aty}"
        ));
        next[slot] = format!("%u{k}");
    }
    body.line("%one = stablehlo.constant dense<1> : tensor<i32>".into());
    body.line("%it_next = stablehlo.add %it, %one : tensor<i32>".into());
    let mut ret = vec!["%it_next".to_string(), "%inner#1".to_string()];
    ret.extend(next);
    body.line(format!(
        "stablehlo.return {} : {}",
        ret.join(", "),
        carried_ty.join(", ")
    ));
    let mut out = String::new();
    let _ = writeln!(
        out,
        "// qforge kernel {} (Mosaic matmul twin, grid {}, M = {}, N = {}, K = {}: {gm} x {gn} x {gk} steps)",
        p.name, shapes.grid, m.m, m.n, m.k
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
    let mut values = Vec::new();
    for (i, n, dtype) in &results {
        match outs.iter().position(|&w| p.windows[w].param == *i) {
            Some(slot) => {
                let w = &p.windows[outs[slot]];
                let r = raw(*dtype);
                let [br, bc] = p.buffer_shape(w).expect("a matmul window")[..] else {
                    unreachable!("a matmul's output is [M, N]")
                };
                let _ = writeln!(
                    out,
                    "    %cut{i} = stablehlo.slice %loop#{} [0:{br}, 0:{bc}] : ({}) -> tensor<{br}x{bc}x{r}>",
                    slot + 2,
                    array_ty(outs[slot])
                );
                let _ = writeln!(
                    out,
                    "    %res{i} = stablehlo.reshape %cut{i} : (tensor<{br}x{bc}x{r}>) -> tensor<{n}x{r}>"
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
