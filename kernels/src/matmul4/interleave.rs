//! The forward decode's weight with its rows interleaved: what lets
//! [`super::decoded_forward`]'s decode kernel run its rows in vector lanes.
//!
//! The decode writes each column of a group of `R` consecutive weight rows (`R` =
//! [`super::decoded_forward::FwdDecode::rows_per_item`], 16 on AVX2) as `R` consecutive floats of
//! the GEMM's panel. In bitsandbytes' layout those rows' codes are `K / 2` bytes apart, so a
//! vector of them is a gather; here the codes of a group are stored with the rows fastest (byte
//! `b` of the group's row `i` at `b R + i`), and so is the absmax of every run of `scale_cols`
//! columns, so one lane per row loads consecutive bytes and floats. Measured on Zen 3 (2
//! threads, K = N = 4096, `ProfiledDevice`): the decode 3.2-4.1 ms on these against 16-18 ms
//! row by row on bitsandbytes' layout in the same hour (6.4-8.5 on a quieter day) for an `f32`
//! weight, 6.8 against 24 ms for a `bf16` one.

use super::decoded::DecodeInput;
use crate::gemm::host::fill_rows;
use crate::NESTED_BLOCKSIZE;

/// Columns per interleaved absmax: the blocksize where every block lies in one weight row (`k`
/// a multiple of it), else 16 (the decode's run; blocksizes are multiples of 16).
pub(super) fn scale_cols(k: u32, blocksize: u32) -> u32 {
    if k.is_multiple_of(blocksize) {
        blocksize
    } else {
        16
    }
}

/// One strip of a 4-bit weight's rows in groups of `r` rows, each group's codes and absmax with
/// the rows fastest ([`Interleaved::fill`]). The buffers are refilled strip after strip: a
/// fresh 8 MiB buffer per call cost about 6 ms of first-touch page faults on the development
/// VM, more than the copy (1.2-1.9 ms).
#[derive(Default)]
pub(super) struct Interleaved {
    /// `[groups, k / 2, r]`: byte `b` of row `first + g r + i` at `(g (k / 2) + b) r + i`.
    pub codes: Vec<u8>,
    /// `[groups, k / scale_cols, r]`: the absmax of columns `s scale_cols ..` of row
    /// `first + g r + i` at `(g (k / scale_cols) + s) r + i`, decoded where nested.
    pub absmax: Vec<f32>,
}

impl Interleaved {
    /// Refills the buffers with rows `first .. first + rows` of `w` (`[n, k]` in bitsandbytes'
    /// layout, blocks of `blocksize` over the flattened weight), rows from `n` on repeating
    /// row `n - 1`, the codes' groups split between up to `threads` threads. A nested absmax
    /// is decoded as the fused kernel's `block_absmax` decodes it,
    /// `nested_code[qabsmax] * nested_absmax[block / 256] + offset` in `f32` (one rounding per
    /// operation, as every device computes it), so the decoded weight keeps its bits. `k` is a
    /// multiple of 16 and of `scale_cols`, `rows` of `r`, `r` a power of two up to 16, and the
    /// inputs hold the weight (the op checked their lengths).
    ///
    /// # Errors
    /// [`qforge_runtime::Error::Invalid`] when `w` has neither an absmax nor the nested four
    /// and the offset.
    pub(super) fn fill(
        &mut self,
        w: &DecodeInput<'_>,
        (n, k): (u32, u32),
        (first, rows): (u32, u32),
        (blocksize, scale_cols, r): (u32, u32, u32),
        threads: usize,
    ) -> qforge_runtime::Result<()> {
        let scale = Scale::of(w)?;
        let (n, k, r) = (n as usize, k as usize, r as usize);
        let runs = k / scale_cols as usize;
        let groups = rows as usize / r;
        self.codes.resize(groups * k / 2 * r, 0);
        self.absmax.resize(groups * runs * r, 0.0);
        let row = |g: usize, i: usize| (first as usize + g * r + i).min(n - 1);
        // The codes, groups split between the threads.
        fill_rows(&mut self.codes, k / 2 * r, threads, |g0, run| {
            for (g, codes) in (g0..).zip(run.chunks_exact_mut(k / 2 * r)) {
                let src = |i: usize| &w.codes[row(g, i) * k / 2..][..k / 2];
                if r.is_multiple_of(8) {
                    let rows: Vec<&[u8]> = (0..r).map(src).collect();
                    interleave_rows(&rows, codes);
                } else {
                    for i in 0..r {
                        for (b, &byte) in src(i).iter().enumerate() {
                            codes[b * r + i] = byte;
                        }
                    }
                }
            }
        });
        // Blocksizes are powers of two: a shift, not a division per run.
        let shift = blocksize.trailing_zeros();
        for (g, absmax) in self.absmax.chunks_exact_mut(runs * r).enumerate() {
            let row = |i: usize| row(g, i);
            for i in 0..r {
                let e0 = row(i) * k;
                for s in 0..runs {
                    let block = (e0 + s * scale_cols as usize) >> shift;
                    absmax[s * r + i] = scale.absmax(block);
                }
            }
        }
        Ok(())
    }
}

/// The weight's absmax, plain or nested.
enum Scale<'a> {
    Plain(&'a [f32]),
    Nested {
        qabsmax: &'a [u8],
        nested_absmax: &'a [f32],
        nested_code: &'a [f32],
        offset: f32,
    },
}

impl<'a> Scale<'a> {
    /// `w`'s absmax.
    ///
    /// # Errors
    /// [`qforge_runtime::Error::Invalid`] when `w` has neither an absmax nor the nested four
    /// and the offset.
    fn of(w: &DecodeInput<'a>) -> qforge_runtime::Result<Self> {
        let nested = (w.qabsmax, w.nested_absmax, w.nested_code, w.offset);
        match (w.absmax, nested) {
            (Some(absmax), _) => Ok(Scale::Plain(absmax)),
            (None, (Some(qabsmax), Some(nested_absmax), Some(nested_code), Some(offset))) => {
                Ok(Scale::Nested {
                    qabsmax,
                    nested_absmax,
                    nested_code,
                    offset,
                })
            }
            _ => Err(qforge_runtime::Error::Invalid(
                "matmul_4bit: the weight has neither an absmax nor a nested absmax".into(),
            )),
        }
    }

    /// Block `block`'s absmax: `absmax[block]`, or the nested one decoded.
    fn absmax(&self, block: usize) -> f32 {
        match *self {
            Scale::Plain(absmax) => absmax[block],
            Scale::Nested {
                qabsmax,
                nested_absmax,
                nested_code,
                offset,
            } => {
                let nested = nested_absmax[block / NESTED_BLOCKSIZE as usize];
                nested_code[qabsmax[block] as usize] * nested + offset
            }
        }
    }
}

/// Byte `b` of row `i` of `rows` (a multiple of 8 rows of equal length, a multiple of 8) to
/// `dst[b * rows.len() + i]`, 8 rows by 8 columns at a time as an 8 x 8 byte transpose in eight
/// `u64`s ([`transpose_8x8`]), all rows of 8 columns before the next (each output line written
/// whole in one visit): 1.2-1.9 ms for the 8 MiB of a 4096 x 4096 weight's codes on one Zen 3
/// thread, buffers already touched.
fn interleave_rows(rows: &[&[u8]], dst: &mut [u8]) {
    let r = rows.len();
    for (c, out) in dst.chunks_exact_mut(8 * r).enumerate() {
        let b0 = 8 * c;
        for (half, rows) in rows.chunks_exact(8).enumerate() {
            let mut a = [0u64; 8];
            for (a, row) in a.iter_mut().zip(rows) {
                let bytes: [u8; 8] = row[b0..b0 + 8].try_into().expect("8 bytes");
                *a = u64::from_le_bytes(bytes);
            }
            for (j, v) in transpose_8x8(a).iter().enumerate() {
                out[j * r + 8 * half..][..8].copy_from_slice(&v.to_le_bytes());
            }
        }
    }
}

/// The 8 x 8 byte matrix `a` (row `i` = `a[i]`, byte `j` its `j`-th little-endian byte)
/// transposed.
#[inline(always)]
fn transpose_8x8(mut a: [u64; 8]) -> [u64; 8] {
    /// Swaps the high `shift` bits of each `2 shift`-bit unit of `a[i]` with the low ones of
    /// `a[i + d]`.
    #[inline(always)]
    fn swap(a: &mut [u64; 8], (i, d): (usize, usize), shift: u32, low: u64) {
        let (x, y) = (a[i], a[i + d]);
        a[i] = (x & low) | ((y << shift) & !low);
        a[i + d] = ((x >> shift) & low) | (y & !low);
    }
    const L32: u64 = 0x0000_0000_FFFF_FFFF;
    const L16: u64 = 0x0000_FFFF_0000_FFFF;
    const L8: u64 = 0x00FF_00FF_00FF_00FF;
    for i in 0..4 {
        swap(&mut a, (i, 4), 32, L32);
    }
    for i in [0, 1, 4, 5] {
        swap(&mut a, (i, 2), 16, L16);
    }
    for i in [0, 2, 4, 6] {
        swap(&mut a, (i, 1), 8, L8);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::Interleaved;
    use crate::matmul4::decoded::DecodeInput;

    /// Every code byte and absmax lands where the decode kernel reads it (byte `b` of strip row
    /// `g r + i` at `(g (k / 2) + b) r + i`, rows past the weight's end repeating its last),
    /// whether the groups are split between threads (the codes here pass the threaded size)
    /// or not, with 16 rows a group (the 8 x 8 byte transposes) and 4 (byte by byte).
    #[test]
    fn interleaved_codes_and_absmax_land_in_place_on_any_threads() {
        let (n, k, blocksize) = (150usize, 4096usize, 64u32);
        let codes: Vec<u8> = (0..n * k / 2).map(|i| (i * 31 % 251) as u8).collect();
        let absmax: Vec<f32> = (0..n * k / 64).map(|i| i as f32).collect();
        let w = DecodeInput {
            codes: &codes,
            n_scales: absmax.len() as u32,
            absmax: Some(&absmax),
            qabsmax: None,
            offset: None,
            n_nested: None,
            nested_absmax: None,
            nested_code: None,
        };
        for r in [16usize, 4] {
            let (first, rows) = (16u32, 144u32);
            for threads in [1, 2, 3] {
                let mut got = Interleaved::default();
                got.fill(
                    &w,
                    (n as u32, k as u32),
                    (first, rows),
                    (blocksize, 64, r as u32),
                    threads,
                )
                .unwrap();
                assert_eq!(got.codes.len(), rows as usize * k / 2);
                for s in 0..rows as usize {
                    let (g, i) = (s / r, s % r);
                    let row = (first as usize + s).min(n - 1);
                    for b in 0..k / 2 {
                        assert_eq!(
                            got.codes[(g * k / 2 + b) * r + i],
                            codes[row * k / 2 + b],
                            "r = {r}, {threads} threads: strip row {s}, byte {b}"
                        );
                    }
                    for run in 0..k / 64 {
                        assert_eq!(
                            got.absmax[(g * k / 64 + run) * r + i],
                            absmax[row * k / 64 + run],
                            "r = {r}, {threads} threads: strip row {s}, absmax {run}"
                        );
                    }
                }
            }
        }
    }
}
