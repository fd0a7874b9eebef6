//! The passes each target runs between verification and emission: one flat, named list per
//! target, printed in the manifest.

use std::borrow::Cow;

use crate::decompose::{self, SearchStrategy};
use crate::error::Result;

use super::target::Target;
use super::verified::Verified;

/// One pass over a verified kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    /// [`qforge_ir::Op::SearchSorted`] rewritten by [`crate::decompose`] with this strategy.
    DecomposeSearch(SearchStrategy),
}

impl Pass {
    /// The pass's name in manifests (`decompose-search(buckets)`, ...).
    pub fn name(&self) -> String {
        match self {
            Pass::DecomposeSearch(SearchStrategy::Buckets) => "decompose-search(buckets)".into(),
            Pass::DecomposeSearch(SearchStrategy::Levels) => "decompose-search(levels)".into(),
            Pass::DecomposeSearch(SearchStrategy::Packed { levels_up_to }) => {
                format!("decompose-search(packed, levels_up_to={levels_up_to})")
            }
        }
    }

    /// Runs the pass.
    ///
    /// # Errors
    /// [`crate::Error::Ir`] when the rewritten kernel does not verify (a qforge bug; checked in
    /// debug builds).
    pub fn run<'k>(&self, kernel: Verified<'k>) -> Result<Verified<'k>> {
        match self {
            Pass::DecomposeSearch(strategy) => {
                let rewritten = match kernel.into_inner() {
                    Cow::Borrowed(k) => decompose::rewrite(k, *strategy)?,
                    Cow::Owned(k) => Cow::Owned(decompose::rewrite(&k, *strategy)?.into_owned()),
                };
                Verified::after_pass(rewritten)
            }
        }
    }
}

/// The passes of `target` with `simd` (vector code) on or off, in order.
pub fn passes(target: &Target, simd: bool) -> Vec<Pass> {
    let strategy = match target {
        Target::CpuObject { .. } | Target::Clif { .. } => {
            SearchStrategy::Packed { levels_up_to: 0 }
        }
        Target::LlvmIr(t) => crate::llvm::search_strategy(&super::llvm_options(t, true, simd)),
        Target::LlvmObject { level, .. } => crate::llvm::search_strategy(&super::llvm_options(
            &super::LlvmTarget::for_level(*level),
            true,
            simd,
        )),
        Target::Ptx(_)
        | Target::Wgsl(_)
        | Target::Spirv(_)
        | Target::StableHlo { .. }
        | Target::StableHloShapes(_) => SearchStrategy::Buckets,
        // Lookups are select trees on a TPU: the levels' small tables (`mosaic::lower`).
        Target::Mosaic { .. } => SearchStrategy::Levels,
    };
    vec![Pass::DecomposeSearch(strategy)]
}
