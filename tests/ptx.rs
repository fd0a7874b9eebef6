//! The PTX backend without a GPU: insta snapshots of every library kernel's PTX (sm_80), ptxas
//! assembling every library kernel (plus a kernel using every op) for sm_80 and sm_90, and checks
//! of the numeric contract on the emitted text.
//!
//! ptxas is found through `QFORGE_PTXAS`, else `target/ptxas-venv` (made by
//! `scripts/install-ptxas.sh`), else `ptxas` on `PATH`. Without one the assembler test prints
//! why it skips, except under `CI=true`, where it fails.

use std::path::{Path, PathBuf};
use std::process::Command;

use qforge::codegen::ptx::{lower, ptx_text, SmTarget};
use qforge::ir::{
    library, verify, Access, BinaryOp, CmpOp, DType, Dim, Kernel, KernelBuilder, NanMode, Op,
    ReduceOrder, Rounding, ScalarType, Stmt, UnaryOp,
};

fn settings() -> insta::Settings {
    let mut s = insta::Settings::clone_current();
    s.set_snapshot_path(concat!(env!("CARGO_MANIFEST_DIR"), "/snapshots"));
    s.set_prepend_module_to_snapshot(false);
    s.set_omit_expression(true);
    s
}

fn library_kernels() -> Vec<Kernel> {
    library::catalog()
        .into_iter()
        .map(|e| e.build().expect("library kernels build"))
        .collect()
}

#[test]
fn ptx_of_every_library_kernel() {
    settings().bind(|| {
        for kernel in library_kernels() {
            let text = ptx_text(&kernel, SmTarget::Sm80).expect("lowers to PTX");
            insta::assert_snapshot!(format!("{}.ptx", kernel.name), text);
        }
    });
}

/// A kernel that uses every op, every dtype and every rounding the backend handles.
fn every_op_kernel() -> Kernel {
    let mut b = KernelBuilder::new("every_op");
    let n = b.scalar_param("n", ScalarType::U32);
    let s = b.scalar_param("s", ScalarType::I32);
    let f = b.scalar_param("f", ScalarType::F32);
    let dims = [Dim::Param(n)];
    let bufs: Vec<_> = DType::ALL
        .iter()
        .map(|d| b.buffer_param(&format!("in_{}", d.name()), *d, &dims, Access::Read))
        .collect();
    let outs: Vec<_> = DType::ALL
        .iter()
        .map(|d| b.buffer_param(&format!("out_{}", d.name()), *d, &dims, Access::ReadWrite))
        .collect();
    b.set_grid(Dim::Param(n));
    let tab = b.table_f32("t", &[1.0, -2.0, 0.5]);
    let var_f = b.var("acc", ScalarType::F32);
    let var_b = b.var("flag", ScalarType::Bool);
    let w = b.work_item();
    let (sv, fv) = (b.param(s), b.param(f));
    let x = b.load(bufs[0], w); // f32
    let xh = b.load(bufs[1], w); // f16
    let xb = b.load(bufs[2], w); // bf16
    let u8v = b.load(bufs[3], w);
    let i8v = b.load(bufs[4], w);
    let i32v = b.load(bufs[5], w);
    let u32v = b.load(bufs[6], w);
    let mut fl = b.add(x, xh);
    for op in BinaryOp::ALL {
        if op.accepts(ScalarType::F32) {
            fl = b.binary(op, fl, xb);
        }
    }
    let mut iv = b.add(i8v, sv);
    let mut uv = b.add(u8v, u32v);
    for op in BinaryOp::ALL {
        if op.accepts(ScalarType::I32) {
            iv = b.binary(op, iv, i32v);
            uv = b.binary(op, uv, u32v);
        }
    }
    for op in UnaryOp::ALL {
        if op.accepts(ScalarType::F32) {
            fl = b.unary(op, fl);
        }
        if op.accepts(ScalarType::I32) {
            iv = b.unary(op, iv);
        }
        if op.accepts(ScalarType::U32) {
            uv = b.unary(op, uv);
        }
    }
    fl = b.fma(fl, fv, x);
    let t = b.lookup(tab, uv);
    fl = b.add(fl, t);
    let mut p = b.const_bool(true);
    for c in CmpOp::ALL {
        let cf = b.cmp(c, fl, x);
        let ci = b.cmp(c, iv, i32v);
        let cu = b.cmp(c, uv, u32v);
        p = b.binary(BinaryOp::Xor, p, cf);
        p = b.binary(BinaryOp::And, p, ci);
        p = b.binary(BinaryOp::Or, p, cu);
    }
    let pe = b.cmp(CmpOp::Eq, p, p);
    p = b.cmp(CmpOp::Ne, p, pe);
    p = b.not(p);
    let old = b.read_var(var_b);
    p = b.select(old, p, pe);
    b.assign(var_b, p);
    fl = b.select(p, fl, x);
    for r in Rounding::ALL {
        let i = b.float_to_int(fl, ScalarType::I32, r);
        let u = b.float_to_int(fl, ScalarType::U32, r);
        let fi = b.op(Op::IntToFloat {
            value: i,
            rounding: r,
        });
        let fu = b.op(Op::IntToFloat {
            value: u,
            rounding: r,
        });
        fl = b.add(fl, fi);
        fl = b.add(fl, fu);
    }
    let bits = b.bitcast(fl, ScalarType::U32);
    let back = b.bitcast(bits, ScalarType::I32);
    let fl2 = b.bitcast(back, ScalarType::F32);
    let zero = b.const_u32(0);
    let nv = b.param(n);
    let seq = b.reduce_sum(bufs[0], zero, nv, ReduceOrder::Sequential);
    let strided = b.reduce_sum(bufs[1], zero, nv, ReduceOrder::Strided(8));
    let am = b.reduce_absmax(bufs[2], zero, nv, NanMode::Propagate);
    let ai = b.reduce_absmax(bufs[0], zero, nv, NanMode::Ignore);
    let mut total = b.add(fl2, seq);
    for v in [strided, am, ai] {
        total = b.add(total, v);
    }
    b.assign(var_f, total);
    b.for_range(zero, nv, 3, |b, i| {
        let acc = b.read_var(var_f);
        let c = b.cmp(CmpOp::Lt, i, w);
        b.if_else(
            c,
            |b| {
                let one = b.const_f32(1.0);
                let s = b.add(acc, one);
                b.assign(var_f, s);
            },
            |b| {
                let s = b.sqrt(acc);
                b.assign(var_f, s);
            },
        );
    });
    let res = b.read_var(var_f);
    b.store(outs[0], w, res);
    b.store_rounded(outs[1], w, res, Rounding::NearestEven);
    b.store_rounded(outs[2], w, res, Rounding::NearestEven);
    b.store(outs[3], w, uv);
    b.store(outs[4], w, iv);
    b.store(outs[5], w, iv);
    b.store(outs[6], w, uv);
    let k = b.finish();
    verify(&k).expect("every_op verifies");
    k
}

// ----- the numeric contract on the text -----

fn instructions(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .map(|l| l.split("//").next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
}

/// True when the IR asks for a fused multiply-add: an `Op::Fma`, or an `accumulate` (one fma
/// per element and accumulator) anywhere in the body.
fn has_fma(kernel: &Kernel) -> bool {
    fn accumulates(stmts: &[Stmt]) -> bool {
        stmts.iter().any(|s| match s {
            Stmt::Accumulate { .. } => true,
            Stmt::If {
                then_body,
                else_body,
                ..
            } => accumulates(then_body) || accumulates(else_body),
            Stmt::For { body, .. } => accumulates(body),
            Stmt::Let(_) | Stmt::Store { .. } | Stmt::Assign { .. } => false,
        })
    }
    accumulates(&kernel.body)
        || kernel
            .values
            .iter()
            .any(|(_, d)| matches!(d.op, Op::Fma(..)))
}

/// Checks every rule that can be read off the text; returns the first broken one.
fn contract_violation(kernel: &Kernel, text: &str) -> Option<String> {
    let fma = has_fma(kernel);
    for ins in instructions(text) {
        // Drop a guard predicate (`@%p1 `) to get at the opcode.
        let unguarded = match ins.strip_prefix('@') {
            Some(rest) => rest.split_once(' ').map_or("", |(_, r)| r),
            None => ins,
        };
        let opcode = unguarded.split_whitespace().next().unwrap_or("");
        if opcode.contains(".ftz") || opcode.contains(".approx") {
            return Some(format!("flush/approximate instruction: {ins}"));
        }
        if opcode.starts_with("fma") && !fma {
            return Some(format!("fma without Op::Fma: {ins}"));
        }
        if opcode.starts_with("mad") && opcode.ends_with(".f32") {
            return Some(format!("contracted float multiply-add: {ins}"));
        }
        let float_arith = ["add", "sub", "mul", "div", "sqrt", "fma"]
            .iter()
            .any(|op| opcode.starts_with(&format!("{op}.")) && opcode.ends_with(".f32"));
        if float_arith && !opcode.contains(".rn.") {
            return Some(format!("float instruction without .rn: {ins}"));
        }
        if (opcode.starts_with("min.") || opcode.starts_with("max.")) && opcode.ends_with("f32") {
            return Some(format!("hardware float min/max: {ins}"));
        }
        if opcode.starts_with("cvt.") && opcode.contains(".f16.f32") | opcode.contains(".bf16.f32")
        {
            let rounded = [".rn.", ".rz.", ".rm.", ".rp."]
                .iter()
                .any(|r| opcode.contains(r));
            if !rounded {
                return Some(format!("narrowing cvt without rounding: {ins}"));
            }
        }
    }
    None
}

#[test]
fn every_library_kernel_keeps_the_numeric_contract() {
    let kernels = library_kernels();
    assert!(!kernels.is_empty());
    for kernel in &kernels {
        for target in SmTarget::ALL {
            let text = ptx_text(kernel, target).expect("lowers");
            if let Some(v) = contract_violation(kernel, &text) {
                panic!("{} ({}): {v}", kernel.name, target.name());
            }
            assert!(text.contains(&format!(".target {}", target.name())));
            assert!(text.contains(".address_size 64"));
            assert_eq!(text.matches(".entry").count(), 1, "{}", kernel.name);
        }
    }
}

#[test]
fn the_checker_catches_broken_text() {
    let k = every_op_kernel();
    for bad in [
        "\tadd.f32 %f1, %f2, %f3;",
        "\tmul.rn.ftz.f32 %f1, %f2, %f3;",
        "\tsqrt.approx.f32 %f1, %f2;",
        "\tmin.f32 %f1, %f2, %f3;",
        "\tcvt.f16.f32 %h1, %f2;",
    ] {
        assert!(contract_violation(&k, bad).is_some(), "{bad}");
    }
    let mut no_fma = KernelBuilder::new("no_fma");
    let a = no_fma.const_f32(1.0);
    let _ = no_fma.add(a, a);
    let no_fma = no_fma.finish();
    assert!(contract_violation(&no_fma, "\tfma.rn.f32 %f1, %f2, %f3, %f4;").is_some());
}

#[test]
fn every_op_lowers_as_the_contract_says() {
    let k = every_op_kernel();
    let text = ptx_text(&k, SmTarget::Sm80).expect("every_op lowers");
    assert_eq!(contract_violation(&k, &text), None);
    let ins: Vec<&str> = instructions(&text).collect();
    let has = |needle: &str| ins.iter().any(|l| l.starts_with(needle));
    // fma exactly once: the IR has exactly one Op::Fma.
    assert_eq!(
        ins.iter().filter(|l| l.starts_with("fma.rn.f32")).count(),
        1
    );
    for needle in [
        "add.rn.f32",
        "sub.rn.f32",
        "mul.rn.f32",
        "div.rn.f32",
        "sqrt.rn.f32",
        // min/max: compare + select, operands swapped as select(b < a, b, a).
        "setp.lt.f32",
        "setp.gt.f32",
        "selp.f32",
        // IEEE ne is unordered.
        "setp.neu.f32",
        // sign operations on the bit pattern.
        "xor.b32",
        "and.b32",
        // conversions name rounding.
        "cvt.rni.s32.f32",
        "cvt.rzi.u32.f32",
        "cvt.rmi.s32.f32",
        "cvt.rpi.u32.f32",
        "cvt.rn.f32.s32",
        "cvt.rz.f32.u32",
        "cvt.rm.f32.s32",
        "cvt.rp.f32.u32",
        "setp.nan.f32",
        "cvt.rn.f16.f32",
        "cvt.rn.bf16.f32",
        "cvt.f32.f16",
        // narrow integer memory.
        "ld.global.u8",
        "ld.global.s8",
        "st.global.u8",
        // guarded integer division.
        "div.s32",
        "div.u32",
        "rem.s32",
        "rem.u32",
        "ld.const.f32",
    ] {
        assert!(has(needle), "missing {needle} in:\n{text}");
    }
    // Every shift amount is masked with 31 just before the shift.
    for (i, l) in ins.iter().enumerate() {
        if l.starts_with("shl.") || l.starts_with("shr.") {
            let amount = l.trim_end_matches(';').rsplit(", ").next().unwrap_or("");
            let masked = format!("and.b32 {amount}, ");
            let prev = ins[i - 1];
            let is_bf16_widen = l.ends_with(", 16;");
            assert!(
                is_bf16_widen || (prev.starts_with(&masked) && prev.ends_with(", 31;")),
                "unmasked shift: {l} after {prev}"
            );
        }
    }
    // The lookup index is clamped to len - 1 = 2.
    assert!(ins
        .iter()
        .any(|l| l.starts_with("min.u32") && l.ends_with(", 2;")));
    // Narrow stores with a directed rounding are rejected (today by the verifier, which allows
    // only rne; the backend itself rejects rdn/rup to bf16), with an error naming the format.
    let mut b = KernelBuilder::new("bf16_down");
    let out = b.buffer_param("o", DType::BF16, &[Dim::Const(1)], Access::Write);
    let (z, v) = (b.const_u32(0), b.const_f32(1.5));
    b.store_rounded(out, z, v, Rounding::Up);
    let err = lower(&b.finish(), SmTarget::Sm80).expect_err("bf16 rup is unsupported");
    assert!(err.to_string().contains("bf16"), "{err}");
}

// ----- ptxas -----

fn find_ptxas() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("QFORGE_PTXAS") {
        return Some(PathBuf::from(p));
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/ptxas-venv/lib");
    if let Ok(dirs) = std::fs::read_dir(&venv) {
        let mut found: Vec<PathBuf> = dirs
            .flatten()
            .map(|d| d.path().join("site-packages/nvidia/cuda_nvcc/bin/ptxas"))
            .filter(|p| p.is_file())
            .collect();
        found.sort();
        if let Some(p) = found.pop() {
            return Some(p);
        }
    }
    let ok = Command::new("ptxas").arg("--version").output();
    ok.ok()
        .filter(|o| o.status.success())
        .map(|_| PathBuf::from("ptxas"))
}

/// Registers and spill bytes reported by `ptxas -v`, or the error text.
fn assemble(
    ptxas: &Path,
    dir: &Path,
    name: &str,
    text: &str,
    target: SmTarget,
) -> Result<String, String> {
    let src = dir.join(format!("{name}.{}.ptx", target.name()));
    std::fs::write(&src, text).map_err(|e| format!("writing {}: {e}", src.display()))?;
    let out = Command::new(ptxas)
        .arg(format!("-arch={}", target.name()))
        .arg("-v")
        .arg(&src)
        .arg("-o")
        .arg(dir.join(format!("{name}.{}.cubin", target.name())))
        .output()
        .map_err(|e| format!("running {}: {e}", ptxas.display()))?;
    let log =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || log.contains("error") {
        return Err(log);
    }
    let regs = log
        .split("Used ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .unwrap_or("?")
        .to_string();
    let spill_stores = log
        .split(" bytes spill stores")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .unwrap_or("?")
        .to_string();
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains("warning")).collect();
    let mut summary = format!("{regs} registers, {spill_stores} bytes spilled");
    if !warnings.is_empty() {
        summary = format!("{summary} [{}]", warnings.join("; "));
    }
    Ok(summary)
}

#[test]
fn ptxas_assembles_every_library_kernel_for_sm80_and_sm90() {
    let Some(ptxas) = find_ptxas() else {
        let why = "no ptxas: set QFORGE_PTXAS or run scripts/install-ptxas.sh";
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("{why} (required under CI=true)");
        }
        eprintln!("skipping ptxas test: {why}");
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let mut kernels = library_kernels();
    kernels.push(every_op_kernel());
    let mut failures = Vec::new();
    let mut report = Vec::new();
    for kernel in &kernels {
        for target in SmTarget::ALL {
            let text = ptx_text(kernel, target).expect("lowers");
            match assemble(&ptxas, dir.path(), &kernel.name, &text, target) {
                Ok(summary) => report.push(format!("{} {}: {summary}", target.name(), kernel.name)),
                Err(log) => failures.push(format!("{} {}:\n{log}", target.name(), kernel.name)),
            }
        }
    }
    for line in &report {
        println!("ptxas {line}");
    }
    let warned = report.iter().filter(|l| l.ends_with(']')).count();
    let spilled: Vec<&String> = report
        .iter()
        .filter(|l| !l.contains(" 0 bytes spilled"))
        .collect();
    println!(
        "ptxas: {} modules assembled, {} failed, {} with spills, {warned} with warnings",
        report.len(),
        failures.len(),
        spilled.len()
    );
    assert!(
        failures.is_empty(),
        "ptxas rejected:\n{}",
        failures.join("\n")
    );
}

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
    let code = b.table_f32("nf4", &library::maps::nf4_code());
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
    let loads = body
        .iter()
        .filter(|s| matches!(s, Stmt::Let(v) if matches!(k.values[*v].op, Op::Load { .. })))
        .count();
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
            let fma_in_body = inner.iter().any(|l| l.starts_with("fma"));
            if branches != 0 || ld != loads || fma_in_body {
                return Err(format!(
                    "element {j}: {branches} branches, {ld} loads, body fma {fma_in_body}"
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
    // The library's summation kernels (the fused 4-bit matmuls) keep the same order.
    let mut library_accumulates = 0;
    for k in library_kernels() {
        if k.body.iter().any(|s| matches!(s, Stmt::Accumulate { .. })) {
            let text = ptx_text(&k, SmTarget::Sm80).expect("lowers");
            check_accumulate(&k, &text).unwrap_or_else(|e| panic!("{}: {e}", k.name));
            library_accumulates += 1;
        }
    }
    println!("{library_accumulates} library kernels with an accumulate checked");
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
        eprintln!("skipping ptxas test: no ptxas (QFORGE_PTXAS or scripts/install-ptxas.sh)");
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
