//! The quantizers of the 4-bit AdamW state ([`crate::optim4`]), as IR emitters: the
//! adamw4bit round-to-nearest search (ties to the upper code), the `dyn4_nz` floor, value-space
//! and preconditioner-space stochastic rounding (ZIP-SR), the 8-bit linear code and the EDEN
//! scale sums in torch's AVX2 summation order. The tables are the reference library's float32
//! bit patterns. Every formula, with its source, is in `docs/optimizers.md` ("4-bit AdamW").

use crate::emit::count_prefix;
use qforge_ir::CmpOp;
use qforge_ir::KernelBuilder;
use qforge_ir::{Rounding, ScalarType};
use qforge_ir::{TableId, Value, VarId};

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
/// `lo = max(hi - 1, 0)`. Returns `(lo, hi, table[lo], table[hi])`.
pub(crate) struct Neighbours {
    /// Lower code (`u32`).
    pub(crate) lo: Value,
    /// Upper code (`u32`).
    pub(crate) hi: Value,
    /// `table[lo]`.
    pub(crate) a: Value,
    /// `table[hi]`.
    pub(crate) b: Value,
}

/// [`Neighbours`] of `s` in `table`.
pub(crate) fn neighbours(b: &mut KernelBuilder, s: Value, table: TableId) -> Neighbours {
    // Counting the entries among the first 15 with `!(t >= s)` is `min(#{k: !(t_k >= s)}, 15)`
    // because the predicate is monotone in k for a sorted table (always true for a NaN `s`).
    let hi = count_prefix(b, &[8, 4, 2, 1], |b, idx| {
        let t = b.lookup(table, idx);
        let ge = b.cmp(CmpOp::Ge, t, s);
        b.not(ge)
    });
    let zero = b.const_u32(0);
    let one = b.const_u32(1);
    let pos = b.cmp(CmpOp::Gt, hi, zero);
    let dec = b.sub(hi, one);
    let lo = b.select(pos, dec, zero);
    let a = b.lookup(table, lo);
    let bv = b.lookup(table, hi);
    Neighbours { lo, hi, a, b: bv }
}

/// Round to nearest as adamw4bit: `lo` when `|s - a| < |b - s|`, otherwise `hi` (an exact tie
/// goes to the upper code; NaN gives `hi` = 15).
pub(crate) fn rtn_code(b: &mut KernelBuilder, s: Value, nb: &Neighbours) -> Value {
    let d_lo = b.sub(s, nb.a);
    let d_lo = b.abs(d_lo);
    let d_hi = b.sub(nb.b, s);
    let d_hi = b.abs(d_hi);
    let take_lo = b.cmp(CmpOp::Lt, d_lo, d_hi);
    b.select(take_lo, nb.lo, nb.hi)
}

/// The `dyn4_nz` floor: code 0 becomes code 1 (no value in a block reads back as zero).
pub(crate) fn floor_code1(b: &mut KernelBuilder, code: Value) -> Value {
    let one = b.const_u32(1);
    b.max(code, one)
}

/// `clamp(p, 0, 1)` as torch: `min(max(p, 0), 1)` with a NaN `p` propagating.
fn clamp01(b: &mut KernelBuilder, p: Value) -> Value {
    let zero = b.const_f32(0.0);
    let one = b.const_f32(1.0);
    let p = b.max(p, zero);
    b.min(p, one)
}

/// `lo` when `u < p_lo`, otherwise `hi`.
fn choose(b: &mut KernelBuilder, u: Value, p_lo: Value, nb: &Neighbours) -> Value {
    let take_lo = b.cmp(CmpOp::Lt, u, p_lo);
    b.select(take_lo, nb.lo, nb.hi)
}

/// Value-space stochastic rounding (`nf4_sr`): `P_lo = (b - s) / (b - a)`, set to 1 when
/// `b - a <= 0`, clamped to `[0, 1]`; code `lo` when `u < P_lo`. `E[table[code]] = s` for `s`
/// inside the table's range.
pub(crate) fn sr_value_code(b: &mut KernelBuilder, s: Value, nb: &Neighbours, u: Value) -> Value {
    let width = b.sub(nb.b, nb.a);
    let num = b.sub(nb.b, s);
    let p = b.div(num, width);
    let zero = b.const_f32(0.0);
    let flat = b.cmp(CmpOp::Le, width, zero);
    let one = b.const_f32(1.0);
    let p = b.select(flat, one, p);
    let p = clamp01(b, p);
    choose(b, u, p, nb)
}

/// The preconditioner of a normalized level `y`: `1 / (sqrt(max(absmax * y / c2, 0)) + eps)`.
fn precond(b: &mut KernelBuilder, y: Value, absmax: Value, c2: Value, eps: Value) -> Value {
    let v = b.mul(absmax, y);
    let v = b.div(v, c2);
    let zero = b.const_f32(0.0);
    let v = b.max(v, zero);
    let r = b.sqrt(v);
    let d = b.add(r, eps);
    let one = b.const_f32(1.0);
    b.div(one, d)
}

/// ZIP-SR (adamw4bit `dyn4_upd_sr_fp32read`): stochastic rounding in preconditioner space.
/// With `f` the preconditioner, `P_lo = (f(s) - f(b)) / max(f(a) - f(b), 1e-30)`, set to 1 when
/// `b - a <= 0` or `f(a) - f(b) <= 0`, clamped to `[0, 1]`; code `lo` when `u < P_lo`. Then
/// `E[f(table[code])] = f(s)`: the preconditioner is unbiased.
pub(crate) struct Precond {
    /// The block's (floored) absmax.
    pub(crate) absmax: Value,
    /// `f32(1 - beta2^t)`.
    pub(crate) c2: Value,
    /// `f32(eps)`.
    pub(crate) eps: Value,
}

/// See [`Precond`].
pub(crate) fn sr_precond_code(
    b: &mut KernelBuilder,
    s: Value,
    nb: &Neighbours,
    u: Value,
    pc: &Precond,
) -> Value {
    let fs = precond(b, s, pc.absmax, pc.c2, pc.eps);
    let fa = precond(b, nb.a, pc.absmax, pc.c2, pc.eps);
    let fb = precond(b, nb.b, pc.absmax, pc.c2, pc.eps);
    let num = b.sub(fs, fb);
    let den = b.sub(fa, fb);
    let tiny = b.const_f32(1e-30);
    let den_c = b.max(den, tiny);
    let p = b.div(num, den_c);
    let zero = b.const_f32(0.0);
    let width = b.sub(nb.b, nb.a);
    let flat = b.cmp(CmpOp::Le, width, zero);
    let flat_f = b.cmp(CmpOp::Le, den, zero);
    let flat = b.or(flat, flat_f);
    let one = b.const_f32(1.0);
    let p = b.select(flat, one, p);
    let p = clamp01(b, p);
    choose(b, u, p, nb)
}

/// The 8-bit linear code of a scaled value `s`: `round_half_even(clamp(s * 127, -127, 127))`
/// as `i32` (NaN gives 0).
pub(crate) fn lin8_code(b: &mut KernelBuilder, s: Value) -> Value {
    let k = b.const_f32(127.0);
    let q = b.mul(s, k);
    let lo = b.const_f32(-127.0);
    let q = b.max(q, lo);
    let q = b.min(q, k);
    b.float_to_int(q, ScalarType::I32, Rounding::NearestEven)
}

/// The value of an 8-bit linear code (`i32`) before scaling: `f32(code) / 127`.
pub(crate) fn lin8_value(b: &mut KernelBuilder, code: Value) -> Value {
    let f = b.int_to_float(code);
    let k = b.const_f32(127.0);
    b.div(f, k)
}

/// `acc = acc (max) |x|` with NaN propagating (torch `amax`): a NaN `x` or a NaN `acc` stays.
pub(crate) fn absmax_step(b: &mut KernelBuilder, acc: VarId, x: Value) {
    let a = b.abs(x);
    let cur = b.read_var(acc);
    let gt = b.cmp(CmpOp::Gt, a, cur);
    let nan = b.cmp(CmpOp::Ne, a, a);
    let take = b.or(gt, nan);
    let next = b.select(take, a, cur);
    b.assign(acc, next);
}

/// Lanes of torch's AVX2 float vector (the EDEN summation order).
pub(crate) const EDEN_LANES: u32 = 8;
/// Vector accumulators of torch's AVX2 sum (the EDEN summation order).
pub(crate) const EDEN_ACCS: u32 = 4;
/// Vectors added into each accumulator over a 128-element block.
pub(crate) const EDEN_ROUNDS: u32 = 4;

/// Emits the two EDEN sums of one 128-element block in torch's AVX2 order: with `x_i` the
/// terms of the block (`i` in `0..128`), vector `j` = terms `8j..8j+8`,
/// `A_k = ((v_k + v_{k+4}) + v_{k+8}) + v_{k+12}` lane-wise (`k` in `0..4`),
/// `P = ((A_0 + A_1) + A_2) + A_3` and the total `((P[0] + P[1]) + ...) + P[7]`.
///
/// `terms(b, i)` emits the terms of block element `i` (a `u32` value) and returns
/// `(present, x, y)`: two sums are computed at once, and an absent element (`present` false,
/// past the end of the tensor) adds `-0.0`, the identity. Every partial starts at `-0.0`, so the
/// first addition is exact and the result is the formula above. Returns `(sum x, sum y)`.
pub(crate) fn eden_sums(
    b: &mut KernelBuilder,
    vars: [VarId; 6],
    terms: impl Fn(&mut KernelBuilder, Value) -> (Value, Value, Value),
) -> (Value, Value) {
    let [tot_x, tot_y, p_x, p_y, a_x, a_y] = vars;
    let neg0 = b.const_f32(-0.0);
    b.assign(tot_x, neg0);
    b.assign(tot_y, neg0);
    let zero = b.const_u32(0);
    let lanes = b.const_u32(EDEN_LANES);
    b.for_range(zero, lanes, 1, |b, lane| {
        let neg0 = b.const_f32(-0.0);
        b.assign(p_x, neg0);
        b.assign(p_y, neg0);
        let zero = b.const_u32(0);
        let accs = b.const_u32(EDEN_ACCS);
        b.for_range(zero, accs, 1, |b, k| {
            let neg0 = b.const_f32(-0.0);
            b.assign(a_x, neg0);
            b.assign(a_y, neg0);
            let zero = b.const_u32(0);
            let rounds = b.const_u32(EDEN_ROUNDS);
            b.for_range(zero, rounds, 1, |b, r| {
                // i = 8 * (k + 4 r) + lane
                let four = b.const_u32(EDEN_ACCS);
                let r4 = b.mul(r, four);
                let j = b.add(k, r4);
                let eight = b.const_u32(EDEN_LANES);
                let j8 = b.mul(j, eight);
                let i = b.add(j8, lane);
                let (present, x, y) = terms(b, i);
                let neg0 = b.const_f32(-0.0);
                for (acc, t) in [(a_x, x), (a_y, y)] {
                    let t = b.select(present, t, neg0);
                    let cur = b.read_var(acc);
                    let s = b.add(cur, t);
                    b.assign(acc, s);
                }
            });
            for (p, a) in [(p_x, a_x), (p_y, a_y)] {
                let cur = b.read_var(p);
                let av = b.read_var(a);
                let s = b.add(cur, av);
                b.assign(p, s);
            }
        });
        for (t, p) in [(tot_x, p_x), (tot_y, p_y)] {
            let cur = b.read_var(t);
            let pv = b.read_var(p);
            let s = b.add(cur, pv);
            b.assign(t, s);
        }
    });
    let sx = b.read_var(tot_x);
    let sy = b.read_var(tot_y);
    (sx, sy)
}

/// The two EDEN sums of one *full* 128-element block in the same order as [`eden_sums`],
/// assigned to `tot_x` and `tot_y`, written so that a vectorizing backend runs the lanes
/// together: one straight-line iteration per lane `l` of torch's vector computes
/// `A_k = (((-0 + x_{8k+l}) + x_{8(k+4)+l}) + x_{8(k+8)+l}) + x_{8(k+12)+l}` for each `k`, then
/// `P = (((-0 + A_0) + A_1) + A_2) + A_3`, and adds it to the total (`tot = tot + P`, lanes in
/// order from `-0.0`). `terms(b, i)` returns `(x, y)` of block element `i`.
pub(crate) fn eden_sums_lanes(
    b: &mut KernelBuilder,
    [tot_x, tot_y]: [VarId; 2],
    terms: impl Fn(&mut KernelBuilder, Value) -> (Value, Value),
) {
    let neg0 = b.const_f32(-0.0);
    b.assign(tot_x, neg0);
    b.assign(tot_y, neg0);
    let zero = b.const_u32(0);
    let lanes = b.const_u32(EDEN_LANES);
    b.for_range(zero, lanes, 1, |b, lane| {
        let neg0 = b.const_f32(-0.0);
        let mut p = [neg0, neg0];
        for k in 0..EDEN_ACCS {
            let mut a = [neg0, neg0];
            for r in 0..EDEN_ROUNDS {
                let off = b.const_u32(EDEN_LANES * (k + EDEN_ACCS * r));
                let i = b.add(lane, off);
                let (x, y) = terms(b, i);
                a = [b.add(a[0], x), b.add(a[1], y)];
            }
            p = [b.add(p[0], a[0]), b.add(p[1], a[1])];
        }
        for (t, pv) in [(tot_x, p[0]), (tot_y, p[1])] {
            let cur = b.read_var(t);
            let s = b.add(cur, pv);
            b.assign(t, s);
        }
    });
}
