//! IR-level routines that kernels call: the transcendental functions ([`math`]), Philox
//! counter-based random bits ([`philox`]) and rounding to `f16`/`bf16` ([`round`]), each built
//! from the IR's primitive ops so every backend computes the same bits, plus [`block_range`],
//! the block a work item owns. The op library (crate `qforge-kernels`) builds on them.

use crate::builder::KernelBuilder;
use crate::kernel::Value;
use crate::ops::CmpOp;

pub mod math;
pub mod philox;
pub mod round;

/// `[start, end)` of the block of work item `item`: `start = item * size` and
/// `end = min(start + size, limit)`, or an empty range (`end = start`) when `start >= limit`
/// (all `u32` values).
pub fn block_range(b: &mut KernelBuilder, item: Value, size: u32, limit: Value) -> (Value, Value) {
    let size_v = b.const_u32(size);
    let start = b.mul(item, size_v);
    let stop = b.add(start, size_v);
    let end = b.min(stop, limit);
    let inside = b.cmp(CmpOp::Lt, start, limit);
    let end = b.select(inside, end, start);
    (start, end)
}
