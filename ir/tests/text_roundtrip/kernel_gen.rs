//! A random kernel generator for the text-form tests: valid kernels built with the public
//! `KernelBuilder` from a stream of choices, and corruptions of them that the verifier rejects.

use std::cell::RefCell;

use proptest::prelude::*;
use qforge_ir::{
    Access, BinaryOp, CmpOp, DType, Dim, Handle, Kernel, KernelBuilder, NanMode, Op, ParamId,
    ParamKind, ReduceOrder, Rounding, Scalar, ScalarType, Stmt, TableId, UnaryOp, Value, ValueDef,
    VarId,
};

// ----- a random kernel generator driven by a stream of choices -----

/// Choices drawn from a vector; an exhausted stream answers 0 (the simplest choice), so
/// proptest shrinks kernels by shrinking the vector.
struct Gen {
    choices: Vec<u32>,
    pos: usize,
}

impl Gen {
    fn below(&mut self, n: u32) -> u32 {
        let c = self.choices.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        if n == 0 {
            0
        } else {
            c % n
        }
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u32) as usize]
    }
    fn raw(&mut self) -> u32 {
        self.below(u32::MAX)
    }
}

/// `f32` bit patterns that must survive printing: zeros, NaNs with payloads, infinities,
/// subnormals, extremes.
const SPECIAL_F32: [u32; 12] = [
    0x0000_0000, // +0
    0x8000_0000, // -0
    0x7fc0_0000, // quiet NaN
    0x7f80_0001, // signalling NaN with payload
    0xffc0_1234, // negative NaN with payload
    0x7f80_0000, // +inf
    0xff80_0000, // -inf
    0x0000_0001, // smallest subnormal
    0x807f_ffff, // largest negative subnormal
    0x7f7f_ffff, // f32::MAX
    0x3f80_0000, // 1.0
    0xbf80_0000, // -1.0
];

/// Names that are identifiers but also words of the text form, to check that names never clash
/// with keywords.
const NAMES: [&str; 14] = [
    "x", "out", "n", "read", "grid", "for", "table", "values", "unused", "const", "len", "step",
    "in", "var",
];

fn gen_f32_bits(g: &mut Gen) -> u32 {
    if g.below(3) == 0 {
        g.raw()
    } else {
        g.pick(&SPECIAL_F32)
    }
}

fn gen_scalar(g: &mut Gen, ty: ScalarType) -> Scalar {
    match ty {
        ScalarType::F32 => Scalar::F32(gen_f32_bits(g)),
        ScalarType::U32 => Scalar::U32(if g.below(2) == 0 {
            g.below(100)
        } else {
            g.raw()
        }),
        ScalarType::I32 => {
            let raw = g.raw() as i32;
            Scalar::I32(g.pick(&[0, -1, 7, i32::MIN, i32::MAX, raw]))
        }
        ScalarType::Bool => Scalar::Bool(g.below(2) == 1),
    }
}

#[derive(Clone)]
struct Buf {
    id: ParamId,
    dtype: DType,
    access: Access,
}

/// The generator's state: choices, declarations and the values visible at this point.
struct State {
    g: Gen,
    scalars: Vec<(ParamId, ScalarType)>,
    bufs: Vec<Buf>,
    /// Each table with its type and whether `search_sorted` may search it (sorted `f32`).
    tables: Vec<(TableId, ScalarType, bool)>,
    vars: Vec<(VarId, ScalarType)>,
    /// Visible values and their types; nested blocks truncate it back on exit.
    env: Vec<(Value, ScalarType)>,
    /// Statements still allowed (keeps kernels small).
    budget: u32,
}

fn below(st: &RefCell<State>, n: u32) -> u32 {
    st.borrow_mut().g.below(n)
}

/// A visible value of type `ty`, or a new constant of that type.
fn operand(b: &mut KernelBuilder, st: &RefCell<State>, ty: ScalarType) -> Value {
    let mut s = st.borrow_mut();
    let candidates: Vec<Value> = s
        .env
        .iter()
        .filter(|(_, t)| *t == ty)
        .map(|(v, _)| *v)
        .collect();
    if !candidates.is_empty() && s.g.below(4) != 0 {
        return s.g.pick(&candidates);
    }
    let c = gen_scalar(&mut s.g, ty);
    drop(s);
    let v = b.constant(c);
    st.borrow_mut().env.push((v, ty));
    v
}

/// Appends one `Let` of a random well-typed op and returns its value and type.
fn gen_let(b: &mut KernelBuilder, st: &RefCell<State>) -> (Value, ScalarType) {
    use ScalarType::*;
    let (v, ty) = match below(st, 15) {
        0 => (b.work_item(), U32),
        1 => {
            let p = {
                let s = &mut *st.borrow_mut();
                (!s.scalars.is_empty()).then(|| s.g.pick(&s.scalars))
            };
            match p {
                Some((p, t)) => (b.param(p), t),
                None => (b.work_item(), U32),
            }
        }
        2 => {
            let c = {
                let mut s = st.borrow_mut();
                let t = s.g.pick(&ScalarType::ALL);
                gen_scalar(&mut s.g, t)
            };
            (b.constant(c), c.ty())
        }
        3 => {
            let var = {
                let s = &mut *st.borrow_mut();
                (!s.vars.is_empty()).then(|| s.g.pick(&s.vars))
            };
            match var {
                Some((var, t)) => (b.read_var(var), t),
                None => (b.const_bool(true), Bool),
            }
        }
        4 => {
            let buf = {
                let s = &mut *st.borrow_mut();
                let r: Vec<Buf> = s
                    .bufs
                    .iter()
                    .filter(|x| x.access.can_read())
                    .cloned()
                    .collect();
                (!r.is_empty()).then(|| r[s.g.below(r.len() as u32) as usize].clone())
            };
            match buf {
                Some(buf) => {
                    let i = operand(b, st, U32);
                    (b.load(buf.id, i), buf.dtype.value_type())
                }
                None => (b.work_item(), U32),
            }
        }
        5 => {
            let t = {
                let s = &mut *st.borrow_mut();
                (!s.tables.is_empty()).then(|| s.g.pick(&s.tables))
            };
            match t {
                Some((t, _, true)) if st.borrow_mut().g.below(2) == 0 => {
                    let v = operand(b, st, ScalarType::F32);
                    (b.search_sorted(t, v), U32)
                }
                Some((t, ty, _)) => {
                    let i = operand(b, st, U32);
                    (b.lookup(t, i), ty)
                }
                None => (b.const_u32(3), U32),
            }
        }
        6 => {
            let op = st.borrow_mut().g.pick(&UnaryOp::ALL);
            let tys: Vec<ScalarType> = ScalarType::ALL
                .into_iter()
                .filter(|t| op.accepts(*t))
                .collect();
            let t = st.borrow_mut().g.pick(&tys);
            let a = operand(b, st, t);
            (b.unary(op, a), t)
        }
        7 => {
            let op = st.borrow_mut().g.pick(&BinaryOp::ALL);
            let tys: Vec<ScalarType> = ScalarType::ALL
                .into_iter()
                .filter(|t| op.accepts(*t))
                .collect();
            let t = st.borrow_mut().g.pick(&tys);
            let x = operand(b, st, t);
            let y = operand(b, st, t);
            (b.binary(op, x, y), t)
        }
        8 => {
            let (x, y, z) = (
                operand(b, st, F32),
                operand(b, st, F32),
                operand(b, st, F32),
            );
            (b.fma(x, y, z), F32)
        }
        9 => {
            let op = st.borrow_mut().g.pick(&CmpOp::ALL);
            let tys: &[ScalarType] = if matches!(op, CmpOp::Eq | CmpOp::Ne) {
                &ScalarType::ALL
            } else {
                &[F32, U32, I32]
            };
            let t = st.borrow_mut().g.pick(tys);
            let x = operand(b, st, t);
            let y = operand(b, st, t);
            (b.cmp(op, x, y), Bool)
        }
        10 => {
            let t = st.borrow_mut().g.pick(&ScalarType::ALL);
            let c = operand(b, st, Bool);
            let x = operand(b, st, t);
            let y = operand(b, st, t);
            (b.select(c, x, y), t)
        }
        11 => {
            let (to, r) = {
                let mut s = st.borrow_mut();
                (s.g.pick(&[U32, I32]), s.g.pick(&Rounding::ALL))
            };
            let x = operand(b, st, F32);
            (b.float_to_int(x, to, r), to)
        }
        12 => {
            let (from, r) = {
                let mut s = st.borrow_mut();
                (s.g.pick(&[U32, I32]), s.g.pick(&Rounding::ALL))
            };
            let x = operand(b, st, from);
            (
                b.op(Op::IntToFloat {
                    value: x,
                    rounding: r,
                }),
                F32,
            )
        }
        13 => {
            let (from, to) = {
                let mut s = st.borrow_mut();
                (s.g.pick(&[F32, U32, I32]), s.g.pick(&[F32, U32, I32]))
            };
            let x = operand(b, st, from);
            (b.bitcast(x, to), to)
        }
        _ => {
            let buf = {
                let s = &mut *st.borrow_mut();
                let r: Vec<Buf> = s
                    .bufs
                    .iter()
                    .filter(|x| x.access.can_read() && x.dtype.is_float())
                    .cloned()
                    .collect();
                (!r.is_empty()).then(|| r[s.g.below(r.len() as u32) as usize].clone())
            };
            match buf {
                Some(buf) => {
                    let start = operand(b, st, U32);
                    let len = operand(b, st, U32);
                    let v = match below(st, 4) {
                        0 => b.reduce_sum(buf.id, start, len, ReduceOrder::Sequential),
                        1 => {
                            let ways = 1 << (1 + below(st, 6));
                            b.reduce_sum(buf.id, start, len, ReduceOrder::Strided(ways))
                        }
                        2 => b.reduce_absmax(buf.id, start, len, NanMode::Propagate),
                        _ => b.reduce_absmax(buf.id, start, len, NanMode::Ignore),
                    };
                    (v, F32)
                }
                None => (b.const_f32(-0.0), F32),
            }
        }
    };
    st.borrow_mut().env.push((v, ty));
    (v, ty)
}

/// Appends random statements to the current block of `b`.
fn gen_block(b: &mut KernelBuilder, st: &RefCell<State>, depth: u32) {
    loop {
        {
            let mut s = st.borrow_mut();
            if s.budget == 0 || s.g.below(6) == 0 {
                return;
            }
            s.budget -= 1;
        }
        match below(st, 8) {
            0 | 1 => {
                gen_let(b, st);
            }
            2 => {
                let buf = {
                    let s = &mut *st.borrow_mut();
                    let w: Vec<Buf> = s
                        .bufs
                        .iter()
                        .filter(|x| x.access.can_write())
                        .cloned()
                        .collect();
                    (!w.is_empty()).then(|| w[s.g.below(w.len() as u32) as usize].clone())
                };
                if let Some(buf) = buf {
                    let i = operand(b, st, ScalarType::U32);
                    let v = operand(b, st, buf.dtype.value_type());
                    match (buf.dtype.is_narrow_float(), below(st, 2)) {
                        (true, 0) => b.store_rounded(buf.id, i, v, Rounding::NearestEven),
                        (false, 0) => b.store(buf.id, i, v),
                        _ => b.store_auto(buf.id, i, v),
                    }
                }
            }
            3 => {
                let var = {
                    let s = &mut *st.borrow_mut();
                    (!s.vars.is_empty()).then(|| s.g.pick(&s.vars))
                };
                if let Some((var, t)) = var {
                    let v = operand(b, st, t);
                    b.assign(var, v);
                }
            }
            4 | 5 if depth < 3 => {
                let cond = operand(b, st, ScalarType::Bool);
                let mark = st.borrow().env.len();
                let scoped = |b: &mut KernelBuilder| {
                    gen_block(b, st, depth + 1);
                    st.borrow_mut().env.truncate(mark);
                };
                if below(st, 2) == 0 {
                    b.if_then(cond, scoped);
                } else {
                    b.if_else(cond, scoped, scoped);
                }
            }
            6 if depth < 3 => {
                let start = operand(b, st, ScalarType::U32);
                let end = operand(b, st, ScalarType::U32);
                let step = 1 + below(st, 4);
                let mark = st.borrow().env.len();
                b.for_range(start, end, step, |b, i| {
                    st.borrow_mut().env.push((i, ScalarType::U32));
                    gen_block(b, st, depth + 1);
                    st.borrow_mut().env.truncate(mark);
                });
            }
            7 if depth < 3 => {
                // A summation loop into the f32 variables (if any), body of lets only.
                let accs: Vec<VarId> = {
                    let s = &mut *st.borrow_mut();
                    let f: Vec<VarId> = s
                        .vars
                        .iter()
                        .filter(|(_, t)| *t == ScalarType::F32)
                        .map(|(v, _)| *v)
                        .collect();
                    let take = s.g.below(f.len() as u32 + 1) as usize;
                    f.into_iter().take(take).collect()
                };
                if !accs.is_empty() {
                    let len = operand(b, st, ScalarType::U32);
                    let order = match below(st, 3) {
                        0 => ReduceOrder::Sequential,
                        1 => ReduceOrder::Strided(8),
                        _ => ReduceOrder::Strided(2 << below(st, 5)),
                    };
                    let mark = st.borrow().env.len();
                    b.accumulate(len, order, &accs, |b, i| {
                        st.borrow_mut().env.push((i, ScalarType::U32));
                        for _ in 0..below(st, 3) {
                            gen_let(b, st);
                        }
                        let pairs = accs
                            .iter()
                            .map(|_| {
                                (
                                    operand(b, st, ScalarType::F32),
                                    operand(b, st, ScalarType::F32),
                                )
                            })
                            .collect();
                        st.borrow_mut().env.truncate(mark);
                        pairs
                    });
                }
            }
            _ => {
                gen_let(b, st);
            }
        }
    }
}

/// Builds a random valid kernel from a choice stream.
fn gen_kernel(choices: Vec<u32>) -> Kernel {
    let mut g = Gen { choices, pos: 0 };
    let name = g.pick(&["k", "dequantize_4bit_nf4_bs64_f32", "_kernel_2"]);
    let mut b = KernelBuilder::new(name);
    // Plan the parameters first: dims may name any u32 scalar, before or after the buffer.
    let count = g.below(8);
    let mut plan: Vec<Option<ScalarType>> = Vec::new(); // Some = scalar, None = buffer
    for _ in 0..count {
        plan.push(if g.below(2) == 0 {
            Some(g.pick(&[ScalarType::U32, ScalarType::I32, ScalarType::F32]))
        } else {
            None
        });
    }
    let u32_params: Vec<u32> = plan
        .iter()
        .enumerate()
        .filter(|(_, p)| **p == Some(ScalarType::U32))
        .map(|(i, _)| i as u32)
        .collect();
    let dim = |g: &mut Gen| {
        if !u32_params.is_empty() && g.below(2) == 0 {
            Dim::Param(Handle::from_index(g.pick(&u32_params)))
        } else {
            Dim::Const(g.below(1000))
        }
    };
    let mut used: Vec<String> = Vec::new();
    let (mut scalars, mut bufs) = (Vec::new(), Vec::new());
    for (i, p) in plan.iter().enumerate() {
        let mut name = g.pick(&NAMES).to_string();
        if used.contains(&name) {
            name = format!("{name}_{i}");
        }
        used.push(name.clone());
        match p {
            Some(t) => scalars.push((b.scalar_param(&name, *t), *t)),
            None => {
                let dtype = g.pick(&DType::ALL);
                let access = g.pick(&[Access::Read, Access::Write, Access::ReadWrite]);
                let shape: Vec<Dim> = (0..1 + g.below(3)).map(|_| dim(&mut g)).collect();
                bufs.push(Buf {
                    id: b.buffer_param(&name, dtype, &shape, access),
                    dtype,
                    access,
                });
            }
        }
    }
    let grid = dim(&mut g);
    b.set_grid(grid);
    let mut tables = Vec::new();
    for i in 0..g.below(4) {
        let ty = g.pick(&[ScalarType::F32, ScalarType::U32, ScalarType::I32]);
        let mut data: Vec<u32> = (0..1 + g.below(12))
            .map(|_| {
                if ty == ScalarType::F32 {
                    gen_f32_bits(&mut g)
                } else {
                    gen_scalar(&mut g, ty).bits()
                }
            })
            .collect();
        // Half the f32 tables sorted without NaN, so that `search_sorted` can search them.
        let sorted = ty == ScalarType::F32 && g.below(2) == 0;
        if sorted {
            let mut f: Vec<f32> = data
                .iter()
                .map(|x| f32::from_bits(*x))
                .filter(|x| !x.is_nan())
                .collect();
            if f.is_empty() {
                f.push(0.0);
            }
            f.sort_by(|a, b| a.total_cmp(b));
            data = f.iter().map(|x| x.to_bits()).collect();
        }
        let name = g.pick(&["nf4", "table", "code", "for"]);
        tables.push((b.table(&format!("{name}{i}"), ty, data), ty, sorted));
    }
    let mut vars = Vec::new();
    for i in 0..g.below(4) {
        let ty = g.pick(&ScalarType::ALL);
        vars.push((b.var(&format!("v{i}"), ty), ty));
    }
    let st = RefCell::new(State {
        g,
        scalars,
        bufs,
        tables,
        vars,
        env: Vec::new(),
        budget: 40,
    });
    gen_block(&mut b, &st, 0);
    b.finish()
}

pub fn kernels() -> impl Strategy<Value = Kernel> {
    proptest::collection::vec(any::<u32>(), 0..400).prop_map(gen_kernel)
}

// ----- corruption: kernels the verifier rejects must round trip as well -----

pub fn corrupt(mut k: Kernel, choices: Vec<u32>) -> Kernel {
    let mut g = Gen { choices, pos: 0 };
    for _ in 0..1 + g.below(6) {
        let nv = k.values.len() as u32;
        let any_value = |g: &mut Gen| {
            Handle::from_index(if g.below(3) == 0 {
                nv + g.below(5)
            } else {
                g.below(nv.max(1))
            })
        };
        match g.below(9) {
            0 if !k.params.is_empty() => {
                // Duplicate or non-identifier parameter names.
                let weird = [
                    "",
                    "a b",
                    "q\"uote",
                    "back\\slash",
                    "new\nline",
                    "tab\t",
                    "ünï",
                    "1x",
                    "x",
                ];
                let i = g.below(k.params.len() as u32);
                let name = g.pick(&weird).to_string();
                let mut params: Vec<_> = k.params.iter().map(|(_, p)| p.clone()).collect();
                params[i as usize].name = name;
                k.params = qforge_ir::Arena::new();
                for p in params {
                    k.params.append(p);
                }
            }
            1 => {
                // A dead value with dangling operands.
                let op = match g.below(4) {
                    0 => Op::Binary(BinaryOp::Add, any_value(&mut g), any_value(&mut g)),
                    1 => Op::Load {
                        buf: Handle::from_index(g.below(20)),
                        index: any_value(&mut g),
                    },
                    2 => Op::LoopIndex,
                    _ => Op::Const(Scalar::I32(-5)),
                };
                k.values.append(ValueDef {
                    op,
                    ty: g.pick(&ScalarType::ALL),
                });
            }
            2 => k.body.push(Stmt::Let(Handle::from_index(nv + g.below(3)))),
            3 => {
                let index = any_value(&mut g);
                k.body.push(Stmt::For {
                    index,
                    start: any_value(&mut g),
                    end: any_value(&mut g),
                    step: g.below(3),
                    body: vec![Stmt::Let(index)],
                });
            }
            4 => k.grid = Dim::Param(Handle::from_index(g.below(12))),
            5 => {
                k.tables.append(qforge_ir::Table {
                    name: g.pick(&["t", "t", "\"t\""]).to_string(),
                    ty: g.pick(&ScalarType::ALL),
                    data: (0..g.below(3)).map(|_| g.raw()).collect(),
                });
            }
            6 => {
                k.vars.append(qforge_ir::Var {
                    name: g.pick(&["v0", "w", "w"]).to_string(),
                    ty: ScalarType::Bool,
                });
                k.body.push(Stmt::Assign {
                    var: Handle::from_index(g.below(6)),
                    value: any_value(&mut g),
                });
            }
            7 => {
                k.params.append(qforge_ir::Param {
                    name: "flag".into(),
                    kind: ParamKind::Scalar(ScalarType::Bool),
                });
                k.body.push(Stmt::Store {
                    buf: Handle::from_index(g.below(12)),
                    index: any_value(&mut g),
                    value: any_value(&mut g),
                    rounding: Some(g.pick(&Rounding::ALL)),
                });
            }
            _ => {
                // A constant whose type differs from its value's recorded type.
                let v = k.values.append(ValueDef {
                    op: Op::Const(Scalar::F32(0x8000_0000)),
                    ty: ScalarType::U32,
                });
                k.body.push(Stmt::Let(v));
            }
        }
    }
    k
}
