//! The CPU device (Cranelift JIT) op by op: every op family on edge values against expectations
//! computed here independently (plain Rust, the `half` crate) and against the reference
//! interpreter; loads and stores of every dtype (f16/bf16 exhaustively), reductions in their
//! stated orders, control flow, bounds checks, threading, the kernel cache, and a proptest of
//! random expression kernels.

use std::sync::OnceLock;

use half::{bf16, f16};
use proptest::prelude::*;
use qforge_ir::{
    count_mismatches, Access, BinaryOp, CmpOp, DType, Dim, Kernel, KernelBuilder, NanMode,
    OwnedArg, ParamId, ReduceOrder, Rounding, Scalar, ScalarType, UnaryOp, Value,
};
use qforge_runtime::{CpuDevice, CpuOptions, Device};

#[path = "cpu_ops/expr.rs"]
mod expr;
#[path = "cpu_ops/flow.rs"]
mod flow;
#[path = "cpu_ops/fused.rs"]
mod fused;
#[path = "cpu_ops/memory.rs"]
mod memory;
#[path = "cpu_ops/reduce.rs"]
mod reduce;
#[path = "cpu_ops/vector.rs"]
mod vector;

// ----- harness -----

fn cpu() -> &'static CpuDevice {
    static CPU: OnceLock<CpuDevice> = OnceLock::new();
    CPU.get_or_init(|| CpuDevice::new().expect("Cranelift supports the host"))
}

/// A CPU device restricted to the baseline instruction set (x86_64: SSE2, where `fma` and
/// `nearest`/`floor`/`ceil` are calls to software routines).
fn baseline_cpu() -> &'static CpuDevice {
    static CPU: OnceLock<CpuDevice> = OnceLock::new();
    CPU.get_or_init(|| {
        let options = CpuOptions {
            native_features: false,
            ..CpuOptions::default()
        };
        CpuDevice::with_options(options).expect("Cranelift supports the host")
    })
}

/// Runs `kernel` on each device and returns the arguments after the first device's launch;
/// the reference interpreter must produce identical outputs (NaN == NaN).
fn run_on_all(devices: &[&dyn Device], kernel: &Kernel, args: Vec<OwnedArg>) -> Vec<OwnedArg> {
    let mut reference = args.clone();
    qforge_ir::interp::run(kernel, &mut OwnedArg::borrow_all(&mut reference))
        .unwrap_or_else(|e| panic!("interpreter: {e}"));
    let mut first = None;
    for device in devices {
        let mut out = args.clone();
        device
            .launch(kernel, &mut OwnedArg::borrow_all(&mut out))
            .unwrap_or_else(|e| panic!("{}: {e}", device.name()));
        let (bad, total) = count_mismatches(kernel, &out, &reference);
        assert_eq!(
            bad, 0,
            "kernel {}: {bad} of {total} outputs differ from the interpreter",
            kernel.name
        );
        first.get_or_insert(out);
    }
    first.expect("at least one device")
}

fn run_on(device: &dyn Device, kernel: &Kernel, args: Vec<OwnedArg>) -> Vec<OwnedArg> {
    run_on_all(&[device], kernel, args)
}

/// Runs on the native and the baseline CPU device, both checked against the interpreter.
fn run(kernel: &Kernel, args: Vec<OwnedArg>) -> Vec<OwnedArg> {
    run_on_all(&[cpu(), baseline_cpu()], kernel, args)
}

/// `y[i] = f(x0[i], x1[i], ...)` over `n` work items (`f16`/`bf16` outputs round to nearest).
fn elementwise(
    name: &str,
    ins: &[DType],
    out: DType,
    f: impl FnOnce(&mut KernelBuilder, &[Value]) -> Value,
) -> Kernel {
    let mut b = KernelBuilder::new(name);
    let n = b.scalar_param("n", ScalarType::U32);
    let xs: Vec<ParamId> = (0..ins.len())
        .map(|k| b.buffer_param(&format!("x{k}"), ins[k], &[Dim::Param(n)], Access::Read))
        .collect();
    let y = b.buffer_param("y", out, &[Dim::Param(n)], Access::Write);
    b.set_grid(Dim::Param(n));
    let i = b.work_item();
    let vals: Vec<Value> = xs.iter().map(|x| b.load(*x, i)).collect();
    let r = f(&mut b, &vals);
    b.store_auto(y, i, r);
    b.finish()
}

/// Runs an [`elementwise`] kernel and returns the output bytes.
fn run_elementwise(kernel: &Kernel, inputs: &[Vec<u8>], out: DType) -> Vec<u8> {
    let n = inputs[0].len() / kernel_in_size(kernel);
    let mut args = vec![OwnedArg::Scalar(Scalar::U32(n as u32))];
    args.extend(inputs.iter().map(|b| OwnedArg::Read(b.clone())));
    args.push(OwnedArg::Write(vec![0xA5; n * out.size_bytes()]));
    match run(kernel, args).pop() {
        Some(OwnedArg::Write(bytes)) => bytes,
        other => panic!("unexpected output {other:?}"),
    }
}

fn kernel_in_size(kernel: &Kernel) -> usize {
    match &kernel.params.iter().nth(1).expect("an input").1.kind {
        qforge_ir::ParamKind::Buffer { dtype, .. } => dtype.size_bytes(),
        qforge_ir::ParamKind::Scalar(_) => panic!("input is a scalar"),
    }
}

fn le_f32(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
fn le_u32(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}
fn u32s(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Same bits, or both NaN (the numeric contract's only relaxation).
fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

fn assert_f32(got: &[f32], want: &[f32], what: impl Fn(usize) -> String) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            same(*g, *w),
            "{}: got {g:?} ({:#010x}), want {w:?} ({:#010x})",
            what(i),
            g.to_bits(),
            w.to_bits()
        );
    }
}

/// Cartesian product of `v` with itself, as two columns.
fn pairs<T: Copy>(v: &[T]) -> (Vec<T>, Vec<T>) {
    v.iter()
        .flat_map(|a| v.iter().map(move |b| (*a, *b)))
        .unzip()
}

#[rustfmt::skip]
const F_EDGES: [f32; 30] = [
    0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, 2.5, -2.5, 3.0, 0.1, -7.25, f32::MIN_POSITIVE,
    -f32::MIN_POSITIVE, f32::MAX, f32::MIN, f32::INFINITY, f32::NEG_INFINITY, f32::NAN,
    16777216.0, 16777218.0, 2147483648.0, -2147483648.0, 4294967296.0, -2147483904.0, 65504.0,
    65520.0, 1e-40, -3e-39, 123456.79,
];

fn f_edges() -> Vec<f32> {
    let mut v = F_EDGES.to_vec();
    v.extend([
        f32::from_bits(1),
        f32::from_bits(0x807f_ffff),
        f32::from_bits(0xffc0_0001),
        f32::from_bits(0x7f80_0001),
    ]);
    v
}

#[rustfmt::skip]
const U_EDGES: [u32; 20] = [
    0, 1, 2, 3, 7, 31, 32, 33, 255, 256, 65535, 16777217, 0x7fff_ffff, 0x8000_0000, 0x8000_0001,
    0xffff_fffe, 0xffff_ffff, 12345678, 0xdead_beef, 100,
];

// ----- independent reference semantics -----

fn ref_f32_binary(op: BinaryOp, a: f32, b: f32) -> f32 {
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        BinaryOp::Min => {
            if b < a {
                b
            } else {
                a
            }
        }
        BinaryOp::Max => {
            if b > a {
                b
            } else {
                a
            }
        }
        other => panic!("{other:?} is not an f32 op"),
    }
}

fn ref_u32_binary(op: BinaryOp, a: u32, b: u32) -> u32 {
    match op {
        BinaryOp::Add => a.wrapping_add(b),
        BinaryOp::Sub => a.wrapping_sub(b),
        BinaryOp::Mul => a.wrapping_mul(b),
        BinaryOp::Div => a.checked_div(b).unwrap_or(0),
        BinaryOp::Rem => a.checked_rem(b).unwrap_or(0),
        BinaryOp::Min => a.min(b),
        BinaryOp::Max => a.max(b),
        BinaryOp::And => a & b,
        BinaryOp::Or => a | b,
        BinaryOp::Xor => a ^ b,
        BinaryOp::Shl => a.wrapping_shl(b),
        BinaryOp::Shr => a.wrapping_shr(b),
        BinaryOp::MulHi => ((u128::from(a) * u128::from(b)) >> 32) as u32,
    }
}

fn ref_i32_binary(op: BinaryOp, a: i32, b: i32) -> i32 {
    match op {
        BinaryOp::Div if b == 0 => 0,
        BinaryOp::Rem if b == 0 => 0,
        BinaryOp::Div => a.wrapping_div(b),
        BinaryOp::Rem => a.wrapping_rem(b),
        BinaryOp::Min => a.min(b),
        BinaryOp::Max => a.max(b),
        BinaryOp::Shr => a.wrapping_shr(b as u32),
        BinaryOp::MulHi => ((i128::from(a) * i128::from(b)) >> 32) as i32,
        other => ref_u32_binary(other, a as u32, b as u32) as i32,
    }
}

fn ref_float_to_int(x: f32, to: ScalarType, r: Rounding) -> u32 {
    let y = match r {
        Rounding::NearestEven => x.round_ties_even(),
        Rounding::TowardZero => x.trunc(),
        Rounding::Down => x.floor(),
        Rounding::Up => x.ceil(),
    };
    // Rust's `as` saturates and maps NaN to 0.
    if to == ScalarType::U32 {
        y as u32
    } else {
        y as i32 as u32
    }
}

/// Integer to f32 by rounding the magnitude to 24 significant bits in integer arithmetic.
fn ref_int_to_float(bits: u32, signed: bool, r: Rounding) -> f32 {
    let (neg, mag) = if signed && (bits as i32) < 0 {
        (true, (bits as i32).unsigned_abs())
    } else {
        (false, bits)
    };
    let width = 32 - mag.leading_zeros();
    let m = mag as u64;
    let (lo, hi, s) = if width <= 24 {
        (m, m, 0)
    } else {
        let s = width - 24;
        let t = (m >> s) << s;
        (t, if t == m { t } else { t + (1 << s) }, s)
    };
    let rounded = match (r, neg) {
        _ if lo == hi => lo,
        (Rounding::TowardZero, _) | (Rounding::Down, false) | (Rounding::Up, true) => lo,
        (Rounding::Up, false) | (Rounding::Down, true) => hi,
        (Rounding::NearestEven, _) => match (m - lo).cmp(&(hi - m)) {
            std::cmp::Ordering::Less => lo,
            std::cmp::Ordering::Greater => hi,
            std::cmp::Ordering::Equal => {
                if (lo >> s) & 1 == 0 {
                    lo
                } else {
                    hi
                }
            }
        },
    };
    let f = rounded as f32; // at most 24 significant bits: exact
    if neg {
        -f
    } else {
        f
    }
}

// ----- arithmetic -----

#[test]
fn f32_binary_ops_on_edge_pairs() {
    let (a, b) = pairs(&f_edges());
    for op in [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Min,
        BinaryOp::Max,
    ] {
        let k = elementwise(
            &format!("f32_{}", op.name()),
            &[DType::F32, DType::F32],
            DType::F32,
            |b, v| b.binary(op, v[0], v[1]),
        );
        let got = f32s(&run_elementwise(&k, &[le_f32(&a), le_f32(&b)], DType::F32));
        for i in 0..a.len() {
            let want = ref_f32_binary(op, a[i], b[i]);
            // min/max are selects: even a NaN operand comes back with its exact bits.
            let exact = matches!(op, BinaryOp::Min | BinaryOp::Max);
            let ok = if exact {
                got[i].to_bits() == want.to_bits()
            } else {
                same(got[i], want)
            };
            assert!(
                ok,
                "{}({:?}, {:?}) = {:?}, want {want:?}",
                op.name(),
                a[i],
                b[i],
                got[i]
            );
        }
    }
}

#[test]
fn f32_unary_ops_are_exact_sign_operations_and_ieee_sqrt() {
    let x = f_edges();
    for op in [UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Sqrt] {
        let k = elementwise(
            &format!("f32_{}", op.name()),
            &[DType::F32],
            DType::F32,
            |b, v| b.unary(op, v[0]),
        );
        let got = f32s(&run_elementwise(&k, &[le_f32(&x)], DType::F32));
        for (g, x) in got.iter().zip(&x) {
            match op {
                UnaryOp::Neg => assert_eq!(g.to_bits(), x.to_bits() ^ 0x8000_0000, "neg {x:?}"),
                UnaryOp::Abs => assert_eq!(g.to_bits(), x.to_bits() & 0x7fff_ffff, "abs {x:?}"),
                _ => assert!(same(*g, x.sqrt()), "sqrt {x:?} = {g:?}"),
            }
        }
    }
}

#[test]
fn mul_then_add_rounds_twice_and_fma_once() {
    let e = f32::EPSILON;
    let mut a = vec![1.0 + e, 1.0 + 2.0 * e, 3.0, 0.1, f32::MAX, 1e-30, -1.0 - e];
    let mut b = vec![1.0 + e, 1.0 - e, 1.0 / 3.0, 10.0, 2.0, 1e-20, 1.0 - e];
    let mut c = vec![-(1.0 + 2.0 * e), -1.0, -1.0, -1.0, -f32::MAX, 0.0, 1.0];
    for (i, x) in f_edges().into_iter().enumerate() {
        a.push(x);
        b.push(F_EDGES[(i * 7) % F_EDGES.len()]);
        c.push(F_EDGES[(i * 11 + 3) % F_EDGES.len()]);
    }
    let inputs = [le_f32(&a), le_f32(&b), le_f32(&c)];
    let three = [DType::F32, DType::F32, DType::F32];
    let separate = elementwise("mul_add_separate", &three, DType::F32, |k, v| {
        let p = k.mul(v[0], v[1]);
        k.add(p, v[2])
    });
    let fused = elementwise("mul_add_fused", &three, DType::F32, |k, v| {
        k.fma(v[0], v[1], v[2])
    });
    let got_sep = f32s(&run_elementwise(&separate, &inputs, DType::F32));
    let got_fma = f32s(&run_elementwise(&fused, &inputs, DType::F32));
    assert_f32(
        &got_sep,
        &(0..a.len()).map(|i| a[i] * b[i] + c[i]).collect::<Vec<_>>(),
        |i| format!("mul+add #{i}"),
    );
    assert_f32(
        &got_fma,
        &(0..a.len())
            .map(|i| a[i].mul_add(b[i], c[i]))
            .collect::<Vec<_>>(),
        |i| format!("fma #{i}"),
    );
    assert_ne!(
        got_sep[0].to_bits(),
        got_fma[0].to_bits(),
        "the first case tells fused from separate"
    );
}

#[test]
fn integer_ops_on_edge_pairs() {
    let (a, b) = pairs(&U_EDGES);
    for op in BinaryOp::ALL {
        for ty in [ScalarType::U32, ScalarType::I32] {
            if !op.accepts(ty) {
                continue;
            }
            let dt = if ty == ScalarType::U32 {
                DType::U32
            } else {
                DType::I32
            };
            let k = elementwise(
                &format!("{}_{}", ty.name(), op.name()),
                &[dt, dt],
                dt,
                |b, v| b.binary(op, v[0], v[1]),
            );
            let got = u32s(&run_elementwise(&k, &[le_u32(&a), le_u32(&b)], dt));
            for i in 0..a.len() {
                let want = if ty == ScalarType::U32 {
                    ref_u32_binary(op, a[i], b[i])
                } else {
                    ref_i32_binary(op, a[i] as i32, b[i] as i32) as u32
                };
                assert_eq!(got[i], want, "{ty} {}({:#x}, {:#x})", op.name(), a[i], b[i]);
            }
        }
    }
}

#[test]
fn integer_unary_ops() {
    let x = U_EDGES.to_vec();
    for (op, dt) in [
        (UnaryOp::Neg, DType::U32),
        (UnaryOp::Not, DType::U32),
        (UnaryOp::Neg, DType::I32),
        (UnaryOp::Abs, DType::I32),
        (UnaryOp::Not, DType::I32),
    ] {
        let k = elementwise(
            &format!("{}_{}", dt.name(), op.name()),
            &[dt],
            dt,
            |b, v| b.unary(op, v[0]),
        );
        let got = u32s(&run_elementwise(&k, &[le_u32(&x)], dt));
        for (g, x) in got.iter().zip(&x) {
            let want = match op {
                UnaryOp::Neg => x.wrapping_neg(),
                UnaryOp::Not => !x,
                _ => (*x as i32).wrapping_abs() as u32,
            };
            assert_eq!(*g, want, "{} {}({x:#x})", dt.name(), op.name());
        }
    }
}

#[test]
fn comparisons_and_bool_logic() {
    let (fa, fb) = pairs(&f_edges());
    let (ua, ub) = pairs(&U_EDGES);
    for op in CmpOp::ALL {
        for dt in [DType::F32, DType::U32, DType::I32] {
            let k = elementwise(
                &format!("cmp_{}_{}", op.name(), dt.name()),
                &[dt, dt],
                DType::U32,
                |b, v| {
                    let c = b.cmp(op, v[0], v[1]);
                    let (one, zero) = (b.const_u32(1), b.const_u32(0));
                    b.select(c, one, zero)
                },
            );
            let (a, bb) = if dt == DType::F32 {
                (
                    fa.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    fb.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                )
            } else {
                (ua.clone(), ub.clone())
            };
            let got = u32s(&run_elementwise(&k, &[le_u32(&a), le_u32(&bb)], DType::U32));
            for i in 0..a.len() {
                let ord = match dt {
                    DType::F32 => f32::from_bits(a[i]).partial_cmp(&f32::from_bits(bb[i])),
                    DType::U32 => Some(a[i].cmp(&bb[i])),
                    _ => Some((a[i] as i32).cmp(&(bb[i] as i32))),
                };
                use std::cmp::Ordering::*;
                let want = match op {
                    CmpOp::Eq => ord == Some(Equal),
                    CmpOp::Ne => ord != Some(Equal),
                    CmpOp::Lt => ord == Some(Less),
                    CmpOp::Le => matches!(ord, Some(Less | Equal)),
                    CmpOp::Gt => ord == Some(Greater),
                    CmpOp::Ge => matches!(ord, Some(Greater | Equal)),
                };
                assert_eq!(
                    got[i],
                    want as u32,
                    "{} {}({:#x}, {:#x})",
                    dt.name(),
                    op.name(),
                    a[i],
                    bb[i]
                );
            }
        }
    }
    // Bool and/or/xor/not/eq/ne, packed into bits of a u32.
    let k = elementwise(
        "bool_logic",
        &[DType::U32, DType::U32],
        DType::U32,
        |b, v| {
            let three = b.const_u32(3);
            let p = b.cmp(CmpOp::Lt, v[0], v[1]);
            let q = b.cmp(CmpOp::Eq, v[0], three);
            let np = b.not(p);
            let results = [
                b.and(p, q),
                b.or(p, q),
                b.binary(BinaryOp::Xor, p, q),
                np,
                b.cmp(CmpOp::Eq, p, q),
                b.cmp(CmpOp::Ne, p, q),
            ];
            let mut acc = b.const_u32(0);
            for (bit, r) in results.into_iter().enumerate() {
                let (one, zero) = (b.const_u32(1 << bit), b.const_u32(0));
                let s = b.select(r, one, zero);
                acc = b.or(acc, s);
            }
            acc
        },
    );
    let got = u32s(&run_elementwise(
        &k,
        &[le_u32(&ua), le_u32(&ub)],
        DType::U32,
    ));
    for i in 0..ua.len() {
        let (p, q) = (ua[i] < ub[i], ua[i] == 3);
        let want = [p && q, p || q, p ^ q, !p, p == q, p != q]
            .iter()
            .enumerate()
            .map(|(bit, r)| (*r as u32) << bit)
            .sum::<u32>();
        assert_eq!(got[i], want, "bool logic on ({}, {})", ua[i], ub[i]);
    }
}

// ----- conversions -----

#[test]
fn float_to_int_rounds_then_saturates() {
    let mut x = f_edges();
    x.extend([
        -0.5,
        0.49999997,
        2147483520.0,
        -2147483520.0,
        4294967040.0,
        -1.5,
        3.5,
        -3.5,
        1e30,
        -1e30,
    ]);
    for to in [ScalarType::U32, ScalarType::I32] {
        for r in Rounding::ALL {
            let dt = if to == ScalarType::U32 {
                DType::U32
            } else {
                DType::I32
            };
            let k = elementwise(
                &format!("f2i_{}_{}", to.name(), r.name()),
                &[DType::F32],
                dt,
                |b, v| b.float_to_int(v[0], to, r),
            );
            let got = u32s(&run_elementwise(&k, &[le_f32(&x)], dt));
            for (g, x) in got.iter().zip(&x) {
                assert_eq!(
                    *g,
                    ref_float_to_int(*x, to, r),
                    "{x:?} to {to} {}",
                    r.name()
                );
            }
        }
    }
}

#[test]
fn int_to_float_in_every_rounding() {
    let mut x = U_EDGES.to_vec();
    x.extend([
        16777217,
        16777219,
        33554431,
        33554434,
        0xfe00_0000,
        0xffff_ff80,
        0xffff_ff7f,
        0x8000_0080,
        0x8000_0081,
    ]);
    x.extend(x.clone().iter().map(|v| v.wrapping_neg()));
    for (signed, dt) in [(false, DType::U32), (true, DType::I32)] {
        for r in Rounding::ALL {
            let k = elementwise(
                &format!("i2f_{}_{}", dt.name(), r.name()),
                &[dt],
                DType::F32,
                |b, v| {
                    b.op(qforge_ir::Op::IntToFloat {
                        value: v[0],
                        rounding: r,
                    })
                },
            );
            let got = f32s(&run_elementwise(&k, &[le_u32(&x)], DType::F32));
            for (g, x) in got.iter().zip(&x) {
                let want = ref_int_to_float(*x, signed, r);
                assert_eq!(
                    g.to_bits(),
                    want.to_bits(),
                    "{x:#x} ({}) {}: {g} vs {want}",
                    dt.name(),
                    r.name()
                );
            }
        }
    }
}

#[test]
fn bitcasts_move_bits_unchanged() {
    let x: Vec<u32> = f_edges()
        .iter()
        .map(|f| f.to_bits())
        .chain(U_EDGES)
        .collect();
    let k = elementwise("bitcasts", &[DType::U32], DType::U32, |b, v| {
        let f = b.bitcast(v[0], ScalarType::F32);
        let i = b.bitcast(f, ScalarType::I32);
        let f2 = b.bitcast(i, ScalarType::F32);
        b.bitcast(f2, ScalarType::U32)
    });
    assert_eq!(u32s(&run_elementwise(&k, &[le_u32(&x)], DType::U32)), x);
}
