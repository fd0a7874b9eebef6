//! Row loops and element-wise kernels: the row-chunk class over `[R, P]` buffers with one row
//! per work item (LLM.int8's row-wise kernels), found before the statements are lowered.

use qforge_ir::{BinaryOp, CmpOp, Dim, Op, ParamId, ParamKind, Stmt, Value};

use super::{has_loop, refuse, ChunkLoop, Lowering, STEP_ROWS};
use crate::error::Result;

/// A value of an element-wise kernel's work item `w` (one work item per element of `[R, P]`
/// buffers), seen in the tile program whose rows are the buffers' rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Alias {
    /// `w` itself: the element, row `r` and lane `j` at `r * C + j`.
    Element,
    /// `w / P`: the row, the tile program's work item.
    Row,
    /// `w - (w / P) * P`: the column, the lane.
    Col,
}

impl Lowering<'_> {
    /// A row loop `for j in 0..P` (step 1) whose body reads or writes element `w * P + j` of a
    /// buffer `[R, P]` with one row per work item: its bounds, `C` the row length
    /// ([`Self::row_length`]).
    pub(super) fn row_bounds(
        &self,
        index: Value,
        start: Value,
        end: Value,
        body: &[Stmt],
    ) -> Option<ChunkLoop> {
        let limit = self.param_of(end)?;
        if self.const_u32(start) != Some(0) || self.shapes.grid == 0 {
            return None;
        }
        let mut row_start = None;
        self.element_indices(body, &mut |l: &Self, at: Value| {
            if let Ok(Op::Binary(BinaryOp::Add, a, b)) = l.def(at) {
                for (x, j) in [(*a, *b), (*b, *a)] {
                    if j == index && l.row_start(x) == Some(limit) {
                        row_start.get_or_insert(x);
                    }
                }
            }
        });
        let start = row_start?;
        let rows = self
            .k
            .params
            .iter()
            .find_map(|(_, param)| match &param.kind {
                ParamKind::Buffer { shape, .. }
                    if shape.len() == 2 && shape[1] == Dim::Param(limit) =>
                {
                    match shape[0] {
                        Dim::Param(r) => Some(r),
                        Dim::Const(_) => None,
                    }
                }
                _ => None,
            })?;
        let chunk = self.row_length(rows, limit)?;
        Some(ChunkLoop {
            chunk,
            limit,
            start,
            end,
            row: true,
            element_rows: None,
        })
    }

    /// `Some(P)` when `v` is `w * P` for the work item `w` and a parameter `P`.
    pub(super) fn row_start(&self, v: Value) -> Option<ParamId> {
        match self.def(v).ok()? {
            Op::Binary(BinaryOp::Mul, a, b) if self.at_work_item(*a) => self.param_of(*b),
            Op::Binary(BinaryOp::Mul, a, b) if self.at_work_item(*b) => self.param_of(*a),
            _ => None,
        }
    }

    /// Calls `f` with the index of every load and store in `body`, nested blocks included.
    pub(super) fn element_indices(&self, body: &[Stmt], f: &mut dyn FnMut(&Self, Value)) {
        for stmt in body {
            match stmt {
                Stmt::Let(v) => {
                    if let Ok(Op::Load { index, .. }) = self.def(*v) {
                        f(self, *index);
                    }
                }
                Stmt::Store { index, .. } => f(self, *index),
                Stmt::If {
                    then_body,
                    else_body,
                    ..
                } => {
                    self.element_indices(then_body, f);
                    self.element_indices(else_body, f);
                }
                Stmt::For { body, .. } => self.element_indices(body, f),
                _ => {}
            }
        }
    }

    /// An element-wise kernel over `[R, P]` buffers: one work item `w` per element, `if w / P <
    /// R && w - (w / P) * P < P { .. }` at the top level after `let`s, and no loop. Its tile
    /// program takes the buffers' rows as its rows and `C` = `P`'s value (from a `[P]` or an
    /// `[R]` buffer) as the chunk: `w` is element `j` of row `r`, `w / P` the row, and the
    /// column `j`. The guard holds for every element of the buffers, and the other lanes and
    /// rows of the tiles are the arrays' padding, so its body runs unguarded, as a loop body.
    pub(super) fn find_elements(&mut self, body: &[Stmt]) -> Result<()> {
        if has_loop(body) {
            return Ok(());
        }
        let guard = body.iter().find_map(|s| match s {
            Stmt::If {
                cond, else_body, ..
            } if else_body.is_empty() => Some(*cond),
            _ => None,
        });
        let Some(guard) = guard else {
            return Ok(());
        };
        let Ok(Op::Binary(BinaryOp::And, a, b)) = self.def(guard) else {
            return Ok(());
        };
        let row_below = |l: &Self, c: Value| match l.def(c) {
            Ok(Op::Cmp(CmpOp::Lt, x, r)) => l.row_of(*x).zip(l.param_of(*r)),
            _ => None,
        };
        let col_below = |l: &Self, c: Value| match l.def(c) {
            Ok(Op::Cmp(CmpOp::Lt, x, p)) => l.col_of(*x).filter(|&q| l.param_of(*p) == Some(q)),
            _ => None,
        };
        let (rows, cols) = match (row_below(self, *a), col_below(self, *b)) {
            (Some((p, r)), Some(q)) if p == q => (r, p),
            _ => match (row_below(self, *b), col_below(self, *a)) {
                (Some((p, r)), Some(q)) if p == q => (r, p),
                _ => return Ok(()),
            },
        };
        let Some(chunk) = self.row_length(rows, cols) else {
            return Err(refuse(
                self.k,
                &format!(
                    "an element-wise kernel whose row length {} no buffer gives",
                    self.param_name(cols)
                ),
            ));
        };
        for (v, def) in self.k.values.iter() {
            let alias = match def.op {
                Op::WorkItem => Some(Alias::Element),
                _ if self.row_of(v) == Some(cols) => Some(Alias::Row),
                _ if self.col_of(v) == Some(cols) => Some(Alias::Col),
                _ => None,
            };
            if let Some(a) = alias {
                self.aliases.insert(v.index(), a);
            }
        }
        if !self.shapes.grid.is_multiple_of(chunk) {
            return Err(refuse(
                self.k,
                &format!(
                    "an element-wise grid of {} work items, not whole rows of {chunk}",
                    self.shapes.grid
                ),
            ));
        }
        // At most the grid's rows rounded up, which `tile_program` checked fit in 32 bits.
        let grid_rows = self.shapes.grid / chunk;
        self.program.rows = grid_rows.div_ceil(STEP_ROWS).max(1) * STEP_ROWS;
        self.program.width = chunk;
        self.element_guard = Some(guard);
        self.chunk = Some(ChunkLoop {
            chunk,
            limit: cols,
            start: guard,
            end: guard,
            row: true,
            element_rows: Some(rows),
        });
        Ok(())
    }

    /// The value of the row length `P` of `[R, P]` buffers, from the launch's element counts: a
    /// `[P]` buffer's, else an `[R, P]` buffer's over an `[R]` buffer's (`None` when neither
    /// gives it, or it is 0).
    fn row_length(&self, rows: ParamId, cols: ParamId) -> Option<u32> {
        let sized = |d: &[Dim]| {
            self.k
                .params
                .iter()
                .find_map(|(p, param)| match &param.kind {
                    ParamKind::Buffer { shape, .. } if shape.as_slice() == d => {
                        self.shapes.elements.get(p.index()).copied()
                    }
                    _ => None,
                })
        };
        let length = match (sized(&[Dim::Param(cols)]), sized(&[Dim::Param(rows)])) {
            (Some(c), _) => Some(c),
            (None, Some(r)) if r > 0 => sized(&[Dim::Param(rows), Dim::Param(cols)])
                .filter(|e| e % r == 0)
                .map(|e| e / r),
            _ => None,
        };
        length
            .and_then(|c| u32::try_from(c).ok())
            .filter(|&c| c > 0)
    }

    /// `Some(P)` when `v` is `w / P` for the work item `w` and a parameter `P`.
    pub(super) fn row_of(&self, v: Value) -> Option<ParamId> {
        match self.def(v).ok()? {
            Op::Binary(BinaryOp::Div, w, p) if matches!(self.def(*w), Ok(Op::WorkItem)) => {
                self.param_of(*p)
            }
            _ => None,
        }
    }

    /// `Some(P)` when `v` is `w - (w / P) * P` (either product order).
    pub(super) fn col_of(&self, v: Value) -> Option<ParamId> {
        let Op::Binary(BinaryOp::Sub, w, prod) = self.def(v).ok()? else {
            return None;
        };
        if !matches!(self.def(*w), Ok(Op::WorkItem)) {
            return None;
        }
        match self.def(*prod).ok()? {
            Op::Binary(BinaryOp::Mul, r, p) | Op::Binary(BinaryOp::Mul, p, r)
                if self
                    .row_of(*r)
                    .is_some_and(|q| self.param_of(*p) == Some(q)) =>
            {
                self.row_of(*r)
            }
            _ => None,
        }
    }
}
