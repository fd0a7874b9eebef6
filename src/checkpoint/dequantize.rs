//! `qforge dequantize`: restore full-precision weights from a 4-bit (bitsandbytes layout) or
//! 8-bit blockwise checkpoint written by `qforge quantize` (or by transformers + bitsandbytes).

use std::path::Path;

use qforge_ir::library::BlockwiseMap;
use qforge_ir::DType;
use qforge_runtime::{ops, Device, HostTensor};

use super::io::{self, RawTensor};
use super::quantize::st_dtype;
use super::{bnb4, int8};
use crate::error::{Error, Result};

/// What [`dequantize_file`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DequantizeReport {
    /// Names of the restored weights.
    pub restored: Vec<String>,
    /// Tensors copied unchanged.
    pub copied: usize,
}

/// Dequantizes every quantized weight of `input` into `output`, in `dtype` (default: each
/// weight's original dtype). Companion tensors (absmax, maps, quant state) are dropped.
///
/// # Errors
/// Bad or inconsistent files are reported naming the file and tensor; nothing is written then.
pub fn dequantize_file(
    device: &dyn Device,
    input: &Path,
    output: &Path,
    dtype: Option<DType>,
) -> Result<DequantizeReport> {
    if io::same_file(input, output) {
        return Err(Error::Usage(format!(
            "output path {} is the input file; choose another output",
            output.display()
        )));
    }
    io::output_target(output)?;
    let bytes = io::read_bytes(input)?;
    let (st, metadata) = io::parse(&bytes, input)?;
    let tensors = io::index(&st);
    let mut weights: Vec<(String, Option<String>)> = Vec::new(); // (name, 4-bit quant type or None for int8)
    for name in tensors.keys() {
        if let Some((w, qt)) = name.split_once(bnb4::STATE_MARK) {
            weights.push((w.to_string(), Some(qt.to_string())));
        } else if let Some(w) = name.strip_suffix(int8::STATE_SUFFIX) {
            weights.push((w.to_string(), None));
        }
    }
    let companion = |n: &str| {
        weights.iter().any(|(w, _)| {
            n.strip_prefix(w.as_str()).is_some_and(|rest| {
                [
                    ".absmax",
                    ".nested_absmax",
                    ".nested_quant_map",
                    ".quant_map",
                ]
                .contains(&rest)
                    || rest.starts_with(".quant_state.")
            })
        })
    };
    let mut out: Vec<(String, RawTensor<'_>)> = Vec::new();
    let mut report = DequantizeReport {
        restored: vec![],
        copied: 0,
    };
    for (i, (name, _)) in weights.iter().enumerate() {
        if weights[..i].iter().any(|(w, _)| w == name) {
            return Err(Error::Tensor {
                path: input.to_path_buf(),
                tensor: name.clone(),
                message: "has more than one quant state".into(),
            });
        }
    }
    for (name, qt) in &weights {
        let tensor_err = |e: qforge_runtime::Error| Error::Tensor {
            path: input.to_path_buf(),
            tensor: name.clone(),
            message: e.to_string(),
        };
        let restored = match qt {
            Some(qt) => {
                let (packed, state) = bnb4::decode(input, &tensors, name, qt)?;
                ops::dequantize_4bit(device, &packed, &state).map_err(tensor_err)?
            }
            None => {
                let (codes, s) = int8::decode(input, &tensors, name)?;
                ops::dequantize_blockwise(
                    device,
                    &codes,
                    &s.absmax,
                    BlockwiseMap::Dynamic,
                    s.blocksize,
                    s.dtype,
                    &s.shape,
                )
                .map_err(tensor_err)?
            }
        };
        let restored = match dtype {
            Some(d) if d != restored.dtype => {
                HostTensor::from_f32_as(d, restored.shape.clone(), &restored.to_f32()?)?
            }
            _ => restored,
        };
        out.push((
            name.clone(),
            RawTensor {
                dtype: st_dtype(restored.dtype),
                shape: restored.shape,
                data: restored.data.into(),
            },
        ));
        report.restored.push(name.clone());
    }
    for (name, t) in &tensors {
        if !companion(name) && !weights.iter().any(|(w, _)| w == name) {
            out.push((
                name.clone(),
                RawTensor {
                    dtype: t.dtype,
                    shape: t.shape.clone(),
                    data: t.data.into(),
                },
            ));
            report.copied += 1;
        }
    }
    if report.restored.is_empty() {
        return Err(Error::Usage(format!(
            "{}: no quantized weights found (no '*{}<type>' or '*{}' tensors)",
            input.display(),
            bnb4::STATE_MARK,
            int8::STATE_SUFFIX
        )));
    }
    let serialized = io::serialize(&out, &metadata, output)?;
    io::write_files_atomic(&[(output.to_path_buf(), serialized)])?;
    Ok(report)
}
