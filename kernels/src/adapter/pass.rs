//! The adapter's forward and backward passes, each product a qforge [`gemm`] kernel and the
//! activation a qforge [`act_beta`] kernel:
//! * forward: `z = h @ D.T + b_d` (`[M, r]`), `a = act_beta(z)`, `y = h + (a @ U.T + b_u)`;
//! * backward, from `dy: [M, d]`: `dU = dy.T @ a`, `db_u = sum_m dy`, `da = dy @ U`,
//!   `dz = da * act_beta'(z)`, `dD = dz.T @ h`, `db_d = sum_m dz`, `dh = dy + dz @ D` (the
//!   residual passes `dy` through). The bias gradients are products with a ones row, so every
//!   sum over `M` has the kernels' pinned order; `dU` and `db_u` come out of one product
//!   (`up_gradients`).

use crate::activation::Act;
use qforge_ir::DType;

use super::BottleneckAdapter;
use crate::gemm::host::copy_threads;
use crate::gemm::transpose::transposed;
use crate::ops::{act_beta, act_beta_backward, gemm, DeviceCaps, Layout};
use qforge_runtime::Device;
use qforge_runtime::HostTensor;
use qforge_runtime::{Error, Result};

use Layout::{RowMajor as N, Transposed as T};

/// What the forward pass keeps for the backward pass.
#[derive(Clone, Debug, PartialEq)]
pub struct AdapterCache {
    /// `h @ D.T + b_d`, `[M, r]`.
    pub z: HostTensor,
    /// `act_beta(z)`, `[M, r]`.
    pub a: HostTensor,
}

/// The gradients of one backward pass (`f32`, shaped like what they are the gradient of).
#[derive(Clone, Debug, PartialEq)]
pub struct AdapterGrads {
    /// `[M, d]`.
    pub dh: HostTensor,
    /// `[r, d]`.
    pub down_weight: HostTensor,
    /// `[r]`.
    pub down_bias: HostTensor,
    /// `[d, r]`.
    pub up_weight: HostTensor,
    /// `[d]`.
    pub up_bias: HostTensor,
}

/// `[1, M]` ones.
fn ones(m: usize) -> Result<HostTensor> {
    HostTensor::from_f32_as(DType::F32, vec![1, m], &vec![1.0; m])
}

/// A `[1, n]` result as an `[n]` vector.
fn vector(t: HostTensor) -> Result<HostTensor> {
    let n = t.shape.iter().product();
    HostTensor::new(t.dtype, vec![n], t.data)
}

/// `dU = dy.T @ a` (`[d, r]`) and `db_u = sum_m dy` (`[d]`) from one product, `[a | 1].T @ dy`
/// (`[r + 1, d]`, its first `r` rows `dU.T`, its last `db_u`), for `a: f32 [M, r]` and
/// `dy: f32 [M, d]`. Each output is the same pinned-order sum of the same products as in the
/// products `dy.T @ a` and `1 @ dy` (`fma` is symmetric in its factors), so the bits are theirs;
/// but `dy`, read as the product's `B` given transposed, is packed in panels by a streaming copy
/// of its rows instead of transposed element by element, and it is read once for both.
fn up_gradients(
    dev: &dyn Device,
    a: &HostTensor,
    dy: &HostTensor,
) -> Result<(HostTensor, HostTensor)> {
    let (m, d) = (dy.shape[0], dy.shape[1]);
    let r = a.shape[1];
    let mut a_ones = Vec::with_capacity(4 * (r + 1) * m);
    for i in 0..m {
        a_ones.extend_from_slice(&a.data[4 * r * i..4 * r * (i + 1)]);
        a_ones.extend_from_slice(&1f32.to_le_bytes());
    }
    let a_ones = HostTensor::new(DType::F32, vec![m, r + 1], a_ones)?;
    let both = gemm(dev, (&a_ones, T), (dy, T), None, None)?;
    let (rows, last) = both.data.split_at(4 * r * d);
    let up_weight = transposed::<4>(rows, r, d, copy_threads(DeviceCaps::of(dev)));
    Ok((
        HostTensor::new(DType::F32, vec![d, r], up_weight)?,
        HostTensor::new(DType::F32, vec![d], last.to_vec())?,
    ))
}

impl BottleneckAdapter {
    /// Checks `h: f32 [M, d]`; returns `M`.
    fn rows(&self, what: &str, h: &HostTensor) -> Result<usize> {
        let (d, _) = self.dims()?;
        match h.shape[..] {
            [m, hd] if hd == d && m > 0 && h.dtype == DType::F32 => Ok(m),
            _ => Err(Error::Invalid(format!(
                "adapter: {what} must be f32 [M, {d}] with M >= 1, got {} {:?}",
                h.dtype, h.shape
            ))),
        }
    }

    /// `y = h + up(act_beta(down(h)))` for `h: f32 [M, d]`, and the cache for
    /// [`BottleneckAdapter::backward`].
    ///
    /// # Errors
    /// [`Error::Invalid`] for an inconsistent adapter or `h` not `f32 [M, d]`; any device error.
    pub fn forward(
        &self,
        dev: &dyn Device,
        act: Act,
        h: &HostTensor,
        beta: f32,
    ) -> Result<(HostTensor, AdapterCache)> {
        self.rows("h", h)?;
        let z = gemm(
            dev,
            (h, N),
            (&self.down_weight, N),
            Some(&self.down_bias),
            None,
        )?;
        let a = act_beta(dev, act, &z, beta)?;
        let y = gemm(
            dev,
            (&a, N),
            (&self.up_weight, N),
            Some(&self.up_bias),
            Some(h),
        )?;
        Ok((y, AdapterCache { z, a }))
    }

    /// The gradients for `dy: f32 [M, d]` at the input `h` and `cache` of the forward pass.
    ///
    /// # Errors
    /// [`Error::Invalid`] for an inconsistent adapter, `h` or `dy` not `f32 [M, d]` with the
    /// same `M`, or a cache of another shape; any device error.
    pub fn backward(
        &self,
        dev: &dyn Device,
        act: Act,
        h: &HostTensor,
        cache: &AdapterCache,
        dy: &HostTensor,
        beta: f32,
    ) -> Result<AdapterGrads> {
        let m = self.rows("h", h)?;
        if self.rows("dy", dy)? != m {
            return Err(Error::Invalid(format!(
                "adapter: dy has shape {:?}, h has shape {:?}; they must match",
                dy.shape, h.shape
            )));
        }
        let (_, r) = self.dims()?;
        for (what, t) in [("cache.z", &cache.z), ("cache.a", &cache.a)] {
            if t.dtype != DType::F32 || t.shape != [m, r] {
                return Err(Error::Invalid(format!(
                    "adapter: {what} must be f32 [{m}, {r}], got {} {:?}",
                    t.dtype, t.shape
                )));
            }
        }
        let (up_weight, up_bias) = up_gradients(dev, &cache.a, dy)?;
        let da = gemm(dev, (dy, N), (&self.up_weight, T), None, None)?;
        let dz = act_beta_backward(dev, act, &cache.z, &da, beta)?;
        let down_weight = gemm(dev, (&dz, T), (h, T), None, None)?;
        let down_bias = vector(gemm(dev, (&ones(m)?, N), (&dz, T), None, None)?)?;
        let dh = gemm(dev, (&dz, N), (&self.down_weight, T), None, Some(dy))?;
        Ok(AdapterGrads {
            dh,
            down_weight,
            down_bias,
            up_weight,
            up_bias,
        })
    }
}
