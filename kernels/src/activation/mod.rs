//! Elementwise activation kernels with Activation Function Annealing (AFA-LoRA, arXiv
//! 2512.22455): `act_beta(z) = beta * act(z) + (1 - beta) * z` for `act` in GELU (erf form),
//! GELU (tanh approximation), ReLU and SiLU, forward and backward, for the bottleneck FFN adapter
//! `y = x + up(act_beta(down(x)))`. `beta` is an `f32` scalar argument (from the annealing
//! schedule); `beta = 0` makes the adapter linear, so it can be merged into the base weight.
//!
//! Every element is computed in `f32` (loads widen `f16`/`bf16` exactly; stores round to nearest
//! even) by the exact operation sequences below, one IEEE `f32` operation each, rounded to
//! nearest even unless it says `fma`; `erf`, `tanh`, `exp` and `sigmoid` are the IR routines of
//! [`qforge_ir::routines::math`]. With `omb = 1 - beta` (one subtraction per work item):
//! * forward: `y = fma(beta, act(z), omb * z)`;
//! * backward: `dz = dy * fma(beta, act'(z), omb)`.
//!
//! `act(z)` and `act'(z)`, with `h = 0.5 * z`, `w = z * z` and the `f32` constants
//! `FRAC_1_SQRT_2 = 0x3f3504f3`, `SQRT_2_OVER_PI = 0x3f4c422a`, `INV_SQRT_2PI = 0x3ecc422a`,
//! `KAPPA = 0.044715 = 0x3d372713`, `KAPPA3 = 0.134145 = 0x3e095d4f`:
//! * GELU (Hendrycks & Gimpel 2016), `0.5 z (1 + erf(z / sqrt 2))`:
//!   `act = fma(h, erf(z * FRAC_1_SQRT_2), h)`;
//!   `act' = fma(z, exp(w * -0.5) * INV_SQRT_2PI, fma(erf(z * FRAC_1_SQRT_2), 0.5, 0.5))`.
//! * GELU, tanh form, `0.5 z (1 + tanh(sqrt(2/pi) (z + 0.044715 z^3)))`: with
//!   `t = tanh((z * SQRT_2_OVER_PI) * fma(w, KAPPA, 1))`: `act = fma(h, t, h)`;
//!   `act' = fma(h * fma(-t, t, 1), SQRT_2_OVER_PI * fma(w, KAPPA3, 1), fma(t, 0.5, 0.5))`.
//! * ReLU: `act = max(z, +0)` (so `act(-0) = -0` and `act(NaN) = NaN`);
//!   `act' = z <= 0 ? 0 : 1`: `relu'(0) = 0` as PyTorch's `threshold_backward`, and a NaN `z`
//!   passes the gradient (`act' = 1`), also as PyTorch.
//! * SiLU (Elfwing et al. 2018), `z sigmoid(z)`: with `s = sigmoid(z)`: `act = z * s`;
//!   `act' = s * fma(z, 1 - s, 1)`.
//!
//! Infinite inputs follow the formulas in IEEE arithmetic, like PyTorch's eager formulas: for
//! example `gelu(-inf) = -inf * 0 = NaN`, `silu(-inf) = NaN`, and `(1 - beta) * z` is NaN for
//! `beta = 1`, `z = ±inf`.
//!
//! Layout: blocks of [`ACT_BLOCKSIZE`] elements, one work item per block (a straight-line loop,
//! which the CPU backend vectorizes). Parameters: forward `(n: u32, n_blocks: u32, beta: f32,
//! z: dtype[n] read, y: dtype[n] write)`; backward `(n: u32, n_blocks: u32, beta: f32,
//! z: dtype[n] read, dy: dtype[n] read, dz: dtype[n] write)`; grid `n_blocks = ceil(n / 1024)`.

mod catalog;
pub(crate) mod host;
#[cfg(test)]
mod reference;
#[cfg(test)]
mod tests;

use qforge_macros::{func, kernel};

use crate::funcs::{block_range, erf, exp, sigmoid, tanh};
use qforge_ir::dsl::{Float, In, Out, TypedKernel, Val};
use qforge_ir::{DType, Rounding};
use qforge_ir::{Error, Result};

/// Elements per work item of the activation kernels.
pub const ACT_BLOCKSIZE: u32 = 1024;

const FRAC_1_SQRT_2: u32 = 0x3f35_04f3;
const SQRT_2_OVER_PI: u32 = 0x3f4c_422a;
const INV_SQRT_2PI: u32 = 0x3ecc_422a;
const KAPPA: u32 = 0x3d37_2713;
const KAPPA3: u32 = 0x3e09_5d4f;

/// An activation function.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Act {
    /// GELU, erf form: `0.5 z (1 + erf(z / sqrt 2))`.
    Gelu,
    /// GELU, tanh approximation: `0.5 z (1 + tanh(sqrt(2/pi) (z + 0.044715 z^3)))`.
    GeluTanh,
    /// ReLU: `max(z, 0)`.
    Relu,
    /// SiLU (swish): `z * sigmoid(z)`.
    Silu,
}

impl Act {
    /// All activations.
    pub const ALL: [Act; 4] = [Act::Gelu, Act::GeluTanh, Act::Relu, Act::Silu];

    /// `gelu`, `gelu_tanh`, `relu` or `silu`.
    pub const fn name(self) -> &'static str {
        match self {
            Act::Gelu => "gelu",
            Act::GeluTanh => "gelu_tanh",
            Act::Relu => "relu",
            Act::Silu => "silu",
        }
    }

    /// The activation called `name`, if any.
    pub fn from_name(name: &str) -> Option<Act> {
        Act::ALL.into_iter().find(|a| a.name() == name)
    }
}

/// Forward (`y = act_beta(z)`) or backward (`dz = dy * act_beta'(z)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ActDirection {
    /// `y = beta * act(z) + (1 - beta) * z`.
    Forward,
    /// `dz = dy * (beta * act'(z) + (1 - beta))`.
    Backward,
}

impl ActDirection {
    /// `forward` or `backward`.
    pub const fn name(self) -> &'static str {
        match self {
            ActDirection::Forward => "forward",
            ActDirection::Backward => "backward",
        }
    }
}

/// One activation kernel variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ActSpec {
    /// The activation.
    pub act: Act,
    /// Dtype of `z`, `dy`, `y` and `dz`: `f32`, `f16` or `bf16`.
    pub dtype: DType,
    /// Forward or backward.
    pub direction: ActDirection,
}

/// The `f32` constant with these bits, as an IR constant.
#[func]
fn constant(bits: u32) -> Val<f32> {
    val(comptime!(f32::from_bits(bits)))
}

/// `act(z)` (sequences in the module documentation).
#[func]
pub fn act(a: Act, z: Val<f32>) -> Val<f32> {
    match a {
        Act::Gelu => {
            let h = 0.5f32 * z;
            let u = z * constant(FRAC_1_SQRT_2);
            let e = erf(u);
            fma(h, e, h)
        }
        Act::GeluTanh => {
            let t = gelu_tanh_inner(z);
            let h = 0.5f32 * z;
            fma(h, t, h)
        }
        Act::Relu => max(z, 0.0f32),
        Act::Silu => {
            let s = sigmoid(z);
            z * s
        }
    }
}

/// `tanh((z * SQRT_2_OVER_PI) * fma(z * z, KAPPA, 1))`.
#[func]
fn gelu_tanh_inner(z: Val<f32>) -> Val<f32> {
    let w = z * z;
    let u = fma(w, constant(KAPPA), 1.0f32);
    let zs = z * constant(SQRT_2_OVER_PI);
    let inner = zs * u;
    tanh(inner)
}

/// `act'(z)` (sequences in the module documentation).
#[func]
pub fn act_grad(a: Act, z: Val<f32>) -> Val<f32> {
    match a {
        Act::Gelu => {
            let u = z * constant(FRAC_1_SQRT_2);
            let e = erf(u);
            let half = val(0.5f32);
            let cdf = fma(e, half, half);
            let w = z * z;
            let m = w * -0.5f32;
            let ex = exp(m);
            let pdf = ex * constant(INV_SQRT_2PI);
            fma(z, pdf, cdf)
        }
        Act::GeluTanh => {
            let t = gelu_tanh_inner(z);
            let half = val(0.5f32);
            let h = half * z;
            let one = val(1.0f32);
            let sech2 = fma(-t, t, one);
            let w = z * z;
            let du = fma(w, constant(KAPPA3), one);
            let dinner = constant(SQRT_2_OVER_PI) * du;
            let left = fma(t, half, half);
            let hs = h * sech2;
            fma(hs, dinner, left)
        }
        Act::Relu => {
            let zero = val(0.0f32);
            let one = val(1.0f32);
            select(z <= zero, zero, one)
        }
        Act::Silu => {
            let s = sigmoid(z);
            let one = val(1.0f32);
            let oms = one - s;
            let q = fma(z, oms, one);
            s * q
        }
    }
}

/// An annealed activation kernel (layout and parameters in the module documentation): forward
/// `y = fma(beta, act(z), (1 - beta) * z)`, or backward `dz = dy * fma(beta, act'(z), 1 - beta)`
/// with `dy` after `z` and `dz` in place of `y`.
///
/// # Errors
/// [`Error::Unsupported`] when `dtype` is not `f32`, `f16` or `bf16`.
#[kernel(name = spec.name(), grid = n_blocks)]
pub fn act_beta(
    #[config] spec: &ActSpec,
    n: u32,
    n_blocks: u32,
    beta: f32,
    #[shape(n)]
    #[dtype(spec.dtype)]
    z: In<Float>,
    #[when(spec.direction == ActDirection::Backward)]
    #[shape(n)]
    #[dtype(spec.dtype)]
    dy: In<Float>,
    #[when(spec.direction == ActDirection::Forward)]
    #[shape(n)]
    #[dtype(spec.dtype)]
    y: Out<Float>,
    #[when(spec.direction == ActDirection::Backward)]
    #[shape(n)]
    #[dtype(spec.dtype)]
    dz: Out<Float>,
) {
    let item = work_item();
    let limit = n;
    let (start, end) = block_range(item, ACT_BLOCKSIZE, limit);
    let beta_v = beta;
    let one = val(1.0f32);
    let omb = one - beta_v;
    for i in start..end {
        let zv = z[i];
        match (dy, y, dz) {
            (None, Some(y), _) => {
                let a = act(spec.act, zv);
                let lin = omb * zv;
                store_rounded(y, i, fma(beta_v, a, lin), Rounding::NearestEven);
            }
            (Some(dy), _, Some(dz)) => {
                let g = act_grad(spec.act, zv);
                let m = fma(beta_v, g, omb);
                let d = dy[i];
                store_rounded(dz, i, d * m, Rounding::NearestEven);
            }
            _ => {}
        }
    }
}

impl ActSpec {
    /// Every variant: each activation in both directions for `f32`, `f16` and `bf16`.
    pub fn all() -> Vec<ActSpec> {
        let mut out = Vec::new();
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            for act in Act::ALL {
                for direction in [ActDirection::Forward, ActDirection::Backward] {
                    out.push(ActSpec {
                        act,
                        dtype,
                        direction,
                    });
                }
            }
        }
        out
    }

    /// The kernel name, e.g. `act_beta_gelu_tanh_backward_bf16`.
    pub fn name(&self) -> String {
        format!(
            "act_beta_{}_{}_{}",
            self.act.name(),
            self.direction.name(),
            self.dtype.name()
        )
    }

    /// Builds the kernel (layout and parameters in the module documentation).
    ///
    /// # Errors
    /// [`Error::Unsupported`] when `dtype` is not `f32`, `f16` or `bf16`.
    pub fn build(&self) -> Result<TypedKernel<ActBeta>> {
        if !self.dtype.is_float() {
            return Err(Error::Unsupported(format!(
                "dtype {} is not supported for activation kernels; allowed: f32, f16, bf16",
                self.dtype
            )));
        }
        act_beta(self)
    }
}
