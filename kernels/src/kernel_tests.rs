//! Kernel tests: every library family run on the reference interpreter and compared with
//! independent host models written here in plain Rust (and, for the 8-bit search, an `f64`
//! brute-force nearest-code search).

#![allow(clippy::neg_cmp_op_on_partial_ord)] // `!(v <= m)` is the NaN-aware rule under test

use half::{bf16, f16};

use crate::blockwise8::{exact_midpoints, quantize_blockwise};
use crate::{doublequant, maps, quant4, BlockwiseMap, QuantType};
use qforge_ir::OwnedArg;
use qforge_ir::{DType, Scalar};

fn run(kernel: &qforge_ir::Kernel, args: &mut [OwnedArg]) {
    let mut borrowed = OwnedArg::borrow_all(args);
    qforge_ir::interp::run(kernel, &mut borrowed)
        .unwrap_or_else(|e| panic!("{}: {e}", kernel.name));
}

fn u32a(v: usize) -> OwnedArg {
    OwnedArg::Scalar(Scalar::U32(v as u32))
}

fn to_dtype(dtype: DType, v: f32) -> f32 {
    match dtype {
        DType::F16 => f16::from_f32(v).to_f32(),
        DType::BF16 => bf16::from_f32(v).to_f32(),
        _ => v,
    }
}

fn bytes_of(dtype: DType, values: &[f32]) -> Vec<u8> {
    match dtype {
        DType::F16 => values
            .iter()
            .flat_map(|v| f16::from_f32(*v).to_le_bytes())
            .collect(),
        DType::BF16 => values
            .iter()
            .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
            .collect(),
        _ => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

/// Output bytes of `dtype` widened to f32 bit patterns.
fn out_bits(dtype: DType, bytes: &[u8]) -> Vec<u32> {
    match dtype {
        DType::F16 => bytes
            .chunks(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32().to_bits())
            .collect(),
        DType::BF16 => bytes
            .chunks(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32().to_bits())
            .collect(),
        _ => bytes
            .chunks(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    }
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn write(arg: &OwnedArg) -> &[u8] {
    match arg {
        OwnedArg::Write(b) => b,
        other => panic!("not a write buffer: {other:?}"),
    }
}

/// Same bits, or both NaN.
fn same(a: u32, b: u32) -> bool {
    a == b || (f32::from_bits(a).is_nan() && f32::from_bits(b).is_nan())
}

// ----- host models -----

fn host_absmax(block: &[f32], propagate: bool) -> f32 {
    let mut m = 0.0f32;
    for x in block {
        if x.is_nan() {
            if propagate {
                return f32::NAN;
            }
        } else if x.abs() > m {
            m = x.abs();
        }
    }
    m
}

fn host_inv(absmax: f32) -> f32 {
    let c = if absmax.is_nan() {
        absmax
    } else {
        absmax.max(1e-38)
    };
    1.0 / c
}

fn host_nf4(v: f32) -> u8 {
    maps::nf4_midpoints().iter().filter(|m| !(v <= **m)).count() as u8
}

fn host_fp4(v: f32) -> u8 {
    if v.is_nan() {
        return 3;
    }
    let a = v.abs();
    let mids = maps::fp4_midpoints();
    let mag = if v.is_sign_negative() {
        mids.iter().filter(|m| **m <= a).count()
    } else {
        mids.iter().filter(|m| **m < a).count()
    };
    maps::FP4_MAGNITUDE_CODES[mag] as u8 | if v.is_sign_negative() { 8 } else { 0 }
}

fn host_code4(qt: QuantType, v: f32) -> u8 {
    match qt {
        QuantType::Nf4 => host_nf4(v),
        QuantType::Fp4 => host_fp4(v),
    }
}

/// Host model of `quantize_4bit` on values already in the input dtype.
fn host_quantize4(qt: QuantType, bs: usize, x: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let mut codes = Vec::new();
    let mut absmax = Vec::new();
    for block in x.chunks(bs) {
        let a = host_absmax(block, true);
        absmax.push(a);
        let inv = host_inv(a);
        codes.extend(block.iter().map(|v| host_code4(qt, v * inv)));
    }
    if codes.len() % 2 == 1 {
        codes.push(qt.zero_code());
    }
    (codes.chunks(2).map(|c| c[0] << 4 | c[1]).collect(), absmax)
}

/// The 4-bit test input: blocks of `bs` starting with 1.0 (scale exactly 1) holding every NF4
/// and FP4 midpoint with its neighbours and signs, then scaled and special blocks.
fn quant4_input(bs: usize) -> Vec<f32> {
    let mut probes = Vec::new();
    for m in maps::nf4_midpoints()
        .iter()
        .chain(maps::fp4_midpoints().iter())
    {
        for s in [1.0f32, -1.0] {
            let v = s * m;
            probes.extend([v, v.next_up(), v.next_down()]);
        }
    }
    probes.extend(maps::nf4_code());
    probes.extend(maps::fp4_code());
    probes.extend([0.0, -0.0, 1e-30, -1e-30, 1e-3, -1e-3, 0.002, -0.002]);
    let mut x = Vec::new();
    for chunk in probes.chunks(bs - 1) {
        x.push(1.0);
        x.extend_from_slice(chunk);
        x.resize(x.len().div_ceil(bs) * bs, 0.0);
    }
    // the same blocks times 3 (inexact scaling)
    let scaled: Vec<f32> = x.iter().map(|v| v * 3.0).collect();
    x.extend(scaled);
    // a NaN block, an inf block, a zero block, a subnormal block, a -0.0 block
    let mut special = vec![0.5f32; bs];
    special[3] = f32::NAN;
    x.extend(&special);
    let mut inf = vec![-0.25f32; bs];
    inf[1] = f32::INFINITY;
    inf[2] = f32::NEG_INFINITY;
    x.extend(&inf);
    x.extend(vec![0.0f32; bs]);
    x.extend((0..bs).map(|i| (i as f32 - 7.0) * 1e-41));
    x.extend(vec![-0.0f32; bs]);
    // a partial, odd tail block
    x.extend([0.7f32, -0.3, 0.1]);
    x
}

#[test]
fn library_quant4_kernels_match_host_model_on_interpreter() {
    for qt in QuantType::ALL {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let bs = 64usize;
            let raw = quant4_input(bs);
            let x: Vec<f32> = raw.iter().map(|v| to_dtype(dtype, *v)).collect();
            let n = x.len();
            let (n_packed, n_blocks) = (n.div_ceil(2), n.div_ceil(bs));
            let (want_packed, want_absmax) = host_quantize4(qt, bs, &x);

            let k = quant4::quantize_4bit(qt, bs as u32, dtype)
                .unwrap()
                .into_kernel();
            let mut args = vec![
                u32a(n),
                u32a(n_packed),
                u32a(n_blocks),
                OwnedArg::Read(bytes_of(dtype, &raw)),
                OwnedArg::Write(vec![0; n_packed]),
                OwnedArg::Write(vec![0; 4 * n_blocks]),
            ];
            run(&k, &mut args);
            let packed = write(&args[4]).to_vec();
            let absmax = f32s(write(&args[5]));
            for (i, (g, w)) in packed.iter().zip(&want_packed).enumerate() {
                assert_eq!(
                    g,
                    w,
                    "{}: byte {i} (elements {} {}: {} {})",
                    k.name,
                    2 * i,
                    2 * i + 1,
                    x[2 * i],
                    x.get(2 * i + 1).copied().unwrap_or(0.0)
                );
            }
            for (b, (g, w)) in absmax.iter().zip(&want_absmax).enumerate() {
                assert!(
                    same(g.to_bits(), w.to_bits()),
                    "{}: absmax {b}: {g} vs {w}",
                    k.name
                );
            }

            // dequantize our codes and compare with table[code] * absmax rounded to the dtype
            let code = qt.dequant_table();
            let k = quant4::dequantize_4bit(qt, bs as u32, dtype)
                .unwrap()
                .into_kernel();
            let mut args = vec![
                u32a(n),
                u32a(n_packed),
                u32a(n_blocks),
                OwnedArg::Read(packed.clone()),
                OwnedArg::Read(absmax.iter().flat_map(|v| v.to_le_bytes()).collect()),
                OwnedArg::Write(vec![0; n * dtype.size_bytes()]),
            ];
            run(&k, &mut args);
            let got = out_bits(dtype, write(&args[5]));
            for i in 0..n {
                let c = if i % 2 == 0 {
                    packed[i / 2] >> 4
                } else {
                    packed[i / 2] & 15
                };
                let want = to_dtype(dtype, code[c as usize] * absmax[i / bs]).to_bits();
                assert!(
                    same(got[i], want),
                    "{}: element {i}: {:#x} vs {want:#x}",
                    k.name,
                    got[i]
                );
            }

            // the nested variant with a decoded absmax
            let dyn_code = BlockwiseMap::Dynamic.code();
            let qabsmax: Vec<u8> = (0..n_blocks).map(|b| (b * 37 + 11) as u8).collect();
            let nested = [0.75f32];
            let offset = 0.125f32;
            let k = quant4::dequantize_4bit_nested(qt, bs as u32, dtype)
                .unwrap()
                .into_kernel();
            let mut args = vec![
                u32a(n),
                u32a(n_packed),
                u32a(n_blocks),
                u32a(1),
                OwnedArg::Scalar(Scalar::f32(offset)),
                OwnedArg::Read(packed.clone()),
                OwnedArg::Read(qabsmax.clone()),
                OwnedArg::Read(nested.iter().flat_map(|v| v.to_le_bytes()).collect()),
                OwnedArg::Read(dyn_code.iter().flat_map(|v| v.to_le_bytes()).collect()),
                OwnedArg::Write(vec![0; n * dtype.size_bytes()]),
            ];
            run(&k, &mut args);
            let got = out_bits(dtype, write(&args[9]));
            for i in 0..n {
                let c = if i % 2 == 0 {
                    packed[i / 2] >> 4
                } else {
                    packed[i / 2] & 15
                };
                let a = dyn_code[qabsmax[i / bs] as usize] * nested[0] + offset;
                let want = to_dtype(dtype, code[c as usize] * a).to_bits();
                assert!(same(got[i], want), "{}: element {i}", k.name);
            }
        }
    }
}

#[test]
fn library_quant4_known_codes() {
    // Spot checks that do not depend on the host model: zero, NaN, -0.0 and the tie rules.
    assert_eq!(host_nf4(0.0), 7);
    assert_eq!(host_nf4(f32::NAN), 15);
    let m = maps::nf4_midpoints();
    assert_eq!(host_nf4(m[7]), 7, "an exact NF4 tie goes to the lower code");
    assert_eq!(host_nf4(m[7].next_up()), 8);
    assert_eq!(host_fp4(-0.0), 8);
    assert_eq!(host_fp4(0.0), 0);
    assert_eq!(host_fp4(f32::NAN), 3);
    let f = maps::fp4_midpoints();
    assert_eq!(
        host_fp4(f[1]),
        1,
        "positive tie -> lower magnitude (0.0052)"
    );
    assert_eq!(
        host_fp4(-f[1]),
        8 | 6,
        "negative tie -> larger magnitude (0.1667)"
    );
}

/// `f64` brute force: the index of the nearest code value (lowest index on ties, 0 for NaN),
/// asserting that any near-tie it decides was computed exactly.
fn brute_nearest(code: &[f32], v: f32) -> u8 {
    if v.is_nan() {
        return 0;
    }
    let exact = |c: f32| -> (f64, bool) {
        let (a, b) = (v as f64, -(c as f64));
        let s = a + b;
        let bb = s - a;
        (s.abs(), (a - (s - bb)) + (b - bb) == 0.0)
    };
    let mut best = 0usize;
    let (mut best_d, mut best_exact) = exact(code[0]);
    for (k, c) in code.iter().enumerate().skip(1) {
        let (d, ex) = exact(*c);
        if (d - best_d).abs() <= best_d * 1e-12 {
            assert!(
                ex && best_exact,
                "near tie at v={v:e} between codes {best} and {k} is not exact in f64"
            );
        }
        if d < best_d {
            best = k;
            best_d = d;
            best_exact = ex;
        }
    }
    best as u8
}

/// Probe values in [-1, 1]: every exact midpoint's `hi` and its neighbours, every code value,
/// zeros, tiny values and a deterministic pseudo-random sweep.
fn blockwise8_probes(code: &[f32]) -> Vec<f32> {
    let mids = exact_midpoints(code).unwrap();
    let mut v = Vec::new();
    for h in &mids.hi {
        let mut up = *h;
        let mut down = *h;
        v.push(*h);
        for _ in 0..2 {
            up = up.next_up();
            down = down.next_down();
            v.extend([up, down]);
        }
    }
    v.extend_from_slice(code);
    v.extend([0.0, -0.0, 1e-40, -1e-40, 1e-20, -1e-20, f32::NAN]);
    let mut s = 0x1234_5678u32;
    for _ in 0..2000 {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        v.push((s as f32 / u32::MAX as f32) * 2.0 - 1.0);
    }
    v.retain(|x| x.is_nan() || (-1.0..=1.0).contains(x));
    v
}

#[test]
fn library_blockwise8_search_is_the_exact_nearest_code() {
    for map in BlockwiseMap::ALL {
        let code = map.code();
        let mids = exact_midpoints(&code).unwrap();
        let inexact = mids.lo.iter().filter(|l| **l != 0.0).count();
        // The f32 midpoints alone are not exact for the dynamic maps: the pairs matter.
        if map != BlockwiseMap::Linear {
            assert!(inexact > 0, "{map}: expected some inexact f32 midpoints");
        }
        let probes = blockwise8_probes(&code);
        // blocks of 256: 1.0 first (absmax 1, scale exactly 1), then 255 probes
        let mut x = Vec::new();
        for chunk in probes.chunks(255) {
            x.push(1.0f32);
            x.extend_from_slice(chunk);
        }
        let n = x.len();
        let n_blocks = n.div_ceil(256);
        let k = quantize_blockwise(map, 256, DType::F32)
            .unwrap()
            .into_kernel();
        let mut args = vec![
            u32a(n),
            u32a(n_blocks),
            OwnedArg::Read(bytes_of(DType::F32, &x)),
            OwnedArg::Write(vec![0; n]),
            OwnedArg::Write(vec![0; 4 * n_blocks]),
        ];
        run(&k, &mut args);
        let q = write(&args[3]);
        let mut naive_wrong = 0;
        for (i, v) in x.iter().enumerate() {
            let want = brute_nearest(&code, *v);
            assert_eq!(q[i], want, "{map}: v = {v:e} ({:#x})", v.to_bits());
            // the naive f32-midpoint search
            let naive = mids.hi.iter().filter(|h| **h < *v).count() as u8;
            naive_wrong += usize::from(naive != want);
        }
        println!("{map}: {inexact} inexact f32 midpoints; the naive f32-midpoint search is wrong on {naive_wrong} probes");
        if map != BlockwiseMap::Linear {
            assert!(
                naive_wrong > 0,
                "{map}: the probes should hit an inexact midpoint"
            );
        }
    }
}

#[test]
fn library_blockwise8_kernels_match_host_model_on_interpreter() {
    for map in BlockwiseMap::ALL {
        let code = map.code();
        for dtype in [DType::F32, DType::BF16] {
            let bs = 64usize;
            let mut raw: Vec<f32> = (0..200)
                .map(|i| ((i * 7919 % 401) as f32 - 200.0) / 37.0)
                .collect();
            raw[5] = f32::NAN; // NaN ignored by the absmax, code 0
            raw.extend(vec![f32::NAN; bs]); // all-NaN block: absmax 0
            raw.extend(vec![0.0; bs]);
            let mut inf = vec![0.5f32; bs];
            inf[9] = f32::NEG_INFINITY;
            raw.extend(inf);
            raw.extend((0..bs).map(|i| (i as f32 - 20.0) * 1e-42));
            raw.extend([0.3, -0.9, 0.0]);
            let x: Vec<f32> = raw.iter().map(|v| to_dtype(dtype, *v)).collect();
            let n = x.len();
            let n_blocks = n.div_ceil(bs);
            let k = quantize_blockwise(map, bs as u32, dtype)
                .unwrap()
                .into_kernel();
            let mut args = vec![
                u32a(n),
                u32a(n_blocks),
                OwnedArg::Read(bytes_of(dtype, &raw)),
                OwnedArg::Write(vec![0; n]),
                OwnedArg::Write(vec![0; 4 * n_blocks]),
            ];
            run(&k, &mut args);
            let q = write(&args[3]).to_vec();
            let absmax = f32s(write(&args[4]));
            for (b, block) in x.chunks(bs).enumerate() {
                let a = host_absmax(block, false);
                assert_eq!(absmax[b].to_bits(), a.to_bits(), "{}: absmax {b}", k.name);
                let inv = host_inv(a);
                for (j, v) in block.iter().enumerate() {
                    assert_eq!(
                        q[b * bs + j],
                        brute_nearest(&code, v * inv),
                        "{}: element {}",
                        k.name,
                        b * bs + j
                    );
                }
            }
            let k = crate::blockwise8::dequantize_blockwise(map, bs as u32, dtype)
                .unwrap()
                .into_kernel();
            let mut args = vec![
                u32a(n),
                u32a(n_blocks),
                OwnedArg::Read(q.clone()),
                OwnedArg::Read(bytes_of(DType::F32, &absmax)),
                OwnedArg::Write(vec![0; n * dtype.size_bytes()]),
            ];
            run(&k, &mut args);
            let got = out_bits(dtype, write(&args[4]));
            for i in 0..n {
                let want = to_dtype(dtype, code[q[i] as usize] * absmax[i / bs]).to_bits();
                assert!(same(got[i], want), "{}: element {i}", k.name);
            }
        }
    }
}

/// Host model of torch's CPU `float32` `mean` of a contiguous 1-D tensor on one thread, written
/// from torch's `SumKernel.cpp` (`vectorized_inner_sum`, `row_sum`, `multi_row_sum`) with
/// `Vectorized<float>` of `lanes` lanes, then one division by `f32(n)`.
fn host_torch_mean(xs: &[f32], lanes: usize) -> f32 {
    fn vadd(a: &mut [f32], b: &[f32]) {
        for (x, y) in a.iter_mut().zip(b) {
            *x += y;
        }
    }
    // The levels are indexed as torch indexes them (acc[level][row]).
    #[allow(clippy::needless_range_loop)]
    fn multi_row_sum(
        size: usize,
        width: usize,
        row: &dyn Fn(usize, usize) -> Vec<f32>,
    ) -> Vec<Vec<f32>> {
        let ceil_log2 = if size <= 2 {
            1
        } else {
            (usize::BITS - (size - 1).leading_zeros()) as usize
        };
        let level_power = 4.max(ceil_log2 / 4);
        let level_step = 1usize << level_power;
        let level_mask = level_step - 1;
        let mut acc = vec![vec![vec![0.0f32; width]; 4]; 4];
        let mut i = 0;
        while i + level_step <= size {
            for _ in 0..level_step {
                for (k, a) in acc[0].iter_mut().enumerate() {
                    vadd(a, &row(i, k));
                }
                i += 1;
            }
            for j in 1..4 {
                for k in 0..4 {
                    let lower = std::mem::replace(&mut acc[j - 1][k], vec![0.0; width]);
                    vadd(&mut acc[j][k], &lower);
                }
                if i & (level_mask << (j * level_power)) != 0 {
                    break;
                }
            }
        }
        while i < size {
            for (k, a) in acc[0].iter_mut().enumerate() {
                vadd(a, &row(i, k));
            }
            i += 1;
        }
        for j in 1..4 {
            for k in 0..4 {
                let upper = acc[j][k].clone();
                vadd(&mut acc[0][k], &upper);
            }
        }
        acc.swap_remove(0)
    }
    fn row_sum(size: usize, width: usize, load: &dyn Fn(usize) -> Vec<f32>) -> Vec<f32> {
        let size_ilp = size / 4;
        let mut partial = multi_row_sum(size_ilp, width, &|i, k| load(i * 4 + k));
        for i in size_ilp * 4..size {
            vadd(&mut partial[0], &load(i));
        }
        for k in 1..4 {
            let p = partial[k].clone();
            vadd(&mut partial[0], &p);
        }
        partial.swap_remove(0)
    }
    let n = xs.len();
    let total = if n >= lanes {
        let vec_size = n / lanes;
        let vec_acc = row_sum(vec_size, lanes, &|v| {
            xs[v * lanes..(v + 1) * lanes].to_vec()
        });
        let mut final_acc = 0.0f32;
        for x in &xs[vec_size * lanes..] {
            final_acc += x;
        }
        for p in &vec_acc {
            final_acc += p;
        }
        final_acc
    } else {
        row_sum(n, 1, &|i| vec![xs[i]])[0]
    };
    (0.0 + total) / n as f32
}

#[test]
fn library_doublequant_kernels_match_host_model_on_interpreter() {
    let mean_kernel = doublequant::absmax_mean().unwrap().into_kernel();
    let mean = |xs: &[f32]| {
        let mut args = vec![
            u32a(xs.len()),
            OwnedArg::Read(bytes_of(DType::F32, xs)),
            OwnedArg::Write(vec![0; 4]),
        ];
        run(&mean_kernel, &mut args);
        f32s(write(&args[2]))[0]
    };
    // The scalar path, vectors with tails and leftovers, and cascade levels 1 (512 values and
    // more), 2 (8192) and 3 (131072).
    for n in (1..=40usize).chain([700, 8195, 131_109]) {
        let xs: Vec<f32> = (0..n)
            .map(|i| 0.5 + ((i * 104_729) % 1000) as f32 / 333.0)
            .collect();
        let lanes = doublequant::TORCH_SUM_LANES as usize;
        assert_eq!(
            mean(&xs).to_bits(),
            host_torch_mean(&xs, lanes).to_bits(),
            "n = {n}"
        );
    }
    let absmax: Vec<f32> = (0..700)
        .map(|i| 0.5 + ((i * 104_729) % 1000) as f32 / 333.0)
        .collect();
    let offset = mean(&absmax);

    // nested quantize == quantize_blockwise_dynamic_bs256 of (absmax - offset)
    let n = absmax.len();
    let n_blocks = n.div_ceil(256);
    let k = doublequant::quantize_nested().unwrap().into_kernel();
    let mut args = vec![
        u32a(n),
        u32a(n_blocks),
        OwnedArg::Scalar(Scalar::f32(offset)),
        OwnedArg::Read(bytes_of(DType::F32, &absmax)),
        OwnedArg::Write(vec![0; n]),
        OwnedArg::Write(vec![0; 4 * n_blocks]),
    ];
    run(&k, &mut args);
    let diff: Vec<f32> = absmax.iter().map(|a| a - offset).collect();
    let k2 = quantize_blockwise(BlockwiseMap::Dynamic, 256, DType::F32)
        .unwrap()
        .into_kernel();
    let mut args2 = vec![
        u32a(n),
        u32a(n_blocks),
        OwnedArg::Read(bytes_of(DType::F32, &diff)),
        OwnedArg::Write(vec![0; n]),
        OwnedArg::Write(vec![0; 4 * n_blocks]),
    ];
    run(&k2, &mut args2);
    assert_eq!(args[4], args2[3]);
    assert_eq!(args[5], args2[4]);

    // decode: code[q] * nested_absmax + offset
    let q = write(&args[4]).to_vec();
    let nested = f32s(write(&args[5]));
    let k = doublequant::dequantize_nested().unwrap().into_kernel();
    let mut args = vec![
        u32a(n),
        u32a(n_blocks),
        OwnedArg::Scalar(Scalar::f32(offset)),
        OwnedArg::Read(q.clone()),
        OwnedArg::Read(bytes_of(DType::F32, &nested)),
        OwnedArg::Write(vec![0; 4 * n]),
    ];
    run(&k, &mut args);
    let code = BlockwiseMap::Dynamic.code();
    let got = f32s(write(&args[5]));
    for i in 0..n {
        let want = code[q[i] as usize] * nested[i / 256] + offset;
        assert_eq!(got[i].to_bits(), want.to_bits(), "element {i}");
        // the largest gap of the dynamic map is about 0.014, so the error is at most 0.007 * scale
        assert!(
            (got[i] - absmax[i]).abs() <= 0.008 * nested[i / 256],
            "decoded absmax {i} is far off"
        );
    }
}
