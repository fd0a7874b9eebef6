//! `qforge quantize`: turn the 2-D float `.weight` tensors of a safetensors checkpoint into the
//! bitsandbytes 4-bit layout (or qforge's 8-bit blockwise layout), copying every other tensor.

use std::path::{Path, PathBuf};

use qforge_ir::library::{BlockwiseMap, QuantType};
use qforge_ir::DType;
use qforge_runtime::{ops, Device, HostTensor};
use regex::Regex;
use safetensors::Dtype;

use super::bnb4;
use super::io::{self, RawTensor};
use crate::error::{Error, Result};

/// The weight format `qforge quantize` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightFormat {
    /// bitsandbytes 4-bit (`nf4` or `fp4`), loadable by transformers.
    FourBit(QuantType),
    /// 8-bit blockwise with the signed dynamic map (qforge layout, see `docs/formats.md`).
    Int8Blockwise,
}

impl WeightFormat {
    /// Parses `nf4`, `fp4` or `int8-blockwise`.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "int8-blockwise" => Some(WeightFormat::Int8Blockwise),
            other => QuantType::from_name(other).map(WeightFormat::FourBit),
        }
    }
    /// Default blocksize: 64 for 4-bit, 4096 for 8-bit blockwise (as bitsandbytes).
    pub fn default_blocksize(self) -> usize {
        match self {
            WeightFormat::FourBit(_) => 64,
            WeightFormat::Int8Blockwise => 4096,
        }
    }
}

/// Options of [`quantize_file`].
#[derive(Clone, Debug)]
pub struct QuantizeOptions {
    /// Output format.
    pub format: WeightFormat,
    /// Block size in elements (4-bit: 32..4096, 8-bit: 64..4096, powers of two).
    pub blocksize: usize,
    /// Double quantization of the 4-bit absmax (`compress_statistics`).
    pub double_quant: bool,
    /// Compute dtype recorded in `config.json` (`float32`, `float16`, `bfloat16`).
    pub compute_dtype: DType,
    /// Weights whose name matches are copied unchanged.
    pub skip: Regex,
    /// Quantize weights holding NaN/inf instead of refusing.
    pub allow_nonfinite: bool,
}

/// Default `--skip` pattern: embeddings (`embeddings`, `embed_tokens`, GPT-2's `wte`/`wpe`), the
/// output head `lm_head` and normalization weights stay in full precision, as transformers'
/// bitsandbytes integration keeps them.
pub const DEFAULT_SKIP: &str = "embed|wte|wpe|lm_head|LayerNorm|norm";

/// One quantized tensor in the report.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorReport {
    /// Tensor name.
    pub name: String,
    /// Shape.
    pub shape: Vec<usize>,
    /// Stored bits per parameter (codes + absmax + nested state), excluding the JSON blob.
    pub bits_per_param: f64,
    /// Root-mean-square error of the dequantized weight (computed in f64).
    pub rmse: f64,
    /// Largest absolute error of the dequantized weight (NaN positions excluded).
    pub max_abs_err: f64,
}

/// What [`quantize_file`] did.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantizeReport {
    /// Quantized tensors, sorted by name.
    pub tensors: Vec<TensorReport>,
    /// Tensors copied unchanged.
    pub copied: usize,
    /// Input file size in bytes.
    pub bytes_before: u64,
    /// Output file size in bytes.
    pub bytes_after: u64,
    /// The `config.json` written beside the output, if any.
    pub config: Option<PathBuf>,
    /// Remarks for the user (e.g. why no config.json was written).
    pub notes: Vec<String>,
}

/// The float dtype of a safetensors dtype, if it is one qforge quantizes.
pub fn float_dtype(dtype: Dtype) -> Option<DType> {
    match dtype {
        Dtype::F32 => Some(DType::F32),
        Dtype::F16 => Some(DType::F16),
        Dtype::BF16 => Some(DType::BF16),
        _ => None,
    }
}

/// Safetensors dtype of a float dtype.
pub fn st_dtype(dtype: DType) -> Dtype {
    match dtype {
        DType::F32 => Dtype::F32,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::U8 => Dtype::U8,
        DType::I8 => Dtype::I8,
        DType::I32 => Dtype::I32,
        DType::U32 => Dtype::U32,
    }
}

/// Quantizes `input` into `output` on `device`. `progress(done, total)` is called per tensor.
///
/// # Errors
/// Every bad input is reported before anything is written: missing or unreadable file, corrupt
/// safetensors, output path equal to input, a selected weight that is not float, NaN/inf in a
/// weight (unless allowed), unsupported blocksize or quant type. The output (and `config.json`)
/// is written to a temporary file and renamed, so a failure leaves no partial output.
pub fn quantize_file(
    device: &dyn Device,
    input: &Path,
    output: &Path,
    opts: &QuantizeOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<QuantizeReport> {
    if io::same_file(input, output) {
        return Err(Error::Usage(format!(
            "output path {} is the input file; choose another output",
            output.display()
        )));
    }
    check_blocksize(opts)?;
    io::output_target(output)?;
    let bytes = io::read_bytes(input)?;
    let (st, metadata) = io::parse(&bytes, input)?;
    let tensors = io::index(&st);
    if let Some(name) = tensors.keys().find(|n| n.contains(".quant_state.")) {
        return Err(Error::Tensor {
            path: input.to_path_buf(),
            tensor: name.clone(),
            message: "the file is already quantized (it has a quant state); dequantize it first"
                .into(),
        });
    }
    let mut out: Vec<(String, RawTensor<'_>)> = Vec::new();
    let mut report = QuantizeReport {
        tensors: vec![],
        copied: 0,
        bytes_before: bytes.len() as u64,
        bytes_after: 0,
        config: None,
        notes: vec![],
    };
    let total = tensors.len();
    for (i, (name, view)) in tensors.iter().enumerate() {
        progress(i, total);
        let selected =
            name.ends_with(".weight") && view.shape.len() == 2 && !opts.skip.is_match(name);
        let raw = RawTensor {
            dtype: view.dtype,
            shape: view.shape.clone(),
            data: view.data.into(),
        };
        if !selected {
            out.push((name.clone(), raw));
            report.copied += 1;
            continue;
        }
        let Some(dtype) = float_dtype(raw.dtype) else {
            return Err(Error::Tensor {
                path: input.to_path_buf(),
                tensor: name.clone(),
                message: format!("dtype {:?} cannot be quantized (only F32, F16, BF16 weights); exclude it with --skip", raw.dtype),
            });
        };
        let tensor = HostTensor::new(dtype, raw.shape.clone(), raw.data.into_owned())?;
        let values = tensor.to_f32()?;
        if !opts.allow_nonfinite {
            if let Some((index, &value)) = values.iter().enumerate().find(|(_, v)| !v.is_finite()) {
                return Err(Error::NonFinite {
                    path: input.to_path_buf(),
                    tensor: name.clone(),
                    index,
                    value,
                });
            }
        }
        let tensor_err = |e: Error| Error::Tensor {
            path: input.to_path_buf(),
            tensor: name.clone(),
            message: e.to_string(),
        };
        let (tensors, restored) = quantize_one(device, name, &tensor, opts).map_err(tensor_err)?;
        let stored_bytes: usize = tensors
            .iter()
            .filter(|(n, _)| !n.contains(".quant_state.") && !n.ends_with("quant_map"))
            .map(|(_, t)| t.data.len())
            .sum();
        let (rmse, max_abs_err) = error_stats(&values, &restored.to_f32()?);
        report.tensors.push(TensorReport {
            name: name.clone(),
            shape: tensor.shape.clone(),
            bits_per_param: stored_bytes as f64 * 8.0 / tensor.numel().max(1) as f64,
            rmse,
            max_abs_err,
        });
        out.extend(tensors);
    }
    progress(total, total);
    let mut seen = std::collections::HashSet::new();
    if let Some((name, _)) = out.iter().find(|(n, _)| !seen.insert(n.as_str())) {
        return Err(Error::Tensor {
            path: input.to_path_buf(),
            tensor: name.clone(),
            message: "an output tensor of this name would be written twice (a quantized weight's companion tensor collides with an existing tensor)".into(),
        });
    }
    if report.tensors.is_empty() {
        report.notes.push(format!(
            "no tensor was quantized: none is a 2-D float '*.weight' outside --skip '{}'",
            opts.skip.as_str()
        ));
    }
    let mut metadata = metadata.unwrap_or_default();
    metadata
        .entry("format".into())
        .or_insert_with(|| "pt".into());
    let serialized = io::serialize(&out, &Some(metadata), output)?;
    report.bytes_after = serialized.len() as u64;
    let mut files = vec![(output.to_path_buf(), serialized)];
    if let Some((path, text)) = plan_config(input, output, opts, &mut report.notes)? {
        files.push((path.clone(), text.into_bytes()));
        report.config = Some(path);
    }
    io::write_files_atomic(&files)?;
    Ok(report)
}

fn check_blocksize(opts: &QuantizeOptions) -> Result<()> {
    let allowed: &[usize] = match opts.format {
        WeightFormat::FourBit(_) => &[32, 64, 128, 256, 512, 1024, 2048, 4096],
        WeightFormat::Int8Blockwise => &[64, 128, 256, 512, 1024, 2048, 4096],
    };
    if !allowed.contains(&opts.blocksize) {
        let qt = match opts.format {
            WeightFormat::FourBit(qt) => qt.name(),
            WeightFormat::Int8Blockwise => "int8-blockwise",
        };
        return Err(Error::Usage(format!(
            "unsupported blocksize {} for quant type {qt} (allowed: {allowed:?})",
            opts.blocksize
        )));
    }
    if opts.double_quant && opts.format == WeightFormat::Int8Blockwise {
        return Err(Error::Usage(
            "--double-quant applies to 4-bit quant types (nf4, fp4) only".into(),
        ));
    }
    Ok(())
}

/// Quantizes one weight; returns the tensors to write and the dequantized weight.
fn quantize_one(
    device: &dyn Device,
    name: &str,
    tensor: &HostTensor,
    opts: &QuantizeOptions,
) -> Result<(Vec<(String, RawTensor<'static>)>, HostTensor)> {
    match opts.format {
        WeightFormat::FourBit(qt) => {
            let (packed, state) =
                ops::quantize_4bit(device, tensor, qt, opts.blocksize, opts.double_quant)?;
            if let ops::Absmax4::Nested { offset, .. } = &state.absmax {
                if !offset.is_finite() {
                    return Err(Error::Usage(format!(
                        "double quantization needs a finite absmax mean, got {offset} (the weight holds NaN/inf or values so large that the mean overflows); quantize without --double-quant"
                    )));
                }
            }
            let restored = ops::dequantize_4bit(device, &packed, &state)?;
            Ok((bnb4::encode(name, packed, &state), restored))
        }
        WeightFormat::Int8Blockwise => {
            let map = BlockwiseMap::Dynamic;
            let (codes, absmax) = ops::quantize_blockwise(device, tensor, map, opts.blocksize)?;
            let restored = ops::dequantize_blockwise(
                device,
                &codes,
                &absmax,
                map,
                opts.blocksize,
                tensor.dtype,
                &tensor.shape,
            )?;
            Ok((
                super::int8::encode(name, codes, &absmax, opts.blocksize, tensor),
                restored,
            ))
        }
    }
}

/// RMSE and max absolute error, in f64, over the elements whose original value is finite (NaN and
/// inf weights, allowed with `--allow-nonfinite`, have no error to measure). A finite weight that
/// comes back NaN or inf makes both figures NaN or inf, so the report shows it.
pub fn error_stats(original: &[f32], restored: &[f32]) -> (f64, f64) {
    let (mut sq, mut max, mut n) = (0.0f64, 0.0f64, 0usize);
    for (&a, &b) in original.iter().zip(restored) {
        if a.is_finite() {
            let d = (a as f64 - b as f64).abs();
            sq += d * d;
            max = if d.is_nan() || d > max { d } else { max };
            n += 1;
        }
    }
    ((sq / n.max(1) as f64).sqrt(), max)
}

/// Decides whether and where to write `config.json` (4-bit only, when one sits beside the input).
fn plan_config(
    input: &Path,
    output: &Path,
    opts: &QuantizeOptions,
    notes: &mut Vec<String>,
) -> Result<Option<(PathBuf, String)>> {
    let dir_of = |p: &Path| {
        p.parent()
            .filter(|d| !d.as_os_str().is_empty())
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."))
    };
    let src = dir_of(input).join("config.json");
    if !src.is_file() {
        return Ok(None);
    }
    let WeightFormat::FourBit(qt) = opts.format else {
        notes.push(
            "config.json not written: transformers has no loader for the 8-bit blockwise layout"
                .into(),
        );
        return Ok(None);
    };
    let dst = dir_of(output).join("config.json");
    if io::same_file(&src, &dst) {
        notes.push(format!("config.json not written: it would replace the input's {}; write the output into another folder", src.display()));
        return Ok(None);
    }
    if output.file_name() == Some(std::ffi::OsStr::new("config.json")) {
        notes.push("config.json not written: the output itself is called config.json".into());
        return Ok(None);
    }
    if std::fs::symlink_metadata(&dst).is_ok() {
        notes.push(format!(
            "config.json not written: {} already exists and is left as it is",
            dst.display()
        ));
        return Ok(None);
    }
    let text = io::read_bytes(&src)?;
    let config: serde_json::Value = serde_json::from_slice(&text)
        .map_err(|e| Error::Usage(format!("{}: not valid JSON: {e}", src.display())))?;
    let serde_json::Value::Object(map) = config else {
        return Err(Error::Usage(format!(
            "{}: not a JSON object",
            src.display()
        )));
    };
    let compute = bnb4::torch_dtype_name(opts.compute_dtype);
    let map = super::config::with_bnb4_config(map, qt.name(), opts.double_quant, compute);
    let text = serde_json::to_string_pretty(&serde_json::Value::Object(map))
        .expect("JSON values always serialize");
    Ok(Some((dst, text + "\n")))
}
