//! 8-bit blockwise quantization (bitsandbytes `quantize_blockwise` / `dequantize_blockwise`) with
//! a 256-entry code table baked into the kernel.
//!
//! Layout: flattened input of `n` elements, block `b` = elements `b*blocksize ..
//! min((b+1)*blocksize, n)`, one `f32` absmax per block, one `u8` code per element (an index into
//! the sorted code table). One work item per block.
//!
//! Semantics (canonical; bitsandbytes' CPU backend differs, see `docs/compat.md`):
//! * `absmax = max |x|` over the block with NaN elements IGNORED (an all-NaN block gives 0);
//!   stored raw.
//! * `v = x * inv`, `inv = 1.0 / max(absmax, 1e-38)` in `f32`.
//! * The code is the EXACT nearest code value to `v` among the 256 sorted values, an exact
//!   midpoint going to the lower code, NaN to code 0. The exact midpoints are carried as
//!   unevaluated pairs `hi + lo` ([`exact_midpoints`]) and found in O(1) by
//!   [`crate::nearest`] (a bucket table and two threshold compares).
//! * Dequant: `code[q] * absmax` in `f32`, stored round-to-nearest-even in the output dtype.
//!
//! Parameter order:
//! * `quantize_blockwise_{dynamic|dynamic_unsigned|linear}_bs{B}_{f32|f16|bf16}`:
//!   `(n: u32, n_blocks: u32, x: dtype[n] read, q: u8[n] write, absmax: f32[n_blocks] write)`.
//! * `dequantize_blockwise_{map}_bs{B}_{dtype}`:
//!   `(n: u32, n_blocks: u32, q: u8[n] read, absmax: f32[n_blocks] read, out: dtype[n] write)`.
//!
//! Grid `n_blocks = ceil(n / blocksize)` for both.

pub mod catalog;
pub(crate) mod host;
#[cfg(test)]
mod reference;

use qforge_macros::{func, kernel};

use crate::funcs::{block_range, inv_absmax};
use crate::nearest;
use crate::{check_blocksize_8bit, check_float_dtype, BlockwiseMap};
use qforge_ir::dsl::{Buf, Float, In, Out, TypedKernel, Val};
use qforge_ir::NanMode;
use qforge_ir::{DType, Rounding};
use qforge_ir::{Error, Result};

/// The 255 exact midpoints between adjacent entries of a sorted 256-entry code table, each as an
/// unevaluated pair `hi + lo` of `f32` values (`hi = f32(mid)`, `lo = mid - hi` exactly).
#[derive(Clone, Debug, PartialEq)]
pub struct Midpoints8 {
    /// `f32(mid_k)`, rounded to nearest even.
    pub hi: Vec<f32>,
    /// `mid_k - hi_k`, exact.
    pub lo: Vec<f32>,
}

impl Midpoints8 {
    /// 1 where `lo < 0` (then `mid < v` is `hi <= v` for an `f32` `v`), else 0 (`hi < v`).
    pub fn lo_negative_flags(&self) -> Vec<u32> {
        self.lo.iter().map(|l| u32::from(*l < 0.0)).collect()
    }

    /// One `f32` threshold per midpoint with `mid_k < v` exactly when `t_k < v` for every
    /// non-NaN `f32` `v`: `hi_k` when `lo_k >= 0`, else the next `f32` below `hi_k` (then
    /// `mid < v` is `hi <= v`, and no `f32` lies strictly between the two).
    pub fn thresholds(&self) -> Vec<f32> {
        self.hi
            .iter()
            .zip(&self.lo)
            .map(|(h, l)| if *l < 0.0 { h.next_down() } else { *h })
            .collect()
    }
}

/// Computes the exact midpoints `(c[k] + c[k+1]) / 2` of a sorted code table in `f64` and splits
/// each into `hi + lo`.
///
/// # Errors
/// [`Error::Unsupported`] when the table does not have 256 finite, non-decreasing entries, or a
/// midpoint is not exactly representable as `hi + lo` (never the case for bitsandbytes' maps).
pub fn exact_midpoints(code: &[f32]) -> Result<Midpoints8> {
    if code.len() != 256
        || code.iter().any(|c| !c.is_finite())
        || code.windows(2).any(|w| w[0] > w[1])
    {
        return Err(Error::Unsupported(
            "an 8-bit code table needs 256 finite, sorted values".into(),
        ));
    }
    let mut hi = Vec::with_capacity(255);
    let mut lo = Vec::with_capacity(255);
    for (k, w) in code.windows(2).enumerate() {
        let (a, b) = (w[0] as f64, w[1] as f64);
        let s = a + b;
        // TwoSum error term: zero exactly when the f64 sum is exact.
        let bb = s - a;
        let err = (a - (s - bb)) + (b - bb);
        let mid = s * 0.5;
        let h = mid as f32;
        let l = (mid - h as f64) as f32;
        if err != 0.0 || h as f64 + l as f64 != mid {
            return Err(Error::Unsupported(format!(
                "midpoint {k} of the code table is not exactly representable"
            )));
        }
        hi.push(h);
        lo.push(l);
    }
    Ok(Midpoints8 { hi, lo })
}

/// Name of the quantize kernel, e.g. `quantize_blockwise_dynamic_bs4096_f32`.
pub fn quantize_name(map: BlockwiseMap, blocksize: u32, dtype: DType) -> String {
    format!("quantize_blockwise_{map}_bs{blocksize}_{dtype}")
}

/// Name of the dequantize kernel, e.g. `dequantize_blockwise_linear_bs256_bf16`.
pub fn dequantize_name(map: BlockwiseMap, blocksize: u32, dtype: DType) -> String {
    format!("dequantize_blockwise_{map}_bs{blocksize}_{dtype}")
}

/// `x[e]`, minus `offset` when there is one (one `f32` subtraction).
#[func]
fn load_minus(x: Buf<In<Float>>, e: Val<u32>, offset: Option<Val<f32>>) -> Val<f32> {
    let v = x[e];
    match offset {
        Some(o) => v - o,
        None => v,
    }
}

/// The 8-bit blockwise quantize kernel called `name`, also the double-quantization variant:
/// with `with_offset`, the scalar `offset: f32` follows `n_blocks`, every loaded element becomes
/// `x - offset` (one `f32` subtraction) before the absmax and the scaling, and the absmax is a
/// NaN-ignoring `max` loop over those values. Parameters and semantics: the module docs.
///
/// # Errors
/// [`Error::Unsupported`] for a non-float dtype or a map whose midpoints are not exact.
#[kernel(name = name, grid = n_blocks)]
pub fn blockwise_quantize(
    #[config] name: &str,
    #[config] map: BlockwiseMap,
    #[config] blocksize: u32,
    #[config] dtype: DType,
    #[config] with_offset: bool,
    n: u32,
    n_blocks: u32,
    #[when(with_offset)] offset: f32,
    #[shape(n)]
    #[dtype(dtype)]
    x: In<Float>,
    #[shape(n)] q: Out<u8>,
    #[shape(n_blocks)] absmax: Out<f32>,
) {
    let search = table_f32(
        "mid_thresholds",
        &comptime!(nearest::thresholds(&map.code()))?,
    );
    let block = work_item();
    let nv = n;
    let (start, end) = block_range(block, blocksize, nv);
    let off = read_option(offset);
    let am = match off {
        None => {
            let len = end - start;
            reduce_absmax(x, start, len, NanMode::Ignore)
        }
        Some(_) => {
            let acc = var::<f32>("absmax_acc");
            for e in start..end {
                let d = load_minus(x, e, off);
                let a = abs(d);
                // max(acc, a) = select(a > acc, a, acc): a NaN element is skipped.
                acc = max(acc, a);
            }
            acc
        }
    };
    absmax[block] = am;
    let inv = inv_absmax(am);
    for e in start..end {
        let d = load_minus(x, e, off);
        let v = d * inv;
        q[e] = search_sorted(search, v);
    }
}

/// The 8-bit blockwise dequantize kernel called `name` (`out = code[q] * absmax`, plus
/// `offset` in a second `f32` rounding with `with_offset`, whose scalar follows `n_blocks`).
///
/// # Errors
/// [`Error::Unsupported`] for a non-float dtype.
#[kernel(name = name, grid = n_blocks)]
pub fn blockwise_dequantize(
    #[config] name: &str,
    #[config] map: BlockwiseMap,
    #[config] blocksize: u32,
    #[config] dtype: DType,
    #[config] with_offset: bool,
    n: u32,
    n_blocks: u32,
    #[when(with_offset)] offset: f32,
    #[shape(n)] q: In<u8>,
    #[shape(n_blocks)] absmax: In<f32>,
    #[shape(n)]
    #[dtype(dtype)]
    out: Out<Float>,
) {
    let code = table_f32("code", &map.code());
    let block = work_item();
    let nv = n;
    let (start, end) = block_range(block, blocksize, nv);
    let scale = absmax[block];
    let off = read_option(offset);
    for e in start..end {
        let c = q[e];
        let value = code[c];
        let y = value * scale;
        let y = match off {
            Some(o) => y + o,
            None => y,
        };
        store_rounded(out, e, y, Rounding::NearestEven);
    }
}

/// Builds `quantize_blockwise_{map}_bs{blocksize}_{dtype}` (see the module docs).
///
/// # Errors
/// [`Error::Unsupported`] for a blocksize outside 64..=4096 (powers of two) or a non-float dtype.
pub fn quantize_blockwise(
    map: BlockwiseMap,
    blocksize: u32,
    dtype: DType,
) -> Result<TypedKernel<BlockwiseQuantize>> {
    check_blocksize_8bit(blocksize)?;
    check_float_dtype(dtype)?;
    blockwise_quantize(
        &quantize_name(map, blocksize, dtype),
        map,
        blocksize,
        dtype,
        false,
    )
}

/// Builds `dequantize_blockwise_{map}_bs{blocksize}_{dtype}` (see the module docs).
///
/// # Errors
/// [`Error::Unsupported`] for an unsupported blocksize or dtype.
pub fn dequantize_blockwise(
    map: BlockwiseMap,
    blocksize: u32,
    dtype: DType,
) -> Result<TypedKernel<BlockwiseDequantize>> {
    check_blocksize_8bit(blocksize)?;
    check_float_dtype(dtype)?;
    blockwise_dequantize(
        &dequantize_name(map, blocksize, dtype),
        map,
        blocksize,
        dtype,
        false,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blockwise8::reference;
    use crate::{BLOCKSIZES_8BIT, FLOAT_DTYPES};

    /// The macro-built kernels are the builder-built ones (same IR, so the same snapshots), for
    /// every map, blocksize and dtype, with and without the double-quantization offset.
    #[test]
    fn blockwise8_kernels_equal_the_builder_versions() {
        for map in BlockwiseMap::ALL {
            for bs in BLOCKSIZES_8BIT {
                for dtype in FLOAT_DTYPES {
                    for with_offset in [false, true] {
                        let q = blockwise_quantize("q", map, bs, dtype, with_offset).unwrap();
                        let old = reference::build_quantize("q", map, bs, dtype, with_offset);
                        assert!(q.kernel() == &old.unwrap(), "quantize {map} {bs} {dtype}");
                        let d = blockwise_dequantize("d", map, bs, dtype, with_offset).unwrap();
                        let old = reference::build_dequantize("d", map, bs, dtype, with_offset);
                        assert!(d.kernel() == &old.unwrap(), "dequantize {map} {bs} {dtype}");
                    }
                }
            }
        }
    }
}
