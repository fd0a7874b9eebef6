//! Small IR fragments shared by the library kernels, built with the public builder: block ranges,
//! guarded loads, the absmax reciprocal and the 4-bit code searches (the 8-bit one is in
//! [`crate::nearest`]). Every index a fragment loads or stores is bounded by the
//! buffer's own size parameter, so a kernel stays in bounds even when its size scalars are
//! inconsistent with each other.

use qforge_ir::CmpOp;
use qforge_ir::KernelBuilder;
use qforge_ir::ScalarType;
use qforge_ir::{ParamId, TableId, Value};

/// The clamp bitsandbytes applies to absmax before taking its reciprocal.
pub(crate) const ABSMAX_FLOOR: f32 = 1e-38;

pub(crate) use qforge_ir::routines::block_range;

/// `end - start` for a range from [`block_range`].
#[cfg(test)]
pub(crate) fn range_len(b: &mut KernelBuilder, start: Value, end: Value) -> Value {
    b.binary(qforge_ir::BinaryOp::Sub, end, start)
}

/// `buf[index]` when `index < limit`, else `+0.0` (no load happens out of bounds). Both
/// branches assign the variable: inside a loop an index past `limit` gives `+0.0`, not an
/// earlier iteration's value.
pub(crate) fn load_f32_or_zero(
    b: &mut KernelBuilder,
    buf: ParamId,
    index: Value,
    limit: Value,
    name: &str,
) -> Value {
    let var = b.var(name, ScalarType::F32);
    let inside = b.cmp(CmpOp::Lt, index, limit);
    b.if_else(
        inside,
        |b| {
            let x = b.load(buf, index);
            b.assign(var, x);
        },
        |b| {
            let zero = b.const_f32(0.0);
            b.assign(var, zero);
        },
    );
    b.read_var(var)
}

/// `1.0 / max(absmax, 1e-38)` in `f32` (a NaN absmax propagates through `max`).
pub(crate) fn inv_absmax(b: &mut KernelBuilder, absmax: Value) -> Value {
    let floor = b.const_f32(ABSMAX_FLOOR);
    let clamped = b.max(absmax, floor);
    let one = b.const_f32(1.0);
    b.div(one, clamped)
}

/// `pos = 0; for step in steps { if pred(lookup(table, pos + step - 1)) { pos += step } }`:
/// a branchless binary search counting the table prefix whose entries satisfy `pred`.
pub(crate) fn count_prefix(
    b: &mut KernelBuilder,
    steps: &[u32],
    mut pred: impl FnMut(&mut KernelBuilder, Value) -> Value,
) -> Value {
    let mut pos = b.const_u32(0);
    for &step in steps {
        let off = b.const_u32(step - 1);
        let idx = b.add(pos, off);
        let take = pred(b, idx);
        let step_v = b.const_u32(step);
        let next = b.add(pos, step_v);
        pos = b.select(take, next, pos);
    }
    pos
}

/// NF4 code of a scaled value `v`: the number of the 15 midpoints `m_k` with `!(v <= m_k)`, so a
/// tie goes to the lower code and NaN gives 15.
pub(crate) fn nf4_code(b: &mut KernelBuilder, v: Value, midpoints: TableId) -> Value {
    count_prefix(b, &[8, 4, 2, 1], |b, idx| {
        let m = b.lookup(midpoints, idx);
        let le = b.cmp(CmpOp::Le, v, m);
        b.not(le)
    })
}

/// The 16-entry threshold table of [`fp4_code`]: the 7 positive midpoints `m_k`, then the
/// largest `f32` below each (`t[8 + k] = prev(m_k)`); entries 7 and 15 are never read. For a
/// non-NaN `a`, `a > prev(m)` is `a >= m` (no `f32` lies strictly between them).
pub(crate) fn fp4_thresholds(midpoints: &[f32; 7]) -> [f32; 16] {
    let mut t = [f32::INFINITY; 16];
    for (k, m) in midpoints.iter().enumerate() {
        t[k] = *m;
        // Positive, finite and non-zero: the bits below are the next smaller float.
        t[8 + k] = f32::from_bits(m.to_bits() - 1);
    }
    t
}

/// FP4 code of a scaled value `v`: NaN gives 3; otherwise the sign bit of `v` (bit 3) and the
/// magnitude index among the 8 sorted magnitudes, found with the 7 positive midpoints, a tie going
/// to the lower magnitude for a positive sign and to the larger one for a negative sign.
///
/// `thresholds` is [`fp4_thresholds`]: the search compares `|v| > t[idx + 8 * sign]`, i.e.
/// `|v| > m` for a positive sign and `|v| >= m` for a negative one, with integer index
/// arithmetic only (no select between two comparison results).
pub(crate) fn fp4_code(
    b: &mut KernelBuilder,
    v: Value,
    thresholds: TableId,
    mag_codes: TableId,
) -> Value {
    let is_nan = b.cmp(CmpOp::Ne, v, v);
    let raw = b.bitcast(v, ScalarType::U32);
    let c31 = b.const_u32(31);
    let sign = b.shr(raw, c31);
    // 8 * sign, as `(raw >> 28) & 8` (bounded by 8 for the table index bound).
    let c28 = b.const_u32(28);
    let c8 = b.const_u32(8);
    let high = b.shr(raw, c28);
    let half = b.and(high, c8);
    let a = b.abs(v);
    let mag = count_prefix(b, &[4, 2, 1], |b, idx| {
        let at = b.add(idx, half);
        let t = b.lookup(thresholds, at);
        b.cmp(CmpOp::Gt, a, t)
    });
    let mag_code = b.lookup(mag_codes, mag);
    let c3 = b.const_u32(3);
    let sign_bit = b.shl(sign, c3);
    let code = b.or(mag_code, sign_bit);
    b.select(is_nan, c3, code)
}
