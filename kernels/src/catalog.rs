//! The catalog of every library kernel variant, for `qforge check`, the cross-backend
//! conformance tests, the snapshots and the CLI: a list of families ([`FAMILIES`]), each naming
//! its variants. Each family's folder holds its catalog entries (`<family>/catalog.rs`: the
//! variants, their names, how each builds, and example arguments made through the kernel's typed
//! signature where it has one), implementing the same [`CatalogEntry`] a user's kernel
//! implements.

use half::{bf16, f16};

use crate::activation::ActSpec;
use crate::adam::OptimSpec;
use crate::blockwise8::catalog::Blockwise8Spec;
use crate::doublequant::DoubleQuantSpec;
use crate::gemm::Gemm;
use crate::int8::Int8Spec;
use crate::matmul4::Matmul4;
use crate::optim1::Optim1Spec;
use crate::optim4::QAdamSpec;
use crate::optim_ademamix::AdemamixSpec;
use crate::optim_ext::OptimExtSpec;
use crate::optim_norm::OptimNormSpec;
use crate::optim_norm8::OptimNorm8Spec;
use crate::optim_staged::OptimStagedSpec;
use crate::quant4::catalog::Quant4Spec;
use crate::CatalogEntry;
use qforge_ir::{DType, Error, Kernel, OwnedArg, Result};

/// One library kernel variant: its family and the family's description of the variant.
/// [`KernelSpec::name`] is the kernel's name (bitsandbytes' function name, then the variant).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelSpec {
    /// `quantize_4bit`, `dequantize_4bit` and the nested-absmax dequantization.
    Quant4(Quant4Spec),
    /// `quantize_blockwise` / `dequantize_blockwise`.
    Blockwise8(Blockwise8Spec),
    /// The double-quantization kernels (absmax mean, nested quantize and decode).
    DoubleQuant(DoubleQuantSpec),
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

/// A family of library kernels: its name (the folder of `kernels/src/` that holds it) and its
/// variants in the catalog.
#[derive(Clone, Copy, Debug)]
pub struct Family {
    /// The family's name, e.g. `quant4`.
    pub name: &'static str,
    /// The family's variants.
    pub variants: fn() -> Vec<KernelSpec>,
}

/// Wraps the variants of one family.
fn each<T>(variants: Vec<T>, wrap: fn(T) -> KernelSpec) -> Vec<KernelSpec> {
    variants.into_iter().map(wrap).collect()
}

/// Every family of the library, in catalog order.
pub const FAMILIES: [Family; 15] = [
    Family {
        name: "quant4",
        variants: || each(Quant4Spec::variants(), KernelSpec::Quant4),
    },
    Family {
        name: "blockwise8",
        variants: || each(Blockwise8Spec::variants(), KernelSpec::Blockwise8),
    },
    Family {
        name: "doublequant",
        variants: || each(DoubleQuantSpec::ALL.to_vec(), KernelSpec::DoubleQuant),
    },
    Family {
        name: "matmul4",
        variants: || each(Matmul4::variants(), KernelSpec::Matmul4),
    },
    Family {
        name: "int8",
        variants: || each(Int8Spec::variants(), KernelSpec::Int8),
    },
    Family {
        name: "adam",
        variants: || each(OptimSpec::variants(), KernelSpec::Optim),
    },
    Family {
        name: "optim_staged",
        variants: || each(OptimStagedSpec::variants(), KernelSpec::OptimStaged),
    },
    Family {
        name: "optim1",
        variants: || each(Optim1Spec::variants(), KernelSpec::Optim1),
    },
    Family {
        name: "optim_ademamix",
        variants: || each(AdemamixSpec::variants(), KernelSpec::Ademamix),
    },
    Family {
        name: "gemm",
        variants: || each(Gemm::catalog(), KernelSpec::Gemm),
    },
    Family {
        name: "activation",
        variants: || each(ActSpec::all(), KernelSpec::Activation),
    },
    Family {
        name: "optim4",
        variants: || each(QAdamSpec::variants(), KernelSpec::QAdam),
    },
    Family {
        name: "optim_norm",
        variants: || each(OptimNormSpec::variants(), KernelSpec::OptimNorm),
    },
    Family {
        name: "optim_norm8",
        variants: || each(OptimNorm8Spec::variants(), KernelSpec::OptimNorm8),
    },
    Family {
        name: "optim_ext",
        variants: || each(OptimExtSpec::variants(), KernelSpec::OptimExt),
    },
];

/// Every library kernel variant: the variants of each of [`FAMILIES`] in turn.
pub fn catalog() -> Vec<KernelSpec> {
    FAMILIES.iter().flat_map(|f| (f.variants)()).collect()
}

impl KernelSpec {
    /// The family's description of this variant, as a catalog entry.
    pub fn entry(&self) -> &dyn CatalogEntry {
        match self {
            KernelSpec::Quant4(s) => s,
            KernelSpec::Blockwise8(s) => s,
            KernelSpec::DoubleQuant(s) => s,
            KernelSpec::Matmul4(s) => s,
            KernelSpec::Gemm(s) => s,
            KernelSpec::Int8(s) => s,
            KernelSpec::Optim(s) => s,
            KernelSpec::OptimStaged(s) => s,
            KernelSpec::Optim1(s) => s,
            KernelSpec::Ademamix(s) => s,
            KernelSpec::Activation(s) => s,
            KernelSpec::QAdam(s) => s,
            KernelSpec::OptimNorm(s) => s,
            KernelSpec::OptimNorm8(s) => s,
            KernelSpec::OptimExt(s) => s,
        }
    }

    /// The kernel name, e.g. `quantize_4bit_nf4_bs64_f32`, `dequantize_blockwise_dynamic_bs4096_bf16`.
    pub fn name(&self) -> String {
        self.entry().name()
    }

    /// Elements per block (per work item) of the kernel; for `absmax_mean_f32`, which reduces
    /// its whole input in one work item, the nested blocksize 256 (a useful test length).
    pub fn blocksize(&self) -> usize {
        self.entry().blocksize()
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
        self.entry().build()
    }

    /// Launch arguments (in parameter order) exercising every buffer, derived from `values`
    /// (`n = values.len()` elements; each family documents its layout in its `catalog.rs`):
    /// quantize kernels take `values` as input (rounded to the dtype); dequantize kernels take
    /// codes mixed from the values' bits and an absmax per block computed from the values, so
    /// NaN, inf and zero blocks in `values` reach the kernel. Write buffers start zeroed.
    ///
    /// # Errors
    /// [`Error::Unsupported`] for an empty `values` or more than `u32::MAX` values.
    pub fn example_args(&self, values: &[f32]) -> Result<Vec<OwnedArg>> {
        example_len(values)?;
        self.entry().example_args(values)
    }
}

/// `values.len()` as the `u32` element count of example arguments.
///
/// # Errors
/// [`Error::Unsupported`] for an empty `values` or more than `u32::MAX` values.
pub(crate) fn example_len(values: &[f32]) -> Result<u32> {
    match u32::try_from(values.len()) {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(Error::Unsupported(format!(
            "example arguments need between 1 and {} values, got {}",
            u32::MAX,
            values.len()
        ))),
    }
}

/// The first finite value of `values`, else 0.5 (an offset or scale for example arguments).
pub(crate) fn first_finite(values: &[f32]) -> f32 {
    values
        .iter()
        .copied()
        .find(|v| v.is_finite())
        .unwrap_or(0.5)
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
pub(crate) fn host_absmax(values: &[f32], blocksize: usize, propagate_nan: bool) -> Vec<f32> {
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
                // Dense products (two with `B` in panels).
                + 7
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
