//! The kernel language (`#[qforge_macros::kernel]` over `qforge_ir::dsl`): a verifier error
//! points at the user's source line, typed arguments bind by name and check sizes and dtypes
//! naming the parameter, optional parameters follow the variant, build-time arithmetic has the
//! IR's semantics, and macro kernels run on the interpreter as their Rust meaning says.

use proptest::prelude::*;
use qforge_ir::dsl::*;
use qforge_ir::{interp, DType, Error, ReduceOrder, Rounding};
use qforge_macros::kernel;

#[kernel(name = "axpy_{dtype}", grid = n)]
fn axpy(
    #[config] dtype: DType,
    #[config] rounding: Rounding,
    n: u32,
    a: f32,
    #[shape(n)] x: In<f32>,
    #[shape(n)]
    #[dtype(dtype)]
    y: InOut<Float>,
) {
    let i = work_item();
    let v = fma(a, x[i], y[i]);
    store_rounded(y, i, v, rounding);
}

/// The line of `store_rounded` in `axpy` above (the verifier rejects a directed rounding into
/// bf16, which the Rust types cannot see).
const STORE_LINE: u32 = 24;

#[test]
fn a_verifier_error_points_at_the_users_line() {
    assert!(axpy(DType::BF16, Rounding::NearestEven).is_ok());
    assert!(
        axpy(DType::F32, Rounding::Up).is_ok(),
        "f32 needs no rounding"
    );
    let e = axpy(DType::BF16, Rounding::Up).unwrap_err();
    let Error::Verify { errors, .. } = &e else {
        panic!("expected a verifier error, got {e}");
    };
    let at = format!("tests/dsl.rs:{STORE_LINE}:");
    assert!(
        errors.iter().any(|v| v.location.contains(&at)),
        "no error located at {at}: {e}"
    );
}

#[test]
fn typed_arguments_bind_by_name_and_run() {
    let k = axpy(DType::F32, Rounding::NearestEven).unwrap();
    let x = [1.0f32, 2.0, 3.0];
    let mut y = [0.5f32, 0.25, -1.0];
    let mut args = AxpyArgs {
        n: 3,
        a: 2.0,
        x: &x,
        y: FloatOut::f32(&mut y),
    };
    let mut list = k.args(&mut args).unwrap();
    interp::run(k.kernel(), &mut list).unwrap();
    assert_eq!(y, [2.5, 4.25, 5.0]);
}

#[test]
fn half_precision_arguments_carry_their_dtype() {
    use half::{bf16, f16};
    let x = [1.0f32, 2.0, 3.0];
    let mut yb = [
        bf16::from_f32(0.5),
        bf16::from_f32(0.25),
        bf16::from_f32(-1.0),
    ];
    let k = axpy(DType::BF16, Rounding::NearestEven).unwrap();
    let mut args = AxpyArgs {
        n: 3,
        a: 2.0,
        x: &x,
        y: FloatOut::bf16(&mut yb),
    };
    let mut list = k.args(&mut args).unwrap();
    interp::run(k.kernel(), &mut list).unwrap();
    assert_eq!(yb.map(bf16::to_f32), [2.5, 4.25, 5.0]);
    // f16 bytes for a bf16 kernel name the parameter; FloatIn carries its dtype too.
    let mut yh = [f16::ZERO; 3];
    let mut args = AxpyArgs {
        n: 3,
        a: 2.0,
        x: &x,
        y: FloatOut::f16(&mut yh),
    };
    let e = k.args(&mut args).unwrap_err().to_string();
    assert!(e.contains("parameter 'y'") && e.contains("got f16"), "{e}");
    // A positional list one short names the first parameter without an argument.
    let mut y = [bf16::ZERO; 3];
    let mut args = AxpyArgs {
        n: 3,
        a: 2.0,
        x: &x,
        y: FloatOut::bf16(&mut y),
    };
    let mut list = k.args(&mut args).unwrap();
    list.pop();
    let e = interp::run(k.kernel(), &mut list).unwrap_err().to_string();
    assert!(e.contains("parameter 'y'") && e.contains("missing"), "{e}");
    let xs = [f16::ONE; 2];
    assert_eq!(FloatIn::f16(&xs).dtype, DType::F16);
    assert_eq!(FloatIn::bf16(&[bf16::ONE; 2]).bytes.len(), 4);
}

#[test]
fn typed_argument_mistakes_name_the_parameter() {
    let k = axpy(DType::BF16, Rounding::NearestEven).unwrap();
    let x = [1.0f32; 4];
    let mut y = [0u8; 6];
    // Three bf16 elements where `n` says four.
    let mut args = AxpyArgs {
        n: 4,
        a: 1.0,
        x: &x,
        y: FloatOut {
            dtype: DType::BF16,
            bytes: &mut y,
        },
    };
    let e = k.args(&mut args).unwrap_err().to_string();
    assert!(
        e.contains("parameter 'y'") && e.contains("4 bf16 elements"),
        "{e}"
    );
    // f32 bytes for a kernel built for bf16.
    let mut y32 = [0f32; 4];
    let mut args = AxpyArgs {
        n: 4,
        a: 1.0,
        x: &x,
        y: FloatOut::f32(&mut y32),
    };
    let e = k.args(&mut args).unwrap_err().to_string();
    assert!(
        e.contains("parameter 'y'") && e.contains("built for bf16"),
        "{e}"
    );
}

#[kernel(name = "bias_{with_bias}", grid = n)]
fn maybe_bias(
    #[config] with_bias: bool,
    n: u32,
    #[shape(n)] x: In<f32>,
    #[when(with_bias)] scale: f32,
    #[when(with_bias)]
    #[shape(n)]
    bias: In<f32>,
    #[shape(n)] y: Out<f32>,
) {
    let i = work_item();
    let mut v = x[i];
    match (scale, bias) {
        (Some(s), Some(b)) => v = fma(read(s), v, b[i]),
        _ => {}
    }
    y[i] = v;
}

#[test]
fn optional_parameters_follow_the_variant() {
    let x = [1.0f32, -2.0];
    let bias = [0.5f32, 0.5];
    let mut y = [0f32; 2];
    let with = maybe_bias(true).unwrap();
    assert_eq!(with.kernel().params.len(), 5);
    let mut args = MaybeBiasArgs {
        n: 2,
        x: &x,
        scale: Some(3.0),
        bias: Some(&bias),
        y: &mut y,
    };
    interp::run(with.kernel(), &mut with.args(&mut args).unwrap()).unwrap();
    assert_eq!(y, [3.5, -5.5]);
    let without = maybe_bias(false).unwrap();
    assert_eq!(without.kernel().params.len(), 3);
    let mut args = MaybeBiasArgs {
        n: 2,
        x: &x,
        scale: Some(3.0),
        bias: None,
        y: &mut y,
    };
    let e = without.args(&mut args).unwrap_err().to_string();
    assert!(e.contains("'scale'") && e.contains("pass None"), "{e}");
    let mut args = MaybeBiasArgs {
        n: 2,
        x: &x,
        scale: Some(3.0),
        bias: None,
        y: &mut y,
    };
    let e = with.args(&mut args).unwrap_err().to_string();
    assert!(e.contains("'bias'") && e.contains("pass Some"), "{e}");
}

/// Build-time operands: two Rust values are computed by Rust with the IR's semantics; a Rust
/// value meeting an IR value becomes a constant.
#[kernel(grid = n)]
fn comptime_ops(#[config] d: u32, n: u32, #[shape(n)] y: Out<u32>) {
    let i = work_item();
    let q = 7u32 / d;
    let r = 7u32 % d;
    let s = 1u32 << 33u32;
    let w = 0u32 - 1u32;
    y[i] = i + (q + r + s + w);
}

#[test]
fn build_time_arithmetic_has_the_ir_semantics() {
    // d = 0: 7 / 0 = 0 and 7 % 0 = 0 as in the IR; 1 << 33 = 2 (shift & 31); 0 - 1 wraps.
    let k = comptime_ops(0).unwrap();
    let mut y = [0u32; 2];
    let mut args = ComptimeOpsArgs { n: 2, y: &mut y };
    interp::run(k.kernel(), &mut k.args(&mut args).unwrap()).unwrap();
    assert_eq!(y, [1, 2]);
    // One constant and one add per work item: the build-time sum is folded.
    let text = qforge_ir::text::print(k.kernel());
    assert_eq!(text.matches("const").count(), 1, "{text}");
}

#[kernel(grid = rows)]
fn row_dot(
    #[config] order: ReduceOrder,
    rows: u32,
    k: u32,
    #[shape(rows, k)] a: In<f32>,
    #[shape(k)] w: In<f32>,
    #[shape(rows)] y: Out<f32>,
) {
    let r = work_item();
    let base = r * k;
    let mut s: f32;
    #[accumulate(order)]
    for j in 0..k {
        s = sum(a[base + j] * w[j]);
    }
    y[r] = s;
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Typed arguments bind for random sizes; a wrong length names the parameter.
    #[test]
    fn typed_arguments_bind_for_random_sizes(rows in 0u32..6, k in 0u32..9, extra in 1usize..3) {
        let kern = row_dot(ReduceOrder::Strided(4)).unwrap();
        let a: Vec<f32> = (0..rows * k).map(|i| i as f32 * 0.5 - 3.0).collect();
        let w: Vec<f32> = (0..k).map(|i| 1.0 - i as f32).collect();
        let mut y = vec![0f32; rows as usize];
        let mut args = RowDotArgs { rows, k, a: &a, w: &w, y: &mut y };
        let mut list = kern.args(&mut args).unwrap();
        interp::run(kern.kernel(), &mut list).unwrap();
        drop(list);
        for r in 0..rows as usize {
            let exact: f64 = (0..k as usize).map(|j| a[r * k as usize + j] as f64 * w[j] as f64).sum();
            // Small integers and halves: every partial sum is exact in f32.
            prop_assert_eq!(y[r] as f64, exact);
        }
        let long_w: Vec<f32> = vec![0.0; k as usize + extra];
        let mut args = RowDotArgs { rows, k, a: &a, w: &long_w, y: &mut y };
        let e = kern.args(&mut args).unwrap_err().to_string();
        prop_assert!(e.contains("parameter 'w'"), "{}", e);
    }
}
