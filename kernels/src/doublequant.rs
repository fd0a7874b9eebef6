//! Double quantization of the 4-bit absmax (bitsandbytes `compress_statistics=True`).
//!
//! bitsandbytes computes `offset = absmax.mean()` and quantizes `absmax - offset` with 8-bit
//! blockwise quantization (signed dynamic map, blocksize 256); dequantization decodes
//! `code[q] * nested_absmax + offset` (two `f32` roundings). Here:
//!
//! * `absmax_mean_f32`: `(n: u32, absmax: f32[n] read, out: f32[1] write)`, grid 1:
//!   `out[0] = sum(absmax) / f32(n)`, the sum in the order of torch's CPU `sum` (the kernel
//!   bitsandbytes' `absmax.mean()` runs on x86; see [`absmax_mean`]) and a single `f32`
//!   division by `n` (converted with round-to-nearest-even), as torch's CPU `mean` does.
//! * `quantize_blockwise_dynamic_offset_bs256_f32`: `(n: u32, n_blocks: u32, offset: f32,
//!   x: f32[n] read, q: u8[n] write, absmax: f32[n_blocks] write)`: exactly
//!   `quantize_blockwise_dynamic_bs256_f32` of `x - offset` (one `f32` subtraction per element),
//!   the absmax a NaN-ignoring max over those differences.
//! * `dequantize_blockwise_dynamic_offset_bs256_f32`: `(n: u32, n_blocks: u32, offset: f32,
//!   q: u8[n] read, absmax: f32[n_blocks] read, out: f32[n] write)`:
//!   `out = code[q] * absmax + offset` (the decoded 4-bit absmax).
//!
//! The 4-bit dequantization with the nested absmax decoded in-kernel is
//! [`crate::quant4::dequantize_4bit_nested`].

use crate::blockwise8::catalog::{dequantize_example, quantize_example};
use crate::blockwise8::{
    blockwise_dequantize, blockwise_quantize, BlockwiseDequantize, BlockwiseQuantize,
};
use crate::catalog::{example_len, first_finite};
use crate::{BlockwiseMap, CatalogEntry, NESTED_BLOCKSIZE};
use qforge_ir::dsl::{Buf, In, Out, TypedKernel, Val};
use qforge_ir::CmpOp;
use qforge_ir::KernelBuilder;
use qforge_ir::Result;
use qforge_ir::{DType, ScalarType};
use qforge_ir::{Kernel, OwnedArg, ParamId, Value, VarId};
use qforge_macros::kernel;

/// The width of torch's `Vectorized<float>` in the CPU `sum` that bitsandbytes' offset
/// (`absmax.mean()`) runs on x86: 8 lanes. torch registers its sum kernel only for AVX2 (its
/// `REGISTER_DISPATCH` gives AVX-512 a null kernel, and the dispatcher then falls back to the
/// AVX2 one), so AVX2 and AVX-512 machines both sum in 8 lanes; the default (no SIMD) build is 8
/// lanes as well (`docs/compat.md`, "Double-quantization offset").
pub const TORCH_SUM_LANES: u32 = 8;

/// The map of the nested level (bitsandbytes' default signed dynamic map).
pub const NESTED_MAP: BlockwiseMap = BlockwiseMap::Dynamic;

/// Name of the absmax-mean kernel.
pub const MEAN_NAME: &str = "absmax_mean_f32";
/// Name of the nested quantize kernel.
pub const QUANTIZE_NESTED_NAME: &str = "quantize_blockwise_dynamic_offset_bs256_f32";
/// Name of the nested absmax decode kernel.
pub const DEQUANTIZE_NESTED_NAME: &str = "dequantize_blockwise_dynamic_offset_bs256_f32";

/// Builds `absmax_mean_f32`: `out[0] = torch_sum(absmax) / f32(n)`, where `torch_sum` is
/// [`torch_cpu_sum`] with [`TORCH_SUM_LANES`] lanes, the order of torch's CPU `mean` (a
/// single-threaded `cascade_sum`, then `div_` by the count), so the offset is bitsandbytes'
/// (`docs/compat.md`, "Double-quantization offset").
///
/// # Errors
/// Never for this fixed kernel (the `Result` is the kernel language's builder convention).
#[kernel(name = MEAN_NAME, signature = AbsmaxMean)]
pub fn absmax_mean(n: u32, #[shape(n)] absmax: In<f32>, #[shape(1)] out: Out<f32>) {
    let count = n;
    let sum = torch_sum(absmax, count, TORCH_SUM_LANES);
    let mean = sum / count.to_f32();
    out[0u32] = mean;
}

/// [`torch_cpu_sum`] as a kernel-language helper (the `#[qforge::func]` calling convention).
fn torch_sum(
    b: &mut KernelBuilder,
    buf: Buf<In<f32>>,
    n: Val<u32>,
    lanes: u32,
) -> Result<Val<f32>> {
    Ok(Val::from_value(torch_cpu_sum(
        b,
        buf.id(),
        n.value(),
        lanes,
    )))
}

/// Emits the `f32` sum of `buf[0..n]` in the order of torch's CPU `sum` of a contiguous 1-D
/// `float32` tensor, run on one thread (`aten/src/ATen/native/cpu/SumKernel.cpp`: `cascade_sum`
/// -> `vectorized_inner_sum` -> `row_sum` -> `multi_row_sum`) with `Vectorized<float>` of
/// `lanes` lanes, and returns it. Every addition is one `f32` addition; every accumulator starts
/// at `+0.0`. With `W = lanes` if `n >= lanes`, else `W = 1` (torch's scalar path, which adds in
/// the same order as a 1-lane vector), `nv = n / W` vectors of `W` elements, `G = nv / 4` groups
/// of 4 vectors and row `k` of group `g` the vector `4g + k`:
///
/// 1. For each lane `l` and row `k`, the elements `x[(4g + k) W + l]`, `g` in `0..G`, are summed
///    by `multi_row_sum`'s cascade: `L = max(4, ceil_log2(G) / 4)` (`ceil_log2(G) = 1` for
///    `G <= 2`), chunks of `2^L` groups. Level 0 sums a chunk from `+0.0`; after each whole
///    chunk (`i` groups done) `a1 += a0, a0 = 0`; if `i` is also a multiple of `2^(2L)`,
///    `a2 += a1, a1 = 0`; if of `2^(3L)`, `a3 += a2, a2 = 0`. The groups after the last whole
///    chunk go into `a0`, and the row's sum is `((a0 + a1) + a2) + a3`.
/// 2. Lane `l`'s partial (`row_sum`): row 0's sum, plus the `nv % 4` leftover vectors' lane `l`
///    in order, plus rows 1, 2, 3 in order.
/// 3. The total (`vectorized_inner_sum`): `+0.0`, plus the `n - nv W` tail elements in order,
///    plus the `W` lane partials in lane order.
///
/// torch's output is `0 + total`, the same bits (`total` is never `-0.0`). Built from loops,
/// `if`s and variables only, so every backend runs it as written. `lanes` 0 is taken as 1.
pub fn torch_cpu_sum(b: &mut KernelBuilder, buf: ParamId, n: Value, lanes: u32) -> Value {
    let lanes = lanes.max(1);
    let total = b.var("torch_sum_total", ScalarType::F32);
    let part = b.var("torch_sum_lane", ScalarType::F32);
    let levels = [
        b.var("torch_sum_level0", ScalarType::F32),
        b.var("torch_sum_level1", ScalarType::F32),
        b.var("torch_sum_level2", ScalarType::F32),
        b.var("torch_sum_level3", ScalarType::F32),
    ];
    let zero = b.const_u32(0);
    let one = b.const_u32(1);
    let two = b.const_u32(2);
    let three = b.const_u32(3);
    let four = b.const_u32(4);
    let fzero = b.const_f32(0.0);
    let lanes_c = b.const_u32(lanes);
    let vectorized = b.cmp(CmpOp::Ge, n, lanes_c);
    let w = b.select(vectorized, lanes_c, one);
    let nv = b.div(n, w);
    let groups = b.shr(nv, two);
    let left = b.and(nv, three);
    // L = max(4, ceil_log2(G) / 4): ceil_log2(G) >= 4m exactly when G > 2^(4m - 1); G < 2^30.
    let mut level_power = four;
    for bit in [19u32, 23, 27] {
        let limit = b.const_u32(1 << bit);
        let above = b.cmp(CmpOp::Gt, groups, limit);
        let inc = b.select(above, one, zero);
        level_power = b.add(level_power, inc);
    }
    let step = b.shl(one, level_power);
    let level_mask = b.sub(step, one);
    let mask1 = b.shl(level_mask, level_power);
    let twice = b.add(level_power, level_power);
    let mask2 = b.shl(level_mask, twice);
    let chunks = b.shr(groups, level_power);
    let chunked = b.shl(chunks, level_power);
    let vector_end = b.mul(nv, w);
    let rows = b.mul(four, w);

    // The scalar tail first (`final_acc` starts at 0 and takes the tail, then the lanes).
    b.for_range(vector_end, n, 1, |b, t| {
        let x = b.load(buf, t);
        let acc = b.read_var(total);
        let s = b.add(acc, x);
        b.assign(total, s);
    });
    b.for_range(zero, w, 1, |b, l| {
        b.for_range(zero, four, 1, |b, k| {
            for var in levels {
                b.assign(var, fzero);
            }
            // Element of row `k`, lane `l` in group `g`.
            let lane_base = b.mul(k, w);
            let lane_base = b.add(lane_base, l);
            let add_group = |b: &mut KernelBuilder, g: Value, var: VarId| {
                let at = b.mul(g, rows);
                let at = b.add(at, lane_base);
                let x = b.load(buf, at);
                let acc = b.read_var(var);
                let s = b.add(acc, x);
                b.assign(var, s);
            };
            b.for_range(zero, chunks, 1, |b, c| {
                let first = b.shl(c, level_power);
                let end = b.add(first, step);
                b.for_range(first, end, 1, |b, g| add_group(b, g, levels[0]));
                // The cascade after `end` groups: level 1 always, deeper while `end` is a
                // multiple of the next level's span.
                let a0 = b.read_var(levels[0]);
                let a1 = b.read_var(levels[1]);
                let s1 = b.add(a1, a0);
                b.assign(levels[1], s1);
                b.assign(levels[0], fzero);
                let m1 = b.and(end, mask1);
                let at_level2 = b.cmp(CmpOp::Eq, m1, zero);
                b.if_then(at_level2, |b| {
                    let a1 = b.read_var(levels[1]);
                    let a2 = b.read_var(levels[2]);
                    let s2 = b.add(a2, a1);
                    b.assign(levels[2], s2);
                    b.assign(levels[1], fzero);
                    let m2 = b.and(end, mask2);
                    let at_level3 = b.cmp(CmpOp::Eq, m2, zero);
                    b.if_then(at_level3, |b| {
                        let a2 = b.read_var(levels[2]);
                        let a3 = b.read_var(levels[3]);
                        let s3 = b.add(a3, a2);
                        b.assign(levels[3], s3);
                        b.assign(levels[2], fzero);
                    });
                });
            });
            b.for_range(chunked, groups, 1, |b, g| add_group(b, g, levels[0]));
            let mut row = b.read_var(levels[0]);
            for var in &levels[1..] {
                let a = b.read_var(*var);
                row = b.add(row, a);
            }
            // Row 0 starts the lane's partial and takes the leftover vectors; rows 1..3 follow.
            let first_row = b.cmp(CmpOp::Eq, k, zero);
            b.if_else(
                first_row,
                |b| {
                    b.assign(part, row);
                    let leftover_base = b.mul(groups, rows);
                    let leftover_base = b.add(leftover_base, l);
                    b.for_range(zero, left, 1, |b, m| {
                        let at = b.mul(m, w);
                        let at = b.add(at, leftover_base);
                        let x = b.load(buf, at);
                        let acc = b.read_var(part);
                        let s = b.add(acc, x);
                        b.assign(part, s);
                    });
                },
                |b| {
                    let acc = b.read_var(part);
                    let s = b.add(acc, row);
                    b.assign(part, s);
                },
            );
        });
        let acc = b.read_var(total);
        let p = b.read_var(part);
        let s = b.add(acc, p);
        b.assign(total, s);
    });
    b.read_var(total)
}

/// Builds `quantize_blockwise_dynamic_offset_bs256_f32` (see the module docs).
///
/// # Errors
/// Never for these fixed parameters; the `Result` comes from the shared builder.
pub fn quantize_nested() -> Result<TypedKernel<BlockwiseQuantize>> {
    blockwise_quantize(
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
pub fn dequantize_nested() -> Result<TypedKernel<BlockwiseDequantize>> {
    blockwise_dequantize(
        DEQUANTIZE_NESTED_NAME,
        NESTED_MAP,
        NESTED_BLOCKSIZE,
        DType::F32,
        true,
    )
}

/// The double-quantization kernels in the catalog.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DoubleQuantSpec {
    /// [`absmax_mean`].
    AbsmaxMean,
    /// [`quantize_nested`].
    QuantizeNested,
    /// [`dequantize_nested`].
    DequantizeNested,
}

impl DoubleQuantSpec {
    /// The three kernels.
    pub const ALL: [DoubleQuantSpec; 3] = [
        DoubleQuantSpec::AbsmaxMean,
        DoubleQuantSpec::QuantizeNested,
        DoubleQuantSpec::DequantizeNested,
    ];
}

impl CatalogEntry for DoubleQuantSpec {
    fn name(&self) -> String {
        match self {
            DoubleQuantSpec::AbsmaxMean => MEAN_NAME,
            DoubleQuantSpec::QuantizeNested => QUANTIZE_NESTED_NAME,
            DoubleQuantSpec::DequantizeNested => DEQUANTIZE_NESTED_NAME,
        }
        .to_string()
    }

    fn build(&self) -> Result<Kernel> {
        match self {
            DoubleQuantSpec::AbsmaxMean => absmax_mean().map(TypedKernel::into_kernel),
            DoubleQuantSpec::QuantizeNested => quantize_nested().map(TypedKernel::into_kernel),
            DoubleQuantSpec::DequantizeNested => dequantize_nested().map(TypedKernel::into_kernel),
        }
    }

    /// The nested blocksize 256; `absmax_mean_f32` reduces its whole input in one work item,
    /// and 256 is a useful test length for it too.
    fn blocksize(&self) -> usize {
        NESTED_BLOCKSIZE as usize
    }

    /// The mean takes `values`; the nested kernels take the 8-bit blockwise example arguments
    /// (blocksize 256) with an offset of half the first finite value.
    fn example_args(&self, values: &[f32]) -> Result<Vec<OwnedArg>> {
        let offset = Some(first_finite(values) * 0.5);
        match self {
            DoubleQuantSpec::AbsmaxMean => {
                let n = example_len(values)?;
                let mut out = [0f32];
                let mut args = AbsmaxMeanArgs {
                    n,
                    absmax: values,
                    out: &mut out,
                };
                Ok(OwnedArg::copy_all(&absmax_mean()?.args(&mut args)?))
            }
            DoubleQuantSpec::QuantizeNested => quantize_example(
                &quantize_nested()?,
                DType::F32,
                NESTED_BLOCKSIZE,
                offset,
                values,
            ),
            DoubleQuantSpec::DequantizeNested => dequantize_example(
                &dequantize_nested()?,
                DType::F32,
                NESTED_BLOCKSIZE,
                offset,
                values,
            ),
        }
    }
}
