//! The StableHLO backend: the module text of representative kernels is snapshotted in
//! `snapshots/<kernel>.stablehlo.snap` (create new ones locally with
//! `INSTA_UPDATE=always cargo test --test stablehlo`; CI never writes snapshots), every library
//! kernel lowers deterministically, and with the `stablehlo` feature the modules run on the
//! StableHLO reference interpreter bit for bit like qforge's interpreter: every op and rounding
//! on edge values and random bits, and `fma` on the cases where rounding twice goes wrong.
//! The library kernels themselves run in the shared conformance suite (`tests/conformance.rs`).

use qforge::codegen::stablehlo::{lower, Shapes, StableHloBackend, TEXT_DIM};
use qforge::codegen::{Backend, Error};
use qforge::ir::{library, Access, DType, Dim, Kernel, KernelBuilder, ScalarType};

fn settings() -> insta::Settings {
    let mut s = insta::Settings::clone_current();
    s.set_snapshot_path(concat!(env!("CARGO_MANIFEST_DIR"), "/snapshots"));
    s.set_prepend_module_to_snapshot(false);
    s.set_omit_expression(true);
    s
}

/// A 4-bit dequantize (gather, lookup, scatter), an 8-bit quantize (`search_sorted`, a `for` loop
/// with an `absmax` reduction), the NF4 GEMV tile (strided `accumulate`, exact `fma`) and the
/// 8-bit AdamW step (two loops, variables, `f64` emulation of nothing but `fma`).
#[test]
fn representative_kernels_match_their_snapshots() {
    let names = [
        "dequantize_4bit_nf4_bs64_f32",
        "quantize_blockwise_dynamic_bs256_f32",
        "matmul_4bit_nf4_bs64_f32_t1x4",
        "adamw8bit_f32",
    ];
    settings().bind(|| {
        for name in names {
            let entry = library::catalog()
                .into_iter()
                .find(|e| e.name() == name)
                .unwrap_or_else(|| panic!("{name} is in the catalog"));
            let kernel = entry.build().expect("library kernels build");
            let text = StableHloBackend.emit_text(&kernel).expect("lowers");
            insta::assert_snapshot!(format!("{name}.stablehlo"), text);
        }
    });
}

#[test]
fn every_library_kernel_lowers_deterministically() {
    let mut count = 0;
    for entry in library::catalog() {
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
    let kernel = library::catalog()[0].build().expect("builds");
    let mut shapes = Shapes::with_dims(&kernel, TEXT_DIM);
    shapes.elements.pop();
    match lower(&kernel, &shapes) {
        Err(Error::Unsupported { backend, op }) => {
            assert_eq!(backend, "stablehlo");
            assert!(op.contains(&kernel.name), "{op}");
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

#[cfg(feature = "stablehlo")]
mod device {
    use super::*;
    use qforge::ir::{Arg, OwnedArg, Scalar};
    use qforge::runtime::{Device, InterpreterDevice, StableHloDevice};

    /// The device, or `None` with the reason printed (a failure under `CI=true`, where
    /// `.ci/run` installs it).
    fn device() -> Option<StableHloDevice> {
        match StableHloDevice::new() {
            Ok(d) => Some(d),
            Err(e) if std::env::var_os("CI").is_some() => panic!("CI=true: {e}"),
            Err(e) => {
                println!("skipped: {e}");
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
