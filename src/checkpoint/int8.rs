//! qforge's 8-bit blockwise weight layout (bitsandbytes `quantize_blockwise` with the signed
//! dynamic map): `<name>` U8 codes in the weight's shape, `<name>.absmax` F32 per block,
//! `<name>.quant_map` F32[256], and a JSON blob `<name>.quant_state.qforge__int8_blockwise`.
//! transformers has no loader for it (and the config qforge writes makes it refuse the folder);
//! `qforge dequantize` reads it back.

use qforge_ir::DType;
use qforge_kernels::BlockwiseMap;

use super::bnb4::torch_dtype_name;
use super::companions::Companions;
use crate::error::Result;

/// Suffix of the JSON quant-state tensor of an 8-bit blockwise weight.
pub const STATE_SUFFIX: &str = ".quant_state.qforge__int8_blockwise";

/// The JSON quant state.
pub fn state_json(blocksize: usize, dtype: DType, shape: &[usize]) -> String {
    let shape = shape
        .iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "{{\"quant_type\": \"int8_blockwise\", \"code\": \"dynamic\", \"blocksize\": {blocksize}, \"dtype\": \"{}\", \"shape\": [{shape}]}}",
        torch_dtype_name(dtype)
    )
}

/// Decoded quant state of an 8-bit blockwise weight (the codes stay in the file).
#[derive(Clone, Debug, PartialEq)]
pub struct Int8State {
    /// Original dtype.
    pub dtype: DType,
    /// Original shape.
    pub shape: Vec<usize>,
    /// Block size in elements.
    pub blocksize: usize,
    /// Per-block absmax.
    pub absmax: Vec<f32>,
}

/// Reads weight `name`'s state back.
///
/// # Errors
/// [`Error::Tensor`] when a companion tensor is missing or the JSON is malformed.
pub fn decode(c: &Companions<'_>) -> Result<Int8State> {
    let state = c.state(STATE_SUFFIX)?;
    let (quant_type, code) = (state.str("quant_type")?, state.str("code")?);
    if quant_type != "int8_blockwise" || code != "dynamic" {
        return Err(c.error(format!("quant state says quant_type '{quant_type}' with code '{code}'; only int8_blockwise with the dynamic code is supported")));
    }
    let (blocksize, dtype, shape) = (state.usize("blocksize")?, state.dtype()?, state.shape()?);
    if !(64..=4096).contains(&blocksize) || !blocksize.is_power_of_two() {
        return Err(c.error(format!(
            "unsupported blocksize {blocksize} (64..4096, powers of two)"
        )));
    }
    let codes = c.get_typed("", "U8")?;
    if codes.1.shape != shape {
        return Err(c.error(format!(
            "codes have shape {:?} but the quant state says {shape:?}",
            codes.1.shape
        )));
    }
    c.expect_table(
        ".quant_map",
        &BlockwiseMap::Dynamic.code(),
        "the signed dynamic map",
    )?;
    let absmax = c.f32s(".absmax")?;
    let n: usize = shape.iter().product();
    if absmax.len() != n.div_ceil(blocksize) {
        return Err(c.error(format!(
            "absmax has {} values; {} blocks need as many",
            absmax.len(),
            n.div_ceil(blocksize)
        )));
    }
    Ok(Int8State {
        dtype,
        shape,
        blocksize,
        absmax,
    })
}
