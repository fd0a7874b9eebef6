//! Double quantization of the 4-bit absmax (bitsandbytes `compress_statistics=True`).
//!
//! bitsandbytes computes `offset = absmax.mean()` and quantizes `absmax - offset` with 8-bit
//! blockwise quantization (signed dynamic map, blocksize 256); dequantization decodes
//! `code[q] * nested_absmax + offset` (two `f32` roundings). Here:
//!
//! * `absmax_mean_f32`: `(n: u32, absmax: f32[n] read, out: f32[1] write)`, grid 1:
//!   `out[0] = sum(absmax) / f32(n)`, the sum an `f32` [`crate::Op::Reduce`] in the order
//!   [`OFFSET_ORDER`] and a single `f32` division by `n` (converted with round-to-nearest-even).
//! * `quantize_blockwise_dynamic_offset_bs256_f32`: `(n: u32, n_blocks: u32, offset: f32,
//!   x: f32[n] read, q: u8[n] write, absmax: f32[n_blocks] write)`: exactly
//!   `quantize_blockwise_dynamic_bs256_f32` of `x - offset` (one `f32` subtraction per element),
//!   the absmax a NaN-ignoring max over those differences.
//! * `dequantize_blockwise_dynamic_offset_bs256_f32`: `(n: u32, n_blocks: u32, offset: f32,
//!   q: u8[n] read, absmax: f32[n_blocks] read, out: f32[n] write)`:
//!   `out = code[q] * absmax + offset` (the decoded 4-bit absmax).
//!
//! The 4-bit dequantization with the nested absmax decoded in-kernel is
//! [`crate::library::quant4::dequantize_4bit_nested`].

use crate::builder::KernelBuilder;
use crate::error::Result;
use crate::kernel::{Access, Dim, Kernel};
use crate::library::blockwise8::{build_dequantize, build_quantize};
use crate::library::{BlockwiseMap, NESTED_BLOCKSIZE};
use crate::ops::ReduceOrder;
use crate::types::{DType, ScalarType};

/// The summation order of the absmax mean: 16 strided partial sums combined by a fixed tree
/// (see [`ReduceOrder::Strided`]). torch's CPU `mean` uses its own cascade order; the resulting
/// offsets differ from bitsandbytes' by at most 1 ulp on the golden vectors (`docs/compat.md`).
pub const OFFSET_ORDER: ReduceOrder = ReduceOrder::Strided(16);

/// The map of the nested level (bitsandbytes' default signed dynamic map).
pub const NESTED_MAP: BlockwiseMap = BlockwiseMap::Dynamic;

/// Name of the absmax-mean kernel.
pub const MEAN_NAME: &str = "absmax_mean_f32";
/// Name of the nested quantize kernel.
pub const QUANTIZE_NESTED_NAME: &str = "quantize_blockwise_dynamic_offset_bs256_f32";
/// Name of the nested absmax decode kernel.
pub const DEQUANTIZE_NESTED_NAME: &str = "dequantize_blockwise_dynamic_offset_bs256_f32";

/// Builds `absmax_mean_f32` (see the module docs).
pub fn absmax_mean() -> Kernel {
    let mut b = KernelBuilder::new(MEAN_NAME);
    let n = b.scalar_param("n", ScalarType::U32);
    let absmax = b.buffer_param("absmax", DType::F32, &[Dim::Param(n)], Access::Read);
    let out = b.buffer_param("out", DType::F32, &[Dim::Const(1)], Access::Write);
    let zero = b.const_u32(0);
    let nv = b.param(n);
    let sum = b.reduce_sum(absmax, zero, nv, OFFSET_ORDER);
    let count = b.int_to_float(nv);
    let mean = b.div(sum, count);
    b.store(out, zero, mean);
    b.finish()
}

/// Builds `quantize_blockwise_dynamic_offset_bs256_f32` (see the module docs).
///
/// # Errors
/// Never for these fixed parameters; the `Result` comes from the shared builder.
pub fn quantize_nested() -> Result<Kernel> {
    build_quantize(
        QUANTIZE_NESTED_NAME,
        NESTED_MAP,
        NESTED_BLOCKSIZE,
        DType::F32,
        true,
    )
}

/// Builds `dequantize_blockwise_dynamic_offset_bs256_f32` (see the module docs).
///
/// # Errors
/// Never for these fixed parameters; the `Result` comes from the shared builder.
pub fn dequantize_nested() -> Result<Kernel> {
    build_dequantize(
        DEQUANTIZE_NESTED_NAME,
        NESTED_MAP,
        NESTED_BLOCKSIZE,
        DType::F32,
        true,
    )
}
