//! One weight quantized into its checkpoint tensors: the layout planned in advance (names,
//! dtypes, shapes, byte lengths) and the bytes computed chunk by chunk and streamed into the
//! output file. Formats: bitsandbytes 4-bit (`Params4bit`, any `quant_storage`), LLM.int8
//! (`Int8Params`: `weight` i8 + `SCB` + `weight_format`) and qforge's 8-bit blockwise layout.

use qforge_ir::DType;
use qforge_kernels::ops::{self, Absmax4, QuantState4};
use qforge_kernels::{BlockwiseMap, QuantType};
use qforge_runtime::{Device, HostTensor};

use super::bnb4::{self, torch_dtype_name, STATE_MARK};
use super::chunks::{check_finite, chunk_len, f32_bytes, le_f32, ErrStats, Reader};
use super::int8;
use super::st_read::StDtype;
use super::st_write::{OutTensor, StWriter, Trailing};
use crate::error::{Error, Result};

/// The weight format `qforge quantize` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightFormat {
    /// bitsandbytes 4-bit (`nf4` or `fp4`), loadable by transformers (`load_in_4bit`).
    FourBit(QuantType),
    /// LLM.int8 (`int8`): bitsandbytes' `Int8Params` row-wise int8 weight and `SCB`, loadable by
    /// transformers (`load_in_8bit`).
    Int8,
    /// 8-bit blockwise with the signed dynamic map (qforge's own layout, see `docs/formats.md`):
    /// transformers cannot load it.
    Int8Blockwise,
}

impl WeightFormat {
    /// Parses `nf4`, `fp4`, `int8` or `int8-blockwise`.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "int8" => Some(WeightFormat::Int8),
            "int8-blockwise" => Some(WeightFormat::Int8Blockwise),
            other => QuantType::from_name(other).map(WeightFormat::FourBit),
        }
    }
    /// The name `from_name` parses.
    pub fn name(self) -> &'static str {
        match self {
            WeightFormat::FourBit(qt) => qt.name(),
            WeightFormat::Int8 => "int8",
            WeightFormat::Int8Blockwise => "int8-blockwise",
        }
    }
    /// Default blocksize: 64 for 4-bit, 4096 for 8-bit blockwise (as bitsandbytes); LLM.int8 has
    /// one scale per row (0).
    pub fn default_blocksize(self) -> usize {
        match self {
            WeightFormat::FourBit(_) => 64,
            WeightFormat::Int8 => 0,
            WeightFormat::Int8Blockwise => 4096,
        }
    }
}

/// How one weight is quantized.
#[derive(Clone, Copy, Debug)]
pub struct WeightSpec {
    /// Format.
    pub format: WeightFormat,
    /// Elements per absmax block (4-bit and blockwise).
    pub blocksize: usize,
    /// Double quantization of a 4-bit absmax.
    pub double_quant: bool,
    /// The dtype the packed 4-bit bytes are stored as (`bnb_4bit_quant_storage`).
    pub storage: DType,
    /// Elements per chunk (0: the default).
    pub chunk: usize,
    /// Quantize weights holding NaN or inf.
    pub allow_nonfinite: bool,
}

/// The planned output tensors of one quantized weight.
pub struct Planned {
    /// Tensors of known length.
    pub outputs: Vec<OutTensor>,
    /// The trailing JSON quant state, if any.
    pub trailing: Vec<Trailing>,
}

/// The module name of weight `name` (`name` without `.weight`).
pub fn module_of(name: &str) -> &str {
    name.strip_suffix(".weight").unwrap_or(name)
}

fn out(name: String, dtype: &str, shape: Vec<usize>, len: usize) -> OutTensor {
    OutTensor {
        name,
        dtype: StDtype::new(dtype),
        shape,
        len: len as u64,
    }
}

/// The longest `repr` of an f32 offset as Python prints it (`-1.1754943508222875e-38`) plus slack.
const OFFSET_REPR_MAX: usize = 26;

/// Plans the tensors of weight `name` of shape `shape` (`[out, in]`) and dtype `dtype`.
///
/// # Errors
/// A message for the caller to attach to the tensor: packed bytes that do not fill whole
/// elements of the storage dtype (bitsandbytes cannot store them either).
pub fn plan(
    name: &str,
    shape: &[usize],
    dtype: DType,
    spec: &WeightSpec,
) -> std::result::Result<Planned, String> {
    let n: usize = shape.iter().product();
    let mut outputs = Vec::new();
    let mut trailing = Vec::new();
    match spec.format {
        WeightFormat::FourBit(qt) => {
            let bytes = n.div_ceil(2);
            let es = spec.storage.size_bytes();
            if !bytes.is_multiple_of(es) {
                return Err(format!(
                    "its {bytes} packed bytes do not fill whole {} elements \
                     (bnb_4bit_quant_storage); bitsandbytes cannot store it either: keep it with \
                     --skip or use --quant-storage uint8",
                    torch_dtype_name(spec.storage)
                ));
            }
            outputs.push(out(
                name.into(),
                StDtype::of(spec.storage).name(),
                vec![bytes / es, 1],
                bytes,
            ));
            let nb = n.div_ceil(spec.blocksize);
            if spec.double_quant {
                outputs.push(out(format!("{name}.absmax"), "U8", vec![nb], nb));
                let nn = nb.div_ceil(256);
                outputs.push(out(
                    format!("{name}.nested_absmax"),
                    "F32",
                    vec![nn],
                    4 * nn,
                ));
                outputs.push(out(
                    format!("{name}.nested_quant_map"),
                    "F32",
                    vec![256],
                    1024,
                ));
            } else {
                outputs.push(out(format!("{name}.absmax"), "F32", vec![nb], 4 * nb));
            }
            outputs.push(out(format!("{name}.quant_map"), "F32", vec![16], 64));
            let json = bnb4::json_for(qt, spec.blocksize, dtype, shape, None);
            trailing.push(Trailing {
                name: format!("{name}{STATE_MARK}{}", qt.name()),
                max_len: (json.len() + 100 + OFFSET_REPR_MAX) as u64,
            });
        }
        WeightFormat::Int8 => {
            let rows = shape[0];
            let module = module_of(name);
            outputs.push(out(name.into(), "I8", shape.to_vec(), n));
            outputs.push(out(format!("{module}.SCB"), "F32", vec![rows], 4 * rows));
            outputs.push(out(format!("{module}.weight_format"), "U8", vec![], 1));
        }
        WeightFormat::Int8Blockwise => {
            let nb = n.div_ceil(spec.blocksize);
            outputs.push(out(name.into(), "U8", shape.to_vec(), n));
            outputs.push(out(format!("{name}.absmax"), "F32", vec![nb], 4 * nb));
            outputs.push(out(format!("{name}.quant_map"), "F32", vec![256], 1024));
            let json = int8::state_json(spec.blocksize, dtype, shape);
            trailing.push(Trailing {
                name: format!("{name}{}", int8::STATE_SUFFIX),
                max_len: json.len() as u64,
            });
        }
    }
    Ok(Planned { outputs, trailing })
}

/// What quantizing one weight measured.
pub struct Quantized {
    /// RMSE and max abs error of the dequantized weight.
    pub stats: ErrStats,
    /// The trailing tensors' bytes.
    pub trailing: Vec<(String, Vec<u8>)>,
    /// Stored bytes (codes + scales), for the bits-per-parameter figure.
    pub stored: usize,
}

/// Quantizes the weight `reader` reads into `w` (the tensors of [`plan`]).
///
/// # Errors
/// [`Error::NonFinite`] for NaN or inf (unless allowed); a non-finite double-quantization offset;
/// device errors; write errors.
pub fn quantize(
    dev: &dyn Device,
    reader: &Reader<'_>,
    name: &str,
    path: &std::path::Path,
    spec: &WeightSpec,
    w: &mut StWriter,
) -> Result<Quantized> {
    match spec.format {
        WeightFormat::FourBit(qt) => four_bit(dev, reader, name, path, spec, qt, w),
        WeightFormat::Int8 => llm_int8(dev, reader, name, path, spec, w),
        WeightFormat::Int8Blockwise => blockwise(dev, reader, name, path, spec, w),
    }
}

fn four_bit(
    dev: &dyn Device,
    reader: &Reader<'_>,
    name: &str,
    path: &std::path::Path,
    spec: &WeightSpec,
    qt: QuantType,
    w: &mut StWriter,
) -> Result<Quantized> {
    let (n, bs) = (reader.numel(), spec.blocksize);
    let unit = if spec.double_quant { bs * 256 } else { bs };
    let chunk = chunk_len(spec.chunk, unit);
    let mut absmax: Vec<f32> = Vec::with_capacity(n.div_ceil(bs));
    let mut stats = ErrStats::default();
    let mut start = 0;
    while start < n {
        let len = chunk.min(n - start);
        let x = reader.read(start, len)?;
        let values = x.to_f32()?;
        check_finite(&values, start, spec.allow_nonfinite, path, name)?;
        let (packed, state) = ops::quantize_4bit(dev, &x, qt, bs, false)?;
        w.append(name, &packed)?;
        if !spec.double_quant {
            let restored = ops::dequantize_4bit(dev, &packed, &state)?;
            stats.add(&values, &restored.to_f32()?);
        }
        if let Absmax4::Plain(a) = state.absmax {
            absmax.extend_from_slice(&a);
        }
        reader.release(start, len);
        start += len;
    }
    let mut offset = None;
    if spec.double_quant {
        let nested = if n == 0 {
            Absmax4::Nested {
                qabsmax: vec![],
                nested_absmax: vec![],
                nested_code: BlockwiseMap::Dynamic.code(),
                offset: f32::NAN,
                nested_blocksize: 256,
            }
        } else {
            ops::compress_absmax(dev, &absmax)?
        };
        let Absmax4::Nested {
            qabsmax,
            nested_absmax,
            nested_code,
            offset: off,
            ..
        } = &nested
        else {
            unreachable!("compress_absmax returns a nested absmax")
        };
        if n > 0 && !off.is_finite() {
            return Err(Error::Tensor {
                path: path.to_path_buf(),
                tensor: name.into(),
                message: format!(
                    "double quantization needs a finite absmax mean, got {off} (the weight holds \
                     NaN/inf or values so large that the mean overflows); quantize without \
                     --double-quant"
                ),
            });
        }
        w.append(&format!("{name}.absmax"), qabsmax)?;
        w.append(&format!("{name}.nested_absmax"), &f32_bytes(nested_absmax))?;
        w.append(&format!("{name}.nested_quant_map"), &f32_bytes(nested_code))?;
        offset = Some(*off);
        // The error of what dequantization gives: a second pass with the nested absmax.
        let mut start = 0;
        while start < n {
            let len = chunk.min(n - start);
            let x = reader.read(start, len)?;
            let packed = w.read_back(name, start / 2, len.div_ceil(2))?;
            let (b0, b1) = (start / bs, (start + len).div_ceil(bs));
            let state = QuantState4 {
                quant_type: qt,
                blocksize: bs,
                dtype: reader.dtype,
                shape: vec![len],
                absmax: Absmax4::Nested {
                    qabsmax: qabsmax[b0..b1].to_vec(),
                    nested_absmax: nested_absmax[b0 / 256..b1.div_ceil(256)].to_vec(),
                    nested_code: nested_code.clone(),
                    offset: *off,
                    nested_blocksize: 256,
                },
            };
            let restored = ops::dequantize_4bit(dev, &packed, &state)?;
            stats.add(&x.to_f32()?, &restored.to_f32()?);
            reader.release(start, len);
            start += len;
        }
    } else {
        w.append(&format!("{name}.absmax"), &f32_bytes(&absmax))?;
    }
    w.append(&format!("{name}.quant_map"), &f32_bytes(&qt.code()))?;
    let json = bnb4::json_for(qt, bs, reader.dtype, &reader.shape(), offset);
    let nb = n.div_ceil(bs);
    let stored = n.div_ceil(2)
        + if spec.double_quant {
            nb + 4 * nb.div_ceil(256)
        } else {
            4 * nb
        };
    Ok(Quantized {
        stats,
        trailing: vec![(
            format!("{name}{STATE_MARK}{}", qt.name()),
            json.into_bytes(),
        )],
        stored,
    })
}

fn llm_int8(
    dev: &dyn Device,
    reader: &Reader<'_>,
    name: &str,
    path: &std::path::Path,
    spec: &WeightSpec,
    w: &mut StWriter,
) -> Result<Quantized> {
    let shape = reader.shape();
    let (rows, cols) = (shape[0], shape[1]);
    let module = module_of(name);
    let mut stats = ErrStats::default();
    if let Some(per) = chunk_len(spec.chunk, 1).checked_div(cols) {
        let rows_per = per.max(1);
        let mut r = 0;
        while r < rows {
            let nr = rows_per.min(rows - r);
            let x = reader.read(r * cols, nr * cols)?;
            let values = x.to_f32()?;
            check_finite(&values, r * cols, spec.allow_nonfinite, path, name)?;
            // bitsandbytes' Int8Params quantizes the weight converted to float16.
            let x16 = HostTensor::from_f32_as(DType::F16, vec![nr, cols], &values)?;
            let (codes, scb) = ops::quantize_rowwise_int8(dev, &x16)?;
            let restored = ops::dequantize_rowwise_int8(dev, &codes, &scb, DType::F32)?;
            stats.add(&values, &restored.to_f32()?);
            w.append(name, &codes.data)?;
            w.append(&format!("{module}.SCB"), &f32_bytes(&scb))?;
            reader.release(r * cols, nr * cols);
            r += nr;
        }
    } else {
        // [rows, 0]: no codes; bitsandbytes' row absmax of an empty row is not defined, so the
        // scale is 0.
        w.append(&format!("{module}.SCB"), &f32_bytes(&vec![0.0; rows]))?;
    }
    w.append(&format!("{module}.weight_format"), &[0])?;
    Ok(Quantized {
        stats,
        trailing: vec![],
        stored: rows * cols + 4 * rows,
    })
}

fn blockwise(
    dev: &dyn Device,
    reader: &Reader<'_>,
    name: &str,
    path: &std::path::Path,
    spec: &WeightSpec,
    w: &mut StWriter,
) -> Result<Quantized> {
    let (n, bs) = (reader.numel(), spec.blocksize);
    let chunk = chunk_len(spec.chunk, bs);
    let map = BlockwiseMap::Dynamic;
    let mut absmax = Vec::with_capacity(n.div_ceil(bs));
    let mut stats = ErrStats::default();
    let mut start = 0;
    while start < n {
        let len = chunk.min(n - start);
        let x = reader.read(start, len)?;
        let values = x.to_f32()?;
        check_finite(&values, start, spec.allow_nonfinite, path, name)?;
        let (codes, a) = ops::quantize_blockwise(dev, &x, map, bs)?;
        let restored = ops::dequantize_blockwise(dev, &codes, &a, map, bs, x.dtype, &[len])?;
        stats.add(&values, &restored.to_f32()?);
        w.append(name, &codes)?;
        absmax.extend_from_slice(&a);
        reader.release(start, len);
        start += len;
    }
    w.append(&format!("{name}.absmax"), &f32_bytes(&absmax))?;
    w.append(&format!("{name}.quant_map"), &f32_bytes(&map.code()))?;
    let json = int8::state_json(bs, reader.dtype, &reader.shape());
    Ok(Quantized {
        stats,
        trailing: vec![(format!("{name}{}", int8::STATE_SUFFIX), json.into_bytes())],
        stored: n + 4 * n.div_ceil(bs),
    })
}

/// Reads f32 values of a little-endian f32 byte slice (re-export for the dequantize side).
pub fn f32s(bytes: &[u8]) -> Vec<f32> {
    le_f32(bytes)
}
