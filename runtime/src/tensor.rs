//! `HostTensor`: a dtype, a shape and little-endian bytes in host memory.

use half::{bf16, f16};
use qforge_ir::DType;

use crate::error::{Error, Result};

/// A dense row-major tensor in host memory.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    /// Element type.
    pub dtype: DType,
    /// Shape (row-major); the element count is the product.
    pub shape: Vec<usize>,
    /// `numel * dtype.size_bytes()` little-endian bytes.
    pub data: Vec<u8>,
}

impl HostTensor {
    /// Wraps bytes, checking that their length matches the shape.
    ///
    /// # Errors
    /// [`Error::Invalid`] when `data.len() != numel * size`.
    pub fn new(dtype: DType, shape: Vec<usize>, data: Vec<u8>) -> Result<Self> {
        let numel = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        match numel.and_then(|n| n.checked_mul(dtype.size_bytes())) {
            Some(bytes) if bytes == data.len() => Ok(HostTensor { dtype, shape, data }),
            _ => Err(Error::Invalid(format!(
                "tensor of shape {shape:?} and dtype {dtype} cannot hold {} bytes",
                data.len()
            ))),
        }
    }

    /// An `f32` tensor from values.
    pub fn from_f32(shape: Vec<usize>, values: &[f32]) -> Result<Self> {
        Self::new(
            DType::F32,
            shape,
            values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        )
    }

    /// Converts `f32` values to `dtype` (round to nearest even for f16/bf16).
    ///
    /// # Errors
    /// [`Error::Invalid`] for a non-float dtype or a shape that does not match.
    pub fn from_f32_as(dtype: DType, shape: Vec<usize>, values: &[f32]) -> Result<Self> {
        let data = match dtype {
            DType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            DType::F16 => values
                .iter()
                .flat_map(|v| f16::from_f32(*v).to_le_bytes())
                .collect(),
            DType::BF16 => values
                .iter()
                .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
                .collect(),
            other => {
                return Err(Error::Invalid(format!(
                    "from_f32_as needs a float dtype, got {other}"
                )))
            }
        };
        Self::new(dtype, shape, data)
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The elements widened to `f32` (exact for f16/bf16).
    ///
    /// # Errors
    /// [`Error::Invalid`] for a non-float dtype.
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        match self.dtype {
            DType::F32 => Ok(self
                .data
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()),
            DType::F16 => Ok(self
                .data
                .chunks_exact(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect()),
            DType::BF16 => Ok(self
                .data
                .chunks_exact(2)
                .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect()),
            other => Err(Error::Invalid(format!(
                "expected a float tensor, got {other}"
            ))),
        }
    }
}

/// `f32` values to little-endian bytes.
pub fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Little-endian bytes to `f32` values (a trailing partial element is ignored).
pub fn bytes_f32(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}
