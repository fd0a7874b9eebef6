//! The 32-bit Adam / AdamW kernel in the kernel language, plain and `_gs` (`gnorm_scale`,
//! `skip_zeros`, [`crate::optim_ext`]). Semantics and parameters are documented in
//! [`crate::adam`].

use qforge_macros::kernel;

use crate::adam::{OptimAlgo, OptimSpec};
use crate::optim_funcs::{betas, grad_options, moments, optim_block, scaled_grad, skip_moments};
use qforge_ir::dsl::{Float, In, InOut};
use qforge_ir::Rounding;

/// The 32-bit Adam / AdamW kernel `name` of `spec`; `grad_opts` adds the `_gs` scalars
/// `gnorm_scale`, `skip_zeros` (see the module docs).
///
/// # Errors
/// [`crate::Error::Unsupported`] for a parameter dtype other than f32, f16, bf16.
#[kernel(name = name, grid = n_blocks, signature = Adam32)]
#[allow(clippy::too_many_arguments)]
pub fn adam32(
    #[config] spec: &OptimSpec,
    #[config] name: &str,
    #[config] grad_opts: bool,
    n: u32,
    n_blocks: u32,
    beta1: f32,
    one_minus_beta1: f32,
    beta2: f32,
    one_minus_beta2: f32,
    #[when(spec.algo == OptimAlgo::AdamW)] decay: f32,
    step_size: f32,
    eps_c2: f32,
    #[when(grad_opts)] gnorm_scale: f32,
    #[when(grad_opts)] skip_zeros: u32,
    #[shape(n)]
    #[dtype(spec.dtype)]
    p: InOut<Float>,
    #[shape(n)]
    #[dtype(spec.dtype)]
    g: In<Float>,
    #[shape(n)] state1: InOut<f32>,
    #[shape(n)] state2: InOut<f32>,
) {
    let h = betas(beta1, one_minus_beta1, beta2, one_minus_beta2);
    let decay = read_option(decay);
    let step_size = step_size;
    let eps_c2 = eps_c2;
    let (gs, skip) = grad_options(gnorm_scale, skip_zeros);
    let (_, start, end) = optim_block(n);
    for e in start..end {
        let graw = g[e];
        let m_old = state1[e];
        let v_old = state2[e];
        let gv = scaled_grad(graw, gs);
        let (finite, m, v) = moments(h, gv, m_old, v_old);
        let (finite, m, v) = skip_moments(skip, gv, m_old, v_old, finite, m, v);
        state1[e] = m;
        state2[e] = v;
        // Straight-line (no branch, so a vectorizing backend takes the loop whole): a
        // non-finite gradient keeps the old parameter value.
        let pv = p[e];
        let pd = match decay {
            Some(d) => pv * d,
            None => pv,
        };
        let den = sqrt(v) + eps_c2;
        let r = m / den;
        let stepped = fma(r, step_size, pd);
        store_rounded(p, e, select(finite, stepped, pv), Rounding::NearestEven);
    }
}
