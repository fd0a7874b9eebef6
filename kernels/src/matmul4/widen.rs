//! 16-bit activations of the CPU matmuls widened once on the host.
//!
//! A 4-bit matmul with `f16`/`bf16` activations widens every activation vector it loads, and a
//! CPU tile loads each activation row once per tile of weight rows (`N / TN` times): on
//! AVX-512 the widening shuffle shares port 5 with the weight decode and half the FMAs. The
//! host op instead widens the activations (and the bias) to `f32` once, which is exact, runs
//! the `f32`-activation kernel with the same weight dtype (the same products and order), and
//! rounds its `f32` outputs to the activation dtype to nearest even, as the 16-bit kernel's
//! store does (the `half` conversions the reference interpreter uses): the same bits.
//!
//! Memory: for the duration of the call the widened path holds an `f32` copy of the
//! activations (`M * K * 4` bytes for the forward, `M * N * 4` for the input gradient) and the
//! `f32` output (`M * N * 4` or `M * K * 4` bytes) besides the 16-bit output: at M = 2048,
//! K = 4096, N = 11008, 32 MiB and 86 MiB more than the 16-bit kernel's 43 MiB output.

use half::{bf16, f16};
use qforge_ir::DType;

use crate::ops::DeviceCaps;

/// The fewest activation rows for which a CPU host op widens; below, the 16-bit kernel runs,
/// whose activation rows (read once per weight tile) are half the bytes. Measured on the
/// AVX-512 development machine, bf16, NF4, one run window (16-bit kernel against widened):
/// forward K = N = 4096 M = 16 3.29 against 3.85 ms, M = 128 24.0 against 21.4 ms, M = 512
/// 94.7 against 84.9 ms; M = 2048, N = 11008 1037 against 917 ms; input gradient M = 512 108.6
/// against 100.7 ms. Where a decoded plan runs (from 32 rows) the op widens below this too
/// ([`widens`]).
pub(crate) const WIDEN_ROWS: u32 = 64;

/// The fewest rows of `dY` for which the input gradient widens on a CPU with 16 lanes (the LLVM
/// backend with AVX-512): its 16-bit fused kernel ran at half the `f32` one's speed there. Zen 4,
/// 2 threads, release, K = N = 4096, the 16-bit kernel and the widened one alternating in one
/// process, best of 7 to 9, the same bits: bf16 M = 1 3.7 against 4.2 ms, M = 2 3.6 against 3.2,
/// M = 8 7.2 against 5.6, M = 16 9.4 against 5.4 ((K, N) = (4096, 11008): 30.6 against 16.6;
/// (11008, 4096): 33.1 against 24.8), M = 48 24.1 against 12.6; f16 M = 2 10.0 against 10.3,
/// M = 16 22.1 against 18.0, M = 48 59.5 against 46.1. The forward keeps [`WIDEN_ROWS`]: at
/// M = 16 its bf16 kernel took 7.8 against 9.0 ms widened (20.5 against 24.0 at (11008, 4096)).
pub(crate) const WIDEN_DX_ROWS_AVX512: u32 = 2;

/// Whether a CPU host op with 16-bit activations on `caps` widens them: the forward
/// (`forward`) or the input gradient of `m` rows, `decoded` where a decoded plan runs (it reads
/// `f32` activations only). From [`WIDEN_ROWS`] rows, the input gradient with 16 lanes from
/// [`WIDEN_DX_ROWS_AVX512`].
pub(crate) fn widens(caps: DeviceCaps, forward: bool, m: u32, decoded: bool) -> bool {
    let from = match caps {
        DeviceCaps::Cpu { lanes: 16, .. } if !forward => WIDEN_DX_ROWS_AVX512,
        _ => WIDEN_ROWS,
    };
    decoded || m >= from
}

/// Elements per thread below which a pass runs on one thread.
const PER_THREAD: usize = 1 << 16;

/// The `f32` little-endian bytes of the 16-bit (`f16`/`bf16`) little-endian elements `bytes`
/// (exact), on up to `threads` threads.
pub(crate) fn widened(dtype: DType, bytes: &[u8], threads: usize) -> Vec<u8> {
    let mut out = vec![0u8; bytes.len() * 2];
    for_chunks(&mut out, bytes, 4, 2, threads, |dst, src| {
        for (d, s) in dst.chunks_exact_mut(4).zip(src.chunks_exact(2)) {
            let bits = u16::from_le_bytes([s[0], s[1]]);
            let v = match dtype {
                DType::F16 => f16::from_bits(bits).to_f32(),
                _ => bf16::from_bits(bits).to_f32(),
            };
            d.copy_from_slice(&v.to_le_bytes());
        }
    });
    out
}

/// The `f32` little-endian elements `bytes` rounded to nearest even into the 16-bit `dtype`
/// (`f16`/`bf16`), on up to `threads` threads.
pub(crate) fn narrowed(dtype: DType, bytes: &[u8], threads: usize) -> Vec<u8> {
    let mut out = vec![0u8; bytes.len() / 2];
    for_chunks(&mut out, bytes, 2, 4, threads, |dst, src| {
        for (d, s) in dst.chunks_exact_mut(2).zip(src.chunks_exact(4)) {
            let v = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
            let bits = match dtype {
                DType::F16 => f16::from_f32(v).to_bits(),
                _ => bf16::from_f32(v).to_bits(),
            };
            d.copy_from_slice(&bits.to_le_bytes());
        }
    });
    out
}

/// Runs `f` on matching chunks of `dst` (elements of `dst_size` bytes) and `src` (elements of
/// `src_size` bytes), split between up to `threads` scoped threads.
fn for_chunks(
    dst: &mut [u8],
    src: &[u8],
    dst_size: usize,
    src_size: usize,
    threads: usize,
    f: impl Fn(&mut [u8], &[u8]) + Sync,
) {
    let elems = src.len() / src_size;
    let per = elems
        .div_ceil(threads.clamp(1, elems.div_ceil(PER_THREAD).max(1)))
        .max(1);
    std::thread::scope(|s| {
        for (d, s_chunk) in dst
            .chunks_mut(per * dst_size)
            .zip(src.chunks(per * src_size))
        {
            let f = &f;
            s.spawn(move || f(d, s_chunk));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The forward widens from 64 rows; the input gradient from 64 with 4 or 8 lanes and from 2
    /// with 16 (AVX-512); both wherever a decoded plan runs, and not a row below without one.
    #[test]
    fn the_input_gradient_widens_from_two_rows_with_avx512() {
        let cpu = |lanes| DeviceCaps::Cpu { threads: 2, lanes };
        for lanes in [4, 8, 16] {
            let dx_from = if lanes == 16 { 2 } else { 64 };
            for (forward, from) in [(true, 64), (false, dx_from)] {
                let what = format!("{lanes} lanes, forward {forward}");
                assert!(!widens(cpu(lanes), forward, from - 1, false), "{what}");
                assert!(widens(cpu(lanes), forward, from, false), "{what}");
                assert!(widens(cpu(lanes), forward, 1, true), "{what}");
            }
        }
    }

    /// Widening is exact and narrowing rounds as `half` does, over every 16-bit pattern
    /// (NaNs, infinities and subnormals included) and on several threads.
    #[test]
    fn every_16_bit_value_widens_exactly_and_narrows_back() {
        let bytes: Vec<u8> = (0..=u16::MAX).flat_map(u16::to_le_bytes).collect();
        for dtype in [DType::F16, DType::BF16] {
            let wide = widened(dtype, &bytes, 3);
            for (i, w) in wide.chunks_exact(4).enumerate() {
                let v = f32::from_le_bytes([w[0], w[1], w[2], w[3]]);
                let want = match dtype {
                    DType::F16 => f16::from_bits(i as u16).to_f32(),
                    _ => bf16::from_bits(i as u16).to_f32(),
                };
                assert_eq!(v.to_bits(), want.to_bits(), "{dtype} {i:#06x}");
            }
            // Every value is representable, so narrowing gives the pattern back (NaNs as
            // `half` quiets them).
            let back = narrowed(dtype, &wide, 3);
            for (i, b) in back.chunks_exact(2).enumerate() {
                let got = u16::from_le_bytes([b[0], b[1]]);
                let want = match dtype {
                    DType::F16 => f16::from_f32(f16::from_bits(i as u16).to_f32()).to_bits(),
                    _ => bf16::from_f32(bf16::from_bits(i as u16).to_f32()).to_bits(),
                };
                assert_eq!(got, want, "{dtype} {i:#06x}");
            }
        }
        // A value between two bf16 values rounds to the even one.
        let tie = (1.0f32 + 2f32.powi(-8)).to_le_bytes();
        assert_eq!(
            narrowed(DType::BF16, &tie, 1),
            bf16::ONE.to_bits().to_le_bytes()
        );
    }
}
