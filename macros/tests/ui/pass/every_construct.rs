//! Every construct of the kernel language in one kernel, built and run on the interpreter.
use qforge_ir::dsl::*;
use qforge_ir::{NanMode, ReduceOrder, Rounding};
use qforge_macros::{func, kernel};

#[func]
fn clamp01(v: Val<f32>) -> Val<f32> {
    min(max(v, 0.0), 1.0)
}

#[func]
fn count_up(limit: Scalar<u32>, total: Var<u32>) {
    for k in val(0u32)..limit {
        total += k & 1u32;
    }
}

#[kernel(name = "every_{width}", grid = rows)]
fn every(
    #[config] width: u32,
    #[config] with_bias: bool,
    rows: u32,
    bias: f32,
    #[shape(rows, width)] x: In<f32>,
    #[shape(width)] w: In<f32>,
    #[shape(rows)] y: Out<f32>,
    #[shape(rows)] codes: Out<u32>,
    #[shape(rows)] odd: Out<u32>,
    #[shape(rows)] #[dtype(qforge_ir::DType::BF16)] half: Out<Float>,
    #[when(with_bias)] #[shape(rows)] extra: In<f32>,
) {
    let r = work_item();
    let start = r * width;
    let mut acc: f32;
    #[accumulate(ReduceOrder::Strided(4))]
    for k in 0..width {
        let e = start + k;
        acc = sum(x[e] * w[k]);
    }
    let mut total = fma(acc, 2.0, bias);
    if with_bias {
        match extra {
            Some(b) => total = total + b[r],
            None => {}
        }
    }
    let amax = reduce_absmax(x, start, width, NanMode::Ignore);
    let s = reduce_sum(x, start, width, ReduceOrder::Sequential);
    total += select(amax > s, 0.5, -0.5);
    y[r] = clamp01(total);
    let table = table_f32("steps", &[0.25, 0.5, 0.75]);
    codes[r] = search_sorted(table, clamp01(total)) + (r % 2u32);
    let mut n_odd = 0u32;
    count_up(rows, n_odd);
    odd[r] = n_odd;
    #[comptime]
    let mut unrolled = val(0.0f32);
    for k in 0..comptime!(width.min(3)) {
        unrolled = unrolled + x[start + k].abs().sqrt();
    }
    if unrolled.to_bits() != 0u32 {
        store_rounded(half, r, unrolled, Rounding::NearestEven);
    } else {
        store_rounded(half, r, -1.0, Rounding::NearestEven);
    }
}

fn main() {
    let k = every(4, false).expect("builds");
    assert_eq!(k.kernel().name, "every_4");
    let x = [1.0f32, -2.0, 3.0, 0.5, 0.25, 0.25, 0.0, 0.0];
    let w = [0.5f32, 0.25, -1.0, 2.0];
    let (mut y, mut codes, mut odd) = ([0f32; 2], [0u32; 2], [0u32; 2]);
    let mut half = [0u8; 4];
    let mut args = EveryArgs {
        rows: 2,
        bias: 0.625,
        x: &x,
        w: &w,
        y: &mut y,
        codes: &mut codes,
        odd: &mut odd,
        half: FloatOut { dtype: qforge_ir::DType::BF16, bytes: &mut half },
        extra: None,
    };
    let mut list = k.args(&mut args).expect("arguments bind");
    qforge_ir::interp::run(k.kernel(), &mut list).expect("runs");
    drop(list);
    // Row 0: dot = (0.5 - 3) + (-0.5 + 1) = -2, fma(-2, 2, 0.625) = -3.375, absmax 3 > sum 2.5
    // adds 0.5: clamped to 0, code 0 + 0. Row 1: dot = 0.1875, total 1.0, absmax 0.25 < sum 0.5
    // adds -0.5: 0.5, code 1 (one step below 0.5) + 1.
    assert_eq!(y, [0.0, 0.5]);
    assert_eq!(codes, [0, 2]);
    // Each work item counts the odd k in 0..rows.
    assert_eq!(odd, [1, 1]);
    // bf16 of 1 + sqrt 2 + sqrt 3 = 4.146264 (0x4085 after rounding) and of 0.5 + 0.5 + 0 = 1.
    assert_eq!(half, [0x85, 0x40, 0x80, 0x3f]);
    assert!(every(4, true).is_ok());
}
