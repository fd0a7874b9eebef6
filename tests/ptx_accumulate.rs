//! The PTX lowering of `Stmt::Accumulate` without a GPU: the emitted text is checked against the
//! IR's summation order (main-loop copies, guarded tail, `fma.rn.f32` into the right partial, the
//! halving tree with `add.rn.f32`), a broken text is caught, and ptxas assembles the kernels.

#[path = "ptx_support/mod.rs"]
mod ptx_support;

use ptx_support::*;
use qforge::codegen::ptx::{ptx_text, SmTarget};
use qforge::ir::{
    verify, Access, CmpOp, DType, Dim, Kernel, KernelBuilder, Op, ReduceOrder, ScalarType, Stmt,
};
use qforge::kernels;

// ----- accumulate -----

const ACC_ORDERS: [ReduceOrder; 6] = [
    ReduceOrder::Sequential,
    ReduceOrder::Strided(2),
    ReduceOrder::Strided(4),
    ReduceOrder::Strided(8),
    ReduceOrder::Strided(32),
    ReduceOrder::Strided(64),
];

/// Per work item `w`: `acc_t = sum over i < k of x[w*k + i] * y[w*k + i + t]`, `t < accs`.
fn dot_kernel(order: ReduceOrder, accs: u32, xt: DType) -> Kernel {
    let mut b = KernelBuilder::new("acc_dot");
    let (n, k, size) = (
        b.scalar_param("n", ScalarType::U32),
        b.scalar_param("k", ScalarType::U32),
        b.scalar_param("size", ScalarType::U32),
    );
    let x = b.buffer_param("x", xt, &[Dim::Param(size)], Access::Read);
    let y = b.buffer_param("y", DType::F32, &[Dim::Param(size)], Access::Read);
    let out = b.buffer_param("out", DType::F32, &[Dim::Param(size)], Access::Write);
    b.set_grid(Dim::Param(n));
    let vars: Vec<_> = (0..accs)
        .map(|t| b.var(&format!("s{t}"), ScalarType::F32))
        .collect();
    let (wi, kv) = (b.work_item(), b.param(k));
    let row = b.mul(wi, kv);
    let offs: Vec<_> = (0..accs).map(|t| b.const_u32(t)).collect();
    b.accumulate(kv, order, &vars, |b, i| {
        let e = b.add(row, i);
        let a = b.load(x, e);
        offs.iter()
            .map(|&o| {
                let ey = b.add(e, o);
                (a, b.load(y, ey))
            })
            .collect()
    });
    let na = b.const_u32(accs);
    for (t, v) in vars.iter().enumerate() {
        let base = b.mul(wi, na);
        let idx = b.add(base, offs[t]);
        let s = b.read_var(*v);
        b.store(out, idx, s);
    }
    let kernel = b.finish();
    verify(&kernel).expect("acc_dot verifies");
    kernel
}

/// The fused NF4 matmul's K reduction for a `tm x tn` tile per work item: x (f32) times the
/// dequantized weight (nibble unpack, code lookup, absmax of block 64), one sum per (m, n).
fn nf4_tile_kernel(order: ReduceOrder, tm: u32, tn: u32) -> Kernel {
    let mut b = KernelBuilder::new("acc_nf4_tile");
    let (tiles_n, kp, size) = (
        b.scalar_param("tiles_n", ScalarType::U32),
        b.scalar_param("k", ScalarType::U32),
        b.scalar_param("size", ScalarType::U32),
    );
    let x = b.buffer_param("x", DType::F32, &[Dim::Param(size)], Access::Read);
    let wq = b.buffer_param("w", DType::U8, &[Dim::Param(size)], Access::Read);
    let absmax = b.buffer_param("absmax", DType::F32, &[Dim::Param(size)], Access::Read);
    let out = b.buffer_param("out", DType::F32, &[Dim::Param(size)], Access::Write);
    b.set_grid(Dim::Param(size));
    let code = b.table_f32("nf4", &kernels::maps::nf4_code());
    let vars: Vec<_> = (0..tm * tn)
        .map(|t| b.var(&format!("y{t}"), ScalarType::F32))
        .collect();
    let (wi, k, tnp) = (b.work_item(), b.param(kp), b.param(tiles_n));
    let (c0, c1, c4, c6, c15) = (
        b.const_u32(0),
        b.const_u32(1),
        b.const_u32(4),
        b.const_u32(6),
        b.const_u32(15),
    );
    let (ctm, ctn) = (b.const_u32(tm), b.const_u32(tn));
    let (mt, nt) = (b.div(wi, tnp), b.rem(wi, tnp));
    let (m0, n0) = (b.mul(mt, ctm), b.mul(nt, ctn));
    let rows: Vec<_> = (0..tm)
        .map(|mi| {
            let o = b.const_u32(mi);
            let m = b.add(m0, o);
            b.mul(m, k)
        })
        .collect();
    let cols: Vec<_> = (0..tn)
        .map(|ni| {
            let o = b.const_u32(ni);
            let nn = b.add(n0, o);
            b.mul(nn, k)
        })
        .collect();
    b.accumulate(k, order, &vars, |b, i| {
        let xs: Vec<_> = rows
            .iter()
            .map(|&r| {
                let e = b.add(r, i);
                b.load(x, e)
            })
            .collect();
        let ws: Vec<_> = cols
            .iter()
            .map(|&c| {
                let e = b.add(c, i);
                let byte_i = b.shr(e, c1);
                let byte = b.load(wq, byte_i);
                let odd = b.and(e, c1);
                let even = b.cmp(CmpOp::Eq, odd, c0);
                let (hi, lo) = (b.shr(byte, c4), b.and(byte, c15));
                let nib = b.select(even, hi, lo);
                let q = b.lookup(code, nib);
                let blk = b.shr(e, c6);
                let s = b.load(absmax, blk);
                b.mul(q, s)
            })
            .collect();
        xs.iter()
            .flat_map(|&xv| ws.iter().map(move |&wv| (xv, wv)))
            .collect()
    });
    for (t, v) in vars.iter().enumerate() {
        let o = b.const_u32(t as u32);
        let base = b.mul(wi, ctm);
        let idx = b.add(base, o);
        let s = b.read_var(*v);
        b.store(out, idx, s);
    }
    let kernel = b.finish();
    verify(&kernel).expect("acc_nf4_tile verifies");
    kernel
}

/// Accumulates nested in a `for` and an `if`, twice in a row, with a `reduce` (its own loop
/// and labels) in the body, a factor defined outside the body and two sums into one variable.
fn nested_accumulate_kernel() -> Kernel {
    let mut b = KernelBuilder::new("acc_nested");
    let n = b.scalar_param("n", ScalarType::U32);
    let f = b.scalar_param("f", ScalarType::F32);
    let x = b.buffer_param("x", DType::BF16, &[Dim::Param(n)], Access::Read);
    let out = b.buffer_param("out", DType::F32, &[Dim::Param(n)], Access::ReadWrite);
    b.set_grid(Dim::Param(n));
    let (s, u) = (b.var("s", ScalarType::F32), b.var("u", ScalarType::F32));
    let (wi, nv, fv, c3) = (b.work_item(), b.param(n), b.param(f), b.const_u32(3));
    let zero = b.const_u32(0);
    b.for_range(zero, c3, 1, |b, j| {
        let c = b.cmp(CmpOp::Lt, j, wi);
        b.if_then(c, |b| {
            b.accumulate(nv, ReduceOrder::Strided(4), &[s, s, u], |b, i| {
                let r = b.reduce_sum(x, i, c3, ReduceOrder::Strided(2));
                let v = b.load(x, i);
                vec![(r, fv), (v, v), (fv, r)]
            });
        });
        b.accumulate(j, ReduceOrder::Sequential, &[u], |b, i| {
            let v = b.load(out, i);
            vec![(v, fv)]
        });
    });
    let (sv, uv) = (b.read_var(s), b.read_var(u));
    let t = b.add(sv, uv);
    b.store(out, wi, t);
    let kernel = b.finish();
    verify(&kernel).expect("acc_nested verifies");
    kernel
}

/// Parses `op a, b, c;` (a guard `@%p` counts as the opcode) into opcode and operands.
fn parse_ins(l: &str) -> (&str, Vec<&str>) {
    let l = l.trim_end_matches(';');
    let (op, rest) = match l.strip_prefix('@') {
        Some(_) => l.split_once(" bra ").map_or((l, ""), |(p, r)| (p, r)),
        None => l.split_once(' ').unwrap_or((l, "")),
    };
    (op, rest.split(", ").filter(|s| !s.is_empty()).collect())
}

/// Checks the text of the first top-level `accumulate` of `k` against the IR's order, read
/// off the statement independently of the backend: `w` unguarded copies in the main loop,
/// `w - 1` guarded copies in the tail, element `base + j` into partial `j` of every
/// accumulator with `fma.rn.f32`, partials from `-0.0`, then the halving tree with
/// `add.rn.f32`. Returns (instructions of one body copy, instructions of the whole statement).
fn check_accumulate(k: &Kernel, text: &str) -> Result<(usize, usize), String> {
    let Some(Stmt::Accumulate {
        index,
        len,
        order,
        body,
        accs,
    }) = k.body.iter().find(|s| matches!(s, Stmt::Accumulate { .. }))
    else {
        return Err("no top-level accumulate".into());
    };
    let w = match order {
        ReduceOrder::Sequential => 1,
        ReduceOrder::Strided(w) => *w as usize,
    };
    let count = |f: fn(&Op) -> bool| {
        body.iter()
            .filter(|s| matches!(s, Stmt::Let(v) if f(&k.values[*v].op)))
            .count()
    };
    let loads = count(|op| matches!(op, Op::Load { .. }));
    // The body's own fmas (a moment update in the LAMB/LARS norm), one instruction each.
    let body_fmas = count(|op| matches!(op, Op::Fma(..)));
    let (idx, n) = (format!("%r{}", index.index()), format!("%r{}", len.index()));
    let ins: Vec<&str> = instructions(text).collect();
    let pos = |suffix: &str| {
        ins.iter()
            .position(|l| l.ends_with(suffix))
            .ok_or(format!("no label *{suffix}"))
    };
    let (main, tail, done) = (pos("_acc_main:")?, pos("_acc_tail:")?, pos("_acc_done:")?);
    let expect = |at: usize, want: String| -> Result<(), String> {
        match ins.get(at) {
            Some(l) if *l == want => Ok(()),
            got => Err(format!("line {at}: want {want:?}, got {got:?}")),
        }
    };
    let (_, hdr) = parse_ins(ins[main + 1]);
    let (left, base) = (
        hdr.first().copied().unwrap_or(""),
        hdr.get(2).copied().unwrap_or(""),
    );
    expect(main + 1, format!("sub.u32 {left}, {n}, {base};"))?;
    expect(main - 1, format!("mov.b32 {base}, 0;"))?;
    let stop = parse_ins(ins[main + 2]).1.first().copied().unwrap_or("");
    expect(main + 2, format!("setp.lt.u32 {stop}, {left}, {w};"))?;
    let tail_label = ins[tail].trim_end_matches(':');
    expect(main + 3, format!("@{stop} bra {tail_label};"))?;
    expect(tail - 2, format!("add.u32 {base}, {base}, {w};"))?;
    expect(
        tail - 1,
        format!("bra {};", ins[main].trim_end_matches(':')),
    )?;

    // partials[t][j], discovered in the main loop, checked everywhere else.
    let mut partials = vec![vec![String::new(); w]; accs.len()];
    let mut body_len = 0;
    let copies = |from: usize, to: usize, start: &str| -> Vec<Vec<&str>> {
        let mut out: Vec<Vec<&str>> = Vec::new();
        for l in &ins[from..to] {
            if l.starts_with(start) || out.is_empty() {
                out.push(Vec::new());
            }
            if let Some(c) = out.last_mut() {
                c.push(l);
            }
        }
        out
    };
    let main_copies = copies(main + 4, tail - 2, &format!("add.u32 {idx}, "));
    let tail_copies = copies(tail + 1, done, "setp.le.u32 ");
    if main_copies.len() != w || tail_copies.len() != w - 1 {
        return Err(format!(
            "{} main / {} tail copies for {w} ways",
            main_copies.len(),
            tail_copies.len()
        ));
    }
    let done_label = ins[done].trim_end_matches(':');
    for (tail_part, cs) in [(false, &main_copies), (true, &tail_copies)] {
        for (j, c) in cs.iter().enumerate() {
            let mut c = &c[..];
            if tail_part {
                let guard = parse_ins(c[0]).1;
                let p = guard.first().copied().unwrap_or("");
                if c[0] != format!("setp.le.u32 {p}, {left}, {j};")
                    || c.get(1) != Some(&format!("@{p} bra {done_label};").as_str())
                {
                    return Err(format!("tail element {j} guard: {:?}", &c[..2]));
                }
                c = &c[2..];
            }
            if c[0] != format!("add.u32 {idx}, {base}, {j};") {
                return Err(format!("element {j} index: {}", c[0]));
            }
            let (inner, fmas) = c[1..].split_at(c.len() - 1 - accs.len());
            for (t, (acc, f)) in accs.iter().zip(fmas).enumerate() {
                let (op, o) = parse_ins(f);
                let (a, b) = (
                    format!("%f{}", acc.a.index()),
                    format!("%f{}", acc.b.index()),
                );
                let ok = op == "fma.rn.f32" && o.len() == 4 && o[0] == o[3];
                if !ok || o[1] != a || o[2] != b {
                    return Err(format!("element {j} acc {t}: {f} (want {a} * {b})"));
                }
                if tail_part && o[0] != partials[t][j] {
                    return Err(format!("tail element {j} acc {t} into {}", o[0]));
                }
                partials[t][j] = o[0].to_string();
            }
            let branches = inner
                .iter()
                .filter(|l| l.starts_with('@') || l.starts_with("bra"))
                .count();
            let ld = inner.iter().filter(|l| l.starts_with("ld.global")).count();
            let fmas = inner.iter().filter(|l| l.starts_with("fma")).count();
            if branches != 0 || ld != loads || fmas != body_fmas {
                return Err(format!(
                    "element {j}: {branches} branches, {ld} loads, {fmas} body fmas \
                     (want 0, {loads}, {body_fmas})"
                ));
            }
            body_len = inner.len();
        }
    }
    let all: Vec<&String> = partials.iter().flatten().collect();
    let distinct: std::collections::BTreeSet<&String> = all.iter().copied().collect();
    if distinct.len() != w * accs.len() {
        return Err(format!("partials not distinct: {partials:?}"));
    }
    let first = ins
        .iter()
        .position(|l| {
            all.iter()
                .any(|p| *l == format!("mov.b32 {p}, 0f80000000;"))
        })
        .ok_or("partials never set to -0.0")?;
    for p in &all {
        if !ins[first..main].contains(&format!("mov.b32 {p}, 0f80000000;").as_str()) {
            return Err(format!("{p} does not start at -0.0"));
        }
    }
    // The halving tree, computed here from the IR's definition.
    let mut at = done + 1;
    for (t, acc) in accs.iter().enumerate() {
        let p = &partials[t];
        let mut half = w;
        while half > 1 {
            half /= 2;
            for j in 0..half {
                expect(at, format!("add.rn.f32 {0}, {0}, {1};", p[j], p[j + half]))?;
                at += 1;
            }
        }
        expect(at, format!("mov.f32 %vf{}, {};", acc.var.index(), p[0]))?;
        at += 1;
    }
    // Partials are touched only by their init, fmas, the tree and the final move.
    for l in &ins[main..done] {
        let tokens = l.split(|c: char| !(c.is_alphanumeric() || c == '%' || c == '_'));
        if !l.starts_with("fma.rn.f32")
            && tokens
                .into_iter()
                .any(|tok| distinct.contains(&tok.to_string()))
        {
            return Err(format!("partial used outside its fma: {l}"));
        }
    }
    Ok((body_len, at - first))
}

#[test]
fn accumulate_lowers_in_the_ir_order() {
    for order in ACC_ORDERS {
        for accs in [1, 2, 4] {
            for xt in [DType::F32, DType::F16] {
                let k = dot_kernel(order, accs, xt);
                let text = ptx_text(&k, SmTarget::Sm80).expect("lowers");
                assert_eq!(contract_violation(&k, &text), None);
                if let Err(e) = check_accumulate(&k, &text) {
                    panic!("{order:?}, {accs} accs, {xt:?}: {e}\n{text}");
                }
            }
        }
    }
    for (order, tm, tn) in [
        (ReduceOrder::Strided(32), 2, 2),
        (ReduceOrder::Sequential, 1, 3),
    ] {
        let k = nf4_tile_kernel(order, tm, tn);
        let text = ptx_text(&k, SmTarget::Sm90).expect("lowers");
        assert_eq!(contract_violation(&k, &text), None);
        let (body, total) = check_accumulate(&k, &text).unwrap_or_else(|e| panic!("{e}"));
        println!("nf4 tile {tm}x{tn} {order:?}: body {body} instructions, statement {total}");
    }
    // The library's summation kernels (the fused 4-bit matmuls, the norm partials) keep the
    // same order. Every accumulate counts, at any depth (inside `if` and `for` bodies too);
    // `check_accumulate` reads one top-level accumulate, so a kernel with a nested or a second
    // accumulate fails here instead of going unchecked.
    fn accumulates(stmts: &[Stmt]) -> usize {
        stmts
            .iter()
            .map(|s| match s {
                Stmt::Accumulate { body, .. } => 1 + accumulates(body),
                Stmt::If {
                    then_body,
                    else_body,
                    ..
                } => accumulates(then_body) + accumulates(else_body),
                Stmt::For { body, .. } => accumulates(body),
                Stmt::Let(_) | Stmt::Store { .. } | Stmt::Assign { .. } => 0,
            })
            .sum()
    }
    let (mut checked, mut in_text) = (0, 0);
    for k in library_kernels() {
        // Independent count: the kernel's text form (`.qir`) prints each one as `accumulate %i`.
        let printed = qforge::ir::text::print(&k).matches("accumulate %").count();
        in_text += usize::from(printed > 0);
        let found = accumulates(&k.body);
        assert_eq!(found, printed, "{}: accumulates found vs printed", k.name);
        if found > 0 {
            assert_eq!(
                found, 1,
                "{}: check_accumulate checks only one of {found}",
                k.name
            );
            let text = ptx_text(&k, SmTarget::Sm80).expect("lowers");
            check_accumulate(&k, &text).unwrap_or_else(|e| panic!("{}: {e}", k.name));
            checked += 1;
        }
    }
    println!("{checked} library kernels with an accumulate checked");
    assert!(in_text > 0, "no library kernel prints an accumulate");
    assert_eq!(
        checked, in_text,
        "library kernels whose accumulate was checked vs kernels whose text has one"
    );
    // Every fma of the nested kernel comes from an accumulate: 3 sums x (4 + 3) copies + 1.
    let k = nested_accumulate_kernel();
    let text = ptx_text(&k, SmTarget::Sm80).expect("lowers");
    assert_eq!(contract_violation(&k, &text), None);
    assert_eq!(
        instructions(&text)
            .filter(|l| l.starts_with("fma.rn.f32"))
            .count(),
        22
    );
}

#[test]
fn the_accumulate_checker_catches_broken_text() {
    let k = dot_kernel(ReduceOrder::Strided(4), 2, DType::F32);
    let text = ptx_text(&k, SmTarget::Sm80).expect("lowers");
    check_accumulate(&k, &text).expect("the real text passes");
    let lines: Vec<&str> = text.lines().collect();
    let find = |pred: &dyn Fn(&str) -> bool| lines.iter().position(|l| pred(l)).expect("line");
    let done = find(&|l| l.ends_with("_acc_done:"));
    let mut broken = Vec::new();
    // Tree out of order: p0 += p1 before p1 += p3.
    let mut l = lines.clone();
    l.swap(done + 3, done + 4);
    broken.push(l);
    // A partial starting at +0.0.
    let mut l = lines.clone();
    let init = find(&|l| l.contains("0f80000000"));
    let plus = lines[init].replace("0f80000000", "0f00000000");
    l[init] = &plus;
    broken.push(l);
    // A tail element guarded with the wrong count.
    let mut l = lines.clone();
    let g = find(&|l| l.contains("setp.le.u32") && l.ends_with(", 1;"));
    let wrong = lines[g].replace(", 1;", ", 2;");
    l[g] = &wrong;
    broken.push(l);
    // A main-loop fma into the wrong partial (that of the element before).
    let mut l = lines.clone();
    let fmas: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i].contains("fma.rn.f32"))
        .collect();
    let (r0, r1) = (
        parse_ins(lines[fmas[0]].trim()).1[0].to_string(),
        parse_ins(lines[fmas[2]].trim()).1[0].to_string(),
    );
    let moved = lines[fmas[2]].replace(&r1, &r0);
    l[fmas[2]] = &moved;
    broken.push(l);
    for (i, l) in broken.iter().enumerate() {
        assert!(
            check_accumulate(&k, &l.join("\n")).is_err(),
            "mutation {i} not caught"
        );
    }
}

#[test]
fn ptxas_assembles_accumulate_kernels() {
    let Some(ptxas) = find_ptxas() else {
        qforge_testkit::unavailable(
            "ptxas",
            "not found: set QFORGE_PTXAS or run scripts/install-ptxas.sh",
        );
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cases: Vec<(String, Kernel)> = Vec::new();
    for order in ACC_ORDERS {
        for accs in [1, 4] {
            cases.push((
                format!("dot {order:?} x{accs}"),
                dot_kernel(order, accs, DType::BF16),
            ));
        }
    }
    for (order, tm, tn) in [
        (ReduceOrder::Strided(32), 1, 1),
        (ReduceOrder::Strided(32), 2, 2),
        (ReduceOrder::Strided(64), 2, 2),
        (ReduceOrder::Strided(8), 4, 4),
    ] {
        cases.push((
            format!("nf4 {tm}x{tn} {order:?}"),
            nf4_tile_kernel(order, tm, tn),
        ));
    }
    cases.push(("nested".into(), nested_accumulate_kernel()));
    let mut failures = Vec::new();
    for (i, (what, kernel)) in cases.iter().enumerate() {
        for target in SmTarget::ALL {
            let text = ptx_text(kernel, target).expect("lowers");
            let lines = instructions(&text).count();
            match assemble(&ptxas, dir.path(), &format!("acc{i}"), &text, target) {
                Ok(s) => println!("ptxas {} {what}: {lines} PTX lines, {s}", target.name()),
                Err(log) => failures.push(format!("{} {what}:\n{log}", target.name())),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "ptxas rejected:\n{}",
        failures.join("\n")
    );
}
