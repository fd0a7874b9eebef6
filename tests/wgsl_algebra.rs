//! Float expressions that an optimizing shader compiler may rewrite algebraically when it
//! treats float arithmetic as real arithmetic (`(x + 1) - 1` to `x`, `x - x` to `0`, ...): on a
//! wgpu device (Mesa lavapipe in CI) each must give the interpreter's IEEE result bit for bit,
//! with the hardware and the software routines. Before the WGSL emitter made float results,
//! constant operands and repeated operands opaque, lavapipe gave `x` for `(x + 1) - 1` and 0 for
//! `inf - inf`. Without an adapter the test prints why and passes.
#![cfg(feature = "wgpu")]

use qforge::codegen::wgsl::WgslOptions;
use qforge::ir::{
    count_mismatches, Access, DType, Dim, Kernel, KernelBuilder, OwnedArg, Scalar, ScalarType,
};
use qforge::runtime::{Device, InterpreterDevice, WgpuDevice};

const EXPRS: usize = 7;

/// `out[i, k]` for `k` in: `(x + 1) - 1`, `(x - 1) + 1`, `(x + y) - y`, `x - x`, `(x * 3) / 3`,
/// `(x / 3) * 3`, `(x * 0.5) * 2`.
fn traps() -> Kernel {
    let mut b = KernelBuilder::new("algebra_traps");
    let n = b.scalar_param("n", ScalarType::U32);
    let x = b.buffer_param("x", DType::F32, &[Dim::Param(n)], Access::Read);
    let y = b.buffer_param("y", DType::F32, &[Dim::Param(n)], Access::Read);
    let out = b.buffer_param(
        "out",
        DType::F32,
        &[Dim::Param(n), Dim::Const(EXPRS as u32)],
        Access::Write,
    );
    b.set_grid(Dim::Param(n));
    let i = b.work_item();
    let (xv, yv) = (b.load(x, i), b.load(y, i));
    let (one, three, half, two) = (
        b.const_f32(1.0),
        b.const_f32(3.0),
        b.const_f32(0.5),
        b.const_f32(2.0),
    );
    let a = b.add(xv, one);
    let e0 = b.sub(a, one);
    let s = b.sub(xv, one);
    let e1 = b.add(s, one);
    let t = b.add(xv, yv);
    let e2 = b.sub(t, yv);
    let e3 = b.sub(xv, xv);
    let m = b.mul(xv, three);
    let e4 = b.div(m, three);
    let d = b.div(xv, three);
    let e5 = b.mul(d, three);
    let h = b.mul(xv, half);
    let e6 = b.mul(h, two);
    let seven = b.const_u32(EXPRS as u32);
    let base = b.mul(i, seven);
    for (k, e) in [e0, e1, e2, e3, e4, e5, e6].into_iter().enumerate() {
        let kv = b.const_u32(k as u32);
        let at = b.add(base, kv);
        b.store(out, at, e);
    }
    b.finish()
}

#[test]
fn algebraic_rewrites_do_not_change_results() {
    let values: Vec<f32> = vec![
        0.1,
        1e-9,
        -1e-9,
        3.0e38,
        -3.0e38,
        1.0e-40,
        0.0,
        -0.0,
        16777217.0,
        0.3,
        7.0,
        -2.5e-8,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        1.0,
        0.7,
        1e20,
    ];
    let ys: Vec<f32> = values.iter().rev().copied().collect();
    let n = values.len();
    let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let args = vec![
        OwnedArg::Scalar(Scalar::U32(n as u32)),
        OwnedArg::Read(bytes(&values)),
        OwnedArg::Read(bytes(&ys)),
        OwnedArg::Write(vec![0; 4 * n * EXPRS]),
    ];
    let kernel = traps();
    let mut want = args.clone();
    InterpreterDevice
        .launch(&kernel, &mut OwnedArg::borrow_all(&mut want))
        .unwrap();
    // The IEEE values differ from the "real" ones, so a rewrite would be seen.
    let out: Vec<f32> = match &want[3] {
        OwnedArg::Write(b) => b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        _ => unreachable!(),
    };
    assert_ne!(
        out[0].to_bits(),
        0.1f32.to_bits(),
        "(0.1 + 1) - 1 is not 0.1 in f32"
    );
    for force in [WgslOptions::HARDWARE, WgslOptions::SOFTWARE] {
        let dev = match WgpuDevice::with_soft_math(force) {
            Ok(d) => d,
            Err(e) => {
                qforge_testkit::unavailable("wgpu", e);
                return;
            }
        };
        let mut got = args.clone();
        dev.launch(&kernel, &mut OwnedArg::borrow_all(&mut got))
            .unwrap();
        let (bad, total) = count_mismatches(&kernel, &got, &want);
        if let (OwnedArg::Write(g), OwnedArg::Write(w)) = (&got[3], &want[3]) {
            for (k, (a, b)) in g.chunks_exact(4).zip(w.chunks_exact(4)).enumerate() {
                if a != b {
                    let f = |c: &[u8]| f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                    println!(
                        "row {} expr {}: got {:e} want {:e}",
                        k / EXPRS,
                        k % EXPRS,
                        f(a),
                        f(b)
                    );
                }
            }
        }
        assert_eq!(bad, 0, "{bad} of {total} results differ on {}", dev.name());
    }
}
