//! What the test suites may skip here and what they must not.
//!
//! Every test that needs a device, a tool or data that a machine may lack (the wgpu adapter,
//! the StableHLO runner, `ptxas`, the golden vectors, ...) asks this crate before skipping:
//! [`unavailable`] prints the skip reason where the thing is optional and fails the test where
//! it is required. One rule decides "required" for every suite:
//!
//! - `QFORGE_REQUIRE`, when set, lists the required names, comma-separated (`all` requires every
//!   name in [`KNOWN`], `none` or an empty value nothing);
//! - otherwise, when [`ci`] is true, the names in [`CI_REQUIRES`] (what `.ci/run` installs) are
//!   required;
//! - otherwise nothing is: a developer's machine skips with a printed reason.
//!
//! A device is only ever asked about where its cargo feature is compiled in, so the rule reads
//! "compiled in and promised by the environment".
//!
//! It also holds the suites' property-test plumbing ([`run_cases`]): fixed cases that cover
//! every promised combination in every run, then random ones (`PROPTEST_CASES`) whose failures
//! are persisted.
#![deny(missing_docs)]

use std::fmt::Display;

mod cases;
mod each;
pub use cases::{config, random_cases, run_cases, run_split, runner};
pub use each::on_each;

/// Every name a suite may ask about: the `--device` names of the devices, then tools and data.
/// `transformers` is the Python of `scripts/install-transformers.sh` (torch, transformers and
/// bitsandbytes), which `tests/transformers.rs` uses to load qforge's checkpoints;
/// `xla` is the XLA SPMD engine (jax from `scripts/install-stablehlo.sh`, `tests/xla_spmd.rs`);
/// `mpi` is the `mpi` feature with OpenMPI's `mpirun` (`tests/distributed.rs`); `nccl` the
/// `nccl` feature with a GPU and `libnccl.so` (never required by CI, which has no GPU);
/// `libtpu` is the Python of `scripts/install-mosaic.sh` (jax with libtpu), which compiles the
/// Mosaic backend's modules for TPU generations without a TPU (`tests/mosaic.rs`);
/// `avx512_bf16` and `amx_bf16` are the CPU instructions `tests/probe_bf16.rs` probes (never
/// required by CI, whose machines differ).
pub const KNOWN: &[&str] = &[
    "cpu",
    "cpu-llvm",
    "cpu-aot",
    "wgpu",
    "cuda",
    "stablehlo",
    "xla",
    "libtpu",
    "ptxas",
    "golden",
    "models",
    "transformers",
    "mpi",
    "nccl",
    "avx512_bf16",
    "amx_bf16",
];

/// What `.ci/run` installs and so what must be present whenever [`ci`] is true and
/// `QFORGE_REQUIRE` is not set: the Cranelift and LLVM CPU devices, the ahead-of-time CPU
/// device (feature `aot`), the wgpu device (Mesa's
/// lavapipe), the StableHLO runner and XLA through jax, libtpu's Mosaic compiler, NVIDIA's `ptxas`, the shared golden vectors and models,
/// the Python with transformers, and OpenMPI for the MPI engine. Not `cuda`: CI has no GPU.
pub const CI_REQUIRES: &[&str] = &[
    "cpu",
    "cpu-llvm",
    "cpu-aot",
    "wgpu",
    "stablehlo",
    "xla",
    "libtpu",
    "ptxas",
    "golden",
    "models",
    "transformers",
    "mpi",
];

/// Whether this is a CI run: `CI` is set to anything but an empty string, `0`, `false` or `no`
/// (any case). CI services set `CI=true` or `CI=1`; `.ci/run` sets `CI=true` when it is unset.
pub fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| is_truthy(&v))
}

fn is_truthy(v: &str) -> bool {
    let v = v.trim().to_ascii_lowercase();
    !(v.is_empty() || v == "0" || v == "false" || v == "no")
}

/// The required names, by the rule of the crate documentation.
///
/// # Panics
/// When `QFORGE_REQUIRE` names something not in [`KNOWN`] (a typo must not make a requirement
/// silently vanish).
pub fn required_names() -> Vec<String> {
    match std::env::var("QFORGE_REQUIRE") {
        Ok(list) => parse_list(&list).unwrap_or_else(|e| panic!("QFORGE_REQUIRE: {e}")),
        Err(_) if ci() => CI_REQUIRES.iter().map(|s| s.to_string()).collect(),
        Err(_) => Vec::new(),
    }
}

fn parse_list(list: &str) -> Result<Vec<String>, String> {
    let mut names = Vec::new();
    for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        match name {
            "none" => {}
            "all" => names.extend(KNOWN.iter().map(|s| s.to_string())),
            n if KNOWN.contains(&n) => names.push(n.to_string()),
            n => {
                return Err(format!(
                    "unknown name '{n}' (known: {}, all, none)",
                    KNOWN.join(", ")
                ))
            }
        }
    }
    Ok(names)
}

/// Whether `name` (one of [`KNOWN`]) must be present here.
///
/// # Panics
/// When `name` is not in [`KNOWN`] (a test asking about a name the rule does not know is a bug),
/// or on a bad `QFORGE_REQUIRE` (see [`required_names`]).
pub fn required(name: &str) -> bool {
    assert!(
        KNOWN.contains(&name),
        "qforge-testkit: unknown name '{name}'"
    );
    required_names().iter().any(|n| n == name)
}

/// Reports that `name` cannot be used here because of `reason`: prints
/// `skipped: <name>: <reason>` where it is optional.
///
/// # Panics
/// Where `name` is [`required`], with a message naming it, the reason and why it is required.
pub fn unavailable(name: &str, reason: impl Display) {
    if required(name) {
        let why = if std::env::var_os("QFORGE_REQUIRE").is_some() {
            "QFORGE_REQUIRE names it"
        } else {
            "CI is set and .ci/run installs it"
        };
        panic!("{name} is required here ({why}) but unavailable: {reason}");
    }
    println!("skipped: {name}: {reason}");
}

/// Runs the program `exe` (a test's `env!("CARGO_BIN_EXE_<name>")`) with `args`; returns its
/// exit code (-1 when a signal ended it), stdout and stderr (lossy UTF-8).
///
/// # Panics
/// When the program cannot be started.
pub fn run(exe: &str, args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(exe)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{exe} does not start: {e}"));
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truthy_values() {
        for v in ["true", "1", "TRUE", "yes", "anything"] {
            assert!(is_truthy(v), "{v}");
        }
        for v in ["", "0", "false", "False", "no", " "] {
            assert!(!is_truthy(v), "{v}");
        }
    }

    #[test]
    fn lists_parse_and_typos_are_errors() {
        assert_eq!(parse_list("wgpu, ptxas").unwrap(), ["wgpu", "ptxas"]);
        assert!(parse_list("none").unwrap().is_empty());
        assert!(parse_list("").unwrap().is_empty());
        assert_eq!(parse_list("all").unwrap().len(), KNOWN.len());
        let e = parse_list("wgpu,wpgu").unwrap_err();
        assert!(e.contains("'wpgu'"), "{e}");
        assert!(CI_REQUIRES.iter().all(|n| KNOWN.contains(n)));
    }
}
