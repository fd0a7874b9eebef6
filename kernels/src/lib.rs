//! qforge-kernels: the op library. Each family's folder holds its kernels (written in the kernel
//! language, `#[qforge_macros::kernel]`, or with the public [`qforge_ir::KernelBuilder`]), its
//! host op with bitsandbytes' functional API ([`ops`] lists them all) and its tests. Nothing here
//! is privileged: a user's kernel uses the same API (`docs/custom-ops.md`).
//!
//! Families (see each module for the exact semantics and parameter order):
//! * [`quant4`]: NF4/FP4 blockwise `quantize_4bit`, `dequantize_4bit` and the nested
//!   (double-quantized absmax) dequantization, blocksizes 32..=4096.
//! * [`blockwise8`]: 8-bit blockwise `quantize_blockwise` / `dequantize_blockwise` with the
//!   dynamic (signed and unsigned) and linear maps, blocksizes 64..=4096.
//! * [`doublequant`]: `compress_statistics`: the absmax mean (offset) and the nested 8-bit level.
//! * [`matmul4`]: the fused 4-bit linear layer (`matmul_4bit`) and its input gradient.
//! * [`int8`]: LLM.int8() (`int8_vectorwise_quant`/`_dequant`, `int8_linear_matmul`,
//!   `int8_mm_dequant`, `int8_mixed_scaled_mm` and its input gradient; the products in
//!   [`int8::matmul`]) and the uniform per-row int8 weight format (`quantize_rowwise_int8`).
//! * [`gemm`]: the dense product of the adapters (forward, dX, dW).
//! * [`adam`]: 32-bit and 8-bit blockwise Adam / AdamW update kernels (bitsandbytes).
//! * [`optim1`]: 32-bit and 8-bit blockwise Lion, SGD with momentum, RMSprop, Adagrad.
//! * [`optim_ademamix`]: 32-bit and 8-bit blockwise AdEMAMix.
//! * [`optim_ext`]: `_gs` variants of the optimizer updates (bitsandbytes' `gnorm_scale`,
//!   `skip_zeros`) and percentile clipping's gradient-norm kernel.
//! * [`optim_norm1`]: `max_unorm` update-norm kernels of 32-bit RMSprop and Adagrad.
//! * [`optim_norm`]: 32-bit LAMB and LARS (bitsandbytes' `max_unorm` trust ratio): per-block
//!   norm partials, the scale, and the scaled update.
//! * [`optim_norm8`]: blockwise 8-bit LAMB and LARS (the 8-bit AdamW / SGD state with the
//!   trust ratio).
//! * [`optim4`]: 4-bit AdamW (adamw4bit: NF4 / Dyn4 / ZE-EDEN / ZIP-SR / 8-bit linear state),
//!   with its quantizers in [`optim4::quant`].
//! * [`optim_staged`]: the optimizer steps staged through a bounded workspace.
//! * [`activation`]: GELU, GELU-tanh, ReLU and SiLU with activation annealing, forward and
//!   backward.
//! * [`optim`]: the stateful optimizer API ([`optim::Optimizer`]) over these kernels.
//! * [`adapter`]: bottleneck adapters, forward and backward, over [`gemm`] and [`activation`].
//! * [`maps`]: the code tables with bitsandbytes' exact `f32` values.
//! * [`catalog()`]: every kernel variant, able to build itself and example arguments.
//!
//! The IR routines the kernels call (`exp`, `erf`, `tanh`, `sigmoid`, Philox, rounding) are in
//! [`qforge_ir::routines`]. Where bitsandbytes' backends disagree, these kernels follow the CUDA
//! kernels' choices; the differences from the CPU backend (which produced the golden vectors) are
//! listed in `docs/compat.md`.
#![deny(missing_docs)]

use qforge_ir::DType;
use qforge_ir::{Error, Result};

pub mod activation;
pub mod adam;
pub mod adapter;
pub mod blockwise8;
mod catalog;
pub mod doublequant;
mod emit;
mod entry;
pub mod funcs;
pub mod gemm;
pub mod int8;
#[cfg(test)]
mod kernel_tests;
pub mod maps;
#[cfg(test)]
mod math_tests;
pub mod matmul4;
pub mod nearest;
mod normal;
pub mod ops;
pub mod optim;
pub mod optim1;
pub mod optim4;
pub mod optim_ademamix;
pub mod optim_ext;
pub(crate) mod optim_funcs;
pub mod optim_norm;
pub mod optim_norm1;
pub mod optim_norm8;
pub mod optim_staged;
pub mod quant4;
#[cfg(feature = "stablehlo")]
mod spmd_capture;
#[cfg(test)]
mod test_util;
mod tile;

pub use activation::{Act, ActDirection, ActSpec, ACT_BLOCKSIZE};
pub use adam::{AdamHyper, AdamScalars, OptimAlgo, OptimSpec, StateBits, OPTIM_BLOCKSIZE};
pub use blockwise8::catalog::{Blockwise8Op, Blockwise8Spec};
pub use catalog::{catalog, Family, KernelSpec, FAMILIES};
pub use doublequant::DoubleQuantSpec;
pub use entry::CatalogEntry;
pub use gemm::{Gemm, Layout, GEMM_ORDER};
pub use int8::Int8Spec;
pub use matmul4::{Direction, Matmul4, TileConfig};
pub use normal::{erfc, normal_cdf, normal_ppf};
pub use optim1::{Optim1Algo, Optim1Hyper, Optim1Scalars, Optim1Spec};
pub use optim4::{MomentScheme, QAdamScalars, QAdamSizes, QAdamSpec, UniformSource};
pub use optim_ademamix::{AdemamixHyper, AdemamixScalars, AdemamixSpec};
pub use optim_ext::OptimExtSpec;
pub use optim_norm::{LambHyper, LambScalars, LarsHyper, LarsScalars, NormRule, OptimNormSpec};
pub use optim_norm8::OptimNorm8Spec;
pub use optim_staged::OptimStagedSpec;
pub use quant4::catalog::{Quant4Op, Quant4Spec};

/// Blocksizes supported by the 4-bit kernels.
pub const BLOCKSIZES_4BIT: [u32; 8] = [32, 64, 128, 256, 512, 1024, 2048, 4096];
/// Blocksizes supported by the 8-bit blockwise kernels.
pub const BLOCKSIZES_8BIT: [u32; 7] = [64, 128, 256, 512, 1024, 2048, 4096];
/// Blocksize of the nested (double-quantization) level, as bitsandbytes.
pub const NESTED_BLOCKSIZE: u32 = 256;
/// The order of the library's dot products unless a kernel names another (the forward 4-bit
/// matmul uses [`matmul4::K_ORDER`], the dense products [`GEMM_ORDER`]): 8 strided partials and
/// the halving tree, as a CPU loop of 4 or 8 lanes, or a GPU thread keeping the 8 partials,
/// compute it.
pub const DOT_ORDER: qforge_ir::ReduceOrder = qforge_ir::ReduceOrder::Strided(8);
/// Input/output dtypes of the quantization kernels.
pub const FLOAT_DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// A 4-bit data type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuantType {
    /// NormalFloat4 (QLoRA): 16 quantiles of N(0, 1), scaled to [-1, 1].
    Nf4,
    /// FP4 (1 sign, 2 exponent, 1 mantissa bit), scaled to [-1, 1].
    Fp4,
}

impl QuantType {
    /// Both 4-bit types.
    pub const ALL: [QuantType; 2] = [QuantType::Nf4, QuantType::Fp4];

    /// `nf4` or `fp4` (bitsandbytes' `quant_type` string).
    pub const fn name(self) -> &'static str {
        match self {
            QuantType::Nf4 => "nf4",
            QuantType::Fp4 => "fp4",
        }
    }

    /// The quant type called `name` (`nf4`, `fp4`), if any.
    pub fn from_name(name: &str) -> Option<QuantType> {
        QuantType::ALL.into_iter().find(|q| q.name() == name)
    }

    /// Parses a name produced by [`QuantType::name`].
    ///
    /// # Errors
    /// [`Error::Unsupported`] naming the value and the allowed set.
    pub fn parse(name: &str) -> Result<QuantType> {
        QuantType::from_name(name).ok_or_else(|| {
            Error::Unsupported(format!(
                "quant type '{name}' is not supported; allowed: nf4, fp4"
            ))
        })
    }

    /// The 16 code values, index = 4-bit code ([`maps::nf4_code`] or [`maps::fp4_code`]).
    pub fn code(self) -> [f32; 16] {
        match self {
            QuantType::Nf4 => maps::nf4_code(),
            QuantType::Fp4 => maps::fp4_code(),
        }
    }

    /// The table the dequantization kernels use: [`QuantType::code`], except that FP4 holds
    /// `-0.0` at index 8 as bitsandbytes' native kernels do ([`maps::fp4_dequant_table`]).
    pub fn dequant_table(self) -> [f32; 16] {
        match self {
            QuantType::Nf4 => maps::nf4_code(),
            QuantType::Fp4 => maps::fp4_dequant_table(),
        }
    }

    /// The code a `+0.0` input gets (and the padding nibble of an odd length): 7 for NF4, 0 for
    /// FP4.
    pub const fn zero_code(self) -> u8 {
        match self {
            QuantType::Nf4 => 7,
            QuantType::Fp4 => 0,
        }
    }
}

impl std::fmt::Display for QuantType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// An 8-bit code table (bitsandbytes quantization map) with a kernel variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockwiseMap {
    /// `create_dynamic_map(signed=True)`, bitsandbytes' default 8-bit code.
    Dynamic,
    /// `create_dynamic_map(signed=False)` (optimizer second-moment map).
    DynamicUnsigned,
    /// `create_linear_map(signed=True)`.
    Linear,
}

impl BlockwiseMap {
    /// All 8-bit maps.
    pub const ALL: [BlockwiseMap; 3] = [
        BlockwiseMap::Dynamic,
        BlockwiseMap::DynamicUnsigned,
        BlockwiseMap::Linear,
    ];

    /// The name used in kernel names and on the command line.
    pub const fn name(self) -> &'static str {
        match self {
            BlockwiseMap::Dynamic => "dynamic",
            BlockwiseMap::DynamicUnsigned => "dynamic_unsigned",
            BlockwiseMap::Linear => "linear",
        }
    }

    /// The map called `name` (`dynamic`, `dynamic_unsigned`, `linear`), if any.
    pub fn from_name(name: &str) -> Option<BlockwiseMap> {
        BlockwiseMap::ALL.into_iter().find(|m| m.name() == name)
    }

    /// Parses a name produced by [`BlockwiseMap::name`].
    ///
    /// # Errors
    /// [`Error::Unsupported`] naming the value and the allowed set.
    pub fn parse(name: &str) -> Result<BlockwiseMap> {
        BlockwiseMap::from_name(name).ok_or_else(|| {
            Error::Unsupported(format!(
                "8-bit map '{name}' is not supported; allowed: dynamic, dynamic_unsigned, linear"
            ))
        })
    }

    /// The 256 sorted code values.
    pub fn code(self) -> Vec<f32> {
        let m = match self {
            BlockwiseMap::Dynamic => maps::create_dynamic_map(true, 7, 8),
            BlockwiseMap::DynamicUnsigned => maps::create_dynamic_map(false, 7, 8),
            BlockwiseMap::Linear => maps::create_linear_map(true, 8, true),
        };
        m.unwrap_or_default()
    }
}

impl std::fmt::Display for BlockwiseMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

fn list(values: &[u32]) -> String {
    values
        .iter()
        .map(|v| v.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Checks a 4-bit blocksize.
///
/// # Errors
/// [`Error::Unsupported`] naming the value and the allowed set.
pub fn check_blocksize_4bit(blocksize: u32) -> Result<()> {
    if BLOCKSIZES_4BIT.contains(&blocksize) {
        Ok(())
    } else {
        Err(Error::Unsupported(format!(
            "blocksize {blocksize} is not supported for 4-bit quantization; allowed: {}",
            list(&BLOCKSIZES_4BIT)
        )))
    }
}

/// Checks an 8-bit blockwise blocksize.
///
/// # Errors
/// [`Error::Unsupported`] naming the value and the allowed set.
pub fn check_blocksize_8bit(blocksize: u32) -> Result<()> {
    if BLOCKSIZES_8BIT.contains(&blocksize) {
        Ok(())
    } else {
        Err(Error::Unsupported(format!(
            "blocksize {blocksize} is not supported for 8-bit blockwise quantization; allowed: {}",
            list(&BLOCKSIZES_8BIT)
        )))
    }
}

/// Checks that `dtype` is a float dtype the quantization kernels accept.
///
/// # Errors
/// [`Error::Unsupported`] naming the value and the allowed set.
pub fn check_float_dtype(dtype: DType) -> Result<()> {
    if FLOAT_DTYPES.contains(&dtype) {
        Ok(())
    } else {
        Err(Error::Unsupported(format!(
            "dtype {dtype} is not supported for quantization; allowed: f32, f16, bf16"
        )))
    }
}

#[cfg(test)]
mod tests {
    use crate::*;

    #[test]
    fn library_bad_requests_name_value_and_allowed_set() {
        let e = check_blocksize_4bit(48).unwrap_err().to_string();
        assert!(e.contains("48") && e.contains("32, 64, 128"), "{e}");
        let e = check_blocksize_8bit(32).unwrap_err().to_string();
        assert!(e.contains("32") && e.contains("64, 128"), "{e}");
        let e = QuantType::parse("int3").unwrap_err().to_string();
        assert!(e.contains("int3") && e.contains("nf4, fp4"), "{e}");
        let e = BlockwiseMap::parse("log").unwrap_err().to_string();
        assert!(e.contains("log") && e.contains("dynamic"), "{e}");
        let e = check_float_dtype(DType::U8).unwrap_err().to_string();
        assert!(e.contains("u8") && e.contains("bf16"), "{e}");
        assert_eq!(QuantType::parse("fp4").unwrap(), QuantType::Fp4);
        assert_eq!(
            BlockwiseMap::parse("dynamic_unsigned").unwrap(),
            BlockwiseMap::DynamicUnsigned
        );
    }
}
