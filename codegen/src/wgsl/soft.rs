//! Exact software `f32` division, square root and fused multiply-add in WGSL, from `u32`
//! operations only (no float arithmetic, so neither a driver's loose `/`, `sqrt` and `fma` nor
//! its subnormal flushing can touch them). Used when [`super::WgslOptions`] asks for them.
//!
//! Shared pieces:
//! * `qf_parts(a)`: a finite nonzero magnitude `a` (bits without the sign) as `m * 2^(e - 23)`
//!   with `m` in `[2^23, 2^24)` (subnormals normalized with `countLeadingZeros`).
//! * `qf_round(s, e, m, sticky)`: the `f32` nearest to `(-1)^s * (m + f) * 2^(e - 31)` where
//!   `m >= 2^31` and `f` is a fraction in `[0, 1)` that is nonzero exactly when `sticky`; ties
//!   to even, overflow to infinity, gradual underflow to subnormals and signed zero. Every
//!   routine computes its exact result's 32 leading bits plus a sticky bit, then calls it once.
//!
//! Routines (`s` is the result's sign bit, NaN results are the quiet NaN `0x7fc00000`):
//! * `qf_div(x, y)`: specials on the bits (NaN operand, `0/0`, `inf/inf` give NaN; `inf/y` and
//!   `x/0` give signed infinity; `0/y` and `x/inf` give signed zero), otherwise restoring long
//!   division of the significands: 25 quotient bits, sticky = nonzero remainder.
//! * `qf_sqrt(x)`: `±0` and `+inf` return `x`, NaN and negatives give NaN, otherwise the
//!   exponent is made even and the significand's integer square root is taken digit by digit
//!   (radicand `m * 2^26`, 26 steps, at least 25 root bits), sticky = nonzero remainder.
//! * `qf_fma(x, y, z)`: specials on the bits (NaN operand, `inf * 0`, `inf - inf` give NaN;
//!   an exact zero product plus a zero is `-0` only when both are `-0`), otherwise the exact
//!   48-bit product (16-bit limbs) and the addend as 64-bit integers (`vec2<u32>`, high word
//!   first) with their leading bit at bit 61, the smaller shifted right with the lost bits
//!   jammed into bit 0, added or subtracted exactly (an exact zero difference is `+0`),
//!   normalized, rounded once. Jamming is exact for rounding: bits are only lost when the
//!   exponents differ by 15 or more, so the leading bit of the sum is at bit 60 or above and its
//!   rounding position is far above bit 0.

/// `QfParts`, `qf_parts` and `qf_round`.
pub(super) const ROUND: &str = "struct QfParts {
    m: u32,
    e: i32,
}
fn qf_parts(a: u32) -> QfParts {
    let be = a >> 23u;
    if be == 0u {
        let lz = countLeadingZeros(a) - 8u;
        return QfParts(a << lz, -126i - i32(lz));
    }
    return QfParts((a & 0x7fffffu) | 0x800000u, i32(be) - 127i);
}
fn qf_round(s: u32, e: i32, m: u32, sticky: bool) -> f32 {
    if e > 127i {
        return bitcast<f32>(s | 0x7f800000u);
    }
    if e < -150i {
        return bitcast<f32>(s);
    }
    var base = 0u;
    var q = 0u;
    var rest = m;
    var half = 0x80000000u;
    if e >= -126i {
        base = u32(e + 126i) << 23u;
        q = m >> 8u;
        rest = m & 0xffu;
        half = 0x80u;
    } else if e > -150i {
        let sh = u32(-118i - e);
        q = m >> sh;
        rest = m & ((1u << sh) - 1u);
        half = 1u << (sh - 1u);
    }
    let up = rest > half || (rest == half && (sticky || (q & 1u) == 1u));
    return bitcast<f32>(s | (base + q + select(0u, 1u, up)));
}
";

/// `qf_div(x: f32, y: f32) -> f32`.
pub(super) const DIV: &str = "fn qf_div(x: f32, y: f32) -> f32 {
    let a = bitcast<u32>(x);
    let b = bitcast<u32>(y);
    let s = (a ^ b) & 0x80000000u;
    let ma = a & 0x7fffffffu;
    let mb = b & 0x7fffffffu;
    if ma > 0x7f800000u || mb > 0x7f800000u || (ma == mb && (ma == 0u || ma == 0x7f800000u)) {
        return bitcast<f32>(0x7fc00000u);
    }
    if ma == 0x7f800000u || mb == 0u {
        return bitcast<f32>(s | 0x7f800000u);
    }
    if ma == 0u || mb == 0x7f800000u {
        return bitcast<f32>(s);
    }
    let pa = qf_parts(ma);
    let pb = qf_parts(mb);
    var r = pa.m;
    var e = pa.e - pb.e;
    if r < pb.m {
        r = r << 1u;
        e = e - 1i;
    }
    var q = 0u;
    for (var i = 0u; i < 25u; i = i + 1u) {
        q = q << 1u;
        if r >= pb.m {
            r = r - pb.m;
            q = q | 1u;
        }
        r = r << 1u;
    }
    return qf_round(s, e, q << 7u, r != 0u);
}
";

/// `qf_sqrt(x: f32) -> f32`.
pub(super) const SQRT: &str = "fn qf_sqrt(x: f32) -> f32 {
    let a = bitcast<u32>(x);
    if (a & 0x7fffffffu) == 0u || a == 0x7f800000u {
        return x;
    }
    if a > 0x7f800000u {
        return bitcast<f32>(0x7fc00000u);
    }
    let p = qf_parts(a);
    var m = p.m;
    var e = p.e;
    if (e & 1i) == 0i {
        m = m << 1u;
        e = e - 1i;
    }
    var root = 0u;
    var rem = 0u;
    for (var i = 0u; i < 26u; i = i + 1u) {
        var pair = 0u;
        if i < 13u {
            pair = (m >> (24u - 2u * i)) & 3u;
        }
        rem = (rem << 2u) | pair;
        let t = (root << 2u) | 1u;
        root = root << 1u;
        if rem >= t {
            rem = rem - t;
            root = root | 1u;
        }
    }
    let lz = countLeadingZeros(root);
    return qf_round(0u, (e - 49i) / 2i + 31i - i32(lz), root << lz, rem != 0u);
}
";

/// `qf_fma(x: f32, y: f32, z: f32) -> f32` and its 64-bit helpers.
pub(super) const FMA: &str = "fn qf_clz64(x: vec2<u32>) -> u32 {
    if x.x != 0u {
        return countLeadingZeros(x.x);
    }
    return 32u + countLeadingZeros(x.y);
}
fn qf_shl64(x: vec2<u32>, s: u32) -> vec2<u32> {
    if s == 0u {
        return x;
    }
    if s >= 32u {
        return vec2<u32>(x.y << (s - 32u), 0u);
    }
    return vec2<u32>((x.x << s) | (x.y >> (32u - s)), x.y << s);
}
fn qf_shr64_jam(x: vec2<u32>, s: u32) -> vec2<u32> {
    if s == 0u {
        return x;
    }
    if s >= 64u {
        return vec2<u32>(0u, select(0u, 1u, (x.x | x.y) != 0u));
    }
    if s >= 32u {
        let k = s - 32u;
        let lost = x.y != 0u || (x.x & ((1u << k) - 1u)) != 0u;
        return vec2<u32>(0u, (x.x >> k) | select(0u, 1u, lost));
    }
    let lost = (x.y & ((1u << s) - 1u)) != 0u;
    return vec2<u32>(x.x >> s, (x.y >> s) | (x.x << (32u - s)) | select(0u, 1u, lost));
}
fn qf_fma(x: f32, y: f32, z: f32) -> f32 {
    let a = bitcast<u32>(x);
    let b = bitcast<u32>(y);
    let c = bitcast<u32>(z);
    let ma = a & 0x7fffffffu;
    let mb = b & 0x7fffffffu;
    let mc = c & 0x7fffffffu;
    let sp = (a ^ b) & 0x80000000u;
    let sc = c & 0x80000000u;
    if ma > 0x7f800000u || mb > 0x7f800000u || mc > 0x7f800000u {
        return bitcast<f32>(0x7fc00000u);
    }
    let pzero = ma == 0u || mb == 0u;
    if ma == 0x7f800000u || mb == 0x7f800000u {
        if pzero || (mc == 0x7f800000u && sc != sp) {
            return bitcast<f32>(0x7fc00000u);
        }
        return bitcast<f32>(sp | 0x7f800000u);
    }
    if mc == 0x7f800000u {
        return z;
    }
    if pzero {
        if mc == 0u {
            return bitcast<f32>(sp & sc);
        }
        return z;
    }
    let pa = qf_parts(ma);
    let pb = qf_parts(mb);
    let a1 = pa.m >> 16u;
    let a0 = pa.m & 0xffffu;
    let b1 = pb.m >> 16u;
    let b0 = pb.m & 0xffffu;
    let lo = a0 * b0;
    let mid = a1 * b0 + a0 * b1;
    let plo = lo + (mid << 16u);
    let phi = a1 * b1 + (mid >> 16u) + select(0u, 1u, plo < lo);
    let lzp = qf_clz64(vec2<u32>(phi, plo)) - 2u;
    var big = qf_shl64(vec2<u32>(phi, plo), lzp);
    var fb = pa.e + pb.e - 46i - i32(lzp);
    var sb = sp;
    if mc == 0u {
        let lz = qf_clz64(big);
        let n = qf_shl64(big, lz);
        return qf_round(sb, fb - i32(lz) + 63i, n.x, n.y != 0u);
    }
    let pc = qf_parts(mc);
    var small = vec2<u32>(pc.m << 6u, 0u);
    var fs = pc.e - 61i;
    var ss = sc;
    if fs > fb || (fs == fb && (small.x > big.x || (small.x == big.x && small.y > big.y))) {
        let t = big;
        big = small;
        small = t;
        let tf = fb;
        fb = fs;
        fs = tf;
        ss = sp;
        sb = sc;
    }
    small = qf_shr64_jam(small, u32(fb - fs));
    var sum: vec2<u32>;
    if sb == ss {
        let l = big.y + small.y;
        sum = vec2<u32>(big.x + small.x + select(0u, 1u, l < big.y), l);
    } else {
        sum = vec2<u32>(big.x - small.x - select(0u, 1u, big.y < small.y), big.y - small.y);
        if (sum.x | sum.y) == 0u {
            return 0.0;
        }
    }
    let lz = qf_clz64(sum);
    let n = qf_shl64(sum, lz);
    return qf_round(sb, fb - i32(lz) + 63i, n.x, n.y != 0u);
}
";
