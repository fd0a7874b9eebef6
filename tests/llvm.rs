//! The LLVM CPU backend: its text is deterministic and never asks LLVM for fast-math, and (with
//! the `llvm` feature) its vector paths give the interpreter's bits and the interpreter's
//! out-of-range report, whichever path (contiguous run, repeated run, uniform element, gather,
//! lane-by-lane store) a group takes. The conformance suite runs every library kernel on the
//! `cpu-llvm` device too.

use qforge::codegen::llvm::{lower, LlvmOptions};
use qforge::kernels;

/// Instruction flags that would let LLVM change a floating-point result.
const FAST_MATH: [&str; 9] = [
    " fast ",
    " nnan ",
    " ninf ",
    " nsz ",
    " arcp ",
    " contract ",
    " afn ",
    " reassoc ",
    "fmuladd",
];

#[test]
fn llvm_text_is_deterministic_and_exact_for_every_library_kernel() {
    let mut checked = 0;
    let mut fused = Vec::new();
    for entry in kernels::catalog() {
        let kernel = entry.build().expect("library kernels build");
        let combos = [
            (0, false, false, false),
            (8, false, false, false),
            (8, false, false, true),
            (16, false, false, false),
            (16, false, false, true),
            (16, true, false, true),
            (16, true, true, true),
        ];
        for (lanes, x86_avx512, x86_avx512_vbmi, x86_avx2) in combos {
            let options = LlvmOptions {
                bounds_checks: true,
                lanes,
                x86_avx512,
                x86_avx512_vbmi,
                x86_avx2,
            };
            let text = lower(&kernel, &options).expect("lowers");
            assert_eq!(text, lower(&kernel, &options).unwrap(), "{}", kernel.name);
            assert!(
                text.contains("define void @qforge_kernel("),
                "{}",
                kernel.name
            );
            for flag in FAST_MATH {
                assert!(
                    !text.contains(flag),
                    "{}: '{flag}' in the LLVM IR",
                    kernel.name
                );
            }
            if x86_avx512_vbmi {
                fused.extend(
                    text.contains("@llvm.x86.avx512.pmultishift.qb.512")
                        .then(|| kernel.name.clone()),
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 7 * 400, "only {checked} kernels lowered");
    // The fused 4-bit decode must reach the kernels it exists for.
    for name in [
        "matmul_4bit_fp4_nested_bs64_bf16_t4x1",
        "matmul_4bit_nf4_bs64_f32_t1x4",
    ] {
        assert!(fused.iter().any(|f| f == name), "no fused decode in {name}");
    }
}

/// `prepare` picks the search per target: levels with AVX-512 permutes, levels for a small
/// table with AVX2 vectors (`vpermd` level tables), the packed buckets otherwise, scalar code
/// included.
#[test]
fn llvm_prepare_picks_the_search_per_target() {
    use qforge::codegen::llvm::prepare;
    use qforge::ir::{Access, DType, Dim, KernelBuilder, ScalarType};
    let kernel = |len: usize| {
        let mut b = KernelBuilder::new("search");
        let n = b.scalar_param("n", ScalarType::U32);
        let x = b.buffer_param("x", DType::F32, &[Dim::Param(n)], Access::Read);
        let y = b.buffer_param("y", DType::U32, &[Dim::Param(n)], Access::Write);
        b.set_grid(Dim::Param(n));
        let data: Vec<f32> = (1..=len).map(|i| i as f32 / len as f32).collect();
        let t = b.table_f32("t", &data);
        let i = b.work_item();
        let v = b.load(x, i);
        let c = b.search_sorted(t, v);
        b.store(y, i, c);
        b.finish()
    };
    let options = |lanes, x86_avx512, x86_avx2| LlvmOptions {
        bounds_checks: true,
        lanes,
        x86_avx512,
        x86_avx512_vbmi: false,
        x86_avx2,
    };
    let cases = [
        (15, options(16, true, true), "t_level1"),
        (255, options(16, true, true), "t_level1"),
        (15, options(8, false, true), "t_level1"),
        (31, options(8, false, true), "t_level1"),
        (32, options(8, false, true), "t_packed"),
        (255, options(8, false, true), "t_packed"),
        (15, options(0, false, true), "t_packed"),
        (15, options(8, false, false), "t_packed"),
        (15, options(4, false, false), "t_packed"),
    ];
    for (len, o, want) in cases {
        let k = kernel(len);
        let p = prepare(&k, &o).unwrap();
        let names: Vec<&str> = p.tables.iter().map(|(_, t)| t.name.as_str()).collect();
        assert!(
            names.contains(&want),
            "{len} entries, {o:?}: tables {names:?}"
        );
    }
}

/// The column-lanes plan (`outer.rs`) is compiled for a product whose `B` is stored `[L, N]`
/// (its columns are consecutive), and not for a row-major `B`, whose "columns" are the row
/// starts `col_j * L`: consecutive only when `L = 1`, so the plan would never run.
#[test]
fn llvm_takes_column_lanes_only_for_columns() {
    use qforge::ir::DType;
    use qforge::kernels::matmul4::TileConfig;
    use qforge::kernels::{Gemm, Layout};
    let options = LlvmOptions {
        bounds_checks: true,
        lanes: 16,
        x86_avx512: true,
        x86_avx512_vbmi: true,
        x86_avx2: true,
    };
    // Rows of 16 columns, 2 of them or 6 (96 accumulators: six groups of 16, the AVX2 tile).
    for (b, tm, want) in [
        (Layout::Transposed, 2, true),
        (Layout::Panels, 2, true),
        (Layout::Panels, 6, true),
        (Layout::RowMajor, 2, false),
    ] {
        let spec = Gemm {
            a: Layout::RowMajor,
            b,
            dtype: DType::F32,
            bias: false,
            residual: false,
            partials: 1,
            tile: TileConfig { tm, tn: 16 },
        };
        let text = lower(&spec.build().unwrap(), &options).unwrap();
        assert_eq!(text.contains("outer_band"), want, "{}", spec.name());
    }
}

#[test]
fn llvm_rejects_unsupported_lane_counts() {
    let kernel = kernels::catalog()[0].build().unwrap();
    for lanes in [1, 2, 3, 12, 128] {
        let err = lower(
            &kernel,
            &LlvmOptions {
                bounds_checks: true,
                lanes,
                x86_avx512: false,
                x86_avx512_vbmi: false,
                x86_avx2: false,
            },
        )
        .unwrap_err();
        assert!(
            err.to_string().contains(&format!("{lanes} vector lanes")),
            "{err}"
        );
    }
}

#[cfg(feature = "llvm")]
mod device {
    use proptest::prelude::*;
    use qforge::ir::{
        count_mismatches, Access, BinaryOp, CmpOp, DType, Dim, Kernel, KernelBuilder, OwnedArg,
        ParamId, ReduceOrder, Rounding, Scalar, ScalarType, Value, VarId,
    };
    use qforge::runtime::{CpuDevice, CpuOptions, Device, InterpreterDevice};

    /// `y[i] = x[i + off] * w[(i + off) >> 1] + t[(i + off) >> 6]` for `i` in `0..n` (`for`
    /// loop, one work item): a stride-1 run, a repeated run, a uniform element, and a running
    /// NaN-skipping `max |x|` stored in `m[0]`.
    fn loop_kernel() -> Kernel {
        let mut b = KernelBuilder::new("llvm_loop_paths");
        let n = b.scalar_param("n", ScalarType::U32);
        let off = b.scalar_param("off", ScalarType::U32);
        let nx = b.scalar_param("nx", ScalarType::U32);
        let x = b.buffer_param("x", DType::F32, &[Dim::Param(nx)], Access::Read);
        let w = b.buffer_param("w", DType::BF16, &[Dim::Param(nx)], Access::Read);
        let t = b.buffer_param("t", DType::F32, &[Dim::Param(nx)], Access::Read);
        let y = b.buffer_param("y", DType::F16, &[Dim::Param(n)], Access::Write);
        let m = b.buffer_param("m", DType::F32, &[Dim::Const(1)], Access::Write);
        b.set_grid(Dim::Const(1));
        let acc = b.var("acc", ScalarType::F32);
        let zero = b.const_u32(0);
        let nv = b.param(n);
        b.for_range(zero, nv, 1, |b, i| {
            let o = b.param(off);
            let e = b.add(i, o);
            let xv = b.load(x, e);
            let one = b.const_u32(1);
            let half = b.shr(e, one);
            let wv = b.load(w, half);
            let six = b.const_u32(6);
            let blk = b.shr(e, six);
            let tv = b.load(t, blk);
            let p = b.mul(xv, wv);
            let s = b.add(p, tv);
            b.store_rounded(y, i, s, Rounding::NearestEven);
            let a = b.abs(xv);
            let cur = b.read_var(acc);
            let mx = b.max(cur, a);
            b.assign(acc, mx);
        });
        let z = b.const_u32(0);
        let total = b.read_var(acc);
        b.store(m, z, total);
        b.finish()
    }

    /// `s = sum over i < n of x[i + off] * code[(p[(i + off) >> 1] >> 4) & 15]` in `Strided(8)`
    /// order (`accumulate`), per work item `g`, with `off = g * stride + off0`.
    fn accumulate_kernel() -> Kernel {
        let mut b = KernelBuilder::new("llvm_accumulate_paths");
        let n = b.scalar_param("n", ScalarType::U32);
        let off0 = b.scalar_param("off", ScalarType::U32);
        let stride = b.scalar_param("stride", ScalarType::U32);
        let items = b.scalar_param("items", ScalarType::U32);
        let nx = b.scalar_param("nx", ScalarType::U32);
        let x = b.buffer_param("x", DType::F32, &[Dim::Param(nx)], Access::Read);
        let p = b.buffer_param("p", DType::U8, &[Dim::Param(nx)], Access::Read);
        let s = b.buffer_param("s", DType::F32, &[Dim::Param(items)], Access::Write);
        b.set_grid(Dim::Param(items));
        let code: Vec<f32> = (0..16).map(|c| (c as f32 - 7.5) / 7.0).collect();
        let table = b.table_f32("code", &code);
        let acc = b.var("acc", ScalarType::F32);
        let g = b.work_item();
        let st = b.param(stride);
        let o0 = b.param(off0);
        let gs = b.mul(g, st);
        let off = b.add(gs, o0);
        let nv = b.param(n);
        b.accumulate(nv, ReduceOrder::Strided(8), &[acc], |b, i| {
            let e = b.add(i, off);
            let xv = b.load(x, e);
            let one = b.const_u32(1);
            let half = b.shr(e, one);
            let byte = b.load(p, half);
            let four = b.const_u32(4);
            let hi = b.shr(byte, four);
            let fifteen = b.const_u32(15);
            let nib = b.and(hi, fifteen);
            let c = b.lookup(table, nib);
            vec![(xv, c)]
        });
        let total = b.read_var(acc);
        b.store(s, g, total);
        b.finish()
    }

    /// `s = sum over i < n of x[e] * w(e)` in `Strided(8)` order, `e = i + off` with `off = g *
    /// stride + off0` per work item `g`: `w(e)` decodes a packed 4-bit code like a bf16 NF4
    /// weight, `c = code[nibble(e)] * t[e >> 6]` rounded to bf16 with integer ops (with a NaN
    /// select), then a compare against the block's `t`, an `i32` round trip and a second lookup
    /// of another index (`p[e >> 1] & 7` in a `u32` table). On AVX-512 the chain up to the
    /// second lookup is deferred (`deferred.rs`) and the groups are 64 wide, or 16 wide when a
    /// row is not aligned to 64.
    fn deferred_kernel() -> Kernel {
        let mut b = KernelBuilder::new("llvm_deferred_lookups");
        let n = b.scalar_param("n", ScalarType::U32);
        let off0 = b.scalar_param("off", ScalarType::U32);
        let stride = b.scalar_param("stride", ScalarType::U32);
        let items = b.scalar_param("items", ScalarType::U32);
        let nx = b.scalar_param("nx", ScalarType::U32);
        let nt = b.scalar_param("nt", ScalarType::U32);
        let x = b.buffer_param("x", DType::F32, &[Dim::Param(nx)], Access::Read);
        let p = b.buffer_param("p", DType::U8, &[Dim::Param(nx)], Access::Read);
        let t = b.buffer_param("t", DType::F32, &[Dim::Param(nt)], Access::Read);
        let s = b.buffer_param("s", DType::F32, &[Dim::Param(items)], Access::Write);
        b.set_grid(Dim::Param(items));
        let code: Vec<f32> = (0..16).map(|c| (c as f32 - 7.5) / 7.0).collect();
        let table = b.table_f32("code", &code);
        let small = b.table_u32("small", &[3, 0x8000_0001, 7, 0xffff_fff0, 12]);
        let acc = b.var("acc", ScalarType::F32);
        let g = b.work_item();
        let st = b.param(stride);
        let o0 = b.param(off0);
        let gs = b.mul(g, st);
        let off = b.add(gs, o0);
        let nv = b.param(n);
        b.accumulate(nv, ReduceOrder::Strided(8), &[acc], |b, i| {
            let e = b.add(i, off);
            let xv = b.load(x, e);
            let one = b.const_u32(1);
            let half = b.shr(e, one);
            let byte = b.load(p, half);
            let odd = b.and(e, one);
            let even = b.binary(BinaryOp::Xor, odd, one);
            let two = b.const_u32(2);
            let sh = b.shl(even, two);
            let shifted = b.shr(byte, sh);
            let fifteen = b.const_u32(15);
            let nib = b.and(shifted, fifteen);
            let c = b.lookup(table, nib);
            let six = b.const_u32(6);
            let blk = b.shr(e, six);
            let a = b.load(t, blk);
            let w = b.mul(c, a);
            // bf16 rounding, as `kernels::round` writes it.
            let bits = b.bitcast(w, ScalarType::U32);
            let sixteen = b.const_u32(16);
            let hi = b.shr(bits, sixteen);
            let lsb = b.and(hi, one);
            let half_ulp = b.const_u32(0x7FFF);
            let biased = b.add(bits, half_ulp);
            let biased = b.add(biased, lsb);
            let mask = b.const_u32(0xFFFF_0000);
            let rounded = b.and(biased, mask);
            let r = b.bitcast(rounded, ScalarType::F32);
            let nan = b.cmp(CmpOp::Ne, w, w);
            let w = b.select(nan, w, r);
            let below = b.cmp(CmpOp::Lt, w, a);
            let neg = b.neg(w);
            let w = b.select(below, neg, w);
            let eight = b.const_f32(8.0);
            let scaled = b.mul(w, eight);
            let q = b.float_to_int(scaled, ScalarType::I32, Rounding::NearestEven);
            let back = b.int_to_float(q);
            let w = b.add(w, back);
            let seven = b.const_u32(7);
            let low = b.and(byte, seven);
            let d = b.lookup(small, low);
            let d = b.int_to_float(d);
            let w = b.add(w, d);
            vec![(xv, w)]
        });
        let total = b.read_var(acc);
        b.store(s, g, total);
        b.finish()
    }

    /// Four accumulators over `i < n` with columns `c_j = 4g + j` (work item `g`): accumulator
    /// `j` sums `x[i*s + c_j] * x[i*s + c']` in `Strided(8)` order, where `c'` is `c_j` itself
    /// (`shared = 0`: the accumulators differ only in their column, so `outer.rs` runs them as
    /// lanes), or `c_0` in every accumulator, written once per accumulator (`shared = 1`) or
    /// once for all (`shared = 2`): there lane `j` must still read `c_0`, so the lanes plan
    /// must not apply. `shared = 3` is case 0 plus a load past the end that nothing uses (it
    /// must still report), `shared = 4` case 0 with accumulator 1's column the loop index.
    /// `shared = 5` adds a second group of four, `x[i*s + d_j] * x[i*s + 1 + d_j]` with
    /// `d_j = 4g + j` computed again (another value, equal at run time): each group could run
    /// as lanes on its own, but one evaluation substituting `c_0` would leave `d_0` in every
    /// lane of the second, so the plan must refuse groups whose first columns differ.
    /// `shared = 6` multiplies by `x[(i*s + c_j) >> 2]`, one element for the 4 lanes when
    /// `i*s + c_0` is a multiple of 4: for odd `s` only every fourth element, so a band's proof
    /// (`band_proof.rs`) holds only when `s` is even.
    fn columns_kernel(shared: u32) -> Kernel {
        let mut b = KernelBuilder::new("llvm_columns_as_lanes");
        let n = b.scalar_param("n", ScalarType::U32);
        let s = b.scalar_param("s", ScalarType::U32);
        let items = b.scalar_param("items", ScalarType::U32);
        let nx = b.scalar_param("nx", ScalarType::U32);
        let x = b.buffer_param("x", DType::F32, &[Dim::Param(nx)], Access::Read);
        let out = b.buffer_param("out", DType::F32, &[Dim::Param(items)], Access::Write);
        b.set_grid(Dim::Param(items));
        let g = b.work_item();
        let four = b.const_u32(4);
        let g4 = b.mul(g, four);
        // Group 1's base: the same number as `4g`, another value.
        let g4_again = b.mul(four, g);
        let accs = if shared == 5 { 8 } else { 4 };
        let cols: Vec<_> = (0..accs)
            .map(|j| {
                let jv = b.const_u32(j % 4);
                b.add(if j < 4 { g4 } else { g4_again }, jv)
            })
            .collect();
        let vars: Vec<_> = (0..accs)
            .map(|j| b.var(&format!("acc{j}"), ScalarType::F32))
            .collect();
        let nv = b.param(n);
        b.accumulate(nv, ReduceOrder::Strided(8), &vars, |b, i| {
            let sv = b.param(s);
            let row = b.mul(i, sv);
            let once = (shared == 2).then(|| {
                let at = b.add(row, cols[0]);
                b.load(x, at)
            });
            if shared == 3 {
                let past = b.param(nx);
                let past = b.add(past, i);
                let _unused = b.load(x, past);
            }
            let one = b.const_u32(1);
            let next_row = b.add(row, one);
            cols.iter()
                .enumerate()
                .map(|(j, c)| {
                    let c = if shared == 4 && j == 1 { i } else { *c };
                    let at = b.add(row, c);
                    let xv = b.load(x, at);
                    let other = match shared {
                        1 => {
                            let at0 = b.add(row, cols[0]);
                            b.load(x, at0)
                        }
                        2 => once.unwrap_or(xv),
                        5 if j >= 4 => {
                            let at1 = b.add(next_row, c);
                            b.load(x, at1)
                        }
                        6 => {
                            let two = b.const_u32(2);
                            let quad = b.shr(at, two);
                            b.load(x, quad)
                        }
                        _ => xv,
                    };
                    (xv, other)
                })
                .collect()
        });
        // out[g] = ((acc0 + acc1) + acc2) + ...: every accumulator reaches the output.
        let mut total = b.read_var(vars[0]);
        for v in &vars[1..] {
            let t = b.read_var(*v);
            total = b.add(total, t);
        }
        b.store(out, g, total);
        b.finish()
    }

    /// The accumulate of [`uniform_rows_kernel`] and [`tile_stores_kernel`] for work item `g`:
    /// `rows` rows `r` of 4 columns `c_j = 4g + j`, accumulator `4r + j` the sum over `i < n`
    /// (`Strided(8)`) of `x[i*s + c_j] * y[off_r + i * ystep]` (`off_r = g*ystride + r`; `ystep`
    /// a parameter, or 1 left out). Accumulator `4r + j`'s variable is its own (`share = 0`),
    /// row `r`'s first (1: the row's 4 accumulators share it, the last one's sum wins) or
    /// column `j`'s (2: shared by the rows, the last row's sum wins). Returns the columns and
    /// the accumulators' variables.
    fn row_tile_sums(
        b: &mut KernelBuilder,
        (x, y): (ParamId, ParamId),
        rows: u32,
        (n, s, ystride): (ParamId, ParamId, ParamId),
        (ystep, share): (Option<ParamId>, u32),
    ) -> (Vec<Value>, Vec<VarId>) {
        let g = b.work_item();
        let four = b.const_u32(4);
        let g4 = b.mul(g, four);
        let cols: Vec<_> = (0..4)
            .map(|j| {
                let jv = b.const_u32(j);
                b.add(g4, jv)
            })
            .collect();
        let ys = b.param(ystride);
        let gy = b.mul(g, ys);
        let offs: Vec<_> = (0..rows)
            .map(|r| {
                let rv = b.const_u32(r);
                b.add(gy, rv)
            })
            .collect();
        let own: Vec<_> = (0..4 * rows)
            .map(|j| b.var(&format!("acc{j}"), ScalarType::F32))
            .collect();
        let vars: Vec<_> = (0..4 * rows as usize)
            .map(|j| match share {
                1 => own[j & !3],
                2 => own[j & 3],
                _ => own[j],
            })
            .collect();
        let nv = b.param(n);
        // Defined before the loop, as a stride must be for the proof.
        let step = ystep.map(|p| b.param(p));
        b.accumulate(nv, ReduceOrder::Strided(8), &vars, |b, i| {
            let sv = b.param(s);
            let row = b.mul(i, sv);
            let yi = match step {
                Some(t) => b.mul(i, t),
                None => i,
            };
            let yv: Vec<_> = offs
                .iter()
                .map(|o| {
                    let at = b.add(*o, yi);
                    b.load(y, at)
                })
                .collect();
            yv.iter()
                .flat_map(|yr| {
                    cols.iter()
                        .map(|c| {
                            let at = b.add(row, *c);
                            (b.load(x, at), *yr)
                        })
                        .collect::<Vec<_>>()
                })
                .collect()
        });
        (cols, vars)
    }

    /// `out[g*4*rows + 4*r + j] = sum over i < n (Strided(8)) of x[i*s + 4g + j] * y[off_r + i]`
    /// for `rows` row groups `r` of 4 columns `j` (`outer.rs`: the accumulators as lanes, one
    /// vector per row; the row's `y` load is uniform at `off_r + i` with `off_r = g*ystride +
    /// r`, proven in range once before the loop when `y` is long enough, else each element
    /// checked: a short `y` makes some work items fail).
    fn uniform_rows_kernel(rows: u32) -> Kernel {
        let mut b = KernelBuilder::new("llvm_uniform_rows");
        let n = b.scalar_param("n", ScalarType::U32);
        let s = b.scalar_param("s", ScalarType::U32);
        let ystride = b.scalar_param("ystride", ScalarType::U32);
        let items = b.scalar_param("items", ScalarType::U32);
        let nx = b.scalar_param("nx", ScalarType::U32);
        let ny = b.scalar_param("ny", ScalarType::U32);
        let x = b.buffer_param("x", DType::F32, &[Dim::Param(nx)], Access::Read);
        let y = b.buffer_param("y", DType::BF16, &[Dim::Param(ny)], Access::Read);
        let out = b.buffer_param("out", DType::F32, &[Dim::Param(items)], Access::Write);
        b.set_grid(Dim::Param(items));
        let g = b.work_item();
        let (_, vars) = row_tile_sums(&mut b, (x, y), rows, (n, s, ystride), (None, 0));
        // out[g] = the sum of every accumulator, in order.
        let mut total = b.read_var(vars[0]);
        for v in &vars[1..] {
            let t = b.read_var(*v);
            total = b.add(total, t);
        }
        b.store(out, g, total);
        b.finish()
    }

    /// Runs [`tile_stores_kernel`] (see `tile_stores_match_the_interpreter`) on every device.
    #[allow(clippy::too_many_arguments)]
    fn tile_stores_case(
        n: u32,
        s: u32,
        ystride: u32,
        ystep: u32,
        items: u32,
        rows: u32,
        cut: u32,
        short: u32,
        seed: u32,
    ) {
        let ocols = 4 * items;
        let lim = ocols.saturating_sub(cut);
        let nx = (n * s + 4 * items + 1).max(1);
        // The last row's last element is at (items-1)*ystride + rows-1 + (n-1)*ystep.
        let ny = ((items - 1) * ystride + rows + n.saturating_sub(1) * ystep)
            .saturating_sub(short % 3)
            .max(1);
        let nb = ocols.saturating_sub(short / 3 % 2).max(1);
        let no = (rows * ocols).saturating_sub(short / 2 % 2 * 3).max(1);
        let xs: Vec<f32> = (0..nx).map(|i| ((i ^ seed) as f32 * 0.37).sin()).collect();
        let ys: Vec<f32> = (0..ny)
            .map(|i| ((i.wrapping_mul(seed | 1)) as f32 * 0.11).cos())
            .collect();
        let bs: Vec<f32> = (0..nb).map(|i| i as f32 * 0.25 - 1.0).collect();
        for share in 0..3 {
            same_everywhere(
                &tile_stores_kernel(rows, share),
                &[n, s, ystride, ystep, items, lim, ocols, nx, ny, nb, no],
                &[bytes_f32(&xs), bytes_f32(&ys), bytes_f32(&bs)],
                &[2 * no as usize],
            );
        }
    }

    /// The epilogue's paths by name: every store a vector (rows of 4 full columns), one column
    /// cut, `out` 3 short, `bias` 1 short, and a strided `y` column 1 short (its proof before
    /// the loop must fail and the last element report; with 16 elements that element is in
    /// the loop's last full round, with 10 in the tail that is always checked).
    #[test]
    fn tile_stores_cases_match_the_interpreter() {
        for n in [16, 10] {
            for rows in [1, 2, 3, 4] {
                for (cut, short) in [(0, 0), (1, 0), (0, 2), (0, 3), (0, 1)] {
                    tile_stores_case(n, 4, 7, 3, 3, rows, cut, short, 5);
                }
            }
        }
    }

    /// A tile's epilogue after accumulators run as lanes (`outer_store.rs`): `rows` rows `r` of
    /// 4 columns `c_j = 4g + j`, accumulator `(r, j)` the sum over `i < n` (`Strided(8)`) of
    /// `x[i*s + c_j] * y[off_r + i * ystep]` (`off_r = g*ystride + r`: with `ystep > 1` a
    /// strided column, proven in range before the loop when `y` is long enough), stored as
    /// `store_sums` does: `if c_j < lim { out[r * ocols + c_j] = acc + bias[c_j] }`, `out`
    /// and `bias` possibly short (their failing work items must report as on the interpreter).
    /// With `share` 1 or 2 accumulators share variables ([`row_tile_sums`]): each pair then
    /// reads the last sharing accumulator's sum, not its lane's.
    fn tile_stores_kernel(rows: u32, share: u32) -> Kernel {
        let mut b = KernelBuilder::new("llvm_tile_stores");
        let n = b.scalar_param("n", ScalarType::U32);
        let s = b.scalar_param("s", ScalarType::U32);
        let ystride = b.scalar_param("ystride", ScalarType::U32);
        let ystep = b.scalar_param("ystep", ScalarType::U32);
        let items = b.scalar_param("items", ScalarType::U32);
        let lim = b.scalar_param("lim", ScalarType::U32);
        let ocols = b.scalar_param("ocols", ScalarType::U32);
        let nx = b.scalar_param("nx", ScalarType::U32);
        let ny = b.scalar_param("ny", ScalarType::U32);
        let nb = b.scalar_param("nb", ScalarType::U32);
        let no = b.scalar_param("no", ScalarType::U32);
        let x = b.buffer_param("x", DType::F32, &[Dim::Param(nx)], Access::Read);
        let y = b.buffer_param("y", DType::F32, &[Dim::Param(ny)], Access::Read);
        let bias = b.buffer_param("bias", DType::F32, &[Dim::Param(nb)], Access::Read);
        let out = b.buffer_param("out", DType::BF16, &[Dim::Param(no)], Access::Write);
        b.set_grid(Dim::Param(items));
        let (cols, vars) =
            row_tile_sums(&mut b, (x, y), rows, (n, s, ystride), (Some(ystep), share));
        // As `store_sums`: each cell's condition is one `let` (the row's and the column's
        // tests, computed before) right before its `if`.
        let (limv, oc) = (b.param(lim), b.param(ocols));
        let row_inside = b.const_bool(true);
        let insides: Vec<_> = cols.iter().map(|c| b.cmp(CmpOp::Lt, *c, limv)).collect();
        for r in 0..rows {
            for (j, c) in cols.iter().enumerate() {
                let cond = b.and(row_inside, insides[j]);
                let var = vars[(4 * r) as usize + j];
                b.if_then(cond, |b| {
                    let acc = b.read_var(var);
                    let bv = b.load(bias, *c);
                    let sum = b.add(acc, bv);
                    let rv = b.const_u32(r);
                    let base = b.mul(rv, oc);
                    let at = b.add(base, *c);
                    b.store_rounded(out, at, sum, Rounding::NearestEven);
                });
            }
        }
        b.finish()
    }

    /// `y[i] = op(p, t[x[i]])` (`for` loop) for `op` = `i32` div (0), `i32` rem (1), `u32` div
    /// (2), `u32` rem (3) of the uniform `p` by a deferred lookup in a table holding 0, -1 and
    /// `i32::MIN`, then the looked-up value divided by `p` (4); `z[i]` = the bits of a
    /// signaling-NaN constant plus `x[i]`, which must keep the constant's bits.
    fn division_kernel(op: u32) -> Kernel {
        let mut b = KernelBuilder::new("llvm_deferred_division");
        let n = b.scalar_param("n", ScalarType::U32);
        let p = b.scalar_param("p", ScalarType::U32);
        let x = b.buffer_param("x", DType::U32, &[Dim::Param(n)], Access::Read);
        let y = b.buffer_param("y", DType::U32, &[Dim::Param(n)], Access::Write);
        let z = b.buffer_param("z", DType::U32, &[Dim::Param(n)], Access::Write);
        b.set_grid(Dim::Const(1));
        let t = b.table(
            "t",
            ScalarType::I32,
            vec![2, 0, u32::MAX, 0x8000_0000, 7, 0xffff_fff9],
        );
        let (zero, nv) = (b.const_u32(0), b.param(n));
        b.for_range(zero, nv, 1, |b, i| {
            let k = b.load(x, i);
            let d = b.lookup(t, k);
            let pv = b.param(p);
            let pi = b.bitcast(pv, ScalarType::I32);
            let du = b.bitcast(d, ScalarType::U32);
            let q = match op {
                0 => b.div(pi, d),
                1 => b.rem(pi, d),
                2 => b.div(pv, du),
                3 => b.rem(pv, du),
                _ => b.div(d, pi),
            };
            let q = b.bitcast(q, ScalarType::U32);
            b.store(y, i, q);
            let snan = b.const_f32(f32::from_bits(0x7f80_0001 + op));
            let bits = b.bitcast(snan, ScalarType::U32);
            let mixed = b.add(bits, k);
            b.store(z, i, mixed);
        });
        b.finish()
    }

    /// `y[i] = mul_hi(x[i], w[i])` as `i32` and `z[i]` as `u32` in a `for` loop (vector lanes:
    /// even and odd 32-bit lanes multiplied as 64-bit pairs), plus the high word by the
    /// constant Philox multiplier (`u32`, vector times uniform).
    fn mul_hi_kernel() -> Kernel {
        let mut b = KernelBuilder::new("llvm_mul_hi");
        let n = b.scalar_param("n", ScalarType::U32);
        let x = b.buffer_param("x", DType::U32, &[Dim::Param(n)], Access::Read);
        let w = b.buffer_param("w", DType::U32, &[Dim::Param(n)], Access::Read);
        let out = |b: &mut KernelBuilder, name: &str| {
            b.buffer_param(name, DType::U32, &[Dim::Param(n)], Access::Write)
        };
        let (y, z, c) = (out(&mut b, "y"), out(&mut b, "z"), out(&mut b, "c"));
        b.set_grid(Dim::Const(1));
        let (zero, nv) = (b.const_u32(0), b.param(n));
        b.for_range(zero, nv, 1, |b, i| {
            let (xv, wv) = (b.load(x, i), b.load(w, i));
            let (xi, wi) = (
                b.bitcast(xv, ScalarType::I32),
                b.bitcast(wv, ScalarType::I32),
            );
            let hi = b.mul_hi(xi, wi);
            let hi = b.bitcast(hi, ScalarType::U32);
            b.store(y, i, hi);
            let hu = b.mul_hi(xv, wv);
            b.store(z, i, hu);
            let m = b.const_u32(0xD251_1F53);
            let hc = b.mul_hi(m, xv);
            b.store(c, i, hc);
        });
        b.finish()
    }

    /// 16 accumulators run as lanes with columns `c_j = c_0 + j`, `c_0` bounded by its ops:
    /// `min(p, 31)` (`shape = 0`) or `p & 15` (`shape = 1`). `lookup = true`: accumulator `j`
    /// sums `t[c_j] * x[i*64 + c_j]` over a 32-entry table `t[i] = i` (the lanes hold up to
    /// `c_0 + 15`, so the lookup must keep its clamp). `lookup = false`: a packed 4-bit decode
    /// `code[(p8[c_j >> 1] >> (c_j & 3)) & 15] * x[i]` where `c_0` is the constant 0 and the other
    /// columns `q + j` (`shape` unused): the shifts are not constants across the lanes.
    fn seeded_columns_kernel(lookup: bool, shape: u32) -> Kernel {
        let mut b = KernelBuilder::new("llvm_seeded_columns");
        let n = b.scalar_param("n", ScalarType::U32);
        let p = b.scalar_param("p", ScalarType::U32);
        let x = b.buffer_param("x", DType::F32, &[Dim::Const(512)], Access::Read);
        let p8 = b.buffer_param("p8", DType::U8, &[Dim::Const(64)], Access::Read);
        let out = b.buffer_param("out", DType::F32, &[Dim::Const(16)], Access::Write);
        b.set_grid(Dim::Const(1));
        let ramp: Vec<f32> = (0..32).map(|i| i as f32).collect();
        let t = b.table_f32("t", &ramp);
        let code = b.table_f32("code", &ramp[..16]);
        let pv = b.param(p);
        let col0 = match (lookup, shape) {
            (true, 0) => {
                let last = b.const_u32(31);
                b.min(pv, last)
            }
            (true, _) => {
                let fifteen = b.const_u32(15);
                b.and(pv, fifteen)
            }
            (false, _) => b.const_u32(0),
        };
        let base = if lookup { col0 } else { pv };
        let cols: Vec<_> = (0..16u32)
            .map(|j| {
                if j == 0 {
                    col0
                } else {
                    let c = b.const_u32(j);
                    b.add(base, c)
                }
            })
            .collect();
        let vars: Vec<_> = (0..16)
            .map(|j| b.var(&format!("a{j}"), ScalarType::F32))
            .collect();
        let nv = b.param(n);
        b.accumulate(nv, ReduceOrder::Sequential, &vars, |b, i| {
            let s = b.const_u32(64);
            let row = b.mul(i, s);
            // Loaded only where used: an unused load refuses the lanes plan.
            let xi = (!lookup).then(|| b.load(x, i));
            cols.iter()
                .map(|c| {
                    if lookup {
                        let lk = b.lookup(t, *c);
                        let at = b.add(row, *c);
                        (lk, b.load(x, at))
                    } else {
                        let one = b.const_u32(1);
                        let at = b.shr(*c, one);
                        let byte = b.load(p8, at);
                        let three = b.const_u32(3);
                        let sh = b.and(*c, three);
                        let shifted = b.shr(byte, sh);
                        let f15 = b.const_u32(15);
                        let nib = b.and(shifted, f15);
                        (b.lookup(code, nib), xi.expect("loaded for the decode"))
                    }
                })
                .collect()
        });
        for (j, v) in vars.iter().enumerate() {
            let val = b.read_var(*v);
            let at = b.const_u32(j as u32);
            b.store(out, at, val);
        }
        b.finish()
    }

    fn bytes_f32(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    /// Whether the host has AVX-512F (x86-64 only).
    fn host_avx512() -> bool {
        #[cfg(target_arch = "x86_64")]
        return std::is_x86_feature_detected!("avx512f");
        #[cfg(not(target_arch = "x86_64"))]
        false
    }

    /// Runs `kernel` on the interpreter, the LLVM device with vectors and without (and, on an
    /// AVX-512 host, without AVX-512), and the Cranelift device: the same
    /// outputs under the numeric contract (bit for bit, except that any two NaNs are equal, as
    /// `count_mismatches` and the conformance suite compare), or the same out-of-range work item.
    fn same_everywhere(kernel: &Kernel, scalars: &[u32], inputs: &[Vec<u8>], outputs: &[usize]) {
        let vector = CpuDevice::llvm(CpuOptions::default()).unwrap();
        let scalar = CpuDevice::llvm(CpuOptions {
            simd: false,
            ..CpuOptions::default()
        })
        .unwrap();
        let cranelift = CpuDevice::new().unwrap();
        let mut devices: Vec<(&dyn Device, &str)> = vec![
            (&InterpreterDevice, "interpreter"),
            (&vector, "cpu-llvm"),
            (&scalar, "cpu-llvm (scalar)"),
            (&cranelift, "cpu (Cranelift)"),
        ];
        // On an AVX-512 host, the AVX2 code too (an AVX2 host runs it as `vector`).
        let avx2 = host_avx512().then(|| {
            CpuDevice::llvm(CpuOptions {
                avx512: false,
                ..CpuOptions::default()
            })
            .unwrap()
        });
        if let Some(d) = &avx2 {
            devices.push((d, "cpu-llvm (AVX2)"));
        }
        let mut results = Vec::new();
        for (dev, _) in &devices {
            let mut args: Vec<OwnedArg> = scalars
                .iter()
                .map(|&s| OwnedArg::Scalar(Scalar::U32(s)))
                .chain(inputs.iter().map(|b| OwnedArg::Read(b.clone())))
                .chain(outputs.iter().map(|&n| OwnedArg::Write(vec![0u8; n])))
                .collect();
            let r = match dev.launch(kernel, &mut OwnedArg::borrow_all(&mut args)) {
                Ok(()) => Ok(args),
                Err(qforge::runtime::Error::Ir(qforge::ir::Error::Execution {
                    work_item, ..
                })) => Err(work_item),
                Err(e) => panic!("{}: {e}", dev.name()),
            };
            results.push(r);
        }
        for (r, (_, name)) in results[1..].iter().zip(&devices[1..]) {
            match (&results[0], r) {
                (Ok(want), Ok(got)) => {
                    let (bad, total) = count_mismatches(kernel, want, got);
                    assert_eq!(bad, 0, "{name}: {bad} of {total} outputs differ: {got:?} where the interpreter gave {want:?}");
                }
                (Err(w), Err(g)) => assert_eq!(w, g, "{name}: another failing work item"),
                (want, got) => panic!("{name}: {got:?} where the interpreter gave {want:?}"),
            }
        }
    }

    /// Runs `loop_kernel` (n = 40) on `dev`: its two outputs.
    fn run_loop_kernel(dev: &dyn Device) -> Vec<OwnedArg> {
        let xs: Vec<f32> = (0..40).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let ws: Vec<u8> = (0..40u16)
            .flat_map(|i| (0x3f80 + i * 3).to_le_bytes())
            .collect();
        let ts: Vec<f32> = (0..40).map(|i| i as f32 * 0.25 - 3.0).collect();
        let mut args = vec![
            OwnedArg::Scalar(Scalar::U32(40)),
            OwnedArg::Scalar(Scalar::U32(0)),
            OwnedArg::Scalar(Scalar::U32(40)),
            OwnedArg::Read(bytes_f32(&xs)),
            OwnedArg::Read(ws),
            OwnedArg::Read(bytes_f32(&ts)),
            OwnedArg::Write(vec![0; 80]),
            OwnedArg::Write(vec![0; 4]),
        ];
        dev.launch(&loop_kernel(), &mut OwnedArg::borrow_all(&mut args))
            .unwrap();
        args
    }

    /// Runs `accumulate_kernel` (n = 8, one work item) on `dev`.
    fn run_accumulate_kernel(dev: &dyn Device) {
        let mut args = vec![
            OwnedArg::Scalar(Scalar::U32(8)),
            OwnedArg::Scalar(Scalar::U32(0)),
            OwnedArg::Scalar(Scalar::U32(8)),
            OwnedArg::Scalar(Scalar::U32(1)),
            OwnedArg::Scalar(Scalar::U32(8)),
            OwnedArg::Read(bytes_f32(&[1.5; 8])),
            OwnedArg::Read(vec![0x37; 8]),
            OwnedArg::Write(vec![0; 4]),
        ];
        dev.launch(&accumulate_kernel(), &mut OwnedArg::borrow_all(&mut args))
            .unwrap();
    }

    /// The one entry file of a cache folder.
    fn only_entry(dir: &std::path::Path) -> std::path::PathBuf {
        let entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(entries.len(), 1, "{entries:?}");
        entries[0].clone()
    }

    /// The disk cache of objects: a second device loads the object the first one wrote (the
    /// same file, not rewritten, its time refreshed), and an entry that does not load (another
    /// kernel's intact object) or is damaged is compiled again and replaced; the interpreter's
    /// bits every time.
    #[test]
    fn object_cache_is_reused_and_repaired() {
        use std::os::unix::fs::MetadataExt;
        use std::time::{Duration, SystemTime};
        let want = run_loop_kernel(&InterpreterDevice);
        let check = |got: &[OwnedArg], what: &str| {
            let (bad, total) = count_mismatches(&loop_kernel(), &want, got);
            assert_eq!(bad, 0, "{what}: {bad} of {total} outputs differ");
        };
        let dir = tempfile::tempdir().unwrap();
        let with_cache = |dir: &std::path::Path| {
            CpuDevice::llvm_with_object_cache(CpuOptions::default(), Some(dir)).unwrap()
        };
        check(&run_loop_kernel(&with_cache(dir.path())), "first compile");
        let entry = only_entry(dir.path());
        let written = std::fs::read(&entry).unwrap();
        let old = SystemTime::now() - Duration::from_secs(3600);
        std::fs::File::options()
            .append(true)
            .open(&entry)
            .unwrap()
            .set_modified(old)
            .unwrap();
        let inode = std::fs::metadata(&entry).unwrap().ino();
        check(
            &run_loop_kernel(&with_cache(dir.path())),
            "loaded from the cache",
        );
        let meta = std::fs::metadata(&entry).unwrap();
        assert_eq!(meta.ino(), inode, "a hit must not rewrite the entry");
        assert!(
            meta.modified().unwrap() > old,
            "a hit refreshes the entry's time"
        );

        // Another kernel's entry copied under this key's name: its checksum (which covers the
        // key) does not match, so it is a miss.
        let other = tempfile::tempdir().unwrap();
        run_accumulate_kernel(&with_cache(other.path()));
        let foreign = std::fs::read(only_entry(other.path())).unwrap();
        std::fs::write(&entry, &foreign).unwrap();
        check(
            &run_loop_kernel(&with_cache(dir.path())),
            "after a copied entry",
        );
        assert_eq!(
            std::fs::read(&entry).unwrap(),
            written,
            "the entry is replaced"
        );
        // The same object with a checksum made for this key (the entry format: magic,
        // SHA-256 of key and object, object): it is intact, loads, and lacks this kernel's
        // symbol, so it is compiled again and replaced.
        use sha2::{Digest, Sha256};
        let key = entry.file_stem().unwrap().to_str().unwrap();
        let object = &foreign[48..];
        let mut forged = foreign[..16].to_vec();
        forged.extend(
            Sha256::new()
                .chain_update(key)
                .chain_update(object)
                .finalize(),
        );
        forged.extend(object);
        std::fs::write(&entry, &forged).unwrap();
        let dev = with_cache(dir.path());
        check(&run_loop_kernel(&dev), "after a foreign entry");
        assert_eq!(
            std::fs::read(&entry).unwrap(),
            written,
            "the entry is replaced"
        );
        // The failed object left nothing behind: the device still loads that other kernel.
        run_accumulate_kernel(&dev);

        // A truncated entry and one with a flipped object byte: compiled again and replaced.
        for damage in [
            |b: &mut Vec<u8>| b.truncate(b.len() / 2),
            |b: &mut Vec<u8>| *b.last_mut().unwrap() ^= 0x40,
        ] {
            let mut bytes = written.clone();
            damage(&mut bytes);
            std::fs::write(&entry, &bytes).unwrap();
            check(&run_loop_kernel(&with_cache(dir.path())), "after damage");
            assert_eq!(
                std::fs::read(&entry).unwrap(),
                written,
                "the entry is replaced"
            );
        }
    }

    fn loop_case(n: u32, off: u32, slack: u32, seed: u32) {
        // Some cases read past `x` (then every device reports work item 0).
        let nx = (n + off).saturating_sub(slack).max(1);
        let xs: Vec<f32> = (0..nx)
            .map(|i| {
                let v = ((i ^ seed) as f32 * 0.37).sin() * 3.0;
                if i.wrapping_add(seed).is_multiple_of(17) {
                    f32::NAN
                } else {
                    v
                }
            })
            .collect();
        // Random bf16 bits: some are NaNs with payloads.
        let ws: Vec<u8> = (0..nx)
            .flat_map(|i| (((i.wrapping_mul(2654435761) ^ seed) >> 16) as u16).to_le_bytes())
            .collect();
        let ts: Vec<f32> = (0..nx).map(|i| i as f32 * 0.25 - 3.0).collect();
        let inputs = [bytes_f32(&xs), ws, bytes_f32(&ts)];
        same_everywhere(&loop_kernel(), &[n, off, nx], &inputs, &[2 * n as usize, 4]);
    }

    /// A case CI's proptest drew: a bf16 NaN with a payload reaches an f16 store. The
    /// interpreter keeps part of the payload, LLVM code stores the quiet NaN; the contract
    /// leaves NaN payloads unspecified, so both are right (and a byte comparison was wrong).
    #[test]
    fn nan_payloads_are_free_as_the_contract_says() {
        loop_case(9, 10, 0, 3_900_702_720);
    }

    /// A load at `(i + off) >> 3` whose unshifted index wraps around 2^32 inside a group of
    /// lanes: the wrapped lanes read element 0, not element 2^29 (found by a fresh-user pass).
    #[test]
    fn shifted_index_wrapping_around_2_pow_32_matches_the_interpreter() {
        let mut b = KernelBuilder::new("llvm_shift_wrap");
        let n = b.scalar_param("n", ScalarType::U32);
        let off = b.scalar_param("off", ScalarType::U32);
        let nx = b.scalar_param("nx", ScalarType::U32);
        let x = b.buffer_param("x", DType::U8, &[Dim::Param(nx)], Access::Read);
        let y = b.buffer_param("y", DType::U32, &[Dim::Param(n)], Access::Write);
        b.set_grid(Dim::Const(1));
        let (o, nv, zero) = (b.param(off), b.param(n), b.const_u32(0));
        b.for_range(zero, nv, 1, |b, i| {
            let e = b.add(i, o);
            let three = b.const_u32(3);
            let k = b.shr(e, three);
            let v = b.load(x, k);
            b.store(y, i, v);
        });
        let kernel = b.finish();
        let len = (1usize << 29) + 64;
        // Zeroed pages are not touched: only a few bytes are written.
        let mut xs = vec![0u8; len];
        xs[0] = 0x11;
        xs[1] = 0x12;
        xs[1 << 29] = 0xee;
        xs[(1 << 29) + 1] = 0xef;
        xs[(1 << 29) - 1] = 0x77;
        same_everywhere(&kernel, &[48, 0xffff_fff8, len as u32], &[xs], &[4 * 48]);
    }

    /// `y[i] = table[min(x[i], len - 1)]` for `i < n` (`for` loop, one work item): a lookup in
    /// a `len`-entry `u32` table, which AVX-512 hosts select with permutes up to 512 entries.
    /// With `chain`, three more lookups follow, each indexed by the previous entry plus `i`
    /// modulo `len + 3`: a chain of 4, which AVX-512 hosts run at 32 lanes (64 with VBMI).
    fn lookup_kernel(len: usize, salt: u32, chain: bool) -> Kernel {
        let mut b = KernelBuilder::new("llvm_table_lookup");
        let n = b.scalar_param("n", ScalarType::U32);
        let x = b.buffer_param("x", DType::U32, &[Dim::Param(n)], Access::Read);
        let y = b.buffer_param("y", DType::U32, &[Dim::Param(n)], Access::Write);
        b.set_grid(Dim::Const(1));
        let data: Vec<u32> = (0..len as u32)
            .map(|j| j.wrapping_mul(0x9e37_79b9) ^ salt)
            .collect();
        let table = b.table_u32("t", &data);
        let (zero, nv) = (b.const_u32(0), b.param(n));
        let m = b.const_u32(len as u32 + 3);
        b.for_range(zero, nv, 1, |b, i| {
            let v = b.load(x, i);
            let mut e = b.lookup(table, v);
            for _ in 0..if chain { 3 } else { 0 } {
                let mixed = b.add(e, i);
                let at = b.rem(mixed, m);
                e = b.lookup(table, at);
            }
            b.store(y, i, e);
        });
        b.finish()
    }

    /// `y[i] = search_sorted(table, x[i])` for `i < n` (`for` loop, one work item).
    fn search_kernel(table: &[f32]) -> Kernel {
        let mut b = KernelBuilder::new("llvm_search_sorted");
        let n = b.scalar_param("n", ScalarType::U32);
        let x = b.buffer_param("x", DType::F32, &[Dim::Param(n)], Access::Read);
        let y = b.buffer_param("y", DType::U32, &[Dim::Param(n)], Access::Write);
        b.set_grid(Dim::Const(1));
        let t = b.table_f32("t", table);
        let (zero, nv) = (b.const_u32(0), b.param(n));
        b.for_range(zero, nv, 1, |b, i| {
            let v = b.load(x, i);
            let c = b.search_sorted(t, v);
            b.store(y, i, c);
        });
        b.finish()
    }

    /// `y[i] = table[(p[(i + off) >> 1] >> s(i + off)) & 15]` for `i < n` (`for` loop, one work
    /// item): packed 4-bit codes. The shift `s(e)` is one of: NF4's `((e & 1) ^ 1) << 2`, also
    /// written `((1 & e) ^ 1) * 4`, the constants 0 and 4, `e & 3` (all fused with VBMI: at
    /// most 4; all but `e & 3` read only the parity of `e`, so their permute control is a
    /// constant), and `e & 7` or the constant 5 (not fused: a nibble may leave its byte).
    fn nibble_kernel(shift: u32, len: usize) -> Kernel {
        let mut b = KernelBuilder::new("llvm_nibble_lookup");
        let n = b.scalar_param("n", ScalarType::U32);
        let off = b.scalar_param("off", ScalarType::U32);
        let np = b.scalar_param("np", ScalarType::U32);
        let p = b.buffer_param("p", DType::U8, &[Dim::Param(np)], Access::Read);
        let y = b.buffer_param("y", DType::F32, &[Dim::Param(n)], Access::Write);
        b.set_grid(Dim::Const(1));
        let code: Vec<f32> = (0..len).map(|c| (c as f32 - 7.25) / 3.0).collect();
        let table = b.table_f32("code", &code);
        let (zero, nv) = (b.const_u32(0), b.param(n));
        b.for_range(zero, nv, 1, |b, i| {
            let o = b.param(off);
            let e = b.add(i, o);
            let one = b.const_u32(1);
            let at = b.shr(e, one);
            let byte = b.load(p, at);
            let s = match shift {
                0 => {
                    let odd = b.and(e, one);
                    let even = b.binary(BinaryOp::Xor, odd, one);
                    let two = b.const_u32(2);
                    b.shl(even, two)
                }
                1 => b.const_u32(0),
                2 => b.const_u32(4),
                3 => {
                    let three = b.const_u32(3);
                    b.and(e, three)
                }
                4 => {
                    let seven = b.const_u32(7);
                    b.and(e, seven)
                }
                6 => {
                    // Case 0 written as `((1 & e) ^ 1) * 4`.
                    let odd = b.and(one, e);
                    let even = b.binary(BinaryOp::Xor, odd, one);
                    let four = b.const_u32(4);
                    b.mul(even, four)
                }
                _ => b.const_u32(5),
            };
            let shifted = b.shr(byte, s);
            let fifteen = b.const_u32(15);
            let nib = b.and(fifteen, shifted);
            let c = b.lookup(table, nib);
            b.store(y, i, c);
        });
        b.finish()
    }

    /// `s = start + sum over i < n of a[i + off] * b[i + off]` with `i8` inputs and an `i32`
    /// running sum (`for` loop, one work item, as the int8 matmul's dot products), and a `u32`
    /// running sum of `a`'s raw bytes, stored in `s[0]` and `s[1]`.
    fn int_sum_kernel() -> Kernel {
        let mut b = KernelBuilder::new("llvm_int_sums");
        let n = b.scalar_param("n", ScalarType::U32);
        let off = b.scalar_param("off", ScalarType::U32);
        let start = b.scalar_param("start", ScalarType::U32);
        let nx = b.scalar_param("nx", ScalarType::U32);
        let a = b.buffer_param("a", DType::I8, &[Dim::Param(nx)], Access::Read);
        let w = b.buffer_param("w", DType::I8, &[Dim::Param(nx)], Access::Read);
        let raw = b.buffer_param("raw", DType::U8, &[Dim::Param(nx)], Access::Read);
        let s = b.buffer_param("s", DType::I32, &[Dim::Const(2)], Access::Write);
        b.set_grid(Dim::Const(1));
        let dot = b.var("dot", ScalarType::I32);
        let bytes = b.var("bytes", ScalarType::U32);
        let s0 = b.param(start);
        let s0 = b.bitcast(s0, ScalarType::I32);
        b.assign(dot, s0);
        let big = b.const_u32(0xffff_ff00);
        b.assign(bytes, big);
        let (zero, nv) = (b.const_u32(0), b.param(n));
        b.for_range(zero, nv, 1, |b, i| {
            let o = b.param(off);
            let e = b.add(i, o);
            let x = b.load(a, e);
            let y = b.load(w, e);
            let p = b.mul(x, y);
            let cur = b.read_var(dot);
            let next = b.add(cur, p);
            b.assign(dot, next);
            let r = b.load(raw, e);
            let cur = b.read_var(bytes);
            let next = b.add(r, cur);
            b.assign(bytes, next);
        });
        let (z, one) = (b.const_u32(0), b.const_u32(1));
        let d = b.read_var(dot);
        b.store(s, z, d);
        let t = b.read_var(bytes);
        let t = b.bitcast(t, ScalarType::I32);
        b.store(s, one, t);
        b.finish()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn loop_paths_match_the_interpreter(n in 0u32..80, off in 0u32..40, slack in 0u32..8, seed in any::<u32>()) {
            loop_case(n, off, slack, seed);
        }

        #[test]
        fn table_lookups_match_the_interpreter(len_pick in 0usize..14, n in 0u32..200, salt in any::<u32>(), wide in any::<bool>(), chain in any::<bool>()) {
            // Around every chunk and tree boundary of the permute path and of the byte planes
            // (65 to 256 entries, chains of 4 at 64 lanes with VBMI), and past their limits.
            let len = [1, 16, 17, 32, 33, 64, 65, 100, 128, 129, 256, 257, 512, 513][len_pick];
            let xs: Vec<u32> = (0..n)
                .map(|i| {
                    let r = i.wrapping_mul(0x85eb_ca6b) ^ salt;
                    if wide { r } else { r % (len as u32 + 3) }
                })
                .collect();
            let bytes: Vec<u8> = xs.iter().flat_map(|v| v.to_le_bytes()).collect();
            same_everywhere(&lookup_kernel(len, salt, chain), &[n], &[bytes], &[4 * n as usize]);
        }

        /// Random sorted tables (duplicates, both zeros, infinities; up to 300 entries, beyond
        /// a bucket candidate's byte) searched on every path: the level search on AVX-512 hosts
        /// (32 lanes: a chain of up to 8 lookups), the bucket search elsewhere.
        #[test]
        fn searches_match_the_interpreter(
            mut table in proptest::collection::vec(prop_oneof![
                proptest::sample::select(vec![0.0f32, -0.0, f32::INFINITY, f32::NEG_INFINITY, 1.0, -1.0]),
                -2.0f32..2.0,
            ], 1..300),
            probes in proptest::collection::vec(any::<u32>(), 0..40),
        ) {
            table.sort_by(|a, b| a.total_cmp(b));
            let mut xs: Vec<f32> = probes.into_iter().map(f32::from_bits).collect();
            for t in &table {
                xs.extend([*t, t.next_up(), t.next_down()]);
            }
            xs.extend([f32::NAN, -0.0, 0.0]);
            let n = xs.len() as u32;
            same_everywhere(&search_kernel(&table), &[n], &[bytes_f32(&xs)], &[4 * n as usize]);
        }

        #[test]
        fn integer_running_sums_match_the_interpreter(n in 0u32..90, off in 0u32..9, slack in 0u32..3, start in any::<i32>(), seed in any::<u32>()) {
            let nx = (n + off).saturating_sub(slack).max(1);
            let bytes = |salt: u32| -> Vec<u8> {
                (0..nx).map(|i| (i.wrapping_mul(0x9e37_79b9) ^ seed ^ salt) as u8).collect()
            };
            let scalars = [n, off, start as u32, nx];
            let inputs = [bytes(1), bytes(2), bytes(3)];
            same_everywhere(&int_sum_kernel(), &scalars, &inputs, &[8]);
        }

        /// Accumulators that differ only in their column run as lanes; ones that share a use
        /// of the first column must not (they would read the wrong column in lanes 1..3), nor
        /// groups with different first columns in one evaluation. With `x` up to 47 elements
        /// short, a band's last runs leave it: the proof before the band's loop
        /// (`band_proof.rs`) fails and the elements are tested one by one, the failing work
        /// item reporting as on the interpreter.
        #[test]
        fn columns_as_lanes_match_the_interpreter(n in 0u32..40, s in 4u32..40, items in 1u32..5, short in 0u32..48, seed in any::<u32>()) {
            let nx = (n * s + 4 * items + 1).saturating_sub(short).max(1);
            let xs: Vec<f32> = (0..nx).map(|i| ((i ^ seed) as f32 * 0.37).sin()).collect();
            for shared in 0..7 {
                same_everywhere(&columns_kernel(shared), &[n, s, items, nx], &[bytes_f32(&xs)], &[4 * items as usize]);
            }
        }

        /// Rows of up to 300 elements at any offset (aligned to 64 or not: the 64-lane groups
        /// and their 16-lane fallback), block scales with NaN, infinities, subnormals and both
        /// signs.
        #[test]
        fn deferred_lookups_match_the_interpreter(n in 0u32..300, off in 0u32..70, stride in 0u32..300, items in 1u32..4, slack in 0u32..4, aligned in any::<bool>(), seed in any::<u32>()) {
            // Half the cases have every row aligned to 64 (the 64-lane fast groups).
            let (off, stride) = if aligned { (off / 35 * 64, stride / 64 * 64) } else { (off, stride) };
            let nx = ((items - 1) * stride + off + n).saturating_sub(slack).max(1);
            let nt = nx.div_ceil(64);
            let xs: Vec<f32> = (0..nx).map(|i| ((i ^ seed) as f32 * 0.61).cos()).collect();
            let ps: Vec<u8> = (0..nx).map(|i| (i.wrapping_mul(seed | 1) >> 3) as u8).collect();
            let special = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e-40, -3.0, 0.0, -0.0];
            let ts: Vec<f32> = (0..nt)
                .map(|j| {
                    let h = j.wrapping_mul(0x9e37_79b9) ^ seed;
                    if h.is_multiple_of(5) { special[(h as usize / 5) % special.len()] } else { (h as f32 * 1e-9).sin() * 3.0 }
                })
                .collect();
            same_everywhere(&deferred_kernel(), &[n, off, stride, items, nx, nt], &[bytes_f32(&xs), ps, bytes_f32(&ts)], &[4 * items as usize]);
        }

        /// A tile epilogue stored as vectors where every lane's condition holds and the run
        /// fits `out`, else lane by lane: `lim` cuts some columns, `out` and `bias` may be short
        /// (the failing work item must match), and the row loads may be strided (`ystep`).
        #[test]
        fn tile_stores_match_the_interpreter(n in 0u32..24, s in 4u32..12, ystride in 0u32..30, ystep in 1u32..4, items in 1u32..5, rows_pick in 0usize..4, cut in 0u32..6, short in 0u32..6, seed in any::<u32>()) {
            tile_stores_case(n, s, ystride, ystep, items, [1u32, 2, 3, 4][rows_pick], cut, short, seed);
        }

        /// Rows of accumulators-as-lanes whose uniform loads are proven in range before the
        /// loop, or (a `y` up to 6 elements short) not, where the failing work item must match.
        #[test]
        fn uniform_row_loads_match_the_interpreter(n in 0u32..40, s in 4u32..40, ystride in 0u32..50, items in 1u32..4, rows_pick in 0usize..4, short in 0u32..7, seed in any::<u32>()) {
            let rows = [1u32, 2, 3, 4][rows_pick];
            let nx = (n * s + 4 * items + 1).max(1);
            let ny = ((items - 1) * ystride + rows + n).saturating_sub(short).max(1);
            let xs: Vec<f32> = (0..nx).map(|i| ((i ^ seed) as f32 * 0.37).sin()).collect();
            let ys: Vec<u8> = (0..ny).flat_map(|i| (((i.wrapping_mul(seed | 1) >> 7) as u16) & 0xbfff).to_le_bytes()).collect();
            same_everywhere(&uniform_rows_kernel(rows), &[n, s, ystride, items, nx, ny], &[bytes_f32(&xs), ys], &[4 * items as usize]);
        }

        #[test]
        fn accumulate_paths_match_the_interpreter(n in 0u32..70, off in 0u32..9, stride in 0u32..70, items in 1u32..4, slack in 0u32..6, seed in any::<u32>()) {
            let nx = ((items - 1) * stride + off + n).saturating_sub(slack).max(1);
            let xs: Vec<f32> = (0..nx).map(|i| ((i ^ seed) as f32 * 0.61).cos()).collect();
            let ps: Vec<u8> = (0..nx).map(|i| (i.wrapping_mul(seed | 1) >> 3) as u8).collect();
            same_everywhere(&accumulate_kernel(), &[n, off, stride, items, nx], &[bytes_f32(&xs), ps], &[4 * items as usize]);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 12, failure_persistence: None, ..ProptestConfig::default() })]

        /// The 4-bit input gradient with tiles of 4 to 64 columns and 1 to 16 rows (at most 256
        /// outputs; `outer.rs`: the accumulators as lanes, one group per row, 16 lanes per
        /// register with the fused decodes), M and K not multiples of the tile (the last tile's clamped columns take
        /// the usual loop), blocksizes 32 to 128, nested absmax, every activation dtype;
        /// `cpu-llvm` against the interpreter.
        #[test]
        fn accumulators_as_lanes_match_the_interpreter(
            m in 1usize..20, tm_pick in 0usize..5, k in 1usize..300, n in 1usize..90, tn_pick in 0usize..5,
            bs_pick in 0usize..3, dtype_pick in 0usize..3, nested in any::<bool>(), seed in any::<u32>(),
        ) {
            use qforge::kernels::{QuantType, TileConfig};
            use qforge::kernels::ops;
            use qforge::runtime::HostTensor;
            let dtype = [DType::F32, DType::BF16, DType::F16][dtype_pick];
            let vals = |len: usize, salt: u32| -> Vec<f32> {
                (0..len as u32)
                    .map(|i| {
                        let h = (i ^ seed ^ salt).wrapping_mul(0x9e37_79b9);
                        if h.is_multiple_of(23) { [0.0, -0.0, 1e-39, -2.5e4][(h as usize / 23) % 4] } else { ((h >> 8) as f32 / 8388608.0 - 1.0) * 3.0 }
                    })
                    .collect()
            };
            let w = HostTensor::from_f32_as(dtype, vec![n, k], &vals(n * k, 1)).unwrap();
            let bs = [32, 64, 128][bs_pick];
            let (packed, state) = ops::quantize_4bit(&InterpreterDevice, &w, QuantType::Nf4, bs, nested).unwrap();
            let dy = HostTensor::from_f32_as(dtype, vec![m, n], &vals(m * n, 2)).unwrap();
            let tn = [4, 8, 16, 32, 64][tn_pick];
            let tile = TileConfig { tm: [1, 2, 4, 8, 16][tm_pick].min(256 / tn), tn };
            let dev = CpuDevice::llvm(CpuOptions::default()).unwrap();
            let want = ops::matmul_4bit_backward_input(&InterpreterDevice, &dy, &packed, &state, Some(tile)).unwrap();
            let got = ops::matmul_4bit_backward_input(&dev, &dy, &packed, &state, Some(tile)).unwrap();
            let (g, w) = (got.to_f32().unwrap(), want.to_f32().unwrap());
            let bad = g.iter().zip(&w).filter(|(a, b)| !(a.to_bits() == b.to_bits() || a.is_nan() && b.is_nan())).count();
            prop_assert_eq!(bad, 0, "M={} K={} N={} {} tile {}x{} bs {} nested {}", m, k, n, dtype, tile.tm, tile.tn, bs, nested);
        }
    }

    /// Division of a uniform by a deferred lookup (an `i32` table holding 0 and -1: LLVM folded
    /// `sdiv x, select(c, 1, C)` to `x` when the constant `C` had a zero lane) and signaling-NaN
    /// constants (widening one to `f64` for the text quieted it) on every device.
    #[test]
    fn division_by_looked_up_values_and_signaling_nan_constants_match_the_interpreter() {
        let n = 70u32;
        let xs: Vec<u8> = (0..n).flat_map(|i| (i % 7).to_le_bytes()).collect();
        for op in 0..5 {
            for p in [31u32, 0x8000_0000, 7, 0, 0xffff_fffb] {
                same_everywhere(
                    &division_kernel(op),
                    &[n, p],
                    std::slice::from_ref(&xs),
                    &[4 * n as usize, 4 * n as usize],
                );
            }
        }
    }

    /// Accumulators as lanes replace `c_0` by `c_0 + lane`: a bound or a constant read from
    /// `c_0`'s own ops does not hold in the lanes (a dropped lookup clamp, a constant nibble
    /// shift). Found by a breaker pass: cpu-llvm gave `[31, 0, 1, .., 14]` for the clamped
    /// lookup and one shift for every lane of the decode.
    #[test]
    fn bounds_and_shifts_of_a_lanes_seed_are_not_its_ops() {
        let xs = bytes_f32(&(0..512).map(|i| 1.0 + (i % 7) as f32).collect::<Vec<_>>());
        let ps: Vec<u8> = (0..64u32).map(|i| (i * 37 + 11) as u8).collect();
        for (lookup, shape, p) in [
            (true, 0, 31),
            (true, 0, 20),
            (true, 0, 7),
            (true, 1, 15),
            (true, 1, 9),
            (false, 0, 0),
        ] {
            for n in [1, 3] {
                same_everywhere(
                    &seeded_columns_kernel(lookup, shape),
                    &[n, p],
                    &[xs.clone(), ps.clone()],
                    &[64],
                );
            }
        }
    }

    /// `mul_hi` on `i32` and `u32` lanes: edge values (0, ±1, `i32::MIN/MAX`, `u32::MAX`,
    /// 2^16) in every pairing and position of a vector, odd lengths (scalar tail).
    #[test]
    fn high_words_of_products_match_the_interpreter() {
        let edges = [
            0u32,
            1,
            u32::MAX,
            0x8000_0000,
            0x7fff_ffff,
            0x1_0000,
            0xffff,
            3,
            0xD251_1F53,
        ];
        let mut xs = Vec::new();
        let mut ws = Vec::new();
        for a in edges {
            for b in edges {
                xs.push(a);
                ws.push(b);
            }
        }
        // Shifted by one so pairs also fall in odd lanes.
        xs.push(0x8000_0001);
        ws.insert(0, 0xfffe_0001);
        ws.truncate(xs.len());
        let n = xs.len() as u32;
        let bytes = |v: &[u32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        for len in [n, n - 1, 17, 16, 5] {
            let len_bytes = 4 * len as usize;
            same_everywhere(
                &mul_hi_kernel(),
                &[len],
                &[bytes(&xs[..len as usize]), bytes(&ws[..len as usize])],
                &[len_bytes, len_bytes, len_bytes],
            );
        }
    }

    proptest! {
        // Each case compiles the kernel seven times (one per shift expression) for three devices.
        #![proptest_config(ProptestConfig { cases: 10, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn nibble_lookups_match_the_interpreter(len in 1usize..17, n in 0u32..70, off in 0u32..40, slack in 0u32..3, seed in any::<u32>()) {
            // Some cases read past `p` (then every device reports the same work item).
            let np = ((n + off).div_ceil(2)).saturating_sub(slack).max(1);
            let ps: Vec<u8> = (0..np).map(|i| (i.wrapping_mul(0x9e37_79b9) ^ seed) as u8).collect();
            for shift in 0..7 {
                same_everywhere(&nibble_kernel(shift, len), &[n, off, np], std::slice::from_ref(&ps), &[4 * n as usize]);
            }
        }
    }
}
