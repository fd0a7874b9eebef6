//! The LLVM CPU backend: lowers a verified [`Kernel`] to the text of one LLVM IR module (LLVM 14
//! syntax, typed pointers) holding one function. The text is device-free and deterministic; the
//! runtime's `llvm` feature parses it, optimizes it for the host CPU (all its vector extensions,
//! e.g. AVX-512) and JIT-compiles it.
//!
//! # ABI of the lowered function
//!
//! `void @qforge_kernel(i64* %args, i32 %begin, i32 %end)`: the same ABI, argument slots and
//! bounds-check reporting as the Cranelift backend ([`crate::cranelift`], [`ArgLayout`]), so
//! one CPU launcher runs either.
//!
//! # Semantics
//!
//! Every op follows the doc comments of [`qforge_ir::Op`] to the bit. LLVM keeps IEEE semantics
//! when no fast-math flag is given, and none is ever emitted: `fadd`/`fmul`/`fdiv` round to
//! nearest even and never contract, `fma` only for [`qforge_ir::Op::Fma`] (`llvm.fma`),
//! `sqrt` is `llvm.sqrt` (correctly rounded), min/max are compare + select, `fneg`/`fabs` are
//! sign-bit operations. What LLVM leaves undefined is made defined before it reaches LLVM:
//! shift amounts are masked to `& 31`, integer division guards its divisor (a zero divisor and
//! `i32::MIN / -1` as the IR says), float-to-int conversions use the saturating intrinsics
//! (`llvm.fptoui.sat`, NaN to 0) after rounding with `llvm.roundeven`/`floor`/`ceil`, and
//! buffer accesses are `align 1` (buffers need not be aligned). Reductions and `accumulate`
//! statements follow their stated order: see `reduce.rs` and `accumulate.rs`.

mod accumulate;
mod arith;
mod band_proof;
mod bounds;
mod deferred;
mod emit;
mod lanes;
mod memory;
mod nibble;
mod outer;
mod outer_store;
mod planes;
mod reduce;
mod vector_for;

use std::borrow::Cow;

use qforge_ir::Kernel;

pub use crate::cranelift::ArgLayout;
use crate::decompose::SearchStrategy;
use crate::error::Result;

/// The backend name used in errors and in `qforge check`.
pub const BACKEND: &str = "llvm";

/// The name of the emitted function.
pub const ENTRY: &str = "qforge_kernel";

/// Choices that change the emitted module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LlvmOptions {
    /// Check every buffer access against the buffer's element count (as
    /// [`crate::cranelift::LowerOptions::bounds_checks`]).
    pub bounds_checks: bool,
    /// Lanes of the explicit vector code of `for` loops with step 1 and `Strided`
    /// `accumulate` statements (see `lanes.rs` and `accumulate.rs`): a power of two from 4 to
    /// 64, or 0 for scalar code only. 16 suits AVX-512, 8 AVX2.
    pub lanes: u32,
    /// The target is x86-64 with AVX-512F: with a multiple of 16 lanes, a lookup in a 32-bit
    /// table of up to [`PERMUTE_TABLE`] entries selects from the table held in vector constants
    /// with two-source variable permutes (`vpermi2d`, 32 entries each, 16 lanes at a time) and
    /// a select tree on the index bits, instead of a gather (a 16-lane gather costs about twice
    /// a 256-entry permute lookup on the CPUs measured; `docs/backends/llvm.md`). Searches then
    /// take the level form ([`prepare`]) and a loop body with a long lookup chain runs 32 lanes.
    /// Must be `false` for any other target: the permute is an x86 intrinsic.
    pub x86_avx512: bool,
    /// The target is x86-64 with AVX-512 VBMI (and AVX-512F): with 16 lanes, the lookup of a
    /// packed 4-bit code (`table[(byte >> s) & 15]`, two lanes per byte) in a vectorized loop's
    /// fast body decodes with `vpmultishiftqb` + `vpermd` (`nibble.rs`). Must be `false` for any
    /// other target.
    pub x86_avx512_vbmi: bool,
    /// The target is x86-64 with AVX2: with a multiple of 8 lanes, a lookup in a 32-bit table
    /// of up to 32 entries selects from the table held in vector constants with `vpermd` (8
    /// entries each) and a select tree, instead of one read per lane. Implied by
    /// [`Self::x86_avx512`] for tables the AVX-512 permutes do not take. Must be `false` for
    /// any other target.
    pub x86_avx2: bool,
}

/// Whether `lanes` is a lane count [`LlvmOptions::lanes`] takes: 0 (scalar code only) or a
/// power of two from 4 to 64.
pub fn supported_lanes(lanes: u32) -> bool {
    lanes == 0 || ((4..=64).contains(&lanes) && lanes.is_power_of_two())
}

/// Largest table (entries) that [`LlvmOptions::x86_avx512`] looks up with permutes; larger
/// tables are gathered.
pub const PERMUTE_TABLE: usize = 512;

impl Default for LlvmOptions {
    /// Bounds checks on, 16 lanes, no x86-specific code.
    fn default() -> Self {
        LlvmOptions {
            bounds_checks: true,
            lanes: 16,
            x86_avx512: false,
            x86_avx512_vbmi: false,
            x86_avx2: false,
        }
    }
}

/// The LLVM backend with its options.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LlvmBackend {
    /// How to lower.
    pub options: LlvmOptions,
}

impl crate::Backend for LlvmBackend {
    type Artifact = String;

    fn name(&self) -> &'static str {
        BACKEND
    }

    fn lower(&self, kernel: &Kernel) -> Result<String> {
        lower(kernel, &self.options)
    }

    fn emit_text(&self, kernel: &Kernel) -> Result<String> {
        lower(kernel, &self.options)
    }
}

/// Verifies `kernel` and lowers it to the text of an LLVM IR module defining [`ENTRY`] with the
/// ABI of the module docs.
///
/// # Errors
/// [`crate::Error::Ir`] when the kernel does not verify, [`crate::Error::Unsupported`] for an
/// f16/bf16 store rounding other than `rne` or an unsupported lane count.
pub fn lower(kernel: &Kernel, options: &LlvmOptions) -> Result<String> {
    qforge_ir::verify(kernel)?;
    lower_prepared(&*prepare(kernel, options)?, options)
}

/// [`lower`] for a verified kernel already through [`prepare`] with `options`.
pub(crate) fn lower_prepared(kernel: &Kernel, options: &LlvmOptions) -> Result<String> {
    if !supported_lanes(options.lanes) {
        return Err(crate::Error::Unsupported {
            backend: BACKEND,
            op: format!(
                "{} vector lanes (use 0 or a power of two from 4 to 64)",
                options.lanes
            ),
        });
    }
    emit::module(kernel, options)
}

/// The kernel this backend lowers with `options`: `kernel` with [`qforge_ir::Op::SearchSorted`]
/// rewritten ([`crate::decompose`]) into the level search when lookups are permutes
/// ([`LlvmOptions::x86_avx512`] and a multiple of 16 lanes: small tables cost one permute),
/// else into the packed bucket search (one table read per lane), or with AVX2 vectors for
/// tables of at most 31 entries into the level search (register permutes). Its tables are the
/// ones the lowered code reads, in order (a runtime passes these, not the original kernel's).
///
/// # Errors
/// [`crate::Error::Ir`] when the kernel does not verify.
pub fn prepare<'k>(kernel: &'k Kernel, options: &LlvmOptions) -> Result<Cow<'k, Kernel>> {
    crate::decompose::search(kernel, search_strategy(options))
}

/// The search decomposition [`prepare`] uses with `options`.
pub(crate) fn search_strategy(options: &LlvmOptions) -> SearchStrategy {
    let permutes = options.x86_avx512 && options.lanes >= 16 && options.lanes.is_multiple_of(16);
    if permutes {
        SearchStrategy::Levels
    } else {
        // With AVX2, level tables of up to 16 entries are one or two `vpermd` each.
        let levels_up_to =
            if options.x86_avx2 && options.lanes >= 8 && options.lanes.is_multiple_of(8) {
                31
            } else {
                0
            };
        SearchStrategy::Packed { levels_up_to }
    }
}
