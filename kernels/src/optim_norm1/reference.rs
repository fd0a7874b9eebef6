//! The builder version of the `max_unorm` partials, as it was before the kernel moved to the
//! kernel language ([`crate::optim_norm1::kernel`]); a test proves the two equal.

use crate::optim1::Optim1Algo;
use crate::optim_norm::reference::{declare, emit_partials, is_finite, partial_outputs};
use crate::optim_norm::reference::{declare_gs, scaled_grad};
use crate::optim_norm1::NORM1_ALGOS;
use qforge_ir::DType;
use qforge_ir::KernelBuilder;
use qforge_ir::{Access, Dim, Kernel, Value};

/// The builder version of `{algo}_norm_f32` named `kname` (`rms`: RMSprop's state update).
fn build_builder(rms: bool, kname: &str, gs: bool) -> Kernel {
    let mut b = KernelBuilder::new(kname);
    let (n, n_blocks, ps) = declare(&mut b, &[], &["beta1", "one_minus_beta1", "eps"]);
    let gsp = declare_gs(&mut b, gs);
    let shape = [Dim::Param(n)];
    let p = b.buffer_param("p", DType::F32, &shape, Access::Read);
    let g = b.buffer_param("g", DType::F32, &shape, Access::Read);
    let s1 = b.buffer_param("state1", DType::F32, &shape, Access::Read);
    let outs = partial_outputs(&mut b, n_blocks);
    b.set_grid(Dim::Param(n_blocks));
    let v: Vec<Value> = ps.iter().map(|q| b.param(*q)).collect();
    let (beta1, one_minus_beta1, eps) = (v[0], v[1], v[2]);
    let gsv = gsp.map(|q| b.param(q));
    emit_partials(&mut b, n, p, outs, |b, e| {
        let graw = b.load(g, e);
        let gv = scaled_grad(b, gsv, graw);
        let s_old = b.load(s1, e);
        let s = if rms {
            let t = b.mul(one_minus_beta1, gv);
            let t = b.mul(t, gv);
            b.fma(s_old, beta1, t)
        } else {
            b.fma(gv, gv, s_old)
        };
        let sq = b.sqrt(s);
        let den = b.add(sq, eps);
        let u = b.div(gv, den);
        let finite = is_finite(b, gv);
        let zero = b.const_f32(0.0);
        b.select(finite, u, zero)
    });
    b.finish()
}

/// The macro-built kernels are the builder-built ones (same IR, so the same snapshots) for
/// RMSprop and Adagrad, plain and `_gs`.
#[test]
fn the_macro_kernels_equal_the_builder_versions() {
    for algo in NORM1_ALGOS {
        let rms = algo == Optim1Algo::Rmsprop;
        for gs in [false, true] {
            let k = super::build(algo, gs).unwrap();
            let old = build_builder(rms, &k.name, gs);
            assert!(k == old, "{} differs", k.name);
        }
    }
}
