//! Runs kernels compiled ahead of time by `build.rs` with no JIT: NF4 quantize/dequantize from
//! the op library (through its host ops) and the example's own kernel, each checked bit for
//! bit against the reference interpreter, on every CPU feature level this machine has; then
//! checks the embedded text artifacts against the kernels the program builds now. Exits 1 on
//! any difference.

mod custom;

use std::process::ExitCode;

use qforge_ir::dsl::{FloatIn, FloatOut};
use qforge_ir::DType;
use qforge_kernels::ops::{dequantize_4bit, quantize_4bit};
use qforge_kernels::QuantType;
use qforge_runtime::{AotDevice, Device, HostTensor, InterpreterDevice, Policy};

qforge_runtime::include_kernels!();

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Deterministic test values with edge cases (zeros, subnormals, ties, large magnitudes).
fn values(n: usize) -> Vec<f32> {
    let mut state = 0x9e37_79b9u32;
    (0..n)
        .map(|i| match i % 16 {
            0 => 0.0,
            1 => -0.0,
            2 => f32::from_bits(1),
            3 => 1.5,
            _ => {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                (state as f32 / u32::MAX as f32 - 0.5) * 8.0
            }
        })
        .collect()
}

/// NF4 quantize + dequantize through the library's host ops on `dev`: the packed codes,
/// absmax and restored bytes.
fn nf4_round_trip(dev: &dyn Device, x: &HostTensor) -> Result<Vec<Vec<u8>>> {
    let (packed, state) = quantize_4bit(dev, x, QuantType::Nf4, 64, false)?;
    let restored = dequantize_4bit(dev, &packed, &state)?;
    let absmax = format!("{:?}", state.absmax).into_bytes();
    Ok(vec![packed, absmax, restored.data])
}

/// The example's kernel on `dev` for `dtype`: `y` bytes.
fn scaled_residual_on(dev: &dyn Device, dtype: DType, x: &[u8], r: &[u8]) -> Result<Vec<u8>> {
    let kernel = custom::scaled_residual(dtype)?;
    let mut y = vec![0u8; x.len()];
    let n = (x.len() / dtype.size_bytes()) as u32;
    let mut args = custom::ScaledResidualArgs {
        n,
        scale: 0.75,
        x: FloatIn { dtype, bytes: x },
        residual: FloatIn { dtype, bytes: r },
        y: FloatOut {
            dtype,
            bytes: &mut y,
        },
    };
    qforge_runtime::launch_typed(dev, &kernel, &mut args)?;
    Ok(y)
}

/// Runs everything on `dev` and compares with the interpreter; returns the mismatches.
fn check(dev: &AotDevice) -> Result<Vec<String>> {
    let mut failures = Vec::new();
    let x = HostTensor::from_f32(vec![1000], &values(1000))?;
    if nf4_round_trip(dev, &x)? != nf4_round_trip(&InterpreterDevice, &x)? {
        failures.push("NF4 quantize/dequantize".to_string());
    }
    for dtype in [DType::F32, DType::BF16] {
        let xs = HostTensor::from_f32_as(dtype, vec![999], &values(999))?;
        let rs = HostTensor::from_f32_as(dtype, vec![999], &values(1998)[999..])?;
        let aot = scaled_residual_on(dev, dtype, &xs.data, &rs.data)?;
        let reference = scaled_residual_on(&InterpreterDevice, dtype, &xs.data, &rs.data)?;
        if aot != reference {
            failures.push(format!("scaled_residual_{dtype}"));
        }
    }
    Ok(failures)
}

/// The kernel called `name` as this program builds it: a library kernel or the example's own.
fn kernel_now(name: &str) -> Result<qforge_ir::Kernel> {
    if let Some(spec) = qforge_kernels::KernelSpec::from_name(name) {
        return Ok(spec.build()?);
    }
    for dtype in [DType::F32, DType::BF16] {
        let kernel = custom::scaled_residual(dtype)?;
        if kernel.kernel().name == name {
            return Ok(kernel.kernel().clone());
        }
    }
    Err(format!("unknown kernel '{name}'").into())
}

fn run() -> Result<bool> {
    println!(
        "JIT compiler linked: {}",
        if qforge_runtime::JIT_LINKED {
            "yes"
        } else {
            "no"
        }
    );
    let mut ok = true;
    let mut levels: Vec<&str> = Vec::new();
    for k in KERNELS.iter().filter(|k| k.runs_here()) {
        if !levels.contains(&k.level) {
            levels.push(k.level);
        }
    }
    for level in levels {
        let dev = AotDevice::for_level(KERNELS, Policy::RequireAot, level)?;
        let failures = check(&dev)?;
        println!(
            "level {level}: {}",
            if failures.is_empty() {
                "bit-exact with the interpreter".to_string()
            } else {
                format!("DIFFERS: {}", failures.join(", "))
            }
        );
        ok &= failures.is_empty();
    }
    let best = AotDevice::new(KERNELS, Policy::RequireAot)?;
    let probe = custom::scaled_residual(DType::F32)?;
    println!(
        "best level here: {}",
        best.level_of(probe.kernel()).unwrap_or("none")
    );
    for text in TEXT {
        // The kernel as this program builds it now: a stale artifact (built from other text)
        // is refused by its content hash.
        let now = kernel_now(text.name)?;
        let code = text.code_for(now.content_hash(), text.target, &[])?;
        println!(
            "{} {}: {} bytes, manifest checked",
            text.name,
            text.target,
            code.len()
        );
    }
    Ok(ok)
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
