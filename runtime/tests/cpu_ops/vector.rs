//! The loop vectorizer (`LowerOptions::simd`): loops run with vector code must give exactly the
//! bits of the scalar code and of the interpreter, including remainders, out-of-range lookups,
//! strided loads, narrow stores and out-of-range accesses inside a vector iteration.

use super::*;

/// The default (SIMD) CPU device.
fn simd_cpu() -> &'static CpuDevice {
    cpu()
}

/// A CPU device that emits scalar code only.
fn scalar_cpu() -> &'static CpuDevice {
    static CPU: OnceLock<CpuDevice> = OnceLock::new();
    CPU.get_or_init(|| {
        let options = CpuOptions {
            simd: false,
            ..CpuOptions::default()
        };
        CpuDevice::with_options(options).expect("Cranelift supports the host")
    })
}

/// SIMD on, scalar, SIMD on the baseline instruction set; each against the interpreter.
fn run_all_modes(kernel: &Kernel, args: Vec<OwnedArg>) -> Vec<OwnedArg> {
    assert!(simd_cpu().options().simd && baseline_cpu().options().simd);
    run_on_all(&[simd_cpu(), scalar_cpu(), baseline_cpu()], kernel, args)
}

/// Edge-heavy `f32` bit patterns: the edge list, then pseudo-random bits (from `seed`).
fn f_inputs(len: usize, seed: u32) -> Vec<f32> {
    let edges = f_edges();
    let mut s = seed | 1;
    (0..len)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            match s % 3 {
                0 => f32::from_bits(s),
                _ => edges[(i + s as usize) % edges.len()],
            }
        })
        .collect()
}

fn u_inputs(len: usize, seed: u32) -> Vec<u32> {
    let mut s = seed | 1;
    (0..len)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            match s % 4 {
                0 => s,
                1 => s % 40,
                _ => U_EDGES[(i + s as usize) % U_EDGES.len()],
            }
        })
        .collect()
}

/// One step of a random loop body: an op and selectors of its operands in the value pools.
#[derive(Clone, Debug)]
struct Step {
    op: u8,
    sub: u8,
    a: u8,
    b: u8,
    c: u8,
}

fn step() -> impl Strategy<Value = Step> {
    (0u8..16, any::<u8>(), any::<u8>(), any::<u8>(), any::<u8>())
        .prop_map(|(op, sub, a, b, c)| Step { op, sub, a, b, c })
}

fn pick(pool: &[Value], s: u8) -> Value {
    pool[s as usize % pool.len()]
}

/// `for i in s..n { yf[i] = .., yu[i] = .., yb[i] = .., yh[i] = .. }` with a body built from
/// `steps` on loads of `xf[i]`, `xf[2i + 1]`, `xu[i]`, the index, a scalar and constants.
fn random_loop(steps: &[Step]) -> Kernel {
    let mut b = KernelBuilder::new("vector_random_loop");
    let s = b.scalar_param("s", ScalarType::U32);
    let n = b.scalar_param("n", ScalarType::U32);
    let scale = b.scalar_param("scale", ScalarType::F32);
    let len = b.scalar_param("len", ScalarType::U32);
    let len2 = b.scalar_param("len2", ScalarType::U32);
    let xf = b.buffer_param("xf", DType::F32, &[Dim::Param(len2)], Access::Read);
    let xu = b.buffer_param("xu", DType::U32, &[Dim::Param(len)], Access::Read);
    let yf = b.buffer_param("yf", DType::F32, &[Dim::Param(len)], Access::Write);
    let yu = b.buffer_param("yu", DType::U32, &[Dim::Param(len)], Access::Write);
    let yb = b.buffer_param("yb", DType::U8, &[Dim::Param(len)], Access::Write);
    let yh = b.buffer_param("yh", DType::F16, &[Dim::Param(len)], Access::Write);
    let tf = b.table_f32("tf", &[-0.75, -0.0, 0.25, 1.5, f32::NAN, 3.0, -1e-40]);
    let tu = b.table_u32("tu", &[7, 0xffff_ffff, 0, 31, 0x8000_0000]);
    b.set_grid(Dim::Const(1));
    let (s, n, scale) = (b.param(s), b.param(n), b.param(scale));
    b.for_range(s, n, 1, |b, i| {
        let one = b.const_u32(1);
        let i2 = b.shl(i, one);
        let i21 = b.add(i2, one);
        let mut f = vec![b.load(xf, i), b.load(xf, i21), scale, b.const_f32(-0.0)];
        let mut u = vec![b.load(xu, i), i, b.const_u32(3), n];
        let mut c = vec![b.cmp(CmpOp::Lt, f[0], f[1])];
        for st in steps {
            let (fa, fb, fc) = (pick(&f, st.a), pick(&f, st.b), pick(&f, st.c));
            let (ua, ub) = (pick(&u, st.a), pick(&u, st.b));
            let (ca, cb) = (pick(&c, st.a), pick(&c, st.b));
            let sub = st.sub as usize;
            match st.op {
                0 | 1 => {
                    let ops = [
                        BinaryOp::Add,
                        BinaryOp::Sub,
                        BinaryOp::Mul,
                        BinaryOp::Div,
                        BinaryOp::Min,
                        BinaryOp::Max,
                    ];
                    f.push(b.binary(ops[sub % ops.len()], fa, fb));
                }
                2 => {
                    let ops = [UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Sqrt];
                    f.push(b.unary(ops[sub % ops.len()], fa));
                }
                3 => f.push(b.fma(fa, fb, fc)),
                4 | 5 => u.push(b.binary(BinaryOp::ALL[sub % BinaryOp::ALL.len()], ua, ub)),
                6 => {
                    // An i32 op, through bitcasts.
                    let ops = [
                        BinaryOp::Div,
                        BinaryOp::Rem,
                        BinaryOp::Shr,
                        BinaryOp::Min,
                        BinaryOp::Max,
                        BinaryOp::Mul,
                    ];
                    let (x, y) = (
                        b.bitcast(ua, ScalarType::I32),
                        b.bitcast(ub, ScalarType::I32),
                    );
                    let r = if sub % 7 == 6 {
                        b.abs(x)
                    } else {
                        b.binary(ops[sub % 7 % ops.len()], x, y)
                    };
                    u.push(b.bitcast(r, ScalarType::U32));
                }
                7 => {
                    let op = CmpOp::ALL[sub % 6];
                    c.push(match sub / 6 % 3 {
                        0 => b.cmp(op, fa, fb),
                        1 => b.cmp(op, ua, ub),
                        _ => {
                            let (x, y) = (
                                b.bitcast(ua, ScalarType::I32),
                                b.bitcast(ub, ScalarType::I32),
                            );
                            b.cmp(op, x, y)
                        }
                    });
                }
                8 => c.push(match sub % 6 {
                    0 => b.and(ca, cb),
                    1 => b.or(ca, cb),
                    2 => b.binary(BinaryOp::Xor, ca, cb),
                    3 => b.not(ca),
                    4 => b.cmp(CmpOp::Eq, ca, cb),
                    _ => b.cmp(CmpOp::Ne, ca, cb),
                }),
                9 => f.push(b.select(ca, fa, fb)),
                10 => u.push(b.select(ca, ua, ub)),
                11 => {
                    let to = if sub.is_multiple_of(2) {
                        ScalarType::U32
                    } else {
                        ScalarType::I32
                    };
                    let r = b.float_to_int(fa, to, Rounding::ALL[sub / 2 % 4]);
                    u.push(b.bitcast(r, ScalarType::U32));
                }
                12 => {
                    let x = if sub.is_multiple_of(2) {
                        ua
                    } else {
                        b.bitcast(ua, ScalarType::I32)
                    };
                    f.push(b.op(qforge_ir::Op::IntToFloat {
                        value: x,
                        rounding: Rounding::ALL[sub / 2 % 4],
                    }));
                }
                13 => {
                    if sub.is_multiple_of(2) {
                        f.push(b.bitcast(ua, ScalarType::F32));
                    } else {
                        // A NaN's payload and sign are free under the numeric contract (Cranelift
                        // may turn fma(a, -b, c) into a fused negate-multiply-add whose NaN sign
                        // differs), so canonicalise NaN before exposing the bits.
                        let is_nan = b.cmp(CmpOp::Ne, fa, fa);
                        let qnan = b.const_f32(f32::NAN);
                        let fa = b.select(is_nan, qnan, fa);
                        u.push(b.bitcast(fa, ScalarType::U32));
                    }
                }
                14 => f.push(b.lookup(tf, ua)),
                _ => u.push(b.lookup(tu, ua)),
            }
        }
        let (lf, lu, lc) = (*f.last().unwrap(), *u.last().unwrap(), *c.last().unwrap());
        b.store(yf, i, lf);
        b.store(yu, i, lu);
        let (five, nine) = (b.const_u32(5), b.const_u32(9));
        let flag = b.select(lc, five, nine);
        let byte = b.add(lu, flag);
        b.store(yb, i, byte);
        b.store_auto(yh, i, f[f.len() / 2]);
    });
    b.finish()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn random_loop_bodies_match_scalar_and_interpreter(
        steps in prop::collection::vec(step(), 1..14),
        s in 0u32..3,
        trip in 0u32..37,
        scale_bits in any::<u32>(),
        seed in any::<u32>(),
    ) {
        let k = random_loop(&steps);
        let n = s + trip;
        let len = n.max(1) as usize;
        let len2 = 2 * len + 1;
        let scale = if seed % 3 == 0 { f32::from_bits(scale_bits) } else { 0.37 };
        let args = vec![
            OwnedArg::Scalar(Scalar::U32(s)),
            OwnedArg::Scalar(Scalar::U32(n)),
            OwnedArg::Scalar(Scalar::f32(scale)),
            OwnedArg::Scalar(Scalar::U32(len as u32)),
            OwnedArg::Scalar(Scalar::U32(len2 as u32)),
            OwnedArg::Read(le_f32(&f_inputs(len2, seed))),
            OwnedArg::Read(le_u32(&u_inputs(len, seed.wrapping_mul(7)))),
            OwnedArg::Write(vec![0xA5; 4 * len]),
            OwnedArg::Write(vec![0xA5; 4 * len]),
            OwnedArg::Write(vec![0xA5; len]),
            OwnedArg::Write(vec![0xA5; 2 * len]),
        ];
        run_all_modes(&k, args);
    }
}

/// `for i in 0..n { y[i] = f(x, i) }` over one work item with `x` of `len_x` f32 elements.
fn loop_kernel(
    name: &str,
    out: DType,
    f: impl FnOnce(&mut KernelBuilder, ParamId, Value) -> Value,
) -> Kernel {
    let mut b = KernelBuilder::new(name);
    let n = b.scalar_param("n", ScalarType::U32);
    let len_x = b.scalar_param("len_x", ScalarType::U32);
    let x = b.buffer_param("x", DType::F32, &[Dim::Param(len_x)], Access::Read);
    let y = b.buffer_param("y", out, &[Dim::Param(n)], Access::Write);
    b.set_grid(Dim::Const(1));
    let zero = b.const_u32(0);
    let n = b.param(n);
    b.for_range(zero, n, 1, |b, i| {
        let v = f(b, x, i);
        b.store_auto(y, i, v);
    });
    b.finish()
}

fn loop_args(n: usize, x: &[f32], out_size: usize) -> Vec<OwnedArg> {
    vec![
        OwnedArg::Scalar(Scalar::U32(n as u32)),
        OwnedArg::Scalar(Scalar::U32(x.len() as u32)),
        OwnedArg::Read(le_f32(x)),
        OwnedArg::Write(vec![0x5A; n * out_size]),
    ]
}

fn written(mut out: Vec<OwnedArg>) -> Vec<u8> {
    match out.pop() {
        Some(OwnedArg::Write(bytes)) => bytes,
        other => panic!("unexpected output {other:?}"),
    }
}

#[test]
fn lookups_clamp_out_of_range_indices_in_vector_loops() {
    let table: Vec<f32> = (0..16).map(|k| k as f32 * 0.5 - 3.0).collect();
    for len in [15usize, 16] {
        let t = table[..len].to_vec();
        let k = loop_kernel("vector_lookup", DType::F32, |b, _x, i| {
            let tb = b.table_f32("t", &t);
            let three = b.const_u32(3);
            let j = b.mul(i, three);
            b.lookup(tb, j)
        });
        let n = 23;
        let got = f32s(&written(run_all_modes(&k, loop_args(n, &[0.0], 4))));
        let want: Vec<f32> = (0..n).map(|i| t[(3 * i).min(len - 1)]).collect();
        assert_f32(&got, &want, |i| format!("table of {len}, index {}", 3 * i));
    }
}

#[test]
fn branch_free_search_lookups_in_vector_loops() {
    // idx1 = (x > t[3] ? 8 : 0) + 3 - 2; idx2 = idx1 + (x > t[idx1] ? 2 : 1): few possible
    // indices per step, some past the end of the 5-entry table (clamped).
    let t = [-1.0f32, -0.25, 0.0, 0.5, 2.0];
    let k = loop_kernel("vector_search", DType::U32, |b, x, i| {
        let tb = b.table_f32("t", &t);
        let v = b.load(x, i);
        let (three, eight, zero, two, one) = (
            b.const_u32(3),
            b.const_u32(8),
            b.const_u32(0),
            b.const_u32(2),
            b.const_u32(1),
        );
        let p = b.lookup(tb, three);
        let c = b.cmp(CmpOp::Gt, v, p);
        let base = b.select(c, eight, zero);
        let idx1 = b.add(base, three);
        let idx1 = b.sub(idx1, two);
        let p1 = b.lookup(tb, idx1);
        let c1 = b.cmp(CmpOp::Gt, v, p1);
        let step = b.select(c1, two, one);
        let idx2 = b.add(idx1, step);
        let p2 = b.lookup(tb, idx2);
        let bits = b.bitcast(p2, ScalarType::U32);
        let sixteen = b.const_u32(16);
        let hi = b.shl(idx2, sixteen);
        let mixed = b.binary(BinaryOp::Xor, bits, hi);
        b.add(mixed, i)
    });
    let n = 31;
    let x = f_inputs(n, 1234);
    let got = u32s(&written(run_all_modes(&k, loop_args(n, &x, 4))));
    let lk = |j: usize| t[j.min(t.len() - 1)];
    for (i, v) in x.iter().enumerate() {
        let idx1 = if *v > lk(3) { 9 } else { 1 };
        let idx2 = idx1 + if *v > lk(idx1) { 2 } else { 1 };
        let want = (lk(idx2).to_bits() ^ ((idx2 as u32) << 16)).wrapping_add(i as u32);
        assert_eq!(got[i], want, "x = {v:?}");
    }
}

#[test]
fn strided_loads_in_vector_loops() {
    for stride in [1u32, 2, 3] {
        for n in [0usize, 1, 4, 7, 8, 13] {
            // The buffer ends exactly after the last element read, so wide loads near the end
            // must fall back to single elements.
            let len = if n == 0 {
                1
            } else {
                stride as usize * (n - 1) + 2
            };
            let x = f_inputs(len, 99 + n as u32);
            let k = loop_kernel("vector_strided", DType::F32, |b, x, i| {
                let s = b.const_u32(stride);
                let one = b.const_u32(1);
                let j = b.mul(i, s);
                let j1 = b.add(j, one);
                let (a, c) = (b.load(x, j), b.load(x, j1));
                b.sub(a, c)
            });
            let got = f32s(&written(run_all_modes(&k, loop_args(n, &x, 4))));
            let want: Vec<f32> = (0..n)
                .map(|i| x[stride as usize * i] - x[stride as usize * i + 1])
                .collect();
            assert_f32(&got, &want, |i| format!("stride {stride}, n {n}, #{i}"));
        }
    }
}

#[test]
fn narrow_stores_in_vector_loops() {
    let n = 35;
    let x = f_inputs(n, 5);
    for out in [DType::U8, DType::F16, DType::BF16] {
        let k = loop_kernel("vector_narrow_store", out, |b, x, i| {
            let v = b.load(x, i);
            if out == DType::U8 {
                let bits = b.bitcast(v, ScalarType::U32);
                b.add(bits, i)
            } else {
                v
            }
        });
        let got = written(run_all_modes(&k, loop_args(n, &x, out.size_bytes())));
        for (i, xv) in x.iter().enumerate() {
            match out {
                DType::U8 => {
                    assert_eq!(got[i], xv.to_bits().wrapping_add(i as u32) as u8, "u8 #{i}")
                }
                DType::F16 => {
                    let g = f16::from_le_bytes([got[2 * i], got[2 * i + 1]]);
                    let w = f16::from_f32(*xv);
                    assert!(
                        g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                        "f16 #{i}: {xv:?}"
                    );
                }
                _ => {
                    let g = bf16::from_le_bytes([got[2 * i], got[2 * i + 1]]);
                    let w = bf16::from_f32(*xv);
                    assert!(
                        g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                        "bf16 #{i}: {xv:?}"
                    );
                }
            }
        }
    }
}

#[test]
fn out_of_range_access_in_a_vector_iteration_is_reported() {
    // Work item w loops over w*8 .. w*8+8 and reads x[i + 1]: only the last work item reads
    // one element past the end, in lane 3 of its second vector iteration.
    let mut b = KernelBuilder::new("vector_oob");
    let len = b.scalar_param("len", ScalarType::U32);
    let x = b.buffer_param("x", DType::F32, &[Dim::Param(len)], Access::Read);
    let y = b.buffer_param("y", DType::F32, &[Dim::Param(len)], Access::Write);
    b.set_grid(Dim::Const(4));
    let w = b.work_item();
    let eight = b.const_u32(8);
    let lo = b.mul(w, eight);
    let hi = b.add(lo, eight);
    b.for_range(lo, hi, 1, |b, i| {
        let one = b.const_u32(1);
        let j = b.add(i, one);
        let v = b.load(x, j);
        b.store(y, i, v);
    });
    let k = b.finish();
    let xs = le_f32(&[1.0; 32]);
    for dev in [simd_cpu(), scalar_cpu(), baseline_cpu()] {
        let mut ys = vec![0u8; 128];
        let mut args = [
            qforge_ir::Arg::Scalar(Scalar::U32(32)),
            qforge_ir::Arg::Read(&xs),
            qforge_ir::Arg::Write(&mut ys),
        ];
        match dev.launch(&k, &mut args) {
            Err(qforge_runtime::Error::Ir(qforge_ir::Error::Execution { work_item, .. })) => {
                assert_eq!(work_item, 3, "simd {}", dev.options().simd)
            }
            other => panic!("expected an execution error, got {other:?}"),
        }
    }
}

#[test]
fn vector_code_is_emitted_only_with_simd() {
    let k = loop_kernel("vector_emitted", DType::F32, |b, x, i| {
        let v = b.load(x, i);
        b.mul(v, v)
    });
    let text = |simd| {
        let options = qforge_codegen::cranelift::LowerOptions {
            simd,
            ..Default::default()
        };
        qforge_codegen::cranelift::lower(&k, &options)
            .expect("lowers")
            .function
            .display()
            .to_string()
    };
    assert!(text(true).contains("f32x4"), "no vector code with simd on");
    assert!(!text(false).contains("f32x4"), "vector code with simd off");
}

/// `p[i] = fma(p[i], 3, q[i])` for `i` in `0..n`, with `q: u8` widened (`shift = 0`), or the
/// chained `p[i + 1] = p[i] * 3 + 1` (`shift = 1`): in place at the loop index it is vectorized
/// (with a vector `fma` and a 4-byte `u8` load), at another index it must stay scalar.
fn in_place_kernel(shift: u32) -> Kernel {
    let mut b = KernelBuilder::new(&format!("in_place_{shift}"));
    let n = b.scalar_param("n", ScalarType::U32);
    let p = b.buffer_param("p", DType::F32, &[Dim::Param(n)], Access::ReadWrite);
    let q = b.buffer_param("q", DType::U8, &[Dim::Param(n)], Access::Read);
    b.set_grid(Dim::Const(1));
    let zero = b.const_u32(0);
    let nv = b.param(n);
    let sv = b.const_u32(shift);
    let end = b.sub(nv, sv);
    b.for_range(zero, end, 1, |b, i| {
        let v = b.load(p, i);
        let three = b.const_f32(3.0);
        let c = b.load(q, i);
        let cf = b.int_to_float(c);
        let r = b.fma(v, three, cf);
        let at = b.add(i, sv);
        let at = if shift == 0 { i } else { at };
        b.store(p, at, r);
    });
    b.finish()
}

#[test]
fn in_place_loops_vectorize_and_chained_ones_stay_scalar() {
    for shift in [0u32, 1] {
        let k = in_place_kernel(shift);
        let text = qforge_codegen::cranelift::lower(&k, &Default::default())
            .expect("lowers")
            .function
            .display()
            .to_string();
        assert_eq!(
            text.contains("f32x4"),
            shift == 0,
            "vectorized must be {} for shift {shift}",
            shift == 0
        );
        // n >= shift, so that `n - shift` does not wrap.
        for n in [shift as usize, 1, 5, 64, 131] {
            let p = f_inputs(n, 7 + n as u32);
            let q: Vec<u8> = (0..n).map(|i| (i * 37 % 256) as u8).collect();
            run_all_modes(
                &k,
                vec![
                    OwnedArg::Scalar(Scalar::U32(n as u32)),
                    OwnedArg::Write(le_f32(&p)),
                    OwnedArg::Read(q),
                ],
            );
        }
    }
}
