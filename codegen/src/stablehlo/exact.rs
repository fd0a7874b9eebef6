//! The operations StableHLO lacks or leaves to the implementation, built exactly: `fma` (via
//! `f64` and round to odd), float-to-int conversions with saturation, and int-to-float with the
//! directed roundings.

use qforge_ir::{Rounding, ScalarType};

use super::emit::Emitter;

impl Emitter<'_> {
    /// `a * b + c` on `f32` lane values, rounded once (see the module docs of the backend).
    ///
    /// The product `p` of two `f32` is exact in `f64`; `s = p + c` is rounded to `f64` and
    /// TwoSum recovers its error `err = (p + c) - s` exactly. When `err != 0` and `s` is even,
    /// `s` moves one `f64` step towards `err`: that is round to odd, and rounding the result to
    /// `f32` (53 >= 24 + 2 bits) equals rounding `p + c` to `f32` directly. Infinite and NaN
    /// sums are left alone; an exact zero sum (`err == 0`) keeps IEEE's sign.
    pub(super) fn fma(&mut self, a: &str, b: &str, c: &str) -> String {
        let f = self.lane(ScalarType::F32);
        let d = self.lane_of("f64");
        let u = self.lane_of("ui64");
        let bt = self.lane(ScalarType::Bool);
        let (a, b, c) = (
            self.conv("convert", a, &f, &d),
            self.conv("convert", b, &f, &d),
            self.conv("convert", c, &f, &d),
        );
        let p = self.bin("multiply", &a, &b, &d);
        let s = self.bin("add", &p, &c, &d);
        // TwoSum (Knuth): err = (p - (s - z)) + (c - z), z = s - p.
        let z = self.bin("subtract", &s, &p, &d);
        let sz = self.bin("subtract", &s, &z, &d);
        let e1 = self.bin("subtract", &p, &sz, &d);
        let e2 = self.bin("subtract", &c, &z, &d);
        let err = self.bin("add", &e1, &e2, &d);
        let bits = self.conv("bitcast_convert", &s, &d, &u);
        let exp_mask = self.splat_of("ui64", "9218868437227405312"); // 0x7ff0_0000_0000_0000
        let exp = self.bin("and", &bits, &exp_mask, &u);
        let finite = self.cmp("NE", &exp, &exp_mask, &u, "UNSIGNED");
        let zero_d = self.splat_of("f64", "0.0");
        let inexact = self.cmp("NE", &err, &zero_d, &d, "FLOAT");
        let one = self.splat_of("ui64", "1");
        let low = self.bin("and", &bits, &one, &u);
        let zero_u = self.splat_of("ui64", "0");
        let even = self.cmp("EQ", &low, &zero_u, &u, "UNSIGNED");
        let adj = self.bin("and", &finite, &inexact, &bt);
        let adj = self.bin("and", &adj, &even, &bt);
        // Towards `err`: a larger magnitude when `err` and `s` have the same sign.
        let err_pos = self.cmp("GT", &err, &zero_d, &d, "FLOAT");
        let s_pos = self.cmp("GT", &s, &zero_d, &d, "FLOAT");
        let differ = self.bin("xor", &err_pos, &s_pos, &bt);
        let up = self.bin("add", &bits, &one, &u);
        let down = self.bin("subtract", &bits, &one, &u);
        let moved = self.select(&differ, &down, &up, &u);
        let odd = self.select(&adj, &moved, &bits, &u);
        let s2 = self.conv("bitcast_convert", &odd, &u, &d);
        self.conv("convert", &s2, &d, &f)
    }

    /// `Op::FloatToInt`: round with `rounding`, saturate to `to`'s range, NaN to 0. Only values
    /// already in range reach StableHLO's `convert` (whose out-of-range results are the
    /// implementation's).
    pub(super) fn float_to_int(&mut self, x: &str, to: ScalarType, rounding: Rounding) -> String {
        let f = self.lane(ScalarType::F32);
        let bt = self.lane(ScalarType::Bool);
        let r = match rounding {
            Rounding::NearestEven => self.un("round_nearest_even", x, &f),
            Rounding::Down => self.un("floor", x, &f),
            Rounding::Up => self.un("ceil", x, &f),
            Rounding::TowardZero => {
                let zero = self.splat(ScalarType::F32, 0);
                let neg = self.cmp("LT", x, &zero, &f, "FLOAT");
                let (c, fl) = (self.un("ceil", x, &f), self.un("floor", x, &f));
                self.select(&neg, &c, &fl, &f)
            }
        };
        let zero = self.splat(ScalarType::F32, 0);
        let t = self.lane(to);
        if to == ScalarType::I32 {
            let hi_lim = self.splat(ScalarType::F32, 0x4f00_0000); // 2^31
            let lo_lim = self.splat(ScalarType::F32, 0xcf00_0000); // -2^31
            let hi = self.cmp("GE", &r, &hi_lim, &f, "FLOAT");
            let lo = self.cmp("LT", &r, &lo_lim, &f, "FLOAT");
            let ok = self.cmp("EQ", &r, &r, &f, "FLOAT");
            let out = self.bin("or", &hi, &lo, &bt);
            let not_out = self.un("not", &out, &bt);
            let ok = self.bin("and", &ok, &not_out, &bt);
            let safe = self.select(&ok, &r, &zero, &f);
            let c = self.conv("convert", &safe, &f, &t);
            let max = self.splat(ScalarType::I32, i32::MAX as u32);
            let min = self.splat(ScalarType::I32, i32::MIN as u32);
            let c = self.select(&lo, &min, &c, &t);
            self.select(&hi, &max, &c, &t)
        } else {
            let hi_lim = self.splat(ScalarType::F32, 0x4f80_0000); // 2^32
            let hi = self.cmp("GE", &r, &hi_lim, &f, "FLOAT");
            let pos = self.cmp("GT", &r, &zero, &f, "FLOAT");
            let not_hi = self.un("not", &hi, &bt);
            let ok = self.bin("and", &pos, &not_hi, &bt);
            let safe = self.select(&ok, &r, &zero, &f);
            let c = self.conv("convert", &safe, &f, &t);
            let max = self.splat(ScalarType::U32, u32::MAX);
            self.select(&hi, &max, &c, &t)
        }
    }

    /// `Op::IntToFloat`: StableHLO's `convert` rounds to nearest even; a directed rounding moves
    /// that result one step when it lies on the wrong side of the exact value (compared in
    /// `f64`, where every 32-bit integer is exact). The result is then never 0, so one step in
    /// the bits is one step in value.
    pub(super) fn int_to_float(&mut self, x: &str, from: ScalarType, rounding: Rounding) -> String {
        let it = self.lane(from);
        let f = self.lane(ScalarType::F32);
        let nearest = self.conv("convert", x, &it, &f);
        if rounding == Rounding::NearestEven {
            return nearest;
        }
        let d = self.lane_of("f64");
        let u = self.lane(ScalarType::U32);
        let exact = self.conv("convert", x, &it, &d);
        let wide = self.conv("convert", &nearest, &f, &d);
        let bits = self.bits_of(&nearest, ScalarType::F32);
        let one = self.splat(ScalarType::U32, 1);
        let up = self.bin("add", &bits, &one, &u);
        let down = self.bin("subtract", &bits, &one, &u);
        let zero = self.splat(ScalarType::F32, 0);
        let positive = self.cmp("GT", &nearest, &zero, &f, "FLOAT");
        // One step towards zero is one less in the magnitude bits, whatever the sign.
        let (adj, moved) = match rounding {
            Rounding::Down => {
                let adj = self.cmp("GT", &wide, &exact, &d, "FLOAT");
                (adj, self.select(&positive, &down, &up, &u))
            }
            Rounding::Up => {
                let adj = self.cmp("LT", &wide, &exact, &d, "FLOAT");
                (adj, self.select(&positive, &up, &down, &u))
            }
            Rounding::TowardZero | Rounding::NearestEven => {
                let aw = self.un("abs", &wide, &d);
                let ae = self.un("abs", &exact, &d);
                (self.cmp("GT", &aw, &ae, &d, "FLOAT"), down)
            }
        };
        let r = self.select(&adj, &moved, &bits, &u);
        let (uf, ff) = (self.lane(ScalarType::U32), self.lane(ScalarType::F32));
        self.conv("bitcast_convert", &r, &uf, &ff)
    }
}
