//! Serial bottleneck adapters (ZAdapter 0.2; AFA-LoRA, arXiv 2512.22455): after a layer whose
//! output is `h: [M, d]`, `y = h + up(act_beta(down(h)))` with `down: [r, d]` + bias `[r]` and
//! `up: [d, r]` + bias `[d]`, all `f32`. A fresh adapter is the identity (`up = 0`), and once
//! the annealing schedule ([`AfaSchedule`]) reaches `beta = 0` it is linear and merges exactly
//! into the layer before it ([`BottleneckAdapter::merge_into`]).

mod merge;
mod pass;
mod schedule;

pub use pass::{AdapterCache, AdapterGrads};
pub use schedule::{AfaSchedule, AfaShape};

use crate::normal::scaled_ppf_f32;
use qforge_ir::routines::philox::philox4x32_10_host;
use qforge_ir::DType;

use qforge_runtime::HostTensor;
use qforge_runtime::{Error, Result};

/// The standard deviation of the initial `down` weight (ZAdapter).
pub const DOWN_INIT_STD: f64 = 0.02;

/// The weights of one serial bottleneck adapter, `f32` tensors.
#[derive(Clone, Debug, PartialEq)]
pub struct BottleneckAdapter {
    /// `[r, d]`.
    pub down_weight: HostTensor,
    /// `[r]`.
    pub down_bias: HostTensor,
    /// `[d, r]`.
    pub up_weight: HostTensor,
    /// `[d]`.
    pub up_bias: HostTensor,
}

/// `n` values of `N(0, std^2)`, deterministic in `seed`: value `j` is
/// `std * Phi^-1(((bits >> 8) + 0.5) * 2^-24)` with `bits` word `j % 4` of
/// `Philox4x32-10(counter = [j / 4, 0, 0, 0], key = [seed low, seed high])` (never 0 or 1, so
/// always finite), computed in `f64` ([`crate::normal_ppf`]) and rounded once to `f32`
/// (`normal::scaled_ppf_f32` gives these bits about ten times faster).
pub fn normal_f32(n: usize, std: f64, seed: u64) -> Vec<f32> {
    let key = [seed as u32, (seed >> 32) as u32];
    (0..n)
        .map(|j| {
            let words = philox4x32_10_host([(j / 4) as u32, (j >> 34) as u32, 0, 0], key);
            let u = ((words[j % 4] >> 8) as f64 + 0.5) / 16_777_216.0;
            scaled_ppf_f32(u, std)
        })
        .collect()
}

fn f32_tensor(shape: Vec<usize>, values: &[f32]) -> Result<HostTensor> {
    HostTensor::from_f32_as(DType::F32, shape, values)
}

impl BottleneckAdapter {
    /// A fresh adapter for width `d` and rank `r` (ZAdapter initialisation): `down ~ N(0,
    /// 0.02^2)` from [`normal_f32`] with `seed`, `up = 0`, both biases 0, so `y = h` exactly.
    ///
    /// # Errors
    /// [`Error::Invalid`] for `d` or `r` of 0 or a weight of more than `2^31 - 1` values.
    pub fn new(d: usize, r: usize, seed: u64) -> Result<BottleneckAdapter> {
        if d == 0 || r == 0 || d.checked_mul(r).is_none_or(|n| n > i32::MAX as usize) {
            return Err(Error::Invalid(format!(
                "adapter: width d = {d} and rank r = {r} must be at least 1, with d * r below 2^31"
            )));
        }
        Ok(BottleneckAdapter {
            down_weight: f32_tensor(vec![r, d], &normal_f32(r * d, DOWN_INIT_STD, seed))?,
            down_bias: f32_tensor(vec![r], &vec![0.0; r])?,
            up_weight: f32_tensor(vec![d, r], &vec![0.0; d * r])?,
            up_bias: f32_tensor(vec![d], &vec![0.0; d])?,
        })
    }

    /// `(d, r)`, checked against every tensor's dtype and shape.
    ///
    /// # Errors
    /// [`Error::Invalid`] naming the first tensor that is not `f32` of the expected shape.
    pub fn dims(&self) -> Result<(usize, usize)> {
        let [r, d] = self.down_weight.shape[..] else {
            return Err(Error::Invalid(format!(
                "adapter: down_weight must be [r, d], got shape {:?}",
                self.down_weight.shape
            )));
        };
        for (what, t, shape) in [
            ("down_weight", &self.down_weight, vec![r, d]),
            ("down_bias", &self.down_bias, vec![r]),
            ("up_weight", &self.up_weight, vec![d, r]),
            ("up_bias", &self.up_bias, vec![d]),
        ] {
            if t.dtype != DType::F32 || t.shape != shape {
                return Err(Error::Invalid(format!(
                    "adapter: {what} must be f32 {shape:?} (d = {d}, r = {r}), got {} {:?}",
                    t.dtype, t.shape
                )));
            }
        }
        Ok((d, r))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn initial_down_weights_are_normal_and_reproducible() {
        let v = normal_f32(40_000, DOWN_INIT_STD, 7);
        assert_eq!(v, normal_f32(40_000, DOWN_INIT_STD, 7));
        assert_ne!(v, normal_f32(40_000, DOWN_INIT_STD, 8));
        let n = v.len() as f64;
        let mean = v.iter().map(|x| *x as f64).sum::<f64>() / n;
        let var = v.iter().map(|x| (*x as f64 - mean).powi(2)).sum::<f64>() / n;
        // Standard errors: mean 1e-4, std about 7e-5.
        assert!(mean.abs() < 5e-4, "mean {mean}");
        assert!((var.sqrt() - 0.02).abs() < 4e-4, "std {}", var.sqrt());
        let within = v.iter().filter(|x| x.abs() < 0.02).count() as f64 / n;
        assert!((within - 0.6827).abs() < 0.01, "P(|x| < std) = {within}");
        assert!(v.iter().all(|x| x.is_finite()));
    }

    #[test]
    fn a_fresh_adapter_is_the_identity_and_bad_sizes_are_errors() {
        let a = BottleneckAdapter::new(6, 2, 1).unwrap();
        assert_eq!(a.dims().unwrap(), (6, 2));
        assert!(a.up_weight.to_f32().unwrap().iter().all(|x| *x == 0.0));
        assert!(BottleneckAdapter::new(0, 2, 1)
            .unwrap_err()
            .to_string()
            .contains("d = 0"));
        let mut bad = a.clone();
        bad.up_bias = f32_tensor(vec![5], &[0.0; 5]).unwrap();
        assert!(bad.dims().unwrap_err().to_string().contains("up_bias"));
    }

    /// An adapter built by hand with rank 0 runs (no panic): `y = h + b_u`, empty weight
    /// gradients, and the bias gradient the column sums of `dy`.
    #[test]
    fn a_rank_zero_adapter_runs() {
        use crate::activation::Act;
        use qforge_runtime::InterpreterDevice;
        let t = |shape: Vec<usize>, v: &[f32]| f32_tensor(shape, v).unwrap();
        let a = BottleneckAdapter {
            down_weight: t(vec![0, 3], &[]),
            down_bias: t(vec![0], &[]),
            up_weight: t(vec![3, 0], &[]),
            up_bias: t(vec![3], &[0.5, 0.25, 2.0]),
        };
        let h = t(vec![2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let dy = t(vec![2, 3], &[1.0, -1.0, 0.5, 2.0, 3.0, -4.0]);
        let cpu = qforge_runtime::CpuDevice::new().unwrap();
        for dev in [&InterpreterDevice as &dyn qforge_runtime::Device, &cpu] {
            let (y, cache) = a.forward(dev, Act::Gelu, &h, 0.5).unwrap();
            assert_eq!(y.to_f32().unwrap(), [1.5, 2.25, 5.0, 4.5, 5.25, 8.0]);
            let g = a.backward(dev, Act::Gelu, &h, &cache, &dy, 0.5).unwrap();
            assert_eq!(g.up_weight.shape, [3, 0]);
            assert_eq!(g.down_weight.shape, [0, 3]);
            assert_eq!(g.up_bias.to_f32().unwrap(), [3.0, 2.0, -3.5]);
            assert_eq!(g.dh, dy, "{}", dev.name());
        }
    }
}
