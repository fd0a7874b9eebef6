//! Prints a matmul's tile program (`super`) as a Mosaic module: the function takes the
//! three grid indices `(i, j, l)`, one VMEM window per array and three VMEM scratch buffers:
//! the partials (`W x TM x TN`), and the step's activation columns and weight rows, each
//! broadcast to a `TM x TN` tile and indexed by `k` on their leading dimension (`TK x TM x
//! TN`), so the reduction loop reads element `k`'s with dynamic indices on an untiled
//! dimension only.

use std::fmt::Write;

use qforge_ir::DType;

use crate::mosaic::text::{elt, mem_elt, Printer};
use crate::mosaic::tile::{Elt, Node, Shape, TileProgram, VOp, WindowKind, PANEL_BYTES};

/// The scratch buffers' memref types: partials, activation columns, weight rows.
fn scratch(p: &TileProgram) -> [String; 3] {
    let m = p.matmul.as_ref().expect("a matmul");
    let vmem = "#tpu.memory_space<vmem>";
    [
        format!("memref<{}x{}x{}xf32, {vmem}>", m.ways, m.tm, m.tn),
        format!("memref<{}x{}x{}xf32, {vmem}>", m.tk, m.tm, m.tn),
        format!("memref<{}x{}x{}xf32, {vmem}>", m.tk, m.tm, m.tn),
    ]
}

/// The matmul's own ops (the others print as in the row-chunk class).
pub(in crate::mosaic) fn node(pr: &mut Printer<'_>, i: usize, n: &Node) {
    let p = pr.p;
    let m = p.matmul.as_ref().expect("a matmul");
    let ty = pr.vty(n.shape, elt(n.elt));
    // `%v{i}` = `iota(dim) * scale + add + first * per_step` (`first` a grid index).
    let iota = |pr: &mut Printer<'_>, dim: u32, scale: u32, add: u32, first: &str, per: u32| {
        pr.line(format!(
            "%v{i}_iota = tpu.iota {{dimensions = array<i32: {dim}>}} : {ty}"
        ));
        let mut at = format!("%v{i}_iota");
        if scale != 1 {
            pr.line(format!(
                "%v{i}_scale = arith.constant dense<{scale}> : {ty}"
            ));
            pr.line(format!(
                "%v{i}_scaled = arith.muli {at}, %v{i}_scale : {ty}"
            ));
            at = format!("%v{i}_scaled");
        }
        if add != 0 {
            pr.line(format!("%v{i}_add = arith.constant dense<{add}> : {ty}"));
            pr.line(format!("%v{i}_added = arith.addi {at}, %v{i}_add : {ty}"));
            at = format!("%v{i}_added");
        }
        pr.line(format!("%v{i}_per = arith.constant {per} : i32"));
        pr.line(format!("%v{i}_first = arith.muli {first}, %v{i}_per : i32"));
        pr.line(format!(
            "%v{i}_base = vector.broadcast %v{i}_first : i32 to {ty}"
        ));
        pr.line(format!("%v{i} = arith.addi {at}, %v{i}_base : {ty}"));
    };
    match n.op {
        VOp::WeightRow => iota(pr, 0, 1, 0, "%arg1", m.tn),
        VOp::ReductionIndex { half: None } => iota(pr, 1, 1, 0, "%arg2", m.tk),
        VOp::ReductionIndex { half: Some(h) } => iota(pr, 1, 2, h, "%arg2", m.tk),
        VOp::OutRow => iota(pr, 0, 1, 0, "%arg0", m.tm),
        VOp::BlockCol => pr.line(format!(
            "%v{i} = tpu.iota {{dimensions = array<i32: 1>}} : {ty}"
        )),
        VOp::TableGather { window, index } => {
            // A 32-bit table: its element type is the node's.
            let w = &p.windows[window];
            let (len, e) = (w.width, elt(n.elt));
            let arg = pr.args[window].0.clone().unwrap_or_default();
            let mem = pr.mem(window);
            let (ity, cty) = (pr.vty(n.shape, "i32"), pr.vty(n.shape, "i1"));
            pr.line(format!(
                "%v{i}_tab = vector.load {arg}[%c0, %c0] : {mem}, vector<1x{len}x{e}>"
            ));
            let mut prev = String::new();
            for c in 0..len {
                pr.line(format!(
                    "%v{i}_e{c} = vector.extract_strided_slice %v{i}_tab {{offsets = [0, {c}], sizes = [1, 1], strides = [1, 1]}} : vector<1x{len}x{e}> to vector<1x1x{e}>"
                ));
                let b = if len == 1 {
                    format!("%v{i}")
                } else {
                    format!("%v{i}_b{c}")
                };
                pr.line(format!(
                    "{b} = vector.broadcast %v{i}_e{c} : vector<1x1x{e}> to {ty}"
                ));
                if c == 0 {
                    prev = b;
                    continue;
                }
                let out = if c + 1 == len {
                    format!("%v{i}")
                } else {
                    format!("%v{i}_s{c}")
                };
                pr.line(format!("%v{i}_k{c} = arith.constant dense<{c}> : {ity}"));
                pr.line(format!(
                    "%v{i}_h{c} = arith.cmpi eq, %v{index}, %v{i}_k{c} : {ity}"
                ));
                pr.line(format!(
                    "{out} = arith.select %v{i}_h{c}, {b}, {prev} : {cty}, {ty}"
                ));
                prev = out;
            }
        }
        VOp::Spread(a) => {
            // Block `first + b` of each row (a one-hot max over the row's blocks) into the
            // lanes of group `b`.
            let s = m.blocks_shift.unwrap_or(0);
            let group = s - u32::from(m.halves);
            let groups = p.columns(Shape::WTile) >> group;
            let (rows, kb) = (p.rows_of(Shape::WBlocks), p.columns(Shape::WBlocks));
            let blocks = format!("vector<{rows}x{kb}xi32>");
            let wide = pr.vty(Shape::WTile, "i32");
            let bits = if p.nodes[a].elt == Elt::F32 {
                pr.line(format!(
                    "%v{i}_bits = arith.bitcast %v{a} : vector<{rows}x{kb}xf32> to {blocks}"
                ));
                format!("%v{i}_bits")
            } else {
                format!("%v{a}")
            };
            pr.line(format!(
                "%v{i}_col = tpu.iota {{dimensions = array<i32: 1>}} : {blocks}"
            ));
            pr.line(format!(
                "%v{i}_lane = tpu.iota {{dimensions = array<i32: 1>}} : {wide}"
            ));
            pr.line(format!(
                "%v{i}_gshift = arith.constant dense<{group}> : {wide}"
            ));
            pr.line(format!(
                "%v{i}_group = arith.shrui %v{i}_lane, %v{i}_gshift : {wide}"
            ));
            pr.line(format!("%v{i}_per = arith.constant {} : i32", m.tk >> s));
            pr.line(format!("%v{i}_first = arith.muli %arg2, %v{i}_per : i32"));
            pr.line(format!(
                "%v{i}_none = arith.constant dense<-2147483648> : {blocks}"
            ));
            pr.line(format!(
                "%v{i}_init = arith.constant dense<-2147483648> : vector<{rows}xi32>"
            ));
            pr.line(format!("%v{i}_s0 = arith.constant dense<0> : {wide}"));
            for b in 0..groups {
                pr.line(format!("%v{i}_b{b} = arith.constant {b} : i32"));
                pr.line(format!(
                    "%v{i}_c{b} = arith.addi %v{i}_first, %v{i}_b{b} : i32"
                ));
                pr.line(format!(
                    "%v{i}_at{b} = vector.broadcast %v{i}_c{b} : i32 to {blocks}"
                ));
                pr.line(format!(
                    "%v{i}_hit{b} = arith.cmpi eq, %v{i}_col, %v{i}_at{b} : {blocks}"
                ));
                pr.line(format!(
                    "%v{i}_one{b} = arith.select %v{i}_hit{b}, {bits}, %v{i}_none : vector<{rows}x{kb}xi1>, {blocks}"
                ));
                pr.line(format!(
                    "%v{i}_max{b} = vector.multi_reduction <maxsi>, %v{i}_one{b}, %v{i}_init [1] : {blocks} to vector<{rows}xi32>"
                ));
                pr.line(format!(
                    "%v{i}_row{b} = vector.shape_cast %v{i}_max{b} : vector<{rows}xi32> to vector<{rows}x1xi32>"
                ));
                pr.line(format!(
                    "%v{i}_wide{b} = vector.broadcast %v{i}_row{b} : vector<{rows}x1xi32> to {wide}"
                ));
                pr.line(format!("%v{i}_g{b} = arith.constant dense<{b}> : {wide}"));
                pr.line(format!(
                    "%v{i}_in{b} = arith.cmpi eq, %v{i}_group, %v{i}_g{b} : {wide}"
                ));
                let next = b + 1;
                pr.line(format!(
                    "%v{i}_s{next} = arith.select %v{i}_in{b}, %v{i}_wide{b}, %v{i}_s{b} : {}, {wide}",
                    pr.vty(Shape::WTile, "i1")
                ));
            }
            if n.elt == Elt::F32 {
                pr.line(format!(
                    "%v{i} = arith.bitcast %v{i}_s{groups} : {wide} to {ty}"
                ));
            } else {
                pr.line(format!(
                    "%v{i} = arith.addi %v{i}_s{groups}, %v{i}_s0 : {wide}"
                ));
            }
        }
        VOp::PanelBytes { window } => panel_bytes(pr, i, window),
        VOp::ColScales { window } => col_scales(pr, i, window),
        // Printed by `print` where the loop provides them.
        VOp::Staged(_) => {}
        _ => unreachable!("not a matmul op"),
    }
}

/// `%v{i}`, the byte of each element of the step's weight tile in 4-bit panels
/// (`VOp::PanelBytes`): each panel's `TK x 16` bytes widened and turned (`16 x TK`), the
/// panels stacked, every row repeated twice (columns `2b` and `2b + 1` share byte `b`).
fn panel_bytes(pr: &mut Printer<'_>, i: usize, window: usize) {
    let p = pr.p;
    let m = p.matmul.as_ref().expect("a matmul");
    let w = &p.windows[window];
    let (per, tk, tn, b) = (p.lead(w).map_or(1, |l| l.1), m.tk, m.tn, PANEL_BYTES);
    let arg = pr.args[window].0.clone().unwrap_or_default();
    let mem = pr.mem(window);
    let mut turned = Vec::new();
    for q in 0..per {
        for l in [
            format!("%v{i}_c{q} = arith.constant {q} : index"),
            format!("%v{i}_l{q} = vector.load {arg}[%v{i}_c{q}, %c0, %c0] : {mem}, vector<1x{tk}x{b}xi8>"),
            format!("%v{i}_s{q} = vector.shape_cast %v{i}_l{q} : vector<1x{tk}x{b}xi8> to vector<{tk}x{b}xi8>"),
            format!("%v{i}_e{q} = arith.extui %v{i}_s{q} : vector<{tk}x{b}xi8> to vector<{tk}x{b}xi32>"),
            format!("%v{i}_t{q} = tpu.transpose %v{i}_e{q}, [1, 0] : vector<{tk}x{b}xi32> -> vector<{b}x{tk}xi32>"),
        ] {
            pr.line(l);
        }
        turned.push(format!("%v{i}_t{q}"));
    }
    let rows = b * per;
    let stacked = if per == 1 {
        turned[0].clone()
    } else {
        let tys = vec![format!("vector<{b}x{tk}xi32>"); per as usize];
        pr.line(format!(
            "%v{i}_cat = tpu.concatenate {} in 0 : {} -> vector<{rows}x{tk}xi32>",
            turned.join(", "),
            tys.join(", ")
        ));
        format!("%v{i}_cat")
    };
    let all = if 2 * rows == tn {
        format!("%v{i}")
    } else {
        format!("%v{i}_all")
    };
    pr.line(format!(
        "%v{i}_one = vector.shape_cast {stacked} : vector<{rows}x{tk}xi32> to vector<{rows}x1x{tk}xi32>"
    ));
    pr.line(format!(
        "%v{i}_two = vector.broadcast %v{i}_one : vector<{rows}x1x{tk}xi32> to vector<{rows}x2x{tk}xi32>"
    ));
    pr.line(format!(
        "{all} = vector.shape_cast %v{i}_two : vector<{rows}x2x{tk}xi32> to vector<{}x{tk}xi32>",
        2 * rows
    ));
    if 2 * rows != tn {
        pr.line(format!(
            "%v{i} = vector.extract_strided_slice %v{i}_all {{offsets = [0, 0], sizes = [{tn}, {tk}], strides = [1, 1]}} : vector<{}x{tk}xi32> to vector<{tn}x{tk}xi32>",
            2 * rows
        ));
    }
}

/// `%v{i}`, each element's entry of a column-block window (`VOp::ColScales`): the block's
/// `G` rows, as 32-bit lanes (`f32`, or integers widened and 16-bit floats' bits as `i32`),
/// each repeated over its `TN / G` rows of the tile.
fn col_scales(pr: &mut Printer<'_>, i: usize, window: usize) {
    let p = pr.p;
    let m = p.matmul.as_ref().expect("a matmul");
    let w = &p.windows[window];
    let (tk, tn, dtype) = (m.tk, m.tn, w.dtype);
    let g = p.block_rows(w);
    let arg = pr.args[window].0.clone().unwrap_or_default();
    let mem = pr.mem(window);
    let me = mem_elt(dtype);
    let e = if dtype == DType::F32 { "f32" } else { "i32" };
    pr.line(format!(
        "%v{i}_l = vector.load {arg}[%c0, %c0, %c0] : {mem}, vector<1x{g}x{tk}x{me}>"
    ));
    pr.line(format!(
        "%v{i}_g = vector.shape_cast %v{i}_l : vector<1x{g}x{tk}x{me}> to vector<{g}x1x{tk}x{me}>"
    ));
    let one = format!("vector<{g}x1x{tk}x{e}>");
    let rows = match dtype {
        DType::F32 | DType::U32 | DType::I32 => format!("%v{i}_g"),
        DType::BF16 => {
            pr.line(format!(
                "%v{i}_h = arith.bitcast %v{i}_g : vector<{g}x1x{tk}xbf16> to vector<{g}x1x{tk}xi16>"
            ));
            pr.line(format!(
                "%v{i}_w = arith.extui %v{i}_h : vector<{g}x1x{tk}xi16> to {one}"
            ));
            format!("%v{i}_w")
        }
        _ => {
            let ext = if dtype == DType::I8 { "extsi" } else { "extui" };
            pr.line(format!(
                "%v{i}_w = arith.{ext} %v{i}_g : vector<{g}x1x{tk}x{me}> to {one}"
            ));
            format!("%v{i}_w")
        }
    };
    let rep = tn / g;
    pr.line(format!(
        "%v{i}_rep = vector.broadcast {rows} : {one} to vector<{g}x{rep}x{tk}x{e}>"
    ));
    pr.line(format!(
        "%v{i} = vector.shape_cast %v{i}_rep : vector<{g}x{rep}x{tk}x{e}> to vector<{tn}x{tk}x{e}>"
    ));
}

/// The Mosaic module of matmul program `p`.
pub(in crate::mosaic) fn print(p: &TileProgram) -> String {
    let m = p.matmul.as_ref().expect("a matmul");
    let mut pr = Printer::new(p);
    let mut params = vec![
        "%arg0: i32".to_string(),
        "%arg1: i32".to_string(),
        "%arg2: i32".to_string(),
    ];
    let mut args = vec![(None, None); p.windows.len()];
    let mut windows = Vec::new();
    let map = |kind: WindowKind| match kind {
        WindowKind::MmX => "x".to_string(),
        WindowKind::MmWeight => "weight".to_string(),
        WindowKind::MmBlocks => "blocks".to_string(),
        WindowKind::MmCols => "cols".to_string(),
        WindowKind::MmOut => "out".to_string(),
        WindowKind::MmPanels => "panels".to_string(),
        WindowKind::MmColBlocks(t) => format!("colblocks{t}"),
        _ => "fixed".to_string(),
    };
    for out in [false, true] {
        for (i, w) in p.windows.iter().enumerate() {
            if (out && !w.written) || (!out && !w.read) {
                continue;
            }
            let name = format!("%{}_{}", if out { "out" } else { "in" }, w.name);
            params.push(format!("{name}: {}", pr.mem(i)));
            let bounds: Vec<String> = p.block_shape(w).iter().map(u32::to_string).collect();
            windows.push(format!(
                "{{transform_indices = @transform_{}, window_bounds = array<i64: {}>}}",
                map(w.kind),
                bounds.join(", ")
            ));
            if out {
                args[i].1 = Some(name);
            } else {
                args[i].0 = Some(name);
            }
        }
    }
    let [acc_mem, x_mem, w_mem] = scratch(p);
    params.push(format!("%acc_scratch: {acc_mem}"));
    params.push(format!("%x_scratch: {x_mem}"));
    params.push(format!("%w_scratch: {w_mem}"));
    pr.args = args;
    let tile = format!("vector<{}x{}xf32>", m.tm, m.tn);
    pr.line("%c0 = arith.constant 0 : index".into());
    for (i, n) in p.nodes[..m.loop_start].iter().enumerate() {
        pr.node(i, n);
    }
    // The step's activation columns and weight rows, each broadcast to a tile.
    for k in 0..m.tk {
        pr.line(format!("%k{k} = arith.constant {k} : index"));
    }
    let xt = format!("vector<{}x{}xf32>", m.tm, m.tk);
    let col = format!("vector<{}x1xf32>", m.tm);
    for k in 0..m.tk {
        pr.line(format!(
            "%xc{k} = vector.extract_strided_slice %v{} {{offsets = [0, {k}], sizes = [{}, 1], strides = [1, 1]}} : {xt} to {col}",
            m.x, m.tm
        ));
        pr.line(format!(
            "%xb{k} = vector.broadcast %xc{k} : {col} to {tile}"
        ));
        pr.line(format!(
            "vector.store %xb{k}, %x_scratch[%k{k}, %c0, %c0] : {x_mem}, {tile}"
        ));
    }
    let tw = p.columns(Shape::WTile);
    let wty = pr.vty(Shape::WTile, "f32");
    let turned = format!("vector<{tw}x{}xf32>", m.tn);
    let row = format!("vector<1x{}xf32>", m.tn);
    for (h, &w) in m.w.iter().enumerate() {
        pr.line(format!(
            "%wt{h} = tpu.transpose %v{w}, [1, 0] : {wty} -> {turned}"
        ));
        for r in 0..tw {
            let k = if m.halves { 2 * r + h as u32 } else { r };
            pr.line(format!(
                "%wr{k} = vector.extract_strided_slice %wt{h} {{offsets = [{r}, 0], sizes = [1, {}], strides = [1, 1]}} : {turned} to {row}",
                m.tn
            ));
            pr.line(format!(
                "%wb{k} = vector.broadcast %wr{k} : {row} to {tile}"
            ));
            pr.line(format!(
                "vector.store %wb{k}, %w_scratch[%k{k}, %c0, %c0] : {w_mem}, {tile}"
            ));
        }
    }
    // The partials: `-0.0` at the first reduction step.
    let steps = m.k.div_ceil(m.tk);
    let partials = format!("vector<{}x{}x{}xf32>", m.ways, m.tm, m.tn);
    pr.line("%l0 = arith.constant 0 : i32".into());
    pr.line("%first = arith.cmpi eq, %arg2, %l0 : i32".into());
    pr.line("scf.if %first {".into());
    pr.line(format!(
        "  %zeros = arith.constant dense<-0.0> : {partials}"
    ));
    pr.line(format!(
        "  vector.store %zeros, %acc_scratch[%c0, %c0, %c0] : {acc_mem}, {partials}"
    ));
    pr.line("}".into());
    // The loop over the step's elements (the last step's may be fewer).
    pr.line(format!("%l_last = arith.constant {} : i32", steps - 1));
    pr.line("%last = arith.cmpi eq, %arg2, %l_last : i32".into());
    pr.line(format!("%count_full = arith.constant {} : index", m.tk));
    pr.line(format!(
        "%count_last = arith.constant {} : index",
        m.k - (steps - 1) * m.tk
    ));
    pr.line("%count = arith.select %last, %count_last, %count_full : index".into());
    pr.line("%c1 = arith.constant 1 : index".into());
    pr.line(format!(
        "%ways_mask = arith.constant {} : index",
        m.ways - 1
    ));
    pr.line("scf.for %kk = %c0 to %count step %c1 {".into());
    pr.line("%slot = arith.andi %kk, %ways_mask : index".into());
    let (px, pw, pp) = (m.loop_start, m.loop_start + 1, m.loop_start + 2);
    pr.line(format!(
        "%v{px} = vector.load %x_scratch[%kk, %c0, %c0] : {x_mem}, {tile}"
    ));
    pr.line(format!(
        "%v{pw} = vector.load %w_scratch[%kk, %c0, %c0] : {w_mem}, {tile}"
    ));
    pr.line(format!(
        "%v{pp} = vector.load %acc_scratch[%slot, %c0, %c0] : {acc_mem}, {tile}"
    ));
    for (i, n) in p.nodes[..m.total_start]
        .iter()
        .enumerate()
        .skip(m.loop_start)
    {
        pr.node(i, n);
    }
    pr.line(format!(
        "vector.store %v{}, %acc_scratch[%slot, %c0, %c0] : {acc_mem}, {tile}",
        m.fma
    ));
    pr.line("}".into());
    // The total (the halving tree over the partials), the epilogue and the stores.
    pr.line("scf.if %last {".into());
    let total = m.total_start;
    let mut names: Vec<String> = (0..m.ways).map(|j| format!("%p{j}")).collect();
    if m.ways == 1 {
        names[0] = format!("%v{total}");
    }
    for (j, name) in names.iter().enumerate() {
        pr.line(format!("%w{j} = arith.constant {j} : index"));
        pr.line(format!(
            "{name} = vector.load %acc_scratch[%w{j}, %c0, %c0] : {acc_mem}, {tile}"
        ));
    }
    for (name, a, b) in super::halving_tree(names, &format!("%v{total}")) {
        pr.line(format!("{name} = arith.addf {a}, {b} : {tile}"));
    }
    for (i, n) in p.nodes.iter().enumerate().skip(total + 1) {
        pr.node(i, n);
    }
    for (k, (w, n)) in p.stores.iter().enumerate() {
        pr.store(k, *w, *n);
    }
    pr.line("}".into());
    pr.line("return".into());
    let mut out = String::new();
    let _ = writeln!(
        out,
        "// qforge kernel {} (Mosaic matmul, M = {}, N = {}, K = {}: {} x {} x {} steps of {} x {} outputs and {} elements)",
        p.name,
        m.m,
        m.n,
        m.k,
        m.m.div_ceil(m.tm),
        m.n.div_ceil(m.tn),
        steps,
        m.tm,
        m.tn,
        m.tk
    );
    let _ = writeln!(
        out,
        "module attributes {{stable_mosaic.version = 11 : i64}} {{"
    );
    let _ = writeln!(
        out,
        "  func.func @{}({}) attributes {{dimension_semantics = [#tpu.dimension_semantics<parallel>, \
         #tpu.dimension_semantics<parallel>, #tpu.dimension_semantics<arbitrary>], iteration_bounds = \
         array<i64: {}, {}, {}>, scalar_prefetch = 0 : i64, scratch_operands = 3 : i64, \
         tpu.core_type = #tpu.core_type<tc>, window_params = [{}]}} {{",
        p.name,
        params.join(", "),
        m.m.div_ceil(m.tm),
        m.n.div_ceil(m.tn),
        steps,
        windows.join(", ")
    );
    out.push_str(&pr.out);
    out.push_str("  }\n");
    for (name, r, c) in [
        ("x", "%arg0", "%arg2"),
        ("weight", "%arg1", "%arg2"),
        ("blocks", "%arg1", "%c0_i32"),
        ("cols", "%c0_i32", "%arg1"),
        ("out", "%arg0", "%arg1"),
        ("fixed", "%c0_i32", "%c0_i32"),
    ] {
        let _ = writeln!(
            out,
            "  func.func @transform_{name}(%arg0: i32, %arg1: i32, %arg2: i32) -> (i32, i32) {{\n    \
             %c0_i32 = arith.constant 0 : i32\n    return {r}, {c} : i32, i32\n  }}"
        );
    }
    // The 3-D windows' maps: panels `(j, l, 0)`; column blocks `(group of tile j, 0, l)`.
    let mut three = Vec::new();
    for w in &p.windows {
        match w.kind {
            WindowKind::MmPanels => three.push((
                "panels".to_string(),
                Vec::new(),
                "%arg1, %arg2, %c0_i32".to_string(),
            )),
            WindowKind::MmColBlocks(t) if 1u64 << t > u64::from(m.tn) => three.push((
                format!("colblocks{t}"),
                vec![
                    format!("%tn = arith.constant {} : i32", m.tn),
                    "%first = arith.muli %arg1, %tn : i32".to_string(),
                    format!("%t = arith.constant {t} : i32"),
                    "%group = arith.shrui %first, %t : i32".to_string(),
                ],
                "%group, %c0_i32, %arg2".to_string(),
            )),
            WindowKind::MmColBlocks(t) => three.push((
                format!("colblocks{t}"),
                Vec::new(),
                "%arg1, %c0_i32, %arg2".to_string(),
            )),
            _ => {}
        }
    }
    three.sort();
    three.dedup();
    for (name, body, ret) in three {
        let _ = writeln!(
            out,
            "  func.func @transform_{name}(%arg0: i32, %arg1: i32, %arg2: i32) -> (i32, i32, i32) {{\n    \
             %c0_i32 = arith.constant 0 : i32"
        );
        for l in body {
            let _ = writeln!(out, "    {l}");
        }
        let _ = writeln!(out, "    return {ret} : i32, i32, i32\n  }}");
    }
    out.push_str("}\n");
    out
}
