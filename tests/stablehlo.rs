//! The StableHLO backend: every library kernel lowers deterministically (the module text is
//! reviewed through `tests/snapshots.rs`: representative kernels in full, a hash per kernel), and with the `stablehlo` feature the modules run on the
//! StableHLO reference interpreter bit for bit like qforge's interpreter: every arithmetic,
//! compare and conversion op with every rounding on edge values and random bits, `fma` on the
//! cases where rounding twice goes wrong, and the control-flow, reduction and memory corners
//! (see `control_kernel`). The library kernels themselves run in the shared conformance suite
//! (`tests/conformance.rs`).

use qforge::codegen::stablehlo::{lower, Shapes, StableHloBackend, MAX_ELEMENTS, TEXT_DIM};
use qforge::codegen::{Backend, Error};
use qforge::ir::{Access, DType, Dim, Kernel, KernelBuilder, ScalarType};
use qforge::kernels;

#[test]
fn every_library_kernel_lowers_deterministically() {
    let mut count = 0;
    for entry in kernels::catalog() {
        let kernel = entry.build().expect("library kernels build");
        let a = StableHloBackend
            .emit_text(&kernel)
            .unwrap_or_else(|e| panic!("{}: {e}", kernel.name));
        let b = StableHloBackend.emit_text(&kernel).expect("lowers again");
        assert_eq!(a, b, "{}", kernel.name);
        assert!(a.contains("func.func public @main("), "{}", kernel.name);
        count += 1;
    }
    assert!(count > 100, "catalog unexpectedly small: {count}");
}

#[test]
fn shapes_that_do_not_fit_the_kernel_are_an_error() {
    let kernel = kernels::catalog()[0].build().expect("builds");
    let mut shapes = Shapes::with_dims(&kernel, TEXT_DIM);
    shapes.elements.pop();
    match lower(&kernel, &shapes) {
        Err(Error::Unsupported { backend, op }) => {
            assert_eq!(backend, "stablehlo");
            assert!(op.contains(&kernel.name), "{op}");
        }
        other => panic!("expected an error, got {other:?}"),
    }
    // A buffer too large for u32 indices and the spare element.
    let mut shapes = Shapes::with_dims(&kernel, TEXT_DIM);
    let k = shapes
        .elements
        .iter()
        .position(|n| *n > 0)
        .expect("a buffer");
    shapes.elements[k] = MAX_ELEMENTS;
    match lower(&kernel, &shapes) {
        Err(Error::Unsupported { op, .. }) => {
            assert!(
                op.contains(&format!("parameter {k} has {MAX_ELEMENTS} elements")),
                "{op}"
            );
        }
        other => panic!("expected an error, got {other:?}"),
    }
}

/// Per work item `i`: loads `f[3i..3i+3]` (`f32`), `u[2i..2i+2]` (`u32`) and `s[2i..2i+2]`
/// (`i32`) and stores every op of the IR on them (every rounding, both integer types, every
/// compare): `f32` results into `outf[WF*i..]`, the others as `u32` (`i32` bits, `bool` as 0 or
/// 1) into `outu[WU*i..]`. Returns the kernel, `WF` and `WU`.
fn ops_kernel() -> (Kernel, usize, usize) {
    use qforge::ir::{BinaryOp, CmpOp, Op, Rounding, UnaryOp};
    let mut b = KernelBuilder::new("stablehlo_ops");
    let n = b.scalar_param("n", ScalarType::U32);
    let (wf, wu) = (40u32, 80u32);
    let fb = b.buffer_param(
        "f",
        DType::F32,
        &[Dim::Param(n), Dim::Const(3)],
        Access::Read,
    );
    let ub = b.buffer_param(
        "u",
        DType::U32,
        &[Dim::Param(n), Dim::Const(2)],
        Access::Read,
    );
    let sb = b.buffer_param(
        "s",
        DType::I32,
        &[Dim::Param(n), Dim::Const(2)],
        Access::Read,
    );
    let outf = b.buffer_param(
        "outf",
        DType::F32,
        &[Dim::Param(n), Dim::Const(wf)],
        Access::Write,
    );
    let outu = b.buffer_param(
        "outu",
        DType::U32,
        &[Dim::Param(n), Dim::Const(wu)],
        Access::Write,
    );
    b.set_grid(Dim::Param(n));
    let i = b.work_item();
    let at = |b: &mut KernelBuilder, k: u32, j: u32| {
        let kk = b.const_u32(k);
        let base = b.mul(i, kk);
        let jj = b.const_u32(j);
        b.add(base, jj)
    };
    let mut f = Vec::new();
    for j in 0..3 {
        let ix = at(&mut b, 3, j);
        f.push(b.load(fb, ix));
    }
    let mut u = Vec::new();
    let mut s = Vec::new();
    for j in 0..2 {
        let ix = at(&mut b, 2, j);
        u.push(b.load(ub, ix));
        let ix = at(&mut b, 2, j);
        s.push(b.load(sb, ix));
    }
    let (mut floats, mut ints) = (Vec::new(), Vec::new());
    let (one, zero) = (b.const_u32(1), b.const_u32(0));
    let mut bits = |b: &mut KernelBuilder, v, ty: ScalarType| match ty {
        ScalarType::F32 => floats.push(v),
        ScalarType::U32 => ints.push(v),
        ScalarType::Bool => ints.push(b.select(v, one, zero)),
        ScalarType::I32 => ints.push(b.bitcast(v, ScalarType::U32)),
    };
    for op in BinaryOp::ALL {
        if op.accepts(ScalarType::F32) {
            let r = b.binary(op, f[0], f[1]);
            bits(&mut b, r, ScalarType::F32);
        }
        if op.accepts(ScalarType::U32) {
            let r = b.binary(op, u[0], u[1]);
            bits(&mut b, r, ScalarType::U32);
        }
        if op.accepts(ScalarType::I32) {
            let r = b.binary(op, s[0], s[1]);
            bits(&mut b, r, ScalarType::I32);
        }
    }
    let r = b.fma(f[0], f[1], f[2]);
    bits(&mut b, r, ScalarType::F32);
    for op in [UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Sqrt] {
        let r = b.unary(op, f[0]);
        bits(&mut b, r, ScalarType::F32);
    }
    for op in [UnaryOp::Neg, UnaryOp::Not] {
        let r = b.unary(op, u[0]);
        bits(&mut b, r, ScalarType::U32);
    }
    for op in [UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Not] {
        let r = b.unary(op, s[0]);
        bits(&mut b, r, ScalarType::I32);
    }
    for op in CmpOp::ALL {
        let r = b.cmp(op, f[0], f[1]);
        bits(&mut b, r, ScalarType::Bool);
        let r = b.cmp(op, u[0], u[1]);
        bits(&mut b, r, ScalarType::Bool);
        let r = b.cmp(op, s[0], s[1]);
        bits(&mut b, r, ScalarType::Bool);
        // `bool` compares only for equality.
        if matches!(op, CmpOp::Eq | CmpOp::Ne) {
            let (c0, c1) = (b.cmp(CmpOp::Lt, f[0], f[2]), b.cmp(CmpOp::Lt, f[1], f[2]));
            let r = b.cmp(op, c0, c1);
            bits(&mut b, r, ScalarType::Bool);
        }
    }
    for rounding in Rounding::ALL {
        for to in [ScalarType::U32, ScalarType::I32] {
            let r = b.float_to_int(f[0], to, rounding);
            bits(&mut b, r, to);
        }
        for v in [u[0], s[0]] {
            let r = b.op(Op::IntToFloat { value: v, rounding });
            bits(&mut b, r, ScalarType::F32);
        }
    }
    let c = b.cmp(CmpOp::Lt, u[0], u[1]);
    let r = b.select(c, f[0], f[1]);
    bits(&mut b, r, ScalarType::F32);
    let r = b.bitcast(u[0], ScalarType::F32);
    bits(&mut b, r, ScalarType::F32);
    let r = b.bitcast(f[0], ScalarType::I32);
    bits(&mut b, r, ScalarType::I32);
    for (buf, width, values) in [(outf, wf, floats), (outu, wu, ints)] {
        assert!(values.len() <= width as usize, "{} results", values.len());
        for (j, r) in values.iter().enumerate() {
            let ix = at(&mut b, width, j as u32);
            b.store(buf, ix, *r);
        }
    }
    (b.finish(), wf as usize, wu as usize)
}

/// Width of a work item's row of `x` in [`control_kernel`].
const ROW: u32 = 16;

/// Per work item `i`, with `lo = lo[i]`, `hi = hi[i]`, `len = len[i]` (at most [`ROW`]) and the
/// row `x[16i .. 16i + 16]`:
/// * a `for j in (lo..hi).step_by(3)` loop (empty when `lo >= hi`; stopping before `j + 3`
///   passes `u32::MAX`) whose body branches on `j`: `if j % 2 == 0` counts into `c`, else `if`
///   `j % 4 == 1` adds `j` as f32 into `a`, else stores `j` into `seen[i]`; nested assignments
///   under masks;
/// * `accumulate` over `len` (`Strided(4)`) of `x * x`, and over `len` (`Sequential`) of `x * c`;
/// * every `reduce`: sums in `Sequential` and `Strided(8)` order, `max |x|` with NaN kept and
///   skipped, all over the first `len` elements of the row;
/// * loads of every dtype at `i`, narrowed back with an op, stored to the outputs; a lookup
///   clamped past its table.
///
/// Writes `f32` results to `outf[8i..]`, `u32` results to `outu[4i..]`, and the narrow ones to
/// their own buffers.
fn control_kernel() -> Kernel {
    use qforge::ir::{BinaryOp, CmpOp, NanMode, ReduceOrder, Rounding};
    let mut b = KernelBuilder::new("stablehlo_control");
    let n = b.scalar_param("n", ScalarType::U32);
    let d = Dim::Param(n);
    let lo = b.buffer_param("lo", DType::U32, &[d], Access::Read);
    let hi = b.buffer_param("hi", DType::U32, &[d], Access::Read);
    let lens = b.buffer_param("len", DType::U32, &[d], Access::Read);
    let x = b.buffer_param("x", DType::F32, &[d, Dim::Const(ROW)], Access::Read);
    let narrow: Vec<_> = [DType::F16, DType::BF16, DType::U8, DType::I8, DType::I32]
        .iter()
        .map(|dt| {
            let r = b.buffer_param(&format!("in_{}", dt.name()), *dt, &[d], Access::Read);
            let w = b.buffer_param(&format!("out_{}", dt.name()), *dt, &[d], Access::ReadWrite);
            (*dt, r, w)
        })
        .collect();
    let seen = b.buffer_param("seen", DType::U32, &[d], Access::ReadWrite);
    let outf = b.buffer_param("outf", DType::F32, &[d, Dim::Const(8)], Access::Write);
    let outu = b.buffer_param("outu", DType::U32, &[d, Dim::Const(4)], Access::Write);
    b.set_grid(d);
    let table = b.table_u32("small", &[7, 11, 13]);
    let (cv, av, s1, s2) = (
        b.var("c", ScalarType::U32),
        b.var("a", ScalarType::F32),
        b.var("s1", ScalarType::F32),
        b.var("s2", ScalarType::F32),
    );
    let i = b.work_item();
    let (lo_v, hi_v, len_v) = (b.load(lo, i), b.load(hi, i), b.load(lens, i));
    let row = b.const_u32(ROW);
    let base = b.mul(i, row);
    b.for_range(lo_v, hi_v, 3, |b, j| {
        let one = b.const_u32(1);
        let parity = b.and(j, one);
        let zero = b.const_u32(0);
        let even = b.cmp(CmpOp::Eq, parity, zero);
        b.if_else(
            even,
            |b| {
                let c = b.read_var(cv);
                let c1 = b.add(c, one);
                b.assign(cv, c1);
            },
            |b| {
                let three = b.const_u32(3);
                let q = b.and(j, three);
                let is1 = b.cmp(CmpOp::Eq, q, one);
                b.if_else(
                    is1,
                    |b| {
                        let a = b.read_var(av);
                        let jf = b.int_to_float(j);
                        let a1 = b.add(a, jf);
                        b.assign(av, a1);
                    },
                    |b| b.store(seen, i, j),
                );
            },
        );
    });
    let c_final = b.read_var(cv);
    let cf = b.int_to_float(c_final);
    b.accumulate(len_v, ReduceOrder::Strided(4), &[s1], |b, k| {
        let at = b.add(base, k);
        let xv = b.load(x, at);
        vec![(xv, xv)]
    });
    b.accumulate(len_v, ReduceOrder::Sequential, &[s2], |b, k| {
        let at = b.add(base, k);
        let xv = b.load(x, at);
        vec![(xv, cf)]
    });
    let mut floats = vec![b.read_var(av), b.read_var(s1), b.read_var(s2)];
    floats.push(b.reduce_sum(x, base, len_v, ReduceOrder::Sequential));
    floats.push(b.reduce_sum(x, base, len_v, ReduceOrder::Strided(8)));
    floats.push(b.reduce_absmax(x, base, len_v, NanMode::Propagate));
    floats.push(b.reduce_absmax(x, base, len_v, NanMode::Ignore));
    let mut ints = vec![c_final];
    let five = b.const_u32(5);
    let far = b.mul(c_final, five);
    ints.push(b.lookup(table, far));
    for (dt, r, w) in narrow {
        let v = b.load(r, i);
        let out = match dt {
            DType::F16 | DType::BF16 => {
                let k = b.const_f32(1.5);
                b.mul(v, k)
            }
            DType::U8 => {
                let k = b.const_u32(200);
                b.add(v, k)
            }
            DType::I8 | DType::I32 => {
                let k = b.const_i32(-3);
                b.binary(BinaryOp::Mul, v, k)
            }
            _ => v,
        };
        if dt.is_float() {
            b.store_rounded(w, i, out, Rounding::NearestEven);
        } else {
            b.store(w, i, out);
        }
    }
    let f_at = |b: &mut KernelBuilder, k: u32| {
        let eight = b.const_u32(8);
        let r = b.mul(i, eight);
        let kk = b.const_u32(k);
        b.add(r, kk)
    };
    for (k, v) in floats.iter().enumerate() {
        let at = f_at(&mut b, k as u32);
        b.store(outf, at, *v);
    }
    for (k, v) in ints.iter().enumerate() {
        let four = b.const_u32(4);
        let r = b.mul(i, four);
        let kk = b.const_u32(k as u32);
        let at = b.add(r, kk);
        b.store(outu, at, *v);
    }
    b.finish()
}

#[cfg(feature = "stablehlo")]
mod device {
    use super::*;
    use qforge::ir::{Arg, OwnedArg, Scalar};
    use qforge::runtime::{Device, InterpreterDevice, StableHloDevice};

    /// The device, or `None` with the reason printed (a failure where it is required, see
    /// `qforge_testkit`).
    fn device() -> Option<StableHloDevice> {
        match StableHloDevice::new() {
            Ok(d) => Some(d),
            Err(e) => {
                qforge_testkit::unavailable("stablehlo", e);
                None
            }
        }
    }

    fn bytes(v: &[u32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    /// Runs `kernel` (params `n`, then buffers) on the interpreter and the device; both outputs.
    fn both(dev: &StableHloDevice, kernel: &Kernel, n: u32, inputs: &[Vec<u32>], outs: &[usize]) {
        let mut args = vec![OwnedArg::Scalar(Scalar::U32(n))];
        args.extend(inputs.iter().map(|v| OwnedArg::Read(bytes(v))));
        args.extend(outs.iter().map(|len| OwnedArg::Write(vec![0; len * 4])));
        let mut reference = args.clone();
        InterpreterDevice
            .launch(kernel, &mut OwnedArg::borrow_all(&mut reference))
            .expect("interpreter runs");
        dev.launch(kernel, &mut OwnedArg::borrow_all(&mut args))
            .expect("device runs");
        let (bad, total) = qforge::ir::count_mismatches(kernel, &reference, &args);
        assert_eq!(bad, 0, "{}: {bad} of {total} elements differ", kernel.name);
    }

    /// A small deterministic generator (xorshift64*).
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u32 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) as u32
        }
    }

    #[test]
    fn every_op_matches_the_interpreter_on_edge_values_and_random_bits() {
        let Some(dev) = device() else { return };
        let (kernel, wf, wu) = ops_kernel();
        let floats: Vec<u32> = [
            0.0f32,
            -0.0,
            1.0,
            -1.0,
            0.5,
            -0.5,
            1.5,
            2.5,
            -2.5,
            3.0,
            1e-30,
            3.0e38,
            -3.0e38,
            f32::MIN_POSITIVE,
            f32::MIN_POSITIVE / 3.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            2147483648.0,
            -2147483648.0,
            2147483520.0,
            4294967296.0,
            4294967040.0,
            -2147483904.0,
            16777217.0,
        ]
        .iter()
        .map(|x| x.to_bits())
        .chain([1, 0x8000_0001, 0x007f_ffff, 0x7fc0_0001, 0xff80_0001])
        .collect();
        let ints: Vec<u32> = vec![
            0,
            1,
            2,
            3,
            31,
            32,
            33,
            255,
            256,
            0x7fff_ffff,
            0x8000_0000,
            0xffff_ffff,
            0xffff_fffe,
            0x0100_0001,
            0xfeff_ffff,
            16_777_217,
        ];
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let n = 3000usize;
        let mut pick = |edge: &[u32]| {
            let r = rng.next();
            if r.is_multiple_of(3) {
                rng.next()
            } else {
                edge[(r as usize / 3) % edge.len()]
            }
        };
        let f: Vec<u32> = (0..3 * n).map(|_| pick(&floats)).collect();
        let u: Vec<u32> = (0..2 * n).map(|_| pick(&ints)).collect();
        let s: Vec<u32> = (0..2 * n).map(|_| pick(&ints)).collect();
        both(&dev, &kernel, n as u32, &[f, u, s], &[wf * n, wu * n]);
    }

    /// `fma(a, b, c)` where `a * b` is exactly halfway between two `f32` and `c` is far below
    /// its last bit: rounding `a * b + c` to `f64` first lands on the halfway point, and rounding
    /// that to `f32` (ties to even) would go the wrong way for one sign of `c`. Also cancellation
    /// to subnormal and zero results.
    #[test]
    fn fma_is_rounded_once() {
        let Some(dev) = device() else { return };
        let mut b = KernelBuilder::new("stablehlo_fma");
        let n = b.scalar_param("n", ScalarType::U32);
        let x = b.buffer_param(
            "x",
            DType::F32,
            &[Dim::Param(n), Dim::Const(3)],
            Access::Read,
        );
        let out = b.buffer_param("out", DType::F32, &[Dim::Param(n)], Access::Write);
        b.set_grid(Dim::Param(n));
        let i = b.work_item();
        let (three, one) = (b.const_u32(3), b.const_u32(1));
        let i0 = b.mul(i, three);
        let i1 = b.add(i0, one);
        let i2 = b.add(i1, one);
        let (av, bv, cv) = (b.load(x, i0), b.load(x, i1), b.load(x, i2));
        let r = b.fma(av, bv, cv);
        b.store(out, i, r);
        let kernel = b.finish();
        let mut rows: Vec<[f32; 3]> = Vec::new();
        for k in 2..=23 {
            for m in [k, k + 1] {
                // (1 + 2^-k)(1 + 2^-m) has its last bit at 2^-(k+m): a tie at f32 precision when
                // k + m = 24, inexact below it otherwise.
                let a = 1.0 + 2f32.powi(-k);
                let bb = 1.0 + 2f32.powi(-m);
                for e in [-60, -70, -100, -149] {
                    for sign in [1.0f32, -1.0] {
                        let c = sign * 2f32.powi(e);
                        rows.push([a, bb, c]);
                        rows.push([-a, bb, c]);
                    }
                }
                rows.push([a, bb, -(a * bb)]);
            }
        }
        let mut rng = Rng(42);
        for _ in 0..20_000 {
            let (a, bb) = (f32::from_bits(rng.next()), f32::from_bits(rng.next()));
            // c near -a*b: cancellation, often into the subnormal range.
            let p = a * bb;
            let c = f32::from_bits((-p).to_bits() ^ (rng.next() & 0xff));
            rows.push([a, bb, c]);
            rows.push([a, bb, f32::from_bits(rng.next())]);
        }
        let flat: Vec<u32> = rows.iter().flatten().map(|v| v.to_bits()).collect();
        both(&dev, &kernel, rows.len() as u32, &[flat], &[rows.len()]);
    }

    /// [`control_kernel`] on edge bounds, lengths and values, and with a grid of 0.
    #[test]
    fn control_flow_reductions_and_memory_match_the_interpreter() {
        let Some(dev) = device() else { return };
        let kernel = control_kernel();
        let mut rng = Rng(7);
        for n in [0usize, 1, 5, 200] {
            let bounds = [
                (0, 0),
                (5, 3),
                (0, 1),
                (2, 40),
                (u32::MAX - 7, u32::MAX),
                (u32::MAX - 1, u32::MAX),
                (100, 161),
            ];
            let (mut lo, mut hi, mut len) = (Vec::new(), Vec::new(), Vec::new());
            for w in 0..n {
                let (l, h) = if w < bounds.len() {
                    bounds[w]
                } else {
                    let l = rng.next() % 50;
                    (l, l + rng.next() % 60)
                };
                lo.push(l);
                hi.push(h);
                len.push(if w == 0 { 0 } else { rng.next() % (ROW + 1) });
            }
            let edge = [
                0.0f32,
                -0.0,
                f32::NAN,
                f32::INFINITY,
                -1.5,
                2.5,
                1e-40,
                -3.0e38,
                65504.0,
                1e-8,
            ];
            let x: Vec<u32> = (0..n * ROW as usize)
                .map(|_| {
                    let r = rng.next();
                    if r.is_multiple_of(4) {
                        edge[(r as usize / 4) % edge.len()].to_bits()
                    } else {
                        ((r % 2000) as f32 / 100.0 - 10.0).to_bits()
                    }
                })
                .collect();
            let words = |rng: &mut Rng| (0..n).map(|_| rng.next()).collect::<Vec<u32>>();
            let halves = |rng: &mut Rng| -> Vec<u8> {
                (0..n)
                    .flat_map(|_| (rng.next() as u16).to_le_bytes())
                    .collect()
            };
            let bytes_of =
                |rng: &mut Rng| -> Vec<u8> { (0..n).map(|_| rng.next() as u8).collect() };
            let mut args = vec![
                OwnedArg::Scalar(Scalar::U32(n as u32)),
                OwnedArg::Read(bytes(&lo)),
                OwnedArg::Read(bytes(&hi)),
                OwnedArg::Read(bytes(&len)),
                OwnedArg::Read(bytes(&x)),
            ];
            for make in [0, 0, 1, 1, 2] {
                let data = match make {
                    0 => halves(&mut rng),
                    1 => bytes_of(&mut rng),
                    _ => bytes(&words(&mut rng)),
                };
                let out = match make {
                    0 => halves(&mut rng),
                    1 => bytes_of(&mut rng),
                    _ => bytes(&words(&mut rng)),
                };
                args.push(OwnedArg::Read(data));
                args.push(OwnedArg::Write(out));
            }
            args.push(OwnedArg::Write(bytes(&words(&mut rng))));
            args.push(OwnedArg::Write(vec![0; n * 8 * 4]));
            args.push(OwnedArg::Write(vec![0; n * 4 * 4]));
            let mut reference = args.clone();
            InterpreterDevice
                .launch(&kernel, &mut OwnedArg::borrow_all(&mut reference))
                .expect("interpreter runs");
            dev.launch(&kernel, &mut OwnedArg::borrow_all(&mut args))
                .expect("device runs");
            let (bad, total) = qforge::ir::count_mismatches(&kernel, &reference, &args);
            assert_eq!(bad, 0, "n = {n}: {bad} of {total} elements differ");
        }
    }

    /// A kernel that writes nothing gives a module with an empty `return`, which runs.
    #[test]
    fn a_kernel_without_outputs_runs() {
        let Some(dev) = device() else { return };
        let mut b = KernelBuilder::new("stablehlo_no_outputs");
        let n = b.scalar_param("n", ScalarType::U32);
        let x = b.buffer_param("x", DType::F32, &[Dim::Param(n)], Access::Read);
        b.set_grid(Dim::Param(n));
        let i = b.work_item();
        let _ = b.load(x, i);
        let kernel = b.finish();
        let data = bytes(&[1.0f32.to_bits(), 2.0f32.to_bits()]);
        dev.launch(
            &kernel,
            &mut [Arg::Scalar(Scalar::U32(2)), Arg::Read(&data)],
        )
        .expect("runs");
    }

    #[test]
    fn launch_errors_name_the_problem() {
        let Some(dev) = device() else { return };
        let (kernel, _, _) = ops_kernel();
        // Too few arguments: the binding error of every device.
        let err = dev
            .launch(&kernel, &mut [Arg::Scalar(Scalar::U32(1))])
            .expect_err("wrong argument count");
        assert!(err.to_string().contains("expected 6 arguments"), "{err}");
    }
}
