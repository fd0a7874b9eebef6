//! `Stmt::Accumulate`: summation loops whose order is pinned by the IR.
//!
//! Each accumulator has `w` partials (`w` = the ways of the order, 1 for `Sequential`) in an
//! array of the entry block, all starting at `-0.0`; element `i` does
//! `partial[i % w] = fma(a, b, partial[i % w])` (`llvm.fma`, one rounding), and after the loop
//! the halving tree combines them (`w' = w; while w' > 1 { w' /= 2; p[j] += p[j + w'] }`).
//!
//! With vector lanes on (`LlvmOptions::lanes`), a `Strided(w)` order and a body that can run in
//! lanes (`lanes.rs`), the elements `0 .. len - len % g` first run in groups of
//! `g = max(lanes, w)` consecutive elements: the body computes all `g` lanes at once, and the
//! group's products are fused into a `<w x float>` vector of partials in chunks of `w` lanes,
//! in order (lane `j` of chunk `c` is element `g0 + c*w + j`, whose partial is `j` because `w`
//! divides `g0`). That is the scalar order for each partial, so the bits are the scalar bits.
//! The partials vector is then stored into the array and the last `len % g` elements run the
//! scalar body. `g` is 64 for a 4-bit decode on AVX-512 and AVX2
//! ([`Emitter::wide_group`]); when a loop's rows are not aligned to 64, its groups are 16 wide
//! (the same elements in the same order). Accumulators that differ only in one column value
//! run as the lanes of one vector instead, when their columns are consecutive (`outer.rs`).

use qforge_ir::{Accum, Op, ReduceOrder, Stmt, Value};

use super::emit::{internal, Emitter};
use super::outer_store::{OuterSums, SumGroup};
use super::reduce::NEG_ZERO;
use crate::error::Result;

/// The group of an `accumulate` whose lookups are deferred (see [`Emitter::wide_group`]): one
/// 4-bit absmax block of the default blocksize. NF4 GEMV, one thread, K = N = 4096, against
/// 16-lane groups: AVX-512, f32 1.28 to 1.12 ms, bf16 2.2 to 1.4 ms; AVX2 (Zen 3), f32 the
/// same, bf16 4.4-4.5 to 3.1-3.3 ms.
const WIDE_GROUP: u32 = 64;

impl Emitter<'_> {
    /// Lowers `Stmt::Accumulate` (see the module docs); with the outer plan, returns where
    /// the sums are as vectors and leaves the accumulators' variables unset: the caller must
    /// pass them to `Emitter::outer_stores` (`outer_store.rs`), which sets them.
    pub(super) fn accumulate(
        &mut self,
        index: Value,
        len: Value,
        order: ReduceOrder,
        body: &[Stmt],
        accs: &[Accum],
    ) -> Result<Option<OuterSums>> {
        // A power of two in 1..=64 for a verified kernel.
        let ways = order.ways();
        if accs.is_empty() {
            return Err(internal("accumulate without accumulators"));
        }
        let len = self.val(len)?;
        let arr_t = format!("[{ways} x float]");
        let arrays: Vec<String> = accs.iter().map(|_| self.alloca(&arr_t)).collect();
        let lanes = self.opts.lanes;
        let outer = self.outer_plan(index, ways, body, accs);
        // With the outer plan, each path leaves every accumulator's sum in a `float` slot: lane
        // `j` of its group's `<lanes x float>` slot.
        let mut sums = None;
        let join = match &outer {
            Some(plan) => {
                let ok = self.outer_condition(plan)?;
                let (yes, no, join) = (
                    self.label("outer"),
                    self.label("inner"),
                    self.label("accumulated"),
                );
                let mut groups = Vec::new();
                let mut totals = Vec::new();
                for (cols, group) in plan.cols().iter().zip(accs.chunks(plan.cols()[0].len())) {
                    let vt = format!("<{} x float>", cols.len());
                    let slot = self.alloca(&vt);
                    for j in 0..cols.len() {
                        totals.push(
                            self.ins(format!("getelementptr {vt}, {vt}* {slot}, i32 0, i32 {j}")),
                        );
                    }
                    groups.push(SumGroup {
                        vars: group.iter().map(|a| a.var).collect(),
                        cols: cols.clone(),
                        sums: slot,
                    });
                }
                self.cond_br(&ok, &yes, &no);
                self.start(&yes);
                let slots: Vec<String> = groups.iter().map(|g| g.sums.clone()).collect();
                self.outer_accumulate(index, &len, ways, plan, accs, &slots)?;
                self.br(&join);
                self.start(&no);
                sums = Some(OuterSums {
                    consecutive: ok,
                    groups,
                });
                Some((join, totals))
            }
            None => None,
        };
        // The partials of the loops below (on the outer plan's path, only its fallback's: a
        // tile of 128 accumulators spent a quarter of the time of `y = a @ U.T` at L = 64
        // storing them).
        for arr in &arrays {
            let neg: Vec<String> = (0..ways).map(|_| format!("float {NEG_ZERO}")).collect();
            self.line(format!(
                "store {arr_t} [{}], {arr_t}* {arr}",
                neg.join(", ")
            ));
        }
        // The fallback keeps its vector loop: a plan can match accumulators whose "columns"
        // are never consecutive at run time (a row-major `B`'s row starts `col_j * L`), and
        // then every work item runs it (MiniLM's `dU` took 145 instead of 76 us with a scalar
        // fallback).
        let vector = lanes != 0 && ways > 1 && super::lanes::eligible(self.k, index, body, false);
        let tail_start = if vector {
            let fallback = lanes.max(ways);
            let g = if self.wide_group(index, body) {
                WIDE_GROUP.max(ways)
            } else {
                fallback
            };
            self.accumulate_groups(index, &len, ways, (g, fallback), body, accs, &arrays)?
        } else {
            "0".to_string()
        };
        self.counted_loop("i32", &tail_start, &len, 1, |e, i| {
            e.set(index, i.to_string(), 1);
            e.block(body)?;
            let j = e.ins(format!("and i32 {i}, {}", ways - 1));
            for (acc, arr) in accs.iter().zip(&arrays) {
                let (a, b) = (e.val(acc.a)?, e.val(acc.b)?);
                let p = e.ins(format!(
                    "getelementptr {arr_t}, {arr_t}* {arr}, i64 0, i32 {j}"
                ));
                let old = e.ins(format!("load float, float* {p}"));
                let new = e.fma(1, &a, &b, &old);
                e.line(format!("store float {new}, float* {p}"));
            }
            Ok(())
        })?;
        let totals: Vec<String> = arrays
            .iter()
            .map(|arr| self.tree_from_array(arr, ways))
            .collect();
        if let Some((join, slots)) = join {
            for (total, slot) in totals.iter().zip(&slots) {
                self.line(format!("store float {total}, float* {slot}"));
            }
            self.br(&join);
            self.start(&join);
            // The variables are set from the slots by `outer_stores`, after the stores it
            // takes as vectors: set here, LLVM extracted every lane for them on the vector
            // path too.
            return Ok(sums);
        }
        for (acc, total) in accs.iter().zip(&totals) {
            self.assign_var(acc.var, total)?;
        }
        Ok(None)
    }

    /// Whether groups of [`WIDE_GROUP`] elements pay: lookups are deferred permutes
    /// (`deferred.rs`: AVX-512 at 16 lanes, AVX2 at 8), the body looks up a table of at most
    /// 16 entries and loads a value shared by [`WIDE_GROUP`] consecutive elements (a block's
    /// absmax), so that a decode such as a 4-bit weight's `code[nibble] * absmax`, rounded, is
    /// computed once per group on the 16-entry table. (Where the weights are gathered, as in
    /// the input gradient, 64 lanes were 1.5x slower than 16.)
    fn wide_group(&self, index: Value, body: &[Stmt]) -> bool {
        ((self.opts.x86_avx512 && self.opts.lanes == 16)
            || (self.opts.x86_avx2 && self.opts.lanes == 8))
            && super::lanes::loads_per_block(self.k, index, body, WIDE_GROUP)
            && body.iter().any(|s| {
                let Stmt::Let(v) = s else { return false };
                let Some(Op::Lookup { table, .. }) = self.k.values.try_get(*v).map(|d| &d.op)
                else {
                    return false;
                };
                self.k
                    .tables
                    .try_get(*table)
                    .is_some_and(|t| t.data.len() <= 16)
            })
    }

    /// The vector loop over groups of `g` elements (see the module docs), or of `fallback`
    /// (a divisor of `g`) when the fast forms do not hold for the whole loop; returns the
    /// first element it leaves to the scalar loop (`len` rounded down to a multiple of `g`).
    #[allow(clippy::too_many_arguments)]
    fn accumulate_groups(
        &mut self,
        index: Value,
        len: &str,
        ways: u32,
        (g, fallback): (u32, u32),
        body: &[Stmt],
        accs: &[Accum],
        arrays: &[String],
    ) -> Result<String> {
        let vt = format!("<{ways} x float>");
        let vecs: Vec<String> = accs.iter().map(|_| self.alloca(&vt)).collect();
        let neg: Vec<String> = (0..ways).map(|_| format!("float {NEG_ZERO}")).collect();
        for v in &vecs {
            self.line(format!("store {vt} <{}>, {vt}* {v}", neg.join(", ")));
        }
        let end = self.ins(format!("and i32 {len}, {}", !(g - 1) as i32));
        let mut fuse = |e: &mut Self, g: u32| -> Result<()> {
            for (acc, v) in accs.iter().zip(&vecs) {
                let (a, b) = (e.get(acc.a, g)?, e.get(acc.b, g)?);
                let mut p = e.ins(format!("load {vt}, {vt}* {v}"));
                for c in 0..g / ways {
                    let (ac, bc) = if g == ways {
                        (a.clone(), b.clone())
                    } else {
                        let ids: Vec<String> =
                            (0..ways).map(|j| format!("i32 {}", c * ways + j)).collect();
                        let mask = format!("<{ways} x i32> <{}>", ids.join(", "));
                        let gt = format!("<{g} x float>");
                        (
                            e.ins(format!("shufflevector {gt} {a}, {gt} undef, {mask}")),
                            e.ins(format!("shufflevector {gt} {b}, {gt} undef, {mask}")),
                        )
                    };
                    p = e.fma(ways, &ac, &bc, &p);
                }
                e.line(format!("store {vt} {p}, {vt}* {v}"));
            }
            Ok(())
        };
        self.group_loop(index, "0", &end, (g, fallback), body, &[], &mut fuse)?;
        for (v, arr) in vecs.iter().zip(arrays) {
            let p = self.ins(format!("load {vt}, {vt}* {v}"));
            let as_vec = self.ins(format!("bitcast [{ways} x float]* {arr} to {vt}*"));
            self.line(format!("store {vt} {p}, {vt}* {as_vec}, align 4"));
        }
        Ok(end)
    }
}
