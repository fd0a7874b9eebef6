//! [`SearchSorted`](qforge_ir::Op::SearchSorted) as the branchless binary search, one table
//! per level.
//!
//! Let `t` be the searched table without its trailing `+inf` entries (they never count), `n`
//! its length and `m` the least integer with `2^m > n`; pad `t` with `+inf` to `2^m` entries.
//! The count `r` starts at 0 and level `k = 0 .. m` adds `s = 2^(m-1-k)` when
//! `t[r + s - 1] < v`. Before level `k`, `r` is a multiple of `2^(m-k)`, so the entry read is
//! `level_k[r >> (m-k)]` with `level_k[i] = t[i * 2^(m-k) + s - 1]`: `2^k` entries. Level 0 is a
//! constant. After the last level `r` is the number of entries below `v` (the classic search
//! for the partition point of a sorted array, whose invariant is that every entry before `r` is
//! below `v` and every entry from `r + 2s - 1` on is not); a NaN `v` is below nothing, so every
//! compare is false and `r = 0`.

use qforge_ir::{CmpOp, KernelBuilder, Op, Scalar, TableId, Value};

/// The tables of one level search in a kernel.
#[derive(Clone, Debug)]
pub(super) struct LevelTables {
    /// `t[2^(m-1) - 1]`, the entry level 0 compares with (`None` when `m = 0`: nothing counts).
    level0: Option<f32>,
    /// Levels `1 .. m` (`2^k` entries each).
    levels: Vec<TableId>,
}

/// The padded table and `m` for `sorted` (see the module docs).
pub(super) fn padded(sorted: &[f32]) -> (Vec<f32>, u32) {
    let counted = super::counted(sorted);
    let m = usize::BITS - counted.len().leading_zeros();
    let mut t = counted.to_vec();
    t.resize(1 << m, f32::INFINITY);
    (t, m)
}

/// Entry `i` of level `k` of the padded table `t` of `2^m` entries.
pub(super) fn level_entry(t: &[f32], m: u32, k: u32, i: usize) -> f32 {
    t[(i << (m - k)) + (1 << (m - 1 - k)) - 1]
}

/// Declares the level tables of `sorted` (the searched table called `name`) as
/// `{name}_level{k}`.
pub(super) fn declare(b: &mut KernelBuilder, name: &str, sorted: &[f32]) -> LevelTables {
    let (t, m) = padded(sorted);
    let levels = (1..m)
        .map(|k| {
            let data: Vec<f32> = (0..1usize << k).map(|i| level_entry(&t, m, k, i)).collect();
            b.table_f32(&super::fresh_name(b, &format!("{name}_level{k}")), &data)
        })
        .collect();
    LevelTables {
        level0: (m > 0).then(|| level_entry(&t, m, 0, 0)),
        levels,
    }
}

/// Emits the search of `v` (`f32`) up to its last op, which it returns. Every lookup index is
/// in range: `r < 2^m`, so `r >> (m - k) < 2^k`.
pub(super) fn emit(b: &mut KernelBuilder, v: Value, t: &LevelTables) -> Op {
    let Some(level0) = t.level0 else {
        return Op::Const(Scalar::U32(0));
    };
    let m = t.levels.len() as u32 + 1;
    let mut r = b.const_u32(0);
    let mut k = 0;
    loop {
        let th = if k == 0 {
            b.const_f32(level0)
        } else {
            let shift = b.const_u32(m - k);
            let i = b.shr(r, shift);
            b.lookup(t.levels[k as usize - 1], i)
        };
        let below = b.cmp(CmpOp::Lt, th, v);
        let step = b.const_u32(1 << (m - 1 - k));
        let next = if k == 0 { step } else { b.add(r, step) };
        let last = Op::Select {
            cond: below,
            if_true: next,
            if_false: r,
        };
        k += 1;
        if k == m {
            return last;
        }
        r = b.op(last);
    }
}
