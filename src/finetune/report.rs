//! What `qforge finetune` reports and writes: the final table, the JSON line, `loss.csv`, an SVG
//! loss curve and the merged weights.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use qforge_runtime::{HostTensor, Profile};
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
    /// Where a step's time went.
    pub step_split: StepSplit,
    /// Bytes of optimizer state (tensor data of `state_dict`).
    pub optimizer_state_bytes: usize,
    /// Bytes of the frozen NF4 weights (codes and absmax).
    pub weight_bytes: usize,
    /// Bytes of the adapters' `f32` weights and biases.
    pub adapter_bytes: usize,
    /// `(mean squared error, beta)` of each step.
    pub losses: Vec<(f64, f32)>,
}

/// The kernel families of a training step, by kernel-name prefix (the first match wins); any
/// other kernel counts as `optimizer` (the optimizers' update, norm and quantization kernels).
const FAMILIES: [(&str, &str); 4] = [
    ("matmul_4bit", "NF4 matmul"),
    ("gemm", "adapter GEMMs"),
    ("act_", "activation"),
    ("", "optimizer"),
];

/// A training step's wall time split by kernel family ([`FAMILIES`]), plus the first-launch
/// compilations and the host's share (the time outside kernels: batching, the loss, copies).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepSplit {
    /// Milliseconds per step of each family that ran, in [`FAMILIES`] order, then `compile`
    /// and `host`.
    pub ms: Vec<(&'static str, f64)>,
}

impl StepSplit {
    /// The split of `steps` steps that took `seconds` in all, from the launches in `profile`.
    pub fn new(profile: &Profile, seconds: f64, steps: u64) -> StepSplit {
        let per_step = |s: f64| 1e3 * s / steps.max(1) as f64;
        let mut totals: Vec<Option<f64>> = vec![None; FAMILIES.len()];
        for (kernel, t) in &profile.kernels {
            if let Some(i) = FAMILIES.iter().position(|(p, _)| kernel.starts_with(p)) {
                *totals[i].get_or_insert(0.0) += t.seconds;
            }
        }
        let mut ms: Vec<(&'static str, f64)> = FAMILIES
            .iter()
            .zip(totals)
            .filter_map(|((_, family), total)| Some((*family, per_step(total?))))
            .collect();
        let outside = seconds - profile.kernel_seconds() - profile.compile_seconds;
        ms.push(("compile", per_step(profile.compile_seconds)));
        ms.push(("host", per_step(outside.max(0.0))));
        StepSplit { ms }
    }

    /// Steps per second without the compilations: what every step after the first runs at
    /// (a JIT device compiles each kernel at its first launch; `cpu-aot` never does).
    pub fn warm_steps_per_s(&self) -> f64 {
        let warm: f64 = self
            .ms
            .iter()
            .filter(|(f, _)| *f != "compile")
            .map(|(_, v)| v)
            .sum();
        1e3 / warm.max(1e-9)
    }

    /// `adapter GEMMs 1.23 ms (45%), ...` (shares of the step's total).
    pub fn line(&self) -> String {
        let total: f64 = self.ms.iter().map(|(_, v)| v).sum();
        let parts: Vec<String> = self
            .ms
            .iter()
            .map(|(f, v)| format!("{f} {v:.3} ms ({:.0}%)", 100.0 * v / total.max(1e-12)))
            .collect();
        parts.join(", ")
    }

    /// `{"adapter GEMMs": 1.23, ...}` in milliseconds per step.
    pub fn json(&self) -> serde_json::Value {
        self.ms
            .iter()
            .map(|(f, v)| (f.to_string(), serde_json::json!(v)))
            .collect::<serde_json::Map<_, _>>()
            .into()
    }
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
        let _ = writeln!(
            s,
            "speed: {:.1} steps/s ({:.1} steps/s without compiling kernels on their first launch)",
            self.steps_per_s,
            self.step_split.warm_steps_per_s()
        );
        let _ = writeln!(s, "time per step: {}", self.step_split.line());
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
            "steps_per_s_warm": self.step_split.warm_steps_per_s(),
            "step_ms": self.step_split.json(),
            "optimizer_state_bytes": self.optimizer_state_bytes,
            "err_merged_nf4": self.err_merged_nf4,
            "weight_bytes": self.weight_bytes,
            "adapter_bytes": self.adapter_bytes,
        })
        .to_string()
    }
}

#[cfg(test)]
mod step_split_tests {
    use super::*;
    use qforge_runtime::KernelTime;

    fn profile(kernels: &[(&str, f64)], compile_seconds: f64) -> Profile {
        Profile {
            kernels: kernels
                .iter()
                .map(|(k, s)| {
                    let t = KernelTime {
                        launches: 1,
                        seconds: *s,
                    };
                    (k.to_string(), t)
                })
                .collect(),
            compile_seconds,
        }
    }

    #[test]
    fn kernels_are_grouped_by_family_per_step_with_compile_and_host_apart() {
        let p = profile(
            &[
                ("gemm_nn_f32_t4x4", 0.2),
                ("gemm_nt_f32_t4x4", 0.1),
                ("act_beta_gelu_f32", 0.05),
                ("qadamw_zip_sr", 0.15),
            ],
            1.0,
        );
        // 10 steps in 2 s: 0.5 s outside kernels and compilation.
        let split = StepSplit::new(&p, 2.0, 10);
        let names: Vec<&str> = split.ms.iter().map(|(f, _)| *f).collect();
        assert_eq!(
            names,
            [
                "adapter GEMMs",
                "activation",
                "optimizer",
                "compile",
                "host"
            ]
        );
        let ms: Vec<f64> = split
            .ms
            .iter()
            .map(|(_, v)| (v * 1e6).round() / 1e6)
            .collect();
        assert_eq!(ms, [30.0, 5.0, 15.0, 100.0, 50.0]);
        // Without the compilations a step takes 100 ms.
        assert!((split.warm_steps_per_s() - 10.0).abs() < 1e-9);
        assert!(split.line().starts_with("adapter GEMMs 30.000 ms (15%), "));
        assert_eq!(split.json()["host"], 50.0);
    }
}
