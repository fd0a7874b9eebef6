//! Inputs of the bf16 dot-product probes: bf16 factors and f32 accumulators drawn around a
//! common exponent (so products and accumulators overlap and cancel, and rounding ties occur),
//! the exponent of each batch anywhere from near the subnormals to near overflow, with zeros
//! of both signs, subnormals, infinities and NaNs mixed in.

/// A deterministic generator of probe inputs (xorshift64).
pub(super) struct Cases(u64);

/// The exponent (biased) around which one batch's values are drawn, how far they spread, and
/// how many draws in 64 are signed zeros.
#[derive(Clone, Copy)]
pub(super) struct Scale {
    centre: i32,
    spread: i32,
    zeros: u64,
}

impl Cases {
    /// The generator of `seed`: distinct seeds give distinct sequences (the state is the seed
    /// scrambled by SplitMix64's finalizer, a bijection; a zero state, which xorshift cannot
    /// leave, becomes 1).
    pub(super) fn new(seed: u64) -> Cases {
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Cases((z ^ (z >> 31)).max(1))
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A batch's scale: a centre anywhere from near the subnormals to near overflow (products
    /// of two factors at half the centre), a spread of 0 to 30 binades; one batch in 8 is half
    /// zeros (sums of signed zeros only), the others have 1 in 64.
    pub(super) fn scale(&mut self) -> Scale {
        let r = self.next();
        Scale {
            centre: 27 + (r % 200) as i32,
            spread: [0, 1, 3, 8, 30][(r >> 32) as usize % 5],
            zeros: if (r >> 40).is_multiple_of(8) { 32 } else { 1 },
        }
    }

    /// A biased exponent within `spread` of `centre` (clamped to the normal range).
    fn exponent(r: u64, centre: i32, spread: i32) -> u32 {
        let off = (r % (2 * spread as u64 + 1)) as i32 - spread;
        (centre + off).clamp(1, 254) as u32
    }

    /// A bf16 factor (bits) whose products with another factor of this scale lie near the
    /// scale's accumulators; `s.zeros` in 64 a signed zero, 1 in 64 each a subnormal, infinity
    /// or NaN.
    pub(super) fn bf16(&mut self, s: Scale) -> u16 {
        let r = self.next();
        let sign = ((r >> 20) & 1) as u16;
        match r % 64 {
            k if k < s.zeros => sign << 15,
            61 => (sign << 15) | ((r >> 24) as u16 & 0x7f).max(1),
            62 => (sign << 15) | 0x7f80,
            63 => 0x7fc0 | ((r >> 24) as u16 & 0x3f),
            _ => {
                let e = Self::exponent(r >> 8, (s.centre + 127) / 2, s.spread / 2 + 1) as u16;
                (sign << 15) | (e << 7) | ((r >> 24) as u16 & 0x7f)
            }
        }
    }

    /// An f32 accumulator at this scale; `s.zeros` in 64 a signed zero, 1 in 64 each a
    /// subnormal, an infinity or a NaN.
    pub(super) fn f32(&mut self, s: Scale) -> f32 {
        let r = self.next();
        let sign = (((r >> 20) & 1) as u32) << 31;
        f32::from_bits(match r % 64 {
            k if k < s.zeros => sign,
            61 => sign | 0x7f80_0000,
            62 => 0x7fc0_0000 | ((r >> 30) as u32 & 0x3f_ffff),
            63 => sign | ((r >> 30) as u32 & 0x7f_ffff).max(1),
            _ => {
                sign | Self::exponent(r >> 8, s.centre, s.spread + 1) << 23
                    | (r >> 30) as u32 & 0x7f_ffff
            }
        })
    }
}
