//! What a kernel is compiled for: [`Target`], the CPU feature levels of native objects
//! ([`CpuLevel`]) and the choices that change emitted code ([`Options`]).

use crate::error::{Error, Result};
use crate::ptx::SmTarget;
use crate::stablehlo::Shapes;
use crate::wgsl::WgslOptions;

/// A named CPU feature level: the instruction-set extensions native code may use. The x86-64
/// levels are the psABI's micro-architecture levels (`x86-64`, `-v2`, `-v3`, `-v4`), so a level
/// runs on every CPU that has all of its features ([`CpuLevel::features`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CpuLevel {
    /// x86-64 baseline (SSE2): `fma` and the rounding instructions become calls to exact
    /// routines the runtime defines (`qforge_fmaf`, `qforge_floorf`, ...).
    X86_64,
    /// x86-64-v2: adds SSE3, SSSE3 (`pshufb` 4-bit decodes), SSE4.1/4.2, POPCNT, CMPXCHG16B.
    X86_64V2,
    /// x86-64-v3: adds AVX, AVX2, FMA, BMI1/2, LZCNT, F16C, MOVBE.
    X86_64V3,
    /// x86-64-v4: adds AVX-512 F/BW/CD/DQ/VL.
    X86_64V4,
    /// AArch64 with NEON (every AArch64 CPU).
    Aarch64,
}

impl CpuLevel {
    /// Every level, x86-64 ones from the baseline up, then AArch64.
    pub const ALL: [CpuLevel; 5] = [
        CpuLevel::X86_64,
        CpuLevel::X86_64V2,
        CpuLevel::X86_64V3,
        CpuLevel::X86_64V4,
        CpuLevel::Aarch64,
    ];

    /// The level's name (`x86-64`, `x86-64-v2`, `x86-64-v3`, `x86-64-v4`, `aarch64`).
    pub const fn name(self) -> &'static str {
        match self {
            CpuLevel::X86_64 => "x86-64",
            CpuLevel::X86_64V2 => "x86-64-v2",
            CpuLevel::X86_64V3 => "x86-64-v3",
            CpuLevel::X86_64V4 => "x86-64-v4",
            CpuLevel::Aarch64 => "aarch64",
        }
    }

    /// The level called `name`.
    ///
    /// # Errors
    /// [`Error::Target`] naming the unknown level and the known ones.
    pub fn from_name(name: &str) -> Result<CpuLevel> {
        CpuLevel::ALL
            .into_iter()
            .find(|l| l.name() == name)
            .ok_or_else(|| {
                Error::Target(format!(
                    "unknown CPU feature level '{name}' (known: {})",
                    names(&CpuLevel::ALL)
                ))
            })
    }

    /// The architecture (`x86_64` or `aarch64`, as `CARGO_CFG_TARGET_ARCH` spells it).
    pub const fn arch(self) -> &'static str {
        match self {
            CpuLevel::Aarch64 => "aarch64",
            _ => "x86_64",
        }
    }

    /// The levels of `arch` (a `CARGO_CFG_TARGET_ARCH` value), baseline first; empty for an
    /// architecture without native objects.
    pub fn of_arch(arch: &str) -> Vec<CpuLevel> {
        CpuLevel::ALL
            .into_iter()
            .filter(|l| l.arch() == arch)
            .collect()
    }

    /// The CPU features this level adds to the level below it (the psABI's lists).
    fn added_features(self) -> &'static [&'static str] {
        match self {
            CpuLevel::X86_64 | CpuLevel::Aarch64 => &[],
            CpuLevel::X86_64V2 => &["sse3", "ssse3", "sse4.1", "sse4.2", "popcnt", "cmpxchg16b"],
            CpuLevel::X86_64V3 => &[
                "avx", "avx2", "fma", "bmi1", "bmi2", "lzcnt", "f16c", "movbe",
            ],
            CpuLevel::X86_64V4 => &["avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"],
        }
    }

    /// The CPU features the level requires, as `std::arch::is_x86_feature_detected!` names
    /// them: its own and those of the levels below it.
    pub fn features(self) -> Vec<&'static str> {
        CpuLevel::ALL
            .into_iter()
            .filter(|l| l.arch() == self.arch() && *l <= self)
            .flat_map(|l| l.added_features().iter().copied())
            .collect()
    }

    /// The Cranelift ISA flags (`has_*`) that enable the level's features (Cranelift has no
    /// flag for F16C, MOVBE, AVX-512 BW and CD, and emits none of their instructions).
    pub(crate) fn cranelift_flags(self) -> Vec<&'static str> {
        self.features()
            .into_iter()
            .filter_map(|f| {
                Some(match f {
                    "sse3" => "has_sse3",
                    "ssse3" => "has_ssse3",
                    "sse4.1" => "has_sse41",
                    "sse4.2" => "has_sse42",
                    "popcnt" => "has_popcnt",
                    "cmpxchg16b" => "has_cmpxchg16b",
                    "avx" => "has_avx",
                    "avx2" => "has_avx2",
                    "fma" => "has_fma",
                    "bmi1" => "has_bmi1",
                    "bmi2" => "has_bmi2",
                    "lzcnt" => "has_lzcnt",
                    "avx512f" => "has_avx512f",
                    "avx512dq" => "has_avx512dq",
                    "avx512vl" => "has_avx512vl",
                    _ => return None,
                })
            })
            .collect()
    }

    /// Whether code of this level may use x86's `pshufb` (SSSE3) directly.
    pub(crate) fn has_pshufb(self) -> bool {
        matches!(
            self,
            CpuLevel::X86_64V2 | CpuLevel::X86_64V3 | CpuLevel::X86_64V4
        )
    }
}

/// Comma-separated names of `levels`.
fn names(levels: &[CpuLevel]) -> String {
    levels
        .iter()
        .map(|l| l.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The code file's extension for a target kind ([`Target::kind`], as a manifest records it):
/// `o`, `clif`, `ll`, `ptx`, `wgsl`, `spv`, `mlir` (StableHLO and Mosaic; `bin` for an unknown
/// kind).
pub fn extension_of_kind(kind: &str) -> &'static str {
    match kind {
        "cpu-obj" | "cpu-obj-llvm" => "o",
        "clif" => "clif",
        "llvm-ir" => "ll",
        "ptx" => "ptx",
        "wgsl" => "wgsl",
        "spirv" => "spv",
        "stablehlo" | "mosaic" => "mlir",
        _ => "bin",
    }
}

/// `triple` parsed, after checking that its architecture is `level`'s.
///
/// # Errors
/// [`Error::Target`] when the triple does not parse or is of another architecture.
pub(crate) fn parse_triple(triple: &str, level: CpuLevel) -> Result<target_lexicon::Triple> {
    use std::str::FromStr;
    let parsed = target_lexicon::Triple::from_str(triple)
        .map_err(|e| Error::Target(format!("target triple '{triple}': {e}")))?;
    let arch = parsed.architecture.to_string();
    if arch != level.arch() {
        return Err(Error::Target(format!(
            "feature level '{}' is for {}, not for the {arch} triple '{triple}'",
            level.name(),
            level.arch()
        )));
    }
    Ok(parsed)
}

/// What [`crate::compile()`] produces.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// A relocatable object (ELF on Linux, Mach-O on macOS) with one exported function of the
    /// CPU kernel ABI (`crate::cranelift` module docs), compiled by Cranelift for `level` of
    /// the architecture of `triple` (a target triple, e.g. `x86_64-unknown-linux-gnu`).
    CpuObject {
        /// Target triple; its architecture must be `level`'s.
        triple: String,
        /// Feature level.
        level: CpuLevel,
    },
    /// A relocatable object as [`Target::CpuObject`] (same ABI, one exported function), compiled
    /// by LLVM (qforge-codegen's `llvm` feature) from the LLVM IR of [`LlvmTarget::for_level`]
    /// with `default<O3>` for the level's LLVM CPU (`x86-64`, `x86-64-v2`, `-v3`, `-v4`;
    /// `generic` on AArch64), no build-machine features, position-independent code. Its
    /// symbol is [`crate::compile::llvm_symbol`].
    LlvmObject {
        /// Target triple; its architecture must be `level`'s.
        triple: String,
        /// Feature level.
        level: CpuLevel,
    },
    /// The Cranelift IR text of the CPU kernel (what a JIT parses and compiles), with the
    /// 4-bit decode shuffles `level` allows.
    Clif {
        /// Feature level.
        level: CpuLevel,
    },
    /// The LLVM IR text of the CPU kernel (`crate::llvm`): vector lanes and x86 permutes as
    /// [`LlvmTarget`] says ([`LlvmTarget::for_level`] for a named level; a JIT passes exactly
    /// what its host has). [`Options::simd`] `false` gives scalar code whatever the lanes.
    LlvmIr(LlvmTarget),
    /// A PTX module for an NVIDIA architecture.
    Ptx(SmTarget),
    /// A WGSL module (naga-validated), with the software routines `options` names.
    Wgsl(WgslOptions),
    /// The WGSL module as SPIR-V (naga's writer).
    Spirv(WgslOptions),
    /// A StableHLO module specialized to a launch in which every `u32` dimension parameter
    /// has the value `dim` (StableHLO shapes are static).
    StableHlo {
        /// Value of every dimension parameter.
        dim: u32,
    },
    /// A StableHLO module specialized to one launch's exact shapes: its number of work items
    /// and each parameter's element count (what a device that evaluates StableHLO compiles
    /// for each launch, whose dimension parameters may differ).
    StableHloShapes(Shapes),
    /// A Mosaic (TPU) module in the Pallas convention (`crate::mosaic`), specialized to a
    /// launch in which every `u32` parameter has the value `dim` but those `scalars` names
    /// (`crate::mosaic::launch`); the manifest's launch record holds the arrays' layout
    /// (`crate::mosaic::Manifest`).
    Mosaic {
        /// Value of every dimension parameter.
        dim: u32,
        /// Parameters of other values, by name (a matmul's `m`, `n`, `k`, `n_items`, ...).
        scalars: Vec<(String, u32)>,
    },
}

impl Target {
    /// The target's kind as `qforge compile --target` spells it (`cpu-obj`, `cpu-obj-llvm`,
    /// `clif`, `llvm-ir`, `ptx`, `wgsl`, `spirv`, `stablehlo`, `mosaic`).
    pub fn kind(&self) -> &'static str {
        match self {
            Target::CpuObject { .. } => "cpu-obj",
            Target::LlvmObject { .. } => "cpu-obj-llvm",
            Target::Clif { .. } => "clif",
            Target::LlvmIr { .. } => "llvm-ir",
            Target::Ptx(_) => "ptx",
            Target::Wgsl(_) => "wgsl",
            Target::Spirv(_) => "spirv",
            Target::StableHlo { .. } | Target::StableHloShapes(_) => "stablehlo",
            Target::Mosaic { .. } => "mosaic",
        }
    }

    /// The file extension of the target's code (`o`, `clif`, `ll`, `ptx`, `wgsl`, `spv`,
    /// `mlir`).
    pub fn extension(&self) -> &'static str {
        extension_of_kind(self.kind())
    }

    /// The backend options the target fixes, as `key=value` pairs in a fixed order (recorded
    /// in the manifest; a loader compares them).
    pub fn settings(&self) -> Vec<(&'static str, String)> {
        let soft = |o: &WgslOptions| {
            vec![
                ("soft_fma", o.soft_fma.to_string()),
                ("soft_div", o.soft_div.to_string()),
                ("soft_sqrt", o.soft_sqrt.to_string()),
            ]
        };
        match self {
            Target::CpuObject { triple, level } | Target::LlvmObject { triple, level } => vec![
                ("triple", triple.clone()),
                ("level", level.name().to_string()),
            ],
            Target::Clif { level } => vec![("level", level.name().to_string())],
            Target::LlvmIr(t) => vec![
                ("lanes", t.lanes.to_string()),
                ("x86_avx2", t.x86_avx2.to_string()),
                ("x86_avx512", t.x86_avx512.to_string()),
                ("x86_avx512_vbmi", t.x86_avx512_vbmi.to_string()),
            ],
            Target::Ptx(sm) => vec![("sm", sm.name().to_string())],
            Target::Wgsl(o) | Target::Spirv(o) => soft(o),
            Target::StableHlo { dim } => vec![("dim", dim.to_string())],
            Target::Mosaic { dim, scalars } if scalars.is_empty() => {
                vec![("dim", dim.to_string())]
            }
            Target::Mosaic { dim, scalars } => vec![
                ("dim", dim.to_string()),
                (
                    "scalars",
                    scalars
                        .iter()
                        .map(|(n, v)| format!("{n}={v}"))
                        .collect::<Vec<_>>()
                        .join(","),
                ),
            ],
            Target::StableHloShapes(shapes) => vec![
                ("grid", shapes.grid.to_string()),
                (
                    "elements",
                    shapes
                        .elements
                        .iter()
                        .map(|n| n.to_string())
                        .collect::<Vec<_>>()
                        .join(","),
                ),
            ],
        }
    }

    /// The CPU object target for `level` on the conventional triple of its architecture and
    /// the host's operating system (`x86_64-unknown-linux-gnu`, `aarch64-apple-darwin`, ...).
    pub fn cpu_object(level: CpuLevel) -> Target {
        let os = if cfg!(target_os = "macos") {
            "apple-darwin"
        } else {
            "unknown-linux-gnu"
        };
        Target::CpuObject {
            triple: format!("{}-{os}", level.arch()),
            level,
        }
    }

    /// [`Target::LlvmObject`] for `level` on the triple of [`Target::cpu_object`].
    pub fn llvm_object(level: CpuLevel) -> Target {
        match Target::cpu_object(level) {
            Target::CpuObject { triple, level } => Target::LlvmObject { triple, level },
            other => other,
        }
    }
}

/// The vector shape and x86 extensions LLVM IR is emitted for (the fields of
/// [`crate::llvm::LlvmOptions`] that depend on the CPU).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LlvmTarget {
    /// Vector lanes ([`crate::llvm::LlvmOptions::lanes`]).
    pub lanes: u32,
    /// AVX2 permute lookups.
    pub x86_avx2: bool,
    /// AVX-512 permute lookups.
    pub x86_avx512: bool,
    /// AVX-512 VBMI 4-bit decodes.
    pub x86_avx512_vbmi: bool,
}

impl LlvmTarget {
    /// The target of a named level: 16 lanes with AVX-512 permutes for x86-64-v4, 8 lanes
    /// with AVX2 permutes for x86-64-v3, 4 lanes otherwise (VBMI is not part of any level).
    pub fn for_level(level: CpuLevel) -> LlvmTarget {
        let (lanes, x86_avx2, x86_avx512) = match level {
            CpuLevel::X86_64V4 => (16, true, true),
            CpuLevel::X86_64V3 => (8, true, false),
            _ => (4, false, false),
        };
        LlvmTarget {
            lanes,
            x86_avx2,
            x86_avx512,
            x86_avx512_vbmi: false,
        }
    }
}

/// Choices that change the emitted code of every target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Options {
    /// CPU targets: check every buffer access against its element count (the ABI's status
    /// word); other targets ignore it.
    pub bounds_checks: bool,
    /// CPU targets: allow vector code (128-bit Cranelift vectors, LLVM lanes); `false` gives
    /// scalar code with the same bits.
    pub simd: bool,
}

impl Default for Options {
    /// Bounds checks on, vector code on.
    fn default() -> Self {
        Options {
            bounds_checks: true,
            simd: true,
        }
    }
}

impl Options {
    /// The options as `key=value` pairs in a fixed order (recorded in the manifest).
    pub fn settings(&self) -> Vec<(&'static str, String)> {
        vec![
            ("bounds_checks", self.bounds_checks.to_string()),
            ("simd", self.simd.to_string()),
        ]
    }
}
