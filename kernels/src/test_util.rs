//! Host helpers shared by the library's kernel tests: float values stored in and read back from
//! `f32`/`f16`/`bf16` buffers (round to nearest even, as the half crate does).

use half::{bf16, f16};

use qforge_ir::DType;
use qforge_ir::OwnedArg;

/// `v` rounded to `dtype` and widened back (the value a `dtype` buffer holds).
pub(crate) fn round(dtype: DType, v: f32) -> f32 {
    match dtype {
        DType::F16 => f16::from_f32(v).to_f32(),
        DType::BF16 => bf16::from_f32(v).to_f32(),
        _ => v,
    }
}

/// `values` stored as `dtype` (little endian).
pub(crate) fn bytes(dtype: DType, values: &[f32]) -> Vec<u8> {
    match dtype {
        DType::F16 => values
            .iter()
            .flat_map(|x| f16::from_f32(*x).to_le_bytes())
            .collect(),
        DType::BF16 => values
            .iter()
            .flat_map(|x| bf16::from_f32(*x).to_le_bytes())
            .collect(),
        _ => values.iter().flat_map(|x| x.to_le_bytes()).collect(),
    }
}

/// A `dtype` buffer's elements widened to `f32`.
pub(crate) fn floats(dtype: DType, b: &[u8]) -> Vec<f32> {
    match dtype {
        DType::F16 => b
            .chunks(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        DType::BF16 => b
            .chunks(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        _ => b
            .chunks(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    }
}

/// Runs `kernel` on the interpreter, panicking with the kernel's name on an error.
pub(crate) fn run(kernel: &qforge_ir::Kernel, args: &mut [OwnedArg]) {
    let mut borrowed = OwnedArg::borrow_all(args);
    qforge_ir::interp::run(kernel, &mut borrowed)
        .unwrap_or_else(|e| panic!("{}: {e}", kernel.name));
}

/// The bytes of buffer argument `i`.
pub(crate) fn out(args: &[OwnedArg], i: usize) -> &[u8] {
    match &args[i] {
        OwnedArg::Write(b) | OwnedArg::Read(b) => b,
        OwnedArg::Scalar(_) => panic!("argument {i} is a scalar"),
    }
}

/// Exact nearest code (f64 distances; ties to the lower index; NaN to 0).
pub(crate) fn nearest(code: &[f32], v: f32) -> u8 {
    if v.is_nan() {
        return 0;
    }
    let mut best = 0usize;
    for k in 1..code.len() {
        if (v as f64 - code[k] as f64).abs() < (v as f64 - code[best] as f64).abs() {
            best = k;
        }
    }
    best as u8
}
