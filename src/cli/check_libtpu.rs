//! `qforge check`'s `libtpu` column: the Mosaic modules of the kernels the backend lowers,
//! compiled by libtpu's Mosaic compiler for deviceless TPU v5e and v6e topologies
//! (`scripts/mosaic_check.py`, embedded in the binary), where a Python with libtpu is found.
//! Nothing runs them: that needs a TPU (`docs/backends/mosaic.md`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use qforge_codegen::mosaic::MosaicModule;

/// The generations every module is compiled for.
pub const GENERATIONS: [&str; 2] = ["v5e:1x1", "v6e:1x1"];

/// The script that compiles a folder of modules (`scripts/mosaic_check.py`).
const SCRIPT: &str = include_str!("../../scripts/mosaic_check.py");

/// What libtpu said of one module on one generation: its compile time in seconds, or its
/// error.
pub type Outcome = std::result::Result<f64, String>;

/// The Python with libtpu: `QFORGE_MOSAIC_PYTHON`, else `target/mosaic-venv/bin/python` in
/// the current folder (where `scripts/install-mosaic.sh` puts it), if it exists.
pub fn python() -> Option<PathBuf> {
    let path = std::env::var_os("QFORGE_MOSAIC_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target/mosaic-venv/bin/python"));
    path.exists().then_some(path)
}

/// Compiles `modules` (kernel name, module) with `python` for every generation of
/// [`GENERATIONS`], one process per generation side by side; returns each kernel's outcome per
/// generation, in that order.
///
/// # Errors
/// A message naming the step when the folder cannot be written, a process cannot start or
/// fails, or a line of its output is not the script's JSON.
pub fn compile(
    python: &std::path::Path,
    modules: &[(String, MosaicModule)],
) -> std::result::Result<HashMap<String, Vec<Outcome>>, String> {
    let dir = std::env::temp_dir().join(format!("qforge-check-libtpu-{}", std::process::id()));
    let result = compile_in(python, modules, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn compile_in(
    python: &std::path::Path,
    modules: &[(String, MosaicModule)],
    dir: &std::path::Path,
) -> std::result::Result<HashMap<String, Vec<Outcome>>, String> {
    let write = |name: &str, bytes: &str| {
        std::fs::write(dir.join(name), bytes)
            .map_err(|e| format!("writing {}: {e}", dir.join(name).display()))
    };
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let script = dir.join("mosaic_check.py");
    write("mosaic_check.py", SCRIPT)?;
    let modules_dir = dir.join("modules");
    std::fs::create_dir_all(&modules_dir)
        .map_err(|e| format!("creating {}: {e}", modules_dir.display()))?;
    for (name, m) in modules {
        let manifest = serde_json::to_string(&m.manifest).map_err(|e| e.to_string())?;
        write(&format!("modules/{name}.mlir"), &m.text)?;
        write(&format!("modules/{name}.json"), &manifest)?;
    }
    let children = GENERATIONS
        .iter()
        .map(|generation| {
            Command::new(python)
                .arg(&script)
                .arg(&modules_dir)
                .arg(generation)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| format!("starting {}: {e}", python.display()))
        })
        .collect::<std::result::Result<Vec<_>, String>>()?;
    let mut outcomes: HashMap<String, Vec<Outcome>> = HashMap::new();
    for (generation, child) in GENERATIONS.iter().zip(children) {
        let out = child
            .wait_with_output()
            .map_err(|e| format!("waiting for the {generation} check: {e}"))?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let last = stderr.lines().last().unwrap_or("");
            return Err(format!(
                "{} {} for {generation} failed ({}): {last}",
                python.display(),
                script.display(),
                out.status
            ));
        }
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let v: serde_json::Value = serde_json::from_str(line)
                .map_err(|e| format!("the {generation} check printed {line:?}: {e}"))?;
            let kernel = v["kernel"].as_str().unwrap_or_default().to_string();
            let outcome = if v["ok"] == true {
                Ok(v["seconds"].as_f64().unwrap_or(0.0))
            } else {
                Err(v["error"]
                    .as_str()
                    .unwrap_or("no error message")
                    .to_string())
            };
            outcomes.entry(kernel).or_default().push(outcome);
        }
    }
    Ok(outcomes)
}
