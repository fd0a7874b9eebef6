//! Bench case of the bottleneck adapter: one forward and backward pass
//! (`BottleneckAdapter::forward` + `backward`, GELU, `beta = 0.5`) at `d = 4096`, `r = 64`,
//! `M = 512`, against the six fp32 GEMMs it consists of (`fp32_gemm`: `z = h D^T`,
//! `y = a U^T`, `dU = dy^T a`, `da = dy U`, `dD = dz^T h`, `dh = dz D`, from the `gemm` crate on
//! operands transposed beforehand, untimed) and a memcpy of the bytes the products move.

use qforge_ir::DType;
use qforge_kernels::activation::Act;
use qforge_kernels::adapter::{AdapterCache, BottleneckAdapter};
use qforge_runtime::{Device, HostTensor};

use super::baselines::{fp32_gemm, memcpy_baseline, pseudo_random, FP32_GEMM};
use super::cases::CaseSize;
use super::{Baseline, BenchCase, Runner};
use crate::error::Result;

/// `(d, r, M)` of the case on a compiled device.
pub const SHAPE: (usize, usize, usize) = (4096, 64, 512);
/// `(d, r, M)` on the interpreter (scaled down).
pub const INTERPRETER_SHAPE: (usize, usize, usize) = (256, 16, 32);

/// The adapter case for a device of this size class.
pub fn adapter_cases(size: CaseSize) -> Vec<BenchCase> {
    let (d, r, m) = match size {
        CaseSize::Full => SHAPE,
        CaseSize::Interpreter => INTERPRETER_SHAPE,
        CaseSize::Elements(n) => (n.clamp(1, 4096), 4, 8),
    };
    // Every product reads its two operands and writes its output once.
    let bytes = 4 * 6 * (m * d + r * d + m * r);
    let mut state: Option<(BottleneckAdapter, HostTensor, HostTensor)> = None;
    let run: Runner = Box::new(move |dev: &dyn Device| {
        if state.is_none() {
            state = Some(prepare(d, r, m)?);
        }
        if let Some((a, h, dy)) = &state {
            let (_, cache): (_, AdapterCache) = a.forward(dev, Act::Gelu, h, 0.5)?;
            std::hint::black_box(a.backward(dev, Act::Gelu, h, &cache, dy, 0.5)?);
        }
        Ok(())
    });
    let mut shape = format!("d={d},r={r},M={m}");
    if size == CaseSize::Interpreter {
        shape.push_str(" (interpreter: scaled down)");
    }
    vec![
        BenchCase::new("adapter_fwd_bwd", shape, DType::F32, bytes, run)
            .baseline(gemms_baseline(d, r, m))
            .baseline(memcpy_baseline(bytes)),
    ]
}

fn tensor(shape: Vec<usize>, seed: u64) -> Result<HostTensor> {
    let n = shape.iter().product();
    Ok(HostTensor::from_f32_as(
        DType::F32,
        shape,
        &pseudo_random(n, seed),
    )?)
}

/// A random adapter (non-zero `up`, so every product does work), `h` and `dy`.
fn prepare(d: usize, r: usize, m: usize) -> Result<(BottleneckAdapter, HostTensor, HostTensor)> {
    let a = BottleneckAdapter {
        down_weight: tensor(vec![r, d], 11)?,
        down_bias: tensor(vec![r], 12)?,
        up_weight: tensor(vec![d, r], 13)?,
        up_bias: tensor(vec![d], 14)?,
    };
    Ok((a, tensor(vec![m, d], 15)?, tensor(vec![m, d], 16)?))
}

/// `A`, `B` and `C` of one product.
type Operands = (Vec<f32>, Vec<f32>, Vec<f32>);

/// The six products as `gemm`-crate calls `C = A B^T` on row-major operands.
fn gemms_baseline(d: usize, r: usize, m: usize) -> Baseline {
    // (rows of A, k, rows of B) per product: z [m, r] (k = d), y [m, d] (k = r), dU [d, r]
    // (k = m), da [m, r] (k = d), dD [r, d] (k = m), dh [m, d] (k = r).
    let shapes = [
        (m, d, r),
        (m, r, d),
        (d, m, r),
        (m, d, r),
        (r, m, d),
        (m, r, d),
    ];
    let mut bufs: Option<Vec<Operands>> = None;
    let run: Runner = Box::new(move |_dev| {
        let b = bufs.get_or_insert_with(|| {
            shapes
                .iter()
                .enumerate()
                .map(|(i, &(rows, k, n))| {
                    let i = i as u64;
                    (
                        pseudo_random(rows * k, 2 * i + 1),
                        pseudo_random(n * k, 2 * i + 2),
                        vec![0.0f32; rows * n],
                    )
                })
                .collect()
        });
        for ((a, bm, c), &(rows, k, n)) in b.iter_mut().zip(&shapes) {
            fp32_gemm(a, bm, c, rows, k, n)?;
            std::hint::black_box(&c);
        }
        Ok(())
    });
    Baseline {
        name: FP32_GEMM.to_string(),
        run,
    }
}
