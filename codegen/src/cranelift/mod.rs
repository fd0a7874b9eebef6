//! The Cranelift CPU backend: lowers a verified [`Kernel`] to one Cranelift IR function.
//!
//! # ABI of the lowered function
//!
//! ```text
//! extern "C" fn(args: *const u64, begin: u32, end: u32)
//! ```
//!
//! The function runs the work items `begin..end` in increasing order. `args` is an array of
//! [`ArgLayout::len`] 64-bit slots:
//!
//! | slot | holds |
//! |---|---|
//! | `i` for parameter `i` | a buffer's base pointer, or a scalar's 32 bits zero-extended |
//! | [`ArgLayout::table`]`(t)` | pointer to table `t`'s elements (`u32` bit patterns, 4-aligned) |
//! | [`ArgLayout::status`] (bounds checks on) | pointer to a `u32` status word, 0 before the call |
//! | [`ArgLayout::count`]`(i)` (bounds checks on) | element count of buffer parameter `i` |
//!
//! With bounds checks on, an out-of-range buffer access (or a non-empty reduce range reaching
//! past its buffer) is skipped, a skipped load yields zero, and the first work item `w` in
//! `begin..end` that made one is reported by storing `w + 1` into the status word (if it is
//! still 0); the check is a compare and a branch to a cold block. Without bounds checks an
//! out-of-range index is undefined behaviour, exactly as the IR allows for compiled backends.
//!
//! # Semantics
//!
//! Every op follows the doc comments of [`qforge_ir::Op`] to the bit: separate `fmul`/`fadd`
//! (Cranelift never contracts), `fma` only for [`qforge_ir::Op::Fma`], min/max as compare +
//! select, sign operations as bit operations, guarded integer division, exact f16/bf16
//! conversions written with integer operations, reductions in their stated order, and
//! `accumulate` statements as one fused `fma` per element into the partial their order names,
//! then the fixed halving tree (`accumulate.rs`).

mod accumulate;
mod accumulate_columns;
mod accumulate_range;
mod accumulate_wide;
mod arith;
mod lower;
mod memory;
mod reduce;
mod vector_mem;
mod vector_running;
mod vectorize;

use cranelift_codegen::ir::Function;
use cranelift_codegen::isa::CallConv;
use cranelift_codegen::settings;
use qforge_ir::Kernel;

use crate::error::{Error, Result};

/// The backend name used in errors and in `qforge check`.
pub const BACKEND: &str = "cranelift";

/// Choices that change the emitted function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LowerOptions {
    /// Calling convention of the emitted function; use the target's default C convention
    /// (`isa.default_call_conv()`) when compiling for a host. [`clif_text`] uses `system_v`.
    pub call_conv: CallConv,
    /// Check every buffer access against the buffer's element count (see the module docs).
    pub bounds_checks: bool,
    /// Allow 128-bit vector code: strided sums of `f32` buffers, `for` loops with step 1 and a
    /// straight-line body run 4 iterations at a time (see `vectorize.rs`), and `accumulate`
    /// statements of `Strided(w)` order with `w` a multiple of 4 run 4 elements at a time into
    /// `f32x4` partials (see `accumulate.rs`); all bit-identical to the scalar code. Every 64-bit Cranelift target with a vector unit (x86_64, aarch64)
    /// supports it.
    pub simd: bool,
    /// Emit x86's `pshufb` for the byte shuffles that decode packed 4-bit codes
    /// (`accumulate_wide.rs`) instead of the portable `swizzle` (which adds a saturating add
    /// to map indices above 15 to zero; the indices there are below 16, so both give the same
    /// bytes). Only for x86_64 targets; Cranelift calls a routine on CPUs without SSSE3.
    pub x86_pshufb: bool,
}

impl Default for LowerOptions {
    /// `system_v`, bounds checks on, SIMD on, portable shuffles.
    fn default() -> Self {
        LowerOptions {
            call_conv: CallConv::SystemV,
            bounds_checks: true,
            simd: true,
            x86_pshufb: false,
        }
    }
}

pub use qforge_ir::cpu_abi::ArgLayout;

/// A kernel lowered to Cranelift IR, ready for a JIT or an object writer.
#[derive(Clone, Debug)]
pub struct LoweredKernel {
    /// The function, with the ABI described in the module docs (not yet optimized).
    pub function: Function,
    /// Where the launch arguments go.
    pub layout: ArgLayout,
}

/// The Cranelift backend with its options.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CraneliftBackend {
    /// How to lower.
    pub options: LowerOptions,
}

impl crate::Backend for CraneliftBackend {
    type Artifact = LoweredKernel;

    fn name(&self) -> &'static str {
        BACKEND
    }

    fn lower(&self, kernel: &Kernel) -> Result<LoweredKernel> {
        lower(kernel, &self.options)
    }

    fn emit_text(&self, kernel: &Kernel) -> Result<String> {
        Ok(lower(kernel, &self.options)?.function.display().to_string())
    }
}

/// Verifies `kernel` and lowers it to one Cranelift function with the ABI of the module docs.
///
/// # Errors
/// [`Error::Ir`] when the kernel does not verify, [`Error::Unsupported`] for an op this backend
/// cannot lower (an f16/bf16 store rounding other than `rne`), [`Error::Backend`] when
/// Cranelift's verifier rejects the function (a bug in this backend).
pub fn lower(kernel: &Kernel, options: &LowerOptions) -> Result<LoweredKernel> {
    qforge_ir::verify(kernel)?;
    lower_prepared(&*prepare(kernel)?, options)
}

/// [`lower`] for a verified kernel already through [`prepare`] (the compile pipeline's
/// emission step).
pub(crate) fn lower_prepared(kernel: &Kernel, options: &LowerOptions) -> Result<LoweredKernel> {
    let function = lower::build(kernel, options)?;
    let flags = settings::Flags::new(settings::builder());
    cranelift_codegen::verify_function(&function, &flags).map_err(|errors| Error::Backend {
        backend: BACKEND,
        message: format!("kernel '{}': Cranelift verifier: {errors}", kernel.name),
    })?;
    Ok(LoweredKernel {
        function,
        layout: ArgLayout::new(kernel, options.bounds_checks),
    })
}

/// The symbol names of the routines Cranelift calls where the target lacks an instruction
/// (`fma` without FMA, `floor`/`ceil`/`trunc`/`nearest` without SSE4.1, `pshufb` without
/// SSSE3): `qforge_fmaf`, `qforge_floorf`, `qforge_ceilf`, `qforge_truncf`,
/// `qforge_nearbyintf`, `qforge_pshufb`, which the runtime defines with exact semantics; other
/// libcalls keep Cranelift's default names.
pub fn libcall_name(call: cranelift_codegen::ir::LibCall) -> String {
    use cranelift_codegen::ir::LibCall;
    match call {
        LibCall::FmaF32 => "qforge_fmaf".into(),
        LibCall::FloorF32 => "qforge_floorf".into(),
        LibCall::CeilF32 => "qforge_ceilf".into(),
        LibCall::TruncF32 => "qforge_truncf".into(),
        LibCall::NearestF32 => "qforge_nearbyintf".into(),
        LibCall::X86Pshufb => "qforge_pshufb".into(),
        other => cranelift_module::default_libcall_names()(other),
    }
}

/// The kernel this backend lowers: `kernel` with [`qforge_ir::Op::SearchSorted`] rewritten into
/// the packed bucket search ([`crate::decompose`]: one table read). Its tables are the ones
/// the lowered code reads, in [`ArgLayout::table`] order (a runtime passes these, not the
/// original kernel's).
///
/// # Errors
/// [`Error::Ir`] when the kernel does not verify.
pub fn prepare(kernel: &Kernel) -> Result<std::borrow::Cow<'_, Kernel>> {
    crate::decompose::search(
        kernel,
        crate::decompose::SearchStrategy::Packed { levels_up_to: 0 },
    )
}

/// The Cranelift IR text of `kernel` lowered with [`LowerOptions::default`] (target
/// independent and deterministic: suitable for snapshots).
///
/// # Errors
/// As [`lower`].
pub fn clif_text(kernel: &Kernel) -> Result<String> {
    crate::Backend::emit_text(&CraneliftBackend::default(), kernel)
}
