//! The 4-bit kernels in the catalog: every quant type x blocksize x dtype, each as
//! `quantize_4bit`, `dequantize_4bit` and the nested-absmax `dequantize_4bit`, with example
//! arguments made through their typed signatures.

use qforge_ir::dsl::TypedKernel;
use qforge_ir::dsl::{FloatIn, FloatOut};
use qforge_ir::{DType, Kernel, OwnedArg, Result};

use super::{
    dequantize_4bit, dequantize_4bit_nested, dequantize_name, dequantize_nested_name,
    quantize_4bit, quantize_name, Dequantize4bitArgs, Dequantize4bitNestedArgs, Quantize4bitArgs,
};
use crate::catalog::{example_len, first_finite, float_bytes, host_absmax, mix};
use crate::doublequant::NESTED_MAP;
use crate::{CatalogEntry, QuantType, BLOCKSIZES_4BIT, FLOAT_DTYPES, NESTED_BLOCKSIZE};

/// Which 4-bit kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Quant4Op {
    /// [`quantize_4bit`].
    Quantize,
    /// [`dequantize_4bit`] with a plain `f32` absmax.
    Dequantize,
    /// [`dequantize_4bit_nested`]: the absmax double-quantized.
    DequantizeNested,
}

/// One 4-bit kernel variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Quant4Spec {
    /// Which kernel.
    pub op: Quant4Op,
    /// NF4 or FP4.
    pub quant_type: QuantType,
    /// Elements per absmax block.
    pub blocksize: u32,
    /// The float dtype (input of a quantize, output of a dequantize).
    pub dtype: DType,
}

impl Quant4Spec {
    /// Every quant type x blocksize x dtype x op.
    pub fn variants() -> Vec<Quant4Spec> {
        let mut out = Vec::new();
        for quant_type in QuantType::ALL {
            for blocksize in BLOCKSIZES_4BIT {
                for dtype in FLOAT_DTYPES {
                    for op in [
                        Quant4Op::Quantize,
                        Quant4Op::Dequantize,
                        Quant4Op::DequantizeNested,
                    ] {
                        out.push(Quant4Spec {
                            op,
                            quant_type,
                            blocksize,
                            dtype,
                        });
                    }
                }
            }
        }
        out
    }
}

/// Packed 4-bit codes mixed from the bits of `values` (two per byte, high nibble first).
fn example_codes(values: &[f32]) -> Vec<u8> {
    (0..values.len().div_ceil(2))
        .map(|j| {
            let hi = mix(2 * j, values[2 * j]) & 15;
            let lo = values.get(2 * j + 1).map_or(0, |v| mix(2 * j + 1, *v) & 15);
            (hi << 4 | lo) as u8
        })
        .collect()
}

impl CatalogEntry for Quant4Spec {
    fn name(&self) -> String {
        let Quant4Spec {
            op,
            quant_type,
            blocksize,
            dtype,
        } = *self;
        match op {
            Quant4Op::Quantize => quantize_name(quant_type, blocksize, dtype),
            Quant4Op::Dequantize => dequantize_name(quant_type, blocksize, dtype),
            Quant4Op::DequantizeNested => dequantize_nested_name(quant_type, blocksize, dtype),
        }
    }

    fn build(&self) -> Result<Kernel> {
        let Quant4Spec {
            op,
            quant_type,
            blocksize,
            dtype,
        } = *self;
        match op {
            Quant4Op::Quantize => {
                quantize_4bit(quant_type, blocksize, dtype).map(TypedKernel::into_kernel)
            }
            Quant4Op::Dequantize => {
                dequantize_4bit(quant_type, blocksize, dtype).map(TypedKernel::into_kernel)
            }
            Quant4Op::DequantizeNested => {
                dequantize_4bit_nested(quant_type, blocksize, dtype).map(TypedKernel::into_kernel)
            }
        }
    }

    fn blocksize(&self) -> usize {
        self.blocksize as usize
    }

    /// A quantize takes `values` (rounded to the dtype). A dequantize takes codes mixed from
    /// the values' bits and each block's NaN-propagating absmax of the values; the nested form
    /// takes 8-bit absmax codes mixed from each block's first value, nested scales `|values[i]|`,
    /// the signed dynamic code and an offset of half the first finite value.
    fn example_args(&self, values: &[f32]) -> Result<Vec<OwnedArg>> {
        let Quant4Spec {
            op,
            quant_type,
            blocksize,
            dtype,
        } = *self;
        let n = example_len(values)?;
        let n_packed = n.div_ceil(2);
        let n_blocks = n.div_ceil(blocksize);
        let mut out = vec![0u8; n as usize * dtype.size_bytes()];
        match op {
            Quant4Op::Quantize => {
                let kernel = quantize_4bit(quant_type, blocksize, dtype)?;
                let x = float_bytes(dtype, values);
                let (mut packed, mut absmax) =
                    (vec![0u8; n_packed as usize], vec![0f32; n_blocks as usize]);
                let mut args = Quantize4bitArgs {
                    n,
                    n_packed,
                    n_blocks,
                    x: FloatIn { dtype, bytes: &x },
                    packed: &mut packed,
                    absmax: &mut absmax,
                };
                Ok(OwnedArg::copy_all(&kernel.args(&mut args)?))
            }
            Quant4Op::Dequantize => {
                let kernel = dequantize_4bit(quant_type, blocksize, dtype)?;
                let packed = example_codes(values);
                let absmax = host_absmax(values, blocksize as usize, true);
                let mut args = Dequantize4bitArgs {
                    n,
                    n_packed,
                    n_blocks,
                    packed: &packed,
                    absmax: &absmax,
                    out: FloatOut {
                        dtype,
                        bytes: &mut out,
                    },
                };
                Ok(OwnedArg::copy_all(&kernel.args(&mut args)?))
            }
            Quant4Op::DequantizeNested => {
                let kernel = dequantize_4bit_nested(quant_type, blocksize, dtype)?;
                let packed = example_codes(values);
                let n_nested = n_blocks.div_ceil(NESTED_BLOCKSIZE);
                let qabsmax: Vec<u8> = (0..n_blocks as usize)
                    .map(|b| mix(b, values[b * blocksize as usize]) as u8)
                    .collect();
                let nested_absmax: Vec<f32> = (0..n_nested as usize)
                    .map(|i| values[i % values.len()].abs())
                    .collect();
                let nested_code = NESTED_MAP.code();
                let mut args = Dequantize4bitNestedArgs {
                    n,
                    n_packed,
                    n_blocks,
                    n_nested,
                    offset: first_finite(values) * 0.5,
                    packed: &packed,
                    qabsmax: &qabsmax,
                    nested_absmax: &nested_absmax,
                    nested_code: &nested_code,
                    out: FloatOut {
                        dtype,
                        bytes: &mut out,
                    },
                };
                Ok(OwnedArg::copy_all(&kernel.args(&mut args)?))
            }
        }
    }
}
