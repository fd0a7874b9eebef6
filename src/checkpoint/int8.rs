//! qforge's 8-bit blockwise weight layout (bitsandbytes `quantize_blockwise` with the signed
//! dynamic map): `<name>` U8 codes in the weight's shape, `<name>.absmax` F32 per block,
//! `<name>.quant_map` F32[256], and a JSON blob `<name>.quant_state.qforge__int8_blockwise`.
//! transformers has no loader for it; `qforge dequantize` reads it back.

use std::collections::BTreeMap;
use std::path::Path;

use qforge_runtime::HostTensor;
use safetensors::Dtype;
use serde_json::Value;

use super::bnb4::torch_dtype_name;
use super::io::{RawTensor, TensorRef};
use crate::error::{Error, Result};

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
            f32s(&qforge_ir::library::BlockwiseMap::Dynamic.code()),
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
    let bad = |message: String| Error::Tensor {
        path: path.to_path_buf(),
        tensor: name.to_string(),
        message,
    };
    let get = |suffix: &str| {
        let key = format!("{name}{suffix}");
        tensors
            .get(&key)
            .ok_or_else(|| bad(format!("companion tensor '{key}' is missing")))
    };
    let json: Value = serde_json::from_slice(get(STATE_SUFFIX)?.data)
        .map_err(|e| bad(format!("quant state JSON is malformed: {e}")))?;
    let blocksize = json
        .get("blocksize")
        .and_then(Value::as_u64)
        .ok_or_else(|| bad("blocksize missing".into()))? as usize;
    let dtype_name = json.get("dtype").and_then(Value::as_str).unwrap_or("?");
    let dtype = [
        qforge_ir::DType::F32,
        qforge_ir::DType::F16,
        qforge_ir::DType::BF16,
    ]
    .into_iter()
    .find(|d| torch_dtype_name(*d) == dtype_name)
    .ok_or_else(|| bad(format!("unsupported dtype '{dtype_name}'")))?;
    let text = |k: &str| json.get(k).and_then(Value::as_str).unwrap_or("?");
    if text("quant_type") != "int8_blockwise" || text("code") != "dynamic" {
        return Err(bad(format!("quant state says quant_type '{}' with code '{}'; only int8_blockwise with the dynamic code is supported", text("quant_type"), text("code"))));
    }
    let shape: Vec<usize> = json
        .get("shape")
        .and_then(Value::as_array)
        .and_then(|a| a.iter().map(|d| d.as_u64().map(|d| d as usize)).collect())
        .ok_or_else(|| bad("quant state JSON lacks a 'shape' list of integers".into()))?;
    let codes = get("")?;
    let absmax = get(".absmax")?;
    let quant_map = get(".quant_map")?;
    if codes.dtype != Dtype::U8 || absmax.dtype != Dtype::F32 || quant_map.dtype != Dtype::F32 {
        return Err(bad("codes must be U8, absmax and quant_map F32".into()));
    }
    if codes.shape != shape {
        return Err(bad(format!(
            "codes have shape {:?} but the quant state says {shape:?}",
            codes.shape
        )));
    }
    let f32s = |b: &[u8]| {
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect::<Vec<f32>>()
    };
    if f32s(quant_map.data) != qforge_ir::library::BlockwiseMap::Dynamic.code() {
        return Err(bad(
            "quant_map is not the signed dynamic map; custom maps are not supported".into(),
        ));
    }
    Ok((
        codes.data.to_vec(),
        Int8State {
            dtype,
            shape,
            blocksize,
            absmax: f32s(absmax.data),
        },
    ))
}
