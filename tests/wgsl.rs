//! The WGSL backend: every library kernel lowers to a module naga's validator accepts, the WGSL of
//! each is snapshotted in `snapshots/<kernel>.wgsl.snap` (create new ones locally with
//! `INSTA_UPDATE=always cargo test --test wgsl`; CI never writes snapshots), and the emitted text
//! keeps the numeric contract's shape (no min/max builtins, masked shifts, guarded division,
//! no contractible multiply).

use qforge::codegen::wgsl::{WgslBackend, WgslLayout, BACKEND};
use qforge::codegen::{Backend, Error};
use qforge::ir::{
    Access, BinaryOp, CmpOp, DType, Dim, Kernel, KernelBuilder, NanMode, ReduceOrder, Rounding,
    ScalarType, UnaryOp,
};
use qforge::kernels;

/// (The text itself is reviewed through `tests/snapshots.rs`: representative kernels in full, a
/// hash per kernel.)
#[test]
fn every_library_kernel_validates() {
    let mut count = 0;
    for entry in kernels::catalog() {
        let kernel = entry.build().expect("library kernels build");
        let art = WgslBackend
            .lower(&kernel)
            .unwrap_or_else(|e| panic!("{}: {e}", kernel.name));
        assert_eq!(art.module.entry_points.len(), 1, "{}", kernel.name);
        count += 1;
    }
    assert!(count > 100, "catalog unexpectedly small: {count}");
}

/// One kernel touching every op, every dtype (packed loads and atomic packed stores included),
/// every rounding and every reduction, plus constants that WGSL would reject as
/// const-expressions if they were not folded (overflow, i32::MIN, NaN, inf, sqrt(-1)).
fn every_op_kernel() -> Kernel {
    let mut b = KernelBuilder::new("every_op");
    let n = b.scalar_param("n", ScalarType::U32);
    let s = b.scalar_param("s", ScalarType::F32);
    let si = b.scalar_param("si", ScalarType::I32);
    let d = Dim::Param(n);
    let mut bufs = Vec::new();
    for dt in DType::ALL {
        let r = b.buffer_param(&format!("in_{}", dt.name()), dt, &[d], Access::Read);
        let w = b.buffer_param(&format!("out_{}", dt.name()), dt, &[d], Access::ReadWrite);
        bufs.push((dt, r, w));
    }
    b.set_grid(d);
    let t = b.table_f32("tab", &[1.0, f32::NAN, f32::INFINITY, -0.0]);
    let acc = b.var("acc", ScalarType::F32);
    let i = b.work_item();
    let fx = b.load(bufs[0].1, i);
    let sv = b.param(s);
    let siv = b.param(si);
    // Float arithmetic.
    let mut f = b.mul(fx, sv);
    f = b.add(f, sv);
    f = b.sub(f, fx);
    f = b.div(f, sv);
    f = b.min(f, sv);
    f = b.max(f, fx);
    f = b.fma(f, sv, fx);
    for u in [UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Sqrt] {
        f = b.unary(u, f);
    }
    let idx = b.float_to_int(f, ScalarType::U32, Rounding::NearestEven);
    let l = b.lookup(t, idx);
    f = b.add(f, l);
    // Constant folding edge cases.
    let big = b.const_u32(u32::MAX);
    let one = b.const_u32(1);
    let wrap = b.add(big, one);
    let imin = b.const_i32(i32::MIN);
    let ineg = b.neg(imin);
    let m1 = b.const_i32(-1);
    let idiv = b.div(imin, m1);
    let nanc = b.const_f32(f32::NAN);
    let infc = b.const_f32(f32::INFINITY);
    let negc = b.const_f32(-1.0);
    let sq = b.sqrt(negc);
    let cprod = b.mul(infc, negc);
    f = b.add(f, nanc);
    f = b.add(f, sq);
    f = b.add(f, cprod);
    // Integer arithmetic on runtime values.
    let ui = b.load(bufs[6].1, i); // u32
    let ii = b.load(bufs[5].1, i); // i32
    let mut u = wrap;
    for op in BinaryOp::ALL {
        if op.accepts(ScalarType::U32) {
            u = b.binary(op, u, ui);
        }
    }
    let mut iv = b.add(ineg, idiv);
    for op in BinaryOp::ALL {
        if op.accepts(ScalarType::I32) {
            iv = b.binary(op, iv, ii);
        }
    }
    iv = b.abs(iv);
    iv = b.not(iv);
    iv = b.add(iv, siv);
    for r in Rounding::ALL {
        let a = b.float_to_int(f, ScalarType::I32, r);
        iv = b.add(iv, a);
        let c = b.float_to_int(f, ScalarType::U32, r);
        u = b.add(u, c);
        let g = b.op(qforge::ir::Op::IntToFloat {
            value: u,
            rounding: r,
        });
        f = b.add(f, g);
        let h = b.op(qforge::ir::Op::IntToFloat {
            value: iv,
            rounding: r,
        });
        f = b.add(f, h);
    }
    let ib = b.bitcast(iv, ScalarType::U32);
    u = b.binary(BinaryOp::Xor, u, ib);
    let mut c = b.cmp(CmpOp::Lt, f, sv);
    for op in CmpOp::ALL {
        let x = b.cmp(op, f, fx);
        c = b.binary(BinaryOp::Xor, c, x);
        let y = b.cmp(op, u, ui);
        c = b.binary(BinaryOp::Or, c, y);
        let z = b.cmp(op, iv, ii);
        c = b.binary(BinaryOp::And, c, z);
    }
    c = b.not(c);
    f = b.select(c, f, fx);
    // Reductions.
    let zero = b.const_u32(0);
    let len = b.param(n);
    for &(dt, r, _) in &bufs {
        if dt.is_float() {
            let a = b.reduce_sum(r, zero, len, ReduceOrder::Sequential);
            let s8 = b.reduce_sum(r, zero, len, ReduceOrder::Strided(8));
            let m = b.reduce_absmax(r, zero, len, NanMode::Ignore);
            let p = b.reduce_absmax(r, zero, len, NanMode::Propagate);
            for x in [a, s8, m, p] {
                f = b.add(f, x);
            }
        }
    }
    b.assign(acc, f);
    // Loops and branches; stores of every dtype (packed ones read back too).
    let four = b.const_u32(4);
    b.for_range(zero, len, 3, |b, k| {
        let cur = b.read_var(acc);
        let fv = b.load(bufs[1].2, k);
        let nv = b.add(cur, fv);
        b.assign(acc, nv);
    });
    let fin = b.read_var(acc);
    let ok = b.cmp(CmpOp::Lt, i, four);
    b.if_else(
        ok,
        |b| {
            for &(dt, r, w) in &bufs {
                let x = b.load(r, i);
                let y = b.load(w, i);
                let v = match dt.value_type() {
                    ScalarType::F32 => b.add(x, fin),
                    ScalarType::U32 => b.add(x, u),
                    _ => b.add(y, iv),
                };
                b.store_auto(w, i, v);
            }
        },
        |b| {
            let w = bufs[2].2; // bf16
            b.store_rounded(w, i, fin, Rounding::NearestEven);
        },
    );
    b.finish()
}

#[test]
fn every_op_kernel_verifies_and_validates() {
    let k = every_op_kernel();
    qforge::ir::verify(&k).expect("test kernel verifies");
    let art = WgslBackend.lower(&k).unwrap_or_else(|e| panic!("{e}"));
    let text = &art.wgsl;
    // Packed writable buffers are atomic words; packed read-only ones plain words.
    let decl = |name: String| -> &str {
        // naga's namer may append `_` to names ending in a digit.
        text.lines()
            .find(|l| l.contains(&format!("{name}:")) || l.contains(&format!("{name}_:")))
            .unwrap_or_else(|| panic!("no declaration of {name}"))
    };
    for dt in [DType::U8, DType::I8, DType::F16, DType::BF16] {
        assert!(decl(format!("b_out_{}", dt.name())).contains("array<atomic<u32>>"));
        assert!(decl(format!("b_in_{}", dt.name())).contains("array<u32>"));
    }
    assert!(text.contains("atomicAnd(") && text.contains("atomicOr("));
    // The folded constant u32::MAX + 1 never reaches WGSL as an overflowing expression.
    assert!(!text.contains("4294967295u + 1u"));
}

fn contract_text() -> String {
    let mut b = KernelBuilder::new("contract");
    let n = b.scalar_param("n", ScalarType::U32);
    let x = b.buffer_param("x", DType::F32, &[Dim::Param(n)], Access::Read);
    let u = b.buffer_param("u", DType::U32, &[Dim::Param(n)], Access::Read);
    let y = b.buffer_param("y", DType::F32, &[Dim::Param(n)], Access::Write);
    let z = b.buffer_param("z", DType::U32, &[Dim::Param(n)], Access::Write);
    b.set_grid(Dim::Param(n));
    let i = b.work_item();
    let a = b.load(x, i);
    let ua = b.load(u, i);
    let p = b.mul(a, a);
    let s = b.add(p, a);
    let lo = b.min(s, a);
    let hi = b.max(lo, p);
    b.store(y, i, hi);
    let sh = b.shl(ua, ua);
    let sr = b.shr(sh, ua);
    let q = b.div(sr, ua);
    let r = b.rem(q, ua);
    b.store(z, i, r);
    let k = b.finish();
    WgslBackend.emit_text(&k).expect("lowers")
}

#[test]
fn min_max_are_compare_and_select_not_builtins() {
    let t = contract_text();
    assert!(!t.contains("min(") && !t.contains("max("), "{t}");
    assert!(t.contains("select("), "{t}");
}

#[test]
fn shifts_are_masked_and_integer_division_guarded() {
    let t = contract_text();
    assert_eq!(t.matches("& 31u").count(), 2, "{t}");
    // Both div and rem replace a zero divisor by 1, then select 0.
    assert!(t.matches("== 0u").count() >= 4, "{t}");
}

#[test]
fn float_products_cannot_be_contracted() {
    let t = contract_text();
    // The product passes through the opaque zero before the add sees it.
    assert!(t.contains("params.qf_zero"), "{t}");
    assert!(t.contains("qf_zero: u32"), "{t}");
    assert!(!t.contains("fma("), "{t}");
}

#[test]
fn layout_binds_buffers_in_order_then_params() {
    let k = kernels::catalog()[0].build().unwrap();
    let l = WgslLayout::new(&k);
    let names: Vec<&str> = l.buffers.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names, ["x", "packed", "absmax"]);
    assert_eq!(l.params_binding, 3);
    assert_eq!(l.scalars.len(), 3);
    assert_eq!(l.zero_offset, 12);
    assert_eq!(l.params_size, 16);
    assert!(l.buffers[1].atomic && l.buffers[1].packed && !l.buffers[1].read_only);
    assert!(l.buffers[0].read_only && !l.buffers[0].atomic);
    assert_eq!(WgslLayout::dispatch(0), [0, 0, 0]);
    assert_eq!(WgslLayout::dispatch(1), [1, 1, 1]);
    assert_eq!(WgslLayout::dispatch(64 * 65535 + 1), [65535, 2, 1]);
    let [x, y, _] = WgslLayout::dispatch(u32::MAX);
    assert!(x as u64 * y as u64 * 64 >= u32::MAX as u64);
}

#[test]
fn unsupported_rounding_is_an_error_naming_the_backend() {
    // Unverifiable kernels are rejected before lowering.
    let mut b = KernelBuilder::new("bad");
    let o = b.buffer_param("o", DType::F16, &[Dim::Const(1)], Access::Write);
    let i = b.work_item();
    let f = b.const_f32(1.0);
    b.store_rounded(o, i, f, Rounding::Up);
    let k = b.finish();
    match WgslBackend.lower(&k) {
        Err(Error::Ir(_))
        | Err(Error::Unsupported {
            backend: BACKEND, ..
        }) => {}
        other => panic!("expected an error, got {other:?}"),
    }
    assert_eq!(WgslBackend.name(), "wgsl");
}

/// The SPIR-V debug output of a library matmul kernel and of the every-op kernel: a module
/// header with the SPIR-V magic number and version 1.3, one `OpEntryPoint GLCompute`.
#[test]
fn spirv_debug_output_has_a_compute_entry_point() {
    let spec = qforge::kernels::catalog()
        .into_iter()
        .find(|s| s.name().starts_with("matmul_4bit_nf4_nested"))
        .expect("a matmul kernel in the catalog");
    for k in [spec.build().unwrap(), every_op_kernel()] {
        let words = WgslBackend.lower(&k).unwrap().spirv().unwrap();
        assert_eq!(words[0], 0x0723_0203, "{}: SPIR-V magic", k.name);
        assert_eq!(words[1], 0x0001_0300, "{}: version 1.3", k.name);
        // Walk the instructions: opcode 15 is OpEntryPoint, its first operand 5 is GLCompute.
        let (mut i, mut entries) = (5, 0);
        while i < words.len() {
            let (len, op) = ((words[i] >> 16) as usize, words[i] & 0xFFFF);
            assert!(len > 0, "{}: malformed instruction at word {i}", k.name);
            if op == 15 {
                assert_eq!(words[i + 1], 5, "{}: GLCompute", k.name);
                entries += 1;
            }
            i += len;
        }
        assert_eq!(i, words.len(), "{}: instructions fill the module", k.name);
        assert_eq!(entries, 1, "{}", k.name);
    }
}
