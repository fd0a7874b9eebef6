//! Ops as lane values: arithmetic with the IR's corner cases, memory (gather / scatter on the raw
//! buffers), table lookups, and `reduce` (`search_sorted` arrives decomposed into lookups).

use qforge_ir::{
    BinaryOp, CmpOp, DType, NanMode, Op, ParamId, ReduceKind, ReduceOrder, ScalarType, UnaryOp,
    Value,
};

use super::emit::{raw_elt, Effects, Emitter};
use crate::error::Result;

const SIGN: u32 = 0x8000_0000;

impl Emitter<'_> {
    /// Emits the op of `v` and returns its lane value.
    pub(super) fn op(&mut self, v: Value) -> Result<String> {
        let k = self.k;
        let def = &k.values[v];
        let ty = def.ty;
        let vty = |x: Value| k.values[x].ty;
        Ok(match &def.op {
            Op::WorkItem => {
                let r = self.fresh();
                self.line(format!(
                    "{r} = stablehlo.iota dim = 0 : {}",
                    self.lane(ScalarType::U32)
                ));
                r
            }
            Op::LoopIndex => self.val(v),
            Op::Param(p) => self.scalars[p.index()].clone(),
            Op::Const(c) => self.splat(ty, c.bits()),
            Op::ReadVar(var) => self.vars[var.index()].clone(),
            Op::Load { buf, index } => {
                let idx = self.val(*index);
                self.load(*buf, &idx)
            }
            Op::Lookup { table, index } => {
                let t = &k.tables[*table];
                let n = t.data.len();
                let data: Vec<String> = t.data.iter().map(|b| b.to_string()).collect();
                let table_t = format!("tensor<{n}xui32>");
                let c = self.constant(&table_t, &format!("[{}]", data.join(", ")));
                let idx = self.val(*index);
                let raw = self.gather(&c, &table_t, &idx, "ui32");
                self.bits_as(&raw, t.ty)
            }
            // Rewritten into lookups and compares by `decompose::search` before lowering.
            Op::SearchSorted { .. } => return Err(self.unsupported("search_sorted".into())),
            Op::Unary(op, a) => {
                let a = self.val(*a);
                self.unary(*op, ty, &a)?
            }
            Op::Binary(op, a, b) => {
                let (a, b) = (self.val(*a), self.val(*b));
                self.binary(*op, ty, &a, &b)?
            }
            Op::Fma(a, b, c) => {
                let (a, b, c) = (self.val(*a), self.val(*b), self.val(*c));
                self.fma(&a, &b, &c)
            }
            Op::Cmp(op, a, b) => {
                let t = vty(*a);
                let (a, b) = (self.val(*a), self.val(*b));
                self.compare(*op, t, &a, &b)
            }
            Op::Select {
                cond,
                if_true,
                if_false,
            } => {
                let (c, t, f) = (self.val(*cond), self.val(*if_true), self.val(*if_false));
                let lt = self.lane(ty);
                self.select(&c, &t, &f, &lt)
            }
            Op::FloatToInt {
                value,
                to,
                rounding,
            } => {
                let x = self.val(*value);
                self.float_to_int(&x, *to, *rounding)
            }
            Op::IntToFloat { value, rounding } => {
                let from = vty(*value);
                let x = self.val(*value);
                self.int_to_float(&x, from, *rounding)
            }
            Op::Bitcast { value, to } => {
                let from = vty(*value);
                let x = self.val(*value);
                if from == *to {
                    x
                } else {
                    let (f, t) = (self.lane(from), self.lane(*to));
                    self.conv("bitcast_convert", &x, &f, &t)
                }
            }
            Op::Reduce {
                kind,
                buf,
                start,
                len,
                order,
            } => {
                let (start, len) = (self.val(*start), self.val(*len));
                self.reduce(*kind, *buf, &start, &len, *order)?
            }
        })
    }

    /// A `ui32` lane value of raw bits reinterpreted as `ty` (`f32`, `u32` or `i32`).
    fn bits_as(&mut self, raw: &str, ty: ScalarType) -> String {
        if ty == ScalarType::U32 {
            return raw.to_string();
        }
        let (f, t) = (self.lane(ScalarType::U32), self.lane(ty));
        self.conv("bitcast_convert", raw, &f, &t)
    }

    /// The bits of a lane value of type `ty` as `ui32`.
    pub(super) fn bits_of(&mut self, x: &str, ty: ScalarType) -> String {
        if ty == ScalarType::U32 {
            return x.to_string();
        }
        let (f, t) = (self.lane(ty), self.lane(ScalarType::U32));
        self.conv("bitcast_convert", x, &f, &t)
    }

    /// Element `idx[l]` (a `u32` lane value) of every lane from the 1-d tensor `src` of type
    /// `src_t` with elements `e`; StableHLO clamps the index into the tensor.
    fn gather(&mut self, src: &str, src_t: &str, idx: &str, e: &str) -> String {
        let g = self.g;
        let i64s = self.conv(
            "convert",
            idx,
            &self.lane(ScalarType::U32),
            &self.lane_of("i64"),
        );
        let col = self.fresh();
        self.line(format!(
            "{col} = stablehlo.reshape {i64s} : ({}) -> tensor<{g}x1xi64>",
            self.lane_of("i64")
        ));
        let r = self.fresh();
        self.line(format!(
            "{r} = \"stablehlo.gather\"({src}, {col}) {{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1>}} : ({src_t}, tensor<{g}x1xi64>) -> {}",
            self.lane_of(e)
        ));
        r
    }

    /// `load buf[idx]`, widened to the dtype's value type.
    fn load(&mut self, buf: ParamId, idx: &str) -> String {
        let i = buf.index();
        let dtype = self.dtype(i);
        let raw_e = raw_elt(dtype);
        let bt = self.buf_type(i);
        let src = self.bufs[i].clone();
        let raw = self.gather(&src, &bt, idx, raw_e);
        let raw_t = self.lane_of(raw_e);
        match dtype {
            DType::F32 => self.bits_as(&raw, ScalarType::F32),
            DType::U32 => raw,
            DType::I32 => self.bits_as(&raw, ScalarType::I32),
            DType::F16 | DType::BF16 => {
                let h = if dtype == DType::F16 { "f16" } else { "bf16" };
                let half = self.conv("bitcast_convert", &raw, &raw_t, &self.lane_of(h));
                self.conv(
                    "convert",
                    &half,
                    &self.lane_of(h),
                    &self.lane(ScalarType::F32),
                )
            }
            DType::U8 => self.conv("convert", &raw, &raw_t, &self.lane(ScalarType::U32)),
            DType::I8 => {
                let s = self.conv("bitcast_convert", &raw, &raw_t, &self.lane_of("i8"));
                self.conv(
                    "convert",
                    &s,
                    &self.lane_of("i8"),
                    &self.lane(ScalarType::I32),
                )
            }
        }
    }

    /// `store buf[idx] = value` in the active lanes; other lanes, and indices past the end,
    /// write the spare element.
    pub(super) fn store(&mut self, buf: ParamId, idx: &str, value: &str) {
        let i = buf.index();
        let dtype = self.dtype(i);
        let n = self.elements[i];
        let g = self.g;
        let raw_e = raw_elt(dtype);
        let raw_t = self.lane_of(raw_e);
        let u = self.lane(ScalarType::U32);
        let raw = match dtype {
            DType::F32 => self.bits_of(value, ScalarType::F32),
            DType::U32 => value.to_string(),
            DType::I32 => self.bits_of(value, ScalarType::I32),
            DType::F16 | DType::BF16 => {
                let h = if dtype == DType::F16 { "f16" } else { "bf16" };
                let half = self.conv(
                    "convert",
                    value,
                    &self.lane(ScalarType::F32),
                    &self.lane_of(h),
                );
                self.conv("bitcast_convert", &half, &self.lane_of(h), &raw_t)
            }
            DType::U8 | DType::I8 => {
                let bits = if dtype == DType::I8 {
                    self.bits_of(value, ScalarType::I32)
                } else {
                    value.to_string()
                };
                let ff = self.splat(ScalarType::U32, 0xff);
                let low = self.bin("and", &bits, &ff, &u);
                self.conv("convert", &low, &u, &raw_t)
            }
        };
        let end = self.splat(ScalarType::U32, n as u32);
        let inside = self.cmp("LT", idx, &end, &u, "UNSIGNED");
        let ok = self.and_mask(self.mask.clone().as_deref(), &inside);
        let target = self.select(&ok, idx, &end, &u);
        let i64s = self.conv("convert", &target, &u, &self.lane_of("i64"));
        let col = self.fresh();
        self.line(format!(
            "{col} = stablehlo.reshape {i64s} : ({}) -> tensor<{g}x1xi64>",
            self.lane_of("i64")
        ));
        let (x, y) = (self.fresh(), self.fresh());
        let bt = self.buf_type(i);
        let r = self.fresh();
        self.line(format!(
            "{r} = \"stablehlo.scatter\"({}, {col}, {raw}) ({{",
            self.bufs[i]
        ));
        self.line(format!("^bb0({x}: tensor<{raw_e}>, {y}: tensor<{raw_e}>):"));
        self.line(format!("  stablehlo.return {y} : tensor<{raw_e}>"));
        self.line(format!(
            "}}) {{indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, unique_indices = false}} : ({bt}, tensor<{g}x1xi64>, {raw_t}) -> {bt}"
        ));
        self.bufs[i] = r;
    }

    fn unary(&mut self, op: UnaryOp, ty: ScalarType, a: &str) -> Result<String> {
        let t = self.lane(ty);
        Ok(match (op, ty) {
            (UnaryOp::Neg, ScalarType::F32) | (UnaryOp::Abs, ScalarType::F32) => {
                let bits = self.bits_of(a, ScalarType::F32);
                let u = self.lane(ScalarType::U32);
                let r = if op == UnaryOp::Neg {
                    let s = self.splat(ScalarType::U32, SIGN);
                    self.bin("xor", &bits, &s, &u)
                } else {
                    let s = self.splat(ScalarType::U32, !SIGN);
                    self.bin("and", &bits, &s, &u)
                };
                self.bits_as(&r, ScalarType::F32)
            }
            (UnaryOp::Neg, ScalarType::U32 | ScalarType::I32) => {
                let z = self.splat(ty, 0);
                self.bin("subtract", &z, a, &t)
            }
            (UnaryOp::Abs, ScalarType::I32) => {
                let z = self.splat(ty, 0);
                let neg = self.bin("subtract", &z, a, &t);
                let is_neg = self.cmp("LT", a, &z, &t, "SIGNED");
                self.select(&is_neg, &neg, a, &t)
            }
            (UnaryOp::Abs, ScalarType::U32) => a.to_string(),
            (UnaryOp::Sqrt, ScalarType::F32) => self.un("sqrt", a, &t),
            (UnaryOp::Not, ScalarType::Bool | ScalarType::U32 | ScalarType::I32) => {
                self.un("not", a, &t)
            }
            _ => return Err(self.unsupported(format!("{op:?} on {ty:?}"))),
        })
    }

    fn binary(&mut self, op: BinaryOp, ty: ScalarType, a: &str, b: &str) -> Result<String> {
        let t = self.lane(ty);
        let kind = match ty {
            ScalarType::F32 => "FLOAT",
            ScalarType::I32 => "SIGNED",
            ScalarType::U32 | ScalarType::Bool => "UNSIGNED",
        };
        if ty == ScalarType::Bool && !matches!(op, BinaryOp::And | BinaryOp::Or | BinaryOp::Xor) {
            return Err(self.unsupported(format!("{op:?} on bool")));
        }
        Ok(match op {
            BinaryOp::Add => self.bin("add", a, b, &t),
            BinaryOp::Sub => self.bin("subtract", a, b, &t),
            BinaryOp::Mul => self.bin("multiply", a, b, &t),
            BinaryOp::And => self.bin("and", a, b, &t),
            BinaryOp::Or => self.bin("or", a, b, &t),
            BinaryOp::Xor => self.bin("xor", a, b, &t),
            // select(b < a, b, a) / select(b > a, b, a), as the IR defines them.
            BinaryOp::Min | BinaryOp::Max => {
                let dir = if op == BinaryOp::Min { "LT" } else { "GT" };
                let c = self.cmp(dir, b, a, &t, kind);
                self.select(&c, b, a, &t)
            }
            BinaryOp::Div | BinaryOp::Rem if ty == ScalarType::F32 => {
                if op == BinaryOp::Div {
                    self.bin("divide", a, b, &t)
                } else {
                    return Err(self.unsupported("rem on f32".into()));
                }
            }
            BinaryOp::Div | BinaryOp::Rem => self.int_div(op, ty, a, b),
            BinaryOp::Shl | BinaryOp::Shr => {
                let m = self.splat(ty, 31);
                let s = self.bin("and", b, &m, &t);
                let name = match (op, ty) {
                    (BinaryOp::Shl, _) => "shift_left",
                    (_, ScalarType::I32) => "shift_right_arithmetic",
                    _ => "shift_right_logical",
                };
                self.bin(name, a, &s, &t)
            }
            BinaryOp::MulHi => {
                let wide = if ty == ScalarType::I32 { "i64" } else { "ui64" };
                let wt = self.lane_of(wide);
                let (a2, b2) = (
                    self.conv("convert", a, &t, &wt),
                    self.conv("convert", b, &t, &wt),
                );
                let p = self.bin("multiply", &a2, &b2, &wt);
                let k32 = self.splat_of(wide, "32");
                let sh = if ty == ScalarType::I32 {
                    "shift_right_arithmetic"
                } else {
                    "shift_right_logical"
                };
                let hi = self.bin(sh, &p, &k32, &wt);
                self.conv("convert", &hi, &wt, &t)
            }
        })
    }

    /// Integer `/` and `%` with the IR's corners: a zero divisor gives 0, and `i32::MIN / -1`
    /// wraps to `MIN` (remainder 0). The divisor StableHLO sees is never 0 or (for `MIN`) -1.
    fn int_div(&mut self, op: BinaryOp, ty: ScalarType, a: &str, b: &str) -> String {
        let t = self.lane(ty);
        let bt = self.lane(ScalarType::Bool);
        let kind = if ty == ScalarType::I32 {
            "SIGNED"
        } else {
            "UNSIGNED"
        };
        let zero = self.splat(ty, 0);
        let one = self.splat(ty, 1);
        let by_zero = self.cmp("EQ", b, &zero, &t, kind);
        let bad = if ty == ScalarType::I32 {
            let min = self.splat(ty, SIGN);
            let m1 = self.splat(ty, u32::MAX);
            let a_min = self.cmp("EQ", a, &min, &t, kind);
            let b_m1 = self.cmp("EQ", b, &m1, &t, kind);
            let ov = self.bin("and", &a_min, &b_m1, &bt);
            self.bin("or", &by_zero, &ov, &bt)
        } else {
            by_zero.clone()
        };
        let safe = self.select(&bad, &one, b, &t);
        let name = if op == BinaryOp::Div {
            "divide"
        } else {
            "remainder"
        };
        let r = self.bin(name, a, &safe, &t);
        self.select(&by_zero, &zero, &r, &t)
    }

    fn compare(&mut self, op: CmpOp, ty: ScalarType, a: &str, b: &str) -> String {
        let dir = match op {
            CmpOp::Eq => "EQ",
            CmpOp::Ne => "NE",
            CmpOp::Lt => "LT",
            CmpOp::Le => "LE",
            CmpOp::Gt => "GT",
            CmpOp::Ge => "GE",
        };
        let (a, b, ty) = if ty == ScalarType::Bool {
            let (bt, u) = (self.lane(ScalarType::Bool), self.lane(ScalarType::U32));
            (
                self.conv("convert", a, &bt, &u),
                self.conv("convert", b, &bt, &u),
                ScalarType::U32,
            )
        } else {
            (a.to_string(), b.to_string(), ty)
        };
        let kind = match ty {
            ScalarType::F32 => "FLOAT",
            ScalarType::I32 => "SIGNED",
            ScalarType::U32 | ScalarType::Bool => "UNSIGNED",
        };
        let t = self.lane(ty);
        self.cmp(dir, &a, &b, &t, kind)
    }

    /// `Op::Reduce` over `buf[start .. start + len]` of every active lane: a loop over a counter
    /// shared by the lanes, each lane adding (or taking the max of) its element while the counter
    /// is below its `len`.
    fn reduce(
        &mut self,
        kind: ReduceKind,
        buf: ParamId,
        start: &str,
        len: &str,
        order: ReduceOrder,
    ) -> Result<String> {
        let limit = self.max_active(len);
        let f = self.lane(ScalarType::F32);
        let u = self.lane(ScalarType::U32);
        let b = self.lane(ScalarType::Bool);
        let outer = self.mask.clone();
        let ways = match kind {
            ReduceKind::Sum => order.ways().max(1),
            ReduceKind::AbsMax(_) => 1,
        };
        let pty = self.partials_type(ways);
        let init = match kind {
            ReduceKind::Sum => self.constant(&pty, "-0.0"),
            ReduceKind::AbsMax(_) => self.splat(ScalarType::F32, 0),
        };
        let no_nan = self.splat(ScalarType::Bool, 0);
        let zero = self.constant("tensor<ui32>", "0");
        let state = vec![
            (zero, "tensor<ui32>".to_string()),
            (init, pty.clone()),
            (no_nan, b.clone()),
        ];
        let r = self.while_loop(
            state,
            &Effects::default(),
            |e, s| Ok(e.cmp("LT", &s[0], &limit, "tensor<ui32>", "UNSIGNED")),
            |e, s| {
                let i = e.broadcast(&s[0], "ui32");
                let inside = e.cmp("LT", &i, len, &u, "UNSIGNED");
                let m = e.and_mask(outer.as_deref(), &inside);
                let at = e.bin("add", start, &i, &u);
                let x = e.load(buf, &at);
                let next_i = e.counter_next(&s[0]);
                Ok(match kind {
                    ReduceKind::Sum => {
                        let p = e.partial_get(&s[1], &s[0], ways);
                        let sum = e.bin("add", &p, &x, &f);
                        let kept = e.select(&m, &sum, &p, &f);
                        let p2 = e.partial_set(&s[1], &kept, &s[0], ways);
                        vec![next_i, p2, s[2].clone()]
                    }
                    ReduceKind::AbsMax(_) => {
                        let a = e.unary(UnaryOp::Abs, ScalarType::F32, &x)?;
                        let gt = e.cmp("GT", &a, &s[1], &f, "FLOAT");
                        let take = e.bin("and", &m, &gt, &b);
                        let acc = e.select(&take, &a, &s[1], &f);
                        let nan = e.cmp("NE", &a, &a, &f, "FLOAT");
                        let nan_here = e.bin("and", &m, &nan, &b);
                        let seen = e.bin("or", &s[2], &nan_here, &b);
                        vec![next_i, acc, seen]
                    }
                })
            },
        )?;
        self.mask = outer;
        Ok(match kind {
            ReduceKind::Sum => self.tree(&r[1], ways, "add"),
            ReduceKind::AbsMax(NanMode::Ignore) => r[1].clone(),
            ReduceKind::AbsMax(NanMode::Propagate) => {
                let nan = self.splat(ScalarType::F32, 0x7fc0_0000);
                self.select(&r[2], &nan, &r[1], &f)
            }
        })
    }
}
