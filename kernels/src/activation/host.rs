//! Annealed activations of the bottleneck adapters (AFA-LoRA, arXiv 2512.22455):
//! `y = beta * act(z) + (1 - beta) * z` and its gradient. Exact semantics:
//! [`crate::activation`].

use crate::activation::{Act, ActBetaArgs, ActDirection, ActSpec, ACT_BLOCKSIZE};
use qforge_ir::dsl::{FloatIn, FloatOut};

use crate::ops::{cached_typed, count_u32};
use qforge_runtime::HostTensor;
use qforge_runtime::{launch_typed, Device};
use qforge_runtime::{Error, Result};

/// Checks a float tensor whose bytes match its shape; returns its element count.
fn elements(what: &str, t: &HostTensor) -> Result<u32> {
    let numel: usize = t.shape.iter().product();
    if !t.dtype.is_float() || t.data.len() != numel * t.dtype.size_bytes() {
        return Err(Error::Invalid(format!(
            "act_beta: {what} must be an f32, f16 or bf16 tensor whose bytes match its shape, got \
             {} {:?} with {} bytes",
            t.dtype,
            t.shape,
            t.data.len()
        )));
    }
    count_u32("act_beta", what, numel)
}

fn run(
    dev: &dyn Device,
    spec: ActSpec,
    z: &HostTensor,
    dy: Option<&HostTensor>,
    beta: f32,
) -> Result<HostTensor> {
    let n = elements("z", z)?;
    if let Some(dy) = dy {
        elements("dy", dy)?;
        if dy.dtype != z.dtype || dy.shape != z.shape {
            return Err(Error::Invalid(format!(
                "act_beta_backward: dy is {} {:?}, z is {} {:?}; they must match",
                dy.dtype, dy.shape, z.dtype, z.shape
            )));
        }
    }
    let kernel = cached_typed(&spec.name(), || spec.build())?;
    let mut out = vec![0u8; z.data.len()];
    let dtype = z.dtype;
    let output = FloatOut {
        dtype,
        bytes: &mut out,
    };
    let (y, dz) = match spec.direction {
        ActDirection::Forward => (Some(output), None),
        ActDirection::Backward => (None, Some(output)),
    };
    launch_typed(
        dev,
        &kernel,
        &mut ActBetaArgs {
            n,
            n_blocks: n.div_ceil(ACT_BLOCKSIZE),
            beta,
            z: FloatIn {
                dtype,
                bytes: &z.data,
            },
            dy: dy.map(|d| FloatIn {
                dtype,
                bytes: &d.data,
            }),
            y,
            dz,
        },
    )?;
    HostTensor::new(dtype, z.shape.clone(), out)
}

/// `y = beta * act(z) + (1 - beta) * z` elementwise, in `z`'s dtype and shape (`beta = 1`: the
/// plain activation; `beta = 0`: the identity).
///
/// # Errors
/// [`Error::Invalid`] for `z` not a float tensor matching its shape or more than `2^31 - 1`
/// elements; any device error.
pub fn act_beta(dev: &dyn Device, act: Act, z: &HostTensor, beta: f32) -> Result<HostTensor> {
    let spec = ActSpec {
        act,
        dtype: z.dtype,
        direction: ActDirection::Forward,
    };
    run(dev, spec, z, None, beta)
}

/// `dz = dy * (beta * act'(z) + (1 - beta))` elementwise (`relu'(0) = 0`, as PyTorch).
///
/// # Errors
/// As [`act_beta`], and [`Error::Invalid`] when `dy` differs from `z` in dtype or shape.
pub fn act_beta_backward(
    dev: &dyn Device,
    act: Act,
    z: &HostTensor,
    dy: &HostTensor,
    beta: f32,
) -> Result<HostTensor> {
    let spec = ActSpec {
        act,
        dtype: z.dtype,
        direction: ActDirection::Backward,
    };
    run(dev, spec, z, Some(dy), beta)
}
