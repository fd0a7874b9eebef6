//! The bitsandbytes 4-bit checkpoint layout (`QuantState.as_dict(packed=True)` as transformers
//! saves and loads it): `<name>` packed codes (in the `bnb_4bit_quant_storage` dtype),
//! `<name>.absmax`, `<name>.quant_map`, with double quantization `<name>.nested_absmax` and
//! `<name>.nested_quant_map`, and the JSON blob `<name>.quant_state.bitsandbytes__<nf4|fp4>`.
//! See `docs/formats.md`.

use qforge_ir::DType;
use qforge_kernels::ops::Absmax4;
use qforge_kernels::{BlockwiseMap, QuantType};

use super::companions::Companions;
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

/// The JSON blob, formatted as Python's `json.dumps` formats bitsandbytes' dict; `offset` is the
/// double-quantization offset (`None`: no double quantization).
pub fn json_for(
    qt: QuantType,
    blocksize: usize,
    dtype: DType,
    shape: &[usize],
    offset: Option<f32>,
) -> String {
    let shape = shape
        .iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let mut s = format!(
        "{{\"quant_type\": \"{}\", \"blocksize\": {blocksize}, \"dtype\": \"{}\", \"shape\": [{shape}]",
        qt.name(),
        torch_dtype_name(dtype),
    );
    if let Some(offset) = offset {
        s += &format!(
            ", \"nested_blocksize\": 256, \"nested_dtype\": \"float32\", \"nested_offset\": {}",
            float_repr(offset as f64)
        );
    }
    s.push('}');
    s
}

/// A 4-bit weight's quant state as read from a checkpoint (the packed codes stay in the file).
pub struct State4 {
    /// NF4 or FP4.
    pub quant_type: QuantType,
    /// Elements per block.
    pub blocksize: usize,
    /// Original dtype.
    pub dtype: DType,
    /// Original shape.
    pub shape: Vec<usize>,
    /// The absmax (plain or double-quantized).
    pub absmax: Absmax4,
}

/// Reads the quant state of 4-bit weight `name` (`quant_type`: the suffix after [`STATE_MARK`])
/// and checks its companions against it.
///
/// # Errors
/// [`Error::Tensor`] naming the weight when a companion tensor is missing, has the wrong dtype or
/// size, or the JSON is malformed or inconsistent.
pub fn decode(c: &Companions<'_>, quant_type: &str) -> Result<State4> {
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
    if !(32..=4096).contains(&blocksize) || !blocksize.is_power_of_two() {
        return Err(c.error(format!(
            "unsupported blocksize {blocksize} (32..4096, powers of two)"
        )));
    }
    c.expect_table(
        ".quant_map",
        &qt.code(),
        &format!("the standard {} table", qt.name()),
    )?;
    let n: usize = shape.iter().product();
    let packed = c.get("")?;
    if packed.1.len() != n.div_ceil(2) {
        return Err(c.error(format!(
            "the packed codes hold {} bytes but shape {shape:?} needs {}",
            packed.1.len(),
            n.div_ceil(2)
        )));
    }
    let nb = n.div_ceil(blocksize);
    let absmax = if state.has("nested_offset") {
        let offset = if state.is_null("nested_offset") {
            f32::NAN
        } else {
            state.f64("nested_offset")? as f32
        };
        if !offset.is_finite() && n > 0 {
            return Err(c.error(format!("nested_offset {offset} is not a finite f32")));
        }
        let nested_blocksize = state.usize("nested_blocksize")?;
        if nested_blocksize != 256 {
            return Err(c.error(format!(
                "nested_blocksize {nested_blocksize} is not supported (bitsandbytes uses 256)"
            )));
        }
        let qabsmax = c.bytes(".absmax", "U8")?;
        let nested_absmax = c.f32s(".nested_absmax")?;
        if qabsmax.len() != nb || nested_absmax.len() != nb.div_ceil(256) {
            return Err(c.error(format!(
                "qabsmax has {} codes and nested_absmax {} values; {nb} blocks need {nb} and {}",
                qabsmax.len(),
                nested_absmax.len(),
                nb.div_ceil(256)
            )));
        }
        Absmax4::Nested {
            qabsmax,
            nested_absmax,
            nested_code: c.expect_table(
                ".nested_quant_map",
                &BlockwiseMap::Dynamic.code(),
                "the signed dynamic map",
            )?,
            offset,
            nested_blocksize,
        }
    } else {
        let absmax = c.f32s(".absmax")?;
        if absmax.len() != nb {
            return Err(c.error(format!(
                "absmax has {} values; {nb} blocks need {nb}",
                absmax.len()
            )));
        }
        Absmax4::Plain(absmax)
    };
    Ok(State4 {
        quant_type: qt,
        blocksize,
        dtype,
        shape,
        absmax,
    })
}
