//! The 16-element iteration of the accumulate vector loop (`accumulate_wide.rs` in the
//! Cranelift backend): packed 4-bit lookups decoded with byte shuffles and block loads done once
//! per 16 elements, against the interpreter at every start parity and alignment, block size,
//! table length, partial count and buffer size (one element too few reports like the
//! interpreter).

use super::{check, encode, le_f32, nibble_of, store_vars, values, Rng};
use qforge::ir::{
    Access, DType, Dim, Kernel, KernelBuilder, OwnedArg, ReduceOrder, Scalar, ScalarType,
};

/// `sum_i x[i] * (table[nibble(u + i)] * scale[(u + i) >> sb])` and
/// `sum_i table[nibble(u + i)] * outer[((u + i) >> 4) >> sg]` with bitsandbytes' nibble order
/// (high nibble first), `x` in `bf16`.
fn nibble_kernel(order: ReduceOrder, table: &[f32], sb: u32, sg: u32) -> Kernel {
    let name = format!("wide_{:?}_{}_{sb}_{sg}", order, table.len()).replace(['(', ')'], "");
    let mut b = KernelBuilder::new(&name);
    let n = b.scalar_param("n", ScalarType::U32);
    let u = b.scalar_param("u", ScalarType::U32);
    let nb = b.scalar_param("nb", ScalarType::U32);
    let ns = b.scalar_param("ns", ScalarType::U32);
    let ng = b.scalar_param("ng", ScalarType::U32);
    let packed = b.buffer_param("packed", DType::U8, &[Dim::Param(nb)], Access::Read);
    let scale = b.buffer_param("scale", DType::F32, &[Dim::Param(ns)], Access::Read);
    let outer = b.buffer_param("outer", DType::F32, &[Dim::Param(ng)], Access::Read);
    let x = b.buffer_param("x", DType::BF16, &[Dim::Param(n)], Access::Read);
    let out = b.buffer_param("out", DType::F32, &[Dim::Const(2)], Access::Write);
    b.set_grid(Dim::Const(1));
    let t = b.table_f32("code", table);
    let (nv, uv) = (b.param(n), b.param(u));
    let vars = [b.var("a", ScalarType::F32), b.var("b", ScalarType::F32)];
    b.accumulate(nv, order, &vars, |b, i| {
        let e = b.add(uv, i);
        let one = b.const_u32(1);
        let at = b.shr(e, one);
        let byte = b.load(packed, at);
        let nib = nibble_of(b, byte, e);
        let code = b.lookup(t, nib);
        let sbv = b.const_u32(sb);
        let si = b.shr(e, sbv);
        let s = b.load(scale, si);
        let w = b.mul(code, s);
        let four = b.const_u32(4);
        let g0 = b.shr(e, four);
        let sgv = b.const_u32(sg);
        let gi = b.shr(g0, sgv);
        let g = b.load(outer, gi);
        let xv = b.load(x, i);
        vec![(xv, w), (code, g)]
    });
    store_vars(&mut b, out, &vars);
    b.finish()
}

#[test]
fn nibble_lookups_sixteen_at_a_time_match_the_interpreter() {
    let nf4: Vec<f32> = (0..16).map(|c| (c as f32 - 7.0) / 7.5).collect();
    let short: Vec<f32> = (0..11).map(|c| c as f32 * 0.25 - 1.0).collect();
    let mut r = Rng(29);
    for order in [
        ReduceOrder::Strided(4),
        ReduceOrder::Strided(8),
        ReduceOrder::Strided(16),
        ReduceOrder::Strided(32),
    ] {
        for (table, sb, sg) in [(&nf4, 6u32, 8u32), (&short, 4, 0), (&nf4, 5, 3)] {
            let kernel = nibble_kernel(order, table, sb, sg);
            // u: 0 and 64 aligned, 6 and 70 even but not aligned to 16, 3 odd (no wide
            // iterations: the range proof needs an even start).
            for (n, u) in [
                (16u32, 0u32),
                (64, 64),
                (100, 6),
                (131, 70),
                (48, 3),
                (15, 0),
                (200, 16),
            ] {
                for extra in [-1i64, 0, 1] {
                    let need = |s: u32| ((u + n - 1) >> s) as i64 + 1;
                    let size = |s: u32| (need(s) + extra).max(0) as usize;
                    let (nb, ns, ng) = (size(1), size(sb), size(4 + sg));
                    let args = vec![
                        OwnedArg::Scalar(Scalar::U32(n)),
                        OwnedArg::Scalar(Scalar::U32(u)),
                        OwnedArg::Scalar(Scalar::U32(nb as u32)),
                        OwnedArg::Scalar(Scalar::U32(ns as u32)),
                        OwnedArg::Scalar(Scalar::U32(ng as u32)),
                        OwnedArg::Read((0..nb).map(|_| r.next() as u8).collect()),
                        OwnedArg::Read(le_f32(&values(ns, r.next(), 5))),
                        OwnedArg::Read(le_f32(&values(ng, r.next(), 0))),
                        OwnedArg::Read(encode(DType::BF16, &values(n as usize, r.next(), 4))),
                        OwnedArg::Write(vec![0xA5; 8]),
                    ];
                    check(&kernel, &args);
                }
            }
        }
    }
}
