//! Loads and stores of every dtype (f16/bf16 exhaustively) and table lookups.

use super::*;

#[test]
fn narrow_loads_widen_exactly() {
    let bytes: Vec<u8> = (0..=255).collect();
    let got = u32s(&run_elementwise(
        &elementwise("load_u8", &[DType::U8], DType::U32, |_, v| v[0]),
        std::slice::from_ref(&bytes),
        DType::U32,
    ));
    assert_eq!(got, (0..=255).collect::<Vec<u32>>());
    let got = u32s(&run_elementwise(
        &elementwise("load_i8", &[DType::I8], DType::I32, |_, v| v[0]),
        &[bytes],
        DType::I32,
    ));
    assert_eq!(
        got,
        (0..=255u32)
            .map(|b| b as u8 as i8 as i32 as u32)
            .collect::<Vec<_>>()
    );
    let all16: Vec<u8> = (0..=u16::MAX).flat_map(|h| h.to_le_bytes()).collect();
    let got = f32s(&run_elementwise(
        &elementwise("load_f16", &[DType::F16], DType::F32, |_, v| v[0]),
        std::slice::from_ref(&all16),
        DType::F32,
    ));
    assert_f32(
        &got,
        &(0..=u16::MAX)
            .map(|h| f16::from_bits(h).to_f32())
            .collect::<Vec<_>>(),
        |i| format!("f16 {i:#06x}"),
    );
    let got = f32s(&run_elementwise(
        &elementwise("load_bf16", &[DType::BF16], DType::F32, |_, v| v[0]),
        &[all16],
        DType::F32,
    ));
    assert_f32(
        &got,
        &(0..=u16::MAX)
            .map(|h| bf16::from_bits(h).to_f32())
            .collect::<Vec<_>>(),
        |i| format!("bf16 {i:#06x}"),
    );
}

/// Every finite value of a 16-bit format (as f32), the midpoints between neighbours (ties) and
/// one f32 ulp either side of each midpoint, plus the f32 edge values.
fn narrow_store_inputs(to_f32: impl Fn(u16) -> f32, inf: u16) -> Vec<f32> {
    let mut v = f_edges();
    for h in 0..inf {
        let (lo, hi) = (to_f32(h), to_f32(h + 1));
        if !lo.is_finite() || !hi.is_finite() {
            continue;
        }
        let mid = (lo as f64 + hi as f64) / 2.0;
        let mid = mid as f32; // exact for both formats
        for x in [lo, mid, mid.next_down(), mid.next_up()] {
            v.push(x);
            v.push(-x);
        }
    }
    v
}

#[test]
fn narrow_stores_round_to_nearest_even() {
    let ints: Vec<u32> = U_EDGES.iter().copied().chain(0..600).collect();
    let got = run_elementwise(
        &elementwise("store_u8", &[DType::U32], DType::U8, |_, v| v[0]),
        &[le_u32(&ints)],
        DType::U8,
    );
    assert_eq!(got, ints.iter().map(|x| *x as u8).collect::<Vec<_>>());
    let got = run_elementwise(
        &elementwise("store_i8", &[DType::I32], DType::I8, |_, v| v[0]),
        &[le_u32(&ints)],
        DType::I8,
    );
    assert_eq!(got, ints.iter().map(|x| *x as u8).collect::<Vec<_>>());

    // f16: ties between all neighbours (including subnormals), overflow at 65520.
    let x = narrow_store_inputs(|h| f16::from_bits(h).to_f32(), 0x7c00);
    let got = run_elementwise(
        &elementwise("store_f16", &[DType::F32], DType::F16, |_, v| v[0]),
        &[le_f32(&x)],
        DType::F16,
    );
    for (i, c) in got.chunks_exact(2).enumerate() {
        let (g, w) = (f16::from_le_bytes([c[0], c[1]]), f16::from_f32(x[i]));
        assert!(
            g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
            "f16({:?}) = {g:?}, want {w:?}",
            x[i]
        );
    }
    let x = narrow_store_inputs(|h| bf16::from_bits(h).to_f32(), 0x7f80);
    let got = run_elementwise(
        &elementwise("store_bf16", &[DType::F32], DType::BF16, |_, v| v[0]),
        &[le_f32(&x)],
        DType::BF16,
    );
    for (i, c) in got.chunks_exact(2).enumerate() {
        let (g, w) = (bf16::from_le_bytes([c[0], c[1]]), bf16::from_f32(x[i]));
        assert!(
            g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
            "bf16({:?}) = {g:?}, want {w:?}",
            x[i]
        );
    }
}

#[test]
fn lookup_clamps_the_index() {
    let table = [10.0f32, -0.0, f32::NAN, 2.5, f32::MIN_POSITIVE];
    let idx: Vec<u32> = vec![0, 1, 2, 3, 4, 5, 6, 100, 0x8000_0000, u32::MAX];
    let k = elementwise("lookup_f32", &[DType::U32], DType::F32, |b, v| {
        let t = b.table_f32("codes", &table);
        b.lookup(t, v[0])
    });
    let got = f32s(&run_elementwise(&k, &[le_u32(&idx)], DType::F32));
    let want: Vec<f32> = idx
        .iter()
        .map(|i| table[(*i as usize).min(table.len() - 1)])
        .collect();
    assert_f32(&got, &want, |i| format!("lookup[{}]", idx[i]));
    let k = elementwise("lookup_u32", &[DType::U32], DType::U32, |b, v| {
        let t = b.table_u32("ints", &[7, 0xffff_ffff]);
        b.lookup(t, v[0])
    });
    let got = u32s(&run_elementwise(&k, &[le_u32(&idx)], DType::U32));
    assert_eq!(
        got,
        idx.iter()
            .map(|i| if *i == 0 { 7 } else { 0xffff_ffff })
            .collect::<Vec<_>>()
    );
}

#[test]
fn lookup_of_bounded_nibbles() {
    // `byte >> 4` and `byte & 15` are at most 15: no clamp is needed for 16 entries, and one
    // is still needed for 5 (the lowering proves bounds from the ops, see the clif test).
    let bytes: Vec<u8> = (0..=255).collect();
    let codes: Vec<f32> = (0..16).map(|i| i as f32 * 0.25 - 2.0).collect();
    for len in [16usize, 5] {
        let table = codes[..len].to_vec();
        let k = elementwise(
            &format!("nibbles_{len}"),
            &[DType::U8],
            DType::F32,
            |b, v| {
                let t = b.table_f32("code", &table);
                let (four, fifteen) = (b.const_u32(4), b.const_u32(15));
                let hi = b.shr(v[0], four);
                let lo = b.and(v[0], fifteen);
                let (x, y) = (b.lookup(t, hi), b.lookup(t, lo));
                let ten = b.const_f32(10.0);
                let x10 = b.mul(x, ten);
                b.add(x10, y)
            },
        );
        let got = f32s(&run_elementwise(
            &k,
            std::slice::from_ref(&bytes),
            DType::F32,
        ));
        let at = |i: u8| table[(i as usize).min(len - 1)];
        let want: Vec<f32> = bytes
            .iter()
            .map(|b| at(b >> 4) * 10.0 + at(b & 15))
            .collect();
        assert_f32(&got, &want, |i| format!("{len} codes, byte {i}"));
    }
}
