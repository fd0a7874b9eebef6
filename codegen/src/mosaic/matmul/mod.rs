//! The matmul class: a kernel whose work item computes outputs `y[m, n]` as an `accumulate`
//! over `k` of an activation `x[m * K + k]` times a weight element `w(n, k)` computed from
//! buffers read at `n * K + k` (one element), `(n * K + k) >> 1` (a byte of two 4-bit codes)
//! or `(n * K + k) >> s` (a block's absmax), then stores a function of the total (and of
//! per-column buffers `[N]`: a bias) into `y[m * N + n]`: the fused 4-bit matmul's forward.
//!
//! How the IR's work items map to outputs is not parsed but checked: at the launch (Mosaic
//! modules are specialized to its shapes) every work item's per-work-item values are
//! evaluated, which gives each accumulator's row `m` (its activation index at `k = 0`, over
//! `K`) and column `n` (where its store falls in row `m`). The kernel is in the class when
//! every guarded store is `y[m * N + n]`, each output once, all `M x N` of them, and every
//! accumulator computes the same function of its own `(m, n)`: compared op by op, each
//! per-work-item value fitted as `a * m + b` or `a * n + b` on every work item.
//!
//! The tile program (`docs/backends/mosaic.md`, "The matmul class"): grid step `(i, j, l)`
//! loads activation tile `x[i*TM.., l*TK..]` and decodes weight tile `w[j*TN.., l*TK..]`
//! (`TN x TK`, or two `TN x TK/2` halves, the even and odd `k` of each byte), turned so `n` is
//! on the lanes. Its loop takes the step's `k` in increasing order: partial `k % W` (a VMEM
//! scratch of `W` tiles `TM x TN`, `-0.0` at `l = 0`) becomes `fma(x[:, k], w[k, :], partial)`
//! with the exact integer `fma` of `soft.rs`. At the last `l` the halving tree combines the
//! partials and the epilogue's values are stored: `accumulate`'s order exactly
//! (`docs/semantics.md`, section 5).

mod launch;
mod leaves;
mod same;
mod statements;
#[cfg(test)]
mod tests;
pub(super) mod text;
pub(super) mod twin;

use qforge_ir::{Kernel, ParamId, ParamKind, ReduceOrder, Scalar, Stmt};

use super::lowering::Lowering;
use super::tile::{Elt, MatmulPlan, Shape, Stage, TileProgram, VOp, WindowKind};
use super::{refuse, Shapes};
use crate::error::Result;
pub(super) use leaves::{Domain, Part};

/// Output columns per step: a vector register's lanes.
const TN: u32 = 128;
/// Reduction elements per step: a byte tile of two 4-bit codes is then `TN x 128`.
const TK: u32 = 256;
/// The VMEM a step may take: v5e's scoped VMEM (v6e has 32 MiB).
const VMEM_BUDGET: u64 = 16 << 20;

/// The TPU rule for a matmul's tiles `(TM, TN, TK)` (`docs/backends/mosaic.md`): rows in the
/// native tiling of the activations' and output's dtypes (8 sublanes for 32-bit arrays, 16
/// for 16-bit, 32 for 8-bit), 128 lanes of outputs, 256 elements of the reduction (its byte
/// tile is then 128 lanes); `M` or `N` smaller than its tile is its own tile (a block may
/// equal its array), `K` is padded to whole steps. The step's VMEM, [`step_vmem`], must fit [`VMEM_BUDGET`]: the two
/// broadcast scratch buffers take `TK x TM x TN x 4` bytes each, so `TM` stays at the
/// granularity (a larger `TM` shares each decoded weight among more rows: to be measured on
/// a TPU).
fn tiles(m: u32, n: u32, row_bytes: usize) -> (u32, u32, u32) {
    let tm = match row_bytes {
        1 => 32,
        2 => 16,
        _ => 8,
    };
    (tm.min(m), TN.min(n), TK)
}

/// Bytes of VMEM a step of `plan` takes: the three scratch buffers, each window twice (the
/// pipeline's double buffering; 4 bytes an element at most) and a dozen weight tiles of
/// `f32` live while decoding.
fn step_vmem(plan: &MatmulPlan) -> u64 {
    let (tm, tn, tk) = (u64::from(plan.tm), u64::from(plan.tn), u64::from(plan.tk));
    let blocks = plan.blocks_shift.map_or(0, |s| u64::from(plan.k >> s));
    let scratch = (2 * tk + u64::from(plan.ways)) * tm * tn * 4;
    let windows = 2 * 4 * (tm * tk + tn * tk + tn * blocks + 2 * tm * tn);
    scratch + windows + 12 * tn * tk * 4
}

/// The halving tree over partials `names` (`docs/semantics.md`, section 5) as additions
/// `(result, left, right)` in order, the last result named `total` (no addition for one
/// partial: the caller names it `total`).
fn halving_tree(mut names: Vec<String>, total: &str) -> Vec<(String, String, String)> {
    let mut adds = Vec::new();
    let mut width = names.len();
    let mut level = 0;
    while width > 1 {
        width /= 2;
        for j in 0..width {
            let name = if width == 1 {
                total.to_string()
            } else {
                format!("%t{level}_{j}")
            };
            adds.push((name.clone(), names[j].clone(), names[j + width].clone()));
            names[j] = name;
        }
        level += 1;
    }
    adds
}

/// The value of each integer scalar parameter of a launch (`None` for the others): what
/// [`super::lower_with`] takes.
pub fn scalar_values(args: &[qforge_ir::Arg<'_>]) -> Vec<Option<u32>> {
    args.iter()
        .map(|a| match a {
            qforge_ir::Arg::Scalar(Scalar::U32(v)) => Some(*v),
            qforge_ir::Arg::Scalar(Scalar::I32(v)) => Some(*v as u32),
            _ => None,
        })
        .collect()
}

/// Whether `k` has the matmul class's top-level `accumulate`.
pub(super) fn is_matmul(k: &Kernel) -> bool {
    k.body.iter().any(|s| matches!(s, Stmt::Accumulate { .. }))
}
/// Lowers a matmul-class kernel (module docs) at `shapes`, the launch's integer scalars
/// `scalars`, or refuses it naming what is outside the class.
pub(super) fn tile_program(
    k: &Kernel,
    shapes: &Shapes,
    scalars: &[Option<u32>],
) -> Result<TileProgram> {
    let f = statements::statements(k)?;
    let mut eval = launch::Eval::new(k, scalars);
    let out = launch::outputs(k, &f, shapes, scalars, &mut eval)?;
    let pairs = same::same_functions(k, &f, &out)?;
    let leaves::Leaves {
        fits,
        forms,
        primary,
        halves,
    } = leaves::classify(k, &f, &out, &pairs, &mut eval)?;
    let (m, n, kk) = (out.m, out.n, out.kk);
    let bytes = |b: ParamId| match &k.params[b].kind {
        ParamKind::Buffer { dtype, .. } => dtype.size_bytes(),
        ParamKind::Scalar(_) => 4,
    };
    let (tm, tn, tk) = tiles(out.m, out.n, bytes(out.x).min(bytes(out.y)));
    let ways = match f.order {
        ReduceOrder::Sequential => 1,
        ReduceOrder::Strided(w) => w,
    };
    let mut l = Lowering::new(k, shapes, 1);
    l.program.matmul = Some(MatmulPlan {
        m,
        n,
        k: kk,
        tm,
        tn,
        tk,
        ways,
        halves,
        blocks_shift: primary,
        x: 0,
        w: Vec::new(),
        loop_start: 0,
        fma: 0,
        total_start: 0,
    });
    let plan = l.program.matmul.as_ref().expect("set above");
    if step_vmem(plan) > VMEM_BUDGET {
        return Err(refuse(
            k,
            &format!(
                "a matmul step of {} bytes of VMEM (at most {VMEM_BUDGET}) at {}{}",
                step_vmem(plan),
                launch::named_dims(m, n, kk),
                plan.blocks_shift
                    .map(|s| format!(": {} absmax blocks a row", kk >> s))
                    .unwrap_or_default()
            ),
        ));
    }
    let mut part = Part {
        domain: Domain::Out,
        k: f.k_index,
        on_k: f.on_k.clone(),
        total_var: f.accs[0].0,
        total: 0,
        fits,
        forms,
        scalars: scalars.to_vec(),
        blocks: primary.map(|s| (s, kk >> s)),
    };
    let x_window = l.matmul_window(out.x, WindowKind::MmX)?;
    let x = l.load_window(x_window, Shape::XTile);
    let mut w = Vec::new();
    for half in if halves {
        vec![Some(0), Some(1)]
    } else {
        vec![None]
    } {
        part.domain = Domain::Weight { half };
        l.matmul_part(Some(part.clone()));
        w.push(l.get(f.accs[0].2, Shape::WTile)?);
    }
    let loop_start = l.program.nodes.len();
    let px = l.push(VOp::Staged(Stage::X), Shape::Acc, Elt::F32);
    let pw = l.push(VOp::Staged(Stage::W), Shape::Acc, Elt::F32);
    let pp = l.push(VOp::Staged(Stage::Partial), Shape::Acc, Elt::F32);
    let fma = l.fma_f32(px, pw, pp);
    let total_start = l.program.nodes.len();
    part.total = l.push(VOp::Staged(Stage::Total), Shape::Acc, Elt::F32);
    part.domain = Domain::Out;
    l.matmul_part(Some(part));
    for s in f.epilogues[0].1 {
        if let Stmt::Store {
            buf,
            value,
            rounding,
            ..
        } = s
        {
            let v = l.get(*value, Shape::Acc)?;
            let out = l.matmul_window(*buf, WindowKind::MmOut)?;
            let dtype = l.program.windows[out].dtype;
            let bits = l.narrow(v, dtype, *rounding)?;
            l.program.stores.push((out, bits));
        }
    }
    l.matmul_part(None);
    let plan = l.program.matmul.as_mut().expect("set above");
    plan.x = x;
    plan.w = w;
    plan.loop_start = loop_start;
    plan.fma = fma;
    plan.total_start = total_start;
    Ok(super::lowering::by_param(l.program))
}
