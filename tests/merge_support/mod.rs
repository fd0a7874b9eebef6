//! The exact-merge bound of `docs/adapters.md` ("Exact merge"), shared by `tests/adapter.rs`
//! and `tests/finetune.rs`.
#![allow(clippy::neg_cmp_op_on_partial_ord)] // `!(diff <= bound)`: a NaN fails

use qforge::kernels::adapter::BottleneckAdapter;
use qforge::runtime::HostTensor;

/// Compares, element by element, `y` (the linear adapter after the layer `x W^T + b`) with `y2`
/// (the merged layer `x W2^T + b2`): both are `f32` evaluations of one exact value,
/// `y = (I + U D)(W x + b) + U b_d + b_u`, so each must be within `2 (K + d + r + 4) eps` times
/// the sum of the magnitudes of all its terms. `x` is `[M, K]`, `w` `[d, K]`, `b` `[d]`, `y` and
/// `y2` `[M, d]`, all `f32`. Returns the worst difference / bound.
///
/// # Errors
/// The first element above the bound (or NaN), named with its row and column.
pub fn merged_within_bound(
    x: &HostTensor,
    w: &HostTensor,
    b: &HostTensor,
    a: &BottleneckAdapter,
    y: &HostTensor,
    y2: &HostTensor,
) -> Result<f64, String> {
    let f = |t: &HostTensor| t.to_f32().expect("f32 tensor");
    let (xf, wf, bf, yf, y2f) = (f(x), f(w), f(b), f(y), f(y2));
    let (df, dbf, uf, ubf) = (
        f(&a.down_weight),
        f(&a.down_bias),
        f(&a.up_weight),
        f(&a.up_bias),
    );
    let (d, k) = (w.shape[0], w.shape[1]);
    let (r, m) = (dbf.len(), x.shape[0]);
    // |D| |W| ([r, k]) and |D| |b| + |b_d| ([r]).
    let mut dw_abs = vec![0.0f64; r * k];
    let mut db_abs = vec![0.0f64; r];
    for q in 0..r {
        for j in 0..d {
            let dq = df[q * d + j].abs() as f64;
            for l in 0..k {
                dw_abs[q * k + l] += dq * wf[j * k + l].abs() as f64;
            }
            db_abs[q] += dq * bf[j].abs() as f64;
        }
        db_abs[q] += dbf[q].abs() as f64;
    }
    let factor = 2.0 * (k + d + r + 4) as f64 * f32::EPSILON as f64;
    let mut worst = 0.0f64;
    for j in 0..d {
        // |W| + |U| |D| |W| per weight, |b| + |b_u| + |U| (|D| |b| + |b_d|) for the bias.
        let w_abs: Vec<f64> = (0..k)
            .map(|l| {
                wf[j * k + l].abs() as f64
                    + (0..r)
                        .map(|q| uf[j * r + q].abs() as f64 * dw_abs[q * k + l])
                        .sum::<f64>()
            })
            .collect();
        let b_abs = bf[j].abs() as f64
            + ubf[j].abs() as f64
            + (0..r)
                .map(|q| uf[j * r + q].abs() as f64 * db_abs[q])
                .sum::<f64>();
        for i in 0..m {
            let mag = (0..k)
                .map(|l| xf[i * k + l].abs() as f64 * w_abs[l])
                .sum::<f64>()
                + b_abs;
            let bound = factor * mag;
            let (u, v) = (yf[i * d + j], y2f[i * d + j]);
            let diff = (u as f64 - v as f64).abs();
            if !(diff <= bound) {
                return Err(format!(
                    "y[{i},{j}]: merged {v} vs unmerged {u}, difference {diff:e} above the bound \
                     {bound:e}"
                ));
            }
            worst = worst.max(diff / bound);
        }
    }
    Ok(worst)
}
