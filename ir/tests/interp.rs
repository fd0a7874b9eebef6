//! The reference interpreter against independent facts: IEEE 754 rules, hand-derived constants
//! and Rust std operations written out in the tests. Every test builds its kernel with the
//! public `KernelBuilder` and runs it through `interp::run` / `interp::run_items`. The cases are
//! split by op family into the files under `tests/interp/`; the shared helpers are here.

#[path = "interp/accumulate.rs"]
mod accumulate;
#[path = "interp/arith.rs"]
mod arith;
#[path = "interp/control.rs"]
mod control;
#[path = "interp/convert.rs"]
mod convert;
#[path = "interp/memory.rs"]
mod memory;

use qforge_ir::{
    interp, Access, DType, Dim, Kernel, KernelBuilder, OwnedArg, Scalar, ScalarType, Value,
};

// ----- helpers -----

fn le32(xs: &[u32]) -> Vec<u8> {
    xs.iter().flat_map(|x| x.to_le_bytes()).collect()
}
fn le16(xs: &[u16]) -> Vec<u8> {
    xs.iter().flat_map(|x| x.to_le_bytes()).collect()
}
fn f32s(xs: &[f32]) -> Vec<u32> {
    xs.iter().map(|x| x.to_bits()).collect()
}
fn i32s(xs: &[i32]) -> Vec<u32> {
    xs.iter().map(|&x| x as u32).collect()
}
fn words(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}
fn halves(bytes: &[u8]) -> Vec<u16> {
    bytes
        .chunks_exact(2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .collect()
}

fn dtype_of(ty: ScalarType) -> DType {
    match ty {
        ScalarType::F32 => DType::F32,
        ScalarType::I32 => DType::I32,
        ScalarType::U32 | ScalarType::Bool => DType::U32,
    }
}

/// Runs `kernel` on `args`, panicking on error; returns the arguments afterwards.
fn run(kernel: &Kernel, mut args: Vec<OwnedArg>) -> Vec<OwnedArg> {
    let mut borrowed = OwnedArg::borrow_all(&mut args);
    interp::run(kernel, &mut borrowed).unwrap_or_else(|e| panic!("{e}"));
    drop(borrowed);
    args
}

fn try_run(kernel: &Kernel, args: &mut [OwnedArg]) -> qforge_ir::Result<()> {
    interp::run(kernel, &mut OwnedArg::borrow_all(args))
}

fn out_bytes(arg: &OwnedArg) -> &[u8] {
    match arg {
        OwnedArg::Write(b) => b,
        other => panic!("not an output: {other:?}"),
    }
}

/// Builds and runs `out[i] = f(a[i], b[i], c[i])` over `n = a.len()` work items. Operands have
/// type `ty`, the result type `rty`; a `bool` result is stored as 0/1 in a `u32` buffer.
fn map3(
    ty: ScalarType,
    rty: ScalarType,
    a: &[u32],
    b: &[u32],
    c: &[u32],
    f: impl FnOnce(&mut KernelBuilder, Value, Value, Value) -> Value,
) -> Vec<u32> {
    let n = a.len() as u32;
    let mut k = KernelBuilder::new("map");
    let np = k.scalar_param("n", ScalarType::U32);
    let dim = [Dim::Param(np)];
    let pa = k.buffer_param("a", dtype_of(ty), &dim, Access::Read);
    let pb = k.buffer_param("b", dtype_of(ty), &dim, Access::Read);
    let pc = k.buffer_param("c", dtype_of(ty), &dim, Access::Read);
    let out = k.buffer_param("out", dtype_of(rty), &dim, Access::Write);
    k.set_grid(Dim::Param(np));
    let i = k.work_item();
    let (x, y, z) = (k.load(pa, i), k.load(pb, i), k.load(pc, i));
    let mut r = f(&mut k, x, y, z);
    if rty == ScalarType::Bool {
        let (one, zero) = (k.const_u32(1), k.const_u32(0));
        r = k.select(r, one, zero);
    }
    k.store(out, i, r);
    let kernel = k.finish();
    let args = vec![
        OwnedArg::Scalar(Scalar::U32(n)),
        OwnedArg::Read(le32(a)),
        OwnedArg::Read(le32(b)),
        OwnedArg::Read(le32(c)),
        OwnedArg::Write(vec![0; a.len() * 4]),
    ];
    words(out_bytes(&run(&kernel, args)[4]))
}

fn map2(
    ty: ScalarType,
    rty: ScalarType,
    a: &[u32],
    b: &[u32],
    f: impl FnOnce(&mut KernelBuilder, Value, Value) -> Value,
) -> Vec<u32> {
    map3(ty, rty, a, b, b, |k, x, y, _| f(k, x, y))
}

fn map1(
    ty: ScalarType,
    rty: ScalarType,
    a: &[u32],
    f: impl FnOnce(&mut KernelBuilder, Value) -> Value,
) -> Vec<u32> {
    map3(ty, rty, a, a, a, |k, x, _, _| f(k, x))
}

/// Same bits, or both NaN (the only relaxation of the numeric contract).
fn same_f32(got: u32, want: u32) -> bool {
    got == want || (f32::from_bits(got).is_nan() && f32::from_bits(want).is_nan())
}

fn assert_f32s(what: &str, inputs: &[String], got: &[u32], want: &[u32]) {
    assert_eq!(got.len(), want.len());
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            same_f32(*g, *w),
            "{what} {}: got {:#010x} ({}), want {:#010x} ({})",
            inputs[k],
            g,
            f32::from_bits(*g),
            w,
            f32::from_bits(*w)
        );
    }
}

/// Edge values for f32: zeros, subnormals, extremes, infinities, NaN, ordinary numbers.
fn f32_edges() -> Vec<f32> {
    vec![
        0.0,
        -0.0,
        1.0,
        -1.0,
        1.5,
        2.5,
        0.1,
        3.0,
        1e30,
        -7.25,
        f32::MIN_POSITIVE,
        f32::from_bits(1),           // smallest subnormal
        f32::from_bits(0x0040_0000), // 2^-127, subnormal
        f32::from_bits(0x807F_FFFF), // largest negative subnormal
        f32::MAX,
        f32::MIN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
    ]
}

/// All ordered pairs of `xs`, as two parallel lists.
fn pairs<T: Copy>(xs: &[T]) -> (Vec<T>, Vec<T>) {
    let mut a = Vec::new();
    let mut b = Vec::new();
    for &x in xs {
        for &y in xs {
            a.push(x);
            b.push(y);
        }
    }
    (a, b)
}
