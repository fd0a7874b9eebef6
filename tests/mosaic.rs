//! The Mosaic backend (`qforge_codegen::mosaic`, docs/backends/mosaic.md): which library
//! kernels it lowers (the others are refused naming the construct), and for those, with the
//! `stablehlo` feature, the twin bit-exact against the interpreter on the conformance suite's
//! fixed cases, and every Mosaic module compiled by libtpu's Mosaic compiler for TPU v5e and
//! v6e without a TPU (`scripts/mosaic_check.py`, the venv of `scripts/install-mosaic.sh`).

use qforge::codegen::mosaic::{self, Shapes};
use qforge::codegen::Error;
use qforge::ir::OwnedArg;
use qforge::kernels::{self, CatalogEntry};

/// Library kernels with their catalog entries.
type Built = Vec<(kernels::KernelSpec, qforge::ir::Kernel)>;

/// The library kernels the backend lowers, built, with the reasons the others are refused
/// (reason without the kernel name, and how many kernels give it).
fn lowered() -> (Built, Vec<(String, usize)>) {
    let mut ok = Vec::new();
    let mut refused: Vec<(String, usize)> = Vec::new();
    for entry in kernels::catalog() {
        let kernel = entry.build().expect("library kernels build");
        match lower_example(&entry, &kernel) {
            Ok(_) => ok.push((entry, kernel)),
            Err(Error::Unsupported { backend, op }) => {
                assert_eq!(backend, "mosaic");
                let why = op
                    .strip_suffix(&format!(" in {}", kernel.name))
                    .unwrap_or_else(|| {
                        panic!("{}: the refusal does not name it: {op}", kernel.name)
                    })
                    .to_string();
                match refused.iter_mut().find(|(w, _)| *w == why) {
                    Some((_, n)) => *n += 1,
                    None => refused.push((why, 1)),
                }
            }
            Err(e) => panic!("{}: {e}", kernel.name),
        }
    }
    (ok, refused)
}

/// The launch shapes and integer scalars of `kernel` on `entry`'s example arguments for
/// `values`.
fn launch_of(
    entry: &dyn CatalogEntry,
    kernel: &qforge::ir::Kernel,
    values: &[f32],
) -> (Shapes, Vec<Option<u32>>) {
    let mut args = entry.example_args(values).expect("example arguments");
    let args = OwnedArg::borrow_all(&mut args);
    let binding = qforge::ir::bind(kernel, &args).expect("binds");
    let shapes = Shapes {
        grid: binding.grid,
        elements: binding.elements.clone(),
    };
    (shapes, mosaic::scalar_values(&args))
}

/// The launch shapes of `kernel` on `entry`'s example arguments for `values`.
fn shapes_of(entry: &dyn CatalogEntry, kernel: &qforge::ir::Kernel, values: &[f32]) -> Shapes {
    launch_of(entry, kernel, values).0
}

/// Arguments of a 4-bit matmul kernel of `_bsB` and `_tTMxTN` (an input gradient's of `_cC`
/// too) at `m x n x k` (`W [N, K]`: the forward's `y` is `[m, n]`, the input gradient's `dx`
/// `[m, k]`), by parameter name: activations and bias in `[-3, 3)` with subnormals, zeros and the smallest
/// normal among them (one in eight), random codes, absmax in `[0.25, 4)` with an infinity, a
/// NaN, a zero or a subnormal among the blocks of one in four rows. The conformance cases
/// ([`twin::matmul_cases`]) bring the other edge values.
fn matmul_args(kernel: &qforge::ir::Kernel, m: usize, n: usize, k: usize) -> Vec<OwnedArg> {
    use qforge::ir::{ParamKind, Scalar};
    let number = |key: &str| -> usize {
        let at = kernel
            .name
            .find(key)
            .expect("tile and blocksize in the name")
            + key.len();
        let digits: String = kernel.name[at..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().unwrap()
    };
    let (bs, tm) = (number("_bs"), number("_t"));
    let tn = number(&format!("_t{tm}x"));
    // xorshift64.
    let mut state = 0x9e37_79b9_7f4a_7c15 ^ (m * 1000 + n) as u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state as u32
    };
    // Subnormals, zeros and the smallest normal among values in [-3, 3): no term large
    // enough to decide its sum alone, so every element's weight shows in the result.
    let value = |next: &mut dyn FnMut() -> u32| {
        let r = next();
        if r.is_multiple_of(8) {
            [1, 0x807f_ffff, 0x8000_0000, 0x0080_0000][(r >> 3) as usize % 4]
        } else {
            ((r >> 8) as f32 / (1u32 << 24) as f32 * 6.0 - 3.0).to_bits()
        }
    };
    let dx = kernel.name.contains("_dx_");
    let n_tiles = if dx { k.div_ceil(tn) } else { n.div_ceil(tn) };
    let n_blocks = (n * k).div_ceil(bs);
    // The input gradient's layout: 4-bit panels of 32 columns, a scale per `_cC` columns.
    let (n_panel_bytes, n_scales) = if dx {
        (k.div_ceil(32) * n * 16, n * k / number("_c"))
    } else {
        (0, 0)
    };
    let scalar = |v: usize| OwnedArg::Scalar(Scalar::U32(v as u32));
    kernel
        .params
        .iter()
        .map(|(_, p)| match (&p.kind, p.name.as_str()) {
            (ParamKind::Scalar(_), "m") => scalar(m),
            (ParamKind::Scalar(_), "n") => scalar(n),
            (ParamKind::Scalar(_), "k") => scalar(k),
            (ParamKind::Scalar(_), "n_items") => scalar(m.div_ceil(tm) * n_tiles),
            (ParamKind::Scalar(_), "n_tiles") => scalar(n_tiles),
            (ParamKind::Scalar(_), "n_packed") => scalar((n * k).div_ceil(2)),
            (ParamKind::Scalar(_), "n_blocks") => scalar(n_blocks),
            (ParamKind::Scalar(_), "n_nested") => scalar(n_blocks.div_ceil(256)),
            (ParamKind::Scalar(_), "n_panel_bytes") => scalar(n_panel_bytes),
            (ParamKind::Scalar(_), "n_scales") => scalar(n_scales),
            (ParamKind::Scalar(_), "offset") => OwnedArg::Scalar(Scalar::F32(0.125f32.to_bits())),
            (ParamKind::Buffer { dtype, .. }, name) => {
                let count = match name {
                    "x" | "dx" => m * k,
                    "packed" => (n * k).div_ceil(2),
                    "panels" => n_panel_bytes,
                    "absmax" | "qabsmax" if dx => n_scales,
                    "absmax" | "qabsmax" => n_blocks,
                    "nested_absmax" => n_blocks.div_ceil(256),
                    "nested_code" => 256,
                    "bias" => n,
                    _ => m * n,
                };
                let words: Vec<u32> = (0..count)
                    .map(|i| match name {
                        "packed" | "panels" | "qabsmax" => next(),
                        // A special absmax (one in four rows of blocks) makes its
                        // outputs infinite or NaN, whatever the order; the nested
                        // absmax has none.
                        "absmax" if next() % (4 * (k / bs).max(1)) as u32 == 0 => {
                            [0x7f80_0000, 0x7fc0_0000, 0, 1, 0x0040_0000][i % 5]
                        }
                        "absmax" | "nested_absmax" => {
                            ((next() % 15 + 1) as f32 * 0.25).to_bits() ^ (next() & 0x7fff)
                        }
                        _ => value(&mut next),
                    })
                    .collect();
                let bytes: Vec<u8> = match dtype.size_bytes() {
                    1 => words.iter().map(|w| *w as u8).collect(),
                    2 => words
                        .iter()
                        .flat_map(|w| ((w >> 16) as u16).to_le_bytes())
                        .collect(),
                    _ => words.iter().flat_map(|w| w.to_le_bytes()).collect(),
                };
                if name == "y" || name == "dx" {
                    OwnedArg::Write(vec![0; bytes.len()])
                } else {
                    OwnedArg::Read(bytes)
                }
            }
            (ParamKind::Scalar(_), other) => panic!("{}: parameter {other}", kernel.name),
        })
        .collect()
}

/// The library kernel `name`, built.
fn library_kernel(name: &str) -> qforge::ir::Kernel {
    kernels::KernelSpec::from_name(name)
        .unwrap_or_else(|| panic!("no kernel {name}"))
        .build()
        .unwrap()
}

/// Whether `kernel` is a matmul (a top-level `accumulate`): its examples' reduction is the
/// number of values, which must be whole absmax blocks.
fn is_matmul(kernel: &qforge::ir::Kernel) -> bool {
    kernel
        .body
        .iter()
        .any(|s| matches!(s, qforge::ir::Stmt::Accumulate { .. }))
}

/// `kernel` lowered at its example launch: three blocks and five more elements (every
/// dimension the same value would give an element-wise kernel fewer work items than
/// elements); a matmul's reduction over five blocks (two reduction steps of 256 at blocksize
/// 64).
fn lower_example(
    entry: &kernels::KernelSpec,
    kernel: &qforge::ir::Kernel,
) -> Result<mosaic::MosaicModule, Error> {
    let n = if is_matmul(kernel) {
        5 * entry.blocksize()
    } else {
        3 * entry.blocksize() + 5
    };
    let (shapes, scalars) = launch_of(entry.entry(), kernel, &vec![0.25f32; n]);
    mosaic::lower_with(kernel, &shapes, &scalars)
}

#[test]
fn every_library_kernel_lowers_or_is_refused_by_name() {
    let (ok, mut refused) = lowered();
    refused.sort_by_key(|r| std::cmp::Reverse(r.1));
    println!("{} library kernels lower to Mosaic; refused:", ok.len());
    for (why, n) in &refused {
        println!("  {n:4}  {why}");
    }
    // The 8-bit blockwise dequantizations (dynamic, unsigned dynamic, linear) and the 4-bit
    // ones (NF4, FP4) with f32, bf16 and f16 outputs, at every blocksize, and the 4-bit
    // quantizations.
    let names: Vec<String> = ok.iter().map(|(_, k)| k.name.clone()).collect();
    for dtype in ["f32", "bf16", "f16"] {
        for kind in ["dynamic", "dynamic_unsigned", "linear"] {
            for bs in [64, 128, 256, 512, 1024, 2048, 4096] {
                let name = format!("dequantize_blockwise_{kind}_bs{bs}_{dtype}");
                assert!(names.contains(&name), "{name} does not lower");
            }
        }
        for quant_type in ["nf4", "fp4"] {
            for bs in [32, 64, 128, 256, 512, 1024, 2048, 4096] {
                for op in ["dequantize", "quantize"] {
                    let name = format!("{op}_4bit_{quant_type}_bs{bs}_{dtype}");
                    assert!(names.contains(&name), "{name} does not lower");
                }
            }
        }
    }
    // Lowering is deterministic.
    let (entry, kernel) = &ok[0];
    let shapes = shapes_of(entry.entry(), kernel, &[0.5; 300]);
    let a = mosaic::lower(kernel, &shapes).unwrap();
    assert_eq!(a, mosaic::lower(kernel, &shapes).unwrap());
}

#[test]
fn shapes_for_another_kernel_are_an_error() {
    let (ok, _) = lowered();
    let kernel = &ok[0].1;
    let mut shapes = Shapes::with_dims(kernel, 256);
    shapes.elements.pop();
    let e = mosaic::lower(kernel, &shapes).unwrap_err().to_string();
    assert!(e.contains("launch shapes for"), "{e}");
}

/// `for i in 16*w .. min(16*w + 16, n) { body(i) }`: the test kernels' chunk loop.
fn chunk_loop(
    b: &mut qforge::ir::KernelBuilder,
    w: qforge::ir::Value,
    n: qforge::ir::ParamId,
    body: impl FnOnce(&mut qforge::ir::KernelBuilder, qforge::ir::Value),
) {
    let chunk = b.const_u32(16);
    let start = b.mul(w, chunk);
    let nv = b.param(n);
    let sum = b.add(start, chunk);
    let lim = b.min(sum, nv);
    let inside = b.cmp(qforge::ir::CmpOp::Lt, start, nv);
    let end = b.select(inside, lim, start);
    b.for_range(start, end, 1, body);
}

/// A row-chunk kernel of chunk 16 over `x: f32[n]` and `y: u32[n]` that uses every op the
/// backend lowers, with its results in `f: f32[n]`, `b: bf16[n]`, `u: u32[n]`, `s: i32[n]`,
/// `q: u8[n]`, `h: f16[n]` and `g: f32[n]` (shift amounts from the data, so past 31 too; a
/// clamped 5-entry lookup; signed and unsigned orders; float min/max with NaN and signed zeros;
/// `bf16` and `f16` rounding ties, `f16` overflow and subnormal results; `g` is the `f16` input
/// `hin` read as `f32`: subnormals, infinities and NaN payloads; `d` is `x / y`, `y`'s bits read
/// as `f32`: specials, subnormal operands and results, overflow and ties; `e` is `x` times a
/// per-work-item value: a variable read before its first `assign` (zero), assigned under a
/// top-level `if`/`else` with a nested `if` on the work item's bits, from the scale and from
/// `tab[w & 3]` (a load at an index computed per work item), times the scalar `bias`, plus a
/// value of the work item index).
fn every_op_kernel() -> qforge::ir::Kernel {
    use qforge::ir::{
        Access, BinaryOp, CmpOp, DType, Dim, KernelBuilder, Rounding, ScalarType, UnaryOp,
    };
    let mut b = KernelBuilder::new("mosaic_every_op");
    let n = b.scalar_param("n", ScalarType::U32);
    let blocks = b.scalar_param("n_blocks", ScalarType::U32);
    let flat = [Dim::Param(n)];
    let x = b.buffer_param("x", DType::F32, &flat, Access::Read);
    let y = b.buffer_param("y", DType::U32, &flat, Access::Read);
    let bits = b.buffer_param("bits", DType::U8, &flat, Access::Read);
    let scale = b.buffer_param("scale", DType::BF16, &[Dim::Param(blocks)], Access::Read);
    let outs: Vec<_> = [
        ("f", DType::F32),
        ("b", DType::BF16),
        ("u", DType::U32),
        ("s", DType::I32),
        ("q", DType::U8),
    ]
    .iter()
    .map(|(name, d)| b.buffer_param(name, *d, &flat, Access::Write))
    .collect();
    let hin = b.buffer_param("hin", DType::F16, &flat, Access::Read);
    let h = b.buffer_param("h", DType::F16, &flat, Access::Write);
    let g = b.buffer_param("g", DType::F32, &flat, Access::Write);
    let d = b.buffer_param("d", DType::F32, &flat, Access::Write);
    let bias = b.scalar_param("bias", ScalarType::F32);
    let tab = b.buffer_param("tab", DType::U32, &[Dim::Const(5)], Access::Read);
    let e = b.buffer_param("e", DType::F32, &flat, Access::Write);
    b.set_grid(Dim::Param(blocks));
    let table = b.table_u32("t", &[7, 0xffff_fff0, 3, 0x8000_0000, 11]);
    let w = b.work_item();
    let sc = b.load(scale, w);
    // Per work item: a variable under `if`s, a gather, a scalar, the work item's value.
    let v = b.var("v", ScalarType::F32);
    let before = b.read_var(v);
    let zero = b.const_u32(0);
    let one = b.const_u32(1);
    let low = b.and(w, one);
    let even = b.cmp(CmpOp::Eq, low, zero);
    let three = b.const_u32(3);
    let at = b.and(w, three);
    let entry = b.load(tab, at);
    let entry = b.bitcast(entry, ScalarType::F32);
    b.if_else(
        even,
        |b| b.assign(v, sc),
        |b| {
            b.assign(v, entry);
            let two = b.const_u32(2);
            let second = b.and(w, two);
            let set = b.cmp(CmpOp::Ne, second, zero);
            b.if_then(set, |b| {
                let flipped = b.neg(entry);
                b.assign(v, flipped);
            });
        },
    );
    let after = b.read_var(v);
    let bias_value = b.param(bias);
    let scaled = b.mul(after, bias_value);
    let scaled = b.add(scaled, before);
    let sixteen = b.const_u32(16);
    let w_bits = b.shl(w, sixteen);
    let one_f = b.const_u32(0x3f80_0000);
    let w_bits = b.or(w_bits, one_f);
    let w_value = b.bitcast(w_bits, ScalarType::F32);
    let per_item = b.add(scaled, w_value);
    chunk_loop(&mut b, w, n, |b, i| {
        let xv = b.load(x, i);
        let yv = b.load(y, i);
        let q8 = b.load(bits, i);
        // f32: min/max (NaN, signed zeros), neg, abs, mul, add, sub, compares, select.
        let prod = b.mul(xv, sc);
        let mn = b.min(xv, prod);
        let mx = b.max(prod, xv);
        let diff = b.sub(mx, mn);
        let neg = b.neg(diff);
        let ab = b.abs(xv);
        let s1 = b.add(neg, ab);
        let ne = b.cmp(CmpOp::Ne, xv, xv);
        let le = b.cmp(CmpOp::Le, xv, sc);
        let pick = b.select(le, s1, prod);
        let fv = b.select(ne, ab, pick);
        b.store(outs[0], i, fv);
        b.store_rounded(outs[1], i, xv, Rounding::NearestEven);
        // u32: shifts by the data (mod 32), xor, or, and, not, wrapping arithmetic, lookup.
        let sh = b.shl(yv, q8);
        let sr = b.shr(yv, yv);
        let x1 = b.binary(BinaryOp::Xor, sh, sr);
        let o1 = b.or(x1, q8);
        let nt = b.not(o1);
        let t = b.lookup(table, q8);
        let m1 = b.mul(nt, t);
        let mn = b.min(m1, yv);
        let mx = b.max(mn, q8);
        let ng = b.neg(mx);
        let gt = b.cmp(CmpOp::Gt, yv, q8);
        let uv = b.select(gt, ng, mx);
        b.store(outs[2], i, uv);
        // i32: arithmetic shift, signed min/max/compare, abs, neg.
        let si = b.bitcast(yv, ScalarType::I32);
        let sq = b.bitcast(q8, ScalarType::I32);
        let sra = b.shr(si, sq);
        let smin = b.min(sra, sq);
        let smax = b.max(smin, si);
        let sabs = b.abs(smax);
        let sneg = b.unary(UnaryOp::Neg, sabs);
        let lt = b.cmp(CmpOp::Lt, si, sq);
        let sv = b.select(lt, sneg, sabs);
        b.store(outs[3], i, sv);
        // u8: the low 8 bits of a u32.
        let q = b.add(yv, q8);
        b.store(outs[4], i, q);
        // f16 both ways.
        b.store_rounded(h, i, xv, Rounding::NearestEven);
        let hv = b.load(hin, i);
        b.store(g, i, hv);
        // f32 division, correctly rounded.
        let yf = b.bitcast(yv, ScalarType::F32);
        let quotient = b.div(xv, yf);
        b.store(d, i, quotient);
        let ev = b.mul(xv, per_item);
        b.store(e, i, ev);
    });
    b.finish()
}

/// A row-chunk kernel of chunk 16 over `x`, `y`, `z: f32[n]` and `k`, `kd: u32[n]` exercising
/// the backend's integer routines: `fm = fma(x, y, z)`, `sq = sqrt(x)`, `k` converted to `f32`
/// as `u32` (`rne`) and as `i32` (`rdn`, `rup`, `rtz`), `z` converted to `u32` (`rne`, `rup`)
/// and `i32` (`rdn`, `rtz`, `rne`), and `k / kd`, `k % kd` as `u32` and as `i32`.
fn soft_math_kernel() -> qforge::ir::Kernel {
    use qforge::ir::{Access, BinaryOp, DType, Dim, KernelBuilder, Rounding, ScalarType, UnaryOp};
    let mut b = KernelBuilder::new("mosaic_soft_math");
    let n = b.scalar_param("n", ScalarType::U32);
    let blocks = b.scalar_param("n_blocks", ScalarType::U32);
    let flat = [Dim::Param(n)];
    let x = b.buffer_param("x", DType::F32, &flat, Access::Read);
    let y = b.buffer_param("y", DType::F32, &flat, Access::Read);
    let z = b.buffer_param("z", DType::F32, &flat, Access::Read);
    let k = b.buffer_param("k", DType::U32, &flat, Access::Read);
    let kd = b.buffer_param("kd", DType::U32, &flat, Access::Read);
    let outs: Vec<_> = ["fm", "sq", "ne_u", "dn_i", "up_i", "tz_i"]
        .iter()
        .map(|name| b.buffer_param(name, DType::F32, &flat, Access::Write))
        .collect();
    let ints: Vec<_> = [
        "zu_ne", "zu_up", "zi_dn", "zi_tz", "zi_ne", "div_u", "rem_u", "div_i", "rem_i",
    ]
    .iter()
    .map(|name| b.buffer_param(name, DType::U32, &flat, Access::Write))
    .collect();
    b.set_grid(Dim::Param(blocks));
    let w = b.work_item();
    chunk_loop(&mut b, w, n, |b, i| {
        let (xv, yv, zv, kv) = (b.load(x, i), b.load(y, i), b.load(z, i), b.load(k, i));
        let dv = b.load(kd, i);
        let (ks, ds) = (
            b.bitcast(kv, ScalarType::I32),
            b.bitcast(dv, ScalarType::I32),
        );
        for (out, (num, den), op) in [
            (ints[5], (kv, dv), BinaryOp::Div),
            (ints[6], (kv, dv), BinaryOp::Rem),
            (ints[7], (ks, ds), BinaryOp::Div),
            (ints[8], (ks, ds), BinaryOp::Rem),
        ] {
            let v = b.binary(op, num, den);
            let v = b.bitcast(v, ScalarType::U32);
            b.store(out, i, v);
        }
        for (out, to, rounding) in [
            (ints[0], ScalarType::U32, Rounding::NearestEven),
            (ints[1], ScalarType::U32, Rounding::Up),
            (ints[2], ScalarType::I32, Rounding::Down),
            (ints[3], ScalarType::I32, Rounding::TowardZero),
            (ints[4], ScalarType::I32, Rounding::NearestEven),
        ] {
            let v = b.float_to_int(zv, to, rounding);
            let v = b.bitcast(v, ScalarType::U32);
            b.store(out, i, v);
        }
        let fm = b.fma(xv, yv, zv);
        b.store(outs[0], i, fm);
        let sq = b.unary(UnaryOp::Sqrt, xv);
        b.store(outs[1], i, sq);
        let ki = b.bitcast(kv, ScalarType::I32);
        for (out, value, rounding) in [
            (outs[2], kv, Rounding::NearestEven),
            (outs[3], ki, Rounding::Down),
            (outs[4], ki, Rounding::Up),
            (outs[5], ki, Rounding::TowardZero),
        ] {
            let f = b.op(qforge::ir::Op::IntToFloat { value, rounding });
            b.store(out, i, f);
        }
    });
    b.finish()
}

/// A row-chunk kernel of chunk 16 over `x: f32[n]` with two passes over each chunk, as the
/// 8-bit optimizers have: the first folds `v = max(v, abs(x[i]))` into a variable that starts
/// at `init[w]` (any value: negative, `-0.0`, NaN), the second stores `y[i] = x[i] * v`; the
/// variable's final value goes to `top[w]`. A second variable, from the same start, folds the
/// NaN-keeping form `u = select(m > u || m != m, m, u)` of `m = x[i] < -1 ? +0.0 : abs(x[i])`
/// (LLM.int8's row absmax with its outliers zeroed) into `last[w]`.
fn running_max_kernel() -> qforge::ir::Kernel {
    use qforge::ir::{Access, BinaryOp, CmpOp, DType, Dim, KernelBuilder, ScalarType, UnaryOp};
    let mut b = KernelBuilder::new("mosaic_running_max");
    let n = b.scalar_param("n", ScalarType::U32);
    let blocks = b.scalar_param("n_blocks", ScalarType::U32);
    let flat = [Dim::Param(n)];
    let x = b.buffer_param("x", DType::F32, &flat, Access::Read);
    let init = b.buffer_param("init", DType::F32, &[Dim::Param(blocks)], Access::Read);
    let y = b.buffer_param("y", DType::F32, &flat, Access::Write);
    let top = b.buffer_param("top", DType::F32, &[Dim::Param(blocks)], Access::Write);
    let last = b.buffer_param("last", DType::F32, &[Dim::Param(blocks)], Access::Write);
    b.set_grid(Dim::Param(blocks));
    let w = b.work_item();
    let v = b.var("v", ScalarType::F32);
    let u = b.var("u", ScalarType::F32);
    let first = b.load(init, w);
    b.assign(v, first);
    b.assign(u, first);
    chunk_loop(&mut b, w, n, |b, i| {
        let xv = b.load(x, i);
        let mag = b.unary(UnaryOp::Abs, xv);
        let acc = b.read_var(v);
        let m = b.max(acc, mag);
        b.assign(v, m);
        let minus_one = b.const_f32(-1.0);
        let outlier = b.cmp(CmpOp::Lt, xv, minus_one);
        let zero = b.const_f32(0.0);
        let kept = b.select(outlier, zero, mag);
        let acc = b.read_var(u);
        let greater = b.cmp(CmpOp::Gt, kept, acc);
        let nan = b.cmp(CmpOp::Ne, kept, kept);
        let take = b.binary(BinaryOp::Or, greater, nan);
        let next = b.select(take, kept, acc);
        b.assign(u, next);
    });
    let total = b.read_var(v);
    b.store(top, w, total);
    let kept = b.read_var(u);
    b.store(last, w, kept);
    chunk_loop(&mut b, w, n, |b, i| {
        let xv = b.load(x, i);
        let scaled = b.mul(xv, total);
        b.store(y, i, scaled);
    });
    b.finish()
}

/// A row loop over `[rows, cols]` buffers, one row per work item (LLM.int8's row-wise
/// quantization): `top[w]` is the absmax of row `w` of `x` (NaN kept), `y[w, j] = x[w, j] *
/// top[w]` and `z[w, j] = bits(x[w, j]) ^ j ^ flags[j]` (the column index as a value, and a
/// buffer of one word per column read at it), in two loops over
/// the row (the second computes the element index from its own add); with `running`, `run[w]`
/// is the running `max(v, abs(x[w, j]))` from `v = 0` (NaN skipped; at most one step's lanes).
fn row_loop_kernel(running: bool) -> qforge::ir::Kernel {
    use qforge::ir::{Access, BinaryOp, DType, Dim, KernelBuilder, NanMode, ScalarType, UnaryOp};
    let mut b = KernelBuilder::new("mosaic_row_loop");
    let rows = b.scalar_param("rows", ScalarType::U32);
    let cols = b.scalar_param("cols", ScalarType::U32);
    let shape = [Dim::Param(rows), Dim::Param(cols)];
    let x = b.buffer_param("x", DType::F32, &shape, Access::Read);
    let flags = b.buffer_param("flags", DType::U32, &[Dim::Param(cols)], Access::Read);
    let y = b.buffer_param("y", DType::F32, &shape, Access::Write);
    let z = b.buffer_param("z", DType::U32, &shape, Access::Write);
    let top = b.buffer_param("top", DType::F32, &[Dim::Param(rows)], Access::Write);
    let run =
        running.then(|| b.buffer_param("run", DType::F32, &[Dim::Param(rows)], Access::Write));
    b.set_grid(Dim::Param(rows));
    let w = b.work_item();
    let v = b.var("v", ScalarType::F32);
    let c = b.param(cols);
    let start = b.mul(w, c);
    let am = b.reduce_absmax(x, start, c, NanMode::Propagate);
    b.store(top, w, am);
    let zero = b.const_u32(0);
    b.for_range(zero, c, 1, |b, j| {
        let e = b.add(start, j);
        let xv = b.load(x, e);
        let scaled = b.mul(xv, am);
        b.store(y, e, scaled);
        if running {
            let mag = b.unary(UnaryOp::Abs, xv);
            let acc = b.read_var(v);
            let m = b.max(acc, mag);
            b.assign(v, m);
        }
    });
    if let Some(run) = run {
        let total = b.read_var(v);
        b.store(run, w, total);
    }
    b.for_range(zero, c, 1, |b, j| {
        let row = b.mul(c, w);
        let e = b.add(j, row);
        let xv = b.load(x, e);
        let bits = b.bitcast(xv, ScalarType::U32);
        let mixed = b.binary(BinaryOp::Xor, bits, j);
        let flag = b.load(flags, j);
        let mixed = b.binary(BinaryOp::Xor, mixed, flag);
        b.store(z, e, mixed);
    });
    b.finish()
}

/// An element-wise kernel over `[rows, cols]` (LLM.int8's dequantizations): work item `w` is
/// element `(r, c)` with `r = w / cols` and `c = w - r * cols`, under `if r < rows && c <
/// cols`; `z[w] = bits(x[w]) ^ (w * 3) ^ (c << 8) ^ (r << 20) ^ bits(s[r]) ^ f[c]` (the three
/// as values and as indices), and `h[w]` is the `bf16` `g[c]` widened times `x[w]`, rounded
/// to `bf16` (a 16-bit buffer read at the column).
fn element_kernel() -> qforge::ir::Kernel {
    use qforge::ir::{Access, BinaryOp, CmpOp, DType, Dim, KernelBuilder, Rounding, ScalarType};
    let mut b = KernelBuilder::new("mosaic_elements");
    let rows = b.scalar_param("rows", ScalarType::U32);
    let cols = b.scalar_param("cols", ScalarType::U32);
    let n = b.scalar_param("n", ScalarType::U32);
    let shape = [Dim::Param(rows), Dim::Param(cols)];
    let x = b.buffer_param("x", DType::F32, &shape, Access::Read);
    let s = b.buffer_param("s", DType::F32, &[Dim::Param(rows)], Access::Read);
    let f = b.buffer_param("f", DType::U32, &[Dim::Param(cols)], Access::Read);
    let g = b.buffer_param("g", DType::BF16, &[Dim::Param(cols)], Access::Read);
    let z = b.buffer_param("z", DType::U32, &shape, Access::Write);
    let h = b.buffer_param("h", DType::BF16, &shape, Access::Write);
    b.set_grid(Dim::Param(n));
    let w = b.work_item();
    let (rv, cv) = (b.param(rows), b.param(cols));
    let r = b.binary(BinaryOp::Div, w, cv);
    let rc = b.mul(r, cv);
    let c = b.sub(w, rc);
    let row_in = b.cmp(CmpOp::Lt, r, rv);
    let col_in = b.cmp(CmpOp::Lt, c, cv);
    let inside = b.binary(BinaryOp::And, row_in, col_in);
    b.if_then(inside, |b| {
        let xv = b.load(x, w);
        let bits = b.bitcast(xv, ScalarType::U32);
        let three = b.const_u32(3);
        let w3 = b.mul(w, three);
        let acc = b.binary(BinaryOp::Xor, bits, w3);
        let eight = b.const_u32(8);
        let c8 = b.binary(BinaryOp::Shl, c, eight);
        let acc = b.binary(BinaryOp::Xor, acc, c8);
        let twenty = b.const_u32(20);
        let r20 = b.binary(BinaryOp::Shl, r, twenty);
        let acc = b.binary(BinaryOp::Xor, acc, r20);
        let sv = b.load(s, r);
        let sbits = b.bitcast(sv, ScalarType::U32);
        let acc = b.binary(BinaryOp::Xor, acc, sbits);
        let fv = b.load(f, c);
        let acc = b.binary(BinaryOp::Xor, acc, fv);
        b.store(z, w, acc);
        let gv = b.load(g, c);
        let prod = b.mul(gv, xv);
        b.store_rounded(h, w, prod, Rounding::NearestEven);
    });
    b.finish()
}

/// Work item `w`'s chunk `C*w .. min(C*w + C, limit)` as `(start, end)`.
fn chunk_range(
    b: &mut qforge::ir::KernelBuilder,
    w: qforge::ir::Value,
    chunk: u32,
    limit: qforge::ir::ParamId,
) -> (qforge::ir::Value, qforge::ir::Value) {
    let c = b.const_u32(chunk);
    let start = b.mul(w, c);
    let lv = b.param(limit);
    let sum = b.add(start, c);
    let lim = b.min(sum, lv);
    let inside = b.cmp(qforge::ir::CmpOp::Lt, start, lv);
    (start, b.select(inside, lim, start))
}

/// The 4-bit quantization's structure with branches that compute different values: `top[w]`
/// is the absmax of `x`'s `2C` elements `2Cw ..` (read as the pairs of a chunk of `C`); a full
/// block stores `y[i] = 2 x[2i] + x[2i + 1]`, the others (the last, partial one) `y[i] =
/// x[2i] - v * top[w]` with `v = x[2i + 1]` inside `x` and `3.0` past its end (the padding
/// would read `0`), and `x[2i]`'s bits plus `i` in `z` (the loop index as a value). At `C = 512` a step
/// takes 128 lanes of the chunk.
fn branches_kernel(chunk: u32) -> qforge::ir::Kernel {
    use qforge::ir::{Access, CmpOp, DType, Dim, KernelBuilder, NanMode, ScalarType};
    let mut b = KernelBuilder::new(&format!("mosaic_branches_c{chunk}"));
    let n = b.scalar_param("n", ScalarType::U32);
    let half = b.scalar_param("n_half", ScalarType::U32);
    let blocks = b.scalar_param("n_blocks", ScalarType::U32);
    let x = b.buffer_param("x", DType::F32, &[Dim::Param(n)], Access::Read);
    let y = b.buffer_param("y", DType::F32, &[Dim::Param(half)], Access::Write);
    let z = b.buffer_param("z", DType::U32, &[Dim::Param(half)], Access::Write);
    let top = b.buffer_param("top", DType::F32, &[Dim::Param(blocks)], Access::Write);
    b.set_grid(Dim::Param(blocks));
    let w = b.work_item();
    let (start, end) = chunk_range(&mut b, w, 2 * chunk, n);
    let len = b.sub(end, start);
    let am = b.reduce_absmax(x, start, len, NanMode::Propagate);
    b.store(top, w, am);
    let (first, last) = chunk_range(&mut b, w, chunk, half);
    let full_len = b.const_u32(2 * chunk);
    let full = b.cmp(CmpOp::Eq, len, full_len);
    let v = b.var("v", ScalarType::F32);
    let pair = |b: &mut KernelBuilder, i| {
        let one = b.const_u32(1);
        let e0 = b.shl(i, one);
        let e1 = b.add(e0, one);
        (e0, e1)
    };
    let index_plus = |b: &mut KernelBuilder, i, e0| {
        let a = b.load(x, e0);
        let bits = b.bitcast(a, ScalarType::U32);
        let s = b.add(bits, i);
        b.store(z, i, s);
        a
    };
    b.if_else(
        full,
        |b| {
            b.for_range(first, last, 1, |b, i| {
                let (e0, e1) = pair(b, i);
                let a = index_plus(b, i, e0);
                let c = b.load(x, e1);
                let two = b.const_f32(2.0);
                let doubled = b.mul(a, two);
                let t = b.add(doubled, c);
                b.store(y, i, t);
            });
        },
        |b| {
            b.for_range(first, last, 1, |b, i| {
                let (e0, e1) = pair(b, i);
                let nv = b.param(n);
                let inside = b.cmp(CmpOp::Lt, e1, nv);
                b.if_else(
                    inside,
                    |b| {
                        let c = b.load(x, e1);
                        b.assign(v, c);
                    },
                    |b| {
                        let three = b.const_f32(3.0);
                        b.assign(v, three);
                    },
                );
                let a = index_plus(b, i, e0);
                let vv = b.read_var(v);
                let scaled = b.mul(vv, am);
                let t = b.sub(a, scaled);
                b.store(y, i, t);
            });
        },
    );
    b.finish()
}

#[cfg(feature = "stablehlo")]
mod twin {
    use qforge::conformance::{check_values, fixed_cases, values, InputKind};
    use qforge::ir::{OwnedArg, Scalar};
    use qforge::runtime::{Device, InterpreterDevice, MosaicTwinDevice};

    /// The twin device, or `None` after printing why it is unavailable.
    fn twin_device() -> Option<MosaicTwinDevice> {
        MosaicTwinDevice::new()
            .map_err(|e| qforge_testkit::unavailable("stablehlo", e))
            .ok()
    }

    /// xorshift64 words from `seed`.
    fn words(mut state: u64) -> impl FnMut() -> u32 {
        move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u32
        }
    }

    fn le_bytes(v: &[u32]) -> Vec<u8> {
        v.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    /// Runs `kernel` on `args` on the interpreter and on the twin; asserts the same bits.
    fn assert_twin_exact(
        dev: &MosaicTwinDevice,
        kernel: &qforge::ir::Kernel,
        args: Vec<OwnedArg>,
        what: &str,
    ) {
        twin_and_interpreter(dev, kernel, args, what);
    }

    /// The outputs of `kernel` on the interpreter and on the twin, after checking that they
    /// agree (NaNs of any payload count as equal, as the numeric contract has it).
    fn twin_and_interpreter(
        dev: &MosaicTwinDevice,
        kernel: &qforge::ir::Kernel,
        mut args: Vec<OwnedArg>,
        what: &str,
    ) -> (Vec<OwnedArg>, Vec<OwnedArg>) {
        let mut twin = args.clone();
        InterpreterDevice
            .launch(kernel, &mut OwnedArg::borrow_all(&mut args))
            .unwrap();
        dev.launch(kernel, &mut OwnedArg::borrow_all(&mut twin))
            .unwrap();
        let (bad, total) = qforge::ir::count_mismatches(kernel, &args, &twin);
        assert_eq!(bad, 0, "{what}: {bad} of {total} elements differ");
        (args, twin)
    }

    /// Every op the backend lowers, on edge values and random bits, against the interpreter:
    /// 1000 elements (63 work items: two grid steps of rows) and 37 (one partial chunk).
    #[test]
    fn every_op_is_bit_exact_on_the_twin() {
        let Some(dev) = twin_device() else {
            return;
        };
        let kernel = super::every_op_kernel();
        let edges: Vec<u32> = vec![
            0,
            0x8000_0000,
            0x7f80_0000,
            0xff80_0000,
            0x7fc0_0000,
            0xffc0_1234,
            1,
            0x8000_0001,
            0x007f_ffff,
            0x0080_0000,
            0x3f80_8000,
            0x3f81_8000,
            0xbf80_8000,
            0x4000_8001,
            0x3f80_7fff,
            0x7f7f_ffff,
            0x7f7f_8000,
            0x0000_8000,
            0x0001_8000,
            31,
            32,
            33,
            63,
            u32::MAX,
            0x7fff_ffff,
            // f16 rounding: ties at 1 (to even, down and up), the largest finite and the first
            // overflow, subnormal results and their ties, the smallest that rounds to zero.
            0x3f80_1000,
            0x3f80_3000,
            0x477f_efff,
            0x477f_f000,
            0x3380_0000,
            0x33c0_0000,
            0x3420_0000,
            0x3300_0000,
            0x3300_0001,
            0x387f_f000,
        ];
        for n in [1000usize, 37] {
            let mut next = words(0x9e37_79b9_7f4a_7c15u64 ^ n as u64);
            let word = |i: usize, r: u32| {
                if i.is_multiple_of(3) {
                    edges[(i / 3) % edges.len()]
                } else {
                    r
                }
            };
            let mut x: Vec<u32> = (0..n).map(|i| word(i, next())).collect();
            let mut y: Vec<u32> = (0..n).map(|i| word(i + 1, next())).collect();
            // Divisions at the edges: subnormal ties (to even, up, and into the smallest
            // normal), results at half the smallest subnormal and below, overflow, specials.
            let quotients = [
                (0x0000_0001, 0x4000_0000),
                (0x0000_0003, 0x4000_0000),
                (0x0000_0001, 0x3fc0_0000),
                (0x0000_0001, 0x4040_0000),
                (0x0000_0001, 0x3f80_0001),
                (0x00ff_ffff, 0x4000_0000),
                (0x0080_0001, 0x4000_0000),
                (0x0080_0000, 0x4040_0000),
                (0x0040_0000, 0x0020_0000),
                (0x0000_0001, 0x7f7f_ffff),
                (0x7f7f_ffff, 0x0000_0001),
                (0x7f7f_ffff, 0x3f00_0000),
                (0x7f7f_ffff, 0x3f7f_ffff),
                (0x8000_0000, 0x0000_0000),
                (0x7f80_0000, 0xff80_0000),
                (0x3f80_0000, 0x8000_0000),
                (0x4040_0000, 0x40e0_0000),
                (0xff80_0000, 0x0000_0003),
                (0x0000_0000, 0x7fc0_0001),
            ];
            for (i, (a, b)) in quotients.iter().enumerate() {
                (x[i], y[i]) = (*a, *b);
            }
            let bits: Vec<u8> = (0..n).map(|_| next() as u8).collect();
            let blocks = n.div_ceil(16);
            let scale: Vec<u16> = (0..blocks)
                .map(|b| (edges[b % edges.len()] >> 16) as u16)
                .collect();
            let bytes = le_bytes;
            let mut args = vec![
                OwnedArg::Scalar(Scalar::U32(n as u32)),
                OwnedArg::Scalar(Scalar::U32(blocks as u32)),
                OwnedArg::Read(bytes(&x)),
                OwnedArg::Read(bytes(&y)),
                OwnedArg::Read(bits),
                OwnedArg::Read(scale.iter().flat_map(|h| h.to_le_bytes()).collect()),
            ];
            for size in [4, 2, 4, 4, 1] {
                args.push(OwnedArg::Write(vec![0; n * size]));
            }
            let half_edges = [
                0x0001u16, 0x03ff, 0x0200, 0x8001, 0x7c00, 0xfc00, 0x7e00, 0x7c01, 0xfd55, 0x7bff,
                0x0400, 0x8000, 0,
            ];
            let hin: Vec<u8> = (0..n)
                .map(|i| {
                    if i % 2 == 0 {
                        half_edges[(i / 2) % half_edges.len()]
                    } else {
                        next() as u16
                    }
                })
                .flat_map(|v| v.to_le_bytes())
                .collect();
            args.push(OwnedArg::Read(hin));
            args.push(OwnedArg::Write(vec![0; n * 2]));
            args.push(OwnedArg::Write(vec![0; n * 4]));
            args.push(OwnedArg::Write(vec![0; n * 4]));
            args.push(OwnedArg::Scalar(Scalar::F32((-1.5f32).to_bits())));
            let tab: [u32; 5] = [
                0x3f80_0000,
                0xc000_0000,
                0x7fc0_0000,
                0x0000_0001,
                0x8000_0000,
            ];
            args.push(OwnedArg::Read(le_bytes(&tab)));
            args.push(OwnedArg::Write(vec![0; n * 4]));
            assert_twin_exact(&dev, &kernel, args, &format!("n = {n}"));
        }
    }

    /// The integer routines (`fma`, `sqrt`, the conversions, integer `div` and `rem`) on chosen
    /// and random operands against the interpreter: cancellation, ties, subnormal and
    /// overflowing results, every special, gaps past 32 and 64 bits between product and
    /// addend, division by zero and `i32::MIN / -1`.
    #[test]
    fn soft_math_is_bit_exact_on_the_twin() {
        let Some(dev) = twin_device() else {
            return;
        };
        let kernel = super::soft_math_kernel();
        let f = |v: f32| v.to_bits();
        let p = |e: i32| f32::powi(2.0, e).to_bits();
        // (x, y, z) for fma; x also feeds sqrt.
        let mut triples: Vec<(u32, u32, u32)> = vec![
            (f(1.0 + f32::EPSILON), f(1.0 - f32::EPSILON), f(-1.0)),
            (f(1.0), f(1.0), f(-1.0)),
            (f(1.0), f(1.0), p(-24)),
            (f(1.0), f(1.0), p(-24) + 1),
            (f(1.0), f(1.0), f(-f32::from_bits(p(-25)))),
            (f(3.0), 1, 0),
            (p(-75), p(-75), 0),
            (f(1.5) - p(0) + p(-75), p(-75), 0x8000_0000),
            (f(1.5 * 2f32.powi(-75)), p(-75), 0),
            (p(100), p(100), f(1.0)),
            (f(1.0), p(-60), f(1.0)),
            (f(-1.0), f(1.0), f(1.0 + f32::EPSILON)),
            (f32::MAX.to_bits(), f(2.0), f(f32::NEG_INFINITY)),
            (f32::MAX.to_bits(), f(2.0), f(-f32::MAX)),
            (0, f(5.0), 0x8000_0000),
            (0x8000_0000, f(5.0), 0x8000_0000),
            (0x8000_0000, f(5.0), 0),
            (f(f32::INFINITY), 0, f(1.0)),
            (f(f32::INFINITY), f(2.0), f(f32::NEG_INFINITY)),
            (f(f32::INFINITY), f(-2.0), f(f32::NEG_INFINITY)),
            (f(1.0), f(2.0), f(f32::INFINITY)),
            (0x7fc0_1234, f(1.0), f(1.0)),
            (f(1.0), f(1.0), 0xffc0_0001),
            (0x0080_0000, f(0.5), 0x8000_0001),
            (0x007f_ffff, f(1.0 + f32::EPSILON), 0),
            (f(4.0), f(1.0), f(0.0)),
            (f(2.0), f(2.0), 0),
            (f(-4.0), f(1.0), 0),
            (0x0000_0004, f(1.0), 0),
        ];
        // Addends chosen for the conversions to integers: ties, the ends of both ranges, just
        // past them, values below one half, signed zero, infinities and NaN.
        for zv in [
            0.5f32,
            1.5,
            2.5,
            -0.5,
            -1.5,
            -2.5,
            0.499_999_97,
            -0.499_999_97,
            1e-30,
            -1e-30,
            -0.0,
            2_147_483_520.0,
            2_147_483_648.0,
            -2_147_483_648.0,
            -2_147_483_904.0,
            4_294_967_040.0,
            4_294_967_296.0,
            8_388_607.5,
            16_777_215.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
        ] {
            triples.push((f(1.0), f(1.0), zv.to_bits()));
        }
        let mut next = words(0x2545_f491_4f6c_dd1d);
        // Random bits, then products cancelled by a nearby addend.
        for _ in 0..600 {
            triples.push((next(), next(), next()));
        }
        for _ in 0..600 {
            let near = |r: u32, e: u32| (r & 0x807f_ffff) | (e << 23);
            let (ex, ey) = (100 + next() % 60, 100 + next() % 60);
            let (xv, yv) = (near(next(), ex), near(next(), ey));
            let prod = -(f32::from_bits(xv) * f32::from_bits(yv));
            let zv = prod.to_bits() ^ (next() & 0xff);
            triples.push((xv, yv, zv));
        }
        // Products and addends apart by -70 to 70 binades, either sign: the addend or the
        // product shifted past 15 (bits lost into the sticky bit), 32 and 64 bits.
        for _ in 0..1500 {
            let (ex, ey) = (110 + next() % 30, 110 + next() % 30);
            let xv = (next() & 0x807f_ffff) | (ex << 23);
            let yv = (next() & 0x807f_ffff) | (ey << 23);
            let ez = (ex + ey - 127) as i32 + (next() % 141) as i32 - 70;
            let zv = (next() & 0x807f_ffff) | ((ez.clamp(1, 254) as u32) << 23);
            triples.push((xv, yv, zv));
        }
        let n = triples.len();
        let ints: Vec<u32> = (0..n)
            .map(|i| match i % 4 {
                0 => [
                    0,
                    1,
                    16_777_217,
                    16_777_219,
                    0x8000_0000,
                    u32::MAX,
                    0x7fff_ffff,
                    0xff00_0001,
                ][(i / 4) % 8],
                _ => next() >> (next() % 32),
            })
            .collect();
        // Divisors: zero, one, `u32::MAX` (-1 as `i32`, against `i32::MIN` too), the ends of
        // the `i32` range, small odd ones and random widths.
        let divisors: Vec<u32> = (0..n)
            .map(|i| match i % 5 {
                0 => 0,
                1 => 1,
                2 => u32::MAX,
                3 => [0x8000_0000, 3, 0x7fff_ffff, 7, 0xffff_fff9][(i / 5) % 5],
                _ => next() >> (next() % 32),
            })
            .collect();
        let bytes = le_bytes;
        let column =
            |pick: fn(&(u32, u32, u32)) -> u32| triples.iter().map(pick).collect::<Vec<u32>>();
        let mut args = vec![
            OwnedArg::Scalar(Scalar::U32(n as u32)),
            OwnedArg::Scalar(Scalar::U32(n.div_ceil(16) as u32)),
            OwnedArg::Read(bytes(&column(|t| t.0))),
            OwnedArg::Read(bytes(&column(|t| t.1))),
            OwnedArg::Read(bytes(&column(|t| t.2))),
            OwnedArg::Read(bytes(&ints)),
            OwnedArg::Read(bytes(&divisors)),
        ];
        for _ in 0..15 {
            args.push(OwnedArg::Write(vec![0; n * 4]));
        }
        assert_twin_exact(&dev, &kernel, args, "soft math");
    }

    /// The running maximum of two passes over a chunk ([`super::running_max_kernel`]) against
    /// the interpreter: chunks with NaN, signed zeros, subnormals and infinities, chunks of
    /// only NaN (no element counts) and of only zeros, starting values above, below and equal
    /// to the chunk's maximum, negative, `-0.0`, NaN and `+inf`, and a partial last chunk whose
    /// padding lanes must not count.
    #[test]
    fn a_running_maximum_is_bit_exact_on_the_twin() {
        let Some(dev) = twin_device() else {
            return;
        };
        let kernel = super::running_max_kernel();
        let mut next = words(0x9e37_79b9_7f4a_7c15);
        let n = 1000usize;
        let blocks = n.div_ceil(16);
        let special = [
            f32::NAN,
            -0.0,
            0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::from_bits(1),
            -f32::from_bits(0x007f_ffff),
            -3.5,
        ];
        let x: Vec<u32> = (0..n)
            .map(|i| match i / 16 {
                // Only NaN (also in the partial last chunk, where the zero padding lanes would
                // otherwise beat its negative start), only zeros of either sign, only tiny
                // magnitudes.
                0 | 62 => f32::NAN.to_bits() | (i as u32 & 7),
                1 => (-0.0f32).to_bits() * (i as u32 & 1),
                2 => 1 + (i as u32 & 3),
                // NaNs of several payloads and signs among finite values: the last one is
                // `last`'s.
                4 if i % 5 == 0 => 0xffc0_0000 | (100 - i as u32),
                4 => next() & 0x3fff_ffff,
                // Specials mixed with random bits.
                c if c % 3 == 0 => special[i % special.len()].to_bits(),
                _ => next(),
            })
            .collect();
        let init: Vec<u32> = (0..blocks)
            .map(|w| match w % 6 {
                _ if w == blocks - 1 => (-2.0f32).to_bits(),
                0 => (-1.0f32).to_bits(),
                1 => (-0.0f32).to_bits(),
                2 => f32::NAN.to_bits(),
                3 => f32::INFINITY.to_bits(),
                4 => 0,
                _ => next() & 0x7fff_ffff,
            })
            .collect();
        let args = vec![
            OwnedArg::Scalar(Scalar::U32(n as u32)),
            OwnedArg::Scalar(Scalar::U32(blocks as u32)),
            OwnedArg::Read(le_bytes(&x)),
            OwnedArg::Read(le_bytes(&init)),
            OwnedArg::Write(vec![0; n * 4]),
            OwnedArg::Write(vec![0; blocks * 4]),
            OwnedArg::Write(vec![0; blocks * 4]),
        ];
        let (want, got) = twin_and_interpreter(&dev, &kernel, args, "running max");
        // The NaN-keeping form keeps the last NaN's payload too (abs and select pass it on):
        // the checker counts NaNs as equal, so `last` is compared bit for bit.
        let last = want.len() - 1;
        assert!(
            matches!((&want[last], &got[last]), (OwnedArg::Write(a), OwnedArg::Write(b)) if a == b),
            "the last NaN's payload"
        );
    }

    /// Row loops at rows of 5, 37 and 512 lanes (one step's lanes) with a running maximum, and
    /// of 1024 (two lane blocks of 512) and 600 (one block of 600 lanes) without, with NaN and
    /// signed-zero rows.
    #[test]
    fn row_loops_are_bit_exact_on_the_twin() {
        let Some(dev) = twin_device() else {
            return;
        };
        let mut next = words(0x51ed_270b_2f6a_0d3b);
        for (rows, cols) in [(3usize, 5usize), (35, 37), (2, 512), (3, 1024), (2, 600)] {
            let running = cols <= 512;
            let kernel = super::row_loop_kernel(running);
            let x: Vec<u32> = (0..rows * cols)
                .map(|e| match (e / cols, e % 7) {
                    (0, 0) => f32::NAN.to_bits() | (e as u32 & 3),
                    (1, _) => (-0.0f32).to_bits() * (e as u32 & 1),
                    _ => next(),
                })
                .collect();
            let flags: Vec<u32> = (0..cols).map(|_| next()).collect();
            let mut args = vec![
                OwnedArg::Scalar(Scalar::U32(rows as u32)),
                OwnedArg::Scalar(Scalar::U32(cols as u32)),
                OwnedArg::Read(le_bytes(&x)),
                OwnedArg::Read(le_bytes(&flags)),
                OwnedArg::Write(vec![0; rows * cols * 4]),
                OwnedArg::Write(vec![0; rows * cols * 4]),
                OwnedArg::Write(vec![0; rows * 4]),
            ];
            if running {
                args.push(OwnedArg::Write(vec![0; rows * 4]));
            }
            assert_twin_exact(&dev, &kernel, args, &format!("{rows} x {cols}"));
        }
    }

    /// An element-wise kernel at rows of 5 and 37 elements, 1024 (two lane blocks of 512) and
    /// 600.
    #[test]
    fn element_wise_kernels_are_bit_exact_on_the_twin() {
        let Some(dev) = twin_device() else {
            return;
        };
        let kernel = super::element_kernel();
        let mut next = words(0x2545_f491_4f6c_dd1d);
        for (rows, cols) in [(3usize, 5usize), (35, 37), (3, 1024), (2, 600)] {
            let n = rows * cols;
            let mut word = |k: usize| -> Vec<u32> { (0..k).map(|_| next()).collect() };
            let (x, s, f) = (word(n), word(rows), word(cols));
            let g: Vec<u8> = word(cols)
                .iter()
                .flat_map(|v| (*v as u16).to_le_bytes())
                .collect();
            let args = vec![
                OwnedArg::Scalar(Scalar::U32(rows as u32)),
                OwnedArg::Scalar(Scalar::U32(cols as u32)),
                OwnedArg::Scalar(Scalar::U32(n as u32)),
                OwnedArg::Read(le_bytes(&x)),
                OwnedArg::Read(le_bytes(&s)),
                OwnedArg::Read(le_bytes(&f)),
                OwnedArg::Read(g),
                OwnedArg::Write(vec![0; n * 4]),
                OwnedArg::Write(vec![0; n * 2]),
            ];
            assert_twin_exact(&dev, &kernel, args, &format!("{rows} x {cols}"));
        }
    }

    #[test]
    fn branches_and_pairs_reads_are_bit_exact_on_the_twin() {
        let Some(dev) = twin_device() else {
            return;
        };
        let mut next = words(0x2545_f491_4f6c_dd1d);
        // Full blocks and a partial last one of odd length (its last pair has one element);
        // chunks of one step and of two lane blocks.
        for (chunk, n) in [
            (16u32, 32usize),
            (16, 95),
            (16, 133),
            (512, 1024),
            (512, 3001),
        ] {
            let kernel = super::branches_kernel(chunk);
            let (half, blocks) = (n.div_ceil(2), n.div_ceil(2 * chunk as usize));
            // NaN in every other block; each block's largest magnitude in its first lanes
            // (a step's own lanes would miss it).
            let block = 2 * chunk as usize;
            let x: Vec<u32> = (0..n)
                .map(|i| match (i % 7, i % block) {
                    (0, _) if (i / block) % 2 == 1 => f32::NAN.to_bits(),
                    (1, _) => (-0.0f32).to_bits(),
                    (_, 5) => (-8.0 * (1 + i / block) as f32).to_bits(),
                    _ => (next() & 0x807f_ffff) | 0x3f00_0000,
                })
                .collect();
            let args = vec![
                OwnedArg::Scalar(Scalar::U32(n as u32)),
                OwnedArg::Scalar(Scalar::U32(half as u32)),
                OwnedArg::Scalar(Scalar::U32(blocks as u32)),
                OwnedArg::Read(le_bytes(&x)),
                OwnedArg::Write(vec![0; half * 4]),
                OwnedArg::Write(vec![0; half * 4]),
                OwnedArg::Write(vec![0; blocks * 4]),
            ];
            assert_twin_exact(
                &dev,
                &kernel,
                args,
                &format!("branches, C = {chunk}, n = {n}"),
            );
        }
    }

    /// Whether the twin test runs case `label` of a kernel of blocksize `bs`. The reference
    /// interpreter takes about 1 s per case at blocksize 64 and 4.4 s at 256 (a whole
    /// `32 x blocksize` step of 550 vector ops, most of them the 8-bit code's select tree), so
    /// blocksize 64 runs every fixed case, 256 its several-blocks case with edge values, and
    /// the larger blocksizes, whose tile programs differ only in the window width, are
    /// checked by libtpu's compile test alone. The `f16` outputs differ from the `f32` ones only
    /// in the store's rounding, which [`super::every_op_kernel`] checks on edge values and ties:
    /// they run the several-blocks case at blocksize 64. The 8-bit optimizers (blocksize 256,
    /// about 9 s a case) run theirs in `f32` without a gradient scale: their `bf16` and
    /// gradient-scaled forms differ only in a widening load, a store's rounding and one product
    /// by a scalar, which the other kernels' cases check. `QFORGE_MOSAIC_FILTER` runs every
    /// case of the kernels it names.
    fn runs(label: &str, kernel: &str, bs: usize, filtered: bool) -> bool {
        let several = label.contains("several blocks") && label.contains("edge");
        let f16 = kernel.ends_with("_f16");
        let variant = kernel.contains("8bit") && !kernel.ends_with("_f32");
        filtered || (bs == 64 && (!f16 || several)) || (bs == 256 && several && !f16 && !variant)
    }

    /// A matmul's cases: a reduction over one absmax block with edge values and with 4-bit
    /// ties, and over five (two reduction steps of 256 at blocksize 64) with edge values (the
    /// conformance suite's lengths are not whole blocks, which the Mosaic matmul requires; the
    /// ties over five blocks, 90 s of the interpreter's time in all, the `f32` input gradients'
    /// 12 to 21 s each, run with `all`). At these launches
    /// most dimensions are smaller than their tile, so each is its own tile
    /// ([`matmul_tiles_are_bit_exact_on_the_twin`] takes whole tiles); an input gradient's
    /// columns are one or two scale chunks, two or four tiles at `c256`, whose reduction
    /// over five blocks (1280) took 160 s of the interpreter: it runs with `all` (a
    /// `QFORGE_MOSAIC_FILTER`).
    fn matmul_cases(name: &str, bs: usize, all: bool) -> Vec<(String, Vec<f32>)> {
        let mut out = Vec::new();
        let lengths = if name.contains("_dx_") && bs >= 256 && !all {
            vec![bs]
        } else {
            vec![bs, 5 * bs]
        };
        for n in lengths {
            let kinds: &[InputKind] = if n > bs && !all {
                &[InputKind::EdgeValues]
            } else {
                &InputKind::ALL
            };
            for &kind in kinds {
                let label = format!("{name} K = {n}, {}", kind.label());
                let seed = label.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                    (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
                });
                out.push((label, values(kind, n, seed)));
            }
        }
        out
    }

    /// Whole tiles: the 4-bit matmul forward at `M = 9` (two row tiles of 8), `N = 129` (two
    /// column tiles of 128, the second one column) and `K = 64`, in `f32` with a bias; a
    /// nested absmax over 280 blocks (two nested blocks, the second from column 16 of row 6:
    /// `N = 7`, `K = 2560`, ten reduction steps); the input gradient over `N = 260` (two
    /// steps, the second of 4) into `K = 192` columns (two tiles of 4 panels, the second's
    /// last two past `K`); and in `bf16` (row tiles of 16) at `M = 17`.
    #[test]
    fn matmul_tiles_are_bit_exact_on_the_twin() {
        let Some(dev) = twin_device() else {
            return;
        };
        // The bf16 case took 77 s (the f32 one 40 s): it runs with `QFORGE_MOSAIC_FILTER`.
        let filtered = std::env::var("QFORGE_MOSAIC_FILTER").is_ok();
        let cases = [
            ("matmul_4bit_nf4_bs64_f32_bias_t1x4", 9, 129, 64),
            ("matmul_4bit_fp4_nested_bs64_f32_bias_t1x4", 2, 7, 2560),
            ("matmul_4bit_dx_fp4_bs64_f32_c64_t1x4", 1, 260, 192),
            ("matmul_4bit_fp4_bs64_bf16_t4x1", 17, 129, 64),
        ];
        for (name, m, n, k) in cases.into_iter().take(if filtered { 4 } else { 3 }) {
            let kernel = super::library_kernel(name);
            let t = std::time::Instant::now();
            let args = super::matmul_args(&kernel, m, n, k);
            assert_twin_exact(&dev, &kernel, args, &format!("{name} at {m} x {n} x {k}"));
            println!(
                "{name} at {m} x {n} x {k}: {:.1} s",
                t.elapsed().as_secs_f64()
            );
        }
    }

    #[test]
    fn every_lowered_kernel_twin_is_bit_exact() {
        let Some(dev) = twin_device() else {
            return;
        };
        let devices: [(&str, &dyn Device); 1] = [("mosaic-twin", &dev)];
        let (ok, _) = super::lowered();
        let filter = std::env::var("QFORGE_MOSAIC_FILTER").unwrap_or_default();
        let mut work = Vec::new();
        for (entry, kernel) in ok.iter().filter(|(_, k)| k.name.contains(&filter)) {
            if super::is_matmul(kernel) {
                for (label, values) in
                    matmul_cases(&kernel.name, entry.blocksize(), !filter.is_empty())
                {
                    work.push((entry, kernel, label, values));
                }
                continue;
            }
            for (label, values) in fixed_cases(&kernel.name, entry.blocksize()) {
                if runs(&label, &kernel.name, entry.blocksize(), !filter.is_empty()) {
                    work.push((entry, kernel, label, values));
                }
            }
        }
        let cases = work.len();
        let start = std::time::Instant::now();
        // One worker per core: the StableHLO runners are one per core.
        let next = std::sync::atomic::AtomicUsize::new(0);
        let failures = std::sync::Mutex::new(Vec::new());
        let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
        std::thread::scope(|scope| {
            for _ in 0..workers {
                scope.spawn(|| {
                    while let Some((entry, kernel, label, values)) =
                        work.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
                    {
                        let t = std::time::Instant::now();
                        let r =
                            check_values(entry.entry(), kernel, &devices, values, &mut |_, _| {});
                        if let Err(e) = r {
                            failures.lock().unwrap().push(format!("{label}: {e}"));
                        }
                        if !filter.is_empty() {
                            println!("{label}: {:.2} s", t.elapsed().as_secs_f64());
                        }
                    }
                });
            }
        });
        let failures = failures.into_inner().unwrap();
        println!(
            "{cases} cases of {} kernels on the Mosaic twin in {:.1} s",
            ok.len(),
            start.elapsed().as_secs_f64()
        );
        assert!(
            !filter.is_empty() || cases >= 10 * 11 + 5,
            "only {cases} cases"
        );
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }
}

/// Why the libtpu tests skip.
const NO_LIBTPU: &str =
    "no target/mosaic-venv/bin/python and no QFORGE_MOSAIC_PYTHON (run scripts/install-mosaic.sh)";

/// `qforge check`'s libtpu step on a module libtpu accepts and the same module with a window
/// misaligned with the tiling: the first compiles on both generations, the second is rejected
/// on both with libtpu's error code.
#[test]
fn check_names_what_libtpu_rejects() {
    let Some(python) = qforge::cli::check_libtpu::python() else {
        qforge_testkit::unavailable("libtpu", NO_LIBTPU);
        return;
    };
    let (ok, _) = lowered();
    let (entry, kernel) = ok
        .iter()
        .find(|(_, k)| k.name == "dequantize_blockwise_dynamic_bs64_f32")
        .expect("the 8-bit dequantization lowers");
    let values = vec![0.25f32; 3 * entry.blocksize() + 5];
    let good = mosaic::lower(kernel, &shapes_of(entry.entry(), kernel, &values)).unwrap();
    let mut bad = good.clone();
    bad.text = good.text.replacen(
        &format!("window_bounds = array<i64: {}, ", mosaic::STEP_ROWS),
        "window_bounds = array<i64: 8, ",
        1,
    );
    let modules = [("good".to_string(), good), ("bad".to_string(), bad)];
    let outcomes = qforge::cli::check_libtpu::compile(&python, &modules).unwrap();
    assert!(outcomes["good"].iter().all(|o| o.is_ok()), "{outcomes:?}");
    assert_eq!(outcomes["bad"].len(), 2, "{outcomes:?}");
    for o in &outcomes["bad"] {
        assert!(o.as_ref().is_err_and(|e| e.contains("E2002")), "{o:?}");
    }
}

/// The modules of the lowered kernels at representative blocksizes (all of them with
/// `QFORGE_MOSAIC_FILTER`), at a launch of three blocks and five more elements, the module of
/// [`every_op_kernel`] and one written as `qforge compile` writes it, compiled by libtpu for v5e
/// and v6e (one process each, side by side); and a module with a window misaligned with the TPU's tiling,
/// which libtpu must reject (E2002), so the check is shown to fail.
#[test]
fn every_lowered_kernel_compiles_with_libtpu() {
    let Some(python) = qforge::cli::check_libtpu::python() else {
        qforge_testkit::unavailable("libtpu", NO_LIBTPU);
        return;
    };
    let dir = std::env::temp_dir().join(format!("qforge-mosaic-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (mut ok, _) = lowered();
    // The negative module: an 8-bit dequantization's, its first window (`q`, 8-bit) cut to 8
    // rows, which 8-bit tiling (32 rows) rejects.
    let negative = ok
        .iter()
        .find(|(_, k)| k.name == "dequantize_blockwise_dynamic_bs64_f32")
        .map(|(e, k)| {
            let values = vec![0.25f32; 3 * e.blocksize() + 5];
            mosaic::lower(k, &shapes_of(e.entry(), k, &values)).unwrap()
        })
        .expect("the 8-bit dequantization lowers");
    // Representatives: of the blockwise families (a blocksize in the name), the blocksizes
    // whose windows differ in kind (32 and 64: narrower than a vreg's 128 lanes; 1024: one or
    // two lane blocks of 512; 4096: 4 or 8 of them) of every family and dtype; the others
    // differ from these only in the window width. Every element-wise kernel (the optimizers,
    // under a second each), except the activations: their modules of 1.5 to 5 MB (several
    // integer `fma`s per element) take 4 to 20 s each, so two of them, the largest family in
    // f32 and the smallest in bf16. All 362 compiled on v5e and v6e when LLM.int8's kernels
    // landed. `QFORGE_MOSAIC_FILTER=NAME` compiles every lowered kernel whose name contains
    // NAME (set and empty: all of them).
    let representative = |e: &kernels::KernelSpec, name: &str| {
        if name.contains("_bs") {
            [32, 64, 1024, 4096].contains(&e.blocksize())
        } else if name.starts_with("act_") {
            [
                "act_beta_gelu_tanh_backward_f32",
                "act_beta_silu_forward_bf16",
            ]
            .contains(&name)
        } else {
            true
        }
    };
    match std::env::var("QFORGE_MOSAIC_FILTER") {
        Ok(filter) => ok.retain(|(_, k)| k.name.contains(&filter)),
        Err(_) => ok.retain(|(e, k)| representative(e, &k.name)),
    }
    let write = |name: &str, text: &str, manifest: &mosaic::Manifest| {
        std::fs::write(dir.join(format!("{name}.mlir")), text).unwrap();
        let json = serde_json::to_string(manifest).unwrap();
        std::fs::write(dir.join(format!("{name}.json")), json).unwrap();
    };
    for (entry, kernel) in &ok {
        let m = lower_example(entry, kernel).unwrap();
        write(&kernel.name, &m.text, &m.manifest);
    }
    // Matmuls of whole tiles: 8 x 128 outputs (16 x 128 for 16-bit arrays), 256 elements of
    // the reduction per step, several steps of each; input gradients of 4-bit panels with a
    // scale per 64 columns (two a tile) and per 256 (a tile's in every other group).
    for (name, m, n, k) in [
        ("matmul_4bit_nf4_bs64_f32_bias_t1x4", 40, 300, 512),
        ("matmul_4bit_fp4_bs64_bf16_t4x1", 64, 384, 1024),
        ("matmul_4bit_dx_fp4_bs64_f32_c64_t1x4", 40, 300, 512),
        (
            "matmul_4bit_dx_nf4_bs256_f32_wbf16_c256_t1x4",
            16,
            512,
            1024,
        ),
    ] {
        let kernel = library_kernel(name);
        let mut args = matmul_args(&kernel, m, n, k);
        let args = OwnedArg::borrow_all(&mut args);
        let b = qforge::ir::bind(&kernel, &args).unwrap();
        let shapes = Shapes {
            grid: b.grid,
            elements: b.elements.clone(),
        };
        let module = mosaic::lower_with(&kernel, &shapes, &mosaic::scalar_values(&args)).unwrap();
        write(
            &format!("{name}_{m}x{n}x{k}"),
            &module.text,
            &module.manifest,
        );
    }
    let every_op = every_op_kernel();
    let shapes = Shapes {
        grid: 63,
        elements: vec![
            0, 0, 1000, 1000, 1000, 63, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 0, 5,
            1000,
        ],
    };
    let m = mosaic::lower(&every_op, &shapes).unwrap();
    write(&every_op.name, &m.text, &m.manifest);
    let soft = soft_math_kernel();
    let shapes = Shapes {
        grid: 63,
        elements: [vec![0, 0], vec![1000; 20]].concat(),
    };
    let m = mosaic::lower(&soft, &shapes).unwrap();
    write(&soft.name, &m.text, &m.manifest);
    for (chunk, grid) in [(16, 63), (512, 2)] {
        let branches = branches_kernel(chunk);
        let shapes = Shapes {
            grid,
            elements: vec![0, 0, 0, 2011, 1006, 1006, grid as usize],
        };
        let m = mosaic::lower(&branches, &shapes).unwrap();
        write(&branches.name, &m.text, &m.manifest);
    }
    let running = running_max_kernel();
    let shapes = Shapes {
        grid: 63,
        elements: vec![0, 0, 1000, 63, 1000, 63, 63],
    };
    let m = mosaic::lower(&running, &shapes).unwrap();
    write(&running.name, &m.text, &m.manifest);
    // Row loops of 37 lanes with the running maximum and of two lane blocks without; the
    // element-wise kernel's rows of two lane blocks.
    for (rows, cols) in [(35usize, 37usize), (3, 1024)] {
        let kernel = row_loop_kernel(cols <= 512);
        let mut elements = vec![0, 0, rows * cols, cols, rows * cols, rows * cols, rows];
        if cols <= 512 {
            elements.push(rows);
        }
        let shapes = Shapes {
            grid: rows as u32,
            elements,
        };
        let m = mosaic::lower(&kernel, &shapes).unwrap();
        write(&format!("{}_{cols}", kernel.name), &m.text, &m.manifest);
    }
    let elements = element_kernel();
    let shapes = Shapes {
        grid: 3 * 1024,
        elements: vec![0, 0, 0, 3 * 1024, 3, 1024, 1024, 3 * 1024, 3 * 1024],
    };
    let m = mosaic::lower(&elements, &shapes).unwrap();
    write(&elements.name, &m.text, &m.manifest);
    // One module as `qforge compile --target mosaic -o K.mlir` writes it: the script reads the
    // layout from the compile manifest `K.mlir.json`.
    let kernel = library_kernel("dequantize_blockwise_dynamic_bs64_f32");
    let artifact = qforge::codegen::compile(
        &kernel,
        &qforge::codegen::Target::Mosaic {
            dim: 100,
            scalars: Vec::new(),
        },
        &Default::default(),
    )
    .unwrap();
    std::fs::write(dir.join("compiled.mlir"), artifact.code.bytes()).unwrap();
    std::fs::write(dir.join("compiled.mlir.json"), artifact.manifest.to_json()).unwrap();
    let m = negative;
    let misaligned = m.text.replacen(
        &format!("window_bounds = array<i64: {}, ", mosaic::STEP_ROWS),
        "window_bounds = array<i64: 8, ",
        1,
    );
    assert_ne!(misaligned, m.text);
    write("zz_negative_misaligned_window", &misaligned, &m.manifest);
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/mosaic_check.py");
    // One process per generation, side by side (each compile runs on one core).
    let children: Vec<_> = ["v5e:1x1", "v6e:1x1"]
        .iter()
        .map(|gen| {
            std::process::Command::new(&python)
                .arg(&script)
                .arg(&dir)
                .arg(gen)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("runs the check")
        })
        .collect();
    let mut stdout = String::new();
    for child in children {
        let out = child.wait_with_output().expect("the check finishes");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout.push_str(&String::from_utf8_lossy(&out.stdout));
    }
    let _ = std::fs::remove_dir_all(&dir);
    let mut compiled: std::collections::BTreeMap<String, (usize, f64, f64)> = Default::default();
    let mut failures = Vec::new();
    let mut rejected = 0;
    for line in stdout.lines() {
        let r: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
        let (name, gen) = (
            r["kernel"].as_str().unwrap(),
            r["generation"].as_str().unwrap(),
        );
        let error = r["error"].as_str().unwrap_or("");
        if name.starts_with("zz_negative") {
            assert!(
                error.contains("E2002"),
                "{gen}: the misaligned window: {error:?}"
            );
            rejected += 1;
        } else if r["ok"] == true {
            let s = r["seconds"].as_f64().unwrap();
            let e = compiled.entry(gen.to_string()).or_default();
            *e = (e.0 + 1, e.1 + s, e.2.max(s));
        } else {
            failures.push(format!("{name} on {gen}: {error}"));
        }
    }
    for (gen, (n, total, max)) in &compiled {
        println!("libtpu {gen}: {n} kernels compiled, {total:.1} s in all, at most {max:.2} s");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(
        rejected, 2,
        "the negative module was not tried on both generations"
    );
    for gen in ["v5e:1x1", "v6e:1x1"] {
        assert_eq!(compiled.get(gen).map(|c| c.0), Some(ok.len() + 13), "{gen}");
    }
}
