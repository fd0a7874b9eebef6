//! The builder version of the AdEMAMix kernels, as it was before the kernels moved to the
//! kernel language ([`crate::optim_ademamix::kernel`]); tests prove the two equal.

use crate::adam::{state_tables, StateBits, OPTIM_BLOCKSIZE};
use crate::emit::{block_range, inv_absmax};
use crate::nearest;
use crate::optim_ademamix::{AdemamixSpec, SCALAR_NAMES};
use crate::BlockwiseMap;
use qforge_ir::CmpOp;
use qforge_ir::KernelBuilder;
use qforge_ir::Result;
use qforge_ir::{Access, Dim, Kernel, ParamId, Value};
use qforge_ir::{DType, ScalarType};

/// `(finite, [m1, nu, m2])` of one element; all `+0.0` for a non-finite `g`.
fn moments(b: &mut KernelBuilder, h: &[Value], g: Value, old: [Value; 3]) -> (Value, [Value; 3]) {
    let t1 = b.mul(h[1], g);
    let m1 = b.fma(old[0], h[0], t1);
    let t2 = b.mul(h[3], g);
    let t2 = b.mul(t2, g);
    let nu = b.fma(old[1], h[2], t2);
    let t3 = b.mul(h[5], g);
    let m2 = b.fma(old[2], h[4], t3);
    let ag = b.abs(g);
    let inf = b.const_f32(f32::INFINITY);
    let finite = b.cmp(CmpOp::Lt, ag, inf);
    let zero = b.const_f32(0.0);
    let out = [m1, nu, m2].map(|x| b.select(finite, x, zero));
    (finite, out)
}

/// The new parameter from the decayed old one and the new moments.
fn param(b: &mut KernelBuilder, h: &[Value], p: Value, s: [Value; 3]) -> Value {
    let pd = b.mul(p, h[10]);
    let a = b.div(s[0], h[7]);
    let num = b.fma(h[6], s[2], a);
    let sq = b.sqrt(s[1]);
    let d = b.div(sq, h[8]);
    let den = b.add(d, h[9]);
    let r = b.div(num, den);
    b.fma(h[11], r, pd)
}

pub(crate) fn build_builder(spec: &AdemamixSpec) -> Result<Kernel> {
    let mut b = KernelBuilder::new(&spec.name());
    let n = b.scalar_param("n", ScalarType::U32);
    let n_blocks = b.scalar_param("n_blocks", ScalarType::U32);
    let ps: Vec<ParamId> = SCALAR_NAMES
        .iter()
        .map(|s| b.scalar_param(s, ScalarType::F32))
        .collect();
    let shape = [Dim::Param(n)];
    let blocks = [Dim::Param(n_blocks)];
    let p = b.buffer_param("p", DType::F32, &shape, Access::ReadWrite);
    let g = b.buffer_param("g", DType::F32, &shape, Access::Read);
    let eight = spec.state == StateBits::Bits8;
    let sdt = if eight { DType::U8 } else { DType::F32 };
    let mut st = Vec::new();
    let mut am = Vec::new();
    for k in 1..=3 {
        st.push(b.buffer_param(&format!("state{k}"), sdt, &shape, Access::ReadWrite));
        if eight {
            let a = b.buffer_param(
                &format!("absmax{k}"),
                DType::F32,
                &blocks,
                Access::ReadWrite,
            );
            am.push(a);
        }
    }
    b.set_grid(Dim::Param(n_blocks));
    let h: Vec<Value> = ps.iter().map(|x| b.param(*x)).collect();
    let block = b.work_item();
    let nv = b.param(n);
    let (start, end) = block_range(&mut b, block, OPTIM_BLOCKSIZE, nv);
    if !eight {
        b.for_range(start, end, 1, |b, e| {
            let gv = b.load(g, e);
            let old = [0, 1, 2].map(|k| b.load(st[k], e));
            let (finite, s) = moments(b, &h, gv, old);
            for k in 0..3 {
                b.store(st[k], e, s[k]);
            }
            // Straight-line: a non-finite gradient keeps the old parameter.
            let pv = b.load(p, e);
            let stepped = param(b, &h, pv, s);
            let out = b.select(finite, stepped, pv);
            b.store(p, e, out);
        });
        return Ok(b.finish());
    }
    // m1 and m2 on the signed map, nu on the unsigned one.
    let signed = state_tables(&mut b, BlockwiseMap::Dynamic, "1")?;
    let unsigned = state_tables(&mut b, BlockwiseMap::DynamicUnsigned, "2")?;
    let tables = [&signed, &unsigned, &signed];
    let old_a: Vec<Value> = am.iter().map(|a| b.load(*a, block)).collect();
    let update = |b: &mut KernelBuilder, e: Value| -> (Value, Value, [Value; 3]) {
        let gv = b.load(g, e);
        let old = [0, 1, 2].map(|k| {
            let q = b.load(st[k], e);
            let c = b.lookup(tables[k].code, q);
            b.mul(c, old_a[k])
        });
        let (finite, s) = moments(b, &h, gv, old);
        (gv, finite, s)
    };
    let accs = [1, 2, 3].map(|k| b.var(&format!("absmax{k}_acc"), ScalarType::F32));
    // Pass 1: the new absmax of each state.
    b.for_range(start, end, 1, |b, e| {
        let (_, _, s) = update(b, e);
        for k in 0..3 {
            let a = b.abs(s[k]);
            let cur = b.read_var(accs[k]);
            let mx = b.max(cur, a);
            b.assign(accs[k], mx);
        }
    });
    let mut inv = Vec::new();
    for k in 0..3 {
        let a = b.read_var(accs[k]);
        b.store(am[k], block, a);
        inv.push(inv_absmax(&mut b, a));
    }
    // Pass 2 (straight-line): the same states again, the parameter (unchanged where the
    // gradient is not finite) and the requantized states.
    b.for_range(start, end, 1, |b, e| {
        let (_, finite, s) = update(b, e);
        let pv = b.load(p, e);
        let stepped = param(b, &h, pv, s);
        let out = b.select(finite, stepped, pv);
        b.store(p, e, out);
        for k in 0..3 {
            let sc = b.mul(s[k], inv[k]);
            let q = nearest::emit_code(b, sc, &tables[k].nearest);
            b.store(st[k], e, q);
        }
    });
    Ok(b.finish())
}

/// The macro-built kernels are the builder-built ones (same IR, so the same snapshots).
#[test]
fn the_macro_kernels_equal_the_builder_versions() {
    for state in [StateBits::Bits32, StateBits::Bits8] {
        let spec = AdemamixSpec {
            state,
            dtype: DType::F32,
        };
        let k = spec.build().unwrap();
        let old = build_builder(&spec).unwrap();
        assert!(k == old, "{} differs", spec.name());
    }
}
