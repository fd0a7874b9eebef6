//! `qforge compile`: one kernel (a library kernel by name, or a `.qir` file) compiled ahead of
//! time for one target through [`qforge_codegen::compile()`], written as its code, its manifest
//! (`OUT.json`) and its text form (`OUT.qir`).

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use qforge_codegen::compile::{CpuLevel, LlvmTarget, Options};
use qforge_codegen::ptx::SmTarget;
use qforge_codegen::wgsl::WgslOptions;
use qforge_codegen::{Artifact, Target};
use qforge_ir::Kernel;

use crate::error::{Error, Result};

/// The target kinds `--target` accepts, as [`Target::kind`] spells them.
pub const TARGET_KINDS: [&str; 9] = [
    "cpu-obj",
    "cpu-obj-llvm",
    "clif",
    "llvm-ir",
    "ptx",
    "wgsl",
    "spirv",
    "stablehlo",
    "mosaic",
];

/// Where the kernel comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// A library kernel by its catalog name (`qforge list-kernels`).
    Library(String),
    /// A file in the text form (`qforge_ir::text`).
    File(PathBuf),
}

/// A `qforge compile` request as typed on the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// The kernel.
    pub source: Source,
    /// `--target`: one of [`TARGET_KINDS`].
    pub target: String,
    /// `--feature-level` (CPU targets): a [`CpuLevel`] name; default [`host_level`].
    pub feature_level: Option<String>,
    /// `--sm` (ptx): `80` or `90` (`sm_80`, `sm_90` also accepted); default 80.
    pub sm: Option<String>,
    /// `--dim` (stablehlo, mosaic): the value of every dimension parameter; default
    /// [`qforge_codegen::stablehlo::TEXT_DIM`].
    pub dim: Option<u32>,
    /// `--scalar NAME=VALUE` (mosaic, repeatable): an integer parameter of another value than
    /// `--dim` (a matmul's `m`, `n`, `k`, `n_items`, ...).
    pub scalars: Vec<String>,
    /// `--soft-math` (wgsl, spirv): exact software fma, division and sqrt.
    pub soft_math: bool,
    /// `--no-bounds-checks` (CPU targets).
    pub no_bounds_checks: bool,
}

/// The best CPU feature level of the machine running this, if it has one: the highest x86-64
/// level whose every feature ([`CpuLevel::features`]) the CPU reports, or `aarch64`.
pub fn host_level() -> Option<CpuLevel> {
    if cfg!(target_arch = "aarch64") {
        return Some(CpuLevel::Aarch64);
    }
    if !cfg!(target_arch = "x86_64") {
        return None;
    }
    CpuLevel::of_arch("x86_64")
        .into_iter()
        .filter(|l| {
            l.features()
                .iter()
                .all(|f| qforge_runtime::aot::host_has(f))
        })
        .max()
}

/// The level `--feature-level` names, or the host's.
fn level(req: &Request) -> Result<CpuLevel> {
    match &req.feature_level {
        Some(name) => CpuLevel::from_name(name).map_err(|_| {
            Error::Usage(format!(
                "unknown --feature-level '{name}' (known: {})",
                level_names()
            ))
        }),
        None => host_level().ok_or_else(|| {
            Error::Usage(format!(
                "this machine's architecture has no CPU feature level; pass --feature-level \
                 ({})",
                level_names()
            ))
        }),
    }
}

fn level_names() -> String {
    CpuLevel::ALL
        .iter()
        .map(|l| l.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The target and options `req` asks for.
///
/// # Errors
/// [`Error::Usage`] naming an unknown target, level or SM version (with the valid ones), or an
/// option given for a target it does not apply to.
pub fn target(req: &Request) -> Result<(Target, Options)> {
    let kind = req.target.as_str();
    if !TARGET_KINDS.contains(&kind) {
        return Err(Error::Usage(format!(
            "unknown --target '{kind}' (known: {})",
            TARGET_KINDS.join(", ")
        )));
    }
    let cpu = matches!(kind, "cpu-obj" | "cpu-obj-llvm" | "clif" | "llvm-ir");
    let only = |given: bool, option: &str, targets: &str| {
        if given {
            Err(Error::Usage(format!(
                "{option} applies to --target {targets}, not {kind}"
            )))
        } else {
            Ok(())
        }
    };
    only(
        req.feature_level.is_some() && !cpu,
        "--feature-level",
        "cpu-obj, cpu-obj-llvm, clif or llvm-ir",
    )?;
    only(
        req.no_bounds_checks && !cpu,
        "--no-bounds-checks",
        "cpu-obj, cpu-obj-llvm, clif or llvm-ir",
    )?;
    only(req.sm.is_some() && kind != "ptx", "--sm", "ptx")?;
    only(
        req.dim.is_some() && !matches!(kind, "stablehlo" | "mosaic"),
        "--dim",
        "stablehlo or mosaic",
    )?;
    only(
        !req.scalars.is_empty() && kind != "mosaic",
        "--scalar",
        "mosaic",
    )?;
    if req.dim == Some(0) {
        return Err(Error::Usage(format!(
            "--dim 0: a {kind} module's dimensions must be at least 1"
        )));
    }
    only(
        req.soft_math && !matches!(kind, "wgsl" | "spirv"),
        "--soft-math",
        "wgsl or spirv",
    )?;
    let wgsl = if req.soft_math {
        WgslOptions::SOFTWARE
    } else {
        WgslOptions::HARDWARE
    };
    let target = match kind {
        "cpu-obj" => Target::cpu_object(level(req)?),
        // Needs the `llvm` feature: compile() says so otherwise.
        "cpu-obj-llvm" => Target::llvm_object(level(req)?),
        "clif" => Target::Clif { level: level(req)? },
        "llvm-ir" => Target::LlvmIr(LlvmTarget::for_level(level(req)?)),
        "ptx" => Target::Ptx(sm(req.sm.as_deref())?),
        "wgsl" => Target::Wgsl(wgsl),
        "spirv" => Target::Spirv(wgsl),
        "mosaic" => Target::Mosaic {
            dim: req.dim.unwrap_or(qforge_codegen::stablehlo::TEXT_DIM),
            scalars: req
                .scalars
                .iter()
                .map(|s| named_scalar(s))
                .collect::<Result<_>>()?,
        },
        _ => Target::StableHlo {
            dim: req.dim.unwrap_or(qforge_codegen::stablehlo::TEXT_DIM),
        },
    };
    let options = Options {
        bounds_checks: !req.no_bounds_checks,
        ..Options::default()
    };
    Ok((target, options))
}

/// `--scalar`'s names: each an integer scalar parameter of `kernel`, given once; and, without
/// `--dim`, every such parameter (its default would be a launch the user did not ask for).
fn check_scalars(kernel: &qforge_ir::Kernel, named: &[(String, u32)], dim: bool) -> Result<()> {
    use qforge_ir::{ParamKind, ScalarType};
    if named.is_empty() {
        return Ok(());
    }
    let integers: Vec<&str> = kernel
        .params
        .iter()
        .filter(|(_, p)| matches!(p.kind, ParamKind::Scalar(ScalarType::U32 | ScalarType::I32)))
        .map(|(_, p)| p.name.as_str())
        .collect();
    for (i, (name, _)) in named.iter().enumerate() {
        if !integers.contains(&name.as_str()) {
            return Err(Error::Usage(format!(
                "--scalar {name}: kernel '{}' has no integer parameter {name} (it has {})",
                kernel.name,
                integers.join(", ")
            )));
        }
        if named[..i].iter().any(|(n, _)| n == name) {
            return Err(Error::Usage(format!("--scalar {name} given twice")));
        }
    }
    let missing: Vec<&str> = integers
        .iter()
        .filter(|p| !named.iter().any(|(n, _)| n == *p))
        .copied()
        .collect();
    if !dim && !missing.is_empty() {
        return Err(Error::Usage(format!(
            "--scalar gives no {} of kernel '{}' (name each, or give --dim for the rest)",
            missing.join(", "),
            kernel.name
        )));
    }
    Ok(())
}

/// `--scalar NAME=VALUE`'s name and value.
fn named_scalar(s: &str) -> Result<(String, u32)> {
    s.split_once('=')
        .and_then(|(n, v)| Some((n.trim().to_string(), v.trim().parse().ok()?)))
        .filter(|(n, _)| !n.is_empty())
        .ok_or_else(|| {
            Error::Usage(format!(
                "--scalar {s}: expected NAME=VALUE with VALUE an integer from 0 to {}",
                u32::MAX
            ))
        })
}

/// The SM version `--sm` names (default 80).
fn sm(name: Option<&str>) -> Result<SmTarget> {
    let Some(name) = name else {
        return Ok(SmTarget::Sm80);
    };
    let digits = name
        .strip_prefix("sm_")
        .or_else(|| name.strip_prefix("sm"))
        .unwrap_or(name);
    SmTarget::ALL
        .into_iter()
        .find(|s| s.name().strip_prefix("sm_") == Some(digits))
        .ok_or_else(|| {
            let known: Vec<&str> = SmTarget::ALL
                .iter()
                .filter_map(|s| s.name().strip_prefix("sm_"))
                .collect();
            Error::Usage(format!(
                "unknown --sm '{name}' (known: {})",
                known.join(", ")
            ))
        })
}

/// The library kernel called `name`.
///
/// # Errors
/// [`Error::Usage`] for an unknown name, listing the closest library names and pointing at
/// `qforge list-kernels`; the kernel's build error.
pub fn library_kernel(name: &str) -> Result<Kernel> {
    let catalog = qforge_kernels::catalog();
    if let Some(spec) = catalog.iter().find(|s| s.name() == name) {
        return Ok(spec.build()?);
    }
    let names: Vec<String> = catalog.iter().map(|s| s.name()).collect();
    let close = close_matches(name, &names);
    let hint = match close.len() {
        0 => String::new(),
        n if n <= 8 => format!("; close matches: {}", close.join(", ")),
        n => format!(
            "; close matches: {}, and {} more",
            close[..8].join(", "),
            n - 8
        ),
    };
    Err(Error::Usage(format!(
        "no library kernel is called '{name}'{hint} (`qforge list-kernels` lists all {})",
        names.len()
    )))
}

/// The names among `names` that contain `query`, or else the longest start of `query` that
/// some names contain (`quantize_4bit_nf4_bs65` finds the `..._bs64_..` kernels).
fn close_matches<'a>(query: &str, names: &'a [String]) -> Vec<&'a str> {
    let mut prefix = query;
    while prefix.chars().count() >= 3 {
        let hits: Vec<&str> = names
            .iter()
            .filter(|n| n.contains(prefix))
            .map(String::as_str)
            .collect();
        if !hits.is_empty() {
            return hits;
        }
        let mut chars = prefix.chars();
        chars.next_back();
        prefix = chars.as_str();
    }
    Vec::new()
}

/// Parses the kernel in the text-form file `path` (not yet verified).
///
/// # Errors
/// [`Error::Io`] naming the file; [`Error::Usage`] `FILE:LINE:COLUMN: message` for a syntax
/// error.
pub fn parse_file(path: &Path) -> Result<Kernel> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    qforge_ir::text::parse(&text).map_err(|e| match e {
        qforge_ir::Error::Parse { line, col, message } => Error::Usage(format!(
            "{}:{line}:{col}: parse error: {message}",
            path.display()
        )),
        other => Error::Usage(format!("{}: {other}", path.display())),
    })
}

/// The 1-based line of `text` that defines the value a verifier location names (`%N`, defined
/// by a line `%N: type = ...`).
fn value_line(text: &str, location: &str) -> Option<usize> {
    let at = location.find('%')?;
    let digits: String = location[at + 1..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    let n: u32 = digits.parse().ok()?;
    let def = format!("%{n}");
    text.lines()
        .position(|l| {
            l.trim_start()
                .strip_prefix(&def)
                .is_some_and(|rest| rest.trim_start().starts_with(':'))
        })
        .map(|i| i + 1)
}

/// The 1-based line of the innermost statement on a verifier location's path
/// (`body[3].then[0] ...`), from the parser's statement lines.
fn stmt_line(lines: &HashMap<String, usize>, location: &str) -> Option<usize> {
    let path = location.split_whitespace().next().unwrap_or("");
    let mut end = path.len();
    loop {
        if let Some(l) = lines.get(&path[..end]) {
            return Some(*l);
        }
        let open = path[..end].rfind('[')?;
        end = path[..open].rfind(']')? + 1;
    }
}

/// A verification error of the kernel parsed from `path`, with the file and the line of each
/// problem: the line that defines the value it names, else its statement's line.
fn verify_error_in_file(path: &Path, kernel: &str, errors: &[qforge_ir::VerifyError]) -> Error {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines = qforge_ir::text::parse_with_lines(&text)
        .map(|(_, lines)| lines)
        .unwrap_or_default();
    let line_of = |e: &qforge_ir::VerifyError| {
        value_line(&text, &e.location).or_else(|| stmt_line(&lines, &e.location))
    };
    let problems: Vec<String> = errors
        .iter()
        .map(|e| match line_of(e) {
            Some(line) => format!("line {line}: {e}"),
            None => e.to_string(),
        })
        .collect();
    let first = errors
        .iter()
        .find_map(line_of)
        .map_or(String::new(), |l| format!("{l}:"));
    Error::Usage(format!(
        "{}:{first} kernel '{kernel}' failed verification ({} problem(s)): {}",
        path.display(),
        errors.len(),
        problems.join("; ")
    ))
}

/// The kernel of `source`.
///
/// # Errors
/// See [`library_kernel`] and [`parse_file`].
pub fn load(source: &Source) -> Result<Kernel> {
    match source {
        Source::Library(name) => library_kernel(name),
        Source::File(path) => parse_file(path),
    }
}

/// Compiles the kernel `req` names for its target.
///
/// # Errors
/// Usage errors of [`target`] and [`load`]; verification errors naming the kernel (and, for a
/// file, the file and line); code generation errors naming the kernel and the target.
pub fn compile(req: &Request) -> Result<Artifact> {
    let (target, options) = target(req)?;
    let kernel = load(&req.source)?;
    if let Target::Mosaic { scalars, .. } = &target {
        check_scalars(&kernel, scalars, req.dim.is_some())?;
    }
    qforge_codegen::compile(&kernel, &target, &options).map_err(|e| match (e, &req.source) {
        (
            qforge_codegen::Error::Ir(qforge_ir::Error::Verify { kernel: k, errors }),
            Source::File(p),
        ) => verify_error_in_file(p, &k, &errors),
        (qforge_codegen::Error::Ir(e @ qforge_ir::Error::Verify { .. }), _) => Error::Ir(e),
        (e, _) => Error::Usage(format!(
            "kernel '{}' for target {}: {e}",
            kernel.name,
            target.kind()
        )),
    })
}

/// `path` with `.ext` appended to its file name (`k.o` -> `k.o.json`).
pub fn sidecar(path: &Path, ext: &str) -> PathBuf {
    let mut name: OsString = path.as_os_str().to_owned();
    name.push(".");
    name.push(ext);
    PathBuf::from(name)
}

/// Writes `artifact` to `out` (the code), `out.json` (the manifest) and `out.qir` (the
/// kernel's text form), each through a temporary file renamed into place once all three are
/// written. Returns the three paths.
///
/// # Errors
/// [`Error::Usage`] for an output that must not be replaced (a directory, a read-only file, a
/// missing folder), [`Error::Io`] naming the file.
pub fn write(artifact: &Artifact, out: &Path) -> Result<[PathBuf; 3]> {
    let paths = [out.to_path_buf(), sidecar(out, "json"), sidecar(out, "qir")];
    let mut manifest = artifact.manifest.to_json();
    manifest.push('\n');
    crate::checkpoint::io::write_files_atomic(&[
        (paths[0].clone(), artifact.code.bytes()),
        (paths[1].clone(), manifest.into_bytes()),
        (paths[2].clone(), artifact.qir.clone().into_bytes()),
    ])?;
    Ok(paths)
}
