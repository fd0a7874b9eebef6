//! The ABI of compiled CPU kernels (the Cranelift and LLVM backends, JIT-compiled or ahead
//! of time):
//!
//! ```text
//! extern "C" fn(args: *const u64, begin: u32, end: u32)
//! ```
//!
//! The function runs the work items `begin..end` in increasing order; `args` holds one 64-bit
//! slot per [`ArgLayout`] entry: each parameter (a buffer's base pointer, or a scalar's 32 bits
//! zero-extended), each table's data pointer (`u32` bit patterns), and with bounds checks the
//! status word's pointer and each buffer's element count. It lives here, not in a backend, so
//! a runtime that only loads ahead-of-time code needs no code generator.
//!
//! It also holds what ahead-of-time manifests and the runtime that loads them must agree on:
//! [`MANIFEST_VERSION`] and the [`fnv1a`] hash of kernel text and code.

use crate::Kernel;

/// The version of the artifact manifest format (`qforge_codegen::compile::Manifest`) and of the
/// ahead-of-time kernel records built from it; a loader refuses any other version.
pub const MANIFEST_VERSION: u32 = 1;

/// 64-bit FNV-1a of `bytes`: [`Kernel::content_hash`] of a kernel's text, and the code hash of
/// artifact manifests. Stable across processes, versions and platforms.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Where each launch argument goes in the `args` array of the lowered function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArgLayout {
    params: usize,
    tables: usize,
    bounds_checks: bool,
}

impl ArgLayout {
    /// The layout for `kernel` lowered with or without bounds checks.
    pub fn new(kernel: &Kernel, bounds_checks: bool) -> Self {
        Self::from_counts(kernel.params.len(), kernel.tables.len(), bounds_checks)
    }

    /// The layout of a kernel with `params` parameters and `tables` tables (what an
    /// ahead-of-time artifact records).
    pub const fn from_counts(params: usize, tables: usize, bounds_checks: bool) -> Self {
        ArgLayout {
            params,
            tables,
            bounds_checks,
        }
    }

    /// Number of parameters.
    pub fn params(&self) -> usize {
        self.params
    }

    /// Number of tables.
    pub fn tables(&self) -> usize {
        self.tables
    }

    /// Slot of table number `table` (its arena index).
    pub fn table(&self, table: usize) -> usize {
        self.params + table
    }

    /// Slot of the pointer to the `u32` status word, when bounds checks are on.
    pub fn status(&self) -> Option<usize> {
        self.bounds_checks.then_some(self.params + self.tables)
    }

    /// Slot of the element count of parameter number `param`, when bounds checks are on (the
    /// slot exists for scalar parameters too and is ignored there).
    pub fn count(&self, param: usize) -> Option<usize> {
        self.bounds_checks
            .then_some(self.params + self.tables + 1 + param)
    }

    /// Whether the function checks buffer accesses.
    pub fn bounds_checks(&self) -> bool {
        self.bounds_checks
    }

    /// Number of 64-bit slots in `args`.
    pub fn len(&self) -> usize {
        if self.bounds_checks {
            2 * self.params + self.tables + 1
        } else {
            self.params + self.tables
        }
    }

    /// True when the function takes no argument slot at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
