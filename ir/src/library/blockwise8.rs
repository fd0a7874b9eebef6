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
//!   [`crate::library::nearest`] (a bucket table and two threshold compares).
//! * Dequant: `code[q] * absmax` in `f32`, stored round-to-nearest-even in the output dtype.
//!
//! Parameter order:
//! * `quantize_blockwise_{dynamic|dynamic_unsigned|linear}_bs{B}_{f32|f16|bf16}`:
//!   `(n: u32, n_blocks: u32, x: dtype[n] read, q: u8[n] write, absmax: f32[n_blocks] write)`.
//! * `dequantize_blockwise_{map}_bs{B}_{dtype}`:
//!   `(n: u32, n_blocks: u32, q: u8[n] read, absmax: f32[n_blocks] read, out: dtype[n] write)`.
//!
//! Grid `n_blocks = ceil(n / blocksize)` for both.

use crate::builder::KernelBuilder;
use crate::error::{Error, Result};
use crate::kernel::{Access, Dim, Kernel, Value};
use crate::library::emit::{block_range, inv_absmax, range_len};
use crate::library::nearest;
use crate::library::{check_blocksize_8bit, check_float_dtype, BlockwiseMap};
use crate::ops::NanMode;
use crate::types::{DType, ScalarType};

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

/// The quantize body shared with the double-quantization variant: with `offset`, every loaded
/// element becomes `x - offset` (one `f32` subtraction) before the absmax and the scaling, and
/// the absmax is a NaN-ignoring `max` loop over those values.
pub(crate) fn build_quantize(
    name: &str,
    map: BlockwiseMap,
    blocksize: u32,
    dtype: DType,
    with_offset: bool,
) -> Result<Kernel> {
    let mut b = KernelBuilder::new(name);
    let n = b.scalar_param("n", ScalarType::U32);
    let n_blocks = b.scalar_param("n_blocks", ScalarType::U32);
    let offset = with_offset.then(|| b.scalar_param("offset", ScalarType::F32));
    let x = b.buffer_param("x", dtype, &[Dim::Param(n)], Access::Read);
    let q = b.buffer_param("q", DType::U8, &[Dim::Param(n)], Access::Write);
    let absmax = b.buffer_param("absmax", DType::F32, &[Dim::Param(n_blocks)], Access::Write);
    b.set_grid(Dim::Param(n_blocks));
    let search = nearest::declare(&mut b, &map.code(), "")?;
    let block = b.work_item();
    let nv = b.param(n);
    let (start, end) = block_range(&mut b, block, blocksize, nv);
    let off = offset.map(|o| b.param(o));
    let load = |b: &mut KernelBuilder, e: Value| -> Value {
        let v = b.load(x, e);
        match off {
            Some(o) => b.sub(v, o),
            None => v,
        }
    };
    let am = match off {
        None => {
            let len = range_len(&mut b, start, end);
            b.reduce_absmax(x, start, len, NanMode::Ignore)
        }
        Some(_) => {
            let acc = b.var("absmax_acc", ScalarType::F32);
            b.for_range(start, end, 1, |b, e| {
                let d = load(b, e);
                let a = b.abs(d);
                let cur = b.read_var(acc);
                // max(cur, a) = select(a > cur, a, cur): a NaN element is skipped.
                let m = b.max(cur, a);
                b.assign(acc, m);
            });
            b.read_var(acc)
        }
    };
    b.store(absmax, block, am);
    let inv = inv_absmax(&mut b, am);
    b.for_range(start, end, 1, |b, e| {
        let d = load(b, e);
        let v = b.mul(d, inv);
        let c = nearest::emit_code(b, v, &search);
        b.store(q, e, c);
    });
    Ok(b.finish())
}

/// The dequantize body shared with the double-quantization variant (`out = code[q] * absmax`,
/// plus `offset` in a second `f32` rounding when given).
pub(crate) fn build_dequantize(
    name: &str,
    map: BlockwiseMap,
    blocksize: u32,
    dtype: DType,
    with_offset: bool,
) -> Result<Kernel> {
    let mut b = KernelBuilder::new(name);
    let n = b.scalar_param("n", ScalarType::U32);
    let n_blocks = b.scalar_param("n_blocks", ScalarType::U32);
    let offset = with_offset.then(|| b.scalar_param("offset", ScalarType::F32));
    let q = b.buffer_param("q", DType::U8, &[Dim::Param(n)], Access::Read);
    let absmax = b.buffer_param("absmax", DType::F32, &[Dim::Param(n_blocks)], Access::Read);
    let out = b.buffer_param("out", dtype, &[Dim::Param(n)], Access::Write);
    b.set_grid(Dim::Param(n_blocks));
    let code = b.table_f32("code", &map.code());
    let block = b.work_item();
    let nv = b.param(n);
    let (start, end) = block_range(&mut b, block, blocksize, nv);
    let scale = b.load(absmax, block);
    let off = offset.map(|o| b.param(o));
    b.for_range(start, end, 1, |b, e| {
        let c = b.load(q, e);
        let value = b.lookup(code, c);
        let y = b.mul(value, scale);
        let y = match off {
            Some(o) => b.add(y, o),
            None => y,
        };
        b.store_auto(out, e, y);
    });
    Ok(b.finish())
}

/// Builds `quantize_blockwise_{map}_bs{blocksize}_{dtype}` (see the module docs).
///
/// # Errors
/// [`Error::Unsupported`] for a blocksize outside 64..=4096 (powers of two) or a non-float dtype.
pub fn quantize_blockwise(map: BlockwiseMap, blocksize: u32, dtype: DType) -> Result<Kernel> {
    check_blocksize_8bit(blocksize)?;
    check_float_dtype(dtype)?;
    build_quantize(
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
pub fn dequantize_blockwise(map: BlockwiseMap, blocksize: u32, dtype: DType) -> Result<Kernel> {
    check_blocksize_8bit(blocksize)?;
    check_float_dtype(dtype)?;
    build_dequantize(
        &dequantize_name(map, blocksize, dtype),
        map,
        blocksize,
        dtype,
        false,
    )
}
