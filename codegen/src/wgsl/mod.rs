//! The WGSL backend: lowers a verified [`Kernel`] to a validated [`naga::Module`] with one compute
//! entry point, and writes it as WGSL with naga's writer.
//!
//! # Pipeline
//!
//! `qforge_ir::verify` -> WGSL source of the kernel (`emit.rs`, helpers in `helpers.rs`) ->
//! naga's WGSL front end (a [`naga::Module`]) -> naga's [`naga::valid::Validator`] (every emitted
//! module must pass; a rejection is [`Error::Backend`], a qforge bug) -> naga's WGSL writer. The
//! snapshotted text ([`Backend::emit_text`]) is the writer's output, so it is exactly what a
//! device compiles.
//!
//! # Execution model
//!
//! Entry point `main`, `@workgroup_size(64)` ([`WORKGROUP_SIZE`]). Work item
//! `w = global_invocation_id.x + global_invocation_id.y * (num_workgroups.x * 64)`; invocations
//! with `w >= grid` return at once. Dispatch with [`WgslLayout::dispatch`]: at most 65535
//! workgroups in x, the rest in y, so grids up to `2^32 - 1` work items fit.
//!
//! # Exact software math
//!
//! WGSL lets a driver leave `fma` unfused and round `/` and `sqrt` loosely. With
//! [`WgslOptions`] ([`WgslBackend::lower_with`]) each of them is emitted as an exact routine
//! built from `u32` operations (`soft.rs`: `qf_fma`, `qf_div`, `qf_sqrt`); a runtime picks the
//! options from its conformance probe. [`Backend::lower`] and the snapshots use the builtins.
//! [`qforge_ir::Stmt::Accumulate`] (`accumulate.rs`) is a per-work-item loop over `w` partials
//! whose fused step follows the same option.
//!
//! # Binding layout (for the runtime)
//!
//! All bindings are in `@group(0)` ([`WgslLayout`]):
//! * buffer parameters, in parameter order, at bindings `0..n_buffers`: storage buffers,
//!   `read` for [`Access::Read`], `read_write` otherwise. `f32`/`u32`/`i32` buffers are
//!   `array<f32|u32|i32>`. `u8`/`i8`/`f16`/`bf16` buffers are packed little endian into
//!   `array<u32>` (element `i` of a byte buffer is byte `i % 4` of word `i / 4`, of a 16-bit
//!   buffer half `i % 2` of word `i / 2`); a writable one is `array<atomic<u32>>` and a store
//!   is `atomicAnd` (clear the element's bits) then `atomicOr` (set them), so invocations that
//!   share a word never race. The runtime must size such a buffer to whole words
//!   (`ceil(bytes / 4) * 4`; the padding bytes are never read as elements).
//! * binding `n_buffers`: a uniform struct `Params`: the scalar parameters in parameter order,
//!   4 bytes each (`u32`/`i32`/`f32` bits), then `qf_zero: u32`, which the runtime must set to
//!   0 (it makes values opaque to the driver's optimizer, see `docs/backends/wgsl.md`). The
//!   buffer is [`WgslLayout::params_size`] bytes (a multiple of 16).

mod accumulate;
mod emit;
mod helpers;
mod soft;

use naga::valid::{Capabilities, ModuleInfo, ValidationFlags, Validator};
use qforge_ir::{Access, DType, Kernel, ParamKind, ScalarType};

use crate::backend::Backend;
use crate::decompose::SearchStrategy;
use crate::error::{Error, Result};

/// The backend name used in errors and in `qforge check`.
pub const BACKEND: &str = "wgsl";

/// Invocations per workgroup (x dimension only).
pub const WORKGROUP_SIZE: u32 = 64;

/// Workgroups per dispatch dimension allowed by WebGPU's default limits.
pub const MAX_GROUPS_PER_DIM: u32 = 65535;

/// The WGSL backend. Stateless; see the module docs for the emitted shape.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WgslBackend;

/// Which `f32` operations the emitted module computes with exact integer routines instead of
/// the WGSL builtin. WGSL lets a driver leave `fma` unfused and round `/` and `sqrt` loosely; a
/// runtime whose conformance probe finds such a driver lowers with the matching flag set. The
/// default (all `false`, [`WgslOptions::HARDWARE`]) is what [`Backend::lower`] and the snapshots
/// use.
///
/// Each routine is correctly rounded (round to nearest even) for every input, subnormals kept,
/// and follows the IR's special cases; a NaN result is the quiet NaN `0x7fc00000`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct WgslOptions {
    /// `fma` (and the fused step of [`qforge_ir::Stmt::Accumulate`]) as `qf_fma`: the exact
    /// 48-bit product added to the addend in 64-bit integer arithmetic, rounded once.
    pub soft_fma: bool,
    /// `f32` division as `qf_div`: restoring long division of the significands.
    pub soft_div: bool,
    /// `sqrt` as `qf_sqrt`: digit-by-digit integer square root of the significand.
    pub soft_sqrt: bool,
}

impl WgslOptions {
    /// The WGSL builtins for `fma`, `/` and `sqrt` (for drivers that pass the probe).
    pub const HARDWARE: WgslOptions = WgslOptions {
        soft_fma: false,
        soft_div: false,
        soft_sqrt: false,
    };
    /// The exact software routines for all three.
    pub const SOFTWARE: WgslOptions = WgslOptions {
        soft_fma: true,
        soft_div: true,
        soft_sqrt: true,
    };

    /// The union of two option sets (a routine is used when either asks for it).
    pub fn union(self, other: WgslOptions) -> WgslOptions {
        WgslOptions {
            soft_fma: self.soft_fma || other.soft_fma,
            soft_div: self.soft_div || other.soft_div,
            soft_sqrt: self.soft_sqrt || other.soft_sqrt,
        }
    }
}

/// How one buffer parameter is bound.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BufferBinding {
    /// Index of the parameter in the kernel's parameter list.
    pub param: usize,
    /// Parameter name.
    pub name: String,
    /// `@binding` in group 0.
    pub binding: u32,
    /// Element type in memory.
    pub dtype: DType,
    /// True when bound `read` (the kernel only loads from it).
    pub read_only: bool,
    /// True when elements are packed into `u32` words (`u8`, `i8`, `f16`, `bf16`).
    pub packed: bool,
    /// True when the binding is `array<atomic<u32>>` (a packed buffer the kernel stores to).
    pub atomic: bool,
}

/// One scalar parameter's place in the `Params` uniform struct.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScalarField {
    /// Index of the parameter in the kernel's parameter list.
    pub param: usize,
    /// Parameter name.
    pub name: String,
    /// Its type (`u32`, `i32` or `f32`).
    pub ty: ScalarType,
    /// Byte offset in the struct.
    pub offset: u32,
}

/// Everything the runtime needs to bind and dispatch an emitted module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WgslLayout {
    /// Entry point name (`main`).
    pub entry_point: &'static str,
    /// Buffer parameters in parameter order (binding `i` is the `i`-th buffer).
    pub buffers: Vec<BufferBinding>,
    /// Binding of the `Params` uniform struct (equal to the number of buffers).
    pub params_binding: u32,
    /// Scalar parameters in the struct, in parameter order.
    pub scalars: Vec<ScalarField>,
    /// Byte offset of `qf_zero` (must hold 0).
    pub zero_offset: u32,
    /// Size of the uniform buffer in bytes (a multiple of 16).
    pub params_size: u32,
}

impl WgslLayout {
    /// The layout of `kernel` (which need not be verified; names are taken as they are).
    pub fn new(kernel: &Kernel) -> Self {
        let mut buffers = Vec::new();
        let mut scalars = Vec::new();
        for (i, (_, p)) in kernel.params.iter().enumerate() {
            match &p.kind {
                ParamKind::Buffer { dtype, access, .. } => {
                    let packed = dtype.size_bytes() < 4;
                    buffers.push(BufferBinding {
                        param: i,
                        name: p.name.clone(),
                        binding: buffers.len() as u32,
                        dtype: *dtype,
                        read_only: *access == Access::Read,
                        packed,
                        atomic: packed && access.can_write(),
                    });
                }
                ParamKind::Scalar(ty) => scalars.push(ScalarField {
                    param: i,
                    name: p.name.clone(),
                    ty: *ty,
                    offset: 4 * scalars.len() as u32,
                }),
            }
        }
        let zero_offset = 4 * scalars.len() as u32;
        WgslLayout {
            entry_point: "main",
            params_binding: buffers.len() as u32,
            buffers,
            scalars,
            zero_offset,
            params_size: (zero_offset + 4).div_ceil(16) * 16,
        }
    }

    /// The binding of parameter number `param`, if it is a buffer.
    pub fn buffer(&self, param: usize) -> Option<&BufferBinding> {
        self.buffers.iter().find(|b| b.param == param)
    }

    /// Workgroup counts `[x, y, 1]` that cover `grid` work items (none for an empty grid).
    pub fn dispatch(grid: u32) -> [u32; 3] {
        let groups = grid.div_ceil(WORKGROUP_SIZE);
        if groups == 0 {
            return [0, 0, 0];
        }
        let x = groups.min(MAX_GROUPS_PER_DIM);
        [x, groups.div_ceil(x), 1]
    }
}

/// The result of lowering: the validated module, its validation info, the WGSL text and the
/// binding layout.
#[derive(Debug)]
pub struct WgslArtifact {
    /// The naga module (one compute entry point).
    pub module: naga::Module,
    /// naga's validation info (needed by naga's writers).
    pub info: ModuleInfo,
    /// The module written as WGSL by naga's writer.
    pub wgsl: String,
    /// How to bind and dispatch it.
    pub layout: WgslLayout,
}

impl WgslBackend {
    /// The WGSL source qforge generates before naga parses it (for debugging; the snapshotted
    /// and shipped text is naga's rewrite of it, see [`Backend::emit_text`]).
    ///
    /// # Errors
    /// Verification failure or an unsupported op.
    pub fn source(&self, kernel: &Kernel) -> Result<String> {
        self.source_with(kernel, WgslOptions::HARDWARE)
    }

    /// [`WgslBackend::source`] with the software routines named by `options`.
    ///
    /// # Errors
    /// Verification failure or an unsupported op.
    pub fn source_with(&self, kernel: &Kernel, options: WgslOptions) -> Result<String> {
        qforge_ir::verify(kernel)?;
        let kernel = &*crate::decompose::search(kernel, SearchStrategy::Buckets)?;
        emit::emit_source(kernel, &WgslLayout::new(kernel), options)
    }

    /// [`Backend::lower`] with the software routines named by `options` (what a runtime uses
    /// on a driver whose `fma`, `/` or `sqrt` failed its conformance probe).
    ///
    /// # Errors
    /// Verification failure, an unsupported op, or [`Error::Backend`] when naga rejects the
    /// emitted module (a qforge bug).
    pub fn lower_with(&self, kernel: &Kernel, options: WgslOptions) -> Result<WgslArtifact> {
        qforge_ir::verify(kernel)?;
        lower_prepared(
            &*crate::decompose::search(kernel, SearchStrategy::Buckets)?,
            options,
        )
    }
}

/// [`WgslBackend::lower_with`] for a verified kernel already through the bucket search
/// decomposition.
pub(crate) fn lower_prepared(kernel: &Kernel, options: WgslOptions) -> Result<WgslArtifact> {
    let layout = WgslLayout::new(kernel);
    let source = emit::emit_source(kernel, &layout, options)?;
    let module = naga::front::wgsl::parse_str(&source).map_err(|e| {
        backend_error(format!(
            "naga rejected the WGSL of '{}': {}",
            kernel.name,
            e.emit_to_string(&source)
        ))
    })?;
    let info = Validator::new(ValidationFlags::all(), Capabilities::empty())
        .validate(&module)
        .map_err(|e| {
            backend_error(format!(
                "naga's validator rejected '{}': {}",
                kernel.name,
                e.emit_to_string(&source)
            ))
        })?;
    let wgsl =
        naga::back::wgsl::write_string(&module, &info, naga::back::wgsl::WriterFlags::empty())
            .map_err(|e| backend_error(format!("naga's WGSL writer failed: {e}")))?;
    Ok(WgslArtifact {
        module,
        info,
        wgsl,
        layout,
    })
}

impl WgslArtifact {
    /// The module as SPIR-V words (naga's SPIR-V writer), for debugging a driver with the
    /// Vulkan tools (`spirv-dis`, `spirv-val`); the runtime itself hands WGSL to wgpu.
    ///
    /// # Errors
    /// [`Error::Backend`] when naga's SPIR-V writer fails (a qforge or naga bug).
    pub fn spirv(&self) -> Result<Vec<u32>> {
        let options = naga::back::spv::Options {
            lang_version: (1, 3),
            ..naga::back::spv::Options::default()
        };
        let entry = self
            .module
            .entry_points
            .first()
            .ok_or_else(|| backend_error("the module has no entry point".into()))?;
        let pipeline = naga::back::spv::PipelineOptions {
            shader_stage: naga::ShaderStage::Compute,
            entry_point: entry.name.clone(),
        };
        naga::back::spv::write_vec(&self.module, &self.info, &options, Some(&pipeline))
            .map_err(|e| backend_error(format!("naga's SPIR-V writer failed: {e}")))
    }
}

fn backend_error(message: String) -> Error {
    Error::Backend {
        backend: BACKEND,
        message,
    }
}

impl Backend for WgslBackend {
    type Artifact = WgslArtifact;

    fn name(&self) -> &'static str {
        BACKEND
    }

    fn lower(&self, kernel: &Kernel) -> Result<WgslArtifact> {
        self.lower_with(kernel, WgslOptions::HARDWARE)
    }

    fn emit_text(&self, kernel: &Kernel) -> Result<String> {
        Ok(self.lower(kernel)?.wgsl)
    }
}
