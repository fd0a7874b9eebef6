//! The 32-bit Adam / AdamW kernel in the kernel language, plain and `_gs` (`gnorm_scale`,
//! `skip_zeros`, [`crate::optim_ext`]). Semantics and parameters are documented in
//! [`crate::adam`].

use qforge_macros::{func, kernel};

use crate::adam::optim8::{moments, Betas};
use crate::adam::{OptimAlgo, OptimSpec, OPTIM_BLOCKSIZE};
use crate::funcs::block_range;
use qforge_ir::dsl::{Float, In, InOut, Scalar, Val};
use qforge_ir::Rounding;

/// The `_gs` values: `gnorm_scale` and `skip_zeros != 0`.
#[func]
fn grad_options(
    gnorm_scale: Option<Scalar<f32>>,
    skip_zeros: Option<Scalar<u32>>,
) -> (Option<Val<f32>>, Option<Val<bool>>) {
    let gs = read_option(gnorm_scale);
    let skip = match read_option(skip_zeros) {
        Some(s) => Some(s != 0u32),
        None => None,
    };
    (gs, skip)
}

/// `_gs`: a skipped element (`skip_zeros` on and the scaled gradient `g == ±0`) keeps its
/// moments and its parameter (no weight decay either): `(finite && !skipped, m, v)`.
#[func]
#[allow(clippy::too_many_arguments)]
fn skip_rule(
    skip: Option<Val<bool>>,
    g: Val<f32>,
    m_old: Val<f32>,
    v_old: Val<f32>,
    finite: Val<bool>,
    m: Val<f32>,
    v: Val<f32>,
) -> (Val<bool>, Val<f32>, Val<f32>) {
    match skip {
        Some(on) => {
            let sk = on && g == 0.0f32;
            let m = select(sk, m_old, m);
            let v = select(sk, v_old, v);
            let keep = !sk;
            (finite && keep, m, v)
        }
        None => (finite, m, v),
    }
}

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
    let h = Betas {
        beta1: beta1,
        one_minus_beta1: one_minus_beta1,
        beta2: beta2,
        one_minus_beta2: one_minus_beta2,
    };
    let decay = read_option(decay);
    let step_size = step_size;
    let eps_c2 = eps_c2;
    let (gs, skip) = grad_options(gnorm_scale, skip_zeros);
    let block = work_item();
    let nv = n;
    let (start, end) = block_range(block, OPTIM_BLOCKSIZE, nv);
    for e in start..end {
        let graw = g[e];
        let m_old = state1[e];
        let v_old = state2[e];
        let gv = match gs {
            Some(s) => graw * s,
            None => graw,
        };
        let (finite, m, v) = moments(h, gv, m_old, v_old);
        let (finite, m, v) = skip_rule(skip, gv, m_old, v_old, finite, m, v);
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
