//! The tile program: a kernel of the row-chunk class (module docs) as vector ops over one grid
//! step's `R x 1` (per work item) and `R x L` (per chunk element) tiles, in program order. Both
//! printers (`text.rs`, `twin.rs`) print these ops one to one, so the twin checks exactly
//! what the Mosaic module computes. `lowering.rs` builds it from the IR, `ops.rs` lowers the
//! IR's ops.

use qforge_ir::DType;

use super::STEP_ROWS;

/// Columns of a 4-bit panel ([`WindowKind::MmPanels`]): the input gradient's layout,
/// `qforge_kernels::matmul4::DX_PANEL`.
pub(super) const PANEL: u32 = 32;
/// Bytes of a panel's row: [`PANEL`] 4-bit codes.
pub(super) const PANEL_BYTES: u32 = PANEL / 2;

/// The shape of a value in one grid step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) enum Shape {
    /// The same in every lane (a constant): emitted at the shape of its use.
    Uniform,
    /// One element per work item: `R x 1`.
    Row,
    /// One element per chunk position of each work item: `R x W`.
    Chunk,
    /// Two elements per chunk position, `2i` and `2i + 1` side by side: `R x 2W` (an
    /// [`VOp::Interleave`] and the stores of a pairs window, the load of a pairs window read
    /// by the loop, and a reduction of it over the chunk's `2W` elements).
    Pairs,
    /// A work item's whole chunk, `R x C` even where a step takes `L < C` lanes of it: only
    /// a whole-chunk window's load, the ops before its [`VOp::MaxLanes`] and that reduction's
    /// operand have it.
    Whole,
    /// A work item's `2C` pairs, `R x 2C` even where a step takes `2L < 2C` lanes of them: a
    /// reduction over the pairs of a lane-blocked chunk (as `Whole` for a chunk).
    WholePairs,
    /// A matmul's activation tile, `TM x TK` (rows `m`, lanes `k`).
    XTile,
    /// A matmul's output tile, `TM x TN` (rows `m`, lanes `n`): the partial sums and the
    /// values computed from the total.
    Acc,
    /// One value per weight row `n` of a matmul's step, `TN x 1`.
    WRow,
    /// A weight row's absmax blocks, `TN x (K >> s)` (the whole row of blocks).
    WBlocks,
    /// A matmul's weight tile, `TN x TW` (rows `n`, lanes `k`; with two elements per byte,
    /// lane `i` of half `h` is `k = 2i + h` and `TW = TK / 2`).
    WTile,
}

/// The element type of a vector value: `u32`/`i32` values are signless `i32` lanes (the op
/// says how they are read), `bool` is `i1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Elt {
    I32,
    F32,
    I1,
}

/// A binary lane-wise op (integer ops wrap; shift amounts are below 32).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Bin {
    AddI,
    SubI,
    MulI,
    AndI,
    OrI,
    XorI,
    Shl,
    ShrU,
    ShrS,
    AddF,
    SubF,
    MulF,
}

/// A comparison: `U`/`S` integer orders, `O` ordered float compares (false with a NaN; Mosaic
/// has no unordered ones: the IR's float `ne` is `not oeq`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pred {
    Eq,
    Ne,
    Ult,
    Ule,
    Ugt,
    Uge,
    Slt,
    Sle,
    Sgt,
    Sge,
    Oeq,
    Olt,
    Ole,
    Ogt,
    Oge,
}

/// One vector op; operands are earlier ops' indices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum VOp {
    /// The window's tile: `f32` for an `f32` buffer, otherwise the element's bits widened to
    /// `i32` (zero-extended, `i8` sign-extended).
    Load {
        window: usize,
    },
    /// `bits` in every lane, as `elt` (`f32` by its bit pattern).
    Const {
        bits: u32,
        elt: Elt,
    },
    /// A `Row` value repeated across the chunk (or its pairs).
    Broadcast(usize),
    Bin(Bin, usize, usize),
    Cmp(Pred, usize, usize),
    Select(usize, usize, usize),
    /// Reinterprets `i32` as `f32` or back.
    Bitcast(usize, Elt),
    /// Two `Chunk` values side by side in a `Pairs` value: lane `2l` is lane `l` of the
    /// first, lane `2l + 1` lane `l` of the second (a `[R, W, 2]` concatenation read as
    /// `[R, 2W]`, row-major: data movement only).
    Interleave(usize, usize),
    /// Lanes `2l + half` (`half` 0 or 1) of a `Pairs` value as a `Chunk` value: the elements
    /// at `2i` or at `2i + 1` of a pairs window read by the loop (a `[R, W, 2]` slice read as
    /// `[R, W]`: data movement only, the inverse of [`VOp::Interleave`]).
    Deinterleave(usize, u32),
    /// The largest lane of each row of a `Whole` (or `Pairs`) `i32` value read as signed, as a
    /// `Row` value (`vector.multi_reduction <maxsi>`; only over values that are not negative,
    /// so the unsigned and signed orders agree).
    MaxLanes(usize),
    /// The index of each work item (`Row`, `i32`): the step's first row plus the sublane.
    WorkItem,
    /// Each lane's position in its work item's chunk (`Chunk`, `i32`): the lane plus the
    /// step's first lane (the lane block times [`TileProgram::lanes`]).
    Lane,
    /// Entry `index` (a `Row` `i32` value below the table's length) of a `Table` window of
    /// 32-bit elements, per row, as `elt`: a one-hot compare of the index with the lanes, the
    /// entry's bits selected and the other lanes' set to the reduction's start, reduced by a
    /// max (no gather from memory).
    Gather {
        window: usize,
        index: usize,
    },
    /// A `Scalar` window's value broadcast to a `Row` value.
    Scalar {
        window: usize,
    },
    /// A matmul's weight row `n` of each sublane (`WRow`, `i32`): the step's first weight row
    /// plus the sublane.
    WeightRow,
    /// A matmul's reduction index `k` of each lane (`WTile`, `i32`): the step's first `k`
    /// plus the lane, or plus twice the lane and `half` where a byte holds two elements.
    ReductionIndex {
        half: Option<u32>,
    },
    /// A matmul's block column of each lane (`WBlocks`, `i32`): the lane (the window is the
    /// rows' whole row of blocks).
    BlockCol,
    /// Entry `index` (a node of any shape, `i32`, below the table's length) of a `Table`
    /// window, per element: a chain of selects over the entries (each broadcast), entry 0's
    /// where none matches.
    TableGather {
        window: usize,
        index: usize,
    },
    /// A matmul's output row `m` (`Acc`, `i32`).
    OutRow,
    /// A matmul's output column `n` (`Acc`, `i32`).
    OutCol,
    /// A `WBlocks` value at each lane's block (`WTile`): lane `c` takes column
    /// `(first k of the step >> s) + (c >> group)` (`group = s`, or `s - 1` where a byte holds
    /// two elements), picked by a one-hot compare per block of the step.
    Spread(usize),
    /// A value the matmul's loop provides (`Acc`): see [`Stage`].
    Staged(Stage),
    /// The byte of each element of a weight in 4-bit panels (`WTile`, `i32`): column `n` of
    /// the weight tile from panel `n / 32`'s byte `(n % 32) / 2` of row `k` (an
    /// `MmPanels` window: each panel's `TK x 16` bytes turned, their rows repeated twice).
    PanelBytes {
        window: usize,
    },
    /// Each element's entry of a per-column-block buffer (`WTile`, the raw load): row `n >>
    /// t` of an `MmColBlocks(t)` window, repeated over its `2^t` columns.
    ColScales {
        window: usize,
    },
}

/// The values of a matmul's reduction loop (`super::matmul`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Stage {
    /// Element `k`'s activation column `x[:, k]` broadcast along the lanes.
    X,
    /// Element `k`'s weight row `w[:, k]` broadcast along the sublanes.
    W,
    /// Partial `k % ways` before element `k`.
    Partial,
    /// The total: the partials combined by the halving tree.
    Total,
}

/// A buffer as a 2-D array of the tile program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Window {
    /// Parameter index.
    pub param: usize,
    /// Parameter name.
    pub name: String,
    /// Element dtype.
    pub dtype: DType,
    /// Columns of the array: 1 (one element per work item), the chunk width `W`, or `2W` for
    /// a pairs window (written at `2i` and `2i + 1`, as unpacked 4-bit codes are).
    pub width: u32,
    /// The buffer's element count: the array holds it flat, padded with zeros to
    /// `rows x width`.
    pub elements: usize,
    /// Whether the program reads it (an input of the Mosaic function).
    pub read: bool,
    /// Whether the program writes it (an output).
    pub written: bool,
    /// How each step sees the array.
    pub kind: WindowKind,
}

/// How a grid step sees an array (its block and index map).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WindowKind {
    /// `[rows, 1]`, one element per work item: the step's `R x 1` rows.
    Row,
    /// `[rows, C]`: the step's rows, `L` lanes of them per lane block.
    Chunk,
    /// `[rows, 2C]`, written at `2i` and `2i + 1`: the step's rows, `2L` lanes.
    Pairs,
    /// `[rows, C]`: the step's rows' whole chunk (`R x C`, a reduction's window, beside the
    /// buffer's chunk window when a step takes fewer lanes).
    Whole,
    /// `[rows, 2C]`: the step's rows' whole pairs (`R x 2C`, a reduction's window beside the
    /// buffer's pairs window, read at `2i` and `2i + 1`, when a step takes fewer lanes).
    WholePairs,
    /// `[1, C]`: a buffer of one element per chunk position, read at a row loop's index `j`
    /// (LLM.int8's outlier columns): every step's `1 x L` block of it, broadcast to the rows.
    Cols,
    /// `[1, n]`: the whole buffer in every step, read at indices computed per work item
    /// (`VOp::Gather`).
    Table,
    /// `[1, 1]`: a scalar parameter's value (`f32`, `u32` or `i32`), the same in every step.
    Scalar,
    /// A matmul's activations `[M, K]`: block `TM x TK` at `(i, l)` of grid step `(i, j, l)`.
    MmX,
    /// A matmul's weight read per element or per byte, `[N, K >> s]`: block `TN x (TK >> s)`
    /// at `(j, l)`.
    MmWeight,
    /// A matmul's weight blocks (its absmax), `[N, K >> s]`: block the rows' whole row at
    /// `(j, 0)`.
    MmBlocks,
    /// A matmul's per-column buffer (a bias), `[1, N]`: block `1 x TN` at `(0, j)`.
    MmCols,
    /// A matmul's output `[M, N]`: block `TM x TN` at `(i, j)`.
    MmOut,
    /// A matmul's weight in 4-bit panels (the input gradient's layout): element `(n, k)` is
    /// nibble `32 * ((n / 32) * K + k) + n % 32`, the high nibble first, so the buffer is
    /// `[ceil(N / 32), K, 16]` bytes: block `P x TK x 16` at `(j, l, 0)`, `P = TN / 32`
    /// panels.
    MmPanels,
    /// A matmul's per-column-block buffer (the input gradient's scales): entry `(n, k)` at
    /// `(n >> t) * K + k`, the buffer `[ceil(N / 2^t), K]` split into groups of `G =
    /// max(1, TN >> t)` rows, `[rows / G, G, K]`: block `1 x G x TK` holding tile `j`'s rows
    /// at step `l`.
    MmColBlocks(u32),
}

/// A value with its shape and element type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Node {
    pub op: VOp,
    pub shape: Shape,
    pub elt: Elt,
}

/// The tile program of a kernel at given launch shapes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct TileProgram {
    pub name: String,
    /// Rows of every array: the grid rounded up to [`STEP_ROWS`].
    pub rows: u32,
    /// The chunk width `W`.
    pub width: u32,
    /// The most lanes of the chunk a step takes ([`MAX_LANES`], less for a program that reads
    /// pairs).
    pub max_lanes: u32,
    pub windows: Vec<Window>,
    pub nodes: Vec<Node>,
    /// `(window, node)` in program order; a later store to a window replaces the tile.
    pub stores: Vec<(usize, usize)>,
    /// A matmul's tiles and loop (`super::matmul`); `None` for the row-chunk class.
    pub matmul: Option<MatmulPlan>,
}

/// A matmul's grid, tiles and the nodes of its parts (`super::matmul`): grid step `(i, j, l)`
/// computes output tile `(i, j)` from reduction block `l`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct MatmulPlan {
    /// The output's rows and columns and the reduction's length.
    pub m: u32,
    pub n: u32,
    pub k: u32,
    /// The tiles: `TM x TN` outputs, `TK` elements of the reduction per step.
    pub tm: u32,
    pub tn: u32,
    pub tk: u32,
    /// The partials of the reduction order (`strided W`; 1 for `sequential`).
    pub ways: u32,
    /// Whether the weight is read per byte, two elements in one (its tile is `TN x TK / 2`).
    pub halves: bool,
    /// The shift `s` of the weight's blocks (`[N, K >> s]`), if it has some.
    pub blocks_shift: Option<u32>,
    /// The activation factor (`XTile`, `f32`).
    pub x: usize,
    /// The weight factor (`WTile`, `f32`), per half.
    pub w: Vec<usize>,
    /// The nodes computed per step before the loop: `0 .. loop_start`.
    pub loop_start: usize,
    /// The new partial (the `fma`), the last of the loop body's nodes (`loop_start ..
    /// total_start`; the first three are the loop's `Staged` values).
    pub fma: usize,
    /// The nodes computed from the total at the last reduction step: `total_start ..`.
    pub total_start: usize,
}

impl Window {
    /// Whether its index map is `(r, c) -> (r, 0)`: a per-work-item or whole-chunk window.
    pub fn by_row(&self) -> bool {
        matches!(
            self.kind,
            WindowKind::Row | WindowKind::Whole | WindowKind::WholePairs
        )
    }

    /// Whether every step sees the same block, the whole array (`(r, c) -> (0, 0)`).
    pub fn fixed(&self) -> bool {
        matches!(self.kind, WindowKind::Table | WindowKind::Scalar)
    }

    /// Whether its array is one row (a table, a scalar, a `Cols` or `MmCols` window).
    pub fn one_row(&self) -> bool {
        self.fixed() || matches!(self.kind, WindowKind::Cols | WindowKind::MmCols)
    }
}

impl TileProgram {
    /// The grid: `[steps, lane_blocks]`, or a matmul's `[M / TM, N / TN, K / TK]` (each
    /// rounded up).
    pub fn grid(&self) -> Vec<u32> {
        match &self.matmul {
            Some(p) => vec![p.m.div_ceil(p.tm), p.n.div_ceil(p.tn), p.k.div_ceil(p.tk)],
            None => vec![self.steps(), self.lane_blocks()],
        }
    }

    /// Grid steps over the rows: `rows / STEP_ROWS`.
    pub fn steps(&self) -> u32 {
        self.rows / STEP_ROWS
    }

    /// Columns of a chunk window: the chunk, or [`Self::max_lanes`] when the chunk is a larger
    /// multiple of it (a value of `32 x 4096` `f32` lanes is 512 KiB, and libtpu keeps the
    /// body's values in 16 MiB of scoped VMEM).
    pub fn lanes(&self) -> u32 {
        if self.width > self.max_lanes && self.width.is_multiple_of(self.max_lanes) {
            self.max_lanes
        } else {
            self.width
        }
    }

    /// Grid steps over a chunk: `width / lanes`.
    pub fn lane_blocks(&self) -> u32 {
        self.width / self.lanes().max(1)
    }

    /// Columns of `w`'s window: 1 for a per-work-item array, [`Self::lanes`] for a chunk
    /// array, twice that for a pairs array.
    pub fn block_width(&self, w: &Window) -> u32 {
        match w.kind {
            WindowKind::Row => self.columns(Shape::Row),
            WindowKind::Chunk | WindowKind::Cols => self.columns(Shape::Chunk),
            WindowKind::Pairs => self.columns(Shape::Pairs),
            WindowKind::Whole => self.columns(Shape::Whole),
            WindowKind::WholePairs => self.columns(Shape::WholePairs),
            WindowKind::Table | WindowKind::Scalar | WindowKind::MmBlocks => w.width,
            WindowKind::MmX => self.columns(Shape::XTile),
            WindowKind::MmWeight => self.columns(Shape::WTile),
            WindowKind::MmCols | WindowKind::MmOut => self.columns(Shape::Acc),
            WindowKind::MmPanels => PANEL_BYTES,
            WindowKind::MmColBlocks(_) => self.columns(Shape::WTile),
        }
    }

    /// Rows of `w`'s block: [`STEP_ROWS`] (a matmul's `TM` or `TN`), or 1 for a table, a
    /// scalar or a `Cols` window.
    pub fn block_rows(&self, w: &Window) -> u32 {
        match w.kind {
            _ if w.one_row() => 1,
            WindowKind::MmX | WindowKind::MmOut => self.rows_of(Shape::XTile),
            WindowKind::MmWeight | WindowKind::MmBlocks => self.rows_of(Shape::WTile),
            WindowKind::MmPanels => self.columns(Shape::WTile),
            WindowKind::MmColBlocks(t) => self.col_groups(t).0,
            _ => STEP_ROWS,
        }
    }

    /// Rows of `w`'s array: [`Self::rows`] (a matmul's `M` or `N` rounded up to its tile), or
    /// 1 for a table, a scalar or a `Cols` window.
    pub fn array_rows(&self, w: &Window) -> u32 {
        match (w.kind, &self.matmul) {
            _ if w.one_row() => 1,
            (WindowKind::MmX | WindowKind::MmOut, Some(p)) => p.m.div_ceil(p.tm) * p.tm,
            (WindowKind::MmWeight | WindowKind::MmBlocks, Some(p)) => p.n.div_ceil(p.tn) * p.tn,
            (WindowKind::MmPanels, Some(p)) => p.k.div_ceil(p.tk) * p.tk,
            (WindowKind::MmColBlocks(t), _) => self.col_groups(t).0,
            _ => self.rows,
        }
    }

    /// A 3-D window's leading dimension, `(array, block)`: a matmul's panels (`[P, K, 16]`,
    /// blocks of `TN / 32` panels) or column blocks (`[rows / G, G, K]`, blocks of one
    /// group); `None` for the 2-D windows.
    pub fn lead(&self, w: &Window) -> Option<(u32, u32)> {
        let p = self.matmul.as_ref()?;
        match w.kind {
            WindowKind::MmPanels => {
                let per = p.tn.div_ceil(PANEL);
                Some((p.n.div_ceil(PANEL).div_ceil(per) * per, per))
            }
            WindowKind::MmColBlocks(t) => {
                let (g, rows) = self.col_groups(t);
                Some((rows.div_ceil(g), 1))
            }
            _ => None,
        }
    }

    /// The shape of `w`'s array: `[rows, columns]`, or a 3-D window's `[lead, rows,
    /// columns]` ([`Self::lead`]).
    pub fn array_shape(&self, w: &Window) -> Vec<u32> {
        let mut shape: Vec<u32> = self.lead(w).map(|l| l.0).into_iter().collect();
        shape.extend([self.array_rows(w), w.width]);
        shape
    }

    /// The shape of `w`'s block (`window_bounds`), as [`Self::array_shape`].
    pub fn block_shape(&self, w: &Window) -> Vec<u32> {
        let mut shape: Vec<u32> = self.lead(w).map(|l| l.1).into_iter().collect();
        shape.extend([self.block_rows(w), self.block_width(w)]);
        shape
    }

    /// An `MmColBlocks(t)` window's rows per group `G = max(1, TN >> t)` and the buffer's
    /// rows `ceil(N / 2^t)`.
    pub fn col_groups(&self, t: u32) -> (u32, u32) {
        let Some(p) = &self.matmul else {
            return (1, 1);
        };
        let rows = (u64::from(p.n).div_ceil(1u64 << t)) as u32;
        ((p.tn >> t).max(1), rows)
    }

    /// Rows of a value of `shape` in one grid step: [`STEP_ROWS`], a matmul's `TM` or `TN`.
    pub fn rows_of(&self, shape: Shape) -> u32 {
        match (shape, &self.matmul) {
            (Shape::XTile | Shape::Acc, Some(p)) => p.tm,
            (Shape::WRow | Shape::WBlocks | Shape::WTile, Some(p)) => p.tn,
            _ => STEP_ROWS,
        }
    }

    /// Columns of a value of `shape` in one grid step.
    pub fn columns(&self, shape: Shape) -> u32 {
        match shape {
            Shape::Uniform | Shape::Row => 1,
            Shape::Chunk => self.lanes(),
            Shape::Pairs => 2 * self.lanes(),
            Shape::Whole => self.width,
            Shape::WholePairs => 2 * self.width,
            Shape::XTile | Shape::Acc | Shape::WRow | Shape::WBlocks | Shape::WTile => {
                let Some(p) = &self.matmul else { return 1 };
                match shape {
                    Shape::XTile => p.tk,
                    Shape::Acc => p.tn,
                    Shape::WRow => 1,
                    Shape::WBlocks => p.k >> p.blocks_shift.unwrap_or(0),
                    _ => p.tk >> u32::from(p.halves),
                }
            }
        }
    }
}

/// The widest chunk window.
pub(super) const MAX_LANES: u32 = 512;
