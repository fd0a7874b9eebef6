//! The builder versions of the 8-bit blockwise kernels, as they were before the library moved
//! to the kernel language (tests only: `blockwise8`'s tests prove the two equal).
#![allow(missing_docs)]

use crate::emit::{block_range, inv_absmax, range_len};
use crate::nearest;
use crate::BlockwiseMap;
use qforge_ir::KernelBuilder;
use qforge_ir::NanMode;
use qforge_ir::Result;
use qforge_ir::{Access, Dim, Kernel, Value};
use qforge_ir::{DType, ScalarType};

/// The quantize body shared with the double-quantization variant: with `offset`, every loaded
/// element becomes `x - offset` (one `f32` subtraction) before the absmax and the scaling, and
/// the absmax is a NaN-ignoring `max` loop over those values.
pub fn build_quantize(
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
pub fn build_dequantize(
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
