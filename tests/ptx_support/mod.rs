//! Shared by the PTX tests: the library kernels, the numeric-contract checks that can be read off
//! PTX text, and finding and running NVIDIA's `ptxas`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use qforge::codegen::ptx::SmTarget;
use qforge::ir::{Kernel, Op, Stmt};
use qforge::kernels;

pub fn library_kernels() -> Vec<Kernel> {
    kernels::catalog()
        .into_iter()
        .map(|e| e.build().expect("library kernels build"))
        .collect()
}

// ----- the numeric contract on the text -----

pub fn instructions(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .map(|l| l.split("//").next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
}

/// True when the IR asks for a fused multiply-add: an `Op::Fma`, or an `accumulate` (one fma
/// per element and accumulator) anywhere in the body.
pub fn has_fma(kernel: &Kernel) -> bool {
    fn accumulates(stmts: &[Stmt]) -> bool {
        stmts.iter().any(|s| match s {
            Stmt::Accumulate { .. } => true,
            Stmt::If {
                then_body,
                else_body,
                ..
            } => accumulates(then_body) || accumulates(else_body),
            Stmt::For { body, .. } => accumulates(body),
            Stmt::Let(_) | Stmt::Store { .. } | Stmt::Assign { .. } => false,
        })
    }
    accumulates(&kernel.body)
        || kernel
            .values
            .iter()
            .any(|(_, d)| matches!(d.op, Op::Fma(..)))
}

/// Checks every rule that can be read off the text; returns the first broken one.
pub fn contract_violation(kernel: &Kernel, text: &str) -> Option<String> {
    let fma = has_fma(kernel);
    for ins in instructions(text) {
        // Drop a guard predicate (`@%p1 `) to get at the opcode.
        let unguarded = match ins.strip_prefix('@') {
            Some(rest) => rest.split_once(' ').map_or("", |(_, r)| r),
            None => ins,
        };
        let opcode = unguarded.split_whitespace().next().unwrap_or("");
        if opcode.contains(".ftz") || opcode.contains(".approx") {
            return Some(format!("flush/approximate instruction: {ins}"));
        }
        if opcode.starts_with("fma") && !fma {
            return Some(format!("fma without Op::Fma: {ins}"));
        }
        if opcode.starts_with("mad") && opcode.ends_with(".f32") {
            return Some(format!("contracted float multiply-add: {ins}"));
        }
        let float_arith = ["add", "sub", "mul", "div", "sqrt", "fma"]
            .iter()
            .any(|op| opcode.starts_with(&format!("{op}.")) && opcode.ends_with(".f32"));
        if float_arith && !opcode.contains(".rn.") {
            return Some(format!("float instruction without .rn: {ins}"));
        }
        if (opcode.starts_with("min.") || opcode.starts_with("max.")) && opcode.ends_with("f32") {
            return Some(format!("hardware float min/max: {ins}"));
        }
        if opcode.starts_with("cvt.") && opcode.contains(".f16.f32") | opcode.contains(".bf16.f32")
        {
            let rounded = [".rn.", ".rz.", ".rm.", ".rp."]
                .iter()
                .any(|r| opcode.contains(r));
            if !rounded {
                return Some(format!("narrowing cvt without rounding: {ins}"));
            }
        }
    }
    None
}

// ----- ptxas -----

pub fn find_ptxas() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("QFORGE_PTXAS") {
        return Some(PathBuf::from(p));
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/ptxas-venv/lib");
    if let Ok(dirs) = std::fs::read_dir(&venv) {
        let mut found: Vec<PathBuf> = dirs
            .flatten()
            .map(|d| d.path().join("site-packages/nvidia/cuda_nvcc/bin/ptxas"))
            .filter(|p| p.is_file())
            .collect();
        found.sort();
        if let Some(p) = found.pop() {
            return Some(p);
        }
    }
    let ok = Command::new("ptxas").arg("--version").output();
    ok.ok()
        .filter(|o| o.status.success())
        .map(|_| PathBuf::from("ptxas"))
}

/// Registers and spill bytes reported by `ptxas -v`, or the error text.
pub fn assemble(
    ptxas: &Path,
    dir: &Path,
    name: &str,
    text: &str,
    target: SmTarget,
) -> Result<String, String> {
    let src = dir.join(format!("{name}.{}.ptx", target.name()));
    std::fs::write(&src, text).map_err(|e| format!("writing {}: {e}", src.display()))?;
    let out = Command::new(ptxas)
        .arg(format!("-arch={}", target.name()))
        .arg("-v")
        .arg(&src)
        .arg("-o")
        .arg(dir.join(format!("{name}.{}.cubin", target.name())))
        .output()
        .map_err(|e| format!("running {}: {e}", ptxas.display()))?;
    let log =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || log.contains("error") {
        return Err(log);
    }
    let regs = log
        .split("Used ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .unwrap_or("?")
        .to_string();
    let spill_stores = log
        .split(" bytes spill stores")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .unwrap_or("?")
        .to_string();
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains("warning")).collect();
    let mut summary = format!("{regs} registers, {spill_stores} bytes spilled");
    if !warnings.is_empty() {
        summary = format!("{summary} [{}]", warnings.join("; "));
    }
    Ok(summary)
}
