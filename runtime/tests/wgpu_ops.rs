//! The wgpu device against the reference interpreter, bit for bit (any two NaNs equal): f32
//! arithmetic on edge values, integer division and conversions, u8/i8/f16/bf16 loads and
//! stores (several work items sharing one packed word), table lookups, strided and sequential
//! sums, and the contents a kernel does not write. Skips with a printed reason when no wgpu
//! adapter is found.
#![cfg(feature = "wgpu")]

use std::sync::OnceLock;

use qforge_ir::{
    count_mismatches, Access, DType, Dim, Kernel, KernelBuilder, OwnedArg, ReduceOrder, Rounding,
    Scalar, ScalarType,
};
use qforge_runtime::{Device, InterpreterDevice, WgpuDevice};

fn device() -> Option<&'static WgpuDevice> {
    static DEVICE: OnceLock<Option<WgpuDevice>> = OnceLock::new();
    let d = DEVICE.get_or_init(|| match WgpuDevice::new() {
        Ok(d) => Some(d),
        Err(e) => {
            qforge_testkit::unavailable("wgpu", e);
            None
        }
    });
    d.as_ref()
}

/// f32 values: edge cases first, then pseudo-random bit patterns and ordinary numbers.
fn values(n: usize, seed: u32) -> Vec<f32> {
    let edges = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        3.0,
        0.1,
        f32::MIN_POSITIVE,
        f32::MIN_POSITIVE / 3.0,
        -f32::from_bits(1),
        f32::from_bits(0x007f_ffff),
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MAX,
        -3.0e38,
        1e-30,
        16_777_217.0,
        2.5,
        -2.5,
        4.0e9,
        -2.2e9,
    ];
    let mut state = seed.wrapping_mul(2_654_435_761).wrapping_add(12345);
    (0..n)
        .map(|i| {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            let r = state;
            if i < edges.len() {
                edges[(i + seed as usize) % edges.len()]
            } else if r.is_multiple_of(3) {
                f32::from_bits(r.rotate_left(7))
            } else {
                ((r >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * 8.0
            }
        })
        .collect()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Runs `kernel` on the interpreter and on the wgpu device; asserts every written element
/// matches. Returns false when skipped.
fn check(kernel: &Kernel, args: Vec<OwnedArg>) -> bool {
    let Some(dev) = device() else { return false };
    let mut reference = args.clone();
    InterpreterDevice
        .launch(kernel, &mut OwnedArg::borrow_all(&mut reference))
        .expect("interpreter runs");
    let mut got = args;
    dev.launch(kernel, &mut OwnedArg::borrow_all(&mut got))
        .unwrap_or_else(|e| panic!("wgpu runs '{}': {e}", kernel.name));
    let (bad, total) = count_mismatches(kernel, &reference, &got);
    if bad > 0 {
        report_words(&reference, &got);
    }
    assert!(total > 0, "'{}' wrote nothing to compare", kernel.name);
    assert_eq!(
        bad, 0,
        "'{}': {bad} of {total} elements differ from the interpreter",
        kernel.name
    );
    true
}

/// Prints the first differing 32-bit words of each written buffer (for diagnosis).
fn report_words(reference: &[OwnedArg], got: &[OwnedArg]) {
    for (p, (r, g)) in reference.iter().zip(got).enumerate() {
        if let (OwnedArg::Write(r), OwnedArg::Write(g)) = (r, g) {
            let diffs = r
                .chunks(4)
                .zip(g.chunks(4))
                .enumerate()
                .filter(|(_, (a, b))| a != b)
                .take(8);
            for (w, (a, b)) in diffs {
                println!("param {p} word {w}: interpreter {a:02x?}, wgpu {b:02x?}");
            }
        }
    }
}

const SIZES: [u32; 4] = [1, 3, 67, 131];

#[test]
fn f32_arithmetic_on_edge_values() {
    const K: u32 = 9;
    let mut b = KernelBuilder::new("arith");
    let n = b.scalar_param("n", ScalarType::U32);
    let x = b.buffer_param("x", DType::F32, &[Dim::Param(n)], Access::Read);
    let y = b.buffer_param("y", DType::F32, &[Dim::Param(n)], Access::Read);
    let out = b.buffer_param(
        "out",
        DType::F32,
        &[Dim::Param(n), Dim::Const(K)],
        Access::Write,
    );
    b.set_grid(Dim::Param(n));
    let i = b.work_item();
    let xv = b.load(x, i);
    let yv = b.load(y, i);
    let results = [
        b.add(xv, yv),
        b.sub(xv, yv),
        b.mul(xv, yv),
        b.div(xv, yv),
        b.sqrt(xv),
        b.min(xv, yv),
        b.max(xv, yv),
        b.neg(xv),
        b.abs(yv),
    ];
    let k = b.const_u32(K);
    let base = b.mul(i, k);
    for (j, r) in results.into_iter().enumerate() {
        let jv = b.const_u32(j as u32);
        let at = b.add(base, jv);
        b.store(out, at, r);
    }
    let kernel = b.finish();
    if let Some(dev) = device() {
        let c = dev.conformance();
        if !(c.div_exact && c.sqrt_exact) {
            println!("division/sqrt refused here: {:?}", c.deviations);
            let mut args = vec![
                OwnedArg::Scalar(Scalar::U32(1)),
                OwnedArg::Read(vec![0; 4]),
                OwnedArg::Read(vec![0; 4]),
                OwnedArg::Write(vec![0; (K * 4) as usize]),
            ];
            assert!(dev
                .launch(&kernel, &mut OwnedArg::borrow_all(&mut args))
                .is_err());
            return;
        }
    }
    for (s, &len) in SIZES.iter().enumerate() {
        let args = vec![
            OwnedArg::Scalar(Scalar::U32(len)),
            OwnedArg::Read(f32_bytes(&values(len as usize, s as u32))),
            OwnedArg::Read(f32_bytes(&values(len as usize, 7 + s as u32))),
            OwnedArg::Write(vec![0xAB; (len * K * 4) as usize]),
        ];
        if !check(&kernel, args) {
            return;
        }
    }
}

/// Rows `(a, b, c)` where fused and unfused multiply-add differ, then ordinary values.
fn muladd_rows() -> Vec<f32> {
    // (1 + 2^-12)^2 - (1 + 2^-11): exactly 2^-24 when fused, 0 when the product is rounded.
    let e = 1.0 + f32::EPSILON * 2048.0;
    let mut data = vec![e, e, -(1.0 + f32::EPSILON * 4096.0)];
    data.extend(values(60, 3));
    data
}

/// `out[i] = a * b + c` (two ops) or `fma(a, b, c)`.
fn muladd_kernel(fused: bool) -> Kernel {
    let mut b = KernelBuilder::new(if fused { "fma" } else { "muladd" });
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
    let three = b.const_u32(3);
    let one = b.const_u32(1);
    let base = b.mul(i, three);
    let i1 = b.add(base, one);
    let i2 = b.add(i1, one);
    let (a, bb, c) = (b.load(x, base), b.load(x, i1), b.load(x, i2));
    let r = if fused {
        b.fma(a, bb, c)
    } else {
        let p = b.mul(a, bb);
        b.add(p, c)
    };
    b.store(out, i, r);
    b.finish()
}

fn muladd_args() -> Vec<OwnedArg> {
    vec![
        OwnedArg::Scalar(Scalar::U32(21)),
        OwnedArg::Read(f32_bytes(&muladd_rows())),
        OwnedArg::Write(vec![0; 21 * 4]),
    ]
}

/// `a * b + c` written as two ops must not be contracted.
#[test]
fn multiply_add_is_not_contracted() {
    check(&muladd_kernel(false), muladd_args());
}

/// `fma` is exact on every driver: the hardware op where the probe finds it fused, the exact
/// software routine elsewhere (lavapipe does not fuse).
#[test]
fn fma_is_exact_fused_or_in_software() {
    let Some(dev) = device() else { return };
    println!(
        "fma fused in hardware: {} (deviations: {:?})",
        dev.conformance().fma_fused,
        dev.conformance().deviations
    );
    check(&muladd_kernel(true), muladd_args());
}

/// Prints the probe's report; `a * b + c` is never contracted (division and sqrt are checked
/// bit-exact in `f32_arithmetic_on_edge_values` when the probe passes them).
#[test]
fn probe_report_is_printed() {
    let Some(dev) = device() else { return };
    let c = dev.conformance();
    println!("{}: {c:?}", dev.name());
    // The emitted code makes contraction impossible, so the probe must never see it.
    assert!(
        !c.deviations.iter().any(|d| d.contains("contracted")),
        "{:?}",
        c.deviations
    );
}

/// The probe's loop verdict is what a loop of 100000 iterations does on the device (Mesa's
/// lavapipe stops loops after 65535 iterations: `loops_exact` is false there, with a deviation).
#[test]
fn the_loop_probe_tells_whether_long_loops_run_in_full() {
    let Some(dev) = device() else { return };
    let mut b = KernelBuilder::new("count_loop");
    let n = b.scalar_param("n", ScalarType::U32);
    let out = b.buffer_param("out", DType::U32, &[Dim::Const(1)], Access::Write);
    let count = b.var("count", ScalarType::U32);
    let (zero, one, end) = (b.const_u32(0), b.const_u32(1), b.param(n));
    b.for_range(zero, end, 1, |b, _| {
        let c = b.read_var(count);
        let c = b.add(c, one);
        b.assign(count, c);
    });
    let c = b.read_var(count);
    b.store(out, zero, c);
    let k = b.finish();
    let mut got = [0u8; 4];
    dev.launch(
        &k,
        &mut [
            qforge_ir::Arg::Scalar(Scalar::U32(100_000)),
            qforge_ir::Arg::Write(&mut got),
        ],
    )
    .unwrap();
    let trips = u32::from_le_bytes(got);
    let c = dev.conformance();
    println!("{}: a loop of 100000 ran {trips}", dev.name());
    assert_eq!(c.loops_exact, trips == 100_000, "{:?}", c.deviations);
    assert_eq!(
        c.loops_exact,
        !c.deviations.iter().any(|d| d.contains("stops loops early")),
        "{:?}",
        c.deviations
    );
}

#[test]
fn integer_division_high_words_and_conversions() {
    const K: u32 = 10;
    let mut b = KernelBuilder::new("ints");
    let n = b.scalar_param("n", ScalarType::U32);
    let x = b.buffer_param("x", DType::I32, &[Dim::Param(n)], Access::Read);
    let y = b.buffer_param("y", DType::I32, &[Dim::Param(n)], Access::Read);
    let f = b.buffer_param("f", DType::F32, &[Dim::Param(n)], Access::Read);
    let out = b.buffer_param(
        "out",
        DType::U32,
        &[Dim::Param(n), Dim::Const(K)],
        Access::Write,
    );
    b.set_grid(Dim::Param(n));
    let i = b.work_item();
    let (xv, yv, fv) = (b.load(x, i), b.load(y, i), b.load(f, i));
    let xu = b.bitcast(xv, ScalarType::U32);
    let yu = b.bitcast(yv, ScalarType::U32);
    let idiv = b.div(xv, yv);
    let irem = b.rem(xv, yv);
    let udiv = b.div(xu, yu);
    let urem = b.rem(xu, yu);
    let to_i = b.float_to_int(fv, ScalarType::I32, Rounding::NearestEven);
    let to_u = b.float_to_int(fv, ScalarType::U32, Rounding::Down);
    let from_i = b.int_to_float(xv);
    let from_u = b.int_to_float(xu);
    // The high word (WGSL's `qf_umulhi`/`qf_imulhi` from 16-bit halves).
    let ihi = b.mul_hi(xv, yv);
    let uhi = b.mul_hi(xu, yu);
    let results = [
        b.bitcast(idiv, ScalarType::U32),
        b.bitcast(irem, ScalarType::U32),
        udiv,
        urem,
        b.bitcast(to_i, ScalarType::U32),
        to_u,
        b.bitcast(from_i, ScalarType::U32),
        b.bitcast(from_u, ScalarType::U32),
        b.bitcast(ihi, ScalarType::U32),
        uhi,
    ];
    let k = b.const_u32(K);
    let base = b.mul(i, k);
    for (j, r) in results.into_iter().enumerate() {
        let jv = b.const_u32(j as u32);
        let at = b.add(base, jv);
        b.store(out, at, r);
    }
    let kernel = b.finish();
    let edges = [
        0,
        1,
        -1,
        7,
        -7,
        i32::MIN,
        i32::MAX,
        16_777_217,
        -16_777_219,
        3,
    ];
    let len = 67usize;
    let xs: Vec<i32> = (0..len)
        .map(|i| edges[i % edges.len()].wrapping_mul(1 + (i / edges.len()) as i32 * 977))
        .collect();
    let ys: Vec<i32> = (0..len).map(|i| edges[(i * 3 + 1) % edges.len()]).collect();
    let bytes = |v: &[i32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let args = vec![
        OwnedArg::Scalar(Scalar::U32(len as u32)),
        OwnedArg::Read(bytes(&xs)),
        OwnedArg::Read(bytes(&ys)),
        OwnedArg::Read(f32_bytes(&values(len, 5))),
        OwnedArg::Write(vec![0; len * K as usize * 4]),
    ];
    check(&kernel, args);
}

#[test]
fn narrow_loads_and_stores() {
    let mut b = KernelBuilder::new("narrow");
    let n = b.scalar_param("n", ScalarType::U32);
    let d = [Dim::Param(n)];
    let x = b.buffer_param("x", DType::F32, &d, Access::Read);
    let bytes_in = b.buffer_param("bytes_in", DType::U8, &d, Access::Read);
    let signed_in = b.buffer_param("signed_in", DType::I8, &d, Access::Read);
    let half_in = b.buffer_param("half_in", DType::F16, &d, Access::Read);
    let bf_in = b.buffer_param("bf_in", DType::BF16, &d, Access::Read);
    let wide = b.buffer_param(
        "wide",
        DType::F32,
        &[Dim::Param(n), Dim::Const(3)],
        Access::Write,
    );
    let codes = b.buffer_param("codes", DType::U8, &d, Access::Write);
    let scodes = b.buffer_param("scodes", DType::I8, &d, Access::ReadWrite);
    let half_out = b.buffer_param("half_out", DType::F16, &d, Access::Write);
    let bf_out = b.buffer_param("bf_out", DType::BF16, &d, Access::Write);
    b.set_grid(Dim::Param(n));
    let i = b.work_item();
    let xv = b.load(x, i);
    let u = b.load(bytes_in, i);
    let s = b.load(signed_in, i);
    let h = b.load(half_in, i);
    let bf = b.load(bf_in, i);
    let three = b.const_u32(3);
    let one = b.const_u32(1);
    let base = b.mul(i, three);
    let i1 = b.add(base, one);
    let i2 = b.add(i1, one);
    b.store(wide, base, h);
    b.store(wide, i1, bf);
    let sf = b.int_to_float(s);
    b.store(wide, i2, sf);
    // u8 store keeps the low 8 bits: (u * 37 + 200).
    let k37 = b.const_u32(37);
    let k200 = b.const_u32(200);
    let m = b.mul(u, k37);
    let code = b.add(m, k200);
    b.store(codes, i, code);
    // i8 read-modify-write of the caller's initial contents.
    let old = b.load(scodes, i);
    let sum = b.add(old, s);
    b.store(scodes, i, sum);
    b.store_rounded(half_out, i, xv, Rounding::NearestEven);
    b.store_rounded(bf_out, i, xv, Rounding::NearestEven);
    let kernel = b.finish();
    for (seed, &len) in SIZES.iter().enumerate() {
        let len = len as usize;
        let xs = values(len, seed as u32);
        // f16 / bf16 inputs: every pattern class (subnormal, inf, NaN payloads, zeros).
        let h: Vec<u16> = (0..len)
            .map(|i| {
                [
                    0x0001, 0x8000, 0x7c00, 0xfc00, 0x7e01, 0x03ff, 0x3c00, 0xc555,
                ][i % 8]
                    ^ ((i as u16 * 0x0101) & 0x03ff)
            })
            .collect();
        let bf: Vec<u16> = (0..len).map(|i| (i as u16).wrapping_mul(40503)).collect();
        let b16 = |v: &[u16]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let args = vec![
            OwnedArg::Scalar(Scalar::U32(len as u32)),
            OwnedArg::Read(f32_bytes(&xs)),
            OwnedArg::Read((0..len).map(|i| (i * 53 + 7) as u8).collect()),
            OwnedArg::Read((0..len).map(|i| (i * 91 + 128) as u8).collect()),
            OwnedArg::Read(b16(&h)),
            OwnedArg::Read(b16(&bf)),
            OwnedArg::Write(vec![0x5A; len * 12]),
            OwnedArg::Write(vec![0xEE; len]),
            OwnedArg::Write((0..len).map(|i| (i * 13) as u8).collect()),
            OwnedArg::Write(vec![0x11; len * 2]),
            OwnedArg::Write(vec![0x22; len * 2]),
        ];
        if !check(&kernel, args) {
            return;
        }
    }
}

/// Only even elements are written: the odd ones (sharing words with written ones in the
/// packed u8 buffer) must keep the caller's initial contents.
#[test]
fn unwritten_elements_keep_their_contents() {
    let mut b = KernelBuilder::new("sparse");
    let n = b.scalar_param("n", ScalarType::U32);
    let codes = b.buffer_param(
        "codes",
        DType::U8,
        &[Dim::Param(n), Dim::Const(2)],
        Access::Write,
    );
    let vals = b.buffer_param(
        "vals",
        DType::F32,
        &[Dim::Param(n), Dim::Const(2)],
        Access::Write,
    );
    b.set_grid(Dim::Param(n));
    let i = b.work_item();
    let two = b.const_u32(2);
    let at = b.mul(i, two);
    b.store(codes, at, i);
    let f = b.int_to_float(i);
    b.store(vals, at, f);
    let kernel = b.finish();
    let len = 131usize;
    let args = vec![
        OwnedArg::Scalar(Scalar::U32(len as u32)),
        OwnedArg::Write((0..2 * len).map(|i| (i * 7) as u8).collect()),
        OwnedArg::Write((0..8 * len).map(|i| (i * 3) as u8).collect()),
    ];
    check(&kernel, args);
}

#[test]
fn lookups_clamp_and_keep_special_values() {
    let mut b = KernelBuilder::new("lookup");
    let n = b.scalar_param("n", ScalarType::U32);
    let idx = b.buffer_param("idx", DType::U8, &[Dim::Param(n)], Access::Read);
    let out = b.buffer_param("out", DType::F32, &[Dim::Param(n)], Access::Write);
    let table = b.table_f32(
        "t",
        &[
            -1.0,
            -0.0,
            0.5,
            f32::NAN,
            f32::INFINITY,
            f32::from_bits(1),
            0.1,
            f32::NEG_INFINITY,
        ],
    );
    b.set_grid(Dim::Param(n));
    let i = b.work_item();
    let k = b.load(idx, i);
    let v = b.lookup(table, k);
    b.store(out, i, v);
    let kernel = b.finish();
    let len = 67usize;
    let args = vec![
        OwnedArg::Scalar(Scalar::U32(len as u32)),
        OwnedArg::Read((0..len).map(|i| (i * 5 % 13) as u8).collect()),
        OwnedArg::Write(vec![0; len * 4]),
    ];
    check(&kernel, args);
}

#[test]
fn strided_and_sequential_sums_follow_the_canonical_order() {
    let mut b = KernelBuilder::new("sums");
    let rows = b.scalar_param("rows", ScalarType::U32);
    let cols = b.scalar_param("cols", ScalarType::U32);
    let x = b.buffer_param(
        "x",
        DType::F32,
        &[Dim::Param(rows), Dim::Param(cols)],
        Access::Read,
    );
    let h = b.buffer_param(
        "h",
        DType::BF16,
        &[Dim::Param(rows), Dim::Param(cols)],
        Access::Read,
    );
    let out = b.buffer_param(
        "out",
        DType::F32,
        &[Dim::Param(rows), Dim::Const(4)],
        Access::Write,
    );
    b.set_grid(Dim::Param(rows));
    let i = b.work_item();
    let c = b.param(cols);
    let start = b.mul(i, c);
    let sums = [
        b.reduce_sum(x, start, c, ReduceOrder::Sequential),
        b.reduce_sum(x, start, c, ReduceOrder::Strided(8)),
        b.reduce_sum(x, start, c, ReduceOrder::Strided(64)),
        b.reduce_sum(h, start, c, ReduceOrder::Strided(4)),
    ];
    let four = b.const_u32(4);
    let base = b.mul(i, four);
    for (j, s) in sums.into_iter().enumerate() {
        let jv = b.const_u32(j as u32);
        let at = b.add(base, jv);
        b.store(out, at, s);
    }
    let kernel = b.finish();
    for (r, c) in [(3u32, 1u32), (5, 77), (70, 130)] {
        let len = (r * c) as usize;
        // Values of very different magnitudes so that the order changes the rounding.
        let xs: Vec<f32> = values(len, r)
            .into_iter()
            .enumerate()
            .map(|(k, v)| if k % 5 == 0 { v * 1e7 } else { v })
            .map(|v| if v.is_finite() { v } else { 1.5 })
            .collect();
        let hs: Vec<u8> = xs
            .iter()
            .flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes())
            .collect();
        let args = vec![
            OwnedArg::Scalar(Scalar::U32(r)),
            OwnedArg::Scalar(Scalar::U32(c)),
            OwnedArg::Read(f32_bytes(&xs)),
            OwnedArg::Read(hs),
            OwnedArg::Write(vec![0; (r * 16) as usize]),
        ];
        if !check(&kernel, args) {
            return;
        }
    }
}

#[test]
fn bad_arguments_are_errors_not_panics() {
    let Some(dev) = device() else { return };
    let mut b = KernelBuilder::new("copy");
    let n = b.scalar_param("n", ScalarType::U32);
    let x = b.buffer_param("x", DType::F32, &[Dim::Param(n)], Access::Read);
    let y = b.buffer_param("y", DType::F32, &[Dim::Param(n)], Access::Write);
    b.set_grid(Dim::Param(n));
    let i = b.work_item();
    let v = b.load(x, i);
    b.store(y, i, v);
    let kernel = b.finish();
    let mut args = vec![
        OwnedArg::Scalar(Scalar::U32(4)),
        OwnedArg::Read(vec![0; 12]),
        OwnedArg::Write(vec![0; 16]),
    ];
    assert!(dev
        .launch(&kernel, &mut OwnedArg::borrow_all(&mut args))
        .is_err());
    // An empty grid runs nothing and succeeds.
    let mut args = vec![
        OwnedArg::Scalar(Scalar::U32(0)),
        OwnedArg::Read(vec![]),
        OwnedArg::Write(vec![]),
    ];
    dev.launch(&kernel, &mut OwnedArg::borrow_all(&mut args))
        .expect("empty launch");
}

/// Every library kernel once on edge-value inputs (odd size, several blocks), timing the
/// pipeline compile and counting mismatches per kernel. Slow on lavapipe (LLVM compiles each
/// pipeline): run with `--ignored --nocapture`; `QF_KERNELS=<substring>` selects kernels.
#[test]
#[ignore = "diagnostic timing report, slow on lavapipe; tests/conformance.rs checks the same kernels on this device"]
fn library_kernels_report() {
    use std::time::Instant;
    let Some(dev) = device() else { return };
    let (mut bad_kernels, mut total) = (0, 0);
    let filter = std::env::var("QF_KERNELS").unwrap_or_default();
    for entry in qforge_kernels::catalog() {
        let kernel = entry.build().expect("library kernels build");
        if !kernel.name.contains(&filter) {
            continue;
        }
        let bs = entry.blocksize();
        let vals = values(2 * bs + 3, bs as u32);
        let args = entry.example_args(&vals).expect("example args");
        let t = Instant::now();
        let compiled = dev.compile(&kernel);
        let ms = t.elapsed().as_secs_f64() * 1e3;
        total += 1;
        if let Err(e) = compiled {
            println!("{:48} compile error: {e}", kernel.name);
            bad_kernels += 1;
            continue;
        }
        let mut reference = args.clone();
        InterpreterDevice
            .launch(&kernel, &mut OwnedArg::borrow_all(&mut reference))
            .expect("interpreter runs");
        let mut got = args;
        let t = Instant::now();
        let run = dev.launch(&kernel, &mut OwnedArg::borrow_all(&mut got));
        let run_ms = t.elapsed().as_secs_f64() * 1e3;
        match run {
            Ok(()) => {
                let (bad, n) = count_mismatches(&kernel, &reference, &got);
                println!(
                    "{:48} compile {ms:8.1} ms  run {run_ms:7.1} ms  mismatches {bad}/{n}",
                    kernel.name
                );
                if bad > 0 {
                    report_words(&reference, &got);
                    bad_kernels += 1;
                }
            }
            Err(e) => {
                println!("{:48} launch error: {e}", kernel.name);
                bad_kernels += 1;
            }
        }
    }
    println!("{bad_kernels} of {total} library kernels not bit-exact");
    assert_eq!(bad_kernels, 0);
}
