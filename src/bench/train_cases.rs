//! The training-shape cases of the fused NF4 matmul (`qforge bench --suite train`, issue 25):
//! the forward `y = x @ dequant(W)^T` ([`FORWARD`]) and the input gradient
//! `dX = dY @ dequant(W)` ([`BACKWARD_INPUT`]) at `M` in [`ROWS`] activation rows and the
//! `(K, N)` of [`SHAPES`] (weight `[N, K]`, blocksize 64, plain absmax), `f32` and `bf16`
//! activations. Each case declares `2 * M * N * K` FLOP and is compared with `fp32_gemm`: the
//! same product by the `gemm` crate in f32, on a dequantized copy of the same weight, on the
//! device's threads ([`dense_baseline`]).
//!
//! A kernel run is one call of the library's host op ([`matmul_4bit`] /
//! [`matmul_4bit_backward_input`]), so it times what a `Linear4bit` layer costs, the output's
//! allocation included, with the op's own choice of plan (its fused kernel with the tile of
//! `suggest_tile_sizes` or `suggest_backward_tile_sizes`, or its decoded plan on an AVX2 CPU from
//! 32 rows and on an AVX-512 one from 32 (the forward) and 128 (the input gradient) rows,
//! `matmul4/decoded_forward.rs` and `matmul4/decoded.rs`);
//! `QFORGE_MATMUL_TILE=TMxTN` and `QFORGE_MATMUL_DX_TILE=TMxTN` run the fused kernels with that
//! tile, for tuning. The `gemm` crate has no bf16 GEMM: bf16 rows are compared with the f32
//! one too.

use qforge_ir::DType;
use qforge_kernels::ops::{
    dequantize_4bit, matmul_4bit, matmul_4bit_backward_input, Absmax4, QuantState4,
};
use qforge_kernels::{QuantType, TileConfig};
use qforge_runtime::{Device, HostTensor};

use super::baselines::{fp32_matmul, host_threads, pseudo_random, BLayout, FP32_GEMM};
use super::cases::CaseSize;
use super::{Baseline, BenchCase, Runner};
use crate::error::{Error, Result};

/// Kernel name of the forward cases.
pub const FORWARD: &str = "matmul_4bit_nf4_train";
/// Kernel name of the input-gradient cases.
pub const BACKWARD_INPUT: &str = "matmul_4bit_dx_nf4_train";
/// Activation rows (batch x sequence) on a compiled device.
pub const ROWS: [usize; 4] = [16, 128, 512, 2048];
/// `(K, N)` (in, out features) on a compiled device: a 7B-class attention projection, MLP up
/// and MLP down.
pub const SHAPES: [(usize, usize); 3] = [(4096, 4096), (4096, 11008), (11008, 4096)];
/// Rows on the interpreter (about 100 times slower).
pub const INTERPRETER_ROWS: [usize; 2] = [2, 16];
/// `(K, N)` on the interpreter: [`SHAPES`] / 16.
pub const INTERPRETER_SHAPES: [(usize, usize); 3] = [(256, 256), (256, 688), (688, 256)];
/// The train suite's header line on its baseline.
pub const BASELINE_NOTE: &str = "baselines: fp32_gemm = the same product by the gemm crate in f32 \
     (bf16 rows too: it has no bf16 GEMM) on a dequantized copy of the weight, on the device's \
     threads; kernel times include the output's allocation (a Linear4bit call)";
/// Elements per absmax block of the weight.
pub const BLOCKSIZE: usize = 64;

/// Which product a case computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TrainDirection {
    /// `y[M, N] = x[M, K] @ dequant(W)^T`.
    Forward,
    /// `dX[M, K] = dY[M, N] @ dequant(W)`.
    BackwardInput,
}

/// One training-shape case: a direction, `M` rows, the weight `[N, K]`, the activation dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TrainShape {
    /// Forward or input gradient.
    pub direction: TrainDirection,
    /// Activation rows.
    pub m: usize,
    /// In features (the weight's columns).
    pub k: usize,
    /// Out features (the weight's rows).
    pub n: usize,
    /// Activation (and output) dtype.
    pub dtype: DType,
}

impl TrainShape {
    /// The kernel name in the output.
    pub fn kernel(&self) -> &'static str {
        match self.direction {
            TrainDirection::Forward => FORWARD,
            TrainDirection::BackwardInput => BACKWARD_INPUT,
        }
    }

    /// `2 * M * N * K`: a multiply and an add per term of the product (the decode of the
    /// weight is not counted).
    pub fn flops(&self) -> u64 {
        2 * self.m as u64 * self.n as u64 * self.k as u64
    }

    /// Columns of the activation (`K` forward, `N` for `dY`) and of the output.
    fn cols(&self) -> (usize, usize) {
        match self.direction {
            TrainDirection::Forward => (self.k, self.n),
            TrainDirection::BackwardInput => (self.n, self.k),
        }
    }

    /// Bytes one kernel run reads plus writes: the packed weight, one f32 absmax per
    /// [`BLOCKSIZE`] weights, the activation, the output.
    pub fn bytes(&self) -> usize {
        let (cin, cout) = self.cols();
        let w = self.n * self.k;
        w.div_ceil(2) + 4 * w.div_ceil(BLOCKSIZE) + self.m * (cin + cout) * self.dtype.size_bytes()
    }
}

/// The cases' shapes for a device of this size class, in output order: direction, then
/// `(K, N)`, then `M`, then dtype. `Elements(n)` (tests): `M` in {1, 3}, `(K, N) = (n, n + 1)`.
pub fn train_shapes(size: CaseSize) -> Vec<TrainShape> {
    let (rows, shapes): (Vec<usize>, Vec<(usize, usize)>) = match size {
        CaseSize::Full => (ROWS.to_vec(), SHAPES.to_vec()),
        CaseSize::Interpreter => (INTERPRETER_ROWS.to_vec(), INTERPRETER_SHAPES.to_vec()),
        CaseSize::Elements(n) => (vec![1, 3], vec![(n.max(1), n.max(1) + 1)]),
    };
    let mut out = Vec::new();
    for direction in [TrainDirection::Forward, TrainDirection::BackwardInput] {
        for &(k, n) in &shapes {
            for &m in &rows {
                for dtype in [DType::F32, DType::BF16] {
                    out.push(TrainShape {
                        direction,
                        m,
                        k,
                        n,
                        dtype,
                    });
                }
            }
        }
    }
    out
}

/// The train suite: one case per [`train_shapes`] entry, each with its FLOP and the
/// [`dense_baseline`].
pub fn train_cases(size: CaseSize) -> Vec<BenchCase> {
    train_shapes(size)
        .into_iter()
        .map(|s| train_case(s, size))
        .collect()
}

/// The case of one shape (inputs built on the untimed warm-up call).
pub fn train_case(s: TrainShape, size: CaseSize) -> BenchCase {
    let mut state: Option<TrainInputs> = None;
    let run: Runner = Box::new(move |dev: &dyn Device| {
        if state.is_none() {
            state = Some(TrainInputs::new(s)?);
        }
        if let Some(inputs) = &state {
            std::hint::black_box(inputs.run(dev)?);
        }
        Ok(())
    });
    let mut shape = format!("M={},K={},N={}", s.m, s.k, s.n);
    if size == CaseSize::Interpreter {
        shape.push_str(" (interpreter: scaled down)");
    }
    BenchCase::new(s.kernel(), shape, s.dtype, s.bytes(), run)
        .flops(s.flops())
        .baseline(dense_baseline(s))
}

/// The inputs of one case: pseudo-random activations in `[-1, 1)` (rounded to the dtype),
/// pseudo-random NF4 codes and absmax in `[0.01, 1.01)`; the same values on every call.
pub struct TrainInputs {
    /// The shape.
    pub shape: TrainShape,
    /// `x` `[M, K]` or `dY` `[M, N]` in the case's dtype.
    pub act: HostTensor,
    /// The packed weight `[N, K]` (two codes per byte).
    pub packed: Vec<u8>,
    /// Its quant state (NF4, [`BLOCKSIZE`], f32, plain absmax).
    pub state: QuantState4,
}

impl TrainInputs {
    /// Builds the inputs of `shape`.
    ///
    /// # Errors
    /// A runtime error converting the activation to its dtype.
    pub fn new(shape: TrainShape) -> Result<TrainInputs> {
        let (cin, _) = shape.cols();
        let (packed, state) = weight(shape.n, shape.k);
        let act = pseudo_random(shape.m * cin, 5);
        let act = HostTensor::from_f32_as(shape.dtype, vec![shape.m, cin], &act)?;
        Ok(TrainInputs {
            shape,
            act,
            packed,
            state,
        })
    }

    /// One run of the kernel on `dev`: `y` `[M, N]` or `dX` `[M, K]` in the case's dtype.
    ///
    /// # Errors
    /// A bad tile override; any error of the host op.
    pub fn run(&self, dev: &dyn Device) -> Result<HostTensor> {
        let s = &self.shape;
        // Without an override the op chooses (its decoded plans included).
        Ok(match s.direction {
            TrainDirection::Forward => {
                let tile = tile_override("QFORGE_MATMUL_TILE")?;
                matmul_4bit(dev, &self.act, &self.packed, &self.state, None, tile)?
            }
            TrainDirection::BackwardInput => {
                let tile = tile_override("QFORGE_MATMUL_DX_TILE")?;
                matmul_4bit_backward_input(dev, &self.act, &self.packed, &self.state, tile)?
            }
        })
    }
}

/// The weight `[n, k]`: packed NF4 codes and one absmax per [`BLOCKSIZE`] values.
fn weight(n: usize, k: usize) -> (Vec<u8>, QuantState4) {
    let elems = n * k;
    let packed: Vec<u8> = pseudo_random(elems.div_ceil(2), 6)
        .iter()
        .map(|v| (v.to_bits() >> 7) as u8)
        .collect();
    let absmax: Vec<f32> = pseudo_random(elems.div_ceil(BLOCKSIZE), 7)
        .iter()
        .map(|v| v.abs() + 0.01)
        .collect();
    let state = QuantState4 {
        quant_type: QuantType::Nf4,
        blocksize: BLOCKSIZE,
        dtype: DType::F32,
        shape: vec![n, k],
        absmax: Absmax4::Plain(absmax),
    };
    (packed, state)
}

/// `var=TMxTN`: a tile for every case of one direction.
///
/// # Errors
/// [`Error::Usage`] for a value that is not `TMxTN` with a valid tile.
fn tile_override(var: &str) -> Result<Option<TileConfig>> {
    let Ok(v) = std::env::var(var) else {
        return Ok(None);
    };
    let bad = || Error::Usage(format!("{var}={v}: expected TMxTN, e.g. 2x16"));
    let (tm, tn) = v.split_once('x').ok_or_else(bad)?;
    let tile = TileConfig {
        tm: tm.parse().map_err(|_| bad())?,
        tn: tn.parse().map_err(|_| bad())?,
    };
    tile.check()
        .map_err(|e| Error::Usage(format!("{var}={v}: {e}")))?;
    Ok(Some(tile))
}

/// The operands of [`dense_baseline`]'s product: the activation as f32 (the bf16 values
/// widened), the weight dequantized on `dev` (`[N, K]` f32), and the output's length.
///
/// # Errors
/// Any error of the dequantization.
pub fn dense_operands(s: TrainShape, dev: &dyn Device) -> Result<(Vec<f32>, Vec<f32>, usize)> {
    let inputs = TrainInputs::new(s)?;
    let w = dequantize_4bit(dev, &inputs.packed, &inputs.state)?.to_f32()?;
    let (_, cout) = s.cols();
    Ok((inputs.act.to_f32()?, w, s.m * cout))
}

/// `c = a @ W^T` (forward, `[M, K] x [N, K]^T`) or `c = a @ W` (input gradient,
/// `[M, N] x [N, K]`) in f32 by the `gemm` crate on `threads` threads (0: rayon's whole pool).
///
/// # Errors
/// As [`fp32_matmul`].
pub fn dense_product(
    s: TrainShape,
    a: &[f32],
    w: &[f32],
    c: &mut [f32],
    threads: usize,
) -> Result<()> {
    match s.direction {
        TrainDirection::Forward => {
            fp32_matmul(a, w, c, (s.m, s.k, s.n), BLayout::Transposed, threads)
        }
        TrainDirection::BackwardInput => {
            fp32_matmul(a, w, c, (s.m, s.n, s.k), BLayout::Plain, threads)
        }
    }
}

/// `fp32_gemm`: the case's product ([`dense_product`]) on a dequantized copy of its weight
/// ([`dense_operands`], built on the untimed warm-up call), on the device's threads
/// ([`host_threads`]: a CPU device's pool size; the `gemm` crate splits the product into that
/// many rayon tasks on rayon's global pool, which has every core unless `RAYON_NUM_THREADS`
/// says otherwise, as the CPU device's pool unless `--threads` does).
pub fn dense_baseline(s: TrainShape) -> Baseline {
    let mut buffers: Option<(Vec<f32>, Vec<f32>, Vec<f32>)> = None;
    let run: Runner = Box::new(move |dev| {
        if buffers.is_none() {
            let (a, w, len) = dense_operands(s, dev)?;
            buffers = Some((a, w, vec![0.0; len]));
        }
        if let Some((a, w, c)) = buffers.as_mut() {
            dense_product(s, a, w, c, host_threads(dev))?;
            std::hint::black_box(c);
        }
        Ok(())
    });
    Baseline {
        name: FP32_GEMM.to_string(),
        run,
    }
}

#[cfg(test)]
#[path = "train_tests.rs"]
mod tests;
