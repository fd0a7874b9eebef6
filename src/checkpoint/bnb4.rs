//! The bitsandbytes 4-bit checkpoint layout (`QuantState.as_dict(packed=True)` as transformers
//! saves and loads it): `<name>` packed codes, `<name>.absmax`, `<name>.quant_map`, with double
//! quantization `<name>.nested_absmax` and `<name>.nested_quant_map`, and the JSON blob
//! `<name>.quant_state.bitsandbytes__<nf4|fp4>`. See `docs/formats.md`.

use std::collections::BTreeMap;
use std::path::Path;

use qforge_ir::library::{BlockwiseMap, QuantType};
use qforge_ir::DType;
use qforge_runtime::ops::{Absmax4, QuantState4};
use safetensors::Dtype;
use serde_json::Value;

use super::io::{RawTensor, TensorRef};
use super::pyrepr::float_repr;
use crate::error::{Error, Result};

/// Suffix that marks the JSON quant-state tensor; the quant type follows it.
pub const STATE_MARK: &str = ".quant_state.bitsandbytes__";

/// The torch dtype name bitsandbytes writes for a weight dtype.
pub fn torch_dtype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "float32",
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
        DType::U8 => "uint8",
        DType::I8 => "int8",
        DType::I32 => "int32",
        DType::U32 => "uint32",
    }
}

fn dtype_from_torch(name: &str) -> Option<DType> {
    [DType::F32, DType::F16, DType::BF16]
        .into_iter()
        .find(|d| torch_dtype_name(*d) == name)
}

/// The JSON blob, formatted as Python's `json.dumps` formats bitsandbytes' dict.
pub fn state_json(state: &QuantState4) -> String {
    let shape = state
        .shape
        .iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let mut s = format!(
        "{{\"quant_type\": \"{}\", \"blocksize\": {}, \"dtype\": \"{}\", \"shape\": [{}]",
        state.quant_type.name(),
        state.blocksize,
        torch_dtype_name(state.dtype),
        shape
    );
    if let Absmax4::Nested {
        offset,
        nested_blocksize,
        ..
    } = &state.absmax
    {
        s += &format!(
            ", \"nested_blocksize\": {nested_blocksize}, \"nested_dtype\": \"float32\", \"nested_offset\": {}",
            float_repr(*offset as f64)
        );
    }
    s.push('}');
    s
}

fn f32_tensor(values: &[f32]) -> RawTensor<'static> {
    RawTensor {
        dtype: Dtype::F32,
        shape: vec![values.len()],
        data: values
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<u8>>()
            .into(),
    }
}

/// The tensors that replace weight `name` in a bitsandbytes 4-bit checkpoint.
pub fn encode(
    name: &str,
    packed: Vec<u8>,
    state: &QuantState4,
) -> Vec<(String, RawTensor<'static>)> {
    let mut out = Vec::with_capacity(6);
    let n_packed = packed.len();
    out.push((
        name.to_string(),
        RawTensor {
            dtype: Dtype::U8,
            shape: vec![n_packed, 1],
            data: packed.into(),
        },
    ));
    match &state.absmax {
        Absmax4::Plain(absmax) => out.push((format!("{name}.absmax"), f32_tensor(absmax))),
        Absmax4::Nested {
            qabsmax,
            nested_absmax,
            nested_code,
            ..
        } => {
            out.push((
                format!("{name}.absmax"),
                RawTensor {
                    dtype: Dtype::U8,
                    shape: vec![qabsmax.len()],
                    data: qabsmax.clone().into(),
                },
            ));
            out.push((format!("{name}.nested_absmax"), f32_tensor(nested_absmax)));
            out.push((format!("{name}.nested_quant_map"), f32_tensor(nested_code)));
        }
    }
    out.push((
        format!("{name}.quant_map"),
        f32_tensor(&state.quant_type.code()),
    ));
    let json = state_json(state).into_bytes();
    out.push((
        format!("{name}{STATE_MARK}{}", state.quant_type.name()),
        RawTensor {
            dtype: Dtype::U8,
            shape: vec![json.len()],
            data: json.into(),
        },
    ));
    out
}

/// Reads the 4-bit weight `name` back from the tensors of a checkpoint. `tensors` maps names to
/// borrowed tensors; `quant_type` is the suffix after [`STATE_MARK`].
///
/// # Errors
/// [`Error::Tensor`] naming the weight when a companion tensor is missing, has the wrong dtype or
/// size, or the JSON is malformed or inconsistent.
pub fn decode(
    path: &Path,
    tensors: &BTreeMap<String, TensorRef<'_>>,
    name: &str,
    quant_type: &str,
) -> Result<(Vec<u8>, QuantState4)> {
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
    let f32s = |suffix: &str| -> Result<Vec<f32>> {
        let t = get(suffix)?;
        if t.dtype != Dtype::F32 {
            return Err(bad(format!(
                "'{name}{suffix}' must be F32, found {:?}",
                t.dtype
            )));
        }
        Ok(t.data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    };
    let json = get(&format!("{STATE_MARK}{quant_type}"))?.data;
    let json: Value = serde_json::from_slice(json)
        .map_err(|e| bad(format!("quant state JSON is malformed: {e}")))?;
    let field = |k: &str| {
        json.get(k)
            .ok_or_else(|| bad(format!("quant state JSON lacks '{k}'")))
    };
    let qt_name = field("quant_type")?
        .as_str()
        .ok_or_else(|| bad("quant_type is not a string".into()))?;
    let qt = QuantType::from_name(qt_name)
        .ok_or_else(|| bad(format!("unsupported quant_type '{qt_name}' (nf4, fp4)")))?;
    if qt.name() != quant_type {
        return Err(bad(format!(
            "quant state tensor says '__{quant_type}' but its JSON says quant_type '{qt_name}'"
        )));
    }
    let blocksize = field("blocksize")?
        .as_u64()
        .ok_or_else(|| bad("blocksize is not an integer".into()))? as usize;
    let dtype_name = field("dtype")?.as_str().unwrap_or("?");
    let dtype = dtype_from_torch(dtype_name).ok_or_else(|| {
        bad(format!(
            "unsupported dtype '{dtype_name}' (float32, float16, bfloat16)"
        ))
    })?;
    let shape: Vec<usize> = field("shape")?
        .as_array()
        .and_then(|a| a.iter().map(|d| d.as_u64().map(|d| d as usize)).collect())
        .ok_or_else(|| bad("shape is not a list of integers".into()))?;
    let quant_map = f32s(".quant_map")?;
    let same = |a: &[f32], b: &[f32]| a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y);
    if !same(&quant_map, &qt.code()) {
        return Err(bad(format!(
            "quant_map is not the standard {} table; custom code tables are not supported",
            qt.name()
        )));
    }
    let packed = get("")?;
    if packed.dtype != Dtype::U8 {
        return Err(bad(format!(
            "packed weight must be U8, found {:?}",
            packed.dtype
        )));
    }
    let absmax = if json.get("nested_offset").is_some() {
        let offset = field("nested_offset")?
            .as_f64()
            .ok_or_else(|| bad("nested_offset is not a number".into()))?
            as f32;
        if !offset.is_finite() {
            return Err(bad(format!("nested_offset {offset} is not a finite f32")));
        }
        let nested_blocksize = field("nested_blocksize")?
            .as_u64()
            .ok_or_else(|| bad("nested_blocksize is not an integer".into()))?
            as usize;
        if nested_blocksize != 256 {
            return Err(bad(format!(
                "nested_blocksize {nested_blocksize} is not supported (bitsandbytes uses 256)"
            )));
        }
        let q = get(".absmax")?;
        if q.dtype != Dtype::U8 {
            return Err(bad(format!(
                "double-quantized absmax must be U8, found {:?}",
                q.dtype
            )));
        }
        let nested_code = f32s(".nested_quant_map")?;
        if !same(&nested_code, &BlockwiseMap::Dynamic.code()) {
            return Err(bad(
                "nested_quant_map is not the signed dynamic map; custom maps are not supported"
                    .into(),
            ));
        }
        Absmax4::Nested {
            qabsmax: q.data.to_vec(),
            nested_absmax: f32s(".nested_absmax")?,
            nested_code,
            offset,
            nested_blocksize,
        }
    } else {
        Absmax4::Plain(f32s(".absmax")?)
    };
    Ok((
        packed.data.to_vec(),
        QuantState4 {
            quant_type: qt,
            blocksize,
            dtype,
            shape,
            absmax,
        },
    ))
}
