//! The builder versions of the 4-bit kernels, as they were before the library moved to the
//! kernel language: `super::tests` proves the macro-built kernels equal to them (same IR, so
//! the same snapshots).
#![allow(missing_docs)]

use crate::emit::{
    block_range, fp4_code, fp4_thresholds, inv_absmax, load_f32_or_zero, nf4_code, range_len,
};
use crate::{check_blocksize_4bit, check_float_dtype, maps, QuantType, NESTED_BLOCKSIZE};
use qforge_ir::KernelBuilder;
use qforge_ir::Result;
use qforge_ir::{Access, Dim, Kernel, ParamId, TableId, Value};
use qforge_ir::{CmpOp, NanMode};
use qforge_ir::{DType, ScalarType};

use crate::quant4::{dequantize_name, dequantize_nested_name, quantize_name};

fn check(blocksize: u32, dtype: DType) -> Result<()> {
    check_blocksize_4bit(blocksize)?;
    check_float_dtype(dtype)
}

/// The per-element code computation of one quant type, with its tables declared once.
enum Coder {
    Nf4 {
        midpoints: TableId,
    },
    Fp4 {
        thresholds: TableId,
        mag_codes: TableId,
    },
}

impl Coder {
    fn new(b: &mut KernelBuilder, qt: QuantType) -> Coder {
        match qt {
            QuantType::Nf4 => Coder::Nf4 {
                midpoints: b.table_f32("nf4_midpoints", &maps::nf4_midpoints()),
            },
            QuantType::Fp4 => Coder::Fp4 {
                thresholds: b.table_f32("fp4_thresholds", &fp4_thresholds(&maps::fp4_midpoints())),
                mag_codes: b.table_u32("fp4_magnitude_codes", &maps::FP4_MAGNITUDE_CODES),
            },
        }
    }

    fn code(&self, b: &mut KernelBuilder, v: Value) -> Value {
        match *self {
            Coder::Nf4 { midpoints } => nf4_code(b, v, midpoints),
            Coder::Fp4 {
                thresholds,
                mag_codes,
            } => fp4_code(b, v, thresholds, mag_codes),
        }
    }
}

/// The code of `x * inv`.
fn scaled_code(b: &mut KernelBuilder, coder: &Coder, x: Value, inv: Value) -> Value {
    let v = b.mul(x, inv);
    coder.code(b, v)
}

/// `packed[j] = c0 << 4 | c1`.
fn store_pair(b: &mut KernelBuilder, packed: ParamId, j: Value, c0: Value, c1: Value) {
    let four = b.const_u32(4);
    let high = b.shl(c0, four);
    let byte = b.or(high, c1);
    b.store(packed, j, byte);
}

/// Builds `quantize_4bit_{qt}_bs{blocksize}_{dtype}` (see the module docs for semantics and
/// parameters).
///
/// # Errors
/// [`crate::Error::Unsupported`] for a blocksize outside 32..=4096 (powers of two) or a non-float
/// dtype.
pub fn quantize_4bit(qt: QuantType, blocksize: u32, dtype: DType) -> Result<Kernel> {
    check(blocksize, dtype)?;
    let mut b = KernelBuilder::new(&quantize_name(qt, blocksize, dtype));
    let n = b.scalar_param("n", ScalarType::U32);
    let n_packed = b.scalar_param("n_packed", ScalarType::U32);
    let n_blocks = b.scalar_param("n_blocks", ScalarType::U32);
    let x = b.buffer_param("x", dtype, &[Dim::Param(n)], Access::Read);
    let packed = b.buffer_param("packed", DType::U8, &[Dim::Param(n_packed)], Access::Write);
    let absmax = b.buffer_param("absmax", DType::F32, &[Dim::Param(n_blocks)], Access::Write);
    b.set_grid(Dim::Param(n_blocks));
    let coder = Coder::new(&mut b, qt);

    let block = b.work_item();
    let nv = b.param(n);
    let (start, end) = block_range(&mut b, block, blocksize, nv);
    let len = range_len(&mut b, start, end);
    let am = b.reduce_absmax(x, start, len, NanMode::Propagate);
    b.store(absmax, block, am);
    let inv = inv_absmax(&mut b, am);

    let npv = b.param(n_packed);
    let (byte_start, byte_end) = block_range(&mut b, block, blocksize / 2, npv);
    let zero_code = b.const_u32(qt.zero_code() as u32);
    // A full block (`len == blocksize`) has both elements of each of its bytes inside `x`
    // (`2j + 1 < start + blocksize = end <= n`), so its loop needs no guards; it computes
    // exactly what the guarded loop below computes for the tail block.
    let bs = b.const_u32(blocksize);
    let full = b.cmp(CmpOp::Eq, len, bs);
    b.if_else(
        full,
        |b| {
            b.for_range(byte_start, byte_end, 1, |b, j| {
                let one = b.const_u32(1);
                let e0 = b.shl(j, one);
                let e1 = b.add(e0, one);
                let x0 = b.load(x, e0);
                let x1 = b.load(x, e1);
                let c0 = scaled_code(b, &coder, x0, inv);
                let c1 = scaled_code(b, &coder, x1, inv);
                store_pair(b, packed, j, c0, c1);
            });
        },
        |b| {
            b.for_range(byte_start, byte_end, 1, |b, j| {
                let one = b.const_u32(1);
                let e0 = b.shl(j, one);
                let e1 = b.add(e0, one);
                let x0 = load_f32_or_zero(b, x, e0, nv, "x0");
                let x1 = load_f32_or_zero(b, x, e1, nv, "x1");
                let c0 = scaled_code(b, &coder, x0, inv);
                let c1 = scaled_code(b, &coder, x1, inv);
                let has_second = b.cmp(CmpOp::Lt, e1, nv);
                let c1 = b.select(has_second, c1, zero_code);
                store_pair(b, packed, j, c0, c1);
            });
        },
    );
    Ok(b.finish())
}

/// Emits the dequantization loop of one block with scale `scale`.
fn dequant_block(
    b: &mut KernelBuilder,
    qt: QuantType,
    blocksize: u32,
    block: Value,
    scale: Value,
    bufs: (ParamId, ParamId),
    sizes: (ParamId, ParamId),
) {
    let (packed, out) = bufs;
    let code = b.table_f32("code", &qt.dequant_table());
    let nv = b.param(sizes.0);
    let npv = b.param(sizes.1);
    let (byte_start, byte_end) = block_range(b, block, blocksize / 2, npv);
    b.for_range(byte_start, byte_end, 1, |b, j| {
        let byte = b.load(packed, j);
        let four = b.const_u32(4);
        let fifteen = b.const_u32(15);
        let high = b.shr(byte, four);
        let low = b.and(byte, fifteen);
        let one = b.const_u32(1);
        let e0 = b.shl(j, one);
        let e1 = b.add(e0, one);
        for (e, nibble) in [(e0, high), (e1, low)] {
            let inside = b.cmp(CmpOp::Lt, e, nv);
            b.if_then(inside, |b| {
                let c = b.lookup(code, nibble);
                let y = b.mul(c, scale);
                b.store_auto(out, e, y);
            });
        }
    });
}

/// Builds `dequantize_4bit_{qt}_bs{blocksize}_{dtype}` (see the module docs).
///
/// # Errors
/// [`crate::Error::Unsupported`] for an unsupported blocksize or dtype.
pub fn dequantize_4bit(qt: QuantType, blocksize: u32, dtype: DType) -> Result<Kernel> {
    check(blocksize, dtype)?;
    let mut b = KernelBuilder::new(&dequantize_name(qt, blocksize, dtype));
    let n = b.scalar_param("n", ScalarType::U32);
    let n_packed = b.scalar_param("n_packed", ScalarType::U32);
    let n_blocks = b.scalar_param("n_blocks", ScalarType::U32);
    let packed = b.buffer_param("packed", DType::U8, &[Dim::Param(n_packed)], Access::Read);
    let absmax = b.buffer_param("absmax", DType::F32, &[Dim::Param(n_blocks)], Access::Read);
    let out = b.buffer_param("out", dtype, &[Dim::Param(n)], Access::Write);
    b.set_grid(Dim::Param(n_blocks));
    let block = b.work_item();
    let scale = b.load(absmax, block);
    dequant_block(
        &mut b,
        qt,
        blocksize,
        block,
        scale,
        (packed, out),
        (n, n_packed),
    );
    Ok(b.finish())
}

/// Builds `dequantize_4bit_{qt}_nested_bs{blocksize}_{dtype}`: dequantization with a
/// double-quantized absmax decoded in-kernel (see the module docs).
///
/// # Errors
/// [`crate::Error::Unsupported`] for an unsupported blocksize or dtype.
pub fn dequantize_4bit_nested(qt: QuantType, blocksize: u32, dtype: DType) -> Result<Kernel> {
    check(blocksize, dtype)?;
    let mut b = KernelBuilder::new(&dequantize_nested_name(qt, blocksize, dtype));
    let n = b.scalar_param("n", ScalarType::U32);
    let n_packed = b.scalar_param("n_packed", ScalarType::U32);
    let n_blocks = b.scalar_param("n_blocks", ScalarType::U32);
    let n_nested = b.scalar_param("n_nested", ScalarType::U32);
    let offset = b.scalar_param("offset", ScalarType::F32);
    let packed = b.buffer_param("packed", DType::U8, &[Dim::Param(n_packed)], Access::Read);
    let qabsmax = b.buffer_param("qabsmax", DType::U8, &[Dim::Param(n_blocks)], Access::Read);
    let nested_absmax = b.buffer_param(
        "nested_absmax",
        DType::F32,
        &[Dim::Param(n_nested)],
        Access::Read,
    );
    let nested_code = b.buffer_param("nested_code", DType::F32, &[Dim::Const(256)], Access::Read);
    let out = b.buffer_param("out", dtype, &[Dim::Param(n)], Access::Write);
    b.set_grid(Dim::Param(n_blocks));
    let block = b.work_item();
    let q = b.load(qabsmax, block);
    let c = b.load(nested_code, q);
    let shift = b.const_u32(NESTED_BLOCKSIZE.trailing_zeros());
    let nested_block = b.shr(block, shift);
    let nnv = b.param(n_nested);
    let na = load_f32_or_zero(&mut b, nested_absmax, nested_block, nnv, "nested_scale");
    let prod = b.mul(c, na);
    let off = b.param(offset);
    let scale = b.add(prod, off);
    dequant_block(
        &mut b,
        qt,
        blocksize,
        block,
        scale,
        (packed, out),
        (n, n_packed),
    );
    Ok(b.finish())
}
