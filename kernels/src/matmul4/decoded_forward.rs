//! The forward's weight decoded once, in the dense GEMM's panels with partial-major columns: the
//! plan of `y = x @ dequant(W).T (+ bias)` on an AVX2 or AVX-512 CPU from
//! [`FORWARD_DECODE_FROM_ROWS`] rows of `x` on.
//!
//! The fused forward keeps [`super::K_ORDER`]'s 16 partials of every output in registers: with
//! AVX2's 8 lanes that is two `ymm` registers per output, so its 8 x 2 tile's 16 outputs want
//! all 16 registers for their sums alone, and LLVM keeps them on the stack (`docs/bench.md`; on
//! Zen 3 it ran at 40-60 GFLOP/s from M = 128 on). `strided 16` is also 16 sequential sums, one
//! per partial, each over every 16th element: stored partial-major (logical column `c` of `x`
//! and of the weight at `(c % 16) * (K / 16) + c / 16`), each partial's elements are one
//! contiguous run, and the library's dense GEMM with 16 partials ([`crate::Gemm::partials`])
//! runs each partial as its sequential column-lanes loop (6 x 16 with AVX2: 12 sums in
//! registers, no stack) and adds the partials by `K_ORDER`'s halving tree. So from
//! [`FORWARD_DECODE_FROM_ROWS`] rows on, `x` is permuted once on the host, the weight is decoded
//! once (this kernel, into the GEMM's panels, one strip of weight rows at a time, at most
//! [`STRIP_BYTES`] of them at once), and the GEMM runs on each strip: the weight values are those
//! the fused kernel decodes (`code[nibble] * absmax` with its table and its `block_absmax`,
//! rounded to the same weight dtype), the order is `K_ORDER`, the bias is one `f32` add after the
//! sum, so the bits are the fused kernel's.
//!
//! Measured on Zen 3 (2 threads, release, the fused kernel with its suggested tile against the
//! op's choice in one process, best of 3 and 7, outputs compared bit for bit), f32, K = N = 4096:
//! M = 128 91.5 against 64.8 ms, M = 512 298 against 158 ms (the GEMM alone 110 ms, the
//! `gemm` crate 104 ms), M = 2048 1250 against 506 ms; (K, N) = (4096, 11008) M = 128 227
//! against 163 ms, M = 512 951 against 392 ms; (11008, 4096) M = 512 910 against 357 ms; bf16
//! (widened) M = 512 336 against 170 ms. Since the decode writes whole cache lines (stop 61,
//! `docs/bench.md`) it takes about 0.4-0.5 ns per weight on the 2 threads (6.4-8.5 ms for
//! 16.8 M; 1.5 ns before), and the forward at M = 128, K = N = 4096 35-41 ms. It then pays
//! from 32 rows (best of 7 against 3 in one process): M = 32, K = N = 4096 19.8 against 23.1 ms,
//! (4096, 11008) 43.0 against 61.8, (11008, 4096) 46.7 against 70.9; at M = 16 22.2 against
//! 17.9 and 37.5 against 26.6, so below 32 rows the fused kernel runs. Since the decode runs one
//! vector lane per weight row, on codes and absmax the host interleaves strip by strip (stop 63,
//! `interleave.rs`; 1.2-1.9 ms of copying at K = N = 4096), the forward took, in one process
//! alternating with the row by row decode (best and median of 5, same bits): M = 128 f32 42.3 /
//! 52.1 against 45.5 / 57.4 ms, bf16 46.0 / 48.3 against 56.5 / 57.1; M = 512 f32 150.0 / 150.9
//! against 148.7 / 150.0 (even), bf16 163.4 / 191.6 against 175.7 / 203.2. Still below 32 rows the
//! fused kernel wins (M = 16 f32: 16.0 against 18.9 ms).
//!
//! With AVX-512 (16 lanes) the fused kernel's 5 x 4 tile keeps its sums in registers, but it ran at
//! a third of the f32 peak on Zen 4 (51-80 GFLOP/s from M = 128 on, `qforge bench --suite train`),
//! and the GEMM's 8 x 32 tile on the decoded weight runs much faster there. Zen 4, 2 threads,
//! release, the fused kernel and this plan alternating in one process, best of 3 to 7, the same
//! bits, f32: M = 32, K = N = 4096 10.6 against 11.1 ms, (K, N) = (4096, 11008) 26.8 against 33.6,
//! (11008, 4096) 31.2 against 30.7 (even); M = 64 15.3 against 21.0; M = 128 27.4 against 52.7,
//! 76.1 against 141.8, 75.3 against 129.1; M = 512 124 against 208 and 236 against 498 (at (11008,
//! 4096)); M = 2048 384 against 692; bf16 (widened) M = 128 36.7 against 41.2, M = 512 113 against
//! 134 and 283 against 389 at (4096, 11008). So it runs from the same 32 rows.
//!
//! Kernel `dequantize_fwd_panels_{qt}_s{S}_w{wdtype}_p{P}_interleaved{R}_strided16`: `(k,
//! n_items, n_packed, n_scales: u32, packed: u8[n_packed] read, absmax: f32[n_scales] read,
//! n_out: u32, out: f32[n_out] write)`, one strip's weight rows with their rows interleaved in
//! groups of `R` ([`FwdDecode::rows_per_item`]; `interleave.rs`: byte `b` of the group's row
//! `i` at `(group (K / 2) + b) R + i`, the absmax of its columns `s S ..` at `(group (K / S) +
//! s) R + i`, a nested absmax decoded by the host as the fused kernel decodes it), `n_out` the
//! strip's rows (a whole number of panels) times `K`. Grid: one work item per group and 16
//! columns, `n_items` = groups times `K / 16`: work item `w` takes group `w % (P / R)` of panel
//! `t / (K / 16)` and columns `16 g .. 16 g + 16` with `t = w / (P / R)`, `g = t % (K / 16)`
//! (the groups fastest: consecutive items fill the same cache lines of `out`), and decodes them
//! with one vector lane per row into `out` as the GEMM's `B` in panels of `P` rows
//! ([`crate::Layout::Panels`]) with partial-major columns: column `c` of strip row `r` at
//! `((r / P) K + (c % 16) (K / 16) + c / 16) P + r % P`.

use qforge_macros::kernel;

use super::decoded::{place_columns, DecodeInput, STRIP_BYTES};
use super::interleave::{self, Interleaved};
use super::{Matmul4, TileConfig, K_ORDER};
use crate::funcs::round_to;
use crate::gemm::host::{column_tile, fill_rows, gemm_on_panels};
use crate::gemm::scratch;
use crate::gemm::transpose::transpose_into;
use crate::ops::{cached_typed, DeviceCaps};
use crate::{check_float_dtype, QuantType};
use qforge_ir::dsl::{Float, FloatOut, In, Out, TypedKernel};
use qforge_ir::{DType, Error, ReduceOrder, Result, Rounding};
use qforge_runtime::{launch_typed, Device};

/// Rows of `x` from which an AVX2 or AVX-512 CPU (8 or 16 vector lanes) decodes the forward's
/// weight once (module docs).
pub const FORWARD_DECODE_FROM_ROWS: usize = 32;

/// The partials of [`K_ORDER`] (`strided 16`), the GEMM's [`crate::Gemm::partials`].
pub const FORWARD_PARTIALS: u32 = 16;

const _: () = assert!(matches!(K_ORDER, ReduceOrder::Strided(FORWARD_PARTIALS)));

/// One decode kernel variant (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FwdDecode {
    /// NF4 or FP4.
    pub quant_type: QuantType,
    /// Columns per interleaved absmax ([`interleave::scale_cols`]: the blocksize, or 16 where
    /// blocks straddle weight rows), a power of two from 16.
    pub scale_cols: u32,
    /// The dtype the decoded weight is rounded to (stored as `f32`).
    pub weight_dtype: DType,
    /// Weight rows per output panel (the GEMM tile's `TN`, a power of two up to 64).
    pub panel: u32,
}

/// Weight rows one work item of the decode kernel decodes (fewer for narrower panels): a panel
/// of 16 rows fills a cache line of each of its columns in one visit, and two `ymm` vectors.
const ROWS_PER_ITEM: u32 = 16;

impl FwdDecode {
    /// Weight rows per work item, the interleaved groups' rows: 16, or the panel width when
    /// narrower.
    pub fn rows_per_item(&self) -> u32 {
        self.panel.min(ROWS_PER_ITEM)
    }

    /// The kernel name, e.g. `dequantize_fwd_panels_nf4_s64_wf32_p16_interleaved16_strided16`.
    pub fn name(&self) -> String {
        format!(
            "dequantize_fwd_panels_{}_s{}_w{}_p{}_interleaved{}_strided{FORWARD_PARTIALS}",
            self.quant_type,
            self.scale_cols,
            self.weight_dtype,
            self.panel,
            self.rows_per_item(),
        )
    }

    /// Builds the kernel with its typed signature ([`DequantizeFwdPanelsArgs`]).
    ///
    /// # Errors
    /// [`Error::Unsupported`] for an unsupported weight dtype, columns per absmax that are not
    /// a power of two from 16, or a panel width that is not a power of two up to 64.
    pub fn build(&self) -> Result<TypedKernel<DequantizeFwdPanels>> {
        check_float_dtype(self.weight_dtype)?;
        if !self.scale_cols.is_power_of_two() || self.scale_cols < 16 {
            return Err(Error::Unsupported(format!(
                "{}: the columns per absmax must be a power of two from 16",
                self.name()
            )));
        }
        if !self.panel.is_power_of_two() || self.panel > super::MAX_TILE {
            return Err(Error::Unsupported(format!(
                "{}: the panel width must be a power of two up to {}",
                self.name(),
                super::MAX_TILE
            )));
        }
        dequantize_fwd_panels(*self)
    }
}

/// The decode kernel (see the module docs).
#[kernel(name = spec.name(), grid = n_items, signature = DequantizeFwdPanels)]
pub fn dequantize_fwd_panels(
    #[config] spec: FwdDecode,
    k: u32,
    n_items: u32,
    n_packed: u32,
    n_scales: u32,
    #[shape(n_packed)] packed: In<u8>,
    #[shape(n_scales)] absmax: In<f32>,
    n_out: u32,
    #[shape(n_out)]
    #[dtype(DType::F32)]
    out: Out<Float>,
) {
    let w = work_item();
    let run = k >> 4u32;
    // The panel's groups of rows go fastest, then `g`: consecutive work items fill the same 16
    // cache lines of `out` (one per column), each line whole before the next `g`.
    let r = comptime!(spec.rows_per_item());
    let groups = comptime!(spec.panel / r);
    let part = w & comptime!(groups - 1);
    let t = w >> comptime!(groups.trailing_zeros());
    let panel = t / run;
    let g = t - panel * run;
    let code = table_f32("code", &spec.quant_type.dequant_table());
    let shift = comptime!(spec.panel.trailing_zeros());
    let lane0 = part * r;
    // The item's group of `r` rows in the interleaved weight (`interleave.rs`).
    let group = panel * groups + part;
    // Column `16 g + c` of the group's row `i` goes to `base + c * step + i`.
    let base = ((panel * k + g) << shift) + lane0;
    let step = run << shift;
    // The group's 16 columns are its bytes `8 g ..= 8 g + 7`, the high nibble first, and share
    // one absmax per row (`K` and the columns per absmax are multiples of 16): `code[nibble] *
    // absmax`, as the fused kernel's `weight` decodes them, one lane per row. Rows past the
    // weight's end repeat its last row; what they store is padding the GEMM never stores from.
    // Each of the 16 columns is one cache line of `out` (`P` consecutive floats), written whole
    // in one visit: row by row, an item wrote to 16 lines `K * 4` bytes apart, which share one
    // set of Zen 3's 8-way L1, so each line left the cache between an item's visits.
    let scale_shift = comptime!(spec.scale_cols.trailing_zeros());
    let runs = k >> scale_shift;
    let at_absmax = (group * runs + ((g << 4u32) >> scale_shift)) * r;
    let zero = val(0u32);
    let lanes = val(r);
    for j in 0..8u32 {
        let at_byte = (group * (k >> 1u32) + (g << 3u32) + j) * r;
        for half in 0..2u32 {
            let at = base + step * comptime!(2 * j + half);
            for i in zero..lanes {
                let absmax = absmax[at_absmax + i];
                let byte = packed[at_byte + i];
                let nibble = (byte >> comptime!(4 - 4 * half)) & 15u32;
                let v = round_to(code[nibble] * absmax, spec.weight_dtype);
                store_rounded(out, at + i, v, Rounding::NearestEven);
            }
        }
    }
}

/// The GEMM tile of the forward's decoded plan for `x [m, k]` and a weight `[n, k]` on `caps`,
/// or `None` where the fused kernel runs: fewer than [`FORWARD_DECODE_FROM_ROWS`] rows, not a
/// CPU with 8 or 16 lanes (the LLVM backend with AVX2 or AVX-512; module docs), or `K` not a
/// multiple of 16.
pub(super) fn forward_plan(caps: DeviceCaps, (m, n, k): (u32, u32, u32)) -> Option<TileConfig> {
    let DeviceCaps::Cpu { lanes, .. } = caps else {
        return None;
    };
    let fits = matches!(lanes, 8 | 16)
        && m as usize >= FORWARD_DECODE_FROM_ROWS
        && k > 0
        && k.is_multiple_of(FORWARD_PARTIALS);
    let tile = column_tile(m, n.min(strip_rows(n, k, 16, STRIP_BYTES)), k, caps);
    (fits && tile.tn.is_power_of_two()).then_some(tile)
}

/// Weight rows per strip: as many whole panels of `p` rows as `strip_bytes` of decoded `f32`
/// hold (at least one panel), at most all `n` rounded up to a panel.
fn strip_rows(n: u32, k: u32, p: u32, strip_bytes: usize) -> u32 {
    let panels = strip_bytes / (k as usize * p as usize * 4).max(1);
    let all = n.div_ceil(p).max(1);
    panels.clamp(1, all as usize) as u32 * p
}

/// `x [m, k]` (`f32` bytes) with every row's columns partial-major: column `c` at `(c % 16) *
/// (k / 16) + c / 16` (`k` a multiple of 16), the rows split between up to `threads` threads.
/// Each row is the transpose of its `[k / 16, 16]` view ([`transpose_into`]). The bytes are
/// the first `x.len()` of a [`scratch`] buffer, which the caller keeps.
fn partial_major(x: &[u8], k: usize, threads: usize) -> Vec<u8> {
    let w = FORWARD_PARTIALS as usize;
    let run = k / w;
    let row_bytes = k * 4;
    let mut out = scratch::take(x.len());
    fill_rows(&mut out[..x.len()], row_bytes, threads, |first, rows| {
        let src = &x[first * row_bytes..][..rows.len()];
        for (dst, src) in rows
            .chunks_exact_mut(row_bytes)
            .zip(src.chunks_exact(row_bytes))
        {
            transpose_into::<4>(src, (run, w), 0..w, dst, run);
        }
    });
    out
}

/// `y = x @ dequant(W).T (+ bias)` by the forward's decoded plan ([`forward_plan`] gave
/// `tile`), in strips of at most `strip_bytes` of decoded weight ([`STRIP_BYTES`]; at least one
/// panel): `x` the `f32` bytes of `x [m, k]`, `w` the weight in bitsandbytes' layout (codes,
/// flat absmax), `bias` its `f32` bytes, `spec` the fused kernel's (its quant type, blocksize,
/// weight dtype and nesting), the host's copies on `threads` threads; returns `y [m, n]`'s `f32`
/// bytes, the fused kernel's bits.
///
/// # Errors
/// [`qforge_runtime::Error::Invalid`] for `K` not a multiple of 16 or a tile of columns that is
/// not a power of two; any device error, or a count past `u32`.
pub(super) fn run_forward_decoded(
    dev: &dyn Device,
    spec: &Matmul4,
    (m, n, k): (u32, u32, u32),
    (x, bias): (&[u8], Option<&[u8]>),
    w: &DecodeInput<'_>,
    (tile, strip_bytes, threads): (TileConfig, usize, usize),
) -> qforge_runtime::Result<Vec<u8>> {
    if k == 0 || !k.is_multiple_of(FORWARD_PARTIALS) || !tile.tn.is_power_of_two() {
        return Err(qforge_runtime::Error::Invalid(format!(
            "matmul_4bit: the decoded plan needs K a positive multiple of {FORWARD_PARTIALS} \
             (K = {k}) and a tile of columns that is a power of two (got {})",
            tile.tn
        )));
    }
    let decode = FwdDecode {
        quant_type: spec.quant_type,
        scale_cols: interleave::scale_cols(k, spec.blocksize),
        weight_dtype: spec.weight_dtype,
        panel: tile.tn,
    };
    let kernel = cached_typed(&decode.name(), || decode.build())?;
    let r = decode.rows_per_item();
    let mut weight = Interleaved::default();
    let xp = partial_major(x, k as usize, threads);
    let run = k / FORWARD_PARTIALS;
    let per = strip_rows(n, k, tile.tn, strip_bytes);
    // Every byte of a strip is decoded before the GEMM reads it: a kept buffer, not cleared.
    let mut strip = scratch::take(per as usize * k as usize * 4);
    let mut y = Vec::new();
    for first in (0..n).step_by(per as usize) {
        let rows = per.min(n - first);
        let n_out = rows.next_multiple_of(tile.tn) * k;
        let out = &mut strip[..n_out as usize * 4];
        weight.fill(
            w,
            (n, k),
            (first, rows.next_multiple_of(tile.tn)),
            (spec.blocksize, decode.scale_cols, r),
            threads,
        )?;
        let (codes, absmax) = (&weight.codes, &weight.absmax);
        launch_typed(
            dev,
            &kernel,
            &mut DequantizeFwdPanelsArgs {
                k,
                n_items: rows.next_multiple_of(tile.tn) / r * run,
                n_packed: codes.len() as u32,
                n_scales: absmax.len() as u32,
                packed: codes,
                absmax,
                n_out,
                out: FloatOut {
                    dtype: DType::F32,
                    bytes: out,
                },
            },
        )?;
        let bias = bias.map(|b| &b[first as usize * 4..(first + rows) as usize * 4]);
        let c = gemm_on_panels(
            dev,
            (&xp[..x.len()], out, bias),
            (m, rows, k),
            (tile, FORWARD_PARTIALS),
        )?;
        if rows == n {
            y = c;
            break;
        }
        place_columns(&mut y, &c, (m, n), (first, rows), threads);
    }
    scratch::keep(xp);
    scratch::keep(strip);
    Ok(y)
}
