//! WGSL helper functions that give the exact IR semantics with integer operations (so neither the
//! driver's float conversions nor its "no NaN/inf" assumptions can change a result). Each is
//! emitted only when a kernel uses it.

/// A helper function of the emitted module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Helper {
    /// `qf_isnan(x: f32) -> bool`, on the bits.
    IsNan,
    /// `qf_fkey(x: f32) -> u32`: a key whose unsigned order is the float order of non-NaN
    /// values (`-0` and `+0` share a key).
    FKey,
    /// `qf_flt`, `qf_fle`, `qf_feq` (IEEE comparisons, false on NaN).
    FCmp,
    /// `qf_f16_to_f32(h: u32) -> f32`, exact (subnormals normalized).
    F16ToF32,
    /// `qf_f32_to_f16(x: f32) -> u32`, round to nearest even.
    F32ToF16,
    /// `qf_f32_to_bf16(x: f32) -> u32`, round to nearest even, NaN stays NaN.
    F32ToBf16,
    /// `qf_f2u(x: f32, r: f32) -> u32` and `qf_f2i(x: f32, r: f32) -> i32`: saturating
    /// conversion of `r` (the already rounded `x`), NaN to 0.
    FloatToInt,
    /// `qf_u2f(m: u32, mode: u32) -> f32` and `qf_i2f(v: i32, pos: u32, neg: u32) -> f32`.
    IntToFloat,
    /// `qf_parts` and `qf_round`, shared by the exact software routines (`soft.rs`).
    SoftRound,
    /// `qf_div(x: f32, y: f32) -> f32`, correctly rounded (`soft.rs`).
    SoftDiv,
    /// `qf_sqrt(x: f32) -> f32`, correctly rounded (`soft.rs`).
    SoftSqrt,
    /// `qf_fma(x: f32, y: f32, z: f32) -> f32`, one rounding (`soft.rs`).
    SoftFma,
    /// `qf_umulhi(a: u32, b: u32) -> u32` and `qf_imulhi(a: i32, b: i32) -> i32`: the high
    /// word of the 64-bit product (WGSL has no such builtin), from 16-bit halves.
    MulHi,
}

impl Helper {
    /// Helpers this one calls.
    pub(super) fn deps(self) -> &'static [Helper] {
        match self {
            Helper::IsNan | Helper::FKey => &[],
            Helper::FCmp => &[Helper::IsNan, Helper::FKey],
            Helper::F16ToF32 | Helper::F32ToF16 | Helper::F32ToBf16 => &[],
            Helper::FloatToInt | Helper::IntToFloat => &[],
            Helper::SoftRound => &[],
            Helper::SoftDiv | Helper::SoftSqrt | Helper::SoftFma => &[Helper::SoftRound],
            Helper::MulHi => &[],
        }
    }

    /// The WGSL source.
    pub(super) fn source(self) -> &'static str {
        match self {
            Helper::SoftRound => super::soft::ROUND,
            Helper::SoftDiv => super::soft::DIV,
            Helper::SoftSqrt => super::soft::SQRT,
            Helper::SoftFma => super::soft::FMA,
            Helper::IsNan => {
                "fn qf_isnan(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}
"
            }
            Helper::FKey => {
                "fn qf_fkey(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    let c = select(b, 0u, (b & 0x7fffffffu) == 0u);
    return select(c | 0x80000000u, ~c, (c & 0x80000000u) != 0u);
}
"
            }
            Helper::FCmp => {
                "fn qf_flt(a: f32, b: f32) -> bool {
    return !qf_isnan(a) && !qf_isnan(b) && qf_fkey(a) < qf_fkey(b);
}
fn qf_fle(a: f32, b: f32) -> bool {
    return !qf_isnan(a) && !qf_isnan(b) && qf_fkey(a) <= qf_fkey(b);
}
fn qf_feq(a: f32, b: f32) -> bool {
    return !qf_isnan(a) && !qf_isnan(b) && qf_fkey(a) == qf_fkey(b);
}
"
            }
            Helper::F16ToF32 => {
                "fn qf_f16_to_f32(h: u32) -> f32 {
    let sign = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if e == 31u {
        return bitcast<f32>(sign | 0x7f800000u | (m << 13u));
    }
    if e == 0u {
        if m == 0u {
            return bitcast<f32>(sign);
        }
        let p = 31u - countLeadingZeros(m);
        let frac = (m << (23u - p)) & 0x7fffffu;
        return bitcast<f32>(sign | ((p + 103u) << 23u) | frac);
    }
    return bitcast<f32>(sign | ((e + 112u) << 23u) | (m << 13u));
}
"
            }
            Helper::F32ToF16 => {
                "fn qf_f32_to_f16(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    let sign = (b >> 16u) & 0x8000u;
    let a = b & 0x7fffffffu;
    if a > 0x7f800000u {
        return sign | 0x7e00u | ((a >> 13u) & 0x3ffu);
    }
    if a >= 0x477ff000u {
        return sign | 0x7c00u;
    }
    if a >= 0x38800000u {
        let m = a - 0x38000000u;
        return sign | ((m + 0xfffu + ((m >> 13u) & 1u)) >> 13u);
    }
    if a <= 0x33000000u {
        return sign;
    }
    let shift = 126u - (a >> 23u);
    let mant = (a & 0x7fffffu) | 0x800000u;
    let q = mant >> shift;
    let rest = mant & ((1u << shift) - 1u);
    let half = 1u << (shift - 1u);
    let up = rest > half || (rest == half && (q & 1u) == 1u);
    return sign | (q + select(0u, 1u, up));
}
"
            }
            Helper::F32ToBf16 => {
                "fn qf_f32_to_bf16(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    if (b & 0x7fffffffu) > 0x7f800000u {
        return (b >> 16u) | 0x40u;
    }
    return (b + 0x7fffu + ((b >> 16u) & 1u)) >> 16u;
}
"
            }
            Helper::FloatToInt => {
                "fn qf_f2u(x: f32, r: f32) -> u32 {
    let b = bitcast<u32>(x);
    let a = b & 0x7fffffffu;
    if a > 0x7f800000u || (b & 0x80000000u) != 0u {
        return 0u;
    }
    if a >= 0x4f800000u {
        return 0xffffffffu;
    }
    return u32(r);
}
fn qf_f2i(x: f32, r: f32) -> i32 {
    let b = bitcast<u32>(x);
    let a = b & 0x7fffffffu;
    if a > 0x7f800000u {
        return 0i;
    }
    if a >= 0x4f000000u {
        return select(2147483647i, bitcast<i32>(0x80000000u), (b & 0x80000000u) != 0u);
    }
    return i32(r);
}
"
            }
            Helper::IntToFloat => {
                "fn qf_u2f(m: u32, mode: u32) -> f32 {
    if m < 0x1000000u {
        return f32(m);
    }
    let shift = 8u - countLeadingZeros(m);
    let q = m >> shift;
    let rest = m & ((1u << shift) - 1u);
    let half = 1u << (shift - 1u);
    var up = false;
    if mode == 0u {
        up = rest > half || (rest == half && (q & 1u) == 1u);
    } else if mode == 2u {
        up = rest != 0u;
    }
    return f32(q + select(0u, 1u, up)) * bitcast<f32>((127u + shift) << 23u);
}
fn qf_i2f(v: i32, pos: u32, neg: u32) -> f32 {
    let n = v < 0i;
    let m = select(bitcast<u32>(v), 0u - bitcast<u32>(v), n);
    let f = qf_u2f(m, select(pos, neg, n));
    return bitcast<f32>(bitcast<u32>(f) | select(0u, 0x80000000u, n));
}
"
            }
            // `a * b = hh * 2^32 + (lh + hl) * 2^16 + ll` with 16-bit halves (every partial
            // product and sum below 2^32); the signed word subtracts `b` when `a < 0` and `a`
            // when `b < 0` (two's complement, modulo 2^32).
            Helper::MulHi => {
                "fn qf_umulhi(a: u32, b: u32) -> u32 {
    let al = a & 0xffffu;
    let ah = a >> 16u;
    let bl = b & 0xffffu;
    let bh = b >> 16u;
    let lh = al * bh;
    let hl = ah * bl;
    let mid = ((al * bl) >> 16u) + (lh & 0xffffu) + (hl & 0xffffu);
    return ah * bh + (lh >> 16u) + (hl >> 16u) + (mid >> 16u);
}
fn qf_imulhi(a: i32, b: i32) -> i32 {
    let ua = bitcast<u32>(a);
    let ub = bitcast<u32>(b);
    let h = qf_umulhi(ua, ub) - select(0u, ub, a < 0i) - select(0u, ua, b < 0i);
    return bitcast<i32>(h);
}
"
            }
        }
    }
}
