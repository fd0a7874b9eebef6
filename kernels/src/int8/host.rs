//! LLM.int8() host ops (Dettmers et al. 2022, arXiv 2208.07339) with bitsandbytes' functional
//! API: `int8_vectorwise_quant`, `int8_vectorwise_dequant`, `int8_linear_matmul`,
//! `int8_mm_dequant`, `int8_mixed_scaled_mm` and its input gradient, plus the per-row int8
//! weight format (`quantize_rowwise_int8` / `dequantize_rowwise_int8`) and a [`Linear8bitLt`]
//! layer built from them. Exact semantics: [`crate::int8`] and
//! [`crate::int8::matmul`]; each is bit-exact with bitsandbytes 0.50.2 (CPU) on the
//! golden vectors (`tests/int8.rs`).
//!
//! Matrices: a tensor of shape `[..., cols]` is `rows = numel / cols` rows. Codes are `i8`
//! [`HostTensor`]s, integer products `i32` ones, statistics plain `f32` slices (one per row).

use crate::int8::matmul::{
    self as mm, Int8LinearMatmulArgs, Int8MixedScaledMmArgs, Int8MixedScaledMmDxArgs,
    Int8MmDequantArgs,
};
use crate::int8::{
    self, Int8OutlierColsArgs, Int8Spec, Int8VectorwiseDequantArgs, Int8VectorwiseQuantArgs,
    QuantizeRowwiseInt8Args,
};
use crate::TileConfig;
use qforge_ir::dsl::{FloatIn, FloatOut};
use qforge_ir::DType;

use crate::matmul4::host::shrink;
use crate::ops::{cached_typed, count_u32, suggest_tile_sizes, DeviceCaps};
use qforge_runtime::HostTensor;
use qforge_runtime::{launch_typed, Device};
use qforge_runtime::{Error, Result};

/// What [`int8_vectorwise_quant`] returns (bitsandbytes' `(CA, row_stats, outlier_cols)`).
#[derive(Clone, Debug, PartialEq)]
pub struct Int8Quantized {
    /// `i8` codes with the input's shape; outliers and (with more than one row) whole outlier
    /// columns are 0.
    pub codes: HostTensor,
    /// The absmax of each row over its non-outlier elements.
    pub row_stats: Vec<f32>,
    /// The increasing indices of the columns holding an outlier; `None` when the threshold is 0
    /// (as bitsandbytes), possibly empty otherwise.
    pub outlier_cols: Option<Vec<u32>>,
}

/// `(rows, cols)` of a non-empty `[..., cols]` tensor of an allowed dtype whose bytes match
/// its shape.
fn matrix(op: &str, what: &str, t: &HostTensor, ok: &[DType]) -> Result<(u32, u32)> {
    if !ok.contains(&t.dtype) {
        let names: Vec<&str> = ok.iter().map(|d| d.name()).collect();
        let allowed = match names.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
            _ => names.join(""),
        };
        return Err(Error::Invalid(format!(
            "{op}: {what} must be {allowed}, got {}",
            t.dtype
        )));
    }
    let numel = t
        .shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| Error::Invalid(format!("{op}: {what} shape {:?} overflows", t.shape)))?;
    let cols = t.shape.last().copied().unwrap_or(0);
    if numel == 0 || cols == 0 {
        return Err(Error::Invalid(format!(
            "{op}: {what} is empty or 0-D (shape {:?}); it must be [..., cols] with cols >= 1",
            t.shape
        )));
    }
    if t.data.len() != numel * t.dtype.size_bytes() {
        return Err(Error::Invalid(format!(
            "{op}: {what} ({}, shape {:?}) needs {} bytes, got {}",
            t.dtype,
            t.shape,
            numel * t.dtype.size_bytes(),
            t.data.len()
        )));
    }
    count_u32(op, what, numel)?;
    Ok(((numel / cols) as u32, cols as u32))
}

const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// A 2-D `[rows, cols]` `i8` weight (`CB`).
fn weight(op: &str, cb: &HostTensor) -> Result<(u32, u32)> {
    if cb.shape.len() != 2 {
        return Err(Error::Invalid(format!(
            "{op}: the int8 weight must be 2-D [N, K], got shape {:?}",
            cb.shape
        )));
    }
    matrix(op, "the int8 weight", cb, &[DType::I8])
}

/// The longest `K` whose `i32` dot products of `i8` codes cannot overflow:
/// `K * 128 * 128 <= i32::MAX`.
pub const MAX_INT8_K: u32 = (i32::MAX as u32) / (128 * 128);

/// Refuses a `K` whose integer dot products could overflow `i32`.
fn check_int_k(op: &str, k: u32) -> Result<()> {
    if k > MAX_INT8_K {
        return Err(Error::Invalid(format!(
            "{op}: K = {k} is longer than {MAX_INT8_K}: an i32 sum of K products of int8 codes \
             could overflow; split K"
        )));
    }
    Ok(())
}

/// Checks that a statistics slice has one value per row.
fn stats_len(op: &str, what: &str, got: usize, want: u32, of: &str) -> Result<()> {
    if got == want as usize {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "{op}: {what} has {got} values, {of} has {want} rows"
        )))
    }
}

/// The bias as `dtype` bytes: its own bytes when it has `dtype`, else converted when every
/// value is exactly representable (so the sum is the one bitsandbytes computes in `f32`).
fn bias_bytes(op: &str, bias: &HostTensor, n: u32, dtype: DType) -> Result<Vec<u8>> {
    if bias.shape != [n as usize] || !bias.dtype.is_float() {
        return Err(Error::Invalid(format!(
            "{op}: the bias must be a float tensor of shape [{n}], got {} {:?}",
            bias.dtype, bias.shape
        )));
    }
    matrix(op, "the bias", bias, &FLOATS)?;
    if bias.dtype == dtype {
        return Ok(bias.data.clone());
    }
    let values = bias.to_f32()?;
    let converted = HostTensor::from_f32_as(dtype, vec![n as usize], &values)?;
    let back = converted.to_f32()?;
    if values
        .iter()
        .zip(&back)
        .any(|(a, b)| a.to_bits() != b.to_bits() && !(a.is_nan() && b.is_nan()))
    {
        return Err(Error::Invalid(format!(
            "{op}: a {} bias is added to {dtype} outputs and is not exactly representable in \
             {dtype}; convert it first",
            bias.dtype
        )));
    }
    Ok(converted.data)
}

/// `i8` codes as a tensor (each code stored as its byte).
fn i8_tensor(shape: Vec<usize>, codes: Vec<i8>) -> Result<HostTensor> {
    HostTensor::new(
        DType::I8,
        shape,
        codes.into_iter().map(|c| c as u8).collect(),
    )
}

/// The bytes of an `i8` tensor as the `i8` codes a kernel reads.
fn codes_of(t: &HostTensor) -> Vec<i8> {
    t.data.iter().map(|b| *b as i8).collect()
}

/// A float tensor's bytes as a kernel's float input.
fn float_in(t: &HostTensor) -> FloatIn<'_> {
    FloatIn {
        dtype: t.dtype,
        bytes: &t.data,
    }
}

/// A float output of `dtype`.
fn float_out(dtype: DType, bytes: &mut [u8]) -> FloatOut<'_> {
    FloatOut { dtype, bytes }
}

/// Quantizes a float tensor `[..., cols]` row by row to `i8` with fp outlier columns, like
/// bitsandbytes' `int8_vectorwise_quant(A, threshold)`: outliers are `|x| >= threshold` (the
/// threshold rounded to the input dtype; only when `threshold > 0`), left out of the row absmax
/// and coded 0, outlier columns zeroed; `code = round_half_even(x * ((1 / absmax) * 127))`; a
/// zero, NaN or inf row gives all-zero codes. Runs `int8_outlier_cols` (when `threshold > 0`)
/// then `int8_vectorwise_quant`.
///
/// # Errors
/// [`Error::Invalid`] for a non-float or empty input, bytes that do not match its shape, more
/// than `2^31 - 1` elements, or a threshold that is negative, NaN or infinite; any device error.
pub fn int8_vectorwise_quant(
    dev: &dyn Device,
    a: &HostTensor,
    threshold: f32,
) -> Result<Int8Quantized> {
    const OP: &str = "int8_vectorwise_quant";
    let (rows, cols) = matrix(OP, "the input", a, &FLOATS)?;
    if !threshold.is_finite() || threshold < 0.0 {
        return Err(Error::Invalid(format!(
            "{OP}: threshold {threshold} must be finite and >= 0 (0 disables outliers)"
        )));
    }
    let dtype = a.dtype;
    let mut flags = vec![0u32; cols as usize];
    if threshold > 0.0 {
        let spec = Int8Spec::OutlierCols { dtype };
        let kernel = cached_typed(&spec.name(), || int8::int8_outlier_cols(dtype))?;
        launch_typed(
            dev,
            &kernel,
            &mut Int8OutlierColsArgs {
                rows,
                cols,
                threshold,
                a: float_in(a),
                outlier_flags: &mut flags,
            },
        )?;
    }
    let spec = Int8Spec::VectorwiseQuant { dtype };
    let kernel = cached_typed(&spec.name(), || int8::int8_vectorwise_quant(dtype))?;
    let mut codes = vec![0i8; (rows * cols) as usize];
    let mut row_stats = vec![0f32; rows as usize];
    launch_typed(
        dev,
        &kernel,
        &mut Int8VectorwiseQuantArgs {
            rows,
            cols,
            threshold,
            a: float_in(a),
            outlier_flags: &flags,
            ca: &mut codes,
            row_stats: &mut row_stats,
        },
    )?;
    let outlier_cols = (threshold > 0.0).then(|| {
        flags
            .iter()
            .enumerate()
            .filter(|(_, f)| **f != 0)
            .map(|(c, _)| c as u32)
            .collect()
    });
    Ok(Int8Quantized {
        codes: i8_tensor(a.shape.clone(), codes)?,
        row_stats,
        outlier_cols,
    })
}

/// Dequantizes `i8` codes `[..., cols]` with one statistic per row, like bitsandbytes'
/// `int8_vectorwise_dequant(A, stats)`: `(code * stats[r]) * 7.874015718698502e-3` in `f32`,
/// rounded once to `dtype` (bitsandbytes returns `f32`).
///
/// # Errors
/// [`Error::Invalid`] for codes that are not a non-empty `i8` tensor matching their shape,
/// `stats` not holding one value per row, or a non-float `dtype`; any device error.
pub fn int8_vectorwise_dequant(
    dev: &dyn Device,
    codes: &HostTensor,
    stats: &[f32],
    dtype: DType,
) -> Result<HostTensor> {
    const OP: &str = "int8_vectorwise_dequant";
    let (rows, cols) = matrix(OP, "the codes", codes, &[DType::I8])?;
    stats_len(OP, "stats", stats.len(), rows, "the codes")?;
    if !dtype.is_float() {
        return Err(Error::Invalid(format!(
            "{OP}: the output dtype must be f32, f16 or bf16, got {dtype}"
        )));
    }
    let spec = Int8Spec::VectorwiseDequant { dtype };
    let kernel = cached_typed(&spec.name(), || int8::int8_vectorwise_dequant(dtype))?;
    let mut out = vec![0u8; (rows * cols) as usize * dtype.size_bytes()];
    launch_typed(
        dev,
        &kernel,
        &mut Int8VectorwiseDequantArgs {
            rows,
            cols,
            n: rows * cols,
            ca: &codes_of(codes),
            stats,
            out: float_out(dtype, &mut out),
        },
    )?;
    HostTensor::new(dtype, codes.shape.clone(), out)
}

/// Quantizes a float weight `[..., cols]` to the uniform per-row symmetric int8 format: the
/// codes and row absmax of [`int8_vectorwise_quant`] with threshold 0 (bitsandbytes'
/// `Linear8bitLt` `CB`/`SCB`), in one launch. Returns `(codes, absmax)`.
///
/// # Errors
/// As [`int8_vectorwise_quant`].
pub fn quantize_rowwise_int8(dev: &dyn Device, w: &HostTensor) -> Result<(HostTensor, Vec<f32>)> {
    const OP: &str = "quantize_rowwise_int8";
    let (rows, cols) = matrix(OP, "the input", w, &FLOATS)?;
    let dtype = w.dtype;
    let spec = Int8Spec::QuantizeRowwise { dtype };
    let kernel = cached_typed(&spec.name(), || int8::quantize_rowwise_int8(dtype))?;
    let mut codes = vec![0i8; (rows * cols) as usize];
    let mut absmax = vec![0f32; rows as usize];
    launch_typed(
        dev,
        &kernel,
        &mut QuantizeRowwiseInt8Args {
            rows,
            cols,
            a: float_in(w),
            q: &mut codes,
            absmax: &mut absmax,
        },
    )?;
    Ok((i8_tensor(w.shape.clone(), codes)?, absmax))
}

/// Dequantizes the per-row int8 format to `dtype`: [`int8_vectorwise_dequant`].
///
/// # Errors
/// As [`int8_vectorwise_dequant`].
pub fn dequantize_rowwise_int8(
    dev: &dyn Device,
    codes: &HostTensor,
    absmax: &[f32],
    dtype: DType,
) -> Result<HostTensor> {
    int8_vectorwise_dequant(dev, codes, absmax, dtype)
}

/// A tile for [`int8_linear_matmul`] (`M x N` outputs, reduction `K`) on a device. Tiles never
/// change results, only speed.
///
/// * CPU: the integer loop keeps one `i32` per output and no vector partials, so 16 outputs fit
///   the registers: `tm = min(M, 4)`, `tn = min(N, 16 / tm)`, shrunk (`tn` first) while there
///   would be fewer than 4 work items per thread. At `M = 16, K = N = 4096` on the 2-core
///   development machine a 4x4 tile runs in about a third of the time of a
///   4x1.
/// * GPU: [`suggest_tile_sizes`].
pub fn suggest_int8_tile_sizes(m: usize, n: usize, k: usize, caps: DeviceCaps) -> TileConfig {
    let DeviceCaps::Cpu { threads, .. } = caps else {
        return suggest_tile_sizes(m, n, k, caps);
    };
    let (m, n) = (m.max(1), n.max(1));
    let tm = m.min(4);
    let want = 4usize.saturating_mul(threads.max(1) as usize);
    shrink((m, n), (tm, n.min(16 / tm)), want, false)
}

/// The shapes and tile of one tiled int8 matmul launch.
fn tiled(tile: TileConfig, m: u32, outs: u32) -> Result<(TileConfig, u32, u32)> {
    let n_tiles = outs.div_ceil(tile.tn);
    let items = m.div_ceil(tile.tm) as usize * n_tiles as usize;
    let n_items = count_u32("int8 matmul", "the work items", items)?;
    Ok((tile, n_items, n_tiles))
}

/// The shape `[..., last]` of an output whose input had shape `[..., _]`.
fn with_last(shape: &[usize], last: u32) -> Vec<usize> {
    let mut s = shape.to_vec();
    if let Some(l) = s.last_mut() {
        *l = last as usize;
    }
    s
}

/// `C = A @ B.T` exactly, for `i8` `A [..., K]` and `B [N, K]`, giving `i32` `C [..., N]`
/// (bitsandbytes' `int8_linear_matmul`; its CPU path computes in `f32`, exact only for
/// `K <= 1040`, this one for `K < 2^17`).
///
/// # Errors
/// [`Error::Invalid`] for operands that are not non-empty `i8` tensors matching their shapes,
/// `B` not 2-D, different `K`, or more than `2^31 - 1` elements; any device error.
pub fn int8_linear_matmul(dev: &dyn Device, a: &HostTensor, b: &HostTensor) -> Result<HostTensor> {
    const OP: &str = "int8_linear_matmul";
    let (m, k) = matrix(OP, "A", a, &[DType::I8])?;
    let (n, kb) = weight(OP, b)?;
    if k != kb {
        return Err(Error::Invalid(format!(
            "{OP}: A has shape {:?} and B has shape {:?}; their last dims (K) differ",
            a.shape, b.shape
        )));
    }
    check_int_k(OP, k)?;
    count_u32(OP, "the output", m as usize * n as usize)?;
    let tile = suggest_int8_tile_sizes(m as usize, n as usize, k as usize, DeviceCaps::of(dev));
    let (tile, n_items, n_tiles) = tiled(tile, m, n)?;
    let spec = Int8Spec::LinearMatmul { tile };
    let kernel = cached_typed(&spec.name(), || mm::int8_linear_matmul(tile))?;
    let mut c = vec![0i32; m as usize * n as usize];
    launch_typed(
        dev,
        &kernel,
        &mut Int8LinearMatmulArgs {
            m,
            n,
            k,
            n_items,
            n_tiles,
            a: &codes_of(a),
            b: &codes_of(b),
            c: &mut c,
        },
    )?;
    let bytes = c.iter().flat_map(|v| v.to_le_bytes()).collect();
    HostTensor::new(DType::I32, with_last(&a.shape, n), bytes)
}

/// Dequantizes an `i32` product `C [..., N]` like bitsandbytes' `int8_mm_dequant(A, row_stats,
/// col_stats, dtype, bias)`: `(f32(C) * (row_stats[i] * col_stats[j])) * 6.200124e-05` in
/// `f32`, `+ bias[j]` in `f32`, rounded once to `dtype` (bitsandbytes' default is `f16`). A bias
/// of another dtype is accepted when its values are exact in `dtype`.
///
/// # Errors
/// [`Error::Invalid`] for `C` not a non-empty `i32` tensor matching its shape, statistics of
/// the wrong length, a non-float `dtype`, or a bias that is not a float `[N]` tensor exactly
/// representable in `dtype`; any device error.
pub fn int8_mm_dequant(
    dev: &dyn Device,
    c: &HostTensor,
    row_stats: &[f32],
    col_stats: &[f32],
    bias: Option<&HostTensor>,
    dtype: DType,
) -> Result<HostTensor> {
    const OP: &str = "int8_mm_dequant";
    let (m, n) = matrix(OP, "C", c, &[DType::I32])?;
    if !dtype.is_float() {
        return Err(Error::Invalid(format!(
            "{OP}: the output dtype must be f32, f16 or bf16, got {dtype}"
        )));
    }
    stats_len(OP, "row_stats", row_stats.len(), m, "C")?;
    if col_stats.len() != n as usize {
        return Err(Error::Invalid(format!(
            "{OP}: col_stats has {} values, C has {n} columns",
            col_stats.len()
        )));
    }
    let bias = bias.map(|b| bias_bytes(OP, b, n, dtype)).transpose()?;
    let with_bias = bias.is_some();
    let spec = Int8Spec::MmDequant {
        dtype,
        bias: with_bias,
    };
    let kernel = cached_typed(&spec.name(), || mm::int8_mm_dequant(dtype, with_bias))?;
    let products: Vec<i32> = c
        .data
        .chunks_exact(4)
        .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let mut out = vec![0u8; (m * n) as usize * dtype.size_bytes()];
    launch_typed(
        dev,
        &kernel,
        &mut Int8MmDequantArgs {
            m,
            n,
            len: m * n,
            c: &products,
            row_stats,
            col_stats,
            bias: bias.as_deref().map(|bytes| FloatIn { dtype, bytes }),
            out: float_out(dtype, &mut out),
        },
    )?;
    HostTensor::new(dtype, c.shape.clone(), out)
}

/// The LLM.int8() mixed-precision forward, like bitsandbytes'
/// `int8_mixed_scaled_mm(A, CA, CB, SCA, SCB, outlier_cols, bias)`: `x [..., K]` (f32, f16 or
/// bf16) with its codes `ca` and row statistics `sca` from [`int8_vectorwise_quant`], the
/// weight `cb [N, K]` / `scb` (e.g. from [`quantize_rowwise_int8`]); returns `y [..., N]` in
/// `x`'s dtype: `round(round(int8_mm_dequant(ca @ cb.T) + bias) + x[:, cols] @
/// dequant(cb[:, cols]).T)`, the fp part summed in `f32` in the canonical strided order (exact
/// composition: [`crate::int8::matmul`]). The columns are used in the given order.
///
/// # Errors
/// [`Error::Invalid`] for a non-float or empty `x`, `ca` not an `i8` tensor of `x`'s shape,
/// `cb` not a 2-D `i8` `[N, K]`, statistics of the wrong length, an outlier column `>= K`, a
/// bias that is not `[N]` and exact in `x`'s dtype, or more than `2^31 - 1` elements; any device
/// error.
#[allow(clippy::too_many_arguments)] // bitsandbytes' signature
pub fn int8_mixed_scaled_mm(
    dev: &dyn Device,
    x: &HostTensor,
    ca: &HostTensor,
    cb: &HostTensor,
    sca: &[f32],
    scb: &[f32],
    outlier_cols: &[u32],
    bias: Option<&HostTensor>,
) -> Result<HostTensor> {
    const OP: &str = "int8_mixed_scaled_mm";
    let (m, k) = matrix(OP, "the input x", x, &FLOATS)?;
    matrix(OP, "CA", ca, &[DType::I8])?;
    if ca.shape != x.shape {
        return Err(Error::Invalid(format!(
            "{OP}: CA has shape {:?}, x has shape {:?}; they must match",
            ca.shape, x.shape
        )));
    }
    let (n, kb) = weight(OP, cb)?;
    if kb != k {
        return Err(Error::Invalid(format!(
            "{OP}: x has shape {:?}; its last dim must be K = {kb} of the [{n}, {kb}] weight",
            x.shape
        )));
    }
    stats_len(OP, "SCA", sca.len(), m, "x")?;
    stats_len(OP, "SCB", scb.len(), n, "the weight")?;
    check_int_k(OP, k)?;
    if let Some(c) = outlier_cols.iter().find(|c| **c >= k) {
        return Err(Error::Invalid(format!(
            "{OP}: outlier column {c} is out of range for K = {k}"
        )));
    }
    if let Some(w) = outlier_cols.windows(2).find(|w| w[0] >= w[1]) {
        return Err(Error::Invalid(format!(
            "{OP}: outlier columns must be strictly increasing (as int8_vectorwise_quant returns \
             them), got {} then {}",
            w[0], w[1]
        )));
    }
    let n_out = count_u32(OP, "outlier_cols", outlier_cols.len())?;
    count_u32(OP, "the output", m as usize * n as usize)?;
    let dtype = x.dtype;
    let bias = bias.map(|b| bias_bytes(OP, b, n, dtype)).transpose()?;
    let with_bias = bias.is_some();
    let tile = suggest_tile_sizes(m as usize, n as usize, k as usize, DeviceCaps::of(dev));
    let (tile, n_items, n_tiles) = tiled(tile, m, n)?;
    let spec = Int8Spec::MixedScaledMm {
        dtype,
        bias: with_bias,
        tile,
    };
    let kernel = cached_typed(&spec.name(), || {
        mm::int8_mixed_scaled_mm(dtype, with_bias, tile)
    })?;
    let mut y = vec![0u8; (m * n) as usize * dtype.size_bytes()];
    launch_typed(
        dev,
        &kernel,
        &mut Int8MixedScaledMmArgs {
            m,
            n,
            k,
            n_items,
            n_tiles,
            n_outliers: n_out,
            x: float_in(x),
            ca: &codes_of(ca),
            cb: &codes_of(cb),
            sca,
            scb,
            outlier_cols,
            bias: bias.as_deref().map(|bytes| FloatIn { dtype, bytes }),
            y: float_out(dtype, &mut y),
        },
    )?;
    HostTensor::new(dtype, with_last(&x.shape, n), y)
}

/// The input gradient of [`int8_mixed_scaled_mm`] (bitsandbytes' `MatMul8bitLt.backward`):
/// `dX = dY @ dequant(cb)` for `dY [..., N]`, with `dequant(cb)[n, k] = round(cb[n, k] *
/// (scb[n] * (1/127)))` in `dY`'s dtype and the sum in `f32` in the canonical strided order,
/// rounded once. Returns `dX [..., K]` in `dY`'s dtype. The weight is frozen (no `dW`).
///
/// # Errors
/// [`Error::Invalid`] for a non-float or empty `dY`, `cb` not a 2-D `i8` `[N, K]`, `dY`'s last
/// dim not `N`, `scb` not of length `N`, or more than `2^31 - 1` elements; any device error.
pub fn int8_mixed_scaled_mm_backward_input(
    dev: &dyn Device,
    dy: &HostTensor,
    cb: &HostTensor,
    scb: &[f32],
) -> Result<HostTensor> {
    const OP: &str = "int8_mixed_scaled_mm_backward_input";
    let (m, n) = matrix(OP, "the gradient dY", dy, &FLOATS)?;
    let (nb, k) = weight(OP, cb)?;
    if nb != n {
        return Err(Error::Invalid(format!(
            "{OP}: dY has shape {:?}; its last dim must be N = {nb} of the [{nb}, {k}] weight",
            dy.shape
        )));
    }
    stats_len(OP, "SCB", scb.len(), n, "the weight")?;
    count_u32(OP, "the output", m as usize * k as usize)?;
    let dtype = dy.dtype;
    let tile = suggest_tile_sizes(m as usize, k as usize, n as usize, DeviceCaps::of(dev));
    let (tile, n_items, n_tiles) = tiled(tile, m, k)?;
    let spec = Int8Spec::MixedScaledMmDx { dtype, tile };
    let kernel = cached_typed(&spec.name(), || mm::int8_mixed_scaled_mm_dx(dtype, tile))?;
    let mut dx = vec![0u8; (m * k) as usize * dtype.size_bytes()];
    launch_typed(
        dev,
        &kernel,
        &mut Int8MixedScaledMmDxArgs {
            m,
            n,
            k,
            n_items,
            n_tiles,
            dy: float_in(dy),
            cb: &codes_of(cb),
            scb,
            dx: float_out(dtype, &mut dx),
        },
    )?;
    HostTensor::new(dtype, with_last(&dy.shape, k), dx)
}

/// An LLM.int8() linear layer (bitsandbytes' `Linear8bitLt` for inference with a frozen
/// weight): the weight `[N, K]` in the per-row int8 format, an optional bias `[N]` and the
/// outlier threshold (bitsandbytes' default [`crate::int8::DEFAULT_THRESHOLD`] = 6.0; 0 disables the
/// fp outlier part).
#[derive(Clone, Debug, PartialEq)]
pub struct Linear8bitLt {
    /// `CB`: `i8 [N, K]`.
    pub cb: HostTensor,
    /// `SCB`: the absmax of each weight row.
    pub scb: Vec<f32>,
    /// Optional bias `[N]`.
    pub bias: Option<HostTensor>,
    /// Outlier threshold on the activations.
    pub threshold: f32,
}

impl Linear8bitLt {
    /// Quantizes a float weight `[N, K]` ([`quantize_rowwise_int8`]).
    ///
    /// # Errors
    /// As [`quantize_rowwise_int8`], plus a weight that is not 2-D or a threshold that is
    /// negative or not finite.
    pub fn quantize(
        dev: &dyn Device,
        weight: &HostTensor,
        bias: Option<HostTensor>,
        threshold: f32,
    ) -> Result<Linear8bitLt> {
        if weight.shape.len() != 2 {
            return Err(Error::Invalid(format!(
                "Linear8bitLt: the weight must be 2-D [N, K], got shape {:?}",
                weight.shape
            )));
        }
        if !threshold.is_finite() || threshold < 0.0 {
            return Err(Error::Invalid(format!(
                "Linear8bitLt: threshold {threshold} must be finite and >= 0"
            )));
        }
        let (cb, scb) = quantize_rowwise_int8(dev, weight)?;
        Ok(Linear8bitLt {
            cb,
            scb,
            bias,
            threshold,
        })
    }

    /// `y = x @ W.T + bias` for `x [..., K]`: [`int8_vectorwise_quant`] of `x` with the
    /// threshold, then [`int8_mixed_scaled_mm`] with its outlier columns.
    ///
    /// # Errors
    /// As the two ops.
    pub fn forward(&self, dev: &dyn Device, x: &HostTensor) -> Result<HostTensor> {
        let q = int8_vectorwise_quant(dev, x, self.threshold)?;
        let cols = q.outlier_cols.unwrap_or_default();
        int8_mixed_scaled_mm(
            dev,
            x,
            &q.codes,
            &self.cb,
            &q.row_stats,
            &self.scb,
            &cols,
            self.bias.as_ref(),
        )
    }

    /// `dX = dY @ dequant(W)` ([`int8_mixed_scaled_mm_backward_input`]).
    ///
    /// # Errors
    /// As [`int8_mixed_scaled_mm_backward_input`].
    pub fn backward_input(&self, dev: &dyn Device, dy: &HostTensor) -> Result<HostTensor> {
        int8_mixed_scaled_mm_backward_input(dev, dy, &self.cb, &self.scb)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::*;

    #[test]
    fn ops_int8_tiles_fill_the_registers_and_keep_threads_busy() {
        let cpu = DeviceCaps::Cpu {
            threads: 2,
            lanes: 4,
        };
        let t = |m, n| {
            let t = suggest_int8_tile_sizes(m, n, 4096, cpu);
            (t.tm, t.tn)
        };
        assert_eq!(t(16, 4096), (4, 4));
        assert_eq!(t(1, 4096), (1, 16));
        assert_eq!(t(2, 3), (1, 1), "shrinks to give 8 work items where it can");
        assert_eq!(t(16, 1), (2, 1));
        let gpu = DeviceCaps::Gpu {
            parallel_threads: 65536,
        };
        assert_eq!(
            suggest_int8_tile_sizes(16, 4096, 4096, gpu),
            suggest_tile_sizes(16, 4096, 4096, gpu)
        );
    }
}
