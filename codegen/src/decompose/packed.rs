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
//! midpoints of bitsandbytes' dynamic maps 2802 (signed) and 2900 (unsigned) words (11 KiB).
//! It suits backends that read tables from memory one lane at a time and keep them in the data
//! cache (CPUs without vector permutes of whole tables); GPU backends keep the smaller bucket
//! tables.

use qforge_ir::{KernelBuilder, Op, TableId, Value};

#[cfg(test)]
use super::buckets::counts_zero;
use super::buckets::{count_below, zero_select, BucketIndex, Counted};

/// Largest number of buckets (both signs): 32 KiB of table.
const MAX_BUCKETS: u32 = 1 << 13;

/// The one-read search of one sorted table (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Packed {
    /// The packed entry of each bucket: `per_sign` buckets of positive values, then, when
    /// `signed`, `per_sign` of negative ones.
    pub(super) entries: Vec<u32>,
    /// How a value's bits give its bucket; the low `shift` bits of the magnitude are compared.
    pub(super) index: BucketIndex,
}

impl Packed {
    /// The coarsest packed buckets of `sorted` (sorted, NaN-free), proven for every bucket, or
    /// `None` when none fits in [`MAX_BUCKETS`] buckets, or when more than 255 or no entries
    /// count, or an entry is `±0.0` (the first bucket would hold it).
    pub(super) fn new(sorted: &[f32]) -> Option<Packed> {
        let Counted {
            t,
            min_mag,
            max_mag,
            signed,
        } = Counted::of(sorted)?;
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
            let index = BucketIndex {
                signed,
                shift,
                first,
                per_sign,
            };
            match entries(t, &index) {
                Some(entries) => best = Some(Packed { entries, index }),
                None => break,
            }
        }
        best
    }

    /// The count the emitted search yields for `v`, computed on the host the same way.
    #[cfg(test)]
    pub(super) fn count(&self, v: f32) -> u32 {
        let ix = &self.index;
        let x = v.to_bits();
        let mask = low_mask(ix.shift);
        let mag = if ix.signed { x & 0x7fff_ffff } else { x };
        let low = mag & mask;
        let key = if ix.signed && x >= 0x8000_0000 {
            mask - low
        } else {
            low
        };
        let r = (self.entries[ix.bucket(v) as usize] + key) >> ix.shift;
        if counts_zero(v, ix.signed) {
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
fn entries(t: &[f32], index: &BucketIndex) -> Option<Vec<u32>> {
    let (shift, per_sign) = (index.shift, index.per_sign);
    let mask = low_mask(shift);
    let mut pos = Vec::with_capacity(per_sign as usize);
    let mut neg = Vec::with_capacity(per_sign as usize);
    for j in 0..per_sign {
        let edge = j == 0 || j + 1 == per_sign;
        let Some((lo, hi)) = index.magnitudes(j) else {
            // Only NaN magnitudes.
            pos.push(0);
            neg.push(0);
            continue;
        };
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
    if index.signed {
        pos.extend(neg);
    }
    Some(pos)
}

/// The table and constants of one packed search in a kernel.
#[derive(Clone, Debug)]
pub(super) struct PackedTables {
    /// [`Packed::entries`].
    entries: TableId,
    index: BucketIndex,
}

/// Declares `{name}_packed`, the table of `pk`, the packed search of the table called `name`.
pub(super) fn declare(b: &mut KernelBuilder, name: &str, pk: &Packed) -> PackedTables {
    PackedTables {
        entries: b.table_u32(
            &super::fresh_name(b, &format!("{name}_packed")),
            &pk.entries,
        ),
        index: pk.index,
    }
}

/// Emits the search of `v` (`f32`) up to its last op, which it returns: [`Packed::count`] in
/// IR. The table index is a clamped bucket number, provably in range.
pub(super) fn emit(b: &mut KernelBuilder, v: Value, t: &PackedTables) -> Op {
    let ix = t.index.emit(b, v);
    let mask = b.const_u32(low_mask(t.index.shift));
    let low = b.and(ix.mag, mask);
    let key = match ix.neg {
        // `low ^ mask` as `mask - low` (`low <= mask`).
        Some(neg) => {
            let flipped = b.sub(mask, low);
            b.select(neg, flipped, low)
        }
        None => low,
    };
    let entry = b.lookup(t.entries, ix.bucket);
    let sum = b.add(entry, key);
    let shift = b.const_u32(t.index.shift);
    let r = b.shr(sum, shift);
    zero_select(b, v, r, &ix)
}
