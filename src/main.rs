//! The `qforge` command line: `check`, `quantize`, `dequantize`, `bench`, `finetune`, `compile`,
//! `list-kernels`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use qforge::checkpoint::{self, QuantizeOptions, WeightFormat};
use qforge::cli::check::{self, CheckRow};
use qforge::cli::compile::{self as compile_cmd, Source};
use qforge::devices::{available_devices, open_device};
use qforge::ir::DType;
use qforge::{Error, Result};

#[global_allocator]
static ALLOCATOR: qforge::aligned_alloc::CacheLineAligned = qforge::aligned_alloc::CacheLineAligned;

#[derive(Parser)]
#[command(
    name = "qforge",
    version,
    about = "Kernel-generation compiler for low-bit training and inference kernels"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Build every library kernel for every backend compiled in, run it on built-in inputs and
    /// compare with the reference interpreter bit for bit (exit code 1 on any mismatch).
    Check {
        /// Print JSON lines instead of a table.
        #[arg(long)]
        json: bool,
        /// Run only on this device (auto, cpu, interpreter, cpu-llvm, wgpu or cuda with their
        /// features; auto: the fastest conformant CPU device, cpu-llvm with the `llvm` feature,
        /// else cpu); a device that cannot start is an error (exit code 2). Default: every
        /// device that can.
        #[arg(long)]
        device: Option<String>,
        /// Check only the kernels whose name contains this string (exit code 2 when none does).
        #[arg(long)]
        filter: Option<String>,
    },
    /// Quantize the Linear weights of a safetensors checkpoint or Hugging Face model folder
    /// (bitsandbytes 4-bit or LLM.int8, which transformers loads, or qforge's 8-bit blockwise);
    /// other tensors are copied and config.json says which modules stayed in full precision.
    Quantize {
        /// A safetensors file, a model folder (config.json with model.safetensors or
        /// model.safetensors.index.json and its shards) or an index file.
        input: PathBuf,
        /// Output: a file for a file input, a folder for a folder (created; see --overwrite).
        /// `-` (stdout) is refused.
        #[arg(short, long)]
        output: PathBuf,
        /// nf4, fp4, int8 (LLM.int8, transformers' load_in_8bit) or int8-blockwise (qforge's own
        /// layout, not loadable by transformers).
        #[arg(long, default_value = "nf4")]
        quant_type: String,
        /// Elements per absmax block (default 64 for 4-bit, 4096 for int8-blockwise).
        #[arg(long)]
        blocksize: Option<usize>,
        /// Quantize the absmax again (8-bit, nested block 256), as bitsandbytes' compress_statistics.
        #[arg(long)]
        double_quant: bool,
        /// Compute dtype written to config.json: f32, f16 or bf16.
        #[arg(long, default_value = "f32")]
        compute_dtype: String,
        /// Dtype the packed 4-bit codes are stored as (bnb_4bit_quant_storage): uint8, float16,
        /// bfloat16 (FSDP-QLoRA) or float32.
        #[arg(long, default_value = "uint8")]
        quant_storage: String,
        /// Regex of weight names to keep in full precision (listed in llm_int8_skip_modules).
        /// Embeddings, output heads and norms are kept anyway, as transformers keeps them.
        #[arg(long)]
        skip: Option<String>,
        /// Quantize weights that contain NaN or inf instead of refusing.
        #[arg(long)]
        allow_nonfinite: bool,
        /// Largest output shard of a model folder (transformers' default 5GB; KB/MB/GB are powers
        /// of 1000, KiB/MiB/GiB of 1024).
        #[arg(long, default_value = "5GB")]
        max_shard_size: String,
        /// Replace an existing output folder, or a config.json beside an output file that would
        /// not describe it.
        #[arg(long)]
        overwrite: bool,
        /// Elements per kernel launch (tensors are processed in chunks; default 4 Mi; rounded up
        /// to whole quantization blocks).
        #[arg(long, default_value_t = 0, hide_default_value = true)]
        chunk_elements: usize,
        /// Device: auto (the fastest conformant device compiled in: cpu-llvm with the `llvm`
        /// feature, else cpu; printed at start), cpu, interpreter, cpu-llvm (`llvm` feature),
        /// cpu-aot (`aot` feature), wgpu (`wgpu` feature) or cuda (`cuda` feature).
        #[arg(long, default_value = "auto")]
        device: String,
    },
    /// Restore full-precision weights from a quantized checkpoint (bitsandbytes 4-bit, LLM.int8,
    /// or qforge's int8-blockwise; a file or a model folder).
    Dequantize {
        /// A safetensors file, a model folder or an index file.
        input: PathBuf,
        /// Output: a file for a file input, a folder for a folder. `-` (stdout) is refused.
        #[arg(short, long)]
        output: PathBuf,
        /// Output dtype f32, f16 or bf16 (default: each weight's original dtype).
        #[arg(long)]
        dtype: Option<String>,
        /// Largest output shard of a model folder.
        #[arg(long, default_value = "5GB")]
        max_shard_size: String,
        /// Replace an existing output folder or config.json.
        #[arg(long)]
        overwrite: bool,
        /// Elements per kernel launch (default 4 Mi).
        #[arg(long, default_value_t = 0, hide_default_value = true)]
        chunk_elements: usize,
        /// Device: auto (the fastest conformant device compiled in: cpu-llvm with the `llvm`
        /// feature, else cpu; printed at start), cpu, interpreter, cpu-llvm (`llvm` feature),
        /// cpu-aot (`aot` feature), wgpu (`wgpu` feature) or cuda (`cuda` feature).
        #[arg(long, default_value = "auto")]
        device: String,
    },
    /// Quick benchmark of the library kernels (about half a minute on 2 cores): one line per kernel, shape
    /// and baseline with the median time, bytes/s and the ratio baseline time / kernel time.
    /// `--suite train`: the fused NF4 matmul forward and input gradient at training shapes
    /// (M = 16..2048) against an fp32 GEMM, with GFLOP/s and the fraction of the CPU's measured
    /// peak (minutes).
    Bench {
        /// Print JSON lines instead of a table.
        #[arg(long)]
        json: bool,
        /// Which cases: quick (the library kernels) or train (the training-shape matmuls).
        #[arg(long, default_value = "quick", value_parser = ["quick", "train"])]
        suite: String,
        /// Keep only the cases whose line `KERNEL SHAPE DTYPE` contains this string (a kernel
        /// name, or e.g. `M=512,K=4096,N=4096 f32`).
        #[arg(long)]
        filter: Option<String>,
        /// Device: auto (the fastest conformant device compiled in: cpu-llvm with the `llvm`
        /// feature, else cpu; printed at start), cpu, interpreter (cases scaled down), cpu-llvm
        /// (`llvm` feature), cpu-aot (`aot` feature), wgpu (`wgpu` feature) or cuda (`cuda` feature).
        #[arg(long, default_value = "auto")]
        device: String,
    },
    /// Train bottleneck adapters after frozen NF4 feed-forward blocks so that they reproduce the
    /// full-precision blocks, anneal them to linear (AFA) and merge them into output.dense.
    /// Without --model: a built-in synthetic model (seconds).
    Finetune {
        /// A BERT-style f32 safetensors checkpoint (e.g. all-MiniLM-L6-v2/model.safetensors).
        #[arg(long)]
        model: Option<PathBuf>,
        /// Encoder layers to adapt, comma separated.
        #[arg(long, value_delimiter = ',', default_value = "0")]
        layers: Vec<usize>,
        /// Adapter rank r.
        #[arg(long, default_value_t = 16)]
        rank: usize,
        /// Training steps.
        #[arg(long, default_value_t = 200)]
        steps: u64,
        /// Optimizer of the adapter weights: adamw4bit-zip-sr, adamw4bit-ze-eden, adamw8bit or
        /// adamw.
        #[arg(long, default_value = "adamw4bit-zip-sr")]
        optimizer: String,
        /// Learning rate.
        #[arg(long, default_value_t = 1e-3)]
        lr: f64,
        /// Micro-batches per step of 64 rows: the step's gradient is their gradients summed in
        /// micro-batch order (docs/distributed.md), the same bits for any --shards dividing it.
        #[arg(long, default_value_t = 1)]
        micro_batches: usize,
        /// Data-parallel ranks (`mpi` feature): run as `mpirun -n N qforge finetune --shards N
        /// ...`; each rank computes its share of the micro-batches, the result is bit for bit
        /// that of --shards 1, and rank 0 alone prints and writes the outputs.
        #[arg(long, default_value_t = 1)]
        shards: usize,
        /// Folder for loss.csv, loss.svg and merged.safetensors.
        #[arg(long, default_value = "finetune-out")]
        out: PathBuf,
        /// Print the summary as one JSON line (the last line printed).
        #[arg(long)]
        json: bool,
        /// Device: auto (the fastest conformant device compiled in: cpu-llvm with the `llvm`
        /// feature, else cpu; printed at start), cpu, interpreter, cpu-llvm (`llvm` feature),
        /// cpu-aot (`aot` feature), wgpu (`wgpu` feature) or cuda (`cuda` feature).
        #[arg(long, default_value = "auto")]
        device: String,
    },
    /// Compile one kernel ahead of time: a library kernel (--kernel NAME, see list-kernels) or
    /// a kernel in the text form (FILE.qir). Writes the code to OUT, its manifest to OUT.json and
    /// the kernel's text form to OUT.qir; without -o, a text target's code goes to stdout.
    Compile {
        /// A kernel in the text form (.qir), parsed and verified.
        #[arg(required_unless_present = "kernel", conflicts_with = "kernel")]
        file: Option<PathBuf>,
        /// A library kernel by name (`qforge list-kernels`).
        #[arg(long)]
        kernel: Option<String>,
        /// cpu-obj (a native relocatable object), clif (Cranelift IR), llvm-ir, ptx, wgsl,
        /// spirv, stablehlo or mosaic (a TPU kernel; OUT.json's `launch` gives its arrays, and
        /// `scripts/mosaic_check.py` compiles it with libtpu).
        #[arg(long)]
        target: String,
        /// CPU feature level of cpu-obj, clif and llvm-ir: x86-64, x86-64-v2, x86-64-v3,
        /// x86-64-v4 or aarch64 (default: the best level of this machine).
        #[arg(long)]
        feature_level: Option<String>,
        /// NVIDIA architecture of ptx: 80 (A100) or 90 (H100/H200); default 80.
        #[arg(long)]
        sm: Option<String>,
        /// stablehlo and mosaic: the value of every dimension parameter (their shapes are
        /// static; default 4).
        #[arg(long)]
        dim: Option<u32>,
        /// mosaic: NAME=VALUE, an integer parameter of another value than --dim (repeatable;
        /// a matmul needs its m, n, k, n_items, n_tiles, n_packed and n_blocks).
        #[arg(long = "scalar", value_name = "NAME=VALUE")]
        scalars: Vec<String>,
        /// wgsl and spirv: exact software fma, division and square root (for drivers that
        /// break the numeric contract).
        #[arg(long)]
        soft_math: bool,
        /// cpu-obj, clif and llvm-ir: no bounds checks on buffer accesses.
        #[arg(long)]
        no_bounds_checks: bool,
        /// Output file of the code (OUT.json and OUT.qir are written next to it). Required for
        /// the binary targets cpu-obj and spirv.
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
    /// Probe what this CPU's bf16 dot-product instructions compute (`vdpbf16ps`, AMX
    /// `tdpbf16ps`): each runs on generated inputs and every result is compared bit for bit with
    /// candidate models (`docs/semantics.md`, "bf16 dot-product instructions"). An instruction the
    /// CPU lacks is reported as skipped. Exit code 1 when a probed instruction agrees with no
    /// model or with several (inconclusive).
    Probe {
        /// What to probe.
        #[arg(value_parser = ["bf16-dot"])]
        what: String,
        /// f32 results compared per instruction form, 1 to 10^9, rounded up to whole
        /// instructions (16 results for vdpbf16ps, 256 for a tdpbf16ps tile).
        #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
        results: u64,
        /// Seed of the generated inputs.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// List the library's kernel names, one per line (the names `compile --kernel` takes).
    ListKernels {
        /// Only the names that contain this string.
        #[arg(long)]
        filter: Option<String>,
        /// Print a JSON array of {"name", "family"} objects instead.
        #[arg(long)]
        json: bool,
    },
}

/// Prints a line to stdout without ever panicking: a closed pipe ends the process quietly, any
/// other write error (a full disk) is reported with exit code 2.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write;
        let mut stdout = std::io::stdout().lock();
        match writeln!(stdout, $($arg)*) {
            Ok(()) => {}
            // A closed pipe (`qforge check --json | head`) means the reader has what it wants.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
            Err(e) => {
                eprintln!("error: writing to stdout: {e}");
                std::process::exit(2);
            }
        }
    }};
}

/// Opens the device `--device name` names. `auto` says which device it chose: on stderr for
/// the commands whose stdout may be JSON (`check`, `bench`, `finetune`), as the first line of
/// the report on stdout for `quantize` and `dequantize` (their stderr holds only an error).
fn start_device(name: &str, report_on_stdout: bool) -> Result<Box<dyn qforge::runtime::Device>> {
    let (device, announcement) = open_device(name)?;
    if let Some(line) = announcement {
        if report_on_stdout {
            out!("{line}");
        } else {
            eprintln!("{line}");
        }
    }
    Ok(device)
}

fn float_dtype(name: &str) -> Result<DType> {
    match name {
        "f32" | "float32" => Ok(DType::F32),
        "f16" | "float16" => Ok(DType::F16),
        "bf16" | "bfloat16" => Ok(DType::BF16),
        other => Err(Error::Usage(format!(
            "unsupported dtype '{other}' (f32, f16, bf16)"
        ))),
    }
}

fn check(json: bool, device: Option<&str>, filter: Option<&str>) -> Result<bool> {
    let (devices, unavailable) = match device {
        // The interpreter is the reference every row is compared with: nothing else to run.
        Some("interpreter") => (Vec::new(), Vec::new()),
        Some(name) => (vec![start_device(name, false)?], Vec::new()),
        None => available_devices(),
    };
    let mut on_row = |r: &CheckRow| {
        if json {
            out!("{}", r.to_json());
        }
    };
    let rows = check::run_check(&devices, &unavailable, filter, &mut on_row)?;
    if !json {
        for line in check::table(&rows, &unavailable) {
            out!("{line}");
        }
    }
    Ok(check::passed(&rows))
}

/// Options of the `quantize` command as typed.
struct QuantizeArgs {
    quant_type: String,
    blocksize: Option<usize>,
    double_quant: bool,
    compute_dtype: String,
    quant_storage: String,
    skip: Option<String>,
    allow_nonfinite: bool,
    max_shard_size: String,
    overwrite: bool,
    chunk_elements: usize,
}

fn storage_dtype(name: &str) -> Result<DType> {
    match name {
        "uint8" | "u8" => Ok(DType::U8),
        other => float_dtype(other).map_err(|_| {
            Error::Usage(format!(
                "unsupported --quant-storage '{other}' (uint8, float16, bfloat16, float32)"
            ))
        }),
    }
}

/// Bytes of a checkpoint path (a file, or the safetensors files of a folder), for the progress bar.
fn input_size(input: &std::path::Path) -> u64 {
    if input.is_dir() {
        std::fs::read_dir(input)
            .map(|d| {
                d.flatten()
                    .filter(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
                    .filter_map(|e| e.metadata().ok())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0)
    } else {
        std::fs::metadata(input).map(|m| m.len()).unwrap_or(0)
    }
}

/// The peak resident set of this process (VmHWM), where /proc tells it.
fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn quantize(input: PathBuf, output: PathBuf, a: QuantizeArgs, device: &str) -> Result<()> {
    let format = WeightFormat::from_name(&a.quant_type).ok_or_else(|| {
        Error::Usage(format!(
            "unsupported quant type '{}' (nf4, fp4, int8, int8-blockwise)",
            a.quant_type
        ))
    })?;
    let skip = a
        .skip
        .as_deref()
        .map(|skip| {
            regex::Regex::new(skip).map_err(|e| {
                let detail = e
                    .to_string()
                    .lines()
                    .rfind(|l| !l.trim().is_empty())
                    .unwrap_or("")
                    .trim()
                    .to_string();
                Error::Usage(format!("--skip '{skip}' is not a valid regex: {detail}"))
            })
        })
        .transpose()?;
    let opts = QuantizeOptions {
        format,
        blocksize: a.blocksize.unwrap_or(format.default_blocksize()),
        double_quant: a.double_quant,
        compute_dtype: float_dtype(&a.compute_dtype)?,
        quant_storage: storage_dtype(&a.quant_storage)?,
        skip,
        allow_nonfinite: a.allow_nonfinite,
        max_shard_size: checkpoint::emit::parse_size(&a.max_shard_size)?,
        overwrite: a.overwrite,
        chunk_elements: a.chunk_elements,
    };
    let device = start_device(device, true)?;
    let bar = (input_size(&input) > 100 << 20).then(|| indicatif::ProgressBar::new(0));
    let mut progress = |done: usize, total: usize| {
        if let Some(bar) = &bar {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
        }
    };
    let report =
        checkpoint::quantize_model(device.as_ref(), &input, &output, &opts, &mut progress)?;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let width = report
        .tensors
        .iter()
        .map(|t| t.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    out!(
        "{:width$}  {:>12}  {:>8}  {:>10}  {:>10}",
        "name",
        "shape",
        "bits/par",
        "rmse",
        "max|err|"
    );
    for t in &report.tensors {
        let shape = t
            .shape
            .iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join("x");
        out!(
            "{:width$}  {shape:>12}  {:>8.3}  {:>10.3e}  {:>10.3e}",
            t.name,
            t.bits_per_param,
            t.rmse,
            t.max_abs_err
        );
    }
    out!(
        "{} tensors quantized, {} copied; {} -> {} bytes ({:.2}x smaller); wrote {}{}",
        report.tensors.len(),
        report.copied,
        report.bytes_before,
        report.bytes_after,
        report.bytes_before as f64 / report.bytes_after.max(1) as f64,
        output.display(),
        if report.files.len() > 1 {
            format!(" ({} shards)", report.files.len())
        } else {
            String::new()
        }
    );
    out!(
        "kept in full precision (llm_int8_skip_modules): {}",
        if report.skip_modules.is_empty() {
            "none".to_string()
        } else {
            report.skip_modules.join(", ")
        }
    );
    if let Some(c) = &report.config {
        out!("wrote {}", c.display());
    }
    for n in &report.notes {
        out!("note: {n}");
    }
    if let Some(rss) = peak_rss() {
        out!("peak RSS {rss} bytes");
    }
    Ok(())
}

/// `qforge probe bf16-dot`: each instruction's report as it completes; exit code 1 when a
/// probed instruction agrees with no model or with several.
fn probe_bf16_dot(results: u64, seed: u64) -> Result<ExitCode> {
    use qforge::probe::bf16_dot::{probe_tdpbf16ps, probe_vdpbf16ps, ProbeError, Report};
    let probes: [&dyn Fn() -> std::result::Result<Report, ProbeError>; 3] = [
        &|| probe_vdpbf16ps(results, seed),
        &|| probe_tdpbf16ps(results, 1, seed),
        &|| probe_tdpbf16ps(results, 16, seed),
    ];
    let mut conclusive = true;
    for probe in probes {
        match probe() {
            Ok(report) => {
                conclusive &= report.matching().len() == 1;
                out!("{report}\n");
            }
            Err(ProbeError::Unavailable(why)) => out!("skipped: {why}\n"),
            Err(e @ ProbeError::Invalid(_)) => return Err(Error::Usage(e.to_string())),
        }
    }
    Ok(if conclusive {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn bench(json: bool, suite: &str, filter: Option<&str>, device: &str) -> Result<()> {
    use qforge::bench::{self, cases, peak, report, train_cases};
    let device = start_device(device, false)?;
    // The cases build their inputs on their first (warm-up) run: listing and filtering is cheap.
    let size = cases::CaseSize::for_backend(device.backend());
    let train = suite == "train";
    let (cases, timing) = if train {
        (train_cases::train_cases(size), bench::Timing::TRAIN)
    } else {
        (cases::cases(size)?, bench::Timing::QUICK)
    };
    let cases = bench::filter_cases(cases, filter)?;
    // The train suite's rows carry their fraction of the CPU's measured peak (on the device's
    // threads; not on a GPU device, whose peak this does not measure).
    let peak = (train && !device.caps().is_gpu()).then(|| {
        peak::measure_peak(
            bench::baselines::host_threads(device.as_ref()),
            peak::PEAK_DURATION,
        )
    });
    let mut table = report::Table::for_cases(&cases);
    if peak.is_some() {
        table = table.with_peak_columns();
    }
    if !json {
        for line in report::header_lines(device.name(), device.backend(), &timing) {
            // The train cases have no memcpy baseline: their own note follows.
            if !(train && line.starts_with("baselines: memcpy")) {
                out!("{line}");
            }
        }
        if train {
            out!("{}", train_cases::BASELINE_NOTE);
        }
        if let Some(p) = &peak {
            for line in peak::header_lines(p) {
                out!("{line}");
            }
        }
        out!("{}", table.title());
    }
    bench::run_bench(device.as_ref(), cases, &timing, &mut |row| {
        let row = match &peak {
            Some(p) => row.clone().with_peak(p),
            None => row.clone(),
        };
        if json {
            out!("{}", report::json_line(&row));
        } else {
            out!("{}", table.line(&row));
        }
    })?;
    Ok(())
}

/// Refuses, on every rank alike, ranks started with different command lines (`mpirun -n 1 qforge
/// ... : -n 1 qforge ...` with other options): they would train into a mix of runs. One
/// all-gather of a hash of each rank's arguments.
fn same_command_line(comm: &dyn qforge::runtime::Communicator) -> Result<()> {
    use std::hash::{Hash, Hasher};
    if comm.size() == 1 {
        return Ok(());
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::env::args_os().skip(1).collect::<Vec<_>>().hash(&mut h);
    let all = comm.all_gather(&h.finish().to_le_bytes())?;
    let differ: Vec<usize> = all
        .chunks_exact(8)
        .enumerate()
        .filter(|(_, c)| *c != &all[..8])
        .map(|(r, _)| r)
        .collect();
    if differ.is_empty() {
        Ok(())
    } else {
        Err(Error::Usage(format!(
            "finetune: ranks {differ:?} were started with other arguments than rank 0: start \
             every rank with the same command line"
        )))
    }
}

/// The communicator of `--shards N`: none for 1, else this process's MPI world, which must
/// have `N` ranks.
fn data_parallel_ranks(shards: usize) -> Result<Option<Box<dyn qforge::runtime::Communicator>>> {
    if shards <= 1 {
        // Started by a launcher with several ranks but no --shards: each would train alone and
        // they would all write the same --out.
        let launched = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"]
            .iter()
            .find_map(|v| std::env::var(v).ok()?.parse::<usize>().ok())
            .filter(|n| *n > 1);
        return match (shards, launched) {
            (0, _) => Err(Error::Usage("finetune: --shards must be at least 1".into())),
            (_, Some(n)) => Err(Error::Usage(format!(
                "finetune: this process is one of {n} MPI ranks but --shards is 1: pass \
                 --shards {n} (and --micro-batches a multiple of {n})"
            ))),
            _ => Ok(None),
        };
    }
    #[cfg(feature = "mpi")]
    {
        use qforge::runtime::Communicator;
        let comm = qforge::runtime::collective::MpiCommunicator::init()?;
        if comm.size() != shards {
            return Err(Error::Usage(format!(
                "finetune: --shards {shards}, but this process is one of {} MPI ranks: start it \
                 as `mpirun -n {shards} qforge finetune --shards {shards} ...`",
                comm.size()
            )));
        }
        Ok(Some(Box::new(comm)))
    }
    #[cfg(not(feature = "mpi"))]
    Err(Error::Usage(format!(
        "finetune: --shards {shards} needs the MPI engine: build with `--features mpi` (Debian: \
         libopenmpi-dev) and start it with `mpirun -n {shards}`"
    )))
}

#[allow(clippy::too_many_arguments)]
fn finetune(
    model: Option<PathBuf>,
    layers: Vec<usize>,
    rank: usize,
    steps: u64,
    optimizer: &str,
    lr: f64,
    (micro_batches, shards): (usize, usize),
    out_dir: &std::path::Path,
    json: bool,
    device: &str,
) -> Result<()> {
    use qforge::finetune::{self, FinetuneOptions, FtOptimizer};
    use qforge::runtime::{Communicator, SingleRank};
    let options = FinetuneOptions {
        model,
        layers,
        rank,
        steps,
        optimizer: FtOptimizer::from_name(optimizer)?,
        lr,
        micro_batches,
        ..FinetuneOptions::default()
    };
    let ranks = data_parallel_ranks(shards)?;
    let comm: &dyn Communicator = ranks.as_deref().unwrap_or(&SingleRank);
    same_command_line(comm)?;
    // Rank 0 alone prints and writes; every rank computes the same result.
    let lead = comm.rank() == 0;
    // What may fail on some ranks only is agreed on before the first step, so that every rank
    // returns its error instead of leaving the others in a collective: the options, a bad --out
    // (found before the training, not after it), a device a machine lacks.
    let device = qforge::runtime::agree(
        comm,
        finetune::check_options(&options, comm.size())
            .and_then(|()| {
                if lead {
                    finetune::check_out_dir(out_dir)
                } else {
                    Ok(())
                }
            })
            .and_then(|()| {
                if lead {
                    start_device(device, false)
                } else {
                    Ok(open_device(device)?.0)
                }
            }),
    )?;
    let bar = indicatif::ProgressBar::new(steps);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} steps {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    if !lead {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let trained =
        finetune::run_data_parallel(device.as_ref(), comm, &options, |step, loss, beta| {
            if lead {
                bar.suspend(|| out!("step {step:>5}  loss {loss:.6e}  beta {beta:.4}"));
            }
            bar.inc(1);
        });
    let (report, merged) = match (trained, &ranks) {
        (Ok(t), _) => t,
        // A usage error is every rank's: one agreed on before training (a bad model or layer),
        // or a diverged loss (every rank computes the same loss). Each rank returns it.
        (Err(e @ Error::Usage(_)), _) => return Err(e),
        // Any other failing rank ends every rank (MPI_Abort): the others may be waiting in the
        // gradient all-reduce. Rank 0 has written nothing yet.
        (Err(e), Some(ranks)) => {
            error_line(&format!("error: rank {} of {shards}: {e}", ranks.rank()));
            ranks.abort(1)
        }
        (Err(e), _) => return Err(e),
    };
    bar.finish_and_clear();
    if !lead {
        return Ok(());
    }
    finetune::write_outputs(out_dir, &report, &merged)?;
    for line in report.table().lines() {
        out!("{line}");
    }
    out!(
        "wrote {}/loss.csv, loss.svg and merged.safetensors",
        out_dir.display()
    );
    if json {
        out!("{}", report.json());
    }
    Ok(())
}

/// Writes `bytes` to stdout; a closed pipe ends the process quietly, any other write error is
/// exit code 2.
fn write_stdout(bytes: &[u8]) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        Err(e) => {
            eprintln!("error: writing to stdout: {e}");
            std::process::exit(2);
        }
    }
}

fn compile(req: &compile_cmd::Request, output: Option<&std::path::Path>) -> Result<()> {
    // A binary target without -o is refused before compiling.
    let binary = matches!(req.target.as_str(), "cpu-obj" | "spirv");
    if binary && output.is_none() {
        return Err(Error::Usage(format!(
            "--target {} produces binary code: give an output file with -o",
            req.target
        )));
    }
    let artifact = compile_cmd::compile(req)?;
    match output {
        Some(out) => {
            let [code, manifest, qir] = compile_cmd::write(&artifact, out)?;
            out!(
                "kernel {} ({}): wrote {} ({} bytes), {} and {}",
                artifact.manifest.kernel,
                artifact.manifest.target,
                code.display(),
                artifact.code.bytes().len(),
                manifest.display(),
                qir.display()
            );
        }
        None => write_stdout(&artifact.code.bytes()),
    }
    Ok(())
}

fn list_kernels(filter: Option<&str>, json: bool) -> Result<()> {
    let listed = qforge::cli::list::list(filter);
    if let (Some(f), true) = (filter, listed.is_empty()) {
        return Err(Error::Usage(format!(
            "--filter '{f}' matches no library kernel name"
        )));
    }
    if json {
        out!("{}", qforge::cli::list::to_json(&listed));
    } else {
        for l in &listed {
            out!("{}", l.name);
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // An interrupted or terminated run removes the temporary outputs it was writing and exits
    // 130 (Ctrl-C) or 143 (SIGTERM): the real outputs are only ever created by a rename.
    if let Err(e) = qforge::cli::signals::install() {
        eprintln!(
            "warning: no signal handler ({e}): an interrupted run may leave .qforge-*.tmp files"
        );
    }
    let result = match cli.command {
        Command::Check {
            json,
            device,
            filter,
        } => check(json, device.as_deref(), filter.as_deref()).map(|ok| {
            if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }),
        Command::Quantize {
            input,
            output,
            quant_type,
            blocksize,
            double_quant,
            compute_dtype,
            quant_storage,
            skip,
            allow_nonfinite,
            max_shard_size,
            overwrite,
            chunk_elements,
            device,
        } => quantize(
            input,
            output,
            QuantizeArgs {
                quant_type,
                blocksize,
                double_quant,
                compute_dtype,
                quant_storage,
                skip,
                allow_nonfinite,
                max_shard_size,
                overwrite,
                chunk_elements,
            },
            &device,
        )
        .map(|_| ExitCode::SUCCESS),
        Command::Dequantize {
            input,
            output,
            dtype,
            max_shard_size,
            overwrite,
            chunk_elements,
            device,
        } => (|| {
            let opts = checkpoint::DequantizeOptions {
                dtype: dtype.as_deref().map(float_dtype).transpose()?,
                overwrite,
                max_shard_size: Some(checkpoint::emit::parse_size(&max_shard_size)?),
                chunk_elements,
            };
            let device = start_device(&device, true)?;
            let r = checkpoint::dequantize_model(device.as_ref(), &input, &output, &opts)?;
            out!(
                "{} weights restored, {} tensors copied; {} bytes; wrote {}",
                r.restored.len(),
                r.copied,
                r.bytes_after,
                output.display()
            );
            if let Some(c) = &r.config {
                out!("wrote {}", c.display());
            }
            if let Some(rss) = peak_rss() {
                out!("peak RSS {rss} bytes");
            }
            Ok(ExitCode::SUCCESS)
        })(),
        Command::Bench {
            json,
            suite,
            filter,
            device,
        } => bench(json, &suite, filter.as_deref(), &device).map(|_| ExitCode::SUCCESS),
        Command::Finetune {
            model,
            layers,
            rank,
            steps,
            optimizer,
            lr,
            micro_batches,
            shards,
            out,
            json,
            device,
        } => finetune(
            model,
            layers,
            rank,
            steps,
            &optimizer,
            lr,
            (micro_batches, shards),
            &out,
            json,
            &device,
        )
        .map(|_| ExitCode::SUCCESS),
        Command::Compile {
            file,
            kernel,
            target,
            feature_level,
            sm,
            dim,
            scalars,
            soft_math,
            no_bounds_checks,
            output,
        } => {
            let source = match (kernel, file) {
                (Some(name), _) => Source::Library(name),
                (None, Some(path)) => Source::File(path),
                // clap requires one of them.
                (None, None) => Source::Library(String::new()),
            };
            let req = compile_cmd::Request {
                source,
                target,
                feature_level,
                sm,
                dim,
                scalars,
                soft_math,
                no_bounds_checks,
            };
            compile(&req, output.as_deref()).map(|_| ExitCode::SUCCESS)
        }
        Command::Probe {
            what: _,
            results,
            seed,
        } => probe_bf16_dot(results, seed),
        Command::ListKernels { filter, json } => {
            list_kernels(filter.as_deref(), json).map(|_| ExitCode::SUCCESS)
        }
    };
    result.unwrap_or_else(|e: Error| {
        error_line(&format!("error: {e}"));
        ExitCode::from(2)
    })
}

/// Writes `line` and a newline to stderr in one write, so that the lines of ranks sharing a
/// terminal (`mpirun`) do not cut into each other.
fn error_line(line: &str) {
    use std::io::Write;
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
}
