//! The exact nearest 8-bit code in O(1): a bucket table indexed by the sign and the top bits of
//! `|v|` gives a first candidate code, and a fixed number ([`NEAREST8_COMPARES`]) of threshold
//! compares finishes the search. It picks exactly the code of the 8-step branchless binary
//! search over the 255 thresholds that it replaces: the number of exact midpoints below `v`,
//! i.e. the nearest code with ties to the lower code, and code 0 for NaN.
//!
//! Bucket of an `f32` `v` with bits `x` (all integer arithmetic on `u32`):
//! `j = min(max((x & 0x7fff_ffff) >> shift, first) - first, per_sign - 1)` and
//! `bucket = j + (per_sign if x >= 0x8000_0000 else 0)`. Within one sign, a bucket holds an
//! interval of magnitudes (the first one everything below it, the last one everything above it,
//! infinity and NaN included), so the non-NaN values of a bucket form an interval of the real
//! line, over which the code, a non-decreasing function of `v`, ranges over `cand ..= top`.
//! [`Nearest8::new`] stores `cand` (the code of the interval's lowest value) and proves
//! `top - cand <= NEAREST8_COMPARES` for every bucket, so for every non-NaN `v`
//! `code(v) = cand + #{ k < NEAREST8_COMPARES : t[cand + k] < v }`, the thresholds `t` being
//! sorted and padded with `+inf` (which no value exceeds). NaN is selected to code 0 at the end.
//!
//! When every threshold is positive (the unsigned maps), every `v <= 0` and NaN have code 0: the
//! table then holds the positive buckets only, `j` is computed from `x` unmasked (negative values
//! land in the last bucket) and the final select is `v > 0 ? r : 0`.
//!
//! The bucket resolution (`shift`) is the coarsest that satisfies the bound, and the candidates
//! (bytes) are packed four to a table word, so the tables stay small (GPU backends keep tables
//! in per-thread constant arrays): for bitsandbytes' dynamic maps 350 (signed) and 363
//! (unsigned) words besides the 257 thresholds.

use crate::builder::KernelBuilder;
use crate::error::{Error, Result};
use crate::kernel::{TableId, Value};
use crate::library::blockwise8::exact_midpoints;
use crate::ops::CmpOp;
use crate::types::ScalarType;

/// Threshold compares after the bucket lookup (the proven bound on how many codes a bucket
/// spans).
pub const NEAREST8_COMPARES: u32 = 2;

/// Most mantissa bits a bucket index may use (a finer index than this is not searched).
const MAX_MANTISSA_BITS: u32 = 12;

/// Largest number of buckets per sign.
const MAX_BUCKETS_PER_SIGN: u32 = 1 << 13;

/// Bits of `+inf`: the largest non-NaN magnitude.
const INF_BITS: u32 = 0x7f80_0000;

/// The tables and constants of the O(1) search of one 256-entry code table (see the module
/// docs).
#[derive(Clone, Debug, PartialEq)]
pub struct Nearest8 {
    /// The 255 midpoint thresholds (`Midpoints8::thresholds`: `mid_k < v` exactly when
    /// `t_k < v` for non-NaN `v`), then [`NEAREST8_COMPARES`] entries of `+inf`, so that every
    /// index `cand + j` a search reads is in the table.
    pub thresholds: Vec<f32>,
    /// The first candidate code of each bucket: `per_sign` buckets of positive values (sign
    /// bit clear), then, when [`Nearest8::signed`], `per_sign` of negative ones.
    pub buckets: Vec<u32>,
    /// Whether some threshold is `<= 0`, so that negative values need buckets of their own
    /// (otherwise every `v <= 0` has code 0).
    pub signed: bool,
    /// Right shift of the magnitude bits giving the unclamped bucket number.
    pub shift: u32,
    /// The unclamped bucket number of the first bucket (smaller magnitudes join it).
    pub first: u32,
    /// Buckets per sign (larger magnitudes join the last one).
    pub per_sign: u32,
}

/// The number of thresholds below `v` among the sorted `thresholds` (a non-NaN `v`): a
/// binary search, used as the reference when the buckets are built and tested.
fn count_below(thresholds: &[f32], v: f32) -> u32 {
    thresholds.partition_point(|t| *t < v) as u32
}

impl Nearest8 {
    /// Builds the search of `code` (256 sorted finite values): the coarsest bucket index
    /// (fewest mantissa bits) under which no bucket spans more than [`NEAREST8_COMPARES`]
    /// codes, proven here for every bucket.
    ///
    /// # Errors
    /// [`Error::Unsupported`] when `code` is not a valid 8-bit table ([`exact_midpoints`]), or
    /// when no index of at most 12 mantissa bits and 8192 buckets per sign meets the bound
    /// (never the case for bitsandbytes' maps).
    pub fn new(code: &[f32]) -> Result<Nearest8> {
        let t = exact_midpoints(code)?.thresholds();
        if t.iter().any(|x| x.is_nan()) || t.windows(2).any(|w| w[0] > w[1]) {
            return Err(Error::Unsupported(
                "the midpoint thresholds of an 8-bit code table must be sorted".into(),
            ));
        }
        let mags = t.iter().map(|x| x.to_bits() & 0x7fff_ffff);
        let (min_mag, max_mag) = mags.fold((u32::MAX, 0), |(lo, hi), m| (lo.min(m), hi.max(m)));
        for bits in 0..=MAX_MANTISSA_BITS {
            let shift = 23 - bits;
            let first = min_mag >> shift;
            let per_sign = (max_mag >> shift) - first + 1;
            if per_sign > MAX_BUCKETS_PER_SIGN {
                break;
            }
            let signed = t[0] <= 0.0;
            if let Some(buckets) = Self::candidates(&t, shift, first, per_sign, signed) {
                let mut thresholds = t;
                thresholds.extend(std::iter::repeat_n(
                    f32::INFINITY,
                    NEAREST8_COMPARES as usize,
                ));
                return Ok(Nearest8 {
                    thresholds,
                    buckets,
                    signed,
                    shift,
                    first,
                    per_sign,
                });
            }
        }
        Err(Error::Unsupported(format!(
            "no bucket index of at most {MAX_MANTISSA_BITS} mantissa bits keeps every bucket of \
             this 8-bit code table within {NEAREST8_COMPARES} codes"
        )))
    }

    /// The candidate code of every bucket (the negative ones only when `signed`), or `None`
    /// when some bucket spans more than [`NEAREST8_COMPARES`] codes.
    fn candidates(
        t: &[f32],
        shift: u32,
        first: u32,
        per_sign: u32,
        signed: bool,
    ) -> Option<Vec<u32>> {
        let mut pos = Vec::with_capacity(per_sign as usize);
        let mut neg = Vec::with_capacity(per_sign as usize);
        for j in 0..per_sign {
            // The magnitudes of bucket j: [start, end], clamped to the non-NaN range.
            let start = if j == 0 {
                0
            } else {
                ((first + j) as u64) << shift
            };
            let end = if j + 1 == per_sign {
                INF_BITS as u64
            } else {
                ((((first + j + 1) as u64) << shift) - 1).min(INF_BITS as u64)
            };
            if start > end {
                // Only NaN magnitudes (never for a table within the finite range).
                pos.push(0);
                neg.push(0);
                continue;
            }
            let (lo, hi) = (f32::from_bits(start as u32), f32::from_bits(end as u32));
            for (low, high, out) in [(lo, hi, &mut pos), (-hi, -lo, &mut neg)] {
                let cand = count_below(t, low);
                if count_below(t, high) - cand > NEAREST8_COMPARES {
                    return None;
                }
                out.push(cand);
            }
        }
        if signed {
            pos.extend(neg);
        }
        Some(pos)
    }

    /// The bucket of `v` (see the module docs).
    pub fn bucket(&self, v: f32) -> u32 {
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

    /// The code the emitted search yields for `v`, computed on the host the same way: the
    /// exact nearest code, ties to the lower code, NaN to 0.
    pub fn code(&self, v: f32) -> u8 {
        let cand = self.buckets[self.bucket(v) as usize];
        let mut r = cand;
        for j in 0..NEAREST8_COMPARES {
            if self.thresholds[(cand + j) as usize] < v {
                r = cand + j + 1;
            }
        }
        // Unsigned map: zero, negatives and NaN (not greater than 0) go to code 0.
        let zero = if self.signed {
            v.is_nan()
        } else {
            v.is_nan() || v <= 0.0
        };
        if zero {
            0
        } else {
            r as u8
        }
    }
}

impl Nearest8 {
    /// [`Nearest8::buckets`] packed four to a `u32` word, bucket `i` in byte `i % 4` (bits
    /// `8 * (i % 4)`) of word `i / 4`: the table a kernel carries (a quarter of the words,
    /// which keeps GPU backends' constant tables small).
    pub fn packed_buckets(&self) -> Vec<u32> {
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

/// The declared tables and constants of one [`Nearest8`] search in a kernel.
#[derive(Clone, Copy, Debug)]
pub struct Nearest8Tables {
    /// [`Nearest8::thresholds`].
    thresholds: TableId,
    /// [`Nearest8::packed_buckets`].
    buckets: TableId,
    /// [`Nearest8::shift`].
    shift: u32,
    /// [`Nearest8::first`].
    first: u32,
    /// [`Nearest8::per_sign`].
    per_sign: u32,
    /// [`Nearest8::signed`].
    signed: bool,
}

/// Declares the tables of the search of `code`, named `mid_thresholds{suffix}` and
/// `code_buckets{suffix}`.
///
/// # Errors
/// As [`Nearest8::new`].
pub fn declare(b: &mut KernelBuilder, code: &[f32], suffix: &str) -> Result<Nearest8Tables> {
    let n = Nearest8::new(code)?;
    Ok(Nearest8Tables {
        thresholds: b.table_f32(&format!("mid_thresholds{suffix}"), &n.thresholds),
        buckets: b.table_u32(&format!("code_buckets{suffix}"), &n.packed_buckets()),
        shift: n.shift,
        first: n.first,
        per_sign: n.per_sign,
        signed: n.signed,
    })
}

/// The 8-bit code of the scaled value `v` (`f32`) as a `u32`: [`Nearest8::code`] in IR, with the
/// candidate unpacked from [`Nearest8::packed_buckets`]. Every table index is provably in range
/// (a clamped bucket number shifted right by 2, and a candidate masked to 8 bits plus a constant
/// below the padding), so backends need no clamp.
pub fn emit_code(b: &mut KernelBuilder, v: Value, t: &Nearest8Tables) -> Value {
    let x = b.bitcast(v, ScalarType::U32);
    let mag = if t.signed {
        let mask = b.const_u32(0x7fff_ffff);
        b.and(x, mask)
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
    let zero = b.const_u32(0);
    let bucket = if t.signed {
        let sign_bit = b.const_u32(0x8000_0000);
        let neg = b.cmp(CmpOp::Ge, x, sign_bit);
        let per_sign = b.const_u32(t.per_sign);
        let off = b.select(neg, per_sign, zero);
        b.add(off, j)
    } else {
        j
    };
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
    for k in 0..NEAREST8_COMPARES {
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
    if t.signed {
        let nan = b.cmp(CmpOp::Ne, v, v);
        b.select(nan, zero, r)
    } else {
        // No threshold is <= 0: NaN and every v <= 0 have code 0.
        let fzero = b.const_f32(0.0);
        let pos = b.cmp(CmpOp::Gt, v, fzero);
        b.select(pos, r, zero)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::library::BlockwiseMap;

    /// Today's search semantics, independently: the number of thresholds `t_k < v` by a linear
    /// count (0 for NaN, whose compares are all false).
    fn linear_count(t: &[f32], v: f32) -> u8 {
        t[..255].iter().filter(|x| **x < v).count() as u8
    }

    fn edge_values(n: &Nearest8) -> Vec<f32> {
        let mut v = vec![
            0.0,
            -0.0,
            1.0,
            -1.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            f32::from_bits(1),
            -f32::from_bits(1),
            f32::MIN_POSITIVE,
            -f32::MIN_POSITIVE,
            f32::MAX,
            f32::MIN,
            f32::from_bits(0x7fc0_0001),
            f32::from_bits(0xff80_0001),
        ];
        for t in &n.thresholds[..255] {
            let (mut up, mut down) = (*t, *t);
            v.push(*t);
            for _ in 0..3 {
                up = up.next_up();
                down = down.next_down();
                v.extend([up, down]);
            }
        }
        // Every bucket boundary and its neighbours, both signs.
        for j in 0..=n.per_sign {
            let m = ((n.first + j) as u64) << n.shift;
            if m <= INF_BITS as u64 {
                let x = f32::from_bits(m as u32);
                for y in [x, x.next_up(), x.next_down()] {
                    v.extend([y, -y]);
                }
            }
        }
        v
    }

    #[test]
    fn nearest8_tables_meet_the_compare_bound_and_stay_small() {
        for map in BlockwiseMap::ALL {
            let n = Nearest8::new(&map.code()).unwrap();
            assert_eq!(n.thresholds.len(), 255 + NEAREST8_COMPARES as usize);
            let halves = if n.signed { 2 } else { 1 };
            assert_eq!(n.signed, map != BlockwiseMap::DynamicUnsigned, "{map}");
            assert_eq!(n.buckets.len(), halves * n.per_sign as usize);
            assert!(
                n.buckets.len() <= 4096,
                "{map}: {} buckets",
                n.buckets.len()
            );
            assert!(n.buckets.iter().all(|c| *c <= 255));
            let packed = n.packed_buckets();
            assert_eq!(packed.len(), n.buckets.len().div_ceil(4));
            // The sizes the module docs quote.
            match map {
                BlockwiseMap::Dynamic => assert_eq!(packed.len(), 350),
                BlockwiseMap::DynamicUnsigned => assert_eq!(packed.len(), 363),
                BlockwiseMap::Linear => {}
            }
            for (i, c) in n.buckets.iter().enumerate() {
                assert_eq!(
                    (packed[i / 4] >> (8 * (i % 4))) & 255,
                    *c,
                    "{map}: bucket {i}"
                );
            }
        }
    }

    #[test]
    fn nearest8_matches_the_binary_search_on_edge_values() {
        for map in BlockwiseMap::ALL {
            let n = Nearest8::new(&map.code()).unwrap();
            for v in edge_values(&n) {
                assert_eq!(
                    n.code(v),
                    linear_count(&n.thresholds, v),
                    "{map}: v = {v:e} ({:#010x})",
                    v.to_bits()
                );
            }
        }
    }

    /// The emitted IR, run by the interpreter on the edge values, gives the host mirror's codes.
    #[test]
    fn nearest8_ir_matches_the_host_mirror_on_the_interpreter() {
        use crate::args::OwnedArg;
        use crate::kernel::{Access, Dim};
        use crate::types::{DType, Scalar};
        for map in BlockwiseMap::ALL {
            let code = map.code();
            let mut b = KernelBuilder::new("nearest8_probe");
            let np = b.scalar_param("n", ScalarType::U32);
            let x = b.buffer_param("x", DType::F32, &[Dim::Param(np)], Access::Read);
            let q = b.buffer_param("q", DType::U32, &[Dim::Param(np)], Access::Write);
            b.set_grid(Dim::Param(np));
            let tables = declare(&mut b, &code, "").unwrap();
            let i = b.work_item();
            let v = b.load(x, i);
            let c = emit_code(&mut b, v, &tables);
            b.store(q, i, c);
            let k = b.finish();
            crate::verify(&k).unwrap();
            let n = Nearest8::new(&code).unwrap();
            let values = edge_values(&n);
            let mut args = vec![
                OwnedArg::Scalar(Scalar::U32(values.len() as u32)),
                OwnedArg::Read(values.iter().flat_map(|v| v.to_le_bytes()).collect()),
                OwnedArg::Write(vec![0; 4 * values.len()]),
            ];
            crate::library::test_util::run(&k, &mut args);
            let out = crate::library::test_util::out(&args, 2);
            for (i, v) in values.iter().enumerate() {
                let got = u32::from_le_bytes(out[4 * i..4 * i + 4].try_into().unwrap());
                assert_eq!(
                    got,
                    u32::from(linear_count(&n.thresholds, *v)),
                    "{map}: v = {v:e}"
                );
            }
        }
    }

    /// Every 4099th bit pattern (about a million values per map) and its neighbour.
    #[test]
    fn nearest8_matches_the_binary_search_on_a_strided_sweep() {
        for map in BlockwiseMap::ALL {
            let n = Nearest8::new(&map.code()).unwrap();
            let t = &n.thresholds[..255];
            for x in (0..=u32::MAX).step_by(4099) {
                for bits in [x, x ^ 1] {
                    let v = f32::from_bits(bits);
                    let want = if v.is_nan() {
                        0
                    } else {
                        count_below(t, v) as u8
                    };
                    assert_eq!(n.code(v), want, "{map}: bits {bits:#010x}");
                }
            }
        }
    }

    /// All 2^32 inputs of each map (a few minutes in the optimized test profile:
    /// `cargo test --release -p qforge-ir -- --ignored nearest8_exhaustive`).
    #[test]
    #[ignore = "all 2^32 inputs of 3 maps: about 6 minutes; run with --release --ignored"]
    fn nearest8_exhaustive() {
        for map in BlockwiseMap::ALL {
            let n = Nearest8::new(&map.code()).unwrap();
            let t = &n.thresholds[..255];
            for bits in 0..=u32::MAX {
                let v = f32::from_bits(bits);
                let want = if v.is_nan() {
                    0
                } else {
                    count_below(t, v) as u8
                };
                assert_eq!(n.code(v), want, "{map}: bits {bits:#010x}");
            }
        }
    }
}
