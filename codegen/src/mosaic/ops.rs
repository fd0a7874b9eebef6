//! The IR's ops as tile-program ops (`docs/backends/mosaic.md`, "The numeric contract on a
//! TPU"): integer ops with shift amounts modulo 32, `min`/`max` as compare and select, float
//! `ne` as `not oeq`, `neg`/`abs` on the bits, `bf16` and `f16` conversions with integer ops,
//! lookups as a tree of selects.

use qforge_ir::{BinaryOp, CmpOp, DType, Rounding, ScalarType, TableId, UnaryOp};

use super::lowering::Lowering;
use super::refuse;
use super::tile::{Bin, Elt, Pred, Shape, VOp};
use crate::error::Result;

impl Lowering<'_> {
    /// The `f32` whose high half are the `bf16` bits in the low half of `bits` (exact).
    pub(super) fn bf16_to_f32(&mut self, bits: usize) -> usize {
        let shape = self.node_shape(bits);
        let sixteen = self.konst(16, Elt::I32, shape);
        let high = self.push(VOp::Bin(Bin::Shl, bits, sixteen), shape, Elt::I32);
        self.push(VOp::Bitcast(high, Elt::F32), shape, Elt::F32)
    }

    /// `i32` lanes `op(a, b)`.
    pub(super) fn int(&mut self, op: Bin, a: usize, b: usize) -> usize {
        let shape = self.node_shape(a).max(self.node_shape(b));
        self.push(VOp::Bin(op, a, b), shape, Elt::I32)
    }

    /// `i32` lanes `op(a, c)` for a constant `c`.
    pub(super) fn int_c(&mut self, op: Bin, a: usize, c: u32) -> usize {
        let shape = self.node_shape(a);
        let k = self.konst(c, Elt::I32, shape);
        self.push(VOp::Bin(op, a, k), shape, Elt::I32)
    }

    /// The `i1` lanes `a pred c` for a constant `c`.
    pub(super) fn cmp_c(&mut self, p: Pred, a: usize, c: u32) -> usize {
        let shape = self.node_shape(a);
        let k = self.konst(c, Elt::I32, shape);
        self.push(VOp::Cmp(p, a, k), shape, Elt::I1)
    }

    pub(super) fn select_i(&mut self, c: usize, t: usize, f: usize) -> usize {
        let shape = self.node_shape(c);
        self.push(VOp::Select(c, t, f), shape, Elt::I32)
    }

    /// The `f32` of the `f16` bits in the low half of `h`, exactly as the interpreter's load
    /// (`half::f16::to_f32`): normal values rebiased, subnormals normalized (their highest set
    /// bit `p` found in four halving steps), a NaN made quiet with its payload kept.
    pub(super) fn f16_to_f32(&mut self, h: usize) -> usize {
        let shape = self.node_shape(h);
        let sign = self.int_c(Bin::AndI, h, 0x8000);
        let sign = self.int_c(Bin::Shl, sign, 16);
        let e = self.int_c(Bin::ShrU, h, 10);
        let e = self.int_c(Bin::AndI, e, 0x1f);
        let m = self.int_c(Bin::AndI, h, 0x3ff);
        let m13 = self.int_c(Bin::Shl, m, 13);
        let with_sign = |l: &mut Self, x: usize| l.int(Bin::OrI, sign, x);
        // Infinity (m = 0) or a quiet NaN.
        let m_zero = self.cmp_c(Pred::Eq, m, 0);
        let quiet = self.konst(0x7fc0_0000, Elt::I32, shape);
        let inf = self.konst(0x7f80_0000, Elt::I32, shape);
        let top = self.select_i(m_zero, inf, quiet);
        let top = self.int(Bin::OrI, top, m13);
        let top = with_sign(self, top);
        // Normal: exponent + 112, mantissa << 13.
        let ne = self.int_c(Bin::AddI, e, 112);
        let ne = self.int_c(Bin::Shl, ne, 23);
        let normal = self.int(Bin::OrI, ne, m13);
        let normal = with_sign(self, normal);
        // Subnormal: m = 2^p + rest with p in 0..=9; the value is 2^(p - 24) (1 + rest / 2^p).
        let mut p = self.konst(0, Elt::I32, shape);
        let mut t = m;
        for step in [8u32, 4, 2, 1] {
            let big = self.cmp_c(Pred::Uge, t, 1 << step);
            let p_up = self.int_c(Bin::AddI, p, step);
            p = self.select_i(big, p_up, p);
            let t_down = self.int_c(Bin::ShrU, t, step);
            t = self.select_i(big, t_down, t);
        }
        let twenty_three = self.konst(23, Elt::I32, shape);
        let up = self.int(Bin::SubI, twenty_three, p);
        let frac = self.int(Bin::Shl, m, up);
        let frac = self.int_c(Bin::AndI, frac, 0x7f_ffff);
        let se = self.int_c(Bin::AddI, p, 103);
        let se = self.int_c(Bin::Shl, se, 23);
        let sub = self.int(Bin::OrI, se, frac);
        let sub = with_sign(self, sub);
        let tiny = self.select_i(m_zero, sign, sub);
        let e_zero = self.cmp_c(Pred::Eq, e, 0);
        let e_max = self.cmp_c(Pred::Eq, e, 31);
        let finite = self.select_i(e_zero, tiny, normal);
        let bits = self.select_i(e_max, top, finite);
        self.push(VOp::Bitcast(bits, Elt::F32), shape, Elt::F32)
    }

    /// The `f16` bits (low half of an `i32`) of `v` rounded to nearest even, exactly as the
    /// interpreter's store (`half::f16::from_f32`): overflow to infinity, subnormal results
    /// rounded at their own precision, a NaN quiet with its top payload bits. Every branch is
    /// computed and selected; the subnormal shift is clamped into `1..=31` where unused.
    fn f32_to_f16(&mut self, v: usize) -> usize {
        let shape = self.node_shape(v);
        let b = self.push(VOp::Bitcast(v, Elt::I32), shape, Elt::I32);
        let sign = self.int_c(Bin::ShrU, b, 16);
        let sign = self.int_c(Bin::AndI, sign, 0x8000);
        let a = self.int_c(Bin::AndI, b, 0x7fff_ffff);
        let with_sign = |l: &mut Self, x: usize| l.int(Bin::OrI, sign, x);
        let payload = self.int_c(Bin::ShrU, a, 13);
        let payload = self.int_c(Bin::AndI, payload, 0x3ff);
        let nan = self.int_c(Bin::OrI, payload, 0x7e00);
        let nan = with_sign(self, nan);
        let inf = self.int_c(Bin::OrI, sign, 0x7c00);
        // Normal: rebias by 112 << 23, round the 13 dropped bits to nearest even.
        let m = self.int_c(Bin::SubI, a, 0x3800_0000);
        let lsb = self.int_c(Bin::ShrU, m, 13);
        let lsb = self.int_c(Bin::AndI, lsb, 1);
        let biased = self.int_c(Bin::AddI, m, 0xfff);
        let biased = self.int(Bin::AddI, biased, lsb);
        let normal = self.int_c(Bin::ShrU, biased, 13);
        let normal = with_sign(self, normal);
        // Subnormal: the 24-bit significand shifted right by 126 - exponent (14..=24 in range).
        let exp = self.int_c(Bin::ShrU, a, 23);
        let c126 = self.konst(126, Elt::I32, shape);
        let shift = self.int(Bin::SubI, c126, exp);
        let lo = self.cmp_c(Pred::Uge, shift, 1);
        let hi = self.cmp_c(Pred::Ule, shift, 31);
        let ok = self.push(VOp::Bin(Bin::AndI, lo, hi), shape, Elt::I1);
        let safe = self.konst(14, Elt::I32, shape);
        let shift = self.select_i(ok, shift, safe);
        let mant = self.int_c(Bin::AndI, a, 0x7f_ffff);
        let mant = self.int_c(Bin::OrI, mant, 0x80_0000);
        let sub = self.shift_round_even(mant, shift, None);
        let sub = with_sign(self, sub);
        let is_nan = self.cmp_c(Pred::Ugt, a, 0x7f80_0000);
        let is_inf = self.cmp_c(Pred::Uge, a, 0x477f_f000);
        let is_normal = self.cmp_c(Pred::Uge, a, 0x3880_0000);
        let is_zero = self.cmp_c(Pred::Ule, a, 0x3300_0000);
        let small = self.select_i(is_zero, sign, sub);
        let r = self.select_i(is_normal, normal, small);
        let r = self.select_i(is_inf, inf, r);
        self.select_i(is_nan, nan, r)
    }

    /// A stored tile read back by a later load (the store's bits widened as a load would).
    pub(super) fn widen_stored(&mut self, bits: usize, w: usize) -> usize {
        let shape = self.node_shape(bits);
        match self.program.windows[w].dtype {
            DType::BF16 => self.bf16_to_f32(bits),
            DType::F16 => self.f16_to_f32(bits),
            DType::U8 => {
                let ff = self.konst(0xff, Elt::I32, shape);
                self.push(VOp::Bin(Bin::AndI, bits, ff), shape, Elt::I32)
            }
            DType::I8 => {
                let s = self.konst(24, Elt::I32, shape);
                let up = self.push(VOp::Bin(Bin::Shl, bits, s), shape, Elt::I32);
                self.push(VOp::Bin(Bin::ShrS, up, s), shape, Elt::I32)
            }
            _ => bits,
        }
    }

    /// The node a store of `v` into a `dtype` window writes: `f32` stays, `bf16` becomes its
    /// rounded bits in the low half of an `i32` (`docs/semantics.md`, section 4: nearest even;
    /// a NaN stays a NaN), integers keep their bits (the printers truncate to the dtype).
    pub(super) fn narrow(
        &mut self,
        v: usize,
        dtype: DType,
        rounding: Option<Rounding>,
    ) -> Result<usize> {
        let shape = self.node_shape(v);
        match dtype {
            DType::BF16 => {
                if rounding != Some(Rounding::NearestEven) {
                    return Err(refuse(self.k, "a bf16 store without `rne`"));
                }
                let bits = self.push(VOp::Bitcast(v, Elt::I32), shape, Elt::I32);
                let c16 = self.konst(16, Elt::I32, shape);
                let hi = self.push(VOp::Bin(Bin::ShrU, bits, c16), shape, Elt::I32);
                let one = self.konst(1, Elt::I32, shape);
                let lsb = self.push(VOp::Bin(Bin::AndI, hi, one), shape, Elt::I32);
                let half = self.konst(0x7fff, Elt::I32, shape);
                let biased = self.push(VOp::Bin(Bin::AddI, bits, half), shape, Elt::I32);
                let biased = self.push(VOp::Bin(Bin::AddI, biased, lsb), shape, Elt::I32);
                let rounded = self.push(VOp::Bin(Bin::ShrU, biased, c16), shape, Elt::I32);
                // A NaN keeps its sign and top payload bits, made quiet.
                let quiet = self.konst(0x40, Elt::I32, shape);
                let nan_bits = self.push(VOp::Bin(Bin::OrI, hi, quiet), shape, Elt::I32);
                let nan = self.float_ne(v, v, shape);
                Ok(self.push(VOp::Select(nan, nan_bits, rounded), shape, Elt::I32))
            }
            DType::F16 => {
                if rounding != Some(Rounding::NearestEven) {
                    return Err(refuse(self.k, "an f16 store without `rne`"));
                }
                Ok(self.f32_to_f16(v))
            }
            DType::F32 | DType::U32 | DType::I32 | DType::U8 | DType::I8 => Ok(v),
        }
    }

    /// `table[min(i, len - 1)]` as a tree of selects on the index bits: the table is padded
    /// to a power of two with its last entry, level `b` picks by bit `b`.
    pub(super) fn lookup(&mut self, table: TableId, i: usize, at: Shape) -> Result<usize> {
        let t = self
            .k
            .tables
            .try_get(table)
            .ok_or_else(|| refuse(self.k, "a missing table"))?
            .clone();
        if t.data.len() > super::MAX_TABLE {
            return Err(refuse(
                self.k,
                &format!(
                    "the table {} of {} entries (at most {} are selected by compares)",
                    t.name,
                    t.data.len(),
                    super::MAX_TABLE
                ),
            ));
        }
        let last = self.konst(t.data.len() as u32 - 1, Elt::I32, at);
        let i = self.pick(Pred::Ult, last, i, at);
        let size = t.data.len().next_power_of_two();
        let zero = self.konst(0, Elt::I32, at);
        let bits: Vec<usize> = (0..size.trailing_zeros())
            .map(|bit| {
                let mask = self.konst(1 << bit, Elt::I32, at);
                let b = self.push(VOp::Bin(Bin::AndI, i, mask), at, Elt::I32);
                self.push(VOp::Cmp(Pred::Ne, b, zero), at, Elt::I1)
            })
            .collect();
        Ok(self.select_tree(&t.data, elt_of(t.ty), &bits, 0, size, at))
    }

    /// Entries `first .. first + size` of `data` (the last entry past its end) selected by
    /// `bits`, depth first, so that only one path's values are live at a time (breadth first,
    /// a 256-entry table held 128 tiles at once: more than libtpu's scoped VMEM at 1024 lanes).
    fn select_tree(
        &mut self,
        data: &[u32],
        elt: Elt,
        bits: &[usize],
        first: usize,
        size: usize,
        at: Shape,
    ) -> usize {
        if size == 1 {
            return self.konst(data[first.min(data.len() - 1)], elt, at);
        }
        let half = size / 2;
        let low = self.select_tree(data, elt, bits, first, half, at);
        let high = self.select_tree(data, elt, bits, first + half, half, at);
        let set = bits[half.trailing_zeros() as usize];
        self.push(VOp::Select(set, high, low), at, elt)
    }

    /// The IR's float `ne` (true with a NaN): `not (x oeq y)`.
    pub(super) fn float_ne(&mut self, x: usize, y: usize, at: Shape) -> usize {
        let eq = self.push(VOp::Cmp(Pred::Oeq, x, y), at, Elt::I1);
        let t = self.konst(1, Elt::I1, at);
        self.push(VOp::Bin(Bin::XorI, eq, t), at, Elt::I1)
    }

    /// `select(y pred x, y, x)`: the IR's `min`/`max` (Mosaic legalizes no integer min).
    fn pick(&mut self, p: Pred, y: usize, x: usize, at: Shape) -> usize {
        let elt = self.node_elt(x);
        let c = self.push(VOp::Cmp(p, y, x), at, Elt::I1);
        self.push(VOp::Select(c, y, x), at, elt)
    }

    pub(super) fn unary(
        &mut self,
        u: UnaryOp,
        a: usize,
        ty: ScalarType,
        at: Shape,
    ) -> Result<usize> {
        Ok(match (u, ty) {
            (UnaryOp::Neg | UnaryOp::Abs, ScalarType::F32) => {
                let bits = self.push(VOp::Bitcast(a, Elt::I32), at, Elt::I32);
                let (op, mask) = if u == UnaryOp::Neg {
                    (Bin::XorI, 0x8000_0000)
                } else {
                    (Bin::AndI, 0x7fff_ffff)
                };
                let m = self.konst(mask, Elt::I32, at);
                let r = self.push(VOp::Bin(op, bits, m), at, Elt::I32);
                self.push(VOp::Bitcast(r, Elt::F32), at, Elt::F32)
            }
            (UnaryOp::Neg, _) => {
                let zero = self.konst(0, Elt::I32, at);
                self.push(VOp::Bin(Bin::SubI, zero, a), at, Elt::I32)
            }
            (UnaryOp::Abs, ScalarType::I32) => {
                let zero = self.konst(0, Elt::I32, at);
                let neg = self.push(VOp::Bin(Bin::SubI, zero, a), at, Elt::I32);
                let lt = self.push(VOp::Cmp(Pred::Slt, a, zero), at, Elt::I1);
                self.push(VOp::Select(lt, neg, a), at, Elt::I32)
            }
            (UnaryOp::Not, ScalarType::Bool) => {
                let t = self.konst(1, Elt::I1, at);
                self.push(VOp::Bin(Bin::XorI, a, t), at, Elt::I1)
            }
            (UnaryOp::Not, _) => {
                let ones = self.konst(u32::MAX, Elt::I32, at);
                self.push(VOp::Bin(Bin::XorI, a, ones), at, Elt::I32)
            }
            _ => return Err(refuse(self.k, &format!("{u:?} on {ty:?}").to_lowercase())),
        })
    }

    pub(super) fn binary(
        &mut self,
        b: BinaryOp,
        x: usize,
        y: usize,
        ty: ScalarType,
        at: Shape,
    ) -> Result<usize> {
        let float = ty == ScalarType::F32;
        let signed = ty == ScalarType::I32;
        let elt = elt_of(ty);
        let op = match b {
            BinaryOp::Add if float => Bin::AddF,
            BinaryOp::Sub if float => Bin::SubF,
            BinaryOp::Mul if float => Bin::MulF,
            BinaryOp::Min | BinaryOp::Max => {
                // `min(a, b) = select(b < a, b, a)`, `max(a, b) = select(b > a, b, a)` in the
                // type's order (the IR's float definition; Mosaic has no unsigned min).
                let p = match (b, ty) {
                    (BinaryOp::Min, ScalarType::F32) => Pred::Olt,
                    (BinaryOp::Min, ScalarType::I32) => Pred::Slt,
                    (BinaryOp::Min, _) => Pred::Ult,
                    (_, ScalarType::F32) => Pred::Ogt,
                    (_, ScalarType::I32) => Pred::Sgt,
                    _ => Pred::Ugt,
                };
                return Ok(self.pick(p, y, x, at));
            }
            BinaryOp::Add => Bin::AddI,
            BinaryOp::Sub => Bin::SubI,
            BinaryOp::Mul => Bin::MulI,
            BinaryOp::And => Bin::AndI,
            BinaryOp::Or => Bin::OrI,
            BinaryOp::Xor => Bin::XorI,
            BinaryOp::Div | BinaryOp::Rem if !float => {
                return Ok(self.div_rem_int(x, y, signed, b == BinaryOp::Rem));
            }
            BinaryOp::Shl | BinaryOp::Shr => {
                // Shift amounts are taken modulo 32 (Mosaic's shifts past the width are
                // poison).
                let m = self.konst(31, Elt::I32, at);
                let s = self.push(VOp::Bin(Bin::AndI, y, m), at, Elt::I32);
                let op = match (b, signed) {
                    (BinaryOp::Shl, _) => Bin::Shl,
                    (_, true) => Bin::ShrS,
                    _ => Bin::ShrU,
                };
                return Ok(self.push(VOp::Bin(op, x, s), at, Elt::I32));
            }
            other => {
                return Err(refuse(
                    self.k,
                    &format!("{other:?} on {ty:?}").to_lowercase(),
                ))
            }
        };
        if float && !matches!(op, Bin::AddF | Bin::SubF | Bin::MulF) {
            return Err(refuse(self.k, &format!("{b:?} on f32").to_lowercase()));
        }
        Ok(self.push(VOp::Bin(op, x, y), at, elt))
    }
}

pub(super) fn elt_of(ty: ScalarType) -> Elt {
    match ty {
        ScalarType::F32 => Elt::F32,
        ScalarType::Bool => Elt::I1,
        _ => Elt::I32,
    }
}

pub(super) fn pred(c: CmpOp, ty: ScalarType) -> Pred {
    match (ty, c) {
        (ScalarType::F32, CmpOp::Eq | CmpOp::Ne) => Pred::Oeq,
        (ScalarType::F32, CmpOp::Lt) => Pred::Olt,
        (ScalarType::F32, CmpOp::Le) => Pred::Ole,
        (ScalarType::F32, CmpOp::Gt) => Pred::Ogt,
        (ScalarType::F32, CmpOp::Ge) => Pred::Oge,
        (_, CmpOp::Eq) => Pred::Eq,
        (_, CmpOp::Ne) => Pred::Ne,
        (ScalarType::I32, CmpOp::Lt) => Pred::Slt,
        (ScalarType::I32, CmpOp::Le) => Pred::Sle,
        (ScalarType::I32, CmpOp::Gt) => Pred::Sgt,
        (ScalarType::I32, CmpOp::Ge) => Pred::Sge,
        (_, CmpOp::Lt) => Pred::Ult,
        (_, CmpOp::Le) => Pred::Ule,
        (_, CmpOp::Gt) => Pred::Ugt,
        (_, CmpOp::Ge) => Pred::Uge,
    }
}
