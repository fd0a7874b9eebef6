//! The PTX backend without a GPU: insta snapshots of every library kernel's PTX (sm_80), ptxas
//! assembling every library kernel (plus a kernel using every op) for sm_80 and sm_90, and checks
//! of the numeric contract on the emitted text.
//!
//! ptxas is found through `QFORGE_PTXAS`, else `target/ptxas-venv` (made by
//! `scripts/install-ptxas.sh`), else `ptxas` on `PATH`. Without one the assembler test prints
//! why it skips, except where `qforge_testkit` requires ptxas (CI), where it fails.

#[path = "ptx_support/mod.rs"]
mod ptx_support;

use ptx_support::*;
use qforge::codegen::ptx::{lower, ptx_text, SmTarget};
use qforge::ir::{
    verify, Access, BinaryOp, CmpOp, DType, Dim, Kernel, KernelBuilder, NanMode, Op, ReduceOrder,
    Rounding, ScalarType, UnaryOp,
};

/// Every library kernel lowers, the same text twice (the text itself is reviewed through
/// `tests/snapshots.rs`: representative kernels in full, a hash per kernel).
#[test]
fn every_library_kernel_lowers_to_ptx_deterministically() {
    for kernel in library_kernels() {
        let text = ptx_text(&kernel, SmTarget::Sm80).expect("lowers to PTX");
        assert_eq!(
            text,
            ptx_text(&kernel, SmTarget::Sm80).expect("again"),
            "{}",
            kernel.name
        );
    }
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

#[test]
fn ptxas_assembles_every_library_kernel_for_sm80_and_sm90() {
    let Some(ptxas) = find_ptxas() else {
        qforge_testkit::unavailable(
            "ptxas",
            "not found: set QFORGE_PTXAS or run scripts/install-ptxas.sh",
        );
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

/// Tables beyond the 64 KiB `.const` bank are refused with an error naming the size (ptxas
/// would reject the module); a searched table that its decomposition replaces does not count.
#[test]
fn tables_beyond_the_const_bank_are_a_clear_error() {
    let build = |entries: usize, search: bool| {
        let mut b = KernelBuilder::new("big_table");
        let n = b.scalar_param("n", ScalarType::U32);
        let x = b.buffer_param("x", DType::F32, &[Dim::Param(n)], Access::Read);
        let y = b.buffer_param("y", DType::U32, &[Dim::Param(n)], Access::Write);
        b.set_grid(Dim::Param(n));
        let data: Vec<f32> = (0..entries).map(|i| i as f32).collect();
        let t = b.table_f32("t", &data);
        let i = b.work_item();
        let v = b.load(x, i);
        let c = if search {
            b.search_sorted(t, v)
        } else {
            let bits = b.bitcast(v, ScalarType::U32);
            let e = b.lookup(t, bits);
            b.bitcast(e, ScalarType::U32)
        };
        b.store(y, i, c);
        b.finish()
    };
    let err = lower(&build(20_000, false), SmTarget::Sm80).unwrap_err();
    assert!(
        err.to_string().contains("80000 bytes") && err.to_string().contains("65536"),
        "{err}"
    );
    // 10,000 searched entries: the level tables (16,383 words) replace the 40 KB table.
    assert!(lower(&build(10_000, true), SmTarget::Sm80).is_ok());
}
