//! The LLVM CPU backend: its text is deterministic and never asks LLVM for fast-math, and (with
//! the `llvm` feature) its vector paths give the interpreter's bits and the interpreter's
//! out-of-range report, whichever path (contiguous run, repeated run, uniform element, gather,
//! lane-by-lane store) a group takes. The conformance suite runs every library kernel on the
//! `cpu-llvm` device too.

use qforge::codegen::llvm::{lower, LlvmOptions};
use qforge::ir::library;

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
    for entry in library::catalog() {
        let kernel = entry.build().expect("library kernels build");
        for lanes in [0, 8, 16] {
            let options = LlvmOptions {
                bounds_checks: true,
                lanes,
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
            checked += 1;
        }
    }
    assert!(checked >= 3 * 400, "only {checked} kernels lowered");
}

#[test]
fn llvm_rejects_unsupported_lane_counts() {
    let kernel = library::catalog()[0].build().unwrap();
    for lanes in [1, 2, 3, 12, 128] {
        let err = lower(
            &kernel,
            &LlvmOptions {
                bounds_checks: true,
                lanes,
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
        count_mismatches, Access, DType, Dim, Kernel, KernelBuilder, OwnedArg, ReduceOrder, Scalar,
        ScalarType,
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
            b.store_rounded(y, i, s, qforge::ir::Rounding::NearestEven);
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

    fn bytes_f32(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    /// Runs `kernel` on the interpreter, the LLVM device with vectors and without: the same
    /// outputs under the numeric contract (bit for bit, except that any two NaNs are equal, as
    /// `count_mismatches` and the conformance suite compare), or the same out-of-range work item.
    fn same_everywhere(kernel: &Kernel, scalars: &[u32], inputs: &[Vec<u8>], outputs: &[usize]) {
        let vector = CpuDevice::llvm(CpuOptions::default()).unwrap();
        let scalar = CpuDevice::llvm(CpuOptions {
            simd: false,
            ..CpuOptions::default()
        })
        .unwrap();
        let devices: [&dyn Device; 3] = [&InterpreterDevice, &vector, &scalar];
        let mut results = Vec::new();
        for dev in devices {
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
        for (r, name) in results[1..].iter().zip(["cpu-llvm", "cpu-llvm (scalar)"]) {
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

    fn loop_case(n: u32, off: u32, slack: u32, seed: u32) {
        // Some cases read past `x` (then every device reports work item 0).
        let nx = (n + off).saturating_sub(slack).max(1);
        let xs: Vec<f32> = (0..nx)
            .map(|i| {
                let v = ((i ^ seed) as f32 * 0.37).sin() * 3.0;
                if (i + seed) % 17 == 0 {
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

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn loop_paths_match_the_interpreter(n in 0u32..80, off in 0u32..40, slack in 0u32..8, seed in any::<u32>()) {
            loop_case(n, off, slack, seed);
        }

        #[test]
        fn accumulate_paths_match_the_interpreter(n in 0u32..70, off in 0u32..9, stride in 0u32..70, items in 1u32..4, slack in 0u32..6, seed in any::<u32>()) {
            let nx = ((items - 1) * stride + off + n).saturating_sub(slack).max(1);
            let xs: Vec<f32> = (0..nx).map(|i| ((i ^ seed) as f32 * 0.61).cos()).collect();
            let ps: Vec<u8> = (0..nx).map(|i| (i.wrapping_mul(seed | 1) >> 3) as u8).collect();
            same_everywhere(&accumulate_kernel(), &[n, off, stride, items, nx], &[bytes_f32(&xs), ps], &[4 * items as usize]);
        }
    }
}
