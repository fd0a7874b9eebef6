//! Transcendental functions as IR routines: `exp`, `erf`, `tanh` and `sigmoid` on `f32` values,
//! built only from the IR's primitive ops (IEEE `+ - * /`, `fma`, compare + select, conversions
//! with a named rounding, bitcasts and integer ops) with fixed coefficients. Every backend that
//! follows the IR's semantics therefore computes the same bits, and the interpreter defines
//! them; no platform libm or fast-math intrinsic is involved (numeric contract, point 5).
//!
//! Every routine is straight-line code (selects, no `if`), so it can sit in a vectorized loop.
//! The algorithms, the coefficients as hex bit patterns, the measured maximum errors against
//! `f64` and where they occur are in `docs/math.md`; the special values are in each routine's
//! doc comment. The coefficients are minimax fits computed offline (Remez exchange, script in
//! `docs/math.md`) and rounded once to `f32`.
//!
//! Subnormals: inputs are taken as they are (never flushed), and results that are subnormal are
//! produced by one correctly rounded multiplication (not flushed): `exp(-100)` is the subnormal
//! nearest to `p * 2^-144` with `p = e^(144 ln 2 - 100) ~ 0.83` from the polynomial.

use crate::builder::KernelBuilder;
use crate::kernel::{Access, Dim, Kernel, Value};
use crate::ops::CmpOp;
use crate::routines::block_range;
use crate::types::{DType, Rounding, ScalarType};

/// `log2(e)` rounded to `f32`.
const LOG2E: u32 = 0x3fb8_aa3b;
/// `ln 2` rounded to `f32` (the high part of the Cody-Waite reduction).
const LN2_HI: u32 = 0x3f31_7218;
/// `ln 2 - LN2_HI` rounded to `f32`.
const LN2_LO: u32 = 0xb102_e308;
/// Inputs below this give `exp(x) = +0` (`exp(-104) < 2^-150`); the clamp keeps `n >= -150`.
const EXP_LO: f32 = -104.0;
/// Inputs above this give `exp(x) = +inf` (`exp(89) > f32::MAX`); the clamp keeps `n <= 128`.
const EXP_HI: f32 = 89.0;

/// `exp(r) ~ 1 + r + r^2 * (c2 + c3 r + ... + c7 r^5)` on `|r| <= 0.3473`, minimax in relative
/// error (`4.3e-10`), coefficients `c2..c7`.
pub const EXP_POLY: [u32; 6] = [
    0x3f00_0000,
    0x3e2a_aaa9,
    0x3d2a_aa72,
    0x3c08_8b57,
    0x3ab6_9f9f,
    0x394b_a228,
];

/// `erf(x) / x - 1 ~ s0 + s1 t + ... + s6 t^6` with `t = x^2` on `t in [0, 1]`, minimax in the
/// relative error of `x (1 + s)` (`1.2e-9`).
pub const ERF_SMALL: [u32; 7] = [
    0x3e03_75d4,
    0xbec0_939f,
    0x3de7_167c,
    0xbcdb_fc87,
    0x3baa_02d9,
    0xba51_fb80,
    0x38a4_b518,
];

/// `erfc(a) * exp(a^2) ~ g0 + g1 s + ... + g8 s^8` with `s = a - 2.5` on `a in [1, 4]`, minimax in
/// the absolute error of `erf` (`exp(-a^2) * |error|`, `2.4e-9`).
pub const ERF_LARGE: [u32; 9] = [
    0x3e57_ddf3,
    0xbd98_40b7,
    0x3ccc_19c1,
    0xbc05_3d25,
    0x3b16_e593,
    0xba2d_4eed,
    0x3a0e_6dc9,
    0x396b_ff41,
    0x38e0_112b,
];

/// `tanh(x) / x - 1 ~ s1 t + ... + s8 t^8` with `t = x^2` on `t in [0, 1]`, minimax in the
/// relative error of `x (1 + s)` (`3.9e-10`); `s0 = 0`, so a tiny `x` returns `x`.
pub const TANH_SMALL: [u32; 8] = [
    0xbeaa_aaa9,
    0x3e08_882f,
    0xbd5c_fded,
    0x3cb2_75e5,
    0xbc0c_d287,
    0x3b49_c240,
    0xba5c_7fca,
    0x38fe_be26,
];

/// `|x|` below which [`erf`] and [`tanh`] use their odd polynomials.
const SMALL: f32 = 1.0;
/// `|x|` from which [`erf`] returns `±1` (`erfc(3.92) < 2^-25`, so `erf` rounds to 1 already).
const ERF_ONE: f32 = 4.0;
/// The centre of the [`ERF_LARGE`] fit.
const ERF_CENTER: f32 = 2.5;

/// `f32` constant from its bit pattern.
fn c(b: &mut KernelBuilder, bits: u32) -> Value {
    b.const_f32(f32::from_bits(bits))
}

/// `p(v) = k[0] + k[1] v + ... + k[n-1] v^(n-1)` by Horner's rule, one `fma` per step starting
/// from the highest coefficient: `acc = k[n-1]; acc = fma(acc, v, k[i])` for `i = n-2 .. 0`.
pub fn horner(b: &mut KernelBuilder, v: Value, k: &[u32]) -> Value {
    let Some((&last, rest)) = k.split_last() else {
        return b.const_f32(0.0);
    };
    let mut acc = c(b, last);
    for &ki in rest.iter().rev() {
        let kv = c(b, ki);
        acc = b.fma(acc, v, kv);
    }
    acc
}

/// `2^k` for an `i32` `k` in `-126..=127`: the bits `(k + 127) << 23`.
fn pow2(b: &mut KernelBuilder, k: Value) -> Value {
    let bias = b.const_i32(127);
    let e = b.add(k, bias);
    let shift = b.const_i32(23);
    let bits = b.shl(e, shift);
    b.bitcast(bits, ScalarType::F32)
}

/// `mag` (sign bit clear) with the sign bit of `x`: `bits(mag) | (bits(x) & 0x8000_0000)`.
fn with_sign_of(b: &mut KernelBuilder, mag: Value, x: Value) -> Value {
    let mb = b.bitcast(mag, ScalarType::U32);
    let xb = b.bitcast(x, ScalarType::U32);
    let sign = b.const_u32(0x8000_0000);
    let s = b.and(xb, sign);
    let r = b.or(mb, s);
    b.bitcast(r, ScalarType::F32)
}

/// `e^x` on `f32`.
///
/// Operations: `xc = min(max(x, -104), 89)` (a NaN stays NaN); `n = rne_i32(xc * LOG2E)`;
/// `r = fma(-n, LN2_LO, fma(-n, LN2_HI, xc))` (the inner `fma` is exact); `p = 1 + fma(r * r,
/// horner(r, EXP_POLY), r)`; the result is `(p * 2^(n >> 1)) * 2^(n - (n >> 1))`, where the first
/// product is exact and the second rounds once, also into the subnormal range.
///
/// Special values: `exp(NaN) = NaN`, `exp(+inf) = +inf`, `exp(-inf) = +0`, `exp(±0) = 1`;
/// `x > 88.7228` (where `e^x` rounds above `f32::MAX`) gives `+inf`; `x < -103.9721` gives `+0`;
/// results below `2^-126` are the correctly rounded subnormal of the (accurate) `p * 2^n`.
pub fn exp(b: &mut KernelBuilder, x: Value) -> Value {
    let lo = b.const_f32(EXP_LO);
    let hi = b.const_f32(EXP_HI);
    let xc = b.max(x, lo);
    let xc = b.min(xc, hi);
    let log2e = c(b, LOG2E);
    let k = b.mul(xc, log2e);
    let n = b.float_to_int(k, ScalarType::I32, Rounding::NearestEven);
    let nf = b.int_to_float(n);
    let minus_n = b.neg(nf);
    let ln2_hi = c(b, LN2_HI);
    let ln2_lo = c(b, LN2_LO);
    let r = b.fma(minus_n, ln2_hi, xc);
    let r = b.fma(minus_n, ln2_lo, r);
    let r2 = b.mul(r, r);
    let poly = horner(b, r, &EXP_POLY);
    let q = b.fma(r2, poly, r);
    let one = b.const_f32(1.0);
    let p = b.add(one, q);
    let one_i = b.const_i32(1);
    let n1 = b.shr(n, one_i);
    let n2 = b.sub(n, n1);
    let s1 = pow2(b, n1);
    let s2 = pow2(b, n2);
    let y = b.mul(p, s1);
    b.mul(y, s2)
}

/// `erf(x)` on `f32`, odd in `x` (computed on `a = |x|`, then given the sign of `x`).
///
/// Operations: for `a < 1`: `fma(a, horner(a * a, ERF_SMALL), a)`; for `1 <= a < 4`:
/// `fma(-exp(-(a * a)), horner(a - 2.5, ERF_LARGE), 1)`; for `a >= 4`: `1`. The result's sign
/// bit is set to that of `x`.
///
/// Special values: `erf(±inf) = ±1`, `erf(NaN) = NaN`, `erf(±0) = ±0`; for tiny or subnormal
/// `x` the result is the correctly rounded linear term `fma(x, 2/sqrt(pi) - 1, x)` (never
/// flushed, never lost).
pub fn erf(b: &mut KernelBuilder, x: Value) -> Value {
    let a = b.abs(x);
    // Small: a (1 + S(a^2)).
    let t = b.mul(a, a);
    let s = horner(b, t, &ERF_SMALL);
    let small = b.fma(a, s, a);
    // Large: 1 - exp(-a^2) g(a - 2.5).
    let minus_t = b.neg(t);
    let e = exp(b, minus_t);
    let center = b.const_f32(ERF_CENTER);
    let sv = b.sub(a, center);
    let g = horner(b, sv, &ERF_LARGE);
    let minus_e = b.neg(e);
    let one = b.const_f32(1.0);
    let large = b.fma(minus_e, g, one);
    // Select: a NaN fails both comparisons and takes `large`, which is NaN.
    let one_from = b.const_f32(ERF_ONE);
    let saturated = b.cmp(CmpOp::Ge, a, one_from);
    let large = b.select(saturated, one, large);
    let small_from = b.const_f32(SMALL);
    let is_small = b.cmp(CmpOp::Lt, a, small_from);
    let mag = b.select(is_small, small, large);
    with_sign_of(b, mag, x)
}

/// `tanh(x)` on `f32`, odd in `x` (computed on `a = |x|`, then given the sign of `x`).
///
/// Operations: for `a < 1`: `fma(a, t * horner(t, TANH_SMALL), a)` with `t = a * a`; for
/// `a >= 1`: `1 - 2 / (exp(a + a) + 1)` (for `a > 44.5` `exp` is `+inf` and the result `1`).
/// The result's sign bit is set to that of `x`.
///
/// Special values: `tanh(±inf) = ±1`, `tanh(NaN) = NaN`, `tanh(±0) = ±0`; `tanh(x) = x` exactly
/// for subnormal and tiny `x` (`t` underflows or the correction rounds away).
pub fn tanh(b: &mut KernelBuilder, x: Value) -> Value {
    let a = b.abs(x);
    let t = b.mul(a, a);
    let s = horner(b, t, &TANH_SMALL);
    let s = b.mul(t, s);
    let small = b.fma(a, s, a);
    let two_a = b.add(a, a);
    let e = exp(b, two_a);
    let one = b.const_f32(1.0);
    let d = b.add(e, one);
    let two = b.const_f32(2.0);
    let q = b.div(two, d);
    let large = b.sub(one, q);
    let small_from = b.const_f32(SMALL);
    let is_small = b.cmp(CmpOp::Lt, a, small_from);
    let mag = b.select(is_small, small, large);
    with_sign_of(b, mag, x)
}

/// The logistic sigmoid `1 / (1 + e^-x)` on `f32`.
///
/// Operations: `e = exp(-|x|)`; `d = 1 + e`; `num = x < 0 ? e : 1` (so that a very negative `x`
/// gives the tiny, possibly subnormal, `e^x / (1 + e^x)` instead of `1 / inf`); `q = num / d`;
/// `rem = fma(-q, e, num - q)` (`num - q` is exact), the remainder `num - q (1 + e)` of the
/// exact denominator; the result is `q + rem / d`, the quotient corrected for the rounding of
/// `q` and of `1 + e`.
///
/// Special values: `sigmoid(+inf) = 1`, `sigmoid(-inf) = +0`, `sigmoid(NaN) = NaN`,
/// `sigmoid(±0) = 0.5`; `x > 17.33` gives `1`; `x < -103.97` gives `+0`; results between are
/// subnormal (never flushed) below `x = -87.34`.
pub fn sigmoid(b: &mut KernelBuilder, x: Value) -> Value {
    let a = b.abs(x);
    let minus_a = b.neg(a);
    let e = exp(b, minus_a);
    let one = b.const_f32(1.0);
    let d = b.add(one, e);
    let zero = b.const_f32(0.0);
    let negative = b.cmp(CmpOp::Lt, x, zero);
    let num = b.select(negative, e, one);
    let q = b.div(num, d);
    let t = b.sub(num, q);
    let minus_q = b.neg(q);
    let rem = b.fma(minus_q, e, t);
    let corr = b.div(rem, d);
    b.add(q, corr)
}

/// One of the routines of this module, to build a kernel from (tests, `docs/math.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MathFn {
    /// [`exp`].
    Exp,
    /// [`erf`].
    Erf,
    /// [`tanh`].
    Tanh,
    /// [`sigmoid`].
    Sigmoid,
}

/// Elements per work item of the kernels built by [`MathFn::kernel`].
pub const MATH_BLOCKSIZE: u32 = 1024;

impl MathFn {
    /// All routines.
    pub const ALL: [MathFn; 4] = [MathFn::Exp, MathFn::Erf, MathFn::Tanh, MathFn::Sigmoid];

    /// `exp`, `erf`, `tanh` or `sigmoid`.
    pub const fn name(self) -> &'static str {
        match self {
            MathFn::Exp => "exp",
            MathFn::Erf => "erf",
            MathFn::Tanh => "tanh",
            MathFn::Sigmoid => "sigmoid",
        }
    }

    /// The documented bound on the error of the routine, in units in the last place of the
    /// exact result (the `f32` spacing at the exact value; subnormal results use `2^-149`),
    /// over every `f32` input: measured over all 2^32 inputs (`docs/math.md`), the maxima are
    /// 0.979 (`exp`), 0.991 (`erf`), 0.949 (`tanh`) and 1.480 (`sigmoid`) ulp.
    pub const fn max_ulp(self) -> f64 {
        match self {
            MathFn::Exp => 1.0,
            MathFn::Erf => 1.0,
            MathFn::Tanh => 1.0,
            MathFn::Sigmoid => 1.5,
        }
    }

    /// Emits the routine on `x`.
    pub fn emit(self, b: &mut KernelBuilder, x: Value) -> Value {
        match self {
            MathFn::Exp => exp(b, x),
            MathFn::Erf => erf(b, x),
            MathFn::Tanh => tanh(b, x),
            MathFn::Sigmoid => sigmoid(b, x),
        }
    }

    /// The elementwise kernel `math_{name}_f32(n: u32, x: f32[n] read, y: f32[n] write)`:
    /// `y[i] = f(x[i])`, [`MATH_BLOCKSIZE`] elements per work item, grid `ceil(n / 1024)`
    /// (the caller passes the grid as `n_blocks`, the second parameter).
    pub fn kernel(self) -> Kernel {
        let mut b = KernelBuilder::new(&format!("math_{}_f32", self.name()));
        let n = b.scalar_param("n", ScalarType::U32);
        let n_blocks = b.scalar_param("n_blocks", ScalarType::U32);
        let x = b.buffer_param("x", DType::F32, &[Dim::Param(n)], Access::Read);
        let y = b.buffer_param("y", DType::F32, &[Dim::Param(n)], Access::Write);
        b.set_grid(Dim::Param(n_blocks));
        let item = b.work_item();
        let limit = b.param(n);
        let (start, end) = block_range(&mut b, item, MATH_BLOCKSIZE, limit);
        b.for_range(start, end, 1, |b, i| {
            let v = b.load(x, i);
            let r = self.emit(b, v);
            b.store(y, i, r);
        });
        b.finish()
    }
}
