//! Exact `f32` division, square root and fused multiply-add, the conversions between integers
//! and `f32`, and integer division and remainder, from `i32` lane ops (`docs/backends/mosaic.md`, rules 8 and 9): how a
//! TPU rounds `arith.divf`, `math.sqrt`, `math.fma`, `arith.fptosi` and `arith.sitofp` is not
//! documented (and its vector unit may flush subnormals), and it has no `f64`, so each is
//! computed as the WGSL backend's soft routines (`crate::wgsl`'s `qf_div`, `qf_sqrt`,
//! `qf_fma`) do, branch-free: the specials on the bits, the significands' integer arithmetic
//! (long division, digit-by-digit square root, a 64-bit product and sum in two `i32` lanes),
//! one rounding with gradual underflow. Integer `div` and `rem` are a restoring long division
//! of the magnitudes, as `arith.divui` on a TPU is not documented either and divides by zero
//! into poison. Every lane computes every case and selects; no shift amount reaches 32.

use qforge_ir::Rounding;

use super::lowering::Lowering;
use super::tile::{Bin, Elt, Pred, VOp};

/// `i32` lane constants for signed exponents.
const fn s(v: i32) -> u32 {
    v as u32
}

impl Lowering<'_> {
    /// A finite nonzero magnitude `a` (the bits without the sign) as `m * 2^(e - 23)` with
    /// `m` in `[2^23, 2^24)`: `(m, e)`. A subnormal's highest set bit `p` is found in five
    /// halving steps and shifted to bit 23 (`e = p - 149`). Garbage for `a = 0` and for
    /// infinities and NaNs, which the caller selects away.
    fn float_parts(&mut self, a: usize) -> (usize, usize) {
        let shape = self.node_shape(a);
        let be = self.int_c(Bin::ShrU, a, 23);
        let mut p = self.konst(0, Elt::I32, shape);
        let mut t = a;
        for step in [16u32, 8, 4, 2, 1] {
            let big = self.cmp_c(Pred::Uge, t, 1 << step);
            let p_up = self.int_c(Bin::AddI, p, step);
            p = self.select_i(big, p_up, p);
            let t_down = self.int_c(Bin::ShrU, t, step);
            t = self.select_i(big, t_down, t);
        }
        let is_sub = self.cmp_c(Pred::Eq, be, 0);
        // The shift is `23 - p` only where `p < 23` (subnormals), else 0: never past 31.
        let c23 = self.konst(23, Elt::I32, shape);
        let up = self.int(Bin::SubI, c23, p);
        let zero = self.konst(0, Elt::I32, shape);
        let up = self.select_i(is_sub, up, zero);
        let sub_m = self.int(Bin::Shl, a, up);
        let sub_e = self.int_c(Bin::SubI, p, 149);
        let frac = self.int_c(Bin::AndI, a, 0x7f_ffff);
        let norm_m = self.int_c(Bin::OrI, frac, 0x80_0000);
        let norm_e = self.int_c(Bin::SubI, be, 127);
        (
            self.select_i(is_sub, sub_m, norm_m),
            self.select_i(is_sub, sub_e, norm_e),
        )
    }

    /// `m >> shift` (`shift` in `1..=31`) rounded to nearest even by the bits shifted out and
    /// `sticky` (an `i1` node: nonzero bits lie below them; none where `None`).
    pub(super) fn shift_round_even(
        &mut self,
        m: usize,
        shift: usize,
        sticky: Option<usize>,
    ) -> usize {
        let shape = self.node_shape(m).max(self.node_shape(shift));
        let q = self.int(Bin::ShrU, m, shift);
        let one = self.konst(1, Elt::I32, shape);
        let unit = self.int(Bin::Shl, one, shift);
        let low = self.int_c(Bin::SubI, unit, 1);
        let rest = self.int(Bin::AndI, m, low);
        let shift_1 = self.int_c(Bin::SubI, shift, 1);
        let half = self.int(Bin::Shl, one, shift_1);
        let above = self.push(VOp::Cmp(Pred::Ugt, rest, half), shape, Elt::I1);
        let tie = self.push(VOp::Cmp(Pred::Eq, rest, half), shape, Elt::I1);
        let q_odd = self.int_c(Bin::AndI, q, 1);
        let mut tie_breaks = self.cmp_c(Pred::Ne, q_odd, 0);
        if let Some(sticky) = sticky {
            tie_breaks = self.push(VOp::Bin(Bin::OrI, sticky, tie_breaks), shape, Elt::I1);
        }
        let tie_up = self.push(VOp::Bin(Bin::AndI, tie, tie_breaks), shape, Elt::I1);
        let up = self.push(VOp::Bin(Bin::OrI, above, tie_up), shape, Elt::I1);
        let inc = self.bool_to_int(up);
        self.int(Bin::AddI, q, inc)
    }

    /// The `f32` bits nearest to `(-1)^s * (m + f) * 2^(e - 31)`, `s` the sign bit in place,
    /// `m >= 2^31` and `f` in `[0, 1)` nonzero exactly where `sticky` (`i1`): ties to even,
    /// overflow to infinity, gradual underflow to subnormals and signed zero (`qf_round`).
    fn round_parts(&mut self, sign: usize, e: usize, m: usize, sticky: usize) -> usize {
        let shape = self.node_shape(m);
        // Normal results drop 8 bits; subnormal ones `-118 - e` (9..=31 for e in -149..=-127).
        let normal = self.cmp_c(Pred::Sge, e, s(-126));
        let c_118 = self.konst(s(-118), Elt::I32, shape);
        let sub_shift = self.int(Bin::SubI, c_118, e);
        let in_range = self.cmp_c(Pred::Ule, sub_shift, 31);
        let eight = self.konst(8, Elt::I32, shape);
        let sub_shift = self.select_i(in_range, sub_shift, eight);
        let shift = self.select_i(normal, eight, sub_shift);
        let base = self.int_c(Bin::AddI, e, 126);
        let base = self.int_c(Bin::Shl, base, 23);
        let zero = self.konst(0, Elt::I32, shape);
        let base = self.select_i(normal, base, zero);
        let rounded = self.shift_round_even(m, shift, Some(sticky));
        let bits = self.int(Bin::AddI, base, rounded);
        let finite = self.int(Bin::OrI, sign, bits);
        // e = -150: half the smallest subnormal, up only above the tie; below: a signed zero.
        let c31 = self.konst(0x8000_0000, Elt::I32, shape);
        let past_half = self.push(VOp::Cmp(Pred::Ugt, m, c31), shape, Elt::I1);
        let at_half = self.push(VOp::Cmp(Pred::Eq, m, c31), shape, Elt::I1);
        let at_half = self.push(VOp::Bin(Bin::AndI, at_half, sticky), shape, Elt::I1);
        let half_up = self.push(VOp::Bin(Bin::OrI, past_half, at_half), shape, Elt::I1);
        let least = self.bool_to_int(half_up);
        let least = self.int(Bin::OrI, sign, least);
        let at_150 = self.cmp_c(Pred::Eq, e, s(-150));
        let tiny = self.select_i(at_150, least, sign);
        let inf = self.int_c(Bin::OrI, sign, 0x7f80_0000);
        let huge = self.cmp_c(Pred::Sgt, e, 127);
        let small = self.cmp_c(Pred::Slt, e, s(-149));
        let r = self.select_i(small, tiny, finite);
        self.select_i(huge, inf, r)
    }

    /// `x / y` for `f32` nodes, correctly rounded (the interpreter's IEEE division; a NaN
    /// result is the quiet NaN `0x7fc00000`).
    pub(super) fn div_f32(&mut self, x: usize, y: usize) -> usize {
        let shape = self.node_shape(x).max(self.node_shape(y));
        let a = self.push(VOp::Bitcast(x, Elt::I32), shape, Elt::I32);
        let b = self.push(VOp::Bitcast(y, Elt::I32), shape, Elt::I32);
        let sign = self.int(Bin::XorI, a, b);
        let sign = self.int_c(Bin::AndI, sign, 0x8000_0000);
        let ma = self.int_c(Bin::AndI, a, 0x7fff_ffff);
        let mb = self.int_c(Bin::AndI, b, 0x7fff_ffff);
        let (pa, ea) = self.float_parts(ma);
        let (pb, eb) = self.float_parts(mb);
        // Scale the dividend so the quotient's first bit is 1.
        let small = self.push(VOp::Cmp(Pred::Ult, pa, pb), shape, Elt::I1);
        let doubled = self.int_c(Bin::Shl, pa, 1);
        let mut r = self.select_i(small, doubled, pa);
        let e = self.int(Bin::SubI, ea, eb);
        let e_less = self.int_c(Bin::SubI, e, 1);
        let e = self.select_i(small, e_less, e);
        let mut q = self.konst(0, Elt::I32, shape);
        for _ in 0..25 {
            let fits = self.push(VOp::Cmp(Pred::Uge, r, pb), shape, Elt::I1);
            let less = self.int(Bin::SubI, r, pb);
            r = self.select_i(fits, less, r);
            let q2 = self.int_c(Bin::Shl, q, 1);
            let q1 = self.int_c(Bin::OrI, q2, 1);
            q = self.select_i(fits, q1, q2);
            r = self.int_c(Bin::Shl, r, 1);
        }
        let m = self.int_c(Bin::Shl, q, 7);
        let sticky = self.cmp_c(Pred::Ne, r, 0);
        let general = self.round_parts(sign, e, m, sticky);
        // Specials: a NaN operand, 0/0 and inf/inf give NaN; inf/y and x/0 a signed
        // infinity; 0/y and x/inf a signed zero.
        let inf = 0x7f80_0000;
        let a_nan = self.cmp_c(Pred::Ugt, ma, inf);
        let b_nan = self.cmp_c(Pred::Ugt, mb, inf);
        let same = self.push(VOp::Cmp(Pred::Eq, ma, mb), shape, Elt::I1);
        let a_zero = self.cmp_c(Pred::Eq, ma, 0);
        let a_inf = self.cmp_c(Pred::Eq, ma, inf);
        let b_zero = self.cmp_c(Pred::Eq, mb, 0);
        let b_inf = self.cmp_c(Pred::Eq, mb, inf);
        let zero_or_inf = self.push(VOp::Bin(Bin::OrI, a_zero, a_inf), shape, Elt::I1);
        let both = self.push(VOp::Bin(Bin::AndI, same, zero_or_inf), shape, Elt::I1);
        let nan = self.push(VOp::Bin(Bin::OrI, a_nan, b_nan), shape, Elt::I1);
        let nan = self.push(VOp::Bin(Bin::OrI, nan, both), shape, Elt::I1);
        let to_inf = self.push(VOp::Bin(Bin::OrI, a_inf, b_zero), shape, Elt::I1);
        let to_zero = self.push(VOp::Bin(Bin::OrI, a_zero, b_inf), shape, Elt::I1);
        let signed_inf = self.int_c(Bin::OrI, sign, inf);
        let quiet = self.konst(0x7fc0_0000, Elt::I32, shape);
        let r = self.select_i(to_zero, sign, general);
        let r = self.select_i(to_inf, signed_inf, r);
        let r = self.select_i(nan, quiet, r);
        self.push(VOp::Bitcast(r, Elt::F32), shape, Elt::F32)
    }
}

/// A 64-bit integer as two `i32` lane nodes, high word first.
#[derive(Clone, Copy)]
struct Wide {
    hi: usize,
    lo: usize,
}

impl Lowering<'_> {
    /// Leading zeros of the `i32` lanes of `x`, read as `u32` (32 for 0), in five halving
    /// steps.
    fn clz32(&mut self, x: usize) -> usize {
        let shape = self.node_shape(x);
        let mut n = self.konst(0, Elt::I32, shape);
        let mut t = x;
        for step in [16u32, 8, 4, 2, 1] {
            let high_clear = self.cmp_c(Pred::Ult, t, 1 << (32 - step));
            let n_up = self.int_c(Bin::AddI, n, step);
            n = self.select_i(high_clear, n_up, n);
            let t_up = self.int_c(Bin::Shl, t, step);
            t = self.select_i(high_clear, t_up, t);
        }
        let top_clear = self.cmp_c(Pred::Ult, t, 0x8000_0000);
        let n_up = self.int_c(Bin::AddI, n, 1);
        self.select_i(top_clear, n_up, n)
    }

    fn is_nonzero(&mut self, x: usize) -> usize {
        self.cmp_c(Pred::Ne, x, 0)
    }

    fn bool_to_int(&mut self, b: usize) -> usize {
        let shape = self.node_shape(b);
        let one = self.konst(1, Elt::I32, shape);
        let zero = self.konst(0, Elt::I32, shape);
        self.select_i(b, one, zero)
    }

    /// `x << s` for `s` in `0 ..= 63`.
    fn shl64(&mut self, x: Wide, s: usize) -> Wide {
        let s1 = self.int_c(Bin::AndI, s, 31);
        let c32 = self.konst(32, Elt::I32, self.node_shape(s));
        let back = self.int(Bin::SubI, c32, s1);
        let back = self.int_c(Bin::AndI, back, 31);
        let carried = self.int(Bin::ShrU, x.lo, back);
        let none = self.konst(0, Elt::I32, self.node_shape(s));
        let s_zero = self.cmp_c(Pred::Eq, s1, 0);
        let carried = self.select_i(s_zero, none, carried);
        let hi = self.int(Bin::Shl, x.hi, s1);
        let hi = self.int(Bin::OrI, hi, carried);
        let lo = self.int(Bin::Shl, x.lo, s1);
        let far = self.cmp_c(Pred::Uge, s, 32);
        Wide {
            hi: self.select_i(far, lo, hi),
            lo: self.select_i(far, none, lo),
        }
    }

    /// `x >> s` for any `s` (`u32`), the bits shifted out ORed into bit 0 (`qf_shr64_jam`).
    fn shr64_jam(&mut self, x: Wide, s: usize) -> Wide {
        let shape = self.node_shape(s);
        let none = self.konst(0, Elt::I32, shape);
        let s1 = self.int_c(Bin::AndI, s, 31);
        let unit = self.konst(1, Elt::I32, shape);
        let mask = self.int(Bin::Shl, unit, s1);
        let mask = self.int_c(Bin::SubI, mask, 1);
        let c32 = self.konst(32, Elt::I32, shape);
        let back = self.int(Bin::SubI, c32, s1);
        let back = self.int_c(Bin::AndI, back, 31);
        let s_zero = self.cmp_c(Pred::Eq, s1, 0);
        // s < 32.
        let near_hi = self.int(Bin::ShrU, x.hi, s1);
        let moved = self.int(Bin::Shl, x.hi, back);
        let moved = self.select_i(s_zero, none, moved);
        let lo_lost = self.int(Bin::AndI, x.lo, mask);
        let lo_lost = self.is_nonzero(lo_lost);
        let lo_lost = self.bool_to_int(lo_lost);
        let near_lo = self.int(Bin::ShrU, x.lo, s1);
        let near_lo = self.int(Bin::OrI, near_lo, moved);
        let near_lo = self.int(Bin::OrI, near_lo, lo_lost);
        // 32 <= s < 64.
        let hi_lost = self.int(Bin::AndI, x.hi, mask);
        let hi_lost = self.is_nonzero(hi_lost);
        let lo_any = self.is_nonzero(x.lo);
        let lost = self.push(VOp::Bin(Bin::OrI, hi_lost, lo_any), shape, Elt::I1);
        let lost = self.bool_to_int(lost);
        let mid_lo = self.int(Bin::ShrU, x.hi, s1);
        let mid_lo = self.int(Bin::OrI, mid_lo, lost);
        // s >= 64.
        let any = self.int(Bin::OrI, x.hi, x.lo);
        let any = self.is_nonzero(any);
        let far_lo = self.bool_to_int(any);
        let below_32 = self.cmp_c(Pred::Ult, s, 32);
        let below_64 = self.cmp_c(Pred::Ult, s, 64);
        let lo = self.select_i(below_64, mid_lo, far_lo);
        Wide {
            hi: self.select_i(below_32, near_hi, none),
            lo: self.select_i(below_32, near_lo, lo),
        }
    }

    /// Leading zeros of a 64-bit value.
    fn clz64(&mut self, x: Wide) -> usize {
        let high = self.clz32(x.hi);
        let low = self.clz32(x.lo);
        let low = self.int_c(Bin::AddI, low, 32);
        let hi_zero = self.cmp_c(Pred::Eq, x.hi, 0);
        self.select_i(hi_zero, low, high)
    }

    /// `fma(x, y, z)` for `f32` nodes: `x * y + z` rounded once to nearest even, as the WGSL
    /// backend's `qf_fma`: specials on the bits (a NaN operand, `inf * 0` and `inf - inf` give
    /// the quiet NaN; an exact zero product plus a zero is `-0` only when both are), otherwise
    /// the exact 48-bit product of the significands (16-bit limbs) and the addend as 64-bit
    /// integers (two `i32` lanes) with their leading bit at bit 61, the smaller shifted right
    /// with the lost bits jammed into bit 0, added or subtracted exactly (an exact zero
    /// difference is `+0`), normalized and rounded once.
    pub(super) fn fma_f32(&mut self, x: usize, y: usize, z: usize) -> usize {
        let shape = self
            .node_shape(x)
            .max(self.node_shape(y))
            .max(self.node_shape(z));
        let a = self.push(VOp::Bitcast(x, Elt::I32), shape, Elt::I32);
        let b = self.push(VOp::Bitcast(y, Elt::I32), shape, Elt::I32);
        let c = self.push(VOp::Bitcast(z, Elt::I32), shape, Elt::I32);
        let ma = self.int_c(Bin::AndI, a, 0x7fff_ffff);
        let mb = self.int_c(Bin::AndI, b, 0x7fff_ffff);
        let mc = self.int_c(Bin::AndI, c, 0x7fff_ffff);
        let sp = self.int(Bin::XorI, a, b);
        let sp = self.int_c(Bin::AndI, sp, 0x8000_0000);
        let sc = self.int_c(Bin::AndI, c, 0x8000_0000);
        let (pa, ea) = self.float_parts(ma);
        let (pb, eb) = self.float_parts(mb);
        let (pc, ec) = self.float_parts(mc);
        // The product's 48 bits: pa * pb with 16-bit limbs.
        let a1 = self.int_c(Bin::ShrU, pa, 16);
        let a0 = self.int_c(Bin::AndI, pa, 0xffff);
        let b1 = self.int_c(Bin::ShrU, pb, 16);
        let b0 = self.int_c(Bin::AndI, pb, 0xffff);
        let lo = self.int(Bin::MulI, a0, b0);
        let m1 = self.int(Bin::MulI, a1, b0);
        let m2 = self.int(Bin::MulI, a0, b1);
        let mid = self.int(Bin::AddI, m1, m2);
        let mid_lo = self.int_c(Bin::Shl, mid, 16);
        let plo = self.int(Bin::AddI, lo, mid_lo);
        let carry = self.push(VOp::Cmp(Pred::Ult, plo, lo), shape, Elt::I1);
        let carry = self.bool_to_int(carry);
        let phi = self.int(Bin::MulI, a1, b1);
        let mid_hi = self.int_c(Bin::ShrU, mid, 16);
        let phi = self.int(Bin::AddI, phi, mid_hi);
        let phi = self.int(Bin::AddI, phi, carry);
        let product = Wide { hi: phi, lo: plo };
        let lzp = self.clz64(product);
        let lzp = self.int_c(Bin::SubI, lzp, 2);
        let big = self.shl64(product, lzp);
        let fb = self.int(Bin::AddI, ea, eb);
        let fb = self.int_c(Bin::SubI, fb, 46);
        let fb = self.int(Bin::SubI, fb, lzp);
        // The addend at bit 61 (zero where `z` is zero: then the sum is the product).
        let c_zero = self.cmp_c(Pred::Eq, mc, 0);
        let none = self.konst(0, Elt::I32, shape);
        let shifted = self.int_c(Bin::Shl, pc, 6);
        let small_hi = self.select_i(c_zero, none, shifted);
        let small = Wide {
            hi: small_hi,
            lo: none,
        };
        let fs = self.int_c(Bin::SubI, ec, 61);
        // The larger magnitude first (never swapped past a zero addend).
        let exp_above = self.push(VOp::Cmp(Pred::Sgt, fs, fb), shape, Elt::I1);
        let exp_same = self.push(VOp::Cmp(Pred::Eq, fs, fb), shape, Elt::I1);
        let hi_above = self.push(VOp::Cmp(Pred::Ugt, small.hi, big.hi), shape, Elt::I1);
        let same_and_above = self.push(VOp::Bin(Bin::AndI, exp_same, hi_above), shape, Elt::I1);
        let swap = self.push(
            VOp::Bin(Bin::OrI, exp_above, same_and_above),
            shape,
            Elt::I1,
        );
        let c_nonzero = self.is_nonzero(mc);
        let swap = self.push(VOp::Bin(Bin::AndI, swap, c_nonzero), shape, Elt::I1);
        let top = Wide {
            hi: self.select_i(swap, small.hi, big.hi),
            lo: self.select_i(swap, small.lo, big.lo),
        };
        let under = Wide {
            hi: self.select_i(swap, big.hi, small.hi),
            lo: self.select_i(swap, big.lo, small.lo),
        };
        let f_top = self.select_i(swap, fs, fb);
        let f_under = self.select_i(swap, fb, fs);
        let s_top = self.select_i(swap, sc, sp);
        let s_under = self.select_i(swap, sp, sc);
        let gap = self.int(Bin::SubI, f_top, f_under);
        let under = self.shr64_jam(under, gap);
        // Add or subtract exactly.
        let add_lo = self.int(Bin::AddI, top.lo, under.lo);
        let add_carry = self.push(VOp::Cmp(Pred::Ult, add_lo, top.lo), shape, Elt::I1);
        let add_carry = self.bool_to_int(add_carry);
        let add_hi = self.int(Bin::AddI, top.hi, under.hi);
        let add_hi = self.int(Bin::AddI, add_hi, add_carry);
        let sub_lo = self.int(Bin::SubI, top.lo, under.lo);
        let borrow = self.push(VOp::Cmp(Pred::Ult, top.lo, under.lo), shape, Elt::I1);
        let borrow = self.bool_to_int(borrow);
        let sub_hi = self.int(Bin::SubI, top.hi, under.hi);
        let sub_hi = self.int(Bin::SubI, sub_hi, borrow);
        let same_sign = self.push(VOp::Cmp(Pred::Eq, s_top, s_under), shape, Elt::I1);
        let sum = Wide {
            hi: self.select_i(same_sign, add_hi, sub_hi),
            lo: self.select_i(same_sign, add_lo, sub_lo),
        };
        let lz = self.clz64(sum);
        // A zero sum gives lz = 64: any shift in range, the result selected away below.
        let lz_safe = self.int_c(Bin::AndI, lz, 63);
        let n = self.shl64(sum, lz_safe);
        let e = self.int(Bin::SubI, f_top, lz);
        let e = self.int_c(Bin::AddI, e, 63);
        let sticky = self.is_nonzero(n.lo);
        let general = self.round_parts(s_top, e, n.hi, sticky);
        let sum_any = self.int(Bin::OrI, sum.hi, sum.lo);
        let sum_zero = self.cmp_c(Pred::Eq, sum_any, 0);
        let general = self.select_i(sum_zero, none, general);
        // Specials, the later taking precedence.
        let inf = 0x7f80_0000;
        let a_inf = self.cmp_c(Pred::Eq, ma, inf);
        let b_inf = self.cmp_c(Pred::Eq, mb, inf);
        let c_inf = self.cmp_c(Pred::Eq, mc, inf);
        let a_zero = self.cmp_c(Pred::Eq, ma, 0);
        let b_zero = self.cmp_c(Pred::Eq, mb, 0);
        let p_zero = self.push(VOp::Bin(Bin::OrI, a_zero, b_zero), shape, Elt::I1);
        let p_inf = self.push(VOp::Bin(Bin::OrI, a_inf, b_inf), shape, Elt::I1);
        let both_zero_sign = self.int(Bin::AndI, sp, sc);
        let zero_plus = self.select_i(c_zero, both_zero_sign, c);
        let r = self.select_i(p_zero, zero_plus, general);
        let r = self.select_i(c_inf, c, r);
        let signs_differ = self.push(VOp::Cmp(Pred::Ne, sc, sp), shape, Elt::I1);
        let opposite_inf = self.push(VOp::Bin(Bin::AndI, c_inf, signs_differ), shape, Elt::I1);
        let inf_nan = self.push(VOp::Bin(Bin::OrI, p_zero, opposite_inf), shape, Elt::I1);
        let quiet = self.konst(0x7fc0_0000, Elt::I32, shape);
        let signed_inf = self.int_c(Bin::OrI, sp, inf);
        let p_inf_value = self.select_i(inf_nan, quiet, signed_inf);
        let r = self.select_i(p_inf, p_inf_value, r);
        let a_nan = self.cmp_c(Pred::Ugt, ma, inf);
        let b_nan = self.cmp_c(Pred::Ugt, mb, inf);
        let c_nan = self.cmp_c(Pred::Ugt, mc, inf);
        let nan = self.push(VOp::Bin(Bin::OrI, a_nan, b_nan), shape, Elt::I1);
        let nan = self.push(VOp::Bin(Bin::OrI, nan, c_nan), shape, Elt::I1);
        let r = self.select_i(nan, quiet, r);
        self.push(VOp::Bitcast(r, Elt::F32), shape, Elt::F32)
    }
}

impl Lowering<'_> {
    /// `sqrt(x)` for an `f32` node, correctly rounded, as `qf_sqrt`: `±0` and `+inf` are
    /// returned, NaN and negatives give the quiet NaN; otherwise the exponent is made odd and
    /// the significand's square root is taken digit by digit (26 steps, sticky = a nonzero
    /// remainder), then rounded once.
    pub(super) fn sqrt_f32(&mut self, x: usize) -> usize {
        let shape = self.node_shape(x);
        let a = self.push(VOp::Bitcast(x, Elt::I32), shape, Elt::I32);
        let (m, e) = self.float_parts(a);
        let e_low = self.int_c(Bin::AndI, e, 1);
        let even = self.cmp_c(Pred::Eq, e_low, 0);
        let m2 = self.int_c(Bin::Shl, m, 1);
        let m = self.select_i(even, m2, m);
        let e1 = self.int_c(Bin::SubI, e, 1);
        let e = self.select_i(even, e1, e);
        let mut root = self.konst(0, Elt::I32, shape);
        let mut rem = self.konst(0, Elt::I32, shape);
        for i in 0..26u32 {
            rem = self.int_c(Bin::Shl, rem, 2);
            if i < 13 {
                let pair = self.int_c(Bin::ShrU, m, 24 - 2 * i);
                let pair = self.int_c(Bin::AndI, pair, 3);
                rem = self.int(Bin::OrI, rem, pair);
            }
            let t = self.int_c(Bin::Shl, root, 2);
            let t = self.int_c(Bin::OrI, t, 1);
            root = self.int_c(Bin::Shl, root, 1);
            let fits = self.push(VOp::Cmp(Pred::Uge, rem, t), shape, Elt::I1);
            let less = self.int(Bin::SubI, rem, t);
            rem = self.select_i(fits, less, rem);
            let set = self.int_c(Bin::OrI, root, 1);
            root = self.select_i(fits, set, root);
        }
        let lz = self.clz32(root);
        let lz = self.int_c(Bin::AndI, lz, 31);
        let norm = self.int(Bin::Shl, root, lz);
        // (e - 49) / 2 is exact: e is odd.
        let half = self.int_c(Bin::SubI, e, 49);
        let half = self.int_c(Bin::ShrS, half, 1);
        let exp = self.int_c(Bin::AddI, half, 31);
        let exp = self.int(Bin::SubI, exp, lz);
        let sticky = self.is_nonzero(rem);
        let zero = self.konst(0, Elt::I32, shape);
        let general = self.round_parts(zero, exp, norm, sticky);
        let magnitude = self.int_c(Bin::AndI, a, 0x7fff_ffff);
        let is_zero = self.cmp_c(Pred::Eq, magnitude, 0);
        let is_inf = self.cmp_c(Pred::Eq, a, 0x7f80_0000);
        let keep = self.push(VOp::Bin(Bin::OrI, is_zero, is_inf), shape, Elt::I1);
        let invalid = self.cmp_c(Pred::Ugt, a, 0x7f80_0000);
        let quiet = self.konst(0x7fc0_0000, Elt::I32, shape);
        let r = self.select_i(invalid, quiet, general);
        let r = self.select_i(keep, a, r);
        self.push(VOp::Bitcast(r, Elt::F32), shape, Elt::F32)
    }

    /// `x / y` (or, `rem`, `x % y`) for `u32` (or, `signed`, `i32`) nodes, the IR's integer
    /// division (`docs/semantics.md`, section 2): truncating toward zero, the remainder with the
    /// dividend's sign, `x / 0 = x % 0 = 0`, `i32::MIN / -1 = i32::MIN` and `i32::MIN % -1 = 0`.
    /// The magnitudes go through a restoring long division, one quotient bit per step from the
    /// top: the partial remainder takes the dividend's next bit, and the divisor is subtracted
    /// where it fits. Before the step of bit `j` the remainder is at most the dividend's bits
    /// above `j`, below `2^(31 - j)`, so its shift never leaves 32 bits.
    pub(super) fn div_rem_int(&mut self, x: usize, y: usize, signed: bool, rem: bool) -> usize {
        let shape = self.node_shape(x).max(self.node_shape(y));
        let zero = self.konst(0, Elt::I32, shape);
        let (a, b, a_neg, b_neg) = if signed {
            let a_neg = self.push(VOp::Cmp(Pred::Slt, x, zero), shape, Elt::I1);
            let b_neg = self.push(VOp::Cmp(Pred::Slt, y, zero), shape, Elt::I1);
            let minus_x = self.int(Bin::SubI, zero, x);
            let minus_y = self.int(Bin::SubI, zero, y);
            let a = self.push(VOp::Select(a_neg, minus_x, x), shape, Elt::I32);
            let b = self.push(VOp::Select(b_neg, minus_y, y), shape, Elt::I32);
            (a, b, Some(a_neg), Some(b_neg))
        } else {
            (x, y, None, None)
        };
        let mut q = zero;
        let mut r = zero;
        for bit in (0..32u32).rev() {
            let shifted = self.int_c(Bin::Shl, r, 1);
            let next = self.int_c(Bin::ShrU, a, bit);
            let next = self.int_c(Bin::AndI, next, 1);
            r = self.int(Bin::OrI, shifted, next);
            let fits = self.push(VOp::Cmp(Pred::Uge, r, b), shape, Elt::I1);
            let less = self.int(Bin::SubI, r, b);
            r = self.push(VOp::Select(fits, less, r), shape, Elt::I32);
            let q2 = self.int_c(Bin::Shl, q, 1);
            let q1 = self.int_c(Bin::OrI, q2, 1);
            q = self.push(VOp::Select(fits, q1, q2), shape, Elt::I32);
        }
        let out = match (rem, a_neg, b_neg) {
            (false, Some(a_neg), Some(b_neg)) => {
                let differ = self.push(VOp::Bin(Bin::XorI, a_neg, b_neg), shape, Elt::I1);
                let minus_q = self.int(Bin::SubI, zero, q);
                self.push(VOp::Select(differ, minus_q, q), shape, Elt::I32)
            }
            (true, Some(a_neg), _) => {
                let minus_r = self.int(Bin::SubI, zero, r);
                self.push(VOp::Select(a_neg, minus_r, r), shape, Elt::I32)
            }
            (false, ..) => q,
            (true, ..) => r,
        };
        let by_zero = self.push(VOp::Cmp(Pred::Eq, y, zero), shape, Elt::I1);
        self.push(VOp::Select(by_zero, zero, out), shape, Elt::I32)
    }

    /// Whether a magnitude truncated to `q` (`i32`) rounds up by one under `rounding`, given
    /// (`i1` nodes) whether the dropped fraction is above one half, exactly one half, or not
    /// zero, and whether the value is negative.
    fn rounds_up(
        &mut self,
        rounding: Rounding,
        [above, tie, inexact]: [usize; 3],
        q: usize,
        neg: usize,
    ) -> usize {
        let shape = self.node_shape(q);
        match rounding {
            Rounding::NearestEven => {
                let q_odd = self.int_c(Bin::AndI, q, 1);
                let odd = self.is_nonzero(q_odd);
                let tie_up = self.push(VOp::Bin(Bin::AndI, tie, odd), shape, Elt::I1);
                self.push(VOp::Bin(Bin::OrI, above, tie_up), shape, Elt::I1)
            }
            Rounding::TowardZero => self.konst(0, Elt::I1, shape),
            Rounding::Up => {
                let t = self.konst(1, Elt::I1, shape);
                let pos = self.push(VOp::Bin(Bin::XorI, neg, t), shape, Elt::I1);
                self.push(VOp::Bin(Bin::AndI, inexact, pos), shape, Elt::I1)
            }
            Rounding::Down => self.push(VOp::Bin(Bin::AndI, inexact, neg), shape, Elt::I1),
        }
    }

    /// `int_to_float rounding v` for a `u32` (or, `signed`, `i32`) node: the magnitude
    /// normalized to bit 31, its 8 low bits rounded by `rounding` (exact below `2^24`).
    pub(super) fn int_to_f32(&mut self, v: usize, signed: bool, rounding: Rounding) -> usize {
        let shape = self.node_shape(v);
        let zero = self.konst(0, Elt::I32, shape);
        let (neg, magnitude) = if signed {
            let neg = self.push(VOp::Cmp(Pred::Slt, v, zero), shape, Elt::I1);
            let flipped = self.int(Bin::SubI, zero, v);
            (neg, self.select_i(neg, flipped, v))
        } else {
            (self.konst(0, Elt::I1, shape), v)
        };
        let sign_bit = self.konst(0x8000_0000, Elt::I32, shape);
        let sign = self.select_i(neg, sign_bit, zero);
        let lz = self.clz32(magnitude);
        let lz = self.int_c(Bin::AndI, lz, 31);
        let m = self.int(Bin::Shl, magnitude, lz);
        let c157 = self.konst(157, Elt::I32, shape);
        // (e + 126) << 23 with e = 31 - lz.
        let base = self.int(Bin::SubI, c157, lz);
        let base = self.int_c(Bin::Shl, base, 23);
        let q = self.int_c(Bin::ShrU, m, 8);
        let rest = self.int_c(Bin::AndI, m, 0xff);
        let inexact = self.is_nonzero(rest);
        let above = self.cmp_c(Pred::Ugt, rest, 0x80);
        let tie = self.cmp_c(Pred::Eq, rest, 0x80);
        let up = self.rounds_up(rounding, [above, tie, inexact], q, neg);
        let inc = self.bool_to_int(up);
        let bits = self.int(Bin::AddI, base, q);
        let bits = self.int(Bin::AddI, bits, inc);
        let bits = self.int(Bin::OrI, bits, sign);
        let is_zero = self.cmp_c(Pred::Eq, magnitude, 0);
        let r = self.select_i(is_zero, zero, bits);
        self.push(VOp::Bitcast(r, Elt::F32), shape, Elt::F32)
    }
}

impl Lowering<'_> {
    /// `float_to_int to rounding x` for an `f32` node: the magnitude's integer part and the
    /// fraction's relation to one half from the bits, rounded by `rounding`, then saturated
    /// to `u32` (`signed` false: negatives give 0) or `i32`; NaN gives 0.
    pub(super) fn f32_to_int(&mut self, x: usize, signed: bool, rounding: Rounding) -> usize {
        let shape = self.node_shape(x);
        let a = self.push(VOp::Bitcast(x, Elt::I32), shape, Elt::I32);
        let zero = self.konst(0, Elt::I32, shape);
        let mag = self.int_c(Bin::AndI, a, 0x7fff_ffff);
        let neg = self.cmp_c(Pred::Uge, a, 0x8000_0000);
        let biased = self.int_c(Bin::ShrU, mag, 23);
        let e = self.int_c(Bin::SubI, biased, 127);
        let frac = self.int_c(Bin::AndI, mag, 0x7f_ffff);
        let m = self.int_c(Bin::OrI, frac, 0x80_0000);
        // 0 <= e < 23: integer part m >> (23 - e), the rest against one half.
        let c23 = self.konst(23, Elt::I32, shape);
        let sh = self.int(Bin::SubI, c23, e);
        let mid = self.cmp_c(Pred::Ult, e, 23);
        let one = self.konst(1, Elt::I32, shape);
        let sh = self.select_i(mid, sh, one);
        let t_mid = self.int(Bin::ShrU, m, sh);
        let unit = self.int(Bin::Shl, one, sh);
        let low = self.int_c(Bin::SubI, unit, 1);
        let rest = self.int(Bin::AndI, m, low);
        let sh_1 = self.int_c(Bin::SubI, sh, 1);
        let half = self.int(Bin::Shl, one, sh_1);
        let above_mid = self.push(VOp::Cmp(Pred::Ugt, rest, half), shape, Elt::I1);
        let tie_mid = self.push(VOp::Cmp(Pred::Eq, rest, half), shape, Elt::I1);
        let inexact_mid = self.is_nonzero(rest);
        // 23 <= e <= 31: exact, m << (e - 23) (larger e saturate below).
        let up_sh = self.int_c(Bin::SubI, e, 23);
        let up_sh = self.int_c(Bin::AndI, up_sh, 15);
        let t_big = self.int(Bin::Shl, m, up_sh);
        let no = self.konst(0, Elt::I1, shape);
        // e < 0: integer part 0 (even: a tie rounds down); above one half exactly when the
        // value is.
        let above_small = self.cmp_c(Pred::Ugt, mag, 0x3f00_0000);
        let inexact_small = self.is_nonzero(mag);
        let small = self.cmp_c(Pred::Slt, e, 0);
        let big = self.cmp_c(Pred::Sge, e, 23);
        let pick = |l: &mut Self, s: usize, b: usize, m: usize, elt: Elt| {
            let r = l.push(VOp::Select(big, b, m), shape, elt);
            l.push(VOp::Select(small, s, r), shape, elt)
        };
        let t = pick(self, zero, t_big, t_mid, Elt::I32);
        let above = pick(self, above_small, no, above_mid, Elt::I1);
        let tie = pick(self, no, no, tie_mid, Elt::I1);
        let inexact = pick(self, inexact_small, no, inexact_mid, Elt::I1);
        let up = self.rounds_up(rounding, [above, tie, inexact], t, neg);
        let inc = self.bool_to_int(up);
        let r = self.int(Bin::AddI, t, inc);
        let nan = self.cmp_c(Pred::Ugt, mag, 0x7f80_0000);
        let r = if signed {
            // Past 2^31 (or e >= 31 with any rounding): saturate; -2^31 is exact.
            let huge = self.cmp_c(Pred::Sge, e, 32);
            let over = self.cmp_c(Pred::Uge, r, 0x8000_0000);
            let over = self.push(VOp::Bin(Bin::OrI, over, huge), shape, Elt::I1);
            let min = self.konst(0x8000_0000, Elt::I32, shape);
            let max = self.konst(0x7fff_ffff, Elt::I32, shape);
            let negated = self.int(Bin::SubI, zero, r);
            let low_end = self.select_i(over, min, negated);
            let high_end = self.select_i(over, max, r);
            self.select_i(neg, low_end, high_end)
        } else {
            // Negatives round to zero or below: 0. Past 2^32: the maximum.
            let huge = self.cmp_c(Pred::Sge, e, 32);
            let max = self.konst(u32::MAX, Elt::I32, shape);
            let high_end = self.select_i(huge, max, r);
            self.select_i(neg, zero, high_end)
        };
        self.select_i(nan, zero, r)
    }
}
