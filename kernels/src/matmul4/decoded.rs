//! The input gradient's weight decoded once, in the dense GEMM's panels: the plan of
//! `dX = dY @ dequant(W)` on an AVX2 CPU from [`DECODE_FROM_ROWS`] rows of `dY` on, on an
//! AVX-512 CPU from [`DECODE_FROM_ROWS_AVX512`].
//!
//! The fused kernel decodes each weight vector once per tile of rows, and with AVX2 the decode
//! (the scaled table's two halves, the shift vector, the permutes) takes registers the sums
//! need: of its 16 `ymm` registers an 8 x 16 tile's sums want all, a 6 x 16 tile's 12 leave
//! too few, and LLVM keeps sums on the stack either way (47 of the 195 instructions of the
//! 6 x 16 loop touch it). On Zen 3 it ran at 54-75 GFLOP/s at `M >= 128`. The library's dense
//! GEMM ([`crate::gemm`], 6 x 16 with AVX2: 12 sums, two weight vectors and a broadcast `dY`,
//! no stack) on a decoded weight ran at 100-150. So from [`DECODE_FROM_ROWS`] rows on the
//! weight is decoded once (this kernel, one strip of columns at a time, so that at most
//! [`STRIP_BYTES`] of decoded weight exist at once) and the GEMM runs on each strip: the weight
//! values are those the fused kernel decodes (its own `weight` helper, rounded to the same
//! weight dtype) and [`crate::GEMM_ORDER`] is [`super::DX_ORDER`] (one running sum from `-0.0`
//! in increasing `n`), so the bits are the fused kernel's.
//!
//! Measured on Zen 3 (2 threads, release, the fused kernel with its suggested tile against the
//! op's choice, interleaved, best of 5, bits compared): f32, K = N = 4096: M = 16 11.0 against
//! 27.2 ms and M = 64 30.6 against 35.5 ms (the decode then took about 16 ms and did not pay),
//! M = 128 96 against 49 ms, M = 256 147 against 85, M = 512 290 against 152, M = 2048
//! 1137 against 567 ms; M = 128 with (K, N) = (4096, 11008) 153 against 95 ms and (11008, 4096)
//! 181 against 108 ms; M = 512 at those shapes 659 against 312 and 633 against 311 ms; bf16
//! (widened) M = 128 78 against 55 ms, M = 512 318 against 145 ms. With AVX-512 the fused
//! kernel's 32 registers hold its 8 x 32 tile, and the plan pays only from more rows
//! ([`DECODE_FROM_ROWS_AVX512`]).
//! With 4 MiB strips the decode takes about 7 ms at K = N = 4096 (stop 61, best of 7 against 3
//! in one process): M = 48 20.8 against 26.7 ms, (4096, 11008) 61.9 against 64.5,
//! (11008, 4096) 59.2 against 64.0; at M = 32 the two were even (17.2 against 17.4, 56.1 against
//! 48.1, 46.9 against 49.1). Since each output panel's columns decode in vector lanes (stop
//! 63: consecutive codes, one absmax per work item) the decode took 4.0-4.4 ms for an `f32`
//! weight at K = N = 4096 on the panel layout (9.5-13.3 ms before, in the same hour) and 5.2-6.2
//! for a `bf16` one (17-22 ms), and the plan pays from 32 rows (f32, interleaved in one process,
//! best of 5): M = 32, K = N = 4096 20.0 against 26.6 ms, (4096, 11008) 54.5 against 64.1,
//! (11008, 4096) 49.8 against 68.8; at M = 16 15.1 against 12.4, so below 32 rows the fused
//! kernel runs.
//!
//! The decode reads bitsandbytes' layout (codes and flat absmax, as `quantize_4bit` stores
//! them): a work item's 32 columns are 16 consecutive bytes of one weight row. Reading the
//! input gradient's panel layout instead (consecutive items' codes consecutive) made the decode
//! kernel about twice as fast (4.0-4.4 against 7.5-11 ms at K = N = 4096) but cost the host the
//! same in packing the codes and scales on every call: in one process alternating (best of 5,
//! f32, same bits) M = 128, K = N = 4096 53.4 against 52.6 ms, (11008, 4096) 119.6 against
//! 125.3, M = 512 165.6 against 171.0, bf16 M = 128 52.0 against 54.6; so the plan skips the
//! packing and its 8 MiB copy. Ordering the items by row (each row's panels consecutive) was
//! slower (59.3 against 53.1 ms).
//!
//! Kernel `dequantize_dx_panels_{qt}[_nested]_bs{B}_w{wdtype}_p{P}`: `(n, k, first_panel,
//! n_rows, n_bytes, n_scales: u32, [offset: f32, n_nested: u32,] codes: u8[n_bytes] read,
//! absmax: f32[n_scales] read | qabsmax: u8[n_scales] read, nested_absmax: f32[n_nested]
//! read, nested_code: f32[256] read, out: f32[n_rows, 32] write)`, grid `n_rows` (a multiple
//! of `N`), the weight in bitsandbytes' layout (as the fused forward reads it; `K` a multiple
//! of 32); work item `w` decodes weight row `w % N`, columns `32 * (first_panel + w / N) ..`
//! plus 32, into `out` as the GEMM's `B` in panels of `P` columns ([`crate::Layout::Panels`],
//! `P` dividing 32): column `c` of the strip and row `n` at `(c / P) * N * P + n * P + c % P`.

use qforge_macros::kernel;

use super::panels::DX_PANEL;
use super::{block_absmax, nibble_code, scale, Matmul4, OptionalDim, TileConfig, Weights};
use crate::funcs::round_to;
use crate::gemm::host::{column_tile, fill_rows, gemm_on_panels, zeroed};
use crate::gemm::scratch;
use crate::ops::{cached_typed, DeviceCaps};
use crate::{check_blocksize_4bit, check_float_dtype, QuantType};
use qforge_ir::dsl::{Float, FloatOut, In, Out, TypedKernel, Val};
use qforge_ir::{DType, Error, Result, Rounding};
use qforge_runtime::{launch_typed, Device};

/// Rows of `dY` from which an AVX2 CPU (8 vector lanes) decodes the weight once (module docs).
pub const DECODE_FROM_ROWS: usize = 32;

/// Rows of `dY` from which an AVX-512 CPU (16 vector lanes: the LLVM backend's 8 x 32 GEMM tile, as
/// the fused kernel's) decodes the weight once. On Zen 4 (2 threads, release, the fused kernel with
/// its suggested tile and this plan alternating in one process, best of 3 to 7, the same bits),
/// f32: M = 128 25.5 against 28.3 ms (K = N = 4096), 70.0 against 85.8 ((K, N) = (11008, 4096)),
/// 66.6 against 71.7 ((4096, 11008)); M = 512 118 against 124 and 308 against 316 (at (11008,
/// 4096)); M = 2048 362 against 410; bf16 (widened) M = 128 36.5 against 42.3, M = 512 98 against
/// 122. Below 128 rows the decode is not earned back everywhere: M = 64 86.2 against 43.1 ms at
/// (4096, 11008) (even at the other shapes), M = 32 12.2 against 10.9 ms at K = N = 4096.
pub const DECODE_FROM_ROWS_AVX512: usize = 128;

/// The most bytes of decoded weight one strip holds (both decoded plans): a weight that decodes
/// to more runs in strips of whole panels. A small strip is still in the cache when its GEMM
/// reads it, and its buffer's first touch costs few page faults (about 12 ms for a fresh 32 MiB
/// on the Zen 3 VM). There, interleaved, K = N = 4096, f32 (one process per strip size, against
/// the fused kernel in the same runs): the input gradient at M = 128 took 49.0 ms with 32 MiB
/// strips and 36.2 ms with 4 MiB (M = 512: 129.5 and 117.7 ms); the forward at M = 128 67.5 ms
/// with 32 MiB, 56.9 with 8, 53.3 with 4 and 53.9 with 2 (M = 512: 143-193 ms with each).
pub const STRIP_BYTES: usize = 4 << 20;

/// One decode kernel variant (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DxDecode {
    /// NF4 or FP4.
    pub quant_type: QuantType,
    /// Elements per absmax block of the flattened weight.
    pub blocksize: u32,
    /// The dtype the decoded weight is rounded to (stored as `f32`).
    pub weight_dtype: DType,
    /// Whether the absmax is double-quantized.
    pub nested: bool,
    /// Columns per output panel (the GEMM tile's `TN`: 8, 16 or 32).
    pub panel: u32,
}

impl DxDecode {
    /// The kernel name, e.g. `dequantize_dx_panels_nf4_bs64_wf32_p16`.
    pub fn name(&self) -> String {
        format!(
            "dequantize_dx_panels_{}{}_bs{}_w{}_p{}",
            self.quant_type,
            if self.nested { "_nested" } else { "" },
            self.blocksize,
            self.weight_dtype,
            self.panel
        )
    }

    /// Builds the kernel with its typed signature ([`DequantizeDxPanelsArgs`]).
    ///
    /// # Errors
    /// [`Error::Unsupported`] for an unsupported blocksize or weight dtype, or a panel width
    /// that does not divide 32.
    pub fn build(&self) -> Result<TypedKernel<DequantizeDxPanels>> {
        check_blocksize_4bit(self.blocksize)?;
        check_float_dtype(self.weight_dtype)?;
        if !self.panel.is_power_of_two() || self.panel > DX_PANEL {
            return Err(Error::Unsupported(format!(
                "{}: the panel width must be a power of two dividing {DX_PANEL}",
                self.name()
            )));
        }
        dequantize_dx_panels(*self)
    }
}

/// The decode kernel (see the module docs).
#[kernel(name = spec.name(), grid = n_rows, signature = DequantizeDxPanels)]
pub fn dequantize_dx_panels(
    #[config] spec: DxDecode,
    n: u32,
    k: u32,
    first_panel: u32,
    n_rows: u32,
    n_bytes: u32,
    n_scales: u32,
    #[when(spec.nested)] offset: f32,
    #[when(spec.nested)] n_nested: u32,
    #[shape(n_bytes)] codes: In<u8>,
    #[when(!spec.nested)]
    #[shape(n_scales)]
    absmax: In<f32>,
    #[when(spec.nested)]
    #[shape(n_scales)]
    qabsmax: In<u8>,
    #[when(spec.nested)]
    #[shape(OptionalDim(n_nested))]
    nested_absmax: In<f32>,
    #[when(spec.nested)]
    #[shape(256u32)]
    nested_code: In<f32>,
    #[shape(n_rows, DX_PANEL)]
    #[dtype(DType::F32)]
    out: Out<Float>,
) {
    let w = work_item();
    let nv = n;
    let panel = w / nv;
    let row = w - panel * nv;
    let scale = scale(offset, absmax, qabsmax, nested_absmax, nested_code);
    let weights = Weights {
        packed: codes,
        scale,
        code: table_f32("code", &spec.quant_type.dequant_table()),
        blocksize: spec.blocksize,
    };
    // The strip's panel row `w` holds columns `first_col ..` of weight row `row`: flat
    // element `row * K + first_col + c`, nibble `e0 + c` of bitsandbytes' packing. The 32
    // columns share one absmax block (`e0` is a multiple of 32, and so is every blocksize),
    // and each output panel's columns are consecutive codes and consecutive outputs:
    // `code[nibble] * absmax`, as the fused kernel's `weight` decodes them, one lane per column
    // (a vector load of the codes, their lookup fused with it on the LLVM backend).
    let first_col = (first_panel + panel) << comptime!(DX_PANEL.trailing_zeros());
    let e0 = row * k + first_col;
    let per = comptime!(DX_PANEL / spec.panel);
    let bases = out_bases(panel, per, nv, row, spec.panel);
    let absmax = block_absmax(weights, e0, None);
    let (zero, lanes) = (val(0u32), val(spec.panel));
    for (j, base) in bases.into_iter().enumerate() {
        let nib = e0 + comptime!(j as u32 * spec.panel);
        for i in zero..lanes {
            let v = nibble_code(weights, nib + i) * absmax;
            let v = round_to(v, spec.weight_dtype);
            store_rounded(out, base + i, v, Rounding::NearestEven);
        }
    }
}

/// The output index of column 0 of each of the `per` output panels that strip panel `panel`
/// (32 columns) covers, at weight row `row`: `(panel * per + j) * N * P + row * P`.
#[qforge_macros::func]
fn out_bases(panel: Val<u32>, per: u32, n: Val<u32>, row: Val<u32>, p: u32) -> Vec<Val<u32>> {
    #[comptime]
    let mut bases = Vec::new();
    let first = panel * per;
    let row_at = row * p;
    let stride = n * p;
    for j in 0..per {
        let at = (first + j) * stride + row_at;
        bases.push(at);
    }
    bases
}

/// The 4-bit weight in bitsandbytes' layout, as the decoded plans read it: the codes, the flat
/// absmax (or `qabsmax`, `n_scales` entries) and the nested absmax.
pub(super) struct DecodeInput<'a> {
    pub codes: &'a [u8],
    pub n_scales: u32,
    pub absmax: Option<&'a [f32]>,
    pub qabsmax: Option<&'a [u8]>,
    pub offset: Option<f32>,
    pub n_nested: Option<u32>,
    pub nested_absmax: Option<&'a [f32]>,
    pub nested_code: Option<&'a [f32]>,
}

/// The GEMM tile of the decoded plan for `dY [m, n]` and a weight `[n, k]` on `caps`, or `None`
/// where the fused kernel runs: not a CPU with 8 lanes (the LLVM backend with AVX2) from
/// [`DECODE_FROM_ROWS`] rows or with 16 (AVX-512) from [`DECODE_FROM_ROWS_AVX512`] (module
/// docs), `K` not a multiple of 32, or a tile whose columns do not divide a panel's 32.
pub(super) fn decoded_plan(caps: DeviceCaps, (m, n, k): (u32, u32, u32)) -> Option<TileConfig> {
    let from_rows = match caps {
        DeviceCaps::Cpu { lanes: 8, .. } => DECODE_FROM_ROWS,
        DeviceCaps::Cpu { lanes: 16, .. } => DECODE_FROM_ROWS_AVX512,
        _ => return None,
    };
    let fits = m as usize >= from_rows && k.is_multiple_of(DX_PANEL);
    let tile = column_tile(m, strip_panels(n, k, STRIP_BYTES) * DX_PANEL, n, caps);
    (fits && DX_PANEL.is_multiple_of(tile.tn)).then_some(tile)
}

/// Panels of 32 columns per strip: as many as `strip_bytes` of decoded `f32` hold (at least
/// one), at most all `K / 32`.
fn strip_panels(n: u32, k: u32, strip_bytes: usize) -> u32 {
    let per = strip_bytes / (n as usize * DX_PANEL as usize * 4).max(1);
    per.clamp(1, (k / DX_PANEL).max(1) as usize) as u32
}

/// `dX = dY @ dequant(W)` by the decoded plan ([`decoded_plan`] gave `tile`), in strips of at
/// most `strip_bytes` of decoded weight ([`STRIP_BYTES`]; at least one panel): `dy` the `f32`
/// bytes of `dY [m, n]`, `spec` the fused kernel's (its quant type, blocksize, weight dtype
/// and nesting), the host's copies on `threads` threads; returns `dX [m, k]`'s `f32`
/// bytes, the fused kernel's bits.
///
/// # Errors
/// Any device error, or a count past `u32` ([`crate::ops::count_u32`]).
pub(super) fn run_decoded(
    dev: &dyn Device,
    spec: &Matmul4,
    (m, n, k): (u32, u32, u32),
    dy: &[u8],
    w: &DecodeInput<'_>,
    (tile, strip_bytes, threads): (TileConfig, usize, usize),
) -> qforge_runtime::Result<Vec<u8>> {
    if !k.is_multiple_of(DX_PANEL) || !DX_PANEL.is_multiple_of(tile.tn) {
        return Err(qforge_runtime::Error::Invalid(format!(
            "matmul_4bit_backward_input: the decoded plan needs K a multiple of {DX_PANEL} \
             (K = {k}) and a tile of columns dividing {DX_PANEL} (got {})",
            tile.tn
        )));
    }
    let decode = DxDecode {
        quant_type: spec.quant_type,
        blocksize: spec.blocksize,
        weight_dtype: spec.weight_dtype,
        nested: spec.nested,
        panel: tile.tn,
    };
    let kernel = cached_typed(&decode.name(), || decode.build())?;
    let (total, per) = (k / DX_PANEL, strip_panels(n, k, strip_bytes));
    // Every byte of a strip is decoded before the GEMM reads it: a kept buffer, not cleared.
    let mut strip = scratch::take(per as usize * n as usize * DX_PANEL as usize * 4);
    let mut dx = Vec::new();
    for first in (0..total).step_by(per as usize) {
        let panels = per.min(total - first);
        let n_rows = panels * n;
        let out = &mut strip[..n_rows as usize * DX_PANEL as usize * 4];
        launch_typed(
            dev,
            &kernel,
            &mut DequantizeDxPanelsArgs {
                n,
                k,
                first_panel: first,
                n_rows,
                n_bytes: w.codes.len() as u32,
                n_scales: w.n_scales,
                offset: w.offset,
                n_nested: w.n_nested,
                codes: w.codes,
                absmax: w.absmax,
                qabsmax: w.qabsmax,
                nested_absmax: w.nested_absmax,
                nested_code: w.nested_code,
                out: FloatOut {
                    dtype: DType::F32,
                    bytes: out,
                },
            },
        )?;
        let cols = panels * DX_PANEL;
        let c = gemm_on_panels(dev, (dy, out, None), (m, cols, n), (tile, 1))?;
        if panels == total {
            dx = c;
            break;
        }
        place_columns(&mut dx, &c, (m, k), (first * DX_PANEL, cols), threads);
    }
    scratch::keep(strip);
    Ok(dx)
}

/// Writes the `f32` strip `c [m, cols]` as columns `first ..` of `dst [m, total]` (allocated,
/// zeroed by the threads, when empty), its rows split between up to `threads` threads: a
/// plan's strip of outputs into the whole output.
pub(super) fn place_columns(
    dst: &mut Vec<u8>,
    c: &[u8],
    (m, total): (u32, u32),
    (first, cols): (u32, u32),
    threads: usize,
) {
    if dst.is_empty() {
        *dst = zeroed(m as usize * total as usize * 4, threads);
    }
    let (from, len) = (first as usize * 4, cols as usize * 4);
    let row_bytes = total as usize * 4;
    fill_rows(dst, row_bytes, threads, |first_row, rows| {
        for (row, src) in rows
            .chunks_exact_mut(row_bytes)
            .zip(c[first_row * len..].chunks_exact(len))
        {
            row[from..from + len].copy_from_slice(src);
        }
    });
}
