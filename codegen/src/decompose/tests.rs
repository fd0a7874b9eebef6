use proptest::prelude::*;
use qforge_ir::{Access, DType, Dim, Kernel, OwnedArg, Scalar, ScalarType};
use qforge_kernels::{nearest, BlockwiseMap};

use super::buckets::{count_below, BucketIndex, Buckets};
use super::packed::Packed;
use super::*;

/// The searched thresholds of a bitsandbytes map (255 midpoints and two `+inf`).
fn map_thresholds(map: BlockwiseMap) -> Vec<f32> {
    nearest::thresholds(&map.code()).unwrap()
}

/// Values around every threshold and bucket boundary of `bk`, and the special values.
fn edge_values(bk: &Buckets) -> Vec<f32> {
    let mut v = vec![
        0.0,
        -0.0,
        1.0,
        -1.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        f32::from_bits(1),
        -f32::from_bits(1),
        f32::MIN_POSITIVE,
        -f32::MIN_POSITIVE,
        f32::MAX,
        f32::MIN,
        f32::from_bits(0x7fc0_0001),
        f32::from_bits(0xff80_0001),
    ];
    for t in bk.thresholds.iter().filter(|t| t.is_finite()) {
        let (mut up, mut down) = (*t, *t);
        v.push(*t);
        for _ in 0..3 {
            up = up.next_up();
            down = down.next_down();
            v.extend([up, down]);
        }
    }
    for j in 0..=bk.index.per_sign {
        let m = ((bk.index.first + j) as u64) << bk.index.shift;
        if m <= 0x7f80_0000 {
            let x = f32::from_bits(m as u32);
            for y in [x, x.next_up(), x.next_down()] {
                v.extend([y, -y]);
            }
        }
    }
    v
}

/// The reference count: 0 for NaN, else the entries below `v`.
fn reference(t: &[f32], v: f32) -> u32 {
    if v.is_nan() {
        0
    } else {
        count_below(t, v)
    }
}

/// A bucket index of `map` is signed exactly for the signed maps, and its table has
/// `per_sign` entries per sign (`len` in all).
fn assert_index_covers(index: &BucketIndex, map: BlockwiseMap, len: usize) {
    assert_eq!(index.signed, map != BlockwiseMap::DynamicUnsigned, "{map}");
    let halves = if index.signed { 2 } else { 1 };
    assert_eq!(len, halves * index.per_sign as usize, "{map}");
}

#[test]
fn buckets_of_bitsandbytes_maps_meet_the_bound_and_stay_small() {
    for map in BlockwiseMap::ALL {
        let bk = Buckets::new(&map_thresholds(map)).unwrap();
        assert_eq!(bk.thresholds.len(), 255 + BUCKET_COMPARES as usize);
        assert_index_covers(&bk.index, map, bk.buckets.len());
        assert!(bk.buckets.iter().all(|c| *c <= 255));
        let packed = bk.packed();
        assert_eq!(packed.len(), bk.buckets.len().div_ceil(4));
        // The sizes the module docs quote.
        match map {
            BlockwiseMap::Dynamic => assert_eq!(packed.len(), 350),
            BlockwiseMap::DynamicUnsigned => assert_eq!(packed.len(), 363),
            BlockwiseMap::Linear => {}
        }
        for (i, c) in bk.buckets.iter().enumerate() {
            assert_eq!(
                (packed[i / 4] >> (8 * (i % 4))) & 255,
                *c,
                "{map}: bucket {i}"
            );
        }
    }
}

#[test]
fn buckets_match_the_binary_search_on_edge_values() {
    for map in BlockwiseMap::ALL {
        let t = map_thresholds(map);
        let bk = Buckets::new(&t).unwrap();
        for v in edge_values(&bk) {
            assert_eq!(
                bk.count(v),
                reference(&t, v),
                "{map}: v = {v:e} ({:#010x})",
                v.to_bits()
            );
        }
    }
}

/// Every 4099th bit pattern (about a million values per map) and its neighbour.
#[test]
fn buckets_match_the_binary_search_on_a_strided_sweep() {
    for map in BlockwiseMap::ALL {
        let t = map_thresholds(map);
        let bk = Buckets::new(&t).unwrap();
        for x in (0..=u32::MAX).step_by(4099) {
            for bits in [x, x ^ 1] {
                let v = f32::from_bits(bits);
                assert_eq!(bk.count(v), reference(&t, v), "{map}: bits {bits:#010x}");
            }
        }
    }
}

/// All 2^32 inputs of each map, for the buckets and the packed buckets (minutes in the
/// optimized test profile: `cargo test --release -p qforge-codegen -- --ignored
/// buckets_exhaustive`).
#[test]
#[ignore = "all 2^32 inputs of 3 maps, two searches: 7-17 minutes; run with --release --ignored"]
fn buckets_exhaustive() {
    for map in BlockwiseMap::ALL {
        let t = map_thresholds(map);
        let bk = Buckets::new(&t).unwrap();
        let pk = Packed::new(&t).unwrap();
        for bits in 0..=u32::MAX {
            let v = f32::from_bits(bits);
            let want = reference(&t, v);
            assert_eq!(bk.count(v), want, "{map}: bits {bits:#010x}");
            assert_eq!(pk.count(v), want, "{map} packed: bits {bits:#010x}");
        }
    }
}

/// Values around every bucket boundary of `pk` (its thresholds are in [`edge_values`]).
fn packed_edge_values(pk: &Packed) -> Vec<f32> {
    let mut v = Vec::new();
    for j in 0..=pk.index.per_sign {
        let m = ((pk.index.first + j) as u64) << pk.index.shift;
        if m <= 0x7f80_0000 {
            let x = f32::from_bits(m as u32);
            for y in [x, x.next_up(), x.next_down()] {
                v.extend([y, -y]);
            }
        }
    }
    v
}

#[test]
fn packed_buckets_of_bitsandbytes_maps_hold_one_threshold_and_fit_the_cache() {
    for map in BlockwiseMap::ALL {
        let t = map_thresholds(map);
        let pk = Packed::new(&t).unwrap();
        assert_index_covers(&pk.index, map, pk.entries.len());
        // The sizes the module docs quote.
        match map {
            BlockwiseMap::Dynamic => assert_eq!(pk.entries.len(), 2802),
            BlockwiseMap::DynamicUnsigned => assert_eq!(pk.entries.len(), 2900),
            BlockwiseMap::Linear => {}
        }
        // Every bucket's candidate is the count at its lowest value, and its low part the
        // complement of a threshold's low bits (or 0 where it holds none).
        let mask = (1u32 << pk.index.shift) - 1;
        for (i, e) in pk.entries.iter().enumerate() {
            assert!(e >> pk.index.shift <= 255, "{map}: bucket {i}");
            if (e & mask) != 0 {
                let j = i as u32 % pk.index.per_sign;
                assert!(
                    j > 0 && j + 1 < pk.index.per_sign,
                    "{map}: edge bucket {i} holds a threshold"
                );
            }
        }
    }
}

#[test]
fn packed_buckets_match_the_binary_search_on_edge_values_and_a_strided_sweep() {
    for map in BlockwiseMap::ALL {
        let t = map_thresholds(map);
        let pk = Packed::new(&t).unwrap();
        let mut values = edge_values(&Buckets::new(&t).unwrap());
        values.extend(packed_edge_values(&pk));
        values.extend(
            (0..=u32::MAX)
                .step_by(4099)
                .flat_map(|x| [x, x ^ 1])
                .map(f32::from_bits),
        );
        for v in values {
            assert_eq!(
                pk.count(v),
                reference(&t, v),
                "{map}: v = {v:e} ({:#010x})",
                v.to_bits()
            );
        }
    }
}

/// A table the packed buckets cannot serve (an entry `0.0`, which the first bucket would
/// hold) falls back to the buckets, with the same counts.
#[test]
fn a_table_with_a_zero_entry_falls_back_from_packed_buckets() {
    let data = [-1.0, 0.0, 0.5, 1.0];
    assert!(Packed::new(&data).is_none());
    assert!(Buckets::new(&data).is_some());
    let values = [
        -2.0,
        -1.0,
        -0.5,
        -0.0,
        0.0,
        0.25,
        0.5,
        0.75,
        1.0,
        2.0,
        f32::NAN,
    ];
    check_table(&data, &values).unwrap();
    let k = probe(&data);
    let d = search(&k, SearchStrategy::Packed { levels_up_to: 0 }).unwrap();
    assert!(d.tables.iter().any(|(_, t)| t.name.ends_with("_buckets")));
}

/// `q[i] = search_sorted(t, x[i])` over a table with `data`.
fn probe(data: &[f32]) -> Kernel {
    let mut b = KernelBuilder::new("search_probe");
    let n = b.scalar_param("n", ScalarType::U32);
    let x = b.buffer_param("x", DType::F32, &[Dim::Param(n)], Access::Read);
    let q = b.buffer_param("q", DType::U32, &[Dim::Param(n)], Access::Write);
    b.set_grid(Dim::Param(n));
    let t = b.table_f32("t", data);
    let i = b.work_item();
    let v = b.load(x, i);
    let c = b.search_sorted(t, v);
    // A second search of the same table shares its decomposition tables.
    let neg = b.neg(v);
    let c2 = b.search_sorted(t, neg);
    let sum = b.add(c, c2);
    let scale = b.const_u32(1000);
    let lo = b.mul(c, scale);
    let both = b.add(lo, sum);
    b.store(q, i, both);
    b.finish()
}

/// The interpreter's output of `kernel` on `values`.
fn run(kernel: &Kernel, values: &[f32]) -> Vec<u32> {
    let mut args = vec![
        OwnedArg::Scalar(Scalar::U32(values.len() as u32)),
        OwnedArg::Read(values.iter().flat_map(|v| v.to_le_bytes()).collect()),
        OwnedArg::Write(vec![0; 4 * values.len()]),
    ];
    let mut borrowed = OwnedArg::borrow_all(&mut args);
    qforge_ir::interp::run(kernel, &mut borrowed).unwrap();
    match &args[2] {
        OwnedArg::Write(b) => b
            .chunks(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        _ => unreachable!(),
    }
}

/// Both strategies give the interpreter's counts (computed by the interpreter on the
/// undecomposed kernel) and the host reference.
fn check_table(data: &[f32], values: &[f32]) -> Result<(), TestCaseError> {
    let k = probe(data);
    let want = run(&k, values);
    for (v, w) in values.iter().zip(&want) {
        let c = reference(data, *v);
        prop_assert_eq!(*w, 1000 * c + c + reference(data, -*v), "v = {:e}", v);
    }
    for strategy in [
        SearchStrategy::Buckets,
        SearchStrategy::Packed { levels_up_to: 0 },
        SearchStrategy::Packed { levels_up_to: 7 },
        SearchStrategy::Levels,
    ] {
        let d = search(&k, strategy).unwrap();
        let d = d.into_owned();
        let left = d
            .values
            .iter()
            .filter(|(_, def)| matches!(def.op, Op::SearchSorted { .. }))
            .count();
        prop_assert_eq!(left, 0);
        prop_assert_eq!(&run(&d, values), &want, "{:?} on {:?}", strategy, data);
    }
    Ok(())
}

#[test]
fn both_strategies_give_the_count_on_bitsandbytes_maps() {
    for map in BlockwiseMap::ALL {
        let t = map_thresholds(map);
        let mut values = edge_values(&Buckets::new(&t).unwrap());
        values.extend(packed_edge_values(&Packed::new(&t).unwrap()));
        check_table(&t, &values).unwrap();
    }
}

#[test]
fn a_kernel_without_a_search_is_borrowed() {
    let mut b = KernelBuilder::new("none");
    let t = b.table_f32("t", &[1.0]);
    let zero = b.const_u32(0);
    b.lookup(t, zero);
    let k = b.finish();
    assert!(matches!(
        search(&k, SearchStrategy::Buckets).unwrap(),
        Cow::Borrowed(_)
    ));
}

/// Table entries: edge values and a few magnitudes, often repeated.
fn entry() -> impl Strategy<Value = f32> {
    prop_oneof![
        prop::sample::select(vec![
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::from_bits(1),
            f32::MAX,
            1.0,
            -1.0,
        ]),
        -4.0f32..4.0,
        any::<u32>().prop_map(|b| f32::from_bits(b & 0xff7f_ffff)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Random sorted tables of 1 to 300 entries (duplicates, both zeros, infinities): every
    /// strategy, including the fallbacks of tables the packed buckets or the buckets cannot
    /// serve.
    #[test]
    fn both_strategies_give_the_count_on_random_tables(
        mut data in prop::collection::vec(entry(), 1..300),
        probes in prop::collection::vec(any::<u32>(), 0..64),
    ) {
        data.retain(|x| !x.is_nan());
        prop_assume!(!data.is_empty());
        data.sort_by(|a, b| a.total_cmp(b));
        let mut values: Vec<f32> = probes.into_iter().map(f32::from_bits).collect();
        for t in &data {
            values.extend([*t, t.next_up(), t.next_down(), -*t]);
        }
        values.extend([f32::NAN, 0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY]);
        check_table(&data, &values)?;
    }
}

/// Generated tables never take a name the kernel already uses (a user table called
/// `t_buckets` or `t_level1`), and the searched table, unread after a levels rewrite, is
/// dropped with the other tables renumbered.
#[test]
fn generated_tables_take_free_names_and_unread_tables_go() {
    let mut b = KernelBuilder::new("names");
    let n = b.scalar_param("n", ScalarType::U32);
    let x = b.buffer_param("x", DType::F32, &[Dim::Param(n)], Access::Read);
    let q = b.buffer_param("q", DType::U32, &[Dim::Param(n)], Access::Write);
    b.set_grid(Dim::Param(n));
    let t = b.table_f32("t", &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let others: Vec<TableId> = ["t_buckets", "t_padded", "t_level1", "t_level2"]
        .iter()
        .enumerate()
        .map(|(j, name)| b.table_u32(name, &[10 * j as u32, 10 * j as u32 + 1]))
        .collect();
    let i = b.work_item();
    let v = b.load(x, i);
    let c = b.search_sorted(t, v);
    let one = b.const_u32(1);
    let bit = b.and(c, one);
    let mut sum = c;
    for o in others {
        let e = b.lookup(o, bit);
        sum = b.add(sum, e);
    }
    b.store(q, i, sum);
    let k = b.finish();
    let values: Vec<f32> = vec![-1.0, 0.0, 0.5, 3.0, 3.5, 7.0, f32::NAN];
    let want = run(&k, &values);
    for strategy in [SearchStrategy::Buckets, SearchStrategy::Levels] {
        let d = search(&k, strategy).unwrap().into_owned();
        assert_eq!(run(&d, &values), want, "{strategy:?}");
        let names: Vec<&str> = d.tables.iter().map(|(_, t)| t.name.as_str()).collect();
        for user in ["t_buckets", "t_padded", "t_level1", "t_level2"] {
            assert_eq!(names.iter().filter(|n| **n == user).count(), 1, "{names:?}");
        }
        // Buckets keeps no unpadded copy; levels reads only its level tables.
        assert!(!names.contains(&"t"), "{strategy:?}: {names:?}");
    }
}

/// The value each level compare of `k`'s body (top level, in order) compares with: the searched
/// value of the search it belongs to.
fn compared_values(k: &Kernel) -> Vec<Value> {
    k.body
        .iter()
        .filter_map(|s| match s {
            Stmt::Let(v) => match k.values[*v].op {
                Op::Cmp(qforge_ir::CmpOp::Lt, _, x) if k.values[x].ty == ScalarType::F32 => Some(x),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

#[test]
fn independent_level_searches_interleave_and_dependent_ones_wait() {
    let mut b = KernelBuilder::new("interleave");
    let n = b.scalar_param("n", ScalarType::U32);
    let x = b.buffer_param("x", DType::F32, &[Dim::Param(n)], Access::Read);
    let q = b.buffer_param("q", DType::U32, &[Dim::Param(n)], Access::Write);
    b.set_grid(Dim::Param(n));
    let t = b.table_f32("t", &[-3.0, -1.0, 0.0, 0.5, 2.0, 4.0, 8.0]);
    let i = b.work_item();
    let v = b.load(x, i);
    let c1 = b.search_sorted(t, v);
    // Independent of c1: moves ahead and interleaves.
    let w = b.neg(v);
    let c2 = b.search_sorted(t, w);
    // Reads c1: waits for it.
    let c1f = b.int_to_float(c1);
    let u = b.add(c1f, w);
    let c3 = b.search_sorted(t, u);
    let s = b.add(c2, c3);
    b.store(q, i, s);
    // After a store: its own run.
    let z = b.mul(v, v);
    let c4 = b.search_sorted(t, z);
    let c5 = b.search_sorted(t, v);
    let s2 = b.add(s, c4);
    let s3 = b.add(s2, c5);
    b.store(q, i, s3);
    let k = b.finish();
    let values = [-5.0, -3.0, -1.0, -0.25, 0.0, 0.5, 1.0, 3.0, 9.0, f32::NAN];
    let want = run(&k, &values);
    let d = search(&k, SearchStrategy::Levels).unwrap().into_owned();
    assert_eq!(run(&d, &values), want);
    let order = compared_values(&d);
    // Three levels each (7 entries: 2^3 > 7).
    assert_eq!(
        order,
        [v, w, v, w, v, w, u, u, u, z, v, z, v, z, v],
        "{}",
        qforge_ir::text::print(&d)
    );
    // Buckets (no level structure) keep the program order.
    let bk = search(&k, SearchStrategy::Buckets).unwrap().into_owned();
    assert_eq!(run(&bk, &values), want);
}
