//! Random expression kernels (f32 and u32 trees with conversions between them) on edge-heavy
//! inputs, against a Rust evaluator of the same tree and the interpreter.

use super::*;

/// An `f32` expression over the inputs.
#[derive(Clone, Debug)]
enum FExpr {
    In(usize),
    Const(f32),
    Unary(UnaryOp, Box<FExpr>),
    Binary(BinaryOp, Box<FExpr>, Box<FExpr>),
    Fma(Box<FExpr>, Box<FExpr>, Box<FExpr>),
    Select(CmpOp, Box<FExpr>, Box<FExpr>, Box<FExpr>, Box<FExpr>),
    FromInt(bool, Rounding, Box<UExpr>),
    FromBits(Box<UExpr>),
}

/// A `u32` expression; `signed` operations go through `i32` bitcasts, `Bits` reads the bits of
/// an `f32` with NaN canonicalized.
#[derive(Clone, Debug)]
enum UExpr {
    In(usize),
    Const(u32),
    Unary(UnaryOp, bool, Box<UExpr>),
    Binary(BinaryOp, bool, Box<UExpr>, Box<UExpr>),
    Select(CmpOp, bool, Box<UExpr>, Box<UExpr>, Box<UExpr>, Box<UExpr>),
    ToInt(bool, Rounding, Box<FExpr>),
    Bits(Box<FExpr>),
}

/// A deterministic generator of expressions from a seed (splitmix64).
struct Gen(u64);

impl Gen {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) % n as u64) as usize
    }
    fn f(&mut self, depth: u32) -> FExpr {
        let b = |g: &mut Gen| Box::new(g.f(depth - 1));
        if depth == 0 || self.below(5) == 0 {
            return if self.below(4) == 0 {
                FExpr::Const(f_edges()[self.below(f_edges().len())])
            } else {
                FExpr::In(self.below(2))
            };
        }
        match self.below(8) {
            0 => FExpr::Unary(
                [UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Sqrt][self.below(3)],
                b(self),
            ),
            1..=3 => {
                let op = [
                    BinaryOp::Add,
                    BinaryOp::Sub,
                    BinaryOp::Mul,
                    BinaryOp::Div,
                    BinaryOp::Min,
                    BinaryOp::Max,
                ][self.below(6)];
                FExpr::Binary(op, b(self), b(self))
            }
            4 => FExpr::Fma(b(self), b(self), b(self)),
            5 => FExpr::Select(
                CmpOp::ALL[self.below(6)],
                b(self),
                b(self),
                b(self),
                b(self),
            ),
            6 => FExpr::FromInt(
                self.below(2) == 0,
                Rounding::ALL[self.below(4)],
                Box::new(self.u(depth - 1)),
            ),
            _ => FExpr::FromBits(Box::new(self.u(depth - 1))),
        }
    }
    fn u(&mut self, depth: u32) -> UExpr {
        let b = |g: &mut Gen| Box::new(g.u(depth - 1));
        if depth == 0 || self.below(5) == 0 {
            return if self.below(4) == 0 {
                UExpr::Const(U_EDGES[self.below(U_EDGES.len())])
            } else {
                UExpr::In(self.below(2))
            };
        }
        match self.below(7) {
            0 => {
                let (op, signed) = [
                    (UnaryOp::Neg, false),
                    (UnaryOp::Not, false),
                    (UnaryOp::Abs, true),
                    (UnaryOp::Neg, true),
                ][self.below(4)];
                UExpr::Unary(op, signed, b(self))
            }
            1..=3 => UExpr::Binary(
                BinaryOp::ALL[self.below(BinaryOp::ALL.len())],
                self.below(2) == 0,
                b(self),
                b(self),
            ),
            4 => UExpr::Select(
                CmpOp::ALL[self.below(6)],
                self.below(2) == 0,
                b(self),
                b(self),
                b(self),
                b(self),
            ),
            5 => UExpr::ToInt(
                self.below(2) == 0,
                Rounding::ALL[self.below(4)],
                Box::new(self.f(depth - 1)),
            ),
            _ => UExpr::Bits(Box::new(self.f(depth - 1))),
        }
    }
}

fn int_to_float_op(b: &mut KernelBuilder, v: Value, rounding: Rounding) -> Value {
    b.op(qforge_ir::Op::IntToFloat { value: v, rounding })
}

fn build_f(b: &mut KernelBuilder, e: &FExpr, fi: &[Value], ui: &[Value]) -> Value {
    match e {
        FExpr::In(k) => fi[*k],
        FExpr::Const(c) => b.const_f32(*c),
        FExpr::Unary(op, a) => {
            let a = build_f(b, a, fi, ui);
            b.unary(*op, a)
        }
        FExpr::Binary(op, x, y) => {
            let (x, y) = (build_f(b, x, fi, ui), build_f(b, y, fi, ui));
            b.binary(*op, x, y)
        }
        FExpr::Fma(x, y, z) => {
            let (x, y, z) = (
                build_f(b, x, fi, ui),
                build_f(b, y, fi, ui),
                build_f(b, z, fi, ui),
            );
            b.fma(x, y, z)
        }
        FExpr::Select(op, x, y, t, f) => {
            let (x, y) = (build_f(b, x, fi, ui), build_f(b, y, fi, ui));
            let c = b.cmp(*op, x, y);
            let (t, f) = (build_f(b, t, fi, ui), build_f(b, f, fi, ui));
            b.select(c, t, f)
        }
        FExpr::FromInt(signed, r, u) => {
            let mut v = build_u(b, u, fi, ui);
            if *signed {
                v = b.bitcast(v, ScalarType::I32);
            }
            int_to_float_op(b, v, *r)
        }
        FExpr::FromBits(u) => {
            let v = build_u(b, u, fi, ui);
            b.bitcast(v, ScalarType::F32)
        }
    }
}

fn build_u(b: &mut KernelBuilder, e: &UExpr, fi: &[Value], ui: &[Value]) -> Value {
    let signed_in = |b: &mut KernelBuilder, v: Value, s: bool| {
        if s {
            b.bitcast(v, ScalarType::I32)
        } else {
            v
        }
    };
    let unsigned_out = |b: &mut KernelBuilder, v: Value, s: bool| {
        if s {
            b.bitcast(v, ScalarType::U32)
        } else {
            v
        }
    };
    match e {
        UExpr::In(k) => ui[*k],
        UExpr::Const(c) => b.const_u32(*c),
        UExpr::Unary(op, s, a) => {
            let a = build_u(b, a, fi, ui);
            let a = signed_in(b, a, *s);
            let r = b.unary(*op, a);
            unsigned_out(b, r, *s)
        }
        UExpr::Binary(op, s, x, y) => {
            let (x, y) = (build_u(b, x, fi, ui), build_u(b, y, fi, ui));
            let (x, y) = (signed_in(b, x, *s), signed_in(b, y, *s));
            let r = b.binary(*op, x, y);
            unsigned_out(b, r, *s)
        }
        UExpr::Select(op, s, x, y, t, f) => {
            let (x, y) = (build_u(b, x, fi, ui), build_u(b, y, fi, ui));
            let (x, y) = (signed_in(b, x, *s), signed_in(b, y, *s));
            let c = b.cmp(*op, x, y);
            let (t, f) = (build_u(b, t, fi, ui), build_u(b, f, fi, ui));
            b.select(c, t, f)
        }
        UExpr::ToInt(s, r, f) => {
            let v = build_f(b, f, fi, ui);
            let to = if *s { ScalarType::I32 } else { ScalarType::U32 };
            let i = b.float_to_int(v, to, *r);
            unsigned_out(b, i, *s)
        }
        UExpr::Bits(f) => {
            // NaN payloads may differ between backends: the bits of a NaN are canonicalized.
            let v = build_f(b, f, fi, ui);
            let nan = b.cmp(CmpOp::Ne, v, v);
            let canonical = b.const_f32(f32::NAN);
            let v = b.select(nan, canonical, v);
            b.bitcast(v, ScalarType::U32)
        }
    }
}

fn cmp_holds<T: PartialOrd>(op: CmpOp, a: T, b: T) -> bool {
    match op {
        CmpOp::Eq => a == b,
        CmpOp::Ne => a != b,
        CmpOp::Lt => a < b,
        CmpOp::Le => a <= b,
        CmpOp::Gt => a > b,
        CmpOp::Ge => a >= b,
    }
}

fn eval_f(e: &FExpr, f: &[f32; 2], u: &[u32; 2]) -> f32 {
    match e {
        FExpr::In(k) => f[*k],
        FExpr::Const(c) => *c,
        FExpr::Unary(op, a) => {
            let a = eval_f(a, f, u);
            match op {
                UnaryOp::Neg => -a,
                UnaryOp::Abs => a.abs(),
                _ => a.sqrt(),
            }
        }
        FExpr::Binary(op, x, y) => ref_f32_binary(*op, eval_f(x, f, u), eval_f(y, f, u)),
        FExpr::Fma(x, y, z) => eval_f(x, f, u).mul_add(eval_f(y, f, u), eval_f(z, f, u)),
        FExpr::Select(op, x, y, t, e2) => {
            if cmp_holds(*op, eval_f(x, f, u), eval_f(y, f, u)) {
                eval_f(t, f, u)
            } else {
                eval_f(e2, f, u)
            }
        }
        FExpr::FromInt(s, r, a) => ref_int_to_float(eval_u(a, f, u), *s, *r),
        FExpr::FromBits(a) => f32::from_bits(eval_u(a, f, u)),
    }
}

fn eval_u(e: &UExpr, f: &[f32; 2], u: &[u32; 2]) -> u32 {
    match e {
        UExpr::In(k) => u[*k],
        UExpr::Const(c) => *c,
        UExpr::Unary(op, _, a) => {
            let a = eval_u(a, f, u);
            match op {
                UnaryOp::Neg => a.wrapping_neg(),
                UnaryOp::Not => !a,
                _ => (a as i32).wrapping_abs() as u32,
            }
        }
        UExpr::Binary(op, s, x, y) => {
            let (x, y) = (eval_u(x, f, u), eval_u(y, f, u));
            if *s {
                ref_i32_binary(*op, x as i32, y as i32) as u32
            } else {
                ref_u32_binary(*op, x, y)
            }
        }
        UExpr::Select(op, s, x, y, t, e2) => {
            let (x, y) = (eval_u(x, f, u), eval_u(y, f, u));
            let c = if *s {
                cmp_holds(*op, x as i32, y as i32)
            } else {
                cmp_holds(*op, x, y)
            };
            if c {
                eval_u(t, f, u)
            } else {
                eval_u(e2, f, u)
            }
        }
        UExpr::ToInt(s, r, a) => ref_float_to_int(
            eval_f(a, f, u),
            if *s { ScalarType::I32 } else { ScalarType::U32 },
            *r,
        ),
        UExpr::Bits(a) => {
            let v = eval_f(a, f, u);
            if v.is_nan() {
                f32::NAN.to_bits()
            } else {
                v.to_bits()
            }
        }
    }
}

fn edge_f32() -> impl Strategy<Value = f32> {
    prop_oneof![
        3 => prop::sample::select(f_edges()),
        1 => any::<u32>().prop_map(f32::from_bits),
        1 => (-64i32..64).prop_map(|v| v as f32 * 0.5),
    ]
}

fn edge_u32() -> impl Strategy<Value = u32> {
    prop_oneof![3 => prop::sample::select(U_EDGES.to_vec()), 1 => any::<u32>(), 1 => 0u32..40]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    #[test]
    fn random_expression_kernels_match(
        seed in any::<u64>(),
        xf in prop::collection::vec((edge_f32(), edge_f32()), 12),
        xu in prop::collection::vec((edge_u32(), edge_u32()), 12),
    ) {
        let mut g = Gen(seed);
        let (fe, ue) = (g.f(4), g.u(4));
        let mut b = KernelBuilder::new("random_expr");
        let n = b.scalar_param("n", ScalarType::U32);
        let ins: Vec<ParamId> = ["f0", "f1", "u0", "u1"]
            .iter()
            .enumerate()
            .map(|(k, name)| b.buffer_param(name, if k < 2 { DType::F32 } else { DType::U32 }, &[Dim::Param(n)], Access::Read))
            .collect();
        let yf = b.buffer_param("yf", DType::F32, &[Dim::Param(n)], Access::Write);
        let yu = b.buffer_param("yu", DType::U32, &[Dim::Param(n)], Access::Write);
        b.set_grid(Dim::Param(n));
        let i = b.work_item();
        let loaded: Vec<Value> = ins.iter().map(|p| b.load(*p, i)).collect();
        let rf = build_f(&mut b, &fe, &loaded[..2], &loaded[2..]);
        let ru = build_u(&mut b, &ue, &loaded[..2], &loaded[2..]);
        b.store(yf, i, rf);
        b.store(yu, i, ru);
        let k = b.finish();

        let col_f = |j: usize| le_f32(&xf.iter().map(|p| if j == 0 { p.0 } else { p.1 }).collect::<Vec<_>>());
        let col_u = |j: usize| le_u32(&xu.iter().map(|p| if j == 0 { p.0 } else { p.1 }).collect::<Vec<_>>());
        let args = vec![
            OwnedArg::Scalar(Scalar::U32(xf.len() as u32)),
            OwnedArg::Read(col_f(0)), OwnedArg::Read(col_f(1)), OwnedArg::Read(col_u(0)), OwnedArg::Read(col_u(1)),
            OwnedArg::Write(vec![0; 4 * xf.len()]), OwnedArg::Write(vec![0; 4 * xf.len()]),
        ];
        let out = run(&k, args);
        let (OwnedArg::Write(gf), OwnedArg::Write(gu)) = (&out[5], &out[6]) else { panic!("outputs") };
        let (gf, gu) = (f32s(gf), u32s(gu));
        for e in 0..xf.len() {
            let (f, u) = ([xf[e].0, xf[e].1], [xu[e].0, xu[e].1]);
            let wf = eval_f(&fe, &f, &u);
            prop_assert!(same(gf[e], wf), "f32 {:?} on {:?} {:?}: got {:?}, want {:?}", fe, f, u, gf[e], wf);
            prop_assert_eq!(gu[e], eval_u(&ue, &f, &u), "u32 {:?} on {:?} {:?}", ue, f, u);
        }
    }
}
