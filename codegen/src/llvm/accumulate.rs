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
//! scalar body.

use qforge_ir::{Accum, ReduceOrder, Stmt, Value};

use super::emit::{internal, Emitter};
use super::reduce::NEG_ZERO;
use crate::error::Result;

impl Emitter<'_> {
    /// Lowers `Stmt::Accumulate` (see the module docs).
    pub(super) fn accumulate(
        &mut self,
        index: Value,
        len: Value,
        order: ReduceOrder,
        body: &[Stmt],
        accs: &[Accum],
    ) -> Result<()> {
        // A power of two in 1..=64 for a verified kernel.
        let ways = order.ways();
        if accs.is_empty() {
            return Err(internal("accumulate without accumulators"));
        }
        let len = self.val(len)?;
        let arr_t = format!("[{ways} x float]");
        let arrays: Vec<String> = accs.iter().map(|_| self.alloca(&arr_t)).collect();
        for arr in &arrays {
            let neg: Vec<String> = (0..ways).map(|_| format!("float {NEG_ZERO}")).collect();
            self.line(format!(
                "store {arr_t} [{}], {arr_t}* {arr}",
                neg.join(", ")
            ));
        }
        let lanes = self.opts.lanes;
        let vector = lanes != 0 && ways > 1 && super::lanes::eligible(self.k, index, body, false);
        let tail_start = if vector {
            self.accumulate_groups(index, &len, ways, lanes.max(ways), body, accs, &arrays)?
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
        for (acc, arr) in accs.iter().zip(&arrays) {
            let total = self.tree_from_array(arr, ways);
            self.assign_var(acc.var, &total)?;
        }
        Ok(())
    }

    /// The vector loop over groups of `g` elements (see the module docs); returns the first
    /// element it leaves to the scalar loop (`len` rounded down to a multiple of `g`).
    #[allow(clippy::too_many_arguments)]
    fn accumulate_groups(
        &mut self,
        index: Value,
        len: &str,
        ways: u32,
        g: u32,
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
        let mut fuse = |e: &mut Self| -> Result<()> {
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
        self.group_loop(index, "0", &end, g, body, &[], &mut fuse)?;
        for (v, arr) in vecs.iter().zip(arrays) {
            let p = self.ins(format!("load {vt}, {vt}* {v}"));
            let as_vec = self.ins(format!("bitcast [{ways} x float]* {arr} to {vt}*"));
            self.line(format!("store {vt} {p}, {vt}* {as_vec}, align 4"));
        }
        Ok(end)
    }
}
