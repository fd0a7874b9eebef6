//! The 8-bit blockwise Adam / AdamW kernel in the kernel language, in every form
//! ([`crate::adam::Form`]: plain, `_gs`, trust-ratio scaled, staged). Semantics,
//! parameters and the two passes are documented in [`crate::adam`].

use qforge_macros::{func, kernel};

use crate::adam::{Form, OptimAlgo, OptimSpec};
use crate::funcs::inv_absmax;
// `is_finite` and `absmax_step` stay reachable here (other families import them from this path).
pub(crate) use crate::optim_funcs::{absmax_step, is_finite};
use crate::optim_funcs::{betas, moments, optim_block, scaled_grad, Betas};
use crate::{nearest, BlockwiseMap};
use qforge_ir::dsl::{Buf, Float, In, InOut, Table, TypedKernel, Val};
use qforge_ir::Kernel;
use qforge_ir::Result;
use qforge_ir::Rounding;

/// One moment's 8-bit state: the codes, the code table and the nearest-code thresholds.
#[derive(Clone, Copy)]
pub(crate) struct State8 {
    pub(crate) codes: Buf<InOut<u8>>,
    pub(crate) code: Table<f32>,
    pub(crate) thresholds: Table<f32>,
}

/// Declares the code and threshold tables of `map` (`code{which}`, `mid_thresholds{which}`).
#[func]
pub(crate) fn state8(codes: Buf<InOut<u8>>, map: BlockwiseMap, which: &str) -> State8 {
    State8 {
        codes: codes,
        code: table_f32(&comptime!(format!("code{which}")), &map.code()),
        thresholds: table_f32(
            &comptime!(format!("mid_thresholds{which}")),
            &comptime!(nearest::thresholds(&map.code()))?,
        ),
    }
}

/// The gradient of element `e`, scaled by `gnorm_scale` in a `_gs` kernel.
#[func]
fn grad(g: Buf<In<Float>>, e: Val<u32>, gnorm_scale: Option<Val<f32>>) -> Val<f32> {
    let gv = g[e];
    scaled_grad(gv, gnorm_scale)
}

/// The updated moments of element `e` from the old codes and absmax.
#[func]
#[allow(clippy::too_many_arguments)]
fn update(
    h: Betas,
    g: Buf<In<Float>>,
    gnorm_scale: Option<Val<f32>>,
    s1: State8,
    old_a1: Val<f32>,
    s2: State8,
    old_a2: Val<f32>,
    e: Val<u32>,
) -> (Val<bool>, Val<f32>, Val<f32>) {
    let gv = grad(g, e, gnorm_scale);
    let m_old = s1.code[s1.codes[e]] * old_a1;
    let v_old = s2.code[s2.codes[e]] * old_a2;
    moments(h, gv, m_old, v_old)
}

/// The 8-bit Adam / AdamW kernel `name` of `spec` in the variant `form` (see the module docs).
///
/// # Errors
/// [`crate::Error::Unsupported`] for a parameter dtype other than f32, f16, bf16.
#[kernel(name = name, grid = n_blocks)]
pub fn adam8bit(
    #[config] spec: &OptimSpec,
    #[config] name: &str,
    #[config] form: Form,
    n: u32,
    n_blocks: u32,
    beta1: f32,
    one_minus_beta1: f32,
    beta2: f32,
    one_minus_beta2: f32,
    #[when(spec.algo == OptimAlgo::AdamW)] decay: f32,
    step_size: f32,
    c2: f32,
    eps: f32,
    #[when(form.grad_opts)] gnorm_scale: f32,
    #[shape(n)]
    #[dtype(spec.dtype)]
    p: InOut<Float>,
    #[shape(n)]
    #[dtype(spec.dtype)]
    g: In<Float>,
    #[shape(n)] state1: InOut<u8>,
    #[shape(n_blocks)] absmax1: InOut<f32>,
    #[shape(n)] state2: InOut<u8>,
    #[shape(n_blocks)] absmax2: InOut<f32>,
    #[when(form.scaled)]
    #[shape(1)]
    scale: In<f32>,
    #[when(form.staged)]
    #[shape(n)]
    m_stage: InOut<f32>,
    #[when(form.staged)]
    #[shape(n)]
    v_stage: InOut<f32>,
) {
    let s1 = state8(state1, BlockwiseMap::Dynamic, "1");
    let s2 = state8(state2, BlockwiseMap::DynamicUnsigned, "2");
    let h = betas(beta1, one_minus_beta1, beta2, one_minus_beta2);
    let decay = read_option(decay);
    let step_size = step_size;
    let c2 = c2;
    let eps = eps;
    let gs = read_option(gnorm_scale);
    // 8-bit LAMB: `step_size = scale[0] * step_size`, where `lamb32` multiplies it.
    let step_size = match scale {
        Some(sc) => {
            let zero = val(0u32);
            sc[zero] * step_size
        }
        None => step_size,
    };
    let (block, start, end) = optim_block(n);
    let old_a1 = absmax1[block];
    let old_a2 = absmax2[block];
    let acc1 = var::<f32>("absmax1_acc");
    let acc2 = var::<f32>("absmax2_acc");
    // Pass 1: the new absmax of each moment (and, staged, the moments themselves).
    for e in start..end {
        let (_, m, v) = update(h, g, gs, s1, old_a1, s2, old_a2, e);
        match (m_stage, v_stage) {
            (Some(ms), Some(vs)) => {
                ms[e] = m;
                vs[e] = v;
            }
            _ => {}
        }
        absmax_step(acc1, m);
        absmax_step(acc2, v);
    }
    let new_a1 = acc1;
    let new_a2 = acc2;
    absmax1[block] = new_a1;
    absmax2[block] = new_a2;
    let inv1 = inv_absmax(new_a1);
    let inv2 = inv_absmax(new_a2);
    // Pass 2 (straight-line): the same moments again (recomputed bit-identically, or read back
    // from the stage), the parameter, and the moments requantized with the new absmax.
    for e in start..end {
        let (finite, m, v) = match (m_stage, v_stage) {
            (Some(ms), Some(vs)) => {
                let gv = grad(g, e, gs);
                let finite = is_finite(gv);
                (finite, ms[e], vs[e])
            }
            _ => update(h, g, gs, s1, old_a1, s2, old_a2, e),
        };
        let pv = p[e];
        let pd = match decay {
            Some(d) => pv * d,
            None => pv,
        };
        let num = step_size * m;
        let d = sqrt(v) / c2;
        let den = d + eps;
        let upd = num / den;
        let stepped = pd + upd;
        // A non-finite gradient leaves the parameter as it was.
        store_rounded(p, e, select(finite, stepped, pv), Rounding::NearestEven);
        let q1 = search_sorted(s1.thresholds, m * inv1);
        let q2 = search_sorted(s2.thresholds, v * inv2);
        state1[e] = q1;
        state2[e] = q2;
    }
}

/// [`adam8bit`] as a plain kernel.
///
/// # Errors
/// As [`adam8bit`].
pub(crate) fn build8(spec: &OptimSpec, name: &str, form: Form) -> Result<Kernel> {
    adam8bit(spec, name, form).map(TypedKernel::into_kernel)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adam::reference::build8_builder;
    use crate::adam::StateBits;
    use crate::FLOAT_DTYPES;

    /// The macro-built kernel is the builder-built one (same IR, so the same snapshots) for both
    /// algorithms, every dtype and every form, the combined ones included.
    #[test]
    fn adam8bit_equals_the_builder_version_in_every_form() {
        for algo in [OptimAlgo::Adam, OptimAlgo::AdamW] {
            for dtype in FLOAT_DTYPES {
                let spec = OptimSpec {
                    algo,
                    state: StateBits::Bits8,
                    dtype,
                };
                for bits in 0..8u32 {
                    let form = Form {
                        grad_opts: bits & 1 != 0,
                        scaled: bits & 2 != 0,
                        staged: bits & 4 != 0,
                    };
                    let k = build8(&spec, "adam8", form).unwrap();
                    let old = build8_builder(&spec, "adam8", form).unwrap();
                    assert!(k == old, "{algo:?} {dtype} form {bits:03b} differs");
                }
            }
        }
    }
}
