//! The 8-bit blockwise kernels in the catalog: every map x blocksize x dtype as
//! `quantize_blockwise` and `dequantize_blockwise`, with example arguments made through their
//! typed signatures (shared with the double-quantization kernels, which add an offset).

use qforge_ir::dsl::{FloatIn, FloatOut, TypedKernel};
use qforge_ir::{DType, Kernel, OwnedArg, Result};

use super::{
    dequantize_blockwise, dequantize_name, quantize_blockwise, quantize_name, BlockwiseDequantize,
    BlockwiseDequantizeArgs, BlockwiseQuantize, BlockwiseQuantizeArgs,
};
use crate::catalog::{example_len, float_bytes, host_absmax, mix};
use crate::{BlockwiseMap, CatalogEntry, BLOCKSIZES_8BIT, FLOAT_DTYPES};

/// Which 8-bit blockwise kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Blockwise8Op {
    /// [`quantize_blockwise`].
    Quantize,
    /// [`dequantize_blockwise`].
    Dequantize,
}

/// One 8-bit blockwise kernel variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Blockwise8Spec {
    /// Which kernel.
    pub op: Blockwise8Op,
    /// The code table.
    pub map: BlockwiseMap,
    /// Elements per absmax block.
    pub blocksize: u32,
    /// The float dtype (input of a quantize, output of a dequantize).
    pub dtype: DType,
}

impl Blockwise8Spec {
    /// Every map x blocksize x dtype x op.
    pub fn variants() -> Vec<Blockwise8Spec> {
        let mut out = Vec::new();
        for map in BlockwiseMap::ALL {
            for blocksize in BLOCKSIZES_8BIT {
                for dtype in FLOAT_DTYPES {
                    for op in [Blockwise8Op::Quantize, Blockwise8Op::Dequantize] {
                        out.push(Blockwise8Spec {
                            op,
                            map,
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

impl CatalogEntry for Blockwise8Spec {
    fn name(&self) -> String {
        match self.op {
            Blockwise8Op::Quantize => quantize_name(self.map, self.blocksize, self.dtype),
            Blockwise8Op::Dequantize => dequantize_name(self.map, self.blocksize, self.dtype),
        }
    }

    fn build(&self) -> Result<Kernel> {
        match self.op {
            Blockwise8Op::Quantize => quantize_blockwise(self.map, self.blocksize, self.dtype)
                .map(TypedKernel::into_kernel),
            Blockwise8Op::Dequantize => dequantize_blockwise(self.map, self.blocksize, self.dtype)
                .map(TypedKernel::into_kernel),
        }
    }

    fn blocksize(&self) -> usize {
        self.blocksize as usize
    }

    fn example_args(&self, values: &[f32]) -> Result<Vec<OwnedArg>> {
        match self.op {
            Blockwise8Op::Quantize => quantize_example(
                &quantize_blockwise(self.map, self.blocksize, self.dtype)?,
                self.dtype,
                self.blocksize,
                None,
                values,
            ),
            Blockwise8Op::Dequantize => dequantize_example(
                &dequantize_blockwise(self.map, self.blocksize, self.dtype)?,
                self.dtype,
                self.blocksize,
                None,
                values,
            ),
        }
    }
}

/// Example arguments of a blockwise quantize kernel: `values` as the input (rounded to
/// `dtype`), zeroed codes and absmax.
///
/// # Errors
/// An empty or oversized `values`; an `offset` the kernel does not take (or lacks).
pub(crate) fn quantize_example(
    kernel: &TypedKernel<BlockwiseQuantize>,
    dtype: DType,
    blocksize: u32,
    offset: Option<f32>,
    values: &[f32],
) -> Result<Vec<OwnedArg>> {
    let n = example_len(values)?;
    let n_blocks = n.div_ceil(blocksize);
    let x = float_bytes(dtype, values);
    let (mut q, mut absmax) = (vec![0u8; n as usize], vec![0f32; n_blocks as usize]);
    let mut args = BlockwiseQuantizeArgs {
        n,
        n_blocks,
        offset,
        x: FloatIn { dtype, bytes: &x },
        q: &mut q,
        absmax: &mut absmax,
    };
    Ok(OwnedArg::copy_all(&kernel.args(&mut args)?))
}

/// Example arguments of a blockwise dequantize kernel: codes mixed from the values' bits, each
/// block's NaN-ignoring absmax of the values, a zeroed output.
///
/// # Errors
/// As [`quantize_example`].
pub(crate) fn dequantize_example(
    kernel: &TypedKernel<BlockwiseDequantize>,
    dtype: DType,
    blocksize: u32,
    offset: Option<f32>,
    values: &[f32],
) -> Result<Vec<OwnedArg>> {
    let n = example_len(values)?;
    let q: Vec<u8> = values
        .iter()
        .enumerate()
        .map(|(i, v)| mix(i, *v) as u8)
        .collect();
    let absmax = host_absmax(values, blocksize as usize, false);
    let mut out = vec![0u8; n as usize * dtype.size_bytes()];
    let mut args = BlockwiseDequantizeArgs {
        n,
        n_blocks: n.div_ceil(blocksize),
        offset,
        q: &q,
        absmax: &absmax,
        out: FloatOut {
            dtype,
            bytes: &mut out,
        },
    };
    Ok(OwnedArg::copy_all(&kernel.args(&mut args)?))
}
