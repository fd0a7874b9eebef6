//! Bench case of the LLM.int8() integer matmul: `int8_linear_matmul` (`i8 x i8 -> i32`, exact)
//! as a GEMM of a 7B-class linear layer (`M = 16`, `K = N = 4096`) against an fp32 GEMM of the
//! same shape (`fp32_gemm`).

use qforge_ir::{Arg, DType, Kernel, Scalar};
use qforge_kernels::ops::{suggest_int8_tile_sizes, DeviceCaps};
use qforge_kernels::Int8Spec;
use qforge_runtime::Device;

use super::baselines::{fp32_gemm_baseline, pseudo_random};
use super::cases::CaseSize;
use super::{BenchCase, Runner};
use crate::error::Result;

/// `(M, K, N)` on a compiled device.
pub const SHAPE: (usize, usize, usize) = (16, 4096, 4096);
/// `(M, K, N)` on the interpreter (about 100 times slower): a small shape.
pub const INTERPRETER_SHAPE: (usize, usize, usize) = (16, 256, 256);

/// The int8 cases for a device of this size class (`Elements(n)`: `K = N = n`).
pub fn int8_cases(size: CaseSize) -> Vec<BenchCase> {
    let (m, k, n) = match size {
        CaseSize::Interpreter => INTERPRETER_SHAPE,
        CaseSize::Elements(e) => (SHAPE.0, e.max(1), e.max(1)),
        CaseSize::Full => SHAPE,
    };
    vec![case(m, k, n, size)]
}

/// Bytes the kernel reads (`A`, `B`) plus writes (`C`, `i32`).
fn bytes_moved(m: usize, k: usize, n: usize) -> usize {
    m * k + n * k + 4 * m * n
}

/// The kernel (tile from [`suggest_int8_tile_sizes`] for `dev`), its scalars, and `[a, b, c]` with
/// pseudo-random codes.
fn prepare(
    dev: &dyn Device,
    m: usize,
    k: usize,
    n: usize,
) -> Result<(Kernel, Vec<Vec<u8>>, Vec<Scalar>)> {
    let tile = suggest_int8_tile_sizes(m, n, k, DeviceCaps::of(dev));
    let kernel = Int8Spec::LinearMatmul { tile }.build()?;
    let codes = |len: usize, seed: u64| -> Vec<u8> {
        pseudo_random(len, seed)
            .iter()
            .map(|v| (v * 127.0) as i8 as u8)
            .collect()
    };
    let n_tiles = n.div_ceil(tile.tn as usize);
    let u = |v: usize| Scalar::U32(v as u32);
    let scalars = vec![
        u(m),
        u(n),
        u(k),
        u(m.div_ceil(tile.tm as usize) * n_tiles),
        u(n_tiles),
    ];
    Ok((
        kernel,
        vec![codes(m * k, 8), codes(n * k, 9), vec![0u8; 4 * m * n]],
        scalars,
    ))
}

fn case(m: usize, k: usize, n: usize, size: CaseSize) -> BenchCase {
    let mut state: Option<(Kernel, Vec<Vec<u8>>, Vec<Scalar>)> = None;
    let run: Runner = Box::new(move |dev: &dyn Device| {
        if state.is_none() {
            state = Some(prepare(dev, m, k, n)?);
        }
        if let Some((kernel, bufs, scalars)) = state.as_mut() {
            let (reads, out) = bufs.split_at_mut(2);
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
    BenchCase::new(
        "int8_linear_matmul",
        shape,
        DType::I8,
        bytes_moved(m, k, n),
        run,
    )
    .baseline(fp32_gemm_baseline(m, k, n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use qforge_runtime::InterpreterDevice;

    #[test]
    fn int8_case_runs_and_sizes_itself() {
        let mut cases = int8_cases(CaseSize::Elements(8));
        assert_eq!(cases.len(), 1);
        let c = &mut cases[0];
        assert_eq!(
            (c.kernel.as_str(), c.shape.as_str()),
            ("int8_linear_matmul", "M=16,K=8,N=8")
        );
        assert_eq!(c.bytes, 16 * 8 + 8 * 8 + 4 * 16 * 8);
        (c.run)(&InterpreterDevice).expect("the kernel runs");
        (c.baselines[0].run)(&InterpreterDevice).expect("the baseline runs");
    }
}
