//! Dense products `C = A @ B.T (+ bias)` of full-precision matrices stored as written or
//! transposed: the forward and backward products of a full-precision linear layer (the
//! bottleneck adapters' projections). Exact semantics: [`crate::gemm`].

use crate::gemm::GemmKernelArgs;
use crate::{Gemm, Layout};
use qforge_ir::dsl::{FloatIn, FloatOut};
use qforge_ir::DType;

use crate::matmul4::TileConfig;
use crate::ops::{
    cached_typed, count_u32, suggest_backward_tile_sizes, suggest_tile_sizes, DeviceCaps,
};
use qforge_runtime::HostTensor;
use qforge_runtime::{launch_typed, Device};
use qforge_runtime::{Error, Result};

/// `(rows, L)` of a 2-D operand stored with `layout` (`[rows, L]` or `[L, rows]`).
fn operand(what: &str, t: &HostTensor, layout: Layout, dtype: DType) -> Result<(u32, u32)> {
    if t.dtype != dtype {
        return Err(Error::Invalid(format!(
            "gemm: {what} is {}, A is {dtype}; both must have the same float dtype",
            t.dtype
        )));
    }
    let [r, c] = t.shape[..] else {
        return Err(Error::Invalid(format!(
            "gemm: {what} must be 2-D, got shape {:?}",
            t.shape
        )));
    };
    if t.data.len() != r * c * dtype.size_bytes() {
        return Err(Error::Invalid(format!(
            "gemm: {what} has {} bytes, its shape {:?} of {dtype} needs {}",
            t.data.len(),
            t.shape,
            r * c * dtype.size_bytes()
        )));
    }
    // Every element's index is a `u32` in the kernel.
    count_u32("gemm", what, r * c)?;
    let (rows, l) = match layout {
        Layout::RowMajor => (r, c),
        Layout::Transposed => (c, r),
        Layout::Panels => {
            return Err(Error::Invalid(format!(
                "gemm: {what} is given in panels; pass it row-major or transposed (the host packs \
                 panels itself)"
            )))
        }
    };
    Ok((count_u32("gemm", what, rows)?, count_u32("gemm", what, l)?))
}

/// The bytes of a float operand (its dtype checked against A's).
fn float_in(t: &HostTensor) -> FloatIn<'_> {
    FloatIn {
        dtype: t.dtype,
        bytes: &t.data,
    }
}

/// The `[cols, rows]` transpose of the row-major `[rows, cols]` matrix of `N`-byte elements
/// `src`, in blocks of 16 x 16 elements, each output row of a block written contiguously.
/// (512 x 4096 f32, one thread, Zen 3: 2.6 ms; 5.9 ms in blocks of 32 x 32 read row by row.)
fn transposed<const N: usize>(src: &[u8], rows: usize, cols: usize) -> Vec<u8> {
    const BLOCK: usize = 16;
    let mut dst = vec![0u8; src.len()];
    for r0 in (0..rows).step_by(BLOCK) {
        let r1 = (r0 + BLOCK).min(rows);
        for c0 in (0..cols).step_by(BLOCK) {
            for c in c0..(c0 + BLOCK).min(cols) {
                let out = &mut dst[(c * rows + r0) * N..(c * rows + r1) * N];
                for (o, r) in out.chunks_exact_mut(N).zip(r0..r1) {
                    let from = (r * cols + c) * N;
                    o.copy_from_slice(&src[from..from + N]);
                }
            }
        }
    }
    dst
}

/// The `[ceil(rows / p), L, p]` panels ([`Layout::Panels`], the rows past the end zero) of the
/// `[rows, L]` operand `src` of `dtype` elements stored with `layout` (row-major or transposed).
pub(crate) fn packed(
    src: &[u8],
    dtype: DType,
    layout: Layout,
    (rows, l): (usize, usize),
    p: usize,
) -> Vec<u8> {
    let size = dtype.size_bytes();
    let mut dst = vec![0u8; rows.div_ceil(p) * l * p * size];
    if l == 0 {
        return dst;
    }
    for (panel, out) in dst.chunks_exact_mut(l * p * size).enumerate() {
        let r0 = panel * p;
        let width = p.min(rows - r0) * size;
        match layout {
            // Row `l` of a transposed operand holds the panel's elements in a run.
            Layout::Transposed => {
                for (li, o) in out.chunks_exact_mut(p * size).enumerate() {
                    let from = (li * rows + r0) * size;
                    o[..width].copy_from_slice(&src[from..from + width]);
                }
            }
            // A row-major operand's panel is the transpose of its rows.
            _ => {
                for j in 0..width / size {
                    let row = &src[(r0 + j) * l * size..(r0 + j + 1) * l * size];
                    for (li, e) in row.chunks_exact(size).enumerate() {
                        let to = (li * p + j) * size;
                        out[to..to + size].copy_from_slice(e);
                    }
                }
            }
        }
    }
    dst
}

/// `t` (a logical `[rows, L]` operand stored with `layout`) stored with `want` instead (panels of
/// `p` rows for [`Layout::Panels`]): a copy when they differ.
fn stored_as(
    t: &HostTensor,
    layout: Layout,
    want: Layout,
    (rows, l): (u32, u32),
    p: u32,
) -> Option<HostTensor> {
    if layout == want {
        return None;
    }
    let (r, c) = (t.shape[0], t.shape[1]);
    let (shape, data) = match want {
        Layout::Panels => {
            let (rows, l, p) = (rows as usize, l as usize, p as usize);
            let data = packed(&t.data, t.dtype, layout, (rows, l), p);
            (vec![rows.div_ceil(p), l * p], data)
        }
        _ if t.dtype.size_bytes() == 4 => (vec![c, r], transposed::<4>(&t.data, r, c)),
        _ => (vec![c, r], transposed::<2>(&t.data, r, c)),
    };
    Some(HostTensor {
        dtype: t.dtype,
        shape,
        data,
    })
}

/// `C[i, j] = sum_l A[i, l] * B[j, l] (+ bias[j]) (+ residual[i, j])`, `C: [M, N]` in the
/// operands' dtype, with
/// `A` stored `[M, L]` (`RowMajor`) or `[L, M]` (`Transposed`) and `B` stored `[N, L]` or
/// `[L, N]`. For `y = x @ W.T + b`: forward `gemm(x, RowMajor, W, RowMajor, Some(b), None)`,
/// `dX = gemm(dY, RowMajor, W, Transposed, None, None)`, `dW = gemm(dY, Transposed, x,
/// Transposed, None, None)`.
///
/// # Errors
/// [`Error::Invalid`] naming the operand for a non-float dtype, dtypes that differ, a shape
/// that is not 2-D or does not match the bytes, reduction lengths that differ, a bias that is
/// not `[N]` or a residual that is not `[M, N]` of the same dtype, or more than `2^31 - 1` elements; any device error.
pub fn gemm(
    dev: &dyn Device,
    (a, a_layout): (&HostTensor, Layout),
    (b, b_layout): (&HostTensor, Layout),
    bias: Option<&HostTensor>,
    residual: Option<&HostTensor>,
) -> Result<HostTensor> {
    let dtype = a.dtype;
    if !dtype.is_float() {
        return Err(Error::Invalid(format!(
            "gemm: A must be f32, f16 or bf16, got {dtype}"
        )));
    }
    let (m, l) = operand("A", a, a_layout, dtype)?;
    let (n, lb) = operand("B", b, b_layout, dtype)?;
    if l != lb {
        return Err(Error::Invalid(format!(
            "gemm: A (shape {:?}, {a_layout:?}) reduces over {l} and B (shape {:?}, \
             {b_layout:?}) over {lb}; they must match",
            a.shape, b.shape
        )));
    }
    if let Some(bias) = bias {
        if bias.dtype != dtype
            || bias.shape != [n as usize]
            || bias.data.len() != n as usize * dtype.size_bytes()
        {
            return Err(Error::Invalid(format!(
                "gemm: bias must be a {dtype} tensor of shape [{n}], got {} {:?}",
                bias.dtype, bias.shape
            )));
        }
    }
    if let Some(r) = residual {
        if r.dtype != dtype
            || r.shape != [m as usize, n as usize]
            || r.data.len() != m as usize * n as usize * dtype.size_bytes()
        {
            return Err(Error::Invalid(format!(
                "gemm: residual must be a {dtype} tensor of shape [{m}, {n}], got {} {:?}",
                r.dtype, r.shape
            )));
        }
    }
    let (want_a, want_b, tile) = plan(DeviceCaps::of(dev), (m, n, l, dtype), a_layout, b_layout);
    let outputs = count_u32("gemm", "C", m as usize * n as usize)?;
    let (m_tiles, n_tiles) = (m.div_ceil(tile.tm), n.div_ceil(tile.tn));
    let n_items = count_u32(
        "gemm",
        "the work items",
        m_tiles as usize * n_tiles as usize,
    )?;
    let panel_len = match want_b {
        Layout::Panels => {
            let len = count_u32("gemm", "a panel of B", l as usize * tile.tn as usize)?;
            count_u32("gemm", "B's panels", n_tiles as usize * len as usize)?;
            Some(len)
        }
        _ => None,
    };
    let a_t = stored_as(a, a_layout, want_a, (m, l), tile.tm);
    let b_t = stored_as(b, b_layout, want_b, (n, l), tile.tn);
    let (a, b) = (a_t.as_ref().unwrap_or(a), b_t.as_ref().unwrap_or(b));
    let spec = Gemm {
        a: want_a,
        b: want_b,
        dtype,
        bias: bias.is_some(),
        residual: residual.is_some(),
        tile,
    };
    let kernel = cached_typed(&spec.name(), || spec.build_typed())?;
    let mut c = vec![0u8; outputs as usize * dtype.size_bytes()];
    launch_typed(
        dev,
        &kernel,
        &mut GemmKernelArgs {
            m,
            n,
            l,
            n_items,
            m_tiles,
            n_tiles,
            // Panels are for a `B` too large for the core's cache: its panel stays there while
            // the rows go by. A smaller `B` stays there whole, and each tile of rows of `A` is
            // read once for every output tile.
            group: if panel_len.is_some() { m_tiles } else { 1 },
            panel_len,
            a: float_in(a),
            b: float_in(b),
            bias: bias.map(float_in),
            r: residual.map(float_in),
            c: FloatOut {
                dtype,
                bytes: &mut c,
            },
        },
    )?;
    HostTensor::new(dtype, vec![m as usize, n as usize], c)
}

/// From this many bytes of `B` on, the CPU plan packs `B` in panels and runs the row tiles
/// fastest (see [`plan`]). On the 2-core AVX-512 development VM (2 MiB of L2 per core), `cpu-llvm`,
/// `M = 512`, `K = N = 4096` (64 MiB of `B`): 22-25 GFLOP/s transposed with the output tiles
/// fastest, 39-52 transposed with the row tiles fastest, 112-115 in panels with the row tiles
/// fastest (the `gemm` crate: 174-247 in the same runs). At 1 MiB (`d = 4096`, `r = 64`, the
/// adapter's products) panels gained nothing and the row order lost up to 25%.
const PANELS_FROM_BYTES: usize = 2 << 20;

/// A `B` given transposed is packed in panels only from this many row tiles on. Its packing is
/// a copy the transposed read does not need, and each panel is read once per row tile: on the
/// development VM, `B` 8 MiB (`L = 512`, `N = 4096`, given transposed), `cpu-llvm`, the
/// transposed read against panels took 0.32-0.34 against 1.9-2.1 ms at `M = 1`, 1.2 against
/// 2.4-2.5 at `M = 16`, 2.1-2.3 against 2.6-2.7 at `M = 32` (4 row tiles) and 4.5-5.0 against
/// 3.3-3.6 at `M = 64` (8 row tiles).
const PANELS_MIN_ROW_TILES: u32 = 8;

/// The layouts of `A` and `B` the kernel of an `[M, L] x [L, N]` product (`(m, n, l)`, `dtype`) reads
/// on a device, and its tile (the host copies an operand stored otherwise, transposed):
/// * a GPU reads the operands as they are;
/// * a CPU with vectors (4 lanes or more) reads `A` as stored and `B` stored `[L, N]`, or in
///   panels ([`Layout::Panels`]) from [`PANELS_FROM_BYTES`] of `B` on (a `B` given transposed
///   from [`PANELS_MIN_ROW_TILES`] on): the
///   tile's columns are the vector lanes, each `A` element is broadcast to them, and every
///   output keeps its one running sum ([`crate::GEMM_ORDER`]) in a lane (the LLVM backend's
///   `codegen/src/llvm/outer.rs`, the Cranelift backend's
///   `codegen/src/cranelift/accumulate_columns.rs`). A transposed `A` is read in place: the
///   backend proves its strided column in range once per tile. [`column_tile`] gives the tile;
/// * a CPU without vectors (and the interpreter): both row-major, [`suggest_tile_sizes`].
fn plan(
    caps: DeviceCaps,
    (m, n, l, dtype): (u32, u32, u32, DType),
    a: Layout,
    b: Layout,
) -> (Layout, Layout, TileConfig) {
    match caps {
        DeviceCaps::Gpu { .. } => (
            a,
            b,
            suggest_tile_sizes(m as usize, n as usize, l as usize, caps),
        ),
        DeviceCaps::Cpu { lanes, .. } if lanes >= 4 => {
            let tile = column_tile(m, n, l, caps);
            let b_bytes = n as usize * l as usize * dtype.size_bytes();
            // A `B` stored otherwise is copied anyway; packing a transposed one is a copy of
            // its own, which only enough row tiles pay back.
            let reused = b != Layout::Transposed || m.div_ceil(tile.tm) >= PANELS_MIN_ROW_TILES;
            let b = if b_bytes >= PANELS_FROM_BYTES && reused {
                Layout::Panels
            } else {
                Layout::Transposed
            };
            (a, b, tile)
        }
        DeviceCaps::Cpu { .. } => (
            Layout::RowMajor,
            Layout::RowMajor,
            suggest_tile_sizes(m as usize, n as usize, l as usize, caps),
        ),
    }
}

/// The tile of the column-lanes plan on a CPU with `lanes >= 4`: the input gradient's tile
/// ([`suggest_backward_tile_sizes`], 8 x 32 with 16 lanes, the largest power of two up to 2 rows
/// x 16 with 8) with 8 lanes or more (the LLVM backend), `min(M, 4)` x 8 with 4 (the Cranelift
/// backend's 128-bit vectors: 8 sums and the operands fit its 16 registers), then no wider than `N`
/// rounded up to the lanes (at `N = 16`, 8 x 16: a 32-column tile would hold 16 columns past the
/// end, which are not consecutive, so every work item would take the scalar path).
///
/// Measured on the 2-core Xeon VM (AVX-512) at `d = 4096`, `r = 64`, `M = 512`: on `cpu-llvm`
/// the adapter's six products took 13.7 ms against 20.0 ms with 4 x 32 tiles and a row-major
/// `A`, and 24-25 ms with the dot tile (under [`crate::DOT_ORDER`]); since the tile's sums are
/// stored as vectors (`codegen/src/llvm/outer_store.rs`), 8 rows beat 4. On `cpu` (Cranelift)
/// the whole `adapter_fwd_bwd` case took 54 ms with 4 x 8 and 2 x 16, 57 with 3 x 8, 71 with
/// 2 x 8 and 4 x 4, 83 with 1 x 16.
fn column_tile(m: u32, n: u32, l: u32, caps: DeviceCaps) -> TileConfig {
    let (m, n, l) = (m as usize, n as usize, l as usize);
    let DeviceCaps::Cpu { threads, lanes } = caps else {
        return suggest_tile_sizes(m, n, l, caps);
    };
    let mut tile = if lanes >= 8 {
        suggest_backward_tile_sizes(m, l, n, caps)
    } else {
        let want = 4usize.saturating_mul(threads.max(1) as usize);
        crate::matmul4::host::shrink((m.max(1), n.max(1)), (m.clamp(1, 4), 8), want, true)
    };
    let cols = n.max(1).next_multiple_of(lanes as usize) as u32;
    tile.tn = tile.tn.min(cols);
    tile
}

#[cfg(test)]
mod tests {
    use super::{packed, transposed};
    use crate::Layout;
    use qforge_ir::DType;

    /// Element `(r, l)` of a `[rows, L]` operand lands at `((r / p) * L + l) * p + r % p`
    /// from its row-major and its transposed storage alike, and the rows past the end are zero.
    #[test]
    fn packed_places_every_element_and_pads_with_zeros() {
        for (rows, l, p) in [(1, 1, 1), (5, 3, 4), (8, 7, 4), (33, 2, 32), (3, 0, 2)] {
            let value = |r: usize, k: usize| (r * 1000 + k + 1) as u16;
            let bytes =
                |v: Vec<u16>| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
            let row_major = bytes(
                (0..rows * l)
                    .map(|i| value(i / l.max(1), i % l.max(1)))
                    .collect(),
            );
            let stored_t = bytes((0..rows * l).map(|i| value(i % rows, i / rows)).collect());
            let got = packed(&row_major, DType::BF16, Layout::RowMajor, (rows, l), p);
            let got_t = packed(&stored_t, DType::BF16, Layout::Transposed, (rows, l), p);
            assert_eq!(got, got_t, "{rows}x{l} in panels of {p}");
            assert_eq!(got.len(), rows.div_ceil(p) * l * p * 2);
            for panel in 0..rows.div_ceil(p) {
                for k in 0..l {
                    for j in 0..p {
                        let at = ((panel * l + k) * p + j) * 2;
                        let r = panel * p + j;
                        let want = if r < rows { value(r, k) } else { 0 };
                        assert_eq!(
                            u16::from_le_bytes([got[at], got[at + 1]]),
                            want,
                            "{rows}x{l} in panels of {p}: ({r}, {k})"
                        );
                    }
                }
            }
        }
    }

    /// Every element lands at its transposed place, for sizes on and off the 16 x 16 blocks.
    #[test]
    fn transposed_moves_every_element() {
        for (rows, cols) in [(1, 1), (3, 17), (16, 16), (33, 5), (40, 70)] {
            let src: Vec<u8> = (0..rows * cols * 2).map(|i| (i * 7 % 251) as u8).collect();
            let dst = transposed::<2>(&src, rows, cols);
            for r in 0..rows {
                for c in 0..cols {
                    let (from, to) = ((r * cols + c) * 2, (c * rows + r) * 2);
                    assert_eq!(
                        dst[to..to + 2],
                        src[from..from + 2],
                        "{rows}x{cols} at ({r}, {c})"
                    );
                }
            }
        }
    }
}
