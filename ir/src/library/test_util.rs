//! Host helpers shared by the library's kernel tests: float values stored in and read back from
//! `f32`/`f16`/`bf16` buffers (round to nearest even, as the half crate does).

use half::{bf16, f16};

use crate::types::DType;

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
