//! `qforge check`: every library kernel on every backend compiled in, compared bit for bit with
//! the reference interpreter on built-in inputs that include edge values.

use std::time::Instant;

use qforge_ir::{count_mismatches, library, OwnedArg};
use qforge_runtime::{Device, InterpreterDevice};

use crate::devices::Unavailable;
use crate::error::Result;

/// The outcome of one kernel on one backend.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckRow {
    /// Kernel name.
    pub kernel: String,
    /// Backend name (`interpreter`, `cranelift`, ...).
    pub backend: String,
    /// `exact`, `mismatch` or `skipped`.
    pub status: &'static str,
    /// Number of output elements that differ from the interpreter.
    pub mismatches: usize,
    /// Number of output elements compared.
    pub elements: usize,
    /// Compile time in milliseconds (0 for the interpreter).
    pub compile_ms: f64,
    /// Why the case was skipped or failed, if it was.
    pub reason: Option<String>,
}

impl CheckRow {
    /// The JSON line `qforge check --json` prints.
    pub fn to_json(&self) -> String {
        let mut v = serde_json::json!({
            "kernel": self.kernel, "backend": self.backend, "status": self.status,
            "mismatches": self.mismatches, "elements": self.elements,
            "compile_ms": (self.compile_ms * 1000.0).round() / 1000.0,
        });
        if let Some(r) = &self.reason {
            v["reason"] = serde_json::Value::String(r.clone());
        }
        v.to_string()
    }
}

/// Built-in inputs for a kernel with blocks of `blocksize`: a few blocks of normal-looking data,
/// then blocks with 0 / -0 / subnormals / exact midpoints / huge values, one with an inf, one with
/// a NaN, an all-zero block, an all-subnormal block, and a partial odd-length tail.
pub fn builtin_inputs(blocksize: usize) -> Vec<f32> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut normal = move || {
        // Irwin-Hall approximation of a normal variate from a xorshift generator.
        let mut s = 0.0f64;
        for _ in 0..12 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            s += (state >> 11) as f64 / (1u64 << 53) as f64;
        }
        (s - 6.0) as f32
    };
    let bs = blocksize;
    let mut v: Vec<f32> = (0..2 * bs).map(|_| normal()).collect();
    let edge = [
        0.0,
        -0.0,
        f32::MIN_POSITIVE / 4.0,
        -f32::MIN_POSITIVE / 8.0,
        1e-30,
        -1e-30,
        3e38,
        -3e38,
        0.5,
        -0.5,
        1.0,
        -1.0,
        0.8614784,
        -0.3398,
        1e-4,
        -1e-4,
    ];
    v.extend((0..bs).map(|i| {
        if i % 2 == 0 {
            edge[(i / 2) % edge.len()]
        } else {
            normal()
        }
    }));
    v.extend((0..bs).map(|i| {
        if i == 3 {
            f32::INFINITY
        } else if i == 5 {
            f32::NEG_INFINITY
        } else {
            normal()
        }
    }));
    v.extend((0..bs).map(|i| if i == 1 { f32::NAN } else { normal() }));
    v.extend(std::iter::repeat_n(0.0, bs));
    v.extend(
        (0..bs).map(|i| f32::from_bits(1 + i as u32 * 977) * if i % 3 == 0 { -1.0 } else { 1.0 }),
    );
    v.extend((0..bs / 2 + 1).map(|_| normal()));
    v
}

/// Lowers `kernel` with each backend that has no device among `devices`; returns the time in
/// ms or the error.
fn codegen_only(
    kernel: &qforge_ir::Kernel,
    devices: &[Box<dyn Device>],
) -> Vec<(
    &'static str,
    std::result::Result<f64, qforge_codegen::Error>,
)> {
    use qforge_codegen::Backend;
    let time = |f: &dyn Fn() -> std::result::Result<String, qforge_codegen::Error>| {
        let t = Instant::now();
        f().map(|_| t.elapsed().as_secs_f64() * 1e3)
    };
    let has_device = |backend: &str| devices.iter().any(|d| d.backend() == backend);
    let mut rows = Vec::new();
    if !has_device(qforge_codegen::ptx::BACKEND) {
        rows.push((
            qforge_codegen::ptx::BACKEND,
            time(&|| qforge_codegen::ptx::PtxBackend::default().emit_text(kernel)),
        ));
    }
    if !has_device(qforge_codegen::wgsl::BACKEND) {
        rows.push((
            "wgsl",
            time(&|| qforge_codegen::wgsl::WgslBackend.emit_text(kernel)),
        ));
    }
    if !has_device(qforge_codegen::stablehlo::BACKEND) {
        rows.push((
            qforge_codegen::stablehlo::BACKEND,
            time(&|| qforge_codegen::stablehlo::StableHloBackend.emit_text(kernel)),
        ));
    }
    rows
}

/// Whether this build has a device for `backend` (its `--device` name is compiled in).
fn built_in(backend: &str) -> bool {
    let device = match backend {
        "ptx" => "cuda",
        "wgsl" => "wgpu",
        "stablehlo" => "stablehlo",
        _ => return false,
    };
    crate::devices::DEVICE_NAMES.contains(&device)
}

/// Runs the check over the whole op library on `devices`.
///
/// # Errors
/// Only for failures to build the library itself; kernel failures become rows.
pub fn run_check(
    devices: &[Box<dyn Device>],
    unavailable: &[Unavailable],
    on_row: &mut dyn FnMut(&CheckRow),
) -> Result<Vec<CheckRow>> {
    let mut rows = Vec::new();
    for entry in library::catalog() {
        let kernel = entry.build()?;
        let name = kernel.name.clone();
        let inputs = builtin_inputs(entry.blocksize());
        let mut reference = entry.example_args(&inputs)?;
        let mut row = |backend: &str, status, mismatches, elements, compile_ms, reason| {
            let r = CheckRow {
                kernel: name.clone(),
                backend: backend.to_string(),
                status,
                mismatches,
                elements,
                compile_ms,
                reason,
            };
            on_row(&r);
            rows.push(r);
        };
        let fresh = reference.clone();
        if let Err(e) = InterpreterDevice.launch(&kernel, &mut OwnedArg::borrow_all(&mut reference))
        {
            row(
                "interpreter",
                "mismatch",
                0,
                0,
                0.0,
                Some(format!("interpreter failed: {e}")),
            );
            continue;
        }
        let (_, elements) = count_mismatches(&kernel, &reference, &reference);
        row("interpreter", "exact", 0, elements, 0.0, None);
        for device in devices {
            let t = Instant::now();
            if let Err(e) = device.compile(&kernel) {
                row(
                    device.backend(),
                    "mismatch",
                    0,
                    0,
                    0.0,
                    Some(format!("compile failed: {e}")),
                );
                continue;
            }
            let compile_ms = t.elapsed().as_secs_f64() * 1e3;
            let mut args = fresh.clone();
            match device.launch(&kernel, &mut OwnedArg::borrow_all(&mut args)) {
                Ok(()) => {
                    let (bad, total) = count_mismatches(&kernel, &reference, &args);
                    let status = if bad == 0 { "exact" } else { "mismatch" };
                    row(device.backend(), status, bad, total, compile_ms, None);
                }
                Err(e) => row(
                    device.backend(),
                    "mismatch",
                    0,
                    0,
                    compile_ms,
                    Some(format!("launch failed: {e}")),
                ),
            }
        }
        let generated = codegen_only(&kernel, devices);
        // A backend whose device could not start but whose code generates here gets one row:
        // the code-generation row below, carrying the reason.
        for u in unavailable
            .iter()
            .filter(|u| !generated.iter().any(|(b, _)| *b == u.backend))
        {
            row(
                u.backend,
                "skipped",
                0,
                0,
                0.0,
                Some(format!("not runnable here: {}", u.reason)),
            );
        }
        // Backends with no running device here (none in this build, or one that could not
        // start): the code must generate (and, for WGSL, pass naga's validator).
        for (backend, lowered) in generated {
            let why = match unavailable.iter().find(|u| u.backend == backend) {
                Some(u) => format!("not runnable here: {}", u.reason),
                None if built_in(backend) => "its device was not selected by --device".into(),
                None => "no device for this backend in this build".into(),
            };
            match lowered {
                Ok(ms) => row(
                    backend,
                    "skipped",
                    0,
                    0,
                    ms,
                    Some(format!("code generated; {why}")),
                ),
                Err(e) => row(
                    backend,
                    "mismatch",
                    0,
                    0,
                    0.0,
                    Some(format!("code generation failed: {e}")),
                ),
            }
        }
    }
    Ok(rows)
}
