//! qforge's 8-bit blockwise weight layout (bitsandbytes `quantize_blockwise` with the signed
//! dynamic map): `<name>` U8 codes in the weight's shape, `<name>.absmax` F32 per block,
//! `<name>.quant_map` F32[256], and a JSON blob `<name>.quant_state.qforge__int8_blockwise`.
//! transformers has no loader for it; `qforge dequantize` reads it back.

use std::collections::BTreeMap;
use std::path::Path;

use qforge_ir::library::BlockwiseMap;
use qforge_runtime::HostTensor;
use safetensors::Dtype;

use super::bnb4::torch_dtype_name;
use super::companions::Companions;
use super::io::{RawTensor, TensorRef};
use crate::error::Result;

/// Suffix of the JSON quant-state tensor of an 8-bit blockwise weight.
pub const STATE_SUFFIX: &str = ".quant_state.qforge__int8_blockwise";

/// Decoded quant state of an 8-bit blockwise weight.
#[derive(Clone, Debug, PartialEq)]
pub struct Int8State {
    /// Original dtype.
    pub dtype: qforge_ir::DType,
    /// Original shape.
    pub shape: Vec<usize>,
    /// Block size in elements.
    pub blocksize: usize,
    /// Per-block absmax.
    pub absmax: Vec<f32>,
}

/// The tensors that replace weight `name`.
pub fn encode(
    name: &str,
    codes: Vec<u8>,
    absmax: &[f32],
    blocksize: usize,
    original: &HostTensor,
) -> Vec<(String, RawTensor<'static>)> {
    let shape = original
        .shape
        .iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let json = format!(
        "{{\"quant_type\": \"int8_blockwise\", \"code\": \"dynamic\", \"blocksize\": {blocksize}, \"dtype\": \"{}\", \"shape\": [{shape}]}}",
        torch_dtype_name(original.dtype)
    )
    .into_bytes();
    let f32s = |v: &[f32]| RawTensor {
        dtype: Dtype::F32,
        shape: vec![v.len()],
        data: v
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect::<Vec<u8>>()
            .into(),
    };
    vec![
        (
            name.to_string(),
            RawTensor {
                dtype: Dtype::U8,
                shape: original.shape.clone(),
                data: codes.into(),
            },
        ),
        (format!("{name}.absmax"), f32s(absmax)),
        (
            format!("{name}.quant_map"),
            f32s(&BlockwiseMap::Dynamic.code()),
        ),
        (
            format!("{name}{STATE_SUFFIX}"),
            RawTensor {
                dtype: Dtype::U8,
                shape: vec![json.len()],
                data: json.into(),
            },
        ),
    ]
}

/// Reads weight `name` back.
///
/// # Errors
/// [`Error::Tensor`] when a companion tensor is missing or the JSON is malformed.
pub fn decode(
    path: &Path,
    tensors: &BTreeMap<String, TensorRef<'_>>,
    name: &str,
) -> Result<(Vec<u8>, Int8State)> {
    let c = Companions::new(path, tensors, name);
    let state = c.state(STATE_SUFFIX)?;
    let (quant_type, code) = (state.str("quant_type")?, state.str("code")?);
    if quant_type != "int8_blockwise" || code != "dynamic" {
        return Err(c.error(format!("quant state says quant_type '{quant_type}' with code '{code}'; only int8_blockwise with the dynamic code is supported")));
    }
    let (blocksize, dtype, shape) = (state.usize("blocksize")?, state.dtype()?, state.shape()?);
    let codes = c.get("", Dtype::U8)?;
    if codes.shape != shape {
        return Err(c.error(format!(
            "codes have shape {:?} but the quant state says {shape:?}",
            codes.shape
        )));
    }
    c.expect_table(
        ".quant_map",
        &BlockwiseMap::Dynamic.code(),
        "the signed dynamic map",
    )?;
    let absmax = c.f32s(".absmax")?;
    Ok((
        codes.data.to_vec(),
        Int8State {
            dtype,
            shape,
            blocksize,
            absmax,
        },
    ))
}
