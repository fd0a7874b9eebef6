//! The builder version of the dense product kernel, as it was before it moved to the kernel
//! language: `super::tests` proves the macro-built kernel equal to it (same IR, so the same
//! snapshots) for every layout, dtype, bias, residual and tile.
#![allow(missing_docs)]

use crate::check_float_dtype;
use crate::gemm::GEMM_ORDER;
use crate::gemm::{Gemm, Layout};
use crate::tile::builder::{store_tile, tile_of, TileRow};
use qforge_ir::KernelBuilder;
use qforge_ir::Result;
use qforge_ir::ScalarType;
use qforge_ir::{Access, Dim, Kernel, ParamId, Value, VarId};

/// The builder version of [`Gemm::build`].
pub(super) fn build(spec: &Gemm) -> Result<Kernel> {
    check_float_dtype(spec.dtype)?;
    spec.tile.check()?;
    let mut b = KernelBuilder::new(&spec.name());
    let [m, n, l, n_items, n_tiles] =
        ["m", "n", "l", "n_items", "n_tiles"].map(|s| b.scalar_param(s, ScalarType::U32));
    let a_dims = match spec.a {
        Layout::RowMajor => [Dim::Param(m), Dim::Param(l)],
        Layout::Transposed => [Dim::Param(l), Dim::Param(m)],
    };
    let b_dims = match spec.b {
        Layout::RowMajor => [Dim::Param(n), Dim::Param(l)],
        Layout::Transposed => [Dim::Param(l), Dim::Param(n)],
    };
    let a = b.buffer_param("a", spec.dtype, &a_dims, Access::Read);
    let w = b.buffer_param("b", spec.dtype, &b_dims, Access::Read);
    let bias = spec
        .bias
        .then(|| b.buffer_param("bias", spec.dtype, &[Dim::Param(n)], Access::Read));
    let residual = spec.residual.then(|| {
        b.buffer_param(
            "r",
            spec.dtype,
            &[Dim::Param(m), Dim::Param(n)],
            Access::Read,
        )
    });
    let c = b.buffer_param(
        "c",
        spec.dtype,
        &[Dim::Param(m), Dim::Param(n)],
        Access::Write,
    );
    b.set_grid(Dim::Param(n_items));
    let (mv, nv, lv) = (b.param(m), b.param(n), b.param(l));
    let (rows, outs) = tile_of(&mut b, n_tiles, spec.tile, mv, nv);
    let vars: Vec<VarId> = (0..rows.len() * outs.len())
        .map(|i| b.var(&format!("acc{i}"), ScalarType::F32))
        .collect();
    let a_op = Operand::new(&mut b, a, spec.a, &rows, mv, lv);
    let b_op = Operand::new(&mut b, w, spec.b, &outs, nv, lv);
    b.accumulate(lv, GEMM_ORDER, &vars, |b, i| {
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
