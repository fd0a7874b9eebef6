//! qforge-build: compile kernels ahead of time from a build script.
//!
//! ```no_run
//! // build.rs
//! qforge_build::Builder::new()
//!     .library("quantize_4bit_nf4_f32_64")
//!     .text_target(qforge_codegen::Target::Ptx(qforge_codegen::ptx::SmTarget::Sm90))
//!     .run();
//! ```
//! ```ignore
//! // main.rs: the kernels as statics, run with no compiler linked
//! qforge_runtime::include_kernels!();
//! let dev = qforge_runtime::AotDevice::new(KERNELS, qforge_runtime::Policy::RequireAot)?;
//! ```
//!
//! [`Builder::run`] compiles every named kernel through `qforge_codegen::compile` for each CPU
//! feature level of the crate's target architecture (`CARGO_CFG_TARGET_ARCH`; never the build
//! machine's CPU: all levels are built and the program picks at start) and for each text
//! target; writes objects, text artifacts, their manifests and `qforge_kernels.rs` into
//! `OUT_DIR` (each file only when its content changed); archives the objects into a static
//! library and tells cargo to link it; prints the `rerun-if-*` lines. A kernel that fails to
//! build, verify or lower stops the build with an error naming it. `docs/aot.md` has the
//! details.
//!
//! With the `llvm` feature the CPU objects are compiled by LLVM (`default<O3>` for each level's
//! LLVM CPU model, wider vectors at x86-64-v3/v4) instead of Cranelift, one object per kernel
//! per level either way ([`Builder::llvm`]).
//!
//! Environment: `QFORGE_AOT_LEVELS` (comma-separated level names, or `none`; empty is unset)
//! replaces the CPU levels.
#![deny(missing_docs)]

mod generate;
mod output;

use std::path::PathBuf;
use std::time::Instant;

use qforge_codegen::compile::{CpuLevel, Options};
use qforge_codegen::{Artifact, Target};
use qforge_ir::dsl::{Signature, TypedKernel};
use qforge_ir::Kernel;

/// The environment variable that overrides the CPU feature levels.
pub const LEVELS_ENV: &str = "QFORGE_AOT_LEVELS";

/// A build-time error: what failed, naming the kernel, target or file.
#[derive(Debug)]
pub struct BuildError(pub String);

impl std::fmt::Display for BuildError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BuildError {}

/// A kernel to compile, or the error that building it gave.
enum Source {
    Kernel(Kernel),
    Library(String),
    Failed(String),
}

/// What [`Builder::build`] wrote.
#[derive(Debug, Default)]
pub struct Report {
    /// Every artifact, in build order (CPU objects, then text targets, per kernel).
    pub artifacts: Vec<Artifact>,
    /// Files rewritten (their content changed), relative to `OUT_DIR`.
    pub written: Vec<String>,
    /// Compile time per artifact in seconds: (kernel, target kind and settings, seconds).
    pub timings: Vec<(String, String, f64)>,
}

/// Collects kernels and targets, then compiles and writes everything ([`Builder::run`]).
pub struct Builder {
    sources: Vec<Source>,
    levels: Option<Vec<CpuLevel>>,
    text_targets: Vec<Target>,
    options: Options,
    llvm: bool,
    out_dir: Option<PathBuf>,
    runtime_path: String,
    cargo: bool,
}

impl Default for Builder {
    fn default() -> Self {
        Self::new()
    }
}

impl Builder {
    /// A builder writing into `OUT_DIR`, CPU levels from the target architecture (or
    /// [`LEVELS_ENV`]), no text targets, bounds-checked vector code, generated code referring
    /// to the runtime as `::qforge_runtime`.
    pub fn new() -> Self {
        Builder {
            sources: Vec::new(),
            levels: None,
            text_targets: Vec::new(),
            options: Options::default(),
            llvm: cfg!(feature = "llvm"),
            out_dir: None,
            runtime_path: "::qforge_runtime".into(),
            cargo: true,
        }
    }

    /// Adds the library kernel called `name` (as `qforge list-kernels` prints it).
    pub fn library(mut self, name: &str) -> Self {
        self.sources.push(Source::Library(name.to_string()));
        self
    }

    /// Adds every kernel of the op library (`qforge_kernels::catalog()`).
    pub fn whole_library(mut self) -> Self {
        for spec in qforge_kernels::catalog() {
            self.sources.push(match spec.build() {
                Ok(k) => Source::Kernel(k),
                Err(e) => Source::Failed(format!("library kernel '{}': {e}", spec.name())),
            });
        }
        self
    }

    /// Adds a kernel.
    pub fn kernel(mut self, kernel: Kernel) -> Self {
        self.sources.push(Source::Kernel(kernel));
        self
    }

    /// Adds a kernel built with `#[kernel]` (its builder's result: an error, which names the
    /// source line, fails the build).
    pub fn typed<S: Signature>(mut self, kernel: qforge_ir::Result<TypedKernel<S>>) -> Self {
        self.sources.push(match kernel {
            Ok(k) => Source::Kernel(k.kernel().clone()),
            Err(e) => Source::Failed(e.to_string()),
        });
        self
    }

    /// Compiles CPU objects for exactly these levels (instead of every level of the target
    /// architecture); [`LEVELS_ENV`] still wins.
    pub fn cpu_levels(mut self, levels: &[CpuLevel]) -> Self {
        self.levels = Some(levels.to_vec());
        self
    }

    /// Compiles the CPU objects with LLVM (`true`; the default with this crate's `llvm`
    /// feature, and an error naming the feature without it) or with Cranelift (`false`; the
    /// default otherwise).
    pub fn llvm(mut self, on: bool) -> Self {
        self.llvm = on;
        self
    }

    /// Also compiles every kernel for a text target (PTX, WGSL, SPIR-V, StableHLO, LLVM IR),
    /// embedded as [`TextArtifact`](https://docs.rs/qforge-runtime) records in `TEXT`.
    pub fn text_target(mut self, target: Target) -> Self {
        self.text_targets.push(target);
        self
    }

    /// Writes into `dir` instead of `OUT_DIR`, and prints no `cargo:` lines (for tests and
    /// tools).
    pub fn out_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.out_dir = Some(dir.into());
        self.cargo = false;
        self
    }

    /// The path of qforge-runtime in the crate that includes the generated code (default
    /// `::qforge_runtime`; `::qforge::runtime` through the facade).
    pub fn runtime_path(mut self, path: &str) -> Self {
        self.runtime_path = path.to_string();
        self
    }

    /// [`Builder::build`], exiting the build script with the error on failure (cargo then
    /// shows it and fails the build).
    pub fn run(self) -> Report {
        match self.build() {
            Ok(report) => report,
            Err(e) => {
                eprintln!("error: qforge-build: {e}");
                std::process::exit(1);
            }
        }
    }

    /// Compiles and writes everything; see the crate docs.
    ///
    /// # Errors
    /// [`BuildError`] naming the kernel that failed to build, verify or lower, an unknown
    /// library name or level, or the file that could not be written.
    pub fn build(self) -> Result<Report, BuildError> {
        let out_dir = match &self.out_dir {
            Some(d) => d.clone(),
            None => PathBuf::from(std::env::var_os("OUT_DIR").ok_or_else(|| {
                BuildError("OUT_DIR is not set: call Builder::run from a build script".into())
            })?),
        };
        if self.cargo {
            println!("cargo:rerun-if-changed=build.rs");
            println!("cargo:rerun-if-env-changed={LEVELS_ENV}");
        }
        let levels = self.resolve_levels()?;
        let triple = target_triple();
        let kernels = self.kernels()?;
        let jobs: Vec<(&Kernel, Target)> = kernels
            .iter()
            .flat_map(|kernel| {
                let (llvm, triple) = (self.llvm, &triple);
                let cpu = levels.iter().map(move |l| {
                    let (triple, level) = (triple.clone(), *l);
                    if llvm {
                        Target::LlvmObject { triple, level }
                    } else {
                        Target::CpuObject { triple, level }
                    }
                });
                cpu.chain(self.text_targets.iter().cloned())
                    .map(move |t| (kernel, t))
            })
            .collect();
        let mut report = Report::default();
        for (job, result) in jobs.iter().zip(compile_all(&jobs, &self.options)) {
            let (kernel, target) = job;
            let (artifact, seconds) = result.map_err(|e| {
                BuildError(format!(
                    "kernel '{}' for target {}: {e}",
                    kernel.name,
                    describe(target)
                ))
            })?;
            report
                .timings
                .push((kernel.name.clone(), describe(target), seconds));
            report.artifacts.push(artifact);
        }
        output::write_all(&out_dir, &self.runtime_path, &mut report, self.cargo)?;
        Ok(report)
    }

    /// The CPU levels to build: [`LEVELS_ENV`], else the builder's, else every level of the
    /// target architecture.
    fn resolve_levels(&self) -> Result<Vec<CpuLevel>, BuildError> {
        if let Ok(list) = std::env::var(LEVELS_ENV).map(|l| l.trim().to_string()) {
            if list == "none" {
                return Ok(Vec::new());
            }
            if !list.is_empty() {
                return list
                    .split(',')
                    .map(|s| {
                        CpuLevel::from_name(s.trim())
                            .map_err(|e| BuildError(format!("{LEVELS_ENV}={list}: {e}, or 'none'")))
                    })
                    .collect();
            }
        }
        if let Some(levels) = &self.levels {
            return Ok(levels.clone());
        }
        let arch = std::env::var("CARGO_CFG_TARGET_ARCH")
            .unwrap_or_else(|_| std::env::consts::ARCH.to_string());
        Ok(CpuLevel::of_arch(&arch))
    }

    /// The kernels to compile, library names resolved, duplicates (equal content) dropped.
    fn kernels(&self) -> Result<Vec<Kernel>, BuildError> {
        let mut out: Vec<Kernel> = Vec::new();
        for source in &self.sources {
            let kernel = match source {
                Source::Kernel(k) => k.clone(),
                Source::Failed(e) => return Err(BuildError(e.clone())),
                Source::Library(name) => library_kernel(name)?,
            };
            if !out.contains(&kernel) {
                out.push(kernel);
            }
        }
        Ok(out)
    }
}

/// Compiles every job on all cores (a build script may use them: cargo runs it alone), in
/// job order: each artifact and its compile time in seconds.
fn compile_all(
    jobs: &[(&Kernel, Target)],
    options: &Options,
) -> Vec<qforge_codegen::Result<(Artifact, f64)>> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(jobs.len().max(1));
    let mut results: Vec<Option<qforge_codegen::Result<(Artifact, f64)>>> = Vec::new();
    results.resize_with(jobs.len(), || None);
    let results = std::sync::Mutex::new(results);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((kernel, target)) = jobs.get(i) else {
                    break;
                };
                let start = Instant::now();
                let result = qforge_codegen::compile(kernel, target, options)
                    .map(|a| (a, start.elapsed().as_secs_f64()));
                if let Ok(mut r) = results.lock() {
                    r[i] = Some(result);
                }
            });
        }
    });
    results
        .into_inner()
        .unwrap_or_default()
        .into_iter()
        .map(|r| {
            r.unwrap_or_else(|| {
                Err(qforge_codegen::Error::Target(
                    "compile worker failed".into(),
                ))
            })
        })
        .collect()
}

/// The library kernel called `name`.
fn library_kernel(name: &str) -> Result<Kernel, BuildError> {
    let spec = qforge_kernels::KernelSpec::from_name(name).ok_or_else(|| {
        let close: Vec<String> = qforge_kernels::catalog()
            .iter()
            .map(|s| s.name())
            .filter(|n| n.contains(name) || name.contains(n.as_str()))
            .take(5)
            .collect();
        BuildError(format!(
            "no library kernel '{name}'{} (qforge list-kernels prints them all)",
            if close.is_empty() {
                String::new()
            } else {
                format!("; close: {}", close.join(", "))
            }
        ))
    })?;
    spec.build()
        .map_err(|e| BuildError(format!("library kernel '{name}': {e}")))
}

/// The triple of the crate being built (`TARGET` in a build script), else the host's.
fn target_triple() -> String {
    std::env::var("TARGET").unwrap_or_else(|_| {
        Target::cpu_object(
            CpuLevel::of_arch(std::env::consts::ARCH)
                .first()
                .copied()
                .unwrap_or(CpuLevel::X86_64),
        )
        .settings()
        .into_iter()
        .find(|(k, _)| *k == "triple")
        .map(|(_, v)| v)
        .unwrap_or_default()
    })
}

/// `kind(key=value, ...)` of a target, for errors and timings.
fn describe(target: &Target) -> String {
    let settings: Vec<String> = target
        .settings()
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    format!("{}({})", target.kind(), settings.join(", "))
}
