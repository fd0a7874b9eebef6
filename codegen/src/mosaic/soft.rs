//! Exact `f32` division from `i32` lane ops (`docs/backends/mosaic.md`, rule 8): how a TPU
//! rounds `arith.divf` is not documented (and its vector unit may flush subnormals), so the
//! quotient is computed as the WGSL backend's `qf_div` does (`crate::wgsl`'s soft routines),
//! branch-free: the specials on the bits, the significands' restoring long division (25
//! quotient bits and a sticky remainder), one rounding to nearest even with gradual underflow.
//! Every lane computes every case and selects; no shift amount reaches 32.

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
        let odd = self.cmp_c(Pred::Ne, q_odd, 0);
        let tie_breaks = self.push(VOp::Bin(Bin::OrI, sticky, odd), shape, Elt::I1);
        let tie_up = self.push(VOp::Bin(Bin::AndI, tie, tie_breaks), shape, Elt::I1);
        let up = self.push(VOp::Bin(Bin::OrI, above, tie_up), shape, Elt::I1);
        let inc = self.select_i(up, one, zero);
        let bits = self.int(Bin::AddI, base, q);
        let bits = self.int(Bin::AddI, bits, inc);
        let finite = self.int(Bin::OrI, sign, bits);
        // e = -150: half the smallest subnormal, up only above the tie; below: a signed zero.
        let c31 = self.konst(0x8000_0000, Elt::I32, shape);
        let past_half = self.push(VOp::Cmp(Pred::Ugt, m, c31), shape, Elt::I1);
        let at_half = self.push(VOp::Cmp(Pred::Eq, m, c31), shape, Elt::I1);
        let at_half = self.push(VOp::Bin(Bin::AndI, at_half, sticky), shape, Elt::I1);
        let half_up = self.push(VOp::Bin(Bin::OrI, past_half, at_half), shape, Elt::I1);
        let least = self.select_i(half_up, one, zero);
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
