//! `quantize_4bit` / `dequantize_4bit` (bitsandbytes' functional API).

use crate::quant4::{self, Dequantize4bitArgs, Dequantize4bitNestedArgs, Quantize4bitArgs};
use crate::{QuantType, BLOCKSIZES_4BIT, NESTED_BLOCKSIZE};
use qforge_ir::dsl::{FloatIn, FloatOut};
use qforge_ir::DType;

use crate::ops::{
    blocksize_u32, cached_typed, count_u32, expect_len, float_dtype, float_input, numel,
};
use qforge_runtime::HostTensor;
use qforge_runtime::{launch_typed, Device};
use qforge_runtime::{Error, Result};

/// The absmax of a 4-bit tensor: raw `f32` per block, or double-quantized (bitsandbytes'
/// `state2` plus `offset`).
#[derive(Clone, Debug, PartialEq)]
pub enum Absmax4 {
    /// One `f32` per block (`compress_statistics = false`).
    Plain(Vec<f32>),
    /// Double-quantized (`compress_statistics = true`):
    /// `absmax_b = nested_code[qabsmax_b] * nested_absmax[b / nested_blocksize] + offset`.
    Nested {
        /// One 8-bit code per 4-bit block.
        qabsmax: Vec<u8>,
        /// One `f32` scale per `nested_blocksize` codes.
        nested_absmax: Vec<f32>,
        /// The 256-entry code table of the nested level (the signed dynamic map).
        nested_code: Vec<f32>,
        /// The mean of the raw absmax, subtracted before the nested quantization.
        offset: f32,
        /// Codes per nested block; always 256.
        nested_blocksize: usize,
    },
}

impl Absmax4 {
    /// Checks the lengths against `n_blocks` 4-bit blocks (the nested level: blocksize 256,
    /// `ceil(n_blocks / 256)` scales, a 256-entry code); returns the nested scale count (0 for
    /// a plain absmax).
    ///
    /// # Errors
    /// [`Error::Invalid`] naming `op` and the buffer whose length is wrong.
    pub(crate) fn check_len(&self, op: &str, n_blocks: u32) -> Result<u32> {
        match self {
            Absmax4::Plain(absmax) => {
                expect_len(op, "absmax", absmax.len(), n_blocks as usize)?;
                Ok(0)
            }
            Absmax4::Nested {
                qabsmax,
                nested_absmax,
                nested_code,
                nested_blocksize,
                ..
            } => {
                blocksize_u32(op, *nested_blocksize, &[NESTED_BLOCKSIZE])?;
                let n_nested = n_blocks.div_ceil(NESTED_BLOCKSIZE);
                expect_len(op, "qabsmax", qabsmax.len(), n_blocks as usize)?;
                expect_len(op, "nested_absmax", nested_absmax.len(), n_nested as usize)?;
                expect_len(op, "nested_code", nested_code.len(), 256)?;
                Ok(n_nested)
            }
        }
    }
}

/// Everything needed to dequantize packed 4-bit codes (bitsandbytes' `QuantState`).
#[derive(Clone, Debug, PartialEq)]
pub struct QuantState4 {
    /// NF4 or FP4.
    pub quant_type: QuantType,
    /// Elements per absmax block.
    pub blocksize: usize,
    /// Dtype of the original tensor (and of the dequantized one).
    pub dtype: DType,
    /// Shape of the original tensor.
    pub shape: Vec<usize>,
    /// The per-block scales.
    pub absmax: Absmax4,
}

/// Quantizes a float tensor to packed 4-bit codes (two per byte, first element in the high
/// nibble) with one absmax per `blocksize` elements of the flattened tensor, like bitsandbytes'
/// `quantize_4bit(A, blocksize, quant_type, compress_statistics)`. With `compress_statistics`
/// the absmax is double-quantized ([`crate::ops::compress_absmax`]).
///
/// # Errors
/// [`Error::Invalid`] for an empty or non-float tensor, bytes that do not match the shape, more
/// than `u32::MAX` elements, or an unsupported blocksize (allowed: 32..=4096, powers of two);
/// any device error.
pub fn quantize_4bit(
    dev: &dyn Device,
    x: &HostTensor,
    quant_type: QuantType,
    blocksize: usize,
    compress_statistics: bool,
) -> Result<(Vec<u8>, QuantState4)> {
    let bs = blocksize_u32("quantize_4bit", blocksize, &BLOCKSIZES_4BIT)?;
    let n = float_input("quantize_4bit", x)?;
    let (n_packed, n_blocks) = (n.div_ceil(2), n.div_ceil(bs));
    let name = quant4::quantize_name(quant_type, bs, x.dtype);
    let kernel = cached_typed(&name, || quant4::quantize_4bit(quant_type, bs, x.dtype))?;
    let mut packed = vec![0u8; n_packed as usize];
    let mut absmax = vec![0f32; n_blocks as usize];
    launch_typed(
        dev,
        &kernel,
        &mut Quantize4bitArgs {
            n,
            n_packed,
            n_blocks,
            x: FloatIn {
                dtype: x.dtype,
                bytes: &x.data,
            },
            packed: &mut packed,
            absmax: &mut absmax,
        },
    )?;
    let absmax = if compress_statistics {
        crate::ops::compress_absmax(dev, &absmax)?
    } else {
        Absmax4::Plain(absmax)
    };
    Ok((
        packed,
        QuantState4 {
            quant_type,
            blocksize,
            dtype: x.dtype,
            shape: x.shape.clone(),
            absmax,
        },
    ))
}

/// Dequantizes packed 4-bit codes to a tensor of the state's dtype and shape, like bitsandbytes'
/// `dequantize_4bit(A, quant_state)`: `code[nibble] * absmax` in `f32`, rounded to nearest even
/// to the dtype; a nested absmax is decoded in the kernel.
///
/// # Errors
/// [`Error::Invalid`] when the state describes an empty or oversized tensor, has a non-float
/// dtype, or a buffer length does not match it (`packed` must hold `ceil(n/2)` bytes, the absmax
/// `ceil(n/blocksize)` entries, the nested absmax `ceil(n_blocks/256)` entries, the nested code
/// 256), or an unsupported blocksize or nested blocksize; any device error.
pub fn dequantize_4bit(dev: &dyn Device, packed: &[u8], state: &QuantState4) -> Result<HostTensor> {
    const OP: &str = "dequantize_4bit";
    let (qt, dtype) = (state.quant_type, state.dtype);
    let bs = blocksize_u32(OP, state.blocksize, &BLOCKSIZES_4BIT)?;
    float_dtype(OP, dtype)?;
    let numel = numel(OP, &state.shape)?;
    if numel == 0 {
        return Err(Error::Invalid(format!(
            "{OP}: the quant state describes an empty tensor (shape {:?})",
            state.shape
        )));
    }
    let n = count_u32(OP, "the tensor", numel)?;
    let (n_packed, n_blocks) = (n.div_ceil(2), n.div_ceil(bs));
    expect_len(OP, "packed", packed.len(), n_packed as usize)?;
    let mut out = vec![0u8; numel * dtype.size_bytes()];
    let n_nested = state.absmax.check_len(OP, n_blocks)?;
    match &state.absmax {
        Absmax4::Plain(absmax) => {
            let kernel = cached_typed(&quant4::dequantize_name(qt, bs, dtype), || {
                quant4::dequantize_4bit(qt, bs, dtype)
            })?;
            launch_typed(
                dev,
                &kernel,
                &mut Dequantize4bitArgs {
                    n,
                    n_packed,
                    n_blocks,
                    packed,
                    absmax,
                    out: FloatOut {
                        dtype,
                        bytes: &mut out,
                    },
                },
            )?;
        }
        Absmax4::Nested {
            qabsmax,
            nested_absmax,
            nested_code,
            offset,
            ..
        } => {
            let kernel = cached_typed(&quant4::dequantize_nested_name(qt, bs, dtype), || {
                quant4::dequantize_4bit_nested(qt, bs, dtype)
            })?;
            launch_typed(
                dev,
                &kernel,
                &mut Dequantize4bitNestedArgs {
                    n,
                    n_packed,
                    n_blocks,
                    n_nested,
                    offset: *offset,
                    packed,
                    qabsmax,
                    nested_absmax,
                    nested_code,
                    out: FloatOut {
                        dtype,
                        bytes: &mut out,
                    },
                },
            )?;
        }
    }
    HostTensor::new(dtype, state.shape.clone(), out)
}
