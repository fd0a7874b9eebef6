//! What `qforge finetune` reports and writes: the final table, the JSON line, `loss.csv`, an SVG
//! loss curve and the merged weights.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use qforge_runtime::HostTensor;
use safetensors::{Dtype, SafeTensors};

use crate::checkpoint::io::{self, RawTensor};
use crate::error::{Error, Result};

/// The outcome of a run. Errors are held-out relative RMS errors of the block output against
/// the full-precision block.
#[derive(Clone, Debug, PartialEq)]
pub struct FinetuneReport {
    /// Blocks trained.
    pub layers: usize,
    /// Training steps.
    pub steps: u64,
    /// NF4 blocks without adapters (fresh adapters are the identity).
    pub err_before: f64,
    /// NF4 blocks with the trained adapters at the final `beta`.
    pub err_after: f64,
    /// The adapters merged into full-precision `output.dense` weights.
    pub err_merged: f64,
    /// The merged weights quantized again to NF4.
    pub err_merged_nf4: f64,
    /// Training steps per second (wall clock).
    pub steps_per_s: f64,
    /// Bytes of optimizer state (tensor data of `state_dict`).
    pub optimizer_state_bytes: usize,
    /// Bytes of the frozen NF4 weights (codes and absmax).
    pub weight_bytes: usize,
    /// Bytes of the adapters' `f32` weights and biases.
    pub adapter_bytes: usize,
    /// `(mean squared error, beta)` of each step.
    pub losses: Vec<(f64, f32)>,
}

/// Total bytes of tensor data in a safetensors buffer.
///
/// # Errors
/// [`Error::Safetensors`] for a malformed buffer.
pub fn state_bytes(bytes: &[u8]) -> Result<usize> {
    let st = SafeTensors::deserialize(bytes).map_err(|e| Error::Safetensors {
        path: PathBuf::from("<optimizer state>"),
        message: e.to_string(),
    })?;
    Ok(st.tensors().iter().map(|(_, v)| v.data().len()).sum())
}

/// The `f32` tensors as a safetensors buffer.
pub(super) fn safetensors(tensors: &[(String, &HostTensor)]) -> Result<Vec<u8>> {
    let raw: Vec<(String, RawTensor<'_>)> = tensors
        .iter()
        .map(|(n, t)| {
            (
                n.clone(),
                RawTensor {
                    dtype: Dtype::F32,
                    shape: t.shape.clone(),
                    data: Cow::Borrowed(&t.data),
                },
            )
        })
        .collect();
    io::serialize(&raw, &None, Path::new("merged.safetensors"))
}

impl FinetuneReport {
    /// `step,loss,beta` lines with a header.
    pub fn csv(&self) -> String {
        let mut s = String::from("step,loss,beta\n");
        for (i, (loss, beta)) in self.losses.iter().enumerate() {
            let _ = writeln!(s, "{i},{loss:e},{beta}");
        }
        s
    }

    /// The loss curve (log scale) and `beta` as a standalone SVG.
    pub fn svg(&self) -> String {
        let (w, h, m) = (640.0f64, 360.0f64, 48.0f64);
        let logs: Vec<f64> = self
            .losses
            .iter()
            .map(|(l, _)| l.max(f64::MIN_POSITIVE).log10())
            .collect();
        let (lo, hi) = logs
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
                (a.min(*v), b.max(*v))
            });
        let span = (hi - lo).max(1e-9);
        let n = self.losses.len().max(2) as f64 - 1.0;
        let x = |i: usize| m + (w - 2.0 * m) * i as f64 / n;
        let y = |v: f64| h - m - (h - 2.0 * m) * v;
        let loss_pts: Vec<String> = logs
            .iter()
            .enumerate()
            .map(|(i, v)| format!("{:.1},{:.1}", x(i), y((v - lo) / span)))
            .collect();
        let beta_pts: Vec<String> = self
            .losses
            .iter()
            .enumerate()
            .map(|(i, (_, b))| format!("{:.1},{:.1}", x(i), y(*b as f64)))
            .collect();
        format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" \
             font-family=\"sans-serif\" font-size=\"12\">\n\
             <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
             <text x=\"{m}\" y=\"20\">qforge finetune: training loss (MSE, log10 {lo:.2} to {hi:.2}, blue) and AFA beta (0 to 1, orange)</text>\n\
             <line x1=\"{m}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"black\"/>\n\
             <line x1=\"{m}\" y1=\"{m}\" x2=\"{m}\" y2=\"{b}\" stroke=\"black\"/>\n\
             <text x=\"{r}\" y=\"{t}\" text-anchor=\"end\">step {steps}</text>\n\
             <polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"{loss}\"/>\n\
             <polyline fill=\"none\" stroke=\"#ff7f0e\" stroke-width=\"1\" points=\"{beta}\"/>\n\
             </svg>\n",
            b = h - m,
            r = w - m,
            t = h - m + 16.0,
            steps = self.steps,
            loss = loss_pts.join(" "),
            beta = beta_pts.join(" "),
        )
    }

    /// The final table.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "held-out relative RMS error of the block output vs fp32:"
        );
        for (what, v) in [
            ("NF4 base, before training", self.err_before),
            ("NF4 base + adapter, after training", self.err_after),
            ("adapter merged (f32 output.dense)", self.err_merged),
            ("merged, re-quantized to NF4", self.err_merged_nf4),
        ] {
            let _ = writeln!(s, "  {what:<36} {v:.6}");
        }
        let _ = writeln!(
            s,
            "memory: NF4 weights {} bytes, adapters {} bytes, optimizer state {} bytes",
            self.weight_bytes, self.adapter_bytes, self.optimizer_state_bytes
        );
        let _ = writeln!(s, "speed: {:.1} steps/s", self.steps_per_s);
        s
    }

    /// The JSON summary line.
    pub fn json(&self) -> String {
        serde_json::json!({
            "layers": self.layers,
            "steps": self.steps,
            "err_before": self.err_before,
            "err_after": self.err_after,
            "err_merged": self.err_merged,
            "steps_per_s": self.steps_per_s,
            "optimizer_state_bytes": self.optimizer_state_bytes,
            "err_merged_nf4": self.err_merged_nf4,
            "weight_bytes": self.weight_bytes,
            "adapter_bytes": self.adapter_bytes,
        })
        .to_string()
    }
}
