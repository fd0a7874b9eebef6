//! `quantize_blockwise` / `dequantize_blockwise` and the double-quantization steps.

use crate::blockwise8::{self, BlockwiseDequantizeArgs, BlockwiseQuantizeArgs};
use crate::doublequant::{self, AbsmaxMeanArgs};
use crate::{BlockwiseMap, BLOCKSIZES_8BIT, NESTED_BLOCKSIZE};
use qforge_ir::dsl::{FloatIn, FloatOut};
use qforge_ir::DType;

use crate::ops::{
    blocksize_u32, cached_typed, count_u32, expect_len, float_dtype, float_input, numel, Absmax4,
};
use qforge_runtime::HostTensor;
use qforge_runtime::{launch_typed, Device};
use qforge_runtime::{Error, Result};

/// Quantizes a float tensor to one 8-bit code per element with one absmax per `blocksize`
/// elements of the flattened tensor, like bitsandbytes' `quantize_blockwise(A, code, blocksize)`.
/// Returns `(codes, absmax)`.
///
/// # Errors
/// [`Error::Invalid`] for an empty or non-float tensor, bytes that do not match the shape, more
/// than `u32::MAX` elements, or an unsupported blocksize (allowed: 64..=4096, powers of two);
/// any device error.
pub fn quantize_blockwise(
    dev: &dyn Device,
    x: &HostTensor,
    map: BlockwiseMap,
    blocksize: usize,
) -> Result<(Vec<u8>, Vec<f32>)> {
    let blocksize = blocksize_u32("quantize_blockwise", blocksize, &BLOCKSIZES_8BIT)?;
    let n = float_input("quantize_blockwise", x)?;
    let n_blocks = n.div_ceil(blocksize);
    let kernel = cached_typed(&blockwise8::quantize_name(map, blocksize, x.dtype), || {
        blockwise8::quantize_blockwise(map, blocksize, x.dtype)
    })?;
    let mut q = vec![0u8; n as usize];
    let mut absmax = vec![0f32; n_blocks as usize];
    launch_typed(
        dev,
        &kernel,
        &mut BlockwiseQuantizeArgs {
            n,
            n_blocks,
            offset: None,
            x: FloatIn {
                dtype: x.dtype,
                bytes: &x.data,
            },
            q: &mut q,
            absmax: &mut absmax,
        },
    )?;
    Ok((q, absmax))
}

/// Dequantizes 8-bit codes to a tensor of `dtype` and `shape`, like bitsandbytes'
/// `dequantize_blockwise(A, quant_state)`: `code[q] * absmax` in `f32`, rounded to nearest even.
///
/// # Errors
/// [`Error::Invalid`] for an empty or oversized shape, a non-float dtype, `q` not holding one code
/// per element or `absmax` not one value per block, or an unsupported blocksize; any device
/// error.
pub fn dequantize_blockwise(
    dev: &dyn Device,
    q: &[u8],
    absmax: &[f32],
    map: BlockwiseMap,
    blocksize: usize,
    dtype: DType,
    shape: &[usize],
) -> Result<HostTensor> {
    const OP: &str = "dequantize_blockwise";
    let blocksize = blocksize_u32(OP, blocksize, &BLOCKSIZES_8BIT)?;
    float_dtype(OP, dtype)?;
    let numel = numel(OP, shape)?;
    if numel == 0 {
        return Err(Error::Invalid(format!("{OP}: shape {shape:?} is empty")));
    }
    let n = count_u32(OP, "the tensor", numel)?;
    let n_blocks = n.div_ceil(blocksize);
    expect_len(OP, "q", q.len(), numel)?;
    expect_len(OP, "absmax", absmax.len(), n_blocks as usize)?;
    let kernel = cached_typed(&blockwise8::dequantize_name(map, blocksize, dtype), || {
        blockwise8::dequantize_blockwise(map, blocksize, dtype)
    })?;
    let mut out = vec![0u8; numel * dtype.size_bytes()];
    launch_typed(
        dev,
        &kernel,
        &mut BlockwiseDequantizeArgs {
            n,
            n_blocks,
            offset: None,
            q,
            absmax,
            out: FloatOut {
                dtype,
                bytes: &mut out,
            },
        },
    )?;
    HostTensor::new(dtype, shape.to_vec(), out)
}

/// The double-quantization offset: the `f32` mean of `absmax`, summed in torch's CPU order and
/// divided once by the count, bitsandbytes' `absmax.mean()` ([`doublequant::absmax_mean`]).
///
/// # Errors
/// [`Error::Invalid`] for an empty or oversized `absmax`; any device error.
pub fn absmax_mean(dev: &dyn Device, absmax: &[f32]) -> Result<f32> {
    let n = nonempty("absmax_mean", absmax)?;
    let kernel = cached_typed(doublequant::MEAN_NAME, doublequant::absmax_mean)?;
    let mut out = [f32::NAN];
    launch_typed(
        dev,
        &kernel,
        &mut AbsmaxMeanArgs {
            n,
            absmax,
            out: &mut out,
        },
    )?;
    Ok(out[0])
}

/// Double-quantizes a 4-bit absmax like bitsandbytes' `compress_statistics=True`:
/// `offset = absmax_mean(absmax)`, then [`compress_absmax_with_offset`]. Returns
/// [`Absmax4::Nested`].
///
/// # Errors
/// As [`absmax_mean`].
pub fn compress_absmax(dev: &dyn Device, absmax: &[f32]) -> Result<Absmax4> {
    let offset = absmax_mean(dev, absmax)?;
    compress_absmax_with_offset(dev, absmax, offset)
}

/// Quantizes `absmax - offset` (one `f32` subtraction per element) with 8-bit blockwise
/// quantization, signed dynamic map, blocksize 256, and returns [`Absmax4::Nested`]. Useful to
/// pin the offset (e.g. to a value computed by bitsandbytes).
///
/// # Errors
/// [`Error::Invalid`] for an empty or oversized `absmax`; any device error.
pub fn compress_absmax_with_offset(
    dev: &dyn Device,
    absmax: &[f32],
    offset: f32,
) -> Result<Absmax4> {
    let n = nonempty("compress_absmax", absmax)?;
    let n_blocks = n.div_ceil(NESTED_BLOCKSIZE);
    let kernel = cached_typed(
        doublequant::QUANTIZE_NESTED_NAME,
        doublequant::quantize_nested,
    )?;
    let mut qabsmax = vec![0u8; n as usize];
    let mut nested_absmax = vec![0f32; n_blocks as usize];
    launch_typed(
        dev,
        &kernel,
        &mut BlockwiseQuantizeArgs {
            n,
            n_blocks,
            offset: Some(offset),
            x: FloatIn::f32(absmax),
            q: &mut qabsmax,
            absmax: &mut nested_absmax,
        },
    )?;
    Ok(Absmax4::Nested {
        qabsmax,
        nested_absmax,
        nested_code: doublequant::NESTED_MAP.code(),
        offset,
        nested_blocksize: NESTED_BLOCKSIZE as usize,
    })
}

/// The `f32` absmax that dequantization uses: a plain absmax as it is; a nested one decoded as
/// `nested_code[q] * nested_absmax[i / 256] + offset` (two `f32` roundings), like
/// bitsandbytes' `dequantize_blockwise(qabsmax, state2) + offset`.
///
/// # Errors
/// [`Error::Invalid`] when a nested absmax is empty, its lengths are inconsistent, its nested
/// blocksize is not 256, or its nested code is not the signed dynamic map (the only one this
/// kernel bakes in); any device error.
pub fn decompress_absmax(dev: &dyn Device, absmax: &Absmax4) -> Result<Vec<f32>> {
    const OP: &str = "decompress_absmax";
    let (qabsmax, nested_absmax, nested_code, offset, nested_blocksize) = match absmax {
        Absmax4::Plain(values) => return Ok(values.clone()),
        Absmax4::Nested {
            qabsmax,
            nested_absmax,
            nested_code,
            offset,
            nested_blocksize,
        } => (
            qabsmax,
            nested_absmax,
            nested_code,
            *offset,
            *nested_blocksize,
        ),
    };
    let n = nonempty(OP, qabsmax)?;
    let n_blocks = n.div_ceil(NESTED_BLOCKSIZE);
    blocksize_u32(OP, nested_blocksize, &[NESTED_BLOCKSIZE])?;
    expect_len(OP, "nested_absmax", nested_absmax.len(), n_blocks as usize)?;
    let dynamic = doublequant::NESTED_MAP.code();
    if nested_code.len() != 256
        || nested_code
            .iter()
            .zip(&dynamic)
            .any(|(a, b)| a.to_bits() != b.to_bits())
    {
        return Err(Error::Invalid(format!(
            "{OP}: the nested code is not the signed dynamic map"
        )));
    }
    let kernel = cached_typed(
        doublequant::DEQUANTIZE_NESTED_NAME,
        doublequant::dequantize_nested,
    )?;
    let mut out = vec![0f32; n as usize];
    launch_typed(
        dev,
        &kernel,
        &mut BlockwiseDequantizeArgs {
            n,
            n_blocks,
            offset: Some(offset),
            q: qabsmax,
            absmax: nested_absmax,
            out: FloatOut::f32(&mut out),
        },
    )?;
    Ok(out)
}

fn nonempty<T>(op: &str, values: &[T]) -> Result<u32> {
    if values.is_empty() {
        return Err(Error::Invalid(format!("{op}: the absmax is empty")));
    }
    count_u32(op, "the absmax", values.len())
}
