//! The catalog of every library kernel variant, for `qforge check`, the cross-backend
//! conformance tests and the CLI.

use half::{bf16, f16};

use crate::activation::{ActSpec, ACT_BLOCKSIZE};
use crate::adam::{self, OptimAlgo, OptimSpec, StateBits, OPTIM_BLOCKSIZE};
use crate::gemm::Gemm;
use crate::int8::Int8Spec;
use crate::matmul4::{Direction, Matmul4, TileConfig};
use crate::optim1::{self, Optim1Algo, Optim1Spec};
use crate::optim4::{self, MomentScheme, QAdamSpec};
use crate::optim_ademamix::{self, AdemamixSpec};
use crate::optim_ext::{self, OptimExtSpec};
use crate::optim_norm::{self, NormRule, OptimNormSpec};
use crate::optim_norm8::{self, OptimNorm8Spec};
use crate::optim_staged::{self, OptimStagedSpec};
use crate::{
    blockwise8, doublequant, quant4, BlockwiseMap, QuantType, BLOCKSIZES_4BIT, BLOCKSIZES_8BIT,
    FLOAT_DTYPES, NESTED_BLOCKSIZE,
};
use qforge_ir::dsl::TypedKernel;
use qforge_ir::Kernel;
use qforge_ir::OwnedArg;
use qforge_ir::{DType, Scalar};
use qforge_ir::{Error, Result};

/// One library kernel variant: what it computes and with which parameters. [`KernelSpec::name`]
/// is the kernel's name (bitsandbytes' function name, then the variant).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelSpec {
    /// [`quant4::quantize_4bit`].
    Quantize4 {
        /// NF4 or FP4.
        quant_type: QuantType,
        /// Elements per absmax block.
        blocksize: u32,
        /// Input dtype.
        dtype: DType,
    },
    /// [`quant4::dequantize_4bit`].
    Dequantize4 {
        /// NF4 or FP4.
        quant_type: QuantType,
        /// Elements per absmax block.
        blocksize: u32,
        /// Output dtype.
        dtype: DType,
    },
    /// [`quant4::dequantize_4bit_nested`].
    Dequantize4Nested {
        /// NF4 or FP4.
        quant_type: QuantType,
        /// Elements per absmax block.
        blocksize: u32,
        /// Output dtype.
        dtype: DType,
    },
    /// [`blockwise8::quantize_blockwise`].
    QuantizeBlockwise {
        /// The code table.
        map: BlockwiseMap,
        /// Elements per absmax block.
        blocksize: u32,
        /// Input dtype.
        dtype: DType,
    },
    /// [`blockwise8::dequantize_blockwise`].
    DequantizeBlockwise {
        /// The code table.
        map: BlockwiseMap,
        /// Elements per absmax block.
        blocksize: u32,
        /// Output dtype.
        dtype: DType,
    },
    /// [`doublequant::absmax_mean`].
    AbsmaxMean,
    /// [`doublequant::quantize_nested`].
    QuantizeNested,
    /// [`doublequant::dequantize_nested`].
    DequantizeNested,
    /// [`Matmul4::build`]: the fused 4-bit linear layer or its input gradient.
    Matmul4(Matmul4),
    /// [`Gemm::build`]: a dense product of a full-precision linear layer (forward, `dX`, `dW`).
    Gemm(Gemm),
    /// [`Int8Spec::build`]: an LLM.int8() kernel or the per-row int8 weight quantizer.
    Int8(Int8Spec),
    /// [`OptimSpec::build`]: a 32-bit or 8-bit blockwise Adam / AdamW update.
    Optim(OptimSpec),
    /// [`OptimStagedSpec::build`]: an 8-bit blockwise Adam / AdamW update in the staged form
    /// (the updated moments kept in `f32` workspace buffers between its two passes).
    OptimStaged(OptimStagedSpec),
    /// [`Optim1Spec::build`]: a 32-bit or 8-bit blockwise one-state update (Lion, SGD with
    /// momentum, RMSprop, Adagrad).
    Optim1(Optim1Spec),
    /// [`AdemamixSpec::build`]: a 32-bit or 8-bit blockwise AdEMAMix update.
    Ademamix(AdemamixSpec),
    /// [`ActSpec::build`]: an activation kernel with annealing (`act_beta`, forward or
    /// backward).
    Activation(ActSpec),
    /// [`QAdamSpec::build`]: quantized AdamW with per-moment schemes (4-bit AdamW: ZIP-SR,
    /// ZE-EDEN, 8-bit linear).
    QAdam(QAdamSpec),
    /// [`OptimNormSpec::build`]: a kernel of 32-bit LAMB / LARS (norm partials, trust-ratio
    /// scale, scaled update).
    OptimNorm(OptimNormSpec),
    /// [`OptimNorm8Spec::build`]: a kernel of blockwise 8-bit LAMB / LARS (norm partials from
    /// 8-bit state, scaled 8-bit update).
    OptimNorm8(OptimNorm8Spec),
    /// [`OptimExtSpec::build`]: an optimizer update with bitsandbytes' `gnorm_scale` /
    /// `skip_zeros` (`_gs` variants), or percentile clipping's gradient-norm kernel.
    OptimExt(OptimExtSpec),
}

/// The matmul directions, each in the catalog.
const MATMUL_DIRECTIONS: [Direction; 3] = [
    Direction::Forward { bias: false },
    Direction::Forward { bias: true },
    Direction::BackwardInput,
];

/// The tile a catalog matmul kernel uses: varied with the dtype so every backend runs tiles
/// with several activation rows, several weight rows and a side that is not a power of two.
fn catalog_tile(dtype: DType, direction: Direction) -> TileConfig {
    match (dtype, direction) {
        (DType::F16, _) => TileConfig { tm: 2, tn: 2 },
        (DType::BF16, Direction::Forward { .. }) => TileConfig { tm: 4, tn: 1 },
        (DType::BF16, Direction::BackwardInput) => TileConfig { tm: 3, tn: 1 },
        _ => TileConfig { tm: 1, tn: 4 },
    }
}

/// The LLM.int8() kernels of the catalog: every kernel for every float dtype (the matmuls with
/// and without bias, tiles from [`catalog_tile`]), and the integer matmul with two tiles.
fn int8_catalog() -> Vec<Int8Spec> {
    let mut out = Vec::new();
    for dtype in FLOAT_DTYPES {
        out.extend([
            Int8Spec::OutlierCols { dtype },
            Int8Spec::VectorwiseQuant { dtype },
            Int8Spec::VectorwiseDequant { dtype },
            Int8Spec::QuantizeRowwise { dtype },
        ]);
        for bias in [false, true] {
            out.push(Int8Spec::MmDequant { dtype, bias });
            out.push(Int8Spec::MixedScaledMm {
                dtype,
                bias,
                tile: catalog_tile(dtype, Direction::Forward { bias }),
            });
        }
        out.push(Int8Spec::MixedScaledMmDx {
            dtype,
            tile: catalog_tile(dtype, Direction::BackwardInput),
        });
    }
    for tile in [TileConfig { tm: 1, tn: 1 }, TileConfig { tm: 2, tn: 4 }] {
        out.push(Int8Spec::LinearMatmul { tile });
    }
    out
}

/// Every library kernel variant: all quant types x blocksizes x dtypes x ops, then the 8-bit maps
/// x blocksizes x dtypes x ops, then the three double-quantization kernels, the 4-bit matmuls and
/// the LLM.int8() kernels.
pub fn catalog() -> Vec<KernelSpec> {
    let mut out = Vec::new();
    for quant_type in QuantType::ALL {
        for blocksize in BLOCKSIZES_4BIT {
            for dtype in FLOAT_DTYPES {
                out.push(KernelSpec::Quantize4 {
                    quant_type,
                    blocksize,
                    dtype,
                });
                out.push(KernelSpec::Dequantize4 {
                    quant_type,
                    blocksize,
                    dtype,
                });
                out.push(KernelSpec::Dequantize4Nested {
                    quant_type,
                    blocksize,
                    dtype,
                });
            }
        }
    }
    for map in BlockwiseMap::ALL {
        for blocksize in BLOCKSIZES_8BIT {
            for dtype in FLOAT_DTYPES {
                out.push(KernelSpec::QuantizeBlockwise {
                    map,
                    blocksize,
                    dtype,
                });
                out.push(KernelSpec::DequantizeBlockwise {
                    map,
                    blocksize,
                    dtype,
                });
            }
        }
    }
    out.extend([
        KernelSpec::AbsmaxMean,
        KernelSpec::QuantizeNested,
        KernelSpec::DequantizeNested,
    ]);
    // Matmul: blocksize 64 (any builds; it only sets a shift) in every type, dtype, absmax form
    // and direction, plus blocksize 256 with an f32 activation and a bf16 weight.
    for quant_type in QuantType::ALL {
        for dtype in FLOAT_DTYPES {
            for nested in [false, true] {
                for direction in MATMUL_DIRECTIONS {
                    out.push(KernelSpec::Matmul4(Matmul4 {
                        quant_type,
                        blocksize: 64,
                        dtype,
                        weight_dtype: dtype,
                        nested,
                        direction,
                        tile: catalog_tile(dtype, direction),
                    }));
                }
            }
        }
    }
    for direction in MATMUL_DIRECTIONS {
        out.push(KernelSpec::Matmul4(Matmul4 {
            quant_type: QuantType::Nf4,
            blocksize: 256,
            dtype: DType::F32,
            weight_dtype: DType::BF16,
            nested: false,
            direction,
            tile: catalog_tile(DType::F32, direction),
        }));
    }
    out.extend(int8_catalog().into_iter().map(KernelSpec::Int8));
    out.extend(optim_catalog().into_iter().map(KernelSpec::Optim));
    out.extend(
        optim_staged_catalog()
            .into_iter()
            .map(KernelSpec::OptimStaged),
    );
    out.extend(optim1_catalog().into_iter().map(KernelSpec::Optim1));
    for state in [StateBits::Bits32, StateBits::Bits8] {
        out.push(KernelSpec::Ademamix(AdemamixSpec {
            state,
            dtype: DType::F32,
        }));
    }
    out.extend(Gemm::catalog().into_iter().map(KernelSpec::Gemm));
    out.extend(ActSpec::all().into_iter().map(KernelSpec::Activation));
    out.extend(qadam_catalog().into_iter().map(KernelSpec::QAdam));
    out.extend(optim_norm_catalog().into_iter().map(KernelSpec::OptimNorm));
    out.extend(
        optim_norm8::catalog()
            .into_iter()
            .map(KernelSpec::OptimNorm8),
    );
    out.extend(optim_ext_catalog().into_iter().map(KernelSpec::OptimExt));
    out
}

/// The `_gs` optimizer variants of the catalog (32-bit and 8-bit Adam / AdamW on f32 and bf16,
/// every one-state rule with both widths), the gradient-norm kernel on every float dtype, the
/// `max_unorm` norm kernels of RMSprop and Adagrad (plain and `_gs`), and the `_gs` LAMB / LARS
/// kernels (32-bit LAMB on f32 and bf16, 32-bit LARS, 8-bit LAMB and LARS on f32).
fn optim_ext_catalog() -> Vec<OptimExtSpec> {
    let mut out = Vec::new();
    for (algo, dtype) in [
        (OptimAlgo::AdamW, DType::F32),
        (OptimAlgo::Adam, DType::BF16),
    ] {
        for state in [StateBits::Bits32, StateBits::Bits8] {
            out.push(OptimExtSpec::Adam(OptimSpec { algo, state, dtype }));
        }
    }
    out.extend(optim1_catalog().into_iter().map(OptimExtSpec::One));
    out.extend(FLOAT_DTYPES.iter().map(|&d| OptimExtSpec::GradNorm(d)));
    for &a in crate::optim_norm1::NORM1_ALGOS.iter() {
        out.extend([OptimExtSpec::Norm1(a), OptimExtSpec::Norm1Gs(a)]);
    }
    // The update-norm kernels with percentile clipping: 32-bit LAMB on f32 and bf16, LARS,
    // 8-bit LAMB and LARS on f32.
    for (rule, dtype) in [
        (NormRule::Lamb, DType::F32),
        (NormRule::Lamb, DType::BF16),
        (NormRule::Lars, DType::F32),
    ] {
        out.push(OptimExtSpec::Norm(OptimNormSpec::Partials { rule, dtype }));
        out.push(OptimExtSpec::Norm(OptimNormSpec::Update { rule, dtype }));
    }
    for rule in NormRule::ALL {
        let dtype = DType::F32;
        out.push(OptimExtSpec::Norm8(OptimNorm8Spec::Partials {
            rule,
            dtype,
        }));
        out.push(OptimExtSpec::Norm8(OptimNorm8Spec::Update { rule, dtype }));
    }
    out
}

/// The LAMB / LARS kernels of the catalog: LAMB's partials and update on f32 and bf16, LARS's
/// on f32, and the shared scale kernel.
fn optim_norm_catalog() -> Vec<OptimNormSpec> {
    let mut out = Vec::new();
    for (rule, dtypes) in [
        (NormRule::Lamb, &[DType::F32, DType::BF16][..]),
        (NormRule::Lars, &[DType::F32][..]),
    ] {
        for &dtype in dtypes {
            out.push(OptimNormSpec::Partials { rule, dtype });
            out.push(OptimNormSpec::Update { rule, dtype });
        }
    }
    out.push(OptimNormSpec::Scale);
    out
}

/// The quantized-AdamW kernels of the catalog: the ZIP-SR and ZE-EDEN recipes on f32 and bf16,
/// 8-bit linear on f32 and NF4 stochastic rounding with `dyn4_nz` on f32.
fn qadam_catalog() -> Vec<QAdamSpec> {
    let mut out = Vec::new();
    for m2 in [MomentScheme::Dyn4Sr, MomentScheme::Dyn4NzEden] {
        for dtype in [DType::F32, DType::BF16] {
            out.push(QAdamSpec::new(MomentScheme::Nf4, m2, dtype));
        }
    }
    out.push(QAdamSpec::new(
        MomentScheme::Linear8,
        MomentScheme::Linear8,
        DType::F32,
    ));
    out.push(QAdamSpec::new(
        MomentScheme::Nf4Sr,
        MomentScheme::Dyn4Nz,
        DType::F32,
    ));
    // The staged forms: both recipes, the 8-bit pair, SR in both moments' value spaces, and an
    // f32 first moment (no stage for it).
    for (m1, m2, dtype) in [
        (MomentScheme::Nf4, MomentScheme::Dyn4Sr, DType::F32),
        (MomentScheme::Nf4, MomentScheme::Dyn4NzEden, DType::BF16),
        (MomentScheme::Linear8, MomentScheme::Linear8, DType::F32),
        (MomentScheme::Nf4Sr, MomentScheme::Dyn4Nz, DType::F32),
        (MomentScheme::Fp32, MomentScheme::Dyn4Sr, DType::F32),
    ] {
        out.push(QAdamSpec::new(m1, m2, dtype).staged());
    }
    out
}

/// The optimizer kernels of the catalog: Adam and AdamW with 32-bit and 8-bit state on f32 and
/// bf16 parameters, plus 8-bit AdamW on f16.
fn optim_catalog() -> Vec<OptimSpec> {
    let mut out = Vec::new();
    for algo in [OptimAlgo::Adam, OptimAlgo::AdamW] {
        for state in [StateBits::Bits32, StateBits::Bits8] {
            for dtype in [DType::F32, DType::BF16] {
                out.push(OptimSpec { algo, state, dtype });
            }
        }
    }
    out.push(OptimSpec {
        algo: OptimAlgo::AdamW,
        state: StateBits::Bits8,
        dtype: DType::F16,
    });
    out
}

/// The staged 8-bit Adam / AdamW kernels of the catalog: both rules on f32 and bf16, and the
/// `_gs` variants of the `_gs` catalog's 8-bit pairs (AdamW on f32, Adam on bf16).
fn optim_staged_catalog() -> Vec<OptimStagedSpec> {
    let mut out = Vec::new();
    for (algo, dtype, gs) in [
        (OptimAlgo::Adam, DType::F32, false),
        (OptimAlgo::Adam, DType::BF16, false),
        (OptimAlgo::AdamW, DType::F32, false),
        (OptimAlgo::AdamW, DType::BF16, false),
        (OptimAlgo::AdamW, DType::F32, true),
        (OptimAlgo::Adam, DType::BF16, true),
    ] {
        let spec = OptimSpec {
            algo,
            state: StateBits::Bits8,
            dtype,
        };
        out.push(OptimStagedSpec {
            spec,
            grad_opts: gs,
        });
    }
    out
}

/// The one-state optimizer kernels of the catalog: each rule with 32-bit and 8-bit state on f32.
fn optim1_catalog() -> Vec<Optim1Spec> {
    let mut out = Vec::new();
    for algo in Optim1Algo::ALL {
        for state in [StateBits::Bits32, StateBits::Bits8] {
            out.push(Optim1Spec {
                algo,
                state,
                dtype: DType::F32,
            });
        }
    }
    out
}

/// Deterministic mixing of an index and a value's bits into 32 pseudo-random bits (for codes in
/// example arguments).
pub(crate) fn mix(i: usize, v: f32) -> u32 {
    let mut h = v.to_bits() ^ (i as u32).wrapping_mul(0x9E37_79B9);
    h ^= h >> 16;
    h = h.wrapping_mul(0x85EB_CA6B);
    h ^= h >> 13;
    h = h.wrapping_mul(0xC2B2_AE35);
    h ^ (h >> 16)
}

/// `values` stored as `dtype` (round to nearest even for f16/bf16).
pub(crate) fn float_bytes(dtype: DType, values: &[f32]) -> Vec<u8> {
    match dtype {
        DType::F16 => values
            .iter()
            .flat_map(|v| f16::from_f32(*v).to_le_bytes())
            .collect(),
        DType::BF16 => values
            .iter()
            .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
            .collect(),
        _ => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

/// Host absmax of each block of `values` (NaN propagating or ignored).
fn host_absmax(values: &[f32], blocksize: usize, propagate_nan: bool) -> Vec<f32> {
    values
        .chunks(blocksize)
        .map(|c| {
            c.iter().fold(0.0f32, |acc, v| {
                let a = v.abs();
                if a.is_nan() {
                    if propagate_nan {
                        f32::NAN
                    } else {
                        acc
                    }
                } else if acc.is_nan() || a <= acc {
                    acc
                } else {
                    a
                }
            })
        })
        .collect()
}

pub(crate) fn u32_arg(v: usize) -> OwnedArg {
    OwnedArg::Scalar(Scalar::U32(v as u32))
}

impl KernelSpec {
    /// The kernel name, e.g. `quantize_4bit_nf4_bs64_f32`, `dequantize_blockwise_dynamic_bs4096_bf16`.
    pub fn name(&self) -> String {
        match *self {
            KernelSpec::Quantize4 {
                quant_type,
                blocksize,
                dtype,
            } => quant4::quantize_name(quant_type, blocksize, dtype),
            KernelSpec::Dequantize4 {
                quant_type,
                blocksize,
                dtype,
            } => quant4::dequantize_name(quant_type, blocksize, dtype),
            KernelSpec::Dequantize4Nested {
                quant_type,
                blocksize,
                dtype,
            } => quant4::dequantize_nested_name(quant_type, blocksize, dtype),
            KernelSpec::QuantizeBlockwise {
                map,
                blocksize,
                dtype,
            } => blockwise8::quantize_name(map, blocksize, dtype),
            KernelSpec::DequantizeBlockwise {
                map,
                blocksize,
                dtype,
            } => blockwise8::dequantize_name(map, blocksize, dtype),
            KernelSpec::AbsmaxMean => doublequant::MEAN_NAME.to_string(),
            KernelSpec::QuantizeNested => doublequant::QUANTIZE_NESTED_NAME.to_string(),
            KernelSpec::DequantizeNested => doublequant::DEQUANTIZE_NESTED_NAME.to_string(),
            KernelSpec::Matmul4(m) => m.name(),
            KernelSpec::Gemm(g) => g.name(),
            KernelSpec::Int8(s) => s.name(),
            KernelSpec::Optim(s) => s.name(),
            KernelSpec::OptimStaged(s) => s.name(),
            KernelSpec::Optim1(s) => s.name(),
            KernelSpec::Ademamix(s) => s.name(),
            KernelSpec::Activation(s) => s.name(),
            KernelSpec::QAdam(s) => s.name(),
            KernelSpec::OptimNorm(s) => s.name(),
            KernelSpec::OptimNorm8(s) => s.name(),
            KernelSpec::OptimExt(s) => s.name(),
        }
    }

    /// Elements per block (per work item) of the kernel; for `absmax_mean_f32`, which reduces
    /// its whole input in one work item, the nested blocksize 256 (a useful test length).
    pub fn blocksize(&self) -> usize {
        match *self {
            KernelSpec::Quantize4 { blocksize, .. }
            | KernelSpec::Dequantize4 { blocksize, .. }
            | KernelSpec::Dequantize4Nested { blocksize, .. }
            | KernelSpec::QuantizeBlockwise { blocksize, .. }
            | KernelSpec::DequantizeBlockwise { blocksize, .. }
            | KernelSpec::Matmul4(Matmul4 { blocksize, .. }) => blocksize as usize,
            KernelSpec::AbsmaxMean | KernelSpec::QuantizeNested | KernelSpec::DequantizeNested => {
                NESTED_BLOCKSIZE as usize
            }
            KernelSpec::Int8(s) => s.blocksize(),
            KernelSpec::Optim(_)
            | KernelSpec::OptimStaged(_)
            | KernelSpec::Optim1(_)
            | KernelSpec::Ademamix(_)
            | KernelSpec::OptimNorm(_)
            | KernelSpec::OptimNorm8(_)
            | KernelSpec::OptimExt(_) => OPTIM_BLOCKSIZE as usize,
            KernelSpec::Activation(_) => ACT_BLOCKSIZE as usize,
            KernelSpec::Gemm(_) => 64,
            KernelSpec::QAdam(s) => s.item_size() as usize,
        }
    }

    /// The catalog entry called `name`, if any.
    pub fn from_name(name: &str) -> Option<KernelSpec> {
        catalog().into_iter().find(|s| s.name() == name)
    }

    /// Builds the kernel.
    ///
    /// # Errors
    /// [`Error::Unsupported`] when the spec's parameters are outside the supported sets (a spec
    /// from [`catalog()`] always builds).
    pub fn build(&self) -> Result<Kernel> {
        match *self {
            KernelSpec::Quantize4 {
                quant_type,
                blocksize,
                dtype,
            } => quant4::quantize_4bit(quant_type, blocksize, dtype).map(TypedKernel::into_kernel),
            KernelSpec::Dequantize4 {
                quant_type,
                blocksize,
                dtype,
            } => {
                quant4::dequantize_4bit(quant_type, blocksize, dtype).map(TypedKernel::into_kernel)
            }
            KernelSpec::Dequantize4Nested {
                quant_type,
                blocksize,
                dtype,
            } => quant4::dequantize_4bit_nested(quant_type, blocksize, dtype)
                .map(TypedKernel::into_kernel),
            KernelSpec::QuantizeBlockwise {
                map,
                blocksize,
                dtype,
            } => {
                blockwise8::quantize_blockwise(map, blocksize, dtype).map(TypedKernel::into_kernel)
            }
            KernelSpec::DequantizeBlockwise {
                map,
                blocksize,
                dtype,
            } => blockwise8::dequantize_blockwise(map, blocksize, dtype)
                .map(TypedKernel::into_kernel),
            KernelSpec::AbsmaxMean => doublequant::absmax_mean().map(TypedKernel::into_kernel),
            KernelSpec::QuantizeNested => {
                doublequant::quantize_nested().map(TypedKernel::into_kernel)
            }
            KernelSpec::DequantizeNested => {
                doublequant::dequantize_nested().map(TypedKernel::into_kernel)
            }
            KernelSpec::Matmul4(m) => m.build(),
            KernelSpec::Gemm(g) => g.build(),
            KernelSpec::Int8(s) => s.build(),
            KernelSpec::Optim(s) => s.build(),
            KernelSpec::OptimStaged(s) => s.build(),
            KernelSpec::Optim1(s) => s.build(),
            KernelSpec::Ademamix(s) => s.build(),
            KernelSpec::Activation(s) => s.build().map(TypedKernel::into_kernel),
            KernelSpec::QAdam(s) => s.build(),
            KernelSpec::OptimNorm(s) => s.build(),
            KernelSpec::OptimNorm8(s) => s.build(),
            KernelSpec::OptimExt(s) => s.build(),
        }
    }

    /// Launch arguments (in parameter order) exercising every buffer, derived from `values`
    /// (`n = values.len()` elements). Quantize kernels take `values` as input (rounded to the
    /// dtype); dequantize kernels take codes mixed from the values' bits and an absmax per block
    /// computed from the values, so NaN, inf and zero blocks in `values` reach the kernel. Write
    /// buffers start zeroed. Matmul kernels reduce over `n` elements (`K` forward, `N`
    /// backward) with `M = 1 + n % 3` activation rows and `3 + n % 5` outputs per row; the
    /// activations cycle through `values`, the codes are mixed from them and each block's absmax
    /// is `|values[b % n]|`. The LLM.int8() kernels' arguments are described in
    /// `int8::args` (matrices of `2 + n % 3` rows, outliers present). The optimizer
    /// kernels' arguments are described in `adam::example_args` (NaN and inf in the
    /// gradient).
    ///
    /// # Errors
    /// [`Error::Unsupported`] for an empty `values` or more than `u32::MAX` values.
    pub fn example_args(&self, values: &[f32]) -> Result<Vec<OwnedArg>> {
        let n = values.len();
        if n == 0 || u32::try_from(n).is_err() {
            return Err(Error::Unsupported(format!(
                "example arguments need between 1 and {} values, got {n}",
                u32::MAX
            )));
        }
        let n_packed = n.div_ceil(2);
        let first_finite = values
            .iter()
            .copied()
            .find(|v| v.is_finite())
            .unwrap_or(0.5);
        Ok(match *self {
            KernelSpec::Int8(s) => s.example_args(values)?,
            KernelSpec::Optim(s) => adam::example_args(&s, values, mix, float_bytes)?,
            KernelSpec::OptimStaged(s) => optim_staged::example_args(&s, values, mix, float_bytes)?,
            KernelSpec::Optim1(s) => optim1::example_args(&s, values, mix, float_bytes)?,
            KernelSpec::Ademamix(s) => optim_ademamix::example_args(&s, values, mix, float_bytes)?,
            KernelSpec::Activation(s) => s.example_args(values, float_bytes),
            KernelSpec::QAdam(s) => optim4::example_args(&s, values, mix, float_bytes)?,
            KernelSpec::OptimNorm(s) => optim_norm::example_args(&s, values, float_bytes)?,
            KernelSpec::OptimNorm8(s) => optim_norm8::example_args(&s, values, mix, float_bytes)?,
            KernelSpec::OptimExt(s) => optim_ext::example_args(&s, values, mix, float_bytes)?,
            KernelSpec::Matmul4(m) => matmul_example_args(&m, values, first_finite),
            KernelSpec::Gemm(g) => g.example_args(values, float_bytes),
            KernelSpec::Quantize4 {
                blocksize, dtype, ..
            } => {
                let n_blocks = n.div_ceil(blocksize as usize);
                vec![
                    u32_arg(n),
                    u32_arg(n_packed),
                    u32_arg(n_blocks),
                    OwnedArg::Read(float_bytes(dtype, values)),
                    OwnedArg::Write(vec![0; n_packed]),
                    OwnedArg::Write(vec![0; 4 * n_blocks]),
                ]
            }
            KernelSpec::Dequantize4 {
                blocksize, dtype, ..
            }
            | KernelSpec::Dequantize4Nested {
                blocksize, dtype, ..
            } => {
                let bs = blocksize as usize;
                let n_blocks = n.div_ceil(bs);
                let packed: Vec<u8> = (0..n_packed)
                    .map(|j| {
                        let hi = mix(2 * j, values[2 * j]) & 15;
                        let lo = values.get(2 * j + 1).map_or(0, |v| mix(2 * j + 1, *v) & 15);
                        (hi << 4 | lo) as u8
                    })
                    .collect();
                let out = OwnedArg::Write(vec![0; n * dtype.size_bytes()]);
                if matches!(self, KernelSpec::Dequantize4 { .. }) {
                    let absmax = host_absmax(values, bs, true);
                    vec![
                        u32_arg(n),
                        u32_arg(n_packed),
                        u32_arg(n_blocks),
                        OwnedArg::Read(packed),
                        OwnedArg::Read(float_bytes(DType::F32, &absmax)),
                        out,
                    ]
                } else {
                    let n_nested = n_blocks.div_ceil(NESTED_BLOCKSIZE as usize);
                    let qabsmax: Vec<u8> = (0..n_blocks)
                        .map(|b| mix(b, values[b * bs]) as u8)
                        .collect();
                    let nested: Vec<f32> = (0..n_nested).map(|i| values[i % n].abs()).collect();
                    vec![
                        u32_arg(n),
                        u32_arg(n_packed),
                        u32_arg(n_blocks),
                        u32_arg(n_nested),
                        OwnedArg::Scalar(Scalar::f32(first_finite * 0.5)),
                        OwnedArg::Read(packed),
                        OwnedArg::Read(qabsmax),
                        OwnedArg::Read(float_bytes(DType::F32, &nested)),
                        OwnedArg::Read(float_bytes(DType::F32, &doublequant::NESTED_MAP.code())),
                        out,
                    ]
                }
            }
            KernelSpec::QuantizeBlockwise {
                blocksize, dtype, ..
            } => {
                let n_blocks = n.div_ceil(blocksize as usize);
                vec![
                    u32_arg(n),
                    u32_arg(n_blocks),
                    OwnedArg::Read(float_bytes(dtype, values)),
                    OwnedArg::Write(vec![0; n]),
                    OwnedArg::Write(vec![0; 4 * n_blocks]),
                ]
            }
            KernelSpec::DequantizeBlockwise {
                blocksize, dtype, ..
            } => {
                let n_blocks = n.div_ceil(blocksize as usize);
                let q: Vec<u8> = values
                    .iter()
                    .enumerate()
                    .map(|(i, v)| mix(i, *v) as u8)
                    .collect();
                let absmax = host_absmax(values, blocksize as usize, false);
                vec![
                    u32_arg(n),
                    u32_arg(n_blocks),
                    OwnedArg::Read(q),
                    OwnedArg::Read(float_bytes(DType::F32, &absmax)),
                    OwnedArg::Write(vec![0; n * dtype.size_bytes()]),
                ]
            }
            KernelSpec::AbsmaxMean => {
                vec![
                    u32_arg(n),
                    OwnedArg::Read(float_bytes(DType::F32, values)),
                    OwnedArg::Write(vec![0; 4]),
                ]
            }
            KernelSpec::QuantizeNested => {
                let n_blocks = n.div_ceil(NESTED_BLOCKSIZE as usize);
                vec![
                    u32_arg(n),
                    u32_arg(n_blocks),
                    OwnedArg::Scalar(Scalar::f32(first_finite * 0.5)),
                    OwnedArg::Read(float_bytes(DType::F32, values)),
                    OwnedArg::Write(vec![0; n]),
                    OwnedArg::Write(vec![0; 4 * n_blocks]),
                ]
            }
            KernelSpec::DequantizeNested => {
                let n_blocks = n.div_ceil(NESTED_BLOCKSIZE as usize);
                let q: Vec<u8> = values
                    .iter()
                    .enumerate()
                    .map(|(i, v)| mix(i, *v) as u8)
                    .collect();
                let absmax = host_absmax(values, NESTED_BLOCKSIZE as usize, false);
                vec![
                    u32_arg(n),
                    u32_arg(n_blocks),
                    OwnedArg::Scalar(Scalar::f32(first_finite * 0.5)),
                    OwnedArg::Read(q),
                    OwnedArg::Read(float_bytes(DType::F32, &absmax)),
                    OwnedArg::Write(vec![0; 4 * n]),
                ]
            }
        })
    }
}

/// [`KernelSpec::example_args`] of a matmul kernel.
fn matmul_example_args(spec: &Matmul4, values: &[f32], first_finite: f32) -> Vec<OwnedArg> {
    let len = values.len();
    let m = 1 + len % 3;
    let outs = 3 + len % 5;
    let (n, k) = match spec.direction {
        Direction::Forward { .. } => (outs, len),
        Direction::BackwardInput => (len, outs),
    };
    let (tm, tn) = (spec.tile.tm as usize, spec.tile.tn as usize);
    let n_tiles = outs.div_ceil(tn);
    let n_items = m.div_ceil(tm) * n_tiles;
    let elems = n * k;
    let n_packed = elems.div_ceil(2);
    let n_blocks = elems.div_ceil(spec.blocksize as usize);
    let cycle = |count: usize, shift: usize| -> Vec<f32> {
        (0..count)
            .map(|i| values[(i + i / len + shift) % len])
            .collect()
    };
    let act_len = m * len;
    let mut args = vec![
        u32_arg(m),
        u32_arg(n),
        u32_arg(k),
        u32_arg(n_items),
        u32_arg(n_tiles),
    ];
    if spec.nested {
        args.push(OwnedArg::Scalar(Scalar::f32(first_finite * 0.5)));
    }
    args.extend([u32_arg(n_packed), u32_arg(n_blocks)]);
    let n_nested = n_blocks.div_ceil(NESTED_BLOCKSIZE as usize);
    if spec.nested {
        args.push(u32_arg(n_nested));
    }
    args.push(OwnedArg::Read(float_bytes(spec.dtype, &cycle(act_len, 0))));
    let packed: Vec<u8> = (0..n_packed)
        .map(|j| mix(j, values[j % len]) as u8)
        .collect();
    args.push(OwnedArg::Read(packed));
    let absmax: Vec<f32> = (0..n_blocks).map(|b| values[b % len].abs()).collect();
    if spec.nested {
        let qabsmax: Vec<u8> = (0..n_blocks).map(|b| mix(b, absmax[b]) as u8).collect();
        let nested: Vec<f32> = (0..n_nested).map(|i| values[(i + 1) % len].abs()).collect();
        args.extend([
            OwnedArg::Read(qabsmax),
            OwnedArg::Read(float_bytes(DType::F32, &nested)),
            OwnedArg::Read(float_bytes(DType::F32, &doublequant::NESTED_MAP.code())),
        ]);
    } else {
        args.push(OwnedArg::Read(float_bytes(DType::F32, &absmax)));
    }
    if matches!(spec.direction, Direction::Forward { bias: true }) {
        args.push(OwnedArg::Read(float_bytes(spec.dtype, &cycle(n, 3))));
    }
    args.push(OwnedArg::Write(vec![0; m * outs * spec.dtype.size_bytes()]));
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_catalog_builds_verifies_and_binds() {
        let cat = catalog();
        assert_eq!(
            cat.len(),
            2 * 8 * 3 * 3
                + 3 * 7 * 3 * 2
                + 3
                + (2 * 3 * 2 * 3 + 3)
                + 3 * 9
                + 2
                + 9
                + 4 * 2
                + 2
                + 6
                + 24
                + 5
                + 7
                // 8-bit LAMB (3 dtypes) and LARS: partials and update.
                + 8
                // `_gs` variants (4 Adam / AdamW, 8 one-state), gradient norms, RMSprop /
                // Adagrad max_unorm norms.
                + 12
                + 3
                + 2
                // `_gs` update-norm kernels: RMSprop / Adagrad norms, 32-bit LAMB (f32, bf16)
                // and LARS partials and updates, 8-bit LAMB and LARS (f32) partials and updates.
                + 2
                + 6
                + 4
                // Staged 8-bit Adam / AdamW (4 plain, 2 `_gs`), staged quantized AdamW.
                + 6
                + 5
        );
        let mut names = std::collections::HashSet::new();
        let values = [
            1.0f32,
            -0.5,
            0.0,
            f32::NAN,
            3.0,
            -0.0,
            1e-40,
            f32::INFINITY,
            0.25,
        ];
        for spec in &cat {
            let k = spec.build().unwrap();
            assert_eq!(k.name, spec.name());
            assert!(names.insert(k.name.clone()), "duplicate {}", k.name);
            qforge_ir::verify(&k).unwrap_or_else(|e| panic!("{}: {e}", k.name));
            let mut args = spec.example_args(&values).unwrap();
            let borrowed = OwnedArg::borrow_all(&mut args);
            qforge_ir::bind(&k, &borrowed).unwrap_or_else(|e| panic!("{}: {e}", k.name));
            assert_eq!(KernelSpec::from_name(&k.name), Some(*spec));
        }
        assert!(names.contains("quantize_4bit_nf4_bs64_f32"));
        assert!(names.contains("dequantize_blockwise_dynamic_bs4096_bf16"));
        assert!(names.contains("int8_vectorwise_quant_f16"));
        assert!(names.contains("int8_linear_matmul_t2x4"));
        assert!(names.contains("int8_mixed_scaled_mm_bf16_bias_t4x1"));
        assert!(names.contains("adamw8bit_f16") && names.contains("adam32_bf16"));
        assert!(names.contains("lamb_norm_bf16") && names.contains("optim_norm_scale"));
        assert!(names.contains("lamb8_norm_f16") && names.contains("lars8bit_f32"));
        assert!(names.contains("adamw32_f32_gs") && names.contains("lion8bit_f32_gs"));
        assert!(names.contains("grad_sqnorm_f16") && names.contains("adagrad_norm_f32"));
        assert!(KernelSpec::from_name("quantize_4bit_nf4_bs48_f32").is_none());
        assert!(cat[0].example_args(&[]).is_err());
    }
}
