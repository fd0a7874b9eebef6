//! The frozen blocks `qforge finetune` trains adapters on: a BERT feed-forward block
//! `f(x) = W2 gelu(W1 x + b1) + b2` (`intermediate.dense`, GELU, `output.dense`) kept in full
//! precision (the target) and in NF4 (the frozen base, run through the fused 4-bit matmul), with
//! inputs drawn from the model's own token embeddings.

use std::path::Path;

use qforge_ir::DType;
use qforge_kernels::activation::Act;
use qforge_kernels::adapter::normal_f32;
use qforge_kernels::ops::{self, gemm, Layout, QuantState4, QuantType};
use qforge_runtime::{Device, HostTensor};
use safetensors::SafeTensors;

use crate::error::{Error, Result};

/// NF4 blocksize of the frozen weights (bitsandbytes' default).
pub const BLOCKSIZE: usize = 64;

/// One linear layer, full precision and NF4.
pub struct Linear {
    /// `[out, in]` `f32`.
    pub weight: HostTensor,
    /// `[out]` `f32`.
    pub bias: HostTensor,
    /// NF4 codes of `weight`.
    pub packed: Vec<u8>,
    /// Their quant state.
    pub state: QuantState4,
}

impl Linear {
    fn new(dev: &dyn Device, weight: HostTensor, bias: HostTensor) -> Result<Linear> {
        let (packed, state) = ops::quantize_4bit(dev, &weight, QuantType::Nf4, BLOCKSIZE, false)?;
        Ok(Linear {
            weight,
            bias,
            packed,
            state,
        })
    }

    /// `x @ W.T + b` in full precision.
    fn full(&self, dev: &dyn Device, x: &HostTensor) -> Result<HostTensor> {
        let n = Layout::RowMajor;
        Ok(gemm(
            dev,
            (x, n),
            (&self.weight, n),
            Some(&self.bias),
            None,
        )?)
    }

    /// `x @ dequant(W).T + b` with the fused NF4 kernel.
    fn nf4(&self, dev: &dyn Device, x: &HostTensor) -> Result<HostTensor> {
        Ok(ops::matmul_4bit(
            dev,
            x,
            &self.packed,
            &self.state,
            Some(&self.bias),
            None,
        )?)
    }

    /// Bytes of the NF4 weight (codes and `f32` absmax).
    pub fn nf4_bytes(&self) -> usize {
        self.packed.len()
            + 4 * self
                .state
                .shape
                .iter()
                .product::<usize>()
                .div_ceil(BLOCKSIZE)
    }
}

/// One feed-forward block.
pub struct Block {
    /// Its layer index (0 for the synthetic model).
    pub layer: usize,
    /// `intermediate.dense`.
    pub up: Linear,
    /// `output.dense`.
    pub down: Linear,
}

impl Block {
    /// The block's output in full precision (`nf4 = false`) or on the NF4 base.
    pub fn forward(&self, dev: &dyn Device, x: &HostTensor, nf4: bool) -> Result<HostTensor> {
        let run = |l: &Linear, x: &HostTensor| if nf4 { l.nf4(dev, x) } else { l.full(dev, x) };
        let g = ops::act_beta(dev, Act::Gelu, &run(&self.up, x)?, 1.0)?;
        run(&self.down, &g)
    }
}

/// Encoder layers of the built-in synthetic model (as many as all-MiniLM-L6-v2 has).
pub const SYNTHETIC_LAYERS: usize = 6;

/// The frozen model: blocks and the token embeddings their inputs come from.
pub struct Model {
    /// Selected blocks, in the order asked.
    pub blocks: Vec<Block>,
    /// `[vocab, d]` `f32` rows.
    pub embeddings: Vec<f32>,
    /// Width `d`.
    pub d: usize,
}

fn tensor_error(path: &Path, name: &str, message: String) -> Error {
    Error::Tensor {
        path: path.to_path_buf(),
        tensor: name.to_string(),
        message,
    }
}

fn tensor(st: &SafeTensors, path: &Path, name: &str) -> Result<HostTensor> {
    let view = st
        .tensor(name)
        .map_err(|e| tensor_error(path, name, format!("missing or unreadable: {e}")))?;
    if view.dtype() != safetensors::Dtype::F32 {
        return Err(tensor_error(
            path,
            name,
            format!("is {:?}, finetune needs an f32 checkpoint", view.dtype()),
        ));
    }
    let values = view
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
    if let Some((i, v)) = values.enumerate().find(|(_, v)| !v.is_finite()) {
        return Err(tensor_error(
            path,
            name,
            format!("has a non-finite value {v} at flat index {i}; finetune needs finite values"),
        ));
    }
    Ok(HostTensor::new(
        DType::F32,
        view.shape().to_vec(),
        view.data().to_vec(),
    )?)
}

/// The encoder layers of a checkpoint (`encoder.layer.{i}.`), sorted, for error messages.
fn encoder_layers(st: &SafeTensors) -> Vec<usize> {
    let mut layers: Vec<usize> = st
        .names()
        .iter()
        .filter_map(|n| {
            n.strip_prefix("encoder.layer.")?
                .split('.')
                .next()?
                .parse()
                .ok()
        })
        .collect();
    layers.sort_unstable();
    layers.dedup();
    layers
}

impl Model {
    /// The FFN blocks `layers` of a BERT-style `f32` safetensors checkpoint
    /// (`encoder.layer.{i}.intermediate.dense` / `output.dense`,
    /// `embeddings.word_embeddings.weight`), weights quantized to NF4 on `dev`.
    ///
    /// # Errors
    /// [`Error::Tensor`] naming the file and tensor for a missing, empty or non-`f32` tensor,
    /// one with a NaN or infinite value, a layer the checkpoint does not have, or shapes that
    /// do not chain; [`Error::Safetensors`] for a file that is not safetensors; I/O and device
    /// errors.
    pub fn load(dev: &dyn Device, path: &Path, layers: &[usize]) -> Result<Model> {
        let bytes = std::fs::read(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let st = SafeTensors::deserialize(&bytes).map_err(|e| Error::Safetensors {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        const EMB: &str = "embeddings.word_embeddings.weight";
        let emb = tensor(&st, path, EMB)?;
        let [vocab, d] = emb.shape[..] else {
            return Err(tensor_error(
                path,
                EMB,
                format!("must be 2-D, got {:?}", emb.shape),
            ));
        };
        if vocab == 0 || d == 0 {
            return Err(tensor_error(
                path,
                EMB,
                format!("is empty (shape {:?})", emb.shape),
            ));
        }
        let available = encoder_layers(&st);
        let mut blocks = Vec::new();
        for &layer in layers {
            let p = |s: &str| format!("encoder.layer.{layer}.{s}");
            let get = |s: &str| tensor(&st, path, &p(s));
            if !available.contains(&layer) {
                let list: Vec<String> = available.iter().map(|l| l.to_string()).collect();
                return Err(tensor_error(
                    path,
                    &p("intermediate.dense.weight"),
                    format!(
                        "missing: --layers {layer} is not an encoder layer of this checkpoint \
                         (it has layers [{}])",
                        list.join(", ")
                    ),
                ));
            }
            let (w1, b1) = (
                get("intermediate.dense.weight")?,
                get("intermediate.dense.bias")?,
            );
            let (w2, b2) = (get("output.dense.weight")?, get("output.dense.bias")?);
            let ff = w1.shape.first().copied().unwrap_or(0);
            if ff == 0
                || w1.shape != [ff, d]
                || w2.shape != [d, ff]
                || b1.shape != [ff]
                || b2.shape != [d]
            {
                return Err(tensor_error(
                    path,
                    &p("output.dense.weight"),
                    format!(
                        "FFN shapes {:?}, {:?}, {:?}, {:?} do not chain with d = {d}",
                        w1.shape, b1.shape, w2.shape, b2.shape
                    ),
                ));
            }
            blocks.push(Block {
                layer,
                up: Linear::new(dev, w1, b1)?,
                down: Linear::new(dev, w2, b2)?,
            });
        }
        Ok(Model {
            blocks,
            embeddings: emb.to_f32()?,
            d,
        })
    }

    /// A small synthetic model of [`SYNTHETIC_LAYERS`] encoder layers (`d = 64`, `ff = 256`,
    /// 2048 embedding rows, `N(0, 0.05^2)` weights and `N(0, 1)` embeddings from `seed`) with one
    /// block per entry of `layers`.
    ///
    /// # Errors
    /// [`Error::Usage`] for a layer it does not have (`--layers 99` without `--model`); device
    /// errors.
    pub fn synthetic(dev: &dyn Device, layers: &[usize], seed: u64) -> Result<Model> {
        if let Some(l) = layers.iter().find(|&&l| l >= SYNTHETIC_LAYERS) {
            return Err(crate::Error::Usage(format!(
                "finetune: the built-in synthetic model has layers 0..={}; --layers {l} needs \
                 --model with a checkpoint that has it",
                SYNTHETIC_LAYERS - 1
            )));
        }
        let (d, ff, vocab) = (64usize, 256usize, 2048usize);
        let t = |shape: Vec<usize>, std: f64, s: u64| -> Result<HostTensor> {
            let n = shape.iter().product();
            Ok(HostTensor::from_f32_as(
                DType::F32,
                shape,
                &normal_f32(n, std, s),
            )?)
        };
        let mut blocks = Vec::new();
        // A layer's weights follow its index, not its place in `layers`.
        for &layer in layers {
            let s = seed.wrapping_add(16 * (layer as u64 + 1));
            blocks.push(Block {
                layer,
                up: Linear::new(dev, t(vec![ff, d], 0.05, s)?, t(vec![ff], 0.05, s + 1)?)?,
                down: Linear::new(dev, t(vec![d, ff], 0.05, s + 2)?, t(vec![d], 0.05, s + 3)?)?,
            });
        }
        Ok(Model {
            blocks,
            embeddings: normal_f32(vocab * d, 1.0, seed),
            d,
        })
    }

    /// Embedding rows `rows` as an `f32 [rows.len(), d]` tensor.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a row past the vocabulary.
    pub fn rows(&self, rows: &[usize]) -> Result<HostTensor> {
        let vocab = self.embeddings.len() / self.d;
        let mut v = Vec::with_capacity(rows.len() * self.d);
        for &r in rows {
            if r >= vocab {
                return Err(Error::Usage(format!(
                    "finetune: embedding row {r} is past the vocabulary of {vocab}"
                )));
            }
            v.extend_from_slice(&self.embeddings[r * self.d..(r + 1) * self.d]);
        }
        Ok(HostTensor::from_f32_as(
            DType::F32,
            vec![rows.len(), self.d],
            &v,
        )?)
    }
}
