//! `quantize_blockwise` / `dequantize_blockwise` and the double-quantization steps.

use qforge_ir::library::{blockwise8, doublequant, Map8, NESTED_BLOCKSIZE};
use qforge_ir::{DType, OwnedArg, Scalar};

use super::{
    cached_kernel, count_u32, expect_len, f32_le, float_dtype, float_input, launch, le_f32, numel, take_output,
    u32_arg, NestedAbsmax,
};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::tensor::HostTensor;

/// Quantizes a float tensor to one 8-bit code per element with one absmax per `blocksize`
/// elements of the flattened tensor, like bitsandbytes' `quantize_blockwise(A, code, blocksize)`.
/// Returns `(codes, absmax)`.
///
/// # Errors
/// [`Error::Invalid`] for an empty or non-float tensor, bytes that do not match the shape, or more
/// than `u32::MAX` elements; an unsupported blocksize (allowed: 64..=4096, powers of two) as
/// [`Error::Ir`]; any device error.
pub fn quantize_blockwise(dev: &dyn Device, x: &HostTensor, map: Map8, blocksize: u32) -> Result<(Vec<u8>, Vec<f32>)> {
    qforge_ir::library::check_blocksize_8bit(blocksize)?;
    let n = float_input("quantize_blockwise", x)?;
    let n_blocks = n.div_ceil(blocksize);
    let kernel = cached_kernel(&blockwise8::quantize_name(map, blocksize, x.dtype), || {
        blockwise8::quantize_blockwise(map, blocksize, x.dtype)
    })?;
    let mut args = vec![
        u32_arg(n),
        u32_arg(n_blocks),
        OwnedArg::Read(x.data.clone()),
        OwnedArg::Write(vec![0; n as usize]),
        OwnedArg::Write(vec![0; 4 * n_blocks as usize]),
    ];
    launch(dev, &kernel, &mut args)?;
    Ok((take_output(&mut args, 3), le_f32(&take_output(&mut args, 4))))
}

/// Dequantizes 8-bit codes to a tensor of `dtype` and `shape`, like bitsandbytes'
/// `dequantize_blockwise(A, quant_state)`: `code[q] * absmax` in `f32`, rounded to nearest even.
///
/// # Errors
/// [`Error::Invalid`] for an empty or oversized shape, a non-float dtype, `q` not holding one code
/// per element or `absmax` not one value per block; an unsupported blocksize as [`Error::Ir`];
/// any device error.
pub fn dequantize_blockwise(
    dev: &dyn Device,
    q: &[u8],
    absmax: &[f32],
    map: Map8,
    blocksize: u32,
    dtype: DType,
    shape: &[usize],
) -> Result<HostTensor> {
    const OP: &str = "dequantize_blockwise";
    qforge_ir::library::check_blocksize_8bit(blocksize)?;
    float_dtype(OP, dtype)?;
    let numel = numel(OP, shape)?;
    if numel == 0 {
        return Err(Error::Invalid(format!("{OP}: shape {shape:?} is empty")));
    }
    let n = count_u32(OP, "the tensor", numel)?;
    let n_blocks = n.div_ceil(blocksize);
    expect_len(OP, "q", q.len(), numel)?;
    expect_len(OP, "absmax", absmax.len(), n_blocks as usize)?;
    let kernel = cached_kernel(&blockwise8::dequantize_name(map, blocksize, dtype), || {
        blockwise8::dequantize_blockwise(map, blocksize, dtype)
    })?;
    let mut args = vec![
        u32_arg(n),
        u32_arg(n_blocks),
        OwnedArg::Read(q.to_vec()),
        OwnedArg::Read(f32_le(absmax)),
        OwnedArg::Write(vec![0; numel * dtype.size_bytes()]),
    ];
    launch(dev, &kernel, &mut args)?;
    HostTensor::new(dtype, shape.to_vec(), take_output(&mut args, 4))
}

/// The double-quantization offset: the `f32` mean of `absmax`, summed in the order
/// [`doublequant::OFFSET_ORDER`] and divided once by the count.
///
/// # Errors
/// [`Error::Invalid`] for an empty or oversized `absmax`; any device error.
pub fn absmax_mean(dev: &dyn Device, absmax: &[f32]) -> Result<f32> {
    let n = nonempty("absmax_mean", absmax)?;
    let kernel = cached_kernel(doublequant::MEAN_NAME, || Ok(doublequant::absmax_mean()))?;
    let mut args = vec![u32_arg(n), OwnedArg::Read(f32_le(absmax)), OwnedArg::Write(vec![0; 4])];
    launch(dev, &kernel, &mut args)?;
    Ok(le_f32(&take_output(&mut args, 2)).first().copied().unwrap_or(f32::NAN))
}

/// Double-quantizes a 4-bit absmax like bitsandbytes' `compress_statistics=True`:
/// `offset = absmax_mean(absmax)`, then [`compress_absmax_with_offset`].
///
/// # Errors
/// As [`absmax_mean`].
pub fn compress_absmax(dev: &dyn Device, absmax: &[f32]) -> Result<NestedAbsmax> {
    let offset = absmax_mean(dev, absmax)?;
    compress_absmax_with_offset(dev, absmax, offset)
}

/// Quantizes `absmax - offset` (one `f32` subtraction per element) with 8-bit blockwise
/// quantization, signed dynamic map, blocksize 256. Useful to pin the offset (e.g. to a value
/// computed by bitsandbytes).
///
/// # Errors
/// [`Error::Invalid`] for an empty or oversized `absmax`; any device error.
pub fn compress_absmax_with_offset(dev: &dyn Device, absmax: &[f32], offset: f32) -> Result<NestedAbsmax> {
    let n = nonempty("compress_absmax", absmax)?;
    let n_blocks = n.div_ceil(NESTED_BLOCKSIZE);
    let kernel = cached_kernel(doublequant::QUANTIZE_NESTED_NAME, doublequant::quantize_nested)?;
    let mut args = vec![
        u32_arg(n),
        u32_arg(n_blocks),
        OwnedArg::Scalar(Scalar::f32(offset)),
        OwnedArg::Read(f32_le(absmax)),
        OwnedArg::Write(vec![0; n as usize]),
        OwnedArg::Write(vec![0; 4 * n_blocks as usize]),
    ];
    launch(dev, &kernel, &mut args)?;
    Ok(NestedAbsmax {
        qabsmax: take_output(&mut args, 4),
        nested_absmax: le_f32(&take_output(&mut args, 5)),
        nested_code: doublequant::NESTED_MAP.code(),
        offset,
        nested_blocksize: NESTED_BLOCKSIZE,
    })
}

/// Decodes a double-quantized absmax: `nested_code[q] * nested_absmax[i / 256] + offset` (two
/// `f32` roundings), as bitsandbytes' `dequantize_blockwise(qabsmax, state2) + offset`.
///
/// # Errors
/// [`Error::Invalid`] when the lengths are inconsistent, the nested blocksize is not 256, or the
/// nested code is not the signed dynamic map (the only one this kernel bakes in); any device
/// error.
pub fn decompress_absmax(dev: &dyn Device, nested: &NestedAbsmax) -> Result<Vec<f32>> {
    const OP: &str = "decompress_absmax";
    let n = nonempty(OP, &nested.qabsmax)?;
    let n_blocks = n.div_ceil(NESTED_BLOCKSIZE);
    if nested.nested_blocksize != NESTED_BLOCKSIZE {
        return Err(Error::Invalid(format!(
            "{OP}: nested blocksize {} is not supported; allowed: {NESTED_BLOCKSIZE}",
            nested.nested_blocksize
        )));
    }
    expect_len(OP, "nested_absmax", nested.nested_absmax.len(), n_blocks as usize)?;
    let dynamic = doublequant::NESTED_MAP.code();
    if nested.nested_code.len() != 256 || nested.nested_code.iter().zip(&dynamic).any(|(a, b)| a.to_bits() != b.to_bits()) {
        return Err(Error::Invalid(format!("{OP}: the nested code is not the signed dynamic map")));
    }
    let kernel = cached_kernel(doublequant::DEQUANTIZE_NESTED_NAME, doublequant::dequantize_nested)?;
    let mut args = vec![
        u32_arg(n),
        u32_arg(n_blocks),
        OwnedArg::Scalar(Scalar::f32(nested.offset)),
        OwnedArg::Read(nested.qabsmax.clone()),
        OwnedArg::Read(f32_le(&nested.nested_absmax)),
        OwnedArg::Write(vec![0; 4 * n as usize]),
    ];
    launch(dev, &kernel, &mut args)?;
    Ok(le_f32(&take_output(&mut args, 5)))
}

fn nonempty<T>(op: &str, values: &[T]) -> Result<u32> {
    if values.is_empty() {
        return Err(Error::Invalid(format!("{op}: the absmax is empty")));
    }
    count_u32(op, "the absmax", values.len())
}
