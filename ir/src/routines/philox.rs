//! Counter-based random bits: Philox4x32-10 (Salmon, Moraes, Dror and Shaw, "Parallel random
//! numbers: as easy as 1, 2, 3", SC 2011; the generator of the Random123 library) written as an
//! IR routine, so every backend computes the same bits for the same (counter, key), whatever the
//! thread layout. Stochastic rounding (numeric contract, rule 6) draws its bits from here.
//!
//! # The generator
//! The state is four `u32` words `x = (x0, x1, x2, x3)` (the counter) and the key two `u32`
//! words `k = (k0, k1)`. One round, with the multipliers `M0 = 0xD2511F53`, `M1 = 0xCD9E8D57`
//! and `hi`/`lo` the high and low words of the exact 64-bit product:
//!
//! ```text
//! p0 = M0 * x0,  p1 = M1 * x2                      (32 x 32 -> 64 bits)
//! x' = (hi(p1) ^ x1 ^ k0,  lo(p1),  hi(p0) ^ x3 ^ k1,  lo(p0))
//! ```
//!
//! Philox4x32-10 applies 10 rounds; the first uses the key as given and before each later round
//! the key advances by the Weyl increments: `k0 += 0x9E3779B9`, `k1 += 0xBB67AE85` (wrapping).
//! The output is the state after the 10th round.
//!
//! # The high word of a product
//! `hi` is the IR's [`crate::BinaryOp::MulHi`] (`u32`: the high 32 bits of the exact 64-bit
//! product; PTX `mul.hi.u32`, one 64-bit multiply on CPUs), `lo` its `mul`. Until that op
//! existed the high word was assembled here from 16-bit halves with four `u32` multiplies and
//! seven adds, shifts and masks per product, about half of a 4-bit AdamW step's instructions;
//! the WGSL backend, whose language has no such builtin, still does that (`qf_umulhi`).

use crate::builder::KernelBuilder;
use crate::error::Result;
use crate::kernel::{Access, Dim, Kernel, Value};
use crate::ops::CmpOp;
use crate::types::{DType, ScalarType};

/// Multiplier of the first word pair (`x0`), from the Philox paper.
pub const PHILOX_M0: u32 = 0xD251_1F53;
/// Multiplier of the second word pair (`x2`), from the Philox paper.
pub const PHILOX_M1: u32 = 0xCD9E_8D57;
/// Weyl increment of key word 0 (the golden ratio's fraction, `floor(2^32 * (sqrt(5) - 1) / 2)`).
pub const PHILOX_W0: u32 = 0x9E37_79B9;
/// Weyl increment of key word 1 (`floor(2^32 * (sqrt(3) - 1))`).
pub const PHILOX_W1: u32 = 0xBB67_AE85;
/// Number of rounds of Philox4x32-10.
pub const PHILOX_ROUNDS: usize = 10;

/// Name of the kernel built by [`philox_kernel`].
pub const RANDOM_BITS_NAME: &str = "random_bits";
/// Name of the kernel built by [`philox_blocks_kernel`].
pub const PHILOX_BLOCKS_NAME: &str = "philox4x32_10_blocks";

/// Philox4x32-10 of `counter` under `key` in plain Rust (the host reference of
/// the IR routine `philox4x32_10`; see the module docs for the definition).
pub fn philox4x32_10_host(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let mut x = counter;
    let mut k = key;
    for round in 0..PHILOX_ROUNDS {
        if round > 0 {
            k[0] = k[0].wrapping_add(PHILOX_W0);
            k[1] = k[1].wrapping_add(PHILOX_W1);
        }
        let p0 = u64::from(PHILOX_M0) * u64::from(x[0]);
        let p1 = u64::from(PHILOX_M1) * u64::from(x[2]);
        x = [
            (p1 >> 32) as u32 ^ x[1] ^ k[0],
            p1 as u32,
            (p0 >> 32) as u32 ^ x[3] ^ k[1],
            p0 as u32,
        ];
    }
    x
}

/// `(hi, lo)` of the exact 64-bit product `a * m` for a `u32` value `a` and a constant `m`:
/// [`crate::BinaryOp::MulHi`] and [`crate::BinaryOp::Mul`].
fn mul_hi_lo(b: &mut KernelBuilder, a: Value, m: u32) -> (Value, Value) {
    let m = b.const_u32(m);
    (b.mul_hi(a, m), b.mul(a, m))
}

/// Emits Philox4x32-10 of `counter` under `key` (all `u32` values) and returns the four output
/// words. Built only from `u32` `mul` and `mul_hi` (the low and high words of the product),
/// `add` and `xor`, so the interpreter and every backend agree bit for bit; equals
/// [`philox4x32_10_host`].
pub fn philox4x32_10(b: &mut KernelBuilder, counter: [Value; 4], key: [Value; 2]) -> [Value; 4] {
    let w0 = b.const_u32(PHILOX_W0);
    let w1 = b.const_u32(PHILOX_W1);
    let mut x = counter;
    let [mut k0, mut k1] = key;
    for round in 0..PHILOX_ROUNDS {
        if round > 0 {
            k0 = b.add(k0, w0);
            k1 = b.add(k1, w1);
        }
        let (hi0, lo0) = mul_hi_lo(b, x[0], PHILOX_M0);
        let (hi1, lo1) = mul_hi_lo(b, x[2], PHILOX_M1);
        let y0 = b.binary(crate::ops::BinaryOp::Xor, hi1, x[1]);
        let y0 = b.binary(crate::ops::BinaryOp::Xor, y0, k0);
        let y2 = b.binary(crate::ops::BinaryOp::Xor, hi0, x[3]);
        let y2 = b.binary(crate::ops::BinaryOp::Xor, y2, k1);
        x = [y0, lo1, y2, lo0];
    }
    x
}

/// Maps 32 random bits (`u32`) to an `f32` uniform on `[0, 1)`: `(bits >> 8) * 2^-24`. The top
/// 24 bits convert to `f32` exactly (they are below `2^24`) and the scaling by a power of two is
/// exact, so the result is one of the `2^24` multiples of `2^-24` in `[0, 1 - 2^-24]`, each
/// equally likely, with no rounding anywhere.
#[cfg_attr(not(test), allow(dead_code))] // used by the stochastic-rounding optimizers (issue 6)
pub fn uniform_f32(b: &mut KernelBuilder, bits: Value) -> Value {
    let eight = b.const_u32(8);
    let top = b.shr(bits, eight);
    let f = b.int_to_float(top);
    let scale = b.const_f32(1.0 / 16_777_216.0);
    b.mul(f, scale)
}

/// Rounds the `f32` value `v` to `bf16` stochastically and widens it back to `f32`, using the
/// low 16 bits of `bits` (`u32`): `bits(v) + (bits & 0xFFFF)`, then the low 16 bits cleared.
///
/// With `r = bits & 0xFFFF` uniform on `0..2^16` and `d` the 16 discarded bits of `v`, the
/// magnitude is rounded up (away from zero, to the next `bf16`) exactly when `d + r >= 2^16`,
/// i.e. for `d` of the `2^16` values of `r`: with probability `d / 2^16`, the discarded
/// fraction of a `bf16` ulp. So the expected result is exactly `v` (unbiased), a value already
/// representable in `bf16` never changes, and `+-0` stays `+-0`. Subnormals round the same way
/// (the `bf16` subnormals continue the `f32` bit patterns). `+-inf` stays `+-inf` (its low bits
/// are 0); a finite value above the largest finite `bf16` rounds up to `+-inf` with
/// probability `d / 2^16`, as the next value away from zero. NaN is returned unchanged.
#[cfg_attr(not(test), allow(dead_code))] // used by the stochastic-rounding optimizers (issue 6)
pub fn stochastic_round_bf16(b: &mut KernelBuilder, v: Value, bits: Value) -> Value {
    let x = b.bitcast(v, ScalarType::U32);
    let low_mask = b.const_u32(0xFFFF);
    let r = b.and(bits, low_mask);
    let sum = b.add(x, r);
    let keep = b.const_u32(0xFFFF_0000);
    let t = b.and(sum, keep);
    let rounded = b.bitcast(t, ScalarType::F32);
    let nan = b.cmp(CmpOp::Ne, v, v);
    b.select(nan, v, rounded)
}

/// Builds `random_bits(seed: u32, n: u32, out: u32[n, 4] write)`, grid `n`: work item `i`
/// writes `out[4i .. 4i + 4] = philox4x32_10(counter = (i, 0, 0, 0), key = (seed, 0))`, i.e.
/// `4n` random words whose values depend only on `seed` and the element index, never on the
/// device or the thread layout. Not in the catalog.
///
/// # Errors
/// [`crate::Error::Verify`] if the built kernel fails verification (a library bug).
pub fn philox_kernel() -> Result<Kernel> {
    let mut b = KernelBuilder::new(RANDOM_BITS_NAME);
    let seed = b.scalar_param("seed", ScalarType::U32);
    let n = b.scalar_param("n", ScalarType::U32);
    let out = b.buffer_param(
        "out",
        DType::U32,
        &[Dim::Param(n), Dim::Const(4)],
        Access::Write,
    );
    b.set_grid(Dim::Param(n));
    let i = b.work_item();
    let zero = b.const_u32(0);
    let key0 = b.param(seed);
    let words = philox4x32_10(&mut b, [i, zero, zero, zero], [key0, zero]);
    store_words(&mut b, out, i, &words);
    let k = b.finish();
    crate::verify(&k)?;
    Ok(k)
}

/// Builds `philox4x32_10_blocks(n: u32, counter: u32[n, 4] read, key: u32[n, 2] read,
/// out: u32[n, 4] write)`, grid `n`: work item `i` writes
/// `out[4i .. 4i + 4] = philox4x32_10(counter[4i .. 4i + 4], key[2i .. 2i + 2])`. Lets tests
/// run arbitrary (counter, key) pairs, e.g. the Random123 known-answer vectors, on any device.
/// Not in the catalog.
///
/// # Errors
/// [`crate::Error::Verify`] if the built kernel fails verification (a library bug).
pub fn philox_blocks_kernel() -> Result<Kernel> {
    let mut b = KernelBuilder::new(PHILOX_BLOCKS_NAME);
    let n = b.scalar_param("n", ScalarType::U32);
    let ctr = b.buffer_param(
        "counter",
        DType::U32,
        &[Dim::Param(n), Dim::Const(4)],
        Access::Read,
    );
    let key = b.buffer_param(
        "key",
        DType::U32,
        &[Dim::Param(n), Dim::Const(2)],
        Access::Read,
    );
    let out = b.buffer_param(
        "out",
        DType::U32,
        &[Dim::Param(n), Dim::Const(4)],
        Access::Write,
    );
    b.set_grid(Dim::Param(n));
    let i = b.work_item();
    let c4 = b.const_u32(4);
    let c2 = b.const_u32(2);
    let base4 = b.mul(i, c4);
    let base2 = b.mul(i, c2);
    let mut c = [base4; 4];
    for (j, w) in c.iter_mut().enumerate() {
        let off = b.const_u32(j as u32);
        let at = b.add(base4, off);
        *w = b.load(ctr, at);
    }
    let mut k = [base2; 2];
    for (j, w) in k.iter_mut().enumerate() {
        let off = b.const_u32(j as u32);
        let at = b.add(base2, off);
        *w = b.load(key, at);
    }
    let words = philox4x32_10(&mut b, c, k);
    store_words(&mut b, out, i, &words);
    let k = b.finish();
    crate::verify(&k)?;
    Ok(k)
}

/// `out[4i + j] = words[j]` for `j` in `0..4`.
fn store_words(b: &mut KernelBuilder, out: crate::kernel::ParamId, i: Value, words: &[Value; 4]) {
    let c4 = b.const_u32(4);
    let base = b.mul(i, c4);
    for (j, w) in words.iter().enumerate() {
        let off = b.const_u32(j as u32);
        let at = b.add(base, off);
        b.store(out, at, *w);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::OwnedArg;
    use crate::types::Scalar;
    use proptest::prelude::*;

    /// Random123 `kat_vectors`, philox4x32 with 10 rounds: (counter, key, expected output).
    const KAT: [([u32; 4], [u32; 2], [u32; 4]); 3] = [
        (
            [0, 0, 0, 0],
            [0, 0],
            [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8],
        ),
        (
            [0xffff_ffff; 4],
            [0xffff_ffff; 2],
            [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd],
        ),
        (
            [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
            [0xa409_3822, 0x299f_31d0],
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1],
        ),
    ];

    fn u32_bytes(v: &[u32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn u32s(b: &[u8]) -> Vec<u32> {
        b.chunks(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    /// Runs [`philox_blocks_kernel`] on the interpreter.
    fn run_blocks(kernel: &Kernel, inputs: &[([u32; 4], [u32; 2])]) -> Vec<[u32; 4]> {
        let ctr: Vec<u32> = inputs.iter().flat_map(|(c, _)| *c).collect();
        let key: Vec<u32> = inputs.iter().flat_map(|(_, k)| *k).collect();
        let mut args = vec![
            OwnedArg::Scalar(Scalar::U32(inputs.len() as u32)),
            OwnedArg::Read(u32_bytes(&ctr)),
            OwnedArg::Read(u32_bytes(&key)),
            OwnedArg::Write(vec![0; 16 * inputs.len()]),
        ];
        crate::interp::run(kernel, &mut OwnedArg::borrow_all(&mut args)).unwrap();
        match &args[3] {
            OwnedArg::Write(o) => u32s(o)
                .chunks(4)
                .map(|c| [c[0], c[1], c[2], c[3]])
                .collect(),
            _ => unreachable!(),
        }
    }

    /// A kernel `y[i] = f(x[i], r[i])` over `u32` inputs with an `f32`/`u32` result.
    fn run_map(
        xs: &[u32],
        rs: &[u32],
        f: impl FnOnce(&mut KernelBuilder, Value, Value) -> Value,
    ) -> Vec<u32> {
        let mut b = KernelBuilder::new("map");
        let n = b.scalar_param("n", ScalarType::U32);
        let x = b.buffer_param("x", DType::U32, &[Dim::Param(n)], Access::Read);
        let r = b.buffer_param("r", DType::U32, &[Dim::Param(n)], Access::Read);
        let y = b.buffer_param("y", DType::U32, &[Dim::Param(n)], Access::Write);
        b.set_grid(Dim::Param(n));
        let i = b.work_item();
        let xv = b.load(x, i);
        let rv = b.load(r, i);
        let out = f(&mut b, xv, rv);
        let out = b.bitcast(out, ScalarType::U32);
        b.store(y, i, out);
        let k = b.finish();
        crate::verify(&k).unwrap();
        let mut args = vec![
            OwnedArg::Scalar(Scalar::U32(xs.len() as u32)),
            OwnedArg::Read(u32_bytes(xs)),
            OwnedArg::Read(u32_bytes(rs)),
            OwnedArg::Write(vec![0; 4 * xs.len()]),
        ];
        crate::interp::run(&k, &mut OwnedArg::borrow_all(&mut args)).unwrap();
        match &args[3] {
            OwnedArg::Write(o) => u32s(o),
            _ => unreachable!(),
        }
    }

    #[test]
    fn philox_host_reference_matches_random123_kat_vectors() {
        for (ctr, key, want) in KAT {
            assert_eq!(
                philox4x32_10_host(ctr, key),
                want,
                "ctr {ctr:08x?} key {key:08x?}"
            );
        }
    }

    #[test]
    fn philox_ir_routine_matches_random123_kat_vectors_on_the_interpreter() {
        let k = philox_blocks_kernel().unwrap();
        let inputs: Vec<_> = KAT.iter().map(|(c, k, _)| (*c, *k)).collect();
        let got = run_blocks(&k, &inputs);
        for ((ctr, key, want), got) in KAT.iter().zip(got) {
            assert_eq!(got, *want, "ctr {ctr:08x?} key {key:08x?}");
        }
    }

    #[test]
    fn philox_random_bits_kernel_is_keyed_by_seed_and_index() {
        let k = philox_kernel().unwrap();
        for seed in [0u32, 1, 0xDEAD_BEEF, u32::MAX] {
            let n = 5u32;
            let mut args = vec![
                OwnedArg::Scalar(Scalar::U32(seed)),
                OwnedArg::Scalar(Scalar::U32(n)),
                OwnedArg::Write(vec![0; 16 * n as usize]),
            ];
            crate::interp::run(&k, &mut OwnedArg::borrow_all(&mut args)).unwrap();
            let OwnedArg::Write(o) = &args[2] else {
                unreachable!()
            };
            let want: Vec<u32> = (0..n)
                .flat_map(|i| philox4x32_10_host([i, 0, 0, 0], [seed, 0]))
                .collect();
            assert_eq!(u32s(o), want, "seed {seed:#x}");
        }
    }

    /// The multiply-high construction on edge multiplicands: a zero, the carries out of every
    /// 16-bit column (all ones), and the halves' boundaries.
    #[test]
    fn philox_ir_routine_matches_host_on_edge_counters() {
        let k = philox_blocks_kernel().unwrap();
        let edges = [
            0u32,
            1,
            0xFFFF,
            0x1_0000,
            0xFFFF_FFFF,
            0x8000_0000,
            0x7FFF_FFFF,
            0xFFFF_0000,
        ];
        let mut inputs = Vec::new();
        for (j, &a) in edges.iter().enumerate() {
            for &c in &edges {
                let e = edges[(j + 3) % edges.len()];
                inputs.push(([a, e, c, !e], [e, a ^ c]));
            }
        }
        let got = run_blocks(&k, &inputs);
        for ((ctr, key), got) in inputs.iter().zip(got) {
            assert_eq!(
                got,
                philox4x32_10_host(*ctr, *key),
                "ctr {ctr:08x?} key {key:08x?}"
            );
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]
        #[test]
        fn philox_ir_routine_equals_host_reference(
            inputs in prop::collection::vec((any::<[u32; 4]>(), any::<[u32; 2]>()), 1..8)
        ) {
            let k = philox_blocks_kernel().unwrap();
            let got = run_blocks(&k, &inputs);
            for ((ctr, key), got) in inputs.iter().zip(got) {
                prop_assert_eq!(got, philox4x32_10_host(*ctr, *key));
            }
        }
    }

    #[test]
    fn philox_uniform_f32_is_the_top_24_bits_scaled_into_unit_interval() {
        let mut rs: Vec<u32> = vec![
            0,
            1,
            0xFF,
            0x100,
            0x1FF,
            0x8000_0000,
            u32::MAX - 0xFF,
            u32::MAX,
        ];
        rs.extend((0..=u32::MAX).step_by(99_991));
        let got = run_map(&rs, &rs, |b, _, r| uniform_f32(b, r));
        for (r, g) in rs.iter().zip(got) {
            let g = f32::from_bits(g);
            // floor(r / 2^32 * 2^24) / 2^24, in f64 (exact).
            let want = (f64::from(*r) / 256.0).floor() / 16_777_216.0;
            assert_eq!(f64::from(g), want, "bits {r:#x}");
            assert!((0.0..1.0).contains(&g), "bits {r:#x} -> {g}");
        }
    }

    /// The value-level definition: `v` between the adjacent bf16 values `lo` (toward zero) and
    /// `hi` (away from zero, `2^128` standing for the overflow to inf), rounded to `hi` when
    /// `r / 2^16 >= 1 - p` with `p = (|v| - |lo|) / (|hi| - |lo|)`, computed in f64.
    fn sr_reference(v: f32, r: u32) -> f32 {
        if v.is_nan() {
            return f32::NAN;
        }
        let lo = half::bf16::from_bits((v.to_bits() >> 16) as u16).to_f32();
        if lo == v {
            return v;
        }
        let lo_mag = f64::from(lo.abs());
        let hi_bits = (lo.abs().to_bits() >> 16) as u16 + 1;
        let hi_f = half::bf16::from_bits(hi_bits).to_f32();
        let hi_mag = if hi_f.is_infinite() {
            2f64.powi(128)
        } else {
            f64::from(hi_f)
        };
        let p = (f64::from(v.abs()) - lo_mag) / (hi_mag - lo_mag);
        let up = f64::from(r & 0xFFFF) / 65536.0 >= 1.0 - p;
        if up {
            hi_f.copysign(v)
        } else {
            lo
        }
    }

    #[test]
    fn philox_stochastic_round_bf16_matches_value_level_definition() {
        let mut xs = vec![
            0u32,
            0x8000_0000,
            1,
            0x8000_FFFF,
            0x0000_8000,
            0x007F_FFFF,
            0x0080_0000,
            0x3F80_0000,
            0x3F80_0001,
            0x3F80_FFFF,
            0xBF80_8000,
            0x7F7F_0000,
            0x7F7F_FFFF,
            0xFF7F_8001,
            0x7F80_0000,
            0xFF80_0000,
            0x7FC0_0000,
            0x7F80_0001,
            0xFFFF_FFFF,
        ];
        xs.extend((0..=u32::MAX).step_by(104_729));
        let rs_edge = [
            0u32,
            1,
            0x7FFF,
            0x8000,
            0xFFFF,
            0xFFFF_0000,
            0x1234_5678,
            u32::MAX,
        ];
        let mut x_all = Vec::new();
        let mut r_all = Vec::new();
        for (j, x) in xs.iter().enumerate() {
            for (m, r) in rs_edge.iter().enumerate() {
                x_all.push(*x);
                r_all.push(
                    r.wrapping_add((j as u32).wrapping_mul(40_503) & !((m as u32 & 1) * 0xFFFF)),
                );
            }
        }
        let got = run_map(&x_all, &r_all, |b, x, r| {
            let v = b.bitcast(x, ScalarType::F32);
            stochastic_round_bf16(b, v, r)
        });
        for ((x, r), g) in x_all.iter().zip(&r_all).zip(got) {
            let (v, g) = (f32::from_bits(*x), f32::from_bits(g));
            let want = sr_reference(v, *r);
            let same = g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan());
            assert!(
                same,
                "{x:#010x} r {r:#x}: got {:#010x}, want {:#010x}",
                g.to_bits(),
                want.to_bits()
            );
        }
    }

    /// Over all `2^16` values of the random bits, exactly `d` round up (`d` the discarded low
    /// bits) and the results average to `v` exactly: stochastic rounding is unbiased.
    #[test]
    fn philox_stochastic_round_bf16_is_exactly_unbiased_over_all_random_bits() {
        let xs = [0x3F80_0001u32, 0xC0A0_7FFF, 0x0001_C000, 0x7F7E_FFFF];
        let mut x_all = Vec::new();
        let mut r_all = Vec::new();
        for x in xs {
            for r in 0..0x1_0000u32 {
                x_all.push(x);
                // High bits vary too: only the low 16 may matter.
                r_all.push(r | (r.wrapping_mul(0x9E37) << 16));
            }
        }
        let got = run_map(&x_all, &r_all, |b, x, r| {
            let v = b.bitcast(x, ScalarType::F32);
            stochastic_round_bf16(b, v, r)
        });
        for (j, x) in xs.iter().enumerate() {
            let v = f32::from_bits(*x);
            let rounded = &got[j << 16..(j + 1) << 16];
            let down = x & 0xFFFF_0000;
            let ups = rounded.iter().filter(|g| **g != down).count() as u32;
            assert_eq!(ups, x & 0xFFFF, "{x:#010x}: round-up count");
            let sum: f64 = rounded.iter().map(|g| f64::from(f32::from_bits(*g))).sum();
            assert_eq!(sum, f64::from(v) * 65536.0, "{x:#010x}: mean is not v");
        }
    }
}
