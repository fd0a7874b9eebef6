//! `Stmt::Accumulate` on the WGSL backend: the emitted module validates (builtin and software
//! `fma`), has the IR's shape (partials at `-0.0`, the fused step in the loop, the halving tree),
//! and runs bit-exact against the reference interpreter on a wgpu device (Mesa lavapipe in CI):
//! dot products, an NF4 matmul-style body (nibble unpack, table lookup, absmax scale, f16
//! activations), two and four accumulators, every order from `Sequential` to `Strided(64)`,
//! lengths 0, 1, 3, w - 1, w + 1, 100 and 1000, and data mixed with +-0, subnormals, inf, NaN and
//! products that overflow. Without an adapter the device tests print why and pass.
#![cfg(feature = "wgpu")]

use std::sync::OnceLock;

use proptest::prelude::*;
use qforge::codegen::wgsl::{WgslBackend, WgslOptions};
use qforge::codegen::Backend;
use qforge::ir::{
    count_mismatches, Access, DType, Dim, Kernel, KernelBuilder, OwnedArg, ReduceOrder, Scalar,
    ScalarType,
};
use qforge::kernels;
use qforge::runtime::{Device, InterpreterDevice, WgpuDevice};

const ORDERS: [ReduceOrder; 6] = [
    ReduceOrder::Sequential,
    ReduceOrder::Strided(2),
    ReduceOrder::Strided(4),
    ReduceOrder::Strided(8),
    ReduceOrder::Strided(32),
    ReduceOrder::Strided(64),
];

fn ways(order: ReduceOrder) -> u32 {
    match order {
        ReduceOrder::Sequential => 1,
        ReduceOrder::Strided(w) => w,
    }
}

/// Lengths 0, 1, 3, w - 1, w + 1, 100, 1000.
fn lengths(order: ReduceOrder) -> Vec<u32> {
    let w = ways(order);
    let mut v = vec![0, 1, 3, w.saturating_sub(1), w + 1, 100, 1000];
    v.dedup();
    v
}

/// `out[r * t + j] = sum over i of x[r, i] * y[r, j, i]` for `t` accumulators in one statement
/// (`t = 1`: a dot product per row). The last accumulator of several multiplies by `2 * y` (a
/// product computed in the body, and a constant).
fn dot_kernel(order: ReduceOrder, t: u32) -> Kernel {
    let mut b = KernelBuilder::new(&format!("acc_dot{t}"));
    let rows = b.scalar_param("rows", ScalarType::U32);
    let len = b.scalar_param("len", ScalarType::U32);
    let (r, l) = (Dim::Param(rows), Dim::Param(len));
    let x = b.buffer_param("x", DType::F32, &[r, l], Access::Read);
    let y = b.buffer_param("y", DType::F32, &[r, Dim::Const(t), l], Access::Read);
    let out = b.buffer_param("out", DType::F32, &[r, Dim::Const(t)], Access::Write);
    b.set_grid(r);
    let row = b.work_item();
    let lv = b.param(len);
    let xbase = b.mul(row, lv);
    let tc = b.const_u32(t);
    let rt = b.mul(row, tc);
    let vars: Vec<_> = (0..t)
        .map(|j| b.var(&format!("acc{j}"), ScalarType::F32))
        .collect();
    b.accumulate(lv, order, &vars, |b, i| {
        let xi = b.add(xbase, i);
        let xv = b.load(x, xi);
        (0..t)
            .map(|j| {
                let jc = b.const_u32(j);
                let rj = b.add(rt, jc);
                let yb = b.mul(rj, lv);
                let yi = b.add(yb, i);
                let mut yv = b.load(y, yi);
                if t > 1 && j == t - 1 {
                    let two = b.const_f32(2.0);
                    yv = b.mul(yv, two);
                }
                (xv, yv)
            })
            .collect()
    });
    for (j, &v) in vars.iter().enumerate() {
        let s = b.read_var(v);
        let jc = b.const_u32(j as u32);
        let o = b.add(rt, jc);
        b.store(out, o, s);
    }
    b.finish()
}

/// The fused NF4 matmul's inner loop for a 1 x 2 tile: work item `g` computes
/// `out[m, 2j]` and `out[m, 2j + 1]` (`m = g / (n / 2)`, `j = g % (n / 2)`) as
/// `sum over k of x[m, k] * (nf4[nibble(w, c * K + k)] * absmax[(c * K + k) >> 6])`, the
/// nibble of element `e` being the high half of byte `e >> 1` for even `e`, the low half for odd.
fn nf4_kernel(order: ReduceOrder, xdtype: DType) -> Kernel {
    let mut b = KernelBuilder::new(&format!("acc_nf4_{}", xdtype.name()));
    let m = b.scalar_param("m", ScalarType::U32);
    let n = b.scalar_param("n", ScalarType::U32);
    let k = b.scalar_param("k", ScalarType::U32);
    let nbytes = b.scalar_param("nbytes", ScalarType::U32);
    let nblocks = b.scalar_param("nblocks", ScalarType::U32);
    let x = b.buffer_param("x", xdtype, &[Dim::Param(m), Dim::Param(k)], Access::Read);
    let w = b.buffer_param("w", DType::U8, &[Dim::Param(nbytes)], Access::Read);
    let am = b.buffer_param("absmax", DType::F32, &[Dim::Param(nblocks)], Access::Read);
    let out = b.buffer_param(
        "out",
        DType::F32,
        &[Dim::Param(m), Dim::Param(n)],
        Access::Write,
    );
    let tiles = b.scalar_param("tiles", ScalarType::U32);
    b.set_grid(Dim::Param(tiles));
    let code = b.table_f32("nf4", &kernels::QuantType::Nf4.code());
    let g = b.work_item();
    let nv = b.param(n);
    let kv = b.param(k);
    let (one, two, four, fifteen, six) = (
        b.const_u32(1),
        b.const_u32(2),
        b.const_u32(4),
        b.const_u32(15),
        b.const_u32(6),
    );
    let half = b.div(nv, two);
    let mi = b.div(g, half);
    let j = b.rem(g, half);
    let c0 = b.mul(j, two);
    let c1 = b.add(c0, one);
    let xbase = b.mul(mi, kv);
    let wbase0 = b.mul(c0, kv);
    let wbase1 = b.mul(c1, kv);
    let (a0, a1) = (
        b.var("acc0", ScalarType::F32),
        b.var("acc1", ScalarType::F32),
    );
    b.accumulate(kv, order, &[a0, a1], |b, i| {
        let xi = b.add(xbase, i);
        let xv = b.load(x, xi);
        [wbase0, wbase1]
            .into_iter()
            .map(|wb| {
                let e = b.add(wb, i);
                let bi = b.shr(e, one);
                let byte = b.load(w, bi);
                let odd = b.and(e, one);
                let even = b.binary(qforge::ir::BinaryOp::Xor, odd, one);
                let sh = b.mul(even, four);
                let shifted = b.shr(byte, sh);
                let nib = b.and(shifted, fifteen);
                let cv = b.lookup(code, nib);
                let blk = b.shr(e, six);
                let s = b.load(am, blk);
                (xv, b.mul(cv, s))
            })
            .collect()
    });
    let o0 = b.mul(mi, nv);
    let o0 = b.add(o0, c0);
    let o1 = b.add(o0, one);
    let (s0, s1) = (b.read_var(a0), b.read_var(a1));
    b.store(out, o0, s0);
    b.store(out, o1, s1);
    b.finish()
}

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u32) -> u32 {
        (((self.next() >> 32) * n as u64) >> 32) as u32
    }
    /// Normal-looking data, with `special` in 1000 drawn from the edge values.
    fn value(&mut self, special: u32) -> f32 {
        const EDGES: [f32; 14] = [
            0.0,
            -0.0,
            f32::MIN_POSITIVE,
            -1.0e-40,
            1.0e-45,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            3.0e38,
            -3.0e38,
            1.0e30,
            1.0e-30,
            1.0,
            -0.5,
        ];
        if self.below(1000) < special {
            EDGES[self.below(EDGES.len() as u32) as usize]
        } else {
            (self.below(1 << 24) as f32 / (1 << 22) as f32 - 2.0) * 1.5
        }
    }
    fn values(&mut self, n: usize, special: u32) -> Vec<f32> {
        (0..n).map(|_| self.value(special)).collect()
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The devices to check: the wgpu device as the probe configured it, and one forced to the
/// software `fma` (both, when the driver's own `fma` is not fused, use the software routine).
fn devices() -> &'static [WgpuDevice] {
    static DEVICES: OnceLock<Vec<WgpuDevice>> = OnceLock::new();
    DEVICES.get_or_init(|| {
        let mut v = Vec::new();
        for force in [WgslOptions::HARDWARE, WgslOptions::SOFTWARE] {
            match WgpuDevice::with_soft_math(force) {
                Ok(d) => {
                    println!("{}: software routines {:?}", d.name(), d.soft_math());
                    v.push(d);
                }
                Err(e) => qforge_testkit::unavailable("wgpu", e),
            }
        }
        v
    })
}

/// Runs `kernel` on the interpreter and on every device; the number of mismatching elements.
fn mismatches(kernel: &Kernel, args: &[OwnedArg]) -> usize {
    let mut reference = args.to_vec();
    InterpreterDevice
        .launch(kernel, &mut OwnedArg::borrow_all(&mut reference))
        .expect("interpreter runs");
    let mut bad = 0;
    for dev in devices() {
        let mut got = args.to_vec();
        dev.launch(kernel, &mut OwnedArg::borrow_all(&mut got))
            .unwrap_or_else(|e| panic!("{} on {}: {e}", kernel.name, dev.name()));
        let (b, total) = count_mismatches(kernel, &reference, &got);
        if b > 0 {
            println!("{}: {b} of {total} differ on {}", kernel.name, dev.name());
        }
        bad += b;
    }
    bad
}

fn dot_args(t: u32, rows: u32, len: u32, r: &mut Rng, special: u32) -> Vec<OwnedArg> {
    let n = (rows * len) as usize;
    vec![
        OwnedArg::Scalar(Scalar::U32(rows)),
        OwnedArg::Scalar(Scalar::U32(len)),
        OwnedArg::Read(f32_bytes(&r.values(n, special))),
        OwnedArg::Read(f32_bytes(&r.values(n * t as usize, special))),
        OwnedArg::Write(vec![0; 4 * (rows * t) as usize]),
    ]
}

fn nf4_args(xdtype: DType, m: u32, n: u32, k: u32, r: &mut Rng, special: u32) -> Vec<OwnedArg> {
    let nk = n * k;
    let nbytes = nk.div_ceil(2);
    let nblocks = nk.div_ceil(64);
    let xs = r.values((m * k) as usize, special);
    let x = match xdtype {
        DType::F16 => xs.iter().flat_map(|v| f16_bits(*v).to_le_bytes()).collect(),
        _ => f32_bytes(&xs),
    };
    let w: Vec<u8> = (0..nbytes).map(|_| r.below(256) as u8).collect();
    let absmax: Vec<f32> = (0..nblocks).map(|_| r.value(special).abs()).collect();
    vec![
        OwnedArg::Scalar(Scalar::U32(m)),
        OwnedArg::Scalar(Scalar::U32(n)),
        OwnedArg::Scalar(Scalar::U32(k)),
        OwnedArg::Scalar(Scalar::U32(nbytes)),
        OwnedArg::Scalar(Scalar::U32(nblocks)),
        OwnedArg::Read(x),
        OwnedArg::Read(w),
        OwnedArg::Read(f32_bytes(&absmax)),
        OwnedArg::Write(vec![0; 4 * (m * n) as usize]),
        OwnedArg::Scalar(Scalar::U32(m * n / 2)),
    ]
}

/// Some f16 bit pattern for `v` (truncated; any pattern is valid input, the kernel widens it).
fn f16_bits(v: f32) -> u16 {
    let b = v.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let e = ((b >> 23) & 0xff) as i32 - 127 + 15;
    let m = ((b >> 13) & 0x3ff) as u16;
    match e {
        _ if v.is_nan() => sign | 0x7e00,
        e if e >= 31 => sign | 0x7c00,
        e if e <= 0 => sign | (m >> 1),
        e => sign | ((e as u16) << 10) | m,
    }
}

#[test]
fn accumulate_validates_with_builtin_and_software_fma() {
    for order in ORDERS {
        for k in [
            dot_kernel(order, 1),
            dot_kernel(order, 4),
            nf4_kernel(order, DType::F16),
        ] {
            let hw = WgslBackend
                .lower(&k)
                .unwrap_or_else(|e| panic!("{}: {e}", k.name));
            let sw = WgslBackend
                .lower_with(&k, WgslOptions::SOFTWARE)
                .unwrap_or_else(|e| panic!("{}: {e}", k.name));
            assert_eq!(hw.module.entry_points.len(), 1);
            let main = &hw.wgsl[hw.wgsl.find("fn main(").unwrap()..];
            assert!(main.contains(" fma("), "{}", hw.wgsl);
            assert!(!hw.wgsl.contains("qf_fma"));
            let smain = &sw.wgsl[sw.wgsl.find("fn main(").unwrap()..];
            assert!(smain.contains("qf_fma(") && !smain.contains(" fma("));
        }
    }
}

#[test]
fn accumulate_source_has_the_ir_shape() {
    let k = dot_kernel(ReduceOrder::Strided(8), 2);
    let src = WgslBackend.source(&k).unwrap();
    // Two partial arrays of 8, each set to -0.0.
    assert_eq!(src.matches("array<f32, 8>").count(), 2, "{src}");
    assert!(src.contains("= bitcast<f32>(0x80000000u); }"), "{src}");
    // Element i goes to partial i & 7, fused.
    assert!(src.contains(" & 7u;"), "{src}");
    assert_eq!(src.matches(" = fma(").count(), 2, "{src}");
    // The halving tree 8 -> 4 -> 2 -> 1 per accumulator, then the assignments.
    for w in [4, 2, 1] {
        assert_eq!(src.matches(&format!("[j + {w}u]")).count(), 2, "{src}");
    }
    assert!(
        src.contains("l_acc0 = a") && src.contains("l_acc1 = a"),
        "{src}"
    );
    let seq = WgslBackend
        .source(&dot_kernel(ReduceOrder::Sequential, 1))
        .unwrap();
    assert!(!seq.contains("array<f32, "), "{seq}");
    assert!(seq.contains(": f32 = bitcast<f32>(0x80000000u);"), "{seq}");
}

#[test]
fn dot_products_match_the_interpreter_for_every_order_and_length() {
    if devices().is_empty() {
        return;
    }
    let mut r = Rng(1);
    let mut bad = 0;
    for order in ORDERS {
        for t in [1, 2, 4] {
            let k = dot_kernel(order, t);
            for len in lengths(order) {
                for special in [0, 20, 300] {
                    let args = dot_args(t, 5, len, &mut r, special);
                    bad += mismatches(&k, &args);
                }
            }
        }
    }
    assert_eq!(bad, 0);
}

#[test]
fn nf4_matmul_body_matches_the_interpreter() {
    if devices().is_empty() {
        return;
    }
    let mut r = Rng(2);
    let mut bad = 0;
    for order in ORDERS {
        for xdtype in [DType::F32, DType::F16] {
            let kern = nf4_kernel(order, xdtype);
            for k in [1, 3, 64, 100, 130] {
                for special in [0, 50] {
                    let args = nf4_args(xdtype, 3, 4, k, &mut r, special);
                    bad += mismatches(&kern, &args);
                }
            }
        }
    }
    assert_eq!(bad, 0);
}

/// Exact cancellation, ties and overflow in the partials: values chosen so that the result of
/// every order depends on the fused step and the tree (proptest, few cases).
#[test]
fn proptest_dot_products_with_edge_values() {
    if devices().is_empty() {
        return;
    }
    let mut runner = qforge_testkit::runner(file!(), qforge_testkit::random_cases(16));
    let edge = prop_oneof![
        4 => -4.0f32..4.0,
        1 => prop::sample::select(vec![
            0.0f32, -0.0, 1.0e-45, -1.0e-45, 1.1754942e-38, f32::INFINITY, f32::NEG_INFINITY,
            f32::NAN, 3.0e38, -3.0e38, 1.0 + f32::EPSILON, 1.0 - f32::EPSILON / 2.0, 16_777_216.0,
        ]),
        1 => any::<u32>().prop_map(f32::from_bits),
    ];
    // Either plain data (where a product rounded before the add would show) or data mixed
    // with edge values.
    let xs = |len: usize| {
        prop_oneof![
            prop::collection::vec(-4.0f32..4.0, len),
            prop::collection::vec(edge.clone(), len),
        ]
    };
    let strategy = (0..ORDERS.len(), 0usize..120).prop_flat_map(move |(o, len)| {
        (Just(o), xs(len), prop::collection::vec(-4.0f32..4.0, len))
    });
    runner
        .run(&strategy, |(o, xs, ys)| {
            let k = dot_kernel(ORDERS[o], 1);
            let args = vec![
                OwnedArg::Scalar(Scalar::U32(1)),
                OwnedArg::Scalar(Scalar::U32(xs.len() as u32)),
                OwnedArg::Read(f32_bytes(&xs)),
                OwnedArg::Read(f32_bytes(&ys)),
                OwnedArg::Write(vec![0; 4]),
            ];
            prop_assert_eq!(mismatches(&k, &args), 0);
            Ok(())
        })
        .unwrap();
}
