//! The quantizers of the 4-bit AdamW state ([`crate::optim4`]), as kernel-language helpers
//! (`#[func]`; the EDEN sums, which read the moment, are in [`crate::optim4::kernel`]): the
//! adamw4bit round-to-nearest search (ties to the upper code), the `dyn4_nz` floor, value-space
//! and preconditioner-space stochastic rounding (ZIP-SR), the 8-bit linear code and the EDEN
//! scale sums in torch's AVX2 summation order. The tables are the reference library's float32
//! bit patterns. Every formula, with its source, is in `docs/optimizers.md` ("4-bit AdamW").

use qforge_ir::dsl::{Table, Val, Var};
use qforge_ir::Rounding;
use qforge_macros::func;

/// The NF4 table of adamw4bit (m1), as `f32` bit patterns; code 7 is `0.0`.
pub const NF4_BITS: [u32; 16] = [
    0xbf80_0000,
    0xbf32_39b1,
    0xbf06_6b31,
    0xbeca_32a0,
    0xbe91_a24e,
    0xbe3d_353d,
    0xbdba_786c,
    0x0000_0000,
    0x3da2_faff,
    0x3e24_cae3,
    0x3e7c_04dd,
    0x3ead_0339,
    0x3ee1_a4b7,
    0x3f10_07ab,
    0x3f39_13b2,
    0x3f80_0000,
];

/// The unsigned dynamic 4-bit table (Dyn4) of adamw4bit (m2), as `f32` bit patterns; code 0
/// is `0.0`. Entries 2, 5, 11 and 13 are one ulp away from the `f32` rounding of their
/// decimal values, so only the bit patterns are exact.
pub const DYN4_BITS: [u32; 16] = [
    0x0000_0000,
    0x3b54_fdf4,
    0x3bfd_f3b5,
    0x3cae_147b,
    0x3d33_3333,
    0x3d87_ae15,
    0x3db5_c28f,
    0x3e20_0000,
    0x3e89_999a,
    0x3ec3_3333,
    0x3efc_cccd,
    0x3f1b_3334,
    0x3f38_0000,
    0x3f54_cccc,
    0x3f71_999a,
    0x3f80_0000,
];

/// A 16-entry table as `f32` values.
pub fn table_values(bits: &[u32; 16]) -> [f32; 16] {
    bits.map(f32::from_bits)
}

/// The two neighbours of a scaled value `s` in a sorted 16-entry table: `hi` is the first index
/// with `!(table[hi] < s)` (torch `searchsorted`, left side), clamped to 15, so NaN gives 15;
/// `lo = max(hi - 1, 0)`; `a = table[lo]`, `b = table[hi]`.
#[derive(Clone, Copy)]
pub(crate) struct Nb {
    /// Lower code.
    pub(crate) lo: Val<u32>,
    /// Upper code.
    pub(crate) hi: Val<u32>,
    /// `table[lo]`.
    pub(crate) a: Val<f32>,
    /// `table[hi]`.
    pub(crate) b: Val<f32>,
}

/// [`Nb`] of `s` in `table`: the count of the entries among the first 15 with `!(t >= s)`, by
/// binary search (the predicate is monotone in the index for a sorted table, always true for a
/// NaN `s`).
#[func]
pub(crate) fn neighbours(s: Val<f32>, table: Table<f32>) -> Nb {
    #[comptime]
    let mut pos = val(0u32);
    for step in [8u32, 4, 2, 1] {
        let idx = pos + comptime!(step - 1);
        let t = table[idx];
        let ge = t >= s;
        let take = !ge;
        let next = pos + step;
        pos = select(take, next, pos);
    }
    let hi = pos;
    let zero = val(0u32);
    let one = val(1u32);
    let positive = hi > zero;
    let dec = hi - one;
    let lo = select(positive, dec, zero);
    let a = table[lo];
    let bv = table[hi];
    Nb {
        lo: lo,
        hi: hi,
        a: a,
        b: bv,
    }
}

/// Round to nearest as adamw4bit: `lo` when `|s - a| < |b - s|`, otherwise `hi` (an exact tie
/// goes to the upper code; NaN gives `hi` = 15).
#[func]
pub(crate) fn rtn_code(s: Val<f32>, nb: Nb) -> Val<u32> {
    let d_lo = abs(s - nb.a);
    let d_hi = abs(nb.b - s);
    let take_lo = d_lo < d_hi;
    select(take_lo, nb.lo, nb.hi)
}

/// The `dyn4_nz` floor: code 0 becomes code 1.
#[func]
pub(crate) fn floor_code1(code: Val<u32>) -> Val<u32> {
    max(code, 1u32)
}

/// `clamp(p, 0, 1)` as torch: `min(max(p, 0), 1)` with a NaN `p` propagating.
#[func]
pub(crate) fn clamp01(p: Val<f32>) -> Val<f32> {
    let zero = val(0.0f32);
    let one = val(1.0f32);
    let p = max(p, zero);
    min(p, one)
}

/// `lo` when `u < p_lo`, otherwise `hi`.
#[func]
pub(crate) fn choose(u: Val<f32>, p_lo: Val<f32>, nb: Nb) -> Val<u32> {
    let take_lo = u < p_lo;
    select(take_lo, nb.lo, nb.hi)
}

/// Value-space stochastic rounding (`nf4_sr`): `P_lo = (b - s) / (b - a)`, 1 when `b - a <= 0`,
/// clamped to `[0, 1]`; code `lo` when `u < P_lo`.
#[func]
pub(crate) fn sr_value_code(s: Val<f32>, nb: Nb, u: Val<f32>) -> Val<u32> {
    let width = nb.b - nb.a;
    let num = nb.b - s;
    let p = num / width;
    let flat = width <= 0.0f32;
    let p = select(flat, 1.0f32, p);
    let p = clamp01(p);
    choose(u, p, nb)
}

/// The preconditioner of a normalized level `y`: `1 / (sqrt(max(absmax * y / c2, 0)) + eps)`.
#[func]
pub(crate) fn precond(y: Val<f32>, absmax: Val<f32>, c2: Val<f32>, eps: Val<f32>) -> Val<f32> {
    let v = absmax * y;
    let v = v / c2;
    let v = max(v, 0.0f32);
    let r = sqrt(v);
    let d = r + eps;
    1.0f32 / d
}

/// ZIP-SR (adamw4bit `dyn4_upd_sr_fp32read`): with `f` the preconditioner,
/// `P_lo = (f(s) - f(b)) / max(f(a) - f(b), 1e-30)`, 1 when `b - a <= 0` or `f(a) - f(b) <= 0`,
/// clamped to `[0, 1]`; code `lo` when `u < P_lo`.
#[func]
pub(crate) fn sr_precond_code(
    s: Val<f32>,
    nb: Nb,
    u: Val<f32>,
    absmax: Val<f32>,
    c2: Val<f32>,
    eps: Val<f32>,
) -> Val<u32> {
    let fs = precond(s, absmax, c2, eps);
    let fa = precond(nb.a, absmax, c2, eps);
    let fb = precond(nb.b, absmax, c2, eps);
    let num = fs - fb;
    let den = fa - fb;
    let den_c = max(den, 1e-30f32);
    let p = num / den_c;
    let zero = val(0.0f32);
    let width = nb.b - nb.a;
    let flat = width <= zero;
    let flat_f = den <= zero;
    let flat = flat || flat_f;
    let p = select(flat, 1.0f32, p);
    let p = clamp01(p);
    choose(u, p, nb)
}

/// The 8-bit linear code of a scaled value `s`: `round_half_even(clamp(s * 127, -127, 127))`
/// (NaN gives 0).
#[func]
pub(crate) fn lin8_code(s: Val<f32>) -> Val<i32> {
    let k = val(127.0f32);
    let q = s * k;
    let q = max(q, comptime!(-127.0f32));
    let q = min(q, k);
    q.to_i32(Rounding::NearestEven)
}

/// The value of an 8-bit linear code before scaling: `f32(code) / 127`.
#[func]
pub(crate) fn lin8_value(code: Val<i32>) -> Val<f32> {
    let f = code.to_f32();
    f / 127.0f32
}

/// `acc = acc (max) |x|` with NaN propagating (torch `amax`): a NaN `x` or a NaN `acc` stays.
#[func]
pub(crate) fn absmax_nan_step(acc: Var<f32>, x: Val<f32>) {
    let a = abs(x);
    let cur = acc;
    let gt = a > cur;
    let nan = a != a;
    let take = gt || nan;
    acc = select(take, a, cur);
}

/// Lanes of torch's AVX2 float vector (the EDEN summation order).
pub(crate) const EDEN_LANES: u32 = 8;
/// Vector accumulators of torch's AVX2 sum (the EDEN summation order).
pub(crate) const EDEN_ACCS: u32 = 4;
/// Vectors added into each accumulator over a 128-element block.
pub(crate) const EDEN_ROUNDS: u32 = 4;
