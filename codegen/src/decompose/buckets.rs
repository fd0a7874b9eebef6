//! [`SearchSorted`](qforge_ir::Op::SearchSorted) in O(1): a bucket table indexed by the sign
//! and the top bits of `|v|` gives a first candidate count, and a fixed number
//! ([`BUCKET_COMPARES`]) of threshold compares finishes it.
//!
//! Let `t` be the searched table without its trailing `+inf` entries (which no value exceeds, so
//! they never count). Bucket of an `f32` `v` with bits `x` (all integer arithmetic on `u32`):
//! `j = min(max((x & 0x7fff_ffff) >> shift, first) - first, per_sign - 1)` and
//! `bucket = j + (per_sign if x >= 0x8000_0000 else 0)`. Within one sign, a bucket holds an
//! interval of magnitudes (the first one everything below it, the last one everything above it,
//! infinity and NaN included), so the non-NaN values of a bucket form an interval of the real
//! line, over which the count, a non-decreasing function of `v`, ranges over `cand ..= top`.
//! [`Buckets::new`] stores `cand` (the count at the interval's lowest value) and proves
//! `top - cand <= BUCKET_COMPARES` for every bucket, so for every non-NaN `v`
//! `count(v) = cand + #{ k < BUCKET_COMPARES : t[cand + k] < v }`, `t` padded with `+inf`.
//! NaN is selected to 0 at the end.
//!
//! When every entry is positive (bitsandbytes' unsigned maps), every `v <= 0` and NaN count 0:
//! the table then holds the positive buckets only, `j` is computed from `x` unmasked (negative
//! values land in the last bucket) and the final select is `v > 0 ? r : 0`.
//!
//! The bucket resolution (`shift`) is the coarsest that satisfies the bound, and the candidates
//! (bytes, so at most 255 counted entries) are packed four to a table word, so the tables stay
//! small (GPU backends keep tables in per-thread constant arrays): for the midpoints of
//! bitsandbytes' dynamic maps 350 (signed) and 363 (unsigned) words besides the thresholds.

use qforge_ir::{CmpOp, KernelBuilder, Op, ScalarType, TableId, Value};

/// Threshold compares after the bucket lookup (the proven bound on how many entries a bucket
/// spans).
pub const BUCKET_COMPARES: u32 = 2;

/// Most mantissa bits a bucket index may use (a finer index than this is not searched).
const MAX_MANTISSA_BITS: u32 = 12;

/// Largest number of buckets per sign.
const MAX_BUCKETS_PER_SIGN: u32 = 1 << 13;

/// Most counted (non-`+inf`) entries: a candidate is stored in one byte.
const MAX_ENTRIES: usize = 255;

/// Bits of `+inf`: the largest non-NaN magnitude.
const INF_BITS: u32 = 0x7f80_0000;

/// The bucket search of one sorted table (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Buckets {
    /// The counted entries (the table without its trailing `+inf` entries), then
    /// [`BUCKET_COMPARES`] entries of `+inf`, so that every index `cand + k` a search reads is
    /// in the table.
    pub(super) thresholds: Vec<f32>,
    /// The first candidate of each bucket: `per_sign` buckets of positive values (sign bit
    /// clear), then, when `signed`, `per_sign` of negative ones.
    pub(super) buckets: Vec<u32>,
    /// How a value's bits give its bucket.
    pub(super) index: BucketIndex,
}

/// The bucket of an `f32` by its sign and the top bits of its magnitude (see the module docs),
/// shared by these buckets and the packed ones (`packed.rs`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct BucketIndex {
    /// Whether some entry is `<= 0`, so that negative values need buckets of their own
    /// (otherwise every `v <= 0` counts 0, and negative values land in the last bucket).
    pub(super) signed: bool,
    /// Right shift of the magnitude bits giving the unclamped bucket number.
    pub(super) shift: u32,
    /// The unclamped bucket number of the first bucket (smaller magnitudes join it).
    pub(super) first: u32,
    /// Buckets per sign (larger magnitudes join the last one).
    pub(super) per_sign: u32,
}

/// A bucket index emitted in IR ([`BucketIndex::emit`]).
pub(super) struct EmittedIndex {
    /// The magnitude bits `x & 0x7fff_ffff` (`x` itself for an unsigned index).
    pub(super) mag: Value,
    /// The bucket number (negative values' buckets after the positive ones).
    pub(super) bucket: Value,
    /// `x >= 0x8000_0000` (signed indices only).
    pub(super) neg: Option<Value>,
    /// The `u32` constant 0.
    pub(super) zero: Value,
}

impl BucketIndex {
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

    /// The magnitudes `[lo, hi]` of bucket `j` of one sign, clamped to the non-NaN range (the
    /// first bucket from 0, the last up to `+inf`), or `None` when it holds only NaN
    /// magnitudes.
    pub(super) fn magnitudes(&self, j: u32) -> Option<(f32, f32)> {
        let start = if j == 0 {
            0
        } else {
            u64::from(self.first + j) << self.shift
        };
        let end = if j + 1 == self.per_sign {
            u64::from(INF_BITS)
        } else {
            ((u64::from(self.first + j + 1) << self.shift) - 1).min(u64::from(INF_BITS))
        };
        (start <= end).then(|| (f32::from_bits(start as u32), f32::from_bits(end as u32)))
    }

    /// Emits the bucket of the `f32` value `v`; every op's result is provably in range (a
    /// clamped bucket number plus `per_sign` at most).
    pub(super) fn emit(&self, b: &mut KernelBuilder, v: Value) -> EmittedIndex {
        let x = b.bitcast(v, ScalarType::U32);
        let mag = if self.signed {
            let mask = b.const_u32(0x7fff_ffff);
            b.and(x, mask)
        } else {
            x
        };
        let shift = b.const_u32(self.shift);
        let q = b.shr(mag, shift);
        let first = b.const_u32(self.first);
        let q = b.max(q, first);
        let j = b.sub(q, first);
        let last = b.const_u32(self.per_sign - 1);
        let j = b.min(j, last);
        let zero = b.const_u32(0);
        if !self.signed {
            return EmittedIndex {
                mag,
                bucket: j,
                neg: None,
                zero,
            };
        }
        let sign_bit = b.const_u32(0x8000_0000);
        let neg = b.cmp(CmpOp::Ge, x, sign_bit);
        let per_sign = b.const_u32(self.per_sign);
        let off = b.select(neg, per_sign, zero);
        EmittedIndex {
            mag,
            bucket: b.add(off, j),
            neg: Some(neg),
            zero,
        }
    }
}

/// The final select of a search's count `r` of `v`: NaN counts 0 (the `u32` constant `zero`),
/// and for an unsigned table (every entry positive) so does every `v <= 0`.
pub(super) fn zero_select(b: &mut KernelBuilder, v: Value, r: Value, ix: &EmittedIndex) -> Op {
    let zero = ix.zero;
    if ix.neg.is_some() {
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

/// Whether a search's count of `v` is selected to 0 ([`zero_select`] on the host).
#[cfg(test)]
pub(super) fn counts_zero(v: f32, signed: bool) -> bool {
    v.is_nan() || (!signed && v <= 0.0)
}

/// The entries of a searched table that can count, as the bucket searches see them.
pub(super) struct Counted<'a> {
    /// The table without its trailing `+inf` entries.
    pub(super) t: &'a [f32],
    /// Bits of the smallest magnitude among them.
    pub(super) min_mag: u32,
    /// Bits of the largest magnitude among them.
    pub(super) max_mag: u32,
    /// Whether some entry is `<= 0`.
    pub(super) signed: bool,
}

impl Counted<'_> {
    /// The counted entries of `sorted` (sorted, NaN-free), or `None` when none or more than
    /// 255 count (a candidate count is stored in 8 bits).
    pub(super) fn of(sorted: &[f32]) -> Option<Counted<'_>> {
        let t = super::counted(sorted);
        if t.is_empty() || t.len() > MAX_ENTRIES {
            return None;
        }
        let mags = t.iter().map(|x| x.to_bits() & 0x7fff_ffff);
        let (min_mag, max_mag) = mags.fold((u32::MAX, 0), |(lo, hi), m| (lo.min(m), hi.max(m)));
        Some(Counted {
            t,
            min_mag,
            max_mag,
            signed: t[0] <= 0.0,
        })
    }
}

/// The number of entries of the sorted `t` below `v` (a binary search; 0 for NaN).
pub(super) fn count_below(t: &[f32], v: f32) -> u32 {
    t.partition_point(|x| *x < v) as u32
}

impl Buckets {
    /// The coarsest bucket index (fewest mantissa bits) under which no bucket spans more than
    /// [`BUCKET_COMPARES`] entries of `sorted` (sorted, NaN-free), proven for every bucket, or
    /// `None` when there is none with at most 12 mantissa bits and 8192 buckets per sign, or
    /// when more than 255 or no entries count.
    pub(super) fn new(sorted: &[f32]) -> Option<Buckets> {
        let Counted {
            t,
            min_mag,
            max_mag,
            signed,
        } = Counted::of(sorted)?;
        for bits in 0..=MAX_MANTISSA_BITS {
            let shift = 23 - bits;
            let first = min_mag >> shift;
            let per_sign = (max_mag >> shift) - first + 1;
            if per_sign > MAX_BUCKETS_PER_SIGN {
                break;
            }
            let index = BucketIndex {
                signed,
                shift,
                first,
                per_sign,
            };
            if let Some(buckets) = candidates(t, &index) {
                let mut thresholds = t.to_vec();
                thresholds.extend(std::iter::repeat_n(f32::INFINITY, BUCKET_COMPARES as usize));
                return Some(Buckets {
                    thresholds,
                    buckets,
                    index,
                });
            }
        }
        None
    }

    /// The count the emitted search yields for `v`, computed on the host the same way.
    #[cfg(test)]
    pub(super) fn count(&self, v: f32) -> u32 {
        let cand = self.buckets[self.index.bucket(v) as usize];
        let mut r = cand;
        for k in 0..BUCKET_COMPARES {
            if self.thresholds[(cand + k) as usize] < v {
                r = cand + k + 1;
            }
        }
        if counts_zero(v, self.index.signed) {
            0
        } else {
            r
        }
    }

    /// [`Buckets::buckets`] packed four to a `u32` word, bucket `i` in byte `i % 4` (bits
    /// `8 * (i % 4)`) of word `i / 4`: the table a kernel carries.
    pub(super) fn packed(&self) -> Vec<u32> {
        self.buckets
            .chunks(4)
            .map(|c| {
                c.iter()
                    .enumerate()
                    .fold(0u32, |w, (k, cand)| w | (cand << (8 * k)))
            })
            .collect()
    }
}

/// The candidate of every bucket (the negative ones only when `signed`), or `None` when some
/// bucket spans more than [`BUCKET_COMPARES`] entries.
fn candidates(t: &[f32], index: &BucketIndex) -> Option<Vec<u32>> {
    let mut pos = Vec::with_capacity(index.per_sign as usize);
    let mut neg = Vec::with_capacity(index.per_sign as usize);
    for j in 0..index.per_sign {
        let Some((lo, hi)) = index.magnitudes(j) else {
            // Only NaN magnitudes.
            pos.push(0);
            neg.push(0);
            continue;
        };
        for (low, high, out) in [(lo, hi, &mut pos), (-hi, -lo, &mut neg)] {
            let cand = count_below(t, low);
            if count_below(t, high) - cand > BUCKET_COMPARES {
                return None;
            }
            out.push(cand);
        }
    }
    if index.signed {
        pos.extend(neg);
    }
    Some(pos)
}

/// The tables and constants of one bucket search in a kernel.
#[derive(Clone, Debug)]
pub(super) struct BucketTables {
    /// The padded thresholds ([`Buckets::thresholds`]): the searched table itself when it
    /// already ends with enough `+inf` entries.
    thresholds: TableId,
    /// [`Buckets::packed`].
    buckets: TableId,
    index: BucketIndex,
}

/// Declares the tables of `bk`, the bucket search of table `table` called `name`:
/// `{name}_buckets`, and `{name}_padded` unless the table is already padded.
pub(super) fn declare(
    b: &mut KernelBuilder,
    name: &str,
    table: TableId,
    bk: &Buckets,
) -> BucketTables {
    let t = &b.kernel().tables[table];
    let padded = t.data.len() >= bk.thresholds.len()
        && bk
            .thresholds
            .iter()
            .zip(&t.data)
            .all(|(x, d)| x.to_bits() == *d);
    let thresholds = if padded {
        table
    } else {
        b.table_f32(
            &super::fresh_name(b, &format!("{name}_padded")),
            &bk.thresholds,
        )
    };
    BucketTables {
        thresholds,
        buckets: b.table_u32(
            &super::fresh_name(b, &format!("{name}_buckets")),
            &bk.packed(),
        ),
        index: bk.index,
    }
}

/// Emits the search of `v` (`f32`) up to its last op, which it returns: [`Buckets::count`] in
/// IR, the candidate unpacked from [`Buckets::packed`]. Every table index is provably in range
/// (a clamped bucket number shifted right by 2, and a candidate masked to 8 bits plus a constant
/// below the padding).
pub(super) fn emit(b: &mut KernelBuilder, v: Value, t: &BucketTables) -> Op {
    let ix = t.index.emit(b, v);
    let bucket = ix.bucket;
    // The candidate: byte `bucket % 4` of packed word `bucket / 4`.
    let two = b.const_u32(2);
    let word_at = b.shr(bucket, two);
    let word = b.lookup(t.buckets, word_at);
    let three = b.const_u32(3);
    let lane = b.and(bucket, three);
    let bit = b.shl(lane, three);
    let shifted = b.shr(word, bit);
    let byte = b.const_u32(255);
    let cand = b.and(shifted, byte);
    let mut r = cand;
    for k in 0..BUCKET_COMPARES {
        let at = if k == 0 {
            cand
        } else {
            let kv = b.const_u32(k);
            b.add(cand, kv)
        };
        let th = b.lookup(t.thresholds, at);
        let below = b.cmp(CmpOp::Lt, th, v);
        let next_k = b.const_u32(k + 1);
        let next = b.add(cand, next_k);
        r = b.select(below, next, r);
    }
    zero_select(b, v, r, &ix)
}
