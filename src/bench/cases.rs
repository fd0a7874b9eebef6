//! The cases `qforge bench` runs, and [`library_case`], which turns a library kernel into a case.

use qforge_ir::{DType, Kernel, OwnedArg};
use qforge_kernels::{
    Blockwise8Op, Blockwise8Spec, BlockwiseMap, DoubleQuantSpec, KernelSpec, NormRule,
    OptimNormSpec, Quant4Op, Quant4Spec, QuantType, StateBits, NESTED_BLOCKSIZE, OPTIM_BLOCKSIZE,
};
use qforge_runtime::Device;

use super::baselines::{memcpy_baseline, pseudo_random};
use super::{BenchCase, Runner};
use crate::error::{Error, Result};

/// Elements of the 4-bit and 8-bit cases on a compiled device: 16 Mi.
pub const FULL_ELEMENTS: usize = 16 << 20;

/// Elements of the same cases on the reference interpreter, which runs them about 100 times
/// slower than the CPU device: 256 Ki (1/64 of [`FULL_ELEMENTS`]), which the shape string says.
pub const INTERPRETER_ELEMENTS: usize = 256 << 10;

/// How large the cases are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaseSize {
    /// [`FULL_ELEMENTS`].
    Full,
    /// [`INTERPRETER_ELEMENTS`], with the shape string saying it was scaled down.
    Interpreter,
    /// Any element count (tests), shape string `n=N`.
    Elements(usize),
}

impl CaseSize {
    /// The size for a device's backend: scaled down on the interpreter, full elsewhere.
    pub fn for_backend(backend: &str) -> CaseSize {
        if backend == "interpreter" {
            CaseSize::Interpreter
        } else {
            CaseSize::Full
        }
    }

    /// The element count.
    pub fn elements(self) -> usize {
        match self {
            CaseSize::Full => FULL_ELEMENTS,
            CaseSize::Interpreter => INTERPRETER_ELEMENTS,
            CaseSize::Elements(n) => n,
        }
    }

    /// The shape string of a flat tensor of this size.
    pub fn shape(self) -> String {
        let n = self.elements();
        match self {
            CaseSize::Full | CaseSize::Elements(_) => format!("n={n}"),
            CaseSize::Interpreter => {
                format!("n={n} (interpreter: scaled down from {FULL_ELEMENTS})")
            }
        }
    }
}

/// Every bench case, in output order. Each one is a few lines: add yours here.
///
/// # Errors
/// As [`library_case`] (a case list that names a kernel it cannot size).
pub fn cases(size: CaseSize) -> Result<Vec<BenchCase>> {
    let nf4 = QuantType::Nf4;
    let fp4 = QuantType::Fp4;
    let f32 = DType::F32;
    Ok([
        library_case(
            "dequantize_4bit_nf4",
            KernelSpec::Quant4(Quant4Spec {
                op: Quant4Op::Dequantize,
                quant_type: nf4,
                blocksize: 64,
                dtype: f32,
            }),
            size,
        )?,
        library_case(
            "quantize_4bit_nf4",
            KernelSpec::Quant4(Quant4Spec {
                op: Quant4Op::Quantize,
                quant_type: nf4,
                blocksize: 64,
                dtype: f32,
            }),
            size,
        )?,
        library_case(
            "dequantize_4bit_fp4",
            KernelSpec::Quant4(Quant4Spec {
                op: Quant4Op::Dequantize,
                quant_type: fp4,
                blocksize: 64,
                dtype: f32,
            }),
            size,
        )?,
        library_case(
            "dequantize_blockwise_dynamic",
            KernelSpec::Blockwise8(Blockwise8Spec {
                op: Blockwise8Op::Dequantize,
                map: BlockwiseMap::Dynamic,
                blocksize: 4096,
                dtype: f32,
            }),
            size,
        )?,
    ]
    .into_iter()
    .chain(super::matmul_cases::matmul_cases(size))
    .chain(super::int8_cases::int8_cases(size))
    .chain(super::optim_cases::optim_cases(size))
    .chain(super::adapter_cases::adapter_cases(size))
    .collect())
}

/// A case that launches the library kernel `spec` on `size.elements()` values (the kernel and
/// its arguments, from [`KernelSpec::example_args`] on pseudo-random values in [-1, 1), are
/// built on the untimed warm-up call; outputs are written into the same preallocated buffers
/// every run, so no allocation is timed), compared with a memcpy of the bytes it reads + writes.
///
/// # Errors
/// [`Error::Usage`] for a kernel whose traffic is not a function of one element count (the fused
/// matmul: give it its own case with its `m`, `k`, `n`).
pub fn library_case(kernel: &str, spec: KernelSpec, size: CaseSize) -> Result<BenchCase> {
    let n = size.elements();
    let bytes = bytes_moved(spec, n).ok_or_else(|| {
        Error::Usage(format!(
            "bench case {kernel}: library_case sizes only flat kernels of n elements, not {}",
            spec.name()
        ))
    })?;
    let mut state: Option<(Kernel, Vec<OwnedArg>)> = None;
    let run: Runner = Box::new(move |dev: &dyn Device| {
        if state.is_none() {
            state = Some(prepare(spec, n, bytes)?);
        }
        if let Some((kernel, args)) = state.as_mut() {
            dev.launch(kernel, &mut OwnedArg::borrow_all(args))?;
        }
        Ok(())
    });
    Ok(
        BenchCase::new(kernel, size.shape(), spec_dtype(spec), bytes, run)
            .baseline(memcpy_baseline(bytes)),
    )
}

/// Builds the kernel and its arguments, and checks that the arguments move `bytes` bytes.
fn prepare(spec: KernelSpec, n: usize, bytes: usize) -> Result<(Kernel, Vec<OwnedArg>)> {
    let kernel = spec.build()?;
    let args = spec.example_args(&pseudo_random(n, 3))?;
    let moved = args_bytes(&args);
    if moved != bytes {
        return Err(Error::Usage(format!(
            "bench case {}: its arguments move {moved} bytes, the case says {bytes}",
            kernel.name
        )));
    }
    Ok((kernel, args))
}

/// Bytes of the buffers in `args` (read and written), scalars excluded.
fn args_bytes(args: &[OwnedArg]) -> usize {
    args.iter()
        .map(|a| match a {
            OwnedArg::Read(b) | OwnedArg::Write(b) => b.len(),
            OwnedArg::Scalar(_) => 0,
        })
        .sum()
}

/// The dtype of the float data of a library kernel (`f32` for the fixed-f32 double-quant ones).
pub fn spec_dtype(spec: KernelSpec) -> DType {
    match spec {
        KernelSpec::Quant4(Quant4Spec { dtype, .. })
        | KernelSpec::Blockwise8(Blockwise8Spec { dtype, .. }) => dtype,
        KernelSpec::Matmul4(m) => m.dtype,
        KernelSpec::Gemm(g) => g.dtype,
        KernelSpec::Int8(s) => s.dtype(),
        KernelSpec::Optim(s) => s.dtype,
        KernelSpec::OptimStaged(s) => s.spec.dtype,
        KernelSpec::Optim1(s) => s.dtype,
        KernelSpec::Ademamix(s) => s.dtype,
        KernelSpec::QAdam(s) => s.dtype,
        KernelSpec::Activation(s) => s.dtype,
        KernelSpec::OptimNorm(s) => match s {
            OptimNormSpec::Partials { dtype, .. } | OptimNormSpec::Update { dtype, .. } => dtype,
            OptimNormSpec::Scale => DType::F32,
        },
        KernelSpec::OptimExt(s) => s.dtype(),
        KernelSpec::OptimNorm8(s) => s.rule_dtype().1,
        KernelSpec::DoubleQuant(_) => DType::F32,
    }
}

/// Bytes a library kernel reads plus writes for `n` elements (buffers only; code tables baked
/// into the kernel are not counted); `None` for the fused matmul, the dense product and the int8
/// kernels, whose traffic depends on their matrix shapes, not on one element count.
pub fn bytes_moved(spec: KernelSpec, n: usize) -> Option<usize> {
    let blocks = |bs: u32| n.div_ceil(bs as usize);
    let packed = n.div_ceil(2);
    Some(match spec {
        // Reads n floats; writes the packed codes and one f32 absmax per block.
        KernelSpec::Quant4(Quant4Spec {
            op: Quant4Op::Quantize,
            blocksize,
            dtype,
            ..
        }) => n * dtype.size_bytes() + packed + 4 * blocks(blocksize),
        // Reads the packed codes and the absmax; writes n floats.
        KernelSpec::Quant4(Quant4Spec {
            op: Quant4Op::Dequantize,
            blocksize,
            dtype,
            ..
        }) => packed + 4 * blocks(blocksize) + n * dtype.size_bytes(),
        // Reads the packed codes, one 8-bit absmax code per block, one f32 per nested block and
        // the 256-entry f32 nested code; writes n floats.
        KernelSpec::Quant4(Quant4Spec {
            op: Quant4Op::DequantizeNested,
            blocksize,
            dtype,
            ..
        }) => {
            let b = blocks(blocksize);
            packed
                + b
                + 4 * b.div_ceil(NESTED_BLOCKSIZE as usize)
                + 4 * 256
                + n * dtype.size_bytes()
        }
        // Reads n floats; writes n codes and one f32 absmax per block.
        KernelSpec::Blockwise8(Blockwise8Spec {
            op: Blockwise8Op::Quantize,
            blocksize,
            dtype,
            ..
        }) => n * dtype.size_bytes() + n + 4 * blocks(blocksize),
        // Reads n codes and the absmax; writes n floats.
        KernelSpec::Blockwise8(Blockwise8Spec {
            op: Blockwise8Op::Dequantize,
            blocksize,
            dtype,
            ..
        }) => n + 4 * blocks(blocksize) + n * dtype.size_bytes(),
        // Reads n f32; writes one f32.
        KernelSpec::DoubleQuant(DoubleQuantSpec::AbsmaxMean) => 4 * n + 4,
        // Reads n f32; writes n codes and one f32 per nested block.
        KernelSpec::DoubleQuant(DoubleQuantSpec::QuantizeNested) => {
            4 * n + n + 4 * blocks(NESTED_BLOCKSIZE)
        }
        // Reads n codes and one f32 per nested block; writes n f32.
        KernelSpec::DoubleQuant(DoubleQuantSpec::DequantizeNested) => {
            n + 4 * blocks(NESTED_BLOCKSIZE) + 4 * n
        }
        // Reads the gradient; reads and writes the parameter and both moments (counted once
        // each, as the memcpy baseline moves them): f32 state, or codes plus two absmax arrays.
        KernelSpec::Optim(s) => {
            let state = match s.state {
                StateBits::Bits32 => 2 * 4 * n,
                StateBits::Bits8 => 2 * n + 2 * 4 * blocks(OPTIM_BLOCKSIZE),
            };
            2 * n * s.dtype.size_bytes() + state
        }
        // The plain kernel's buffers and the two f32 stages (written, then read back from the
        // cache).
        KernelSpec::OptimStaged(s) => bytes_moved(KernelSpec::Optim(s.spec), n)? + 2 * 4 * n,
        // The `_gs` variants move what their plain kernels move; the gradient norm reads the
        // gradient and writes one f32 per block.
        KernelSpec::OptimExt(e) => match e {
            qforge_kernels::OptimExtSpec::Adam(s) => bytes_moved(KernelSpec::Optim(s), n)?,
            qforge_kernels::OptimExtSpec::One(s) => bytes_moved(KernelSpec::Optim1(s), n)?,
            qforge_kernels::OptimExtSpec::GradNorm(d) => {
                n * d.size_bytes() + 4 * blocks(OPTIM_BLOCKSIZE)
            }
            // Reads the parameter, the gradient and the state; writes two f32 per block.
            qforge_kernels::OptimExtSpec::Norm1(_) | qforge_kernels::OptimExtSpec::Norm1Gs(_) => {
                3 * 4 * n + 2 * 4 * blocks(OPTIM_BLOCKSIZE)
            }
            qforge_kernels::OptimExtSpec::Norm(s) => bytes_moved(KernelSpec::OptimNorm(s), n)?,
            qforge_kernels::OptimExtSpec::Norm8(s) => bytes_moved(KernelSpec::OptimNorm8(s), n)?,
        },
        // As Optim with three states (m1, nu, m2).
        KernelSpec::Ademamix(s) => {
            let state = match s.state {
                StateBits::Bits32 => 3 * 4 * n,
                StateBits::Bits8 => 3 * n + 3 * 4 * blocks(OPTIM_BLOCKSIZE),
            };
            2 * n * s.dtype.size_bytes() + state
        }
        // As Optim with one state.
        KernelSpec::Optim1(s) => {
            let state = match s.state {
                StateBits::Bits32 => 4 * n,
                StateBits::Bits8 => n + 4 * blocks(OPTIM_BLOCKSIZE),
            };
            2 * n * s.dtype.size_bytes() + state
        }
        // As Optim, each moment in its scheme (4-bit: n / 2 packed bytes and one f32 per block
        // of 128; 8-bit: n codes and one f32 per 256; f32: 4n).
        KernelSpec::QAdam(s) => {
            let moment = |m: qforge_kernels::MomentScheme| {
                let (codes, scales) = m.state_lens(n);
                let code_bytes = if m.bits() == 32 { 4 * codes } else { codes };
                code_bytes + 4 * scales
            };
            // Staged: one f32 stage per quantized moment (written, then read back).
            let stages = [s.m1, s.m2]
                .iter()
                .filter(|m| s.staged && m.bits() != 32)
                .count();
            2 * n * s.dtype.size_bytes() + moment(s.m1) + moment(s.m2) + 4 * n * stages
        }
        // Reads z (and dy for the backward); writes y (dz).
        KernelSpec::Activation(s) => {
            let buffers = match s.direction {
                qforge_kernels::ActDirection::Forward => 2,
                qforge_kernels::ActDirection::Backward => 3,
            };
            buffers * n * s.dtype.size_bytes()
        }
        // LAMB / LARS: the partials read the parameter, the gradient and the f32 state and write
        // two f32 per block; the update reads the gradient and the one-element scale and reads
        // and writes the parameter and the state; the scale kernel reads n partials of each sum
        // and writes one f32.
        KernelSpec::OptimNorm(s) => {
            let states = |rule: NormRule| match rule {
                NormRule::Lamb => 2,
                NormRule::Lars => 1,
            };
            match s {
                OptimNormSpec::Partials { rule, dtype } => {
                    2 * n * dtype.size_bytes()
                        + states(rule) * 4 * n
                        + 2 * 4 * blocks(OPTIM_BLOCKSIZE)
                }
                OptimNormSpec::Update { rule, dtype } => {
                    2 * n * dtype.size_bytes() + states(rule) * 4 * n + 4
                }
                OptimNormSpec::Scale => 2 * 4 * n + 4,
            }
        }
        // 8-bit LAMB / LARS: as LAMB / LARS with codes plus one absmax per block per state.
        KernelSpec::OptimNorm8(s) => {
            let (rule, dtype) = s.rule_dtype();
            let states = match rule {
                NormRule::Lamb => 2,
                NormRule::Lars => 1,
            };
            let state = states * (n + 4 * blocks(OPTIM_BLOCKSIZE));
            match s {
                qforge_kernels::OptimNorm8Spec::Partials { .. } => {
                    2 * n * dtype.size_bytes() + state + 2 * 4 * blocks(OPTIM_BLOCKSIZE)
                }
                qforge_kernels::OptimNorm8Spec::Update { .. } => {
                    2 * n * dtype.size_bytes() + state + 4
                }
            }
        }
        KernelSpec::Matmul4(_) | KernelSpec::Int8(_) | KernelSpec::Gemm(_) => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use qforge_kernels::catalog;
    use qforge_runtime::InterpreterDevice;

    #[test]
    fn bytes_moved_matches_the_example_arguments_of_every_library_kernel() {
        // Sizes that are not multiples of any blocksize, and one that is.
        for n in [1, 3, 4097, 8192] {
            for spec in catalog() {
                if let KernelSpec::Matmul4(_) | KernelSpec::Int8(_) | KernelSpec::Gemm(_) = spec {
                    assert_eq!(bytes_moved(spec, n), None, "matmul cases size themselves");
                    continue;
                }
                let args = spec
                    .example_args(&pseudo_random(n, 1))
                    .expect("example args");
                let bytes = bytes_moved(spec, n);
                assert_eq!(bytes, Some(args_bytes(&args)), "{} at n = {n}", spec.name());
            }
        }
    }

    #[test]
    fn bytes_moved_by_hand_for_nf4_dequantize() {
        // 16 Mi f32 out (64 MiB), 8 MiB packed, 256 Ki blocks * 4 bytes of absmax.
        let spec = KernelSpec::Quant4(Quant4Spec {
            op: Quant4Op::Dequantize,
            quant_type: QuantType::Nf4,
            blocksize: 64,
            dtype: DType::F32,
        });
        assert_eq!(
            bytes_moved(spec, 16 << 20),
            Some((64 << 20) + (8 << 20) + (1 << 20))
        );
    }

    #[test]
    fn the_case_list_has_the_issue_cases_each_with_a_memcpy_baseline() {
        let list = cases(CaseSize::Full).expect("cases");
        let flat: Vec<&str> = list
            .iter()
            .map(|c| c.kernel.as_str())
            .filter(|k| {
                !k.starts_with("matmul")
                    && !k.starts_with("int8")
                    && !k.starts_with("adamw")
                    && !k.starts_with("adapter")
            })
            .collect();
        assert_eq!(
            flat,
            [
                "dequantize_4bit_nf4",
                "quantize_4bit_nf4",
                "dequantize_4bit_fp4",
                "dequantize_blockwise_dynamic"
            ]
        );
        for c in &list {
            let baselines: Vec<&str> = c.baselines.iter().map(|b| b.name.as_str()).collect();
            if c.kernel.starts_with("matmul") || c.kernel.starts_with("int8") {
                assert!(c.shape.starts_with("M="), "{}", c.shape);
                assert!(
                    baselines.contains(&"fp32_gemm"),
                    "{}: {baselines:?}",
                    c.kernel
                );
            } else if c.kernel == "adapter_fwd_bwd" {
                assert_eq!(c.shape, "d=4096,r=64,M=512");
                assert_eq!(baselines, ["fp32_gemm", "memcpy"]);
            } else if c.kernel.starts_with("adamw") {
                assert_eq!(c.shape, "params=16777216");
                assert_eq!(c.dtype, DType::F32);
                assert_eq!(baselines, ["adamw32", "memcpy"], "{}", c.kernel);
            } else {
                assert_eq!(c.shape, "n=16777216");
                assert_eq!(c.dtype, DType::F32);
                assert_eq!(baselines, ["memcpy"]);
            }
        }
        // The issue's optimizer cases.
        let optim: Vec<&str> = list
            .iter()
            .map(|c| c.kernel.as_str())
            .filter(|k| k.starts_with("adamw"))
            .collect();
        assert_eq!(
            optim,
            [
                "adamw32",
                "adamw8bit",
                "adamw4bit_zip_sr",
                "adamw4bit_ze_eden"
            ]
        );
        // The issue's matmul cases: M = 1 and 16 at three (K, N), f32 and bf16.
        let matmul: Vec<(&str, DType)> = list
            .iter()
            .filter(|c| c.kernel == "matmul_4bit_nf4")
            .map(|c| (c.shape.as_str(), c.dtype))
            .collect();
        assert_eq!(matmul.len(), 12);
        for (k, n) in [(4096, 4096), (4096, 11008), (8192, 8192)] {
            for m in [1, 16] {
                for dt in [DType::F32, DType::BF16] {
                    let shape = format!("M={m},K={k},N={n}");
                    assert!(matmul.contains(&(shape.as_str(), dt)), "{shape} {dt}");
                }
            }
        }
        let small = cases(CaseSize::Interpreter).expect("cases");
        assert!(
            small[0].shape.starts_with("n=262144 (interpreter"),
            "{}",
            small[0].shape
        );
    }

    #[test]
    fn sizes_follow_the_backend() {
        assert_eq!(CaseSize::for_backend("interpreter"), CaseSize::Interpreter);
        assert_eq!(CaseSize::for_backend("cranelift"), CaseSize::Full);
        assert_eq!(CaseSize::for_backend("wgsl"), CaseSize::Full);
    }

    #[test]
    fn a_library_case_runs_on_a_device_again_and_again() {
        let mut case = cases(CaseSize::Elements(300)).expect("cases").remove(0);
        assert_eq!(case.bytes, 300 * 4 + 150 + 4 * 5);
        (case.run)(&InterpreterDevice).expect("the warm-up call builds and runs");
        (case.run)(&InterpreterDevice).expect("runs again on the same buffers");
        let mut copy = case.baselines.remove(0);
        (copy.run)(&InterpreterDevice).expect("the memcpy baseline runs");
    }
}
