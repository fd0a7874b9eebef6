//! The baselines a bench case is compared with: [`memcpy_baseline`] (a host copy of the bytes a
//! kernel moves) and [`fp32_gemm_baseline`] (an fp32 GEMM/GEMV of a linear layer's shape, from
//! the `gemm` crate), plus the plain [`fp32_gemm`] / [`fp32_matmul`] they time.

use qforge_runtime::Device;

use crate::error::Result;

use super::{Baseline, Runner};

/// Name of the memcpy baseline in bench output.
pub const MEMCPY: &str = "memcpy";

/// Name of the fp32 GEMM baseline in bench output.
pub const FP32_GEMM: &str = "fp32_gemm";

/// A host `memcpy` of `bytes` bytes from one buffer to another (both allocated and touched on the
/// untimed warm-up call, then reused). For now this is a host copy on every device, a GPU device
/// included (a device-to-device copy needs device buffers the `Device` trait does not expose yet).
pub fn memcpy_baseline(bytes: usize) -> Baseline {
    let mut buffers: Option<(Vec<u8>, Vec<u8>)> = None;
    let run: Runner = Box::new(move |_dev| {
        let (src, dst) = buffers.get_or_insert_with(|| (vec![1u8; bytes], vec![0u8; bytes]));
        dst.copy_from_slice(std::hint::black_box(src));
        std::hint::black_box(dst);
        Ok(())
    });
    Baseline {
        name: MEMCPY.to_string(),
        run,
    }
}

/// The threads a host baseline runs on next to `dev`: a CPU device's
/// [`Caps::parallel_threads`](qforge_runtime::Caps::parallel_threads) (its pool: `--threads`,
/// else every core; 1 on the sequential interpreter), or 0 on a GPU device (0 = every thread
/// of rayon's global pool, as [`fp32_matmul`] reads it).
pub fn host_threads(dev: &dyn Device) -> usize {
    let caps = dev.caps();
    if caps.is_gpu() {
        0
    } else {
        caps.parallel_threads.max(1) as usize
    }
}

/// `C = A @ B^T` in fp32 for `A` `[m, k]` and `B` `[n, k]` (what a linear layer with `n` output
/// features computes for `m` rows), on buffers allocated and filled on the untimed warm-up call.
/// With `m = 1` it is the GEMV of single-token decoding.
///
/// Threads: the device's own ([`host_threads`]), so the GEMM and the kernel run on the same
/// number of threads. The `gemm` crate splits the work into that many rayon tasks on rayon's
/// global pool (`RAYON_NUM_THREADS`, else every core: the CPU device's default too), and may
/// use fewer for a small product.
pub fn fp32_gemm_baseline(m: usize, k: usize, n: usize) -> Baseline {
    let mut buffers: Option<(Vec<f32>, Vec<f32>, Vec<f32>)> = None;
    let run: Runner = Box::new(move |dev| {
        if buffers.is_none() {
            let (mk, nk, mn) = (dims(m, k)?, dims(n, k)?, dims(m, n)?);
            buffers = Some((pseudo_random(mk, 1), pseudo_random(nk, 2), vec![0.0f32; mn]));
        }
        if let Some((a, b, c)) = buffers.as_mut() {
            fp32_matmul(a, b, c, (m, k, n), BLayout::Transposed, host_threads(dev))?;
            std::hint::black_box(c);
        }
        Ok(())
    });
    Baseline {
        name: FP32_GEMM.to_string(),
        run,
    }
}

/// `C = A @ B^T` in fp32: `A` is `[m, k]`, `B` is `[n, k]` and `C` is `[m, n]`, all row-major
/// and contiguous, as a linear layer `y = x @ W^T` with `x = A`, `W = B`. `C` is overwritten.
/// Runs the `gemm` crate's kernels (SIMD, multithreaded with rayon on every thread of rayon's
/// global pool; `m = 1` takes its GEMV path). The sums are fp32 in the crate's own order, so
/// results differ from a sequential sum by rounding only: within
/// `k * f32::EPSILON * sum_l |A[i,l] * B[j,l]|` of the exact value.
///
/// # Errors
/// [`qforge_runtime::Error::Invalid`] (wrapped in [`crate::Error::Runtime`]) when a slice length
/// is not the product of its dimensions or a product overflows.
pub fn fp32_gemm(a: &[f32], b: &[f32], c: &mut [f32], m: usize, k: usize, n: usize) -> Result<()> {
    fp32_matmul(a, b, c, (m, k, n), BLayout::Transposed, 0)
}

/// How [`fp32_matmul`]'s `B` is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BLayout {
    /// `B` is `[n, k]` and the product is `A @ B^T` (a linear layer's forward `x @ W^T`).
    Transposed,
    /// `B` is `[k, n]` and the product is `A @ B` (a linear layer's input gradient `dY @ W`,
    /// `W` `[N, K]` read as the `[k, n]` operand with `k = N`, `n = K`).
    Plain,
}

/// `C[m, n] = A[m, k] @ op(B)` in fp32 with `op(B)` as `layout` says, all row-major and
/// contiguous, `C` overwritten, on `threads` rayon tasks (0: every thread of rayon's global
/// pool; more tasks than the pool has threads run on the pool's threads). Same kernels and
/// rounding as [`fp32_gemm`].
///
/// # Errors
/// As [`fp32_gemm`].
pub fn fp32_matmul(
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
    (m, k, n): (usize, usize, usize),
    layout: BLayout,
    threads: usize,
) -> Result<()> {
    check_len("A", a.len(), m, k)?;
    match layout {
        BLayout::Transposed => check_len("B", b.len(), n, k)?,
        BLayout::Plain => check_len("B", b.len(), k, n)?,
    }
    check_len("C", c.len(), m, n)?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        c.fill(0.0);
        return Ok(());
    }
    let (k_stride, n_stride) = (stride(k)?, stride(n)?);
    // `op(B)` is `[k, n]`: (column stride, row stride) of that view.
    let (b_cs, b_rs) = match layout {
        BLayout::Transposed => (k_stride, 1),
        BLayout::Plain => (1, n_stride),
    };
    // SAFETY: the lengths were checked above: every element the strides reach is in bounds
    // (A: (m-1)*k + (k-1) < m*k; B transposed, read as B^T [k, n] with row stride 1 and column
    // stride k: (k-1) + (n-1)*k < n*k; B plain [k, n]: (k-1)*n + (n-1) < k*n; C: (m-1)*n +
    // (n-1) < m*n), C does not alias A or B (a `&mut`), and the element type is f32, which the
    // crate supports.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            n_stride,
            false,
            a.as_ptr(),
            1,
            k_stride,
            b.as_ptr(),
            b_cs,
            b_rs,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::Rayon(threads),
        );
    }
    Ok(())
}

/// Checks `len == rows * cols`.
fn check_len(what: &str, len: usize, rows: usize, cols: usize) -> Result<()> {
    match rows.checked_mul(cols) {
        Some(want) if want == len => Ok(()),
        Some(want) => Err(invalid(format!(
            "fp32_gemm: {what} has {len} elements, its shape [{rows}, {cols}] needs {want}"
        ))),
        None => Err(invalid(format!(
            "fp32_gemm: {what} shape [{rows}, {cols}] overflows the element count"
        ))),
    }
}

/// `rows * cols`, checked.
fn dims(rows: usize, cols: usize) -> Result<usize> {
    rows.checked_mul(cols).ok_or_else(|| {
        invalid(format!(
            "fp32_gemm: shape [{rows}, {cols}] overflows the element count"
        ))
    })
}

/// A dimension as a stride.
fn stride(d: usize) -> Result<isize> {
    isize::try_from(d).map_err(|_| invalid(format!("fp32_gemm: dimension {d} is too large")))
}

fn invalid(message: String) -> crate::Error {
    qforge_runtime::Error::Invalid(message).into()
}

/// `len` values in [-1, 1) from a xorshift generator seeded by `seed`.
pub(crate) fn pseudo_random(len: usize, seed: u64) -> Vec<f32> {
    let mut s = 0x9e37_79b9_7f4a_7c15u64 ^ seed.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use qforge_runtime::InterpreterDevice;

    /// `C = A @ B^T` summed in f64, and the per-element error bound `k * eps * sum |a*b|`.
    fn naive(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> (Vec<f64>, Vec<f64>) {
        let mut c = vec![0.0f64; m * n];
        let mut bound = vec![0.0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                for l in 0..k {
                    let p = f64::from(a[i * k + l]) * f64::from(b[j * k + l]);
                    c[i * n + j] += p;
                    bound[i * n + j] += p.abs();
                }
                bound[i * n + j] *= k as f64 * f64::from(f32::EPSILON);
            }
        }
        (c, bound)
    }

    #[test]
    fn fp32_gemm_matches_a_naive_f64_loop() {
        // m = 1 (the GEMV path), odd sizes that are not multiples of any SIMD width, a tall one.
        for &(m, k, n) in &[
            (1, 1, 1),
            (1, 257, 129),
            (3, 5, 7),
            (17, 64, 33),
            (64, 130, 1),
            (65, 31, 66),
        ] {
            let a = pseudo_random(m * k, 7);
            let b = pseudo_random(n * k, 8);
            let mut c = vec![f32::NAN; m * n];
            fp32_gemm(&a, &b, &mut c, m, k, n).expect("valid shapes");
            let (want, bound) = naive(&a, &b, m, k, n);
            for (idx, ((&got, &w), &tol)) in c.iter().zip(&want).zip(&bound).enumerate() {
                assert!(
                    (f64::from(got) - w).abs() <= tol,
                    "({m},{k},{n}) element {idx}: got {got}, want {w} within {tol}"
                );
            }
        }
    }

    #[test]
    fn fp32_gemm_is_a_times_b_transposed() {
        // A = [[1, 2]], B = [[1, 0], [0, 1], [3, 4]]: C = [[1, 2, 11]] (B^T, not B).
        let mut c = vec![0.0; 3];
        fp32_gemm(
            &[1.0, 2.0],
            &[1.0, 0.0, 0.0, 1.0, 3.0, 4.0],
            &mut c,
            1,
            2,
            3,
        )
        .expect("valid");
        assert_eq!(c, vec![1.0, 2.0, 11.0]);
        // k = 0: C is all zeros, whatever it held.
        let mut c = vec![5.0; 4];
        fp32_gemm(&[], &[], &mut c, 2, 0, 2).expect("valid");
        assert_eq!(c, vec![0.0; 4]);
    }

    #[test]
    fn fp32_matmul_plain_is_a_times_b() {
        // A = [[1, 2]], B = [[1, 0, 3], [0, 1, 4]] ([k = 2, n = 3]): C = [[1, 2, 11]].
        for threads in [0, 1, 3] {
            let mut c = vec![0.0; 3];
            fp32_matmul(
                &[1.0, 2.0],
                &[1.0, 0.0, 3.0, 0.0, 1.0, 4.0],
                &mut c,
                (1, 2, 3),
                BLayout::Plain,
                threads,
            )
            .expect("valid");
            assert_eq!(c, vec![1.0, 2.0, 11.0], "{threads} threads");
        }
        // A plain B is the transposed one's transpose: the same product, odd sizes.
        let (m, k, n) = (19, 37, 23);
        let a = pseudo_random(m * k, 3);
        let bt = pseudo_random(n * k, 4);
        let mut b = vec![0.0; k * n];
        for j in 0..n {
            for l in 0..k {
                b[l * n + j] = bt[j * k + l];
            }
        }
        let mut c = vec![0.0; m * n];
        fp32_matmul(&a, &b, &mut c, (m, k, n), BLayout::Plain, 2).expect("valid");
        let (want, bound) = naive(&a, &bt, m, k, n);
        for ((&got, &w), &tol) in c.iter().zip(&want).zip(&bound) {
            assert!((f64::from(got) - w).abs() <= tol, "got {got}, want {w}");
        }
        let e =
            fp32_matmul(&a, &b[1..], &mut c, (m, k, n), BLayout::Plain, 0).expect_err("B is short");
        assert!(e.to_string().contains("B has"), "{e}");
    }

    #[test]
    fn fp32_gemm_rejects_wrong_lengths() {
        let mut c = vec![0.0; 4];
        let e = fp32_gemm(&[0.0; 5], &[0.0; 6], &mut c, 2, 3, 2).expect_err("A is short");
        assert!(e.to_string().contains("A has 5 elements"), "{e}");
        let e = fp32_gemm(&[0.0; 6], &[0.0; 6], &mut c[..3], 2, 3, 2).expect_err("C is short");
        assert!(e.to_string().contains("C has 3 elements"), "{e}");
        let e = fp32_gemm(&[], &[], &mut [], usize::MAX, 2, 0).expect_err("overflow");
        assert!(e.to_string().contains("overflows"), "{e}");
    }

    #[test]
    fn baselines_run_and_keep_their_names() {
        let dev = InterpreterDevice;
        let mut copy = memcpy_baseline(1000);
        assert_eq!(copy.name, MEMCPY);
        (copy.run)(&dev).expect("memcpy runs");
        (copy.run)(&dev).expect("memcpy runs again");
        let mut g = fp32_gemm_baseline(1, 64, 32);
        assert_eq!(g.name, FP32_GEMM);
        (g.run)(&dev).expect("gemm runs");
        let mut bad = fp32_gemm_baseline(usize::MAX, 2, 2);
        assert!((bad.run)(&dev).is_err(), "an overflowing shape is an error");
    }
}
