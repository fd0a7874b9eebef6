//! Deferred lookups (AVX-512, or AVX2): in a vector body, a lookup in a table of at most 16
//! entries is kept as the pair (table vector, permute indices) instead of being permuted at
//! once, and a pure op whose operands are such pairs with the same indices, or uniform values,
//! is applied to the 16-lane table vector instead of the looked-up lanes. The lanes are
//! permuted only when a value meets an operand of another kind (a loaded activation, an
//! accumulator, a store): one `vpermd` per 16 lanes with AVX-512; with AVX2, per 8 lanes, one
//! `vpermd` of each 8-entry half of the table and a select on index bit 3.
//!
//! The bits are the scalar bits: an op applied lane-wise to `table[idx[l]]` and uniform
//! operands gives, in lane `l`, the op applied to entry `idx[l]` with the same operands, which
//! is what the permute of the transformed table yields.
//!
//! The gain comes with wide groups. In the 4-bit matmul at 64 lanes with blocksize 64, a
//! weight's decode `round(code[nibble] * absmax)` (the absmax uniform across the group) is one
//! multiply and one rounding of a 16-entry table per 64 weights, then one permute per 16
//! weights: per 16 bf16 weights about 3 + 2 instructions where the lanes took 3 + 1 + 7 + 2.

use std::rc::Rc;

use qforge_ir::{Op, ScalarType, TableId, Value};

use super::emit::{internal, literal, Emitter, Opnd};
use super::lanes::Form;
use crate::error::Result;

/// A value whose lane `l` is lane `idx` of `table` with `idx` the low 4 bits of lane
/// `l % width` of `index[l / width]`.
#[derive(Clone)]
pub(super) struct Deferred {
    /// `<16 x T>` (`T` the value's LLVM type): entry `j` is the value for index `j`.
    table: String,
    /// One `<width x i32>` per `width` lanes; only bits 0-3 of each lane are read.
    index: Rc<Vec<String>>,
    ty: ScalarType,
    /// Lanes per index vector: 16 (AVX-512) or 8 (AVX2).
    width: u32,
}

/// The permute (`vpermd`) of 16 `i32` lanes by the low 4 bits of each index lane.
const VPERMD: &str = "llvm.x86.avx512.permvar.si.512";

/// The AVX2 permute (`vpermd`) of 8 `i32` lanes by the low 3 bits of each index lane.
const VPERMD_AVX2: &str = "llvm.x86.avx2.permd";

impl Emitter<'_> {
    /// Lanes per index vector of a deferred lookup on `lanes` lanes: 16 with AVX-512, 8 with
    /// AVX2; `None` when lookups are not permutes there.
    pub(super) fn permute_width(&self, lanes: u32) -> Option<u32> {
        if self.opts.x86_avx512 && lanes.is_multiple_of(16) {
            Some(16)
        } else if self.opts.x86_avx2 && lanes.is_multiple_of(8) {
            Some(8)
        } else {
            None
        }
    }
}

impl Emitter<'_> {
    /// Records `v` as `table[index]` deferred (see the module docs) when lookups are permutes
    /// ([`Self::permute_width`]) and the table has 1 to 16 non-bool entries; false
    /// otherwise. In the fast body the indices of a packed 4-bit code come from its bytes
    /// (`nibble.rs`); any other index is clamped to the table as the IR says.
    pub(super) fn defer_lookup(
        &mut self,
        v: Value,
        table: TableId,
        index: Value,
        forms: Option<&std::collections::HashMap<usize, Form>>,
        lanes: u32,
    ) -> Result<bool> {
        let Some(width) = self.permute_width(lanes) else {
            return Ok(false);
        };
        let t = self
            .k
            .tables
            .try_get(table)
            .ok_or_else(|| internal("missing table"))?;
        if t.data.is_empty() || t.data.len() > 16 || t.ty == ScalarType::Bool {
            return Ok(false);
        }
        let (ty, len) = (t.ty, t.data.len());
        // Entries past the end repeat the last one (never read: indices are at most len - 1).
        let entries: Vec<String> = (0..16)
            .map(|j| format!("i32 {}", t.data[j.min(len - 1)] as i32))
            .collect();
        let bits = format!("<{}>", entries.join(", "));
        let nibbles = match forms {
            Some(forms) => self.nibble_indices(index, forms, lanes, width)?,
            None => None,
        };
        let chunks = match nibbles {
            Some(c) => c,
            None => {
                let idx = self.get(index, lanes)?;
                let it = format!("<{lanes} x i32>");
                let last = literal(ScalarType::U32, lanes, len as u32 - 1);
                let over = self.ins(format!("icmp ugt {it} {idx}, {last}"));
                let clamped = self.select(&over, ScalarType::U32, lanes, &last, &idx);
                (0..lanes / width)
                    .map(|c| self.lanes_of(&clamped, lanes, width * c, width))
                    .collect()
            }
        };
        let table = self.bitcast(&bits, ScalarType::U32, ty, 16)?;
        self.defer(
            v,
            Deferred {
                table,
                index: Rc::new(chunks),
                ty,
                width,
            },
        );
        Ok(true)
    }

    /// Records `v = op(...)` as deferred when every operand is uniform or deferred with the
    /// same indices (at least one); false otherwise (the caller lowers the lanes).
    pub(super) fn defer_pure(&mut self, v: Value, op: &Op, ty: ScalarType) -> Result<bool> {
        let operands = op.operands();
        let mut index: Option<(Rc<Vec<String>>, u32)> = None;
        for o in &operands {
            match self.deferred.get(&o.index()) {
                Some(d) => match &index {
                    Some((i, _)) if !Rc::ptr_eq(i, &d.index) => return Ok(false),
                    _ => index = Some((d.index.clone(), d.width)),
                },
                None => {
                    if self.vals[o.index()].as_ref().is_none_or(|x| x.lanes != 1) {
                        return Ok(false);
                    }
                }
            }
        }
        let Some((index, width)) = index else {
            return Ok(false);
        };
        // Lower the op on 16 lanes with each deferred operand's table in its place.
        let mut saved: Vec<(usize, Option<Opnd>)> = Vec::new();
        for o in &operands {
            let i = o.index();
            if saved.iter().any(|(s, _)| *s == i) {
                continue;
            }
            if let Some(d) = self.deferred.get(&i) {
                let table = Opnd {
                    text: d.table.clone(),
                    lanes: 16,
                };
                saved.push((i, self.vals[i].replace(table)));
            }
        }
        let table = self.pure(op, ty, 16);
        for (i, old) in saved {
            self.vals[i] = old;
        }
        let table = table?;
        self.defer(
            v,
            Deferred {
                table,
                index,
                ty,
                width,
            },
        );
        Ok(true)
    }

    /// Makes `v` deferred (any earlier operand of `v`, e.g. from another body, is dropped).
    fn defer(&mut self, v: Value, d: Deferred) {
        self.vals[v.index()] = None;
        self.deferred.insert(v.index(), d);
    }

    /// When `v` is deferred and not yet permuted, permutes its lanes (see the module docs) and
    /// records them as its operand; the deferred form stays for later ops.
    pub(super) fn materialize(&mut self, v: Value) -> Result<()> {
        if self.vals[v.index()].is_some() {
            return Ok(());
        }
        let Some(d) = self.deferred.get(&v.index()).cloned() else {
            return Ok(());
        };
        let vt = "<16 x i32>";
        let bits = match d.ty {
            ScalarType::Bool => self.ins(format!("zext <16 x i1> {} to {vt}", d.table)),
            t => self.bitcast(&d.table, t, ScalarType::U32, 16)?,
        };
        let parts: Vec<String> = if d.width == 16 {
            d.index
                .iter()
                .map(|idx| self.call(VPERMD, vt, &[(vt, &bits), (vt, idx)]))
                .collect()
        } else {
            let halves = [
                self.lanes_of(&bits, 16, 0, 8),
                self.lanes_of(&bits, 16, 8, 8),
            ];
            let ht = "<8 x i32>";
            let bit3 = literal(ScalarType::U32, 8, 8);
            d.index
                .iter()
                .map(|idx| {
                    let [lo, hi] = halves
                        .clone()
                        .map(|h| self.call(VPERMD_AVX2, ht, &[(ht, &h), (ht, idx)]));
                    let masked = self.ins(format!("and {ht} {idx}, {bit3}"));
                    let set = self.ins(format!("icmp ne {ht} {masked}, zeroinitializer"));
                    self.select(&set, ScalarType::U32, 8, &hi, &lo)
                })
                .collect()
        };
        let lanes = d.width * parts.len() as u32;
        let all = self.concat(parts, d.width);
        let text = match d.ty {
            ScalarType::Bool => self.ins(format!("icmp ne <{lanes} x i32> {all}, zeroinitializer")),
            t => self.bitcast(&all, ScalarType::U32, t, lanes)?,
        };
        self.vals[v.index()] = Some(Opnd { text, lanes });
        Ok(())
    }

    /// Lanes `from .. from + n` of the `<lanes x i32>` vector `x` (`x` itself when that is all
    /// of it).
    pub(super) fn lanes_of(&mut self, x: &str, lanes: u32, from: u32, n: u32) -> String {
        if from == 0 && n == lanes {
            return x.to_string();
        }
        let mask: Vec<String> = (from..from + n).map(|j| format!("i32 {j}")).collect();
        self.ins(format!(
            "shufflevector <{lanes} x i32> {x}, <{lanes} x i32> undef, <{n} x i32> <{}>",
            mask.join(", ")
        ))
    }

    /// The `i32` vectors `parts` (a power of two of them, `w` lanes each) joined in order.
    pub(super) fn concat(&mut self, mut parts: Vec<String>, mut w: u32) -> String {
        while parts.len() > 1 {
            let pt = format!("<{w} x i32>");
            let mask: Vec<String> = (0..2 * w).map(|j| format!("i32 {j}")).collect();
            parts = parts
                .chunks(2)
                .map(|c| {
                    self.ins(format!(
                        "shufflevector {pt} {}, {pt} {}, <{} x i32> <{}>",
                        c[0],
                        c[1],
                        2 * w,
                        mask.join(", ")
                    ))
                })
                .collect();
            w *= 2;
        }
        parts.pop().unwrap_or_default()
    }
}
