//! NF4/FP4 blockwise 4-bit quantization (bitsandbytes `quantize_4bit` / `dequantize_4bit`).
//!
//! Layout (as bitsandbytes): the input is flattened to `n` elements; block `b` holds elements
//! `b*blocksize .. min((b+1)*blocksize, n)` (the last block may be partial) and has one `f32`
//! absmax; two codes per byte, the FIRST element in the HIGH nibble; an odd `n` pads the last low
//! nibble with the code of `+0.0` (NF4 7, FP4 0). `n_packed = ceil(n / 2)`,
//! `n_blocks = ceil(n / blocksize)`. One work item per block (blocks own whole bytes because the
//! blocksize is even); the blocksize is baked into the kernel.
//!
//! Semantics (the CUDA kernels' choices):
//! * `absmax = max |x|` over the block, NaN propagating; stored raw.
//! * Every block, the partial tail included, is scaled by `v = x * inv` with
//!   `inv = 1.0 / max(absmax, 1e-38)` in `f32` (a NaN absmax gives NaN `v`).
//! * NF4: `code = #{k : !(v <= m_k)}` over the 15 `f32` midpoints ([`maps::nf4_midpoints`]), so
//!   a tie goes to the lower code and NaN gives 15.
//! * FP4: NaN gives 3; otherwise bit 3 is the sign BIT of `v` and the low bits code the magnitude
//!   index among `[0, 0.0052, 0.1667, 0.25, 0.3333, 0.5, 0.6667, 1]` (codes `[0,1,6,7,4,5,2,3]`),
//!   found with the positive midpoints ([`maps::fp4_midpoints`]); a tie goes to the lower
//!   magnitude for a positive sign and to the larger magnitude for a negative sign.
//! * Dequant: `code[nibble] * absmax` in `f32`, stored round-to-nearest-even in the output dtype.
//!   The nested variant first decodes the absmax:
//!   `absmax_b = nested_code[qabsmax_b] * nested_absmax[b / 256] + offset` (two `f32` roundings).
//!
//! Parameter order (scalars first, then buffers):
//! * `quantize_4bit_{nf4|fp4}_bs{B}_{f32|f16|bf16}`:
//!   `(n: u32, n_packed: u32, n_blocks: u32, x: dtype[n] read, packed: u8[n_packed] write,
//!   absmax: f32[n_blocks] write)`, grid `n_blocks`.
//! * `dequantize_4bit_{qt}_bs{B}_{dtype}`: `(n: u32, n_packed: u32, n_blocks: u32,
//!   packed: u8[n_packed] read, absmax: f32[n_blocks] read, out: dtype[n] write)`, grid `n_blocks`.
//! * `dequantize_4bit_{qt}_nested_bs{B}_{dtype}`: `(n: u32, n_packed: u32, n_blocks: u32,
//!   n_nested: u32, offset: f32, packed: u8[n_packed] read, qabsmax: u8[n_blocks] read,
//!   nested_absmax: f32[n_nested] read, nested_code: f32[256] read, out: dtype[n] write)`,
//!   grid `n_blocks`, `n_nested = ceil(n_blocks / 256)`.

pub mod catalog;
pub(crate) mod host;
#[cfg(test)]
mod reference;

use qforge_macros::kernel;

use crate::funcs::{block_range, code4, coder4, inv_absmax, load_f32_or_zero};
use crate::{check_blocksize_4bit, check_float_dtype, QuantType, NESTED_BLOCKSIZE};
use qforge_ir::dsl::{Buf, Float, In, Out, Scalar, Val};
use qforge_ir::NanMode;
use qforge_ir::Result;
use qforge_ir::{DType, Rounding};

/// Name of the quantize kernel, e.g. `quantize_4bit_nf4_bs64_f32`.
pub fn quantize_name(qt: QuantType, blocksize: u32, dtype: DType) -> String {
    format!("quantize_4bit_{qt}_bs{blocksize}_{dtype}")
}

/// Name of the dequantize kernel, e.g. `dequantize_4bit_fp4_bs128_bf16`.
pub fn dequantize_name(qt: QuantType, blocksize: u32, dtype: DType) -> String {
    format!("dequantize_4bit_{qt}_bs{blocksize}_{dtype}")
}

/// Name of the nested dequantize kernel, e.g. `dequantize_4bit_nf4_nested_bs64_f16`.
pub fn dequantize_nested_name(qt: QuantType, blocksize: u32, dtype: DType) -> String {
    format!("dequantize_4bit_{qt}_nested_bs{blocksize}_{dtype}")
}

fn check(blocksize: u32, dtype: DType) -> Result<()> {
    check_blocksize_4bit(blocksize)?;
    check_float_dtype(dtype)
}

/// The elements `(2j, 2j + 1)` of byte `j`.
#[qforge_macros::func]
fn element_pair(j: Val<u32>) -> (Val<u32>, Val<u32>) {
    let one = val(1u32);
    let e0 = j << one;
    (e0, e0 + one)
}

/// `packed[j] = c0 << 4 | c1`.
#[qforge_macros::func]
fn store_pair(packed: Buf<Out<u8>>, j: Val<u32>, c0: Val<u32>, c1: Val<u32>) {
    let four = val(4u32);
    let high = c0 << four;
    packed[j] = high | c1;
}

/// Builds `quantize_4bit_{qt}_bs{blocksize}_{dtype}` (see the module docs for semantics and
/// parameters).
///
/// # Errors
/// [`crate::Error::Unsupported`] for a blocksize outside 32..=4096 (powers of two) or a non-float
/// dtype.
#[kernel(name = quantize_name(qt, blocksize, dtype), grid = n_blocks)]
pub fn quantize_4bit(
    #[config] qt: QuantType,
    #[config] blocksize: u32,
    #[config] dtype: DType,
    n: u32,
    n_packed: u32,
    n_blocks: u32,
    #[shape(n)]
    #[dtype(dtype)]
    x: In<Float>,
    #[shape(n_packed)] packed: Out<u8>,
    #[shape(n_blocks)] absmax: Out<f32>,
) {
    comptime!(check(blocksize, dtype)?);
    let coder = coder4(qt);
    let block = work_item();
    let nv = n;
    let (start, end) = block_range(block, blocksize, nv);
    let len = end - start;
    let am = reduce_absmax(x, start, len, NanMode::Propagate);
    absmax[block] = am;
    let inv = inv_absmax(am);
    let npv = n_packed;
    let (byte_start, byte_end) = block_range(block, blocksize / 2, npv);
    let zero_code = val(comptime!(u32::from(qt.zero_code())));
    // A full block (`len == blocksize`) has both elements of each of its bytes inside `x`
    // (`2j + 1 < start + blocksize = end <= n`), so its loop needs no guards; it computes
    // exactly what the guarded loop below computes for the tail block.
    let bs = val(blocksize);
    if len == bs {
        for j in byte_start..byte_end {
            let (e0, e1) = element_pair(j);
            let x0 = x[e0];
            let x1 = x[e1];
            let c0 = code4(coder, x0 * inv);
            let c1 = code4(coder, x1 * inv);
            store_pair(packed, j, c0, c1);
        }
    } else {
        for j in byte_start..byte_end {
            let (e0, e1) = element_pair(j);
            let x0 = load_f32_or_zero(x, e0, nv, "x0");
            let x1 = load_f32_or_zero(x, e1, nv, "x1");
            let c0 = code4(coder, x0 * inv);
            let c1 = code4(coder, x1 * inv);
            let has_second = e1 < nv;
            let c1 = select(has_second, c1, zero_code);
            store_pair(packed, j, c0, c1);
        }
    }
}

/// The dequantization loop of one block with scale `scale`: `out[e] = code[nibble] * scale`,
/// rounded to the output dtype.
#[qforge_macros::func]
#[allow(clippy::too_many_arguments)]
fn dequant_block(
    qt: QuantType,
    blocksize: u32,
    block: Val<u32>,
    scale: Val<f32>,
    packed: Buf<In<u8>>,
    out: Buf<Out<Float>>,
    n: Scalar<u32>,
    n_packed: Scalar<u32>,
) {
    let code = table_f32("code", &qt.dequant_table());
    let nv = n;
    let npv = n_packed;
    let (byte_start, byte_end) = block_range(block, blocksize / 2, npv);
    for j in byte_start..byte_end {
        let byte = packed[j];
        let four = val(4u32);
        let fifteen = val(15u32);
        let high = byte >> four;
        let low = byte & fifteen;
        let (e0, e1) = element_pair(j);
        for (e, nibble) in [(e0, high), (e1, low)] {
            if e < nv {
                let c = code[nibble];
                let y = c * scale;
                store_rounded(out, e, y, Rounding::NearestEven);
            }
        }
    }
}

/// Builds `dequantize_4bit_{qt}_bs{blocksize}_{dtype}` (see the module docs).
///
/// # Errors
/// [`crate::Error::Unsupported`] for an unsupported blocksize or dtype.
#[kernel(name = dequantize_name(qt, blocksize, dtype), grid = n_blocks)]
pub fn dequantize_4bit(
    #[config] qt: QuantType,
    #[config] blocksize: u32,
    #[config] dtype: DType,
    n: u32,
    n_packed: u32,
    n_blocks: u32,
    #[shape(n_packed)] packed: In<u8>,
    #[shape(n_blocks)] absmax: In<f32>,
    #[shape(n)]
    #[dtype(dtype)]
    out: Out<Float>,
) {
    comptime!(check(blocksize, dtype)?);
    let block = work_item();
    let scale = absmax[block];
    dequant_block(qt, blocksize, block, scale, packed, out, n, n_packed);
}

/// Builds `dequantize_4bit_{qt}_nested_bs{blocksize}_{dtype}`: dequantization with a
/// double-quantized absmax decoded in-kernel (see the module docs).
///
/// # Errors
/// [`crate::Error::Unsupported`] for an unsupported blocksize or dtype.
#[kernel(name = dequantize_nested_name(qt, blocksize, dtype), grid = n_blocks)]
pub fn dequantize_4bit_nested(
    #[config] qt: QuantType,
    #[config] blocksize: u32,
    #[config] dtype: DType,
    n: u32,
    n_packed: u32,
    n_blocks: u32,
    n_nested: u32,
    offset: f32,
    #[shape(n_packed)] packed: In<u8>,
    #[shape(n_blocks)] qabsmax: In<u8>,
    #[shape(n_nested)] nested_absmax: In<f32>,
    #[shape(256)] nested_code: In<f32>,
    #[shape(n)]
    #[dtype(dtype)]
    out: Out<Float>,
) {
    comptime!(check(blocksize, dtype)?);
    let block = work_item();
    let q = qabsmax[block];
    let c = nested_code[q];
    let shift = val(comptime!(NESTED_BLOCKSIZE.trailing_zeros()));
    let nested_block = block >> shift;
    let na = load_f32_or_zero(nested_absmax, nested_block, n_nested, "nested_scale");
    let prod = c * na;
    let scale = prod + offset;
    dequant_block(qt, blocksize, block, scale, packed, out, n, n_packed);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant4::reference;
    use qforge_ir::dsl::TypedKernel;

    #[test]
    fn library_quant4_kernels_verify_and_equal_the_builder_versions() {
        for qt in QuantType::ALL {
            for bs in crate::BLOCKSIZES_4BIT {
                for dt in crate::FLOAT_DTYPES {
                    let built = [
                        quantize_4bit(qt, bs, dt).map(TypedKernel::into_kernel),
                        dequantize_4bit(qt, bs, dt).map(TypedKernel::into_kernel),
                        dequantize_4bit_nested(qt, bs, dt).map(TypedKernel::into_kernel),
                    ];
                    let old = [
                        reference::quantize_4bit(qt, bs, dt).unwrap(),
                        reference::dequantize_4bit(qt, bs, dt).unwrap(),
                        reference::dequantize_4bit_nested(qt, bs, dt).unwrap(),
                    ];
                    for (k, old) in built.into_iter().zip(old) {
                        let k = k.unwrap();
                        qforge_ir::verify(&k).unwrap_or_else(|e| panic!("{}: {e}", k.name));
                        // The macro-built kernel is the builder-built one: same IR (so the
                        // same snapshots), value for value.
                        assert!(k == old, "{} differs from the builder version", k.name);
                    }
                }
            }
        }
    }

    #[test]
    fn library_quant4_rejects_bad_requests() {
        let e = quantize_4bit(QuantType::Nf4, 48, DType::F32)
            .unwrap_err()
            .to_string();
        assert!(e.contains("48"), "{e}");
        let e = dequantize_4bit(QuantType::Fp4, 64, DType::I32)
            .unwrap_err()
            .to_string();
        assert!(e.contains("i32"), "{e}");
        assert!(dequantize_4bit_nested(QuantType::Fp4, 8192, DType::F32).is_err());
    }

    #[test]
    fn library_quant4_names() {
        assert_eq!(
            quantize_4bit(QuantType::Nf4, 64, DType::F32)
                .unwrap()
                .kernel()
                .name,
            "quantize_4bit_nf4_bs64_f32"
        );
        assert_eq!(
            dequantize_name(QuantType::Fp4, 4096, DType::BF16),
            "dequantize_4bit_fp4_bs4096_bf16"
        );
        assert_eq!(
            dequantize_nested_name(QuantType::Nf4, 32, DType::F16),
            "dequantize_4bit_nf4_nested_bs32_f16"
        );
    }
}
