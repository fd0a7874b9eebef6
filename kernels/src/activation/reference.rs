//! The builder version of the activation kernels, as it was before the library moved to the
//! kernel language (tests only: `activation`'s tests prove the two equal).
#![allow(missing_docs)]

use crate::activation::{Act, ActDirection, ActSpec, ACT_BLOCKSIZE};
use crate::emit::block_range;
use qforge_ir::routines::math::{erf, exp, sigmoid, tanh};
use qforge_ir::CmpOp;
use qforge_ir::KernelBuilder;
use qforge_ir::ScalarType;
use qforge_ir::{Access, Dim, Kernel, Value};
use qforge_ir::{Error, Result};

const FRAC_1_SQRT_2: u32 = 0x3f35_04f3;
const SQRT_2_OVER_PI: u32 = 0x3f4c_422a;
const INV_SQRT_2PI: u32 = 0x3ecc_422a;
const KAPPA: u32 = 0x3d37_2713;
const KAPPA3: u32 = 0x3e09_5d4f;

fn constant(b: &mut KernelBuilder, bits: u32) -> Value {
    b.const_f32(f32::from_bits(bits))
}

/// Emits `act(z)` (sequences in the module documentation).
pub fn act(b: &mut KernelBuilder, a: Act, z: Value) -> Value {
    match a {
        Act::Gelu => {
            let half = b.const_f32(0.5);
            let h = b.mul(half, z);
            let k = constant(b, FRAC_1_SQRT_2);
            let u = b.mul(z, k);
            let e = erf(b, u);
            b.fma(h, e, h)
        }
        Act::GeluTanh => {
            let t = gelu_tanh_inner(b, z);
            let half = b.const_f32(0.5);
            let h = b.mul(half, z);
            b.fma(h, t, h)
        }
        Act::Relu => {
            let zero = b.const_f32(0.0);
            b.max(z, zero)
        }
        Act::Silu => {
            let s = sigmoid(b, z);
            b.mul(z, s)
        }
    }
}

/// `tanh((z * SQRT_2_OVER_PI) * fma(z * z, KAPPA, 1))`.
fn gelu_tanh_inner(b: &mut KernelBuilder, z: Value) -> Value {
    let w = b.mul(z, z);
    let kappa = constant(b, KAPPA);
    let one = b.const_f32(1.0);
    let u = b.fma(w, kappa, one);
    let s = constant(b, SQRT_2_OVER_PI);
    let zs = b.mul(z, s);
    let inner = b.mul(zs, u);
    tanh(b, inner)
}

/// Emits `act'(z)` (sequences in the module documentation).
pub fn act_grad(b: &mut KernelBuilder, a: Act, z: Value) -> Value {
    match a {
        Act::Gelu => {
            let k = constant(b, FRAC_1_SQRT_2);
            let u = b.mul(z, k);
            let e = erf(b, u);
            let half = b.const_f32(0.5);
            let cdf = b.fma(e, half, half);
            let w = b.mul(z, z);
            let m_half = b.const_f32(-0.5);
            let m = b.mul(w, m_half);
            let ex = exp(b, m);
            let c = constant(b, INV_SQRT_2PI);
            let pdf = b.mul(ex, c);
            b.fma(z, pdf, cdf)
        }
        Act::GeluTanh => {
            let t = gelu_tanh_inner(b, z);
            let half = b.const_f32(0.5);
            let h = b.mul(half, z);
            let one = b.const_f32(1.0);
            let minus_t = b.neg(t);
            let sech2 = b.fma(minus_t, t, one);
            let w = b.mul(z, z);
            let kappa3 = constant(b, KAPPA3);
            let du = b.fma(w, kappa3, one);
            let s = constant(b, SQRT_2_OVER_PI);
            let dinner = b.mul(s, du);
            let left = b.fma(t, half, half);
            let hs = b.mul(h, sech2);
            b.fma(hs, dinner, left)
        }
        Act::Relu => {
            let zero = b.const_f32(0.0);
            let one = b.const_f32(1.0);
            let off = b.cmp(CmpOp::Le, z, zero);
            b.select(off, zero, one)
        }
        Act::Silu => {
            let s = sigmoid(b, z);
            let one = b.const_f32(1.0);
            let oms = b.sub(one, s);
            let q = b.fma(z, oms, one);
            b.mul(s, q)
        }
    }
}

/// `ActSpec::build` with the builder.
pub fn build(spec: &ActSpec) -> Result<Kernel> {
    let s = spec;
    if !s.dtype.is_float() {
        return Err(Error::Unsupported(format!(
            "dtype {} is not supported for activation kernels; allowed: f32, f16, bf16",
            s.dtype
        )));
    }
    let dtype = s.dtype;
    let mut b = KernelBuilder::new(&s.name());
    let n = b.scalar_param("n", ScalarType::U32);
    let n_blocks = b.scalar_param("n_blocks", ScalarType::U32);
    let beta = b.scalar_param("beta", ScalarType::F32);
    let shape = [Dim::Param(n)];
    let z = b.buffer_param("z", dtype, &shape, Access::Read);
    let dy = match s.direction {
        ActDirection::Forward => None,
        ActDirection::Backward => Some(b.buffer_param("dy", dtype, &shape, Access::Read)),
    };
    let out_name = match s.direction {
        ActDirection::Forward => "y",
        ActDirection::Backward => "dz",
    };
    let out = b.buffer_param(out_name, dtype, &shape, Access::Write);
    b.set_grid(Dim::Param(n_blocks));
    let item = b.work_item();
    let limit = b.param(n);
    let (start, end) = block_range(&mut b, item, ACT_BLOCKSIZE, limit);
    let beta_v = b.param(beta);
    let one = b.const_f32(1.0);
    let omb = b.sub(one, beta_v);
    let act_fn = s.act;
    b.for_range(start, end, 1, |b, i| {
        let zv = b.load(z, i);
        let r = match dy {
            None => {
                let a = act(b, act_fn, zv);
                let lin = b.mul(omb, zv);
                b.fma(beta_v, a, lin)
            }
            Some(dy) => {
                let g = act_grad(b, act_fn, zv);
                let m = b.fma(beta_v, g, omb);
                let d = b.load(dy, i);
                b.mul(d, m)
            }
        };
        b.store_auto(out, i, r);
    });
    Ok(b.finish())
}
