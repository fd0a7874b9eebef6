//! Bench cases of the fused 4-bit matmul: NF4 GEMV (`M = 1`) and GEMM (`M = 16`) at the shapes
//! of 7B/13B-class linear layers, with `f32` and `bf16` activations, against an fp32 GEMM of the
//! same shape (`fp32_gemm`) and a memcpy of the bytes the 4-bit kernel reads (`memcpy`).

use qforge_ir::{Arg, DType, Kernel, Scalar};
use qforge_kernels::ops::{suggest_tile_sizes, DeviceCaps};
use qforge_kernels::{Direction, Matmul4, QuantType, TileConfig};
use qforge_runtime::Device;

use super::baselines::{fp32_gemm_baseline, memcpy_baseline, pseudo_random};
use super::cases::CaseSize;
use super::{BenchCase, Runner};
use crate::error::Result;

/// `(K, N)` of the cases on a compiled device.
pub const SHAPES: [(usize, usize); 3] = [(4096, 4096), (4096, 11008), (8192, 8192)];
/// `(K, N)` on the interpreter (about 100 times slower): one small shape.
pub const INTERPRETER_SHAPE: (usize, usize) = (512, 512);
/// Activation rows of the cases: single-token decoding and a small batch.
pub const ROWS: [usize; 2] = [1, 16];

/// The matmul cases for a device of this size class.
pub fn matmul_cases(size: CaseSize) -> Vec<BenchCase> {
    let shapes: Vec<(usize, usize)> = match size {
        CaseSize::Interpreter => vec![INTERPRETER_SHAPE],
        CaseSize::Elements(n) => vec![(n.max(1), n.max(1))],
        CaseSize::Full => SHAPES.to_vec(),
    };
    let mut out = Vec::new();
    for (k, n) in shapes {
        for m in ROWS {
            for dtype in [DType::F32, DType::BF16] {
                out.push(case(m, k, n, dtype, size));
            }
        }
    }
    out
}

/// Bytes the NF4 kernel reads: the packed weight, one `f32` absmax per 64 weights, `x`.
fn bytes_read(m: usize, k: usize, n: usize, dtype: DType) -> usize {
    (n * k).div_ceil(2) + 4 * (n * k).div_ceil(64) + m * k * dtype.size_bytes()
}

fn case(m: usize, k: usize, n: usize, dtype: DType, size: CaseSize) -> BenchCase {
    let bytes = bytes_read(m, k, n, dtype);
    let mut state: Option<(Kernel, Vec<Vec<u8>>, Vec<Scalar>)> = None;
    let run: Runner = Box::new(move |dev: &dyn Device| {
        if state.is_none() {
            state = Some(prepare(dev, m, k, n, dtype)?);
        }
        if let Some((kernel, bufs, scalars)) = state.as_mut() {
            let (reads, out) = bufs.split_at_mut(3);
            let mut args: Vec<Arg> = scalars.iter().map(|s| Arg::Scalar(*s)).collect();
            args.extend(reads.iter().map(|b| Arg::Read(b)));
            args.push(Arg::Write(&mut out[0]));
            dev.launch(kernel, &mut args)?;
        }
        Ok(())
    });
    let mut shape = format!("M={m},K={k},N={n}");
    if size == CaseSize::Interpreter {
        shape.push_str(" (interpreter: scaled down)");
    }
    BenchCase::new("matmul_4bit_nf4", shape, dtype, bytes, run)
        .baseline(fp32_gemm_baseline(m, k, n))
        .baseline(memcpy_baseline(bytes))
}

/// `QFORGE_MATMUL_TILE=TMxTN` (for tuning the heuristic): the tile every matmul case uses.
///
/// # Errors
/// [`crate::Error::Usage`] for a value that is not `TMxTN` with a valid tile.
fn tile_override() -> Result<Option<TileConfig>> {
    let Ok(v) = std::env::var("QFORGE_MATMUL_TILE") else {
        return Ok(None);
    };
    let bad = || crate::Error::Usage(format!("QFORGE_MATMUL_TILE={v}: expected TMxTN, e.g. 4x1"));
    let (tm, tn) = v.split_once('x').ok_or_else(bad)?;
    let tile = TileConfig {
        tm: tm.parse().map_err(|_| bad())?,
        tn: tn.parse().map_err(|_| bad())?,
    };
    tile.check()
        .map_err(|e| crate::Error::Usage(format!("QFORGE_MATMUL_TILE={v}: {e}")))?;
    Ok(Some(tile))
}

/// The kernel (tile from `QFORGE_MATMUL_TILE` or [`suggest_tile_sizes`] for `dev`), its scalars, and the buffers
/// `[x, packed, absmax, y]` with pseudo-random activations, codes and scales.
fn prepare(
    dev: &dyn Device,
    m: usize,
    k: usize,
    n: usize,
    dtype: DType,
) -> Result<(Kernel, Vec<Vec<u8>>, Vec<Scalar>)> {
    let tile = match tile_override()? {
        Some(t) => t,
        None => suggest_tile_sizes(m, n, k, DeviceCaps::of(dev)),
    };
    let spec = Matmul4 {
        quant_type: QuantType::Nf4,
        blocksize: 64,
        dtype,
        weight_dtype: dtype,
        nested: false,
        direction: Direction::Forward { bias: false },
        tile,
    };
    let kernel = spec.build()?;
    let x = pseudo_random(m * k, 5);
    let x = qforge_runtime::HostTensor::from_f32_as(dtype, vec![m, k], &x)?.data;
    let packed: Vec<u8> = pseudo_random((n * k).div_ceil(2), 6)
        .iter()
        .map(|v| (v.to_bits() >> 7) as u8)
        .collect();
    let n_blocks = (n * k).div_ceil(64);
    let absmax: Vec<u8> = pseudo_random(n_blocks, 7)
        .iter()
        .flat_map(|v| (v.abs() + 0.01).to_le_bytes())
        .collect();
    let n_tiles = n.div_ceil(tile.tn as usize);
    let u = |v: usize| Scalar::U32(v as u32);
    let scalars = vec![
        u(m),
        u(n),
        u(k),
        u(m.div_ceil(tile.tm as usize) * n_tiles),
        u(n_tiles),
        u(packed.len()),
        u(n_blocks),
    ];
    let y = vec![0u8; m * n * dtype.size_bytes()];
    Ok((kernel, vec![x, packed, absmax, y], scalars))
}
