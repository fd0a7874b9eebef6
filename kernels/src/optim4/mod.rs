//! Low-bit AdamW with per-moment quantization schemes, as the adamw4bit library (nubank,
//! `QuantizedAdamW`, `ZEEDENAdamW4Bit`, `ZIPSRAdamW4Bit`) computes it: NF4 first moment, 4-bit
//! dynamic (Dyn4) second moment with EDEN scale calibration (ZE-EDEN) or stochastic rounding in
//! preconditioner space (ZIP-SR), 8-bit linear, or `f32`. Every formula and its source is in
//! `docs/optimizers.md` ("4-bit AdamW"); each operation below is one `f32` operation with its own
//! rounding unless it says `fma`.
//!
//! # One step, per element (`g` the gradient widened to `f32`)
//! * load: `m = table[code] * absmax[block]` (8-bit linear: `f32(code / 127) * absmax`);
//! * moments (torch `lerp_`, one rounding): `m1 = fma(w1, g - m1, m1)`,
//!   `m2 = fma(w2, g * g - m2, m2)` with `w1 = f32(1 - beta1)`, `w2 = f32(1 - beta2)`;
//! * a non-finite `g` (NaN or ±inf) sets `m1 = m2 = +0.0` and leaves the parameter unchanged
//!   (qforge's policy, as its 8-bit optimizers: the reference library instead poisons the block);
//! * `p = p * decay`, then `p = p + (neg_step * m1) / (sqrt(m2) / sqrt_c2 + eps)` with the
//!   unquantized moments of this step; stored rounded to nearest even in the parameter dtype;
//! * store: each quantized moment is requantized per block with `absmax = max(max |x|, floor)`
//!   (NaN propagating; floor `1e-12` for 4-bit, `1e-8` for 8-bit) and `s = x / absmax`.
//!
//! # Layout
//! The flattened tensor of `n` elements; 4-bit moments use blocks of 128 elements with codes
//! packed two per byte, **element `2i` in the low nibble** of byte `i` (as adamw4bit stores them;
//! the opposite of bitsandbytes' weights); 8-bit linear moments use blocks of 256 with one `i8`
//! code per element. One work item covers [`QAdamSpec::item_size`] elements (256 when a moment is
//! 8-bit, else 128), i.e. one or two blocks of each moment. A last, partial block (only reached
//! when `n` is not a multiple of the block, which the runtime never launches for quantized
//! moments) simply has fewer elements; its odd pad nibble is 0.
//!
//! # Parameters, in order
//! `(n, n_items, n_packed, n_blocks1, n_blocks2: u32, w1, w2, decay, neg_step, sqrt_c2, eps,
//! c2: f32, seed_lo, seed_hi, param_id, step, offset: u32, p: dtype[n] readwrite, g: dtype[n] read,` then for each
//! moment `k` in 1, 2: `m{k}: f32[n]` (fp32), or `m{k}_code: u8[n_packed]` and
//! `m{k}_absmax: f32[n_blocks{k}]` (4-bit), or `m{k}_code: i8[n]` and `m{k}_absmax:
//! f32[n_blocks{k}]` (8-bit), all readwrite; then, with [`UniformSource::Buffer`] only,
//! `m{k}_uniform: f32[n] read` for each stochastically rounded moment `k`; then, in the staged
//! form ([`QAdamSpec::staged`]), `m{k}_stage: f32[n] readwrite` for each quantized moment `k`
//! (contents on entry never read; on exit the updated values))`. Grid `n_items`.
//!
//! # Random bits
//! A stochastically rounded element `e` of moment `k`, at `i = offset + e` in the whole tensor,
//! uses the uniform `(w >> 8) * 2^-24` of word `w = x[i % 2]` of Philox4x32-10
//! `x = philox(counter = (i / 2, step, param_id, k), key = (seed_lo, seed_hi))` (`offset`, the
//! launch's first element within the whole tensor, must be even; one call serves the two
//! elements of a byte): the code depends only on the seed, the parameter id, the step and the
//! element index, never on the backend, the chunking or the thread layout. [`UniformSource::Buffer`] (tests only) reads the uniform from a
//! buffer instead, so the arithmetic can be checked against the reference's mt19937 stream.
//!
//! # Source
//! The kernels are written in the kernel language ([`kernel`]; the quantizers are the
//! `#[func]` helpers of [`quant`]): one `#[kernel]` per pair of code element types, since
//! `m{k}_code` is `u8` for a 4-bit scheme and `i8` for `linear8` ([`kernel::CodeTypes`]). The
//! builder version they replaced is kept under `reference.rs` for a test that proves the two
//! build the same IR for every scheme pair, dtype and form.

mod catalog;
pub(crate) mod host;
pub mod kernel;
pub(crate) mod launch;
pub mod quant;
#[cfg(test)]
mod reference;
mod scheme;
#[cfg(test)]
mod tests;

use crate::check_float_dtype;
use qforge_ir::dsl::TypedKernel;
use qforge_ir::DType;
use qforge_ir::Kernel;
use qforge_ir::{Error, Result};

pub use crate::optim4::scheme::{
    MomentScheme, QAdamScalars, QAdamSizes, ABSMAX_FLOOR4, ABSMAX_FLOOR8, EDEN_DOT_FLOOR,
    QADAM_BLOCK4, QADAM_BLOCK8, QADAM_MIN_NUMEL,
};

/// Where stochastic rounding takes its uniforms from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UniformSource {
    /// Philox4x32-10 keyed by (seed, parameter id, step, element index): the real kernels.
    Philox,
    /// A `f32[n]` buffer per stochastic moment (tests: replaying the reference's mt19937 stream).
    Buffer,
}

/// One quantized-AdamW kernel variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QAdamSpec {
    /// First-moment scheme (`fp32`, `nf4`, `nf4_sr`, `linear8`).
    pub m1: MomentScheme,
    /// Second-moment scheme (`fp32`, `dyn4`, `dyn4_nz`, `dyn4_nz_eden`, `dyn4_sr`, `linear8`).
    pub m2: MomentScheme,
    /// Dtype of the parameter and the gradient: `f32`, `f16` or `bf16`.
    pub dtype: DType,
    /// Where stochastic rounding draws its uniforms.
    pub uniforms: UniformSource,
    /// The staged form: pass 1 also stores each quantized moment's updated values in a
    /// workspace buffer `m{k}_stage: f32[n] readwrite` (after the other parameters), and the
    /// absmax, EDEN and code passes read them back instead of decoding and updating the moment
    /// again. Same bits as the plain kernel; what the runtime runs on CPUs.
    pub staged: bool,
}

impl QAdamSpec {
    /// A spec with Philox uniforms.
    pub fn new(m1: MomentScheme, m2: MomentScheme, dtype: DType) -> QAdamSpec {
        QAdamSpec {
            m1,
            m2,
            dtype,
            uniforms: UniformSource::Philox,
            staged: false,
        }
    }

    /// This spec in the staged form ([`QAdamSpec::staged`]).
    pub fn staged(self) -> QAdamSpec {
        QAdamSpec {
            staged: true,
            ..self
        }
    }

    /// The kernel name, e.g. `qadamw_nf4_dyn4_sr_f32` (`_staged` appended for the staged form,
    /// then `_ubuf` for [`UniformSource::Buffer`]).
    pub fn name(&self) -> String {
        let staged = if self.staged { "_staged" } else { "" };
        let tail = match self.uniforms {
            UniformSource::Philox => "",
            UniformSource::Buffer => "_ubuf",
        };
        format!(
            "qadamw_{}_{}_{}{staged}{tail}",
            self.m1, self.m2, self.dtype
        )
    }

    /// Elements per work item: 256 when a moment is 8-bit linear, else 128.
    pub fn item_size(&self) -> u32 {
        self.m1.block().max(self.m2.block()).max(QADAM_BLOCK4)
    }

    /// The size scalars for `n` elements.
    pub fn sizes(&self, n: u32) -> QAdamSizes {
        let blocks = |s: MomentScheme| match s.block() {
            0 => 0,
            bs => n.div_ceil(bs),
        };
        QAdamSizes {
            n,
            n_items: n.div_ceil(self.item_size()),
            n_packed: n.div_ceil(2),
            n_blocks1: blocks(self.m1),
            n_blocks2: blocks(self.m2),
        }
    }

    /// Checks the spec: a float dtype, a signed scheme for m1 and an unsigned one for m2.
    ///
    /// # Errors
    /// [`Error::Unsupported`] naming the bad value and the allowed set.
    pub fn check(&self) -> Result<()> {
        check_float_dtype(self.dtype)?;
        if !self.m1.signed() {
            return Err(Error::Unsupported(format!(
                "first-moment scheme '{}' is not supported; allowed: fp32, nf4, nf4_sr, linear8",
                self.m1
            )));
        }
        if !self.m2.unsigned() {
            return Err(Error::Unsupported(format!(
                "second-moment scheme '{}' is not supported; allowed: fp32, dyn4, dyn4_nz, \
                 dyn4_nz_eden, dyn4_sr, linear8",
                self.m2
            )));
        }
        Ok(())
    }

    /// Builds the kernel (see the module docs) with the `#[kernel]` of its code types
    /// ([`kernel::CodeTypes`]).
    ///
    /// # Errors
    /// [`Error::Unsupported`] when [`QAdamSpec::check`] fails.
    pub fn build(&self) -> Result<Kernel> {
        self.check()?;
        use kernel::CodeTypes;
        match CodeTypes::of(self) {
            CodeTypes::C4C4 => kernel::qadamw_c4_c4(self).map(TypedKernel::into_kernel),
            CodeTypes::C4C8 => kernel::qadamw_c4_c8(self).map(TypedKernel::into_kernel),
            CodeTypes::C8C4 => kernel::qadamw_c8_c4(self).map(TypedKernel::into_kernel),
            CodeTypes::C8C8 => kernel::qadamw_c8_c8(self).map(TypedKernel::into_kernel),
        }
    }
}
