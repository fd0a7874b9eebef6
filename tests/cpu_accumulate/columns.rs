//! The column-lanes plan of a `sequential` accumulate on the Cranelift device
//! (`codegen/src/cranelift/accumulate_columns.rs`: runs of 4 accumulators as one `f32x4`), on the
//! dense products' tile and its edges: columns clamped at the end (not consecutive), a row
//! stride below the tile's width, a short buffer (the proof fails and the checked loop reports),
//! `bf16` columns (one widened 8-byte load) and `f16` ones (no run), a transposed row factor (a
//! strided load proven in range), factors in either order, variables shared by accumulators, a
//! row `i * s + o` (a dense product's `B` in panels).

use proptest::prelude::*;
use qforge::ir::{
    Access, DType, Dim, Kernel, KernelBuilder, OwnedArg, ReduceOrder, Scalar, ScalarType, Value,
};

use super::{check, encode, le_f32, values};

/// How the test kernel is built (see [`column_kernel`]).
#[derive(Clone, Copy, Debug)]
struct Shape {
    rows: u32,
    cols: u32,
    /// dtype of `b`.
    bdt: DType,
    /// `a` stored `[n, m]` (a strided load) instead of `[m, n]`.
    transposed: bool,
    /// The column load as the first factor.
    swap: bool,
    /// 0: a variable per accumulator; 1: one per group of 4 columns; 2: one per column.
    share: u32,
    /// The column loads at `i * s + o + c_j` (`o` a parameter, [`OFFSET`]) instead of `i * s +
    /// c_j`: `B` in panels.
    offset: bool,
}

/// The parameter `o` of a kernel whose shape has `offset`.
const OFFSET: u32 = 5;

/// `out[(g*rows + r)*cols + j] = sum over i < n (sequential) of A(g*rows + r, i) * b[i*s (+ o) + c_j]`
/// for work item `g`, `c_j = min(g*cols + j, last)` (a tile's columns clamped to the last one,
/// as the library's tiles are), `A(p, i) = a[p*n + i]` or, transposed, `a[i*m + p]`, and `b` of
/// `bdt` widened; then every variable stored in accumulator order.
fn column_kernel(sh: Shape) -> Kernel {
    let name = format!(
        "columns_{}x{}_{}_{}_{}_{}_{}",
        sh.rows, sh.cols, sh.bdt, sh.transposed, sh.swap, sh.share, sh.offset
    );
    let mut b = KernelBuilder::new(&name);
    let [n, s, o, last, m, la, lb, items] = ["n", "s", "o", "last", "m", "la", "lb", "items"]
        .map(|p| b.scalar_param(p, ScalarType::U32));
    let a = b.buffer_param("a", DType::F32, &[Dim::Param(la)], Access::Read);
    let bb = b.buffer_param("b", sh.bdt, &[Dim::Param(lb)], Access::Read);
    let per_item = sh.rows * sh.cols;
    let out = b.buffer_param(
        "out",
        DType::F32,
        &[Dim::Param(items), Dim::Const(per_item)],
        Access::Write,
    );
    b.set_grid(Dim::Param(items));
    let g = b.work_item();
    let (cv, rv) = (b.const_u32(sh.cols), b.const_u32(sh.rows));
    let (col0, row0) = (b.mul(g, cv), b.mul(g, rv));
    let lastv = b.param(last);
    let cols: Vec<Value> = (0..sh.cols)
        .map(|j| {
            let jv = b.const_u32(j);
            let c = b.add(col0, jv);
            b.min(c, lastv)
        })
        .collect();
    let rows: Vec<Value> = (0..sh.rows)
        .map(|r| {
            let r = b.const_u32(r);
            b.add(row0, r)
        })
        .collect();
    let own: Vec<_> = (0..per_item)
        .map(|t| b.var(&format!("acc{t}"), ScalarType::F32))
        .collect();
    let vars: Vec<_> = (0..per_item as usize)
        .map(|t| match sh.share {
            1 => own[t & !3],
            2 => own[t % sh.cols as usize],
            _ => own[t],
        })
        .collect();
    let (nv, sv, mv, ov) = (b.param(n), b.param(s), b.param(m), b.param(o));
    let row_starts: Vec<Value> = rows.iter().map(|p| b.mul(*p, nv)).collect();
    b.accumulate(nv, ReduceOrder::Sequential, &vars, |b, i| {
        let mut at_row = b.mul(i, sv);
        if sh.offset {
            at_row = b.add(at_row, ov);
        }
        let bv: Vec<Value> = cols
            .iter()
            .map(|c| {
                let at = b.add(at_row, *c);
                b.load(bb, at)
            })
            .collect();
        let av: Vec<Value> = (0..rows.len())
            .map(|r| {
                let at = if sh.transposed {
                    let im = b.mul(i, mv);
                    b.add(im, rows[r])
                } else {
                    b.add(row_starts[r], i)
                };
                b.load(a, at)
            })
            .collect();
        av.iter()
            .flat_map(|x| {
                bv.iter()
                    .map(|y| if sh.swap { (*y, *x) } else { (*x, *y) })
                    .collect::<Vec<_>>()
            })
            .collect()
    });
    let pv = b.const_u32(per_item);
    let base = b.mul(g, pv);
    for (t, v) in own.iter().enumerate() {
        let tv = b.const_u32(t as u32);
        let at = b.add(base, tv);
        let x = b.read_var(*v);
        b.store(out, at, x);
    }
    b.finish()
}

/// The arguments for `items` work items, `n` steps, `ncols` columns of row stride `s`, `a`
/// `short_a` elements shorter than the kernel reads and `b` `short_b` shorter (negative: longer,
/// so that a run of clamped columns lies inside it).
#[allow(clippy::too_many_arguments)]
fn column_args(
    sh: Shape,
    items: u32,
    n: u32,
    ncols: u32,
    s: u32,
    (short_a, short_b): (u32, i32),
    seed: u32,
    edges: u32,
) -> Vec<OwnedArg> {
    let m = items * sh.rows;
    let la = (m * n).saturating_sub(short_a);
    let o = if sh.offset { OFFSET } else { 0 };
    let lb = (n.saturating_sub(1) * s + o + ncols).saturating_add_signed(-short_b);
    [n, s, o, ncols - 1, m, la, lb, items]
        .map(|v| OwnedArg::Scalar(Scalar::U32(v)))
        .into_iter()
        .chain([
            OwnedArg::Read(le_f32(&values(la as usize, seed, edges))),
            OwnedArg::Read(encode(sh.bdt, &values(lb as usize, seed ^ 0x3c3c, edges))),
            OwnedArg::Write(vec![0xA5; 4 * (items * sh.rows * sh.cols) as usize]),
        ])
        .collect()
}

const SHAPE: Shape = Shape {
    rows: 2,
    cols: 8,
    bdt: DType::F32,
    transposed: false,
    swap: false,
    share: 0,
    offset: false,
};

#[test]
fn column_runs_and_their_edges_match_the_interpreter() {
    // (shape, items, n, ncols, s, shorts): whole tiles; the last tile clamped (its run of
    // clamped columns inside `b` or not); a stride below the tile's width (columns overlap the
    // next row, still consecutive); one element short in each buffer; no step; one step.
    let with = |f: fn(&mut Shape)| {
        let mut sh = SHAPE;
        f(&mut sh);
        sh
    };
    let bf16 = with(|s| s.bdt = DType::BF16);
    let transposed = with(|s| s.transposed = true);
    let offset = with(|s| s.offset = true);
    let cases = [
        (SHAPE, 3, 37, 24, 24, (0, 0)),
        (SHAPE, 3, 37, 21, 21, (0, 0)),
        (SHAPE, 3, 37, 21, 21, (0, -8)),
        (SHAPE, 2, 9, 16, 5, (0, 0)),
        (SHAPE, 3, 37, 24, 24, (0, 1)),
        (SHAPE, 3, 37, 24, 24, (1, 0)),
        (SHAPE, 2, 0, 16, 16, (0, 0)),
        (SHAPE, 2, 1, 16, 16, (0, 0)),
        (bf16, 3, 37, 24, 24, (0, 0)),
        (bf16, 3, 37, 24, 24, (0, 1)),
        (with(|s| s.bdt = DType::F16), 3, 37, 24, 24, (0, 0)),
        (transposed, 3, 37, 24, 24, (0, 0)),
        (transposed, 3, 37, 24, 24, (1, 0)),
        (
            with(|s| (s.swap, s.rows, s.cols) = (true, 3, 4)),
            3,
            20,
            12,
            12,
            (0, 0),
        ),
        (with(|s| s.share = 1), 3, 20, 24, 24, (0, 0)),
        (with(|s| s.share = 2), 3, 20, 24, 24, (0, 0)),
        (offset, 3, 37, 24, 24, (0, 0)),
        (offset, 3, 37, 21, 21, (0, 0)),
        (offset, 3, 37, 24, 24, (0, 1)),
    ];
    for (i, (sh, items, n, ncols, s, shorts)) in cases.into_iter().enumerate() {
        let kernel = column_kernel(sh);
        // Plain values (a NaN would hide a wrong lane), then with edge values.
        for edges in [0, 7] {
            let args = column_args(sh, items, n, ncols, s, shorts, 17 + i as u32, edges);
            check(&kernel, &args);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn random_column_tiles_match_the_interpreter(
        rows in 1u32..4,
        cols in prop_oneof![Just(4u32), Just(8), Just(6)],
        bdt in prop_oneof![Just(DType::F32), Just(DType::BF16), Just(DType::F16)],
        transposed in any::<bool>(),
        swap in any::<bool>(),
        share in 0u32..3,
        offset in any::<bool>(),
        items in 1u32..4,
        n in 0u32..40,
        ncols in 1u32..30,
        extra in prop_oneof![Just(0u32), 0u32..9],
        shorts in prop_oneof![Just((0u32, 0i32)), (0u32..2, -8i32..3)],
        seed in any::<u32>(),
        edges in prop_oneof![Just(0u32), 2u32..9],
    ) {
        let sh = Shape { rows, cols, bdt, transposed, swap, share, offset };
        let s = ncols + extra;
        check(&column_kernel(sh), &column_args(sh, items, n, ncols, s, shorts, seed, edges));
    }
}
