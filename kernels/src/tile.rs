//! Tiles of the matmul kernels: which output rows and columns a work item computes. Work item
//! `t` of a grid of `ceil(rows / TM) * n_tiles` items takes rows `(t / n_tiles) * TM ..` and
//! outputs `(t % n_tiles) * TN ..`; a row past the end reads the last valid row (so no load
//! leaves its buffer) and stores nothing.

use crate::matmul4::TileConfig;
use qforge_ir::KernelBuilder;
use qforge_ir::{BinaryOp, CmpOp};
use qforge_ir::{ParamId, Value};

/// One row of a tile: its index clamped into range (for loads) and whether it is in range.
pub(crate) struct TileRow {
    /// The row index, clamped to the last valid row.
    pub(crate) clamped: Value,
    /// Whether the row exists (`bool`).
    pub(crate) inside: Value,
}

/// `len - 1`, or 0 when `len = 0`.
pub(crate) fn last_index(b: &mut KernelBuilder, len: Value) -> Value {
    let one = b.const_u32(1);
    let zero = b.const_u32(0);
    let nonempty = b.cmp(CmpOp::Gt, len, zero);
    let last = b.sub(len, one);
    b.select(nonempty, last, zero)
}

/// Rows `tile * size + j` for `j < size`, clamped to `len - 1`.
fn tile_rows(b: &mut KernelBuilder, tile: Value, size: u32, len: Value) -> Vec<TileRow> {
    let sz = b.const_u32(size);
    let first = b.mul(tile, sz);
    let last = last_index(b, len);
    (0..size)
        .map(|j| {
            let off = b.const_u32(j);
            let row = b.add(first, off);
            let inside = b.cmp(CmpOp::Lt, row, len);
            let clamped = b.min(row, last);
            TileRow { clamped, inside }
        })
        .collect()
}

/// The tile of the current work item: `tm` rows of `[0, row_len)`, `tn` outputs of
/// `[0, out_len)`.
pub(crate) fn tile_of(
    b: &mut KernelBuilder,
    n_tiles: ParamId,
    tile: TileConfig,
    row_len: Value,
    out_len: Value,
) -> (Vec<TileRow>, Vec<TileRow>) {
    let item = b.work_item();
    let nt = b.param(n_tiles);
    let tile_m = b.binary(BinaryOp::Div, item, nt);
    let whole = b.mul(tile_m, nt);
    let tile_n = b.sub(item, whole);
    let rows = tile_rows(b, tile_m, tile.tm, row_len);
    let outs = tile_rows(b, tile_n, tile.tn, out_len);
    (rows, outs)
}

/// `row.clamped * len` for each row.
pub(crate) fn row_bases(b: &mut KernelBuilder, rows: &[TileRow], len: Value) -> Vec<Value> {
    rows.iter().map(|r| b.mul(r.clamped, len)).collect()
}

/// Stores one value per output of a tile: for each row `r` and output `o` that both exist,
/// `value(b, at, r, o)` (with `at = ri * outs.len() + oi`, the output's index in the tile) is
/// stored at `out[r * cols + o]`, rounded to nearest even for an `f16`/`bf16` buffer.
pub(crate) fn store_tile(
    b: &mut KernelBuilder,
    (rows, outs): (&[TileRow], &[TileRow]),
    out: ParamId,
    cols: Value,
    mut value: impl FnMut(&mut KernelBuilder, usize, &TileRow, &TileRow) -> Value,
) {
    for (ri, r) in rows.iter().enumerate() {
        for (oi, o) in outs.iter().enumerate() {
            let at = ri * outs.len() + oi;
            let inside = b.binary(BinaryOp::And, r.inside, o.inside);
            b.if_then(inside, |b| {
                let v = value(b, at, r, o);
                let row = b.mul(r.clamped, cols);
                let idx = b.add(row, o.clamped);
                b.store_auto(out, idx, v);
            });
        }
    }
}
