//! Arithmetic, bit operations, comparisons, selects and conversions, on scalars or on vectors
//! of `lanes` values (the same instructions: LLVM's arithmetic is lane-wise).

use qforge_ir::{BinaryOp, CmpOp, Op, Rounding, ScalarType, UnaryOp};

use super::emit::{internal, literal, scalar_ty, suffix, ty, vec_of, Emitter};
use crate::error::Result;

fn not_defined(op: &str, t: ScalarType) -> crate::error::Error {
    internal(format!("{op} on {t} passed the verifier"))
}

impl Emitter<'_> {
    /// Lowers a pure op (no memory, no index) on `lanes` lanes, yielding its operand.
    pub(super) fn pure(&mut self, op: &Op, out_ty: ScalarType, lanes: u32) -> Result<String> {
        let vty = |e: &Self, v: qforge_ir::Value| e.k.values[v].ty;
        Ok(match op {
            Op::Unary(u, a) => {
                let t = vty(self, *a);
                let a = self.get(*a, lanes)?;
                self.unary(*u, t, lanes, &a)?
            }
            Op::Binary(b, x, y) => {
                let t = vty(self, *x);
                let (x, y) = (self.get(*x, lanes)?, self.get(*y, lanes)?);
                self.binary(*b, t, lanes, &x, &y)?
            }
            Op::Fma(a, b, c) => {
                let (a, b, c) = (
                    self.get(*a, lanes)?,
                    self.get(*b, lanes)?,
                    self.get(*c, lanes)?,
                );
                self.fma(lanes, &a, &b, &c)
            }
            Op::Cmp(c, x, y) => {
                let t = vty(self, *x);
                let (x, y) = (self.get(*x, lanes)?, self.get(*y, lanes)?);
                self.compare(*c, t, lanes, &x, &y)
            }
            Op::Select {
                cond,
                if_true,
                if_false,
            } => {
                let c = self.get(*cond, lanes)?;
                let (a, b) = (self.get(*if_true, lanes)?, self.get(*if_false, lanes)?);
                self.select(&c, out_ty, lanes, &a, &b)
            }
            Op::FloatToInt {
                value,
                to,
                rounding,
            } => {
                let v = self.get(*value, lanes)?;
                self.float_to_int(&v, *to, *rounding, lanes)?
            }
            Op::IntToFloat { value, rounding } => {
                let from = vty(self, *value);
                let v = self.get(*value, lanes)?;
                self.int_to_float(&v, from, *rounding, lanes)?
            }
            Op::Bitcast { value, to } => {
                let from = vty(self, *value);
                let v = self.get(*value, lanes)?;
                self.bitcast(&v, from, *to, lanes)?
            }
            Op::WorkItem
            | Op::LoopIndex
            | Op::Param(_)
            | Op::Const(_)
            | Op::ReadVar(_)
            | Op::Load { .. }
            | Op::Lookup { .. }
            | Op::Reduce { .. } => return Err(internal("not a pure op")),
            Op::SearchSorted { .. } => return Err(crate::decompose::undecomposed(super::BACKEND)),
        })
    }

    /// `fma(a, b, c)` on `f32` lanes (one rounding).
    pub(super) fn fma(&mut self, lanes: u32, a: &str, b: &str, c: &str) -> String {
        let t = ty(ScalarType::F32, lanes);
        let name = format!("llvm.fma.{}", suffix("float", lanes));
        self.call(&name, &t, &[(&t, a), (&t, b), (&t, c)])
    }

    /// `select(c, a, b)` with `c` of `lanes` bools.
    pub(super) fn select(
        &mut self,
        c: &str,
        t: ScalarType,
        lanes: u32,
        a: &str,
        b: &str,
    ) -> String {
        let (ct, vt) = (ty(ScalarType::Bool, lanes), ty(t, lanes));
        self.ins(format!("select {ct} {c}, {vt} {a}, {vt} {b}"))
    }

    /// Calls the one-operand intrinsic `llvm.{name}.{suffix}` on `lanes` values of `t`.
    fn unary_intrinsic(&mut self, name: &str, t: ScalarType, lanes: u32, a: &str) -> String {
        let vt = ty(t, lanes);
        let full = format!("llvm.{name}.{}", suffix(scalar_ty(t), lanes));
        self.call(&full, &vt, &[(&vt, a)])
    }

    /// A unary op on operands of type `t`.
    pub(super) fn unary(
        &mut self,
        op: UnaryOp,
        t: ScalarType,
        lanes: u32,
        a: &str,
    ) -> Result<String> {
        let vt = ty(t, lanes);
        Ok(match (op, t) {
            // `fneg` and `llvm.fabs` are pure sign-bit operations, also on NaN, inf and zeros.
            (UnaryOp::Neg, ScalarType::F32) => self.ins(format!("fneg {vt} {a}")),
            (UnaryOp::Neg, ScalarType::U32 | ScalarType::I32) => {
                let zero = literal(t, lanes, 0);
                self.ins(format!("sub {vt} {zero}, {a}"))
            }
            (UnaryOp::Abs, ScalarType::F32) => self.unary_intrinsic("fabs", t, lanes, a),
            // Wrapping: `llvm.abs` with `is_int_min_poison = false` keeps i32::MIN.
            (UnaryOp::Abs, ScalarType::I32) => {
                let name = format!("llvm.abs.{}", suffix("i32", lanes));
                self.call(&name, &vt, &[(&vt, a), ("i1", "false")])
            }
            (UnaryOp::Sqrt, ScalarType::F32) => self.unary_intrinsic("sqrt", t, lanes, a),
            (UnaryOp::Not, ScalarType::U32 | ScalarType::I32 | ScalarType::Bool) => {
                let ones = literal(t, lanes, u32::MAX);
                self.ins(format!("xor {vt} {a}, {ones}"))
            }
            (UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sqrt | UnaryOp::Not, _) => {
                return Err(not_defined(op.name(), t))
            }
        })
    }

    /// `x == c` on `i32` lanes.
    fn eq_const(&mut self, x: &str, c: u32, lanes: u32) -> String {
        let (vt, c) = (
            ty(ScalarType::U32, lanes),
            literal(ScalarType::U32, lanes, c),
        );
        self.ins(format!("icmp eq {vt} {x}, {c}"))
    }

    /// The high 32 bits of the exact 64-bit products of `x` and `y` (`signed`: `i32`). Scalar:
    /// the product in `i64`, shifted down. Vectors (an even number of lanes): the 32-bit lanes
    /// as 64-bit pairs, one multiply of the even lanes and one of the odd lanes (each of the
    /// low 32 bits of 64-bit lanes, `vpmuludq`/`vpmuldq` on x86), and the high words put back
    /// in place, where widening every lane to `i64` took twice the instructions.
    fn mul_hi(&mut self, signed: bool, lanes: u32, x: &str, y: &str) -> String {
        let (ext, shr) = if signed {
            ("sext", "ashr")
        } else {
            ("zext", "lshr")
        };
        if lanes == 1 || lanes % 2 == 1 {
            let vt = vec_of("i32", lanes);
            let wt = vec_of("i64", lanes);
            let wx = self.ins(format!("{ext} {vt} {x} to {wt}"));
            let wy = self.ins(format!("{ext} {vt} {y} to {wt}"));
            let p = self.ins(format!("mul {wt} {wx}, {wy}"));
            let k = if lanes == 1 {
                "32".to_string()
            } else {
                format!("<{}>", vec!["i64 32"; lanes as usize].join(", "))
            };
            let hi = self.ins(format!("{shr} {wt} {p}, {k}"));
            return self.ins(format!("trunc {wt} {hi} to {vt}"));
        }
        let half = lanes / 2;
        let vt = format!("<{lanes} x i32>");
        let qt = format!("<{half} x i64>");
        let q = |v: u64| {
            format!(
                "<{}>",
                vec![format!("i64 {}", v as i64); half as usize].join(", ")
            )
        };
        let (q32, low) = (q(32), q(0xFFFF_FFFF));
        // The low (even) lane of each pair, extended to 64 bits in place; the high (odd) lane
        // shifted down and extended.
        let even = |e: &mut Self, v: &str| -> String {
            let w = e.ins(format!("bitcast {vt} {v} to {qt}"));
            if signed {
                let up = e.ins(format!("shl {qt} {w}, {q32}"));
                e.ins(format!("ashr {qt} {up}, {q32}"))
            } else {
                e.ins(format!("and {qt} {w}, {low}"))
            }
        };
        let odd = |e: &mut Self, v: &str| -> String {
            let w = e.ins(format!("bitcast {vt} {v} to {qt}"));
            e.ins(format!("{shr} {qt} {w}, {q32}"))
        };
        let (ex, ey) = (even(self, x), even(self, y));
        let (ox, oy) = (odd(self, x), odd(self, y));
        let pe = self.ins(format!("mul {qt} {ex}, {ey}"));
        let po = self.ins(format!("mul {qt} {ox}, {oy}"));
        // Even lanes take the high word of `pe` (moved down), odd lanes the high word of `po`
        // (already in the high half).
        let he = self.ins(format!("lshr {qt} {pe}, {q32}"));
        let ho = self.ins(format!("and {qt} {po}, {}", q(0xFFFF_FFFF_0000_0000)));
        let h = self.ins(format!("or {qt} {he}, {ho}"));
        self.ins(format!("bitcast {qt} {h} to {vt}"))
    }

    /// A binary op on two operands of type `t`.
    pub(super) fn binary(
        &mut self,
        op: BinaryOp,
        t: ScalarType,
        lanes: u32,
        x: &str,
        y: &str,
    ) -> Result<String> {
        use ScalarType::{Bool, F32 as Sf, I32 as Si, U32 as Su};
        let vt = ty(t, lanes);
        let lit = |v: u32| literal(Su, lanes, v);
        let simple = |e: &mut Self, name: &str| e.ins(format!("{name} {vt} {x}, {y}"));
        Ok(match (op, t) {
            (BinaryOp::Add, Sf) => simple(self, "fadd"),
            (BinaryOp::Sub, Sf) => simple(self, "fsub"),
            (BinaryOp::Mul, Sf) => simple(self, "fmul"),
            (BinaryOp::Div, Sf) => simple(self, "fdiv"),
            (BinaryOp::Add, Su | Si) => simple(self, "add"),
            (BinaryOp::Sub, Su | Si) => simple(self, "sub"),
            (BinaryOp::Mul, Su | Si) => simple(self, "mul"),
            (BinaryOp::MulHi, Su | Si) => self.mul_hi(t == Si, lanes, x, y),
            (BinaryOp::Div | BinaryOp::Rem, Su) => {
                // x / 0 = 0 = x % 0; the divisor is made non-zero first (LLVM: undefined).
                let zero = self.eq_const(y, 0, lanes);
                let d = self.select(&zero, Su, lanes, &lit(1), y);
                if op == BinaryOp::Div {
                    let q = self.ins(format!("udiv {vt} {x}, {d}"));
                    self.select(&zero, Su, lanes, &lit(0), &q)
                } else {
                    self.ins(format!("urem {vt} {x}, {d}"))
                }
            }
            (BinaryOp::Div, Si) => {
                // x / 0 = 0 and i32::MIN / -1 = i32::MIN (= i32::MIN / 1). The zero divisors
                // are replaced first, by a select on `y` alone: when `y` is a constant vector
                // (a deferred lookup's table) it folds to a constant without zero lanes. One
                // select on `zero | ovf` would keep the constant with its zero lane as an arm,
                // and LLVM folds `sdiv x, select(c, 1, C)` to `x` when `C` has a zero lane
                // (division by it would be undefined).
                let zero = self.eq_const(y, 0, lanes);
                let nz = self.select(&zero, Si, lanes, &lit(1), y);
                let min = self.eq_const(x, i32::MIN as u32, lanes);
                let m1 = self.eq_const(y, u32::MAX, lanes);
                let bt = ty(Bool, lanes);
                let ovf = self.ins(format!("and {bt} {min}, {m1}"));
                let d = self.select(&ovf, Si, lanes, &lit(1), &nz);
                let q = self.ins(format!("sdiv {vt} {x}, {d}"));
                self.select(&zero, Si, lanes, &lit(0), &q)
            }
            (BinaryOp::Rem, Si) => {
                // x % 0 = 0 = x % 1, and x % -1 = 0 = x % 1.
                let zero = self.eq_const(y, 0, lanes);
                let m1 = self.eq_const(y, u32::MAX, lanes);
                let bt = ty(Bool, lanes);
                let fix = self.ins(format!("or {bt} {zero}, {m1}"));
                let d = self.select(&fix, Si, lanes, &lit(1), y);
                self.ins(format!("srem {vt} {x}, {d}"))
            }
            // min(x, y) = select(y < x, y, x); max(x, y) = select(y > x, y, x).
            (BinaryOp::Min, Sf | Su | Si) => {
                let c = self.compare(CmpOp::Lt, t, lanes, y, x);
                self.select(&c, t, lanes, y, x)
            }
            (BinaryOp::Max, Sf | Su | Si) => {
                let c = self.compare(CmpOp::Gt, t, lanes, y, x);
                self.select(&c, t, lanes, y, x)
            }
            (BinaryOp::And, Su | Si | Bool) => simple(self, "and"),
            (BinaryOp::Or, Su | Si | Bool) => simple(self, "or"),
            (BinaryOp::Xor, Su | Si | Bool) => simple(self, "xor"),
            // The amount is `y & 31` (LLVM: a shift by 32 or more is poison).
            (BinaryOp::Shl | BinaryOp::Shr, Su | Si) => {
                let amount = self.ins(format!("and {vt} {y}, {}", lit(31)));
                let name = match (op, t) {
                    (BinaryOp::Shl, _) => "shl",
                    (_, Si) => "ashr",
                    _ => "lshr",
                };
                self.ins(format!("{name} {vt} {x}, {amount}"))
            }
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
            ) => return Err(not_defined(op.name(), t)),
        })
    }

    /// A comparison of two operands of type `t`, yielding `i1` lanes. Float comparisons are
    /// ordered (false on NaN) except `ne`, which is unordered-or-not-equal (true on NaN).
    pub(super) fn compare(
        &mut self,
        op: CmpOp,
        t: ScalarType,
        lanes: u32,
        x: &str,
        y: &str,
    ) -> String {
        let vt = ty(t, lanes);
        let signed = t == ScalarType::I32;
        let (kind, pred) = match (t, op) {
            (ScalarType::F32, CmpOp::Eq) => ("fcmp", "oeq"),
            (ScalarType::F32, CmpOp::Ne) => ("fcmp", "une"),
            (ScalarType::F32, CmpOp::Lt) => ("fcmp", "olt"),
            (ScalarType::F32, CmpOp::Le) => ("fcmp", "ole"),
            (ScalarType::F32, CmpOp::Gt) => ("fcmp", "ogt"),
            (ScalarType::F32, CmpOp::Ge) => ("fcmp", "oge"),
            (_, CmpOp::Eq) => ("icmp", "eq"),
            (_, CmpOp::Ne) => ("icmp", "ne"),
            (_, CmpOp::Lt) => ("icmp", if signed { "slt" } else { "ult" }),
            (_, CmpOp::Le) => ("icmp", if signed { "sle" } else { "ule" }),
            (_, CmpOp::Gt) => ("icmp", if signed { "sgt" } else { "ugt" }),
            (_, CmpOp::Ge) => ("icmp", if signed { "sge" } else { "uge" }),
        };
        self.ins(format!("{kind} {pred} {vt} {x}, {y}"))
    }

    /// `f32` to `u32`/`i32`: round to an integral `f32` with `rounding`, then the saturating
    /// conversion (NaN to 0), exact on an integral value.
    pub(super) fn float_to_int(
        &mut self,
        v: &str,
        to: ScalarType,
        rounding: Rounding,
        lanes: u32,
    ) -> Result<String> {
        let f = ScalarType::F32;
        let r = match rounding {
            Rounding::NearestEven => self.unary_intrinsic("roundeven", f, lanes, v),
            Rounding::Down => self.unary_intrinsic("floor", f, lanes, v),
            Rounding::Up => self.unary_intrinsic("ceil", f, lanes, v),
            // The saturating conversions truncate already.
            Rounding::TowardZero => v.to_string(),
        };
        let name = match to {
            ScalarType::U32 => "fptoui",
            ScalarType::I32 => "fptosi",
            ScalarType::F32 | ScalarType::Bool => return Err(not_defined("float_to_int", to)),
        };
        let (it, ft) = (ty(to, lanes), ty(f, lanes));
        let full = format!(
            "llvm.{name}.sat.{}.{}",
            suffix("i32", lanes),
            suffix("float", lanes)
        );
        Ok(self.call(&full, &it, &[(&ft, &r)]))
    }

    /// `u32`/`i32` to `f32` with `rounding`. Round to nearest even is LLVM's conversion; the
    /// directed roundings convert exactly to `f64`, round that to nearest even `f32`, and step
    /// one ulp toward the requested direction when the nearest value lies on the wrong side.
    pub(super) fn int_to_float(
        &mut self,
        v: &str,
        from: ScalarType,
        rounding: Rounding,
        lanes: u32,
    ) -> Result<String> {
        let conv = match from {
            ScalarType::U32 => "uitofp",
            ScalarType::I32 => "sitofp",
            ScalarType::F32 | ScalarType::Bool => return Err(not_defined("int_to_float", from)),
        };
        let (it, ft) = (ty(ScalarType::U32, lanes), ty(ScalarType::F32, lanes));
        if rounding == Rounding::NearestEven {
            return Ok(self.ins(format!("{conv} {it} {v} to {ft}")));
        }
        let dt = super::emit::vec_of("double", lanes);
        let exact = self.ins(format!("{conv} {it} {v} to {dt}"));
        let near = self.ins(format!("fptrunc {dt} {exact} to {ft}"));
        let back = self.ins(format!("fpext {ft} {near} to {dt}"));
        let bits = self.ins(format!("bitcast {ft} {near} to {it}"));
        let one = literal(ScalarType::U32, lanes, 1);
        let up_bits = self.ins(format!("add {it} {bits}, {one}")); // one ulp away from zero
        let down_bits = self.ins(format!("sub {it} {bits}, {one}")); // one ulp toward zero
        let dzero = super::emit::splat_literal("double", "0.0", lanes);
        let positive = self.ins(format!("fcmp ogt {dt} {exact}, {dzero}"));
        let u = ScalarType::U32;
        let out = match rounding {
            Rounding::Down => {
                let wrong = self.ins(format!("fcmp ogt {dt} {back}, {exact}"));
                let stepped = self.select(&positive, u, lanes, &down_bits, &up_bits);
                self.select(&wrong, u, lanes, &stepped, &bits)
            }
            Rounding::Up => {
                let wrong = self.ins(format!("fcmp olt {dt} {back}, {exact}"));
                let stepped = self.select(&positive, u, lanes, &up_bits, &down_bits);
                self.select(&wrong, u, lanes, &stepped, &bits)
            }
            Rounding::TowardZero => {
                let fabs = format!("llvm.fabs.{}", suffix("double", lanes));
                let ab = self.call(&fabs, &dt, &[(&dt, &back)]);
                let ae = self.call(&fabs, &dt, &[(&dt, &exact)]);
                let wrong = self.ins(format!("fcmp ogt {dt} {ab}, {ae}"));
                self.select(&wrong, u, lanes, &down_bits, &bits)
            }
            Rounding::NearestEven => bits,
        };
        Ok(self.ins(format!("bitcast {it} {out} to {ft}")))
    }

    /// Reinterprets 32 bits.
    pub(super) fn bitcast(
        &mut self,
        v: &str,
        from: ScalarType,
        to: ScalarType,
        lanes: u32,
    ) -> Result<String> {
        if from == ScalarType::Bool || to == ScalarType::Bool {
            return Err(not_defined("bitcast", ScalarType::Bool));
        }
        let (f, t) = (ty(from, lanes), ty(to, lanes));
        Ok(if f == t {
            v.to_string()
        } else {
            self.ins(format!("bitcast {f} {v} to {t}"))
        })
    }
}
