//! The fused 4-bit linear layer (bitsandbytes `matmul_4bit`, QLoRA arXiv 2305.14314): forward
//! `y = x @ dequant(W).T + bias` and the input gradient `dX = dY @ dequant(W)`, with the weight
//! decoded in registers only. Exact semantics: [`crate::matmul4`].

use crate::matmul4::decoded::{decoded_plan, run_decoded, DecodeInput, STRIP_BYTES};
use crate::matmul4::decoded_forward::{forward_plan, run_forward_decoded};
use crate::matmul4::panels::{dx_panel_bytes, pack_dx_panels, scale_chunk, scales_of};
use crate::matmul4::widen::{narrowed, widened, widens};
use crate::matmul4::{Direction, Matmul4, Matmul4bitArgs, Matmul4bitDxArgs, TileConfig};
use crate::BLOCKSIZES_4BIT;
use qforge_ir::dsl::{FloatIn, FloatOut};
use qforge_ir::DType;

use crate::ops::{blocksize_u32, cached_typed, count_u32, expect_len, float_input};
use crate::quant4::host::{Absmax4, QuantState4};
use qforge_runtime::HostTensor;
use qforge_runtime::{launch_typed, Device};
use qforge_runtime::{Error, Result};

/// What [`suggest_tile_sizes`] needs to know about a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceCaps {
    /// A CPU: work items are spread over `threads` threads and vectorized `lanes` wide (4 for
    /// the Cranelift backend's 128-bit vectors, up to 16 for the LLVM backend).
    Cpu {
        /// Worker threads.
        threads: u32,
        /// `f32` lanes of a vector register.
        lanes: u32,
    },
    /// A GPU: one work item per thread, `parallel_threads` threads resident at once (e.g.
    /// SMs x 2048 on NVIDIA).
    Gpu {
        /// Threads resident at once across the device.
        parallel_threads: u32,
    },
}

impl DeviceCaps {
    /// The capabilities of `dev`, from [`Device::caps`]: a GPU with its resident threads, or
    /// else a CPU with the device's parallel threads and vector lanes (a sequential device,
    /// such as the interpreter, is a one-thread CPU without vectors).
    pub fn of(dev: &dyn Device) -> DeviceCaps {
        let caps = dev.caps();
        if caps.is_gpu() {
            DeviceCaps::Gpu {
                parallel_threads: caps.parallel_threads.max(1),
            }
        } else {
            DeviceCaps::Cpu {
                threads: caps.parallel_threads.max(1),
                lanes: caps.vector_lanes.max(1),
            }
        }
    }
}

/// A tile for an `[M, K] x [K, N]` product (outputs `M x N`) on a device: the heuristic,
/// documented in `docs/semantics.md`. Tiles never change results, only speed.
///
/// * CPU: decoding a weight (nibble, table, absmax, rounding) costs far more than the fused
///   multiply-adds it feeds, so rows of the activation share each decode: `tm = min(M, 8)`,
///   `tn = 4` (at most 32 outputs per work item), `tm = min(M, 4)` with 16 lanes or more
///   (the LLVM backend's 64-element groups hold 4x more values per output, so 8x4 spills),
///   `tm = 5` there from M = 64 (20 accumulator registers of 32; at most 4 of 64 rows wasted
///   on the last tile), and `tm = min(M, 4)`, `tn = 2` with 8 (LLVM with AVX2: 16 `ymm`
///   registers), `tm = 8` there from M = 64.
///   Measured with `QFORGE_MATMUL_TILE` on the 2-core development machine at K = N = 4096:
///   M = 1 runs fastest with 1x4 (1x1..1x16 within 15%), M = 16 with 8x4 on Cranelift (20 ms,
///   against 55 ms for 4x1 and 99 ms for 1x4) and 4x4 on LLVM with AVX-512 (4.0-5.0 ms against
///   6.7-13 ms for 8x4). With AVX2 (Zen 3, 2 threads) M = 16 took 9.7-12.6 ms (f32) and
///   13.4-13.8 ms (bf16) with 4x2, 11.7-14.1 and 15.0-19.7 ms with 4x4, 15.3-18.6 and
///   15.8-20.2 ms with 8x4; M = 1 times the same with 1x2 and 1x4. On the Xeon VM
///   (Sapphire-Rapids class, release, 2 threads) 5x4 against 4x4: M = 512, K = N = 4096 f32
///   66.7-69.0 against 71.6-72.1 ms, bf16 94 against 101 ms; M = 2048, K = 4096, N = 11008
///   740 against 797 ms; M = 128 16.7 against 17.8 ms (K = N = 4096) and 43.7 against 47.6 ms
///   (K = 11008); M = 16 2.51 against 2.22 ms, so 4 rows below M = 64. 6x4, 6x3, 7x3, 5x3,
///   8x3 and 8x2 were slower than 5x4 at M = 512. On Zen 3 (AVX2, 2 threads, release,
///   interleaved runs, K = N = 4096 unless said) 8x2 against 4x2: f32 M = 128 71.0 against
///   75.5 ms, M = 512 285 against 305 ms (K = 11008: 787 against 827), M = 2048 1176 against
///   1245 ms; bf16 M = 128 78.8 against 78.9, M = 512 310 against 341 ms (6x2 was as fast
///   in f32 and slower in bf16 at M = 128; 3x2 and 2x2 slower). The tile shrinks (`tn`
///   first) while there would be fewer than 4 work items per thread. With AVX2 or AVX-512,
///   from [`super::decoded_forward::FORWARD_DECODE_FROM_ROWS`] rows on, `matmul_4bit` with
///   `tile = None` runs the decoded plan instead (the weight decoded once, then the dense
///   GEMM with 16 partials: 1.4-2.5x faster on Zen 3, 1.7-2.1x from M = 128 on Zen 4, same
///   bits).
/// * GPU: one thread keeps 16 scalar partials per output (`K_ORDER`); `tm = min(M, 4)`, `tn = 1`, shrunk
///   while there would be fewer work items than half the resident threads.
pub fn suggest_tile_sizes(m: usize, n: usize, k: usize, caps: DeviceCaps) -> TileConfig {
    let _ = k; // the K reduction is never tiled (its order is fixed)
    let m = m.max(1);
    let n = n.max(1);
    let (tm, tn, want_items) = match caps {
        DeviceCaps::Cpu { threads, lanes } => {
            let (rows, cols) = match lanes {
                16.. if m >= 64 => (5, 4),
                16.. => (4, 4),
                8..=15 if m >= 64 => (8, 2),
                8..=15 => (4, 2),
                _ => (8, 4),
            };
            (
                m.min(rows),
                cols,
                4usize.saturating_mul(threads.max(1) as usize),
            )
        }
        DeviceCaps::Gpu { parallel_threads } => (m.min(4), 1, parallel_threads as usize / 2),
    };
    shrink((m, n), (tm, tn), want_items, false)
}

/// The tile `(tm, tn)` for `rows x cols` outputs, halved (`tn` first, or `tm` first when
/// `rows_first`) while there would be fewer than `want` work items.
pub(crate) fn shrink(
    (rows, cols): (usize, usize),
    (mut tm, mut tn): (usize, usize),
    want: usize,
    rows_first: bool,
) -> TileConfig {
    let items = |tm: usize, tn: usize| rows.div_ceil(tm).saturating_mul(cols.div_ceil(tn));
    while items(tm, tn) < want && (tm > 1 || tn > 1) {
        if tn > 1 && !(rows_first && tm > 1) {
            tn /= 2;
        } else {
            tm /= 2;
        }
    }
    TileConfig {
        tm: tm as u32,
        tn: tn as u32,
    }
}

/// The tile of the input gradient `dX = dY @ dequant(W)` (`[M, N] x [N, K]`, outputs `M x K`)
/// on a device. Tiles never change results, only speed.
///
/// * CPU with 8 lanes or more (the LLVM backend, AVX2 or AVX-512): `tm x 32` with 16 lanes
///   (AVX-512), `tm x 16` with 8 (AVX2), `tm` the largest power of two up to `min(M, 8)`: rows
///   of `dY` against consecutive columns of `W`, which
///   the backend runs with the columns as vector lanes and one group of registers per row
///   (`codegen/src/llvm/outer.rs`: the weights of one `n` are contiguous bytes of the panel
///   layout, [`crate::matmul4::panels`], decoded once for all rows, each `dY` value
///   broadcast). In [`super::DX_ORDER`]'s one
///   running sum per output, 8 x 32 is 16 sum registers and two decoded weight vectors per
///   `n`; 8 x 16 with AVX2 is all 16 of its registers (LLVM spills some, and it is still the
///   fastest there at every M measured, below). Measured in one release build, 2 threads,
///   f32, M = 512, K = N = 4096, on the Sapphire-Rapids-class development VM: 8x32 67 ms
///   (16x16 78 ms: its 16 row pointers spill; 4x64 1.7 s, not investigated); AVX2
///   code on the same VM (`CpuOptions::avx512 = false`) 4x16 159 ms (2x16 288, 4x32 224,
///   8x16 217 ms). Before, in `DOT_ORDER`'s 8 partials, 8x32 took 74-83 ms and AVX2's 2x16
///   346 ms (the band of one partial at a time passed over `dY` and the panels 8 times).
///   32 columns rather than 16 read 16 bytes of each weight row's cache line instead of 8.
///   On Zen 3 itself (AVX2, 2 threads, release, interleaved runs) 4x16 was slower: 8x16
///   against 4x16, f32, K = N = 4096: M = 128 58.4 against 82.3 ms, M = 512 233 against 327
///   ms, M = 2048 978 against 1302 ms; (K, N) = (4096, 11008) and (11008, 4096) at M = 128
///   and 512 1.3-1.45x faster; bf16 1.15-1.45x faster at M = 128 and 512 (8x8 within 7% of
///   8x16 there, 8x32 and 4x32 slower); at M = 16, K = N = 4096 f32 11.4-11.6 against
///   13.3-13.4 ms (8x8 the same as 8x16), bf16 14.3 against 17.6 ms.
///   `tm` halves, then `tn`, while there would be fewer than 4 work items per thread.
///   With AVX2, from [`super::decoded::DECODE_FROM_ROWS`] rows on (AVX-512: from
///   [`super::decoded::DECODE_FROM_ROWS_AVX512`]), the op runs the decoded plan instead (the
///   weight decoded once, then the dense GEMM: 1.4-2.2x faster on Zen 3, 1.03-1.24x on Zen 4).
/// * Otherwise [`suggest_tile_sizes`] for `M x K` outputs.
pub fn suggest_backward_tile_sizes(m: usize, n: usize, k: usize, caps: DeviceCaps) -> TileConfig {
    match caps {
        DeviceCaps::Cpu { threads, lanes } if lanes >= 8 => {
            let want = 4usize.saturating_mul(threads.max(1) as usize);
            let (m, k) = (m.max(1), k.max(1));
            // 6 rows with AVX2 timed as 8 (M = 512, 229-235 ms); the decoded plan
            // (`decoded.rs`) runs the many-row shapes there.
            let cols = if lanes >= 16 { 32 } else { 16 };
            let tm = 1 << m.min(8).ilog2();
            shrink((m, k), (tm, cols), want, true)
        }
        _ => suggest_tile_sizes(m, k, n, caps),
    }
}

/// Shapes of one call: `m` activation rows, and the weight `[n, k]`.
struct Dims {
    m: u32,
    n: u32,
    k: u32,
}

/// Checks the weight's quant state (a 2-D `[N, K]` tensor) and the activation (`[..., cols]`
/// in a float dtype), returning the shapes.
fn check_shapes(
    op: &str,
    act: &HostTensor,
    packed: &[u8],
    state: &QuantState4,
    forward: bool,
) -> Result<Dims> {
    let &[n, k] = state.shape.as_slice() else {
        return Err(Error::Invalid(format!(
            "{op}: the weight must be 2-D [N, K], its quant state has shape {:?}",
            state.shape
        )));
    };
    if n == 0 || k == 0 {
        return Err(Error::Invalid(format!(
            "{op}: the weight is empty (shape [{n}, {k}])"
        )));
    }
    let elems = count_u32(op, "the weight", n.saturating_mul(k))?;
    expect_len(op, "packed", packed.len(), elems.div_ceil(2) as usize)?;
    let (want, want_name) = if forward { (k, "K") } else { (n, "N") };
    let cols = act.shape.last().copied();
    if cols != Some(want) {
        return Err(Error::Invalid(format!(
            "{op}: the {} has shape {:?}; its last dim must be {want_name} = {want} of the [{n}, {k}] weight",
            if forward { "input x" } else { "gradient dY" },
            act.shape
        )));
    }
    let other = if forward { n } else { k };
    // An empty batch (a leading dim of 0) gives an empty output; anything else must be a
    // well-formed float tensor.
    let total = if act.shape.contains(&0) && act.dtype.is_float() {
        if !act.data.is_empty() {
            return Err(Error::Invalid(format!(
                "{op}: a tensor of shape {:?} holds no elements, but {} bytes were given",
                act.shape,
                act.data.len()
            )));
        }
        0
    } else {
        float_input(op, act)?
    };
    let m = total / want as u32;
    count_u32(op, "the output", m as usize * other)?;
    Ok(Dims {
        m,
        n: n as u32,
        k: k as u32,
    })
}

/// The absmax arguments of a matmul kernel: `absmax`, or the nested four.
struct Scales<'a> {
    absmax: Option<&'a [f32]>,
    offset: Option<f32>,
    n_nested: Option<u32>,
    qabsmax: Option<&'a [u8]>,
    nested_absmax: Option<&'a [f32]>,
    nested_code: Option<&'a [f32]>,
}

impl<'a> Scales<'a> {
    fn of(absmax: &'a Absmax4, n_nested: u32) -> Scales<'a> {
        match absmax {
            Absmax4::Plain(absmax) => Scales {
                absmax: Some(absmax),
                offset: None,
                n_nested: None,
                qabsmax: None,
                nested_absmax: None,
                nested_code: None,
            },
            Absmax4::Nested {
                qabsmax,
                nested_absmax,
                nested_code,
                offset,
                ..
            } => Scales {
                absmax: None,
                offset: Some(*offset),
                n_nested: Some(n_nested),
                qabsmax: Some(qabsmax),
                nested_absmax: Some(nested_absmax),
                nested_code: Some(nested_code),
            },
        }
    }
}

/// How [`run`] computes its product.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Plan {
    /// The op chooses: the fused kernel with the suggested tile, or a decoded plan where
    /// [`forward_plan`] (forward) or [`decoded_plan`] (input gradient) takes it.
    Auto,
    /// The fused kernel with this tile.
    Fused(TileConfig),
    /// The decoded plan with this GEMM tile and strips of at most this many bytes (tests; it
    /// still needs `K` a multiple of 16 (forward) or 32 (input gradient) and 16-bit activations
    /// widened).
    #[cfg(test)]
    Decoded(TileConfig, usize),
}

/// Runs the forward (`forward`, with `bias`) or the input gradient (`bias` is `None`) on the
/// activation `act` (`x` or `dY`).
pub(crate) fn run(
    dev: &dyn Device,
    act: &HostTensor,
    packed: &[u8],
    state: &QuantState4,
    bias: Option<&HostTensor>,
    forward: bool,
    plan: Plan,
) -> Result<HostTensor> {
    let op = if forward {
        "matmul_4bit"
    } else {
        "matmul_4bit_backward_input"
    };
    let d = check_shapes(op, act, packed, state, forward)?;
    let tile = match plan {
        Plan::Fused(tile) => Some(tile),
        _ => None,
    };
    let bs = blocksize_u32(op, state.blocksize, &BLOCKSIZES_4BIT)?;
    let (outs, dtype) = (if forward { d.n } else { d.k }, act.dtype);
    let tile = tile.unwrap_or_else(|| {
        let (m, n, k, caps) = (
            d.m as usize,
            d.n as usize,
            d.k as usize,
            DeviceCaps::of(dev),
        );
        if forward {
            suggest_tile_sizes(m, n, k, caps)
        } else {
            suggest_backward_tile_sizes(m, n, k, caps)
        }
    });
    tile.check()
        .map_err(|e| Error::Invalid(format!("{op}: {e}")))?;
    if let Some(b) = bias {
        if b.dtype != dtype
            || b.shape != [d.n as usize]
            || b.data.len() != d.n as usize * dtype.size_bytes()
        {
            return Err(Error::Invalid(format!(
                "{op}: the bias must be a {dtype} tensor of shape [{}] ({} bytes), got {} {:?} ({} bytes)",
                d.n,
                d.n as usize * dtype.size_bytes(),
                b.dtype,
                b.shape,
                b.data.len()
            )));
        }
    }
    if !state.dtype.is_float() {
        return Err(Error::Invalid(format!(
            "{op}: the quant state's dtype must be f32, f16 or bf16, got {}",
            state.dtype
        )));
    }
    let weight_dtype = weight_dtype(op, state.dtype, dtype)?;
    let threads = match DeviceCaps::of(dev) {
        DeviceCaps::Cpu { threads, .. } => Some(threads as usize),
        DeviceCaps::Gpu { .. } => None,
    };
    // The input gradient's scale layout has the largest chunk that K allows (`panels.rs`).
    let chunk = scale_chunk(d.k as usize, bs);
    // The decoded plans' GEMM tile and strip size, where one runs (on f32 activations only).
    let caps = DeviceCaps::of(dev);
    let decoded = match plan {
        Plan::Auto if forward => forward_plan(caps, (d.m, d.n, d.k)).map(|t| (t, STRIP_BYTES)),
        Plan::Auto => decoded_plan(caps, (d.m, d.n, d.k)).map(|t| (t, STRIP_BYTES)),
        Plan::Fused(_) => None,
        #[cfg(test)]
        Plan::Decoded(tile, strip) => Some((tile, strip)),
    };
    // On a CPU, 16-bit activations are widened once (`widen.rs`) where `widens` says: the f32
    // kernel runs and its output is rounded to the activation dtype, the same bits as the 16-bit
    // kernel. On Zen 3 (2 threads, bf16, one process alternating, best of 5) a decoded plan from 32
    // rows beat the 16-bit fused kernel: M = 32, K = N = 4096 forward 22.5 against 28.0 ms, input
    // gradient 21.7 against 31.1; M = 48 24.0 against 41.3 and 21.2 against 40.4; M = 32, (K, N) =
    // (11008, 4096) 47.4 against 58.7 and 58.2 against 76.5, (4096, 11008) 80.9 against 91.4 and
    // 59.3 against 93.1.
    let widen = match threads {
        Some(t) if dtype.size_bytes() == 2 && widens(caps, forward, d.m, decoded.is_some()) => {
            Some(t)
        }
        _ => None,
    };
    let (act_wide, bias_wide) = match widen {
        Some(t) => (
            Some(widened(dtype, &act.data, t)),
            bias.map(|b| widened(dtype, &b.data, t)),
        ),
        None => (None, None),
    };
    let kernel_dtype = if widen.is_some() { DType::F32 } else { dtype };
    let elems = d.n * d.k;
    let (n_packed, n_blocks) = (elems.div_ceil(2), elems.div_ceil(bs));
    let direction = if forward {
        Direction::Forward {
            bias: bias.is_some(),
        }
    } else {
        Direction::BackwardInput { chunk }
    };
    let spec = Matmul4 {
        quant_type: state.quant_type,
        blocksize: bs,
        dtype: kernel_dtype,
        weight_dtype,
        nested: matches!(state.absmax, Absmax4::Nested { .. }),
        direction,
        tile,
    };
    let n_tiles = outs.div_ceil(tile.tn);
    let n_items = count_u32(
        op,
        "the work items",
        d.m.div_ceil(tile.tm) as usize * n_tiles as usize,
    )?;
    let out_len = d.m as usize * outs as usize * kernel_dtype.size_bytes();
    let mut shape = act.shape.clone();
    if let Some(last) = shape.last_mut() {
        *last = outs as usize;
    }
    let n_nested = state.absmax.check_len(op, n_blocks)?;
    if d.m == 0 {
        return HostTensor::new(dtype, shape, Vec::new());
    }
    let s = Scales::of(&state.absmax, n_nested);
    let act = FloatIn {
        dtype: kernel_dtype,
        bytes: act_wide.as_deref().unwrap_or(&act.data),
    };
    let bias = bias.map(|b| FloatIn {
        dtype: kernel_dtype,
        bytes: bias_wide.as_deref().unwrap_or(&b.data),
    });
    let decoded = decoded.filter(|_| kernel_dtype == DType::F32);
    // The weight as both decoded plans read it: bitsandbytes' layout.
    let weight = DecodeInput {
        codes: packed,
        n_scales: n_blocks,
        absmax: s.absmax,
        qabsmax: s.qabsmax,
        offset: s.offset,
        n_nested: s.n_nested,
        nested_absmax: s.nested_absmax,
        nested_code: s.nested_code,
    };
    let out = if let (true, Some((gemm_tile, strip))) = (forward, decoded) {
        let threads = threads.unwrap_or(1);
        let dims = (d.m, d.n, d.k);
        let operands = (act.bytes, bias.map(|b| b.bytes));
        run_forward_decoded(
            dev,
            &spec,
            dims,
            operands,
            &weight,
            (gemm_tile, strip, threads),
        )?
    } else if forward {
        let mut out = vec![0u8; out_len];
        let kernel = cached_typed(&spec.name(), || spec.build_forward())?;
        launch_typed(
            dev,
            &kernel,
            &mut Matmul4bitArgs {
                m: d.m,
                n: d.n,
                k: d.k,
                n_items,
                n_tiles,
                offset: s.offset,
                n_packed,
                n_blocks,
                n_nested: s.n_nested,
                x: act,
                packed,
                absmax: s.absmax,
                qabsmax: s.qabsmax,
                nested_absmax: s.nested_absmax,
                nested_code: s.nested_code,
                bias,
                y: FloatOut {
                    dtype: kernel_dtype,
                    bytes: &mut out,
                },
            },
        )?;
        out
    } else {
        // The codes in the input gradient's panel layout (`panels.rs`), nibble indices in u32.
        let panel_bytes = dx_panel_bytes(d.n as usize, d.k as usize);
        count_u32(
            op,
            "the weight's panel codes",
            panel_bytes.saturating_mul(2),
        )?;
        let threads =
            threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |t| t.get()));
        if let Some((gemm_tile, strip)) = decoded {
            let dims = (d.m, d.n, d.k);
            let dx = run_decoded(
                dev,
                &spec,
                dims,
                act.bytes,
                &weight,
                (gemm_tile, strip, threads),
            )?;
            return finish(dx, widen, dtype, shape);
        }
        let (n, k) = (d.n as usize, d.k as usize);
        let panels = pack_dx_panels(packed, n, k, threads)?;
        let absmax = s.absmax.map(|a| scales_of(a, n, k, bs, chunk));
        let qabsmax = s.qabsmax.map(|q| scales_of(q, n, k, bs, chunk));
        let n_scales = (n * k / chunk as usize) as u32;
        let mut out = vec![0u8; out_len];
        let kernel = cached_typed(&spec.name(), || spec.build_backward_input())?;
        launch_typed(
            dev,
            &kernel,
            &mut Matmul4bitDxArgs {
                m: d.m,
                n: d.n,
                k: d.k,
                n_items,
                n_tiles,
                offset: s.offset,
                n_panel_bytes: panel_bytes as u32,
                n_scales,
                n_nested: s.n_nested,
                dy: act,
                panels: &panels,
                absmax: absmax.as_deref(),
                qabsmax: qabsmax.as_deref(),
                nested_absmax: s.nested_absmax,
                nested_code: s.nested_code,
                dx: FloatOut {
                    dtype: kernel_dtype,
                    bytes: &mut out,
                },
            },
        )?;
        out
    };
    finish(out, widen, dtype, shape)
}

/// The op's output tensor from the kernel's bytes `out`, rounded back to `dtype` when the
/// activations were widened on `widen` threads.
fn finish(
    out: Vec<u8>,
    widen: Option<usize>,
    dtype: DType,
    shape: Vec<usize>,
) -> Result<HostTensor> {
    let out = match widen {
        Some(t) => narrowed(dtype, &out, t),
        None => out,
    };
    HostTensor::new(dtype, shape, out)
}

/// The dtype the decoded weight is rounded to for activations of `act` (bitsandbytes:
/// dequantize to the weight's dtype, then `.to(x.dtype)`), as `matmul_4bit` decides it.
///
/// # Errors
/// [`Error::Invalid`] naming `op` for a 16-bit weight with activations of the other 16-bit
/// dtype (it would round twice).
pub(crate) fn weight_dtype(op: &str, weight: DType, act: DType) -> Result<DType> {
    match (weight, act) {
        (DType::F32, x) => Ok(x),
        (w, DType::F32) => Ok(w),
        (w, x) if w == x => Ok(w),
        (w, x) => Err(Error::Invalid(format!(
            "{op}: a {w} weight with {x} activations would round twice; convert one of them"
        ))),
    }
}

/// `y = x @ dequant(W).T (+ bias)` for `x` of shape `[..., K]` (f32, f16 or bf16) and a weight
/// `[N, K]` quantized by [`crate::ops::quantize_4bit`] (NF4 or FP4, any blocksize, plain or
/// double-quantized absmax), giving `y` of shape `[..., N]` in `x`'s dtype. With `tile = None`
/// the op chooses: the fused kernel with [`suggest_tile_sizes`] (the weight decoded inside the
/// kernel only), or on an AVX2 or AVX-512 CPU from
/// [`super::decoded_forward::FORWARD_DECODE_FROM_ROWS`] rows on the decoded plan (`x` and the
/// weight partial-major, the weight decoded once a strip at a time, then the dense GEMM in
/// `K_ORDER`; same bits, `matmul4/decoded_forward.rs`); a given tile runs the fused kernel with
/// it (results never depend on the plan or the tile).
///
/// # Errors
/// [`Error::Invalid`] naming the problem when the state is not a non-empty 2-D weight, a buffer
/// does not match it, `x`'s last dim is not `K`, `x` is not a float tensor or its bytes do not
/// match its shape, the bias is not `[N]` in `x`'s dtype, a count exceeds `2^31 - 1`, or the
/// tile is invalid; any device error.
pub fn matmul_4bit(
    dev: &dyn Device,
    x: &HostTensor,
    packed: &[u8],
    state: &QuantState4,
    bias: Option<&HostTensor>,
    tile: Option<TileConfig>,
) -> Result<HostTensor> {
    run(
        dev,
        x,
        packed,
        state,
        bias,
        true,
        tile.map_or(Plan::Auto, Plan::Fused),
    )
}

/// `dX = dY @ dequant(W)` for `dY` of shape `[..., N]` and a weight `[N, K]`: the gradient of
/// [`matmul_4bit`] with respect to its input (the weight is frozen: no `dW`, as bitsandbytes'
/// `MatMul4Bit`). `dX` has shape `[..., K]` in `dY`'s dtype. With `tile = None` the op chooses:
/// the fused kernel with [`suggest_backward_tile_sizes`], or on an AVX2 CPU from
/// [`super::decoded::DECODE_FROM_ROWS`] rows on (AVX-512: from
/// [`super::decoded::DECODE_FROM_ROWS_AVX512`]) the decoded plan (the weight decoded once, a
/// strip at a time, then the dense GEMM; same bits, `matmul4/decoded.rs`); a given tile runs
/// the fused kernel with it.
///
/// # Errors
/// As [`matmul_4bit`], with `dY`'s last dim checked against `N`.
pub fn matmul_4bit_backward_input(
    dev: &dyn Device,
    dy: &HostTensor,
    packed: &[u8],
    state: &QuantState4,
    tile: Option<TileConfig>,
) -> Result<HostTensor> {
    run(
        dev,
        dy,
        packed,
        state,
        None,
        false,
        tile.map_or(Plan::Auto, Plan::Fused),
    )
}

/// A linear layer with a frozen 4-bit weight `[N, K]` (out_features x in_features) and an
/// optional bias `[N]`: bitsandbytes' `Linear4bit` with its `MatMul4Bit` autograd function.
#[derive(Clone, Debug, PartialEq)]
pub struct Linear4bit {
    /// Packed codes of the weight.
    pub packed: Vec<u8>,
    /// The weight's quant state (shape `[N, K]`).
    pub state: QuantState4,
    /// Optional bias `[N]`, any float dtype: [`Linear4bit::forward`] rounds it to the
    /// activation dtype (nearest even) when they differ, as bitsandbytes' `bias.to(x.dtype)`.
    pub bias: Option<HostTensor>,
}

impl Linear4bit {
    /// Quantizes a float weight `[N, K]` ([`crate::ops::quantize_4bit`]).
    ///
    /// # Errors
    /// As [`crate::ops::quantize_4bit`], plus a weight that is not 2-D.
    pub fn quantize(
        dev: &dyn Device,
        weight: &HostTensor,
        quant_type: crate::ops::QuantType,
        blocksize: usize,
        compress_statistics: bool,
        bias: Option<HostTensor>,
    ) -> Result<Linear4bit> {
        if weight.shape.len() != 2 {
            return Err(Error::Invalid(format!(
                "Linear4bit: the weight must be 2-D [N, K], got shape {:?}",
                weight.shape
            )));
        }
        if let Some(b) = &bias {
            let n = weight.shape[0];
            if b.shape != [n] || !b.dtype.is_float() || b.data.len() != n * b.dtype.size_bytes() {
                return Err(Error::Invalid(format!(
                    "Linear4bit: the bias must be a float tensor of shape [{n}] (out_features), got {} {:?} with {} bytes",
                    b.dtype,
                    b.shape,
                    b.data.len()
                )));
            }
        }
        let (packed, state) =
            crate::ops::quantize_4bit(dev, weight, quant_type, blocksize, compress_statistics)?;
        Ok(Linear4bit {
            packed,
            state,
            bias,
        })
    }

    /// `in_features` (K).
    pub fn in_features(&self) -> usize {
        self.state.shape.get(1).copied().unwrap_or(0)
    }

    /// `out_features` (N).
    pub fn out_features(&self) -> usize {
        self.state.shape.first().copied().unwrap_or(0)
    }

    /// `y = x @ dequant(W).T + bias` ([`matmul_4bit`]), the bias first rounded to `x`'s dtype
    /// (nearest even) when it has another float dtype, as bitsandbytes' `Linear4bit` does.
    ///
    /// # Errors
    /// As [`matmul_4bit`].
    pub fn forward(&self, dev: &dyn Device, x: &HostTensor) -> Result<HostTensor> {
        let cast;
        let bias = match &self.bias {
            Some(b) if b.dtype != x.dtype && b.dtype.is_float() && x.dtype.is_float() => {
                cast = HostTensor::from_f32_as(x.dtype, b.shape.clone(), &b.to_f32()?)?;
                Some(&cast)
            }
            other => other.as_ref(),
        };
        matmul_4bit(dev, x, &self.packed, &self.state, bias, None)
    }

    /// `dX = dY @ dequant(W)` ([`matmul_4bit_backward_input`]).
    ///
    /// # Errors
    /// As [`matmul_4bit_backward_input`].
    pub fn backward_input(&self, dev: &dyn Device, dy: &HostTensor) -> Result<HostTensor> {
        matmul_4bit_backward_input(dev, dy, &self.packed, &self.state, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear4bit_rounds_a_bias_of_another_dtype_to_the_activation_dtype() {
        let dev = qforge_runtime::InterpreterDevice;
        let (n, k) = (5, 32);
        let w: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let w = HostTensor::from_f32(vec![n, k], &w).expect("weight");
        // Biases that bf16 and f16 round (1 + 2^-10 is exact in f16, not in bf16).
        let bias: Vec<f32> = vec![1.0 + 2f32.powi(-10), -3.3, 0.1, 65504.0, 1e-8];
        let x: Vec<f32> = (0..2 * k).map(|i| (i as f32 * 0.11).cos()).collect();
        for (bias_dtype, x_dtype) in [
            (DType::F32, DType::BF16),
            (DType::F32, DType::F16),
            (DType::F16, DType::F32),
            (DType::BF16, DType::F16),
        ] {
            let b = HostTensor::from_f32_as(bias_dtype, vec![n], &bias).expect("bias");
            let layer = Linear4bit::quantize(
                &dev,
                &w,
                crate::ops::QuantType::Nf4,
                32,
                false,
                Some(b.clone()),
            )
            .expect("layer");
            let x = HostTensor::from_f32_as(x_dtype, vec![2, k], &x).expect("x");
            let got = layer.forward(&dev, &x).expect("forward");
            // The model: the bias rounded to x's dtype first, then the plain op.
            let rounded = HostTensor::from_f32_as(x_dtype, vec![n], &b.to_f32().expect("f32"))
                .expect("rounded");
            let want = matmul_4bit(&dev, &x, &layer.packed, &layer.state, Some(&rounded), None)
                .expect("matmul");
            assert_eq!(got, want, "bias {bias_dtype} with x {x_dtype}");
            // Not the same as ignoring the rounding: the unrounded f32 bias is not accepted.
            if bias_dtype != x_dtype {
                assert!(
                    matmul_4bit(&dev, &x, &layer.packed, &layer.state, Some(&b), None).is_err()
                );
            }
        }
    }

    #[test]
    fn tile_heuristic_follows_its_documented_rule() {
        let cpu = DeviceCaps::Cpu {
            threads: 2,
            lanes: 4,
        };
        let t = |m, n, caps| {
            let t = suggest_tile_sizes(m, n, 4096, caps);
            (t.tm, t.tn)
        };
        assert_eq!(t(1, 4096, cpu), (1, 4));
        assert_eq!(t(16, 4096, cpu), (8, 4));
        assert_eq!(t(3, 11008, cpu), (3, 4));
        // Few outputs: shrink (tn first) to give each of the 2 threads 4 work items.
        assert_eq!(t(16, 4, cpu), (8, 1));
        assert_eq!(t(1, 5, cpu), (1, 1));
        let wide = DeviceCaps::Cpu {
            threads: 2,
            lanes: 16,
        };
        let back = |m, k, caps| {
            let t = suggest_backward_tile_sizes(m, 4096, k, caps);
            (t.tm, t.tn)
        };
        assert_eq!(back(1, 4096, wide), (1, 32));
        assert_eq!(back(16, 4096, wide), (8, 32));
        assert_eq!(back(7, 4096, wide), (4, 32), "a power of two");
        assert_eq!(back(3, 4096, wide), (2, 32));
        assert_eq!(
            back(2, 64, wide),
            (1, 16),
            "2 x 64 outputs: 2 work items at 2x32, 4 at 1x32, 8 at 1x16"
        );
        assert_eq!(
            back(1, 40, wide),
            (1, 4),
            "40 columns: 10 work items at 1x4, 5 at 1x8"
        );
        assert_eq!(back(1, 4096, cpu), (1, 4));
        assert_eq!(back(16, 4096, cpu), (8, 4));
        assert_eq!(t(1, 4096, wide), (1, 4));
        assert_eq!(t(16, 4096, wide), (4, 4));
        assert_eq!(t(63, 4096, wide), (4, 4));
        assert_eq!(t(64, 4096, wide), (5, 4));
        assert_eq!(t(2048, 11008, wide), (5, 4));
        assert_eq!(t(3, 11008, wide), (3, 4));
        let avx2 = DeviceCaps::Cpu {
            threads: 2,
            lanes: 8,
        };
        assert_eq!(t(1, 4096, avx2), (1, 2));
        assert_eq!(t(16, 4096, avx2), (4, 2));
        assert_eq!(t(16, 4, avx2), (4, 2));
        assert_eq!(t(4, 4, avx2), (2, 1), "4 x 4 outputs: 8 work items at 2x1");
        assert_eq!(t(64, 4096, avx2), (8, 2));
        assert_eq!(back(16, 4096, avx2), (8, 16));
        assert_eq!(back(3, 4096, avx2), (2, 16), "a power of two");
        let gpu = DeviceCaps::Gpu {
            parallel_threads: 65536,
        };
        assert_eq!(t(16, 1 << 20, gpu), (4, 1));
        assert_eq!(
            t(16, 4096, gpu),
            (2, 1),
            "16 x 4096 outputs fill half of 64 Ki threads at 2x1"
        );
        for (m, n) in [(0, 0), (usize::MAX, 7), (33, usize::MAX)] {
            for caps in [cpu, gpu] {
                let tile = suggest_tile_sizes(m, n, 1, caps);
                assert!(tile.check().is_ok(), "{m} {n} {caps:?}: {tile:?}");
            }
        }
    }
}
