//! The compile pipeline: [`compile()`] verifies a kernel once ([`Verified`]), runs the target's
//! flat list of named passes ([`passes()`]), emits the target's code and returns a
//! self-describing [`Artifact`]. Every device and tool (`qforge compile`, `qforge-build`, the
//! JIT devices) goes through it; `docs/aot.md` describes the artifact and manifest format.

mod artifact;
mod cpu_object;
mod llvm_object;
mod passes;
mod target;
mod verified;

use std::collections::BTreeMap;

use cranelift_codegen::isa::CallConv;
use qforge_ir::Kernel;

pub use artifact::{
    fnv1a, hex, Artifact, Code, Launch, Manifest, ParamInfo, TableInfo, MANIFEST_VERSION,
};
pub use llvm_object::{llvm_cpu, llvm_symbol};
pub use passes::{passes, Pass};
pub use target::{extension_of_kind, CpuLevel, LlvmTarget, Options, Target};
pub use verified::Verified;

use crate::error::Result;
use crate::llvm::LlvmOptions;

/// Compiles `kernel` for `target`: verification once, the target's passes, emission.
///
/// # Errors
/// [`Error::Ir`] when the kernel does not verify (the message names the kernel and the op),
/// [`Error::Target`] for a target this build cannot produce (a triple Cranelift lacks, a level
/// of another architecture), [`Error::Unsupported`] for an op the backend cannot lower,
/// [`Error::Backend`] when a backend's own tool rejects the code (a qforge bug).
pub fn compile(kernel: &Kernel, target: &Target, options: &Options) -> Result<Artifact> {
    compile_verified(Verified::new(kernel)?, target, options)
}

/// [`compile()`] for a kernel verified already.
///
/// # Errors
/// As [`compile()`], without the verification error.
pub fn compile_verified(
    kernel: Verified<'_>,
    target: &Target,
    options: &Options,
) -> Result<Artifact> {
    let source = kernel.kernel();
    let content_hash = source.content_hash();
    let qir = qforge_ir::text::print(source);
    let name = source.name.clone();
    let params = artifact::param_infos(source);
    let grid = artifact::dim_text(source, &source.grid);
    let pass_list = passes(target, options.simd);
    let mut prepared = kernel;
    for pass in &pass_list {
        prepared = pass.run(prepared)?;
    }
    let k = prepared.kernel();
    let (code, launch) = emit(k, target, options, content_hash)?;
    let mut settings: BTreeMap<String, String> = BTreeMap::new();
    for (key, value) in target.settings().into_iter().chain(options.settings()) {
        settings.insert(key.to_string(), value);
    }
    let manifest = Manifest {
        manifest_version: MANIFEST_VERSION,
        qforge_version: env!("CARGO_PKG_VERSION").to_string(),
        kernel: name,
        content_hash: hex(content_hash),
        target: target.kind().to_string(),
        settings,
        passes: pass_list.iter().map(Pass::name).collect(),
        params,
        grid,
        tables: k
            .tables
            .iter()
            .map(|(_, t)| TableInfo {
                name: t.name.clone(),
                data: t.data.clone(),
            })
            .collect(),
        launch,
        code_hash: hex(fnv1a(&code.bytes())),
    };
    Ok(Artifact {
        manifest,
        code,
        qir,
    })
}

/// The exported symbol of `kernel`'s object for `level`: unique per kernel content and level,
/// so objects of many kernels and levels link into one binary.
pub fn cpu_symbol(kernel_name: &str, content_hash: u64, level: CpuLevel) -> String {
    let level = level.name().replace('-', "_");
    format!("qforge_{kernel_name}_{}_{level}", hex(content_hash))
}

/// The LLVM backend's options for `target`.
pub(crate) fn llvm_options(target: &LlvmTarget, bounds_checks: bool, simd: bool) -> LlvmOptions {
    LlvmOptions {
        bounds_checks,
        lanes: if simd { target.lanes } else { 0 },
        x86_avx512: target.x86_avx512 && simd,
        x86_avx512_vbmi: target.x86_avx512_vbmi && simd,
        x86_avx2: target.x86_avx2 && simd,
    }
}

/// The Cranelift options for `level` with the host-independent calling convention `call_conv`.
fn cranelift_options(
    level: CpuLevel,
    options: &Options,
    call_conv: CallConv,
) -> crate::cranelift::LowerOptions {
    crate::cranelift::LowerOptions {
        call_conv,
        bounds_checks: options.bounds_checks,
        simd: options.simd,
        x86_pshufb: level.has_pshufb(),
    }
}

/// The CPU launch record of a kernel with `k`'s parameters and tables.
fn cpu_launch(k: &Kernel, symbol: String, bounds_checks: bool) -> Launch {
    Launch::Cpu {
        symbol,
        slots: qforge_ir::cpu_abi::ArgLayout::new(k, bounds_checks).len(),
        bounds_checks,
    }
}

/// Emits the prepared kernel `k` for `target`.
fn emit(
    k: &Kernel,
    target: &Target,
    options: &Options,
    content_hash: u64,
) -> Result<(Code, Launch)> {
    Ok(match target {
        Target::CpuObject { triple, level } => {
            let isa = cpu_object::isa(triple, *level, true)?;
            let lowered = crate::cranelift::lower_prepared(
                k,
                &cranelift_options(*level, options, isa.default_call_conv()),
            )?;
            let symbol = cpu_symbol(&k.name, content_hash, *level);
            let bytes = cpu_object::object(isa, &symbol, lowered.function)?;
            (
                Code::Object(bytes),
                cpu_launch(k, symbol, options.bounds_checks),
            )
        }
        Target::LlvmObject { triple, level } => {
            let t = LlvmTarget::for_level(*level);
            let text = crate::llvm::lower_prepared(
                k,
                &llvm_options(&t, options.bounds_checks, options.simd),
            )?;
            let symbol = llvm_symbol(&k.name, content_hash, *level);
            let bytes = llvm_object::object(&k.name, triple, *level, &text, &symbol)?;
            (
                Code::Object(bytes),
                cpu_launch(k, symbol, options.bounds_checks),
            )
        }
        Target::Clif { level } => {
            let call_conv = CallConv::triple_default(&target_lexicon::Triple::host());
            let lowered = crate::cranelift::lower_prepared(
                k,
                &cranelift_options(*level, options, call_conv),
            )?;
            let text = lowered.function.display().to_string();
            (
                Code::Text(text),
                cpu_launch(k, k.name.clone(), options.bounds_checks),
            )
        }
        Target::LlvmIr(t) => {
            let text = crate::llvm::lower_prepared(
                k,
                &llvm_options(t, options.bounds_checks, options.simd),
            )?;
            (
                Code::Text(text),
                cpu_launch(k, crate::llvm::ENTRY.to_string(), options.bounds_checks),
            )
        }
        Target::Ptx(sm) => {
            let module = crate::ptx::lower_prepared(k, *sm)?;
            (
                Code::Text(module.text),
                Launch::Ptx {
                    entry: module.entry,
                    threads_per_block: module.launch.threads_per_block,
                },
            )
        }
        Target::Wgsl(o) | Target::Spirv(o) => {
            let module = crate::wgsl::lower_prepared(k, *o)?;
            let launch = Launch::Wgsl {
                entry_point: module.layout.entry_point.to_string(),
                workgroup_size: crate::wgsl::WORKGROUP_SIZE,
            };
            let code = match target {
                Target::Spirv(_) => Code::Spirv(module.spirv()?),
                _ => Code::Text(module.wgsl),
            };
            (code, launch)
        }
        Target::StableHlo { dim } => {
            let shapes = crate::stablehlo::Shapes::with_dims(k, *dim);
            let text = crate::stablehlo::lower_prepared(k, &shapes)?;
            (Code::Text(text), Launch::StableHlo { dim: *dim })
        }
        Target::Mosaic { dim, scalars } => {
            let (shapes, values) = crate::mosaic::launch(k, *dim, scalars)?;
            let module = crate::mosaic::lower_with(k, &shapes, &values)?;
            (Code::Text(module.text), Launch::Mosaic(module.manifest))
        }
        Target::StableHloShapes(shapes) => {
            let text = crate::stablehlo::lower_prepared(k, shapes)?;
            (
                Code::Text(text),
                Launch::StableHloShapes {
                    grid: shapes.grid,
                    elements: shapes.elements.clone(),
                },
            )
        }
    })
}

#[cfg(test)]
mod tests;
