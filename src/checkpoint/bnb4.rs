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

use super::companions::Companions;
use super::io::{RawTensor, TensorRef};
use super::pyrepr::float_repr;
use crate::error::Result;

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
    let c = Companions::new(path, tensors, name);
    let state = c.state(&format!("{STATE_MARK}{quant_type}"))?;
    let qt_name = state.str("quant_type")?;
    let qt = QuantType::from_name(qt_name)
        .ok_or_else(|| c.error(format!("unsupported quant_type '{qt_name}' (nf4, fp4)")))?;
    if qt.name() != quant_type {
        return Err(c.error(format!(
            "quant state tensor says '__{quant_type}' but its JSON says quant_type '{qt_name}'"
        )));
    }
    let (blocksize, dtype, shape) = (state.usize("blocksize")?, state.dtype()?, state.shape()?);
    c.expect_table(
        ".quant_map",
        &qt.code(),
        &format!("the standard {} table", qt.name()),
    )?;
    let packed = c.get("", Dtype::U8)?;
    let absmax = if state.has("nested_offset") {
        let offset = state.f64("nested_offset")? as f32;
        if !offset.is_finite() {
            return Err(c.error(format!("nested_offset {offset} is not a finite f32")));
        }
        let nested_blocksize = state.usize("nested_blocksize")?;
        if nested_blocksize != 256 {
            return Err(c.error(format!(
                "nested_blocksize {nested_blocksize} is not supported (bitsandbytes uses 256)"
            )));
        }
        Absmax4::Nested {
            qabsmax: c.get(".absmax", Dtype::U8)?.data.to_vec(),
            nested_absmax: c.f32s(".nested_absmax")?,
            nested_code: c.expect_table(
                ".nested_quant_map",
                &BlockwiseMap::Dynamic.code(),
                "the signed dynamic map",
            )?,
            offset,
            nested_blocksize,
        }
    } else {
        Absmax4::Plain(c.f32s(".absmax")?)
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
