//! `Stmt::Accumulate` on the CPU device (Cranelift): every order, length and body checked bit for
//! bit (NaN == NaN) against the reference interpreter, with the SIMD lowering on and off, on the
//! native instruction set and on the baseline one (x86_64: SSE2, software `fma`). A plain-Rust
//! computation of the dot product checks the interpreter-independent meaning too.

use std::sync::OnceLock;

use proptest::prelude::*;
use qforge::ir::{
    count_mismatches, Access, BinaryOp, CmpOp, DType, Dim, Kernel, KernelBuilder, OwnedArg,
    ReduceOrder, Scalar, ScalarType, VarId,
};
use qforge::kernels::matmul4::panels::{dx_panel_bytes, scale_chunk};
use qforge::kernels::{Direction, Matmul4, QuantType, TileConfig};
use qforge::runtime::{CpuDevice, CpuOptions, Device};

#[path = "cpu_accumulate/columns.rs"]
mod columns;
#[path = "cpu_accumulate/running.rs"]
mod running;
#[path = "cpu_accumulate/wide.rs"]
mod wide;

// ----- harness -----

/// The four CPU devices: SIMD on/off times native/baseline instruction set.
fn devices() -> &'static [CpuDevice; 4] {
    static DEVICES: OnceLock<[CpuDevice; 4]> = OnceLock::new();
    DEVICES.get_or_init(|| {
        let dev = |simd, native_features| {
            CpuDevice::with_options(CpuOptions {
                simd,
                native_features,
                ..CpuOptions::default()
            })
            .expect("Cranelift supports the host")
        };
        [
            dev(true, true),
            dev(false, true),
            dev(true, false),
            dev(false, false),
        ]
    })
}

/// Runs `kernel` on the interpreter and on every CPU device: the outputs must be identical (or
/// every run must fail naming the same work item). Returns the interpreter's arguments.
fn check(kernel: &Kernel, args: &[OwnedArg]) -> Vec<OwnedArg> {
    let mut reference = args.to_vec();
    let want = qforge::ir::interp::run(kernel, &mut OwnedArg::borrow_all(&mut reference));
    for (d, device) in devices().iter().enumerate() {
        let mut out = args.to_vec();
        let got = device.launch(kernel, &mut OwnedArg::borrow_all(&mut out));
        match (&want, got) {
            (Ok(()), Ok(())) => {
                let (bad, total) = count_mismatches(kernel, &out, &reference);
                assert_eq!(
                    bad,
                    0,
                    "kernel {} on device #{d} ({:?}): {bad} of {total} outputs differ",
                    kernel.name,
                    device.options()
                );
            }
            (
                Err(qforge::ir::Error::Execution { work_item: w, .. }),
                Err(qforge::runtime::Error::Ir(qforge::ir::Error::Execution {
                    work_item: g, ..
                })),
            ) => assert_eq!(
                *w, g,
                "kernel {}: device #{d} reports another work item",
                kernel.name
            ),
            (want, got) => panic!(
                "kernel {} on device #{d}: interpreter {want:?}, device {got:?}",
                kernel.name
            ),
        }
    }
    reference
}

fn le_f32(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn encode(dtype: DType, v: &[f32]) -> Vec<u8> {
    match dtype {
        DType::F32 => le_f32(v),
        DType::F16 => v
            .iter()
            .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
            .collect(),
        DType::BF16 => v
            .iter()
            .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
            .collect(),
        other => panic!("not a float dtype: {other}"),
    }
}

/// A xorshift stream.
struct Rng(u32);

impl Rng {
    fn next(&mut self) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 17;
        self.0 ^= self.0 << 5;
        self.0
    }

    /// A value in about `[-2, 2]` with a full mantissa (products and sums round).
    fn plain(&mut self) -> f32 {
        (self.next() as f32 / u32::MAX as f32) * 4.0 - 2.0
    }
}

const EDGES: [f32; 14] = [
    0.0,
    -0.0,
    1.0,
    -1.5,
    f32::MIN_POSITIVE,
    -1e-40,
    1e-45,
    3e38,
    -3e38,
    1e30,
    f32::INFINITY,
    f32::NEG_INFINITY,
    f32::NAN,
    0.1,
];

/// `len` values: plain ones when `edges` is 0, else one edge value about every `edges`.
fn values(len: usize, seed: u32, edges: u32) -> Vec<f32> {
    let mut r = Rng(seed | 1);
    (0..len)
        .map(|_| {
            let x = r.next();
            if edges != 0 && x.is_multiple_of(edges) {
                EDGES[(x / edges) as usize % EDGES.len()]
            } else {
                r.plain()
            }
        })
        .collect()
}

fn ways(order: ReduceOrder) -> usize {
    match order {
        ReduceOrder::Sequential => 1,
        ReduceOrder::Strided(w) => w as usize,
    }
}

const ORDERS: [ReduceOrder; 7] = [
    ReduceOrder::Sequential,
    ReduceOrder::Strided(2),
    ReduceOrder::Strided(4),
    ReduceOrder::Strided(8),
    ReduceOrder::Strided(16),
    ReduceOrder::Strided(32),
    ReduceOrder::Strided(64),
];

/// The lengths of the brief for `order`: 0, 1, 3, w-1, w+1, 100, 1000 (and w).
fn lengths(order: ReduceOrder) -> Vec<u32> {
    let w = ways(order) as u32;
    let mut v = vec![0, 1, 3, w.saturating_sub(1), w, w + 1, 100, 1000];
    v.sort_unstable();
    v.dedup();
    v
}

// ----- kernels -----

/// `out[g] = sum_i x[g * len + i] * y[i]` (and, with `two`, `out2[g] = sum_i y[i] * s` with the
/// scalar `s` defined outside the loop) for `g` in `0..rows`; `x` of `xdt` widened to `f32`.
/// `ylen` sizes `y` separately so a launch can read past it.
fn dot_kernel(order: ReduceOrder, xdt: DType, two: bool) -> Kernel {
    let mut b = KernelBuilder::new(&format!("dot_w{}_{xdt}_{two}", ways(order)));
    let rows = b.scalar_param("rows", ScalarType::U32);
    let len = b.scalar_param("len", ScalarType::U32);
    let ylen = b.scalar_param("ylen", ScalarType::U32);
    let s = b.scalar_param("s", ScalarType::F32);
    let x = b.buffer_param("x", xdt, &[Dim::Param(rows), Dim::Param(len)], Access::Read);
    let y = b.buffer_param("y", DType::F32, &[Dim::Param(ylen)], Access::Read);
    let out = b.buffer_param("out", DType::F32, &[Dim::Param(rows)], Access::Write);
    let out2 = b.buffer_param("out2", DType::F32, &[Dim::Param(rows)], Access::Write);
    b.set_grid(Dim::Param(rows));
    let g = b.work_item();
    let n = b.param(len);
    let sv = b.param(s);
    let row = b.mul(g, n);
    let v0 = b.var("acc0", ScalarType::F32);
    let v1 = b.var("acc1", ScalarType::F32);
    let vars: Vec<VarId> = if two { vec![v0, v1] } else { vec![v0] };
    b.accumulate(n, order, &vars, |b, i| {
        let e = b.add(row, i);
        let xv = b.load(x, e);
        let yv = b.load(y, i);
        let mut f = vec![(xv, yv)];
        if two {
            f.push((yv, sv));
        }
        f
    });
    let r0 = b.read_var(v0);
    b.store(out, g, r0);
    let r1 = b.read_var(v1);
    b.store(out2, g, r1);
    b.finish()
}

fn dot_args(xdt: DType, rows: u32, len: u32, ylen: u32, seed: u32, edges: u32) -> Vec<OwnedArg> {
    let n = (rows * len) as usize;
    vec![
        OwnedArg::Scalar(Scalar::U32(rows)),
        OwnedArg::Scalar(Scalar::U32(len)),
        OwnedArg::Scalar(Scalar::U32(ylen)),
        OwnedArg::Scalar(Scalar::F32((-0.75f32).to_bits())),
        OwnedArg::Read(encode(xdt, &values(n, seed, edges))),
        OwnedArg::Read(le_f32(&values(ylen as usize, seed ^ 0x5555, edges))),
        OwnedArg::Write(vec![0xA5; 4 * rows as usize]),
        OwnedArg::Write(vec![0xA5; 4 * rows as usize]),
    ]
}

/// The NF4 matmul body written out by hand (`tn` accumulators, one per weight row `n`):
/// `out[n] = sum_k x[k] * (table[nibble(n*K + k)] * absmax[(n*K + k) >> 6])`, the nibble picked
/// with a select on the parity (even: high nibble) in `select` form or with a variable shift.
fn nf4_kernel(order: ReduceOrder, tn: u32, shift_form: bool) -> Kernel {
    let mut b = KernelBuilder::new(&format!("nf4_w{}_{tn}_{shift_form}", ways(order)));
    let k = b.scalar_param("k", ScalarType::U32);
    let n = b.scalar_param("n", ScalarType::U32);
    let n_packed = b.scalar_param("n_packed", ScalarType::U32);
    let n_blocks = b.scalar_param("n_blocks", ScalarType::U32);
    let items = b.scalar_param("items", ScalarType::U32);
    let x = b.buffer_param("x", DType::F32, &[Dim::Param(k)], Access::Read);
    let packed = b.buffer_param("packed", DType::U8, &[Dim::Param(n_packed)], Access::Read);
    let absmax = b.buffer_param("absmax", DType::F32, &[Dim::Param(n_blocks)], Access::Read);
    let out = b.buffer_param("out", DType::F32, &[Dim::Param(n)], Access::Write);
    let table = b.table_f32("nf4", &qforge::kernels::maps::nf4_code());
    b.set_grid(Dim::Param(items));
    let g = b.work_item();
    let kv = b.param(k);
    let tnv = b.const_u32(tn);
    let first = b.mul(g, tnv);
    let rows: Vec<_> = (0..tn)
        .map(|j| {
            let jv = b.const_u32(j);
            let r = b.add(first, jv);
            b.mul(r, kv)
        })
        .collect();
    let vars: Vec<VarId> = (0..tn)
        .map(|j| b.var(&format!("acc{j}"), ScalarType::F32))
        .collect();
    b.accumulate(kv, order, &vars, |b, i| {
        let xv = b.load(x, i);
        rows.iter()
            .map(|row| {
                let e = b.add(*row, i);
                let one = b.const_u32(1);
                let byte_idx = b.shr(e, one);
                let byte = b.load(packed, byte_idx);
                let parity = b.and(e, one);
                let fifteen = b.const_u32(15);
                let nibble = if shift_form {
                    let flip = b.binary(BinaryOp::Xor, parity, one);
                    let two = b.const_u32(2);
                    let sh = b.shl(flip, two);
                    let shifted = b.shr(byte, sh);
                    b.and(shifted, fifteen)
                } else {
                    let zero = b.const_u32(0);
                    let even = b.cmp(CmpOp::Eq, parity, zero);
                    let four = b.const_u32(4);
                    let hi = b.shr(byte, four);
                    let lo = b.and(byte, fifteen);
                    b.select(even, hi, lo)
                };
                let code = b.lookup(table, nibble);
                let six = b.const_u32(6);
                let block = b.shr(e, six);
                let am = b.load(absmax, block);
                let wv = b.mul(code, am);
                (xv, wv)
            })
            .collect()
    });
    for (j, var) in vars.iter().enumerate() {
        let jv = b.const_u32(j as u32);
        let idx = b.add(first, jv);
        let r = b.read_var(*var);
        b.store(out, idx, r);
    }
    b.finish()
}

fn nf4_args(k: u32, n: u32, tn: u32, seed: u32, edges: u32) -> Vec<OwnedArg> {
    let elems = (k * n) as usize;
    let n_packed = elems.div_ceil(2);
    let n_blocks = elems.div_ceil(64);
    let mut r = Rng(seed | 1);
    let packed: Vec<u8> = (0..n_packed).map(|_| r.next() as u8).collect();
    vec![
        OwnedArg::Scalar(Scalar::U32(k)),
        OwnedArg::Scalar(Scalar::U32(n)),
        OwnedArg::Scalar(Scalar::U32(n_packed as u32)),
        OwnedArg::Scalar(Scalar::U32(n_blocks as u32)),
        OwnedArg::Scalar(Scalar::U32(n / tn)),
        OwnedArg::Read(le_f32(&values(k as usize, seed ^ 0x1234, edges))),
        OwnedArg::Read(packed),
        OwnedArg::Read(le_f32(&values(n_blocks, seed ^ 0x7777, edges))),
        OwnedArg::Write(vec![0xA5; 4 * n as usize]),
    ]
}

// ----- tests -----

#[test]
fn dot_products_in_every_order_and_length() {
    for order in ORDERS {
        let kernel = dot_kernel(order, DType::F32, false);
        for len in lengths(order) {
            for edges in [0, 3] {
                check(&kernel, &dot_args(DType::F32, 3, len, len, len ^ 77, edges));
            }
        }
    }
}

/// The dot product computed here from the definition (partials, `mul_add`, halving tree).
fn reference_dot(order: ReduceOrder, x: &[f32], y: &[f32]) -> f32 {
    let w = ways(order);
    let mut p = vec![-0.0f32; w];
    for (i, (a, b)) in x.iter().zip(y).enumerate() {
        p[i % w] = a.mul_add(*b, p[i % w]);
    }
    let mut h = w;
    while h > 1 {
        h /= 2;
        for j in 0..h {
            p[j] += p[j + h];
        }
    }
    p[0]
}

#[test]
fn dot_products_match_the_definition() {
    for order in ORDERS {
        let kernel = dot_kernel(order, DType::F32, false);
        for len in [0u32, 5, 67, 1000] {
            let args = dot_args(DType::F32, 2, len, len, 9 + len, 0);
            let (x, y) = match (&args[4], &args[5]) {
                (OwnedArg::Read(x), OwnedArg::Read(y)) => (f32s(x), f32s(y)),
                _ => unreachable!(),
            };
            let out = check(&kernel, &args);
            let got = match &out[6] {
                OwnedArg::Write(o) => f32s(o),
                _ => unreachable!(),
            };
            for g in 0..2 {
                let row = &x[g * len as usize..(g + 1) * len as usize];
                let want = reference_dot(order, row, &y);
                assert_eq!(
                    got[g].to_bits(),
                    want.to_bits(),
                    "{order:?} len {len} row {g}"
                );
            }
        }
    }
}

#[test]
fn sums_of_a_single_rounding_each() {
    // Each of the 4 partials gets 1 * -1, then t * t: fma(t, t, -1) = 2^-11 + 2^-24 exactly,
    // while -1 + round(t * t) would be 2^-11.
    let kernel = dot_kernel(ReduceOrder::Strided(4), DType::F32, false);
    let t = 1.0 + f32::EPSILON * 2048.0;
    let mut args = dot_args(DType::F32, 1, 8, 8, 1, 0);
    args[4] = OwnedArg::Read(le_f32(&[1.0, 1.0, 1.0, 1.0, t, t, t, t]));
    args[5] = OwnedArg::Read(le_f32(&[-1.0, -1.0, -1.0, -1.0, t, t, t, t]));
    let out = check(&kernel, &args);
    let got = match &out[6] {
        OwnedArg::Write(o) => f32s(o)[0],
        _ => unreachable!(),
    };
    let lane = 2f32.powi(-11) + 2f32.powi(-24);
    assert_eq!(got, 4.0 * lane);
    assert_ne!(got, 4.0 * (t * t - 1.0), "the products are fused");
}

#[test]
fn empty_sums_are_negative_zero() {
    for order in ORDERS {
        let kernel = dot_kernel(order, DType::F32, true);
        let out = check(&kernel, &dot_args(DType::F32, 2, 0, 0, 1, 0));
        for o in [&out[6], &out[7]] {
            match o {
                OwnedArg::Write(o) => {
                    assert!(
                        f32s(o).iter().all(|v| v.to_bits() == 0x8000_0000),
                        "{order:?}"
                    )
                }
                _ => unreachable!(),
            }
        }
    }
}

#[test]
fn two_accumulators_and_narrow_activations() {
    for order in ORDERS {
        for xdt in [DType::F32, DType::F16, DType::BF16] {
            let kernel = dot_kernel(order, xdt, true);
            for len in [3u32, 9, 100, 257] {
                check(&kernel, &dot_args(xdt, 2, len, len, len, 5));
            }
        }
    }
}

#[test]
fn nf4_bodies_with_two_and_four_accumulators() {
    for order in [
        ReduceOrder::Sequential,
        ReduceOrder::Strided(8),
        ReduceOrder::Strided(32),
    ] {
        for (tn, shift_form) in [(2, false), (4, true), (1, true)] {
            let kernel = nf4_kernel(order, tn, shift_form);
            for k in [1u32, 7, 64, 100, 259] {
                check(&kernel, &nf4_args(k, 4 * tn, tn, k + tn, 0));
                check(&kernel, &nf4_args(k, 4 * tn, tn, k, 5));
            }
        }
    }
}

#[test]
fn out_of_range_reads_report_the_same_work_item() {
    for order in [
        ReduceOrder::Sequential,
        ReduceOrder::Strided(4),
        ReduceOrder::Strided(8),
        ReduceOrder::Strided(64),
    ] {
        let kernel = dot_kernel(order, DType::F32, true);
        // `y` is shorter than the reduction: every work item reads past it.
        for (len, ylen) in [(10u32, 9u32), (100, 97), (1, 0), (9, 4)] {
            check(&kernel, &dot_args(DType::F32, 3, len, ylen, 3, 0));
        }
    }
}

#[test]
fn library_matmul_kernels() {
    // The input gradient's scale chunk is fixed up per K below.
    let directions = [
        Direction::Forward { bias: false },
        Direction::BackwardInput { chunk: 1 },
    ];
    for (tile, dtype, direction, k) in [
        (
            TileConfig { tm: 1, tn: 4 },
            DType::F32,
            directions[0],
            133u32,
        ),
        (TileConfig { tm: 1, tn: 4 }, DType::F32, directions[0], 128),
        (TileConfig { tm: 2, tn: 3 }, DType::BF16, directions[0], 133),
        (TileConfig { tm: 1, tn: 4 }, DType::F32, directions[1], 133),
        (TileConfig { tm: 2, tn: 2 }, DType::F16, directions[1], 64),
    ] {
        let direction = match direction {
            Direction::BackwardInput { .. } => Direction::BackwardInput {
                chunk: scale_chunk(k as usize, 64),
            },
            forward => forward,
        };
        let spec = Matmul4 {
            quant_type: QuantType::Nf4,
            blocksize: 64,
            dtype,
            weight_dtype: dtype,
            nested: false,
            direction,
            tile,
        };
        let kernel = spec.build().expect("builds");
        let (m, n) = (3u32, 7u32);
        // Forward: reduce over k, outputs [m, n]; backward: reduce over n, outputs [m, k].
        let (act_cols, out_cols) = match direction {
            Direction::Forward { .. } => (k, n),
            Direction::BackwardInput { .. } => (n, k),
        };
        let n_tiles = out_cols.div_ceil(tile.tn);
        let items = m.div_ceil(tile.tm) * n_tiles;
        let elems = (n * k) as usize;
        let mut r = Rng(17 + k);
        // Random codes and scales: the input gradient's panel layouts only change their counts.
        let (codes, blocks) = match direction {
            Direction::Forward { .. } => (elems.div_ceil(2), elems.div_ceil(64)),
            Direction::BackwardInput { chunk } => (
                dx_panel_bytes(n as usize, k as usize),
                elems / chunk as usize,
            ),
        };
        let packed: Vec<u8> = (0..codes).map(|_| r.next() as u8).collect();
        let args = vec![
            OwnedArg::Scalar(Scalar::U32(m)),
            OwnedArg::Scalar(Scalar::U32(n)),
            OwnedArg::Scalar(Scalar::U32(k)),
            OwnedArg::Scalar(Scalar::U32(items)),
            OwnedArg::Scalar(Scalar::U32(n_tiles)),
            OwnedArg::Scalar(Scalar::U32(packed.len() as u32)),
            OwnedArg::Scalar(Scalar::U32(blocks as u32)),
            OwnedArg::Read(encode(dtype, &values((m * act_cols) as usize, 3, 7))),
            OwnedArg::Read(packed),
            OwnedArg::Read(le_f32(&values(blocks, 5, 0))),
            OwnedArg::Write(vec![0xA5; (m * out_cols) as usize * dtype.size_bytes()]),
        ];
        check(&kernel, &args);
    }
}

/// A body exercising the vectorizer's index tricks: loads at `(u + i) >> s` from a `u8`, an
/// `f32` and an `f16` buffer, nibble selection by a shift whose amount is `4 * (1 - parity)`,
/// and a left shift by `e & 3`. Buffer sizes are parameters so that a launch can make them
/// exactly large enough or one element too small.
fn index_tricks_kernel(order: ReduceOrder, sb: u32, sf: u32) -> Kernel {
    let mut b = KernelBuilder::new(&format!("tricks_w{}_{sb}_{sf}", ways(order)));
    let n = b.scalar_param("n", ScalarType::U32);
    let u = b.scalar_param("u", ScalarType::U32);
    let nb = b.scalar_param("nb", ScalarType::U32);
    let nf = b.scalar_param("nf", ScalarType::U32);
    let nh = b.scalar_param("nh", ScalarType::U32);
    let bytes = b.buffer_param("bytes", DType::U8, &[Dim::Param(nb)], Access::Read);
    let fl = b.buffer_param("fl", DType::F32, &[Dim::Param(nf)], Access::Read);
    let hf = b.buffer_param("hf", DType::F16, &[Dim::Param(nh)], Access::Read);
    let out = b.buffer_param("out", DType::F32, &[Dim::Const(2)], Access::Write);
    b.set_grid(Dim::Const(1));
    let (nv, uv) = (b.param(n), b.param(u));
    let vars = [b.var("a", ScalarType::F32), b.var("b", ScalarType::F32)];
    b.accumulate(nv, order, &vars, |b, i| {
        let e = b.add(uv, i);
        let (sbv, sfv) = (b.const_u32(sb), b.const_u32(sf));
        let bi = b.shr(e, sbv);
        let byte = b.load(bytes, bi);
        let fi = b.shr(e, sfv);
        let f = b.load(fl, fi);
        let h = b.load(hf, e);
        let nib = nibble_of(b, byte, e);
        let three = b.const_u32(3);
        let small = b.and(e, three);
        let wide = b.shl(nib, small);
        let w = b.int_to_float(wide);
        let wf = b.mul(w, f);
        vec![(wf, h), (h, f)]
    });
    store_vars(&mut b, out, &vars);
    b.finish()
}

/// bitsandbytes' nibble of element `e` in its packed `byte`: `(byte >> (((e & 1) ^ 1) << 2)) & 15`
/// (the high nibble for an even `e`).
fn nibble_of(
    b: &mut KernelBuilder,
    byte: qforge::ir::Value,
    e: qforge::ir::Value,
) -> qforge::ir::Value {
    let one = b.const_u32(1);
    let parity = b.and(e, one);
    let flip = b.binary(BinaryOp::Xor, parity, one);
    let two = b.const_u32(2);
    let amount = b.shl(flip, two);
    let shifted = b.shr(byte, amount);
    let fifteen = b.const_u32(15);
    b.and(shifted, fifteen)
}

/// `out[k] = vars[k]` for each variable.
fn store_vars(b: &mut KernelBuilder, out: qforge::ir::ParamId, vars: &[VarId]) {
    for (k, var) in vars.iter().enumerate() {
        let kv = b.const_u32(k as u32);
        let r = b.read_var(*var);
        b.store(out, kv, r);
    }
}

#[test]
fn index_tricks_match_the_interpreter() {
    let mut r = Rng(5);
    for order in [
        ReduceOrder::Strided(4),
        ReduceOrder::Strided(8),
        ReduceOrder::Strided(32),
    ] {
        for (sb, sf) in [(1u32, 6u32), (1, 2), (2, 3), (3, 1)] {
            let kernel = index_tricks_kernel(order, sb, sf);
            for (n, u) in [
                (0u32, 0u32),
                (1, 0),
                (7, 3),
                (64, 0),
                (64, 1),
                (100, 6),
                (131, 61),
            ] {
                // -1: one element too few (when anything is read), 0: exact, 1: one more.
                for extra in [-1i64, 0, 1] {
                    let need = |s: u32| {
                        if n == 0 {
                            0
                        } else {
                            ((u + n - 1) >> s) as i64 + 1
                        }
                    };
                    let size = |s: u32| (need(s) + extra).max(0) as usize;
                    let (nb, nf, nh) = (size(sb), size(sf), size(0));
                    let args = vec![
                        OwnedArg::Scalar(Scalar::U32(n)),
                        OwnedArg::Scalar(Scalar::U32(u)),
                        OwnedArg::Scalar(Scalar::U32(nb as u32)),
                        OwnedArg::Scalar(Scalar::U32(nf as u32)),
                        OwnedArg::Scalar(Scalar::U32(nh as u32)),
                        OwnedArg::Read((0..nb).map(|_| r.next() as u8).collect()),
                        OwnedArg::Read(le_f32(&values(nf, r.next(), 4))),
                        OwnedArg::Read(encode(DType::F16, &values(nh, r.next(), 0))),
                        OwnedArg::Write(vec![0xA5; 8]),
                    ];
                    check(&kernel, &args);
                }
            }
        }
    }
}

#[test]
fn wrapping_indices_report_like_the_interpreter() {
    // u + i wraps around u32 inside the first vector group: the first lanes are out of range.
    let kernel = index_tricks_kernel(ReduceOrder::Strided(8), 1, 6);
    for u in [u32::MAX - 2, u32::MAX - 1, u32::MAX] {
        let args = vec![
            OwnedArg::Scalar(Scalar::U32(8)),
            OwnedArg::Scalar(Scalar::U32(u)),
            OwnedArg::Scalar(Scalar::U32(16)),
            OwnedArg::Scalar(Scalar::U32(16)),
            OwnedArg::Scalar(Scalar::U32(16)),
            OwnedArg::Read(vec![0x5A; 16]),
            OwnedArg::Read(le_f32(&[1.5; 16])),
            OwnedArg::Read(encode(DType::F16, &[0.5; 16])),
            OwnedArg::Write(vec![0xA5; 8]),
        ];
        check(&kernel, &args);
    }
}

/// A gather that no accumulator uses (`x[j[i + off]]`) beside the factors `x[i + off]`: the
/// 16-element loop lowered only what the factors need, so an out-of-range index there went
/// unreported (a reviewer's case: n = 97, one bad index).
#[test]
fn unused_out_of_range_loads_still_report() {
    let mut b = KernelBuilder::new("unused_gather");
    let n = b.scalar_param("n", ScalarType::U32);
    let off = b.scalar_param("off", ScalarType::U32);
    let nx = b.scalar_param("nx", ScalarType::U32);
    let x = b.buffer_param("x", DType::F32, &[Dim::Param(nx)], Access::Read);
    let j = b.buffer_param("j", DType::U32, &[Dim::Param(nx)], Access::Read);
    let s = b.buffer_param("s", DType::F32, &[Dim::Const(1)], Access::Write);
    b.set_grid(Dim::Const(1));
    let acc = b.var("acc", ScalarType::F32);
    let nv = b.param(n);
    let ov = b.param(off);
    b.accumulate(nv, ReduceOrder::Strided(8), &[acc], |b, i| {
        let e = b.add(i, ov);
        let k = b.load(j, e);
        let _unused = b.load(x, k);
        let xv = b.load(x, e);
        vec![(xv, xv)]
    });
    let z = b.const_u32(0);
    let t = b.read_var(acc);
    b.store(s, z, t);
    let kernel = b.finish();
    for off in [0u32, 2, 5] {
        for bad in [None, Some(3u32), Some(40), Some(95)] {
            let len = 97 + off;
            let js: Vec<u8> = (0..len)
                .flat_map(|i| {
                    if Some(i) == bad.map(|b| b + off) {
                        100_000u32
                    } else {
                        i % 7
                    }
                    .to_le_bytes()
                })
                .collect();
            let args = vec![
                OwnedArg::Scalar(Scalar::U32(97)),
                OwnedArg::Scalar(Scalar::U32(off)),
                OwnedArg::Scalar(Scalar::U32(len)),
                OwnedArg::Read(le_f32(&vec![1.25; len as usize])),
                OwnedArg::Read(js),
                OwnedArg::Write(vec![0; 4]),
            ];
            check(&kernel, &args);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn random_dot_products(
        order in 0usize..ORDERS.len(),
        rows in 1u32..4,
        len in 0u32..300,
        seed in any::<u32>(),
        edges in prop_oneof![Just(0u32), 2u32..9],
        two in any::<bool>(),
    ) {
        let order = ORDERS[order];
        let kernel = dot_kernel(order, DType::F32, two);
        check(&kernel, &dot_args(DType::F32, rows, len, len, seed, edges));
    }
}

/// A timing harness, not a test: the NF4 GEMV (M = 1, K = N = 4096) of the library on the CPU
/// device against the fp32 GEMV of the `gemm` crate. Run with
/// `cargo test --release --test cpu_accumulate -- --ignored --nocapture nf4_gemv_timing`.
#[test]
#[ignore = "timing harness; prints figures, asserts nothing"]
fn nf4_gemv_timing() {
    use std::time::Instant;
    let (m, n, k) = (1u32, 4096u32, 4096u32);
    let elems = (n * k) as usize;
    let mut r = Rng(99);
    let packed: Vec<u8> = (0..elems / 2).map(|_| r.next() as u8).collect();
    let absmax = values(elems / 64, 3, 0);
    let x = values(k as usize, 4, 0);
    // On-CPU nanoseconds of this thread (Linux), to time single-threaded runs on a busy host.
    let cpu_ns = || -> f64 {
        std::fs::read_to_string("/proc/thread-self/schedstat")
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
            .unwrap_or(f64::NAN)
    };
    let median = |f: &mut dyn FnMut()| {
        f();
        let mut t: Vec<(f64, f64)> = (0..15)
            .map(|_| {
                let (s, c) = (Instant::now(), cpu_ns());
                f();
                (s.elapsed().as_secs_f64() * 1e3, (cpu_ns() - c) * 1e-6)
            })
            .collect();
        t.sort_by(|a, b| a.0.total_cmp(&b.0));
        let wall = t[t.len() / 2].0;
        t.sort_by(|a, b| a.1.total_cmp(&b.1));
        (wall, t[t.len() / 2].1)
    };
    let a = values(k as usize, 5, 0);
    let bm = values(elems, 6, 0);
    let mut c = vec![0.0f32; n as usize];
    let (blas, _) = median(&mut || {
        qforge::bench::baselines::fp32_gemm(&a, &bm, &mut c, 1, k as usize, n as usize)
            .expect("gemm");
    });
    println!("fp32 gemm GEMV: {blas:.3} ms");
    for threads in [1usize, 2] {
        for (simd, checked) in [(false, true), (true, true), (true, false)] {
            let options = CpuOptions {
                simd,
                threads: Some(threads),
                ..CpuOptions::default()
            };
            let dev = if checked {
                CpuDevice::with_options(options).expect("cpu")
            } else {
                // SAFETY: the library matmul kernel indexes every buffer in range for these
                // arguments (checked by the tests above on the bounds-checked devices).
                unsafe { CpuDevice::new_unchecked(options) }.expect("cpu")
            };
            for tn in [1u32, 2, 4, 8] {
                let spec = Matmul4 {
                    quant_type: QuantType::Nf4,
                    blocksize: 64,
                    dtype: DType::F32,
                    weight_dtype: DType::F32,
                    nested: false,
                    direction: Direction::Forward { bias: false },
                    tile: TileConfig { tm: 1, tn },
                };
                let kernel = spec.build().expect("builds");
                let tiles = n / tn;
                let mut args = vec![
                    OwnedArg::Scalar(Scalar::U32(m)),
                    OwnedArg::Scalar(Scalar::U32(n)),
                    OwnedArg::Scalar(Scalar::U32(k)),
                    OwnedArg::Scalar(Scalar::U32(tiles)),
                    OwnedArg::Scalar(Scalar::U32(tiles)),
                    OwnedArg::Scalar(Scalar::U32(packed.len() as u32)),
                    OwnedArg::Scalar(Scalar::U32(absmax.len() as u32)),
                    OwnedArg::Read(le_f32(&x)),
                    OwnedArg::Read(packed.clone()),
                    OwnedArg::Read(le_f32(&absmax)),
                    OwnedArg::Write(vec![0; 4 * n as usize]),
                ];
                let (t, cpu) = median(&mut || {
                    dev.launch(&kernel, &mut OwnedArg::borrow_all(&mut args))
                        .expect("launch");
                });
                println!(
                    "nf4 GEMV threads {threads} simd {simd} checked {checked} tile 1x{tn}: \
                     {t:.3} ms ({:.2}x fp32 gemm), this thread on CPU {cpu:.3} ms",
                    blas / t
                );
            }
        }
    }
}
