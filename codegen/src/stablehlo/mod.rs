//! The StableHLO backend: lowers a verified [`Kernel`] to the text of a StableHLO module (MLIR)
//! with one function `main`, specialized to the launch's shapes.
//!
//! # Execution model: work items as a tensor dimension
//!
//! StableHLO has tensors and no threads, so the module runs every work item at once: each IR
//! value of type `T` becomes a `tensor<G x T>` with one element per work item (`G` the grid),
//! as `vmap` would batch a scalar program. Control flow becomes masks:
//!
//! * `if`: both bodies run, each under the enclosing mask `and`ed with the condition (or its
//!   negation). An assignment under a mask keeps the old value in masked-off lanes.
//! * `for`: a `stablehlo.while` that runs while any lane is active; each lane keeps its own
//!   index and stops when `index + step` reaches its `end` (or would overflow `u32`, as in the
//!   interpreter).
//! * `accumulate` and `reduce`: a `stablehlo.while` over a counter shared by all lanes, up to
//!   the longest active lane; lanes past their own length keep their partials. The partials
//!   (`w` per sum, element `i` into partial `i % w`, from `-0.0`) and the halving tree follow
//!   [`qforge_ir::ReduceOrder`] exactly.
//!
//! Buffers are values too: a `load` is a `stablehlo.gather` of one element per lane and a
//! `store` a `stablehlo.scatter` that yields the buffer's next value. Each buffer carries one
//! spare element after its last: a masked-off lane, or an index past the end, stores there, so
//! no scatter index is ever out of bounds (where StableHLO leaves the result to the
//! implementation); gathers clamp their index (StableHLO's rule) and a lookup clamps as the IR
//! does. Two work items never write one element (a kernel rule), so the order of one scatter's
//! updates cannot matter.
//!
//! `search_sorted` is rewritten before lowering by the generic decomposition pass
//! ([`crate::decompose::search`], bucket tables as for PTX and WGSL) into lookups and compares.
//!
//! # Exact arithmetic
//!
//! StableHLO's `add`, `subtract`, `multiply`, `divide` and `sqrt` on `f32` are IEEE operations,
//! and the module uses them as they are. StableHLO has no fused multiply-add: `fma` is computed
//! in `f64` (the product of two `f32` is exact there), the sum's rounding error is recovered
//! with Knuth's TwoSum, and the sum is moved to the odd neighbour when inexact (round to odd)
//! before the one rounding to `f32`, which then equals the single rounding of `a * b + c`
//! (Boldo and Melquiond, "Emulation of FMA and correctly rounded sums: proved algorithms using
//! rounding to odd", IEEE TC 2008: `f64` has at least `24 + 2` bits). Integer division,
//! shifts, `min`/`max`, float-to-int conversions and roundings other than to nearest even are
//! spelled out with compares and selects so that every corner is the IR's (`eval.rs` of the
//! interpreter), never the implementation's.
//!
//! # Function signature (for the runtime)
//!
//! Every parameter is an argument of `main`, in parameter order, as raw bits: a buffer of `n`
//! elements as `tensor<n x ui8|ui16|ui32>` (its dtype's size; `f32`/`u32`/`i32` as `ui32`,
//! `f16`/`bf16` as `ui16`, `u8`/`i8` as `ui8`), a scalar as `tensor<ui32>`. The results are the
//! final contents of the `Write` and `ReadWrite` buffers, in parameter order, in the same raw
//! form. [`Shapes`] gives the grid and element counts (from [`qforge_ir::bind`]); the module is
//! valid for exactly those.
//!
//! # Where it runs
//!
//! Codegen needs no device. The runtime's `stablehlo` device (feature `stablehlo`) parses and
//! verifies each module with the MLIR StableHLO dialect and runs it with the StableHLO reference
//! interpreter (`stablehlo.eval_module`, which computes with IEEE semantics, subnormals kept);
//! the conformance suite does that for every library kernel (`docs/backends/stablehlo.md`). XLA's CPU compiler is not a conformant executor: it
//! flushes subnormals to zero and contracts `multiply` + `add` into an FMA.

mod emit;
mod exact;
mod ops;
pub mod spmd;

use qforge_ir::{Dim, Kernel, ParamKind};

use crate::backend::Backend;
use crate::decompose::SearchStrategy;
use crate::error::{Error, Result};

/// The backend name used in errors and in `qforge check`.
pub const BACKEND: &str = "stablehlo";

/// The launch shapes a module is specialized to.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Shapes {
    /// Number of work items.
    pub grid: u32,
    /// Element count of each parameter, in parameter order (0 for a scalar).
    pub elements: Vec<usize>,
}

impl Shapes {
    /// The shapes of a launch in which every `u32` dimension parameter has the value `dim`:
    /// what [`Backend::emit_text`] (and so the snapshots) use.
    pub fn with_dims(kernel: &Kernel, dim: u32) -> Shapes {
        let eval = |d: &Dim| match d {
            Dim::Const(c) => *c as usize,
            Dim::Param(_) => dim as usize,
        };
        // Saturating, as `qforge_ir::bind`: `lower` rejects what does not fit.
        Shapes {
            grid: eval(&kernel.grid) as u32,
            elements: kernel
                .params
                .iter()
                .map(|(_, p)| match &p.kind {
                    ParamKind::Buffer { shape, .. } => {
                        shape.iter().map(eval).fold(1, usize::saturating_mul)
                    }
                    ParamKind::Scalar(_) => 0,
                })
                .collect(),
        }
    }
}

/// The StableHLO backend. Stateless; see the module docs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StableHloBackend;

/// Buffers must have fewer elements: indices are `u32`, and the spare element after the last
/// needs an index too.
pub const MAX_ELEMENTS: usize = u32::MAX as usize;

/// The dimension value [`Backend::emit_text`] gives every `u32` dimension parameter.
pub const TEXT_DIM: u32 = 4;

impl Backend for StableHloBackend {
    type Artifact = String;

    fn name(&self) -> &'static str {
        BACKEND
    }

    /// The module for [`Shapes::with_dims`]`(kernel, `[`TEXT_DIM`]`)`.
    fn lower(&self, kernel: &Kernel) -> Result<String> {
        lower(kernel, &Shapes::with_dims(kernel, TEXT_DIM))
    }

    fn emit_text(&self, kernel: &Kernel) -> Result<String> {
        self.lower(kernel)
    }
}

/// Verifies `kernel` and lowers it to the text of a StableHLO module for a launch with `shapes`
/// (see the module docs for the signature).
///
/// # Errors
/// [`Error::Ir`] when the kernel does not verify; [`Error::Unsupported`] when `shapes` does not
/// give one element count per parameter, or a buffer has [`MAX_ELEMENTS`] elements or more, or
/// for an op on `bool` other than the logical ones, compares and `select` (the verifier rejects
/// those too).
pub fn lower(kernel: &Kernel, shapes: &Shapes) -> Result<String> {
    qforge_ir::verify(kernel)?;
    lower_prepared(
        &*crate::decompose::search(kernel, SearchStrategy::Buckets)?,
        shapes,
    )
}

/// [`lower`] for a verified kernel already through the bucket search decomposition.
pub(crate) fn lower_prepared(kernel: &Kernel, shapes: &Shapes) -> Result<String> {
    check_shapes(kernel, shapes)?;
    emit::module(kernel, shapes)
}

/// Checks that `shapes` gives one element count per parameter, each under [`MAX_ELEMENTS`].
fn check_shapes(kernel: &Kernel, shapes: &Shapes) -> Result<()> {
    let unsupported = |what: String| Error::Unsupported {
        backend: BACKEND,
        op: format!("{}: {what}", kernel.name),
    };
    if shapes.elements.len() != kernel.params.len() {
        return Err(unsupported(format!(
            "{} element counts for {} parameters",
            shapes.elements.len(),
            kernel.params.len()
        )));
    }
    if let Some((i, n)) = shapes
        .elements
        .iter()
        .enumerate()
        .find(|(_, n)| **n >= MAX_ELEMENTS)
    {
        return Err(unsupported(format!(
            "parameter {i} has {n} elements (at most {} with u32 indices and the spare element)",
            MAX_ELEMENTS - 1
        )));
    }
    Ok(())
}
