//! Transposes of row-major matrices of 2- and 4-byte elements on the host: the copies that give
//! a CPU plan's kernel an operand in the storage it reads ([`super::host`]: a row-major `B` in
//! panels, a transposed `A` row-major) and the adapter's `dU` (`adapter/pass.rs`). Only
//! elements move, so the bits are the source's.
//!
//! With AVX, 4-byte elements go in 8 x 8 tiles through eight `ymm` registers (three rounds of
//! shuffles, as in the well-known 8 x 8 `f32` transpose); other sizes and the edges go element
//! by element. On Zen 3 (AVX2, release, medians of 15), 1 MiB of `f32`: `U` (`[4096, 64]`) into
//! panels of 16 rows 0.33 ms element by element on one thread, 0.20 on two; the `[64, 4096]`
//! transpose of `dU` 0.37 and 0.21 ms (a contiguous copy of the same bytes: 0.06-0.09 ms).

use std::ops::Range;

/// Source rows of one block of [`transpose_into`]: each column of the block reads one element
/// of each, and rows a page or more apart share one L1 set, which holds 8 lines on Zen 3 and
/// 12 on the AVX-512 VM. 512 x 4096 f32 on Zen 3 (release, allocation included, 1 and 2
/// threads), element by element: 3.0 and 1.6 ms with blocks of 8 x 16, 5.7 and 3.0 ms with
/// 16 x 16, 3.6 and 1.8 with 4 x 64; 32 x 32 read row by row took 5.9 ms on one thread. A block
/// of 8 rows is also one tile's rows ([`Tiles`]).
const BLOCK_ROWS: usize = 8;

/// Source columns of one block of [`transpose_into`] (one output row's contiguous run): two
/// tiles.
const BLOCK_COLUMNS: usize = 16;

/// Writes columns `cs` of the row-major `[rows, cols]` matrix of `N`-byte elements `src` as rows
/// of `dst` (column `c` at row `c - cs.start`, `stride` elements per row, the first `rows` of
/// them written), in blocks of [`BLOCK_ROWS`] x [`BLOCK_COLUMNS`] elements, each output row of a
/// block written contiguously; with 4-byte elements and AVX, a block's whole 8 x 8 tiles in
/// registers ([`Tiles`]).
pub(crate) fn transpose_into<const N: usize>(
    src: &[u8],
    (rows, cols): (usize, usize),
    cs: Range<usize>,
    dst: &mut [u8],
    stride: usize,
) {
    let tiles = if N == 4 { Tiles::detect() } else { None };
    for r0 in (0..rows).step_by(BLOCK_ROWS) {
        let r1 = (r0 + BLOCK_ROWS).min(rows);
        for c0 in cs.clone().step_by(BLOCK_COLUMNS) {
            let c1 = (c0 + BLOCK_COLUMNS).min(cs.end);
            let mut c = c0;
            if let Some(tiles) = tiles.filter(|_| r1 - r0 == Tiles::SIDE) {
                while c + Tiles::SIDE <= c1 {
                    tiles.transpose(src, cols, (r0, c), dst, (stride, c - cs.start));
                    c += Tiles::SIDE;
                }
            }
            for c in c..c1 {
                let at = (c - cs.start) * stride;
                let out = &mut dst[(at + r0) * N..(at + r1) * N];
                for (o, r) in out.chunks_exact_mut(N).zip(r0..r1) {
                    let from = (r * cols + c) * N;
                    o.copy_from_slice(&src[from..from + N]);
                }
            }
        }
    }
}

/// The `[cols, rows]` transpose of the row-major `[rows, cols]` matrix of `N`-byte elements
/// `src` ([`transpose_into`]), the output rows split between up to `threads` threads.
pub(crate) fn transposed<const N: usize>(
    src: &[u8],
    rows: usize,
    cols: usize,
    threads: usize,
) -> Vec<u8> {
    let mut dst = vec![0u8; src.len()];
    transposed_into::<N>(src, rows, cols, threads, &mut dst);
    dst
}

/// Writes the `[cols, rows]` transpose of the row-major `[rows, cols]` matrix of `N`-byte
/// elements `src` to `dst` (as long as `src`), the output rows split between up to `threads`
/// threads.
pub(crate) fn transposed_into<const N: usize>(
    src: &[u8],
    rows: usize,
    cols: usize,
    threads: usize,
    dst: &mut [u8],
) {
    super::host::fill_rows(dst, rows * N, threads, |c_first, run| {
        let c_end = c_first + run.len() / (rows * N).max(1);
        transpose_into::<N>(src, (rows, cols), c_first..c_end, run, rows);
    });
}

/// The 8 x 8 tiles of 4-byte elements in AVX registers: a value exists only where the CPU has
/// AVX, which makes [`Tiles::transpose`] safe to call.
#[derive(Clone, Copy)]
struct Tiles(());

impl Tiles {
    /// Rows and columns of a tile.
    const SIDE: usize = 8;

    /// `Some` where this CPU has AVX.
    fn detect() -> Option<Tiles> {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx") {
            return Some(Tiles(()));
        }
        None
    }

    /// Writes the transpose of the 8 x 8 tile at row `r0`, column `c0` of the row-major `src`
    /// (`cols` elements per row) to `dst` at row `o0`, column `r0` (`stride` elements per row).
    ///
    /// # Panics
    /// When the tile or its transpose does not lie inside `src` or `dst` (the callers pass
    /// whole tiles).
    fn transpose(
        self,
        src: &[u8],
        cols: usize,
        (r0, c0): (usize, usize),
        dst: &mut [u8],
        (stride, o0): (usize, usize),
    ) {
        let side = Self::SIDE;
        let from = (r0 * cols + c0) * 4;
        let to = (o0 * stride + r0) * 4;
        assert!(
            c0 + side <= cols
                && from + ((side - 1) * cols + side) * 4 <= src.len()
                && r0 + side <= stride
                && to + ((side - 1) * stride + side) * 4 <= dst.len(),
            "8 x 8 tile out of range"
        );
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `self` exists only where the CPU has AVX (`detect`), and the assertion above
        // keeps the eight 32-byte rows read from `src` and written to `dst` inside them.
        unsafe {
            avx::transpose8x8(
                src.as_ptr().add(from),
                cols,
                dst.as_mut_ptr().add(to),
                stride,
            );
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx {
    use std::arch::x86_64::{
        _mm256_loadu_ps, _mm256_permute2f128_ps, _mm256_shuffle_ps, _mm256_storeu_ps,
        _mm256_unpackhi_ps, _mm256_unpacklo_ps,
    };

    /// Reads 8 rows of 8 4-byte elements at `src` (rows `cols` elements apart) and writes their
    /// transpose as 8 rows at `dst` (`stride` elements apart): pairs of rows interleaved
    /// (`unpack`), pairs of pairs (`shuffle`), then the 128-bit halves exchanged. Only moves:
    /// every element keeps its bits (a NaN's payload included).
    ///
    /// # Safety
    /// The CPU has AVX; the 8 rows of 32 bytes at `src` are readable and those at `dst`
    /// writable.
    #[target_feature(enable = "avx")]
    pub(super) unsafe fn transpose8x8(src: *const u8, cols: usize, dst: *mut u8, stride: usize) {
        let src = src.cast::<f32>();
        let dst = dst.cast::<f32>();
        // SAFETY: rows 0..8 of 8 elements at `src` are readable (the caller's contract).
        let row = |i: usize| unsafe { _mm256_loadu_ps(src.add(i * cols)) };
        let (r0, r1, r2, r3) = (row(0), row(1), row(2), row(3));
        let (r4, r5, r6, r7) = (row(4), row(5), row(6), row(7));
        // Rows 2i and 2i + 1 interleaved: (a0 b0 a1 b1 | a4 b4 a5 b5) and the odd pairs.
        let (t0, t1) = (_mm256_unpacklo_ps(r0, r1), _mm256_unpackhi_ps(r0, r1));
        let (t2, t3) = (_mm256_unpacklo_ps(r2, r3), _mm256_unpackhi_ps(r2, r3));
        let (t4, t5) = (_mm256_unpacklo_ps(r4, r5), _mm256_unpackhi_ps(r4, r5));
        let (t6, t7) = (_mm256_unpacklo_ps(r6, r7), _mm256_unpackhi_ps(r6, r7));
        // Columns j and j + 4 of rows 0..4 (and 4..8): the low pairs of two interleavings
        // (0x44) or their high pairs (0xEE).
        let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
        let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
        let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
        let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
        let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
        let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
        let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
        let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
        // Column j: the low halves of rows 0..4 and 4..8 (0x20); column j + 4 the high (0x31).
        let out = [
            _mm256_permute2f128_ps::<0x20>(s0, s4),
            _mm256_permute2f128_ps::<0x20>(s1, s5),
            _mm256_permute2f128_ps::<0x20>(s2, s6),
            _mm256_permute2f128_ps::<0x20>(s3, s7),
            _mm256_permute2f128_ps::<0x31>(s0, s4),
            _mm256_permute2f128_ps::<0x31>(s1, s5),
            _mm256_permute2f128_ps::<0x31>(s2, s6),
            _mm256_permute2f128_ps::<0x31>(s3, s7),
        ];
        for (j, v) in out.into_iter().enumerate() {
            // SAFETY: rows 0..8 of 8 elements at `dst` are writable (the caller's contract).
            unsafe { _mm256_storeu_ps(dst.add(j * stride), v) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{transpose_into, transposed, BLOCK_ROWS};

    /// Every element lands at its transposed place, for sizes on and off the 8 x 8 tiles and
    /// the 8 x 16 blocks, with 2- and 4-byte elements (4-byte ones through the AVX tiles where
    /// the CPU has AVX).
    #[test]
    fn transposed_moves_every_element() {
        for (rows, cols) in [
            (1, 1),
            (3, 17),
            (8, 8),
            (16, 16),
            (33, 5),
            (40, 70),
            (17, 24),
        ] {
            let value = |r: usize, c: usize| (r * 1000 + c) as u32;
            for (size, src) in [
                (
                    2,
                    (0..rows * cols)
                        .flat_map(|i| (value(i / cols, i % cols) as u16).to_le_bytes())
                        .collect::<Vec<u8>>(),
                ),
                (
                    4,
                    (0..rows * cols)
                        .flat_map(|i| value(i / cols, i % cols).to_le_bytes())
                        .collect(),
                ),
            ] {
                let dst = if size == 2 {
                    transposed::<2>(&src, rows, cols, 1)
                } else {
                    transposed::<4>(&src, rows, cols, 1)
                };
                for r in 0..rows {
                    for c in 0..cols {
                        let (from, to) = ((r * cols + c) * size, (c * rows + r) * size);
                        assert_eq!(
                            dst[to..to + size],
                            src[from..from + size],
                            "{rows}x{cols} of {size}-byte elements at ({r}, {c})"
                        );
                    }
                }
            }
        }
    }

    /// A column range and a wider output row (as a panel's): the tiles start at the range's
    /// first column, write only their `rows` elements of each output row, and keep NaN payloads.
    #[test]
    fn a_column_range_lands_in_its_rows_and_leaves_the_rest() {
        let (rows, cols, stride) = (BLOCK_ROWS * 2, 29, 20);
        let bits = |r: usize, c: usize| 0x7F80_0001u32 + (r * 64 + c) as u32;
        let src: Vec<u8> = (0..rows * cols)
            .flat_map(|i| bits(i / cols, i % cols).to_le_bytes())
            .collect();
        let cs = 3..27;
        let mut dst = vec![0xA5u8; cs.len() * stride * 4];
        transpose_into::<4>(&src, (rows, cols), cs.clone(), &mut dst, stride);
        for (o, c) in cs.enumerate() {
            for j in 0..stride {
                let at = (o * stride + j) * 4;
                let got = u32::from_le_bytes(dst[at..at + 4].try_into().unwrap());
                let want = if j < rows { bits(j, c) } else { 0xA5A5_A5A5 };
                assert_eq!(got, want, "output row {o} (column {c}), element {j}");
            }
        }
    }
}
