//! The builder version of the fused 4-bit matmul kernels, as it was before they moved to the
//! kernel language: `super::tests` proves the macro-built kernels equal to it (same IR, so the
//! same snapshots) for every variant.
#![allow(missing_docs)]

use crate::matmul4::panels::DX_PANEL;
use crate::matmul4::{Direction, Matmul4, DX_ORDER, K_ORDER};
use crate::tile::builder::{row_bases, store_tile, tile_of};
use crate::{check_blocksize_4bit, check_float_dtype, NESTED_BLOCKSIZE};
use qforge_ir::routines::round::round_to;
use qforge_ir::BinaryOp;
use qforge_ir::KernelBuilder;
use qforge_ir::Result;
use qforge_ir::{Access, Dim, Kernel, ParamId, TableId, Value, VarId};
use qforge_ir::{DType, ScalarType};

/// The builder version of [`Matmul4::build`].
pub(super) fn build(spec: &Matmul4) -> Result<Kernel> {
    check_blocksize_4bit(spec.blocksize)?;
    check_float_dtype(spec.dtype)?;
    check_float_dtype(spec.weight_dtype)?;
    spec.tile.check()?;
    let mut b = KernelBuilder::new(&spec.name());
    let p = Params::declare(&mut b, spec);
    let (tm, tn) = (spec.tile.tm, spec.tile.tn);
    let (mv, nv, kv) = (b.param(p.m), b.param(p.n), b.param(p.k));
    // Forward: outputs (m, n), reduce over k; backward: outputs (m, k), reduce over n.
    let (cols, reduce_len, act_len) = match spec.direction {
        Direction::Forward { .. } => (nv, kv, kv),
        Direction::BackwardInput { .. } => (kv, nv, nv),
    };
    let (rows, outs) = tile_of(&mut b, p.n_tiles, spec.tile, mv, cols);
    // Row starts of the activation (`m * K` or `m * N`).
    let act_base = row_bases(&mut b, &rows, act_len);
    let vars: Vec<VarId> = (0..tm * tn)
        .map(|i| b.var(&format!("acc{i}"), ScalarType::F32))
        .collect();
    // The input gradient reads the panel layout (`panels.rs`): `N - 1` and the tile's panel.
    let panel_rows = match spec.direction {
        Direction::Forward { .. } => None,
        Direction::BackwardInput { chunk } => {
            let one = b.const_u32(1);
            let n_minus_1 = b.sub(nv, one);
            let tile_panel = DX_PANEL.is_multiple_of(tn).then(|| {
                let s = b.const_u32(DX_PANEL.trailing_zeros());
                b.shr(outs[0].first, s)
            });
            let tile_scales = chunk.is_multiple_of(tn).then(|| {
                let s = b.const_u32(chunk.trailing_zeros());
                let j = b.shr(outs[0].first, s);
                b.mul(j, nv)
            });
            Some((n_minus_1, tile_panel, chunk, tile_scales))
        }
    };
    let table = b.table_f32("code", &spec.quant_type.dequant_table());
    let direction = spec.direction;
    let order = match direction {
        Direction::Forward { .. } => K_ORDER,
        Direction::BackwardInput { .. } => DX_ORDER,
    };
    b.accumulate(reduce_len, order, &vars, |b, i| {
        let acts: Vec<Value> = act_base
            .iter()
            .map(|base| {
                let idx = b.add(*base, i);
                b.load(p.act, idx)
            })
            .collect();
        let weights: Vec<Value> = outs
            .iter()
            .map(|o| {
                // Flat weight element: (n, k) -> n*K + k; its code: the same nibble forward,
                // nibble 32 * (panel * (N - 1) + n) + k of the panels backward.
                let (at, e) = match panel_rows {
                    None => {
                        let row = b.mul(o.clamped, kv);
                        let e = b.add(row, i);
                        (e, e)
                    }
                    Some((n_minus_1, tile_panel, _, _)) => {
                        let panel = tile_panel.unwrap_or_else(|| {
                            let s = b.const_u32(DX_PANEL.trailing_zeros());
                            b.shr(o.clamped, s)
                        });
                        let prow = b.mul(panel, n_minus_1);
                        let prow = b.add(prow, i);
                        let s = b.const_u32(DX_PANEL.trailing_zeros());
                        let start = b.shl(prow, s);
                        let at = b.add(start, o.clamped);
                        let row = b.mul(i, kv);
                        (at, b.add(row, o.clamped))
                    }
                };
                // The scale of row `i` at the column's chunk: `(k / chunk) * N + i`.
                let scale_at = panel_rows.map(|(_, _, chunk, tile_scales)| {
                    let base = tile_scales.unwrap_or_else(|| {
                        let s = b.const_u32(chunk.trailing_zeros());
                        let j = b.shr(o.clamped, s);
                        b.mul(j, nv)
                    });
                    b.add(base, i)
                });
                let w = weight(b, &p, table, spec.blocksize, (at, e), scale_at);
                round_to(b, w, spec.weight_dtype)
            })
            .collect();
        let mut factors = Vec::new();
        for a in &acts {
            for w in &weights {
                factors.push((*a, *w));
            }
        }
        factors
    });
    store_tile(&mut b, (&rows, &outs), p.out, cols, |b, at, _, o| {
        let y = b.read_var(vars[at]);
        match p.bias {
            Some(bias) => {
                let bv = b.load(bias, o.clamped);
                b.add(y, bv)
            }
            None => y,
        }
    });
    Ok(b.finish())
}

/// The parameters of a matmul kernel.
struct Params {
    m: ParamId,
    n: ParamId,
    k: ParamId,
    n_tiles: ParamId,
    /// `x` (forward) or `dY` (backward).
    act: ParamId,
    packed: ParamId,
    scale: Scale,
    bias: Option<ParamId>,
    /// `y` (forward) or `dX` (backward).
    out: ParamId,
}

/// Where the per-block absmax comes from.
enum Scale {
    Plain {
        absmax: ParamId,
    },
    Nested {
        offset: ParamId,
        qabsmax: ParamId,
        nested_absmax: ParamId,
        nested_code: ParamId,
    },
}

impl Params {
    fn declare(b: &mut KernelBuilder, spec: &Matmul4) -> Params {
        let m = b.scalar_param("m", ScalarType::U32);
        let n = b.scalar_param("n", ScalarType::U32);
        let k = b.scalar_param("k", ScalarType::U32);
        let n_items = b.scalar_param("n_items", ScalarType::U32);
        let n_tiles = b.scalar_param("n_tiles", ScalarType::U32);
        let offset = spec
            .nested
            .then(|| b.scalar_param("offset", ScalarType::F32));
        let (packed_name, n_packed_name) = match spec.direction {
            Direction::Forward { .. } => ("packed", "n_packed"),
            Direction::BackwardInput { .. } => ("panels", "n_panel_bytes"),
        };
        let n_packed = b.scalar_param(n_packed_name, ScalarType::U32);
        let n_blocks = b.scalar_param(
            match spec.direction {
                Direction::Forward { .. } => "n_blocks",
                Direction::BackwardInput { .. } => "n_scales",
            },
            ScalarType::U32,
        );
        let n_nested = spec
            .nested
            .then(|| b.scalar_param("n_nested", ScalarType::U32));
        let dt = spec.dtype;
        let (act_name, act_cols, out_name, out_cols) = match spec.direction {
            Direction::Forward { .. } => ("x", k, "y", n),
            Direction::BackwardInput { .. } => ("dy", n, "dx", k),
        };
        let act = b.buffer_param(
            act_name,
            dt,
            &[Dim::Param(m), Dim::Param(act_cols)],
            Access::Read,
        );
        let packed = b.buffer_param(
            packed_name,
            DType::U8,
            &[Dim::Param(n_packed)],
            Access::Read,
        );
        let scale = match (offset, n_nested) {
            (Some(offset), Some(n_nested)) => Scale::Nested {
                offset,
                qabsmax: b.buffer_param(
                    "qabsmax",
                    DType::U8,
                    &[Dim::Param(n_blocks)],
                    Access::Read,
                ),
                nested_absmax: b.buffer_param(
                    "nested_absmax",
                    DType::F32,
                    &[Dim::Param(n_nested)],
                    Access::Read,
                ),
                nested_code: b.buffer_param(
                    "nested_code",
                    DType::F32,
                    &[Dim::Const(256)],
                    Access::Read,
                ),
            },
            _ => Scale::Plain {
                absmax: b.buffer_param("absmax", DType::F32, &[Dim::Param(n_blocks)], Access::Read),
            },
        };
        let bias = matches!(spec.direction, Direction::Forward { bias: true })
            .then(|| b.buffer_param("bias", dt, &[Dim::Param(n)], Access::Read));
        let out = b.buffer_param(
            out_name,
            dt,
            &[Dim::Param(m), Dim::Param(out_cols)],
            Access::Write,
        );
        b.set_grid(Dim::Param(n_items));
        Params {
            m,
            n,
            k,
            n_tiles,
            act,
            packed,
            scale,
            bias,
            out,
        }
    }
}

/// The dequantized weight of flat element `e` whose code is nibble `at` of `packed`:
/// `table[nibble] * absmax[e / blocksize]` (the absmax or `qabsmax` at `scale_at` when given).
fn weight(
    b: &mut KernelBuilder,
    p: &Params,
    table: TableId,
    blocksize: u32,
    (at, e): (Value, Value),
    scale_at: Option<Value>,
) -> Value {
    let one = b.const_u32(1);
    let byte_idx = b.shr(at, one);
    let byte = b.load(p.packed, byte_idx);
    // Even nibbles sit in the high half: shift by 4 * (1 - (at & 1)).
    let parity = b.and(at, one);
    let odd_flip = b.binary(BinaryOp::Xor, parity, one);
    let two = b.const_u32(2);
    let shift = b.shl(odd_flip, two);
    let shifted = b.shr(byte, shift);
    let fifteen = b.const_u32(15);
    let nibble = b.and(shifted, fifteen);
    let code = b.lookup(table, nibble);
    let flat_block = |b: &mut KernelBuilder| {
        let bs_shift = b.const_u32(blocksize.trailing_zeros());
        b.shr(e, bs_shift)
    };
    let absmax = match p.scale {
        Scale::Plain { absmax } => {
            let at = scale_at.unwrap_or_else(|| flat_block(b));
            b.load(absmax, at)
        }
        Scale::Nested {
            offset,
            qabsmax,
            nested_absmax,
            nested_code,
        } => {
            let block = flat_block(b);
            let q = b.load(qabsmax, scale_at.unwrap_or(block));
            let c = b.load(nested_code, q);
            let nshift = b.const_u32(NESTED_BLOCKSIZE.trailing_zeros());
            let nb = b.shr(block, nshift);
            let na = b.load(nested_absmax, nb);
            let prod = b.mul(c, na);
            let off = b.param(offset);
            b.add(prod, off)
        }
    };
    b.mul(code, absmax)
}
