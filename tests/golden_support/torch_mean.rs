//! A host model of torch's CPU `float32` `mean` of a contiguous 1-D tensor on one thread, the
//! offset bitsandbytes' double quantization computes (`absmax.mean()`), written from torch's
//! source and not from our kernel: `aten/src/ATen/native/ReduceOps.cpp` (`mean_out` on CPU is
//! `at::sum_out(...).div_(numel)`), `aten/src/ATen/native/cpu/SumKernel.cpp` (`cascade_sum`,
//! `vectorized_inner_sum`, `row_sum`, `multi_row_sum`) and `aten/src/ATen/native/cpu/utils.h`
//! (`CeilLog2`). The loops below are those functions' loops, with `Vectorized<float>` of
//! `lanes` lanes as a `Vec<f32>` of that length.

/// torch's `utils::CeilLog2`: 1 for `x <= 2`, else `findLastSet(x - 1) + 1`.
fn ceil_log2(x: usize) -> usize {
    if x <= 2 {
        return 1;
    }
    (usize::BITS - (x - 1).leading_zeros()) as usize
}

/// `a += b`, lane by lane (`Vectorized<float>::operator+`).
fn vadd(a: &mut [f32], b: &[f32]) {
    for (x, y) in a.iter_mut().zip(b) {
        *x += y;
    }
}

/// `multi_row_sum<vacc_t, nrows = 4>`: `row(i, k)` is column `k` of row `i` (`size` rows), each a
/// vector of `width` lanes. Returns the 4 column sums.
// The levels are indexed as torch indexes them (acc[level][row]).
#[allow(clippy::needless_range_loop)]
fn multi_row_sum(
    size: usize,
    width: usize,
    row: impl Fn(usize, usize) -> Vec<f32>,
) -> Vec<Vec<f32>> {
    const NUM_LEVELS: usize = 4;
    const NROWS: usize = 4;
    let level_power = 4.max(ceil_log2(size) / NUM_LEVELS);
    let level_step = 1usize << level_power;
    let level_mask = level_step - 1;
    // acc[level][k], all zero.
    let mut acc = vec![vec![vec![0.0f32; width]; NROWS]; NUM_LEVELS];
    let mut i = 0;
    while i + level_step <= size {
        for _ in 0..level_step {
            for (k, a) in acc[0].iter_mut().enumerate() {
                vadd(a, &row(i, k));
            }
            i += 1;
        }
        for j in 1..NUM_LEVELS {
            for k in 0..NROWS {
                let lower = std::mem::replace(&mut acc[j - 1][k], vec![0.0; width]);
                vadd(&mut acc[j][k], &lower);
            }
            let mask = level_mask << (j * level_power);
            if i & mask != 0 {
                break;
            }
        }
    }
    while i < size {
        for (k, a) in acc[0].iter_mut().enumerate() {
            vadd(a, &row(i, k));
        }
        i += 1;
    }
    for j in 1..NUM_LEVELS {
        for k in 0..NROWS {
            let upper = acc[j][k].clone();
            vadd(&mut acc[0][k], &upper);
        }
    }
    acc.swap_remove(0)
}

/// `row_sum` (`ilp_factor = 4`): `load(i)` is element `i` of `size`, a vector of `width` lanes.
fn row_sum(size: usize, width: usize, load: impl Fn(usize) -> Vec<f32>) -> Vec<f32> {
    const ILP: usize = 4;
    let size_ilp = size / ILP;
    let mut partial = multi_row_sum(size_ilp, width, |i, k| load(i * ILP + k));
    for i in size_ilp * ILP..size {
        vadd(&mut partial[0], &load(i));
    }
    for k in 1..ILP {
        let p = partial[k].clone();
        vadd(&mut partial[0], &p);
    }
    partial.swap_remove(0)
}

/// torch's CPU `sum` of `xs` (contiguous, `float32`, one thread) with `Vectorized<float>` of
/// `lanes` lanes.
pub fn torch_sum_model(xs: &[f32], lanes: usize) -> f32 {
    let n = xs.len();
    let total = if n >= lanes {
        // vectorized_inner_sum: the vectors' row_sum, then a scalar tail, then the lanes.
        let vec_size = n / lanes;
        let vec_acc = row_sum(vec_size, lanes, |v| xs[v * lanes..(v + 1) * lanes].to_vec());
        let mut final_acc = 0.0f32;
        for x in &xs[vec_size * lanes..] {
            final_acc += x;
        }
        for p in &vec_acc {
            final_acc += p;
        }
        final_acc
    } else {
        // Fewer elements than a vector: the scalar row_sum (scalar_outer_sum with one row).
        row_sum(n, 1, |i| vec![xs[i]])[0]
    };
    // `cascade_sum` fills the output with 0 and adds the row's sum into it.
    0.0 + total
}

/// torch's CPU `mean` of `xs` on one thread: the sum, then one `f32` division by `f32(n)`
/// (`div_` by the count, a true division for `float32`). `lanes` is `Vectorized<float>::size()`
/// of the sum kernel that runs: 8 on x86 (AVX2 and AVX-512 machines alike).
pub fn torch_mean_model(xs: &[f32], lanes: usize) -> f32 {
    torch_sum_model(xs, lanes) / xs.len() as f32
}
