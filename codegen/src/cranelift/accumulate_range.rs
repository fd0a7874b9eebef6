//! Range proofs for the `Stmt::Accumulate` vector loop, to run its common loads without
//! per-iteration bounds checks.
//!
//! A body load whose index is `u + i` or `(u + i) >> s` (`i` the loop index, `u` a `u32`
//! available before the loop, `s` a constant) reads, in the vector iterations `i < n4`, only
//! indices up to `(u + n4 - 1) >> s`, provided `u + n4 - 1` does not wrap around `u32`. One
//! check before the loop (`u + n4 - 1 < 2^32` and `(u + n4 - 1) >> s` below the element count;
//! for the packed-byte load `u8[(u + i) >> 1]` also an even `u`, so every group of 4 starts on
//! a byte boundary) proves every access of every vector iteration in range. The vector loop is
//! then emitted twice: with those loads unchecked, taken when the proof holds, and as usual
//! otherwise. An access that is proven in range can never fail its bounds check, so both loops
//! give the same bits and the same error reports.

use std::collections::HashSet;

use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::types::{I64, I8};
use cranelift_codegen::ir::{InstBuilder, Value};
use qforge_ir::{BinaryOp, DType, Op, ScalarType, Stmt, Value as IrValue};

use super::lower::Lowerer;
use crate::error::Result;

/// The values a loop defines: its index and its body's `let`s (a value outside the set is
/// available before the loop).
pub(super) fn loop_defined(index: IrValue, body: &[Stmt]) -> HashSet<usize> {
    body.iter()
        .filter_map(|s| match s {
            Stmt::Let(v) => Some(v.index()),
            _ => None,
        })
        .chain([index.index()])
        .collect()
}

impl Lowerer<'_> {
    /// The loads of `body` proven in range for every vector iteration `i < n4` (`index` the
    /// loop index), and the condition (an `i8`) under which the proof holds.
    pub(super) fn proven_loads(
        &mut self,
        index: IrValue,
        body: &[Stmt],
        n4: Value,
    ) -> Result<(Value, HashSet<usize>)> {
        let defined = loop_defined(index, body);
        let mut proof = self.b.ins().iconst(I8, 1);
        let mut proven = HashSet::new();
        let n4 = self.b.ins().uextend(I64, n4);
        for stmt in body {
            let Stmt::Let(v) = stmt else { continue };
            let Some(Op::Load { buf, index: at }) = self.k.values.try_get(*v).map(|d| &d.op) else {
                continue;
            };
            let Some((u, shift)) = self.offset_of(*at, index, &defined) else {
                continue;
            };
            let (_, count, dtype, _) = self.buffer(*buf)?;
            let u = match u {
                Some(u) => self.val(u)?,
                None => self.c32(0),
            };
            // last = u + n4 - 1 in 64 bits: below 2^32, and last >> shift below the count.
            let wide = self.b.ins().uextend(I64, u);
            let last = self.b.ins().iadd(wide, n4);
            let last = self.b.ins().iadd_imm_s(last, -1);
            let limit = self.c64(1 << 32);
            let mut ok = self.b.ins().icmp(IntCC::UnsignedLessThan, last, limit);
            if let Some(count) = count {
                let top = self.b.ins().ushr_imm_u(last, shift as i64);
                let inside = self.b.ins().icmp(IntCC::UnsignedLessThan, top, count);
                ok = self.b.ins().band(ok, inside);
            }
            if dtype == DType::U8 && shift == 1 {
                let low = self.b.ins().band_imm_u(u, 1);
                let even = self.b.ins().icmp_imm_u(IntCC::Equal, low, 0);
                ok = self.b.ins().band(ok, even);
            }
            proof = self.b.ins().band(proof, ok);
            proven.insert(v.index());
        }
        Ok((proof, proven))
    }

    /// `(u, shift)` when `at` is `u + index`, `index + u` or `index` itself (`u: None`), all
    /// `u32`, possibly shifted right by a constant `shift`, with `u` not in `defined` (the
    /// values defined in the loop).
    fn offset_of(
        &self,
        at: IrValue,
        index: IrValue,
        defined: &HashSet<usize>,
    ) -> Option<(Option<IrValue>, u32)> {
        let def = |v: IrValue| self.k.values.try_get(v).map(|d| (&d.op, d.ty));
        let (inner, shift) = match def(at) {
            Some((Op::Binary(BinaryOp::Shr, x, c), ScalarType::U32)) => match def(*c) {
                Some((Op::Const(k), _)) => (*x, k.bits() & 31),
                _ => return None,
            },
            _ => (at, 0),
        };
        if inner == index {
            return Some((None, shift));
        }
        let outside = |v: &IrValue| !defined.contains(&v.index());
        match def(inner) {
            Some((Op::Binary(BinaryOp::Add, a, b), ScalarType::U32)) => {
                if *a == index && outside(b) {
                    Some((Some(*b), shift))
                } else if *b == index && outside(a) {
                    Some((Some(*a), shift))
                } else {
                    None
                }
            }
            _ => None,
        }
    }
}
