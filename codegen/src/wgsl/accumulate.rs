//! Lowering of [`Stmt::Accumulate`]: one loop per work item that keeps, per accumulator, `w`
//! partial sums in a function-scope array (`w` = the ways of the order, 1 for `Sequential`),
//! all starting at `-0.0`. Element `i` runs the body's `let`s, then each accumulator does
//! `p[i & (w - 1)] = fma(a, b, p[i & (w - 1)])` (the builtin, or the exact `qf_fma` when
//! [`super::WgslOptions::soft_fma`] is set); after the loop the partials are combined by the
//! IR's halving tree with plain WGSL `+` (one correctly rounded add each, in the IR's order) and
//! the total is assigned to the accumulator's variable.
//!
//! ```text
//! var a7_0: array<f32, 4>;                       // accumulator 0 of the statement with index v7
//! for (var j = 0u; j < 4u; j++) { a7_0[j] = -0.0; }
//! for (var v7: u32 = 0u; v7 < v3; v7 = v7 + 1u) {
//!     let v8: f32 = ...;                         // the body
//!     let k7 = v7 & 3u;
//!     a7_0[k7] = fma(v8, v9, a7_0[k7]);
//! }
//! for (var j = 0u; j < 2u; j++) { a7_0[j] = a7_0[j] + a7_0[j + 2u]; }
//! for (var j = 0u; j < 1u; j++) { a7_0[j] = a7_0[j] + a7_0[j + 1u]; }
//! l_acc = a7_0[0];
//! ```
//!
//! Body values are declared inside the loop, so they are out of scope after it, as the IR says.

use qforge_ir::{Accum, ReduceOrder, Stmt, Value};

use super::emit::Emitter;
use super::helpers::Helper;
use crate::error::Result;

/// `-0.0`, the initial value of every partial.
const NEG_ZERO: &str = "bitcast<f32>(0x80000000u)";

impl Emitter<'_> {
    /// The WGSL function computing a fused multiply-add under the current options.
    pub(super) fn fma_fn(&mut self) -> &'static str {
        if self.options.soft_fma {
            self.use_helper(Helper::SoftFma);
            "qf_fma"
        } else {
            "fma"
        }
    }

    /// Emits a [`Stmt::Accumulate`].
    pub(super) fn accumulate(
        &mut self,
        index: Value,
        len: Value,
        order: ReduceOrder,
        body: &[Stmt],
        accs: &[Accum],
    ) -> Result<()> {
        let ways = order.ways();
        let n = index.index();
        let i = self.v(index);
        let l = self.v(len);
        let fma = self.fma_fn();
        let names: Vec<String> = (0..accs.len()).map(|t| format!("a{n}_{t}")).collect();
        for name in &names {
            if ways == 1 {
                self.line(&format!("var {name}: f32 = {NEG_ZERO};"));
            } else {
                self.line(&format!("var {name}: array<f32, {ways}>;"));
                self.line(&format!(
                    "for (var j: u32 = 0u; j < {ways}u; j = j + 1u) {{ {name}[j] = {NEG_ZERO}; }}"
                ));
            }
        }
        self.line(&format!(
            "for (var {i}: u32 = 0u; {i} < {l}; {i} = {i} + 1u) {{"
        ));
        self.indent += 1;
        self.block(body)?;
        if ways > 1 {
            self.line(&format!("let k{n} = {i} & {}u;", ways - 1));
        }
        for (acc, name) in accs.iter().zip(&names) {
            let slot = if ways == 1 {
                name.clone()
            } else {
                format!("{name}[k{n}]")
            };
            let (a, b) = (self.v(acc.a), self.v(acc.b));
            // Constant factors are not a problem here: the addend is never a constant, so WGSL
            // never evaluates the call at shader creation.
            self.line(&format!("{slot} = {fma}({a}, {b}, {slot});"));
        }
        self.indent -= 1;
        self.line("}");
        for (acc, name) in accs.iter().zip(&names) {
            let mut w = ways;
            while w > 1 {
                w /= 2;
                self.line(&format!(
                    "for (var j: u32 = 0u; j < {w}u; j = j + 1u) {{ {name}[j] = {name}[j] + {name}[j + {w}u]; }}"
                ));
            }
            let total = if ways == 1 {
                name.clone()
            } else {
                format!("{name}[0]")
            };
            let var = &self.k.vars[acc.var].name;
            let line = format!("l_{var} = {total};");
            self.line(&line);
        }
        Ok(())
    }
}
