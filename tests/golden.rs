//! Golden tests: our library kernels against bitsandbytes 0.50.2 (CPU) output stored in
//! `../shared/golden` (see its README). Every case of `nf4`, `fp4`, `doublequant`, `blockwise8`
//! and `constants` runs through the host-side ops (`qforge::kernels::ops`) on the interpreter
//! and on the CPU device, and every field is compared bit for bit (NaN == NaN; the `[1, n]`
//! dequant shape of the native kernel is ignored).
//!
//! Our kernels follow the CUDA kernels' choices; bitsandbytes' CPU path differs in a few
//! documented ways. Each allowed mismatch is PROVEN to be one of them, element by element, and
//! counted; the counts (and the case and element counts of each file) must equal the
//! `EXPECTED_*` tables below, which mirror `docs/compat.md`:
//! * (a) the 4-bit tail block is divided by the absmax on CPU (`x / absmax`) instead of multiplied
//!   by its reciprocal: bnb's code is reproduced from `x / absmax`, ours from `x * (1/absmax)`;
//! * (b) FP4 sign of zero and tiny values: `|v|` at most the first magnitude midpoint and the two
//!   codes are 0 and 8 (they differ only in the sign bit);
//! * (c) the 8-bit CPU quantizer's 65536-entry LUT is not the exact nearest code: ours is the
//!   exact nearest code of the scaled value (f64 brute force, ties to the lower code), bnb's is
//!   not, and a model of the LUT reproduces bnb's;
//! * (e) dequantizing bnb's own FP4 codes: its pure-PyTorch path (odd last dimension) has +0.0 at
//!   FP4 index 8 where the native tables (and ours) have -0.0;
//! * downstream: a dequantized element (or a decoded absmax) whose code differs by (a)-(c).
//!
//! Anything else fails. The double-quant offset (torch's CPU `mean` of the absmax) is bit-exact in
//! every case: our kernel, bnb's stored offset and an independent host model of torch's summation
//! order (`golden_support::torch_mean_model`) agree, and other orders are counted for comparison
//! (more offset tests, against values torch computed, in `golden_support/offset_tests.rs`).
//! `constants/fp4_via_create_fp8_map` (a table qforge does not build) is compared with our FP4
//! values and its one differing magnitude proven and counted.

mod golden_support;
#[path = "golden_support/offset_tests.rs"]
mod offset_tests;

use std::collections::BTreeMap;

use golden_support::*;
use qforge::ir::ReduceOrder;
use qforge::kernels::ops::{self, Absmax4, QuantState4};
use qforge::kernels::{maps, BlockwiseMap, QuantType};
use qforge::runtime::{CpuDevice, Device, InterpreterDevice};

/// The interpreter, and the CPU device when it starts.
fn devices() -> Vec<Box<dyn Device>> {
    let mut d: Vec<Box<dyn Device>> = vec![Box::new(InterpreterDevice)];
    match CpuDevice::new() {
        Ok(cpu) => d.push(Box::new(cpu)),
        Err(e) => qforge_testkit::unavailable(
            "cpu",
            format!("golden tests run on the interpreter only: {e}"),
        ),
    }
    d
}

// The counts `docs/compat.md` records, one table per golden file ("Mismatch categories": the
// `### <file>` tables and their headings' case and element counts; "Double-quantization
// offset": the ulp distances). Every device must find exactly these categories with exactly
// these counts (a category not listed must not occur), so a change in behaviour fails here and
// needs the same edit in the docs. The names are the categories `check_codes4`, `check_codes8`
// and `check_downstream` count.
const TAIL_INFO: &str = "info: tail elements where x/absmax != x*(1/absmax)";
const EXPECTED_NF4: &[(&str, usize)] = &[("cases", 161), ("elements", 328_577), (TAIL_INFO, 2_291)];
const EXPECTED_FP4: &[(&str, usize)] = &[
    ("(b) codes: FP4 sign of zero/tiny values", 4_481),
    ("(e) dequant(bnb codes): pure-path +0.0 at FP4 index 8", 366),
    ("cases", 161),
    ("downstream: dequant of a differing code", 3_653),
    ("elements", 328_577),
    (TAIL_INFO, 2_291),
];
const EXPECTED_BLOCKWISE8: &[(&str, usize)] = &[
    ("(c) codes: LUT, exact zero element", 1_434),
    ("(c) codes: LUT, inf block", 882),
    ("(c) codes: LUT, not the nearest code", 2_422),
    ("(c) codes: LUT, subnormal block (1/absmax overflows)", 640),
    ("(c) codes: LUT, zero block (bnb codes 0)", 2_240),
    ("cases", 108),
    ("downstream: dequant of a differing code", 7_618),
    ("elements", 320_029),
];
const EXPECTED_DOUBLEQUANT: &[(&str, usize)] = &[
    ("(b) codes: FP4 sign of zero/tiny values", 1_637),
    ("(c) codes: LUT, not the nearest code", 4),
    ("cases", 60),
    ("downstream: decoded absmax of a differing qabsmax", 4),
    ("downstream: dequant of a differing code or qabsmax", 2_238),
    (TAIL_INFO, 240),
    ("offset ulps +0", 60),
    ("qabsmax elements", 5_250),
];
/// `docs/compat.md`, "Double-quantization offset": the cases whose offset (ours) is not bnb's,
/// with their number of blocks and the distance in ulps (ours - bnb). None since the offset
/// kernel sums in torch's order; every case is exact.
const EXPECTED_OFFSET_ULPS: &[(&str, usize, i64)] = &[];
/// `Vectorized<float>::size()` of the torch CPU sum kernel that computed bnb's offsets (AVX2; an
/// AVX-512 machine runs the same kernel, see `docs/compat.md`).
const TORCH_X86_LANES: usize = 8;

/// An order the offset could be summed in (the comparison table below).
#[derive(Clone, Copy, Debug)]
enum MeanOrder {
    /// An IR `ReduceOrder`, as [`ordered_mean`] models it.
    Ir(ReduceOrder),
    /// torch's CPU cascade with `Vectorized<float>` of this many lanes.
    Torch(usize),
}

/// `docs/compat.md`, "Other orders on the same data": per order, the cases (of 60) whose mean in
/// that order is bnb's offset exactly, and the largest distance in ulps.
const EXPECTED_OTHER_ORDERS: &[(MeanOrder, usize, u64)] = &[
    (MeanOrder::Ir(ReduceOrder::Sequential), 48, 2),
    (MeanOrder::Ir(ReduceOrder::Strided(2)), 52, 1),
    (MeanOrder::Ir(ReduceOrder::Strided(4)), 52, 1),
    (MeanOrder::Ir(ReduceOrder::Strided(8)), 52, 1),
    (MeanOrder::Ir(ReduceOrder::Strided(16)), 54, 1),
    (MeanOrder::Ir(ReduceOrder::Strided(32)), 52, 1),
    (MeanOrder::Ir(ReduceOrder::Strided(64)), 52, 1),
    (MeanOrder::Torch(4), 52, 1),
    (MeanOrder::Torch(8), 60, 0),
    (MeanOrder::Torch(16), 48, 2),
];

/// Runs `per_device` on every device and checks that each found exactly the `expected` counts.
fn on_devices(
    title: &str,
    expected: &[(&str, usize)],
    mut per_device: impl FnMut(&dyn Device) -> Counts,
) {
    let expected: BTreeMap<String, usize> =
        expected.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    for dev in devices() {
        let counts = per_device(dev.as_ref());
        counts.print(&format!("{title} on {}", dev.name()));
        assert_eq!(
            counts.0,
            expected,
            "{title} on {}: the counts differ from docs/compat.md (left: found, right: documented)",
            dev.name()
        );
    }
}

/// The `f32` mean `sum / f32(n)` with the sum in `order` as `docs/semantics.md` defines it
/// (every accumulator starts at `-0.0`; `Strided(W)`: element `i` into `acc[i % W]`, then the
/// halving tree), written independently of the kernels.
fn ordered_mean(xs: &[f32], order: ReduceOrder) -> f32 {
    let ways = order.ways() as usize;
    let mut acc = vec![-0.0f32; ways];
    for (i, x) in xs.iter().enumerate() {
        acc[i % ways] += x;
    }
    let mut w = ways;
    while w > 1 {
        w /= 2;
        for j in 0..w {
            acc[j] += acc[j + w];
        }
    }
    acc[0] / xs.len() as f32
}

fn assert_same_f32s(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            same_f32(*g, *w),
            "{what}[{i}]: ours {g:e} ({:#x}) vs bnb {w:e} ({:#x})",
            g.to_bits(),
            w.to_bits()
        );
    }
}

/// The 4-bit tables bitsandbytes' CPU quantizer uses (golden midpoints and argsort order).
struct Bnb4 {
    mids: Vec<f32>,
    order: Vec<i64>,
}

fn bnb4(qt: QuantType) -> Option<Bnb4> {
    let consts = load_cases("constants.safetensors")?;
    let t = &consts["tables"];
    Some(Bnb4 {
        mids: t.field(&format!("{qt}_quantize_midpoints")).f32s(),
        order: t.field(&format!("{qt}_quantize_order")).i64s(),
    })
}

/// Compares our packed codes with bnb's element by element, proving every difference is (a) or
/// (b). Returns, per element, whether the codes differ.
#[allow(clippy::too_many_arguments)]
fn check_codes4(
    case: &str,
    qt: QuantType,
    bnb: &Bnb4,
    xs: &[f32],
    blocksize: usize,
    absmax: &[f32],
    ours: &[u8],
    theirs: &[u8],
    counts: &mut Counts,
) -> Vec<bool> {
    let n = xs.len();
    let tail_start = n - n % blocksize;
    let first_mid = maps::fp4_midpoints()[0];
    let mut differs = vec![false; n];
    for i in 0..n {
        let (g, o) = (nibble(theirs, i), nibble(ours, i));
        let a = absmax[i / blocksize];
        let v = scale_mul(xs[i], a);
        let in_tail = i >= tail_start;
        let v_bnb = if in_tail { scale_div(xs[i], a) } else { v };
        assert_eq!(
            g,
            bnb_code4(&bnb.mids, &bnb.order, v_bnb),
            "{case}[{i}]: the bnb CPU model does not reproduce bnb's code"
        );
        assert_eq!(
            o,
            canonical_code4(qt, v),
            "{case}[{i}]: our kernel differs from the canonical model (x = {:e})",
            xs[i]
        );
        if in_tail && !same_f32(v_bnb, v) {
            counts.add("info: tail elements where x/absmax != x*(1/absmax)", 1);
        }
        if g == o {
            continue;
        }
        differs[i] = true;
        let mut residual = g;
        if in_tail {
            let g_mul = bnb_code4(&bnb.mids, &bnb.order, v);
            if g_mul != g {
                counts.add("(a) codes: 4-bit tail block divided, not multiplied", 1);
                residual = g_mul;
                if residual == o {
                    continue;
                }
            }
        }
        let sign_of_zero = qt == QuantType::Fp4
            && v.abs() <= first_mid
            && residual & 7 == 0
            && o & 7 == 0
            && residual ^ o == 8;
        assert!(
            sign_of_zero,
            "{case}[{i}]: unexplained code difference: ours {o}, bnb {g} (x = {:e}, v = {v:e})",
            xs[i]
        );
        counts.add(
            if residual == g {
                "(b) codes: FP4 sign of zero/tiny values"
            } else {
                "(a)+(b) codes: tail division, then FP4 sign"
            },
            1,
        );
    }
    if n % 2 == 1 {
        let z = qt.zero_code();
        assert_eq!(
            (nibble(ours, n), nibble(theirs, n)),
            (z, z),
            "{case}: padding nibble"
        );
    }
    differs
}

/// Compares a dequantized output with bnb's; a difference is allowed only where `explained`.
fn check_downstream(
    what: &str,
    ours: &[f32],
    theirs: &[f32],
    explained: impl Fn(usize) -> bool,
    counts: &mut Counts,
    category: &str,
) {
    assert_eq!(ours.len(), theirs.len(), "{what}: length");
    for (i, (o, g)) in ours.iter().zip(theirs).enumerate() {
        if !same_f32(*o, *g) {
            assert!(
                explained(i),
                "{what}[{i}]: ours {o:e} vs bnb {g:e} with the same code"
            );
            counts.add(category, 1);
        }
    }
}

fn run_4bit_file(file: &str, qt: QuantType, expected: &[(&str, usize)]) {
    let (Some(cases), Some(bnb)) = (load_cases(file), bnb4(qt)) else {
        return;
    };
    on_devices(file, expected, |dev| {
        let mut counts = Counts::default();
        for (name, case) in &cases {
            let input = case.field("input");
            let (x, xs) = (input.host(), input.f32s());
            let bs = case.param_u32("blocksize") as usize;
            let (packed, state) = ops::quantize_4bit(dev, &x, qt, bs, false)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let Absmax4::Plain(absmax) = state.absmax.clone() else {
                panic!("{name}: plain absmax expected")
            };
            let golden_absmax = case.field("absmax").f32s();
            assert_same_f32s(&format!("{name}: absmax"), &absmax, &golden_absmax);
            let golden_packed = case.field("packed").u8s();
            let differs = check_codes4(
                name,
                qt,
                &bnb,
                &xs,
                bs,
                &absmax,
                &packed,
                &golden_packed,
                &mut counts,
            );
            counts.add("elements", xs.len());
            counts.add("cases", 1);

            let golden_dq = case.field("dequant").f32s();
            let dq = ops::dequantize_4bit(dev, &packed, &state)
                .unwrap()
                .to_f32()
                .unwrap();
            check_downstream(
                &format!("{name}: dequant"),
                &dq,
                &golden_dq,
                |i| differs[i],
                &mut counts,
                "downstream: dequant of a differing code",
            );

            // Our dequantization of bnb's own codes.
            let dq = ops::dequantize_4bit(dev, &golden_packed, &state)
                .unwrap()
                .to_f32()
                .unwrap();
            let pure_path = input.shape.last().is_some_and(|d| d % 2 == 1);
            check_downstream(
                &format!("{name}: dequant(bnb codes)"),
                &dq,
                &golden_dq,
                |i| {
                    qt == QuantType::Fp4
                        && pure_path
                        && nibble(&golden_packed, i) == 8
                        && golden_dq[i].to_bits() == 0
                        && dq[i].to_bits() == 0x8000_0000
                },
                &mut counts,
                "(e) dequant(bnb codes): pure-path +0.0 at FP4 index 8",
            );
        }
        assert_eq!(counts.get("cases"), cases.len());
        counts
    });
}

#[test]
fn golden_nf4() {
    run_4bit_file("nf4.safetensors", QuantType::Nf4, EXPECTED_NF4);
}

#[test]
fn golden_fp4() {
    run_4bit_file("fp4.safetensors", QuantType::Fp4, EXPECTED_FP4);
}

/// Proves every 8-bit code difference is (c) and returns, per element, whether they differ.
#[allow(clippy::too_many_arguments)]
fn check_codes8(
    case: &str,
    code: &[f32],
    lut: &Lut8,
    xs: &[f32],
    bs: usize,
    absmax: &[f32],
    ours: &[u8],
    theirs: &[u8],
    counts: &mut Counts,
) -> Vec<bool> {
    let mut differs = vec![false; xs.len()];
    for (b, block) in xs.chunks(bs).enumerate() {
        let (lut_codes, lut_absmax) = lut.quantize_block(block);
        assert!(same_f32(lut_absmax, absmax[b]), "{case}: block {b} absmax");
        for (j, x) in block.iter().enumerate() {
            let i = b * bs + j;
            let (o, g) = (ours[i], theirs[i]);
            assert_eq!(
                g, lut_codes[j],
                "{case}[{i}]: the LUT model does not reproduce bnb's code (x = {x:e})"
            );
            let exact = exact_nearest8(code, scale_mul(*x, absmax[b]));
            assert_eq!(
                o, exact,
                "{case}[{i}]: ours is not the exact nearest code (x = {x:e})"
            );
            if g != o {
                differs[i] = true;
                let a = absmax[b];
                let kind = if a == 0.0 {
                    "(c) codes: LUT, zero block (bnb codes 0)"
                } else if a < f32::MIN_POSITIVE {
                    "(c) codes: LUT, subnormal block (1/absmax overflows)"
                } else if a.is_infinite() {
                    "(c) codes: LUT, inf block"
                } else if *x == 0.0 {
                    "(c) codes: LUT, exact zero element"
                } else {
                    "(c) codes: LUT, not the nearest code"
                };
                counts.add(kind, 1);
            }
        }
    }
    differs
}

#[test]
fn golden_blockwise8() {
    let Some(cases) = load_cases("blockwise8.safetensors") else {
        return;
    };
    let luts: BTreeMap<&str, (Vec<f32>, Lut8)> = BlockwiseMap::ALL
        .iter()
        .map(|m| (m.name(), (m.code(), Lut8::new(&m.code()))))
        .collect();
    on_devices("blockwise8.safetensors", EXPECTED_BLOCKWISE8, |dev| {
        let mut counts = Counts::default();
        for (name, case) in &cases {
            let map = map_of(case.param_str("code"));
            let (code, lut) = &luts[map.name()];
            assert_same_f32s(
                &format!("{name}: code table"),
                code,
                &case.field("code").f32s(),
            );
            let input = case.field("input");
            let (x, xs) = (input.host(), input.f32s());
            let bs = case.param_u32("blocksize") as usize;
            let (q, absmax) =
                ops::quantize_blockwise(dev, &x, map, bs).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_same_f32s(
                &format!("{name}: absmax"),
                &absmax,
                &case.field("absmax").f32s(),
            );
            let golden_q = case.field("quantized").u8s();
            let differs = check_codes8(
                name,
                code,
                lut,
                &xs,
                bs,
                &absmax,
                &q,
                &golden_q,
                &mut counts,
            );
            counts.add("elements", xs.len());
            counts.add("cases", 1);

            let golden_dq = case.field("dequant").f32s();
            let dq = ops::dequantize_blockwise(dev, &q, &absmax, map, bs, x.dtype, &x.shape)
                .unwrap()
                .to_f32()
                .unwrap();
            check_downstream(
                &format!("{name}: dequant"),
                &dq,
                &golden_dq,
                |i| differs[i],
                &mut counts,
                "downstream: dequant of a differing code",
            );
            let dq = ops::dequantize_blockwise(dev, &golden_q, &absmax, map, bs, x.dtype, &x.shape)
                .unwrap()
                .to_f32()
                .unwrap();
            assert_same_f32s(&format!("{name}: dequant(bnb codes)"), &dq, &golden_dq);
        }
        assert_eq!(counts.get("cases"), cases.len());
        counts
    });
}

#[test]
fn golden_doublequant() {
    let (Some(cases), Some(bnb_nf4), Some(bnb_fp4)) = (
        load_cases("doublequant.safetensors"),
        bnb4(QuantType::Nf4),
        bnb4(QuantType::Fp4),
    ) else {
        return;
    };
    let code = BlockwiseMap::Dynamic.code();
    let lut = Lut8::new(&code);
    on_devices("doublequant.safetensors", EXPECTED_DOUBLEQUANT, |dev| {
        let mut counts = Counts::default();
        let mut ulps: BTreeMap<i64, usize> = BTreeMap::new();
        // Per order of EXPECTED_OTHER_ORDERS: (exact cases, max |ulps|).
        let mut other_orders = vec![(0usize, 0u64); EXPECTED_OTHER_ORDERS.len()];
        for (name, case) in &cases {
            let qt = QuantType::parse(case.param_str("quant_type")).unwrap();
            let bnb = if qt == QuantType::Nf4 {
                &bnb_nf4
            } else {
                &bnb_fp4
            };
            let input = case.field("input");
            let (x, xs) = (input.host(), input.f32s());
            let bs = case.param_u32("blocksize") as usize;
            let (packed, state) = ops::quantize_4bit(dev, &x, qt, bs, false)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let Absmax4::Plain(absmax) = state.absmax.clone() else {
                panic!()
            };
            let absmax_raw = case.field("absmax_raw").f32s();
            assert_same_f32s(&format!("{name}: absmax_raw"), &absmax, &absmax_raw);
            let golden_packed = case.field("packed").u8s();
            let code_differs = check_codes4(
                name,
                qt,
                bnb,
                &xs,
                bs,
                &absmax,
                &packed,
                &golden_packed,
                &mut counts,
            );
            counts.add("cases", 1);

            // The offset: bnb's, torch's order (host model) and ours are the same bits.
            let golden_offset = case.field("offset").f32s()[0];
            let model = torch_mean_model(&absmax_raw, TORCH_X86_LANES);
            assert_eq!(
                model.to_bits(),
                golden_offset.to_bits(),
                "{name}: the host model of torch's CPU mean is not bnb's offset"
            );
            let ours = ops::absmax_mean(dev, &absmax_raw).unwrap();
            assert_eq!(
                ours.to_bits(),
                model.to_bits(),
                "{name}: the offset kernel is not torch's CPU mean (host model, docs/compat.md)"
            );
            let d = ulp_diff(ours, golden_offset);
            *ulps.entry(d).or_default() += 1;
            let documented = EXPECTED_OFFSET_ULPS
                .iter()
                .find(|(c, _, _)| c == name)
                .map_or((absmax_raw.len(), 0), |(_, blocks, u)| (*blocks, *u));
            assert_eq!(
                (absmax_raw.len(), d),
                documented,
                "{name}: (blocks, offset ours - bnb in ulps) (docs/compat.md, Double-quantization \
                 offset)"
            );
            for (k, (order, _, _)) in EXPECTED_OTHER_ORDERS.iter().enumerate() {
                let mean = match *order {
                    MeanOrder::Ir(order) => ordered_mean(&absmax_raw, order),
                    MeanOrder::Torch(lanes) => torch_mean_model(&absmax_raw, lanes),
                };
                let u = ulp_diff(mean, golden_offset).unsigned_abs();
                other_orders[k].0 += usize::from(u == 0);
                other_orders[k].1 = other_orders[k].1.max(u);
            }

            // The nested level, with our own offset (bnb's, asserted above).
            let nested = ops::compress_absmax(dev, &absmax_raw).unwrap();
            let Absmax4::Nested {
                qabsmax,
                nested_absmax,
                nested_code,
                offset,
                ..
            } = &nested
            else {
                panic!("nested absmax expected")
            };
            assert_eq!(
                offset.to_bits(),
                golden_offset.to_bits(),
                "{name}: nested offset"
            );
            assert_same_f32s(
                &format!("{name}: nested_absmax"),
                nested_absmax,
                &case.field("nested_absmax").f32s(),
            );
            assert_same_f32s(
                &format!("{name}: nested_code"),
                nested_code,
                &case.field("nested_code").f32s(),
            );
            let diffs: Vec<f32> = absmax_raw.iter().map(|a| a - golden_offset).collect();
            let golden_q = case.field("qabsmax").u8s();
            let q_differs = check_codes8(
                name,
                &code,
                &lut,
                &diffs,
                256,
                nested_absmax,
                qabsmax,
                &golden_q,
                &mut counts,
            );
            counts.add("qabsmax elements", diffs.len());

            let golden_am = case.field("absmax_dequant").f32s();
            let am = ops::decompress_absmax(dev, &nested).unwrap();
            check_downstream(
                &format!("{name}: absmax_dequant"),
                &am,
                &golden_am,
                |b| q_differs[b],
                &mut counts,
                "downstream: decoded absmax of a differing qabsmax",
            );
            let golden_nested = Absmax4::Nested {
                qabsmax: golden_q.clone(),
                nested_absmax: case.field("nested_absmax").f32s(),
                nested_code: case.field("nested_code").f32s(),
                offset: golden_offset,
                nested_blocksize: 256,
            };
            assert_same_f32s(
                &format!("{name}: absmax_dequant(bnb qabsmax)"),
                &ops::decompress_absmax(dev, &golden_nested).unwrap(),
                &golden_am,
            );

            let golden_dq = case.field("dequant").f32s();
            let st = QuantState4 {
                absmax: nested.clone(),
                ..state.clone()
            };
            let dq = ops::dequantize_4bit(dev, &packed, &st)
                .unwrap()
                .to_f32()
                .unwrap();
            check_downstream(
                &format!("{name}: dequant"),
                &dq,
                &golden_dq,
                |i| code_differs[i] || q_differs[i / bs],
                &mut counts,
                "downstream: dequant of a differing code or qabsmax",
            );
            let st = QuantState4 {
                absmax: golden_nested,
                ..state.clone()
            };
            let dq = ops::dequantize_4bit(dev, &golden_packed, &st)
                .unwrap()
                .to_f32()
                .unwrap();
            assert_same_f32s(
                &format!("{name}: dequant(bnb codes, bnb nested absmax)"),
                &dq,
                &golden_dq,
            );
        }
        println!("   offset: ours - bnb in ulps -> cases: {ulps:?}");
        for ((order, exact, max), (got_exact, got_max)) in
            EXPECTED_OTHER_ORDERS.iter().zip(&other_orders)
        {
            println!("   mean in order {order:?}: {got_exact} of 60 exact, max {got_max} ulps");
            assert_eq!(
                (*got_exact, *got_max),
                (*exact, *max),
                "mean in order {order:?}: (exact cases, max ulps) differ from docs/compat.md"
            );
        }
        for (u, k) in &ulps {
            counts.add(&format!("offset ulps {u:+}"), *k);
        }
        counts
    });
}

#[test]
fn golden_constants() {
    let Some(consts) = load_cases("constants.safetensors") else {
        return;
    };
    assert_eq!(consts.len(), 1, "constants.safetensors has one case");
    let t = &consts["tables"];
    assert_same_f32s("nf4", &maps::nf4_code(), &t.field("nf4").f32s());
    assert_same_f32s("fp4", &maps::fp4_code(), &t.field("fp4").f32s());
    // The native dequantization table differs from bnb's `code` only by -0.0 at index 8.
    let native = maps::fp4_dequant_table();
    assert_eq!(native[8].to_bits(), 0x8000_0000);
    assert_eq!(&native[..8], &maps::fp4_code()[..8]);
    assert_eq!(&native[9..], &maps::fp4_code()[9..]);
    assert_same_f32s(
        "dynamic_signed",
        &maps::create_dynamic_map(true, 7, 8).unwrap(),
        &t.field("dynamic_signed").f32s(),
    );
    assert_same_f32s(
        "dynamic_unsigned",
        &maps::create_dynamic_map(false, 7, 8).unwrap(),
        &t.field("dynamic_unsigned").f32s(),
    );
    assert_same_f32s(
        "linear_signed",
        &maps::create_linear_map(true, 8, true).unwrap(),
        &t.field("linear_signed").f32s(),
    );
    assert_same_f32s(
        "nf4_via_create_normal_map",
        &maps::create_normal_map(0.967_708_3, true).unwrap(),
        &t.field("nf4_via_create_normal_map").f32s(),
    );
    assert_same_f32s(
        "nf4_quantize_midpoints",
        &maps::nf4_midpoints(),
        &t.field("nf4_quantize_midpoints").f32s(),
    );
    assert_eq!(
        t.field("nf4_quantize_order").i64s(),
        (0..16).collect::<Vec<i64>>()
    );
    // FP4: bnb's 15 midpoints over the sorted table with two zeros = -(ours reversed), 0, ours.
    let mids = t.field("fp4_quantize_midpoints").f32s();
    let pos = maps::fp4_midpoints();
    assert_eq!(mids[7].to_bits(), 0);
    for k in 0..7 {
        assert_eq!(
            mids[8 + k].to_bits(),
            pos[k].to_bits(),
            "fp4 midpoint {}",
            8 + k
        );
        assert_eq!(
            mids[6 - k].to_bits(),
            (-pos[k]).to_bits(),
            "fp4 midpoint {}",
            6 - k
        );
    }
    // bnb's order = stable argsort of its table (+0.0 at index 8).
    let bnb_table = maps::fp4_code();
    let mut order: Vec<i64> = (0..16).collect();
    order.sort_by(|a, b| {
        bnb_table[*a as usize]
            .partial_cmp(&bnb_table[*b as usize])
            .unwrap()
    });
    assert_eq!(t.field("fp4_quantize_order").i64s(), order);
    // The magnitudes and their codes.
    for (k, c) in maps::FP4_MAGNITUDE_CODES.iter().enumerate() {
        assert_eq!(bnb_table[*c as usize], maps::fp4_magnitudes()[k]);
    }
    assert_fp8_map_fp4_differs_only_in_the_subnormal(&t.field("fp4_via_create_fp8_map").f32s());
    assert_table_numbers(t);
    // Every table of the file was compared.
    assert_eq!(
        t.fields.keys().map(String::as_str).collect::<Vec<_>>(),
        [
            "dynamic_signed",
            "dynamic_unsigned",
            "fp4",
            "fp4_quantize_midpoints",
            "fp4_quantize_order",
            "fp4_via_create_fp8_map",
            "linear_signed",
            "nf4",
            "nf4_quantize_midpoints",
            "nf4_quantize_order",
            "nf4_via_create_normal_map",
        ]
    );
}

/// `constants/fp4_via_create_fp8_map` is bitsandbytes' `create_fp8_map(signed=True,
/// exponent_bits=2, precision_bits=1, total_bits=4)`: an FP4 table that qforge does not build
/// (it has no `create_fp8_map`; its FP4 is `get_4bit_type("fp4")`, `maps::fp4_code()`). Laid out
/// like that map (16 values sorted, `+0.0` then `-0.0`, 240 `+0.0` of padding in the middle),
/// our FP4 values equal it bit for bit except the subnormal magnitude: `create_fp8_map` scales
/// it as `0.5 * 2^-2 / 6 = 1/48`, `get_4bit_type` has `0.0625 / 12 = 1/192`, exactly a quarter.
/// `docs/compat.md` ("Code tables") records the 2 differing entries (+ and -).
fn assert_fp8_map_fp4_differs_only_in_the_subnormal(theirs: &[f32]) {
    let mags = maps::fp4_magnitudes();
    let mut ours: Vec<f32> = mags[1..].iter().rev().map(|m| -m).collect();
    ours.extend([mags[0], -mags[0]]);
    ours.extend(std::iter::repeat_n(0.0f32, 240));
    ours.extend_from_slice(&mags[1..]);
    assert_eq!(ours.len(), theirs.len(), "fp4_via_create_fp8_map: length");
    let mut differ = 0;
    for (i, (o, g)) in ours.iter().zip(theirs).enumerate() {
        if o.to_bits() == g.to_bits() {
            continue;
        }
        assert!(
            o.abs() == mags[1] && g.to_bits() == (4.0 * o).to_bits(),
            "fp4_via_create_fp8_map[{i}]: ours {o:e}, bnb {g:e}: not the subnormal magnitude"
        );
        differ += 1;
    }
    assert_eq!(
        differ, 2,
        "fp4_via_create_fp8_map: entries that differ from our FP4 values (docs/compat.md)"
    );
}

/// The numbers `docs/compat.md` states about the code tables ("8-bit blockwise" and "Code
/// tables"), computed from the golden tables.
fn assert_table_numbers(t: &Case) {
    // The f32 midpoints `f32((a + b) / 2)` that are not the exact midpoint (`f64`, exact).
    for (name, inexact) in [
        ("dynamic_signed", 107),
        ("dynamic_unsigned", 91),
        ("linear_signed", 38),
    ] {
        let c = t.field(name).f32s();
        let n = c
            .windows(2)
            .filter(|w| {
                let exact = (w[0] as f64 + w[1] as f64) / 2.0;
                exact as f32 as f64 != exact
            })
            .count();
        assert_eq!(n, inexact, "{name}: inexact f32 midpoints (docs/compat.md)");
    }
    // The signed dynamic map with torch.linspace's single (fused) rounding is bnb's; with a
    // rounded product and a rounded sum it matches only 214 of the 256 entries.
    let golden = t.field("dynamic_signed").f32s();
    let matching = |fused: bool| {
        let map = dynamic_signed_map_model(fused);
        map.iter()
            .zip(&golden)
            .filter(|(a, b)| a.to_bits() == b.to_bits())
            .count()
    };
    assert_eq!(matching(true), 256, "the fused linspace model");
    assert_eq!(
        matching(false),
        214,
        "the two-rounding linspace model (docs/compat.md)"
    );
    // The 15 NF4 quantiles (`f64`, before rounding to f32) lie at least 0.058 f32-ulp away from a
    // rounding boundary.
    let offset = 0.967_708_3f32;
    let quantiles = [9usize, 8].into_iter().flat_map(|steps| {
        let q = maps::linspace_f32(offset, 0.5, steps);
        q[..steps - 1].to_vec()
    });
    let margin = quantiles
        .map(|q| {
            let x = qforge::kernels::normal_ppf(q as f64);
            let f = x as f32;
            let (down, up) = (f.next_down() as f64, f.next_up() as f64);
            let f = f as f64;
            let below = (x - (f + down) / 2.0) / (f - down);
            let above = ((f + up) / 2.0 - x) / (up - f);
            below.min(above)
        })
        .fold(f64::INFINITY, |m, d| if d.is_nan() { d } else { m.min(d) });
    assert_eq!(
        (margin * 1000.0).floor(),
        58.0,
        "smallest distance of an NF4 quantile from an f32 rounding boundary: {margin} ulp \
         (docs/compat.md says 0.058)"
    );
}

/// bnb's `create_dynamic_map(signed=True)` (7 exponent bits, 8 bits) written out for the test:
/// per exponent `i`, the means of adjacent `linspace(0.1, 1, 2^i + 1)` values times `10^(i-6)`
/// and their negatives, then 0 and 1, sorted. `fused`: each linspace element `start + step*k`
/// with a single rounding (torch's FMA-contracted kernel); otherwise the product and the sum
/// rounded separately.
fn dynamic_signed_map_model(fused: bool) -> Vec<f32> {
    let linspace = |start: f32, end: f32, steps: usize| -> Vec<f32> {
        let step = (end - start) / (steps - 1) as f32;
        (0..steps)
            .map(|i| {
                let (base, k) = if i < steps / 2 {
                    (start, i as f32)
                } else {
                    (end, -((steps - 1 - i) as f32))
                };
                if fused {
                    step.mul_add(k, base)
                } else {
                    base + step * k
                }
            })
            .collect()
    };
    let mut data = Vec::new();
    for i in 0..7 {
        let b = linspace(0.1, 1.0, (1 << i) + 1);
        let s = format!("1e{}", i - 6).parse::<f64>().unwrap() as f32;
        for w in b.windows(2) {
            let m = (w[0] + w[1]) / 2.0;
            data.extend([s * m, -s * m]);
        }
    }
    data.extend([0.0, 1.0]);
    data.sort_by(|a, b| a.total_cmp(b));
    data
}
