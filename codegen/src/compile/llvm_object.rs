//! Native CPU objects compiled by LLVM (feature `llvm`): the LLVM IR of [`crate::llvm`] for a
//! named [`CpuLevel`] ([`super::LlvmTarget::for_level`]), optimized with `default<O3>` for the
//! level's LLVM CPU (never the build machine's) and written as a position-independent object
//! exporting one symbol.
//!
//! As in the runtime's LLVM JIT, the IR carries no fast-math flag, so LLVM keeps IEEE semantics:
//! it may vectorize and reorder independent work but never reassociates or contracts
//! floating-point arithmetic, and the object computes the bits of the emitted code.

use super::target::CpuLevel;
use crate::error::{Error, Result};

/// The exported symbol of `kernel`'s LLVM object for `level`: [`super::cpu_symbol`] with
/// `_llvm` appended, so Cranelift and LLVM objects of one kernel link into one binary.
pub fn llvm_symbol(kernel_name: &str, content_hash: u64, level: CpuLevel) -> String {
    format!(
        "{}_llvm",
        super::cpu_symbol(kernel_name, content_hash, level)
    )
}

/// The LLVM CPU name of `level` (`x86-64`, `x86-64-v2`, `x86-64-v3`, `x86-64-v4`; `generic`
/// for AArch64).
pub fn llvm_cpu(level: CpuLevel) -> &'static str {
    match level {
        CpuLevel::Aarch64 => "generic",
        other => other.name(),
    }
}

/// Optimizes the LLVM IR `text` of kernel `name` (entry [`crate::llvm::ENTRY`]) for `level`
/// and writes it as an object for `triple` exporting the entry as `symbol`.
///
/// # Errors
/// [`Error::Target`] for a triple of another architecture or one LLVM lacks, or when
/// qforge-codegen was built without its `llvm` feature; [`Error::Backend`] when LLVM rejects
/// the IR or fails to write the object (a qforge bug).
#[cfg(feature = "llvm")]
pub(crate) fn object(
    name: &str,
    triple: &str,
    level: CpuLevel,
    text: &str,
    symbol: &str,
) -> Result<Vec<u8>> {
    use inkwell::attributes::AttributeLoc;
    use inkwell::context::Context;
    use inkwell::memory_buffer::MemoryBuffer;
    use inkwell::passes::PassBuilderOptions;
    use inkwell::targets::{
        CodeModel, FileType, InitializationConfig, RelocMode, Target, TargetMachine, TargetTriple,
    };
    use inkwell::OptimizationLevel;

    static INIT: std::sync::Once = std::sync::Once::new();

    super::target::parse_triple(triple, level)?;
    let backend = |message: String| Error::Backend {
        backend: crate::llvm::BACKEND,
        message: format!("kernel '{name}' ({}, {triple}): {message}", level.name()),
    };
    INIT.call_once(|| {
        let config = InitializationConfig::default();
        Target::initialize_x86(&config);
        Target::initialize_aarch64(&config);
    });
    let llvm_triple = TargetTriple::create(triple);
    let target = Target::from_triple(&llvm_triple)
        .map_err(|e| Error::Target(format!("LLVM has no target for '{triple}': {e}")))?;
    let cpu = llvm_cpu(level);
    // The level's CPU model and nothing of the build machine's: no feature string.
    let machine: TargetMachine = target
        .create_target_machine(
            &llvm_triple,
            cpu,
            "",
            OptimizationLevel::Aggressive,
            RelocMode::PIC,
            CodeModel::Default,
        )
        .ok_or_else(|| Error::Target(format!("no LLVM target machine for '{triple}' ({cpu})")))?;
    let context = Context::create();
    let buffer = MemoryBuffer::create_from_memory_range_copy(text.as_bytes(), symbol);
    let module = context
        .create_module_from_ir(buffer)
        .map_err(|e| backend(format!("LLVM rejected the emitted IR: {e}")))?;
    module.set_source_file_name(symbol);
    module.set_triple(&llvm_triple);
    module.set_data_layout(&machine.get_target_data().get_data_layout());
    let function = module
        .get_function(crate::llvm::ENTRY)
        .ok_or_else(|| backend(format!("no entry function '{}'", crate::llvm::ENTRY)))?;
    function.as_global_value().set_name(symbol);
    // Every function with a body (the entry and an outlined work item) gets the target CPU.
    for f in module
        .get_functions()
        .filter(|f| f.count_basic_blocks() > 0)
    {
        f.add_attribute(
            AttributeLoc::Function,
            context.create_string_attribute("target-cpu", cpu),
        );
    }
    module
        .verify()
        .map_err(|e| backend(format!("LLVM verifier: {e}")))?;
    module
        .run_passes("default<O3>", &machine, PassBuilderOptions::create())
        .map_err(|e| backend(format!("LLVM passes: {e}")))?;
    let object = machine
        .write_to_memory_buffer(&module, FileType::Object)
        .map_err(|e| backend(format!("writing the object: {e}")))?;
    Ok(object.as_slice().to_vec())
}

/// Without the `llvm` feature: the error naming it.
///
/// # Errors
/// Always [`Error::Target`].
#[cfg(not(feature = "llvm"))]
pub(crate) fn object(
    name: &str,
    triple: &str,
    level: CpuLevel,
    _text: &str,
    _symbol: &str,
) -> Result<Vec<u8>> {
    super::target::parse_triple(triple, level)?;
    Err(Error::Target(format!(
        "kernel '{name}': target cpu-obj-llvm ({}, {triple}) needs qforge-codegen's `llvm` feature",
        level.name()
    )))
}
