//! Host-side ops with bitsandbytes' functional API, over any [`Device`]: each call validates its
//! inputs, takes the library kernel (built once and cached by name) and launches it.
//!
//! * [`quantize_4bit`] / [`dequantize_4bit`]: NF4/FP4, optional double quantization of the absmax.
//! * [`quantize_blockwise`] / [`dequantize_blockwise`]: 8-bit blockwise with a [`BlockwiseMap`].
//! * [`matmul_4bit`] / [`matmul_4bit_backward_input`] / [`Linear4bit`]: the fused 4-bit linear
//!   layer and its input gradient; [`suggest_tile_sizes`] picks the tile.
//! * [`int8_vectorwise_quant`] / [`int8_vectorwise_dequant`], [`int8_linear_matmul`],
//!   [`int8_mm_dequant`], [`int8_mixed_scaled_mm`] (+ [`int8_mixed_scaled_mm_backward_input`]),
//!   [`Linear8bitLt`]: LLM.int8(); [`quantize_rowwise_int8`] / [`dequantize_rowwise_int8`]: the
//!   per-row int8 weight format.
//! * [`adam_step_32bit`] / [`adam_step_8bit`]: Adam and AdamW with 32-bit or 8-bit blockwise
//!   state ([`AdamState32`], [`AdamState8`]). Every optimizer op takes bitsandbytes' gradient
//!   options ([`GradOptions`]: `gnorm_scale`, `skip_zeros`; `GradOptions::default()` runs the
//!   plain kernels) as its last argument.
//! * [`lamb_step_32bit`] / [`lars_step_32bit`]: LAMB and LARS (bitsandbytes' `max_unorm` trust
//!   ratio), also as their three pieces ([`lamb_norm_partials`], [`norm_scale`],
//!   [`lamb_update_32bit`], ...) for chunked callers; [`lamb_step_8bit`] / [`lars_step_8bit`]:
//!   the same with blockwise 8-bit state ([`lamb8_norm_partials`], [`lamb_update_8bit`], ...).
//! * [`absmax_mean`], [`compress_absmax`], [`compress_absmax_with_offset`],
//!   [`decompress_absmax`]: the double-quantization steps on their own.
//!
//! The exact semantics of every kernel are documented in [`crate`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use qforge_ir::dsl::{Signature, TypedKernel};
use qforge_ir::DType;

use qforge_runtime::HostTensor;
use qforge_runtime::{Error, Result};

pub use crate::activation::host::{act_beta, act_beta_backward};
pub use crate::adam::host::{
    adam_step_32bit, adam_step_8bit, AdamState32, AdamState8, GradOptions, OPTIM_PARAM_DTYPES,
};
pub use crate::blockwise8::host::{
    absmax_mean, compress_absmax, compress_absmax_with_offset, decompress_absmax,
    dequantize_blockwise, quantize_blockwise,
};
pub use crate::gemm::host::gemm;
pub use crate::int8::host::{
    dequantize_rowwise_int8, int8_linear_matmul, int8_mixed_scaled_mm,
    int8_mixed_scaled_mm_backward_input, int8_mm_dequant, int8_vectorwise_dequant,
    int8_vectorwise_quant, quantize_rowwise_int8, suggest_int8_tile_sizes, Int8Quantized,
    Linear8bitLt, MAX_INT8_K,
};
pub use crate::matmul4::host::{
    matmul_4bit, matmul_4bit_backward_input, suggest_backward_tile_sizes, suggest_tile_sizes,
    DeviceCaps, Linear4bit,
};
pub use crate::matmul4::row_shard::row_cols;
pub use crate::matmul4::shard::column_rows;
pub use crate::optim1::host::{optim1_step_32bit, optim1_step_8bit, Optim1State8};
pub use crate::optim4::host::{qadamw_step, MomentState, QAdamRng, QAdamState};
pub use crate::optim4::launch::{launch_qadam, QAdamBuffers};
pub use crate::optim_ademamix::host::{
    ademamix_step_32bit, ademamix_step_8bit, AdemamixState32, AdemamixState8,
};
pub use crate::optim_ext::host::{grad_sqnorm_partials, sum_partials};
pub use crate::optim_norm::host::{
    lamb_norm_partials, lamb_step_32bit, lamb_update_32bit, lars_norm_partials, lars_step_32bit,
    lars_update_32bit, norm_scale, norm_scale_eps, NormPartials,
};
pub use crate::optim_norm1::host::{
    optim1_norm_partials, optim1_norm_scale, optim1_step_32bit_max_unorm,
    optim1_update_scaled_32bit,
};
pub use crate::optim_norm8::host::{
    lamb8_norm_partials, lamb_step_8bit, lamb_update_8bit, lars8_norm_partials, lars_step_8bit,
    lars_update_8bit,
};
pub use crate::optim_staged::host::{launch_adam8, Adam8Buffers, STAGE_CHUNK};
pub use crate::quant4::host::{dequantize_4bit, quantize_4bit, Absmax4, QuantState4};
pub use crate::Layout;
pub use crate::TileConfig;
pub use crate::{AdamHyper, OptimAlgo};
pub use crate::{AdemamixHyper, Optim1Algo, Optim1Hyper};
pub use crate::{BlockwiseMap, QuantType};
pub use crate::{LambHyper, LarsHyper};
pub use crate::{MomentScheme, QAdamSpec};

/// The typed kernel called `name` from the process-wide cache of typed kernels, built by
/// `build` on first use.
pub(crate) fn cached_typed<S: Signature>(
    name: &str,
    build: impl FnOnce() -> qforge_ir::Result<TypedKernel<S>>,
) -> Result<Arc<TypedKernel<S>>> {
    type Cache = HashMap<String, Arc<dyn std::any::Any + Send + Sync>>;
    static CACHE: OnceLock<Mutex<Cache>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    let found = cache.lock().map_err(|_| poisoned())?.get(name).cloned();
    if let Some(k) = found.and_then(|k| k.downcast::<TypedKernel<S>>().ok()) {
        return Ok(k);
    }
    let kernel = Arc::new(build()?);
    cache.lock().map_err(|_| poisoned())?.insert(
        name.to_string(),
        Arc::clone(&kernel) as Arc<dyn std::any::Any + Send + Sync>,
    );
    Ok(kernel)
}

pub(crate) fn poisoned() -> Error {
    Error::Invalid("the kernel cache lock is poisoned (a thread panicked while holding it)".into())
}

/// The most elements one host op handles: `2^31 - 1`. The kernels index with `u32`, and every
/// index they form (a block's end is at most `n + blocksize`, a packed byte's second element
/// `2 * i + 1`) then stays below `2^32`; it is also the `int` range bitsandbytes' CUDA kernels use.
pub const MAX_ELEMENTS: usize = i32::MAX as usize;

/// `what` as a `u32` element count, at most [`MAX_ELEMENTS`].
///
/// # Errors
/// [`Error::Invalid`] when the count exceeds [`MAX_ELEMENTS`].
pub(crate) fn count_u32(op: &str, what: &str, n: usize) -> Result<u32> {
    if n > MAX_ELEMENTS {
        return Err(Error::Invalid(format!(
            "{op}: {what} has {n} elements, more than the supported {MAX_ELEMENTS} (2^31 - 1)"
        )));
    }
    Ok(n as u32)
}

/// The element count of a float tensor whose bytes match its shape.
///
/// # Errors
/// [`Error::Invalid`] for an empty tensor, a non-float dtype, bytes that do not match the shape,
/// or more than `u32::MAX` elements.
pub(crate) fn float_input(op: &str, x: &HostTensor) -> Result<u32> {
    if !x.dtype.is_float() {
        return Err(Error::Invalid(format!(
            "{op}: the input must be f32, f16 or bf16, got {}",
            x.dtype
        )));
    }
    let numel = numel(op, &x.shape)?;
    if numel == 0 {
        return Err(Error::Invalid(format!(
            "{op}: the input tensor is empty (shape {:?})",
            x.shape
        )));
    }
    if x.data.len() != numel * x.dtype.size_bytes() {
        return Err(Error::Invalid(format!(
            "{op}: a {} tensor of shape {:?} needs {} bytes, got {}",
            x.dtype,
            x.shape,
            numel * x.dtype.size_bytes(),
            x.data.len()
        )));
    }
    count_u32(op, "the input", numel)
}

/// The product of `shape`, checked for overflow.
pub(crate) fn numel(op: &str, shape: &[usize]) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| Error::Invalid(format!("{op}: shape {shape:?} overflows the element count")))
}

/// A host blocksize as the `u32` the kernels bake in, checked against the allowed set.
///
/// # Errors
/// [`Error::Invalid`] naming the value and the allowed set.
pub(crate) fn blocksize_u32(op: &str, blocksize: usize, allowed: &[u32]) -> Result<u32> {
    match u32::try_from(blocksize) {
        Ok(b) if allowed.contains(&b) => Ok(b),
        _ => Err(Error::Invalid(format!(
            "{op}: blocksize {blocksize} is not supported; allowed: {}",
            allowed
                .iter()
                .map(|b| b.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// Checks that an output dtype is a float dtype.
pub(crate) fn float_dtype(op: &str, dtype: DType) -> Result<()> {
    if dtype.is_float() {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "{op}: the output dtype must be f32, f16 or bf16, got {dtype}"
        )))
    }
}

/// Checks a buffer length against the length the state implies.
pub(crate) fn expect_len(op: &str, what: &str, got: usize, want: usize) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "{op}: {what} has {got} elements, the quant state needs {want}"
        )))
    }
}

pub(crate) fn f32_le(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

pub(crate) fn le_f32(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[cfg(test)]
mod tests;
