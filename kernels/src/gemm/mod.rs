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
//! [`crate::Stmt::Accumulate`] in [`DOT_ORDER`] (element `l` fused with `fma` into partial `l % 8`,
//! partials from `-0.0`, the halving tree), so tiling never changes a bit; with a bias, one `f32`
//! add of `f32(bias[j])`; with a residual, then one `f32` add of `f32(R[i, j])`; one rounding
//! (nearest even) to the output dtype. For `f32` this is PyTorch's `h + (a @ W.T + b)`: each
//! add rounds once, in that order.
//!
//! Parameters (scalars first, then buffers): `gemm_{a}{b}_{dtype}[_bias][_res]_t{TM}x{TN}` with `{a}`,
//! `{b}` = `n` (row-major) or `t` (transposed): `(m, n, l, n_items, n_tiles: u32, a: dtype[m*l]
//! read, b: dtype[n*l] read, [bias: dtype[n] read,] [r: dtype[m, n] read,] c: dtype[m, n]
//! write)`, grid `n_items =
//! ceil(m/TM) * ceil(n/TN)`, `n_tiles = ceil(n/TN)`; rows of a tile past the end read the last
//! valid row and store nothing.

mod catalog;
pub(crate) mod host;
#[cfg(test)]
mod tests;

use crate::check_float_dtype;
use crate::matmul4::TileConfig;
use crate::tile::{store_tile, tile_of, TileRow};
use crate::DOT_ORDER;
use qforge_ir::KernelBuilder;
use qforge_ir::Result;
use qforge_ir::{Access, Dim, Kernel, ParamId, Value, VarId};
use qforge_ir::{DType, ScalarType};

/// How a logical `[rows, L]` operand is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Layout {
    /// Stored `[rows, L]`: element `(r, l)` at `r * L + l`.
    RowMajor,
    /// Stored `[L, rows]`: element `(r, l)` at `l * rows + r`.
    Transposed,
}

impl Layout {
    /// `n` or `t` (the kernel-name letter).
    pub const fn letter(self) -> char {
        match self {
            Layout::RowMajor => 'n',
            Layout::Transposed => 't',
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
    /// Outputs per work item.
    pub tile: TileConfig,
}

impl Gemm {
    /// The kernel name, e.g. `gemm_nn_f32_bias_t1x4`, `gemm_nt_f32_res_t2x2`.
    pub fn name(&self) -> String {
        format!(
            "gemm_{}{}_{}{}{}_t{}x{}",
            self.a.letter(),
            self.b.letter(),
            self.dtype,
            if self.bias { "_bias" } else { "" },
            if self.residual { "_res" } else { "" },
            self.tile.tm,
            self.tile.tn
        )
    }

    /// Builds the kernel.
    ///
    /// # Errors
    /// [`crate::Error::Unsupported`] for a non-float dtype or an invalid tile.
    pub fn build(&self) -> Result<Kernel> {
        check_float_dtype(self.dtype)?;
        self.tile.check()?;
        let mut b = KernelBuilder::new(&self.name());
        let [m, n, l, n_items, n_tiles] =
            ["m", "n", "l", "n_items", "n_tiles"].map(|s| b.scalar_param(s, ScalarType::U32));
        let a_dims = match self.a {
            Layout::RowMajor => [Dim::Param(m), Dim::Param(l)],
            Layout::Transposed => [Dim::Param(l), Dim::Param(m)],
        };
        let b_dims = match self.b {
            Layout::RowMajor => [Dim::Param(n), Dim::Param(l)],
            Layout::Transposed => [Dim::Param(l), Dim::Param(n)],
        };
        let a = b.buffer_param("a", self.dtype, &a_dims, Access::Read);
        let w = b.buffer_param("b", self.dtype, &b_dims, Access::Read);
        let bias = self
            .bias
            .then(|| b.buffer_param("bias", self.dtype, &[Dim::Param(n)], Access::Read));
        let residual = self.residual.then(|| {
            b.buffer_param(
                "r",
                self.dtype,
                &[Dim::Param(m), Dim::Param(n)],
                Access::Read,
            )
        });
        let c = b.buffer_param(
            "c",
            self.dtype,
            &[Dim::Param(m), Dim::Param(n)],
            Access::Write,
        );
        b.set_grid(Dim::Param(n_items));
        let (mv, nv, lv) = (b.param(m), b.param(n), b.param(l));
        let (rows, outs) = tile_of(&mut b, n_tiles, self.tile, mv, nv);
        let vars: Vec<VarId> = (0..rows.len() * outs.len())
            .map(|i| b.var(&format!("acc{i}"), ScalarType::F32))
            .collect();
        let a_op = Operand::new(&mut b, a, self.a, &rows, mv, lv);
        let b_op = Operand::new(&mut b, w, self.b, &outs, nv, lv);
        b.accumulate(lv, DOT_ORDER, &vars, |b, i| {
            let av = a_op.load_all(b, i);
            let bv = b_op.load_all(b, i);
            let mut factors = Vec::with_capacity(av.len() * bv.len());
            for x in &av {
                for y in &bv {
                    factors.push((*x, *y));
                }
            }
            factors
        });
        store_tile(&mut b, (&rows, &outs), c, nv, |b, at, r, o| {
            let mut s = b.read_var(vars[at]);
            if let Some(bias) = bias {
                let bv = b.load(bias, o.clamped);
                s = b.add(s, bv);
            }
            if let Some(res) = residual {
                let row = b.mul(r.clamped, nv);
                let idx = b.add(row, o.clamped);
                let rv = b.load(res, idx);
                s = b.add(s, rv);
            }
            s
        });
        Ok(b.finish())
    }
}

/// The loads of one operand's tile rows at reduction index `l`.
struct Operand {
    buf: ParamId,
    layout: Layout,
    /// Row-major: `row * L` per tile row; transposed: the row index itself.
    offsets: Vec<Value>,
    /// Transposed: the stored row length (`rows`).
    stride: Value,
}

impl Operand {
    fn new(
        b: &mut KernelBuilder,
        buf: ParamId,
        layout: Layout,
        rows: &[TileRow],
        len: Value,
        l: Value,
    ) -> Operand {
        let offsets = rows
            .iter()
            .map(|r| match layout {
                Layout::RowMajor => b.mul(r.clamped, l),
                Layout::Transposed => r.clamped,
            })
            .collect();
        Operand {
            buf,
            layout,
            offsets,
            stride: len,
        }
    }

    /// Element `(r, l)` of each tile row `r`.
    fn load_all(&self, b: &mut KernelBuilder, l: Value) -> Vec<Value> {
        let base = match self.layout {
            Layout::RowMajor => None,
            Layout::Transposed => Some(b.mul(l, self.stride)),
        };
        self.offsets
            .iter()
            .map(|off| {
                let idx = match base {
                    None => b.add(*off, l),
                    Some(base) => b.add(base, *off),
                };
                b.load(self.buf, idx)
            })
            .collect()
    }
}

impl Gemm {
    /// Example launch arguments (for the catalog's conformance runs) reducing over
    /// `L = values.len()` with `M = 1 + L % 3` and `N = 3 + L % 5`: the operands, bias and
    /// residual cycle through `values` (stored as the dtype with `to_bytes`, e.g. rounding),
    /// the output starts zeroed.
    pub fn example_args(
        &self,
        values: &[f32],
        to_bytes: fn(DType, &[f32]) -> Vec<u8>,
    ) -> Vec<qforge_ir::OwnedArg> {
        use qforge_ir::OwnedArg;
        use qforge_ir::Scalar;
        let l = values.len().max(1);
        let (m, n) = (1 + l % 3, 3 + l % 5);
        let n_tiles = n.div_ceil(self.tile.tn as usize);
        let n_items = m.div_ceil(self.tile.tm as usize) * n_tiles;
        let cycle = |count: usize, shift: usize| -> Vec<f32> {
            (0..count)
                .map(|i| values.get((i + i / l + shift) % l).copied().unwrap_or(0.0))
                .collect()
        };
        let u = |v: usize| OwnedArg::Scalar(Scalar::U32(v as u32));
        let mut args = vec![u(m), u(n), u(l), u(n_items), u(n_tiles)];
        args.push(OwnedArg::Read(to_bytes(self.dtype, &cycle(m * l, 0))));
        args.push(OwnedArg::Read(to_bytes(self.dtype, &cycle(n * l, 1))));
        if self.bias {
            args.push(OwnedArg::Read(to_bytes(self.dtype, &cycle(n, 2))));
        }
        if self.residual {
            args.push(OwnedArg::Read(to_bytes(self.dtype, &cycle(m * n, 3))));
        }
        args.push(OwnedArg::Write(vec![0; m * n * self.dtype.size_bytes()]));
        args
    }

    /// The catalog's dense products: the forward (`nn` with bias), `dX` with a residual
    /// (`nt`), `dW` (`tt`) and the bias gradient (`nt`) in `f32`, and the forward in `bf16`.
    pub fn catalog() -> Vec<Gemm> {
        let g = |a, b, dtype, bias, residual| Gemm {
            a,
            b,
            dtype,
            bias,
            residual,
            tile: TileConfig { tm: 2, tn: 4 },
        };
        use Layout::{RowMajor as N, Transposed as T};
        vec![
            g(N, N, DType::F32, true, false),
            g(N, T, DType::F32, false, true),
            g(T, T, DType::F32, false, false),
            g(N, T, DType::F32, false, false),
            g(N, N, DType::BF16, true, false),
        ]
    }
}
