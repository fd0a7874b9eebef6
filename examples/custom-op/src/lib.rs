//! A custom op written with `#[qforge::kernel]` only: RMSNorm fused with NF4 quantization, the
//! output in bitsandbytes' 4-bit layout (packed codes, first element in the high nibble, one
//! `f32` absmax per block). Unfused, the same result takes an RMSNorm kernel, a float tensor in
//! memory and `quantize_4bit`; fused, the normalized values never leave the work item.
//!
//! Semantics (every step one IEEE `f32` operation, round to nearest even; `x` widened exactly
//! from its dtype), for each row `r` of `x: [rows, d]`:
//! * `ss = sum over k of x[r, k] * x[r, k]` in [`SUMSQ_ORDER`] (8 strided partials, each a
//!   chain of `fma`s from `-0.0`, then the halving tree);
//! * `inv_rms = 1 / sqrt(ss / f32(d) + eps)`;
//! * `y[r, k] = (x[r, k] * inv_rms) * weight[k]`;
//! * `y`, flattened, is quantized exactly as `quantize_4bit(nf4, blocksize)` does:
//!   `absmax = max |y|` over each block (NaN propagating), codes of `y * (1 / max(absmax,
//!   1e-38))`.
//!
//! `d` must be a multiple of `blocksize` (each quantization block lies in one row), which
//! [`rmsnorm_quantize_4bit`] checks. One work item per row.

use qforge::ir::dsl::{Buf, Float, FloatIn, In, Out, TypedKernel, Val};
use qforge::ir::{DType, Kernel, OwnedArg, ReduceOrder};
use qforge::kernels::funcs::{code4, coder4, inv_absmax};
use qforge::kernels::{check_blocksize_4bit, CatalogEntry, QuantType};
use qforge::runtime::{launch_typed, Device, HostTensor};
use qforge::{func, kernel};

/// The order of each row's sum of squares: 8 strided partials and the halving tree.
pub const SUMSQ_ORDER: ReduceOrder = ReduceOrder::Strided(8);

/// `(x[e] * inv_rms) * weight[k]`: one normalized element.
#[func]
fn normalized(
    x: Buf<In<Float>>,
    e: Val<u32>,
    weight: Buf<In<f32>>,
    k: Val<u32>,
    inv_rms: Val<f32>,
) -> Val<f32> {
    x[e] * inv_rms * weight[k]
}

/// The fused kernel (see the crate docs): `rmsnorm_nf4_bs{blocksize}_{dtype}`.
///
/// # Errors
/// An unsupported blocksize (32..=4096, powers of two) or a non-float dtype.
#[kernel(name = "rmsnorm_nf4_bs{blocksize}_{dtype}", grid = rows)]
pub fn rmsnorm_nf4(
    #[config] blocksize: u32,
    #[config] dtype: DType,
    rows: u32,
    d: u32,
    n_packed: u32,
    n_blocks: u32,
    eps: f32,
    #[shape(rows, d)]
    #[dtype(dtype)]
    x: In<Float>,
    #[shape(d)] weight: In<f32>,
    #[shape(n_packed)] packed: Out<u8>,
    #[shape(n_blocks)] absmax: Out<f32>,
) {
    comptime!(check_blocksize_4bit(blocksize)?);
    let coder = coder4(QuantType::Nf4);
    let row = work_item();
    let dv = d;
    let start = row * dv;
    let mut ss: f32;
    #[accumulate(SUMSQ_ORDER)]
    for k in 0..dv {
        let v = x[start + k];
        ss = sum(v * v);
    }
    let inv_rms = 1.0f32 / sqrt(ss / dv.to_f32() + eps);
    // The row's blocks (`d` is a multiple of the blocksize; stores stay inside the buffers even
    // when the size arguments disagree).
    for blk in val(0u32)..dv / blocksize {
        let k0 = blk * blocksize;
        let e0 = start + k0;
        let mut am = 0.0f32;
        for i in val(0u32)..val(blocksize) {
            let a = abs(normalized(x, e0 + i, weight, k0 + i, inv_rms));
            // max |y| with NaN propagating (once NaN, it stays NaN).
            am = select(am != am, am, select(!(a <= am), a, am));
        }
        let q = e0 / blocksize;
        if q < n_blocks {
            absmax[q] = am;
        }
        let inv = inv_absmax(am);
        for i in (val(0u32)..val(blocksize)).step_by(2) {
            let y0 = normalized(x, e0 + i, weight, k0 + i, inv_rms);
            let y1 = normalized(x, e0 + i + 1u32, weight, k0 + i + 1u32, inv_rms);
            let c0 = code4(coder, y0 * inv);
            let c1 = code4(coder, y1 * inv);
            let j = (e0 + i) >> 1u32;
            if j < n_packed {
                packed[j] = (c0 << 4u32) | c1;
            }
        }
    }
}

/// RMSNorm of the rows of `x` (`[rows, d]`, `f32`, `f16` or `bf16`) with `weight` (`[d]`) and
/// `eps`, quantized to NF4 with `blocksize`: returns the packed codes (`rows * d / 2` bytes) and
/// the absmax (`rows * d / blocksize` values), bitsandbytes' `quantize_4bit` layout of the
/// normalized tensor.
///
/// # Errors
/// A clear error when `x` is not a 2-D float tensor, `weight` does not have `d` values, `d` is
/// not a multiple of `blocksize`, the blocksize is unsupported, or the device fails.
pub fn rmsnorm_quantize_4bit(
    dev: &dyn Device,
    x: &HostTensor,
    weight: &[f32],
    eps: f32,
    blocksize: u32,
) -> qforge::Result<(Vec<u8>, Vec<f32>)> {
    let bad = |m: String| qforge::Error::Usage(format!("rmsnorm_quantize_4bit: {m}"));
    let [rows, d] = x.shape[..] else {
        return Err(bad(format!(
            "x must be 2-D [rows, d], got shape {:?}",
            x.shape
        )));
    };
    if weight.len() != d {
        return Err(bad(format!(
            "weight has {} values, x has d = {d}",
            weight.len()
        )));
    }
    if d == 0 || blocksize == 0 || d % blocksize as usize != 0 {
        return Err(bad(format!(
            "d = {d} is not a positive multiple of the blocksize {blocksize}"
        )));
    }
    let n = rows
        .checked_mul(d)
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| bad(format!("{rows} x {d} elements exceed u32")))?;
    let kernel = rmsnorm_nf4(blocksize, x.dtype)?;
    let mut packed = vec![0u8; n as usize / 2];
    let mut absmax = vec![0f32; (n / blocksize) as usize];
    let mut args = RmsnormNf4Args {
        rows: rows as u32,
        d: d as u32,
        n_packed: n / 2,
        n_blocks: n / blocksize,
        eps,
        x: FloatIn {
            dtype: x.dtype,
            bytes: &x.data,
        },
        weight,
        packed: &mut packed,
        absmax: &mut absmax,
    };
    launch_typed(dev, &kernel, &mut args)?;
    Ok((packed, absmax))
}

/// The plain-Rust model of the RMSNorm step alone (the unfused reference): `y` as `f32`, with
/// exactly the kernel's operations and order.
pub fn rmsnorm_model(x: &[f32], d: usize, weight: &[f32], eps: f32) -> Vec<f32> {
    let mut y = Vec::with_capacity(x.len());
    for row in x.chunks(d) {
        // Strided(8): p[k % 8] = fma(x, x, p[k % 8]) from -0.0, then the halving tree.
        let mut p = [-0.0f32; 8];
        for (k, v) in row.iter().enumerate() {
            p[k % 8] = v.mul_add(*v, p[k % 8]);
        }
        let mut w = 8;
        while w > 1 {
            w /= 2;
            for j in 0..w {
                p[j] += p[j + w];
            }
        }
        let inv_rms = 1.0f32 / (p[0] / d as f32 + eps).sqrt();
        y.extend(row.iter().zip(weight).map(|(v, g)| v * inv_rms * g));
    }
    y
}

/// The fused kernel as a conformance and `qforge check` entry: `d` = the blocksize (one block
/// per row), rows as the values need, `weight` cycling through `[0.5, 1, 2, -1]`, `eps = 1e-6`;
/// the values fill `x` (zero-padded to whole rows).
#[derive(Clone, Copy, Debug)]
pub struct RmsNormNf4Entry {
    /// The quantization blocksize (and `d`).
    pub blocksize: u32,
    /// The dtype of `x`.
    pub dtype: DType,
}

impl CatalogEntry for RmsNormNf4Entry {
    fn name(&self) -> String {
        format!("rmsnorm_nf4_bs{}_{}", self.blocksize, self.dtype)
    }

    fn build(&self) -> qforge::ir::Result<Kernel> {
        rmsnorm_nf4(self.blocksize, self.dtype).map(TypedKernel::into_kernel)
    }

    fn blocksize(&self) -> usize {
        self.blocksize as usize
    }

    fn example_args(&self, values: &[f32]) -> qforge::ir::Result<Vec<OwnedArg>> {
        let d = self.blocksize as usize;
        let rows = values.len().div_ceil(d).max(1);
        let n = rows * d;
        let mut x = values.to_vec();
        x.resize(n, 0.0);
        let x = HostTensor::from_f32_as(self.dtype, vec![rows, d], &x)
            .map_err(|e| qforge::ir::Error::Unsupported(e.to_string()))?;
        let weight: Vec<f32> = (0..d).map(|k| [0.5f32, 1.0, 2.0, -1.0][k % 4]).collect();
        let (mut packed, mut absmax) = (vec![0u8; n / 2], vec![0f32; n / d]);
        let kernel = rmsnorm_nf4(self.blocksize, self.dtype)?;
        let mut args = RmsnormNf4Args {
            rows: rows as u32,
            d: d as u32,
            n_packed: (n / 2) as u32,
            n_blocks: (n / d) as u32,
            eps: 1e-6,
            x: FloatIn {
                dtype: self.dtype,
                bytes: &x.data,
            },
            weight: &weight,
            packed: &mut packed,
            absmax: &mut absmax,
        };
        Ok(OwnedArg::copy_all(&kernel.args(&mut args)?))
    }
}
