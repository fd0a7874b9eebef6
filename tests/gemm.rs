//! The dense products of a full-precision linear layer (`ops::gemm`: forward, `dX`, `dW`) on
//! every device present, bit for bit against the interpreter, against f64 sums, and with bad
//! inputs rejected by name.

use qforge::devices::available_devices;
use qforge::ir::DType;
use qforge::kernels::ops::{self, Layout};
use qforge::runtime::{HostTensor, InterpreterDevice};

fn data(len: usize, seed: u32) -> Vec<f32> {
    let mut s = seed | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s >> 8) as f32 / (1u32 << 23) as f32 - 1.0
        })
        .collect()
}

fn tensor(dtype: DType, shape: Vec<usize>, seed: u32) -> HostTensor {
    let n = shape.iter().product();
    HostTensor::from_f32_as(dtype, shape, &data(n, seed)).unwrap()
}

/// Asserts each element `(i, j)` of `got` (`f32 [rows, cols]`) is within `2 * count * eps`
/// times the sum of the magnitudes of its terms (`terms(i, j)`: `count` values, each product of
/// two `f32` exact in `f64`) of their `f64` sum: the style of the forward check, one more term
/// for a residual. A NaN or an infinity fails.
fn assert_near_f64(
    what: &str,
    got: &HostTensor,
    (rows, cols): (usize, usize),
    count: usize,
    terms: impl Fn(usize, usize) -> Vec<f64>,
) {
    assert_eq!(got.shape, [rows, cols], "{what}: shape");
    let g = got.to_f32().unwrap();
    for i in 0..rows {
        for j in 0..cols {
            let t = terms(i, j);
            assert_eq!(t.len(), count, "{what}: terms");
            let exact: f64 = t.iter().sum();
            let scale: f64 = t.iter().map(|v| v.abs()).sum();
            let err = (g[i * cols + j] as f64 - exact).abs();
            let bound = 2.0 * count as f64 * f32::EPSILON as f64 * scale;
            assert!(
                err <= bound,
                "{what}[{i},{j}] = {} vs f64 {exact}: error {err} above {bound}",
                g[i * cols + j]
            );
        }
    }
}

#[test]
fn linear_layer_products_are_bit_exact_on_every_device() {
    let (devices, unavailable) = available_devices();
    for u in &unavailable {
        qforge_testkit::unavailable(u.device, &u.reason);
    }
    for dtype in [DType::F32, DType::BF16] {
        for (m, k, n) in [
            (1usize, 64usize, 16usize),
            (7, 33, 10),
            (16, 130, 9),
            (64, 66, 70),
        ] {
            let x = tensor(dtype, vec![m, k], 3);
            let w = tensor(dtype, vec![n, k], 5);
            let b = tensor(dtype, vec![n], 7);
            let dy = tensor(dtype, vec![m, n], 11);
            let run = |dev: &dyn qforge::runtime::Device| {
                [
                    ops::gemm(
                        dev,
                        (&x, Layout::RowMajor),
                        (&w, Layout::RowMajor),
                        Some(&b),
                        None,
                    ),
                    ops::gemm(
                        dev,
                        (&dy, Layout::RowMajor),
                        (&w, Layout::Transposed),
                        None,
                        Some(&x),
                    ),
                    ops::gemm(
                        dev,
                        (&dy, Layout::Transposed),
                        (&x, Layout::Transposed),
                        None,
                        None,
                    ),
                ]
                .map(|r| r.unwrap())
            };
            let want = run(&InterpreterDevice);
            // With M, K and N all at least 64 the LLVM device runs its column-lanes tile
            // (`ops::gemm`'s plan); the other devices' paths are those of the smaller shapes.
            let big = m >= 64;
            for dev in devices.iter().filter(|d| !big || d.name() == "cpu-llvm") {
                let got = run(dev.as_ref());
                for (g, w) in got.iter().zip(&want) {
                    assert_eq!(g, w, "{} {dtype} {m}x{k}x{n}", dev.name());
                }
            }
            // The forward, dX and dW against f64 sums (f32 only: bf16 rounds the output).
            if dtype == DType::F32 {
                let (xf, wf, bf) = (
                    x.to_f32().unwrap(),
                    w.to_f32().unwrap(),
                    b.to_f32().unwrap(),
                );
                let y = want[0].to_f32().unwrap();
                for i in 0..m {
                    for j in 0..n {
                        let s: f64 = (0..k)
                            .map(|l| xf[i * k + l] as f64 * wf[j * k + l] as f64)
                            .sum::<f64>()
                            + bf[j] as f64;
                        let scale: f64 = (0..k)
                            .map(|l| (xf[i * k + l] * wf[j * k + l]).abs() as f64)
                            .sum::<f64>()
                            + bf[j].abs() as f64;
                        let err = (y[i * n + j] as f64 - s).abs();
                        assert!(
                            err <= 2.0 * k as f64 * f32::EPSILON as f64 * scale,
                            "y[{i},{j}] error {err}"
                        );
                    }
                }
                let dyf = dy.to_f32().unwrap();
                // dX = dY @ W (+ the residual x here): [m, k], a sum over the n outputs.
                assert_near_f64("dX", &want[1], (m, k), n + 1, |i, j| {
                    let mut t: Vec<f64> = (0..n)
                        .map(|l| dyf[i * n + l] as f64 * wf[l * k + j] as f64)
                        .collect();
                    t.push(xf[i * k + j] as f64);
                    t
                });
                // dW = dY^T @ x: [n, k], a sum over the m rows.
                assert_near_f64("dW", &want[2], (n, k), m, |i, j| {
                    (0..m)
                        .map(|l| dyf[l * n + i] as f64 * xf[l * k + j] as f64)
                        .collect()
                });
            }
        }
    }
}

/// `sum_l a(l) * b(l)` by `fma` in increasing `l` from `-0.0` (`qforge_kernels::GEMM_ORDER`), then
/// one `f32` add of `extra` (the bias or the residual).
fn sequential(len: usize, a: impl Fn(usize) -> f32, b: impl Fn(usize) -> f32, extra: f32) -> f32 {
    (0..len).fold(-0.0f32, |p, l| a(l).mul_add(b(l), p)) + extra
}

/// `B` goes to the CPU devices in panels: with 2 MiB or more (`PANELS_FROM_BYTES`, the row
/// tiles fastest: `M = 67, K = 2048, N = 260`), and smaller (the output tiles fastest:
/// `M = 67, K = 1100, N = 64`). In both, the `dX`'s `B` is given transposed with enough row tiles
/// (`PANELS_MIN_ROW_TILES`; `M = 67`: a last row tile of 3 rows), and the last panel is padded. The forward and `dX` are bit for bit the pinned order,
/// written here as a plain loop (the interpreter would take a minute at the first size).
#[test]
fn b_in_panels_is_bit_exact_on_the_cpu_devices() {
    let (devices, _) = available_devices();
    for (m, k, n) in [(67usize, 2048usize, 260usize), (67, 1100, 64)] {
        let (x, w, b, dy) = (
            tensor(DType::F32, vec![m, k], 3),
            tensor(DType::F32, vec![n, k], 5),
            tensor(DType::F32, vec![n], 7),
            tensor(DType::F32, vec![m, n], 11),
        );
        let [xf, wf, bf, dyf] = [&x, &w, &b, &dy].map(|t| t.to_f32().unwrap());
        let y_want: Vec<u32> = (0..m * n)
            .map(|e| {
                let (i, j) = (e / n, e % n);
                sequential(k, |l| xf[i * k + l], |l| wf[j * k + l], bf[j]).to_bits()
            })
            .collect();
        let dx_want: Vec<u32> = (0..m * k)
            .map(|e| {
                let (i, c) = (e / k, e % k);
                sequential(n, |l| dyf[i * n + l], |l| wf[l * k + c], xf[e]).to_bits()
            })
            .collect();
        let bits = |t: HostTensor| -> Vec<u32> {
            t.to_f32().unwrap().iter().map(|v| v.to_bits()).collect()
        };
        let mut ran = 0;
        for dev in devices
            .iter()
            .filter(|d| d.name() == "cpu" || d.name() == "cpu-llvm")
        {
            let dev = dev.as_ref();
            let y = ops::gemm(
                dev,
                (&x, Layout::RowMajor),
                (&w, Layout::RowMajor),
                Some(&b),
                None,
            );
            assert!(
                bits(y.unwrap()) == y_want,
                "{} {m}x{k}x{n}: forward",
                dev.name()
            );
            let dx = ops::gemm(
                dev,
                (&dy, Layout::RowMajor),
                (&w, Layout::Transposed),
                None,
                Some(&x),
            );
            assert!(
                bits(dx.unwrap()) == dx_want,
                "{} {m}x{k}x{n}: dX",
                dev.name()
            );
            ran += 1;
        }
        assert!(ran >= 1, "the Cranelift CPU device is always built");
    }
}

#[test]
fn bad_inputs_name_the_problem() {
    let dev = InterpreterDevice;
    let x = tensor(DType::F32, vec![3, 8], 1);
    let w = tensor(DType::F32, vec![4, 8], 2);
    let cases: Vec<(Result<HostTensor, qforge::runtime::Error>, &str)> = vec![
        (
            ops::gemm(
                &dev,
                (&x, Layout::RowMajor),
                (&tensor(DType::BF16, vec![4, 8], 2), Layout::RowMajor),
                None,
                None,
            ),
            "same float dtype",
        ),
        (
            ops::gemm(
                &dev,
                (&x, Layout::RowMajor),
                (&tensor(DType::F32, vec![2, 4, 8], 2), Layout::RowMajor),
                None,
                None,
            ),
            "must be 2-D",
        ),
        (
            ops::gemm(
                &dev,
                (&x, Layout::RowMajor),
                (&w, Layout::Transposed),
                None,
                None,
            ),
            "they must match",
        ),
        (
            ops::gemm(
                &dev,
                (&x, Layout::RowMajor),
                (&w, Layout::RowMajor),
                Some(&tensor(DType::F32, vec![3], 4)),
                None,
            ),
            "bias must be",
        ),
        (
            ops::gemm(
                &dev,
                (
                    &HostTensor::new(DType::I8, vec![3, 8], vec![0; 24]).unwrap(),
                    Layout::RowMajor,
                ),
                (&w, Layout::RowMajor),
                None,
                None,
            ),
            "A must be f32",
        ),
        (
            ops::gemm(
                &dev,
                (&x, Layout::RowMajor),
                (&w, Layout::RowMajor),
                None,
                Some(&x),
            ),
            "residual must be",
        ),
    ];
    for (r, want) in cases {
        let e = r.expect_err(want).to_string();
        assert!(e.contains(want), "{e:?} does not say {want:?}");
    }
}
