//! The builder versions of the 8-bit LAMB / LARS norm partials, as they were before the kernels
//! moved to the kernel language ([`crate::optim_norm8::kernel`]); a test proves the two equal.

use crate::optim_norm::reference::{declare, emit_partials, partial_outputs, LAMB_NORM_SCALARS};
use crate::optim_norm::reference::{declare_gs, scaled_grad};
use crate::optim_norm::reference::{lamb_norm_update, lars_norm_update};
use crate::optim_norm::NormRule;
use crate::optim_norm8::OptimNorm8Spec;
use crate::BlockwiseMap;
use qforge_ir::DType;
use qforge_ir::KernelBuilder;
use qforge_ir::{Access, Dim, Kernel, Value};

/// `code[state[e]] * absmax` (the 8-bit kernels' decode).
fn decode(
    b: &mut KernelBuilder,
    code: qforge_ir::TableId,
    state: qforge_ir::ParamId,
    absmax: Value,
    e: Value,
) -> Value {
    let q = b.load(state, e);
    let c = b.lookup(code, q);
    b.mul(c, absmax)
}

fn build_lamb8_partials(name: &str, dtype: DType, gs: bool) -> Kernel {
    let mut b = KernelBuilder::new(name);
    let (n, n_blocks, ps) = declare(&mut b, &[], &LAMB_NORM_SCALARS);
    let gsp = declare_gs(&mut b, gs);
    let shape = [Dim::Param(n)];
    let blocks = [Dim::Param(n_blocks)];
    let p = b.buffer_param("p", dtype, &shape, Access::Read);
    let g = b.buffer_param("g", dtype, &shape, Access::Read);
    let s1 = b.buffer_param("state1", DType::U8, &shape, Access::Read);
    let a1 = b.buffer_param("absmax1", DType::F32, &blocks, Access::Read);
    let s2 = b.buffer_param("state2", DType::U8, &shape, Access::Read);
    let a2 = b.buffer_param("absmax2", DType::F32, &blocks, Access::Read);
    let outs = partial_outputs(&mut b, n_blocks);
    b.set_grid(Dim::Param(n_blocks));
    let code1 = b.table_f32("code1", &BlockwiseMap::Dynamic.code());
    let code2 = b.table_f32("code2", &BlockwiseMap::DynamicUnsigned.code());
    let s: Vec<Value> = ps.iter().map(|q| b.param(*q)).collect();
    let gsv = gsp.map(|q| b.param(q));
    let block = b.work_item();
    let old_a1 = b.load(a1, block);
    let old_a2 = b.load(a2, block);
    emit_partials(&mut b, n, p, outs, |b, e| {
        let graw = b.load(g, e);
        let gv = scaled_grad(b, gsv, graw);
        let m_old = decode(b, code1, s1, old_a1, e);
        let v_old = decode(b, code2, s2, old_a2, e);
        lamb_norm_update(b, &s, gv, m_old, v_old)
    });
    b.finish()
}

fn build_lars8_partials(name: &str, gs: bool) -> Kernel {
    let mut b = KernelBuilder::new(name);
    let (n, n_blocks, ps) = declare(&mut b, &["first"], &["momentum"]);
    let gsp = declare_gs(&mut b, gs);
    let shape = [Dim::Param(n)];
    let p = b.buffer_param("p", DType::F32, &shape, Access::Read);
    let g = b.buffer_param("g", DType::F32, &shape, Access::Read);
    let s1 = b.buffer_param("state1", DType::U8, &shape, Access::Read);
    let a1 = b.buffer_param("absmax1", DType::F32, &[Dim::Param(n_blocks)], Access::Read);
    let outs = partial_outputs(&mut b, n_blocks);
    b.set_grid(Dim::Param(n_blocks));
    let code1 = b.table_f32("code1", &BlockwiseMap::Dynamic.code());
    let first = b.param(ps[0]);
    let mom = b.param(ps[1]);
    let gsv = gsp.map(|q| b.param(q));
    let block = b.work_item();
    let old_a1 = b.load(a1, block);
    emit_partials(&mut b, n, p, outs, |b, e| {
        let graw = b.load(g, e);
        let gv = scaled_grad(b, gsv, graw);
        let s_old = decode(b, code1, s1, old_a1, e);
        lars_norm_update(b, first, mom, gv, s_old)
    });
    b.finish()
}

/// The macro-built partials are the builder-built ones (same IR, so the same snapshots) for
/// both rules, every dtype they take, plain and `_gs`.
#[test]
fn the_macro_partials_equal_the_builder_versions() {
    for rule in NormRule::ALL {
        for &dtype in rule.param_dtypes() {
            let spec = OptimNorm8Spec::Partials { rule, dtype };
            for gs in [false, true] {
                let name = if gs { "k_gs".to_string() } else { spec.name() };
                let k = if gs {
                    spec.build_gs(&name).unwrap()
                } else {
                    spec.build().unwrap()
                };
                let old = match rule {
                    NormRule::Lamb => build_lamb8_partials(&name, dtype, gs),
                    NormRule::Lars => build_lars8_partials(&name, gs),
                };
                assert!(k == old, "{} gs {gs} differs", spec.name());
            }
        }
    }
}
