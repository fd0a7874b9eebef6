//! The self-describing result of [`crate::compile()`]: the code and its [`Manifest`] (the
//! kernel's parameters, tables, launch shape, the target and options it was built with, the
//! passes it went through and the kernel's stable content hash), serialized as JSON.

use std::collections::BTreeMap;

use qforge_ir::{Dim, Kernel, ParamKind};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

pub use qforge_ir::cpu_abi::{fnv1a, MANIFEST_VERSION};

/// The code of an artifact.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Code {
    /// Object file bytes (`cpu-obj`).
    Object(Vec<u8>),
    /// Text (`clif`, `llvm-ir`, `ptx`, `wgsl`, `stablehlo`).
    Text(String),
    /// SPIR-V words (`spirv`).
    Spirv(Vec<u32>),
}

impl Code {
    /// The code as the bytes of its file (SPIR-V words little-endian).
    pub fn bytes(&self) -> Vec<u8> {
        match self {
            Code::Object(b) => b.clone(),
            Code::Text(t) => t.clone().into_bytes(),
            Code::Spirv(w) => w.iter().flat_map(|w| w.to_le_bytes()).collect(),
        }
    }

    /// The text, for text targets.
    pub fn text(&self) -> Option<&str> {
        match self {
            Code::Text(t) => Some(t),
            _ => None,
        }
    }
}

/// One kernel parameter as the manifest records it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParamInfo {
    /// Parameter name.
    pub name: String,
    /// `buffer` or `scalar`.
    pub kind: String,
    /// Element dtype (`f32`, `u8`, ...) of a buffer, or the scalar's type (`u32`, `i32`, `f32`).
    pub dtype: String,
    /// A buffer's shape: each dimension a number or the name of the `u32` parameter that gives
    /// it; empty for a scalar.
    pub shape: Vec<String>,
    /// A buffer's access (`read`, `write`, `readwrite`); empty for a scalar.
    pub access: String,
}

/// One table of constants the code reads (passed at launch on CPU targets, embedded in the
/// code on the others).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableInfo {
    /// Table name.
    pub name: String,
    /// The elements as `u32` bit patterns (an `f32` table holds `f32::to_bits`).
    pub data: Vec<u32>,
}

/// How a runtime launches the code.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "abi", rename_all = "kebab-case")]
pub enum Launch {
    /// The CPU kernel ABI (`qforge_ir::cpu_abi`): `symbol` (objects) or the text's one
    /// function, `slots` 64-bit argument slots, the manifest's tables in slot order.
    Cpu {
        /// Exported symbol of an object; the function name in IR text.
        symbol: String,
        /// Number of argument slots.
        slots: usize,
        /// Whether the code checks buffer accesses (status word and element-count slots).
        bounds_checks: bool,
    },
    /// A CUDA entry with one thread per work item in blocks of `threads_per_block`.
    Ptx {
        /// Entry name.
        entry: String,
        /// Threads per block.
        threads_per_block: u32,
    },
    /// A WGSL/SPIR-V compute entry, one invocation per work item in workgroups of
    /// `workgroup_size`, buffers bound in parameter order then the scalar uniform block.
    Wgsl {
        /// Entry point name.
        entry_point: String,
        /// Invocations per workgroup.
        workgroup_size: u32,
    },
    /// A StableHLO `main` taking and returning every parameter, for a launch in which every
    /// `u32` dimension parameter is `dim`.
    StableHlo {
        /// The dimension value the module is specialized to.
        dim: u32,
    },
    /// A StableHLO `main` as [`Launch::StableHlo`], for a launch of exactly these shapes.
    StableHloShapes {
        /// Number of work items.
        grid: u32,
        /// Element count of each parameter, in parameter order (0 for a scalar).
        elements: Vec<usize>,
    },
    /// A Mosaic function taking the grid indices and one VMEM window per array: the grid and
    /// each array's parameter, shape and dtype (how a caller pads and reshapes the buffers;
    /// `scripts/mosaic_check.py` reads it).
    Mosaic(crate::mosaic::Manifest),
}

/// Everything about an artifact except its code, serialized next to it as JSON.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`MANIFEST_VERSION`] when written.
    pub manifest_version: u32,
    /// The qforge version that wrote it.
    pub qforge_version: String,
    /// Kernel name.
    pub kernel: String,
    /// [`Kernel::content_hash`] of the compiled kernel (before any pass), 16 hex digits.
    pub content_hash: String,
    /// Target kind ([`super::Target::kind`]).
    pub target: String,
    /// The target's and options' settings ([`super::Target::settings`],
    /// [`super::Options::settings`]).
    pub settings: BTreeMap<String, String>,
    /// The passes run, in order ([`super::Pass::name`]).
    pub passes: Vec<String>,
    /// Parameters in order.
    pub params: Vec<ParamInfo>,
    /// Number of work items: a number or a `u32` parameter's name.
    pub grid: String,
    /// Tables the code reads, in launch order.
    pub tables: Vec<TableInfo>,
    /// How to launch the code.
    pub launch: Launch,
    /// FNV-1a hash of the code file's bytes, 16 hex digits (detects a corrupted file).
    pub code_hash: String,
}

impl Manifest {
    /// The manifest as pretty-printed JSON (deterministic: fixed field order).
    pub fn to_json(&self) -> String {
        // Serializing plain strings, numbers and maps cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Parses a manifest written by [`Manifest::to_json`].
    ///
    /// # Errors
    /// [`Error::Artifact`] when the text is not such a manifest, or has another
    /// [`MANIFEST_VERSION`].
    pub fn from_json(text: &str) -> Result<Manifest> {
        let value: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| Error::Artifact(format!("manifest is not JSON: {e}")))?;
        let version = value.get("manifest_version").and_then(|v| v.as_u64());
        if version != Some(MANIFEST_VERSION as u64) {
            return Err(Error::Artifact(format!(
                "manifest version {} (this qforge reads version {MANIFEST_VERSION})",
                version.map_or("missing".to_string(), |v| v.to_string())
            )));
        }
        serde_json::from_value(value).map_err(|e| Error::Artifact(format!("bad manifest: {e}")))
    }

    /// Checks that `code` is the code this manifest describes.
    ///
    /// # Errors
    /// [`Error::Artifact`] naming the kernel when the code's hash differs (a corrupted or
    /// mismatched file).
    pub fn check_code(&self, code: &[u8]) -> Result<()> {
        let found = hex(fnv1a(code));
        if found != self.code_hash {
            return Err(Error::Artifact(format!(
                "code of kernel '{}' is corrupted or not this manifest's: hash {found}, manifest \
                 says {}",
                self.kernel, self.code_hash
            )));
        }
        Ok(())
    }
}

/// A compiled kernel: code plus manifest, and the kernel's text form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Artifact {
    /// The manifest.
    pub manifest: Manifest,
    /// The code.
    pub code: Code,
    /// The compiled kernel's text form (`qforge_ir::text`), which parses back to an equal
    /// kernel: the `.qir` file written next to the code.
    pub qir: String,
}

/// `v` as 16 lowercase hex digits.
pub fn hex(v: u64) -> String {
    format!("{v:016x}")
}

/// The manifest's parameter list of `kernel`.
pub(crate) fn param_infos(kernel: &Kernel) -> Vec<ParamInfo> {
    kernel
        .params
        .iter()
        .map(|(_, p)| match &p.kind {
            ParamKind::Buffer {
                dtype,
                shape,
                access,
            } => ParamInfo {
                name: p.name.clone(),
                kind: "buffer".into(),
                dtype: dtype.to_string(),
                shape: shape.iter().map(|d| dim_text(kernel, d)).collect(),
                access: access.name().into(),
            },
            ParamKind::Scalar(ty) => ParamInfo {
                name: p.name.clone(),
                kind: "scalar".into(),
                dtype: ty.to_string(),
                shape: Vec::new(),
                access: String::new(),
            },
        })
        .collect()
}

/// A dimension as the manifest writes it.
pub(crate) fn dim_text(kernel: &Kernel, d: &Dim) -> String {
    match d {
        Dim::Const(c) => c.to_string(),
        Dim::Param(p) => kernel
            .params
            .try_get(*p)
            .map_or_else(|| "?".into(), |p| p.name.clone()),
    }
}
