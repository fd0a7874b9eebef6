//! Packed 4-bit codes decoded with AVX-512 VBMI ([`super::LlvmOptions::x86_avx512_vbmi`]): in
//! the fast body of a group, 16 lanes at a time, the lookup `table[(byte >> s) & 15]` whose
//! `byte` is the repeated run `buf[(first + l) >> 1]` of a `u8` buffer (two lanes per byte, as
//! NF4/FP4 weights are packed) becomes three instructions instead of six: the run's 8 bytes
//! loaded once as an `i64` and broadcast, one `vpmultishiftqb` that moves each lane's nibble to
//! the low bits of its 32-bit lane (lane `l` reads the 8 bits at bit `8 * (l >> 1) + s_l` of
//! the 8 bytes), and one `vpermd` of the table, which reads only the low 4 bits of each index
//! lane. The lookup is deferred (`deferred.rs`): the `vpermd` may read a table that later ops
//! have transformed.
//!
//! This gives the scalar bits exactly when `s_l <= 4` for every lane, so that the four bits
//! the IR keeps lie inside byte `l >> 1`; the lowering requires a proof from the shift
//! amount's expression (`bounds.rs`), e.g. `((e & 1) ^ 1) << 2`, and falls back to the plain
//! lanes otherwise. The fast body's condition already covers the 8 bytes (the run's vector load
//! reads the same bytes) and makes `first` even. So when the shift reads the element `e` only
//! as `e & 1` (NF4/FP4's `((e & 1) ^ 1) << 2`), lane `l`'s parity is `l & 1` and the
//! `vpmultishiftqb` control is a constant, one register for every row of a tile.

use std::collections::HashMap;

use qforge_ir::{BinaryOp, DType, Kernel, Op, ParamId, ScalarType, Value};

use super::emit::Emitter;
use super::lanes::Form;
use crate::error::Result;

/// Largest shift amount for which a nibble lies inside its byte.
const MAX_NIBBLE_SHIFT: u32 = 4;

impl Emitter<'_> {
    /// The permute indices of the fused decode of the module docs for `table[index]` on
    /// `lanes` lanes (a multiple of `width`): one `<width x i32>` per `width` lanes whose bits
    /// 0-3 are the nibble (the bits above are not), or `None` when the options or the shape of
    /// `index` do not allow it. With AVX-512 VBMI (`width` 16) chunk `c` reads the 8 bytes at
    /// `(first >> 1) + 8c`; with AVX2 (`width` 8, [`Self::avx2_nibble_indices`]) the 4 bytes at
    /// `(first >> 1) + 4c`.
    pub(super) fn nibble_indices(
        &mut self,
        index: Value,
        forms: &HashMap<usize, Form>,
        lanes: u32,
        width: u32,
    ) -> Result<Option<Vec<String>>> {
        if width == 8 {
            return self.avx2_nibble_indices(index, forms, lanes);
        }
        if !self.opts.x86_avx512_vbmi || !lanes.is_multiple_of(16) {
            return Ok(None);
        }
        let Some((buf, first, shift, at)) = self.nibble_of(index, forms) else {
            return Ok(None);
        };
        let (base, _, _, _) = self.buffer(buf)?;
        // The shifts as constants when they depend on the element only through its parity
        // (`first` is even in the fast body, so element `first + l` has parity `l & 1`): the
        // permute control is then a constant, where it took four vector ops per 16 lanes.
        let parity_shifts = self.parity_shifts(at, shift, forms);
        let s = match parity_shifts {
            Some(_) => String::new(),
            None => self.get(shift, lanes)?,
        };
        let at = self.ins(format!("lshr i32 {first}, 1"));
        let at64 = self.ins(format!("zext i32 {at} to i64"));
        let at_byte: Vec<String> = (0..16).map(|l| format!("i32 {}", 8 * (l / 2))).collect();
        let mut chunks = Vec::new();
        for c in 0..lanes / 16 {
            let byte = self.ins(format!("add i64 {at64}, {}", 8 * c));
            let p = self.element_ptr(&base, &byte, DType::U8, "i64");
            let q = self.ins(format!("load i64, i64* {p}, align 1"));
            let one = self.ins(format!("insertelement <8 x i64> undef, i64 {q}, i32 0"));
            let all = self.ins(format!(
                "shufflevector <8 x i64> {one}, <8 x i64> undef, <8 x i32> zeroinitializer"
            ));
            let bytes = self.ins(format!("bitcast <8 x i64> {all} to <64 x i8>"));
            let ctrl = match parity_shifts {
                Some(shifts) => {
                    let ctrl: Vec<String> = (0..16)
                        .map(|l| format!("i32 {}", shifts[l % 2] + 8 * (l as u32 / 2)))
                        .collect();
                    format!("<{}>", ctrl.join(", "))
                }
                None => {
                    let s_c = self.lanes_of(&s, lanes, 16 * c, 16);
                    self.ins(format!("add <16 x i32> {s_c}, <{}>", at_byte.join(", ")))
                }
            };
            let ctrl = self.ins(format!("bitcast <16 x i32> {ctrl} to <64 x i8>"));
            let moved = self.call(
                "llvm.x86.avx512.pmultishift.qb.512",
                "<64 x i8>",
                &[("<64 x i8>", &ctrl), ("<64 x i8>", &bytes)],
            );
            chunks.push(self.ins(format!("bitcast <64 x i8> {moved} to <16 x i32>")));
        }
        Ok(Some(chunks))
    }

    /// The AVX2 form of [`Self::nibble_indices`], 8 lanes per chunk, when the shifts depend on
    /// the element only through its parity: the chunk's 4 bytes loaded once as an `i32` and
    /// broadcast, and one variable shift right (`vpsrlvd`) by the constant `8 * (l >> 1) + s_l`
    /// that moves lane `l`'s nibble to its low bits.
    fn avx2_nibble_indices(
        &mut self,
        index: Value,
        forms: &HashMap<usize, Form>,
        lanes: u32,
    ) -> Result<Option<Vec<String>>> {
        if !self.opts.x86_avx2 || !lanes.is_multiple_of(8) {
            return Ok(None);
        }
        let Some((buf, first, shift, at)) = self.nibble_of(index, forms) else {
            return Ok(None);
        };
        let Some(shifts) = self.parity_shifts(at, shift, forms) else {
            return Ok(None);
        };
        let (base, _, _, _) = self.buffer(buf)?;
        let at = self.ins(format!("lshr i32 {first}, 1"));
        let at64 = self.ins(format!("zext i32 {at} to i64"));
        let ctrl: Vec<String> = (0..8u32)
            .map(|l| format!("i32 {}", shifts[(l % 2) as usize] + 8 * (l / 2)))
            .collect();
        let ctrl = format!("<{}>", ctrl.join(", "));
        let mut chunks = Vec::new();
        for c in 0..lanes / 8 {
            let byte = self.ins(format!("add i64 {at64}, {}", 4 * c));
            let p = self.element_ptr(&base, &byte, DType::U8, "i32");
            let q = self.ins(format!("load i32, i32* {p}, align 1"));
            let one = self.ins(format!("insertelement <8 x i32> undef, i32 {q}, i32 0"));
            let all = self.ins(format!(
                "shufflevector <8 x i32> {one}, <8 x i32> undef, <8 x i32> zeroinitializer"
            ));
            chunks.push(self.ins(format!("lshr <8 x i32> {all}, {ctrl}")));
        }
        Ok(Some(chunks))
    }

    /// `(buf, first, s, at)` when `index` is `and(shr(byte, s), 15)` (either operand order of
    /// the `and`), `byte` a `u8` load at an index `at` of form `(first + l) >> 1` and `s` at
    /// most [`MAX_NIBBLE_SHIFT`].
    fn nibble_of(
        &self,
        index: Value,
        forms: &HashMap<usize, Form>,
    ) -> Option<(ParamId, String, Value, Value)> {
        let op = |v: Value| self.k.values.try_get(v).map(|d| &d.op);
        let is_15 = |v: Value| matches!(op(v), Some(Op::Const(c)) if c.bits() == 15);
        let Some(Op::Binary(BinaryOp::And, a, b)) = op(index) else {
            return None;
        };
        let shifted = match (is_15(*a), is_15(*b)) {
            (false, true) => *a,
            (true, false) => *b,
            _ => return None,
        };
        if self.k.values.try_get(shifted)?.ty != ScalarType::U32 {
            return None;
        }
        let Some(Op::Binary(BinaryOp::Shr, byte, s)) = op(shifted) else {
            return None;
        };
        let Some(Op::Load { buf, index: at }) = op(*byte) else {
            return None;
        };
        let form = forms.get(&at.index()).filter(|f| f.shift == 1)?;
        let (_, _, dtype, _) = self.buffer(*buf).ok()?;
        (dtype == DType::U8
            && super::bounds::upper_bound(self.k, *s, self.lanes_seed) <= MAX_NIBBLE_SHIFT)
            .then(|| (*buf, form.first.clone(), *s, *at))
    }

    /// The shift `s` for an even and an odd element when the byte index `at` is `e >> 1` with
    /// `e` a run and `s` reads `e` only through its parity ([`Parity`]), or `None`.
    fn parity_shifts(
        &self,
        at: Value,
        shift: Value,
        forms: &HashMap<usize, Form>,
    ) -> Option<[u32; 2]> {
        let e = self.element_of(at, forms)?;
        Parity {
            k: self.k,
            e,
            seed: self.lanes_seed,
            memo: HashMap::new(),
        }
        .shifts(shift)
    }

    /// The element `e` of a byte index `at = e >> 1` whose lane `l` is `first + l` (a run, the
    /// form of `at` shifted by one), or `None`.
    fn element_of(&self, at: Value, forms: &HashMap<usize, Form>) -> Option<Value> {
        let Some(Op::Binary(BinaryOp::Shr, e, one)) = self.k.values.try_get(at).map(|d| &d.op)
        else {
            return None;
        };
        let one = matches!(self.k.values.try_get(*one).map(|d| &d.op), Some(Op::Const(c)) if c.bits() & 31 == 1);
        (one && forms.get(&e.index()).is_some_and(|f| f.shift == 0)).then_some(*e)
    }
}

/// The `u32` value of an expression for an even and an odd element `e`, when it reads `e`
/// only as `e & 1` and otherwise only constants, through integer ops with the IR's semantics
/// (wrapping, shift amounts `& 31`); `None` otherwise, and whenever the expression reaches `e`
/// itself or the vector body's `seed` (replaced by `seed + lane`, so not its ops' value).
/// Memoized per value (shared subexpressions are walked once).
struct Parity<'k> {
    k: &'k Kernel,
    e: Value,
    seed: Option<Value>,
    memo: HashMap<Value, Option<[u32; 2]>>,
}

impl Parity<'_> {
    fn shifts(&mut self, s: Value) -> Option<[u32; 2]> {
        if let Some(r) = self.memo.get(&s) {
            return *r;
        }
        let r = self.walk(s);
        self.memo.insert(s, r);
        r
    }

    fn walk(&mut self, s: Value) -> Option<[u32; 2]> {
        let def = self.k.values.try_get(s)?;
        if def.ty != ScalarType::U32 || s == self.e || Some(s) == self.seed {
            return None;
        }
        let is_one = |v: Value| matches!(self.k.values.try_get(v).map(|d| &d.op), Some(Op::Const(c)) if c.bits() == 1);
        match def.op {
            Op::Const(c) => Some([c.bits(); 2]),
            Op::Binary(BinaryOp::And, a, b)
                if (a == self.e && is_one(b)) || (b == self.e && is_one(a)) =>
            {
                Some([0, 1])
            }
            Op::Binary(op, a, b) => {
                let (x, y) = (self.shifts(a)?, self.shifts(b)?);
                let f = |x: u32, y: u32| -> Option<u32> {
                    Some(match op {
                        BinaryOp::Add => x.wrapping_add(y),
                        BinaryOp::Sub => x.wrapping_sub(y),
                        BinaryOp::Mul => x.wrapping_mul(y),
                        BinaryOp::And => x & y,
                        BinaryOp::Or => x | y,
                        BinaryOp::Xor => x ^ y,
                        BinaryOp::Shl => x << (y & 31),
                        BinaryOp::Shr => x >> (y & 31),
                        _ => return None,
                    })
                };
                Some([f(x[0], y[0])?, f(x[1], y[1])?])
            }
            _ => None,
        }
    }
}
