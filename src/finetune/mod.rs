//! `qforge finetune`: trains serial bottleneck adapters (ZAdapter, AFA-LoRA) after the frozen
//! NF4 feed-forward blocks of a model so that each NF4 block reproduces its full-precision
//! output, anneals the activation to linear, and merges the adapters into `output.dense`.
//!
//! Per selected block `f(x) = W2 gelu(W1 x + b1) + b2`: inputs are rows of the model's token
//! embeddings (a training set and a disjoint held-out set); the target is `f` in `f32` (dense
//! product kernels), the base is `f` on NF4 weights through the fused 4-bit matmul, and the
//! adapter `y = h + up(act_beta(down(h)))` on the base output `h` is trained on the mean squared
//! error `mean((y - target)^2)` with the chosen optimizer, `beta` following an
//! [`AfaSchedule`]. Errors are the held-out relative RMS error `sqrt(sum (y - t)^2 / sum t^2)`
//! over all selected blocks.

mod grad_reduce;
mod model;
mod report;

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::time::Instant;

use qforge_ir::DType;
use qforge_kernels::activation::Act;
use qforge_kernels::adapter::{AfaSchedule, BottleneckAdapter};
use qforge_kernels::ops::{self, gemm, Layout};
use qforge_kernels::optim::{Optimizer, OptimizerKind, ParamGroup, QAdamWConfig};
use qforge_kernels::AdamHyper;
use qforge_kernels::StateBits;
use qforge_runtime::{Communicator, Device, HostTensor, ProfiledDevice, SingleRank};

pub use model::{Block, Linear, Model};
pub use report::FinetuneReport;

use crate::error::{Error, Result};

/// The optimizer of the adapter weights (AdamW, lr from the options, betas (0.9, 0.999), eps
/// 1e-8, no weight decay).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FtOptimizer {
    /// 4-bit AdamW, ZIP-SR recipe (NF4 m1, Dyn4 m2 with stochastic rounding in preconditioner
    /// space).
    Adamw4bitZipSr,
    /// 4-bit AdamW, ZE-EDEN recipe (NF4 m1, zero-exclusive Dyn4 m2 with EDEN scales).
    Adamw4bitZeEden,
    /// AdamW with 8-bit blockwise state (bitsandbytes `AdamW8bit`).
    Adamw8bit,
    /// AdamW with 32-bit state.
    Adamw,
}

impl FtOptimizer {
    /// The names accepted by `--optimizer`, in the order of the variants.
    pub const NAMES: [&'static str; 4] = [
        "adamw4bit-zip-sr",
        "adamw4bit-ze-eden",
        "adamw8bit",
        "adamw",
    ];

    /// The optimizer called `name`.
    ///
    /// # Errors
    /// [`Error::Usage`] listing the accepted names.
    pub fn from_name(name: &str) -> Result<FtOptimizer> {
        match name {
            "adamw4bit-zip-sr" => Ok(FtOptimizer::Adamw4bitZipSr),
            "adamw4bit-ze-eden" => Ok(FtOptimizer::Adamw4bitZeEden),
            "adamw8bit" => Ok(FtOptimizer::Adamw8bit),
            "adamw" => Ok(FtOptimizer::Adamw),
            other => Err(Error::Usage(format!(
                "unknown optimizer '{other}' (one of {})",
                FtOptimizer::NAMES.join(", ")
            ))),
        }
    }

    fn build(self, names: Vec<String>, lr: f64) -> Result<Optimizer> {
        let hyper = AdamHyper {
            lr,
            weight_decay: 0.0,
            ..AdamHyper::default()
        };
        let (kind, bits) = match self {
            FtOptimizer::Adamw4bitZipSr => (
                OptimizerKind::QAdamW(QAdamWConfig::zip_sr(hyper)),
                StateBits::Bits8,
            ),
            FtOptimizer::Adamw4bitZeEden => (
                OptimizerKind::QAdamW(QAdamWConfig::ze_eden(hyper)),
                StateBits::Bits8,
            ),
            FtOptimizer::Adamw8bit => (OptimizerKind::AdamW(hyper), StateBits::Bits8),
            FtOptimizer::Adamw => (OptimizerKind::AdamW(hyper), StateBits::Bits32),
        };
        Ok(Optimizer::new(vec![ParamGroup::new(names, kind, bits)])?)
    }
}

/// What to train.
#[derive(Clone, Debug)]
pub struct FinetuneOptions {
    /// A BERT-style `f32` safetensors checkpoint; `None`: the built-in synthetic model.
    pub model: Option<PathBuf>,
    /// Encoder layers whose FFN block gets an adapter.
    pub layers: Vec<usize>,
    /// Adapter rank `r`.
    pub rank: usize,
    /// Training steps.
    pub steps: u64,
    /// The optimizer.
    pub optimizer: FtOptimizer,
    /// Learning rate.
    pub lr: f64,
    /// Rows per step.
    pub batch: usize,
    /// Micro-batches per step (`batch` rows split evenly): the step's gradient is their
    /// gradients summed in micro-batch order, whatever the number of data-parallel ranks
    /// (`grad_reduce`); 1 is the whole batch at once.
    pub micro_batches: usize,
    /// Training and held-out rows.
    pub train_rows: usize,
    /// Held-out rows.
    pub eval_rows: usize,
    /// The adapter activation.
    pub act: Act,
    /// Seed of the adapter initialisation (and of the synthetic model).
    pub seed: u64,
}

impl Default for FinetuneOptions {
    /// The synthetic model, layer 0, rank 16, 200 steps of 4-bit AdamW (ZIP-SR) at lr 1e-3,
    /// batches of 64 of 1024 training rows, 256 held-out rows, GELU.
    fn default() -> Self {
        FinetuneOptions {
            model: None,
            layers: vec![0],
            rank: 16,
            steps: 200,
            optimizer: FtOptimizer::Adamw4bitZipSr,
            lr: 1e-3,
            batch: 64,
            micro_batches: 1,
            train_rows: 1024,
            eval_rows: 256,
            act: Act::Gelu,
            seed: 0,
        }
    }
}

/// One adapted layer after training: the trained adapter, and `output.dense` with the adapter
/// merged in (exact algebra at beta = 0, `BottleneckAdapter::merge_into`).
#[derive(Clone, Debug)]
pub struct MergedLayer {
    /// Encoder layer index.
    pub layer: usize,
    /// The trained adapter, unmerged (it ends linear: beta = 0 after the last step).
    pub adapter: BottleneckAdapter,
    /// The merged `output.dense.weight`, `[d, ff]` `f32`.
    pub weight: HostTensor,
    /// The merged `output.dense.bias`, `[d]` `f32`.
    pub bias: HostTensor,
}

/// One block's data: inputs, NF4 base outputs and full-precision targets.
struct Data {
    h: Vec<f32>,
    t: Vec<f32>,
}

impl Data {
    fn new(dev: &dyn Device, block: &Block, x: &HostTensor) -> Result<Data> {
        Ok(Data {
            h: block.forward(dev, x, true)?.to_f32()?,
            t: block.forward(dev, x, false)?.to_f32()?,
        })
    }
}

/// Rows `at..at + rows` (wrapping) of a row-major `[n, d]` array: borrowed where they do not
/// wrap.
fn rows_of(v: &[f32], d: usize, at: usize, rows: usize) -> Cow<'_, [f32]> {
    let n = v.len() / d;
    let first = at % n;
    if first + rows <= n {
        return Cow::Borrowed(&v[first * d..(first + rows) * d]);
    }
    let mut out = Vec::with_capacity(rows * d);
    for i in 0..rows {
        let r = (at + i) % n;
        out.extend_from_slice(&v[r * d..(r + 1) * d]);
    }
    Cow::Owned(out)
}

/// `f32 [rows, d]` from rows `at..at + rows` (wrapping) of a row-major `[n, d]` array.
fn batch_of(v: &[f32], d: usize, at: usize, rows: usize) -> Result<HostTensor> {
    Ok(HostTensor::from_f32_as(
        DType::F32,
        vec![rows, d],
        &rows_of(v, d, at, rows),
    )?)
}

/// `sum (y - t)^2` and `sum t^2` in f64.
fn squared(y: &[f32], t: &[f32]) -> (f64, f64) {
    y.iter().zip(t).fold((0.0, 0.0), |(e, s), (a, b)| {
        let diff = *a as f64 - *b as f64;
        (e + diff * diff, s + *b as f64 * *b as f64)
    })
}

/// `(names, tensors)` of the adapters' parameters, in one flat list.
fn params(adapters: &[(usize, BottleneckAdapter)]) -> (Vec<String>, Vec<HostTensor>) {
    let mut names = Vec::new();
    let mut tensors = Vec::new();
    for (layer, a) in adapters {
        for (n, t) in [
            ("down.weight", &a.down_weight),
            ("down.bias", &a.down_bias),
            ("up.weight", &a.up_weight),
            ("up.bias", &a.up_bias),
        ] {
            names.push(format!("encoder.layer.{layer}.adapter.{n}"));
            tensors.push(t.clone());
        }
    }
    (names, tensors)
}

/// The adapters back from the flat parameter list (four tensors a layer, as [`params`] lists
/// them), moved.
fn adapters_from(layers: &[usize], p: Vec<HostTensor>) -> Vec<(usize, BottleneckAdapter)> {
    let mut p = p.into_iter();
    layers
        .iter()
        .map_while(|l| {
            Some((
                *l,
                BottleneckAdapter {
                    down_weight: p.next()?,
                    down_bias: p.next()?,
                    up_weight: p.next()?,
                    up_bias: p.next()?,
                },
            ))
        })
        .collect()
}

/// The flat parameter list of `adapters` ([`params`]' order), moved.
fn into_params(adapters: Vec<(usize, BottleneckAdapter)>) -> Vec<HostTensor> {
    adapters
        .into_iter()
        .flat_map(|(_, a)| [a.down_weight, a.down_bias, a.up_weight, a.up_bias])
        .collect()
}

/// Held-out relative RMS error of `output(block_index, h)` against the targets.
fn rel_error(
    eval: &[Data],
    d: usize,
    mut output: impl FnMut(usize, &HostTensor) -> Result<Vec<f32>>,
) -> Result<f64> {
    let (mut e, mut s) = (0.0, 0.0);
    for (i, data) in eval.iter().enumerate() {
        let h = batch_of(&data.h, d, 0, data.h.len() / d)?;
        let (de, ds) = squared(&output(i, &h)?, &data.t);
        e += de;
        s += ds;
    }
    Ok((e / s.max(f64::MIN_POSITIVE)).sqrt())
}

/// Checks the options for `shards` data-parallel ranks (before any work; [`run_data_parallel`]
/// does it too).
///
/// # Errors
/// [`Error::Usage`] naming the bad option.
pub fn check_options(o: &FinetuneOptions, shards: usize) -> Result<()> {
    let bad = |m: String| Err(Error::Usage(m));
    if o.layers.is_empty() {
        return bad("finetune: --layers must name at least one layer".into());
    }
    for (i, l) in o.layers.iter().enumerate() {
        if o.layers[..i].contains(l) {
            return bad(format!("finetune: --layers names layer {l} twice"));
        }
    }
    if o.rank == 0 || o.rank > 4096 {
        return bad(format!("finetune: --rank must be 1..=4096, got {}", o.rank));
    }
    if o.steps == 0 || o.steps > 1_000_000 {
        return bad(format!(
            "finetune: --steps must be 1..=1000000, got {}",
            o.steps
        ));
    }
    if !(o.lr.is_finite() && o.lr > 0.0 && (o.lr as f32).is_finite()) {
        return bad(format!(
            "finetune: --lr must be a positive number within f32's range, got {}",
            o.lr
        ));
    }
    if o.batch == 0 || o.train_rows == 0 || o.eval_rows == 0 {
        return bad("finetune: batch, training rows and held-out rows must be at least 1".into());
    }
    if o.micro_batches == 0 || !o.batch.is_multiple_of(o.micro_batches) {
        return bad(format!(
            "finetune: --micro-batches must divide the batch of {} rows, got {}",
            o.batch, o.micro_batches
        ));
    }
    if !o.micro_batches.is_multiple_of(shards) {
        // A micro-batch count both dividing the batch and a multiple of the shards, if any.
        let hint = (shards..=o.batch)
            .step_by(shards.max(1))
            .find(|g| o.batch.is_multiple_of(*g))
            .map_or_else(
                || {
                    format!(
                        "no count does for a batch of {} rows: use a shard count dividing it",
                        o.batch
                    )
                },
                |g| format!("e.g. --micro-batches {g}"),
            );
        return bad(format!(
            "finetune: {shards} data-parallel shards must divide --micro-batches {} (each rank \
             computes whole micro-batches; {hint})",
            o.micro_batches
        ));
    }
    Ok(())
}

/// Runs the fine-tuning (see the module docs); `on_step(step, loss, beta)` is called after
/// every step.
///
/// # Errors
/// [`Error::Usage`] for bad options (no layers, rank 0, ...); checkpoint errors naming the file
/// and tensor; device errors.
pub fn run(
    dev: &dyn Device,
    o: &FinetuneOptions,
    on_step: impl FnMut(u64, f64, f32),
) -> Result<(FinetuneReport, Vec<MergedLayer>)> {
    run_data_parallel(dev, &SingleRank, o, on_step)
}

/// [`run`] as one of `comm.size()` data-parallel ranks: each step, this rank computes its share
/// of the micro-batches, the gradients are all-reduced in micro-batch order (`grad_reduce`) and
/// the optimizer step is sharded (`Optimizer::step_sharded`: each rank keeps the state of its
/// blocks, the parameters are all-gathered), so the result is bit-identical to [`run`] with the
/// same options, for any rank count dividing `micro_batches`. Every rank returns the same
/// report and merged layers (the caller writes them once).
///
/// # Errors
/// As [`run`], plus [`Error::Usage`] when the rank count does not divide `micro_batches`, and
/// the collective's errors (ranks started with different options).
pub fn run_data_parallel(
    dev: &dyn Device,
    comm: &dyn Communicator,
    o: &FinetuneOptions,
    mut on_step: impl FnMut(u64, f64, f32),
) -> Result<(FinetuneReport, Vec<MergedLayer>)> {
    check_options(o, comm.size())?;
    // `--layers` is a set: trained in ascending order (the optimizer's parameter order).
    let mut layers = o.layers.clone();
    layers.sort_unstable();
    // What may fail before training (the model file, its layers, the data) is agreed on by the
    // ranks: every rank returns the error (a usage error, exit code 2), none waits in a gather.
    let setup = || -> Result<_> {
        let model = match &o.model {
            Some(path) => Model::load(dev, path, &layers)?,
            None => Model::synthetic(dev, &layers, o.seed)?,
        };
        let d = model.d;
        let vocab = model.embeddings.len() / d;
        if o.train_rows + o.eval_rows > vocab {
            return Err(Error::Usage(format!(
                "finetune: {} training + {} held-out rows exceed the {vocab} embedding rows",
                o.train_rows, o.eval_rows
            )));
        }
        // A fixed permutation of the vocabulary (7919 is prime and does not divide the sizes used):
        // the first rows train, the next are held out.
        let stride = if vocab % 7919 == 0 { 1 } else { 7919 };
        let row = |i: usize| (i * stride + 13) % vocab;
        let train_x = model.rows(&(0..o.train_rows).map(row).collect::<Vec<_>>())?;
        let eval_x = model.rows(
            &(o.train_rows..o.train_rows + o.eval_rows)
                .map(row)
                .collect::<Vec<_>>(),
        )?;
        let mut train = Vec::new();
        let mut eval = Vec::new();
        for block in &model.blocks {
            train.push(Data::new(dev, block, &train_x)?);
            eval.push(Data::new(dev, block, &eval_x)?);
        }
        let layers: Vec<usize> = model.blocks.iter().map(|b| b.layer).collect();
        let mut adapters = Vec::new();
        // An adapter's seed follows its layer's index: `--layers` is a set, its order is moot.
        for l in &layers {
            let seed = o.seed.wrapping_add(1 + *l as u64);
            adapters.push((*l, BottleneckAdapter::new(d, o.rank, seed)?));
        }
        Ok((model, eval_x, train, eval, adapters))
    };
    let (model, eval_x, train, eval, adapters) =
        qforge_runtime::agree(comm, setup()).map_err(|e| match e {
            Error::Usage(_) => e,
            other => Error::Usage(other.to_string()),
        })?;
    let d = model.d;
    let layers: Vec<usize> = model.blocks.iter().map(|b| b.layer).collect();
    let schedule = AfaSchedule::new(o.steps);
    let err_before = rel_error(&eval, d, |i, h| {
        Ok(adapters[i].1.forward(dev, o.act, h, 1.0)?.0.to_f32()?)
    })?;
    let (names, mut p) = params(&adapters);
    let shapes: Vec<Vec<usize>> = p.iter().map(|t| t.shape.clone()).collect();
    let mut opt = o.optimizer.build(names, o.lr)?;
    let mut losses = Vec::with_capacity(o.steps as usize);
    // The steps run on a profiling wrapper: the report splits their time by kernel family.
    let step_dev = ProfiledDevice::new(dev);
    let started = Instant::now();
    for step in 0..o.steps {
        let dev: &dyn Device = &step_dev;
        let beta = schedule.beta(step);
        // The adapters own the parameters for the passes, the optimizer for its step.
        let current = adapters_from(&layers, std::mem::take(&mut p));
        let at = (step as usize * o.batch) % o.train_rows;
        let micro = o.batch / o.micro_batches;
        let per_rank = o.micro_batches / comm.size();
        let mut local = Vec::with_capacity(per_rank);
        for j in comm.rank() * per_rank..(comm.rank() + 1) * per_rank {
            let at = at + j * micro;
            let mut mb = grad_reduce::MicroGrad {
                sq: 0.0,
                grads: Vec::with_capacity(p.len()),
            };
            for (data, (_, a)) in train.iter().zip(&current) {
                let h = batch_of(&data.h, d, at, micro)?;
                let t = rows_of(&data.t, d, at, micro);
                let (y, cache) = a.forward(dev, o.act, &h, beta)?;
                let yv = y.to_f32()?;
                // The mean over the whole batch: micro-batch gradients add up to it.
                let scale = 2.0 / (o.batch * d * train.len()) as f32;
                let dy = yv
                    .iter()
                    .zip(t.iter())
                    .flat_map(|(a, b)| ((a - b) * scale).to_le_bytes())
                    .collect();
                mb.sq += squared(&yv, &t).0;
                let dy = HostTensor::new(DType::F32, y.shape.clone(), dy)?;
                let g = a.backward(dev, o.act, &h, &cache, &dy, beta)?;
                mb.grads
                    .extend([g.down_weight, g.down_bias, g.up_weight, g.up_bias]);
            }
            local.push(mb);
        }
        p = into_params(current);
        let (sq, grads) = grad_reduce::all_reduce_in_order(comm, &local, &shapes)?;
        let count = o.batch * d * train.len();
        let loss = sq / count as f64;
        if !loss.is_finite() {
            return Err(Error::Usage(format!(
                "finetune: the training loss is {loss} at step {step}: the training diverged \
                 (try a smaller --lr than {:e}) or the model's values overflow f32; nothing written",
                o.lr
            )));
        }
        // Data parallel: each rank keeps the optimizer state of its blocks only (the same bits).
        if comm.size() > 1 {
            opt.step_sharded(dev, comm, &mut p, &grads)?;
        } else {
            opt.step(dev, &mut p, &grads)?;
        }
        losses.push((loss, beta));
        on_step(step, loss, beta);
    }
    let seconds = started.elapsed().as_secs_f64();
    let step_split = report::StepSplit::new(&step_dev.profile(), seconds, o.steps);
    let trained = adapters_from(&layers, p.clone());
    let beta_end = schedule.beta(o.steps);
    let err_after = rel_error(&eval, d, |i, h| {
        Ok(trained[i].1.forward(dev, o.act, h, beta_end)?.0.to_f32()?)
    })?;
    if !err_after.is_finite() {
        return Err(Error::Usage(format!(
            "finetune: the held-out error after training is {err_after}: the training diverged \
             (try a smaller --lr than {:e}); nothing written",
            o.lr
        )));
    }
    // Merge into output.dense (dequantized), then evaluate the merged block from x.
    let mut merged = Vec::new();
    for (block, (layer, a)) in model.blocks.iter().zip(&trained) {
        let w = ops::dequantize_4bit(dev, &block.down.packed, &block.down.state)?;
        let (weight, bias) = a.merge_into(dev, &w, &block.down.bias)?;
        merged.push(MergedLayer {
            layer: *layer,
            adapter: a.clone(),
            weight,
            bias,
        });
    }
    let merged_block = |i: usize, requantize: bool| -> Result<Vec<f32>> {
        let block = &model.blocks[i];
        let (w2, b2) = (&merged[i].weight, &merged[i].bias);
        let up = ops::matmul_4bit(
            dev,
            &eval_x,
            &block.up.packed,
            &block.up.state,
            Some(&block.up.bias),
            None,
        )?;
        let g = ops::act_beta(dev, Act::Gelu, &up, 1.0)?;
        let y = if requantize {
            let (packed, state) =
                ops::quantize_4bit(dev, w2, ops::QuantType::Nf4, model::BLOCKSIZE, false)?;
            ops::matmul_4bit(dev, &g, &packed, &state, Some(b2), None)?
        } else {
            gemm(
                dev,
                (&g, Layout::RowMajor),
                (w2, Layout::RowMajor),
                Some(b2),
                None,
            )?
        };
        Ok(y.to_f32()?)
    };
    let err_merged = rel_error(&eval, d, |i, _| merged_block(i, false))?;
    let err_merged_nf4 = rel_error(&eval, d, |i, _| merged_block(i, true))?;
    opt.gather_state(comm)?;
    let report = FinetuneReport {
        layers: layers.len(),
        steps: o.steps,
        err_before,
        err_after,
        err_merged,
        err_merged_nf4,
        steps_per_s: o.steps as f64 / seconds.max(1e-9),
        step_split,
        optimizer_state_bytes: report::state_bytes(&opt.state_dict()?)?,
        weight_bytes: model
            .blocks
            .iter()
            .map(|b| b.up.nf4_bytes() + b.down.nf4_bytes())
            .sum(),
        adapter_bytes: p.iter().map(|t| t.data.len()).sum(),
        losses,
    };
    Ok((report, merged))
}

/// Checks, before any work, that `dir` can receive the outputs of [`write_outputs`]: it is a
/// folder (or does not exist yet and its nearest existing ancestor is a folder), a file can be
/// created in it (a probe file, removed at once), and no output name in it is taken by a
/// folder or anything else [`write_outputs`] would refuse to replace.
///
/// # Errors
/// [`Error::Usage`] naming `dir` and what is wrong with it.
pub fn check_out_dir(dir: &Path) -> Result<()> {
    let usage = |what: String| {
        Err(Error::Usage(format!(
            "finetune: --out {}: {what}",
            dir.display()
        )))
    };
    let existing = match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => dir.to_path_buf(),
        Ok(_) => return usage("exists and is not a folder".into()),
        // A link to nothing: creating the folder would fail after the training.
        Err(_) if std::fs::symlink_metadata(dir).is_ok() => {
            return usage("is a symbolic link to nothing (a dangling link)".into())
        }
        Err(_) => {
            let Some(up) = dir
                .ancestors()
                .skip(1)
                .map(|a| {
                    if a.as_os_str().is_empty() {
                        Path::new(".")
                    } else {
                        a
                    }
                })
                .find(|a| std::fs::symlink_metadata(a).is_ok())
            else {
                return usage("no part of the path exists".into());
            };
            if !up.is_dir() {
                return usage(format!("{} is not a folder", up.display()));
            }
            up.to_path_buf()
        }
    };
    if existing == dir {
        for name in OUTPUTS {
            crate::checkpoint::io::output_target(&dir.join(name))?;
        }
    }
    let probe = existing.join(format!(".qforge-probe-{}.tmp", std::process::id()));
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
    {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            Ok(())
        }
        Err(e) => usage(format!(
            "cannot create a file in {}: {e}",
            existing.display()
        )),
    }
}

/// The files [`write_outputs`] writes.
const OUTPUTS: [&str; 3] = ["loss.csv", "loss.svg", "merged.safetensors"];

/// Writes `loss.csv`, `loss.svg` and `merged.safetensors` into `dir` (created if needed), all
/// or nothing: each goes to a temporary file first, and only when all three are written are
/// they renamed into place. On a failure the temporary files and any folders this call created
/// are removed.
///
/// # Errors
/// [`Error::Io`] naming the file or folder; [`Error::Usage`] for an output name taken by a
/// folder or something else that must not be replaced.
pub fn write_outputs(dir: &Path, report: &FinetuneReport, merged: &[MergedLayer]) -> Result<()> {
    // The folders this call creates, deepest first (removed again on failure).
    let created: Vec<PathBuf> = dir
        .ancestors()
        .take_while(|a| !a.as_os_str().is_empty() && std::fs::symlink_metadata(a).is_err())
        .map(Path::to_path_buf)
        .collect();
    std::fs::create_dir_all(dir).map_err(|source| Error::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let written = (|| {
        let mut tensors = Vec::new();
        for m in merged {
            let layer = m.layer;
            tensors.push((
                format!("encoder.layer.{layer}.output.dense.weight"),
                &m.weight,
            ));
            tensors.push((format!("encoder.layer.{layer}.output.dense.bias"), &m.bias));
        }
        let [csv, svg, st] = OUTPUTS.map(|n| dir.join(n));
        crate::checkpoint::io::write_files_atomic(&[
            (csv, report.csv().into_bytes()),
            (svg, report.svg().into_bytes()),
            (st, report::safetensors(&tensors)?),
        ])
    })();
    if written.is_err() {
        for folder in &created {
            let _ = std::fs::remove_dir(folder);
        }
    }
    written
}

#[cfg(test)]
mod tests {
    use super::{adapters_from, into_params, rows_of};
    use qforge_ir::DType;
    use qforge_runtime::HostTensor;
    use std::borrow::Cow;

    /// Rows that do not wrap are borrowed, rows that do are copied in order: both as the row
    /// `(at + i) % n` loop gives them.
    #[test]
    fn rows_of_is_the_wrapping_row_loop() {
        let (n, d) = (5, 3);
        let v: Vec<f32> = (0..n * d).map(|i| i as f32).collect();
        for (at, rows) in [
            (0, 5),
            (1, 3),
            (2, 3),
            (3, 3),
            (4, 1),
            (4, 5),
            (7, 2),
            (9, 4),
        ] {
            let want: Vec<f32> = (0..rows)
                .flat_map(|i| v[(at + i) % n * d..((at + i) % n + 1) * d].to_vec())
                .collect();
            let got = rows_of(&v, d, at, rows);
            assert_eq!(*got, want[..], "at {at}, {rows} rows");
            let wraps = at % n + rows > n;
            assert_eq!(matches!(got, Cow::Owned(_)), wraps, "at {at}, {rows} rows");
        }
    }

    /// The flat parameter list and the adapters move into each other without a change.
    #[test]
    fn adapters_and_params_round_trip() {
        let p: Vec<HostTensor> = (0..8)
            .map(|i| HostTensor::from_f32_as(DType::F32, vec![i + 1], &vec![i as f32; i + 1]))
            .collect::<Result<_, _>>()
            .unwrap();
        let adapters = adapters_from(&[3, 5], p.clone());
        assert_eq!(adapters.len(), 2);
        assert_eq!((adapters[0].0, adapters[1].0), (3, 5));
        assert_eq!(adapters[1].1.down_bias, p[5]);
        assert_eq!(into_params(adapters), p);
    }
}
