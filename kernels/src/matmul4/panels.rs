//! The input gradient's weight layout: the 4-bit codes of `W [N, K]` regrouped into panels of
//! [`DX_PANEL`] columns, so that a work item's columns of consecutive weight rows are
//! consecutive bytes (the packing of a BLIS-style GEMM, done on the codes, not on decoded
//! values).
//!
//! `dX = dY @ dequant(W)` reduces over `n`: a tile of `dX` columns `k0 ..` reads a few bytes of
//! every weight row, and in bitsandbytes' row-major packing those rows lie `K / 2` bytes apart.
//! At K = 4096 that is 2 KiB: every row's bytes fall in the same few cache sets, the lines are
//! evicted before the tile next to it reuses them, and the hardware prefetcher does not cross
//! the page boundaries. In the panel layout a tile of 32 columns streams 16 consecutive bytes per
//! row: on the development machine (Xeon, AVX-512) the M = 512, K = N = 4096 input gradient
//! took half the time (184 to 92 ms). The codes are the same codes, decoded the same way and summed in
//! the same order: the layout changes no bit of the result.
//!
//! Layout: element `(n, k)` of `W` (nibble `n * K + k` of `packed`, the high nibble first) is
//! nibble `32 * (P(k) * N + n) + k % 32` of the panels, `P(k) = k / 32`, again the high nibble
//! first; a panel is `N` rows of 16 bytes, `ceil(K / 32) * N * 16` bytes in all (the last
//! panel's columns past `K` are zero).
//!
//! The scales too: the absmax (or the double-quantized `qabsmax`) of element `(n, k)` is entry
//! `(k / c) * N + n` of the scale layout, `c` = [`scale_chunk`] (the blocksize, or the largest
//! power of two dividing both it and `K` when blocks straddle rows), so that the scales of a
//! tile's consecutive weight rows are consecutive too; in the flat layout they lie `K /
//! blocksize` entries apart, and at N = 11008 those lines no longer fit in L2 (M = 512, K =
//! 4096: 394 ms before, 193-212 ms after). The nested absmax stays flat (one per 256 blocks).

use qforge_runtime::{Error, Result};

/// Columns of `dX` per panel of the input gradient's weight layout (16 bytes of codes per
/// weight row: a 32-column AVX-512 tile reads one panel row per element of its reduction).
pub const DX_PANEL: u32 = 32;

/// Columns per scale of the input gradient's scale layout (module docs) for a weight with rows
/// of `k` elements and absmax blocks of `blocksize` (a power of two): the largest power of two
/// dividing both, so that every `c` consecutive columns of a row lie in one block.
pub fn scale_chunk(k: usize, blocksize: u32) -> u32 {
    let row = if k == 0 { u32::MAX } else { k.trailing_zeros() };
    1 << row.min(blocksize.trailing_zeros())
}

/// The scales `flat` (one per block of `blocksize` elements of the flat `[n, k]` weight: the
/// absmax or the `qabsmax`) in the input gradient's scale layout with `chunk` columns per scale
/// ([`scale_chunk`]): `n * k / chunk` entries, entry `(j, row)` at `j * n + row`.
///
/// # Errors
/// [`Error::Invalid`] naming the value when `blocksize` or `chunk` is not a power of two,
/// `chunk` does not divide both `k` and `blocksize`, or `flat` does not hold
/// `ceil(n * k / blocksize)` scales.
pub fn pack_dx_scales<T: Copy>(
    flat: &[T],
    n: usize,
    k: usize,
    blocksize: u32,
    chunk: u32,
) -> Result<Vec<T>> {
    let fits = blocksize.is_power_of_two()
        && chunk.is_power_of_two()
        && chunk <= blocksize
        && k.is_multiple_of(chunk as usize);
    if !fits {
        return Err(Error::Invalid(format!(
            "pack_dx_scales: a scale chunk of {chunk} columns must be a power of two dividing \
             K = {k} and the blocksize {blocksize}"
        )));
    }
    let want = n.saturating_mul(k).div_ceil(blocksize as usize);
    if flat.len() != want {
        return Err(Error::Invalid(format!(
            "pack_dx_scales: {} scales given; a [{n}, {k}] weight in blocks of {blocksize} has {want}",
            flat.len()
        )));
    }
    Ok(scales_of(flat, n, k, blocksize, chunk))
}

/// [`pack_dx_scales`] of arguments known to fit.
pub(crate) fn scales_of<T: Copy>(
    flat: &[T],
    n: usize,
    k: usize,
    blocksize: u32,
    chunk: u32,
) -> Vec<T> {
    let (bs, c) = (blocksize as usize, chunk as usize);
    let chunks = k / c;
    let mut out = Vec::with_capacity(chunks * n);
    for j in 0..chunks {
        out.extend((0..n).map(|row| flat[(row * k + j * c) / bs]));
    }
    out
}

/// Bytes of one panel row (two codes per byte).
const ROW_BYTES: usize = DX_PANEL as usize / 2;

/// Bytes of the panel layout of an `[n, k]` weight: `ceil(k / 32) * n * 16`.
pub fn dx_panel_bytes(n: usize, k: usize) -> usize {
    k.div_ceil(DX_PANEL as usize)
        .saturating_mul(n)
        .saturating_mul(ROW_BYTES)
}

/// The 4-bit codes of an `[n, k]` weight (`packed`: bitsandbytes' flat packing, `ceil(n * k /
/// 2)` bytes) in the input gradient's panel layout (module docs), [`dx_panel_bytes`] long.
/// Panels are filled by up to `threads` threads (the host op passes the device's).
///
/// # Errors
/// [`Error::Invalid`] naming the buffer when `packed` is not `ceil(n * k / 2)` bytes.
pub fn pack_dx_panels(packed: &[u8], n: usize, k: usize, threads: usize) -> Result<Vec<u8>> {
    let want = n.saturating_mul(k).div_ceil(2);
    if packed.len() != want {
        return Err(Error::Invalid(format!(
            "pack_dx_panels: packed has {} bytes; a [{n}, {k}] 4-bit weight has {want}",
            packed.len()
        )));
    }
    Ok(panels_of(packed, n, k, threads))
}

/// [`pack_dx_panels`] of a `packed` known to be `ceil(n * k / 2)` bytes.
pub(crate) fn panels_of(packed: &[u8], n: usize, k: usize, threads: usize) -> Vec<u8> {
    let mut out = vec![0u8; dx_panel_bytes(n, k)];
    if out.is_empty() {
        return out;
    }
    let panel_len = n * ROW_BYTES;
    let panels = out.len() / panel_len;
    let per_thread = panels.div_ceil(threads.clamp(1, panels));
    std::thread::scope(|s| {
        for (chunk, dst) in out.chunks_mut(per_thread * panel_len).enumerate() {
            s.spawn(move || fill_panels(packed, n, k, chunk * per_thread, dst));
        }
    });
    out
}

/// Weight rows [`fill_panels`] copies into one panel before it moves to the next.
const ROWS_PER_VISIT: usize = 16;

/// Fills the whole panels in `dst` (each `n` rows of [`ROW_BYTES`]), the first being panel
/// `first`, from the flat packing. With `K` even every row starts on a byte: the rows go by in
/// blocks of [`ROWS_PER_VISIT`], each block's 16 bytes per panel copied into one panel after
/// the other, so that a panel receives 256 consecutive bytes per visit (a 4096 x 4096 weight
/// on 2 threads of the development VM: 1.1-1.7 ms, against 2.7-3.8 ms panel by panel, where
/// each row's 16 bytes were read from rows 2 KiB apart).
fn fill_panels(packed: &[u8], n: usize, k: usize, first: usize, dst: &mut [u8]) {
    let panel_len = n * ROW_BYTES;
    if k % 2 == 1 {
        for (j, panel) in dst.chunks_mut(panel_len).enumerate() {
            fill_odd_panel(packed, n, k, first + j, panel);
        }
        return;
    }
    for (block, rows) in packed.chunks(ROWS_PER_VISIT * k / 2).enumerate() {
        let block_at = block * ROWS_PER_VISIT * ROW_BYTES;
        for (j, panel) in dst.chunks_mut(panel_len).enumerate() {
            for (r, src) in rows.chunks_exact(k / 2).enumerate() {
                // The panel's columns of this row: 16 bytes, fewer in a last partial panel
                // (whose bytes past `K` stay zero).
                let codes = src.get((first + j) * ROW_BYTES..).unwrap_or(&[]);
                let at = block_at + r * ROW_BYTES;
                let at = &mut panel[at..at + ROW_BYTES];
                match codes.get(..ROW_BYTES) {
                    Some(full) => at.copy_from_slice(full),
                    None => at[..codes.len()].copy_from_slice(codes),
                }
            }
        }
    }
}

/// Fills panel `p` (`n` rows of [`ROW_BYTES`]) from the flat packing of a weight with an odd
/// `K`, code by code where a row starts inside a byte.
fn fill_odd_panel(packed: &[u8], n: usize, k: usize, p: usize, panel: &mut [u8]) {
    let k0 = p * DX_PANEL as usize;
    let cols = (k - k0).min(DX_PANEL as usize);
    for (row, dst) in panel.chunks_mut(ROW_BYTES).enumerate() {
        let e0 = row * k + k0;
        if e0.is_multiple_of(2) {
            // Byte-aligned: the row's bytes as they are.
            let src = &packed[e0 / 2..(e0 + cols).div_ceil(2)];
            dst[..src.len()].copy_from_slice(src);
            if cols % 2 == 1 {
                // The byte's low nibble is the next row's first code.
                dst[cols / 2] &= 0xf0;
            }
        } else {
            for c in 0..cols {
                let code = nibble(packed, e0 + c);
                dst[c / 2] |= if c % 2 == 0 { code << 4 } else { code };
            }
        }
    }
    debug_assert!(n * ROW_BYTES == panel.len());
}

/// Code `e` of the flat packing (the high nibble first).
fn nibble(packed: &[u8], e: usize) -> u8 {
    let byte = packed[e / 2];
    if e.is_multiple_of(2) {
        byte >> 4
    } else {
        byte & 15
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every code lands where the module docs say, for even and odd `K` and a last panel
    /// that is full or partial, on one thread and several.
    #[test]
    fn every_code_lands_at_its_documented_nibble() {
        // More than `ROWS_PER_VISIT` rows too: a block of 16 rows, then a partial one.
        for (n, k) in [
            (3usize, 64usize),
            (5, 33),
            (4, 7),
            (2, 96),
            (7, 45),
            (1, 1),
            (37, 70),
            (20, 64),
        ] {
            let packed: Vec<u8> = (0..(n * k).div_ceil(2))
                .map(|i| (i * 37 + 11) as u8)
                .collect();
            for threads in [1, 3] {
                let panels = pack_dx_panels(&packed, n, k, threads).unwrap();
                assert_eq!(panels.len(), k.div_ceil(32) * n * 16, "[{n}, {k}]");
                let mut want = vec![0u8; panels.len()];
                for row in 0..n {
                    for col in 0..k {
                        let at = 32 * ((col / 32) * n + row) + col % 32;
                        let code = nibble(&packed, row * k + col);
                        want[at / 2] |= if at % 2 == 0 { code << 4 } else { code };
                    }
                }
                assert_eq!(panels, want, "[{n}, {k}] on {threads} threads");
            }
        }
    }

    /// The chunk divides both `K` and the blocksize, and every scale is its chunk's block's.
    #[test]
    fn scales_land_at_their_chunk_and_row() {
        assert_eq!(scale_chunk(4096, 64), 64);
        assert_eq!(scale_chunk(11008, 256), 256);
        assert_eq!(scale_chunk(130, 64), 2);
        assert_eq!(scale_chunk(77, 64), 1);
        for (n, k, bs) in [
            (3usize, 128usize, 64u32),
            (5, 130, 64),
            (4, 77, 32),
            (2, 96, 128),
        ] {
            let flat: Vec<u32> = (0..(n * k).div_ceil(bs as usize) as u32).collect();
            let c = scale_chunk(k, bs);
            let scales = pack_dx_scales(&flat, n, k, bs, c).unwrap();
            assert_eq!(scales.len(), n * k / c as usize, "[{n}, {k}] bs {bs}");
            for row in 0..n {
                for col in 0..k {
                    let at = (col / c as usize) * n + row;
                    assert_eq!(
                        scales[at],
                        flat[(row * k + col) / bs as usize],
                        "[{n}, {k}] bs {bs} at ({row}, {col})"
                    );
                }
            }
        }
    }

    #[test]
    fn scales_of_another_shape_or_chunk_are_refused_naming_it() {
        let flat = [1.0f32; 4];
        for (k, bs, chunk, what) in [
            (128, 64, 3, "chunk of 3"),
            (96, 64, 64, "K = 96"),
            (128, 64, 128, "chunk of 128"),
            (128, 48, 16, "blocksize 48"),
            (64, 64, 64, "4 scales given"),
        ] {
            let e = pack_dx_scales(&flat, 2, k, bs, chunk)
                .unwrap_err()
                .to_string();
            assert!(e.contains(what), "{e}");
        }
    }

    #[test]
    fn a_packing_of_the_wrong_length_is_refused_with_its_shape() {
        let e = pack_dx_panels(&[0; 3], 2, 4, 1).unwrap_err().to_string();
        assert!(e.contains("3 bytes") && e.contains("[2, 4]"), "{e}");
    }
}
