//! Dense matrix products with a pinned reduction order: the forward and both backward products
//! of a full-precision linear layer (the bottleneck adapters' `down` and `up` projections).
//!
//! `C[i, j] = sum_l A[i, l] * B[j, l] (+ bias[j])` for `C: [M, N]`, with the logical operands
//! `A: [M, L]` and `B: [N, L]`, each stored either as written (`RowMajor`: `A[i * L + l]`) or
//! transposed (`Transposed`: stored `[L, M]`, `A[l * M + i]`). For a layer `y = x @ W.T + b`
//! with `x: [M, K]`, `W: [N, K]`:
//! * forward `y = x @ W.T + b`: `A = x` (row-major), `B = W` (row-major), `L = K`;
//! * input gradient `dX = dY @ W`: `A = dY` (row-major `[M, N]`), `B = W` stored `[N, K]` =
//!   `[L, K]`, i.e. `Transposed`, `L = N`;
//! * weight gradient `dW = dY.T @ x`: `C = dW: [N, K]`, `A = dY` stored `[M, N]` = `[L, N]`
//!   (`Transposed`), `B = x` stored `[M, K]` = `[L, K]` (`Transposed`), `L = M`;
//! * bias gradient `db = sum_m dY[m, :]`: the same with `A` a ones vector `[1, M]` (every
//!   product `1 * dY` is exact, so this is the pinned-order sum of the column).
//!
//! Semantics, per output: operands widened exactly to `f32`; the sum over `l` is one
//! [`qforge_ir::Stmt::Accumulate`] in [`GEMM_ORDER`] (`sequential`: `p = fma(A[i, l], B[j, l], p)`
//! for `l` in increasing order from `p = -0.0`; with [`Gemm::partials`] `W > 1`, `strided W` over
//! operands stored partial-major), so tiling never changes a bit; with a bias, one `f32`
//! add of `f32(bias[j])`; with a residual, then one `f32` add of `f32(R[i, j])`; one rounding
//! (nearest even) to the output dtype. For `f32` this is PyTorch's `h + (a @ W.T + b)`: each
//! add rounds once, in that order.
//!
//! Parameters (scalars first, then buffers):
//! `gemm_{a}{b}_{dtype}[_bias][_res][_strided{W}]_t{TM}x{TN}` with `{a}` = `n` (row-major) or
//! `t` (transposed), `{b}` the same or `p` ([`Layout::Panels`]), `W` the partials when above 1:
//! `(m, n, l, n_items, m_tiles, n_tiles, group: u32, [panel_len: u32,] a: dtype[m*l] read,
//! b: dtype[n*l] read (panels: `[n_tiles, panel_len]`), [bias: dtype[n] read,] [r: dtype[m, n]
//! read,] c: dtype[m, n] write)`, grid `n_items = m_tiles * n_tiles` with `m_tiles =
//! ceil(m/TM)`, `n_tiles = ceil(n/TN)`, `group` the row tiles taken together (clamped to `1..=m_tiles`;
//! the order of the work items, `tile::work_tile_grouped`; it never changes a bit),
//! `panel_len = l * TN`;
//! rows of a tile past the end read the last valid row and store nothing.
//!
//! The kernel is written in the kernel language ([`gemm_kernel`]; its arguments are
//! [`GemmKernelArgs`]). The tile's one `accumulate` is a builder fragment in the helper calling
//! convention (`tile::accumulate_tile`): an `#[accumulate]` loop names a fixed list of
//! accumulators, a tile has a build-time number (`TM * TN`) of them.

mod catalog;
pub(crate) mod host;
pub(crate) mod scratch;
#[cfg(test)]
mod tests;
pub(crate) mod transpose;

use qforge_macros::kernel;

use crate::check_float_dtype;
use crate::funcs::vars;
use crate::matmul4::TileConfig;
use crate::tile::{
    accumulate_tile, load_rows, store_sums, work_tile_grouped, Factors, Row, TileFactors,
};
use qforge_ir::dsl::{self, Buf, Float, In, Out, TypedKernel, Val};
use qforge_ir::KernelBuilder;
use qforge_ir::Result;
use qforge_ir::{DType, Kernel};

/// The order of the sum over `l`: one partial per output, `fma` in increasing `l`
/// (`docs/semantics.md`). A CPU computes it with the tile's columns as vector lanes, one
/// register of sums per row and group of columns, each element of `A` broadcast to them (the
/// loop of BLAS-style micro-kernels), and a GPU thread with one running sum. It replaced
/// [`crate::DOT_ORDER`]'s 8 partials, whose column-lanes loop made one pass over `B` per partial
/// and added the partials by a tree: on the AVX-512 development VM the adapter's six products
/// at `d = 4096`, `r = 64`, `M = 512` take 10.7-10.9 against 12.5-12.7 ms (`docs/adapters.md`).
pub const GEMM_ORDER: qforge_ir::ReduceOrder = qforge_ir::ReduceOrder::Sequential;

/// How a logical `[rows, L]` operand is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Layout {
    /// Stored `[rows, L]`: element `(r, l)` at `r * L + l`.
    RowMajor,
    /// Stored `[L, rows]`: element `(r, l)` at `l * rows + r`.
    Transposed,
    /// Stored in panels of `P` rows, `P` the tile's `TN` (`B` only): `[ceil(rows / P), L, P]`,
    /// element `(r, l)` at `((r / P) * L + l) * P + r % P`, the rows past the end zero. A tile's
    /// columns are then `P` consecutive elements at each `l` and its whole panel one contiguous
    /// run: the CPU plan's `B` ([`host::gemm`] packs it), where a transposed `B` of `N` columns
    /// put the tile's consecutive `l` at `4 N` bytes from each other (at `N = 4096`, one page
    /// and one L1 set per element of `L`: on the AVX-512 development VM the product at
    /// `M = 512`, `K = N = 4096` ran at 22-35 GFLOP/s, against 112-132 on panels).
    Panels,
}

impl Layout {
    /// `n` or `t` (the kernel-name letter).
    pub const fn letter(self) -> char {
        match self {
            Layout::RowMajor => 'n',
            Layout::Transposed => 't',
            Layout::Panels => 'p',
        }
    }
}

/// A dense product variant (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Gemm {
    /// Storage of `A`.
    pub a: Layout,
    /// Storage of `B`.
    pub b: Layout,
    /// Storage dtype of every operand and of `C` (`f32`, `f16` or `bf16`).
    pub dtype: DType,
    /// Whether a bias `[N]` is added.
    pub bias: bool,
    /// Whether a residual `R: [M, N]` is added last (`y = h + up(..)` of a serial adapter, or
    /// `dh = dY + dZ @ W`).
    pub residual: bool,
    /// Partials of the sum over `l`: 1 for [`GEMM_ORDER`], or a power of two `W` from 2 to
    /// [`MAX_PARTIALS`] for `strided W` over operands stored **partial-major**.
    ///
    /// With `W > 1`, `L` must be a multiple of `W` and both operands' `l` axis is stored
    /// permuted: logical element `l` at stored position `(l % W) * (L / W) + l / W`, so each
    /// partial's elements are one contiguous run. Each output is then `strided W` of the
    /// logical operands (`docs/semantics.md`): partial `p` is one sequential `fma` chain from
    /// `-0.0` over its run, the halving tree adds the partials. With `W = 16` this is the 4-bit
    /// forward's [`crate::matmul4::K_ORDER`], so a dense product on its decoded weight gives the
    /// fused kernel's bits (`matmul4/decoded_forward.rs`), while each partial runs the
    /// column-lanes loop of a sequential product. Row-major and panel storage only.
    pub partials: u32,
    /// Outputs per work item.
    pub tile: TileConfig,
}

/// The most partials of a [`Gemm`] (`strided 16`, the 4-bit forward's order).
pub const MAX_PARTIALS: u32 = 16;

impl Gemm {
    /// The kernel name, e.g. `gemm_nn_f32_bias_t1x4`, `gemm_nt_f32_res_t2x2`, and with
    /// partial-major operands `gemm_np_f32_bias_strided16_t6x16`.
    pub fn name(&self) -> String {
        let order = if self.partials > 1 {
            format!("_strided{}", self.partials)
        } else {
            String::new()
        };
        format!(
            "gemm_{}{}_{}{}{}{order}_t{}x{}",
            self.a.letter(),
            self.b.letter(),
            self.dtype,
            if self.bias { "_bias" } else { "" },
            if self.residual { "_res" } else { "" },
            self.tile.tm,
            self.tile.tn
        )
    }

    /// Builds the kernel ([`gemm_kernel`], the macro-built kernel, as a plain [`Kernel`]).
    ///
    /// # Errors
    /// [`crate::Error::Unsupported`] for a non-float dtype or an invalid tile.
    pub fn build(&self) -> Result<Kernel> {
        self.build_typed().map(TypedKernel::into_kernel)
    }

    /// Builds the kernel with its typed signature ([`GemmKernelArgs`] names its arguments).
    ///
    /// # Errors
    /// [`crate::Error::Unsupported`] for a non-float dtype, an invalid tile, `A` in
    /// [`Layout::Panels`], or partials that are not a power of two up to [`MAX_PARTIALS`]
    /// (more than one with a transposed operand).
    pub fn build_typed(&self) -> Result<TypedKernel<GemmKernel>> {
        check_float_dtype(self.dtype)?;
        self.tile.check()?;
        if self.a == Layout::Panels {
            return Err(qforge_ir::Error::Unsupported(format!(
                "{}: A cannot be stored in panels (only B is)",
                self.name()
            )));
        }
        let transposed = self.a == Layout::Transposed || self.b == Layout::Transposed;
        let partials_ok = self.partials.is_power_of_two()
            && self.partials <= MAX_PARTIALS
            && (self.partials == 1 || !transposed);
        if !partials_ok {
            return Err(qforge_ir::Error::Unsupported(format!(
                "{}: the partials must be a power of two up to {MAX_PARTIALS}, and 1 with a \
                 transposed operand (got {})",
                self.name(),
                self.partials
            )));
        }
        gemm_kernel(*self)
    }
}

impl Layout {
    /// The first stored dim of a logical `[rows, L]` operand: `rows` (row-major), `L`
    /// (transposed) or the number of panels.
    pub fn outer<T>(self, rows: T, l: T, panels: T) -> T {
        match self {
            Layout::RowMajor => rows,
            Layout::Transposed => l,
            Layout::Panels => panels,
        }
    }

    /// The second stored dim of a logical `[rows, L]` operand: `L` (row-major), `rows`
    /// (transposed) or a panel's `L * P` elements.
    pub fn inner<T>(self, rows: T, l: T, panel: Option<T>) -> T {
        match (self, panel) {
            (Layout::RowMajor, _) => l,
            (Layout::Transposed, _) | (Layout::Panels, None) => rows,
            (Layout::Panels, Some(p)) => p,
        }
    }
}

/// One operand's tile rows: where each starts, and how to step along `L`.
#[derive(Clone)]
struct Operand {
    buf: Buf<In<Float>>,
    layout: Layout,
    /// Row-major: `row * L` per tile row; transposed and panels: the row index itself.
    offsets: Vec<Val<u32>>,
    /// Transposed: the stored row length (`rows`); panels: the panel width.
    stride: Val<u32>,
    /// Panels: `first * (L - 1)`, `first` the tile's first row (a multiple of the width), so
    /// that element `(r, l)` is at `(l * P + first * (L - 1)) + r`. The row stays the last
    /// term, as in the transposed index, so the CPU backends see the tile's rows as the lanes
    /// of both the loads and the stores (`codegen/src/llvm/outer_store.rs`).
    panel_base: Option<Val<u32>>,
}

/// The operand `buf` stored with `layout` at the tile rows `rows` (of `len` rows, reduced
/// over `l`).
#[qforge_macros::func]
fn operand(
    buf: Buf<In<Float>>,
    layout: Layout,
    rows: &[Row],
    len: Val<u32>,
    l: Val<u32>,
) -> Operand {
    #[comptime]
    let mut offsets = Vec::new();
    for r in rows {
        let off = match layout {
            Layout::RowMajor => r.clamped * l,
            Layout::Transposed | Layout::Panels => r.clamped,
        };
        offsets.push(off);
    }
    let stride = match layout {
        Layout::Panels => val::<u32>(comptime!(rows.len() as u32)),
        _ => len,
    };
    #[comptime]
    let mut panel_base = None;
    match layout {
        Layout::Panels => {
            let first = rows[0].first * (l - 1u32);
            panel_base = Some(first);
        }
        _ => {}
    }
    Operand {
        buf,
        layout,
        offsets,
        stride,
        panel_base,
    }
}

/// Element `(r, l)` of each tile row `r` of `op`.
#[qforge_macros::func]
fn load_operand(op: &Operand, l: Val<u32>) -> Vec<Val<f32>> {
    let buf = op.buf;
    #[comptime]
    let mut loads = Vec::new();
    match op.layout {
        Layout::RowMajor => {
            loads = load_rows(buf, &op.offsets, l);
        }
        Layout::Transposed | Layout::Panels => {
            let base = match op.panel_base {
                Some(p) => l * op.stride + p,
                None => l * op.stride,
            };
            for off in op.offsets.iter().copied() {
                let x = buf[base + off];
                loads.push(x);
            }
        }
    }
    loads
}

/// `op` read from stored position `shift` on: element `(r, l)` of the result is `(r, l + shift)`
/// of `op` (row-major or panels; the shift folded into the row starts or the panel base, so the
/// loads keep the form the CPU backends' column-lanes loop recognizes).
///
/// # Errors
/// [`qforge_ir::Error::Unsupported`] for a transposed operand.
fn shifted(b: &mut KernelBuilder, op: &Operand, shift: Val<u32>) -> Result<Operand> {
    let mut out = op.clone();
    match op.layout {
        Layout::RowMajor => {
            out.offsets = op.offsets.iter().map(|o| dsl::add(b, *o, shift)).collect();
        }
        Layout::Panels => {
            let step = dsl::mul(b, shift, op.stride);
            out.panel_base = op.panel_base.map(|p| dsl::add(b, p, step));
        }
        Layout::Transposed => {
            return Err(qforge_ir::Error::Unsupported(
                "a transposed operand cannot be partial-major".into(),
            ))
        }
    }
    Ok(out)
}

/// `accs = sum_l A[r, l] * B[o, l]` in `strided W` (`W = partials`) over partial-major
/// operands ([`Gemm::partials`]): `W` sequential accumulates of `L / W` elements each, partial
/// `p` over stored positions `p * L / W ..`, then each output's halving tree (`q[j] += q[j + w]`
/// for `w = W / 2, .., 1`). A builder fragment in the helper calling convention.
///
/// # Errors
/// A helper's error.
fn accumulate_partial_major(
    b: &mut KernelBuilder,
    len: Val<u32>,
    partials: u32,
    accs: &[qforge_ir::dsl::Var<f32>],
    Operands(a, w): &Operands,
) -> Result<()> {
    let run = dsl::shr(b, len, partials.trailing_zeros());
    let mut sums = Vec::with_capacity(partials as usize);
    for p in 0..partials {
        let shift = dsl::mul(b, run, p);
        let ops = Operands(shifted(b, a, shift)?, shifted(b, w, shift)?);
        let part = vars::<f32>(b, accs.len(), &format!("part{p}_"))?;
        accumulate_tile(b, run, qforge_ir::ReduceOrder::Sequential, &part, &ops)?;
        sums.push(part);
    }
    for (o, acc) in accs.iter().enumerate() {
        let mut q: Vec<Val<f32>> = sums.iter().map(|s| dsl::read(b, s[o])).collect();
        while q.len() > 1 {
            let half = q.len() / 2;
            q = (0..half).map(|j| dsl::add(b, q[j], q[j + half])).collect();
        }
        dsl::assign(b, *acc, q[0]);
    }
    Ok(())
}

/// The two operands of a tile's products.
struct Operands(Operand, Operand);

impl TileFactors for Operands {
    fn factors(&self, b: &mut KernelBuilder, l: Val<u32>) -> Result<Factors> {
        let a = load_operand(b, &self.0, l)?;
        let w = load_operand(b, &self.1, l)?;
        Ok((a, w))
    }
}

/// Builds `gemm_{a}{b}_{dtype}[_bias][_res]_t{TM}x{TN}` (see the module docs): `C = A @ B.T
/// (+ bias) (+ R)` for the tile `spec.tile`, with `A`, `B` stored as `spec.a`, `spec.b`.
///
/// # Errors
/// [`crate::Error::Unsupported`] for a non-float dtype.
#[kernel(name = spec.name(), grid = n_items, signature = GemmKernel)]
pub fn gemm_kernel(
    #[config] spec: Gemm,
    m: u32,
    n: u32,
    l: u32,
    n_items: u32,
    m_tiles: u32,
    n_tiles: u32,
    group: u32,
    #[when(spec.b == Layout::Panels)] panel_len: u32,
    #[shape(spec.a.outer(m, l, m), spec.a.inner(m, l, None))]
    #[dtype(spec.dtype)]
    a: In<Float>,
    #[shape(spec.b.outer(n, l, n_tiles), spec.b.inner(n, l, panel_len))]
    #[dtype(spec.dtype)]
    b: In<Float>,
    #[when(spec.bias)]
    #[shape(n)]
    #[dtype(spec.dtype)]
    bias: In<Float>,
    #[when(spec.residual)]
    #[shape(m, n)]
    #[dtype(spec.dtype)]
    r: In<Float>,
    #[shape(m, n)]
    #[dtype(spec.dtype)]
    c: Out<Float>,
) {
    let mv = m;
    let nv = n;
    let lv = l;
    let (rows, outs) = work_tile_grouped((m_tiles, n_tiles, group), spec.tile, mv, nv);
    let accs = vars::<f32>(comptime!(rows.len() * outs.len()), "acc");
    let a_op = operand(a, spec.a, &rows, mv, lv);
    let b_op = operand(b, spec.b, &outs, nv, lv);
    let ops = Operands(a_op, b_op);
    if spec.partials == 1 {
        accumulate_tile(lv, GEMM_ORDER, &accs, &ops);
    } else {
        accumulate_partial_major(lv, spec.partials, &accs, &ops);
    }
    store_sums(c, nv, &rows, &outs, &accs, bias, r);
}

impl Gemm {
    /// The catalog's dense products: the forward (`nn` with bias), `dX` with a residual
    /// (`nt`), `dW` (`tt`) and the bias gradient (`nt`) in `f32`, the forward in `bf16`, and
    /// `B` in panels (the CPU plan's large `B`): the forward in `f32` (`np`) and `dW` with a
    /// residual in `bf16` (`tp`).
    pub fn catalog() -> Vec<Gemm> {
        let g = |a, b, dtype, bias, residual| Gemm {
            a,
            b,
            dtype,
            bias,
            residual,
            partials: 1,
            tile: TileConfig { tm: 2, tn: 4 },
        };
        use Layout::{Panels as P, RowMajor as N, Transposed as T};
        vec![
            g(N, N, DType::F32, true, false),
            g(N, T, DType::F32, false, true),
            g(T, T, DType::F32, false, false),
            g(N, T, DType::F32, false, false),
            g(N, N, DType::BF16, true, false),
            g(N, P, DType::F32, true, false),
            g(T, P, DType::BF16, false, true),
        ]
    }
}
