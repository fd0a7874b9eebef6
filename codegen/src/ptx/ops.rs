//! Arithmetic, bit operations, comparisons, selection and conversions.

use qforge_ir::{BinaryOp, CmpOp, Rounding, ScalarType, UnaryOp, Value};

use super::emit::{Class, Emitter};

/// The integer instruction type of `t` (`u32` or `s32`).
fn int_ty(t: ScalarType) -> &'static str {
    match t {
        ScalarType::I32 => "s32",
        ScalarType::U32 | ScalarType::F32 | ScalarType::Bool => "u32",
    }
}

/// The `setp` type of operands of type `t`.
fn cmp_ty(t: ScalarType) -> &'static str {
    match t {
        ScalarType::F32 => "f32",
        ScalarType::I32 => "s32",
        ScalarType::U32 | ScalarType::Bool => "u32",
    }
}

impl Emitter<'_> {
    /// `dst = u(a)`.
    pub(super) fn unary(&mut self, dst: &str, u: UnaryOp, a: Value) {
        let t = self.ty(a);
        let a = self.reg(a);
        match (u, t) {
            // Sign-bit operations on the .b32 pattern: exact for NaN, inf and zero.
            (UnaryOp::Neg, ScalarType::F32) => {
                self.line(format!("xor.b32 {dst}, {a}, 0x80000000;"))
            }
            (UnaryOp::Abs, ScalarType::F32) => {
                self.line(format!("and.b32 {dst}, {a}, 0x7FFFFFFF;"))
            }
            (UnaryOp::Neg, _) => self.line(format!("neg.s32 {dst}, {a};")),
            (UnaryOp::Abs, _) => {
                // Wrapping: i32::MIN stays i32::MIN.
                let (p, n) = (self.tp(), self.tr());
                self.line(format!("setp.lt.s32 {p}, {a}, 0;"));
                self.line(format!("neg.s32 {n}, {a};"));
                self.line(format!("selp.b32 {dst}, {n}, {a}, {p};"));
            }
            (UnaryOp::Sqrt, _) => self.line(format!("sqrt.rn.f32 {dst}, {a};")),
            (UnaryOp::Not, ScalarType::Bool) => self.line(format!("not.pred {dst}, {a};")),
            (UnaryOp::Not, _) => self.line(format!("not.b32 {dst}, {a};")),
        }
    }

    /// `dst = b(x, y)`.
    pub(super) fn binary(&mut self, dst: &str, b: BinaryOp, x: Value, y: Value) {
        let t = self.ty(x);
        let (a, c) = (self.reg(x), self.reg(y));
        let float = t == ScalarType::F32;
        let it = int_ty(t);
        match b {
            BinaryOp::Add if float => self.line(format!("add.rn.f32 {dst}, {a}, {c};")),
            BinaryOp::Sub if float => self.line(format!("sub.rn.f32 {dst}, {a}, {c};")),
            BinaryOp::Mul if float => self.line(format!("mul.rn.f32 {dst}, {a}, {c};")),
            BinaryOp::Div if float => self.line(format!("div.rn.f32 {dst}, {a}, {c};")),
            BinaryOp::Add => self.line(format!("add.{it} {dst}, {a}, {c};")),
            BinaryOp::Sub => self.line(format!("sub.{it} {dst}, {a}, {c};")),
            BinaryOp::Mul => self.line(format!("mul.lo.{it} {dst}, {a}, {c};")),
            BinaryOp::MulHi => self.line(format!("mul.hi.{it} {dst}, {a}, {c};")),
            BinaryOp::Div | BinaryOp::Rem => self.int_div(dst, b == BinaryOp::Div, t, &a, &c),
            BinaryOp::Min | BinaryOp::Max => {
                // min(a, b) = select(b < a, b, a); max(a, b) = select(b > a, b, a).
                let rel = if b == BinaryOp::Min { "lt" } else { "gt" };
                let p = self.tp();
                let sel = if float { "f32" } else { "b32" };
                self.line(format!("setp.{rel}.{} {p}, {c}, {a};", cmp_ty(t)));
                self.line(format!("selp.{sel} {dst}, {c}, {a}, {p};"));
            }
            BinaryOp::And => self.logic(dst, "and", t, &a, &c),
            BinaryOp::Or => self.logic(dst, "or", t, &a, &c),
            BinaryOp::Xor => self.logic(dst, "xor", t, &a, &c),
            BinaryOp::Shl | BinaryOp::Shr => {
                // PTX clamps shift amounts above 31; the IR wraps them: mask first.
                let m = self.tr();
                self.line(format!("and.b32 {m}, {c}, 31;"));
                if b == BinaryOp::Shl {
                    self.line(format!("shl.b32 {dst}, {a}, {m};"));
                } else {
                    self.line(format!("shr.{it} {dst}, {a}, {m};"));
                }
            }
        }
    }

    /// A bitwise (integers) or logical (`bool`) operation.
    fn logic(&mut self, dst: &str, name: &str, t: ScalarType, a: &str, c: &str) {
        let ty = if t == ScalarType::Bool { "pred" } else { "b32" };
        self.line(format!("{name}.{ty} {dst}, {a}, {c};"));
    }

    /// Integer division or remainder with the IR's guards: a zero divisor gives 0, and
    /// `i32::MIN / -1 = i32::MIN`, `i32::MIN % -1 = 0` (the divisor is replaced by 1 then).
    fn int_div(&mut self, dst: &str, div: bool, t: ScalarType, a: &str, b: &str) {
        let it = int_ty(t);
        let (zero, bad, d, q) = (self.tp(), self.tp(), self.tr(), self.tr());
        self.line(format!("setp.eq.b32 {zero}, {b}, 0;"));
        if t == ScalarType::I32 {
            self.line(format!("setp.eq.b32 {bad}, {a}, 0x80000000;"));
            self.line(format!("setp.eq.and.b32 {bad}, {b}, 0xFFFFFFFF, {bad};"));
            self.line(format!("or.pred {bad}, {bad}, {zero};"));
        } else {
            self.line(format!("mov.pred {bad}, {zero};"));
        }
        self.line(format!("selp.b32 {d}, 1, {b}, {bad};"));
        if div {
            self.line(format!("div.{it} {q}, {a}, {d};"));
            self.line(format!("selp.b32 {dst}, 0, {q}, {zero};"));
        } else {
            // a % 1 = 0 covers both the zero divisor and i32::MIN % -1.
            self.line(format!("rem.{it} {dst}, {a}, {d};"));
        }
    }

    /// `dst = c(x, y)` as a predicate.
    pub(super) fn cmp(&mut self, dst: &str, c: CmpOp, x: Value, y: Value) {
        let t = self.ty(x);
        let (a, b) = (self.reg(x), self.reg(y));
        if t == ScalarType::Bool {
            // The verifier allows only eq / ne on bool.
            match c {
                CmpOp::Ne => self.line(format!("xor.pred {dst}, {a}, {b};")),
                CmpOp::Eq | CmpOp::Lt | CmpOp::Le | CmpOp::Gt | CmpOp::Ge => {
                    let n = self.tp();
                    self.line(format!("xor.pred {n}, {a}, {b};"));
                    self.line(format!("not.pred {dst}, {n};"));
                }
            }
            return;
        }
        let rel = match c {
            CmpOp::Eq => "eq",
            // IEEE: ne is true when unordered; PTX's `ne` is ordered, `neu` is not.
            CmpOp::Ne if t == ScalarType::F32 => "neu",
            CmpOp::Ne => "ne",
            CmpOp::Lt => "lt",
            CmpOp::Le => "le",
            CmpOp::Gt => "gt",
            CmpOp::Ge => "ge",
        };
        self.line(format!("setp.{rel}.{} {dst}, {a}, {b};", cmp_ty(t)));
    }

    /// `dst = cond ? t : f`.
    pub(super) fn select(&mut self, dst: &str, cond: Value, t: Value, f: Value) {
        let class = Class::of(self.ty(t));
        let (c, a, b) = (self.reg(cond), self.reg(t), self.reg(f));
        match class {
            Class::F => self.line(format!("selp.f32 {dst}, {a}, {b}, {c};")),
            Class::R => self.line(format!("selp.b32 {dst}, {a}, {b}, {c};")),
            Class::P => {
                self.line(format!("@{c} mov.pred {dst}, {a};"));
                self.line(format!("@!{c} mov.pred {dst}, {b};"));
            }
        }
    }

    /// `f32` to `u32`/`i32`: round, saturate, NaN to 0. PTX's float-to-int `cvt` saturates to
    /// the destination range by definition; NaN is mapped to 0 explicitly as well.
    pub(super) fn float_to_int(&mut self, dst: &str, v: Value, to: ScalarType, r: Rounding) {
        let a = self.reg(v);
        let rnd = match r {
            Rounding::NearestEven => "rni",
            Rounding::TowardZero => "rzi",
            Rounding::Down => "rmi",
            Rounding::Up => "rpi",
        };
        let (nan, t) = (self.tp(), self.tr());
        self.line(format!("cvt.{rnd}.{}.f32 {t}, {a};", int_ty(to)));
        self.line(format!("setp.nan.f32 {nan}, {a}, {a};"));
        self.line(format!("selp.b32 {dst}, 0, {t}, {nan};"));
    }

    /// `u32`/`i32` to `f32` with the named rounding.
    pub(super) fn int_to_float(&mut self, dst: &str, v: Value, r: Rounding) {
        let t = self.ty(v);
        let a = self.reg(v);
        let rnd = rounding(r);
        self.line(format!("cvt.{rnd}.f32.{} {dst}, {a};", int_ty(t)));
    }
}

/// The float rounding modifier (`rn`, `rz`, `rm`, `rp`).
pub(super) fn rounding(r: Rounding) -> &'static str {
    match r {
        Rounding::NearestEven => "rn",
        Rounding::TowardZero => "rz",
        Rounding::Down => "rm",
        Rounding::Up => "rp",
    }
}
