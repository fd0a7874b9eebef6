//! Native CPU objects: a Cranelift function compiled by `cranelift-object` for a named
//! [`CpuLevel`] of a target triple, with one exported symbol.

use cranelift_codegen::ir::Function;
use cranelift_codegen::isa::{self, OwnedTargetIsa};
use cranelift_codegen::settings::{self, Configurable};
use cranelift_module::{Linkage, Module};
use cranelift_object::{ObjectBuilder, ObjectModule};

use crate::error::{Error, Result};

use super::target::CpuLevel;

fn target_error(message: String) -> Error {
    Error::Target(message)
}

/// The Cranelift ISA for `level` on `triple`, optimizing for speed, position-independent code
/// (objects may go into shared libraries and PIE binaries).
///
/// # Errors
/// [`Error::Target`] when the triple does not parse, Cranelift has no backend for it, or its
/// architecture is not `level`'s.
pub(crate) fn isa(triple: &str, level: CpuLevel, pic: bool) -> Result<OwnedTargetIsa> {
    let parsed = super::target::parse_triple(triple, level)?;
    let mut flags = settings::builder();
    for (name, value) in [
        ("opt_level", "speed"),
        ("use_colocated_libcalls", "false"),
        ("is_pic", if pic { "true" } else { "false" }),
    ] {
        flags
            .set(name, value)
            .map_err(|e| target_error(format!("Cranelift flag {name}: {e}")))?;
    }
    let mut builder = isa::lookup(parsed)
        .map_err(|e| target_error(format!("Cranelift has no backend for '{triple}': {e}")))?;
    for flag in level.cranelift_flags() {
        builder
            .enable(flag)
            .map_err(|e| target_error(format!("Cranelift ISA flag {flag}: {e}")))?;
    }
    builder
        .finish(settings::Flags::new(flags))
        .map_err(|e| target_error(format!("Cranelift ISA for '{triple}': {e}")))
}

/// Compiles `function` into an object exporting it as `symbol`.
///
/// # Errors
/// [`Error::Backend`] when Cranelift fails to compile or write it (a qforge bug).
pub(crate) fn object(isa: OwnedTargetIsa, symbol: &str, function: Function) -> Result<Vec<u8>> {
    let backend = |message: String| Error::Backend {
        backend: crate::cranelift::BACKEND,
        message,
    };
    let builder = ObjectBuilder::new(
        isa,
        symbol.as_bytes().to_vec(),
        Box::new(crate::cranelift::libcall_name),
    )
    .map_err(|e| backend(format!("object builder: {e}")))?;
    let mut module = ObjectModule::new(builder);
    let id = module
        .declare_function(symbol, Linkage::Export, &function.signature)
        .map_err(|e| backend(format!("'{symbol}': {e}")))?;
    let mut ctx = module.make_context();
    ctx.func = function;
    module
        .define_function(id, &mut ctx)
        .map_err(|e| backend(format!("'{symbol}': Cranelift compilation failed: {e:?}")))?;
    module
        .finish()
        .emit()
        .map_err(|e| backend(format!("'{symbol}': writing the object: {e}")))
}
