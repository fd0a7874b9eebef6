//! Tiles of the matmul kernels (gemm, matmul4, the int8 products): which output rows and
//! columns a work item computes, in the kernel language. Work item `t` of a grid of
//! `ceil(rows / TM) * n_tiles` items takes rows `(t / n_tiles) * TM ..` and outputs
//! `(t % n_tiles) * TN ..`; a row past the end reads the last valid row (so no load leaves its
//! buffer) and stores nothing. The builder versions of the fragments, used only by the
//! builder copies of the kernels in the families' `reference.rs`, are in `builder` (tests
//! only).

use crate::matmul4::TileConfig;
use qforge_ir::dsl::{self, Buf, Float, In, KIndex, Out, Scalar, Val, Var};
use qforge_ir::KernelBuilder;
use qforge_ir::Result;
use qforge_ir::{ReduceOrder, Rounding};

/// One row (or output) of a tile: its index clamped into range (for loads) and whether it is
/// in range.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Row {
    /// The row index, clamped to the last valid row.
    pub(crate) clamped: Val<u32>,
    /// Whether the row exists.
    pub(crate) inside: Val<bool>,
    /// The tile's first row (`tile * size`, unclamped; the same for every row of the tile).
    pub(crate) first: Val<u32>,
}

/// One output of a tile: its row, its output (column) and what the kernel keeps for it (its
/// accumulator, or several values).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Cell<A> {
    /// The tile row.
    pub(crate) row: Row,
    /// The tile output.
    pub(crate) out: Row,
    /// The accumulator (or accumulators) of this output.
    pub(crate) acc: A,
}

/// `len - 1`, or 0 when `len = 0`.
#[qforge_macros::func]
pub(crate) fn last_valid(len: Val<u32>) -> Val<u32> {
    let one = val(1u32);
    let zero = val(0u32);
    let nonempty = len > zero;
    let last = len - one;
    select(nonempty, last, zero)
}

/// Rows `tile * size + j` for `j < size`, clamped to `len - 1`.
#[qforge_macros::func]
fn span_rows(tile: Val<u32>, size: u32, len: Val<u32>) -> Vec<Row> {
    let first = tile * size;
    let last = last_valid(len);
    #[comptime]
    let mut rows = Vec::new();
    for j in 0..size {
        let row = first + j;
        let inside = row < len;
        let clamped = min(row, last);
        rows.push(Row {
            clamped,
            inside,
            first,
        });
    }
    rows
}

/// The tile of the current work item: `tile.tm` rows of `[0, row_len)`, `tile.tn` outputs of
/// `[0, out_len)` (work item `t` takes row tile `t / n_tiles` and output tile `t % n_tiles`).
#[qforge_macros::func]
pub(crate) fn work_tile(
    n_tiles: Scalar<u32>,
    tile: TileConfig,
    row_len: Val<u32>,
    out_len: Val<u32>,
) -> (Vec<Row>, Vec<Row>) {
    let item = work_item();
    let nt = n_tiles;
    let tile_m = item / nt;
    let tile_n = item - tile_m * nt;
    let rows = span_rows(tile_m, tile.tm, row_len);
    let outs = span_rows(tile_n, tile.tn, out_len);
    (rows, outs)
}

/// As [`work_tile`] with the tiles taken in groups of `group` row tiles (0 is read as 1, more than `m_tiles` as `m_tiles`): work
/// item `t` is in group `g = t / (group * n_tiles)`, of row tiles `g * group ..` (the last group
/// may have fewer: `size`), and takes output tile `r / size` and row tile `g * group + r % size`
/// for `r = t % (group * n_tiles)`. The consecutive items one CPU thread runs go down a group's
/// row tiles for one output tile, sharing that output tile's operand (a dense product's panel
/// of `B`) in cache, before the next output tile; the group's rows of `A` stay in cache across
/// the output tiles. `group = 1` is [`work_tile`]'s order (Triton calls this "grouped
/// ordering").
#[qforge_macros::func]
pub(crate) fn work_tile_grouped(
    (m_tiles, n_tiles, group): (Val<u32>, Val<u32>, Val<u32>),
    tile: TileConfig,
    row_len: Val<u32>,
    out_len: Val<u32>,
) -> (Vec<Row>, Vec<Row>) {
    let item = work_item();
    // A group of 0 is read as 1 and one past `m_tiles` as `m_tiles` (a direct launch's
    // mistakes; `group * n_tiles` then never wraps), so every tile is taken exactly once.
    let group = min(max(group, 1u32), m_tiles);
    let per_group = group * n_tiles;
    let g = item / per_group;
    let r = item - g * per_group;
    let first = g * group;
    let size = min(group, m_tiles - first);
    let tile_n = r / size;
    let tile_m = first + (r - tile_n * size);
    let rows = span_rows(tile_m, tile.tm, row_len);
    let outs = span_rows(tile_n, tile.tn, out_len);
    (rows, outs)
}

/// `row.clamped * len` for each row.
#[qforge_macros::func]
pub(crate) fn row_starts(rows: &[Row], len: Val<u32>) -> Vec<Val<u32>> {
    #[comptime]
    let mut starts = Vec::new();
    for r in rows {
        let start = r.clamped * len;
        starts.push(start);
    }
    starts
}

/// `buf[start + i]` for each start: element `i` of each tile row (floats widened to `f32`,
/// integers to `u32`/`i32`).
///
/// # Errors
/// None (the helper calling convention).
pub(crate) fn load_rows<X: KIndex + Copy>(
    b: &mut KernelBuilder,
    buf: X,
    starts: &[Val<u32>],
    i: Val<u32>,
) -> Result<Vec<Val<X::Out>>> {
    Ok(starts
        .iter()
        .map(|start| {
            let at = dsl::add(b, *start, i);
            dsl::index(b, buf, at)
        })
        .collect())
}

/// The outputs of a tile, row by row (`rows.len() * outs.len()` cells, `accs` in that order).
///
/// # Errors
/// None (the helper calling convention).
pub(crate) fn cells<A: Copy>(
    _: &mut KernelBuilder,
    rows: &[Row],
    outs: &[Row],
    accs: &[A],
) -> Result<Vec<Cell<A>>> {
    let mut cells = Vec::with_capacity(accs.len());
    for (ri, row) in rows.iter().enumerate() {
        for (oi, out) in outs.iter().enumerate() {
            cells.push(Cell {
                row: *row,
                out: *out,
                acc: accs[ri * outs.len() + oi],
            });
        }
    }
    Ok(cells)
}

/// The factors of one reduction step of a tile: one per tile row, one per output.
pub(crate) type Factors = (Vec<Val<f32>>, Vec<Val<f32>>);

/// The factors of a tile's products at reduction index `i`: one value per tile row (`left`)
/// and one per output (`right`), emitted in that order.
pub(crate) trait TileFactors {
    /// Emits the loads (and decodes) of reduction index `i`.
    ///
    /// # Errors
    /// A helper's error.
    fn factors(&self, b: &mut KernelBuilder, i: Val<u32>) -> Result<Factors>;
}

/// `accs[ri * right.len() + oi] = sum_i left[ri] * right[oi]` over `0..len` in `order`: the
/// tile's one `accumulate`. A builder fragment in the helper calling convention: the kernel
/// language's `#[accumulate]` loop names a fixed list of accumulators, a tile has a
/// build-time number (`tm * tn`) of them.
///
/// # Errors
/// The factors' error.
pub(crate) fn accumulate_tile(
    b: &mut KernelBuilder,
    len: Val<u32>,
    order: ReduceOrder,
    accs: &[Var<f32>],
    factors: &impl TileFactors,
) -> Result<()> {
    dsl::accumulate(b, len, order, accs, |b, i| {
        let (left, right) = factors.factors(b, i)?;
        let mut pairs = Vec::with_capacity(left.len() * right.len());
        for x in &left {
            for y in &right {
                pairs.push((*x, *y));
            }
        }
        Ok(pairs)
    })
}

/// Stores the sums of a `[.., cols]` output tile: for each cell whose row and output both
/// exist, `acc (+ bias[out]) (+ residual[row * cols + out])` (one `f32` add each, in that
/// order) at `y[row * cols + out]`, rounded to nearest even for an `f16`/`bf16` buffer.
#[qforge_macros::func]
pub(crate) fn store_sums(
    y: Buf<Out<Float>>,
    cols: Val<u32>,
    rows: &[Row],
    outs: &[Row],
    accs: &[Var<f32>],
    bias: Option<Buf<In<Float>>>,
    residual: Option<Buf<In<Float>>>,
) {
    for cell in cells(rows, outs, accs) {
        if cell.row.inside && cell.out.inside {
            #[comptime]
            let mut s = read(cell.acc);
            match bias {
                Some(bias) => {
                    s += bias[cell.out.clamped];
                }
                None => {}
            }
            match residual {
                Some(res) => {
                    s += res[cell.row.clamped * cols + cell.out.clamped];
                }
                None => {}
            }
            store_rounded(
                y,
                cell.row.clamped * cols + cell.out.clamped,
                s,
                Rounding::NearestEven,
            );
        }
    }
}

/// The same fragments on the IR builder, for the builder copies of the kernels that the tests
/// prove identical to the kernel-language ones (the families' `reference.rs`).
#[cfg(test)]
pub(crate) mod builder {
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
        /// The tile's first row (`tile * size`, unclamped).
        pub(crate) first: Value,
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
                TileRow {
                    clamped,
                    inside,
                    first,
                }
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
    /// `value(b, at, r, o)` (with `at = ri * outs.len() + oi`, the output's index in the tile)
    /// is stored at `out[r * cols + o]`, rounded to nearest even for an `f16`/`bf16` buffer.
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
}
