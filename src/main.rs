//! The `qforge` command line: `check`, `quantize`, `dequantize`, `bench`, `finetune`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use qforge::checkpoint::{self, QuantizeOptions, WeightFormat};
use qforge::cli::check::{run_check, CheckRow};
use qforge::devices::{available_devices, device_by_name};
use qforge::ir::DType;
use qforge::{Error, Result};

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
        /// Run only on this device (cpu, interpreter, cpu-llvm, wgpu or cuda with their features); a
        /// device that cannot start is an error (exit code 2). Default: every device that can.
        #[arg(long)]
        device: Option<String>,
    },
    /// Quantize the 2-D float `.weight` tensors of a safetensors checkpoint (bitsandbytes 4-bit
    /// layout that transformers loads, or 8-bit blockwise); other tensors are copied.
    Quantize {
        /// Input safetensors file.
        input: PathBuf,
        /// Output safetensors file (must differ from the input).
        #[arg(short, long)]
        output: PathBuf,
        /// nf4, fp4 or int8-blockwise.
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
        /// Regex of weight names to leave unquantized.
        #[arg(long, default_value = checkpoint::DEFAULT_SKIP)]
        skip: String,
        /// Quantize weights that contain NaN or inf instead of refusing.
        #[arg(long)]
        allow_nonfinite: bool,
        /// Device: cpu, interpreter, cpu-llvm (`llvm` feature), wgpu (`wgpu` feature) or cuda (`cuda` feature).
        #[arg(long, default_value = "cpu")]
        device: String,
    },
    /// Restore full-precision weights from a checkpoint written by `qforge quantize`.
    Dequantize {
        /// Input safetensors file.
        input: PathBuf,
        /// Output safetensors file (must differ from the input).
        #[arg(short, long)]
        output: PathBuf,
        /// Output dtype f32, f16 or bf16 (default: each weight's original dtype).
        #[arg(long)]
        dtype: Option<String>,
        /// Device: cpu, interpreter, cpu-llvm (`llvm` feature), wgpu (`wgpu` feature) or cuda (`cuda` feature).
        #[arg(long, default_value = "cpu")]
        device: String,
    },
    /// Quick benchmark of the library kernels (about half a minute on 2 cores): one line per kernel, shape
    /// and baseline with the median time, bytes/s and the ratio baseline time / kernel time.
    Bench {
        /// Print JSON lines instead of a table.
        #[arg(long)]
        json: bool,
        /// Keep only the cases whose kernel name contains this string.
        #[arg(long)]
        filter: Option<String>,
        /// Device: cpu, interpreter (cases scaled down), cpu-llvm (`llvm` feature), wgpu (`wgpu`
        /// feature) or cuda (`cuda` feature).
        #[arg(long, default_value = "cpu")]
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
        /// Folder for loss.csv, loss.svg and merged.safetensors.
        #[arg(long, default_value = "finetune-out")]
        out: PathBuf,
        /// Print the summary as one JSON line (the last line printed).
        #[arg(long)]
        json: bool,
        /// Device: cpu, interpreter, cpu-llvm (`llvm` feature), wgpu (`wgpu` feature) or cuda (`cuda` feature).
        #[arg(long, default_value = "cpu")]
        device: String,
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

fn check(json: bool, device: Option<&str>) -> Result<bool> {
    let (devices, unavailable) = match device {
        // The interpreter is the reference every row is compared with: nothing else to run.
        Some("interpreter") => (Vec::new(), Vec::new()),
        Some(name) => (vec![device_by_name(name)?], Vec::new()),
        None => available_devices(),
    };
    let mut on_row = |r: &CheckRow| {
        if json {
            out!("{}", r.to_json());
        }
    };
    let rows = run_check(&devices, &unavailable, &mut on_row)?;
    let failed = rows.iter().filter(|r| r.status == "mismatch").count();
    if !json {
        let mut backends: Vec<&str> = Vec::new();
        for r in &rows {
            if !backends.contains(&r.backend.as_str()) {
                backends.push(&r.backend);
            }
        }
        let width = rows.iter().map(|r| r.kernel.len()).max().unwrap_or(6);
        let mut header = format!("{:width$}", "kernel");
        for b in &backends {
            header += &format!("  {b:>14}");
        }
        out!("{header}");
        let mut kernels: Vec<&str> = rows.iter().map(|r| r.kernel.as_str()).collect();
        kernels.dedup();
        for k in kernels {
            let mut line = format!("{k:width$}");
            for b in &backends {
                let cell = match rows.iter().find(|r| r.kernel == k && r.backend == *b) {
                    Some(r) if r.status == "exact" => "bit-exact".to_string(),
                    Some(r) if generated_only(r) => "generated".to_string(),
                    Some(r) if r.status == "skipped" => "not runnable".to_string(),
                    Some(r) if r.reason.is_some() => "error".to_string(),
                    Some(r) => format!("{} mismatches", r.mismatches),
                    None => "not built".to_string(),
                };
                line += &format!("  {cell:>14}");
            }
            out!("{line}");
        }
        for r in rows
            .iter()
            .filter(|r| r.status == "mismatch" && r.reason.is_some())
        {
            out!(
                "{} on {}: {}",
                r.kernel,
                r.backend,
                r.reason.as_deref().unwrap_or("")
            );
        }
        for u in &unavailable {
            out!("{}: not runnable here: {}", u.backend, u.reason);
        }
        let kernels = rows.iter().filter(|r| r.backend == "interpreter").count();
        let compared: Vec<&CheckRow> = rows.iter().filter(|r| r.backend != "interpreter").collect();
        let exact = compared.iter().filter(|r| r.status == "exact").count();
        let generated = compared.iter().filter(|r| generated_only(r)).count();
        let skipped = compared.iter().filter(|r| r.status == "skipped").count() - generated;
        out!("{kernels} kernels on {} backend(s) besides the interpreter: {exact} bit-exact, {failed} mismatching, {generated} code generated only (no device here to run it), {skipped} not runnable", backends.len() - 1);
    }
    Ok(failed == 0)
}

/// A row whose code generated (and, for WGSL, validated) but had no device here to run on.
fn generated_only(r: &CheckRow) -> bool {
    r.status == "skipped"
        && r.reason
            .as_deref()
            .is_some_and(|m| m.starts_with("code generated"))
}

#[allow(clippy::too_many_arguments)]
fn quantize(
    input: PathBuf,
    output: PathBuf,
    quant_type: &str,
    blocksize: Option<usize>,
    double_quant: bool,
    compute_dtype: &str,
    skip: &str,
    allow_nonfinite: bool,
    device: &str,
) -> Result<()> {
    let format = WeightFormat::from_name(quant_type).ok_or_else(|| {
        Error::Usage(format!(
            "unsupported quant type '{quant_type}' (nf4, fp4, int8-blockwise)"
        ))
    })?;
    let skip = regex::Regex::new(skip).map_err(|e| {
        let detail = e
            .to_string()
            .lines()
            .rfind(|l| !l.trim().is_empty())
            .unwrap_or("")
            .trim()
            .to_string();
        Error::Usage(format!("--skip '{skip}' is not a valid regex: {detail}"))
    })?;
    let opts = QuantizeOptions {
        format,
        blocksize: blocksize.unwrap_or(format.default_blocksize()),
        double_quant,
        compute_dtype: float_dtype(compute_dtype)?,
        skip,
        allow_nonfinite,
    };
    let device = device_by_name(device)?;
    let size = std::fs::metadata(&input).map(|m| m.len()).unwrap_or(0);
    let bar = (size > 100 << 20).then(|| indicatif::ProgressBar::new(0));
    let mut progress = |done: usize, total: usize| {
        if let Some(bar) = &bar {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
        }
    };
    let report = checkpoint::quantize_file(device.as_ref(), &input, &output, &opts, &mut progress)?;
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
        "{} tensors quantized, {} copied; {} -> {} bytes ({:.2}x smaller); wrote {}",
        report.tensors.len(),
        report.copied,
        report.bytes_before,
        report.bytes_after,
        report.bytes_before as f64 / report.bytes_after.max(1) as f64,
        output.display()
    );
    if let Some(c) = &report.config {
        out!("wrote {}", c.display());
    }
    for n in &report.notes {
        out!("note: {n}");
    }
    Ok(())
}

fn bench(json: bool, filter: Option<&str>, device: &str) -> Result<()> {
    use qforge::bench::{self, cases, report};
    let device = device_by_name(device)?;
    // The cases build their inputs on their first (warm-up) run: listing and filtering is cheap.
    let size = cases::CaseSize::for_backend(device.backend());
    let cases = bench::filter_cases(cases::cases(size)?, filter)?;
    let timing = bench::Timing::QUICK;
    let table = report::Table::for_cases(&cases);
    if !json {
        for line in report::header_lines(device.name(), device.backend(), &timing) {
            out!("{line}");
        }
        out!("{}", table.title());
    }
    bench::run_bench(device.as_ref(), cases, &timing, &mut |row| {
        if json {
            out!("{}", report::json_line(row));
        } else {
            out!("{}", table.line(row));
        }
    })?;
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn finetune(
    model: Option<PathBuf>,
    layers: Vec<usize>,
    rank: usize,
    steps: u64,
    optimizer: &str,
    lr: f64,
    out_dir: &std::path::Path,
    json: bool,
    device: &str,
) -> Result<()> {
    use qforge::finetune::{self, FinetuneOptions, FtOptimizer};
    let options = FinetuneOptions {
        model,
        layers,
        rank,
        steps,
        optimizer: FtOptimizer::from_name(optimizer)?,
        lr,
        ..FinetuneOptions::default()
    };
    // A bad --out is found before the training, not after it.
    finetune::check_out_dir(out_dir)?;
    let device = device_by_name(device)?;
    let bar = indicatif::ProgressBar::new(steps);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} steps {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let (report, merged) = finetune::run(device.as_ref(), &options, |step, loss, beta| {
        bar.suspend(|| out!("step {step:>5}  loss {loss:.6e}  beta {beta:.4}"));
        bar.inc(1);
    })?;
    bar.finish_and_clear();
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    // An interrupted run removes the temporary output it was writing (the real output is only
    // ever created by a rename, so nothing partial is left).
    let _ = ctrlc::set_handler(|| {
        qforge::checkpoint::io::remove_pending_temps();
        eprintln!("error: interrupted; no output written");
        std::process::exit(130);
    });
    let result = match cli.command {
        Command::Check { json, device } => check(json, device.as_deref()).map(|ok| {
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
            skip,
            allow_nonfinite,
            device,
        } => quantize(
            input,
            output,
            &quant_type,
            blocksize,
            double_quant,
            &compute_dtype,
            &skip,
            allow_nonfinite,
            &device,
        )
        .map(|_| ExitCode::SUCCESS),
        Command::Dequantize {
            input,
            output,
            dtype,
            device,
        } => (|| {
            let dtype = dtype.as_deref().map(float_dtype).transpose()?;
            let device = device_by_name(&device)?;
            let r = checkpoint::dequantize_file(device.as_ref(), &input, &output, dtype)?;
            out!(
                "{} weights restored, {} tensors copied; wrote {}",
                r.restored.len(),
                r.copied,
                output.display()
            );
            Ok(ExitCode::SUCCESS)
        })(),
        Command::Bench {
            json,
            filter,
            device,
        } => bench(json, filter.as_deref(), &device).map(|_| ExitCode::SUCCESS),
        Command::Finetune {
            model,
            layers,
            rank,
            steps,
            optimizer,
            lr,
            out,
            json,
            device,
        } => finetune(
            model, layers, rank, steps, &optimizer, lr, &out, json, &device,
        )
        .map(|_| ExitCode::SUCCESS),
    };
    result.unwrap_or_else(|e: Error| {
        eprintln!("error: {e}");
        ExitCode::from(2)
    })
}
