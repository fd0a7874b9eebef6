//! Lowering of [`Stmt::Accumulate`](qforge_ir::Stmt::Accumulate): one thread runs the whole
//! summation loop of its work item, in the IR's order, without dynamic register indexing.
//!
//! With `w` ways (`Strided(w)`, or 1 for `Sequential`) every accumulator `t` keeps `w` partial
//! registers `P[t][0..w]`, all starting at `-0.0`. Element `i` must go to partial `i % w`, so
//! the loop is unrolled `w` times and copy `j` handles element `base + j` with partial `j`:
//!
//! ```text
//!         P[t][j] = -0.0                      for every t, j
//!         base = 0
//! main:   if len - base < w goto tail         // base <= len always: no u32 wrap
//!         for j in 0..w (unrolled):  index = base + j; body; P[t][j] = fma.rn(a_t, b_t, P[t][j])
//!         base += w; goto main
//! tail:   left = len - base                   // 0 <= left < w
//!         for j in 0..w-1 (unrolled): if left <= j goto done; index = base + j; body; fma as above
//! done:   halving tree over P[t] with add.rn.f32, then var_t = P[t][0]
//! ```
//!
//! Since `base` is a multiple of `w`, `(base + j) % w == j`: each element lands in the partial
//! the IR names, and within a partial the elements arrive in increasing `i`. The main loop has
//! no branch between its copies, so ptxas can schedule the loads of `w` elements together; the
//! tail runs once per work item.
//!
//! The body is emitted `2w - 1` times. PTX registers are not SSA, so every copy writes the same
//! value registers (`%f<k>`, `%r<k>`, `%p<k>`, declared once for the whole entry by value
//! count); temporaries and labels are fresh per copy. Copies run one after another, and each
//! copy defines every body value before using it, so no copy reads a value left by another.
//! Loads in the body are lowered as everywhere else (no bounds check: an out-of-range index
//! is a kernel bug, reported by the interpreter only).
//!
//! Why the tail is unrolled rather than a loop over a `.local` array indexed by `i % w`: for
//! the NF4 matmul body (27 instructions) with one accumulator and `w = 32`, the unrolled tail
//! is 961 of the kernel's 2,014 PTX instructions (26 KB cubin), which ptxas assembles at once
//! and which runs once per work item. The `.local` form would save that code but would store
//! and reload every partial of every accumulator through local memory (`T * w` values per work
//! item) and add address arithmetic to each tail element. Code size is not the limit here;
//! register pressure (`T * w` partials) is, and it is the same either way.

use qforge_ir::{Accum, ReduceOrder, Stmt, Value};

use super::emit::Emitter;
use crate::error::Result;

impl Emitter<'_> {
    /// Emits one [`Stmt::Accumulate`] (see the module docs for the scheme).
    pub(super) fn accumulate(
        &mut self,
        index: Value,
        len: Value,
        order: ReduceOrder,
        body: &[Stmt],
        accs: &[Accum],
    ) -> Result<()> {
        let w = order.ways();
        let (idx, n) = (self.reg(index), self.reg(len));
        let (base, left, stop) = (self.tr(), self.tr(), self.tp());
        let main = self.label("acc_main");
        let tail = self.label("acc_tail");
        let done = self.label("acc_done");

        // partials[t][j]: accumulator t, partial j.
        let partials: Vec<Vec<String>> = accs
            .iter()
            .map(|_| (0..w).map(|_| self.tf()).collect())
            .collect();
        self.line(format!(
            "// accumulate {idx} in 0..{n}: {} accumulator(s), {w} partial(s) each, from -0.0",
            accs.len()
        ));
        for (t, p) in partials.iter().enumerate() {
            self.line(format!(
                "// accumulator {t} -> {}: partials {}",
                self.var_reg(accs[t].var),
                p.join(" ")
            ));
            for r in p {
                self.line(format!("mov.b32 {r}, 0f80000000;"));
            }
        }
        self.line(format!("mov.b32 {base}, 0;"));

        // Main loop: w elements per iteration, no branch between them.
        self.line(format!("{main}:"));
        self.line(format!("sub.u32 {left}, {n}, {base};"));
        self.line(format!("setp.lt.u32 {stop}, {left}, {w};"));
        self.line(format!("@{stop} bra {tail};"));
        for j in 0..w {
            self.accumulate_element(&idx, &base, j, body, accs, &partials)?;
        }
        self.line(format!("add.u32 {base}, {base}, {w};"));
        self.line(format!("bra {main};"));

        // Tail: the last `left < w` elements, each guarded.
        self.line(format!("{tail}:"));
        for j in 0..w - 1 {
            self.line(format!("setp.le.u32 {stop}, {left}, {j};"));
            self.line(format!("@{stop} bra {done};"));
            self.accumulate_element(&idx, &base, j, body, accs, &partials)?;
        }
        self.line(format!("{done}:"));

        // The halving tree, then the totals in accumulator order (a later one wins on the
        // same variable, as in the interpreter).
        for (t, p) in partials.iter().enumerate() {
            self.line(format!(
                "// accumulator {t}: halving tree over {w} partial(s)"
            ));
            let mut half = p.len();
            while half > 1 {
                half /= 2;
                for j in 0..half {
                    let (a, b) = (&p[j], &p[j + half]);
                    self.line(format!("add.rn.f32 {a}, {a}, {b};"));
                }
            }
            let var = self.var_reg(accs[t].var);
            self.line(format!("mov.f32 {var}, {};", p[0]));
        }
        Ok(())
    }

    /// One element: `index = base + j`, the body, then one `fma.rn.f32` per accumulator into
    /// partial `j`.
    fn accumulate_element(
        &mut self,
        idx: &str,
        base: &str,
        j: u32,
        body: &[Stmt],
        accs: &[Accum],
        partials: &[Vec<String>],
    ) -> Result<()> {
        self.line(format!("// element {base} + {j} -> partial {j}"));
        self.line(format!("add.u32 {idx}, {base}, {j};"));
        self.block(body)?;
        for (acc, p) in accs.iter().zip(partials) {
            let (a, b) = (self.reg(acc.a), self.reg(acc.b));
            let r = &p[j as usize];
            self.line(format!("fma.rn.f32 {r}, {a}, {b}, {r};"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use qforge_ir::{Access, DType, Dim, KernelBuilder, ReduceOrder, ScalarType};

    use crate::ptx::{ptx_text, SmTarget};

    /// `s_t = sum over i < k of x[i] * y[i + t]` for `accs` sums.
    fn dot(order: ReduceOrder, accs: u32) -> String {
        let mut b = KernelBuilder::new("dot");
        let k = b.scalar_param("k", ScalarType::U32);
        let x = b.buffer_param("x", DType::F32, &[Dim::Param(k)], Access::Read);
        let out = b.buffer_param("out", DType::F32, &[Dim::Const(8)], Access::Write);
        b.set_grid(Dim::Const(1));
        let vars: Vec<_> = (0..accs)
            .map(|t| b.var(&format!("s{t}"), ScalarType::F32))
            .collect();
        let kv = b.param(k);
        b.accumulate(kv, order, &vars, |b, i| {
            let a = b.load(x, i);
            (0..accs)
                .map(|t| {
                    let o = b.const_u32(t);
                    let e = b.add(i, o);
                    (a, b.load(x, e))
                })
                .collect()
        });
        for (t, v) in vars.iter().enumerate() {
            let (idx, s) = (b.const_u32(t as u32), b.read_var(*v));
            b.store(out, idx, s);
        }
        ptx_text(&b.finish(), SmTarget::Sm80).expect("lowers")
    }

    fn count(text: &str, opcode: &str) -> usize {
        text.lines()
            .filter(|l| l.trim_start().starts_with(opcode))
            .count()
    }

    #[test]
    fn copies_fmas_and_tree_adds_follow_the_ways() {
        for (order, w) in [
            (ReduceOrder::Sequential, 1),
            (ReduceOrder::Strided(2), 2),
            (ReduceOrder::Strided(8), 8),
            (ReduceOrder::Strided(64), 64),
        ] {
            for accs in [1usize, 3] {
                let text = dot(order, accs as u32);
                // w main copies + (w - 1) tail copies, one fma per accumulator each.
                assert_eq!(count(&text, "fma.rn.f32"), accs * (2 * w - 1), "{order:?}");
                // The halving tree: w - 1 adds per accumulator.
                assert_eq!(count(&text, "add.rn.f32"), accs * (w - 1), "{order:?}");
                // Loads: (1 + accs) per copy.
                assert_eq!(count(&text, "ld.global.f32"), (1 + accs) * (2 * w - 1));
                // One guard per tail copy, one main-loop exit.
                assert_eq!(count(&text, "setp.le.u32"), w - 1);
                assert_eq!(count(&text, "setp.lt.u32"), 1);
                assert_eq!(count(&text, "mov.b32 %tf"), accs * w, "partials from -0.0");
                assert!(!text.contains(".ftz") && !text.contains(".approx"));
            }
        }
    }
}
