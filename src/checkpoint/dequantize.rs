//! `qforge dequantize`: restore full-precision weights from a quantized checkpoint (one file or a
//! model folder, sharded or not): bitsandbytes 4-bit with any `quant_storage`, LLM.int8
//! (`weight` i8 + `SCB`) and qforge's 8-bit blockwise layout; written by `qforge quantize` or by
//! transformers + bitsandbytes. Weights are restored chunk by chunk and streamed out; GPT-2
//! `Conv1D` weights get their `[in, out]` layout back; `config.json` loses its
//! `quantization_config`.

use std::path::Path;

use qforge_ir::DType;
use qforge_kernels::ops::{self, Absmax4, QuantState4};
use qforge_kernels::BlockwiseMap;
use qforge_runtime::{Device, HostTensor};

use super::arch::{Arch, Role};
use super::bnb4::{self, STATE_MARK};
use super::chunks::{chunk_len, le_f32};
use super::companions::Companions;
use super::config;
use super::emit::{self, Item};
use super::int8;
use super::model_in::ModelIn;
use super::quantize::{copy_tensor, target_for};
use super::qweight::module_of;
use super::st_read::{StDtype, StFile, TensorInfo};
use super::st_write::{OutTensor, StWriter};
use crate::error::{Error, Result};

/// What [`dequantize_model`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DequantizeReport {
    /// Names of the restored weights.
    pub restored: Vec<String>,
    /// Tensors copied unchanged.
    pub copied: usize,
    /// Output size in bytes.
    pub bytes_after: u64,
    /// The `config.json` written, if any.
    pub config: Option<std::path::PathBuf>,
}

/// Options of [`dequantize_model`].
#[derive(Clone, Debug, Default)]
pub struct DequantizeOptions {
    /// Output dtype (default: each weight's original dtype; LLM.int8 weights, which do not record
    /// it, get the config's `dtype`/`torch_dtype`, else f32).
    pub dtype: Option<DType>,
    /// Replace an existing output folder or a `config.json` that would not describe the output.
    pub overwrite: bool,
    /// Largest output shard in bytes (model folders; default 5 GB).
    pub max_shard_size: Option<u64>,
    /// Elements per launch (0: the default).
    pub chunk_elements: usize,
}

/// A quantized weight found in the checkpoint.
enum Kind {
    FourBit(bnb4::State4),
    Blockwise(int8::Int8State),
    LlmInt8 { scb: Vec<f32>, dtype: DType },
}

fn config_dtype(model: &ModelIn) -> Option<DType> {
    let c = model.config.as_ref()?;
    let name = c.get("dtype").or_else(|| c.get("torch_dtype"))?.as_str()?;
    match name {
        "float32" => Some(DType::F32),
        "float16" => Some(DType::F16),
        "bfloat16" => Some(DType::BF16),
        _ => None,
    }
}

/// Dequantizes every quantized weight of `input` into `output` (a file for a file input, a
/// folder otherwise). Companion tensors (absmax, maps, quant state, `SCB`) are dropped.
///
/// # Errors
/// Bad or inconsistent files are reported naming the file and tensor; nothing is renamed into
/// place then.
pub fn dequantize_model(
    device: &dyn Device,
    input: &Path,
    output: &Path,
    opts: &DequantizeOptions,
) -> Result<DequantizeReport> {
    super::out::refuse_stdout(output)?;
    let model = ModelIn::open(input)?;
    if (!model.is_folder && super::io::same_file(input, output))
        || (model.is_folder && super::io::same_file(&model.dir, output))
    {
        return Err(Error::Usage(format!(
            "output path {} is the input; choose another output",
            output.display()
        )));
    }
    let arch = Arch::new(model.model_type());
    // Find the quantized weights and their companions.
    let mut found: Vec<(String, Kind)> = Vec::new();
    let mut companions: Vec<String> = Vec::new();
    for name in model.names() {
        if let Some((w, qt)) = name.split_once(STATE_MARK) {
            if found.iter().any(|(f, _)| f == w) {
                return Err(Error::Tensor {
                    path: model.path_of(w),
                    tensor: w.to_string(),
                    message: "has more than one quant state".into(),
                });
            }
            let c = Companions::new(&model, w);
            found.push((w.to_string(), Kind::FourBit(bnb4::decode(&c, qt)?)));
            for s in [
                ".absmax",
                ".nested_absmax",
                ".nested_quant_map",
                ".quant_map",
            ] {
                companions.push(format!("{w}{s}"));
            }
            companions.push(name.clone());
        } else if let Some(w) = name.strip_suffix(int8::STATE_SUFFIX) {
            if found.iter().any(|(f, _)| f == w) {
                return Err(Error::Tensor {
                    path: model.path_of(w),
                    tensor: w.to_string(),
                    message: "has more than one quant state".into(),
                });
            }
            let c = Companions::new(&model, w);
            found.push((w.to_string(), Kind::Blockwise(int8::decode(&c)?)));
            companions.extend([
                format!("{w}.absmax"),
                format!("{w}.quant_map"),
                name.clone(),
            ]);
        } else if let Some(module) = name.strip_suffix(".SCB") {
            let w = format!("{module}.weight");
            let c = Companions::new(&model, &w);
            let (_, winfo) = c.get_typed("", "I8")?;
            if winfo.shape.len() != 2 {
                return Err(c.error(format!(
                    "an LLM.int8 weight must be 2-D, found shape {:?}",
                    winfo.shape
                )));
            }
            let scb = le_f32(&Companions::new(&model, module).bytes(".SCB", "F32")?);
            if scb.len() != winfo.shape[0] {
                return Err(c.error(format!(
                    "SCB has {} values for {} rows",
                    scb.len(),
                    winfo.shape[0]
                )));
            }
            if let Some((f, t)) = model.get(&format!("{module}.weight_format")) {
                let v = f.bytes(t);
                if t.dtype.name() != "U8" || v.iter().any(|&b| b != 0) {
                    return Err(c.error(
                        "weight_format is not 0 (row-major); only row-major LLM.int8 weights \
                         are supported",
                    ));
                }
            }
            let dtype = opts
                .dtype
                .or_else(|| config_dtype(&model))
                .unwrap_or(DType::F32);
            found.push((w, Kind::LlmInt8 { scb, dtype }));
            companions.extend([name.clone(), format!("{module}.weight_format")]);
        }
    }
    if found.is_empty() {
        return Err(Error::Usage(format!(
            "{}: no quantized weights found (no '*{STATE_MARK}<type>', '*{}' or '*.SCB' tensors)",
            model.display(),
            int8::STATE_SUFFIX
        )));
    }
    let mut items = Vec::new();
    let mut plans: Vec<Option<(usize, DType, bool)>> = Vec::new(); // (found index, dtype, transpose)
    for name in model.names() {
        if companions.contains(name) {
            continue;
        }
        let (_, info) = model.get(name).expect("listed");
        if let Some(k) = found.iter().position(|(w, _)| w == name) {
            let (shape, orig) = match &found[k].1 {
                Kind::FourBit(s) => (s.shape.clone(), s.dtype),
                Kind::Blockwise(s) => (s.shape.clone(), s.dtype),
                Kind::LlmInt8 { dtype, .. } => (info.shape.clone(), *dtype),
            };
            let dtype = opts.dtype.unwrap_or(orig);
            let transpose = shape.len() == 2 && arch.role(module_of(name)) == Ok(Role::Conv1D);
            let out_shape = if transpose {
                vec![shape[1], shape[0]]
            } else {
                shape.clone()
            };
            let n: usize = shape.iter().product();
            items.push(Item {
                name: name.clone(),
                outputs: vec![OutTensor {
                    name: name.clone(),
                    dtype: StDtype::of(dtype),
                    shape: out_shape,
                    len: (n * dtype.size_bytes()) as u64,
                }],
                trailing: vec![],
            });
            plans.push(Some((k, dtype, transpose)));
        } else {
            items.push(Item {
                name: name.clone(),
                outputs: vec![OutTensor {
                    name: name.clone(),
                    dtype: info.dtype.clone(),
                    shape: info.shape.clone(),
                    len: info.len() as u64,
                }],
                trailing: vec![],
            });
            plans.push(None);
        }
    }
    let mut notes = Vec::new();
    let new_config = model.config.clone().map(config::without_quantization);
    let target = target_for(&model, output, opts.overwrite, new_config, &mut notes)?;
    let mut metadata = model.metadata();
    metadata
        .entry("format".into())
        .or_insert_with(|| "pt".into());
    let (mut restored, mut copied) = (Vec::new(), 0);
    let mut run = |i: usize, w: &mut StWriter| -> Result<Vec<(String, Vec<u8>)>> {
        let name = &items[i].name;
        let (file, info) = model.get(name).expect("planned");
        match plans[i] {
            None => {
                copy_tensor(file, info, name, w)?;
                copied += 1;
            }
            Some((k, dtype, transpose)) => {
                restore(
                    device,
                    file,
                    info,
                    name,
                    &found[k].1,
                    dtype,
                    transpose,
                    opts,
                    w,
                )
                .map_err(|e| match e {
                    Error::Runtime(_) | Error::Ir(_) => Error::Tensor {
                        path: file.path.clone(),
                        tensor: name.clone(),
                        message: e.to_string(),
                    },
                    other => other,
                })?;
                restored.push(name.clone());
            }
        }
        Ok(vec![])
    };
    let written = emit::write(
        &items,
        target,
        &metadata,
        opts.max_shard_size.unwrap_or(5_000_000_000),
        &mut run,
    )?;
    Ok(DequantizeReport {
        restored,
        copied,
        bytes_after: written.bytes,
        config: written.config,
    })
}

/// Converts a restored chunk to `dtype` when it differs.
fn to_dtype(t: HostTensor, dtype: DType) -> Result<HostTensor> {
    if t.dtype == dtype {
        return Ok(t);
    }
    Ok(HostTensor::from_f32_as(
        dtype,
        t.shape.clone(),
        &t.to_f32()?,
    )?)
}

#[allow(clippy::too_many_arguments)]
fn restore(
    dev: &dyn Device,
    file: &StFile,
    info: &TensorInfo,
    name: &str,
    kind: &Kind,
    dtype: DType,
    transpose: bool,
    opts: &DequantizeOptions,
    w: &mut StWriter,
) -> Result<()> {
    let (n, shape) = match kind {
        Kind::FourBit(s) => (s.shape.iter().product::<usize>(), s.shape.clone()),
        Kind::Blockwise(s) => (s.shape.iter().product(), s.shape.clone()),
        Kind::LlmInt8 { .. } => (info.numel(), info.shape.clone()),
    };
    // A transposed (Conv1D) weight is restored whole, then written as [in, out].
    let mut whole: Vec<u8> = Vec::new();
    let mut emit = |bytes: &[u8], w: &mut StWriter| -> Result<()> {
        if transpose {
            whole.extend_from_slice(bytes);
            Ok(())
        } else {
            w.append(name, bytes)
        }
    };
    match kind {
        Kind::FourBit(s) => {
            let bs = s.blocksize;
            let unit = match s.absmax {
                Absmax4::Nested { .. } => bs * 256,
                Absmax4::Plain(_) => bs,
            };
            let chunk = chunk_len(opts.chunk_elements, unit);
            let mut start = 0;
            while start < n {
                let len = chunk.min(n - start);
                let packed = file.slice(info, start / 2, len.div_ceil(2)).to_vec();
                let (b0, b1) = (start / bs, (start + len).div_ceil(bs));
                let absmax = match &s.absmax {
                    Absmax4::Plain(a) => Absmax4::Plain(a[b0..b1].to_vec()),
                    Absmax4::Nested {
                        qabsmax,
                        nested_absmax,
                        nested_code,
                        offset,
                        nested_blocksize,
                    } => Absmax4::Nested {
                        qabsmax: qabsmax[b0..b1].to_vec(),
                        nested_absmax: nested_absmax[b0 / 256..b1.div_ceil(256)].to_vec(),
                        nested_code: nested_code.clone(),
                        offset: *offset,
                        nested_blocksize: *nested_blocksize,
                    },
                };
                let state = QuantState4 {
                    quant_type: s.quant_type,
                    blocksize: bs,
                    dtype: s.dtype,
                    shape: vec![len],
                    absmax,
                };
                let t = to_dtype(ops::dequantize_4bit(dev, &packed, &state)?, dtype)?;
                emit(&t.data, w)?;
                file.release_part(info, start / 2, len.div_ceil(2));
                start += len;
            }
        }
        Kind::Blockwise(s) => {
            let bs = s.blocksize;
            let chunk = chunk_len(opts.chunk_elements, bs);
            let mut start = 0;
            while start < n {
                let len = chunk.min(n - start);
                let codes = file.slice(info, start, len);
                let a = &s.absmax[start / bs..(start + len).div_ceil(bs)];
                let t = ops::dequantize_blockwise(
                    dev,
                    codes,
                    a,
                    BlockwiseMap::Dynamic,
                    bs,
                    s.dtype,
                    &[len],
                )?;
                emit(&to_dtype(t, dtype)?.data, w)?;
                file.release_part(info, start, len);
                start += len;
            }
        }
        Kind::LlmInt8 { scb, .. } => {
            let (rows, cols) = (shape[0], shape[1]);
            if let Some(per) = chunk_len(opts.chunk_elements, 1).checked_div(cols) {
                let rows_per = per.max(1);
                let mut r = 0;
                while r < rows {
                    let nr = rows_per.min(rows - r);
                    let codes = HostTensor::new(
                        DType::I8,
                        vec![nr, cols],
                        file.slice(info, r * cols, nr * cols).to_vec(),
                    )?;
                    let t = ops::dequantize_rowwise_int8(dev, &codes, &scb[r..r + nr], dtype)?;
                    emit(&t.data, w)?;
                    file.release_part(info, r * cols, nr * cols);
                    r += nr;
                }
            }
        }
    }
    if transpose {
        let (o, i) = (shape[0], shape[1]);
        let es = dtype.size_bytes();
        let mut out = vec![0u8; whole.len()];
        for r in 0..o {
            for c in 0..i {
                let src = (r * i + c) * es;
                let dst = (c * o + r) * es;
                out[dst..dst + es].copy_from_slice(&whole[src..src + es]);
            }
        }
        w.append(name, &out)?;
    }
    Ok(())
}
