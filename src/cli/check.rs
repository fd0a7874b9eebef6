//! `qforge check`: every library kernel on every backend compiled in, compared bit for bit with
//! the reference interpreter on built-in inputs that include edge values.

use std::time::Instant;

use qforge_ir::{count_mismatches, OwnedArg};
use qforge_kernels::CatalogEntry;
use qforge_runtime::{Device, InterpreterDevice};

use qforge_codegen::mosaic::MosaicModule;

use super::check_libtpu;
use crate::devices::Unavailable;
use crate::error::{Error, Result};

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

/// A matmul's arguments for the Mosaic row and the interpreter's result on them: the Mosaic
/// matmul reads whole absmax blocks per weight row (`docs/backends/mosaic.md`, the matmul
/// class), so its reduction is the built-in inputs cut to whole blocks; `None` for other
/// kernels (the check's own arguments serve).
fn mosaic_args(
    entry: &dyn CatalogEntry,
    kernel: &qforge_ir::Kernel,
    inputs: &[f32],
) -> Result<Option<(Vec<OwnedArg>, Vec<OwnedArg>)>> {
    let matmul = kernel
        .body
        .iter()
        .any(|s| matches!(s, qforge_ir::Stmt::Accumulate { .. }));
    let whole = inputs.len() / entry.blocksize() * entry.blocksize();
    if !matmul || whole == inputs.len() || whole == 0 {
        return Ok(None);
    }
    let fresh = entry.example_args(&inputs[..whole])?;
    let mut reference = fresh.clone();
    InterpreterDevice.launch(kernel, &mut OwnedArg::borrow_all(&mut reference))?;
    Ok(Some((fresh, reference)))
}

/// The `mosaic` row of `kernel` on the arguments `fresh`, whose interpreter results are
/// `reference`: `(status, mismatches, elements, lowering ms, reason)`, and the module where it
/// lowered. A kernel the backend does not lower is skipped with its reason (`not lowered:
/// ...`); a lowered one runs its StableHLO twin on `twin` against `reference` (`twin ...`,
/// exact or mismatching), and without one is `code generated` only. Nothing runs the module
/// itself here: that needs a TPU (libtpu compiles it: the `libtpu` rows, `check_libtpu.rs`).
fn mosaic_row(
    kernel: &qforge_ir::Kernel,
    fresh: &[OwnedArg],
    reference: &[OwnedArg],
    twin: Option<&dyn Device>,
) -> (MosaicRow, Option<MosaicModule>) {
    let mut args = fresh.to_vec();
    let borrowed = OwnedArg::borrow_all(&mut args);
    let shapes = match qforge_ir::bind(kernel, &borrowed) {
        Ok(b) => qforge_codegen::mosaic::Shapes {
            grid: b.grid,
            elements: b.elements.clone(),
        },
        Err(e) => return (("mismatch", 0, 0, 0.0, format!("launch shapes: {e}")), None),
    };
    let scalars = qforge_codegen::mosaic::scalar_values(&borrowed);
    drop(borrowed);
    let t = Instant::now();
    let module = match qforge_codegen::mosaic::lower_with(kernel, &shapes, &scalars) {
        Err(qforge_codegen::Error::Unsupported { op, .. }) => {
            return (("skipped", 0, 0, 0.0, format!("not lowered: {op}")), None)
        }
        Err(e) => {
            let why = format!("code generation failed: {e}");
            return (("mismatch", 0, 0, 0.0, why), None);
        }
        Ok(m) => m,
    };
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let Some(twin) = twin else {
        let why = "code generated; not runnable here: no TPU (the twin needs a stablehlo device)";
        return (("skipped", 0, 0, ms, why.into()), Some(module));
    };
    let row = match twin.launch(kernel, &mut OwnedArg::borrow_all(&mut args)) {
        Ok(()) => {
            let (bad, total) = count_mismatches(kernel, reference, &args);
            let status = if bad == 0 { "exact" } else { "mismatch" };
            (status, bad, total, ms, TWIN.into())
        }
        Err(e) => ("mismatch", 0, 0, ms, format!("twin launch failed: {e}")),
    };
    (row, Some(module))
}

/// A `mosaic` row: `(status, mismatches, elements, lowering ms, reason)`.
type MosaicRow = (&'static str, usize, usize, f64, String);

/// The `libtpu` rows of the lowered kernels' `modules` (see `check_libtpu.rs`): skipped as
/// `compiled (libtpu v5e, v6e)` where every generation accepted the module (no TPU runs it
/// here), a mismatch naming the generation and libtpu's error where one did not, or where
/// the check itself failed. None without a Python with libtpu.
fn libtpu_rows(modules: &[(String, MosaicModule)]) -> Vec<(String, MosaicRow)> {
    let Some(python) = check_libtpu::python().filter(|_| !modules.is_empty()) else {
        return Vec::new();
    };
    let outcomes = check_libtpu::compile(&python, modules);
    modules
        .iter()
        .map(|(name, _)| {
            let row = match outcomes.as_ref().map(|o| o.get(name)) {
                Err(e) => ("mismatch", 0, 0, 0.0, format!("libtpu check failed: {e}")),
                Ok(Some(per)) if per.len() == check_libtpu::GENERATIONS.len() => {
                    match per
                        .iter()
                        .zip(check_libtpu::GENERATIONS)
                        .find(|(o, _)| o.is_err())
                    {
                        Some((Err(e), generation)) => {
                            ("mismatch", 0, 0, 0.0, format!("libtpu {generation}: {e}"))
                        }
                        _ => {
                            let secs: f64 = per.iter().flatten().sum();
                            ("skipped", 0, 0, secs * 1e3, LIBTPU.into())
                        }
                    }
                }
                Ok(_) => (
                    "mismatch",
                    0,
                    0,
                    0.0,
                    format!(
                        "{} printed no result for some of {:?}",
                        python.display(),
                        check_libtpu::GENERATIONS
                    ),
                ),
            };
            (name.clone(), row)
        })
        .collect()
}

/// The reason of a `libtpu` row whose module every generation compiled.
const LIBTPU: &str = "compiled (libtpu v5e, v6e); not runnable here: no TPU";

/// The reason of a `mosaic` row whose twin ran (the table shows `twin exact`).
const TWIN: &str = "twin: the module's tile program on the StableHLO interpreter (no TPU here)";

/// The Mosaic twin device, on the `stablehlo` device's runners (`None` without the feature or
/// when they cannot start).
fn twin_device() -> Option<Box<dyn Device>> {
    #[cfg(feature = "stablehlo")]
    {
        qforge_runtime::MosaicTwinDevice::new()
            .ok()
            .map(|d| Box::new(d) as Box<dyn Device>)
    }
    #[cfg(not(feature = "stablehlo"))]
    {
        None
    }
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

/// Runs the check over the op library on `devices`: every kernel, or those whose name contains
/// `filter`. `on_row` sees each row as soon as it is known.
///
/// # Errors
/// [`Error::Usage`] when `filter` matches no kernel; failures to build the library itself.
/// Kernel failures are not errors: they become rows (see [`passed`]).
pub fn run_check(
    devices: &[Box<dyn Device>],
    unavailable: &[Unavailable],
    filter: Option<&str>,
    on_row: &mut dyn FnMut(&CheckRow),
) -> Result<Vec<CheckRow>> {
    let catalog: Vec<_> = qforge_kernels::catalog()
        .into_iter()
        .filter(|e| filter.is_none_or(|f| e.name().contains(f)))
        .collect();
    if let (Some(f), true) = (filter, catalog.is_empty()) {
        return Err(Error::Usage(format!(
            "--filter '{f}' matches no library kernel name"
        )));
    }
    let entries: Vec<&dyn CatalogEntry> = catalog.iter().map(|e| e as &dyn CatalogEntry).collect();
    run_check_entries(devices, unavailable, &entries, on_row)
}

/// [`run_check`] over `entries`: the library's, a user's own kernels, or both (a user's kernel
/// joins `qforge check` by implementing [`CatalogEntry`], see `examples/custom-op`).
///
/// # Errors
/// Failures to build a kernel's example arguments. Kernel failures become rows.
pub fn run_check_entries(
    devices: &[Box<dyn Device>],
    unavailable: &[Unavailable],
    entries: &[&dyn CatalogEntry],
    on_row: &mut dyn FnMut(&CheckRow),
) -> Result<Vec<CheckRow>> {
    let mut rows = Vec::new();
    let mut modules = Vec::new();
    // The Mosaic twin runs where the StableHLO interpreter does.
    let twin = devices
        .iter()
        .any(|d| d.backend() == qforge_codegen::stablehlo::BACKEND)
        .then(twin_device)
        .flatten();
    for &entry in entries {
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
        let (mosaic_fresh, mosaic_reference) = mosaic_args(entry, &kernel, &inputs)?
            .unwrap_or_else(|| (fresh.clone(), reference.clone()));
        let ((status, mismatches, elements, ms, reason), module) =
            mosaic_row(&kernel, &mosaic_fresh, &mosaic_reference, twin.as_deref());
        modules.extend(module.map(|m| (name.clone(), m)));
        row(
            qforge_codegen::mosaic::BACKEND,
            status,
            mismatches,
            elements,
            ms,
            Some(reason),
        );
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
    // libtpu compiles every lowered module in one process per generation.
    for (kernel, (status, mismatches, elements, compile_ms, reason)) in libtpu_rows(&modules) {
        let r = CheckRow {
            kernel,
            backend: "libtpu".into(),
            status,
            mismatches,
            elements,
            compile_ms,
            reason: Some(reason),
        };
        on_row(&r);
        rows.push(r);
    }
    Ok(rows)
}

/// Whether every row passed: no `mismatch` row (a wrong element, or a compile, launch or code
/// generation failure). `qforge check` exits with 1 when this is false.
pub fn passed(rows: &[CheckRow]) -> bool {
    !rows.iter().any(|r| r.status == "mismatch")
}

/// A `mosaic` row of a kernel outside the Mosaic backend's class.
fn not_lowered(r: &CheckRow) -> bool {
    r.status == "skipped"
        && r.reason
            .as_deref()
            .is_some_and(|m| m.starts_with("not lowered"))
}

/// A row whose code generated (and, for WGSL, validated) but had no device here to run on.
fn generated_only(r: &CheckRow) -> bool {
    r.status == "skipped"
        && r.reason
            .as_deref()
            .is_some_and(|m| m.starts_with("code generated"))
}

/// The human-readable report of `qforge check`, one string per line: a kernel x backend table
/// (`bit-exact`, `N mismatches`, `error`, `generated`, `not runnable`), then each failure's
/// reason, each device that could not start, and a summary line with the counts.
pub fn table(rows: &[CheckRow], unavailable: &[Unavailable]) -> Vec<String> {
    let mut lines = Vec::new();
    let mut backends: Vec<&str> = Vec::new();
    for r in rows {
        if !backends.contains(&r.backend.as_str()) {
            backends.push(&r.backend);
        }
    }
    let width = rows.iter().map(|r| r.kernel.len()).max().unwrap_or(6);
    let mut header = format!("{:width$}", "kernel");
    for b in &backends {
        header += &format!("  {b:>14}");
    }
    lines.push(header);
    // In first-seen order (the `libtpu` rows come after every kernel's others).
    let mut kernels: Vec<&str> = Vec::new();
    for r in rows {
        if !kernels.contains(&r.kernel.as_str()) {
            kernels.push(&r.kernel);
        }
    }
    for k in kernels {
        let mut line = format!("{k:width$}");
        for b in &backends {
            let cell = match rows.iter().find(|r| r.kernel == k && r.backend == *b) {
                Some(r) if r.status == "exact" && r.reason.as_deref() == Some(TWIN) => {
                    "twin exact".to_string()
                }
                Some(r) if r.status == "exact" => "bit-exact".to_string(),
                Some(r) if not_lowered(r) => "not lowered".to_string(),
                Some(r) if r.status == "skipped" && r.reason.as_deref() == Some(LIBTPU) => {
                    "compiled".to_string()
                }
                Some(r) if generated_only(r) => "generated".to_string(),
                Some(r) if r.status == "skipped" => "not runnable".to_string(),
                Some(r) if r.reason.is_some() && r.reason.as_deref() != Some(TWIN) => {
                    "error".to_string()
                }
                Some(r) => format!("{} mismatches", r.mismatches),
                None => "not built".to_string(),
            };
            line += &format!("  {cell:>14}");
        }
        lines.push(line);
    }
    for r in rows.iter().filter(|r| {
        r.status == "mismatch" && r.reason.is_some() && r.reason.as_deref() != Some(TWIN)
    }) {
        lines.push(format!(
            "{} on {}: {}",
            r.kernel,
            r.backend,
            r.reason.as_deref().unwrap_or("")
        ));
    }
    for u in unavailable {
        lines.push(format!("{}: not runnable here: {}", u.backend, u.reason));
    }
    let kernels = rows.iter().filter(|r| r.backend == "interpreter").count();
    let compared: Vec<&CheckRow> = rows.iter().filter(|r| r.backend != "interpreter").collect();
    let exact = compared.iter().filter(|r| r.status == "exact").count();
    let failed = compared.iter().filter(|r| r.status == "mismatch").count();
    let generated = compared.iter().filter(|r| generated_only(r)).count();
    let not_lowered = compared.iter().filter(|r| not_lowered(r)).count();
    let compiled = compared
        .iter()
        .filter(|r| r.status == "skipped" && r.reason.as_deref() == Some(LIBTPU))
        .count();
    let skipped = compared.iter().filter(|r| r.status == "skipped").count()
        - generated
        - not_lowered
        - compiled;
    let twins = compared
        .iter()
        .filter(|r| r.status == "exact" && r.reason.as_deref() == Some(TWIN))
        .count();
    let reference_failed = rows
        .iter()
        .filter(|r| r.backend == "interpreter" && r.status == "mismatch")
        .count();
    let twins = if twins > 0 {
        format!(" ({twins} of them Mosaic twins)")
    } else {
        String::new()
    };
    let mut summary = format!(
        "{kernels} kernels on {} backend(s) besides the interpreter: {exact} bit-exact{twins}, \
         {failed} mismatching, {generated} code generated only (no device here to run it), \
         {compiled} compiled by libtpu (no TPU here to run them), {skipped} not runnable, \
         {not_lowered} not lowered (Mosaic)",
        backends.len().saturating_sub(1)
    );
    if reference_failed > 0 {
        summary += &format!(
            "; {reference_failed} kernel(s) failed on the interpreter itself (nothing compared)"
        );
    }
    lines.push(summary);
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(kernel: &str, backend: &str, status: &'static str, reason: Option<&str>) -> CheckRow {
        CheckRow {
            kernel: kernel.into(),
            backend: backend.into(),
            status,
            mismatches: 0,
            elements: 0,
            compile_ms: 0.0,
            reason: reason.map(String::from),
        }
    }

    #[test]
    fn a_kernel_failing_on_the_interpreter_is_counted_in_the_summary() {
        let rows = [
            row("good", "interpreter", "exact", None),
            row("good", "cranelift", "exact", None),
            row(
                "bad",
                "interpreter",
                "mismatch",
                Some("expected 7 arguments, got 6"),
            ),
        ];
        let lines = table(&rows, &[]);
        let summary = lines.last().unwrap();
        assert!(summary.contains("1 bit-exact"), "{summary}");
        assert!(
            summary.contains("1 kernel(s) failed on the interpreter itself"),
            "{summary}"
        );
        assert!(!passed(&rows));
        let fine = &rows[..2];
        assert!(!table(fine, &[])
            .last()
            .unwrap()
            .contains("interpreter itself"));
        assert!(passed(fine));
    }
}
