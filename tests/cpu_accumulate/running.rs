//! Running max-of-abs reductions in a vectorized `for` loop, NaN-skipping
//! `acc = max(acc, abs(x))` (the absmax pass of the 8-bit optimizers and blockwise quantizers) and
//! NaN-propagating `acc = select(a > acc || a != a, a, acc)` with `a = abs(x)` (the 4-bit
//! optimizers' absmax), running sums `acc = acc + x` (the EDEN sums), and near-misses of those
//! patterns that must stay scalar: every start,
//! length, starting value and edge-value mix, bit for bit against the interpreter on the four
//! CPU devices.

use super::{check, le_f32, store_vars, values, Rng};
use qforge::ir::{
    Access, CmpOp, DType, Dim, Kernel, KernelBuilder, OwnedArg, Scalar, ScalarType, Value, VarId,
};

/// The loop body's shape.
#[derive(Clone, Copy, Debug)]
enum Shape {
    /// Two reductions `a = max(a, |x|)`, `b = max(b, |2x|)` and a store of `|x|`.
    TwoAbs,
    /// `a = max(a, x)`: no `abs`, so `+0`/`-0` ties depend on the order (stays scalar).
    NoAbs,
    /// `a = max(a, |x|)` plus a store of the running value (the read used twice: stays scalar).
    ReadTwice,
    /// `a = propagate(a, |x|)`, `b = propagate(b, |2x|)` (NaN-propagating) and a store of `|x|`.
    Propagate,
    /// `a = propagate(a, x)`: no `abs` (stays scalar).
    PropagateNoAbs,
    /// `a = a + x`, `b = b + x * x` (sums in iteration order) and a store of `|x|`.
    Sum,
}

/// `acc = select(v > acc || v != v, v, acc)`: torch's NaN-propagating running max.
fn propagate(b: &mut KernelBuilder, acc: VarId, v: Value) {
    let cur = b.read_var(acc);
    let gt = b.cmp(CmpOp::Gt, v, cur);
    let nan = b.cmp(CmpOp::Ne, v, v);
    let take = b.or(gt, nan);
    let next = b.select(take, v, cur);
    b.assign(acc, next);
}

/// `out[0..2]` = the variables after `for e in start..n`, with `a` and `b` set to `init` before
/// the loop; `y[e]` = `|x[e]|`.
fn kernel(shape: Shape) -> Kernel {
    let mut b = KernelBuilder::new(&format!("running_max_{shape:?}"));
    let n = b.scalar_param("n", ScalarType::U32);
    let start = b.scalar_param("start", ScalarType::U32);
    let init = b.scalar_param("init", ScalarType::F32);
    let x = b.buffer_param("x", DType::F32, &[Dim::Param(n)], Access::Read);
    let y = b.buffer_param("y", DType::F32, &[Dim::Param(n)], Access::Write);
    let out = b.buffer_param("out", DType::F32, &[Dim::Const(2)], Access::Write);
    b.set_grid(Dim::Const(1));
    let vars = [b.var("a", ScalarType::F32), b.var("b", ScalarType::F32)];
    let c = b.param(init);
    for v in vars {
        b.assign(v, c);
    }
    let (s, nv) = (b.param(start), b.param(n));
    b.for_range(s, nv, 1, |b, e| {
        let xv = b.load(x, e);
        let a = b.abs(xv);
        match shape {
            Shape::TwoAbs => {
                b.store(y, e, a);
                let two = b.const_f32(2.0);
                let x2 = b.mul(xv, two);
                let a2 = b.abs(x2);
                for (var, v) in [(vars[0], a), (vars[1], a2)] {
                    let cur = b.read_var(var);
                    let m = b.max(cur, v);
                    b.assign(var, m);
                }
            }
            Shape::NoAbs => {
                b.store(y, e, a);
                let cur = b.read_var(vars[0]);
                let m = b.max(cur, xv);
                b.assign(vars[0], m);
            }
            Shape::Propagate => {
                b.store(y, e, a);
                let two = b.const_f32(2.0);
                let x2 = b.mul(xv, two);
                let a2 = b.abs(x2);
                propagate(b, vars[0], a);
                propagate(b, vars[1], a2);
            }
            Shape::PropagateNoAbs => {
                b.store(y, e, a);
                propagate(b, vars[0], xv);
            }
            Shape::Sum => {
                b.store(y, e, a);
                let sq = b.mul(xv, xv);
                for (var, v) in [(vars[0], xv), (vars[1], sq)] {
                    let cur = b.read_var(var);
                    let s = b.add(cur, v);
                    b.assign(var, s);
                }
            }
            Shape::ReadTwice => {
                let cur = b.read_var(vars[0]);
                b.store(y, e, cur);
                let m = b.max(cur, a);
                b.assign(vars[0], m);
            }
        }
    });
    store_vars(&mut b, out, &vars);
    b.finish()
}

fn args(x: &[f32], start: u32, init: f32) -> Vec<OwnedArg> {
    vec![
        OwnedArg::Scalar(Scalar::U32(x.len() as u32)),
        OwnedArg::Scalar(Scalar::U32(start)),
        OwnedArg::Scalar(Scalar::F32(init.to_bits())),
        OwnedArg::Read(le_f32(x)),
        OwnedArg::Write(vec![0; 4 * x.len()]),
        OwnedArg::Write(vec![0; 8]),
    ]
}

/// Starting values: the ones where ties and NaN decide the result.
const INITS: [f32; 6] = [0.0, -0.0, f32::NAN, 1.0, -2.0, f32::INFINITY];

#[test]
fn running_reductions_match_the_interpreter() {
    let mut r = Rng(11);
    for shape in [
        Shape::TwoAbs,
        Shape::NoAbs,
        Shape::ReadTwice,
        Shape::Propagate,
        Shape::PropagateNoAbs,
        Shape::Sum,
    ] {
        let k = kernel(shape);
        for len in (0..14).chain([31, 64, 257]) {
            for start in 0..4u32.min(len as u32 + 1) {
                for init in INITS {
                    for edges in [0, 3] {
                        let x = values(len, r.next(), edges);
                        check(&k, &args(&x, start, init));
                    }
                }
            }
        }
    }
}

/// Ties between `+0` and `-0` (the only equal floats with different bits), NaN elements and a
/// maximum reached in several lanes: the cases where a split among lanes could show.
#[test]
fn ties_zeros_and_nans_match_the_interpreter() {
    let kernels = [
        Shape::TwoAbs,
        Shape::NoAbs,
        Shape::Propagate,
        Shape::PropagateNoAbs,
        Shape::Sum,
    ]
    .map(kernel);
    let cases: [&[f32]; 10] = [
        // Without `abs` the first maximum (`+0`, lane 1) and a later equal `-0` (lane 0) differ.
        &[-1.0, 0.0, -1.0, -1.0, -0.0, -1.0, -1.0, -1.0, -1.0],
        &[-0.0, 0.0, -0.0, 0.0, -0.0, 0.0, 0.0, -0.0, -0.0],
        &[f32::NAN, -0.0, f32::NAN, f32::NAN, f32::NAN],
        &[0.5, -0.5, 0.5, -0.5, 0.5, -0.5, 0.5, -0.5],
        &[f32::NAN; 9],
        &[
            -f32::INFINITY,
            1.0,
            f32::NAN,
            3e38,
            -3e38,
            1e-45,
            -1e-45,
            0.0,
        ],
        &[-1.0, -0.0, -3.0, 0.0, -2.0, -0.0, -1.0, -5.0, 0.0],
        // A NaN in one lane only, and NaNs after the maximum.
        &[1.0, f32::NAN, 1.0, 1.0, 2.0, 0.5, 0.5, 0.5, 0.5],
        &[3.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, f32::NAN, 1.0, 1.0],
        // A sum whose value depends on the order of its additions.
        &[1e8, 1.0, -1e8, 1.0, 3.0, 1e-8, -3.0, 0.5, 1e30, -1e30, 7.0],
    ];
    for x in cases {
        for start in 0..3 {
            for init in INITS {
                for k in &kernels {
                    check(k, &args(x, start, init));
                }
            }
        }
    }
}
