//! [`SearchSorted`](qforge_ir::Op::SearchSorted) with one table read: a bucket table fine
//! enough that no bucket holds more than one threshold, whose entry packs the bucket's first
//! count with the low bits of that threshold, so that one add and one shift finish the search.
//!
//! Let `t` be the searched table without its trailing `+inf` entries. The bucket of an `f32`
//! `v` with bits `x` is that of [`super::buckets`]: `mag = x & 0x7fff_ffff` (`x` itself when
//! every entry is positive), `j = min(max(mag >> shift, first) - first, per_sign - 1)`, plus
//! `per_sign` for a negative `v` of a signed table. Within one sign, the non-clamped buckets
//! `0 < j < per_sign - 1` hold magnitudes that share their bits above `shift`, so for two
//! values `v`, `T` of one such bucket and one sign, `T < v` is a compare of their low bits
//! `mag & (2^shift - 1)`: `low(T) < low(v)` for positive values, `low(T) > low(v)` for
//! negative ones (larger magnitude, smaller value). Flipping the low bits of negative values
//! (`key = (2^shift - 1) - low`) makes both `L < key`, with `L` the threshold's key.
//!
//! [`Packed::new`] picks the coarsest `shift` under which every bucket's value interval holds
//! at most one threshold, and the edge buckets (which also take every smaller or larger
//! magnitude, infinities and NaN included) none, proven for every bucket. A bucket whose first
//! count (the count at its lowest value) is `cand` stores
//! `entry = cand << shift | (2^shift - 1 - L)`, with `L = 2^shift - 1` for a bucket without a
//! threshold. Then `(entry + key) >> shift = cand + (key > L)`: the low part carries into the
//! candidate exactly when `key > L`, and never further (`key, 2^shift - 1 - L < 2^shift`). So
//! for every non-NaN `v` the count is `(packed[bucket] + key) >> shift`. NaN is selected to 0
//! at the end; for a table of positive entries every `v <= 0` is too (negative values land in
//! the last bucket, as in [`super::buckets`]).
//!
//! One read replaces [`super::buckets`]' three, at the price of a larger table: for the
//! midpoints of bitsandbytes' dynamic maps 2802 (signed) and 2900 (unsigned) words (11 KiB). It suits
//! backends that read tables from memory one lane at a time and keep them in the data cache
//! (CPUs without vector permutes of whole tables); GPU backends keep the smaller bucket tables.

use qforge_ir::{CmpOp, KernelBuilder, Op, ScalarType, TableId, Value};

use super::buckets::count_below;

/// Largest number of buckets (both signs): 32 KiB of table.
const MAX_BUCKETS: u32 = 1 << 13;

/// Most counted (non-`+inf`) entries: a candidate is shifted into the top bits of a word.
const MAX_ENTRIES: usize = 255;

/// Bits of `+inf`: the largest non-NaN magnitude.
const INF_BITS: u32 = 0x7f80_0000;

/// The one-read search of one sorted table (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Packed {
    /// The packed entry of each bucket: `per_sign` buckets of positive values, then, when
    /// `signed`, `per_sign` of negative ones.
    pub(super) entries: Vec<u32>,
    /// Whether some entry is `<= 0`, so that negative values need buckets of their own.
    pub(super) signed: bool,
    /// Right shift of the magnitude bits giving the unclamped bucket number; the low `shift`
    /// bits are compared.
    pub(super) shift: u32,
    /// The unclamped bucket number of the first bucket (smaller magnitudes join it).
    pub(super) first: u32,
    /// Buckets per sign (larger magnitudes join the last one).
    pub(super) per_sign: u32,
}

impl Packed {
    /// The coarsest packed buckets of `sorted` (sorted, NaN-free), proven for every bucket, or
    /// `None` when none fits in [`MAX_BUCKETS`] buckets, or when more than 255 or no entries
    /// count, or an entry is `±0.0` (the first bucket would hold it).
    pub(super) fn new(sorted: &[f32]) -> Option<Packed> {
        let t = super::counted(sorted);
        if t.is_empty() || t.len() > MAX_ENTRIES {
            return None;
        }
        let mags = t.iter().map(|x| x.to_bits() & 0x7fff_ffff);
        let (min_mag, max_mag) = mags.fold((u32::MAX, 0), |(lo, hi), m| (lo.min(m), hi.max(m)));
        let signed = t[0] <= 0.0;
        let halves = if signed { 2 } else { 1 };
        // From the finest index up, the last that works: coarser buckets are fewer.
        let mut best = None;
        for shift in 0..=23u32 {
            // The edge buckets hold no entry: the first ends below the smallest magnitude,
            // the last starts above the largest.
            let Some(first) = (min_mag >> shift).checked_sub(1) else {
                break;
            };
            let per_sign = (max_mag >> shift) - first + 2;
            if u64::from(per_sign) * halves > u64::from(MAX_BUCKETS) {
                continue;
            }
            match entries(t, shift, first, per_sign, signed) {
                Some(entries) => {
                    best = Some(Packed {
                        entries,
                        signed,
                        shift,
                        first,
                        per_sign,
                    })
                }
                None => break,
            }
        }
        best
    }

    /// The bucket of `v` (see the module docs).
    #[cfg(test)]
    pub(super) fn bucket(&self, v: f32) -> u32 {
        let x = v.to_bits();
        let mag = if self.signed { x & 0x7fff_ffff } else { x };
        let j = (mag >> self.shift).max(self.first) - self.first;
        let j = j.min(self.per_sign - 1);
        let off = if self.signed && x >= 0x8000_0000 {
            self.per_sign
        } else {
            0
        };
        off + j
    }

    /// The count the emitted search yields for `v`, computed on the host the same way.
    #[cfg(test)]
    pub(super) fn count(&self, v: f32) -> u32 {
        let x = v.to_bits();
        let mask = low_mask(self.shift);
        let mag = if self.signed { x & 0x7fff_ffff } else { x };
        let low = mag & mask;
        let key = if self.signed && x >= 0x8000_0000 {
            mask - low
        } else {
            low
        };
        let r = (self.entries[self.bucket(v) as usize] + key) >> self.shift;
        let zero = if self.signed {
            v.is_nan()
        } else {
            v.is_nan() || v <= 0.0
        };
        if zero {
            0
        } else {
            r
        }
    }
}

/// `2^shift - 1`.
fn low_mask(shift: u32) -> u32 {
    ((1u64 << shift) - 1) as u32
}

/// The packed entry of every bucket (the negative ones only when `signed`), or `None` when
/// some bucket holds more than one entry of `t`, or an edge bucket one.
fn entries(t: &[f32], shift: u32, first: u32, per_sign: u32, signed: bool) -> Option<Vec<u32>> {
    let mask = low_mask(shift);
    let mut pos = Vec::with_capacity(per_sign as usize);
    let mut neg = Vec::with_capacity(per_sign as usize);
    for j in 0..per_sign {
        let edge = j == 0 || j + 1 == per_sign;
        // The magnitudes of bucket j: [start, end], clamped to the non-NaN range.
        let start = if j == 0 {
            0
        } else {
            u64::from(first + j) << shift
        };
        let end = if j + 1 == per_sign {
            u64::from(INF_BITS)
        } else {
            ((u64::from(first + j + 1) << shift) - 1).min(u64::from(INF_BITS))
        };
        if start > end {
            // Only NaN magnitudes.
            pos.push(0);
            neg.push(0);
            continue;
        }
        let (lo, hi) = (f32::from_bits(start as u32), f32::from_bits(end as u32));
        for (low, high, flip, out) in [(lo, hi, 0, &mut pos), (-hi, -lo, mask, &mut neg)] {
            let cand = count_below(t, low);
            // The entries in [low, high].
            let inside = &t[cand as usize..t.partition_point(|x| *x <= high)];
            let l = match inside {
                [] => mask,
                [th] if !edge => (th.to_bits() & mask) ^ flip,
                _ => return None,
            };
            out.push((cand << shift) | (mask - l));
        }
    }
    if signed {
        pos.extend(neg);
    }
    Some(pos)
}

/// The table and constants of one packed search in a kernel.
#[derive(Clone, Debug)]
pub(super) struct PackedTables {
    /// [`Packed::entries`].
    entries: TableId,
    shift: u32,
    first: u32,
    per_sign: u32,
    signed: bool,
}

/// Declares `{name}_packed`, the table of `pk`, the packed search of the table called `name`.
pub(super) fn declare(b: &mut KernelBuilder, name: &str, pk: &Packed) -> PackedTables {
    PackedTables {
        entries: b.table_u32(
            &super::fresh_name(b, &format!("{name}_packed")),
            &pk.entries,
        ),
        shift: pk.shift,
        first: pk.first,
        per_sign: pk.per_sign,
        signed: pk.signed,
    }
}

/// Emits the search of `v` (`f32`) up to its last op, which it returns: [`Packed::count`] in
/// IR. The table index is a clamped bucket number, provably in range.
pub(super) fn emit(b: &mut KernelBuilder, v: Value, t: &PackedTables) -> Op {
    let x = b.bitcast(v, ScalarType::U32);
    let mask = b.const_u32(low_mask(t.shift));
    let mag = if t.signed {
        let abs = b.const_u32(0x7fff_ffff);
        b.and(x, abs)
    } else {
        x
    };
    let shift = b.const_u32(t.shift);
    let q = b.shr(mag, shift);
    let first = b.const_u32(t.first);
    let q = b.max(q, first);
    let j = b.sub(q, first);
    let last = b.const_u32(t.per_sign - 1);
    let j = b.min(j, last);
    let low = b.and(mag, mask);
    let zero = b.const_u32(0);
    let (bucket, key) = if t.signed {
        let sign_bit = b.const_u32(0x8000_0000);
        let neg = b.cmp(CmpOp::Ge, x, sign_bit);
        let per_sign = b.const_u32(t.per_sign);
        let off = b.select(neg, per_sign, zero);
        // `low ^ mask` as `mask - low` (`low <= mask`).
        let flipped = b.sub(mask, low);
        (b.add(off, j), b.select(neg, flipped, low))
    } else {
        (j, low)
    };
    let entry = b.lookup(t.entries, bucket);
    let sum = b.add(entry, key);
    let r = b.shr(sum, shift);
    if t.signed {
        let nan = b.cmp(CmpOp::Ne, v, v);
        Op::Select {
            cond: nan,
            if_true: zero,
            if_false: r,
        }
    } else {
        let fzero = b.const_f32(0.0);
        let pos = b.cmp(CmpOp::Gt, v, fzero);
        Op::Select {
            cond: pos,
            if_true: r,
            if_false: zero,
        }
    }
}
