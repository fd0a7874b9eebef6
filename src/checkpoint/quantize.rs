//! `qforge quantize`: a safetensors checkpoint (one file, or a model folder, sharded or not) in,
//! the quantized checkpoint out, with a `config.json` whose `quantization_config` tells
//! transformers the truth. Which weights are quantized follows transformers (`arch.rs`); every
//! other tensor is copied byte for byte; everything is streamed tensor by tensor (`emit.rs`).

use std::path::{Path, PathBuf};

use qforge_ir::DType;
use qforge_runtime::Device;
use regex::Regex;
use serde_json::{Map, Value};

use super::arch::{self, Arch, Role};
use super::bnb4::torch_dtype_name;
use super::chunks::Reader;
use super::config;
use super::emit::{self, Item, Target};
use super::model_in::ModelIn;
pub use super::qweight::WeightFormat;
use super::qweight::{self, module_of, WeightSpec};
use super::st_write::OutTensor;
use crate::error::{Error, Result};

/// Options of [`quantize_model`].
#[derive(Clone, Debug)]
pub struct QuantizeOptions {
    /// Output format.
    pub format: WeightFormat,
    /// Block size in elements (4-bit: 32..4096, 8-bit blockwise: 64..4096, powers of two;
    /// ignored for LLM.int8).
    pub blocksize: usize,
    /// Double quantization of the 4-bit absmax (`compress_statistics`).
    pub double_quant: bool,
    /// Compute dtype recorded in `config.json` (`float32`, `float16`, `bfloat16`).
    pub compute_dtype: DType,
    /// The dtype the packed 4-bit codes are stored as (`bnb_4bit_quant_storage`: U8, F16, BF16
    /// or F32).
    pub quant_storage: DType,
    /// Weights whose name matches are kept in full precision (and listed in the config).
    pub skip: Option<Regex>,
    /// Quantize weights holding NaN/inf instead of refusing.
    pub allow_nonfinite: bool,
    /// Largest output shard in bytes (model folders).
    pub max_shard_size: u64,
    /// Replace an existing output folder, or a `config.json` that would not describe the output.
    pub overwrite: bool,
    /// Elements per launch (0: the default, 4 Mi); tensors are processed in chunks of this size.
    pub chunk_elements: usize,
}

impl QuantizeOptions {
    /// The defaults for `format` (as the CLI's): default blocksize, f32 compute dtype, uint8
    /// storage, 5 GB shards.
    pub fn new(format: WeightFormat) -> QuantizeOptions {
        QuantizeOptions {
            format,
            blocksize: format.default_blocksize(),
            double_quant: false,
            compute_dtype: DType::F32,
            quant_storage: DType::U8,
            skip: None,
            allow_nonfinite: false,
            max_shard_size: 5_000_000_000,
            overwrite: false,
            chunk_elements: 0,
        }
    }
}

/// One quantized tensor in the report.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorReport {
    /// Tensor name.
    pub name: String,
    /// Shape as quantized (`[out, in]`; a `Conv1D` weight is transposed).
    pub shape: Vec<usize>,
    /// Stored bits per parameter (codes + absmax + nested state), excluding the JSON blob.
    pub bits_per_param: f64,
    /// Root-mean-square error of the dequantized weight (computed in f64).
    pub rmse: f64,
    /// Largest absolute error of the dequantized weight (NaN positions excluded).
    pub max_abs_err: f64,
}

/// What [`quantize_model`] did.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantizeReport {
    /// Quantized tensors, sorted by name.
    pub tensors: Vec<TensorReport>,
    /// Tensors copied unchanged.
    pub copied: usize,
    /// The Linear modules kept in full precision, as listed in `llm_int8_skip_modules`.
    pub skip_modules: Vec<String>,
    /// Input size in bytes.
    pub bytes_before: u64,
    /// Output size in bytes (all shards).
    pub bytes_after: u64,
    /// The model files written.
    pub files: Vec<PathBuf>,
    /// The `config.json` written, if any.
    pub config: Option<PathBuf>,
    /// Remarks for the user (e.g. why no config.json was written).
    pub notes: Vec<String>,
}

/// What happens to one input tensor.
enum Action {
    Copy,
    Quantize { transpose: bool, dtype: DType },
}

fn check_blocksize(opts: &QuantizeOptions) -> Result<()> {
    let allowed: &[usize] = match opts.format {
        WeightFormat::FourBit(_) => &[32, 64, 128, 256, 512, 1024, 2048, 4096],
        WeightFormat::Int8Blockwise => &[64, 128, 256, 512, 1024, 2048, 4096],
        WeightFormat::Int8 => &[0],
    };
    if opts.format == WeightFormat::Int8 {
        if opts.blocksize != 0 {
            return Err(Error::Usage(
                "--blocksize does not apply to --quant-type int8 (one scale per row)".into(),
            ));
        }
    } else if !allowed.contains(&opts.blocksize) {
        return Err(Error::Usage(format!(
            "unsupported blocksize {} for quant type {} (allowed: {allowed:?})",
            opts.blocksize,
            opts.format.name()
        )));
    }
    if opts.double_quant && !matches!(opts.format, WeightFormat::FourBit(_)) {
        return Err(Error::Usage(
            "--double-quant applies to 4-bit quant types (nf4, fp4) only".into(),
        ));
    }
    if opts.quant_storage != DType::U8 && !matches!(opts.format, WeightFormat::FourBit(_)) {
        return Err(Error::Usage(
            "--quant-storage applies to 4-bit quant types (nf4, fp4) only".into(),
        ));
    }
    if !matches!(
        opts.quant_storage,
        DType::U8 | DType::F16 | DType::BF16 | DType::F32
    ) {
        return Err(Error::Usage(format!(
            "unsupported --quant-storage {} (uint8, float16, bfloat16, float32)",
            torch_dtype_name(opts.quant_storage)
        )));
    }
    Ok(())
}

/// True for tensors a quantized checkpoint has and a full-precision one does not.
fn quantized_marker(name: &str) -> bool {
    name.contains(".quant_state.") || name.ends_with(".SCB") || name.ends_with(".weight_format")
}

/// Quantizes the checkpoint `input` (a safetensors file, a model folder or an index file) into
/// `output` (a file for a file input, a folder otherwise). `progress(done, total)` is called per
/// tensor.
///
/// # Errors
/// Bad input is reported naming the file and tensor, before anything is renamed into place: a
/// missing or corrupt file, a pickle checkpoint, an already quantized checkpoint, an existing
/// output folder (without `overwrite`), a 2-D weight whose module type the architecture table
/// cannot decide, NaN/inf in a weight (unless allowed), a bad blocksize or option, a
/// `config.json` in the output folder that would not describe the output (without `overwrite`).
/// The outputs are written to temporary files and renamed, so a failure leaves no partial output.
pub fn quantize_model(
    device: &dyn Device,
    input: &Path,
    output: &Path,
    opts: &QuantizeOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<QuantizeReport> {
    super::out::refuse_stdout(output)?;
    check_blocksize(opts)?;
    let model = ModelIn::open(input)?;
    if !model.is_folder && super::io::same_file(input, output) {
        return Err(Error::Usage(format!(
            "output path {} is the input file; choose another output",
            output.display()
        )));
    }
    if model.is_folder && super::io::same_file(&model.dir, output) {
        return Err(Error::Usage(format!(
            "output folder {} is the input folder; choose another output",
            output.display()
        )));
    }
    if let Some(name) = model.names().find(|n| quantized_marker(n)) {
        return Err(Error::Tensor {
            path: model.path_of(name),
            tensor: name.clone(),
            message: "the checkpoint is already quantized (it has a quant state); dequantize it \
                      first"
                .into(),
        });
    }
    let arch = Arch::new(model.model_type());
    let spec = WeightSpec {
        format: opts.format,
        blocksize: opts.blocksize,
        double_quant: opts.double_quant,
        storage: opts.quant_storage,
        chunk: opts.chunk_elements,
        allow_nonfinite: opts.allow_nonfinite,
    };
    let mut notes = Vec::new();
    let mut items = Vec::new();
    let mut actions = Vec::new();
    let (mut kept, mut quantized) = (Vec::new(), Vec::new());
    for name in model.names() {
        let (file, info) = model.get(name).expect("listed tensor");
        let tensor_err = |message: String| Error::Tensor {
            path: file.path.clone(),
            tensor: name.clone(),
            message,
        };
        let copy = || Item {
            name: name.clone(),
            outputs: vec![OutTensor {
                name: name.clone(),
                dtype: info.dtype.clone(),
                shape: info.shape.clone(),
                len: info.len() as u64,
            }],
            trailing: vec![],
        };
        let mut action = Action::Copy;
        if name.ends_with(".weight") && info.shape.len() == 2 {
            let module = module_of(name).to_string();
            let user_skip = opts.skip.as_ref().is_some_and(|re| re.is_match(name));
            let role = match arch.role(&module) {
                Ok(role) => Some(role),
                Err(_) if user_skip => None,
                Err(m) => return Err(tensor_err(format!("shape {:?}: {m}", info.shape))),
            };
            match role {
                Some(Role::Linear) | Some(Role::Conv1D) if !user_skip => match info.dtype.float() {
                    Some(dtype) => {
                        action = Action::Quantize {
                            transpose: role == Some(Role::Conv1D),
                            dtype,
                        };
                        quantized.push(module);
                    }
                    None => {
                        notes.push(format!(
                            "{name}: dtype {} is not a float dtype qforge quantizes; copied and \
                                 kept in full precision",
                            info.dtype
                        ));
                        kept.push(module);
                    }
                },
                Some(Role::NotLinear) => {}
                _ => kept.push(module),
            }
        }
        match action {
            Action::Copy => items.push(copy()),
            Action::Quantize { transpose, dtype } => {
                let shape = if transpose {
                    vec![info.shape[1], info.shape[0]]
                } else {
                    info.shape.clone()
                };
                let planned = qweight::plan(name, &shape, dtype, &spec).map_err(tensor_err)?;
                items.push(Item {
                    name: name.clone(),
                    outputs: planned.outputs,
                    trailing: planned.trailing,
                });
            }
        }
        actions.push(action);
    }
    let skip_modules = arch::skip_modules(&arch, &kept, &quantized)?;
    if quantized.is_empty() {
        notes.push("no tensor was quantized: no 2-D float Linear weight outside --skip".into());
    }
    let qc = match opts.format {
        WeightFormat::FourBit(qt) => config::bnb4(
            qt.name(),
            opts.double_quant,
            torch_dtype_name(opts.compute_dtype),
            torch_dtype_name(opts.quant_storage),
            &skip_modules,
        ),
        WeightFormat::Int8 => config::llm_int8(&skip_modules),
        WeightFormat::Int8Blockwise => config::blockwise_marker(opts.blocksize),
    };
    if opts.format == WeightFormat::Int8Blockwise {
        notes.push(
            "int8-blockwise is qforge's own layout: transformers cannot load it (its config says \
             so); use --quant-type int8 for LLM.int8 checkpoints transformers loads"
                .into(),
        );
    }
    let new_config = model
        .config
        .clone()
        .map(|c| config::with_quantization(c, qc));
    let target = target_for(&model, output, opts.overwrite, new_config, &mut notes)?;
    let mut metadata = model.metadata();
    metadata
        .entry("format".into())
        .or_insert_with(|| "pt".into());
    let total = items.len();
    let mut reports = Vec::new();
    let mut copied = 0;
    let mut done = 0;
    let mut run = |i: usize, w: &mut super::st_write::StWriter| -> Result<Vec<(String, Vec<u8>)>> {
        progress(done, total);
        done += 1;
        let name = &items[i].name;
        let (file, info) = model.get(name).expect("planned tensor");
        match actions[i] {
            Action::Copy => {
                copy_tensor(file, info, name, w)?;
                copied += 1;
                Ok(vec![])
            }
            Action::Quantize { transpose, dtype } => {
                let reader = Reader::new(file, info, dtype, transpose);
                let q = qweight::quantize(device, &reader, name, &file.path, &spec, w)
                    .map_err(|e| tensor_error(e, &file.path, name))?;
                let (rmse, max_abs_err) = q.stats.finish();
                reports.push(TensorReport {
                    name: name.clone(),
                    shape: reader.shape(),
                    bits_per_param: q.stored as f64 * 8.0 / reader.numel().max(1) as f64,
                    rmse,
                    max_abs_err,
                });
                Ok(q.trailing)
            }
        }
    };
    let written = emit::write(&items, target, &metadata, opts.max_shard_size, &mut run)?;
    progress(total, total);
    reports.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(QuantizeReport {
        tensors: reports,
        copied,
        skip_modules,
        bytes_before: model.bytes(),
        bytes_after: written.bytes,
        files: written.files,
        config: written.config,
        notes,
    })
}

/// Wraps a runtime error of one weight so it names the file and tensor.
fn tensor_error(e: Error, path: &Path, name: &str) -> Error {
    match e {
        Error::Runtime(_) | Error::Ir(_) => Error::Tensor {
            path: path.to_path_buf(),
            tensor: name.to_string(),
            message: e.to_string(),
        },
        other => other,
    }
}

/// Copies a tensor's bytes in chunks, releasing the pages behind.
pub(crate) fn copy_tensor(
    file: &super::st_read::StFile,
    info: &super::st_read::TensorInfo,
    name: &str,
    w: &mut super::st_write::StWriter,
) -> Result<()> {
    const STEP: usize = 16 << 20;
    let mut at = 0;
    while at < info.len() {
        let n = STEP.min(info.len() - at);
        w.append(name, file.slice(info, at, n))?;
        file.release_part(info, at, n);
        at += n;
    }
    Ok(())
}

/// Where the output goes and which `config.json` is written with it.
///
/// A model folder gets the new config (when the input has one) and the input folder's other
/// files. A single output file gets a `config.json` beside it when the input has one; an existing
/// `config.json` there is kept only when it already says exactly that, replaced with `overwrite`,
/// and otherwise an error: left alone, it would not describe the file beside it.
pub(crate) fn target_for(
    model: &ModelIn,
    output: &Path,
    overwrite: bool,
    config: Option<Map<String, Value>>,
    notes: &mut Vec<String>,
) -> Result<Target> {
    let text = config.as_ref().map(config::text);
    super::out::refuse_stdout(output)?;
    if model.is_folder {
        if output.extension().is_some_and(|e| e == "safetensors") {
            return Err(Error::Usage(format!(
                "the input {} is a model folder, so the output is a folder too; {} looks like a \
                 file name (give a folder, or a single .safetensors file as input)",
                model.dir.display(),
                output.display()
            )));
        }
        if text.is_none() {
            notes.push(format!(
                "{} has no config.json: the output folder has none either",
                model.dir.display()
            ));
        }
        let lock = super::out::lock_folder(&super::out::parent_of(output))?;
        return Ok(Target::Folder {
            path: output.to_path_buf(),
            overwrite,
            companions: Some((model.dir.clone(), model.own_files.clone())),
            config: text,
            lock,
        });
    }
    // The folder the file really goes into (through a symlink) is the one locked.
    let lock = super::out::lock_folder(&super::out::parent_of(&super::io::output_target(output)?))?;
    let out_dir = super::out::parent_of(output);
    let dst = out_dir.join("config.json");
    let src = model.dir.join("config.json");
    if output.file_name() == Some(std::ffi::OsStr::new("config.json")) {
        return Err(Error::Usage(
            "the output file cannot be called config.json".into(),
        ));
    }
    if super::io::same_file(&src, &dst) {
        notes.push(format!(
            "config.json not written: {} is the input's own config (it describes the input \
             checkpoint); write the output into another folder to get one",
            src.display()
        ));
        return Ok(Target::File {
            path: output.to_path_buf(),
            config: None,
            lock,
        });
    }
    let existing = std::fs::read_to_string(&dst).ok();
    let config = match (text, existing) {
        (Some(t), Some(e)) if same_json(&t, &e) => None,
        (Some(t), Some(_)) if overwrite => Some((dst, t)),
        (Some(_), Some(_)) => {
            return Err(Error::Usage(format!(
                "{} exists and does not describe the output (its quantization_config differs or \
                 is missing, so transformers would load the file wrong); pass --overwrite to \
                 replace it, or write into another folder",
                dst.display()
            )))
        }
        (Some(t), None) => Some((dst, t)),
        (None, Some(_)) => {
            return Err(Error::Usage(format!(
                "{} exists, but the input has no config.json to derive one from, so it cannot \
                 describe the output; remove it or write into another folder",
                dst.display()
            )))
        }
        (None, None) => None,
    };
    Ok(Target::File {
        path: output.to_path_buf(),
        config,
        lock,
    })
}

fn same_json(a: &str, b: &str) -> bool {
    match (
        serde_json::from_str::<Value>(a),
        serde_json::from_str::<Value>(b),
    ) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}
