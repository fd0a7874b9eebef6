//! The leaves of a matmul's parts (`super`): what the weight's loads read, what its and the
//! epilogue's per-work-item values are, and how the lowering takes them.

use std::collections::{HashMap, HashSet};

use qforge_ir::{Access, Kernel, Op, ParamId, ParamKind, Stmt, Value};

use super::launch::{fit, Eval, Fit, Item, Outputs};
use super::statements::{affine, collect_leaves, index_form, Statements};
use super::TK;
use crate::error::Result;
use crate::mosaic::lowering::Lowering;
use crate::mosaic::ops::elt_of;
use crate::mosaic::refuse;
use crate::mosaic::tile::{
    Bin, Elt, Shape, TileProgram, VOp, Window, WindowKind, PANEL, PANEL_BYTES,
};

/// Which part of the program is being lowered, and so what its leaves stand for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::mosaic) enum Domain {
    /// The weight element `w(n, k)`: per-work-item values are functions of `n`; `half` is the
    /// half of each byte the lanes hold where the weight is read per byte.
    Weight { half: Option<u32> },
    /// The epilogue: the total, and per-work-item values of `m` and `n`.
    Out,
}

/// What a load at an index that depends on `k` reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Form {
    /// `w[n * K + k]`: one element per `k`.
    Element,
    /// `w[(n * K + k) >> 1]`: a byte of two elements.
    Byte,
    /// `w[(n * K + k) >> s]`: one element per block of `2^s` (`s >= 2`).
    Blocks(u32),
    /// A 32-bit table (`[1, len]`, whole in every step) read at a computed index, at most
    /// the bound: a nested absmax's code (at an 8-bit code, 255), or its absmax per 256
    /// blocks (at `(n * K + k) >> s`, `(N * K - 1) >> s`).
    Gather(u64),
    /// `w[(32 * ((n >> 5) * K + k) + (n & 31)) >> 1]`: a byte of the 4-bit panels of the
    /// input gradient's layout ([`WindowKind::MmPanels`]).
    Panel,
    /// `w[(n >> t) * K + k]`: one element per `2^t` columns of each `k` (the input
    /// gradient's scales, [`WindowKind::MmColBlocks`]).
    ColBlocks(u32),
}

/// The leaves of the part being lowered (see [`Domain`]).
#[derive(Clone)]
pub(in crate::mosaic) struct Part {
    pub(super) domain: Domain,
    /// The reduction's index.
    pub(super) k: Value,
    /// The values that depend on it.
    pub(super) on_k: std::rc::Rc<HashSet<usize>>,
    /// Accumulator 0's variable: the total, in the epilogue.
    pub(super) total_var: usize,
    /// The node of the total.
    pub(super) total: usize,
    /// Accumulator 0's per-work-item values (defined outside the `accumulate`) as functions
    /// of `(m, n)`.
    pub(super) fits: HashMap<usize, Fit>,
    /// Accumulator 0's weight loads.
    pub(super) forms: HashMap<usize, Form>,
    /// The launch's integer scalars: constants of the module.
    pub(super) scalars: Vec<Option<u32>>,
    /// The shift of the weight's blocks and `K >> s`.
    pub(super) blocks: Option<(u32, u32)>,
}

/// Whether `p` is an unsigned 8-bit buffer (its values index a table of 256).
fn byte_buffer(k: &Kernel, p: ParamId) -> bool {
    matches!(&k.params[p].kind, ParamKind::Buffer { dtype, .. } if *dtype == qforge_ir::DType::U8)
}

/// How accumulator 0's leaves are read: each weight load's form, each per-work-item value's
/// fit, the weight's blocks (the finest shift of a load at `(n * K + k) >> s`) and whether it
/// is read per byte.
pub(super) struct Leaves {
    pub(super) fits: HashMap<usize, Fit>,
    pub(super) forms: HashMap<usize, Form>,
    pub(super) primary: Option<u32>,
    pub(super) halves: bool,
}

/// Classifies accumulator 0's leaves (its weight's and epilogue's), each per-work-item value
/// fitted over every accumulator's outputs (`pairs`, `same::same_functions`).
pub(super) fn classify(
    k: &Kernel,
    f: &Statements<'_>,
    out: &Outputs,
    pairs: &HashMap<usize, Vec<(usize, Value)>>,
    eval: &mut Eval<'_>,
) -> Result<Leaves> {
    let kk = out.kk;
    // Accumulator 0's leaves: weight loads, and per-work-item values fitted over all
    // accumulators.
    let mut leaves = Vec::new();
    let mut seen = HashSet::new();
    collect_leaves(k, f.accs[0].2, f, &mut leaves, &mut seen);
    for s in f.epilogues[0].1 {
        if let Stmt::Store { value, .. } = s {
            collect_leaves(k, *value, f, &mut leaves, &mut seen);
        }
    }
    let mut fits = HashMap::new();
    // Each weight load's form, one over every accumulator's outputs: its `i`-th load is
    // where accumulator 0's is (`same::same_functions` compared them op by op).
    let by_acc: Vec<(usize, Vec<Value>)> = (0..f.accs.len())
        .filter(|&t| !out.items[t].is_empty())
        .map(|t| (t, weight_loads(k, f.accs[t].2, f)))
        .collect();
    let mut forms: HashMap<usize, Form> = HashMap::new();
    for (i, &l0) in weight_loads(k, f.accs[0].2, f).iter().enumerate() {
        let ith: Vec<(usize, Value)> = by_acc
            .iter()
            .filter_map(|(t, l)| Some((*t, *l.get(i)?)))
            .collect();
        forms.insert(l0.index(), load_form(k, f, &ith, out, eval)?);
    }
    // The weight's blocks: the finest of its loads at `(n * K + k) >> s`, `s >= 2`; coarser
    // ones (a nested absmax per 256 blocks) are gathers at a block's index.
    let primary = forms
        .values()
        .filter_map(|f| match f {
            Form::Blocks(s) => Some(*s),
            _ => None,
        })
        .min();
    for form in forms.values_mut() {
        if let Form::Blocks(s) = *form {
            if Some(s) != primary {
                *form = Form::Gather((u64::from(out.n) * u64::from(kk) - 1) >> s);
            } else if !kk.is_multiple_of(1 << s) || !TK.is_multiple_of(1 << s) {
                return Err(refuse(
                    k,
                    &format!(
                        "a weight read per block of 2^{s} elements where the reduction is \
                         K = {kk} (a block must divide K, and {TK})"
                    ),
                ));
            }
        }
    }
    for &v in &leaves {
        if let Op::Load { .. } = k.values[v].op {
            if !forms.contains_key(&v.index()) {
                return Err(refuse(
                    k,
                    "a matmul epilogue reading a buffer per element of k",
                ));
            }
        } else {
            let points: Vec<(Item, u32)> = pairs
                .get(&v.index())
                .map(Vec::as_slice)
                .unwrap_or(&[])
                .iter()
                .flat_map(|&(t, b)| out.items[t].iter().map(move |it| (*it, b)))
                .map(|(it, b)| eval.at(b, it.w).map(|x| (it, x)))
                .collect::<Option<_>>()
                .unwrap_or_default();
            let fit = fit(&points).ok_or_else(|| {
                refuse(
                    k,
                    &format!(
                        "the per-work-item value %{} of a matmul, which is not a * m + b or a * (n >> s) + b",
                        v.index()
                    ),
                )
            })?;
            fits.insert(v.index(), fit);
        }
    }
    let halves = forms.values().any(|f| *f == Form::Byte);
    if halves && forms.values().any(|f| *f == Form::Element) {
        return Err(refuse(k, "a weight read both per element and per byte"));
    }
    if halves
        && forms
            .values()
            .any(|f| matches!(f, Form::Panel | Form::ColBlocks(_)))
    {
        return Err(refuse(
            k,
            "a weight read per byte of its rows and per panel or column block",
        ));
    }
    if halves && out.kk % 2 == 1 {
        return Err(refuse(
            k,
            &format!("a weight read per byte with an odd reduction K = {kk}"),
        ));
    }
    Ok(Leaves {
        fits,
        forms,
        primary,
        halves,
    })
}

/// The loads of `v`'s expression at indices that depend on `k` (depth first, each once),
/// those in other loads' indices included.
fn weight_loads(k: &Kernel, v: Value, f: &Statements<'_>) -> Vec<Value> {
    let mut out = Vec::new();
    let mut stack = vec![v];
    let mut seen = HashSet::new();
    while let Some(v) = stack.pop() {
        if !seen.insert(v.index()) || f.k_free(v) {
            continue;
        }
        if let Op::Load { .. } = k.values[v].op {
            out.push(v);
        }
        stack.extend(k.values[v].op.operands().into_iter().rev());
    }
    out
}

/// The form of a weight load, `loads` its value in each accumulator: from its index as an
/// [`Affine`] in `k`, whose base (its value at `k = 0`) is checked at every accumulator's
/// every output against the form's; an index that is not affine must be an 8-bit code (a
/// table of 256).
fn load_form(
    k: &Kernel,
    f: &Statements<'_>,
    loads: &[(usize, Value)],
    out: &Outputs,
    eval: &mut Eval<'_>,
) -> Result<Form> {
    let k_free = |x: Value| f.k_free(x);
    let kk = u64::from(out.kk);
    // Which forms every output's base fits so far (`chunks`: bit `t` for `(n >> t) * K`),
    // and the largest index read.
    let (mut row, mut panel, mut chunks, mut bound) = (true, true, !1u32, 0u64);
    let mut form = None;
    for &(t, v) in loads {
        let Op::Load { index, .. } = k.values[v].op else {
            unreachable!("weight_loads gives loads")
        };
        let Some(aff) = affine(k, index, f.k_index, &k_free, eval.scalars()) else {
            return match k.values[index].op {
                Op::Load { buf, .. } if byte_buffer(k, buf) => Ok(Form::Gather(255)),
                _ => Err(refuse(
                    k,
                    "a weight read at an index the lowering cannot bound (a buffer is read at \
                     an affine function of k, or a table at an 8-bit code)",
                )),
            };
        };
        for it in &out.items[t] {
            let b = aff
                .base(eval, it.w)
                .ok_or_else(|| refuse(k, "a weight index not computed from the work item"))?;
            let (n, b) = (u64::from(it.n), u64::from(b));
            // The index before the shift, at the reduction's last element, without wrapping.
            let last = b + u64::from(aff.a) * (kk - 1);
            if last >> 32 != 0 {
                return Err(refuse(
                    k,
                    &format!("a weight index past 2^32 at output column {n} (a reduction of {kk})"),
                ));
            }
            bound = bound.max(last >> aff.shift);
            row &= b == n * kk;
            panel &= b == 32 * (n >> 5) * kk + (n & 31);
            for c in 1..32 {
                if chunks >> c & 1 == 1 && b != (n >> c) * kk {
                    chunks &= !(1 << c);
                }
            }
        }
        form = Some((aff.a, aff.shift));
    }
    let (a, shift) = form.expect("an accumulator with outputs (`launch::outputs`)");
    Ok(match (a, shift) {
        (1, 0) if row => Form::Element,
        (1, 1) if row => Form::Byte,
        (1, s) if row => Form::Blocks(s),
        (32, 1) if panel => Form::Panel,
        (1, 0) if chunks != 0 => Form::ColBlocks(chunks.trailing_zeros()),
        // A table read once per block of elements (a nested absmax).
        (_, s) if s >= 2 => Form::Gather(bound),
        _ => {
            return Err(refuse(
                k,
                &format!(
                    "a weight read at an index (a * k + base) >> {shift}, a = {a}, of none of \
                     the matmul's forms at every output (n * K + k, its bytes or blocks, 4-bit \
                     panels, column blocks)"
                ),
            ))
        }
    })
}

impl Lowering<'_> {
    /// Starts lowering a part of a matmul (or ends it: `None`): values lowered for another
    /// part are forgotten, as the leaves mean other things there; from one half of the weight's
    /// bytes to the other only the tile's values (the rows' and blocks' are the same).
    pub(in crate::mosaic) fn matmul_part(&mut self, part: Option<Part>) {
        let weight = |p: &Option<Part>| {
            matches!(
                p,
                Some(Part {
                    domain: Domain::Weight { .. },
                    ..
                })
            )
        };
        if weight(&self.matmul) && weight(&part) {
            self.memo.retain(|&(_, shape), _| shape != Shape::WTile);
        } else {
            self.memo.clear();
            self.natural_shapes.clear();
        }
        self.matmul = part;
    }

    /// The natural shape of a matmul part's leaf, or `None` for an op lowered as usual.
    pub(in crate::mosaic) fn matmul_natural(&self, v: Value) -> Result<Option<Shape>> {
        let Some(p) = &self.matmul else {
            return Ok(None);
        };
        let weight = matches!(p.domain, Domain::Weight { .. });
        Ok(Some(match self.k.values[v].op {
            Op::Param(_) => Shape::Uniform,
            Op::LoopIndex if v == p.k && weight => Shape::WTile,
            Op::ReadVar(x) if !weight && x.index() == p.total_var => Shape::Acc,
            Op::ReadVar(_) | Op::LoopIndex => {
                return Err(refuse(
                    self.k,
                    "a matmul reading another variable or loop index",
                ))
            }
            Op::Load { .. } if weight => match p.forms.get(&v.index()) {
                Some(Form::Blocks(_)) => Shape::WBlocks,
                // The shape of its index.
                Some(Form::Gather(_)) => return Ok(None),
                Some(_) => Shape::WTile,
                None => {
                    return Err(refuse(
                        self.k,
                        "a weight load at an index other than (n * K + k) >> s",
                    ))
                }
            },
            Op::Load { .. } => Shape::Acc,
            _ if weight && self.block_index(v) => Shape::WBlocks,
            _ => match p.fits.get(&v.index()) {
                Some(Fit::Uniform(_)) => Shape::Uniform,
                Some(Fit::Col { .. }) if weight => Shape::WRow,
                Some(Fit::Row(..)) if weight => {
                    return Err(refuse(
                        self.k,
                        "a weight element computed from the output's row m",
                    ))
                }
                Some(_) => Shape::Acc,
                None => return Ok(None),
            },
        }))
    }

    /// A matmul part's leaf `v` at `at`, or `None` for an op lowered as usual.
    pub(in crate::mosaic) fn matmul_leaf(&mut self, v: Value, at: Shape) -> Result<Option<usize>> {
        let Some(p) = self.matmul.clone() else {
            return Ok(None);
        };
        let ty = self.k.values[v].ty;
        let node = match self.k.values[v].op {
            Op::Param(q) => match p.scalars.get(q.index()).copied().flatten() {
                Some(c) => self.konst(c, elt_of(ty), at),
                None => {
                    let w = self.scalar_window(q)?;
                    self.push(VOp::Scalar { window: w }, at, elt_of(ty))
                }
            },
            Op::LoopIndex => {
                let half = match p.domain {
                    Domain::Weight { half } => half,
                    Domain::Out => None,
                };
                self.push(VOp::ReductionIndex { half }, Shape::WTile, Elt::I32)
            }
            Op::ReadVar(_) => p.total,
            _ if matches!(p.domain, Domain::Weight { .. }) && self.block_index(v) => {
                // `(n * K + k) >> s` on a row of blocks: `n * (K >> s)` plus the column.
                let (_, per_row) = p.blocks.expect("a weight with blocks");
                let row = self.push(VOp::WeightRow, Shape::WRow, Elt::I32);
                let per_row = self.konst(per_row, Elt::I32, Shape::WRow);
                let first = self.push(VOp::Bin(Bin::MulI, row, per_row), Shape::WRow, Elt::I32);
                let first = self.push(VOp::Broadcast(first), Shape::WBlocks, Elt::I32);
                let col = self.push(VOp::BlockCol, Shape::WBlocks, Elt::I32);
                self.push(VOp::Bin(Bin::AddI, first, col), Shape::WBlocks, Elt::I32)
            }
            Op::Load { buf, index } => match (p.domain, p.forms.get(&v.index()).copied()) {
                (_, Some(Form::Gather(bound))) => self.table_gather(buf, index, bound)?,
                (Domain::Weight { .. }, Some(Form::Blocks(_))) => {
                    let w = self.matmul_window(buf, WindowKind::MmBlocks)?;
                    self.load_window(w, Shape::WBlocks)
                }
                (Domain::Weight { .. }, Some(Form::Panel)) => {
                    let w = self.matmul_window(buf, WindowKind::MmPanels)?;
                    self.load_with(w, Shape::WTile, VOp::PanelBytes { window: w })
                }
                (Domain::Weight { .. }, Some(Form::ColBlocks(t))) => {
                    let w = self.matmul_window(buf, WindowKind::MmColBlocks(t))?;
                    self.load_with(w, Shape::WTile, VOp::ColScales { window: w })
                }
                (Domain::Weight { .. }, Some(_)) => {
                    let w = self.matmul_window(buf, WindowKind::MmWeight)?;
                    self.load_window(w, Shape::WTile)
                }
                _ => {
                    // The output's column `n` (a constant 0 where `N = 1`).
                    let n_is_one = self.program.matmul.as_ref().is_some_and(|m| m.n == 1);
                    let column = match p.fits.get(&index.index()) {
                        Some(Fit::Col {
                            a: 1,
                            b: 0,
                            shift: 0,
                        }) => true,
                        Some(Fit::Uniform(0)) => n_is_one,
                        _ => false,
                    };
                    if !column {
                        return Err(refuse(
                            self.k,
                            &format!(
                                "an epilogue load of {} at another index than the output's column n",
                                self.k.params[buf].name
                            ),
                        ));
                    }
                    let w = self.matmul_window(buf, WindowKind::MmCols)?;
                    self.load_window(w, Shape::Acc)
                }
            },
            _ => {
                let Some(&fit) = p.fits.get(&v.index()) else {
                    return Ok(None);
                };
                let (coord, a, b, shift) = match fit {
                    Fit::Uniform(c) => return Ok(Some(self.konst(c, elt_of(ty), at))),
                    Fit::Col { a, b, shift } if matches!(p.domain, Domain::Weight { .. }) => {
                        (VOp::WeightRow, a, b, shift)
                    }
                    Fit::Col { a, b, shift } => (VOp::OutCol, a, b, shift),
                    Fit::Row(a, b) => (VOp::OutRow, a, b, 0),
                };
                let shape = if coord == VOp::WeightRow {
                    Shape::WRow
                } else {
                    Shape::Acc
                };
                let mut c = self.push(coord, shape, Elt::I32);
                if shift != 0 {
                    let s = self.konst(shift, Elt::I32, shape);
                    c = self.push(VOp::Bin(Bin::ShrU, c, s), shape, Elt::I32);
                }
                if a != 1 {
                    let a = self.konst(a, Elt::I32, shape);
                    c = self.push(VOp::Bin(Bin::MulI, c, a), shape, Elt::I32);
                }
                if b != 0 {
                    let b = self.konst(b, Elt::I32, shape);
                    c = self.push(VOp::Bin(Bin::AddI, c, b), shape, Elt::I32);
                }
                c
            }
        };
        Ok(Some(node))
    }

    /// Entry `index` of table `buf`, per element of the index's natural shape, after checking
    /// that the launch's table holds the `bound`: the IR's load would fault past its end, the
    /// module's chain of selects would give entry 0.
    fn table_gather(&mut self, buf: ParamId, index: Value, bound: u64) -> Result<usize> {
        let len = self.shapes.elements.get(buf.index()).copied().unwrap_or(0);
        if len as u64 <= bound {
            return Err(refuse(
                self.k,
                &format!(
                    "a matmul reading {} of {len} elements at indices up to {bound}",
                    self.k.params[buf].name
                ),
            ));
        }
        let w = self.scalar_table(buf)?;
        let shape = self.natural_of(index)?;
        let i = self.get(index, shape)?;
        let elt = if self.program.windows[w].dtype == qforge_ir::DType::F32 {
            Elt::F32
        } else {
            Elt::I32
        };
        Ok(self.push(
            VOp::TableGather {
                window: w,
                index: i,
            },
            shape,
            elt,
        ))
    }

    /// Whether `v` is a block's index `(n * K + k) >> s` of the weight's blocks (`s` theirs).
    fn block_index(&self, v: Value) -> bool {
        let Some(p) = &self.matmul else {
            return false;
        };
        let k_free = |x: Value| !p.on_k.contains(&x.index());
        let is_load = matches!(self.k.values[v].op, Op::Load { .. });
        !is_load
            && p.blocks.is_some_and(|(s, _)| {
                index_form(self.k, v, p.k, &k_free).is_some_and(|(_, t)| t == s)
            })
    }

    /// The window of a matmul's buffer `p` of `kind` (one per buffer and kind).
    pub(super) fn matmul_window(&mut self, p: ParamId, kind: WindowKind) -> Result<usize> {
        if let Some(&w) = self.windows.get(&(p.index(), kind)) {
            return Ok(w);
        }
        let plan = self.program.matmul.clone().expect("a matmul's plan");
        let param = &self.k.params[p];
        let ParamKind::Buffer { dtype, access, .. } = &param.kind else {
            return Err(refuse(self.k, &format!("{} used as a buffer", param.name)));
        };
        let (kp, np) = (
            plan.k.div_ceil(plan.tk) * plan.tk,
            plan.n.div_ceil(plan.tn) * plan.tn,
        );
        let shift = u32::from(plan.halves);
        let blocks = plan.k >> plan.blocks_shift.unwrap_or(0);
        // Columns of the array, and the buffer's elements it holds.
        let (width, elements) = match kind {
            WindowKind::MmX => (kp, plan.m as usize * plan.k as usize),
            WindowKind::MmWeight => (kp >> shift, plan.n as usize * (plan.k >> shift) as usize),
            WindowKind::MmBlocks => (blocks, plan.n as usize * blocks as usize),
            WindowKind::MmCols => (np, plan.n as usize),
            WindowKind::MmPanels => (
                PANEL_BYTES,
                (plan.n.div_ceil(PANEL) * PANEL_BYTES) as usize * plan.k as usize,
            ),
            WindowKind::MmColBlocks(t) => {
                let (group, rows) = self.program.col_groups(t);
                if group << t != plan.tn && 1 << t < plan.tn {
                    return Err(refuse(
                        self.k,
                        &format!(
                            "a matmul of {} output columns reading {} per {} columns: fewer \
                             columns than a tile of 128 must be a multiple of {} (or at most {})",
                            plan.n,
                            param.name,
                            1u32 << t,
                            1u32 << t,
                            1u32 << t
                        ),
                    ));
                }
                (kp, rows as usize * plan.k as usize)
            }
            _ => (np, plan.m as usize * plan.n as usize),
        };
        let have = self.shapes.elements.get(p.index()).copied().unwrap_or(0);
        let written = kind == WindowKind::MmOut;
        if have < elements || (kind == WindowKind::MmCols && have != elements) {
            return Err(refuse(
                self.k,
                &format!(
                    "a matmul's {} of {have} elements ({elements} needed at {})",
                    param.name,
                    super::launch::named_dims(plan.m, plan.n, plan.k)
                ),
            ));
        }
        if !written && *access != Access::Read {
            return Err(refuse(
                self.k,
                &format!("a matmul reading {}, which it writes", param.name),
            ));
        }
        let w = self.program.windows.len();
        self.program.windows.push(Window {
            param: p.index(),
            name: param.name.clone(),
            dtype: *dtype,
            width,
            elements,
            read: !written,
            written,
            kind,
        });
        self.windows.insert((p.index(), kind), w);
        Ok(w)
    }
}
impl TileProgram {
    /// The shape of the buffer a matmul's window holds, `[rows, columns]` (`[panels, K, 16]`
    /// for 4-bit panels): its first elements in that shape, zero-padded on every dimension to
    /// the array's shape with the array's leading dimensions merged to the same rank (a
    /// column-block buffer's `[rows, K]` in an array of `[rows / G, G, K]`); `None` for a
    /// flat buffer padded at its end.
    pub fn buffer_shape(&self, w: &Window) -> Option<Vec<u32>> {
        let p = self.matmul.as_ref()?;
        let shift = u32::from(p.halves);
        Some(match w.kind {
            WindowKind::MmX => vec![p.m, p.k],
            WindowKind::MmWeight => vec![p.n, p.k >> shift],
            WindowKind::MmBlocks => vec![p.n, w.width],
            WindowKind::MmCols => vec![1, p.n],
            WindowKind::MmOut => vec![p.m, p.n],
            WindowKind::MmPanels => vec![p.n.div_ceil(PANEL), p.k, PANEL_BYTES],
            WindowKind::MmColBlocks(t) => vec![self.col_groups(t).1, p.k],
            _ => return None,
        })
    }
}
