//! Dense products `C = A @ B.T (+ bias)` of full-precision matrices stored as written or
//! transposed: the forward and backward products of a full-precision linear layer (the
//! bottleneck adapters' projections). Exact semantics: [`crate::gemm`].

use crate::gemm::transpose::{transpose_into, transposed_into};
use crate::gemm::{scratch, GemmKernelArgs};
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

/// Below this many bytes a host copy runs on the calling thread alone: handing a run to
/// another thread costs about as much as copying this much.
const THREADED_COPY_FROM_BYTES: usize = 256 << 10;

/// `dst` cut into runs of whole `row_len`-element rows, one run per thread (up to `threads`, one
/// below [`THREADED_COPY_FROM_BYTES`]); `fill(first_row, run)` fills each run.
pub(crate) fn fill_rows<T: Send>(
    dst: &mut [T],
    row_len: usize,
    threads: usize,
    fill: impl Fn(usize, &mut [T]) + Sync,
) {
    let rows = dst.len() / row_len.max(1);
    if rows == 0 {
        return;
    }
    let threads = if std::mem::size_of_val(dst) < THREADED_COPY_FROM_BYTES {
        1
    } else {
        threads.clamp(1, rows)
    };
    let per = rows.div_ceil(threads);
    if threads == 1 {
        return fill(0, dst);
    }
    // The first run on the calling thread, the others on rayon's global pool, whose threads
    // persist between copies (starting a thread per run cost about 60 us on the Zen 3 VM).
    rayon::in_place_scope(|s| {
        let mut runs = dst.chunks_mut(per * row_len).enumerate();
        let first = runs.next();
        for (i, run) in runs {
            let fill = &fill;
            s.spawn(move |_| fill(i * per, run));
        }
        if let Some((_, run)) = first {
            fill(0, run);
        }
    });
}

/// `len` zero bytes, cleared by up to `threads` threads ([`fill_rows`]): a kernel's output. A
/// `vec![0; len]` is `calloc`, which clears a block glibc has served before on the calling
/// thread alone; 8 MiB on Zen 3 (medians of 21): 0.52-0.60 ms, 0.24-0.31 on two threads.
pub(crate) fn zeroed(len: usize, threads: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    fill_rows(
        &mut out.spare_capacity_mut()[..len],
        1,
        threads,
        |_, run| {
            run.fill(std::mem::MaybeUninit::new(0));
        },
    );
    // SAFETY: the capacity is at least `len`, and its first `len` bytes were all written above.
    unsafe { out.set_len(len) };
    out
}

/// Panels [`packed`] fills together from a transposed operand. On the AVX-512 development VM,
/// one thread, 64 MiB of `f32` (`L = rows = 4096`, panels of 32): 10.3 ms in blocks of 8 or 16,
/// 13.5 one panel at a time (the reads 16 KiB apart), 22.5 all 128 panels along each row.
const PANELS_PER_BLOCK: usize = 16;

/// The `[ceil(rows / p), L, p]` panels ([`Layout::Panels`], the rows past the end zero) of the
/// `[rows, L]` operand `src` of `dtype` elements stored with `layout` (row-major or transposed),
/// the panels split between up to `threads` threads.
pub(crate) fn packed(
    src: &[u8],
    dtype: DType,
    layout: Layout,
    (rows, l): (usize, usize),
    p: usize,
    threads: usize,
) -> Vec<u8> {
    let mut dst = vec![0u8; rows.div_ceil(p) * l * p * dtype.size_bytes()];
    packed_into(src, dtype, layout, (rows, l), p, threads, &mut dst);
    dst
}

/// Writes [`packed`]'s panels to `dst` (exactly their length), every byte: the rows past the
/// end as zeros.
fn packed_into(
    src: &[u8],
    dtype: DType,
    layout: Layout,
    (rows, l): (usize, usize),
    p: usize,
    threads: usize,
    dst: &mut [u8],
) {
    let size = dtype.size_bytes();
    let panel_bytes = l * p * size;
    fill_rows(dst, panel_bytes, threads, |first, run| {
        let panels = run.len() / panel_bytes;
        match layout {
            // Row `l` of a transposed operand holds each panel's elements in a run. A block of
            // panels is filled row by row: the reads stream along the rows, and the writes go
            // to a few panels at once.
            Layout::Transposed => {
                for j0 in (0..panels).step_by(PANELS_PER_BLOCK) {
                    let block = j0..(j0 + PANELS_PER_BLOCK).min(panels);
                    // Whole panels of 32, 64 or 128 bytes a row: fixed-size copies.
                    let whole = (first + block.end) * p <= rows;
                    let shape = (rows, l, size);
                    match p * size {
                        32 if whole => panel_rows::<32>(src, run, shape, first, &block),
                        64 if whole => panel_rows::<64>(src, run, shape, first, &block),
                        128 if whole => panel_rows::<128>(src, run, shape, first, &block),
                        _ => panel_rows_padded(src, run, (rows, l, p, size), first, &block),
                    }
                }
            }
            // A row-major operand's panel is the transpose of its rows.
            _ => {
                for (j, out) in run.chunks_exact_mut(panel_bytes).enumerate() {
                    let r0 = (first + j) * p;
                    let width = p.min(rows - r0);
                    let block = &src[r0 * l * size..(r0 + width) * l * size];
                    if size == 4 {
                        transpose_into::<4>(block, (width, l), 0..l, out, p);
                    } else {
                        transpose_into::<2>(block, (width, l), 0..l, out, p);
                    }
                    if width < p {
                        for at in out.chunks_exact_mut(p * size) {
                            at[width * size..].fill(0);
                        }
                    }
                }
            }
        }
    });
}

/// [`packed_into`]'s copy of the whole panels `block` (of `B` bytes a row, none past the
/// operand's end) from the transposed operand `src` (`[L, rows]` of `size`-byte elements) into
/// `run` (the panels from `first` on): each stored row's `B`-byte run of every panel, copied
/// as a fixed-size array: inline vector moves, where a `memcpy` call per 64-byte run took
/// about half of the time (8 MiB, `L = 512`, 4096 rows, on Zen 3: 1.3-1.6 against 0.65-0.75 ms
/// on one thread, 0.64-0.75 against 0.31-0.35 on two, a `memcpy` of as many bytes 0.33-0.43).
fn panel_rows<const B: usize>(
    src: &[u8],
    run: &mut [u8],
    (rows, l, size): (usize, usize, usize),
    first: usize,
    block: &std::ops::Range<usize>,
) {
    let p = B / size;
    for li in 0..l {
        let from = (li * rows + (first + block.start) * p) * size;
        let runs = src[from..from + block.len() * B].chunks_exact(B);
        for (j, part) in block.clone().zip(runs) {
            let at = (j * l + li) * B;
            let out: &mut [u8; B] = (&mut run[at..at + B]).try_into().expect("B bytes");
            *out = part.try_into().expect("B bytes");
        }
    }
}

/// [`panel_rows`] for any panel width `p` and panels past the operand's end: each run copied
/// by length, the rows past the end zero.
fn panel_rows_padded(
    src: &[u8],
    run: &mut [u8],
    (rows, l, p, size): (usize, usize, usize, usize),
    first: usize,
    block: &std::ops::Range<usize>,
) {
    for li in 0..l {
        for j in block.clone() {
            let r0 = (first + j) * p;
            let width = p.min(rows - r0) * size;
            let from = (li * rows + r0) * size;
            let out = &mut run[(j * l + li) * p * size..(j * l + li + 1) * p * size];
            out[..width].copy_from_slice(&src[from..from + width]);
            out[width..].fill(0);
        }
    }
}

/// `t` (a logical `[rows, L]` operand stored with `layout`) stored with `want` instead (panels of
/// `p` rows for [`Layout::Panels`]): when they differ, a copy made by up to `threads` threads in
/// a [`scratch`] buffer, and its length in bytes (the buffer may be longer).
fn stored_as(
    t: &HostTensor,
    layout: Layout,
    want: Layout,
    (rows, l): (u32, u32),
    p: u32,
    threads: usize,
) -> Option<(Vec<u8>, usize)> {
    if layout == want {
        return None;
    }
    let (r, c) = (t.shape[0], t.shape[1]);
    let (rows, l, p) = (rows as usize, l as usize, p as usize);
    let len = match want {
        Layout::Panels => rows.div_ceil(p) * l * p * t.dtype.size_bytes(),
        _ => t.data.len(),
    };
    let mut buf = scratch::take(len);
    let dst = &mut buf[..len];
    match want {
        Layout::Panels => packed_into(&t.data, t.dtype, layout, (rows, l), p, threads, dst),
        _ if t.dtype.size_bytes() == 4 => transposed_into::<4>(&t.data, r, c, threads, dst),
        _ => transposed_into::<2>(&t.data, r, c, threads, dst),
    }
    Some((buf, len))
}

/// The bytes of `t`'s copy made by [`stored_as`], or of `t` when there is none.
fn copy_or<'a>(t: &'a HostTensor, copy: &'a Option<(Vec<u8>, usize)>) -> FloatIn<'a> {
    match copy {
        Some((buf, len)) => FloatIn {
            dtype: t.dtype,
            bytes: &buf[..*len],
        },
        None => float_in(t),
    }
}

/// The threads of the host's copies for a device: a CPU's threads (only a CPU plan asks for
/// copies), 1 for a GPU.
pub(crate) fn copy_threads(caps: DeviceCaps) -> usize {
    match caps {
        DeviceCaps::Cpu { threads, .. } => threads as usize,
        DeviceCaps::Gpu { .. } => 1,
    }
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
    let caps = DeviceCaps::of(dev);
    let Plan {
        a: want_a,
        b: want_b,
        tile,
        rows_first,
    } = plan(caps, (m, n, l, dtype), a_layout, b_layout);
    check_counts((m, n, l), tile, want_b)?;
    let threads = copy_threads(caps);
    let a_t = stored_as(a, a_layout, want_a, (m, l), tile.tm, threads);
    let b_t = stored_as(b, b_layout, want_b, (n, l), tile.tn, threads);
    let spec = Gemm {
        a: want_a,
        b: want_b,
        dtype,
        bias: bias.is_some(),
        residual: residual.is_some(),
        partials: 1,
        tile,
    };
    let operands = (
        copy_or(a, &a_t),
        copy_or(b, &b_t),
        bias.map(float_in),
        residual.map(float_in),
    );
    let c = launch(dev, &spec, (m, n, l), rows_first, operands);
    for (buf, _) in [a_t, b_t].into_iter().flatten() {
        scratch::keep(buf);
    }
    let c = c?;
    HostTensor::new(dtype, vec![m as usize, n as usize], c)
}

/// The four float operands of a product: `A`, `B`, the bias and the residual.
type FloatOperands<'a> = (
    FloatIn<'a>,
    FloatIn<'a>,
    Option<FloatIn<'a>>,
    Option<FloatIn<'a>>,
);

/// Checks that `C`'s elements, and `B`'s in panels of `tile.tn` rows when `b` is
/// [`Layout::Panels`], fit the kernel's `u32` indices.
fn check_counts((m, n, l): (u32, u32, u32), tile: TileConfig, b: Layout) -> Result<()> {
    count_u32("gemm", "C", m as usize * n as usize)?;
    if b == Layout::Panels {
        let panels = n.div_ceil(tile.tn) as usize * l as usize * tile.tn as usize;
        count_u32("gemm", "B's panels", panels)?;
    }
    Ok(())
}

/// Runs `spec` on `(m, n, l)` (operands stored as `spec` says, counts checked by
/// [`check_counts`]), the row tiles fastest when `rows_first`; returns `C`'s bytes.
fn launch(
    dev: &dyn Device,
    spec: &Gemm,
    (m, n, l): (u32, u32, u32),
    rows_first: bool,
    (a, b, bias, r): FloatOperands<'_>,
) -> Result<Vec<u8>> {
    let tile = spec.tile;
    let (m_tiles, n_tiles) = (m.div_ceil(tile.tm), n.div_ceil(tile.tn));
    let n_items = count_u32(
        "gemm",
        "the work items",
        m_tiles as usize * n_tiles as usize,
    )?;
    let panel_len = (spec.b == Layout::Panels).then_some(l * tile.tn);
    let kernel = cached_typed(&spec.name(), || spec.build_typed())?;
    let len = m as usize * n as usize * spec.dtype.size_bytes();
    let mut c = zeroed(len, copy_threads(DeviceCaps::of(dev)));
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
            group: if rows_first { m_tiles } else { 1 },
            panel_len,
            a,
            b,
            bias,
            r,
            c: FloatOut {
                dtype: spec.dtype,
                bytes: &mut c,
            },
        },
    )?;
    Ok(c)
}

/// `C = A @ B.T (+ bias)` in `f32` for `A` row-major `[M, L]` and `B` (`[N, L]`) already in
/// panels of `tile.tn` rows ([`Layout::Panels`]), with `partials` partials (1, or both operands
/// partial-major: [`Gemm::partials`]), on a CPU plan's tile ([`column_tile`]) with the row tiles
/// fastest: the 4-bit matmul's decoded plans (`matmul4/decoded.rs`, `decoded_forward.rs`).
/// Returns `C`'s bytes (`[M, N]` row-major).
///
/// # Errors
/// [`Error::Invalid`] when a count exceeds `2^31 - 1` or `B`'s panels would; any device error.
pub(crate) fn gemm_on_panels(
    dev: &dyn Device,
    (a, b, bias): (&[u8], &[u8], Option<&[u8]>),
    (m, n, l): (u32, u32, u32),
    (tile, partials): (TileConfig, u32),
) -> Result<Vec<u8>> {
    check_counts((m, n, l), tile, Layout::Panels)?;
    let spec = Gemm {
        a: Layout::RowMajor,
        b: Layout::Panels,
        dtype: DType::F32,
        bias: bias.is_some(),
        residual: false,
        partials,
        tile,
    };
    let f32_in = |bytes| FloatIn {
        dtype: DType::F32,
        bytes,
    };
    launch(
        dev,
        &spec,
        (m, n, l),
        true,
        (f32_in(a), f32_in(b), bias.map(f32_in), None),
    )
}

/// From this many bytes of `B` on, the CPU plan runs the row tiles fastest over `B` in panels
/// (see [`plan`]): the panel stays in the core's cache while the rows go by. On the 2-core
/// AVX-512 development VM (2 MiB of L2 per core), `cpu-llvm`, `M = 512`, `K = N = 4096` (64 MiB
/// of `B`): 22-25 GFLOP/s transposed with the output tiles fastest, 39-52 transposed with the
/// row tiles fastest, 112-115 in panels with the row tiles fastest (the `gemm` crate: 174-247 in
/// the same runs). A smaller `B` stays in the cache whole, and the output tiles go fastest.
const PANELS_FROM_BYTES: usize = 2 << 20;

/// A `B` given transposed is packed in panels from this many row tiles on. Its packing is a copy
/// the transposed read does not need, and each panel is read once per row tile: on the
/// development VM, `B` 8 MiB (`L = 512`, `N = 4096`, given transposed), `cpu-llvm`, the
/// transposed read against panels took 0.32-0.34 against 1.9-2.1 ms at `M = 1`, 1.2 against
/// 2.4-2.5 at `M = 16`, 2.1-2.3 against 2.6-2.7 at `M = 32` (4 row tiles) and 4.5-5.0 against
/// 3.3-3.6 at `M = 64` (8 row tiles). Read in place, a tile's consecutive elements of `L` are a
/// stored row apart, and a short row (the adapter's `[L, 64]` operands: 256 bytes) wastes most
/// of each cache line it loads: on Zen 3 (AVX2, 2 threads, release, interleaved runs) the
/// adapter's `da = dy @ U` (`M = 512`, `L = 4096`, `U` given `[4096, 64]`) and `dU = dy^T @ a`
/// (`M = 4096`, `L = 512`, `a` given `[512, 64]`, `A` copied row-major) took 6.7-8.9 ms
/// together read in place, about 3.1 in panels, packing included (on the AVX-512 VM `da` gained
/// nothing); the adapter's `dh = dz @ D + dy` (`M = 512`, `L = 64`, `D` given `[64, 4096]`,
/// medians of 23 interleaved runs there) took 2.86 against 3.28 ms in panels.
const PANELS_MIN_ROW_TILES: u32 = 8;

/// How the kernel of one product reads its operands ([`plan`]).
struct Plan {
    /// Storage of `A` the kernel reads (the host copies `A` stored otherwise).
    a: Layout,
    /// Storage of `B` the kernel reads.
    b: Layout,
    tile: TileConfig,
    /// Whether consecutive work items go down the row tiles for one output tile (the `group`
    /// parameter is then `m_tiles`), rather than along the output tiles of a row tile.
    rows_first: bool,
}

/// The [`Plan`] of an `[M, L] x [L, N]` product (`(m, n, l)`, `dtype`) on a device, with `A`
/// and `B` given stored as `a` and `b`:
/// * a GPU reads the operands as they are;
/// * a CPU with vectors (4 lanes or more) reads `A` row-major and `B` in panels
///   ([`Layout::Panels`]), or a `B` given transposed as it is below [`PANELS_MIN_ROW_TILES`]
///   row tiles: the tile's columns are the vector lanes, each `A` element is broadcast to
///   them, and every output keeps its one running sum ([`crate::GEMM_ORDER`]) in a lane (the
///   LLVM backend's `codegen/src/llvm/outer.rs`, the Cranelift backend's
///   `codegen/src/cranelift/accumulate_columns.rs`). A transposed `A` is copied: read in place,
///   a tile's `A` elements for one step of `L` share a cache line with only the tile's rows
///   (6 of 16 `f32`) and the next step is a stored row further, in the same L1 set when that
///   row is 4 KiB or more (the adapter's `dU = dy^T @ a`, `A` given `[512, 4096]`: on Zen 3
///   7.5-9.3 ms read in place; `docs/adapters.md`, stop 61, for it, `dD` and `da` with `A`
///   copied and `B` packed). [`column_tile`] gives the tile; the row tiles go fastest from
///   [`PANELS_FROM_BYTES`] of `B` on;
/// * a CPU without vectors (and the interpreter): both row-major, [`suggest_tile_sizes`].
///
/// A `B` given row-major is copied either way; in panels rather than transposed, the adapter's
/// `y = a @ U.T + b + h` (`M = 512`, `L = 64`, `N = 4096`) took 3.69 against 4.29 ms and
/// `z = h @ D.T + b` (`L = 4096`, `N = 64`) 1.79 against 2.08 (medians as above).
fn plan(caps: DeviceCaps, (m, n, l, dtype): (u32, u32, u32, DType), a: Layout, b: Layout) -> Plan {
    match caps {
        DeviceCaps::Gpu { .. } => Plan {
            a,
            b,
            tile: suggest_tile_sizes(m as usize, n as usize, l as usize, caps),
            rows_first: false,
        },
        DeviceCaps::Cpu { lanes, .. } if lanes >= 4 => {
            let tile = column_tile(m, n, l, caps);
            let size = dtype.size_bytes();
            let large = n as usize * l as usize * size >= PANELS_FROM_BYTES;
            let pays = m.div_ceil(tile.tm) >= PANELS_MIN_ROW_TILES;
            let copied = b != Layout::Transposed;
            let b = if copied || pays {
                Layout::Panels
            } else {
                Layout::Transposed
            };
            Plan {
                a: Layout::RowMajor,
                b,
                tile,
                rows_first: b == Layout::Panels && large,
            }
        }
        DeviceCaps::Cpu { .. } => Plan {
            a: Layout::RowMajor,
            b: Layout::RowMajor,
            tile: suggest_tile_sizes(m as usize, n as usize, l as usize, caps),
            rows_first: false,
        },
    }
}

/// The tile of the column-lanes plan on a CPU with `lanes >= 4`: `min(M, 6) x 16` with 8 lanes
/// (the LLVM backend with AVX2: 12 sums, the two `B` vectors and the broadcast `A` element are 15
/// of its 16 `ymm` registers, as in the `gemm` crate's micro-kernel), the input gradient's tile
/// with 16 ([`suggest_backward_tile_sizes`], 8 x 32, rows the largest power of two up to M),
/// `min(M, 4)` x 8 with 4 (the Cranelift backend's 128-bit vectors: 8 sums and the operands fit
/// its 16 registers), rows halving while there would be fewer than 4 work items per thread, then
/// no wider than `N` rounded up to the lanes (at `N = 16`, 8 x 16: a 32-column tile would hold 16
/// columns past the end, which are not consecutive, so every work item would take the scalar
/// path).
///
/// On Zen 3 (AVX2, 2 threads, release), `dY @ W` at `M = 512`, `K = N = 4096` (`B` in panels):
/// 6 x 16 152-174 ms, 4 x 16 147-180, 3 x 16 199, 8 x 16 (the input gradient's tile, used here
/// before) 228-257, 6 x 8 224, 2 x 32 202, 3 x 32 272 ms, the `gemm` crate 111-160 ms in the same
/// runs: 8 x 16's 16 sums left no register for the operands, and LLVM kept some on the stack;
/// 6 x 16's loop has no stack access. `adapter_fwd_bwd` (`d = 4096`, `r = 64`, `M = 512`) took
/// 27-35 ms with 8 x 16, 6 x 16 and 4 x 16 alike.
///
/// Measured on the 2-core Xeon VM (AVX-512) at `d = 4096`, `r = 64`, `M = 512`: on `cpu-llvm`
/// the adapter's six products took 13.7 ms against 20.0 ms with 4 x 32 tiles and a row-major
/// `A`, and 24-25 ms with the dot tile (under [`crate::DOT_ORDER`]); since the tile's sums are
/// stored as vectors (`codegen/src/llvm/outer_store.rs`), 8 rows beat 4. On `cpu` (Cranelift)
/// the whole `adapter_fwd_bwd` case took 54 ms with 4 x 8 and 2 x 16, 57 with 3 x 8, 71 with
/// 2 x 8 and 4 x 4, 83 with 1 x 16.
pub(crate) fn column_tile(m: u32, n: u32, l: u32, caps: DeviceCaps) -> TileConfig {
    let (m, n, l) = (m as usize, n as usize, l as usize);
    let DeviceCaps::Cpu { threads, lanes } = caps else {
        return suggest_tile_sizes(m, n, l, caps);
    };
    let want = 4usize.saturating_mul(threads.max(1) as usize);
    let mut tile = if lanes == 8 {
        crate::matmul4::host::shrink((m.max(1), n.max(1)), (m.clamp(1, 6), 16), want, true)
    } else if lanes >= 8 {
        suggest_backward_tile_sizes(m, l, n, caps)
    } else {
        crate::matmul4::host::shrink((m.max(1), n.max(1)), (m.clamp(1, 4), 8), want, true)
    };
    let cols = n.max(1).next_multiple_of(lanes as usize) as u32;
    tile.tn = tile.tn.min(cols);
    tile
}

#[cfg(test)]
mod tests {
    use super::{packed, plan};
    use crate::gemm::transpose::{transposed, transposed_into};
    use crate::ops::DeviceCaps;
    use crate::Layout;
    use qforge_ir::DType;

    /// The CPU plan of the adapter's products (`d = 4096`, `r = 64`, `M = 512`) and of the bias
    /// gradient, as measured in [`plan`]'s docs: `(m, n, l)`, the given layouts, then `B`'s
    /// storage and whether the row tiles go fastest; `A` is read row-major.
    #[test]
    fn the_cpu_plan_packs_b_where_it_pays() {
        use Layout::{Panels as P, RowMajor as N, Transposed as T};
        for lanes in [8, 16] {
            let caps = DeviceCaps::Cpu { threads: 2, lanes };
            for (what, (m, n, l), (a, b), want) in [
                ("z = h D^T", (512, 64, 4096), (N, N), (P, false)),
                ("y = a U^T", (512, 4096, 64), (N, N), (P, false)),
                ("da = dy U", (512, 64, 4096), (N, T), (P, false)),
                ("dh = dz D", (512, 4096, 64), (N, T), (P, false)),
                ("dU = dy^T a", (4096, 64, 512), (T, T), (P, false)),
                ("dD = dz^T h", (64, 4096, 512), (T, T), (P, true)),
                ("db = 1^T dy", (1, 4096, 512), (N, T), (T, false)),
                ("y = x W^T, 64 MiB", (512, 4096, 4096), (N, N), (P, true)),
            ] {
                let p = plan(caps, (m, n, l, DType::F32), a, b);
                assert_eq!(
                    (p.a, p.b, p.rows_first),
                    (N, want.0, want.1),
                    "{what}, {lanes} lanes"
                );
            }
        }
    }

    /// Element `(r, l)` of a `[rows, L]` operand lands at `((r / p) * L + l) * p + r % p`
    /// from its row-major and its transposed storage alike, and the rows past the end are zero.
    #[test]
    fn packed_places_every_element_and_pads_with_zeros() {
        // The last four fill whole blocks of panels of 32, 64 and 128 bytes a row (fixed-size
        // copies from the transposed storage), 275 rows a whole block and a padded one.
        let cases = [
            (1, 1, 1),
            (5, 3, 4),
            (8, 7, 4),
            (33, 2, 32),
            (3, 0, 2),
            (64, 5, 16),
            (275, 3, 16),
            (96, 3, 32),
            (128, 4, 64),
        ];
        for (rows, l, p) in cases {
            let value = |r: usize, k: usize| (r * 8 + k + 1) as u16;
            let bytes =
                |v: Vec<u16>| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
            let row_major = bytes(
                (0..rows * l)
                    .map(|i| value(i / l.max(1), i % l.max(1)))
                    .collect(),
            );
            let stored_t = bytes((0..rows * l).map(|i| value(i % rows, i / rows)).collect());
            let got = packed(&row_major, DType::BF16, Layout::RowMajor, (rows, l), p, 1);
            let got_t = packed(&stored_t, DType::BF16, Layout::Transposed, (rows, l), p, 1);
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

    /// Into a buffer holding an earlier copy's bytes (a [`super::scratch`] buffer), the copies
    /// write every byte: the panels' padding rows come out zero.
    #[test]
    fn copies_into_used_buffers_overwrite_every_byte() {
        for (rows, l, p) in [(5, 3, 4), (33, 2, 32), (17, 9, 16)] {
            let src: Vec<u8> = (0..rows * l * 4).map(|i| (i % 251) as u8).collect();
            for layout in [Layout::RowMajor, Layout::Transposed] {
                let want = packed(&src, DType::F32, layout, (rows, l), p, 1);
                let mut used = vec![0xA5; want.len()];
                super::packed_into(&src, DType::F32, layout, (rows, l), p, 1, &mut used);
                assert_eq!(used, want, "{rows}x{l} in panels of {p}, {layout:?}");
            }
            let mut used = vec![0xA5; src.len()];
            transposed_into::<4>(&src, rows, l, 1, &mut used);
            assert_eq!(used, transposed::<4>(&src, rows, l, 1), "{rows}x{l}");
        }
    }

    /// `zeroed` clears every byte, on one thread and split between several (odd lengths above
    /// the threaded size), also where the allocator hands back a block just freed full of ones.
    #[test]
    fn zeroed_clears_every_byte() {
        for len in [0, 1, 4097, super::THREADED_COPY_FROM_BYTES * 3 + 5] {
            for threads in [1, 2, 3] {
                drop(vec![0xFFu8; len]);
                let z = super::zeroed(len, threads);
                assert_eq!(z.len(), len);
                assert!(z.iter().all(|b| *b == 0), "{len} bytes, {threads} threads");
            }
        }
    }

    /// Above the threaded size, the copies split between threads (runs of several rows and a
    /// last short run) are the one-thread copies, which the tests above check element by element.
    #[test]
    fn threaded_copies_are_the_one_thread_copies() {
        let (rows, cols) = (301, 263);
        let src: Vec<u8> = (0..rows * cols * 4).map(|i| (i * 13 % 251) as u8).collect();
        assert!(src.len() >= super::THREADED_COPY_FROM_BYTES);
        let one = transposed::<4>(&src, rows, cols, 1);
        for threads in [2, 3, 7] {
            assert_eq!(
                transposed::<4>(&src, rows, cols, threads),
                one,
                "{threads} threads"
            );
        }
        for layout in [Layout::RowMajor, Layout::Transposed] {
            for p in [8, 32] {
                let one = packed(&src, DType::F32, layout, (rows, cols), p, 1);
                for threads in [2, 3, 7] {
                    assert_eq!(
                        packed(&src, DType::F32, layout, (rows, cols), p, threads),
                        one,
                        "{layout:?}, panels of {p}, {threads} threads"
                    );
                }
            }
        }
    }
}
