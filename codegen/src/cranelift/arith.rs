//! Arithmetic, bit operations, comparisons and conversions.

use cranelift_codegen::ir::condcodes::{CondCode, FloatCC, IntCC};
use cranelift_codegen::ir::types::{F32, F64, I32};
use cranelift_codegen::ir::{InstBuilder, MemFlagsData, Value};
use qforge_ir::{BinaryOp, CmpOp, Rounding, ScalarType, UnaryOp};

use super::lower::{clif_type, internal, Lowerer};
use crate::error::Result;

fn not_defined(op: &str, ty: ScalarType) -> crate::error::Error {
    internal(format!("{op} on {ty} passed the verifier"))
}

impl Lowerer<'_> {
    /// `x == c` on `i32`.
    fn eq_const(&mut self, x: Value, c: u32) -> Value {
        let c = self.c32(c);
        self.b.ins().icmp(IntCC::Equal, x, c)
    }

    /// A unary op on an operand of type `ty`.
    pub(super) fn unary(&mut self, op: UnaryOp, ty: ScalarType, a: Value) -> Result<Value> {
        let ins = self.b.ins();
        Ok(match (op, ty) {
            // Cranelift's fneg/fabs are pure sign-bit operations (xor/and with a mask), also on
            // NaN, infinities and zeros.
            (UnaryOp::Neg, ScalarType::F32) => ins.fneg(a),
            (UnaryOp::Neg, ScalarType::U32 | ScalarType::I32) => ins.ineg(a),
            (UnaryOp::Abs, ScalarType::F32) => ins.fabs(a),
            // Wrapping: iabs(i32::MIN) = i32::MIN.
            (UnaryOp::Abs, ScalarType::I32) => ins.iabs(a),
            (UnaryOp::Sqrt, ScalarType::F32) => ins.sqrt(a),
            (UnaryOp::Not, ScalarType::U32 | ScalarType::I32) => ins.bnot(a),
            (UnaryOp::Not, ScalarType::Bool) => ins.bxor_imm_u(a, 1),
            (UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sqrt | UnaryOp::Not, _) => {
                return Err(not_defined(op.name(), ty))
            }
        })
    }

    /// A binary op on two operands of type `ty`.
    pub(super) fn binary(
        &mut self,
        op: BinaryOp,
        ty: ScalarType,
        x: Value,
        y: Value,
    ) -> Result<Value> {
        use ScalarType::{Bool, F32 as Sf, I32 as Si, U32 as Su};
        Ok(match (op, ty) {
            (BinaryOp::Add, Sf) => self.b.ins().fadd(x, y),
            (BinaryOp::Sub, Sf) => self.b.ins().fsub(x, y),
            (BinaryOp::Mul, Sf) => self.b.ins().fmul(x, y),
            (BinaryOp::Div, Sf) => self.b.ins().fdiv(x, y),
            (BinaryOp::Add, Su | Si) => self.b.ins().iadd(x, y),
            (BinaryOp::Sub, Su | Si) => self.b.ins().isub(x, y),
            (BinaryOp::Mul, Su | Si) => self.b.ins().imul(x, y),
            (BinaryOp::MulHi, Su) => self.b.ins().umulhi(x, y),
            (BinaryOp::MulHi, Si) => self.b.ins().smulhi(x, y),
            (BinaryOp::Div, Su) => {
                // x / 0 = 0; the divisor is made non-zero first because udiv traps on 0.
                let zero = self.eq_const(y, 0);
                let one = self.c32(1);
                let d = self.b.ins().select(zero, one, y);
                let q = self.b.ins().udiv(x, d);
                let z = self.c32(0);
                self.b.ins().select(zero, z, q)
            }
            (BinaryOp::Div, Si) => {
                // x / 0 = 0 and i32::MIN / -1 = i32::MIN (= i32::MIN / 1); sdiv traps on both.
                let zero = self.eq_const(y, 0);
                let min = self.eq_const(x, i32::MIN as u32);
                let m1 = self.eq_const(y, u32::MAX);
                let ovf = self.b.ins().band(min, m1);
                let fix = self.b.ins().bor(zero, ovf);
                let one = self.c32(1);
                let d = self.b.ins().select(fix, one, y);
                let q = self.b.ins().sdiv(x, d);
                let z = self.c32(0);
                self.b.ins().select(zero, z, q)
            }
            (BinaryOp::Rem, Su) => {
                // x % 0 = 0 = x % 1.
                let zero = self.eq_const(y, 0);
                let one = self.c32(1);
                let d = self.b.ins().select(zero, one, y);
                self.b.ins().urem(x, d)
            }
            (BinaryOp::Rem, Si) => {
                // x % 0 = 0 = x % 1, and x % -1 = 0 = x % 1 (srem traps on i32::MIN % -1).
                let zero = self.eq_const(y, 0);
                let m1 = self.eq_const(y, u32::MAX);
                let fix = self.b.ins().bor(zero, m1);
                let one = self.c32(1);
                let d = self.b.ins().select(fix, one, y);
                self.b.ins().srem(x, d)
            }
            // min(x, y) = select(y < x, y, x); max(x, y) = select(y > x, y, x). Never the
            // fmin/fmax instructions, whose NaN and signed-zero rules differ.
            (BinaryOp::Min, Sf | Su | Si) => {
                let c = self.compare(CmpOp::Lt, ty, y, x)?;
                self.b.ins().select(c, y, x)
            }
            (BinaryOp::Max, Sf | Su | Si) => {
                let c = self.compare(CmpOp::Gt, ty, y, x)?;
                self.b.ins().select(c, y, x)
            }
            (BinaryOp::And, Su | Si | Bool) => self.b.ins().band(x, y),
            (BinaryOp::Or, Su | Si | Bool) => self.b.ins().bor(x, y),
            (BinaryOp::Xor, Su | Si | Bool) => self.b.ins().bxor(x, y),
            // Cranelift's shifts take the amount modulo the type width (here: `y & 31`).
            (BinaryOp::Shl, Su | Si) => self.b.ins().ishl(x, y),
            (BinaryOp::Shr, Su) => self.b.ins().ushr(x, y),
            (BinaryOp::Shr, Si) => self.b.ins().sshr(x, y),
            (
                BinaryOp::Add
                | BinaryOp::Sub
                | BinaryOp::Mul
                | BinaryOp::Div
                | BinaryOp::Rem
                | BinaryOp::Min
                | BinaryOp::Max
                | BinaryOp::And
                | BinaryOp::Or
                | BinaryOp::Xor
                | BinaryOp::Shl
                | BinaryOp::Shr
                | BinaryOp::MulHi,
                _,
            ) => return Err(not_defined(op.name(), ty)),
        })
    }

    /// The comparison defining the bool `v`, when `v` is a `cmp` (so `not(v)` can be lowered
    /// as one compare with the complemented condition).
    pub(super) fn negatable_compare(
        &self,
        v: qforge_ir::Value,
    ) -> Option<(CmpOp, qforge_ir::Value, qforge_ir::Value)> {
        match self.k.values.try_get(v).map(|d| &d.op) {
            Some(qforge_ir::Op::Cmp(c, x, y)) => Some((*c, *x, *y)),
            _ => None,
        }
    }

    /// `not(cmp op x y)` as one comparison with the complemented condition code (for `f32`:
    /// true when `x op y` is false, unordered operands included), yielding an `i8` 0/1.
    pub(super) fn compare_negated(
        &mut self,
        op: CmpOp,
        ty: ScalarType,
        x: Value,
        y: Value,
    ) -> Result<Value> {
        Ok(match ty {
            ScalarType::F32 => {
                let cc = Self::float_cc(op).complement();
                self.b.ins().fcmp(cc, x, y)
            }
            ScalarType::U32 | ScalarType::I32 | ScalarType::Bool => {
                let cc = Self::int_cc(op, ty == ScalarType::I32).complement();
                self.b.ins().icmp(cc, x, y)
            }
        })
    }

    /// The Cranelift condition of an `f32` comparison: ordered (false on NaN) except `ne`,
    /// which is "unordered or not equal" (true on NaN), as IEEE 754 and the IR say.
    fn float_cc(op: CmpOp) -> FloatCC {
        match op {
            CmpOp::Eq => FloatCC::Equal,
            CmpOp::Ne => FloatCC::NotEqual,
            CmpOp::Lt => FloatCC::LessThan,
            CmpOp::Le => FloatCC::LessThanOrEqual,
            CmpOp::Gt => FloatCC::GreaterThan,
            CmpOp::Ge => FloatCC::GreaterThanOrEqual,
        }
    }

    /// The Cranelift condition of an integer comparison.
    fn int_cc(op: CmpOp, signed: bool) -> IntCC {
        match (op, signed) {
            (CmpOp::Eq, _) => IntCC::Equal,
            (CmpOp::Ne, _) => IntCC::NotEqual,
            (CmpOp::Lt, true) => IntCC::SignedLessThan,
            (CmpOp::Le, true) => IntCC::SignedLessThanOrEqual,
            (CmpOp::Gt, true) => IntCC::SignedGreaterThan,
            (CmpOp::Ge, true) => IntCC::SignedGreaterThanOrEqual,
            (CmpOp::Lt, false) => IntCC::UnsignedLessThan,
            (CmpOp::Le, false) => IntCC::UnsignedLessThanOrEqual,
            (CmpOp::Gt, false) => IntCC::UnsignedGreaterThan,
            (CmpOp::Ge, false) => IntCC::UnsignedGreaterThanOrEqual,
        }
    }

    /// A comparison of two operands of type `ty`, yielding an `i8` 0/1.
    pub(super) fn compare(
        &mut self,
        op: CmpOp,
        ty: ScalarType,
        x: Value,
        y: Value,
    ) -> Result<Value> {
        Ok(match ty {
            ScalarType::F32 => self.b.ins().fcmp(Self::float_cc(op), x, y),
            ScalarType::U32 | ScalarType::I32 | ScalarType::Bool => {
                let cc = Self::int_cc(op, ty == ScalarType::I32);
                self.b.ins().icmp(cc, x, y)
            }
        })
    }

    /// `f32` to `u32`/`i32`: round to an integral `f32` with `rounding`, then convert with
    /// saturation (NaN to 0). The conversion of an integral value is exact.
    pub(super) fn float_to_int(
        &mut self,
        v: Value,
        to: ScalarType,
        rounding: Rounding,
    ) -> Result<Value> {
        let r = match rounding {
            Rounding::NearestEven => self.b.ins().nearest(v),
            Rounding::Down => self.b.ins().floor(v),
            Rounding::Up => self.b.ins().ceil(v),
            // The saturating conversions truncate already.
            Rounding::TowardZero => v,
        };
        match to {
            ScalarType::U32 => Ok(self.b.ins().fcvt_to_uint_sat(I32, r)),
            ScalarType::I32 => Ok(self.b.ins().fcvt_to_sint_sat(I32, r)),
            ScalarType::F32 | ScalarType::Bool => Err(not_defined("float_to_int", to)),
        }
    }

    /// `u32`/`i32` to `f32` with `rounding`. Round to nearest even is Cranelift's conversion;
    /// the directed roundings convert exactly to `f64`, round that to nearest even `f32`, and
    /// step one ulp toward the requested direction when the nearest value lies on the wrong side
    /// (the two neighbours of an integer below 2^32 are finite and non-zero when it is inexact).
    pub(super) fn int_to_float(
        &mut self,
        v: Value,
        from: ScalarType,
        rounding: Rounding,
    ) -> Result<Value> {
        let signed = match from {
            ScalarType::U32 => false,
            ScalarType::I32 => true,
            ScalarType::F32 | ScalarType::Bool => return Err(not_defined("int_to_float", from)),
        };
        if rounding == Rounding::NearestEven {
            return Ok(if signed {
                self.b.ins().fcvt_from_sint(F32, v)
            } else {
                self.b.ins().fcvt_from_uint(F32, v)
            });
        }
        let exact = if signed {
            self.b.ins().fcvt_from_sint(F64, v)
        } else {
            self.b.ins().fcvt_from_uint(F64, v)
        };
        let near = self.b.ins().fdemote(F32, exact);
        let back = self.b.ins().fpromote(F64, near);
        let bits = self.b.ins().bitcast(I32, MemFlagsData::new(), near);
        let one = self.c32(1);
        let up_bits = self.b.ins().iadd(bits, one); // one ulp away from zero
        let down_bits = self.b.ins().isub(bits, one); // one ulp toward zero
        let zero = self.b.ins().f64const(0.0);
        let positive = self.b.ins().fcmp(FloatCC::GreaterThan, exact, zero);
        let out = match rounding {
            Rounding::Down => {
                let wrong = self.b.ins().fcmp(FloatCC::GreaterThan, back, exact);
                let stepped = self.b.ins().select(positive, down_bits, up_bits);
                self.b.ins().select(wrong, stepped, bits)
            }
            Rounding::Up => {
                let wrong = self.b.ins().fcmp(FloatCC::LessThan, back, exact);
                let stepped = self.b.ins().select(positive, up_bits, down_bits);
                self.b.ins().select(wrong, stepped, bits)
            }
            Rounding::TowardZero => {
                let (ab, ae) = (self.b.ins().fabs(back), self.b.ins().fabs(exact));
                let wrong = self.b.ins().fcmp(FloatCC::GreaterThan, ab, ae);
                self.b.ins().select(wrong, down_bits, bits)
            }
            Rounding::NearestEven => bits,
        };
        Ok(self.b.ins().bitcast(F32, MemFlagsData::new(), out))
    }

    /// Reinterprets 32 bits.
    pub(super) fn bitcast(&mut self, v: Value, from: ScalarType, to: ScalarType) -> Result<Value> {
        if from == ScalarType::Bool || to == ScalarType::Bool {
            return Err(not_defined("bitcast", ScalarType::Bool));
        }
        let (f, t) = (clif_type(from), clif_type(to));
        Ok(if f == t {
            v
        } else {
            self.b.ins().bitcast(t, MemFlagsData::new(), v)
        })
    }
}
